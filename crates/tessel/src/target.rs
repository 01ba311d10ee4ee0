//! Where candidates run: this CPU (measured), a GPU's analytical model (`sim:NAME`,
//! estimates) or this machine's NVIDIA GPU (measured, `cuda` feature).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use tessel_cpu::{CpuMeasurer, CpuOptions};
use tessel_gpu::DeviceSpec;
use tessel_intrin::Catalog;
use tessel_measure::{CodePaths, HardwareFingerprint, Measurer};
use tessel_search::InstructionSet;

#[cfg(feature = "cuda")]
use crate::error::Context;
use crate::error::{Error, Result, bail};

/// A target as a user names it: `cpu`, `sim:NAME` or `gpu`. Parsing opens nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TargetSpec {
    /// This machine's CPU.
    #[default]
    Cpu,
    /// The analytical model of a GPU from the device table (`sim:a100`).
    Sim(String),
    /// This machine's NVIDIA GPU.
    Gpu,
}

impl FromStr for TargetSpec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        // Case does not matter (`CPU`, `sim:A100`); the label records carry is lower case.
        let lower = s.to_ascii_lowercase();
        match lower.as_str() {
            "cpu" => Ok(TargetSpec::Cpu),
            "gpu" | "cuda" => Ok(TargetSpec::Gpu),
            _ => match lower.strip_prefix("sim:") {
                Some(name) => Ok(TargetSpec::Sim(tessel_gpu::device(name)?.key.to_string())),
                None => {
                    let known: Vec<String> = tessel_gpu::devices()
                        .iter()
                        .map(|d| format!("sim:{}", d.key))
                        .collect();
                    bail!(
                        "unknown target `{}`: use cpu, gpu or one of {}",
                        s.escape_debug(),
                        known.join(", ")
                    )
                }
            },
        }
    }
}

impl fmt::Display for TargetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetSpec::Cpu => f.write_str("cpu"),
            TargetSpec::Sim(name) => write!(f, "sim:{name}"),
            TargetSpec::Gpu => f.write_str("gpu"),
        }
    }
}

/// How to measure on a target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetOptions {
    /// OpenMP threads per CPU kernel.
    pub threads: usize,
    /// Run instructions this CPU lacks on their scalar emulation (correctness only).
    pub emulate: bool,
    /// The worker executable (default: this program, which must call
    /// [`serve_if_worker`](crate::serve_if_worker) first thing in `main`).
    pub worker_exe: Option<PathBuf>,
}

impl Default for TargetOptions {
    fn default() -> Self {
        TargetOptions {
            threads: 1,
            emulate: false,
            worker_exe: None,
        }
    }
}

enum Backend {
    Cpu(Box<CpuMeasurer>),
    Sim(DeviceSpec, Box<dyn Measurer>),
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Gpu {
        name: String,
        /// The device table's entry for this GPU, where it has one (for the peaks).
        spec: Option<DeviceSpec>,
        measurer: Box<dyn Measurer>,
    },
}

/// An opened target: its measurer, what instructions it offers, its peaks and fingerprint.
pub struct Target {
    spec: TargetSpec,
    backend: Backend,
    cc: Option<(u32, u32)>,
}

impl Target {
    /// Opens `spec`: starts the CPU or GPU measurer (the GPU through a worker process that
    /// owns the driver), or picks the device model.
    pub fn open(spec: &TargetSpec, opts: &TargetOptions) -> Result<Target> {
        if opts.threads == 0 {
            bail!("threads must be at least 1");
        }
        let (backend, cc) = match spec {
            TargetSpec::Cpu => (Backend::Cpu(Box::new(cpu_measurer(opts)?)), None),
            TargetSpec::Sim(name) => {
                let d = tessel_gpu::device(name)?;
                let cc = d.cc;
                let m = Box::new(tessel_gpu::SimMeasurer::new(d.clone()));
                (Backend::Sim(d, m), Some(cc))
            }
            TargetSpec::Gpu => open_gpu(opts)?,
        };
        Ok(Target {
            spec: spec.clone(),
            backend,
            cc,
        })
    }

