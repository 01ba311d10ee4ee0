//! Ranking metrics that judge a cost model, and the references every figure is printed beside:
//! a random ranking and ridge regression on pooled features.
//!
//! Predictions are scores, higher meaning faster; latencies are measured seconds.

use serde::Serialize;

/// One task's candidates: the model's scores and their measured latencies.
#[derive(Clone, Debug, PartialEq)]
pub struct Ranked {
    /// The task's weight in the network (how often it occurs).
    pub weight: f64,
    pub predicted: Vec<f64>,
    pub latency: Vec<f64>,
}

/// The figures of one ranking.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Metrics {
    pub top1: f64,
    pub top5: f64,
    pub pairwise_accuracy: f64,
    pub kendall_tau: f64,
}

/// TenSet's top-k score: `sum(w_t * best_t) / sum(w_t * chosen_t)`, where `best_t` is the best
/// latency among all candidates of task t and `chosen_t` the best among the model's k
/// highest-ranked. 1.0 is perfect.
pub fn top_k_score(tasks: &[Ranked], k: usize) -> f64 {
    let mut best_sum = 0.0;
    let mut chosen_sum = 0.0;
    for t in tasks {
        if let Some((best, chosen)) = best_and_chosen(t, k) {
            best_sum += t.weight * best;
            chosen_sum += t.weight * chosen;
        }
    }
    if chosen_sum > 0.0 {
        best_sum / chosen_sum
    } else {
        0.0
    }
}

/// The mean over tasks of `best_t / chosen_t` for the k highest-ranked: each task counts
/// the same, so no single heavy task decides it (the top-k score weighs by latency). 1.0 is
/// perfect; 0.0 without tasks.
pub fn top_k_task_mean(tasks: &[Ranked], k: usize) -> f64 {
    let ratios: Vec<f64> = tasks.iter().filter_map(|t| task_ratio(t, k)).collect();
    if ratios.is_empty() {
        0.0
    } else {
        ratios.iter().sum::<f64>() / ratios.len() as f64
    }
}

/// The figure that picks among rankings of one validation set (early stopping's epoch,
/// transfer's candidate): the mean of the per-task top-1 and top-5 ratios and the pairwise
/// accuracy (`m`, the same tasks' [`evaluate`]). The latency-weighted top-k scores swing with
/// the one heaviest task (0.29 to 0.74 between epochs on 23 tasks); per-task means do not,
/// and top-k counts beside the pairwise order.
pub fn selection_criterion(tasks: &[Ranked], m: &Metrics) -> f64 {
    (top_k_task_mean(tasks, 1) + top_k_task_mean(tasks, 5) + m.pairwise_accuracy) / 3.0
}

/// [`evaluate`] and [`selection_criterion`] of one ranking together.
pub fn evaluate_with_criterion(tasks: &[Ranked]) -> (Metrics, f64) {
    let m = evaluate(tasks);
    (m, selection_criterion(tasks, &m))
}

/// Each task's own [`selection_criterion`]: the mean of its top-1 and top-5 ratios and its
/// pairwise accuracy (0.5 without pairs of distinct latency; 0.0 for a task without
/// candidates). Two rankings of the same tasks compare task by task through these
/// ([`paired_gain`]).
pub fn task_criteria(tasks: &[Ranked]) -> Vec<f64> {
    tasks
        .iter()
        .map(|t| {
            let ratio = |k| task_ratio(t, k).unwrap_or(0.0);
            let (c, d, ties) = pair_counts(t);
            let all = c + d + ties;
            let pairwise = if all > 0.0 {
                (c + 0.5 * ties) / all
            } else {
                0.5
            };
            (ratio(1) + ratio(5) + pairwise) / 3.0
        })
        .collect()
}

/// How much one ranking gains over another on the same tasks: the mean of the per-task
/// differences and its standard error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PairedGain {
    pub mean: f64,
    pub standard_error: f64,
    pub tasks: usize,
}

impl PairedGain {
    /// Whether this is a gain of at least `z` standard errors (a positive mean, never a
    /// loss that `z` <= 0 would admit).
    pub fn clears(&self, z: f64) -> bool {
        self.mean > 0.0 && self.z() >= z
    }

