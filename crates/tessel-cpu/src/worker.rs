//! The CPU measurement worker: a child process that loads compiled kernels, checks them against a
//! reference and times them (see [`tessel_measure::worker`] for the process handling).
//!
//! Protocol: the parent writes one JSON [`Job`] per line to the worker's stdin; the worker
//! answers each with one JSON [`Reply`] line on stdout.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tessel_ir::{ComputeOp, TensorData};
use tessel_measure::MeasureErrorKind;
pub use tessel_measure::check::tolerance;
use tessel_measure::check::{max_relative_error, unravel};
pub use tessel_measure::worker::{TimingOptions, Worker, WorkerCommand, WorkerReply as Reply};

use crate::buffers::{AlignedBuf, decode, encode};
use crate::reference_cache;

/// Where the expected output comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reference {
    /// tessel-ir's naive definition ([`ComputeOp::reference`]): exact, for small operators.
    Interpreter,
    /// A naive C kernel of the same library, for operators too large to interpret.
    Symbol(String),
    /// No check (benchmarks of already-checked kernels).
    None,
}

/// One kernel to check and time.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Job {
    pub library: PathBuf,
    pub symbol: String,
    pub op: ComputeOp,
    pub reference: Reference,
    /// Inputs are `TensorData::random(shape, dtype, seed + i)`.
    pub seed: u64,
    /// Largest relative error accepted (0 for integer outputs).
    pub tolerance: f64,
    pub timing: TimingOptions,
    /// Which part of the measurement to do (all of it unless the parent splits it, to give
    /// the checked run a deadline of its own).
    #[serde(default, skip_serializing_if = "Phase::is_all")]
    pub phase: Phase,
    /// A directory where slow compiled references are kept between worker processes: a
    /// worker killed past a deadline would otherwise compute a large reference again (a naive
    /// 46 GFLOP GEMM takes ~18 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_cache: Option<PathBuf>,
    /// Weights packed before the kernel runs (a pre-packed kernel takes the packed copy in
    /// the input's argument slot): the pack is never timed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepack: Option<Prepack>,
}

/// How the weights of a pre-packed kernel are packed: `symbol(args)` with args[0] the input
/// and args[1] a zeroed buffer of `bytes`, which it fills.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prepack {
    pub symbol: String,
    pub operand: usize,
    pub bytes: u64,
}

/// A part of a measurement. A parent that wants to stop a kernel far past its budget sends
/// `Prepare` (inputs and the reference, however long they take), then `Check` under a short
/// deadline, then `Time`; one worker keeps what each phase made for the next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Prepare, check, then time (or stop after the check past the budget).
    #[default]
    All,
    /// Load the library and make the inputs and the reference; replies with no samples.
    Prepare,
    /// The checked run alone: replies with its time, `cut_short` when past the budget.
    Check,
    /// The timed runs alone, of a kernel this worker has checked.
    Time,
}

impl Phase {
    fn is_all(&self) -> bool {
        *self == Phase::All
    }
}

type KernelFn = unsafe extern "C" fn(*const *mut c_void);

struct Prepared {
    inputs: Vec<AlignedBuf>,
    data: Vec<TensorData>,
    reference: Option<TensorData>,
}

#[derive(Default)]
struct State {
    libraries: HashMap<PathBuf, libloading::Library>,
    prepared: HashMap<String, Prepared>,
}

/// The worker's main loop; returns the process exit code. Binaries that serve as the worker
/// (`tessel-cpu-worker`, `cargo xtask cpu-worker`) call only this.
pub fn serve() -> i32 {
    // Detection asks the OS for AMX tile data once, before any kernel runs.
    let _ = tessel_intrin::HostCpu::detect();
    let mut state = State::default();
    tessel_measure::worker::serve(|job: Result<Job, String>| {
        let reply = match job {
            Ok(job) => state.run(&job),
            Err(e) => Reply::runtime(e),
        };
        (reply, true)
    })
}

impl State {
    fn kernel(&mut self, job: &Job, symbol: &str) -> Result<KernelFn, String> {
        if !self.libraries.contains_key(&job.library) {
            // SAFETY: loading runs the object's initialisers; ours are compiler-generated.
            let lib = unsafe { libloading::Library::new(&job.library) }
                .map_err(|e| format!("cannot load {}: {e}", job.library.display()))?;
            self.libraries.insert(job.library.clone(), lib);
        }
        let lib = &self.libraries[&job.library];
        // SAFETY: every kernel tessel generates has this signature.
        let f = unsafe { lib.get::<KernelFn>(symbol.as_bytes()) }
            .map_err(|e| format!("no kernel `{symbol}` in {}: {e}", job.library.display()))?;
        Ok(*f)
    }

