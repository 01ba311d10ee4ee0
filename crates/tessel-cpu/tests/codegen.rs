//! The generated C: its shape (snapshots), the paths it takes, and that the native build of
//! every instruction compiles with the real intrinsics even where the CPU cannot run them.

mod common;

use std::collections::BTreeSet;

use common::CPU_INSTRUCTIONS;
use tessel_cpu::reference::{gemm_spec, reference_gemm};
use tessel_cpu::{Compiler, Kernel, Mode, call_paths, generate, module_source};
use tessel_intrin::{Catalog, match_op};
use tessel_ir::Workload;
use tessel_measure::CallPath;

fn program(spec: &str, id: &str, reference: bool) -> tessel_ir::Program {
    let catalog = Catalog::default();
    let w: Workload = spec.parse().unwrap();
    let op = w.to_op();
    let trace = if reference {
        reference_gemm(&w, id, None).unwrap()
    } else {
        let intr = catalog.get(id).unwrap();
        match_op(&op, intr).unwrap()[0].to_trace(intr)
    };
    trace.lower(&op, &catalog).unwrap()
}

fn kernel(spec: &str, id: &str, reference: bool) -> Kernel {
    let program = program(spec, id, reference);
    generate(
        &program,
        &format!("k_{}", id.replace('.', "_")),
        &Catalog::default(),
    )
    .unwrap()
}

/// Compares with `tests/snapshots/NAME`; `UPDATE_SNAPSHOTS=1` rewrites it.
fn snapshot(name: &str, text: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(name);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_SNAPSHOTS=1)", path.display()));
    assert!(
        want == text,
        "generated code for {name} changed; review and rerun with UPDATE_SNAPSHOTS=1:\n{text}"
    );
}

#[test]
fn snapshots_of_generated_kernels() {
    // AMX: 2x2 tiles held across the reduction, B packed into VNNI pairs, a parallel loop.
    let amx = kernel(
        &gemm_spec("amx.tdpbf16ps", 64, 64, 64),
        "amx.tdpbf16ps",
        true,
    );
    assert!(amx.source.contains("register block: 4 accumulator(s)"));
    snapshot("amx_tdpbf16ps_gemm64.c", &amx.source);
    // VNNI on a padded shape: staged tiles with guards.
    let vnni = kernel(
        &gemm_spec("avx512.vpdpbusd", 5, 20, 6),
        "avx512.vpdpbusd",
        false,
    );
    assert!(
        vnni.source
            .contains("gathered into the instruction's layout")
    );
    snapshot("avx512_vpdpbusd_gemm_padded.c", &vnni.source);
    // AVX2 on a convolution with padding reads: bounds-checked loads.
    let conv = kernel(
        "conv2d:n=1,h=5,w=5,c=4,k=8,r=3,s=3,stride=1,pad=1,layout=nhwc,dtype=f32,epilogue=bias+relu",
        "avx2.vfmadd231ps",
        false,
    );
    assert!(conv.source.contains(">= 0"));
    snapshot("avx2_conv3x3.c", &conv.source);
}

#[test]
fn call_paths_name_the_form_every_call_takes_in_the_code() {
    let catalog = Catalog::default();
    for id in CPU_INSTRUCTIONS {
        // Reference schedules divide and read in place; the matcher's on an odd shape pads.
        for (m, n, k, reference) in [(64, 96, 128, true), (20, 37, 70, false)] {
            let p = program(&gemm_spec(id, m, n, k), id, reference);
            let source = generate(&p, "k", &catalog).unwrap().source;
            let paths = call_paths(&p, &catalog).unwrap();
            let mut steps = Vec::new();
            p.body.walk(&mut |s| {
                if let tessel_ir::Stmt::Tensorized(c) = s {
                    steps.push(c.step);
                }
            });
            steps.sort_unstable();
            steps.dedup();
            assert_eq!(paths.keys().copied().collect::<Vec<_>>(), steps, "{id}");
            let staged = paths.values().any(|p| p.is_staged());
            assert_eq!(
                staged,
                source.contains("gathered into the instruction's layout"),
                "{id} {m}x{n}x{k}: {paths:?}"
            );
            assert_eq!(
                paths.values().any(|p| *p == CallPath::RegisterBlock),
                source.contains("register block"),
                "{id} {m}x{n}x{k}: {paths:?}"
            );
            if reference {
                assert!(!staged, "{id}: the reference schedule is staged");
            }
        }
    }
    // The padded VNNI GEMM of the snapshots: A's 1x4, B's 4x16 and C's 1x16 (gathered and
    // scattered back) at every call.
    let p = program(
        &gemm_spec("avx512.vpdpbusd", 5, 20, 6),
        "avx512.vpdpbusd",
        false,
    );
    let paths = call_paths(&p, &catalog).unwrap();
    assert_eq!(
        paths.values().collect::<Vec<_>>(),
        [&CallPath::Staged {
            elements: 4 + 64 + 2 * 16
        }]
    );
}