    /// The gain in standard errors (infinite for a gain without spread, 0 without one).
    pub fn z(&self) -> f64 {
        if self.mean == 0.0 {
            0.0
        } else if self.standard_error > 0.0 {
            self.mean / self.standard_error
        } else {
            f64::INFINITY.copysign(self.mean)
        }
    }
}

/// The paired gain of `candidate` over `incumbent`, per-task values of the same tasks in the
/// same order ([`task_criteria`]); extra values of the longer one are ignored. With one
/// task the standard error is infinite.
pub fn paired_gain(candidate: &[f64], incumbent: &[f64]) -> PairedGain {
    let d: Vec<f64> = candidate
        .iter()
        .zip(incumbent)
        .map(|(c, i)| c - i)
        .collect();
    let n = d.len();
    if n == 0 {
        return PairedGain::default();
    }
    let mean = d.iter().sum::<f64>() / n as f64;
    // One task says nothing of the spread: its gain is never significant.
    let standard_error = if n > 1 {
        let var = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        (var / n as f64).sqrt()
    } else {
        f64::INFINITY
    };
    PairedGain {
        mean,
        standard_error,
        tasks: n,
    }
}

/// One task's `best_t / chosen_t` for the k highest-ranked (None without candidates or
/// with a chosen latency that is not positive).
fn task_ratio(t: &Ranked, k: usize) -> Option<f64> {
    best_and_chosen(t, k)
        .filter(|(_, chosen)| *chosen > 0.0)
        .map(|(best, chosen)| best / chosen)
}

/// A task's best latency and the best among the ranking's k highest-scored candidates
/// (`None` for a task without candidates).
pub fn best_and_chosen(t: &Ranked, k: usize) -> Option<(f64, f64)> {
    if t.latency.is_empty() {
        return None;
    }
    let best = t.latency.iter().copied().fold(f64::INFINITY, f64::min);
    let mut order: Vec<usize> = (0..t.latency.len()).collect();
    // Highest score first; ties broken by index, so the result is deterministic.
    order.sort_by(|&a, &b| t.predicted[b].total_cmp(&t.predicted[a]).then(a.cmp(&b)));
    let chosen = order
        .iter()
        .take(k.max(1))
        .map(|&i| t.latency[i])
        .fold(f64::INFINITY, f64::min);
    Some((best, chosen))
}

/// Each task's share of what the top-1 score loses: `w_t * (chosen_t - best_t)` over the sum
/// of it across tasks (zeros when nothing is lost). The score weighs tasks by latency, so one
/// heavy task picked badly can cost more than every other task together.
pub fn top1_loss_shares(tasks: &[Ranked]) -> Vec<f64> {
    let losses: Vec<f64> = tasks
        .iter()
        .map(|t| best_and_chosen(t, 1).map_or(0.0, |(b, c)| t.weight * (c - b)))
        .collect();
    let total: f64 = losses.iter().sum();
    losses
        .iter()
        .map(|l| if total > 0.0 { l / total } else { 0.0 })
        .collect()
}

/// Concordant, discordant and prediction-tied pairs among pairs of distinct latency.
fn pair_counts(t: &Ranked) -> (f64, f64, f64) {
    let (mut c, mut d, mut ties) = (0.0, 0.0, 0.0);
    let n = t.latency.len();
    for i in 0..n {
        for j in i + 1..n {
            let dl = t.latency[j] - t.latency[i];
            if dl == 0.0 {
                continue;
            }
            // i faster (dl > 0) should score higher (dp > 0).
            let dp = t.predicted[i] - t.predicted[j];
            if dp == 0.0 {
                ties += 1.0;
            } else if (dp > 0.0) == (dl > 0.0) {
                c += 1.0;
            } else {
                d += 1.0;
            }
        }
    }
    (c, d, ties)
}

/// Share of pairs (within a task, distinct latencies) the scores order correctly; a tie in
/// the scores counts one half.
pub fn pairwise_accuracy(tasks: &[Ranked]) -> f64 {
    let (mut good, mut all) = (0.0, 0.0);
    for t in tasks {
        let (c, d, ties) = pair_counts(t);
        good += c + 0.5 * ties;
        all += c + d + ties;
    }
    if all > 0.0 { good / all } else { 0.0 }
}

