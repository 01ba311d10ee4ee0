//! Replaying a [`Trace`] on a [`ComputeOp`] ([`Schedule`]) and lowering it to a [`Program`].

use std::collections::BTreeMap;

use crate::ast::{
    Buffer, BufferRef, BufferRole, Expr, For, Guard, LoopKind, LoopVar, Program, Stmt,
    TensorizedCall,
};
use crate::error::ScheduleError;
use crate::op::{AffineExpr, ComputeOp, Epilogue, IterKind};
use crate::trace::{GpuAxis, IntrinsicResolver, LayoutTransform, Scope, Step, Trace};

/// Largest extent a loop may get from splitting or fusing (keeps index arithmetic in i64).
const MAX_EXTENT: u64 = 1 << 40;

/// A split may pad a loop up to this many iterations even when the loop is shorter: enough
/// for a 1-row decode GEMM on a 16-row AMX tile or a 256-wide wgmma, not for runaway factors.
const MAX_PADDED_INNER: u64 = 4096;

/// How a node of the loop-derivation tree was consumed by a later step.
#[derive(Clone, Debug)]
enum Consumed {
    Split { children: Vec<usize> },
    Fuse { child: usize, parts: Vec<usize> },
}

/// A loop that exists or existed: the operator's variables first, then every split/fuse result.
#[derive(Clone, Debug)]
struct Node {
    name: String,
    extent: u64,
    kind: IterKind,
    consumed: Option<Consumed>,
}

/// A loop of the current nest.
#[derive(Clone, Debug)]
struct LoopState {
    node: usize,
    kind: LoopKind,
    pipeline: Option<u32>,
    annotations: BTreeMap<String, String>,
    tensorized: bool,
    anchored: bool,
}

impl LoopState {
    fn annotated(&self) -> bool {
        self.kind != LoopKind::Serial || self.pipeline.is_some() || !self.annotations.is_empty()
    }
}

#[derive(Clone, Debug)]
struct CacheStage {
    operand: usize,
    scope: Scope,
    at: Option<String>,
    step: usize,
}

#[derive(Clone, Debug)]
struct Tensorization {
    intrinsic: String,
    semantics: ComputeOp,
    /// (instruction variable, loop node)
    bindings: Vec<(usize, usize)>,
    operands: Vec<usize>,
    step: usize,
}

/// An operator with a trace applied: the loop nest and the buffers the trace asked for, not yet
/// lowered. Obtained from [`Trace::apply`].
#[derive(Clone, Debug)]
pub struct Schedule {
    op: ComputeOp,
    nodes: Vec<Node>,
    loops: Vec<LoopState>,
    caches: Vec<CacheStage>,
    packs: Vec<(usize, LayoutTransform, usize)>,
    cache_write: Option<(Scope, Option<String>, usize)>,
    tensorize: Option<Tensorization>,
}

impl Trace {
    /// Replays every step on `op`, validating each; `intrinsics` resolves tensorize steps.
    pub fn apply(
        &self,
        op: &ComputeOp,
        intrinsics: &dyn IntrinsicResolver,
    ) -> Result<Schedule, ScheduleError> {
        let mut s = Schedule::new(op)?;
        for (index, step) in self.steps.iter().enumerate() {
            s.apply_step(index, step, intrinsics)
                .map_err(|reason| ScheduleError::Step {
                    index,
                    step: step.to_string(),
                    reason,
                })?;
        }
        Ok(s)
    }

    /// Replays and lowers in one go.
    pub fn lower(
        &self,
        op: &ComputeOp,
        intrinsics: &dyn IntrinsicResolver,
    ) -> Result<Program, ScheduleError> {
        self.apply(op, intrinsics)?.lower()
    }
}

impl Schedule {
    /// The unscheduled nest: one loop per iteration variable, in declaration order.
    pub fn new(op: &ComputeOp) -> Result<Self, ScheduleError> {
        op.validate()?;
        let nodes: Vec<Node> = op
            .iter_vars
            .iter()
            .map(|v| Node {
                name: v.name.clone(),
                extent: v.extent,
                kind: v.kind,
                consumed: None,
            })
            .collect();
        let loops = (0..nodes.len())
            .map(|node| LoopState {
                node,
                kind: LoopKind::Serial,
                pipeline: None,
                annotations: BTreeMap::new(),
                tensorized: false,
                anchored: false,
            })
            .collect();
        Ok(Schedule {
            op: op.clone(),
            nodes,
            loops,
            caches: Vec::new(),
            packs: Vec::new(),
            cache_write: None,
            tensorize: None,
        })
    }

    pub fn op(&self) -> &ComputeOp {
        &self.op
    }

