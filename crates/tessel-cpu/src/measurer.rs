//! [`CpuMeasurer`]: the [`Measurer`] of the local CPU.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tessel_intrin::{Catalog, HostCpu};
use tessel_ir::ComputeOp;
use tessel_measure::{
    Candidate, HardwareFingerprint, MeasureError, MeasureErrorKind, MeasureResult, Measurement,
    Measurer,
};

use crate::codegen::{Kernel, generate, generate_prepacked, module_source};
use crate::compile::{Compiler, Library, Mode, content_key};
use crate::error::{CodegenError, CompileError, CpuError};
use crate::fingerprint::fingerprint;
use crate::worker::{
    Job, Phase, Prepack, Reference, Reply, TimingOptions, Worker, WorkerCommand, tolerance,
};
use tessel_measure::worker::WorkerError;

/// How the CPU measurer runs candidates.
#[derive(Clone, Debug)]
pub struct CpuOptions {
    /// OpenMP threads per kernel.
    pub threads: usize,
    /// Run kernels whose instructions this CPU lacks on the scalar emulation of those
    /// instructions: a correctness check, flagged `emulated`, never a real timing.
    pub emulate: bool,
    pub timing: TimingOptions,
    /// Longest a worker may take for one candidate (check and timing) before it is killed.
    pub timeout: Duration,
    /// Operators up to this many multiply-accumulates are checked against tessel-ir's
    /// interpreter; larger ones against a naive C kernel.
    pub interpreter_max_macs: u64,
    /// Seed of the random inputs.
    pub seed: u64,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            threads: 1,
            emulate: false,
            timing: TimingOptions::default(),
            timeout: Duration::from_secs(60),
            interpreter_max_macs: 1 << 21,
            seed: 1,
        }
    }
}

/// A generated (or, for tests, hand-written) kernel ready to compile and measure.
#[derive(Clone, Debug)]
pub struct KernelJob {
    pub op: ComputeOp,
    pub kernel: Kernel,
    pub mode: Mode,
    /// The candidate's budget for its checked run ([`Candidate::budget_s`]).
    pub budget_s: Option<f64>,
    /// The function that packs the weights of a pre-packed `kernel`, with the input it packs
    /// and the packed size in bytes ([`Candidate::prepacked_weights`]).
    pub pack: Option<(Kernel, usize, u64)>,
}

/// A checked run still going after this many budgets is stopped and recorded as censored
/// (a lower bound on its time, never checked): a schedule 10x slower than the task's best
/// (budgets are 5x the best) tells the data all it can. On LLaMA prefill's 46 GFLOP GEMMs,
/// censored runs at four budgets took 62% of the kernels' time.
const CHECK_DEADLINE_BUDGETS: f64 = 2.0;
/// ... but no later than this unless half a budget is longer: past the task's best several
/// times over, the runs only tell how bad a bad schedule is, and on a task whose best takes
/// half a second (budget 2.6 s) checks stopped at two budgets were half of its records' cost.
const CHECK_DEADLINE_LONG_S: f64 = 2.0;
/// The share of a budget a check always gets when [`CHECK_DEADLINE_LONG_S`] is shorter: 2.5x
/// the task's best at 5x budgets.
const CHECK_DEADLINE_MIN_BUDGETS: f64 = 0.5;
/// ... but never before this: restarting the worker and preparing again costs more than a
/// short run.
const CHECK_DEADLINE_FLOOR_S: f64 = 0.5;

/// How long one kernel compiled on its own (after its batch failed to build) may take.
const KERNEL_COMPILE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Builds `kernels` into one module with `compiler`.
fn build_with(
    compiler: &Compiler,
    kernels: &[&Kernel],
    mode: Mode,
) -> Result<Library, CompileError> {
    let features: BTreeSet<String> = kernels
        .iter()
        .flat_map(|k| k.features.iter().cloned())
        .collect();
    compiler.compile(&module_source(kernels), &features, mode)
}

