//! Running the CLI from tests: success with its stdout, or failure with its stderr.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub const XTASK: &str = env!("CARGO_BIN_EXE_xtask");

/// A new, empty directory under the target's test directory.
pub fn fresh_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs xtask in `dir`, expecting success; returns stdout.
pub fn run(args: &[&str], dir: &Path) -> String {
    let out = Command::new(XTASK)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "xtask {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs xtask in `dir`, expecting a refusal (non-zero exit, no panic); returns stderr.
pub fn fails(args: &[&str], dir: &Path) -> String {
    let out = Command::new(XTASK)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "xtask {} succeeded: {err}",
        args.join(" ")
    );
    assert!(!err.contains("panicked"), "xtask {}: {err}", args.join(" "));
    err
}
