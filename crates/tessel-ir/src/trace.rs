//! Schedules as replayable traces of primitives, in the manner of TVM's MetaSchedule traces.
//!
//! A [`Trace`] is plain data (serde: JSON and bincode 2). [`Trace::apply`] replays it on a
//! [`ComputeOp`](crate::ComputeOp), validating every step, and [`Schedule::lower`](crate::Schedule::lower)
//! turns the result into a loop-nest [`Program`](crate::Program).
//!
//! ```
//! use tessel_ir::{Trace, Workload, Scope};
//! let op = "gemm:m=64,n=64,k=64,dtype=bf16".parse::<Workload>().unwrap().to_op();
//! let mut t = Trace::new();
//! t.split("m", &[16]).split("n", &[16]).reorder(&["m.0", "n.0", "k", "m.1", "n.1"]);
//! t.parallel("m.0").cache_write(Scope::new("local").unwrap(), Some("n.0"));
//! let program = t.apply(&op, &()).unwrap().lower().unwrap();
//! assert!(program.to_string().contains("parallel for m.0 in 0..4"));
//! ```

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::TraceIoError;
use crate::op::ComputeOp;

/// A named memory scope: `global`, `shared`, `local`, `l1`, `l2`, `amx.tile`, `wmma.matrix_a`...
/// The IR gives scopes no meaning beyond where a buffer is allocated; backends interpret them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Scope(String);

impl Scope {
    /// A scope name: lower-case letters, digits, `.` and `_`, starting with a letter.
    pub fn new(name: &str) -> Result<Self, String> {
        let ok = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '_');
        if ok {
            Ok(Scope(name.to_string()))
        } else {
            Err(format!("invalid memory scope name `{name}`"))
        }
    }

    pub fn global() -> Self {
        Scope("global".into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Scope {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Scope::new(&s)
    }
}

impl From<Scope> for String {
    fn from(s: Scope) -> String {
        s.0
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A GPU execution axis a loop can be bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GpuAxis {
    #[serde(rename = "blockIdx.x")]
    BlockX,
    #[serde(rename = "blockIdx.y")]
    BlockY,
    #[serde(rename = "blockIdx.z")]
    BlockZ,
    /// Warps within a block (threadIdx.y in units of 32 lanes, by convention of the backends).
    #[serde(rename = "warp")]
    Warp,
    #[serde(rename = "threadIdx.x")]
    ThreadX,
    #[serde(rename = "threadIdx.y")]
    ThreadY,
    #[serde(rename = "threadIdx.z")]
    ThreadZ,
}

impl fmt::Display for GpuAxis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GpuAxis::BlockX => "blockIdx.x",
            GpuAxis::BlockY => "blockIdx.y",
            GpuAxis::BlockZ => "blockIdx.z",
            GpuAxis::Warp => "warp",
            GpuAxis::ThreadX => "threadIdx.x",
            GpuAxis::ThreadY => "threadIdx.y",
            GpuAxis::ThreadZ => "threadIdx.z",
        })
    }
}

/// A layout transform of an operand: split some dimensions, then permute.
///
/// Splitting dimension `d` by `f` replaces it, in place, by `(d / f, d % f)`; `order` then lists
/// the resulting dimensions in storage order. VNNI pairs for `B[k, n]` are
/// `splits: [(0, 2)], order: [0, 2, 1]`, i.e. `B'[k/2, n, k%2]`. Split dimensions are padded.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LayoutTransform {
    pub splits: Vec<(usize, u64)>,
    pub order: Vec<usize>,
}

impl LayoutTransform {
    /// Checks against a tensor shape and returns the packed shape.
    pub fn packed_shape(&self, shape: &[u64]) -> Result<Vec<u64>, String> {
        let mut expanded = Vec::new();
        for (d, &n) in shape.iter().enumerate() {
            let splits: Vec<u64> = self
                .splits
                .iter()
                .filter(|(sd, _)| *sd == d)
                .map(|&(_, f)| f)
                .collect();
            match splits.as_slice() {
                [] => expanded.push(n),
                [f] if *f >= 1 => {
                    expanded.push(n.div_ceil(*f));
                    expanded.push(*f);
                }
                [_] => return Err(format!("split factor of dimension {d} must be at least 1")),
                _ => return Err(format!("dimension {d} is split more than once")),
            }
        }
        if let Some(&(d, _)) = self.splits.iter().find(|(d, _)| *d >= shape.len()) {
            return Err(format!(
                "split of dimension {d}, but the tensor has rank {}",
                shape.len()
            ));
        }
        let mut seen = vec![false; expanded.len()];
        if self.order.len() != expanded.len() {
            return Err(format!(
                "order lists {} dimensions, the split tensor has {}",
                self.order.len(),
                expanded.len()
            ));
        }
        for &o in &self.order {
            if o >= expanded.len() || std::mem::replace(&mut seen[o], true) {
                return Err(format!("order {:?} is not a permutation", self.order));
            }
        }
        Ok(self.order.iter().map(|&o| expanded[o]).collect())
    }
}

