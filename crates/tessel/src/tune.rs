//! `tune`: searches for the fastest schedule of a workload or of every task of a network, and
//! `best`: the fastest record per workload of a log, and its code.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Instant;

use serde::Serialize;
use tessel_intrin::Catalog;
use tessel_ir::{DType, Workload};
use tessel_measure::{Candidate, CostModel, MeasureResult, Measurer};
use tessel_search::records::LogContents;
use tessel_search::{
    InstructionSet, RandomModel, RecordLog, SearchOptions, Task, Tuner, TuningRecord, read_log,
};

use crate::error::{Context, Error, Result, bail};
use crate::learn::load_model;
use crate::progress::Progress;
use crate::target::{Target, TargetOptions, TargetSpec};

/// Which cost model ranks candidates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ModelChoice {
    /// The pretrained model shipped in `fixtures/models` (CPU targets; GPU targets and a
    /// checkout without it fall back to random, with a note).
    #[default]
    Shipped,
    /// A random ranking.
    Random,
    /// A model file from `pretrain` (its `.safetensors` or `.json`).
    File(PathBuf),
    /// The analytic roofline estimate of each candidate, fitted on nothing (CPU targets): for
    /// an instruction or machine no model was trained on.
    Roofline,
}

impl FromStr for ModelChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "shipped" => ModelChoice::Shipped,
            "none" | "random" => ModelChoice::Random,
            "roofline" => ModelChoice::Roofline,
            "" => bail!("model: give a model file, `shipped`, `roofline` or `none`"),
            path => ModelChoice::File(path.into()),
        })
    }
}

/// What to tune and how.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct TuneOptions {
    /// A workload spec, e.g. gemm:m=1024,n=1024,k=1024,dtype=f32.
    #[cfg_attr(feature = "clap", arg(long, conflicts_with = "network"))]
    pub workload: Option<Workload>,
    /// A network name (`cargo xtask workloads`): tunes all its tasks.
    #[cfg_attr(feature = "clap", arg(long))]
    pub network: Option<String>,
    /// Network batch size.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1))]
    pub batch: u64,
    /// Network element type.
    #[cfg_attr(feature = "clap", arg(long, default_value = "bf16"))]
    pub dtype: DType,
    /// Network weights' element type (default: `--dtype`); `--dtype u8 --wdtype i8` is the
    /// usual int8 quantization.
    #[cfg_attr(feature = "clap", arg(long))]
    pub wdtype: Option<DType>,
    /// `cpu` (measured here), `gpu` (measured, `cuda` feature) or `sim:NAME`, the analytical
    /// model of a GPU (v100, t4, a10, a100, l4, h100, h200, rtx4090): estimates.
    #[cfg_attr(feature = "clap", arg(long, default_value = "cpu"))]
    pub target: TargetSpec,
    /// Candidates to measure in all (records already in the log count).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 64))]
    pub trials: usize,
    /// Cost model: a model file from `pretrain` (`.safetensors` or `.json`), `none` for the
    /// random ranking, `shipped` (fixtures/models), or `roofline` (the analytic estimate from
    /// the allocation features, fitted on nothing: for an instruction the model never saw).
    #[cfg_attr(feature = "clap", arg(long, default_value = "shipped"))]
    pub model: ModelChoice,
    /// Tuning log (JSON Lines, append-only; a rerun resumes from it).
    #[cfg_attr(feature = "clap", arg(long))]
    pub log: Option<PathBuf>,
    /// Seed of the search and of the model's online steps.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1))]
    pub seed: u64,
    /// OpenMP threads per kernel.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1))]
    pub threads: usize,
    /// Sketches per generation of the evolutionary search.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 512))]
    pub population: usize,
    /// Generations of mutation and ranking per round (Ansor's evolutionary search runs 4).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 4))]
    pub generations: usize,
    /// Share of each generation's children bred by crossover of two parents (the rest are
    /// mutations of one).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0.3))]
    pub crossover: f64,
    /// Candidates measured per round.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 16))]
    pub measure_batch: usize,
    /// Share of each round's candidates drawn at random.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0.2))]
    pub epsilon: f64,
    /// Propose each batch only after the previous one is measured. By default, when kernels
    /// run on one thread and a second core is free, the next batch is proposed one round
    /// early and compiles on that core while this one is timed (its model is then one batch
    /// behind).
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_pipeline: bool,
    /// Time each candidate with its weights (the second operand of a gemm, dense layer or
    /// convolution) packed beforehand, where its schedule packs them at its root: the latency
    /// of the pre-packed entry point `export` ships, and of oneDNN's matmul with pre-packed
    /// weights. The log's records say so; a log of the other kind is not resumed.
    #[cfg_attr(feature = "clap", arg(long))]
    pub prepacked_weights: bool,
    /// Search only these CPU instructions (comma-separated): ids (`avx2.vpmaddwd`), families
    /// (`avx2-int8`) or instruction-set prefixes (`avx2`, `avx512`, `amx`, `avxvnni`), as
    /// oneDNN's max ISA does. Default: every instruction this CPU has.
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ','))]
    pub instructions: Vec<String>,
    /// Do not time the finalists again after the search (the fastest few by median and by
    /// fastest run, and the seeds, on fresh allocations each; the fastest then is the
    /// reported best and `remeasure` records in the log). Search curves (`search-eval`) do
    /// without.
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_remeasure: bool,
    /// The measurement worker executable (default: this program; see `serve_if_worker`).
    #[cfg_attr(feature = "clap", arg(skip))]
    pub worker_exe: Option<PathBuf>,
}

