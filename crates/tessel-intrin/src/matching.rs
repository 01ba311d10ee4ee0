//! The matching problem: every way to compute an operator with a tensorized instruction.
//!
//! Compute matching assigns each instruction dimension a group of the operator's iteration
//! variables whose access pattern agrees with the instruction's in every operand (the
//! instruction's `m` indexes A and C but not B; `n` indexes B and C but not A; `k` is a
//! reduction indexing A and B), fused and padded up to the instruction's extent. Variables no
//! group takes (a batch, say) stay outer loops. Memory matching then says what each operand
//! needs to reach the instruction's layout, and how many bytes that moves.

use std::fmt;

use serde::{Deserialize, Serialize};
use tessel_ir::{ComputeOp, DType, IterKind, Trace};
use thiserror::Error;

use crate::desc::{Intrinsic, LayoutReq};

/// Why an operator cannot be computed with an instruction.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum MatchError {
    #[error("`{op}` cannot use `{intrinsic}`: {reason}")]
    NoMapping {
        op: String,
        intrinsic: String,
        reason: String,
    },
}

/// The operator variables fused into one instruction dimension, outermost first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DimAssignment {
    pub vars: Vec<String>,
    /// Product of the variables' extents.
    pub extent: u64,
    /// `extent` rounded up to a multiple of the instruction's extent.
    pub padded: u64,
}

impl DimAssignment {
    /// Share of the padded extent that is padding.
    pub fn waste(&self) -> f64 {
        1.0 - self.extent as f64 / self.padded as f64
    }
}

/// What an operand needs before the instruction can load it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransformKind {
    /// The operand's memory already is a (strided) tile the instruction loads.
    Direct,
    /// A copy into a zero-padded buffer (the reduction or a row group does not divide).
    Pad,
    /// Both groups are regular but the wrong one is contiguous.
    Transpose,
    /// Interleave `group` consecutive k elements ([k/g][n][g]), as AMX and VNNI need.
    VnniPack { group: u32 },
    /// Unfold overlapping windows (a convolution input whose k group is not one stride).
    Im2col,
    /// Only the element type changes (see [`OperandTransform::convert`]): a copy in the
    /// operand's own layout.
    Convert,
}

/// The transform of one operand.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperandTransform {
    /// The operator input.
    pub input: String,
    /// Which instruction operand it feeds: `A` or `B`.
    pub role: String,
    pub kind: TransformKind,
    /// The wider type the operand is converted to on the way (convert-on-pack: bf16 -> f32
    /// for an f32 FMA, u8/i8 -> i16 for `vpmaddwd`); `None` when the types agree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub convert: Option<DType>,
    /// Bytes written by the transform (0 when direct).
    pub bytes: u64,
}

/// One way to compute an operator with an instruction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mapping {
    pub intrinsic: String,
    /// Operator inputs feeding the instruction's A and B.
    pub operands: [usize; 2],
    /// The instruction's m, n and k.
    pub dims: [DimAssignment; 3],
    /// Variables left as outer loops.
    pub outer: Vec<String>,
    pub transforms: Vec<OperandTransform>,
}

impl Mapping {
    /// Share of the instruction's work spent on padding.
    pub fn padding_waste(&self) -> f64 {
        let useful: f64 = self.dims.iter().map(|d| d.extent as f64).product();
        let padded: f64 = self.dims.iter().map(|d| d.padded as f64).product();
        1.0 - useful / padded
    }

    pub fn transform_bytes(&self) -> u64 {
        self.transforms.iter().map(|t| t.bytes).sum()
    }

    /// Appends to `t` a cast of every operand the instruction takes in a wider type.
    pub fn cast_steps(&self, t: &mut Trace) {
        for (slot, tr) in self.transforms.iter().enumerate().take(2) {
            if let Some(dtype) = tr.convert {
                t.cast(self.operands[slot], dtype);
            }
        }
    }

