//! `cargo xtask`: tessel's pipelines: `workloads`, `intrinsics`, `match`, `measure`, `bench cpu`.

mod cpu;
mod data;
mod features;
mod plot;
mod simcheck;
mod tune;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use serde::Serialize;
use tessel_intrin::{Catalog, HostCpu, Support, match_op};
use tessel_ir::{DType, NETWORKS, Workload, network};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "tessel pipelines", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The tasks of a network (distinct workloads, weights, FLOPs, spec strings); without
    /// --network, the list of networks.
    Workloads {
        /// A network name (see the list without this flag).
        #[arg(long)]
        network: Option<String>,
        /// Batch size.
        #[arg(long, default_value_t = 1)]
        batch: u64,
        /// Element type of every operator: bf16, f16, f32, i8, u8.
        #[arg(long, default_value = "bf16")]
        dtype: String,
        /// One JSON document instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The catalog of tensorized instructions, marking what this machine supports.
    Intrinsics {
        #[arg(long)]
        json: bool,
    },
    /// Every mapping of a workload onto an instruction, with padding and transforms.
    Match {
        /// A workload spec, e.g. gemm:m=1024,n=1024,k=1024,dtype=bf16
        #[arg(long)]
        workload: String,
        /// An instruction id from `cargo xtask intrinsics`.
        #[arg(long)]
        intrinsic: String,
        #[arg(long)]
        json: bool,
    },
    /// Generates, compiles, checks and times one schedule on this CPU: the reference schedule
    /// of --intrinsic (GEMM), a trace from --trace, or the naive loop nest.
    Measure {
        #[arg(long)]
        workload: String,
        /// A CPU instruction id: use its hand-written reference schedule.
        #[arg(long, conflicts_with = "trace")]
        intrinsic: Option<String>,
        /// A trace (JSON) to measure.
        #[arg(long)]
        trace: Option<PathBuf>,
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Run instructions this CPU lacks on their scalar emulation (correctness only).
        #[arg(long)]
        emulate: bool,
        /// Print the generated code (`c`) or the trace (`trace`) instead of measuring.
        #[arg(long)]
        emit: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Benchmarks: `cpu` measures each instruction's reference GEMM beside the CPU's measured
    /// peak and oneDNN.
    Bench {
        #[command(subcommand)]
        target: BenchTarget,
    },
    /// Searches for the fastest schedule of a workload or of every task of a network,
    /// measuring on this CPU; records go to --log (append-only; a rerun resumes).
    Tune {
        /// A workload spec.
        #[arg(long, conflicts_with = "network")]
        workload: Option<String>,
        /// A network name (`cargo xtask workloads`): tunes all its tasks.
        #[arg(long)]
        network: Option<String>,
        /// Network batch size.
        #[arg(long, default_value_t = 1)]
        batch: u64,
        /// Network element type.
        #[arg(long, default_value = "bf16")]
        dtype: String,
        /// `cpu` (measured here) or `sim:NAME`, the analytical model of a GPU (v100, t4, a10,
        /// a100, l4, h100, h200, rtx4090): estimates, not measurements.
        #[arg(long, default_value = "cpu")]
        target: String,
        /// Candidates to measure in all (records already in --log count).
        #[arg(long, default_value_t = 64)]
        trials: usize,
        /// Cost model: a model file from `cargo xtask pretrain` (its `.safetensors` or `.json`),
        /// or `none` for the random ranking (default: the shipped model in fixtures/models).
        #[arg(long)]
        model: Option<String>,
        /// Tuning log (JSON Lines).
        #[arg(long)]
        log: Option<PathBuf>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// OpenMP threads per kernel.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Sketches per generation of the evolutionary search.
        #[arg(long, default_value_t = 64)]
        population: usize,
        /// Candidates measured per round.
        #[arg(long, default_value_t = 16)]
        measure_batch: usize,
        /// Share of each round's candidates drawn at random.
        #[arg(long, default_value_t = 0.2)]
        epsilon: f64,
        /// One JSON object on the last line of stdout.
        #[arg(long)]
        json: bool,
    },
    /// The best record per workload of a tuning log, and its code.
    Best {
        #[arg(long)]
        log: PathBuf,
        /// Print the code: `c`, `cuda` or `trace`.
        #[arg(long)]
        emit: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// The allocation features of a candidate, column by column: a --trace on this CPU, or the
    /// best record of a --log on the machine that measured it.
    Features {
        /// A workload spec (with --trace; with --log, picks among its workloads).
        #[arg(long)]
        workload: Option<String>,
        /// A trace (JSON), e.g. from `cargo xtask best --emit trace`.
        #[arg(long, conflicts_with = "log")]
        trace: Option<PathBuf>,
        /// A tuning log: its best record.
        #[arg(long)]
        log: Option<PathBuf>,
        /// Cores the target uses (with --trace).
        #[arg(long, default_value_t = 1)]
        threads: usize,
        #[arg(long)]
        json: bool,
    },
    /// Samples schedules of every task (the whole space, not only good ones), measures them
    /// on this CPU (or estimates them on a GPU model) and appends the records to --out (a
    /// rerun resumes).
    Dataset {
        /// `cpu` or `sim:NAME` (the analytical model of a GPU; records say `sim`).
        #[arg(long, default_value = "cpu")]
        target: String,
        /// Networks, comma separated (`cargo xtask workloads`).
        #[arg(long, value_delimiter = ',', conflicts_with = "workload")]
        network: Vec<String>,
        #[arg(long)]
        workload: Option<String>,
        /// Schedules per task.
        #[arg(long, default_value_t = 200)]
        per_task: usize,
        #[arg(long)]
        out: PathBuf,
        /// This machine's part `I/N` of the tasks (0-based), for Slurm arrays or indexed jobs.
        #[arg(long)]
        shard: Option<String>,
        /// amx-bf16, amx-int8, avx512-vnni, avx512-bf16, avx512-fma, avx2-fma or scalar
        /// (default: the best this CPU has); on `sim:` targets the element type: f16
        /// (default), bf16, i8 or f32.
        #[arg(long)]
        platform: Option<String>,
        #[arg(long, default_value_t = 1)]
        batch: u64,
        #[arg(long, default_value_t = 1)]
        threads: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Only the first N tasks (after de-duplication, before sharding).
        #[arg(long)]
        max_tasks: Option<usize>,
    },
    /// Joins dataset shards into one file, each candidate once.
    Merge {
        #[arg(long)]
        out: PathBuf,
        /// Shard files.
        inputs: Vec<PathBuf>,
    },
    /// Trains a model on measured records.
    Pretrain {
        /// Dataset files (records; `.jsonl` or `.jsonl.gz`).
        #[arg(long, num_args = 1.., required = true)]
        data: Vec<PathBuf>,
        /// Only the tasks of these networks, comma separated.
        #[arg(long, value_delimiter = ',')]
        network: Vec<String>,
        /// Model path (writes NAME.safetensors and NAME.json).
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 30)]
        epochs: usize,
        /// lambdarank, pairwise or mse.
        #[arg(long, default_value = "lambdarank")]
        loss: String,
        #[arg(long, default_value_t = 3e-3)]
        lr: f64,
        /// Share of tasks held out for validation and early stopping.
        #[arg(long, default_value_t = 0.2)]
        val_fraction: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 48)]
        d_model: usize,
        #[arg(long, default_value_t = 3)]
        heads: usize,
        #[arg(long, default_value_t = 2)]
        layers: usize,
    },
    /// Fine-tunes a model on K records of new data; reports before, after and from scratch.
    Transfer {
        #[arg(long)]
        model: PathBuf,
        #[arg(long, num_args = 1.., required = true)]
        data: Vec<PathBuf>,
        /// Only the tasks of these networks, comma separated.
        #[arg(long, value_delimiter = ',')]
        network: Vec<String>,
        /// Records to fine-tune on.
        #[arg(long)]
        shots: usize,
        #[arg(long)]
        out: PathBuf,
        /// `all` (every weight, a tenth of the rate) or `head` (backbone frozen).
        #[arg(long, default_value = "all")]
        mode: String,
        #[arg(long, default_value_t = 10)]
        epochs: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long)]
        json: bool,
    },
    /// A model's ranking quality on measured records, beside ridge regression and random.
    /// Without --model and --data: the shipped model on the shipped held-out tasks.
    Eval {
        /// Default: fixtures/models/cpu.
        #[arg(long)]
        model: Option<PathBuf>,
        /// Default: the datasets in fixtures/datasets, held-out networks only.
        #[arg(long, num_args = 1..)]
        data: Vec<PathBuf>,
        /// Only the tasks of these networks, comma separated.
        #[arg(long, value_delimiter = ',')]
        network: Vec<String>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Write plots (predicted vs measured per task, top-k curves) into this directory: SVG,
        /// and PNG where rsvg-convert is installed.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// One JSON object on the last line (top1, top5, pairwise_accuracy, kendall_tau, ...).
        #[arg(long)]
        json: bool,
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
        #[arg(long)]
        json: bool,
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
        /// GEMM size (m = n = k).
        #[arg(long, default_value_t = 1024)]
        size: u64,
        /// Thread counts to measure, comma separated.
        #[arg(long, default_value = "1,2", value_delimiter = ',')]
        threads: Vec<usize>,
        /// Instruction ids (default: every CPU instruction).
        #[arg(long, value_delimiter = ',')]
        intrinsics: Vec<String>,
        /// Skip the oneDNN baseline.
        #[arg(long)]
        no_onednn: bool,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Serialize)]
