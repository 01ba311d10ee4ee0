//! `cargo xtask tune` end to end: a kill -9 in the middle, a rerun that resumes without
//! re-measuring, `best` on the log, and clear errors for bad input.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const XTASK: &str = env!("CARGO_BIN_EXE_xtask");

fn lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().filter(|l| l.ends_with('}')).count())
        .unwrap_or(0)
}

#[test]
fn a_killed_tuning_run_resumes_from_its_log() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("tune-kill");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("log.jsonl");
    let args = |trials: &str| {
        vec![
            "tune".to_string(),
            "--workload".into(),
            "gemm:m=32,n=48,k=64,dtype=f32".into(),
            "--trials".into(),
            trials.into(),
            "--measure-batch".into(),
            "4".into(),
            "--population".into(),
            "16".into(),
            "--log".into(),
            log.display().to_string(),
        ]
    };
    let mut child = Command::new(XTASK)
        .args(args("400"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while lines(&log) < 8 && start.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let before = lines(&log);
    assert!(before >= 8, "the first run logged {before} records");

    let out = Command::new(XTASK)
        .args(args(&(before + 8).to_string()))
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(report["resumed_from_log"], before);
    assert_eq!(report["measured_this_run"], 8);
    assert_eq!(report["trials"], before + 8);
    for key in [
        "workload",
        "target",
        "latency_ms",
        "gflops",
        "percent_of_peak",
        "search_time_s",
    ] {
        assert!(report.get(key).is_some(), "missing {key}: {report}");
    }
    assert!(report["gflops"].as_f64().unwrap() > 0.0);

    // Every candidate the search logged is distinct: nothing was measured twice. The
    // finalists timed again after the search follow, as `remeasure` records of schedules
    // already in the log.
    let text = std::fs::read_to_string(&log).unwrap();
    let records: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .collect();
    let remeasure = |v: &serde_json::Value| v["sampler"] == "remeasure";
    let traces: Vec<String> = records
        .iter()
        .filter(|v| !remeasure(v))
        .map(|v| v["trace"].to_string())
        .collect();
    let distinct: std::collections::HashSet<&String> = traces.iter().collect();
    assert_eq!(traces.len(), before + 8);
    assert_eq!(distinct.len(), traces.len());
    let finalists = report["tasks"][0]["finalists"].as_u64().unwrap() as usize;
    let again: Vec<&serde_json::Value> = records.iter().filter(|v| remeasure(v)).collect();
    assert!(
        finalists >= 1 && again.len() == finalists,
        "{finalists} finalists"
    );
    assert!(
        again
            .iter()
            .all(|v| distinct.contains(&v["trace"].to_string()))
    );

    let best = Command::new(XTASK)
        .args(["best", "--log"])
        .arg(&log)
        .args(["--emit", "c"])
        .output()
        .unwrap();
    assert!(
        best.status.success(),
        "{}",
        String::from_utf8_lossy(&best.stderr)
    );
    assert!(String::from_utf8_lossy(&best.stdout).contains("void kernel(void *const *args)"));
}

#[test]
fn bad_input_is_a_clear_error() {
    let run = |args: &[&str]| {
        let out = Command::new(XTASK).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        err
    };
    assert!(
        run(&[
            "tune",
            "--workload",
            "gemm:m=0,n=4,k=4,dtype=f32",
            "--trials",
            "4"
        ])
        .contains("m")
    );
    assert!(
        run(&[
            "tune",
            "--workload",
            "gemm:m=4,n=4,k=4,dtype=f32",
            "--target",
            "cuda"
        ])
        .contains("cuda")
    );
    assert!(
        run(&[
            "tune",
            "--workload",
            "gemm:m=4,n=4,k=4,dtype=f32",
            "--model",
            "m.safetensors"
        ])
        .contains("m.safetensors")
    );
    assert!(run(&["best", "--log", "/nonexistent/log.jsonl"]).contains("no such tuning log"));
}

#[test]
fn tune_ranks_with_a_model_file() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("tune-model");
    let _ = std::fs::remove_dir_all(&dir);
    let mut config = tessel_model::ModelConfig::new(tessel_features::WIDTH);
    config.d_model = 16;
    config.heads = 2;
    config.d_ff = 32;
    let path = dir.join("model.safetensors");
    tessel_model::Model::new(config, 1)
        .unwrap()
        .save(&path)
        .unwrap();
    let out = Command::new(XTASK)
        .args([
            "tune",
            "--workload",
            "gemm:m=32,n=32,k=32,dtype=f32",
            "--trials",
            "8",
            "--measure-batch",
            "4",
            "--population",
            "16",
            "--json",
            "--model",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last = stdout.lines().last().unwrap();
    let report: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(report["trials"], 8);
    assert!(
        report["model"]
            .as_str()
            .unwrap()
            .contains("model.safetensors")
    );
}
