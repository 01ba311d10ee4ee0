//! The space reaches every mapping and computes the operator; the tuner is deterministic,
//! resumes from its log without re-measuring, and survives corrupt logs.

use std::collections::{BTreeSet, HashSet};
use std::hash::{Hash, Hasher};

use proptest::prelude::*;
use tessel_ir::Workload;
use tessel_measure::{
    Candidate, HardwareFingerprint, MeasureResult, Measurement, Measurer, Timing,
};
use tessel_search::rng::Rng;
use tessel_search::{
    CPU_INSTRUCTIONS, FINALISTS_BY_EACH, InstructionSet, RandomModel, RecordLog, SearchOptions,
    Sketch, Space, Task, Tuner, read_log,
};

/// Pretends to measure: a latency that is a fixed function of the trace.
struct FakeMeasurer {
    fp: HardwareFingerprint,
    measured: Vec<String>,
    budgets: Vec<Option<f64>>,
    /// Each measured candidate's pre-packed input.
    prepacked: Vec<Option<usize>>,
    /// Whether it says it prefetches, and the batches it was told of, in order.
    prefetches: bool,
    prefetched: Vec<Vec<String>>,
}

impl FakeMeasurer {
    fn new() -> Self {
        FakeMeasurer {
            fp: HardwareFingerprint {
                kind: "fake".into(),
                model: "test".into(),
                ..HardwareFingerprint::default()
            },
            measured: Vec::new(),
            budgets: Vec::new(),
            prepacked: Vec::new(),
            prefetches: false,
            prefetched: Vec::new(),
        }
    }
}

impl Measurer for FakeMeasurer {
    fn fingerprint(&self) -> &HardwareFingerprint {
        &self.fp
    }

    fn prefetch(&mut self, candidates: &[Candidate]) {
        self.prefetched
            .push(candidates.iter().map(|c| c.trace.to_json()).collect());
    }

    fn prefetches(&self) -> bool {
        self.prefetches
    }

    fn measure(&mut self, candidates: &[Candidate]) -> Vec<MeasureResult> {
        candidates
            .iter()
            .map(|c| {
                let json = c.trace.to_json();
                self.measured.push(json.clone());
                self.budgets.push(c.budget_s);
                self.prepacked.push(c.prepacked_weights);
                let mut h = std::collections::hash_map::DefaultHasher::new();
                json.hash(&mut h);
                let t = 1e-3 * (1.0 + (h.finish() % 1000) as f64 / 1000.0);
                Ok(Measurement {
                    timing: Timing {
                        min_s: t,
                        median_s: t,
                        spread: 0.0,
                        runs: 1,
                    },
                    compile_time_s: 0.0,
                    max_error: 0.0,
                    emulated: false,
                    gflops: c.op.flops() as f64 / t / 1e9,
                    cut_short: false,
                    censored: false,
                    allocation_spread: None,
                    kernel: None,
                })
            })
            .collect()
    }
}

fn all_cpu() -> InstructionSet {
    InstructionSet::Only(CPU_INSTRUCTIONS.iter().map(|s| s.to_string()).collect())
}

#[test]
fn sampling_reaches_every_mapping_and_the_fallback() {
    let op = "conv2d:n=1,h=14,w=14,c=32,k=64,r=3,s=3,pad=1,dtype=bf16"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let space = Space::new(&op, &all_cpu());
    assert!(space.mappings().len() >= 6, "{}", space.mappings().len());
    assert!(space.mappings().iter().any(|m| {
        m.mapping
            .transforms
            .iter()
            .any(|t| t.kind == tessel_intrin::TransformKind::Im2col)
    }));
    let mut rng = Rng::new(3);
    let mut seen = BTreeSet::new();
    let mut scalar = false;
    let mut lowered = 0;
    for _ in 0..600 {
        let s = space.sample(&mut rng);
        match &s {
            Sketch::Tensorized { mapping, .. } => {
                seen.insert(*mapping);
            }
            Sketch::Scalar { .. } => scalar = true,
            other => panic!("a GPU sketch in a CPU space: {other}"),
        }
        if space.lower(&s).is_ok() {
            lowered += 1;
        }
        let m = space.mutate(&s, &mut rng);
        assert!(
            space.check(&m).is_ok() || matches!(m, Sketch::Tensorized { .. }),
            "{m}: {:?}",
            space.check(&m)
        );
    }
    assert_eq!(seen.len(), space.mappings().len());
    assert!(scalar);
    assert!(lowered > 500, "only {lowered} of 600 samples lowered");
}

#[test]
fn capacity_checks_reject_register_blocks_that_do_not_fit() {
    let op = "gemm:m=256,n=256,k=256,dtype=bf16"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let space = Space::new(&op, &InstructionSet::Only(vec!["amx.tdpbf16ps".into()]));
    let too_big = Sketch::Tensorized {
        mapping: 0,
        mr: 4,
        nr: 2,
        kc: 4,
        order: 0,
        pack_b: true,
        cache_a: None,
        parallel: true,
        local_acc: true,
        unroll: true,
        mc: 1,
        nc: 1,
    };
    let e = space.check(&too_big).unwrap_err();
    assert!(e.contains("8 accumulators"), "{e}");
    // A sketch read back from a file with an empty cache block is refused, not replayed.
    let Sketch::Tensorized { mr, nr, .. } = &too_big else {
        unreachable!()
    };
    let json = serde_json::to_string(&too_big)
        .unwrap()
        .replace(&format!("\"mr\":{mr}"), "\"mr\":1")
        .replace(&format!("\"nr\":{nr}"), "\"nr\":1")
        .replace("\"order\"", "\"mc\":0,\"order\"");
    let empty: Sketch = serde_json::from_str(&json).unwrap();
    let e = space.check(&empty).unwrap_err();
    assert!(e.contains("block extent of 0"), "{e}");
    assert!(space.trace(&empty).is_err());
}

