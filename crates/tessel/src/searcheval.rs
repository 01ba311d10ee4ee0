//! `search-eval`: what the cost model buys the search. Each task is tuned for real with the
//! model and with the random ranking (`tune --model none`), over several seeds, each run in a
//! log of its own; the report gives, per task, how many trials each needed to reach a share
//! (95%) of the best throughput any run found, and the best each found at equal trials.
//!
//! The logs are the data: a rerun resumes every unfinished run and recomputes the report from
//! the logs alone, so a finished evaluation is re-reported for free. Tasks should be ones the
//! model never saw in training (the held-out protocol's test networks, for the shipped
//! model), or the comparison measures memory rather than prediction.

use std::path::{Path, PathBuf};

use serde::Serialize;
use tessel_ir::{DType, Workload};
use tessel_search::{REMEASURE_SAMPLER, TuningRecord};

use crate::error::{Context, Result, bail};
use crate::learn::load_model;
use crate::progress::Progress;
use crate::tune::{
    ModelChoice, TuneOptions, check_search_options, cpu_instructions, host_instructions,
    read_log_noting_raw, shipped_model, tune,
};

/// What to tune, how often and where the runs' logs go.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct SearchEvalOptions {
    /// A workload spec to tune (repeat the option for several).
    #[cfg_attr(feature = "clap", arg(long = "workload"))]
    pub workloads: Vec<Workload>,
    /// A network whose tasks to tune (`cargo xtask workloads`), heaviest first.
    #[cfg_attr(feature = "clap", arg(long))]
    pub network: Option<String>,
    /// Only the network's N heaviest tasks (weight x FLOPs).
    #[cfg_attr(feature = "clap", arg(long))]
    pub tasks: Option<usize>,
    /// Network element type.
    #[cfg_attr(feature = "clap", arg(long, default_value = "f32"))]
    pub dtype: DType,
    /// Network weights' element type (default: `--dtype`).
    #[cfg_attr(feature = "clap", arg(long))]
    pub wdtype: Option<DType>,
    /// Trials of each run.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 64))]
    pub trials: usize,
    /// Trials of each random run (default: `--trials`). More than the model's turns "random
    /// missed the threshold" from a lower bound into a count, or a lower bound this large.
    #[cfg_attr(feature = "clap", arg(long))]
    pub random_trials: Option<usize>,
    /// Runs per task and ranking, seeds 1 to N.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 2))]
    pub seeds: u64,
    /// The model to evaluate (`shipped`, `roofline` or a file from `pretrain`); random is the
    /// baseline.
    #[cfg_attr(feature = "clap", arg(long, default_value = "shipped"))]
    pub model: ModelChoice,
    /// Sketches per generation of the evolutionary search (both rankings).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 512))]
    pub population: usize,
    /// Generations per round (both rankings).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 4))]
    pub generations: usize,
    /// Share of children bred by crossover (both rankings).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0.3))]
    pub crossover: f64,
    /// The share of the best throughput a run has to reach.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0.95))]
    pub threshold: f64,
    /// Directory of the runs' logs (created; a rerun resumes from them).
    #[cfg_attr(feature = "clap", arg(long))]
    pub out: PathBuf,
    /// CPU instructions to search (as `tune --instructions`).
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ','))]
    pub instructions: Vec<String>,
    /// OpenMP threads per kernel.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1))]
    pub threads: usize,
    /// As `tune --no-pipeline` (both rankings): each batch proposed after the previous
    /// one's results.
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_pipeline: bool,
    /// Compute the report from the logs as they are; measure nothing.
    #[cfg_attr(feature = "clap", arg(long))]
    pub report_only: bool,
    /// The measurement worker executable (default: this program).
    #[cfg_attr(feature = "clap", arg(skip))]
    pub worker_exe: Option<PathBuf>,
}

impl SearchEvalOptions {
    /// Evaluate the shipped model on `workloads`, logs in `out`, with the defaults.
    pub fn new(workloads: Vec<Workload>, out: PathBuf) -> Self {
        SearchEvalOptions {
            workloads,
            network: None,
            tasks: None,
            dtype: DType::F32,
            wdtype: None,
            trials: 64,
            random_trials: None,
            seeds: 2,
            model: ModelChoice::Shipped,
            population: 512,
            generations: 4,
            crossover: 0.3,
            threshold: 0.95,
            out,
            instructions: Vec::new(),
            threads: 1,
            no_pipeline: false,
            report_only: false,
            worker_exe: None,
        }
    }
}

