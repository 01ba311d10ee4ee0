//! TenSet's and TLP's evaluation protocol: every task of the test networks is held out of
//! training and validation; a model trained on the other networks ranks each test network's
//! tasks, scored per network (top-1 and top-5, weighted by how often each task occurs in the
//! network, pairwise accuracy, Kendall's tau) and averaged over the networks, beside random,
//! ridge, gradient-boosted trees and the ablation: the same network trained on
//! primitive-sequence tokens (TLP's features) instead of allocation features.

use std::path::PathBuf;

use serde::Serialize;
use tessel_model::ensemble::MixChoice;
use tessel_model::gbt::TreeRecipe;
use tessel_model::train::{
    gbt_rank, rank, rank_ensemble, ridge_rank, roofline_rank, split_tasks_by_key,
};
use tessel_model::{Dataset, Loss, Metrics, Model, Ranked, TrainOptions, metrics, train};

use crate::bynetwork::{self, NetworkGroup, mean};
use crate::data::{Encoding, load_encoded, network_tasks};
use crate::error::{Result, bail};
use crate::learn::Architecture;
use crate::progress::Progress;

/// TenSet's and TLP's test networks, as tessel names them.
pub const TEST_NETWORKS: &[&str] = &[
    "resnet50",
    "mobilenet-v2",
    "resnext50",
    "bert-tiny-128",
    "bert-base-128",
];

/// What to evaluate.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct HeldOutOptions {
    /// Dataset files: the records of every network, test and training.
    #[cfg_attr(feature = "clap", arg(long, num_args = 1.., required = true))]
    pub data: Vec<PathBuf>,
    /// Networks whose tasks are held out (default: TenSet's test networks).
    #[cfg_attr(
        feature = "clap",
        arg(long = "test-network", value_delimiter = ',', default_values_t = TEST_NETWORKS.iter().map(|s| s.to_string()))
    )]
    pub test_networks: Vec<String>,
    /// Training epochs (early stopping on a tenth of the training tasks).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 20))]
    pub epochs: usize,
    /// lambdarank, pairwise or mse.
    #[cfg_attr(feature = "clap", arg(long, default_value = "lambdarank"))]
    pub loss: Loss,
    /// Peak learning rate.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 3e-3))]
    pub lr: f64,
    /// The network's shape (the ablation's is the same).
    #[cfg_attr(feature = "clap", command(flatten))]
    pub architecture: Architecture,
    /// Seed of the initialisation, the validation split and the batches.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1))]
    pub seed: u64,
    /// Leave out the primitive-sequence ablation (a second model to train).
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_ablation: bool,
    /// How the ensemble's trees are grown
    /// (`rounds=,depth=,rate=,subsample=,colsample=,bags=,objective=,ndcg_at=`; as `pretrain --trees`).
    /// The trees baseline keeps the default recipe (TenSet's: regression).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = TreeRecipe::ensemble()))]
    pub trees: TreeRecipe,
    /// Once the mix is chosen on the early-stopping tasks, fit the ensemble's trees again on
    /// every training task, those included (`pretrain` ships trees fitted without them).
    #[cfg_attr(feature = "clap", arg(long))]
    pub refit_trees: bool,
}

impl HeldOutOptions {
    /// The protocol on `data` with the defaults.
    pub fn new(data: Vec<PathBuf>) -> Self {
        HeldOutOptions {
            data,
            test_networks: TEST_NETWORKS.iter().map(|s| s.to_string()).collect(),
            epochs: 20,
            loss: Loss::LambdaRank,
            lr: 3e-3,
            architecture: Architecture::default(),
            seed: 1,
            no_ablation: false,
            trees: TreeRecipe::ensemble(),
            refit_trees: false,
        }
    }
}

