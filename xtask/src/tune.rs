//! `cargo xtask tune` and `cargo xtask best`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tessel_intrin::Catalog;
use tessel_ir::{DType, Workload, network};
use tessel_measure::{CostModel, Measurer};
use tessel_search::{
    InstructionSet, RandomModel, RecordLog, SearchOptions, Task, Tuner, TuningRecord, read_log,
};

use tessel_search::records::LogContents;

use crate::cpu;

/// What to tune and how.
pub struct TuneArgs {
    pub workload: Option<String>,
    pub network: Option<String>,
    pub batch: u64,
    pub dtype: String,
    pub target: String,
    pub trials: usize,
    pub model: Option<String>,
    pub log: Option<PathBuf>,
    pub seed: u64,
    pub threads: usize,
    pub population: usize,
    pub measure_batch: usize,
    pub epsilon: f64,
    pub json: bool,
}

#[derive(Serialize)]
struct TaskReport {
    workload: String,
    weight: u64,
    trials: usize,
    latency_ms: Option<f64>,
    gflops: Option<f64>,
    percent_of_peak: Option<f64>,
    mapping: Option<String>,
}

#[derive(Serialize)]
struct TuneReport {
    workload: String,
    target: String,
    model: String,
    latency_ms: Option<f64>,
    gflops: Option<f64>,
    percent_of_peak: Option<f64>,
    trials: usize,
    measured_this_run: usize,
    resumed_from_log: usize,
    errors: usize,
    search_time_s: f64,
    search_overhead_s: f64,
    search_overhead_percent: f64,
    tasks: Vec<TaskReport>,
}

/// The instruction a record's mapping label names (`amx.tdpbf16ps: m <- ...`).
fn instruction_of(mapping: &Option<String>) -> Option<&str> {
    mapping.as_deref().and_then(|m| m.split(':').next())
}

/// Where `tune` and `dataset` run candidates.
pub enum TuneTarget {
    /// This machine's CPU, measured.
    Cpu,
    /// The analytical model of a GPU (`sim:NAME`): estimates, labelled as such.
    Sim(tessel_gpu::DeviceSpec),
    /// This machine's NVIDIA GPU, measured (a build with `--features cuda`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Gpu {
        cc: (u32, u32),
        name: String,
        /// The model's table entry for this GPU, where it has one (for the peaks).
        spec: Option<tessel_gpu::DeviceSpec>,
        /// Taken by whoever measures.
        measurer: Option<Box<dyn Measurer>>,
    },
}

/// Opens GPU 0 through a worker process (this binary's hidden `gpu-worker`).
#[cfg(feature = "cuda")]
fn gpu_target() -> Result<TuneTarget> {
    let worker = tessel_measure::worker::WorkerCommand::current_exe(&["gpu-worker"])
        .context("cannot find the xtask executable")?;
    let m =
        tessel_gpu::cuda::CudaMeasurer::new(worker, Default::default()).context("--target gpu")?;
    let cc = m.compute_capability();
    let name = m.fingerprint().model.clone();
    Ok(TuneTarget::Gpu {
        cc,
        spec: tessel_gpu::device::spec_for(&name, cc),
        name,
        measurer: Some(Box::new(m)),
    })
}

#[cfg(not(feature = "cuda"))]
fn gpu_target() -> Result<TuneTarget> {
    bail!(
        "--target gpu: real GPU measurement needs a build with `--features cuda` (cargo run --release -p xtask --features cuda -- ...) on a machine with an NVIDIA driver; use `sim:NAME` for the analytical model"
    )
}

impl TuneTarget {
    pub fn parse(s: &str) -> Result<TuneTarget> {
        if s == "cpu" {
            return Ok(TuneTarget::Cpu);
        }
        if let Some(name) = s.strip_prefix("sim:") {
            return Ok(TuneTarget::Sim(tessel_gpu::device(name)?));
        }
        if s == "gpu" || s == "cuda" {
            return gpu_target();
        }
        let known: Vec<String> = tessel_gpu::devices()
            .iter()
            .map(|d| format!("sim:{}", d.key))
            .collect();
        bail!(
            "unknown --target `{s}`: use cpu, gpu or one of {}",
            known.join(", ")
        )
    }

    /// The target string records carry.
    pub fn label(&self) -> String {
        match self {
            TuneTarget::Cpu => "cpu".into(),
            TuneTarget::Sim(d) => format!("sim:{}", d.key),
            TuneTarget::Gpu { .. } => "gpu".into(),
        }
    }

    /// The measurer of a GPU target (once).
    pub fn take_gpu_measurer(&mut self) -> Option<Box<dyn Measurer>> {
        match self {
            TuneTarget::Gpu { measurer, .. } => measurer.take(),
            _ => None,
        }
    }

