//! Evolutionary search per task and the multi-task tuner.
//!
//! Each round picks a task (Ansor-style: where the network's estimated latency can drop the
//! most), proposes a batch for it (a population sampled from the space and mutated from the
//! best measured sketches, ranked by the [`CostModel`], the top of it plus an epsilon share of
//! random candidates), measures the batch, appends it to the log, and updates the model.

use std::collections::HashSet;
use std::time::Instant;

use serde::Serialize;
use tessel_ir::{Program, Step, Trace, Workload};
use tessel_measure::{CostModel, MeasureResult, Measurer};

use crate::error::SearchError;
use crate::records::{RecordLog, TuningRecord};
use crate::rng::Rng;
use crate::space::{InstructionSet, Sketch, Space};

/// Scores uniformly at random: the baseline every learned model must beat.
pub struct RandomModel {
    rng: Rng,
}

impl RandomModel {
    pub fn new(seed: u64) -> Self {
        RandomModel {
            rng: Rng::new(seed ^ 0x5eed),
        }
    }
}

impl CostModel for RandomModel {
    fn name(&self) -> String {
        "random".into()
    }

    fn predict(&mut self, programs: &[&Program]) -> Vec<f64> {
        programs.iter().map(|_| self.rng.unit()).collect()
    }

    fn update(&mut self, _programs: &[&Program], _results: &[MeasureResult]) {}
}

/// Knobs of the search; the same options and seed give the same run.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchOptions {
    /// Sketches per generation.
    pub population: usize,
    /// Rounds of mutation and selection by the model before a batch is chosen.
    pub generations: usize,
    /// Candidates measured per round.
    pub batch: usize,
    /// Share of each batch drawn at random instead of by score.
    pub epsilon: f64,
    /// Share of each generation's children bred by crossover of two parents
    /// ([`crate::Space::crossover`]) instead of mutating one.
    pub crossover: f64,
    /// Propose each batch one round early, while the one before it is measured, so that it
    /// compiles on a spare core meanwhile ([`Measurer::prefetch`]). The early batch cannot
    /// learn from the results of the batch it overlaps: the model and the elites it is bred
    /// from are one batch behind. Only where the measurer prefetches
    /// ([`Measurer::prefetches`]); elsewhere the search is the same as without.
    pub pipeline: bool,
    /// Time each candidate with its weights packed beforehand where its schedule packs them
    /// at its root ([`tessel_measure::Candidate::prepacked_weights`]): the latency of the
    /// pre-packed entry point `export` ships. Records say so, and a run resumes only records
    /// timed the same way.
    pub prepacked_weights: bool,
    pub seed: u64,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            population: 64,
            generations: 2,
            batch: 16,
            epsilon: 0.2,
            crossover: 0.0,
            pipeline: false,
            prepacked_weights: false,
            seed: 1,
        }
    }
}

/// The best candidate of a task so far.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Best {
    pub latency_s: f64,
    pub gflops: f64,
    pub trace: Trace,
    pub mapping: Option<String>,
}

/// One workload to tune and what is known of it.
pub struct Task {
    pub workload: Workload,
    pub weight: u64,
    space: Space,
    measured: HashSet<String>,
    /// Proposed and not measured yet (a pipelined batch in flight): never proposed again.
    pending: HashSet<String>,
    elites: Vec<(f64, Sketch)>,
    pub best: Option<Best>,
    /// The candidates worth timing again after the search ([`Task::finalists`]).
    contenders: Vec<Contender>,
    /// The space's seeds proposed for this task (trace keys).
    seed_keys: HashSet<String>,
    /// Candidates measured (this run and resumed from the log).
    pub trials: usize,
    /// Best latency after each round, for the task scheduler.
    history: Vec<f64>,
    /// Set when the space has nothing left to propose.
    pub exhausted: bool,
}

