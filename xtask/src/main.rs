//! `cargo xtask`: tessel's command line. Each command parses its options (the façade's option
//! structs, derived by clap), calls the `tessel` library and prints the report.

mod features;
mod info;
mod print;
mod progress;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

use progress::Bar;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "tessel pipelines", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// `--json`: one JSON document on the last line of stdout instead of tables.
#[derive(clap::Args)]
struct Json {
    #[arg(long)]
    json: bool,
}

impl Json {
    /// The report as one JSON line, or as `table` prints it.
    fn show<R: serde::Serialize>(&self, report: &R, table: impl FnOnce(&R)) -> Result<()> {
        match self.json {
            true => json_line(report),
            false => {
                table(report);
                Ok(())
            }
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// The tasks of a network (distinct workloads, weights, FLOPs, spec strings); without
    /// --network, the list of networks.
    Workloads(info::WorkloadsArgs),
    /// The catalog of tensorized instructions, marking what this machine supports.
    Intrinsics(Json),
    /// Every mapping of a workload onto an instruction, with padding and transforms.
    Match(info::MatchArgs),
    /// Generates, compiles, checks and times one schedule on this CPU: the reference schedule
    /// of --intrinsic (GEMM), a trace from --trace, or the naive loop nest.
    Measure {
        #[command(flatten)]
        opts: tessel::MeasureOptions,
        /// Print the generated code (`c`) or the trace (`trace`) instead of measuring.
        #[arg(long)]
        emit: Option<String>,
        #[command(flatten)]
        json: Json,
    },
    /// Benchmarks: `cpu` measures each instruction's reference GEMM beside the CPU's measured
    /// peak and oneDNN.
    Bench {
        #[command(subcommand)]
        target: BenchTarget,
    },
    /// Searches for the fastest schedule of a workload or of every task of a network;
    /// records go to --log (append-only; a rerun resumes).
    Tune {
        #[command(flatten)]
        opts: tessel::TuneOptions,
        #[command(flatten)]
        json: Json,
    },
    /// The best record per workload of a tuning log, and its code.
    Best {
        #[arg(long)]
        log: PathBuf,
        /// Print the code: `c`, `cuda` or `trace`.
        #[arg(long)]
        emit: Option<tessel::Emit>,
        #[command(flatten)]
        json: Json,
    },
    /// The best kernels of a tuning log as a C library (tessel_kernels.h, .a, .so,
    /// manifest.json) and a Rust crate of safe wrappers (rust/), in --out.
    Export {
        #[command(flatten)]
        opts: tessel::ExportOptions,
        #[command(flatten)]
        json: Json,
    },
    /// The allocation features of a candidate, column by column: a --trace on this CPU, or the
    /// best record of a --log on the machine that measured it.
    Features(features::FeaturesArgs),
    /// Samples schedules of every task (the whole space, not only good ones), measures them
    /// (or estimates them on a GPU model) and appends the records to --out (a rerun resumes).
    Dataset {
        #[command(flatten)]
        opts: tessel::DatasetOptions,
        #[command(flatten)]
        json: Json,
    },
    /// Measures chosen records of a dataset again (after a code-generation fix, say) and
    /// appends them: the latest record of a schedule supersedes the older ones.
    Remeasure {
        #[command(flatten)]
        opts: tessel::RemeasureOptions,
        #[command(flatten)]
        json: Json,
    },
    /// The mappings of today's schedule space that a dataset's tasks have no record of
    /// (records sampled before the space changed), with the command that fills them.
    Coverage {
        #[command(flatten)]
        opts: tessel::CoverageOptions,
        #[command(flatten)]
        json: Json,
    },
    /// Joins dataset shards into one file, each candidate once (its latest record).
    Merge {
        #[arg(long)]
        out: PathBuf,
        /// Shard files.
        inputs: Vec<PathBuf>,
    },
    /// Trains a model on measured records.
    Pretrain {
        #[command(flatten)]
        opts: tessel::PretrainOptions,
        #[command(flatten)]
        json: Json,
    },
    /// Fits a trained model's ensemble trees again on the records `pretrain` selected,
    /// keeping its network; replaces them when its validation tasks rank at least as well.
    RefitTrees {
        #[command(flatten)]
        opts: tessel::RefitOptions,
        #[command(flatten)]
        json: Json,
    },
    /// Fine-tunes a model on K records of new data; reports before, after and from scratch.
    Transfer {
        #[command(flatten)]
        opts: tessel::TransferOptions,
        #[command(flatten)]
        json: Json,
    },
    /// A model's ranking quality on measured records, beside ridge regression and random.
    /// Without --model and --data: the shipped model on the shipped held-out tasks.
    Eval {
        #[command(flatten)]
        opts: tessel::EvalOptions,
        #[command(flatten)]
        json: Json,
    },
    /// TenSet's protocol: trains on every network but the test networks (whose tasks are
    /// held out entirely), then scores each test network: the model, the same network on
    /// primitive sequences (the ablation), ridge, gradient-boosted trees and random.
    HeldOut {
        #[command(flatten)]
        opts: tessel::HeldOutOptions,
        #[command(flatten)]
        json: Json,
    },
    /// What the cost model buys the search: tunes each task with the model and at random
    /// (several seeds, a log per run in --out; a rerun resumes) and reports the trials each
    /// needed to reach 95% of the best, and the best each found at equal trials.
    SearchEval {
        #[command(flatten)]
        opts: tessel::SearchEvalOptions,
        #[command(flatten)]
        json: Json,
    },
    /// How well the analytical GPU model (sim:DEVICE) ranks measured GPU records: top-k,
    /// pairwise accuracy and Kendall tau per workload, beside a random ranking.
    SimCheck {
        /// Records measured on a GPU (`dataset --target gpu`).
        #[arg(long)]
        data: PathBuf,
        /// The model's device, e.g. h200.
        #[arg(long)]
        device: String,
        #[command(flatten)]
        json: Json,
    },
    /// The CPU measurement worker (started by the tuner itself).
    #[command(hide = true)]
    CpuWorker,
    /// The GPU measurement worker (started by the tuner itself; `--features cuda`).
    #[cfg(feature = "cuda")]
    #[command(hide = true)]
    GpuWorker,
}

#[derive(Subcommand)]
enum BenchTarget {
    Cpu {
        #[command(flatten)]
        opts: tessel::BenchOptions,
        #[command(flatten)]
        json: Json,
    },
}

fn main() -> std::process::ExitCode {
    // A worker started by the library (`TESSEL_WORKER`) serves and exits here.
    tessel::serve_if_worker();
    // candle would size its pool by the physical cores, whatever `taskset` allows: its
    // workers would spin on one pinned core (`tessel::threads_for_affinity`).
    // SAFETY: no other thread has started yet.
    unsafe { tessel::fit_threads_to_affinity() };
    // Die quietly on a closed pipe (`cargo xtask match ... | head`), as Unix tools do.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // Print the error chain ourselves: a user needs the message, not a backtrace.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Usage errors quote the argument: show its control characters escaped.
        Err(e) if e.use_stderr() => {
            let text = e.render().to_string();
            eprint!("{}", escape_controls(&text));
            return std::process::ExitCode::from(2);
        }
        Err(e) => e.exit(),
    };
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", chain(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, each cause once: a message that already quotes its
/// cause (`{path}: {source}`) is not followed by it again.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let part = c.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        cause = c.source();
    }
    escape_controls(&text)
}

