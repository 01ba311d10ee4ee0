//! The network: token embedding MLP, pre-norm self-attention layers, attention pooling and
//! an MLP head, as plain functions over candle tensors (the training path).
//!
//! Training uses `layer_norm_slow` and `softmax(x, D::Minus1)`: candle's fused layer norm and
//! `softmax_last_dim` pass no gradient back (see the crate docs).

use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::ops::{layer_norm_slow, softmax};
use serde::{Deserialize, Serialize};

use crate::ModelError;

/// The architecture. Defaults are sized for training and inference on a few CPU cores.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Feature columns per token (the feature schema's width).
    pub width: usize,
    pub d_model: usize,
    pub heads: usize,
    pub layers: usize,
    /// Hidden width of the feed-forward blocks.
    pub d_ff: usize,
    /// Add the analytic roofline prior (`tessel_features::roofline`, as `-ln seconds`) to the
    /// network's score, so that the network learns the correction to it. Models saved before
    /// the prior existed read as `false`.
    #[serde(default)]
    pub prior: bool,
}

impl ModelConfig {
    pub fn new(width: usize) -> Self {
        ModelConfig {
            width,
            d_model: 48,
            heads: 3,
            layers: 2,
            d_ff: 96,
            prior: false,
        }
    }

    pub fn validate(&self) -> Result<(), ModelError> {
        let ok = self.width > 0
            && self.d_model > 0
            && self.heads > 0
            && self.layers > 0
            && self.d_ff > 0
            && self.d_model % self.heads == 0
            && self.d_model <= 4096
            && self.d_ff <= 16384
            && self.layers <= 64;
        if ok {
            Ok(())
        } else {
            Err(ModelError::Config(format!(
                "invalid architecture {self:?}: sizes must be positive and d_model a multiple of heads"
            )))
        }
    }

    /// Every parameter: name and shape, in a fixed order.
    pub fn parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (w, d, f) = (self.width, self.d_model, self.d_ff);
        let mut v = vec![
            ("embed.0.weight".into(), vec![d, w]),
            ("embed.0.bias".into(), vec![d]),
            ("embed.1.weight".into(), vec![d, d]),
            ("embed.1.bias".into(), vec![d]),
        ];
        for l in 0..self.layers {
            let p = |s: &str| format!("layer{l}.{s}");
            v.push((p("ln1.weight"), vec![d]));
            v.push((p("ln1.bias"), vec![d]));
            v.push((p("qkv.weight"), vec![3 * d, d]));
            v.push((p("qkv.bias"), vec![3 * d]));
            v.push((p("out.weight"), vec![d, d]));
            v.push((p("out.bias"), vec![d]));
            v.push((p("ln2.weight"), vec![d]));
            v.push((p("ln2.bias"), vec![d]));
            v.push((p("ff1.weight"), vec![f, d]));
            v.push((p("ff1.bias"), vec![f]));
            v.push((p("ff2.weight"), vec![d, f]));
            v.push((p("ff2.bias"), vec![d]));
        }
        v.extend([
            ("final_ln.weight".into(), vec![d]),
            ("final_ln.bias".into(), vec![d]),
            ("pool.weight".into(), vec![1, d]),
            ("pool.bias".into(), vec![1]),
            ("head.0.weight".into(), vec![d, d]),
            ("head.0.bias".into(), vec![d]),
            ("head.1.weight".into(), vec![1, d]),
            ("head.1.bias".into(), vec![1]),
        ]);
        v
    }
}

/// Which parameters belong to the backbone (frozen in head-only transfer).
pub fn is_backbone(name: &str) -> bool {
    name.starts_with("layer") || name.starts_with("final_ln") || name.starts_with("pool")
}

/// The parameters as candle variables, in `parameter_shapes` order.
#[derive(Clone)]
pub struct Params {
    pub names: Vec<String>,
    pub vars: Vec<Var>,
}

/// A small seeded generator (splitmix64) for initialisation, batches and baselines.
pub struct InitRng(u64);

