//! Real measurement on an NVIDIA GPU (feature `cuda`): [`CudaMeasurer`] generates each
//! candidate's kernel, compiles it to PTX ([`PtxCompiler`]: NVRTC at run time, or nvcc), and
//! sends it to a worker process ([`serve`]) that loads it through the CUDA driver (cudarc,
//! loaded at run time, so a binary built without CUDA runs where a GPU is), checks the output
//! against the CPU reference and times it with CUDA events.
//!
//! A kernel that faults poisons its CUDA context: the worker reports it as a crash and exits,
//! and the parent starts a fresh one. A kernel that hangs is killed by the parent's timeout.
//! The parent process never touches the driver.
//!
//! - `compiler`: [`PtxCompiler`], NVRTC or nvcc, and where the CUDA headers are.
//! - `measurer`: [`CudaMeasurer`], the parent side (lower, generate, compile a batch on every
//!   core, one job per candidate to the worker).
//! - `worker`: [`serve`], the worker process that owns the driver.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags, CUfunction_attribute};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use serde::{Deserialize, Serialize};
use tessel_ir::{ComputeOp, DType, TensorData};
use tessel_measure::check::{max_relative_error, relative_error, tolerance, unravel};
use tessel_measure::worker::{TimingOptions, Worker, WorkerCommand, WorkerReply};
use tessel_measure::{
    Candidate, HardwareFingerprint, MeasureError, MeasureErrorKind, MeasureResult, Measurement,
    Measurer,
};

use crate::codegen::{generate, param_operands};
use crate::device::spec_for;
use crate::error::GpuError;
use crate::nvcc::Nvcc;

mod compiler;
mod measurer;
mod worker;

pub use compiler::PtxCompiler;
pub use measurer::CudaMeasurer;
pub use worker::{sample_points, serve};

/// How the output of a kernel is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// Every element against tessel-ir's interpreter.
    Full,
    /// This many elements (the corners and a fixed pseudo-random sample) against
    /// [`ComputeOp::reference_at`], and every element for NaN (the output starts as NaN, so
    /// an element the kernel never writes is caught).
    Sampled(u32),
    /// No check (benchmarks of already-checked kernels).
    None,
}

/// One kernel to check and time.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GpuJob {
    /// PTX text of a module holding the kernel.
    pub ptx: String,
    pub kernel: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
    /// Split-K: the output starts as zeros (the kernel adds into it).
    #[serde(default)]
    pub zero_output: bool,
    /// The kernel's parameters: `Some(i)` is the operator's `i`-th read operand
    /// ([`ComputeOp::read_operands`]), `None` the output.
    pub args: Vec<Option<usize>>,
    pub op: ComputeOp,
    pub check: Check,
    /// Inputs are `TensorData::random(shape, dtype, seed + i)`.
    pub seed: u64,
    pub tolerance: f64,
    pub timing: TimingOptions,
}

/// What the parent asks the worker.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuRequest {
    /// Open the device and describe it.
    Fingerprint,
    Measure(Box<GpuJob>),
}

/// The worker's answers.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuAnswer {
    Fingerprint(Result<HardwareFingerprint, String>),
    Measured(WorkerReply),
}

/// How the CUDA measurer runs candidates.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    pub timing: TimingOptions,
    /// Longest a worker may take for one candidate before it is killed.
    pub timeout: Duration,
    /// Operators up to this many multiply-accumulates are checked whole; larger ones at
    /// `sample_points` elements.
    pub full_check_max_macs: u64,
    pub sample_points: u32,
    pub seed: u64,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            timing: TimingOptions {
                warmup: 3,
                min_runs: 10,
                max_runs: 200,
                min_time_s: 0.05,
                budget_s: None,
                allocations: 1,
                long_run_s: None,
            },
            timeout: Duration::from_secs(60),
            full_check_max_macs: 1 << 24,
            sample_points: 512,
            seed: 1,
        }
    }
}
