//! The model on measured records: `pretrain`, `transfer` (fine-tune on K records, beside
//! training from scratch) and `eval` (ranking quality beside ridge and random).

use std::path::{Path, PathBuf};

use serde::Serialize;
use tessel_features::WIDTH;
use tessel_ir::NETWORKS;
use tessel_model::ensemble::{MixChoice, check_correction_recipe};
use tessel_model::gbt::TreeRecipe;
use tessel_model::metrics::PairedGain;
use tessel_model::train::{
    Comparison, Trainable, compare_with_trees, gbt_rank, rank, rank_ensemble, ridge_rank,
    roofline_rank, sample_tokens, split_tasks, split_tasks_by_key, split_tasks_named, tasks_named,
    transfer_options,
};
use tessel_model::{
    Companions, Dataset, Loss, Metrics, Model, ModelConfig, Ranked, Sample, TrainOptions,
    TrainReport, metrics, train,
};
use tessel_search::rng::Rng;

use crate::bynetwork::{self, ByNetwork};
use crate::data::{
    Label, load, load_labeled, load_labeled_instructions, network_filter, network_filter_except,
};
use crate::error::{Context, Result, bail};
use crate::progress::Progress;
use crate::tune::fixtures_dir;

/// How to pretrain.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct PretrainOptions {
    /// Dataset files (records; `.jsonl` or `.jsonl.gz`).
    #[cfg_attr(feature = "clap", arg(long, num_args = 1.., required = true))]
    pub data: Vec<PathBuf>,
    /// Only the tasks of these networks, comma separated.
    #[cfg_attr(feature = "clap", arg(long = "network", value_delimiter = ','))]
    pub networks: Vec<String>,
    /// Leave out every task of these networks, even where a `--network` shares it (to train
    /// on everything but the held-out protocol's test networks).
    #[cfg_attr(feature = "clap", arg(long = "exclude-network", value_delimiter = ','))]
    pub exclude_networks: Vec<String>,
    /// Model path (writes NAME.safetensors and NAME.json).
    #[cfg_attr(feature = "clap", arg(long))]
    pub out: PathBuf,
    /// Training epochs.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 30))]
    pub epochs: usize,
    /// lambdarank, pairwise or mse.
    #[cfg_attr(feature = "clap", arg(long, default_value = "lambdarank"))]
    pub loss: Loss,
    /// Peak learning rate.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 3e-3))]
    pub lr: f64,
    /// Share of tasks held out for validation and early stopping.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0.2))]
    pub val_fraction: f64,
    /// Seed of the initialisation, the split and the batches.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1))]
    pub seed: u64,
    /// The network's shape.
    #[cfg_attr(feature = "clap", command(flatten))]
    pub architecture: Architecture,
    /// Overwrite the model files at `out` if they exist.
    #[cfg_attr(feature = "clap", arg(long))]
    pub force: bool,
    /// Learn each record's fastest run instead of its median (the machine's noise only ever
    /// adds time; `eval --fastest-run` ranks by the same).
    #[cfg_attr(feature = "clap", arg(long))]
    pub fastest_run: bool,
    /// Save the network alone, without the gradient-boosted trees that
    /// are otherwise fitted on the same training tasks and added to its score
    /// (`NAME.ensemble.json.gz`; `tune` and `eval` use them).
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_ensemble: bool,
    /// How the ensemble's trees are grown:
    /// `rounds=,depth=,rate=,subsample=,colsample=,bags=,objective=,ndcg_at=` (keys left out keep the
    /// default; `bags` > 1 averages boosters grown on their own samples, which needs
    /// `subsample` < 1 to differ; `objective=lambdarank` grows LambdaMART trees that learn
    /// the order within each task, `regression` fits log relative throughput).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = TreeRecipe::ensemble()))]
    pub trees: TreeRecipe,
    /// The validation tasks, one task key per line (e.g. those of the model this one may
    /// replace, so both are judged on tasks neither trained on); default: a share
    /// (`--val-fraction`) chosen by the tasks' keys. The model saves its own.
    #[cfg_attr(feature = "clap", arg(long))]
    pub validation_tasks: Option<PathBuf>,
}

/// The attention network's shape, for the commands that train a new model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct Architecture {
    /// Width of the attention layers.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 48))]
    pub d_model: usize,
    /// Attention heads.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 3))]
    pub heads: usize,
    /// Attention layers.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 2))]
    pub layers: usize,
    /// Start from the analytic roofline estimate: the network learns the correction to it.
    #[cfg_attr(feature = "clap", arg(long))]
    pub prior: bool,
}

impl Default for Architecture {
    fn default() -> Self {
        Architecture {
            d_model: 48,
            heads: 3,
            layers: 2,
            prior: false,
        }
    }
}

impl Architecture {
    /// The model configuration of this shape for tokens of `width` columns.
    pub fn config(&self, width: usize) -> ModelConfig {
        let mut config = ModelConfig::new(width);
        config.d_model = self.d_model;
        config.heads = self.heads;
        config.layers = self.layers;
        config.d_ff = 2 * self.d_model;
        config.prior = self.prior;
        config
    }
}

impl PretrainOptions {
    /// Pretrain on `data`, saving to `out`, with the defaults.
    pub fn new(data: Vec<PathBuf>, out: PathBuf) -> Self {
        PretrainOptions {
            data,
            networks: Vec::new(),
            exclude_networks: Vec::new(),
            out,
            epochs: 30,
            loss: Loss::LambdaRank,
            lr: 3e-3,
            val_fraction: 0.2,
            seed: 1,
            architecture: Architecture::default(),
            force: false,
            fastest_run: false,
            no_ensemble: false,
            trees: TreeRecipe::ensemble(),
            validation_tasks: None,
        }
    }
}

/// What `pretrain` did.
#[derive(Clone, Debug, Serialize)]
pub struct PretrainReport {
    /// Records trained and validated on.
    pub records: usize,
    /// Tasks (workload x target x machine).
    pub tasks: usize,
    /// The model's parameters.
    pub parameters: usize,
    /// Every epoch, and the best.
    pub training: TrainReport,
    /// Held-out validation tasks: the model beside ridge and random.
    pub validation: Option<Comparison>,
    /// Validation tasks.
    pub validation_tasks: usize,
    /// The ensemble that ships (the network and the trees fitted on the training
    /// tasks) on the same validation tasks; `None` with `--no-ensemble`. Its mix was chosen
    /// on these tasks, so the figure is the best of the shares tried there.
    pub validation_ensemble: Option<Metrics>,
    /// The files written.
    pub saved: (PathBuf, PathBuf),
    /// The ensemble's file, when one was fitted.
    pub saved_ensemble: Option<PathBuf>,
    /// How the ensemble weighs the network and the trees, chosen on the validation tasks
    /// (`None` without them or without an ensemble; the parts then count alike).
    pub ensemble_mix: Option<MixChoice>,
}

/// Trains a model on measured records and saves it.
pub fn pretrain(o: &PretrainOptions, progress: &mut dyn Progress) -> Result<PretrainReport> {
    check_training(o.epochs, o.lr)?;
    if !(0.0..1.0).contains(&o.val_fraction) {
        bail!(
            "val-fraction {} is not a share in [0, 1): some tasks must be left to train on",
            o.val_fraction
        );
    }
    refuse_overwrite(&o.out, o.force)?;
    let only = network_filter_except(&o.networks, &o.exclude_networks)?;
    let label = Label::fastest_if(o.fastest_run);
    let (data, instructions) = load_labeled_instructions(&o.data, only.as_ref(), label, progress)?;
    let mut model = Model::new(o.architecture.config(WIDTH), o.seed)?;
    let (train_ids, val_ids) = match &o.validation_tasks {
        Some(path) => split_tasks_named(&data, &read_task_keys(path)?)
            .with_context(|| format!("--validation-tasks {}", path.display()))?,
        None => split_tasks_by_key(&data, o.val_fraction, o.seed),
    };
    let opts = TrainOptions {
        loss: o.loss,
        epochs: o.epochs,
        lr: o.lr,
        val_fraction: o.val_fraction,
        val_tasks: Some(val_ids.clone()),
        seed: o.seed,
        ..TrainOptions::default()
    };
    progress.note(&format!(
        "{} records of {} tasks; model of {} parameters",
        data.samples.len(),
        data.tasks.len(),
        model.params.count()
    ));
    progress.start("epochs", o.epochs as u64);
    let training = train(&mut model, &data, &opts, &mut |e| {
        let val = e.val.map_or(String::new(), |m| {
            format!(
                "val top-1 {:.3} top-5 {:.3} pairwise {:.3}",
                m.top1, m.top5, m.pairwise_accuracy
            )
        });
        progress.note(&format!(
            "epoch {:>3}: loss {:.4}, lr {:.2e}, {:.0} programs/s  {val}",
            e.epoch, e.train_loss, e.lr, e.programs_per_s
        ));
        progress.update(e.epoch as u64, "");
    })?;
    progress.finish();
    let mut ensemble_mix = None;
    if !o.no_ensemble {
        // Fitted on the network's training tasks only, so validation stays unseen; the mix
        // of the two parts is chosen there.
        progress.note("fitting the ensemble's gradient-boosted trees");
        let (fit, val) = (data.subset(&train_ids), data.subset(&val_ids));
        if val_ids.is_empty() {
            model.fit_companions(&fit, o.seed)?;
        } else {
            ensemble_mix = Some(model.fit_companions_judged(&fit, &val, o.seed, &o.trees)?);
        }
    }
    // The validation's trees column is the ensemble's trees where they were fitted.
    let trees = model.companions.clone();
    let validation = (!val_ids.is_empty()).then(|| {
        compare_with_trees(
            &mut model,
            &data.subset(&train_ids),
            &data.subset(&val_ids),
            o.seed,
            trees.as_deref(),
        )
    });
    let validation_ensemble = (trees.is_some() && !val_ids.is_empty())
        .then(|| metrics::evaluate(&rank_ensemble(&mut model, &data.subset(&val_ids))));
    model.info.provenance = serde_json::json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "data": o.data.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "records": data.samples.len(),
        "tasks": data.tasks.len(),
        // What `tune` checks before ranking candidates of other instructions with it.
        "instructions": instructions,
        "options": opts,
        "best_epoch": training.best_epoch,
        "leading_epoch": training.leading_epoch,
        "epochs": training.epochs,
        // What `refit-trees` and a later `pretrain --validation-tasks` judge on: tasks this
        // model never trained on.
        VALIDATION_TASKS: task_keys(&data, &val_ids),
    });
    model.save(&o.out)?;
    Ok(PretrainReport {
        records: data.samples.len(),
        tasks: data.tasks.len(),
        parameters: model.params.count(),
        training,
        validation,
        validation_tasks: val_ids.len(),
        validation_ensemble,
        saved: Model::paths(&o.out),
        saved_ensemble: model.companions.is_some().then(|| Companions::path(&o.out)),
        ensemble_mix,
    })
}

