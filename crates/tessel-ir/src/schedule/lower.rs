//! `Schedule::lower`: the replayed nest to a loop-nest [`Program`], in named phases:
//!
//! 1. [`Lowering::new`]: one loop variable per loop; vectorized loops must be innermost;
//!    each operator variable as an expression of the loops, with its padding guards.
//! 2. [`Lowering::tensors`]: the operator's inputs, biases and output.
//! 3. [`Lowering::read_path`], per input: the packed copy (at the root) and every cache,
//!    outermost first, each attached at its anchor.
//! 4. [`Lowering::accumulator`]: its anchor, split-K, its fill and the store.
//! 5. [`Lowering::compute`]: the tensorized call or the scalar update.
//! 6. [`Lowering::assemble`]: anchors from the innermost outwards, allocations around them.

use super::*;

impl Schedule {
    /// Lowers to a loop-nest program. Checks what only the final nest can tell: vectorized
    /// loops innermost, the accumulator's anchor outside every reduction loop, caches of one
    /// operand attached outermost first.
    pub fn lower(&self) -> Result<Program, ScheduleError> {
        let mut l = Lowering::new(self)?;
        let tensors = l.tensors();
        let mut reads = Vec::with_capacity(self.op.inputs.len());
        for o in 0..self.op.inputs.len() {
            reads.push(l.read_path(o)?);
        }
        let acc = l.accumulator(&tensors)?;
        let compute = l.compute(reads, &acc.at);
        Ok(l.assemble(compute, acc))
    }
}

fn lower_err(reason: String) -> ScheduleError {
    ScheduleError::Lower { reason }
}

/// What the phases share.
struct Lowering<'s> {
    s: &'s Schedule,
    op: &'s ComputeOp,
    /// Loops in the nest.
    n: usize,
    /// The first tensorized loop (loops `t0..n` are the instruction's).
    t0: usize,
    vars: Vec<LoopVar>,
    /// The loop variable of each derivation node still in the nest.
    loop_var: Vec<Option<usize>>,
    /// Each operator variable as an expression of the loop variables.
    var_expr: Vec<Expr>,
    /// Each operator variable's padding guards.
    var_guards: Vec<Vec<Guard>>,
    buffers: Vec<Buffer>,
    /// Statements attached at each anchor (0 = root, j+1 = inside loop j).
    attached: Vec<Vec<Stmt>>,
    /// Buffers allocated at each anchor.
    allocs: Vec<Vec<usize>>,
}

/// The operator's own buffers.
struct Tensors {
    biases: Vec<usize>,
    output: usize,
}

/// The accumulator: where it lives, how it is indexed, and its fill and store nests.
struct Accumulator {
    anchor: usize,
    at: BufferRef,
    init: Stmt,
    store: Stmt,
}

impl<'s> Lowering<'s> {
    fn new(s: &'s Schedule) -> Result<Self, ScheduleError> {
        let op = &s.op;
        let n = s.loops.len();
        let t0 = n - s.loops.iter().filter(|l| l.tensorized).count();
        let vars: Vec<LoopVar> = s
            .loops
            .iter()
            .map(|l| LoopVar {
                name: s.nodes[l.node].name.clone(),
                extent: s.nodes[l.node].extent,
            })
            .collect();
        let mut loop_var = vec![None; s.nodes.len()];
        for (j, l) in s.loops.iter().enumerate() {
            loop_var[l.node] = Some(j);
        }
        for (j, l) in s.loops.iter().enumerate() {
            if l.kind == LoopKind::Vectorized && j + 1 != t0 {
                return Err(lower_err(format!(
                    "vectorized loop `{}` is not the innermost loop",
                    vars[j].name
                )));
            }
        }
        let var_expr = (0..op.iter_vars.len())
            .map(|v| s.value_of(v, &loop_var))
            .collect();
        let var_guards = (0..op.iter_vars.len())
            .map(|v| {
                let mut g = Vec::new();
                s.guards_of(v, &loop_var, &mut g);
                g
            })
            .collect();
        Ok(Lowering {
            s,
            op,
            n,
            t0,
            vars,
            loop_var,
            var_expr,
            var_guards,
            buffers: Vec::new(),
            attached: vec![Vec::new(); t0 + 1],
            allocs: vec![Vec::new(); t0 + 1],
        })
    }