/// Every ranker's figures on one test network (or their average over the networks).
#[derive(Clone, Debug, Serialize)]
pub struct Scores {
    /// The model on allocation features.
    pub model: Metrics,
    /// The same network trained on primitive sequences (absent with `--no-ablation`).
    pub primitives: Option<Metrics>,
    /// Ridge regression on pooled features, fitted on the training networks.
    pub ridge: Metrics,
    /// Gradient-boosted trees on the trees' rows (`tessel_model::rows`), fitted on every
    /// task of the training networks.
    pub gbt: Metrics,
    /// The analytic roofline estimate, fitted on nothing.
    pub roofline: Metrics,
    /// The model as `pretrain` ships it: the network plus trees fitted on the network's
    /// training tasks, each divided by its within-task spread on them and weighted by the
    /// mix chosen on its early-stopping tasks (`tessel_model::ensemble`); with
    /// `--refit-trees`, the trees then fitted again on every training task.
    pub ensemble: Metrics,
    /// A random ranking.
    pub random: Metrics,
}

/// One test network.
#[derive(Clone, Debug, Serialize)]
pub struct NetworkScores {
    /// The network's name.
    pub network: String,
    /// Its tasks with records.
    pub tasks: usize,
    /// The tasks it has.
    pub tasks_in_network: usize,
    /// Records of those tasks.
    pub records: usize,
    /// Every ranker on its tasks.
    pub scores: Scores,
    /// Each task's top-1 pick by the ensemble, the network alone and the trees baseline,
    /// those where the ensemble loses the network's top-1 score most first.
    pub picks: Vec<HeldOutPicks>,
}

/// One test task's favourite by the ensemble, the network alone and the trees baseline:
/// where a network's top-1 is lost, and whether either part would have picked better.
#[derive(Clone, Debug, Serialize)]
pub struct HeldOutPicks {
    /// The task's workload spec.
    pub workload: String,
    /// How often it occurs in the network.
    pub weight: f64,
    /// Its records.
    pub records: usize,
    /// The task's best measured latency.
    pub best_s: f64,
    /// The measured latency of the ensemble's favourite.
    pub ensemble_s: f64,
    /// ... of the network's alone.
    pub model_s: f64,
    /// ... of the trees baseline's.
    pub trees_s: f64,
    /// This task's share of the ensemble's top-1 loss on the network (`sum(w * (chosen -
    /// best))` over its tasks).
    pub loss_share: f64,
}

/// The protocol's result.
#[derive(Clone, Debug, Serialize)]
pub struct HeldOutReport {
    /// Records and tasks trained on (the other networks).
    pub train_records: usize,
    /// Tasks trained on.
    pub train_tasks: usize,
    /// Records and tasks of the test networks.
    pub test_records: usize,
    /// Tasks held out.
    pub test_tasks: usize,
    /// Each test network with records.
    pub networks: Vec<NetworkScores>,
    /// The mean over the test networks.
    pub average: Scores,
    /// Best epoch of the model (and of the ablation) on its validation tasks.
    pub best_epoch: usize,
    /// The ablation's best epoch.
    pub ablation_best_epoch: Option<usize>,
    /// The ensemble's mix of network and trees, chosen on the model's validation tasks.
    pub ensemble_mix: MixChoice,
    /// Whether the ensemble's trees were fitted again on every training task once the mix
    /// was chosen (`--refit-trees`).
    pub trees_refit: bool,
}

