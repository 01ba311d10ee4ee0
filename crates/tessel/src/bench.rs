//! `bench_cpu`: each CPU instruction's reference GEMM beside the CPU's measured peak and
//! oneDNN's matmul, in one run; and `measure`: one schedule, generated, checked and timed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde::Serialize;
use tessel_cpu::reference::{gemm_spec, reference_gemm};
use tessel_cpu::{Compiler, CpuMeasurer, CpuOptions, KernelJob, TimingOptions};
use tessel_intrin::{CPU_INSTRUCTIONS, Catalog};
use tessel_ir::{Trace, Workload};
use tessel_measure::{Candidate, Measurer};

use crate::error::{Error, Result, bail};
use crate::progress::Progress;
use crate::target::{TargetOptions, cpu_measurer};
use crate::worker::worker_command;

/// What `bench_cpu` measures.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct BenchOptions {
    /// GEMM size (m = n = k).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1024))]
    pub size: u64,
    /// Thread counts to measure, comma separated.
    #[cfg_attr(
        feature = "clap",
        arg(long, default_value = "1,2", value_delimiter = ',')
    )]
    pub threads: Vec<usize>,
    /// Instruction ids (default: every CPU instruction).
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ','))]
    pub intrinsics: Vec<String>,
    /// Skip the oneDNN baseline.
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_onednn: bool,
    /// Time tessel's kernels with their weights packed beforehand (the pre-packed entry
    /// point), as oneDNN's matmul is timed (its B reordered once, before timing).
    #[cfg_attr(feature = "clap", arg(long))]
    pub prepacked_weights: bool,
    /// The measurement worker executable (default: this program).
    #[cfg_attr(feature = "clap", arg(skip))]
    pub worker_exe: Option<PathBuf>,
}

/// One row of the benchmark table, as `bench_cpu` notes it.
pub fn bench_row_line(row: &BenchRow) -> String {
    let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.1}"));
    let types = row
        .workload
        .parse::<Workload>()
        .map_or("?", |w| onednn_dtype(&w));
    format!(
        "{:<20} {:<5} {:>3} {:>11} {:>11} {:>7} {:>11}  {:<22} {:>8}  {}",
        row.intrinsic,
        types,
        row.threads,
        f(row.peak_gops),
        f(row.tessel_gops),
        f(row.percent_of_peak),
        f(row.onednn_gops),
        row.onednn_impl.clone().unwrap_or_default(),
        row.tessel_over_onednn
            .map_or("-".into(), |r| format!("{r:.2}x")),
        row.note
    )
}

/// The header of the lines [`bench_row_line`] makes.
pub const BENCH_HEADER: &str = "instruction          types thr  peak GOP/s      tessel  % peak      oneDNN  oneDNN impl               ratio";

/// One instruction at one thread count.
#[derive(Clone, Debug, Serialize)]
pub struct BenchRow {
    /// The instruction.
    pub intrinsic: String,
    /// Threads.
    pub threads: usize,
    /// The GEMM measured.
    pub workload: String,
    /// The instruction's peak on this CPU (micro-benchmark).
    pub peak_gops: Option<f64>,
    /// tessel's reference schedule.
    pub tessel_gops: Option<f64>,
    /// tessel against the peak.
    pub percent_of_peak: Option<f64>,
    /// oneDNN's matmul (pre-packed weights).
    pub onednn_gops: Option<f64>,
    /// The oneDNN implementation that ran.
    pub onednn_impl: Option<String>,
    /// tessel / oneDNN, measured in this run.
    pub tessel_over_onednn: Option<f64>,
    /// Why a figure is missing.
    pub note: String,
}

/// What `bench_cpu` measured.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// The machine.
    pub fingerprint: tessel_measure::HardwareFingerprint,
    /// m = n = k.
    pub size: u64,
    /// Per instruction and thread count.
    pub rows: Vec<BenchRow>,
    /// Compile time per candidate in a batch.
    pub compile_ms_per_candidate_batched: f64,
    /// Compile time of one candidate alone.
    pub compile_ms_single_candidate: f64,
    /// The batch.
    pub batch_size: usize,
    /// Worker round trip, input setup and check per candidate.
    pub measure_overhead_ms_per_candidate: f64,
    /// What one timed run costs the timer.
    pub timer_overhead_ns: f64,
}