/// The provenance field that lists a model's validation tasks by key.
pub const VALIDATION_TASKS: &str = "validation_tasks";

/// The keys of tasks `ids` of `data`.
fn task_keys(data: &Dataset, ids: &[usize]) -> Vec<String> {
    ids.iter().map(|&i| data.tasks[i].0.clone()).collect()
}

/// The validation tasks a saved model lists in its provenance (`None`: models trained
/// before they were recorded).
pub fn validation_tasks_of(model: &Model) -> Option<Vec<String>> {
    let list = model.info.provenance.get(VALIDATION_TASKS)?.as_array()?;
    list.iter()
        .map(|k| k.as_str().map(str::to_string))
        .collect()
}

/// Task keys from a file, one per line (blank lines skipped); an empty file or a repeated
/// key is an error naming the file.
pub fn read_task_keys(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading task keys from {}", path.display()))?;
    let keys: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    if keys.is_empty() {
        bail!("{} lists no task keys", path.display());
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(k) = keys.iter().find(|k| !seen.insert(k.as_str())) {
        bail!("{} lists task `{k}` twice", path.display());
    }
    Ok(keys)
}

/// How to fine-tune.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct TransferOptions {
    /// The pretrained model.
    #[cfg_attr(feature = "clap", arg(long))]
    pub model: PathBuf,
    /// Dataset files of the new target.
    #[cfg_attr(feature = "clap", arg(long, num_args = 1.., required = true))]
    pub data: Vec<PathBuf>,
    /// Only the tasks of these networks, comma separated.
    #[cfg_attr(feature = "clap", arg(long = "network", value_delimiter = ','))]
    pub networks: Vec<String>,
    /// Records to fine-tune on.
    #[cfg_attr(feature = "clap", arg(long))]
    pub shots: usize,
    /// The shots are drawn task by task, this many records of each (the tasks in a seeded
    /// order, the last one taking what is left); 0 draws them at random over every task of
    /// the fine-tuning half. A ranking learns from pairs within a task: 128 records as 16
    /// tasks of 8 hold 448 pairs, spread over 37 tasks about 120.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DEFAULT_SHOTS_PER_TASK))]
    pub shots_per_task: usize,
    /// Where the fine-tuned model goes.
    #[cfg_attr(feature = "clap", arg(long))]
    pub out: PathBuf,
    /// `all` (every weight, a tenth of the rate) or `head` (backbone frozen).
    #[cfg_attr(feature = "clap", arg(long, default_value = "all"))]
    pub mode: String,
    /// Fine-tuning epochs.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 10))]
    pub epochs: usize,
    /// Seed of the split, the shots and the batches.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1))]
    pub seed: u64,
    /// How the correction of the carried ensemble is grown on the shots (the candidate
    /// `pretrained+trees+correction`): a `--trees` recipe of `objective=lambdarank`
    /// (keys left out keep LambdaMART's defaults, not this default's).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = tessel_model::ensemble::CORRECTION_RECIPE))]
    pub correction_trees: TreeRecipe,
    /// Overwrite the model files at `out` if they exist.
    #[cfg_attr(feature = "clap", arg(long))]
    pub force: bool,
}

/// What `transfer` measured on the tasks it did not fine-tune on.
#[derive(Clone, Debug, Serialize)]
pub struct TransferReport {
    /// Records fine-tuned on.
    pub shots: usize,
    /// How they were drawn: this many of each task (0: at random over the half).
    pub shots_per_task: usize,
    /// `all` or `head`.
    pub mode: String,
    /// Test records and tasks.
    pub test_records: usize,
    /// Test tasks.
    pub test_tasks: usize,
    /// The pretrained model.
    pub before: Comparison,
    /// The pretrained model with its own trees (fitted on the platform it was pretrained
    /// on), ranking as an ensemble does: what `tune` would use without a transfer. None
    /// when the pretrained model has no trees.
    pub before_ensemble: Option<Metrics>,
    /// The model saved: the one of `chosen`.
    pub after: Comparison,
    /// The pretrained model fine-tuned on all the shots (saved only when chosen).
    pub fine_tuned: Comparison,
    /// The fine-tuned model with trees fitted on the shots beside it, ranking as
    /// an ensemble does (`Model::predict_ranking`). None when the trees could not be fitted
    /// on the shots.
    pub fine_tuned_ensemble: Option<Metrics>,
    /// The fine-tuned network with the pretrained model's trees. None without them.
    pub fine_tuned_pretrained_trees: Option<Metrics>,
    /// The pretrained network with its own trees and a correction learned on the shots
    /// (`Companions::corrected`). None without trees or when nothing could be fitted.
    pub pretrained_corrected: Option<Metrics>,
    /// How that correction was grown (`--correction-trees`).
    pub correction_trees: TreeRecipe,
    /// A model of the same shape trained from scratch on the same records.
    pub scratch: Comparison,
    /// What was saved: `pretrained+trees` (the pretrained model with its own trees: as it
    /// came, kept when nothing did better on the shots' own validation tasks), `pretrained`
    /// (its network alone; as it came when it had no trees), `pretrained+trees+correction`
    /// (with a correction learned on the shots: kept where it leads like any other, or
    /// where nothing does and it is ahead at all), `fine-tuned`,
    /// `fine-tuned+pretrained-trees`, `fine-tuned+ensemble` (saved with the trees fitted on
    /// the shots) or `scratch`.
    pub chosen: String,
    /// The choice's evidence: the candidates on the shots' own tasks, each ranked by
    /// candidates trained on the other half of them (two folds). None when the shots span
    /// fewer than two tasks with two records each: nothing to validate on, so the
    /// pretrained model is kept.
    pub validation: Option<TransferValidation>,
    /// The files written.
    pub saved: (PathBuf, PathBuf),
    /// The companion file written, where the ensemble was kept.
    pub saved_ensemble: Option<PathBuf>,
    /// Each test task's top-1 pick by the kept model, as `tune` ranks with it, those that
    /// lose the top-1 score most first: the score weighs tasks by latency, so a few heavy
    /// test tasks decide whether a transfer helped.
    pub task_picks: Vec<TaskPick>,
    /// The same for the model as it came (its network with its own trees where it has
    /// them): K=0.
    pub before_task_picks: Vec<TaskPick>,
    /// Every candidate's figures on the test tasks by network, as `held-out` scores them:
    /// each known network's test tasks weighted by how often each occurs in it, then the
    /// plain mean over those networks. First `kept` (the saved model), then the candidates
    /// by their names in `validation`, `pretrained+trees` being the model as it came (K=0),
    /// then `roofline` and `random`. Empty where no test task belongs to a known network.
    pub by_network: Vec<ByNetwork>,
}

/// The candidates of a transfer on the shots' own tasks, by two-fold cross-validation.
#[derive(Clone, Debug, Serialize)]
pub struct TransferValidation {
    /// Records the candidates of each fold were trained on (the mean of the two folds).
    pub fit_records: usize,
    /// Records and tasks ranked, over both folds: every shot task of two records or more.
    pub validation_records: usize,
    pub validation_tasks: usize,
    /// Pairs of records of one task among them: the evidence. Under
    /// [`MIN_VALIDATION_PAIRS`] the pretrained model is kept whatever the scores say.
    pub validation_pairs: usize,
    /// The known networks the data holds whole and the validation tasks fall in: what each
    /// candidate's `by_network` averages over (empty: no such network).
    pub networks: Vec<String>,
    pub pretrained: TransferScore,
    /// The pretrained network with its own trees (None without them).
    pub pretrained_trees: Option<TransferScore>,
    /// The pretrained network with its own trees and a correction learned on the shots
    /// (None without trees).
    pub pretrained_corrected: Option<TransferScore>,
    pub fine_tuned: TransferScore,
    /// The fine-tuned network with the pretrained model's trees (None without them).
    pub fine_tuned_pretrained_trees: Option<TransferScore>,
    pub fine_tuned_ensemble: Option<TransferScore>,
    pub scratch: TransferScore,
}

/// One candidate on the shots' validation tasks: what the choice compares (`criterion`, and
/// task by task `per_task`) and the usual figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TransferScore {
    /// `metrics::selection_criterion`, what early stopping compares too: the mean of the
    /// per-task top-1 ratio, the per-task top-5 ratio and the pairwise accuracy.
    pub criterion: f64,
    pub metrics: Metrics,
    /// Each validation task's own criterion (`metrics::task_criteria`), in the same task
    /// order for every candidate.
    #[serde(skip)]
    pub per_task: Vec<f64>,
    /// Its gain over the model as it came (the pretrained network with its own trees where
    /// it has them), task by task; None for that model itself.
    pub gain: Option<PairedGain>,
    /// Its figures on the validation tasks by network, as the test is scored (`held-out`'s
    /// protocol: each network's tasks weighted by how often each occurs in it, then the mean
    /// over the networks); None where the validation tasks fall in no known network.
    pub by_network: Option<Metrics>,
    /// Each of those networks' top-1, in `TransferValidation::networks`' order.
    #[serde(skip)]
    pub network_top1: Vec<f64>,
    /// Its top-1 gain by network over the model as it came, network by network; None for
    /// that model itself and where there are no networks.
    pub network_gain: Option<PairedGain>,
}

