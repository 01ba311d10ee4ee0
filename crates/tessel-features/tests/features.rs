//! Feature extraction: hand-computed values, invariances and sanity over random schedules.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use tessel_features::{
    Col, FeatureError, Features, MemoryLevel, Source, Target, WIDTH, extract, extract_batch,
};
use tessel_intrin::{Catalog, match_op};
use tessel_ir::{BufferRole, GpuAxis, Program, Scope, Stmt, Trace, Workload};
use tessel_measure::{CallPath, CallPaths, CodePaths};
use tessel_search::rng::Rng;
use tessel_search::{InstructionSet, Sketch, Space};

fn avx2() -> Target {
    let caches = BTreeMap::from([
        ("l1d".to_string(), 32 << 10),
        ("l2".to_string(), 1 << 20),
        ("l3".to_string(), 16 << 20),
    ]);
    Target::cpu("avx2", &["avx2".into(), "fma".into()], 1, &caches, None)
}

fn sapphire_rapids() -> Target {
    let flags: Vec<String> = [
        "avx2",
        "fma",
        "avx512f",
        "avx512_vnni",
        "avx512_bf16",
        "amx_tile",
        "amx_bf16",
        "amx_int8",
    ]
    .map(String::from)
    .to_vec();
    Target::cpu("spr", &flags, 4, &BTreeMap::new(), Some(2.0))
}

fn a100() -> Target {
    Target::gpu(
        "a100",
        (8, 0),
        108,
        1.41,
        164 << 10,
        40 << 20,
        1555.0,
        5000.0,
    )
}

fn program(spec: &str, trace: &Trace) -> Program {
    let op = spec.parse::<Workload>().unwrap().to_op();
    trace
        .apply(&op, &Catalog::default())
        .unwrap()
        .lower()
        .unwrap()
}

fn buffer(p: &Program, role: BufferRole) -> usize {
    p.buffers.iter().position(|b| b.role == role).unwrap()
}

fn col(f: &Features, buffer: usize, level: MemoryLevel, c: Col) -> f32 {
    f.data(buffer, level)
        .unwrap_or_else(|| panic!("no token for buffer {buffer} at {level:?}"))[c as usize]
}

fn lg(x: f64) -> f32 {
    (x + 1.0).log2() as f32
}

/// gemm 64^3 f32 tiled 8x8 with k between the tile loops:
/// `for m.0, n.0 (8x8): for k (64): for m.1, n.1 (8x8): acc += A * B`.
fn tiled_gemm() -> Program {
    let mut t = Trace::new();
    t.split("m", &[8])
        .split("n", &[8])
        .reorder(&["m.0", "n.0", "k", "m.1", "n.1"]);
    program("gemm:m=64,n=64,k=64,dtype=f32", &t)
}

