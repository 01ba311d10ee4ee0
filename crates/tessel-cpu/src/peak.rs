//! Micro-benchmarks of each instruction's peak throughput on this CPU (measured, not assumed):
//! long chains of independent instructions on register-resident operands.

use std::time::Instant;

use tessel_intrin::{Catalog, HostCpu, Support};

use crate::compile::{Compiler, Mode};
use crate::error::CompileError;

/// The measured peak of one instruction.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Peak {
    pub intrinsic: String,
    pub threads: usize,
    /// Operations (2 per multiply-accumulate) per second, in billions.
    pub gops: f64,
}

/// What [`measure_peaks`] found: the peaks it measured, and the instructions it skipped with
/// the reason.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Peaks {
    pub measured: Vec<Peak>,
    pub skipped: Vec<(String, String)>,
}

/// The body of an AMX peak kernel running `_tile_<ins>` four times an iteration.
macro_rules! amx_body {
    ($ins:literal) => {
        concat!(
            "static char zero[1024] __attribute__((aligned(64)));
             TSL_AMX_INIT();
             _tile_loadd(4, zero, 64); _tile_loadd(5, zero, 64);
             for (long it = 0; it < iters; it++) { _tile_",
            $ins,
            "(0, 4, 5); _tile_",
            $ins,
            "(1, 4, 5); _tile_",
            $ins,
            "(2, 4, 5); _tile_",
            $ins,
            "(3, 4, 5); }
             _tile_stored(0, zero, 64); _tile_release(); sink += zero[0];"
        )
    };
}

/// The C body of one peak kernel: `iters` rounds of independent instructions; returns the
/// operations done (per thread).
fn body(id: &str) -> Option<(&'static str, &'static str, usize)> {
    // (setup + loop body, operations per loop iteration, instructions per loop iteration)
    Some(match id {
        "avx2.vfmadd231ps" => (
            "__m256 c[12]; for (int i = 0; i < 12; i++) c[i] = _mm256_set1_ps((float)i);
             __m256 a = _mm256_set1_ps(1e-9f), b = _mm256_set1_ps(0.5f); TSL_OPAQUE(a); TSL_OPAQUE(b);
             for (long it = 0; it < iters; it++) { for (int i = 0; i < 12; i++) c[i] = _mm256_fmadd_ps(a, b, c[i]); }
             for (int i = 0; i < 12; i++) TSL_KEEP(c[i]);
             float s[8]; __m256 t = c[0]; for (int i = 1; i < 12; i++) t = _mm256_add_ps(t, c[i]); _mm256_storeu_ps(s, t); sink += s[0];",
            "12 * 8 * 2",
            12,
        ),
        // The kernels' own vpmaddwd + vpaddd pair (the prelude's asm): as intrinsics, gcc
        // hoists the loop-invariant product out of the loop, or spills on 16 ymm registers.
        "avx2.vpmaddwd" => (
            "__m256i c[12]; for (int i = 0; i < 12; i++) c[i] = _mm256_set1_epi32(i);
             __m256i a = _mm256_set1_epi32(0x00010001), b = _mm256_set1_epi32(0x00010001); TSL_OPAQUE(a); TSL_OPAQUE(b);
             for (long it = 0; it < iters; it++) { for (int i = 0; i < 12; i++) c[i] = tsl_madd_add(c[i], a, b); }
             for (int i = 0; i < 12; i++) TSL_KEEP(c[i]);
             int32_t s[8]; __m256i t = c[0]; for (int i = 1; i < 12; i++) t = _mm256_add_epi32(t, c[i]); _mm256_storeu_si256((__m256i *)s, t); sink += s[0];",
            "12 * 8 * 2 * 2",
            12,
        ),
        "avx2.vpmaddubsw" => (
            "__m256i c[12]; for (int i = 0; i < 12; i++) c[i] = _mm256_set1_epi32(i);
             __m256i a = _mm256_set1_epi32(0x01010101), b = _mm256_set1_epi32(0x01010101); TSL_OPAQUE(a); TSL_OPAQUE(b);
             for (long it = 0; it < iters; it++) { for (int i = 0; i < 12; i++) c[i] = tsl_maddubs_add(c[i], a, b); }
             for (int i = 0; i < 12; i++) TSL_KEEP(c[i]);
             int32_t s[8]; __m256i t = c[0]; for (int i = 1; i < 12; i++) t = _mm256_add_epi32(t, c[i]); _mm256_storeu_si256((__m256i *)s, t); sink += s[0];",
            "12 * 8 * 4 * 2",
            12,
        ),
        "avxvnni.vpdpbusd" => (
            "__m256i c[12]; for (int i = 0; i < 12; i++) c[i] = _mm256_set1_epi32(i);
             __m256i a = _mm256_set1_epi32(0x01010101), b = _mm256_set1_epi32(0x01010101); TSL_OPAQUE(a); TSL_OPAQUE(b);
             for (long it = 0; it < iters; it++) { for (int i = 0; i < 12; i++) c[i] = _mm256_dpbusd_avx_epi32(c[i], a, b); }
             for (int i = 0; i < 12; i++) TSL_KEEP(c[i]);
             int32_t s[8]; __m256i t = c[0]; for (int i = 1; i < 12; i++) t = _mm256_add_epi32(t, c[i]); _mm256_storeu_si256((__m256i *)s, t); sink += s[0];",
            "12 * 8 * 4 * 2",
            12,
        ),
        "avx512.vfmadd231ps" => (
            "__m512 c[16]; for (int i = 0; i < 16; i++) c[i] = _mm512_set1_ps((float)i);
             __m512 a = _mm512_set1_ps(1e-9f), b = _mm512_set1_ps(0.5f); TSL_OPAQUE(a); TSL_OPAQUE(b);
             for (long it = 0; it < iters; it++) { for (int i = 0; i < 16; i++) c[i] = _mm512_fmadd_ps(a, b, c[i]); }
             for (int i = 0; i < 16; i++) TSL_KEEP(c[i]);
             __m512 t = c[0]; for (int i = 1; i < 16; i++) t = _mm512_add_ps(t, c[i]); sink += _mm512_reduce_add_ps(t);",
            "16 * 16 * 2",
            16,
        ),
        "avx512.vpdpbusd" => (
            "__m512i c[16]; for (int i = 0; i < 16; i++) c[i] = _mm512_set1_epi32(i);
             __m512i a = _mm512_set1_epi32(0x01010101), b = _mm512_set1_epi32(0x01010101); TSL_OPAQUE(a); TSL_OPAQUE(b);
             for (long it = 0; it < iters; it++) { for (int i = 0; i < 16; i++) c[i] = _mm512_dpbusd_epi32(c[i], a, b); }
             for (int i = 0; i < 16; i++) TSL_KEEP(c[i]);
             __m512i t = c[0]; for (int i = 1; i < 16; i++) t = _mm512_add_epi32(t, c[i]); sink += _mm512_reduce_add_epi32(t);",
            "16 * 16 * 4 * 2",
            16,
        ),
        "avx512.vdpbf16ps" => (
            "__m512 c[16]; for (int i = 0; i < 16; i++) c[i] = _mm512_set1_ps((float)i);
             __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x3f803f80); TSL_OPAQUE(a); TSL_OPAQUE(b);
             for (long it = 0; it < iters; it++) { for (int i = 0; i < 16; i++) c[i] = _mm512_dpbf16_ps(c[i], a, b); }
             for (int i = 0; i < 16; i++) TSL_KEEP(c[i]);
             __m512 t = c[0]; for (int i = 1; i < 16; i++) t = _mm512_add_ps(t, c[i]); sink += _mm512_reduce_add_ps(t);",
            "16 * 16 * 2 * 2",
            16,
        ),
        // Four independent tile dot products an iteration, on tiles loaded once. tdpbssd runs
        // its own instruction (it ran tdpbusd's loop until the assembly test below).
        "amx.tdpbf16ps" => (amx_body!("dpbf16ps"), "4 * 16 * 16 * 32 * 2", 4),
        "amx.tdpbusd" => (amx_body!("dpbusd"), "4 * 16 * 16 * 64 * 2", 4),
        "amx.tdpbssd" => (amx_body!("dpbssd"), "4 * 16 * 16 * 64 * 2", 4),
        _ => return None,
    })
}