    /// Names of the current loops, outermost first.
    pub fn loop_names(&self) -> Vec<&str> {
        self.loops
            .iter()
            .map(|l| self.nodes[l.node].name.as_str())
            .collect()
    }

    /// `(name, extent, kind)` of the current loops, outermost first.
    pub fn loops(&self) -> Vec<(&str, u64, IterKind)> {
        self.loops
            .iter()
            .map(|l| {
                let n = &self.nodes[l.node];
                (n.name.as_str(), n.extent, n.kind)
            })
            .collect()
    }

    /// Whether loop `name` is one of the tensorized loops.
    pub fn is_tensorized(&self, name: &str) -> bool {
        self.find(name)
            .map(|p| self.loops[p].tensorized)
            .unwrap_or(false)
    }

    fn find(&self, name: &str) -> Result<usize, String> {
        self.loops
            .iter()
            .position(|l| self.nodes[l.node].name == name)
            .ok_or_else(|| {
                format!(
                    "no loop named `{name}` (loops: {})",
                    self.loop_names().join(", ")
                )
            })
    }

    /// A loop that later steps may still restructure.
    fn find_free(&self, name: &str, what: &str) -> Result<usize, String> {
        let p = self.find(name)?;
        let l = &self.loops[p];
        if l.tensorized {
            return Err(format!("cannot {what} `{name}`: it is tensorized"));
        }
        Ok(p)
    }

    fn find_restructurable(&self, name: &str, what: &str) -> Result<usize, String> {
        let p = self.find_free(name, what)?;
        let l = &self.loops[p];
        if l.anchored {
            return Err(format!(
                "cannot {what} `{name}`: a cache is attached to it (restructure loops before caching)"
            ));
        }
        if l.annotated() {
            return Err(format!(
                "cannot {what} `{name}`: it is annotated (annotate loops after restructuring them)"
            ));
        }
        Ok(p)
    }

    fn new_node(&mut self, name: String, extent: u64, kind: IterKind) -> Result<usize, String> {
        if self.nodes.iter().any(|n| n.name == name) {
            return Err(format!("loop name `{name}` is already taken"));
        }
        if extent > MAX_EXTENT {
            return Err(format!(
                "loop `{name}` would have extent {extent}, too large"
            ));
        }
        self.nodes.push(Node {
            name,
            extent,
            kind,
            consumed: None,
        });
        Ok(self.nodes.len() - 1)
    }

    fn plain_loop(node: usize) -> LoopState {
        LoopState {
            node,
            kind: LoopKind::Serial,
            pipeline: None,
            annotations: BTreeMap::new(),
            tensorized: false,
            anchored: false,
        }
    }

    fn set_kind(&mut self, name: &str, kind: LoopKind, what: &str) -> Result<(), String> {
        let p = self.find_free(name, what)?;
        let n = &self.nodes[self.loops[p].node];
        // A reduction loop may be unrolled, or bound to a block axis (split-K: the blocks
        // each reduce a part and add into the output).
        let block_axis = matches!(
            kind,
            LoopKind::Bound(GpuAxis::BlockX | GpuAxis::BlockY | GpuAxis::BlockZ)
        );
        if n.kind == IterKind::Reduction && kind != LoopKind::Unrolled && !block_axis {
            return Err(format!("cannot {what} reduction loop `{name}`"));
        }
        let current = self.loops[p].kind;
        if current != LoopKind::Serial && current != kind {
            return Err(format!("loop `{name}` is already {current:?}"));
        }
        self.loops[p].kind = kind;
        Ok(())
    }