impl TransferScore {
    /// The score of `ranked` (one ranking per validation task, in `groups`' task order).
    fn of(ranked: &[Ranked], groups: &[bynetwork::NetworkGroup]) -> TransferScore {
        let (metrics, criterion) = metrics::evaluate_with_criterion(ranked);
        let by_network =
            (!groups.is_empty()).then(|| bynetwork::by_network("", ranked, groups, None));
        TransferScore {
            criterion,
            metrics,
            per_task: metrics::task_criteria(ranked),
            gain: None,
            network_top1: by_network
                .as_ref()
                .map(|b| b.networks.iter().map(|(_, m)| m.top1).collect())
                .unwrap_or_default(),
            by_network: by_network.map(|b| b.mean),
            network_gain: None,
        }
    }

    /// Whether this candidate's top-1 by network, the figure the test reports, is not behind
    /// the model as it came by [`TRANSFER_MAX_NETWORK_LOSS_Z`] standard errors or more
    /// (network by network, `network_gain`); true where there are no networks to say.
    fn not_behind_by_network(&self) -> bool {
        self.network_gain
            .is_none_or(|g| g.z() > -TRANSFER_MAX_NETWORK_LOSS_Z)
    }
}

impl TransferValidation {
    /// Every candidate by name, in the order ties are broken: what was there first.
    pub fn candidates(&self) -> [(&'static str, Option<&TransferScore>); 7] {
        [
            ("pretrained", Some(&self.pretrained)),
            ("pretrained+trees", self.pretrained_trees.as_ref()),
            (
                "pretrained+trees+correction",
                self.pretrained_corrected.as_ref(),
            ),
            ("fine-tuned", Some(&self.fine_tuned)),
            (
                "fine-tuned+pretrained-trees",
                self.fine_tuned_pretrained_trees.as_ref(),
            ),
            ("fine-tuned+ensemble", self.fine_tuned_ensemble.as_ref()),
            ("scratch", Some(&self.scratch)),
        ]
    }

    /// The model as it came: the pretrained network with its own trees where it has them.
    fn as_it_came(&self, has_trees: bool) -> (&'static str, &TransferScore) {
        match (has_trees, &self.pretrained_trees) {
            (true, Some(t)) => ("pretrained+trees", t),
            _ => ("pretrained", &self.pretrained),
        }
    }

    /// Fills each candidate's `gain` and `network_gain` over the model as it came.
    fn with_gains(mut self, has_trees: bool) -> TransferValidation {
        let (name, incumbent) = self.as_it_came(has_trees);
        let (incumbent, incumbent_networks) =
            (incumbent.per_task.clone(), incumbent.network_top1.clone());
        let fill = |s: &mut TransferScore, own: bool| {
            s.gain = (!own).then(|| metrics::paired_gain(&s.per_task, &incumbent));
            s.network_gain = (!own && !incumbent_networks.is_empty())
                .then(|| metrics::paired_gain(&s.network_top1, &incumbent_networks));
        };
        fill(&mut self.pretrained, name == "pretrained");
        fill(&mut self.fine_tuned, false);
        fill(&mut self.scratch, false);
        for (s, own) in [
            (&mut self.pretrained_trees, name == "pretrained+trees"),
            (&mut self.pretrained_corrected, false),
            (&mut self.fine_tuned_pretrained_trees, false),
            (&mut self.fine_tuned_ensemble, false),
        ] {
            if let Some(s) = s.as_mut() {
                fill(s, own);
            }
        }
        self
    }
}

/// Fine-tunes on K records of half the tasks; reports on the other half before and after,
/// beside a model trained from scratch on the same K records.
pub fn transfer(o: &TransferOptions, progress: &mut dyn Progress) -> Result<TransferReport> {
    let trainable = match o.mode.as_str() {
        "all" => Trainable::All,
        "head" => Trainable::HeadAndEmbedding,
        other => bail!("mode `{other}`: expected all or head"),
    };
    check_training(o.epochs.max(1), 1e-3)?;
    // A correction that cannot be fitted is left out without a word (the shots may hold too
    // little); a recipe that can never fit one is the user's to hear about.
    check_correction_recipe(&o.correction_trees)
        .map_err(|e| crate::error::Error::invalid(format!("--correction-trees: {e}")))?;
    refuse_overwrite(&o.out, o.force)?;
    let mut model = load_model(&o.model)?;
    // The pretrained model's trees were fitted on the other platform's records: candidates
    // with them beside a network stand apart from the network alone and from the trees
    // fitted on the shots.
    let source_trees = model.companions.take();
    let with_source_trees = |m: &Model| -> Result<Option<Model>> {
        source_trees
            .as_ref()
            .map(|trees| with_companions(m, trees))
            .transpose()
    };
    if o.shots_per_task == 1 {
        bail!(
            "shots per task 1: a task needs two records to order (use 2 or more, or 0 to draw the shots at random)"
        );
    }
    let per_task = (o.shots_per_task > 0).then_some(o.shots_per_task);
    let data = load(&o.data, network_filter(&o.networks)?.as_ref(), progress)?;
    let (shots, test) = few_shot_split(&data, o.shots, per_task, o.seed)?;
    if shots.samples.len() < o.shots {
        bail!(
            "shots {}: the fine-tuning half of the tasks holds only {} records ({} in all, {} tasks)",
            o.shots,
            shots.samples.len(),
            data.samples.len(),
            data.tasks.len()
        );
    }
    let pre = TrainOptions {
        epochs: o.epochs,
        val_fraction: 0.0,
        seed: o.seed,
        ..TrainOptions::default()
    };
    let fine_opts = transfer_options(trainable, &pre);
    // Five steps, the first (two folds of every candidate) the longest.
    progress.start("steps", 5);
    // Fine-tuning can make a model worse (TenSet's users saw transfer slow ResNet-50 down on
    // a new device). Which candidate to keep is decided on the shots alone: half of their
    // tasks train, the other half validate, and the other way round. The test tasks are
    // never looked at.
    progress.update(0, "validating on the shots");
    let validation = validate_transfer(
        &mut model,
        source_trees.as_ref(),
        &shots,
        &data,
        &pre,
        &fine_opts,
        &o.correction_trees,
    )?;
    progress.update(1, "fine-tuning");
    let mut fine = model.duplicate()?;
    if !shots.samples.is_empty() {
        train(&mut fine, &shots, &fine_opts, &mut |_| {})?;
    }
    progress.update(2, "trees on the shots");
    let mut fine_ensemble = fit_on_shots(&fine, &shots, o.seed)?;
    // The baselines (ridge and trees on the shots, roofline, random) are the same for every
    // model: fitted once, the trees being the ensemble's where they were fitted.
    let trees = fine_ensemble.as_ref().and_then(|m| m.companions.clone());
    let before = compare_with_trees(&mut model, &shots, &test, o.seed, trees.as_deref());
    // Every candidate's ranking of the test tasks, by name: scored pooled here and by
    // network below.
    let mut test_rankings: Vec<(&'static str, Vec<Ranked>)> = Vec::new();
    let mut on_test_as = |name: &'static str, ranked: Vec<Ranked>| -> Metrics {
        let m = metrics::evaluate(&ranked);
        test_rankings.push((name, ranked));
        m
    };
    on_test_as("pretrained", rank(&mut model, &test));
    let fine_tuned = Comparison {
        model: on_test_as("fine-tuned", rank(&mut fine, &test)),
        ..before
    };
    let fine_tuned_ensemble = fine_ensemble
        .as_mut()
        .map(|m| on_test_as("fine-tuned+ensemble", rank_ensemble(m, &test)));
    let mut pretrained_trees = with_source_trees(&model)?;
    // The model as it came: with its own trees where it has them.
    let before_ranked = match pretrained_trees.as_mut() {
        Some(m) => rank_ensemble(m, &test),
        None => rank(&mut model, &test),
    };
    let before_task_picks = task_picks(&test, &before_ranked);
    let before_ensemble = pretrained_trees
        .is_some()
        .then(|| on_test_as("pretrained+trees", before_ranked));
    progress.update(3, "correcting the carried trees");
    let mut corrected = match &source_trees {
        Some(trees) => corrected_on(&mut model, trees, &shots, o.seed, &o.correction_trees)?,
        None => None,
    };
    let pretrained_corrected = corrected
        .as_mut()
        .map(|m| on_test_as("pretrained+trees+correction", rank_ensemble(m, &test)));
    let mut fine_source = with_source_trees(&fine)?;
    let fine_tuned_pretrained_trees = fine_source
        .as_mut()
        .map(|m| on_test_as("fine-tuned+pretrained-trees", rank_ensemble(m, &test)));
    progress.update(4, "from scratch");
    let mut scratch_model = Model::new(model.config().clone(), o.seed)?;
    if !shots.samples.is_empty() {
        train(&mut scratch_model, &shots, &pre, &mut |_| {})?;
    }
    progress.finish();
    let scratch = Comparison {
        model: on_test_as("scratch", rank(&mut scratch_model, &test)),
        ..before
    };
    on_test_as("roofline", roofline_rank(&test));
    let chosen = choose_transfer(validation.as_ref(), source_trees.is_some());
    let with_metrics = |m: Metrics, c: &Comparison| Comparison { model: m, ..*c };
    let (mut saved_model, after) = match (chosen, fine_ensemble, fine_tuned_ensemble) {
        ("pretrained+trees", ..) if pretrained_trees.is_some() && before_ensemble.is_some() => (
            pretrained_trees.expect("checked"),
            with_metrics(before_ensemble.expect("checked"), &before),
        ),
        ("pretrained+trees+correction", ..)
            if corrected.is_some() && pretrained_corrected.is_some() =>
        {
            (
                corrected.expect("checked"),
                with_metrics(pretrained_corrected.expect("checked"), &before),
            )
        }
        ("fine-tuned+pretrained-trees", ..)
            if fine_source.is_some() && fine_tuned_pretrained_trees.is_some() =>
        {
            (
                fine_source.expect("checked"),
                with_metrics(fine_tuned_pretrained_trees.expect("checked"), &fine_tuned),
            )
        }
        ("fine-tuned", ..) => (fine, fine_tuned),
        ("fine-tuned+ensemble", Some(m), Some(metrics)) => (
            m,
            Comparison {
                model: metrics,
                ..fine_tuned
            },
        ),
        ("scratch", ..) => (scratch_model, scratch),
        _ => (model, before),
    };
    let chosen = if chosen == "fine-tuned+ensemble" && saved_model.companions.is_none() {
        // Validation fitted trees on half the shots but not on all of them (cannot happen
        // with more records; kept honest anyway): the pretrained weights stay.
        "pretrained"
    } else {
        chosen
    };
    saved_model.info.provenance = serde_json::json!({
        "transferred_from": o.model.display().to_string(),
        "data": o.data.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "shots": o.shots,
        "shots_per_task": o.shots_per_task,
        "mode": o.mode,
        "correction_trees": o.correction_trees.to_string(),
        "chosen": chosen,
        "validation": validation,
    });
    saved_model.save(&o.out)?;
    let kept_ranked = rank_ensemble(&mut saved_model, &test);
    let task_picks = task_picks(&test, &kept_ranked);
    // By network (TenSet's and TLP's protocol, held-out's average): every known network
    // the data holds all of and the test half some of. The pooled figures above are
    // decided by the heaviest test tasks.
    let groups = bynetwork::groups(&test, NETWORKS.iter().map(|(name, _)| *name), Some(&data))?;
    let by_network = if groups.is_empty() {
        Vec::new()
    } else {
        let mut v = vec![bynetwork::by_network("kept", &kept_ranked, &groups, None)];
        v.extend(
            test_rankings
                .iter()
                .map(|(name, r)| bynetwork::by_network(name, r, &groups, None)),
        );
        v.push(bynetwork::by_network(
            "random",
            &kept_ranked,
            &groups,
            Some(o.seed),
        ));
        v
    };
    Ok(TransferReport {
        shots: shots.samples.len(),
        shots_per_task: o.shots_per_task,
        mode: o.mode.clone(),
        test_records: test.samples.len(),
        test_tasks: test.tasks.len(),
        before,
        before_ensemble,
        after,
        fine_tuned,
        fine_tuned_ensemble,
        fine_tuned_pretrained_trees,
        pretrained_corrected,
        correction_trees: o.correction_trees,
        scratch,
        chosen: chosen.to_string(),
        validation,
        saved: Model::paths(&o.out),
        saved_ensemble: saved_model
            .companions
            .is_some()
            .then(|| Companions::path(&o.out)),
        task_picks,
        before_task_picks,
        by_network,
    })
}

/// A copy of `model` with `trees` beside it (the pretrained model's, carried to a network
/// of the new platform).
fn with_companions(model: &Model, trees: &std::sync::Arc<Companions>) -> Result<Model> {
    let mut m = model.duplicate()?;
    m.companions = Some(trees.clone());
    Ok(m)
}

/// A copy of `model` with trees fitted on `shots` beside it (`fit_companions`);
/// None when there is too little to fit them on (no task of two records: no spread within a
/// task to scale by) or the fit fails.
fn fit_on_shots(model: &Model, shots: &Dataset, seed: u64) -> Result<Option<Model>> {
    if shots.by_task().iter().all(|t| t.len() < 2) {
        return Ok(None);
    }
    let mut m = model.duplicate()?;
    Ok(m.fit_companions(shots, seed).is_ok().then_some(m))
}

/// A copy of `model` with `trees` beside it and a correction of the two fitted on `shots`
/// ([`Companions::corrected`], grown by `recipe`); None when the shots hold no task of
/// two records to learn an order from or the fit fails (as [`fit_on_shots`]: a candidate
/// that cannot be made is left out, the transfer goes on).
fn corrected_on(
    model: &mut Model,
    trees: &std::sync::Arc<Companions>,
    shots: &Dataset,
    seed: u64,
    recipe: &TreeRecipe,
) -> Result<Option<Model>> {
    if shots.by_task().iter().all(|t| t.len() < 2) {
        return Ok(None);
    }
    let scores = model.predict(&sample_tokens(shots));
    match trees.corrected(shots, &scores, seed, recipe) {
        Ok(corrected) => Ok(Some(with_companions(
            model,
            &std::sync::Arc::new(corrected),
        )?)),
        Err(_) => Ok(None),
    }
}

/// How many records of each task `transfer` draws its shots as, by default. On f32 FMA ->
/// int8 (2026-12-06) K=128 drawn 8 a task kept a model at or above K=0 and scratch on
/// every figure on four seeds of five (the fifth kept K=0, 0.030 under scratch's top-5);
/// drawn at random it kept K=0 on all three seeds tried, under scratch's top-1 on two
/// (`fixtures/bench/transfer-correction-2026-12-06.txt`).
pub const DEFAULT_SHOTS_PER_TASK: usize = 8;

/// The fewest pairs of validation records (of one task) on which a transfer leaves the
/// pretrained model. With 32 shots over 66 int8 tasks the validation held 15 records of 7
/// tasks (9 pairs), and scratch "won" there by 0.09 while it ranked the test tasks worse
/// than the pretrained model on every figure.
pub const MIN_VALIDATION_PAIRS: usize = 50;

/// The fewest validation tasks on which a transfer leaves the pretrained model: the gain's
/// standard error is estimated over them. Shots drawn task by task (`--shots-per-task 8`,
/// 32 shots) validate on 4 tasks with 112 pairs; there a correction reached +1.4 standard
/// errors and ranked the test tasks' top-5 at 0.319 against 0.810 for the model as it came.
pub const MIN_VALIDATION_TASKS: usize = 10;

/// How many standard errors a candidate's per-task gain over the model as it came must
/// reach on the shots' validation tasks before a transfer leaves that model (one-sided,
/// about 98%). With three records a task (K=128 over 66 int8 tasks) the pretrained network
/// without its trees led the validation criterion by 0.032 (task by task +0.037, 1.3
/// standard errors) and then ranked the test tasks below the model as it came on every
/// figure (top-1 0.203 against 0.369) and below scratch on top-1 and top-5.
pub const TRANSFER_MIN_GAIN_Z: f64 = 2.0;

/// How many standard errors (network by network) a candidate's top-1 by network may lag the
/// model as it came on the shots' validation tasks before a transfer refuses it, whatever
/// its lead on the criterion. The criterion weighs every task alike; the test weighs each
/// network's tasks by latency. With all the int8 data (seed 3) the fine-tuned network with
/// trees fitted on the shots led the criterion by +3.0 standard errors, lagged by network
/// by 0.116 (-1.9 standard errors; its validation top-1 0.469 pooled), and ranked the test
/// networks under the model as it came on top-1 (0.774 against 0.778).
pub const TRANSFER_MAX_NETWORK_LOSS_Z: f64 = 1.0;

/// Which model a transfer keeps. What was there stays unless another candidate beats it on
/// the shots' validation tasks, by more than their noise: the pretrained model as it came,
/// with its own trees where it has them (`has_trees`: what `tune` would rank by without a
/// transfer). A candidate must lead it on the criterion and by [`TRANSFER_MIN_GAIN_Z`]
/// standard errors task by task, and must not lag it on top-1 by network by
/// [`TRANSFER_MAX_NETWORK_LOSS_Z`] standard errors or more (where the validation tasks fall in
/// known networks); of those that pass, the surest lead wins (the largest gain in standard
/// errors, then the highest criterion), ties going to the earlier of pretrained,
/// pretrained+trees, pretrained+trees+correction, fine-tuned, fine-tuned+pretrained-trees,
/// fine-tuned+ensemble and scratch. The surest, not the largest: what a transfer must not do
/// is end below the model as it came, and with 512 int8 shots (seed 1) the largest lead
/// (+0.044, +2.3 standard errors) ranked the test networks under it where the surest
/// (+0.039, +3.3) ranked them above. Where none passes, the correction of the carried
/// trees (`pretrained+trees+correction`) where it is ahead of the model as it came on the
/// validation at all (`correction_not_behind`). Without validation, or on
/// fewer than [`MIN_VALIDATION_PAIRS`] pairs or [`MIN_VALIDATION_TASKS`] tasks, what was
/// there.
fn choose_transfer(validation: Option<&TransferValidation>, has_trees: bool) -> &'static str {
    let as_it_came = if has_trees {
        "pretrained+trees"
    } else {
        "pretrained"
    };
    let Some(v) = validation else {
        return as_it_came;
    };
    if v.validation_pairs < MIN_VALIDATION_PAIRS || v.validation_tasks < MIN_VALIDATION_TASKS {
        return as_it_came;
    }
    let (incumbent_name, incumbent) = v.as_it_came(has_trees);
    // Of the candidates that pass, the surest lead: the largest gain in standard errors to a
    // tenth, as the report prints it, then the highest criterion. (A gain without spread, or
    // with a spread of rounding alone, is as sure as any: beyond 1000 they tie.)
    let sureness = |z: f64| (z.clamp(-1000.0, 1000.0) * 10.0).round() as i64;
    let mut best: Option<(&'static str, i64, f64)> = None;
    // Each candidate's gain over the model as it came: `TransferValidation::with_gains`
    // (the model itself has none).
    for (name, score) in v.candidates() {
        let Some(s) = score else { continue };
        let Some(gain) = s.gain else { continue };
        let passes = s.criterion > incumbent.criterion
            && gain.clears(TRANSFER_MIN_GAIN_Z)
            && s.not_behind_by_network();
        let sure = sureness(gain.z());
        let surer =
            best.is_none_or(|(_, z, criterion)| sure > z || (sure == z && s.criterion > criterion));
        if passes && surer {
            best = Some((name, sure, s.criterion));
        }
    }
    if let Some((name, _, _)) = best {
        return name;
    }
    // Nothing leads far enough: the correction, where it is ahead of the model as it came
    // task by task and not behind it by network, however little (`correction_not_behind`).
    match &v.pretrained_corrected {
        Some(c) if correction_not_behind(c) => "pretrained+trees+correction",
        _ => incumbent_name,
    }
}

/// Whether the correction of the carried trees may be kept where no candidate leads by
/// [`TRANSFER_MIN_GAIN_Z`]: its mean gain over the model as it came on the shots' validation
/// tasks is above 0 task by task and not under 0 by network (where there are networks). No
/// standard errors: a correction within the noise is kept on this evidence alone.
///
/// Why it needs less than the other candidates: the correction (20 trees of depth 2 at a
/// rate of 0.1, fitted on what the carried ensemble gets wrong on the shots) moves the
/// ranking little, and its validation (two folds, each fitted on half the shots' tasks)
/// lags its test gain. Of f32 FMA to int8 with 128 shots or more it ranked the test networks
/// above the model as it came, top-1 by network, in 29 of the 30 transfers of the model-167
/// guest (schemas v1 to v4, `fixtures/bench/transfer-by-network-schema-v2-2026-12-07.txt`,
/// `transfer-network-guard-2026-12-07.txt`, `transfer-schema-v4-2026-12-07.txt`); with 128
/// shots at seeds 2 and 3 under v4 it led the validation by +0.5 and -0.7 standard errors
/// and the test networks by +0.175 and +0.072. Why not behind at all: on the Zen 4 guest
/// (`transfer-correction-fallback-2026-12-08.txt`) with 512 shots at seed 3 it was level
/// task by task (+0.000) and lagged by network by just under a standard error, and then
/// ranked the test networks 0.070 under the model as it came.
fn correction_not_behind(c: &TransferScore) -> bool {
    c.gain.is_some_and(|g| g.mean > 0.0) && c.network_gain.is_none_or(|g| g.mean >= 0.0)
}

/// The candidates on the shots' tasks, by two-fold cross-validation: the tasks (of at least
/// two records) split in halves, the candidates that train trained on one half and ranking
/// the other, then the halves swapped, so that every such task is ranked once by models
/// that never saw it. Three records a task (K=128 over 66 tasks) make one half's verdict
/// noise; both halves together halve it. None when there is no such split: fewer than two
/// tasks of at least two records each.
fn validate_transfer(
    pretrained: &mut Model,
    source_trees: Option<&std::sync::Arc<Companions>>,
    shots: &Dataset,
    all: &Dataset,
    pre: &TrainOptions,
    fine_opts: &TrainOptions,
    correction: &TreeRecipe,
) -> Result<Option<TransferValidation>> {
    // The folds, the trees and scratch's initial weights all follow the transfer's seed.
    let seed = pre.seed;
    let usable: Vec<usize> = shots
        .by_task()
        .iter()
        .enumerate()
        .filter(|(_, s)| s.len() >= 2)
        .map(|(t, _)| t)
        .collect();
    if usable.len() < 2 {
        return Ok(None);
    }
    let (a, b) = split_tasks(usable.len(), 0.5, seed);
    let pick = |ix: &[usize]| ix.iter().map(|&i| usable[i]).collect::<Vec<_>>();
    // The validation tasks in the order the folds rank them (b, then a), by network as the
    // test is scored: networks the data holds whole.
    let ranked_tasks = shots.subset(&[pick(&b), pick(&a)].concat());
    let groups = bynetwork::groups(
        &ranked_tasks,
        NETWORKS.iter().map(|(name, _)| *name),
        Some(all),
    )?;
    let score = |ranked: &[Ranked]| TransferScore::of(ranked, &groups);
    let (mut pre_r, mut fine_r, mut scratch_r) = (Vec::new(), Vec::new(), Vec::new());
    let mut ensemble_r = Some(Vec::new());
    // The candidates with the pretrained model's trees (none without them).
    let (mut pre_trees_r, mut fine_trees_r, mut corrected_r) = (Vec::new(), Vec::new(), Vec::new());
    let (mut fit_records, mut validation_records, mut validation_tasks) = (0, 0, 0);
    for (fit_ix, val_ix) in [(&a, &b), (&b, &a)] {
        let (fit, val) = (shots.subset(&pick(fit_ix)), shots.subset(&pick(val_ix)));
        if fit.samples.is_empty() || val.samples.is_empty() {
            return Ok(None);
        }
        let mut f = pretrained.duplicate()?;
        train(&mut f, &fit, fine_opts, &mut |_| {})?;
        ensemble_r = match (ensemble_r, fit_on_shots(&f, &fit, seed)?) {
            (Some(mut r), Some(mut e)) => {
                r.extend(rank_ensemble(&mut e, &val));
                Some(r)
            }
            _ => None,
        };
        let mut s = Model::new(pretrained.config().clone(), seed)?;
        train(&mut s, &fit, pre, &mut |_| {})?;
        if let Some(trees) = source_trees {
            pre_trees_r.extend(rank_ensemble(
                &mut with_companions(pretrained, trees)?,
                &val,
            ));
            fine_trees_r.extend(rank_ensemble(&mut with_companions(&f, trees)?, &val));
            if let Some(mut c) = corrected_on(pretrained, trees, &fit, seed, correction)? {
                corrected_r.extend(rank_ensemble(&mut c, &val));
            }
        }
        pre_r.extend(rank(pretrained, &val));
        fine_r.extend(rank(&mut f, &val));
        scratch_r.extend(rank(&mut s, &val));
        fit_records += fit.samples.len();
        validation_records += val.samples.len();
        validation_tasks += val.tasks.len();
    }
    Ok(Some(
        TransferValidation {
            fit_records: fit_records / 2,
            validation_records,
            validation_tasks,
            validation_pairs: pre_r
                .iter()
                .map(|t| t.latency.len() * t.latency.len().saturating_sub(1) / 2)
                .sum(),
            networks: groups.iter().map(|g| g.name.clone()).collect(),
            pretrained: score(&pre_r),
            pretrained_trees: source_trees.map(|_| score(&pre_trees_r)),
            // Both folds or neither: a score over one fold's tasks would not pair task by task.
            pretrained_corrected: (source_trees.is_some()
                && corrected_r.len() == pre_trees_r.len())
            .then(|| score(&corrected_r)),
            fine_tuned: score(&fine_r),
            fine_tuned_pretrained_trees: source_trees.map(|_| score(&fine_trees_r)),
            fine_tuned_ensemble: ensemble_r.as_deref().map(score),
            scratch: score(&scratch_r),
        }
        .with_gains(source_trees.is_some()),
    ))
}

/// A model file of this feature schema; errors name the file.
pub fn load_model(path: &Path) -> Result<Model> {
    let model = Model::load(path).with_context(|| format!("model {}", path.display()))?;
    model
        .check_schema(tessel_features::SCHEMA_VERSION)
        .with_context(|| format!("model {}", path.display()))?;
    Ok(model)
}

/// Training settings that cannot train: no epochs, a rate that is not a positive number.
fn check_training(epochs: usize, lr: f64) -> Result<()> {
    if epochs == 0 {
        bail!("epochs must be at least 1");
    }
    if !(lr.is_finite() && lr > 0.0 && lr < 1.0) {
        bail!("lr {lr} is not a learning rate in (0, 1)");
    }
    Ok(())
}

/// Model files are never overwritten unless asked.
fn refuse_overwrite(out: &Path, force: bool) -> Result<()> {
    let (weights, json) = Model::paths(out);
    for p in [&weights, &json, &Companions::path(out)] {
        if p.exists() && !force {
            bail!(
                "{} exists; choose another --out or pass --force to overwrite it",
                p.display()
            );
        }
    }
    Ok(())
}

/// K records for fine-tuning, drawn from half of the tasks (seeded, by key: records measured
/// again do not move a task between the halves); the other tasks test. Without `per_task`
/// the K are drawn at random over the whole half; with it, task by task in a seeded order,
/// `per_task` records of each (the last task what is left of K), and where the half's
/// tasks run out first, the rest of K at random from their other records.
fn few_shot_split(
    data: &Dataset,
    k: usize,
    per_task: Option<usize>,
    seed: u64,
) -> Result<(Dataset, Dataset)> {
    if data.tasks.len() < 2 {
        bail!("transfer needs at least two tasks (one to fine-tune on, one to test)");
    }
    let (train_ids, test_ids) = split_tasks_by_key(data, 0.5, seed);
    let pool = data.subset(&train_ids);
    let mut rng = Rng::new(seed);
    let mut shuffle = |idx: &mut Vec<usize>| {
        for i in (1..idx.len()).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            idx.swap(i, j);
        }
    };
    let mut idx: Vec<usize> = (0..pool.samples.len()).collect();
    shuffle(&mut idx);
    if let Some(m) = per_task {
        // The shuffled records, grouped by task in a shuffled task order: each task's
        // first m of them, until K.
        let mut tasks: Vec<usize> = (0..pool.tasks.len()).collect();
        shuffle(&mut tasks);
        let mut of_task: Vec<Vec<usize>> = vec![Vec::new(); pool.tasks.len()];
        for &i in &idx {
            of_task[pool.samples[i].task].push(i);
        }
        let mut drawn: Vec<usize> = tasks
            .iter()
            .flat_map(|&t| of_task[t].iter().take(m).copied())
            .collect();
        // Too few tasks for K at m each: the rest of K at random from what they have left.
        if drawn.len() < k {
            let taken: std::collections::HashSet<usize> = drawn.iter().copied().collect();
            drawn.extend(idx.iter().copied().filter(|i| !taken.contains(i)));
        }
        idx = drawn;
    }
    idx.truncate(k);
    let samples: Vec<Sample> = idx.iter().map(|&i| pool.samples[i].clone()).collect();
    Ok((
        Dataset::new(pool.tasks.clone(), samples, data.width)?,
        data.subset(&test_ids),
    ))
}

