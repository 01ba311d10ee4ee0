//! Tensorized calls: register blocks (accumulators in AMX tiles or vector registers across
//! the reduction loop), direct calls on operands already in the instruction's layout, and
//! staged calls that gather into that layout and scatter back under the guards.

use super::*;

impl Gen<'_> {
    /// The loop variable bound to each instruction dimension (m, n, k).
    pub(super) fn tile_vars(&self, c: &TensorizedCall) -> Result<[usize; 3], CodegenError> {
        let mut lv = [usize::MAX; 3];
        for &(u, v) in &c.bindings {
            if u < 3 {
                lv[u] = v;
            }
        }
        if lv.iter().any(|&v| v >= self.p.vars.len()) {
            return Err(CodegenError::Malformed {
                reason: format!(
                    "the call of `{}` (step {}) does not bind all of m, n and k to loops",
                    c.intrinsic, c.step
                ),
            });
        }
        Ok(lv)
    }

    pub(super) fn operand(c: &TensorizedCall, role: Role) -> &BufferRef {
        match role {
            Role::A => &c.operands[0],
            Role::B => &c.operands[1],
            Role::C => &c.acc,
        }
    }

    /// Whether `r` already has the instruction's layout for `role` (for every value of the
    /// other loops: checked at the corners and at pseudo-random points) and stays inside its
    /// buffer, and its row stride.
    pub(super) fn direct_stride(
        &self,
        ins: &Instr,
        r: &BufferRef,
        role: Role,
        lv: [usize; 3],
    ) -> Option<i64> {
        if !self.in_bounds(r) {
            return None;
        }
        self.layout_stride(ins, r, role, lv)
    }

    /// Whether `r`'s addresses have the instruction's layout for `role`, wherever they point
    /// (a padded read may leave its buffer), and its row stride: for every value of the
    /// loops that can change the tile's shape (those divided or taken a remainder of together
    /// with a tile variable: a fused loop whose tiles can cross a row), tried exhaustively up
    /// to [`MAX_LAYOUT_CHECKS`] offsets, and for the others at the corners and at
    /// pseudo-random points (they shift the whole tile, which the offsets do not see).
    ///
    /// Remembered per kernel: a call is checked again by every reduction loop around it that
    /// tries a register block, and the exhaustive checks can run to a million offsets.
    pub(super) fn layout_stride(
        &self,
        ins: &Instr,
        r: &BufferRef,
        role: Role,
        lv: [usize; 3],
    ) -> Option<i64> {
        // The rows too: a partial AMX tile of the same instruction has a tile of its own.
        let key = (ins.intr.id, ins.rows, r.clone(), role, lv);
        if let Some(&known) = self.layouts.borrow().get(&key) {
            return known;
        }
        let stride = self.check_layout(ins, r, role, lv);
        self.layouts.borrow_mut().insert(key, stride);
        stride
    }

    fn check_layout(&self, ins: &Instr, r: &BufferRef, role: Role, lv: [usize; 3]) -> Option<i64> {
        if self.p.buffers[r.buffer].dtype != ins.dtype(role) {
            return None;
        }
        let (di, dj) = Instr::dims(role);
        let (ei, ej) = (ins.extent(di), ins.extent(dj));
        let flat = self.flat(r);
        let n = self.p.vars.len();
        let mut samples: Vec<Vec<i64>> = vec![
            vec![0; n],
            self.p.vars.iter().map(|v| v.extent as i64 - 1).collect(),
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..6 {
            samples.push(
                self.p
                    .vars
                    .iter()
                    .map(|v| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        (state % v.extent.max(1)) as i64
                    })
                    .collect(),
            );
        }
        // The entangled loops: their combinations are tried below, the other loops at 0.
        let mut entangled = Vec::new();
        entangled_vars(&flat, &[lv[di], lv[dj]], &mut entangled);
        entangled.retain(|v| !lv.contains(v));
        entangled.sort_unstable();
        entangled.dedup();
        let combos = entangled.iter().try_fold(1u64, |acc, &v| {
            acc.checked_mul(self.p.vars[v].extent.max(1))
        })?;
        let tile = u64::try_from(ei.max(1) * ej.max(1)).ok()?;
        if combos.checked_mul(tile)? > MAX_LAYOUT_CHECKS {
            return None;
        }
        let fast = QuasiAffine::of(&flat);
        let mut stride = None;
        let mut fits = |vals: &mut [i64]| -> bool {
            for &v in &lv {
                vals[v] = 0;
            }
            let mut at = |i: i64, j: i64| {
                vals[lv[di]] = i;
                vals[lv[dj]] = j;
                fast.eval(vals)
            };
            let base = at(0, 0);
            let s = match ins.stride_probe(role) {
                Some((i, j)) => at(i, j) - base,
                None => 0,
            };
            if ins.stride_probe(role).is_some() && s <= 0 {
                return false;
            }
            if *stride.get_or_insert(s) != s {
                return false;
            }
            (0..ei).all(|i| (0..ej).all(|j| at(i, j) - base == ins.offset(role, i, j, s)))
        };
        for mut vals in samples {
            if !fits(&mut vals) {
                return None;
            }
        }
        // A one-element tile with no row stride to agree on fits anywhere.
        let vacuous = ei * ej == 1 && ins.stride_probe(role).is_none();
        if entangled.is_empty() || vacuous {
            return stride;
        }
        // Every combination of the entangled loops' values (there may be a million). Where
        // every division and remainder is of an affine form, a tile's offsets depend on the
        // other loops only through each dividend's remainder at the tile's origin, so one
        // combination per reachable set of remainders decides; otherwise each is tried.
        match reachable_remainders(&fast, &entangled, &self.p.vars, n) {
            Some(representatives) => {
                for mut vals in representatives {
                    if !fits(&mut vals) {
                        return None;
                    }
                }
            }
            None => {
                let mut vals = vec![0i64; n];
                for c in 0..combos {
                    let mut rest = c;
                    for &v in &entangled {
                        let e = self.p.vars[v].extent.max(1);
                        vals[v] = (rest % e) as i64;
                        rest /= e;
                    }
                    if !fits(&mut vals) {
                        return None;
                    }
                }
            }
        }
        stride
    }

    /// The C pointer to a direct operand's tile: its reference with the tile variables at 0.
    pub(super) fn tile_ptr(&self, r: &BufferRef, lv: [usize; 3], extra: &[(usize, i64)]) -> String {
        let mut vals: Vec<(usize, i64)> = lv.iter().map(|&v| (v, 0)).collect();
        vals.extend_from_slice(extra);
        let r0 = subst_ref(r, &vals);
        format!("&{}", self.element(&r0))
    }

    pub(super) fn tensorized(&mut self, c: &TensorizedCall) -> Result<(), CodegenError> {
        let ins = instr_for(self.catalog, c)?;
        let lv = self.tile_vars(c)?;
        let names: Vec<String> = ["m", "n", "k"]
            .iter()
            .zip(lv)
            .map(|(u, v)| format!("{u} = {}", self.p.vars[v].name))
            .collect();
        self.line(&format!(
            "{{  /* step {}: {} ({}), {} */",
            c.step,
            ins.intr.id,
            ins.intr.mnemonic,
            names.join(", ")
        ));
        self.depth += 1;
        let mut ptrs = Vec::new();
        let mut staged_c = None;
        // Elements gathered (and, for the accumulator, scattered back) per call.
        let mut staged = 0u64;
        for role in [Role::A, Role::B, Role::C] {
            let r = Self::operand(c, role);
            let direct = if c.guards.is_empty() {
                self.direct_stride(&ins, r, role, lv)
            } else {
                None
            };
            match direct {
                Some(s) => {
                    let bytes = ins.dtype(role).bytes() as i64;
                    ptrs.push((self.tile_ptr(r, lv, &[]), s * bytes));
                }
                None => {
                    let (di, dj) = Instr::dims(role);
                    let tile = (ins.extent(di) * ins.extent(dj)) as u64;
                    staged += if role == Role::C { 2 * tile } else { tile };
                    let name = self.stage(c, &ins, r, role, lv)?;
                    let s = ins.natural_stride(role) * ins.dtype(role).bytes() as i64;
                    if role == Role::C {
                        staged_c = Some(name.clone());
                    }
                    ptrs.push((name, s));
                }
            }
        }
        self.paths.entry(c.step).or_insert(if staged == 0 {
            CallPath::Direct
        } else {
            CallPath::Staged { elements: staged }
        });
        let [(pa, sa), (pb, sb), (pc, sc)] = [ptrs[0].clone(), ptrs[1].clone(), ptrs[2].clone()];
        match ins.family {
            Family::Amx { dp } => {
                let [tc, ta, tb] = if ins.partial_rows() {
                    let r = ins.rows as u8;
                    match self.amx_tiles(&[r, r, ins.b_rows()]).as_deref() {
                        Some(&[c, a, b]) => [c, a, b],
                        _ => {
                            return Err(CodegenError::Unsupported {
                                reason: format!(
                                    "step {}: no three AMX tiles left for a {r}-row call beside the kernel's other tiles",
                                    c.step
                                ),
                            });
                        }
                    }
                } else {
                    [0, 1, 2]
                };
                self.line(&format!("_tile_loadd({tc}, {pc}, {sc});"));
                self.line(&format!("_tile_loadd({ta}, {pa}, {sa});"));
                self.line(&format!("_tile_loadd({tb}, {pb}, {sb});"));
                self.line(&format!("{dp}({tc}, {ta}, {tb});"));
                self.line(&format!("_tile_stored({tc}, {pc}, {sc});"));
            }
            _ => {
                let (t, load_c, store_c) = vector_types(ins.family);
                self.line(&format!("{t} tsl_acc = {load_c}({pc});"));
                let s = format!(
                    "tsl_acc = {};",
                    vector_op(
                        ins.family,
                        "tsl_acc",
                        &bcast(ins.family, &pa),
                        &vload(ins.family, &pb)
                    )
                );
                self.line(&s);
                self.line(&format!("{store_c}({pc}, tsl_acc);"));
            }
        }
        if let Some(name) = staged_c {
            self.scatter(c, &ins, &name, lv);
        }
        self.depth -= 1;
        self.line("}");
        Ok(())
    }

    /// Guards that matter for an operand: those over its own tile dimensions and outer loops.
    pub(super) fn role_guards(
        &self,
        c: &TensorizedCall,
        role: Role,
        lv: [usize; 3],
    ) -> Vec<String> {
        let (di, dj) = Instr::dims(role);
        let other: Vec<usize> = (0..3)
            .filter(|&d| d != di && d != dj)
            .map(|d| lv[d])
            .collect();
        c.guards
            .iter()
            .filter(|g| other.iter().all(|&v| !g.expr.uses(v)))
            .map(|g| self.guard_c(g))
            .filter(|c| !self.proven.contains(c))
            .collect()
    }

    /// Gathers an operand's tile into a buffer in the instruction's layout; zeros where a guard
    /// fails or the read leaves the buffer.
    pub(super) fn stage(
        &mut self,
        c: &TensorizedCall,
        ins: &Instr,
        r: &BufferRef,
        role: Role,
        lv: [usize; 3],
    ) -> Result<String, CodegenError> {
        let t = ins.dtype(role);
        if self.p.buffers[r.buffer].dtype != t {
            return Err(CodegenError::Malformed {
                reason: format!(
                    "buffer `{}` is {} but `{}` wants {t}",
                    self.p.buffers[r.buffer].name, self.p.buffers[r.buffer].dtype, ins.intr.id
                ),
            });
        }
        let (di, dj) = Instr::dims(role);
        let name = format!("tsl_tile_{role:?}");
        let rows = match ins.family {
            Family::Amx { .. } => 16,
            _ => 1,
        };
        let size = rows * ins.natural_stride(role);
        self.line(&format!(
            "{} {name}[{size}] __attribute__((aligned(64)));  /* {role:?} gathered into the instruction's layout */",
            c_type(t)
        ));
        let (vi, vj) = (self.vars[lv[di]].clone(), self.vars[lv[dj]].clone());
        self.line(&format!(
            "for (long {vi} = 0; {vi} < {}; ++{vi})",
            ins.extent(di)
        ));
        self.line(&format!(
            "    for (long {vj} = 0; {vj} < {}; ++{vj})",
            ins.extent(dj)
        ));
        let g = self.role_guards(c, role, lv);
        let s = format!(
            "        {name}[{}] = {};",
            ins.offset_c(role, &vi, &vj),
            self.read(r, &g)
        );
        self.line(&s);
        Ok(name)
    }

    pub(super) fn scatter(&mut self, c: &TensorizedCall, ins: &Instr, name: &str, lv: [usize; 3]) {
        let (vi, vj) = (self.vars[lv[0]].clone(), self.vars[lv[1]].clone());
        self.line(&format!("for (long {vi} = 0; {vi} < {}; ++{vi})", ins.m()));
        self.line(&format!(
            "    for (long {vj} = 0; {vj} < {}; ++{vj})",
            ins.n()
        ));
        let mut conds = self.role_guards(c, Role::C, lv);
        conds.extend(self.bounds(&c.acc));
        dedup(&mut conds);
        let s = format!(
            "{} = {name}[{}];",
            self.element(&c.acc),
            ins.offset_c(Role::C, &vi, &vj)
        );
        let s = if conds.is_empty() {
            format!("        {s}")
        } else {
            format!("        if ({}) {s}", conds.join(" && "))
        };
        self.line(&s);
    }

    /// A reduction loop around unrolled loops around one call, every operand in the
    /// instruction's layout: accumulators stay in registers across the reduction loop. Guards
    /// are allowed where they only pad A's rows on a vector instruction (see
    /// [`Gen::padded_fragments`]).
    ///
    /// Serial reduction loops nested directly in `l` (nothing else in their bodies) are held
    /// across too: a convolution's window loops (r, s) around its channel loop keep the
    /// accumulators in registers for the whole window instead of storing and reloading them
    /// at every tap (an AMX tile stored and loaded back at once waits for the store: the
    /// tuned 3x3 conv of ResNet-50 in bf16 ran 1.5x faster held). Not with padded A
    /// fragments, which step with one loop.
    pub(super) fn register_block(&mut self, l: &For) -> Result<bool, CodegenError> {
        let mut held: Vec<&For> = vec![l];
        let mut s = &*l.body;
        while let Stmt::For(f) = s {
            if !(f.reduction && f.kind == LoopKind::Serial) {
                break;
            }
            held.push(f);
            s = &f.body;
        }
        let mut unrolled: Vec<(usize, u64)> = Vec::new();
        let call = loop {
            match s {
                Stmt::For(f) if f.kind == LoopKind::Unrolled => {
                    unrolled.push((f.var, f.extent));
                    s = &f.body;
                }
                Stmt::Tensorized(c) => break c,
                _ => return Ok(false),
            }
        };
        let points: u64 = unrolled.iter().map(|u| u.1).product();
        if points > MAX_BLOCK_POINTS || l.kind == LoopKind::Parallel {
            return Ok(false);
        }
        let ins = instr_for(self.catalog, call)?;
        let amx = matches!(ins.family, Family::Amx { .. });
        if amx && !call.guards.is_empty() {
            return Ok(false);
        }
        let lv = self.tile_vars(call)?;
        let mut strides = [0i64; 3];
        // A broadcast operand whose reads may leave its buffer (a padded convolution's input
        // read in place), or whose rows may be padding (guards), is read through one pointer
        // per fragment, chosen before the loop.
        let mut padded_a = !call.guards.is_empty();
        for (i, role) in [Role::A, Role::B, Role::C].into_iter().enumerate() {
            let r = Self::operand(call, role);
            let s = match self.direct_stride(&ins, r, role, lv) {
                Some(s) => s,
                None if role == Role::A && !amx => match self.layout_stride(&ins, r, role, lv) {
                    Some(s) => {
                        padded_a = true;
                        s
                    }
                    None => return Ok(false),
                },
                None => return Ok(false),
            };
            strides[i] = s * ins.dtype(role).bytes() as i64;
        }
        let reduction_unrolled: Vec<usize> = {
            let mut v = vec![l.var];
            let mut s = &*l.body;
            while let Stmt::For(f) = s {
                if f.reduction {
                    v.push(f.var);
                }
                s = &f.body;
            }
            v
        };
        if reduction_unrolled
            .iter()
            .any(|&v| call.acc.index.iter().any(|e| e.uses(v)))
        {
            return Ok(false);
        }
        // Every unrolled point: its accumulator, A and B fragments (deduplicated by address).
        let mut frags: [Vec<String>; 3] = Default::default();
        // Where each A fragment was first met: the unrolled loops' values.
        let mut a_points: Vec<Vec<(usize, i64)>> = Vec::new();
        // Where each accumulator fragment was first met.
        let mut c_points: Vec<Vec<(usize, i64)>> = Vec::new();
        let mut plan: Vec<[usize; 3]> = Vec::new();
        let mut point = vec![0i64; unrolled.len()];
        let extents: Vec<u64> = unrolled.iter().map(|u| u.1).collect();
        loop {
            let vals: Vec<(usize, i64)> = unrolled
                .iter()
                .map(|u| u.0)
                .zip(point.iter().copied())
                .collect();
            let mut ids = [0usize; 3];
            for (i, role) in [Role::A, Role::B, Role::C].into_iter().enumerate() {
                let p = self.tile_ptr(Self::operand(call, role), lv, &vals);
                ids[i] = match frags[i].iter().position(|f| *f == p) {
                    Some(x) => x,
                    None => {
                        if role == Role::A {
                            a_points.push(vals.clone());
                        }
                        if role == Role::C {
                            c_points.push(vals.clone());
                        }
                        frags[i].push(p);
                        frags[i].len() - 1
                    }
                };
            }
            plan.push(ids);
            if !advance(&mut point, &extents) {
                break;
            }
        }
        let n_acc = frags[2].len();
        if (amx && n_acc + 2 > 8) || (!amx && n_acc > 24) {
            return Ok(false);
        }
        // AMX tiles: the accumulators', then operand slots reused while resident. On whole
        // tiles, accumulators 0..n_acc and any operand in any slot after them (as before
        // partial tiles); on partial ones, A's and B's tiles have different rows, so each
        // role gets slots of its own from the kernel's configuration: B's fragments stay
        // resident where they fit (reused across the block's rows), A takes the rest.
        let (acc_tiles, slot_tiles, slot_roles): (Vec<usize>, Vec<usize>, Vec<Option<usize>>) =
            if !amx {
                Default::default()
            } else if ins.partial_rows() {
                let avail = 8 - n_acc;
                let b_slots = frags[1].len().min(avail - 1);
                let a_slots = (avail - b_slots).min(frags[0].len());
                let (r, rb) = (ins.rows as u8, ins.b_rows());
                let mut want = vec![r; n_acc + a_slots];
                want.extend(std::iter::repeat_n(rb, b_slots));
                let Some(tiles) = self.amx_tiles(&want) else {
                    return Ok(false);
                };
                let mut roles = vec![Some(0); a_slots];
                roles.extend(std::iter::repeat_n(Some(1), b_slots));
                (tiles[..n_acc].to_vec(), tiles[n_acc..].to_vec(), roles)
            } else {
                (
                    (0..n_acc).collect(),
                    (n_acc..8).collect(),
                    vec![None; 8 - n_acc],
                )
            };
        let padded = if padded_a {
            if held.len() > 1 {
                return Ok(false);
            }
            let Some(p) = self.padded_fragments(&ins, call, l, lv, &a_points) else {
                return Ok(false);
            };
            Some(p)
        } else {
            None
        };
        let unrolled_names: Vec<&str> = unrolled
            .iter()
            .map(|u| self.p.vars[u.0].name.as_str())
            .collect();
        self.paths
            .entry(call.step)
            .or_insert(CallPath::RegisterBlock);
        self.line(&format!(
            "{{  /* step {}: {} register block: {} accumulator(s) over {} held across `{}` */",
            call.step,
            ins.intr.id,
            n_acc,
            if unrolled_names.is_empty() {
                "one tile".to_string()
            } else {
                format!("unrolled {}", unrolled_names.join(", "))
            },
            held.iter()
                .map(|f| self.p.vars[f.var].name.as_str())
                .collect::<Vec<_>>()
                .join("`, `")
        ));
        self.depth += 1;
        let [sa, sb, sc] = strides;
        // The accumulator fused into the block (AMX; see `Gen::acc_fusion`): its tiles start
        // at zero where the buffer was just zeroed and the block computes all of it (a tile
        // loaded from lines stored a moment before waits for the stores: the 56x56 bf16 conv
        // ran 1.3x faster zeroed in tiles), and go straight to the output where the store
        // after the block would only copy them there.
        let covers = amx
            && (n_acc as u64).checked_mul((ins.m() * ins.n()) as u64)
                == Some(self.p.buffers[call.acc.buffer].elements());
        let zero_in_tiles = covers
            && self.acc_fusion.as_ref().is_some_and(|f| {
                f.zeroed == call.acc.buffer
                    && self.bound[f.depth..]
                        .iter()
                        .all(|&v| self.p.vars[v].extent == 1)
            });
        // (the output's tiles, their row stride, the bias rows each tile starts from)
        type Direct = (Vec<String>, i64, Option<Vec<String>>);
        let store_to: Option<Direct> = if zero_in_tiles {
            self.acc_fusion
                .as_ref()
                .and_then(|f| f.store.clone())
                .filter(|f| f.acc == call.acc)
                .and_then(|f| {
                    let s = self.direct_stride(&ins, &f.dst, Role::C, lv)?;
                    let bytes = ins.dtype(Role::C).bytes() as i64;
                    let at = |r: &BufferRef| -> Vec<String> {
                        c_points
                            .iter()
                            .map(|vals| self.tile_ptr(r, lv, vals))
                            .collect()
                    };
                    let bias = match &f.bias {
                        None => None,
                        Some(b) if self.bias_row(&ins, b, lv) => Some(at(b)),
                        Some(_) => return None,
                    };
                    Some((at(&f.dst), s * bytes, bias))
                })
        } else {
            None
        };
        if let Some(f) = &mut self.acc_fusion {
            f.zeroed_in_tiles |= zero_in_tiles;
            f.stored_direct |= store_to.is_some();
        }
        if let Family::Amx { dp } = ins.family {
            for (t, f) in frags[2].iter().enumerate() {
                if let Some((_, _, Some(bias))) = &store_to {
                    // Every row of the tile starts from the same bias row (stride 0).
                    self.line(&format!(
                        "_tile_loadd({}, {}, 0);  /* the bias in every row */",
                        acc_tiles[t], bias[t]
                    ));
                } else if zero_in_tiles {
                    self.line(&format!("_tile_zero({});", acc_tiles[t]));
                } else {
                    self.line(&format!("_tile_loadd({}, {f}, {sc});", acc_tiles[t]));
                }
            }
            self.open_loops(&held);
            // Operand slots, reused while resident (least recently used evicted).
            let mut resident: Vec<Option<(usize, usize)>> = vec![None; slot_tiles.len()];
            let mut last_use = vec![0usize; slot_tiles.len()];
            for (tick, ids) in plan.iter().enumerate() {
                let mut tiles = [0usize; 2];
                for (slot, (role_i, stride)) in [(0usize, sa), (1usize, sb)].into_iter().enumerate()
                {
                    let key = (role_i, ids[role_i]);
                    let t = match resident.iter().position(|r| *r == Some(key)) {
                        Some(t) => t,
                        None => {
                            let keep = if slot == 1 { Some(tiles[0]) } else { None };
                            let t = (0..resident.len())
                                .filter(|&t| Some(t) != keep)
                                .filter(|&t| slot_roles[t].is_none_or(|r| r == role_i))
                                .min_by_key(|&t| (resident[t].is_some(), last_use[t]))
                                .unwrap_or(0);
                            resident[t] = Some(key);
                            let f = &frags[role_i][ids[role_i]];
                            self.line(&format!("_tile_loadd({}, {f}, {stride});", slot_tiles[t]));
                            t
                        }
                    };
                    last_use[t] = tick + 1;
                    tiles[slot] = t;
                }
                self.line(&format!(
                    "{dp}({}, {}, {});",
                    acc_tiles[ids[2]], slot_tiles[tiles[0]], slot_tiles[tiles[1]]
                ));
            }
            self.close_loops(held.len());
            match &store_to {
                Some((ptrs, stride, _)) => {
                    for (t, f) in ptrs.iter().enumerate() {
                        self.line(&format!(
                            "_tile_stored({}, {f}, {stride});  /* straight to the output */",
                            acc_tiles[t]
                        ));
                    }
                }
                None => {
                    for (t, f) in frags[2].iter().enumerate() {
                        self.line(&format!("_tile_stored({}, {f}, {sc});", acc_tiles[t]));
                    }
                }
            }
        } else {
            let (t, load_c, store_c) = vector_types(ins.family);
            if let Some(p) = &padded {
                let ta = c_type(ins.dtype(Role::A));
                self.line(&format!(
                    "static const {ta} tsl_zero_a[{}] __attribute__((aligned(64)));  /* what a read past A's border finds */",
                    p.zeros
                ));
                for (i, (conds, base)) in p.bases.iter().enumerate() {
                    let s = if conds.is_empty() {
                        format!("const {ta} *tsl_pa{i} = {base};")
                    } else {
                        format!(
                            "const {ta} *tsl_pa{i} = ({}) ? {base} : tsl_zero_a;",
                            conds.join(" && ")
                        )
                    };
                    self.line(&s);
                }
                let v = &self.vars[l.var];
                frags[0] = (0..p.bases.len())
                    .map(|i| format!("tsl_pa{i} + {} * {v}", p.step))
                    .collect();
            }
            for (i, f) in frags[2].iter().enumerate() {
                self.line(&format!("{t} tsl_c{i} = {load_c}({f});"));
            }
            self.open_loops(&held);
            let (ta, tb) = operand_types(ins.family);
            // B fragments first, then one broadcast of A at a time with every product that
            // uses it: live registers stay at accumulators + B + 1.
            for (i, f) in frags[1].iter().enumerate() {
                self.line(&format!("{tb} tsl_b{i} = {};", vload(ins.family, f)));
            }
            for (i, f) in frags[0].iter().enumerate() {
                self.line(&format!("{ta} tsl_a{i} = {};", bcast(ins.family, f)));
                for ids in plan.iter().filter(|p| p[0] == i) {
                    let c = format!("tsl_c{}", ids[2]);
                    let s = format!(
                        "{c} = {};",
                        vector_op(
                            ins.family,
                            &c,
                            &format!("tsl_a{}", ids[0]),
                            &format!("tsl_b{}", ids[1])
                        )
                    );
                    self.line(&s);
                }
            }
            self.close_loops(held.len());
            for (i, f) in frags[2].iter().enumerate() {
                self.line(&format!("{store_c}({f}, tsl_c{i});"));
            }
        }
        self.depth -= 1;
        self.line("}");
        Ok(true)
    }

    /// The headers of a register block's held loops, outermost first.
    /// Whether bias reference `b` reads one row the accumulator tile's rows share: the same
    /// element for every row (m), consecutive elements along the columns (n), inside its
    /// buffer.
    fn bias_row(&self, ins: &Instr, b: &BufferRef, lv: [usize; 3]) -> bool {
        if !self.in_bounds(b) || b.index.iter().any(|e| e.uses(lv[0])) {
            return false;
        }
        let flat = self.flat(b);
        let n = self.p.vars.len();
        let corners = [
            vec![0i64; n],
            self.p.vars.iter().map(|v| v.extent as i64 - 1).collect(),
        ];
        corners.into_iter().all(|mut vals| {
            vals[lv[1]] = 0;
            let base = flat.eval(&vals);
            (0..ins.n()).all(|j| {
                vals[lv[1]] = j;
                flat.eval(&vals) - base == j
            })
        })
    }

    fn open_loops(&mut self, held: &[&For]) {
        for f in held {
            let h = self.loop_header(f);
            self.line(&h);
            self.depth += 1;
        }
    }

    fn close_loops(&mut self, n: usize) {
        for _ in 0..n {
            self.depth -= 1;
            self.line("}");
        }
    }

    /// The A fragments of a register block whose reads may leave A's buffer or whose rows may
    /// be padding: per fragment, the conditions under which it stays inside and is no padding
    /// row, and its address at the first reduction step; otherwise it reads a zero buffer, so
    /// padding rows accumulate zeros (and are never stored). None unless every condition is
    /// fixed across the reduction loop and independent of B, and A moves by a fixed step per
    /// iteration of the loop.
    fn padded_fragments(
        &self,
        ins: &Instr,
        call: &TensorizedCall,
        l: &For,
        lv: [usize; 3],
        points: &[Vec<(usize, i64)>],
    ) -> Option<PaddedFragments> {
        // A vector instruction's A is one row, whose m loop stays at 0 below.
        if ins.m() != 1 {
            return None;
        }
        let a = Self::operand(call, Role::A);
        let shape = &self.p.buffers[a.buffer].shape;
        // The loops B's reads move with: a guard over them would pad B, not only A's rows.
        let mut b_vars = Vec::new();
        for e in &Self::operand(call, Role::B).index {
            e.collect_vars(&mut b_vars);
        }
        // A fragment met at several unrolled points keeps the first point's conditions, so
        // a guard may not move with an unrolled loop that A's address does not.
        let mut a_vars = Vec::new();
        for e in &a.index {
            e.collect_vars(&mut a_vars);
        }
        let unrolled: Vec<usize> = points
            .iter()
            .flat_map(|p| p.iter().map(|&(v, _)| v))
            .collect();
        if call.guards.iter().any(|g| {
            unrolled
                .iter()
                .any(|&v| g.expr.uses(v) && !a_vars.contains(&v))
        }) {
            return None;
        }
        let affine_in_loop = |e: &Expr| affine_in(e, l.var);
        let mut bases = Vec::new();
        let mut step = None;
        for vals in points {
            let mut vals = vals.clone();
            vals.push((lv[0], 0));
            let r = subst_ref(a, &vals);
            if !r.index.iter().all(affine_in_loop) {
                return None;
            }
            let mut conds = Vec::new();
            for g in &call.guards {
                let expr = vals
                    .iter()
                    .fold(g.expr.clone(), |e, &(v, x)| subst(&e, v, x));
                let moves = |v: usize| expr.uses(v);
                if moves(l.var) || lv.iter().any(|&v| moves(v)) || b_vars.iter().any(|&v| moves(v))
                {
                    return None;
                }
                conds.push(self.guard_c(&tessel_ir::Guard {
                    expr,
                    bound: g.bound,
                }));
            }
            conds.extend(self.bounds(&r));
            dedup(&mut conds);
            let fixed = r.index.iter().zip(shape).all(|(e, &n)| {
                let (lo, hi) = self.range(e);
                let inside = lo >= 0 && hi < n as i64;
                inside || (!e.uses(l.var) && lv.iter().all(|&v| !e.uses(v)))
            });
            if !fixed {
                return None;
            }
            let s = linear_stride(&r.index, shape, l.var, self.p.vars.len());
            if s < 0 || *step.get_or_insert(s) != s {
                return None;
            }
            let mut first: Vec<(usize, i64)> = vec![(l.var, 0)];
            first.extend(lv.iter().map(|&v| (v, 0)));
            let r0 = subst_ref(&r, &first);
            bases.push((conds, format!("&{}", self.element(&r0))));
        }
        let step = step.unwrap_or(0);
        // The farthest a fragment's pointer reaches from its base across the loop.
        let zeros = step
            .checked_mul(l.extent as i64 - 1)?
            .checked_add(ins.k())?
            .max(1);
        (zeros <= MAX_ZERO_ELEMENTS).then_some(PaddedFragments { bases, step, zeros })
    }
}

