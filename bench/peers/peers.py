"""tessel beside its peers on the same workloads, one after another on this machine.

    bench/peers/install.sh                      # once: oneDNN, numpy, TVM 0.27 (registries only)
    cargo build --release -p xtask
    bench/peers/.venv/bin/python bench/peers/peers.py \
        --workloads gemm:m=1024,n=1024,k=1024,dtype=f32 --trials 64 --ms-trials 200

Per workload (f32 gemm, dense, NHWC conv2d): OpenBLAS through numpy (gemm, dense), oneDNN's
matmul or convolution (weights pre-packed), TVM MetaSchedule (tuned, then re-measured) and
tessel (`xtask tune`, its finalists timed again in fresh processes). Everything runs on one
thread. `--isa avx2` measures an AVX2 machine on a newer one: tessel builds for znver3 and
searches the avx2 instructions only, oneDNN is capped at AVX2 (ONEDNN_MAX_CPU_ISA), TVM
targets znver3, and numpy's OpenBLAS is pinned to its Haswell kernels (OPENBLAS_CORETYPE).
Prints one table and writes every number to --out (JSON). Ratios in it are from this run
only: these machines are too noisy to compare numbers across runs.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PY = os.path.join(HERE, ".venv", "bin", "python")
ONEDNN = os.path.join(HERE, ".venv", "onednn_bench")
XTASK = os.path.join(REPO, "target", "release", "xtask")

DEFAULT_WORKLOADS = [
    "gemm:m=1024,n=1024,k=1024,dtype=f32",
    "dense:m=128,n=3072,k=768,dtype=f32",
    "conv2d:n=1,h=56,w=56,c=64,k=64,r=3,s=3,stride=1,pad=1,layout=nhwc,dtype=f32",
]


def parse_spec(spec):
    kind, _, rest = spec.partition(":")
    return kind, dict(item.split("=", 1) for item in rest.split(",") if item)


def flops(kind, kv):
    if kind in ("gemm", "dense"):
        return 2.0 * int(kv["m"]) * int(kv["n"]) * int(kv["k"])
    n, h, w, c, k, r, s = (int(kv[x]) for x in "nhwckrs")
    st, pad = int(kv.get("stride", 1)), int(kv.get("pad", 0))
    p, q = (h + 2 * pad - r) // st + 1, (w + 2 * pad - s) // st + 1
    return 2.0 * n * p * q * k * c * r * s


def run(cmd, env=None, timeout=None):
    """Runs cmd; returns (stdout, wall seconds). Raises with stderr on failure."""
    full = dict(os.environ)
    full.update(env or {})
    t = time.time()
    p = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=timeout)
    wall = time.time() - t
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return p.stdout, wall


def result_line(out):
    for line in reversed(out.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError("no RESULT line in:\n" + out[-2000:])


NUMPY_SNIPPET = r"""
import json, sys, time
import numpy as np
from threadpoolctl import threadpool_info
kind, m, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(0)
a = rng.standard_normal((m, k), dtype=np.float32)
b = rng.standard_normal((k, n) if kind == "gemm" else (n, k), dtype=np.float32)
f = (lambda: a @ b) if kind == "gemm" else (lambda: a @ b.T)
for _ in range(3): f()
ts = []
start = time.perf_counter()
while len(ts) < 15 or time.perf_counter() - start < 1.0:
    t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
