//! tessel's performance model: a self-attention network over a program's allocation tokens
//! (tessel-features) that scores candidates, trained to rank the candidates of each task, and
//! the ranking metrics that judge it.
//!
//! The network (`net`): token embedding MLP → pre-norm multi-head self-attention layers with a
//! padding mask → attention pooling → MLP head → one score per program. It is plain candle code;
//! training uses `ops::layer_norm_slow` and `ops::softmax(x, D::Minus1)` because candle's fused
//! layer norm, `softmax_last_dim` and `sdpa` pass no gradient back. Inference runs a fused
//! plain-Rust path (`fused`) that a test keeps equal to the candle forward.
//!
//! ```
//! use tessel_model::{Dataset, Model, ModelConfig, Sample, TrainOptions, train};
//!
//! // Two tasks whose candidates are faster when column 0 of their tokens is smaller.
//! let width = 4;
//! let mut samples = Vec::new();
//! for task in 0..2 {
//!     for i in 0..16 {
//!         let x = i as f32 / 16.0;
//!         let tokens = vec![x, 1.0 - x, 0.5, task as f32, x * 0.5, 0.0, 1.0, x];
//!         samples.push(Sample { task, tokens, latency: 1.0 + x as f64 });
//!     }
//! }
//! let data = Dataset::new(vec![("a".into(), 1.0), ("b".into(), 1.0)], samples, width).unwrap();
//! let mut config = ModelConfig::new(width);
//! config.d_model = 16;
//! config.d_ff = 32;
//! config.layers = 1;
//! config.heads = 2;
//! let mut model = Model::new(config, 1).unwrap();
//! let opts = TrainOptions { epochs: 3, val_fraction: 0.0, ..TrainOptions::default() };
//! train(&mut model, &data, &opts, &mut |_| {}).unwrap();
//! let scores = model.predict(&data.samples.iter().map(|s| &s.tokens[..]).collect::<Vec<_>>());
//! assert_eq!(scores.len(), 32);
//! ```

pub mod cost;
pub mod ensemble;
pub mod fused;
pub mod gbt;
pub mod metrics;
pub mod net;
pub mod rows;
pub mod train;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

pub use cost::{ModelCostModel, RooflineCostModel};
pub use ensemble::Companions;
pub use metrics::{Metrics, Ranked};
pub use net::ModelConfig;
pub use train::{EpochReport, Loss, TrainOptions, TrainReport, Trainable, train};

/// What can go wrong building, training, saving or loading a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a tessel model: {reason}")]
    Format { path: PathBuf, reason: String },
    #[error(
        "the model was trained on feature schema v{model}, but these features are schema v{features}; retrain or use a matching tessel"
    )]
    Schema { model: u32, features: u32 },
    #[error("{path}: tensor `{name}` has shape {found:?}, the architecture needs {expected:?}")]
    Shape {
        path: PathBuf,
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("{0}")]
    Config(String),
    #[error("dataset: {0}")]
    Data(String),
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}

/// One measured candidate: its task (an index into [`Dataset::tasks`]), its tokens (row-major,
/// `width` columns) and its latency in seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub task: usize,
    pub tokens: Vec<f32>,
    pub latency: f64,
}

/// Samples grouped by task. Labels are throughput relative to the task's best.
#[derive(Clone, Debug)]
pub struct Dataset {
    /// Task keys and weights.
    pub tasks: Vec<(String, f64)>,
    pub samples: Vec<Sample>,
    pub width: usize,
    best: Vec<f64>,
}

