//! The CPU half of [`Space`]: sketches around every mapping onto an x86 instruction (tiles,
//! register block within the register file, kc, loop order, B packed into the instruction's
//! layout, A cached, parallel outer loop, local accumulator, unrolling) and the
//! compiler-vectorized fallback.

use super::*;
pub use tessel_intrin::max_accumulators;
use tessel_intrin::{Storage, TransformKind};

impl Space {
    pub(super) fn sample_tensorized(&self, mapping: usize, rng: &mut Rng) -> Sketch {
        let m = &self.mappings[mapping];
        let intr = m.intrinsic;
        let tiles = |d: usize, ext: u64| m.mapping.dims[d].extent.div_ceil(ext);
        let (mt, nt, kt) = (tiles(0, intr.m), tiles(1, intr.n), tiles(2, intr.k));
        let max_acc = max_accumulators(intr);
        let mr = pick(rng, mt, max_acc.min(8));
        let nr = pick(rng, nt, (max_acc / mr).clamp(1, 8));
        let kc = pick(rng, kt, 1024 / intr.k.max(1));
        // A third of the samples block for the caches too (BLIS), with A's block packed more
        // often than not: that is what makes the blocking pay.
        let (mc, nc) = if rng.chance(33) {
            (
                pick(rng, mt.div_ceil(mr), MAX_CACHE_BLOCKS),
                pick(rng, nt.div_ceil(nr), MAX_CACHE_BLOCKS),
            )
        } else {
            (1, 1)
        };
        let cache_a_chance = if mc * nc > 1 { 75 } else { 50 };
        Sketch::Tensorized {
            mapping,
            mr,
            nr,
            kc,
            order: rng.below(3) as u8,
            pack_b: rng.chance(75),
            cache_a: if rng.chance(cache_a_chance) {
                Some(rng.below(3) as u8)
            } else {
                None
            },
            parallel: rng.chance(80),
            local_acc: rng.chance(80),
            unroll: rng.chance(90),
            mc,
            nc,
        }
    }

    /// GotoBLAS/BLIS on `mapping`: the largest register block the register file holds (its
    /// last block along m padded with zeros where the tiles do not divide: A's block is
    /// packed, so that block runs unguarded), a kc slice whose B micro-panel takes half of a
    /// 32 KiB L1, an A block of mc rows in a quarter of a 512 KiB L2, nc columns of B within
    /// 2 MiB of L3 (at least two column blocks, for threads). Along n and k, where B is read
    /// from its packed copy rather than a zero-filled cache, the extents divide the tiles, so
    /// no guard is left in the register block. None on AMX, whose tiles are their own register
    /// file.
    pub(super) fn blis_tensorized(&self, mapping: usize) -> Option<Sketch> {
        let m = &self.mappings[mapping];
        let intr = m.intrinsic;
        if intr.id.starts_with("amx") {
            return None;
        }
        let tiles = |d: usize, ext: u64| m.mapping.dims[d].extent.div_ceil(ext);
        let (mt, nt, kt) = (tiles(0, intr.m), tiles(1, intr.n), tiles(2, intr.k));
        let nr = divisor_at_most(nt, if intr.registers >= 32 { 4 } else { 2 });
        let mr = (max_accumulators(intr) / nr).min(mt).max(1);
        let (a_bytes, b_bytes) = (intr.a.bytes() as u64, intr.b.bytes() as u64);
        let kc = divisor_at_most(kt, (16 << 10) / (nr * intr.n * intr.k * b_bytes).max(1));
        let k_bytes = kc * intr.k;
        let pow2_at_most = |x: u64| if x <= 1 { 1 } else { 1 << x.ilog2() };
        let mc = pow2_at_most((128 << 10) / (mr * intr.m * k_bytes * a_bytes).max(1))
            .min(mt.div_ceil(mr))
            .max(1);
        let nb = nt / nr;
        let nc = divisor_at_most(
            nb,
            ((2 << 20) / (nr * intr.n * k_bytes * b_bytes).max(1))
                .min(MAX_CACHE_BLOCKS)
                .min(if nb >= 2 { nb / 2 } else { 1 }),
        );
        Some(Sketch::Tensorized {
            mapping,
            mr,
            nr,
            kc,
            order: 0,
            pack_b: true,
            cache_a: Some(2),
            parallel: true,
            local_acc: false,
            unroll: true,
            mc,
            nc,
        })
    }

