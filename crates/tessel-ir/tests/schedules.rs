//! Hand-written schedules: what a lowered program looks like, and the errors bad steps get.

mod common;

use common::*;
use tessel_ir::{BufferRole, GpuAxis, LayoutTransform, Scope, Step, Stmt, Trace, Workload};

fn gemm(spec: &str) -> tessel_ir::ComputeOp {
    spec.parse::<Workload>().unwrap().to_op()
}

fn scope(s: &str) -> Scope {
    Scope::new(s).unwrap()
}

/// A CPU-style schedule: parallel outer blocks, a register block of instruction tiles, B packed
/// into VNNI pairs and cached per block, the accumulator in tile registers.
fn tiled_gemm_trace() -> Trace {
    let mut t = Trace::new();
    t.split("m", &[2, 4])
        .split("n", &[3, 4])
        .split("k", &[2])
        .reorder(&["m.0", "n.0", "k.0", "m.1", "n.1", "m.2", "n.2", "k.1"])
        .tensorize(
            "mma.4x4x2.bf16.bf16",
            &[("i", "m.2"), ("j", "n.2"), ("kk", "k.1")],
            &[0, 1],
        )
        .pack(
            1,
            LayoutTransform {
                splits: vec![(0, 2)],
                order: vec![0, 2, 1],
            },
        )
        .cache_read(1, scope("l2"), Some("n.0"))
        .cache_write(scope("amx.tile"), Some("n.0"))
        .parallel("m.0")
        .unroll("n.1");
    t
}

#[test]
fn a_tiled_tensorized_gemm_matches_the_reference() {
    let op = gemm("gemm:m=64,n=48,k=40,dtype=bf16,epilogue=bias+relu,out=bf16");
    let trace = tiled_gemm_trace();
    check_against_reference(&op, &trace, 7).unwrap();

    let program = trace.lower(&op, &TestIntrinsics).unwrap();
    let text = program.to_string();
    assert!(text.contains("parallel for m.0 in 0..8"), "{text}");
    assert!(
        text.contains("alloc acc: f32[2, 3, 4, 4] in amx.tile"),
        "{text}"
    );
    assert!(
        text.contains("alloc B_packed: bf16[20, 48, 2] in global"),
        "{text}"
    );
    let mut calls = Vec::new();
    program.body.walk(&mut |s| {
        if let Stmt::Tensorized(c) = s {
            calls.push(c.clone());
        }
    });
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    // A[m, k] row-major: i moves one row (k extent 40), kk one element.
    assert_eq!(
        call.strides(0, &program.vars),
        vec![vec![1, 0], vec![0, 0], vec![0, 1]]
    );
    let packed = program
        .buffers
        .iter()
        .filter(|b| matches!(b.role, BufferRole::Cache { operand: 1, .. }))
        .count();
    assert_eq!(packed, 1);
}

#[test]
fn the_committed_trace_fixture_replays() {
    let json = include_str!("../../../fixtures/traces/gemm_tiled.json");
    let trace = Trace::from_json(json).unwrap();
    assert_eq!(trace, tiled_gemm_trace(), "fixture and code disagree");
    let op = gemm("gemm:m=64,n=48,k=40,dtype=bf16");
    check_against_reference(&op, &trace, 3).unwrap();
}

#[test]
fn int8_with_padding_is_exact() {
    // u8 x i8 -> i32, sizes that no factor divides.
    let op = gemm("gemm:m=7,n=5,k=9,dtype=u8,wdtype=i8,epilogue=bias");
    let mut t = Trace::new();
    t.split("m", &[4])
        .split("n", &[2])
        .split("k", &[4])
        .reorder(&["n.0", "m.0", "k.0", "m.1", "n.1", "k.1"])
        .tensorize(
            "mma.4x2x4.u8.i8",
            &[("i", "m.1"), ("j", "n.1"), ("kk", "k.1")],
            &[0, 1],
        )
        .cache_read(0, scope("local"), Some("k.0"));
    check_against_reference(&op, &t, 11).unwrap();
}

/// A trace built by `build`.
fn trace(build: impl FnOnce(&mut Trace)) -> Trace {
    let mut t = Trace::new();
    build(&mut t);
    t
}

fn step_error(op: &tessel_ir::ComputeOp, steps: &mut Trace) -> String {
    steps.apply(op, &TestIntrinsics).unwrap_err().to_string()
}

