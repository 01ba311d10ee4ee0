"""A tuned tessel kernel and oneDNN, timed in alternation: one ratio that survives a noisy machine.

    bench/peers/install.sh                      # once
    cargo build --release -p xtask
    cargo xtask tune --workload SPEC --prepacked-weights --log t.jsonl ...
    bench/peers/.venv/bin/python bench/peers/interleave.py --spec SPEC --log t.jsonl --rounds 15

Some machines change speed for seconds at a time (a cloud guest whose sibling hyperthread or
matrix unit another tenant uses: oneDNN's AMX int8 matmul measured 735-1960 GOP/s a second
apart on an idle core). Two runs minutes apart then compare two machine states, not two
programs. Here each round runs tessel's best kernel of a tune log (`xtask measure --trace
--prepacked-weights`, a fresh process and fresh buffers, as oneDNN's weights are pre-packed)
and then oneDNN on the same workload, back to back. The table lists every pair; the summary
gives each side's median and best GOP/s and the median of the per-round ratios, which pairs
runs made under the same conditions. Workloads: gemm and dense (oneDNN matmul) and NHWC conv2d,
in f32, bf16 (bf16 x bf16 -> f32) or u8 x i8 (-> i32). `--onednn-layout any` lets oneDNN's
convolution pick its blocked layouts. Writes every number to --out (JSON) when given.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ONEDNN = os.path.join(HERE, ".venv", "onednn_bench")
XTASK = os.path.join(REPO, "target", "release", "xtask")


def parse_spec(spec):
    kind, _, rest = spec.partition(":")
    return kind, dict(item.split("=", 1) for item in rest.split(",") if item)


def onednn_dtype(kv):
    d, w = kv.get("dtype", "f32"), kv.get("wdtype", kv.get("dtype", "f32"))
    if (d, w) == ("f32", "f32"):
        return "f32"
    if (d, w) == ("bf16", "bf16"):
        return "bf16"
    if (d, w) == ("u8", "i8"):
        return "u8s8s32"
    sys.exit(f"oneDNN is driven here for f32, bf16 or u8 x i8, not {d} x {w}")


def onednn_args(kind, kv, layout):
    dt = onednn_dtype(kv)
    if kind in ("gemm", "dense"):
        return ["matmul", dt, kv["m"], kv["n"], kv["k"], "0.5"]
    if kind == "conv2d":
        return ["conv", dt, kv["n"], kv["h"], kv["w"], kv["c"], kv["k"], kv["r"], kv["s"],
                kv.get("stride", "1"), kv.get("pad", "0"), layout, "0.5", kv.get("groups", "1")]
    sys.exit(f"no oneDNN primitive here for `{kind}`")


def best_trace(log, spec):
    """The trace of the log's fastest valid record of `spec` (by median latency)."""
    best = None
    with open(log) as f:
        for line in f:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a writer killed mid-line; the tuner skips it too
            ok = r.get("result", {}).get("Ok")
            if r.get("workload") != spec or not ok:
                continue
            if best is None or ok["timing"]["median_s"] < best[0]:
                best = (ok["timing"]["median_s"], r["trace"])
    if best is None:
        sys.exit(f"{log}: no valid record of {spec}")
    return best[1]


def run_tessel(spec, trace_path, cpu, xtask=XTASK):
    cmd = [xtask, "measure", "--workload", spec, "--trace", trace_path, "--prepacked-weights",
           "--json"]
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu)] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"tessel measure failed: {p.stderr.strip()[-400:]}")
    return json.loads(p.stdout)["gflops"]


def run_onednn(args, cpu, max_isa):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if max_isa:
        env["ONEDNN_MAX_CPU_ISA"] = max_isa
    cmd = [ONEDNN] + args
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu)] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    line = next((l for l in p.stdout.splitlines() if l.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        sys.exit(f"oneDNN failed: {p.stderr.strip()[-400:]}")
    r = json.loads(line[len("RESULT "):])
    return r["gflops"], r.get("impl", "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", required=True, help="the workload, as tessel writes it")
    ap.add_argument("--log", required=True, help="a `tune --prepacked-weights` log of it")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--cpu", type=int, default=None, help="pin both to this core")
    ap.add_argument("--onednn-layout", default="nhwc", choices=["nhwc", "any"])
    ap.add_argument("--onednn-max-isa", default=None, help="ONEDNN_MAX_CPU_ISA, e.g. AVX2")
    ap.add_argument("--out", default=None)
    ap.add_argument("--xtask", default=XTASK,
                    help="the xtask binary that measures tessel's kernel (another build, say)")
    a = ap.parse_args()
    if a.rounds < 1:
        sys.exit("--rounds must be at least 1")
    for exe in (a.xtask, ONEDNN):
        if not os.path.exists(exe):
            sys.exit(f"{exe} is missing: build xtask and run bench/peers/install.sh")
    kind, kv = parse_spec(a.spec)
    args = onednn_args(kind, kv, a.onednn_layout)
    trace = best_trace(a.log, a.spec)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(trace, f)
        trace_path = f.name
    rows = []
    impl = ""
    print(f"{a.spec}: tessel's best of {a.log} and oneDNN, alternating, {a.rounds} rounds")
    print(f"{'round':>5} {'tessel GOP/s':>13} {'oneDNN GOP/s':>13} {'ratio':>7}")
    try:
        for i in range(a.rounds):
            t = run_tessel(a.spec, trace_path, a.cpu, a.xtask)
            o, impl = run_onednn(args, a.cpu, a.onednn_max_isa)
            rows.append({"tessel_gops": t, "onednn_gops": o, "ratio": t / o})
            print(f"{i + 1:>5} {t:>13.1f} {o:>13.1f} {t / o:>6.2f}x", flush=True)
    finally:
        os.unlink(trace_path)
    ts = [r["tessel_gops"] for r in rows]
    os_ = [r["onednn_gops"] for r in rows]
    summary = {
        "spec": a.spec, "rounds": len(rows), "onednn_impl": impl,
        "tessel_median": statistics.median(ts), "tessel_best": max(ts),
        "onednn_median": statistics.median(os_), "onednn_best": max(os_),
        "median_ratio": statistics.median(r["ratio"] for r in rows),
        "ratio_of_bests": max(ts) / max(os_),
    }
    print(f"tessel median {summary['tessel_median']:.1f} best {summary['tessel_best']:.1f}; "
          f"oneDNN ({impl}) median {summary['onednn_median']:.1f} best "
          f"{summary['onednn_best']:.1f}; median ratio {summary['median_ratio']:.2f}x, "
          f"ratio of bests {summary['ratio_of_bests']:.2f}x")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"summary": summary, "rounds": rows}, f, indent=1)


if __name__ == "__main__":
    main()
