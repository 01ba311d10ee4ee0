//! Shared helpers of tessel-cpu's tests.
#![allow(dead_code)]

use std::time::Duration;

use tessel_cpu::{Compiler, CpuMeasurer, CpuOptions, TimingOptions, WorkerCommand};
use tessel_intrin::{Catalog, HostCpu, Support};

#[allow(unused_imports)]
pub use tessel_cpu::reference::CPU_INSTRUCTIONS;

/// A measurer for correctness tests: one timed run, instructions this CPU lacks emulated.
pub fn measurer(emulate: bool) -> CpuMeasurer {
    let opts = CpuOptions {
        emulate,
        timing: TimingOptions::single_run(),
        timeout: Duration::from_secs(120),
        ..CpuOptions::default()
    };
    measurer_with(opts)
}

/// A measurer with these options, on the test worker and the tests' compiler cache.
pub fn measurer_with(opts: CpuOptions) -> CpuMeasurer {
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("tessel-cpu-cache");
    measurer_in(&cache, opts)
}

/// A measurer with these options compiling into `cache`.
pub fn measurer_in(cache: &std::path::Path, opts: CpuOptions) -> CpuMeasurer {
    CpuMeasurer::with_compiler(
        WorkerCommand::new(env!("CARGO_BIN_EXE_tessel-cpu-worker")),
        opts,
        Compiler::new(cache).expect("a C compiler is installed (.ci/run installs one)"),
    )
    .expect("measurer")
}

/// Says (on stderr) which instructions only ran on the emulation here.
pub fn report_emulated(ids: &[&str]) {
    let host = HostCpu::detect();
    let catalog = Catalog::default();
    for id in ids {
        if let Some(intr) = catalog.get(id)
            && let Support::No(why) = host.supports(intr)
        {
            eprintln!("note: {id} checked on the scalar emulation only ({why})");
        }
    }
}

/// The (A, B) dtypes of an instruction, as a workload spec fragment.
pub fn dtypes(id: &str) -> String {
    let spec = tessel_cpu::reference::gemm_spec(id, 1, 1, 1);
    spec.split_once(",dtype=")
        .map(|(_, t)| format!("dtype={t}"))
        .unwrap_or_default()
}

/// A xorshift generator: random cases from a proptest seed, the same on every machine.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// `label: error` for each candidate that did not measure.
pub fn failures(labels: &[String], results: &[tessel_measure::MeasureResult]) -> Vec<String> {
    labels
        .iter()
        .zip(results)
        .filter_map(|(l, r)| r.as_ref().err().map(|e| format!("{l}: {e}")))
        .collect()
}

/// Panics with every candidate that did not measure.
pub fn assert_all_ok(labels: &[String], results: &[tessel_measure::MeasureResult]) {
    let failures = failures(labels, results);
    assert!(
        failures.is_empty(),
        "{} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
