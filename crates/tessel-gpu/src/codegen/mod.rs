//! Lowers a GPU program (tessel-ir, loops bound to blocks and threads) to one CUDA C++ kernel.
//!
//! Execution model, the one TVM uses:
//! - loops bound to `blockIdx.*` and `threadIdx.*` become those indices; on Tensor Core
//!   kernels `threadIdx.x` is the lane of a warp and `threadIdx.y/z` index warps;
//! - a copy into `shared` memory is done by all threads of the block together (one flat loop,
//!   128-bit vectors where the layout allows), fenced by `__syncthreads()`;
//! - a loop with `pipeline_stages = S > 1` around shared copies becomes an S-stage pipeline:
//!   S copies of each shared buffer, `cp.async` 16-byte copies on sm_80+ (zero-filled past the
//!   edges), the copy for step k+S-1 issued before the compute of step k;
//! - a WMMA tensorized call becomes fragment loads and `wmma::mma_sync`; the accumulator is an
//!   array of fragments per warp, initialised with `fill_fragment` and written back through a
//!   small per-warp staging tile so that the epilogue (bias, relu, cast) and the edge guards
//!   apply per element;
//! - an `mma.sync` m16n8k16 call (f16/bf16) is inline PTX: `ldmatrix` (`.trans` where the
//!   shared layout is not the instruction's) fills the operand registers, the accumulator is a
//!   `float[4]` per tile, and each lane stores its own four values;
//! - a reduction loop bound to a block axis (split-K) makes the store an `atomicAdd` into an
//!   output the launcher zeroes first ([`Kernel::zero_output`]);
//! - shared buffers whose rows are a multiple of 32 bytes get 16 bytes of padding per row,
//!   so the 8 rows a fragment load touches at once fall in different banks.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use tessel_ir::{
    BufferRef, BufferRole, DType, Epilogue, Expr, For, GpuAxis, LoopKind, Program, Stmt,
    TensorizedCall,
};

use crate::error::GpuError;

mod copy;
mod layout;
mod mma;

pub use layout::physical_layouts;

/// Included by every kernel: headers, `cp.async` helpers.
const PRELUDE: &str = include_str!("prelude.cuh");

/// mma.sync m16n8k16 through inline PTX, with `ldmatrix` operand loads (sm_80+).
const MMA_PRELUDE: &str = include_str!("mma_prelude.cuh");

/// A generated kernel and how to launch it.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub name: String,
    pub source: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Dynamic shared memory to launch with, bytes (pipeline stages and padding included).
    pub shared_bytes: u64,
    /// The WMMA instruction the kernel runs, if any.
    pub tensor_core: Option<String>,
    /// Kernel parameters in order: program buffer indices (inputs, biases, output).
    pub params: Vec<usize>,
    /// Needs sm_80 or newer (cp.async, bf16).
    pub needs_sm80: bool,
    /// Split-K: blocks add into the output (`atomicAdd`), which must be zeros at launch.
    pub zero_output: bool,
}

impl Kernel {
    pub fn threads_per_block(&self) -> u64 {
        self.block.iter().map(|&b| b as u64).product()
    }

    pub fn blocks(&self) -> u64 {
        self.grid.iter().map(|&g| g as u64).product()
    }
}

pub(crate) fn c_type(t: DType) -> &'static str {
    match t {
        DType::F16 => "half",
        DType::BF16 => "__nv_bfloat16",
        DType::F32 => "float",
        DType::I8 => "signed char",
        DType::U8 => "unsigned char",
        DType::I32 => "int",
        DType::I16 => "short",
    }
}

fn c_ident(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.chars().next().is_none_or(|c| c.is_ascii_digit()) {
        s.insert(0, 'v');
    }
    s
}

struct TcInfo {
    m: u64,
    n: u64,
    k: u64,
    /// Loop variables bound to the instruction's m, n, k.
    vm: usize,
    vn: usize,
    vk: usize,
    acc: usize,
    in_type: DType,
    acc_type: DType,
    /// `mma.sync` through inline PTX (operands by `ldmatrix` from shared memory, the
    /// accumulator in 4 registers per lane) rather than the WMMA API.
    mma_sync: bool,
}