    fn apply_step(
        &mut self,
        index: usize,
        step: &Step,
        intrinsics: &dyn IntrinsicResolver,
    ) -> Result<(), String> {
        match step {
            Step::Split { target, factors } => {
                let p = self.find_restructurable(target, "split")?;
                if factors.is_empty() {
                    return Err("split needs at least one factor".into());
                }
                if factors.contains(&0) {
                    return Err("split factors must be at least 1".into());
                }
                let inner = factors
                    .iter()
                    .try_fold(1u64, |a, &f| a.checked_mul(f).filter(|&x| x <= MAX_EXTENT))
                    .ok_or("product of split factors is too large")?;
                let parent = self.loops[p].node;
                let (extent, kind) = (self.nodes[parent].extent, self.nodes[parent].kind);
                if inner > extent.max(MAX_PADDED_INNER) {
                    return Err(format!(
                        "split factors multiply to {inner}, far beyond `{target}`'s extent {extent}"
                    ));
                }
                let mut extents = vec![extent.div_ceil(inner)];
                extents.extend(factors);
                let mut children = Vec::new();
                for (i, &e) in extents.iter().enumerate() {
                    children.push(self.new_node(format!("{target}.{i}"), e, kind)?);
                }
                self.nodes[parent].consumed = Some(Consumed::Split {
                    children: children.clone(),
                });
                let new_loops: Vec<LoopState> =
                    children.into_iter().map(Self::plain_loop).collect();
                self.loops.splice(p..=p, new_loops);
            }
            Step::Reorder { order } => {
                let mut positions = Vec::new();
                for name in order {
                    let p = self.find_free(name, "reorder")?;
                    if positions.contains(&p) {
                        return Err(format!("loop `{name}` listed twice"));
                    }
                    positions.push(p);
                }
                let moved: Vec<LoopState> =
                    positions.iter().map(|&p| self.loops[p].clone()).collect();
                positions.sort_unstable();
                for (p, l) in positions.into_iter().zip(moved) {
                    self.loops[p] = l;
                }
            }
            Step::Fuse { loops } => {
                if loops.len() < 2 {
                    return Err("fuse needs at least two loops".into());
                }
                let mut positions = Vec::new();
                for name in loops {
                    positions.push(self.find_restructurable(name, "fuse")?);
                }
                if positions.windows(2).any(|w| w[1] != w[0] + 1) {
                    return Err("fused loops must be adjacent, outermost first".into());
                }
                let parts: Vec<usize> = positions.iter().map(|&p| self.loops[p].node).collect();
                let kind = self.nodes[parts[0]].kind;
                if parts.iter().any(|&n| self.nodes[n].kind != kind) {
                    return Err("cannot fuse spatial and reduction loops".into());
                }
                let extent = parts
                    .iter()
                    .try_fold(1u64, |a, &n| a.checked_mul(self.nodes[n].extent))
                    .ok_or("fused extent is too large")?;
                let child = self.new_node(loops.join("_"), extent, kind)?;
                for &n in &parts {
                    self.nodes[n].consumed = Some(Consumed::Fuse {
                        child,
                        parts: parts.clone(),
                    });
                }
                let first = positions[0];
                self.loops
                    .splice(first..first + parts.len(), [Self::plain_loop(child)]);
            }
            Step::Parallel { target } => {
                self.set_kind(target, LoopKind::Parallel, "parallelise")?
            }
            Step::Vectorize { target } => {
                self.set_kind(target, LoopKind::Vectorized, "vectorize")?
            }
            Step::Unroll { target } => self.set_kind(target, LoopKind::Unrolled, "unroll")?,
            Step::Bind { target, axis } => {
                if self.loops.iter().any(|l| l.kind == LoopKind::Bound(*axis)) {
                    return Err(format!("{axis} is already bound"));
                }
                self.set_kind(target, LoopKind::Bound(*axis), "bind")?
            }
            Step::CacheRead { operand, scope, at } => {
                if *operand >= self.op.inputs.len() {
                    return Err(format!(
                        "the operator has {} inputs, no input {operand}",
                        self.op.inputs.len()
                    ));
                }
                if let Some(name) = at {
                    let p = self.find_free(name, "attach a cache to")?;
                    self.loops[p].anchored = true;
                }
                self.caches.push(CacheStage {
                    operand: *operand,
                    scope: scope.clone(),
                    at: at.clone(),
                    step: index,
                });
            }
            Step::CacheWrite { scope, at } => {
                if self.cache_write.is_some() {
                    return Err("the accumulator is already cached".into());
                }
                if let Some(name) = at {
                    let p = self.find_free(name, "attach the accumulator to")?;
                    // (A reduction loop already bound to a block axis is split-K.)
                    if let Some(r) = self.loops[..=p].iter().find(|l| {
                        self.nodes[l.node].kind == IterKind::Reduction
                            && !matches!(
                                l.kind,
                                LoopKind::Bound(
                                    GpuAxis::BlockX | GpuAxis::BlockY | GpuAxis::BlockZ
                                )
                            )
                    }) {
                        return Err(format!(
                            "reduction loop `{}` is not inside `{name}`",
                            self.nodes[r.node].name
                        ));
                    }
                    self.loops[p].anchored = true;
                }
                self.cache_write = Some((scope.clone(), at.clone(), index));
            }
            Step::Pack { operand, layout } => {
                let Some(input) = self.op.inputs.get(*operand) else {
                    return Err(format!("the operator has no input {operand}"));
                };
                if self.packs.iter().any(|(o, _, _)| o == operand) {
                    return Err(format!("input {operand} is already packed"));
                }
                if self.caches.iter().any(|c| c.operand == *operand) {
                    return Err(format!("pack input {operand} before caching it"));
                }
                layout.packed_shape(&input.tensor.shape)?;
                self.packs.push((*operand, layout.clone(), index));
            }
            Step::Tensorize {
                intrinsic,
                bindings,
                operands,
            } => self.tensorize_step(index, intrinsic, bindings, operands, intrinsics)?,
            Step::Pipeline { target, stages } => {
                let p = self.find_free(target, "pipeline")?;
                if !(1..=16).contains(stages) {
                    return Err(format!("pipeline stages must be 1..=16, got {stages}"));
                }
                self.loops[p].pipeline = Some(*stages);
            }
            Step::Annotate { target, key, value } => {
                let p = self.find(target)?;
                if key.is_empty() {
                    return Err("annotation key is empty".into());
                }
                self.loops[p].annotations.insert(key.clone(), value.clone());
            }
        }
        Ok(())
    }

