//! tessel-measure: the seam between the search and the backends that run candidates.
//!
//! A [`Measurer`] takes [`Candidate`]s (an operator and a schedule trace) and returns one
//! [`MeasureResult`] per candidate, in order: either a [`Measurement`] (latency statistics,
//! compile time) or a [`MeasureError`] that says what went wrong (the schedule did not lower,
//! the code did not compile, the kernel crashed, hung or computed a wrong result). A failed
//! candidate never stops the others. Every result is tied to a [`HardwareFingerprint`].
//!
//! The CPU backend (tessel-cpu) and the GPU backend implement [`Measurer`]; the search only
//! sees this trait. [`worker`] runs kernels in a child process, so a crash or a hang costs
//! one candidate; [`check`] compares outputs with the reference the same way for all. The search ranks candidates before measuring them with a [`CostModel`]
//! (random, analytical, or tessel-model's learned one), the other seam defined here. A
//! backend also says how it emits each tensorized call ([`CodePaths`]), which the features
//! cannot see in the program alone.
//!
//! ```
//! use tessel_measure::{Candidate, MeasureError, MeasureErrorKind, MeasureResult, Measurer,
//!     HardwareFingerprint};
//!
//! /// A measurer that refuses everything, as a backend on the wrong machine would.
//! struct Refuse(HardwareFingerprint);
//!
//! impl Measurer for Refuse {
//!     fn fingerprint(&self) -> &HardwareFingerprint { &self.0 }
//!     fn measure(&mut self, candidates: &[Candidate]) -> Vec<MeasureResult> {
//!         candidates
//!             .iter()
//!             .map(|_| Err(MeasureError::new(MeasureErrorKind::Unsupported, "no such hardware")))
//!             .collect()
//!     }
//! }
//!
//! let op = "gemm:m=8,n=8,k=8,dtype=f32".parse::<tessel_ir::Workload>().unwrap().to_op();
//! let mut m = Refuse(HardwareFingerprint::default());
//! let results = m.measure(&[Candidate::new(op, tessel_ir::Trace::new())]);
//! assert_eq!(results[0].as_ref().unwrap_err().kind, MeasureErrorKind::Unsupported);
//! ```

pub mod check;
mod paths;
pub mod worker;

pub use paths::{CallPath, CallPaths, CodePaths};

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use tessel_ir::{ComputeOp, Program, Trace};

/// One program to measure: an operator and the schedule that computes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub op: ComputeOp,
    pub trace: Trace,
    /// Seconds the checked run may take before the candidate gets no timed runs (its
    /// record is that one sample, flagged `cut_short`): a schedule many times slower than
    /// the task's best teaches as much from one run as from twenty. `None`: no limit. The
    /// CPU measurer honours it; the GPU ones time every candidate in full.
    pub budget_s: Option<f64>,
    /// The input that holds weights, packed once before the kernel is checked and timed
    /// where the schedule packs it at its root: the timing is then that of the pre-packed
    /// entry point `export` ships (and of oneDNN's matmul with pre-packed weights). `None`:
    /// the kernel packs every input on every call. The CPU measurer honours it.
    pub prepacked_weights: Option<usize>,
}

impl Candidate {
    pub fn new(op: ComputeOp, trace: Trace) -> Self {
        Candidate {
            op,
            trace,
            budget_s: None,
            prepacked_weights: None,
        }
    }

    /// The same candidate timed with input `weights` packed beforehand (see
    /// [`Candidate::prepacked_weights`]).
    pub fn with_prepacked_weights(mut self, weights: Option<usize>) -> Self {
        self.prepacked_weights = weights;
        self
    }

    /// The same candidate with a time budget for its checked run.
    pub fn with_budget(mut self, budget_s: Option<f64>) -> Self {
        self.budget_s = budget_s.filter(|b| b.is_finite() && *b > 0.0);
        self
    }
}

