//! The matcher's public promises, as properties over random small operators:
//! soundness (every mapping computes the operator), completeness (it finds every assignment a
//! brute-force enumerator finds), rejection (what it refuses, tessel-ir refuses too), no panics.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use tessel_intrin::{
    Catalog, DimAssignment, Intrinsic, Mapping, OperandTransform, TransformKind, match_op,
};
use tessel_ir::{ComputeOp, Conv2d, ConvLayout, DType, EpilogueSpec, Types, Workload};

fn arb_types() -> impl Strategy<Value = Types> {
    prop_oneof![
        Just(Types::same(DType::BF16)),
        Just(Types::same(DType::F16)),
        Just(Types::same(DType::F32)),
        Just(Types::same(DType::I8)),
        Just(Types {
            dtype: DType::U8,
            wdtype: DType::I8
        }),
    ]
}

fn arb_workload() -> impl Strategy<Value = Workload> {
    let e = EpilogueSpec::default();
    let gemm = (1u64..=7, 1u64..=7, 1u64..=7, arb_types(), any::<bool>()).prop_map(
        move |(m, n, k, types, dense)| {
            if dense {
                Workload::Dense {
                    m,
                    n,
                    k,
                    types,
                    epilogue: e,
                }
            } else {
                Workload::Gemm {
                    m,
                    n,
                    k,
                    types,
                    epilogue: e,
                }
            }
        },
    );
    let bmm = (1u64..=3, 1u64..=5, 1u64..=5, 1u64..=5, arb_types()).prop_map(
        move |(b, m, n, k, types)| Workload::Bmm {
            b,
            m,
            n,
            k,
            types,
            epilogue: e,
        },
    );
    let conv = (
        (1u64..=2, 1u64..=5, 1u64..=5, 1u64..=3, 1u64..=3),
        (
            1u64..=3,
            1u64..=3,
            1u64..=2,
            0u64..=1,
            1u64..=2,
            any::<bool>(),
            0u8..3,
        ),
        arb_types(),
    )
        .prop_filter_map(
            "kernel must fit",
            move |((n, h, w, c, k), (r, s, stride, pad, dilation, nchw, gsel), types)| {
                let conv = Conv2d {
                    n,
                    h,
                    w,
                    c,
                    k,
                    r,
                    s,
                    stride,
                    pad,
                    dilation,
                    // Ordinary, grouped (2) and depthwise convolutions.
                    groups: match gsel {
                        1 if c % 2 == 0 && k % 2 == 0 => 2,
                        2 if k % c == 0 => c,
                        _ => 1,
                    },
                    layout: if nchw {
                        ConvLayout::Nchw
                    } else {
                        ConvLayout::Nhwc
                    },
                };
                conv.output_hw()?;
                Some(Workload::Conv2d {
                    conv,
                    types,
                    epilogue: e,
                })
            },
        );
    prop_oneof![gemm, bmm, conv]
}

/// A catalog instruction shrunk to `m x n x k` (the interpreter then runs fast); the matcher
/// is shape-generic, so this exercises the same logic as the full-size instruction.
fn miniature(
    intr: &Intrinsic,
    (m, n, k): (u64, u64, u64),
) -> (Intrinsic, BTreeMap<String, ComputeOp>) {
    let mut mini = intr.clone();
    (mini.m, mini.n, mini.k) = (m, n, k);
    let table = BTreeMap::from([(mini.id.to_string(), mini.semantics())]);
    (mini, table)
}

/// Mostly an instruction whose dtypes fit the operator (so there is something to check),
/// sometimes any instruction (so refusals are exercised too).
fn pick_intrinsic(op: &ComputeOp, index: usize) -> Intrinsic {
    let all = Catalog::default().intrinsics;
    let (a, b) = (op.inputs[0].tensor.dtype, op.inputs[1].tensor.dtype);
    let fitting: Vec<&Intrinsic> = all
        .iter()
        .filter(|i| {
            let fit = |x: DType, y: DType| x.fits_exactly_in(y);
            i.acc == op.accumulator
                && ((fit(a, i.a) && fit(b, i.b)) || (fit(b, i.a) && fit(a, i.b)))
        })
        .collect();
    if index.is_multiple_of(5) || fitting.is_empty() {
        all[index % all.len()].clone()
    } else {
        fitting[index % fitting.len()].clone()
    }
}

