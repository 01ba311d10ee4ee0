//! The catalog: every instruction tessel knows, as data.

use tessel_ir::{ComputeOp, DType, IntrinsicResolver};

use crate::desc::{
    Intrinsic, LayoutReq, MemLevel, OperandMemory, Platform, Requirement, Storage, Throughput,
};

const CPU_PATH: [MemLevel; 4] = [
    MemLevel::Memory,
    MemLevel::L2,
    MemLevel::L1,
    MemLevel::Registers,
];
const GPU_PATH: [MemLevel; 3] = [MemLevel::Global, MemLevel::Shared, MemLevel::Fragment];

fn mem(storage: Storage, layout: LayoutReq, load: &'static str, align: u32) -> OperandMemory {
    OperandMemory {
        storage,
        layout,
        load,
        store: None,
        align_bytes: align,
    }
}

fn acc_mem(storage: Storage, load: &'static str, store: &'static str, align: u32) -> OperandMemory {
    OperandMemory {
        storage,
        layout: LayoutReq::NContiguous,
        load,
        store: Some(store),
        align_bytes: align,
    }
}

const TILE: Storage = Storage::AmxTile {
    rows: 16,
    row_bytes: 64,
};

#[allow(clippy::too_many_arguments)]
fn amx(
    id: &'static str,
    mnemonic: &'static str,
    family: &'static str,
    k: u64,
    a: DType,
    b: DType,
    group: u32,
    feature: &'static str,
    macs_per_cycle: f64,
) -> Intrinsic {
    Intrinsic {
        id,
        mnemonic,
        family,
        platform: Platform::X86,
        m: 16,
        n: 16,
        k,
        a,
        b,
        acc: if a.is_float() { DType::F32 } else { DType::I32 },
        memory: [
            mem(TILE, LayoutReq::KContiguous, "tileloadd", 0),
            mem(TILE, LayoutReq::Vnni { group }, "tileloadd", 0),
            acc_mem(TILE, "tileloadd", "tilestored", 0),
        ],
        registers: 8,
        path: CPU_PATH.to_vec(),
        throughput: Some(Throughput {
            macs_per_cycle,
            latency_cycles: Some(16),
            source: "Intel optimization manual: one 16x16 tile product per 16 cycles per core",
        }),
        requires: Requirement::CpuFeatures(vec!["amx_tile", feature]),
        description_only: false,
        note: "8 tiles of 16 rows x 64 bytes; the OS must grant XTILEDATA (arch_prctl)",
    }
}

#[allow(clippy::too_many_arguments)]
fn avx(
    id: &'static str,
    mnemonic: &'static str,
    family: &'static str,
    bits: u32,
    n: u64,
    k: u64,
    a: DType,
    b: DType,
    acc: DType,
    features: Vec<&'static str>,
    macs_per_cycle: f64,
    latency: Option<u32>,
) -> Intrinsic {
    let b_layout = if k > 1 {
        LayoutReq::Vnni { group: k as u32 }
    } else {
        LayoutReq::NContiguous
    };
    let reg = Storage::VectorRegister { bits };
    Intrinsic {
        id,
        mnemonic,
        family,
        platform: Platform::X86,
        m: 1,
        n,
        k,
        a,
        b,
        acc,
        memory: [
            // A: k consecutive elements of one row, broadcast to every lane.
            mem(
                Storage::Broadcast {
                    bytes: (k as u32) * a.bytes() as u32,
                },
                if k > 1 {
                    LayoutReq::KContiguous
                } else {
                    LayoutReq::Any
                },
                "vpbroadcast",
                0,
            ),
            mem(reg.clone(), b_layout, "vmovdqu", 0),
            acc_mem(reg, "vmovups", "vmovups", 0),
        ],
        registers: if bits == 512 { 32 } else { 16 },
        path: CPU_PATH.to_vec(),
        throughput: Some(Throughput {
            macs_per_cycle,
            latency_cycles: latency,
            source: "two vector FMA ports per core (Sapphire Rapids)",
        }),
        requires: Requirement::CpuFeatures(features),
        description_only: false,
        note: "",
    }
}

