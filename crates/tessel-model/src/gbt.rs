//! The gradient-boosted-trees baseline that TenSet and TLP print beside learned cost models
//! (XGBoost there): forust's booster, an XGBoost-style GBM in pure Rust, with XGBoost's usual
//! settings. tessel fits it on the rows of [`crate::rows`] (pooled and grouped allocation
//! features, the roofline's terms) to predict log relative throughput, each record weighted
//! by its relative throughput as TenSet's XGBoost model does. A model that does not beat it
//! has not earned its attention layers; the shipped ensemble adds it to the network.

use std::fmt;
use std::str::FromStr;

use forust_ml::objective::ObjectiveType;
use forust_ml::sampler::SampleMethod;
use forust_ml::{GradientBooster, Matrix};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::ModelError;

/// How the trees are grown: boosting rounds, learning rate, depth, the share of rows and of
/// columns each tree sees, and how many boosters are averaged (bagging: each fitted with its
/// own seed on its own samples, which steadies a ranking that one booster's luck decides).
///
/// A spec string (`rounds=200,depth=6,rate=0.1,subsample=1,colsample=1,bags=1,objective=lambdarank`)
/// that parses and prints back; keys left out keep [`TreeRecipe::ensemble`]'s values, XGBoost's
/// usual settings grown as LambdaMART (TenSet's
/// XGBoost model uses depth 10 and a rate of 0.2 on far more data; depth 6 is XGBoost's
/// default).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TreeRecipe {
    pub rounds: usize,
    pub depth: usize,
    pub rate: f32,
    /// Share of rows each tree is grown on, in (0, 1].
    pub subsample: f32,
    /// Share of columns each tree may split on, in (0, 1].
    pub colsample: f64,
    /// Boosters averaged.
    pub bags: usize,
    /// What the trees learn (files from before objectives: regression).
    #[serde(default)]
    pub objective: TreeObjective,
    /// LambdaMART only: pairs are weighted by the change in NDCG at this many places
    /// (0: the whole task), so a swap below the top `ndcg_at` counts nothing and the trees
    /// spend their splits on what a top-k pick sees (XGBoost's `ndcg@k`, LightGBM's
    /// `lambdarank_truncation_level`). Files from before it: 0.
    #[serde(default)]
    pub ndcg_at: usize,
}

/// What a booster's trees are fitted to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TreeObjective {
    /// Squared error on log relative throughput, each record weighted by its relative
    /// throughput (TenSet's XGBoost model).
    #[default]
    Regression,
    /// LambdaMART: each round's tree is a Newton step on the LambdaRank gradients of every
    /// task's candidates (pairs weighted by how much swapping them changes the task's NDCG,
    /// gains the relative throughputs), as XGBoost's `rank:ndcg` and LightGBM's `lambdarank`
    /// grow them. Only the order within a task is learned, not a task's level.
    Lambdarank,
}

impl fmt::Display for TreeObjective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TreeObjective::Regression => "regression",
            TreeObjective::Lambdarank => "lambdarank",
        })
    }
}

impl FromStr for TreeObjective {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "regression" => Ok(TreeObjective::Regression),
            "lambdarank" => Ok(TreeObjective::Lambdarank),
            other => Err(format!(
                "unknown objective `{other}` (regression or lambdarank)"
            )),
        }
    }
}

impl Default for TreeRecipe {
    fn default() -> Self {
        TreeRecipe {
            rounds: 200,
            depth: 6,
            rate: 0.1,
            subsample: 1.0,
            colsample: 1.0,
            bags: 1,
            objective: TreeObjective::Regression,
            ndcg_at: 0,
        }
    }
}

/// The most rounds, depth and bags a recipe may ask for (beyond them a fit takes hours or a
/// file gigabytes).
const MAX_ROUNDS: usize = 10_000;
const MAX_DEPTH: usize = 16;
const MAX_BAGS: usize = 64;

impl TreeRecipe {
    /// What `pretrain`, `refit-trees` and `held-out` grow beside the network by default:
    /// the default recipe as LambdaMART. On the held-out protocol (2026-12-06, seeds 1 and 2)
    /// the ensemble with these trees ranked the test networks at 0.90 / 0.96 and 0.89 / 0.97
    /// top-1 / top-5, against 0.88 / 0.94 twice with regression trees.
    pub fn ensemble() -> TreeRecipe {
        TreeRecipe {
            objective: TreeObjective::Lambdarank,
            ..TreeRecipe::default()
        }
    }

    /// The recipe's values are in range (the parser checks this; so does [`Gbt::fit_with`]
    /// for recipes built in code).
    pub fn check(&self) -> Result<(), String> {
        let TreeRecipe {
            rounds,
            depth,
            rate,
            subsample,
            colsample,
            bags,
            objective,
            ndcg_at,
        } = *self;
        if !(1..=MAX_ROUNDS).contains(&rounds) {
            return Err(format!("rounds={rounds} is not in 1..={MAX_ROUNDS}"));
        }
        if !(1..=MAX_DEPTH).contains(&depth) {
            return Err(format!("depth={depth} is not in 1..={MAX_DEPTH}"));
        }
        if !(rate.is_finite() && rate > 0.0 && rate <= 1.0) {
            return Err(format!("rate={rate} is not in (0, 1]"));
        }
        if !(subsample.is_finite() && subsample > 0.0 && subsample <= 1.0) {
            return Err(format!("subsample={subsample} is not in (0, 1]"));
        }
        if !(colsample.is_finite() && colsample > 0.0 && colsample <= 1.0) {
            return Err(format!("colsample={colsample} is not in (0, 1]"));
        }
        if !(1..=MAX_BAGS).contains(&bags) {
            return Err(format!("bags={bags} is not in 1..={MAX_BAGS}"));
        }
        if ndcg_at > 0 && objective != TreeObjective::Lambdarank {
            return Err(format!(
                "ndcg_at={ndcg_at} weighs ranked pairs: it needs objective=lambdarank, not {objective}"
            ));
        }
        Ok(())
    }
}

impl fmt::Display for TreeRecipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rounds={},depth={},rate={},subsample={},colsample={},bags={},objective={}",
            self.rounds,
            self.depth,
            self.rate,
            self.subsample,
            self.colsample,
            self.bags,
            self.objective
        )?;
        // Only where set, so recipes from before it print as they did.
        if self.ndcg_at > 0 {
            write!(f, ",ndcg_at={}", self.ndcg_at)?;
        }
        Ok(())
    }
}

