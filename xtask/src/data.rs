//! The data pipelines: `dataset` (sample and measure schedules), `merge` (join shards),
//! `pretrain`, `transfer` and `eval` (the model on measured records).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tessel_features::{Target, WIDTH, extract};
use tessel_intrin::{Catalog, HostCpu, Support};
use tessel_ir::{DType, Workload, network};
use tessel_measure::{Candidate, Measurer};
use tessel_model::train::{
    Comparison, Trainable, compare, rank, ridge_rank, split_tasks, transfer_options,
};
use tessel_model::{Dataset, Loss, Model, ModelConfig, Sample, TrainOptions, train};
use tessel_model::{Ranked, metrics};
use tessel_search::records::{TESSEL_VERSION, now};
use tessel_search::rng::Rng;
use tessel_search::{InstructionSet, RecordLog, Space, TuningRecord, read_log};

use crate::tune::{TuneTarget, read_log_warning};
use crate::{cpu, plot};

/// A measurement platform: the instructions a dataset may use and its element type.
pub struct Platform {
    pub name: &'static str,
    pub instructions: &'static [&'static str],
    pub dtype: &'static str,
}

pub const PLATFORMS: &[Platform] = &[
    Platform {
        name: "amx-bf16",
        instructions: &["amx.tdpbf16ps"],
        dtype: "bf16",
    },
    Platform {
        name: "amx-int8",
        instructions: &["amx.tdpbusd", "amx.tdpbssd"],
        dtype: "u8",
    },
    Platform {
        name: "avx512-vnni",
        instructions: &["avx512.vpdpbusd"],
        dtype: "u8",
    },
    Platform {
        name: "avx512-bf16",
        instructions: &["avx512.vdpbf16ps"],
        dtype: "bf16",
    },
    Platform {
        name: "avx512-fma",
        instructions: &["avx512.vfmadd231ps"],
        dtype: "f32",
    },
    Platform {
        name: "avx2-fma",
        instructions: &["avx2.vfmadd231ps"],
        dtype: "f32",
    },
    // The compiler-vectorized loop nests, no tensorized instruction.
    Platform {
        name: "scalar",
        instructions: &[],
        dtype: "f32",
    },
];

pub fn platform(name: &str) -> Result<&'static Platform> {
    PLATFORMS.iter().find(|p| p.name == name).with_context(|| {
        let names: Vec<&str> = PLATFORMS.iter().map(|p| p.name).collect();
        format!("unknown --platform `{name}` (one of {})", names.join(", "))
    })
}

/// The platform this CPU measures best when none is named.
fn default_platform() -> &'static Platform {
    let host = HostCpu::detect();
    let catalog = Catalog::default();
    PLATFORMS
        .iter()
        .find(|p| {
            !p.instructions.is_empty()
                && p.instructions.iter().all(|id| {
                    catalog
                        .get(id)
                        .is_some_and(|i| host.supports(i) == Support::Yes)
                })
        })
        .unwrap_or(&PLATFORMS[PLATFORMS.len() - 1])
}

pub struct DatasetArgs {
    pub target: String,
    pub networks: Vec<String>,
    pub workload: Option<String>,
    pub per_task: usize,
    pub out: PathBuf,
    pub shard: Option<String>,
    pub platform: Option<String>,
    pub batch: u64,
    pub threads: usize,
    pub seed: u64,
    pub max_tasks: Option<usize>,
}

/// `I/N` with `I < N`.
fn parse_shard(s: &str) -> Result<(usize, usize)> {
    let (i, n) = s
        .split_once('/')
        .with_context(|| format!("--shard `{s}`: expected I/N, e.g. 0/4"))?;
    let (i, n): (usize, usize) = (
        i.trim().parse().with_context(|| format!("--shard `{s}`"))?,
        n.trim().parse().with_context(|| format!("--shard `{s}`"))?,
    );
    if n == 0 || i >= n {
        bail!("--shard `{s}`: need 0 <= I < N");
    }
    Ok((i, n))
}

/// FNV-1a, for per-task seeds that do not depend on the task's position.
fn hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `cargo xtask dataset`: random schedules of every task, measured for real, as records.
/// What `dataset` measures on: a CPU platform or a GPU's analytical model.
struct DatasetTarget {
    set: InstructionSet,
    dtype: DType,
    /// The target string records carry.
    label: String,
    measurer: Box<dyn Measurer>,
    name: String,
}