#[allow(clippy::too_many_arguments)]
fn tensor_core(
    id: &'static str,
    mnemonic: &'static str,
    family: &'static str,
    (m, n, k): (u64, u64, u64),
    a: DType,
    b: DType,
    sm: (u32, u32),
    macs_per_cycle: f64,
    mma_sync: bool,
    note: &'static str,
) -> Intrinsic {
    let acc = if a.is_float() { DType::F32 } else { DType::I32 };
    let (storage, a_layout, b_layout, load) = if mma_sync {
        // ldmatrix (.trans for 16-bit types) fills registers from shared memory.
        let b = if a.bytes() == 2 {
            LayoutReq::Either
        } else {
            LayoutReq::KContiguous
        };
        (Storage::MmaRegisters, LayoutReq::KContiguous, b, "ldmatrix")
    } else {
        (
            Storage::WmmaFragment,
            LayoutReq::Either,
            LayoutReq::Either,
            "wmma::load_matrix_sync",
        )
    };
    Intrinsic {
        id,
        mnemonic,
        family,
        platform: Platform::Nvidia,
        m,
        n,
        k,
        a,
        b,
        acc,
        memory: [
            mem(storage.clone(), a_layout, load, 16),
            mem(storage.clone(), b_layout, load, 16),
            acc_mem(storage, load, "store_matrix_sync / st.global", 16),
        ],
        registers: 255,
        path: GPU_PATH.to_vec(),
        throughput: Some(Throughput {
            macs_per_cycle,
            latency_cycles: None,
            source: "dense Tensor Core FMA per SM per cycle (NVIDIA A100/H100 whitepapers)",
        }),
        requires: Requirement::ComputeCapability(sm.0, sm.1),
        description_only: false,
        note,
    }
}

/// `vpmaddubsw` then `vpmaddwd` by ones: u8 x i8 with four products per i32 lane, one vector
/// op fewer per 32 products than `vpmaddwd` + `vpaddd` and half the bytes (no widening), but
/// the first step adds two products into a *saturating* i16 (255 x 127 x 2 > 32767), so it is
/// exact only for small values (7-bit activations, or weights in [-64, 63]). This is what
/// oneDNN runs for u8 x s8 on AVX2, saturation included. tessel does not know value ranges:
/// the instruction is opt-in (`OPT_IN_INSTRUCTIONS`), searched only when named.
fn vpmaddubsw() -> Intrinsic {
    let mut i = avx(
        "avx2.vpmaddubsw",
        "vpmaddubsw + vpmaddwd + vpaddd ymm",
        "avx2-int8-saturating",
        256,
        8,
        4,
        DType::U8,
        DType::I8,
        DType::I32,
        vec!["avx2"],
        // Two multiplies (vpmaddubsw, vpmaddwd) per 32 products, on the same two ports as
        // vpmaddwd: 32 per cycle like it, with one add fewer and half the bytes.
        32.0,
        Some(10),
    );
    i.note = "opt-in: the u8 x i8 pair sums saturate at 16 bits (exact only for 7-bit activations or weights in [-64, 63]), as oneDNN's AVX2 int8 does";
    i
}

/// AVX-VNNI-INT8's ymm `vpdpbssd` (Sierra Forest, Arrow Lake, Lunar Lake): i8 x i8 quads
/// into i32, exact, so signed activations need no offset. Described only: gcc 12 has no
/// `-mavxvnniint8` (gcc 13 does), and no machine tessel has met runs it.
fn vpdpbssd() -> Intrinsic {
    let mut i = avx(
        "avxvnniint8.vpdpbssd",
        "vpdpbssd ymm (VEX)",
        "avx-vnni-int8",
        256,
        8,
        4,
        DType::I8,
        DType::I8,
        DType::I32,
        vec!["avx_vnni_int8"],
        64.0,
        Some(5),
    );
    i.description_only = true;
    i.note = "i8 x i8 (also u8 x u8 as vpdpbuud); described: needs gcc 13's -mavxvnniint8";
    i
}

