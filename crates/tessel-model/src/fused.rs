//! The inference path: the same network as [`crate::net::forward`], written over plain `f32`
//! slices, one program at a time, with no padding and reused scratch buffers. Weights are
//! stored transposed (`[in][out]`) so every inner loop runs over contiguous outputs and
//! vectorizes. Tests check it against the candle forward.

use crate::ModelError;
use crate::net::{ModelConfig, Params};

struct Linear {
    /// `[in][out]`.
    wt: Vec<f32>,
    b: Vec<f32>,
    inp: usize,
    out: usize,
}

impl Linear {
    fn new(params: &Params, name: &str) -> Result<Linear, ModelError> {
        let w = params.get(&format!("{name}.weight"));
        let (out, inp) = w.dims2()?;
        let w: Vec<f32> = w.flatten_all()?.to_vec1()?;
        let mut wt = vec![0f32; inp * out];
        for o in 0..out {
            for i in 0..inp {
                wt[i * out + o] = w[o * inp + i];
            }
        }
        let b = params.get(&format!("{name}.bias")).to_vec1()?;
        Ok(Linear { wt, b, inp, out })
    }

    /// `y[t] = x[t] W^T + b` for `rows` rows.
    #[inline(always)]
    fn apply<const FMA: bool>(&self, x: &[f32], rows: usize, y: &mut Vec<f32>) {
        y.clear();
        y.resize(rows * self.out, 0.0);
        matmul_body::<FMA>(x, rows, self.inp, &self.wt, self.out, &self.b, y);
    }
}

/// `exp(x)` for `x <= 0` (softmax after subtracting the maximum), branch-free so that the
/// loops around it vectorize: `2^n e^r` with `n = round(x log2 e)`, `|r| <= ln 2 / 2` and a
/// degree-6 Taylor polynomial for `e^r` (relative error about 2e-7).
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let x = x.max(-87.0);
    let n = (x * std::f32::consts::LOG2_E).round();
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    f32::from_bits((((n as i32) + 127) as u32) << 23) * p
}

#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// A register-blocked kernel: `R` rows x 16 outputs of accumulators per step of the inner
/// dimension, so each loaded weight vector feeds `R` FMAs; rows go in blocks of 4, then 2, 1.
#[inline(always)]
fn matmul_body<const FMA: bool>(
    x: &[f32],
    rows: usize,
    inp: usize,
    wt: &[f32],
    out: usize,
    b: &[f32],
    y: &mut [f32],
) {
    let mut r = 0;
    while r + 4 <= rows {
        block::<FMA, 4>(x, r, inp, wt, out, b, y);
        r += 4;
    }
    if r + 2 <= rows {
        block::<FMA, 2>(x, r, inp, wt, out, b, y);
        r += 2;
    }
    if r < rows {
        block::<FMA, 1>(x, r, inp, wt, out, b, y);
    }
}

#[inline(always)]
fn block<const FMA: bool, const R: usize>(
    x: &[f32],
    r: usize,
    inp: usize,
    wt: &[f32],
    out: usize,
    b: &[f32],
    y: &mut [f32],
) {
    const C: usize = 16;
    let mut o = 0;
    while o + C <= out {
        let mut acc = [[0f32; C]; R];
        for row in acc.iter_mut() {
            row.copy_from_slice(&b[o..o + C]);
        }
        for i in 0..inp {
            let w: &[f32; C] = wt[i * out + o..i * out + o + C]
                .try_into()
                .expect("a slice of C elements");
            for (k, row) in acc.iter_mut().enumerate() {
                let xv = x[(r + k) * inp + i];
                for j in 0..C {
                    row[j] = madd::<FMA>(xv, w[j], row[j]);
                }
            }
        }
        for (k, row) in acc.iter().enumerate() {
            y[(r + k) * out + o..(r + k) * out + o + C].copy_from_slice(row);
        }
        o += C;
    }
    for k in 0..R {
        let xr = &x[(r + k) * inp..(r + k + 1) * inp];
        for oo in o..out {
            y[(r + k) * out + oo] = dot::<FMA>(xr, wt, oo, out, b[oo]);
        }
    }
}