/// Latency statistics of repeated runs, in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub min_s: f64,
    pub median_s: f64,
    /// (p90 - p10) / median: how noisy the runs were.
    pub spread: f64,
    pub runs: u32,
}

impl Timing {
    /// Statistics of `samples` (seconds); `None` when there are none.
    pub fn from_samples(samples: &[f64]) -> Option<Timing> {
        if samples.is_empty() || samples.iter().any(|s| !s.is_finite()) {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let at = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
        let median = at(0.5);
        Some(Timing {
            min_s: s[0],
            median_s: median,
            spread: if median > 0.0 {
                (at(0.9) - at(0.1)) / median
            } else {
                0.0
            },
            runs: s.len() as u32,
        })
    }
}

/// A successful measurement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    pub timing: Timing,
    /// The candidate's share of its batch's compile time, in seconds.
    pub compile_time_s: f64,
    /// Largest relative error against the reference (0 for exact integer results).
    pub max_error: f64,
    /// The kernel ran on a software emulation of the instruction (correctness only: the
    /// timing says nothing about the real hardware).
    pub emulated: bool,
    /// The operator's floating-point (or integer) operations per second at the median.
    pub gflops: f64,
    /// The checked run took longer than the candidate's budget, so the timing is one run:
    /// where the checked run was short, a warm run that confirmed it was slow; otherwise
    /// the checked run itself (cold caches included). Enough to rank a slow schedule, not
    /// to quote it. (Before 2026-12-05's twelfth
    /// session the cold run alone decided; `remeasure --cut-short` finds such records.)
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cut_short: bool,
    /// The checked run went on so far past the budget that it was stopped (its worker
    /// killed): the timing is a lower bound, and the output was never checked. Implies
    /// `cut_short`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub censored: bool,
    /// (slowest - fastest) / fastest of the per-allocation medians, when the kernel was
    /// timed on several allocations of its buffers ([`crate::worker::TimingOptions::allocations`]); the
    /// timing then pools every allocation's runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_spread: Option<f64>,
    /// A digest of the code that was timed (the CPU backend's: FNV-1a of the generated C,
    /// whatever the kernel's name). When today's code generator makes another digest of the
    /// same trace, the record describes a kernel that is no longer built (`remeasure
    /// --changed`). Absent in records measured before digests were recorded, and on backends
    /// that do not give one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
}

impl Measurement {
    /// The measurement of a kernel of `flops` operations from its worker's samples (seconds
    /// per run): median timing and GFLOP/s, nothing cut short or censored, no allocation
    /// spread. A worker that returned no samples is a runtime error.
    pub fn from_samples(
        samples: &[f64],
        flops: u64,
        compile_time_s: f64,
        max_error: f64,
        emulated: bool,
    ) -> Result<Measurement, MeasureError> {
        let timing = Timing::from_samples(samples).ok_or_else(|| {
            MeasureError::new(MeasureErrorKind::Runtime, "the worker returned no timings")
        })?;
        Ok(Measurement {
            timing,
            compile_time_s,
            max_error,
            emulated,
            gflops: flops as f64 / timing.median_s / 1e9,
            cut_short: false,
            censored: false,
            allocation_spread: None,
            kernel: None,
        })
    }
}

/// What kind of failure a candidate met.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MeasureErrorKind {
    /// The trace does not apply or does not lower.
    Schedule,
    /// The backend cannot generate code for this program.
    Codegen,
    /// The instruction or feature is not available on this machine.
    Unsupported,
    Compile,
    /// The kernel killed its worker (a signal such as SIGSEGV or SIGILL).
    Crash,
    Timeout,
    /// The output differs from the reference.
    WrongResult,
    /// Anything else that went wrong while running (loading, the worker's own errors).
    Runtime,
}

impl fmt::Display for MeasureErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            MeasureErrorKind::Schedule => "schedule",
            MeasureErrorKind::Codegen => "codegen",
            MeasureErrorKind::Unsupported => "unsupported",
            MeasureErrorKind::Compile => "compile",
            MeasureErrorKind::Crash => "crash",
            MeasureErrorKind::Timeout => "timeout",
            MeasureErrorKind::WrongResult => "wrong result",
            MeasureErrorKind::Runtime => "runtime",
        };
        f.write_str(s)
    }
}

