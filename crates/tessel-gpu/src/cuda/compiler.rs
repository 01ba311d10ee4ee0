//! Source to PTX: NVRTC when `libnvrtc` loads (headers from `$TESSEL_CUDA_INCLUDE`,
//! `$CUDA_HOME` or next to nvcc), else `nvcc -ptx`.

use super::*;

/// Turns CUDA C++ into PTX: NVRTC when its library loads, else nvcc.
#[derive(Clone, Debug)]
pub enum PtxCompiler {
    Nvrtc { include_paths: Vec<String> },
    Nvcc(Nvcc),
}

impl PtxCompiler {
    /// NVRTC if `libnvrtc` can be loaded (the CUDA headers it needs beyond its built-in ones
    /// are looked for next to nvcc, under `$CUDA_HOME` and in `$TESSEL_CUDA_INCLUDE`), else
    /// nvcc; an error that says where it looked when neither is there.
    pub fn find() -> Result<PtxCompiler, GpuError> {
        // SAFETY: only tries to dlopen the library.
        if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Ok(PtxCompiler::Nvrtc {
                include_paths: cuda_include_dirs(),
            });
        }
        Nvcc::find().map(PtxCompiler::Nvcc).map_err(|e| {
            GpuError::Toolchain(format!(
                "no CUDA compiler: libnvrtc.so did not load (put it on LD_LIBRARY_PATH, e.g. from PyPI's nvidia-cuda-nvrtc-cu12) and {e}"
            ))
        })
    }

    pub fn name(&self) -> String {
        match self {
            PtxCompiler::Nvrtc { .. } => {
                let mut v = (0, 0);
                // SAFETY: the library is loaded (checked in `find`).
                let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut v.0, &mut v.1) };
                if r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
                    format!("nvrtc {}.{}", v.0, v.1)
                } else {
                    "nvrtc".into()
                }
            }
            PtxCompiler::Nvcc(n) => format!("nvcc ({})", n.path.display()),
        }
    }

    /// PTX for `arch` (`sm_80`, `sm_90`, ...).
    pub fn ptx(&self, source: &str, arch: &str) -> Result<String, GpuError> {
        match self {
            PtxCompiler::Nvrtc { include_paths } => {
                let opts = cudarc::nvrtc::CompileOptions {
                    include_paths: include_paths.clone(),
                    options: vec![format!("--gpu-architecture={arch}"), "-std=c++17".into()],
                    ..Default::default()
                };
                if source.contains('\0') {
                    return Err(GpuError::Toolchain("source contains a NUL byte".into()));
                }
                let ptx =
                    cudarc::nvrtc::compile_ptx_with_opts(source, opts).map_err(|e| match e {
                        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                            GpuError::Toolchain(format!(
                                "NVRTC rejected the kernel ({arch}):\n{}",
                                log.to_string_lossy()
                            ))
                        }
                        other => GpuError::Toolchain(format!("NVRTC failed: {other}")),
                    })?;
                Ok(ptx.to_src())
            }
            PtxCompiler::Nvcc(n) => n.ptx(source, arch),
        }
    }
}

/// Directories with the CUDA headers generated kernels include (`mma.h`, `cuda_fp16.h`).
pub(super) fn cuda_include_dirs() -> Vec<String> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("TESSEL_CUDA_INCLUDE") {
        dirs.extend(std::env::split_paths(&d));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(h) = std::env::var_os(var) {
            dirs.push(PathBuf::from(h).join("include"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/include"));
    if let Ok(n) = Nvcc::find()
        && let Some(bin) = n.path.parent()
        && let Some(root) = bin.parent()
    {
        dirs.push(root.join("include"));
    }
    dirs.into_iter()
        .filter(|d| d.join("mma.h").is_file() || d.join("cuda_fp16.h").is_file())
        .map(|d| d.display().to_string())
        .collect()
}
