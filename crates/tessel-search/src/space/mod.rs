//! The schedule space of one operator on the CPU: every mapping onto every usable instruction,
//! each with multi-level tiling, register blocking, B packing, loop order, parallelism and
//! unrolling, plus the non-tensorized fallback. A point of the space is a [`Sketch`]; its
//! [`Space::trace`] is an ordinary tessel-ir trace.

use std::fmt;

use serde::{Deserialize, Serialize};
use tessel_intrin::{Catalog, HostCpu, Intrinsic, Mapping, Support, match_op};
use tessel_ir::{ComputeOp, IterKind, LayoutTransform, Program, Scope, Trace};

use crate::rng::Rng;

mod cpu;
pub(crate) mod gpu;

pub use cpu::max_accumulators;
use cpu::{fills_lanes, promise};

/// At most this many mappings per instruction (least padding first) enter the space.
const MAX_MAPPINGS_PER_INSTRUCTION: usize = 8;

/// `cache_a` beyond the block loops: A copied once at the root in its own layout, padded
/// (`Step::Pad`: the AMX direct convolution's input). Seeds and mutations use it; random
/// sketches draw the block loops 0..3.
pub(crate) const PAD_A: u8 = 3;

/// Cache blocks hold at most this many register blocks along m or n.
pub(crate) const MAX_CACHE_BLOCKS: u64 = 64;

/// A loop nest whose unrolled inner loops would lay out more element operations than this
/// (copies of the body times the vector tile's elements) is rejected before compilation:
/// gcc took over 30 s on nests of 5,376 and more, 3 s on the 1,152 of a seed.
pub const MAX_UNROLLED_WORK: u64 = 2048;

/// Accumulators and caches larger than this (per anchor) are rejected before compilation.
const MAX_LOCAL_BYTES: u64 = 4 << 20;

/// One point of the space.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sketch {
    /// Through mapping `mapping` of the space.
    Tensorized {
        mapping: usize,
        /// Instruction tiles per register block along m and n.
        mr: u64,
        nr: u64,
        /// Instruction k-steps per reduction block.
        kc: u64,
        /// Loop order: 0 = n, k, m (B block reused across m), 1 = n, m, k, 2 = m, n, k.
        order: u8,
        pack_b: bool,
        /// Copy instruction operand A into a dense local buffer inside this block loop (0..3
        /// in loop order): im2col with zero padding for convolutions, contiguous tiles for
        /// row-major A; [`PAD_A`]: once at the root in its own layout, padded. None: read A
        /// in place.
        cache_a: Option<u8>,
        parallel: bool,
        local_acc: bool,
        unroll: bool,
        /// Register blocks per cache block along m and n (BLIS's mc / (mr m), nc / (nr n)).
        /// Above 1, the nest is GotoBLAS's: nc columns, a kc slice, mc rows (A's block packed
        /// there when `cache_a` is set), then the register blocks of that block, so the A block
        /// stays in L2 and each B micro-panel in L1; `order` is not used then. 1 and 1: no
        /// cache-level blocking (the records before these fields).
        #[serde(default = "one", skip_serializing_if = "is_one")]
        mc: u64,
        #[serde(default = "one", skip_serializing_if = "is_one")]
        nc: u64,
    },
    /// Plain loops that the C compiler vectorizes.
    Scalar {
        /// Per spatial variable: (middle, inner) tile extents.
        tiles: Vec<(u64, u64)>,
        /// Per reduction variable: inner tile extent.
        rtiles: Vec<u64>,
        parallel: bool,
        local_acc: bool,
        vectorize: bool,
        /// Unroll the middle tile of this spatial variable.
        unroll: Option<usize>,
        /// Copy the first input's tile into a local buffer at the outer tile loops (zero
        /// padding included, so the inner loops read without bounds checks).
        cache_input: bool,
        /// Copy the second input (the weights) once at the root with the dimensions that the
        /// output's trailing variables index stored last, so the compiler's vectors read it
        /// contiguously: a convolution's `W[g, k, r, s, c]` as `[r, s, c, g, k]`, a dense
        /// layer's `B[n, k]` as `[k, n]` (where the weights already are so, nothing is copied).
        #[serde(default, skip_serializing_if = "is_false")]
        pack_weights: bool,
        /// Unroll the inner tile's loops but the vector ones ([`Space::vector_vars`]) and the
        /// reductions' inner loops, so that the compiler keeps a small accumulator tile in
        /// registers across the reduction (a depthwise convolution's 4 pixels by 8 channels
        /// through its unrolled 3x3 window). At most [`MAX_UNROLLED_WORK`] element operations.
        #[serde(default, skip_serializing_if = "is_false")]
        unroll_inner: bool,
    },
    /// A GPU kernel on Tensor Cores (WMMA or mma.sync): blocks of `wm x wn` warps, each warp computing
    /// `fm x fn` instruction tiles; A and B staged in shared memory per `kc` k-steps.
    TensorCore {
        mapping: usize,
        wm: u64,
        wn: u64,
        fm: u64,
        #[serde(rename = "fn")]
        fn_: u64,
        kc: u64,
        /// Shared-memory buffers in flight (cp.async pipeline when above 1).
        stages: u32,
        /// Split-K: the reduction is cut in this many parts, one per blockIdx.z, whose partial
        /// sums add into the output (1: no split).
        #[serde(default = "one", skip_serializing_if = "is_one")]
        split: u64,
    },
    /// A GPU kernel on CUDA cores: each thread computes a `ry x rx` register tile of the two
    /// innermost output dimensions; blocks of `ty x tx` threads.
    Simt {
        tx: u64,
        ty: u64,
        rx: u64,
        ry: u64,
        /// Inner extent of every reduction loop.
        rtile: u64,
        /// Stage the inputs in shared memory per reduction block.
        shared: bool,
    },
}

