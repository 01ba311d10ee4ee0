//! The GPU half of [`Space`]: Tensor Core (WMMA) sketches around every mapping, and the SIMT
//! fallback. Both become ordinary traces: block/warp/thread bindings, a per-warp (or
//! per-thread) accumulator, shared-memory staging of the inputs per reduction block, and a
//! software pipeline over that block.

use tessel_intrin::{Catalog, Platform, Requirement};
use tessel_ir::{GpuAxis, IterKind, Scope, Trace};

use super::{Sketch, Space, pick};
use crate::rng::Rng;

/// Threads per block, the CUDA limit.
pub const GPU_MAX_THREADS: u64 = 1024;

/// Shared memory per block the space allows (unpadded tiles, all stages); each device then
/// refuses what exceeds its own limit (64 KB on a T4, 99 KB on Ada, 227 KB on Hopper).
pub const GPU_MAX_SHARED_BYTES: u64 = 96 << 10;

/// Accumulator registers per lane (16 WMMA 16x16 fragments, or 32 mma.sync 16x8 tiles),
/// within the 255-register budget.
const MAX_ACC_REGISTERS: u64 = 128;

/// Accumulator values per SIMT thread (registers).
const MAX_SIMT_ACCUMULATORS: u64 = 64;

/// The Tensor Core instructions a GPU of compute capability `cc` runs that the code generator
/// emits: WMMA, and 16-bit mma.sync (int8 mma.sync and wgmma are described in the catalog but
/// not generated yet).
pub(crate) fn gpu_instructions(catalog: &Catalog, cc: (u32, u32)) -> Vec<String> {
    catalog
        .intrinsics
        .iter()
        .filter(|i| i.platform == Platform::Nvidia && !i.description_only)
        .filter(|i| i.family == "wmma" || (i.family == "mma.sync" && i.a.bytes() == 2))
        // tf32 needs its own rounding of the inputs; not generated yet.
        .filter(|i| i.a != tessel_ir::DType::F32)
        .filter(|i| matches!(i.requires, Requirement::ComputeCapability(a, b) if (a, b) <= cc))
        .map(|i| i.id.to_string())
        .collect()
}

/// Registers per lane of one accumulator fragment.
fn acc_registers(i: &tessel_intrin::Intrinsic) -> u64 {
    (i.m * i.n / 32).max(1)
}

fn scope(name: &str) -> Scope {
    Scope::new(name).expect("a valid scope name")
}

impl Space {
    pub(crate) fn sample_gpu(&self, rng: &mut Rng) -> Sketch {
        // Tensor Cores three times in four when the operator maps onto them.
        if !self.mappings.is_empty() && rng.chance(75) {
            let mapping = rng.below(self.mappings.len() as u64) as usize;
            return self.sample_tensor_core(mapping, rng);
        }
        self.sample_simt(rng)
    }

    fn tiles(&self, mapping: usize) -> (u64, u64, u64) {
        let m = &self.mappings[mapping];
        let t = |d: usize, e: u64| m.mapping.dims[d].extent.div_ceil(e.max(1));
        let i = m.intrinsic;
        (t(0, i.m), t(1, i.n), t(2, i.k))
    }

    fn sample_tensor_core(&self, mapping: usize, rng: &mut Rng) -> Sketch {
        let (mt, nt, kt) = self.tiles(mapping);
        let wm = pick(rng, mt, 4);
        let wn = pick(rng, nt, 4);
        let fm = pick(rng, mt.div_ceil(wm), 4);
        // Narrow tiles (mma.sync's n = 8) take twice as many fragments for the same warp tile.
        let i = self.mappings[mapping].intrinsic;
        let widest = if i.n < 16 { 8 } else { 4 };
        let fn_ = pick(
            rng,
            nt.div_ceil(wn),
            (MAX_ACC_REGISTERS / (fm * acc_registers(i))).clamp(1, widest),
        );
        let kc = pick(rng, kt, 4);
        // Split-K one time in four where it applies and the reduction is long enough.
        let steps = kt.div_ceil(kc);
        let split = if self.split_k_allowed(mapping) && steps >= 4 && rng.chance(25) {
            [2, 4, 8][rng.below(3) as usize].min(steps / 2)
        } else {
            1
        };
        Sketch::TensorCore {
            mapping,
            wm,
            wn,
            fm,
            fn_,
            kc,
            stages: 1 + rng.below(3) as u32,
            split,
        }
    }