/// The ranking a run used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Ranking {
    /// The cost model under evaluation.
    Model,
    /// `--model none`.
    Random,
}

impl Ranking {
    fn name(self) -> &'static str {
        match self {
            Ranking::Model => "model",
            Ranking::Random => "random",
        }
    }
}

/// One tuning run of one task.
#[derive(Clone, Debug, Serialize)]
pub struct SearchRun {
    /// The ranking.
    pub ranking: Ranking,
    /// The search's seed.
    pub seed: u64,
    /// Its log.
    pub log: PathBuf,
    /// Trials in the log (at most `budget`).
    pub trials: usize,
    /// Trials the run was given; a run that misses the threshold counts as this many.
    pub budget: usize,
    /// The best throughput after each trial (GFLOP/s; 0 before the first valid one).
    pub best_so_far: Vec<f64>,
    /// The first trial (1-based) whose best reached the threshold; `None`: not within the run.
    pub trials_to_threshold: Option<usize>,
    /// Wall time of the run when it ran in this call (s).
    pub wall_s: Option<f64>,
    /// Its search overhead (sampling, features, the model) as a share of that time, %.
    pub search_overhead_percent: Option<f64>,
}

/// One task: its runs and how the two rankings compare.
#[derive(Clone, Debug, Serialize)]
pub struct SearchTask {
    /// The workload spec.
    pub workload: String,
    /// The best throughput of any run (GFLOP/s): the reference the threshold is a share of.
    pub best_gflops: f64,
    /// Every run.
    pub runs: Vec<SearchRun>,
    /// Mean trials to the threshold with the model, a run that missed it counted as its budget.
    pub model_trials: f64,
    /// The same with the random ranking.
    pub random_trials: f64,
    /// Runs that missed the threshold, with the model and at random.
    pub missed: (usize, usize),
    /// Mean best throughput at the end, with the model and at random.
    pub final_gflops: (f64, f64),
    /// Trials to reach each random run's final best: the model's mean over (model run,
    /// random run) pairs, a miss counted as the model's budget, and random's own mean (the trial where
    /// it found its best). Exact where random never reached the threshold.
    pub to_random_best: (f64, f64),
    /// Pairs where the model missed random's final best.
    pub to_random_best_missed: usize,
}

/// What `search-eval` found.
#[derive(Clone, Debug, Serialize)]
pub struct SearchEvalReport {
    /// The model's name.
    pub model: String,
    /// Trials per run.
    pub trials: usize,
    /// Trials per random run.
    pub random_trials: usize,
    /// Seeds per ranking.
    pub seeds: u64,
    /// Sketches per generation.
    pub population: usize,
    /// Generations per round.
    pub generations: usize,
    /// Share of children bred by crossover.
    pub crossover: f64,
    /// The share of the best.
    pub threshold: f64,
    /// Per task.
    pub tasks: Vec<SearchTask>,
    /// Random's trials over the model's, summed over tasks: how many times fewer trials the
    /// model needs. A lower bound where random missed, an upper one where the model did.
    pub trials_ratio: Option<f64>,
    /// Random's trials to its own final best over the model's trials to reach it, summed
    /// over tasks: defined even where random never reaches the threshold.
    pub random_best_ratio: Option<f64>,
    /// Geometric mean over tasks of the model's best over random's best after
    /// `trials / 4`, `trials / 2` and `trials` trials (mean over seeds).
    pub best_ratio_at: Vec<(usize, f64)>,
}

