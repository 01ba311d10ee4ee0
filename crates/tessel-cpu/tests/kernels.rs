//! Generated kernels compute what the operator defines, for every instruction, through the
//! register-block, direct and staged (padded) paths, with and without epilogues.

mod common;

use common::{CPU_INSTRUCTIONS, assert_all_ok, dtypes, measurer, report_emulated};
use tessel_cpu::reference::reference_gemm;
use tessel_intrin::{Catalog, TransformKind, match_op};
use tessel_ir::{LayoutTransform, Scope, Trace, Workload};
use tessel_measure::{Candidate, Measurer};

fn workload(spec: &str) -> Workload {
    spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"))
}

#[test]
fn reference_schedules_compute_gemm_on_every_instruction() {
    let mut cands = Vec::new();
    let mut labels = Vec::new();
    for id in CPU_INSTRUCTIONS {
        // Dividing shapes take the register-block path; the epilogue variants the store path.
        for (shape, extra) in [
            ("m=64,n=96,k=128", ""),
            ("m=32,n=48,k=64", ",epilogue=bias+relu"),
        ] {
            let spec = format!("gemm:{shape},{}{extra}", dtypes(id));
            let w = workload(&spec);
            let trace = reference_gemm(&w, id, None).unwrap_or_else(|e| panic!("{spec}: {e}"));
            labels.push(format!("{id} {spec}"));
            cands.push(Candidate::new(w.to_op(), trace));
        }
    }
    let results = measurer(true).measure(&cands);
    assert_all_ok(&labels, &results);
    report_emulated(&CPU_INSTRUCTIONS);
}

#[test]
fn convert_on_pack_feeds_narrow_types_to_wider_instructions() {
    // bf16/f16 into the f32 FMAs, u8 x i8 into vpmaddwd's i16: the register-block path
    // (dividing shapes, reference schedule) and the staged one (padding, matcher mapping).
    let catalog = Catalog::default();
    let mut cands = Vec::new();
    let mut labels = Vec::new();
    for (id, types) in [
        ("avx2.vfmadd231ps", "dtype=bf16"),
        ("avx2.vfmadd231ps", "dtype=f16"),
        ("avx512.vfmadd231ps", "dtype=bf16"),
        ("avx2.vpmaddwd", "dtype=u8,wdtype=i8"),
        ("avx2.vpmaddwd", "dtype=i8"),
    ] {
        let spec = format!("gemm:m=32,n=48,k=64,{types},epilogue=bias+relu");
        let w = workload(&spec);
        let trace = reference_gemm(&w, id, None).unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert!(trace.to_string().contains("cast("), "{trace}");
        labels.push(format!("{id} {spec}"));
        cands.push(Candidate::new(w.to_op(), trace));
        let spec =
            format!("conv2d:n=1,h=6,w=5,c=8,k=20,r=3,s=3,stride=1,pad=1,layout=nhwc,{types}");
        let op = workload(&spec).to_op();
        let intr = catalog.get(id).unwrap();
        let mappings = match_op(&op, intr).unwrap_or_else(|e| panic!("{id} {spec}: {e}"));
        assert!(mappings[0].converts(), "{}", mappings[0]);
        labels.push(format!("{id} {spec} [{}]", mappings[0]));
        cands.push(Candidate::new(op, mappings[0].to_trace(intr)));
    }
    let results = measurer(true).measure(&cands);
    assert_all_ok(&labels, &results);
}

#[test]
fn matcher_mappings_compute_odd_shapes_and_convolutions() {
    let catalog = Catalog::default();
    let mut cands = Vec::new();
    let mut labels = Vec::new();
    for id in CPU_INSTRUCTIONS {
        let intr = catalog.get(id).unwrap();
        let specs = [
            // Nothing divides: every call is padded and staged.
            format!("gemm:m=20,n=37,k=70,{}", dtypes(id)),
            format!("bmm:b=2,m=5,n=17,k=9,{},epilogue=relu", dtypes(id)),
            // A 3x3 convolution with padding, and a strided one in NCHW.
            format!(
                "conv2d:n=1,h=6,w=5,c=8,k=20,r=3,s=3,stride=1,pad=1,layout=nhwc,{}",
                dtypes(id)
            ),
            format!(
                "conv2d:n=2,h=7,w=7,c=3,k=5,r=3,s=3,stride=2,pad=1,layout=nchw,{},epilogue=bias",
                dtypes(id)
            ),
        ];
        for spec in specs {
            let op = workload(&spec).to_op();
            let mappings = match_op(&op, intr).unwrap_or_else(|e| panic!("{id} {spec}: {e}"));
            // The best mapping, and an im2col one where the matcher found it.
            let mut chosen = vec![&mappings[0]];
            if let Some(m) = mappings
                .iter()
                .skip(1)
                .find(|m| m.transforms.iter().any(|t| t.kind == TransformKind::Im2col))
            {
                chosen.push(m);
            }
            for m in chosen {
                labels.push(format!("{id} {spec} [{m}]"));
                cands.push(Candidate::new(op.clone(), m.to_trace(intr)));
            }
        }
    }
    let results = measurer(true).measure(&cands);
    assert_all_ok(&labels, &results);
}

