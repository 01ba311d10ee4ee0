//! `dataset`: random schedules of every task, measured, appended as records; `merge`: shards
//! into one file.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use tessel_intrin::{Catalog, CpuPlatform, HostCpu};
use tessel_ir::{DType, Types, Workload, network_with_types};
use tessel_measure::{Candidate, CostModel, Measurer};
use tessel_search::records::RecordKey;
use tessel_search::rng::Rng;
use tessel_search::{
    InstructionSet, RandomModel, RecordLog, SearchOptions, Space, Task, Tuner, TuningRecord,
};

use crate::data::latest_records;
use crate::error::{Context, Result, bail};
use crate::progress::Progress;
use crate::target::{Target, TargetOptions, TargetSpec, cpu_measurer};
use crate::tune::read_log_noting;

/// What to measure.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct DatasetOptions {
    /// `cpu`, `gpu` or `sim:NAME` (the analytical model of a GPU; records say `sim`).
    #[cfg_attr(feature = "clap", arg(long, default_value = "cpu"))]
    pub target: TargetSpec,
    /// Networks, comma separated (`cargo xtask workloads`).
    #[cfg_attr(
        feature = "clap",
        arg(long = "network", value_delimiter = ',', conflicts_with = "workload")
    )]
    pub networks: Vec<String>,
    /// One workload spec instead of networks.
    #[cfg_attr(feature = "clap", arg(long))]
    pub workload: Option<Workload>,
    /// Schedules per task.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 200))]
    pub per_task: usize,
    /// The dataset file (JSON Lines, appended to; a rerun resumes).
    #[cfg_attr(feature = "clap", arg(long))]
    pub out: PathBuf,
    /// This machine's part `I/N` of the tasks (0-based), for Slurm arrays or indexed jobs.
    #[cfg_attr(feature = "clap", arg(long))]
    pub shard: Option<String>,
    /// amx-bf16, amx-int8, avx512-vnni, avx512-bf16, avx512-fma, avx2-fma or scalar
    /// (default: the best this CPU has); on GPU targets the element type: f16 (default),
    /// bf16, i8 or f32.
    #[cfg_attr(feature = "clap", arg(long))]
    pub platform: Option<String>,
    /// Network batch size.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1))]
    pub batch: u64,
    /// OpenMP threads per kernel.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1))]
    pub threads: usize,
    /// Seed of the sampling.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1))]
    pub seed: u64,
    /// Share of each task's schedules proposed by search rounds (the evolutionary search,
    /// ranked by the shipped model on CPU targets), as TenSet sampled Ansor's search; the rest
    /// are uniform samples of the whole space. Records say which (`sampler`).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0.5))]
    pub search_share: f64,
    /// Only the first N tasks (after de-duplication, before sharding).
    #[cfg_attr(feature = "clap", arg(long))]
    pub max_tasks: Option<usize>,
    /// The measurement worker executable (default: this program).
    #[cfg_attr(feature = "clap", arg(skip))]
    pub worker_exe: Option<PathBuf>,
}

/// What `dataset` did.
#[derive(Clone, Debug, Serialize)]
pub struct DatasetReport {
    /// Tasks of this shard.
    pub tasks: usize,
    /// The platform (CPU) or device and element type (GPU).
    pub platform: String,
    /// The machine.
    pub machine: String,
    /// Records measured by this run.
    pub measured: usize,
    /// Of which failed.
    pub errors: usize,
    /// Of which were recorded after their checked run alone (over `CUT_SHORT_FACTOR` times the task's best).
    pub cut_short: usize,
    /// Of which were proposed by search rounds (the rest: uniform random samples).
    pub searched: usize,
    /// The cost model that ranked the search rounds.
    pub search_model: String,
    /// The canary: one fixed kernel measured at every task's start and every few batches,
    /// so that drift and noise on the machine show in its log next to the records.
    pub canary: Option<CanaryReport>,
    /// Records already in the file.
    pub existing: usize,
    /// Tasks with fewer distinct schedules than asked, and how many they got.
    pub short: Vec<(String, usize)>,
    /// Wall time, s.
    pub seconds: f64,
}

/// What the canary kernel measured during a `dataset` run.
#[derive(Clone, Debug, Serialize)]
pub struct CanaryReport {
    /// The canary's workload.
    pub workload: String,
    /// Its log: one record per measurement (`<out>.canary.jsonl`, next to the dataset).
    pub log: PathBuf,
    /// Measurements this run.
    pub runs: usize,
    /// Fastest of the measurements (each the median of its runs), ms.
    pub min_ms: f64,
    /// Their median, ms.
    pub median_ms: f64,
    /// The slowest, ms.
    pub max_ms: f64,
}

