//! What the features know of a machine: caches, registers, bandwidths, cores, clock and the
//! peak of each instruction family it has.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tessel_intrin::{Catalog, Intrinsic, Platform, Requirement, Storage};
use tessel_ir::DType;
use tessel_measure::{CodePaths, HardwareFingerprint};

use crate::FeatureError;

/// A target as the features see it. Sizes are per core (CPU L1/L2) or per SM (GPU L1/shared);
/// `l3_bytes` and the GPU's `l2_bytes` are shared by all.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Target {
    pub name: String,
    pub gpu: bool,
    /// Cores (CPU) or SMs (GPU) in use.
    pub cores: u32,
    pub clock_ghz: f64,
    pub l1_bytes: u64,
    pub l2_bytes: u64,
    pub l3_bytes: u64,
    pub shared_bytes: u64,
    /// Bytes of one vector register (CPU: 64 with AVX-512, 32 with AVX2) and how many.
    pub vector_register_bytes: u64,
    pub vector_registers: u64,
    /// Main-memory and L2 bandwidth available to the cores in use, GB/s.
    pub memory_bw_gbs: f64,
    pub l2_bw_gbs: f64,
    /// The catalog instructions this target runs.
    pub instructions: Vec<String>,
    /// This GPU's Tensor Core rate per SM relative to the catalog's figure (A100-class
    /// parts 1, V100 and Ada 0.5, Hopper 2); 1 on CPUs.
    #[serde(default = "one")]
    pub matrix_scale: f64,
    /// Multiply-accumulates per cycle per core of plain (unvectorized) code: 2 on a CPU core
    /// (two FMA ports), the CUDA cores' fp32 FMA per SM on a GPU (64 on an A100). Where a
    /// fingerprint does not say, 2 (CPU) or 64 (GPU).
    #[serde(default = "two")]
    pub scalar_macs_per_cycle: f64,
    /// The hardware token, built on first use (build a new target rather than editing one).
    #[serde(skip)]
    pub(crate) token: std::sync::OnceLock<Vec<f32>>,
    /// The backend that says how it emits each tensorized call ([`Target::with_code_paths`]).
    #[serde(skip)]
    pub(crate) code_paths: PathSource,
}

/// A target's [`CodePaths`], if it has one. Two targets' sources are equal when both have
/// none or both share one.
#[derive(Clone, Default)]
pub(crate) struct PathSource(pub(crate) Option<Arc<dyn CodePaths>>);

impl PartialEq for PathSource {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl std::fmt::Debug for PathSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Some(CodePaths)"
        } else {
            "None"
        })
    }
}

fn one() -> f64 {
    1.0
}

fn two() -> f64 {
    2.0
}

/// `key=value` entries of a fingerprint's feature list (GPU fingerprints carry their clock,
/// bandwidths and Tensor Core rate this way).
fn figure(fp: &HardwareFingerprint, key: &str) -> Option<f64> {
    fp.features.iter().find_map(|f| {
        let (k, v) = f.split_once('=')?;
        (k == key).then(|| v.parse().ok()).flatten()
    })
}

/// Nominal figures where a fingerprint has none: one core of a current server part.
const DEFAULT_CLOCK_GHZ: f64 = 2.5;
const DRAM_GBS_PER_CORE: f64 = 12.0;
const DRAM_GBS_MAX: f64 = 200.0;
const L2_BYTES_PER_CYCLE: f64 = 32.0;

impl Target {
    /// A CPU with these `/proc/cpuinfo` feature flags, `cores` in use and cache sizes by level
    /// name (`l1d`, `l2`, `l3`, bytes; missing ones get typical sizes).
    pub fn cpu(
        name: &str,
        features: &[String],
        cores: u32,
        caches: &BTreeMap<String, u64>,
        clock_ghz: Option<f64>,
    ) -> Target {
        let has = |f: &str| features.iter().any(|x| x == f);
        let catalog = Catalog::default();
        let instructions = catalog
            .intrinsics
            .iter()
            // What can run: instructions only described (no code generator) are left out.
            .filter(|i| !i.description_only)
            // Nor opt-in ones (inexact beyond small values): not what the tuner searches.
            .filter(|i| !tessel_intrin::is_opt_in(i.id))
            .filter(|i| match &i.requires {
                Requirement::CpuFeatures(fs) => fs.iter().all(|f| has(f)),
                Requirement::ComputeCapability(..) => false,
            })
            .map(|i| i.id.to_string())
            .collect();
        let (vector_register_bytes, vector_registers) = if has("avx512f") {
            (64, 32)
        } else if has("avx2") {
            (32, 16)
        } else {
            (16, 16)
        };
        let cores = cores.max(1);
        let clock_ghz = clock_ghz.unwrap_or(DEFAULT_CLOCK_GHZ);
        Target {
            name: name.to_string(),
            gpu: false,
            cores,
            clock_ghz,
            l1_bytes: caches.get("l1d").copied().unwrap_or(32 << 10),
            l2_bytes: caches.get("l2").copied().unwrap_or(1 << 20),
            l3_bytes: caches.get("l3").copied().unwrap_or(16 << 20),
            shared_bytes: 0,
            vector_register_bytes,
            vector_registers,
            memory_bw_gbs: (DRAM_GBS_PER_CORE * cores as f64).min(DRAM_GBS_MAX),
            l2_bw_gbs: L2_BYTES_PER_CYCLE * clock_ghz * cores as f64,
            instructions,
            matrix_scale: 1.0,
            scalar_macs_per_cycle: 2.0,
            token: Default::default(),
            code_paths: PathSource::default(),
        }
    }

