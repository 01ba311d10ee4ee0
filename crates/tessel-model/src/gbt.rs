//! The gradient-boosted-trees baseline that TenSet and TLP print beside learned cost models
//! (XGBoost there): forust's booster, an XGBoost-style GBM in pure Rust, with XGBoost's usual
//! settings. tessel fits it on the rows of [`crate::rows`] (pooled and grouped allocation
//! features, the roofline's terms) to predict log relative throughput, each record weighted
//! by its relative throughput as TenSet's XGBoost model does. A model that does not beat it
//! has not earned its attention layers; the shipped ensemble adds it to the network.

use forust_ml::objective::ObjectiveType;
use forust_ml::{GradientBooster, Matrix};

use crate::ModelError;

/// Boosting rounds, learning rate and depth (TenSet's XGBoost model uses depth 10 and a
/// rate of 0.2 on far more data; depth 6 is XGBoost's default).
const ROUNDS: usize = 200;
const LEARNING_RATE: f32 = 0.1;
const MAX_DEPTH: usize = 6;

/// A fitted booster.
pub struct Gbt {
    booster: GradientBooster,
    columns: usize,
}

impl Gbt {
    /// Fits on rows `x` (all of one length) and targets `y`, each row weighing `weights[i]`
    /// in the loss (all alike when `None`).
    pub fn fit(
        x: &[Vec<f64>],
        y: &[f64],
        weights: Option<&[f64]>,
        seed: u64,
    ) -> Result<Gbt, ModelError> {
        let columns = x.first().map_or(0, Vec::len);
        if x.is_empty() || columns == 0 || x.len() != y.len() {
            return Err(ModelError::Data(format!(
                "gradient-boosted trees need rows of features and one target per row ({} rows, {} targets)",
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
        if x.iter().any(|r| r.len() != columns) {
            return Err(ModelError::Data("feature rows of different lengths".into()));
        }
        let data = column_major(x, columns);
        let matrix = Matrix::new(&data, x.len(), columns);
        let mut booster = GradientBooster::default()
            .set_objective_type(ObjectiveType::SquaredLoss)
            .set_iterations(ROUNDS)
            .set_learning_rate(LEARNING_RATE)
            .set_max_depth(MAX_DEPTH)
            .set_initialize_base_score(true)
            .set_seed(seed);
        let fitted = match weights {
            Some(w) => booster.fit(&matrix, y, w, None),
            None => booster.fit_unweighted(&matrix, y, None),
        };
        fitted.map_err(|e| ModelError::Data(format!("gradient-boosted trees: {e}")))?;
        Ok(Gbt { booster, columns })
    }

    /// Predictions for rows `x`.
    pub fn predict(&self, x: &[Vec<f64>]) -> Vec<f64> {
        if x.is_empty() {
            return Vec::new();
        }
        let data = column_major(x, self.columns);
        self.booster
            .predict(&Matrix::new(&data, x.len(), self.columns), true)
    }
}

impl Gbt {
    /// The columns each row must have.
    pub fn columns(&self) -> usize {
        self.columns
    }

    /// The booster as forust's JSON, with the row width it was fitted on.
    pub fn to_json(&self) -> Result<serde_json::Value, ModelError> {
        let booster = self
            .booster
            .json_dump()
            .map_err(|e| ModelError::Data(format!("gradient-boosted trees: {e}")))?;
        let booster: serde_json::Value = serde_json::from_str(&booster)
            .map_err(|e| ModelError::Data(format!("gradient-boosted trees: {e}")))?;
        Ok(serde_json::json!({ "columns": self.columns, "booster": booster }))
    }

    /// Reads what [`Gbt::to_json`] wrote; the error says what is wrong with it.
    pub fn from_json(value: &serde_json::Value) -> Result<Gbt, String> {
        let columns = value
            .get("columns")
            .and_then(serde_json::Value::as_u64)
            .and_then(|c| usize::try_from(c).ok())
            .filter(|&c| c > 0)
            .ok_or("trees: `columns` is missing or not a positive integer")?;
        let booster = value.get("booster").ok_or("trees: `booster` is missing")?;
        let booster = GradientBooster::from_json(&booster.to_string())
            .map_err(|e| format!("trees: not a forust booster ({e})"))?;
        Ok(Gbt { booster, columns })
    }
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
    fn empty_or_ragged_inputs_are_errors_not_panics() {
        assert!(Gbt::fit(&[], &[], None, 1).is_err());
        assert!(Gbt::fit(&[vec![1.0], vec![1.0, 2.0]], &[0.0, 1.0], None, 1).is_err());
        assert!(Gbt::fit(&[vec![1.0]], &[0.0, 1.0], None, 1).is_err());
    }
}
