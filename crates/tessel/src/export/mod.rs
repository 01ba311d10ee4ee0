//! `export`: the best kernels of a tuning log as a C library (header, static and shared
//! library, manifest) and a Rust crate, so that an application can call what was tuned.
//!
//! Each workload gets a typed C entry point taking its operands in their own layouts; a
//! workload whose schedule packs its weights once at the root also gets a pack function and a
//! pre-packed entry point (pack the weights once, as oneDNN's pre-packed matmul does). The
//! library is compiled with the flags the kernels were measured with, and checks at run time
//! that the CPU has every instruction those flags allow before a kernel runs.

mod c_api;
mod rust_crate;

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;
use tessel_cpu::codegen::{Prepacked, generate_prepacked};
use tessel_cpu::{Compiler, Mode};
use tessel_intrin::Catalog;
use tessel_ir::{DType, Types, Workload, network_with_types};
use tessel_measure::HardwareFingerprint;
use tessel_search::TuningRecord;

use crate::error::{Context, Result, bail};
use crate::progress::Progress;
use crate::tune::read_log_noting;
use c_api::{CKernel, Param};

/// What to export.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct ExportOptions {
    /// The tuning log (from `tune --log`).
    #[cfg_attr(feature = "clap", arg(long))]
    pub log: PathBuf,
    /// Export every task of this network (each needs a successful record in the log).
    #[cfg_attr(feature = "clap", arg(long, conflicts_with = "workloads"))]
    pub network: Option<String>,
    /// Network batch size.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1))]
    pub batch: u64,
    /// Network element type (as `tune` was given).
    #[cfg_attr(feature = "clap", arg(long, default_value = "bf16"))]
    pub dtype: DType,
    /// Network weights' element type (default: `--dtype`).
    #[cfg_attr(feature = "clap", arg(long))]
    pub wdtype: Option<DType>,
    /// Export these workloads (repeat the flag); without `--network` or `--workload`, every
    /// workload the log has a successful CPU record of.
    #[cfg_attr(feature = "clap", arg(long = "workload"))]
    pub workloads: Vec<Workload>,
    /// The directory to write (created; a previous export there is replaced, anything else
    /// is refused).
    #[cfg_attr(feature = "clap", arg(long))]
    pub out: PathBuf,
    /// Name of the generated Rust crate.
    #[cfg_attr(feature = "clap", arg(long, default_value = "tessel-kernels"))]
    pub crate_name: String,
    /// Export records measured on another CPU, or built by another compiler or `-march`,
    /// than this machine's (the library still checks the CPU when it runs).
    #[cfg_attr(feature = "clap", arg(long))]
    pub allow_other_machine: bool,
}

impl ExportOptions {
    /// Export every workload of `log` into `out`.
    pub fn new(log: impl Into<PathBuf>, out: impl Into<PathBuf>) -> Self {
        ExportOptions {
            log: log.into(),
            network: None,
            batch: 1,
            dtype: DType::BF16,
            wdtype: None,
            workloads: Vec::new(),
            out: out.into(),
            crate_name: "tessel-kernels".into(),
            allow_other_machine: false,
        }
    }
}

/// One exported kernel.
#[derive(Clone, Debug, Serialize)]
pub struct ExportedKernel {
    /// The workload spec.
    pub workload: String,
    /// The C function taking every operand in its own layout.
    pub symbol: String,
    /// The function that packs the weights once, if the schedule packs them at its root.
    pub pack_symbol: Option<String>,
    /// The C function taking the packed weights.
    pub prepacked_symbol: Option<String>,
    /// The record's median latency, ms.
    pub latency_ms: f64,
    /// Its throughput, GFLOP/s (GOP/s for integers).
    pub gflops: f64,
    /// The instruction and mapping, if tensorized.
    pub mapping: Option<String>,
    /// OpenMP threads it was measured with.
    pub threads: u32,
}

/// What `export` wrote.
#[derive(Clone, Debug, Serialize)]
pub struct ExportReport {
    /// The output directory.
    pub out: PathBuf,
    /// The kernels, in the header's order.
    pub kernels: Vec<ExportedKernel>,
    /// Files written, relative to `out`.
    pub files: Vec<String>,
    /// The compiler line and the flags the libraries were built with.
    pub compiler: String,
    /// Compiler flags of the kernels.
    pub flags: Vec<String>,
    /// Records that came from another machine or build (exported with `allow_other_machine`).
    pub other_machine: usize,
}