/// Why a candidate has no measurement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeasureError {
    pub kind: MeasureErrorKind,
    pub message: String,
}

impl MeasureError {
    pub fn new(kind: MeasureErrorKind, message: impl Into<String>) -> Self {
        MeasureError {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for MeasureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl std::error::Error for MeasureError {}

pub type MeasureResult = Result<Measurement, MeasureError>;

/// The machine a result was measured on. Records from different fingerprints are different
/// platforms to the model.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HardwareFingerprint {
    /// `cpu` or `gpu` (or `sim` for an analytical model).
    pub kind: String,
    /// CPU model string or GPU name.
    pub model: String,
    pub vendor: String,
    /// CPU family/model/stepping or GPU compute capability.
    pub version: String,
    pub features: Vec<String>,
    /// Cores (or SMs) the measurements used.
    pub cores_used: u32,
    pub cores_available: u32,
    /// Cache or memory sizes by level name (`l1d`, `l2`, `l3`, `shared`), in bytes.
    pub caches: BTreeMap<String, u64>,
    /// The compiler (or driver) that built the code, with its version.
    pub compiler: String,
}

impl HardwareFingerprint {
    /// A short, stable identifier: model, cores used and compiler.
    pub fn key(&self) -> String {
        format!(
            "{}|{}|{}c|{}",
            self.kind, self.model, self.cores_used, self.compiler
        )
    }
}

/// Runs candidates and measures them. Results come back in the candidates' order, one each.
pub trait Measurer {
    fn fingerprint(&self) -> &HardwareFingerprint;

    fn measure(&mut self, candidates: &[Candidate]) -> Vec<MeasureResult>;

    /// Says which candidates `measure` will be given next, so that a backend can prepare
    /// them (compile them on another core) while the current batch runs. Only a hint: the
    /// results of `measure` do not depend on it. The default does nothing.
    fn prefetch(&mut self, _candidates: &[Candidate]) {}

    /// Whether `prefetch` really prepares a batch in the background here (a spare core, kernels
    /// on one thread). A caller that would have to guess the next batch early, before this
    /// one's results, does so only then. The default: no.
    fn prefetches(&self) -> bool {
        false
    }
}

/// Scores lowered programs so the search can measure the promising ones first, and learns
/// from what was measured.
pub trait CostModel {
    /// A short name for reports (`random`, `analytical`, a model file).
    fn name(&self) -> String;

    /// One score per program, higher meaning faster (any scale; only the order matters).
    fn predict(&mut self, programs: &[&Program]) -> Vec<f64>;

    /// Learns from measured programs (results in the same order).
    fn update(&mut self, programs: &[&Program], results: &[MeasureResult]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_statistics() {
        let t = Timing::from_samples(&[3.0, 1.0, 2.0, 10.0, 2.0]).unwrap();
        assert_eq!(t.min_s, 1.0);
        assert_eq!(t.median_s, 2.0);
        assert_eq!(t.runs, 5);
        // p10 rounds to the smallest sample, p90 to the largest.
        assert!((t.spread - (10.0 - 1.0) / 2.0).abs() < 1e-12);
        assert!(Timing::from_samples(&[]).is_none());
        assert!(Timing::from_samples(&[f64::NAN]).is_none());
    }

    #[test]
    fn errors_round_trip_through_json() {
        let e = MeasureError::new(MeasureErrorKind::Crash, "worker killed by SIGSEGV");
        let s = serde_json::to_string(&e).unwrap();
        assert!(s.contains("\"crash\""));
        assert_eq!(serde_json::from_str::<MeasureError>(&s).unwrap(), e);
        assert_eq!(e.to_string(), "crash: worker killed by SIGSEGV");
    }
}
