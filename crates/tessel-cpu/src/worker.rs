//! The measurement worker: a child process that loads compiled kernels, checks them against a
//! reference and times them. A kernel that crashes or hangs takes only the worker down; the
//! parent ([`Worker`]) turns that into an error record and starts a fresh worker.
//!
//! Protocol: the parent writes one JSON [`Job`] per line to the worker's stdin; the worker
//! answers each with one JSON [`Reply`] line on stdout.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tessel_ir::{ComputeOp, DType, TensorData};
use tessel_measure::MeasureErrorKind;

use crate::buffers::{AlignedBuf, decode, encode};
use crate::error::WorkerError;

/// How to time a kernel: `warmup` runs, then runs until `min_time_s` have passed (and at least
/// `min_runs` ran) or `max_runs` ran.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimingOptions {
    pub warmup: u32,
    pub min_runs: u32,
    pub max_runs: u32,
    pub min_time_s: f64,
}

impl Default for TimingOptions {
    fn default() -> Self {
        TimingOptions {
            warmup: 1,
            min_runs: 3,
            max_runs: 100,
            min_time_s: 0.020,
        }
    }
}

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
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Ok {
        samples: Vec<f64>,
        max_error: f64,
    },
    Err {
        kind: MeasureErrorKind,
        message: String,
    },
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
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    let mut state = State::default();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return 1 };
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Job>(&line) {
            Ok(job) => state.run(&job),
            Err(e) => Reply::Err {
                kind: MeasureErrorKind::Runtime,
                message: format!("unreadable job: {e}"),
            },
        };
        let text = serde_json::to_string(&reply).unwrap_or_else(|e| {
            format!(r#"{{"err":{{"kind":"runtime","message":"unserialisable reply: {e}"}}}}"#)
        });
        if writeln!(stdout, "{text}")
            .and_then(|_| stdout.flush())
            .is_err()
        {
            return 1;
        }
    }
    0
}

fn runtime(message: String) -> Reply {
    Reply::Err {
        kind: MeasureErrorKind::Runtime,
        message,
    }
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
            return runtime(format!("invalid operator: {e}"));
        }
        let kernel = match self.kernel(job, &job.symbol) {
            Ok(k) => k,
            Err(e) => return runtime(e),
        };
        let key = format!(
            "{}|{}|{:?}",
            serde_json::to_string(&job.op).unwrap_or_default(),
            job.seed,
            job.reference
        );
        if !self.prepared.contains_key(&key) {
            let data: Vec<TensorData> = job
                .op
                .read_operands()
                .iter()
                .enumerate()
                .map(|(i, o)| {
                    TensorData::random(o.tensor.shape.clone(), o.tensor.dtype, job.seed + i as u64)
                })
                .collect();
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
                    Err(e) => return runtime(format!("reference interpreter failed: {e}")),
                },
                Reference::Symbol(s) => {
                    let f = match self.kernel(job, s) {
                        Ok(f) => f,
                        Err(e) => return runtime(e),
                    };
                    Some(call_once(f, &mut p.inputs, &job.op))
                }
            };
            self.prepared.insert(key.clone(), p);
        }
        let p = self.prepared.get_mut(&key).expect("inserted above");
        let got = call_once(kernel, &mut p.inputs, &job.op);
        let mut max_error = 0.0;
        if let Some(want) = &p.reference {
            let (err, at) = compare(&got, want);
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
        let out = &job.op.output.tensor;
        let mut output = AlignedBuf::zeroed(out.bytes() as usize);
        let args = arg_pointers(&mut p.inputs, &mut output);
        let run = || {
            // SAFETY: the arguments match the kernel's operator, as checked by the run above.
            unsafe { kernel(args.as_ptr()) }
        };
        for _ in 0..job.timing.warmup {
            run();
        }
        let mut samples = Vec::new();
        let start = Instant::now();
        loop {
            let t = Instant::now();
            run();
            samples.push(t.elapsed().as_secs_f64());
            let n = samples.len() as u32;
            let enough_time = start.elapsed().as_secs_f64() >= job.timing.min_time_s;
            if n >= job.timing.max_runs.max(1) || (enough_time && n >= job.timing.min_runs) {
                break;
            }
        }
        Reply::Ok { samples, max_error }
    }
}

fn arg_pointers(inputs: &mut [AlignedBuf], output: &mut AlignedBuf) -> Vec<*mut c_void> {
    let mut v: Vec<*mut c_void> = inputs
        .iter_mut()
        .map(|b| b.as_mut_ptr() as *mut c_void)
        .collect();
    v.push(output.as_mut_ptr() as *mut c_void);
    v
}

/// Runs `f` once on a fresh output filled with 0xff bytes (NaN for floats), so that elements
/// the kernel never writes show up as wrong.
fn call_once(f: KernelFn, inputs: &mut [AlignedBuf], op: &ComputeOp) -> TensorData {
    let out = &op.output.tensor;
    let mut output = AlignedBuf::zeroed(out.bytes() as usize);
    output.as_mut_slice().fill(0xff);
    let args = arg_pointers(inputs, &mut output);
    // SAFETY: one pointer per operand of `op`, each to a buffer of the declared size.
    unsafe { f(args.as_ptr()) };
    decode(output.as_slice(), out.shape.clone(), out.dtype)
}

