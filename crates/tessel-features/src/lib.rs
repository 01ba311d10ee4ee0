//! Allocation features: how a candidate program allocates computation onto the tensorized
//! instruction and data onto the memory hierarchy, as a sequence of fixed-width tokens for
//! tessel's performance model.
//!
//! A program becomes one *compute token* per statement (tensorized call site, vector or scalar
//! compute, packing copy, epilogue store), one *data token* per buffer and memory level
//! (main memory, L2, L1, GPU shared memory, registers) and one *hardware token*. Every column
//! has a name, a unit and a meaning in a versioned [schema](schema::COLUMNS); magnitudes are
//! `log2(1 + x)`.
//!
//! ```
//! use std::collections::BTreeMap;
//! use tessel_features::{Target, extract, schema::Col};
//! use tessel_ir::{Trace, Workload};
//!
//! let op = "gemm:m=64,n=64,k=64,dtype=f32".parse::<Workload>().unwrap().to_op();
//! let mut trace = Trace::new();
//! trace.split("m", &[8]).split("n", &[8]).reorder(&["m.0", "n.0", "k", "m.1", "n.1"]);
//! trace.vectorize("n.1");
//! let program = trace.apply(&op, &()).unwrap().lower().unwrap();
//! let target = Target::cpu("avx2", &["avx2".into(), "fma".into()], 1, &BTreeMap::new(), None);
//! let features = extract(&program, &target).unwrap();
//! assert_eq!(features.width(), tessel_features::WIDTH);
//! // The first compute token is the vectorized update.
//! let update = features.compute_tokens().find(|t| t[Col::ComputeVector as usize] == 1.0);
//! assert!(update.is_some());
//! ```

mod extract;
pub mod primitives;
pub mod roofline;
pub mod schema;
mod target;

use rayon::prelude::*;
use serde::Serialize;
use tessel_ir::Program;

pub use primitives::{PRIMITIVE_WIDTH, primitive_tokens};
pub use schema::{COLUMNS, Col, Column, SCHEMA_VERSION, WIDTH};
pub use target::Target;

/// Why a program has no features.
#[derive(Debug, thiserror::Error)]
pub enum FeatureError {
    #[error("malformed program: {0}")]
    Malformed(String),
    #[error("target: {0}")]
    Target(String),
}

/// What a token describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenKind {
    Compute,
    Data,
    Hardware,
}

/// A level of the memory hierarchy, as data tokens name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryLevel {
    /// CPU DRAM or GPU global memory.
    Memory,
    L2,
    L1,
    /// GPU shared memory.
    Shared,
    /// AMX tiles, vector registers, GPU fragments.
    Register,
}

/// Where a token comes from in the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The `n`-th statement (depth first) that computes or moves data.
    Statement(usize),
    /// Buffer `buffer` (an index into `Program::buffers`) at `level`.
    Buffer {
        buffer: usize,
        level: MemoryLevel,
    },
    Hardware,
}

impl Source {
    pub fn kind(&self) -> TokenKind {
        match self {
            Source::Statement(_) => TokenKind::Compute,
            Source::Buffer { .. } => TokenKind::Data,
            Source::Hardware => TokenKind::Hardware,
        }
    }
}

/// The tokens of one program, row-major: `tokens.len() == sources.len() * WIDTH`. Compute tokens
/// come first in program order, then data tokens by buffer and level, then the hardware token.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Features {
    pub tokens: Vec<f32>,
    pub sources: Vec<Source>,
}

impl Features {
    pub fn width(&self) -> usize {
        WIDTH
    }

    pub fn len(&self) -> usize {
        self.sources.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    pub fn kind(&self, i: usize) -> TokenKind {
        self.sources[i].kind()
    }

    /// The data token of `buffer` at `level`, if the program moves it there.
    pub fn data(&self, buffer: usize, level: MemoryLevel) -> Option<&[f32]> {
        let i = self
            .sources
            .iter()
            .position(|s| *s == Source::Buffer { buffer, level })?;
        Some(self.token(i))
    }

    /// The value of column `col` in token `i`.
    pub fn get(&self, i: usize, col: Col) -> f32 {
        self.token(i)[col as usize]
    }

    pub fn token(&self, i: usize) -> &[f32] {
        &self.tokens[i * WIDTH..(i + 1) * WIDTH]
    }

    pub fn iter(&self) -> impl Iterator<Item = &[f32]> {
        self.tokens.chunks_exact(WIDTH)
    }

    pub fn compute_tokens(&self) -> impl Iterator<Item = &[f32]> {
        self.of_kind(TokenKind::Compute)
    }

    pub fn data_tokens(&self) -> impl Iterator<Item = &[f32]> {
        self.of_kind(TokenKind::Data)
    }

    fn of_kind(&self, kind: TokenKind) -> impl Iterator<Item = &[f32]> {
        self.iter()
            .zip(&self.sources)
            .filter(move |(_, s)| s.kind() == kind)
            .map(|(t, _)| t)
    }

    /// The non-zero columns of token `i` by name, for people.
    pub fn named(&self, i: usize) -> Vec<(&'static str, f32)> {
        self.token(i)
            .iter()
            .zip(COLUMNS)
            .filter(|(v, _)| **v != 0.0)
            .map(|(v, c)| (c.name, *v))
            .collect()
    }
}

/// The features of one program on one target.
pub fn extract(program: &Program, target: &Target) -> Result<Features, FeatureError> {
    extract::extract(program, target)
}

/// The features of many programs, in parallel over rayon's pool, in order.
pub fn extract_batch(
    programs: &[&Program],
    target: &Target,
) -> Vec<Result<Features, FeatureError>> {
    programs.par_iter().map(|p| extract(p, target)).collect()
}
