//! Loop versioning for padding: tiles of a padded convolution that read only inside the input
//! run a copy of their body without bounds checks, and both copies compute the operator.

mod common;

use common::{Rng, measurer};
use proptest::prelude::*;
use tessel_cpu::generate;
use tessel_intrin::Catalog;
use tessel_ir::{ComputeOp, IterKind, Scope, Trace, Workload};
use tessel_measure::{Candidate, Measurer};

const FAST_COPY: &str = "every read of this tile is inside its tensor";

/// A register-tiled loop nest: every spatial loop split by its `tiles` factor (outer parts
/// first), the whole reduction between the outer and inner parts, the inner tile's loops
/// unrolled where `unroll`, the innermost vectorized, the accumulator local to the tile.
fn tiled(op: &ComputeOp, tiles: &[(&str, u64)], unroll: bool) -> Trace {
    let mut t = Trace::new();
    let mut outer = Vec::new();
    let mut inner = Vec::new();
    let mut reduction = Vec::new();
    for v in &op.iter_vars {
        let factor = tiles
            .iter()
            .find(|(n, _)| *n == v.name)
            .map_or(1, |&(_, f)| f);
        match v.kind {
            IterKind::Reduction => reduction.push(v.name.clone()),
            _ if factor > 1 => {
                t.split(&v.name, &[factor]);
                outer.push(format!("{}.0", v.name));
                inner.push(format!("{}.1", v.name));
            }
            _ => outer.push(v.name.clone()),
        }
    }
    let order: Vec<&str> = outer
        .iter()
        .chain(&reduction)
        .chain(&inner)
        .map(String::as_str)
        .collect();
    t.reorder(&order);
    t.cache_write(
        Scope::new("local").unwrap(),
        outer.last().map(String::as_str),
    );
    if unroll {
        for r in &reduction {
            t.unroll(r);
        }
        for i in inner.iter().rev().skip(1) {
            t.unroll(i);
        }
    }
    if let Some(last) = inner.last() {
        t.vectorize(last);
    }
    t
}

fn source(w: &Workload, t: &Trace) -> String {
    let catalog = Catalog::default();
    let program = t.lower(&w.to_op(), &catalog).unwrap();
    generate(&program, "k", &catalog).unwrap().source
}

#[test]
fn a_padded_depthwise_tile_runs_unchecked_inside_and_checked_at_the_border() {
    // 4 pixels of a row by 8 channels, the 3x3 window unrolled; 10 is not a multiple of 4, so
    // the last tile of each row also carries the split's guard.
    let w: Workload = "conv2d:n=1,h=10,w=10,c=16,k=16,r=3,s=3,stride=1,pad=1,groups=16,layout=nhwc,dtype=f32,epilogue=bias+relu"
        .parse()
        .unwrap();
    let t = tiled(&w.to_op(), &[("q", 4), ("g", 8)], true);
    let src = source(&w, &t);
    let fast = src.find(FAST_COPY).expect("a versioned body");
    let (fast_copy, slow_copy) = src[fast..].split_once("} else {").unwrap();
    // The fast copy reads the input without a check; the slow one keeps them.
    assert!(!fast_copy.contains("? I["), "{fast_copy}");
    assert!(slow_copy.contains("? I["), "{slow_copy}");
    let results = measurer(false).measure(&[Candidate::new(w.to_op(), t)]);
    assert!(results[0].is_ok(), "{:?}", results[0]);
}

#[test]
fn a_convolution_without_padding_is_not_versioned() {
    let w: Workload =
        "conv2d:n=1,h=10,w=12,c=16,k=16,r=3,s=3,stride=1,pad=0,groups=16,layout=nhwc,dtype=f32"
            .parse()
            .unwrap();
    let t = tiled(&w.to_op(), &[("q", 5), ("g", 8)], true);
    assert!(!source(&w, &t).contains(FAST_COPY));
}

/// A random padded convolution (grouped or not, either layout) and a random tiling of it.
fn random_case(rng: &mut Rng) -> (Workload, Trace) {
    let r = [1, 3, 3, 5][rng.below(4) as usize];
    let groups = [1, 2, 4][rng.below(3) as usize];
    let c = groups * (1 + rng.below(4));
    let k = groups * (1 + rng.below(4));
    let spec = format!(
        "conv2d:n=1,h={},w={},c={c},k={k},r={r},s={r},stride={},pad={},groups={groups},layout={},dtype=f32,epilogue=bias",
        6 + rng.below(10),
        6 + rng.below(10),
        1 + rng.below(2),
        1 + rng.below(r),
        if rng.below(2) == 0 { "nhwc" } else { "nchw" },
    );
    let w: Workload = spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"));
    let op = w.to_op();
    let mut tiles = Vec::new();
    for v in &op.iter_vars {
        if v.kind != IterKind::Reduction && v.extent > 1 && rng.below(3) > 0 {
            tiles.push((v.name.clone(), 2 + rng.below(v.extent.min(5) - 1)));
        }
    }
    let tiles: Vec<(&str, u64)> = tiles.iter().map(|(n, f)| (n.as_str(), *f)).collect();
    // Unrolling a 5x5 window by a large tile is slow to compile and tests nothing more.
    let t = tiled(&op, &tiles, r <= 3 && rng.below(2) == 0);
    (w, t)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random tilings of random padded convolutions compute the operator, versioned or not,
    /// and the versioning is there on some of them.
    #[test]
    fn versioned_tilings_compute_the_operator(seed in any::<u64>()) {
        let mut rng = Rng(seed | 1);
        let mut cases = Vec::new();
        let mut versioned = 0;
        while cases.len() < 12 {
            let (w, t) = random_case(&mut rng);
            versioned += usize::from(source(&w, &t).contains(FAST_COPY));
            cases.push((w, t));
        }
        eprintln!("{versioned} of 12 versioned");
        let cands: Vec<Candidate> = cases.iter().map(|(w, t)| Candidate::new(w.to_op(), t.clone())).collect();
        let results = measurer(false).measure(&cands);
        let failures: Vec<String> = cases
            .iter()
            .zip(&results)
            .filter_map(|((w, t), r)| r.as_ref().err().map(|e| format!("{w}\n  {t}\n  -> {e}")))
            .collect();
        prop_assert!(failures.is_empty(), "{}", failures.join("\n"));
        prop_assert!(versioned > 0, "no case of 12 was versioned");
    }
}