#[test]
fn scalar_schedules_with_caches_parallel_loops_and_epilogues() {
    let specs = [
        "gemm:m=33,n=17,k=19,dtype=f32,epilogue=bias+relu",
        "gemm:m=16,n=24,k=40,dtype=bf16,epilogue=bias,out=bf16",
        "gemm:m=9,n=13,k=31,dtype=u8,wdtype=i8,epilogue=bias+relu,out=u8",
        "dense:m=7,n=20,k=12,dtype=f16",
        "conv2d:n=1,h=9,w=9,c=4,k=6,r=3,s=3,stride=2,pad=1,layout=nhwc,dtype=i8,epilogue=bias",
    ];
    let local = Scope::new("local").unwrap();
    let mut cands = Vec::new();
    let mut labels = Vec::new();
    for spec in specs {
        let op = workload(spec).to_op();
        // The naive nest.
        labels.push(format!("{spec} naive"));
        cands.push(Candidate::new(op.clone(), Trace::new()));
        // A tiled nest: outer parallel, an L1 cache of the first input, a local accumulator,
        // an unrolled and a vectorized inner loop.
        let s = &op.iter_vars;
        let first = s[0].name.clone();
        let last_spatial = op.spatial_vars().last().map(|v| s[v].name.clone()).unwrap();
        let mut t = Trace::new();
        t.split(&first, &[4]);
        t.parallel(&format!("{first}.0"));
        t.cache_write(local.clone(), Some(&format!("{first}.0")));
        t.cache_read(0, local.clone(), Some(&format!("{first}.0")));
        let mut order: Vec<String> = vec![format!("{first}.0")];
        order.extend(op.reduction_vars().map(|v| s[v].name.clone()));
        order.push(format!("{first}.1"));
        for v in op.spatial_vars().skip(1) {
            order.push(s[v].name.clone());
        }
        let order_refs: Vec<&str> = order.iter().map(String::as_str).collect();
        t.reorder(&order_refs);
        t.unroll(&format!("{first}.1"));
        if last_spatial != first {
            t.vectorize(&last_spatial);
        }
        labels.push(format!("{spec} tiled: {t}"));
        cands.push(Candidate::new(op, t));
    }
    let results = measurer(true).measure(&cands);
    assert_all_ok(&labels, &results);
}

#[test]
fn a_padded_register_block_over_a_packed_a_block_is_exact() {
    // GotoBLAS's nest with a 6-row register block on m = 100 (the last block pads 2 rows):
    // A's mc x kc block is packed with zeros below row 100, so the generated register block
    // runs without guards; only the store (and its epilogue) is guarded.
    let local = Scope::new("local").unwrap();
    let mut cands = Vec::new();
    let mut labels = Vec::new();
    for (id, lanes) in [("avx2.vfmadd231ps", 8), ("avx512.vfmadd231ps", 16)] {
        for spec in [
            "gemm:m=100,n=64,k=96,dtype=f32",
            "gemm:m=50,n=32,k=40,dtype=f32,epilogue=bias+relu",
        ] {
            let w = workload(spec);
            let n_blocks = if spec.contains("n=64") { 2 } else { 1 };
            let mut t = Trace::new();
            t.split("m", &[4, 6, 1])
                .split("n", &[n_blocks, 2, lanes])
                .split("k", &[32, 1]);
            t.reorder(&[
                "n.0", "k.0", "m.0", "n.1", "m.1", "k.1", "m.2", "n.2", "m.3", "n.3", "k.2",
            ]);
            t.cache_read(0, local.clone(), Some("m.0"));
            t.unroll("m.2").unroll("n.2");
            t.tensorize(id, &[("m", "m.3"), ("n", "n.3"), ("k", "k.2")], &[0, 1]);
            labels.push(format!("{id} {spec}: {t}"));
            cands.push(Candidate::new(w.to_op(), t));
        }
    }
    let results = measurer(true).measure(&cands);
    assert_all_ok(&labels, &results);
}