/// Every instruction tessel knows, in a stable order.
pub fn catalog() -> Vec<Intrinsic> {
    use DType::*;
    let mut v = vec![
        amx(
            "amx.tdpbf16ps",
            "tdpbf16ps",
            "amx-bf16",
            32,
            BF16,
            BF16,
            2,
            "amx_bf16",
            512.0,
        ),
        amx(
            "amx.tdpbusd",
            "tdpbusd",
            "amx-int8",
            64,
            U8,
            I8,
            4,
            "amx_int8",
            1024.0,
        ),
        amx(
            "amx.tdpbssd",
            "tdpbssd",
            "amx-int8",
            64,
            I8,
            I8,
            4,
            "amx_int8",
            1024.0,
        ),
        avx(
            "avx512.vpdpbusd",
            "vpdpbusd zmm",
            "avx512-vnni",
            512,
            16,
            4,
            U8,
            I8,
            I32,
            vec!["avx512f", "avx512_vnni"],
            128.0,
            Some(5),
        ),
        avx(
            "avx512.vdpbf16ps",
            "vdpbf16ps zmm",
            "avx512-bf16",
            512,
            16,
            2,
            BF16,
            BF16,
            F32,
            vec!["avx512f", "avx512_bf16"],
            64.0,
            None,
        ),
        avx(
            "avx512.vfmadd231ph",
            "vfmadd231ph zmm",
            "avx512-fp16",
            512,
            32,
            1,
            F16,
            F16,
            F16,
            vec!["avx512f", "avx512_fp16"],
            64.0,
            Some(4),
        ),
        avx(
            "avx512.vfmadd231ps",
            "vfmadd231ps zmm",
            "avx512-fma",
            512,
            16,
            1,
            F32,
            F32,
            F32,
            vec!["avx512f"],
            32.0,
            Some(4),
        ),
        avx(
            "avxvnni.vpdpbusd",
            "vpdpbusd ymm (VEX)",
            "avx-vnni",
            256,
            8,
            4,
            U8,
            I8,
            I32,
            vec!["avx_vnni"],
            64.0,
            Some(5),
        ),
        avx(
            "avx2.vpmaddwd",
            "vpmaddwd + vpaddd ymm",
            "avx2-int8",
            256,
            8,
            2,
            I16,
            I16,
            I32,
            vec!["avx2"],
            32.0,
            Some(5),
        ),
        avx(
            "avx2.vfmadd231ps",
            "vfmadd231ps ymm",
            "avx2-fma",
            256,
            8,
            1,
            F32,
            F32,
            F32,
            vec!["avx2", "fma"],
            16.0,
            Some(4),
        ),
    ];
    for i in &mut v {
        i.note = match i.id {
            "avx2.vpmaddwd" => {
                "exact: i16 x i16 pairs summed into i32; u8/i8 operands are widened to i16 while packing (the products of two 8-bit values cannot overflow a pair sum)"
            }
            "avxvnni.vpdpbusd" => {
                "the VEX (ymm) form of AVX512-VNNI: Alder Lake, Sapphire Rapids, Zen 5"
            }
            _ => i.note,
        };
    }
    v.push(vpmaddubsw());
    v.push(vpdpbssd());
    /// (id, m x n x k, dtype, minimum compute capability)
    type Wmma = (&'static str, (u64, u64, u64), DType, (u32, u32));
    const WMMA_16BIT: [Wmma; 6] = [
        ("wmma.m16n16k16.f16", (16, 16, 16), DType::F16, (7, 0)),
        ("wmma.m32n8k16.f16", (32, 8, 16), DType::F16, (7, 0)),
        ("wmma.m8n32k16.f16", (8, 32, 16), DType::F16, (7, 0)),
        ("wmma.m16n16k16.bf16", (16, 16, 16), DType::BF16, (8, 0)),
        ("wmma.m32n8k16.bf16", (32, 8, 16), DType::BF16, (8, 0)),
        ("wmma.m8n32k16.bf16", (8, 32, 16), DType::BF16, (8, 0)),
    ];
    for (id, shape, dt, sm) in WMMA_16BIT {
        v.push(tensor_core(
            id,
            "wmma::mma_sync",
            "wmma",
            shape,
            dt,
            dt,
            sm,
            1024.0,
            false,
            "",
        ));
    }
    v.push(tensor_core(
        "wmma.m16n16k8.tf32",
        "wmma::mma_sync",
        "wmma",
        (16, 16, 8),
        F32,
        F32,
        (8, 0),
        512.0,
        false,
        "f32 inputs are rounded to tf32 by the hardware",
    ));
    v.push(tensor_core(
        "wmma.m16n16k16.s8",
        "wmma::mma_sync",
        "wmma",
        (16, 16, 16),
        I8,
        I8,
        (7, 2),
        2048.0,
        false,
        "",
    ));
    v.push(tensor_core(
        "mma.m16n8k16.f16",
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        "mma.sync",
        (16, 8, 16),
        F16,
        F16,
        (8, 0),
        1024.0,
        true,
        "",
    ));
    v.push(tensor_core(
        "mma.m16n8k16.bf16",
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
        "mma.sync",
        (16, 8, 16),
        BF16,
        BF16,
        (8, 0),
        1024.0,
        true,
        "",
    ));
    v.push(tensor_core(
        "mma.m16n8k32.s8",
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32",
        "mma.sync",
        (16, 8, 32),
        I8,
        I8,
        (8, 0),
        2048.0,
        true,
        "",
    ));
    let mut wgmma = tensor_core(
        "wgmma.m64n256k16.bf16",
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16",
        "wgmma",
        (64, 256, 16),
        BF16,
        BF16,
        (9, 0),
        2048.0,
        false,
        "warpgroup-wide (128 threads); A from registers or shared memory, B from shared memory",
    );
    wgmma.memory[0].storage = crate::desc::Storage::SharedMemory;
    wgmma.memory[1].storage = crate::desc::Storage::SharedMemory;
    wgmma.memory[0].load = "wgmma descriptor";
    wgmma.memory[1].load = "wgmma descriptor";
    wgmma.description_only = true;
    v.push(wgmma);
    v
}

/// Instruction `id` on tiles of `rows` rows along m, where its tiles take fewer rows (AMX:
/// 1 to 15; 16 is the catalog's own entry): the same id, m = `rows`, and a peak scaled by
/// rows / 16 (a 14-row `tdpbf16ps` ran 0.92-1.0x the time of a 16-row one on an AMX guest,
/// so the scaled peak is the conservative one). A trace tensorizes with the catalog's
/// id, binding m to a loop of `rows`; the space uses this entry to size tiles and blocks.
pub fn partial_rows(id: &str, rows: u64) -> Option<&'static Intrinsic> {
    static PARTIAL: std::sync::OnceLock<Vec<Intrinsic>> = std::sync::OnceLock::new();
    let all = PARTIAL.get_or_init(|| {
        let mut v = Vec::new();
        for i in catalog() {
            if !matches!(i.memory[0].storage, Storage::AmxTile { .. }) {
                continue;
            }
            for r in 1..i.m {
                let mut p = i.clone();
                p.m = r;
                if let Some(t) = &mut p.throughput {
                    t.macs_per_cycle = t.macs_per_cycle * r as f64 / i.m as f64;
                }
                v.push(p);
            }
        }
        v
    });
    all.iter().find(|i| i.id == id && i.m == rows)
}

