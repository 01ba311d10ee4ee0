//! The `cuda` feature: NVRTC (or nvcc) turns generated kernels into PTX; the worker process
//! answers over its pipe; and where a GPU is, candidates are checked and timed on it. On a
//! machine without a GPU (or without NVRTC and nvcc) those parts print `SKIPPED` and why.
#![cfg(feature = "cuda")]

use std::time::Duration;

use tessel_gpu::GpuError;
use tessel_gpu::cuda::{
    Check, CudaMeasurer, CudaOptions, GpuAnswer, GpuJob, GpuRequest, PtxCompiler,
};
use tessel_ir::Workload;
use tessel_measure::worker::{Worker, WorkerCommand, WorkerReply};
use tessel_measure::{Candidate, MeasureErrorKind, Measurer};
use tessel_search::rng::Rng;
use tessel_search::{InstructionSet, Sketch, Space};

fn worker() -> WorkerCommand {
    WorkerCommand::new(env!("CARGO_BIN_EXE_tessel-gpu-worker"))
}

/// Up to `tc` Tensor Core and `simt` SIMT schedules of `spec` that lower.
fn candidates(spec: &str, tc: usize, simt: usize) -> Vec<(Candidate, bool)> {
    let op = spec.parse::<Workload>().unwrap().to_op();
    let space = Space::new(&op, &InstructionSet::Gpu { cc: (8, 0) });
    let mut rng = Rng::new(5);
    let mut out = Vec::new();
    let (mut n_tc, mut n_simt) = (0, 0);
    for _ in 0..300 {
        let s = space.sample(&mut rng);
        let is_tc = matches!(s, Sketch::TensorCore { .. });
        if (is_tc && n_tc >= tc) || (!is_tc && n_simt >= simt) {
            continue;
        }
        if let Ok((trace, _)) = space.lower(&s) {
            if is_tc {
                n_tc += 1
            } else {
                n_simt += 1
            }
            out.push((Candidate::new(op.clone(), trace), is_tc));
        }
    }
    out
}

#[test]
fn generated_kernels_compile_to_ptx() {
    let compiler = match PtxCompiler::find() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("SKIPPED PTX compile check: {e}");
            return;
        }
    };
    eprintln!("compiling with {}", compiler.name());
    let catalog = tessel_intrin::Catalog::default();
    for spec in [
        "gemm:m=256,n=128,k=96,dtype=f16,epilogue=bias+relu",
        "conv2d:n=1,h=14,w=14,c=32,k=64,r=3,s=3,pad=1,dtype=f16",
    ] {
        for (c, is_tc) in candidates(spec, 1, 1) {
            let p = c.trace.lower(&c.op, &catalog).unwrap();
            let k = tessel_gpu::generate(&p, "tsl_k").unwrap();
            for arch in ["sm_80", "sm_90"] {
                let ptx = compiler
                    .ptx(&k.source, arch)
                    .unwrap_or_else(|e| panic!("{spec}: {e}\n{}", k.source));
                assert!(ptx.contains(".entry tsl_k"), "{spec} {arch}");
                assert!(ptx.contains(&format!(".target {arch}")), "{spec} {arch}");
                assert_eq!(ptx.contains("wmma.mma.sync"), is_tc, "{spec} {arch}");
            }
        }
    }
    let e = compiler.ptx("this is not CUDA", "sm_80").unwrap_err();
    assert!(matches!(e, GpuError::Toolchain(_)), "{e}");
}

#[test]
fn the_worker_answers_bad_jobs_with_errors_and_keeps_serving() {
    let mut w = Worker::new(worker());
    let t = Duration::from_secs(30);
    let garbage: GpuAnswer = w.call(&"not a job", t).unwrap();
    match garbage {
        GpuAnswer::Measured(WorkerReply::Err { kind, message }) => {
            assert_eq!(kind, MeasureErrorKind::Runtime);
            assert!(message.contains("unreadable job"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // Same worker: it survived the bad line and describes the machine or says why not.
    let fp: GpuAnswer = w.call(&GpuRequest::Fingerprint, t).unwrap();
    match fp {
        GpuAnswer::Fingerprint(Ok(f)) => {
            assert_eq!(f.kind, "gpu");
            assert!(f.cores_used > 0 && f.features.iter().any(|x| x.starts_with("sm_")));
        }
        GpuAnswer::Fingerprint(Err(e)) => {
            assert!(e.contains("driver") || e.contains("GPU"), "{e}");
            eprintln!("no GPU here: {e}");
        }
        other => panic!("{other:?}"),
    }
    // A job whose module is not PTX: refused (no driver here, or the driver refuses the
    // module), and the worker goes on.
    let op = "gemm:m=16,n=16,k=16,dtype=f16"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let job = GpuJob {
        ptx: "not PTX".into(),
        kernel: "k".into(),
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_bytes: 0,
        zero_output: false,
        args: vec![Some(0), Some(1), None],
        tolerance: tessel_measure::check::tolerance(&op),
        op,
        check: Check::Full,
        seed: 1,
        timing: Default::default(),
    };
    for _ in 0..2 {
        match w
            .call(&GpuRequest::Measure(Box::new(job.clone())), t)
            .unwrap()
        {
            GpuAnswer::Measured(WorkerReply::Err { kind, message }) => {
                assert_eq!(kind, MeasureErrorKind::Runtime, "{message}");
                assert!(
                    message.contains("driver") || message.contains("module"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(w.restarts(), 0);
}

#[test]
fn candidates_are_checked_and_timed_on_the_gpu() {
    let mut m = match CudaMeasurer::new(worker(), CudaOptions::default()) {
        Ok(m) => m,
        Err(e @ (GpuError::NoDevice(_) | GpuError::Toolchain(_))) => {
            eprintln!("SKIPPED GPU measurement: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let fp = m.fingerprint().clone();
    eprintln!("measuring on {} ({})", fp.model, fp.compiler);
    assert_eq!(fp.kind, "gpu");
    for spec in [
        "gemm:m=256,n=128,k=96,dtype=f16,epilogue=bias+relu",
        "gemm:m=100,n=60,k=40,dtype=bf16,epilogue=bias",
        "conv2d:n=1,h=14,w=14,c=32,k=64,r=3,s=3,pad=1,dtype=f16",
        "gemm:m=64,n=64,k=64,dtype=i8",
    ] {
        let cands = candidates(spec, 3, 2);
        let batch: Vec<Candidate> = cands.iter().map(|(c, _)| c.clone()).collect();
        for (r, c) in m.measure(&batch).iter().zip(&batch) {
            let r = r
                .as_ref()
                .unwrap_or_else(|e| panic!("{spec}\n{}: {e}", c.trace));
            assert!(r.timing.median_s > 0.0 && r.gflops > 0.0, "{spec}: {r:?}");
        }
    }
    // Large operators are checked at sampled elements.
    let big = candidates("gemm:m=2048,n=2048,k=2048,dtype=f16", 2, 0);
    let batch: Vec<Candidate> = big.iter().map(|(c, _)| c.clone()).collect();
    for r in m.measure(&batch) {
        let r = r.unwrap();
        eprintln!("2048^3 f16: {:.1} TFLOPS", r.gflops / 1e3);
    }
    assert_eq!(m.worker_restarts(), 0);
}
