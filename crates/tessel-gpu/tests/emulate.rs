//! Generated kernels compute the operator: each runs on the CPU emulation (`emulate.h`) and
//! its output is compared with tessel-ir's reference. Tensor Core kernels (WMMA and mma.sync,
//! every operand orientation), SIMT kernels, pipelines, edges and epilogues. Skipped, with
//! the reason, where there is no C++20 compiler.

use tessel_gpu::emulate::Emulator;
use tessel_gpu::generate;
use tessel_ir::Workload;
use tessel_measure::check::{max_relative_error, tolerance, unravel};
use tessel_search::rng::Rng;
use tessel_search::{InstructionSet, Sketch, Space};

fn emulator() -> Option<Emulator> {
    match Emulator::find() {
        Ok(e) => Some(e),
        Err(e) => {
            eprintln!("SKIPPED GPU emulation: {e}");
            None
        }
    }
}

/// Emulates the kernel of `sketch` for `spec` and compares with the reference; the kernel's
/// source when it agrees.
fn check(emu: &Emulator, spec: &str, space: &Space, sketch: &Sketch) -> Result<String, String> {
    let op = space.op();
    let (_, program) = space.lower(sketch)?;
    let kernel = generate(&program, "k").map_err(|e| e.to_string())?;
    let inputs = op.random_inputs(7);
    let want = op.reference(&inputs).map_err(|e| e.to_string())?;
    let got = emu
        .run(&kernel, &program, &inputs)
        .map_err(|e| format!("{spec} {sketch}: {e}"))?;
    let (err, at) = max_relative_error(&got, &want);
    if err.is_nan() || err > tolerance(op) {
        // The kernel body (after the prelude) says where to look.
        let body = kernel
            .source
            .split("extern \"C\"")
            .nth(1)
            .unwrap_or_default();
        return Err(format!(
            "{spec} {sketch}: error {err:.3e} at {:?}: got {}, want {}\n{body}",
            unravel(at, &want.shape),
            got.data[at],
            want.data[at],
        ));
    }
    Ok(kernel.source)
}

fn space(spec: &str) -> Space {
    let op = spec.parse::<Workload>().unwrap().to_op();
    Space::new(&op, &InstructionSet::Gpu { cc: (8, 0) })
}

#[test]
fn mma_sync_kernels_compute_the_operator_in_every_operand_orientation() {
    let Some(emu) = emulator() else { return };
    let mut checked = Vec::new();
    let mut sources = String::new();
    for spec in [
        "gemm:m=64,n=48,k=48,dtype=f16,epilogue=bias+relu",
        "gemm:m=40,n=24,k=40,dtype=bf16",
        "dense:m=32,n=40,k=32,dtype=f16",
    ] {
        let s = space(spec);
        for (mapping, m) in s.mappings().iter().enumerate() {
            if !m.intrinsic.id.starts_with("mma.") {
                continue;
            }
            let sketch = Sketch::TensorCore {
                mapping,
                wm: 2,
                wn: 1,
                fm: 1,
                fn_: 2,
                kc: 2,
                stages: 2,
                split: 1,
            };
            if s.lower(&sketch).is_err() {
                continue;
            }
            sources += &check(&emu, spec, &s, &sketch).unwrap();
            checked.push(m.mapping.to_string());
        }
    }
    assert!(checked.len() >= 4, "{checked:?}");
    for load in [
        "tsl_ldsm_x4(a",
        "tsl_ldsm_x4_trans(a",
        "tsl_ldsm_x2(b",
        "tsl_ldsm_x2_trans(b",
    ] {
        assert!(sources.contains(load), "no checked kernel uses {load}");
    }
}