/// A usable mapping: the instruction and how the operator maps onto it.
#[derive(Clone, Debug)]
pub struct SpaceMapping {
    pub intrinsic: &'static Intrinsic,
    pub mapping: Mapping,
}

impl SpaceMapping {
    /// `instruction: mapping`, as records carry it (`TuningRecord::mapping`); `coverage`
    /// matches records to today's mappings by it.
    pub fn label(&self) -> String {
        let whole = catalog_static().get(self.intrinsic.id).map(|i| i.m);
        if whole.is_some_and(|m| m != self.intrinsic.m) {
            format!(
                "{} ({}-row tiles): {}",
                self.intrinsic.id, self.intrinsic.m, self.mapping
            )
        } else {
            format!("{}: {}", self.intrinsic.id, self.mapping)
        }
    }
}

/// The space of one operator.
pub struct Space {
    pub(crate) op: ComputeOp,
    pub(crate) mappings: Vec<SpaceMapping>,
    catalog: Catalog,
    skipped: Vec<(String, String)>,
    /// A GPU space: Tensor Core and SIMT sketches instead of the CPU's.
    pub(crate) gpu: bool,
}

/// Which instructions a space may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InstructionSet {
    /// What this CPU (and OS) supports.
    Host,
    /// Exactly these ids (for tests and emulation).
    Only(Vec<String>),
    /// None: the non-tensorized fallback only.
    None,
    /// An NVIDIA GPU of this compute capability: the WMMA Tensor Core instructions it has,
    /// and the SIMT fallback.
    Gpu { cc: (u32, u32) },
}

fn catalog_static() -> &'static Catalog {
    static CATALOG: std::sync::OnceLock<Catalog> = std::sync::OnceLock::new();
    CATALOG.get_or_init(Catalog::default)
}

pub use tessel_intrin::CPU_INSTRUCTIONS;

