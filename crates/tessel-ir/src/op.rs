//! Operators: iteration variables, affine accesses and [`ComputeOp`].

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::data::TensorData;
use crate::dtype::DType;
use crate::error::{ExecError, OpError};

/// Whether an iteration variable indexes the output (spatial) or is summed over (reduction).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IterKind {
    Spatial,
    Reduction,
}

/// One loop of an operator's iteration space.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IterVar {
    pub name: String,
    pub extent: u64,
    pub kind: IterKind,
}

impl IterVar {
    pub fn spatial(name: &str, extent: u64) -> Self {
        IterVar {
            name: name.to_string(),
            extent,
            kind: IterKind::Spatial,
        }
    }

    pub fn reduction(name: &str, extent: u64) -> Self {
        IterVar {
            name: name.to_string(),
            extent,
            kind: IterKind::Reduction,
        }
    }
}

/// A tensor declaration. `layout` names the dimensions in storage order, one letter each
/// (`"mk"`, `"nhwc"`, `"krsc"`), for people and for layout-aware passes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorDecl {
    pub name: String,
    pub shape: Vec<u64>,
    pub dtype: DType,
    pub layout: String,
}

impl TensorDecl {
    pub fn new(name: &str, shape: Vec<u64>, dtype: DType, layout: &str) -> Self {
        TensorDecl {
            name: name.to_string(),
            shape,
            dtype,
            layout: layout.to_string(),
        }
    }

    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }

    pub fn bytes(&self) -> u64 {
        self.elements() * self.dtype.bytes() as u64
    }
}

/// `sum(coeff * var) + constant`, over the iteration variables of one operator (by index).
///
/// Strides (`2*h`), dilation (`2*r`) and padding offsets (`h + r - 1`) are all affine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AffineExpr {
    pub terms: Vec<(usize, i64)>,
    pub constant: i64,
}

impl AffineExpr {
    /// The expression `var`.
    pub fn var(var: usize) -> Self {
        AffineExpr {
            terms: vec![(var, 1)],
            constant: 0,
        }
    }

    /// Builds from `(var, coeff)` pairs and a constant, dropping zero coefficients.
    pub fn new(terms: &[(usize, i64)], constant: i64) -> Self {
        AffineExpr {
            terms: terms.iter().copied().filter(|&(_, c)| c != 0).collect(),
            constant,
        }
    }

    pub fn coeff(&self, var: usize) -> i64 {
        self.terms
            .iter()
            .filter(|(v, _)| *v == var)
            .map(|(_, c)| c)
            .sum()
    }

    pub fn depends_on(&self, var: usize) -> bool {
        self.coeff(var) != 0
    }

    /// This expression with each operator variable `v` replaced by `point[v]` (an index
    /// expression over loop variables), as code generators read biases at a store's point.
    pub fn at(&self, point: &[crate::Expr]) -> crate::Expr {
        use crate::Expr;
        self.terms
            .iter()
            .fold(Expr::Const(self.constant), |e, &(v, c)| {
                Expr::sum(e, Expr::scaled(point[v].clone(), c))
            })
    }

    pub fn eval(&self, values: &[i64]) -> i64 {
        self.terms.iter().map(|&(v, c)| c * values[v]).sum::<i64>() + self.constant
    }

    /// Formats with the operator's variable names, e.g. `h*2 + r - 1`.
    pub fn display<'a>(&'a self, vars: &'a [IterVar]) -> impl fmt::Display + 'a {
        DisplayAffine { expr: self, vars }
    }
}

struct DisplayAffine<'a> {
    expr: &'a AffineExpr,
    vars: &'a [IterVar],
}

impl fmt::Display for DisplayAffine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for &(v, c) in &self.expr.terms {
            let name = self.vars.get(v).map_or("?", |iv| iv.name.as_str());
            let sign = if c < 0 { "-" } else { "+" };
            if !first {
                write!(f, " {sign} ")?;
            } else if c < 0 {
                f.write_str("-")?;
            }
            if c.abs() == 1 {
                write!(f, "{name}")?;
            } else {
                write!(f, "{name}*{}", c.abs())?;
            }
            first = false;
        }
        if first {
            write!(f, "{}", self.expr.constant)
        } else if self.expr.constant > 0 {
            write!(f, " + {}", self.expr.constant)
        } else if self.expr.constant < 0 {
            write!(f, " - {}", -self.expr.constant)
        } else {
            Ok(())
        }
    }
}

