//! Training: batches drawn per task, LambdaRank / pairwise / MSE losses, AdamW with warm-up and
//! a cosine schedule, early stopping on a validation split made by task, transfer modes.

use std::time::Instant;

use candle_core::{Device, Tensor, Var};
use candle_nn::optim::{AdamW, Optimizer, ParamsAdamW};
use rayon::prelude::*;
use serde::Serialize;

use crate::metrics::{self, Metrics, Ranked};
use crate::net::{self, InitRng};
use crate::rows::RowKind;
use crate::{Companions, Dataset, Model, ModelError, Normalizer};

/// The training objective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// Pairwise logistic loss within a task, each pair weighted by how much swapping it
    /// changes the task's NDCG (LambdaRank).
    LambdaRank,
    /// Pairwise logistic loss within a task.
    Pairwise,
    /// Squared error on log relative throughput.
    Mse,
}

impl std::str::FromStr for Loss {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lambdarank" => Ok(Loss::LambdaRank),
            "pairwise" => Ok(Loss::Pairwise),
            "mse" => Ok(Loss::Mse),
            other => Err(format!(
                "unknown loss `{other}` (expected lambdarank, pairwise or mse)"
            )),
        }
    }
}

/// Which parameters train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trainable {
    All,
    /// Transfer: the attention backbone is frozen; embedding and head retrain.
    HeadAndEmbedding,
}

#[derive(Clone, Debug, Serialize)]
pub struct TrainOptions {
    pub loss: Loss,
    pub epochs: usize,
    pub lr: f64,
    pub weight_decay: f64,
    /// Share of all steps spent warming the learning rate up.
    pub warmup: f64,
    /// Tasks per batch, and candidates drawn from each.
    pub tasks_per_batch: usize,
    pub group_size: usize,
    /// Steps per epoch (default: about one pass over the training samples, at least 16).
    pub steps_per_epoch: Option<usize>,
    /// Share of tasks held out for validation and early stopping (0: none), chosen by their
    /// keys ([`split_tasks_by_key`]).
    pub val_fraction: f64,
    /// The validation tasks by index, instead of a share of them (`pretrain` passes the split
    /// it saves with the model).
    #[serde(skip)]
    pub val_tasks: Option<Vec<usize>>,
    /// Early stopping: epochs in a row that the leading epoch beats by
    /// [`EPOCH_MIN_GAIN_Z`] standard errors of the per-task gain before training stops.
    pub patience: usize,
    pub trainable: Trainable,
    pub seed: u64,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            loss: Loss::LambdaRank,
            epochs: 30,
            lr: 2e-3,
            weight_decay: 1e-4,
            warmup: 0.05,
            tasks_per_batch: 4,
            group_size: 32,
            steps_per_epoch: None,
            val_fraction: 0.2,
            val_tasks: None,
            patience: 8,
            trainable: Trainable::All,
            seed: 1,
        }
    }
}

