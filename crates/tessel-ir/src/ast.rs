//! The lowered loop-nest program that feature extraction, code generators and the interpreter
//! walk.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::op::ComputeOp;
use crate::trace::{GpuAxis, Scope};

/// An integer index expression over loop variables (by id into [`Program::vars`]).
/// Division and modulo are floor division and Euclidean remainder, so negative (padding)
/// indices stay out of bounds after a layout transform.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Expr {
    Const(i64),
    Var(usize),
    Add(Box<Expr>, Box<Expr>),
    Mul(Box<Expr>, i64),
    Div(Box<Expr>, i64),
    Mod(Box<Expr>, i64),
}

impl Expr {
    /// `a + b`, folding constants and zeros.
    pub fn sum(a: Expr, b: Expr) -> Expr {
        match (a, b) {
            (Expr::Const(x), Expr::Const(y)) => Expr::Const(x + y),
            (Expr::Const(0), e) | (e, Expr::Const(0)) => e,
            (a, b) => Expr::Add(Box::new(a), Box::new(b)),
        }
    }

    /// `a * c`, folding constants, ones and zeros.
    pub fn scaled(a: Expr, c: i64) -> Expr {
        match (a, c) {
            (_, 0) => Expr::Const(0),
            (a, 1) => a,
            (Expr::Const(x), c) => Expr::Const(x * c),
            (a, c) => Expr::Mul(Box::new(a), c),
        }
    }

    pub fn floor_div(a: Expr, c: i64) -> Expr {
        match (a, c) {
            (a, 1) => a,
            (Expr::Const(x), c) => Expr::Const(x.div_euclid(c)),
            (a, c) => Expr::Div(Box::new(a), c),
        }
    }

    pub fn floor_mod(a: Expr, c: i64) -> Expr {
        match (a, c) {
            (_, 1) => Expr::Const(0),
            (Expr::Const(x), c) => Expr::Const(x.rem_euclid(c)),
            (a, c) => Expr::Mod(Box::new(a), c),
        }
    }

    pub fn eval(&self, vars: &[i64]) -> i64 {
        match self {
            Expr::Const(c) => *c,
            Expr::Var(v) => vars[*v],
            Expr::Add(a, b) => a.eval(vars) + b.eval(vars),
            Expr::Mul(a, c) => a.eval(vars) * c,
            Expr::Div(a, c) => a.eval(vars).div_euclid(*c),
            Expr::Mod(a, c) => a.eval(vars).rem_euclid(*c),
        }
    }

    /// Adds the loop variables this expression reads to `out`.
    pub fn collect_vars(&self, out: &mut Vec<usize>) {
        match self {
            Expr::Const(_) => {}
            Expr::Var(v) => {
                if !out.contains(v) {
                    out.push(*v)
                }
            }
            Expr::Add(a, b) => {
                a.collect_vars(out);
                b.collect_vars(out);
            }
            Expr::Mul(a, _) | Expr::Div(a, _) | Expr::Mod(a, _) => a.collect_vars(out),
        }
    }

    /// How much the expression grows when loop variable `var` grows by one (of `vars`
    /// variables), measured from the all-zero point: exact for affine expressions; 0 for a
    /// variable out of range.
    pub fn coefficient(&self, var: usize, vars: usize) -> i64 {
        let mut point = vec![0i64; vars];
        let base = self.eval(&point);
        match point.get_mut(var) {
            Some(x) => *x = 1,
            None => return 0,
        }
        self.eval(&point) - base
    }

    pub fn uses(&self, var: usize) -> bool {
        let mut v = Vec::new();
        self.collect_vars(&mut v);
        v.contains(&var)
    }

    /// Formats with variable names.
    pub fn display<'a>(&'a self, vars: &'a [LoopVar]) -> impl fmt::Display + 'a {
        DisplayExpr { e: self, vars }
    }
}

struct DisplayExpr<'a> {
    e: &'a Expr,
    vars: &'a [LoopVar],
}

