//! The pipelines from the command line: errors that name the file, record or option at fault,
//! and the GPU-model pipeline end to end (the library's own tests assert on the reports).

use std::path::Path;

mod common;

use common::{fails, run};

#[test]
fn a_corrupt_dataset_is_an_error_naming_the_record() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pipeline-corrupt");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("bad.jsonl"), "{\"workload\": 3}\n").unwrap();
    let err = fails(&["pretrain", "--data", "bad.jsonl", "--out", "m"], &dir);
    assert!(err.contains("bad.jsonl:1"), "{err}");
    let err = fails(&["pretrain", "--data", "absent.jsonl", "--out", "m"], &dir);
    assert!(err.contains("absent.jsonl"), "{err}");
    let err = fails(
        &[
            "dataset",
            "--workload",
            "gemm:m=8,n=8,k=8,dtype=f32",
            "--platform",
            "tpu",
            "--out",
            "x.jsonl",
        ],
        &dir,
    );
    assert!(err.contains("unknown platform `tpu`"), "{err}");
    let err = fails(
        &[
            "dataset",
            "--workload",
            "gemm:m=8,n=8,k=8,dtype=f32",
            "--shard",
            "3/2",
            "--out",
            "x.jsonl",
        ],
        &dir,
    );
    assert!(err.contains("shard `3/2`"), "{err}");
}

