//! Hand-written reference schedules: one GEMM trace per CPU instruction, written with the IR's
//! primitives (not as C), that the code generator turns into a fast kernel.
//!
//! The shape is the classic one (GotoBLAS, oneDNN's brgemm): B packed once into the
//! instruction's layout, columns split into panels that the threads share out, the reduction
//! blocked, and a register block of `mr x nr` instruction tiles whose accumulators stay in
//! registers across the innermost reduction loop. Vector instructions read A in place and
//! walk the k blocks inside each row block; AMX walks the row blocks inside each k block, so
//! that a B block stays in cache while every row block of A streams past it.

use tessel_intrin::{
    Catalog, Intrinsic, accumulator_budget, busiest_register_block, largest_dividing_block,
};
use tessel_ir::{LayoutTransform, Scope, Trace, Workload};

/// The tile sizes of a reference GEMM schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmPlan {
    /// Instruction tiles per register block, along m and n.
    pub mr: u64,
    pub nr: u64,
    /// Reduction elements per cache block (a multiple of the instruction's k).
    pub kc: u64,
}

impl GemmPlan {
    /// The default plan for an instruction. Vector instructions: the register block that keeps
    /// the most accumulators busy (`busiest_register_block`; its last block along m may be
    /// padding rows, which read zeros from A in place), n dividing where it can. AMX, whose
    /// tile calls take no padding: the largest block whose m and n extents divide `m` and `n`
    /// where possible (a padded tile is staged, tens of times slower).
    pub fn for_instruction(intr: &Intrinsic, m: u64, n: u64, k: u64) -> GemmPlan {
        let id = intr.id;
        // Per register file: the accumulator budget, the widest nr, and the block to use
        // when every block pads.
        let (budget, max_nr, largest): (u64, u64, (u64, u64)) = match id {
            // 2x2 accumulator tiles + 2 A + 2 B = all 8 tiles.
            "amx.tdpbf16ps" | "amx.tdpbusd" | "amx.tdpbssd" => (4, 2, (2, 2)),
            // 32 zmm: up to 24 accumulators, nr B vectors, one broadcast.
            "avx512.vfmadd231ps" | "avx512.vpdpbusd" | "avx512.vdpbf16ps" => (24, 4, (8, 3)),
            // 16 ymm: 6x2 = 12 accumulators (or 4x2), 2 B vectors, one broadcast.
            _ => (12, 2, (6, 2)),
        };
        let (mi, ni) = (intr.m, intr.n);
        let kc = [512u64, 256, 128, 64, 32, 16, 8, 4, 2, 1]
            .into_iter()
            .find(|&c| k.is_multiple_of(c))
            .unwrap_or(1);
        if !id.starts_with("amx") && n.is_multiple_of(ni) {
            let budget = accumulator_budget(intr);
            let (mr, nr) = busiest_register_block(m.div_ceil(mi), n / ni, budget, max_nr);
            return GemmPlan { mr, nr, kc };
        }
        // The most accumulators without padding (4x4 over 8x2); where nothing avoids padding,
        // the largest block.
        let (mr, nr) = if m.is_multiple_of(mi) && n.is_multiple_of(ni) {
            largest_dividing_block(m / mi, n / ni, budget, max_nr)
        } else {
            largest
        };
        GemmPlan { mr, nr, kc }
    }
}

/// The reference trace of `gemm` on instruction `id`, with `plan` (or the instruction's
/// default). Errors name what does not fit: not a GEMM, an unknown instruction, dtypes the
/// instruction does not take.
pub fn reference_gemm(
    workload: &Workload,
    id: &str,
    plan: Option<GemmPlan>,
) -> Result<Trace, String> {
    let Workload::Gemm { m, n, k, types, .. } = workload else {
        return Err(format!(
            "reference schedules are for gemm workloads, not `{workload}`"
        ));
    };
    let catalog = Catalog::default();
    let intr = catalog
        .get(id)
        .ok_or_else(|| format!("unknown instruction `{id}`"))?;
    if !types.dtype.fits_exactly_in(intr.a) || !types.wdtype.fits_exactly_in(intr.b) {
        return Err(format!(
            "`{id}` multiplies {} x {}, the workload is {} x {}",
            intr.a, intr.b, types.dtype, types.wdtype
        ));
    }
    let plan = plan.unwrap_or_else(|| GemmPlan::for_instruction(intr, *m, *n, *k));
    let (mi, ni, ki) = (intr.m, intr.n, intr.k);
    let kc = plan.kc.max(ki) / ki * ki;
    // How many K elements share one 32-bit slot of B (the VNNI group).
    let group = if ki > 1 {
        (4 / intr.b.bytes() as u64).min(ki)
    } else {
        1
    };

    let mut t = Trace::new();
    // Convert-on-pack: operands the instruction takes in a wider type.
    if types.dtype != intr.a {
        t.cast(0, intr.a);
    }
    if types.wdtype != intr.b {
        t.cast(1, intr.b);
    }
    t.split("m", &[plan.mr, mi]);
    t.split("n", &[plan.nr, ni]);
    t.split("k", &[kc / ki, ki]);
    // Vector instructions walk every k block inside a row block, the accumulators of one
    // register block local (faster on Zen 4 by 3-5% at 1024^3); AMX walks every row block
    // inside a k block, B's block staying in cache.
    let amx = id.starts_with("amx");
    let blocks = if amx {
        ["n.0", "k.0", "m.0"]
    } else {
        ["n.0", "m.0", "k.0"]
    };
    let order: Vec<&str> = blocks
        .into_iter()
        .chain(["k.1", "m.1", "n.1", "m.2", "n.2", "k.2"])
        .collect();
    t.reorder(&order);
    // B: [K, N] -> [N / nb, K / group, nb, group] with nb = nr * ni, the register block's
    // columns: for each k, the block's B values are contiguous (one stream, no cache-set
    // conflicts between the block's columns) and in the instruction's (VNNI) layout.
    let nb = plan.nr * ni;
    let layout = if group > 1 {
        LayoutTransform {
            splits: vec![(0, group), (1, nb)],
            order: vec![2, 0, 3, 1],
        }
    } else {
        LayoutTransform {
            splits: vec![(1, nb)],
            order: vec![1, 0, 2],
        }
    };
    t.pack(1, layout);
    t.parallel("n.0");
    let local = Scope::new("local").map_err(|e| e.to_string())?;
    t.cache_write(local, Some(if amx { "n.0" } else { "m.0" }));
    t.unroll("m.1").unroll("n.1");
    t.tensorize(id, &[("m", "m.2"), ("n", "n.2"), ("k", "k.2")], &[0, 1]);
    Ok(t)
}

pub use tessel_intrin::CPU_INSTRUCTIONS;

/// The workload spec of an `m x n x k` GEMM in the dtypes instruction `id` multiplies.
pub fn gemm_spec(id: &str, m: u64, n: u64, k: u64) -> String {
    let types = match id {
        "amx.tdpbf16ps" | "avx512.vdpbf16ps" => "dtype=bf16",
        "amx.tdpbusd" | "avx512.vpdpbusd" | "avxvnni.vpdpbusd" | "avx2.vpmaddwd"
        | "avx2.vpmaddubsw" => "dtype=u8,wdtype=i8",
        "amx.tdpbssd" => "dtype=i8",
        _ => "dtype=f32",
    };
    format!("gemm:m={m},n={n},k={k},{types}")
}