#[test]
fn bytes_moved_and_footprints_of_a_known_tiling() {
    let p = tiled_gemm();
    let f = extract(&p, &avx2()).unwrap();
    let (a, b, acc) = (
        buffer(&p, BufferRole::Input(0)),
        buffer(&p, BufferRole::Input(1)),
        buffer(&p, BufferRole::Accumulator),
    );
    // L1 (32 KiB): the body of n.0 (A 8x64, B 64x64, acc 8x64 floats = 20 KiB) fits, the
    // whole nest (48 KiB) does not, so each m.0 iteration brings in its blocks of A and acc.
    // B does not depend on m.0 and one m.0 iteration fits: B stays, brought in once.
    assert_eq!(
        col(&f, a, MemoryLevel::L1, Col::DataBytesIn),
        lg(512.0 * 4.0 * 8.0)
    );
    assert_eq!(
        col(&f, b, MemoryLevel::L1, Col::DataBytesIn),
        lg(4096.0 * 4.0)
    );
    assert_eq!(
        col(&f, a, MemoryLevel::L1, Col::DataFootprint),
        lg(512.0 * 4.0)
    );
    assert_eq!(
        col(&f, b, MemoryLevel::L1, Col::DataFootprint),
        lg(4096.0 * 4.0)
    );
    assert_eq!(
        col(&f, a, MemoryLevel::L1, Col::DataCapacity),
        lg(20480.0 / 32768.0)
    );
    // acc: update (16 KiB in and out) + the zero fill (out) + the epilogue's read (in).
    assert_eq!(col(&f, acc, MemoryLevel::L1, Col::DataBytesIn), lg(32768.0));
    assert_eq!(
        col(&f, acc, MemoryLevel::L1, Col::DataBytesOut),
        lg(32768.0)
    );
    // L2 (1 MiB) holds everything: compulsory traffic only.
    assert_eq!(col(&f, b, MemoryLevel::L2, Col::DataBytesIn), lg(16384.0));
    // Registers (16 ymm = 512 B): the m.1 x n.1 block (A 8, B 8, acc 64 floats = 320 B)
    // fits, the k loop around it does not: A and B reloaded for each of 8*8*64 iterations.
    let outer = 8.0 * 8.0 * 64.0;
    assert_eq!(
        col(&f, a, MemoryLevel::Register, Col::DataBytesIn),
        lg(8.0 * 4.0 * outer)
    );
    // The accumulator block does not depend on k: it stays in registers across the
    // reduction and goes out once per m.0 x n.0 block (a register-blocked kernel).
    assert_eq!(
        col(&f, acc, MemoryLevel::Register, Col::DataBytesOut),
        lg(64.0 * 4.0 * 8.0 * 8.0)
    );
    assert_eq!(
        col(&f, a, MemoryLevel::Register, Col::DataFootprint),
        lg(32.0)
    );
    // B[k, n.0*8 + n.1] is read along n.1: unit stride; A[m.0*8 + m.1, k] along m.1: 64.
    assert_eq!(col(&f, b, MemoryLevel::L1, Col::DataContiguous), 1.0);
    assert_eq!(col(&f, a, MemoryLevel::L1, Col::DataStride), lg(64.0));
    // The output is only written.
    let c = buffer(&p, BufferRole::Output);
    assert_eq!(col(&f, c, MemoryLevel::Memory, Col::DataBytesIn), 0.0);
    assert_eq!(
        col(&f, c, MemoryLevel::Memory, Col::DataBytesOut),
        lg(16384.0)
    );
    assert!(f.data(c, MemoryLevel::Register).is_none());
}

/// Schema v4 holds an access across the next loop out only. Holding it across every loop
/// around the block that does not index it (the reuse distance: one block between two uses)
/// was measured as schema v5 and not adopted: on the held-out protocol it cost the ensemble
/// 0.03 and 0.01 top-1 on seeds 1 and 2 (README, the held-out section). This pins the choice.
#[test]
fn an_accumulator_is_held_across_the_next_reduction_loop_only() {
    // for m.0, n.0 (8x8): for k.0 (8): for k.1 (8): for m.1, n.1 (8x8): acc += A * B
    let mut t = Trace::new();
    t.split("m", &[8])
        .split("n", &[8])
        .split("k", &[8])
        .reorder(&["m.0", "n.0", "k.0", "k.1", "m.1", "n.1"]);
    let p = program("gemm:m=64,n=64,k=64,dtype=f32", &t);
    let f = extract(&p, &avx2()).unwrap();
    let (a, acc) = (
        buffer(&p, BufferRole::Input(0)),
        buffer(&p, BufferRole::Accumulator),
    );
    // The m.1 x n.1 block fits the 512 B of registers; k.1 around it does not (A and B 8x8,
    // acc 8x8 floats: 768 B). The accumulator is held across k.1 and goes out once per k.0
    // iteration of each m.0 x n.0 block.
    assert_eq!(
        col(&f, acc, MemoryLevel::Register, Col::DataBytesOut),
        lg(64.0 * 4.0 * 8.0 * 8.0 * 8.0)
    );
    // A is indexed by both k loops: reloaded for each of 8*8*8*8 iterations.
    assert_eq!(
        col(&f, a, MemoryLevel::Register, Col::DataBytesIn),
        lg(8.0 * 4.0 * 8.0 * 8.0 * 64.0)
    );
}