impl Space {
    /// The space of `op` over `set`'s instructions. Instructions that cannot serve the operator
    /// are listed in [`Space::skipped`] with the reason.
    pub fn new(op: &ComputeOp, set: &InstructionSet) -> Space {
        let catalog = catalog_static();
        let host = HostCpu::detect();
        let mut mappings = Vec::new();
        let mut skipped = Vec::new();
        let ids: Vec<String> = match set {
            // Opt-in instructions (results that depend on value ranges) only when named.
            InstructionSet::Host => tessel_intrin::default_cpu_instructions()
                .map(str::to_string)
                .collect(),
            InstructionSet::Only(ids) => ids.clone(),
            InstructionSet::None => Vec::new(),
            InstructionSet::Gpu { cc } => gpu::gpu_instructions(catalog, *cc),
        };
        for id in ids {
            let Some(intr) = catalog.get(&id) else {
                skipped.push((id.clone(), "unknown instruction".into()));
                continue;
            };
            if *set == InstructionSet::Host
                && let Support::No(why) = host.supports(intr)
            {
                skipped.push((id.clone(), why));
                continue;
            }
            match match_op(op, intr) {
                Ok(mut ms) => {
                    if matches!(set, InstructionSet::Gpu { .. }) {
                        // The GPU generator emits no packing kernels, so no conversions.
                        ms.retain(|m| !m.converts());
                        if ms.is_empty() {
                            skipped.push((
                                id.clone(),
                                "needs a type conversion on the way in, which the GPU code generator does not emit".into(),
                            ));
                            continue;
                        }
                    }
                    ms.sort_by(|a, b| promise(op, a).total_cmp(&promise(op, b)));
                    // A convolution's direct mapping (the window outside, the channels in k)
                    // does the least work per call, so it may rank past the cut: keep the
                    // most promising one anyway.
                    let mut keep = MAX_MAPPINGS_PER_INSTRUCTION.min(ms.len());
                    if !matches!(set, InstructionSet::Gpu { .. })
                        && let Some(d) = ms.iter().position(|m| cpu::direct_window(op, m))
                        && d >= keep
                    {
                        let direct = ms.remove(d);
                        ms.insert(keep, direct);
                        keep += 1;
                    }
                    let partial: Vec<SpaceMapping> = if matches!(set, InstructionSet::Gpu { .. }) {
                        Vec::new()
                    } else {
                        ms.iter()
                            .take(keep)
                            .filter_map(|m| cpu::partial_row_mapping(op, intr, m))
                            .take(1)
                            .collect()
                    };
                    mappings.extend(ms.into_iter().take(keep).map(|mapping| SpaceMapping {
                        intrinsic: intr,
                        mapping,
                    }));
                    mappings.extend(partial);
                }
                Err(e) => skipped.push((id.clone(), e.to_string())),
            }
        }
        Space {
            op: op.clone(),
            mappings,
            catalog: Catalog::default(),
            skipped,
            gpu: matches!(set, InstructionSet::Gpu { .. }),
        }
    }