#[test]
fn invalid_steps_are_named_in_the_error() {
    let op = gemm("gemm:m=16,n=16,k=16,dtype=bf16");
    let cases: Vec<(Trace, &str)> = vec![
        (
            trace(|t| {
                t.split("x", &[2]);
            }),
            "no loop named `x`",
        ),
        (
            trace(|t| {
                t.split("m", &[0]);
            }),
            "at least 1",
        ),
        (
            trace(|t| {
                t.split("m", &[64, 128]);
            }),
            "far beyond",
        ),
        (
            trace(|t| {
                t.split("m", &[]);
            }),
            "at least one factor",
        ),
        (
            trace(|t| {
                t.fuse(&["m", "k"]);
            }),
            "adjacent",
        ),
        (
            trace(|t| {
                t.fuse(&["n", "k"]);
            }),
            "spatial and reduction",
        ),
        (
            trace(|t| {
                t.parallel("k");
            }),
            "reduction loop `k`",
        ),
        (
            trace(|t| {
                t.reorder(&["m", "m"]);
            }),
            "listed twice",
        ),
        (
            trace(|t| {
                t.bind("m", GpuAxis::BlockX).bind("n", GpuAxis::BlockX);
            }),
            "already bound",
        ),
        (
            trace(|t| {
                t.cache_write(scope("local"), Some("k"));
            }),
            "reduction loop `k` is not inside",
        ),
        (
            trace(|t| {
                t.cache_read(2, scope("local"), None);
            }),
            "no input 2",
        ),
        (
            trace(|t| {
                t.pack(
                    0,
                    LayoutTransform {
                        splits: vec![(0, 2)],
                        order: vec![0, 1],
                    },
                );
            }),
            "order lists 2 dimensions",
        ),
        (
            trace(|t| {
                t.pad(0).pack(
                    0,
                    LayoutTransform {
                        splits: vec![],
                        order: vec![1, 0],
                    },
                );
            }),
            "pad it or pack it, not both",
        ),
        (
            trace(|t| {
                t.pad(1).pad(1);
            }),
            "already padded",
        ),
        (
            trace(|t| {
                t.cache_read(0, scope("local"), None).pad(0);
            }),
            "pad input 0 before caching it",
        ),
        (
            trace(|t| {
                t.pad(5);
            }),
            "no input 5",
        ),
        (
            trace(|t| {
                t.tensorize("nope", &[], &[0, 1]);
            }),
            "unknown intrinsic",
        ),
        (
            trace(|t| {
                t.split("m", &[4])
                    .split("n", &[4])
                    .split("k", &[2])
                    .reorder(&["m.0", "n.0", "k.0", "m.1", "n.1", "k.1"])
                    .tensorize(
                        "mma.4x4x4.bf16.bf16",
                        &[("i", "m.1"), ("j", "n.1"), ("kk", "k.1")],
                        &[0, 1],
                    );
            }),
            "does not match `kk`",
        ),
        (
            trace(|t| {
                t.split("m", &[4])
                    .split("n", &[4])
                    .split("k", &[2])
                    .reorder(&["m.0", "n.0", "k.0", "m.1", "n.1", "k.1"])
                    // i bound to n: instruction input A depends on i, operator A does not depend on n.
                    .tensorize(
                        "mma.4x4x2.bf16.bf16",
                        &[("i", "n.1"), ("j", "m.1"), ("kk", "k.1")],
                        &[0, 1],
                    );
            }),
            "does not depend on loop `n.1`",
        ),
        (
            trace(|t| {
                t.split("m", &[4])
                    .split("n", &[4])
                    .split("k", &[2])
                    .tensorize(
                        "mma.4x4x2.bf16.bf16",
                        &[("i", "m.1"), ("j", "n.1"), ("kk", "k.1")],
                        &[0, 1],
                    );
            }),
            "innermost",
        ),
        (
            trace(|t| {
                t.split("m", &[4]).parallel("m.1").split("m.1", &[2]);
            }),
            "annotated",
        ),
        (
            trace(|t| {
                t.cache_read(0, scope("local"), Some("m")).split("m", &[2]);
            }),
            "a cache is attached",
        ),
    ];
    for (mut trace, expected) in cases {
        let err = step_error(&op, &mut trace);
        assert!(err.contains(expected), "expected `{expected}` in `{err}`");
        assert!(err.starts_with("trace step"), "{err}");
    }
}

#[test]
fn final_nest_errors_come_from_lowering() {
    let op = gemm("gemm:m=16,n=16,k=16,dtype=bf16");
    let mut t = Trace::new();
    t.vectorize("m");
    let err = t.lower(&op, &TestIntrinsics).unwrap_err().to_string();
    assert!(
        err.contains("vectorized loop `m` is not the innermost"),
        "{err}"
    );

    let mut t = Trace::new();
    t.cache_write(scope("local"), Some("m"))
        .reorder(&["k", "m"]);
    let err = t.lower(&op, &TestIntrinsics).unwrap_err().to_string();
    assert!(err.contains("reduction loop `k` is outside"), "{err}");
}

#[test]
fn shared_memory_staging_is_fenced_by_barriers() {
    let op = gemm("gemm:m=8,n=8,k=8,dtype=f16");
    let mut t = Trace::new();
    t.split("m", &[4])
        .split("n", &[4])
        .reorder(&["m.0", "n.0", "k", "m.1", "n.1"])
        .bind("m.0", GpuAxis::BlockY)
        .bind("n.0", GpuAxis::BlockX)
        .cache_read(0, scope("shared"), Some("k"))
        .bind("m.1", GpuAxis::ThreadY)
        .bind("n.1", GpuAxis::ThreadX)
        .pipeline("k", 2);
    let program = t.lower(&op, &TestIntrinsics).unwrap();
    let mut barriers = 0;
    program
        .body
        .walk(&mut |s| barriers += matches!(s, Stmt::Barrier) as usize);
    assert_eq!(barriers, 2);
    assert!(program.to_string().contains("pipeline 2 stages"));
    check_against_reference(&op, &t, 1).unwrap();
}

