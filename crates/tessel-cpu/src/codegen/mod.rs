//! Lowered programs to C with x86 intrinsics.
//!
//! Each [`Program`] becomes one C function `void NAME(void *const *args)` whose arguments are
//! the operator's inputs, its epilogue biases, then the output. Loops keep their names from the
//! trace (`m.0` becomes `m_0`); statements carry comments that cite the trace step that made them.
//!
//! Tensorized calls take one of three forms:
//! - a *register block*: a reduction loop whose body is only unrolled loops around one call
//!   keeps every accumulator in registers (AMX tiles or vector registers) across the reduction
//!   loop, loading each A and B fragment once per iteration; a vector instruction's A may be
//!   read in place where its reads leave the tensor (a padded convolution's border) or its
//!   rows are padding: each fragment's pointer, chosen before the loop, then points at zeros;
//! - a *direct* call: operands already in the instruction's layout are loaded in place;
//! - a *staged* call: operands in any other layout, or under padding guards, are gathered into
//!   a small buffer in the instruction's layout (zeros where a guard fails), and the
//!   accumulator is scattered back only where the guards hold.
//!
//! [`call_paths`] says which form each call takes ([`CpuCodePaths`] answers the features).

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;

use tessel_intrin::{Catalog, Intrinsic, Requirement};
use tessel_ir::{
    BufferRef, BufferRole, DType, Epilogue, Expr, For, LoopKind, Program, Stmt, TensorizedCall,
    linear_stride,
};

use tessel_measure::{CallPath, CallPaths, CodePaths};

use crate::error::CodegenError;

mod instr;
mod prepack;
mod tensorize;
mod version;

pub use prepack::{Prepacked, generate_prepacked};

use instr::*;

/// A vectorized loop whose accesses stride this many elements or more is not forced to SIMD
/// (each lane would be a gather from its own cache line).
const GATHER_STRIDE: u64 = 16;

/// gcc 12's loop vectorizer, left to its default cost model, spends minutes on an innermost
/// loop that strides a power of two of this many elements or more (a 512x11008x4096 dense
/// layer's kernel took 65 s). A kernel with such a loop asks for the very-cheap model, gcc's
/// -O2 default, which compiles it in half a second; loops forced to SIMD keep theirs.
const SLOW_VECTORIZER_STRIDE: u64 = 1024;
const VERY_CHEAP_VECTORIZER: &str = "__attribute__((optimize(\"vect-cost-model=very-cheap\")))";

/// The shared C prelude: types, conversions, the AMX tile configuration and the scalar
/// emulation of the intrinsics (under `TESSEL_EMULATE`).
pub const PRELUDE: &str = include_str!("../prelude.h");

/// Allocations inside a parallel loop larger than this go to thread-local static storage
/// instead of the (limited) thread stack.
const MAX_STACK_BYTES: u64 = 256 * 1024;

/// Register blocks with more points than this are emitted as ordinary loops.
const MAX_BLOCK_POINTS: u64 = 64;

/// One generated C function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    pub name: String,
    pub source: String,
    /// CPU features its instructions need, named as [`tessel_intrin::HostCpu`] names them.
    pub features: BTreeSet<String>,
    /// Ids of the instructions it calls.
    pub intrinsics: BTreeSet<String>,
}

impl Kernel {
    /// FNV-1a (64 bits, hex) of the source with the kernel's name made neutral: the same
    /// code gives the same digest under any name, and a record keeps it
    /// (`Measurement::kernel`) to tell later whether today's code generator still builds
    /// what was timed. FNV, not `std`'s hasher, because records outlive Rust releases.
    pub fn digest(&self) -> String {
        let neutral = self.source.replace(self.name.as_str(), "kernel");
        let h = neutral.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        format!("{h:016x}")
    }
}

/// Generates the C function `name` for `program`.
pub fn generate(program: &Program, name: &str, catalog: &Catalog) -> Result<Kernel, CodegenError> {
    let mut g = Gen::new(program, catalog)?;
    g.kernel(name)?;
    Ok(Kernel {
        name: name.to_string(),
        source: g.out,
        features: g.features,
        intrinsics: g.intrinsics,
    })
}

/// How [`generate`] emits each tensorized call of `program` (register block, direct or
/// staged), by the trace step that tensorized it. It generates the kernel to find out: the
/// choice depends on every layout and bound check the generator makes.
pub fn call_paths(program: &Program, catalog: &Catalog) -> Result<CallPaths, CodegenError> {
    let mut g = Gen::new(program, catalog)?;
    g.kernel("tessel_paths")?;
    Ok(g.paths)
}

/// This backend's [`CodePaths`]: what the features learn from the code generator.
pub struct CpuCodePaths {
    catalog: Catalog,
}

impl CpuCodePaths {
    pub fn new(catalog: Catalog) -> Self {
        CpuCodePaths { catalog }
    }
}

impl CodePaths for CpuCodePaths {
    fn call_paths(&self, program: &Program) -> Result<CallPaths, String> {
        call_paths(program, &self.catalog).map_err(|e| e.to_string())
    }
}

/// A whole C translation unit: the prelude followed by `kernels`.
pub fn module_source(kernels: &[&Kernel]) -> String {
    let mut s = String::with_capacity(
        PRELUDE.len() + kernels.iter().map(|k| k.source.len()).sum::<usize>(),
    );
    s.push_str(PRELUDE);
    for k in kernels {
        s.push('\n');
        s.push_str(&k.source);
    }
    s
}