impl Task {
    pub fn new(workload: Workload, weight: u64, set: &InstructionSet) -> Self {
        let op = workload.to_op();
        Task {
            space: Space::new(&op, set),
            workload,
            weight,
            measured: HashSet::new(),
            pending: HashSet::new(),
            elites: Vec::new(),
            best: None,
            contenders: Vec::new(),
            seed_keys: HashSet::new(),
            trials: 0,
            history: Vec::new(),
            exhausted: false,
        }
    }

    pub fn space(&self) -> &Space {
        &self.space
    }

    /// weight x best latency (seconds), the task's share of the network's estimated latency.
    pub fn weighted_latency(&self) -> Option<f64> {
        self.best.as_ref().map(|b| b.latency_s * self.weight as f64)
    }

    /// Measured, or proposed and about to be.
    fn known(&self, key: &str) -> bool {
        self.measured.contains(key) || self.pending.contains(key)
    }

    fn record(
        &mut self,
        trace: &Trace,
        mapping: Option<String>,
        sketch: Option<&Sketch>,
        r: &MeasureResult,
    ) {
        self.trials += 1;
        let key = trace.to_json();
        let seed = self.seed_keys.contains(&key);
        self.pending.remove(&key);
        self.measured.insert(key.clone());
        let Ok(m) = r else { return };
        let lat = m.timing.median_s;
        if let Some(s) = sketch {
            self.elites.push((lat, s.clone()));
            self.elites.sort_by(|a, b| a.0.total_cmp(&b.0));
            self.elites.truncate(16);
        }
        let this = Best {
            latency_s: lat,
            gflops: m.gflops,
            trace: trace.clone(),
            mapping,
        };
        // A timing cut short is one run, enough to rank a slow schedule but not a finalist.
        if !m.cut_short {
            self.contenders.push(Contender {
                key,
                min_s: m.timing.min_s,
                seed,
                best: this.clone(),
            });
            prune_contenders(&mut self.contenders);
        }
        if self.best.as_ref().is_none_or(|b| lat < b.latency_s) {
            self.best = Some(this);
        }
    }

    /// The candidates to time again once the search is over, the fastest by median first:
    /// the [`FINALISTS_BY_EACH`] fastest by median, the as many fastest by their fastest run
    /// (a kernel timed in a slow stretch of the machine keeps its fastest run lower than its
    /// median), and the space's seeds (known-good schedules, timed first, when a fresh
    /// worker and a cold machine make timings least reliable). In a peers run the direct
    /// convolution seed measured 2.77 ms in the search's first batch and 2.04 ms when timed
    /// again, and the search ended on a 2.18 ms schedule.
    pub fn finalists(&self) -> Vec<&Best> {
        self.contenders.iter().map(|c| &c.best).collect()
    }
}

/// A measured candidate that may be a finalist: its trace key, its fastest run, whether it
/// is a seed, and its search timing (`best.latency_s`, the median).
#[derive(Clone, Debug)]
struct Contender {
    key: String,
    min_s: f64,
    seed: bool,
    best: Best,
}

/// How many of the fastest candidates by median, and as many by fastest run, are timed
/// again after the search (with the seeds).
pub const FINALISTS_BY_EACH: usize = 3;

/// Keeps the seeds and the [`FINALISTS_BY_EACH`] fastest by median and by fastest run,
/// fastest by median first.
fn prune_contenders(c: &mut Vec<Contender>) {
    let top = |c: &[Contender], by: fn(&Contender) -> f64| -> Vec<String> {
        let mut v: Vec<&Contender> = c.iter().collect();
        v.sort_by(|a, b| by(a).total_cmp(&by(b)));
        v.iter()
            .take(FINALISTS_BY_EACH)
            .map(|x| x.key.clone())
            .collect()
    };
    let keep: HashSet<String> = top(c, |x| x.best.latency_s)
        .into_iter()
        .chain(top(c, |x| x.min_s))
        .collect();
    c.retain(|x| x.seed || keep.contains(&x.key));
    c.sort_by(|a, b| a.best.latency_s.total_cmp(&b.best.latency_s));
}