    pub fn instruction_set(&self) -> InstructionSet {
        match self {
            TuneTarget::Cpu => InstructionSet::Host,
            TuneTarget::Sim(d) => InstructionSet::Gpu { cc: d.cc },
            TuneTarget::Gpu { cc, .. } => InstructionSet::Gpu { cc: *cc },
        }
    }
}

/// The device's peak for a record's mapping (Tensor Cores of its input type, or the CUDA
/// cores' fp32 FMA for SIMT kernels), GFLOP/s.
fn sim_peak_gflops(d: &tessel_gpu::DeviceSpec, mapping: &Option<String>) -> Option<f64> {
    let catalog = Catalog::default();
    let macs = match instruction_of(mapping).and_then(|id| catalog.get(id)) {
        Some(i) => d.tc_macs_per_s(i.a),
        None => d.fp32 * d.sms as f64 * d.clock_ghz * 1e9,
    };
    (macs > 0.0).then_some(2.0 * macs / 1e9)
}

/// GFLOP/s peak for a record's mapping label.
type PeakOf = Box<dyn Fn(&Option<String>) -> Option<f64>>;

pub fn tune(a: TuneArgs) -> Result<()> {
    let mut target = TuneTarget::parse(&a.target)?;
    // Load the model before anything slow, so a bad file fails at once.
    let learned = match a.model.as_deref() {
        Some("none") | Some("random") => None,
        // The shipped model, where this checkout has one of this feature schema; it was
        // trained on CPU measurements, so GPU targets start from the random ranking.
        None if matches!(target, TuneTarget::Cpu) => shipped_model(),
        None => None,
        Some(path) => {
            let model = tessel_model::Model::load(Path::new(path))
                .with_context(|| format!("--model {path}"))?;
            model.check_schema(tessel_features::SCHEMA_VERSION)?;
            Some((path.to_string(), model))
        }
    };
    if a.trials == 0 {
        bail!("--trials must be at least 1");
    }
    let set = target.instruction_set();
    let (label, mut tasks) = match (&a.workload, &a.network) {
        (Some(spec), None) => {
            let w: Workload = spec
                .parse()
                .with_context(|| format!("--workload `{spec}`"))?;
            (w.to_string(), vec![Task::new(w, 1, &set)])
        }
        (None, Some(name)) => {
            let dtype: DType = a.dtype.parse().context("--dtype")?;
            let net = network(name, a.batch, dtype)?;
            let tasks = net
                .tasks()
                .into_iter()
                .map(|t| Task::new(t.workload, t.weight, &set))
                .collect();
            (net.name.clone(), tasks)
        }
        _ => bail!("give exactly one of --workload SPEC and --network NAME"),
    };
    if !a.json {
        for t in tasks.iter().take(1) {
            for (id, why) in t.space().skipped() {
                eprintln!("note: {id} not used: {why}");
            }
        }
    }
    let gpu_measurer = target.take_gpu_measurer();
    let (mut measurer, peak_of): (Box<dyn Measurer>, PeakOf) = match &target {
        TuneTarget::Cpu => {
            let measurer = cpu::measurer(a.threads, false)?;
            let peaks = tessel_cpu::peak::measure_peaks(
                measurer.compiler(),
                &tessel_search::CPU_INSTRUCTIONS,
                a.threads,
            )?;
            let peak_of = move |mapping: &Option<String>| -> Option<f64> {
                let id = instruction_of(mapping).unwrap_or_else(|| {
                    // The fallback's code is vectorized f32 arithmetic: the widest FMA
                    // is its peak.
                    if peaks
                        .measured
                        .iter()
                        .any(|p| p.intrinsic == "avx512.vfmadd231ps")
                    {
                        "avx512.vfmadd231ps"
                    } else {
                        "avx2.vfmadd231ps"
                    }
                });
                peaks
                    .measured
                    .iter()
                    .find(|p| p.intrinsic == id)
                    .map(|p| p.gops)
            };
            (Box::new(measurer), Box::new(peak_of))
        }
        TuneTarget::Sim(d) => {
            if !a.json {
                eprintln!(
                    "note: {} is the analytical model of {}: latencies are estimates, not measurements",
                    target.label(),
                    d.name
                );
            }
            let dev = d.clone();
            (
                Box::new(tessel_gpu::SimMeasurer::new(d.clone())),
                Box::new(move |m: &Option<String>| sim_peak_gflops(&dev, m)),
            )
        }
        TuneTarget::Gpu { spec, .. } => {
            let spec = spec.clone();
            (
                gpu_measurer.context("the GPU measurer was already used")?,
                Box::new(move |m: &Option<String>| {
                    spec.as_ref().and_then(|d| sim_peak_gflops(d, m))
                }),
            )
        }
    };
    let fingerprint = measurer.fingerprint().clone();

    let mut model: Box<dyn CostModel> = match learned {
        None => Box::new(RandomModel::new(a.seed)),
        Some((path, m)) => {
            let target = tessel_features::Target::from_fingerprint(&fingerprint)?;
            let online = tessel_model::cost::OnlineOptions {
                seed: a.seed,
                ..Default::default()
            };
            Box::new(tessel_model::ModelCostModel::new(m, target, &path, online))
        }
    };
    let model_name = model.name();
    let opts = SearchOptions {
        population: a.population,
        generations: 2,
        batch: a.measure_batch,
        epsilon: a.epsilon,
        seed: a.seed,
    };
    let (log, resumed) = match &a.log {
        Some(path) => {
            let contents = read_log_warning(path)?;
            (Some(RecordLog::open(path)?), contents.records)
        }
        None => (None, Vec::new()),
    };
    let start = Instant::now();
    let target_label = target.label();
    let mut tuner = Tuner::new(measurer.as_mut(), model.as_mut(), log, &target_label, opts);
    tuner.resume(&mut tasks, &resumed);
    let bar = ProgressBar::new(a.trials as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} trials  {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    if a.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let done: usize = tasks.iter().map(|t| t.trials).sum();
    bar.set_position(done.min(a.trials) as u64);
    tuner.tune(&mut tasks, a.trials, &mut |p| {
        bar.set_position(p.trials.min(p.total) as u64);
        let best = p
            .task
            .best
            .as_ref()
            .map_or("no valid candidate yet".to_string(), |b| {
                format!("best {:.1} GFLOP/s", b.gflops)
            });
        bar.set_message(format!("{best}  ({})", p.task.workload));
    })?;
    bar.finish_and_clear();
    let stats = tuner.stats.clone();
    let elapsed = start.elapsed().as_secs_f64();

    let task_reports: Vec<TaskReport> = tasks
        .iter()
        .map(|t| TaskReport {
            workload: t.workload.to_string(),
            weight: t.weight,
            trials: t.trials,
            latency_ms: t.best.as_ref().map(|b| b.latency_s * 1e3),
            gflops: t.best.as_ref().map(|b| b.gflops),
            percent_of_peak: t
                .best
                .as_ref()
                .and_then(|b| peak_of(&b.mapping).map(|p| 100.0 * b.gflops / p)),
            mapping: t.best.as_ref().and_then(|b| b.mapping.clone()),
        })
        .collect();
    let all_found = tasks.iter().all(|t| t.best.is_some());
    let latency_s: Option<f64> = all_found.then(|| {
        tasks
            .iter()
            .filter_map(|t| t.weighted_latency())
            .sum::<f64>()
    });
    let flops: f64 = tasks
        .iter()
        .map(|t| t.weight as f64 * t.workload.flops() as f64)
        .sum();
    let gflops = latency_s.map(|l| flops / l / 1e9);
    let percent = if tasks.len() == 1 {
        task_reports[0].percent_of_peak
    } else {
        None
    };
    let report = TuneReport {
        workload: label.clone(),
        target: target_label.clone(),
        model: model_name.clone(),
        latency_ms: latency_s.map(|l| l * 1e3),
        gflops,
        percent_of_peak: percent,
        trials: tasks.iter().map(|t| t.trials).sum(),
        measured_this_run: stats.measured,
        resumed_from_log: stats.resumed,
        errors: stats.errors,
        search_time_s: elapsed,
        search_overhead_s: stats.search_overhead_s(),
        search_overhead_percent: 100.0 * stats.search_overhead_s() / stats.total_time_s.max(1e-9),
        tasks: task_reports,
    };
    if !a.json {
        match &target {
            TuneTarget::Cpu => println!(
                "{label} on {} ({} thread(s)), cost model: {model_name}",
                fingerprint.model, a.threads
            ),
            TuneTarget::Sim(_) => println!(
                "{label} on {} [estimates, not measurements], cost model: {model_name}",
                fingerprint.model
            ),
            TuneTarget::Gpu { name, .. } => println!(
                "{label} on {name} (measured, {}), cost model: {model_name}",
                fingerprint.compiler
            ),
        }
        println!(
            "{:>6} {:>7} {:>10} {:>9} {:>7}  workload / best mapping",
            "weight", "trials", "best ms", "GFLOP/s", "% peak"
        );
        for t in &report.tasks {
            let f = |x: Option<f64>, p: usize| x.map_or("-".to_string(), |v| format!("{v:.p$}"));
            println!(
                "{:>6} {:>7} {:>10} {:>9} {:>7}  {}\n{:>44}{}",
                t.weight,
                t.trials,
                f(t.latency_ms, 4),
                f(t.gflops, 1),
                f(t.percent_of_peak, 1),
                t.workload,
                "",
                t.mapping
                    .clone()
                    .unwrap_or_else(|| "no instruction (vectorized loops)".into())
            );
        }
        match (report.latency_ms, report.gflops) {
            (Some(l), Some(g)) => println!("best: {l:.4} ms, {g:.1} GFLOP/s"),
            _ => println!("best: no task has a valid candidate yet"),
        }
        println!(
            "{} trials ({} measured now, {} from the log, {} errors) in {:.1} s; search overhead {:.2} s ({:.1}%)",
            report.trials,
            report.measured_this_run,
            report.resumed_from_log,
            report.errors,
            report.search_time_s,
            report.search_overhead_s,
            report.search_overhead_percent
        );
        if let Some(path) = &a.log {
            println!("records: {}", path.display());
        }
    }
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(())
}

/// The pretrained model in `fixtures/models/` (see fixtures/README.md), if present and of
/// this feature schema; otherwise the random cost model is used, with a note.
fn shipped_model() -> Option<(String, tessel_model::Model)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/cpu.safetensors");
    if !path.exists() {
        return None;
    }
    match tessel_model::Model::load(&path) {
        Ok(m) if m.check_schema(tessel_features::SCHEMA_VERSION).is_ok() => {
            Some(("fixtures/models/cpu".to_string(), m))
        }
        Ok(_) => {
            eprintln!(
                "note: the shipped model has another feature schema; using the random cost model"
            );
            None
        }
        Err(e) => {
            eprintln!("note: the shipped model did not load ({e}); using the random cost model");
            None
        }
    }
}