struct Emitter<'a> {
    p: &'a Program,
    out: String,
    depth: usize,
    /// C expression of each loop variable.
    names: Vec<String>,
    bufs: Vec<String>,
    strides: Vec<Vec<i64>>,
    sizes: Vec<u64>,
    /// C expression of the pipeline stage a shared buffer is read or written in.
    stage: Vec<Option<String>>,
    stages: Vec<u32>,
    tc: Option<TcInfo>,
    nthreads: u64,
    tid: String,
    uses_cp_async: bool,
    decls: Vec<String>,
}

/// Generates the kernel for a lowered GPU program.
pub fn generate(p: &Program, name: &str) -> Result<Kernel, GpuError> {
    let cg = |reason: String| GpuError::Codegen { reason };
    // Launch shape from the bound loops.
    let mut axes: Vec<(GpuAxis, u64)> = Vec::new();
    let mut stages = vec![1u32; p.buffers.len()];
    let mut tensorized: Option<&TensorizedCall> = None;
    let mut err = None;
    collect(&p.body, &mut |s, pipeline| match s {
        Stmt::For(l) => {
            if let LoopKind::Bound(a) = l.kind {
                match axes.iter().find(|(x, _)| *x == a) {
                    Some(&(_, e)) if e != l.extent => {
                        err = Some(format!(
                            "{a} is bound to loops of extents {e} and {}",
                            l.extent
                        ))
                    }
                    Some(_) => {}
                    None => axes.push((a, l.extent)),
                }
            }
        }
        Stmt::Allocate { buffer, .. } => {
            if let Some(sg) = pipeline {
                stages[*buffer] = sg;
            }
        }
        Stmt::Tensorized(c) => {
            if tensorized.is_some_and(|t| t.intrinsic != c.intrinsic) {
                err = Some("two different instructions in one kernel".into());
            }
            tensorized = Some(c);
        }
        _ => {}
    });
    if let Some(e) = err {
        return Err(cg(e));
    }
    for b in &p.buffers {
        if matches!(b.role, BufferRole::Packed { .. }) {
            return Err(cg(format!(
                "{} is a packed layout: the GPU code generator does not emit packing kernels",
                b.name
            )));
        }
        if b.role == BufferRole::Accumulator && b.scope.as_str() == "global" {
            return Err(cg(
                "the accumulator is in global memory: threads would race (cache_write to local)"
                    .into(),
            ));
        }
    }
    let ext = |a: GpuAxis| axes.iter().find(|(x, _)| *x == a).map_or(1, |&(_, e)| e);
    let tc = match tensorized {
        Some(c) => Some(tc_info(p, c)?),
        None => None,
    };
    if tc.is_some() && axes.iter().any(|(a, _)| *a == GpuAxis::ThreadX) {
        return Err(cg(
            "threadIdx.x is the lane on Tensor Core kernels: bind warps to threadIdx.y/z".into(),
        ));
    }
    if axes.iter().any(|(a, _)| *a == GpuAxis::Warp) {
        return Err(cg(
            "bind warps to threadIdx.y/z (the `warp` axis is not generated)".into(),
        ));
    }
    let block = if tc.is_some() {
        [32, ext(GpuAxis::ThreadY), ext(GpuAxis::ThreadZ)]
    } else {
        [
            ext(GpuAxis::ThreadX),
            ext(GpuAxis::ThreadY),
            ext(GpuAxis::ThreadZ),
        ]
    };
    let grid = [
        ext(GpuAxis::BlockX),
        ext(GpuAxis::BlockY),
        ext(GpuAxis::BlockZ),
    ];
    let nthreads: u64 = block.iter().product();
    if nthreads > 1024 {
        return Err(cg(format!("{nthreads} threads per block (at most 1024)")));
    }
    if grid[0] >= 1 << 31 || grid[1] > 65535 || grid[2] > 65535 {
        return Err(cg(format!("grid {grid:?} exceeds CUDA's limits")));
    }
    let (strides, sizes): (Vec<Vec<i64>>, Vec<u64>) = physical_layouts(p).into_iter().unzip();
    let mut used = BTreeSet::new();
    let mut unique = |s: String| {
        let mut n = s.clone();
        let mut i = 1;
        while !used.insert(n.clone()) {
            n = format!("{s}_{i}");
            i += 1;
        }
        n
    };
    let names: Vec<String> = p.vars.iter().map(|v| unique(c_ident(&v.name))).collect();
    let bufs: Vec<String> = p.buffers.iter().map(|b| unique(c_ident(&b.name))).collect();
    let mut e = Emitter {
        p,
        out: String::new(),
        depth: 1,
        names,
        bufs,
        strides,
        sizes,
        stage: vec![None; p.buffers.len()],
        stages,
        tc,
        nthreads,
        tid: if tensorized.is_some() {
            "(threadIdx.x + 32 * (threadIdx.y + blockDim.y * threadIdx.z))".into()
        } else {
            "(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z))".into()
        },
        uses_cp_async: false,
        decls: Vec::new(),
    };
    e.stmt(&p.body)?;
    let body = std::mem::take(&mut e.out);

    // Parameters: inputs, biases, output, in buffer order.
    let mut params = Vec::new();
    let mut sig = Vec::new();
    for (i, b) in p.buffers.iter().enumerate() {
        let t = c_type(b.dtype);
        match b.role {
            BufferRole::Input(_) | BufferRole::Bias(_) => {
                params.push(i);
                sig.push(format!("const {t}* __restrict__ {}", e.bufs[i]));
            }
            BufferRole::Output => {
                params.push(i);
                sig.push(format!("{t}* __restrict__ {}", e.bufs[i]));
            }
            _ => {}
        }
    }
    let mut shared_bytes = 0u64;
    let mut src = String::new();
    let _ = writeln!(src, "// Generated by tessel-gpu from: {}", p.op);
    if let Some(t) = &e.tc {
        let _ = writeln!(
            src,
            "// Tensor Cores: {} {}x{}x{} {} -> {}",
            if t.mma_sync { "mma.sync" } else { "WMMA" },
            t.m,
            t.n,
            t.k,
            t.in_type,
            t.acc_type
        );
    }
    let _ = writeln!(
        src,
        "// grid ({}, {}, {}), block ({}, {}, {})\n",
        grid[0], grid[1], grid[2], block[0], block[1], block[2]
    );
    src.push_str(PRELUDE);
    if e.tc.as_ref().is_some_and(|t| t.mma_sync) {
        src.push_str(MMA_PRELUDE);
    }
    let _ = writeln!(
        src,
        "\nextern \"C\" __global__ void __launch_bounds__({nthreads}) {name}({}) {{",
        sig.join(", ")
    );
    // Dynamic shared memory (launched with `shared_bytes`), carved in 16-byte aligned parts:
    // past 48 KB a kernel must opt in, and only dynamic shared memory can.
    src.push_str("  extern __shared__ __align__(16) unsigned char tsl_smem[];\n");
    let mut carve = |src: &mut String, ty: &str, name: &str, n: u64, bytes: u64, what: String| {
        let _ = writeln!(
            src,
            "  {ty}* {name} = reinterpret_cast<{ty}*>(tsl_smem + {shared_bytes});  // {what}"
        );
        shared_bytes += (n * bytes).div_ceil(16) * 16;
    };
    for (i, b) in p.buffers.iter().enumerate() {
        if b.scope.as_str() == "shared" {
            let n = e.sizes[i] * e.stages[i] as u64;
            let what = format!(
                "{:?}{}, {n} elements",
                b.shape,
                if e.stages[i] > 1 {
                    format!(" x {} stages", e.stages[i])
                } else {
                    String::new()
                }
            );
            carve(
                &mut src,
                c_type(b.dtype),
                &e.bufs[i],
                n,
                b.dtype.bytes() as u64,
                what,
            );
        }
    }
    if let Some(t) = &e.tc
        && !t.mma_sync
    {
        let warps = nthreads / 32;
        let n = warps * t.m * t.n;
        carve(
            &mut src,
            c_type(t.acc_type),
            "tsl_out",
            n,
            4,
            "per-warp epilogue staging".into(),
        );
    }
    if e.tc.is_some() {
        let _ = writeln!(
            src,
            "  const int warp = threadIdx.y + blockDim.y * threadIdx.z;\n  const int lane = threadIdx.x;"
        );
    }
    for d in &e.decls {
        let _ = writeln!(src, "  {d}");
    }
    src.push_str(&body);
    src.push_str("}\n");
    let mut zero_output = false;
    p.body.walk(&mut |s| {
        zero_output |= matches!(
            s,
            Stmt::Store {
                accumulate: true,
                ..
            }
        );
    });
    let needs_sm80 = e.uses_cp_async
        || e.tc.as_ref().is_some_and(|t| t.mma_sync)
        || p.buffers.iter().any(|b| b.dtype == DType::BF16)
        || e.tc.as_ref().is_some_and(|t| t.in_type == DType::BF16);
    Ok(Kernel {
        name: name.to_string(),
        source: src,
        grid: grid.map(|g| g as u32),
        block: block.map(|b| b as u32),
        shared_bytes,
        tensor_core: tensorized.map(|c| c.intrinsic.clone()),
        params,
        needs_sm80,
        zero_output,
    })
}

