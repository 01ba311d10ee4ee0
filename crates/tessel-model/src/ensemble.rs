//! The ensemble that ships with a model: gradient-boosted trees fitted on the model's own
//! training records, added to the network's score.
//!
//! The held-out protocol found the two together rank better than either (the network orders
//! pairs, the trees catch what pooled features say plainly). A ranking only compares
//! candidates of one task, so each part's score is divided by how much it spreads within a
//! task on the training records (the mean over tasks of its standard deviation) and the two
//! are summed: fixed scales, so a candidate's score never depends on which others it is
//! scored with.
//!
//! Ridge regression was a third part until 2026-12-05 (twelfth session). Leaving it out
//! raised `eval`'s top-1 on the test networks from 0.651 to 0.714 (top-5 0.878 to 0.847,
//! pairwise 0.849 to 0.853), and on int8 records after a transfer from 0.24 to 0.72: a
//! linear model on pooled features was confidently wrong on the heaviest tasks, where top-1
//! is decided. Files written with it still load; its part is not read.
//!
//! The trees see grouped rows ([`crate::rows`]) since 2026-12-05's thirteenth session; a
//! file records which rows its trees were fitted on, and files without that field were
//! fitted on pooled rows, which they keep getting.
//!
//! The companions live in `NAME.ensemble.json.gz` (JSON, gzip-compressed: 200 trees are
//! megabytes of text) beside `NAME.json` and `NAME.safetensors`; [`crate::Model::load`]
//! reads them when the file is there, and [`crate::Model::predict_ranking`] uses them.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::gbt::{Gbt, TreeObjective, TreeRecipe};
use crate::metrics;
use crate::rows::RowKind;
use crate::train::{TREE_ROWS, by_task, log_labels, tree_rows, tree_weights};
use crate::{Dataset, ModelError};

/// The trees fitted beside a model, and the scales that weigh the two.
#[derive(Clone)]
pub struct Companions {
    pub trees: Arc<Gbt>,
    /// How the trees were grown (files without it: the default recipe).
    pub recipe: TreeRecipe,
    /// The rows the trees were fitted on ([`crate::rows`]).
    pub rows: RowKind,
    /// Within-task spread of the network's and the trees' scores on the training records:
    /// each part is divided by its own before they are summed.
    pub scales: Scales,
    /// What each part counts once divided by its spread.
    pub weights: Weights,
    /// Records and tasks they were fitted on.
    pub records: usize,
    pub tasks: usize,
    /// Ranking trees boosted on from the ensemble's scores of another platform's records
    /// (`transfer`'s correction, [`Companions::corrected`]), each added to the sum in turn.
    /// Empty for companions fitted where they are used.
    pub corrections: Vec<Correction>,
}

/// What a transfer learned on top of the ensemble it carried: LambdaMART trees boosted from
/// the carried ensemble's scores of the new platform's records, on the same rows.
#[derive(Clone)]
pub struct Correction {
    pub trees: Arc<Gbt>,
    pub recipe: TreeRecipe,
    /// Records and tasks it was fitted on.
    pub records: usize,
    pub tasks: usize,
}

/// How a correction is grown: few shallow trees, since it learns from a few records a task
/// (three at 128 shots over 37 tasks); `transfer`'s validation judges it beside the rest.
/// Chosen on that validation (f32 FMA -> int8, 2026-12-06): 20 rounds of depth 2 scored
/// best or level-best at 128 and 512 shots among 5-100 rounds of depth 1-4; 50 rounds of
/// depth 3 fell 0.04 lower at 128 shots.
pub const CORRECTION_RECIPE: TreeRecipe = TreeRecipe {
    rounds: 20,
    depth: 2,
    rate: 0.1,
    subsample: 1.0,
    colsample: 1.0,
    bags: 1,
    objective: TreeObjective::Lambdarank,
    ndcg_at: 0,
};

