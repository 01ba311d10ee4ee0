//! Workloads: the operators of real DNNs, their builders, and spec strings that round-trip.
//!
//! ```
//! use tessel_ir::Workload;
//! let w: Workload = "gemm:m=1024,n=1024,k=1024,dtype=bf16".parse().unwrap();
//! assert_eq!(w.to_string(), "gemm:m=1024,n=1024,k=1024,dtype=bf16");
//! assert_eq!(w.to_op().flops(), 2 * 1024 * 1024 * 1024);
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::SpecError;
use crate::op::{AffineExpr, ComputeOp, Epilogue, IterVar, Operand, TensorDecl};

/// What happens to each output value after accumulation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EpilogueSpec {
    pub bias: bool,
    pub relu: bool,
    /// Output dtype when it differs from the accumulator's (e.g. bf16 out of an f32 accumulator).
    pub out: Option<DType>,
}

/// Element types: `dtype` for the first operand (activations), `wdtype` for the second (weights).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Types {
    pub dtype: DType,
    pub wdtype: DType,
}

impl Types {
    pub fn same(dtype: DType) -> Self {
        Types {
            dtype,
            wdtype: dtype,
        }
    }

    pub fn accumulator(&self) -> DType {
        if self.dtype.is_float() && self.wdtype.is_float() {
            DType::F32
        } else {
            DType::I32
        }
    }
}

/// Data layout of a 2-D convolution: activations NHWC with KRSC weights, or NCHW with KCRS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConvLayout {
    Nhwc,
    Nchw,
}

impl fmt::Display for ConvLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConvLayout::Nhwc => "nhwc",
            ConvLayout::Nchw => "nchw",
        })
    }
}

/// A 2-D convolution. With `groups` > 1 the `c` input and `k` output channels split into that
/// many independent groups (ResNeXt); `groups == c` is a depthwise convolution (MobileNet).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Conv2d {
    pub n: u64,
    pub h: u64,
    pub w: u64,
    pub c: u64,
    pub k: u64,
    pub r: u64,
    pub s: u64,
    pub stride: u64,
    pub pad: u64,
    pub dilation: u64,
    /// Channel groups (1: an ordinary convolution); divides `c` and `k`.
    #[serde(default = "one")]
    pub groups: u64,
    pub layout: ConvLayout,
}

fn one() -> u64 {
    1
}

impl Conv2d {
    /// Output height and width; `None` when the (dilated) kernel does not fit the padded input.
    pub fn output_hw(&self) -> Option<(u64, u64)> {
        let out = |x: u64, k: u64| {
            let span = self
                .dilation
                .checked_mul(k.checked_sub(1)?)?
                .checked_add(1)?;
            x.checked_add(self.pad.checked_mul(2)?)?
                .checked_sub(span)
                .and_then(|d| d.checked_div(self.stride))
                .map(|d| d + 1)
        };
        Some((out(self.h, self.r)?, out(self.w, self.s)?))
    }
}

/// The largest extent (or conv stride, pad, dilation) a workload may have.
pub const MAX_EXTENT: u64 = 1 << 31;
/// The largest tensor a workload may have (1 GiB: ResNet-50's largest activation at batch
/// 256 in f32 is 0.8 GiB). Generated CPU kernels keep packed copies in static storage, which
/// the x86-64 small code model limits to 2 GiB in all; a schedule that packs more than that
/// fails to link and is recorded as a compile error, like any other failed candidate.
pub const MAX_TENSOR_BYTES: u64 = 1 << 30;
/// The most multiply-accumulates an operator may have (2^50: days on any machine; FLOP
/// counts and their sums over a network stay far from overflowing).
pub const MAX_MACS: u64 = 1 << 50;

/// One tensor operator of a DNN, at concrete sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// `C[m,n] = A[m,k] * B[k,n]`.
    Gemm {
        m: u64,
        n: u64,
        k: u64,
        types: Types,
        epilogue: EpilogueSpec,
    },
    /// A fully connected layer: `C[m,n] = A[m,k] * W[n,k]` (weights stored output-major).
    Dense {
        m: u64,
        n: u64,
        k: u64,
        types: Types,
        epilogue: EpilogueSpec,
    },
    /// `C[b,m,n] = A[b,m,k] * B[b,k,n]`.
    Bmm {
        b: u64,
        m: u64,
        n: u64,
        k: u64,
        types: Types,
        epilogue: EpilogueSpec,
    },
    Conv2d {
        conv: Conv2d,
        types: Types,
        epilogue: EpilogueSpec,
    },
}