impl TuneOptions {
    /// Tune `workload` on this CPU with the defaults.
    pub fn workload(workload: Workload) -> Self {
        TuneOptions {
            workload: Some(workload),
            network: None,
            batch: 1,
            dtype: DType::BF16,
            wdtype: None,
            target: TargetSpec::Cpu,
            trials: 64,
            model: ModelChoice::Shipped,
            log: None,
            seed: 1,
            threads: 1,
            population: 512,
            generations: 4,
            crossover: 0.3,
            measure_batch: 16,
            epsilon: 0.2,
            no_pipeline: false,
            prepacked_weights: false,
            instructions: Vec::new(),
            no_remeasure: false,
            worker_exe: None,
        }
    }
}

/// The best of one task.
#[derive(Clone, Debug, Serialize)]
pub struct TaskReport {
    /// The workload spec.
    pub workload: String,
    /// How often the network runs it.
    pub weight: u64,
    /// Candidates measured for it (this run and the log).
    pub trials: usize,
    /// The best latency, ms.
    pub latency_ms: Option<f64>,
    /// The best throughput.
    pub gflops: Option<f64>,
    /// The best throughput against the peak of its instruction.
    pub percent_of_peak: Option<f64>,
    /// The best candidate's mapping (`None`: the vectorized-loop fallback).
    pub mapping: Option<String>,
    /// The chosen candidate's trace: the fastest finalist when the finalists were timed
    /// again (`remeasured_ms`), else the search's best.
    #[serde(skip)]
    pub trace: Option<tessel_ir::Trace>,
    /// The fastest finalist timed again after the search in [`REMEASURE_PROCESSES`] fresh
    /// worker processes on [`REMEASURE_ALLOCATIONS`] fresh allocations of its buffers each
    /// (CPU targets): the median of the processes' medians, ms.
    pub remeasured_ms: Option<f64>,
    /// The widest (slowest - fastest) / fastest in that re-measurement, across the
    /// processes' medians or across one process's allocations: a kernel whose speed depends
    /// on where its pages land shows it here.
    pub allocation_spread: Option<f64>,
    /// How many finalists were timed again ([`tessel_search::Task::finalists`]); the
    /// fastest of them is the reported best (`trace`, `remeasured_ms`,
    /// `remeasured_mapping`).
    pub finalists: usize,
    /// Where that winner stood among the finalists by the search's own timings (1: the
    /// search's best, whose figures `latency_ms`, `gflops` and `mapping` are).
    pub winner_search_rank: Option<usize>,
    /// The winner's mapping.
    pub remeasured_mapping: Option<String>,
}

/// Fresh worker processes the finalists of each task are timed again in, ...
pub const REMEASURE_PROCESSES: usize = 3;
/// ... on this many fresh allocations of their buffers in each.
pub const REMEASURE_ALLOCATIONS: u32 = 2;

/// What `tune` found.
#[derive(Clone, Debug, Serialize)]
pub struct TuneReport {
    /// The workload spec or network name.
    pub workload: String,
    /// The target label records carry.
    pub target: String,
    /// The machine (CPU model, GPU name, or device model).
    pub machine: String,
    /// The compiler the measurements used.
    pub compiler: String,
    /// Whether latencies are a model's estimates.
    pub estimates: bool,
    /// The cost model's name.
    pub model: String,
    /// The instructions the search could use (CPU; empty: vectorized loops only).
    pub instructions: Vec<String>,
    /// Sum over tasks of weight x best latency, ms, when every task has a valid candidate.
    pub latency_ms: Option<f64>,
    /// Total FLOPs over that latency.
    pub gflops: Option<f64>,
    /// For one task, its best against the peak.
    pub percent_of_peak: Option<f64>,
    /// Candidates in all.
    pub trials: usize,
    /// Candidates measured by this run.
    pub measured_this_run: usize,
    /// Candidates read back from the log.
    pub resumed_from_log: usize,
    /// Candidates that failed (compile, crash, wrong result, ...).
    pub errors: usize,
    /// Candidates whose checked run was their only run: more than `CUT_SHORT_FACTOR` times the task's best
    /// (`tessel_search::cut_short_budget`), so not worth timing further.
    pub cut_short: usize,
    /// Wall time, s.
    pub search_time_s: f64,
    /// Time spent outside measurement (sampling, features, the model), s.
    pub search_overhead_s: f64,
    /// That overhead as a share of the wall time.
    pub search_overhead_percent: f64,
    /// Per task.
    pub tasks: Vec<TaskReport>,
}

impl TuneReport {
    /// An error naming the first task without a valid candidate (every one it measured
    /// failed, or none could be generated); `Ok` when every task has a best.
    pub fn check_found(&self) -> Result<()> {
        match self.tasks.iter().find(|t| t.latency_ms.is_none()) {
            Some(t) => bail!(
                "no valid candidate for {} in {} trials ({} errors in this run); the log holds each error",
                t.workload,
                t.trials,
                self.errors
            ),
            None => Ok(()),
        }
    }
}

