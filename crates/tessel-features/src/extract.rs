//! Walks a lowered program once, collecting its statements with their loop context, then
//! derives compute tokens per statement and data tokens per buffer and memory level.
//!
//! Data movement follows the classic capacity model: for a statement and a cache level, find the
//! outermost enclosing loop whose body's working set (the footprint of every access of the
//! statement over the loops inside it) fits the level; each access then brings its footprint
//! at that loop into the level once per iteration of the loops outside it. An access the next
//! loop out does not index is held across that loop too, since one of its iterations fits
//! (schema v4): an accumulator across the reduction loop around its block, weights across a
//! spatial loop.

use tessel_intrin::{Intrinsic, LayoutReq, Storage};
use tessel_ir::{
    BufferRef, BufferRole, Expr, GpuAxis, Guard, LoopKind, Program, Stmt, TensorizedCall,
    linear_stride,
};
use tessel_measure::{CallPath, CallPaths};

use crate::schema::{Col, WIDTH, lg};
use crate::target::{Target, catalog};
use crate::{FeatureError, Features, MemoryLevel, Source};

/// What a statement does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SiteKind {
    Tensorized,
    Vector,
    Scalar,
    Copy,
    Store,
    Fill,
}

#[derive(Clone, Copy, Debug)]
struct Loop {
    var: usize,
    extent: u64,
    kind: LoopKind,
    reduction: bool,
    pipeline: u32,
}

struct Access<'p> {
    buffer: usize,
    index: &'p [Expr],
    read: bool,
    write: bool,
}

struct Site<'p> {
    kind: SiteKind,
    /// Enclosing loops, outermost first; for a tensorized call, followed by the loops the
    /// instruction replaces (`virtual_loops` of them).
    loops: Vec<Loop>,
    virtual_loops: usize,
    accesses: Vec<Access<'p>>,
    call: Option<(&'p TensorizedCall, &'static Intrinsic)>,
    guards: &'p [Guard],
}

impl Site<'_> {
    fn real_loops(&self) -> &[Loop] {
        &self.loops[..self.loops.len() - self.virtual_loops]
    }

    fn invocations(&self) -> f64 {
        self.real_loops().iter().map(|l| l.extent as f64).product()
    }
}

type Level = MemoryLevel;

fn level_column(level: Level) -> Col {
    match level {
        Level::Memory => Col::DataLevelMemory,
        Level::L2 => Col::DataLevelL2,
        Level::L1 => Col::DataLevelL1,
        Level::Shared => Col::DataLevelShared,
        Level::Register => Col::DataLevelRegister,
    }
}