impl InitRng {
    pub fn new(seed: u64) -> Self {
        InitRng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl Params {
    /// Fresh parameters: uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) weights (PyTorch's Linear
    /// default), zero biases, unit layer-norm gains.
    pub fn init(config: &ModelConfig, seed: u64) -> Result<Params, ModelError> {
        config.validate()?;
        let mut rng = InitRng::new(seed);
        let mut names = Vec::new();
        let mut vars = Vec::new();
        for (name, shape) in config.parameter_shapes() {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = if name.contains("ln") && name.ends_with("weight") {
                vec![1.0; n]
            } else if name.ends_with("bias") {
                vec![0.0; n]
            } else {
                let bound = 1.0 / (shape[1] as f64).sqrt();
                (0..n)
                    .map(|_| ((rng.unit() * 2.0 - 1.0) * bound) as f32)
                    .collect()
            };
            let t = Tensor::from_vec(data, shape.as_slice(), &Device::Cpu)?;
            names.push(name);
            vars.push(Var::from_tensor(&t)?);
        }
        Ok(Params { names, vars })
    }

    pub fn get(&self, name: &str) -> &Tensor {
        let i = self
            .names
            .iter()
            .position(|n| n == name)
            .unwrap_or_else(|| panic!("parameter {name} is part of every architecture"));
        self.vars[i].as_tensor()
    }

    /// Copies of the current values (for early stopping and transfer).
    pub fn snapshot(&self) -> Result<Vec<Tensor>, ModelError> {
        Ok(self
            .vars
            .iter()
            .map(|v| v.as_tensor().copy())
            .collect::<Result<_, _>>()?)
    }

    pub fn restore(&self, values: &[Tensor]) -> Result<(), ModelError> {
        for (v, t) in self.vars.iter().zip(values) {
            v.set(t)?;
        }
        Ok(())
    }

    pub fn count(&self) -> usize {
        self.vars.iter().map(|v| v.elem_count()).sum()
    }
}

/// `x [.., in] -> [.., out]` with a `[out, in]` weight.
fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    let dims = x.dims().to_vec();
    let inner = dims[dims.len() - 1];
    let rows = x.elem_count() / inner;
    let y = x
        .reshape((rows, inner))?
        .matmul(&w.t()?)?
        .broadcast_add(b)?;
    let mut out = dims;
    let last = out.len() - 1;
    out[last] = w.dim(0)?;
    y.reshape(out)
}

/// Scores for a padded batch: `x [B, T, width]` (normalised features), `mask [B, T]` (1 for
/// a token, 0 for padding). Returns `[B]`.
pub fn forward(
    params: &Params,
    config: &ModelConfig,
    x: &Tensor,
    mask: &Tensor,
) -> candle_core::Result<Tensor> {
    let p = |n: &str| params.get(n);
    let (b, t, _) = x.dims3()?;
    let (d, h) = (config.d_model, config.heads);
    let dh = d / h;
    // Padding gets -1e9 before every softmax over tokens.
    let bias = ((mask - 1.0)? * 1e9)?.to_dtype(DType::F32)?; // [B, T]
    let mut hs = linear(x, p("embed.0.weight"), p("embed.0.bias"))?.relu()?;
    hs = linear(&hs, p("embed.1.weight"), p("embed.1.bias"))?;
    for l in 0..config.layers {
        let n = |s: &str| format!("layer{l}.{s}");
        let a = layer_norm_slow(&hs, p(&n("ln1.weight")), p(&n("ln1.bias")), 1e-5)?;
        let qkv = linear(&a, p(&n("qkv.weight")), p(&n("qkv.bias")))?; // [B, T, 3d]
        let split = |i: usize| -> candle_core::Result<Tensor> {
            qkv.narrow(2, i * d, d)?
                .reshape((b, t, h, dh))?
                .transpose(1, 2)?
                .contiguous() // [B, H, T, dh]
        };
        let (q, k, v) = (split(0)?, split(1)?, split(2)?);
        let scores = (q.matmul(&k.t()?.contiguous()?)? / (dh as f64).sqrt())?; // [B, H, T, T]
        let scores = scores.broadcast_add(&bias.reshape((b, 1, 1, t))?)?;
        let attn = softmax(&scores, D::Minus1)?;
        let ctx = attn
            .matmul(&v)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, t, d))?;
        hs = (hs + linear(&ctx, p(&n("out.weight")), p(&n("out.bias")))?)?;
        let a = layer_norm_slow(&hs, p(&n("ln2.weight")), p(&n("ln2.bias")), 1e-5)?;
        let f = linear(&a, p(&n("ff1.weight")), p(&n("ff1.bias")))?.relu()?;
        hs = (hs + linear(&f, p(&n("ff2.weight")), p(&n("ff2.bias")))?)?;
    }
    let hs = layer_norm_slow(&hs, p("final_ln.weight"), p("final_ln.bias"), 1e-5)?;
    let w = linear(&hs, p("pool.weight"), p("pool.bias"))?.squeeze(2)?; // [B, T]
    let w = softmax(&(w + bias)?, D::Minus1)?;
    let pooled = w.unsqueeze(1)?.matmul(&hs)?.squeeze(1)?; // [B, d]
    let y = linear(&pooled, p("head.0.weight"), p("head.0.bias"))?.relu()?;
    linear(&y, p("head.1.weight"), p("head.1.bias"))?.squeeze(1)
}