/// The manifest's entry of one kernel.
#[derive(Serialize)]
struct ManifestKernel<'a> {
    workload: &'a str,
    symbol: &'a str,
    pack: Option<ManifestPack<'a>>,
    operands: Vec<ManifestOperand<'a>>,
    latency_ms: f64,
    gflops: f64,
    cut_short: bool,
    mapping: Option<&'a str>,
    threads: u32,
    instructions: Vec<&'a str>,
    trace: &'a tessel_ir::Trace,
    fingerprint: &'a HardwareFingerprint,
    tessel_version: &'a str,
    measured_at: f64,
}

#[derive(Serialize)]
struct ManifestPack<'a> {
    operand: &'a str,
    pack_symbol: String,
    prepacked_symbol: String,
    packed_dtype: DType,
    packed_shape: &'a [u64],
}

#[derive(Serialize)]
struct ManifestOperand<'a> {
    name: &'a str,
    role: &'a str,
    dtype: DType,
    shape: &'a [u64],
    layout: &'a str,
}

#[derive(Serialize)]
struct Manifest<'a> {
    generator: &'static str,
    tessel_version: &'static str,
    log: String,
    compiler: &'a str,
    flags: &'a [String],
    /// OpenMP: kernels run on the threads `tessel_kernels_set_threads` (or OMP_NUM_THREADS)
    /// gives; each says how many it was tuned with.
    openmp: bool,
    kernels: Vec<ManifestKernel<'a>>,
}

const GENERATOR: &str = "tessel export";
const HEADER: &str = "tessel_kernels.h";
const SOURCE: &str = "tessel_kernels.c";
const STATIC_LIB: &str = "libtessel_kernels.a";
const SHARED_LIB: &str = "libtessel_kernels.so";
const MANIFEST: &str = "manifest.json";

