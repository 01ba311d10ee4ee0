use thiserror::Error;

/// What the GPU backend can fail with.
#[derive(Debug, Error)]
pub enum GpuError {
    /// The program cannot be expressed as one CUDA kernel by this generator.
    #[error("cannot generate CUDA for this program: {reason}")]
    Codegen { reason: String },
    /// No such device in the analytical model's table.
    #[error("unknown GPU `{name}`; known: {known}")]
    UnknownDevice { name: String, known: String },
    /// The kernel does not fit on the device (threads, registers, shared memory).
    #[error("does not fit on {device}: {reason}")]
    DoesNotFit { device: String, reason: String },
    /// No GPU to measure on: no driver, no device, or the worker could not open it.
    #[error("no GPU to measure on: {0}")]
    NoDevice(String),
    /// nvcc or ptxas is missing or failed.
    #[error("{0}")]
    Toolchain(String),
}