/// Measures candidates on this CPU: lowers each trace, generates C, compiles a batch into one
/// shared object, and checks and times each kernel in a worker process.
pub struct CpuMeasurer {
    opts: CpuOptions,
    compiler: Compiler,
    worker: Worker,
    catalog: Catalog,
    fingerprint: HardwareFingerprint,
    /// The background compilation of the batch `prefetch` announced, with its key.
    prefetching: Option<(String, std::thread::JoinHandle<()>)>,
    /// How long the prefetch took to build each library, so that records keep their real
    /// compile time when `measure` finds the library in the cache.
    prefetched: std::sync::Arc<std::sync::Mutex<BTreeMap<std::path::PathBuf, f64>>>,
}

/// One shared object of a batch: the kernels of one build mode and the references of those
/// that need a compiled one.
struct ModulePlan {
    mode: Mode,
    /// Jobs in the module, each with how its result is checked.
    live: Vec<(usize, Reference)>,
    /// The jobs' kernels, then the reference kernels.
    kernels: Vec<Kernel>,
    features: BTreeSet<String>,
}

impl CpuMeasurer {
    /// A measurer whose worker process is started with `worker`, compiling into the default
    /// cache directory.
    pub fn new(worker: WorkerCommand, opts: CpuOptions) -> Result<Self, CpuError> {
        Self::with_compiler(worker, opts, Compiler::new(Compiler::default_cache_dir())?)
    }

    pub fn with_compiler(
        mut worker: WorkerCommand,
        opts: CpuOptions,
        compiler: Compiler,
    ) -> Result<Self, CpuError> {
        worker
            .env
            .push(("OMP_NUM_THREADS".into(), opts.threads.max(1).to_string()));
        let fingerprint = fingerprint(opts.threads.max(1), compiler.version());
        Ok(CpuMeasurer {
            opts,
            compiler,
            worker: Worker::new(worker),
            catalog: Catalog::default(),
            fingerprint,
            prefetching: None,
            prefetched: Default::default(),
        })
    }

    pub fn options(&self) -> &CpuOptions {
        &self.opts
    }

    pub fn compiler(&self) -> &Compiler {
        &self.compiler
    }

    /// How many times the worker had to be restarted (after crashes and timeouts).
    pub fn worker_restarts(&self) -> u32 {
        self.worker.restarts()
    }

    /// Lowers and generates one candidate as kernel `name`, deciding native or emulated.
    pub fn prepare(&self, c: &Candidate, name: &str) -> Result<KernelJob, MeasureError> {
        let program = c
            .trace
            .lower(&c.op, &self.catalog)
            .map_err(|e| MeasureError::new(MeasureErrorKind::Schedule, e.to_string()))?;
        let codegen = |e: CodegenError| MeasureError::new(MeasureErrorKind::Codegen, e.to_string());
        // Weights the schedule packs at its root come packed; otherwise the kernel as is.
        let prepacked = match c.prepacked_weights {
            Some(i) => {
                generate_prepacked(&program, name, &format!("{name}_pack"), i, &self.catalog)
                    .map_err(codegen)?
            }
            None => None,
        };
        let (kernel, pack) = match prepacked {
            Some(p) => {
                let bytes = p
                    .packed_elements()
                    .checked_mul(p.packed_dtype.bytes() as u64)
                    .ok_or_else(|| {
                        MeasureError::new(MeasureErrorKind::Codegen, "packed weights overflow")
                    })?;
                (p.kernel, Some((p.pack, p.operand, bytes)))
            }
            None => (
                generate(&program, name, &self.catalog).map_err(codegen)?,
                None,
            ),
        };
        // The pack function is built with the kernel: the instructions of both decide.
        let mut mode = self.mode_for(&kernel)?;
        if let Some((p, ..)) = &pack {
            mode = mode.max(self.mode_for(p)?);
        }
        Ok(KernelJob {
            op: c.op.clone(),
            kernel,
            mode,
            budget_s: c.budget_s,
            pack,
        })
    }