    /// The classic GEMM shape on `mapping` (GotoBLAS, oneDNN's brgemm, and tessel-cpu's
    /// reference schedules): A read in place by the register block that keeps the most
    /// accumulators busy (its last block along m may be padding rows, which read zeros), a
    /// 512-element k block inside each register block's rows, B packed, parallel,
    /// accumulators local and unrolled. On AMX, whose tile calls take no padding, the largest
    /// block whose tiles divide the mapping, columns and k blocks outermost. A known-good
    /// starting point for the search, which the model may not yet rank first on an
    /// instruction it has few records of.
    pub(super) fn classic_tensorized(&self, mapping: usize) -> Sketch {
        let m = &self.mappings[mapping];
        let intr = m.intrinsic;
        let tiles = |d: usize, ext: u64| m.mapping.dims[d].extent.div_ceil(ext);
        let (mt, nt, kt) = (tiles(0, intr.m), tiles(1, intr.n), tiles(2, intr.k));
        let amx = intr.id.starts_with("amx");
        let (best, order) = if amx {
            let budget = tessel_intrin::accumulator_budget(intr);
            (tessel_intrin::largest_dividing_block(mt, nt, budget, 2), 0)
        } else {
            let max_nr = if intr.registers < 32 { 2 } else { 4 };
            (
                tessel_intrin::busiest_register_block(
                    mt,
                    nt,
                    tessel_intrin::accumulator_budget(intr),
                    max_nr,
                ),
                1,
            )
        };
        let kc = (0..=9)
            .map(|p| 1u64 << (9 - p))
            .find(|&c| c * intr.k <= 512 && kt.is_multiple_of(c))
            .unwrap_or(1);
        Sketch::Tensorized {
            mapping,
            mr: best.0,
            nr: best.1,
            kc,
            order,
            pack_b: true,
            cache_a: None,
            parallel: true,
            local_acc: true,
            unroll: true,
            mc: 1,
            nc: 1,
        }
    }

    /// A direct convolution on `mapping` (oneDNN's shape): where the mapping leaves
    /// reduction loops outside the instruction (a convolution's window), the classic sketch
    /// with up to 4 vectors of output channels whatever the register file (3 pixels by 4
    /// vectors beat 6 by 2 on AVX2's 16 registers), the input read in place with no im2col
    /// copy. None elsewhere and on AMX.
    pub(super) fn direct_tensorized(&self, mapping: usize) -> Option<Sketch> {
        let m = &self.mappings[mapping];
        let intr = m.intrinsic;
        if !direct_window(&self.op, &m.mapping) {
            return None;
        }
        if intr.id.starts_with("amx") {
            return self.direct_amx(mapping);
        }
        let tiles = |d: usize, ext: u64| m.mapping.dims[d].extent.div_ceil(ext);
        let (mt, nt) = (tiles(0, intr.m), tiles(1, intr.n));
        let (mr, nr) = tessel_intrin::busiest_register_block(
            mt,
            nt,
            tessel_intrin::accumulator_budget(intr),
            4,
        );
        // The classic sketch on this mapping but for its block.
        let mut sketch = self.classic_tensorized(mapping);
        if let Sketch::Tensorized {
            mr: m_r, nr: n_r, ..
        } = &mut sketch
        {
            (*m_r, *n_r) = (mr, nr);
        }
        Some(sketch)
    }

    /// A direct convolution on AMX: the classic sketch on the instruction's partial-row
    /// mapping where it has one ([`partial_row_mapping`]: tiles that end where an image row
    /// ends), else on `mapping`, pixel blocks outside channel blocks (order 1), with the
    /// input copied once, padded, at the root where its reads leave it (a tile load cannot
    /// mix the border's zeros into its rows), and read in place by every call.
    fn direct_amx(&self, mapping: usize) -> Option<Sketch> {
        let id = self.mappings[mapping].intrinsic.id;
        let on = (0..self.mappings.len())
            .find(|&j| {
                let m = &self.mappings[j];
                m.intrinsic.id == id
                    && m.intrinsic.m < self.mappings[mapping].intrinsic.m
                    && direct_window(&self.op, &m.mapping)
            })
            .unwrap_or(mapping);
        let mut sketch = self.classic_tensorized(on);
        if let Sketch::Tensorized { cache_a, order, .. } = &mut sketch {
            // Pixel blocks outside the channel blocks: the accumulator lives per register
            // block, which then starts its tiles at zero and stores them to the output.
            *order = 1;
            if self.op.reads_outside(self.mappings[on].mapping.operands[0]) {
                *cache_a = Some(PAD_A);
            }
        }
        Some(sketch)
    }