impl Dataset {
    pub fn new(
        tasks: Vec<(String, f64)>,
        samples: Vec<Sample>,
        width: usize,
    ) -> Result<Dataset, ModelError> {
        let mut best = vec![f64::INFINITY; tasks.len()];
        for (i, s) in samples.iter().enumerate() {
            if s.task >= tasks.len() {
                return Err(ModelError::Data(format!(
                    "sample {i} names task {} of {}",
                    s.task,
                    tasks.len()
                )));
            }
            if !(s.latency.is_finite() && s.latency > 0.0) {
                return Err(ModelError::Data(format!(
                    "sample {i} has latency {}",
                    s.latency
                )));
            }
            if width == 0 || s.tokens.is_empty() || s.tokens.len() % width != 0 {
                return Err(ModelError::Data(format!(
                    "sample {i} has {} values, not whole tokens of {width}",
                    s.tokens.len()
                )));
            }
            if s.tokens.iter().any(|v| !v.is_finite()) {
                return Err(ModelError::Data(format!(
                    "sample {i} has a non-finite feature"
                )));
            }
            best[s.task] = best[s.task].min(s.latency);
        }
        Ok(Dataset {
            tasks,
            samples,
            width,
            best,
        })
    }

    /// Throughput relative to the task's best: in (0, 1], 1 for the best.
    pub fn label(&self, i: usize) -> f64 {
        let s = &self.samples[i];
        self.best[s.task] / s.latency
    }

    /// Sample indices per task.
    pub fn by_task(&self) -> Vec<Vec<usize>> {
        let mut v = vec![Vec::new(); self.tasks.len()];
        for (i, s) in self.samples.iter().enumerate() {
            v[s.task].push(i);
        }
        v
    }

    /// The same samples restricted to `tasks` (renumbered).
    pub fn subset(&self, tasks: &[usize]) -> Dataset {
        let map: HashMap<usize, usize> = tasks.iter().enumerate().map(|(n, &t)| (t, n)).collect();
        let samples = self
            .samples
            .iter()
            .filter_map(|s| {
                map.get(&s.task).map(|&t| Sample {
                    task: t,
                    tokens: s.tokens.clone(),
                    latency: s.latency,
                })
            })
            .collect();
        let keys = tasks.iter().map(|&t| self.tasks[t].clone()).collect();
        Dataset::new(keys, samples, self.width).expect("a subset of a valid dataset is valid")
    }
}

/// Per-column mean and standard deviation of the training tokens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Normalizer {
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
}

impl Normalizer {
    pub fn fit(data: &Dataset) -> Normalizer {
        let w = data.width;
        let mut sum = vec![0f64; w];
        let mut sq = vec![0f64; w];
        let mut n = 0f64;
        for s in &data.samples {
            for tok in s.tokens.chunks_exact(w) {
                for j in 0..w {
                    sum[j] += tok[j] as f64;
                    sq[j] += (tok[j] as f64).powi(2);
                }
                n += 1.0;
            }
        }
        let n = n.max(1.0);
        let mean: Vec<f32> = sum.iter().map(|s| (s / n) as f32).collect();
        let std = sq
            .iter()
            .zip(&sum)
            .map(|(q, s)| {
                let var = q / n - (s / n).powi(2);
                if var > 1e-8 { var.sqrt() as f32 } else { 1.0 }
            })
            .collect();
        Normalizer { mean, std }
    }

    pub fn identity(width: usize) -> Normalizer {
        Normalizer {
            mean: vec![0.0; width],
            std: vec![1.0; width],
        }
    }

    pub fn apply(&self, tokens: &[f32], out: &mut Vec<f32>) {
        let w = self.mean.len();
        out.clear();
        out.extend(
            tokens
                .iter()
                .enumerate()
                .map(|(i, v)| (v - self.mean[i % w]) / self.std[i % w]),
        );
    }
}

/// The roofline's score of one program's raw tokens: `-ln` of its estimated seconds (higher
/// is faster); `None` for tokens of another width or that carry no estimate.
pub fn roofline_score(tokens: &[f32], width: usize) -> Option<f64> {
    if width != tessel_features::WIDTH {
        return None;
    }
    let seconds = tessel_features::roofline::estimate_seconds(tokens);
    (seconds.is_finite() && seconds > 0.0).then(|| -seconds.ln())
}