/// The committed dataset `eval` reads by default (fixtures/README.md): 200 schedules per task
/// of eleven networks on AVX2 FMA.
pub const SHIPPED_DATASETS: &[&str] = &["cpu-avx2-fma-zen4.jsonl.gz"];
/// Networks the shipped model was not trained on: the held-out protocol's test networks
/// (it was trained with `pretrain --exclude-network` of these).
pub const HELD_OUT_NETWORKS: &[&str] = crate::heldout::TEST_NETWORKS;

/// What to evaluate.
#[derive(Clone, Debug, Default)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct EvalOptions {
    /// The model (default: the shipped fixtures/models/cpu).
    #[cfg_attr(feature = "clap", arg(long))]
    pub model: Option<PathBuf>,
    /// Dataset files (default: the shipped datasets, held-out networks only).
    #[cfg_attr(feature = "clap", arg(long, num_args = 1..))]
    pub data: Vec<PathBuf>,
    /// Only the tasks of these networks, comma separated.
    #[cfg_attr(feature = "clap", arg(long = "network", value_delimiter = ','))]
    pub networks: Vec<String>,
    /// Seed of the ridge split and the random baseline.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1))]
    pub seed: u64,
    /// Write plots (predicted vs measured per task, top-k curves) into this directory: SVG,
    /// and PNG where rsvg-convert is installed.
    #[cfg_attr(feature = "clap", arg(long))]
    pub plot: Option<PathBuf>,
    /// Rank by each record's fastest run instead of its median (the machine's noise only
    /// ever adds time).
    #[cfg_attr(feature = "clap", arg(long))]
    pub fastest_run: bool,
    /// Only the tasks listed in this file, one task key per line (e.g. the validation tasks
    /// a model lists, to judge a retrain on tasks neither model trained on).
    #[cfg_attr(feature = "clap", arg(long))]
    pub tasks: Option<PathBuf>,
    /// Another model to rank the same records: its figures, and the per-task gain of
    /// `--model` over it (the paired test `transfer` and `refit-trees` decide by).
    #[cfg_attr(feature = "clap", arg(long))]
    pub against: Option<PathBuf>,
}