/// The CPU instructions `items` name (ids, families or instruction-set prefixes), each
/// checked to run on this CPU.
pub fn cpu_instructions(items: &[String]) -> Result<Vec<String>> {
    let catalog = Catalog::default();
    let host = tessel_intrin::HostCpu::detect();
    let mut ids: Vec<String> = Vec::new();
    for item in items {
        let item = item.trim();
        let family = |id: &str| catalog.get(id).map_or("", |i| i.family);
        let hits: Vec<&str> = tessel_intrin::CPU_INSTRUCTIONS
            .iter()
            .copied()
            .filter(|id| {
                // An opt-in (saturating) instruction only by its own id or family.
                let named = *id == item || family(id) == item;
                named || (!tessel_intrin::is_opt_in(id) && id.split('.').next() == Some(item))
            })
            .collect();
        if hits.is_empty() {
            bail!(
                "--instructions: `{}` is not a CPU instruction, family or prefix (instructions: {})",
                item.escape_debug(),
                tessel_intrin::CPU_INSTRUCTIONS.join(", ")
            );
        }
        for id in hits {
            if let Some(intr) = catalog.get(id)
                && let tessel_intrin::Support::No(why) = host.supports(intr)
            {
                // A prefix may name instructions this CPU lacks; an exact id may not.
                if id == item {
                    bail!("--instructions: `{id}` cannot run on this CPU: {why}");
                }
                continue;
            }
            if !ids.iter().any(|i| i == id) {
                ids.push(id.to_string());
            }
        }
    }
    if ids.is_empty() {
        bail!("--instructions: this CPU runs none of {}", items.join(", "));
    }
    Ok(ids)
}

/// The CPU instructions a tune without `--instructions` may map on this machine (opt-in
/// ones left out).
pub(crate) fn host_instructions() -> Vec<String> {
    let catalog = Catalog::default();
    let host = tessel_intrin::HostCpu::detect();
    tessel_intrin::default_cpu_instructions()
        .filter(|id| {
            catalog
                .get(id)
                .is_some_and(|i| host.supports(i) == tessel_intrin::Support::Yes)
        })
        .map(|s| s.to_string())
        .collect()
}

