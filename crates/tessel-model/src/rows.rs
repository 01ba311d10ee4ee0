//! The rows the gradient-boosted trees see: one fixed-length vector per program, built from
//! its variable-length allocation tokens.
//!
//! Pooling every column over all tokens ([`crate::metrics::pooled`], the mean and the maximum)
//! mixes the levels of the memory hierarchy: the L1 footprint of one buffer and the memory
//! traffic of another land in the same column. The trees' rows add what a hand-written cost
//! model would compute first, so a split can name it:
//! - the compute statements grouped by what they do (the instruction or vector update,
//!   packing copies, epilogue stores): how many, each column's maximum, the total work;
//! - the data tokens grouped by memory level: how many, each column's maximum and minimum
//!   (the worst reuse, the longest stride), the total bytes moved and resident;
//! - the analytic roofline's terms ([`tessel_features::roofline`]) as `ln` seconds.
//!
//! Tokens of another width (the primitive-sequence ablation) get the pooled part only.

use tessel_features::roofline;
use tessel_features::{Col, WIDTH};

use crate::metrics::pooled;

/// Which rows a set of trees was fitted on; stored with them so that a file fitted on one
/// kind is never fed the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RowKind {
    /// The mean and maximum of every column (every file written before 2026-12-05's
    /// thirteenth session).
    #[default]
    Pooled,
    /// Pooled, then grouped by statement kind and memory level, then the roofline's terms.
    Grouped,
}

impl RowKind {
    /// The row of one program's tokens (row-major, `width` columns each).
    pub fn row(self, tokens: &[f32], width: usize) -> Vec<f64> {
        match self {
            RowKind::Pooled => pooled(tokens, width),
            RowKind::Grouped => grouped(tokens, width),
        }
    }

    /// How long the row of `width`-column tokens is.
    pub fn len(self, width: usize) -> usize {
        match self {
            RowKind::Pooled => 2 * width,
            RowKind::Grouped if width == WIDTH => 2 * width + GROUPED_EXTRA,
            RowKind::Grouped => 2 * width,
        }
    }
}

const COMPUTE_COLUMNS: std::ops::RangeInclusive<usize> =
    Col::ComputeTensorized as usize..=Col::ComputePipeline as usize;
const DATA_COLUMNS: std::ops::RangeInclusive<usize> =
    Col::DataRoleInput as usize..=Col::DataBankConflict as usize;
/// Data columns whose values add up across buffers (bytes), summed in the linear domain.
const DATA_SUMMED: [Col; 4] = [
    Col::DataBytesIn,
    Col::DataBytesOut,
    Col::DataFootprint,
    Col::DataTransformBytes,
];
/// Compute columns summed across the statements of a group (work and calls).
const COMPUTE_SUMMED: [Col; 2] = [Col::ComputeFlops, Col::ComputeInvocations];
/// Statement groups: the instruction or vector/scalar update, packing copies, stores.
const COMPUTE_GROUPS: usize = 3;
/// Memory levels, in [`tessel_features::MemoryLevel`] order.
const LEVEL_FLAGS: [Col; 5] = [
    Col::DataLevelMemory,
    Col::DataLevelL2,
    Col::DataLevelL1,
    Col::DataLevelShared,
    Col::DataLevelRegister,
];
const ROOFLINE_TERMS: usize = 6;

const fn span(r: &std::ops::RangeInclusive<usize>) -> usize {
    *r.end() - *r.start() + 1
}

const COMPUTE_GROUP_LEN: usize = 1 + span(&COMPUTE_COLUMNS) + COMPUTE_SUMMED.len();
const DATA_GROUP_LEN: usize = 1 + 2 * span(&DATA_COLUMNS) + DATA_SUMMED.len();
const GROUPED_EXTRA: usize =
    COMPUTE_GROUPS * COMPUTE_GROUP_LEN + LEVEL_FLAGS.len() * DATA_GROUP_LEN + ROOFLINE_TERMS;

fn unlog(v: f32) -> f64 {
    (2f64.powf(v as f64) - 1.0).max(0.0)
}

fn relog(x: f64) -> f64 {
    (x.max(0.0) + 1.0).log2()
}

/// Pooled, then the groups and the roofline (see the module's doc).
fn grouped(tokens: &[f32], width: usize) -> Vec<f64> {
    let mut row = pooled(tokens, width);
    if width != WIDTH {
        return row;
    }
    let at = |t: &[f32], c: Col| t[c as usize];
    let mut compute = vec![Group::new(span(&COMPUTE_COLUMNS), COMPUTE_SUMMED.len()); 3];
    let mut data = vec![Group::new(span(&DATA_COLUMNS), DATA_SUMMED.len()); LEVEL_FLAGS.len()];
    for t in tokens.chunks_exact(WIDTH) {
        if at(t, Col::KindCompute) == 1.0 {
            let g = if at(t, Col::ComputeCopy) == 1.0 {
                1
            } else if at(t, Col::ComputeStore) == 1.0 {
                2
            } else {
                0
            };
            compute[g].add(&t[COMPUTE_COLUMNS], COMPUTE_SUMMED.map(|c| at(t, c)));
        } else if at(t, Col::KindData) == 1.0
            && let Some(level) = LEVEL_FLAGS.iter().position(|&c| at(t, c) == 1.0)
        {
            data[level].add(&t[DATA_COLUMNS], DATA_SUMMED.map(|c| at(t, c)));
        }
    }
    for g in &compute {
        g.push_to(&mut row, false);
    }
    for g in &data {
        g.push_to(&mut row, true);
    }
    let terms = roofline::breakdown(tokens).map_or([f64::NAN; ROOFLINE_TERMS], |b| {
        [b.compute, b.memory, b.l2, b.l1, b.copies, b.seconds()]
    });
    row.extend(terms.map(|s| if s > 0.0 { s.ln() } else { -60.0 }));
    debug_assert_eq!(row.len(), RowKind::Grouped.len(width));
    row
}

