//! A kernel that crashes, hangs or computes a wrong result becomes an error record; the
//! worker is restarted and the next candidate still measures.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::measurer;
use tessel_cpu::{Kernel, KernelJob, Mode, reference::reference_gemm};
use tessel_measure::{Candidate, MeasureErrorKind, Measurer};

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
            budget_s: None,
            pack: None,
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
            budget_s: None,
            pack: None,
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

/// A measurer that times many runs unless a candidate is cut short (at least 5 and 10 ms of
/// them), with `timeout` for the worker.
fn many_runs(timeout: Duration) -> tessel_cpu::CpuMeasurer {
    common::measurer_with(tessel_cpu::CpuOptions {
        timing: tessel_cpu::TimingOptions {
            warmup: 1,
            min_runs: 5,
            max_runs: 1000,
            min_time_s: 0.010,
            budget_s: None,
            allocations: 1,
            long_run_s: None,
        },
        timeout,
        ..Default::default()
    })
}

/// `kernel` renamed `name`, running the C statements `sleep` before its body: a correct
/// kernel as slow as wanted.
fn sleeping_first(kernel: &Kernel, name: &str, sleep: &str) -> Kernel {
    Kernel {
        name: name.into(),
        source: kernel
            .source
            .replacen('{', &format!("{{ {sleep}"), 1)
            .replacen(&kernel.name, name, 1),
        ..kernel.clone()
    }
}

/// The naive loop nest of `op`, ready to measure by hand.
fn naive_kernel(m: &tessel_cpu::CpuMeasurer, op: &tessel_ir::ComputeOp) -> KernelJob {
    m.prepare(
        &Candidate::new(op.clone(), tessel_ir::Trace::new()),
        "plain",
    )
    .unwrap()
}

#[test]
fn a_checked_run_over_its_budget_is_the_whole_measurement() {
    let w: tessel_ir::Workload = "gemm:m=64,n=64,k=64,dtype=f32".parse().unwrap();
    let op = w.to_op();
    let mut m = many_runs(Duration::from_secs(120));
    let naive = || Candidate::new(op.clone(), tessel_ir::Trace::new());
    let results = m.measure(&[
        naive(),
        // A nanosecond: the checked run always exceeds it.
        naive().with_budget(Some(1e-9)),
        // An hour: it never does.
        naive().with_budget(Some(3600.0)),
    ]);
    let [full, cut, roomy] = [&results[0], &results[1], &results[2]].map(|r| r.as_ref().unwrap());
    assert!(!full.cut_short && full.timing.runs >= 5, "{full:?}");
    // Cut after its checked run and one warm run that confirmed it, which is the timing.
    assert!(cut.cut_short && cut.timing.runs == 1, "{cut:?}");
    assert!(!roomy.cut_short && roomy.timing.runs >= 5, "{roomy:?}");
    // Still checked against the reference before it was cut.
    assert_eq!(cut.max_error, 0.0);
    // Budgets that mean nothing are no budget.
    assert_eq!(naive().with_budget(Some(f64::NAN)).budget_s, None);
    assert_eq!(naive().with_budget(Some(-1.0)).budget_s, None);
}