#[test]
fn native_builds_of_every_instruction_compile_with_the_real_intrinsics() {
    let kernels: Vec<Kernel> = CPU_INSTRUCTIONS
        .iter()
        .flat_map(|id| {
            [
                kernel(&gemm_spec(id, 64, 96, 128), id, true),
                kernel(&gemm_spec(id, 20, 37, 70), id, false),
            ]
        })
        .enumerate()
        .map(|(i, mut k)| {
            k.source = k
                .source
                .replacen(&format!("void {}(", k.name), &format!("void k{i}("), 1);
            k
        })
        .collect();
    let refs: Vec<&Kernel> = kernels.iter().collect();
    let features: BTreeSet<String> = kernels.iter().flat_map(|k| k.features.clone()).collect();
    assert!(features.contains("amx_bf16") && features.contains("avx512_vnni"));
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("tessel-cpu-cache");
    let compiler = Compiler::new(cache).unwrap();
    compiler
        .compile(&module_source(&refs), &features, Mode::Native)
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn weights_packed_at_the_root_split_into_a_pack_function_and_a_prepacked_kernel() {
    use tessel_cpu::codegen::generate_prepacked;
    let catalog = Catalog::default();
    let w: Workload = "gemm:m=64,n=64,k=64,dtype=u8,wdtype=i8".parse().unwrap();
    let op = w.to_op();
    let trace = reference_gemm(&w, "avx2.vpmaddwd", None).unwrap();
    let program = trace.lower(&op, &catalog).unwrap();
    let whole = generate(&program, "k", &catalog).unwrap();
    let split = generate_prepacked(&program, "k_pre", "k_pack", 1, &catalog)
        .unwrap()
        .expect("the reference schedule packs B at its root");
    assert_eq!(split.packed_dtype, tessel_ir::DType::I16);
    assert_eq!(split.packed_elements(), 64 * 64);
    // The plain kernel owns its packed copy; the pre-packed one takes it as argument 1.
    assert!(whole.source.contains("static int16_t B_packed"));
    assert!(!split.kernel.source.contains("static int16_t B_packed"));
    assert!(
        split
            .kernel
            .source
            .contains("const int16_t *restrict B_packed = (const int16_t *)args[1]"),
        "{}",
        split.kernel.source
    );
    assert!(split.kernel.source.contains("arrives packed"));
    // The pack function zeroes its output, then runs exactly the kernel's root copy.
    assert!(split.pack.source.contains("memset(B_packed, 0"));
    assert!(split.pack.source.contains("tsl_sat_i16_i32((int32_t)(B["));
    assert!(!split.pack.source.contains("acc"));
    // Both compile together with the kernel they came from.
    let compiler = Compiler::new(Compiler::default_cache_dir()).unwrap();
    let src = module_source(&[&whole, &split.kernel, &split.pack]);
    compiler
        .compile(&src, &whole.features, Mode::Native)
        .unwrap();
    // The naive loop nest reads B in place: nothing to split.
    let naive = tessel_ir::Trace::new().lower(&op, &catalog).unwrap();
    assert!(
        generate_prepacked(&naive, "n_pre", "n_pack", 1, &catalog)
            .unwrap()
            .is_none()
    );
}

#[test]
fn a_vectorized_loop_that_would_gather_is_left_to_the_cost_model() {
    let catalog = Catalog::default();
    let lower = |spec: &str, order: &[&str]| {
        let op = spec.parse::<Workload>().unwrap().to_op();
        let mut trace = tessel_ir::Trace::new();
        trace.split("n", &[20]).reorder(order).vectorize("n.1");
        let program = trace.lower(&op, &catalog).unwrap();
        generate(&program, "k", &catalog).unwrap()
    };
    // dense reads W[n, k]: along n the lanes are 2048 floats apart. Forcing that loop to SIMD
    // makes gcc 12 emulate gathers and spend minutes compiling; each lane a cache line anyway.
    let strided = lower(
        "dense:m=1,n=1000,k=2048,dtype=f32",
        &["m", "n.0", "k", "n.1"],
    );
    // (The accumulator's fill and store loops stay SIMD: they are contiguous.)
    let before_update = |source: &str| -> String {
        let lines: Vec<&str> = source.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.contains("+ A[m * 2048 + k] *"))
            .expect("the update statement");
        lines[at - 2].trim().to_string()
    };
    assert_eq!(
        before_update(&strided.source),
        "/* not forced to SIMD: an access strides 2048 elements */",
        "{}",
        strided.source
    );
    // gemm reads B[k, n]: along n the lanes are contiguous, and the loop is SIMD.
    let contiguous = lower(
        "gemm:m=1,n=1000,k=2048,dtype=f32",
        &["m", "n.0", "k", "n.1"],
    );
    assert_eq!(
        before_update(&contiguous.source),
        "#pragma omp simd",
        "{}",
        contiguous.source
    );
    assert!(!contiguous.source.contains("not forced"));
    // The strided kernel compiles (it took gcc minutes with the pragma).
    let compiler = Compiler::new(Compiler::default_cache_dir()).unwrap();
    compiler
        .compile(&module_source(&[&strided]), &strided.features, Mode::Native)
        .unwrap();
}

