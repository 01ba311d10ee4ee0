//! The analytical model's sanity targets: a well-tiled fp16 GEMM lands where real kernels do,
//! naive schedules are an order of magnitude slower, devices of one balance scale with their
//! peaks, and results say they come from a model.

use tessel_gpu::{SimMeasurer, device, devices, estimate};
use tessel_ir::{DType, Program, Workload};
use tessel_measure::{Candidate, MeasureErrorKind, Measurer};
use tessel_search::{InstructionSet, Sketch, Space};

const GEMM: &str = "gemm:m=4096,n=4096,k=4096,dtype=f16";

fn lower(spec: &str, s: &Sketch) -> Program {
    let op = spec.parse::<Workload>().unwrap().to_op();
    Space::new(&op, &InstructionSet::Gpu { cc: (8, 0) })
        .lower(s)
        .unwrap()
        .1
}

/// 128x128 blocks of 2x2 warps with 64x64 warp tiles, k in steps of 32, 3 stages.
fn well_tiled() -> Sketch {
    Sketch::TensorCore {
        mapping: 0,
        wm: 2,
        wn: 2,
        fm: 4,
        fn_: 4,
        kc: 2,
        stages: 3,
        split: 1,
    }
}

fn tflops(p: &Program, dev: &str) -> f64 {
    let e = estimate(p, &device(dev).unwrap()).unwrap();
    2.0 * 4096f64.powi(3) / e.latency_s / 1e12
}

fn peak_tflops(dev: &str) -> f64 {
    device(dev).unwrap().tc_macs_per_s(DType::F16) * 2.0 / 1e12
}

#[test]
fn a_well_tiled_gemm_reaches_70_to_90_percent_of_a100_tensor_core_peak() {
    let share = tflops(&lower(GEMM, &well_tiled()), "a100") / peak_tflops("a100");
    assert!((0.70..=0.90).contains(&share), "{share}");
}

#[test]
fn naive_schedules_are_at_least_ten_times_slower() {
    let good = tflops(&lower(GEMM, &well_tiled()), "a100");
    let one_warp = Sketch::TensorCore {
        mapping: 0,
        wm: 1,
        wn: 1,
        fm: 1,
        fn_: 1,
        kc: 1,
        stages: 1,
        split: 1,
    };
    let simt = Sketch::Simt {
        tx: 16,
        ty: 16,
        rx: 1,
        ry: 1,
        rtile: 1,
        shared: false,
    };
    for naive in [one_warp, simt] {
        let slow = tflops(&lower(GEMM, &naive), "a100");
        assert!(good / slow >= 10.0, "{naive}: {good} vs {slow}");
    }
}

#[test]
fn devices_of_one_balance_scale_with_their_peaks() {
    let p = lower(GEMM, &well_tiled());
    let base = tflops(&p, "a100") / peak_tflops("a100");
    // Same Tensor Core to shared-memory balance per SM as the A100 (per clock).
    for dev in ["v100", "a10", "l4"] {
        let ratio = tflops(&p, dev) / peak_tflops(dev) / base;
        assert!((0.9..=1.1).contains(&ratio), "{dev}: {ratio}");
    }
    // Hopper doubles the Tensor Core rate per SM but not shared-memory bandwidth: the same
    // fragments-through-shared-memory kernel gains less than the peak ratio, but gains.
    let h = tflops(&p, "h100") / tflops(&p, "a100");
    assert!(
        h > 1.5 && h < peak_tflops("h100") / peak_tflops("a100"),
        "{h}"
    );
    // Too much shared memory for a T4 (64 KB per SM) is refused, not estimated.
    assert!(estimate(&p, &device("t4").unwrap()).is_err());
}

#[test]
fn the_model_is_deterministic_and_labelled_as_a_model() {
    let op = GEMM.parse::<Workload>().unwrap().to_op();
    let space = Space::new(&op, &InstructionSet::Gpu { cc: (8, 0) });
    let good = space.trace(&well_tiled()).unwrap();
    let mut m = SimMeasurer::new(device("A100-80GB").unwrap());
    assert_eq!(m.fingerprint().kind, "sim");
    assert!(m.fingerprint().model.contains("analytical model"));
    let cands = vec![Candidate::new(op.clone(), good.clone()); 2];
    let r = m.measure(&cands);
    assert_eq!(r[0], r[1]);
    assert!(r[0].as_ref().unwrap().gflops > 200_000.0);
    // A CPU schedule cannot be generated: a codegen error, not a number.
    let mut t = tessel_ir::Trace::new();
    t.parallel("m");
    let r = m.measure(&[Candidate::new(op, t)]);
    assert_eq!(r[0].as_ref().unwrap_err().kind, MeasureErrorKind::Codegen);
}

#[test]
fn every_device_is_known_by_its_short_name() {
    assert_eq!(devices().len(), 8);
    for name in [
        "v100",
        "T4",
        "a10",
        "A100-80GB",
        "l4",
        "H100-SXM",
        "h200",
        "RTX4090",
    ] {
        device(name).unwrap();
    }
    let e = device("b200").unwrap_err().to_string();
    assert!(
        e.contains("unknown GPU `b200`") && e.contains("h100"),
        "{e}"
    );
}

#[test]
fn fingerprints_carry_the_figures_the_features_read() {
    let target = |name: &str| {
        tessel_features::Target::from_fingerprint(&device(name).unwrap().fingerprint()).unwrap()
    };
    let (v100, a100, h100) = (target("v100"), target("a100"), target("h100"));
    // fp16 Tensor Core MAC per SM per clock: 512, 1024, 2048.
    assert_eq!(
        [v100.peaks()[2], a100.peaks()[2], h100.peaks()[2]],
        [512.0, 1024.0, 2048.0]
    );
    assert_eq!(
        (a100.cores, a100.clock_ghz, a100.memory_bw_gbs),
        (108, 1.41, 2039.0)
    );
    assert!(h100.l2_bw_gbs > a100.l2_bw_gbs);
    // CUDA-core fp32 FMA per SM per clock (what a SIMT kernel's compute token is rated at).
    assert_eq!(
        [
            v100.scalar_macs_per_cycle,
            a100.scalar_macs_per_cycle,
            h100.scalar_macs_per_cycle
        ],
        [64.0, 64.0, 128.0]
    );
}

#[test]
fn split_k_pays_off_where_the_output_is_too_small_to_fill_the_gpu() {
    let a100 = device("a100").unwrap();
    let latency = |spec: &str, split: u64| {
        let s = Sketch::TensorCore {
            mapping: 0,
            wm: 2,
            wn: 2,
            fm: 2,
            fn_: 2,
            kc: 2,
            stages: 3,
            split,
        };
        estimate(&lower(spec, &s), &a100).unwrap().latency_s
    };
    // 128x128 output: 4 blocks of 64x64 for 108 SMs; k = 16384.
    let skinny = "gemm:m=128,n=128,k=16384,dtype=f16";
    let (one, eight) = (latency(skinny, 1), latency(skinny, 8));
    assert!(one / eight > 3.0, "split 8: {eight:e} s against {one:e} s");
    // 4096^3 already fills every SM: splitting only adds atomics and zeroing.
    assert!(latency(GEMM, 2) > latency(GEMM, 1));
}
