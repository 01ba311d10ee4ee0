//! `refit-trees`: fits a trained model's ensemble trees again, keeping its network.
//!
//! The trees beside a model ([`tessel_model::Companions`]) cost seconds to fit, the network
//! minutes and a retrain moves its figures by more than most changes do. When the trees'
//! recipe improves, or the records' labels are corrected, the trees can be fitted again on
//! the records `pretrain` selected (the same networks, labels and training split) without
//! touching the network. The new trees replace the old only when the ensemble ranks the
//! validation tasks at least as well with them (the criterion early stopping uses), unless
//! `--force`.

use std::path::PathBuf;

use serde::Serialize;
use tessel_features::WIDTH;
use tessel_model::ensemble::MixChoice;
use tessel_model::gbt::TreeRecipe;
use tessel_model::train::{rank, rank_ensemble, split_tasks};
use tessel_model::{Companions, Metrics, Model, metrics};

use crate::data::{Label, load_labeled, network_filter_except};
use crate::error::{Result, bail};
use crate::progress::Progress;

/// How to fit a model's trees again.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct RefitOptions {
    /// The trained model (`NAME` of `NAME.json`); its ensemble file is the one replaced.
    #[cfg_attr(feature = "clap", arg(long))]
    pub model: PathBuf,
    /// Dataset files: the records the model was trained on, as `pretrain` was given them.
    #[cfg_attr(feature = "clap", arg(long, num_args = 1.., required = true))]
    pub data: Vec<PathBuf>,
    /// Only the tasks of these networks, comma separated (as `pretrain`).
    #[cfg_attr(feature = "clap", arg(long = "network", value_delimiter = ','))]
    pub networks: Vec<String>,
    /// Leave out every task of these networks (as `pretrain`).
    #[cfg_attr(feature = "clap", arg(long = "exclude-network", value_delimiter = ','))]
    pub exclude_networks: Vec<String>,
    /// Share of tasks held out for validation: `pretrain`'s, so the trees see only the
    /// network's training tasks.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0.2))]
    pub val_fraction: f64,
    /// `pretrain`'s seed (the split and the trees).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1))]
    pub seed: u64,
    /// Label records by their fastest run (as `pretrain --fastest-run`).
    #[cfg_attr(feature = "clap", arg(long))]
    pub fastest_run: bool,
    /// Replace the trees even when the validation says the old ones rank better.
    #[cfg_attr(feature = "clap", arg(long))]
    pub force: bool,
    /// How the ensemble's trees are grown: `rounds=,depth=,rate=,subsample=,colsample=,bags=`
    /// (keys left out keep the default; `bags` > 1 averages boosters grown on their own
    /// samples, which needs `subsample` < 1 to differ).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = TreeRecipe::default()))]
    pub trees: TreeRecipe,
}

/// What `refit-trees` did.
#[derive(Clone, Debug, Serialize)]
pub struct RefitReport {
    /// Records loaded.
    pub records: usize,
    /// Tasks loaded.
    pub tasks: usize,
    /// Tasks the trees are judged on (never fitted on).
    pub validation_tasks: usize,
    /// Records the new trees were fitted on.
    pub fit_records: usize,
    /// The network alone on the validation tasks.
    pub network: Metrics,
    /// The ensemble with the model's old trees (`None`: it had none).
    pub before: Option<Metrics>,
    /// Its selection criterion (`metrics::selection_criterion`).
    pub before_criterion: Option<f64>,
    /// The ensemble with the new trees.
    pub after: Metrics,
    /// Its selection criterion.
    pub after_criterion: f64,
    /// The new trees' mix with the network, chosen on the validation tasks (so their figure
    /// is the best of the shares tried there, a little optimistic beside the old trees').
    pub mix: MixChoice,
    /// Whether the new trees were written.
    pub replaced: bool,
    /// The ensemble file.
    pub ensemble: PathBuf,
}

/// Fits the trees of the model at `o.model` again and replaces its ensemble file when the
/// validation tasks say so (see the module's doc).
pub fn refit_trees(o: &RefitOptions, progress: &mut dyn Progress) -> Result<RefitReport> {
    if !(o.val_fraction > 0.0 && o.val_fraction < 1.0) {
        bail!(
            "val-fraction {} is not a share in (0, 1): the new trees are judged on validation tasks",
            o.val_fraction
        );
    }
    let mut model = Model::load(&o.model)?;
    if model.info.config.width != WIDTH {
        bail!(
            "{} takes tokens of {} columns, not the allocation features' {WIDTH}",
            o.model.display(),
            model.info.config.width
        );
    }
    let only = network_filter_except(&o.networks, &o.exclude_networks)?;
    let data = load_labeled(
        &o.data,
        only.as_ref(),
        Label::fastest_if(o.fastest_run),
        progress,
    )?;
    let (train_ids, val_ids) = split_tasks(data.tasks.len(), o.val_fraction, o.seed);
    if train_ids.is_empty() || val_ids.is_empty() {
        bail!(
            "{} tasks cannot be split into training and validation tasks",
            data.tasks.len()
        );
    }
    let (train, val) = (data.subset(&train_ids), data.subset(&val_ids));
    let judged = |model: &mut Model| metrics::evaluate_with_criterion(&rank_ensemble(model, &val));
    let network = metrics::evaluate(&rank(&mut model, &val));
    let old = model.companions.clone();
    let before = old.is_some().then(|| judged(&mut model));
    progress.note(&format!(
        "fitting the trees on {} records of {} tasks",
        train.samples.len(),
        train.tasks.len()
    ));
    let mix = model.fit_companions_judged(&train, &val, o.seed, &o.trees)?;
    let (after, after_criterion) = judged(&mut model);
    let replaced = o.force || before.is_none_or(|(_, c)| after_criterion >= c);
    if replaced {
        if let Some(p) = model.info.provenance.as_object_mut() {
            p.insert(
                "trees_refit".into(),
                serde_json::json!({
                    "command": std::env::args().collect::<Vec<_>>().join(" "),
                    "data": o.data.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
                    "records": train.samples.len(),
                    "tasks": train.tasks.len(),
                }),
            );
        }
        model.save(&o.model)?;
    }
    Ok(RefitReport {
        records: data.samples.len(),
        tasks: data.tasks.len(),
        validation_tasks: val_ids.len(),
        fit_records: train.samples.len(),
        network,
        before: before.map(|(m, _)| m),
        before_criterion: before.map(|(_, c)| c),
        after,
        after_criterion,
        replaced,
        mix,
        ensemble: Companions::path(&o.model),
    })
}
