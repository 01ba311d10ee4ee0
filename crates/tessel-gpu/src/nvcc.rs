//! Compiles generated kernels with nvcc (no GPU needed) and reads `ptxas -v`: registers,
//! spills and shared memory per kernel.
//!
//! nvcc is found at `$TESSEL_NVCC`, then on `PATH`, then under `$CUDA_HOME`/`$CUDA_PATH`, then
//! in the Python virtual environment `.ci/run` makes (`target/nvcc-venv`, PyPI's
//! `nvidia-cuda-nvcc`, `nvidia-cuda-runtime` and `nvidia-cuda-cccl` wheels).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::GpuError;

/// What ptxas reported for one kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxasInfo {
    pub arch: String,
    pub registers: u32,
    pub spill_stores: u64,
    pub spill_loads: u64,
    /// Static shared memory (dynamic shared memory is not reported by ptxas).
    pub static_shared_bytes: u64,
}

/// An nvcc executable.
#[derive(Clone, Debug)]
pub struct Nvcc {
    pub path: PathBuf,
}

impl Nvcc {
    /// Finds nvcc, or says where it looked.
    pub fn find() -> Result<Nvcc, GpuError> {
        let mut tried = Vec::new();
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(p) = std::env::var_os("TESSEL_NVCC") {
            candidates.push(PathBuf::from(p));
        }
        if let Some(path) = std::env::var_os("PATH") {
            candidates.extend(std::env::split_paths(&path).map(|d| d.join("nvcc")));
        }
        for var in ["CUDA_HOME", "CUDA_PATH"] {
            if let Some(h) = std::env::var_os(var) {
                candidates.push(PathBuf::from(h).join("bin/nvcc"));
            }
        }
        // The workspace's target/nvcc-venv, from this crate's directory.
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        if let Ok(entries) = std::fs::read_dir(workspace.join("target/nvcc-venv/lib")) {
            for e in entries.flatten() {
                candidates.push(e.path().join("site-packages/nvidia/cu13/bin/nvcc"));
                candidates.push(e.path().join("site-packages/nvidia/cuda_nvcc/bin/nvcc"));
            }
        }
        for c in candidates {
            if c.is_file() {
                return Ok(Nvcc { path: c });
            }
            tried.push(c.display().to_string());
        }
        Err(GpuError::Toolchain(format!(
            "nvcc not found (set TESSEL_NVCC, or install PyPI's nvidia-cuda-nvcc, nvidia-cuda-runtime and nvidia-cuda-cccl as .ci/run does); looked at: {}",
            tried.join(", ")
        )))
    }

    /// Compiles `source` for `arch` (`sm_80`, `sm_90`) to a cubin and returns ptxas's report
    /// for `kernel`.
    pub fn compile(&self, source: &str, kernel: &str, arch: &str) -> Result<PtxasInfo, GpuError> {
        let (log, _) = self.run(source, arch, &["-cubin", "-Xptxas", "-v"], "kernel.cubin")?;
        parse_ptxas(&log, kernel, arch)
    }

    /// Compiles `source` to PTX for `arch`, the text the CUDA driver loads.
    pub fn ptx(&self, source: &str, arch: &str) -> Result<String, GpuError> {
        let (_, ptx) = self.run(source, arch, &["-ptx"], "kernel.ptx")?;
        String::from_utf8(ptx).map_err(|_| GpuError::Toolchain("nvcc wrote non-UTF-8 PTX".into()))
    }

    /// Runs nvcc on `source` in a fresh temporary directory; its log and the output file.
    fn run(
        &self,
        source: &str,
        arch: &str,
        flags: &[&str],
        output: &str,
    ) -> Result<(String, Vec<u8>), GpuError> {
        let dir = std::env::temp_dir().join(format!(
            "tessel-nvcc-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| GpuError::Toolchain(e.to_string()))?;
        let cu = dir.join("kernel.cu");
        std::fs::write(&cu, source).map_err(|e| GpuError::Toolchain(e.to_string()))?;
        let out = Command::new(&self.path)
            .arg(format!("-arch={arch}"))
            .args(flags)
            .arg("-o")
            .arg(dir.join(output))
            .arg(&cu)
            .output()
            .map_err(|e| GpuError::Toolchain(format!("{}: {e}", self.path.display())));
        let produced = std::fs::read(dir.join(output));
        let _ = std::fs::remove_dir_all(&dir);
        let out = out?;
        let log = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(GpuError::Toolchain(format!(
                "nvcc -arch={arch} failed:\n{log}"
            )));
        }
        let produced =
            produced.map_err(|e| GpuError::Toolchain(format!("nvcc wrote no {output}: {e}")))?;
        Ok((log, produced))
    }
}

static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Reads `ptxas info` lines for one kernel.
pub fn parse_ptxas(log: &str, kernel: &str, arch: &str) -> Result<PtxasInfo, GpuError> {
    let mut info = PtxasInfo {
        arch: arch.to_string(),
        registers: 0,
        spill_stores: 0,
        spill_loads: 0,
        static_shared_bytes: 0,
    };
    let mut inside = false;
    let mut found = false;
    let number_before = |line: &str, word: &str| -> Option<u64> {
        let i = line.find(word)?;
        line[..i].split_whitespace().last()?.parse().ok()
    };
    for line in log.lines() {
        if line.contains("Compiling entry function") || line.contains("Function properties for") {
            inside = line.contains(&format!("'{kernel}'")) || line.ends_with(kernel);
            continue;
        }
        if !inside {
            continue;
        }
        if let Some(s) = number_before(line, "bytes spill stores") {
            info.spill_stores = s;
        }
        if let Some(s) = number_before(line, "bytes spill loads") {
            info.spill_loads = s;
        }
        if line.contains("Used") && line.contains("registers") {
            found = true;
            if let Some(r) = number_before(line, "registers") {
                info.registers = r as u32;
            }
            if let Some(s) = number_before(line, "bytes smem") {
                info.static_shared_bytes = s;
            }
        }
    }
    if !found {
        return Err(GpuError::Toolchain(format!(
            "no ptxas report for `{kernel}` in:\n{log}"
        )));
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_reports_parse() {
        let log = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'tc' for 'sm_80'\n\
ptxas info    : Function properties for tc\n\
    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n\
ptxas info    : Used 87 registers, used 1 barriers, 512 bytes smem, 384 bytes cmem[0]\n";
        let i = parse_ptxas(log, "tc", "sm_80").unwrap();
        assert_eq!(
            (
                i.registers,
                i.spill_stores,
                i.spill_loads,
                i.static_shared_bytes
            ),
            (87, 8, 4, 512)
        );
        assert!(parse_ptxas(log, "other", "sm_80").is_err());
    }
}
