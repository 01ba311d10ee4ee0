//! The analytical GPU model: a latency estimate for a GPU program on a [`DeviceSpec`].
//! It is a model, not a measurement: records it makes carry the fingerprint kind `sim`.
//!
//! What it counts, per block, from the lowered program and the code generator's layout
//! (so it scores the kernel tessel would run): Tensor Core and CUDA-core multiply-adds,
//! shared-memory bytes written by staging and read by fragment or scalar loads (with the bank
//! conflicts of the fragment rows' stride), global bytes requested (16-byte sectors: a copy
//! whose contiguous run is short wastes the rest), and the reduction steps that end in a
//! barrier. From the launch shape and the resources it derives occupancy (threads, registers,
//! shared memory, blocks per SM), the blocks the busiest SM runs (waves and the tail), how much
//! of the non-dominant work overlaps (pipeline stages and co-resident blocks), the memory
//! latency left exposed per reduction step, DRAM traffic beyond L2, and launch overhead.
//! Deterministic: the same program and device give the same number.

use tessel_ir::{BufferRef, DType, Expr, LoopKind, Program, Stmt};
use tessel_measure::{
    Candidate, HardwareFingerprint, MeasureError, MeasureErrorKind, MeasureResult, Measurement,
    Measurer, Timing,
};

use crate::codegen::{Kernel, copy_nest, flat_index, generate, physical_layouts};
use crate::device::DeviceSpec;
use crate::error::GpuError;

/// Global memory latency the pipeline has to hide, cycles.
const MEMORY_LATENCY_CYCLES: f64 = 600.0;
/// Cost of the barriers around one staged reduction step, cycles.
const SYNC_CYCLES: f64 = 40.0;
/// Shared-memory bandwidth per SM, bytes per cycle.
const SHARED_BYTES_PER_CYCLE: f64 = 128.0;
/// Kernel launch overhead, seconds.
const LAUNCH_S: f64 = 4e-6;

/// The model's estimate and the figures behind it.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    pub latency_s: f64,
    pub blocks: u64,
    pub threads_per_block: u64,
    pub blocks_per_sm: u64,
    pub registers_per_thread: u64,
    pub shared_bytes: u64,
    /// Busiest SM's time in compute, shared memory and L2 traffic; DRAM time of the kernel.
    pub compute_s: f64,
    pub shared_s: f64,
    pub l2_s: f64,
    pub dram_s: f64,
    /// Which of the above bounds the kernel.
    pub bound: &'static str,
}

#[derive(Default, Debug)]
struct Counts {
    tc_macs: f64,
    tc_type: Option<DType>,
    simt_instructions: f64,
    shared_bytes: f64,
    global_bytes: f64,
    store_bytes: f64,
    steps: f64,
    fragments_per_warp: f64,
    /// Accumulator registers per lane (a fragment's m x n values spread over 32 lanes).
    acc_registers: f64,
    operand_fragments: f64,
    accumulators_per_thread: f64,
}

struct Walk<'a> {
    p: &'a Program,
    layouts: Vec<(Vec<i64>, u64)>,
    c: Counts,
}