/// The C type that holds one element of `t`.
pub fn c_type(t: DType) -> &'static str {
    match t {
        DType::BF16 => "uint16_t",
        DType::F16 => "_Float16",
        DType::F32 => "float",
        DType::I8 => "int8_t",
        DType::U8 => "uint8_t",
        DType::I32 => "int32_t",
        DType::I16 => "int16_t",
    }
}

/// Arithmetic happens in f32 for floating types and in wrapping i32 for integers.
fn compute_type(t: DType) -> DType {
    if t.is_float() { DType::F32 } else { DType::I32 }
}

/// `x` (an element of `from`) as a value of compute type `to`.
fn to_compute(x: &str, from: DType, to: DType) -> String {
    match (to, from) {
        (DType::F32, DType::BF16) => format!("tsl_bf16_to_f32({x})"),
        (DType::F32, DType::F32) | (DType::I32, DType::I32) => x.to_string(),
        (DType::F32, _) => format!("(float)({x})"),
        (_, _) => format!("(int32_t)({x})"),
    }
}

/// `v` (of compute type `from`) rounded to an element of `to`, as [`DType::round`] does.
fn from_compute(v: &str, from: DType, to: DType) -> String {
    match (from, to) {
        (DType::F32, DType::BF16) => format!("tsl_f32_to_bf16({v})"),
        (DType::F32, DType::F16) => format!("(_Float16)({v})"),
        (DType::F32, DType::F32) | (DType::I32, DType::I32) => v.to_string(),
        (DType::F32, DType::I8) => format!("tsl_sat_i8({v})"),
        (DType::F32, DType::U8) => format!("tsl_sat_u8({v})"),
        (DType::F32, DType::I16) => format!("tsl_sat_i16({v})"),
        (DType::F32, DType::I32) => format!("(int32_t)lroundf({v})"),
        (_, DType::F32) => format!("(float)({v})"),
        (_, DType::BF16) => format!("tsl_f32_to_bf16((float)({v}))"),
        (_, DType::F16) => format!("(_Float16)({v})"),
        (_, DType::I8) => format!("tsl_sat_i8_i32({v})"),
        (_, DType::U8) => format!("tsl_sat_u8_i32({v})"),
        (_, DType::I16) => format!("tsl_sat_i16_i32({v})"),
        (_, _) => v.to_string(),
    }
}

fn feature_flags(intr: &Intrinsic) -> Vec<String> {
    match &intr.requires {
        Requirement::CpuFeatures(f) => f.iter().map(|s| s.to_string()).collect(),
        Requirement::ComputeCapability(..) => Vec::new(),
    }
}

/// Replaces loop variable `var` by the constant `val`.
fn subst(e: &Expr, var: usize, val: i64) -> Expr {
    match e {
        Expr::Const(c) => Expr::Const(*c),
        Expr::Var(v) if *v == var => Expr::Const(val),
        Expr::Var(v) => Expr::Var(*v),
        Expr::Add(a, b) => Expr::sum(subst(a, var, val), subst(b, var, val)),
        Expr::Mul(a, c) => Expr::scaled(subst(a, var, val), *c),
        Expr::Div(a, c) => Expr::floor_div(subst(a, var, val), *c),
        Expr::Mod(a, c) => Expr::floor_mod(subst(a, var, val), *c),
    }
}

fn subst_ref(r: &BufferRef, vals: &[(usize, i64)]) -> BufferRef {
    BufferRef {
        buffer: r.buffer,
        index: r
            .index
            .iter()
            .map(|e| vals.iter().fold(e.clone(), |e, &(v, x)| subst(&e, v, x)))
            .collect(),
    }
}

const C_KEYWORDS: &[&str] = &[
    "args", "auto", "break", "case", "char", "const", "continue", "default", "do", "double",
    "else", "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long", "register",
    "restrict", "return", "short", "signed", "sizeof", "static", "struct", "switch", "typedef",
    "union", "unsigned", "void", "volatile", "while", "v",
];

fn ident(name: &str, used: &mut HashSet<String>) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    if C_KEYWORDS.contains(&s.as_str()) || s.starts_with("tsl_") || s.starts_with("_tile") {
        s.insert_str(0, "x_");
    }
    let base = s.clone();
    let mut i = 1;
    while used.contains(&s) {
        s = format!("{base}_{i}");
        i += 1;
    }
    used.insert(s.clone());
    s
}

