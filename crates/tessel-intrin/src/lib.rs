//! tessel-intrin: tensorized instructions described as data, and the matching problem.
//!
//! - [`catalog`]: AMX (bf16, int8), AVX-512 (VNNI, BF16, FP16, FMA), AVX2 FMA, and NVIDIA
//!   WMMA, mma.sync and wgmma, each an [`Intrinsic`]: a compute abstraction (`m x n x k`, dtypes,
//!   semantics as a tessel-ir [`ComputeOp`](tessel_ir::ComputeOp)), a memory abstraction per
//!   operand (storage, layout, load/store, alignment, register count, path through the memory
//!   levels), published throughput, and what enables it.
//! - [`HostCpu`]: run-time detection of what this CPU supports (cpuid; AMX needs the OS's
//!   permission too, requested once per process).
//! - [`CPU_INSTRUCTIONS`] and [`CPU_PLATFORMS`]: what the CPU code generator supports and the
//!   platforms datasets are measured on.
//! - [`match_op`]: every [`Mapping`] of an operator onto an instruction, with padding waste and
//!   the transforms (VNNI packing, transposes, im2col) each operand needs.
//! - [`busiest_register_block`]: the register block that keeps the most accumulators busy.
//!
//! ```
//! use tessel_intrin::{Catalog, match_op};
//! use tessel_ir::Workload;
//!
//! let catalog = Catalog::default();
//! let amx = catalog.get("amx.tdpbf16ps").unwrap();
//! let op = "gemm:m=64,n=64,k=64,dtype=bf16".parse::<Workload>().unwrap().to_op();
//! let mappings = match_op(&op, amx).unwrap();
//! assert_eq!(mappings[0].padding_waste(), 0.0);
//! // The mapping is a schedule tessel-ir can replay, tensorized with the instruction.
//! let program = mappings[0].to_trace(amx).lower(&op, &catalog).unwrap();
//! assert!(program.to_string().contains("amx.tdpbf16ps"));
//! ```

mod blocking;
mod catalog;
mod desc;
mod host;
mod matching;
mod platform;

pub use blocking::{
    accumulator_budget, busiest_register_block, largest_dividing_block, max_accumulators,
};
pub use catalog::{Catalog, catalog, partial_rows};
pub use desc::{
    Intrinsic, LayoutReq, MemLevel, OperandMemory, Platform, Requirement, Storage, Throughput,
};
pub use host::{HostCpu, Support};
pub use matching::{DimAssignment, Mapping, MatchError, OperandTransform, TransformKind, match_op};
pub use platform::{
    CPU_INSTRUCTIONS, CPU_PLATFORMS, CpuPlatform, OPT_IN_INSTRUCTIONS, UnknownPlatform,
    default_cpu_instructions, is_opt_in,
};