/// `eval --against`: the other model on the same records.
#[derive(Clone, Debug, Serialize)]
pub struct Against {
    /// The other model file.
    pub model: String,
    /// Its ranking (as `tune` ranks with it: with its trees where it has them).
    pub ranking: Metrics,
    /// Its selection criterion on these tasks.
    pub criterion: f64,
    /// `--model`'s selection criterion on the same tasks.
    pub model_criterion: f64,
    /// The gain of `--model` over it, task by task.
    pub gain: PairedGain,
}

/// A model's ranking quality.
#[derive(Clone, Debug, Serialize)]
pub struct EvalReport {
    /// The model file.
    pub model: String,
    /// Records ranked.
    pub records: usize,
    /// Tasks ranked.
    pub tasks: usize,
    /// TenSet's top-1 score.
    pub top1: f64,
    /// TenSet's top-5 score.
    pub top5: f64,
    /// Share of pairs ordered right.
    pub pairwise_accuracy: f64,
    /// Kendall's tau.
    pub kendall_tau: f64,
    /// Ridge regression, fitted on the other half of the tasks.
    pub ridge: Metrics,
    /// Gradient-boosted trees on the same features, fitted the same way.
    pub gbt: Metrics,
    /// The analytic roofline estimate (fitted on nothing).
    pub roofline: Metrics,
    /// A random ranking.
    pub random: Metrics,
    /// The model as `tune` ranks with it: the network plus the trees it ships with
    /// (`NAME.ensemble.json.gz`, fitted on its training tasks); `None` for a network alone.
    pub ensemble: Option<Metrics>,
    /// Each task's top-1 pick (by the ensemble where there is one) beside its best, with its
    /// share of what the top-1 score loses: the score weighs tasks by latency, so a few heavy
    /// tasks decide it.
    pub task_picks: Vec<TaskPick>,
    /// Where the plots went, and why there is no PNG where there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plots: Option<(PathBuf, Option<String>)>,
    /// `--against`: the other model on the same records.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub against: Option<Against>,
}