    /// Two loop nests the C compiler vectorizes well where the instruction mappings do not:
    /// depthwise and narrow grouped convolutions, whose every mapping broadcasts one
    /// channel's input against a handful of output channels (1.2-10x behind such loops on Zen
    /// 4, `fixtures/bench/loop-seeds-2026-12-06.txt`). Both tile the output's trailing
    /// dimensions that also index the weights ([`Self::vector_vars`]: a convolution's groups
    /// and channels, a GEMM's columns, contiguous in the output) up to `lanes` elements and
    /// the next dimension (a row's pixels) around them, keep whole reductions (up to 256),
    /// local accumulators and the outermost loop parallel, and store the weights with those
    /// dimensions last, so the compiler's vectors read every operand contiguously. The first
    /// is a register block: 8 lanes by 4 pixels, those pixels and the reductions unrolled so
    /// the accumulators stay in registers; the second 64 lanes by 8 pixels, not unrolled.
    /// None for an operator without spatial variables. `seeds` offers them where the most
    /// promising mapping leaves lanes empty or runs them across the output.
    pub(super) fn loop_seeds(&self) -> Vec<Sketch> {
        let spatial = self.spatial();
        if spatial.is_empty() {
            return Vec::new();
        }
        let shared = self.vector_vars();
        let rtiles: Vec<u64> = self
            .reductions()
            .iter()
            .map(|&v| divisor_at_most(self.op.iter_vars[v].extent, 256))
            .collect();
        [(8, 4, true), (64, 8, false)]
            .into_iter()
            .map(|(lanes, row, unroll_inner)| {
                let mut tiles = vec![(1, 1); spatial.len()];
                let mut left: u64 = lanes;
                // Trailing dimensions shared with the second operand, while they fit whole.
                let first_shared = spatial.len() - shared.len();
                let mut next = spatial.len();
                while next > first_shared {
                    next -= 1;
                    let extent = self.op.iter_vars[spatial[next]].extent;
                    let inner = divisor_at_most(extent, left);
                    tiles[next].1 = inner;
                    left /= inner;
                    if inner < extent {
                        break;
                    }
                }
                if next > 0 {
                    let extent = self.op.iter_vars[spatial[next - 1]].extent;
                    tiles[next - 1].1 = divisor_at_most(extent, row);
                }
                Sketch::Scalar {
                    tiles,
                    rtiles: rtiles.clone(),
                    parallel: true,
                    local_acc: true,
                    vectorize: true,
                    unroll: None,
                    cache_input: false,
                    pack_weights: true,
                    unroll_inner,
                }
            })
            .collect()
    }

    /// The loops a loop nest's `unroll_inner` unrolls, with their extents: the inner tile's
    /// loops but the vector ones, and the reductions' inner loops, where longer than 1.
    pub(super) fn unrolled_inner(
        &self,
        tiles: &[(u64, u64)],
        rtiles: &[u64],
    ) -> Vec<(String, u64)> {
        let vector = self.vector_vars();
        let name = |v: usize| self.op.iter_vars[v].name.clone();
        let spatial = self
            .spatial()
            .into_iter()
            .zip(tiles)
            .filter(|(v, t)| !vector.contains(v) && t.1 > 1)
            .map(|(v, t)| (format!("{}.2", name(v)), t.1));
        let reductions = self
            .reductions()
            .into_iter()
            .zip(rtiles)
            .filter(|(_, t)| **t > 1)
            .map(|(v, t)| (format!("{}.1", name(v)), *t));
        spatial.chain(reductions).collect()
    }

