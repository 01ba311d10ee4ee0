//! Errors of the CPU backend.

use std::path::PathBuf;

/// Why a program has no C code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodegenError {
    #[error("cannot generate CPU code: {reason}")]
    Unsupported { reason: String },
    #[error("malformed program: {reason}")]
    Malformed { reason: String },
}

/// Why a module did not build.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("cannot run the C compiler `{cc}`: {source}")]
    Spawn {
        cc: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the C compiler rejected {path}:\n{stderr}")]
    Rejected { path: PathBuf, stderr: String },
    #[error("the C compiler took more than {seconds} s on {path}; killed")]
    Timeout { path: PathBuf, seconds: f64 },
    #[error("TESSEL_MARCH=`{value}` is not a -march value (letters, digits, `-`, `_`, `.`)")]
    BadMarch { value: String },
    #[error("cache directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub use tessel_measure::worker::WorkerError;

/// Why the CPU measurer could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error(transparent)]
    Compile(#[from] CompileError),
}