    fn tensorize_step(
        &mut self,
        index: usize,
        intrinsic: &str,
        bindings: &[(String, String)],
        operands: &[usize],
        intrinsics: &dyn IntrinsicResolver,
    ) -> Result<(), String> {
        if self.tensorize.is_some() {
            return Err("the nest is already tensorized".into());
        }
        let sem = intrinsics
            .resolve(intrinsic)
            .ok_or_else(|| format!("unknown intrinsic `{intrinsic}`"))?;
        sem.validate().map_err(|e| e.to_string())?;
        if bindings.len() != sem.iter_vars.len() {
            return Err(format!(
                "`{intrinsic}` has {} iteration variables, {} bound",
                sem.iter_vars.len(),
                bindings.len()
            ));
        }
        let mut bound = Vec::new();
        for (ivar, lname) in bindings {
            let u = sem
                .var_index(ivar)
                .ok_or_else(|| format!("`{intrinsic}` has no iteration variable `{ivar}`"))?;
            if bound.iter().any(|&(b, _)| b == u) {
                return Err(format!("`{ivar}` bound twice"));
            }
            let p = self.find_free(lname, "tensorize")?;
            if bound.iter().any(|&(_, q)| q == p) {
                return Err(format!("loop `{lname}` bound twice"));
            }
            let (node, l) = (&self.nodes[self.loops[p].node], &self.loops[p]);
            let iv = &sem.iter_vars[u];
            if node.extent != iv.extent || node.kind != iv.kind {
                return Err(format!(
                    "loop `{lname}` ({:?}, extent {}) does not match `{ivar}` ({:?}, extent {})",
                    node.kind, node.extent, iv.kind, iv.extent
                ));
            }
            if l.anchored || l.annotated() {
                return Err(format!(
                    "loop `{lname}` carries a cache or an annotation and cannot be tensorized"
                ));
            }
            bound.push((u, p));
        }
        let n = self.loops.len();
        if bound.iter().any(|&(_, p)| p < n - bound.len()) {
            return Err("tensorized loops must be the innermost loops".into());
        }
        if operands.len() != sem.inputs.len() || operands.len() != self.op.inputs.len() {
            return Err(format!(
                "`{intrinsic}` takes {} inputs, the operator has {}, operands {operands:?}",
                sem.inputs.len(),
                self.op.inputs.len()
            ));
        }
        for (i, &o) in operands.iter().enumerate() {
            if o >= self.op.inputs.len() || operands[..i].contains(&o) {
                return Err(format!(
                    "operands {operands:?} is not a permutation of the inputs"
                ));
            }
        }
        if sem.accumulator != self.op.accumulator {
            return Err(format!(
                "`{intrinsic}` accumulates in {}, the operator in {}",
                sem.accumulator, self.op.accumulator
            ));
        }
        // Every instruction operand must be fed by an operator operand that varies with exactly
        // the loops bound to the instruction variables that index it.
        for (i, &o) in operands.iter().enumerate() {
            let input = &self.op.inputs[o];
            if sem.inputs[i].tensor.dtype != input.tensor.dtype {
                return Err(format!(
                    "`{intrinsic}` input {i} is {}, operator input `{}` is {}",
                    sem.inputs[i].tensor.dtype, input.tensor.name, input.tensor.dtype
                ));
            }
            for &(u, p) in &bound {
                let want = sem.inputs[i].depends_on(u);
                let node = self.loops[p].node;
                let got = (0..self.op.iter_vars.len())
                    .any(|v| input.depends_on(v) && self.leaves(v).contains(&node));
                if want != got {
                    return Err(format!(
                        "`{intrinsic}` input {i} {} `{}`, but operator input `{}` {} loop `{}`",
                        if want {
                            "depends on"
                        } else {
                            "does not depend on"
                        },
                        sem.iter_vars[u].name,
                        input.tensor.name,
                        if got {
                            "depends on"
                        } else {
                            "does not depend on"
                        },
                        self.nodes[node].name
                    ));
                }
            }
        }
        for &(_, p) in &bound {
            self.loops[p].tensorized = true;
        }
        self.tensorize = Some(Tensorization {
            intrinsic: intrinsic.to_string(),
            bindings: bound
                .iter()
                .map(|&(u, p)| (u, self.loops[p].node))
                .collect(),
            semantics: sem,
            operands: operands.to_vec(),
            step: index,
        });
        Ok(())
    }