/// Tunes every task with the model and at random, `seeds` runs each, and compares them.
pub fn search_eval(o: &SearchEvalOptions, progress: &mut dyn Progress) -> Result<SearchEvalReport> {
    if o.trials == 0 {
        bail!("--trials must be at least 1");
    }
    if o.random_trials == Some(0) {
        bail!("--random-trials must be at least 1");
    }
    let random_trials = o.random_trials.unwrap_or(o.trials);
    if o.seeds == 0 || o.seeds > MAX_SEEDS {
        bail!("--seeds {} is not between 1 and {MAX_SEEDS}", o.seeds);
    }
    if !(o.threshold > 0.0 && o.threshold <= 1.0) {
        bail!(
            "--threshold {} is not a share of the best in (0, 1]",
            o.threshold
        );
    }
    let workloads = task_list(o)?;
    // Everything tune would refuse is refused here, before the settings file is written.
    let mut template = TuneOptions::workload(workloads[0]);
    template.trials = o.trials;
    template.population = o.population;
    template.generations = o.generations;
    template.crossover = o.crossover;
    template.threads = o.threads;
    template.no_pipeline = o.no_pipeline;
    template.instructions = o.instructions.clone();
    template.worker_exe = o.worker_exe.clone();
    check_search_options(&template)?;
    if !o.instructions.is_empty() {
        cpu_instructions(&o.instructions)?;
    }
    let model_name = match &o.model {
        ModelChoice::Shipped => {
            // The one `tune` will choose for these instructions (all of this CPU's without
            // `--instructions`), named in the settings so that a resumed run keeps it.
            let ids = if o.instructions.is_empty() {
                host_instructions()
            } else {
                cpu_instructions(&o.instructions)?
            };
            match shipped_model(&ids.into_iter().collect(), progress) {
                Some((path, _)) => path,
                None => bail!(
                    "the shipped model could not be loaded (see the notes above); give --model FILE"
                ),
            }
        }
        ModelChoice::File(p) => {
            // A bad file fails here, before an hour of measurement starts.
            load_model(p)?;
            p.display().to_string()
        }
        ModelChoice::Roofline => "roofline".to_string(),
        ModelChoice::Random => bail!("--model none: random is the baseline; give a model"),
    };

    if o.report_only && !o.out.join(SETTINGS_FILE).is_file() {
        bail!(
            "--report-only: {} holds no search-eval runs ({SETTINGS_FILE} is missing)",
            o.out.display()
        );
    }
    std::fs::create_dir_all(&o.out)
        .with_context(|| format!("creating the log directory {}", o.out.display()))?;
    check_settings(o, &workloads, &model_name)?;
    let runs_per_task = 2 * o.seeds as usize;
    let total = workloads.len() * runs_per_task;
    let mut tasks = Vec::new();
    for (i, w) in workloads.iter().enumerate() {
        let mut runs = Vec::new();
        for ranking in [Ranking::Model, Ranking::Random] {
            for seed in 1..=o.seeds {
                let log = o
                    .out
                    .join(format!("task{i:02}-{}-s{seed}.jsonl", ranking.name()));
                let (mut wall_s, mut overhead) = (None, None);
                // A finished run is only read back (tune would re-measure its best).
                let budget = match ranking {
                    Ranking::Model => o.trials,
                    Ranking::Random => random_trials,
                };
                let mut records = read_run(&log, w, progress)?;
                if !o.report_only && records.len() < budget {
                    let done = runs.len() + i * runs_per_task + 1;
                    progress.note(&format!(
                        "run {done}/{total}: {w}, {} ranking, seed {seed}",
                        ranking.name()
                    ));
                    let mut t = template.clone();
                    t.workload = Some(*w);
                    t.trials = budget;
                    t.seed = seed;
                    t.log = Some(log.clone());
                    // The curves are the search's own timings.
                    t.no_remeasure = true;
                    t.model = match ranking {
                        Ranking::Model => o.model.clone(),
                        Ranking::Random => ModelChoice::Random,
                    };
                    let r = tune(&t, progress).with_context(|| {
                        format!("tuning {w} ({} ranking, seed {seed})", ranking.name())
                    })?;
                    if ranking == Ranking::Model && r.model == "random" {
                        bail!(
                            "the model could not be loaded, so the search ranked at random; see the notes above"
                        );
                    }
                    if r.measured_this_run > 0 {
                        wall_s = Some(r.search_time_s);
                        overhead = Some(r.search_overhead_percent);
                    }
                    records = read_run(&log, w, progress)?;
                }
                let best_so_far = best_so_far(&records, budget);
                runs.push(SearchRun {
                    ranking,
                    seed,
                    log,
                    trials: best_so_far.len(),
                    budget,
                    best_so_far,
                    trials_to_threshold: None,
                    wall_s,
                    search_overhead_percent: overhead,
                });
            }
        }
        tasks.push(compare_runs(w.to_string(), runs, o.threshold));
    }
    Ok(summarise(model_name, o, tasks))
}