    fn mode_for(&self, kernel: &Kernel) -> Result<Mode, MeasureError> {
        let host = HostCpu::detect();
        let mut missing: Vec<&str> = kernel
            .features
            .iter()
            .map(String::as_str)
            .filter(|f| !host.has(f))
            .collect();
        if missing.is_empty()
            && kernel.features.iter().any(|f| f.starts_with("amx"))
            && !host.amx_permitted
        {
            missing.push("AMX permission from the OS");
        }
        if missing.is_empty() {
            Ok(Mode::Native)
        } else if self.opts.emulate {
            Ok(Mode::Emulated)
        } else {
            Err(MeasureError::new(
                MeasureErrorKind::Unsupported,
                format!(
                    "{} needs {}, which this CPU ({}) lacks; skipped (emulation can check its correctness)",
                    kernel
                        .intrinsics
                        .iter()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", "),
                    missing.join(", "),
                    host.model
                ),
            ))
        }
    }

    /// The naive C kernel of `op` that checks large candidates ([`crate::naive`]).
    fn reference_kernel(&self, op: &ComputeOp) -> Result<Kernel, MeasureError> {
        let trace = crate::naive::naive_order(op);
        let key = content_key(&[
            &serde_json::to_string(op).unwrap_or_default(),
            &trace.to_string(),
        ]);
        let name = format!("tsl_ref_{}", &key[..16]);
        let program = trace
            .lower(op, &self.catalog)
            .map_err(|e| MeasureError::new(MeasureErrorKind::Schedule, e.to_string()))?;
        generate(&program, &name, &self.catalog)
            .map_err(|e| MeasureError::new(MeasureErrorKind::Codegen, e.to_string()))
    }

    fn needs_c_reference(&self, op: &ComputeOp) -> bool {
        op.macs() > self.opts.interpreter_max_macs
    }

    fn build(&self, kernels: &[&Kernel], mode: Mode) -> Result<Library, CompileError> {
        build_with(&self.compiler, kernels, mode)
    }

    /// How a batch of prepared jobs is built: one module per mode; the jobs whose reference
    /// kernel could not be generated get their error in `results`.
    fn plan(
        &self,
        jobs: &[Result<KernelJob, MeasureError>],
        results: &mut [Option<MeasureResult>],
    ) -> Vec<ModulePlan> {
        let mut by_mode: BTreeMap<Mode, Vec<usize>> = BTreeMap::new();
        for (i, j) in jobs.iter().enumerate() {
            match j {
                Ok(job) => by_mode.entry(job.mode).or_default().push(i),
                Err(e) => results[i] = Some(Err(e.clone())),
            }
        }
        let mut plans = Vec::new();
        for (mode, idx) in by_mode {
            let mut refs: BTreeMap<String, Kernel> = BTreeMap::new();
            let mut live = Vec::new();
            for &i in &idx {
                let Ok(job) = &jobs[i] else { continue };
                if self.needs_c_reference(&job.op) {
                    match self.reference_kernel(&job.op) {
                        Ok(k) => {
                            live.push((i, Reference::Symbol(k.name.clone())));
                            refs.insert(k.name.clone(), k);
                        }
                        Err(e) => results[i] = Some(Err(e)),
                    }
                } else {
                    live.push((i, Reference::Interpreter));
                }
            }
            let mut kernels: Vec<Kernel> = Vec::new();
            for &(i, _) in &live {
                if let Ok(j) = &jobs[i] {
                    kernels.push(j.kernel.clone());
                    kernels.extend(j.pack.as_ref().map(|p| p.0.clone()));
                }
            }
            kernels.extend(refs.into_values());
            let features = kernels
                .iter()
                .flat_map(|k| k.features.iter().cloned())
                .collect();
            plans.push(ModulePlan {
                mode,
                live,
                kernels,
                features,
            });
        }
        plans
    }

    /// Waits for the background compilation `prefetch` started, if any.
    fn finish_prefetch(&mut self) {
        if let Some((_, h)) = self.prefetching.take() {
            let _ = h.join();
        }
    }

    /// Identifies a batch by its kernels' sources.
    fn batch_key(jobs: &[Result<KernelJob, MeasureError>]) -> String {
        let sources: Vec<&str> = jobs
            .iter()
            .filter_map(|j| j.as_ref().ok().map(|j| j.kernel.source.as_str()))
            .collect();
        content_key(&sources)
    }

    /// Compiles and measures prepared kernels (errors pass through in place).
    pub fn measure_kernels(
        &mut self,
        jobs: &[Result<KernelJob, MeasureError>],
    ) -> Vec<MeasureResult> {
        // If this is the batch a prefetch is compiling, wait for it (then it is in the
        // cache); a prefetch of the next batch keeps compiling while this one is measured.
        if self
            .prefetching
            .as_ref()
            .is_some_and(|(key, _)| *key == Self::batch_key(jobs))
        {
            self.finish_prefetch();
        }
        let mut results: Vec<Option<MeasureResult>> = vec![None; jobs.len()];
        for plan in self.plan(jobs, &mut results) {
            let mode = plan.mode;
            // Each job's library, reference symbol and share of the compile time.
            let mut built: Vec<(usize, Library, Reference, f64)> = Vec::new();
            let all: Vec<&Kernel> = plan.kernels.iter().collect();
            match self.build(&all, mode) {
                Ok(lib) => {
                    let secs = self
                        .prefetched
                        .lock()
                        .ok()
                        .and_then(|mut m| m.remove(&lib.path))
                        .unwrap_or(lib.compile_time.as_secs_f64());
                    let share = secs / plan.live.len().max(1) as f64;
                    for (i, r) in &plan.live {
                        built.push((*i, lib.clone(), r.clone(), share));
                    }
                }
                Err(_) => {
                    // Find the culprits: compile each kernel on its own (with its reference),
                    // each under a shorter limit than the batch's (one kernel alone compiles
                    // in about a second; a pathological one should not cost the full limit).
                    let alone = self
                        .compiler
                        .clone()
                        .with_timeout(self.compiler.timeout().min(KERNEL_COMPILE_TIMEOUT));
                    for (i, r) in &plan.live {
                        let Ok(job) = &jobs[*i] else { continue };
                        let mut ks = vec![&job.kernel];
                        ks.extend(job.pack.as_ref().map(|p| &p.0));
                        if let Reference::Symbol(s) = r {
                            ks.extend(plan.kernels.iter().find(|k| &k.name == s));
                        }
                        match build_with(&alone, &ks, mode) {
                            Ok(lib) => {
                                let t = lib.compile_time.as_secs_f64();
                                built.push((*i, lib, r.clone(), t));
                            }
                            Err(e) => {
                                results[*i] = Some(Err(MeasureError::new(
                                    MeasureErrorKind::Compile,
                                    e.to_string(),
                                )));
                            }
                        }
                    }
                }
            }
            for (i, lib, reference, compile_s) in built {
                let Ok(job) = &jobs[i] else { continue };
                results[i] = Some(self.run_one(job, &lib, reference, compile_s));
            }
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(MeasureError::new(MeasureErrorKind::Runtime, "not measured"))
                })
            })
            .collect()
    }

    fn run_one(
        &mut self,
        job: &KernelJob,
        lib: &Library,
        reference: Reference,
        compile_s: f64,
    ) -> MeasureResult {
        let request = |phase: Phase| Job {
            library: lib.path.clone(),
            symbol: job.kernel.name.clone(),
            op: job.op.clone(),
            reference: reference.clone(),
            seed: self.opts.seed,
            tolerance: tolerance(&job.op),
            timing: TimingOptions {
                budget_s: job.budget_s,
                ..self.opts.timing
            },
            phase,
            reference_cache: Some(self.compiler.cache_dir().join("references")),
            prepack: job.pack.as_ref().map(|(k, operand, bytes)| Prepack {
                symbol: k.name.clone(),
                operand: *operand,
                bytes: *bytes,
            }),
        };
        let measurement = |samples: &[f64], max_error: f64, cut_short: bool, medians: &[f64]| {
            let emulated = job.mode == Mode::Emulated;
            Measurement::from_samples(samples, job.op.flops(), compile_s, max_error, emulated).map(
                |m| Measurement {
                    cut_short,
                    allocation_spread: spread_of(medians),
                    kernel: Some(job.kernel.digest()),
                    ..m
                },
            )
        };
        // The worker's own timeout caps the deadline: a check still going then is censored,
        // not an error.
        let deadline = job.budget_s.map(|b| {
            let d = check_deadline_s(b);
            Duration::try_from_secs_f64(d).unwrap_or(Duration::MAX)
        });
        let Some(deadline) = deadline.map(|d| d.min(self.opts.timeout)) else {
            // No budget: one call.
            return match self.worker.call(&request(Phase::All), self.opts.timeout) {
                Ok(Reply::Ok {
                    samples,
                    max_error,
                    cut_short,
                    allocation_medians,
                }) => measurement(&samples, max_error, cut_short, &allocation_medians),
                Ok(Reply::Err { kind, message }) => Err(MeasureError::new(kind, message)),
                Err(e) => Err(e.to_measure_error(&job.kernel.name)),
            };
        };
        // Inputs and reference first, however long they take; then the checked run under its
        // deadline; then, unless it was cut short, the timed runs.
        let fail = |e: WorkerError| e.to_measure_error(&job.kernel.name);
        match self
            .worker
            .call(&request(Phase::Prepare), self.opts.timeout)
        {
            Ok(Reply::Ok { .. }) => {}
            Ok(Reply::Err { kind, message }) => return Err(MeasureError::new(kind, message)),
            Err(e) => return Err(fail(e)),
        }
        let (checked, max_error) = match self.worker.call(&request(Phase::Check), deadline) {
            Ok(Reply::Ok {
                samples,
                max_error,
                cut_short,
                ..
            }) => {
                if cut_short {
                    return measurement(&samples, max_error, true, &[]);
                }
                // A long checked run is the whole measurement (`TimingOptions::long_run_s`).
                if samples
                    .first()
                    .is_some_and(|&s| self.opts.timing.measured_by_check(s))
                {
                    return measurement(&samples, max_error, false, &[]);
                }
                (samples, max_error)
            }
            Ok(Reply::Err { kind, message }) => return Err(MeasureError::new(kind, message)),
            Err(WorkerError::Timeout { seconds }) => {
                // Stopped past the deadline (the worker was killed): a lower bound, unchecked.
                let mut m = measurement(&[seconds], 0.0, true, &[])?;
                m.censored = true;
                return Ok(m);
            }
            Err(e) => return Err(fail(e)),
        };
        match self.worker.call(&request(Phase::Time), self.opts.timeout) {
            Ok(Reply::Ok {
                samples,
                allocation_medians,
                ..
            }) => measurement(&samples, max_error, false, &allocation_medians),
            Ok(Reply::Err { kind, message }) => Err(MeasureError::new(kind, message)),
            // A checked kernel whose timed runs outlast the worker's timeout (runs of many
            // seconds each under a loose budget) keeps its checked run as the measurement.
            Err(WorkerError::Timeout { .. }) => measurement(&checked, max_error, true, &[]),
            Err(e) => Err(fail(e)),
        }
    }
}