    /// The current loops derived from `node`.
    fn leaves(&self, node: usize) -> Vec<usize> {
        match &self.nodes[node].consumed {
            None => vec![node],
            Some(Consumed::Split { children }) => {
                children.iter().flat_map(|&c| self.leaves(c)).collect()
            }
            Some(Consumed::Fuse { child, .. }) => self.leaves(*child),
        }
    }

    /// The value of `node` as an expression over the current loops' variables.
    fn value_of(&self, node: usize, loop_var: &[Option<usize>]) -> Expr {
        match &self.nodes[node].consumed {
            None => Expr::Var(loop_var[node].unwrap_or(usize::MAX)),
            Some(Consumed::Split { children }) => {
                let mut stride: i64 = 1;
                let mut terms = Vec::new();
                for &c in children.iter().rev() {
                    terms.push(Expr::scaled(self.value_of(c, loop_var), stride));
                    stride *= self.nodes[c].extent as i64;
                }
                terms.into_iter().rev().fold(Expr::Const(0), Expr::sum)
            }
            Some(Consumed::Fuse { child, parts }) => {
                let pos = parts.iter().position(|&p| p == node).unwrap_or(0);
                let inner: u64 = parts[pos + 1..]
                    .iter()
                    .map(|&p| self.nodes[p].extent)
                    .product();
                let v = Expr::floor_div(self.value_of(*child, loop_var), inner as i64);
                if pos == 0 {
                    v
                } else {
                    Expr::floor_mod(v, self.nodes[node].extent as i64)
                }
            }
        }
    }

    /// Guards of the padded splits in `node`'s derivation tree.
    fn guards_of(&self, node: usize, loop_var: &[Option<usize>], out: &mut Vec<Guard>) {
        match &self.nodes[node].consumed {
            None => {}
            Some(Consumed::Split { children }) => {
                let covered: u64 = children.iter().map(|&c| self.nodes[c].extent).product();
                if covered > self.nodes[node].extent {
                    let g = Guard {
                        expr: self.value_of(node, loop_var),
                        bound: self.nodes[node].extent as i64,
                    };
                    if !out.contains(&g) {
                        out.push(g);
                    }
                }
                for &c in children {
                    self.guards_of(c, loop_var, out);
                }
            }
            Some(Consumed::Fuse { child, .. }) => self.guards_of(*child, loop_var, out),
        }
    }

    fn anchor(&self, at: &Option<String>, what: &str) -> Result<usize, ScheduleError> {
        match at {
            None => Ok(0),
            Some(name) => self
                .find(name)
                .map(|p| p + 1)
                .map_err(|e| ScheduleError::Lower {
                    reason: format!("{what}: {e}"),
                }),
        }
    }

