//! Bad input from the command line: each is refused with a message naming the problem and a
//! non-zero exit, never a panic, and no data is lost or overwritten.

use std::process::Command;

mod common;

use common::{XTASK, fails as refused, fresh_dir, run as ok};

const SCALAR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../fixtures/datasets/cpu-scalar.jsonl.gz"
);

#[test]
fn overflowing_and_oversized_specs_are_refused_with_the_limit() {
    let dir = fresh_dir("hard-specs");
    for (args, needle) in [
        (
            vec![
                "measure",
                "--workload",
                "conv2d:n=1,h=8,w=8,c=8,k=8,r=3,s=3,pad=18446744073709551615,dtype=f32",
            ],
            "`pad` is too large",
        ),
        (
            vec![
                "match",
                "--workload",
                "gemm:m=4000000000,n=4000000000,k=4000000000,dtype=f32",
                "--intrinsic",
                "avx2.vfmadd231ps",
            ],
            "too large",
        ),
        (
            vec![
                "measure",
                "--workload",
                "gemm:m=1000000000,n=1,k=1,dtype=f32",
            ],
            "bytes",
        ),
        (
            vec![
                "workloads",
                "--network",
                "resnet50",
                "--batch",
                "18446744073709551615",
            ],
            "batch size 18446744073709551615 is too large",
        ),
        (
            vec!["tune", "--workload", "gemm:m=+64,n=8,k=8,dtype=f32"],
            "+64",
        ),
        (
            vec!["tune", "--workload", "gemm:m=64,n=8,k=8,dtype=f32,"],
            "trailing comma",
        ),
    ] {
        let e = refused(&args, &dir);
        assert!(e.contains(needle), "{args:?}: {e}");
    }
}

#[test]
fn out_of_range_options_are_refused_before_any_work() {
    let dir = fresh_dir("hard-options");
    let w = "gemm:m=8,n=8,k=8,dtype=f32";
    for (args, needle) in [
        (vec!["tune", "--workload", w, "--threads", "0"], "threads"),
        (vec!["tune", "--workload", w, "--epsilon", "5"], "epsilon"),
        (
            vec![
                "dataset",
                "--workload",
                w,
                "--out",
                "d.jsonl",
                "--search-share",
                "1.5",
            ],
            "search-share 1.5",
        ),
        (
            vec!["tune", "--workload", w, "--population", "0"],
            "population",
        ),
        (
            vec!["tune", "--workload", w, "--measure-batch", "0"],
            "measure-batch",
        ),
        (
            vec!["tune", "--workload", w, "--population", "1000000"],
            "population 1000000 is more than 65536",
        ),
        (
            vec!["tune", "--workload", w, "--crossover", "1.5"],
            "crossover 1.5 is not a share",
        ),
        (
            vec!["tune", "--workload", w, "--generations", "65"],
            "generations 65 is more than 64",
        ),
        (
            vec![
                "search-eval",
                "--workload",
                w,
                "--out",
                "se",
                "--threshold",
                "2",
            ],
            "--threshold 2",
        ),
        (
            vec!["search-eval", "--out", "se", "--tasks", "3"],
            "give --network",
        ),
        (
            vec!["tune", "--workload", w, "--instructions", "avx9"],
            "`avx9` is not a CPU instruction",
        ),
        (
            vec!["tune", "--workload", w, "--wdtype", "i8"],
            "--wdtype sets a network's weight type",
        ),
        (
            vec![
                "tune",
                "--workload",
                w,
                "--target",
                "sim:a100",
                "--instructions",
                "avx2",
            ],
            "--instructions selects CPU instructions",
        ),
        (
            vec!["measure", "--workload", w, "--threads", "0"],
            "threads",
        ),
        (
            vec!["pretrain", "--data", SCALAR, "--out", "m", "--lr", "NaN"],
            "lr NaN",
        ),
        (
            vec!["pretrain", "--data", SCALAR, "--out", "m", "--lr=-1"],
            "lr -1",
        ),
        (
            vec![
                "pretrain",
                "--data",
                SCALAR,
                "--out",
                "m",
                "--val-fraction",
                "1.5",
            ],
            "val-fraction",
        ),
        (
            vec!["pretrain", "--data", SCALAR, "--out", "m", "--epochs", "0"],
            "epochs",
        ),
        (
            vec![
                "dataset",
                "--workload",
                w,
                "--max-tasks",
                "0",
                "--out",
                "d.jsonl",
            ],
            "max-tasks",
        ),
    ] {
        let e = refused(&args, &dir);
        assert!(e.contains(needle), "{args:?}: {e}");
    }
    assert!(!dir.join("m.safetensors").exists() && !dir.join("d.jsonl").exists());
}