    /// The element operations `unroll_inner` would lay out straight in a loop nest: the copies
    /// of its body times the elements of its vector tile, which the compiler vectorizes and
    /// may unroll too.
    pub(super) fn unrolled_work(&self, tiles: &[(u64, u64)], rtiles: &[u64]) -> u64 {
        let vector = self.vector_vars();
        let lanes = self
            .spatial()
            .iter()
            .zip(tiles)
            .filter(|(v, _)| vector.contains(v))
            .fold(1u64, |n, (_, t)| n.saturating_mul(t.1));
        self.unrolled_inner(tiles, rtiles)
            .iter()
            .fold(lanes, |n, l| n.saturating_mul(l.1))
    }

    /// The output's trailing spatial variables that also index the second input (a
    /// convolution's groups and channels, a GEMM's columns): where the compiler's vectors run
    /// in a loop nest.
    pub(super) fn vector_vars(&self) -> Vec<usize> {
        let spatial = self.spatial();
        let Some(b) = self.op.inputs.get(1) else {
            return Vec::new();
        };
        let from = spatial
            .iter()
            .rposition(|&v| !b.depends_on(v))
            .map_or(0, |i| i + 1);
        spatial[from..].to_vec()
    }

    /// The second input's layout with the dimensions [`Self::vector_vars`] index stored last
    /// (in their order), the rest first; None where it already is so.
    pub(super) fn weights_vector_last(&self) -> Option<LayoutTransform> {
        let b = self.op.inputs.get(1)?;
        let vector = self.vector_vars();
        let (last, first): (Vec<usize>, Vec<usize>) =
            (0..b.indices.len()).partition(|&d| vector.iter().any(|&v| b.indices[d].depends_on(v)));
        let order: Vec<usize> = first.into_iter().chain(last).collect();
        if order.iter().enumerate().all(|(i, &d)| i == d) {
            return None;
        }
        Some(LayoutTransform {
            splits: Vec::new(),
            order,
        })
    }

    pub(super) fn sample_scalar(&self, rng: &mut Rng) -> Sketch {
        let tiles: Vec<(u64, u64)> = self
            .spatial()
            .iter()
            .map(|&v| {
                let e = self.op.iter_vars[v].extent;
                let inner = pick(rng, e, 64);
                let middle = pick(rng, e.div_ceil(inner), 16);
                (middle, inner)
            })
            .collect();
        let rtiles: Vec<u64> = self
            .reductions()
            .iter()
            .map(|&v| pick(rng, self.op.iter_vars[v].extent, 256))
            .collect();
        let n = self.spatial().len();
        let unroll_inner =
            rng.chance(30) && self.unrolled_work(&tiles, &rtiles) <= MAX_UNROLLED_WORK;
        Sketch::Scalar {
            tiles,
            rtiles,
            parallel: rng.chance(80),
            local_acc: rng.chance(70),
            vectorize: rng.chance(70),
            unroll: if rng.chance(40) && n > 0 {
                Some(rng.below(n as u64) as usize)
            } else {
                None
            },
            cache_input: rng.chance(40),
            pack_weights: rng.chance(50),
            unroll_inner,
        }
    }

