//! AMX tiles of fewer than 16 rows: a convolution's tiles end where an image row ends, and
//! the padded input (`Step::Pad`) is read where it lies, with no im2col copy per call.

mod common;

use common::{assert_all_ok, dtypes, failures, measurer, report_emulated};
use proptest::prelude::*;
use tessel_cpu::codegen::generate;
use tessel_intrin::Catalog;
use tessel_ir::{LayoutTransform, Scope, Trace, Workload};
use tessel_measure::{Candidate, Measurer};

fn workload(spec: &str) -> Workload {
    spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"))
}

/// The direct convolution on `rows`-row tiles: output pixels fused into m and split by the
/// rows, the input padded once at the root, the weights packed into the VNNI layout of 32
/// output channels, 2 x 2 accumulator tiles held across the window and the channel steps.
fn direct_trace(id: &str, rows: u64, k_tile: u64) -> Trace {
    let group = k_tile / 16;
    let mut t = Trace::new();
    t.reorder(&["n", "r", "s", "p", "q", "k", "c"]);
    t.fuse(&["p", "q"]);
    t.split("p_q", &[2, rows])
        .split("k", &[2, 16])
        .split("c", &[1, k_tile]);
    t.reorder(&[
        "n", "k.0", "p_q.0", "c.0", "r", "s", "c.1", "p_q.1", "k.1", "p_q.2", "k.2", "c.2",
    ]);
    // W[k, r, s, c] as [r, s, k / 32, c / g, 32, g].
    t.pack(
        1,
        LayoutTransform {
            splits: vec![(0, 32), (3, group)],
            order: vec![2, 3, 0, 4, 1, 5],
        },
    );
    t.cache_write(Scope::new("local").unwrap(), Some("p_q.0"));
    t.pad(0);
    t.unroll("p_q.1").unroll("k.1");
    t.tensorize(id, &[("m", "p_q.2"), ("n", "k.2"), ("k", "c.2")], &[0, 1]);
    t
}

#[test]
fn partial_tiles_read_the_padded_input_in_place_and_compute_the_reference() {
    let mut cands = Vec::new();
    let mut labels = Vec::new();
    for id in ["amx.tdpbf16ps", "amx.tdpbusd"] {
        let k_tile = if id == "amx.tdpbf16ps" { 32 } else { 64 };
        // (spec, rows): 14 rows of a 14-pixel row, padded; 12 of 12 at stride 2 with a bias
        // and ReLU; 10 of a 10-wide 5x5 window padded by 2; 8 of 8 with a bias.
        for (spec, rows) in [
            (
                format!(
                    "conv2d:n=1,h=14,w=14,c={k_tile},k=64,r=3,s=3,stride=1,pad=1,layout=nhwc,{}",
                    dtypes(id)
                ),
                14,
            ),
            (
                format!(
                    "conv2d:n=1,h=24,w=24,c={k_tile},k=64,r=3,s=3,stride=2,pad=1,layout=nhwc,{},epilogue=bias+relu",
                    dtypes(id)
                ),
                12,
            ),
            (
                format!(
                    "conv2d:n=1,h=10,w=10,c={k_tile},k=64,r=5,s=5,stride=1,pad=2,layout=nhwc,{}",
                    dtypes(id)
                ),
                10,
            ),
            (
                format!(
                    "conv2d:n=1,h=8,w=8,c={k_tile},k=64,r=3,s=3,stride=1,pad=1,layout=nhwc,{},epilogue=bias",
                    dtypes(id)
                ),
                8,
            ),
        ] {
            let op = workload(&spec).to_op();
            let t = direct_trace(id, rows, k_tile);
            let program = t.lower(&op, &Catalog::default()).unwrap();
            let kernel = generate(&program, "k", &Catalog::default()).unwrap();
            let src = &kernel.source;
            // The kernel's own tile configuration: accumulators and A on `rows` rows, B on 16.
            let cfg = format!("{{{rows}, {rows}, {rows}, {rows}, {rows}, {rows}, 16, 16}}");
            assert!(
                src.contains(&cfg),
                "{spec}: no {cfg} configuration in\n{src}"
            );
            assert!(
                src.contains("_tile_loadconfig(&k_tilecfg)"),
                "{spec}:\n{src}"
            );
            // A register block reading the padded copy in place: nothing gathered per call,
            // and no bounds test in the padding pass either.
            assert!(
                src.contains("register block: 4 accumulator(s)"),
                "{spec}:\n{src}"
            );
            assert!(
                !src.contains("tsl_tile_A"),
                "{spec}: A gathered per call:\n{src}"
            );
            assert!(src.contains("I_padded"), "{spec}:\n{src}");
            assert!(
                !src.contains(" ? I["),
                "{spec}: the padding pass tests bounds:\n{src}"
            );
            // The accumulator lives per register block: its tiles start at zero (or at the
            // bias) and go straight to the output unless a ReLU comes between.
            let (bias, relu) = (spec.contains("bias"), spec.contains("relu"));
            assert!(
                src.contains("_tile_zero(0);") || (bias && !relu),
                "{spec}:\n{src}"
            );
            assert_eq!(
                src.contains("straight to the output"),
                !relu,
                "{spec}:\n{src}"
            );
            assert_eq!(
                src.contains("the bias in every row"),
                bias && !relu,
                "{spec}:\n{src}"
            );
            labels.push(format!("{id} {spec}"));
            cands.push(Candidate::new(op, t));
        }
    }
    assert_all_ok(&labels, &measurer(true).measure(&cands));
    report_emulated(&["amx.tdpbf16ps", "amx.tdpbusd"]);
}