/// One buffer at one level, summed over the statements that touch it.
#[derive(Clone, Debug, Default)]
struct Traffic {
    bytes_in: f64,
    bytes_out: f64,
    footprint: f64,
    capacity_ratio: f64,
    accessed: f64,
    /// Of the access that moves the most.
    dominant: f64,
    contiguous: bool,
    stride: f64,
    contig_run: f64,
    vector_width: f64,
    bank_conflict: f64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Transform {
    pad: bool,
    transpose: bool,
    vnni: bool,
    im2col: bool,
    bytes: f64,
}

pub(crate) fn extract(program: &Program, target: &Target) -> Result<Features, FeatureError> {
    let mut sites = Vec::new();
    let mut stack = Vec::new();
    let compiled = Compiled {
        auto_vectorizes: !target.gpu,
    };
    collect(program, &program.body, &compiled, &mut stack, &mut sites)?;
    // The backend's path for each call, where the target has a backend to ask. A program it
    // cannot build keeps its paths unknown (zero), as on a target without one: measuring it
    // fails the same way, and the search ranks it as it would have.
    let paths = match &target.code_paths.0 {
        Some(backend) if sites.iter().any(|s| s.kind == SiteKind::Tensorized) => {
            backend.call_paths(program).ok()
        }
        _ => None,
    };

    let n_buffers = program.buffers.len();
    let mut data: Vec<[Option<Traffic>; 5]> = vec![Default::default(); n_buffers];
    let mut transforms = vec![Transform::default(); n_buffers];
    let mut tokens: Vec<f32> = Vec::with_capacity((sites.len() + 4 * n_buffers + 1) * WIDTH);
    let mut sources = Vec::new();
    let useful_flops = program.op.flops() as f64;

    for (n, site) in sites.iter().enumerate() {
        if site.kind == SiteKind::Fill {
            // Zeroing is data movement only; the accumulator's tokens count it.
            account_traffic(program, target, site, &mut data);
            continue;
        }
        let mut t = [0f32; WIDTH];
        compute_token(program, target, site, useful_flops, paths.as_ref(), &mut t);
        tokens.extend_from_slice(&t);
        sources.push(Source::Statement(n));
        account_traffic(program, target, site, &mut data);
        detect_transforms(program, site, &mut transforms);
    }

    for (b, levels) in data.iter().enumerate() {
        for (li, traffic) in levels.iter().enumerate() {
            let Some(tr) = traffic else { continue };
            let level = LEVELS[li];
            let mut t = [0f32; WIDTH];
            data_token(program, b, level, tr, &transforms[b], &mut t);
            tokens.extend_from_slice(&t);
            sources.push(Source::Buffer { buffer: b, level });
        }
    }

    let hardware = target.token.get_or_init(|| {
        let mut t = [0f32; WIDTH];
        hardware_token(target, &mut t);
        t.to_vec()
    });
    tokens.extend_from_slice(hardware);
    sources.push(Source::Hardware);

    debug_assert!(tokens.iter().all(|x| x.is_finite()));
    Ok(Features { tokens, sources })
}

const LEVELS: [Level; 5] = [
    Level::Memory,
    Level::L2,
    Level::L1,
    Level::Shared,
    Level::Register,
];

fn malformed(msg: String) -> FeatureError {
    FeatureError::Malformed(msg)
}

fn check_ref(program: &Program, r: &BufferRef) -> Result<(), FeatureError> {
    let b = program
        .buffers
        .get(r.buffer)
        .ok_or_else(|| malformed(format!("buffer {} does not exist", r.buffer)))?;
    if b.shape.len() != r.index.len() {
        return Err(malformed(format!(
            "buffer `{}` has {} dimensions but is indexed with {}",
            b.name,
            b.shape.len(),
            r.index.len()
        )));
    }
    for e in &r.index {
        check_divisors(e)?;
        if let Some(v) = max_var(e).filter(|&v| v >= program.vars.len()) {
            return Err(malformed(format!("loop variable {v} does not exist")));
        }
    }
    Ok(())
}

/// The largest loop variable an expression reads (without allocating: this runs per access).
fn max_var(e: &Expr) -> Option<usize> {
    match e {
        Expr::Const(_) => None,
        Expr::Var(v) => Some(*v),
        Expr::Add(a, b) => max_var(a).max(max_var(b)),
        Expr::Mul(a, _) | Expr::Div(a, _) | Expr::Mod(a, _) => max_var(a),
    }
}

/// Whether `e` reads loop variable `var`.
fn uses(e: &Expr, var: usize) -> bool {
    match e {
        Expr::Const(_) => false,
        Expr::Var(v) => *v == var,
        Expr::Add(a, b) => uses(a, var) || uses(b, var),
        Expr::Mul(a, _) | Expr::Div(a, _) | Expr::Mod(a, _) => uses(a, var),
    }
}

fn check_divisors(e: &Expr) -> Result<(), FeatureError> {
    match e {
        Expr::Div(_, c) | Expr::Mod(_, c) if *c <= 0 => {
            Err(malformed(format!("division by {c} in an index")))
        }
        Expr::Add(a, b) => {
            check_divisors(a)?;
            check_divisors(b)
        }
        Expr::Mul(a, _) | Expr::Div(a, _) | Expr::Mod(a, _) => check_divisors(a),
        _ => Ok(()),
    }
}

/// What the compiler of the target's code does beyond what the schedule says.
struct Compiled {
    /// gcc -O3 vectorizes a plain innermost loop on its own (CPU targets; see [`vector_loop`]).
    auto_vectorizes: bool,
}

fn collect<'p>(
    program: &'p Program,
    stmt: &'p Stmt,
    compiled: &Compiled,
    stack: &mut Vec<Loop>,
    sites: &mut Vec<Site<'p>>,
) -> Result<(), FeatureError> {
    let site = |kind, loops: Vec<Loop>, accesses, guards| Site {
        kind,
        loops,
        virtual_loops: 0,
        accesses,
        call: None,
        guards,
    };
    match stmt {
        Stmt::Seq(v) => {
            for s in v {
                collect(program, s, compiled, stack, sites)?;
            }
        }
        Stmt::For(f) => {
            if f.var >= program.vars.len() {
                return Err(malformed(format!("loop variable {} does not exist", f.var)));
            }
            stack.push(Loop {
                var: f.var,
                extent: f.extent,
                kind: f.kind,
                reduction: f.reduction,
                pipeline: f.pipeline_stages.unwrap_or(0),
            });
            collect(program, &f.body, compiled, stack, sites)?;
            stack.pop();
        }
        Stmt::Allocate { buffer, body } => {
            if *buffer >= program.buffers.len() {
                return Err(malformed(format!("buffer {buffer} does not exist")));
            }
            collect(program, body, compiled, stack, sites)?;
        }
        Stmt::Fill { dst, .. } => {
            check_ref(program, dst)?;
            let a = vec![access(dst, false, true)];
            sites.push(site(SiteKind::Fill, stack.clone(), a, &[]));
        }
        Stmt::Copy {
            dst, src, guards, ..
        } => {
            check_ref(program, dst)?;
            check_ref(program, src)?;
            let a = vec![access(src, true, false), access(dst, false, true)];
            sites.push(site(SiteKind::Copy, stack.clone(), a, guards));
        }
        Stmt::Update {
            acc,
            operands,
            guards,
        } => {
            check_ref(program, acc)?;
            let mut a = Vec::with_capacity(operands.len() + 1);
            for o in operands {
                check_ref(program, o)?;
                a.push(access(o, true, false));
            }
            a.push(access(acc, true, true));
            let mut loops = stack.clone();
            let kind = match vector_loop(program, &loops, &a, guards, compiled) {
                Some(i) => {
                    // Counted where the compiled code has it: among the vectorized loops.
                    loops[i].kind = LoopKind::Vectorized;
                    SiteKind::Vector
                }
                None => SiteKind::Scalar,
            };
            sites.push(site(kind, loops, a, guards));
        }
        Stmt::Store {
            dst, acc, guards, ..
        } => {
            check_ref(program, dst)?;
            check_ref(program, acc)?;
            let a = vec![access(acc, true, false), access(dst, false, true)];
            sites.push(site(SiteKind::Store, stack.clone(), a, guards));
        }
        Stmt::Tensorized(call) => {
            let intr = catalog()
                .get(&call.intrinsic)
                .ok_or_else(|| malformed(format!("unknown instruction `{}`", call.intrinsic)))?;
            check_ref(program, &call.acc)?;
            let mut a = Vec::with_capacity(call.operands.len() + 1);
            for o in &call.operands {
                check_ref(program, o)?;
                a.push(access(o, true, false));
            }
            a.push(access(&call.acc, true, true));
            let mut loops = stack.clone();
            for &(_, lv) in &call.bindings {
                let var = program
                    .vars
                    .get(lv)
                    .ok_or_else(|| malformed(format!("loop variable {lv} does not exist")))?;
                loops.push(Loop {
                    var: lv,
                    extent: var.extent,
                    kind: LoopKind::Serial,
                    reduction: false,
                    pipeline: 0,
                });
            }
            sites.push(Site {
                kind: SiteKind::Tensorized,
                loops,
                virtual_loops: call.bindings.len(),
                accesses: a,
                call: Some((call, intr)),
                guards: &call.guards,
            });
        }
        Stmt::Barrier => {}
    }
    Ok(())
}