/// Visits statements with the pipeline stages of the innermost enclosing pipelined loop.
fn collect<'a>(s: &'a Stmt, f: &mut impl FnMut(&'a Stmt, Option<u32>)) {
    fn go<'a>(s: &'a Stmt, pipe: Option<u32>, f: &mut impl FnMut(&'a Stmt, Option<u32>)) {
        f(s, pipe);
        match s {
            Stmt::Seq(v) => v.iter().for_each(|s| go(s, pipe, f)),
            Stmt::For(l) => {
                let p = match l.pipeline_stages {
                    Some(s) if s > 1 => Some(s),
                    _ => pipe,
                };
                go(&l.body, p, f)
            }
            Stmt::Allocate { body, .. } => go(body, pipe, f),
            _ => {}
        }
    }
    go(s, None, f)
}

fn tc_info(p: &Program, c: &TensorizedCall) -> Result<TcInfo, GpuError> {
    let cg = |reason: String| GpuError::Codegen { reason };
    let mma_sync = c.intrinsic.starts_with("mma.m16n8k16.");
    if !c.intrinsic.starts_with("wmma.") && !mma_sync {
        return Err(cg(format!(
            "{} is not generated (WMMA and 16-bit mma.sync m16n8k16 are)",
            c.intrinsic
        )));
    }
    let sem = &c.semantics;
    let var = |name: &str| -> Result<(usize, u64), GpuError> {
        let u = sem
            .iter_vars
            .iter()
            .position(|v| v.name == name)
            .ok_or_else(|| cg(format!("{} has no `{name}` dimension", c.intrinsic)))?;
        let lv = c
            .bindings
            .iter()
            .find(|(iu, _)| *iu == u)
            .map(|&(_, lv)| lv)
            .ok_or_else(|| cg(format!("`{name}` of {} is not bound", c.intrinsic)))?;
        Ok((lv, sem.iter_vars[u].extent))
    };
    let (vm, m) = var("m")?;
    let (vn, n) = var("n")?;
    let (vk, k) = var("k")?;
    let in_type = sem.inputs[0].tensor.dtype;
    Ok(TcInfo {
        m,
        n,
        k,
        vm,
        vn,
        vk,
        acc: c.acc.buffer,
        in_type,
        acc_type: p.buffers[c.acc.buffer].dtype,
        mma_sync,
    })
}