    pub(super) fn tensorized_trace(
        &self,
        mapping: usize,
        (mr, nr, kc, order): (u64, u64, u64, u8),
        (pack_b, cache_a, parallel, local_acc, unroll): (bool, Option<u8>, bool, bool, bool),
        (mc, nc): (u64, u64),
    ) -> Trace {
        let blocked = mc > 1 || nc > 1;
        let m = &self.mappings[mapping];
        let (intr, map) = (m.intrinsic, &m.mapping);
        let mut t = Trace::new();
        // Convert-on-pack first: operands the instruction takes in a wider type.
        map.cast_steps(&mut t);
        let outer: Vec<&str> = map.outer.iter().map(String::as_str).collect();
        let fused = map.fuse_dims(&mut t, &outer);
        let (fm, fnn, fk) = (&fused[0], &fused[1], &fused[2]);
        if blocked {
            t.split(fm, &[mc, mr, intr.m]);
            t.split(fnn, &[nc, nr, intr.n]);
        } else {
            t.split(fm, &[mr, intr.m]);
            t.split(fnn, &[nr, intr.n]);
        }
        t.split(fk, &[kc, intr.k]);
        let kind = |name: &str| {
            self.op
                .var_index(name)
                .map(|v| self.op.iter_vars[v].kind)
                .unwrap_or(IterKind::Spatial)
        };
        let s_outer: Vec<String> = map
            .outer
            .iter()
            .filter(|v| kind(v) == IterKind::Spatial)
            .cloned()
            .collect();
        let r_outer: Vec<String> = map
            .outer
            .iter()
            .filter(|v| kind(v) == IterKind::Reduction)
            .cloned()
            .collect();
        let p = |x: &str, i: u32| format!("{x}.{i}");
        let (m0, n0, k0) = (p(fm, 0), p(fnn, 0), p(fk, 0));
        // The register block's and the instruction's levels of m and n.
        let (reg, ins) = if blocked { (2, 3) } else { (1, 2) };
        // Blocked nests are GotoBLAS's, whose outer loops are order 0's.
        let order = if blocked { 0 } else { order };
        let blocks: [&String; 3] = match order {
            0 => [&n0, &k0, &m0],
            1 => [&n0, &m0, &k0],
            _ => [&m0, &n0, &k0],
        };
        let mut full: Vec<String> = s_outer.clone();
        full.extend(blocks.iter().map(|s| s.to_string()));
        if blocked {
            // Within the A block: B's micro-panels, then the register blocks down A.
            full.extend([p(fnn, 1), p(fm, 1)]);
        }
        full.extend(r_outer.iter().cloned());
        full.extend([
            p(fk, 1),
            p(fm, reg),
            p(fnn, reg),
            p(fm, ins),
            p(fnn, ins),
            p(fk, 2),
        ]);
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        t.reorder(&refs);
        if pack_b && let Some(layout) = self.b_layout(map, intr, nr) {
            t.pack(map.operands[1], layout);
        }
        // The accumulator's anchor: the innermost spatial loop before the first reduction.
        let first_red = full
            .iter()
            .position(|l| *l == k0 || r_outer.contains(l))
            .unwrap_or(0);
        if parallel && first_red > 0 {
            t.parallel(&full[0]);
        }
        if local_acc && first_red > 0 {
            let local = Scope::new("local").expect("a valid scope name");
            t.cache_write(local, Some(&full[first_red - 1]));
        }
        if cache_a == Some(PAD_A) && !blocked {
            t.pad(map.operands[0]);
        } else if let Some(at) = cache_a {
            let local = Scope::new("local").expect("a valid scope name");
            // Blocked: A's mc x kc block, packed once per (kc slice, mc rows) as BLIS does.
            let at = if blocked {
                &m0
            } else {
                blocks[at.min(2) as usize]
            };
            t.cache_read(map.operands[0], local, Some(at));
        }
        if unroll {
            t.unroll(&p(fm, reg)).unroll(&p(fnn, reg));
        }
        t.tensorize(
            intr.id,
            &[("m", &p(fm, ins)), ("n", &p(fnn, ins)), ("k", &p(fk, 2))],
            &map.operands,
        );
        t
    }

    /// Packs instruction operand B as `[.., N / (nr n), K / g, nr n, g]` when its n and k
    /// groups are single variables that each index one dimension of the tensor with stride 1.
    pub(super) fn b_layout(
        &self,
        map: &Mapping,
        intr: &Intrinsic,
        nr: u64,
    ) -> Option<LayoutTransform> {
        let [n, k] = [&map.dims[1], &map.dims[2]];
        if n.vars.len() != 1 || k.vars.len() != 1 {
            return None;
        }
        let b = &self.op.inputs[map.operands[1]];
        let dim_of = |name: &str| {
            let v = self.op.var_index(name)?;
            let dims: Vec<usize> = (0..b.indices.len())
                .filter(|&d| b.indices[d].depends_on(v))
                .collect();
            match dims.as_slice() {
                [d] if b.indices[*d].terms.len() == 1 && b.indices[*d].coeff(v) == 1 => Some(*d),
                _ => None,
            }
        };
        let (dn, dk) = (dim_of(&n.vars[0])?, dim_of(&k.vars[0])?);
        if dn == dk {
            return None;
        }
        let group = if intr.k > 1 {
            (4 / intr.b.bytes() as u64).min(intr.k)
        } else {
            1
        };
        let nb = nr * intr.n;
        let mut splits = vec![(dn, nb)];
        if group > 1 {
            splits.push((dk, group));
        }
        // Expanded dimension index of (tensor dim, part): split dims expand to outer, inner.
        let rank = b.tensor.shape.len();
        let mut expanded = Vec::new();
        for d in 0..rank {
            if splits.iter().any(|s| s.0 == d) {
                expanded.push((d, 0));
                expanded.push((d, 1));
            } else {
                expanded.push((d, 0));
            }
        }
        let at = |d: usize, part: usize| expanded.iter().position(|&e| e == (d, part));
        let mut order: Vec<usize> = (0..rank)
            .filter(|&d| d != dn && d != dk)
            .filter_map(|d| at(d, 0))
            .collect();
        order.push(at(dn, 0)?);
        order.push(at(dk, 0)?);
        order.push(at(dn, 1)?);
        if group > 1 {
            order.push(at(dk, 1)?);
        }
        splits.sort();
        Some(LayoutTransform { splits, order })
    }