/// A tensor read or written at affine indices. Reads outside the tensor's bounds give zero:
/// that is how convolution padding is expressed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Operand {
    pub tensor: TensorDecl,
    pub indices: Vec<AffineExpr>,
}

impl Operand {
    pub fn depends_on(&self, var: usize) -> bool {
        self.indices.iter().any(|e| e.depends_on(var))
    }

    /// How many elements apart (row-major) the operand's consecutive accesses are along
    /// iteration variable `var`; saturates instead of overflowing.
    pub fn stride(&self, var: usize) -> i64 {
        let mut stride = 0i64;
        let mut row = 1i64;
        for (e, &extent) in self.indices.iter().zip(&self.tensor.shape).rev() {
            stride = stride.saturating_add(e.coeff(var).saturating_mul(row));
            row = row.saturating_mul(i64::try_from(extent).unwrap_or(i64::MAX));
        }
        stride
    }
}

/// An elementwise step applied to each accumulated output value, in order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Epilogue {
    /// Adds a value read at spatial indices (a per-channel bias), in the accumulator type.
    Bias(Operand),
    Relu,
    /// Rounds to a narrower type (the output's).
    Cast(DType),
}

/// `out[s] (+)= sum over reduction vars of prod(inputs[i][access_i])`, accumulated in
/// `accumulator`, then passed through `epilogue` and stored as the output's dtype.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ComputeOp {
    pub name: String,
    pub iter_vars: Vec<IterVar>,
    pub inputs: Vec<Operand>,
    pub output: Operand,
    pub accumulator: DType,
    pub epilogue: Vec<Epilogue>,
}

impl ComputeOp {
    /// The smallest and largest value `e` takes over the whole iteration space; None where a
    /// variable is out of range or the arithmetic overflows.
    pub fn index_range(&self, e: &AffineExpr) -> Option<(i64, i64)> {
        let (mut lo, mut hi) = (e.constant, e.constant);
        for &(v, c) in &e.terms {
            let last = i64::try_from(self.iter_vars.get(v)?.extent.saturating_sub(1)).ok()?;
            let span = c.checked_mul(last)?;
            if span < 0 {
                lo = lo.checked_add(span)?;
            } else {
                hi = hi.checked_add(span)?;
            }
        }
        Some((lo, hi))
    }

    /// Whether input `input`'s reads leave its tensor for some point of the iteration space (a
    /// padded convolution's border, read as zeros); true where the range cannot be computed.
    pub fn reads_outside(&self, input: usize) -> bool {
        self.inputs.get(input).is_some_and(|o| {
            o.indices.iter().zip(&o.tensor.shape).any(|(e, &n)| {
                self.index_range(e)
                    .is_none_or(|(lo, hi)| lo < 0 || hi >= n as i64)
            })
        })
    }

