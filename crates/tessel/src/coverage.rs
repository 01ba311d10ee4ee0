//! `coverage`: the mappings of today's schedule space that a dataset's tasks have no record
//! of. The space changes (a mapping kept past its cut, an instruction added); records
//! sampled before keep describing the space they were drawn from, and a model trained or
//! tested on them never sees what is new. (On 2026-12-06 the test networks' stems had no
//! record of their direct mapping, `k <- (c)`, the fastest one there: found by hand, and
//! the best of nine tasks fell 1.75-2.9x once it was measured.) The report names each task
//! and platform, so `dataset --workload W --platform P` can fill it.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use serde::Serialize;
use tessel_intrin::CpuPlatform;
use tessel_ir::Workload;
use tessel_search::{Space, supersede};

use crate::data::{network_filter, strict_read};
use crate::dataset::platform_instruction_set;
use crate::error::{Context, Result, bail};
use crate::progress::Progress;

/// Which dataset to check.
#[derive(Clone, Debug, Default)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct CoverageOptions {
    /// The dataset (JSON Lines, or gzip-compressed `.gz`).
    #[cfg_attr(feature = "clap", arg(long))]
    pub data: PathBuf,
    /// Only the tasks of these networks, comma separated.
    #[cfg_attr(feature = "clap", arg(long = "network", value_delimiter = ','))]
    pub networks: Vec<String>,
}

/// What `coverage` found.
#[derive(Clone, Debug, Serialize)]
pub struct CoverageReport {
    /// Records read, superseded ones left out.
    pub records: usize,
    /// Tasks (workload and CPU platform) checked.
    pub tasks: usize,
    /// Records of targets other than a named CPU platform (`cpu:avx2-fma`, ...), by target:
    /// not checked, since their space depends on a machine or a device the file does not
    /// name.
    pub unchecked: Vec<(String, usize)>,
    /// The tasks with a mapping of today's space that none of their records uses, the most
    /// such mappings first.
    pub gaps: Vec<TaskGap>,
    /// Records whose mapping today's space no longer offers (cut, or described otherwise
    /// since), over every task checked.
    pub outside: usize,
}

/// One task's mappings without records.
#[derive(Clone, Debug, Serialize)]
pub struct TaskGap {
    /// The workload spec.
    pub workload: String,
    /// The platform its records ran on (`dataset --platform`).
    pub platform: String,
    /// The task's records.
    pub records: usize,
    /// Mappings today's space offers for it.
    pub mappings: usize,
    /// Those no record uses (`instruction: mapping`, as records write them).
    pub missing: Vec<String>,
    /// The task's records whose mapping today's space no longer offers.
    pub outside: usize,
}

/// Reads `o.data` and, for each task of a CPU platform, compares the mappings its records
/// use with those today's space offers on that platform.
pub fn coverage(o: &CoverageOptions, progress: &mut dyn Progress) -> Result<CoverageReport> {
    let records = supersede(strict_read(&o.data, progress)?);
    let only = network_filter(&o.networks)?;
    // Per task (workload, platform): how many records use each mapping label; the fallback
    // (no mapping) is counted under None.
    let mut tasks: BTreeMap<(String, String), HashMap<Option<String>, usize>> = BTreeMap::new();
    let mut unchecked: BTreeMap<String, usize> = BTreeMap::new();
    let mut kept = 0usize;
    for r in &records {
        if only.as_ref().is_some_and(|s| !s.contains(&r.workload)) {
            continue;
        }
        kept += 1;
        match r.target.strip_prefix("cpu:") {
            Some(platform) if platform != "emulated" => {
                *tasks
                    .entry((r.workload.clone(), platform.to_string()))
                    .or_default()
                    .entry(r.mapping.clone())
                    .or_default() += 1;
            }
            _ => *unchecked.entry(r.target.clone()).or_default() += 1,
        }
    }
    if only.is_some() && kept == 0 {
        bail!(
            "{}: no record of the --network tasks ({})",
            o.data.display(),
            o.networks.join(",")
        );
    }
    progress.start("tasks", tasks.len() as u64);
    let mut gaps = Vec::new();
    let mut outside = 0usize;
    for (i, ((workload, platform), used)) in tasks.iter().enumerate() {
        progress.update(i as u64, workload);
        let space = platform_space(workload, platform)
            .with_context(|| format!("{}: task {workload} on {platform}", o.data.display()))?;
        let offered: Vec<String> = space.mappings().iter().map(|m| m.label()).collect();
        let missing: Vec<String> = offered
            .iter()
            .filter(|l| !used.contains_key(&Some((*l).clone())))
            .cloned()
            .collect();
        let task_outside: usize = used
            .iter()
            .filter(|(l, _)| l.as_ref().is_some_and(|l| !offered.contains(l)))
            .map(|(_, n)| n)
            .sum();
        outside += task_outside;
        if !missing.is_empty() {
            gaps.push(TaskGap {
                workload: workload.clone(),
                platform: platform.clone(),
                records: used.values().sum(),
                mappings: offered.len(),
                missing,
                outside: task_outside,
            });
        }
    }
    progress.finish();
    gaps.sort_by(|a, b| {
        b.missing
            .len()
            .cmp(&a.missing.len())
            .then_with(|| a.workload.cmp(&b.workload))
    });
    Ok(CoverageReport {
        records: kept,
        tasks: tasks.len(),
        unchecked: unchecked.into_iter().collect(),
        gaps,
        outside,
    })
}

