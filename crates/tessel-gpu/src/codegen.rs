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

/// The physical layout the code generator gives a buffer: element strides per dimension and
/// the elements one copy occupies. Shared buffers keep the dimension their source is
/// contiguous along innermost (so the copy from global memory is 16-byte vectors), and rows
/// that are a multiple of 32 bytes get 16 bytes of padding (so the 8 rows a fragment load
/// touches at once fall in different banks).
pub fn physical_layouts(p: &Program) -> Vec<(Vec<i64>, u64)> {
    let plain = |shape: &[u64], order: &[usize], pad: bool, bytes: u64| {
        let mut strides = vec![1i64; shape.len()];
        let mut size = 1u64;
        for (i, &d) in order.iter().enumerate().rev() {
            strides[d] = size as i64;
            let mut extent = shape[d];
            let row = i + 1 == order.len() && order.len() > 1;
            if pad && row && (extent * bytes).is_multiple_of(32) {
                extent += 16 / bytes.max(1);
            }
            size *= extent;
        }
        (strides, size.max(1))
    };
    let mut out: Vec<(Vec<i64>, u64)> = p
        .buffers
        .iter()
        .map(|b| {
            let order: Vec<usize> = (0..b.shape.len()).collect();
            plain(&b.shape, &order, false, b.dtype.bytes() as u64)
        })
        .collect();
    // Buffers in the order their copies appear: a cache's source is laid out before it.
    let mut copies = Vec::new();
    p.body.walk(&mut |s| {
        if let Stmt::Copy { dst, src, .. } = s {
            copies.push((dst.clone(), src.clone()));
        }
    });
    for (dst, src) in copies {
        let b = &p.buffers[dst.buffer];
        if b.scope.as_str() != "shared" {
            continue;
        }
        let flat = flat_index(&src, &out[src.buffer].0);
        let contiguous = dst.index.iter().rposition(|e| match e {
            Expr::Var(v) => flat.coefficient(*v, p.vars.len()) == 1,
            _ => false,
        });
        let mut order: Vec<usize> = (0..b.shape.len()).collect();
        if let Some(d) = contiguous {
            order.retain(|&x| x != d);
            order.push(d);
        }
        out[dst.buffer] = plain(&b.shape, &order, true, b.dtype.bytes() as u64);
    }
    out
}

pub(crate) fn c_type(t: DType) -> &'static str {
    match t {
        DType::F16 => "half",
        DType::BF16 => "__nv_bfloat16",
        DType::F32 => "float",
        DType::I8 => "signed char",
        DType::U8 => "unsigned char",
        DType::I32 => "int",
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

const PRELUDE: &str = r#"#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
using namespace nvcuda;

__device__ __forceinline__ float tsl_f(half x) { return __half2float(x); }
__device__ __forceinline__ float tsl_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float tsl_f(float x) { return x; }
__device__ __forceinline__ int tsl_i(signed char x) { return x; }
__device__ __forceinline__ int tsl_i(unsigned char x) { return x; }
__device__ __forceinline__ int tsl_i(int x) { return x; }
template <typename T> __device__ __forceinline__ T tsl_to(float x);
template <> __device__ __forceinline__ float tsl_to<float>(float x) { return x; }
template <> __device__ __forceinline__ half tsl_to<half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 tsl_to<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <typename T> __device__ __forceinline__ T tsl_to_i(int x);
template <> __device__ __forceinline__ int tsl_to_i<int>(int x) { return x; }
template <> __device__ __forceinline__ signed char tsl_to_i<signed char>(int x) { return (signed char)max(-128, min(127, x)); }
template <> __device__ __forceinline__ unsigned char tsl_to_i<unsigned char>(int x) { return (unsigned char)max(0, min(255, x)); }

// 16-byte asynchronous copy global -> shared (sm_80+); src_bytes = 0 fills zeros.
__device__ __forceinline__ void tsl_cp_async16(void* dst, const void* src, int src_bytes) {
#if __CUDA_ARCH__ >= 800
  unsigned s = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(s), "l"(src), "r"(src_bytes));
#else
  if (src_bytes) *(uint4*)dst = *(const uint4*)src; else *(uint4*)dst = make_uint4(0, 0, 0, 0);
#endif
}
__device__ __forceinline__ void tsl_cp_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> __device__ __forceinline__ void tsl_cp_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
#endif
}
"#;