    /// Whether any operand changes type on the way to the instruction.
    pub fn converts(&self) -> bool {
        self.transforms.iter().any(|t| t.convert.is_some())
    }

    /// Appends to `t` the steps that make one loop per instruction dimension: `outer` (the
    /// variables outside the instruction, in the order wanted) first, then each dimension's
    /// variables adjacent and fused. Returns the fused loops' names, m, n and k.
    pub fn fuse_dims(&self, t: &mut Trace, outer: &[&str]) -> Vec<String> {
        let mut order: Vec<&str> = outer.to_vec();
        for d in &self.dims {
            order.extend(d.vars.iter().map(String::as_str));
        }
        t.reorder(&order);
        let mut fused = Vec::new();
        for d in &self.dims {
            let refs: Vec<&str> = d.vars.iter().map(String::as_str).collect();
            if refs.len() > 1 {
                t.fuse(&refs);
            }
            fused.push(refs.join("_"));
        }
        fused
    }

    /// The schedule that computes the operator through this mapping: group variables fused,
    /// split by the instruction's extents (padding), and the inner parts tensorized.
    pub fn to_trace(&self, intr: &Intrinsic) -> Trace {
        let mut t = Trace::new();
        self.cast_steps(&mut t);
        let outer: Vec<&str> = self.outer.iter().map(String::as_str).collect();
        let fused = self.fuse_dims(&mut t, &outer);
        for (d, ext) in fused.iter().zip([intr.m, intr.n, intr.k]) {
            t.split(d, &[ext]);
        }
        let outer_parts: Vec<String> = fused.iter().map(|f| format!("{f}.0")).collect();
        let inner_parts: Vec<String> = fused.iter().map(|f| format!("{f}.1")).collect();
        let mut final_order: Vec<&str> = self.outer.iter().map(String::as_str).collect();
        final_order.extend(outer_parts.iter().map(String::as_str));
        final_order.extend(inner_parts.iter().map(String::as_str));
        t.reorder(&final_order);
        t.tensorize(
            intr.id,
            &[
                ("m", inner_parts[0].as_str()),
                ("n", inner_parts[1].as_str()),
                ("k", inner_parts[2].as_str()),
            ],
            &self.operands,
        );
        t
    }
}

impl fmt::Display for Mapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dim = |name: &str, d: &DimAssignment| {
            format!(
                "{name} <- ({}) {}->{}",
                d.vars.join(", "),
                d.extent,
                d.padded
            )
        };
        write!(
            f,
            "{}; {}; {}",
            dim("m", &self.dims[0]),
            dim("n", &self.dims[1]),
            dim("k", &self.dims[2])
        )?;
        if !self.outer.is_empty() {
            write!(f, "; outer ({})", self.outer.join(", "))?;
        }
        write!(f, "; waste {:.1}%", 100.0 * self.padding_waste())?;
        for t in &self.transforms {
            write!(f, "; {} <- {}: {:?}", t.role, t.input, t.kind)?;
            if let Some(to) = t.convert {
                write!(f, " to {to}")?;
            }
            if t.bytes > 0 {
                write!(f, " ({} B)", t.bytes)?;
            }
        }
        Ok(())
    }
}

/// Memory strides (in elements) of each iteration variable in operator input `input`.
fn strides(op: &ComputeOp, input: usize) -> Vec<i64> {
    let o = &op.inputs[input];
    (0..op.iter_vars.len()).map(|v| o.stride(v)).collect()
}

/// Whether a fused group (outermost first) advances memory by one constant stride.
fn uniform(group: &[usize], stride: &[i64], op: &ComputeOp) -> bool {
    group
        .windows(2)
        .all(|w| stride[w[0]] == stride[w[1]] * op.iter_vars[w[1]].extent as i64)
}

fn contiguous(group: &[usize], stride: &[i64], op: &ComputeOp) -> bool {
    uniform(group, stride, op) && group.last().is_some_and(|&v| stride[v] == 1)
}