#[test]
fn compute_tokens_describe_the_loop_context() {
    let mut t = Trace::new();
    t.split("m", &[8])
        .split("n", &[8])
        .reorder(&["m.0", "n.0", "k", "m.1", "n.1"])
        .parallel("m.0")
        .unroll("m.1")
        .vectorize("n.1");
    let p = program("gemm:m=64,n=64,k=64,dtype=f32", &t);
    let f = extract(&p, &avx2()).unwrap();
    let update = (0..f.len())
        .find(|&i| f.get(i, Col::ComputeVector) == 1.0)
        .expect("a vectorized update");
    assert_eq!(f.get(update, Col::ComputeParallel), 3.0);
    assert_eq!(f.get(update, Col::ComputeSerial), 9.0); // n.0 (8) x k (64)
    assert_eq!(f.get(update, Col::ComputeUnrolled), 3.0);
    assert_eq!(f.get(update, Col::ComputeVectorized), 3.0);
    assert_eq!(f.get(update, Col::ComputeReduction), 6.0);
    assert_eq!(f.get(update, Col::ComputeDepth), 5.0);
    assert_eq!(
        f.get(update, Col::ComputeInvocations),
        lg(64.0 * 64.0 * 64.0)
    );
    assert_eq!(f.get(update, Col::ComputeFlopShare), 1.0);
    // Fill and store are not vector compute; the hardware token comes last.
    assert_eq!(f.sources.last(), Some(&Source::Hardware));
    assert_eq!(f.compute_tokens().count(), 2);
}

/// The update's compute token of a gemm 64^3 schedule: (vector flag, log2 of the iterations
/// counted as vectorized, as serial).
fn update_kind(trace: &Trace, target: &Target) -> (f32, f32, f32) {
    let p = program("gemm:m=64,n=64,k=64,dtype=f32", trace);
    let f = extract(&p, target).unwrap();
    let update = (0..f.len())
        .find(|&i| f.get(i, Col::ComputeVector) == 1.0 || f.get(i, Col::ComputeScalar) == 1.0)
        .expect("an update");
    (
        f.get(update, Col::ComputeVector),
        f.get(update, Col::ComputeVectorized),
        f.get(update, Col::ComputeSerial),
    )
}

#[test]
fn a_plain_innermost_loop_gcc_vectorizes_counts_as_vector_code() {
    // `for m.0, n.0, k, m.1: for n.1 (8): acc[m, n] += A[m, k] * B[k, n]`: no vectorize step,
    // but n.1 writes consecutive accumulator elements and reads B consecutively (A not at
    // all), which gcc -O3 turns into one 8-lane FMA on AVX2.
    let mut t = Trace::new();
    t.split("m", &[8])
        .split("n", &[8])
        .reorder(&["m.0", "n.0", "k", "m.1", "n.1"]);
    assert_eq!(update_kind(&t, &avx2()), (1.0, 3.0, 15.0));
    // The same with n.1 unrolled: gcc vectorizes it as well.
    t.unroll("n.1");
    assert_eq!(update_kind(&t, &avx2()), (1.0, 3.0, 15.0));
    // A loop of one iteration inside it changes nothing: the compiler drops it.
    let mut t = Trace::new();
    t.split("m", &[8])
        .split("n", &[8, 1])
        .reorder(&["m.0", "n.0", "k", "m.1", "n.1", "n.2"]);
    assert_eq!(update_kind(&t, &avx2()), (1.0, 3.0, 15.0));
    // On a GPU the same loop runs in one thread, lane by lane.
    let mut t = Trace::new();
    t.split("m", &[8])
        .split("n", &[8])
        .reorder(&["m.0", "n.0", "k", "m.1", "n.1"]);
    assert_eq!(update_kind(&t, &a100()).0, 0.0);
}

#[test]
fn an_innermost_reduction_strided_or_short_loop_stays_scalar() {
    // k innermost: a sum into one accumulator element, which gcc keeps in order (no fast-math).
    let mut t = Trace::new();
    t.reorder(&["m", "n", "k"]);
    assert_eq!(update_kind(&t, &avx2()), (0.0, 0.0, 18.0));
    // m innermost: the accumulator and A move by a row (64 elements) per iteration.
    let mut t = Trace::new();
    t.reorder(&["n", "k", "m"]);
    assert_eq!(update_kind(&t, &avx2()).0, 0.0);
    // Two floats (8 bytes) are less than a vector.
    let mut t = Trace::new();
    t.split("n", &[2]).reorder(&["m", "n.0", "k", "n.1"]);
    assert_eq!(update_kind(&t, &avx2()), (0.0, 0.0, 18.0));
    // A vectorize step still counts as vector code, whatever the strides.
    t.vectorize("n.1");
    assert_eq!(update_kind(&t, &avx2()), (1.0, 1.0, 17.0));
}