/// Tunes; appends every measured candidate to `opts.log` before learning from it.
pub fn tune(opts: &TuneOptions, progress: &mut dyn Progress) -> Result<TuneReport> {
    // Load the model before anything slow, so a bad file fails at once.
    let learned = match &opts.model {
        // The shipped model is chosen once the tasks' instructions are known (below).
        ModelChoice::Random | ModelChoice::Roofline | ModelChoice::Shipped => None,
        ModelChoice::File(path) => Some((path.display().to_string(), load_model(path)?)),
    };
    check_search_options(opts)?;
    if opts.wdtype.is_some() && opts.workload.is_some() {
        bail!(
            "--wdtype sets a network's weight type; a workload spec carries its own (wdtype=...)"
        );
    }
    if let Some(w) = &opts.workload {
        w.validate().with_context(|| format!("workload `{w}`"))?;
    }
    if opts.prepacked_weights && opts.target != TargetSpec::Cpu {
        bail!(
            "--prepacked-weights times CPU kernels with their weights packed beforehand; the target is {}",
            opts.target
        );
    }
    let mut target = Target::open(
        &opts.target,
        &TargetOptions {
            threads: opts.threads,
            worker_exe: opts.worker_exe.clone(),
            ..TargetOptions::default()
        },
    )?;
    let set = match (&opts.target, opts.instructions.as_slice()) {
        (_, []) => target.instruction_set(),
        (TargetSpec::Cpu, items) => InstructionSet::Only(cpu_instructions(items)?),
        (other, _) => bail!("--instructions selects CPU instructions; the target is {other}"),
    };
    let catalog = Catalog::default();
    let searched: Vec<String> = match &set {
        InstructionSet::Host => host_instructions(),
        InstructionSet::Only(ids) => ids.clone(),
        _ => Vec::new(),
    };
    for id in searched.iter().filter(|id| tessel_intrin::is_opt_in(id)) {
        let note = catalog.get(id).map_or("", |i| i.note);
        progress.note(&format!(
            "note: {id} is opt-in and inexact beyond small values: {note}"
        ));
    }
    let (label, mut tasks) = match (&opts.workload, &opts.network) {
        (Some(w), None) => (w.to_string(), vec![Task::new(*w, 1, &set)]),
        (None, Some(name)) => {
            let types = tessel_ir::Types {
                dtype: opts.dtype,
                wdtype: opts.wdtype.unwrap_or(opts.dtype),
            };
            let net = tessel_ir::network_with_types(name, opts.batch, types)?;
            let tasks = net
                .tasks()
                .into_iter()
                .map(|t| Task::new(t.workload, t.weight, &set))
                .collect();
            (net.name.clone(), tasks)
        }
        _ => bail!("give exactly one of a workload and a network"),
    };
    for t in tasks.iter().take(1) {
        for (id, why) in t.space().skipped() {
            progress.note(&format!("note: {id} not used: {why}"));
        }
    }
    if target.is_estimate() {
        progress.note(&format!(
            "note: {} is an analytical model: latencies are estimates, not measurements",
            target.label()
        ));
    }
    let mapped: BTreeSet<String> = tasks
        .iter()
        .flat_map(|t| {
            t.space()
                .mappings()
                .iter()
                .map(|m| m.intrinsic.id.to_string())
        })
        .collect();
    let learned = match opts.model {
        // Trained on CPU measurements: GPU targets start from the random ranking.
        ModelChoice::Shipped if opts.target == TargetSpec::Cpu => shipped_model(&mapped, progress),
        _ => learned,
    };
    let (learned, roofline) = match learned {
        Some((path, m)) => match Familiarity::of(&m, &mapped) {
            Familiarity::Unseen(ids) if opts.model == ModelChoice::Shipped => {
                progress.note(&format!(
                    "note: no shipped model was trained on {}; ranking by the roofline instead (`--model {path}` uses one anyway)",
                    ids.join(", ")
                ));
                (None, true)
            }
            Familiarity::Unseen(ids) | Familiarity::Partly(ids) => {
                progress.note(&format!(
                    "note: {path} was never trained on {}: its ranking of those candidates may be no better than chance (`--model roofline` ranks by the analytic estimate)",
                    ids.join(", ")
                ));
                (Some((path, m)), false)
            }
            Familiarity::Seen => (Some((path, m)), false),
        },
        None => (None, opts.model == ModelChoice::Roofline),
    };
    let fingerprint = target.fingerprint();
    let mut model: Box<dyn CostModel> = match learned {
        None if roofline => {
            if opts.target != TargetSpec::Cpu {
                bail!(
                    "--model roofline ranks CPU candidates; {} is not a CPU target",
                    target.label()
                );
            }
            let features = crate::target::feature_target(&fingerprint)?;
            Box::new(tessel_model::RooflineCostModel::new(features))
        }
        None => Box::new(RandomModel::new(opts.seed)),
        Some((path, m)) => {
            let features = crate::target::feature_target(&fingerprint)?;
            let online = tessel_model::cost::OnlineOptions {
                seed: opts.seed,
                ..Default::default()
            };
            Box::new(tessel_model::ModelCostModel::new(
                m, features, &path, online,
            ))
        }
    };
    let model_name = model.name();
    let search = SearchOptions {
        population: opts.population,
        generations: opts.generations,
        batch: opts.measure_batch,
        epsilon: opts.epsilon,
        crossover: opts.crossover,
        pipeline: !opts.no_pipeline,
        prepacked_weights: opts.prepacked_weights,
        seed: opts.seed,
    };
    let (log, resumed) = match &opts.log {
        Some(path) => {
            let contents = read_log_noting(path, progress)?;
            (Some(RecordLog::open(path)?), contents.records)
        }
        None => (None, Vec::new()),
    };
    let start = Instant::now();
    let target_label = target.label();
    let mut tuner = Tuner::new(
        target.measurer(),
        model.as_mut(),
        log,
        &target_label,
        search,
    );
    tuner.resume(&mut tasks, &resumed);
    progress.start("trials", opts.trials as u64);
    let done: usize = tasks.iter().map(|t| t.trials).sum();
    progress.update(done.min(opts.trials) as u64, "");
    tuner.tune(&mut tasks, opts.trials, &mut |p| {
        let best = p
            .task
            .best
            .as_ref()
            .map_or("no valid candidate yet".to_string(), |b| {
                format!("best {:.1} GFLOP/s", b.gflops)
            });
        progress.update(
            p.trials.min(p.total) as u64,
            &format!("{best}  ({})", p.task.workload),
        );
    })?;
    progress.finish();
    let stats = tuner.stats.clone();
    let elapsed = start.elapsed().as_secs_f64();
    let mut log = tuner.into_log();

    // Peaks of the instructions the bests use, measured now: one settles in a second or
    // so, and a search that can use eight instructions mostly ends on one or two.
    let mut used: Vec<&str> = Vec::new();
    for t in &tasks {
        if let Some(b) = &t.best {
            match crate::target::instruction_of(b.mapping.as_deref()) {
                Some(id) => used.push(id),
                // The fallback is reported against the widest FMA.
                None => used.extend(crate::target::FALLBACK_PEAKS),
            }
        }
    }
    used.sort_unstable();
    used.dedup();
    // After the search, a failure here costs only the "% of peak" column, not the run.
    let peaks = target.peaks_of(&used).unwrap_or_else(|e| {
        progress.note(&format!(
            "warning: measuring the peaks failed ({e}); no % of peak"
        ));
        crate::target::Peaks::Cpu(Vec::new())
    });

    let mut task_reports: Vec<TaskReport> = tasks
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
                .and_then(|b| peaks.of(b.mapping.as_deref()).map(|p| 100.0 * b.gflops / p)),
            mapping: t.best.as_ref().and_then(|b| b.mapping.clone()),
            trace: t.best.as_ref().map(|b| b.trace.clone()),
            remeasured_ms: None,
            allocation_spread: None,
            finalists: 0,
            winner_search_rank: None,
            remeasured_mapping: None,
        })
        .collect();
    if opts.target == TargetSpec::Cpu && !opts.no_remeasure {
        remeasure(
            &tasks,
            opts,
            &mut task_reports,
            log.as_mut(),
            &target_label,
            progress,
        )?;
    }
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
    let percent = match task_reports.as_slice() {
        [one] => one.percent_of_peak,
        _ => None,
    };
    Ok(TuneReport {
        workload: label,
        target: target_label,
        machine: target
            .gpu_name()
            .map_or(fingerprint.model.clone(), str::to_string),
        compiler: fingerprint.compiler.clone(),
        estimates: target.is_estimate(),
        model: model_name,
        instructions: searched,
        latency_ms: latency_s.map(|l| l * 1e3),
        gflops: latency_s.map(|l| flops / l / 1e9),
        percent_of_peak: percent,
        trials: tasks.iter().map(|t| t.trials).sum(),
        measured_this_run: stats.measured,
        resumed_from_log: stats.resumed,
        errors: stats.errors,
        cut_short: stats.cut_short,
        search_time_s: elapsed,
        search_overhead_s: stats.search_overhead_s(),
        search_overhead_percent: 100.0 * stats.search_overhead_s() / stats.total_time_s.max(1e-9),
        tasks: task_reports,
    })
}

