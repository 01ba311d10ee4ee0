//! tune -> export -> call: a few small workloads tuned, exported as a C library and a Rust
//! crate, and called from a C program (linked statically and dynamically) and from the crate's
//! own test, against naive references.

use std::path::{Path, PathBuf};
use std::process::Command;

use tessel::{ExportOptions, ModelChoice, NoProgress, TuneOptions};

fn worker() -> Option<PathBuf> {
    Some(env!("CARGO_BIN_EXE_tessel-worker").into())
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const GEMM_F32: &str = "gemm:m=48,n=40,k=64,dtype=f32";
const GEMM_INT8: &str = "gemm:m=32,n=64,k=128,dtype=u8,wdtype=i8";
const DENSE: &str = "dense:m=16,n=48,k=64,dtype=f32,epilogue=bias+relu";

fn tune_into(log: &Path, spec: &str) {
    let opts = TuneOptions {
        trials: 8,
        measure_batch: 4,
        population: 16,
        model: ModelChoice::Random,
        log: Some(log.to_path_buf()),
        worker_exe: worker(),
        ..TuneOptions::workload(spec.parse().unwrap())
    };
    let report = tessel::tune(&opts, &mut NoProgress).unwrap();
    report.check_found().unwrap();
}

/// A C program with its own naive loops: every kernel, and every pre-packed variant the
/// header declares, on random inputs.
const MAIN_C: &str = r#"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tessel_kernels.h"

static unsigned long long state = 88172645463325252ull;
static unsigned long long next(void) {
    state ^= state << 13; state ^= state >> 7; state ^= state << 17;
    return state;
}
static float small(void) { return (float)(next() % 25) / 4.0f - 3.0f; }
static int failures = 0, prepacked = 0;

static void check_f32(const char *what, const float *got, const float *want, int n) {
    for (int i = 0; i < n; ++i) {
        double g = got[i], w = want[i];
        double e = fabs(g - w) / fmax(fmax(fabs(g), fabs(w)), 1.0);
        if (!(e <= 1e-3)) {
            printf("%s: element %d is %g, want %g\n", what, i, g, w);
            failures++;
            return;
        }
    }
}

static void check_i32(const char *what, const int32_t *got, const int32_t *want, int n) {
    for (int i = 0; i < n; ++i) {
        if (got[i] != want[i]) {
            printf("%s: element %d is %d, want %d\n", what, i, got[i], want[i]);
            failures++;
            return;
        }
    }
}

static void gemm_f32(void) {
    enum { M = 48, N = 40, K = 64 };
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N);
    float *c = malloc(sizeof(float) * M * N), *want = malloc(sizeof(float) * M * N);
    for (int i = 0; i < M * K; ++i) a[i] = small();
    for (int i = 0; i < K * N; ++i) b[i] = small();
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            float acc = 0;
            for (int k = 0; k < K; ++k) acc += a[m * K + k] * b[k * N + n];
            want[m * N + n] = acc;
        }
    tsl_gemm_m48_n40_k64_f32(a, b, c);
    check_f32("gemm f32", c, want, M * N);
#ifdef TSL_GEMM_M48_N40_K64_F32_B_PACKED_ELEMS
    float *bp = malloc(sizeof(float) * TSL_GEMM_M48_N40_K64_F32_B_PACKED_ELEMS);
    tsl_gemm_m48_n40_k64_f32_pack_b(b, bp);
    memset(c, 0, sizeof(float) * M * N);
    tsl_gemm_m48_n40_k64_f32_prepacked(a, bp, c);
    check_f32("gemm f32 pre-packed", c, want, M * N);
    prepacked++;
    free(bp);
#endif
    free(a); free(b); free(c); free(want);
}

static void gemm_int8(void) {
    enum { M = 32, N = 64, K = 128 };
    uint8_t *a = malloc(M * K);
    int8_t *b = malloc(K * N);
    int32_t *c = malloc(sizeof(int32_t) * M * N), *want = malloc(sizeof(int32_t) * M * N);
    for (int i = 0; i < M * K; ++i) a[i] = (uint8_t)next();
    for (int i = 0; i < K * N; ++i) b[i] = (int8_t)next();
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            int32_t acc = 0;
            for (int k = 0; k < K; ++k) acc += (int32_t)a[m * K + k] * b[k * N + n];
            want[m * N + n] = acc;
        }
    tsl_gemm_m32_n64_k128_u8_i8(a, b, c);
    check_i32("gemm u8 x i8", c, want, M * N);