/// The loop (an index into `loops`) that the compiled code of an update runs in SIMD lanes,
/// if any: the innermost loop of more than one iteration (the compiler drops the others),
/// where the schedule vectorized it, or where gcc -O3 vectorizes it by itself. gcc does so
/// for a serial or unrolled loop whose update writes consecutive accumulator elements and
/// reads each operand consecutively or not at all along it, with no guard on it, over at
/// least a 16-byte vector: a depthwise convolution's channel loop over packed weights is
/// such a loop, one that no `vectorize` step names. (It leaves a reduction into one
/// element scalar: that would reorder float additions.)
fn vector_loop(
    program: &Program,
    loops: &[Loop],
    accesses: &[Access],
    guards: &[Guard],
    compiled: &Compiled,
) -> Option<usize> {
    let i = loops.iter().rposition(|l| l.extent > 1)?;
    let l = loops[i];
    match l.kind {
        LoopKind::Vectorized => return Some(i),
        LoopKind::Serial | LoopKind::Unrolled if compiled.auto_vectorizes => {}
        _ => return None,
    }
    let (acc, operands) = accesses.split_last()?;
    let nvars = program.vars.len();
    let stride = |a: &Access| {
        let b = &program.buffers[a.buffer];
        linear_stride(a.index, &b.shape, l.var, nvars)
    };
    let acc_bytes = program.buffers[acc.buffer].dtype.bytes() as u64;
    let vectorizes = stride(acc) == 1
        && operands.iter().all(|o| matches!(stride(o), 0 | 1))
        && !guards.iter().any(|g| uses(&g.expr, l.var))
        && l.extent.saturating_mul(acc_bytes) >= 16;
    vectorizes.then_some(i)
}

fn access(r: &BufferRef, read: bool, write: bool) -> Access<'_> {
    Access {
        buffer: r.buffer,
        index: &r.index,
        read,
        write,
    }
}

