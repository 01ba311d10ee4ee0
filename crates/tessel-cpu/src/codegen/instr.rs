//! The instructions the generator calls: their families, operand roles and layouts, and the C
//! each family's vector types, loads, broadcasts and products are written with.

use super::*;

/// The instruction families the generator knows how to call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Family {
    /// An AMX tile product: the intrinsic's name, and how many K elements share a 32-bit slot.
    Amx {
        dp: &'static str,
    },
    Avx512Fma,
    Avx512Vnni,
    Avx512Bf16,
    Avx2Fma,
    /// `vpmaddwd` + `vpaddd` on ymm: i16 pairs into i32.
    Avx2Madd,
    /// AVX-VNNI's ymm `vpdpbusd`: u8 x i8 quads into i32.
    AvxVnni,
    /// `vpmaddubsw` + `vpmaddwd` by ones + `vpaddd`: u8 x i8 quads, saturating at 16 bits.
    Avx2Maddubs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Role {
    A,
    B,
    C,
}

pub(super) struct Instr<'c> {
    pub(super) intr: &'c Intrinsic,
    pub(super) family: Family,
    /// K elements per 32-bit slot of B (AMX and VNNI-style layouts); 1 for plain FMA.
    pub(super) group: i64,
    /// Rows of the tile the call computes: the instruction's m, or fewer for a partial AMX
    /// tile (its A and C tiles configured with this many rows).
    pub(super) rows: i64,
}

impl Instr<'_> {
    pub(super) fn m(&self) -> i64 {
        self.rows
    }

    /// Rows of a B tile (AMX): k in slots of `group` elements.
    pub(super) fn b_rows(&self) -> u8 {
        (self.k() / self.group) as u8
    }

    /// An AMX call on tiles of fewer than the instruction's 16 rows: its A and C tiles need
    /// a tile configuration of their own ([`Gen::amx_tiles`]).
    pub(super) fn partial_rows(&self) -> bool {
        matches!(self.family, Family::Amx { .. }) && self.rows < self.intr.m as i64
    }
    pub(super) fn n(&self) -> i64 {
        self.intr.n as i64
    }
    pub(super) fn k(&self) -> i64 {
        self.intr.k as i64
    }

    /// The instruction dims (0 = m, 1 = n, 2 = k) an operand spans, as (rows, columns).
    pub(super) fn dims(role: Role) -> (usize, usize) {
        match role {
            Role::A => (0, 2),
            Role::B => (2, 1),
            Role::C => (0, 1),
        }
    }

    pub(super) fn extent(&self, dim: usize) -> i64 {
        [self.m(), self.n(), self.k()][dim]
    }

    /// Offset (elements) of element `(i, j)` of an operand in the instruction's layout with
    /// row stride `s` (AMX only; vector operands are a single register).
    pub(super) fn offset(&self, role: Role, i: i64, j: i64, s: i64) -> i64 {
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
    pub(super) fn offset_c(&self, role: Role, i: &str, j: &str) -> String {
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
    pub(super) fn natural_stride(&self, role: Role) -> i64 {
        match role {
            Role::A => self.k(),
            Role::B => self.n() * self.group,
            Role::C => self.n(),
        }
    }

    /// The probe point whose offset gives the row stride, for AMX operands.
    pub(super) fn stride_probe(&self, role: Role) -> Option<(i64, i64)> {
        match self.family {
            Family::Amx { .. } => Some(if role == Role::B {
                (self.group, 0)
            } else {
                (1, 0)
            }),
            _ => None,
        }
    }

    pub(super) fn dtype(&self, role: Role) -> DType {
        match role {
            Role::A => self.intr.a,
            Role::B => self.intr.b,
            Role::C => self.intr.acc,
        }
    }
}

pub(super) fn instr_of<'c>(catalog: &'c Catalog, id: &str) -> Result<Instr<'c>, CodegenError> {
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
        "avx2.vpmaddwd" => (Family::Avx2Madd, 2),
        "avx2.vpmaddubsw" => (Family::Avx2Maddubs, 4),
        "avxvnni.vpdpbusd" => (Family::AvxVnni, 4),
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
        rows: intr.m as i64,
    })
}

