//! A kernel that crashes, hangs or computes a wrong result becomes an error record; the
//! worker is restarted and the next candidate still measures.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::measurer;
use tessel_cpu::{Kernel, KernelJob, Mode, reference::reference_gemm};
use tessel_measure::{MeasureErrorKind, Measurer};

fn handwritten(name: &str, body: &str) -> Kernel {
    Kernel {
        name: name.into(),
        source: format!("void {name}(void *const *args) {{ {body} }}"),
        features: BTreeSet::new(),
        intrinsics: BTreeSet::new(),
    }
}

#[test]
fn crashing_hanging_and_wrong_kernels_become_error_records() {
    let w: tessel_ir::Workload = "gemm:m=16,n=16,k=16,dtype=f32".parse().unwrap();
    let op = w.to_op();
    let mut m = measurer(true);
    let good = m
        .prepare(
            &tessel_measure::Candidate::new(
                op.clone(),
                reference_gemm(&w, "avx2.vfmadd231ps", None).unwrap(),
            ),
            "good",
        )
        .unwrap();
    let job = |k: Kernel| {
        Ok(KernelJob {
            op: op.clone(),
            kernel: k,
            mode: Mode::Native,
        })
    };
    let jobs = vec![
        job(handwritten(
            "segfault",
            "volatile float *p = 0; *p = 1.0f; (void)args;",
        )),
        Ok(good.clone()),
        job(handwritten(
            "zeros",
            "float *c = (float *)args[2]; for (int i = 0; i < 256; i++) c[i] = 0;",
        )),
        job(handwritten("nothing", "(void)args;")),
        job(handwritten("aborts", "__builtin_trap();")),
        Ok(good),
    ];
    let r = m.measure_kernels(&jobs);
    let kinds: Vec<Result<(), MeasureErrorKind>> = r
        .iter()
        .map(|x| x.as_ref().map(|_| ()).map_err(|e| e.kind))
        .collect();
    assert_eq!(
        kinds,
        vec![
            Err(MeasureErrorKind::Crash),
            Ok(()),
            Err(MeasureErrorKind::WrongResult),
            Err(MeasureErrorKind::WrongResult),
            Err(MeasureErrorKind::Crash),
            Ok(()),
        ],
        "{r:#?}"
    );
    let crash = r[0].as_ref().unwrap_err().to_string();
    assert!(crash.contains("SIGSEGV"), "{crash}");
    assert!(
        r[4].as_ref().unwrap_err().to_string().contains("SIGILL"),
        "{:?}",
        r[4]
    );
    assert_eq!(m.worker_restarts(), 2);
}

#[test]
fn a_hanging_kernel_times_out_and_the_next_one_runs() {
    let w: tessel_ir::Workload = "gemm:m=4,n=4,k=4,dtype=f32".parse().unwrap();
    let op = w.to_op();
    let m = measurer(true);
    let mut opts = m.options().clone();
    opts.timeout = Duration::from_millis(1500);
    let mut m = tessel_cpu::CpuMeasurer::with_compiler(
        tessel_cpu::WorkerCommand::new(env!("CARGO_BIN_EXE_tessel-cpu-worker")),
        opts,
        m.compiler().clone(),
    )
    .unwrap();
    let good = m
        .prepare(
            &tessel_measure::Candidate::new(op.clone(), tessel_ir::Trace::new()),
            "plain",
        )
        .unwrap();
    let hang = handwritten("hang", "for (volatile int i = 0; ; i++) { (void)args; }");
    let jobs = vec![
        Ok(KernelJob {
            op: op.clone(),
            kernel: hang,
            mode: Mode::Native,
        }),
        Ok(good),
    ];
    let r = m.measure_kernels(&jobs);
    assert_eq!(
        r[0].as_ref().unwrap_err().kind,
        MeasureErrorKind::Timeout,
        "{r:?}"
    );
    assert!(r[1].is_ok(), "{r:?}");
    let _ = m.fingerprint();
}

#[test]
fn instructions_this_cpu_lacks_are_skipped_with_a_reason() {
    let host = tessel_intrin::HostCpu::detect();
    let catalog = tessel_intrin::Catalog::default();
    let intr = catalog.get("amx.tdpbf16ps").unwrap();
    if host.supports(intr) == tessel_intrin::Support::Yes {
        eprintln!("note: this CPU has AMX; the skip path is not exercised here");
        return;
    }
    let w: tessel_ir::Workload = "gemm:m=32,n=32,k=64,dtype=bf16".parse().unwrap();
    let trace = reference_gemm(&w, "amx.tdpbf16ps", None).unwrap();
    let r = measurer(false).measure(&[tessel_measure::Candidate::new(w.to_op(), trace)]);
    let e = r[0].as_ref().unwrap_err();
    assert_eq!(e.kind, MeasureErrorKind::Unsupported);
    assert!(e.message.contains("amx_bf16"), "{e}");
    assert!(e.message.contains("lacks"), "{e}");
}