/// What every peak module starts with: the kernels' prelude, the OpenMP thread setter, and
/// the two barriers that keep gcc honest. A chain whose result is never read is dead code:
/// gcc 12 at -O3 dropped one of the twelve AVX2 FMA chains (its accumulator started at
/// zero), so the loop ran 11 FMAs while the rate counted 12, and the Zen 4 guest's AVX2 peak
/// read 125 GFLOP/s instead of the 117.5 it is. `TSL_KEEP` makes each accumulator an input
/// of an (empty) asm statement after the loop; `TSL_OPAQUE` hides the constant operands, so
/// that no product is folded or hoisted out of the loop.
fn module_prelude() -> String {
    let mut src = String::from(crate::codegen::PRELUDE);
    src.push_str(
        "#include <omp.h>\nvoid tsl_set_threads(int t) { omp_set_num_threads(t); }\n\
         #define TSL_OPAQUE(x) __asm__ volatile(\"\" : \"+v\"(x))\n\
         #define TSL_KEEP(x) __asm__ volatile(\"\" : : \"v\"(x))\n",
    );
    src
}

/// The C function of one peak kernel: `body` on each OpenMP thread, returning the
/// operations done.
fn kernel_source(id: &str, body: &str, ops: &str) -> String {
    format!(
        "double {}(long iters) {{\n  double total = 0;\n  #pragma omp parallel reduction(+:total)\n  {{\n    volatile float sink = 0;\n    {body}\n    total += (double)iters * ({ops});\n  }}\n  return total;\n}}\n",
        symbol(id)
    )
}