/// The interval an index expression covers while the variables with a non-zero entry in
/// `extent` run over `0..extent` and the others stay at 0.
fn span(e: &Expr, extent: &[u64]) -> (i64, i64) {
    match e {
        Expr::Const(c) => (*c, *c),
        Expr::Var(v) => (0, extent.get(*v).map_or(0, |&x| x.saturating_sub(1) as i64)),
        Expr::Add(a, b) => {
            let (a0, a1) = span(a, extent);
            let (b0, b1) = span(b, extent);
            (a0.saturating_add(b0), a1.saturating_add(b1))
        }
        Expr::Mul(a, c) => {
            let (a0, a1) = span(a, extent);
            let (x, y) = (a0.saturating_mul(*c), a1.saturating_mul(*c));
            (x.min(y), x.max(y))
        }
        Expr::Div(a, c) => {
            let (a0, a1) = span(a, extent);
            let c = (*c).max(1);
            (a0.div_euclid(c), a1.div_euclid(c))
        }
        Expr::Mod(a, c) => {
            let (a0, a1) = span(a, extent);
            let c = (*c).max(1);
            if a1 - a0 >= c - 1 {
                (0, c - 1)
            } else {
                let (x, y) = (a0.rem_euclid(c), a1.rem_euclid(c));
                if x <= y { (x, y) } else { (0, c - 1) }
            }
        }
    }
}

/// Elements of `shape` the access touches, per dimension, while `extent` varies.
fn ranges(index: &[Expr], shape: &[u64], extent: &[u64], out: &mut Vec<f64>) {
    out.clear();
    for (e, &n) in index.iter().zip(shape) {
        let (lo, hi) = span(e, extent);
        let lo = lo.max(0);
        let hi = hi.min(n as i64 - 1);
        out.push(if hi < lo { 1.0 } else { (hi - lo + 1) as f64 });
    }
}

/// Capacity of `level` for a statement, in bytes, or `None` where the level does not apply.
fn capacity(target: &Target, site: &Site, level: Level) -> Option<f64> {
    let cores = target.cores.max(1) as f64;
    match (level, target.gpu) {
        (Level::Memory, false) => Some(target.l3_bytes.max(target.l2_bytes * cores as u64) as f64),
        (Level::L2, false) => Some(target.l2_bytes as f64),
        (Level::L1, false) => Some(target.l1_bytes as f64),
        (Level::Memory, true) => Some(target.l2_bytes as f64),
        (Level::L2, true) => Some(target.l1_bytes as f64),
        (Level::Register, _) => match site.kind {
            SiteKind::Tensorized => {
                let (_, intr) = site.call?;
                Some(match intr.memory[2].storage {
                    Storage::AmxTile { rows, row_bytes } => {
                        (intr.registers * rows * row_bytes) as f64
                    }
                    Storage::VectorRegister { bits } => (intr.registers * bits / 8) as f64,
                    _ => target.register_bytes() as f64 / cores,
                })
            }
            SiteKind::Vector | SiteKind::Scalar => {
                Some((target.vector_register_bytes * target.vector_registers) as f64)
            }
            _ => None,
        },
        _ => None,
    }
}

fn account_traffic(
    program: &Program,
    target: &Target,
    site: &Site,
    data: &mut [[Option<Traffic>; 5]],
) {
    let nvars = program.vars.len();
    let depth = site.loops.len();
    // footprints[a * row + j]: elements access `a` touches over loops j.. (j = depth: one instance).
    let mut extent = vec![0u64; nvars];
    let mut scratch = Vec::new();
    let n_acc = site.accesses.len();
    let row = depth + 1;
    let mut footprints = vec![0f64; n_acc * row];
    let mut runs = vec![0f64; n_acc * row];
    for j in (0..=depth).rev() {
        if j < depth {
            let l = site.loops[j];
            extent[l.var] = l.extent.max(1);
        }
        for (a, acc) in site.accesses.iter().enumerate() {
            let b = &program.buffers[acc.buffer];
            ranges(acc.index, &b.shape, &extent, &mut scratch);
            footprints[a * row + j] = scratch.iter().product::<f64>();
            // The contiguous run: the last dimension's range, extended while it spans the
            // whole dimension.
            let mut run = 1.0;
            for d in (0..scratch.len()).rev() {
                run *= scratch[d];
                if scratch[d] < b.shape[d] as f64 {
                    break;
                }
            }
            runs[a * row + j] = run;
        }
    }
    let fp = |a: usize, j: usize| footprints[a * row + j];
    let elem = |a: usize| program.buffers[site.accesses[a].buffer].dtype.bytes() as f64;
    let total_instances: f64 = site.loops.iter().map(|l| l.extent as f64).product();

    for (li, &level) in LEVELS.iter().enumerate() {
        if level == Level::Shared {
            account_shared(program, site, |a| fp(a, depth), data);
            continue;
        }
        let Some(cap) = capacity(target, site, level) else {
            continue;
        };
        // Outermost loop whose working set fits; registers hold at least one instance.
        let working =
            |j: usize| -> f64 { (0..site.accesses.len()).map(|a| fp(a, j) * elem(a)).sum() };
        let floor = if level == Level::Register {
            depth - site.virtual_loops
        } else {
            depth
        };
        let mut fit = floor;
        while fit > 0 && working(fit - 1) <= cap {
            fit -= 1;
        }
        let block = working(fit);
        let ratio = block / cap;
        for (a, acc) in site.accesses.iter().enumerate() {
            // Data the next loop out does not index stays at this level across that loop's
            // iterations, since one iteration's working set fits: an accumulator across the
            // reduction loop around its block, weights across a spatial one. One loop at most:
            // an iteration of the loop beyond it is the whole of that loop, which does not fit.
            let held = fit > 0 && block <= cap && fp(a, fit - 1) == fp(a, fit);
            let fit = if held { fit - 1 } else { fit };
            let outer: f64 = site.loops[..fit].iter().map(|l| l.extent as f64).product();
            let bytes = fp(a, fit) * elem(a) * outer;
            let accessed = total_instances * elem(a);
            let tr = data[acc.buffer][li].get_or_insert_with(Traffic::default);
            if acc.read {
                tr.bytes_in += bytes;
            }
            if acc.write {
                tr.bytes_out += bytes;
            }
            tr.accessed += accessed;
            tr.footprint = tr.footprint.max(fp(a, fit) * elem(a));
            tr.capacity_ratio = tr.capacity_ratio.max(ratio);
            if bytes > tr.dominant || tr.dominant == 0.0 {
                tr.dominant = bytes;
                let (contiguous, stride, width) = access_shape(program, site, acc, target);
                tr.contiguous = contiguous;
                tr.stride = stride;
                tr.vector_width = width;
                tr.contig_run = runs[a * row + fit] * elem(a);
            }
        }
    }
}