/// How many tile offsets [`Gen::layout_stride`] may evaluate over the loops that can change a
/// tile's shape; past it the operand is staged (correct, slower) rather than guessed.
const MAX_LAYOUT_CHECKS: u64 = 1 << 20;

/// The loop variables under a division or remainder that also takes one of `moving`:
/// where they stand decides whether a tile along `moving` crosses a row of the buffer.
///
/// Of a non-negative affine dividend, a variable whose coefficient is a multiple of the
/// divisor is left out: it moves the quotient by whole steps and leaves the remainder, so it
/// shifts the tile without bending it (the corner and pseudo-random samples see shifts).
/// Without that, a packed operand's outer block loops multiplied the combinations past
/// [`MAX_LAYOUT_CHECKS`] on large layers, and their tiles were gathered element by element
/// (a 128x3072x768 int8 dense layer 4.3 -> 286 ms).
fn entangled_vars(e: &Expr, moving: &[usize], out: &mut Vec<usize>) {
    match e {
        Expr::Const(_) | Expr::Var(_) => {}
        Expr::Add(a, b) => {
            entangled_vars(a, moving, out);
            entangled_vars(b, moving, out);
        }
        Expr::Mul(a, _) => entangled_vars(a, moving, out),
        Expr::Div(a, d) | Expr::Mod(a, d) => {
            if !moving.iter().any(|&v| a.uses(v)) {
                return;
            }
            let mut vars = Vec::new();
            a.collect_vars(&mut vars);
            let n = vars.iter().max().map_or(0, |&m| m + 1);
            // Each variable's coefficient, where the dividend is affine and non-negative.
            let coefficients =
                (*d > 0 && vars.iter().all(|&v| affine_in(a, v)) && a.eval(&vec![0; n]) >= 0)
                    .then(|| {
                        vars.iter()
                            .map(|&v| a.coefficient(v, n))
                            .collect::<Vec<_>>()
                    })
                    .filter(|cs| cs.iter().all(|&c| c >= 0));
            out.extend(
                vars.iter()
                    .enumerate()
                    .filter(|&(i, _)| coefficients.as_ref().is_none_or(|cs| cs[i] % d != 0))
                    .map(|(_, &v)| v),
            );
        }
    }
}