    /// The guards of these operator variables, each once.
    fn guards_for(&self, vs: impl Iterator<Item = usize>) -> Vec<Guard> {
        let mut g: Vec<Guard> = Vec::new();
        for v in vs {
            for x in &self.var_guards[v] {
                if !g.contains(x) {
                    g.push(x.clone());
                }
            }
        }
        g
    }

    /// An affine index of the operator as an expression of the loops.
    fn to_expr(&self, a: &AffineExpr) -> Expr {
        let sum = a.terms.iter().fold(Expr::Const(0), |e, &(v, c)| {
            Expr::sum(e, Expr::scaled(self.var_expr[v].clone(), c))
        });
        Expr::sum(sum, Expr::Const(a.constant))
    }

    /// `body` inside these loops (outermost first); tensorized loops become serial.
    fn nest(&self, loops: &[usize], body: Stmt) -> Stmt {
        loops.iter().rev().fold(body, |b, &j| {
            let l = &self.s.loops[j];
            Stmt::For(For {
                var: j,
                extent: self.s.nodes[l.node].extent,
                kind: if l.tensorized {
                    LoopKind::Serial
                } else {
                    l.kind
                },
                reduction: self.s.nodes[l.node].kind == IterKind::Reduction,
                pipeline_stages: None,
                annotations: BTreeMap::new(),
                body: Box::new(b),
            })
        })
    }

    fn add_buffer(&mut self, b: Buffer) -> usize {
        self.buffers.push(b);
        self.buffers.len() - 1
    }