struct TaskRow {
    spec: String,
    kind: &'static str,
    weight: u64,
    flops: u64,
    total_flops: u64,
}

#[derive(Serialize)]
struct NetworkReport {
    network: String,
    batch: u64,
    dtype: String,
    layers: usize,
    total_flops: u64,
    tasks: Vec<TaskRow>,
}

fn main() -> std::process::ExitCode {
    // Die quietly on a closed pipe (`cargo xtask match ... | head`), as Unix tools do.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // Print the error chain ourselves: a user needs the message, not a backtrace.
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::CpuWorker => std::process::exit(tessel_cpu::worker::serve()),
        Command::SimCheck { data, device, json } => simcheck::sim_check(&data, &device, json)?,
        #[cfg(feature = "cuda")]
        Command::GpuWorker => std::process::exit(tessel_gpu::cuda::serve()),
        Command::Tune {
            workload,
            network,
            batch,
            dtype,
            target,
            trials,
            model,
            log,
            seed,
            threads,
            population,
            measure_batch,
            epsilon,
            json,
        } => tune::tune(tune::TuneArgs {
            workload,
            network,
            batch,
            dtype,
            target,
            trials,
            model,
            log,
            seed,
            threads,
            population,
            measure_batch,
            epsilon,
            json,
        })?,
        Command::Best { log, emit, json } => tune::best(&log, emit.as_deref(), json)?,
        Command::Dataset {
            target,
            network,
            workload,
            per_task,
            out,
            shard,
            platform,
            batch,
            threads,
            seed,
            max_tasks,
        } => data::dataset(data::DatasetArgs {
            target,
            networks: network,
            workload,
            per_task,
            out,
            shard,
            platform,
            batch,
            threads,
            seed,
            max_tasks,
        })?,
        Command::Merge { out, inputs } => data::merge(&out, &inputs)?,
        Command::Pretrain {
            data,
            network,
            out,
            epochs,
            loss,
            lr,
            val_fraction,
            seed,
            d_model,
            heads,
            layers,
        } => data::pretrain(data::PretrainArgs {
            data,
            networks: network,
            out,
            epochs,
            loss,
            lr,
            val_fraction,
            seed,
            d_model,
            heads,
            layers,
        })?,
        Command::Transfer {
            model,
            data,
            network,
            shots,
            out,
            mode,
            epochs,
            seed,
            json,
        } => data::transfer(data::TransferArgs {
            model,
            data,
            networks: network,
            shots,
            out,
            mode,
            epochs,
            seed,
            json,
        })?,
        Command::Eval {
            model,
            data,
            network,
            seed,
            plot,
            json,
        } => data::eval(
            model.as_deref(),
            &data,
            &network,
            seed,
            plot.as_deref(),
            json,
        )?,
        Command::Features {
            workload,
            trace,
            log,
            threads,
            json,
        } => features::run(
            workload.as_deref(),
            trace.as_deref(),
            log.as_deref(),
            threads,
            json,
        )?,
        Command::Measure {
            workload,
            intrinsic,
            trace,
            threads,
            emulate,
            emit,
            json,
        } => cpu::measure(
            &workload,
            intrinsic.as_deref(),
            trace.as_deref(),
            threads,
            emulate,
            emit.as_deref(),
            json,
        )?,
        Command::Bench {
            target:
                BenchTarget::Cpu {
                    size,
                    threads,
                    intrinsics,
                    no_onednn,
                    json,
                },
        } => cpu::bench(size, &threads, &intrinsics, !no_onednn, json)?,
        Command::Intrinsics { json } => intrinsics(json)?,
        Command::Match {
            workload,
            intrinsic,
            json,
        } => matches(&workload, &intrinsic, json)?,
        Command::Workloads {
            network: None,
            json,
            ..
        } => {
            if json {
                let list: Vec<_> = NETWORKS
                    .iter()
                    .map(|(n, d)| serde_json::json!({"name": n, "description": d}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!("networks (use --network NAME):");
                for (name, desc) in NETWORKS {
                    println!("  {name:<16} {desc}");
                }
            }
        }
        Command::Workloads {
            network: Some(name),
            batch,
            dtype,
            json,
        } => {
            let dtype: DType = dtype.parse().context("--dtype")?;
            let net = network(&name, batch, dtype)?;
            let tasks: Vec<TaskRow> = net
                .tasks()
                .iter()
                .map(|t| TaskRow {
                    spec: t.workload.to_string(),
                    kind: t.workload.kind(),
                    weight: t.weight,
                    flops: t.workload.flops(),
                    total_flops: t.weight * t.workload.flops(),
                })
                .collect();
            let report = NetworkReport {
                network: net.name.clone(),
                batch,
                dtype: dtype.to_string(),
                layers: net.graph.node_count(),
                total_flops: tasks.iter().map(|t| t.total_flops).sum(),
                tasks,
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!(
                    "{} (batch {}, {}): {} layers, {} tasks, {:.3} GFLOPs ({:.3} GMACs)",
                    report.network,
                    batch,
                    report.dtype,
                    report.layers,
                    report.tasks.len(),
                    report.total_flops as f64 / 1e9,
                    report.total_flops as f64 / 2e9
                );
                println!("{:>6} {:>10} {:>7}  spec", "weight", "MFLOPs", "share");
                for t in &report.tasks {
                    println!(
                        "{:>6} {:>10.1} {:>6.1}%  {}",
                        t.weight,
                        t.flops as f64 / 1e6,
                        100.0 * t.total_flops as f64 / report.total_flops as f64,
                        t.spec
                    );
                }
            }
        }
    }
    Ok(())
}

fn intrinsics(json: bool) -> Result<()> {
    let host = HostCpu::detect();
    let catalog = Catalog::default();
    let support = |i: &tessel_intrin::Intrinsic| match host.supports(i) {
        Support::Yes => "yes".to_string(),
        Support::No(why) => format!("no: {why}"),
    };
    if json {
        let rows: Vec<_> = catalog
            .intrinsics
            .iter()
            .map(|i| serde_json::json!({"intrinsic": i, "supported_here": support(i)}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"host": host, "intrinsics": rows}))?
        );
        return Ok(());
    }
    println!(
        "host: {} ({}), {} logical cores, AMX permitted: {}",
        host.model, host.vendor, host.logical_cores, host.amx_permitted
    );
    println!(
        "features: {}",
        host.features.iter().cloned().collect::<Vec<_>>().join(" ")
    );
    for i in &catalog.intrinsics {
        println!("{i}\n    here: {}", support(i));
    }
    Ok(())
}

fn matches(spec: &str, id: &str, json: bool) -> Result<()> {
    let workload: Workload = spec
        .parse()
        .with_context(|| format!("--workload `{spec}`"))?;
    let catalog = Catalog::default();
    let intr = catalog.get(id).with_context(|| {
        format!(
            "unknown intrinsic `{id}` (known: {})",
            catalog.ids().join(", ")
        )
    })?;
    let op = workload.to_op();
    let mappings = match_op(&op, intr)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&mappings)?);
        return Ok(());
    }
    println!(
        "{op}\n{intr}\n{} mappings, least padding first:",
        mappings.len()
    );
    for (i, m) in mappings.iter().enumerate() {
        println!("{i:4}: {m}");
    }
    Ok(())
}