impl CanaryReport {
    /// (slowest - fastest) / fastest: how much the machine drifted during the run.
    pub fn drift(&self) -> f64 {
        (self.max_ms - self.min_ms) / self.min_ms.max(1e-12)
    }
}

/// Random batches between two canary measurements (one also opens every task).
pub const CANARY_EVERY: usize = 8;

/// The canary: a 256^3 GEMM in the platform's types, with the classic schedule of its first
/// instruction (the naive loop nest where the platform has none).
struct Canary {
    workload: Workload,
    candidate: Candidate,
    log: RecordLog,
    path: PathBuf,
    latencies: Vec<f64>,
}

impl Canary {
    fn new(out: &Path, types: Types, set: &InstructionSet) -> Result<Self> {
        let workload = Workload::gemm(256, 256, 256, types.dtype).with_types(types);
        let op = workload.to_op();
        let space = Space::new(&op, set);
        let trace = space
            .seeds()
            .first()
            .and_then(|s| space.trace(s).ok())
            .unwrap_or_default();
        let name = out
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("dataset")
            .trim_end_matches(".gz")
            .trim_end_matches(".jsonl");
        let path = out.with_file_name(format!("{name}.canary.jsonl"));
        Ok(Canary {
            workload,
            candidate: Candidate::new(op, trace),
            log: RecordLog::open(&path)?,
            path,
            latencies: Vec::new(),
        })
    }

    fn measure(&mut self, measurer: &mut dyn Measurer, target: &str) -> Result<()> {
        let fp = measurer.fingerprint().clone();
        let Some(r) = measurer
            .measure(std::slice::from_ref(&self.candidate))
            .pop()
        else {
            return Ok(());
        };
        if let Ok(m) = &r {
            self.latencies.push(m.timing.median_s);
        }
        let record = TuningRecord::new(
            &self.workload,
            target,
            fp,
            self.candidate.trace.clone(),
            None,
            r,
        )
        .with_sampler("canary");
        self.log.append(&[record])?;
        Ok(())
    }

    fn report(&self) -> Option<CanaryReport> {
        let mut l = self.latencies.clone();
        l.sort_by(f64::total_cmp);
        let (first, last) = (*l.first()?, *l.last()?);
        Some(CanaryReport {
            workload: self.workload.to_string(),
            log: self.path.clone(),
            runs: l.len(),
            min_ms: first * 1e3,
            median_ms: l[l.len() / 2] * 1e3,
            max_ms: last * 1e3,
        })
    }
}

/// `I/N` with `I < N`.
pub fn parse_shard(s: &str) -> Result<(usize, usize)> {
    let (i, n) = s
        .split_once('/')
        .with_context(|| format!("shard `{s}`: expected I/N, e.g. 0/4"))?;
    let (i, n): (usize, usize) = (
        i.trim().parse().with_context(|| format!("shard `{s}`"))?,
        n.trim().parse().with_context(|| format!("shard `{s}`"))?,
    );
    if n == 0 || i >= n {
        bail!("shard `{s}`: need 0 <= I < N");
    }
    Ok((i, n))
}

/// FNV-1a, for per-task seeds that do not depend on the task's position.
fn hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What `dataset` measures on: a CPU platform or a GPU (model or real).
struct DatasetTarget {
    set: InstructionSet,
    types: Types,
    /// The target string records carry.
    label: String,
    measurer: Box<dyn Measurer>,
    name: String,
}

fn dataset_target(o: &DatasetOptions) -> Result<DatasetTarget> {
    let topts = TargetOptions {
        threads: o.threads,
        worker_exe: o.worker_exe.clone(),
        ..TargetOptions::default()
    };
    if o.target == TargetSpec::Cpu {
        return cpu_dataset_target(o, &topts);
    }
    let target = Target::open(&o.target, &topts)?;
    let InstructionSet::Gpu { cc } = target.instruction_set() else {
        bail!("target {} is not a GPU", o.target);
    };
    let (bf16, device) = match (target.device(), target.gpu_name()) {
        (_, Some(name)) => (cc.0 >= 8, name.to_string()),
        (Some(d), None) => (d.tc_bf16 > 0.0, format!("{} (analytical model)", d.key)),
        (None, None) => (cc.0 >= 8, o.target.to_string()),
    };
    // On a GPU the platform is the networks' element type.
    let dtype = o.platform.as_deref().unwrap_or("f16");
    let dtype: DType = match dtype {
        "f16" | "bf16" | "i8" | "f32" => dtype.parse()?,
        other => bail!("platform `{other}` on a GPU target: one of f16, bf16, i8, f32"),
    };
    if dtype == DType::BF16 && !bf16 {
        bail!("{device} has no bf16 Tensor Cores");
    }
    let label = target.label();
    Ok(DatasetTarget {
        set: InstructionSet::Gpu { cc },
        types: Types::same(dtype),
        label,
        name: format!("{device} {dtype}"),
        measurer: target.into_measurer(),
    })
}