struct Gen<'p> {
    p: &'p Program,
    catalog: &'p Catalog,
    out: String,
    depth: usize,
    vars: Vec<String>,
    bufs: Vec<String>,
    in_parallel: bool,
    uses_amx: bool,
    features: BTreeSet<String>,
    intrinsics: BTreeSet<String>,
    /// Set when generating the variant of a kernel that takes one input already packed.
    prepacked: Option<prepack::Plan<'p>>,
    /// An innermost loop left to the vectorizer strides a large power of two
    /// ([`SLOW_VECTORIZER_STRIDE`]).
    slow_to_vectorize: bool,
    /// Variables of the loops around the statement being emitted.
    bound: Vec<usize>,
    /// How many unrolled or vectorized loops enclose it (none may hold a versioned body).
    special_depth: usize,
    /// Inside a versioned body (one level of versioning only).
    versioned: bool,
    /// Bounds checks the enclosing versioned body's condition proves: left out.
    proven: HashSet<String>,
    /// Rows of each AMX tile in the kernel's own tile configuration (0: not yet given a
    /// role); set only by calls on partial tiles, whose kernels then load this configuration
    /// instead of the prelude's sixteen rows everywhere.
    amx_rows: [u8; 8],
    /// Set while emitting the statement after a zero fill of an accumulator buffer (and
    /// before its store to the output), where an AMX register block may take both over.
    acc_fusion: Option<AccFusion>,
    /// How each tensorized call was emitted, by its trace step (the first emission where a
    /// versioned body emits a call twice: both copies take the same path).
    paths: CallPaths,
    /// [`Gen::layout_stride`]'s answers: (instruction, its rows, operand, role, tile loops) ->
    /// stride.
    layouts: RefCell<HashMap<LayoutKey, Option<i64>>>,
}