impl FromStr for TreeRecipe {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        // Keys left out keep what `pretrain` grows by default, so `--trees depth=8` changes
        // the depth of LambdaMART trees, not the objective too.
        let mut r = TreeRecipe::ensemble();
        let mut seen = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("`{part}` is not KEY=VALUE"))?;
            let (key, value) = (key.trim(), value.trim());
            if seen.contains(&key) {
                return Err(format!("`{key}` is given twice"));
            }
            let bad = |e: &dyn fmt::Display| format!("{key}=`{value}`: {e}");
            match key {
                "rounds" => r.rounds = value.parse().map_err(|e| bad(&e))?,
                "depth" => r.depth = value.parse().map_err(|e| bad(&e))?,
                "rate" => r.rate = value.parse().map_err(|e| bad(&e))?,
                "subsample" => r.subsample = value.parse().map_err(|e| bad(&e))?,
                "colsample" => r.colsample = value.parse().map_err(|e| bad(&e))?,
                "bags" => r.bags = value.parse().map_err(|e| bad(&e))?,
                "objective" => r.objective = value.parse().map_err(|e| bad(&e))?,
                "ndcg_at" => r.ndcg_at = value.parse().map_err(|e| bad(&e))?,
                _ => {
                    return Err(format!(
                        "unknown key `{key}` (rounds, depth, rate, subsample, colsample, bags, objective, ndcg_at)"
                    ));
                }
            }
            seen.push(key);
        }
        r.check()?;
        Ok(r)
    }
}

/// A fitted booster, or the average of several ([`TreeRecipe::bags`]).
pub struct Gbt {
    boosters: Vec<GradientBooster>,
    columns: usize,
    /// The same boosters laid out for prediction ([`Flat`]).
    flat: Vec<Flat>,
}

/// A booster's trees laid out for prediction: every node of every tree in one array, walked
/// row by row with the row in cache. forust predicts tree by tree over all rows, a parallel
/// pass and an allocation for each of 200 trees, reading each row's values column-major:
/// about 8.5 us a program on Zen 4, a tenth of the network's time. The leaves are summed in
/// forust's order from its base score, so the predictions are forust's, bit for bit.
struct Flat {
    base: f64,
    /// forust's missing value: NaN (its default) sends NaN down each split's missing branch;
    /// another value sends that value there.
    missing: f64,
    roots: Vec<u32>,
    nodes: Vec<FlatNode>,
}

#[derive(Clone, Copy)]
struct FlatNode {
    threshold: f64,
    leaf: f32,
    is_leaf: bool,
    feature: u32,
    left: u32,
    right: u32,
    missing: u32,
}

impl Flat {
    /// The trees forust predicts with (checked by [`check_booster`] or grown by forust:
    /// children come after their node, so every walk ends).
    fn of(b: &GradientBooster) -> Result<Flat, String> {
        let trees = &b.trees[..b
            .prediction_iteration
            .unwrap_or(b.trees.len())
            .min(b.trees.len())];
        let total: usize = trees.iter().map(|t| t.nodes.len()).sum();
        let index =
            |i: usize| u32::try_from(i).map_err(|_| format!("{total} nodes, too many to lay out"));
        let mut roots = Vec::with_capacity(trees.len());
        let mut nodes = Vec::with_capacity(total);
        for tree in trees {
            let at = nodes.len();
            roots.push(index(at)?);
            for n in &tree.nodes {
                nodes.push(FlatNode {
                    threshold: n.split_value,
                    leaf: n.weight_value,
                    is_leaf: n.is_leaf,
                    feature: index(n.split_feature)?,
                    left: index(at + n.left_child)?,
                    right: index(at + n.right_child)?,
                    missing: index(at + n.missing_node)?,
                });
            }
        }
        Ok(Flat {
            base: b.base_score,
            missing: b.missing,
            roots,
            nodes,
        })
    }

    /// Adds the booster's prediction for each row of `rows` to `sums` (a column past a
    /// row's end reads 0, as the column-major copy forust is handed pads it). Tree by tree
    /// over the block, so a tree's nodes stay in cache while every row walks it.
    fn add_predictions(&self, rows: &[Vec<f64>], sums: &mut [f64]) {
        let mut preds = vec![self.base; rows.len()];
        for &root in &self.roots {
            for (row, p) in rows.iter().zip(preds.iter_mut()) {
                let mut i = root as usize;
                loop {
                    let n = &self.nodes[i];
                    if n.is_leaf {
                        *p += n.leaf as f64;
                        break;
                    }
                    let v = row.get(n.feature as usize).copied().unwrap_or(0.0);
                    let missing = if self.missing.is_nan() {
                        v.is_nan()
                    } else {
                        v == self.missing || v.is_nan()
                    };
                    i = if missing {
                        n.missing
                    } else if v < n.threshold {
                        n.left
                    } else {
                        n.right
                    } as usize;
                }
            }
        }
        for (s, p) in sums.iter_mut().zip(preds) {
            *s += p;
        }
    }
}

/// Rows predicted together: a block's rows stay in cache while each tree walks them.
const PREDICT_BLOCK: usize = 32;

impl Gbt {
    /// Fits on rows `x` (all of one length) and targets `y` with the default recipe, each
    /// row weighing `weights[i]` in the loss (all alike when `None`).
    pub fn fit(
        x: &[Vec<f64>],
        y: &[f64],
        weights: Option<&[f64]>,
        seed: u64,
    ) -> Result<Gbt, ModelError> {
        Gbt::fit_with(x, y, weights, seed, &TreeRecipe::default())
    }

    /// Fits as [`Gbt::fit`] does with `recipe`: bag `i` is grown with seed `seed + i`.
    pub fn fit_with(
        x: &[Vec<f64>],
        y: &[f64],
        weights: Option<&[f64]>,
        seed: u64,
        recipe: &TreeRecipe,
    ) -> Result<Gbt, ModelError> {
        let columns = checked_columns(x, recipe)?;
        if x.len() != y.len() {
            return Err(ModelError::Data(format!(
                "gradient-boosted trees need one target per row ({} rows, {} targets)",
                x.len(),
                y.len()
            )));
        }
        if weights
            .is_some_and(|w| w.len() != y.len() || w.iter().any(|v| !(v.is_finite() && *v >= 0.0)))
        {
            return Err(ModelError::Data(
                "tree weights must be one finite non-negative number per row".into(),
            ));
        }
        if recipe.objective != TreeObjective::Regression {
            return Err(ModelError::Data(format!(
                "objective={} trees learn an order within groups: fit them with Gbt::fit_ranked",
                recipe.objective
            )));
        }
        let data = column_major(x, columns);
        let matrix = Matrix::new(&data, x.len(), columns);
        let mut boosters = Vec::with_capacity(recipe.bags);
        for bag in 0..recipe.bags as u64 {
            let mut booster = squared_loss_booster(recipe, seed.wrapping_add(bag))
                .set_iterations(recipe.rounds)
                .set_initialize_base_score(true);
            let fitted = match weights {
                Some(w) => booster.fit(&matrix, y, w, None),
                None => booster.fit_unweighted(&matrix, y, None),
            };
            fitted.map_err(|e| ModelError::Data(format!("gradient-boosted trees: {e}")))?;
            boosters.push(booster);
        }
        Gbt::new(boosters, columns).map_err(ModelError::Data)
    }