/// When a checked run under `budget_s` is stopped and censored: at two budgets, or at
/// [`CHECK_DEADLINE_LONG_S`] if that is sooner (but not before half a budget), never before
/// [`CHECK_DEADLINE_FLOOR_S`]. (A negative budget gets the floor; a NaN one, which `min` and
/// `max` skip, the long deadline.)
fn check_deadline_s(budget_s: f64) -> f64 {
    let long = CHECK_DEADLINE_LONG_S.max(budget_s * CHECK_DEADLINE_MIN_BUDGETS);
    (budget_s * CHECK_DEADLINE_BUDGETS)
        .min(long)
        .max(CHECK_DEADLINE_FLOOR_S)
}

/// (slowest - fastest) / fastest of per-allocation medians; `None` for fewer than two.
fn spread_of(medians: &[f64]) -> Option<f64> {
    if medians.len() < 2 {
        return None;
    }
    let lo = medians.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = medians.iter().copied().fold(0.0, f64::max);
    Some((hi - lo) / lo.max(1e-12))
}

impl Measurer for CpuMeasurer {
    fn fingerprint(&self) -> &HardwareFingerprint {
        &self.fingerprint
    }

    fn measure(&mut self, candidates: &[Candidate]) -> Vec<MeasureResult> {
        let jobs = self.prepare_batch(candidates);
        self.measure_kernels(&jobs)
    }