/// Interval of an expression given loop extents.
fn range(e: &Expr, p: &Program) -> (i64, i64) {
    match e {
        Expr::Const(c) => (*c, *c),
        Expr::Var(v) => (0, p.vars.get(*v).map_or(0, |l| l.extent as i64 - 1)),
        Expr::Add(a, b) => {
            let (a0, a1) = range(a, p);
            let (b0, b1) = range(b, p);
            (a0 + b0, a1 + b1)
        }
        Expr::Mul(a, c) => {
            let (a0, a1) = range(a, p);
            if *c >= 0 {
                (a0 * c, a1 * c)
            } else {
                (a1 * c, a0 * c)
            }
        }
        Expr::Div(a, c) => {
            let (a0, a1) = range(a, p);
            (a0.div_euclid(*c), a1.div_euclid(*c))
        }
        Expr::Mod(a, c) => {
            let (a0, a1) = range(a, p);
            if a0 >= 0 && a1 < *c {
                (a0, a1)
            } else {
                (0, c - 1)
            }
        }
    }
}

fn affine(e: &Expr) -> bool {
    match e {
        Expr::Const(_) | Expr::Var(_) => true,
        Expr::Add(a, b) => affine(a) && affine(b),
        Expr::Mul(a, _) => affine(a),
        Expr::Div(..) | Expr::Mod(..) => false,
    }
}

