//! Checking a kernel's output against the reference, the same way on every backend.

use tessel_ir::{ComputeOp, DType, TensorData};

/// The tolerance for an output dtype: exact for integers; for floats, what a different
/// summation order and one final rounding can explain.
pub fn tolerance(op: &ComputeOp) -> f64 {
    match op.output.tensor.dtype {
        DType::I8 | DType::U8 | DType::I16 | DType::I32 => 0.0,
        DType::F32 => 1e-3,
        DType::BF16 => 2e-2,
        DType::F16 => 4e-3,
    }
}

/// The relative error of `got` against `want`, scaled by max(|a|, |b|, 1); a non-finite value
/// where the reference is finite counts as infinitely wrong.
pub fn relative_error(got: f64, want: f64) -> f64 {
    if got.is_finite() != want.is_finite() {
        f64::INFINITY
    } else if !got.is_finite() {
        0.0
    } else {
        (got - want).abs() / got.abs().max(want.abs()).max(1.0)
    }
}

/// Largest [`relative_error`] over two tensors of the same shape, and where (flat index).
pub fn max_relative_error(got: &TensorData, want: &TensorData) -> (f64, usize) {
    let mut worst = (0.0, 0);
    for (i, (&a, &b)) in got.data.iter().zip(&want.data).enumerate() {
        let e = relative_error(a, b);
        if e > worst.0 {
            worst = (e, i);
        }
    }
    worst
}

/// The multi-dimensional index of flat (row-major) index `at`.
pub fn unravel(mut at: usize, shape: &[u64]) -> Vec<i64> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        let n = shape[d].max(1) as usize;
        idx[d] = (at % n) as i64;
        at /= n;
    }
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_relative_and_non_finite_values_are_wrong() {
        assert_eq!(relative_error(2.0, 2.0), 0.0);
        assert!((relative_error(101.0, 100.0) - 1.0 / 101.0).abs() < 1e-12);
        // Small values are compared absolutely.
        assert!((relative_error(0.001, 0.002) - 0.001).abs() < 1e-12);
        assert_eq!(relative_error(f64::NAN, 1.0), f64::INFINITY);
        assert_eq!(relative_error(f64::INFINITY, f64::INFINITY), 0.0);
        let want = TensorData {
            shape: vec![2, 2],
            dtype: DType::F32,
            data: vec![1.0, 2.0, 3.0, 4.0],
        };
        let mut got = want.clone();
        got.data[2] = 3.5;
        let (e, at) = max_relative_error(&got, &want);
        assert_eq!(at, 2);
        assert!((e - 0.5 / 3.5).abs() < 1e-12);
        assert_eq!(unravel(at, &want.shape), vec![1, 0]);
    }
}