    /// LambdaMART ([`TreeObjective::Lambdarank`]): fits trees that order the rows of each
    /// group (`groups[i]`, a task) by `relevance[i]` (relative throughput: higher is
    /// faster). Each of `recipe.rounds` rounds grows one tree, a Newton step on the
    /// LambdaRank gradients of the current scores, fitted by forust as a weighted least-squares
    /// tree (targets `-g/h`, weights `h`); the trees of a bag are summed in one booster, so a
    /// file holds them as any other. Bag `i` is grown with seeds from `seed + i * rounds`.
    pub fn fit_ranked(
        x: &[Vec<f64>],
        relevance: &[f64],
        groups: &[usize],
        seed: u64,
        recipe: &TreeRecipe,
    ) -> Result<Gbt, ModelError> {
        Gbt::fit_ranked_from(x, relevance, groups, None, seed, recipe)
    }

    /// [`Gbt::fit_ranked`] boosting on from `base` scores (one per row; `None`: zeros): the
    /// first round's gradients are those of `base`, so the trees learn what `base` orders
    /// wrongly, and `base + predict` is the fitted ranking. A model carried to another
    /// platform keeps what it knew and learns a correction from a few records of the new
    /// one (a warm start, as XGBoost's `base_margin`).
    pub fn fit_ranked_from(
        x: &[Vec<f64>],
        relevance: &[f64],
        groups: &[usize],
        base: Option<&[f64]>,
        seed: u64,
        recipe: &TreeRecipe,
    ) -> Result<Gbt, ModelError> {
        let columns = checked_columns(x, recipe)?;
        if x.len() != relevance.len()
            || x.len() != groups.len()
            || base.is_some_and(|b| b.len() != x.len())
        {
            return Err(ModelError::Data(format!(
                "ranking trees need one relevance, one group and one base score per row ({} rows, {} relevances, {} groups, {} base scores)",
                x.len(),
                relevance.len(),
                groups.len(),
                base.map_or(x.len(), <[f64]>::len)
            )));
        }
        if base.is_some_and(|b| b.iter().any(|v| !v.is_finite())) {
            return Err(ModelError::Data("base scores must be finite".into()));
        }
        if relevance.iter().any(|v| !(v.is_finite() && *v >= 0.0)) {
            return Err(ModelError::Data(
                "relevances must be finite non-negative numbers".into(),
            ));
        }
        let n = x.len();
        let mut members: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for (i, &g) in groups.iter().enumerate() {
            members.entry(g).or_default().push(i);
        }
        let members: Vec<Vec<usize>> = members.into_values().filter(|m| m.len() > 1).collect();
        let data = column_major(x, columns);
        let matrix = Matrix::new(&data, n, columns);
        let mut boosters = Vec::with_capacity(recipe.bags);
        for bag in 0..recipe.bags as u64 {
            let mut scores = base.map_or_else(|| vec![0.0; n], <[f64]>::to_vec);
            let mut summed: Option<GradientBooster> = None;
            for round in 0..recipe.rounds as u64 {
                let (grad, hess) =
                    lambda_gradients(&members, relevance, &scores, n, recipe.ndcg_at);
                let mean_hess = hess.iter().sum::<f64>() / n as f64;
                if !(mean_hess.is_finite() && mean_hess > 0.0) {
                    break; // every pair tied or no pair at all: nothing left to learn
                }
                // Hessians scaled to a mean of 1, so forust's regularisation and minimum leaf
                // weight (both in hessian units) mean what they mean for a regression.
                let target: Vec<f64> = grad
                    .iter()
                    .zip(&hess)
                    .map(|(g, h)| if *h > 0.0 { -g / h } else { 0.0 })
                    .collect();
                let weight: Vec<f64> = hess.iter().map(|h| h / mean_hess).collect();
                let round_seed = seed
                    .wrapping_add(bag.wrapping_mul(recipe.rounds as u64))
                    .wrapping_add(round);
                let mut tree = squared_loss_booster(recipe, round_seed)
                    .set_iterations(1)
                    .set_base_score(0.0)
                    .set_initialize_base_score(false);
                tree.fit(&matrix, &target, &weight, None)
                    .map_err(|e| ModelError::Data(format!("gradient-boosted trees: {e}")))?;
                for (s, p) in scores.iter_mut().zip(tree.predict(&matrix, true)) {
                    *s += p;
                }
                match &mut summed {
                    None => summed = Some(tree),
                    Some(b) => b.trees.append(&mut tree.trees),
                }
            }
            let booster = match summed {
                Some(b) => b,
                // No group has two candidates of different relevance: nothing orders them,
                // so every row scores alike (one tree fitted to zeros), as an unfitted
                // ridge does.
                None => {
                    let mut flat = GradientBooster::default()
                        .set_objective_type(ObjectiveType::SquaredLoss)
                        .set_iterations(1)
                        .set_base_score(0.0)
                        .set_initialize_base_score(false);
                    flat.fit_unweighted(&matrix, &vec![0.0; n], None)
                        .map_err(|e| ModelError::Data(format!("gradient-boosted trees: {e}")))?;
                    flat
                }
            };
            boosters.push(booster);
        }
        Gbt::new(boosters, columns).map_err(ModelError::Data)
    }

    /// Predictions for rows `x`: the mean of the boosters'.
    pub fn predict(&self, x: &[Vec<f64>]) -> Vec<f64> {
        if x.is_empty() || self.flat.is_empty() {
            return vec![0.0; x.len()];
        }
        let n = self.flat.len() as f64;
        let mut out = vec![0.0; x.len()];
        out.par_chunks_mut(PREDICT_BLOCK)
            .zip(x.par_chunks(PREDICT_BLOCK))
            .for_each(|(sums, rows)| {
                for booster in &self.flat {
                    booster.add_predictions(rows, sums);
                }
                sums.iter_mut().for_each(|s| *s /= n);
            });
        out
    }
}