/// How far a padded A fragment's zero buffer may reach, in elements.
const MAX_ZERO_ELEMENTS: i64 = 1 << 16;

/// What [`Gen::padded_fragments`] found: per fragment the conditions for reading A in place
/// and the base address, the step per reduction iteration, and the zero buffer's length.
struct PaddedFragments {
    bases: Vec<(Vec<String>, String)>,
    step: i64,
    zeros: i64,
}

/// Whether `e` moves linearly with loop variable `v` (no division or remainder of it).
fn affine_in(e: &Expr, v: usize) -> bool {
    match e {
        Expr::Const(_) | Expr::Var(_) => true,
        Expr::Add(a, b) => affine_in(a, v) && affine_in(b, v),
        Expr::Mul(a, _) => affine_in(a, v),
        Expr::Div(a, _) | Expr::Mod(a, _) => !a.uses(v),
    }
}

/// The most remainder sets [`reachable_remainders`] follows before leaving the combinations
/// to be tried one by one.
const MAX_REMAINDER_SETS: usize = 1 << 14;

/// One combination of the `entangled` loops' values (the other loops at 0) for every set of
/// remainders that `q`'s dividends take over all combinations; `None` where a dividend is not
/// affine or the sets grow past [`MAX_REMAINDER_SETS`].
///
/// A loop's contribution to a remainder modulo `d` repeats with the period of its
/// coefficient, so only its first period of values is followed.
fn reachable_remainders(
    q: &QuasiAffine,
    entangled: &[usize],
    vars: &[tessel_ir::LoopVar],
    n: usize,
) -> Option<Vec<Vec<i64>>> {
    if q.atoms.iter().any(|a| !a.1.atoms.is_empty() || a.2 <= 0) {
        return None;
    }
    let origin: Vec<i64> = q
        .atoms
        .iter()
        .map(|a| a.1.constant.rem_euclid(a.2))
        .collect();
    let mut reached: HashMap<Vec<i64>, Vec<i64>> = HashMap::from([(origin, vec![0i64; n])]);
    for &v in entangled {
        let coefficients: Vec<i64> = q
            .atoms
            .iter()
            .map(|a| a.1.terms.iter().find(|t| t.0 == v).map_or(0, |t| t.1))
            .collect();
        // The least p with p * coefficient = 0 modulo every divisor.
        let period = q
            .atoms
            .iter()
            .zip(&coefficients)
            .try_fold(1i64, |p, (a, &c)| {
                let own = a.2 / gcd(c.rem_euclid(a.2), a.2);
                p.checked_mul(own / gcd(p, own))
            })?;
        let steps = period.min(i64::try_from(vars[v].extent.max(1)).ok()?);
        let mut next = HashMap::new();
        for (remainders, vals) in &reached {
            for x in 0..steps {
                let key: Vec<i64> = remainders
                    .iter()
                    .zip(&coefficients)
                    .zip(&q.atoms)
                    .map(|((&r, &c), a)| (r + c.wrapping_mul(x)).rem_euclid(a.2))
                    .collect();
                next.entry(key).or_insert_with(|| {
                    let mut vals = vals.clone();
                    vals[v] = x;
                    vals
                });
            }
            if next.len() > MAX_REMAINDER_SETS {
                return None;
            }
        }
        reached = next;
    }
    Some(reached.into_values().collect())
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a.abs().max(1)
    } else {
        gcd(b, a % b)
    }
}