    /// Split-K adds partial sums into the output: it needs the output in the accumulator's
    /// type, no epilogue, and blockIdx.z free (no batch dimension).
    fn split_k_allowed(&self, mapping: usize) -> bool {
        let op = &self.op;
        op.epilogue.is_empty()
            && op.output.tensor.dtype == op.accumulator
            && self.mappings.get(mapping).is_some_and(|m| {
                !m.mapping
                    .outer
                    .iter()
                    .any(|v| self.kind(v) == IterKind::Spatial)
            })
    }

    /// The two innermost spatial variables (y may be absent).
    fn xy(&self) -> (Option<usize>, Option<usize>) {
        let s = self.spatial();
        (s.last().copied(), s.len().checked_sub(2).map(|i| s[i]))
    }

    fn sample_simt(&self, rng: &mut Rng) -> Sketch {
        let (x, y) = self.xy();
        let ext = |v: Option<usize>| v.map_or(1, |v| self.op.iter_vars[v].extent);
        let (ex, ey) = (ext(x), ext(y));
        let tx = pick(rng, ex, 32);
        let ty = pick(rng, ey, (GPU_MAX_THREADS / tx).min(32));
        let rx = pick(rng, ex.div_ceil(tx), 8);
        let ry = pick(rng, ey.div_ceil(ty), 8);
        let rmax = self
            .reductions()
            .iter()
            .map(|&v| self.op.iter_vars[v].extent)
            .min()
            .unwrap_or(1);
        Sketch::Simt {
            tx,
            ty,
            rx,
            ry,
            rtile: pick(rng, rmax, 16),
            shared: rng.chance(60),
        }
    }

