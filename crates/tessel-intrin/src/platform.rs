//! The CPU tables: which instructions the CPU code generator supports, and the measurement
//! platforms datasets are collected on (an instruction family and its element type).

use crate::{Catalog, HostCpu, Support};

/// Instruction ids the CPU code generator supports, in the order benchmarks report them.
pub const CPU_INSTRUCTIONS: [&str; 10] = [
    "amx.tdpbf16ps",
    "amx.tdpbusd",
    "amx.tdpbssd",
    "avx512.vpdpbusd",
    "avx512.vdpbf16ps",
    "avx512.vfmadd231ps",
    "avxvnni.vpdpbusd",
    "avx2.vpmaddubsw",
    "avx2.vpmaddwd",
    "avx2.vfmadd231ps",
];

/// Instructions whose results depend on value ranges (`avx2.vpmaddubsw` saturates): generated
/// and benchmarked, but searched only when named (`tune --instructions avx2.vpmaddubsw`),
/// never by default, so that a default tune is always exact.
pub const OPT_IN_INSTRUCTIONS: [&str; 1] = ["avx2.vpmaddubsw"];

/// Whether instruction `id` is searched only when named ([`OPT_IN_INSTRUCTIONS`]).
pub fn is_opt_in(id: &str) -> bool {
    OPT_IN_INSTRUCTIONS.contains(&id)
}

/// What a CPU search uses unless told otherwise: [`CPU_INSTRUCTIONS`] less the opt-in ones.
pub fn default_cpu_instructions() -> impl Iterator<Item = &'static str> {
    CPU_INSTRUCTIONS.into_iter().filter(|id| !is_opt_in(id))
}

/// A CPU measurement platform: the instructions a dataset may use and its element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuPlatform {
    /// `avx2-fma`, `amx-bf16`, ...
    pub name: &'static str,
    /// Instruction ids from the catalog; empty for the compiler-vectorized fallback.
    pub instructions: &'static [&'static str],
    /// The element type of the operators measured on it (a `DType` name).
    pub dtype: &'static str,
    /// The weights' element type, where it differs (u8 activations x i8 weights).
    pub wdtype: Option<&'static str>,
}

/// Every CPU platform, best first (the default is the first this CPU can run).
pub const CPU_PLATFORMS: &[CpuPlatform] = &[
    CpuPlatform {
        name: "amx-bf16",
        instructions: &["amx.tdpbf16ps"],
        dtype: "bf16",
        wdtype: None,
    },
    CpuPlatform {
        name: "amx-int8",
        instructions: &["amx.tdpbusd", "amx.tdpbssd"],
        dtype: "u8",
        wdtype: Some("i8"),
    },
    CpuPlatform {
        name: "avx512-vnni",
        instructions: &["avx512.vpdpbusd"],
        dtype: "u8",
        wdtype: Some("i8"),
    },
    CpuPlatform {
        name: "avx512-bf16",
        instructions: &["avx512.vdpbf16ps"],
        dtype: "bf16",
        wdtype: None,
    },
    CpuPlatform {
        name: "avx512-fma",
        instructions: &["avx512.vfmadd231ps"],
        dtype: "f32",
        wdtype: None,
    },
    CpuPlatform {
        name: "avx-vnni",
        instructions: &["avxvnni.vpdpbusd"],
        dtype: "u8",
        wdtype: Some("i8"),
    },
    CpuPlatform {
        name: "avx2-fma",
        instructions: &["avx2.vfmadd231ps"],
        dtype: "f32",
        wdtype: None,
    },
    // u8 x i8 widened to i16 on the way in (convert-on-pack).
    CpuPlatform {
        name: "avx2-int8",
        instructions: &["avx2.vpmaddwd"],
        dtype: "u8",
        wdtype: Some("i8"),
    },
    // The saturating vpmaddubsw path (opt-in; what oneDNN runs on AVX2).
    CpuPlatform {
        name: "avx2-int8-saturating",
        instructions: &["avx2.vpmaddubsw"],
        dtype: "u8",
        wdtype: Some("i8"),
    },
    // bf16 and f16 converted to f32 on the way in, into the f32 FMA kernels.
    CpuPlatform {
        name: "avx2-bf16",
        instructions: &["avx2.vfmadd231ps"],
        dtype: "bf16",
        wdtype: None,
    },
    CpuPlatform {
        name: "avx2-f16",
        instructions: &["avx2.vfmadd231ps"],
        dtype: "f16",
        wdtype: None,
    },
    // The compiler-vectorized loop nests, no tensorized instruction.
    CpuPlatform {
        name: "scalar",
        instructions: &[],
        dtype: "f32",
        wdtype: None,
    },
];

/// An unknown platform name, with the known ones.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown platform `{name}` (one of {known})")]
pub struct UnknownPlatform {
    pub name: String,
    pub known: String,
}

impl CpuPlatform {
    /// The platform called `name`.
    pub fn named(name: &str) -> Result<&'static CpuPlatform, UnknownPlatform> {
        CPU_PLATFORMS
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| UnknownPlatform {
                name: name.to_string(),
                known: CPU_PLATFORMS
                    .iter()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// The best platform `host` runs natively (the fallback where it has no instruction).
    pub fn best_for(host: &HostCpu, catalog: &Catalog) -> &'static CpuPlatform {
        CPU_PLATFORMS
            .iter()
            .find(|p| p.supported(host, catalog).is_ok() && !p.instructions.is_empty())
            .unwrap_or(&CPU_PLATFORMS[CPU_PLATFORMS.len() - 1])
    }

    /// The operand types of the operators measured on it.
    pub fn types(&self) -> Result<tessel_ir::Types, tessel_ir::SpecError> {
        let dtype: tessel_ir::DType = self.dtype.parse()?;
        let wdtype = match self.wdtype {
            Some(w) => w.parse()?,
            None => dtype,
        };
        Ok(tessel_ir::Types { dtype, wdtype })
    }

    /// `Ok` where `host` runs every instruction of the platform; else the first it lacks and why.
    pub fn supported(&self, host: &HostCpu, catalog: &Catalog) -> Result<(), (String, String)> {
        for id in self.instructions {
            match catalog.get(id).map(|i| host.supports(i)) {
                Some(Support::Yes) => {}
                Some(Support::No(why)) => return Err((id.to_string(), why)),
                None => return Err((id.to_string(), "not in the catalog".into())),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_platform_names_catalog_instructions_and_a_dtype() {
        let catalog = Catalog::default();
        for p in CPU_PLATFORMS {
            assert!(p.types().is_ok(), "{}", p.name);
            for id in p.instructions {
                assert!(CPU_INSTRUCTIONS.contains(id), "{id}");
                assert!(catalog.get(id).is_some(), "{id}");
            }
        }
        assert_eq!(CpuPlatform::named("avx2-fma").map(|p| p.dtype), Ok("f32"));
        let e = CpuPlatform::named("avx9").unwrap_err().to_string();
        assert!(e.contains("avx9") && e.contains("scalar"), "{e}");
    }
}