/// One epoch's figures.
#[derive(Clone, Debug, Serialize)]
pub struct EpochReport {
    pub epoch: usize,
    pub steps: usize,
    pub train_loss: f64,
    pub lr: f64,
    /// Validation metrics (absent without a validation split).
    pub val: Option<Metrics>,
    /// Training throughput: programs through forward and backward per second.
    pub programs_per_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct TrainReport {
    pub epochs: Vec<EpochReport>,
    /// The epoch whose weights the model keeps: the latest one the best on validation does
    /// not lead by [`EPOCH_MIN_GAIN_Z`] standard errors ([`kept_epoch`]).
    pub best_epoch: usize,
    /// The epoch with the best validation criterion (the kept one, or an earlier one whose
    /// lead was within the noise).
    pub leading_epoch: usize,
    pub train_tasks: usize,
    pub val_tasks: usize,
}

/// Splits the tasks of `data` into (train, validation) by their keys: a task is in
/// validation when its seeded hash is among the `val_fraction` smallest. Unlike
/// [`split_tasks`], which splits positions, a task keeps its side however the records are
/// ordered: a dataset whose records were measured again (appended, the old ones superseded)
/// splits as before, so tasks a model was validated on stay unseen by its trees. (Positional
/// splits moved 30 of 42 validation tasks after the 2026-12-05 remeasures.)
pub fn split_tasks_by_key(
    data: &Dataset,
    val_fraction: f64,
    seed: u64,
) -> (Vec<usize>, Vec<usize>) {
    let n = data.tasks.len();
    let mut order: Vec<(u64, usize)> = data
        .tasks
        .iter()
        .enumerate()
        .map(|(i, (key, _))| (key_hash(key, seed), i))
        .collect();
    order.sort_unstable();
    let val = order[..validation_count(n, val_fraction)]
        .iter()
        .map(|&(_, i)| i);
    with_the_rest(n, val)
}

/// How many of `n` tasks a share of `val_fraction` holds out: at least one and never all,
/// where there are two or more and the share is positive; none otherwise.
fn validation_count(n: usize, val_fraction: f64) -> usize {
    if n >= 2 && val_fraction > 0.0 {
        ((n as f64 * val_fraction).round() as usize).clamp(1, n - 1)
    } else {
        0
    }
}

/// (the other tasks of `0..n`, `val`), both ascending and without repeats; `val` must be
/// below `n`.
fn with_the_rest(n: usize, val: impl IntoIterator<Item = usize>) -> (Vec<usize>, Vec<usize>) {
    let val: std::collections::BTreeSet<usize> = val.into_iter().collect();
    let rest = (0..n).filter(|i| !val.contains(i)).collect();
    (rest, val.into_iter().collect())
}

/// The tasks of `data` named by `keys` as validation, the rest as training: `Err` with the
/// keys `data` does not hold, or when nothing is left on one side.
pub fn split_tasks_named(
    data: &Dataset,
    keys: &[String],
) -> Result<(Vec<usize>, Vec<usize>), ModelError> {
    let (train, val) = with_the_rest(data.tasks.len(), tasks_named(data, keys)?);
    if train.is_empty() {
        return Err(ModelError::Data(format!(
            "{} validation tasks leave 0 to train on",
            val.len()
        )));
    }
    Ok((train, val))
}

/// The indices (ascending) of the tasks of `data` named by `keys`: `Err` naming keys that
/// `data` does not hold, or when no key is given.
pub fn tasks_named(data: &Dataset, keys: &[String]) -> Result<Vec<usize>, ModelError> {
    let wanted: std::collections::HashSet<&str> = keys.iter().map(String::as_str).collect();
    if wanted.is_empty() {
        return Err(ModelError::Data("no task named".into()));
    }
    let found: Vec<usize> = (0..data.tasks.len())
        .filter(|&i| wanted.contains(data.tasks[i].0.as_str()))
        .collect();
    if found.len() != wanted.len() {
        let held: std::collections::HashSet<&str> =
            data.tasks.iter().map(|(k, _)| k.as_str()).collect();
        let missing: Vec<&str> = keys
            .iter()
            .map(String::as_str)
            .filter(|k| !held.contains(k))
            .take(3)
            .collect();
        return Err(ModelError::Data(format!(
            "{} of {} named tasks are not in the data (e.g. `{}`)",
            wanted.len() - found.len(),
            wanted.len(),
            missing.join("`, `")
        )));
    }
    Ok(found)
}

/// FNV-1a over the key's bytes, then a SplitMix64 finish with the seed mixed in.
fn key_hash(key: &str, seed: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let mut z = h ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Splits task indices into (train, validation) by position, seeded: for splits made and
/// used within one run. Splits a saved model is later judged by use [`split_tasks_by_key`].
pub fn split_tasks(n: usize, val_fraction: f64, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = InitRng::new(seed ^ 0x5eed);
    for i in (1..n).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    let val = order[..validation_count(n, val_fraction)].iter().copied();
    with_the_rest(n, val)
}

/// Rankings of every task of `data` by `model`'s network.
pub fn rank(model: &mut Model, data: &Dataset) -> Vec<Ranked> {
    let scores = model.predict(&sample_tokens(data));
    by_task(data, scores.into_iter().map(f64::from))
}

/// Rankings of every task of `data` as a search ranks them: the network with the model's
/// companions where it has them (`ensemble`), the network alone otherwise.
pub fn rank_ensemble(model: &mut Model, data: &Dataset) -> Vec<Ranked> {
    let scores = model.predict_ranking(&sample_tokens(data));
    by_task(data, scores.into_iter().map(f64::from))
}

/// Every sample's raw tokens, in sample order.
pub fn sample_tokens(data: &Dataset) -> Vec<&[f32]> {
    data.samples.iter().map(|s| &s.tokens[..]).collect()
}

/// Groups per-sample scores (in sample order) into one ranking per task of `data`.
pub(crate) fn by_task(data: &Dataset, scores: impl Iterator<Item = f64>) -> Vec<Ranked> {
    let mut out: Vec<Ranked> = data
        .tasks
        .iter()
        .map(|(_, w)| Ranked {
            weight: *w,
            predicted: Vec::new(),
            latency: Vec::new(),
        })
        .collect();
    for (s, score) in data.samples.iter().zip(scores) {
        out[s.task].predicted.push(score);
        out[s.task].latency.push(s.latency);
    }
    out
}

/// A padded batch: tokens, mask, labels and the task of each row.
struct Batch {
    x: Tensor,
    mask: Tensor,
    /// Each row's roofline prior, where the model adds it.
    prior: Option<Tensor>,
    labels: Vec<f64>,
    groups: Vec<usize>,
}

fn make_batch(model: &Model, data: &Dataset, rows: &[usize]) -> Result<Batch, ModelError> {
    let w = data.width;
    let t_max = rows
        .iter()
        .map(|&i| data.samples[i].tokens.len() / w)
        .max()
        .unwrap_or(1);
    let mut x = vec![0f32; rows.len() * t_max * w];
    let mut mask = vec![0f32; rows.len() * t_max];
    let mut buf = Vec::new();
    for (r, &i) in rows.iter().enumerate() {
        let s = &data.samples[i];
        model.info.normalizer.apply(&s.tokens, &mut buf);
        let n = s.tokens.len() / w;
        x[r * t_max * w..r * t_max * w + n * w].copy_from_slice(&buf);
        mask[r * t_max..r * t_max + n]
            .iter_mut()
            .for_each(|m| *m = 1.0);
    }
    let prior = if model.info.config.prior {
        let p: Vec<f32> = rows
            .iter()
            .map(|&i| crate::prior_score(&data.samples[i].tokens, w))
            .collect();
        Some(Tensor::from_vec(p, rows.len(), &Device::Cpu)?)
    } else {
        None
    };
    Ok(Batch {
        prior,
        x: Tensor::from_vec(x, (rows.len(), t_max, w), &Device::Cpu)?,
        mask: Tensor::from_vec(mask, (rows.len(), t_max), &Device::Cpu)?,
        labels: rows.iter().map(|&i| data.label(i)).collect(),
        groups: rows.iter().map(|&i| data.samples[i].task).collect(),
    })
}

/// `log(1 + exp(x))`, stable for large |x|.
fn softplus(x: &Tensor) -> candle_core::Result<Tensor> {
    x.relu()? + ((x.abs()?.neg()?.exp()? + 1.0)?.log()?)
}

/// The loss of a batch given its scores `[N]`.
fn batch_loss(loss: Loss, scores: &Tensor, b: &Batch) -> Result<Tensor, ModelError> {
    let n = b.labels.len();
    if loss == Loss::Mse {
        let target: Vec<f32> = b.labels.iter().map(|y| y.max(1e-6).ln() as f32).collect();
        let target = Tensor::from_vec(target, n, &Device::Cpu)?;
        return Ok((scores - target)?.sqr()?.mean_all()?);
    }
    // Pair weights: (i, j) in the same task with i faster than j.
    let s: Vec<f32> = scores.to_vec1()?;
    let mut rank = vec![0usize; n];
    let mut ideal = vec![0f64; n];
    if loss == Loss::LambdaRank {
        let mut groups: Vec<usize> = b.groups.clone();
        groups.sort_unstable();
        groups.dedup();
        for g in groups {
            let mut members: Vec<usize> = (0..n).filter(|&i| b.groups[i] == g).collect();
            members.sort_by(|&x, &y| s[y].total_cmp(&s[x]));
            for (r, &i) in members.iter().enumerate() {
                rank[i] = r;
            }
            let mut gains: Vec<f64> = members.iter().map(|&i| b.labels[i]).collect();
            gains.sort_by(|x, y| y.total_cmp(x));
            let idcg: f64 = gains
                .iter()
                .enumerate()
                .map(|(r, g)| g / (r as f64 + 2.0).log2())
                .sum();
            for &i in &members {
                ideal[i] = idcg.max(1e-12);
            }
        }
    }
    let mut weights = vec![0f32; n * n];
    let mut total = 0f64;
    for i in 0..n {
        for j in 0..n {
            if b.groups[i] != b.groups[j] || b.labels[i] <= b.labels[j] {
                continue;
            }
            let w = match loss {
                Loss::LambdaRank => {
                    let disc = |r: usize| 1.0 / (r as f64 + 2.0).log2();
                    (b.labels[i] - b.labels[j]).abs() * (disc(rank[i]) - disc(rank[j])).abs()
                        / ideal[i]
                        + 1e-6
                }
                _ => 1.0,
            };
            weights[i * n + j] = w as f32;
            total += w;
        }
    }
    if total == 0.0 {
        // No ordered pair (a single candidate per task): nothing to learn from this batch.
        return Ok((scores.sum_all()? * 0.0)?);
    }
    let weights = Tensor::from_vec(weights, (n, n), &Device::Cpu)?;
    let diff = scores.unsqueeze(1)?.broadcast_sub(&scores.unsqueeze(0)?)?; // s_i - s_j
    let l = (softplus(&diff.neg()?)? * weights)?.sum_all()?;
    Ok((l / total)?)
}

/// The variables `trainable` selects.
fn trainable_vars(model: &Model, trainable: Trainable) -> Vec<Var> {
    model
        .params
        .names
        .iter()
        .zip(&model.params.vars)
        .filter(|(n, _)| trainable == Trainable::All || !net::is_backbone(n))
        .map(|(_, v)| v.clone())
        .collect()
}

/// Draws a batch of row indices: `tasks_per_batch` tasks, up to `group_size` samples each.
fn draw(groups: &[Vec<usize>], opts: &TrainOptions, rng: &mut InitRng) -> Vec<usize> {
    let usable: Vec<&Vec<usize>> = groups.iter().filter(|g| !g.is_empty()).collect();
    let mut rows = Vec::new();
    if usable.is_empty() {
        return rows;
    }
    for _ in 0..opts.tasks_per_batch.max(1) {
        let g = usable[(rng.next_u64() % usable.len() as u64) as usize];
        let mut pool = g.to_vec();
        let take = opts.group_size.max(2).min(pool.len());
        for k in 0..take {
            let j = k + (rng.next_u64() % (pool.len() - k) as u64) as usize;
            pool.swap(k, j);
        }
        rows.extend_from_slice(&pool[..take]);
    }
    rows
}

/// One optimisation step on `rows`; returns the loss.
pub(crate) fn step(
    model: &mut Model,
    data: &Dataset,
    rows: &[usize],
    loss: Loss,
    opt: &mut AdamW,
) -> Result<f64, ModelError> {
    let b = make_batch(model, data, rows)?;
    let mut scores = net::forward(&model.params, &model.info.config, &b.x, &b.mask)?;
    if let Some(prior) = &b.prior {
        scores = (scores + prior)?;
    }
    let l = batch_loss(loss, &scores, &b)?;
    let value = l.to_scalar::<f32>()? as f64;
    opt.backward_step(&l)?;
    model.invalidate();
    Ok(value)
}

pub(crate) fn optimizer(
    model: &Model,
    trainable: Trainable,
    lr: f64,
    weight_decay: f64,
) -> Result<AdamW, ModelError> {
    Ok(AdamW::new(
        trainable_vars(model, trainable),
        ParamsAdamW {
            lr,
            weight_decay,
            ..ParamsAdamW::default()
        },
    )?)
}

/// Trains `model` on `data`. A model with identity normalisation (fresh) gets its
/// normalisation fitted on the training tasks; a pretrained one keeps its own (transfer).
/// Keeps the weights of the best validation epoch.
pub fn train(
    model: &mut Model,
    data: &Dataset,
    opts: &TrainOptions,
    on_epoch: &mut dyn FnMut(&EpochReport),
) -> Result<TrainReport, ModelError> {
    if data.width != model.info.config.width {
        return Err(ModelError::Data(format!(
            "samples have {} columns, the model {}",
            data.width, model.info.config.width
        )));
    }
    if data.samples.is_empty() {
        return Err(ModelError::Data("no samples to train on".into()));
    }
    let (train_ids, val_ids) = match &opts.val_tasks {
        Some(val) => {
            if let Some(&bad) = val.iter().find(|&&i| i >= data.tasks.len()) {
                return Err(ModelError::Data(format!(
                    "validation task {bad} of {} tasks",
                    data.tasks.len()
                )));
            }
            with_the_rest(data.tasks.len(), val.iter().copied())
        }
        None => split_tasks_by_key(data, opts.val_fraction, opts.seed),
    };
    let train_set = data.subset(&train_ids);
    let val_set = data.subset(&val_ids);
    if model.info.normalizer == Normalizer::identity(data.width) {
        model.info.normalizer = Normalizer::fit(&train_set);
    }
    let groups = train_set.by_task();
    let per_step = opts.tasks_per_batch.max(1) * opts.group_size.max(2);
    let steps = opts
        .steps_per_epoch
        .unwrap_or_else(|| train_set.samples.len().div_ceil(per_step).max(16))
        .max(1);
    let total_steps = (steps * opts.epochs.max(1)) as f64;
    let warmup = (opts.warmup * total_steps).max(1.0);
    let mut opt = optimizer(model, opts.trainable, opts.lr, opts.weight_decay)?;
    let mut rng = InitRng::new(opts.seed);
    let mut report = TrainReport {
        epochs: Vec::new(),
        best_epoch: 0,
        leading_epoch: 0,
        train_tasks: train_ids.len(),
        val_tasks: val_ids.len(),
    };
    // Every epoch's weights with its validation figures, for the choice at the end.
    let mut candidates: Vec<EpochCandidate> = Vec::new();
    let mut behind = 0;
    let mut global = 0usize;
    for epoch in 1..=opts.epochs.max(1) {
        let start = Instant::now();
        let mut loss_sum = 0.0;
        let mut programs = 0usize;
        let mut lr = opts.lr;
        for _ in 0..steps {
            let progress = global as f64 / total_steps;
            lr = opts.lr
                * (global as f64 / warmup).clamp(0.05, 1.0)
                * 0.5
                * (1.0 + (std::f64::consts::PI * progress).cos());
            opt.set_learning_rate(lr);
            let rows = draw(&groups, opts, &mut rng);
            loss_sum += step(model, &train_set, &rows, opts.loss, &mut opt)?;
            programs += rows.len();
            global += 1;
        }
        let elapsed = start.elapsed().as_secs_f64();
        let ranked = (!val_set.samples.is_empty()).then(|| rank(model, &val_set));
        let val = ranked.as_deref().map(metrics::evaluate);
        let e = EpochReport {
            epoch,
            steps,
            train_loss: loss_sum / steps as f64,
            lr,
            val,
            programs_per_s: programs as f64 / elapsed.max(1e-9),
        };
        on_epoch(&e);
        // Validation criterion: `metrics::selection_criterion`. Without a split, the last
        // epoch is kept.
        let criterion = ranked
            .as_deref()
            .zip(val)
            .map_or(epoch as f64, |(tasks, m)| {
                metrics::selection_criterion(tasks, &m)
            });
        report.epochs.push(e);
        candidates.push(EpochCandidate {
            epoch,
            criterion,
            tasks: ranked
                .as_deref()
                .map(metrics::task_criteria)
                .unwrap_or_default(),
            weights: model.params.snapshot()?,
        });
        // Stop once `patience` epochs in a row fall behind the leading one beyond the noise:
        // an epoch within it may still be the one kept.
        let last = candidates.len() - 1;
        let lead = &candidates[leading_epoch(candidates.iter().map(|c| c.criterion))].tasks;
        if metrics::paired_gain(lead, &candidates[last].tasks).clears(EPOCH_MIN_GAIN_Z) {
            behind += 1;
            if behind >= opts.patience.max(1) {
                break;
            }
        } else {
            behind = 0;
        }
    }
    let figures: Vec<(f64, &[f64])> = candidates
        .iter()
        .map(|c| (c.criterion, c.tasks.as_slice()))
        .collect();
    let (kept, leading) = kept_epoch(&figures);
    if let Some(c) = candidates.get(kept) {
        report.best_epoch = c.epoch;
        report.leading_epoch = candidates[leading].epoch;
        model.params.restore(&c.weights)?;
        model.invalidate();
    }
    Ok(report)
}

/// How many standard errors of the per-task gain an epoch's validation lead over a later
/// epoch must reach for training to keep it (the bar `refit-trees` and `transfer` use).
pub const EPOCH_MIN_GAIN_Z: f64 = 2.0;

/// The index of the best criterion, the earliest among equals (0 when there is none).
fn leading_epoch(criteria: impl Iterator<Item = f64>) -> usize {
    criteria
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
        .map_or(0, |(i, _)| i)
}

/// One epoch's weights and validation figures.
struct EpochCandidate {
    epoch: usize,
    criterion: f64,
    tasks: Vec<f64>,
    weights: Vec<Tensor>,
}

/// Which epoch to keep, by index into `epochs` (each epoch's selection criterion and
/// per-task criteria, in training order), and which led on the criterion: the latest
/// epoch that the leading one does not beat by [`EPOCH_MIN_GAIN_Z`] standard errors of the
/// per-task gain. With a few dozen validation tasks the criterion swings between epochs by
/// more than training changes it (seed 2 of the shipped recipe led at epoch 4 of 15 on 42
/// tasks; kept, its ensemble ranked the test networks at 0.840 top-1, and at 0.880 with epoch
/// 15), while the schedule's end is where the learning rate has annealed: an earlier epoch
/// is kept only when its lead is beyond the noise. Without validation figures (`tasks`
/// empty) no lead is significant and the last epoch is kept.
pub fn kept_epoch(epochs: &[(f64, &[f64])]) -> (usize, usize) {
    if epochs.is_empty() {
        return (0, 0);
    }
    let leading = leading_epoch(epochs.iter().map(|e| e.0));
    let lead = epochs[leading].1;
    let kept = (leading..epochs.len())
        .rev()
        .find(|&i| !metrics::paired_gain(lead, epochs[i].1).clears(EPOCH_MIN_GAIN_Z))
        .unwrap_or(leading);
    (kept, leading)
}

/// A model's figures beside the references: random scores and ridge regression on pooled
/// features (fitted on `train`, predicting log relative throughput).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Comparison {
    pub model: Metrics,
    pub random: Metrics,
    pub ridge: Metrics,
    /// Gradient-boosted trees on pooled and grouped features ([`crate::rows`]).
    pub gbt: Metrics,
    /// The analytic roofline estimate (`tessel_features::roofline`), fitted on nothing.
    pub roofline: Metrics,
}

pub fn compare(model: &mut Model, train: &Dataset, test: &Dataset, seed: u64) -> Comparison {
    compare_with_trees(model, train, test, seed, None)
}

/// [`compare`], its trees column from `trees` where given: companions fitted on `train` with
/// `seed` ([`Model::fit_companions`]), the very fit [`gbt_rank`] would repeat.
pub fn compare_with_trees(
    model: &mut Model,
    train: &Dataset,
    test: &Dataset,
    seed: u64,
    trees: Option<&Companions>,
) -> Comparison {
    let ranked = rank(model, test);
    let gbt = match trees {
        Some(c) => companion_ranks(c, test),
        None => gbt_rank(train, test, seed),
    };
    Comparison {
        model: metrics::evaluate(&ranked),
        random: metrics::random_baseline(&ranked, 20, seed),
        ridge: metrics::evaluate(&ridge_rank(train, test)),
        gbt: metrics::evaluate(&gbt),
        roofline: metrics::evaluate(&roofline_rank(test)),
    }
}

/// Rankings of every task of `data` by the analytic roofline estimate of each program (no
/// fitting: it reads the allocation features alone). Features of another width tie.
pub fn roofline_rank(data: &Dataset) -> Vec<Ranked> {
    let scores = data
        .samples
        .iter()
        .map(|s| crate::roofline_score(&s.tokens, data.width).unwrap_or(f64::NEG_INFINITY));
    by_task(data, scores)
}

/// Rankings of every task of `test` by gradient-boosted trees on the trees' rows
/// ([`TREE_ROWS`]), fitted on `train` to predict log relative throughput. Without training
/// records (or when the fit fails), every candidate scores the same, as an unfitted ridge does.
pub fn gbt_rank(train: &Dataset, test: &Dataset, seed: u64) -> Vec<Ranked> {
    let fitted = crate::gbt::Gbt::fit(
        &tree_rows(train, TREE_ROWS),
        &log_labels(train),
        Some(&tree_weights(train)),
        seed,
    )
    .ok();
    let scores = match fitted {
        Some(g) => g.predict(&tree_rows(test, TREE_ROWS)),
        None => vec![0.0; test.samples.len()],
    };
    by_task(test, scores.into_iter())
}

/// Rankings of every task of `test` by ridge regression on pooled features, fitted on `train`
/// to predict log relative throughput.
pub fn ridge_rank(train: &Dataset, test: &Dataset) -> Vec<Ranked> {
    let ridge = metrics::Ridge::fit(&pooled_rows(train), &log_labels(train), 1.0);
    let scores = pooled_rows(test).into_iter().map(|x| ridge.predict(&x));
    by_task(test, scores)
}

/// Rankings of every task of `test` by a model's trees, as [`gbt_rank`] gives them when
/// fitted on the companions' training set (the same fit, not repeated).
pub fn companion_ranks(companions: &Companions, test: &Dataset) -> Vec<Ranked> {
    by_task(
        test,
        companions
            .trees
            .predict(&tree_rows(test, companions.rows))
            .into_iter(),
    )
}

/// Ridge's input: every sample's pooled tokens.
pub(crate) fn pooled_rows(data: &Dataset) -> Vec<Vec<f64>> {
    tree_rows(data, RowKind::Pooled)
}

/// The rows newly fitted trees see (the trees baseline and a model's companions).
pub const TREE_ROWS: RowKind = RowKind::Grouped;

/// Each record's weight in the trees' loss: its relative throughput (1 for its task's best),
/// as TenSet's XGBoost model weighs its records. Top-1 is decided among the fast candidates;
/// an unweighted fit spends its splits telling slow ones apart. Measured with `held-out`
/// (1 epoch, trees column), grouped rows: top-1 0.64 -> 0.73 on the test networks and 0.50
/// -> 0.68 with five training networks held out instead.
pub(crate) fn tree_weights(data: &Dataset) -> Vec<f64> {
    (0..data.samples.len()).map(|i| data.label(i)).collect()
}

/// Every sample's row of `kind`.
pub(crate) fn tree_rows(data: &Dataset, kind: RowKind) -> Vec<Vec<f64>> {
    data.samples
        .par_iter()
        .map(|s| kind.row(&s.tokens, data.width))
        .collect()
}

/// The baselines' target: log relative throughput.
pub(crate) fn log_labels(data: &Dataset) -> Vec<f64> {
    (0..data.samples.len())
        .map(|i| data.label(i).ln())
        .collect()
}

/// Options for fine-tuning a pretrained model on a few records of a new platform or workload:
/// every weight at a tenth of the pretraining rate, or (`HeadAndEmbedding`) the attention
/// backbone frozen and the embedding and head retrained at the full rate. The model keeps the
/// normalisation it was pretrained with.
pub fn transfer_options(trainable: Trainable, pretrain: &TrainOptions) -> TrainOptions {
    TrainOptions {
        lr: match trainable {
            Trainable::All => pretrain.lr * 0.1,
            Trainable::HeadAndEmbedding => pretrain.lr,
        },
        warmup: 0.0,
        trainable,
        ..pretrain.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_early_lead_within_the_noise_keeps_the_last_epoch() {
        // Epoch 2 leads on the mean, but its per-task gains over the later epochs go both
        // ways: the last epoch is kept.
        let e1: &[f64] = &[0.70, 0.70, 0.70, 0.70];
        let e2: &[f64] = &[0.95, 0.60, 0.90, 0.75];
        let e3: &[f64] = &[0.80, 0.70, 0.75, 0.80];
        let e4: &[f64] = &[0.75, 0.80, 0.70, 0.85];
        let mean = |t: &[f64]| t.iter().sum::<f64>() / t.len() as f64;
        let epochs: Vec<(f64, &[f64])> = [e1, e2, e3, e4].iter().map(|t| (mean(t), *t)).collect();
        assert_eq!(kept_epoch(&epochs), (3, 1));
    }

    #[test]
    fn a_lead_beyond_the_noise_keeps_the_leading_epoch() {
        // Epoch 2 beats every later epoch on every task by about as much: it is kept over
        // epoch 4, whose own small lead over epoch 3 does not matter.
        let e1: &[f64] = &[0.70, 0.71, 0.72, 0.70, 0.69];
        let e2: &[f64] = &[0.90, 0.91, 0.92, 0.90, 0.89];
        let e3: &[f64] = &[0.70, 0.70, 0.71, 0.70, 0.70];
        let e4: &[f64] = &[0.71, 0.72, 0.71, 0.71, 0.70];
        let mean = |t: &[f64]| t.iter().sum::<f64>() / t.len() as f64;
        let epochs: Vec<(f64, &[f64])> = [e1, e2, e3, e4].iter().map(|t| (mean(t), *t)).collect();
        assert_eq!(kept_epoch(&epochs), (1, 1));
        // Without validation figures nothing is significant: the last epoch.
        let blind: Vec<(f64, &[f64])> = (1..=4).map(|e| (e as f64, &[][..])).collect();
        assert_eq!(kept_epoch(&blind), (3, 3));
        assert_eq!(kept_epoch(&[]), (0, 0));
    }
    use crate::Sample;

    /// A dataset of tasks named `keys`, one record each.
    fn dataset_of_tasks(keys: &[String]) -> Dataset {
        let tasks = keys.iter().map(|k| (k.clone(), 1.0)).collect();
        let samples = (0..keys.len())
            .map(|task| Sample {
                task,
                tokens: vec![1.0; 4],
                latency: 1.0,
            })
            .collect();
        Dataset::new(tasks, samples, 4).unwrap()
    }

    fn keys_of(data: &Dataset, ids: &[usize]) -> Vec<String> {
        let mut k: Vec<String> = ids.iter().map(|&i| data.tasks[i].0.clone()).collect();
        k.sort();
        k
    }

    proptest::proptest! {
        /// However the records (and so the tasks) are ordered, the same tasks validate.
        #[test]
        fn a_task_keeps_its_side_of_the_split_whatever_the_order(
            n in 2usize..80,
            rotate in 0usize..80,
            reverse: bool,
            seed: u64,
        ) {
            let keys: Vec<String> = (0..n).map(|i| format!("dense:m={i} @ avx2 @ zen")).collect();
            let mut moved = keys.clone();
            moved.rotate_left(rotate % n);
            if reverse {
                moved.reverse();
            }
            let (a, b) = (dataset_of_tasks(&keys), dataset_of_tasks(&moved));
            let (ta, va) = split_tasks_by_key(&a, 0.2, seed);
            let (tb, vb) = split_tasks_by_key(&b, 0.2, seed);
            proptest::prop_assert_eq!(keys_of(&a, &va), keys_of(&b, &vb));
            proptest::prop_assert_eq!(keys_of(&a, &ta), keys_of(&b, &tb));
            proptest::prop_assert_eq!(va.len(), ((n as f64 * 0.2).round() as usize).clamp(1, n - 1));
            proptest::prop_assert_eq!(ta.len() + va.len(), n);
        }
    }

    #[test]
    fn seeds_choose_other_tasks_and_no_share_means_no_validation() {
        let keys: Vec<String> = (0..50).map(|i| format!("task {i}")).collect();
        let data = dataset_of_tasks(&keys);
        let (_, v1) = split_tasks_by_key(&data, 0.2, 1);
        let (_, v2) = split_tasks_by_key(&data, 0.2, 2);
        assert_eq!(v1.len(), 10);
        assert_ne!(v1, v2);
        let (t, v) = split_tasks_by_key(&data, 0.0, 1);
        assert!(v.is_empty() && t.len() == 50);
    }

    #[test]
    fn named_validation_tasks_must_all_be_in_the_data_and_leave_some_to_train() {
        let keys: Vec<String> = (0..6).map(|i| format!("task {i}")).collect();
        let data = dataset_of_tasks(&keys);
        let (t, v) = split_tasks_named(&data, &keys[4..]).unwrap();
        assert_eq!((t, v), (vec![0, 1, 2, 3], vec![4, 5]));
        let e = split_tasks_named(&data, &["task 1".into(), "task 9".into()]).unwrap_err();
        assert!(
            e.to_string()
                .contains("1 of 2 named tasks are not in the data (e.g. `task 9`)"),
            "{e}"
        );
        let e = split_tasks_named(&data, &keys).unwrap_err();
        assert!(e.to_string().contains("leave 0 to train on"), "{e}");
        let e = split_tasks_named(&data, &[]).unwrap_err();
        assert!(e.to_string().contains("no task named"), "{e}");
        // Selecting tasks (eval --tasks) may take them all.
        assert_eq!(tasks_named(&data, &keys).unwrap(), vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn training_on_named_validation_tasks_holds_exactly_those_out() {
        let keys: Vec<String> = (0..5).map(|i| format!("task {i}")).collect();
        let data = dataset_of_tasks(&keys);
        let mut model = Model::new(crate::ModelConfig::new(4), 1).unwrap();
        let opts = TrainOptions {
            epochs: 1,
            steps_per_epoch: Some(1),
            val_tasks: Some(vec![3, 1]),
            ..TrainOptions::default()
        };
        let r = train(&mut model, &data, &opts, &mut |_| {}).unwrap();
        assert_eq!((r.train_tasks, r.val_tasks), (3, 2));
        let bad = TrainOptions {
            val_tasks: Some(vec![5]),
            ..opts
        };
        let e = train(&mut model, &data, &bad, &mut |_| {}).unwrap_err();
        assert!(
            e.to_string().contains("validation task 5 of 5 tasks"),
            "{e}"
        );
    }
}