#[test]
fn seeds_are_the_classic_gemm_on_each_instruction_and_pass_the_checks() {
    let op = "gemm:m=96,n=64,k=128,dtype=u8,wdtype=i8"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let set = InstructionSet::Only(vec!["avx512.vpdpbusd".into(), "avx2.vpmaddwd".into()]);
    let space = Space::new(&op, &set);
    let seeds = space.seeds();
    assert_eq!(
        seeds.len(),
        4,
        "the classic and the BLIS shape per instruction (no loops: the lanes are full)"
    );
    let inputs = op.random_inputs(0);
    let want = op.reference(&inputs).unwrap();
    for s in &seeds {
        space.check(s).unwrap();
        let (trace, program) = space.lower(s).unwrap();
        assert_eq!(program.run(&inputs).unwrap().max_relative_error(&want), 0.0);
        let Sketch::Tensorized {
            mr, nr, kc, mc, nc, ..
        } = s
        else {
            panic!("{s:?}")
        };
        if mc * nc > 1 {
            continue;
        }
        let intr = space.intrinsic(s).unwrap();
        // The biggest register block the generated code holds without spilling (16
        // accumulators for AVX-512 vpdpbusd, 12 on 16 ymm registers), a 512-element (or
        // whole) k block.
        let want_block = if intr.registers >= 32 { (4, 4) } else { (6, 2) };
        assert_eq!((*mr, *nr), want_block, "{trace}");
        assert_eq!(kc * intr.k, 128);
    }
}

/// How many guards each tensorized call of a program carries.
fn call_guards(program: &tessel_ir::Program) -> Vec<usize> {
    let mut guards = Vec::new();
    program.body.walk(&mut |s| {
        if let tessel_ir::Stmt::Tensorized(c) = s {
            guards.push(c.guards.len());
        }
    });
    guards
}

#[test]
fn the_blis_seed_blocks_for_the_caches_and_pads_its_last_register_block_without_guards() {
    // m = 100 is not a multiple of the 6-row register block: A's block is packed with zeros
    // below row 100, so the register block runs unguarded and only the store is guarded.
    let op = "gemm:m=100,n=64,k=96,dtype=f32"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let space = Space::new(&op, &InstructionSet::Only(vec!["avx2.vfmadd231ps".into()]));
    let seeds = space.seeds();
    let blis = seeds
        .iter()
        .find(|s| matches!(s, Sketch::Tensorized { mc, nc, .. } if mc * nc > 1))
        .expect("a BLIS seed");
    let Sketch::Tensorized {
        mr, nr, cache_a, ..
    } = blis
    else {
        unreachable!()
    };
    assert_eq!((*mr, *nr), (6, 2));
    assert!(cache_a.is_some());
    let (trace, program) = space.lower(blis).unwrap();
    assert_eq!(call_guards(&program), vec![0], "{trace}");
    let inputs = op.random_inputs(1);
    let want = op.reference(&inputs).unwrap();
    let got = program.run(&inputs).unwrap();
    assert!(got.max_relative_error(&want) < 1e-5, "{trace}");
    // The classic seed reads A in place with the same 6x2 block: its last rows are padding,
    // so its call keeps a guard (the CPU generator points those rows at zeros).
    let classic = &seeds[0];
    assert!(
        matches!(
            classic,
            Sketch::Tensorized {
                mr: 6,
                nr: 2,
                cache_a: None,
                mc: 1,
                nc: 1,
                ..
            }
        ),
        "{classic:?}"
    );
    let (trace, program) = space.lower(classic).unwrap();
    assert_eq!(call_guards(&program), vec![1], "{trace}");
    let got = program.run(&inputs).unwrap();
    assert!(got.max_relative_error(&want) < 1e-5, "{trace}");

    // A 3x3 convolution: k = 3 * 3 * 32 is no power of two, so the k slice is a divisor of
    // it (B, read from its packed copy, must not pad); m = 14 * 14 pads in the im2col block.
    let op = "conv2d:n=1,h=14,w=14,c=32,k=64,r=3,s=3,stride=1,pad=1,layout=nhwc,dtype=f32"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let space = Space::new(&op, &InstructionSet::Only(vec!["avx2.vfmadd231ps".into()]));
    let blis = space
        .seeds()
        .into_iter()
        .find(|s| matches!(s, Sketch::Tensorized { mc, nc, .. } if mc * nc > 1))
        .expect("a BLIS seed");
    let (trace, program) = space.lower(&blis).unwrap();
    assert_eq!(call_guards(&program), vec![0], "{trace}");
    let inputs = op.random_inputs(2);
    let want = op.reference(&inputs).unwrap();
    assert!(
        program.run(&inputs).unwrap().max_relative_error(&want) < 1e-5,
        "{trace}"
    );
}