/// mma.sync m16n8k16 through inline PTX, with `ldmatrix` operand loads (sm_80+).
const MMA_PRELUDE: &str = r#"
#ifndef TSL_EMULATED  // (tessel-gpu's CPU emulator defines these itself)
// ldmatrix: 8x8 tiles of 16-bit elements from shared memory; lane l gives the address of one
// 16-byte row (lanes 0-7 the rows of the first tile, 8-15 the second, ...).
__device__ __forceinline__ void tsl_ldsm_x4(unsigned* r, const void* p) {
  unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
__device__ __forceinline__ void tsl_ldsm_x4_trans(unsigned* r, const void* p) {
  unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
__device__ __forceinline__ void tsl_ldsm_x2(unsigned* r, const void* p) {
  unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(s));
}
__device__ __forceinline__ void tsl_ldsm_x2_trans(unsigned* r, const void* p) {
  unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(s));
}
// d += a * b on a 16x8x16 tile: a in 4 registers (row), b in 2 (col), d in 4 floats.
__device__ __forceinline__ void tsl_mma_f16(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void tsl_mma_bf16(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif
"#;

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

    fn fragment_array(&mut self, buffer: usize) -> Result<(), GpuError> {
        let Some(t) = &self.tc else { return Ok(()) };
        let dims = self.fragment_dims(buffer)?;
        let shape: String = dims
            .iter()
            .map(|&d| format!("[{}]", self.p.buffers[buffer].shape[d]))
            .collect();
        if t.mma_sync {
            // Lane l holds rows l/4 and l/4+8, columns 2(l%4) and 2(l%4)+1 of each tile.
            let l = format!(
                "{} {}{shape}[4];  // {}x{} accumulator tiles, 4 values per lane",
                c_type(t.acc_type),
                self.bufs[buffer],
                t.m,
                t.n
            );
            self.line(&l);
            return Ok(());
        }
        let l = format!(
            "wmma::fragment<wmma::accumulator, {}, {}, {}, {}> {}{shape};",
            t.m,
            t.n,
            t.k,
            c_type(t.acc_type),
            self.bufs[buffer],
        );
        self.line(&l);
        Ok(())
    }

    /// The accumulator dimensions that index fragments (not the instruction's m and n).
    fn fragment_dims(&self, buffer: usize) -> Result<Vec<usize>, GpuError> {
        let Some(t) = &self.tc else {
            return Ok(Vec::new());
        };
        // Find the accumulator reference of a tensorized call to learn which dims are m, n.
        let mut acc_ref = None;
        self.p.body.walk(&mut |s| {
            if let Stmt::Tensorized(c) = s {
                acc_ref = Some(c.acc.clone());
            }
        });
        let r = acc_ref.ok_or_else(|| GpuError::Codegen {
            reason: "no tensorized call".into(),
        })?;
        if r.buffer != buffer {
            return Ok(Vec::new());
        }
        Ok((0..r.index.len())
            .filter(|&d| !r.index[d].uses(t.vm) && !r.index[d].uses(t.vn))
            .collect())
    }

    fn fragment(&self, r: &BufferRef) -> Result<String, GpuError> {
        let dims = self.fragment_dims(r.buffer)?;
        let mut s = self.bufs[r.buffer].clone();
        for d in dims {
            let _ = write!(s, "[{}]", self.expr(&r.index[d]));
        }
        Ok(s)
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

    /// All threads of the block copy the nest's elements, 16 bytes at a time where the
    /// layout allows (cp.async when `async_ok`).
    fn cooperative_copy(
        &mut self,
        loops: &[(usize, u64)],
        copy: &Stmt,
        async_ok: bool,
    ) -> Result<(), GpuError> {
        let Stmt::Copy {
            dst, src, guards, ..
        } = copy
        else {
            return Ok(());
        };
        let total: u64 = loops.iter().map(|l| l.1).product();
        let bytes = self.p.buffers[dst.buffer].dtype.bytes() as u64;
        let width = 16 / bytes.max(1);
        // Linear coefficients of the flat source and destination indices.
        let (sf, df) = (self.flat(src), self.flat(dst));
        let coeff = |e: &Expr, v: usize| e.coefficient(v, self.p.vars.len());
        // Walk the source's contiguous dimension innermost: consecutive threads then read
        // consecutive addresses (coalesced), 16 bytes each where possible.
        let mut loops = loops.to_vec();
        if let Some(i) = loops.iter().position(|&(v, _)| coeff(&sf, v) == 1) {
            let l = loops.remove(i);
            loops.push(l);
        }
        let loops = &loops[..];
        let (inner_var, inner_ext) = *loops.last().unwrap_or(&(usize::MAX, 1));
        let vec_ok = inner_var != usize::MAX
            && inner_ext % width == 0
            && affine(&sf)
            && affine(&df)
            && coeff(&sf, inner_var) == 1
            && coeff(&df, inner_var) == 1
            && self.bounds(src).is_empty()
            && guards.is_empty()
            && (0..self.p.vars.len())
                .filter(|&v| v != inner_var)
                .all(|v| coeff(&sf, v) % width as i64 == 0 && coeff(&df, v) % width as i64 == 0)
            && sf.eval(&vec![0; self.p.vars.len()]) % width as i64 == 0
            && width > 1;
        let step = if vec_ok { width } else { 1 };
        let iters = total / step;
        self.line(&format!(
            "// {} <- {}: {total} elements, {} threads{}",
            self.p.buffers[dst.buffer].name,
            self.p.buffers[src.buffer].name,
            self.nthreads,
            if vec_ok { ", 16-byte vectors" } else { "" }
        ));
        self.line(&format!(
            "for (int tsl_i = {}; tsl_i < {iters}; tsl_i += {}) {{",
            self.tid, self.nthreads
        ));
        self.depth += 1;
        // Decompose the flat index into the copy loops' variables.
        let saved: Vec<String> = loops.iter().map(|&(v, _)| self.names[v].clone()).collect();
        let mut div = 1u64;
        for &(v, e) in loops.iter().rev() {
            let e_eff = if v == inner_var { e / step } else { e };
            let name = format!("c_{}", self.names[v]);
            let scale = if v == inner_var && step > 1 {
                format!(" * {step}")
            } else {
                String::new()
            };
            self.line(&format!(
                "const int {name} = (tsl_i / {div}) % {e_eff}{scale};"
            ));
            div *= e_eff;
            self.names[v] = name;
        }
        if vec_ok {
            let d = self.element(dst);
            let s = self.element(src);
            if async_ok {
                self.uses_cp_async = true;
                self.line(&format!("tsl_cp_async16(&{d}, &{s}, 16);"));
            } else {
                self.line(&format!("*(uint4*)&{d} = *(const uint4*)&{s};"));
            }
        } else {
            self.stmt(copy)?;
        }
        for (&(v, _), n) in loops.iter().zip(saved) {
            self.names[v] = n;
        }
        self.depth -= 1;
        self.line("}");
        Ok(())
    }

    /// An S-stage pipeline over a reduction loop whose body stages inputs in shared memory.
    fn pipelined(&mut self, l: &For) -> Result<(), GpuError> {
        let stages = l.pipeline_stages.unwrap_or(1).max(1);
        // Unwrap the allocations and split the body into copies and the rest.
        let mut body = &*l.body;
        let mut allocs = Vec::new();
        while let Stmt::Allocate { buffer, body: b } = body {
            allocs.push(*buffer);
            body = b;
        }
        let items: Vec<&Stmt> = match body {
            Stmt::Seq(v) => v.iter().collect(),
            s => vec![s],
        };
        let mut copies = Vec::new();
        let mut rest = Vec::new();
        for s in items {
            match s {
                Stmt::Barrier => {}
                Stmt::For(f)
                    if copy_nest(f).is_some_and(|(_, c)| matches!(c, Stmt::Copy { dst, .. } if allocs.contains(&dst.buffer))) =>
                {
                    copies.push(f)
                }
                Stmt::Copy { dst, .. } if allocs.contains(&dst.buffer) => {
                    return Err(GpuError::Codegen {
                        reason: "a scalar copy into a pipelined buffer".into(),
                    });
                }
                other => rest.push(other),
            }
        }
        let k = self.names[l.var].clone();
        let kext = l.extent;
        let s1 = stages - 1;
        self.line(&format!(
            "// {stages}-stage pipeline over {}: the copy for step {k} + {s1} overlaps the compute of step {k}",
            self.p.vars[l.var].name
        ));
        let issue = |me: &mut Self, step: &str| -> Result<(), GpuError> {
            let saved = me.names[l.var].clone();
            me.names[l.var] = format!("({step})");
            for &b in &allocs {
                me.stage[b] = Some(format!("({step}) % {stages}"));
            }
            for f in &copies {
                if let Some((loops, c)) = copy_nest(f) {
                    me.cooperative_copy(&loops, c, true)?;
                }
            }
            me.names[l.var] = saved;
            Ok(())
        };
        self.line(&format!("for (int tsl_s = 0; tsl_s < {s1}; ++tsl_s) {{"));
        self.depth += 1;
        self.line(&format!("if (tsl_s < {kext}) {{"));
        self.depth += 1;
        issue(self, "tsl_s")?;
        self.depth -= 1;
        self.line("}");
        self.line("tsl_cp_commit();");
        self.depth -= 1;
        self.line("}");
        self.line(&format!("for (int {k} = 0; {k} < {kext}; ++{k}) {{"));
        self.depth += 1;
        self.line(&format!("if ({k} + {s1} < {kext}) {{"));
        self.depth += 1;
        issue(self, &format!("{k} + {s1}"))?;
        self.depth -= 1;
        self.line("}");
        self.line("tsl_cp_commit();");
        self.line(&format!("tsl_cp_wait<{s1}>();"));
        self.line("__syncthreads();");
        for &b in &allocs {
            self.stage[b] = Some(format!("{k} % {stages}"));
        }
        for s in rest {
            self.stmt(s)?;
        }
        for &b in &allocs {
            self.stage[b] = None;
        }
        self.line("__syncthreads();");
        self.depth -= 1;
        self.line("}");
        self.line("tsl_cp_wait<0>();");
        Ok(())
    }

    /// Pointer, leading dimension and layout of a WMMA operand: `rows`/`cols` are the loop
    /// variables of the fragment's two dimensions.
    fn operand(
        &self,
        r: &BufferRef,
        rows: usize,
        cols: usize,
    ) -> Result<(String, i64, bool), GpuError> {
        let f = self.flat(r);
        let coeff = |v: usize| f.coefficient(v, self.p.vars.len());
        let (cr, cc) = (coeff(rows), coeff(cols));
        let (ld, row_major) = match (cr, cc) {
            (_, 1) => (cr, true),
            (1, _) => (cc, false),
            _ => {
                return Err(GpuError::Codegen {
                    reason: format!(
                        "{} is not contiguous along either dimension of the fragment",
                        self.p.buffers[r.buffer].name
                    ),
                });
            }
        };
        let bytes = self.p.buffers[r.buffer].dtype.bytes() as i64;
        if (ld * bytes) % 16 != 0 {
            return Err(GpuError::Codegen {
                reason: format!(
                    "leading dimension {ld} of {} is not a multiple of 16 bytes",
                    self.p.buffers[r.buffer].name
                ),
            });
        }
        // The fragment's origin: the instruction variables at zero.
        let mut me = Emitter {
            names: self.names.clone(),
            ..self.shallow()
        };
        let t = self.tc.as_ref().ok_or_else(|| GpuError::Codegen {
            reason: "no Tensor Core instruction".into(),
        })?;
        for v in [t.vm, t.vn, t.vk] {
            me.names[v] = "0".into();
        }
        if !self.bounds(r).is_empty() {
            return Err(GpuError::Codegen {
                reason: format!(
                    "{} is read past its edges by a fragment: stage it in shared memory (zero-filled)",
                    self.p.buffers[r.buffer].name
                ),
            });
        }
        Ok((format!("&{}", me.element(r)), ld, row_major))
    }

    fn shallow(&self) -> Emitter<'_> {
        Emitter {
            p: self.p,
            out: String::new(),
            depth: 0,
            names: Vec::new(),
            bufs: self.bufs.clone(),
            strides: self.strides.clone(),
            sizes: self.sizes.clone(),
            stage: self.stage.clone(),
            stages: self.stages.clone(),
            tc: None,
            nthreads: self.nthreads,
            tid: String::new(),
            uses_cp_async: false,
            decls: Vec::new(),
        }
    }

    /// The `ldmatrix` that fills mma.sync operand registers `dst` with this lane's part of the
    /// A (16x16, 4 registers) or B (16x8, 2 registers) tile at `r`, transposing where the
    /// shared layout is not the one the instruction reads (A row-major, B column-major).
    fn ldmatrix(&self, r: &BufferRef, is_a: bool, dst: &str) -> Result<String, GpuError> {
        let t = self.tc.as_ref().ok_or_else(|| GpuError::Codegen {
            reason: "no Tensor Core instruction".into(),
        })?;
        if self.p.buffers[r.buffer].scope.as_str() != "shared" {
            return Err(GpuError::Codegen {
                reason: format!(
                    "mma.sync reads its operands with ldmatrix from shared memory; {} is in {}",
                    self.p.buffers[r.buffer].name, self.p.buffers[r.buffer].scope
                ),
            });
        }
        let (rows, cols) = if is_a { (t.vm, t.vk) } else { (t.vk, t.vn) };
        let (p, ld, row_major) = self.operand(r, rows, cols)?;
        Ok(match (is_a, row_major) {
            // A[m][k]: lanes 0-15 rows m of k 0-7, lanes 16-31 rows m of k 8-15.
            (true, true) => {
                format!("tsl_ldsm_x4({dst}, {p} + (lane % 16) * {ld} + (lane / 16) * 8)")
            }
            // A stored [k][m]: tile j = lane/8 is m 8(j%2).., k 8(j/2)..; its rows are k.
            (true, false) => format!(
                "tsl_ldsm_x4_trans({dst}, {p} + (lane % 8 + (lane / 16) * 8) * {ld} + ((lane / 8) % 2) * 8)"
            ),
            // B stored [k][n]: rows k 0-15, transposed into the column-major fragment.
            (false, true) => format!("tsl_ldsm_x2_trans({dst}, {p} + (lane % 16) * {ld})"),
            // B stored [n][k]: rows n, k 0-7 then 8-15.
            (false, false) => {
                format!("tsl_ldsm_x2({dst}, {p} + (lane % 8) * {ld} + ((lane / 8) % 2) * 8)")
            }
        })
    }

    fn mma_fn(&self) -> &'static str {
        match self.tc.as_ref().map(|t| t.in_type) {
            Some(DType::BF16) => "tsl_mma_bf16",
            _ => "tsl_mma_f16",
        }
    }

    fn frag_type(&self, which: &str, row_major: bool) -> String {
        let t = self
            .tc
            .as_ref()
            .map_or((16, 16, 16, DType::F16), |t| (t.m, t.n, t.k, t.in_type));
        let ty = match t.3 {
            DType::F16 => "half",
            DType::BF16 => "__nv_bfloat16",
            DType::F32 => "wmma::precision::tf32",
            DType::I8 => "signed char",
            DType::U8 => "unsigned char",
            DType::I32 => "int",
        };
        format!(
            "wmma::fragment<wmma::{which}, {}, {}, {}, {ty}, wmma::{}>",
            t.0,
            t.1,
            t.2,
            if row_major { "row_major" } else { "col_major" }
        )
    }

    /// One call: load both fragments and multiply-accumulate.
    fn mma(&mut self, c: &TensorizedCall, _: Option<()>) -> Result<(), GpuError> {
        let (vm, vn, vk) = match &self.tc {
            Some(t) => (t.vm, t.vn, t.vk),
            None => {
                return Err(GpuError::Codegen {
                    reason: "no Tensor Core instruction".into(),
                });
            }
        };
        if self.tc.as_ref().is_some_and(|t| t.mma_sync) {
            let load_a = self.ldmatrix(&c.operands[0], true, "a")?;
            let load_b = self.ldmatrix(&c.operands[1], false, "b")?;
            let acc = self.fragment(&c.acc)?;
            let f = self.mma_fn();
            self.line("{");
            self.depth += 1;
            self.line("unsigned a[4], b[2];");
            self.line(&format!("{load_a}; {load_b};"));
            self.line(&format!("{f}({acc}, a, b);"));
            self.depth -= 1;
            self.line("}");
            return Ok(());
        }
        let (pa, lda, ra) = self.operand(&c.operands[0], vm, vk)?;
        let (pb, ldb, rb) = self.operand(&c.operands[1], vk, vn)?;
        let acc = self.fragment(&c.acc)?;
        self.line("{");
        self.depth += 1;
        let (ta, tb) = (
            self.frag_type("matrix_a", ra),
            self.frag_type("matrix_b", rb),
        );
        self.line(&format!("{ta} a; wmma::load_matrix_sync(a, {pa}, {lda});"));
        self.line(&format!("{tb} b; wmma::load_matrix_sync(b, {pb}, {ldb});"));
        self.line(&format!("wmma::mma_sync({acc}, a, b, {acc});"));
        self.depth -= 1;
        self.line("}");
        Ok(())
    }

    /// `for o { for i { mma } }`: loads the fragments of A and B once per (o or i) instead of
    /// once per call.
    fn mma_block(&mut self, outer: &For, inner: &For, c: &TensorizedCall) -> Result<(), GpuError> {
        let (vm, vn, vk) = match &self.tc {
            Some(t) => (t.vm, t.vn, t.vk),
            None => {
                return Err(GpuError::Codegen {
                    reason: "no Tensor Core instruction".into(),
                });
            }
        };
        let uses = |r: &BufferRef, v: usize| r.index.iter().any(|e| e.uses(v));
        let (a, b) = (&c.operands[0], &c.operands[1]);
        let (o, i) = (outer.var, inner.var);
        // A must not depend on the loop that B depends on, and vice versa.
        let (a_loop, b_loop) = if !uses(a, i) && !uses(b, o) {
            (outer, inner)
        } else if !uses(a, o) && !uses(b, i) {
            (inner, outer)
        } else {
            // Fall back to one load per call.
            let v = self.names[o].clone();
            self.line("#pragma unroll");
            self.line(&format!(
                "for (int {v} = 0; {v} < {}; ++{v}) {{",
                outer.extent
            ));
            self.depth += 1;
            let v2 = self.names[i].clone();
            self.line("#pragma unroll");
            self.line(&format!(
                "for (int {v2} = 0; {v2} < {}; ++{v2}) {{",
                inner.extent
            ));
            self.depth += 1;
            self.mma(c, None)?;
            self.depth -= 1;
            self.line("}");
            self.depth -= 1;
            self.line("}");
            return Ok(());
        };
        let (an, bn) = (
            self.names[a_loop.var].clone(),
            self.names[b_loop.var].clone(),
        );
        let acc = self.fragment(&c.acc)?;
        // Per flavour: the operand arrays, one load of each, one multiply-accumulate.
        let (decls, load_a, load_b, mma) = if self.tc.as_ref().is_some_and(|t| t.mma_sync) {
            (
                vec![format!(
                    "unsigned a[{}][4], b[{}][2];",
                    a_loop.extent, b_loop.extent
                )],
                self.ldmatrix(a, true, &format!("a[{an}]"))?,
                self.ldmatrix(b, false, &format!("b[{bn}]"))?,
                format!("{}({acc}, a[{an}], b[{bn}]);", self.mma_fn()),
            )
        } else {
            let (pa, lda, ra) = self.operand(a, vm, vk)?;
            let (pb, ldb, rb) = self.operand(b, vk, vn)?;
            (
                vec![
                    format!("{} a[{}];", self.frag_type("matrix_a", ra), a_loop.extent),
                    format!("{} b[{}];", self.frag_type("matrix_b", rb), b_loop.extent),
                ],
                format!("wmma::load_matrix_sync(a[{an}], {pa}, {lda})"),
                format!("wmma::load_matrix_sync(b[{bn}], {pb}, {ldb})"),
                format!("wmma::mma_sync({acc}, a[{an}], b[{bn}], {acc});"),
            )
        };
        for d in &decls {
            self.line(d);
        }
        for (v, extent, load) in [(&an, a_loop.extent, &load_a), (&bn, b_loop.extent, &load_b)] {
            self.line("#pragma unroll");
            self.line(&format!("for (int {v} = 0; {v} < {extent}; ++{v}) {load};"));
        }
        let (on, inn) = (self.names[o].clone(), self.names[i].clone());
        self.line("#pragma unroll");
        self.line(&format!(
            "for (int {on} = 0; {on} < {}; ++{on})",
            outer.extent
        ));
        self.line("#pragma unroll");
        self.line(&format!(
            "  for (int {inn} = 0; {inn} < {}; ++{inn})",
            inner.extent
        ));
        self.line(&format!("    {mma}"));
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