impl Gbt {
    /// The columns each row must have.
    pub fn columns(&self) -> usize {
        self.columns
    }

    /// Boosters averaged.
    pub fn bags(&self) -> usize {
        self.boosters.len()
    }

    /// The boosters as forust's JSON, with the row width they were fitted on: one booster
    /// under `booster` (as files before bagging), several under `boosters`.
    pub fn to_json(&self) -> Result<serde_json::Value, ModelError> {
        let dump = |b: &GradientBooster| -> Result<serde_json::Value, ModelError> {
            let text = b
                .json_dump()
                .map_err(|e| ModelError::Data(format!("gradient-boosted trees: {e}")))?;
            serde_json::from_str(&text)
                .map_err(|e| ModelError::Data(format!("gradient-boosted trees: {e}")))
        };
        match &self.boosters[..] {
            [one] => Ok(serde_json::json!({ "columns": self.columns, "booster": dump(one)? })),
            many => {
                let dumped = many.iter().map(dump).collect::<Result<Vec<_>, _>>()?;
                Ok(serde_json::json!({ "columns": self.columns, "boosters": dumped }))
            }
        }
    }

    /// Reads what [`Gbt::to_json`] wrote; the error says what is wrong with it.
    pub fn from_json(value: &serde_json::Value) -> Result<Gbt, String> {
        let columns = value
            .get("columns")
            .and_then(serde_json::Value::as_u64)
            .and_then(|c| usize::try_from(c).ok())
            .filter(|&c| c > 0)
            .ok_or("trees: `columns` is missing or not a positive integer")?;
        let dumped: Vec<&serde_json::Value> = match (value.get("booster"), value.get("boosters")) {
            (Some(one), None) => vec![one],
            (None, Some(serde_json::Value::Array(many))) if !many.is_empty() => {
                many.iter().collect()
            }
            (None, Some(_)) => return Err("trees: `boosters` is not a non-empty list".into()),
            (Some(_), Some(_)) => return Err("trees: both `booster` and `boosters`".into()),
            (None, None) => return Err("trees: `booster` is missing".into()),
        };
        if dumped.len() > MAX_BAGS {
            return Err(format!(
                "trees: {} boosters, more than {MAX_BAGS}",
                dumped.len()
            ));
        }
        let boosters = dumped
            .into_iter()
            .enumerate()
            .map(|(i, b)| {
                let mut booster = GradientBooster::from_json(&b.to_string())
                    .map_err(|e| format!("trees: booster {i} is not a forust booster ({e})"))?;
                check_booster(&booster, columns).map_err(|e| format!("trees: booster {i}: {e}"))?;
                // Predictions run on the caller's threads, whatever the file asked for.
                booster.num_threads = None;
                Ok(booster)
            })
            .collect::<Result<Vec<_>, String>>()?;
        Gbt::new(boosters, columns).map_err(|e| format!("trees: {e}"))
    }

    /// The boosters with their prediction layout.
    fn new(boosters: Vec<GradientBooster>, columns: usize) -> Result<Gbt, String> {
        let flat = boosters.iter().map(Flat::of).collect::<Result<_, _>>()?;
        Ok(Gbt {
            boosters,
            columns,
            flat,
        })
    }
}