const KINDS: &str = "gemm, dense, bmm, conv2d";

impl Workload {
    pub fn gemm(m: u64, n: u64, k: u64, dtype: DType) -> Self {
        Workload::Gemm {
            m,
            n,
            k,
            types: Types::same(dtype),
            epilogue: EpilogueSpec::default(),
        }
    }

    pub fn dense(m: u64, n: u64, k: u64, dtype: DType) -> Self {
        Workload::Dense {
            m,
            n,
            k,
            types: Types::same(dtype),
            epilogue: EpilogueSpec::default(),
        }
    }

    pub fn bmm(b: u64, m: u64, n: u64, k: u64, dtype: DType) -> Self {
        Workload::Bmm {
            b,
            m,
            n,
            k,
            types: Types::same(dtype),
            epilogue: EpilogueSpec::default(),
        }
    }

    /// A convolution; fails when the kernel does not fit the padded input.
    pub fn conv2d(conv: Conv2d, dtype: DType) -> Result<Self, SpecError> {
        let w = Workload::Conv2d {
            conv,
            types: Types::same(dtype),
            epilogue: EpilogueSpec::default(),
        };
        w.validate()?;
        Ok(w)
    }

    /// A 1x1 convolution, stride 1, no padding (MobileNet's and ResNet's pointwise layers).
    pub fn pointwise_conv2d(n: u64, h: u64, w: u64, c: u64, k: u64, dtype: DType) -> Self {
        Workload::Conv2d {
            conv: Conv2d {
                n,
                h,
                w,
                c,
                k,
                r: 1,
                s: 1,
                stride: 1,
                pad: 0,
                dilation: 1,
                groups: 1,
                layout: ConvLayout::Nhwc,
            },
            types: Types::same(dtype),
            epilogue: EpilogueSpec::default(),
        }
    }

    /// The same workload with another epilogue. An `out` equal to the accumulator type is
    /// the default and is stored as `None`, so each workload has one representation.
    pub fn with_epilogue(mut self, mut e: EpilogueSpec) -> Self {
        if e.out == Some(self.types().accumulator()) {
            e.out = None;
        }
        match &mut self {
            Workload::Gemm { epilogue, .. }
            | Workload::Dense { epilogue, .. }
            | Workload::Bmm { epilogue, .. }
            | Workload::Conv2d { epilogue, .. } => *epilogue = e,
        }
        self
    }

    /// The same workload with other element types (the epilogue keeps its meaning).
    pub fn with_types(mut self, t: Types) -> Self {
        let e = self.epilogue();
        match &mut self {
            Workload::Gemm { types, .. }
            | Workload::Dense { types, .. }
            | Workload::Bmm { types, .. }
            | Workload::Conv2d { types, .. } => *types = t,
        }
        self.with_epilogue(e)
    }

    /// The input that holds weights (constant across calls, so worth packing once): the
    /// second operand of a GEMM, a dense layer or a convolution; none for a batched matmul,
    /// whose operands are both activations.
    pub fn weight_input(&self) -> Option<usize> {
        match self {
            Workload::Gemm { .. } | Workload::Dense { .. } | Workload::Conv2d { .. } => Some(1),
            Workload::Bmm { .. } => None,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Workload::Gemm { .. } => "gemm",
            Workload::Dense { .. } => "dense",
            Workload::Bmm { .. } => "bmm",
            Workload::Conv2d { .. } => "conv2d",
        }
    }

    pub fn types(&self) -> Types {
        match self {
            Workload::Gemm { types, .. }
            | Workload::Dense { types, .. }
            | Workload::Bmm { types, .. }
            | Workload::Conv2d { types, .. } => *types,
        }
    }

    pub fn epilogue(&self) -> EpilogueSpec {
        match self {
            Workload::Gemm { epilogue, .. }
            | Workload::Dense { epilogue, .. }
            | Workload::Bmm { epilogue, .. }
            | Workload::Conv2d { epilogue, .. } => *epilogue,
        }
    }

