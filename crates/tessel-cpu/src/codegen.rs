//! Lowered programs to C with x86 intrinsics.
//!
//! Each [`Program`] becomes one C function `void NAME(void *const *args)` whose arguments are
//! the operator's inputs, its epilogue biases, then the output. Loops keep their names from the
//! trace (`m.0` becomes `m_0`); statements carry comments that cite the trace step that made them.
//!
//! Tensorized calls take one of three forms:
//! - a *register block*: a reduction loop whose body is only unrolled loops around one call
//!   keeps every accumulator in registers (AMX tiles or vector registers) across the reduction
//!   loop, loading each A and B fragment once per iteration;
//! - a *direct* call: operands already in the instruction's layout are loaded in place;
//! - a *staged* call: operands in any other layout, or under padding guards, are gathered into
//!   a small buffer in the instruction's layout (zeros where a guard fails), and the
//!   accumulator is scattered back only where the guards hold.

use std::collections::{BTreeSet, HashSet};
use std::fmt::Write as _;

use tessel_intrin::{Catalog, Intrinsic, Requirement};
use tessel_ir::{
    BufferRef, BufferRole, DType, Epilogue, Expr, For, LoopKind, Program, Stmt, TensorizedCall,
};

use crate::error::CodegenError;

/// The shared C prelude: types, conversions, the AMX tile configuration and the scalar
/// emulation of the intrinsics (under `TESSEL_EMULATE`).
pub const PRELUDE: &str = include_str!("prelude.h");

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

/// The instruction families the generator knows how to call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    /// An AMX tile product: the intrinsic's name, and how many K elements share a 32-bit slot.
    Amx {
        dp: &'static str,
    },
    Avx512Fma,
    Avx512Vnni,
    Avx512Bf16,
    Avx2Fma,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    A,
    B,
    C,
}

struct Instr<'c> {
    intr: &'c Intrinsic,
    family: Family,
    /// K elements per 32-bit slot of B (AMX and VNNI-style layouts); 1 for plain FMA.
    group: i64,
}

impl Instr<'_> {
    fn m(&self) -> i64 {
        self.intr.m as i64
    }
    fn n(&self) -> i64 {
        self.intr.n as i64
    }
    fn k(&self) -> i64 {
        self.intr.k as i64
    }

    /// The instruction dims (0 = m, 1 = n, 2 = k) an operand spans, as (rows, columns).
    fn dims(role: Role) -> (usize, usize) {
        match role {
            Role::A => (0, 2),
            Role::B => (2, 1),
            Role::C => (0, 1),
        }
    }

    fn extent(&self, dim: usize) -> i64 {
        [self.m(), self.n(), self.k()][dim]
    }

    /// Offset (elements) of element `(i, j)` of an operand in the instruction's layout with
    /// row stride `s` (AMX only; vector operands are a single register).
    fn offset(&self, role: Role, i: i64, j: i64, s: i64) -> i64 {
        let g = self.group;
        match (self.family, role) {
            (Family::Amx { .. }, Role::A | Role::C) => i * s + j,
            (Family::Amx { .. }, Role::B) => (i / g) * s + j * g + i % g,
            (_, Role::A) => j,
            (_, Role::B) => j * self.k() + i,
            (_, Role::C) => j,
        }
    }

    /// The same offset as C text over the loop variables `i` and `j`, at the natural stride.
    fn offset_c(&self, role: Role, i: &str, j: &str) -> String {
        let g = self.group;
        let s = self.natural_stride(role);
        match (self.family, role) {
            (Family::Amx { .. }, Role::A | Role::C) => format!("{i} * {s} + {j}"),
            (Family::Amx { .. }, Role::B) => format!("({i} / {g}) * {s} + {j} * {g} + {i} % {g}"),
            (_, Role::A) => j.to_string(),
            (_, Role::B) => format!("{j} * {} + {i}", self.k()),
            (_, Role::C) => j.to_string(),
        }
    }

    /// Row stride (elements) of a staged operand: one 64-byte AMX row.
    fn natural_stride(&self, role: Role) -> i64 {
        match role {
            Role::A => self.k(),
            Role::B => self.n() * self.group,
            Role::C => self.n(),
        }
    }

    /// The probe point whose offset gives the row stride, for AMX operands.
    fn stride_probe(&self, role: Role) -> Option<(i64, i64)> {
        match self.family {
            Family::Amx { .. } => Some(if role == Role::B {
                (self.group, 0)
            } else {
                (1, 0)
            }),
            _ => None,
        }
    }

    fn dtype(&self, role: Role) -> DType {
        match role {
            Role::A => self.intr.a,
            Role::B => self.intr.b,
            Role::C => self.intr.acc,
        }
    }
}