    /// Lowers to a loop-nest program. Checks what only the final nest can tell: vectorized
    /// loops innermost, the accumulator's anchor outside every reduction loop, caches of one
    /// operand attached outermost first.
    pub fn lower(&self) -> Result<Program, ScheduleError> {
        let op = &self.op;
        let lower_err = |reason: String| ScheduleError::Lower { reason };
        let n = self.loops.len();
        let n_tensorized = self.loops.iter().filter(|l| l.tensorized).count();
        let t0 = n - n_tensorized;

        let mut vars: Vec<LoopVar> = self
            .loops
            .iter()
            .map(|l| LoopVar {
                name: self.nodes[l.node].name.clone(),
                extent: self.nodes[l.node].extent,
            })
            .collect();
        let mut loop_var = vec![None; self.nodes.len()];
        for (j, l) in self.loops.iter().enumerate() {
            loop_var[l.node] = Some(j);
        }
        for (j, l) in self.loops.iter().enumerate() {
            if l.kind == LoopKind::Vectorized && j + 1 != t0 {
                return Err(lower_err(format!(
                    "vectorized loop `{}` is not the innermost loop",
                    vars[j].name
                )));
            }
        }
        let var_expr: Vec<Expr> = (0..op.iter_vars.len())
            .map(|v| self.value_of(v, &loop_var))
            .collect();
        let var_guards: Vec<Vec<Guard>> = (0..op.iter_vars.len())
            .map(|v| {
                let mut g = Vec::new();
                self.guards_of(v, &loop_var, &mut g);
                g
            })
            .collect();
        let guards_for = |vs: &mut dyn Iterator<Item = usize>| {
            let mut g: Vec<Guard> = Vec::new();
            for v in vs {
                for x in &var_guards[v] {
                    if !g.contains(x) {
                        g.push(x.clone());
                    }
                }
            }
            g
        };
        let to_expr = |a: &AffineExpr| {
            let sum = a.terms.iter().fold(Expr::Const(0), |e, &(v, c)| {
                Expr::sum(e, Expr::scaled(var_expr[v].clone(), c))
            });
            Expr::sum(sum, Expr::Const(a.constant))
        };

        // The operator's own tensors.
        let global = Scope::global();
        let mut buffers: Vec<Buffer> = Vec::new();
        let mut tensor_buffer = |t: &crate::op::TensorDecl, role: BufferRole| {
            buffers.push(Buffer {
                name: t.name.clone(),
                shape: t.shape.clone(),
                dtype: t.dtype,
                scope: global.clone(),
                role,
            });
            buffers.len() - 1
        };
        for (i, o) in op.inputs.iter().enumerate() {
            tensor_buffer(&o.tensor, BufferRole::Input(i));
        }
        let mut biases = Vec::new();
        for e in &op.epilogue {
            if let Epilogue::Bias(b) = e {
                let i = biases.len();
                biases.push(tensor_buffer(&b.tensor, BufferRole::Bias(i)));
            }
        }
        let output = tensor_buffer(&op.output.tensor, BufferRole::Output);

        // Statements attached at each anchor (0 = root, j+1 = inside loop j), and allocations.
        let mut attached: Vec<Vec<Stmt>> = vec![Vec::new(); t0 + 1];
        let mut allocs: Vec<Vec<usize>> = vec![Vec::new(); t0 + 1];
        let nest = |loops: &[usize], body: Stmt| {
            loops.iter().rev().fold(body, |b, &j| {
                let l = &self.loops[j];
                Stmt::For(For {
                    var: j,
                    extent: self.nodes[l.node].extent,
                    kind: if l.tensorized {
                        LoopKind::Serial
                    } else {
                        l.kind
                    },
                    reduction: self.nodes[l.node].kind == IterKind::Reduction,
                    pipeline_stages: None,
                    annotations: BTreeMap::new(),
                    body: Box::new(b),
                })
            })
        };

        // Each input's read path: (packed) tensor -> caches, outermost first.
        let mut reads: Vec<BufferRef> = Vec::new();
        for (o, input) in op.inputs.iter().enumerate() {
            let index: Vec<Expr> = input.indices.iter().map(to_expr).collect();
            let mut cur = BufferRef { buffer: o, index };
            if let Some((_, layout, step)) = self.packs.iter().find(|(p, _, _)| *p == o) {
                let shape = layout
                    .packed_shape(&input.tensor.shape)
                    .map_err(lower_err)?;
                buffers.push(Buffer {
                    name: format!("{}_packed", input.tensor.name),
                    shape: shape.clone(),
                    dtype: input.tensor.dtype,
                    scope: Scope::global(),
                    role: BufferRole::Packed { operand: o },
                });
                let pb = buffers.len() - 1;
                let first_var = vars.len();
                for (d, &e) in shape.iter().enumerate() {
                    vars.push(LoopVar {
                        name: format!("{}_packed.{d}", input.tensor.name),
                        extent: e,
                    });
                }
                let (forward, inverse) =
                    layout_maps(layout, &cur.index, input.tensor.shape.len(), first_var);
                let copy = Stmt::Copy {
                    dst: BufferRef {
                        buffer: pb,
                        index: (0..shape.len()).map(|d| Expr::Var(first_var + d)).collect(),
                    },
                    src: BufferRef {
                        buffer: o,
                        index: inverse,
                    },
                    guards: Vec::new(),
                    step: Some(*step),
                };
                let pack_nest = shape.iter().enumerate().rev().fold(copy, |b, (d, &e)| {
                    Stmt::For(For {
                        var: first_var + d,
                        extent: e,
                        kind: LoopKind::Serial,
                        reduction: false,
                        pipeline_stages: None,
                        annotations: BTreeMap::new(),
                        body: Box::new(b),
                    })
                });
                attached[0].push(pack_nest);
                allocs[0].push(pb);
                cur = BufferRef {
                    buffer: pb,
                    index: forward,
                };
            }
            let read_guards =
                guards_for(&mut (0..op.iter_vars.len()).filter(|&v| input.depends_on(v)));
            let mut last_anchor = 0;
            for (level, c) in self.caches.iter().filter(|c| c.operand == o).enumerate() {
                let a = self.anchor(&c.at, &format!("cache_read at step {}", c.step))?;
                if a > t0 {
                    return Err(lower_err(format!(
                        "cache_read at step {} is attached inside the tensorized loops",
                        c.step
                    )));
                }
                if a < last_anchor {
                    return Err(lower_err(format!(
                        "cache_read at step {} is attached outside an earlier cache of input {o}",
                        c.step
                    )));
                }
                last_anchor = a;
                // A shared cache is the block's: it also spans the warp and thread loops
                // outside its anchor (as TVM relaxes thread-bound loops for shared scope), so
                // the block's threads fill it together and each reads its own part.
                let shared = c.scope.as_str() == "shared";
                let copy_loops: Vec<usize> = (0..n)
                    .filter(|&j| j >= a || (shared && is_thread_level(self.loops[j].kind)))
                    .filter(|&j| cur.index.iter().any(|e| e.uses(j)))
                    .collect();
                buffers.push(Buffer {
                    name: format!(
                        "{}_{}{level}",
                        input.tensor.name,
                        c.scope.as_str().replace('.', "_")
                    ),
                    shape: copy_loops.iter().map(|&j| vars[j].extent).collect(),
                    dtype: input.tensor.dtype,
                    scope: c.scope.clone(),
                    role: BufferRole::Cache { operand: o, level },
                });
                let cb = buffers.len() - 1;
                let dst = BufferRef {
                    buffer: cb,
                    index: copy_loops.iter().map(|&j| Expr::Var(j)).collect(),
                };
                let mut copy = nest(
                    &copy_loops,
                    Stmt::Copy {
                        dst: dst.clone(),
                        src: cur,
                        guards: read_guards.clone(),
                        step: Some(c.step),
                    },
                );
                // The spanned thread loops are walked serially by the copy: one axis is never
                // bound twice on a path.
                let mut l = &mut copy;
                while let Stmt::For(f) = l {
                    if f.var < a {
                        f.kind = LoopKind::Serial;
                    }
                    l = &mut f.body;
                }
                if shared {
                    attached[a].extend([Stmt::Barrier, copy, Stmt::Barrier]);
                } else {
                    attached[a].push(copy);
                }
                allocs[a].push(cb);
                cur = dst;
            }
            reads.push(cur);
        }

        // The accumulator, dense over the spatial loops inside its anchor.
        let (acc_scope, acc_at, acc_step) = match &self.cache_write {
            Some((s, at, step)) => (s.clone(), at.clone(), Some(*step)),
            None => (Scope::global(), None, None),
        };
        let a_acc = self.anchor(&acc_at, "cache_write")?;
        if a_acc > t0 {
            return Err(lower_err(
                "cache_write is attached inside the tensorized loops".into(),
            ));
        }
        // Reduction loops outside the accumulator are split-K: bound to blocks, whose partial
        // sums add into the output.
        let mut split_k = false;
        for j in (0..a_acc).filter(|&j| self.nodes[self.loops[j].node].kind == IterKind::Reduction)
        {
            if !matches!(
                self.loops[j].kind,
                LoopKind::Bound(GpuAxis::BlockX | GpuAxis::BlockY | GpuAxis::BlockZ)
            ) {
                return Err(lower_err(format!(
                    "reduction loop `{}` is outside the accumulator's anchor `{}`",
                    vars[j].name,
                    acc_at.clone().unwrap_or_default()
                )));
            }
            split_k = true;
        }
        if let Some(j) = (a_acc..n).find(|&j| {
            self.nodes[self.loops[j].node].kind == IterKind::Reduction
                && matches!(self.loops[j].kind, LoopKind::Bound(_))
        }) {
            return Err(lower_err(format!(
                "reduction loop `{}` is bound to a block axis inside the accumulator's anchor: each block would keep its own partial sum; attach the accumulator inside it",
                vars[j].name
            )));
        }
        if split_k && (!op.epilogue.is_empty() || op.output.tensor.dtype != op.accumulator) {
            return Err(lower_err(
                "split-K (a reduction loop bound to a block axis) adds partial sums into the output: it needs an output in the accumulator's type and no epilogue".into(),
            ));
        }
        let acc_loops: Vec<usize> = (a_acc..n)
            .filter(|&j| self.nodes[self.loops[j].node].kind == IterKind::Spatial)
            .collect();
        buffers.push(Buffer {
            name: "acc".into(),
            shape: acc_loops.iter().map(|&j| vars[j].extent).collect(),
            dtype: op.accumulator,
            scope: acc_scope,
            role: BufferRole::Accumulator,
        });
        let acc = buffers.len() - 1;
        allocs[a_acc].push(acc);
        let acc_ref = BufferRef {
            buffer: acc,
            index: acc_loops.iter().map(|&j| Expr::Var(j)).collect(),
        };
        let spatial_guards = guards_for(&mut op.spatial_vars());
        let all_guards = guards_for(&mut (0..op.iter_vars.len()));
        let init = nest(
            &acc_loops,
            Stmt::Fill {
                dst: acc_ref.clone(),
                step: acc_step,
            },
        );
        let store = nest(
            &acc_loops,
            Stmt::Store {
                dst: BufferRef {
                    buffer: output,
                    index: op.output.indices.iter().map(to_expr).collect(),
                },
                acc: acc_ref.clone(),
                point: (0..op.iter_vars.len())
                    .map(|v| match op.iter_vars[v].kind {
                        IterKind::Spatial => var_expr[v].clone(),
                        IterKind::Reduction => Expr::Const(0),
                    })
                    .collect(),
                biases: biases.clone(),
                guards: spatial_guards,
                step: acc_step,
                accumulate: split_k,
            },
        );

        let compute = match &self.tensorize {
            Some(t) => Stmt::Tensorized(TensorizedCall {
                intrinsic: t.intrinsic.clone(),
                semantics: t.semantics.clone(),
                bindings: t
                    .bindings
                    .iter()
                    .map(|&(u, node)| (u, loop_var[node].unwrap_or(usize::MAX)))
                    .collect(),
                operands: t.operands.iter().map(|&o| reads[o].clone()).collect(),
                acc: acc_ref.clone(),
                guards: all_guards,
                step: t.step,
            }),
            None => Stmt::Update {
                acc: acc_ref,
                operands: reads,
                guards: all_guards,
            },
        };

        // Assemble from the innermost anchor outwards.
        let mut inner = compute;
        for a in (0..=t0).rev() {
            let mut seq = Vec::new();
            if a == a_acc {
                seq.push(init.clone());
            }
            seq.append(&mut attached[a]);
            seq.push(inner);
            if a == a_acc {
                seq.push(store.clone());
            }
            let mut body = if seq.len() == 1 {
                seq.pop().unwrap_or(Stmt::Seq(Vec::new()))
            } else {
                Stmt::Seq(seq)
            };
            for &b in allocs[a].iter().rev() {
                body = Stmt::Allocate {
                    buffer: b,
                    body: Box::new(body),
                };
            }
            inner = if a == 0 {
                body
            } else {
                let j = a - 1;
                let l = &self.loops[j];
                Stmt::For(For {
                    var: j,
                    extent: self.nodes[l.node].extent,
                    kind: l.kind,
                    reduction: self.nodes[l.node].kind == IterKind::Reduction,
                    pipeline_stages: l.pipeline,
                    annotations: l.annotations.clone(),
                    body: Box::new(body),
                })
            };
        }
        Ok(Program {
            op: op.clone(),
            vars,
            buffers,
            body: inner,
        })
    }
}