impl Emitter<'_> {
    fn line(&mut self, s: &str) {
        for _ in 0..self.depth {
            self.out.push_str("  ");
        }
        self.out.push_str(s);
        self.out.push('\n');
    }

    fn expr(&self, e: &Expr) -> String {
        let atom = |e: &Expr| matches!(e, Expr::Const(_) | Expr::Var(_));
        match e {
            Expr::Const(c) => c.to_string(),
            Expr::Var(v) => self.names[*v].clone(),
            Expr::Add(a, b) => match **b {
                Expr::Const(c) if c < 0 => format!("{} - {}", self.expr(a), -c),
                _ => format!("{} + {}", self.expr(a), self.expr(b)),
            },
            Expr::Mul(a, c) if atom(a) => format!("{} * {c}", self.expr(a)),
            Expr::Mul(a, c) => format!("({}) * {c}", self.expr(a)),
            // Indices are never negative where these are evaluated (guards come first).
            Expr::Div(a, c) => format!("({}) / {c}", self.expr(a)),
            Expr::Mod(a, c) => format!("({}) % {c}", self.expr(a)),
        }
    }

    /// The flat element index of a reference in the buffer's physical layout.
    fn flat(&self, r: &BufferRef) -> Expr {
        flat_index(r, &self.strides[r.buffer])
    }

    fn element(&self, r: &BufferRef) -> String {
        let idx = self.expr(&self.flat(r));
        match &self.stage[r.buffer] {
            Some(s) => format!(
                "{}[({s}) * {} + {idx}]",
                self.bufs[r.buffer], self.sizes[r.buffer]
            ),
            None => format!("{}[{idx}]", self.bufs[r.buffer]),
        }
    }

    fn bounds(&self, r: &BufferRef) -> Vec<String> {
        let shape = &self.p.buffers[r.buffer].shape;
        let mut c = Vec::new();
        for (e, &n) in r.index.iter().zip(shape) {
            let (lo, hi) = range(e, self.p);
            if lo < 0 {
                c.push(format!("{} >= 0", self.expr(e)));
            }
            if hi >= n as i64 {
                c.push(format!("{} < {n}", self.expr(e)));
            }
        }
        c
    }

    fn guard(&self, g: &tessel_ir::Guard) -> String {
        format!("{} < {}", self.expr(&g.expr), g.bound)
    }

    /// `r` converted to the compute type (float or int), zero outside the buffer.
    fn read_compute(&self, r: &BufferRef) -> String {
        let t = self.p.buffers[r.buffer].dtype;
        let f = if t.is_float() { "tsl_f" } else { "tsl_i" };
        let x = format!("{f}({})", self.element(r));
        let b = self.bounds(r);
        if b.is_empty() {
            x
        } else {
            format!("({} ? {x} : 0)", b.join(" && "))
        }
    }

    fn convert_to(&self, v: &str, t: DType) -> String {
        if t.is_float() {
            format!("tsl_to<{}>({v})", c_type(t))
        } else {
            format!("tsl_to_i<{}>({v})", c_type(t))
        }
    }

    fn conds(&self, guards: &[tessel_ir::Guard], extra: Vec<String>) -> Option<String> {
        let mut c: Vec<String> = guards.iter().map(|g| self.guard(g)).collect();
        for x in extra {
            if !c.contains(&x) {
                c.push(x);
            }
        }
        (!c.is_empty()).then(|| c.join(" && "))
    }

    fn is_tc_acc(&self, buffer: usize) -> bool {
        self.tc.as_ref().is_some_and(|t| t.acc == buffer)
    }

    fn stmt(&mut self, s: &Stmt) -> Result<(), GpuError> {
        match s {
            Stmt::Seq(v) => {
                for s in v {
                    self.stmt(s)?;
                }
            }
            Stmt::For(l) => self.for_loop(l)?,
            Stmt::Allocate { buffer, body } => {
                let b = &self.p.buffers[*buffer];
                let scope = b.scope.as_str();
                if self.is_tc_acc(*buffer) {
                    self.fragment_array(*buffer)?;
                } else if scope != "shared" && scope != "global" {
                    let line = format!(
                        "{} {}[{}];  // {:?} in registers",
                        c_type(b.dtype),
                        self.bufs[*buffer],
                        self.sizes[*buffer],
                        b.shape
                    );
                    self.line(&line);
                }
                self.stmt(body)?;
            }
            Stmt::Fill { dst, .. } => {
                let l = format!("{} = 0;", self.element(dst));
                self.line(&l);
            }
            Stmt::Copy {
                dst, src, guards, ..
            } => {
                let cond = self.conds(guards, self.bounds(src));
                let v = self.element(src);
                let l = match cond {
                    Some(c) => format!(
                        "{} = ({c}) ? {v} : static_cast<{}>(0);",
                        self.element(dst),
                        c_type(self.p.buffers[dst.buffer].dtype)
                    ),
                    None => format!("{} = {v};", self.element(dst)),
                };
                self.line(&l);
            }
            Stmt::Update {
                acc,
                operands,
                guards,
            } => {
                let prod: Vec<String> = operands.iter().map(|o| self.read_compute(o)).collect();
                let l = format!("{} += {};", self.element(acc), prod.join(" * "));
                match self.conds(guards, Vec::new()) {
                    Some(c) => self.line(&format!("if ({c}) {l}")),
                    None => self.line(&l),
                }
            }
            Stmt::Store { .. } => self.store(s, None)?,
            Stmt::Tensorized(c) => self.mma(c, None)?,
            Stmt::Barrier => self.line("__syncthreads();"),
        }
        Ok(())
    }

    fn for_loop(&mut self, l: &For) -> Result<(), GpuError> {
        // Cooperative copies into shared memory.
        if let Some((loops, copy)) = copy_nest(l)
            && let Stmt::Copy { dst, .. } = copy
            && self.p.buffers[dst.buffer].scope.as_str() == "shared"
        {
            return self.cooperative_copy(&loops, copy, false);
        }
        // Accumulator fills and stores over whole fragments.
        if let Some(t) = &self.tc
            && (l.var == t.vm || l.var == t.vn)
        {
            let (vm, vn) = (t.vm, t.vn);
            let inner = match &*l.body {
                Stmt::For(i) if (i.var == vm || i.var == vn) && i.var != l.var => &*i.body,
                _ => {
                    return Err(GpuError::Codegen {
                        reason:
                            "the instruction's m and n loops of the accumulator are not adjacent"
                                .into(),
                    });
                }
            };
            return match inner {
                Stmt::Fill { dst, .. } if self.is_tc_acc(dst.buffer) => {
                    let f = self.fragment(dst)?;
                    if self.tc.as_ref().is_some_and(|t| t.mma_sync) {
                        self.line(&format!(
                            "for (int tsl_e = 0; tsl_e < 4; ++tsl_e) {f}[tsl_e] = 0;"
                        ));
                    } else {
                        self.line(&format!("wmma::fill_fragment({f}, 0);"));
                    }
                    Ok(())
                }
                Stmt::Store { acc, .. } if self.is_tc_acc(acc.buffer) => {
                    self.store(inner, Some(acc))
                }
                _ => Err(GpuError::Codegen {
                    reason: "unexpected statement over the instruction's m and n loops".into(),
                }),
            };
        }
        // Hoisted fragment loads: k { m { n { mma } } } loads fm A and fn B fragments per k.
        if self.tc.is_some()
            && !matches!(l.kind, LoopKind::Bound(_))
            && let Stmt::For(inner) = &*l.body
            && let Stmt::Tensorized(c) = &*inner.body
        {
            return self.mma_block(l, inner, c);
        }
        match l.kind {
            LoopKind::Bound(a) => {
                let v = match a {
                    GpuAxis::BlockX => "blockIdx.x",
                    GpuAxis::BlockY => "blockIdx.y",
                    GpuAxis::BlockZ => "blockIdx.z",
                    GpuAxis::ThreadX => "threadIdx.x",
                    GpuAxis::ThreadY => "threadIdx.y",
                    GpuAxis::ThreadZ => "threadIdx.z",
                    GpuAxis::Warp => "warp",
                };
                let line = format!("{{ const int {} = {v};", self.names[l.var]);
                self.line(&line);
                self.stmt(&l.body)?;
                self.line("}");
                return Ok(());
            }
            _ if l.pipeline_stages.is_some_and(|s| s > 1) => return self.pipelined(l),
            LoopKind::Unrolled => self.line("#pragma unroll"),
            LoopKind::Parallel | LoopKind::Vectorized => {
                return Err(GpuError::Codegen {
                    reason: format!(
                        "loop `{}` is {:?}: bind it to a GPU axis instead",
                        self.p.vars[l.var].name, l.kind
                    ),
                });
            }
            LoopKind::Serial => {}
        }
        let v = self.names[l.var].clone();
        self.line(&format!("for (int {v} = 0; {v} < {}; ++{v}) {{", l.extent));
        self.depth += 1;
        self.stmt(&l.body)?;
        self.depth -= 1;
        self.line("}");
        Ok(())
    }

    /// `dst = epilogue(acc)` per element; for a fragment accumulator, through the warp's
    /// staging tile.
    fn store(&mut self, s: &Stmt, fragment: Option<&BufferRef>) -> Result<(), GpuError> {
        let Stmt::Store {
            dst,
            acc,
            point,
            biases,
            guards,
            accumulate,
            ..
        } = s
        else {
            return Ok(());
        };
        let at = self.p.buffers[acc.buffer].dtype;
        let float = at.is_float();
        let (vm, vn, mn, n) = match (&self.tc, fragment) {
            (Some(t), Some(_)) => (t.vm, t.vn, t.m * t.n, t.n),
            _ => (0, 0, 0, 0),
        };
        let mma_sync = self.tc.as_ref().is_some_and(|t| t.mma_sync);
        let saved = (self.names.get(vm).cloned(), self.names.get(vn).cloned());
        let value = if fragment.is_some() && mma_sync {
            // Each lane stores its own four values: no staging.
            let f = self.fragment(acc)?;
            self.line("for (int tsl_e = 0; tsl_e < 4; ++tsl_e) {");
            self.depth += 1;
            self.names[vm] = "(lane / 4 + (tsl_e / 2) * 8)".into();
            self.names[vn] = "((lane % 4) * 2 + tsl_e % 2)".into();
            format!("{f}[tsl_e]")
        } else if fragment.is_some() {
            let f = self.fragment(acc)?;
            self.line(&format!(
                "wmma::store_matrix_sync(&tsl_out[warp * {mn}], {f}, {n}, wmma::mem_row_major);"
            ));
            self.line("__syncwarp();");
            self.line(&format!(
                "for (int tsl_e = lane; tsl_e < {mn}; tsl_e += 32) {{"
            ));
            self.depth += 1;
            self.names[vm] = format!("(tsl_e / {n})");
            self.names[vn] = format!("(tsl_e % {n})");
            "tsl_out[warp * ".to_string() + &mn.to_string() + " + tsl_e]"
        } else {
            self.element(acc)
        };
        let cond = self.conds(guards, self.bounds(dst));
        self.line(&match &cond {
            Some(c) => format!("if ({c}) {{"),
            None => "{".into(),
        });
        self.depth += 1;
        self.line(&format!(
            "{} v = {value};",
            if float { "float" } else { "int" }
        ));
        let mut next_bias = 0;
        for e in &self.p.op.epilogue {
            match e {
                Epilogue::Bias(b) => {
                    let buffer = *biases.get(next_bias).ok_or_else(|| GpuError::Codegen {
                        reason: "a bias of the epilogue has no buffer".into(),
                    })?;
                    next_bias += 1;
                    let index = b.indices.iter().map(|a| a.at(point)).collect();
                    let r = BufferRef { buffer, index };
                    let l = format!("v += {};  // bias", self.read_compute(&r));
                    self.line(&l);
                }
                Epilogue::Relu => self.line("v = v > 0 ? v : 0;  // relu"),
                Epilogue::Cast(t) => {
                    let l = if float {
                        format!("v = tsl_f({});  // cast to {t}", self.convert_to("v", *t))
                    } else {
                        format!("v = tsl_i({});  // cast to {t}", self.convert_to("v", *t))
                    };
                    self.line(&l);
                }
            }
        }
        let dt = self.p.buffers[dst.buffer].dtype;
        let l = if *accumulate {
            // Split-K: the blocks' partial sums meet in the output (f32 or i32, as the
            // accumulator).
            format!("atomicAdd(&{}, v);", self.element(dst))
        } else {
            format!("{} = {};", self.element(dst), self.convert_to("v", dt))
        };
        self.line(&l);
        self.depth -= 1;
        self.line("}");
        if fragment.is_some() {
            self.depth -= 1;
            self.line("}");
            if !mma_sync {
                self.line("__syncwarp();");
            }
            if let (Some(a), Some(b)) = saved {
                self.names[vm] = a;
                self.names[vn] = b;
            }
        }
        Ok(())
    }
}