/// Enumerates every mapping of `op` onto `intr`, cheapest-looking first (least padding, then
/// fewest transform bytes). An error says why there is none.
pub fn match_op(op: &ComputeOp, intr: &Intrinsic) -> Result<Vec<Mapping>, MatchError> {
    let no = |reason: String| MatchError::NoMapping {
        op: op.name.clone(),
        intrinsic: intr.id.to_string(),
        reason,
    };
    op.validate().map_err(|e| no(e.to_string()))?;
    if op.inputs.len() != 2 {
        return Err(no(format!(
            "it has {} inputs; the instruction multiplies two",
            op.inputs.len()
        )));
    }
    if op.reduction_vars().next().is_none() {
        return Err(no("it has no reduction: it is not a contraction".into()));
    }
    if op.accumulator != intr.acc {
        return Err(no(format!(
            "it accumulates in {}, the instruction in {}",
            op.accumulator, intr.acc
        )));
    }
    let mut reasons = Vec::new();
    let mut out = Vec::new();
    for (a, b) in [(0usize, 1usize), (1, 0)] {
        let (da, db) = (op.inputs[a].tensor.dtype, op.inputs[b].tensor.dtype);
        // The instruction's types, or ones that widen to them exactly on the way in.
        if !da.fits_exactly_in(intr.a) || !db.fits_exactly_in(intr.b) {
            reasons.push(format!(
                "inputs {a},{b} are {da} x {db}, the instruction takes {} x {} (and they do not widen to it exactly)",
                intr.a, intr.b
            ));
            continue;
        }
        let dep = |o: usize, v: usize| op.inputs[o].depends_on(v);
        let spatial = |v: usize| op.iter_vars[v].kind == IterKind::Spatial;
        let nvars = op.iter_vars.len();
        let eligible: [Vec<usize>; 3] = [
            (0..nvars)
                .filter(|&v| spatial(v) && dep(a, v) && !dep(b, v))
                .collect(),
            (0..nvars)
                .filter(|&v| spatial(v) && dep(b, v) && !dep(a, v))
                .collect(),
            (0..nvars)
                .filter(|&v| !spatial(v) && dep(a, v) && dep(b, v))
                .collect(),
        ];
        if let Some(r) = (0..3).find(|&r| eligible[r].is_empty()) {
            reasons.push(format!(
                "with inputs {a},{b}: no variable can feed the instruction's {}",
                ["m", "n", "k"][r]
            ));
            continue;
        }
        let (sa, sb) = (strides(op, a), strides(op, b));
        let out_strides = {
            // Output memory order decides the fusion order of m and n groups.
            let mut s = vec![0i64; nvars];
            let shape = &op.output.tensor.shape;
            let mut acc = 1i64;
            for d in (0..shape.len()).rev() {
                let v = op.output.indices[d].terms[0].0;
                s[v] = acc;
                acc *= shape[d] as i64;
            }
            s
        };
        let subsets = |vars: &[usize], key: &[i64]| -> Vec<Vec<usize>> {
            (1u32..(1 << vars.len()))
                .map(|mask| {
                    let mut g: Vec<usize> = (0..vars.len())
                        .filter(|i| mask & (1 << i) != 0)
                        .map(|i| vars[i])
                        .collect();
                    // Outermost first: larger memory stride first.
                    g.sort_by_key(|&v| std::cmp::Reverse(key[v]));
                    g
                })
                .collect()
        };
        for gm in subsets(&eligible[0], &out_strides) {
            for gn in subsets(&eligible[1], &out_strides) {
                for gk in subsets(&eligible[2], &sa) {
                    let groups = [gm.clone(), gn.clone(), gk];
                    out.push(build(op, intr, [a, b], &groups, [&sa, &sb]));
                }
            }
        }
    }
    if out.is_empty() {
        return Err(no(reasons.join("; ")));
    }
    out.sort_by(|x, y| {
        x.padding_waste()
            .total_cmp(&y.padding_waste())
            .then(x.transform_bytes().cmp(&y.transform_bytes()))
    });
    Ok(out)
}