fn dataset_target(a: &DatasetArgs) -> Result<DatasetTarget> {
    let mut target = TuneTarget::parse(&a.target)?;
    let gpu_measurer = target.take_gpu_measurer();
    let (cc, bf16, label, device, measurer): (_, _, _, _, Box<dyn Measurer>) = match target {
        TuneTarget::Cpu => return cpu_dataset_target(a),
        TuneTarget::Sim(dev) => (
            dev.cc,
            dev.tc_bf16 > 0.0,
            format!("sim:{}", dev.key),
            format!("{} (analytical model)", dev.key),
            Box::new(tessel_gpu::SimMeasurer::new(dev)),
        ),
        TuneTarget::Gpu { cc, name, .. } => (
            cc,
            cc.0 >= 8,
            "gpu".to_string(),
            name,
            gpu_measurer.context("the GPU measurer was already used")?,
        ),
    };
    // On a GPU the platform is the networks' element type.
    let dtype = a.platform.as_deref().unwrap_or("f16");
    let dtype: DType = match dtype {
        "f16" | "bf16" | "i8" | "f32" => dtype.parse()?,
        other => bail!("--platform `{other}` on a GPU target: one of f16, bf16, i8, f32"),
    };
    if dtype == DType::BF16 && !bf16 {
        bail!("{device} has no bf16 Tensor Cores");
    }
    Ok(DatasetTarget {
        set: InstructionSet::Gpu { cc },
        dtype,
        label,
        name: format!("{device} {dtype}"),
        measurer,
    })
}

fn cpu_dataset_target(a: &DatasetArgs) -> Result<DatasetTarget> {
    let platform = match &a.platform {
        Some(p) => platform(p)?,
        None => default_platform(),
    };
    let catalog = Catalog::default();
    let host = HostCpu::detect();
    for id in platform.instructions {
        let intr = catalog
            .get(id)
            .context("platform instruction in the catalog")?;
        if let Support::No(why) = host.supports(intr) {
            bail!(
                "--platform {} needs {id}, which this machine cannot run ({why}); measure it on a machine that has it",
                platform.name
            );
        }
    }
    let set = if platform.instructions.is_empty() {
        InstructionSet::None
    } else {
        InstructionSet::Only(
            platform
                .instructions
                .iter()
                .map(|s| s.to_string())
                .collect(),
        )
    };
    Ok(DatasetTarget {
        set,
        dtype: platform.dtype.parse().context("platform dtype")?,
        label: format!("cpu:{}", platform.name),
        name: platform.name.to_string(),
        measurer: Box::new(cpu::measurer(a.threads, false)?),
    })
}