#[test]
fn a_partial_tile_is_refused_where_the_instruction_takes_whole_tiles_only() {
    // Vector instructions have one row: nothing shorter. AMX takes 1-16 rows, not 17.
    let op = workload("gemm:m=64,n=64,k=64,dtype=bf16").to_op();
    let mut t = Trace::new();
    t.split("m", &[20]).split("n", &[16]).split("k", &[32]);
    t.reorder(&["m.0", "n.0", "k.0", "m.1", "n.1", "k.1"]);
    t.tensorize(
        "amx.tdpbf16ps",
        &[("m", "m.1"), ("n", "n.1"), ("k", "k.1")],
        &[0, 1],
    );
    let e = t.lower(&op, &Catalog::default()).unwrap_err().to_string();
    assert!(e.contains("does not match `m`"), "{e}");
    let mut t = Trace::new();
    t.split("m", &[8]).split("n", &[16]).split("k", &[32]);
    t.reorder(&["m.0", "n.0", "k.0", "m.1", "n.1", "k.1"]);
    t.tensorize(
        "avx512.vdpbf16ps",
        &[("m", "m.1"), ("n", "n.1"), ("k", "k.1")],
        &[0, 1],
    );
    let e = t.lower(&op, &Catalog::default()).unwrap_err().to_string();
    assert!(e.contains("does not match `m`"), "{e}");
}

#[test]
fn whole_tiles_keep_the_preludes_configuration() {
    // Sixteen rows: no configuration of the kernel's own (the code of every record before
    // partial tiles is unchanged).
    let op = workload("gemm:m=64,n=64,k=64,dtype=bf16").to_op();
    let mut t = Trace::new();
    t.split("m", &[16]).split("n", &[16]).split("k", &[32]);
    t.reorder(&["m.0", "n.0", "k.0", "m.1", "n.1", "k.1"]);
    t.tensorize(
        "amx.tdpbf16ps",
        &[("m", "m.1"), ("n", "n.1"), ("k", "k.1")],
        &[0, 1],
    );
    let program = t.lower(&op, &Catalog::default()).unwrap();
    let src = generate(&program, "k", &Catalog::default()).unwrap().source;
    assert!(
        src.contains("TSL_AMX_INIT();") && !src.contains("tilecfg"),
        "{src}"
    );
}

