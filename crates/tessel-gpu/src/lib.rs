//! tessel-gpu: the NVIDIA GPU backend.
//!
//! - [`codegen`]: a GPU program (tessel-ir, loops bound to blocks, warps and threads) becomes
//!   one CUDA C++ kernel: Tensor Cores through WMMA or `mma.sync` with `ldmatrix` (inline
//!   PTX), block-wide shared-memory staging with 16-byte vectors and padded rows, multi-stage
//!   `cp.async` pipelines, split-K, and an epilogue (bias, relu, cast) applied per element
//!   with the edge guards.
//! - [`emulate`]: runs generated kernels on the CPU (a thread per CUDA thread, warp-collective
//!   operations emulated from the PTX ISA), to check what they compute without a GPU.
//! - [`nvcc`]: compiles generated kernels without a GPU (nvcc from PyPI's wheels) and reads
//!   `ptxas -v` (registers, spills, shared memory).
//! - [`device`] and [`sim`]: the analytical model behind `--target sim:NAME`, for V100, T4, A10,
//!   A100-80GB, L4, H100-SXM, H200 and RTX 4090. [`SimMeasurer`] implements the search's
//!   `Measurer`; its fingerprint kind is `sim`, so its numbers are never taken for
//!   measurements.
//! - [`cuda`] (feature `cuda`): real measurement. Kernels are compiled to PTX (NVRTC, or nvcc)
//!   and run by a worker process through the CUDA driver, loaded at run time (cudarc), checked
//!   against the CPU reference and timed with CUDA events. The default build needs no CUDA.
//!
//! ```
//! use tessel_search::{InstructionSet, Sketch, Space};
//!
//! let op = "gemm:m=1024,n=1024,k=1024,dtype=f16".parse::<tessel_ir::Workload>().unwrap().to_op();
//! let space = Space::new(&op, &InstructionSet::Gpu { cc: (8, 0) });
//! let sketch = Sketch::TensorCore { mapping: 0, wm: 2, wn: 2, fm: 4, fn_: 4, kc: 2, stages: 3, split: 1 };
//! let (_, program) = space.lower(&sketch).unwrap();
//! let kernel = tessel_gpu::generate(&program, "gemm").unwrap();
//! assert!(kernel.source.contains("wmma::mma_sync"));
//! let a100 = tessel_gpu::device("a100").unwrap();
//! let estimate = tessel_gpu::estimate(&program, &a100).unwrap();
//! assert!(estimate.latency_s > 0.0);
//! ```

pub mod codegen;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod emulate;
mod error;
pub mod nvcc;
pub mod sim;

pub use codegen::{Kernel, generate};
pub use device::{DeviceSpec, device, devices};
pub use error::GpuError;
pub use sim::{Estimate, SimMeasurer, estimate};