/// One schedule primitive. Loops are named: an operator's loops carry its iteration variables'
/// names; `split` of `x` into p parts makes `x.0` (outermost) .. `x.{p-1}`; `fuse` joins names
/// with `_`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// Splits a loop into `factors.len() + 1` loops: the inner extents are `factors` (innermost
    /// last), the outer extent is `ceil(extent / product)`. Non-dividing factors pad, with guards.
    Split {
        target: String,
        factors: Vec<u64>,
    },
    /// Puts the named loops in this order, in the positions they occupy.
    Reorder {
        order: Vec<String>,
    },
    /// Fuses adjacent loops of the same kind, outermost first, into one.
    Fuse {
        loops: Vec<String>,
    },
    Parallel {
        target: String,
    },
    Vectorize {
        target: String,
    },
    Unroll {
        target: String,
    },
    Bind {
        target: String,
        axis: GpuAxis,
    },
    /// Copies what the loops inside `at` (the whole nest when `None`) read of input `operand`
    /// into a buffer in `scope`, allocated inside `at`. Repeated for an operand, each cache
    /// reads the previous one (memory -> L2 -> L1 -> registers).
    CacheRead {
        operand: usize,
        scope: Scope,
        at: Option<String>,
    },
    /// Accumulates into a buffer in `scope` allocated inside `at`, initialised there and written
    /// back (through the epilogue) after the loops inside `at`; all reduction loops must be
    /// inside `at`.
    CacheWrite {
        scope: Scope,
        at: Option<String>,
    },
    /// Stores input `operand` in another layout before the computation.
    Pack {
        operand: usize,
        layout: LayoutTransform,
    },
    /// Copies input `operand` once at the root into a buffer spanning every index its reads
    /// take, zeros where they leave the tensor (a padded convolution's border): reads of the
    /// copy never leave it, so an instruction can load a tile of it in place where the
    /// tensor's own border would mix zeros into the tile. Not with a pack of the same input.
    Pad {
        operand: usize,
    },
    /// Converts input `operand` to `dtype` while it is copied once at the root (with its pack,
    /// if any): convert-on-pack, for an instruction whose operands are a wider type. Only
    /// exact widenings ([`crate::DType::widens_exactly_to`]); before any cache of the input.
    Cast {
        operand: usize,
        dtype: crate::DType,
    },
    /// Replaces the innermost loops by one call of a tensorized instruction. `bindings` maps each
    /// of the instruction's iteration variables to a loop; `operands[i]` is the operator input
    /// that feeds the instruction's input `i`.
    Tensorize {
        intrinsic: String,
        bindings: Vec<(String, String)>,
        operands: Vec<usize>,
    },
    /// Software-pipelines the loads inside a loop over `stages` buffers.
    Pipeline {
        target: String,
        stages: u32,
    },
    Annotate {
        target: String,
        key: String,
        value: String,
    },
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = |a: &Option<String>| a.clone().unwrap_or_else(|| "root".into());
        match self {
            Step::Split { target, factors } => write!(f, "split({target}, {factors:?})"),
            Step::Reorder { order } => write!(f, "reorder({})", order.join(", ")),
            Step::Fuse { loops } => write!(f, "fuse({})", loops.join(", ")),
            Step::Parallel { target } => write!(f, "parallel({target})"),
            Step::Vectorize { target } => write!(f, "vectorize({target})"),
            Step::Unroll { target } => write!(f, "unroll({target})"),
            Step::Bind { target, axis } => write!(f, "bind({target}, {axis})"),
            Step::CacheRead {
                operand,
                scope,
                at: a,
            } => {
                write!(f, "cache_read(input {operand}, {scope}, at {})", at(a))
            }
            Step::CacheWrite { scope, at: a } => write!(f, "cache_write({scope}, at {})", at(a)),
            Step::Pack { operand, layout } => write!(
                f,
                "pack(input {operand}, splits {:?}, order {:?})",
                layout.splits, layout.order
            ),
            Step::Pad { operand } => write!(f, "pad(input {operand})"),
            Step::Cast { operand, dtype } => write!(f, "cast(input {operand}, {dtype})"),
            Step::Tensorize {
                intrinsic,
                bindings,
                operands,
            } => {
                let b: Vec<String> = bindings.iter().map(|(i, l)| format!("{i}={l}")).collect();
                write!(
                    f,
                    "tensorize({intrinsic}, {}, operands {operands:?})",
                    b.join(" ")
                )
            }
            Step::Pipeline { target, stages } => write!(f, "pipeline({target}, {stages})"),
            Step::Annotate { target, key, value } => {
                write!(f, "annotate({target}, {key}={value})")
            }
        }
    }
}

/// Looks up the compute abstraction of a tensorized instruction by its id. tessel-intrin's
/// catalog implements this; `()` knows none, a map knows its entries.
pub trait IntrinsicResolver {
    fn resolve(&self, id: &str) -> Option<ComputeOp>;