/// The most runs per ranking and task.
const MAX_SEEDS: u64 = 100;

/// The file in `--out` that says what its runs are.
const SETTINGS_FILE: &str = "search-eval.json";

/// Writes the settings into `--out`, or checks them against those already there: a rerun
/// with other settings would resume runs of the first and mix the two in one report.
fn check_settings(o: &SearchEvalOptions, workloads: &[Workload], model: &str) -> Result<()> {
    let mut here = serde_json::json!({
        "workloads": workloads.iter().map(|w| w.to_string()).collect::<Vec<_>>(),
        "model": model,
        "trials": o.trials,
        "population": o.population,
        "generations": o.generations,
        "crossover": o.crossover,
        "instructions": o.instructions,
        "threads": o.threads,
    });
    // Only when it differs, so that directories of earlier versions still match.
    let random_trials = o.random_trials.unwrap_or(o.trials);
    if random_trials != o.trials
        && let Some(map) = here.as_object_mut()
    {
        map.insert("random_trials".into(), random_trials.into());
    }
    if o.no_pipeline
        && let Some(map) = here.as_object_mut()
    {
        map.insert("pipeline".into(), false.into());
    }
    let path = o.out.join(SETTINGS_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let there: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", path.display()))?;
            let differ: Vec<String> = here
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, v)| there.get(k.as_str()) != Some(*v))
                .map(|(k, v)| {
                    let was = there
                        .get(k.as_str())
                        .map_or("nothing".into(), |x| x.to_string());
                    format!("{k} {was} there, {v} here")
                })
                .collect();
            if !differ.is_empty() {
                bail!(
                    "{} holds runs of other settings ({}); give another --out",
                    o.out.display(),
                    differ.join("; ")
                );
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let text = serde_json::to_string_pretty(&here).map_err(crate::error::Error::invalid)?;
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// The workloads of the options, validated: the named ones, then the network's heaviest.
fn task_list(o: &SearchEvalOptions) -> Result<Vec<Workload>> {
    let mut out = Vec::new();
    for w in &o.workloads {
        w.validate().with_context(|| format!("workload `{w}`"))?;
        out.push(*w);
    }
    if let Some(name) = &o.network {
        let types = tessel_ir::Types {
            dtype: o.dtype,
            wdtype: o.wdtype.unwrap_or(o.dtype),
        };
        let net = tessel_ir::network_with_types(name, 1, types)?;
        let mut tasks = net.tasks();
        // Heaviest first: what a network's latency is made of.
        tasks.sort_by(|a, b| {
            let cost = |t: &tessel_ir::Task| t.weight as f64 * t.workload.flops() as f64;
            cost(b).total_cmp(&cost(a))
        });
        let n = o.tasks.unwrap_or(tasks.len());
        if n == 0 {
            bail!("--tasks must be at least 1");
        }
        out.extend(tasks.into_iter().take(n).map(|t| t.workload));
    } else if o.tasks.is_some() {
        bail!("--tasks picks a network's heaviest tasks; give --network");
    }
    if out.is_empty() {
        bail!("give --workload SPEC (repeatable) or --network NAME");
    }
    Ok(out)
}

/// A run's records of `w`, in the order they were measured; not the finalists a `tune` into
/// the same log timed again after its search (those are no trials, and as the latest
/// timings of their schedules they would move them to the end).
fn read_run(log: &Path, w: &Workload, progress: &mut dyn Progress) -> Result<Vec<TuningRecord>> {
    let spec = w.to_string();
    let mut contents = read_log_noting_raw(log, progress)?;
    contents
        .records
        .retain(|r| r.workload == spec && r.sampler.as_deref() != Some(REMEASURE_SAMPLER));
    Ok(contents.latest().records)
}

/// The best valid throughput after each of the first `trials` records. Failed runs are
/// trials that found nothing; a censored record's time is a lower bound, so its throughput
/// is no evidence either.
pub fn best_so_far(records: &[TuningRecord], trials: usize) -> Vec<f64> {
    let mut best = 0.0f64;
    records
        .iter()
        .take(trials)
        .map(|r| {
            if let Ok(m) = &r.result
                && !m.censored
                && m.gflops.is_finite()
            {
                best = best.max(m.gflops);
            }
            best
        })
        .collect()
}

/// The first trial (1-based) whose best reaches `target`.
pub fn trials_to_reach(best_so_far: &[f64], target: f64) -> Option<usize> {
    best_so_far.iter().position(|&g| g >= target).map(|i| i + 1)
}

/// Fills the runs' threshold trials against the best of all of them.
fn compare_runs(workload: String, mut runs: Vec<SearchRun>, threshold: f64) -> SearchTask {
    let best = runs
        .iter()
        .filter_map(|r| r.best_so_far.last().copied())
        .fold(0.0f64, f64::max);
    for r in &mut runs {
        r.trials_to_threshold = (best > 0.0)
            .then(|| trials_to_reach(&r.best_so_far, threshold * best))
            .flatten();
    }
    let of = |ranking: Ranking| runs.iter().filter(move |r| r.ranking == ranking);
    let mean = |xs: Vec<f64>| xs.iter().sum::<f64>() / xs.len().max(1) as f64;
    let needed = |ranking| {
        mean(
            of(ranking)
                .map(|r| r.trials_to_threshold.unwrap_or(r.budget) as f64)
                .collect(),
        )
    };
    let missed = |ranking| {
        of(ranking)
            .filter(|r| r.trials_to_threshold.is_none())
            .count()
    };
    let last = |ranking| {
        mean(
            of(ranking)
                .map(|r| r.best_so_far.last().copied().unwrap_or(0.0))
                .collect(),
        )
    };
    let mut model_to = Vec::new();
    let mut random_to = Vec::new();
    let mut to_missed = 0;
    for r in of(Ranking::Random) {
        let Some(&goal) = r.best_so_far.last().filter(|&&g| g > 0.0) else {
            continue;
        };
        random_to.push(trials_to_reach(&r.best_so_far, goal).unwrap_or(r.budget) as f64);
        for m in of(Ranking::Model) {
            let n = trials_to_reach(&m.best_so_far, goal);
            to_missed += usize::from(n.is_none());
            model_to.push(n.unwrap_or(m.budget) as f64);
        }
    }
    SearchTask {
        workload,
        to_random_best: (mean(model_to), mean(random_to)),
        to_random_best_missed: to_missed,
        best_gflops: best,
        model_trials: needed(Ranking::Model),
        random_trials: needed(Ranking::Random),
        missed: (missed(Ranking::Model), missed(Ranking::Random)),
        final_gflops: (last(Ranking::Model), last(Ranking::Random)),
        runs,
    }
}

/// The report's summary figures over tasks.
fn summarise(model: String, o: &SearchEvalOptions, tasks: Vec<SearchTask>) -> SearchEvalReport {
    let found: Vec<&SearchTask> = tasks.iter().filter(|t| t.best_gflops > 0.0).collect();
    let model_sum: f64 = found.iter().map(|t| t.model_trials).sum();
    let random_sum: f64 = found.iter().map(|t| t.random_trials).sum();
    let trials_ratio = (model_sum > 0.0).then(|| random_sum / model_sum);
    let model_to: f64 = found.iter().map(|t| t.to_random_best.0).sum();
    let random_to: f64 = found.iter().map(|t| t.to_random_best.1).sum();
    let random_best_ratio = (model_to > 0.0).then(|| random_to / model_to);
    let mut best_ratio_at = Vec::new();
    let mut points = vec![o.trials / 4, o.trials / 2, o.trials];
    points.retain(|&p| p > 0);
    points.dedup();
    for at in points {
        let mut logs = Vec::new();
        for t in &found {
            let mean_at = |ranking: Ranking| {
                let xs: Vec<f64> = t
                    .runs
                    .iter()
                    .filter(|r| r.ranking == ranking)
                    .filter_map(|r| r.best_so_far.get(at - 1).or(r.best_so_far.last()).copied())
                    .collect();
                xs.iter().sum::<f64>() / xs.len().max(1) as f64
            };
            let (m, r) = (mean_at(Ranking::Model), mean_at(Ranking::Random));
            if m > 0.0 && r > 0.0 {
                logs.push((m / r).ln());
            }
        }
        if !logs.is_empty() {
            best_ratio_at.push((at, (logs.iter().sum::<f64>() / logs.len() as f64).exp()));
        }
    }
    SearchEvalReport {
        model,
        trials: o.trials,
        random_trials: o.random_trials.unwrap_or(o.trials),
        seeds: o.seeds,
        population: o.population,
        generations: o.generations,
        crossover: o.crossover,
        threshold: o.threshold,
        tasks,
        trials_ratio,
        random_best_ratio,
        best_ratio_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ranking: Ranking, seed: u64, best_so_far: Vec<f64>) -> SearchRun {
        SearchRun {
            ranking,
            seed,
            log: PathBuf::new(),
            trials: best_so_far.len(),
            budget: best_so_far.len(),
            best_so_far,
            trials_to_threshold: None,
            wall_s: None,
            search_overhead_percent: None,
        }
    }

    #[test]
    fn the_threshold_is_a_share_of_the_best_any_run_found() {
        // The model reaches 95 (95% of 100) at trial 2; random reaches 100 at trial 4 and
        // misses it in its second run, which counts as all 4 trials.
        let t = compare_runs(
            "gemm".into(),
            vec![
                run(Ranking::Model, 1, vec![50.0, 96.0, 96.0, 96.0]),
                run(Ranking::Random, 1, vec![10.0, 20.0, 30.0, 100.0]),
                run(Ranking::Random, 2, vec![10.0, 20.0, 30.0, 40.0]),
            ],
            0.95,
        );
        assert_eq!(t.best_gflops, 100.0);
        assert_eq!(t.runs[0].trials_to_threshold, Some(2));
        assert_eq!(t.runs[1].trials_to_threshold, Some(4));
        assert_eq!(t.runs[2].trials_to_threshold, None);
        assert_eq!(t.model_trials, 2.0);
        assert_eq!(t.random_trials, 4.0);
        assert_eq!(t.missed, (0, 1));
        assert_eq!(t.final_gflops, (96.0, 70.0));
        // Random's bests, 100 at its trial 4 and 40 at its trial 4: the model reaches 40 at
        // trial 1 and never 100 (counted as 4 trials, one miss).
        assert_eq!(t.to_random_best, ((4.0 + 1.0) / 2.0, 4.0));
        assert_eq!(t.to_random_best_missed, 1);
    }

    #[test]
    fn a_run_that_misses_counts_as_its_own_budget() {
        // Random was given 8 trials, the model 2: random's miss counts as 8, the model's as 2.
        let t = compare_runs(
            "gemm".into(),
            vec![
                run(Ranking::Model, 1, vec![100.0, 100.0]),
                run(Ranking::Model, 2, vec![10.0, 20.0]),
                run(Ranking::Random, 1, vec![10.0; 8]),
            ],
            0.95,
        );
        assert_eq!(t.model_trials, (1.0 + 2.0) / 2.0);
        assert_eq!(t.random_trials, 8.0);
        assert_eq!(t.missed, (1, 1));
    }

    #[test]
    fn trials_to_reach_counts_from_one() {
        assert_eq!(trials_to_reach(&[1.0, 5.0, 9.0], 5.0), Some(2));
        assert_eq!(trials_to_reach(&[1.0, 5.0, 9.0], 10.0), None);
        assert_eq!(trials_to_reach(&[], 1.0), None);
    }

    #[test]
    fn a_task_where_nothing_ran_is_left_out_of_the_summary() {
        let o = SearchEvalOptions::new(Vec::new(), PathBuf::new());
        let t = compare_runs(
            "bad".into(),
            vec![
                run(Ranking::Model, 1, vec![0.0]),
                run(Ranking::Random, 1, vec![0.0]),
            ],
            0.95,
        );
        let r = summarise("m".into(), &o, vec![t]);
        assert_eq!(r.trials_ratio, None);
        assert!(r.best_ratio_at.is_empty());
    }
}