/// Contiguity, stride (elements) and elements per access of the innermost loop that moves the
/// access.
fn access_shape(program: &Program, site: &Site, acc: &Access, target: &Target) -> (bool, f64, f64) {
    let b = &program.buffers[acc.buffer];
    let nvars = program.vars.len();
    let innermost = site
        .loops
        .iter()
        .rev()
        .find(|l| acc.index.iter().any(|e| uses(e, l.var)));
    let Some(l) = innermost else {
        // Loop-invariant: a broadcast.
        return (true, 0.0, 1.0);
    };
    let stride = linear_stride(acc.index, &b.shape, l.var, nvars).unsigned_abs() as f64;
    let contiguous = stride == 1.0;
    let width = match site.kind {
        // A row of the instruction's tile.
        SiteKind::Tensorized if contiguous => l.extent as f64,
        SiteKind::Vector if contiguous => {
            let lanes = (target.vector_register_bytes as f64 / b.dtype.bytes() as f64).max(1.0);
            (l.extent as f64).min(lanes)
        }
        _ => 1.0,
    };
    (contiguous, stride, width)
}

/// Shared-memory buffers: what copies write into them and their bank conflicts.
fn account_shared(
    program: &Program,
    site: &Site,
    instance_footprint: impl Fn(usize) -> f64,
    data: &mut [[Option<Traffic>; 5]],
) {
    let li = Level::Shared as usize;
    for (a, acc) in site.accesses.iter().enumerate() {
        let b = &program.buffers[acc.buffer];
        if b.scope.as_str() != "shared" {
            continue;
        }
        let elem = b.dtype.bytes() as f64;
        let instances: f64 = site.loops.iter().map(|l| l.extent as f64).product();
        let tr = data[acc.buffer][li].get_or_insert_with(Traffic::default);
        if acc.write {
            tr.bytes_in += instances * elem;
        }
        if acc.read {
            tr.bytes_out += instances * elem;
        }
        tr.accessed += instances * elem;
        tr.footprint = tr.footprint.max(b.bytes() as f64);
        tr.contig_run = tr.contig_run.max(instance_footprint(a) * elem);
        tr.bank_conflict = tr.bank_conflict.max(bank_conflict(program, site, acc));
    }
}

/// The worst number of distinct 4-byte words one bank serves for the 32 lanes of a warp
/// (lanes along the loop bound to threadIdx.x; 1 means conflict-free).
fn bank_conflict(program: &Program, site: &Site, acc: &Access) -> f64 {
    let Some(lane) = site
        .loops
        .iter()
        .find(|l| l.kind == LoopKind::Bound(GpuAxis::ThreadX))
    else {
        return 1.0;
    };
    let b = &program.buffers[acc.buffer];
    let bytes = b.dtype.bytes() as i64;
    let mut vals = vec![0i64; program.vars.len()];
    let mut words: Vec<(i64, i64)> = Vec::with_capacity(32);
    for t in 0..lane.extent.min(32) as i64 {
        vals[lane.var] = t;
        let mut addr = 0i64;
        let mut row = 1i64;
        for d in (0..acc.index.len()).rev() {
            addr += acc.index[d].eval(&vals) * row;
            row = row.saturating_mul(b.shape[d] as i64);
        }
        let word = (addr * bytes).div_euclid(4);
        words.push((word.rem_euclid(32), word));
    }
    words.sort_unstable();
    words.dedup();
    let mut worst = 1;
    let mut run = 0;
    let mut prev = -1;
    for &(bank, _) in &words {
        run = if bank == prev { run + 1 } else { 1 };
        prev = bank;
        worst = worst.max(run);
    }
    worst as f64
}