#[test]
fn a_kernel_slow_only_on_its_first_call_is_not_cut_short() {
    // A static packed buffer's first touch makes a fast kernel's first call slow (8 MB cost
    // a 1 ms kernel 23 ms in a VM); the checked run is that first call. This kernel sleeps
    // 100 ms on its first call only, under a budget of 50 ms: a warm run confirms it is
    // fast, so it is timed in full.
    let w: tessel_ir::Workload = "gemm:m=64,n=64,k=64,dtype=f32".parse().unwrap();
    let op = w.to_op();
    let mut m = many_runs(Duration::from_secs(60));
    let good = naive_kernel(&m, &op);
    let cold = sleeping_first(
        &good.kernel,
        "cold_first_call",
        "static int tsl_cold = 1; if (tsl_cold) { extern int usleep(unsigned int); \
         tsl_cold = 0; usleep(100000); }",
    );
    let always = sleeping_first(
        &good.kernel,
        "slow_every_call",
        "extern int usleep(unsigned int); usleep(100000);",
    );
    let job = |kernel: Kernel| {
        Ok(KernelJob {
            op: op.clone(),
            kernel,
            mode: Mode::Native,
            budget_s: Some(0.05),
            pack: None,
        })
    };
    let r = m.measure_kernels(&[job(cold), job(always)]);
    let cold = r[0].as_ref().unwrap();
    assert!(!cold.cut_short && cold.timing.runs >= 5, "{cold:?}");
    assert!(cold.timing.median_s < 0.05, "{cold:?}");
    // Slow twice: cut short, measured by the warm run.
    let slow = r[1].as_ref().unwrap();
    assert!(slow.cut_short && slow.timing.runs == 1, "{slow:?}");
    assert!(slow.timing.min_s >= 0.1, "{slow:?}");
}

#[test]
fn a_checked_run_far_past_its_budget_is_stopped_and_recorded_as_censored() {
    let w: tessel_ir::Workload = "gemm:m=64,n=64,k=64,dtype=f32".parse().unwrap();
    let op = w.to_op();
    let mut m = many_runs(Duration::from_secs(60));
    let good = naive_kernel(&m, &op);
    let job = |kernel: Kernel, budget_s: f64| {
        Ok(KernelJob {
            op: op.clone(),
            kernel,
            mode: Mode::Native,
            budget_s: Some(budget_s),
            pack: None,
        })
    };
    // Sleeps 30 s: far past 2 budgets of 1 ms (and past the half-second floor), far short of
    // the worker's own timeout of 60 s.
    let slow = handwritten(
        "sleeps",
        "extern unsigned int sleep(unsigned int); sleep(30); (void)args;",
    );
    let start = std::time::Instant::now();
    let r = m.measure_kernels(&[
        job(slow, 1e-3),
        // A second's budget: prepared, checked under a 2 s deadline, then timed in full.
        job(good.kernel.clone(), 1.0),
    ]);
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "not stopped early"
    );
    let censored = r[0].as_ref().unwrap();
    assert!(censored.censored && censored.cut_short, "{censored:?}");
    assert_eq!(censored.timing.runs, 1);
    assert!(
        (censored.timing.median_s - 0.5).abs() < 1e-9,
        "{censored:?}"
    );
    let timed = r[1].as_ref().unwrap();
    assert!(!timed.cut_short && !timed.censored, "{timed:?}");
    assert!(timed.timing.runs >= 5, "{timed:?}");
    assert_eq!(timed.max_error, 0.0);
    assert_eq!(m.worker_restarts(), 1);
    // Odd budgets still measure (KernelJob is built by hand here; a Candidate's budget is
    // checked already): NaN and negative ones take the half-second floor, one past any
    // duration the worker's timeout.
    for odd in [f64::NAN, -1.0, 1e300] {
        assert!(m.measure_kernels(&[job(good.kernel.clone(), odd)])[0].is_ok());
    }
    // A wrong kernel under a budget is still caught by its checked run.
    let wrong = handwritten("nothing", "(void)args;");
    let r = m.measure_kernels(&[job(wrong, 1.0)]);
    assert_eq!(
        r[0].as_ref().unwrap_err().kind,
        MeasureErrorKind::WrongResult
    );
}