    /// Checks that the parts fit: unique names, in-range variables, ranks that match shapes, an
    /// output indexed by exactly the spatial variables, each once.
    pub fn validate(&self) -> Result<(), OpError> {
        let bad = |reason: String| OpError::Invalid {
            op: self.name.clone(),
            reason,
        };
        if self.iter_vars.is_empty() {
            return Err(bad("no iteration variables".into()));
        }
        for (i, v) in self.iter_vars.iter().enumerate() {
            if v.extent == 0 {
                return Err(bad(format!("iteration variable `{}` has extent 0", v.name)));
            }
            if self.iter_vars[..i].iter().any(|w| w.name == v.name) {
                return Err(bad(format!(
                    "iteration variable `{}` declared twice",
                    v.name
                )));
            }
        }
        if self.inputs.is_empty() {
            return Err(bad("no input operands".into()));
        }
        let mut operands: Vec<&Operand> = self.inputs.iter().collect();
        operands.push(&self.output);
        for e in &self.epilogue {
            if let Epilogue::Bias(b) = e {
                operands.push(b);
            }
        }
        for o in &operands {
            if o.tensor.shape.len() != o.indices.len() {
                return Err(bad(format!(
                    "tensor `{}` has rank {} but is accessed with {} indices",
                    o.tensor.name,
                    o.tensor.shape.len(),
                    o.indices.len()
                )));
            }
            if o.tensor.shape.contains(&0) {
                return Err(bad(format!(
                    "tensor `{}` has a zero dimension",
                    o.tensor.name
                )));
            }
            for e in &o.indices {
                if let Some((v, _)) = e.terms.iter().find(|(v, _)| *v >= self.iter_vars.len()) {
                    return Err(bad(format!(
                        "tensor `{}` uses undeclared variable #{v}",
                        o.tensor.name
                    )));
                }
            }
        }
        // The output is indexed by each spatial variable exactly once, unit stride.
        let mut seen = vec![false; self.iter_vars.len()];
        for (d, e) in self.output.indices.iter().enumerate() {
            let single = e.terms.len() == 1 && e.terms[0].1 == 1 && e.constant == 0;
            if !single {
                return Err(bad(format!(
                    "output index {d} must be a single iteration variable"
                )));
            }
            let v = e.terms[0].0;
            if self.iter_vars[v].kind != IterKind::Spatial || seen[v] {
                return Err(bad(format!(
                    "output index {d} must be a distinct spatial variable"
                )));
            }
            if self.output.tensor.shape[d] != self.iter_vars[v].extent {
                return Err(bad(format!(
                    "output dimension {d} is {} but `{}` has extent {}",
                    self.output.tensor.shape[d], self.iter_vars[v].name, self.iter_vars[v].extent
                )));
            }
            seen[v] = true;
        }
        for (v, iv) in self.iter_vars.iter().enumerate() {
            if iv.kind == IterKind::Spatial && !seen[v] {
                return Err(bad(format!(
                    "spatial variable `{}` does not index the output",
                    iv.name
                )));
            }
        }
        for e in &self.epilogue {
            if let Epilogue::Bias(b) = e
                && b.indices
                    .iter()
                    .flat_map(|e| &e.terms)
                    .any(|&(v, _)| self.iter_vars[v].kind == IterKind::Reduction)
            {
                return Err(bad("bias may only use spatial variables".into()));
            }
        }
        Ok(())
    }

    /// Multiply-accumulates in the iteration space (padded positions included, as published
    /// FLOP counts do).
    pub fn macs(&self) -> u64 {
        self.iter_vars.iter().map(|v| v.extent).product()
    }

    /// Floating-point (or integer) operations: two per multiply-accumulate.
    pub fn flops(&self) -> u64 {
        2 * self.macs()
    }

    pub fn var_index(&self, name: &str) -> Option<usize> {
        self.iter_vars.iter().position(|v| v.name == name)
    }