/// Control characters from a file or an argument shown escaped, never raw (line breaks kept).
fn escape_controls(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let esc: Vec<char> = if c.is_control() && c != '\n' {
                c.escape_debug().collect()
            } else {
                vec![c]
            };
            esc
        })
        .collect()
}

/// Prints `report` as one JSON line.
fn json_line(report: &impl serde::Serialize) -> Result<()> {
    println!("{}", serde_json::to_string(report)?);
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::CpuWorker => std::process::exit(tessel::cpu::worker::serve()),
        #[cfg(feature = "cuda")]
        Command::GpuWorker => std::process::exit(tessel::gpu::cuda::serve()),
        Command::Workloads(a) => info::workloads(&a)?,
        Command::Intrinsics(Json { json }) => info::intrinsics(json)?,
        Command::Match(a) => info::matches(&a)?,
        Command::Features(a) => features::run(&a)?,
        Command::Measure { opts, emit, json } => match emit.as_deref() {
            Some("trace") => println!("{}", tessel::schedule_of(&opts)?.to_json_pretty()),
            Some("c") => println!("{}", tessel::generated_c(&opts)?),
            Some(other) => anyhow::bail!("--emit takes c or trace, not `{other}`"),
            None if json.json => json_line(&tessel::measure(&opts)?)?,
            None => print::measure(&tessel::measure(&opts)?),
        },
        Command::Bench {
            target: BenchTarget::Cpu { opts, json },
        } => {
            let report = tessel::bench_cpu(&opts, &mut Bar::lines(!json.json))?;
            json.show(&report, print::bench)?;
        }
        Command::Tune { opts, json } => {
            let report = tessel::tune(&opts, &mut Bar::new(!json.json))?;
            json.show(&report, |r| print::tune(r, &opts))?;
            // A run that found nothing is a failure, whatever it printed.
            report.check_found()?;
        }
        Command::Best { log, emit, json } => {
            let best = tessel::best(&log, &mut Bar::new(false))?;
            print::best(&best, emit, json.json)?;
        }
        Command::Export { opts, json } => {
            let report = tessel::export(&opts, &mut Bar::new(!json.json))?;
            json.show(&report, print::export)?;
        }
        Command::Dataset { opts, json } => {
            let report = tessel::dataset(&opts, &mut Bar::new(!json.json))?;
            json.show(&report, |r| print::dataset(r, &opts))?;
        }
        Command::Remeasure { opts, json } => {
            let report = tessel::remeasure(&opts, &mut Bar::new(!json.json))?;
            json.show(&report, |r| print::remeasure(r, &opts))?;
        }
        Command::Coverage { opts, json } => {
            let report = tessel::coverage(&opts, &mut Bar::new(!json.json))?;
            json.show(&report, |r| print::coverage(r, &opts))?;
        }
        Command::SearchEval { opts, json } => {
            let report = tessel::search_eval(&opts, &mut Bar::new(!json.json))?;
            json.show(&report, print::search_eval)?;
        }
        Command::Merge { out, inputs } => {
            let n = tessel::merge(&out, &inputs, &mut Bar::new(false))?;
            println!(
                "{n} records from {} files into {}",
                inputs.len(),
                out.display()
            );
        }
        Command::Pretrain { opts, json } => {
            let report = tessel::pretrain(&opts, &mut Bar::new(!json.json))?;
            json.show(&report, print::pretrain)?;
        }
        Command::RefitTrees { opts, json } => {
            let report = tessel::refit_trees(&opts, &mut Bar::new(!json.json))?;
            json.show(&report, print::refit_trees)?;
        }
        Command::Transfer { opts, json } => {
            let report = tessel::transfer(&opts, &mut Bar::new(!json.json))?;
            json.show(&report, print::transfer)?;
        }
        Command::HeldOut { opts, json } => {
            let report = tessel::held_out(&opts, &mut Bar::new(!json.json))?;
            json.show(&report, print::held_out)?;
        }
        Command::Eval { opts, json } => {
            let report = tessel::eval(&opts, &mut Bar::new(false))?;
            json.show(&report, print::eval)?;
        }
        Command::SimCheck { data, device, json } => {
            let report = tessel::sim_check(&data, &device, &mut Bar::new(!json.json))?;
            json.show(&report, print::sim_check)?;
        }
    }
    Ok(())
}