/// How many times slower than the task's best a checked run may be before it is the only
/// run: such a schedule ranks near the bottom either way, and its timed runs would cost five times a
/// good one's.
pub const CUT_SHORT_FACTOR: f64 = 5.0;
/// Checked runs shorter than this are never cut: the first call of a kernel pays page faults
/// and the OpenMP pool's start, which can dwarf a microsecond kernel, and timing short
/// kernels costs little anyway.
pub const CUT_SHORT_FLOOR_S: f64 = 0.005;

/// A wait for the background compilation longer than this means it was still running.
const HIDDEN_WAIT_S: f64 = 0.001;

/// The checked-run budget of a task whose best so far takes `best_s` seconds.
pub fn cut_short_budget(best_s: f64) -> f64 {
    (best_s * CUT_SHORT_FACTOR).max(CUT_SHORT_FLOOR_S)
}

/// Counters of a tuning run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Stats {
    /// Candidates measured in this run (errors included).
    pub measured: usize,
    pub errors: usize,
    /// Records taken from the log instead of being measured again.
    pub resumed: usize,
    /// Corrupt lines skipped in the log.
    pub corrupt_lines: usize,
    /// Samples rejected before compilation (capacity checks, invalid schedules).
    pub rejected: usize,
    /// Log records of a task whose trace does not replay on it, that use an instruction
    /// outside the search's set, or that were timed with the weights pre-packed when this
    /// run does not pre-pack them, or the other way round (not counted as trials).
    pub resume_rejected: usize,
    /// Candidates whose checked run was so slow that it was their only run.
    pub cut_short: usize,
    /// Wall time inside the measurer (code generation, compilation, measurement; in a
    /// pipelined run, waiting for the background compilation too).
    pub measure_time_s: f64,
    /// Wall time of the whole run.
    pub total_time_s: f64,
    /// Search time (proposing, logging, learning) that a pipelined run spent while the
    /// batch about to be measured was still compiling on the spare core: it cost no wall time.
    pub overlapped_s: f64,
}

impl Stats {
    /// The wall time the search added: everything but compiling and measuring, less what
    /// overlapped a compilation (pipelined runs), in seconds.
    pub fn search_overhead_s(&self) -> f64 {
        (self.total_time_s - self.measure_time_s - self.overlapped_s).max(0.0)
    }
}

/// Where a run stands, for progress bars.
#[derive(Clone)]
pub struct Progress<'a> {
    pub trials: usize,
    pub total: usize,
    pub task: &'a Task,
}

/// Drives the search over tasks: proposes, measures, logs, learns.
pub struct Tuner<'a> {
    measurer: &'a mut dyn Measurer,
    model: &'a mut dyn CostModel,
    log: Option<RecordLog>,
    target: String,
    opts: SearchOptions,
    rng: Rng,
    pub stats: Stats,
    /// When the measurer last returned.
    measured_at: Instant,
}

struct Proposal {
    sketch: Sketch,
    trace: Trace,
    program: Program,
    /// The trace as JSON, the key that tells schedules apart (computed once).
    key: String,
    /// The model's score, once this round has scored it (the model changes only between
    /// rounds, so a survivor of one generation keeps its score in the next).
    score: Option<f64>,
}

impl<'a> Tuner<'a> {
    pub fn new(
        measurer: &'a mut dyn Measurer,
        model: &'a mut dyn CostModel,
        log: Option<RecordLog>,
        target: &str,
        opts: SearchOptions,
    ) -> Self {
        let rng = Rng::new(opts.seed);
        Tuner {
            measurer,
            model,
            log,
            target: target.to_string(),
            opts,
            rng,
            stats: Stats::default(),
            measured_at: Instant::now(),
        }
    }