    pub fn spatial_vars(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.iter_vars.len()).filter(|&v| self.iter_vars[v].kind == IterKind::Spatial)
    }

    pub fn reduction_vars(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.iter_vars.len()).filter(|&v| self.iter_vars[v].kind == IterKind::Reduction)
    }

    /// Every tensor the operator reads, in order: inputs, then epilogue biases.
    pub fn read_operands(&self) -> Vec<&Operand> {
        let mut v: Vec<&Operand> = self.inputs.iter().collect();
        for e in &self.epilogue {
            if let Epilogue::Bias(b) = e {
                v.push(b);
            }
        }
        v
    }

    /// Checks that `inputs` match [`read_operands`](Self::read_operands) in number, shape and dtype.
    pub fn check_inputs(&self, inputs: &[TensorData]) -> Result<(), ExecError> {
        let expected = self.read_operands();
        if expected.len() != inputs.len() {
            return Err(ExecError::InputCount {
                expected: expected.len(),
                got: inputs.len(),
            });
        }
        for (o, t) in expected.iter().zip(inputs) {
            if o.tensor.shape != t.shape || o.tensor.dtype != t.dtype {
                return Err(ExecError::InputShape {
                    name: o.tensor.name.clone(),
                    expected: o.tensor.shape.clone(),
                    dtype: o.tensor.dtype,
                    got: t.shape.clone(),
                    got_dtype: t.dtype,
                });
            }
        }
        Ok(())
    }

    /// The naive definition, executed directly: the reference every lowered program must match.
    ///
    /// `inputs` are the [`read_operands`](Self::read_operands) in order.
    pub fn reference(&self, inputs: &[TensorData]) -> Result<TensorData, ExecError> {
        self.check_inputs(inputs)?;
        let out = &self.output.tensor;
        let mut acc = TensorData::zeros(out.shape.clone(), self.accumulator);
        self.accumulate(&inputs[..self.inputs.len()], &mut acc)?;
        let mut result = TensorData::zeros(out.shape.clone(), out.dtype);
        let out_vars: Vec<usize> = self.output.indices.iter().map(|e| e.terms[0].0).collect();
        let mut opoint = vec![0i64; out.shape.len()];
        let mut full = vec![0i64; self.iter_vars.len()];
        let biases = &inputs[self.inputs.len()..];
        loop {
            for (d, &v) in out_vars.iter().enumerate() {
                full[v] = opoint[d];
            }
            let at = acc.offset(&opoint).ok_or_else(|| ExecError::OutOfBounds {
                buffer: out.name.clone(),
                index: opoint.clone(),
            })?;
            let v = self.apply_epilogue(acc.data[at], &full, |b, idx| {
                biases.get(b).map_or(0.0, |t| t.get_or_zero(idx))
            });
            result.data[at] = out.dtype.round(v);
            if !advance(&mut opoint, &out.shape) {
                break;
            }
        }
        Ok(result)
    }

    /// Random inputs for the read operands ([`ComputeOp::read_operands`]): operand `i` is
    /// `TensorData::random(shape, dtype, seed + i)`, the inputs every checker uses.
    pub fn random_inputs(&self, seed: u64) -> Vec<TensorData> {
        self.read_operands()
            .iter()
            .enumerate()
            .map(|(i, o)| {
                TensorData::random(
                    o.tensor.shape.clone(),
                    o.tensor.dtype,
                    seed.wrapping_add(i as u64),
                )
            })
            .collect()
    }

    /// One element of [`ComputeOp::reference`]: the output at `out_index`, summed over the
    /// reduction variables in the same order (so it rounds the same way), then the epilogue.
    /// Checks a few points of an operator too large to interpret whole.
    pub fn reference_at(&self, inputs: &[TensorData], out_index: &[i64]) -> Result<f64, ExecError> {
        self.check_inputs(inputs)?;
        let out = &self.output.tensor;
        let in_range = out_index.len() == out.shape.len()
            && out_index
                .iter()
                .zip(&out.shape)
                .all(|(&i, &n)| i >= 0 && (i as u64) < n);
        if !in_range {
            return Err(ExecError::OutOfBounds {
                buffer: out.name.clone(),
                index: out_index.to_vec(),
            });
        }
        let mut point = vec![0i64; self.iter_vars.len()];
        for (e, &i) in self.output.indices.iter().zip(out_index) {
            point[e.terms[0].0] = i;
        }
        let reduce: Vec<usize> = (0..self.iter_vars.len())
            .filter(|v| !self.output.indices.iter().any(|e| e.terms[0].0 == *v))
            .collect();
        let extents: Vec<u64> = reduce.iter().map(|&v| self.iter_vars[v].extent).collect();
        let mut r = vec![0i64; reduce.len()];
        let mut acc = 0.0;
        let mut idx = Vec::new();
        loop {
            for (&v, &x) in reduce.iter().zip(&r) {
                point[v] = x;
            }
            let mut prod = 1.0;
            for (o, t) in self.inputs.iter().zip(inputs) {
                idx.clear();
                idx.extend(o.indices.iter().map(|e| e.eval(&point)));
                prod *= t.get_or_zero(&idx);
            }
            acc = self.accumulator.round(acc + prod);
            if !advance(&mut r, &extents) {
                break;
            }
        }
        let biases = &inputs[self.inputs.len()..];
        let v = self.apply_epilogue(acc, &point, |b, idx| {
            biases.get(b).map_or(0.0, |t| t.get_or_zero(idx))
        });
        Ok(out.dtype.round(v))
    }

    /// `acc[out] += prod(inputs)` over the whole iteration space, rounding to the accumulator
    /// type after every addition; the semantics of a tensorized instruction on its tiles.
    pub fn accumulate(&self, inputs: &[TensorData], acc: &mut TensorData) -> Result<(), ExecError> {
        if inputs.len() != self.inputs.len() {
            return Err(ExecError::InputCount {
                expected: self.inputs.len(),
                got: inputs.len(),
            });
        }
        let extents: Vec<u64> = self.iter_vars.iter().map(|v| v.extent).collect();
        let mut point = vec![0i64; extents.len()];
        let mut idx = Vec::new();
        loop {
            let mut prod = 1.0;
            for (o, t) in self.inputs.iter().zip(inputs) {
                idx.clear();
                idx.extend(o.indices.iter().map(|e| e.eval(&point)));
                prod *= t.get_or_zero(&idx);
            }
            idx.clear();
            idx.extend(self.output.indices.iter().map(|e| e.eval(&point)));
            let at = acc.offset(&idx).ok_or_else(|| ExecError::OutOfBounds {
                buffer: self.output.tensor.name.clone(),
                index: idx.clone(),
            })?;
            acc.data[at] = self.accumulator.round(acc.data[at] + prod);
            if !advance(&mut point, &extents) {
                break;
            }
        }
        Ok(())
    }

    /// Applies the epilogue to one accumulated value at iteration point `point` (spatial
    /// variables set). `bias(i, index)` reads the `i`-th bias tensor.
    pub fn apply_epilogue(
        &self,
        mut value: f64,
        point: &[i64],
        bias: impl Fn(usize, &[i64]) -> f64,
    ) -> f64 {
        let mut next_bias = 0;
        for e in &self.epilogue {
            match e {
                Epilogue::Bias(b) => {
                    let idx: Vec<i64> = b.indices.iter().map(|e| e.eval(point)).collect();
                    value = self.accumulator.round(value + bias(next_bias, &idx));
                    next_bias += 1;
                }
                Epilogue::Relu => value = value.max(0.0),
                Epilogue::Cast(t) => value = t.round(value),
            }
        }
        value
    }
}