#[test]
fn a_prefetched_batch_compiles_in_the_background_and_measures_the_same() {
    // A private cache, so that nothing is compiled before this test compiles it.
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("prefetch-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let opts = tessel_cpu::CpuOptions {
        timing: tessel_cpu::TimingOptions::single_run(),
        ..tessel_cpu::CpuOptions::default()
    };
    let mut m = common::measurer_in(&cache, opts);
    let batch = |sizes: &[u64]| -> Vec<Candidate> {
        sizes
            .iter()
            .map(|&n| {
                let w: tessel_ir::Workload =
                    format!("gemm:m={n},n={n},k={n},dtype=f32").parse().unwrap();
                Candidate::new(w.to_op(), tessel_ir::Trace::new())
            })
            .collect()
    };
    let (first, second) = (batch(&[8, 12]), batch(&[16, 20, 24]));
    // The second batch compiles while the first is measured.
    m.prefetch(&second);
    let a = m.measure(&first);
    let b = m.measure(&second);
    for r in a.iter().chain(&b) {
        let r = r.as_ref().expect("measured");
        assert!(r.max_error <= 1e-3, "{r:?}");
    }
    // Records keep the compile time the background build took...
    assert!(b.iter().all(|r| r.as_ref().unwrap().compile_time_s > 0.0));
    // ...which a batch found in the cache without a prefetch does not have.
    let again = m.measure(&second);
    assert!(
        again
            .iter()
            .all(|r| r.as_ref().unwrap().compile_time_s == 0.0)
    );
    // A prefetch never measures: announcing a batch that is not measured next is harmless.
    m.prefetch(&batch(&[28]));
    let c = m.measure(&first);
    assert!(c.iter().all(Result::is_ok));
    drop(m);
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn timing_on_fresh_allocations_reports_their_spread() {
    let w: tessel_ir::Workload = "gemm:m=64,n=64,k=64,dtype=f32".parse().unwrap();
    let c = Candidate::new(
        w.to_op(),
        reference_gemm(&w, "avx2.vfmadd231ps", None).unwrap(),
    );
    let timed_on = |allocations: u32| {
        let mut m = common::measurer_with(tessel_cpu::CpuOptions {
            timing: tessel_cpu::TimingOptions {
                warmup: 0,
                min_runs: 2,
                max_runs: 2,
                min_time_s: 0.0,
                budget_s: None,
                allocations,
                long_run_s: None,
            },
            ..tessel_cpu::CpuOptions::default()
        });
        m.measure(std::slice::from_ref(&c)).pop().unwrap().unwrap()
    };
    let one = timed_on(1);
    assert_eq!((one.timing.runs, one.allocation_spread), (2, None));
    // Three allocations: every one's runs pooled, and how far their medians are apart.
    let three = timed_on(3);
    assert_eq!(three.timing.runs, 6);
    assert!(
        three.allocation_spread.is_some_and(|s| s >= 0.0),
        "{three:?}"
    );
}

#[test]
fn a_slow_reference_is_kept_on_disk_for_the_next_worker() {
    // 2 GFLOP of dense (W[n, k]: the naive reference keeps the reduction innermost): about a
    // second, each sum a chain of dependent adds, past the half second that is worth a file.
    let w: tessel_ir::Workload = "dense:m=512,n=512,k=4096,dtype=f32".parse().unwrap();
    let op = w.to_op();
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("reference-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let fresh = || {
        common::measurer_in(
            &cache,
            tessel_cpu::CpuOptions {
                emulate: true,
                timing: tessel_cpu::TimingOptions::single_run(),
                ..Default::default()
            },
        )
    };
    // A correct kernel: the naive loop nest itself.
    let candidate = || Candidate::new(op.clone(), tessel_ir::Trace::new());
    assert!(fresh().measure(&[candidate()])[0].is_ok());
    let files: Vec<_> = std::fs::read_dir(cache.join("references"))
        .expect("a references directory")
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");

    // A new worker reads that file instead of computing the reference again: a file whose
    // values are all zero (header kept) makes the same correct kernel fail its check.
    let mut bytes = std::fs::read(&files[0]).unwrap();
    bytes[16..].fill(0);
    std::fs::write(&files[0], &bytes).unwrap();
    let r = fresh().measure(&[candidate()]);
    assert_eq!(
        r[0].as_ref().unwrap_err().kind,
        MeasureErrorKind::WrongResult
    );
    // Without it, the reference is computed (and kept) again.
    std::fs::remove_file(&files[0]).unwrap();
    assert!(fresh().measure(&[candidate()])[0].is_ok());
    assert!(files[0].exists());
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn under_a_loose_budget_the_workers_timeout_censors_the_check_and_keeps_a_slow_timing() {
    let w: tessel_ir::Workload = "gemm:m=64,n=64,k=64,dtype=f32".parse().unwrap();
    let op = w.to_op();
    let mut m = many_runs(Duration::from_millis(2500));
    let good = naive_kernel(&m, &op);
    // The same correct kernel, sleeping first.
    let sleepy = |name: &str, seconds: u32| {
        sleeping_first(
            &good.kernel,
            name,
            &format!("extern unsigned int sleep(unsigned int); sleep({seconds});"),
        )
    };
    let job = |kernel: Kernel| {
        Ok(KernelJob {
            op: op.clone(),
            kernel,
            mode: Mode::Native,
            // Deadlines of 2 budgets (200 s) that the 2.5 s timeout cuts.
            budget_s: Some(100.0),
            pack: None,
        })
    };
    let r = m.measure_kernels(&[job(sleepy("sleeps_10", 10)), job(sleepy("sleeps_1", 1))]);
    // Past the timeout in its check: censored there, not an error.
    let censored = r[0].as_ref().unwrap();
    assert!(censored.censored && censored.cut_short, "{censored:?}");
    assert!(
        (censored.timing.median_s - 2.5).abs() < 1e-9,
        "{censored:?}"
    );
    // Checked in a second, but six more runs would outlast the timeout: the checked run is
    // the measurement.
    let slow = r[1].as_ref().unwrap();
    assert!(slow.cut_short && !slow.censored, "{slow:?}");
    assert_eq!(slow.timing.runs, 1);
    assert!(slow.timing.median_s >= 1.0, "{slow:?}");
    assert_eq!(slow.max_error, 0.0);
}

#[test]
fn a_long_checked_run_is_the_whole_measurement() {
    let w: tessel_ir::Workload = "gemm:m=64,n=64,k=64,dtype=f32".parse().unwrap();
    let op = w.to_op();
    let measurer = |timing: tessel_cpu::TimingOptions| {
        common::measurer_with(tessel_cpu::CpuOptions {
            timing,
            ..Default::default()
        })
    };
    let good = naive_kernel(&measurer(Default::default()), &op);
    // The same correct kernel, taking 0.3 s a run.
    let slow = sleeping_first(
        &good.kernel,
        "naps",
        "extern int usleep(unsigned int); usleep(300000);",
    );
    let job = |budget_s: Option<f64>| {
        Ok(KernelJob {
            op: op.clone(),
            kernel: slow.clone(),
            mode: Mode::Native,
            budget_s,
            pack: None,
        })
    };
    let long = tessel_cpu::TimingOptions {
        long_run_s: Some(0.2),
        ..Default::default()
    };
    // In one call (no budget) and in phases (a budget it meets): checked, then done.
    for r in measurer(long).measure_kernels(&[job(None), job(Some(10.0))]) {
        let m = r.unwrap();
        assert_eq!(m.timing.runs, 1, "{m:?}");
        assert!(!m.cut_short && !m.censored, "{m:?}");
        assert!(m.timing.median_s >= 0.3, "{m:?}");
        assert_eq!(m.max_error, 0.0);
    }
    // Asked to time on fresh allocations, or with no long-run rule, it is timed: two runs
    // on each allocation.
    let two_runs = tessel_cpu::TimingOptions {
        min_runs: 2,
        max_runs: 2,
        ..long
    };
    let two_allocations = tessel_cpu::TimingOptions {
        allocations: 2,
        ..two_runs
    };
    let never = tessel_cpu::TimingOptions {
        long_run_s: None,
        ..two_runs
    };
    for timing in [two_allocations, never] {
        let r = measurer(timing).measure_kernels(&[job(Some(10.0))]);
        let m = r[0].as_ref().unwrap();
        assert_eq!(m.timing.runs, 2 * timing.allocations, "{m:?}");
        assert!(!m.cut_short, "{m:?}");
    }
}