#ifdef TSL_GEMM_M32_N64_K128_U8_I8_B_PACKED_ELEMS
    /* The packed weights: built once, used twice. */
    void *bp = malloc(4 * TSL_GEMM_M32_N64_K128_U8_I8_B_PACKED_ELEMS);
    tsl_gemm_m32_n64_k128_u8_i8_pack_b(b, bp);
    for (int round = 0; round < 2; ++round) {
        memset(c, 0, sizeof(int32_t) * M * N);
        tsl_gemm_m32_n64_k128_u8_i8_prepacked(a, bp, c);
        check_i32("gemm u8 x i8 pre-packed", c, want, M * N);
    }
    prepacked++;
    free(bp);
#endif
    free(a); free(b); free(c); free(want);
}

static void dense_bias_relu(void) {
    enum { M = 16, N = 48, K = 64 };
    float *a = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * N * K);
    float *bias = malloc(sizeof(float) * N);
    float *c = malloc(sizeof(float) * M * N), *want = malloc(sizeof(float) * M * N);
    for (int i = 0; i < M * K; ++i) a[i] = small();
    for (int i = 0; i < N * K; ++i) w[i] = small();
    for (int i = 0; i < N; ++i) bias[i] = small();
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            float acc = 0;
            for (int k = 0; k < K; ++k) acc += a[m * K + k] * w[n * K + k];
            acc += bias[n];
            want[m * N + n] = acc > 0 ? acc : 0;
        }
    tsl_dense_m16_n48_k64_f32_bias_relu(a, w, bias, c);
    check_f32("dense bias relu", c, want, M * N);
    free(a); free(w); free(bias); free(c); free(want);
}

int main(void) {
    if (!tessel_kernels_supported()) {
        printf("unsupported: %s\n", tessel_kernels_missing());
        return 2;
    }
    tessel_kernels_set_threads(2);
    gemm_f32();
    gemm_int8();
    dense_bias_relu();
    printf("checked 3 kernels, %d pre-packed, %d failures\n", prepacked, failures);
    return failures != 0;
}
"#;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

#[test]
fn tuned_kernels_export_to_c_and_rust_and_match_naive_references() {
    let dir = fresh_dir("export");
    let log = dir.join("tune.jsonl");
    for spec in [GEMM_F32, GEMM_INT8, DENSE] {
        tune_into(&log, spec);
    }
    let out = dir.join("kernels");
    let report = tessel::export(&ExportOptions::new(&log, &out), &mut NoProgress).unwrap();
    assert_eq!(report.kernels.len(), 3);
    assert_eq!(report.other_machine, 0);
    let int8 = report
        .kernels
        .iter()
        .find(|k| k.workload == GEMM_INT8)
        .unwrap();
    assert_eq!(int8.symbol, "tsl_gemm_m32_n64_k128_u8_i8");
    // Converting i8 weights for the instruction happens in a root pack: it can be done once.
    assert_eq!(
        int8.prepacked_symbol.as_deref(),
        Some("tsl_gemm_m32_n64_k128_u8_i8_prepacked")
    );
    for f in [
        "tessel_kernels.h",
        "libtessel_kernels.a",
        "libtessel_kernels.so",
        "manifest.json",
        "rust/Cargo.toml",
        "rust/native/libtessel_kernels.a",
    ] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["kernels"].as_array().unwrap().len(), 3);
    let k0 = &manifest["kernels"][0];
    assert!(k0["latency_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(k0["fingerprint"]["kind"], "cpu");
    assert!(k0["trace"].is_array() || k0["trace"].is_object());
    assert_eq!(manifest["openmp"], true);

    // C, against the static and the shared library.
    std::fs::write(dir.join("main.c"), MAIN_C).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let inc = format!("-I{}", out.display());
    run(Command::new(&cc).current_dir(&dir).args([
        "-O2",
        "main.c",
        &inc,
        out.join("libtessel_kernels.a").to_str().unwrap(),
        "-fopenmp",
        "-lm",
        "-o",
        "main_static",
    ]));
    run(Command::new(&cc).current_dir(&dir).args([
        "-O2",
        "main.c",
        &inc,
        &format!("-L{}", out.display()),
        "-ltessel_kernels",
        "-fopenmp",
        "-lm",
        "-o",
        "main_shared",
    ]));
    let s = run(&mut Command::new(dir.join("main_static")));
    assert!(
        s.contains("checked 3 kernels") && s.contains("0 failures"),
        "{s}"
    );
    assert!(!s.contains(", 0 pre-packed"), "{s}");
    let d = run(Command::new(dir.join("main_shared")).env("LD_LIBRARY_PATH", &out));
    assert!(d.contains("0 failures"), "{d}");

    // Rust: the generated crate builds and its test passes.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let t = run(Command::new(cargo)
        .args(["test", "--offline", "--quiet", "--manifest-path"])
        .arg(out.join("rust/Cargo.toml"))
        .env("CARGO_TARGET_DIR", dir.join("crate-target"))
        .env_remove("RUSTFLAGS"));
    assert!(t.contains("3 passed"), "{t}");

    // A second export into the same directory replaces the first.
    let again = tessel::export(&ExportOptions::new(&log, &out), &mut NoProgress).unwrap();
    assert_eq!(again.kernels.len(), 3);
}

