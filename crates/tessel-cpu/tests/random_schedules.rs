//! Property: random valid schedules (scalar and tensorized on every CPU instruction) compile,
//! run and match the reference. Each case measures one batch, compiled into one object.

mod common;

use common::{CPU_INSTRUCTIONS, Rng, dtypes, measurer};
use proptest::prelude::*;
use tessel_intrin::{Catalog, match_op};
use tessel_ir::{ComputeOp, IterKind, Scope, Trace, Workload};
use tessel_measure::{Candidate, Measurer};

fn random_workload(rng: &mut Rng, types: &str) -> Workload {
    let d = |rng: &mut Rng, lo: u64, hi: u64| lo + rng.below(hi - lo + 1);
    let spec = match rng.below(3) {
        0 => format!(
            "gemm:m={},n={},k={},{types}",
            d(rng, 1, 40),
            d(rng, 1, 40),
            d(rng, 1, 70)
        ),
        1 => format!(
            "bmm:b={},m={},n={},k={},{types}",
            d(rng, 1, 3),
            d(rng, 1, 12),
            d(rng, 1, 20),
            d(rng, 1, 20)
        ),
        _ => format!(
            "conv2d:n=1,h={},w={},c={},k={},r=3,s=3,stride={},pad=1,layout={},{types}",
            d(rng, 3, 8),
            d(rng, 3, 8),
            d(rng, 1, 8),
            d(rng, 1, 20),
            d(rng, 1, 2),
            if rng.chance(50) { "nhwc" } else { "nchw" }
        ),
    };
    let epilogue = [
        ",epilogue=bias",
        ",epilogue=relu",
        ",epilogue=bias+relu",
        "",
    ];
    let spec = format!("{spec}{}", epilogue[rng.below(4) as usize]);
    spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"))
}

/// Loops of a schedule in order: (name, extent, kind).
fn loops(op: &ComputeOp, t: &Trace) -> Vec<(String, u64, IterKind)> {
    let s = t
        .apply(op, &Catalog::default())
        .unwrap_or_else(|e| panic!("invalid: {e}\n{t}"));
    s.loops()
        .into_iter()
        .map(|(n, e, k)| (n.to_string(), e, k))
        .collect()
}

/// Random splits, a random order, a parallel, an unrolled and a vectorized loop, a local
/// accumulator and a cache of the first input, each only where valid.
fn scalar_trace(rng: &mut Rng, op: &ComputeOp) -> Trace {
    let mut t = Trace::new();
    for v in &op.iter_vars {
        if v.extent > 1 && rng.chance(60) {
            t.split(&v.name, &[1 + rng.below(v.extent.min(6))]);
        }
    }
    let mut names: Vec<String> = loops(op, &t).into_iter().map(|l| l.0).collect();
    for i in (1..names.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        names.swap(i, j);
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    t.reorder(&refs);
    let ls = loops(op, &t);
    let first_reduction = ls
        .iter()
        .position(|l| l.2 == IterKind::Reduction)
        .unwrap_or(ls.len());
    let spatial: Vec<usize> = (0..ls.len())
        .filter(|&i| ls[i].2 == IterKind::Spatial)
        .collect();
    let local = Scope::new("local").unwrap();
    let mut parallel = None;
    if let Some(&p) = spatial.first()
        && rng.chance(50)
    {
        t.parallel(&ls[p].0);
        parallel = Some(p);
    }
    if first_reduction > 0 && rng.chance(50) {
        let at = rng.below(first_reduction as u64) as usize;
        t.cache_write(local.clone(), Some(&ls[at].0));
    }
    if rng.chance(40) {
        let at = rng.below(ls.len() as u64) as usize;
        t.cache_read(0, local, Some(&ls[at].0));
    }
    let last = ls.len() - 1;
    if ls[last].2 == IterKind::Spatial && parallel != Some(last) && rng.chance(40) {
        t.vectorize(&ls[last].0);
    } else if rng.chance(50) {
        let u = rng.below(ls.len() as u64) as usize;
        if parallel != Some(u) {
            t.unroll(&ls[u].0);
        }
    }
    t
}

/// A random mapping of the operator onto a random CPU instruction, with its outer loops
/// randomly parallel, unrolled and given a local accumulator.
fn tensorized_trace(rng: &mut Rng, op: &ComputeOp, id: &str) -> Option<Trace> {
    let catalog = Catalog::default();
    let intr = catalog.get(id)?;
    let mappings = match_op(op, intr).ok()?;
    let m = &mappings[rng.below(mappings.len() as u64) as usize];
    let mut t = m.to_trace(intr);
    let ls = loops(op, &t);
    // The mapping's loops come last: three tensorized ones after their outer parts.
    let n_outer = ls.len() - 3;
    if n_outer > 0 && ls[0].2 == IterKind::Spatial && rng.chance(50) {
        t.parallel(&ls[0].0);
        if rng.chance(50) {
            t.cache_write(Scope::new("local").unwrap(), Some(&ls[0].0));
        }
    } else if n_outer > 1 && rng.chance(50) {
        let u = 1 + rng.below(n_outer as u64 - 1) as usize;
        t.unroll(&ls[u].0);
    }
    Some(t)
}

fn batch(seed: u64) -> (Vec<String>, Vec<Candidate>) {
    let mut rng = Rng(seed | 1);
    let mut labels = Vec::new();
    let mut cands = Vec::new();
    while cands.len() < 12 {
        let id = CPU_INSTRUCTIONS[rng.below(CPU_INSTRUCTIONS.len() as u64) as usize];
        let w = random_workload(&mut rng, &dtypes(id));
        let op = w.to_op();
        let trace = if rng.chance(50) {
            match tensorized_trace(&mut rng, &op, id) {
                Some(t) => t,
                None => continue,
            }
        } else {
            scalar_trace(&mut rng, &op)
        };
        labels.push(format!("{w}\n  {trace}"));
        cands.push(Candidate::new(op, trace));
    }
    (labels, cands)
}

/// Measures `cands` (checked against the interpreter) and describes each that failed.
fn failures(labels: &[String], cands: &[Candidate]) -> Vec<String> {
    let results = measurer(true).measure(cands);
    labels
        .iter()
        .zip(&results)
        .filter_map(|(l, r)| r.as_ref().err().map(|e| format!("{l}\n  -> {e}")))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_schedules_compute_the_operator(seed in any::<u64>()) {
        let (labels, cands) = batch(seed);
        let failures = failures(&labels, &cands);
        prop_assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2, failure_persistence: None, ..ProptestConfig::default() })]

    /// The naive kernel that checks large candidates, in its reordered loop order, computes
    /// what the interpreter does on random operators of every type.
    #[test]
    fn the_naive_reference_order_computes_the_operator(seed in any::<u64>()) {
        let mut rng = Rng(seed | 1);
        let mut labels = Vec::new();
        let mut cands = Vec::new();
        for _ in 0..12 {
            let id = CPU_INSTRUCTIONS[rng.below(CPU_INSTRUCTIONS.len() as u64) as usize];
            let w = random_workload(&mut rng, &dtypes(id));
            let op = w.to_op();
            let trace = tessel_cpu::naive::naive_order(&op);
            labels.push(format!("{w}\n  {trace}"));
            cands.push(Candidate::new(op, trace));
        }
        let failures = failures(&labels, &cands);
        prop_assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