/// The C that `t` generates on `op` (panics naming `what` where it does not lower).
fn generated_c(t: &Trace, op: &tessel_ir::ComputeOp, what: &str) -> String {
    let catalog = Catalog::default();
    let program = t
        .lower(op, &catalog)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    tessel_cpu::generate(&program, "k", &catalog)
        .unwrap()
        .source
}

/// A register-blocked convolution that reads its input in place (no im2col copy): `mr`
/// output pixels by `nr` vectors of output channels, held across the channel loop.
fn in_place_conv_trace(op: &tessel_ir::ComputeOp, id: &str, mr: u64, nr: u64) -> Trace {
    let catalog = Catalog::default();
    let intr = catalog.get(id).unwrap();
    // The mapping of output pixels to m, output channels to n, input channels to k.
    let mappings = match_op(op, intr).unwrap();
    let m = mappings
        .iter()
        .find(|m| {
            let vars = |d: usize| m.dims[d].vars.join(",");
            (vars(0), vars(1), vars(2)) == ("p,q".into(), "k".into(), "c".into())
        })
        .unwrap_or_else(|| panic!("{id}: no (p q, k, c) mapping"));
    let mut t = Trace::new();
    m.cast_steps(&mut t);
    let outer: Vec<&str> = m.outer.iter().map(String::as_str).collect();
    let fused = m.fuse_dims(&mut t, &outer);
    let (fm, fnn, fk) = (&fused[0], &fused[1], &fused[2]);
    t.split(fm, &[mr, intr.m]).split(fnn, &[nr, intr.n]);
    let k_tiles = m.dims[2].extent / intr.k;
    t.split(fk, &[k_tiles, intr.k]);
    let p = |x: &str, i: u32| format!("{x}.{i}");
    let mut order: Vec<String> = m
        .outer
        .iter()
        .filter(|v| !["r", "s"].contains(&v.as_str()))
        .cloned()
        .collect();
    order.extend([p(fm, 0), p(fnn, 0), p(fk, 0), "r".into(), "s".into()]);
    order.extend([p(fk, 1), p(fm, 1), p(fnn, 1), p(fm, 2), p(fnn, 2), p(fk, 2)]);
    let refs: Vec<&str> = order.iter().map(String::as_str).collect();
    t.reorder(&refs);
    // The weights W[k, r, s, c] packed as [r, s, k / (nr n), c / g, nr n, g] (g: the
    // instruction's k elements per 32-bit lane), so B's tiles are contiguous.
    let group = if intr.k > 1 {
        (4 / intr.b.bytes() as u64).min(intr.k)
    } else {
        1
    };
    let layout = if group > 1 {
        LayoutTransform {
            splits: vec![(0, nr * intr.n), (3, group)],
            order: vec![2, 3, 0, 4, 1, 5],
        }
    } else {
        LayoutTransform {
            splits: vec![(0, nr * intr.n)],
            order: vec![2, 3, 0, 4, 1],
        }
    };
    t.pack(m.operands[1], layout);
    t.cache_write(Scope::new("local").unwrap(), Some(&p(fnn, 0)));
    t.unroll(&p(fm, 1)).unroll(&p(fnn, 1));
    t.tensorize(
        id,
        &[("m", &p(fm, 2)), ("n", &p(fnn, 2)), ("k", &p(fk, 2))],
        &m.operands,
    );
    t
}

#[test]
fn a_padded_convolution_read_in_place_by_a_register_block_is_exact() {
    // No im2col copy: each of the block's pixels reads the input where it lies, or a buffer
    // of zeros where its 3x3 window leaves the image (the padded border), chosen once per
    // (r, s) outside the channel loop.
    let catalog = Catalog::default();
    let mut cands = Vec::new();
    let mut labels = Vec::new();
    for id in CPU_INSTRUCTIONS {
        if id.starts_with("amx") {
            continue;
        }
        let lanes = catalog.get(id).unwrap().n;
        for spec in [
            format!(
                "conv2d:n=1,h=6,w=5,c=8,k={},r=3,s=3,stride=1,pad=1,layout=nhwc,{}",
                2 * lanes,
                dtypes(id)
            ),
            format!(
                "conv2d:n=2,h=7,w=7,c=8,k={},r=3,s=3,stride=2,pad=2,layout=nhwc,{},epilogue=bias+relu",
                lanes,
                dtypes(id)
            ),
        ] {
            let op = workload(&spec).to_op();
            // 6x5 and 5x5 output pixels: blocks of 3 and 5 pixels divide them; 4 and 3 leave
            // padding rows, which read zeros.
            let blocks = if spec.contains("n=1") {
                [(3, 2), (4, 2)]
            } else {
                [(5, 1), (3, 1)]
            };
            for (mr, nr) in blocks {
                let t = in_place_conv_trace(&op, id, mr, nr);
                let source = generated_c(&t, &op, &format!("{id} {spec}"));
                assert!(
                    source.contains("register block") && source.contains("tsl_zero_a"),
                    "{id} {spec} ({mr} pixels): not read in place by a register block:\n{source}"
                );
                labels.push(format!("{id} {spec}: {t}"));
                cands.push(Candidate::new(op.clone(), t));
            }
        }
    }
    let results = measurer(true).measure(&cands);
    assert_all_ok(&labels, &results);
    report_emulated(&CPU_INSTRUCTIONS);
}

