//! `workloads`, `intrinsics` and `match`: what tessel knows, printed.

use anyhow::{Context, Result};
use serde::Serialize;
use tessel::intrin::{Catalog, HostCpu, Intrinsic, Support, match_op};
use tessel::ir::{IMAGE_SIZES, NETWORKS, RESIZABLE_NETWORKS, network};
use tessel::{DType, Workload};

#[derive(clap::Args)]
pub struct WorkloadsArgs {
    /// A network name (see the list without this flag).
    #[arg(long)]
    network: Option<String>,
    /// Batch size.
    #[arg(long, default_value_t = 1)]
    batch: u64,
    /// Element type of every operator: bf16, f16, f32, i8, u8.
    #[arg(long, default_value = "bf16")]
    dtype: DType,
    /// One JSON document instead of a table.
    #[arg(long)]
    json: bool,
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

pub fn workloads(a: &WorkloadsArgs) -> Result<()> {
    let Some(name) = &a.network else {
        if a.json {
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
            println!(
                "{} also build at another input size: NAME-SIZE, SIZE a multiple of 32 from {} to {} (e.g. resnet50-256)",
                RESIZABLE_NETWORKS.join(", "),
                IMAGE_SIZES.start(),
                IMAGE_SIZES.end()
            );
        }
        return Ok(());
    };
    let net = network(name, a.batch, a.dtype)?;
    let tasks: Vec<TaskRow> = net
        .tasks()
        .iter()
        .map(|t| TaskRow {
            spec: t.workload.to_string(),
            kind: t.workload.kind(),
            weight: t.weight,
            flops: t.workload.flops(),
            total_flops: t.weight.saturating_mul(t.workload.flops()),
        })
        .collect();
    let report = NetworkReport {
        network: net.name.clone(),
        batch: a.batch,
        dtype: a.dtype.to_string(),
        layers: net.graph.node_count(),
        total_flops: tasks
            .iter()
            .map(|t| t.total_flops)
            .fold(0, u64::saturating_add),
        tasks,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "{} (batch {}, {}): {} layers, {} tasks, {:.3} GFLOPs ({:.3} GMACs)",
        report.network,
        a.batch,
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
    Ok(())
}

pub fn intrinsics(json: bool) -> Result<()> {
    let host = HostCpu::detect();
    let catalog = Catalog::default();
    let support = |i: &Intrinsic| match host.supports(i) {
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

#[derive(clap::Args)]
pub struct MatchArgs {
    /// A workload spec, e.g. gemm:m=1024,n=1024,k=1024,dtype=bf16
    #[arg(long)]
    workload: Workload,
    /// An instruction id from `cargo xtask intrinsics`.
    #[arg(long)]
    intrinsic: String,
    #[arg(long)]
    json: bool,
}

pub fn matches(a: &MatchArgs) -> Result<()> {
    let catalog = Catalog::default();
    let id = &a.intrinsic;
    let intr = catalog.get(id).with_context(|| {
        format!(
            "unknown intrinsic `{id}` (known: {})",
            catalog.ids().join(", ")
        )
    })?;
    let op = a.workload.to_op();
    let mappings = match_op(&op, intr)?;
    if a.json {
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
