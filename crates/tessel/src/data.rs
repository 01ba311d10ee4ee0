//! Records as training data: reading dataset files strictly, selecting networks, and turning
//! records into featurised samples.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use tessel_features::{PRIMITIVE_WIDTH, Target, WIDTH, extract, primitive_tokens};
use tessel_intrin::Catalog;
use tessel_ir::{DType, Types, network, network_with_types};
use tessel_model::{Dataset, Sample};
use tessel_search::{TuningRecord, read_log, supersede_by};

use crate::error::{Context, Result, bail};
use crate::progress::Progress;

/// Every record of a dataset file, in file order, superseded ones included: a schedule
/// measured again (`remeasure`) appears once per measurement and only the latest counts
/// (`tessel::search::supersede` keeps it, as [`load`] does). A missing file, or a corrupt
/// line inside it, is an error naming the file and line and saying how to repair it; a
/// corrupt *last* line (a writer killed mid-line, or a full disk) is skipped with a note, as
/// the tuner's readers do.
pub fn strict_read(path: &Path, progress: &mut dyn Progress) -> Result<Vec<TuningRecord>> {
    if !path.exists() {
        bail!("{}: no such dataset file", path.display());
    }
    let contents = read_log(path)?;
    let name = path.display();
    match contents.corrupt.as_slice() {
        [] => {}
        [c] if c.last => progress.note(&format!(
            "warning: {name}:{}: skipped a torn last record ({}); to repair, keep the lines before it: head -n {} {name} > fixed.jsonl",
            c.line,
            c.reason,
            c.line - 1
        )),
        [c, rest @ ..] => bail!(
            "{name}:{}: corrupt record ({}){}; remove or restore the line (sed -i '{}d' {name}) and rerun",
            c.line,
            c.reason,
            if rest.is_empty() {
                String::new()
            } else {
                format!(" and {} more", rest.len())
            },
            c.line
        ),
    }
    Ok(contents.records)
}

/// The workload specs of these networks (batch 1, every element type), to select records;
/// `None` for no networks (every record).
pub fn network_filter(names: &[String]) -> Result<Option<HashSet<String>>> {
    if names.is_empty() {
        return Ok(None);
    }
    let mut specs = HashSet::new();
    for name in names {
        specs.extend(network_tasks(name)?.weights.into_keys());
    }
    Ok(Some(specs))
}

/// [`network_filter`] of `names`, less every task of the `except` networks (even one that a
/// named network shares). Excluding needs names: "everything but" is not a set this knows.
pub fn network_filter_except(
    names: &[String],
    except: &[String],
) -> Result<Option<HashSet<String>>> {
    let only = network_filter(names)?;
    let Some(excluded) = network_filter(except)? else {
        return Ok(only);
    };
    let Some(only) = only else {
        bail!(
            "--exclude-network needs --network: name the networks to train on, and the excluded ones' tasks are taken out of them"
        );
    };
    let kept: HashSet<String> = only.difference(&excluded).cloned().collect();
    if kept.is_empty() {
        bail!("every task of the --network networks belongs to an excluded network");
    }
    Ok(Some(kept))
}

/// A network's tasks as records name them: batch 1, in every element type and quantized
/// u8 x i8.
pub(crate) struct NetworkTasks {
    /// Workload spec -> how often it occurs in the network.
    pub weights: HashMap<String, u64>,
    /// Distinct tasks in one element type.
    pub count: usize,
    /// Each element type's workload specs (the network built in it).
    pub per_type: Vec<Vec<String>>,
}

/// The tasks of network `name`; an unknown name is an error naming the known ones.
pub(crate) fn network_tasks(name: &str) -> Result<NetworkTasks> {
    let int8 = Types {
        dtype: DType::U8,
        wdtype: DType::I8,
    };
    let mut weights = HashMap::new();
    let mut count = 0;
    let mut per_type = Vec::new();
    for types in DType::ALL.into_iter().map(Types::same).chain([int8]) {
        if let Ok(net) = network_with_types(name, 1, types) {
            let tasks = net.tasks();
            count = count.max(tasks.len());
            per_type.push(tasks.iter().map(|t| t.workload.to_string()).collect());
            weights.extend(
                tasks
                    .into_iter()
                    .map(|t| (t.workload.to_string(), t.weight)),
            );
        }
    }
    if weights.is_empty() {
        // Let the network lookup name the problem.
        network(name, 1, DType::F32)?;
    }
    Ok(NetworkTasks {
        weights,
        count,
        per_type,
    })
}

/// How records become tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// Allocation features of the lowered program on its machine (the model's input).
    Allocation,
    /// The trace's primitives, one token per step (TLP's view; the ablation).
    Primitives,
}