/// The matcher's mapping of a 4x20x3 GEMM onto the 8-wide FMA: n padded to 24.
fn padded_mapping() -> Program {
    let op = "gemm:m=4,n=20,k=3,dtype=f32"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let catalog = Catalog::default();
    let intr = catalog.get("avx2.vfmadd231ps").unwrap();
    let mapping = match_op(&op, intr).unwrap().into_iter().next().unwrap();
    program("gemm:m=4,n=20,k=3,dtype=f32", &mapping.to_trace(intr))
}

#[test]
fn utilisation_of_a_padded_mapping() {
    // n = 20 on an 8-wide instruction: three tiles, 20 of 24 columns useful.
    let p = padded_mapping();
    let f = extract(&p, &avx2()).unwrap();
    let call = (0..f.len())
        .find(|&i| f.get(i, Col::ComputeTensorized) == 1.0)
        .unwrap();
    assert_eq!(f.get(call, Col::ComputeUtilM), 1.0);
    assert_eq!(f.get(call, Col::ComputeUtilN), 20.0 / 24.0);
    assert_eq!(f.get(call, Col::ComputeUtilK), 1.0);
    assert_eq!(f.get(call, Col::ComputeInstrN), lg(8.0));
    assert_eq!(f.get(call, Col::ComputePeak), lg(16.0));
    // 4 x 3 x 3 calls of 8 MACs: 288 MACs for 240 useful.
    assert_eq!(f.get(call, Col::ComputeFlops), lg(2.0 * 288.0));
    assert_eq!(f.get(call, Col::ComputeFlopShare), 240.0 / 288.0);
    // The guarded operand needs padding.
    let b = buffer(&p, BufferRole::Input(1));
    assert_eq!(
        col(&f, b, MemoryLevel::Register, Col::DataTransformPad),
        1.0
    );
}

/// A backend that answers the same path for every call, or cannot build anything.
struct Answers(Option<CallPath>);

impl CodePaths for Answers {
    fn call_paths(&self, program: &Program) -> Result<CallPaths, String> {
        let path = self.0.ok_or("no such backend")?;
        let mut paths = CallPaths::new();
        program.body.walk(&mut |s| {
            if let Stmt::Tensorized(c) = s {
                paths.insert(c.step, path);
            }
        });
        Ok(paths)
    }
}

#[test]
fn a_call_says_how_the_backend_emits_it_where_the_target_knows() {
    // The padded mapping: 4 x 3 x 3 calls.
    let p = padded_mapping();
    let flags = |target: Target| {
        let f = extract(&p, &target).unwrap();
        let call = (0..f.len())
            .find(|&i| f.get(i, Col::ComputeTensorized) == 1.0)
            .unwrap();
        [
            Col::ComputePathRegisterBlock,
            Col::ComputePathDirect,
            Col::ComputePathStaged,
            Col::ComputeStagedCopies,
        ]
        .map(|c| f.get(call, c))
    };
    let with = |path| avx2().with_code_paths(Arc::new(Answers(path)));
    assert_eq!(flags(avx2()), [0.0; 4], "no backend: unknown");
    assert!(!avx2().knows_code_paths() && with(None).knows_code_paths());
    assert_eq!(
        flags(with(None)),
        [0.0; 4],
        "a backend that cannot build it"
    );
    assert_eq!(
        flags(with(Some(CallPath::RegisterBlock))),
        [1.0, 0.0, 0.0, 0.0]
    );
    assert_eq!(flags(with(Some(CallPath::Direct))), [0.0, 1.0, 0.0, 0.0]);
    // 17 elements copied at each of 36 calls.
    assert_eq!(
        flags(with(Some(CallPath::Staged { elements: 17 }))),
        [0.0, 0.0, 1.0, lg(17.0 * 36.0)]
    );
    // Statements that are not calls say nothing of paths.
    let f = extract(&p, &with(Some(CallPath::Direct))).unwrap();
    let untouched = (0..f.len())
        .filter(|&i| f.get(i, Col::ComputeTensorized) == 0.0)
        .all(|i| f.get(i, Col::ComputePathDirect) == 0.0);
    assert!(untouched);
}