/// Times each task's finalists ([`Task::finalists`]: the fastest few by median and by
/// fastest run, and the space's seeds) again in [`REMEASURE_PROCESSES`] fresh worker
/// processes on [`REMEASURE_ALLOCATIONS`] fresh allocations of their buffers each, pools
/// each finalist's processes ([`pool_rounds`]) and makes the fastest the task's reported
/// best: the search timed each candidate once, on one allocation, and keeps its luckiest
/// timing. The new timings are appended to the log as `remeasure` records, which
/// [`tessel_search::RecordLog`] readers then prefer (`best`, `export`).
fn remeasure(
    tasks: &[Task],
    opts: &TuneOptions,
    reports: &mut [TaskReport],
    mut log: Option<&mut RecordLog>,
    target_label: &str,
    progress: &mut dyn Progress,
) -> Result<()> {
    // (task, its finalists' candidates, their bests)
    let finalists: Vec<(usize, Vec<Candidate>, Vec<&tessel_search::Best>)> = tasks
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let bests = t.finalists();
            if bests.is_empty() {
                return None;
            }
            let weights = t.workload.weight_input().filter(|_| opts.prepacked_weights);
            let cands = bests
                .iter()
                .map(|b| {
                    Candidate::new(t.workload.to_op(), b.trace.clone())
                        .with_prepacked_weights(weights)
                })
                .collect();
            Some((i, cands, bests))
        })
        .collect();
    if finalists.is_empty() {
        return Ok(());
    }
    // Each round in a fresh worker process: a kernel's static buffers (packed operands)
    // land on other pages only in another process, and some kernels run 20% slower in one
    // process of five for it.
    let mut rounds: Vec<Vec<Vec<MeasureResult>>> = Vec::new();
    let mut fp = None;
    for _ in 0..REMEASURE_PROCESSES {
        let worker = crate::worker::worker_command("cpu", opts.worker_exe.as_deref())?;
        let mut m = tessel_cpu::CpuMeasurer::new(
            worker,
            tessel_cpu::CpuOptions {
                threads: opts.threads,
                timing: tessel_cpu::TimingOptions {
                    allocations: REMEASURE_ALLOCATIONS,
                    ..Default::default()
                },
                ..Default::default()
            },
        )?;
        fp.get_or_insert_with(|| m.fingerprint().clone());
        rounds.push(finalists.iter().map(|(_, c, _)| m.measure(c)).collect());
    }
    let fp = fp.expect("at least one round");
    for (f, (i, _, bests)) in finalists.into_iter().enumerate() {
        let task = &tasks[i];
        let flops = task.workload.flops() as f64;
        let results: Vec<MeasureResult> = (0..bests.len())
            .map(|j| pool_rounds(rounds.iter().map(|r| &r[f][j]), flops))
            .collect();
        let records: Vec<TuningRecord> = bests
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
            .map(|(b, r)| {
                TuningRecord::new(
                    &task.workload,
                    target_label,
                    fp.clone(),
                    b.trace.clone(),
                    b.mapping.clone(),
                    r.clone(),
                )
                .with_sampler(tessel_search::REMEASURE_SAMPLER)
                .with_prepacked_weights(opts.prepacked_weights)
            })
            .collect();
        if let Some(log) = log.as_deref_mut() {
            log.append(&records)?;
        }
        for e in results.iter().filter_map(|r| r.as_ref().err()) {
            progress.note(&format!(
                "warning: re-measuring a finalist of {} failed: {e}",
                reports[i].workload
            ));
        }
        let winner = bests
            .iter()
            .zip(&results)
            .filter_map(|(b, r)| r.as_ref().ok().map(|m| (b, m)))
            .min_by(|x, y| x.1.timing.median_s.total_cmp(&y.1.timing.median_s));
        let Some((b, w)) = winner else { continue };
        let report = &mut reports[i];
        report.remeasured_ms = Some(w.timing.median_s * 1e3);
        report.allocation_spread = w.allocation_spread;
        report.finalists = bests.len();
        // Which of the search's timings the winner had: 1 is the search's own best.
        report.winner_search_rank = bests.iter().position(|x| x.trace == b.trace).map(|p| p + 1);
        report.remeasured_mapping = b.mapping.clone();
        report.trace = Some(b.trace.clone());
    }
    Ok(())
}