#[test]
fn wmma_and_simt_kernels_compute_the_operator() {
    let Some(emu) = emulator() else { return };
    let mut rng = Rng::new(21);
    let (mut tc, mut simt) = (0, 0);
    for spec in [
        "gemm:m=48,n=40,k=32,dtype=f16,epilogue=bias",
        "gemm:m=32,n=32,k=48,dtype=i8",
        "bmm:b=2,m=32,n=16,k=32,dtype=bf16",
        "conv2d:n=1,h=6,w=6,c=16,k=16,r=3,s=3,pad=1,dtype=f16,epilogue=relu",
        "dense:m=8,n=24,k=16,dtype=f32",
    ] {
        let s = space(spec);
        let mut done = (0, 0);
        for _ in 0..400 {
            if done.0 >= 2 && done.1 >= 1 {
                break;
            }
            let sketch = s.sample(&mut rng);
            let is_tc = matches!(sketch, Sketch::TensorCore { .. });
            if (is_tc && done.0 >= 2) || (!is_tc && done.1 >= 1) {
                continue;
            }
            // Keep the emulation small: at most 256 threads.
            let Ok((_, p)) = s.lower(&sketch) else {
                continue;
            };
            let Ok(k) = generate(&p, "k") else { continue };
            if k.threads_per_block() > 256 || k.blocks() > 64 {
                continue;
            }
            check(&emu, spec, &s, &sketch).unwrap();
            if is_tc {
                done.0 += 1;
            } else {
                done.1 += 1;
            }
        }
        tc += done.0;
        simt += done.1;
    }
    assert!(
        tc >= 6 && simt >= 4,
        "{tc} Tensor Core, {simt} SIMT kernels checked"
    );
}

#[test]
fn a_wrong_kernel_is_caught() {
    let Some(emu) = emulator() else { return };
    let s = space("gemm:m=32,n=32,k=32,dtype=f16");
    let sketch = Sketch::TensorCore {
        mapping: 0,
        wm: 1,
        wn: 1,
        fm: 2,
        fn_: 2,
        kc: 1,
        stages: 1,
        split: 1,
    };
    let (_, program) = s.lower(&sketch).unwrap();
    let mut kernel = generate(&program, "k").unwrap();
    let inputs = s.op().random_inputs(1);
    let want = s.op().reference(&inputs).unwrap();
    let good = emu.run(&kernel, &program, &inputs).unwrap();
    assert!(max_relative_error(&good, &want).0 <= tolerance(s.op()));
    // Launch one row of blocks fewer: the outputs of the missing row stay NaN.
    kernel.grid[1] -= 1;
    let bad = emu.run(&kernel, &program, &inputs).unwrap();
    assert!(max_relative_error(&bad, &want).0.is_infinite());
}

#[test]
fn split_k_kernels_add_their_parts_into_the_output() {
    let Some(emu) = emulator() else { return };
    let mut checked = 0;
    for spec in [
        "gemm:m=32,n=32,k=200,dtype=f16",
        "gemm:m=32,n=16,k=256,dtype=i8",
        "dense:m=16,n=32,k=160,dtype=bf16",
    ] {
        let s = space(spec);
        // The first WMMA and the first mma.sync mapping of each.
        let mut families = std::collections::BTreeSet::new();
        for (mapping, m) in s.mappings().iter().enumerate() {
            let family = m.intrinsic.id.split('.').next().unwrap_or_default();
            if !families.insert(family) {
                continue;
            }
            for split in [2, 3] {
                let sketch = Sketch::TensorCore {
                    mapping,
                    wm: 1,
                    wn: 2,
                    fm: 2,
                    fn_: 1,
                    kc: 1,
                    stages: 2,
                    split,
                };
                let (_, p) = s.lower(&sketch).unwrap();
                let k = generate(&p, "k").unwrap();
                assert!(
                    k.zero_output && k.grid[2] == split as u32,
                    "{spec} {sketch}"
                );
                assert!(k.source.contains("atomicAdd("), "{spec} {sketch}");
                check(&emu, spec, &s, &sketch).unwrap();
                checked += 1;
            }
        }
    }
    assert!(checked >= 10, "{checked}");
}