fn detect_transforms(program: &Program, site: &Site, transforms: &mut [Transform]) {
    match site.kind {
        SiteKind::Copy => {
            let (src, dst) = (&site.accesses[0], &site.accesses[1]);
            let (sb, db) = (&program.buffers[src.buffer], &program.buffers[dst.buffer]);
            if !matches!(
                db.role,
                BufferRole::Packed { .. } | BufferRole::Cache { .. }
            ) {
                return;
            }
            let written = site.invocations() * db.dtype.bytes() as f64;
            // The source's distinct elements over the whole copy.
            let mut extent = vec![0u64; program.vars.len()];
            for l in &site.loops {
                extent[l.var] = l.extent.max(1);
            }
            let mut r = Vec::new();
            ranges(src.index, &sb.shape, &extent, &mut r);
            let distinct = r.iter().product::<f64>() * sb.dtype.bytes() as f64;
            let t = &mut transforms[dst.buffer];
            t.bytes += written;
            t.pad |= !site.guards.is_empty();
            t.im2col |= written > 1.05 * distinct && sb.shape.len() >= 3;
            let inner = site.loops.last().map(|l| l.var);
            if let Some(v) = inner {
                let n = program.vars.len();
                let ss = linear_stride(src.index, &sb.shape, v, n).abs();
                let ds = linear_stride(dst.index, &db.shape, v, n).abs();
                t.transpose |= ss != ds && ds == 1 && ss > 1;
            }
            let last = db.shape.last().copied().unwrap_or(1);
            t.vnni |= matches!(db.role, BufferRole::Packed { .. })
                && (last == 2 || last == 4)
                && db.dtype.bytes() < 4;
        }
        SiteKind::Tensorized => {
            let Some((call, intr)) = site.call else {
                return;
            };
            let vars = &program.vars;
            let k_binding = call.bindings.iter().position(|&(u, _)| u == 2);
            let n_binding = call.bindings.iter().position(|&(u, _)| u == 1);
            let tiles = |a: usize| -> f64 {
                let b = &program.buffers[site.accesses[a].buffer];
                let mut extent = vec![0u64; vars.len()];
                for l in &site.loops[site.loops.len() - site.virtual_loops..] {
                    extent[l.var] = l.extent.max(1);
                }
                let mut r = Vec::new();
                ranges(site.accesses[a].index, &b.shape, &extent, &mut r);
                r.iter().product::<f64>() * b.dtype.bytes() as f64 * site.invocations()
            };
            for (i, mem) in intr.memory.iter().take(2).enumerate() {
                let Some(acc) = site.accesses.get(i) else {
                    continue;
                };
                if matches!(program.buffers[acc.buffer].role, BufferRole::Packed { .. }) {
                    continue;
                }
                let strides = call.strides(i, vars);
                let unit = |b: Option<usize>| {
                    b.and_then(|b| strides.get(b)).is_some_and(|s| {
                        s.last() == Some(&1) && s[..s.len() - 1].iter().all(|&x| x == 0)
                    })
                };
                let t = &mut transforms[acc.buffer];
                let need = match mem.layout {
                    LayoutReq::Vnni { .. } => {
                        t.vnni = true;
                        true
                    }
                    LayoutReq::KContiguous if !unit(k_binding) => {
                        t.transpose = true;
                        true
                    }
                    LayoutReq::NContiguous if !unit(n_binding) => {
                        t.transpose = true;
                        true
                    }
                    _ => false,
                };
                if !call.guards.is_empty() {
                    t.pad = true;
                }
                if need || !call.guards.is_empty() {
                    t.bytes += tiles(i);
                }
            }
        }
        _ => {}
    }
}