pub fn dataset(a: DatasetArgs) -> Result<()> {
    let DatasetTarget {
        set,
        dtype,
        label: target,
        mut measurer,
        name: platform_name,
    } = dataset_target(&a)?;
    let mut workloads: Vec<Workload> = Vec::new();
    match (&a.workload, a.networks.is_empty()) {
        (Some(spec), true) => workloads.push(
            spec.parse()
                .with_context(|| format!("--workload `{spec}`"))?,
        ),
        (None, false) => {
            for name in &a.networks {
                for t in network(name, a.batch, dtype)?.tasks() {
                    if !workloads.contains(&t.workload) {
                        workloads.push(t.workload);
                    }
                }
            }
        }
        _ => bail!("give exactly one of --workload SPEC and --network NAME[,NAME]"),
    }
    if let Some(m) = a.max_tasks {
        workloads.truncate(m);
    }
    if let Some(s) = &a.shard {
        let (i, n) = parse_shard(s)?;
        workloads = workloads
            .into_iter()
            .enumerate()
            .filter(|(k, _)| k % n == i)
            .map(|(_, w)| w)
            .collect();
    }
    if a.per_task == 0 {
        bail!("--per-task must be at least 1");
    }
    let existing = read_log_warning(&a.out)?;
    let fp = measurer.fingerprint().clone();
    let mut log = RecordLog::open(&a.out)?;
    let mut done: HashSet<_> = existing.records.iter().map(|r| r.key()).collect();

    let total = workloads.len() * a.per_task;
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} schedules  {msg}",
        )
        .expect("a valid template"),
    );
    let start = Instant::now();
    let (mut measured, mut errors) = (0usize, 0usize);
    for w in &workloads {
        let spec = w.to_string();
        let op = w.to_op();
        let space = Space::new(&op, &set);
        let have = existing
            .records
            .iter()
            .filter(|r| r.workload == spec && r.target == target)
            .count();
        bar.inc(have.min(a.per_task) as u64);
        let mut need = a.per_task.saturating_sub(have);
        let mut rng = Rng::new(a.seed ^ hash(&spec));
        let mut attempts = 0;
        while need > 0 && attempts < 50 * a.per_task {
            let mut batch = Vec::new();
            let mut labels = Vec::new();
            while batch.len() < need.min(16) && attempts < 50 * a.per_task {
                attempts += 1;
                let sketch = space.sample(&mut rng);
                let Ok(trace) = space.trace(&sketch) else {
                    continue;
                };
                let key = tessel_search::records::RecordKey::new(&spec, &target, &fp, &trace);
                if !done.insert(key) {
                    continue;
                }
                labels.push(space.mapping_label(&sketch));
                batch.push(Candidate::new(op.clone(), trace));
            }
            if batch.is_empty() {
                break;
            }
            bar.set_message(spec.clone());
            let results = measurer.measure(&batch);
            let records: Vec<TuningRecord> = batch
                .iter()
                .zip(results)
                .zip(labels)
                .map(|((c, r), mapping)| {
                    if r.is_err() {
                        errors += 1;
                    }
                    TuningRecord {
                        workload: spec.clone(),
                        target: target.clone(),
                        fingerprint: fp.clone(),
                        trace: c.trace.clone(),
                        mapping,
                        result: r,
                        version: TESSEL_VERSION.to_string(),
                        time: now(),
                    }
                })
                .collect();
            log.append(&records)?;
            measured += records.len();
            need -= records.len();
            bar.inc(records.len() as u64);
        }
        if need > 0 {
            bar.println(format!(
                "note: {spec}: only {} distinct schedules found",
                a.per_task - need
            ));
        }
    }
    bar.finish_and_clear();
    println!(
        "{} tasks on {} ({}): {measured} schedules measured ({errors} errors), {} already in {}, {:.1} s",
        workloads.len(),
        platform_name,
        fp.model,
        existing.records.len(),
        a.out.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `cargo xtask merge`: shards into one file, each candidate once.
pub fn merge(out: &Path, inputs: &[PathBuf]) -> Result<()> {
    if inputs.is_empty() {
        bail!("give the shard files to merge");
    }
    let mut seen = HashSet::new();
    let mut all = Vec::new();
    for path in inputs {
        let contents = strict_read(path)?;
        for r in contents {
            if seen.insert(r.key()) {
                all.push(r);
            }
        }
    }
    if out.exists() {
        bail!("{} exists; merge writes a new file", out.display());
    }
    let mut log = RecordLog::open(out)?;
    log.append(&all)?;
    println!(
        "{} records from {} files into {}",
        all.len(),
        inputs.len(),
        out.display()
    );
    Ok(())
}

/// Every record of a dataset file; a corrupt line is an error naming it.
fn strict_read(path: &Path) -> Result<Vec<TuningRecord>> {
    if !path.exists() {
        bail!("{}: no such dataset file", path.display());
    }
    let contents = read_log(path)?;
    if let Some(c) = contents.corrupt.first() {
        bail!(
            "{}:{}: corrupt record ({}){}",
            path.display(),
            c.line,
            c.reason,
            if contents.corrupt.len() > 1 {
                format!(" and {} more", contents.corrupt.len() - 1)
            } else {
                String::new()
            }
        );
    }
    Ok(contents.records)
}

/// The workload specs of these networks (batch 1, every element type), to select records.
pub fn network_filter(names: &[String]) -> Result<Option<HashSet<String>>> {
    if names.is_empty() {
        return Ok(None);
    }
    let mut specs = HashSet::new();
    for name in names {
        for dtype in DType::ALL {
            if let Ok(net) = network(name, 1, dtype) {
                specs.extend(net.tasks().into_iter().map(|t| t.workload.to_string()));
            }
        }
        if specs.is_empty() {
            // Let the network lookup name the problem.
            network(name, 1, DType::F32)?;
        }
    }
    Ok(Some(specs))
}

/// Records -> samples: successful, non-emulated records (of the `only` workloads, where
/// given), lowered and featurised on the machine that measured them. A task is a workload on
/// one target and machine.
pub fn load(files: &[PathBuf], only: Option<&HashSet<String>>) -> Result<Dataset> {
    let catalog = Catalog::default();
    let mut tasks: BTreeMap<String, usize> = BTreeMap::new();
    let mut samples = Vec::new();
    let mut targets: BTreeMap<String, Target> = BTreeMap::new();
    for path in files {
        for (i, r) in strict_read(path)?.into_iter().enumerate() {
            let Ok(m) = &r.result else { continue };
            if m.emulated || m.timing.median_s <= 0.0 {
                continue;
            }
            if only.is_some_and(|o| !o.contains(&r.workload)) {
                continue;
            }
            let at = || format!("{} record {}", path.display(), i + 1);
            let w: Workload = r
                .workload
                .parse()
                .with_context(|| format!("{}: workload `{}`", at(), r.workload))?;
            let program = r
                .trace
                .lower(&w.to_op(), &catalog)
                .with_context(|| format!("{}: its trace does not lower", at()))?;
            let fkey = r.fingerprint.key();
            if !targets.contains_key(&fkey) {
                let t = Target::from_fingerprint(&r.fingerprint)
                    .with_context(|| format!("{}: its machine", at()))?;
                targets.insert(fkey.clone(), t);
            }
            let f = extract(&program, &targets[&fkey])
                .with_context(|| format!("{}: features", at()))?;
            let key = format!("{} @ {} @ {}", r.workload, r.target, fkey);
            let n = tasks.len();
            let task = *tasks.entry(key).or_insert(n);
            samples.push(Sample {
                task,
                tokens: f.tokens,
                latency: m.timing.median_s,
            });
        }
    }
    if samples.is_empty() {
        bail!("no successful measurement in {}", display(files));
    }
    let mut keys: Vec<(String, f64)> = vec![(String::new(), 1.0); tasks.len()];
    for (k, i) in tasks {
        keys[i] = (k, 1.0);
    }
    Ok(Dataset::new(keys, samples, WIDTH)?)
}

fn display(files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_comparison(label: &str, c: &Comparison) {
    println!("{label}");
    println!(
        "  {:<8} {:>6} {:>6} {:>9} {:>8}",
        "", "top-1", "top-5", "pairwise", "tau"
    );
    for (name, m) in [
        ("model", &c.model),
        ("ridge", &c.ridge),
        ("random", &c.random),
    ] {
        println!(
            "  {name:<8} {:>6.3} {:>6.3} {:>9.3} {:>8.3}",
            m.top1, m.top5, m.pairwise_accuracy, m.kendall_tau
        );
    }
}

/// The committed datasets (fixtures/README.md) and the networks the shipped model never saw.
pub const SHIPPED_DATASETS: &[&str] = &["cpu-avx2-fma.jsonl.gz", "cpu-scalar.jsonl.gz"];
pub const HELD_OUT_NETWORKS: &[&str] = &["vit-b16"];

pub struct PretrainArgs {
    pub data: Vec<PathBuf>,
    pub networks: Vec<String>,
    pub out: PathBuf,
    pub epochs: usize,
    pub loss: String,
    pub lr: f64,
    pub val_fraction: f64,
    pub seed: u64,
    pub d_model: usize,
    pub heads: usize,
    pub layers: usize,
}

/// `cargo xtask pretrain`.
pub fn pretrain(a: PretrainArgs) -> Result<()> {
    let loss: Loss = a.loss.parse().map_err(anyhow::Error::msg)?;
    let data = load(&a.data, network_filter(&a.networks)?.as_ref())?;
    let mut config = ModelConfig::new(WIDTH);
    config.d_model = a.d_model;
    config.heads = a.heads;
    config.layers = a.layers;
    config.d_ff = 2 * a.d_model;
    let mut model = Model::new(config, a.seed)?;
    let opts = TrainOptions {
        loss,
        epochs: a.epochs,
        lr: a.lr,
        val_fraction: a.val_fraction,
        seed: a.seed,
        ..TrainOptions::default()
    };
    println!(
        "{} records of {} tasks; model of {} parameters",
        data.samples.len(),
        data.tasks.len(),
        model.params.count()
    );
    let bar = ProgressBar::new(a.epochs as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} epoch {pos}/{len}  {msg}",
        )
        .expect("a valid template"),
    );
    let report = train(&mut model, &data, &opts, &mut |e| {
        let val = e.val.map_or(String::new(), |m| {
            format!(
                "val top-1 {:.3} top-5 {:.3} pairwise {:.3}",
                m.top1, m.top5, m.pairwise_accuracy
            )
        });
        bar.println(format!(
            "epoch {:>3}: loss {:.4}, lr {:.2e}, {:.0} programs/s  {val}",
            e.epoch, e.train_loss, e.lr, e.programs_per_s
        ));
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    // The validation tasks, model against the references.
    let (train_ids, val_ids) = split_tasks(data.tasks.len(), a.val_fraction, a.seed);
    if !val_ids.is_empty() {
        let c = compare(
            &mut model,
            &data.subset(&train_ids),
            &data.subset(&val_ids),
            a.seed,
        );
        print_comparison(
            &format!(
                "validation ({} held-out tasks; best epoch {}):",
                val_ids.len(),
                report.best_epoch
            ),
            &c,
        );
    }
    model.info.provenance = serde_json::json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "data": a.data.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "records": data.samples.len(),
        "tasks": data.tasks.len(),
        "options": opts,
        "best_epoch": report.best_epoch,
        "epochs": report.epochs,
    });
    model.save(&a.out)?;
    let (w, j) = Model::paths(&a.out);
    println!("saved {} and {}", w.display(), j.display());
    Ok(())
}

