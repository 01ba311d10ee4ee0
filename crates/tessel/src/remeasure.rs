//! `remeasure`: records of a dataset measured again on this machine and appended, so that
//! they supersede the old ones. Logs are append-only; readers keep the latest record of each
//! schedule ([`tessel_search::supersede`]). The use: a code-generation fix changed what some
//! traces build, and their records describe kernels that no longer exist.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use tessel_cpu::CpuMeasurer;
use tessel_ir::Workload;
use tessel_measure::{Candidate, Measurer};
use tessel_search::{RecordLog, TuningRecord, cut_short_budget};

use crate::data::network_filter;
use crate::error::{Context, Result, bail};
use crate::progress::Progress;
use crate::target::{TargetOptions, cpu_measurer};
use crate::tune::read_log_noting;

/// Which records to measure again, and where the new ones go.
#[derive(Clone, Debug, Default)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct RemeasureOptions {
    /// The dataset whose records to measure again (JSON Lines, or gzip-compressed `.gz`).
    #[cfg_attr(feature = "clap", arg(long))]
    pub dataset: PathBuf,
    /// Where the new records are appended (default: the dataset, which must then be plain
    /// JSON Lines). Read it after the dataset: a later record of a schedule supersedes it.
    #[cfg_attr(feature = "clap", arg(long))]
    pub out: Option<PathBuf>,
    /// Only records measured before this time (Unix seconds, as records carry it). The new
    /// records are later, so a rerun resumes where a killed one stopped.
    #[cfg_attr(feature = "clap", arg(long))]
    pub before: Option<f64>,
    /// Only records whose kernel, as today's code generator builds it, contains this text
    /// (a comment a fix added, say).
    #[cfg_attr(feature = "clap", arg(long))]
    pub source_contains: Option<String>,
    /// Only records whose kernel digest differs from that of the kernel today's code
    /// generator builds of their trace (records without a digest are never selected by it).
    #[cfg_attr(feature = "clap", arg(long))]
    pub changed: bool,
    /// Only records that carry no kernel digest: measured before records had one, by a
    /// generator that may have built other code for their trace than today's (`--changed`
    /// cannot tell for them).
    #[cfg_attr(feature = "clap", arg(long))]
    pub undigested: bool,
    /// Only records cut short after their checked run: measured by one cold call, before a
    /// warm run had to confirm it (a fast kernel with a large static packed buffer paid for
    /// its first touch and was cut).
    #[cfg_attr(feature = "clap", arg(long))]
    pub cut_short: bool,
    /// Only records whose median run took more than this many times their fastest (a run
    /// disturbed by something else on the machine; 1.5 selects 3% of the Zen 4 FMA set).
    #[cfg_attr(feature = "clap", arg(long))]
    pub spread_above: Option<f64>,
    /// Only the tasks of these networks, comma separated.
    #[cfg_attr(feature = "clap", arg(long = "network", value_delimiter = ','))]
    pub networks: Vec<String>,
    /// Every record the other filters keep; without a filter, `--all` is needed to measure
    /// a whole dataset again.
    #[cfg_attr(feature = "clap", arg(long))]
    pub all: bool,
    /// Count what would be measured again, by task; measure nothing.
    #[cfg_attr(feature = "clap", arg(long))]
    pub dry_run: bool,
    /// OpenMP threads per kernel (records measured with another count are another machine's).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1))]
    pub threads: usize,
    /// The measurement worker executable (default: this program).
    #[cfg_attr(feature = "clap", arg(skip))]
    pub worker_exe: Option<PathBuf>,
}

/// What `remeasure` selected and measured.
#[derive(Clone, Debug, Serialize)]
pub struct RemeasureReport {
    /// Records of the dataset (and of `out`), superseded ones left out.
    pub records: usize,
    /// Of which the filters selected.
    pub selected: usize,
    /// Selected records of another machine, compiler or thread count: left alone (this
    /// machine cannot supersede them).
    pub other_machine: usize,
    /// Selected records per task (workload spec), most first.
    pub by_task: Vec<(String, usize)>,
    /// Records measured and appended.
    pub measured: usize,
    /// Of which failed.
    pub errors: usize,
    /// Geometric mean of new / old latency over the pairs where both succeeded and neither
    /// was censored (a lower bound).
    pub geomean_ratio: Option<f64>,
    /// The largest changes, old and new median latency in ms, largest |log ratio| first.
    pub largest_changes: Vec<Change>,
    /// Where the new records went.
    pub out: PathBuf,
    /// Wall time, s.
    pub seconds: f64,
}

