//! Shared helpers of tessel-ir's integration tests: small random operators, a test intrinsic
//! table, and a generator of random valid traces.
#![allow(dead_code)]

use proptest::prelude::*;
use tessel_ir::{
    AffineExpr, ComputeOp, Conv2d, ConvLayout, DType, EpilogueSpec, IntrinsicResolver, IterKind,
    IterVar, LayoutTransform, Operand, Scope, TensorDecl, Trace, Types, Workload,
};

/// Resolves ids `mma.MxNxK.A.B`: `C[i,j] += A[i,kk] * B[kk,j]` with those extents and dtypes.
pub struct TestIntrinsics;

pub fn mma_id(m: u64, n: u64, k: u64, a: DType, b: DType) -> String {
    format!("mma.{m}x{n}x{k}.{a}.{b}")
}

impl IntrinsicResolver for TestIntrinsics {
    fn resolve(&self, id: &str) -> Option<ComputeOp> {
        let parts: Vec<&str> = id.split('.').collect();
        let [_, dims, a, b] = parts.as_slice() else {
            return None;
        };
        let d: Vec<u64> = dims
            .split('x')
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        let (a, b): (DType, DType) = (a.parse().ok()?, b.parse().ok()?);
        let acc = if a.is_float() { DType::F32 } else { DType::I32 };
        let v = AffineExpr::var;
        let operand = |name: &str, shape, dtype, idx| Operand {
            tensor: TensorDecl::new(name, shape, dtype, ""),
            indices: idx,
        };
        Some(ComputeOp {
            name: id.to_string(),
            iter_vars: vec![
                IterVar::spatial("i", d[0]),
                IterVar::spatial("j", d[1]),
                IterVar::reduction("kk", d[2]),
            ],
            inputs: vec![
                operand("a", vec![d[0], d[2]], a, vec![v(0), v(2)]),
                operand("b", vec![d[2], d[1]], b, vec![v(2), v(1)]),
            ],
            output: operand("c", vec![d[0], d[1]], acc, vec![v(0), v(1)]),
            accumulator: acc,
            epilogue: vec![],
        })
    }
}

