//! Feature extraction throughput on tensorized GEMM candidates (3-level tiling): one core,
//! then the rayon batch form. Goal: at least 50,000 candidates per second on one core.
//!
//! `cargo bench -p tessel-features` (add `-- --json` for one JSON line).

use std::collections::BTreeMap;
use std::time::Instant;

use tessel_features::{Target, extract, extract_batch};
use tessel_search::rng::Rng;
use tessel_search::{InstructionSet, Space};

fn main() {
    let json = std::env::args().any(|a| a == "--json");
    let workloads = [
        ("gemm:m=1024,n=1024,k=1024,dtype=bf16", "amx.tdpbf16ps"),
        ("gemm:m=512,n=768,k=3072,dtype=f32", "avx512.vfmadd231ps"),
        (
            "gemm:m=1024,n=1024,k=1024,dtype=u8,wdtype=i8",
            "avx512.vpdpbusd",
        ),
    ];
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
    let target = Target::cpu("sapphire-rapids", &flags, 1, &BTreeMap::new(), None);
    let mut programs = Vec::new();
    let mut rng = Rng::new(7);
    for (spec, intr) in workloads {
        let op = spec
            .parse::<tessel_ir::Workload>()
            .expect("a valid spec")
            .to_op();
        let space = Space::new(&op, &InstructionSet::Only(vec![intr.to_string()]));
        let mut made = 0;
        while made < 1000 {
            let sketch = space.sample(&mut rng);
            if let Ok((_, p)) = space.lower(&sketch) {
                programs.push(p);
                made += 1;
            }
        }
    }
    let refs: Vec<&tessel_ir::Program> = programs.iter().collect();
    let tokens: usize = refs
        .iter()
        .map(|p| extract(p, &target).map_or(0, |f| f.len()))
        .sum();

    let rounds = 20;
    let start = Instant::now();
    let mut sink = 0usize;
    for _ in 0..rounds {
        for p in &refs {
            sink += extract(p, &target).map_or(0, |f| f.len());
        }
    }
    let one_core = (rounds * refs.len()) as f64 / start.elapsed().as_secs_f64();

    let start = Instant::now();
    for _ in 0..rounds {
        sink += extract_batch(&refs, &target).len();
    }
    let batch = (rounds * refs.len()) as f64 / start.elapsed().as_secs_f64();
    std::hint::black_box(sink);

    let mean_tokens = tokens as f64 / refs.len() as f64;
    if json {
        println!(
            "{{\"programs\":{},\"mean_tokens\":{mean_tokens:.1},\"one_core_per_s\":{one_core:.0},\"batch_per_s\":{batch:.0},\"threads\":{}}}",
            refs.len(),
            rayon::current_num_threads()
        );
    } else {
        println!(
            "{} tensorized GEMM candidates, {mean_tokens:.1} tokens each on average",
            refs.len()
        );
        println!("one core:          {one_core:>9.0} candidates/s (goal 50,000)");
        println!(
            "batch ({} threads): {batch:>9.0} candidates/s",
            rayon::current_num_threads()
        );
    }
}