#[inline(always)]
fn dot<const FMA: bool>(xr: &[f32], wt: &[f32], o: usize, out: usize, bias: f32) -> f32 {
    let mut s = bias;
    for (i, &xi) in xr.iter().enumerate() {
        s = madd::<FMA>(xi, wt[i * out + o], s);
    }
    s
}

struct Norm {
    g: Vec<f32>,
    b: Vec<f32>,
}

impl Norm {
    fn new(params: &Params, name: &str) -> Result<Norm, ModelError> {
        Ok(Norm {
            g: params.get(&format!("{name}.weight")).to_vec1()?,
            b: params.get(&format!("{name}.bias")).to_vec1()?,
        })
    }

    #[inline(always)]
    fn apply(&self, x: &[f32], rows: usize, y: &mut Vec<f32>) {
        let d = self.g.len();
        y.clear();
        y.resize(rows * d, 0.0);
        for r in 0..rows {
            let xr = &x[r * d..(r + 1) * d];
            let mean = xr.iter().sum::<f32>() / d as f32;
            let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
            let inv = 1.0 / (var + 1e-5).sqrt();
            for (i, o) in y[r * d..(r + 1) * d].iter_mut().enumerate() {
                *o = (xr[i] - mean) * inv * self.g[i] + self.b[i];
            }
        }
    }
}

struct Layer {
    ln1: Norm,
    qkv: Linear,
    out: Linear,
    ln2: Norm,
    ff1: Linear,
    ff2: Linear,
}

/// Inference weights, immutable and shareable across threads.
pub struct Fused {
    d: usize,
    heads: usize,
    embed0: Linear,
    embed1: Linear,
    layers: Vec<Layer>,
    final_ln: Norm,
    pool: Linear,
    head0: Linear,
    head1: Linear,
}

/// Per-thread buffers, reused from program to program.
#[derive(Default)]
pub struct Scratch {
    h: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    ctx: Vec<f32>,
    row: Vec<f32>,
    kt: Vec<f32>,
    q: Vec<f32>,
    v: Vec<f32>,
    p: Vec<f32>,
    zero: Vec<f32>,
}

impl Fused {
    pub fn new(params: &Params, config: &ModelConfig) -> Result<Fused, ModelError> {
        let layers = (0..config.layers)
            .map(|l| {
                let n = |s: &str| format!("layer{l}.{s}");
                Ok(Layer {
                    ln1: Norm::new(params, &n("ln1"))?,
                    qkv: Linear::new(params, &n("qkv"))?,
                    out: Linear::new(params, &n("out"))?,
                    ln2: Norm::new(params, &n("ln2"))?,
                    ff1: Linear::new(params, &n("ff1"))?,
                    ff2: Linear::new(params, &n("ff2"))?,
                })
            })
            .collect::<Result<_, ModelError>>()?;
        Ok(Fused {
            d: config.d_model,
            heads: config.heads,
            embed0: Linear::new(params, "embed.0")?,
            embed1: Linear::new(params, "embed.1")?,
            layers,
            final_ln: Norm::new(params, "final_ln")?,
            pool: Linear::new(params, "pool")?,
            head0: Linear::new(params, "head.0")?,
            head1: Linear::new(params, "head.1")?,
        })
    }

