//! The generated CUDA: its shape (snapshots), its refusals, and that nvcc compiles it for
//! sm_80 and sm_90 (skipped, with the reason printed, where nvcc is not installed).

use std::path::PathBuf;

use tessel_gpu::nvcc::Nvcc;
use tessel_gpu::{Kernel, generate};
use tessel_ir::{Program, Workload};
use tessel_search::rng::Rng;
use tessel_search::{InstructionSet, Sketch, Space};

fn lower(spec: &str, sketch: &Sketch) -> Program {
    let op = spec.parse::<Workload>().unwrap().to_op();
    let space = Space::new(&op, &InstructionSet::Gpu { cc: (8, 0) });
    space.lower(sketch).unwrap().1
}

fn tc(wm: u64, wn: u64, fm: u64, fn_: u64, kc: u64, stages: u32) -> Sketch {
    Sketch::TensorCore {
        mapping: 0,
        wm,
        wn,
        fm,
        fn_,
        kc,
        stages,
        split: 1,
    }
}

/// Compares with `tests/snapshots/NAME`; `UPDATE_SNAPSHOTS=1` rewrites it.
fn snapshot(name: &str, text: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
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

fn wmma_gemm() -> Kernel {
    let p = lower(
        "gemm:m=128,n=128,k=64,dtype=f16,epilogue=bias+relu",
        &tc(2, 2, 2, 2, 2, 2),
    );
    generate(&p, "gemm_wmma").unwrap()
}

#[test]
fn snapshots_of_generated_kernels() {
    let k = wmma_gemm();
    assert_eq!((k.grid, k.block), ([2, 2, 1], [32, 2, 2]));
    assert_eq!(k.tensor_core.as_deref(), Some("wmma.m16n16k16.f16"));
    // Two stages of two 64x32 half tiles, rows padded from 16 to 24, plus 4 warps' staging.
    assert_eq!(k.shared_bytes, 2 * 2 * (64 * 2 * 24 * 2) + 4 * 256 * 4);
    for needle in [
        "cp.async",
        "wmma::mma_sync",
        "tsl_cp_wait<1>",
        "// relu",
        "16-byte vectors",
    ] {
        assert!(k.source.contains(needle), "{needle}");
    }
    snapshot("wmma_gemm_bias_relu.cu", &k.source);

    let simt = lower(
        "conv2d:n=1,h=14,w=14,c=32,k=64,r=3,s=3,pad=1,dtype=f16",
        &Sketch::Simt {
            tx: 14,
            ty: 8,
            rx: 1,
            ry: 2,
            rtile: 4,
            shared: true,
        },
    );
    let k = generate(&simt, "conv_simt").unwrap();
    assert!(k.tensor_core.is_none());
    // Zero padding of the convolution: the staging copy checks the image's edges.
    assert!(k.source.contains(">= 0"), "{}", k.source);
    snapshot("simt_conv3x3.cu", &k.source);
}

#[test]
fn programs_it_cannot_run_are_refused_with_the_reason() {
    let op = "gemm:m=64,n=64,k=64,dtype=f32"
        .parse::<Workload>()
        .unwrap()
        .to_op();
    // A CPU schedule: parallel loops, no bindings, accumulator in global memory.
    let cpu = Space::new(&op, &InstructionSet::None);
    let mut rng = Rng::new(1);
    let p = cpu.lower(&cpu.sample(&mut rng)).unwrap().1;
    let e = generate(&p, "k").unwrap_err().to_string();
    assert!(e.contains("cannot generate CUDA"), "{e}");
}

fn kernels_to_compile() -> Vec<(String, Kernel)> {
    let mut out = vec![("wmma_gemm".to_string(), wmma_gemm())];
    let specs = [
        "gemm:m=256,n=128,k=96,dtype=f16",
        "gemm:m=100,n=60,k=40,dtype=bf16,epilogue=bias",
        "bmm:b=4,m=64,n=64,k=64,dtype=f16",
        "dense:m=32,n=96,k=64,dtype=f32,epilogue=relu",
        "conv2d:n=1,h=14,w=14,c=32,k=64,r=3,s=3,pad=1,dtype=f16",
        "gemm:m=64,n=64,k=64,dtype=i8",
    ];
    for spec in specs {
        let op = spec.parse::<Workload>().unwrap().to_op();
        let space = Space::new(&op, &InstructionSet::Gpu { cc: (8, 0) });
        let mut rng = Rng::new(11);
        let (mut tc, mut simt) = (0, 0);
        for _ in 0..200 {
            let s = space.sample(&mut rng);
            let is_tc = matches!(s, Sketch::TensorCore { .. });
            if (is_tc && tc >= 2) || (!is_tc && simt >= 1) {
                continue;
            }
            let Ok((_, p)) = space.lower(&s) else {
                continue;
            };
            let k = generate(&p, "k").unwrap_or_else(|e| panic!("{spec} {s}: {e}"));
            if is_tc {
                tc += 1
            } else {
                simt += 1
            }
            out.push((format!("{spec} {s}"), k));
        }
    }
    out
}

/// mma.sync kernels of every operand orientation: A row-major; B row-major (gemm, loaded with
/// ldmatrix.trans) and column-major (dense: B is W[n, k]); f16 and bf16; edges and epilogues.
fn mma_kernels() -> Vec<(String, Kernel)> {
    let mut out = Vec::new();
    for spec in [
        "gemm:m=256,n=128,k=96,dtype=f16,epilogue=bias+relu",
        "gemm:m=100,n=60,k=40,dtype=bf16,epilogue=bias",
        "dense:m=64,n=96,k=64,dtype=f16",
        "bmm:b=2,m=64,n=64,k=32,dtype=bf16",
    ] {
        let op = spec.parse::<Workload>().unwrap().to_op();
        let space = Space::new(&op, &InstructionSet::Gpu { cc: (8, 0) });
        let mma = space
            .mappings()
            .iter()
            .enumerate()
            .filter(|(_, m)| m.intrinsic.id.starts_with("mma."));
        // The first two mappings (the operands in either order).
        for (mapping, _) in mma.take(2) {
            let s = Sketch::TensorCore {
                mapping,
                wm: 2,
                wn: 2,
                fm: 2,
                fn_: 4,
                kc: 1,
                stages: 2,
                split: 1,
            };
            let Ok((_, p)) = space.lower(&s) else {
                continue;
            };
            let k = generate(&p, "k").unwrap_or_else(|e| panic!("{spec} {s}: {e}"));
            out.push((format!("{spec} {s}"), k));
        }
    }
    out
}

#[test]
fn mma_sync_kernels_load_operands_with_ldmatrix_and_store_from_registers() {
    let kernels = mma_kernels();
    assert!(kernels.len() >= 4, "{}", kernels.len());
    let all: String = kernels.iter().map(|(_, k)| k.source.as_str()).collect();
    for needle in [
        "tsl_ldsm_x4(",
        "tsl_ldsm_x2_trans(",
        "tsl_ldsm_x2(",
        "tsl_mma_f16(",
        "tsl_mma_bf16(",
    ] {
        assert!(all.contains(needle), "no kernel uses {needle}");
    }
    for (what, k) in &kernels {
        assert!(k.needs_sm80, "{what}");
        assert!(
            !k.source.contains("wmma::") && !k.source.contains("tsl_out"),
            "{what}"
        );
        assert!(
            k.tensor_core
                .as_deref()
                .unwrap()
                .starts_with("mma.m16n8k16"),
            "{what}"
        );
    }
    let (_, k) = &kernels[0];
    snapshot("mma_gemm_bias_relu.cu", &k.source);
}

#[test]
fn nvcc_compiles_generated_kernels_for_sm80_and_sm90() {
    let mut kernels = kernels_to_compile();
    assert!(kernels.len() >= 15, "{}", kernels.len());
    kernels.extend(mma_kernels());
    // Split-K (atomicAdd into f32 and i32 outputs).
    for spec in [
        "gemm:m=64,n=64,k=512,dtype=f16",
        "gemm:m=64,n=64,k=512,dtype=i8",
    ] {
        let mut s = tc(1, 2, 2, 2, 2, 2);
        if let Sketch::TensorCore { split, .. } = &mut s {
            *split = 4;
        }
        let k = generate(&lower(spec, &s), "split_k").unwrap();
        assert!(k.zero_output && k.source.contains("atomicAdd("), "{spec}");
        kernels.push((format!("{spec} {s}"), k));
    }
    let nvcc = match Nvcc::find() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("SKIPPED nvcc compile check: {e}");
            return;
        }
    };
    eprintln!("compiling {} kernels for sm_80 and sm_90", kernels.len());
    // One nvcc per core at a time.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per_thread = kernels.len().div_ceil(threads);
    std::thread::scope(|s| {
        for chunk in kernels.chunks(per_thread) {
            let nvcc = &nvcc;
            s.spawn(move || {
                for (what, k) in chunk {
                    for arch in ["sm_80", "sm_90"] {
                        let info = nvcc
                            .compile(&k.source, &k.name, arch)
                            .unwrap_or_else(|e| panic!("{what} on {arch}: {e}\n{}", k.source));
                        assert!(
                            info.registers > 0 && info.registers <= 255,
                            "{what}: {info:?}"
                        );
                    }
                }
            });
        }
    });
}