/// Kendall's tau between scores and speed (1 / latency), over all pairs within tasks:
/// `(concordant - discordant) / pairs`.
pub fn kendall_tau(tasks: &[Ranked]) -> f64 {
    let (mut num, mut all) = (0.0, 0.0);
    for t in tasks {
        let (c, d, ties) = pair_counts(t);
        num += c - d;
        all += c + d + ties;
    }
    if all > 0.0 { num / all } else { 0.0 }
}

/// Mean absolute percentage error of a regression, in percent.
pub fn mape(predicted: &[f64], actual: &[f64]) -> f64 {
    let terms: Vec<f64> = predicted
        .iter()
        .zip(actual)
        .filter(|(_, a)| **a != 0.0)
        .map(|(p, a)| ((p - a) / a).abs())
        .collect();
    if terms.is_empty() {
        0.0
    } else {
        100.0 * terms.iter().sum::<f64>() / terms.len() as f64
    }
}

pub fn evaluate(tasks: &[Ranked]) -> Metrics {
    Metrics {
        top1: top_k_score(tasks, 1),
        top5: top_k_score(tasks, 5),
        pairwise_accuracy: pairwise_accuracy(tasks),
        kendall_tau: kendall_tau(tasks),
    }
}

/// The same figures for random scores, averaged over `rounds` seeded draws.
pub fn random_baseline(tasks: &[Ranked], rounds: usize, seed: u64) -> Metrics {
    let mut rng = crate::net::InitRng::new(seed);
    let mut sum = Metrics::default();
    let rounds = rounds.max(1);
    for _ in 0..rounds {
        let shuffled: Vec<Ranked> = tasks
            .iter()
            .map(|t| Ranked {
                weight: t.weight,
                predicted: t.latency.iter().map(|_| rng.unit()).collect(),
                latency: t.latency.clone(),
            })
            .collect();
        let m = evaluate(&shuffled);
        sum.top1 += m.top1;
        sum.top5 += m.top5;
        sum.pairwise_accuracy += m.pairwise_accuracy;
        sum.kendall_tau += m.kendall_tau;
    }
    let r = rounds as f64;
    Metrics {
        top1: sum.top1 / r,
        top5: sum.top5 / r,
        pairwise_accuracy: sum.pairwise_accuracy / r,
        kendall_tau: sum.kendall_tau / r,
    }
}

/// Ridge regression (closed form, standardised inputs): the simple baseline.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Ridge {
    mean: Vec<f64>,
    scale: Vec<f64>,
    weights: Vec<f64>,
    bias: f64,
}

impl Ridge {
    /// Fits `y ~ x` with penalty `lambda` on the weights.
    #[allow(clippy::needless_range_loop)] // index loops read as the algebra they implement
    pub fn fit(x: &[Vec<f64>], y: &[f64], lambda: f64) -> Ridge {
        let n = x.len();
        let p = x.first().map_or(0, Vec::len);
        let mut mean = vec![0.0; p];
        let mut scale = vec![1.0; p];
        if n > 0 {
            for row in x {
                for (m, v) in mean.iter_mut().zip(row) {
                    *m += v / n as f64;
                }
            }
            for (j, s) in scale.iter_mut().enumerate() {
                let var = x.iter().map(|r| (r[j] - mean[j]).powi(2)).sum::<f64>() / n as f64;
                *s = if var > 1e-12 { var.sqrt() } else { 1.0 };
            }
        }
        let y_mean = if n > 0 {
            y.iter().sum::<f64>() / n as f64
        } else {
            0.0
        };
        // Normal equations (Z^T Z + lambda I) w = Z^T (y - mean).
        let mut a = vec![vec![0.0; p]; p];
        let mut b = vec![0.0; p];
        let mut z = vec![0.0; p];
        for (row, &yi) in x.iter().zip(y) {
            for j in 0..p {
                z[j] = (row[j] - mean[j]) / scale[j];
            }
            for j in 0..p {
                b[j] += z[j] * (yi - y_mean);
                for k in j..p {
                    a[j][k] += z[j] * z[k];
                }
            }
        }
        for j in 0..p {
            for k in 0..j {
                a[j][k] = a[k][j];
            }
            a[j][j] += lambda.max(1e-9);
        }
        let weights = solve(a, b);
        Ridge {
            mean,
            scale,
            weights,
            bias: y_mean,
        }
    }