/// The instructions a CPU platform's space draws from: its own, or none (the compiler-
/// vectorized fallback alone) for a platform without any.
pub(crate) fn platform_instruction_set(platform: &CpuPlatform) -> InstructionSet {
    if platform.instructions.is_empty() {
        InstructionSet::None
    } else {
        InstructionSet::Only(
            platform
                .instructions
                .iter()
                .map(|s| s.to_string())
                .collect(),
        )
    }
}

fn cpu_dataset_target(o: &DatasetOptions, topts: &TargetOptions) -> Result<DatasetTarget> {
    let catalog = Catalog::default();
    let host = HostCpu::detect();
    let platform = match &o.platform {
        Some(p) => CpuPlatform::named(p)?,
        None => CpuPlatform::best_for(host, &catalog),
    };
    if let Err((id, why)) = platform.supported(host, &catalog) {
        bail!(
            "platform {} needs {id}, which this machine cannot run ({why}); measure it on a machine that has it",
            platform.name
        );
    }
    Ok(DatasetTarget {
        set: platform_instruction_set(platform),
        types: platform.types()?,
        label: format!("cpu:{}", platform.name),
        name: platform.name.to_string(),
        measurer: Box::new(cpu_measurer(topts)?),
    })
}

/// The distinct workloads of the options' networks (or its one workload), truncated and
/// sharded as asked.
fn dataset_workloads(o: &DatasetOptions, types: Types) -> Result<Vec<Workload>> {
    let mut workloads: Vec<Workload> = Vec::new();
    match (&o.workload, o.networks.is_empty()) {
        (Some(w), true) => workloads.push(*w),
        (None, false) => {
            for name in &o.networks {
                for t in network_with_types(name, o.batch, types)?.tasks() {
                    if !workloads.contains(&t.workload) {
                        workloads.push(t.workload);
                    }
                }
            }
        }
        _ => bail!("give exactly one of a workload and networks"),
    }
    if let Some(m) = o.max_tasks {
        workloads.truncate(m);
    }
    if let Some(s) = &o.shard {
        let (i, n) = parse_shard(s)?;
        workloads = workloads
            .into_iter()
            .enumerate()
            .filter(|(k, _)| k % n == i)
            .map(|(_, w)| w)
            .collect();
    }
    Ok(workloads)
}

/// How many records of a task may be measured under the budget of the run's fastest rate
/// before the task's own best alone sets it.
const PROVISIONAL_RECORDS: usize = 16;
/// ... only for tasks that would take this long even at that rate: a small or memory-bound
/// task's first batch costs little unbudgeted, and a budget from another task's rate would
/// cut its good schedules short.
const PROVISIONAL_MIN_S: f64 = 0.05;