/// An index expression in a normal form that evaluates without walking a tree: a constant,
/// a linear combination of loop variables, and floor divisions and remainders of such forms
/// (which [`Gen::check_layout`] evaluates up to a million times per operand). It computes
/// exactly what [`Expr::eval`] does, in the same wrapping i64 arithmetic.
#[derive(Clone, Debug, Default)]
struct QuasiAffine {
    constant: i64,
    terms: Vec<(usize, i64)>,
    /// `(coefficient, dividend, divisor, remainder)`: `coefficient * (dividend / divisor)`,
    /// or `% divisor` where `remainder`.
    atoms: Vec<(i64, QuasiAffine, i64, bool)>,
}

impl QuasiAffine {
    fn of(e: &Expr) -> QuasiAffine {
        match e {
            Expr::Const(c) => QuasiAffine {
                constant: *c,
                ..Default::default()
            },
            Expr::Var(v) => QuasiAffine {
                terms: vec![(*v, 1)],
                ..Default::default()
            },
            Expr::Add(a, b) => {
                let mut q = QuasiAffine::of(a);
                let r = QuasiAffine::of(b);
                q.constant = q.constant.wrapping_add(r.constant);
                for (v, c) in r.terms {
                    match q.terms.iter_mut().find(|t| t.0 == v) {
                        Some(t) => t.1 = t.1.wrapping_add(c),
                        None => q.terms.push((v, c)),
                    }
                }
                q.atoms.extend(r.atoms);
                q
            }
            Expr::Mul(a, c) => {
                let mut q = QuasiAffine::of(a);
                q.constant = q.constant.wrapping_mul(*c);
                for t in &mut q.terms {
                    t.1 = t.1.wrapping_mul(*c);
                }
                for a in &mut q.atoms {
                    a.0 = a.0.wrapping_mul(*c);
                }
                q
            }
            Expr::Div(a, d) | Expr::Mod(a, d) => QuasiAffine {
                atoms: vec![(1, QuasiAffine::of(a), *d, matches!(e, Expr::Mod(..)))],
                ..Default::default()
            },
        }
    }