#[test]
fn a_kernel_whose_innermost_loop_strides_a_large_power_of_two_asks_for_a_cheap_vectorizer() {
    let catalog = Catalog::default();
    // A random schedule of LLaMA prefill's up-projection: the innermost loop walks n, reading
    // W[n, k] 4096 floats apart. gcc 12 took 65 s on it with its default cost model.
    let op = "dense:m=512,n=11008,k=4096,dtype=f32"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let trace = tessel_ir::Trace::from_json(
        r#"{"steps": [{"split": {"target": "m", "factors": [8, 64]}},
            {"split": {"target": "n", "factors": [8, 4]}}, {"split": {"target": "k", "factors": [64]}},
            {"reorder": {"order": ["m.0", "n.0", "k.0", "m.1", "n.1", "k.1", "m.2", "n.2"]}},
            {"parallel": {"target": "m.0"}}, {"cache_write": {"scope": "local", "at": "n.0"}}]}"#,
    )
    .unwrap();
    let kernel = generate(&trace.lower(&op, &catalog).unwrap(), "slow", &catalog).unwrap();
    assert!(
        kernel
            .source
            .contains(r#"__attribute__((optimize("vect-cost-model=very-cheap"))) void slow("#),
        "{}",
        kernel.source
    );
    let start = std::time::Instant::now();
    Compiler::new(Compiler::default_cache_dir())
        .unwrap()
        .compile(&module_source(&[&kernel]), &kernel.features, Mode::Native)
        .unwrap();
    assert!(start.elapsed() < std::time::Duration::from_secs(30));
    // Contiguous innermost loops keep gcc's default.
    let gemm = "gemm:m=64,n=64,k=4096,dtype=f32"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let naive = generate(
        &tessel_ir::Trace::new().lower(&gemm, &catalog).unwrap(),
        "fine",
        &catalog,
    )
    .unwrap();
    assert!(!naive.source.contains("very-cheap"), "{}", naive.source);
}