/// One finalist's timings from every round, pooled: the median of the rounds' medians
/// (robust to one unlucky process), the fastest run of all, and as spread the widest of each
/// round's spread across allocations and the spread of the rounds' medians. A failure in
/// any round is the finalist's result.
fn pool_rounds<'a>(rounds: impl Iterator<Item = &'a MeasureResult>, flops: f64) -> MeasureResult {
    let mut ms: Vec<tessel_measure::Measurement> = Vec::new();
    for r in rounds {
        ms.push(r.clone()?);
    }
    let mut medians: Vec<f64> = ms.iter().map(|m| m.timing.median_s).collect();
    medians.sort_by(f64::total_cmp);
    let (Some(&fastest), Some(&slowest)) = (medians.first(), medians.last()) else {
        return Err(tessel_measure::MeasureError::new(
            tessel_measure::MeasureErrorKind::Runtime,
            "no round timed this finalist",
        ));
    };
    let median = medians[(medians.len() - 1) / 2];
    let mut pooled = ms[0].clone();
    pooled.timing.median_s = median;
    pooled.timing.min_s = ms
        .iter()
        .map(|m| m.timing.min_s)
        .fold(f64::INFINITY, f64::min)
        .min(median);
    pooled.timing.runs = ms.iter().map(|m| m.timing.runs).sum();
    pooled.timing.spread = ms.iter().map(|m| m.timing.spread).fold(0.0, f64::max);
    pooled.gflops = flops / median / 1e9;
    let across = (slowest - fastest) / fastest;
    pooled.allocation_spread = Some(
        ms.iter()
            .filter_map(|m| m.allocation_spread)
            .fold(across, f64::max),
    );
    Ok(pooled)
}

/// The largest population `tune` accepts: every sketch of a generation is lowered and
/// featurised, so a million would hold gigabytes.
pub const MAX_POPULATION: usize = 65_536;
/// The most generations per round `tune` accepts.
pub const MAX_GENERATIONS: usize = 64;

/// Refuses search settings that cannot work, naming the option and the range.
pub(crate) fn check_search_options(o: &TuneOptions) -> Result<()> {
    if o.trials == 0 {
        bail!("trials must be at least 1");
    }
    if o.population == 0 {
        bail!("population must be at least 1");
    }
    if o.population > MAX_POPULATION {
        bail!(
            "population {} is more than {MAX_POPULATION} sketches per generation",
            o.population
        );
    }
    if o.generations > MAX_GENERATIONS {
        bail!(
            "generations {} is more than {MAX_GENERATIONS} per round",
            o.generations
        );
    }
    if o.measure_batch == 0 {
        bail!("measure-batch must be at least 1");
    }
    if !(0.0..=1.0).contains(&o.crossover) {
        bail!("crossover {} is not a share between 0 and 1", o.crossover);
    }
    if !(0.0..=1.0).contains(&o.epsilon) {
        bail!("epsilon {} is not a share between 0 and 1", o.epsilon);
    }
    if o.threads == 0 {
        bail!("threads must be at least 1");
    }
    Ok(())
}

/// Where the shipped data lives: `fixtures/` of this checkout.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// Whether a learned model was trained on the instructions of the candidates it is to rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Familiarity {
    /// On all of them, or the model does not say (models written before `pretrain` listed
    /// its instructions in the provenance).
    Seen,
    /// On some: these it never saw.
    Partly(Vec<String>),
    /// On none of these.
    Unseen(Vec<String>),
}

impl Familiarity {
    pub(crate) fn of(model: &tessel_model::Model, mapped: &BTreeSet<String>) -> Familiarity {
        let Some(list) = model
            .info
            .provenance
            .get("instructions")
            .and_then(|v| v.as_array())
        else {
            return Familiarity::Seen;
        };
        let seen: BTreeSet<&str> = list.iter().filter_map(|v| v.as_str()).collect();
        let unseen: Vec<String> = mapped
            .iter()
            .filter(|id| !seen.contains(id.as_str()))
            .cloned()
            .collect();
        if unseen.is_empty() {
            Familiarity::Seen
        } else if unseen.len() == mapped.len() {
            Familiarity::Unseen(unseen)
        } else {
            Familiarity::Partly(unseen)
        }
    }

    /// How many of the instructions the model never saw.
    fn unseen(&self) -> usize {
        match self {
            Familiarity::Seen => 0,
            Familiarity::Partly(ids) | Familiarity::Unseen(ids) => ids.len(),
        }
    }
}

/// The shipped model for candidates of these instructions: of the pretrained models in
/// `fixtures/models/` (see fixtures/README.md) of this feature schema, the one trained on
/// the most of them (`cpu`, the first, on a tie). `None` (with a note) where none loads; the
/// caller decides what to do with a model that saw none of them.
pub(crate) fn shipped_model(
    mapped: &BTreeSet<String>,
    progress: &mut dyn Progress,
) -> Option<(String, tessel_model::Model)> {
    choose_model(
        &fixtures_dir().join("models"),
        "fixtures/models",
        mapped,
        progress,
    )
}