/// An assignment as a comparable key: operand order and each group as a set of names.
fn key(m: &Mapping) -> ([usize; 2], [BTreeSet<String>; 3]) {
    let set = |d: &DimAssignment| d.vars.iter().cloned().collect::<BTreeSet<_>>();
    (
        m.operands,
        [set(&m.dims[0]), set(&m.dims[1]), set(&m.dims[2])],
    )
}

/// Every assignment of variables to {outer, m, n, k} and every operand order, kept when
/// tessel-ir accepts the tensorize step it implies.
fn brute_force(
    op: &ComputeOp,
    intr: &Intrinsic,
    table: &BTreeMap<String, ComputeOp>,
) -> (Vec<Mapping>, Vec<(Mapping, String)>) {
    let nvars = op.iter_vars.len();
    let (mut accepted, mut refused) = (Vec::new(), Vec::new());
    for operands in [[0usize, 1], [1, 0]] {
        for code in 0..4usize.pow(nvars as u32) {
            let mut groups: [Vec<usize>; 3] = Default::default();
            let mut outer = Vec::new();
            let mut c = code;
            for v in 0..nvars {
                match c % 4 {
                    0 => outer.push(v),
                    r => groups[r - 1].push(v),
                }
                c /= 4;
            }
            if groups.iter().any(Vec::is_empty) {
                continue;
            }
            let dim = |g: &Vec<usize>| DimAssignment {
                vars: g.iter().map(|&v| op.iter_vars[v].name.clone()).collect(),
                extent: g.iter().map(|&v| op.iter_vars[v].extent).product(),
                padded: 0,
            };
            let m = Mapping {
                intrinsic: intr.id.to_string(),
                operands,
                dims: [dim(&groups[0]), dim(&groups[1]), dim(&groups[2])],
                outer: outer
                    .iter()
                    .map(|&v| op.iter_vars[v].name.clone())
                    .collect(),
                // Convert-on-pack where the operand widens exactly to the instruction's type.
                transforms: operands
                    .iter()
                    .zip([intr.a, intr.b])
                    .map(|(&o, want)| {
                        let have = op.inputs[o].tensor.dtype;
                        OperandTransform {
                            input: op.inputs[o].tensor.name.clone(),
                            role: String::new(),
                            kind: TransformKind::Direct,
                            convert: have.widens_exactly_to(want).then_some(want),
                            bytes: 0,
                        }
                    })
                    .collect(),
            };
            match m.to_trace(intr).apply(op, table) {
                Ok(_) => accepted.push(m),
                Err(e) => refused.push((m, e.to_string())),
            }
        }
    }
    (accepted, refused)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn every_mapping_computes_the_operator(
        w in arb_workload(),
        which in 0usize..64,
        dims in (1u64..=3, 1u64..=3, 1u64..=3),
        seed in any::<u64>(),
    ) {
        let op = w.to_op();
        let (mini, table) = miniature(&pick_intrinsic(&op, which), dims);
        let Ok(mappings) = match_op(&op, &mini) else { return Ok(()) };
        let inputs = op.random_inputs(seed);
        let want = op.reference(&inputs).unwrap();
        for m in &mappings {
            let trace = m.to_trace(&mini);
            let program = trace.lower(&op, &table)
                .unwrap_or_else(|e| panic!("{w} / {}: {m}: {e}\n{trace}", mini.id));
            let got = program.run(&inputs).unwrap();
            let err = got.max_relative_error(&want);
            prop_assert!(err <= 1e-5, "{} {}: {}: error {}", w, mini.id, m, err);
            prop_assert!(m.padding_waste() >= 0.0 && m.padding_waste() < 1.0);
        }
    }

    #[test]
    fn the_matcher_finds_exactly_what_brute_force_finds(
        w in arb_workload(),
        which in 0usize..64,
        dims in (1u64..=4, 1u64..=4, 1u64..=4),
    ) {
        let op = w.to_op();
        let (mini, table) = miniature(&pick_intrinsic(&op, which), dims);
        let (accepted, refused) = brute_force(&op, &mini, &table);
        let found: BTreeSet<_> = match_op(&op, &mini).unwrap_or_default().iter().map(key).collect();
        let expected: BTreeSet<_> = accepted.iter().map(key).collect();
        prop_assert_eq!(&found, &expected, "{} on {}", w, mini.id);
        // Rejection: every assignment the matcher leaves out breaks a stated constraint.
        for (m, why) in &refused {
            prop_assert!(!found.contains(&key(m)));
            // tessel-ir names the step and the constraint: a group mixing spatial and
            // reduction loops cannot fuse; a tensorize whose dependences or dtypes disagree.
            prop_assert!(why.starts_with("trace step") && (why.contains("tensorize") || why.contains("fuse")), "{}", why);
        }
    }
}