pub struct TransferArgs {
    pub model: PathBuf,
    pub data: Vec<PathBuf>,
    pub networks: Vec<String>,
    pub shots: usize,
    pub out: PathBuf,
    pub mode: String,
    pub epochs: usize,
    pub seed: u64,
    pub json: bool,
}

#[derive(Serialize)]
struct TransferReport {
    shots: usize,
    mode: String,
    before: Comparison,
    after: Comparison,
    scratch: Comparison,
}

/// `cargo xtask transfer`: fine-tunes on K records, reports on the other tasks of the data
/// before and after, beside a model trained from scratch on the same K records.
pub fn transfer(a: TransferArgs) -> Result<()> {
    let trainable = match a.mode.as_str() {
        "all" => Trainable::All,
        "head" => Trainable::HeadAndEmbedding,
        other => bail!("--mode `{other}`: expected all or head"),
    };
    let mut model =
        Model::load(&a.model).with_context(|| format!("--model {}", a.model.display()))?;
    model.check_schema(tessel_features::SCHEMA_VERSION)?;
    let data = load(&a.data, network_filter(&a.networks)?.as_ref())?;
    let (shots, test) = few_shot_split(&data, a.shots, a.seed)?;
    let pre = TrainOptions {
        epochs: a.epochs,
        val_fraction: 0.0,
        seed: a.seed,
        ..TrainOptions::default()
    };
    let before = compare(&mut model, &shots, &test, a.seed);
    if !shots.samples.is_empty() {
        train(
            &mut model,
            &shots,
            &transfer_options(trainable, &pre),
            &mut |_| {},
        )?;
    }
    let after = compare(&mut model, &shots, &test, a.seed);
    let mut scratch = Model::new(model.config().clone(), a.seed)?;
    if !shots.samples.is_empty() {
        train(&mut scratch, &shots, &pre, &mut |_| {})?;
    }
    let scratch_cmp = compare(&mut scratch, &shots, &test, a.seed);
    model.info.provenance = serde_json::json!({
        "transferred_from": a.model.display().to_string(),
        "data": a.data.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "shots": a.shots,
        "mode": a.mode,
    });
    model.save(&a.out)?;
    if a.json {
        let r = TransferReport {
            shots: a.shots,
            mode: a.mode.clone(),
            before,
            after,
            scratch: scratch_cmp,
        };
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "{} shots ({} mode); evaluated on {} records of {} tasks",
            a.shots,
            a.mode,
            test.samples.len(),
            test.tasks.len()
        );
        print_comparison("pretrained, before fine-tuning:", &before);
        print_comparison("after fine-tuning:", &after);
        print_comparison("trained from scratch on the same records:", &scratch_cmp);
        let (w, j) = Model::paths(&a.out);
        println!("saved {} and {}", w.display(), j.display());
    }
    Ok(())
}