    /// Compiles the batch in a background thread (into the compile cache, where `measure`
    /// finds it), so that compiling the next batch overlaps measuring this one. Only when
    /// kernels run on one thread: a multi-threaded kernel's timing needs every core.
    fn prefetch(&mut self, candidates: &[Candidate]) {
        self.finish_prefetch();
        if !self.prefetches() || candidates.is_empty() {
            return;
        }
        let jobs = self.prepare_batch(candidates);
        let mut ignored = vec![None; jobs.len()];
        let plans = self.plan(&jobs, &mut ignored);
        let compiler = self.compiler.clone();
        let times = self.prefetched.clone();
        let handle = std::thread::spawn(move || {
            for p in plans {
                let refs: Vec<&Kernel> = p.kernels.iter().collect();
                // Errors surface again when `measure` builds the same module.
                if let Ok(lib) = compiler.compile(&module_source(&refs), &p.features, p.mode)
                    && !lib.cached
                    && let Ok(mut m) = times.lock()
                {
                    m.insert(lib.path, lib.compile_time.as_secs_f64());
                }
            }
        });
        self.prefetching = Some((Self::batch_key(&jobs), handle));
    }

    fn prefetches(&self) -> bool {
        // Compiling beside the measurement needs a core of its own: in a process pinned to
        // one core (`taskset -c 1`), gcc would share it with the kernels being timed.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.opts.threads == 1 && cores >= 2
    }
}