#[test]
fn the_direct_seed_of_a_convolution_keeps_the_window_outside_and_reads_the_input_in_place() {
    // The most promising mapping of a 3x3 convolution is im2col's (k <- r, s, c); the direct
    // seed takes the one that leaves r and s outside, 3 pixels by 4 vectors of channels (196
    // pixels: the last block has 2 padding rows), with no copy of the input.
    let op = "conv2d:n=1,h=14,w=14,c=32,k=64,r=3,s=3,stride=1,pad=1,layout=nhwc,dtype=f32"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let space = Space::new(&op, &InstructionSet::Only(vec!["avx2.vfmadd231ps".into()]));
    let direct = direct_seed(&space).expect("a direct seed");
    let Sketch::Tensorized { mr, nr, kc, .. } = direct else {
        unreachable!()
    };
    assert_eq!((mr, nr, kc), (3, 4, 32));
    let (trace, program) = space.lower(&direct).unwrap();
    assert!(!trace.to_string().contains("cache_read"), "{trace}");
    let inputs = op.random_inputs(3);
    let want = op.reference(&inputs).unwrap();
    assert!(
        program.run(&inputs).unwrap().max_relative_error(&want) < 1e-5,
        "{trace}"
    );
    // A 7x7 image of 512 channels: the direct mapping (k <- c) does the least work per call
    // of the 98 and ranks past the 8 the space keeps per instruction; it is kept anyway.
    let op = "conv2d:n=1,h=7,w=7,c=512,k=512,r=3,s=3,stride=1,pad=1,layout=nhwc,dtype=f32"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let space = Space::new(&op, &InstructionSet::Only(vec!["avx2.vfmadd231ps".into()]));
    assert_eq!(space.mappings().len(), 9);
    assert!(direct_seed(&space).is_some());
    // A gemm has no window: no direct seed.
    let op = "gemm:m=64,n=64,k=64,dtype=f32"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let space = Space::new(&op, &InstructionSet::Only(vec!["avx2.vfmadd231ps".into()]));
    assert_eq!(space.seeds().len(), 2);
}

/// An operator and its space on the AVX2 FMA alone.
fn fma_space(spec: &str) -> (tessel_ir::ComputeOp, Space) {
    let op = spec.parse::<Workload>().unwrap().to_op();
    let space = Space::new(&op, &InstructionSet::Only(vec!["avx2.vfmadd231ps".into()]));
    (op, space)
}