fn compute_token(
    program: &Program,
    target: &Target,
    site: &Site,
    useful_flops: f64,
    paths: Option<&CallPaths>,
    t: &mut [f32; WIDTH],
) {
    let set = |t: &mut [f32; WIDTH], c: Col, v: f32| t[c as usize] = v;
    set(t, Col::KindCompute, 1.0);
    let kind_col = match site.kind {
        SiteKind::Tensorized => Col::ComputeTensorized,
        SiteKind::Vector => Col::ComputeVector,
        SiteKind::Scalar => Col::ComputeScalar,
        SiteKind::Copy | SiteKind::Fill => Col::ComputeCopy,
        SiteKind::Store => Col::ComputeStore,
    };
    set(t, kind_col, 1.0);
    let invocations = site.invocations();
    if let (Some((call, _)), Some(paths)) = (site.call, paths) {
        match paths.get(&call.step) {
            Some(CallPath::RegisterBlock) => set(t, Col::ComputePathRegisterBlock, 1.0),
            Some(CallPath::Direct) => set(t, Col::ComputePathDirect, 1.0),
            Some(CallPath::Staged { elements }) => {
                set(t, Col::ComputePathStaged, 1.0);
                set(
                    t,
                    Col::ComputeStagedCopies,
                    lg(*elements as f64 * invocations),
                );
            }
            None => {}
        }
    }
    let input_bytes = |a: usize| {
        site.accesses
            .get(a)
            .map_or(0.0, |a| program.buffers[a.buffer].dtype.bytes() as f64)
    };
    let acc_bytes = program.op.accumulator.bytes() as f64;
    let (m, n, k, peak, flops) = match site.kind {
        SiteKind::Tensorized => {
            let (call, intr) = site.call.expect("tensorized sites carry their call");
            // A partial tile (an AMX tile of fewer rows) computes and peaks at its own rows.
            let rows = call
                .semantics
                .iter_vars
                .iter()
                .find(|v| v.name == "m")
                .map_or(intr.m, |v| v.extent.clamp(1, intr.m));
            let peak = target.macs_per_cycle(intr) * rows as f64 / intr.m.max(1) as f64;
            let macs = (rows * intr.n * intr.k) as f64;
            (rows, intr.n, intr.k, peak, 2.0 * macs * invocations)
        }
        SiteKind::Vector | SiteKind::Scalar => {
            let lanes = if site.kind == SiteKind::Vector {
                (target.vector_register_bytes as f64 / acc_bytes.max(1.0)).max(1.0)
            } else {
                1.0
            };
            // Two FMA ports on current x86 cores; the CUDA cores of an SM on a GPU.
            let peak = target.scalar_macs_per_cycle * lanes;
            (1, lanes as u64, 1, peak, 2.0 * invocations)
        }
        SiteKind::Copy | SiteKind::Store | SiteKind::Fill => {
            let bytes = site
                .accesses
                .iter()
                .map(|a| program.buffers[a.buffer].dtype.bytes() as f64)
                .sum::<f64>();
            (1, 1, 1, 0.0, bytes * invocations)
        }
    };
    set(t, Col::ComputeInstrM, lg(m as f64));
    set(t, Col::ComputeInstrN, lg(n as f64));
    set(t, Col::ComputeInstrK, lg(k as f64));
    set(t, Col::ComputeInputBytes, input_bytes(0) as f32);
    set(t, Col::ComputeAccBytes, acc_bytes as f32);
    set(t, Col::ComputePeak, lg(peak));
    let util = utilisation(program, site);
    set(t, Col::ComputeUtilM, util[0] as f32);
    set(t, Col::ComputeUtilN, util[1] as f32);
    set(t, Col::ComputeUtilK, util[2] as f32);
    set(t, Col::ComputeInvocations, lg(invocations));
    set(t, Col::ComputeFlops, lg(flops));
    if matches!(
        site.kind,
        SiteKind::Tensorized | SiteKind::Vector | SiteKind::Scalar
    ) && flops > 0.0
    {
        set(
            t,
            Col::ComputeFlopShare,
            (useful_flops / flops).min(1.0) as f32,
        );
    }
    let mut product = [1f64; 6];
    let mut reduction = 1f64;
    let mut pipeline = 0u32;
    let real = site.real_loops();
    for l in real {
        let slot = match l.kind {
            LoopKind::Parallel => 0,
            LoopKind::Serial => 1,
            LoopKind::Unrolled => 2,
            LoopKind::Vectorized => 3,
            LoopKind::Bound(GpuAxis::BlockX | GpuAxis::BlockY | GpuAxis::BlockZ) => 4,
            LoopKind::Bound(_) => 5,
        };
        product[slot] *= l.extent as f64;
        if l.reduction {
            reduction *= l.extent as f64;
        }
        pipeline = pipeline.max(l.pipeline);
    }
    let cols = [
        Col::ComputeParallel,
        Col::ComputeSerial,
        Col::ComputeUnrolled,
        Col::ComputeVectorized,
        Col::ComputeGpuBlocks,
        Col::ComputeGpuThreads,
    ];
    for (c, p) in cols.iter().zip(product) {
        set(t, *c, log2_iterations(p));
    }
    set(t, Col::ComputeReduction, log2_iterations(reduction));
    set(
        t,
        Col::ComputeInnermost,
        log2_iterations(real.last().map_or(1.0, |l| l.extent as f64)),
    );
    set(t, Col::ComputeDepth, real.len() as f32);
    set(t, Col::ComputePipeline, pipeline as f32);
}

