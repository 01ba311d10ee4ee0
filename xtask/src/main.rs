//! `cargo xtask`: tessel's pipelines. Today: `workloads`.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use serde::Serialize;
use tessel_ir::{DType, NETWORKS, network};

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