fn build(
    op: &ComputeOp,
    intr: &Intrinsic,
    operands: [usize; 2],
    groups: &[Vec<usize>; 3],
    strides: [&Vec<i64>; 2],
) -> Mapping {
    let ext = [intr.m, intr.n, intr.k];
    let dims: Vec<DimAssignment> = (0..3)
        .map(|r| {
            let extent: u64 = groups[r].iter().map(|&v| op.iter_vars[v].extent).product();
            DimAssignment {
                vars: groups[r]
                    .iter()
                    .map(|&v| op.iter_vars[v].name.clone())
                    .collect(),
                extent,
                padded: extent.div_ceil(ext[r]) * ext[r],
            }
        })
        .collect();
    let mapped: Vec<usize> = groups.iter().flatten().copied().collect();
    let outer: Vec<usize> = (0..op.iter_vars.len())
        .filter(|v| !mapped.contains(v))
        .collect();
    let mut transforms = Vec::new();
    for (slot, role) in ["A", "B"].into_iter().enumerate() {
        let input = operands[slot];
        let s = strides[slot];
        // Instruction A is [m][k], B is [k][n]: rows and columns of the tile.
        let (rows, cols) = if slot == 0 { (0, 2) } else { (2, 1) };
        let (gr, gc) = (&groups[rows], &groups[cols]);
        let req = intr.memory[slot].layout;
        let k_group = if slot == 0 { gc } else { gr };
        let other = if slot == 0 { gr } else { gc };
        let regular = uniform(gr, s, op) && uniform(gc, s, op);
        let k_contig = contiguous(k_group, s, op);
        let other_contig = contiguous(other, s, op);
        let native = match req {
            LayoutReq::KContiguous => k_contig,
            LayoutReq::NContiguous => other_contig,
            LayoutReq::Either => k_contig || other_contig,
            LayoutReq::Any => true,
            LayoutReq::Vnni { .. } => false,
        };
        // Zero padding must be materialised: split padding, and reads outside the tensor
        // (a convolution's border), which a tile load would take from neighbouring memory.
        let padded = dims[rows].padded != dims[rows].extent
            || dims[cols].padded != dims[cols].extent
            || op.reads_outside(input);
        let windows = op.inputs[input].indices.iter().any(|e| e.terms.len() > 1);
        let want = if slot == 0 { intr.a } else { intr.b };
        let convert = (op.inputs[input].tensor.dtype != want).then_some(want);
        let kind = match req {
            LayoutReq::Vnni { group } => TransformKind::VnniPack { group },
            _ if !regular && windows => TransformKind::Im2col,
            _ if !regular || !native => TransformKind::Transpose,
            _ if padded => TransformKind::Pad,
            _ if convert.is_some() => TransformKind::Convert,
            _ => TransformKind::Direct,
        };
        let batch: u64 = outer
            .iter()
            .filter(|&&v| op.inputs[input].depends_on(v))
            .map(|&v| op.iter_vars[v].extent)
            .product();
        let bytes = if kind == TransformKind::Direct {
            0
        } else {
            // Written in the instruction's type (the converted one, where it converts).
            dims[rows].padded * dims[cols].padded * batch * want.bytes() as u64
        };
        transforms.push(OperandTransform {
            input: op.inputs[input].tensor.name.clone(),
            role: role.to_string(),
            kind,
            convert,
            bytes,
        });
    }
    Mapping {
        intrinsic: intr.id.to_string(),
        operands,
        dims: [dims[0].clone(), dims[1].clone(), dims[2].clone()],
        outer: outer
            .iter()
            .map(|&v| op.iter_vars[v].name.clone())
            .collect(),
        transforms,
    }
}