/// A random direct AMX convolution: rows of 8-14 pixels, padded or not, with or without an
/// epilogue, the accumulator per register block or per channel block, maybe a cache of the
/// padded input inside the pixel block (a statement between the accumulator's fill and its
/// register block), pixel or channel blocks outermost.
fn random_direct(rng: &mut common::Rng) -> (String, Trace) {
    let id = if rng.chance(50) {
        "amx.tdpbf16ps"
    } else {
        "amx.tdpbusd"
    };
    let k_tile = if id == "amx.tdpbf16ps" { 32 } else { 64 };
    let rows = 8 + rng.below(7);
    let (r, stride) = (1 + 2 * rng.below(2), 1 + rng.below(2));
    let pad = if r == 1 { 0 } else { rng.below(2) };
    // Output width `rows`: w = (rows - 1) * stride + r - 2 pad.
    let w = (rows - 1) * stride + r - 2 * pad;
    let h = 1 + rng.below(3);
    let h_in = (h - 1) * stride + r - 2 * pad;
    let epilogue = ["", ",epilogue=bias", ",epilogue=bias+relu"][rng.below(3) as usize];
    let spec = format!(
        "conv2d:n=1,h={h_in},w={w},c={},k={},r={r},s={r},stride={stride},pad={pad},layout=nhwc,{}{epilogue}",
        k_tile * (1 + rng.below(2)),
        32 * (1 + rng.below(2)),
        dtypes(id)
    );
    let group = k_tile / 16;
    let pixels_first = rng.chance(50);
    let mut t = Trace::new();
    t.reorder(&["n", "r", "s", "p", "q", "k", "c"]);
    t.fuse(&["p", "q"]);
    t.split("p_q", &[1, rows])
        .split("k", &[2, 16])
        .split("c", &[1, k_tile]);
    let blocks: [&str; 3] = if pixels_first {
        ["p_q.0", "k.0", "c.0"]
    } else {
        ["k.0", "c.0", "p_q.0"]
    };
    let mut order = vec!["n"];
    order.extend(blocks);
    order.extend(["r", "s", "c.1", "p_q.1", "k.1", "p_q.2", "k.2", "c.2"]);
    t.reorder(&order);
    t.pack(
        1,
        LayoutTransform {
            splits: vec![(0, 32), (3, group)],
            order: vec![2, 3, 0, 4, 1, 5],
        },
    );
    let local = Scope::new("local").unwrap();
    // The accumulator per register block (right outside the channel steps, pixels first),
    // or per channel block (around every pixel block).
    let at = if pixels_first && rng.chance(50) {
        "k.0"
    } else if pixels_first {
        "p_q.0"
    } else {
        "k.0"
    };
    t.cache_write(local.clone(), Some(at));
    if pad > 0 || rng.chance(30) {
        t.pad(0);
    }
    if rng.chance(30) {
        t.cache_read(0, local, Some(blocks[2]));
    }
    t.unroll("p_q.1").unroll("k.1");
    t.tensorize(id, &[("m", "p_q.2"), ("n", "k.2"), ("k", "c.2")], &[0, 1]);
    (spec, t)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3, ..ProptestConfig::default() })]

    #[test]
    fn random_direct_convolutions_on_partial_tiles_compute_the_reference(seed in any::<u64>()) {
        let mut rng = common::Rng(seed | 1);
        let mut cands = Vec::new();
        let mut labels = Vec::new();
        for _ in 0..8 {
            let (spec, t) = random_direct(&mut rng);
            let op = workload(&spec).to_op();
            labels.push(format!("{spec}: {t}"));
            cands.push(Candidate::new(op, t));
        }
        let failed = failures(&labels, &measurer(true).measure(&cands));
        prop_assert!(failed.is_empty(), "{}", failed.join("\n"));
    }
}