    /// The log back, to append to after the search (a dataset interleaves its random
    /// samples and search rounds in one file).
    pub fn into_log(self) -> Option<RecordLog> {
        self.log
    }

    /// Takes what the log already holds for these tasks on this target and machine: those
    /// candidates count as trials, set the bests, and are never measured again.
    pub fn resume(&mut self, tasks: &mut [Task], records: &[TuningRecord]) {
        let fp = self.measurer.fingerprint().key();
        for r in records {
            if r.target != self.target || r.fingerprint.key() != fp {
                continue;
            }
            let spec = r.workload.as_str();
            let Some(t) = tasks.iter_mut().find(|t| t.workload.to_string() == spec) else {
                continue;
            };
            // Timed with the weights packed beforehand, or not: another latency.
            if r.prepacked_weights != self.opts.prepacked_weights {
                self.stats.resume_rejected += 1;
                continue;
            }
            // A trace that does not replay on the task is not a trial of it, nor is one on
            // an instruction outside the set this search may use (`tune --instructions`).
            let outside = r.trace.steps.iter().any(|s| match s {
                Step::Tensorize { intrinsic, .. } => !t
                    .space
                    .mappings()
                    .iter()
                    .any(|m| m.intrinsic.id == intrinsic),
                _ => false,
            });
            if outside || r.trace.lower(t.space.op(), t.space.catalog()).is_err() {
                self.stats.resume_rejected += 1;
                continue;
            }
            if !t.measured.contains(&r.trace.to_json()) {
                t.record(&r.trace, r.mapping.clone(), None, &r.result);
                self.stats.resumed += 1;
            }
        }
    }