    pub(super) fn scalar_trace(
        &self,
        tiles: &[(u64, u64)],
        rtiles: &[u64],
        (parallel, local_acc, vectorize, cache_input): (bool, bool, bool, bool),
        (unroll, pack_weights, unroll_inner): (Option<usize>, bool, bool),
    ) -> Trace {
        let mut t = Trace::new();
        if pack_weights && let Some(layout) = self.weights_vector_last() {
            t.pack(1, layout);
        }
        let spatial = self.spatial();
        let reductions = self.reductions();
        let name = |v: usize| self.op.iter_vars[v].name.clone();
        for (&v, &(mid, inner)) in spatial.iter().zip(tiles) {
            t.split(&name(v), &[mid, inner]);
        }
        for (&v, &inner) in reductions.iter().zip(rtiles) {
            t.split(&name(v), &[inner]);
        }
        let mut order: Vec<String> = spatial.iter().map(|&v| format!("{}.0", name(v))).collect();
        order.extend(reductions.iter().map(|&v| format!("{}.0", name(v))));
        order.extend(spatial.iter().map(|&v| format!("{}.1", name(v))));
        order.extend(reductions.iter().map(|&v| format!("{}.1", name(v))));
        order.extend(spatial.iter().map(|&v| format!("{}.2", name(v))));
        let refs: Vec<&str> = order.iter().map(String::as_str).collect();
        t.reorder(&refs);
        if let Some(&first) = spatial.first() {
            if parallel {
                t.parallel(&format!("{}.0", name(first)));
            }
            let last = spatial[spatial.len() - 1];
            let local = Scope::new("local").expect("a valid scope name");
            if local_acc {
                t.cache_write(local.clone(), Some(&format!("{}.0", name(last))));
            }
            if cache_input {
                t.cache_read(0, local, Some(&format!("{}.0", name(last))));
            }
            if let Some(u) = unroll
                && let Some(&v) = spatial.get(u)
            {
                t.unroll(&format!("{}.1", name(v)));
            }
            if unroll_inner {
                for (l, _) in self.unrolled_inner(tiles, rtiles) {
                    t.unroll(&l);
                }
            }
            if vectorize {
                let last = spatial[spatial.len() - 1];
                t.vectorize(&format!("{}.2", name(last)));
            }
        }
        t
    }
}

