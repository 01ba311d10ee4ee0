//! The model as the search's [`CostModel`]: features are extracted for the model's target,
//! scored in parallel, and every measured batch triggers a few quick training steps on a
//! bounded buffer of recent records (low learning rate, so the pretrained ranking is kept).

use std::collections::HashMap;

use tessel_features::{Target, extract_batch};
use tessel_ir::Program;
use tessel_measure::{CostModel, MeasureResult};

use crate::train::{Loss, Trainable, optimizer, step};
use crate::{Dataset, Model, Sample};

/// Online learning settings.
#[derive(Clone, Debug)]
pub struct OnlineOptions {
    /// Optimisation steps after each measured batch (0: never learn online).
    pub steps: usize,
    pub lr: f64,
    /// Most recent records kept for online steps.
    pub buffer: usize,
    pub seed: u64,
}

impl Default for OnlineOptions {
    fn default() -> Self {
        OnlineOptions {
            steps: 4,
            lr: 2e-4,
            buffer: 2048,
            seed: 1,
        }
    }
}

/// The analytic roofline as the search's cost model: each program's estimated time from its
/// allocation features alone ([`tessel_features::roofline`]), fitted on nothing and learning
/// nothing online. On an instruction or a machine the trained model never saw, it can rank
/// better than the model: on the first AMX dataset (an Emerald Rapids guest) it picked with
/// top-1 0.66 where the shipped model, trained on AVX2 records, picked with 0.16.
pub struct RooflineCostModel {
    target: Target,
}

impl RooflineCostModel {
    /// Estimates for programs featurised for `target` (the machine that will run them).
    pub fn new(target: Target) -> Self {
        RooflineCostModel { target }
    }
}

impl CostModel for RooflineCostModel {
    fn name(&self) -> String {
        "roofline".to_string()
    }

    fn predict(&mut self, programs: &[&Program]) -> Vec<f64> {
        extract_batch(programs, &self.target)
            .iter()
            .map(|f| {
                f.as_ref()
                    .ok()
                    .and_then(|f| crate::roofline_score(&f.tokens, tessel_features::WIDTH))
                    // No estimate: last, but a finite score the search can sort.
                    .unwrap_or(-1e30)
            })
            .collect()
    }

    fn update(&mut self, _programs: &[&Program], _results: &[MeasureResult]) {}
}

pub struct ModelCostModel {
    model: Model,
    target: Target,
    label: String,
    online: OnlineOptions,
    tasks: HashMap<String, usize>,
    buffer: Vec<Sample>,
    rng: crate::net::InitRng,
}

impl ModelCostModel {
    /// `label` names the model in reports (its file, usually).
    pub fn new(model: Model, target: Target, label: &str, online: OnlineOptions) -> Self {
        let rng = crate::net::InitRng::new(online.seed);
        // Reports say when the trees rank beside the network.
        let label = match model.companions {
            Some(_) => format!("{label} (ensemble)"),
            None => label.to_string(),
        };
        ModelCostModel {
            model,
            target,
            label,
            online,
            tasks: HashMap::new(),
            buffer: Vec::new(),
            rng,
        }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Tasks are operators: same computation and shapes, same task.
    fn task_of(&mut self, p: &Program) -> usize {
        let key = format!("{:?}", p.op);
        let n = self.tasks.len();
        *self.tasks.entry(key).or_insert(n)
    }
}

impl CostModel for ModelCostModel {
    fn name(&self) -> String {
        self.label.clone()
    }

    fn predict(&mut self, programs: &[&Program]) -> Vec<f64> {
        let features = extract_batch(programs, &self.target);
        let tokens: Vec<&[f32]> = features
            .iter()
            .map(|f| f.as_ref().map_or(&[][..], |f| &f.tokens[..]))
            .collect();
        self.model
            .predict_ranking(&tokens)
            .into_iter()
            .map(|s| s as f64)
            .collect()
    }

    fn update(&mut self, programs: &[&Program], results: &[MeasureResult]) {
        if self.online.steps == 0 {
            return;
        }
        let features = extract_batch(programs, &self.target);
        for ((p, r), f) in programs.iter().zip(results).zip(features) {
            let (Ok(m), Ok(f)) = (r, f) else { continue };
            if m.timing.median_s.is_nan() || m.timing.median_s <= 0.0 {
                continue;
            }
            let task = self.task_of(p);
            self.buffer.push(Sample {
                task,
                tokens: f.tokens,
                latency: m.timing.median_s,
            });
        }
        if self.buffer.len() > self.online.buffer {
            let drop = self.buffer.len() - self.online.buffer;
            self.buffer.drain(..drop);
        }
        let keys: Vec<(String, f64)> = (0..self.tasks.len())
            .map(|t| (t.to_string(), 1.0))
            .collect();
        let Ok(data) = Dataset::new(keys, self.buffer.clone(), self.model.config().width) else {
            return;
        };
        let Ok(mut opt) = optimizer(&self.model, Trainable::All, self.online.lr, 0.0) else {
            return;
        };
        let groups = data.by_task();
        for _ in 0..self.online.steps {
            // The most recent task with at least two records, up to 64 of them.
            let Some(g) = groups
                .iter()
                .filter(|g| g.len() >= 2)
                .max_by_key(|g| g.last())
            else {
                return;
            };
            let mut rows = g.clone();
            if rows.len() > 64 {
                for k in 0..64 {
                    let j = k + (self.rng.next_u64() % (rows.len() - k) as u64) as usize;
                    rows.swap(k, j);
                }
                rows.truncate(64);
            }
            if step(&mut self.model, &data, &rows, Loss::LambdaRank, &mut opt).is_err() {
                return;
            }
        }
    }
}
