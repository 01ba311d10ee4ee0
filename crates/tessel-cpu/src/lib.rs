//! tessel-cpu: the x86 CPU backend, tessel's ground truth.
//!
//! - [`codegen`]: a lowered [`tessel_ir::Program`] becomes a C function that calls the
//!   compiler's intrinsics for the tensorized instructions (`_tile_dpbf16ps`,
//!   `_mm512_dpbusd_epi32`, `_mm256_fmadd_ps`, ...), with OpenMP parallel loops, register
//!   blocking, and comments that cite the trace step behind each statement.
//! - [`compile`]: the system C compiler builds many kernels into one shared object, cached by
//!   content hash.
//! - [`worker`]: a child process loads the object (libloading), checks each kernel against a
//!   reference and times it; a kernel that crashes or hangs costs only the worker.
//! - [`CpuMeasurer`]: all of the above behind [`tessel_measure::Measurer`].
//! - [`reference`]: hand-written GEMM schedules (traces) per instruction; [`naive`]: the loop
//!   order of the naive kernel that checks large candidates.
//!
//! Instructions the CPU lacks are skipped with a reason, or, with [`CpuOptions::emulate`],
//! run on a scalar emulation of the intrinsics to check correctness (never timed as real).
//!
//! ```no_run
//! use tessel_cpu::{CpuMeasurer, CpuOptions, WorkerCommand, reference::reference_gemm};
//! use tessel_measure::{Candidate, Measurer};
//!
//! let w: tessel_ir::Workload = "gemm:m=256,n=256,k=256,dtype=f32".parse().unwrap();
//! let trace = reference_gemm(&w, "avx2.vfmadd231ps", None).unwrap();
//! let mut m = CpuMeasurer::new(WorkerCommand::new("tessel-cpu-worker"), CpuOptions::default()).unwrap();
//! let r = m.measure(&[Candidate::new(w.to_op(), trace)]);
//! println!("{:.1} GFLOP/s", r[0].as_ref().unwrap().gflops);
//! ```

mod buffers;
pub mod codegen;
pub mod compile;
mod error;
mod fingerprint;
mod measurer;
pub mod naive;
pub mod peak;
pub mod reference;
mod reference_cache;
pub mod worker;

pub use buffers::{AlignedBuf, decode, encode};
pub use codegen::{CpuCodePaths, Kernel, call_paths, generate, module_source};
pub use compile::{Compiler, Library, Mode};
pub use error::{CodegenError, CompileError, CpuError, WorkerError};
pub use fingerprint::fingerprint;
pub use measurer::{CpuMeasurer, CpuOptions, KernelJob};
pub use worker::{Phase, Reference, TimingOptions, WorkerCommand};