/// Whether `recipe` can grow a correction: a valid recipe of LambdaMART trees, the only
/// objective that learns an order from the carried scores; the reason when not.
pub fn check_correction_recipe(recipe: &TreeRecipe) -> Result<(), String> {
    recipe.check()?;
    if recipe.objective != TreeObjective::Lambdarank {
        return Err(format!(
            "objective={} cannot learn an order from the carried scores (use objective=lambdarank)",
            recipe.objective
        ));
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Scales {
    pub model: f64,
    pub trees: f64,
}

/// What the network's and the trees' parts count in the sum, once divided by their spreads.
/// `pretrain` chooses them on its validation tasks ([`Companions::choose_mix`]); files
/// written before count both alike.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Weights {
    pub model: f64,
    pub trees: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Weights::from_tree_share(0.5)
    }
}

impl Weights {
    /// The weights that give the trees `share` of the sum (0: the network alone, 1: the
    /// trees alone); a share of 0.5 weighs both 1, as files without weights do.
    pub fn from_tree_share(share: f64) -> Weights {
        Weights {
            model: 2.0 * (1.0 - share),
            trees: 2.0 * share,
        }
    }

    /// The trees' share of the sum.
    pub fn tree_share(&self) -> f64 {
        self.trees / (self.model + self.trees)
    }
}

/// The trees' shares [`Companions::choose_mix`] tries.
pub const TREE_SHARES: [f64; 11] = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];

/// How the mix was chosen: every share tried with its selection criterion on the
/// validation tasks ([`crate::metrics::selection_criterion`]), and the share kept.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MixChoice {
    /// The trees' share kept.
    pub tree_share: f64,
    /// Every share tried, with its criterion.
    pub tried: Vec<(f64, f64)>,
    /// Validation tasks and records it was judged on.
    pub tasks: usize,
    pub records: usize,
}

#[derive(Serialize, Deserialize)]
struct File {
    format: String,
    width: usize,
    scales: Scales,
    /// Absent in files written before the mix was chosen: both parts alike.
    #[serde(default)]
    weights: Weights,
    records: usize,
    tasks: usize,
    /// Absent in files written before grouped rows: those were fitted on pooled rows.
    #[serde(default)]
    rows: RowKind,
    /// Absent in files written before recipes: the default one.
    #[serde(default)]
    recipe: TreeRecipe,
    trees: serde_json::Value,
    /// Absent in files written before corrections, and in those without one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    corrections: Vec<CorrectionFile>,
}

#[derive(Serialize, Deserialize)]
struct CorrectionFile {
    recipe: TreeRecipe,
    records: usize,
    tasks: usize,
    trees: serde_json::Value,
}

const FORMAT: &str = "tessel-ensemble";

/// The most a companion file may inflate to (the shipped one is under 5 MB).
const MAX_INFLATED: u64 = 256 << 20;

impl Companions {
    /// Fits the trees on `data` (log relative throughput from the rows of [`TREE_ROWS`],
    /// weighted by relative throughput) and the scales
    /// from their scores and the network's (`model_scores`, one per sample).
    pub fn fit(data: &Dataset, model_scores: &[f32], seed: u64) -> Result<Companions, ModelError> {
        Companions::fit_with(data, model_scores, seed, &TreeRecipe::default())
    }

    /// Fits as [`Companions::fit`] does, the trees grown by `recipe`.
    pub fn fit_with(
        data: &Dataset,
        model_scores: &[f32],
        seed: u64,
        recipe: &TreeRecipe,
    ) -> Result<Companions, ModelError> {
        if model_scores.len() != data.samples.len() {
            return Err(ModelError::Data(format!(
                "{} model scores for {} records",
                model_scores.len(),
                data.samples.len()
            )));
        }
        let rows = tree_rows(data, TREE_ROWS);
        let trees = match recipe.objective {
            TreeObjective::Regression => Gbt::fit_with(
                &rows,
                &log_labels(data),
                Some(&tree_weights(data)),
                seed,
                recipe,
            )?,
            TreeObjective::Lambdarank => {
                let relevance: Vec<f64> = (0..data.samples.len()).map(|i| data.label(i)).collect();
                let groups: Vec<usize> = data.samples.iter().map(|s| s.task).collect();
                Gbt::fit_ranked(&rows, &relevance, &groups, seed, recipe)?
            }
        };
        let tree_scores = trees.predict(&rows);
        // A program the network could not score (`f32::MIN`) says nothing about its spread.
        let model_scores: Vec<f64> = model_scores
            .iter()
            .map(|&s| if s == f32::MIN { f64::NAN } else { s as f64 })
            .collect();
        let scales = Scales {
            model: within_task_spread(data, &model_scores),
            trees: within_task_spread(data, &tree_scores),
        };
        Ok(Companions {
            trees: Arc::new(trees),
            recipe: *recipe,
            rows: TREE_ROWS,
            scales,
            weights: Weights::default(),
            records: data.samples.len(),
            tasks: data.tasks.len(),
            corrections: Vec::new(),
        })
    }