/// K records for fine-tuning, drawn from half of the tasks (seeded); the other tasks test.
fn few_shot_split(data: &Dataset, k: usize, seed: u64) -> Result<(Dataset, Dataset)> {
    if data.tasks.len() < 2 {
        bail!("transfer needs at least two tasks (one to fine-tune on, one to test)");
    }
    let (train_ids, test_ids) = split_tasks(data.tasks.len(), 0.5, seed);
    let pool = data.subset(&train_ids);
    let mut rng = Rng::new(seed);
    let mut idx: Vec<usize> = (0..pool.samples.len()).collect();
    for i in (1..idx.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        idx.swap(i, j);
    }
    idx.truncate(k);
    let samples: Vec<Sample> = idx.iter().map(|&i| pool.samples[i].clone()).collect();
    Ok((
        Dataset::new(pool.tasks.clone(), samples, data.width)?,
        data.subset(&test_ids),
    ))
}

#[derive(Serialize)]
struct EvalReport {
    model: String,
    records: usize,
    tasks: usize,
    top1: f64,
    top5: f64,
    pairwise_accuracy: f64,
    kendall_tau: f64,
    ridge: tessel_model::Metrics,
    random: tessel_model::Metrics,
}

/// `cargo xtask eval`: the model's ranking of every task of the data, beside ridge (fitted
/// on the other half of the tasks, both ways, so it never sees the tasks it ranks) and random
/// scores; with `plot`, SVG figures in that directory.
pub fn eval(
    model_path: Option<&Path>,
    data_files: &[PathBuf],
    networks: &[String],
    seed: u64,
    plot: Option<&Path>,
    json: bool,
) -> Result<()> {
    // Defaults: the shipped model on the shipped data's held-out networks.
    let shipped = || Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    let model_path = match model_path {
        Some(p) => p.to_path_buf(),
        None => shipped().join("models/cpu.safetensors"),
    };
    let (data_files, networks) = if data_files.is_empty() {
        let dir = shipped().join("datasets");
        let files: Vec<PathBuf> = SHIPPED_DATASETS.iter().map(|f| dir.join(f)).collect();
        let nets = if networks.is_empty() {
            HELD_OUT_NETWORKS.iter().map(|s| s.to_string()).collect()
        } else {
            networks.to_vec()
        };
        (files, nets)
    } else {
        (data_files.to_vec(), networks.to_vec())
    };
    let model_path = model_path.as_path();
    let mut model =
        Model::load(model_path).with_context(|| format!("--model {}", model_path.display()))?;
    model.check_schema(tessel_features::SCHEMA_VERSION)?;
    let data = load(&data_files, network_filter(&networks)?.as_ref())?;
    let ranked = rank(&mut model, &data);
    let (a, b) = split_tasks(data.tasks.len(), 0.5, seed);
    let ridge_ranked: Vec<Ranked> = if a.is_empty() || b.is_empty() {
        ridge_rank(&data, &data)
    } else {
        let (da, db) = (data.subset(&a), data.subset(&b));
        let (on_b, on_a) = (ridge_rank(&da, &db), ridge_rank(&db, &da));
        let mut out = ranked.clone();
        for (i, &t) in b.iter().enumerate() {
            out[t] = on_b[i].clone();
        }
        for (i, &t) in a.iter().enumerate() {
            out[t] = on_a[i].clone();
        }
        out
    };
    let c = Comparison {
        model: metrics::evaluate(&ranked),
        ridge: metrics::evaluate(&ridge_ranked),
        random: metrics::random_baseline(&ranked, 20, seed),
    };
    if let Some(dir) = plot {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let named: Vec<(String, Ranked)> = data
            .tasks
            .iter()
            .map(|(k, _)| k.clone())
            .zip(ranked.iter().cloned())
            .collect();
        plot::scatter(&dir.join("predicted_vs_measured.svg"), &named)?;
        let mut rng = Rng::new(seed);
        let random: Vec<Ranked> = ranked
            .iter()
            .map(|t| Ranked {
                predicted: t.latency.iter().map(|_| rng.unit()).collect(),
                ..t.clone()
            })
            .collect();
        plot::top_k(
            &dir.join("top_k.svg"),
            &[
                ("model", &ranked),
                ("ridge", &ridge_ranked),
                ("random", &random),
            ],
        )?;
        let svgs = [dir.join("predicted_vs_measured.svg"), dir.join("top_k.svg")];
        let png = plot::png_copies(&[&svgs[0], &svgs[1]]);
        if !json {
            match png {
                Ok(()) => println!("plots (SVG and PNG) in {}", dir.display()),
                Err(why) => println!("plots (SVG) in {}; no PNG: {why}", dir.display()),
            }
        }
    }
    if json {
        let r = EvalReport {
            model: model_path.display().to_string(),
            records: data.samples.len(),
            tasks: data.tasks.len(),
            top1: c.model.top1,
            top5: c.model.top5,
            pairwise_accuracy: c.model.pairwise_accuracy,
            kendall_tau: c.model.kendall_tau,
            ridge: c.ridge,
            random: c.random,
        };
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print_comparison(
            &format!(
                "{} on {} records of {} tasks (ridge: fitted on half the tasks, tested on the other):",
                model_path.display(),
                data.samples.len(),
                data.tasks.len()
            ),
            &c,
        );
    }
    Ok(())
}