    /// Why a ridge read from a file cannot predict rows of `columns` values, if it cannot.
    pub fn check(&self, columns: usize) -> Result<(), String> {
        let lens = [self.mean.len(), self.scale.len(), self.weights.len()];
        if lens.iter().any(|&l| l != columns) {
            return Err(format!(
                "ridge has {lens:?} mean/scale/weight values, the features {columns} columns"
            ));
        }
        let values = self.mean.iter().chain(&self.scale).chain(&self.weights);
        if !values.chain([&self.bias]).all(|v| v.is_finite())
            || self.scale.iter().any(|&s| s <= 0.0)
        {
            return Err("ridge holds NaN, infinity or a scale that is not positive".into());
        }
        Ok(())
    }

    pub fn predict(&self, x: &[f64]) -> f64 {
        self.bias
            + x.iter()
                .zip(&self.mean)
                .zip(&self.scale)
                .zip(&self.weights)
                .map(|(((v, m), s), w)| (v - m) / s * w)
                .sum::<f64>()
    }
}

/// Gaussian elimination with partial pivoting; the matrix is symmetric positive definite.
#[allow(clippy::needless_range_loop)]
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Vec<f64> {
    let n = b.len();
    for c in 0..n {
        let pivot = (c..n)
            .max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs()))
            .unwrap_or(c);
        a.swap(c, pivot);
        b.swap(c, pivot);
        let d = a[c][c];
        if d.abs() < 1e-300 {
            continue;
        }
        for r in c + 1..n {
            let f = a[r][c] / d;
            if f == 0.0 {
                continue;
            }
            for k in c..n {
                a[r][k] -= f * a[c][k];
            }
            b[r] -= f * b[c];
        }
    }
    let mut x = vec![0.0; n];
    for c in (0..n).rev() {
        let s: f64 = (c + 1..n).map(|k| a[c][k] * x[k]).sum();
        x[c] = if a[c][c].abs() < 1e-300 {
            0.0
        } else {
            (b[c] - s) / a[c][c]
        };
    }
    x
}