    fn run(&mut self, job: &Job) -> Reply {
        if let Err(e) = job.op.validate() {
            return Reply::runtime(format!("invalid operator: {e}"));
        }
        let kernel = match self.kernel(job, &job.symbol) {
            Ok(k) => k,
            Err(e) => return Reply::runtime(e),
        };
        let key = format!(
            "{}|{}|{:?}",
            serde_json::to_string(&job.op).unwrap_or_default(),
            job.seed,
            job.reference
        );
        if !self.prepared.contains_key(&key) {
            let data = job.op.random_inputs(job.seed);
            let inputs = data.iter().map(encode).collect();
            let mut p = Prepared {
                inputs,
                data,
                reference: None,
            };
            p.reference = match &job.reference {
                Reference::None => None,
                Reference::Interpreter => match job.op.reference(&p.data) {
                    Ok(r) => Some(r),
                    Err(e) => return Reply::runtime(format!("reference interpreter failed: {e}")),
                },
                Reference::Symbol(s) => {
                    let f = match self.kernel(job, s) {
                        Ok(f) => f,
                        Err(e) => return Reply::runtime(e),
                    };
                    let cached = job
                        .reference_cache
                        .as_deref()
                        .map(|dir| reference_cache::path(dir, &job.op, s, &p.inputs));
                    match cached
                        .as_deref()
                        .and_then(|c| reference_cache::load(c, &job.op))
                    {
                        Some(r) => Some(r),
                        None => {
                            let (r, seconds) = call_once_timed(f, &mut p.inputs, None, &job.op);
                            if let Some(c) =
                                cached.filter(|_| seconds >= reference_cache::MIN_SECONDS)
                            {
                                // Best effort: a reference that cannot be kept is computed again.
                                let _ = reference_cache::store(&c, &r);
                            }
                            Some(r)
                        }
                    }
                }
            };
            self.prepared.insert(key.clone(), p);
        }
        if job.phase == Phase::Prepare {
            return Reply::Ok {
                samples: Vec::new(),
                max_error: 0.0,
                cut_short: false,
                allocation_medians: Vec::new(),
            };
        }
        // Pre-packed weights: packed now (cheap beside the runs), passed in the input's slot.
        let mut packed: Option<(usize, AlignedBuf)> = match &job.prepack {
            None => None,
            Some(pp) => {
                let pack = match self.kernel(job, &pp.symbol) {
                    Ok(f) => f,
                    Err(e) => return Reply::runtime(e),
                };
                let p = self.prepared.get_mut(&key).expect("inserted above");
                let Some(input) = p.inputs.get_mut(pp.operand) else {
                    return Reply::runtime(format!(
                        "pre-packed input {} of an operator with {} inputs",
                        pp.operand,
                        p.inputs.len()
                    ));
                };
                let Ok(bytes) = usize::try_from(pp.bytes) else {
                    return Reply::runtime(format!("a packed buffer of {} bytes", pp.bytes));
                };
                let mut buf = AlignedBuf::zeroed(bytes);
                let args = [
                    input.as_mut_ptr() as *mut c_void,
                    buf.as_mut_ptr() as *mut c_void,
                ];
                // SAFETY: a pack function takes the input and a buffer of the packed size.
                unsafe { pack(args.as_ptr()) };
                Some((pp.operand, buf))
            }
        };
        let p = self.prepared.get_mut(&key).expect("inserted above");
        if job.phase == Phase::Time {
            return time(kernel, p, slot(&mut packed), job, 0.0);
        }
        let (got, checked_s) = call_once_timed(kernel, &mut p.inputs, slot(&mut packed), &job.op);
        let mut max_error = 0.0;
        if let Some(want) = &p.reference {
            let (err, at) = max_relative_error(&got, want);
            max_error = err;
            // NaN errors fail too.
            if err.is_nan() || err > job.tolerance {
                let index = unravel(at, &want.shape);
                return Reply::Err {
                    kind: MeasureErrorKind::WrongResult,
                    message: format!(
                        "output differs from the reference: relative error {err:.3e} > {:.1e} at {index:?} (got {}, want {})",
                        job.tolerance, got.data[at], want.data[at]
                    ),
                };
            }
        }
        // Far slower than the caller's budget: the checked run is the measurement. But the
        // checked run is the kernel's first, and pays for first touches later runs do not (a
        // static packed buffer's pages: 8 MB of them cost a 1 ms kernel 23 ms in a VM). So a
        // short one past the budget is confirmed by a warm run, and only a kernel slow twice
        // is cut short, measured by that warm run; a long one's first touches are small
        // beside it.
        let mut samples = vec![checked_s];
        let over = match job.timing.budget_s {
            Some(b) if checked_s > b => {
                if checked_s < CONFIRM_BELOW_S {
                    let (_, again) =
                        call_once_timed(kernel, &mut p.inputs, slot(&mut packed), &job.op);
                    samples = vec![again];
                    again > b
                } else {
                    true
                }
            }
            _ => false,
        };
        // A long checked run is the whole measurement (`TimingOptions::long_run_s`).
        if over || job.phase == Phase::Check || job.timing.measured_by_check(checked_s) {
            return Reply::Ok {
                samples,
                max_error,
                cut_short: over,
                allocation_medians: Vec::new(),
            };
        }
        time(kernel, p, slot(&mut packed), job, max_error)
    }
}