    /// Whether instruction variable `var` of `id` may be bound to a loop shorter than its
    /// extent: the instruction then runs on a partial tile (an AMX tile configured with fewer
    /// rows). None may by default.
    fn accepts_fewer(&self, _id: &str, _var: &str) -> bool {
        false
    }
}

impl IntrinsicResolver for () {
    fn resolve(&self, _id: &str) -> Option<ComputeOp> {
        None
    }
}

impl IntrinsicResolver for BTreeMap<String, ComputeOp> {
    fn resolve(&self, id: &str) -> Option<ComputeOp> {
        self.get(id).cloned()
    }
}

/// A schedule: the list of primitives applied, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Trace {
    pub steps: Vec<Step>,
}

impl Trace {
    pub fn new() -> Self {
        Trace::default()
    }

    pub fn push(&mut self, step: Step) -> &mut Self {
        self.steps.push(step);
        self
    }

    pub fn split(&mut self, target: &str, factors: &[u64]) -> &mut Self {
        self.push(Step::Split {
            target: target.into(),
            factors: factors.to_vec(),
        })
    }

    pub fn reorder(&mut self, order: &[&str]) -> &mut Self {
        self.push(Step::Reorder {
            order: order.iter().map(|s| s.to_string()).collect(),
        })
    }

    pub fn fuse(&mut self, loops: &[&str]) -> &mut Self {
        self.push(Step::Fuse {
            loops: loops.iter().map(|s| s.to_string()).collect(),
        })
    }

    pub fn parallel(&mut self, target: &str) -> &mut Self {
        self.push(Step::Parallel {
            target: target.into(),
        })
    }

    pub fn vectorize(&mut self, target: &str) -> &mut Self {
        self.push(Step::Vectorize {
            target: target.into(),
        })
    }

    pub fn unroll(&mut self, target: &str) -> &mut Self {
        self.push(Step::Unroll {
            target: target.into(),
        })
    }

    pub fn bind(&mut self, target: &str, axis: GpuAxis) -> &mut Self {
        self.push(Step::Bind {
            target: target.into(),
            axis,
        })
    }

    pub fn cache_read(&mut self, operand: usize, scope: Scope, at: Option<&str>) -> &mut Self {
        self.push(Step::CacheRead {
            operand,
            scope,
            at: at.map(str::to_string),
        })
    }

    pub fn cache_write(&mut self, scope: Scope, at: Option<&str>) -> &mut Self {
        self.push(Step::CacheWrite {
            scope,
            at: at.map(str::to_string),
        })
    }

    pub fn pack(&mut self, operand: usize, layout: LayoutTransform) -> &mut Self {
        self.push(Step::Pack { operand, layout })
    }

    /// Copies input `operand` once, padded, at the root ([`Step::Pad`]).
    pub fn pad(&mut self, operand: usize) -> &mut Self {
        self.push(Step::Pad { operand })
    }

    /// Converts input `operand` to `dtype` on its way to the computation ([`Step::Cast`]).
    pub fn cast(&mut self, operand: usize, dtype: crate::DType) -> &mut Self {
        self.push(Step::Cast { operand, dtype })
    }

    pub fn tensorize(
        &mut self,
        intrinsic: &str,
        bindings: &[(&str, &str)],
        operands: &[usize],
    ) -> &mut Self {
        self.push(Step::Tensorize {
            intrinsic: intrinsic.into(),
            bindings: bindings
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            operands: operands.to_vec(),
        })
    }

    pub fn pipeline(&mut self, target: &str, stages: u32) -> &mut Self {
        self.push(Step::Pipeline {
            target: target.into(),
            stages,
        })
    }

    pub fn annotate(&mut self, target: &str, key: &str, value: &str) -> &mut Self {
        self.push(Step::Annotate {
            target: target.into(),
            key: key.into(),
            value: value.into(),
        })
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Indented JSON, for files people read.
    pub fn to_json_pretty(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    pub fn from_json(s: &str) -> Result<Self, TraceIoError> {
        Ok(serde_json::from_str(s)?)
    }

    /// bincode 2 (standard configuration) through serde.
    pub fn to_bincode(&self) -> Result<Vec<u8>, TraceIoError> {
        Ok(bincode::serde::encode_to_vec(
            self,
            bincode::config::standard(),
        )?)
    }

    pub fn from_bincode(bytes: &[u8]) -> Result<Self, TraceIoError> {
        // A length prefix in the bytes must not make the decoder allocate without bound: a
        // trace is small, so 16 MiB is far above any real one.
        let config = bincode::config::standard().with_limit::<{ 16 << 20 }>();
        let (t, _) = bincode::serde::decode_from_slice(bytes, config)?;
        Ok(t)
    }
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.steps.iter().enumerate() {
            writeln!(f, "{i:3}: {s}")?;
        }
        Ok(())
    }
}
