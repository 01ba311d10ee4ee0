//! `refit-trees`: fits a trained model's ensemble trees again, keeping its network.
//!
//! The trees beside a model ([`tessel_model::Companions`]) cost seconds to fit, the network
//! minutes and a retrain moves its figures by more than most changes do. When the trees'
//! recipe improves, or the records' labels are corrected, the trees can be fitted again on
//! the records `pretrain` selected (the same networks, labels and training split) without
//! touching the network. The validation tasks are the model's own (`pretrain` lists them in
//! its provenance), so neither its network nor its old trees trained on them. The new trees
//! replace the old only when the ensemble ranks those tasks better with them, by
//! [`REPLACE_MIN_GAIN_Z`] standard errors of the per-task gain in the criterion early
//! stopping uses, unless `--force`.

use std::path::PathBuf;

use serde::Serialize;
use tessel_features::WIDTH;
use tessel_model::ensemble::MixChoice;
use tessel_model::gbt::TreeRecipe;
use tessel_model::metrics::PairedGain;
use tessel_model::train::{rank, rank_ensemble, split_tasks_by_key, split_tasks_named};
use tessel_model::{Companions, Metrics, Model, metrics};

use crate::data::{Label, load_labeled, network_filter_except};
use crate::error::{Context, Result, bail};
use crate::learn::{read_task_keys, validation_tasks_of};
use crate::progress::Progress;

/// How far new trees must lead the old, in standard errors of their per-task gain on the
/// validation tasks, to replace them (the bar a transfer clears to leave a model as it came,
/// [`crate::TRANSFER_MIN_GAIN_Z`]): fits on nearly the same records differ by a few
/// hundredths on 42 tasks, and a lead within that is luck.
pub const REPLACE_MIN_GAIN_Z: f64 = crate::TRANSFER_MIN_GAIN_Z;

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
    /// Share of tasks held out for validation, for a model that does not list its own
    /// validation tasks (models trained before 2026-12-05's sixteenth session): `pretrain`'s.
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
    /// How the ensemble's trees are grown:
    /// `rounds=,depth=,rate=,subsample=,colsample=,bags=,objective=,ndcg_at=` (keys left out keep the
    /// default; `bags` > 1 averages boosters grown on their own samples, which needs
    /// `subsample` < 1 to differ; `objective=lambdarank` grows LambdaMART trees that learn
    /// the order within each task, `regression` fits log relative throughput).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = TreeRecipe::ensemble()))]
    pub trees: TreeRecipe,
    /// The validation tasks, one task key per line; default: those the model lists (its
    /// `pretrain` held them out), else a share chosen by the tasks' keys.
    #[cfg_attr(feature = "clap", arg(long))]
    pub validation_tasks: Option<PathBuf>,
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
    /// Where those tasks came from: `the model's own`, a file, or `a split by key`. Only
    /// the model's own (or a file listing them) are tasks its network and old trees never
    /// trained on; on others the old trees' figures may be flattered.
    pub validation_from: String,
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
    /// The new trees' gain over the old on the validation tasks' criteria, task by task
    /// (`None`: the model had no trees).
    pub gain: Option<PairedGain>,
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
    let (train_ids, val_ids, validation_from) = match (
        &o.validation_tasks,
        validation_tasks_of(&model),
    ) {
        (Some(path), _) => {
            let (t, v) = split_tasks_named(&data, &read_task_keys(path)?)
                .with_context(|| format!("--validation-tasks {}", path.display()))?;
            (t, v, path.display().to_string())
        }
        (None, Some(keys)) => {
            let (t, v) = split_tasks_named(&data, &keys).with_context(|| {
                format!(
                    "the validation tasks {} lists (pass --validation-tasks to choose others)",
                    o.model.display()
                )
            })?;
            (t, v, "the model's own".to_string())
        }
        (None, None) => {
            progress.note(&format!(
                "note: {} does not list its validation tasks; judging on a split by key, where its network and old trees may have trained on some",
                o.model.display()
            ));
            let (t, v) = split_tasks_by_key(&data, o.val_fraction, o.seed);
            (t, v, "a split by key".to_string())
        }
    };
    if train_ids.is_empty() || val_ids.is_empty() {
        bail!(
            "{} tasks cannot be split into training and validation tasks",
            data.tasks.len()
        );
    }
    let (train, val) = (data.subset(&train_ids), data.subset(&val_ids));
    let network = metrics::evaluate(&rank(&mut model, &val));
    let old_ranked = model
        .companions
        .is_some()
        .then(|| rank_ensemble(&mut model, &val));
    let before = old_ranked.as_deref().map(metrics::evaluate_with_criterion);
    progress.note(&format!(
        "fitting the trees on {} records of {} tasks",
        train.samples.len(),
        train.tasks.len()
    ));
    let mix = model.fit_companions_judged(&train, &val, o.seed, &o.trees)?;
    let new_ranked = rank_ensemble(&mut model, &val);
    let (after, after_criterion) = metrics::evaluate_with_criterion(&new_ranked);
    let gain = old_ranked.as_deref().map(|old| {
        metrics::paired_gain(
            &metrics::task_criteria(&new_ranked),
            &metrics::task_criteria(old),
        )
    });
    let replaced = o.force || gain.is_none_or(|g| g.clears(REPLACE_MIN_GAIN_Z));
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
        validation_from,
        fit_records: train.samples.len(),
        network,
        before: before.map(|(m, _)| m),
        before_criterion: before.map(|(_, c)| c),
        after,
        after_criterion,
        gain,
        replaced,
        mix,
        ensemble: Companions::path(&o.model),
    })
}
