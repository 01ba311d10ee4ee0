//! Replaying a [`Trace`] on a [`ComputeOp`] ([`Schedule`]) and lowering it to a [`Program`].

use std::collections::BTreeMap;

use crate::ast::{
    Buffer, BufferRef, BufferRole, Expr, For, Guard, LoopKind, LoopVar, Program, Stmt,
    TensorizedCall,
};
use crate::dtype::DType;
use crate::error::ScheduleError;
use crate::op::{AffineExpr, ComputeOp, Epilogue, IterKind};
use crate::trace::{GpuAxis, IntrinsicResolver, LayoutTransform, Scope, Step, Trace};

mod lower;

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
    /// `(input, step)`: inputs copied padded at the root.
    pub(crate) pads: Vec<(usize, usize)>,
    /// Inputs converted on their root copy: (input, type, step).
    casts: Vec<(usize, DType, usize)>,
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
            pads: Vec::new(),
            casts: Vec::new(),
            cache_write: None,
            tensorize: None,
        })
    }

    /// Input `operand`, for a step (pack, cast: `verb` and its participle) that rewrites its
    /// root copy, which every cache of it then reads: it must exist, not have had the step
    /// (`done`), and have no cache yet.
    fn root_copy_input(
        &self,
        operand: usize,
        (verb, participle): (&str, &str),
        done: bool,
    ) -> Result<&crate::op::Operand, String> {
        let Some(input) = self.op.inputs.get(operand) else {
            return Err(format!("the operator has no input {operand}"));
        };
        if done {
            return Err(format!("input {operand} is already {participle}"));
        }
        if self.caches.iter().any(|c| c.operand == operand) {
            return Err(format!("{verb} input {operand} before caching it"));
        }
        Ok(input)
    }

    /// The element type input `o` reaches the computation in: its cast, else its own.
    pub fn input_dtype(&self, o: usize) -> DType {
        self.casts
            .iter()
            .find(|(i, _, _)| *i == o)
            .map_or(self.op.inputs[o].tensor.dtype, |c| c.1)
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
            Step::Pad { operand } => {
                let padded = self.pads.iter().any(|(o, _)| o == operand);
                self.root_copy_input(*operand, ("pad", "padded"), padded)?;
                if self.packs.iter().any(|(o, _, _)| o == operand) {
                    return Err(format!(
                        "input {operand} is packed; pad it or pack it, not both"
                    ));
                }
                self.pads.push((*operand, index));
            }
            Step::Pack { operand, layout } => {
                if self.pads.iter().any(|(o, _)| o == operand) {
                    return Err(format!(
                        "input {operand} is padded; pad it or pack it, not both"
                    ));
                }
                let packed = self.packs.iter().any(|(o, _, _)| o == operand);
                let input = self.root_copy_input(*operand, ("pack", "packed"), packed)?;
                layout.packed_shape(&input.tensor.shape)?;
                self.packs.push((*operand, layout.clone(), index));
            }
            Step::Cast { operand, dtype } => {
                let cast = self.casts.iter().any(|(o, _, _)| o == operand);
                let input = self.root_copy_input(*operand, ("cast", "cast"), cast)?;
                let from = input.tensor.dtype;
                if !from.widens_exactly_to(*dtype) {
                    return Err(format!(
                        "input {operand} is {from}, which does not widen exactly to {dtype}"
                    ));
                }
                self.casts.push((*operand, *dtype, index));
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
        let mut sem = intrinsics
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
            // A shorter loop is a partial tile, where the instruction allows one.
            let fewer = node.extent < iv.extent && intrinsics.accepts_fewer(intrinsic, ivar);
            if (node.extent != iv.extent && !fewer) || node.extent == 0 || node.kind != iv.kind {
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
            let dtype = self.input_dtype(o);
            if sem.inputs[i].tensor.dtype != dtype {
                return Err(format!(
                    "`{intrinsic}` input {i} is {}, operator input `{}` is {dtype}",
                    sem.inputs[i].tensor.dtype, input.tensor.name
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
        // The call's semantics describe the tile it really computes: a partial tile's
        // variable, and the operand dimensions it alone indexes, shrink to the loop's extent.
        for &(u, p) in &bound {
            let extent = self.nodes[self.loops[p].node].extent;
            if extent < sem.iter_vars[u].extent {
                sem.iter_vars[u].extent = extent;
                for o in sem
                    .inputs
                    .iter_mut()
                    .chain(std::iter::once(&mut sem.output))
                {
                    for (d, e) in o.indices.iter().enumerate() {
                        if e.terms == [(u, 1)] && e.constant == 0 {
                            o.tensor.shape[d] = extent;
                        }
                    }
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
}