#[test]
fn real_amx_shapes_compute_a_padded_gemm_and_conv() {
    let catalog = Catalog::default();
    for (spec, id) in [
        ("gemm:m=5,n=17,k=33,dtype=bf16", "amx.tdpbf16ps"),
        (
            "conv2d:n=1,h=4,w=4,c=3,k=5,r=3,s=3,pad=1,dtype=u8,wdtype=i8",
            "amx.tdpbusd",
        ),
        ("bmm:b=2,m=3,n=4,k=5,dtype=f16", "mma.m16n8k16.f16"),
    ] {
        let op = spec.parse::<Workload>().unwrap().to_op();
        let intr = catalog.get(id).unwrap();
        let inputs = op.random_inputs(1);
        let want = op.reference(&inputs).unwrap();
        let mappings = match_op(&op, intr).unwrap();
        for m in mappings.iter().take(3) {
            let got = m
                .to_trace(intr)
                .lower(&op, &catalog)
                .unwrap()
                .run(&inputs)
                .unwrap();
            assert!(got.max_relative_error(&want) <= 1e-5, "{spec}: {m}");
        }
    }
}

#[test]
fn conv2d_yields_the_classic_variants() {
    let op = "conv2d:n=1,h=14,w=14,c=64,k=64,r=3,s=3,stride=1,pad=1,layout=nhwc,dtype=bf16"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let catalog = Catalog::default();
    let mappings = match_op(&op, catalog.get("amx.tdpbf16ps").unwrap()).unwrap();
    let text: Vec<String> = mappings.iter().map(|m| m.to_string()).collect();
    let has = |s: &str| text.iter().any(|t| t.starts_with(s));
    // m <- (n, oh, ow), n <- oc, k <- (kh, kw, ic): the im2col GEMM.
    assert!(
        has("m <- (n, p, q) 196->208; n <- (k) 64->64; k <- (r, s, c) 576->576"),
        "{text:#?}"
    );
    // k <- ic only, the window loops outside: reads the (padded) input directly.
    assert!(has(
        "m <- (n, p, q) 196->208; n <- (k) 64->64; k <- (c) 64->64; outer (r, s)"
    ));
    let im2col = mappings
        .iter()
        .find(|m| m.dims[2].vars == ["r", "s", "c"] && m.operands == [0, 1])
        .unwrap();
    assert_eq!(
        im2col.transforms[0].kind,
        tessel_intrin::TransformKind::Im2col
    );
    assert_eq!(im2col.transforms[0].bytes, 208 * 576 * 2);
    assert_eq!(
        im2col.transforms[1].kind,
        tessel_intrin::TransformKind::VnniPack { group: 2 }
    );
}

#[test]
fn operators_no_instruction_serves_say_why() {
    let catalog = Catalog::default();
    let amx = catalog.get("amx.tdpbf16ps").unwrap();
    let f32_gemm = "gemm:m=4,n=4,k=4,dtype=f32"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let err = match_op(&f32_gemm, amx).unwrap_err().to_string();
    assert!(err.contains("f32 x f32"), "{err}");
    // An elementwise op (no reduction) is not a contraction.
    let mut ew = "gemm:m=4,n=4,k=1,dtype=bf16"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    ew.iter_vars[2].kind = tessel_ir::IterKind::Spatial;
    ew.iter_vars[2].name = "j".into();
    ew.output.indices.push(tessel_ir::AffineExpr::var(2));
    ew.output.tensor.shape.push(1);
    let err = match_op(&ew, amx).unwrap_err().to_string();
    assert!(err.contains("not a contraction"), "{err}");
}

#[test]
fn mappings_round_trip_through_json_for_tuning_records() {
    let catalog = Catalog::default();
    let op = "bmm:b=12,m=128,n=128,k=64,dtype=bf16"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    for m in match_op(&op, catalog.get("amx.tdpbf16ps").unwrap()).unwrap() {
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<Mapping>(&json).unwrap(), m);
    }
}
