//! The generated C: its shape (snapshots), the paths it takes, and that the native build of
//! every instruction compiles with the real intrinsics even where the CPU cannot run them.

mod common;

use std::collections::BTreeSet;

use common::CPU_INSTRUCTIONS;
use tessel_cpu::reference::{gemm_spec, reference_gemm};
use tessel_cpu::{Compiler, Kernel, Mode, generate, module_source};
use tessel_intrin::{Catalog, match_op};
use tessel_ir::Workload;

fn kernel(spec: &str, id: &str, reference: bool) -> Kernel {
    let catalog = Catalog::default();
    let w: Workload = spec.parse().unwrap();
    let op = w.to_op();
    let trace = if reference {
        reference_gemm(&w, id, None).unwrap()
    } else {
        let intr = catalog.get(id).unwrap();
        match_op(&op, intr).unwrap()[0].to_trace(intr)
    };
    let program = trace.lower(&op, &catalog).unwrap();
    generate(&program, &format!("k_{}", id.replace('.', "_")), &catalog).unwrap()
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