/// One record's latency before and after.
#[derive(Clone, Debug, Serialize)]
pub struct Change {
    /// The workload spec.
    pub workload: String,
    /// The old record's median, ms.
    pub old_ms: f64,
    /// The new record's median, ms.
    pub new_ms: f64,
}

/// How many of the largest changes a report lists.
const LARGEST_CHANGES: usize = 10;
/// Records measured per batch (one compile, the next batch compiling meanwhile).
const BATCH: usize = 16;

/// Selects records of `o.dataset` and measures them again on this CPU, appending the new
/// records to `o.out` (default: the dataset).
pub fn remeasure(o: &RemeasureOptions, progress: &mut dyn Progress) -> Result<RemeasureReport> {
    let selecting = o.before.is_some()
        || o.source_contains.is_some()
        || o.changed
        || o.undigested
        || o.cut_short
        || o.spread_above.is_some()
        || !o.networks.is_empty();
    if !selecting && !o.all {
        bail!(
            "name what to measure again: --before TIME, --source-contains TEXT, --changed, --undigested, --cut-short, --spread-above RATIO or --network; or --all for every record"
        );
    }
    if let Some(r) = o.spread_above
        && !(r.is_finite() && r >= 1.0)
    {
        bail!("--spread-above {r} is not a ratio of at least 1 (median over fastest run)");
    }
    if let Some(t) = o.before
        && !t.is_finite()
    {
        bail!("--before {t} is not a time");
    }
    if o.source_contains.as_deref() == Some("") {
        bail!("--source-contains needs some text: every kernel contains the empty string");
    }
    if !o.dataset.exists() {
        bail!("{}: no such dataset file", o.dataset.display());
    }
    let out = o.out.clone().unwrap_or_else(|| o.dataset.clone());
    if out.extension().is_some_and(|e| e == "gz") {
        bail!(
            "{}: new records cannot be appended to a compressed file; give --out NEW.jsonl (and read it after the dataset)",
            out.display()
        );
    }
    let only = network_filter(&o.networks)?;
    let measurer = cpu_measurer(&TargetOptions {
        threads: o.threads,
        worker_exe: o.worker_exe.clone(),
        ..TargetOptions::default()
    })?;
    let fp = measurer.fingerprint().clone();

    // The latest record of each schedule, over the dataset and what earlier runs appended.
    let mut all = read_log_noting(&o.dataset, progress)?.records;
    if out != o.dataset {
        all.extend(read_log_noting(&out, progress)?.records);
    }
    let all = tessel_search::supersede(all);

    let mut selected: Vec<&TuningRecord> = Vec::new();
    let mut other_machine = 0usize;
    for r in &all {
        if o.before.is_some_and(|t| r.time >= t) {
            continue;
        }
        if only.as_ref().is_some_and(|s| !s.contains(&r.workload)) {
            continue;
        }
        if !r.target.starts_with("cpu") {
            continue;
        }
        if o.cut_short && !r.result.as_ref().is_ok_and(|m| m.cut_short) {
            continue;
        }
        if o.undigested && r.result.as_ref().is_ok_and(|m| m.kernel.is_some()) {
            continue;
        }
        if let Some(ratio) = o.spread_above
            && !r
                .result
                .as_ref()
                .is_ok_and(|m| m.timing.median_s > ratio * m.timing.min_s)
        {
            continue;
        }
        if (o.changed || o.source_contains.is_some()) && !code_selects(o, &measurer, r)? {
            continue;
        }
        if r.fingerprint.key() != fp.key() {
            other_machine += 1;
            continue;
        }
        selected.push(r);
    }
    if other_machine > 0 {
        progress.note(&format!(
            "note: {other_machine} selected records were measured on another machine, compiler or thread count; this one is `{}`",
            fp.key()
        ));
    }
    let mut by_task: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &selected {
        *by_task.entry(r.workload.as_str()).or_default() += 1;
    }
    let mut by_task: Vec<(String, usize)> = by_task
        .into_iter()
        .map(|(w, n)| (w.to_string(), n))
        .collect();
    by_task.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut report = RemeasureReport {
        records: all.len(),
        selected: selected.len(),
        other_machine,
        by_task,
        measured: 0,
        errors: 0,
        geomean_ratio: None,
        largest_changes: Vec::new(),
        out: out.clone(),
        seconds: 0.0,
    };
    if o.dry_run || selected.is_empty() {
        return Ok(report);
    }

    let start = Instant::now();
    let mut measurer = measurer;
    let mut log = RecordLog::open(&out)?;
    // Each task's best on this machine, over its records that are not being replaced: the
    // budget that cuts a slow schedule short, as in `dataset`.
    let mut best: BTreeMap<&str, f64> = BTreeMap::new();
    let replaced: std::collections::HashSet<_> = selected.iter().map(|r| r.key()).collect();
    for r in &all {
        if r.fingerprint.key() != fp.key() || replaced.contains(&r.key()) {
            continue;
        }
        if let Ok(m) = &r.result
            && !m.emulated
            && !m.censored
        {
            let b = best.entry(r.workload.as_str()).or_insert(f64::INFINITY);
            *b = b.min(m.timing.median_s);
        }
    }
    // Task by task, so that batches share an operator.
    selected.sort_by(|a, b| a.workload.cmp(&b.workload));
    let mut log_ratios: Vec<(f64, Change)> = Vec::new();
    progress.start("records", selected.len() as u64);
    let chunks: Vec<&[&TuningRecord]> = selected
        .chunk_by(|a, b| a.workload == b.workload)
        .flat_map(|task| task.chunks(BATCH))
        .collect();
    let candidates = |chunk: &[&TuningRecord]| -> Result<(Workload, Vec<Candidate>)> {
        let w: Workload = chunk[0]
            .workload
            .parse()
            .with_context(|| format!("workload `{}`", chunk[0].workload))?;
        let budget = best
            .get(chunk[0].workload.as_str())
            .filter(|b| b.is_finite())
            .map(|b| cut_short_budget(*b));
        let batch = chunk
            .iter()
            .map(|r| Candidate {
                budget_s: budget,
                ..Candidate::new(w.to_op(), r.trace.clone())
            })
            .collect();
        Ok((w, batch))
    };
    for (n, chunk) in chunks.iter().enumerate() {
        let (w, batch) = candidates(chunk)?;
        // The next batch compiles on the other core while this one is measured.
        if let Some(next) = chunks.get(n + 1) {
            measurer.prefetch(&candidates(next)?.1);
        }
        let results = measurer.measure(&batch);
        let mut records = Vec::with_capacity(chunk.len());
        for (old, result) in chunk.iter().zip(results) {
            report.errors += usize::from(result.is_err());
            // Censored timings are lower bounds (at another deadline before): no ratio.
            if let (Some(before), Ok(after)) = (old.latency(), &result)
                && old.result.as_ref().is_ok_and(|m| !m.censored)
                && !after.emulated
                && !after.censored
                && before > 0.0
            {
                let change = Change {
                    workload: old.workload.clone(),
                    old_ms: before * 1e3,
                    new_ms: after.timing.median_s * 1e3,
                };
                log_ratios.push(((after.timing.median_s / before).ln(), change));
            }
            let mut record = TuningRecord::new(
                &w,
                &old.target,
                fp.clone(),
                old.trace.clone(),
                old.mapping.clone(),
                result,
            );
            record.sampler = old.sampler.clone();
            records.push(record);
        }
        log.append(&records)?;
        report.measured += records.len();
        progress.update(report.measured as u64, &chunk[0].workload);
    }
    progress.finish();
    if !log_ratios.is_empty() {
        let mean = log_ratios.iter().map(|(l, _)| l).sum::<f64>() / log_ratios.len() as f64;
        report.geomean_ratio = Some(mean.exp());
    }
    log_ratios.sort_by(|a, b| b.0.abs().total_cmp(&a.0.abs()));
    report.largest_changes = log_ratios
        .into_iter()
        .take(LARGEST_CHANGES)
        .map(|(_, c)| c)
        .collect();
    report.seconds = start.elapsed().as_secs_f64();
    Ok(report)
}

/// Whether the code today's generator builds of `r`'s trace passes the options' code
/// filters (`--changed`, `--source-contains`). A trace that no longer lowers or generates
/// is selected: measuring it again records today's error in place of a stale timing.
fn code_selects(o: &RemeasureOptions, measurer: &CpuMeasurer, r: &TuningRecord) -> Result<bool> {
    let w: Workload = r
        .workload
        .parse()
        .with_context(|| format!("workload `{}`", r.workload))?;
    let Ok(job) = measurer.prepare(&Candidate::new(w.to_op(), r.trace.clone()), "kernel") else {
        return Ok(true);
    };
    if let Some(text) = &o.source_contains
        && !job.kernel.source.contains(text.as_str())
    {
        return Ok(false);
    }
    if o.changed {
        let recorded = r.result.as_ref().ok().and_then(|m| m.kernel.as_deref());
        return Ok(recorded.is_some_and(|d| d != job.kernel.digest()));
    }
    Ok(true)
}
