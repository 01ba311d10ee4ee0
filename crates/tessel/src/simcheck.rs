//! `sim_check`: how well the analytical GPU model ranks measured GPU records. Each
//! successful record of a workload is scored by `sim:DEVICE` and the ranking is judged against
//! the measured latencies with the cost model's metrics.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use tessel_intrin::Catalog;
use tessel_model::metrics::{Metrics, Ranked, evaluate, random_baseline};

use crate::error::{Result, bail};
use crate::progress::Progress;
use crate::tune::read_log_noting;

/// How the analytical model ranks measured records.
#[derive(Clone, Debug, Serialize)]
pub struct SimCheckReport {
    /// The model's device (`sim:h200`).
    pub device: String,
    /// Records ranked.
    pub records: usize,
    /// Workloads ranked.
    pub workloads: usize,
    /// Records the model could not score (codegen refused, does not fit the device).
    pub unscored: usize,
    /// The model's ranking.
    pub model: Metrics,
    /// A random ranking.
    pub random: Metrics,
    /// Median of estimate / measured latency (how far the absolute figures are off).
    pub median_estimate_over_measured: f64,
}

/// Scores each successful record of `data` with the analytical model of `device` (faster
/// estimate, higher score) and judges the ranking against the measured latencies.
pub fn sim_check(data: &Path, device: &str, progress: &mut dyn Progress) -> Result<SimCheckReport> {
    let dev = tessel_gpu::device(device)?;
    if !data.exists() {
        bail!("{}: no such records file", data.display());
    }
    let contents = read_log_noting(data, progress)?;
    if let Some(r) = contents
        .records
        .iter()
        .find(|r| !matches!(r.fingerprint.kind.as_str(), "gpu" | "sim"))
    {
        bail!(
            "{}: records of a {} machine ({}); sim-check compares the GPU model with GPU measurements",
            data.display(),
            r.fingerprint.kind,
            r.fingerprint.model
        );
    }
    if contents.records.iter().any(|r| r.fingerprint.kind == "sim") {
        progress.note(&format!(
            "note: {} holds analytical-model records: this compares two models, not model and GPU",
            data.display()
        ));
    }
    let catalog = Catalog::default();
    let mut by_workload: BTreeMap<&str, Ranked> = BTreeMap::new();
    let (mut unscored, mut ratios) = (0usize, Vec::new());
    for r in &contents.records {
        let Some(latency) = r.latency() else { continue };
        let estimate = r
            .program(&catalog)
            .ok()
            .and_then(|p| tessel_gpu::estimate(&p, &dev).ok());
        let Some(e) = estimate else {
            unscored += 1;
            continue;
        };
        ratios.push(e.latency_s / latency);
        let t = by_workload.entry(&r.workload).or_insert_with(|| Ranked {
            weight: 1.0,
            predicted: Vec::new(),
            latency: Vec::new(),
        });
        t.predicted.push(-e.latency_s);
        t.latency.push(latency);
    }
    let tasks: Vec<Ranked> = by_workload
        .into_values()
        .filter(|t| t.latency.len() >= 2)
        .collect();
    if tasks.is_empty() {
        bail!(
            "{}: no workload with two or more scored, successful records ({} records, {unscored} unscored)",
            data.display(),
            contents.records.len()
        );
    }
    ratios.sort_by(f64::total_cmp);
    let report = SimCheckReport {
        device: format!("sim:{}", dev.key),
        records: tasks.iter().map(|t| t.latency.len()).sum(),
        workloads: tasks.len(),
        unscored,
        model: evaluate(&tasks),
        random: random_baseline(&tasks, 20, 1),
        median_estimate_over_measured: ratios[ratios.len() / 2],
    };
    Ok(report)
}
