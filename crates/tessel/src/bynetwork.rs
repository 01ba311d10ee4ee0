//! Scores by network, as TenSet and TLP report them: each network's tasks weighted by how
//! often each occurs in it, then the plain mean over the networks. Pooled over every task
//! of a data set, TenSet's latency-weighted top-k is decided by its heaviest layers: on
//! the int8 test half of a transfer, one pick on LLaMA prefill's 512-token dense layers
//! (each over 100 ms at its best) made 60.7% of what a kept model's top-1 lost. By network,
//! LLaMA prefill is one network of the mean.

use std::collections::HashSet;

use serde::Serialize;
use tessel_model::{Dataset, Metrics, Ranked, metrics};

use crate::data::network_tasks;
use crate::error::Result;

/// One network's tasks among a data set's.
#[derive(Clone, Debug)]
pub(crate) struct NetworkGroup {
    /// The network's name (`tessel_ir::network::NETWORKS`).
    pub name: String,
    /// Its tasks in the data set: (task index, how often the task occurs in the network).
    pub tasks: Vec<(usize, f64)>,
}

/// Every network of `names` with a task in `data`, with those tasks; a task several networks
/// share is in each. The records' workload spec (before ` @ `) is what is matched. Where
/// `complete_in` is given, only the networks it holds every task of, in one element type,
/// count: a network whose data holds only the tasks it shares with another (ResNeXt-101's
/// stem beside ResNeXt-50's) was never measured as a network, and would count those tasks
/// twice.
pub(crate) fn groups<'a>(
    data: &Dataset,
    names: impl IntoIterator<Item = &'a str>,
    complete_in: Option<&Dataset>,
) -> Result<Vec<NetworkGroup>> {
    let mut out = Vec::new();
    for name in names {
        let net = network_tasks(name)?;
        if let Some(all) = complete_in {
            let held: HashSet<&str> = all.tasks.iter().map(|(key, _)| workload(key)).collect();
            let whole = |specs: &Vec<String>| specs.iter().all(|w| held.contains(w.as_str()));
            if !net.per_type.iter().any(whole) {
                continue;
            }
        }
        let tasks: Vec<(usize, f64)> = data
            .tasks
            .iter()
            .enumerate()
            .filter_map(|(t, (key, _))| net.weights.get(workload(key)).map(|&n| (t, n as f64)))
            .collect();
        if !tasks.is_empty() {
            out.push(NetworkGroup {
                name: name.to_string(),
                tasks,
            });
        }
    }
    Ok(out)
}

/// A record key's workload spec: what comes before ` @ ` (the target and machine).
fn workload(key: &str) -> &str {
    key.split(" @ ").next().unwrap_or_default()
}

/// The rankings of `group`'s tasks (of `ranked`, one per task of the data set the group was
/// made from), each weighted by how often the task occurs in the network.
pub(crate) fn pick(ranked: &[Ranked], group: &NetworkGroup) -> Vec<Ranked> {
    group
        .tasks
        .iter()
        .filter_map(|&(t, weight)| {
            ranked.get(t).map(|r| Ranked {
                weight,
                ..r.clone()
            })
        })
        .collect()
}

/// The plain mean of each figure.
pub(crate) fn mean(ms: impl Iterator<Item = Metrics>) -> Metrics {
    let all: Vec<Metrics> = ms.collect();
    let n = all.len().max(1) as f64;
    Metrics {
        top1: all.iter().map(|m| m.top1).sum::<f64>() / n,
        top5: all.iter().map(|m| m.top5).sum::<f64>() / n,
        pairwise_accuracy: all.iter().map(|m| m.pairwise_accuracy).sum::<f64>() / n,
        kendall_tau: all.iter().map(|m| m.kendall_tau).sum::<f64>() / n,
    }
}

/// One ranking's figures by network and their mean.
#[derive(Clone, Debug, Serialize)]
pub struct ByNetwork {
    /// What ranked.
    pub ranking: String,
    /// The mean over the networks: what to compare.
    pub mean: Metrics,
    /// Each network's own figures, in the groups' order.
    pub networks: Vec<(String, Metrics)>,
}

