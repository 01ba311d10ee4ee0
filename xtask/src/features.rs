//! `cargo xtask features`: the allocation features of one candidate, column by column.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use tessel::features::{COLUMNS, Column, Features, SCHEMA_VERSION, Source, extract};
use tessel::intrin::Catalog;
use tessel::ir::{Program, Trace, Workload};
use tessel::search::TuningRecord;

#[derive(Serialize)]
struct Report<'a> {
    schema_version: u32,
    workload: String,
    target: String,
    columns: &'a [Column],
    tokens: Vec<TokenReport>,
}

#[derive(Serialize)]
struct TokenReport {
    source: Source,
    /// The buffer's name for data tokens.
    buffer: Option<String>,
    values: Vec<f32>,
}

#[derive(clap::Args)]
pub struct FeaturesArgs {
    /// A workload spec (with --trace; with --log, picks among its workloads).
    #[arg(long)]
    workload: Option<String>,
    /// A trace (JSON), e.g. from `cargo xtask best --emit trace`.
    #[arg(long, conflicts_with = "log")]
    trace: Option<PathBuf>,
    /// A tuning log: its best record.
    #[arg(long)]
    log: Option<PathBuf>,
    /// Cores the target uses (with --trace).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long)]
    json: bool,
}

/// The features of `--trace` on this CPU, or of the best record of `--log` on the machine
/// that measured it.
pub fn run(a: &FeaturesArgs) -> Result<()> {
    let (workload, json) = (a.workload.as_deref(), a.json);
    if a.threads == 0 {
        bail!("--threads must be at least 1");
    }
    let catalog = Catalog::default();
    let (spec, trace, target) = match (a.trace.as_deref(), a.log.as_deref()) {
        (Some(path), None) => {
            let spec = workload.context("--trace needs --workload")?;
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading trace {}", path.display()))?;
            let trace = Trace::from_json(&text)
                .with_context(|| format!("parsing trace {}", path.display()))?;
            let fp = tessel::cpu::fingerprint(a.threads, "gcc");
            (spec.to_string(), trace, tessel::feature_target(&fp)?)
        }
        (None, Some(path)) => {
            let record = best_record(path, workload)?;
            let target = tessel::feature_target(&record.fingerprint)
                .with_context(|| format!("the machine of {}", path.display()))?;
            (record.workload.clone(), record.trace.clone(), target)
        }
        _ => bail!("give either --trace FILE (with --workload) or --log FILE"),
    };
    let w: Workload = spec.parse().with_context(|| format!("workload `{spec}`"))?;
    let program: Program = trace
        .lower(&w.to_op(), &catalog)
        .with_context(|| format!("lowering the trace on {spec}"))?;
    let features = extract(&program, &target)?;
    if json {
        let report = Report {
            schema_version: SCHEMA_VERSION,
            workload: spec,
            target: target.name.clone(),
            columns: COLUMNS,
            tokens: (0..features.len())
                .map(|i| TokenReport {
                    source: features.sources[i],
                    buffer: buffer_name(&program, &features, i),
                    values: features.token(i).to_vec(),
                })
                .collect(),
        };
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "{spec} on {} (feature schema v{SCHEMA_VERSION}, {} tokens of {} columns; zero columns omitted)",
        target.name,
        features.len(),
        tessel::features::WIDTH
    );
    for i in 0..features.len() {
        let title = match features.sources[i] {
            Source::Statement(n) => format!("compute: statement {n}"),
            Source::Buffer { level, .. } => format!(
                "data: {} at {level:?}",
                buffer_name(&program, &features, i).unwrap_or_default()
            ),
            Source::Hardware => "hardware".to_string(),
        };
        println!("[{i}] {title}");
        for (v, c) in features.token(i).iter().zip(COLUMNS) {
            if *v != 0.0 && !c.name.starts_with("kind.") {
                println!("    {:<26} {:>10.4}  {}", c.name, v, c.unit);
            }
        }
    }
    Ok(())
}

fn buffer_name(program: &Program, f: &Features, i: usize) -> Option<String> {
    match f.sources[i] {
        Source::Buffer { buffer, .. } => program.buffers.get(buffer).map(|b| b.name.clone()),
        _ => None,
    }
}

/// The fastest successful record, of `workload` where given.
fn best_record(path: &Path, workload: Option<&str>) -> Result<TuningRecord> {
    if !path.exists() {
        bail!("{}: no such tuning log", path.display());
    }
    let contents = tessel::read_log_noting(path, &mut crate::progress::Bar::new(false))?;
    let mut workloads: Vec<&str> = contents
        .records
        .iter()
        .map(|r| r.workload.as_str())
        .collect();
    workloads.sort_unstable();
    workloads.dedup();
    let wanted = match workload {
        Some(w) => w.to_string(),
        None if workloads.len() == 1 => workloads[0].to_string(),
        None if workloads.is_empty() => bail!("{} holds no record", path.display()),
        None => bail!(
            "{} holds several workloads; pick one with --workload: {}",
            path.display(),
            workloads.join(", ")
        ),
    };
    contents
        .best_of(&wanted)
        .cloned()
        .with_context(|| format!("{} holds no successful record of {wanted}", path.display()))
}