/// Today's space of `workload` on the CPU platform `platform`, as `dataset` samples it
/// (whether or not this machine can run the platform).
fn platform_space(workload: &str, platform: &str) -> Result<Space> {
    let w: Workload = workload.parse()?;
    w.validate()?;
    let set = platform_instruction_set(CpuPlatform::named(platform)?);
    Ok(Space::new(&w.to_op(), &set))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::NoProgress;
    use tessel_measure::{HardwareFingerprint, MeasureError, MeasureErrorKind};
    use tessel_search::TuningRecord;
    use tessel_search::rng::Rng;

    const CONV: &str =
        "conv2d:n=1,h=14,w=14,c=32,k=64,r=3,s=3,stride=1,pad=1,layout=nhwc,dtype=f32";

    /// Records of `n` sampled schedules of CONV on avx2-fma whose mapping `keep` accepts,
    /// as `dataset` writes them.
    fn records(n: usize, keep: impl Fn(Option<&str>) -> bool) -> Vec<TuningRecord> {
        let w: Workload = CONV.parse().unwrap();
        let space = platform_space(CONV, "avx2-fma").unwrap();
        let mut rng = Rng::new(7);
        let mut out: Vec<TuningRecord> = Vec::new();
        for _ in 0..20_000 {
            if out.len() == n {
                break;
            }
            let sketch = space.sample(&mut rng);
            let label = space.mapping_label(&sketch);
            let Ok(trace) = space.trace(&sketch) else {
                continue;
            };
            if !keep(label.as_deref()) || out.iter().any(|r| r.trace == trace) {
                continue;
            }
            out.push(TuningRecord::new(
                &w,
                "cpu:avx2-fma",
                HardwareFingerprint::default(),
                trace,
                label,
                Err(MeasureError::new(MeasureErrorKind::Compile, "not measured")),
            ));
        }
        assert_eq!(out.len(), n, "the space ran dry");
        out
    }

    /// An empty directory of this test's own.
    fn fresh_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("tessel-coverage-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn write(dir: &std::path::Path, records: &[TuningRecord]) -> PathBuf {
        let path = dir.join("data.jsonl");
        let lines: Vec<String> = records
            .iter()
            .map(|r| serde_json::to_string(r).unwrap())
            .collect();
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        path
    }

    fn run(data: PathBuf) -> Result<CoverageReport> {
        coverage(
            &CoverageOptions {
                data,
                networks: Vec::new(),
            },
            &mut NoProgress,
        )
    }

    #[test]
    fn a_task_sampled_from_one_mapping_misses_every_other() {
        let space = platform_space(CONV, "avx2-fma").unwrap();
        let first = space.mappings()[0].label();
        assert!(
            space.mappings().len() > 1,
            "the test needs several mappings"
        );
        let dir = fresh_dir("one");
        let only_first = records(12, |l| l == Some(first.as_str()));
        let report = run(write(&dir, &only_first)).unwrap();
        assert_eq!((report.records, report.tasks, report.outside), (12, 1, 0));
        let gap = &report.gaps[0];
        assert_eq!(gap.platform, "avx2-fma");
        assert_eq!(gap.mappings, space.mappings().len());
        assert_eq!(gap.missing.len(), space.mappings().len() - 1);
        assert!(!gap.missing.contains(&first));
    }

    #[test]
    fn a_task_with_every_mapping_has_no_gap_and_old_mappings_count_as_outside() {
        let space = platform_space(CONV, "avx2-fma").unwrap();
        let mut all = Vec::new();
        for m in space.mappings() {
            let label = m.label();
            let mut one = records(1, |l| l == Some(label.as_str()));
            // Distinct schedules: a later record of the same one would supersede it.
            one.retain(|r| all.iter().all(|a: &TuningRecord| a.trace != r.trace));
            all.extend(one);
        }
        let mut old = records(1, |l| l.is_some()).remove(0);
        old.mapping = Some("avx2.vfmadd231ps: a mapping no longer offered".into());
        old.trace.steps.truncate(1);
        all.push(old);
        let dir = fresh_dir("every");
        let report = run(write(&dir, &all)).unwrap();
        assert!(report.gaps.is_empty(), "{:?}", report.gaps);
        assert_eq!(report.outside, 1);
    }

    #[test]
    fn other_targets_are_counted_not_checked_and_bad_platforms_are_named() {
        let dir = fresh_dir("targets");
        let mut rs = records(2, |_| true);
        rs[0].target = "sim:a100".into();
        let report = run(write(&dir, &rs)).unwrap();
        assert_eq!(report.unchecked, vec![("sim:a100".to_string(), 1)]);
        assert_eq!(report.tasks, 1);

        rs[1].target = "cpu:avx9-magic".into();
        let err = run(write(&dir, &rs)).unwrap_err().to_string();
        assert!(err.contains("avx9-magic"), "{err}");
        assert!(err.contains("data.jsonl"), "{err}");
    }

    #[test]
    fn a_missing_file_is_an_error() {
        let err = run(PathBuf::from("/nonexistent/data.jsonl"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("no such dataset file"), "{err}");
    }
}