    /// Ensemble scores for programs given by the network's scores and their raw tokens.
    /// Programs the network could not score (`f32::MIN`) keep that score.
    pub fn scores(&self, model_scores: &[f32], tokens: &[&[f32]], width: usize) -> Vec<f32> {
        let rows: Vec<Vec<f64>> = tokens.par_iter().map(|t| self.rows.row(t, width)).collect();
        self.scores_of_rows(model_scores, &rows)
            .into_iter()
            .map(|s| s.map_or(f32::MIN, |s| s as f32))
            .collect()
    }

    /// Each program's score from the network's and its tree rows, corrections included;
    /// None where the network could not score it or the sum is not finite.
    fn scores_of_rows(&self, model_scores: &[f32], rows: &[Vec<f64>]) -> Vec<Option<f64>> {
        let trees = self.trees.predict(rows);
        let corrections: Vec<Vec<f64>> = self
            .corrections
            .iter()
            .map(|c| c.trees.predict(rows))
            .collect();
        model_scores
            .par_iter()
            .zip(trees)
            .enumerate()
            .map(|(i, (&m, t))| {
                let base = self.combine(m, t, self.weights);
                if base == f32::MIN {
                    return None;
                }
                let s = base as f64 + corrections.iter().map(|c| c[i]).sum::<f64>();
                s.is_finite().then_some(s)
            })
            .collect()
    }

    /// These companions with one more correction, fitted on `data` (records of the platform
    /// a model is carried to; `model_scores` the network's score of each): LambdaMART trees
    /// grown by `recipe`, boosted from the ensemble's score of each record, so that they
    /// learn only what the carried ensemble orders wrongly there. Records the network cannot
    /// score are left out.
    pub fn corrected(
        &self,
        data: &Dataset,
        model_scores: &[f32],
        seed: u64,
        recipe: &TreeRecipe,
    ) -> Result<Companions, ModelError> {
        check_correction_recipe(recipe)
            .map_err(|e| ModelError::Data(format!("correction: {e}")))?;
        if model_scores.len() != data.samples.len() {
            return Err(ModelError::Data(format!(
                "{} model scores for {} records",
                model_scores.len(),
                data.samples.len()
            )));
        }
        let rows = tree_rows(data, self.rows);
        let base = self.scores_of_rows(model_scores, &rows);
        let keep: Vec<usize> = (0..rows.len()).filter(|&i| base[i].is_some()).collect();
        if keep.is_empty() {
            return Err(ModelError::Data(
                "no record the carried ensemble can score to correct".into(),
            ));
        }
        let trees = Gbt::fit_ranked_from(
            &keep.iter().map(|&i| rows[i].clone()).collect::<Vec<_>>(),
            &keep.iter().map(|&i| data.label(i)).collect::<Vec<_>>(),
            &keep
                .iter()
                .map(|&i| data.samples[i].task)
                .collect::<Vec<_>>(),
            Some(&keep.iter().filter_map(|&i| base[i]).collect::<Vec<_>>()),
            seed,
            recipe,
        )?;
        let mut out = self.clone();
        out.corrections.push(Correction {
            trees: Arc::new(trees),
            recipe: *recipe,
            records: keep.len(),
            tasks: keep
                .iter()
                .map(|&i| data.samples[i].task)
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
        });
        Ok(out)
    }