    /// An NVIDIA GPU of compute capability `cc` with `sms` SMs.
    #[allow(clippy::too_many_arguments)]
    pub fn gpu(
        name: &str,
        cc: (u32, u32),
        sms: u32,
        clock_ghz: f64,
        shared_bytes: u64,
        l2_bytes: u64,
        memory_bw_gbs: f64,
        l2_bw_gbs: f64,
    ) -> Target {
        let catalog = Catalog::default();
        let instructions = catalog
            .intrinsics
            .iter()
            .filter(|i| match i.requires {
                Requirement::ComputeCapability(a, b) => (a, b) <= cc && !i.description_only,
                Requirement::CpuFeatures(_) => false,
            })
            .map(|i| i.id.to_string())
            .collect();
        Target {
            name: name.to_string(),
            gpu: true,
            cores: sms.max(1),
            clock_ghz,
            l1_bytes: shared_bytes,
            l2_bytes,
            l3_bytes: 0,
            shared_bytes,
            // 64K 32-bit registers per SM.
            vector_register_bytes: 4,
            vector_registers: 65536,
            memory_bw_gbs,
            l2_bw_gbs,
            instructions,
            matrix_scale: 1.0,
            scalar_macs_per_cycle: 64.0,
            token: Default::default(),
            code_paths: PathSource::default(),
        }
    }

    /// The target a measurement ran on, from its hardware fingerprint.
    pub fn from_fingerprint(fp: &HardwareFingerprint) -> Result<Target, FeatureError> {
        match fp.kind.as_str() {
            "cpu" => Ok(Target::cpu(
                &fp.model,
                &compiled_features(&fp.features, &fp.compiler),
                fp.cores_used,
                &fp.caches,
                None,
            )),
            "gpu" | "sim" => {
                let cc = parse_cc(&fp.version).ok_or_else(|| {
                    FeatureError::Target(format!(
                        "GPU fingerprint `{}` has no compute capability in `{}`",
                        fp.model, fp.version
                    ))
                })?;
                let shared = fp.caches.get("shared").copied().unwrap_or(100 << 10);
                let l2 = fp.caches.get("l2").copied().unwrap_or(40 << 20);
                let mut t = Target::gpu(
                    &fp.model,
                    cc,
                    fp.cores_used,
                    figure(fp, "clock_ghz").unwrap_or(1.5),
                    shared,
                    l2,
                    figure(fp, "dram_gbs").unwrap_or(1500.0),
                    figure(fp, "l2_gbs").unwrap_or(5000.0),
                );
                t.matrix_scale = figure(fp, "tc_scale").unwrap_or(1.0);
                t.scalar_macs_per_cycle = figure(fp, "fp32_per_sm").unwrap_or(64.0);
                Ok(t)
            }
            other => Err(FeatureError::Target(format!(
                "unknown target kind `{other}` (expected cpu, gpu or sim)"
            ))),
        }
    }

    /// The same target with the backend that will build its programs: the features of each
    /// tensorized call then say how the backend emits it (schema v3's `compute.path_*`
    /// columns). Without one those columns are zero. Training data and the search must
    /// featurise alike: the façade gives every CPU target tessel-cpu's code generator.
    pub fn with_code_paths(mut self, paths: Arc<dyn CodePaths>) -> Target {
        self.code_paths = PathSource(Some(paths));
        self
    }

    /// Whether the features know how the backend emits tensorized calls.
    pub fn knows_code_paths(&self) -> bool {
        self.code_paths.0.is_some()
    }

    /// Bytes of operand registers per core (CPU: vector registers plus AMX tiles where present)
    /// or per SM (GPU).
    pub fn register_bytes(&self) -> u64 {
        let tiles = self
            .intrinsics()
            .filter_map(|i| match i.memory[2].storage {
                Storage::AmxTile { rows, row_bytes } => {
                    Some(i.registers as u64 * rows as u64 * row_bytes as u64)
                }
                _ => None,
            })
            .max()
            .unwrap_or(0);
        self.vector_register_bytes * self.vector_registers + tiles
    }

    /// The target's instructions, from the catalog.
    pub fn intrinsics(&self) -> impl Iterator<Item = &'static Intrinsic> + '_ {
        let catalog = catalog();
        self.instructions.iter().filter_map(|id| catalog.get(id))
    }

    /// Best published MAC/cycle/core among the target's instructions that `pick`s.
    pub fn peak(&self, pick: impl Fn(&Intrinsic) -> bool) -> f64 {
        self.intrinsics()
            .filter(|i| pick(i))
            .map(|i| self.macs_per_cycle(i))
            .fold(0.0, f64::max)
    }