    fn eval(&self, vals: &[i64]) -> i64 {
        let mut x = self.constant;
        for &(v, c) in &self.terms {
            x = x.wrapping_add(vals[v].wrapping_mul(c));
        }
        for (c, a, d, remainder) in &self.atoms {
            let n = a.eval(vals);
            let y = if *remainder {
                n.rem_euclid(*d)
            } else {
                n.div_euclid(*d)
            };
            x = x.wrapping_add(y.wrapping_mul(*c));
        }
        x
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tessel_ir::LoopVar;

    use super::*;

    const VARS: usize = 4;

    /// Index expressions as schedules make them: sums of scaled loop variables, floor
    /// divisions and remainders of those, nested.
    fn expr() -> impl Strategy<Value = Expr> {
        let leaf = prop_oneof![
            (0..VARS).prop_map(Expr::Var),
            (-3i64..8).prop_map(Expr::Const),
        ];
        leaf.prop_recursive(4, 24, 2, |inner| {
            prop_oneof![
                (inner.clone(), inner.clone()).prop_map(|(a, b)| Expr::Add(a.into(), b.into())),
                (inner.clone(), -4i64..9).prop_map(|(a, c)| Expr::Mul(a.into(), c)),
                (inner.clone(), 1i64..9).prop_map(|(a, d)| Expr::Div(a.into(), d)),
                (inner, 1i64..9).prop_map(|(a, d)| Expr::Mod(a.into(), d)),
            ]
        })
    }

    fn vars(extents: &[u64]) -> Vec<LoopVar> {
        extents
            .iter()
            .enumerate()
            .map(|(i, &extent)| LoopVar {
                name: format!("v{i}"),
                extent,
            })
            .collect()
    }

    /// The dividends' remainders at `vals`, the key a tile's offsets depend on.
    fn remainders(q: &QuasiAffine, vals: &[i64]) -> Vec<i64> {
        q.atoms
            .iter()
            .map(|a| a.1.eval(vals).rem_euclid(a.2))
            .collect()
    }

    proptest! {
        #[test]
        fn the_normal_form_evaluates_as_the_expression(
            e in expr(),
            vals in proptest::collection::vec(-20i64..50, VARS),
        ) {
            prop_assert_eq!(QuasiAffine::of(&e).eval(&vals), e.eval(&vals));
        }

        #[test]
        fn reachable_remainders_are_those_of_every_combination(
            e in expr(),
            extents in proptest::collection::vec(1u64..7, VARS),
            entangled_mask in proptest::collection::vec(any::<bool>(), VARS),
        ) {
            let q = QuasiAffine::of(&e);
            let entangled: Vec<usize> = (0..VARS).filter(|&v| entangled_mask[v]).collect();
            let Some(found) = reachable_remainders(&q, &entangled, &vars(&extents), VARS) else {
                // Only nested divisions (or none of the forms it follows) are left to be tried.
                prop_assert!(q.atoms.iter().any(|a| !a.1.atoms.is_empty()));
                return Ok(());
            };
            // Every combination, the other loops at 0.
            let mut all = HashSet::new();
            let combos: u64 = entangled.iter().map(|&v| extents[v]).product();
            for c in 0..combos {
                let mut vals = vec![0i64; VARS];
                let mut rest = c;
                for &v in &entangled {
                    vals[v] = (rest % extents[v]) as i64;
                    rest /= extents[v];
                }
                all.insert(remainders(&q, &vals));
            }
            let mut reached = HashSet::new();
            for vals in &found {
                // Representatives are combinations: in range, the other loops at 0.
                for v in 0..VARS {
                    prop_assert!(vals[v] >= 0 && (vals[v] as u64) < extents[v]);
                    prop_assert!(entangled.contains(&v) || vals[v] == 0);
                }
                prop_assert!(reached.insert(remainders(&q, vals)), "one representative per set");
            }
            prop_assert_eq!(reached, all);
        }
    }
}