#[test]
fn files_that_are_missing_or_not_regular_are_named() {
    let dir = fresh_dir("hard-files");
    let w = "gemm:m=8,n=8,k=8,dtype=f32";
    let e = refused(&["tune", "--workload", w, "--log", "/dev/full"], &dir);
    assert!(
        e.contains("/dev/full") && e.contains("not a regular file"),
        "{e}"
    );
    // One message, not the cause repeated after itself.
    assert_eq!(e.matches("not a regular file").count(), 1, "{e}");
    for args in [
        vec!["best", "--log", "nope.jsonl"],
        vec!["features", "--log", "nope.jsonl"],
        vec!["sim-check", "--data", "nope.jsonl", "--device", "h200"],
        vec!["pretrain", "--data", "nope.jsonl", "--out", "m"],
        vec!["export", "--log", "nope.jsonl", "--out", "k"],
        vec!["coverage", "--data", "nope.jsonl"],
    ] {
        let e = refused(&args, &dir);
        assert!(
            e.contains("nope.jsonl") && e.contains("no such"),
            "{args:?}: {e}"
        );
    }
    let e = refused(&["sim-check", "--data", SCALAR, "--device", "h200"], &dir);
    assert!(e.contains("cpu machine"), "{e}");
    let e = refused(&["merge", "--out", "all.jsonl.gz", SCALAR], &dir);
    assert!(e.contains("gzip") && !e.contains("append"), "{e}");
    let e = refused(
        &[
            "pretrain",
            "--data",
            SCALAR,
            "--network",
            "vit-b16",
            "--out",
            "m",
        ],
        &dir,
    );
    assert!(e.contains("network filter removed every record"), "{e}");
    let e = refused(
        &["coverage", "--data", SCALAR, "--network", "vit-b16"],
        &dir,
    );
    assert!(e.contains("no record of the --network tasks"), "{e}");
}