    /// An instruction's MAC/cycle/core on this target (0 when the catalog has no figure).
    pub fn macs_per_cycle(&self, i: &Intrinsic) -> f64 {
        let base = i.throughput.map_or(0.0, |t| t.macs_per_cycle);
        if i.platform == Platform::Nvidia {
            base * self.matrix_scale
        } else {
            base
        }
    }

    /// Peaks by input type and for matrix instructions, in schema order (f32, bf16, f16, int8,
    /// matrix).
    pub fn peaks(&self) -> [f64; 5] {
        let matrix = |i: &Intrinsic| {
            matches!(i.memory[2].storage, Storage::AmxTile { .. }) || i.platform == Platform::Nvidia
        };
        [
            self.peak(|i| i.a == DType::F32),
            self.peak(|i| i.a == DType::BF16),
            self.peak(|i| i.a == DType::F16),
            self.peak(|i| matches!(i.a, DType::I8 | DType::U8 | DType::I16)),
            self.peak(matrix),
        ]
    }
}

/// The catalog, built once: features look instructions up on every program.
pub(crate) fn catalog() -> &'static Catalog {
    static CATALOG: std::sync::OnceLock<Catalog> = std::sync::OnceLock::new();
    CATALOG.get_or_init(Catalog::default)
}

/// `8.0`, `sm_80` or `compute capability 8.0` -> (8, 0).
fn parse_cc(s: &str) -> Option<(u32, u32)> {
    let digits: String = s
        .chars()
        .filter(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    if let Some((a, b)) = digits.split_once('.') {
        return Some((a.parse().ok()?, b.chars().next()?.to_digit(10)?));
    }
    let mut it = digits.chars();
    let a = it.next()?.to_digit(10)?;
    let b = it.next()?.to_digit(10)?;
    Some((a, b))
}

/// The CPU features the measured code could use: the host's, less what the compiler's
/// `-march=` (recorded in the fingerprint's compiler line as `[-march=X]`) does not enable.
/// Code built for `znver3` on an AVX-512 machine has 16 ymm registers and no AVX-512
/// instruction, and its features must say so.
pub fn compiled_features(host: &[String], compiler: &str) -> Vec<String> {
    let march = compiler
        .split("[-march=")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .unwrap_or("native");
    // Prefixes of the flags each known AVX2-era target lacks.
    let lacks: &[&str] = match march {
        "haswell" | "broadwell" | "skylake" | "znver1" | "znver2" | "znver3" | "x86-64-v3" => {
            &["avx512", "amx", "avx_vnni"]
        }
        "alderlake" => &["avx512", "amx"],
        _ => &[],
    };
    host.iter()
        .filter(|f| !lacks.iter().any(|p| f.starts_with(p)))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_built_for_an_avx2_march_on_an_avx512_host_has_avx2_features() {
        let zen4: Vec<String> = ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"]
            .map(String::from)
            .to_vec();
        let built = compiled_features(&zen4, "cc (Debian 12.2.0-14) 12.2.0 [-march=znver3]");
        assert_eq!(built, vec!["avx2".to_string(), "fma".to_string()]);
        let t = Target::cpu("t", &built, 1, &BTreeMap::new(), None);
        assert_eq!((t.vector_register_bytes, t.vector_registers), (32, 16));
        assert!(t.instructions.iter().all(|i| !i.starts_with("avx512")));
        // Native builds (no march in the line) and unknown marches keep the host's flags.
        assert_eq!(
            compiled_features(&zen4, "cc (Debian 12.2.0-14) 12.2.0"),
            zen4
        );
        assert_eq!(compiled_features(&zen4, "cc 12 [-march=znver4]"), zen4);
    }

    #[test]
    fn cpu_targets_list_their_instructions_and_peaks() {
        let avx2 = Target::cpu(
            "t",
            &["avx2".into(), "fma".into()],
            1,
            &BTreeMap::new(),
            None,
        );
        // vpmaddwd (int8 widened to i16) and the f32 FMA; vpmaddubsw is only described.
        assert_eq!(
            avx2.instructions,
            vec!["avx2.vpmaddwd".to_string(), "avx2.vfmadd231ps".to_string()]
        );
        assert_eq!(avx2.peaks(), [16.0, 0.0, 0.0, 32.0, 0.0]);
        assert_eq!(avx2.register_bytes(), 16 * 32);
        let spr: Vec<String> = ["avx2", "fma", "avx512f", "amx_tile", "amx_bf16", "amx_int8"]
            .map(String::from)
            .to_vec();
        let spr = Target::cpu("spr", &spr, 4, &BTreeMap::new(), Some(2.0));
        assert_eq!(spr.peaks()[1], 512.0);
        assert_eq!(spr.peaks()[4], 1024.0);
        assert_eq!(spr.register_bytes(), 32 * 64 + 8 * 1024);
    }

    #[test]
    fn compute_capabilities_parse() {
        assert_eq!(parse_cc("8.0"), Some((8, 0)));
        assert_eq!(parse_cc("sm_90"), Some((9, 0)));
        assert_eq!(parse_cc("compute capability 7.5"), Some((7, 5)));
        assert_eq!(parse_cc("none"), None);
    }
}
