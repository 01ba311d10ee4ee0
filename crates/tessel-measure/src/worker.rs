//! Measurement in a child process: a kernel that crashes or hangs takes only the worker down.
//! The parent ([`Worker`]) turns that into an error record and starts a fresh worker.
//!
//! Protocol: the parent writes one JSON job per line to the worker's stdin; the worker
//! ([`serve`]) answers each with one JSON reply line on stdout. The CPU and GPU backends each
//! define their job type; [`WorkerReply`] is the common answer to "check and time this".

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{MeasureError, MeasureErrorKind};

/// How to time a kernel: `warmup` runs, then runs until `min_time_s` have passed (and at least
/// `min_runs` ran) or `max_runs` ran; a kernel whose checked run took `long_run_s` or more is
/// measured by that run alone.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimingOptions {
    pub warmup: u32,
    pub min_runs: u32,
    pub max_runs: u32,
    pub min_time_s: f64,
    /// A checked run longer than this ends the measurement there ([`crate::Candidate::budget_s`]).
    #[serde(default)]
    pub budget_s: Option<f64>,
    /// Time the kernel on this many allocations of its buffers: the inputs copied to fresh
    /// memory (fresh addresses, fresh physical pages) and a fresh output each, so that a
    /// kernel whose speed depends on where its pages landed shows it. At least 1.
    #[serde(default = "one_allocation")]
    pub allocations: u32,
    /// A kernel whose checked run took at least this long is measured by that run: the check
    /// has warmed it, and a warm-up and three timed runs of a 46 GFLOP GEMM would cost its
    /// record seconds for a median barely better than one run of half a second, which timer
    /// noise hardly touches. Only with one allocation (timing on several is the point of
    /// asking for them). `None` always times.
    #[serde(default)]
    pub long_run_s: Option<f64>,
}

/// The default [`TimingOptions::long_run_s`].
pub const LONG_RUN_S: f64 = 0.25;

fn one_allocation() -> u32 {
    1
}

impl Default for TimingOptions {
    fn default() -> Self {
        TimingOptions {
            warmup: 1,
            min_runs: 3,
            max_runs: 100,
            min_time_s: 0.020,
            budget_s: None,
            allocations: 1,
            long_run_s: Some(LONG_RUN_S),
        }
    }
}

impl TimingOptions {
    /// One timed run and no warm-up: a correctness check, or an overhead measurement.
    pub fn single_run() -> Self {
        TimingOptions {
            warmup: 0,
            min_runs: 1,
            max_runs: 1,
            min_time_s: 0.0,
            ..TimingOptions::default()
        }
    }

    /// Whether a checked run of `checked_s` seconds is the whole measurement
    /// ([`TimingOptions::long_run_s`]).
    pub fn measured_by_check(&self, checked_s: f64) -> bool {
        self.allocations <= 1 && self.long_run_s.is_some_and(|l| checked_s >= l)
    }

    /// Whether `runs` samples taking `elapsed_s` in all are enough.
    pub fn done(&self, runs: u32, elapsed_s: f64) -> bool {
        runs >= self.max_runs.max(1) || (elapsed_s >= self.min_time_s && runs >= self.min_runs)
    }
}

/// A worker's answer to a measurement job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerReply {
    Ok {
        /// Seconds per run.
        samples: Vec<f64>,
        max_error: f64,
        /// The checked run exceeded the budget: `samples` is that run alone.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        cut_short: bool,
        /// The median of each allocation's runs, when timed on more than one.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        allocation_medians: Vec<f64>,
    },
    Err {
        kind: MeasureErrorKind,
        message: String,
    },
}

impl WorkerReply {
    pub fn runtime(message: impl Into<String>) -> Self {
        WorkerReply::Err {
            kind: MeasureErrorKind::Runtime,
            message: message.into(),
        }
    }
}

/// The worker's main loop over stdin/stdout; returns the process exit code. `handle` gets each
/// job (or why its line was unreadable) and returns the reply and whether to go on: a worker
/// whose state a kernel has poisoned (a CUDA context after a fault) answers, then stops, and
/// the parent starts a fresh one.
pub fn serve<J, R>(mut handle: impl FnMut(Result<J, String>) -> (R, bool)) -> i32
where
    J: DeserializeOwned,
    R: Serialize,
{
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return 1 };
        if line.trim().is_empty() {
            continue;
        }
        let job = serde_json::from_str::<J>(&line).map_err(|e| format!("unreadable job: {e}"));
        let (reply, go_on) = handle(job);
        let text = serde_json::to_string(&reply).unwrap_or_else(|e| {
            format!(r#"{{"err":{{"kind":"runtime","message":"unserialisable reply: {e}"}}}}"#)
        });
        if writeln!(stdout, "{text}")
            .and_then(|_| stdout.flush())
            .is_err()
        {
            return 1;
        }
        if !go_on {
            return 3;
        }
    }
    0
}

/// Why the measurement worker could not be used.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot start the measurement worker `{program}`: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the worker died: {status}")]
    Died { status: String },
    #[error("the worker did not answer within {seconds:.1} s")]
    Timeout { seconds: f64 },
    #[error("the worker's pipe failed: {0}")]
    Pipe(#[source] std::io::Error),
    #[error("the worker sent an unreadable reply: {0}")]
    Protocol(String),
}

impl WorkerError {
    /// The candidate's error when running kernel `kernel` cost the worker.
    pub fn to_measure_error(&self, kernel: &str) -> MeasureError {
        match self {
            WorkerError::Died { status } => MeasureError::new(
                MeasureErrorKind::Crash,
                format!("kernel `{kernel}` took its worker down: {status}"),
            ),
            WorkerError::Timeout { .. } => {
                MeasureError::new(MeasureErrorKind::Timeout, self.to_string())
            }
            _ => MeasureError::new(MeasureErrorKind::Runtime, self.to_string()),
        }
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
    pub fn call<J: Serialize, R: DeserializeOwned>(
        &mut self,
        job: &J,
        timeout: Duration,
    ) -> Result<R, WorkerError> {
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