/// Seconds of one timed run of a peak kernel.
const PEAK_RUN_S: f64 = 0.05;
/// A peak is the best of at least this many runs ...
const PEAK_MIN_RUNS: u32 = 10;
/// ... and of this many more after its last gain of over `PEAK_GAIN` ...
const PEAK_QUIET_RUNS: u32 = 5;
const PEAK_GAIN: f64 = 0.005;
/// ... and of at most this many (2 s of runs each).
const PEAK_MAX_RUNS: u32 = 40;

/// The best rate of a peak kernel's runs so far, and whether it has settled.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct BestOf {
    best: f64,
    runs: u32,
    /// Runs since the best last grew by more than `PEAK_GAIN`.
    quiet: u32,
}

impl BestOf {
    fn add(&mut self, rate: f64) {
        self.runs += 1;
        if rate > self.best * (1.0 + PEAK_GAIN) {
            self.quiet = 0;
        } else {
            self.quiet += 1;
        }
        self.best = self.best.max(rate);
    }

    fn settled(&self) -> bool {
        self.runs >= PEAK_MAX_RUNS || (self.runs >= PEAK_MIN_RUNS && self.quiet >= PEAK_QUIET_RUNS)
    }
}

fn symbol(id: &str) -> String {
    format!("tsl_peak_{}", id.replace('.', "_"))
}