#[test]
fn a_tiles_accumulator_outside_any_parallel_loop_lives_on_the_stack() {
    // Static storage would make gcc store every accumulator update to memory; on the stack the
    // tile may stay in registers.
    let catalog = Catalog::default();
    let w: Workload = "gemm:m=64,n=64,k=64,dtype=f32".parse().unwrap();
    let mut t = tessel_ir::Trace::new();
    t.split("m", &[4]).split("n", &[8]);
    t.reorder(&["m.0", "n.0", "k", "m.1", "n.1"]);
    t.cache_write(tessel_ir::Scope::new("local").unwrap(), Some("n.0"));
    t.vectorize("n.1");
    let program = t.lower(&w.to_op(), &catalog).unwrap();
    let src = generate(&program, "k", &catalog).unwrap().source;
    let acc = src
        .lines()
        .find(|l| l.contains("acc[32]"))
        .expect("a 4x8 tile");
    assert!(!acc.contains("static"), "{acc}");
}

#[test]
fn a_kernels_digest_names_its_code_not_its_name() {
    let catalog = Catalog::default();
    let op = "gemm:m=64,n=64,k=64,dtype=f32"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    let program = tessel_ir::Trace::new().lower(&op, &catalog).unwrap();
    let as_k1 = generate(&program, "tsl_k1", &catalog).unwrap();
    let as_k7 = generate(&program, "tsl_k7", &catalog).unwrap();
    assert_ne!(as_k1.source, as_k7.source);
    assert_eq!(as_k1.digest(), as_k7.digest());
    assert_eq!(as_k1.digest().len(), 16);
    // Another schedule of the same operator is other code.
    let reference = kernel("gemm:m=64,n=64,k=64,dtype=f32", "avx2.vfmadd231ps", true);
    assert_ne!(reference.digest(), as_k1.digest());
}

#[test]
fn packed_operands_of_large_layers_are_loaded_in_place_not_gathered() {
    // B packed into 32-column VNNI pairs, read by `vpmaddwd` 8 columns x 2 k at a time. Its
    // outer block loops (96 x 4 x 4 x 96 combinations) only shift the tile: the layout check
    // leaves them out and the tile is loaded where it lies. It used to give up past its
    // budget and gather every tile element by element (4.3 -> 286 ms on this layer).
    let trace: tessel_ir::Trace = serde_json::from_str(
        r#"{"steps": [{"cast": {"operand": 0, "dtype": "i16"}}, {"cast": {"operand": 1, "dtype": "i16"}},
        {"reorder": {"order": ["m", "n", "k"]}}, {"split": {"target": "m", "factors": [1, 1]}},
        {"split": {"target": "n", "factors": [4, 8]}}, {"split": {"target": "k", "factors": [96, 2]}},
        {"reorder": {"order": ["n.0", "k.0", "m.0", "k.1", "m.1", "n.1", "m.2", "n.2", "k.2"]}},
        {"pack": {"operand": 1, "layout": {"splits": [[0, 32], [1, 2]], "order": [0, 2, 1, 3]}}},
        {"parallel": {"target": "n.0"}}, {"cache_write": {"scope": "local", "at": "n.0"}},
        {"unroll": {"target": "m.1"}}, {"unroll": {"target": "n.1"}},
        {"tensorize": {"intrinsic": "avx2.vpmaddwd", "bindings": [["m", "m.2"], ["n", "n.2"], ["k", "k.2"]], "operands": [0, 1]}}]}"#,
    )
    .unwrap();
    let catalog = Catalog::default();
    let w: Workload = "dense:m=128,n=3072,k=768,dtype=u8,wdtype=i8,epilogue=bias"
        .parse()
        .unwrap();
    let program = trace.lower(&w.to_op(), &catalog).unwrap();
    let k = generate(&program, "k_dense_int8", &catalog).unwrap();
    assert!(
        !k.source.contains("gathered into the instruction's layout"),
        "{}",
        k.source
    );
    assert!(k.source.contains("tsl_madd_add"), "{}", k.source);
}