impl fmt::Display for DisplayExpr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let vars = self.vars;
        let sub = move |e| DisplayExpr { e, vars };
        let atom = |e: &Expr| matches!(e, Expr::Const(_) | Expr::Var(_));
        match self.e {
            Expr::Const(c) => write!(f, "{c}"),
            Expr::Var(v) => match self.vars.get(*v) {
                Some(lv) => f.write_str(&lv.name),
                None => write!(f, "v{v}"),
            },
            Expr::Add(a, b) => match **b {
                Expr::Const(c) if c < 0 => write!(f, "{} - {}", sub(a), -c),
                _ => write!(f, "{} + {}", sub(a), sub(b)),
            },
            Expr::Mul(a, c) if atom(a) => write!(f, "{}*{c}", sub(a)),
            Expr::Mul(a, c) => write!(f, "({})*{c}", sub(a)),
            Expr::Div(a, c) if atom(a) => write!(f, "{}/{c}", sub(a)),
            Expr::Div(a, c) => write!(f, "({})/{c}", sub(a)),
            Expr::Mod(a, c) if atom(a) => write!(f, "{}%{c}", sub(a)),
            Expr::Mod(a, c) => write!(f, "({})%{c}", sub(a)),
        }
    }
}

/// `expr < bound`: a guard against the padding a non-dividing split introduces.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Guard {
    pub expr: Expr,
    pub bound: i64,
}

impl Guard {
    pub fn holds(&self, vars: &[i64]) -> bool {
        self.expr.eval(vars) < self.bound
    }
}

/// A loop variable of the program.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LoopVar {
    pub name: String,
    pub extent: u64,
}

/// What a buffer holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BufferRole {
    /// The operator's input `i`.
    Input(usize),
    /// The bias of the epilogue, `i`-th bias.
    Bias(usize),
    Output,
    /// Input `operand` in another layout.
    Packed {
        operand: usize,
    },
    /// A cached copy of input `operand`; `level` 0 is nearest to memory.
    Cache {
        operand: usize,
        level: usize,
    },
    /// The accumulator, in the operator's accumulator dtype.
    Accumulator,
}

/// A buffer: the operator's tensors and every buffer the schedule introduces.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Buffer {
    pub name: String,
    pub shape: Vec<u64>,
    pub dtype: DType,
    pub scope: Scope,
    pub role: BufferRole,
}

impl Buffer {
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }

    pub fn bytes(&self) -> u64 {
        self.elements() * self.dtype.bytes() as u64
    }
}

/// An element of a buffer: `buffers[buffer][index]`. Reads outside the bounds give zero.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BufferRef {
    pub buffer: usize,
    pub index: Vec<Expr>,
}

/// How far the row-major linearised address of `index` (into a buffer of `shape`) moves when
/// loop variable `var` (of `nvars`) grows by one. Saturates instead of overflowing; a `var`
/// outside the variables, or an index deeper than the shape, moves nothing there.
pub fn linear_stride(index: &[Expr], shape: &[u64], var: usize, nvars: usize) -> i64 {
    let mut at = vec![0i64; nvars];
    let base: Vec<i64> = index.iter().map(|e| e.eval(&at)).collect();
    if let Some(v) = at.get_mut(var) {
        *v = 1;
    }
    let mut stride = 0i64;
    let mut row = 1i64;
    for d in (0..index.len()).rev() {
        let moved = index[d].eval(&at).saturating_sub(base[d]);
        stride = stride.saturating_add(moved.saturating_mul(row));
        row = row.saturating_mul(shape.get(d).copied().unwrap_or(1) as i64);
    }
    stride
}

/// How a loop executes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoopKind {
    #[default]
    Serial,
    Parallel,
    Vectorized,
    Unrolled,
    Bound(GpuAxis),
}

/// A loop of the program.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct For {
    pub var: usize,
    pub extent: u64,
    pub kind: LoopKind,
    /// Whether the loop runs over a reduction (its iterations accumulate into the same outputs).
    pub reduction: bool,
    pub pipeline_stages: Option<u32>,
    pub annotations: BTreeMap<String, String>,
    pub body: Box<Stmt>,
}

/// One call of a tensorized instruction.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorizedCall {
    pub intrinsic: String,
    /// The instruction's compute abstraction (a small ComputeOp), so the IR needs no catalog.
    pub semantics: ComputeOp,
    /// `(instruction variable, loop variable)`: the loops the call replaces. Their variables
    /// are not bound by any [`For`]; `operands` and `acc` use them to describe the tiles.
    pub bindings: Vec<(usize, usize)>,
    /// The element of each instruction input (in the instruction's order), as a function of
    /// all loop variables.
    pub operands: Vec<BufferRef>,
    pub acc: BufferRef,
    pub guards: Vec<Guard>,
    /// The trace step that tensorized.
    pub step: usize,
}