/// Largest relative error (scaled by max(|a|, |b|, 1)) and where; a non-finite value where the
/// reference is finite counts as infinitely wrong.
fn compare(got: &TensorData, want: &TensorData) -> (f64, usize) {
    let mut worst = (0.0, 0);
    for (i, (&a, &b)) in got.data.iter().zip(&want.data).enumerate() {
        let e = if a.is_finite() != b.is_finite() {
            f64::INFINITY
        } else if !a.is_finite() {
            0.0
        } else {
            (a - b).abs() / a.abs().max(b.abs()).max(1.0)
        };
        if e > worst.0 {
            worst = (e, i);
        }
    }
    worst
}

fn unravel(mut at: usize, shape: &[u64]) -> Vec<u64> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        let n = shape[d].max(1) as usize;
        idx[d] = (at % n) as u64;
        at /= n;
    }
    idx
}

/// The tolerance for an output dtype: exact for integers; for floats, what a different
/// summation order and one final rounding can explain.
pub fn tolerance(op: &ComputeOp) -> f64 {
    match op.output.tensor.dtype {
        DType::I8 | DType::U8 | DType::I32 => 0.0,
        DType::F32 => 1e-3,
        DType::BF16 => 2e-2,
        DType::F16 => 4e-3,
    }
}

/// How to start a worker process.
#[derive(Clone, Debug)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl WorkerCommand {
    pub fn new(program: impl Into<PathBuf>) -> Self {
        WorkerCommand {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
        }
    }

    /// The current executable with `args` (for binaries with a worker subcommand).
    pub fn current_exe(args: &[&str]) -> std::io::Result<Self> {
        Ok(WorkerCommand {
            program: std::env::current_exe()?,
            args: args.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
        })
    }
}

/// The parent's handle on a worker process; restarts it after a crash or a timeout.
pub struct Worker {
    command: WorkerCommand,
    running: Option<Running>,
    restarts: u32,
}

struct Running {
    child: Child,
    stdin: ChildStdin,
    replies: Receiver<String>,
    stderr: Arc<Mutex<VecDeque<String>>>,
}

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status.signal() {
        Some(sig) => {
            let name = match sig {
                libc::SIGSEGV => "SIGSEGV",
                libc::SIGILL => "SIGILL",
                libc::SIGBUS => "SIGBUS",
                libc::SIGFPE => "SIGFPE",
                libc::SIGABRT => "SIGABRT",
                libc::SIGKILL => "SIGKILL",
                _ => "signal",
            };
            format!("killed by {name} ({sig})")
        }
        None => format!("exited with {status}"),
    }
}

impl Worker {
    pub fn new(command: WorkerCommand) -> Self {
        Worker {
            command,
            running: None,
            restarts: 0,
        }
    }

    /// How many times a worker was started after the first.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    fn start(&mut self) -> Result<&mut Running, WorkerError> {
        if self.running.is_none() {
            let c = &self.command;
            let mut child = Command::new(&c.program)
                .args(&c.args)
                .envs(c.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|source| WorkerError::Spawn {
                    program: c.program.display().to_string(),
                    source,
                })?;
            let (Some(stdin), Some(stdout), Some(stderr)) =
                (child.stdin.take(), child.stdout.take(), child.stderr.take())
            else {
                let _ = child.kill();
                return Err(WorkerError::Protocol("worker pipes missing".into()));
            };
            let (tx, replies) = channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            let tail = Arc::new(Mutex::new(VecDeque::new()));
            let sink = Arc::clone(&tail);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Ok(mut t) = sink.lock() {
                        if t.len() == 20 {
                            t.pop_front();
                        }
                        t.push_back(line);
                    }
                }
            });
            self.running = Some(Running {
                child,
                stdin,
                replies,
                stderr: tail,
            });
        }
        self.running
            .as_mut()
            .ok_or_else(|| WorkerError::Protocol("worker did not start".into()))
    }

    /// Kills the worker (if any) and reaps it; the next call starts a new one.
    fn stop(&mut self) -> Option<(String, String)> {
        let mut r = self.running.take()?;
        let _ = r.child.kill();
        let status = r
            .child
            .wait()
            .map(describe)
            .unwrap_or_else(|e| e.to_string());
        // Give the stderr reader a moment to collect the last words.
        std::thread::sleep(Duration::from_millis(20));
        let tail = r
            .stderr
            .lock()
            .map(|t| t.iter().cloned().collect::<Vec<_>>().join("\n"))
            .unwrap_or_default();
        self.restarts += 1;
        Some((status, tail))
    }

    /// Sends `job`, waits up to `timeout` for the reply.
    pub fn call(&mut self, job: &Job, timeout: Duration) -> Result<Reply, WorkerError> {
        let text = serde_json::to_string(job).map_err(|e| WorkerError::Protocol(e.to_string()))?;
        let r = self.start()?;
        let sent = writeln!(r.stdin, "{text}").and_then(|_| r.stdin.flush());
        let answer = match sent {
            Ok(()) => r.replies.recv_timeout(timeout),
            Err(_) => Err(RecvTimeoutError::Disconnected),
        };
        match answer {
            Ok(line) => serde_json::from_str(&line)
                .map_err(|e| WorkerError::Protocol(format!("{e}: {line}"))),
            Err(RecvTimeoutError::Timeout) => {
                self.stop();
                Err(WorkerError::Timeout {
                    seconds: timeout.as_secs_f64(),
                })
            }
            Err(RecvTimeoutError::Disconnected) => {
                // The worker died mid-job; reap it and keep what it said on stderr.
                let (mut status, tail) = self
                    .stop()
                    .unwrap_or_else(|| ("gone".to_string(), String::new()));
                if !tail.is_empty() {
                    status.push_str("; stderr: ");
                    status.push_str(&tail);
                }
                Err(WorkerError::Died { status })
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(mut r) = self.running.take() {
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
    }
}