    /// Checks that the operator is possible and within tessel's limits: every extent and
    /// conv parameter at most [`MAX_EXTENT`], every tensor at most [`MAX_TENSOR_BYTES`], at
    /// most [`MAX_MACS`] multiply-accumulates. Parsing a spec checks this; workloads built in
    /// code should be checked before use.
    pub fn validate(&self) -> Result<(), SpecError> {
        let too_large =
            |what: String, size: String, limit: String| SpecError::TooLarge { what, size, limit };
        for (key, v) in self.parameters() {
            if v > MAX_EXTENT {
                return Err(too_large(
                    format!("`{key}`"),
                    v.to_string(),
                    MAX_EXTENT.to_string(),
                ));
            }
        }
        self.check()?;
        let op = self.to_op();
        let tensors = op
            .read_operands()
            .into_iter()
            .chain([&op.output])
            .map(|o| &o.tensor);
        for t in tensors {
            let bytes = t
                .shape
                .iter()
                .try_fold(t.dtype.bytes() as u64, |a, &d| a.checked_mul(d));
            if bytes.is_none_or(|b| b > MAX_TENSOR_BYTES) {
                let shape: Vec<String> = t.shape.iter().map(u64::to_string).collect();
                return Err(too_large(
                    format!("tensor `{}` [{}] {}", t.name, shape.join(", "), t.dtype),
                    bytes.map_or("more than 2^64 bytes".into(), |b| format!("{b} bytes")),
                    format!("{MAX_TENSOR_BYTES} bytes"),
                ));
            }
        }
        let macs = op
            .iter_vars
            .iter()
            .try_fold(1u64, |a, v| a.checked_mul(v.extent));
        if macs.is_none_or(|m| m > MAX_MACS) {
            return Err(too_large(
                "the operator".into(),
                macs.map_or("more than 2^64 multiply-accumulates".into(), |m| {
                    format!("{m} multiply-accumulates")
                }),
                format!("{MAX_MACS}"),
            ));
        }
        Ok(())
    }

    /// Every size-like parameter of the spec, by key.
    fn parameters(&self) -> Vec<(&'static str, u64)> {
        match *self {
            Workload::Gemm { m, n, k, .. } | Workload::Dense { m, n, k, .. } => {
                vec![("m", m), ("n", n), ("k", k)]
            }
            Workload::Bmm { b, m, n, k, .. } => vec![("b", b), ("m", m), ("n", n), ("k", k)],
            Workload::Conv2d { conv: c, .. } => vec![
                ("n", c.n),
                ("h", c.h),
                ("w", c.w),
                ("c", c.c),
                ("k", c.k),
                ("r", c.r),
                ("s", c.s),
                ("stride", c.stride),
                ("pad", c.pad),
                ("dilation", c.dilation),
                ("groups", c.groups),
            ],
        }
    }

    fn check(&self) -> Result<(), SpecError> {
        if let Workload::Conv2d { conv, .. } = self
            && (conv.groups == 0 || conv.c % conv.groups != 0 || conv.k % conv.groups != 0)
        {
            return Err(SpecError::BadValue {
                key: "groups".into(),
                value: conv.groups.to_string(),
                reason: format!("groups must divide both c ({}) and k ({})", conv.c, conv.k),
            });
        }
        if let Workload::Conv2d { conv, .. } = self
            && conv.output_hw().is_none()
        {
            return Err(SpecError::BadValue {
                key: "r".into(),
                value: conv.r.to_string(),
                reason: format!(
                    "a {}x{} kernel (dilation {}) does not fit a {}x{} input padded by {}",
                    conv.r, conv.s, conv.dilation, conv.h, conv.w, conv.pad
                ),
            });
        }
        Ok(())
    }

    /// Multiply-accumulates of the operator.
    pub fn macs(&self) -> u64 {
        self.to_op().macs()
    }

    pub fn flops(&self) -> u64 {
        2 * self.macs()
    }