impl TensorizedCall {
    /// For instruction input `i` (or the accumulator when `i == operands.len()`): how far each
    /// buffer index moves when instruction variable `u` grows by one, for every `u`. Codegen and
    /// features read row strides and layouts from this.
    pub fn strides(&self, i: usize, vars: &[LoopVar]) -> Vec<Vec<i64>> {
        let r = if i < self.operands.len() {
            &self.operands[i]
        } else {
            &self.acc
        };
        // Differences from the all-zero point: exact for affine indices.
        let base = vec![0i64; vars.len()];
        let at = |vals: &[i64]| -> Vec<i64> { r.index.iter().map(|e| e.eval(vals)).collect() };
        let b = at(&base);
        self.bindings
            .iter()
            .map(|&(_, lv)| {
                let mut p = base.clone();
                p[lv] = 1;
                at(&p).iter().zip(&b).map(|(x, y)| x - y).collect()
            })
            .collect()
    }
}

/// A statement of the lowered program.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stmt {
    Seq(Vec<Stmt>),
    For(For),
    /// `buffer` exists (zero-filled) for the duration of `body`.
    Allocate {
        buffer: usize,
        body: Box<Stmt>,
    },
    /// `dst = 0` (accumulator initialisation).
    Fill {
        dst: BufferRef,
        step: Option<usize>,
    },
    /// `dst = src`, or `dst = 0` where a guard fails (padding).
    Copy {
        dst: BufferRef,
        src: BufferRef,
        guards: Vec<Guard>,
        step: Option<usize>,
    },
    /// `acc += prod(operands)` in the accumulator dtype, where every guard holds.
    Update {
        acc: BufferRef,
        operands: Vec<BufferRef>,
        guards: Vec<Guard>,
    },
    /// `dst = epilogue(acc)` where every guard holds. `point` gives each operator iteration
    /// variable's value (reductions as 0), for the epilogue's bias reads; `biases` are the bias
    /// buffers in epilogue order. With `accumulate` (split-K: blocks each reduce part of a
    /// reduction loop bound to a block axis), `dst += acc` instead, atomically on a GPU; the
    /// output then starts as zeros and the operator has no epilogue.
    Store {
        dst: BufferRef,
        acc: BufferRef,
        point: Vec<Expr>,
        biases: Vec<usize>,
        guards: Vec<Guard>,
        step: Option<usize>,
        accumulate: bool,
    },
    Tensorized(TensorizedCall),
    /// A block-wide barrier (GPU `__syncthreads`), around shared-memory staging.
    Barrier,
}

impl Stmt {
    /// Visits every statement, depth first, parents before children.
    pub fn walk<'a>(&'a self, f: &mut impl FnMut(&'a Stmt)) {
        f(self);
        match self {
            Stmt::Seq(v) => v.iter().for_each(|s| s.walk(f)),
            Stmt::For(l) => l.body.walk(f),
            Stmt::Allocate { body, .. } => body.walk(f),
            _ => {}
        }
    }
}

/// A lowered program: the operator, its loop variables, its buffers and the loop nest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Program {
    pub op: ComputeOp,
    pub vars: Vec<LoopVar>,
    pub buffers: Vec<Buffer>,
    pub body: Stmt,
}

impl Program {
    fn fmt_ref(&self, r: &BufferRef) -> String {
        let idx: Vec<String> = r
            .index
            .iter()
            .map(|e| e.display(&self.vars).to_string())
            .collect();
        let name = self.buffers.get(r.buffer).map_or("?", |b| b.name.as_str());
        format!("{name}[{}]", idx.join(", "))
    }

    fn fmt_guards(&self, g: &[Guard]) -> String {
        if g.is_empty() {
            return String::new();
        }
        let c: Vec<String> = g
            .iter()
            .map(|g| format!("{} < {}", g.expr.display(&self.vars), g.bound))
            .collect();
        format!("if {}: ", c.join(" && "))
    }