    /// What the user named.
    pub fn spec(&self) -> &TargetSpec {
        &self.spec
    }

    /// The target string records carry (`cpu`, `sim:a100`, `gpu`).
    pub fn label(&self) -> String {
        self.spec.to_string()
    }

    /// Whether results are estimates of a model, not measurements.
    pub fn is_estimate(&self) -> bool {
        matches!(self.backend, Backend::Sim(..))
    }

    /// The GPU model's device spec (`sim:` targets).
    pub fn device(&self) -> Option<&DeviceSpec> {
        match &self.backend {
            Backend::Sim(d, _) => Some(d),
            Backend::Gpu { spec, .. } => spec.as_ref(),
            Backend::Cpu(_) => None,
        }
    }

    /// The GPU's name as the driver reports it (`gpu` targets).
    pub fn gpu_name(&self) -> Option<&str> {
        match &self.backend {
            Backend::Gpu { name, .. } => Some(name),
            _ => None,
        }
    }

    /// The instructions the search may use: every CPU instruction this machine has, or the
    /// GPU's Tensor Core instructions of its compute capability.
    pub fn instruction_set(&self) -> InstructionSet {
        match self.cc {
            Some(cc) => InstructionSet::Gpu { cc },
            None => InstructionSet::Host,
        }
    }

    /// The measurer.
    pub fn measurer(&mut self) -> &mut dyn Measurer {
        match &mut self.backend {
            Backend::Cpu(m) => m.as_mut(),
            Backend::Sim(_, m) | Backend::Gpu { measurer: m, .. } => m.as_mut(),
        }
    }

    /// The measurer, for good.
    pub fn into_measurer(self) -> Box<dyn Measurer> {
        match self.backend {
            Backend::Cpu(m) => m,
            Backend::Sim(_, m) | Backend::Gpu { measurer: m, .. } => m,
        }
    }

    /// The machine results are tied to.
    pub fn fingerprint(&mut self) -> HardwareFingerprint {
        self.measurer().fingerprint().clone()
    }

    /// The peak of every instruction this target runs, GFLOP/s (GOP/s), for "% of peak":
    /// measured by micro-benchmarks on a CPU, from the device table on a GPU.
    pub fn peaks(&self) -> Result<Peaks> {
        self.peaks_of(&tessel_intrin::CPU_INSTRUCTIONS)
    }

    /// [`Target::peaks`] of these CPU instructions only (each takes a second or so to
    /// settle); GPU targets ignore `ids`.
    pub fn peaks_of(&self, ids: &[&str]) -> Result<Peaks> {
        Ok(match &self.backend {
            Backend::Cpu(_) if ids.is_empty() => Peaks::Cpu(Vec::new()),
            Backend::Cpu(m) => {
                let threads = m.options().threads;
                let measured = tessel_cpu::peak::measure_peaks(m.compiler(), ids, threads)?;
                Peaks::Cpu(
                    measured
                        .measured
                        .into_iter()
                        .map(|p| (p.intrinsic, p.gops))
                        .collect(),
                )
            }
            Backend::Sim(d, _) => Peaks::Gpu(Some(d.clone())),
            Backend::Gpu { spec, .. } => Peaks::Gpu(spec.clone()),
        })
    }
}

/// Peaks per instruction, for "% of peak".
#[derive(Clone, Debug)]
pub enum Peaks {
    /// Measured on this CPU: (instruction id, GOP/s).
    Cpu(Vec<(String, f64)>),
    /// From the device table (none for a GPU the table lacks).
    Gpu(Option<DeviceSpec>),
}

/// The peaks a CPU's vectorized-loop fallback is reported against, the widest FMA first.
pub(crate) const FALLBACK_PEAKS: [&str; 2] = ["avx512.vfmadd231ps", "avx2.vfmadd231ps"];

