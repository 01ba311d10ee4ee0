//! The hardware fingerprint every CPU result carries.

use std::collections::BTreeMap;

use tessel_intrin::HostCpu;
use tessel_measure::HardwareFingerprint;

/// This machine's fingerprint, for measurements on `threads` cores with `compiler`.
pub fn fingerprint(threads: usize, compiler: &str) -> HardwareFingerprint {
    let host = HostCpu::detect();
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        cpuinfo
            .lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "?".into())
    };
    let mut features: Vec<String> = host.features.iter().cloned().collect();
    if host.amx_permitted {
        features.push("amx_permitted".into());
    }
    HardwareFingerprint {
        kind: "cpu".into(),
        model: host.model.clone(),
        vendor: host.vendor.clone(),
        version: format!(
            "family {} model {} stepping {}",
            field("cpu family"),
            field("model"),
            field("stepping")
        ),
        features,
        cores_used: threads as u32,
        cores_available: host.logical_cores as u32,
        caches: caches(),
        compiler: compiler.to_string(),
    }
}

/// Cache sizes of cpu0 from sysfs: `l1d`, `l1i`, `l2`, `l3` in bytes.
fn caches() -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let base = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let Ok(dir) = std::fs::read_dir(base) else {
        return out;
    };
    for e in dir.flatten() {
        let p = e.path();
        let read = |f: &str| {
            std::fs::read_to_string(p.join(f))
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        let (level, kind, size) = (read("level"), read("type"), read("size"));
        let bytes = match size.strip_suffix('K') {
            Some(k) => k.parse::<u64>().ok().map(|k| k * 1024),
            None => match size.strip_suffix('M') {
                Some(m) => m.parse::<u64>().ok().map(|m| m << 20),
                None => size.parse().ok(),
            },
        };
        let name = match kind.as_str() {
            "Data" => format!("l{level}d"),
            "Instruction" => format!("l{level}i"),
            _ => format!("l{level}"),
        };
        if let Some(b) = bytes {
            out.insert(name, b);
        }
    }
    out
}
