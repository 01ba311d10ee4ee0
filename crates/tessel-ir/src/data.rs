//! Dense tensors of values, for the interpreters and for checking generated code.

use serde::{Deserialize, Serialize};

use crate::dtype::DType;

/// A dense row-major tensor. Values are held as `f64`, always already rounded to `dtype`, so
/// integer arithmetic stays exact and bf16/f16/f32 rounding is emulated faithfully.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorData {
    pub shape: Vec<u64>,
    pub dtype: DType,
    pub data: Vec<f64>,
}

impl TensorData {
    /// Writes the elements in their dtype's machine format (little endian; bf16 and f16 as
    /// bits) into `out`, which holds exactly `len * dtype.bytes()` bytes.
    pub fn write_le_bytes(&self, out: &mut [u8]) {
        // One loop per dtype, so that each compiles to straight (vectorized) code: the worker
        // encodes hundreds of MB of inputs each time it starts on a large task.
        fn put<const W: usize>(out: &mut [u8], data: &[f64], f: impl Fn(f64) -> [u8; W]) {
            for (at, &v) in out.chunks_exact_mut(W).zip(data) {
                at.copy_from_slice(&f(v));
            }
        }
        let data = &self.data;
        match self.dtype {
            DType::BF16 => put(out, data, |v| {
                half::bf16::from_f64(v).to_bits().to_le_bytes()
            }),
            DType::F16 => put(out, data, |v| {
                half::f16::from_f64(v).to_bits().to_le_bytes()
            }),
            DType::F32 => put(out, data, |v| (v as f32).to_le_bytes()),
            DType::I8 => put(out, data, |v| [(v as i8) as u8]),
            DType::U8 => put(out, data, |v| [v as u8]),
            DType::I32 => put(out, data, |v| (v as i32).to_le_bytes()),
            DType::I16 => put(out, data, |v| (v as i16).to_le_bytes()),
        }
    }

    /// The elements in their machine format (see [`TensorData::write_le_bytes`]).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let mut out = vec![0; self.data.len() * self.dtype.bytes()];
        self.write_le_bytes(&mut out);
        out
    }

    /// The tensor held by `bytes` (the inverse of [`TensorData::write_le_bytes`]); `None` when
    /// `bytes` is not exactly the size of `shape` in `dtype`.
    pub fn from_le_bytes(bytes: &[u8], shape: Vec<u64>, dtype: DType) -> Option<TensorData> {
        let w = dtype.bytes();
        let n = shape.iter().product::<u64>() as usize;
        if bytes.len() != n * w {
            return None;
        }
        let data = bytes
            .chunks_exact(w)
            .map(|at| {
                let two = || u16::from_le_bytes([at[0], at[1]]);
                let four = || [at[0], at[1], at[2], at[3]];
                match dtype {
                    DType::BF16 => half::bf16::from_bits(two()).to_f64(),
                    DType::F16 => half::f16::from_bits(two()).to_f64(),
                    DType::F32 => f32::from_le_bytes(four()) as f64,
                    DType::I8 => at[0] as i8 as f64,
                    DType::U8 => at[0] as f64,
                    DType::I32 => i32::from_le_bytes(four()) as f64,
                    DType::I16 => two() as i16 as f64,
                }
            })
            .collect();
        Some(TensorData { shape, dtype, data })
    }

    pub fn zeros(shape: Vec<u64>, dtype: DType) -> Self {
        let n = shape.iter().product::<u64>() as usize;
        TensorData {
            shape,
            dtype,
            data: vec![0.0; n],
        }
    }

    /// Deterministic pseudo-random values that the dtype holds exactly: small integers for
    /// integer types (u8 in 0..=15, i8 in -8..=7), multiples of 1/8 in [-2, 2) for floats.
    pub fn random(shape: Vec<u64>, dtype: DType, seed: u64) -> Self {
        let n = shape.iter().product::<u64>() as usize;
        let mut rng = SplitMix64(seed ^ 0x9e37_79b9_7f4a_7c15);
        // One loop per kind of dtype: inputs of large tasks are tens of millions of elements.
        fn fill(n: usize, rng: &mut SplitMix64, value: impl Fn(u64) -> f64) -> Vec<f64> {
            (0..n).map(|_| value(rng.next() % 32)).collect()
        }
        let data = match dtype {
            DType::U8 => fill(n, &mut rng, |r| (r % 16) as f64),
            DType::I8 | DType::I16 | DType::I32 => fill(n, &mut rng, |r| (r % 16) as f64 - 8.0),
            _ => fill(n, &mut rng, |r| (r as f64 - 16.0) / 8.0),
        };
        TensorData { shape, dtype, data }
    }

    /// Row-major offset of an in-bounds index.
    pub fn offset(&self, index: &[i64]) -> Option<usize> {
        if index.len() != self.shape.len() {
            return None;
        }
        let mut off = 0usize;
        for (&i, &n) in index.iter().zip(&self.shape) {
            if i < 0 || i as u64 >= n {
                return None;
            }
            off = off * n as usize + i as usize;
        }
        Some(off)
    }

    /// The value at `index`, or zero outside the bounds (padding semantics).
    pub fn get_or_zero(&self, index: &[i64]) -> f64 {
        self.offset(index).map_or(0.0, |o| self.data[o])
    }

    /// Largest absolute difference, scaled by the larger magnitude (at least 1).
    pub fn max_relative_error(&self, other: &TensorData) -> f64 {
        self.data
            .iter()
            .zip(&other.data)
            .map(|(a, b)| (a - b).abs() / a.abs().max(b.abs()).max(1.0))
            .fold(0.0, f64::max)
    }
}

/// A tiny deterministic generator, so test data never depends on another crate's RNG.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}