/// What forust indexes without checking, checked: every split reads a column of the row and
/// leads to nodes after its own (forust numbers nodes as it grows them, so a tree is walked
/// forward and ends), every leaf weight and the base score are numbers, and the trees to
/// predict with exist. A file that fails this would panic or loop in the middle of a search.
fn check_booster(b: &GradientBooster, columns: usize) -> Result<(), String> {
    if b.trees.is_empty() {
        return Err("no trees".into());
    }
    if !b.base_score.is_finite() {
        return Err(format!("base score {}", b.base_score));
    }
    if let Some(n) = b.prediction_iteration.filter(|&n| n > b.trees.len()) {
        return Err(format!("predicts with {n} of {} trees", b.trees.len()));
    }
    for (t, tree) in b.trees.iter().enumerate() {
        let len = tree.nodes.len();
        if len == 0 {
            return Err(format!("tree {t} has no nodes"));
        }
        for (i, node) in tree.nodes.iter().enumerate() {
            if node.is_leaf {
                if !node.weight_value.is_finite() {
                    return Err(format!(
                        "tree {t} node {i}: leaf weight {}",
                        node.weight_value
                    ));
                }
                continue;
            }
            if node.split_feature >= columns {
                return Err(format!(
                    "tree {t} node {i} splits on column {} of {columns}",
                    node.split_feature
                ));
            }
            for child in [node.left_child, node.right_child, node.missing_node] {
                if !(i < child && child < len) {
                    return Err(format!(
                        "tree {t} node {i} leads to node {child} (nodes after it, up to {})",
                        len - 1
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A forust booster grown by `recipe`'s depth, rate and sampling, fitting squared error
/// (the regression's loss, and the least-squares fit of each LambdaMART round).
fn squared_loss_booster(recipe: &TreeRecipe, seed: u64) -> GradientBooster {
    GradientBooster::default()
        .set_objective_type(ObjectiveType::SquaredLoss)
        .set_learning_rate(recipe.rate)
        .set_max_depth(recipe.depth)
        .set_subsample(recipe.subsample)
        .set_colsample_bytree(recipe.colsample)
        .set_sample_method(if recipe.subsample < 1.0 {
            SampleMethod::Random
        } else {
            SampleMethod::None
        })
        .set_seed(seed)
}

/// The checks every fit makes: the recipe is in range, there are rows, and all have the
/// first one's length; returns that length.
fn checked_columns(x: &[Vec<f64>], recipe: &TreeRecipe) -> Result<usize, ModelError> {
    recipe
        .check()
        .map_err(|e| ModelError::Data(format!("tree recipe: {e}")))?;
    let columns = x.first().map_or(0, Vec::len);
    if x.is_empty() || columns == 0 {
        return Err(ModelError::Data(
            "gradient-boosted trees need rows of features".into(),
        ));
    }
    if x.iter().any(|r| r.len() != columns) {
        return Err(ModelError::Data("feature rows of different lengths".into()));
    }
    Ok(columns)
}

/// Groups up to this size learn from every pair of their rows; larger ones from the pairs
/// with a row among the current top this many.
const RANKED_PAIRS_FROM_TOP: usize = 1024;

/// LambdaRank's gradient and hessian of every row (zero outside `members`): for each pair of
/// a group with `relevance[i] > relevance[j]`, the logistic pair loss on `scores[i] -
/// scores[j]` weighted by the change in the group's NDCG (gains the relevances, positions
/// from the current scores) that swapping the two would make; NDCG at `ndcg_at` places
/// where that is not 0 (a place below them discounts to nothing).
fn lambda_gradients(
    members: &[Vec<usize>],
    relevance: &[f64],
    scores: &[f64],
    n: usize,
    ndcg_at: usize,
) -> (Vec<f64>, Vec<f64>) {
    use rayon::prelude::*;
    let places = if ndcg_at == 0 { usize::MAX } else { ndcg_at };
    let discount = |rank: usize| {
        if rank < places {
            1.0 / (rank as f64 + 2.0).log2()
        } else {
            0.0
        }
    };
    let per_group: Vec<Vec<(usize, f64, f64)>> = members
        .par_iter()
        .map(|m| {
            // The group's rows (local indices) from the highest score down, and each row's
            // place in that order.
            let mut order: Vec<usize> = (0..m.len()).collect();
            order.sort_by(|&a, &b| scores[m[b]].total_cmp(&scores[m[a]]));
            let mut position = vec![0usize; m.len()];
            for (r, &k) in order.iter().enumerate() {
                position[k] = r;
            }
            let mut gains: Vec<f64> = m.iter().map(|&i| relevance[i]).collect();
            gains.sort_by(|a, b| b.total_cmp(a));
            let ideal: f64 = gains.iter().enumerate().map(|(r, g)| g * discount(r)).sum();
            let mut out: Vec<(usize, f64, f64)> = m.iter().map(|&i| (i, 0.0, 0.0)).collect();
            if ideal <= 0.0 {
                return out;
            }
            // The pair (a, b), local indices, with a the more relevant.
            let mut pair = |a: usize, b: usize| {
                let (i, j) = (m[a], m[b]);
                let delta = (relevance[i] - relevance[j])
                    * (discount(position[a]) - discount(position[b])).abs()
                    / ideal;
                let rho = 1.0 / (1.0 + (scores[i] - scores[j]).exp());
                let (g, h) = (rho * delta, rho * (1.0 - rho) * delta);
                out[a].1 -= g;
                out[a].2 += h;
                out[b].1 += g;
                out[b].2 += h;
            };
            if m.len() <= RANKED_PAIRS_FROM_TOP && places >= m.len() {
                for a in 0..m.len() {
                    for b in 0..m.len() {
                        if relevance[m[a]] > relevance[m[b]] {
                            pair(a, b);
                        }
                    }
                }
            } else {
                // Only pairs with a member among the current top move the NDCG at `places`;
                // a larger group (datasets hold ~200 records a task; a long tuning log may
                // hold many more) learns only from those of the top
                // `RANKED_PAIRS_FROM_TOP` too: LightGBM's truncation, which bounds a
                // round's work.
                let top = places.min(RANKED_PAIRS_FROM_TOP);
                for (p, &a) in order.iter().enumerate().take(top) {
                    for &b in &order[p + 1..] {
                        match relevance[m[a]].total_cmp(&relevance[m[b]]) {
                            std::cmp::Ordering::Greater => pair(a, b),
                            std::cmp::Ordering::Less => pair(b, a),
                            std::cmp::Ordering::Equal => {}
                        }
                    }
                }
            }
            out
        })
        .collect();
    let (mut grad, mut hess) = (vec![0.0; n], vec![0.0; n]);
    for (i, g, h) in per_group.into_iter().flatten() {
        grad[i] = g;
        hess[i] = h;
    }
    (grad, hess)
}

/// forust's matrices are column-major; short rows are padded with zeros.
fn column_major(x: &[Vec<f64>], columns: usize) -> Vec<f64> {
    let mut data = vec![0.0; x.len() * columns];
    for (i, row) in x.iter().enumerate() {
        for (j, &v) in row.iter().take(columns).enumerate() {
            data[j * x.len() + i] = v;
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_pull_the_fit_toward_the_heavier_rows() {
        // The same features with two targets: 0 weighing 1, 1 weighing 9.
        let x = vec![vec![0.0, 1.0]; 20];
        let y: Vec<f64> = (0..20).map(|i| (i % 2) as f64).collect();
        let w: Vec<f64> = (0..20)
            .map(|i| if i % 2 == 1 { 9.0 } else { 1.0 })
            .collect();
        let weighted = Gbt::fit(&x, &y, Some(&w), 1).unwrap().predict(&x[..1])[0];
        let plain = Gbt::fit(&x, &y, None, 1).unwrap().predict(&x[..1])[0];
        assert!((weighted - 0.9).abs() < 0.05, "{weighted}");
        assert!((plain - 0.5).abs() < 0.05, "{plain}");
        // One weight per row, finite and not negative.
        assert!(Gbt::fit(&x, &y, Some(&w[..3]), 1).is_err());
        let mut bad = w.clone();
        bad[0] = f64::NAN;
        assert!(Gbt::fit(&x, &y, Some(&bad), 1).is_err());
        bad[0] = -1.0;
        assert!(Gbt::fit(&x, &y, Some(&bad), 1).is_err());
    }

    #[test]
    fn trees_fit_a_step_that_a_line_cannot() {
        // y is 1 inside a band of x0 and 0 outside: trees rank it, a linear fit cannot.
        let x: Vec<Vec<f64>> = (0..200)
            .map(|i| vec![i as f64 / 200.0, ((i * 7) % 13) as f64])
            .collect();
        let y: Vec<f64> = x
            .iter()
            .map(|r| if (0.3..0.6).contains(&r[0]) { 1.0 } else { 0.0 })
            .collect();
        let gbt = Gbt::fit(&x, &y, None, 1).unwrap();
        let p = gbt.predict(&x);
        let inside: f64 = (60..120).map(|i| p[i]).sum::<f64>() / 60.0;
        let outside: f64 = (0..60).chain(120..200).map(|i| p[i]).sum::<f64>() / 140.0;
        assert!(inside > outside + 0.5, "inside {inside}, outside {outside}");
    }

    #[test]
    fn a_bag_predicts_the_mean_of_its_boosters_each_grown_with_its_own_seed() {
        let x: Vec<Vec<f64>> = (0..300)
            .map(|i| vec![(i % 17) as f64, (i % 5) as f64, i as f64 / 300.0])
            .collect();
        let y: Vec<f64> = x.iter().map(|r| r[0] * 0.3 - r[1] + 2.0 * r[2]).collect();
        let one: TreeRecipe = "rounds=30,subsample=0.6,colsample=0.7,objective=regression"
            .parse()
            .unwrap();
        let bag = TreeRecipe { bags: 3, ..one };
        let bagged = Gbt::fit_with(&x, &y, None, 7, &bag).unwrap();
        assert_eq!(bagged.bags(), 3);
        let singles: Vec<Vec<f64>> = (7..10)
            .map(|seed| Gbt::fit_with(&x, &y, None, seed, &one).unwrap().predict(&x))
            .collect();
        // Sampling makes the boosters differ, and the bag is their mean.
        assert!(singles[0] != singles[1]);
        for (i, p) in bagged.predict(&x).into_iter().enumerate() {
            let mean = (singles[0][i] + singles[1][i] + singles[2][i]) / 3.0;
            assert!((p - mean).abs() < 1e-9, "row {i}: {p} against {mean}");
        }
        // Written and read back: the same predictions; a single booster keeps the old key.
        let json = bagged.to_json().unwrap();
        assert_eq!(json["boosters"].as_array().map(Vec::len), Some(3));
        let back = Gbt::from_json(&json).unwrap();
        assert_eq!(back.predict(&x), bagged.predict(&x));
        let single = Gbt::fit_with(&x, &y, None, 7, &one)
            .unwrap()
            .to_json()
            .unwrap();
        assert!(single.get("booster").is_some() && single.get("boosters").is_none());
        // Neither key, both, or an empty list: errors that say so.
        let mut both = json.clone();
        both["booster"] = single["booster"].clone();
        for (bad, why) in [
            (serde_json::json!({"columns": 3}), "missing"),
            (both, "both"),
            (
                serde_json::json!({"columns": 3, "boosters": []}),
                "non-empty",
            ),
        ] {
            let e = Gbt::from_json(&bad).err().unwrap();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn trees_that_would_panic_or_loop_are_refused_when_read() {
        let x: Vec<Vec<f64>> = (0..100).map(|i| vec![i as f64, (i % 7) as f64]).collect();
        let y: Vec<f64> = x.iter().map(|r| r[0] - r[1]).collect();
        let json = Gbt::fit_with(
            &x,
            &y,
            None,
            1,
            &"rounds=3,objective=regression".parse().unwrap(),
        )
        .unwrap()
        .to_json()
        .unwrap();
        assert!(Gbt::from_json(&json).is_ok());
        let root = |j: &mut serde_json::Value| -> serde_json::Value {
            j["booster"]["trees"][0]["nodes"][0].clone()
        };
        let mut probe = json.clone();
        assert_eq!(root(&mut probe)["is_leaf"], false, "the first tree splits");
        let nodes = probe["booster"]["trees"][0]["nodes"]
            .as_array()
            .unwrap()
            .len();
        for (field, value, why) in [
            ("left_child", serde_json::json!(nodes + 5), "leads to node"),
            // Back to itself: a walk that never ends.
            ("right_child", serde_json::json!(0), "leads to node 0"),
            ("missing_node", serde_json::json!(nodes), "leads to node"),
            (
                "split_feature",
                serde_json::json!(2),
                "splits on column 2 of 2",
            ),
        ] {
            let mut bad = json.clone();
            bad["booster"]["trees"][0]["nodes"][0][field] = value;
            let e = Gbt::from_json(&bad)
                .err()
                .unwrap_or_else(|| panic!("{field} read"));
            assert!(e.contains("booster 0") && e.contains(why), "{field}: {e}");
        }
        let mut bad = json.clone();
        bad["booster"]["prediction_iteration"] = serde_json::json!(4);
        let e = Gbt::from_json(&bad).err().unwrap();
        assert!(e.contains("predicts with 4 of 3 trees"), "{e}");
        let mut bad = json.clone();
        bad["booster"]["trees"] = serde_json::json!([]);
        assert!(Gbt::from_json(&bad).err().unwrap().contains("no trees"));
    }

    #[test]
    fn recipes_parse_with_defaults_and_refuse_what_is_out_of_range() {
        assert_eq!("".parse::<TreeRecipe>().unwrap(), TreeRecipe::ensemble());
        assert_eq!(
            "objective=regression".parse::<TreeRecipe>().unwrap(),
            TreeRecipe::default()
        );
        let r: TreeRecipe = " depth=8 , bags=5,subsample=0.8".parse().unwrap();
        assert_eq!(
            r,
            TreeRecipe {
                depth: 8,
                bags: 5,
                subsample: 0.8,
                ..TreeRecipe::ensemble()
            }
        );
        for (bad, why) in [
            ("depth", "KEY=VALUE"),
            ("leaves=3", "unknown key `leaves`"),
            ("depth=4,depth=5", "twice"),
            ("depth=-1", "depth=`-1`"),
            ("depth=0", "depth=0 is not in"),
            ("depth=17", "depth=17"),
            ("rounds=0", "rounds=0"),
            ("rate=0", "rate=0"),
            ("rate=NaN", "rate=NaN"),
            ("subsample=1.5", "subsample=1.5"),
            ("colsample=0", "colsample=0"),
            ("bags=0", "bags=0"),
            ("bags=65", "bags=65"),
            ("objective=xendcg", "unknown objective `xendcg`"),
            ("ndcg_at=-5", "ndcg_at=`-5`"),
            (
                "objective=regression,ndcg_at=5",
                "needs objective=lambdarank",
            ),
        ] {
            let e = bad.parse::<TreeRecipe>().unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        // A recipe built in code is checked before a fit.
        let x = vec![vec![1.0]; 4];
        let bad = TreeRecipe {
            bags: 0,
            ..TreeRecipe::default()
        };
        assert!(Gbt::fit_with(&x, &[0.0; 4], None, 1, &bad).is_err());
    }

    #[test]
    fn ndcg_at_k_learns_nothing_from_pairs_below_the_top_k() {
        // One task of five rows, scored 5..1 from row 0 down. Rows 0 and 1 hold the top two
        // places and are the least relevant; rows 2, 3 and 4 sit below them.
        let relevance = [1.0, 1.0, 6.0, 2.0, 7.0];
        let members = vec![(0..5).collect::<Vec<usize>>()];
        let gradient_of_row_3 = |scores: &[f64], ndcg_at: usize| {
            lambda_gradients(&members, &relevance, scores, 5, ndcg_at).0[3]
        };
        // Rows 2 and 4 trade scores, both staying below the top two.
        let (before, after) = ([5.0, 4.0, 3.0, 2.0, 1.0], [5.0, 4.0, 1.5, 2.0, 3.5]);
        // At NDCG@2, row 3 learns only from its pairs with rows 0 and 1: to rise.
        let at_2 = gradient_of_row_3(&before, 2);
        assert!(at_2 < 0.0, "{at_2}");
        assert_eq!(at_2.to_bits(), gradient_of_row_3(&after, 2).to_bits());
        // Over the whole task its pairs with rows 2 and 4 count too.
        assert_ne!(gradient_of_row_3(&before, 0), gradient_of_row_3(&after, 0));
        // A cut at or past the task's size is the whole task.
        assert_eq!(gradient_of_row_3(&before, 5), gradient_of_row_3(&before, 0));
    }

    /// What forust itself predicts for `x`: each booster over a column-major copy, tree by
    /// tree, then the mean of the boosters (what `Gbt::predict` did before `Flat`).
    fn forust_predict(g: &Gbt, x: &[Vec<f64>]) -> Vec<f64> {
        let data = column_major(x, g.columns);
        let matrix = Matrix::new(&data, x.len(), g.columns);
        let mut sum = vec![0.0; x.len()];
        for booster in &g.boosters {
            for (s, p) in sum.iter_mut().zip(booster.predict(&matrix, true)) {
                *s += p;
            }
        }
        sum.iter().map(|s| s / g.boosters.len() as f64).collect()
    }

    #[test]
    fn the_flat_layout_predicts_what_forust_predicts_bit_for_bit() {
        let x: Vec<Vec<f64>> = (0..400)
            .map(|i| {
                let i = i as f64;
                vec![
                    (i * 0.37).sin(),
                    (i * 0.11).cos() * 3.0,
                    i % 7.0,
                    (i * 1.3) % 5.0,
                ]
            })
            .collect();
        let y: Vec<f64> = x
            .iter()
            .map(|r| r[0] * r[1] - r[2] + (r[3] > 2.0) as u8 as f64)
            .collect();
        let groups: Vec<usize> = (0..x.len()).map(|i| i / 20).collect();
        let relevance: Vec<f64> = y.iter().map(|v| 1.0 / (1.0 + (v + 10.0).abs())).collect();
        let fitted = [
            Gbt::fit(&x, &y, None, 3).unwrap(),
            Gbt::fit_with(
                &x,
                &y,
                None,
                3,
                &"rounds=30,bags=3,subsample=0.7,objective=regression"
                    .parse()
                    .unwrap(),
            )
            .unwrap(),
            Gbt::fit_ranked(
                &x,
                &relevance,
                &groups,
                3,
                &"rounds=30,depth=4".parse().unwrap(),
            )
            .unwrap(),
        ];
        // Rows unlike the training ones too: far outside, on the thresholds, missing values.
        let mut probe = x.clone();
        probe.push(vec![1e9, -1e9, 0.0, f64::NAN]);
        probe.push(vec![f64::NAN; 4]);
        for g in &fitted {
            let thresholds: Vec<f64> = g.boosters[0].trees[0]
                .nodes
                .iter()
                .filter(|n| !n.is_leaf)
                .map(|n| n.split_value)
                .collect();
            for t in thresholds {
                probe.push(vec![t; 4]);
            }
        }
        for g in &fitted {
            let ours = g.predict(&probe);
            let theirs = forust_predict(g, &probe);
            assert!(
                ours.iter()
                    .zip(&theirs)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            );
            // Read back from a file: the same layout.
            let back = Gbt::from_json(&g.to_json().unwrap()).unwrap();
            assert_eq!(back.predict(&probe), ours);
        }
    }

    /// The row of `rows` that `scores` ranks first.
    fn highest(rows: &[usize], scores: &[f64]) -> usize {
        rows.iter()
            .copied()
            .max_by(|&a, &b| scores[a].total_cmp(&scores[b]))
            .expect("a group has rows")
    }

    #[test]
    fn ranking_trees_learn_the_order_within_each_group_not_its_level() {
        // Six groups (tasks) of 40 candidates. Within a group the fast ones have a small
        // x0; x1 is the group's level, which says nothing about the order inside it, and x2
        // is noise.
        let (mut x, mut relevance, mut groups) = (Vec::new(), Vec::new(), Vec::new());
        for g in 0..6usize {
            for i in 0..40usize {
                let x0 = ((i * 13) % 40) as f64;
                x.push(vec![x0, g as f64, ((i * 7 + g) % 11) as f64]);
                relevance.push(1.0 / (1.0 + x0 / 8.0));
                groups.push(g);
            }
        }
        let recipe: TreeRecipe = "rounds=40,depth=3,objective=lambdarank".parse().unwrap();
        let trees = Gbt::fit_ranked(&x, &relevance, &groups, 1, &recipe).unwrap();
        let p = trees.predict(&x);
        for g in 0..6 {
            let rows: Vec<usize> = (0..x.len()).filter(|&i| groups[i] == g).collect();
            let top = highest(&rows, &p);
            assert_eq!(x[top][0], 0.0, "group {g} ranks x0 = {} first", x[top][0]);
            let ordered = rows
                .iter()
                .flat_map(|&a| rows.iter().map(move |&b| (a, b)))
                .filter(|&(a, b)| relevance[a] > relevance[b])
                .filter(|&(a, b)| p[a] > p[b])
                .count();
            let pairs = rows
                .iter()
                .flat_map(|&a| rows.iter().map(move |&b| (a, b)))
                .filter(|&(a, b)| relevance[a] > relevance[b])
                .count();
            // NDCG weighs the top: the tail is ordered less well, far better than chance.
            assert!(
                ordered as f64 > 0.8 * pairs as f64,
                "group {g}: {ordered} of {pairs}"
            );
        }
        // The trees of a round are summed in one booster: it writes and reads back as any.
        let back = Gbt::from_json(&trees.to_json().unwrap()).unwrap();
        assert_eq!(back.predict(&x), p);
        // A regression fit is not handed a ranking recipe, and bad inputs are errors.
        let e = Gbt::fit_with(&x, &relevance, None, 1, &recipe)
            .err()
            .unwrap();
        assert!(e.to_string().contains("fit_ranked"), "{e}");
        assert!(Gbt::fit_ranked(&x, &relevance[1..], &groups, 1, &recipe).is_err());
        let mut bad = relevance.clone();
        bad[3] = f64::NAN;
        assert!(Gbt::fit_ranked(&x, &bad, &groups, 1, &recipe).is_err());
        // One candidate a group: no pair to learn from, so every row scores alike.
        let lone: Vec<usize> = (0..x.len()).collect();
        let flat = Gbt::fit_ranked(&x, &relevance, &lone, 1, &recipe).unwrap();
        assert!(flat.predict(&x).iter().all(|&v| v == 0.0));
    }

    #[test]
    fn boosting_from_base_scores_corrects_what_they_order_wrongly() {
        // Four groups of 30: the fast ones have a small x0. The base scores are right about
        // x0 in groups 0 and 1 and backwards in groups 2 and 3, which x1 tells apart.
        let (mut x, mut relevance, mut groups, mut base) = (vec![], vec![], vec![], vec![]);
        for g in 0..4usize {
            for i in 0..30usize {
                let x0 = ((i * 7) % 30) as f64;
                x.push(vec![x0, (g / 2) as f64]);
                relevance.push(1.0 / (1.0 + x0 / 5.0));
                groups.push(g);
                base.push(if g < 2 { -x0 / 10.0 } else { x0 / 10.0 });
            }
        }
        let recipe: TreeRecipe = "rounds=40,depth=3,objective=lambdarank".parse().unwrap();
        let trees = Gbt::fit_ranked_from(&x, &relevance, &groups, Some(&base), 1, &recipe).unwrap();
        let p: Vec<f64> = trees
            .predict(&x)
            .iter()
            .zip(&base)
            .map(|(c, b)| b + c)
            .collect();
        for g in 0..4 {
            let rows: Vec<usize> = (0..x.len()).filter(|&i| groups[i] == g).collect();
            let top = highest(&rows, &p);
            assert!(x[top][0] < 3.0, "group {g} ranks x0 = {} first", x[top][0]);
        }
        // The trees alone rank groups 2 and 3 the other way round from their base.
        let c = trees.predict(&x);
        for g in 2..4 {
            let rows: Vec<usize> = (0..x.len()).filter(|&i| groups[i] == g).collect();
            let (fast, slow) = (rows[0], rows[1]); // x0 = 0 and x0 = 7
            assert!(c[fast] > c[slow] && base[fast] < base[slow], "group {g}");
        }
        // Base scores: one a row, finite.
        assert!(
            Gbt::fit_ranked_from(&x, &relevance, &groups, Some(&base[1..]), 1, &recipe).is_err()
        );
        let mut bad = base.clone();
        bad[5] = f64::INFINITY;
        assert!(Gbt::fit_ranked_from(&x, &relevance, &groups, Some(&bad), 1, &recipe).is_err());
    }

    #[test]
    fn a_group_larger_than_the_truncation_still_learns_its_top() {
        // One task of 1,100 candidates (more than RANKED_PAIRS_FROM_TOP): pairs come only
        // from the current top, and the fastest still ends up first.
        let n = RANKED_PAIRS_FROM_TOP + 76;
        let x: Vec<Vec<f64>> = (0..n).map(|i| vec![((i * 37) % n) as f64]).collect();
        let relevance: Vec<f64> = x.iter().map(|r| 1.0 / (1.0 + r[0] / 50.0)).collect();
        let recipe: TreeRecipe = "rounds=20,depth=4,objective=lambdarank".parse().unwrap();
        let p = Gbt::fit_ranked(&x, &relevance, &vec![0; n], 1, &recipe)
            .unwrap()
            .predict(&x);
        // Depth-4 trees over 1,100 distinct values: the top leaf holds a few dozen of them
        // (the full pairs, RANKED_PAIRS_FROM_TOP raised, rank the same x0 = 17 first).
        let top = (0..n).max_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap();
        assert!(x[top][0] < 50.0, "ranks x0 = {} first", x[top][0]);
        let mean = |lo: f64, hi: f64| {
            let v: Vec<f64> = (0..n)
                .filter(|&i| (lo..hi).contains(&x[i][0]))
                .map(|i| p[i])
                .collect();
            v.iter().sum::<f64>() / v.len() as f64
        };
        assert!(mean(0.0, 110.0) > mean(990.0, 1100.0));
    }

    #[test]
    fn recipes_written_before_objectives_read_as_regression() {
        let old = r#"{"rounds":200,"depth":6,"rate":0.1,"subsample":1.0,"colsample":1.0,"bags":1}"#;
        let r: TreeRecipe = serde_json::from_str(old).unwrap();
        assert_eq!(r, TreeRecipe::default());
        assert_eq!(r.objective, TreeObjective::Regression);
        let ranked = serde_json::to_string(&TreeRecipe::ensemble()).unwrap();
        assert!(ranked.contains(r#""objective":"lambdarank""#), "{ranked}");
    }

    proptest::proptest! {
        #[test]
        fn recipes_print_and_parse_back(
            rounds in 1usize..=MAX_ROUNDS,
            depth in 1usize..=MAX_DEPTH,
            rate in 1e-4f32..=1.0,
            subsample in 1e-3f32..=1.0,
            colsample in 1e-3f64..=1.0,
            bags in 1usize..=MAX_BAGS,
            ranked in proptest::bool::ANY,
            places in 0usize..50,
        ) {
            let (objective, ndcg_at) = if ranked {
                (TreeObjective::Lambdarank, places)
            } else {
                (TreeObjective::Regression, 0)
            };
            let r = TreeRecipe { rounds, depth, rate, subsample, colsample, bags, objective, ndcg_at };
            proptest::prop_assert_eq!(r.to_string().parse::<TreeRecipe>(), Ok(r));
        }

        #[test]
        fn any_text_parses_or_says_why(text in ".{0,40}") {
            match text.parse::<TreeRecipe>() {
                Ok(r) => proptest::prop_assert!(r.check().is_ok()),
                Err(e) => proptest::prop_assert!(!e.is_empty()),
            }
        }
    }

    #[test]
    fn empty_or_ragged_inputs_are_errors_not_panics() {
        assert!(Gbt::fit(&[], &[], None, 1).is_err());
        assert!(Gbt::fit(&[vec![1.0], vec![1.0, 2.0]], &[0.0, 1.0], None, 1).is_err());
        assert!(Gbt::fit(&[vec![1.0]], &[0.0, 1.0], None, 1).is_err());
    }
}