/// One group's running count, maxima, minima and linear-domain sums.
#[derive(Clone)]
struct Group {
    count: usize,
    max: Vec<f32>,
    min: Vec<f32>,
    sums: Vec<f64>,
}

impl Group {
    fn new(columns: usize, summed: usize) -> Group {
        Group {
            count: 0,
            max: vec![f32::NEG_INFINITY; columns],
            min: vec![f32::INFINITY; columns],
            sums: vec![0.0; summed],
        }
    }

    fn add<const N: usize>(&mut self, columns: &[f32], summed: [f32; N]) {
        self.count += 1;
        for (j, &v) in columns.iter().enumerate() {
            self.max[j] = self.max[j].max(v);
            self.min[j] = self.min[j].min(v);
        }
        for (s, v) in self.sums.iter_mut().zip(summed) {
            *s += unlog(v);
        }
    }

    /// Appends the count, the maxima, the minima (when `with_min`) and the sums; an empty
    /// group gives zeros (a missing level moves nothing).
    fn push_to(&self, row: &mut Vec<f64>, with_min: bool) {
        let seen = |v: f32| if self.count == 0 { 0.0 } else { v as f64 };
        row.push(self.count as f64);
        row.extend(self.max.iter().map(|&v| seen(v)));
        if with_min {
            row.extend(self.min.iter().map(|&v| seen(v)));
        }
        row.extend(self.sums.iter().map(|&s| relog(s)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(set: &[(Col, f32)]) -> Vec<f32> {
        let mut t = vec![0.0; WIDTH];
        for &(c, v) in set {
            t[c as usize] = v;
        }
        t
    }

    #[test]
    fn the_grouped_row_has_its_declared_length_and_keeps_levels_apart() {
        let l1 = token(&[
            (Col::KindData, 1.0),
            (Col::DataLevelL1, 1.0),
            (Col::DataBytesIn, 10.0),
        ]);
        let memory = token(&[
            (Col::KindData, 1.0),
            (Col::DataLevelMemory, 1.0),
            (Col::DataBytesIn, 20.0),
        ]);
        let tokens = [l1.clone(), memory].concat();
        let row = RowKind::Grouped.row(&tokens, WIDTH);
        assert_eq!(row.len(), RowKind::Grouped.len(WIDTH));
        // Pooled alone sees one maximum of bytes_in, 20, whichever level it came from.
        let pooled = RowKind::Pooled.row(&tokens, WIDTH);
        assert_eq!(pooled[WIDTH + Col::DataBytesIn as usize], 20.0);
        // Grouped keeps the memory level's and the L1's apart.
        assert_ne!(row, RowKind::Grouped.row(&[l1.clone(), l1].concat(), WIDTH));
        let data_start = 2 * WIDTH + COMPUTE_GROUPS * COMPUTE_GROUP_LEN;
        let bytes_in = Col::DataBytesIn as usize - *DATA_COLUMNS.start();
        let memory_max = row[data_start + 1 + bytes_in];
        let l1_max = row[data_start + 2 * DATA_GROUP_LEN + 1 + bytes_in];
        assert_eq!((memory_max, l1_max), (20.0, 10.0));
    }

    #[test]
    fn two_buffers_at_one_level_add_their_bytes() {
        let a = token(&[
            (Col::KindData, 1.0),
            (Col::DataLevelL2, 1.0),
            (Col::DataBytesIn, relog(1000.0) as f32),
        ]);
        let row = RowKind::Grouped.row(&[a.clone(), a].concat(), WIDTH);
        let l2 = 2 * WIDTH + COMPUTE_GROUPS * COMPUTE_GROUP_LEN + DATA_GROUP_LEN;
        let sum = row[l2 + DATA_GROUP_LEN - DATA_SUMMED.len()];
        assert!((sum - relog(2000.0)).abs() < 1e-3, "{sum}");
    }

    #[test]
    fn other_widths_are_pooled_only() {
        let tokens = vec![1.0f32; 12];
        assert_eq!(
            RowKind::Grouped.row(&tokens, 4),
            RowKind::Pooled.row(&tokens, 4)
        );
        assert_eq!(RowKind::Grouped.len(4), 8);
    }
}