    /// The operator's inputs (buffers `0..inputs`), biases and output, in global memory.
    fn tensors(&mut self) -> Tensors {
        let op = self.op;
        let mut tensor_buffer = |t: &crate::op::TensorDecl, role: BufferRole| {
            self.add_buffer(Buffer {
                name: t.name.clone(),
                shape: t.shape.clone(),
                dtype: t.dtype,
                scope: Scope::global(),
                role,
            })
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
        Tensors { biases, output }
    }

    /// Input `o`'s read path: the (packed) tensor, then its caches outermost first. Returns
    /// what the compute reads.
    fn read_path(&mut self, o: usize) -> Result<BufferRef, ScheduleError> {
        let input = &self.op.inputs[o];
        let index: Vec<Expr> = input.indices.iter().map(|a| self.to_expr(a)).collect();
        let mut cur = BufferRef { buffer: o, index };
        let pack = self.s.packs.iter().find(|(p, _, _)| *p == o).cloned();
        let cast = self.s.casts.iter().find(|(c, _, _)| *c == o).copied();
        let pad = self.s.pads.iter().find(|(p, _)| *p == o).copied();
        match (pack, cast) {
            (None, cast) if pad.is_some() => {
                let step = pad.map_or(0, |p| p.1);
                cur = self.pad(o, step, cast.map(|c| c.1))?;
            }
            (Some((_, layout, step)), cast) => {
                cur = self.pack(o, &layout, step, cast.map(|c| c.1), cur)?;
            }
            (None, Some((_, dtype, step))) => {
                // A cast alone is a pack in the tensor's own layout.
                let rank = input.tensor.shape.len();
                let identity = LayoutTransform {
                    splits: Vec::new(),
                    order: (0..rank).collect(),
                };
                cur = self.pack(o, &identity, step, Some(dtype), cur)?;
            }
            (None, None) => {}
        }
        let read_guards =
            self.guards_for((0..self.op.iter_vars.len()).filter(|&v| input.depends_on(v)));
        let mut last_anchor = 0;
        let caches: Vec<&CacheStage> = self.s.caches.iter().filter(|c| c.operand == o).collect();
        for (level, c) in caches.into_iter().enumerate() {
            let a = self
                .s
                .anchor(&c.at, &format!("cache_read at step {}", c.step))?;
            if a > self.t0 {
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
            cur = self.cache(o, level, c, a, cur, &read_guards);
        }
        Ok(cur)
    }

    /// Input `o` copied once, at the root, into a buffer spanning every index its reads take
    /// (converted to `cast`, where given): zeros where they leave the tensor. Returns the
    /// padded reference, which never leaves the copy.
    fn pad(
        &mut self,
        o: usize,
        step: usize,
        cast: Option<DType>,
    ) -> Result<BufferRef, ScheduleError> {
        let input = &self.op.inputs[o];
        // Each dimension's index range over the whole iteration space.
        let mut low = Vec::new();
        let mut shape = Vec::new();
        for a in &input.indices {
            let (lo, hi) = self
                .op
                .index_range(a)
                .ok_or_else(|| lower_err("a padded index overflows".into()))?;
            low.push(lo);
            shape.push((hi - lo + 1).max(1) as u64);
        }
        let rank = shape.len();
        let dims = input.tensor.shape.clone();
        let name = input.tensor.name.clone();
        let index: Vec<Expr> = input
            .indices
            .iter()
            .zip(&low)
            .map(|(a, &lo)| {
                let mut a = a.clone();
                a.constant -= lo;
                self.to_expr(&a)
            })
            .collect();
        let pb = self.add_buffer(Buffer {
            name: format!("{name}_padded"),
            shape: shape.clone(),
            dtype: cast.unwrap_or(input.tensor.dtype),
            scope: Scope::global(),
            role: BufferRole::Packed { operand: o },
        });
        // Each nest gets loop variables of its own, whose extents are its loops'.
        let mut nest = |body: &dyn Fn(&[usize]) -> Stmt, extents: &[u64]| {
            let first = self.vars.len();
            for (d, &e) in extents.iter().enumerate() {
                self.vars.push(LoopVar {
                    name: format!("{name}_padded.{d}"),
                    extent: e,
                });
            }
            let vars: Vec<usize> = (first..first + extents.len()).collect();
            serial_nest(
                vars.iter().copied().zip(extents.iter().copied()),
                body(&vars),
            )
        };
        // The border is zeroed slab by slab (a dimension's indices before and after the
        // tensor, every other dimension whole), then the tensor's part of the footprint is
        // copied in: no statement tests a bound, where one guarded copy of the whole buffer
        // tested four per element (the copy runs on every call of the kernel).
        let mut stmts = Vec::new();
        for d in 0..rank {
            // In the copy's coordinates, the tensor spans [-low, dim - low).
            let before = (-low[d]).clamp(0, shape[d] as i64) as u64;
            let after = (dims[d] as i64 - low[d]).clamp(0, shape[d] as i64) as u64;
            for (start, len) in [(0, before), (after, shape[d] - after)] {
                if len == 0 {
                    continue;
                }
                let mut extents = shape.clone();
                extents[d] = len;
                let fill = |vars: &[usize]| Stmt::Fill {
                    dst: BufferRef {
                        buffer: pb,
                        index: (0..rank)
                            .map(|j| {
                                let v = Expr::Var(vars[j]);
                                if j == d {
                                    Expr::sum(v, Expr::Const(start as i64))
                                } else {
                                    v
                                }
                            })
                            .collect(),
                    },
                    step: Some(step),
                };
                stmts.push(nest(&fill, &extents));
            }
        }
        // The tensor's part: x in [max(0, low), min(dim, low + shape)) per dimension.
        let from: Vec<i64> = low.iter().map(|&l| l.max(0)).collect();
        let inner: Vec<u64> = (0..rank)
            .map(|d| ((dims[d] as i64).min(low[d] + shape[d] as i64) - from[d]).max(0) as u64)
            .collect();
        if inner.iter().all(|&e| e > 0) {
            let copy = |vars: &[usize]| Stmt::Copy {
                dst: BufferRef {
                    buffer: pb,
                    index: (0..rank)
                        .map(|d| Expr::sum(Expr::Var(vars[d]), Expr::Const(from[d] - low[d])))
                        .collect(),
                },
                src: BufferRef {
                    buffer: o,
                    index: (0..rank)
                        .map(|d| Expr::sum(Expr::Var(vars[d]), Expr::Const(from[d])))
                        .collect(),
                },
                guards: Vec::new(),
                step: Some(step),
            };
            stmts.push(nest(&copy, &inner));
        }
        self.attached[0].push(Stmt::Seq(stmts));
        self.allocs[0].push(pb);
        Ok(BufferRef { buffer: pb, index })
    }

    /// Input `o` copied once, at the root, into `layout` (converted to `cast`, where given);
    /// returns the packed reference.
    fn pack(
        &mut self,
        o: usize,
        layout: &LayoutTransform,
        step: usize,
        cast: Option<DType>,
        cur: BufferRef,
    ) -> Result<BufferRef, ScheduleError> {
        let input = &self.op.inputs[o];
        let shape = layout
            .packed_shape(&input.tensor.shape)
            .map_err(lower_err)?;
        let pb = self.add_buffer(Buffer {
            name: format!("{}_packed", input.tensor.name),
            shape: shape.clone(),
            dtype: cast.unwrap_or(input.tensor.dtype),
            scope: Scope::global(),
            role: BufferRole::Packed { operand: o },
        });
        let first_var = self.vars.len();
        for (d, &e) in shape.iter().enumerate() {
            self.vars.push(LoopVar {
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
            step: Some(step),
        };
        let pack_nest = serial_nest(
            shape.iter().enumerate().map(|(d, &e)| (first_var + d, e)),
            copy,
        );
        self.attached[0].push(pack_nest);
        self.allocs[0].push(pb);
        Ok(BufferRef {
            buffer: pb,
            index: forward,
        })
    }

    /// Cache `level` of input `o` in `c.scope`, filled from `cur` at anchor `a`; returns the
    /// cache's reference.
    fn cache(
        &mut self,
        o: usize,
        level: usize,
        c: &CacheStage,
        a: usize,
        cur: BufferRef,
        read_guards: &[Guard],
    ) -> BufferRef {
        let input = &self.op.inputs[o];
        // A shared cache is the block's: it also spans the warp and thread loops outside its
        // anchor (as TVM relaxes thread-bound loops for shared scope), so the block's threads
        // fill it together and each reads its own part.
        let shared = c.scope.as_str() == "shared";
        let copy_loops: Vec<usize> = (0..self.n)
            .filter(|&j| j >= a || (shared && is_thread_level(self.s.loops[j].kind)))
            .filter(|&j| cur.index.iter().any(|e| e.uses(j)))
            .collect();
        let cb = self.add_buffer(Buffer {
            name: format!(
                "{}_{}{level}",
                input.tensor.name,
                c.scope.as_str().replace('.', "_")
            ),
            shape: copy_loops.iter().map(|&j| self.vars[j].extent).collect(),
            // What the cache copies: the input, or its converted pack.
            dtype: self.buffers[cur.buffer].dtype,
            scope: c.scope.clone(),
            role: BufferRole::Cache { operand: o, level },
        });
        let dst = BufferRef {
            buffer: cb,
            index: copy_loops.iter().map(|&j| Expr::Var(j)).collect(),
        };
        let mut copy = self.nest(
            &copy_loops,
            Stmt::Copy {
                dst: dst.clone(),
                src: cur,
                guards: read_guards.to_vec(),
                step: Some(c.step),
            },
        );
        // The spanned thread loops are walked serially by the copy: one axis is never bound
        // twice on a path.
        let mut l = &mut copy;
        while let Stmt::For(f) = l {
            if f.var < a {
                f.kind = LoopKind::Serial;
            }
            l = &mut f.body;
        }
        if shared {
            self.attached[a].extend([Stmt::Barrier, copy, Stmt::Barrier]);
        } else {
            self.attached[a].push(copy);
        }
        self.allocs[a].push(cb);
        dst
    }

    /// The accumulator, dense over the spatial loops inside its anchor; reduction loops
    /// outside it must be split-K (bound to blocks, adding partial sums into the output).
    fn accumulator(&mut self, tensors: &Tensors) -> Result<Accumulator, ScheduleError> {
        let (s, op) = (self.s, self.op);
        let (acc_scope, acc_at, acc_step) = match &s.cache_write {
            Some((scope, at, step)) => (scope.clone(), at.clone(), Some(*step)),
            None => (Scope::global(), None, None),
        };
        let a_acc = s.anchor(&acc_at, "cache_write")?;
        if a_acc > self.t0 {
            return Err(lower_err(
                "cache_write is attached inside the tensorized loops".into(),
            ));
        }
        let is_reduction = |j: usize| s.nodes[s.loops[j].node].kind == IterKind::Reduction;
        let mut split_k = false;
        for j in (0..a_acc).filter(|&j| is_reduction(j)) {
            if !matches!(
                s.loops[j].kind,
                LoopKind::Bound(GpuAxis::BlockX | GpuAxis::BlockY | GpuAxis::BlockZ)
            ) {
                return Err(lower_err(format!(
                    "reduction loop `{}` is outside the accumulator's anchor `{}`",
                    self.vars[j].name,
                    acc_at.clone().unwrap_or_default()
                )));
            }
            split_k = true;
        }
        if let Some(j) = (a_acc..self.n)
            .find(|&j| is_reduction(j) && matches!(s.loops[j].kind, LoopKind::Bound(_)))
        {
            return Err(lower_err(format!(
                "reduction loop `{}` is bound to a block axis inside the accumulator's anchor: each block would keep its own partial sum; attach the accumulator inside it",
                self.vars[j].name
            )));
        }
        if split_k && (!op.epilogue.is_empty() || op.output.tensor.dtype != op.accumulator) {
            return Err(lower_err(
                "split-K (a reduction loop bound to a block axis) adds partial sums into the output: it needs an output in the accumulator's type and no epilogue".into(),
            ));
        }
        let acc_loops: Vec<usize> = (a_acc..self.n)
            .filter(|&j| s.nodes[s.loops[j].node].kind == IterKind::Spatial)
            .collect();
        let acc = self.add_buffer(Buffer {
            name: "acc".into(),
            shape: acc_loops.iter().map(|&j| self.vars[j].extent).collect(),
            dtype: op.accumulator,
            scope: acc_scope,
            role: BufferRole::Accumulator,
        });
        self.allocs[a_acc].push(acc);
        let acc_ref = BufferRef {
            buffer: acc,
            index: acc_loops.iter().map(|&j| Expr::Var(j)).collect(),
        };
        let init = self.nest(
            &acc_loops,
            Stmt::Fill {
                dst: acc_ref.clone(),
                step: acc_step,
            },
        );
        let store = self.nest(
            &acc_loops,
            Stmt::Store {
                dst: BufferRef {
                    buffer: tensors.output,
                    index: op.output.indices.iter().map(|a| self.to_expr(a)).collect(),
                },
                acc: acc_ref.clone(),
                point: (0..op.iter_vars.len())
                    .map(|v| match op.iter_vars[v].kind {
                        IterKind::Spatial => self.var_expr[v].clone(),
                        IterKind::Reduction => Expr::Const(0),
                    })
                    .collect(),
                biases: tensors.biases.clone(),
                guards: self.guards_for(op.spatial_vars()),
                step: acc_step,
                accumulate: split_k,
            },
        );
        Ok(Accumulator {
            anchor: a_acc,
            at: acc_ref,
            init,
            store,
        })
    }

    /// The innermost statement: the tensorized call, or the scalar update.
    ///
    /// A variable's padding guard is left out when every operand that depends on it is read
    /// from a cache: caches span the padded loops and hold zeros where the guard fails, and
    /// the accumulator spans them too (its store keeps every guard). A padded point then adds
    /// a zero product, or writes an accumulator element that is never stored, so the call
    /// needs no guard and can stay register-blocked (a 6x16 block on m = 1024 pads only the
    /// last block, which BLIS handles the same way: packed panels padded with zeros).
    fn compute(&self, reads: Vec<BufferRef>, acc: &BufferRef) -> Stmt {
        let from_cache =
            |o: usize| matches!(self.buffers[reads[o].buffer].role, BufferRole::Cache { .. });
        let needs_guard = |v: usize| {
            (0..self.op.inputs.len()).any(|o| self.op.inputs[o].depends_on(v) && !from_cache(o))
        };
        let all_guards = self.guards_for((0..self.op.iter_vars.len()).filter(|&v| needs_guard(v)));
        match &self.s.tensorize {
            Some(t) => Stmt::Tensorized(TensorizedCall {
                intrinsic: t.intrinsic.clone(),
                semantics: t.semantics.clone(),
                bindings: t
                    .bindings
                    .iter()
                    .map(|&(u, node)| (u, self.loop_var[node].unwrap_or(usize::MAX)))
                    .collect(),
                operands: t.operands.iter().map(|&o| reads[o].clone()).collect(),
                acc: acc.clone(),
                guards: all_guards,
                step: t.step,
            }),
            None => Stmt::Update {
                acc: acc.clone(),
                operands: reads,
                guards: all_guards,
            },
        }
    }

    /// The program: from the innermost anchor outwards, each anchor's attached statements
    /// (and the accumulator's fill and store at its anchor) around the inner body, its
    /// allocations around those, inside its loop.
    fn assemble(mut self, compute: Stmt, acc: Accumulator) -> Program {
        let mut inner = compute;
        for a in (0..=self.t0).rev() {
            let mut seq = Vec::new();
            if a == acc.anchor {
                seq.push(acc.init.clone());
            }
            seq.append(&mut self.attached[a]);
            seq.push(inner);
            if a == acc.anchor {
                seq.push(acc.store.clone());
            }
            let mut body = if seq.len() == 1 {
                seq.pop().unwrap_or(Stmt::Seq(Vec::new()))
            } else {
                Stmt::Seq(seq)
            };
            for &b in self.allocs[a].iter().rev() {
                body = Stmt::Allocate {
                    buffer: b,
                    body: Box::new(body),
                };
            }
            inner = if a == 0 {
                body
            } else {
                let j = a - 1;
                let l = &self.s.loops[j];
                Stmt::For(For {
                    var: j,
                    extent: self.s.nodes[l.node].extent,
                    kind: l.kind,
                    reduction: self.s.nodes[l.node].kind == IterKind::Reduction,
                    pipeline_stages: l.pipeline,
                    annotations: l.annotations.clone(),
                    body: Box::new(body),
                })
            };
        }
        Program {
            op: self.op.clone(),
            vars: self.vars,
            buffers: self.buffers,
            body: inner,
        }
    }
}

/// Loops whose iterations run on different threads of one block.
fn is_thread_level(kind: LoopKind) -> bool {
    matches!(
        kind,
        LoopKind::Bound(GpuAxis::Warp | GpuAxis::ThreadX | GpuAxis::ThreadY | GpuAxis::ThreadZ)
    )
}

/// Serial loops `(variable, extent)`, outermost first, around `body`.
fn serial_nest(loops: impl DoubleEndedIterator<Item = (usize, u64)>, body: Stmt) -> Stmt {
    loops.rev().fold(body, |b, (var, extent)| {
        Stmt::For(For {
            var,
            extent,
            kind: LoopKind::Serial,
            reduction: false,
            pipeline_stages: None,
            annotations: BTreeMap::new(),
            body: Box::new(b),
        })
    })
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