type LayoutKey = (&'static str, i64, BufferRef, Role, [usize; 3]);

/// A store an AMX register block may take over ([`AccFusion::store`]).
#[derive(Clone)]
struct FusedStore {
    dst: BufferRef,
    acc: BufferRef,
    bias: Option<BufferRef>,
}

/// An accumulator buffer between its zero fill and its store, for the AMX register block
/// that computes all of it ([`Gen::acc_fusion`]).
struct AccFusion {
    /// The buffer just zeroed.
    zeroed: usize,
    /// How many loops enclosed the fill: the block may start at zero only where every loop
    /// opened since runs once.
    depth: usize,
    /// The store after it, where it only copies the accumulator (no guard, the same type)
    /// or adds a bias of that type to it: the output, the accumulator, and the bias's
    /// element as a function of the loop variables.
    store: Option<FusedStore>,
    /// What the block took over.
    zeroed_in_tiles: bool,
    stored_direct: bool,
}

impl<'p> Gen<'p> {
    fn new(p: &'p Program, catalog: &'p Catalog) -> Result<Self, CodegenError> {
        let mut used = HashSet::new();
        let bufs = p
            .buffers
            .iter()
            .map(|b| ident(&b.name, &mut used))
            .collect();
        let vars = p.vars.iter().map(|v| ident(&v.name, &mut used)).collect();
        let mut uses_amx = false;
        let mut features = BTreeSet::new();
        let mut intrinsics = BTreeSet::new();
        let mut err = None;
        p.body.walk(&mut |s| {
            if let Stmt::Tensorized(c) = s {
                match instr_for(catalog, c) {
                    Ok(i) => {
                        uses_amx |= matches!(i.family, Family::Amx { .. });
                        features.extend(feature_flags(i.intr));
                        intrinsics.insert(c.intrinsic.clone());
                    }
                    Err(e) => err = Some(e),
                }
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        Ok(Gen {
            p,
            catalog,
            out: String::new(),
            depth: 0,
            vars,
            bufs,
            in_parallel: false,
            uses_amx,
            features,
            intrinsics,
            prepacked: None,
            slow_to_vectorize: false,
            bound: Vec::new(),
            special_depth: 0,
            versioned: false,
            proven: HashSet::new(),
            amx_rows: [0; 8],
            acc_fusion: None,
            paths: CallPaths::new(),
            layouts: RefCell::default(),
        })
    }

    /// `[.., fill, next, store?, ..]`: a nest that zeroes all of an accumulator buffer, the
    /// statement that computes it, and maybe the nest that copies it to the output. `next` is
    /// emitted first, aside, to learn whether an AMX register block in it zeroed its tiles
    /// (the fill is then left out) and stored them to the output (the store too).
    fn acc_fusion(
        &mut self,
        mut zeroed: usize,
        fill: &Stmt,
        next: &Stmt,
        store: Option<(&Stmt, StoreNest)>,
    ) -> Result<(), CodegenError> {
        // Only where one tensorized call, into this buffer, is all that writes in between.
        let (mut calls, mut others) = (0, false);
        next.walk(&mut |s| match s {
            Stmt::Tensorized(c) => {
                calls += 1;
                others |= c.acc.buffer != zeroed;
            }
            Stmt::Fill { dst, .. } | Stmt::Copy { dst, .. } | Stmt::Store { dst, .. } => {
                others |= dst.buffer == zeroed;
            }
            Stmt::Update { acc, .. } => others |= acc.buffer == zeroed,
            _ => {}
        });
        if calls != 1 || others {
            zeroed = usize::MAX;
        }
        let at = |b: usize| self.p.buffers[b].dtype;
        let copy = store.and_then(|(_, n)| {
            if n.acc.buffer != zeroed || at(n.dst.buffer) != at(n.acc.buffer) {
                return None;
            }
            // Nothing to apply, or one bias in the accumulator's type (the tiles start from it).
            let bias = match self.p.op.epilogue.as_slice() {
                [] => None,
                [Epilogue::Bias(b)] => {
                    let buffer = *n.biases.first()?;
                    if at(buffer) != at(n.acc.buffer) {
                        return None;
                    }
                    Some(BufferRef {
                        buffer,
                        index: b.indices.iter().map(|a| a.at(n.point)).collect(),
                    })
                }
                _ => return None,
            };
            Some(FusedStore {
                dst: n.dst.clone(),
                acc: n.acc.clone(),
                bias,
            })
        });
        let outer = self.acc_fusion.replace(AccFusion {
            zeroed,
            depth: self.bound.len(),
            store: copy,
            zeroed_in_tiles: false,
            stored_direct: false,
        });
        let before = std::mem::take(&mut self.out);
        let result = self.stmt(next);
        let middle = std::mem::replace(&mut self.out, before);
        let done = std::mem::replace(&mut self.acc_fusion, outer);
        result?;
        let (zeroed_in_tiles, stored_direct) =
            done.map_or((false, false), |d| (d.zeroed_in_tiles, d.stored_direct));
        if !zeroed_in_tiles {
            self.stmt(fill)?;
        }
        self.out.push_str(&middle);
        if let Some((st, _)) = store
            && !stored_direct
        {
            self.stmt(st)?;
        }
        Ok(())
    }

    /// Distinct AMX tiles with the given rows, one per entry of `want`, from the kernel's
    /// tile configuration: tiles already configured with those rows first, then tiles with no
    /// rows yet (configured now). None, and the configuration unchanged, when eight tiles
    /// cannot hold them.
    fn amx_tiles(&mut self, want: &[u8]) -> Option<Vec<usize>> {
        let mut rows = self.amx_rows;
        let mut picked: Vec<usize> = Vec::with_capacity(want.len());
        for &r in want {
            let free = |t: &usize| !picked.contains(t);
            let t = (0..8)
                .filter(free)
                .find(|&t| rows[t] == r)
                .or_else(|| (0..8).filter(free).find(|&t| rows[t] == 0))?;
            rows[t] = r;
            picked.push(t);
        }
        self.amx_rows = rows;
        Some(picked)
    }

    fn line(&mut self, s: &str) {
        for _ in 0..self.depth {
            self.out.push_str("    ");
        }
        self.out.push_str(s);
        self.out.push('\n');
    }

    // ---- expressions -------------------------------------------------------------------

    /// The smallest and largest value `e` takes over every loop variable's range.
    fn range(&self, e: &Expr) -> (i64, i64) {
        match e {
            Expr::Const(c) => (*c, *c),
            Expr::Var(v) => (0, self.p.vars.get(*v).map_or(0, |l| l.extent as i64 - 1)),
            Expr::Add(a, b) => {
                let (a, b) = (self.range(a), self.range(b));
                (a.0 + b.0, a.1 + b.1)
            }
            Expr::Mul(a, c) => {
                let (lo, hi) = self.range(a);
                let (x, y) = (lo * c, hi * c);
                (x.min(y), x.max(y))
            }
            Expr::Div(a, c) => {
                let (lo, hi) = self.range(a);
                let (x, y) = (lo.div_euclid(*c), hi.div_euclid(*c));
                (x.min(y), x.max(y))
            }
            Expr::Mod(a, c) => {
                let (lo, hi) = self.range(a);
                if lo.div_euclid(*c) == hi.div_euclid(*c) {
                    (lo.rem_euclid(*c), hi.rem_euclid(*c))
                } else {
                    (0, c.abs() - 1)
                }
            }
        }
    }

    fn c_expr(&self, e: &Expr) -> String {
        let atom = |e: &Expr| matches!(e, Expr::Const(_) | Expr::Var(_));
        let wrap = |e: &Expr| {
            if atom(e) {
                self.c_expr(e)
            } else {
                format!("({})", self.c_expr(e))
            }
        };
        match e {
            Expr::Const(c) => c.to_string(),
            Expr::Var(v) => self
                .vars
                .get(*v)
                .cloned()
                .unwrap_or_else(|| format!("v{v}")),
            Expr::Add(a, b) => match **b {
                Expr::Const(c) if c < 0 => format!("{} - {}", self.c_expr(a), -c),
                _ => format!("{} + {}", self.c_expr(a), self.c_expr(b)),
            },
            Expr::Mul(a, c) => format!("{} * {c}", wrap(a)),
            Expr::Div(a, c) if self.range(a).0 >= 0 && *c > 0 => format!("{} / {c}", wrap(a)),
            Expr::Div(a, c) => format!("tsl_floordiv({}, {c})", self.c_expr(a)),
            Expr::Mod(a, c) if self.range(a).0 >= 0 && *c > 0 => format!("{} % {c}", wrap(a)),
            Expr::Mod(a, c) => format!("tsl_floormod({}, {c})", self.c_expr(a)),
        }
    }

    /// The row-major element offset of a reference, as an expression.
    fn flat(&self, r: &BufferRef) -> Expr {
        let shape = &self.p.buffers[r.buffer].shape;
        let mut stride = 1i64;
        let mut terms = Vec::new();
        for d in (0..shape.len()).rev() {
            terms.push(Expr::scaled(r.index[d].clone(), stride));
            stride *= shape[d] as i64;
        }
        terms.into_iter().rev().fold(Expr::Const(0), Expr::sum)
    }

    /// The checks an index of `r` needs to stay inside its buffer: those the index ranges
    /// alone do not prove.
    fn index_checks<'r>(&self, r: &'r BufferRef) -> Vec<Check<'r>> {
        let shape = &self.p.buffers[r.buffer].shape;
        let mut c = Vec::new();
        for (e, &n) in r.index.iter().zip(shape) {
            let (lo, hi) = self.range(e);
            if lo < 0 {
                c.push(Check {
                    expr: e,
                    below: None,
                });
            }
            if hi >= n as i64 {
                c.push(Check {
                    expr: e,
                    below: Some(n as i64),
                });
            }
        }
        c
    }

    fn check_c(&self, c: &Check) -> String {
        match c.below {
            None => format!("{} >= 0", self.c_expr(c.expr)),
            Some(n) => format!("{} < {n}", self.c_expr(c.expr)),
        }
    }

    /// Conditions under which every index of `r` is inside its buffer (empty when provably so,
    /// by the index ranges or by an enclosing versioned body's condition).
    fn bounds(&self, r: &BufferRef) -> Vec<String> {
        self.index_checks(r)
            .iter()
            .map(|c| self.check_c(c))
            .filter(|c| !self.proven.contains(c))
            .collect()
    }

    /// The conditions of `guards` that no enclosing versioned body proves (a split's guard
    /// can be the same condition as a bounds check the test proves).
    fn guard_conds(&self, guards: &[tessel_ir::Guard]) -> Vec<String> {
        guards
            .iter()
            .map(|g| self.guard_c(g))
            .filter(|c| !self.proven.contains(c))
            .collect()
    }

    fn in_bounds(&self, r: &BufferRef) -> bool {
        let shape = &self.p.buffers[r.buffer].shape;
        r.index.iter().zip(shape).all(|(e, &n)| {
            let (lo, hi) = self.range(e);
            lo >= 0 && hi < n as i64
        })
    }

    fn guard_c(&self, g: &tessel_ir::Guard) -> String {
        format!("{} < {}", self.c_expr(&g.expr), g.bound)
    }

    fn element(&self, r: &BufferRef) -> String {
        format!("{}[{}]", self.bufs[r.buffer], self.c_expr(&self.flat(r)))
    }

    /// A read with the padding semantics: zero outside the buffer.
    fn read(&self, r: &BufferRef, conds: &[String]) -> String {
        let mut all: Vec<String> = conds.to_vec();
        all.extend(self.bounds(r));
        dedup(&mut all);
        if all.is_empty() {
            self.element(r)
        } else {
            format!("({} ? {} : 0)", all.join(" && "), self.element(r))
        }
    }

    fn read_as(&self, r: &BufferRef, compute: DType) -> String {
        let t = self.p.buffers[r.buffer].dtype;
        let b = self.bounds(r);
        let x = to_compute(&self.element(r), t, compute);
        if b.is_empty() {
            x
        } else {
            format!("({} ? {x} : 0)", b.join(" && "))
        }
    }

    fn guarded(&mut self, mut conds: Vec<String>, stmt: &str) {
        dedup(&mut conds);
        if conds.is_empty() {
            self.line(stmt);
        } else {
            self.line(&format!("if ({}) {stmt}", conds.join(" && ")));
        }
    }

    // ---- statements --------------------------------------------------------------------

    fn kernel(&mut self, name: &str) -> Result<(), CodegenError> {
        let p = self.p;
        self.line(&format!("/* {} */", p.op));
        self.line(&format!("void {name}(void *const *args) {{"));
        self.depth += 1;
        let n_inputs = p.op.inputs.len();
        let n_biases = p.op.read_operands().len() - n_inputs;
        for (i, b) in p.buffers.iter().enumerate() {
            let (slot, konst) = match b.role {
                BufferRole::Input(k) => (k, "const "),
                BufferRole::Bias(k) => (n_inputs + k, "const "),
                BufferRole::Output => (n_inputs + n_biases, ""),
                _ => continue,
            };
            // A pre-packed input arrives as its packed copy, under the packed buffer's name.
            let (i, b) = match (&self.prepacked, &b.role) {
                (Some(plan), BufferRole::Input(k)) if *k == plan.operand => {
                    (plan.buffer, &p.buffers[plan.buffer])
                }
                _ => (i, b),
            };
            let t = c_type(b.dtype);
            let s = format!(
                "{konst}{t} *restrict {} = ({konst}{t} *)args[{slot}];  /* {:?} {} */",
                self.bufs[i], b.shape, b.dtype
            );
            self.line(&s);
        }
        if self.uses_amx {
            self.line("TSL_AMX_INIT();");
        }
        let body = &p.body;
        self.stmt(body)?;
        if self.uses_amx {
            self.line("_tile_release();");
        }
        self.depth -= 1;
        self.line("}");
        self.amx_config(name);
        if self.slow_to_vectorize {
            let header = format!("void {name}(void *const *args) {{");
            self.out = self.out.replacen(
                &header,
                &format!(
                    "/* an innermost loop strides a power of two of {SLOW_VECTORIZER_STRIDE}+ elements: gcc's default vectorizer cost model would take minutes */\n{VERY_CHEAP_VECTORIZER} {header}"
                ),
                1,
            );
        }
        Ok(())
    }

    /// Partial AMX tiles: the kernel's own tile configuration, loaded where the prelude's
    /// would be (in static storage, as the prelude's: the gcc 12 trap). Nothing on whole tiles.
    fn amx_config(&mut self, name: &str) {
        if self.amx_rows.iter().all(|&r| r == 0) {
            return;
        }
        let rows: Vec<String> = self
            .amx_rows
            .iter()
            .map(|&r| if r == 0 { 16 } else { r }.to_string())
            .collect();
        let cfg = format!("{name}_tilecfg");
        self.out = self
            .out
            .replace("TSL_AMX_INIT();", &format!("_tile_loadconfig(&{cfg});"));
        self.out.insert_str(
            0,
            &format!(
                "/* the rows of this kernel's tiles: partial tiles along m */\nstatic const tsl_tilecfg {cfg} __attribute__((aligned(64), used)) = {{\n    1, 0, {{0}}, {{64, 64, 64, 64, 64, 64, 64, 64}}, {{{}}}}};\n",
                rows.join(", ")
            ),
        );
    }

    fn stmt(&mut self, s: &Stmt) -> Result<(), CodegenError> {
        if let Some(plan) = &self.prepacked
            && std::ptr::eq(s, plan.pack)
        {
            let name = self.bufs[plan.buffer].clone();
            self.line(&format!(
                "/* {name} arrives packed (the pack function fills it) */"
            ));
            return Ok(());
        }
        match s {
            Stmt::Seq(v) => {
                let mut i = 0;
                while i < v.len() {
                    // An accumulator's fill, what computes it and its store: on AMX, maybe
                    // all in the register block's tiles.
                    let zeroed = fill_nest(&v[i])
                        .filter(|&(b, n)| self.uses_amx && n == self.p.buffers[b].elements());
                    if let (Some((zeroed, _)), Some(next)) = (zeroed, v.get(i + 1)) {
                        let store = v.get(i + 2).and_then(|s| Some((s, store_nest(s)?)));
                        self.acc_fusion(zeroed, &v[i], next, store)?;
                        i += 2 + usize::from(store.is_some());
                        continue;
                    }
                    self.stmt(&v[i])?;
                    i += 1;
                }
            }
            Stmt::For(l) => self.for_loop(l)?,
            Stmt::Allocate { buffer, body }
                if self.prepacked.as_ref().is_some_and(|p| p.buffer == *buffer) =>
            {
                self.stmt(body)?;
            }
            Stmt::Allocate { buffer, body } => {
                let b = &self.p.buffers[*buffer];
                let t = c_type(b.dtype);
                // A small buffer inside a loop (a tile's accumulator or cache) lives on the
                // stack, where gcc may keep it in registers; static storage would force every
                // store to memory.
                let storage = if b.bytes() <= MAX_STACK_BYTES
                    && (self.in_parallel || !self.bound.is_empty())
                {
                    ""
                } else if !self.in_parallel {
                    "static "
                } else {
                    "static __thread "
                };
                let s = format!(
                    "{storage}{t} {}[{}] __attribute__((aligned(64)));  /* {:?} in {}, {} */",
                    self.bufs[*buffer],
                    b.elements(),
                    b.shape,
                    b.scope,
                    role_name(&b.role)
                );
                self.line(&s);
                self.stmt(body)?;
            }
            Stmt::Fill { dst, step } => {
                let s = format!("{} = 0;{}", self.element(dst), cite(*step));
                self.guarded(self.bounds(dst), &s);
            }
            Stmt::Copy {
                dst,
                src,
                guards,
                step,
            } => {
                let g = self.guard_conds(guards);
                let (dt, st) = (
                    self.p.buffers[dst.buffer].dtype,
                    self.p.buffers[src.buffer].dtype,
                );
                let value = if dt == st {
                    self.read(src, &g)
                } else {
                    let ct = compute_type(dt);
                    let mut all = g.clone();
                    all.extend(self.bounds(src));
                    let v = to_compute(&self.element(src), st, ct);
                    let v = if all.is_empty() {
                        v
                    } else {
                        format!("({} ? {v} : 0)", all.join(" && "))
                    };
                    from_compute(&v, ct, dt)
                };
                let s = format!("{} = {value};{}", self.element(dst), cite(*step));
                self.guarded(self.bounds(dst), &s);
            }
            Stmt::Update {
                acc,
                operands,
                guards,
            } => {
                let at = self.p.buffers[acc.buffer].dtype;
                let ct = compute_type(at);
                let ops: Vec<String> = operands.iter().map(|o| self.read_as(o, ct)).collect();
                let cur = to_compute(&self.element(acc), at, ct);
                let value = if ct == DType::I32 {
                    let prod = ops
                        .iter()
                        .skip(1)
                        .fold(ops.first().cloned().unwrap_or("1".into()), |a, b| {
                            format!("tsl_mul_i32({a}, {b})")
                        });
                    format!("tsl_add_i32({cur}, {prod})")
                } else {
                    format!("{cur} + {}", ops.join(" * "))
                };
                let mut conds = self.guard_conds(guards);
                conds.extend(self.bounds(acc));
                let s = format!("{} = {};", self.element(acc), from_compute(&value, ct, at));
                self.guarded(conds, &s);
            }
            Stmt::Store {
                dst,
                acc,
                point,
                biases,
                guards,
                step,
                accumulate: false,
            } => self.store(dst, acc, point, biases, guards, *step)?,
            Stmt::Store { .. } => {
                return Err(CodegenError::Unsupported {
                    reason: "split-K stores (blocks adding into the output) are GPU-only".into(),
                });
            }
            Stmt::Tensorized(c) => self.tensorized(c)?,
            Stmt::Barrier => self.line("/* barrier: threads share nothing here on the CPU */"),
        }
        Ok(())
    }

    fn store(
        &mut self,
        dst: &BufferRef,
        acc: &BufferRef,
        point: &[Expr],
        biases: &[usize],
        guards: &[tessel_ir::Guard],
        step: Option<usize>,
    ) -> Result<(), CodegenError> {
        let at = self.p.buffers[acc.buffer].dtype;
        let ct = compute_type(at);
        let dt = self.p.buffers[dst.buffer].dtype;
        let mut conds = self.guard_conds(guards);
        conds.extend(self.bounds(dst));
        dedup(&mut conds);
        let head = if conds.is_empty() {
            "{".to_string()
        } else {
            format!("if ({}) {{", conds.join(" && "))
        };
        self.line(&format!("{head}{}", cite(step)));
        self.depth += 1;
        self.line(&format!("{} v = {};", c_type(ct), self.read_as(acc, ct)));
        let mut next_bias = 0;
        for e in &self.p.op.epilogue {
            match e {
                Epilogue::Bias(b) => {
                    let buffer = *biases
                        .get(next_bias)
                        .ok_or_else(|| CodegenError::Malformed {
                            reason: "a bias of the epilogue has no buffer".into(),
                        })?;
                    next_bias += 1;
                    let index = b.indices.iter().map(|a| a.at(point)).collect();
                    let r = BufferRef { buffer, index };
                    let bv = self.read_as(&r, ct);
                    let s = if ct == DType::I32 {
                        format!("v = tsl_add_i32(v, {bv});  /* bias */")
                    } else {
                        format!(
                            "v = {};  /* bias */",
                            from_compute(&format!("v + {bv}"), ct, at)
                        )
                    };
                    self.line(&s);
                }
                Epilogue::Relu => self.line("v = v > 0 ? v : 0;  /* relu */"),
                Epilogue::Cast(t) => {
                    let s = format!(
                        "v = {};  /* cast to {t} */",
                        to_compute(&from_compute("v", ct, *t), *t, ct)
                    );
                    self.line(&s);
                }
            }
        }
        let s = format!("{} = {};", self.element(dst), from_compute("v", ct, dt));
        self.line(&s);
        self.depth -= 1;
        self.line("}");
        Ok(())
    }

    fn loop_header(&self, l: &For) -> String {
        let v = &self.vars[l.var];
        let mut s = format!("for (long {v} = 0; {v} < {}; ++{v}) {{", l.extent);
        let mut notes = Vec::new();
        if l.reduction {
            notes.push("reduction".to_string());
        }
        if let Some(p) = l.pipeline_stages {
            notes.push(format!("pipeline {p} stages (no effect on the CPU)"));
        }
        for (k, val) in &l.annotations {
            notes.push(format!("{k}={val}"));
        }
        if !notes.is_empty() {
            let _ = write!(s, "  /* {} */", notes.join("; "));
        }
        s
    }

    fn for_loop(&mut self, l: &For) -> Result<(), CodegenError> {
        if l.reduction && self.register_block(l)? {
            return Ok(());
        }
        let strides = self.strides(l);
        let mut forced_simd = false;
        match l.kind {
            LoopKind::Bound(axis) => {
                return Err(CodegenError::Unsupported {
                    reason: format!(
                        "loop `{}` is bound to the GPU axis {axis}: not a CPU schedule",
                        self.p.vars[l.var].name
                    ),
                });
            }
            LoopKind::Parallel if !self.in_parallel => return self.parallel(l),
            LoopKind::Parallel => {
                self.line("/* parallel inside a parallel loop: runs serially in each thread */")
            }
            LoopKind::Vectorized => {
                let mut has_call = false;
                l.body
                    .walk(&mut |s| has_call |= matches!(s, Stmt::Tensorized(_)));
                if !has_call {
                    match strides.iter().copied().max_by_key(|s| s.unsigned_abs()) {
                        Some(stride) if stride.unsigned_abs() >= GATHER_STRIDE => {
                            // Every lane would load its own cache line, and gcc 12's emulated
                            // gathers at power-of-two strides of 1024 elements or more take
                            // minutes to compile: leave the loop to the cost model.
                            self.line(&format!(
                                "/* not forced to SIMD: an access strides {stride} elements */"
                            ));
                        }
                        _ => {
                            self.line("#pragma omp simd");
                            forced_simd = true;
                        }
                    }
                }
            }
            LoopKind::Unrolled => self.line(&format!("#pragma GCC unroll {}", l.extent.min(64))),
            LoopKind::Serial
                if self.p.op.epilogue.contains(&Epilogue::Relu)
                    && contiguous_store(l, &strides) =>
            {
                // A tile's epilogue along the instruction's lanes: gcc, left alone, unrolls
                // such a short loop inside unrolled ones and then fails to vectorize the
                // relu's select, leaving one scalar blend per element (a 1x1 convolution ran
                // 1.7x slower). Not forced without a relu: on a plain copy out of the tile the
                // pragma made gcc spill the accumulators inside the reduction (3.3x slower).
                self.line("#pragma omp simd");
                forced_simd = true;
            }
            LoopKind::Serial => {}
        }
        let mut has_loop = false;
        l.body.walk(&mut |s| has_loop |= matches!(s, Stmt::For(_)));
        if !has_loop && !forced_simd {
            self.slow_to_vectorize |= strides.iter().any(|s| {
                let s = s.unsigned_abs();
                s >= SLOW_VECTORIZER_STRIDE && s.is_power_of_two()
            });
        }
        let h = self.loop_header(l);
        self.line(&h);
        self.depth += 1;
        self.loop_body(l)?;
        self.depth -= 1;
        self.line("}");
        Ok(())
    }

    /// The linearised strides (non-zero) of the buffer accesses in `l`'s body when `l`'s
    /// variable grows by one.
    fn strides(&self, l: &For) -> Vec<i64> {
        let nvars = self.p.vars.len();
        let mut strides = Vec::new();
        let mut see = |r: &BufferRef| {
            let shape = &self.p.buffers[r.buffer].shape;
            let stride = linear_stride(&r.index, shape, l.var, nvars);
            if stride != 0 {
                strides.push(stride);
            }
        };
        l.body.walk(&mut |s| match s {
            Stmt::Copy { dst, src, .. } => {
                see(dst);
                see(src);
            }
            Stmt::Update { acc, operands, .. } => {
                see(acc);
                operands.iter().for_each(&mut see);
            }
            Stmt::Store { dst, acc, .. } => {
                see(dst);
                see(acc);
            }
            Stmt::Fill { dst, .. } => see(dst),
            _ => {}
        });
        strides
    }

    /// The outermost parallel loop: one OpenMP region; directly nested parallel loops collapse
    /// into it.
    fn parallel(&mut self, l: &For) -> Result<(), CodegenError> {
        let mut chain = vec![l];
        while let Stmt::For(inner) = &*chain[chain.len() - 1].body {
            if inner.kind != LoopKind::Parallel {
                break;
            }
            chain.push(inner);
        }
        self.line("#pragma omp parallel");
        self.line("{");
        self.depth += 1;
        if self.uses_amx {
            self.line("TSL_AMX_INIT();");
        }
        if chain.len() > 1 {
            self.line(&format!(
                "#pragma omp for schedule(static) collapse({})",
                chain.len()
            ));
        } else {
            self.line("#pragma omp for schedule(static)");
        }
        self.in_parallel = true;
        for c in &chain {
            let h = self.loop_header(c);
            self.line(&h);
            self.depth += 1;
        }
        let outer = chain.len() - 1;
        self.bound.extend(chain[..outer].iter().map(|c| c.var));
        let body = self.loop_body(chain[outer]);
        self.bound.truncate(self.bound.len() - outer);
        body?;
        for _ in &chain {
            self.depth -= 1;
            self.line("}");
        }
        self.in_parallel = false;
        if self.uses_amx {
            self.line("_tile_release();");
        }
        self.depth -= 1;
        self.line("}");
        Ok(())
    }

    // ---- tensorized calls --------------------------------------------------------------
}

/// `(buffer, instances)` of a nest of loops around one zero fill.
fn fill_nest(s: &Stmt) -> Option<(usize, u64)> {
    let mut n = 1u64;
    let mut s = s;
    loop {
        match s {
            Stmt::For(f) => {
                n = n.checked_mul(f.extent)?;
                s = &f.body;
            }
            Stmt::Fill { dst, .. } => return Some((dst.buffer, n)),
            _ => return None,
        }
    }
}

/// The one unguarded store to the output a nest of loops holds.
#[derive(Clone, Copy)]
struct StoreNest<'s> {
    dst: &'s BufferRef,
    acc: &'s BufferRef,
    point: &'s [Expr],
    biases: &'s [usize],
}

fn store_nest(s: &Stmt) -> Option<StoreNest<'_>> {
    let mut s = s;
    loop {
        match s {
            Stmt::For(f) => s = &f.body,
            Stmt::Store {
                dst,
                acc,
                point,
                biases,
                guards,
                accumulate: false,
                ..
            } if guards.is_empty() => {
                return Some(StoreNest {
                    dst,
                    acc,
                    point,
                    biases,
                });
            }
            _ => return None,
        }
    }
}

