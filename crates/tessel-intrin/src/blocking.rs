//! Register blocking: how many instruction tiles a register block holds along m and n.

use crate::Intrinsic;

/// How many accumulators a register block may hold: AMX keeps 2 of its 8 tiles for A and B;
/// vector units keep registers for B and a broadcast.
pub fn max_accumulators(intr: &Intrinsic) -> u64 {
    if intr.id.starts_with("amx") {
        6
    } else if intr.registers >= 32 {
        24
    } else {
        12
    }
}

/// How many accumulators a register block of `intr` holds in the generated code without
/// spilling (gcc 12): [`max_accumulators`] on vector instructions, but 16 for 8-bit operands
/// on 32 registers (AVX-512 `vpdpbusd`), whose 6x4 block gcc spills (225 against 390 GOP/s
/// for 4x4 on a 1024^3 u8 x i8 gemm, Zen 4). Tile instructions (`m > 1`, AMX): 4 of 8 tiles,
/// 2x2, so that each block's A and B tiles stay loaded.
pub fn accumulator_budget(intr: &Intrinsic) -> u64 {
    if intr.m > 1 {
        4
    } else if intr.registers >= 32 && intr.a.bytes() == 1 {
        16
    } else {
        max_accumulators(intr)
    }
}

/// The register block with the most accumulators (at most `budget`, `nr` at most `max_nr`)
/// whose `mr` divides `mt` and `nr` divides `nt`: no padding, which AMX tile calls cannot
/// take. Ties go to the wider n (found first), which loads fewer vectors per product.
pub fn largest_dividing_block(mt: u64, nt: u64, budget: u64, max_nr: u64) -> (u64, u64) {
    let mut best = (1u64, 1u64);
    for nr in (1..=max_nr).rev() {
        for mr in (1..=budget / nr).rev() {
            if mt.is_multiple_of(mr) && nt.is_multiple_of(nr) && mr * nr > best.0 * best.1 {
                best = (mr, nr);
            }
        }
    }
    best
}

/// The register block (`mr` tiles along m, `nr` along n) that keeps the most of `budget`
/// accumulators busy with real rows, over `mt` tiles along m and `nt` along n: `nr` divides
/// `nt` (at most `max_nr`), `mr` is at most 8 and need not divide `mt` (the last block's
/// padding rows cost their share). Ties go to the wider block, which loads fewer broadcasts
/// per product.
///
/// ```
/// use tessel_intrin::busiest_register_block;
/// // 16 ymm registers, 12 accumulators: 6 rows x 2 vectors over 1024 rows (2 padding rows).
/// assert_eq!(busiest_register_block(1024, 128, 12, 2), (6, 2));
/// // 3136 pixels, up to 4 vectors: 3 x 4 ties with 6 x 2 and is wider.
/// assert_eq!(busiest_register_block(3136, 8, 12, 4), (3, 4));
/// ```
pub fn busiest_register_block(mt: u64, nt: u64, budget: u64, max_nr: u64) -> (u64, u64) {
    // Busy accumulators per block, as a fraction (numerator, denominator).
    let busy = |mr: u64, nr: u64| (mr * nr * mt, mt.div_ceil(mr) * mr);
    let compare = |(a, b): (u64, u64), (c, d): (u64, u64)| {
        (u128::from(a) * u128::from(d)).cmp(&(u128::from(c) * u128::from(b)))
    };
    let mut best = (1, 1);
    for nr in (1..=max_nr.min(nt)).filter(|d| nt.is_multiple_of(*d)) {
        for mr in 1..=(budget / nr).clamp(1, 8).min(mt.max(1)) {
            if compare(busy(mr, nr), busy(best.0, best.1))
                .then(nr.cmp(&best.1))
                .is_ge()
            {
                best = (mr, nr);
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Catalog;

    #[test]
    fn budgets_follow_the_register_file_and_the_operand_width() {
        let catalog = Catalog::default();
        let budget = |id: &str| accumulator_budget(catalog.get(id).unwrap());
        assert_eq!(budget("avx2.vfmadd231ps"), 12);
        assert_eq!(budget("avx512.vfmadd231ps"), 24);
        assert_eq!(budget("avx512.vdpbf16ps"), 24);
        assert_eq!(budget("avx512.vpdpbusd"), 16);
        assert_eq!(budget("amx.tdpbf16ps"), 4);
    }

    #[test]
    fn padding_rows_count_against_a_block() {
        // 49 pixels: 3 x 4 (51 rows, 2 padding) keeps 11.5 of 12 busy; 6 x 2 (54 rows) 10.9.
        assert_eq!(busiest_register_block(49, 8, 12, 4), (3, 4));
        // 7 rows: 7 x 1 (no padding) beats 6 x 2 (12 rows, 5 padding: 7 of 12 busy).
        assert_eq!(busiest_register_block(7, 1, 12, 2), (7, 1));
        // One row, one column: one accumulator.
        assert_eq!(busiest_register_block(1, 1, 12, 2), (1, 1));
        // 32 zmm registers, 24 accumulators.
        assert_eq!(busiest_register_block(1024, 64, 24, 4), (6, 4));
    }
}
