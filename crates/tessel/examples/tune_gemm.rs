//! Tunes a GEMM on this CPU with the shipped cost model and prints the best schedule's C.
//!
//! ```sh
//! cargo run --release -p tessel --example tune_gemm -- gemm:m=256,n=256,k=256,dtype=f32 32
//! ```

use tessel::{Emit, NoProgress, TuneOptions, Workload};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Kernels are measured in a child process: this same program, started as a worker.
    tessel::serve_if_worker();
    // The model's thread pool as large as the CPUs this process may use (`taskset`).
    // SAFETY: no other thread has started yet.
    unsafe { tessel::fit_threads_to_affinity() };
    let mut args = std::env::args().skip(1);
    let workload: Workload = args
        .next()
        .unwrap_or_else(|| "gemm:m=256,n=256,k=256,dtype=f32".into())
        .parse()?;
    let trials: usize = args.next().map_or(Ok(32), |t| t.parse())?;
    let log = std::env::temp_dir().join(format!("tessel-example-{}.jsonl", std::process::id()));
    let opts = TuneOptions {
        trials,
        measure_batch: 8,
        log: Some(log.clone()),
        ..TuneOptions::workload(workload)
    };
    let report = tessel::tune(&opts, &mut NoProgress)?;
    let task = &report.tasks[0];
    println!(
        "{}: {} trials, best {:.4} ms = {:.1} GFLOP/s ({:.0}% of its instruction's peak) with {}",
        task.workload,
        task.trials,
        task.latency_ms.unwrap_or(f64::NAN),
        task.gflops.unwrap_or(0.0),
        task.percent_of_peak.unwrap_or(0.0),
        report.model
    );
    // The log holds every measured candidate; its best record becomes C.
    let best = tessel::best(&log, &mut NoProgress)?;
    println!("{}", tessel::emit(&best[0], Emit::C)?);
    std::fs::remove_file(&log)?;
    Ok(())
}