/// Loops whose iterations run on different threads of one block.
fn is_thread_level(kind: LoopKind) -> bool {
    matches!(
        kind,
        LoopKind::Bound(GpuAxis::Warp | GpuAxis::ThreadX | GpuAxis::ThreadY | GpuAxis::ThreadZ)
    )
}

/// For a layout transform: the packed buffer's index given the original index expressions
/// (forward), and the original tensor's index given the packed buffer's loop variables
/// `first_var..` (inverse).
fn layout_maps(
    layout: &LayoutTransform,
    original: &[Expr],
    rank: usize,
    first_var: usize,
) -> (Vec<Expr>, Vec<Expr>) {
    // Expanded dimensions: (original dim, None | Some((factor, is_inner))).
    let mut expanded: Vec<(usize, Option<(u64, bool)>)> = Vec::new();
    for d in 0..rank {
        match layout.splits.iter().find(|(sd, _)| *sd == d) {
            Some(&(_, f)) => {
                expanded.push((d, Some((f, false))));
                expanded.push((d, Some((f, true))));
            }
            None => expanded.push((d, None)),
        }
    }
    let forward = layout
        .order
        .iter()
        .map(|&e| {
            let (d, part) = expanded[e];
            match part {
                None => original[d].clone(),
                Some((f, false)) => Expr::floor_div(original[d].clone(), f as i64),
                Some((f, true)) => Expr::floor_mod(original[d].clone(), f as i64),
            }
        })
        .collect();
    // Packed dimension p is expanded dimension order[p]; its loop variable is first_var + p.
    let var_of = |e: usize| {
        let p = layout.order.iter().position(|&x| x == e).unwrap_or(0);
        Expr::Var(first_var + p)
    };
    let mut inverse = Vec::new();
    for d in 0..rank {
        let outer = expanded.iter().position(|&(od, _)| od == d).unwrap_or(0);
        inverse.push(match expanded[outer].1 {
            None => var_of(outer),
            Some((f, _)) => Expr::sum(Expr::scaled(var_of(outer), f as i64), var_of(outer + 1)),
        });
    }
    (forward, inverse)
}