pub fn arb_types() -> impl Strategy<Value = Types> {
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

pub fn arb_epilogue() -> impl Strategy<Value = (bool, bool, bool)> {
    (any::<bool>(), any::<bool>(), any::<bool>())
}

fn with_epilogue(w: Workload, (bias, relu, narrow): (bool, bool, bool)) -> Workload {
    let t = w.types();
    let out = narrow.then_some(t.dtype);
    w.with_epilogue(EpilogueSpec { bias, relu, out })
}

/// Small operators of every kind, so the interpreter runs fast.
pub fn arb_workload() -> impl Strategy<Value = Workload> {
    let gemm = (
        1u64..=9,
        1u64..=9,
        1u64..=9,
        arb_types(),
        arb_epilogue(),
        any::<bool>(),
    )
        .prop_map(|(m, n, k, types, e, dense)| {
            let w = if dense {
                Workload::Dense {
                    m,
                    n,
                    k,
                    types,
                    epilogue: EpilogueSpec::default(),
                }
            } else {
                Workload::Gemm {
                    m,
                    n,
                    k,
                    types,
                    epilogue: EpilogueSpec::default(),
                }
            };
            with_epilogue(w, e)
        });
    let bmm = (
        1u64..=3,
        1u64..=6,
        1u64..=6,
        1u64..=6,
        arb_types(),
        arb_epilogue(),
    )
        .prop_map(|(b, m, n, k, types, e)| {
            with_epilogue(
                Workload::Bmm {
                    b,
                    m,
                    n,
                    k,
                    types,
                    epilogue: EpilogueSpec::default(),
                },
                e,
            )
        });
    let conv = (
        (1u64..=2, 1u64..=6, 1u64..=6, 1u64..=4, 1u64..=4),
        (
            1u64..=3,
            1u64..=3,
            1u64..=2,
            0u64..=2,
            1u64..=2,
            any::<bool>(),
            0u8..3,
        ),
        arb_types(),
        arb_epilogue(),
    )
        .prop_filter_map(
            "kernel must fit",
            |((n, h, w, c, k), (r, s, stride, pad, dilation, nchw, gsel), types, e)| {
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
                Some(with_epilogue(
                    Workload::Conv2d {
                        conv,
                        types,
                        epilogue: EpilogueSpec::default(),
                    },
                    e,
                ))
            },
        );
    prop_oneof![gemm, bmm, conv]
}

/// Runs the program and the reference; integers must agree exactly, floats within rounding.
pub fn check_against_reference(op: &ComputeOp, trace: &Trace, seed: u64) -> Result<(), String> {
    let program = trace
        .lower(op, &TestIntrinsics)
        .map_err(|e| format!("lowering failed: {e}"))?;
    let inputs = op.random_inputs(seed);
    let got = program
        .run(&inputs)
        .map_err(|e| format!("run failed: {e}\n{program}"))?;
    let want = op.reference(&inputs).map_err(|e| e.to_string())?;
    let err = got.max_relative_error(&want);
    let tol = if op.output.tensor.dtype.is_float() {
        1e-5
    } else {
        0.0
    };
    if err > tol {
        return Err(format!(
            "result differs from the reference by {err}\ntrace:\n{trace}\nprogram:\n{program}"
        ));
    }
    Ok(())
}

/// A deterministic generator for trace choices.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x2545_f491_4f6c_dd1d)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

fn scope(name: &str) -> Scope {
    Scope::new(name).expect("test scope names are valid")
}

fn current_loops(op: &ComputeOp, t: &Trace) -> Vec<(String, u64, IterKind)> {
    let s = t
        .apply(op, &TestIntrinsics)
        .unwrap_or_else(|e| panic!("generator produced an invalid trace: {e}\n{t}"));
    s.loops()
        .into_iter()
        .map(|(n, e, k)| (n.to_string(), e, k))
        .collect()
}

/// A random trace that is valid by construction: multi-level splits (with padding), a fuse,
/// a reorder, maybe a tensorize, packs, caches at random depths, and annotations.
pub fn random_valid_trace(op: &ComputeOp, seed: u64) -> Trace {
    let mut rng = Rng::new(seed);
    let mut t = Trace::new();
    let nvars = op.iter_vars.len();
    let dep = |o: usize, v: usize| op.inputs[o].depends_on(v);

    // Plan a tensorization: i indexes only instruction input A, j only B, kk both.
    let mut plan = None;
    if rng.chance(50) {
        let swap = rng.chance(50);
        let (a, b) = if swap { (1, 0) } else { (0, 1) };
        let pick = |rng: &mut Rng, f: &dyn Fn(usize) -> bool| {
            let c: Vec<usize> = (0..nvars).filter(|&v| f(v)).collect();
            (!c.is_empty()).then(|| c[rng.below(c.len())])
        };
        let spatial = |v: usize| op.iter_vars[v].kind == IterKind::Spatial;
        let i = pick(&mut rng, &|v| spatial(v) && dep(a, v) && !dep(b, v));
        let j = pick(&mut rng, &|v| spatial(v) && dep(b, v) && !dep(a, v));
        let kk = pick(&mut rng, &|v| !spatial(v) && dep(a, v) && dep(b, v));
        if let (Some(i), Some(j), Some(kk)) = (i, j, kk) {
            let dims = [
                1 + rng.below(3) as u64,
                1 + rng.below(3) as u64,
                1 + rng.below(3) as u64,
            ];
            plan = Some(([i, j, kk], dims, [a, b]));
        }
    }

    // Splits: tensorized variables get the instruction's extent innermost.
    let mut by_role: [Option<String>; 3] = [None, None, None];
    for v in 0..nvars {
        let name = op.iter_vars[v].name.clone();
        let planned = plan.and_then(|(vars, dims, _)| {
            vars.iter()
                .position(|&x| x == v)
                .map(|role| (role, dims[role]))
        });
        match planned {
            Some((role, f)) => {
                let mut factors = Vec::new();
                if rng.chance(40) {
                    factors.push(1 + rng.below(3) as u64);
                }
                factors.push(f);
                t.split(&name, &factors);
                by_role[role] = Some(format!("{name}.{}", factors.len()));
            }
            None if rng.chance(60) => {
                let parts = 1 + rng.below(2);
                let factors: Vec<u64> = (0..parts).map(|_| 1 + rng.below(4) as u64).collect();
                t.split(&name, &factors);
            }
            None => {}
        }
    }

    let innermost: Vec<String> = by_role.into_iter().flatten().collect();

    // A fuse of two adjacent loops of the same kind, outside the tensorized ones.
    if rng.chance(30) {
        let loops = current_loops(op, &t);
        let candidates: Vec<usize> = (0..loops.len().saturating_sub(1))
            .filter(|&p| {
                loops[p].2 == loops[p + 1].2
                    && !innermost.contains(&loops[p].0)
                    && !innermost.contains(&loops[p + 1].0)
            })
            .collect();
        if !candidates.is_empty() {
            let p = candidates[rng.below(candidates.len())];
            t.fuse(&[&loops[p].0, &loops[p + 1].0]);
        }
    }

    // Reorder at random, the tensorized loops last.
    let loops = current_loops(op, &t);
    let mut outer: Vec<String> = loops
        .iter()
        .map(|l| l.0.clone())
        .filter(|n| !innermost.contains(n))
        .collect();
    rng.shuffle(&mut outer);
    let mut inner = innermost.clone();
    rng.shuffle(&mut inner);
    let order: Vec<String> = outer.iter().chain(&inner).cloned().collect();
    let order_refs: Vec<&str> = order.iter().map(String::as_str).collect();
    t.reorder(&order_refs);

    if let Some((_, dims, operands)) = plan {
        let a = op.inputs[operands[0]].tensor.dtype;
        let b = op.inputs[operands[1]].tensor.dtype;
        let id = mma_id(dims[0], dims[1], dims[2], a, b);
        t.tensorize(
            &id,
            &[
                ("i", &innermost[0]),
                ("j", &innermost[1]),
                ("kk", &innermost[2]),
            ],
            &[operands[0], operands[1]],
        );
    }

    // Packs (split a dimension and permute) or padded copies.
    for o in 0..op.inputs.len() {
        if rng.chance(20) {
            t.pad(o);
        } else if rng.chance(30) {
            let rank = op.inputs[o].tensor.shape.len();
            let d = rng.below(rank);
            let mut order: Vec<usize> = (0..=rank).collect();
            rng.shuffle(&mut order);
            t.pack(
                o,
                LayoutTransform {
                    splits: vec![(d, 2 + rng.below(2) as u64)],
                    order,
                },
            );
        }
    }

    let t0 = outer.len();
    // The accumulator: outside every reduction loop.
    if rng.chance(50) {
        let first_red = loops_positions_first_reduction(op, &t).min(t0);
        let a = rng.below(first_red + 1);
        let at = (a > 0).then(|| order[a - 1].clone());
        let sc = ["local", "global", "amx.tile"][rng.below(3)];
        t.cache_write(scope(sc), at.as_deref());
    }
    // Caches at nondecreasing depths.
    for o in 0..op.inputs.len() {
        let mut depth = 0;
        for _ in 0..rng.below(3) {
            depth += rng.below(t0 + 1 - depth);
            let at = (depth > 0).then(|| order[depth - 1].clone());
            let sc = ["shared", "l2", "local"][rng.below(3)];
            t.cache_read(o, scope(sc), at.as_deref());
        }
    }

    // Annotations on the non-tensorized loops.
    let loops = current_loops(op, &t);
    let spatial_outer: Vec<usize> = (0..t0)
        .filter(|&p| loops[p].2 == IterKind::Spatial)
        .collect();
    let mut vectorized = None;
    if t0 > 0 && loops[t0 - 1].2 == IterKind::Spatial && rng.chance(40) {
        t.vectorize(&loops[t0 - 1].0);
        vectorized = Some(t0 - 1);
    }
    let spatial_outer: Vec<usize> = spatial_outer
        .into_iter()
        .filter(|&p| Some(p) != vectorized)
        .collect();
    if !spatial_outer.is_empty() && rng.chance(50) {
        let p = spatial_outer[rng.below(spatial_outer.len())];
        if rng.chance(50) {
            t.parallel(&loops[p].0);
        } else {
            t.bind(&loops[p].0, tessel_ir::GpuAxis::BlockX);
        }
    }
    if t0 > 0 && rng.chance(40) {
        let p = rng.below(t0);
        if loops[p].2 == IterKind::Reduction {
            // Spatial loops may already carry another kind; reductions never do.
            t.unroll(&loops[p].0);
        }
        t.pipeline(&loops[p].0, 1 + rng.below(3) as u32);
        t.annotate(&loops[p].0, "note", "random");
    }
    t
}

fn loops_positions_first_reduction(op: &ComputeOp, t: &Trace) -> usize {
    let loops = current_loops(op, t);
    loops
        .iter()
        .position(|l| l.2 == IterKind::Reduction)
        .unwrap_or(loops.len())
}