#[test]
fn models_keep_their_name_and_are_never_overwritten_unasked() {
    let dir = fresh_dir("hard-models");
    let args = [
        "pretrain",
        "--data",
        SCALAR,
        "--out",
        "tiny.v2",
        "--epochs",
        "1",
        "--d-model",
        "8",
        "--heads",
        "1",
        "--layers",
        "2",
    ];
    ok(&args, &dir);
    assert!(dir.join("tiny.v2.safetensors").exists() && dir.join("tiny.v2.json").exists());
    let before = std::fs::read(dir.join("tiny.v2.safetensors")).unwrap();
    let e = refused(&args, &dir);
    assert!(e.contains("--force"), "{e}");
    assert_eq!(
        std::fs::read(dir.join("tiny.v2.safetensors")).unwrap(),
        before
    );
    let mut forced = args.to_vec();
    forced.push("--force");
    ok(&forced, &dir);
    // A description that does not match the weights is refused, naming the tensor: one
    // layer fewer than the weights hold, or another width.
    let json = std::fs::read_to_string(dir.join("tiny.v2.json")).unwrap();
    let mut info: serde_json::Value = serde_json::from_str(&json).unwrap();
    info["config"]["layers"] = 1.into();
    std::fs::write(dir.join("tiny.v2.json"), info.to_string()).unwrap();
    let e = refused(&["eval", "--model", "tiny.v2", "--data", SCALAR], &dir);
    assert!(
        e.contains("not part of the architecture") && e.contains("tiny.v2.json"),
        "{e}"
    );
    info["config"]["layers"] = 2.into();
    info["config"]["d_model"] = 16.into();
    std::fs::write(dir.join("tiny.v2.json"), info.to_string()).unwrap();
    let e = refused(&["eval", "--model", "tiny.v2", "--data", SCALAR], &dir);
    assert!(
        e.contains("embed.0.weight") && e.contains(&format!("[16, {}]", tessel::features::WIDTH)),
        "{e}"
    );
    // A normalizer with a zero std is refused.
    info["config"]["d_model"] = 8.into();
    let w = info["normalizer"]["std"].as_array().unwrap().len();
    info["normalizer"]["std"] = serde_json::Value::from(vec![0.0; w]);
    std::fs::write(dir.join("tiny.v2.json"), info.to_string()).unwrap();
    let e = refused(&["eval", "--model", "tiny.v2", "--data", SCALAR], &dir);
    assert!(e.contains("std"), "{e}");
    // Transfer says how many records there are when asked for more.
    std::fs::write(dir.join("tiny.v2.json"), &json).unwrap();
    let e = refused(
        &[
            "transfer", "--model", "tiny.v2", "--data", SCALAR, "--shots", "100000", "--out", "t",
        ],
        &dir,
    );
    assert!(e.contains("100000") && e.contains("records"), "{e}");
    // A correction recipe that cannot rank, or does not parse, is refused by name.
    for (recipe, says) in [
        ("objective=regression", "objective=regression"),
        ("ndcg_at=five", "ndcg_at=`five`"),
    ] {
        let e = refused(
            &[
                "transfer",
                "--model",
                "tiny.v2",
                "--data",
                SCALAR,
                "--shots",
                "8",
                "--correction-trees",
                recipe,
                "--out",
                "t",
            ],
            &dir,
        );
        assert!(e.contains("--correction-trees") && e.contains(says), "{e}");
    }
}

#[test]
fn torn_and_corrupt_lines_are_handled_alike_and_say_how_to_repair() {
    let dir = fresh_dir("hard-torn");
    let w = "gemm:m=16,n=16,k=16,dtype=f32";
    ok(
        &[
            "dataset",
            "--workload",
            w,
            "--platform",
            "avx2-fma",
            "--per-task",
            "6",
            "--out",
            "d.jsonl",
        ],
        &dir,
    );
    let text = std::fs::read_to_string(dir.join("d.jsonl")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // A torn last line (a killed writer): skipped with a note by every reader.
    let torn = format!("{}\n{}", lines.join("\n"), &lines[0][..40]);
    std::fs::write(dir.join("torn.jsonl"), &torn).unwrap();
    let out = Command::new(XTASK)
        .args(["merge", "--out", "m.jsonl", "torn.jsonl"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("torn.jsonl:7") && err.contains("head -n 6"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("m.jsonl"))
            .unwrap()
            .lines()
            .count(),
        6
    );
    // A corrupt line inside: refused by the training readers, with the fix.
    let mid = format!("{}\nnot json\n{}\n", lines[0], lines[1..].join("\n"));
    std::fs::write(dir.join("mid.jsonl"), mid).unwrap();
    let e = refused(&["merge", "--out", "m2.jsonl", "mid.jsonl"], &dir);
    assert!(
        e.contains("mid.jsonl:2") && e.contains("sed -i '2d'"),
        "{e}"
    );
    // A record that contradicts itself is corrupt, with its line.
    let forged = lines[0].replacen("\"gflops\":", "\"gflops\":1e30,\"x\":", 1);
    std::fs::write(
        dir.join("forged.jsonl"),
        format!("{forged}\n{}\n", lines[1]),
    )
    .unwrap();
    let e = refused(&["merge", "--out", "m3.jsonl", "forged.jsonl"], &dir);
    assert!(e.contains("forged.jsonl:1") && e.contains("GFLOP/s"), "{e}");
    // What `best --emit trace` prints, `measure --trace` and `features --trace` read.
    let trace = ok(&["best", "--log", "d.jsonl", "--emit", "trace"], &dir);
    std::fs::write(dir.join("t.json"), trace).unwrap();
    ok(&["features", "--workload", w, "--trace", "t.json"], &dir);
    ok(&["measure", "--workload", w, "--trace", "t.json"], &dir);
}

#[test]
fn target_names_ignore_case_and_messages_escape_control_characters() {
    let dir = fresh_dir("hard-names");
    let text = ok(
        &[
            "tune",
            "--target",
            "CPU",
            "--workload",
            "gemm:m=8,n=8,k=8,dtype=f32",
            "--trials",
            "1",
            "--model",
            "none",
            "--json",
        ],
        &dir,
    );
    assert!(
        text.lines().last().unwrap().contains("\"target\":\"cpu\""),
        "{text}"
    );
    let e = refused(
        &[
            "tune",
            "--target",
            "tpu\u{1b}[31m",
            "--workload",
            "gemm:m=8,n=8,k=8,dtype=f32",
        ],
        &dir,
    );
    assert!(!e.contains('\u{1b}') && e.contains("tpu"), "{e:?}");
}

/// (pid, parent pid, process group) of every process, from /proc.
fn processes() -> Vec<(i32, i32, i32)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if let (Ok(pid), Some(Ok(ppid)), Some(Ok(pgrp))) = (
            head.split(' ').next().unwrap_or("").parse::<i32>(),
            f.get(1).map(|s| s.parse::<i32>()),
            f.get(2).map(|s| s.parse::<i32>()),
        ) {
            out.push((pid, ppid, pgrp));
        }
    }
    out
}