/// Trains on every task outside the test networks, ranks each test network's tasks.
pub fn held_out(o: &HeldOutOptions, progress: &mut dyn Progress) -> Result<HeldOutReport> {
    if o.test_networks.is_empty() {
        bail!("no test network: name at least one with --test-network");
    }
    if o.epochs == 0 {
        bail!("epochs must be at least 1");
    }
    if !(o.lr.is_finite() && o.lr > 0.0 && o.lr < 1.0) {
        bail!("lr {} is not a learning rate in (0, 1)", o.lr);
    }
    // Each test network's workloads (in every element type: records carry the one they were
    // measured in) and how often each occurs.
    let nets = o
        .test_networks
        .iter()
        .map(|name| network_tasks(name))
        .collect::<Result<Vec<_>>>()?;
    let encodings: &[Encoding] = if o.no_ablation {
        &[Encoding::Allocation]
    } else {
        &[Encoding::Allocation, Encoding::Primitives]
    };
    let sets = load_encoded(&o.data, None, encodings, progress)?;
    let data = &sets[0];
    let workload_of =
        |t: usize| -> &str { data.tasks[t].0.split(" @ ").next().unwrap_or_default() };
    let is_test = |t: usize| nets.iter().any(|n| n.weights.contains_key(workload_of(t)));
    let (test_ids, train_ids): (Vec<usize>, Vec<usize>) =
        (0..data.tasks.len()).partition(|&t| is_test(t));
    if train_ids.is_empty() {
        bail!(
            "every task of the data belongs to a test network ({}): there is nothing to train on",
            o.test_networks.join(", ")
        );
    }
    if test_ids.is_empty() {
        bail!(
            "no record of the test networks ({}) in the data",
            o.test_networks.join(", ")
        );
    }
    let opts = TrainOptions {
        loss: o.loss,
        epochs: o.epochs,
        lr: o.lr,
        val_fraction: 0.1,
        seed: o.seed,
        ..TrainOptions::default()
    };
    let fit = |set: &Dataset, what: &str, progress: &mut dyn Progress| -> Result<(Model, usize)> {
        let train_set = set.subset(&train_ids);
        let mut model = Model::new(o.architecture.config(set.width), o.seed)?;
        progress.start(what, o.epochs as u64);
        let report = train(&mut model, &train_set, &opts, &mut |e| {
            progress.update(e.epoch as u64, "")
        })?;
        progress.finish();
        Ok((model, report.best_epoch))
    };
    let (mut model, best_epoch) = fit(data, "epochs (allocation features)", progress)?;
    let ablation = match sets.get(1) {
        Some(prim) => Some((fit(prim, "epochs (primitive sequences)", progress)?, prim)),
        None => None,
    };
    let (train_set, test_set) = (data.subset(&train_ids), data.subset(&test_ids));
    let ranked = rank(&mut model, &test_set);
    // The ensemble as `pretrain` ships it: trees fitted on the network's training tasks,
    // the mix chosen on its early-stopping tasks (the same split `train` made).
    progress.note("fitting gradient-boosted trees");
    let (fit_ids, val_ids) = split_tasks_by_key(&train_set, opts.val_fraction, o.seed);
    let mix = model.fit_companions_judged(
        &train_set.subset(&fit_ids),
        &train_set.subset(&val_ids),
        o.seed,
        &o.trees,
    )?;
    if o.refit_trees {
        model.refit_companions(&train_set, o.seed)?;
    }
    // The trees baseline sees every training task.
    let gbt = gbt_rank(&train_set, &test_set, o.seed);
    let ridge = ridge_rank(&train_set, &test_set);
    let roofline = roofline_rank(&test_set);
    let together = rank_ensemble(&mut model, &test_set);
    let (prim_ranked, ablation_best_epoch) = match ablation {
        Some(((mut m, best), prim)) => (Some(rank(&mut m, &prim.subset(&test_ids))), Some(best)),
        None => (None, None),
    };
    // Per network: its tasks among the test tasks, weighted by their count in the network.
    let mut networks = Vec::new();
    for (name, net) in o.test_networks.iter().zip(&nets) {
        let mine: Vec<(usize, f64)> = test_ids
            .iter()
            .enumerate()
            .filter_map(|(i, &t)| net.weights.get(workload_of(t)).map(|&n| (i, n as f64)))
            .collect();
        if mine.is_empty() {
            progress.note(&format!(
                "{name}: no records in the data; left out of the average"
            ));
            continue;
        }
        let group = NetworkGroup {
            name: name.clone(),
            tasks: mine,
        };
        let mine = &group.tasks;
        let pick = |r: &[Ranked]| -> Vec<Ranked> { bynetwork::pick(r, &group) };
        let (model_r, trees_r, ensemble_r) = (pick(&ranked), pick(&gbt), pick(&together));
        let picks = task_picks(
            mine.iter()
                .map(|&(i, _)| workload_of(test_ids[i]).to_string()),
            &ensemble_r,
            &model_r,
            &trees_r,
        );
        networks.push(NetworkScores {
            network: name.clone(),
            tasks: mine.len(),
            tasks_in_network: net.count,
            records: model_r.iter().map(|r| r.latency.len()).sum(),
            scores: Scores {
                model: metrics::evaluate(&model_r),
                primitives: prim_ranked.as_ref().map(|p| metrics::evaluate(&pick(p))),
                ridge: metrics::evaluate(&pick(&ridge)),
                gbt: metrics::evaluate(&trees_r),
                roofline: metrics::evaluate(&pick(&roofline)),
                ensemble: metrics::evaluate(&ensemble_r),
                random: metrics::random_baseline(&model_r, 20, o.seed),
            },
            picks,
        });
    }
    let average = Scores {
        model: mean(networks.iter().map(|n| n.scores.model)),
        primitives: prim_ranked
            .as_ref()
            .map(|_| mean(networks.iter().filter_map(|n| n.scores.primitives))),
        ridge: mean(networks.iter().map(|n| n.scores.ridge)),
        gbt: mean(networks.iter().map(|n| n.scores.gbt)),
        roofline: mean(networks.iter().map(|n| n.scores.roofline)),
        ensemble: mean(networks.iter().map(|n| n.scores.ensemble)),
        random: mean(networks.iter().map(|n| n.scores.random)),
    };
    Ok(HeldOutReport {
        train_records: train_set.samples.len(),
        train_tasks: train_ids.len(),
        test_records: test_set.samples.len(),
        test_tasks: test_ids.len(),
        networks,
        average,
        best_epoch,
        ablation_best_epoch,
        ensemble_mix: mix,
        trees_refit: o.refit_trees,
    })
}