/// Writes the export `opts` describe.
pub fn export(opts: &ExportOptions, progress: &mut dyn Progress) -> Result<ExportReport> {
    check_crate_name(&opts.crate_name)?;
    if !opts.log.exists() {
        bail!("{}: no such tuning log", opts.log.display());
    }
    let contents = read_log_noting(&opts.log, progress)?;
    let usable: Vec<&TuningRecord> = contents
        .records
        .iter()
        .filter(|r| r.target == "cpu")
        .filter(|r| r.result.as_ref().is_ok_and(|m| !m.emulated))
        .collect();
    let wanted = wanted_workloads(opts, &usable)?;
    let mut chosen = Vec::new();
    let mut missing = Vec::new();
    for w in &wanted {
        let spec = w.to_string();
        let best = usable
            .iter()
            .filter(|r| r.workload == spec)
            .filter_map(|r| r.latency().map(|l| (l, *r)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        match best {
            Some((_, r)) => chosen.push((*w, r)),
            None => {
                let tried = contents
                    .records
                    .iter()
                    .filter(|r| r.workload == spec)
                    .count();
                missing.push(format!(
                    "{spec} ({tried} records, none successful on the CPU)"
                ));
            }
        }
    }
    if !missing.is_empty() {
        bail!(
            "{} has no successful CPU record of {} workload(s): {}; tune them first (cargo xtask tune --log {})",
            opts.log.display(),
            missing.len(),
            missing.join("; "),
            opts.log.display()
        );
    }

    let compiler = Compiler::new(Compiler::default_cache_dir())?;
    let other_machine = machine_check(opts, &compiler, &chosen)?;
    if other_machine > 0 {
        progress.note(&format!(
            "warning: {other_machine} kernel(s) were measured on another machine or build; exporting them as asked"
        ));
    }
    prepare_out_dir(&opts.out)?;

    // Generate every kernel, its pack function and pre-packed variant.
    let catalog = Catalog::default();
    let mut used = HashSet::new();
    struct Gen {
        symbol: String,
        params: Vec<Param>,
        kernel: tessel_cpu::Kernel,
        prepacked: Option<Prepacked>,
        op: tessel_ir::ComputeOp,
    }
    let mut gens = Vec::new();
    for (w, r) in &chosen {
        let program = r
            .program(&catalog)
            .with_context(|| format!("the best record of {w}"))?;
        let symbol = c_api::symbol_for(w, &mut used);
        let kernel = tessel_cpu::generate(&program, &format!("{symbol}__kernel"), &catalog)
            .with_context(|| format!("generating {w}"))?;
        let prepacked = match w.weight_input() {
            Some(i) => generate_prepacked(
                &program,
                &format!("{symbol}__prepacked_kernel"),
                &format!("{symbol}__pack_kernel"),
                i,
                &catalog,
            )
            .with_context(|| format!("generating the pre-packed {w}"))?,
            None => None,
        };
        gens.push(Gen {
            params: c_api::params(&program.op),
            op: program.op.clone(),
            symbol,
            kernel,
            prepacked,
        });
    }
    let tuned: Vec<String> = chosen
        .iter()
        .map(|(_, r)| {
            let m = r.result.as_ref().ok();
            format!(
                "tuned: {:.4} ms, {:.1} GFLOP/s, {}, {} OpenMP thread(s)",
                m.map_or(0.0, |m| m.timing.median_s * 1e3),
                m.map_or(0.0, |m| m.gflops),
                r.mapping
                    .as_deref()
                    .and_then(|m| m.split(':').next())
                    .unwrap_or("no tensorized instruction"),
                r.fingerprint.cores_used
            )
        })
        .collect();
    let ckernels: Vec<CKernel> = gens
        .iter()
        .zip(&chosen)
        .zip(&tuned)
        .map(|((g, (w, _)), tuned)| CKernel {
            workload: w,
            symbol: &g.symbol,
            params: &g.params,
            kernel: &g.kernel,
            prepacked: g.prepacked.as_ref(),
            tuned: tuned.clone(),
        })
        .collect();

    // Compile with the flags the kernels were measured with.
    let mut features = BTreeSet::new();
    for g in &gens {
        features.extend(g.kernel.features.iter().cloned());
    }
    let flags: Vec<String> = compiler
        .flags(&features, Mode::Native)
        .into_iter()
        .filter(|f| f != "-shared")
        .collect();
    let built_for = format!("{} {}", compiler.version(), flags.join(" "));
    let fingerprint = &chosen[0].1.fingerprint;
    let preamble = vec![
        format!(
            "{} kernel(s) tuned by {} from {}.",
            chosen.len(),
            tessel_search::records::TESSEL_VERSION,
            opts.log.display()
        ),
        format!(
            "Measured on {} ({}); built by {}.",
            fingerprint.model,
            fingerprint.version,
            compiler.version()
        ),
        format!("Compiler flags: {}.", flags.join(" ")),
    ];
    let out = &opts.out;
    let mut files = Vec::new();
    let mut write = |name: &str, text: &str| -> Result<()> {
        write_atomic(&out.join(name), text.as_bytes())?;
        files.push(name.to_string());
        Ok(())
    };
    write(SOURCE, &c_api::source(&ckernels, &built_for))?;
    write(HEADER, &c_api::header(&ckernels, &preamble))?;
    progress.note(&format!(
        "compiling {} kernel(s) with {}",
        ckernels.len(),
        flags.join(" ")
    ));
    build_libraries(&compiler, &flags, out)?;
    files.push(STATIC_LIB.into());
    files.push(SHARED_LIB.into());

    let manifest = Manifest {
        generator: GENERATOR,
        tessel_version: tessel_search::records::TESSEL_VERSION,
        log: opts.log.display().to_string(),
        compiler: compiler.version(),
        flags: &flags,
        openmp: true,
        kernels: gens
            .iter()
            .zip(&chosen)
            .map(|(g, (_, r))| {
                manifest_kernel(
                    g.symbol.as_str(),
                    &g.params,
                    g.prepacked.as_ref(),
                    r,
                    &g.kernel,
                )
            })
            .collect(),
    };
    let mut files_written = files;
    write_atomic(
        &out.join(MANIFEST),
        serde_json::to_string_pretty(&manifest)?.as_bytes(),
    )?;
    files_written.push(MANIFEST.into());

    // The Rust crate, self-contained: its own copy of the static library.
    let krate = out.join("rust");
    for dir in [krate.join("src"), krate.join("tests"), krate.join("native")] {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let pairs: Vec<(CKernel, &tessel_ir::ComputeOp)> = ckernels
        .iter()
        .zip(&gens)
        .map(|(k, g)| (k.clone(), &g.op))
        .collect();
    for (name, text) in [
        ("rust/Cargo.toml", rust_crate::cargo_toml(&opts.crate_name)),
        ("rust/build.rs", rust_crate::BUILD_RS.to_string()),
        ("rust/src/lib.rs", rust_crate::lib_rs(&ckernels, &preamble)),
        (
            "rust/tests/kernels.rs",
            rust_crate::test_rs(&opts.crate_name, &pairs),
        ),
    ] {
        write_atomic(&out.join(name), text.as_bytes())?;
        files_written.push(name.into());
    }
    let lib = std::fs::read(out.join(STATIC_LIB)).context("reading the static library")?;
    write_atomic(&krate.join("native").join(STATIC_LIB), &lib)?;
    files_written.push(format!("rust/native/{STATIC_LIB}"));

    Ok(ExportReport {
        out: out.clone(),
        kernels: gens
            .iter()
            .zip(&ckernels)
            .zip(&chosen)
            .map(|((g, k), (w, r))| {
                let m = r.result.as_ref().ok();
                ExportedKernel {
                    workload: w.to_string(),
                    symbol: g.symbol.clone(),
                    pack_symbol: k.pack_symbol(),
                    prepacked_symbol: k.prepacked_symbol(),
                    latency_ms: m.map_or(0.0, |m| m.timing.median_s * 1e3),
                    gflops: m.map_or(0.0, |m| m.gflops),
                    mapping: r.mapping.clone(),
                    threads: r.fingerprint.cores_used,
                }
            })
            .collect(),
        files: files_written,
        compiler: compiler.version().to_string(),
        flags,
        other_machine,
    })
}

fn manifest_kernel<'a>(
    symbol: &'a str,
    params: &'a [Param],
    prepacked: Option<&'a Prepacked>,
    r: &'a TuningRecord,
    kernel: &'a tessel_cpu::Kernel,
) -> ManifestKernel<'a> {
    let m = r.result.as_ref().ok();
    ManifestKernel {
        workload: &r.workload,
        symbol,
        pack: prepacked.map(|p| ManifestPack {
            operand: &params[p.operand].name,
            pack_symbol: format!("{symbol}_pack_{}", params[p.operand].name),
            prepacked_symbol: format!("{symbol}_prepacked"),
            packed_dtype: p.packed_dtype,
            packed_shape: &p.packed_shape,
        }),
        operands: params
            .iter()
            .map(|p| ManifestOperand {
                name: &p.name,
                role: p.role,
                dtype: p.dtype,
                shape: &p.shape,
                layout: &p.layout,
            })
            .collect(),
        latency_ms: m.map_or(0.0, |m| m.timing.median_s * 1e3),
        gflops: m.map_or(0.0, |m| m.gflops),
        cut_short: m.is_some_and(|m| m.cut_short),
        mapping: r.mapping.as_deref(),
        threads: r.fingerprint.cores_used,
        instructions: kernel.intrinsics.iter().map(String::as_str).collect(),
        trace: &r.trace,
        fingerprint: &r.fingerprint,
        tessel_version: &r.version,
        measured_at: r.time,
    }
}

/// The workloads to export: a network's tasks, the given specs, or all the log has.
fn wanted_workloads(opts: &ExportOptions, usable: &[&TuningRecord]) -> Result<Vec<Workload>> {
    if opts.wdtype.is_some() && opts.network.is_none() {
        bail!(
            "--wdtype sets a network's weight type; a workload spec carries its own (wdtype=...)"
        );
    }
    if let Some(name) = &opts.network {
        let types = Types {
            dtype: opts.dtype,
            wdtype: opts.wdtype.unwrap_or(opts.dtype),
        };
        let net = network_with_types(name, opts.batch, types)?;
        return Ok(net.tasks().into_iter().map(|t| t.workload).collect());
    }
    if !opts.workloads.is_empty() {
        for w in &opts.workloads {
            w.validate().with_context(|| format!("workload `{w}`"))?;
        }
        return Ok(opts.workloads.clone());
    }
    let mut seen = HashSet::new();
    let mut all = Vec::new();
    for r in usable {
        if r.latency().is_some() && seen.insert(r.workload.clone()) {
            all.push(
                r.parse_workload()
                    .with_context(|| format!("a record of {}", r.workload))?,
            );
        }
    }
    if all.is_empty() {
        bail!(
            "{} holds no successful CPU record to export ({} records)",
            opts.log.display(),
            usable.len()
        );
    }
    Ok(all)
}

/// Counts the chosen records measured on another CPU or built another way than this export
/// would build them; refuses them unless `allow_other_machine`.
fn machine_check(
    opts: &ExportOptions,
    compiler: &Compiler,
    chosen: &[(Workload, &TuningRecord)],
) -> Result<usize> {
    let here = tessel_cpu::fingerprint(1, compiler.version());
    let mut other = 0;
    for (w, r) in chosen {
        let f = &r.fingerprint;
        let mut theirs = f.features.clone();
        let mut ours = here.features.clone();
        theirs.sort();
        ours.sort();
        let why = if f.model != here.model || f.version != here.version {
            Some(format!(
                "it was measured on {} ({}), this machine is {} ({})",
                f.model, f.version, here.model, here.version
            ))
        } else if theirs != ours {
            Some(format!(
                "it was measured on a CPU with features [{}], this one has [{}]",
                theirs.join(" "),
                ours.join(" ")
            ))
        } else if f.compiler != here.compiler {
            Some(format!(
                "it was built by `{}`, this export would build with `{}` (TESSEL_CC, TESSEL_MARCH)",
                f.compiler, here.compiler
            ))
        } else {
            None
        };
        if let Some(why) = why {
            if !opts.allow_other_machine {
                bail!(
                    "the best record of {w} comes from another machine or build: {why}; its timing says nothing about these kernels here. Tune on this machine, or pass --allow-other-machine to export anyway"
                );
            }
            other += 1;
        }
    }
    Ok(other)
}

fn check_crate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !ok {
        bail!(
            "crate name `{name}`: use lowercase letters, digits, `-` and `_`, starting with a letter"
        );
    }
    Ok(())
}