fn instr_of<'c>(catalog: &'c Catalog, id: &str) -> Result<Instr<'c>, CodegenError> {
    let intr = catalog.get(id).ok_or_else(|| CodegenError::Unsupported {
        reason: format!("unknown instruction `{id}`"),
    })?;
    let (family, group) = match id {
        "amx.tdpbf16ps" => (
            Family::Amx {
                dp: "_tile_dpbf16ps",
            },
            2,
        ),
        "amx.tdpbusd" => (Family::Amx { dp: "_tile_dpbusd" }, 4),
        "amx.tdpbssd" => (Family::Amx { dp: "_tile_dpbssd" }, 4),
        "avx512.vfmadd231ps" => (Family::Avx512Fma, 1),
        "avx512.vpdpbusd" => (Family::Avx512Vnni, 4),
        "avx512.vdpbf16ps" => (Family::Avx512Bf16, 2),
        "avx2.vfmadd231ps" => (Family::Avx2Fma, 1),
        other => {
            return Err(CodegenError::Unsupported {
                reason: format!("no CPU code generator for instruction `{other}`"),
            });
        }
    };
    Ok(Instr {
        intr,
        family,
        group,
    })
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
        (DType::F32, DType::I32) => format!("(int32_t)lroundf({v})"),
        (_, DType::F32) => format!("(float)({v})"),
        (_, DType::BF16) => format!("tsl_f32_to_bf16((float)({v}))"),
        (_, DType::F16) => format!("(_Float16)({v})"),
        (_, DType::I8) => format!("tsl_sat_i8_i32({v})"),
        (_, DType::U8) => format!("tsl_sat_u8_i32({v})"),
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
                match instr_of(catalog, &c.intrinsic) {
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
        })
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

    /// Conditions under which every index of `r` is inside its buffer (empty when provably so).
    fn bounds(&self, r: &BufferRef) -> Vec<String> {
        let shape = &self.p.buffers[r.buffer].shape;
        let mut c = Vec::new();
        for (e, &n) in r.index.iter().zip(shape) {
            let (lo, hi) = self.range(e);
            if lo < 0 {
                c.push(format!("{} >= 0", self.c_expr(e)));
            }
            if hi >= n as i64 {
                c.push(format!("{} < {n}", self.c_expr(e)));
            }
        }
        c
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
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt) -> Result<(), CodegenError> {
        match s {
            Stmt::Seq(v) => {
                for s in v {
                    self.stmt(s)?;
                }
            }
            Stmt::For(l) => self.for_loop(l)?,
            Stmt::Allocate { buffer, body } => {
                let b = &self.p.buffers[*buffer];
                let t = c_type(b.dtype);
                let storage = if !self.in_parallel {
                    "static "
                } else if b.bytes() > MAX_STACK_BYTES {
                    "static __thread "
                } else {
                    ""
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
                let g: Vec<String> = guards.iter().map(|g| self.guard_c(g)).collect();
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
                let mut conds: Vec<String> = guards.iter().map(|g| self.guard_c(g)).collect();
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
        let mut conds: Vec<String> = guards.iter().map(|g| self.guard_c(g)).collect();
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
                    self.line("#pragma omp simd");
                }
            }
            LoopKind::Unrolled => self.line(&format!("#pragma GCC unroll {}", l.extent.min(64))),
            LoopKind::Serial => {}
        }
        let h = self.loop_header(l);
        self.line(&h);
        self.depth += 1;
        self.stmt(&l.body)?;
        self.depth -= 1;
        self.line("}");
        Ok(())
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
        let body = &chain[chain.len() - 1].body;
        self.stmt(body)?;
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

    /// The loop variable bound to each instruction dimension (m, n, k).
    fn tile_vars(&self, c: &TensorizedCall) -> Result<[usize; 3], CodegenError> {
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

    fn operand(c: &TensorizedCall, role: Role) -> &BufferRef {
        match role {
            Role::A => &c.operands[0],
            Role::B => &c.operands[1],
            Role::C => &c.acc,
        }
    }

    /// Whether `r` already has the instruction's layout for `role` (for every value of the
    /// other loops: checked at the corners and at pseudo-random points), and its row stride.
    fn direct_stride(&self, ins: &Instr, r: &BufferRef, role: Role, lv: [usize; 3]) -> Option<i64> {
        if !self.in_bounds(r) || self.p.buffers[r.buffer].dtype != ins.dtype(role) {
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
        let mut stride = None;
        for mut vals in samples {
            for &v in &lv {
                vals[v] = 0;
            }
            let mut at = |i: i64, j: i64| {
                vals[lv[di]] = i;
                vals[lv[dj]] = j;
                flat.eval(&vals)
            };
            let base = at(0, 0);
            let s = match ins.stride_probe(role) {
                Some((i, j)) => at(i, j) - base,
                None => 0,
            };
            if ins.stride_probe(role).is_some() && s <= 0 {
                return None;
            }
            if *stride.get_or_insert(s) != s {
                return None;
            }
            for i in 0..ei {
                for j in 0..ej {
                    if at(i, j) - base != ins.offset(role, i, j, s) {
                        return None;
                    }
                }
            }
        }
        stride
    }

    /// The C pointer to a direct operand's tile: its reference with the tile variables at 0.
    fn tile_ptr(&self, r: &BufferRef, lv: [usize; 3], extra: &[(usize, i64)]) -> String {
        let mut vals: Vec<(usize, i64)> = lv.iter().map(|&v| (v, 0)).collect();
        vals.extend_from_slice(extra);
        let r0 = subst_ref(r, &vals);
        format!("&{}", self.element(&r0))
    }

    fn tensorized(&mut self, c: &TensorizedCall) -> Result<(), CodegenError> {
        let ins = instr_of(self.catalog, &c.intrinsic)?;
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
                    let name = self.stage(c, &ins, r, role, lv)?;
                    let s = ins.natural_stride(role) * ins.dtype(role).bytes() as i64;
                    if role == Role::C {
                        staged_c = Some(name.clone());
                    }
                    ptrs.push((name, s));
                }
            }
        }
        let [(pa, sa), (pb, sb), (pc, sc)] = [ptrs[0].clone(), ptrs[1].clone(), ptrs[2].clone()];
        match ins.family {
            Family::Amx { dp } => {
                self.line(&format!("_tile_loadd(0, {pc}, {sc});"));
                self.line(&format!("_tile_loadd(1, {pa}, {sa});"));
                self.line(&format!("_tile_loadd(2, {pb}, {sb});"));
                self.line(&format!("{dp}(0, 1, 2);"));
                self.line(&format!("_tile_stored(0, {pc}, {sc});"));
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
    fn role_guards(&self, c: &TensorizedCall, role: Role, lv: [usize; 3]) -> Vec<String> {
        let (di, dj) = Instr::dims(role);
        let other: Vec<usize> = (0..3)
            .filter(|&d| d != di && d != dj)
            .map(|d| lv[d])
            .collect();
        c.guards
            .iter()
            .filter(|g| other.iter().all(|&v| !g.expr.uses(v)))
            .map(|g| self.guard_c(g))
            .collect()
    }

    /// Gathers an operand's tile into a buffer in the instruction's layout; zeros where a guard
    /// fails or the read leaves the buffer.
    fn stage(
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

    fn scatter(&mut self, c: &TensorizedCall, ins: &Instr, name: &str, lv: [usize; 3]) {
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

    /// A reduction loop around unrolled loops around one unguarded call, every operand in the
    /// instruction's layout: accumulators stay in registers across the reduction loop.
    fn register_block(&mut self, l: &For) -> Result<bool, CodegenError> {
        let mut unrolled: Vec<(usize, u64)> = Vec::new();
        let mut s = &*l.body;
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
        if !call.guards.is_empty() || points > MAX_BLOCK_POINTS || l.kind == LoopKind::Parallel {
            return Ok(false);
        }
        let ins = instr_of(self.catalog, &call.intrinsic)?;
        let lv = self.tile_vars(call)?;
        let mut strides = [0i64; 3];
        for (i, role) in [Role::A, Role::B, Role::C].into_iter().enumerate() {
            match self.direct_stride(&ins, Self::operand(call, role), role, lv) {
                Some(s) => strides[i] = s * ins.dtype(role).bytes() as i64,
                None => return Ok(false),
            }
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
        let amx = matches!(ins.family, Family::Amx { .. });
        if (amx && n_acc + 2 > 8) || (!amx && n_acc > 24) {
            return Ok(false);
        }
        let unrolled_names: Vec<&str> = unrolled
            .iter()
            .map(|u| self.p.vars[u.0].name.as_str())
            .collect();
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
            self.p.vars[l.var].name
        ));
        self.depth += 1;
        let [sa, sb, sc] = strides;
        if let Family::Amx { dp } = ins.family {
            for (t, f) in frags[2].iter().enumerate() {
                self.line(&format!("_tile_loadd({t}, {f}, {sc});"));
            }
            let h = self.loop_header(l);
            self.line(&h);
            self.depth += 1;
            // Operand tiles n_acc..8, reused while resident (least recently used evicted).
            let mut resident: Vec<Option<(usize, usize)>> = vec![None; 8 - n_acc];
            let mut last_use = vec![0usize; 8 - n_acc];
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
                                .min_by_key(|&t| (resident[t].is_some(), last_use[t]))
                                .unwrap_or(0);
                            resident[t] = Some(key);
                            let f = &frags[role_i][ids[role_i]];
                            self.line(&format!("_tile_loadd({}, {f}, {stride});", t + n_acc));
                            t
                        }
                    };
                    last_use[t] = tick + 1;
                    tiles[slot] = t;
                }
                self.line(&format!(
                    "{dp}({}, {}, {});",
                    ids[2],
                    tiles[0] + n_acc,
                    tiles[1] + n_acc
                ));
            }
            self.depth -= 1;
            self.line("}");
            for (t, f) in frags[2].iter().enumerate() {
                self.line(&format!("_tile_stored({t}, {f}, {sc});"));
            }
        } else {
            let (t, load_c, store_c) = vector_types(ins.family);
            for (i, f) in frags[2].iter().enumerate() {
                self.line(&format!("{t} tsl_c{i} = {load_c}({f});"));
            }
            let h = self.loop_header(l);
            self.line(&h);
            self.depth += 1;
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
            self.depth -= 1;
            self.line("}");
            for (i, f) in frags[2].iter().enumerate() {
                self.line(&format!("{store_c}({f}, tsl_c{i});"));
            }
        }
        self.depth -= 1;
        self.line("}");
        Ok(true)
    }
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