/// What each kernel parameter is: `Some(i)` the operator's `i`-th read operand
/// ([`tessel_ir::ComputeOp::read_operands`]: inputs, then biases), `None` the output.
pub fn param_operands(p: &Program, params: &[usize]) -> Result<Vec<Option<usize>>, GpuError> {
    let inputs = p.op.inputs.len();
    params
        .iter()
        .map(|&i| match p.buffers.get(i).map(|b| &b.role) {
            Some(BufferRole::Input(k)) => Ok(Some(*k)),
            Some(BufferRole::Bias(k)) => Ok(Some(inputs + k)),
            Some(BufferRole::Output) => Ok(None),
            other => Err(GpuError::Codegen {
                reason: format!("kernel parameter {i} is not an operand ({other:?})"),
            }),
        })
        .collect()
}

/// The flat element index of `r` in a layout with these element strides.
pub(crate) fn flat_index(r: &BufferRef, strides: &[i64]) -> Expr {
    let mut e = Expr::Const(0);
    for (i, s) in r.index.iter().zip(strides) {
        e = Expr::sum(e, Expr::scaled(i.clone(), *s));
    }
    e
}

/// A chain of loops ending in one copy: the loops (variable, extent) and the copy.
pub(crate) fn copy_nest(l: &For) -> Option<(Vec<(usize, u64)>, &Stmt)> {
    let mut loops = vec![(l.var, l.extent)];
    let mut s = &*l.body;
    loop {
        match s {
            Stmt::For(f) => {
                loops.push((f.var, f.extent));
                s = &f.body;
            }
            Stmt::Copy { .. } => return Some((loops, s)),
            _ => return None,
        }
    }
}