/// [`shipped_model`] over the models in `dir` (named `label/NAME` in notes and reports).
fn choose_model(
    dir: &Path,
    label: &str,
    mapped: &BTreeSet<String>,
    progress: &mut dyn Progress,
) -> Option<(String, tessel_model::Model)> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_suffix(".safetensors").map(str::to_string)
        })
        .collect();
    // `cpu` first: the general model wins ties; the others by name, so the choice is stable.
    names.sort_by_key(|n| (n != SHIPPED_DEFAULT, n.clone()));
    if names.is_empty() {
        progress.note(&format!(
            "note: no shipped model in {}; ranking at random",
            dir.display()
        ));
        return None;
    }
    let mut best: Option<(usize, String, tessel_model::Model)> = None;
    for name in names {
        let shown = format!("{label}/{name}");
        match tessel_model::Model::load(&dir.join(format!("{name}.safetensors"))) {
            Ok(m) if m.check_schema(tessel_features::SCHEMA_VERSION).is_ok() => {
                let unseen = Familiarity::of(&m, mapped).unseen();
                if best.as_ref().is_none_or(|b| unseen < b.0) {
                    best = Some((unseen, shown, m));
                }
                if unseen == 0 {
                    break; // none can do better: the rest need not be read
                }
            }
            Ok(_) => progress.note(&format!(
                "note: the shipped model {shown} has another feature schema; left out"
            )),
            Err(e) => progress.note(&format!(
                "note: the shipped model {shown} did not load ({e}); left out"
            )),
        }
    }
    if best.is_none() {
        progress.note("note: no shipped model loaded; ranking at random");
    }
    best.map(|(_, path, m)| (path, m))
}

/// The shipped model's name that wins ties (the one trained on the most instructions).
const SHIPPED_DEFAULT: &str = "cpu";

/// Reads a tuning log, noting each corrupt line it skips. Superseded records (the same
/// schedule measured again later in the log) are left out: one record per schedule, the
/// latest.
pub fn read_log_noting(path: &Path, progress: &mut dyn Progress) -> Result<LogContents> {
    Ok(read_log_noting_raw(path, progress)?.latest())
}

/// [`read_log_noting`] with every record, superseded ones included.
pub(crate) fn read_log_noting_raw(path: &Path, progress: &mut dyn Progress) -> Result<LogContents> {
    let contents = read_log(path)?;
    for c in &contents.corrupt {
        progress.note(&format!(
            "warning: {}:{}: skipped a corrupt record ({})",
            path.display(),
            c.line,
            c.reason
        ));
    }
    Ok(contents)
}

/// The code `best` can show of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emit {
    /// The trace, as JSON that `measure --trace` reads.
    Trace,
    /// The CPU kernel's C.
    C,
    /// The GPU kernel's CUDA C++.
    Cuda,
}

impl FromStr for Emit {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "trace" => Emit::Trace,
            "c" => Emit::C,
            "cuda" => Emit::Cuda,
            other => bail!("emit takes c, cuda or trace, not `{other}`"),
        })
    }
}

/// The fastest successful record per (workload, target) of a log.
pub fn best(log: &Path, progress: &mut dyn Progress) -> Result<Vec<TuningRecord>> {
    if !log.exists() {
        bail!("{}: no such tuning log", log.display());
    }
    let contents = read_log_noting(log, progress)?;
    let best: Vec<TuningRecord> = contents.best().into_values().cloned().collect();
    if best.is_empty() {
        bail!(
            "{} holds no successful record ({} records, {} corrupt lines)",
            log.display(),
            contents.records.len(),
            contents.corrupt.len()
        );
    }
    Ok(best)
}