    fn fmt_stmt(&self, s: &Stmt, depth: usize, out: &mut String) {
        let pad = "  ".repeat(depth);
        let step = |s: &Option<usize>| s.map_or(String::new(), |s| format!("  # step {s}"));
        match s {
            Stmt::Seq(v) => v.iter().for_each(|s| self.fmt_stmt(s, depth, out)),
            Stmt::For(l) => {
                let kind = match l.kind {
                    LoopKind::Serial => String::new(),
                    LoopKind::Parallel => "parallel ".into(),
                    LoopKind::Vectorized => "vectorized ".into(),
                    LoopKind::Unrolled => "unrolled ".into(),
                    LoopKind::Bound(a) => format!("bind({a}) "),
                };
                let mut extra = String::new();
                if l.reduction {
                    extra.push_str("  # reduction");
                }
                if let Some(p) = l.pipeline_stages {
                    let _ = write!(extra, "  # pipeline {p} stages");
                }
                for (k, v) in &l.annotations {
                    let _ = write!(extra, "  # {k}={v}");
                }
                let _ = writeln!(
                    out,
                    "{pad}{kind}for {} in 0..{}:{extra}",
                    self.vars[l.var].name, l.extent
                );
                self.fmt_stmt(&l.body, depth + 1, out);
            }
            Stmt::Allocate { buffer, body } => {
                let b = &self.buffers[*buffer];
                let _ = writeln!(
                    out,
                    "{pad}alloc {}: {}{:?} in {}",
                    b.name, b.dtype, b.shape, b.scope
                );
                self.fmt_stmt(body, depth, out);
            }
            Stmt::Fill { dst, step: st } => {
                let _ = writeln!(out, "{pad}{} = 0{}", self.fmt_ref(dst), step(st));
            }
            Stmt::Copy {
                dst,
                src,
                guards,
                step: st,
            } => {
                let _ = writeln!(
                    out,
                    "{pad}{}{} = {}{}",
                    self.fmt_guards(guards),
                    self.fmt_ref(dst),
                    self.fmt_ref(src),
                    step(st)
                );
            }
            Stmt::Update {
                acc,
                operands,
                guards,
            } => {
                let ops: Vec<String> = operands.iter().map(|o| self.fmt_ref(o)).collect();
                let _ = writeln!(
                    out,
                    "{pad}{}{} += {}",
                    self.fmt_guards(guards),
                    self.fmt_ref(acc),
                    ops.join(" * ")
                );
            }
            Stmt::Store {
                dst,
                acc,
                guards,
                step: st,
                accumulate,
                ..
            } => {
                let _ = writeln!(
                    out,
                    "{pad}{}{} {} epilogue({}){}",
                    self.fmt_guards(guards),
                    self.fmt_ref(dst),
                    if *accumulate { "+=" } else { "=" },
                    self.fmt_ref(acc),
                    step(st)
                );
            }
            Stmt::Tensorized(c) => {
                let b: Vec<String> = c
                    .bindings
                    .iter()
                    .map(|&(u, v)| {
                        format!("{}={}", c.semantics.iter_vars[u].name, self.vars[v].name)
                    })
                    .collect();
                let ops: Vec<String> = c.operands.iter().map(|o| self.fmt_ref(o)).collect();
                let _ = writeln!(
                    out,
                    "{pad}{}{}({}; {} += {})  # step {}",
                    self.fmt_guards(&c.guards),
                    c.intrinsic,
                    b.join(", "),
                    self.fmt_ref(&c.acc),
                    ops.join(" * "),
                    c.step
                );
            }
            Stmt::Barrier => {
                let _ = writeln!(out, "{pad}barrier()");
            }
        }
    }
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        let _ = writeln!(out, "# {}", self.op);
        self.fmt_stmt(&self.body, 0, &mut out);
        f.write_str(&out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_strides_follow_the_row_major_layout() {
        // W[n, k] of shape [1000, 2048]: n moves a row, k one element, m nothing.
        let (m, n, k) = (0, 1, 2);
        let w = [Expr::Var(n), Expr::Var(k)];
        assert_eq!(linear_stride(&w, &[1000, 2048], n, 3), 2048);
        assert_eq!(linear_stride(&w, &[1000, 2048], k, 3), 1);
        assert_eq!(linear_stride(&w, &[1000, 2048], m, 3), 0);
        // A split variable: n = 20 * n0 + n1.
        let split = [Expr::sum(
            Expr::Mul(Box::new(Expr::Var(0)), 20),
            Expr::Var(1),
        )];
        assert_eq!(linear_stride(&split, &[1000], 0, 2), 20);
        // Out-of-range variables and shapes shorter than the index move nothing there.
        assert_eq!(linear_stride(&w, &[1000, 2048], 7, 3), 0);
        assert_eq!(linear_stride(&w, &[], n, 3), 1);
        // Strides past i64 saturate instead of overflowing.
        let deep = [Expr::Var(0), Expr::Const(0), Expr::Const(0)];
        assert_eq!(linear_stride(&deep, &[2, 1 << 40, 1 << 40], 0, 1), i64::MAX);
    }
}