ts.sort()
info = [(i.get("internal_api"), i.get("architecture")) for i in threadpool_info()]
print("RESULT " + json.dumps({"median_ms": ts[len(ts) // 2] * 1e3, "blas": str(info)}))
"""


def numpy_peer(kind, kv, isa):
    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    if isa == "avx2":
        env["OPENBLAS_CORETYPE"] = "Haswell"
    out, _ = run([PY, "-c", NUMPY_SNIPPET, kind, kv["m"], kv["n"], kv["k"]], env)
    r = result_line(out)
    return {"peer": "OpenBLAS (numpy)", "ms": r["median_ms"], "note": r["blas"]}


def onednn_peer(kind, kv, isa, layout="nhwc"):
    env = {"OMP_NUM_THREADS": "1"}
    if isa == "avx2":
        env["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    if kind in ("gemm", "dense"):
        args = ["matmul", "f32", kv["m"], kv["n"], kv["k"], "1.0"]
    else:
        args = ["conv", "f32", kv["n"], kv["h"], kv["w"], kv["c"], kv["k"], kv["r"], kv["s"],
                kv.get("stride", "1"), kv.get("pad", "0"), layout, "1.0", kv.get("groups", "1")]
    out, _ = run([ONEDNN] + args, env)
    r = result_line(out)
    name = "oneDNN 2.6" + ("" if layout == "nhwc" else " (blocked layouts)")
    return {"peer": name, "ms": r["median_ms"], "note": r["impl"]}


def tvm_peer(spec, trials, isa, work):
    mcpu = "znver3" if isa == "avx2" else "native"
    out, wall = run([PY, os.path.join(HERE, "tvm_tune.py"), "--spec", spec, "--trials", str(trials),
                     "--mcpu", mcpu, "--work-dir", work], {"TVM_NUM_THREADS": "1"})
    r = result_line(out)
    if "error" in r:
        return {"peer": "TVM MetaSchedule", "ms": None, "note": r["error"], "wall_s": wall}
    return {"peer": "TVM MetaSchedule 0.27", "ms": r["remeasured_ms"], "db_ms": r["best_db_ms"],
            "trials": trials, "wall_s": wall, "note": f"mcpu {r['mcpu']}, correct={r['correct']}"}


def ceiling(isa):
    """One core's f32 ceiling on AVX2 (ceiling.c): the FMA peak and the 6x16 register block
    on panels in L1. None where the machine has no AVX2 build to measure."""
    exe = os.path.join(tempfile.mkdtemp(prefix="tessel-ceiling-"), "ceiling")
    march = "znver3" if isa == "avx2" else "native"
    run(["gcc", "-O3", f"-march={march}", os.path.join(HERE, "ceiling.c"), "-o", exe])
    out, _ = run([exe])
    return json.loads(out.strip().splitlines()[-1])


def tessel_peer(spec, trials, isa, work, prepacked=False):
    os.makedirs(work, exist_ok=True)
    log = os.path.join(work, "tessel.jsonl")
    env = {}
    cmd = [XTASK, "tune", "--workload", spec, "--trials", str(trials), "--log", log, "--json"]
    if prepacked:
        # Timed as oneDNN is: the weights packed once beforehand (export's pre-packed entry).
        cmd += ["--prepacked-weights"]
    if isa == "avx2":
        env["TESSEL_MARCH"] = "znver3"
        cmd += ["--instructions", "avx2"]
    start = time.time()
    out, wall = run(cmd, env)
    report = json.loads(out.strip().splitlines()[-1])
    task = report["tasks"][0]
    # Best-so-far against wall time, from the log (records carry their time).
    curve = []
    best = None
    with open(log) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("sampler") == "remeasure":  # the finalists timed again: no trials
                continue
            ok = rec.get("result", {}).get("Ok") or rec.get("result", {}).get("ok")
            if ok and not ok.get("emulated"):
                lat = ok["timing"]["median_s"]
                best = lat if best is None else min(best, lat)
            curve.append((rec["time"] - start, best))
    return {"peer": "tessel (pre-packed weights)" if prepacked else "tessel",
            "ms": task.get("remeasured_ms") or task["latency_ms"],
            "db_ms": task["latency_ms"], "trials": trials, "wall_s": wall,
            "spread": task.get("allocation_spread"), "curve": curve,
            "note": (task.get("remeasured_mapping") or task.get("mapping") or "vectorized loops").split(";")[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=";".join(DEFAULT_WORKLOADS),
                    help="tessel specs separated by ';'")
    ap.add_argument("--trials", type=int, default=64, help="tessel's trials")
    ap.add_argument("--ms-trials", type=int, default=200, help="MetaSchedule's trials")
    ap.add_argument("--isa", choices=["native", "avx2"], default="native")
    ap.add_argument("--skip", default="", help="comma-separated: numpy,onednn,tvm,tessel,ceiling")
    ap.add_argument("--out", default="peers.json")
    ap.add_argument("--prepacked-weights", action="store_true",
                    help="a second tessel row: tuned and timed with the weights packed beforehand, "
                         "as oneDNN's pre-packed matmul and convolution are timed here")
    a = ap.parse_args()
    for path, what in [(PY, "bench/peers/install.sh"), (ONEDNN, "bench/peers/install.sh"),
                       (XTASK, "cargo build --release -p xtask")]:
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: run {what}")
    skip = set(filter(None, a.skip.split(",")))
    rows = []
    ceil = None
    if "ceiling" not in skip:
        try:
            ceil = ceiling(a.isa)
            print(f"  one core's f32 ceiling (ceiling.c): FMA peak {ceil['fma_peak']['best']:.1f}, "
                  f"6x16 register block in L1 {ceil['register_block_6x16_l1']['best']:.1f} GFLOP/s", flush=True)
        except Exception as e:  # a machine without AVX2 or gcc: the table goes on without it
            print(f"  ceiling: failed: {e}"[:300], flush=True)
    for spec in filter(None, a.workloads.split(";")):
        kind, kv = parse_spec(spec)
        fl = flops(kind, kv)
        work = tempfile.mkdtemp(prefix="tessel-peers-")
        results = []
        jobs = []
        if kind in ("gemm", "dense") and "numpy" not in skip:
            jobs.append(lambda: numpy_peer(kind, kv, a.isa))
        if "onednn" not in skip:
            jobs.append(lambda: onednn_peer(kind, kv, a.isa))
            if kind == "conv2d":
                jobs.append(lambda: onednn_peer(kind, kv, a.isa, "any"))
        if "tvm" not in skip:
            jobs.append(lambda: tvm_peer(spec, a.ms_trials, a.isa, os.path.join(work, "ms")))
        if "tessel" not in skip:
            jobs.append(lambda: tessel_peer(spec, a.trials, a.isa, work))
            if a.prepacked_weights:
                jobs.append(lambda: tessel_peer(spec, a.trials, a.isa, os.path.join(work, "pp"), True))
        for job in jobs:
            try:
                r = job()
            except Exception as e:  # one peer failing does not lose the others' numbers
                r = {"peer": "?", "ms": None, "note": f"failed: {e}"[:300]}
            r["gflops"] = fl / (r["ms"] * 1e-3) / 1e9 if r.get("ms") else None
            print(f"  {spec}  {r['peer']}: {r['gflops'] and round(r['gflops'], 1)} GFLOP/s", flush=True)
            results.append(r)
        libs = [r["gflops"] for r in results if r["gflops"] and r["peer"].startswith(("OpenBLAS", "oneDNN"))]
        ms_ = next((r for r in results if r["peer"].startswith("TVM") and r.get("ms")), None)
        ts = next((r for r in results if r["peer"].startswith("tessel") and r.get("ms")), None)
        pp = next((r for r in results if r["peer"] == "tessel (pre-packed weights)" and r.get("ms")), None)
        summary = {}
        if ts and libs:
            summary["tessel_vs_best_library"] = ts["gflops"] / max(libs)
        if ceil and libs and kind in ("gemm", "dense"):
            # What 1.10x the best library asks of the register block that would run it.
            summary["needed_for_1.10x_vs_register_block"] = 1.10 * max(libs) / ceil["register_block_6x16_l1"]["best"]
        if pp and libs:
            summary["prepacked_tessel_vs_best_library"] = pp["gflops"] / max(libs)
        if ts and ms_:
            summary["tessel_vs_metaschedule"] = ts["gflops"] / ms_["gflops"]
            # When tessel's best-so-far first reached MetaSchedule's re-measured best.
            reach = next((t for t, b in ts["curve"] if b is not None and b <= ms_["ms"] * 1e-3), None)
            summary["tessel_s_to_metaschedule_best"] = reach
            summary["metaschedule_wall_s"] = ms_["wall_s"]
        rows.append({"workload": spec, "results": results, "summary": summary})

    print()
    print(f"one thread, isa {a.isa}, {time.strftime('%Y-%m-%d %H:%M')}")
    if ceil:
        print(f"one core's f32 ceiling: FMA peak {ceil['fma_peak']['best']:.1f} GFLOP/s, "
              f"6x16 register block on panels in L1 {ceil['register_block_6x16_l1']['best']:.1f} "
              f"(median {ceil['register_block_6x16_l1']['median']:.1f})")
    print(f"{'workload':<24} {'peer':<34} {'GFLOP/s':>8} {'trials':>6} {'wall s':>7}  note")
    for row in rows:
        kind, kv = parse_spec(row["workload"])
        short = kind + ":" + "x".join(kv[x] for x in ("m", "n", "k") if x in kv) if kind != "conv2d" \
            else f"conv {kv['h']}x{kv['w']}x{kv['c']}->{kv['k']} {kv['r']}x{kv['s']}"
        for r in row["results"]:
            g = f"{r['gflops']:.1f}" if r.get("gflops") else "-"
            print(f"{short:<24} {r['peer']:<34} {g:>8} {r.get('trials', ''):>6} "
                  f"{(str(round(r['wall_s'])) if r.get('wall_s') else ''):>7}  {r.get('note', '')}")
        s = row["summary"]
        parts = []
        if "tessel_vs_best_library" in s:
            parts.append(f"tessel / best library {s['tessel_vs_best_library']:.2f}x")
        if "prepacked_tessel_vs_best_library" in s:
            parts.append(f"pre-packed {s['prepacked_tessel_vs_best_library']:.2f}x")
        if "needed_for_1.10x_vs_register_block" in s:
            parts.append(f"1.10x the best library = {100 * s['needed_for_1.10x_vs_register_block']:.0f}% "
                         "of the 6x16 register block in L1")
        if "tessel_vs_metaschedule" in s:
            parts.append(f"tessel / MetaSchedule {s['tessel_vs_metaschedule']:.2f}x")
        if s.get("tessel_s_to_metaschedule_best") is not None:
            parts.append(f"tessel reached MetaSchedule's best in {s['tessel_s_to_metaschedule_best']:.0f} s "
                         f"(MetaSchedule: {s['metaschedule_wall_s']:.0f} s)")
        elif "tessel_vs_metaschedule" in s:
            parts.append("tessel did not reach MetaSchedule's best")
        if parts:
            print(f"{'':<24} " + "; ".join(parts))
    for row in rows:
        for r in row["results"]:
            r.pop("curve", None)
    with open(a.out, "w") as f:
        json.dump({"isa": a.isa, "ceiling": ceil, "rows": rows}, f, indent=1)
    print(f"numbers: {a.out}")


if __name__ == "__main__":
    main()
