//! Typed errors of tessel-ir. Each names the bad part of the input.

use thiserror::Error;

/// A workload spec string that cannot be parsed, or that describes an impossible operator.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SpecError {
    #[error("empty workload spec")]
    Empty,
    #[error("unknown operator kind `{kind}` (expected one of: {expected})")]
    UnknownKind { kind: String, expected: String },
    #[error("`{item}` in workload spec is not of the form key=value")]
    NotKeyValue { item: String },
    #[error("unknown key `{key}` for `{kind}` (allowed: {allowed})")]
    UnknownKey {
        kind: String,
        key: String,
        allowed: String,
    },
    #[error("key `{key}` given twice")]
    DuplicateKey { key: String },
    #[error("missing key `{key}` for `{kind}`")]
    MissingKey { kind: String, key: String },
    #[error("key `{key}` must be a positive extent, got 0")]
    ZeroExtent { key: String },
    #[error("key `{key}` has invalid value `{value}`: {reason}")]
    BadValue {
        key: String,
        value: String,
        reason: String,
    },
    #[error("unknown dtype `{value}` (expected bf16, f16, f32, i8, u8 or i32)")]
    UnknownDType { value: String },
    #[error("{what} is too large: {size} (the limit is {limit})")]
    TooLarge {
        what: String,
        size: String,
        limit: String,
    },
}

/// A [`ComputeOp`](crate::ComputeOp) whose parts do not fit together.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum OpError {
    #[error("operator `{op}`: {reason}")]
    Invalid { op: String, reason: String },
}

/// A schedule trace step that cannot be applied, or a final schedule that cannot be lowered.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ScheduleError {
    #[error("trace step {index} ({step}): {reason}")]
    Step {
        index: usize,
        step: String,
        reason: String,
    },
    #[error("schedule cannot be lowered: {reason}")]
    Lower { reason: String },
    #[error(transparent)]
    Op(#[from] OpError),
}

/// Failure to execute a program or an operator on data.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ExecError {
    #[error("expected {expected} input tensors, got {got}")]
    InputCount { expected: usize, got: usize },
    #[error("input `{name}`: expected shape {expected:?} of {dtype}, got {got:?} of {got_dtype}")]
    InputShape {
        name: String,
        expected: Vec<u64>,
        dtype: crate::DType,
        got: Vec<u64>,
        got_dtype: crate::DType,
    },
    #[error("buffer `{buffer}`: write outside its bounds at index {index:?}")]
    OutOfBounds { buffer: String, index: Vec<i64> },
    #[error("program is malformed: {reason}")]
    Malformed { reason: String },
}

/// Errors of trace (de)serialisation.
#[derive(Debug, Error)]
pub enum TraceIoError {
    #[error("trace JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("trace bincode encode: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    #[error("trace bincode decode: {0}")]
    Decode(#[from] bincode::error::DecodeError),
}

/// An unknown network name.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NetworkError {
    #[error("unknown network `{name}` (known: {known})")]
    Unknown { name: String, known: String },
    #[error("batch size must be at least 1")]
    ZeroBatch,
    #[error("batch size {batch} is too large (the limit is {limit})")]
    BatchTooLarge { batch: u64, limit: u64 },
    #[error("network `{name}`: input size `{size}` must be a multiple of 32 from 64 to 1024")]
    ImageSize { name: String, size: String },
    #[error(
        "network `{name}`: sequence length `{length}` must be a multiple of 16 from 16 to 1024"
    )]
    SequenceLength { name: String, length: String },
    #[error("layer `{layer}` of {network}: {source}")]
    Layer {
        network: String,
        layer: String,
        #[source]
        source: Box<SpecError>,
    },
}