/// The instruction of call `c`, with the rows its tile really has (its semantics' m, which
/// the tensorize step shrinks to the bound loop's extent on a partial tile).
pub(super) fn instr_for<'c>(
    catalog: &'c Catalog,
    c: &TensorizedCall,
) -> Result<Instr<'c>, CodegenError> {
    let mut ins = instr_of(catalog, &c.intrinsic)?;
    if let Some(m) = c.semantics.iter_vars.iter().find(|v| v.name == "m") {
        let rows = m.extent as i64;
        if rows < 1 || rows > ins.rows {
            return Err(CodegenError::Malformed {
                reason: format!(
                    "the call of `{}` (step {}) has {rows} rows; the instruction takes 1 to {}",
                    c.intrinsic, c.step, ins.rows
                ),
            });
        }
        if rows < ins.rows && !matches!(ins.family, Family::Amx { .. }) {
            return Err(CodegenError::Unsupported {
                reason: format!(
                    "`{}` runs on whole tiles only; step {} binds m to {rows} rows",
                    c.intrinsic, c.step
                ),
            });
        }
        ins.rows = rows;
    }
    Ok(ins)
}

/// (accumulator type, its load, its store) of a vector family.
pub(super) fn vector_types(f: Family) -> (&'static str, &'static str, &'static str) {
    match f {
        Family::Avx512Vnni => ("__m512i", "_mm512_loadu_si512", "_mm512_storeu_si512"),
        Family::Avx2Fma => ("__m256", "_mm256_loadu_ps", "_mm256_storeu_ps"),
        Family::Avx2Madd | Family::AvxVnni | Family::Avx2Maddubs => {
            ("__m256i", "tsl_loadu_256i", "tsl_storeu_256i")
        }
        _ => ("__m512", "_mm512_loadu_ps", "_mm512_storeu_ps"),
    }
}

pub(super) fn operand_types(f: Family) -> (&'static str, &'static str) {
    match f {
        Family::Avx512Vnni => ("__m512i", "__m512i"),
        Family::Avx512Bf16 => ("__m512bh", "__m512bh"),
        Family::Avx2Fma => ("__m256", "__m256"),
        Family::Avx2Madd | Family::AvxVnni | Family::Avx2Maddubs => ("__m256i", "__m256i"),
        _ => ("__m512", "__m512"),
    }
}

/// Broadcasts the A element(s) at pointer `p` to every lane.
pub(super) fn bcast(f: Family, p: &str) -> String {
    match f {
        Family::Avx512Vnni => format!("_mm512_set1_epi32(tsl_load_i32({p}))"),
        Family::Avx512Bf16 => format!("tsl_bcast_bf16x2({p})"),
        Family::Avx2Fma => format!("_mm256_set1_ps(*({p}))"),
        Family::Avx2Madd | Family::AvxVnni | Family::Avx2Maddubs => {
            format!("_mm256_set1_epi32(tsl_load_i32({p}))")
        }
        _ => format!("_mm512_set1_ps(*({p}))"),
    }
}

pub(super) fn vload(f: Family, p: &str) -> String {
    match f {
        Family::Avx512Vnni => format!("_mm512_loadu_si512({p})"),
        Family::Avx512Bf16 => format!("tsl_load_bf16x32({p})"),
        Family::Avx2Fma => format!("_mm256_loadu_ps({p})"),
        Family::Avx2Madd | Family::AvxVnni | Family::Avx2Maddubs => format!("tsl_loadu_256i({p})"),
        _ => format!("_mm512_loadu_ps({p})"),
    }
}

pub(super) fn vector_op(f: Family, c: &str, a: &str, b: &str) -> String {
    match f {
        Family::Avx512Vnni => format!("_mm512_dpbusd_epi32({c}, {a}, {b})"),
        Family::Avx512Bf16 => format!("_mm512_dpbf16_ps({c}, {a}, {b})"),
        Family::Avx2Fma => format!("_mm256_fmadd_ps({a}, {b}, {c})"),
        Family::Avx2Madd => format!("tsl_madd_add({c}, {a}, {b})"),
        Family::AvxVnni => format!("_mm256_dpbusd_avx_epi32({c}, {a}, {b})"),
        Family::Avx2Maddubs => format!("tsl_maddubs_add({c}, {a}, {b})"),
        _ => format!("_mm512_fmadd_ps({a}, {b}, {c})"),
    }
}
