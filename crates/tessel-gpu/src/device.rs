//! Published specifications of the GPUs the analytical model knows.
//!
//! Sources: NVIDIA's architecture whitepapers (Volta V100, Turing, Ampere GA100 and GA102,
//! Ada AD102/AD104, Hopper H100) and the product datasheets (A10, L4, H200). Tensor Core rates
//! are dense (no sparsity) multiply-accumulates per SM per clock at the boost clock the
//! datasheet's TFLOPS are quoted at; GeForce parts accumulate fp16 in fp32 at half rate.

use serde::{Deserialize, Serialize};
use tessel_ir::DType;
use tessel_measure::HardwareFingerprint;

use crate::error::GpuError;

/// The catalog's fp16 Tensor Core figure (MAC per SM per clock, an A100's); a device's
/// `tc_scale` is its own rate over this.
const CATALOG_TC_F16: f64 = 1024.0;

/// One GPU, as the analytical model sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceSpec {
    /// Short name used in `sim:NAME`.
    pub key: &'static str,
    pub name: &'static str,
    pub cc: (u32, u32),
    pub sms: u32,
    /// Boost clock the peak figures are quoted at, GHz.
    pub clock_ghz: f64,
    /// Dense Tensor Core multiply-accumulates per SM per clock: f16, bf16, int8 (0 = none).
    pub tc_f16: f64,
    pub tc_bf16: f64,
    pub tc_int8: f64,
    /// FP32 FMA per SM per clock (CUDA cores).
    pub fp32: f64,
    pub regs_per_sm: u64,
    pub max_threads_per_sm: u64,
    pub max_blocks_per_sm: u64,
    /// Shared memory per SM usable by blocks, bytes.
    pub shared_per_sm: u64,
    pub l2_bytes: u64,
    /// DRAM bandwidth, GB/s.
    pub dram_gbs: f64,
    /// L2 bandwidth, bytes per clock for the whole chip.
    pub l2_bytes_per_clock: f64,
}

impl DeviceSpec {
    /// Peak Tensor Core MAC/s of the whole chip for an input type (0 when none).
    pub fn tc_macs_per_s(&self, t: DType) -> f64 {
        let per = match t {
            DType::F16 => self.tc_f16,
            DType::BF16 => self.tc_bf16,
            DType::I8 | DType::U8 => self.tc_int8,
            _ => 0.0,
        };
        per * self.sms as f64 * self.clock_ghz * 1e9
    }

    /// The fingerprint records carry: kind `sim`, so nothing mistakes it for a measurement.
    pub fn fingerprint(&self) -> HardwareFingerprint {
        let mut caches = std::collections::BTreeMap::new();
        caches.insert("shared".to_string(), self.shared_per_sm);
        caches.insert("l2".to_string(), self.l2_bytes);
        HardwareFingerprint {
            kind: "sim".into(),
            model: format!("{} (analytical model)", self.name),
            vendor: "NVIDIA".into(),
            version: format!("{}.{}", self.cc.0, self.cc.1),
            features: gpu_features(self.cc, self.clock_ghz, self.dram_gbs, Some(self)),
            cores_used: self.sms,
            cores_available: self.sms,
            caches,
            compiler: format!("tessel-gpu analytical model {}", env!("CARGO_PKG_VERSION")),
        }
    }
}