/// Measures the peak of every instruction in `ids` that this CPU supports, on `threads`
/// threads (OpenMP, one chain per thread). Unsupported ones are skipped, with the reason.
pub fn measure_peaks(
    compiler: &Compiler,
    ids: &[&str],
    threads: usize,
) -> Result<Peaks, CompileError> {
    let host = HostCpu::detect();
    let catalog = Catalog::default();
    let mut skipped = Vec::new();
    let mut runnable = Vec::new();
    let mut features = std::collections::BTreeSet::new();
    let mut src = module_prelude();
    for id in ids {
        let Some(intr) = catalog.get(id) else {
            skipped.push((id.to_string(), "unknown instruction".into()));
            continue;
        };
        match (host.supports(intr), body(id)) {
            (Support::Yes, Some((b, ops, _))) => {
                if let tessel_intrin::Requirement::CpuFeatures(f) = &intr.requires {
                    features.extend(f.iter().map(|s| s.to_string()));
                }
                src.push_str(&kernel_source(id, b, ops));
                runnable.push(id.to_string());
            }
            (Support::No(why), _) => skipped.push((id.to_string(), why)),
            (Support::Yes, None) => skipped.push((id.to_string(), "no micro-benchmark".into())),
        }
    }
    let lib = compiler.compile(&src, &features, Mode::Native)?;
    let mut peaks = Vec::new();
    // SAFETY: the object was just built from the source above; only supported instructions
    // are in it.
    let loaded = unsafe { libloading::Library::new(&lib.path) }.map_err(|e| CompileError::Io {
        path: lib.path.clone(),
        source: std::io::Error::other(e.to_string()),
    })?;
    unsafe {
        if let Ok(set) = loaded.get::<unsafe extern "C" fn(i32)>(b"tsl_set_threads") {
            set(threads as i32);
        }
    }
    let kernels: Vec<(String, unsafe extern "C" fn(i64) -> f64)> = runnable
        .into_iter()
        .filter_map(|id| {
            let f =
                unsafe { loaded.get::<unsafe extern "C" fn(i64) -> f64>(symbol(&id).as_bytes()) };
            f.ok().map(|f| (id, *f))
        })
        .collect();
    // Calibrate each to about PEAK_RUN_S a run.
    let iters: Vec<i64> = kernels
        .iter()
        .map(|(_, f)| {
            let mut iters = 1_000i64;
            loop {
                let t = Instant::now();
                unsafe { f(iters) };
                let s = t.elapsed().as_secs_f64();
                if s > PEAK_RUN_S || iters > 1 << 36 {
                    break iters;
                }
                iters *= 2;
            }
        })
        .collect();
    // Then runs in turns, each instruction until its best settles: a noisy stretch of the
    // machine (another guest on the host) then slows one run of each, not every run of one.
    let mut best: Vec<BestOf> = vec![BestOf::default(); kernels.len()];
    while best.iter().any(|b| !b.settled()) {
        for ((_, f), (n, b)) in kernels.iter().zip(iters.iter().zip(best.iter_mut())) {
            if b.settled() {
                continue;
            }
            let t = Instant::now();
            let ops = unsafe { f(*n) };
            b.add(ops / t.elapsed().as_secs_f64() / 1e9);
        }
    }
    for ((id, _), b) in kernels.into_iter().zip(best) {
        peaks.push(Peak {
            intrinsic: id,
            threads,
            gops: b.best,
        });
    }
    // Never unload: the object pulled in libgomp, whose idle pool threads would be left
    // running in unmapped code.
    std::mem::forget(loaded);
    Ok(Peaks {
        measured: peaks,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every peak kernel's loop, compiled as `measure_peaks` compiles it (gcc -O3, OpenMP,
    /// the instruction's -m flags; any x86 host: nothing runs), holds its instruction as
    /// many times as the rate counts, or a multiple of that where gcc unrolls: no chain was
    /// dropped as dead code (one of the AVX2 FMA's twelve was, and the peak read 9% high).
    #[test]
    fn every_peak_kernel_runs_every_instruction_it_counts() {
        let Ok(cc) = Compiler::new(std::env::temp_dir().join("tessel-peak-asm-test")) else {
            eprintln!("no C compiler: skipped");
            return;
        };
        let catalog = Catalog::default();
        let dir = std::env::temp_dir().join(format!("tessel-peak-asm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut checked = 0;
        for intr in &catalog.intrinsics {
            let Some((b, ops, per_iter)) = body(intr.id) else {
                continue;
            };
            let tessel_intrin::Requirement::CpuFeatures(features) = &intr.requires else {
                continue;
            };
            let src = module_prelude() + &kernel_source(intr.id, b, ops);
            let c = dir.join(format!("{}.c", symbol(intr.id)));
            let s = c.with_extension("s");
            std::fs::write(&c, src).unwrap();
            let mut cmd = std::process::Command::new(cc.cc());
            cmd.args(["-O3", "-S", "-fopenmp", "-march=x86-64-v3"]);
            cmd.args(
                features
                    .iter()
                    .filter_map(|f| crate::compile::feature_flag(f)),
            );
            let out = cmd.arg(&c).arg("-o").arg(&s).output().unwrap();
            if !out.status.success() {
                // An old gcc without this instruction's -m flag cannot say; others still do.
                eprintln!("{}: {}", intr.id, String::from_utf8_lossy(&out.stderr));
                continue;
            }
            let asm = std::fs::read_to_string(&s).unwrap();
            let mnemonic = intr.id.split('.').nth(1).unwrap();
            let found = asm
                .lines()
                .filter(|l| l.split_whitespace().any(|w| w == mnemonic))
                .count();
            assert!(
                found >= per_iter && found % per_iter == 0,
                "{}: the compiled loop holds {found} {mnemonic}, the rate counts {per_iter} an iteration",
                intr.id
            );
            checked += 1;
        }
        std::fs::remove_dir_all(&dir).ok();
        assert!(checked >= 3, "only {checked} peak kernels compiled");
    }

    fn best_of(rates: &[f64]) -> BestOf {
        let mut b = BestOf::default();
        for &r in rates {
            if b.settled() {
                break;
            }
            b.add(r);
        }
        b
    }

    #[test]
    fn a_peak_keeps_sampling_through_a_slow_stretch() {
        // Six runs slowed by a busy host, then the real rate: the real rate is found.
        let mut rates = vec![75.0; 6];
        rates.extend([124.0, 123.5, 123.9, 124.1, 123.0, 122.0, 124.0]);
        let b = best_of(&rates);
        assert_eq!(b.best, 124.1);
        // It settled five quiet runs after the real rate appeared (124.1 is no 0.5% gain).
        assert!(b.settled() && b.runs == 12, "{b:?}");
        // A steady machine settles after the minimum.
        let steady = best_of(&[100.0; 20]);
        assert_eq!((steady.best, steady.runs), (100.0, PEAK_MIN_RUNS));
        // A rate that keeps climbing stops at the cap.
        let climbing: Vec<f64> = (0..100).map(|i| 100.0 * 1.01f64.powi(i)).collect();
        assert_eq!(best_of(&climbing).runs, PEAK_MAX_RUNS);
    }
}
