//! What the local CPU supports, detected at run time.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use serde::Serialize;

use crate::desc::{Intrinsic, Platform, Requirement};

/// The local CPU: vendor, model name, core count and the features tessel cares about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HostCpu {
    pub vendor: String,
    pub model: String,
    pub logical_cores: usize,
    /// Feature names as in /proc/cpuinfo: `avx2`, `fma`, `avx512f`, `avx512_vnni`,
    /// `avx512_bf16`, `avx512_fp16`, `avx_vnni`, `avx_vnni_int8`, `amx_tile`, `amx_bf16`,
    /// `amx_int8`.
    pub features: BTreeSet<String>,
    /// Whether the OS granted this process AMX tile data (Linux arch_prctl). Without it the
    /// first tile instruction faults, so AMX counts as unsupported.
    pub amx_permitted: bool,
}

/// Whether an instruction can run here, and if not, why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Support {
    Yes,
    No(String),
}

impl HostCpu {
    /// Detects once per process (and requests AMX permission once, as the kernel wants).
    pub fn detect() -> &'static HostCpu {
        static HOST: OnceLock<HostCpu> = OnceLock::new();
        HOST.get_or_init(detect)
    }

    pub fn has(&self, feature: &str) -> bool {
        self.features.contains(feature)
    }

    /// Whether `intr` can execute on this CPU.
    pub fn supports(&self, intr: &Intrinsic) -> Support {
        if intr.platform != Platform::X86 {
            return Support::No("a GPU instruction".into());
        }
        let Requirement::CpuFeatures(needed) = &intr.requires else {
            return Support::No("not a CPU requirement".into());
        };
        let missing: Vec<&str> = needed.iter().copied().filter(|f| !self.has(f)).collect();
        if !missing.is_empty() {
            return Support::No(format!("CPU lacks {}", missing.join(", ")));
        }
        if needed.iter().any(|f| f.starts_with("amx")) && !self.amx_permitted {
            return Support::No("the OS refused AMX tile data to this process".into());
        }
        Support::Yes
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> HostCpu {
    use std::arch::x86_64::{__cpuid, __cpuid_count};

    let mut features = BTreeSet::new();
    let mut add = |name: &str, present: bool| {
        if present {
            features.insert(name.to_string());
        }
    };
    // std's detection checks both CPUID and that the OS saves the registers (XCR0).
    add("avx2", std::arch::is_x86_feature_detected!("avx2"));
    add("fma", std::arch::is_x86_feature_detected!("fma"));
    add("avx512f", std::arch::is_x86_feature_detected!("avx512f"));
    add(
        "avx512_vnni",
        std::arch::is_x86_feature_detected!("avx512vnni"),
    );
    add(
        "avx512_bf16",
        std::arch::is_x86_feature_detected!("avx512bf16"),
    );
    add(
        "avx512_fp16",
        std::arch::is_x86_feature_detected!("avx512fp16"),
    );
    // AMX: CPUID leaf 7, EDX bits 22 (bf16), 24 (tile), 25 (int8).
    let max_leaf = __cpuid(0).eax;
    if max_leaf >= 7 {
        let l7 = __cpuid_count(7, 0);
        add("amx_bf16", l7.edx & (1 << 22) != 0);
        add("amx_tile", l7.edx & (1 << 24) != 0);
        add("amx_int8", l7.edx & (1 << 25) != 0);
        // AVX-VNNI (the VEX form): leaf 7 sub-leaf 1, EAX bit 4; usable when the OS saves
        // the ymm state, which the avx2 check above includes.
        let l7_1 = __cpuid_count(7, 1);
        let ymm = std::arch::is_x86_feature_detected!("avx2");
        add("avx_vnni", ymm && l7_1.eax & (1 << 4) != 0);
        // AVX-VNNI-INT8: leaf 7 sub-leaf 1, EDX bit 4.
        add("avx_vnni_int8", ymm && l7_1.edx & (1 << 4) != 0);
    }
    let amx_permitted = features.contains("amx_tile") && request_amx_permission();
    let (vendor, model) = cpu_names();
    HostCpu {
        vendor,
        model,
        logical_cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        features,
        amx_permitted,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> HostCpu {
    HostCpu {
        vendor: "unknown".into(),
        model: std::env::consts::ARCH.into(),
        logical_cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        features: BTreeSet::new(),
        amx_permitted: false,
    }
}

/// Asks Linux for the AMX tile-data state (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 18).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_amx_permission() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes this process's permitted xsave
    // features; it reads and writes no memory of ours.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    rc == 0
}

#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn request_amx_permission() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
fn cpu_names() -> (String, String) {
    use std::arch::x86_64::__cpuid;
    let l0 = __cpuid(0);
    let mut vendor = Vec::new();
    for r in [l0.ebx, l0.edx, l0.ecx] {
        vendor.extend_from_slice(&r.to_le_bytes());
    }
    let mut model = Vec::new();
    if __cpuid(0x8000_0000).eax >= 0x8000_0004 {
        for leaf in 0x8000_0002u32..=0x8000_0004 {
            let r = __cpuid(leaf);
            for x in [r.eax, r.ebx, r.ecx, r.edx] {
                model.extend_from_slice(&x.to_le_bytes());
            }
        }
    }
    let clean = |b: Vec<u8>| {
        String::from_utf8_lossy(&b)
            .trim_matches(char::from(0))
            .trim()
            .to_string()
    };
    (clean(vendor), clean(model))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::catalog;

    #[test]
    fn detection_is_consistent_and_gpu_instructions_are_never_host_supported() {
        let host = HostCpu::detect();
        assert!(host.logical_cores >= 1);
        // AMX permission is only ever granted where the CPU has AMX.
        assert!(!host.amx_permitted || host.has("amx_tile"));
        for i in catalog() {
            match (i.platform, host.supports(&i)) {
                (Platform::Nvidia, Support::Yes) => panic!("{} on a CPU", i.id),
                (Platform::X86, Support::No(why)) => assert!(!why.is_empty()),
                _ => {}
            }
        }
        // Same answer twice: detection runs once per process.
        assert!(std::ptr::eq(host, HostCpu::detect()));
    }
}
