"""TVM MetaSchedule as a peer tuner, on a tessel workload spec (f32 gemm, dense, NHWC conv2d).

    TVM_NUM_THREADS=1 python tvm_tune.py --spec gemm:m=1024,n=1024,k=1024,dtype=f32 \
        --trials 200 --mcpu znver3 --work-dir /tmp/ms-gemm

Prints one line `RESULT {json}`: tuning wall time, trials, the best latency in MetaSchedule's
database, and the best schedule compiled again and re-measured (median of 10 x 10 calls),
checked against numpy. TVM 0.27 wants the target as a JSON dict; MetaSchedule needs xgboost,
cloudpickle and psutil; apache-tvm-ffi newer than 0.1.14.post0 segfaults on the first database
write (see install.sh).
"""
import argparse
import json
import os
import time

import numpy as np
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms


def parse_spec(spec):
    kind, _, rest = spec.partition(":")
    kv = dict(item.split("=", 1) for item in rest.split(",") if item)
    if kv.get("dtype", "f32") != "f32" or kv.get("wdtype", "f32") != "f32":
        raise SystemExit("tvm_tune.py compares f32 workloads only: " + spec)
    if "epilogue" in kv or "out" in kv:
        raise SystemExit("tvm_tune.py: no epilogues: " + spec)
    return kind, {k: v for k, v in kv.items()}


def build(kind, kv):
    """The TE function, its argument shapes, its FLOPs and a numpy reference."""
    if kind in ("gemm", "dense"):
        m, n, k = int(kv["m"]), int(kv["n"]), int(kv["k"])
        A = te.placeholder((m, k), name="A", dtype="float32")
        wshape = (k, n) if kind == "gemm" else (n, k)
        B = te.placeholder(wshape, name="B", dtype="float32")
        r = te.reduce_axis((0, k), name="r")
        if kind == "gemm":
            C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
        else:
            C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[j, r], axis=r), name="C")
        ref = (lambda a, b: a @ b) if kind == "gemm" else (lambda a, b: a @ b.T)
        return te.create_prim_func([A, B, C]), [(m, k), wshape, (m, n)], 2.0 * m * n * k, ref
    if kind == "conv2d":
        if kv.get("layout", "nhwc") != "nhwc" or kv.get("groups", "1") != "1" or kv.get("dilation", "1") != "1":
            raise SystemExit("tvm_tune.py: NHWC, groups=1, dilation=1 convolutions only")
        N, H, W, C, K = (int(kv[x]) for x in "nhwck")
        R, S = int(kv["r"]), int(kv["s"])
        st, pad = int(kv.get("stride", 1)), int(kv.get("pad", 0))
        P, Q = (H + 2 * pad - R) // st + 1, (W + 2 * pad - S) // st + 1
        X = te.placeholder((N, H, W, C), name="X", dtype="float32")
        Wt = te.placeholder((K, R, S, C), name="W", dtype="float32")
        Xp = te.compute(
            (N, H + 2 * pad, W + 2 * pad, C),
            lambda n, h, w, c: tvm.tirx.if_then_else(
                tvm.tirx.all(h >= pad, h < H + pad, w >= pad, w < W + pad),
                X[n, h - pad, w - pad, c], tvm.tirx.const(0.0, "float32")),
            name="Xp")
        r = te.reduce_axis((0, R), name="r")
        s = te.reduce_axis((0, S), name="s")
        c = te.reduce_axis((0, C), name="c")
        O = te.compute(
            (N, P, Q, K),
            lambda n, p, q, k: te.sum(Xp[n, p * st + r, q * st + s, c] * Wt[k, r, s, c], axis=[r, s, c]),
            name="O")

        def ref(x, w):
            xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
            out = np.zeros((N, P, Q, K), np.float32)
            for i in range(R):
                for j in range(S):
                    patch = xp[:, i:i + st * P:st, j:j + st * Q:st, :]
                    out += np.einsum("npqc,kc->npqk", patch, w[:, i, j, :])
            return out

        return (te.create_prim_func([X, Wt, O]), [(N, H, W, C), (K, R, S, C), (N, P, Q, K)],
                2.0 * N * P * Q * K * R * S * C, ref)
    raise SystemExit("tvm_tune.py: gemm, dense or conv2d, not " + kind)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--mcpu", default="native", help="an LLVM CPU name, or native (this CPU)")
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    kind, kv = parse_spec(a.spec)
    func, shapes, flops, ref = build(kind, kv)
    if a.mcpu == "native":
        from tvm.target import codegen
        a.mcpu = codegen.llvm_get_system_cpu()
    target = tvm.target.Target({"kind": "llvm", "mcpu": a.mcpu, "num-cores": 1})
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    os.makedirs(a.work_dir, exist_ok=True)
    t0 = time.time()
    db = ms.tune_tir(
        mod=mod, target=target, work_dir=a.work_dir, max_trials_global=a.trials,
        num_trials_per_iter=64, cost_model="xgb", num_tuning_cores=1, seed=a.seed,
        runner=ms.runner.LocalRunner(
            evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=100)))
    tune_s = time.time() - t0
    recs = db.get_all_tuning_records()
    lat = [float(np.mean([float(x) for x in r.run_secs])) for r in recs if r.run_secs is not None]
    lat = [x for x in lat if x < 1e9]
    res = {"spec": a.spec, "tvm": tvm.__version__, "mcpu": a.mcpu, "trials": a.trials,
           "records": len(recs), "valid": len(lat), "tune_wall_s": round(tune_s, 1)}
    if not lat:
        res["error"] = "no valid schedule"
        print("RESULT " + json.dumps(res), flush=True)
        return
    res["best_db_ms"] = round(min(lat) * 1e3, 4)
    res["best_db_gflops"] = round(flops / min(lat) / 1e9, 1)
    sch = ms.tir_integration.compile_tir(db, mod, target)
    lib = tvm.compile(sch.mod, target=target)
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shapes[0], dtype=np.float32)
    w = rng.standard_normal(shapes[1], dtype=np.float32)
    args = [tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev),
            tvm.runtime.tensor(np.zeros(shapes[2], np.float32), dev)]
    rt = lib.jit()
    tvm.get_global_func("runtime.config_threadpool")(1, 1)
    rt["main"](*args)
    want = ref(x, w)
    scale = np.sqrt(flops / 2 / np.prod(shapes[2]))
    res["correct"] = bool(np.allclose(args[2].numpy(), want, rtol=1e-3, atol=1e-3 * scale))
    ev = rt.time_evaluator("main", dev, number=10, repeat=10, min_repeat_ms=200)
    med = float(np.median(ev(*args).results))
    res["remeasured_ms"] = round(med * 1e3, 4)
    res["remeasured_gflops"] = round(flops / med / 1e9, 1)
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