#[test]
fn export_refuses_what_it_cannot_honour() {
    let dir = fresh_dir("export-errors");
    let log = dir.join("tune.jsonl");
    tune_into(&log, "gemm:m=16,n=16,k=16,dtype=f32");
    let err = |o: &ExportOptions| tessel::export(o, &mut NoProgress).unwrap_err().to_string();

    // A workload the log has no record of.
    let o = ExportOptions {
        workloads: vec!["gemm:m=8,n=8,k=8,dtype=f32".parse().unwrap()],
        ..ExportOptions::new(&log, dir.join("a"))
    };
    let e = err(&o);
    assert!(
        e.contains("gemm:m=8,n=8,k=8,dtype=f32") && e.contains("tune them"),
        "{e}"
    );
    // A network none of whose tasks were tuned.
    let o = ExportOptions {
        network: Some("bert-base-128".into()),
        ..ExportOptions::new(&log, dir.join("a"))
    };
    assert!(err(&o).contains("no successful CPU record"));
    // A directory of someone else's files.
    let busy = dir.join("busy");
    std::fs::create_dir_all(&busy).unwrap();
    std::fs::write(busy.join("notes.txt"), "mine").unwrap();
    let e = err(&ExportOptions::new(&log, &busy));
    assert!(e.contains("holds other files"), "{e}");
    assert_eq!(
        std::fs::read_to_string(busy.join("notes.txt")).unwrap(),
        "mine"
    );
    // A bad crate name.
    let o = ExportOptions {
        crate_name: "Bad Name".into(),
        ..ExportOptions::new(&log, dir.join("b"))
    };
    assert!(err(&o).contains("crate name"));
    // No such log.
    assert!(err(&ExportOptions::new(dir.join("none.jsonl"), dir.join("c"))).contains("no such"));

    // Records of another machine: refused, unless asked.
    let text = std::fs::read_to_string(&log).unwrap();
    let moved: String = text
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["fingerprint"]["model"] = "Some Other CPU".into();
            v.to_string() + "\n"
        })
        .collect();
    let other = dir.join("other.jsonl");
    std::fs::write(&other, moved).unwrap();
    let e = err(&ExportOptions::new(&other, dir.join("d")));
    assert!(
        e.contains("Some Other CPU") && e.contains("--allow-other-machine"),
        "{e}"
    );
    assert!(!dir.join("d").exists(), "nothing is written when refusing");
    let o = ExportOptions {
        allow_other_machine: true,
        ..ExportOptions::new(&other, dir.join("d"))
    };
    let r = tessel::export(&o, &mut NoProgress).unwrap();
    assert_eq!(r.other_machine, 1);
}