/// Reads a tuning log, warning on stderr about each corrupt line it skips.
pub fn read_log_warning(path: &Path) -> Result<LogContents> {
    let contents = read_log(path)?;
    for c in &contents.corrupt {
        eprintln!(
            "warning: {}:{}: skipped a corrupt record ({})",
            path.display(),
            c.line,
            c.reason
        );
    }
    Ok(contents)
}

/// `cargo xtask best`: the best record per workload, and optionally its code.
pub fn best(log: &Path, emit: Option<&str>, json: bool) -> Result<()> {
    let contents = read_log_warning(log)?;
    let mut best: BTreeMap<(String, String), &TuningRecord> = BTreeMap::new();
    for r in &contents.records {
        let Some(lat) = r.latency() else { continue };
        let key = (r.workload.clone(), r.target.clone());
        if best
            .get(&key)
            .and_then(|b| b.latency())
            .is_none_or(|b| lat < b)
        {
            best.insert(key, r);
        }
    }
    if best.is_empty() {
        bail!(
            "{} holds no successful record ({} records, {} corrupt lines)",
            log.display(),
            contents.records.len(),
            contents.corrupt.len()
        );
    }
    if json && emit.is_none() {
        let rows: Vec<&TuningRecord> = best.values().copied().collect();
        println!("{}", serde_json::to_string(&rows)?);
        return Ok(());
    }
    let catalog = Catalog::default();
    for ((workload, target), r) in &best {
        let m = r.result.as_ref().ok();
        match emit {
            None => println!(
                "{workload} [{target}]: {:.4} ms, {:.1} GFLOP/s, {}",
                m.map_or(0.0, |m| m.timing.median_s * 1e3),
                m.map_or(0.0, |m| m.gflops),
                r.mapping.clone().unwrap_or_else(|| "no instruction".into())
            ),
            Some("trace") => {
                println!("// {workload} [{target}]\n{}", r.trace.to_json_pretty())
            }
            Some("c") => {
                let w: Workload = workload
                    .parse()
                    .with_context(|| format!("record workload `{workload}`"))?;
                let program = r.trace.lower(&w.to_op(), &catalog)?;
                let k = tessel_cpu::generate(&program, "kernel", &catalog)?;
                println!("/* {workload} [{target}] */\n{}", k.source);
            }
            Some("cuda") => {
                let w: Workload = workload
                    .parse()
                    .with_context(|| format!("record workload `{workload}`"))?;
                let program = r.trace.lower(&w.to_op(), &catalog)?;
                let k = tessel_gpu::generate(&program, "kernel")?;
                println!(
                    "// {workload} [{target}]; launch with {} bytes of dynamic shared memory\n{}",
                    k.shared_bytes, k.source
                );
            }
            Some(other) => bail!("--emit takes c, cuda or trace, not `{other}`"),
        }
    }
    Ok(())
}
