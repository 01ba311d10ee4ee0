//! tessel-ir: the tensor IR every other tessel crate builds on.
//!
//! - [`DType`], [`TensorDecl`], [`IterVar`], [`AffineExpr`] and [`ComputeOp`]: an operator is
//!   `out[s] (+)= sum_r prod(inputs[access])`, accumulated in an accumulator type, with an
//!   optional epilogue (bias, relu, cast).
//! - [`Workload`]: GEMM, dense, batched matmul and conv2d at concrete sizes, with spec strings
//!   that parse and print (`gemm:m=1024,n=1024,k=1024,dtype=bf16`).
//! - [`network`]: ResNet-50, MobileNet-V2, BERT-base, ViT-B/16 and a LLaMA-7B layer as DAGs,
//!   and their distinct [`Task`]s with weights.
//! - [`Trace`]: a schedule as a replayable list of primitives; [`Trace::apply`] validates each
//!   step and [`Schedule::lower`] produces a loop-nest [`Program`].
//! - [`Program::run`]: the reference interpreter, which tests hold against
//!   [`ComputeOp::reference`].
//!
//! ```
//! use tessel_ir::{TensorData, Trace, Workload};
//!
//! let op = "gemm:m=6,n=5,k=7,dtype=bf16".parse::<Workload>().unwrap().to_op();
//! let mut trace = Trace::new();
//! trace.split("m", &[4]).split("k", &[2]).reorder(&["m.0", "k.0", "n", "m.1", "k.1"]);
//! let program = trace.lower(&op, &()).unwrap();
//!
//! let a = TensorData::random(vec![6, 7], tessel_ir::DType::BF16, 1);
//! let b = TensorData::random(vec![7, 5], tessel_ir::DType::BF16, 2);
//! let got = program.run(&[a.clone(), b.clone()]).unwrap();
//! let want = op.reference(&[a, b]).unwrap();
//! assert!(got.max_relative_error(&want) < 1e-6);
//! ```

mod ast;
mod data;
mod dtype;
mod error;
mod interp;
mod network;
mod op;
mod schedule;
mod trace;
mod workload;

pub use ast::{
    Buffer, BufferRef, BufferRole, Expr, For, Guard, LoopKind, LoopVar, Program, Stmt,
    TensorizedCall, linear_stride,
};
pub use data::TensorData;
pub use dtype::DType;
pub use error::{ExecError, NetworkError, OpError, ScheduleError, SpecError, TraceIoError};
pub use network::{
    IMAGE_SIZES, Layer, MOBILENET_V2_BLOCKS, NETWORKS, Network, RESIZABLE_NETWORKS, Task, network,
    network_with_types,
};
pub use op::{AffineExpr, ComputeOp, Epilogue, IterKind, IterVar, Operand, TensorDecl};
pub use schedule::Schedule;
pub use trace::{GpuAxis, IntrinsicResolver, LayoutTransform, Scope, Step, Trace};
pub use workload::{
    Conv2d, ConvLayout, EpilogueSpec, MAX_EXTENT, MAX_MACS, MAX_TENSOR_BYTES, Types, Workload,
};