/// Which of a record's timings is its latency label.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Label {
    /// The median of its timed runs (what every figure uses unless it says otherwise).
    #[default]
    Median,
    /// Its fastest run: less of the machine's noise, which only ever adds time.
    Fastest,
}

impl Label {
    /// [`Label::Fastest`] when asked for (`--fastest-run`), else [`Label::Median`].
    pub fn fastest_if(fastest_run: bool) -> Self {
        if fastest_run {
            Label::Fastest
        } else {
            Label::Median
        }
    }
}

/// Records -> samples: successful, non-emulated records (of the `only` workloads, where
/// given), lowered and featurised on the machine that measured them. A task is a workload on
/// one target and machine.
pub fn load(
    files: &[PathBuf],
    only: Option<&HashSet<String>>,
    progress: &mut dyn Progress,
) -> Result<Dataset> {
    load_labeled(files, only, Label::Median, progress)
}

/// [`load`], labelling each sample with the `label` timing of its record.
pub fn load_labeled(
    files: &[PathBuf],
    only: Option<&HashSet<String>>,
    label: Label,
    progress: &mut dyn Progress,
) -> Result<Dataset> {
    Ok(load_labeled_instructions(files, only, label, progress)?.0)
}

/// [`load_labeled`], and the instructions (ids of the records' mappings) its samples ran on.
pub fn load_labeled_instructions(
    files: &[PathBuf],
    only: Option<&HashSet<String>>,
    label: Label,
    progress: &mut dyn Progress,
) -> Result<(Dataset, BTreeSet<String>)> {
    let mut instructions = BTreeSet::new();
    let data = load_encoded_labeled(
        files,
        only,
        &[Encoding::Allocation],
        label,
        Some(&mut instructions),
        progress,
    )?
    .pop()
    .context("no dataset")?;
    Ok((data, instructions))
}

/// The same records and tasks, in the same order, under each encoding.
pub fn load_encoded(
    files: &[PathBuf],
    only: Option<&HashSet<String>>,
    encodings: &[Encoding],
    progress: &mut dyn Progress,
) -> Result<Vec<Dataset>> {
    load_encoded_labeled(files, only, encodings, Label::Median, None, progress)
}

fn load_encoded_labeled(
    files: &[PathBuf],
    only: Option<&HashSet<String>>,
    encodings: &[Encoding],
    label: Label,
    mut instructions: Option<&mut BTreeSet<String>>,
    progress: &mut dyn Progress,
) -> Result<Vec<Dataset>> {
    let catalog = Catalog::default();
    let mut tasks: BTreeMap<String, usize> = BTreeMap::new();
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); encodings.len()];
    let mut targets: BTreeMap<String, Target> = BTreeMap::new();
    let (records, superseded) = latest_records(files, progress)?;
    if superseded > 0 {
        progress.note(&format!(
            "note: {superseded} records left out: the same schedules were measured again later (remeasure)"
        ));
    }
    let (records_len, mut filtered) = (records.len() + superseded, 0usize);
    let mut undigested = 0usize;
    for (path, i, r) in records {
        let Ok(m) = &r.result else { continue };
        if m.emulated || m.timing.median_s <= 0.0 {
            continue;
        }
        if only.is_some_and(|o| !o.contains(&r.workload)) {
            filtered += 1;
            continue;
        }
        undigested += usize::from(m.kernel.is_none());
        let at = || format!("{} record {}", path.display(), i + 1);
        let program = r.program(&catalog).with_context(at)?;
        let fkey = r.fingerprint.key();
        if !targets.contains_key(&fkey) {
            let t = crate::target::feature_target(&r.fingerprint)
                .with_context(|| format!("{}: its machine", at()))?;
            targets.insert(fkey.clone(), t);
        }
        let mut key = format!("{} @ {} @ {}", r.workload, r.target, fkey);
        // Timed with the weights packed beforehand: not ranked against the other kind.
        if r.prepacked_weights {
            key.push_str(" @ prepacked weights");
        }
        let n = tasks.len();
        let task = *tasks.entry(key).or_insert(n);
        if let (Some(set), Some(id)) = (
            instructions.as_deref_mut(),
            crate::target::instruction_of(r.mapping.as_deref()),
        ) {
            if !set.contains(id) {
                set.insert(id.to_string());
            }
        }
        for (e, out) in encodings.iter().zip(samples.iter_mut()) {
            let tokens = match e {
                Encoding::Allocation => {
                    extract(&program, &targets[&fkey])
                        .with_context(|| format!("{}: features", at()))?
                        .tokens
                }
                Encoding::Primitives => primitive_tokens(&r.trace),
            };
            out.push(Sample {
                task,
                tokens,
                latency: match label {
                    Label::Median => m.timing.median_s,
                    Label::Fastest => m.timing.min_s,
                },
            });
        }
    }
    let samples_len = samples.first().map_or(0, Vec::len);
    if undigested > 0 {
        // Their labels may time code today's generator no longer builds for their trace.
        progress.note(&format!(
            "note: {undigested} of {samples_len} records carry no kernel digest (measured before records had one); to measure them again with today's code generator: cargo xtask remeasure --dataset FILE --undigested"
        ));
    }
    if samples_len == 0 && filtered > 0 {
        bail!(
            "the network filter removed every record of {} ({filtered} successful records of other workloads)",
            display(files)
        );
    }
    if samples_len == 0 {
        bail!(
            "no successful measurement in {} ({records_len} records)",
            display(files)
        );
    }
    let mut keys: Vec<(String, f64)> = vec![(String::new(), 1.0); tasks.len()];
    for (k, i) in tasks {
        keys[i] = (k, 1.0);
    }
    let mut out = Vec::new();
    for (e, samples) in encodings.iter().zip(samples) {
        let width = match e {
            Encoding::Allocation => WIDTH,
            Encoding::Primitives => PRIMITIVE_WIDTH,
        };
        out.push(Dataset::new(keys.clone(), samples, width)?);
    }
    Ok(out)
}