/// (accumulator type, its load, its store) of a vector family.
fn vector_types(f: Family) -> (&'static str, &'static str, &'static str) {
    match f {
        Family::Avx512Vnni => ("__m512i", "_mm512_loadu_si512", "_mm512_storeu_si512"),
        Family::Avx2Fma => ("__m256", "_mm256_loadu_ps", "_mm256_storeu_ps"),
        _ => ("__m512", "_mm512_loadu_ps", "_mm512_storeu_ps"),
    }
}

fn operand_types(f: Family) -> (&'static str, &'static str) {
    match f {
        Family::Avx512Vnni => ("__m512i", "__m512i"),
        Family::Avx512Bf16 => ("__m512bh", "__m512bh"),
        Family::Avx2Fma => ("__m256", "__m256"),
        _ => ("__m512", "__m512"),
    }
}

/// Broadcasts the A element(s) at pointer `p` to every lane.
fn bcast(f: Family, p: &str) -> String {
    match f {
        Family::Avx512Vnni => format!("_mm512_set1_epi32(tsl_load_i32({p}))"),
        Family::Avx512Bf16 => format!("tsl_bcast_bf16x2({p})"),
        Family::Avx2Fma => format!("_mm256_set1_ps(*({p}))"),
        _ => format!("_mm512_set1_ps(*({p}))"),
    }
}

fn vload(f: Family, p: &str) -> String {
    match f {
        Family::Avx512Vnni => format!("_mm512_loadu_si512({p})"),
        Family::Avx512Bf16 => format!("tsl_load_bf16x32({p})"),
        Family::Avx2Fma => format!("_mm256_loadu_ps({p})"),
        _ => format!("_mm512_loadu_ps({p})"),
    }
}

fn vector_op(f: Family, c: &str, a: &str, b: &str) -> String {
    match f {
        Family::Avx512Vnni => format!("_mm512_dpbusd_epi32({c}, {a}, {b})"),
        Family::Avx512Bf16 => format!("_mm512_dpbf16_ps({c}, {a}, {b})"),
        Family::Avx2Fma => format!("_mm256_fmadd_ps({a}, {b}, {c})"),
        _ => format!("_mm512_fmadd_ps({a}, {b}, {c})"),
    }
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