/// Every device the model knows.
pub fn devices() -> Vec<DeviceSpec> {
    let d = |key,
             name,
             cc,
             sms,
             clock_ghz,
             (tc_f16, tc_bf16, tc_int8, fp32): (f64, f64, f64, f64),
             (max_threads_per_sm, max_blocks_per_sm, shared_kb): (u64, u64, u64),
             l2_mb: u64,
             dram_gbs,
             l2_bytes_per_clock| DeviceSpec {
        key,
        name,
        cc,
        sms,
        clock_ghz,
        tc_f16,
        tc_bf16,
        tc_int8,
        fp32,
        regs_per_sm: 65536,
        max_threads_per_sm,
        max_blocks_per_sm,
        shared_per_sm: shared_kb << 10,
        l2_bytes: l2_mb << 20,
        dram_gbs,
        l2_bytes_per_clock,
    };
    vec![
        // 125 TFLOPS fp16 at 1.53 GHz; no bf16 or int8 Tensor Cores.
        d(
            "v100",
            "Tesla V100-SXM2",
            (7, 0),
            80,
            1.53,
            (512.0, 0.0, 0.0, 64.0),
            (2048, 32, 96),
            6,
            900.0,
            2048.0,
        ),
        // 65 TFLOPS fp16, 130 TOPS int8 at 1.59 GHz.
        d(
            "t4",
            "Tesla T4",
            (7, 5),
            40,
            1.59,
            (512.0, 0.0, 1024.0, 64.0),
            (1024, 16, 64),
            4,
            320.0,
            1024.0,
        ),
        // 125 TFLOPS fp16/bf16, 250 TOPS int8 at 1.695 GHz.
        d(
            "a10",
            "NVIDIA A10",
            (8, 6),
            72,
            1.695,
            (512.0, 512.0, 1024.0, 128.0),
            (1536, 16, 100),
            6,
            600.0,
            2048.0,
        ),
        // 312 TFLOPS fp16/bf16, 624 TOPS int8 at 1.41 GHz.
        d(
            "a100",
            "NVIDIA A100-SXM4-80GB",
            (8, 0),
            108,
            1.41,
            (1024.0, 1024.0, 2048.0, 64.0),
            (2048, 32, 164),
            40,
            2039.0,
            5120.0,
        ),
        // 121 TFLOPS fp16/bf16, 242 TOPS int8 at 2.04 GHz.
        d(
            "l4",
            "NVIDIA L4",
            (8, 9),
            58,
            2.04,
            (512.0, 512.0, 1024.0, 128.0),
            (1536, 24, 100),
            48,
            300.0,
            2048.0,
        ),
        // 989 TFLOPS fp16/bf16, 1979 TOPS int8 at 1.83 GHz.
        d(
            "h100",
            "NVIDIA H100-SXM5-80GB",
            (9, 0),
            132,
            1.83,
            (2048.0, 2048.0, 4096.0, 128.0),
            (2048, 32, 228),
            50,
            3350.0,
            7680.0,
        ),
        // The H100's compute with 4.8 TB/s HBM3e.
        d(
            "h200",
            "NVIDIA H200-SXM-141GB",
            (9, 0),
            132,
            1.83,
            (2048.0, 2048.0, 4096.0, 128.0),
            (2048, 32, 228),
            50,
            4800.0,
            7680.0,
        ),
        // 165 TFLOPS fp16 with fp32 accumulation, 661 TOPS int8 at 2.52 GHz.
        d(
            "rtx4090",
            "NVIDIA GeForce RTX 4090",
            (8, 9),
            128,
            2.52,
            (256.0, 256.0, 1024.0, 128.0),
            (1536, 24, 100),
            72,
            1008.0,
            5120.0,
        ),
    ]
}

/// A device by its `sim:` name (`a100`, `A100-80GB`, `h100-sxm`, ...: case, dashes and the
/// memory/form suffixes do not matter).
pub fn device(name: &str) -> Result<DeviceSpec, GpuError> {
    let norm: String = name
        .to_ascii_lowercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    let norm = norm
        .trim_end_matches("80gb")
        .trim_end_matches("sxm")
        .trim_end_matches("pcie")
        .to_string();
    let all = devices();
    all.iter()
        .find(|d| d.key == norm)
        .cloned()
        .ok_or_else(|| GpuError::UnknownDevice {
            name: name.to_string(),
            known: all.iter().map(|d| d.key).collect::<Vec<_>>().join(", "),
        })
}

/// The figures GPU fingerprints carry for the features (tessel-features'
/// `Target::from_fingerprint`): the arch, the clock and DRAM bandwidth, and the L2 bandwidth,
/// Tensor Core rate and CUDA-core fp32 rate of `spec` (for a real GPU not in the table: typical figures of its
/// compute capability).
pub fn gpu_features(
    cc: (u32, u32),
    clock_ghz: f64,
    dram_gbs: f64,
    spec: Option<&DeviceSpec>,
) -> Vec<String> {
    let (l2_bytes_per_clock, tc_f16, fp32) = match spec {
        Some(s) => (s.l2_bytes_per_clock, s.tc_f16, s.fp32),
        None => match cc {
            (7, _) => (2048.0, 512.0, 64.0),
            (8, 0) => (5120.0, 1024.0, 64.0),
            (8, _) => (2048.0, 512.0, 128.0),
            _ => (5120.0, 2048.0, 128.0),
        },
    };
    vec![
        format!("sm_{}{}", cc.0, cc.1),
        format!("clock_ghz={clock_ghz}"),
        format!("dram_gbs={dram_gbs}"),
        format!("l2_gbs={:.0}", l2_bytes_per_clock * clock_ghz),
        format!("tc_scale={}", tc_f16 / CATALOG_TC_F16),
        format!("fp32_per_sm={fp32}"),
    ]
}

/// The table's entry for a real GPU, by the name the driver reports ("NVIDIA H200",
/// "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090") and its compute capability.
///
/// ```
/// use tessel_gpu::device::spec_for;
/// assert_eq!(spec_for("NVIDIA H100 80GB HBM3", (9, 0)).unwrap().key, "h100");
/// assert_eq!(spec_for("NVIDIA GeForce RTX 4090", (8, 9)).unwrap().key, "rtx4090");
/// assert!(spec_for("NVIDIA L40S", (8, 9)).is_none());
/// assert!(spec_for("NVIDIA H200", (8, 0)).is_none());
/// ```
pub fn spec_for(driver_name: &str, cc: (u32, u32)) -> Option<DeviceSpec> {
    // Words, and pairs of adjacent words ("RTX 4090"): "L40S" is not an "L4".
    let words: Vec<String> = driver_name
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.to_ascii_lowercase())
        .collect();
    let mut names = words.clone();
    names.extend(words.windows(2).map(|w| format!("{}{}", w[0], w[1])));
    devices()
        .into_iter()
        .find(|d| d.cc == cc && names.iter().any(|n| n == d.key))
}