/// A record with the file it was read from and its 0-based position there.
type Located<'a> = (&'a Path, usize, TuningRecord);

/// Every record of `files` with where it was read, less those a later record of the same
/// schedule supersedes (in any of the files, read in order); and how many were.
pub(crate) fn latest_records<'a>(
    files: &'a [PathBuf],
    progress: &mut dyn Progress,
) -> Result<(Vec<Located<'a>>, usize)> {
    let mut all = Vec::new();
    for path in files {
        for (i, r) in strict_read(path, progress)?.into_iter().enumerate() {
            all.push((path.as_path(), i, r));
        }
    }
    let read = all.len();
    let kept = supersede_by(all, |(_, _, r)| r);
    let superseded = read - kept.len();
    Ok((kept, superseded))
}

/// Paths joined for messages.
pub(crate) fn display(files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fastest_run_label_is_never_above_the_median() {
        let file = crate::tune::fixtures_dir().join("datasets/cpu-avx2-fma-bert-llama.jsonl.gz");
        let load = |label| {
            load_labeled(
                std::slice::from_ref(&file),
                None,
                label,
                &mut crate::NoProgress,
            )
            .unwrap()
        };
        let (median, fastest) = (load(Label::Median), load(Label::Fastest));
        assert_eq!(median.samples.len(), fastest.samples.len());
        let pairs = || median.samples.iter().zip(&fastest.samples);
        assert!(pairs().all(|(m, f)| f.latency <= m.latency && f.task == m.task));
        assert!(pairs().any(|(m, f)| f.latency < m.latency));
    }

    #[test]
    fn an_unknown_network_is_an_error_even_after_a_known_one() {
        let e = network_filter(&["resnet50".into(), "nonet".into()]).unwrap_err();
        assert!(e.to_string().contains("nonet"), "{e}");
        let specs = network_filter(&["bert-tiny-128".into()]).unwrap().unwrap();
        assert!(specs.contains("dense:m=128,n=128,k=128,dtype=f32,epilogue=bias"));
        assert_eq!(network_tasks("bert-tiny-128").unwrap().count, 5);
    }

    #[test]
    fn excluded_networks_take_their_shared_tasks_out_of_the_named_ones() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let r18 = network_filter(&names(&["resnet18"])).unwrap().unwrap();
        let r50 = network_filter(&names(&["resnet50"])).unwrap().unwrap();
        let kept = network_filter_except(&names(&["resnet18"]), &names(&["resnet50"]))
            .unwrap()
            .unwrap();
        let shared = r18.intersection(&r50).count();
        assert!(
            shared > 0,
            "ResNet-18 and ResNet-50 share tasks (the stem, ...)"
        );
        assert_eq!(kept.len(), r18.len() - shared);
        assert!(kept.iter().all(|w| !r50.contains(w)));
        // Nothing excluded: the named networks as they are.
        assert_eq!(
            network_filter_except(&names(&["resnet18"]), &[])
                .unwrap()
                .unwrap(),
            r18
        );
        // Excluding without naming, or excluding everything named, is an error.
        let e = network_filter_except(&[], &names(&["resnet50"])).unwrap_err();
        assert!(e.to_string().contains("--network"), "{e}");
        assert!(network_filter_except(&names(&["resnet50"]), &names(&["resnet50"])).is_err());
        // Unknown names are errors either side.
        assert!(network_filter_except(&names(&["resnet18"]), &names(&["nonet"])).is_err());
    }
}