/// Creates `out`, or accepts it if it is empty or holds a previous export; refuses to write
/// into a directory of other files.
fn prepare_out_dir(out: &Path) -> Result<()> {
    if out.exists() {
        if !out.is_dir() {
            bail!("--out {}: exists and is not a directory", out.display());
        }
        let mut entries =
            std::fs::read_dir(out).with_context(|| format!("reading {}", out.display()))?;
        let empty = entries.next().is_none();
        let ours = std::fs::read_to_string(out.join(MANIFEST))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|v| v["generator"] == GENERATOR);
        if !empty && !ours {
            bail!(
                "--out {}: the directory holds other files and no previous export (manifest.json); choose an empty or new directory",
                out.display()
            );
        }
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))
}

/// Writes `path` through a temporary name, so a killed export never leaves half a file.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!(
        "{}.tmp{}",
        path.extension().and_then(|e| e.to_str()).unwrap_or(""),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// Compiles the translation unit once and makes the static and the shared library of it.
fn build_libraries(compiler: &Compiler, flags: &[String], out: &Path) -> Result<()> {
    let obj = out.join(format!("tessel_kernels.{}.o", std::process::id()));
    let run = |cmd: &mut Command, what: &str| -> Result<()> {
        let o = cmd
            .output()
            .with_context(|| format!("{what}: cannot run {cmd:?}"))?;
        if !o.status.success() {
            let err = String::from_utf8_lossy(&o.stderr);
            let short: Vec<&str> = err.lines().take(30).collect();
            bail!("{what} failed ({}):\n{}", o.status, short.join("\n"));
        }
        Ok(())
    };
    let result = (|| {
        run(
            Command::new(compiler.cc())
                .args(flags)
                .arg("-fvisibility=hidden")
                .arg("-c")
                .arg(out.join(SOURCE))
                .arg("-o")
                .arg(&obj),
            "compiling the kernels",
        )?;
        let a_tmp = out.join(format!("{STATIC_LIB}.tmp{}", std::process::id()));
        let _ = std::fs::remove_file(&a_tmp);
        run(
            Command::new("ar").arg("rcs").arg(&a_tmp).arg(&obj),
            "archiving the static library (ar)",
        )?;
        std::fs::rename(&a_tmp, out.join(STATIC_LIB)).context("writing the static library")?;
        let so_tmp = out.join(format!("{SHARED_LIB}.tmp{}", std::process::id()));
        run(
            Command::new(compiler.cc())
                .args(["-shared", "-fopenmp"])
                .arg(&obj)
                .arg("-o")
                .arg(&so_tmp)
                .arg("-lm"),
            "linking the shared library",
        )?;
        std::fs::rename(&so_tmp, out.join(SHARED_LIB)).context("writing the shared library")
    })();
    let _ = std::fs::remove_file(&obj);
    result
}
