//! `cargo xtask sim-check`: how well the analytical GPU model ranks measured records. Each
//! successful record of a workload is scored by `sim:DEVICE` (faster estimate, higher score)
//! and the ranking is judged against the measured latencies with the cost model's metrics.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Result, bail};
use serde::Serialize;
use tessel_intrin::Catalog;
use tessel_ir::Workload;
use tessel_model::metrics::{Metrics, Ranked, evaluate, random_baseline};

use crate::tune::read_log_warning;

#[derive(Serialize)]
struct SimCheckReport {
    device: String,
    records: usize,
    workloads: usize,
    /// Records the model could not score (codegen refused, does not fit the device).
    unscored: usize,
    model: Metrics,
    random: Metrics,
    /// Median of estimate / measured latency (how far the absolute figures are off).
    median_estimate_over_measured: f64,
}

pub fn sim_check(data: &Path, device: &str, json: bool) -> Result<()> {
    let dev = tessel_gpu::device(device)?;
    let contents = read_log_warning(data)?;
    if contents.records.iter().any(|r| r.fingerprint.kind == "sim") && !json {
        eprintln!(
            "note: {} holds analytical-model records: this compares two models, not model and GPU",
            data.display()
        );
    }
    let catalog = Catalog::default();
    let mut by_workload: BTreeMap<&str, Ranked> = BTreeMap::new();
    let (mut unscored, mut ratios) = (0usize, Vec::new());
    for r in &contents.records {
        let Some(latency) = r.latency() else { continue };
        let Ok(w) = r.workload.parse::<Workload>() else {
            unscored += 1;
            continue;
        };
        let estimate = r
            .trace
            .lower(&w.to_op(), &catalog)
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
    if json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "sim:{} (analytical model) ranking {} measured records of {} workloads ({} unscored)",
        dev.key, report.records, report.workloads, report.unscored
    );
    println!(
        "{:>8} {:>7} {:>7} {:>9} {:>8}",
        "", "top-1", "top-5", "pairwise", "tau"
    );
    for (name, m) in [("model", &report.model), ("random", &report.random)] {
        println!(
            "{name:>8} {:>7.3} {:>7.3} {:>9.3} {:>8.3}",
            m.top1, m.top5, m.pairwise_accuracy, m.kendall_tau
        );
    }
    println!(
        "median estimate / measured latency: {:.2}",
        report.median_estimate_over_measured
    );
    Ok(())
}