/// The ridge baseline's input: the mean and the maximum of every column over a program's
/// tokens.
pub fn pooled(tokens: &[f32], width: usize) -> Vec<f64> {
    let n = tokens.len() / width.max(1);
    let mut out = vec![0.0; 2 * width];
    if n == 0 {
        return out;
    }
    for j in 0..width {
        let mut max = f64::NEG_INFINITY;
        let mut sum = 0.0;
        for t in 0..n {
            let v = tokens[t * width + j] as f64;
            sum += v;
            max = max.max(v);
        }
        out[j] = sum / n as f64;
        out[width + j] = max;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(predicted: &[f64], latency: &[f64]) -> Ranked {
        Ranked {
            weight: 1.0,
            predicted: predicted.to_vec(),
            latency: latency.to_vec(),
        }
    }

    #[test]
    fn top_k_matches_hand_computed_values() {
        // Task 1: the model's favourite takes 2 ms, the best 1 ms. Task 2 (weight 3): perfect.
        let mut t2 = task(&[0.9, 0.1], &[4.0, 8.0]);
        t2.weight = 3.0;
        let tasks = vec![task(&[0.9, 0.5, 0.1], &[2.0, 3.0, 1.0]), t2];
        // (1 * 1 + 3 * 4) / (1 * 2 + 3 * 4) = 13 / 14.
        assert!((top_k_score(&tasks, 1) - 13.0 / 14.0).abs() < 1e-12);
        assert_eq!(top_k_score(&tasks, 3), 1.0);
        // All of the loss is task 1's (1 ms lost); task 2 loses nothing.
        assert_eq!(top1_loss_shares(&tasks), vec![1.0, 0.0]);
        assert_eq!(best_and_chosen(&tasks[0], 1), Some((1.0, 2.0)));
        assert_eq!(top1_loss_shares(&tasks[1..]), vec![0.0]);
    }

    #[test]
    fn the_task_mean_gives_a_heavy_task_no_more_say_than_a_light_one() {
        // A heavy task picked 4x off its best, beside three light tasks picked perfectly.
        let heavy = task(&[0.9, 0.1], &[4.0, 1.0]);
        let light = task(&[0.9, 0.1], &[0.001, 0.002]);
        let tasks = vec![heavy, light.clone(), light.clone(), light];
        // Latency-weighted: (1 + 3 * 0.001) / (4 + 3 * 0.001), about 0.25.
        assert!((top_k_score(&tasks, 1) - 1.003 / 4.003).abs() < 1e-12);
        // Per task: (0.25 + 1 + 1 + 1) / 4.
        assert!((top_k_task_mean(&tasks, 1) - 3.25 / 4.0).abs() < 1e-12);
        assert_eq!(top_k_task_mean(&tasks, 2), 1.0);
        assert_eq!(top_k_task_mean(&[], 1), 0.0);
    }

    #[test]
    fn per_task_criteria_and_their_paired_gain_match_hand_computed_values() {
        // Perfect on its two tasks; the other ranking picks 2x off the best on the first
        // (top-1 0.5, top-5 1, pairwise 0 of 1) and is perfect on the second.
        let good = vec![
            task(&[0.9, 0.1], &[1.0, 2.0]),
            task(&[0.9, 0.1], &[3.0, 4.0]),
        ];
        let bad = vec![
            task(&[0.1, 0.9], &[1.0, 2.0]),
            task(&[0.9, 0.1], &[3.0, 4.0]),
        ];
        assert_eq!(task_criteria(&good), vec![1.0, 1.0]);
        assert_eq!(task_criteria(&bad), vec![0.5, 1.0]);
        // Differences 0.5 and 0: mean 0.25, standard error sqrt(0.125 / 2) = 0.25.
        let g = paired_gain(&task_criteria(&good), &task_criteria(&bad));
        assert_eq!((g.mean, g.standard_error, g.tasks), (0.25, 0.25, 2));
        assert_eq!(g.z(), 1.0);
        assert_eq!(
            paired_gain(&task_criteria(&bad), &task_criteria(&good)).z(),
            -1.0
        );
        // Equal rankings gain nothing; one task tells nothing of the spread.
        assert_eq!(paired_gain(&[0.7, 0.8], &[0.7, 0.8]).z(), 0.0);
        assert_eq!(paired_gain(&[0.9], &[0.1]).z(), 0.0);
        // The same gain on every task: no spread, certain.
        assert_eq!(paired_gain(&[1.0, 0.5], &[0.5, 0.0]).z(), f64::INFINITY);
        // A task without pairs of distinct latency counts its pairwise term as a coin flip.
        assert_eq!(
            task_criteria(&[task(&[0.2, 0.1], &[1.0, 1.0])]),
            vec![2.5 / 3.0]
        );
    }

    #[test]
    fn pairwise_and_tau_match_hand_computed_values() {
        // Pairs: (0,1) right, (0,2) wrong, (1,2) wrong.
        let t = vec![task(&[3.0, 2.0, 1.0], &[1.0, 2.0, 0.5])];
        assert!((pairwise_accuracy(&t) - 1.0 / 3.0).abs() < 1e-12);
        assert!((kendall_tau(&t) - (1.0 - 2.0) / 3.0).abs() < 1e-12);
        let perfect = vec![task(&[3.0, 2.0, 1.0], &[1.0, 2.0, 3.0])];
        assert_eq!(kendall_tau(&perfect), 1.0);
        assert_eq!(pairwise_accuracy(&perfect), 1.0);
        let tied = vec![task(&[1.0, 1.0], &[1.0, 2.0])];
        assert_eq!(pairwise_accuracy(&tied), 0.5);
    }

    #[test]
    fn mape_and_ridge() {
        assert!((mape(&[1.1, 1.8], &[1.0, 2.0]) - 10.0).abs() < 1e-9);
        let x: Vec<Vec<f64>> = (0..50)
            .map(|i| vec![i as f64, (i * i % 7) as f64])
            .collect();
        let y: Vec<f64> = x.iter().map(|r| 3.0 * r[0] - 2.0 * r[1] + 1.0).collect();
        let r = Ridge::fit(&x, &y, 1e-6);
        assert!((r.predict(&[10.0, 3.0]) - 25.0).abs() < 1e-3);
    }

    #[test]
    fn random_baseline_is_between_worst_and_best() {
        let t = vec![task(
            &[0.0; 10],
            &(1..=10).map(|i| i as f64).collect::<Vec<_>>(),
        )];
        let m = random_baseline(&t, 200, 1);
        assert!(m.top1 > 0.1 && m.top1 < 0.6, "{m:?}");
        assert!((m.pairwise_accuracy - 0.5).abs() < 0.1);
    }
}