    /// The operator as a [`ComputeOp`].
    pub fn to_op(&self) -> ComputeOp {
        let types = self.types();
        let acc = types.accumulator();
        let v = AffineExpr::var;
        let operand =
            |name: &str, shape: Vec<u64>, dtype, layout: &str, idx: Vec<AffineExpr>| Operand {
                tensor: TensorDecl::new(name, shape, dtype, layout),
                indices: idx,
            };
        let (vars, inputs, out_shape, out_layout, bias_var) = match *self {
            Workload::Gemm { m, n, k, .. } => (
                vec![
                    IterVar::spatial("m", m),
                    IterVar::spatial("n", n),
                    IterVar::reduction("k", k),
                ],
                vec![
                    operand("A", vec![m, k], types.dtype, "mk", vec![v(0), v(2)]),
                    operand("B", vec![k, n], types.wdtype, "kn", vec![v(2), v(1)]),
                ],
                vec![m, n],
                "mn",
                1,
            ),
            Workload::Dense { m, n, k, .. } => (
                vec![
                    IterVar::spatial("m", m),
                    IterVar::spatial("n", n),
                    IterVar::reduction("k", k),
                ],
                vec![
                    operand("A", vec![m, k], types.dtype, "mk", vec![v(0), v(2)]),
                    operand("W", vec![n, k], types.wdtype, "nk", vec![v(1), v(2)]),
                ],
                vec![m, n],
                "mn",
                1,
            ),
            Workload::Bmm { b, m, n, k, .. } => (
                vec![
                    IterVar::spatial("b", b),
                    IterVar::spatial("m", m),
                    IterVar::spatial("n", n),
                    IterVar::reduction("k", k),
                ],
                vec![
                    operand(
                        "A",
                        vec![b, m, k],
                        types.dtype,
                        "bmk",
                        vec![v(0), v(1), v(3)],
                    ),
                    operand(
                        "B",
                        vec![b, k, n],
                        types.wdtype,
                        "bkn",
                        vec![v(0), v(3), v(2)],
                    ),
                ],
                vec![b, m, n],
                "bmn",
                2,
            ),
            Workload::Conv2d { conv, .. } if conv.groups > 1 => {
                let (p, q) = conv.output_hw().unwrap_or((1, 1));
                let (g, cg, kg) = (conv.groups, conv.c / conv.groups, conv.k / conv.groups);
                let st = conv.stride as i64;
                let dl = conv.dilation as i64;
                let pad = -(conv.pad as i64);
                // Variables: n p q g k (spatial; k within its group), c r s (reduction). The
                // tensors are the usual ones seen with the channel dimension split into
                // (group, channel in group): the same memory, plain indices.
                let vars = vec![
                    IterVar::spatial("n", conv.n),
                    IterVar::spatial("p", p),
                    IterVar::spatial("q", q),
                    IterVar::spatial("g", g),
                    IterVar::spatial("k", kg),
                    IterVar::reduction("c", cg),
                    IterVar::reduction("r", conv.r),
                    IterVar::reduction("s", conv.s),
                ];
                let row = AffineExpr::new(&[(1, st), (6, dl)], pad);
                let col = AffineExpr::new(&[(2, st), (7, dl)], pad);
                let (x, w, out, layout) = match conv.layout {
                    ConvLayout::Nhwc => (
                        operand(
                            "I",
                            vec![conv.n, conv.h, conv.w, g, cg],
                            types.dtype,
                            "nhwgc",
                            vec![v(0), row, col, v(3), v(5)],
                        ),
                        operand(
                            "W",
                            vec![g, kg, conv.r, conv.s, cg],
                            types.wdtype,
                            "gkrsc",
                            vec![v(3), v(4), v(6), v(7), v(5)],
                        ),
                        vec![conv.n, p, q, g, kg],
                        "nhwgk",
                    ),
                    ConvLayout::Nchw => (
                        operand(
                            "I",
                            vec![conv.n, g, cg, conv.h, conv.w],
                            types.dtype,
                            "ngchw",
                            vec![v(0), v(3), v(5), row, col],
                        ),
                        operand(
                            "W",
                            vec![g, kg, cg, conv.r, conv.s],
                            types.wdtype,
                            "gkcrs",
                            vec![v(3), v(4), v(5), v(6), v(7)],
                        ),
                        vec![conv.n, g, kg, p, q],
                        "ngkhw",
                    ),
                };
                (vars, vec![x, w], out, layout, 4)
            }
            Workload::Conv2d { conv, .. } => {
                let (p, q) = conv.output_hw().unwrap_or((1, 1));
                let st = conv.stride as i64;
                let dl = conv.dilation as i64;
                let pad = -(conv.pad as i64);
                // Variables: n p q k (spatial), c r s (reduction).
                let vars = vec![
                    IterVar::spatial("n", conv.n),
                    IterVar::spatial("p", p),
                    IterVar::spatial("q", q),
                    IterVar::spatial("k", conv.k),
                    IterVar::reduction("c", conv.c),
                    IterVar::reduction("r", conv.r),
                    IterVar::reduction("s", conv.s),
                ];
                let row = AffineExpr::new(&[(1, st), (5, dl)], pad);
                let col = AffineExpr::new(&[(2, st), (6, dl)], pad);
                let (x, w, out, layout) = match conv.layout {
                    ConvLayout::Nhwc => (
                        operand(
                            "I",
                            vec![conv.n, conv.h, conv.w, conv.c],
                            types.dtype,
                            "nhwc",
                            vec![v(0), row, col, v(4)],
                        ),
                        operand(
                            "W",
                            vec![conv.k, conv.r, conv.s, conv.c],
                            types.wdtype,
                            "krsc",
                            vec![v(3), v(5), v(6), v(4)],
                        ),
                        vec![conv.n, p, q, conv.k],
                        "nhwc",
                    ),
                    ConvLayout::Nchw => (
                        operand(
                            "I",
                            vec![conv.n, conv.c, conv.h, conv.w],
                            types.dtype,
                            "nchw",
                            vec![v(0), v(4), row, col],
                        ),
                        operand(
                            "W",
                            vec![conv.k, conv.c, conv.r, conv.s],
                            types.wdtype,
                            "kcrs",
                            vec![v(3), v(4), v(5), v(6)],
                        ),
                        vec![conv.n, conv.k, p, q],
                        "nchw",
                    ),
                };
                (vars, vec![x, w], out, layout, 3)
            }
        };
        let out_idx: Vec<AffineExpr> = match (self, out_layout) {
            (Workload::Conv2d { .. }, "nhwgk") => vec![v(0), v(1), v(2), v(3), v(4)],
            (Workload::Conv2d { .. }, "ngkhw") => vec![v(0), v(3), v(4), v(1), v(2)],
            (Workload::Conv2d { .. }, "nchw") => vec![v(0), v(3), v(1), v(2)],
            (Workload::Conv2d { .. }, _) => vec![v(0), v(1), v(2), v(3)],
            (Workload::Bmm { .. }, _) => vec![v(0), v(1), v(2)],
            _ => vec![v(0), v(1)],
        };
        let e = self.epilogue();
        let mut epilogue = Vec::new();
        if e.bias {
            // A grouped convolution's per-channel bias, seen as (group, channel in group).
            let grouped = matches!(self, Workload::Conv2d { conv, .. } if conv.groups > 1);
            let (shape, layout, idx) = if grouped {
                (vec![vars[3].extent, vars[4].extent], "gk", vec![v(3), v(4)])
            } else {
                (vec![vars[bias_var].extent], "n", vec![v(bias_var)])
            };
            epilogue.push(Epilogue::Bias(operand("bias", shape, acc, layout, idx)));
        }
        if e.relu {
            epilogue.push(Epilogue::Relu);
        }
        let out_dtype = e.out.unwrap_or(acc);
        if out_dtype != acc {
            epilogue.push(Epilogue::Cast(out_dtype));
        }
        ComputeOp {
            name: self.kind().to_string(),
            iter_vars: vars,
            inputs,
            output: operand("C", out_shape, out_dtype, out_layout, out_idx),
            accumulator: acc,
            epilogue,
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.kind())?;
        match self {
            Workload::Gemm { m, n, k, .. } | Workload::Dense { m, n, k, .. } => {
                write!(f, "m={m},n={n},k={k}")?
            }
            Workload::Bmm { b, m, n, k, .. } => write!(f, "b={b},m={m},n={n},k={k}")?,
            Workload::Conv2d { conv: c, .. } => {
                write!(
                    f,
                    "n={},h={},w={},c={},k={},r={},s={},stride={},pad={}",
                    c.n, c.h, c.w, c.c, c.k, c.r, c.s, c.stride, c.pad
                )?;
                if c.dilation != 1 {
                    write!(f, ",dilation={}", c.dilation)?;
                }
                if c.groups != 1 {
                    write!(f, ",groups={}", c.groups)?;
                }
                write!(f, ",layout={}", c.layout)?;
            }
        }
        let t = self.types();
        write!(f, ",dtype={}", t.dtype)?;
        if t.wdtype != t.dtype {
            write!(f, ",wdtype={}", t.wdtype)?;
        }
        let e = self.epilogue();
        let mut parts = Vec::new();
        if e.bias {
            parts.push("bias");
        }
        if e.relu {
            parts.push("relu");
        }
        if !parts.is_empty() {
            write!(f, ",epilogue={}", parts.join("+"))?;
        }
        if let Some(o) = e.out {
            write!(f, ",out={o}")?;
        }
        Ok(())
    }
}