/// The catalog as an [`IntrinsicResolver`] for tessel-ir's tensorize step.
#[derive(Clone, Debug)]
pub struct Catalog {
    pub intrinsics: Vec<Intrinsic>,
}

impl Default for Catalog {
    fn default() -> Self {
        Catalog {
            intrinsics: catalog(),
        }
    }
}

impl Catalog {
    pub fn get(&self, id: &str) -> Option<&Intrinsic> {
        self.intrinsics.iter().find(|i| i.id == id)
    }

    pub fn ids(&self) -> Vec<&'static str> {
        self.intrinsics.iter().map(|i| i.id).collect()
    }
}

impl IntrinsicResolver for Catalog {
    fn resolve(&self, id: &str) -> Option<ComputeOp> {
        self.get(id).map(Intrinsic::semantics)
    }

    /// An AMX tile's rows are configurable (1-16): a tile of fewer rows along m lets a
    /// convolution's tiles end where an image row ends (14 rows of a 56-pixel row), so its
    /// input is read where it lies instead of copied per block.
    fn accepts_fewer(&self, id: &str, var: &str) -> bool {
        var == "m"
            && self
                .get(id)
                .is_some_and(|i| matches!(i.memory[0].storage, Storage::AmxTile { .. }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_semantics_validate() {
        let c = Catalog::default();
        let mut ids = c.ids();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), c.intrinsics.len());
        for i in &c.intrinsics {
            i.semantics().validate().unwrap();
            assert_eq!(i.semantics().macs(), i.macs());
        }
        let amx = c.get("amx.tdpbf16ps").unwrap();
        assert_eq!((amx.m, amx.n, amx.k, amx.registers), (16, 16, 32, 8));
        // One 16x16x32 product per 16 cycles: 512 MACs per cycle.
        assert_eq!(
            amx.throughput.unwrap().macs_per_cycle,
            (16 * 16 * 32 / 16) as f64
        );
        assert!(c.get("wgmma.m64n256k16.bf16").unwrap().description_only);
    }
}