    pub(crate) fn mutate_gpu(&self, s: &Sketch, rng: &mut Rng) -> Sketch {
        if rng.chance(10) {
            return self.sample_gpu(rng);
        }
        let fresh = match s {
            Sketch::TensorCore { mapping, .. } if *mapping < self.mappings.len() => {
                self.sample_tensor_core(*mapping, rng)
            }
            Sketch::Simt { .. } => self.sample_simt(rng),
            _ => return self.sample_gpu(rng),
        };
        // One parameter from a fresh sample, the rest kept.
        let mut out = s.clone();
        match (&mut out, fresh) {
            (
                Sketch::TensorCore {
                    wm,
                    wn,
                    fm,
                    fn_,
                    kc,
                    stages,
                    split,
                    ..
                },
                Sketch::TensorCore {
                    wm: a,
                    wn: b,
                    fm: c,
                    fn_: d,
                    kc: e,
                    stages: f,
                    split: g,
                    ..
                },
            ) => match rng.below(7) {
                0 => *wm = a,
                1 => *wn = b,
                2 => *fm = c,
                3 => *fn_ = d,
                4 => *kc = e,
                5 => *stages = f,
                _ => *split = g,
            },
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
                    tx: a,
                    ty: b,
                    rx: c,
                    ry: d,
                    rtile: e,
                    ..
                },
            ) => match rng.below(6) {
                0 => *tx = a,
                1 => *ty = b,
                2 => *rx = c,
                3 => *ry = d,
                4 => *rtile = e,
                _ => *shared = !*shared,
            },
            _ => {}
        }
        out
    }

    /// Threads, registers and shared memory within the limits of every supported GPU.
    pub(crate) fn check_gpu(&self, s: &Sketch) -> Result<(), String> {
        if !self.gpu {
            return Err("a GPU sketch in a CPU space".into());
        }
        match s {
            Sketch::TensorCore {
                mapping,
                wm,
                wn,
                fm,
                fn_,
                kc,
                stages,
                split,
            } => {
                let m = self
                    .mappings
                    .get(*mapping)
                    .ok_or_else(|| format!("no mapping #{mapping}"))?;
                if [*wm, *wn, *fm, *fn_, *kc, *split].contains(&0) || *stages == 0 {
                    return Err("tile factors, split and stages must be at least 1".into());
                }
                if *split > 1 && !self.split_k_allowed(*mapping) {
                    return Err(
                        "split-K needs an output in the accumulator's type, no epilogue and no batch dimension".into(),
                    );
                }
                let threads = 32 * wm * wn;
                if threads > GPU_MAX_THREADS {
                    return Err(format!(
                        "{wm}x{wn} warps are {threads} threads; a block has at most {GPU_MAX_THREADS}"
                    ));
                }
                let i = m.intrinsic;
                if fm * fn_ * acc_registers(i) > MAX_ACC_REGISTERS {
                    return Err(format!(
                        "{fm}x{fn_} accumulator fragments per warp take more than {MAX_ACC_REGISTERS} registers per lane"
                    ));
                }
                let bytes = *stages as u64
                    * kc
                    * i.k
                    * (wm * fm * i.m * i.a.bytes() as u64 + wn * fn_ * i.n * i.b.bytes() as u64);
                if bytes > GPU_MAX_SHARED_BYTES {
                    return Err(format!(
                        "{bytes} bytes of shared memory per block exceed {GPU_MAX_SHARED_BYTES}"
                    ));
                }
                Ok(())
            }
            Sketch::Simt {
                tx,
                ty,
                rx,
                ry,
                rtile,
                ..
            } => {
                if [*tx, *ty, *rx, *ry, *rtile].contains(&0) {
                    return Err("tile factors must be at least 1".into());
                }
                if tx * ty > GPU_MAX_THREADS {
                    return Err(format!(
                        "{tx}x{ty} threads; a block has at most {GPU_MAX_THREADS}"
                    ));
                }
                if rx * ry > MAX_SIMT_ACCUMULATORS {
                    return Err(format!(
                        "{ry}x{rx} accumulators per thread exceed {MAX_SIMT_ACCUMULATORS}"
                    ));
                }
                Ok(())
            }
            _ => Err("not a GPU sketch".into()),
        }
    }

    pub(crate) fn gpu_trace(&self, s: &Sketch) -> Result<Trace, String> {
        match s {
            Sketch::TensorCore {
                mapping,
                wm,
                wn,
                fm,
                fn_,
                kc,
                stages,
                split,
            } => Ok(self.tensor_core_trace(*mapping, [*wm, *wn, *fm, *fn_, *kc], *stages, *split)),
            Sketch::Simt {
                tx,
                ty,
                rx,
                ry,
                rtile,
                shared,
            } => Ok(self.simt_trace([*tx, *ty, *rx, *ry, *rtile], *shared)),
            _ => Err("not a GPU sketch".into()),
        }
    }

    /// Outer spatial variables (batch, heads) become one loop bound to blockIdx.z.
    fn bind_batch(&self, t: &mut Trace, outer: &[String]) -> Option<String> {
        match outer {
            [] => None,
            [one] => {
                t.bind(one, GpuAxis::BlockZ);
                Some(one.clone())
            }
            many => {
                let refs: Vec<&str> = many.iter().map(String::as_str).collect();
                t.fuse(&refs);
                let fused = refs.join("_");
                t.bind(&fused, GpuAxis::BlockZ);
                Some(fused)
            }
        }
    }

    fn kind(&self, name: &str) -> IterKind {
        self.op
            .var_index(name)
            .map(|v| self.op.iter_vars[v].kind)
            .unwrap_or(IterKind::Spatial)
    }

    fn tensor_core_trace(
        &self,
        mapping: usize,
        [wm, wn, fm, fn_, kc]: [u64; 5],
        stages: u32,
        split: u64,
    ) -> Trace {
        let m = &self.mappings[mapping];
        let (intr, map) = (m.intrinsic, &m.mapping);
        let mut t = Trace::new();
        let s_outer: Vec<String> = map
            .outer
            .iter()
            .filter(|v| self.kind(v) == IterKind::Spatial)
            .cloned()
            .collect();
        let r_outer: Vec<String> = map
            .outer
            .iter()
            .filter(|v| self.kind(v) == IterKind::Reduction)
            .cloned()
            .collect();
        // Batch (spatial) loops first, then the outer reductions.
        let mut outer: Vec<&str> = s_outer.iter().map(String::as_str).collect();
        outer.extend(r_outer.iter().map(String::as_str));
        let fused = map.fuse_dims(&mut t, &outer);
        let (fm_, fn__, fk) = (&fused[0], &fused[1], &fused[2]);
        t.split(fm_, &[wm, fm, intr.m]);
        t.split(fn__, &[wn, fn_, intr.n]);
        let p = |x: &str, i: u32| format!("{x}.{i}");
        // Split-K: the outermost part of k (about `split` parts) goes to blockIdx.z.
        let first_k = if split > 1 {
            let k_extent = map.dims[2].extent;
            let steps = k_extent.div_ceil(intr.k * kc).div_ceil(split);
            t.split(fk, &[steps, kc, intr.k]);
            1
        } else {
            t.split(fk, &[kc, intr.k]);
            0
        };
        let mut order: Vec<String> = s_outer.clone();
        if split > 1 {
            order.push(p(fk, 0));
        }
        order.extend([p(fm_, 0), p(fn__, 0), p(fm_, 1), p(fn__, 1)]);
        order.extend(r_outer.iter().cloned());
        order.extend([p(fk, first_k), p(fk, first_k + 1), p(fm_, 2), p(fn__, 2)]);
        order.extend([p(fm_, 3), p(fn__, 3), p(fk, first_k + 2)]);
        let refs: Vec<&str> = order.iter().map(String::as_str).collect();
        t.reorder(&refs);
        self.bind_batch(&mut t, &s_outer);
        if split > 1 {
            t.bind(&p(fk, 0), GpuAxis::BlockZ);
        }
        t.bind(&p(fm_, 0), GpuAxis::BlockY)
            .bind(&p(fn__, 0), GpuAxis::BlockX)
            .bind(&p(fm_, 1), GpuAxis::ThreadZ)
            .bind(&p(fn__, 1), GpuAxis::ThreadY);
        // One accumulator per warp (its fragments), staging per k block for the whole block.
        t.cache_write(scope("local"), Some(&p(fn__, 1)));
        let k0 = p(fk, first_k);
        t.cache_read(map.operands[0], scope("shared"), Some(&k0))
            .cache_read(map.operands[1], scope("shared"), Some(&k0));
        if stages > 1 {
            t.pipeline(&k0, stages);
        }
        t.unroll(&p(fm_, 2)).unroll(&p(fn__, 2));
        t.tensorize(
            intr.id,
            &[
                ("m", &p(fm_, 3)),
                ("n", &p(fn__, 3)),
                ("k", &p(fk, first_k + 2)),
            ],
            &map.operands,
        );
        t
    }

    fn simt_trace(&self, [tx, ty, rx, ry, rtile]: [u64; 5], shared: bool) -> Trace {
        let mut t = Trace::new();
        let name = |v: usize| self.op.iter_vars[v].name.clone();
        let spatial = self.spatial();
        let reductions = self.reductions();
        let (x, y) = self.xy();
        let outer: Vec<String> = spatial
            .iter()
            .filter(|&&v| Some(v) != x && Some(v) != y)
            .map(|&v| name(v))
            .collect();
        let mut order: Vec<String> = outer.clone();
        let mut tiled = Vec::new();
        for (v, threads, regs) in [(y, ty, ry), (x, tx, rx)] {
            if let Some(v) = v {
                t.split(&name(v), &[threads, regs]);
                tiled.push(name(v));
            }
        }
        for r in &reductions {
            let e = self.op.iter_vars[*r].extent;
            t.split(&name(*r), &[rtile.min(e)]);
        }
        let p = |x: &str, i: u32| format!("{x}.{i}");
        order.extend(tiled.iter().map(|v| p(v, 0)));
        order.extend(tiled.iter().map(|v| p(v, 1)));
        order.extend(reductions.iter().map(|&r| p(&name(r), 0)));
        order.extend(reductions.iter().map(|&r| p(&name(r), 1)));
        order.extend(tiled.iter().map(|v| p(v, 2)));
        let refs: Vec<&str> = order.iter().map(String::as_str).collect();
        t.reorder(&refs);
        self.bind_batch(&mut t, &outer);
        let axes = if tiled.len() == 2 {
            [
                (GpuAxis::BlockY, GpuAxis::ThreadY),
                (GpuAxis::BlockX, GpuAxis::ThreadX),
            ]
            .to_vec()
        } else {
            [(GpuAxis::BlockX, GpuAxis::ThreadX)].to_vec()
        };
        for (v, (b, th)) in tiled.iter().zip(axes) {
            t.bind(&p(v, 0), b).bind(&p(v, 1), th);
        }
        if let Some(last_thread) = tiled.last() {
            t.cache_write(scope("local"), Some(&p(last_thread, 1)));
        }
        if shared && let Some(&r) = reductions.last() {
            let at = p(&name(r), 0);
            for o in 0..self.op.inputs.len() {
                t.cache_read(o, scope("shared"), Some(&at));
            }
        }
        for v in &tiled {
            t.unroll(&p(v, 2));
        }
        t
    }
}
