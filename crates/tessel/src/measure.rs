//! `measure`: one schedule of one workload on this CPU, generated, compiled, checked against
//! the reference and timed in a worker process.

use std::path::PathBuf;

use serde::Serialize;
use tessel_cpu::reference::reference_gemm;
use tessel_ir::{Trace, Workload};
use tessel_measure::{Candidate, HardwareFingerprint, Measurer};

use crate::error::{Context, Error, Result};
use crate::target::{TargetOptions, cpu_measurer};

/// What to measure.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct MeasureOptions {
    /// A workload spec.
    #[cfg_attr(feature = "clap", arg(long))]
    pub workload: Workload,
    /// A CPU instruction id: use its hand-written reference schedule (GEMM).
    #[cfg_attr(feature = "clap", arg(long, conflicts_with = "trace"))]
    pub intrinsic: Option<String>,
    /// A trace (JSON) to measure; without it and without an instruction, the naive loop nest.
    #[cfg_attr(feature = "clap", arg(long))]
    pub trace: Option<PathBuf>,
    /// OpenMP threads.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1))]
    pub threads: usize,
    /// Run instructions this CPU lacks on their scalar emulation (correctness only).
    #[cfg_attr(feature = "clap", arg(long))]
    pub emulate: bool,
    /// Pack the weights before timing where the schedule packs them at its root, as `tune
    /// --prepacked-weights` does: the pre-packed entry point's latency.
    #[cfg_attr(feature = "clap", arg(long))]
    pub prepacked_weights: bool,
    /// The measurement worker executable (default: this program).
    #[cfg_attr(feature = "clap", arg(skip))]
    pub worker_exe: Option<PathBuf>,
}

/// One schedule's measurement.
#[derive(Clone, Debug, Serialize)]
pub struct MeasureReport {
    /// The workload spec.
    pub workload: String,
    /// The reference schedule's instruction, if one was used.
    pub intrinsic: Option<String>,
    /// OpenMP threads.
    pub threads: usize,
    /// Median latency, ms.
    pub latency_ms: f64,
    /// Fastest run, ms.
    pub min_ms: f64,
    /// Throughput at the median.
    pub gflops: f64,
    /// Timed runs.
    pub runs: u32,
    /// (max - min) / median over the runs.
    pub spread: f64,
    /// Compile time, s.
    pub compile_time_s: f64,
    /// Whether it ran on the scalar emulation (a correctness check, not a timing).
    pub emulated: bool,
    /// The machine.
    pub fingerprint: HardwareFingerprint,
}

/// The schedule the options name: a trace file, an instruction's reference GEMM, or none.
pub fn schedule_of(o: &MeasureOptions) -> Result<Trace> {
    o.workload
        .validate()
        .with_context(|| format!("workload `{}`", o.workload))?;
    Ok(match (&o.intrinsic, &o.trace) {
        (_, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read trace {}", path.display()))?;
            Trace::from_json(&text).with_context(|| format!("trace {}", path.display()))?
        }
        (Some(id), None) => reference_gemm(&o.workload, id, None).map_err(Error::Invalid)?,
        (None, None) => Trace::new(),
    })
}

/// The C the CPU code generator makes of the options' schedule.
pub fn generated_c(o: &MeasureOptions) -> Result<String> {
    let trace = schedule_of(o)?;
    let m = cpu_measurer(&target_options(o))?;
    let job = m.prepare(&Candidate::new(o.workload.to_op(), trace), "kernel")?;
    Ok(job.kernel.source)
}

fn target_options(o: &MeasureOptions) -> TargetOptions {
    TargetOptions {
        threads: o.threads,
        emulate: o.emulate,
        worker_exe: o.worker_exe.clone(),
    }
}

/// Generates, compiles, checks and times the options' schedule.
pub fn measure(o: &MeasureOptions) -> Result<MeasureReport> {
    let trace = schedule_of(o)?;
    let mut m = cpu_measurer(&target_options(o))?;
    let weights = o.workload.weight_input().filter(|_| o.prepacked_weights);
    let candidate = Candidate::new(o.workload.to_op(), trace).with_prepacked_weights(weights);
    let r = m.measure(std::slice::from_ref(&candidate)).remove(0)?;
    Ok(MeasureReport {
        workload: o.workload.to_string(),
        intrinsic: o.intrinsic.clone(),
        threads: o.threads,
        latency_ms: r.timing.median_s * 1e3,
        min_ms: r.timing.min_s * 1e3,
        gflops: r.gflops,
        runs: r.timing.runs,
        spread: r.timing.spread,
        compile_time_s: r.compile_time_s,
        emulated: r.emulated,
        fingerprint: m.fingerprint().clone(),
    })
}