    /// One program's ensemble score from the network's and the trees' scores.
    fn combine(&self, model: f32, trees: f64, w: Weights) -> f32 {
        if model == f32::MIN {
            return model;
        }
        let s = w.model * model as f64 / self.scales.model + w.trees * trees / self.scales.trees;
        if s.is_finite() { s as f32 } else { f32::MIN }
    }

    /// Chooses the weights on `val` (tasks neither part was fitted on; `model_scores` the
    /// network's score of each record): the trees' share among [`TREE_SHARES`] whose
    /// ranking scores best by the criterion early stopping uses, ties going to the share
    /// nearer an even mix. `val` without records keeps the weights.
    pub fn choose_mix(
        &mut self,
        val: &Dataset,
        model_scores: &[f32],
    ) -> Result<MixChoice, ModelError> {
        if model_scores.len() != val.samples.len() {
            return Err(ModelError::Data(format!(
                "{} model scores for {} validation records",
                model_scores.len(),
                val.samples.len()
            )));
        }
        let trees = self.trees.predict(&tree_rows(val, self.rows));
        let mut tried = Vec::new();
        for share in TREE_SHARES {
            let w = Weights::from_tree_share(share);
            let scores = model_scores
                .iter()
                .zip(&trees)
                .map(|(&m, &t)| self.combine(m, t, w) as f64);
            let (_, criterion) = metrics::evaluate_with_criterion(&by_task(val, scores));
            tried.push((share, criterion));
        }
        let best = tried
            .iter()
            .copied()
            .filter(|(_, c)| c.is_finite())
            .max_by(|a, b| {
                a.1.total_cmp(&b.1)
                    .then((b.0 - 0.5).abs().total_cmp(&(a.0 - 0.5).abs()))
            });
        if let Some((share, _)) = best.filter(|_| !val.samples.is_empty()) {
            self.weights = Weights::from_tree_share(share);
        }
        Ok(MixChoice {
            tree_share: self.weights.tree_share(),
            tried,
            tasks: val.tasks.len(),
            records: val.samples.len(),
        })
    }

    /// Where the companions of the model at `path` live (`m/model` ->
    /// `m/model.ensemble.json.gz`).
    pub fn path(model_path: &Path) -> PathBuf {
        let (weights, _) = crate::Model::paths(model_path);
        weights.with_extension("ensemble.json.gz")
    }