impl Walk<'_> {
    fn flat(&self, r: &BufferRef) -> Expr {
        flat_index(r, &self.layouts[r.buffer].0)
    }

    fn scope(&self, r: &BufferRef) -> &str {
        self.p.buffers[r.buffer].scope.as_str()
    }

    fn bytes(&self, r: &BufferRef) -> f64 {
        self.p.buffers[r.buffer].dtype.bytes() as f64
    }

    /// `mult`: executions per block (serial and thread loops); `serial`: per block, serial
    /// loops only (what a cooperative copy runs per); `loops`: the enclosing loops.
    fn visit(&mut self, s: &Stmt, mult: f64, serial: f64, loops: &mut Vec<(usize, u64, LoopKind)>) {
        match s {
            Stmt::Seq(v) => v.iter().for_each(|s| self.visit(s, mult, serial, loops)),
            Stmt::Allocate { buffer, body } => {
                let b = &self.p.buffers[*buffer];
                if b.scope.as_str() == "local" {
                    // Registers of one thread (or, for fragments, shared by the warp's lanes).
                    self.c.accumulators_per_thread =
                        self.c.accumulators_per_thread.max(b.elements() as f64);
                }
                self.visit(body, mult, serial, loops)
            }
            Stmt::For(l) => {
                if let Some((nest, dst, src)) = shared_copy(l, self.p) {
                    // Cooperative: once per block per serial iteration.
                    let elements: f64 = nest.iter().map(|&(_, e)| e as f64).product();
                    let bytes = self.bytes(&dst);
                    self.c.shared_bytes += serial * elements * bytes;
                    let sf = self.flat(&src);
                    let n = self.p.vars.len();
                    let run = nest
                        .iter()
                        .find(|&&(v, _)| sf.coefficient(v, n) == 1)
                        .map_or(bytes, |&(_, e)| e as f64 * bytes);
                    let waste = (32.0 / run.min(32.0)).min(8.0);
                    self.c.global_bytes += serial * elements * bytes * waste;
                    // One staged step per serial iteration, however many operands it stages.
                    self.c.steps = self.c.steps.max(serial);
                    return;
                }
                let bound =
                    matches!(l.kind, LoopKind::Bound(a) if a.to_string().starts_with("block"));
                let thread = matches!(l.kind, LoopKind::Bound(_)) && !bound;
                let e = l.extent as f64;
                let (m, s2) = if bound {
                    (mult, serial)
                } else if thread {
                    (mult * e, serial)
                } else {
                    (mult * e, serial * e)
                };
                loops.push((l.var, l.extent, l.kind));
                self.visit(&l.body, m, s2, loops);
                loops.pop();
            }
            Stmt::Tensorized(c) => {
                let sem = &c.semantics;
                let macs: f64 = sem.iter_vars.iter().map(|v| v.extent as f64).product();
                self.c.tc_macs += mult * macs;
                self.c.tc_type = Some(sem.inputs[0].tensor.dtype);
                let dims = |name: &str| {
                    sem.iter_vars
                        .iter()
                        .position(|v| v.name == name)
                        .and_then(|u| c.bindings.iter().find(|b| b.0 == u))
                        .map(|&(u, lv)| (lv, sem.iter_vars[u].extent))
                };
                let (Some((vm, m)), Some((vn, nn)), Some((vk, k))) =
                    (dims("m"), dims("n"), dims("k"))
                else {
                    return;
                };
                // Fragment loads, hoisted over the innermost two loops as the generator does.
                let inner: Vec<(usize, u64)> = loops
                    .iter()
                    .rev()
                    .take(2)
                    .map(|&(v, e, _)| (v, e))
                    .collect();
                let uses = |r: &BufferRef, v: usize| r.index.iter().any(|e| e.uses(v));
                let n = self.p.vars.len();
                for (r, (rows, cols), elems) in [
                    (&c.operands[0], (vm, vk), m * k),
                    (&c.operands[1], (vk, vn), k * nn),
                ] {
                    let reuse: f64 = inner
                        .iter()
                        .filter(|&&(v, _)| !uses(r, v))
                        .map(|&(_, e)| e as f64)
                        .product();
                    let loads = mult / reuse;
                    let bytes = loads * elems as f64 * self.bytes(r);
                    if self.scope(r) == "shared" {
                        let f = self.flat(r);
                        let (cr, cc) = (f.coefficient(rows, n), f.coefficient(cols, n));
                        let ld = if cc == 1 { cr } else { cc };
                        let conflict = bank_conflict(ld * self.bytes(r) as i64);
                        self.c.shared_bytes += bytes * conflict;
                    } else {
                        self.c.global_bytes += bytes;
                    }
                    self.c.operand_fragments += reuse.min(8.0);
                }
                let per_warp = self.p.buffers[c.acc.buffer].elements() as f64 / (m * nn) as f64;
                self.c.fragments_per_warp = self.c.fragments_per_warp.max(per_warp);
                self.c.acc_registers = self.c.acc_registers.max(per_warp * (m * nn) as f64 / 32.0);
            }
            Stmt::Update { operands, .. } => {
                // One FMA, plus a load (and a conversion for 16-bit types) per operand not
                // reused from registers across the unrolled loops around it.
                let mut instructions = 1.0;
                for r in operands {
                    let reuse: f64 = loops
                        .iter()
                        .rev()
                        .take_while(|(_, _, k)| *k == LoopKind::Unrolled)
                        .filter(|&&(v, _, _)| !r.index.iter().any(|e| e.uses(v)))
                        .map(|&(_, e, _)| e as f64)
                        .product();
                    let loads = 1.0 / reuse;
                    let bytes = self.bytes(r);
                    instructions += loads * if bytes < 4.0 { 2.0 } else { 1.0 };
                    match self.scope(r) {
                        "shared" => self.c.shared_bytes += mult * loads * bytes,
                        // Per-thread reads: about a 32-byte sector per 8 useful bytes.
                        "global" => self.c.global_bytes += mult * loads * bytes * 4.0,
                        _ => {}
                    }
                }
                self.c.simt_instructions += mult * instructions;
            }
            Stmt::Store {
                dst, accumulate, ..
            } => {
                // A split-K atomicAdd reads and writes at L2.
                let rmw = if *accumulate { 2.0 } else { 1.0 };
                self.c.store_bytes += mult * self.bytes(dst) * rmw;
            }
            Stmt::Copy { src, .. } => {
                // A per-thread copy (into registers or a local buffer).
                if self.scope(src) == "global" {
                    self.c.global_bytes += mult * self.bytes(src) * 4.0;
                } else if self.scope(src) == "shared" {
                    self.c.shared_bytes += mult * self.bytes(src);
                }
                self.c.simt_instructions += mult;
            }
            Stmt::Fill { .. } | Stmt::Barrier => {}
        }
    }
}