#[test]
fn a_register_block_holds_its_accumulators_across_the_whole_convolution_window() {
    // The input copied per block of pixels (padding included), the window loops (r, s) and
    // the channel loops directly nested: one register block over all of them, accumulators
    // loaded once before c.0 and stored once after (on AMX a tile stored and reloaded at every
    // tap waits for its store).
    let catalog = Catalog::default();
    let local = Scope::new("local").unwrap();
    let mut cands = Vec::new();
    let mut labels = Vec::new();
    for id in CPU_INSTRUCTIONS {
        let intr = catalog.get(id).unwrap();
        let (mi, ni, ki) = (intr.m, intr.n, intr.k);
        for spec in [
            format!(
                "conv2d:n=1,h=8,w=8,c={},k={},r=3,s=3,stride=1,pad=1,layout=nhwc,{}",
                2 * ki,
                2 * ni,
                dtypes(id)
            ),
            format!(
                "conv2d:n=1,h=8,w=8,c={},k={},r=3,s=3,stride=1,pad=1,layout=nhwc,{},epilogue=bias+relu",
                2 * ki,
                2 * ni,
                dtypes(id)
            ),
        ] {
            let w = workload(&spec);
            let op = w.to_op();
            let mut t = Trace::new();
            // vpmaddwd multiplies u8 x i8 widened to i16 (convert-on-pack).
            if w.types().dtype != intr.a {
                t.cast(0, intr.a);
            }
            if w.types().wdtype != intr.b {
                t.cast(1, intr.b);
            }
            t.reorder(&["r", "s", "n", "p", "q", "k", "c"]);
            t.fuse(&["n", "p", "q"]);
            t.split("n_p_q", &[2, mi])
                .split("k", &[2, ni])
                .split("c", &[1, ki]);
            t.reorder(&[
                "k.0", "n_p_q.0", "c.0", "r", "s", "c.1", "n_p_q.1", "k.1", "n_p_q.2", "k.2", "c.2",
            ]);
            // W[k, r, s, c] as [r, s, k / 2n, c / g, 2n, g]: B's tiles contiguous, in the
            // instruction's (VNNI) layout.
            let group = if ki > 1 {
                (4 / intr.b.bytes() as u64).min(ki)
            } else {
                1
            };
            t.pack(
                1,
                LayoutTransform {
                    splits: vec![(0, 2 * ni), (3, group)],
                    order: vec![2, 3, 0, 4, 1, 5],
                },
            );
            t.cache_write(local.clone(), Some("n_p_q.0"));
            t.cache_read(0, local.clone(), Some("n_p_q.0"));
            t.unroll("n_p_q.1").unroll("k.1");
            t.tensorize(id, &[("m", "n_p_q.2"), ("n", "k.2"), ("k", "c.2")], &[0, 1]);
            let source = generated_c(&t, &op, &format!("{id} {spec}"));
            assert!(
                source.contains("held across `c.0`, `r`, `s`, `c.1`"),
                "{id} {spec}: the window loops are not inside the register block:\n{source}"
            );
            labels.push(format!("{id} {spec}: {t}"));
            cands.push(Candidate::new(op, t));
        }
    }
    let results = measurer(true).measure(&cands);
    assert_all_ok(&labels, &results);
    report_emulated(&CPU_INSTRUCTIONS);
}