/// oneDNN's dtype name for a workload's operand types.
fn onednn_dtype(w: &Workload) -> &'static str {
    use tessel_ir::DType::*;
    let t = w.types();
    match (t.dtype, t.wdtype) {
        (BF16, BF16) => "bf16",
        (F16, F16) => "f16",
        (U8, I8) => "u8s8",
        (I8, I8) => "s8s8",
        _ => "f32",
    }
}

/// The most oneDNN may use beside an instruction (`ONEDNN_MAX_CPU_ISA`), so that a row
/// compares like with like: on an AVX-512 machine, the AVX2 rows face oneDNN's AVX2 kernels,
/// and on an AMX machine the AVX-512 rows face its AVX-512 kernels, not its tile kernels.
fn onednn_max_isa(id: &str) -> Option<&'static str> {
    match id.split('.').next() {
        Some("avx2") => Some("AVX2"),
        Some("avxvnni") => Some("AVX2_VNNI"),
        Some("avx512") => Some("AVX512_CORE_BF16"),
        _ => None,
    }
}

/// The GEMMs benchmarked on an instruction: its own types, and for the AVX2 f32 FMA also
/// bf16 and f16 converted on packing (what an AVX2 machine runs 16-bit models with).
fn bench_specs(id: &str, size: u64) -> Vec<String> {
    let own = gemm_spec(id, size, size, size);
    let mut v = vec![own.clone()];
    if id == "avx2.vfmadd231ps" {
        for t in ["bf16", "f16"] {
            v.push(own.replace("dtype=f32", &format!("dtype={t}")));
        }
    }
    v
}

