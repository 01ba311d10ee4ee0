//! tessel: an auto-tuner for tensor programs on tensorized instructions (Intel AMX,
//! AVX-512 VNNI/BF16, AVX2, NVIDIA Tensor Cores), as a library.
//!
//! This façade crate holds the pipelines as plain functions over option structs; they return
//! reports and print nothing (progress goes through a [`Progress`]):
//!
//! - [`tune`]: search the schedule space of a workload or a network on a [`Target`], rank
//!   candidates with the learned cost model, measure the best, log every record.
//! - [`dataset`] and [`merge`]: random schedules of every task, measured, as records;
//!   [`remeasure`]: chosen records measured again, superseding the old ones; [`coverage`]:
//!   the mappings of today's space a dataset's tasks have no record of.
//! - [`pretrain`], [`transfer`] and [`eval`]: the attention cost model on those records;
//!   [`held_out`]: TenSet's protocol; [`search_eval`]: tuning with the model against tuning
//!   at random, in trials to the best.
//! - [`measure`], [`bench_cpu`], [`best`], [`emit`], [`sim_check`]: one schedule, the
//!   reference kernels beside oneDNN, the best of a log and its code, the GPU model's ranking.
//! - [`export`]: the best kernels of a log as a C library (header, `.a`, `.so`, manifest)
//!   and a Rust crate of safe wrappers.
//!
//! The parts are re-exported as modules: [`ir`] (operators, workloads, traces, lowering),
//! [`intrin`] (instructions and matching), [`search`], [`features`], [`model`], [`cpu`],
//! [`gpu`] and [`measurement`].
//!
//! Kernels run in a worker process, so a crash never takes the caller down. The worker is
//! this same program: call [`serve_if_worker`] first thing in `main`.
//!
//! ```no_run
//! use tessel::{NoProgress, TuneOptions};
//!
//! fn main() -> Result<(), tessel::Error> {
//!     tessel::serve_if_worker();
//!     let gemm = "gemm:m=256,n=256,k=256,dtype=f32".parse()?;
//!     let opts = TuneOptions {
//!         trials: 32,
//!         ..TuneOptions::workload(gemm)
//!     };
//!     let report = tessel::tune(&opts, &mut NoProgress)?;
//!     println!("{:.1} GFLOP/s", report.gflops.unwrap_or(0.0));
//!     Ok(())
//! }
//! ```
#![deny(missing_docs)]

mod bench;
mod bynetwork;
mod coverage;
mod data;
mod dataset;
mod error;
mod export;
mod heldout;
mod learn;
mod measure;
mod plot;
mod progress;
mod refit;
mod remeasure;
mod searcheval;
mod simcheck;
mod target;
mod threads;
mod tune;
mod worker;

pub use bench::{BENCH_HEADER, BenchOptions, BenchReport, BenchRow, bench_cpu, bench_row_line};
pub use bynetwork::ByNetwork;
pub use coverage::{CoverageOptions, CoverageReport, TaskGap, coverage};
pub use data::{Encoding, load, load_encoded, network_filter, network_filter_except, strict_read};
pub use dataset::{
    CANARY_EVERY, CanaryReport, DatasetOptions, DatasetReport, dataset, merge, parse_shard,
};
pub use error::{Context, Error, Result};
pub use export::{ExportOptions, ExportReport, ExportedKernel, export};
pub use heldout::{
    HeldOutOptions, HeldOutPicks, HeldOutReport, NetworkScores, Scores, TEST_NETWORKS, held_out,
};
pub use learn::{
    Against, Architecture, DEFAULT_SHOTS_PER_TASK, EvalOptions, EvalReport, HELD_OUT_NETWORKS,
    MIN_VALIDATION_PAIRS, MIN_VALIDATION_TASKS, PretrainOptions, PretrainReport, SHIPPED_DATASETS,
    TRANSFER_MAX_NETWORK_LOSS_Z, TRANSFER_MIN_GAIN_Z, TaskPick, TransferOptions, TransferReport,
    VALIDATION_TASKS, eval, load_model, pretrain, read_task_keys, transfer, validation_tasks_of,
};
pub use measure::{MeasureOptions, MeasureReport, generated_c, measure, schedule_of};
pub use progress::{NoProgress, Notes, Progress};
pub use refit::{REPLACE_MIN_GAIN_Z, RefitOptions, RefitReport, refit_trees};
pub use remeasure::{Change, RemeasureOptions, RemeasureReport, remeasure};
pub use searcheval::{
    Ranking, SearchEvalOptions, SearchEvalReport, SearchRun, SearchTask, best_so_far, search_eval,
    trials_to_reach,
};
pub use simcheck::{SimCheckReport, sim_check};
pub use target::{
    Peaks, Target, TargetOptions, TargetSpec, cpu_measurer, feature_target, instruction_of,
};
pub use threads::{THREADS_ENV, fit_threads_to_affinity, threads_for_affinity};
pub use tune::{
    Emit, ModelChoice, REMEASURE_ALLOCATIONS, REMEASURE_PROCESSES, TaskReport, TuneOptions,
    TuneReport, best, cpu_instructions, emit, fixtures_dir, read_log_noting, tune,
};
pub use worker::{WORKER_ENV, serve_if_worker, worker_command};

/// Operators, workloads, networks, schedule traces, lowering and the reference interpreter.
pub use tessel_ir as ir;

/// Tensorized instructions as data, host detection, the matching problem, the CPU tables.
pub use tessel_intrin as intrin;

/// The `Measurer` seam, candidates, results, fingerprints and the worker process.
pub use tessel_measure as measurement;

/// Schedule spaces, evolutionary search and tuning records.
pub use tessel_search as search;

/// Allocation features.
pub use tessel_features as features;

/// The attention cost model: training, transfer, metrics.
pub use tessel_model as model;

/// The x86 backend: C generation, compilation, isolated measurement.
pub use tessel_cpu as cpu;

/// The NVIDIA backend: CUDA generation, the analytical model, real measurement (`cuda`).
pub use tessel_gpu as gpu;

pub use tessel_ir::{DType, Trace, Workload};
pub use tessel_search::TuningRecord;