#[test]
fn renaming_loops_and_buffers_changes_nothing() {
    let p = tiled_gemm();
    let mut q = p.clone();
    for (i, v) in q.vars.iter_mut().enumerate() {
        v.name = format!("loop{i}");
    }
    for (i, b) in q.buffers.iter_mut().enumerate() {
        b.name = format!("buf{i}");
    }
    assert_eq!(extract(&p, &avx2()).unwrap(), extract(&q, &avx2()).unwrap());
}

#[test]
fn a_larger_register_block_raises_the_tile_footprint() {
    let op = "gemm:m=256,n=256,k=256,dtype=bf16"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let space = Space::new(&op, &InstructionSet::Only(vec!["amx.tdpbf16ps".into()]));
    let mut rng = Rng::new(3);
    let sketch = loop {
        let s = space.sample(&mut rng);
        if matches!(s, Sketch::Tensorized { .. }) {
            break s;
        }
    };
    let with_block = |m: u64, n: u64| {
        let mut s = sketch.clone();
        if let Sketch::Tensorized { mr, nr, .. } = &mut s {
            (*mr, *nr) = (m, n);
        }
        let (_, p) = space.lower(&s).unwrap();
        let f = extract(&p, &sapphire_rapids()).unwrap();
        let acc = buffer(&p, BufferRole::Accumulator);
        col(&f, acc, MemoryLevel::Register, Col::DataFootprint)
    };
    let (one, two, four) = (with_block(1, 1), with_block(2, 1), with_block(2, 2));
    assert!(one < two && two < four, "{one} {two} {four}");
    assert_eq!(one, lg(16.0 * 16.0 * 4.0));
    assert_eq!(four, lg(4.0 * 16.0 * 16.0 * 4.0));
}

#[test]
fn output_is_deterministic_and_the_batch_form_agrees() {
    let op = "conv2d:n=1,h=14,w=14,c=64,k=64,r=3,s=3,pad=1,dtype=f32"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let space = Space::new(&op, &InstructionSet::Host);
    let mut rng = Rng::new(11);
    let programs: Vec<Program> = (0..24)
        .filter_map(|_| space.lower(&space.sample(&mut rng)).ok().map(|(_, p)| p))
        .collect();
    let refs: Vec<&Program> = programs.iter().collect();
    let target = avx2();
    let batch = extract_batch(&refs, &target);
    for (p, b) in refs.iter().zip(batch) {
        let one = extract(p, &target).unwrap();
        assert_eq!(one, extract(p, &target).unwrap());
        assert_eq!(one, b.unwrap());
    }
}

#[test]
fn targets_differ_only_in_the_hardware_token_and_capacities() {
    let p = tiled_gemm();
    let (x, y) = (extract(&p, &avx2()).unwrap(), extract(&p, &a100()).unwrap());
    let hw = |f: &Features| f.token(f.len() - 1).to_vec();
    assert_ne!(hw(&x), hw(&y));
    assert_eq!(hw(&y)[Col::HardwareGpu as usize], 1.0);
    assert_eq!(hw(&x)[Col::HardwarePeakF32 as usize], lg(16.0));
}

#[test]
fn shared_memory_bank_conflicts() {
    // Lanes along m.1 read A_shared0[m.1, k]: rows of 64 halves are 32 words apart, so all
    // 32 lanes hit one bank. Lanes along n.1 reading A_shared0[m.1] get a broadcast.
    let shared = Scope::new("shared").unwrap();
    let mut t = Trace::new();
    t.split("m", &[32])
        .split("n", &[32])
        .reorder(&["m.0", "n.0", "m.1", "k", "n.1"])
        .bind("m.0", GpuAxis::BlockX)
        .bind("m.1", GpuAxis::ThreadX)
        .cache_read(0, shared.clone(), Some("n.0"));
    let p = program("gemm:m=64,n=64,k=64,dtype=f16", &t);
    let f = extract(&p, &a100()).unwrap();
    let staged = p.buffers.iter().position(|b| b.scope == shared).unwrap();
    assert_eq!(
        col(&f, staged, MemoryLevel::Shared, Col::DataBankConflict),
        32.0
    );

    let mut t = Trace::new();
    t.split("m", &[32])
        .split("n", &[32])
        .reorder(&["m.0", "n.0", "k", "m.1", "n.1"])
        .bind("m.0", GpuAxis::BlockX)
        .bind("n.1", GpuAxis::ThreadX)
        .cache_read(0, shared.clone(), Some("k"));
    let p = program("gemm:m=64,n=64,k=64,dtype=f16", &t);
    let f = extract(&p, &a100()).unwrap();
    let staged = p.buffers.iter().position(|b| b.scope == shared).unwrap();
    assert_eq!(
        col(&f, staged, MemoryLevel::Shared, Col::DataBankConflict),
        1.0
    );
    // 64 k-steps x 2 x 2 blocks, each staging 32 halves.
    assert_eq!(
        col(&f, staged, MemoryLevel::Shared, Col::DataBytesIn),
        lg(4.0 * 64.0 * 32.0 * 2.0)
    );
}