#[test]
fn the_compiler_dies_with_a_killed_tuner() {
    let dir = fresh_dir("hard-kill");
    // A compiler that takes its time (as gcc does on a large generated kernel).
    let cc = dir.join("slow-cc");
    std::fs::write(
        &cc,
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo slow-cc 1.0; exit 0; fi\nsleep 60\nexit 1\n",
    )
    .unwrap();
    let mut perms = std::fs::metadata(&cc).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&cc, perms).unwrap();
    let mut tune = Command::new(XTASK)
        .args([
            "tune",
            "--workload",
            "gemm:m=256,n=256,k=256,dtype=f32",
            "--trials",
            "64",
            "--model",
            "none",
        ])
        .env("TESSEL_CACHE_DIR", dir.join("cache"))
        .env("TESSEL_CC", &cc)
        .current_dir(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = tune.id() as i32;
    // Wait for a compiler group (its own process group, started by the tuner).
    let start = std::time::Instant::now();
    let group = loop {
        if let Some(&(child, _, _)) = processes()
            .iter()
            .find(|&&(p, ppid, pgrp)| ppid == pid && pgrp == p)
        {
            break child;
        }
        assert!(start.elapsed().as_secs() < 60, "no compiler started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    tune.kill().unwrap();
    tune.wait().unwrap();
    let start = std::time::Instant::now();
    while processes().iter().any(|&(_, _, pgrp)| pgrp == group) {
        assert!(
            start.elapsed().as_secs() < 5,
            "the compiler's process group outlived the killed tuner"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_tessel_march_that_is_not_a_cpu_name_is_refused() {
    let dir = fresh_dir("hard-march");
    for bad in ["-O0", "znver3 -fplugin=x", "native;rm"] {
        let out = Command::new(XTASK)
            .args(["measure", "--workload", "gemm:m=8,n=8,k=8,dtype=f32"])
            .env("TESSEL_MARCH", bad)
            .current_dir(&dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "TESSEL_MARCH={bad}: {err}");
        assert!(
            err.contains("TESSEL_MARCH") && err.contains("-march") && !err.contains("panicked"),
            "{err}"
        );
    }
}