/// Builds the oneDNN driver if Debian's libdnnl-dev is installed.
fn build_onednn(cache: &Path) -> Result<PathBuf, String> {
    let header = Path::new("/usr/include/oneapi/dnnl/dnnl.hpp");
    if !header.exists() {
        return Err("oneDNN not installed (apt-get install libdnnl-dev)".into());
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tessel-cpu/bench/onednn_matmul.cpp");
    let exe = cache.join("onednn_matmul");
    let fresh = |p: &Path| p.metadata().and_then(|m| m.modified()).ok();
    if exe.exists() && fresh(&exe) >= fresh(&src) {
        return Ok(exe);
    }
    let out = Command::new("c++")
        .args(["-O2", "-std=c++17"])
        .arg(&src)
        .args(["-ldnnl", "-o"])
        .arg(&exe)
        .output()
        .map_err(|e| format!("cannot run c++: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the oneDNN driver did not build: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .take(5)
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    Ok(exe)
}

fn run_onednn(
    exe: &Path,
    size: u64,
    dtype: &str,
    threads: usize,
    max_isa: Option<&str>,
) -> Result<(f64, String), String> {
    if dtype == "s8s8" {
        return Err("oneDNN matmul takes u8 sources only".into());
    }
    let out = Command::new(exe)
        .args([
            size.to_string(),
            size.to_string(),
            size.to_string(),
            dtype.to_string(),
        ])
        .env("OMP_NUM_THREADS", threads.to_string())
        .envs(
            max_isa
                .into_iter()
                .flat_map(|isa| [("ONEDNN_MAX_CPU_ISA", isa), ("DNNL_MAX_CPU_ISA", isa)]),
        )
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if let Some(why) = text.strip_prefix("unsupported: ") {
        return Err(format!("oneDNN: {}", why.trim()));
    }
    let field = |k: &str| {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .map(str::to_string)
    };
    let gflops = field("gflops")
        .and_then(|g| g.parse::<f64>().ok())
        .ok_or_else(|| format!("unreadable oneDNN output: {text}"))?;
    Ok((gflops, field("impl").unwrap_or_default()))
}

/// Measures each instruction's reference GEMM beside this CPU's peak for it and oneDNN's
/// matmul, in one run; each row goes to `progress` as a note as soon as it is measured.
pub fn bench_cpu(o: &BenchOptions, progress: &mut dyn Progress) -> Result<BenchReport> {
    let (size, threads, ids, onednn) = (o.size, &o.threads, &o.intrinsics, !o.no_onednn);
    if size == 0 || threads.contains(&0) {
        bail!("size and threads must be at least 1");
    }
    let compiler = Compiler::new(Compiler::default_cache_dir())?;
    let catalog = Catalog::default();
    let ids: Vec<&str> = if ids.is_empty() {
        CPU_INSTRUCTIONS.to_vec()
    } else {
        ids.iter().map(String::as_str).collect()
    };
    for id in &ids {
        if catalog.get(id).is_none() {
            bail!(
                "unknown instruction `{id}` (CPU ones: {})",
                CPU_INSTRUCTIONS.join(", ")
            );
        }
    }
    let onednn_exe = if onednn {
        build_onednn(compiler.cache_dir())
    } else {
        Err("skipped (--no-onednn)".into())
    };
    let fingerprint =
        tessel_cpu::fingerprint(threads.first().copied().unwrap_or(1), compiler.version());
    progress.note(&format!(
        "tessel CPU benchmark: gemm {size}^3 on {} ({}), {}{}",
        fingerprint.model,
        fingerprint.version,
        fingerprint.compiler,
        if o.prepacked_weights {
            "; tessel's weights pre-packed, as oneDNN's are"
        } else {
            "; tessel packs its weights inside the timed call, oneDNN's are pre-packed"
        }
    ));
    if let Err(why) = &onednn_exe {
        progress.note(&format!("oneDNN: {why}"));
    }
    progress.note(BENCH_HEADER);
    let mut rows = Vec::new();
    for &t in threads {
        let peaks = tessel_cpu::peak::measure_peaks(&compiler, &ids, t)?;
        let mut m = cpu_measurer(&TargetOptions {
            threads: t,
            worker_exe: o.worker_exe.clone(),
            ..TargetOptions::default()
        })?;
        for (id, spec) in ids
            .iter()
            .flat_map(|id| bench_specs(id, size).into_iter().map(move |s| (*id, s)))
        {
            let w: Workload = spec.parse()?;
            let peak = peaks
                .measured
                .iter()
                .find(|p| p.intrinsic == id)
                .map(|p| p.gops);
            let mut row = BenchRow {
                intrinsic: id.to_string(),
                threads: t,
                workload: spec.clone(),
                peak_gops: peak,
                tessel_gops: None,
                percent_of_peak: None,
                onednn_gops: None,
                onednn_impl: None,
                tessel_over_onednn: None,
                note: String::new(),
            };
            if let Some((_, why)) = peaks.skipped.iter().find(|s| s.0 == id) {
                row.note = format!("skipped: {why}");
            } else {
                let trace = reference_gemm(&w, id, None).map_err(Error::Invalid)?;
                let weights = w.weight_input().filter(|_| o.prepacked_weights);
                let candidate = Candidate::new(w.to_op(), trace).with_prepacked_weights(weights);
                match m.measure(&[candidate]).remove(0) {
                    Ok(r) => {
                        row.tessel_gops = Some(r.gflops);
                        row.percent_of_peak = peak.map(|p| 100.0 * r.gflops / p);
                    }
                    Err(e) => row.note = format!("tessel: {e}"),
                }
                if let Ok(exe) = &onednn_exe {
                    match run_onednn(exe, size, onednn_dtype(&w), t, onednn_max_isa(id)) {
                        Ok((g, imp)) => {
                            row.onednn_gops = Some(g);
                            row.onednn_impl = Some(imp);
                            row.tessel_over_onednn = row.tessel_gops.map(|x| x / g);
                        }
                        Err(e) => row.note = e,
                    }
                }
            }
            progress.note(&bench_row_line(&row));
            rows.push(row);
        }
    }
    let (batched, single, batch_size) = compile_times(&compiler)?;
    let overhead = measure_overhead(o.worker_exe.as_deref())?;
    let timer_ns = timer_overhead_ns();
    Ok(BenchReport {
        fingerprint,
        size,
        rows,
        compile_ms_per_candidate_batched: batched,
        compile_ms_single_candidate: single,
        batch_size,
        measure_overhead_ms_per_candidate: overhead,
        timer_overhead_ns: timer_ns,
    })
}

/// Compile time of a batch of reference-schedule variants in one object, per candidate, and
/// of one candidate alone (fresh builds: a nonce defeats the cache).
fn compile_times(compiler: &Compiler) -> Result<(f64, f64, usize)> {
    let catalog = Catalog::default();
    let w: Workload = gemm_spec("avx2.vfmadd231ps", 256, 256, 256).parse()?;
    let op = w.to_op();
    let mut kernels = Vec::new();
    for (i, (mr, kc)) in [
        (1, 64),
        (2, 64),
        (4, 64),
        (1, 128),
        (2, 128),
        (4, 128),
        (2, 256),
        (4, 256),
    ]
    .into_iter()
    .enumerate()
    {
        for id in ["avx2.vfmadd231ps", "avx512.vfmadd231ps"] {
            let plan = tessel_cpu::reference::GemmPlan { mr, nr: 2, kc };
            let t = reference_gemm(&w, id, Some(plan)).map_err(Error::Invalid)?;
            let p = t.lower(&op, &catalog)?;
            kernels.push(tessel_cpu::generate(
                &p,
                &format!("k{i}_{}", kernels.len()),
                &catalog,
            )?);
        }
    }
    let nonce = format!("/* {:?} */\n", Instant::now());
    let features = kernels
        .iter()
        .flat_map(|k| k.features.iter().cloned())
        .collect();
    let refs: Vec<&tessel_cpu::Kernel> = kernels.iter().collect();
    let all = compiler.compile(
        &format!("{nonce}{}", tessel_cpu::module_source(&refs)),
        &features,
        tessel_cpu::Mode::Native,
    )?;
    let one = compiler.compile(
        &format!("{nonce}{}", tessel_cpu::module_source(&refs[..1])),
        &refs[0].features,
        tessel_cpu::Mode::Native,
    )?;
    Ok((
        all.compile_time.as_secs_f64() * 1e3 / kernels.len() as f64,
        one.compile_time.as_secs_f64() * 1e3,
        kernels.len(),
    ))
}

/// Wall time per candidate of measuring already-compiled tiny kernels, beyond their own run
/// time: the worker round trip, input preparation and the reference check.
fn measure_overhead(worker_exe: Option<&Path>) -> Result<f64> {
    let mut m = CpuMeasurer::new(
        worker_command("cpu", worker_exe)?,
        CpuOptions {
            timing: TimingOptions::single_run(),
            ..CpuOptions::default()
        },
    )?;
    // Twenty distinct tiny GEMMs on the same shape family; the naive schedule.
    let jobs: Vec<Result<KernelJob, tessel_measure::MeasureError>> = (0..20)
        .map(|i| {
            let w: Workload = format!("gemm:m=16,n=16,k={},dtype=f32", 16 + i).parse()?;
            Ok(m.prepare(&Candidate::new(w.to_op(), Trace::new()), &format!("k{i}")))
        })
        .collect::<Result<_>>()?;
    // The first pass compiles and prepares inputs; the second is the steady state of tuning.
    let _ = m.measure_kernels(&jobs);
    let start = Instant::now();
    let r = m.measure_kernels(&jobs);
    let wall = start.elapsed().as_secs_f64();
    let kernel: f64 = r
        .iter()
        .filter_map(|x| x.as_ref().ok())
        .map(|x| x.timing.median_s)
        .sum();
    Ok((wall - kernel) * 1e3 / jobs.len() as f64)
}

/// What the worker's per-run timing costs: one `Instant::now()` pair and an elapsed().
fn timer_overhead_ns() -> f64 {
    let n = 1_000_000;
    let start = Instant::now();
    let mut sink = 0.0;
    for _ in 0..n {
        let t = Instant::now();
        sink += t.elapsed().as_secs_f64();
    }
    std::hint::black_box(sink);
    start.elapsed().as_secs_f64() * 1e9 / n as f64
}