#[test]
fn im2col_staging_is_recognised() {
    // The search's conv sketches that cache A unfold the input's windows.
    let op = "conv2d:n=1,h=14,w=14,c=64,k=64,r=3,s=3,pad=1,dtype=bf16"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let space = Space::new(&op, &InstructionSet::Only(vec!["amx.tdpbf16ps".into()]));
    let mut rng = Rng::new(5);
    let mut seen = false;
    for _ in 0..200 {
        let s = space.sample(&mut rng);
        let Sketch::Tensorized {
            cache_a: Some(_), ..
        } = s
        else {
            continue;
        };
        let (_, p) = space.lower(&s).unwrap();
        let f = extract(&p, &sapphire_rapids()).unwrap();
        let staged = p
            .buffers
            .iter()
            .position(|b| matches!(b.role, BufferRole::Cache { .. }))
            .unwrap();
        let token = f
            .sources
            .iter()
            .position(|s| matches!(s, Source::Buffer { buffer, .. } if *buffer == staged))
            .unwrap();
        assert_eq!(f.get(token, Col::DataTransformIm2col), 1.0, "{p}");
        assert!(f.get(token, Col::DataTransformBytes) > 0.0);
        seen = true;
        break;
    }
    assert!(seen, "no sketch staged A");
}

#[test]
fn malformed_programs_are_errors_not_panics() {
    let mut p = tiled_gemm();
    p.vars.truncate(1);
    assert!(matches!(
        extract(&p, &avx2()),
        Err(FeatureError::Malformed(_))
    ));
    let mut p = tiled_gemm();
    p.buffers.pop();
    let err = extract(&p, &avx2()).unwrap_err();
    assert!(err.to_string().contains("does not exist"), "{err}");
}

fn workloads() -> impl Strategy<Value = (&'static str, InstructionSet)> {
    let host = || InstructionSet::Host;
    prop_oneof![
        Just((
            "gemm:m=96,n=80,k=72,dtype=bf16",
            InstructionSet::Only(vec!["amx.tdpbf16ps".into()])
        )),
        Just((
            "gemm:m=100,n=50,k=60,dtype=u8,wdtype=i8",
            InstructionSet::Only(vec!["avx512.vpdpbusd".into()])
        )),
        Just(("gemm:m=33,n=65,k=17,dtype=f32", host())),
        Just(("bmm:b=3,m=40,n=24,k=36,dtype=f32", host())),
        Just((
            "conv2d:n=1,h=14,w=14,c=32,k=48,r=3,s=3,pad=1,stride=2,dtype=bf16",
            InstructionSet::Only(vec!["amx.tdpbf16ps".into()])
        )),
        Just((
            "conv2d:n=2,h=9,w=9,c=24,k=16,r=1,s=1,dtype=f32",
            InstructionSet::None
        )),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn every_valid_program_has_finite_features((spec, set) in workloads(), seed in any::<u64>()) {
        let op = spec.parse::<Workload>().unwrap().to_op();
        let space = Space::new(&op, &set);
        let mut rng = Rng::new(seed);
        for target in [avx2(), sapphire_rapids(), a100()] {
            let sketch = space.sample(&mut rng);
            let Ok((_, p)) = space.lower(&sketch) else { continue };
            let f = extract(&p, &target).unwrap();
            prop_assert_eq!(f.tokens.len(), f.len() * WIDTH);
            prop_assert!(f.tokens.iter().all(|x| x.is_finite()), "{}", p);
            prop_assert!(f.compute_tokens().count() >= 1);
            for t in f.data_tokens() {
                let util = t[Col::DataCapacity as usize];
                prop_assert!(util >= 0.0);
            }
        }
    }
}