    pub fn save(&self, model_path: &Path, width: usize) -> Result<(), ModelError> {
        let path = Companions::path(model_path);
        let file = File {
            format: FORMAT.into(),
            width,
            scales: self.scales,
            records: self.records,
            tasks: self.tasks,
            rows: self.rows,
            recipe: self.recipe,
            weights: self.weights,
            trees: self.trees.to_json()?,
            corrections: self
                .corrections
                .iter()
                .map(|c| {
                    Ok(CorrectionFile {
                        recipe: c.recipe,
                        records: c.records,
                        tasks: c.tasks,
                        trees: c.trees.to_json()?,
                    })
                })
                .collect::<Result<_, ModelError>>()?,
        };
        let text = serde_json::to_vec(&file).map_err(|e| ModelError::Format {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let mut gz = GzEncoder::new(Vec::new(), Compression::best());
        gz.write_all(&text)
            .and_then(|()| gz.finish())
            .and_then(|bytes| std::fs::write(&path, bytes))
            .map_err(|source| ModelError::Io { path, source })
    }

    /// Reads the companions of the model at `model_path` for features of `width` columns:
    /// `Ok(None)` when there is no such file, an error naming the file when it is not one.
    pub fn load(model_path: &Path, width: usize) -> Result<Option<Companions>, ModelError> {
        let path = Companions::path(model_path);
        if !path.exists() {
            return Ok(None);
        }
        let format = |reason: String| ModelError::Format {
            path: path.clone(),
            reason,
        };
        if !path.is_file() {
            return Err(format("not a regular file".into()));
        }
        let bytes = std::fs::read(&path).map_err(|source| ModelError::Io {
            path: path.clone(),
            source,
        })?;
        // A bounded read: a small file that inflates without end is not a model.
        let mut text = Vec::new();
        GzDecoder::new(&bytes[..])
            .take(MAX_INFLATED)
            .read_to_end(&mut text)
            .map_err(|e| format(format!("not gzip-compressed JSON ({e})")))?;
        if text.len() as u64 >= MAX_INFLATED {
            return Err(format(format!("inflates past {MAX_INFLATED} bytes")));
        }
        let file: File = serde_json::from_slice(&text).map_err(|e| format(e.to_string()))?;
        if file.format != FORMAT {
            return Err(format(format!(
                "format is `{}`, not `{FORMAT}`",
                file.format
            )));
        }
        if file.width != width {
            return Err(format(format!(
                "fitted on features of {} columns, the model takes {width}",
                file.width
            )));
        }
        let columns = file.rows.len(width);
        let trees = checked_trees(&file.trees, &file.recipe, columns)
            .map_err(|e| format(format!("trees: {e}")))?;
        let corrections = file
            .corrections
            .iter()
            .enumerate()
            .map(|(i, c)| {
                check_correction_recipe(&c.recipe)
                    .map_err(|e| format(format!("correction {i}: {e}")))?;
                Ok(Correction {
                    trees: Arc::new(
                        checked_trees(&c.trees, &c.recipe, columns)
                            .map_err(|e| format(format!("correction {i}: {e}")))?,
                    ),
                    recipe: c.recipe,
                    records: c.records,
                    tasks: c.tasks,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let s = file.scales;
        if ![s.model, s.trees].iter().all(|v| v.is_finite() && *v > 0.0) {
            return Err(format(format!("scales {s:?} must be positive numbers")));
        }
        let w = file.weights;
        if ![w.model, w.trees]
            .iter()
            .all(|v| v.is_finite() && *v >= 0.0)
            || w.model + w.trees <= 0.0
        {
            return Err(format(format!(
                "weights {w:?} must be numbers of at least 0, not both 0"
            )));
        }
        Ok(Some(Companions {
            trees: Arc::new(trees),
            recipe: file.recipe,
            rows: file.rows,
            scales: s,
            weights: w,
            records: file.records,
            tasks: file.tasks,
            corrections,
        }))
    }
}

/// Trees read from a companion file, checked against their recipe and the rows they take
/// (`columns`); the reason when they are not usable.
fn checked_trees(
    json: &serde_json::Value,
    recipe: &TreeRecipe,
    columns: usize,
) -> Result<Gbt, String> {
    recipe.check().map_err(|e| format!("recipe: {e}"))?;
    let trees = Gbt::from_json(json)?;
    if trees.bags() != recipe.bags {
        return Err(format!(
            "{} boosters, the recipe says bags={}",
            trees.bags(),
            recipe.bags
        ));
    }
    if trees.columns() != columns {
        return Err(format!(
            "they take {} columns, the rows have {columns}",
            trees.columns()
        ));
    }
    // A booster that parses but cannot predict (a tree pointing past its nodes) must fail
    // here, not in the middle of a search.
    let probe = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        trees.predict(&[vec![0.0; columns]])
    }));
    match probe {
        Ok(v) if v.len() == 1 && v[0].is_finite() => Ok(trees),
        _ => Err("they do not predict a finite score".into()),
    }
}

/// The mean over tasks (of two or more samples) of the standard deviation of `scores` within
/// the task; 1 where there is no spread to measure.
fn within_task_spread(data: &Dataset, scores: &[f64]) -> f64 {
    let mut sum = 0.0;
    let mut n = 0usize;
    for group in data.by_task() {
        let v: Vec<f64> = group
            .iter()
            .map(|&i| scores[i])
            .filter(|s| s.is_finite())
            .collect();
        if v.len() < 2 {
            continue;
        }
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
        if var.is_finite() {
            sum += var.sqrt();
            n += 1;
        }
    }
    let spread = if n > 0 { sum / n as f64 } else { 1.0 };
    if spread.is_finite() && spread > 1e-12 {
        spread
    } else {
        1.0
    }
}