/// Each task's favourite by the three rankers (one network's tasks, in the same order in each),
/// the ensemble's costliest first.
fn task_picks(
    workloads: impl Iterator<Item = String>,
    ensemble: &[Ranked],
    model: &[Ranked],
    trees: &[Ranked],
) -> Vec<HeldOutPicks> {
    let shares = metrics::top1_loss_shares(ensemble);
    let chosen = |r: &Ranked| metrics::best_and_chosen(r, 1).map(|(_, c)| c);
    let mut picks: Vec<HeldOutPicks> = workloads
        .zip(ensemble.iter().zip(model).zip(trees))
        .zip(shares)
        .filter_map(|((workload, ((e, m), t)), loss_share)| {
            let (best_s, ensemble_s) = metrics::best_and_chosen(e, 1)?;
            Some(HeldOutPicks {
                workload,
                weight: e.weight,
                records: e.latency.len(),
                best_s,
                ensemble_s,
                model_s: chosen(m)?,
                trees_s: chosen(t)?,
                loss_share,
            })
        })
        .collect();
    picks.sort_by(|a, b| b.loss_share.total_cmp(&a.loss_share));
    picks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bynetwork::tests::ranked;

    #[test]
    fn picks_put_the_task_that_costs_the_ensemble_most_first() {
        // Task a: the ensemble picks 2 ms where 1 ms was there (weight 1: 1 ms lost).
        // Task b: it picks 3 ms where 1 ms was there, twice in the network (4 ms lost).
        // Task c: it picks the best.
        let ensemble = [
            ranked(1.0, &[1.0, 0.0], &[2e-3, 1e-3]),
            ranked(2.0, &[1.0, 0.0], &[3e-3, 1e-3]),
            ranked(1.0, &[0.0, 1.0], &[2e-3, 1e-3]),
        ];
        let flipped: Vec<Ranked> = ensemble
            .iter()
            .map(|r| ranked(r.weight, &[r.predicted[1], r.predicted[0]], &r.latency))
            .collect();
        let picks = task_picks(
            ["a", "b", "c"].map(String::from).into_iter(),
            &ensemble,
            &flipped,
            &ensemble,
        );
        let order: Vec<&str> = picks.iter().map(|p| p.workload.as_str()).collect();
        assert_eq!(order[..2], ["b", "a"]);
        assert!((picks[0].loss_share - 0.8).abs() < 1e-12, "{:?}", picks[0]);
        assert!((picks[1].loss_share - 0.2).abs() < 1e-12, "{:?}", picks[1]);
        assert_eq!(picks[2].loss_share, 0.0);
        // The network alone (flipped) picks each task's other candidate.
        assert_eq!((picks[0].ensemble_s, picks[0].model_s), (3e-3, 1e-3));
        assert_eq!(picks[0].trees_s, picks[0].ensemble_s);
        assert_eq!((picks[2].ensemble_s, picks[2].model_s), (1e-3, 2e-3));
    }
}