impl CpuMeasurer {
    /// The jobs `measure` builds of a batch (kernel names by position, so that the same
    /// batch always makes the same module).
    fn prepare_batch(&self, candidates: &[Candidate]) -> Vec<Result<KernelJob, MeasureError>> {
        candidates
            .iter()
            .enumerate()
            .map(|(i, c)| self.prepare(c, &format!("tsl_k{i}")))
            .collect()
    }
}

impl Drop for CpuMeasurer {
    fn drop(&mut self) {
        self.finish_prefetch();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_is_censored_at_two_budgets_or_at_the_long_deadline() {
        // Short budgets: two of them, but never under the floor.
        assert_eq!(check_deadline_s(0.1), CHECK_DEADLINE_FLOOR_S);
        assert_eq!(check_deadline_s(0.5), 1.0);
        // Two budgets would pass the long deadline: stop there, even under one budget ...
        assert_eq!(check_deadline_s(1.5), CHECK_DEADLINE_LONG_S);
        assert_eq!(check_deadline_s(2.6), CHECK_DEADLINE_LONG_S);
        // ... but never under half of one.
        assert_eq!(check_deadline_s(10.0), 5.0);
        assert_eq!(check_deadline_s(-1.0), CHECK_DEADLINE_FLOOR_S);
        assert_eq!(check_deadline_s(f64::NAN), CHECK_DEADLINE_LONG_S);
        assert!(check_deadline_s(f64::INFINITY).is_infinite());
    }
}