/// A checked run past its budget but shorter than this is run once more, warm, before the
/// kernel is cut short ([`tessel_measure::worker::LONG_RUN_S`]: longer runs are whole
/// measurements anyway). Two such runs fit the parent's shortest deadline (half a second).
const CONFIRM_BELOW_S: f64 = tessel_measure::worker::LONG_RUN_S;

/// The timed runs of a checked kernel: warm-up, then runs until the timing options are met, on
/// each allocation of the buffers.
fn time(
    kernel: KernelFn,
    p: &mut Prepared,
    mut packed: Option<(usize, &mut AlignedBuf)>,
    job: &Job,
    max_error: f64,
) -> Reply {
    let out = &job.op.output.tensor;
    let allocations = job.timing.allocations.max(1);
    let mut samples = Vec::new();
    let mut medians = Vec::new();
    // Earlier allocations stay alive (up to HELD_ALLOCATION_BYTES): freed, the next copy of
    // the same size would take their memory back (glibc serves it from the heap once an
    // mmapped chunk that size was freed), and the kernel would meet the same pages again.
    let mut held: Vec<Vec<AlignedBuf>> = Vec::new();
    let mut held_bytes = 0usize;
    for a in 0..allocations {
        // The first allocation is the checked one; each later one copies the inputs to
        // fresh memory, so the kernel meets other addresses and other physical pages. The
        // packed weights are copied in the weights' slot, where the kernel reads them.
        let mut fresh: Vec<AlignedBuf> = if a == 0 {
            Vec::new()
        } else {
            p.inputs
                .iter()
                .enumerate()
                .map(|(i, b)| match &packed {
                    Some((w, packed)) if *w == i => packed.copy(),
                    _ => b.copy(),
                })
                .collect()
        };
        let (inputs, this_packed) = if a == 0 {
            (&mut p.inputs, packed.as_mut().map(|(i, b)| (*i, &mut **b)))
        } else {
            (&mut fresh, None)
        };
        let mut output = AlignedBuf::zeroed(out.bytes() as usize);
        let args = arg_pointers(inputs, this_packed, &mut output);
        let run = || {
            // SAFETY: the arguments match the kernel's operator, as checked by the run above.
            unsafe { kernel(args.as_ptr()) }
        };
        for _ in 0..job.timing.warmup {
            run();
        }
        let mut these = Vec::new();
        let start = Instant::now();
        loop {
            let t = Instant::now();
            run();
            these.push(t.elapsed().as_secs_f64());
            let n = these.len() as u32;
            if job.timing.done(n, start.elapsed().as_secs_f64()) {
                break;
            }
        }
        let mut sorted = these.clone();
        sorted.sort_by(f64::total_cmp);
        medians.push(sorted[sorted.len() / 2]);
        samples.extend(these);
        fresh.push(output);
        let bytes: usize = fresh.iter().map(|b| b.as_slice().len()).sum();
        if held_bytes.saturating_add(bytes) <= HELD_ALLOCATION_BYTES {
            held_bytes += bytes;
            held.push(fresh);
        }
    }
    Reply::Ok {
        samples,
        max_error,
        cut_short: false,
        allocation_medians: if allocations > 1 { medians } else { Vec::new() },
    }
}

/// The most memory (inputs and output) the timed allocations of one kernel keep alive at
/// once.
const HELD_ALLOCATION_BYTES: usize = 1 << 30;

/// The packed weights, if any, as the input slot they take and their buffer.
fn slot(packed: &mut Option<(usize, AlignedBuf)>) -> Option<(usize, &mut AlignedBuf)> {
    packed.as_mut().map(|(i, b)| (*i, b))
}

/// One pointer per operand, inputs then the output; a pre-packed input's slot points at its
/// packed copy.
fn arg_pointers(
    inputs: &mut [AlignedBuf],
    packed: Option<(usize, &mut AlignedBuf)>,
    output: &mut AlignedBuf,
) -> Vec<*mut c_void> {
    let mut v: Vec<*mut c_void> = inputs
        .iter_mut()
        .map(|b| b.as_mut_ptr() as *mut c_void)
        .collect();
    if let Some((i, b)) = packed
        && let Some(slot) = v.get_mut(i)
    {
        *slot = b.as_mut_ptr() as *mut c_void;
    }
    v.push(output.as_mut_ptr() as *mut c_void);
    v
}

/// Runs `f` once on a fresh output filled with 0xff bytes (NaN for floats), so that elements
/// the kernel never writes show up as wrong; returns the output and the seconds the call took.
fn call_once_timed(
    f: KernelFn,
    inputs: &mut [AlignedBuf],
    packed: Option<(usize, &mut AlignedBuf)>,
    op: &ComputeOp,
) -> (TensorData, f64) {
    let out = &op.output.tensor;
    let mut output = AlignedBuf::zeroed(out.bytes() as usize);
    output.as_mut_slice().fill(0xff);
    let args = arg_pointers(inputs, packed, &mut output);
    let start = Instant::now();
    // SAFETY: one pointer per operand of `op`, each to a buffer of the declared size.
    unsafe { f(args.as_ptr()) };
    let seconds = start.elapsed().as_secs_f64();
    (
        decode(output.as_slice(), out.shape.clone(), out.dtype),
        seconds,
    )
}