/// One bounds check of an index.
struct Check<'e> {
    expr: &'e Expr,
    /// `expr >= 0` when `None`, `expr < bound` otherwise.
    below: Option<i64>,
}

/// An innermost loop of 4 or more iterations around one store whose accesses all move by one
/// element (or stay) per iteration.
fn contiguous_store(l: &For, strides: &[i64]) -> bool {
    l.extent >= 4 && matches!(*l.body, Stmt::Store { .. }) && strides.iter().all(|&s| s == 1)
}

/// Drops repeated conditions, keeping the first of each.
fn dedup(conds: &mut Vec<String>) {
    let mut seen = HashSet::new();
    conds.retain(|c| seen.insert(c.clone()));
}

fn advance(point: &mut [i64], extents: &[u64]) -> bool {
    for d in (0..point.len()).rev() {
        point[d] += 1;
        if (point[d] as u64) < extents[d] {
            return true;
        }
        point[d] = 0;
    }
    false
}

fn role_name(r: &BufferRole) -> String {
    match r {
        BufferRole::Input(i) => format!("input {i}"),
        BufferRole::Bias(i) => format!("bias {i}"),
        BufferRole::Output => "output".into(),
        BufferRole::Packed { operand } => format!("input {operand} repacked"),
        BufferRole::Cache { operand, level } => format!("cache of input {operand}, level {level}"),
        BufferRole::Accumulator => "accumulator".into(),
    }
}

fn cite(step: Option<usize>) -> String {
    step.map_or(String::new(), |s| format!("  /* step {s} */"))
}