/// Odometer step over `extents`; false when it wraps around to all zeros.
pub(crate) fn advance(point: &mut [i64], extents: &[u64]) -> bool {
    for d in (0..point.len()).rev() {
        point[d] += 1;
        if (point[d] as u64) < extents[d] {
            return true;
        }
        point[d] = 0;
    }
    false
}

impl fmt::Display for ComputeOp {
    /// `C[m, n] += A[m, k] * B[k, n]` style, with extents and dtypes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let access = |o: &Operand| {
            let idx: Vec<String> = o
                .indices
                .iter()
                .map(|e| e.display(&self.iter_vars).to_string())
                .collect();
            format!("{}[{}]", o.tensor.name, idx.join(", "))
        };
        let reads: Vec<String> = self.inputs.iter().map(access).collect();
        write!(
            f,
            "{}: {} += {}",
            self.name,
            access(&self.output),
            reads.join(" * ")
        )?;
        let list = |kind: IterKind| {
            self.iter_vars
                .iter()
                .filter(|v| v.kind == kind)
                .map(|v| format!("{}={}", v.name, v.extent))
                .collect::<Vec<_>>()
                .join(", ")
        };
        write!(
            f,
            " over ({}) reduce ({}) acc {}",
            list(IterKind::Spatial),
            list(IterKind::Reduction),
            self.accumulator
        )?;
        for e in &self.epilogue {
            match e {
                Epilogue::Bias(b) => write!(f, " +bias({})", b.tensor.name)?,
                Epilogue::Relu => write!(f, " relu")?,
                Epilogue::Cast(t) => write!(f, " cast({t})")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::Workload;

    #[test]
    fn a_padded_convolutions_input_reads_outside_its_tensor() {
        // I[n, p + r - 1, q + s - 1, c] over p, q < 56 and r, s < 3: rows -1 to 56.
        let w: Workload =
            "conv2d:n=1,h=56,w=56,c=8,k=8,r=3,s=3,stride=1,pad=1,layout=nhwc,dtype=f32"
                .parse()
                .expect("spec");
        let op = w.to_op();
        assert_eq!(op.index_range(&op.inputs[0].indices[1]), Some((-1, 56)));
        assert!(op.reads_outside(0) && !op.reads_outside(1));
        let w: Workload = "gemm:m=4,n=6,k=8,dtype=f32".parse().expect("spec");
        assert!(!w.to_op().reads_outside(0));
    }

    #[test]
    fn operand_strides_follow_the_row_major_layout() {
        // dense reads W[n, k]: a row apart along n, adjacent along k, not at all along m.
        let w: Workload = "dense:m=4,n=6,k=8,dtype=f32".parse().expect("spec");
        let op = w.to_op();
        let var = |name: &str| op.iter_vars.iter().position(|v| v.name == name).unwrap();
        let weights = &op.inputs[1];
        assert_eq!(weights.stride(var("n")), 8);
        assert_eq!(weights.stride(var("k")), 1);
        assert_eq!(weights.stride(var("m")), 0);
        // The output is C[m, n].
        assert_eq!(op.output.stride(var("m")), 6);
    }
}