#[test]
fn the_generator_reaches_every_primitive() {
    // Guards the property tests against a generator that silently stops covering something.
    let ops = [
        gemm("gemm:m=6,n=5,k=7,dtype=bf16"),
        gemm("conv2d:n=1,h=5,w=5,c=3,k=4,r=3,s=3,pad=1,dtype=i8"),
        gemm("bmm:b=2,m=3,n=4,k=5,dtype=f32"),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..300u64 {
        let op = &ops[seed as usize % ops.len()];
        for s in random_valid_trace(op, seed).steps {
            let name = match s {
                Step::Split { .. } => "split",
                Step::Reorder { .. } => "reorder",
                Step::Fuse { .. } => "fuse",
                Step::Parallel { .. } => "parallel",
                Step::Vectorize { .. } => "vectorize",
                Step::Unroll { .. } => "unroll",
                Step::Bind { .. } => "bind",
                Step::CacheRead { .. } => "cache_read",
                Step::CacheWrite { .. } => "cache_write",
                Step::Pack { .. } => "pack",
                Step::Pad { .. } => "pad",
                Step::Cast { .. } => "cast",
                Step::Tensorize { .. } => "tensorize",
                Step::Pipeline { .. } => "pipeline",
                Step::Annotate { .. } => "annotate",
            };
            seen.insert(name);
        }
    }
    assert_eq!(seen.len(), 14, "{seen:?}");
}

#[test]
fn a_shared_cache_spans_the_warps_outside_its_anchor() {
    // Two warps along m (threadIdx.z) and two along n (threadIdx.y), each with its own
    // accumulator; A and B are staged once per block and k-step in shared memory. A's tile
    // covers both m-warps (not the n-warps, which A does not depend on).
    let op = gemm("gemm:m=32,n=32,k=16,dtype=f32");
    let mut t = Trace::new();
    t.split("m", &[2, 8])
        .split("n", &[2, 8])
        .split("k", &[4])
        .reorder(&["m.0", "n.0", "m.1", "n.1", "k.0", "m.2", "n.2", "k.1"])
        .bind("m.0", GpuAxis::BlockY)
        .bind("n.0", GpuAxis::BlockX)
        .bind("m.1", GpuAxis::ThreadZ)
        .bind("n.1", GpuAxis::ThreadY)
        .cache_write(scope("local"), Some("n.1"))
        .cache_read(0, scope("shared"), Some("k.0"))
        .cache_read(1, scope("shared"), Some("k.0"));
    let program = t.lower(&op, &TestIntrinsics).unwrap();
    let shape = |name: &str| {
        let b = program.buffers.iter().find(|b| b.name == name);
        b.map(|b| b.shape.clone())
    };
    assert_eq!(shape("A_shared0"), Some(vec![2, 8, 4]), "{program}");
    assert_eq!(shape("B_shared0"), Some(vec![2, 8, 4]), "{program}");
    assert_eq!(shape("acc"), Some(vec![8, 8]));
    // The copy walks the warp loop serially; the compute keeps its binding.
    assert!(program.to_string().contains("bind(threadIdx.z) for m.1"));
    check_against_reference(&op, &t, 1).unwrap();
}

#[test]
fn split_k_blocks_add_their_partial_sums_into_the_output() {
    // k split in 3 parts on blockIdx.z; each block reduces its part into a per-thread
    // accumulator and adds it into C.
    let op = gemm("gemm:m=8,n=8,k=30,dtype=f16");
    let split_k = |t: &mut Trace| {
        t.split("k", &[10])
            .reorder(&["k.0", "m", "n", "k.1"])
            .bind("k.0", GpuAxis::BlockZ)
            .bind("m", GpuAxis::ThreadY)
            .bind("n", GpuAxis::ThreadX);
    };
    let mut t = Trace::new();
    split_k(&mut t);
    t.cache_write(scope("local"), Some("n"));
    let program = t.lower(&op, &TestIntrinsics).unwrap();
    let mut accumulating = 0;
    program.body.walk(&mut |s| {
        accumulating += matches!(
            s,
            Stmt::Store {
                accumulate: true,
                ..
            }
        ) as usize
    });
    assert_eq!(accumulating, 1);
    assert!(program.to_string().contains("+= epilogue"));
    check_against_reference(&op, &t, 3).unwrap();

    // The accumulator outside the split loop would be one per block: refused.
    let mut outside = Trace::new();
    split_k(&mut outside);
    let e = outside.lower(&op, &TestIntrinsics).unwrap_err().to_string();
    assert!(e.contains("inside the accumulator's anchor"), "{e}");

    // Partial sums cannot go through an epilogue.
    let relu = gemm("gemm:m=8,n=8,k=30,dtype=f16,epilogue=relu");
    let e = t.lower(&relu, &TestIntrinsics).unwrap_err().to_string();
    assert!(e.contains("no epilogue"), "{e}");
}