/// The instruction a record's mapping label names (`amx.tdpbf16ps: m <- ...`).
pub fn instruction_of(mapping: Option<&str>) -> Option<&str> {
    mapping.and_then(|m| m.split(':').next())
}

impl Peaks {
    /// The peak GFLOP/s of the instruction a mapping label names; for the fallback (no
    /// mapping) the widest FMA on a CPU, the CUDA cores' fp32 FMA on a GPU.
    pub fn of(&self, mapping: Option<&str>) -> Option<f64> {
        match self {
            Peaks::Cpu(measured) => {
                let widest_fma = FALLBACK_PEAKS
                    .into_iter()
                    .find(|id| measured.iter().any(|(i, _)| i == *id))
                    .unwrap_or("avx2.vfmadd231ps");
                let id = instruction_of(mapping).unwrap_or(widest_fma);
                measured.iter().find(|(i, _)| i == id).map(|(_, g)| *g)
            }
            Peaks::Gpu(None) => None,
            Peaks::Gpu(Some(d)) => {
                let catalog = Catalog::default();
                let macs = match instruction_of(mapping).and_then(|id| catalog.get(id)) {
                    Some(i) => d.tc_macs_per_s(i.a),
                    None => d.fp32 * d.sms as f64 * d.clock_ghz * 1e9,
                };
                (macs > 0.0).then_some(2.0 * macs / 1e9)
            }
        }
    }
}

/// What the features know of the machine of `fp`: its caches and instructions and, for a
/// CPU, the code generator that will build its programs, which says how it emits each
/// tensorized call (schema v3's `compute.path_*` columns). Every featurisation in tessel
/// goes through here, so the data a model learns from and the search it ranks for see the
/// same columns.
pub fn feature_target(
    fp: &HardwareFingerprint,
) -> std::result::Result<tessel_features::Target, tessel_features::FeatureError> {
    // One backend for every target, so that targets of one machine stay equal.
    static CPU_PATHS: OnceLock<Arc<dyn CodePaths>> = OnceLock::new();
    let target = tessel_features::Target::from_fingerprint(fp)?;
    if target.gpu {
        return Ok(target);
    }
    let paths =
        CPU_PATHS.get_or_init(|| Arc::new(tessel_cpu::CpuCodePaths::new(Catalog::default())));
    Ok(target.with_code_paths(Arc::clone(paths)))
}

/// The CPU measurer, with its worker.
pub fn cpu_measurer(opts: &TargetOptions) -> Result<CpuMeasurer> {
    if opts.threads == 0 {
        bail!("threads must be at least 1");
    }
    let worker = crate::worker::worker_command("cpu", opts.worker_exe.as_deref())?;
    let cpu = CpuOptions {
        threads: opts.threads,
        emulate: opts.emulate,
        ..CpuOptions::default()
    };
    Ok(CpuMeasurer::new(worker, cpu)?)
}

#[cfg(feature = "cuda")]
fn open_gpu(opts: &TargetOptions) -> Result<(Backend, Option<(u32, u32)>)> {
    let worker = crate::worker::worker_command("gpu", opts.worker_exe.as_deref())?;
    let m =
        tessel_gpu::cuda::CudaMeasurer::new(worker, Default::default()).context("target gpu")?;
    let cc = m.compute_capability();
    let name = m.fingerprint().model.clone();
    Ok((
        Backend::Gpu {
            spec: tessel_gpu::device::spec_for(&name, cc),
            name,
            measurer: Box::new(m),
        },
        Some(cc),
    ))
}

#[cfg(not(feature = "cuda"))]
fn open_gpu(_opts: &TargetOptions) -> Result<(Backend, Option<(u32, u32)>)> {
    bail!(
        "target gpu: real GPU measurement needs a build with `--features cuda` (cargo run --release -p xtask --features cuda -- ...) on a machine with an NVIDIA driver; use `sim:NAME` for the analytical model"
    )
}