    /// Tunes until every task together has `trials` measured candidates (resumed ones count)
    /// or every space is exhausted.
    pub fn tune(
        &mut self,
        tasks: &mut [Task],
        trials: usize,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<(), SearchError> {
        if tasks.is_empty() {
            return Err(SearchError::NoTasks);
        }
        let start = Instant::now();
        let batch = self.opts.batch.max(1);
        let pipelined = self.opts.pipeline && self.measurer.prefetches();
        // The batch proposed early (pipelined), with its task.
        let mut ahead: Option<(usize, Vec<Proposal>)> = None;
        // When the search last took over from the measurer.
        let mut searching_since = Instant::now();
        loop {
            let done: usize = tasks.iter().map(|t| t.trials).sum();
            if done >= trials || tasks.iter().all(|t| t.exhausted) {
                break;
            }
            let compiling = ahead.is_some();
            let (ti, proposals) = match ahead.take() {
                Some(next) => next,
                None => {
                    let Some(ti) = self.pick_task(tasks) else {
                        break;
                    };
                    let room = (trials - done).min(batch);
                    (ti, self.propose(&mut tasks[ti], room))
                }
            };
            if proposals.is_empty() {
                tasks[ti].exhausted = true;
                continue;
            }
            let left = trials.saturating_sub(done + proposals.len());
            if pipelined && left > 0 {
                // The next batch now, so that it compiles while this one is timed.
                tasks[ti]
                    .pending
                    .extend(proposals.iter().map(|p| p.key.clone()));
                if let Some(tj) = self.pick_task(tasks) {
                    let next = self.propose(&mut tasks[tj], left.min(batch));
                    let cands = self.candidates(&tasks[tj], &next);
                    // Waits for this batch's compilation, then starts the next one's.
                    let t = Instant::now();
                    self.measurer.prefetch(&cands);
                    let waited = t.elapsed().as_secs_f64();
                    self.stats.measure_time_s += waited;
                    // Still compiling when the search was done: the search was hidden.
                    if compiling && waited > HIDDEN_WAIT_S {
                        self.stats.overlapped_s += t.duration_since(searching_since).as_secs_f64();
                    }
                    ahead = Some((tj, next));
                }
            }
            self.measure_batch(&mut tasks[ti], proposals)?;
            searching_since = self.measured_at;
            let best = tasks[ti]
                .best
                .as_ref()
                .map_or(f64::INFINITY, |b| b.latency_s);
            tasks[ti].history.push(best);
            progress(&Progress {
                trials: tasks.iter().map(|t| t.trials).sum(),
                total: trials,
                task: &tasks[ti],
            });
        }
        self.stats.total_time_s += start.elapsed().as_secs_f64();
        Ok(())
    }

    /// The task where the next batch should most reduce sum(weight x best latency): tasks
    /// never measured first (heaviest first), then weight x latency x recent improvement,
    /// with a floor so that no task starves.
    fn pick_task(&mut self, tasks: &[Task]) -> Option<usize> {
        let open: Vec<usize> = (0..tasks.len()).filter(|&i| !tasks[i].exhausted).collect();
        if let Some(&i) = open
            .iter()
            .filter(|&&i| tasks[i].best.is_none() && tasks[i].history.len() < 2)
            .max_by_key(|&&i| tasks[i].weight * tasks[i].workload.flops())
        {
            return Some(i);
        }
        open.into_iter().max_by(|&a, &b| {
            let score = |t: &Task| {
                let Some(w) = t.weighted_latency() else {
                    return 0.0;
                };
                let h = &t.history;
                let gain = if h.len() >= 3 {
                    ((h[h.len() - 3] - h[h.len() - 1]) / h[h.len() - 3]).max(0.0)
                } else {
                    1.0
                };
                w * (gain + 0.05)
            };
            score(&tasks[a]).total_cmp(&score(&tasks[b]))
        })
    }

    fn valid(&mut self, task: &Task, s: Sketch) -> Option<Proposal> {
        match task.space.lower(&s) {
            Ok((trace, program)) => Some(Proposal {
                sketch: s,
                key: trace.to_json(),
                trace,
                program,
                score: None,
            }),
            Err(_) => {
                self.stats.rejected += 1;
                None
            }
        }
    }

    fn random_valid(&mut self, task: &Task, attempts: usize) -> Vec<Proposal> {
        let mut out = Vec::new();
        for _ in 0..attempts {
            let s = task.space.sample(&mut self.rng);
            if let Some(p) = self.valid(task, s) {
                out.push(p);
            }
        }
        out
    }

    fn propose(&mut self, task: &mut Task, n: usize) -> Vec<Proposal> {
        let pop = self.opts.population.max(n);
        let mut pool = self.random_valid(task, pop);
        let elites: Vec<Sketch> = task.elites.iter().map(|e| e.1.clone()).collect();
        for g in 0..=self.opts.generations {
            // Children of the measured elites and of the pool's best.
            let parents: Vec<Sketch> = elites
                .iter()
                .cloned()
                .chain(pool.iter().take(pop / 2).map(|p| p.sketch.clone()))
                .collect();
            if g > 0 || !elites.is_empty() {
                for _ in 0..pop / 2 {
                    if parents.is_empty() {
                        break;
                    }
                    let parent = &parents[self.rng.below(parents.len() as u64) as usize];
                    // No draw at a share of 0, so such a run replays those before crossover.
                    let child = if self.opts.crossover > 0.0
                        && parents.len() > 1
                        && self.rng.unit() < self.opts.crossover
                    {
                        let other = &parents[self.rng.below(parents.len() as u64) as usize];
                        task.space.crossover(parent, other, &mut self.rng)
                    } else {
                        task.space.mutate(parent, &mut self.rng)
                    };
                    if let Some(p) = self.valid(task, child) {
                        pool.push(p);
                    }
                }
            }
            // Distinct, unmeasured, ranked by the model; only the new ones are scored.
            let mut seen = HashSet::new();
            pool.retain(|p| !task.known(&p.key) && seen.insert(p.key.clone()));
            let unscored: Vec<usize> = (0..pool.len())
                .filter(|&i| pool[i].score.is_none())
                .collect();
            let programs: Vec<&Program> = unscored.iter().map(|&i| &pool[i].program).collect();
            let scores = self.model.predict(&programs);
            for (i, score) in unscored.into_iter().zip(scores) {
                pool[i].score = Some(score);
            }
            let score = |p: &Proposal| p.score.unwrap_or(f64::NEG_INFINITY);
            // Stable: equal scores keep their order, as before.
            pool.sort_by(|a, b| score(b).total_cmp(&score(a)));
            pool.truncate(pop);
        }
        let n_random = ((n as f64) * self.opts.epsilon).round() as usize;
        // The first batch of a task starts with the space's known-good seeds (at most half).
        let mut batch: Vec<Proposal> = Vec::new();
        let mut keys: HashSet<String> = HashSet::new();
        if task.measured.is_empty() && task.pending.is_empty() {
            for s in task.space.seeds().into_iter().take(n / 2) {
                if let Some(p) = self.valid(task, s)
                    && keys.insert(p.key.clone())
                {
                    task.seed_keys.insert(p.key.clone());
                    batch.push(p);
                }
            }
        }
        // Then the model's best, up to the share not drawn at random.
        let ranked_share = n - n_random.min(n);
        for p in pool {
            if batch.len() >= ranked_share {
                break;
            }
            if keys.insert(p.key.clone()) {
                batch.push(p);
            }
        }
        for p in self.random_valid(task, 4 * n) {
            if batch.len() >= n {
                break;
            }
            let k = p.key.clone();
            if !task.known(&k) && keys.insert(k) {
                batch.push(p);
            }
        }
        batch
    }

    /// What the measurer gets of a batch: each trace on the task's operator, with the
    /// checked-run budget of the task's best so far.
    fn candidates(&self, task: &Task, batch: &[Proposal]) -> Vec<tessel_measure::Candidate> {
        let op = task.space.op();
        let budget = task.best.as_ref().map(|b| cut_short_budget(b.latency_s));
        let weights = task
            .workload
            .weight_input()
            .filter(|_| self.opts.prepacked_weights);
        batch
            .iter()
            .map(|p| {
                tessel_measure::Candidate::new(op.clone(), p.trace.clone())
                    .with_budget(budget)
                    .with_prepacked_weights(weights)
            })
            .collect()
    }

    fn measure_batch(&mut self, task: &mut Task, batch: Vec<Proposal>) -> Result<(), SearchError> {
        let cands = self.candidates(task, &batch);
        let t = Instant::now();
        let results = self.measurer.measure(&cands);
        self.measured_at = Instant::now();
        self.stats.measure_time_s += self.measured_at.duration_since(t).as_secs_f64();
        let fp = self.measurer.fingerprint().clone();
        let records: Vec<TuningRecord> = batch
            .iter()
            .zip(&results)
            .map(|(p, r)| {
                TuningRecord::new(
                    &task.workload,
                    &self.target,
                    fp.clone(),
                    p.trace.clone(),
                    task.space.mapping_label(&p.sketch),
                    r.clone(),
                )
                .with_sampler("search")
                .with_prepacked_weights(self.opts.prepacked_weights)
            })
            .collect();
        // Durable before anything learns from it.
        if let Some(log) = &mut self.log {
            log.append(&records)?;
        }
        for (p, r) in batch.iter().zip(&results) {
            self.stats.measured += 1;
            match r {
                Err(_) => self.stats.errors += 1,
                Ok(m) if m.cut_short => self.stats.cut_short += 1,
                Ok(_) => {}
            }
            let label = task.space.mapping_label(&p.sketch);
            task.record(&p.trace, label, Some(&p.sketch), r);
        }
        let programs: Vec<&Program> = batch.iter().map(|p| &p.program).collect();
        self.model.update(&programs, &results);
        Ok(())
    }
}