/// The model's ranking of every task of the data, beside ridge (fitted on the other half of
/// the tasks, both ways, so it never sees the tasks it ranks) and random scores.
pub fn eval(o: &EvalOptions, progress: &mut dyn Progress) -> Result<EvalReport> {
    let model_path = match &o.model {
        Some(p) => p.clone(),
        None => fixtures_dir().join("models/cpu.safetensors"),
    };
    let (data_files, networks) = if o.data.is_empty() {
        let dir = fixtures_dir().join("datasets");
        let files: Vec<PathBuf> = SHIPPED_DATASETS.iter().map(|f| dir.join(f)).collect();
        let nets = if o.networks.is_empty() {
            HELD_OUT_NETWORKS.iter().map(|s| s.to_string()).collect()
        } else {
            o.networks.clone()
        };
        (files, nets)
    } else {
        (o.data.clone(), o.networks.clone())
    };
    let mut model = load_model(&model_path)?;
    let mut other = o.against.as_deref().map(load_model).transpose()?;
    let label = Label::fastest_if(o.fastest_run);
    let mut data = load_labeled(
        &data_files,
        network_filter(&networks)?.as_ref(),
        label,
        progress,
    )?;
    if let Some(path) = &o.tasks {
        let listed = tasks_named(&data, &read_task_keys(path)?)
            .with_context(|| format!("--tasks {}", path.display()))?;
        data = data.subset(&listed);
    }
    let ranked = rank(&mut model, &data);
    let (a, b) = split_tasks_by_key(&data, 0.5, o.seed);
    // The baselines never rank tasks they were fitted on: each half is ranked by a fit on
    // the other half.
    let cross = |fit: &dyn Fn(&Dataset, &Dataset) -> Vec<Ranked>| -> Vec<Ranked> {
        if a.is_empty() || b.is_empty() {
            return fit(&data, &data);
        }
        let (da, db) = (data.subset(&a), data.subset(&b));
        let (on_b, on_a) = (fit(&da, &db), fit(&db, &da));
        let mut out = ranked.clone();
        for (i, &t) in b.iter().enumerate() {
            out[t] = on_b[i].clone();
        }
        for (i, &t) in a.iter().enumerate() {
            out[t] = on_a[i].clone();
        }
        out
    };
    let ridge_ranked = cross(&|tr, te| ridge_rank(tr, te));
    let gbt_ranked = cross(&|tr, te| gbt_rank(tr, te, o.seed));
    let model_metrics = metrics::evaluate(&ranked);
    let ensemble_ranked = model
        .companions
        .is_some()
        .then(|| rank_ensemble(&mut model, &data));
    let plots = match &o.plot {
        Some(dir) => Some((
            dir.clone(),
            plot(dir, &data, &ranked, &ridge_ranked, o.seed)?,
        )),
        None => None,
    };
    let against = match (&o.against, other.as_mut()) {
        (Some(path), Some(other)) => {
            let mine = ensemble_ranked.as_deref().unwrap_or(&ranked);
            // As `tune` ranks with it: with its trees where it has them.
            let theirs = rank_ensemble(other, &data);
            let (ranking, criterion) = metrics::evaluate_with_criterion(&theirs);
            let (_, model_criterion) = metrics::evaluate_with_criterion(mine);
            Some(Against {
                model: path.display().to_string(),
                ranking,
                criterion,
                model_criterion,
                gain: metrics::paired_gain(
                    &metrics::task_criteria(mine),
                    &metrics::task_criteria(&theirs),
                ),
            })
        }
        _ => None,
    };
    Ok(EvalReport {
        model: model_path.display().to_string(),
        records: data.samples.len(),
        tasks: data.tasks.len(),
        top1: model_metrics.top1,
        top5: model_metrics.top5,
        pairwise_accuracy: model_metrics.pairwise_accuracy,
        kendall_tau: model_metrics.kendall_tau,
        ridge: metrics::evaluate(&ridge_ranked),
        gbt: metrics::evaluate(&gbt_ranked),
        roofline: metrics::evaluate(&roofline_rank(&data)),
        random: metrics::random_baseline(&ranked, 20, o.seed),
        ensemble: ensemble_ranked.as_deref().map(metrics::evaluate),
        task_picks: task_picks(&data, ensemble_ranked.as_deref().unwrap_or(&ranked)),
        plots,
        against,
    })
}

/// One task's top-1 in an eval.
#[derive(Clone, Debug, Serialize)]
pub struct TaskPick {
    /// The task's workload spec.
    pub task: String,
    /// How often it occurs in its network.
    pub weight: f64,
    /// Its records in the eval.
    pub records: usize,
    /// The task's best measured latency.
    pub best_s: f64,
    /// The measured latency of the model's favourite.
    pub chosen_s: f64,
    /// This task's share of `sum(w * (chosen - best))` over all tasks.
    pub loss_share: f64,
}

