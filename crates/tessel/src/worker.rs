//! Measurement workers: kernels run in a child process, so that one that crashes, hangs or
//! computes garbage never takes the caller down. The child is this same executable, started
//! with `TESSEL_WORKER` set; [`serve_if_worker`], called first thing in `main`, turns it into
//! the worker.

use std::path::Path;

use tessel_measure::worker::WorkerCommand;

use crate::error::{Context, Result, bail};

/// The environment variable that makes an executable a worker: `cpu` or `gpu`.
pub const WORKER_ENV: &str = "TESSEL_WORKER";

/// Serves as a measurement worker and exits, when this process was started as one; returns
/// at once otherwise. Call it first thing in `main` of any program that tunes or measures:
///
/// ```no_run
/// tessel::serve_if_worker(); // the first line of main
/// // ... tessel::tune(...) ...
/// ```
pub fn serve_if_worker() {
    match std::env::var(WORKER_ENV).as_deref() {
        Ok("cpu") => std::process::exit(tessel_cpu::worker::serve()),
        #[cfg(feature = "cuda")]
        Ok("gpu") => std::process::exit(tessel_gpu::cuda::serve()),
        Ok(other) => {
            eprintln!("{WORKER_ENV}={other}: not a worker kind this build serves");
            std::process::exit(2)
        }
        Err(_) => {}
    }
}

/// The command that starts a worker of `kind`: `exe` (default: this executable) with
/// `TESSEL_WORKER=kind`. Refuses inside a worker (its `main` did not call
/// [`serve_if_worker`], and would otherwise start workers of its own, without end).
pub fn worker_command(kind: &str, exe: Option<&Path>) -> Result<WorkerCommand> {
    if let Some(exe) = exe {
        if !exe.is_file() {
            bail!("worker executable {}: no such file", exe.display());
        }
        let mut command = WorkerCommand::new(exe);
        command.env.push((WORKER_ENV.to_string(), kind.to_string()));
        return Ok(command);
    }
    if std::env::var_os(WORKER_ENV).is_some() {
        bail!(
            "this process was started as a tessel worker ({WORKER_ENV} is set), but its main did not call tessel::serve_if_worker() first"
        );
    }
    let mut command =
        WorkerCommand::current_exe(&[]).context("cannot find this program's executable")?;
    command.env.push((WORKER_ENV.to_string(), kind.to_string()));
    Ok(command)
}