    /// The score of one program: `x` holds its `tokens` normalised tokens, row-major. Runs
    /// the AVX2 + FMA build of the body where the CPU has them (the release build targets
    /// plain x86-64, so the wide version is compiled separately and chosen at run time).
    pub fn score(&self, x: &[f32], tokens: usize, s: &mut Scratch) -> f32 {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                // SAFETY: the CPU has AVX2 and FMA, checked just above.
                return unsafe { self.score_avx2(x, tokens, s) };
            }
        }
        self.score_body::<false>(x, tokens, s)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn score_avx2(&self, x: &[f32], tokens: usize, s: &mut Scratch) -> f32 {
        self.score_body::<true>(x, tokens, s)
    }

    #[inline(always)]
    fn score_body<const FMA: bool>(&self, x: &[f32], tokens: usize, s: &mut Scratch) -> f32 {
        let (d, t) = (self.d, tokens);
        let dh = d / self.heads;
        let scale = 1.0 / (dh as f32).sqrt();
        self.embed0.apply::<FMA>(x, t, &mut s.a);
        s.a.iter_mut().for_each(|v| *v = v.max(0.0));
        self.embed1.apply::<FMA>(&s.a, t, &mut s.h);
        for layer in &self.layers {
            layer.ln1.apply(&s.h, t, &mut s.a);
            layer.qkv.apply::<FMA>(&s.a, t, &mut s.b); // [t][3d]
            s.ctx.clear();
            s.ctx.resize(t * d, 0.0);
            s.zero.clear();
            s.zero.resize(t.max(dh), 0.0);
            for head in 0..self.heads {
                let off = head * dh;
                // Q (scaled) and V of this head as [t][dh], K transposed as [dh][t], so that
                // both products run on the register-blocked kernel.
                s.q.clear();
                s.v.clear();
                s.kt.clear();
                s.kt.resize(dh * t, 0.0);
                for j in 0..t {
                    let base = j * 3 * d + off;
                    s.q.extend(s.b[base..base + dh].iter().map(|v| v * scale));
                    s.v.extend_from_slice(&s.b[base + 2 * d..base + 2 * d + dh]);
                    for e in 0..dh {
                        s.kt[e * t + j] = s.b[base + d + e];
                    }
                }
                s.p.clear();
                s.p.resize(t * t, 0.0);
                matmul_body::<FMA>(&s.q, t, dh, &s.kt, t, &s.zero[..t], &mut s.p);
                for row in s.p.chunks_exact_mut(t) {
                    let max = row.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
                    row.iter_mut().for_each(|v| *v = exp_nonpositive(*v - max));
                    let sum: f32 = row.iter().sum();
                    let inv = 1.0 / sum;
                    row.iter_mut().for_each(|v| *v *= inv);
                }
                s.row.clear();
                s.row.resize(t * dh, 0.0);
                matmul_body::<FMA>(&s.p, t, t, &s.v, dh, &s.zero[..dh], &mut s.row);
                for i in 0..t {
                    s.ctx[i * d + off..i * d + off + dh]
                        .copy_from_slice(&s.row[i * dh..(i + 1) * dh]);
                }
            }
            layer.out.apply::<FMA>(&s.ctx, t, &mut s.a);
            s.h.iter_mut().zip(&s.a).for_each(|(h, a)| *h += a);
            layer.ln2.apply(&s.h, t, &mut s.a);
            layer.ff1.apply::<FMA>(&s.a, t, &mut s.c);
            s.c.iter_mut().for_each(|v| *v = v.max(0.0));
            layer.ff2.apply::<FMA>(&s.c, t, &mut s.a);
            s.h.iter_mut().zip(&s.a).for_each(|(h, a)| *h += a);
        }
        self.final_ln.apply(&s.h, t, &mut s.a);
        self.pool.apply::<FMA>(&s.a, t, &mut s.b); // [t][1]
        let max = s.b.iter().take(t).fold(f32::NEG_INFINITY, |m, v| m.max(*v));
        s.b.iter_mut().for_each(|v| *v = exp_nonpositive(*v - max));
        let sum: f32 = s.b.iter().sum();
        s.ctx.clear();
        s.ctx.resize(d, 0.0);
        for j in 0..t {
            let w = s.b[j] / sum;
            for (o, hv) in s.ctx.iter_mut().zip(&s.a[j * d..(j + 1) * d]) {
                *o += w * hv;
            }
        }
        self.head0.apply::<FMA>(&s.ctx, 1, &mut s.c);
        s.c.iter_mut().for_each(|v| *v = v.max(0.0));
        self.head1.apply::<FMA>(&s.c, 1, &mut s.b);
        s.b[0]
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fast_exp_is_accurate_where_softmax_uses_it() {
        for i in 0..1700 {
            let x = -(i as f32) * 0.05;
            let (a, b) = (super::exp_nonpositive(x), x.exp());
            assert!((a - b).abs() <= 2e-6 * b + 1e-30, "exp({x}): {a} vs {b}");
        }
        assert_eq!(super::exp_nonpositive(-1e9), super::exp_nonpositive(-90.0));
    }
}