/// `ranked`'s figures on each group and their mean; where `random_seed` is given, those of
/// a random ranking of the same records instead (20 seeded draws a network).
pub(crate) fn by_network(
    ranking: &str,
    ranked: &[Ranked],
    groups: &[NetworkGroup],
    random_seed: Option<u64>,
) -> ByNetwork {
    let networks: Vec<(String, Metrics)> = groups
        .iter()
        .map(|g| {
            let mine = pick(ranked, g);
            let m = match random_seed {
                Some(seed) => metrics::random_baseline(&mine, 20, seed),
                None => metrics::evaluate(&mine),
            };
            (g.name.clone(), m)
        })
        .collect();
    ByNetwork {
        ranking: ranking.to_string(),
        mean: mean(networks.iter().map(|(_, m)| *m)),
        networks,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// One task's ranking (held-out's tests use it too).
    pub(crate) fn ranked(weight: f64, predicted: &[f64], latency: &[f64]) -> Ranked {
        Ranked {
            weight,
            predicted: predicted.to_vec(),
            latency: latency.to_vec(),
        }
    }

    #[test]
    fn a_heavy_network_counts_once_in_the_mean() {
        // Task 0 (network a) is 1000x heavier than task 1 (network b) and ranked wrong;
        // task 1 is ranked right. Pooled, task 0 decides; by network, each is half.
        let r = [
            ranked(1.0, &[1.0, 0.0], &[2.0, 1.0]),
            ranked(1.0, &[1.0, 0.0], &[0.001, 0.002]),
        ];
        let groups = [
            NetworkGroup {
                name: "a".into(),
                tasks: vec![(0, 1.0)],
            },
            NetworkGroup {
                name: "b".into(),
                tasks: vec![(1, 1.0)],
            },
        ];
        let pooled = metrics::evaluate(&r).top1;
        let b = by_network("model", &r, &groups, None);
        assert!(pooled < 0.51, "pooled {pooled}");
        assert_eq!(b.networks[0].1.top1, 0.5);
        assert_eq!(b.networks[1].1.top1, 1.0);
        assert_eq!(b.mean.top1, 0.75);
    }

    #[test]
    fn a_task_is_weighted_by_its_count_in_each_network() {
        let r = [
            ranked(1.0, &[1.0, 0.0], &[2.0, 1.0]),
            ranked(1.0, &[0.0, 1.0], &[2.0, 1.0]),
        ];
        // Network a runs task 0 three times and task 1 once.
        let groups = [NetworkGroup {
            name: "a".into(),
            tasks: vec![(0, 3.0), (1, 1.0)],
        }];
        let b = by_network("model", &r, &groups, None);
        // best 3*1 + 1*1 = 4; chosen 3*2 + 1*1 = 7.
        assert!((b.mean.top1 - 4.0 / 7.0).abs() < 1e-12);
    }

    /// A data set of these workloads, one record each, keyed as records are.
    fn data_of(workloads: &[String]) -> Dataset {
        let tasks = workloads
            .iter()
            .map(|w| (format!("{w} @ cpu avx2-int8"), 1.0))
            .collect();
        let samples = (0..workloads.len())
            .map(|task| tessel_model::Sample {
                task,
                tokens: vec![0.0],
                latency: 1.0,
            })
            .collect();
        Dataset::new(tasks, samples, 1).unwrap()
    }

    #[test]
    fn groups_count_only_networks_the_data_holds_whole() {
        let bert = network_tasks("bert-tiny-128").unwrap();
        let int8: Vec<String> = bert
            .weights
            .keys()
            .filter(|w| w.contains("dtype=u8,wdtype=i8"))
            .cloned()
            .collect();
        assert_eq!(int8.len(), bert.count, "{int8:?}");
        let all = data_of(&int8);
        // The test half: every task but the first.
        let test = data_of(&int8[1..]);
        let names = ["bert-tiny-128", "resnet50"];
        let g = groups(&test, names, Some(&all)).unwrap();
        assert_eq!(g.len(), 1, "resnet50 has no task here");
        assert_eq!(g[0].name, "bert-tiny-128");
        assert_eq!(g[0].tasks.len(), int8.len() - 1);
        for &(t, n) in &g[0].tasks {
            let w = test.tasks[t].0.split(" @ ").next().unwrap();
            assert_eq!(n, bert.weights[w] as f64);
        }
        // Without its first task the data no longer holds the network whole.
        assert!(groups(&test, names, Some(&test)).unwrap().is_empty());
        // Unchecked, a network counts wherever it has a task.
        assert_eq!(groups(&test, names, None).unwrap().len(), 1);
        // An unknown name is an error that names it.
        let e = groups(&test, ["no-such-net"], None).unwrap_err();
        assert!(e.to_string().contains("no-such-net"), "{e}");
    }
}