    /// The instruction catalog traces of this space resolve against.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    pub fn op(&self) -> &ComputeOp {
        &self.op
    }

    pub fn mappings(&self) -> &[SpaceMapping] {
        &self.mappings
    }

    /// Instructions left out, and why.
    pub fn skipped(&self) -> &[(String, String)] {
        &self.skipped
    }

    /// The instruction a sketch uses, if any.
    pub fn intrinsic(&self, s: &Sketch) -> Option<&'static Intrinsic> {
        match s {
            Sketch::Tensorized { mapping, .. } | Sketch::TensorCore { mapping, .. } => {
                self.mappings.get(*mapping).map(|m| m.intrinsic)
            }
            Sketch::Scalar { .. } | Sketch::Simt { .. } => None,
        }
    }

    /// A one-line description of the mapping a sketch uses.
    pub fn mapping_label(&self, s: &Sketch) -> Option<String> {
        match s {
            Sketch::Tensorized { mapping, .. } | Sketch::TensorCore { mapping, .. } => {
                self.mappings.get(*mapping).map(SpaceMapping::label)
            }
            Sketch::Scalar { .. } | Sketch::Simt { .. } => None,
        }
    }

    pub(crate) fn spatial(&self) -> Vec<usize> {
        self.op.spatial_vars().collect()
    }

    pub(crate) fn reductions(&self) -> Vec<usize> {
        self.op.reduction_vars().collect()
    }

    /// A random point: a mapping (or the fallback, one time in `1 + mappings`), then its
    /// parameters, biased towards divisors but able to reach every value.
    pub fn sample(&self, rng: &mut Rng) -> Sketch {
        if self.gpu {
            return self.sample_gpu(rng);
        }
        let choice = rng.below(self.mappings.len() as u64 + 1) as usize;
        if choice == self.mappings.len() {
            return self.sample_scalar(rng);
        }
        self.sample_tensorized(choice, rng)
    }

    /// Known-good sketches to measure first: the classic GEMM shape, the BLIS one and, for
    /// convolutions, the direct one on the most promising mapping of each instruction, and,
    /// where the first instruction's most promising mapping pads its lanes or runs them
    /// across the output, two vectorized loop nests after its seeds (CPU spaces; none on a
    /// GPU). The first instruction's classic sketch comes first.
    pub fn seeds(&self) -> Vec<Sketch> {
        if self.gpu {
            return Vec::new();
        }
        let mut seen = Vec::new();
        let mut out = Vec::new();
        for (i, m) in self.mappings.iter().enumerate() {
            let id = m.intrinsic.id;
            if seen.contains(&id) {
                continue;
            }
            seen.push(id);
            let mut found = vec![self.classic_tensorized(i)];
            found.extend(self.blis_tensorized(i));
            // The direct convolution on the instruction's most promising direct mapping (its
            // most promising mapping may be im2col's).
            let direct = (i..self.mappings.len()).find(|&j| {
                self.mappings[j].intrinsic.id == id
                    && cpu::direct_window(&self.op, &self.mappings[j].mapping)
            });
            found.extend(direct.and_then(|j| self.direct_tensorized(j)));
            // The loops right after the first instruction's seeds, so that a search's first
            // batch (which takes the first half-batch of seeds) always holds them; only where
            // that instruction's most promising mapping pads its lanes or runs them across
            // the output (a GEMM's classic sketch is 5-10x ahead of any loops).
            if seen.len() == 1 && !fills_lanes(&self.op, &m.mapping) {
                found.extend(self.loop_seeds());
            }
            for s in found {
                if !out.contains(&s) {
                    out.push(s);
                }
            }
        }
        if self.mappings.is_empty() {
            out.extend(self.loop_seeds());
        }
        out
    }

    /// A neighbour: one parameter changed (occasionally a different mapping).
    pub fn mutate(&self, s: &Sketch, rng: &mut Rng) -> Sketch {
        if rng.chance(10) {
            return self.sample(rng);
        }
        if self.gpu {
            return self.mutate_gpu(s, rng);
        }
        let mut s = s.clone();
        match &mut s {
            Sketch::TensorCore { .. } | Sketch::Simt { .. } => return self.sample(rng),
            Sketch::Tensorized {
                mapping,
                mr,
                nr,
                kc,
                order,
                pack_b,
                cache_a,
                parallel,
                local_acc,
                unroll,
                mc,
                nc,
            } => {
                let Some(m) = self.mappings.get(*mapping) else {
                    return self.sample(rng);
                };
                let intr = m.intrinsic;
                let tiles = |d: usize, ext: u64| m.mapping.dims[d].extent.div_ceil(ext);
                let max_acc = max_accumulators(intr);
                if rng.chance(20) {
                    // The cache level: on, off, or one of its two extents redrawn.
                    let (mb, nb) = (
                        tiles(0, intr.m).div_ceil(*mr),
                        tiles(1, intr.n).div_ceil(*nr),
                    );
                    match rng.below(4) {
                        0 => (*mc, *nc) = (1, 1),
                        1 => *mc = pick(rng, mb, MAX_CACHE_BLOCKS),
                        2 => *nc = pick(rng, nb, MAX_CACHE_BLOCKS),
                        _ => {
                            *mc = pick(rng, mb, MAX_CACHE_BLOCKS);
                            *nc = pick(rng, nb, MAX_CACHE_BLOCKS);
                        }
                    }
                    return s;
                }
                match rng.below(8) {
                    0 => *mr = pick(rng, tiles(0, intr.m), max_acc.min(8)),
                    1 => *nr = pick(rng, tiles(1, intr.n), (max_acc / *mr).clamp(1, 8)),
                    2 | 3 => *kc = pick(rng, tiles(2, intr.k), 1024 / intr.k.max(1)),
                    4 => *order = rng.below(3) as u8,
                    5 => {
                        if rng.chance(50) {
                            *pack_b = !*pack_b
                        } else {
                            // The padded root copy too (PAD_A), which sampling never draws.
                            *cache_a = match cache_a {
                                Some(_) if rng.chance(50) => None,
                                _ => Some(rng.below(u64::from(PAD_A) + 1) as u8),
                            }
                        }
                    }
                    6 => *local_acc = !*local_acc,
                    _ => {
                        if rng.chance(50) {
                            *parallel = !*parallel
                        } else {
                            *unroll = !*unroll
                        }
                    }
                }
            }
            Sketch::Scalar {
                tiles,
                rtiles,
                parallel,
                local_acc,
                vectorize,
                unroll,
                cache_input,
                pack_weights,
                unroll_inner,
            } => {
                let spatial = self.spatial();
                let reductions = self.reductions();
                match rng.below(5) {
                    0 | 1 if !tiles.is_empty() => {
                        let i = rng.below(tiles.len() as u64) as usize;
                        let e = self.op.iter_vars[spatial[i]].extent;
                        let inner = pick(rng, e, 64);
                        tiles[i] = (pick(rng, e.div_ceil(inner), 16), inner);
                    }
                    2 if !rtiles.is_empty() => {
                        let i = rng.below(rtiles.len() as u64) as usize;
                        rtiles[i] = pick(rng, self.op.iter_vars[reductions[i]].extent, 256);
                    }
                    3 => match rng.below(5) {
                        0 => *parallel = !*parallel,
                        1 => *local_acc = !*local_acc,
                        2 => *cache_input = !*cache_input,
                        3 => *pack_weights = !*pack_weights,
                        _ => *unroll_inner = !*unroll_inner,
                    },
                    _ => {
                        if rng.chance(50) || tiles.is_empty() {
                            *vectorize = !*vectorize
                        } else {
                            *unroll = match unroll {
                                Some(_) => None,
                                None => Some(rng.below(tiles.len() as u64) as usize),
                            }
                        }
                    }
                }
                // Unrolled inner loops only where their work fits (as sampling draws them):
                // a larger tile or reduction block turns them off.
                if *unroll_inner && self.unrolled_work(tiles, rtiles) > MAX_UNROLLED_WORK {
                    *unroll_inner = false;
                }
            }
        }
        s
    }

    /// A child of two parents (Ansor's crossover): where both use the same mapping (or both
    /// are loops of the same shape), each group of parameters that belong together comes
    /// from one parent or the other: the register block, the reduction block, the loop
    /// order, the operand copies, the cache blocks, the flags. Parents of different kinds or
    /// mappings share no genes; the child is then the first parent.
    pub fn crossover(&self, a: &Sketch, b: &Sketch, rng: &mut Rng) -> Sketch {
        let mut child = a.clone();
        match (&mut child, b) {
            (
                Sketch::Tensorized {
                    mapping,
                    mr,
                    nr,
                    kc,
                    order,
                    pack_b,
                    cache_a,
                    parallel,
                    local_acc,
                    unroll,
                    mc,
                    nc,
                },
                Sketch::Tensorized {
                    mapping: bm,
                    mr: bmr,
                    nr: bnr,
                    kc: bkc,
                    order: border,
                    pack_b: bpack,
                    cache_a: bcache,
                    parallel: bpar,
                    local_acc: bacc,
                    unroll: bunroll,
                    mc: bmc,
                    nc: bnc,
                },
            ) if *mapping == *bm => {
                if rng.chance(50) {
                    (*mr, *nr) = (*bmr, *bnr);
                }
                if rng.chance(50) {
                    *kc = *bkc;
                }
                if rng.chance(50) {
                    *order = *border;
                }
                if rng.chance(50) {
                    (*pack_b, *cache_a) = (*bpack, *bcache);
                }
                if rng.chance(50) {
                    (*mc, *nc) = (*bmc, *bnc);
                }
                if rng.chance(50) {
                    (*parallel, *local_acc, *unroll) = (*bpar, *bacc, *bunroll);
                }
            }
            (
                Sketch::Scalar {
                    tiles,
                    rtiles,
                    parallel,
                    local_acc,
                    vectorize,
                    unroll,
                    cache_input,
                    pack_weights,
                    unroll_inner,
                },
                Sketch::Scalar {
                    tiles: bt,
                    rtiles: brt,
                    parallel: bpar,
                    local_acc: bacc,
                    vectorize: bvec,
                    unroll: bunroll,
                    cache_input: bcache,
                    pack_weights: bpack,
                    unroll_inner: binner,
                },
            ) if tiles.len() == bt.len() && rtiles.len() == brt.len() => {
                for (t, bt) in tiles.iter_mut().zip(bt) {
                    if rng.chance(50) {
                        *t = *bt;
                    }
                }
                for (t, bt) in rtiles.iter_mut().zip(brt) {
                    if rng.chance(50) {
                        *t = *bt;
                    }
                }
                if rng.chance(50) {
                    (*parallel, *local_acc, *vectorize, *unroll, *unroll_inner) =
                        (*bpar, *bacc, *bvec, *bunroll, *binner);
                }
                if rng.chance(50) {
                    (*cache_input, *pack_weights) = (*bcache, *bpack);
                }
            }
            (
                Sketch::TensorCore {
                    mapping,
                    wm,
                    wn,
                    fm,
                    fn_,
                    kc,
                    stages,
                    split,
                },
                Sketch::TensorCore {
                    mapping: bm,
                    wm: bwm,
                    wn: bwn,
                    fm: bfm,
                    fn_: bfn,
                    kc: bkc,
                    stages: bstages,
                    split: bsplit,
                },
            ) if *mapping == *bm => {
                if rng.chance(50) {
                    (*wm, *wn) = (*bwm, *bwn);
                }
                if rng.chance(50) {
                    (*fm, *fn_) = (*bfm, *bfn);
                }
                if rng.chance(50) {
                    (*kc, *stages) = (*bkc, *bstages);
                }
                if rng.chance(50) {
                    *split = *bsplit;
                }
            }
            (
                Sketch::Simt {
                    tx,
                    ty,
                    rx,
                    ry,
                    rtile,
                    shared,
                },
                Sketch::Simt {
                    tx: btx,
                    ty: bty,
                    rx: brx,
                    ry: bry,
                    rtile: brtile,
                    shared: bshared,
                },
            ) => {
                if rng.chance(50) {
                    (*tx, *ty) = (*btx, *bty);
                }
                if rng.chance(50) {
                    (*rx, *ry) = (*brx, *bry);
                }
                if rng.chance(50) {
                    (*rtile, *shared) = (*brtile, *bshared);
                }
            }
            _ => {}
        }
        child
    }

    /// Rejects, before any compilation, sketches that cannot fit: more accumulators than the
    /// instruction's register file, accumulator buffers beyond the cache budget.
    pub fn check(&self, s: &Sketch) -> Result<(), String> {
        match s {
            Sketch::Tensorized {
                mapping,
                mr,
                nr,
                kc,
                mc,
                nc,
                ..
            } => {
                let m = self
                    .mappings
                    .get(*mapping)
                    .ok_or_else(|| format!("no mapping #{mapping}"))?;
                if [*mr, *nr, *kc, *mc, *nc].contains(&0) {
                    return Err("a block extent of 0".into());
                }
                let cap = max_accumulators(m.intrinsic);
                if mr * nr > cap {
                    return Err(format!(
                        "a {mr}x{nr} register block needs {} accumulators; {} has room for {cap}",
                        mr * nr,
                        m.intrinsic.id
                    ));
                }
                Ok(())
            }
            Sketch::Scalar {
                tiles,
                rtiles,
                unroll_inner,
                ..
            } => {
                if tiles.len() != self.spatial().len() || rtiles.len() != self.reductions().len() {
                    return Err("sketch does not fit this operator".into());
                }
                if *unroll_inner {
                    let work = self.unrolled_work(tiles, rtiles);
                    if work > MAX_UNROLLED_WORK {
                        return Err(format!(
                            "unrolling the inner loops would lay out {work} element operations; at most {MAX_UNROLLED_WORK}"
                        ));
                    }
                }
                Ok(())
            }
            Sketch::TensorCore { .. } | Sketch::Simt { .. } => self.check_gpu(s),
        }
    }

    /// The trace of a sketch.
    pub fn trace(&self, s: &Sketch) -> Result<Trace, String> {
        self.check(s)?;
        match s {
            Sketch::Tensorized {
                mapping,
                mr,
                nr,
                kc,
                order,
                pack_b,
                cache_a,
                parallel,
                local_acc,
                unroll,
                mc,
                nc,
            } => Ok(self.tensorized_trace(
                *mapping,
                (*mr, *nr, *kc, *order),
                (*pack_b, *cache_a, *parallel, *local_acc, *unroll),
                (*mc, *nc),
            )),
            Sketch::Scalar {
                tiles,
                rtiles,
                parallel,
                local_acc,
                vectorize,
                unroll,
                cache_input,
                pack_weights,
                unroll_inner,
            } => Ok(self.scalar_trace(
                tiles,
                rtiles,
                (*parallel, *local_acc, *vectorize, *cache_input),
                (*unroll, *pack_weights, *unroll_inner),
            )),
            Sketch::TensorCore { .. } | Sketch::Simt { .. } => self.gpu_trace(s),
        }
    }

    /// Trace, replay and lowering, with the capacity check on the accumulator.
    pub fn lower(&self, s: &Sketch) -> Result<(Trace, Program), String> {
        let t = self.trace(s)?;
        let p = t
            .lower(&self.op, &self.catalog)
            .map_err(|e| e.to_string())?;
        // An accumulator at the root in global memory is the output's padded shadow (BLIS's
        // C, loaded and stored around each kc slice): it may be as large as the output, with
        // room for the padding of the last blocks.
        let shadow_budget = MAX_LOCAL_BYTES.max(
            self.op
                .output
                .tensor
                .elements()
                .saturating_mul(self.op.accumulator.bytes() as u64)
                .saturating_mul(2),
        );
        for b in &p.buffers {
            let budget = match b.role {
                tessel_ir::BufferRole::Accumulator if b.scope == Scope::global() => shadow_budget,
                tessel_ir::BufferRole::Accumulator | tessel_ir::BufferRole::Cache { .. } => {
                    MAX_LOCAL_BYTES
                }
                _ => continue,
            };
            if b.bytes() > budget {
                return Err(format!(
                    "{} of {} bytes exceeds the {budget}-byte budget of a local buffer",
                    b.name,
                    b.bytes()
                ));
            }
        }
        Ok((t, p))
    }
}

impl fmt::Display for Sketch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match serde_json::to_string(self) {
            Ok(s) => f.write_str(&s),
            Err(_) => f.write_str("<sketch>"),
        }
    }
}

/// A value in `1..=max.min(extent)`: a divisor of `extent` four times in five (so tiles
/// rarely pad), any value otherwise (so the whole range stays reachable).
pub(crate) fn pick(rng: &mut Rng, extent: u64, max: u64) -> u64 {
    let hi = max.min(extent).max(1);
    if rng.chance(80) {
        let divisors: Vec<u64> = (1..=hi).filter(|d| extent.is_multiple_of(*d)).collect();
        divisors[rng.below(divisors.len() as u64) as usize]
    } else {
        1 + rng.below(hi)
    }
}

fn one() -> u64 {
    1
}

fn is_one(x: &u64) -> bool {
    *x == 1
}

fn is_false(x: &bool) -> bool {
    !*x
}