/// The splits, copies and unrolls of a sketch's trace, as `tune --emit trace` would show them.
fn loop_nest(space: &Space, s: &Sketch) -> String {
    let trace = space.trace(s).unwrap().to_string();
    trace
        .lines()
        .filter_map(|line| line.split_once(": ").map(|(_, step)| step))
        .filter(|step| {
            ["split", "cache_read", "pack", "unroll"]
                .iter()
                .any(|p| step.starts_with(p))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
fn a_depthwise_convolution_is_seeded_with_the_loop_nests_that_vectorize_its_channels() {
    // MobileNet-V2's 64x64 depthwise layer at 256x256: every instruction mapping broadcasts
    // one channel's input, the compiler's loops over 144 channels run 2-10x faster.
    let (op, space) = fma_space(
        "conv2d:n=1,h=64,w=64,c=144,k=144,r=3,s=3,stride=1,pad=1,groups=144,layout=nhwc,dtype=f32",
    );
    let seeds = space.seeds();
    assert!(
        matches!(seeds[0], Sketch::Tensorized { .. }),
        "the classic sketch first"
    );
    let loops: Vec<&Sketch> = seeds
        .iter()
        .filter(|s| matches!(s, Sketch::Scalar { .. }))
        .collect();
    assert_eq!(loops.len(), 2);
    // 8 channels by 4 pixels of a row, those pixels and the 3x3 window unrolled so the 32
    // accumulators stay in registers; then 48 of the 144 channels (the largest divisor within
    // 64 lanes) by 8 pixels, not unrolled.
    let nests: Vec<String> = loops.iter().map(|s| loop_nest(&space, s)).collect();
    assert!(
        nests[0].contains("split(q, [1, 4])") && nests[0].contains("split(g, [1, 8])"),
        "{}",
        nests[0]
    );
    assert!(
        ["unroll(q.2)", "unroll(r.1)", "unroll(s.1)"]
            .iter()
            .all(|u| nests[0].contains(u)),
        "{}",
        nests[0]
    );
    assert!(
        !nests[0].contains("unroll(g.2)") && !nests[0].contains("unroll(c.1)"),
        "{}",
        nests[0]
    );
    assert!(
        nests[1].contains("split(q, [1, 8])") && nests[1].contains("split(g, [1, 48])"),
        "{}",
        nests[1]
    );
    assert!(!nests[1].contains("unroll"), "{}", nests[1]);
    // Both store the weights W[g, k, r, s, c] as [r, s, c, g, k], contiguous along the vectors.
    for nest in &nests {
        assert!(!nest.contains("cache_read"), "{nest}");
        assert!(
            nest.contains("pack(input 1, splits [], order [2, 3, 4, 0, 1])"),
            "{nest}"
        );
    }
    // Both compute the convolution, and sit within the first half-batch of seeds.
    let inputs = op.random_inputs(3);
    let want = op.reference(&inputs).unwrap();
    for s in &loops {
        let (_, program) = space.lower(s).unwrap();
        assert!(program.run(&inputs).unwrap().max_relative_error(&want) < 1e-5);
    }
    let first_batch = &seeds[..seeds.len().min(SearchOptions::default().batch / 2)];
    assert!(loops.iter().all(|s| first_batch.contains(s)));

    // A grouped convolution of 4 channels a group.
    let (_, space) = fma_space(
        "conv2d:n=1,h=40,w=40,c=128,k=128,r=3,s=3,stride=1,pad=1,groups=32,layout=nhwc,dtype=f32",
    );
    let nests = space
        .seeds()
        .into_iter()
        .filter(|s| matches!(s, Sketch::Scalar { .. }))
        .map(|s| loop_nest(&space, &s))
        .collect::<Vec<_>>();
    assert_eq!(nests.len(), 2);
    // 4 channels of 2 groups by 4 pixels, the 4 input channels of a group unrolled too.
    let unrolled = &nests[0];
    assert!(
        unrolled.contains("split(k, [1, 4])")
            && unrolled.contains("split(g, [1, 2])")
            && unrolled.contains("split(q, [1, 4])"),
        "{unrolled}"
    );
    assert!(unrolled.contains("unroll(c.1)"), "{unrolled}");
}

/// The seed that reads a convolution's input in place with the input channels alone in k.
#[test]
fn the_amx_direct_seed_ends_its_tiles_with_the_image_row_and_pads_the_input_once() {
    // 56-pixel rows: 16-row tiles would cross rows (an im2col per call); the seed runs on
    // the 14-row mapping, the input padded once at the root and read in place.
    let op = "conv2d:n=1,h=56,w=56,c=64,k=64,r=3,s=3,stride=1,pad=1,layout=nhwc,dtype=bf16"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let space = Space::new(&op, &InstructionSet::Only(vec!["amx.tdpbf16ps".into()]));
    let partial: Vec<String> = space
        .mappings()
        .iter()
        .map(|m| m.label())
        .filter(|l| l.contains("(14-row tiles)"))
        .collect();
    assert_eq!(partial.len(), 1, "{partial:?}");
    // A is read from its padded copy, 58 x 58 x 64 bf16, not copied per block.
    assert!(partial[0].contains("A <- I: Pad (430592 B)"), "{partial:?}");
    let seed = space
        .seeds()
        .into_iter()
        .find(|s| space.mapping_label(s).is_some_and(|l| l.contains("14-row")))
        .expect("a seed on the 14-row mapping");
    let (trace, program) = space.lower(&seed).unwrap();
    let text = trace.to_string();
    assert!(
        text.contains("pad(input 0)") && !text.contains("cache_read"),
        "{text}"
    );
    assert!(
        text.contains("split(p_q, [") && text.contains(", 14])"),
        "{text}"
    );
    assert!(program.to_string().contains("I_padded"), "{program}");
    // A smaller image of the same shape computes the reference in the interpreter (rows of
    // 14 again); an unpadded one reads the input in place, without a copy.
    for (spec, padded) in [
        (
            "conv2d:n=1,h=14,w=14,c=32,k=32,r=3,s=3,stride=1,pad=1,layout=nhwc,dtype=bf16",
            true,
        ),
        (
            "conv2d:n=1,h=16,w=16,c=32,k=32,r=3,s=3,stride=1,pad=0,layout=nhwc,dtype=bf16",
            false,
        ),
    ] {
        let op = spec.parse::<Workload>().unwrap().to_op();
        let space = Space::new(&op, &InstructionSet::Only(vec!["amx.tdpbf16ps".into()]));
        let seed = space
            .seeds()
            .into_iter()
            .find(|s| space.mapping_label(s).is_some_and(|l| l.contains("14-row")))
            .unwrap_or_else(|| panic!("{spec}: no seed on 14-row tiles"));
        let (trace, program) = space.lower(&seed).unwrap();
        assert_eq!(
            trace.to_string().contains("pad(input 0)"),
            padded,
            "{spec}: {trace}"
        );
        let inputs = op.random_inputs(5);
        let want = op.reference(&inputs).unwrap();
        assert!(
            program.run(&inputs).unwrap().max_relative_error(&want) < 1e-3,
            "{spec}: {trace}"
        );
    }
    // Rows of 16 (a 32-wide image) need no partial tiles; vector instructions never get them.
    for (spec, id) in [
        (
            "conv2d:n=1,h=32,w=32,c=32,k=32,r=3,s=3,stride=1,pad=1,layout=nhwc,dtype=bf16",
            "amx.tdpbf16ps",
        ),
        (
            "conv2d:n=1,h=14,w=14,c=32,k=32,r=3,s=3,stride=1,pad=1,layout=nhwc,dtype=bf16",
            "avx512.vdpbf16ps",
        ),
    ] {
        let op = spec.parse::<Workload>().unwrap().to_op();
        let space = Space::new(&op, &InstructionSet::Only(vec![id.into()]));
        assert!(
            space
                .mappings()
                .iter()
                .all(|m| !m.label().contains("-row tiles")),
            "{spec}"
        );
    }
}

fn direct_seed(space: &Space) -> Option<Sketch> {
    space.seeds().into_iter().find(|s| {
        matches!(s, Sketch::Tensorized { cache_a: None, .. })
            && space
                .lower(s)
                .is_ok_and(|(t, _)| t.to_string().contains("split(c, "))
    })
}

/// A sampled schedule and two mutations of it, where they lower, compute what the reference
/// computes (tessel-ir's interpreter runs the instructions' semantics) within `tolerance`.
fn sampled_and_mutated_schedules_agree(
    spec: &str,
    set: &InstructionSet,
    seed: u64,
    tolerance: f64,
) -> Result<(), TestCaseError> {
    let op = spec.parse::<Workload>().unwrap().to_op();
    let space = Space::new(&op, set);
    let mut rng = Rng::new(seed);
    let inputs = op.random_inputs(0);
    let want = op.reference(&inputs).unwrap();
    let mut s = space.sample(&mut rng);
    for _ in 0..3 {
        if let Ok((trace, program)) = space.lower(&s) {
            let got = program.run(&inputs).unwrap();
            let err = got.max_relative_error(&want);
            prop_assert!(err < tolerance, "{spec}: error {err}\n{trace}");
        }
        // Alternately a mutation and a crossover with a fresh sample (or its mutation,
        // which shares the mapping more often).
        s = if rng.chance(50) {
            space.mutate(&s, &mut rng)
        } else {
            let other = space.sample(&mut rng);
            let other = space.mutate(&other, &mut rng);
            space.crossover(&s, &other, &mut rng)
        };
    }
    Ok(())
}

#[test]
fn crossover_takes_each_group_of_parameters_from_one_parent() {
    let op = "gemm:m=64,n=64,k=64,dtype=f32"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let space = Space::new(&op, &all_cpu());
    let mut rng = Rng::new(7);
    let seeds = space.seeds();
    let (a, b) = (&seeds[0], &seeds[1]);
    // The classic and the BLIS seed of one instruction share its mapping.
    let fields = |s: &Sketch| match s {
        Sketch::Tensorized {
            mapping,
            mr,
            nr,
            kc,
            mc,
            nc,
            ..
        } => (*mapping, (*mr, *nr), *kc, (*mc, *nc)),
        other => panic!("not a tensorized seed: {other:?}"),
    };
    let (fa, fb) = (fields(a), fields(b));
    assert_eq!(fa.0, fb.0);
    assert_ne!(fa, fb);
    let mut children = HashSet::new();
    for _ in 0..64 {
        let c = space.crossover(a, b, &mut rng);
        let fc = fields(&c);
        assert_eq!(fc.0, fa.0);
        assert!(fc.1 == fa.1 || fc.1 == fb.1, "{c:?}");
        assert!(fc.2 == fa.2 || fc.2 == fb.2, "{c:?}");
        assert!(fc.3 == fa.3 || fc.3 == fb.3, "{c:?}");
        children.insert(c);
    }
    assert!(children.len() > 2, "crossover mixes: {children:?}");
    // Of itself, a sketch breeds itself; across kinds, the first parent comes back.
    assert_eq!(space.crossover(a, a, &mut rng), *a);
    let scalar = loop {
        let s = space.sample(&mut rng);
        if matches!(s, Sketch::Scalar { .. }) {
            break s;
        }
    };
    assert_eq!(space.crossover(a, &scalar, &mut rng), *a);
    assert_eq!(space.crossover(&scalar, a, &mut rng), scalar);
}

fn arb_small() -> impl Strategy<Value = String> {
    prop_oneof![
        (1u64..40, 1u64..40, 1u64..70)
            .prop_map(|(m, n, k)| format!("gemm:m={m},n={n},k={k},dtype=bf16,epilogue=bias")),
        (1u64..20, 1u64..40, 1u64..70).prop_map(|(m, n, k)| format!(
            "gemm:m={m},n={n},k={k},dtype=u8,wdtype=i8,epilogue=relu"
        )),
        (1u64..30, 1u64..30, 1u64..30)
            .prop_map(|(m, n, k)| format!("dense:m={m},n={n},k={k},dtype=f32")),
        (3u64..7, 1u64..9, 1u64..20).prop_map(|(h, c, k)| format!(
            "conv2d:n=1,h={h},w={h},c={c},k={k},r=3,s=3,pad=1,dtype=bf16"
        )),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Every sampled or mutated schedule computes the operator (tessel-ir's interpreter runs
    /// the instructions' semantics).
    #[test]
    fn sampled_schedules_compute_the_operator(spec in arb_small(), seed in any::<u64>()) {
        sampled_and_mutated_schedules_agree(&spec, &all_cpu(), seed, 1e-5)?;
    }
}

/// The fake measurer and the tasks after a 40-trial run with seed 3.
fn tuned_with_seed_3() -> (FakeMeasurer, Vec<Task>) {
    let mut m = FakeMeasurer::new();
    let mut model = RandomModel::new(3);
    let mut ts = tasks();
    Tuner::new(&mut m, &mut model, None, "fake", opts(3))
        .tune(&mut ts, 40, &mut |_| {})
        .unwrap();
    (m, ts)
}

fn tasks() -> Vec<Task> {
    let set = InstructionSet::Only(vec!["avx2.vfmadd231ps".into(), "avx512.vfmadd231ps".into()]);
    vec![
        Task::new("gemm:m=64,n=64,k=64,dtype=f32".parse().unwrap(), 2, &set),
        Task::new("dense:m=16,n=96,k=32,dtype=f32".parse().unwrap(), 1, &set),
    ]
}

fn opts(seed: u64) -> SearchOptions {
    SearchOptions {
        population: 32,
        generations: 1,
        batch: 8,
        epsilon: 0.25,
        crossover: 0.3,
        pipeline: false,
        prepacked_weights: false,
        seed,
    }
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let run = |seed| {
        let mut m = FakeMeasurer::new();
        let mut model = RandomModel::new(seed);
        let mut ts = tasks();
        Tuner::new(&mut m, &mut model, None, "fake", opts(seed))
            .tune(&mut ts, 40, &mut |_| {})
            .unwrap();
        m.measured
    };
    let a = run(5);
    assert_eq!(a.len(), 40);
    assert_eq!(a, run(5));
    assert_ne!(a, run(6));
    assert_eq!(
        a.iter().collect::<HashSet<_>>().len(),
        a.len(),
        "a candidate was measured twice"
    );
}

#[test]
fn the_finalists_are_the_fastest_by_median_and_by_fastest_run_and_every_seed() {
    let (m, ts) = tuned_with_seed_3();
    for t in &ts {
        let finalists = t.finalists();
        let best = t.best.as_ref().unwrap();
        // The search's best first, the rest by the search's timing.
        assert_eq!(finalists[0].trace, best.trace);
        assert!(
            finalists
                .windows(2)
                .all(|w| w[0].latency_s <= w[1].latency_s)
        );
        // Every seed that was measured is a finalist, however slow it measured.
        let seeds: Vec<_> = t
            .space()
            .seeds()
            .iter()
            .filter_map(|s| t.space().lower(s).ok().map(|(trace, _)| trace))
            .filter(|trace| m.measured.contains(&trace.to_json()))
            .collect();
        assert!(!seeds.is_empty(), "{}: no seed was measured", t.workload);
        for s in &seeds {
            assert!(
                finalists.iter().any(|f| &f.trace == s),
                "{}: a seed is missing",
                t.workload
            );
        }
        // And no more than the seeds and the fastest few by each statistic.
        assert!(
            finalists.len() <= seeds.len() + 2 * FINALISTS_BY_EACH,
            "{}",
            finalists.len()
        );
        assert!(finalists.len() > seeds.len().min(FINALISTS_BY_EACH));
    }
}

#[test]
fn a_pipelined_run_prefetches_each_batch_before_measuring_it_and_nothing_twice() {
    let run = |pipeline: bool, prefetches: bool| {
        let mut m = FakeMeasurer::new();
        m.prefetches = prefetches;
        let mut model = RandomModel::new(7);
        let mut ts = tasks();
        let o = SearchOptions {
            pipeline,
            ..opts(7)
        };
        Tuner::new(&mut m, &mut model, None, "fake", o)
            .tune(&mut ts, 45, &mut |_| {})
            .unwrap();
        assert_eq!(ts.iter().map(|t| t.trials).sum::<usize>(), 45);
        m
    };
    let m = run(true, true);
    assert_eq!(m.measured.len(), 45);
    assert_eq!(
        m.measured.iter().collect::<HashSet<_>>().len(),
        45,
        "a candidate was measured twice"
    );
    // Every batch but the first was announced, in the order it was then measured, and
    // nothing was announced past the trial budget (8 + 8 + 8 + 8 + 8 + 5).
    let sizes: Vec<usize> = m.prefetched.iter().map(Vec::len).collect();
    assert_eq!(sizes, [8, 8, 8, 8, 5]);
    let announced: Vec<String> = m.prefetched.concat();
    assert_eq!(announced, m.measured[8..]);
    // A measurer that cannot prefetch gets the unpipelined search, the same as without.
    let plain = run(false, true);
    assert!(plain.prefetched.is_empty());
    assert_eq!(run(true, false).measured, plain.measured);
    assert_ne!(m.measured, plain.measured);
}

#[test]
fn candidates_after_a_tasks_first_best_carry_a_cut_short_budget() {
    let (m, _) = tuned_with_seed_3();
    // The first batch of the run had no best to compare with.
    assert!(
        m.budgets[..8].iter().all(Option::is_none),
        "{:?}",
        m.budgets
    );
    let later: Vec<f64> = m.budgets.iter().flatten().copied().collect();
    assert!(!later.is_empty(), "{:?}", m.budgets);
    // Fake latencies are 1-2 ms: five times the best is above the floor.
    for b in later {
        assert!((0.005..=0.01).contains(&b), "{b}");
    }
    assert_eq!(
        tessel_search::cut_short_budget(1e-6),
        tessel_search::CUT_SHORT_FLOOR_S
    );
}

#[test]
fn a_narrower_instruction_set_does_not_resume_records_of_other_instructions() {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("narrow.jsonl");
    let _ = std::fs::remove_file(&path);
    let mut m = FakeMeasurer::new();
    {
        let mut model = RandomModel::new(4);
        let mut ts = tasks();
        let log = RecordLog::open(&path).unwrap();
        Tuner::new(&mut m, &mut model, Some(log), "fake", opts(4))
            .tune(&mut ts, 32, &mut |_| {})
            .unwrap();
    }
    let records = read_log(&path).unwrap().records;
    let on = |id: &str| {
        records
            .iter()
            .filter(|r| r.mapping.as_deref().is_some_and(|l| l.starts_with(id)))
            .count()
    };
    let (avx2, avx512) = (on("avx2."), on("avx512."));
    assert!(avx512 > 0, "the wide run used the AVX-512 FMA too");
    let only_avx2 = InstructionSet::Only(vec!["avx2.vfmadd231ps".into()]);
    let mut ts = vec![
        Task::new(
            "gemm:m=64,n=64,k=64,dtype=f32".parse().unwrap(),
            2,
            &only_avx2,
        ),
        Task::new(
            "dense:m=16,n=96,k=32,dtype=f32".parse().unwrap(),
            1,
            &only_avx2,
        ),
    ];
    let mut again = FakeMeasurer::new();
    let mut model = RandomModel::new(5);
    let mut tuner = Tuner::new(&mut again, &mut model, None, "fake", opts(5));
    tuner.resume(&mut ts, &records);
    assert_eq!(tuner.stats.resume_rejected, avx512);
    assert_eq!(tuner.stats.resumed, records.len() - avx512);
    assert!(tuner.stats.resumed >= avx2);
}

#[test]
fn a_rerun_resumes_from_the_log_and_measures_nothing_twice() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("resume");
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("log.jsonl");
    let mut first = FakeMeasurer::new();
    {
        let mut model = RandomModel::new(1);
        let mut ts = tasks();
        let log = RecordLog::open(&path).unwrap();
        Tuner::new(&mut first, &mut model, Some(log), "fake", opts(1))
            .tune(&mut ts, 24, &mut |_| {})
            .unwrap();
    }
    // A kill in the middle of a write leaves a cut-short last line.
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("{\"workload\":\"gemm:m=64");
    std::fs::write(&path, &text).unwrap();

    let contents = read_log(&path).unwrap();
    assert_eq!(contents.records.len(), 24);
    assert_eq!(contents.corrupt.len(), 1);
    assert_eq!(contents.corrupt[0].line, 25);

    let mut second = FakeMeasurer::new();
    let mut model = RandomModel::new(2);
    let mut ts = tasks();
    let log = RecordLog::open(&path).unwrap();
    let mut tuner = Tuner::new(&mut second, &mut model, Some(log), "fake", opts(2));
    tuner.resume(&mut ts, &contents.records);
    assert_eq!(tuner.stats.resumed, 24);
    tuner.tune(&mut ts, 40, &mut |_| {}).unwrap();
    assert_eq!(second.measured.len(), 16);
    for t in &second.measured {
        assert!(
            !first.measured.contains(t),
            "re-measured a logged candidate"
        );
    }
    let after = read_log(&path).unwrap();
    assert_eq!(after.records.len(), 40);
    // The same log gzip-compressed (as committed datasets are) reads the same; it is
    // read-only.
    let gz = dir.join("log.jsonl.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut enc, std::fs::read(&path).unwrap().as_slice()).unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();
    let unzipped = read_log(&gz).unwrap();
    assert_eq!(unzipped.records, after.records);
    assert_eq!(unzipped.corrupt, after.corrupt);
    assert!(RecordLog::open(&gz).is_err());
    assert_eq!(
        after.corrupt.len(),
        1,
        "the cut-short line stays reported, nothing else breaks"
    );
    let best = ts
        .iter()
        .map(|t| t.best.as_ref().unwrap().latency_s)
        .fold(f64::INFINITY, f64::min);
    let logged_best = after
        .records
        .iter()
        .filter_map(|r| r.latency())
        .fold(f64::INFINITY, f64::min);
    assert_eq!(best, logged_best);
}

#[test]
fn pre_packed_weights_reach_the_measurer_and_the_log_and_only_resume_their_kind() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("prepacked");
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("log.jsonl");
    let packed = SearchOptions {
        prepacked_weights: true,
        ..opts(4)
    };
    let mut m = FakeMeasurer::new();
    {
        let mut model = RandomModel::new(4);
        let mut ts = tasks();
        let log = RecordLog::open(&path).unwrap();
        Tuner::new(&mut m, &mut model, Some(log), "fake", packed.clone())
            .tune(&mut ts, 16, &mut |_| {})
            .unwrap();
    }
    // The gemm's and the dense layer's weights are their second operand.
    assert_eq!(m.prepacked, vec![Some(1); 16]);
    let records = read_log(&path).unwrap().records;
    assert!(records.iter().all(|r| r.prepacked_weights));
    // A run that packs every call resumes none of them; one of the same kind, all.
    for (o, resumed) in [(opts(5), 0), (packed, 16)] {
        let mut m = FakeMeasurer::new();
        let mut model = RandomModel::new(5);
        let mut ts = tasks();
        let prepacked = o.prepacked_weights;
        let mut tuner = Tuner::new(&mut m, &mut model, None, "fake", o);
        tuner.resume(&mut ts, &records);
        assert_eq!(tuner.stats.resumed, resumed);
        assert_eq!(tuner.stats.resume_rejected, 16 - resumed);
        tuner.tune(&mut ts, 24, &mut |_| {}).unwrap();
        let want = if prepacked { Some(1) } else { None };
        assert!(m.prepacked.iter().all(|p| *p == want), "{:?}", m.prepacked);
    }
}

#[test]
fn a_log_of_garbage_is_reported_line_by_line() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("garbage");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("log.jsonl");
    std::fs::write(&path, "not json\n\n{\"workload\": 3}\n\u{0}\u{1}\n").unwrap();
    let c = read_log(&path).unwrap();
    assert!(c.records.is_empty());
    let lines: Vec<usize> = c.corrupt.iter().map(|l| l.line).collect();
    assert_eq!(lines, vec![1, 3, 4]);
    assert!(
        read_log(&dir.join("missing.jsonl"))
            .unwrap()
            .records
            .is_empty()
    );
}

fn arb_small_gpu() -> impl Strategy<Value = String> {
    prop_oneof![
        (1u64..40, 1u64..40, 1u64..40)
            .prop_map(|(m, n, k)| format!("gemm:m={m},n={n},k={k},dtype=f16,epilogue=bias")),
        (1u64..3, 1u64..20, 1u64..20, 1u64..40)
            .prop_map(|(b, m, n, k)| format!("bmm:b={b},m={m},n={n},k={k},dtype=f16")),
        (1u64..30, 1u64..30, 1u64..30)
            .prop_map(|(m, n, k)| format!("dense:m={m},n={n},k={k},dtype=f32")),
        (3u64..6, 1u64..9, 1u64..20).prop_map(|(h, c, k)| format!(
            "conv2d:n=1,h={h},w={h},c={c},k={k},r=3,s=3,pad=1,dtype=f16"
        )),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]

    /// GPU sketches (Tensor Core and SIMT, block-level shared staging) compute the operator
    /// in tessel-ir's sequential semantics.
    #[test]
    fn sampled_gpu_schedules_compute_the_operator(spec in arb_small_gpu(), seed in any::<u64>()) {
        sampled_and_mutated_schedules_agree(&spec, &InstructionSet::Gpu { cc: (8, 0) }, seed, 1e-3)?;
    }
}

#[test]
fn gpu_spaces_use_tensor_cores_where_the_device_has_them() {
    let op = "gemm:m=256,n=256,k=256,dtype=bf16"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    // bf16 WMMA needs sm_80: a V100 (sm_70) space has only the SIMT fallback.
    let volta = Space::new(&op, &InstructionSet::Gpu { cc: (7, 0) });
    assert!(volta.mappings().is_empty());
    let ampere = Space::new(&op, &InstructionSet::Gpu { cc: (8, 0) });
    // Both generated families: WMMA and 16-bit mma.sync (never the description-only wgmma).
    let ids: Vec<&str> = ampere.mappings().iter().map(|m| m.intrinsic.id).collect();
    assert!(
        ids.iter()
            .all(|id| id.starts_with("wmma.") || id.starts_with("mma.m16n8k16.bf16")),
        "{ids:?}"
    );
    assert!(
        ids.iter().any(|id| id.starts_with("wmma.")) && ids.iter().any(|id| id.starts_with("mma."))
    );
    let mut rng = Rng::new(3);
    let (mut tc, mut simt, mut lowered) = (0, 0, 0);
    for _ in 0..200 {
        let s = ampere.sample(&mut rng);
        match s {
            Sketch::TensorCore { .. } => tc += 1,
            Sketch::Simt { .. } => simt += 1,
            _ => panic!("a CPU sketch in a GPU space: {s}"),
        }
        if let Ok((_, p)) = ampere.lower(&s) {
            lowered += 1;
            let shared = p.buffers.iter().filter(|b| b.scope.as_str() == "shared");
            let bytes: u64 = shared.map(|b| b.bytes()).sum();
            assert!(bytes <= tessel_search::GPU_MAX_SHARED_BYTES * 4, "{bytes}");
        }
    }
    assert!(tc > 100 && simt > 20, "{tc} {simt}");
    assert!(lowered > 150, "{lowered}");
    // A block of 64 warps is refused before any code exists.
    let huge = Sketch::TensorCore {
        mapping: 0,
        wm: 8,
        wn: 8,
        fm: 1,
        fn_: 1,
        kc: 1,
        stages: 1,
        split: 1,
    };
    let e = ampere.check(&huge).unwrap_err();
    assert!(e.contains("2048 threads"), "{e}");
}

#[test]
fn loop_nests_store_the_weights_with_the_outputs_columns_last() {
    let scalar = |space: &Space| {
        let spatial = space.op().spatial_vars().count();
        let reductions = space.op().reduction_vars().count();
        Sketch::Scalar {
            tiles: vec![(1, 4); spatial],
            rtiles: vec![8; reductions],
            parallel: false,
            local_acc: true,
            vectorize: true,
            unroll: None,
            cache_input: false,
            pack_weights: true,
            unroll_inner: false,
        }
    };
    // A dense layer's B[n, k] is read along n by the vectors: stored as [k, n].
    let op = "dense:m=8,n=24,k=40,dtype=f32"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let space = Space::new(&op, &InstructionSet::None);
    let s = scalar(&space);
    assert!(loop_nest(&space, &s).contains("pack(input 1, splits [], order [1, 0])"));
    let inputs = op.random_inputs(5);
    let want = op.reference(&inputs).unwrap();
    let (_, program) = space.lower(&s).unwrap();
    assert!(program.run(&inputs).unwrap().max_relative_error(&want) < 1e-5);
    // Unrolling 4 rows by a 40-long reduction around 8 columns lays out 1,280 element
    // operations: fine. 64 rows by the whole 1024-long reduction, 524,288: rejected before
    // the compiler spends minutes on it.
    let unrolled = |m_tile: u64, k_tile: u64| Sketch::Scalar {
        tiles: vec![(1, m_tile), (1, 8)],
        rtiles: vec![k_tile],
        parallel: false,
        local_acc: true,
        vectorize: true,
        unroll: None,
        cache_input: false,
        pack_weights: false,
        unroll_inner: true,
    };
    assert!(space.check(&unrolled(4, 40)).is_ok());
    let op = "dense:m=64,n=24,k=1024,dtype=f32"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let big = Space::new(&op, &InstructionSet::None);
    let err = big.check(&unrolled(64, 1024)).unwrap_err();
    assert!(err.contains("524288 element operations"), "{err}");
    // A GEMM's B[k, n] already is: nothing to copy.
    let op = "gemm:m=8,n=24,k=40,dtype=f32"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let space = Space::new(&op, &InstructionSet::None);
    assert!(!loop_nest(&space, &scalar(&space)).contains("pack"));
}