/// How many times slower a fragment load is than conflict-free, for rows `stride` bytes apart:
/// 8 rows of 16 bytes are read at once, and rows that start in the same bank group serialize.
fn bank_conflict(stride: i64) -> f64 {
    if stride <= 0 {
        return 1.0;
    }
    let g = gcd(stride.unsigned_abs(), 128);
    let distinct = (128 / g).clamp(1, 8);
    8.0 / distinct as f64
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// A loop nest that copies into shared memory: its loops, destination and source.
type SharedCopy = (Vec<(usize, u64)>, BufferRef, BufferRef);

fn shared_copy(l: &tessel_ir::For, p: &Program) -> Option<SharedCopy> {
    match copy_nest(l)? {
        (nest, Stmt::Copy { dst, src, .. }) if p.buffers[dst.buffer].scope.as_str() == "shared" => {
            Some((nest, dst.clone(), src.clone()))
        }
        _ => None,
    }
}

/// Estimates the latency of `p` on `dev`.
pub fn estimate(p: &Program, dev: &DeviceSpec) -> Result<Estimate, GpuError> {
    let kernel = generate(p, "tessel_kernel")?;
    estimate_kernel(p, &kernel, dev)
}

/// Estimates a kernel already generated for `p`.
pub fn estimate_kernel(
    p: &Program,
    kernel: &Kernel,
    dev: &DeviceSpec,
) -> Result<Estimate, GpuError> {
    let unfit = |reason: String| GpuError::DoesNotFit {
        device: dev.name.to_string(),
        reason,
    };
    let mut w = Walk {
        p,
        layouts: physical_layouts(p),
        c: Counts::default(),
    };
    w.visit(&p.body, 1.0, 1.0, &mut Vec::new());
    let c = &w.c;
    let threads = kernel.threads_per_block();
    let blocks = kernel.blocks();
    let clock = dev.clock_ghz * 1e9;

    // Registers: accumulators (fragments are spread over the warp's 32 lanes), operand
    // fragments, addressing.
    let regs = if kernel.tensor_core.is_some() {
        c.acc_registers + c.operand_fragments * 4.0 + 40.0
    } else {
        c.accumulators_per_thread + 32.0
    };
    let regs = (regs.ceil() as u64).div_ceil(8) * 8;
    let spill = if regs > 255 { regs as f64 / 255.0 } else { 1.0 };
    let regs = regs.min(255);
    let max_shared_per_block = dev.shared_per_sm.saturating_sub(1 << 10);
    if kernel.shared_bytes > max_shared_per_block {
        return Err(unfit(format!(
            "{} bytes of shared memory per block; at most {max_shared_per_block}",
            kernel.shared_bytes
        )));
    }
    if threads > 1024 || threads > dev.max_threads_per_sm {
        return Err(unfit(format!("{threads} threads per block")));
    }
    let by_threads = dev.max_threads_per_sm / threads.max(1);
    let by_regs = dev.regs_per_sm / (regs * threads.div_ceil(32) * 32).max(1);
    let by_shared = dev
        .shared_per_sm
        .checked_div(kernel.shared_bytes)
        .unwrap_or(u64::MAX);
    let per_sm = dev
        .max_blocks_per_sm
        .min(by_threads)
        .min(by_regs)
        .min(by_shared);
    if per_sm == 0 {
        return Err(unfit(format!(
            "no block fits on an SM ({threads} threads x {regs} registers, {} bytes shared)",
            kernel.shared_bytes
        )));
    }
    // The busiest SM runs this many blocks, this many at a time.
    let sms = dev.sms as u64;
    let busiest = blocks.div_ceil(sms);
    let resident = per_sm.min(busiest).max(1);
    let warps_resident = (resident * threads.div_ceil(32)) as f64;

    // Per block.
    let tc_rate = match c.tc_type {
        Some(t) => {
            let r = dev.tc_macs_per_s(t) / dev.sms as f64;
            if r == 0.0 {
                return Err(GpuError::DoesNotFit {
                    device: dev.name.to_string(),
                    reason: format!("no Tensor Cores for {t}"),
                });
            }
            r
        }
        None => 1.0,
    };
    // Four schedulers per SM; one warp with one fragment stalls on its own results.
    let tc_issue = (warps_resident / 4.0).min(1.0)
        * if c.fragments_per_warp >= 2.0 {
            1.0
        } else {
            0.7
        };
    let simt_issue = (warps_resident / 16.0).min(1.0);
    let compute =
        c.tc_macs / (tc_rate * tc_issue) + c.simt_instructions / (dev.fp32 * clock * simt_issue);
    let compute = compute * spill;
    let shared = c.shared_bytes / (SHARED_BYTES_PER_CYCLE * clock);
    let l2_per_sm = dev.l2_bytes_per_clock * clock / dev.sms as f64;
    let l2 = (c.global_bytes + c.store_bytes) / l2_per_sm;
    let steps = c.steps.max(1.0);
    let stages = pipeline_stages(p) as f64;

    // Overlap: the dominant resource runs flat out; the others overlap across pipeline stages
    // and co-resident blocks.
    let dominant = compute.max(shared).max(l2);
    let serial_share = 1.0 / (stages * resident as f64);
    let block_time = dominant + (compute + shared + l2 - dominant) * serial_share;
    // Memory latency per staged step, hidden by the work of the other stages and blocks.
    let step_time = block_time / steps;
    let latency = MEMORY_LATENCY_CYCLES / clock;
    let hidden = (stages - 1.0 + resident as f64 - 1.0) * step_time;
    let exposed = if c.steps > 0.0 {
        (latency - hidden).max(0.0) * steps
    } else {
        latency
    };
    let sync = if c.steps > 0.0 {
        steps * SYNC_CYCLES / clock
    } else {
        0.0
    };
    let sm_time =
        busiest as f64 * (block_time + sync) + busiest.div_ceil(resident) as f64 * exposed;

    // DRAM: every tensor once, plus the re-reads that miss in L2.
    let unique: f64 = p
        .buffers
        .iter()
        .filter(|b| b.scope.as_str() == "global")
        .map(|b| b.bytes() as f64)
        .sum();
    let traffic = blocks as f64 * (c.global_bytes + c.store_bytes);
    let miss = ((unique - dev.l2_bytes as f64) / unique.max(1.0)).clamp(0.0, 1.0) * 0.1;
    let dram_bytes = unique + (traffic - unique).max(0.0) * miss;
    let dram = dram_bytes / (dev.dram_gbs * 1e9);

    // Split-K zeroes the output first: one more launch, writing it once.
    let zeroing = if kernel.zero_output {
        LAUNCH_S + p.op.output.tensor.bytes() as f64 / (dev.dram_gbs * 1e9)
    } else {
        0.0
    };
    let latency_s = sm_time.max(dram) + LAUNCH_S + zeroing;
    let per_block = |x: f64| busiest as f64 * x;
    let parts = [
        ("compute", per_block(compute)),
        ("shared memory", per_block(shared)),
        ("L2", per_block(l2)),
        ("DRAM", dram),
    ];
    let bound = parts
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or("compute", |x| x.0);
    Ok(Estimate {
        latency_s,
        blocks,
        threads_per_block: threads,
        blocks_per_sm: per_sm,
        registers_per_thread: regs,
        shared_bytes: kernel.shared_bytes,
        compute_s: per_block(compute),
        shared_s: per_block(shared),
        l2_s: per_block(l2),
        dram_s: dram,
        bound,
    })
}

fn pipeline_stages(p: &Program) -> u32 {
    let mut s = 1;
    p.body.walk(&mut |st| {
        if let Stmt::For(l) = st
            && let Some(k) = l.pipeline_stages
        {
            s = s.max(k);
        }
    });
    s
}

/// A [`Measurer`] that answers with the analytical model: every result is an estimate for
/// the device, and its fingerprint says `sim`.
pub struct SimMeasurer {
    device: DeviceSpec,
    fingerprint: HardwareFingerprint,
}

impl SimMeasurer {
    pub fn new(device: DeviceSpec) -> Self {
        SimMeasurer {
            fingerprint: device.fingerprint(),
            device,
        }
    }

    pub fn device(&self) -> &DeviceSpec {
        &self.device
    }
}

impl Measurer for SimMeasurer {
    fn fingerprint(&self) -> &HardwareFingerprint {
        &self.fingerprint
    }

    fn measure(&mut self, candidates: &[Candidate]) -> Vec<MeasureResult> {
        candidates
            .iter()
            .map(|c| {
                let program = c
                    .trace
                    .lower(&c.op, &tessel_intrin::Catalog::default())
                    .map_err(|e| MeasureError::new(MeasureErrorKind::Schedule, e.to_string()))?;
                let est = estimate(&program, &self.device).map_err(|e| match e {
                    GpuError::Codegen { .. } => {
                        MeasureError::new(MeasureErrorKind::Codegen, e.to_string())
                    }
                    other => MeasureError::new(MeasureErrorKind::Unsupported, other.to_string()),
                })?;
                let t = est.latency_s;
                Ok(Measurement {
                    timing: Timing {
                        min_s: t,
                        median_s: t,
                        spread: 0.0,
                        runs: 1,
                    },
                    compile_time_s: 0.0,
                    // Nothing ran: the model checks no results.
                    max_error: 0.0,
                    emulated: false,
                    gflops: 2.0 * c.op.macs() as f64 / t / 1e9,
                    cut_short: false,
                    censored: false,
                    allocation_spread: None,
                    kernel: None,
                })
            })
            .collect()
    }
}