#[test]
fn gpu_model_targets_run_the_whole_pipeline() {
    // The analytical GPU model stands in for a GPU: dataset on two devices, pretrain on one,
    // transfer to the other, tune; every record says `sim`.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pipeline-sim");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (target, out) in [("sim:a100", "a100.jsonl"), ("sim:l4", "l4.jsonl")] {
        let text = run(
            &[
                "dataset",
                "--target",
                target,
                "--network",
                "bert-base-128",
                "--per-task",
                "16",
                "--out",
                out,
            ],
            &dir,
        );
        assert!(text.contains("analytical model"), "{text}");
    }
    let a100 = std::fs::read_to_string(dir.join("a100.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(a100.lines().next().unwrap()).unwrap();
    assert_eq!(first["fingerprint"]["kind"], "sim");
    assert_eq!(first["target"], "sim:a100");
    let small = [
        "--d-model",
        "16",
        "--heads",
        "2",
        "--layers",
        "1",
        "--epochs",
        "2",
    ];
    let mut args = vec![
        "pretrain",
        "--data",
        "a100.jsonl",
        "--out",
        "m/a100",
        "--json",
    ];
    args.extend(small);
    let text = run(&args, &dir);
    let report: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    // The ensemble's mix of network and trees was chosen on the validation tasks.
    let share = report["ensemble_mix"]["tree_share"].as_f64();
    assert!(share.is_some_and(|s| (0.0..=1.0).contains(&s)), "{report}");

    // The trees fitted again beside the same network: replaced only when they lead the old
    // ones on the validation tasks beyond the noise (or `--force`).
    let refit = |extra: &[&str]| {
        let mut args = vec![
            "refit-trees",
            "--model",
            "m/a100",
            "--data",
            "a100.jsonl",
            "--json",
        ];
        args.extend(extra);
        let text = run(&args, &dir);
        serde_json::from_str::<serde_json::Value>(text.lines().last().unwrap()).unwrap()
    };
    let before = std::fs::read(dir.join("m/a100.safetensors")).unwrap();
    let report = refit(&[]);
    assert_eq!(
        report["mix"]["tried"].as_array().map(Vec::len),
        Some(11),
        "{report}"
    );
    // Judged on the tasks pretrain held out, which the model lists; one task says nothing
    // of the noise (its gain has no standard error), so the old trees stay.
    assert_eq!(report["validation_from"], "the model's own", "{report}");
    assert_eq!(report["gain"]["tasks"], 1, "{report}");
    assert_eq!(report["replaced"].as_bool(), Some(false), "{report}");
    assert_eq!(refit(&["--force"])["replaced"], true);
    // The network is untouched.
    assert_eq!(
        std::fs::read(dir.join("m/a100.safetensors")).unwrap(),
        before
    );
    let err = fails(
        &["refit-trees", "--model", "m/none", "--data", "a100.jsonl"],
        &dir,
    );
    assert!(err.contains("m/none.json"), "{err}");
    let err = fails(
        &[
            "refit-trees",
            "--model",
            "m/a100",
            "--data",
            "a100.jsonl",
            "--val-fraction",
            "0",
        ],
        &dir,
    );
    assert!(err.contains("val-fraction 0"), "{err}");
    let text = run(
        &[
            "transfer", "--model", "m/a100", "--data", "l4.jsonl", "--shots", "24", "--out",
            "m/l4", "--epochs", "1", "--json",
        ],
        &dir,
    );
    let report: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(report["shots"], 24);
    // Seven candidates: the pretrained and the fine-tuned network, each alone and with the
    // pretrained model's trees, the pretrained one with its trees corrected on the shots,
    // the fine-tuned one with trees fitted on the shots, and scratch. A companion file is written exactly when a kept candidate has trees.
    let validation = &report["validation"];
    for candidate in [
        "pretrained",
        "pretrained_trees",
        "pretrained_corrected",
        "fine_tuned",
        "fine_tuned_pretrained_trees",
        "fine_tuned_ensemble",
        "scratch",
    ] {
        let c = validation[candidate]["criterion"].as_f64();
        assert!(c.is_some_and(|c| (0.0..=1.0).contains(&c)), "{report}");
    }
    assert!(
        report["fine_tuned_ensemble"]["top1"].is_number(),
        "{report}"
    );
    assert!(report["before_ensemble"]["top1"].is_number(), "{report}");
    assert!(
        report["pretrained_corrected"]["top1"].is_number(),
        "{report}"
    );
    assert!(
        report["fine_tuned_pretrained_trees"]["top1"].is_number(),
        "{report}"
    );
    let kept_ensemble = [
        "fine-tuned+ensemble",
        "pretrained+trees",
        "pretrained+trees+correction",
        "fine-tuned+pretrained-trees",
    ]
    .contains(&report["chosen"].as_str().unwrap_or_default());
    assert_eq!(dir.join("m/l4.ensemble.json.gz").exists(), kept_ensemble);
    assert_eq!(report["saved_ensemble"].is_string(), kept_ensemble);
    let text = run(
        &[
            "tune",
            "--target",
            "sim:h100",
            "--workload",
            "gemm:m=1024,n=1024,k=1024,dtype=f16",
            "--trials",
            "48",
            "--model",
            "m/a100.safetensors",
            "--json",
        ],
        &dir,
    );
    let report: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(report["target"], "sim:h100");
    assert!(report["gflops"].as_f64().unwrap() > 1000.0, "{report}");
    let e = fails(
        &[
            "tune",
            "--target",
            "sim:b200",
            "--workload",
            "gemm:m=8,n=8,k=8",
        ],
        &dir,
    );
    assert!(
        e.contains("unknown GPU `b200`") && e.contains("a100"),
        "{e}"
    ); // The best record's kernel, as CUDA.
    let mut args = vec![
        "tune",
        "--target",
        "sim:a100",
        "--workload",
        "gemm:m=256,n=256,k=128,dtype=f16",
    ];
    args.extend(["--trials", "8", "--log", "a100-tune.jsonl"]);
    run(&args, &dir);
    let cuda = run(
        &["best", "--log", "a100-tune.jsonl", "--emit", "cuda"],
        &dir,
    );
    assert!(
        cuda.contains("[sim:a100]")
            && cuda.contains("__global__")
            && cuda.contains("dynamic shared memory"),
        "{cuda}"
    );
    // A real GPU needs the cuda feature (and a GPU); either way the error says what is missing.
    let e = fails(
        &[
            "tune",
            "--target",
            "gpu",
            "--workload",
            "gemm:m=8,n=8,k=8,dtype=f16",
        ],
        &dir,
    );
    assert!(e.contains("--features cuda") || e.contains("no GPU"), "{e}");
}