impl FromStr for Workload {
    type Err = SpecError;

    /// Parses `kind:key=value,...`. Keys: gemm/dense `m n k`; bmm `b m n k`; conv2d
    /// `n h w c k r s` with optional `stride` (1), `pad` (0), `dilation` (1), `groups` (1),
    /// `layout` (nhwc).
    /// All kinds: `dtype` (required), optional `wdtype`, `epilogue` (`bias`, `relu`,
    /// `bias+relu`) and `out` (output dtype).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(SpecError::Empty);
        }
        // A spec prints back unchanged: no spaces, no control characters, no empty items.
        if let Some((at, c)) = s
            .char_indices()
            .find(|(_, c)| c.is_whitespace() || c.is_control())
        {
            return Err(SpecError::BadValue {
                key: "spec".into(),
                value: s.escape_debug().to_string(),
                reason: format!(
                    "character {} at byte {at}: specs have no spaces or control characters",
                    c.escape_debug()
                ),
            });
        }
        let (kind, rest) = s.split_once(':').unwrap_or((s, ""));
        let (sizes, optional_sizes): (&[&str], &[&str]) = match kind {
            "gemm" | "dense" => (&["m", "n", "k"], &[]),
            "bmm" => (&["b", "m", "n", "k"], &[]),
            "conv2d" => (
                &["n", "h", "w", "c", "k", "r", "s"],
                &["stride", "pad", "dilation", "groups"],
            ),
            other => {
                return Err(SpecError::UnknownKind {
                    kind: other.to_string(),
                    expected: KINDS.to_string(),
                });
            }
        };
        let mut other_keys = vec!["dtype", "wdtype", "epilogue", "out"];
        if kind == "conv2d" {
            other_keys.push("layout");
        }
        let mut kv: BTreeMap<&str, &str> = BTreeMap::new();
        for item in rest.split(',').filter(|_| !rest.is_empty()) {
            if item.is_empty() {
                return Err(SpecError::NotKeyValue {
                    item: "(an empty item: a doubled or trailing comma)".into(),
                });
            }
            let (k, v) = item.split_once('=').ok_or_else(|| SpecError::NotKeyValue {
                item: item.to_string(),
            })?;
            let (k, v) = (k.trim(), v.trim());
            if !sizes.contains(&k) && !optional_sizes.contains(&k) && !other_keys.contains(&k) {
                let allowed: Vec<&str> = sizes
                    .iter()
                    .chain(optional_sizes)
                    .chain(&other_keys)
                    .copied()
                    .collect();
                return Err(SpecError::UnknownKey {
                    kind: kind.to_string(),
                    key: k.to_string(),
                    allowed: allowed.join(", "),
                });
            }
            if kv.insert(k, v).is_some() {
                return Err(SpecError::DuplicateKey { key: k.to_string() });
            }
        }
        let missing = |key: &str| SpecError::MissingKey {
            kind: kind.to_string(),
            key: key.to_string(),
        };
        let number = |key: &str, default: Option<u64>, min: u64| -> Result<u64, SpecError> {
            let Some(v) = kv.get(key) else {
                return default.ok_or_else(|| missing(key));
            };
            let digits = !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit());
            let n: u64 = v
                .parse()
                .ok()
                .filter(|_| digits)
                .ok_or_else(|| SpecError::BadValue {
                    key: key.to_string(),
                    value: v.to_string(),
                    reason: "not a non-negative integer".into(),
                })?;
            if n < min {
                return Err(if n == 0 {
                    SpecError::ZeroExtent {
                        key: key.to_string(),
                    }
                } else {
                    SpecError::BadValue {
                        key: key.to_string(),
                        value: v.to_string(),
                        reason: format!("must be at least {min}"),
                    }
                });
            }
            Ok(n)
        };
        let size = |key: &str| number(key, None, 1);
        let dtype: DType = kv.get("dtype").ok_or_else(|| missing("dtype"))?.parse()?;
        let wdtype: DType = match kv.get("wdtype") {
            Some(v) => v.parse()?,
            None => dtype,
        };
        if dtype.is_float() != wdtype.is_float() {
            return Err(SpecError::BadValue {
                key: "wdtype".into(),
                value: wdtype.to_string(),
                reason: format!("cannot multiply {dtype} by {wdtype}"),
            });
        }
        let types = Types { dtype, wdtype };
        let mut epilogue = EpilogueSpec::default();
        if let Some(e) = kv.get("epilogue") {
            for part in e.split('+') {
                match part {
                    "bias" if !epilogue.bias => epilogue.bias = true,
                    "relu" if !epilogue.relu => epilogue.relu = true,
                    _ => {
                        return Err(SpecError::BadValue {
                            key: "epilogue".into(),
                            value: e.to_string(),
                            reason: "expected bias, relu or bias+relu".into(),
                        });
                    }
                }
            }
        }
        if let Some(o) = kv.get("out") {
            let o: DType = o.parse()?;
            if o != types.accumulator() {
                epilogue.out = Some(o);
            }
        }
        let w = match kind {
            "gemm" => Workload::Gemm {
                m: size("m")?,
                n: size("n")?,
                k: size("k")?,
                types,
                epilogue,
            },
            "dense" => Workload::Dense {
                m: size("m")?,
                n: size("n")?,
                k: size("k")?,
                types,
                epilogue,
            },
            "bmm" => Workload::Bmm {
                b: size("b")?,
                m: size("m")?,
                n: size("n")?,
                k: size("k")?,
                types,
                epilogue,
            },
            _ => {
                let layout = match kv.get("layout").copied().unwrap_or("nhwc") {
                    "nhwc" => ConvLayout::Nhwc,
                    "nchw" => ConvLayout::Nchw,
                    other => {
                        return Err(SpecError::BadValue {
                            key: "layout".into(),
                            value: other.to_string(),
                            reason: "expected nhwc or nchw".into(),
                        });
                    }
                };
                Workload::Conv2d {
                    conv: Conv2d {
                        n: size("n")?,
                        h: size("h")?,
                        w: size("w")?,
                        c: size("c")?,
                        k: size("k")?,
                        r: size("r")?,
                        s: size("s")?,
                        stride: number("stride", Some(1), 1)?,
                        pad: number("pad", Some(0), 0)?,
                        dilation: number("dilation", Some(1), 1)?,
                        groups: number("groups", Some(1), 1)?,
                        layout,
                    },
                    types,
                    epilogue,
                }
            }
        };
        w.validate()?;
        Ok(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_convolutions_are_independent_convolutions_per_group() {
        use crate::{TensorData, Trace};
        let grouped: Workload =
            "conv2d:n=1,h=5,w=5,c=4,k=6,r=3,s=3,stride=2,pad=1,groups=2,dtype=i8"
                .parse()
                .unwrap();
        assert_eq!(
            grouped.to_string(),
            "conv2d:n=1,h=5,w=5,c=4,k=6,r=3,s=3,stride=2,pad=1,groups=2,layout=nhwc,dtype=i8"
        );
        // Half the channels meet half the filters: half an ordinary convolution's MACs.
        let dense: Workload = "conv2d:n=1,h=5,w=5,c=4,k=6,r=3,s=3,stride=2,pad=1,dtype=i8"
            .parse()
            .unwrap();
        assert_eq!(2 * grouped.macs(), dense.macs());
        let run = |w: &Workload, inputs: &[TensorData]| {
            let op = w.to_op();
            op.validate().unwrap();
            Trace::new().lower(&op, &()).unwrap().run(inputs).unwrap()
        };
        let x = TensorData::random(vec![1, 5, 5, 2, 2], DType::I8, 1);
        let f = TensorData::random(vec![2, 3, 3, 3, 2], DType::I8, 2);
        let y = run(&grouped, &[x.clone(), f.clone()]);
        assert_eq!(y.shape, vec![1, 3, 3, 2, 3]);
        let one: Workload = "conv2d:n=1,h=5,w=5,c=2,k=3,r=3,s=3,stride=2,pad=1,dtype=i8"
            .parse()
            .unwrap();
        for g in 0..2 {
            // Group g's channels of the input, and its filters.
            let xg: Vec<f64> = x
                .data
                .chunks(2)
                .skip(g)
                .step_by(2)
                .flatten()
                .copied()
                .collect();
            let fg = f.data[g * 54..(g + 1) * 54].to_vec();
            let yg = run(
                &one,
                &[
                    TensorData {
                        shape: vec![1, 5, 5, 2],
                        dtype: DType::I8,
                        data: xg,
                    },
                    TensorData {
                        shape: vec![3, 3, 3, 2],
                        dtype: DType::I8,
                        data: fg,
                    },
                ],
            );
            let want: Vec<f64> = y
                .data
                .chunks(3)
                .skip(g)
                .step_by(2)
                .flatten()
                .copied()
                .collect();
            assert_eq!(yg.data, want, "group {g}");
        }
        // Groups must divide both channel counts.
        let e = "conv2d:n=1,h=5,w=5,c=4,k=6,r=3,s=3,groups=4,dtype=f32"
            .parse::<Workload>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("groups") && e.contains("divide"), "{e}");
        // Depthwise, NCHW, with a bias: a valid operator with a (group, channel) bias.
        let dw: Workload =
            "conv2d:n=1,h=8,w=8,c=16,k=16,r=3,s=3,pad=1,groups=16,layout=nchw,dtype=f32,epilogue=bias"
                .parse()
                .unwrap();
        dw.to_op().validate().unwrap();
        assert_eq!(dw.macs(), 16 * 64 * 9);
    }

    #[test]
    fn examples_round_trip() {
        for s in [
            "gemm:m=1024,n=1024,k=1024,dtype=bf16",
            "bmm:b=12,m=128,n=128,k=64,dtype=bf16",
            "conv2d:n=1,h=56,w=56,c=64,k=64,r=3,s=3,stride=1,pad=1,layout=nhwc,dtype=bf16",
            "dense:m=128,n=3072,k=768,dtype=u8,wdtype=i8,epilogue=bias+relu,out=u8",
            "conv2d:n=2,h=9,w=9,c=3,k=4,r=3,s=3,stride=2,pad=2,dilation=2,layout=nchw,dtype=f32",
        ] {
            let w: Workload = s.parse().unwrap();
            assert_eq!(w.to_string(), s);
            w.to_op().validate().unwrap();
        }
    }

    #[test]
    fn errors_name_the_problem() {
        let err = |s: &str| s.parse::<Workload>().unwrap_err().to_string();
        assert!(err("gemm:m=1,n=2,k=3,dtype=bf16,x=4").contains("unknown key `x`"));
        assert!(err("gemm:m=1,n=2,dtype=bf16").contains("missing key `k`"));
        assert!(err("gemm:m=0,n=2,k=3,dtype=bf16").contains("`m` must be a positive extent"));
        assert!(err("gemm:m=1,n=2,k=3,dtype=q4").contains("unknown dtype `q4`"));
        assert!(err("matmul:m=1").contains("unknown operator kind `matmul`"));
        assert!(err("gemm:m=1,n=2,k=3").contains("missing key `dtype`"));
        assert!(err("gemm:m=x,n=2,k=3,dtype=f32").contains("`m` has invalid value `x`"));
        assert!(err("gemm:m=1,m=1,n=2,k=3,dtype=f32").contains("`m` given twice"));
        assert!(err("conv2d:n=1,h=2,w=2,c=1,k=1,r=5,s=5,dtype=f32").contains("does not fit"));
        assert!(err("gemm:m=1,n,k=3,dtype=f32").contains("key=value"));
    }

    #[test]
    fn conv_output_size_follows_the_usual_formula() {
        let w: Workload = "conv2d:n=1,h=224,w=224,c=3,k=64,r=7,s=7,stride=2,pad=3,dtype=bf16"
            .parse()
            .unwrap();
        let op = w.to_op();
        assert_eq!(op.output.tensor.shape, vec![1, 112, 112, 64]);
        assert_eq!(op.macs(), 112 * 112 * 64 * 3 * 7 * 7);
    }
}