/// A record's code: its trace, or the kernel the CPU or GPU generator makes of it.
pub fn emit(record: &TuningRecord, what: Emit) -> Result<String> {
    let catalog = Catalog::default();
    Ok(match what {
        Emit::Trace => record.trace.to_json_pretty(),
        Emit::C => {
            let program = record.program(&catalog)?;
            tessel_cpu::generate(&program, "kernel", &catalog)?.source
        }
        Emit::Cuda => {
            let program = record.program(&catalog)?;
            let k = tessel_gpu::generate(&program, "kernel")?;
            format!(
                "// launch with {} bytes of dynamic shared memory\n{}",
                k.shared_bytes, k.source
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finalist_pooled_over_processes_is_their_median_and_its_widest_spread() {
        let flops = 2e9;
        // Four runs: the fastest, the median twice, one slower.
        let timed = |median_s: f64, min_s: f64, spread: Option<f64>| -> MeasureResult {
            let samples = [min_s, median_s, median_s, median_s * 1.01];
            tessel_measure::Measurement::from_samples(&samples, flops as u64, 0.1, 0.0, false).map(
                |m| tessel_measure::Measurement {
                    allocation_spread: spread,
                    ..m
                },
            )
        };
        // One process in three 20% slow: the median ignores it, the spread shows it.
        let rounds = [
            timed(20e-3, 19.8e-3, Some(0.01)),
            timed(24e-3, 23.5e-3, Some(0.02)),
            timed(20.2e-3, 19.9e-3, None),
        ];
        let m = pool_rounds(rounds.iter(), flops).unwrap();
        assert_eq!(m.timing.median_s, 20.2e-3);
        assert_eq!(m.timing.min_s, 19.8e-3);
        assert_eq!(m.timing.runs, 12);
        assert!((m.gflops - flops / 20.2e-3 / 1e9).abs() < 1e-9);
        assert!((m.allocation_spread.unwrap() - 0.2).abs() < 1e-9);
        // Two rounds: the faster median (a slow process is the exception, not the rule).
        let m = pool_rounds(rounds[..2].iter(), flops).unwrap();
        assert_eq!(m.timing.median_s, 20e-3);
        // A round that failed fails the finalist.
        let failed: MeasureResult = Err(tessel_measure::MeasureError::new(
            tessel_measure::MeasureErrorKind::Crash,
            "SIGSEGV",
        ));
        let with_failure = [rounds[0].clone(), failed];
        assert!(pool_rounds(with_failure.iter(), flops).is_err());
        assert!(pool_rounds([].iter(), flops).is_err());
    }

    #[test]
    fn a_model_is_familiar_with_the_instructions_its_provenance_lists() {
        let mut model =
            tessel_model::Model::new(tessel_model::ModelConfig::new(tessel_features::WIDTH), 1)
                .unwrap();
        let ids = |v: &[&str]| -> BTreeSet<String> { v.iter().map(|s| s.to_string()).collect() };
        // An older model says nothing: trusted, as before.
        let amx = ids(&["amx.tdpbf16ps", "amx.tdpbusd"]);
        assert_eq!(Familiarity::of(&model, &amx), Familiarity::Seen);
        model.info.provenance =
            serde_json::json!({"instructions": ["avx2.vfmadd231ps", "amx.tdpbf16ps"]});
        assert_eq!(
            Familiarity::of(&model, &ids(&["avx2.vfmadd231ps"])),
            Familiarity::Seen
        );
        assert_eq!(
            Familiarity::of(&model, &amx),
            Familiarity::Partly(vec!["amx.tdpbusd".into()])
        );
        assert_eq!(
            Familiarity::of(&model, &ids(&["avx512.vpdpbusd"])),
            Familiarity::Unseen(vec!["avx512.vpdpbusd".into()])
        );
        // Compiled loops alone map no instruction: nothing to be unfamiliar with.
        assert_eq!(Familiarity::of(&model, &BTreeSet::new()), Familiarity::Seen);
    }

    #[test]
    fn the_shipped_model_trained_on_the_most_of_a_tunes_instructions_ranks_it() {
        let dir = std::env::temp_dir().join(format!("tessel-choose-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let save = |name: &str, seen: &[&str]| {
            let mut m =
                tessel_model::Model::new(tessel_model::ModelConfig::new(tessel_features::WIDTH), 1)
                    .unwrap();
            m.info.provenance = serde_json::json!({ "instructions": seen });
            m.save(&dir.join(format!("{name}.safetensors"))).unwrap();
        };
        let ids = |v: &[&str]| -> BTreeSet<String> { v.iter().map(|s| s.to_string()).collect() };
        let chosen = |mapped: &[&str]| {
            let mut notes = crate::progress::Notes::default();
            choose_model(&dir, "m", &ids(mapped), &mut notes).map(|(p, _)| p)
        };
        save("cpu", &["avx2.vfmadd231ps", "avx512.vpdpbusd"]);
        save("cpu-amx", &["amx.tdpbf16ps", "amx.tdpbusd"]);
        // A file that is no model is noted and passed over, never chosen.
        std::fs::write(dir.join("broken.safetensors"), b"not a model").unwrap();
        assert_eq!(chosen(&["amx.tdpbf16ps"]).as_deref(), Some("m/cpu-amx"));
        let mut notes = crate::progress::Notes::default();
        choose_model(&dir, "m", &ids(&["amx.tdpbusd"]), &mut notes);
        assert!(
            notes.0.iter().any(|n| n.contains("m/broken did not load")),
            "{:?}",
            notes.0
        );
        assert_eq!(chosen(&["avx2.vfmadd231ps"]).as_deref(), Some("m/cpu"));
        // Ties (here: neither saw it, or nothing mapped) go to the general model.
        assert_eq!(chosen(&["avx512.vfmadd231ps"]).as_deref(), Some("m/cpu"));
        assert_eq!(chosen(&[]).as_deref(), Some("m/cpu"));
        // All of this CPU's instructions: the model that saw more of them.
        assert_eq!(
            chosen(&["amx.tdpbf16ps", "amx.tdpbusd", "avx512.vpdpbusd"]).as_deref(),
            Some("m/cpu-amx")
        );
        std::fs::remove_dir_all(&dir).unwrap();
        let mut notes = crate::progress::Notes::default();
        assert!(choose_model(&dir, "m", &ids(&[]), &mut notes).is_none());
        assert!(notes.0[0].contains("no shipped model"), "{:?}", notes.0);
    }

    fn report(found: bool) -> TuneReport {
        TuneReport {
            workload: "resnet50".into(),
            target: "cpu".into(),
            machine: "test".into(),
            compiler: "cc".into(),
            estimates: false,
            model: "random".into(),
            instructions: vec![],
            latency_ms: None,
            gflops: None,
            percent_of_peak: None,
            trials: 16,
            measured_this_run: 16,
            resumed_from_log: 0,
            errors: 16,
            cut_short: 0,
            search_time_s: 1.0,
            search_overhead_s: 0.1,
            search_overhead_percent: 10.0,
            tasks: vec![TaskReport {
                workload: "gemm:m=8,n=8,k=8,dtype=f32".into(),
                weight: 1,
                trials: 16,
                latency_ms: found.then_some(0.01),
                gflops: found.then_some(0.1),
                percent_of_peak: None,
                mapping: None,
                trace: None,
                remeasured_ms: None,
                allocation_spread: None,
                finalists: 0,
                winner_search_rank: None,
                remeasured_mapping: None,
            }],
        }
    }

    #[test]
    fn a_run_without_a_valid_candidate_is_an_error_naming_the_task() {
        assert!(report(true).check_found().is_ok());
        let e = report(false).check_found().unwrap_err().to_string();
        assert!(
            e.contains("gemm:m=8,n=8,k=8") && e.contains("16 errors"),
            "{e}"
        );
    }
}