/// Every task's pick, those that lose the top-1 score most first.
fn task_picks(data: &Dataset, ranked: &[Ranked]) -> Vec<TaskPick> {
    let shares = metrics::top1_loss_shares(ranked);
    let mut picks: Vec<TaskPick> = data
        .tasks
        .iter()
        .zip(ranked)
        .zip(shares)
        .filter_map(|(((task, weight), r), loss_share)| {
            let (best_s, chosen_s) = metrics::best_and_chosen(r, 1)?;
            Some(TaskPick {
                task: task.clone(),
                weight: *weight,
                records: r.latency.len(),
                best_s,
                chosen_s,
                loss_share,
            })
        })
        .collect();
    picks.sort_by(|a, b| b.loss_share.total_cmp(&a.loss_share));
    picks
}

/// Writes the eval plots into `dir`; returns why there is no PNG, where there is none.
fn plot(
    dir: &Path,
    data: &Dataset,
    ranked: &[Ranked],
    ridge: &[Ranked],
    seed: u64,
) -> Result<Option<String>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let named: Vec<(String, Ranked)> = data
        .tasks
        .iter()
        .map(|(k, _)| k.clone())
        .zip(ranked.iter().cloned())
        .collect();
    let svgs = [dir.join("predicted_vs_measured.svg"), dir.join("top_k.svg")];
    crate::plot::scatter(&svgs[0], &named)?;
    let mut rng = Rng::new(seed);
    let random: Vec<Ranked> = ranked
        .iter()
        .map(|t| Ranked {
            predicted: t.latency.iter().map(|_| rng.unit()).collect(),
            ..t.clone()
        })
        .collect();
    crate::plot::top_k(
        &svgs[1],
        &[("model", ranked), ("ridge", ridge), ("random", &random)],
    )?;
    Ok(crate::plot::png_copies(&[&svgs[0], &svgs[1]]).err())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A candidate that scores `criterion` on each of 40 validation tasks.
    fn score(criterion: f64) -> TransferScore {
        TransferScore {
            criterion,
            per_task: vec![criterion; 40],
            ..TransferScore::default()
        }
    }

    fn validation(
        pretrained: f64,
        fine_tuned: f64,
        ensemble: Option<f64>,
        scratch: f64,
    ) -> TransferValidation {
        let m = score;
        TransferValidation {
            fit_records: 80,
            validation_records: 80,
            validation_tasks: 40,
            validation_pairs: 1560,
            networks: Vec::new(),
            pretrained: m(pretrained),
            pretrained_trees: None,
            pretrained_corrected: None,
            fine_tuned: m(fine_tuned),
            fine_tuned_pretrained_trees: None,
            fine_tuned_ensemble: ensemble.map(m),
            scratch: m(scratch),
        }
    }

    /// What a transfer keeps of `v`, its gains filled as `validate_transfer` fills them.
    fn chosen(v: &TransferValidation, has_trees: bool) -> &'static str {
        choose_transfer(Some(&v.clone().with_gains(has_trees)), has_trees)
    }

    #[test]
    fn a_transfer_keeps_the_pretrained_model_unless_training_beats_it_on_the_shots() {
        let choose = |p, f, e, s| chosen(&validation(p, f, e, s), false);
        assert_eq!(choose_transfer(None, false), "pretrained");
        assert_eq!(choose(0.7, 0.8, None, 0.6), "fine-tuned");
        // Fine-tuning that hurts on the validation tasks is dropped.
        assert_eq!(choose(0.7, 0.6, None, 0.5), "pretrained");
        // A tie keeps what was there.
        assert_eq!(choose(0.7, 0.7, Some(0.7), 0.7), "pretrained");
        assert_eq!(choose(0.6, 0.7, None, 0.8), "scratch");
        assert_eq!(choose(0.8, 0.6, Some(0.75), 0.7), "pretrained");
        // Trees fitted on the shots beside the fine-tuned network.
        assert_eq!(choose(0.6, 0.7, Some(0.75), 0.72), "fine-tuned+ensemble");
        assert_eq!(choose(0.6, 0.7, Some(0.69), 0.65), "fine-tuned");
        // Too few pairs to tell: whatever the scores, the pretrained model stays.
        let thin = TransferValidation {
            validation_pairs: MIN_VALIDATION_PAIRS - 1,
            ..validation(0.6, 0.7, Some(0.75), 0.9)
        };
        assert_eq!(chosen(&thin, false), "pretrained");
        // So on too few tasks, however many pairs they hold.
        let few_tasks = TransferValidation {
            validation_tasks: MIN_VALIDATION_TASKS - 1,
            ..validation(0.6, 0.7, Some(0.75), 0.9)
        };
        assert_eq!(chosen(&few_tasks, false), "pretrained");
        // The pretrained model's own trees, beside it or beside the fine-tuned network.
        let with_trees = |pre: f64, fine: f64| TransferValidation {
            pretrained_trees: Some(score(pre)),
            fine_tuned_pretrained_trees: Some(score(fine)),
            ..validation(0.6, 0.7, Some(0.75), 0.72)
        };
        let choose = |v: &TransferValidation| chosen(v, true);
        assert_eq!(choose(&with_trees(0.8, 0.7)), "pretrained+trees");
        assert_eq!(choose(&with_trees(0.7, 0.8)), "fine-tuned+pretrained-trees");
        assert_eq!(choose(&with_trees(0.7, 0.74)), "fine-tuned+ensemble");
        assert_eq!(choose(&with_trees(0.6, 0.5)), "fine-tuned+ensemble");
        // A model that came with trees keeps them: without validation, on too few pairs,
        // and on a tie with the network alone.
        assert_eq!(choose_transfer(None, true), "pretrained+trees");
        let thin_with_trees = TransferValidation {
            validation_pairs: MIN_VALIDATION_PAIRS - 1,
            ..with_trees(0.1, 0.1)
        };
        assert_eq!(choose(&thin_with_trees), "pretrained+trees");
        let tie = TransferValidation {
            pretrained_trees: Some(score(0.9)),
            ..validation(0.9, 0.7, None, 0.7)
        };
        assert_eq!(choose(&tie), "pretrained+trees");
        // Its network alone can still win.
        let alone = TransferValidation {
            pretrained_trees: Some(score(0.8)),
            ..validation(0.9, 0.7, None, 0.7)
        };
        assert_eq!(choose(&alone), "pretrained");
        // The carried ensemble corrected on the shots, when it leads.
        let corrected = |c: f64| TransferValidation {
            pretrained_corrected: Some(score(c)),
            ..with_trees(0.8, 0.7)
        };
        assert_eq!(choose(&corrected(0.85)), "pretrained+trees+correction");
        assert_eq!(choose(&corrected(0.78)), "pretrained+trees");
        assert_eq!(choose(&corrected(0.8)), "pretrained+trees");
    }

    #[test]
    fn where_nothing_leads_a_transfer_keeps_the_correction_if_it_is_ahead_at_all() {
        // The K=128 cases: two folds of 16 tasks, where no candidate leads by 2 standard
        // errors. Per-task criteria that wander around the model as it came's.
        let around = |base: f64, shift: f64| TransferScore {
            criterion: base + shift,
            per_task: (0..40)
                .map(|t| base + shift + if t % 2 == 0 { 0.05 } else { -0.05 })
                .collect(),
            ..TransferScore::default()
        };
        let v = |correction: TransferScore, fine: f64| TransferValidation {
            pretrained_trees: Some(score(0.8)),
            pretrained_corrected: Some(correction),
            fine_tuned_pretrained_trees: Some(score(0.5)),
            ..validation(0.5, fine, None, 0.5)
        };
        // Ahead within the noise: kept, where any other candidate would not be.
        let slightly_ahead = around(0.8, 0.005);
        let z = v(slightly_ahead.clone(), 0.5)
            .with_gains(true)
            .pretrained_corrected
            .and_then(|s| s.gain)
            .map(|g| g.z())
            .unwrap();
        assert!(0.0 < z && z < TRANSFER_MIN_GAIN_Z, "{z}");
        assert_eq!(
            chosen(&v(slightly_ahead.clone(), 0.5), true),
            "pretrained+trees+correction"
        );
        // Another candidate ahead within the noise is no reason to leave the model as it came.
        let fine_as_lucky = TransferValidation {
            fine_tuned: around(0.8, 0.005),
            ..v(around(0.8, -0.005), 0.5)
        };
        assert_eq!(chosen(&fine_as_lucky, true), "pretrained+trees");
        // Behind, however little: the model as it came.
        assert_eq!(
            chosen(&v(around(0.8, -0.005), 0.5), true),
            "pretrained+trees"
        );
        // A candidate that passes still wins over it.
        assert_eq!(chosen(&v(slightly_ahead.clone(), 0.9), true), "fine-tuned");
        // Ahead task by task but behind by network (the Zen 4 guest's seed 3 at K=512): refused.
        let networks = ["resnet50", "bert-base-128", "vit-b16"]
            .map(String::from)
            .to_vec();
        let by_network = |top1: [f64; 3]| TransferValidation {
            networks: networks.clone(),
            pretrained_trees: Some(TransferScore {
                network_top1: vec![0.8, 0.7, 0.9],
                ..score(0.8)
            }),
            pretrained_corrected: Some(TransferScore {
                network_top1: top1.to_vec(),
                ..slightly_ahead.clone()
            }),
            ..v(slightly_ahead.clone(), 0.5)
        };
        assert_eq!(
            chosen(&by_network([0.9, 0.5, 0.95]), true),
            "pretrained+trees"
        );
        assert_eq!(
            chosen(&by_network([0.85, 0.65, 0.95]), true),
            "pretrained+trees+correction"
        );
        // On too few validation tasks, what was there, correction or not.
        let few = TransferValidation {
            validation_tasks: MIN_VALIDATION_TASKS - 1,
            ..v(around(0.8, 0.05), 0.5)
        };
        assert_eq!(chosen(&few, true), "pretrained+trees");
    }

    #[test]
    fn a_transfer_does_not_leave_the_model_as_it_came_on_a_lead_within_the_noise() {
        // The K=128 case: three records a task, and a candidate that leads on average
        // because it wins a few tasks by much and loses most by a little.
        let noisy = |criterion: f64, per_task: Vec<f64>| TransferScore {
            criterion,
            per_task,
            ..TransferScore::default()
        };
        let as_it_came = vec![0.8; 40];
        let mut lucky = vec![0.78; 40];
        for t in lucky.iter_mut().take(6) {
            *t = 1.0;
        }
        let mean = lucky.iter().sum::<f64>() / 40.0;
        let gain = metrics::paired_gain(&lucky, &as_it_came);
        assert!(
            gain.mean > 0.0 && gain.z() < TRANSFER_MIN_GAIN_Z,
            "{gain:?}"
        );
        let v = TransferValidation {
            pretrained_trees: Some(noisy(0.8, as_it_came.clone())),
            ..validation(0.5, 0.5, None, 0.5)
        };
        let v = TransferValidation {
            pretrained: noisy(mean, lucky.clone()),
            ..v
        };
        assert_eq!(chosen(&v, true), "pretrained+trees");
        // The same lead on every task is no noise: the candidate is kept.
        let v = TransferValidation {
            pretrained: noisy(0.85, vec![0.85; 40]),
            ..v
        };
        assert_eq!(chosen(&v, true), "pretrained");
        // The gains the report prints are over the model as it came.
        let v = v.with_gains(true);
        assert!(
            v.pretrained_trees
                .as_ref()
                .is_some_and(|s| s.gain.is_none())
        );
        assert!(v.pretrained.gain.is_some_and(|g| g.z() > 1e6));
        assert!(v.scratch.gain.is_some_and(|g| g.mean < 0.0));
    }

    #[test]
    fn of_two_candidates_that_pass_a_transfer_keeps_the_surer_lead() {
        // The seed-1 case at K=512: fine-tuning with trees fitted on the shots led the model as
        // it came by +0.044 (+2.3 standard errors), the correction by +0.039 (+3.3); the first
        // then ranked the test networks under the model as it came, the second above it.
        let per_task = |values: Vec<f64>| TransferScore {
            criterion: values.iter().sum::<f64>() / values.len() as f64,
            per_task: values,
            ..TransferScore::default()
        };
        // A large lead that rests on half the tasks, and a small one on every task.
        let large_but_loose = per_task(
            (0..40)
                .map(|t| if t % 2 == 0 { 1.0 } else { 0.78 })
                .collect(),
        );
        let small_but_sure = per_task(
            (0..40)
                .map(|t| if t % 2 == 0 { 0.85 } else { 0.83 })
                .collect(),
        );
        let v = TransferValidation {
            pretrained_trees: Some(score(0.8)),
            pretrained_corrected: Some(small_but_sure.clone()),
            fine_tuned_ensemble: Some(large_but_loose.clone()),
            ..validation(0.5, 0.5, None, 0.5)
        };
        let gains = v.clone().with_gains(true);
        let z = |s: &Option<TransferScore>| s.as_ref().and_then(|s| s.gain).map_or(0.0, |g| g.z());
        let (loose, sure) = (
            z(&gains.fine_tuned_ensemble),
            z(&gains.pretrained_corrected),
        );
        assert!(
            TRANSFER_MIN_GAIN_Z <= loose && loose < sure,
            "{loose} {sure}"
        );
        assert!(large_but_loose.criterion > small_but_sure.criterion);
        assert_eq!(chosen(&v, true), "pretrained+trees+correction");
        // Equally sure (no spread at all): the higher criterion.
        let v = TransferValidation {
            pretrained_corrected: Some(score(0.84)),
            fine_tuned_ensemble: Some(score(0.89)),
            ..v
        };
        assert_eq!(chosen(&v, true), "fine-tuned+ensemble");
    }

    #[test]
    fn a_transfer_does_not_leave_the_model_as_it_came_for_one_that_picks_worse_by_network() {
        // The seed-3 case with all the int8 data: trees fitted on the shots led the criterion
        // by +3.0 standard errors while their first picks were slower on most networks.
        let networks = |criterion: f64, top1: [f64; 4]| TransferScore {
            network_top1: top1.to_vec(),
            ..score(criterion)
        };
        let as_it_came = networks(0.84, [0.8, 0.7, 0.9, 0.8]);
        let v = |ensemble: TransferScore| TransferValidation {
            networks: ["resnet50", "bert-base-128", "vit-b16", "llama7b-prefill"]
                .map(String::from)
                .to_vec(),
            pretrained_trees: Some(as_it_came.clone()),
            fine_tuned_ensemble: Some(ensemble),
            ..validation(0.5, 0.5, None, 0.5)
        };
        // Behind on every network: refused, however it leads the criterion.
        let behind = networks(0.89, [0.6, 0.6, 0.8, 0.7]);
        assert_eq!(chosen(&v(behind.clone()), true), "pretrained+trees");
        // Behind on average but within the noise (ahead on two of four): kept.
        let mixed = networks(0.89, [0.9, 0.5, 1.0, 0.7]);
        let gain = v(mixed.clone())
            .with_gains(true)
            .fine_tuned_ensemble
            .unwrap();
        let by_network = gain.network_gain.unwrap();
        assert!(by_network.mean < 0.0 && by_network.z() > -TRANSFER_MAX_NETWORK_LOSS_Z);
        assert_eq!(chosen(&v(mixed), true), "fine-tuned+ensemble");
        // A candidate that passes wins over a better-scoring one that does not.
        let both = TransferValidation {
            fine_tuned_pretrained_trees: Some(networks(0.86, [0.85, 0.7, 0.9, 0.8])),
            ..v(behind.clone())
        };
        assert_eq!(chosen(&both, true), "fine-tuned+pretrained-trees");
        // Where the validation tasks fall in no known network, the criterion alone decides.
        let unknown = TransferValidation {
            networks: Vec::new(),
            pretrained_trees: Some(score(0.84)),
            fine_tuned_ensemble: Some(score(0.89)),
            ..v(behind)
        };
        assert_eq!(chosen(&unknown, true), "fine-tuned+ensemble");
    }

    #[test]
    fn the_transfer_criterion_weighs_top_k_beside_the_pairwise_order() {
        // Two tasks of five candidates (scores: higher is faster). Ranking A orders 9 of 10
        // pairs but picks a candidate 10x slower than the best first; ranking B picks the
        // best first and orders only 4 pairs.
        let task = |predicted: [f64; 5]| Ranked {
            predicted: predicted.to_vec(),
            latency: vec![1.0, 10.0, 11.0, 12.0, 13.0],
            weight: 1.0,
        };
        let a = [
            task([4.0, 5.0, 3.0, 2.0, 1.0]),
            task([4.0, 5.0, 3.0, 2.0, 1.0]),
        ];
        let b = [
            task([5.0, 1.0, 2.0, 3.0, 4.0]),
            task([5.0, 1.0, 2.0, 3.0, 4.0]),
        ];
        let (a, b) = (TransferScore::of(&a, &[]), TransferScore::of(&b, &[]));
        assert!(a.metrics.pairwise_accuracy > b.metrics.pairwise_accuracy);
        assert!(a.criterion < b.criterion, "{a:?} against {b:?}");
    }

    #[test]
    fn shots_drawn_task_by_task_hold_that_many_records_of_each_task() {
        // 40 tasks of 20 records; each record's latency names its task and index.
        let tasks: Vec<(String, f64)> = (0..40).map(|t| (format!("task{t}"), 1.0)).collect();
        let samples: Vec<Sample> = (0..40 * 20)
            .map(|i| Sample {
                task: i / 20,
                tokens: vec![0.0; WIDTH],
                latency: 1.0 + i as f64,
            })
            .collect();
        let data = Dataset::new(tasks, samples, WIDTH).unwrap();
        let per_task = |shots: &Dataset| -> Vec<usize> {
            let mut n: Vec<usize> = shots
                .by_task()
                .iter()
                .map(Vec::len)
                .filter(|&n| n > 0)
                .collect();
            n.sort_unstable();
            n
        };
        let (spread, test) = few_shot_split(&data, 128, None, 1).unwrap();
        let (grouped, test_too) = few_shot_split(&data, 128, Some(8), 1).unwrap();
        assert_eq!(grouped.samples.len(), 128);
        assert_eq!(per_task(&grouped), vec![8; 16]);
        // The same test half, and the shots only from the other one.
        assert_eq!(test.tasks, test_too.tasks);
        let tested: std::collections::BTreeSet<&String> =
            test.tasks.iter().map(|(k, _)| k).collect();
        for s in &grouped.samples {
            assert!(!tested.contains(&grouped.tasks[s.task].0));
        }
        // At random, the same 128 records spread over most of the half's 20 tasks.
        assert_eq!(spread.samples.len(), 128);
        assert!(per_task(&spread).len() > 16, "{:?}", per_task(&spread));
        // K not a multiple: the last task takes what is left; a task short of m gives all.
        let (odd, _) = few_shot_split(&data, 30, Some(8), 1).unwrap();
        assert_eq!(per_task(&odd), vec![6, 8, 8, 8]);
        let (all, _) = few_shot_split(&data, 1000, Some(50), 1).unwrap();
        assert_eq!(per_task(&all), vec![20; 20]);
        // Fewer tasks than K needs at m each: m of every task, the rest at random.
        let (filled, _) = few_shot_split(&data, 200, Some(8), 1).unwrap();
        assert_eq!(filled.samples.len(), 200);
        let n = per_task(&filled);
        assert_eq!(n.len(), 20);
        assert!(n.iter().all(|&c| c >= 8), "{n:?}");
        let mut latencies: Vec<u64> = filled.samples.iter().map(|s| s.latency as u64).collect();
        latencies.sort_unstable();
        latencies.dedup();
        assert_eq!(latencies.len(), 200, "no record drawn twice");
    }
}