/// Samples `per_task` distinct schedules of every task, a `search_share` of them from search
/// rounds and the rest uniformly from the whole space, measures them and appends the records
/// to `out` (a rerun measures only what is missing).
pub fn dataset(o: &DatasetOptions, progress: &mut dyn Progress) -> Result<DatasetReport> {
    if o.per_task == 0 {
        bail!("per-task must be at least 1");
    }
    if o.max_tasks == Some(0) {
        bail!("max-tasks 0 leaves nothing to measure");
    }
    if !(0.0..=1.0).contains(&o.search_share) {
        bail!(
            "search-share {} is not a share between 0 and 1",
            o.search_share
        );
    }
    if let Some(w) = &o.workload {
        w.validate().with_context(|| format!("workload `{w}`"))?;
    }
    let DatasetTarget {
        set,
        types,
        label: target,
        mut measurer,
        name: platform_name,
    } = dataset_target(o)?;
    let workloads = dataset_workloads(o, types)?;
    let existing = read_log_noting(&o.out, progress)?;
    let fp = measurer.fingerprint().clone();
    let mut model = search_model(o, &fp, &set, progress)?;
    let search_model_name = model.name();
    let mut log = Some(RecordLog::open(&o.out)?);
    let mut canary = Canary::new(&o.out, types, &set)?;
    let mut done: HashSet<_> = existing.records.iter().map(|r| r.key()).collect();

    progress.start("schedules", (workloads.len() * o.per_task) as u64);
    let start = Instant::now();
    let (mut measured, mut errors, mut position) = (0usize, 0usize, 0u64);
    let mut cut_short = 0usize;
    let mut searched = 0usize;
    let mut short = Vec::new();
    // The fastest rate any task of this target and machine has reached: a task's first
    // records get at most the budget of a schedule at that rate, so that the first batch of
    // a 46 GFLOP GEMM does not run slow schedules for a minute each.
    let mut fastest_gflops = existing
        .records
        .iter()
        .filter(|r| r.target == target && r.fingerprint == fp)
        .filter_map(|r| r.result.as_ref().ok())
        .filter(|m| !m.emulated && !m.censored)
        .map(|m| m.gflops)
        .filter(|g| g.is_finite() && *g > 0.0)
        .reduce(f64::max);
    for w in &workloads {
        let spec = w.to_string();
        let op = w.to_op();
        let space = Space::new(&op, &set);
        let mine = || {
            existing
                .records
                .iter()
                .filter(|r| r.workload == spec && r.target == target)
        };
        let here =
            |r: &&TuningRecord| r.fingerprint == fp && r.result.as_ref().is_ok_and(|m| !m.emulated);
        let have = mine().count();
        let have_here = mine().filter(here).count();
        let have_search = mine()
            .filter(|r| r.sampler.as_deref() == Some("search"))
            .count();
        let want_search = (o.per_task as f64 * o.search_share).round() as usize;
        let want_random = o.per_task - want_search;
        // The task's best so far: a schedule over five times slower is recorded after its
        // checked run alone (`cut_short`), sparing the timed runs of the slowest schedules.
        let mut best: Option<f64> = mine()
            .filter(here)
            .filter_map(|r| r.latency())
            .reduce(f64::min);
        position += have.min(o.per_task) as u64;
        progress.update(position, &spec);
        let mut need = want_random.saturating_sub(have - have_search);
        let mut batches = 0usize;
        if need > 0 || want_search > have_search {
            canary.measure(measurer.as_mut(), &target)?;
        }
        let mut fresh: Vec<TuningRecord> = Vec::new();
        let mut rng = Rng::new(o.seed ^ hash(&spec));
        let mut attempts = 0;
        // Up to `n` new distinct random schedules (fewer when the space runs dry).
        let mut sample = |n: usize| {
            let mut batch = Vec::new();
            let mut labels = Vec::new();
            while batch.len() < n && attempts < 50 * o.per_task {
                attempts += 1;
                let sketch = space.sample(&mut rng);
                let Ok(trace) = space.trace(&sketch) else {
                    continue;
                };
                if !done.insert(RecordKey::new(&spec, &target, &fp, &trace)) {
                    continue;
                }
                labels.push(space.mapping_label(&sketch));
                batch.push(Candidate::new(op.clone(), trace));
            }
            (batch, labels)
        };
        let mut next = None;
        while need > 0 {
            // A small first batch gives the task a best, and so a budget, early.
            let size = if best.is_none() { 4 } else { 16 };
            let (mut batch, labels) = next.take().unwrap_or_else(|| sample(need.min(size)));
            if batch.is_empty() {
                break;
            }
            // The batch after this one compiles on the other core while this one is measured.
            let after = need - batch.len();
            if after > 0 {
                let (b, l) = sample(after.min(16));
                if !b.is_empty() {
                    measurer.prefetch(&b);
                    next = Some((b, l));
                }
            }
            // Until the task has a batch of its own, its best may be one slow random schedule:
            // the budget is then no looser than a schedule at the run's fastest rate.
            let at_fastest = fastest_gflops
                .filter(|_| have_here + fresh.len() < PROVISIONAL_RECORDS)
                .map(|g| w.flops() as f64 / (g * 1e9))
                .filter(|s| *s >= PROVISIONAL_MIN_S);
            let budget = match (best, at_fastest) {
                (Some(b), Some(f)) => Some(b.min(f)),
                (b, f) => b.or(f),
            }
            .map(tessel_search::cut_short_budget);
            for c in &mut batch {
                c.budget_s = budget;
            }
            batches += 1;
            if batches % CANARY_EVERY == 0 {
                canary.measure(measurer.as_mut(), &target)?;
            }
            let results = measurer.measure(&batch);
            let records: Vec<TuningRecord> = batch
                .into_iter()
                .zip(results)
                .zip(labels)
                .map(|((c, r), mapping)| {
                    errors += usize::from(r.is_err());
                    if let Ok(m) = &r
                        && !m.emulated
                    {
                        cut_short += usize::from(m.cut_short);
                        best = Some(best.map_or(m.timing.median_s, |b| b.min(m.timing.median_s)));
                        if !m.censored && m.gflops.is_finite() {
                            fastest_gflops =
                                Some(fastest_gflops.map_or(m.gflops, |g| g.max(m.gflops)));
                        }
                    }
                    TuningRecord::new(w, &target, fp.clone(), c.trace, mapping, r)
                        .with_sampler("random")
                })
                .collect();
            if let Some(log) = &mut log {
                log.append(&records)?;
            }
            measured += records.len();
            need -= records.len();
            position += records.len() as u64;
            progress.update(position, &spec);
            fresh.extend(records);
        }
        // Search rounds: the evolutionary search continues from everything measured of the
        // task (the random samples included) and proposes what the model ranks best.
        let need_search = want_search.saturating_sub(have_search);
        if need_search > 0 {
            let mut tasks = [Task::new(*w, 1, &set)];
            let search = SearchOptions {
                seed: o.seed ^ hash(&spec) ^ 0x5ea2c4,
                ..SearchOptions::default()
            };
            let mut tuner = Tuner::new(
                measurer.as_mut(),
                model.as_mut(),
                log.take(),
                &target,
                search,
            );
            let prior: Vec<TuningRecord> = mine().cloned().chain(fresh.iter().cloned()).collect();
            tuner.resume(&mut tasks, &prior);
            let goal = tasks[0].trials + need_search;
            let base = position;
            let result = tuner.tune(&mut tasks, goal, &mut |p| {
                let done = p.trials.saturating_sub(goal - need_search);
                progress.update(base + done as u64, &spec);
            });
            let stats = tuner.stats.clone();
            log = tuner.into_log();
            result?;
            measured += stats.measured;
            errors += stats.errors;
            cut_short += stats.cut_short;
            searched += stats.measured;
            position += stats.measured as u64;
            need += need_search - stats.measured.min(need_search);
        }
        if need > 0 {
            progress.note(&format!(
                "note: {spec}: only {} distinct schedules found",
                o.per_task - need
            ));
            short.push((spec, o.per_task - need));
        }
    }
    progress.finish();
    Ok(DatasetReport {
        tasks: workloads.len(),
        platform: platform_name,
        machine: fp.model.clone(),
        measured,
        errors,
        cut_short,
        searched,
        search_model: search_model_name,
        canary: canary.report(),
        existing: existing.records.len(),
        short,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The cost model that ranks a dataset's search rounds: the shipped model on CPU targets
/// (the roofline where the platform's instructions are none the model was trained on), else
/// the random ranking.
fn search_model(
    o: &DatasetOptions,
    fp: &tessel_measure::HardwareFingerprint,
    set: &InstructionSet,
    progress: &mut dyn Progress,
) -> Result<Box<dyn CostModel>> {
    if o.search_share > 0.0 && o.target == TargetSpec::Cpu {
        let platform: std::collections::BTreeSet<String> = match set {
            InstructionSet::Only(ids) => ids.iter().cloned().collect(),
            _ => Default::default(),
        };
        let Some((path, m)) = crate::tune::shipped_model(&platform, progress) else {
            return Ok(Box::new(RandomModel::new(o.seed)));
        };
        let features = crate::target::feature_target(fp)?;
        if let crate::tune::Familiarity::Unseen(ids) = crate::tune::Familiarity::of(&m, &platform) {
            progress.note(&format!(
                "note: no shipped model was trained on {}; search rounds rank by the roofline",
                ids.join(", ")
            ));
            return Ok(Box::new(tessel_model::RooflineCostModel::new(features)));
        }
        let online = tessel_model::cost::OnlineOptions {
            seed: o.seed,
            ..Default::default()
        };
        return Ok(Box::new(tessel_model::ModelCostModel::new(
            m, features, &path, online,
        )));
    }
    Ok(Box::new(RandomModel::new(o.seed)))
}

/// Joins dataset shards into the new file `out`, each candidate once (its latest record, the
/// inputs read in order); returns the number of records written.
pub fn merge(out: &Path, inputs: &[PathBuf], progress: &mut dyn Progress) -> Result<usize> {
    if inputs.is_empty() {
        bail!("give the shard files to merge");
    }
    let (latest, _) = latest_records(inputs, progress)?;
    let all: Vec<TuningRecord> = latest.into_iter().map(|(_, _, r)| r).collect();
    if out.exists() {
        bail!("{} exists; merge writes a new file", out.display());
    }
    if out.extension().is_some_and(|e| e == "gz") {
        bail!(
            "{}: merge writes plain JSON Lines; compress the result afterwards (gzip)",
            out.display()
        );
    }
    let mut log = RecordLog::open(out)?;
    log.append(&all)?;
    Ok(all.len())
}