/// An AMX direct convolution's mapping on tiles of fewer rows, beside `m` (whole tiles):
/// where the m group's innermost variable (an output row's pixels) is not a multiple of the
/// tile's 16 rows, whole tiles cross image rows, so A's rows are not one stride apart and
/// every call gathers them (an im2col per call). Tiles of the largest divisor of the row
/// (14 rows of 56 pixels, 8 or more) end where the row ends and read the input where it lies,
/// as oneDNN's brgconv does. None for other instructions and mappings.
pub(super) fn partial_row_mapping(
    op: &ComputeOp,
    intr: &'static Intrinsic,
    m: &Mapping,
) -> Option<SpaceMapping> {
    if !matches!(intr.memory[0].storage, Storage::AmxTile { .. }) || !direct_window(op, m) {
        return None;
    }
    let row = op.iter_vars[op.var_index(m.dims[0].vars.last()?)?].extent;
    if row.is_multiple_of(intr.m) {
        return None;
    }
    let rows = divisor_at_most(row, intr.m - 1);
    if rows < 8 {
        return None;
    }
    let mut mapping = m.clone();
    mapping.dims[0].padded = mapping.dims[0].extent.div_ceil(rows) * rows;
    // A is read where it lies: in the tensor, or in its padded copy (what the seed makes).
    let a = mapping.operands[0];
    let input = op.inputs.get(a)?;
    if let Some(t) = mapping
        .transforms
        .iter_mut()
        .find(|t| t.input == input.tensor.name)
    {
        let (kind, bytes) = if op.reads_outside(a) {
            (TransformKind::Pad, padded_bytes(op, a)?)
        } else {
            (TransformKind::Direct, 0)
        };
        (t.kind, t.bytes) = (kind, bytes);
    }
    Some(SpaceMapping {
        intrinsic: tessel_intrin::partial_rows(intr.id, rows)?,
        mapping,
    })
}

/// Bytes of input `input` copied padded: every index its reads take, per dimension.
fn padded_bytes(op: &ComputeOp, input: usize) -> Option<u64> {
    let a = op.inputs.get(input)?;
    a.indices
        .iter()
        .try_fold(a.tensor.dtype.bytes() as u64, |acc, e| {
            let (lo, hi) = op.index_range(e)?;
            acc.checked_mul(u64::try_from(hi.checked_sub(lo)?.checked_add(1)?).ok()?)
        })
}

/// The largest divisor of `extent` not above `cap` (1 divides everything).
fn divisor_at_most(extent: u64, cap: u64) -> u64 {
    (1..=cap.min(extent).max(1))
        .rev()
        .find(|d| extent.is_multiple_of(*d))
        .unwrap_or(1)
}

/// Lower is more promising: padding first; then whether the instruction's n (its vector
/// lanes or tile columns) runs along the output's contiguous dimension; then the work inside
/// the instruction dimensions (large m and k leave room for register blocks and long
/// reductions); then the bytes the transforms move.
pub(super) fn promise(op: &ComputeOp, m: &Mapping) -> f64 {
    let work = (m.dims[0].extent as f64 * m.dims[2].extent as f64).max(1.0);
    let waste = (m.padding_waste() * 100.0).round();
    waste * 1e6 + if lanes_along_output(op, m) { 0.0 } else { 1e5 } - work.log2() * 1e3
        + (m.transform_bytes() as f64 + 1.0).log2()
}

/// Whether the instruction's n (its vector lanes or tile columns) runs along the output's
/// contiguous dimension.
fn lanes_along_output(op: &ComputeOp, m: &Mapping) -> bool {
    let last_n = m.dims[1].vars.last().and_then(|v| op.var_index(v));
    last_n.is_some_and(|v| {
        op.output
            .indices
            .last()
            .is_some_and(|e| e.terms.len() == 1 && e.coeff(v) == 1)
    })
}

/// Whether `m` fills the instruction's lanes along the output's contiguous dimension with no
/// padding: where a space's most promising mapping does not, vectorized loops may beat it
/// (depthwise convolutions, whose channels index every operand).
pub(super) fn fills_lanes(op: &ComputeOp, m: &Mapping) -> bool {
    m.padding_waste() == 0.0 && lanes_along_output(op, m)
}

/// Whether `m` is a direct convolution's mapping: reductions left outside the instruction (a
/// window), and one reduction variable in its k that indexes one dimension of A alone (the
/// input channels), so A's reads move along that dimension only and stay in place.
pub(super) fn direct_window(op: &ComputeOp, m: &Mapping) -> bool {
    let reduction = |name: &str| {
        op.var_index(name)
            .is_some_and(|i| op.iter_vars[i].kind == IterKind::Reduction)
    };
    let [k] = m.dims[2].vars.as_slice() else {
        return false;
    };
    let (Some(v), Some(a)) = (op.var_index(k), op.inputs.get(m.operands[0])) else {
        return false;
    };
    let dims: Vec<_> = a.indices.iter().filter(|e| e.depends_on(v)).collect();
    m.outer.iter().any(|o| reduction(o))
        && matches!(dims.as_slice(), [e] if e.terms.len() == 1 && e.coeff(v) == 1)
}