/// Products of loop extents are at least 1, so plain log2: no loops of a kind reads 0.
fn log2_iterations(x: f64) -> f32 {
    x.max(1.0).log2() as f32
}

/// Useful / padded extent of the instruction's m, n and k: a guard on a bound variable says
/// how much of the padded range is real.
fn utilisation(program: &Program, site: &Site) -> [f64; 3] {
    let mut util = [1.0f64; 3];
    let Some((call, _)) = site.call else {
        return util;
    };
    let full: Vec<u64> = program.vars.iter().map(|v| v.extent.max(1)).collect();
    for &(u, lv) in &call.bindings {
        let Some(slot) = util.get_mut(u) else {
            continue;
        };
        for g in call.guards.iter().filter(|g| uses(&g.expr, lv)) {
            let (_, hi) = span(&g.expr, &full);
            let padded = (hi + 1).max(1) as f64;
            *slot = slot.min((g.bound as f64 / padded).clamp(0.0, 1.0));
        }
    }
    util
}

fn data_token(
    program: &Program,
    buffer: usize,
    level: Level,
    tr: &Traffic,
    transform: &Transform,
    t: &mut [f32; WIDTH],
) {
    let b = &program.buffers[buffer];
    let set = |t: &mut [f32; WIDTH], c: Col, v: f32| t[c as usize] = v;
    set(t, Col::KindData, 1.0);
    set(t, level_column(level), 1.0);
    let role = match b.role {
        BufferRole::Input(_) | BufferRole::Bias(_) => Col::DataRoleInput,
        BufferRole::Output => Col::DataRoleOutput,
        BufferRole::Accumulator => Col::DataRoleAccumulator,
        BufferRole::Packed { .. } | BufferRole::Cache { .. } => Col::DataRoleStaged,
    };
    set(t, role, 1.0);
    set(t, Col::DataDtypeBytes, b.dtype.bytes() as f32);
    set(t, Col::DataBytesIn, lg(tr.bytes_in));
    set(t, Col::DataBytesOut, lg(tr.bytes_out));
    set(t, Col::DataFootprint, lg(tr.footprint));
    set(t, Col::DataCapacity, lg(tr.capacity_ratio));
    let moved = tr.bytes_in + tr.bytes_out;
    set(
        t,
        Col::DataReuse,
        lg(if moved > 0.0 {
            tr.accessed / moved
        } else {
            0.0
        }),
    );
    set(
        t,
        Col::DataContiguous,
        if tr.contiguous { 1.0 } else { 0.0 },
    );
    set(t, Col::DataStride, lg(tr.stride));
    set(t, Col::DataContigRun, lg(tr.contig_run));
    set(t, Col::DataVectorWidth, lg(tr.vector_width));
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    set(t, Col::DataTransformPad, flag(transform.pad));
    set(t, Col::DataTransformTranspose, flag(transform.transpose));
    set(t, Col::DataTransformVnni, flag(transform.vnni));
    set(t, Col::DataTransformIm2col, flag(transform.im2col));
    set(t, Col::DataTransformBytes, lg(transform.bytes));
    set(t, Col::DataBankConflict, tr.bank_conflict as f32);
}

fn hardware_token(target: &Target, t: &mut [f32; WIDTH]) {
    let set = |t: &mut [f32; WIDTH], c: Col, v: f32| t[c as usize] = v;
    set(t, Col::KindHardware, 1.0);
    set(t, Col::HardwareGpu, if target.gpu { 1.0 } else { 0.0 });
    set(t, Col::HardwareCores, lg(target.cores as f64));
    set(t, Col::HardwareClock, target.clock_ghz as f32);
    set(t, Col::HardwareL1, lg(target.l1_bytes as f64));
    set(t, Col::HardwareL2, lg(target.l2_bytes as f64));
    set(t, Col::HardwareL3, lg(target.l3_bytes as f64));
    set(t, Col::HardwareShared, lg(target.shared_bytes as f64));
    set(
        t,
        Col::HardwareRegisters,
        lg(target.register_bytes() as f64),
    );
    set(t, Col::HardwareMemoryBandwidth, lg(target.memory_bw_gbs));
    set(t, Col::HardwareL2Bandwidth, lg(target.l2_bw_gbs));
    let peaks = target.peaks();
    let cols = [
        Col::HardwarePeakF32,
        Col::HardwarePeakBf16,
        Col::HardwarePeakF16,
        Col::HardwarePeakInt8,
        Col::HardwarePeakMatrix,
    ];
    for (c, p) in cols.iter().zip(peaks) {
        set(t, *c, lg(p));
    }
}
