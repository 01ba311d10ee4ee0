//! Records as training data: reading dataset files strictly, selecting networks, and turning
//! records into featurised samples.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use tessel_features::{Target, WIDTH, extract};
use tessel_intrin::Catalog;
use tessel_ir::{DType, Types, network, network_with_types};
use tessel_model::{Dataset, Sample};
use tessel_search::{TuningRecord, read_log};

use crate::error::{Context, Result, bail};

/// Every record of a dataset file; a missing file or a corrupt line is an error naming it.
pub fn strict_read(path: &Path) -> Result<Vec<TuningRecord>> {
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

/// The workload specs of these networks (batch 1, every element type), to select records;
/// `None` for no networks (every record).
pub fn network_filter(names: &[String]) -> Result<Option<HashSet<String>>> {
    if names.is_empty() {
        return Ok(None);
    }
    let mut specs = HashSet::new();
    for name in names {
        // Every element type, and quantized u8 x i8.
        let int8 = Types {
            dtype: DType::U8,
            wdtype: DType::I8,
        };
        for types in DType::ALL.into_iter().map(Types::same).chain([int8]) {
            if let Ok(net) = network_with_types(name, 1, types) {
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
            let program = r.program(&catalog).with_context(at)?;
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

/// Paths joined for messages.
pub(crate) fn display(files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