#[test]
fn a_tile_whose_rows_cross_a_fused_loop_boundary_is_not_loaded_with_one_stride() {
    // Output pixels (p, q) fused into m: a 16-row AMX tile of a 12-wide image spans two image
    // rows, so its rows are not one stride apart, although they are for most tiles (those
    // that start early enough in a row). Likewise (s, c) fused into k with c = 48 under a
    // 32-deep bf16 tile. Found on a real AMX machine: a dataset's schedule loaded such a tile
    // directly and flipped the sign of an output.
    let mut cands = Vec::new();
    let mut labels = Vec::new();
    for id in ["amx.tdpbf16ps", "amx.tdpbusd"] {
        let c = if id == "amx.tdpbf16ps" { 48 } else { 96 };
        let (ti, tk) = if id == "amx.tdpbf16ps" {
            (16, 32)
        } else {
            (16, 64)
        };
        for spec in [
            // 28 x 28 output pixels: 49 tiles of 16, 3 in 7 crossing a row of 28 (the dataset's
            // conv, ResNet-50's downsampling 1x1).
            format!(
                "conv2d:n=1,h=56,w=56,c=64,k=128,r=1,s=1,stride=2,pad=0,layout=nhwc,{},epilogue=bias",
                dtypes(id)
            ),
            // 2 x 88 output pixels: 11 tiles of 16, one of them crossing.
            format!(
                "conv2d:n=1,h=2,w=88,c={tk},k=16,r=1,s=1,stride=1,pad=0,layout=nhwc,{}",
                dtypes(id)
            ),
            // 2 x c window elements fused: 3 tiles of tk, the middle one crossing c.
            format!(
                "conv2d:n=1,h=4,w=9,c={c},k=16,r=1,s=2,stride=1,pad=0,layout=nhwc,{}",
                dtypes(id)
            ),
        ] {
            let w = workload(&spec);
            let op = w.to_op();
            let extent = |v: &str| op.iter_vars.iter().find(|x| x.name == v).unwrap().extent;
            let (pq, sc) = (extent("p") * extent("q"), extent("s") * extent("c"));
            let mut t = Trace::new();
            t.reorder(&["n", "r", "p", "q", "k", "s", "c"]);
            t.fuse(&["p", "q"]).fuse(&["s", "c"]);
            assert!(
                pq % ti == 0 && sc % tk == 0,
                "{spec}: tiles must divide (no guards)"
            );
            t.split("p_q", &[1, ti])
                .split("k", &[1, 16])
                .split("s_c", &[1, tk]);
            t.reorder(&[
                "n", "p_q.0", "k.0", "s_c.0", "r", "s_c.1", "p_q.1", "k.1", "p_q.2", "k.2", "s_c.2",
            ]);
            t.cache_write(Scope::new("local").unwrap(), Some("k.0"));
            t.tensorize(id, &[("m", "p_q.2"), ("n", "k.2"), ("k", "s_c.2")], &[0, 1]);
            labels.push(format!("{id} {spec}: {t}"));
            cands.push(Candidate::new(op, t));
        }
    }
    let results = measurer(true).measure(&cands);
    assert_all_ok(&labels, &results);
    report_emulated(&["amx.tdpbf16ps", "amx.tdpbusd"]);
}

#[test]
fn a_kernel_whose_weights_come_packed_computes_the_same_on_every_allocation() {
    // The int8 reference schedule packs B (the weights) into i16 at its root.
    let w = workload("gemm:m=64,n=64,k=64,dtype=u8,wdtype=i8");
    let trace = reference_gemm(&w, "avx2.vpmaddwd", None).unwrap();
    let plain = Candidate::new(w.to_op(), trace);
    let packed = plain.clone().with_prepacked_weights(w.weight_input());
    let mut m = common::measurer_with(tessel_cpu::CpuOptions {
        emulate: true,
        timing: tessel_cpu::TimingOptions {
            allocations: 2,
            ..tessel_cpu::TimingOptions::single_run()
        },
        ..Default::default()
    });
    // The pre-packed kernel takes the packed copy in B's slot; a pack function fills it.
    let job = m.prepare(&packed, "k").unwrap();
    let (pack, operand, bytes) = job.pack.as_ref().expect("B is packed at the root");
    assert_eq!((*operand, *bytes), (1, 64 * 64 * 2));
    assert!(
        job.kernel.source.contains("arrives packed"),
        "{}",
        pack.source
    );
    assert!(m.prepare(&plain, "k").unwrap().pack.is_none());

    let r = m.measure(&[plain, packed]);
    let (a, b) = (r[0].as_ref().unwrap(), r[1].as_ref().unwrap());
    // Exact integers both ways, timed on two allocations each; another kernel was timed.
    assert_eq!((a.max_error, b.max_error), (0.0, 0.0));
    assert!(b.allocation_spread.is_some(), "{b:?}");
    assert_ne!(a.kernel, b.kernel);
}
