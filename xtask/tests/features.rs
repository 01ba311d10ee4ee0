//! `cargo xtask features`: the named columns of a candidate, and clear errors.

use std::process::Command;

const XTASK: &str = env!("CARGO_BIN_EXE_xtask");

#[test]
fn features_of_a_trace_name_every_column() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("features-trace");
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace.json");
    std::fs::write(
        &trace,
        r#"{"steps":[{"split":{"target":"m","factors":[8]}},{"split":{"target":"n","factors":[8]}},
            {"reorder":{"order":["m.0","n.0","k","m.1","n.1"]}},{"vectorize":{"target":"n.1"}}]}"#,
    )
    .unwrap();
    let out = Command::new(XTASK)
        .args([
            "features",
            "--workload",
            "gemm:m=64,n=64,k=64,dtype=f32",
            "--json",
        ])
        .arg("--trace")
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["schema_version"], tessel_features::SCHEMA_VERSION);
    let columns = report["columns"].as_array().unwrap();
    let tokens = report["tokens"].as_array().unwrap();
    assert!(tokens.len() > 5);
    for t in tokens {
        assert_eq!(t["values"].as_array().unwrap().len(), columns.len());
    }
    assert!(tokens.iter().any(|t| t["buffer"] == "A"));

    let text = Command::new(XTASK)
        .args(["features", "--workload", "gemm:m=64,n=64,k=64,dtype=f32"])
        .arg("--trace")
        .arg(&trace)
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("compute.vectorized"), "{text}");
    assert!(text.contains("data.bytes_in"), "{text}");
}

#[test]
fn features_without_a_candidate_or_of_a_missing_log_fail_clearly() {
    let out = Command::new(XTASK).args(["features"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--trace FILE"));
    let out = Command::new(XTASK)
        .args(["features", "--log", "/nonexistent/log.jsonl"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/log.jsonl"));
}