/// The roofline prior the model adds to its score: [`roofline_score`] clamped to a finite
/// range, 0 where there is none.
pub fn prior_score(tokens: &[f32], width: usize) -> f32 {
    roofline_score(tokens, width).map_or(0.0, |s| s.clamp(-50.0, 50.0) as f32)
}

/// What the JSON file beside the weights holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModelInfo {
    /// Always `tessel-model`.
    pub format: String,
    pub feature_schema: u32,
    pub config: ModelConfig,
    pub normalizer: Normalizer,
    /// How it was made (command, data, metrics), free-form.
    #[serde(default)]
    pub provenance: serde_json::Value,
}

/// A model: architecture, normalisation, weights.
pub struct Model {
    pub info: ModelInfo,
    pub params: net::Params,
    /// The trees fitted beside the network (`ensemble`), when it ships with them:
    /// [`Model::predict_ranking`] adds their scores.
    pub companions: Option<std::sync::Arc<Companions>>,
    fused: Option<fused::Fused>,
}

impl Model {
    /// A fresh, untrained model for tokens of `config.width` columns (normalisation is fitted
    /// on the first training data).
    pub fn new(config: ModelConfig, seed: u64) -> Result<Model, ModelError> {
        let params = net::Params::init(&config, seed)?;
        Ok(Model {
            info: ModelInfo {
                format: "tessel-model".into(),
                feature_schema: tessel_features::SCHEMA_VERSION,
                normalizer: Normalizer::identity(config.width),
                config,
                provenance: serde_json::Value::Null,
            },
            params,
            companions: None,
            fused: None,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.info.config
    }

    /// An independent copy: its own weights (training one never changes the other; candle
    /// variables share storage when cloned), the same normalisation and provenance.
    pub fn duplicate(&self) -> Result<Model, ModelError> {
        let params = net::Params::init(&self.info.config, 0)?;
        params.restore(&self.params.snapshot()?)?;
        Ok(Model {
            info: self.info.clone(),
            params,
            companions: self.companions.clone(),
            fused: None,
        })
    }

    /// Parameters changed: the inference copy must be rebuilt.
    pub(crate) fn invalidate(&mut self) {
        self.fused = None;
    }

    fn fused(&mut self) -> Result<&fused::Fused, ModelError> {
        if self.fused.is_none() {
            self.fused = Some(fused::Fused::new(&self.params, &self.info.config)?);
        }
        Ok(self.fused.as_ref().expect("just built"))
    }

    /// Fits the trees of the ensemble on `data` (the network's training records),
    /// with the network as it is now, and keeps them with the model (`ensemble`).
    pub fn fit_companions(&mut self, data: &Dataset, seed: u64) -> Result<(), ModelError> {
        let scores = self.predict(&train::sample_tokens(data));
        let companions = Companions::fit(data, &scores, seed)?;
        self.companions = Some(std::sync::Arc::new(companions));
        Ok(())
    }

    /// [`Model::fit_companions`] on `train`, then the mix of the two parts chosen on `val`
    /// (tasks neither was fitted on; [`Companions::choose_mix`]).
    pub fn fit_companions_judged(
        &mut self,
        train: &Dataset,
        val: &Dataset,
        seed: u64,
        recipe: &gbt::TreeRecipe,
    ) -> Result<ensemble::MixChoice, ModelError> {
        let scores = self.predict(&train::sample_tokens(train));
        let mut companions = Companions::fit_with(train, &scores, seed, recipe)?;
        let scores = self.predict(&train::sample_tokens(val));
        let choice = companions.choose_mix(val, &scores)?;
        self.companions = Some(std::sync::Arc::new(companions));
        Ok(choice)
    }

    /// Fits the ensemble's trees again on `data` with the recipe and the mix they have, the
    /// network as it is now: once the mix was chosen on validation tasks
    /// ([`Model::fit_companions_judged`]), the trees may learn from those tasks too, as a grid
    /// search refits on all its data. Figures measured on those tasks no longer judge the
    /// trees afterwards. An error where the model has no trees, or they have corrections
    /// (fitted on other data, they would not match the new trees).
    pub fn refit_companions(&mut self, data: &Dataset, seed: u64) -> Result<(), ModelError> {
        let Some(old) = self.companions.clone() else {
            return Err(ModelError::Data("no trees to fit again".into()));
        };
        if !old.corrections.is_empty() {
            return Err(ModelError::Data(
                "trees with corrections cannot be fitted again".into(),
            ));
        }
        let scores = self.predict(&train::sample_tokens(data));
        let mut companions = Companions::fit_with(data, &scores, seed, &old.recipe)?;
        companions.weights = old.weights;
        self.companions = Some(std::sync::Arc::new(companions));
        Ok(())
    }

    /// The scores a search ranks by: the network's ([`Model::predict`]) plus, where the model
    /// ships with companions, the trees' (`ensemble`). Only scores of one task's
    /// candidates compare.
    pub fn predict_ranking(&mut self, programs: &[&[f32]]) -> Vec<f32> {
        let scores = self.predict(programs);
        match &self.companions {
            Some(c) => c.scores(&scores, programs, self.info.config.width),
            None => scores,
        }
    }

    /// Scores (higher = faster) for programs given as raw (unnormalised) tokens, in parallel.
    pub fn predict(&mut self, programs: &[&[f32]]) -> Vec<f32> {
        let width = self.info.config.width;
        let prior = self.info.config.prior;
        let norm = self.info.normalizer.clone();
        let fused = match self.fused() {
            Ok(f) => f,
            Err(_) => return vec![f32::MIN; programs.len()],
        };
        programs
            .par_iter()
            .map_init(
                || (fused::Scratch::default(), Vec::new()),
                |(scratch, x), tokens| {
                    let n = tokens.len() / width;
                    if n == 0 || tokens.len() % width != 0 {
                        return f32::MIN;
                    }
                    norm.apply(tokens, x);
                    let mut s = fused.score(x, n, scratch);
                    if prior {
                        s += prior_score(tokens, width);
                    }
                    if s.is_finite() { s } else { f32::MIN }
                },
            )
            .collect()
    }

    /// Checks that features of `schema` can be scored.
    pub fn check_schema(&self, schema: u32) -> Result<(), ModelError> {
        if schema == self.info.feature_schema {
            Ok(())
        } else {
            Err(ModelError::Schema {
                model: self.info.feature_schema,
                features: schema,
            })
        }
    }

    /// `path` (safetensors weights) and `path` with extension `json` (the rest).
    pub fn paths(path: &Path) -> (PathBuf, PathBuf) {
        // `m/model`, `m/model.safetensors` and `m/model.json` name the same model; any other
        // dot is part of the name (`tiny.v2` is `tiny.v2.safetensors`).
        let base = match path.extension().and_then(|e| e.to_str()) {
            Some("safetensors" | "json") => path.with_extension(""),
            _ => path.to_path_buf(),
        };
        let with = |ext: &str| {
            let mut name = base.as_os_str().to_owned();
            name.push(".");
            name.push(ext);
            PathBuf::from(name)
        };
        (with("safetensors"), with("json"))
    }

    /// Writes the weights (safetensors) and the JSON description beside them.
    pub fn save(&self, path: &Path) -> Result<(), ModelError> {
        let (weights, json) = Model::paths(path);
        if let Some(dir) = weights.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| ModelError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let map: HashMap<String, Tensor> = self
            .params
            .names
            .iter()
            .cloned()
            .zip(self.params.vars.iter().map(|v| v.as_tensor().clone()))
            .collect();
        candle_core::safetensors::save(&map, &weights)?;
        match &self.companions {
            Some(c) => c.save(path, self.info.config.width)?,
            // A companion file left from an earlier model would be read with this one.
            None => {
                let stale = Companions::path(path);
                if stale.is_file() {
                    std::fs::remove_file(&stale).map_err(|source| ModelError::Io {
                        path: stale,
                        source,
                    })?;
                }
            }
        }
        let text = serde_json::to_string_pretty(&self.info).map_err(|e| ModelError::Format {
            path: json.clone(),
            reason: e.to_string(),
        })?;
        std::fs::write(&json, text).map_err(|source| ModelError::Io { path: json, source })
    }

    /// Reads a model written by [`Model::save`], checking every tensor against the
    /// architecture the JSON describes.
    pub fn load(path: &Path) -> Result<Model, ModelError> {
        let (weights, json) = Model::paths(path);
        // A device or a pipe would be read without end.
        for p in [&json, &weights] {
            if p.exists() && !p.is_file() {
                return Err(ModelError::Format {
                    path: p.clone(),
                    reason: "not a regular file".into(),
                });
            }
        }
        let text = std::fs::read_to_string(&json).map_err(|source| ModelError::Io {
            path: json.clone(),
            source,
        })?;
        let format = |reason: String| ModelError::Format {
            path: json.clone(),
            reason,
        };
        let info: ModelInfo = serde_json::from_str(&text).map_err(|e| format(e.to_string()))?;
        if info.format != "tessel-model" {
            return Err(format(format!("format is `{}`", info.format)));
        }
        info.config.validate().map_err(|e| format(e.to_string()))?;
        let w = info.config.width;
        if info.normalizer.mean.len() != w || info.normalizer.std.len() != w {
            return Err(format(format!(
                "normalizer has {} columns, the model {w}",
                info.normalizer.mean.len()
            )));
        }
        let stats = info
            .normalizer
            .mean
            .iter()
            .chain(&info.normalizer.std)
            .all(|v| v.is_finite());
        if !stats || info.normalizer.std.iter().any(|&s| s <= 0.0) {
            return Err(format(
                "normalizer holds a non-finite mean or std, or a std that is not positive".into(),
            ));
        }
        let bytes = std::fs::read(&weights).map_err(|source| ModelError::Io {
            path: weights.clone(),
            source,
        })?;
        let tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).map_err(|e| {
            ModelError::Format {
                path: weights.clone(),
                reason: format!("unreadable safetensors ({e})"),
            }
        })?;
        let mut model = Model::new(info.config.clone(), 0)?;
        if let Some(extra) = tensors
            .keys()
            .find(|k| !model.params.names.iter().any(|n| n == *k))
        {
            return Err(ModelError::Format {
                path: weights.clone(),
                reason: format!(
                    "tensor `{extra}` is not part of the architecture in {} ({} layers, d_model {})",
                    json.display(),
                    info.config.layers,
                    info.config.d_model
                ),
            });
        }
        for (name, var) in model.params.names.iter().zip(&model.params.vars) {
            let t = tensors.get(name).ok_or_else(|| ModelError::Format {
                path: weights.clone(),
                reason: format!("tensor `{name}` is missing"),
            })?;
            if t.dims() != var.dims() {
                return Err(ModelError::Shape {
                    path: weights.clone(),
                    name: name.clone(),
                    expected: var.dims().to_vec(),
                    found: t.dims().to_vec(),
                });
            }
            let t = t.to_dtype(candle_core::DType::F32)?;
            let values: Vec<f32> = t.flatten_all()?.to_vec1()?;
            if values.iter().any(|v| !v.is_finite()) {
                return Err(ModelError::Format {
                    path: weights.clone(),
                    reason: format!("tensor `{name}` holds NaN or infinity"),
                });
            }
            var.set(&t)?;
        }
        model.companions = Companions::load(path, info.config.width)?.map(std::sync::Arc::new);
        model.info = info;
        Ok(model)
    }
}
