//! The pipelines as a library: dataset (two platforms, sharded) -> merge -> pretrain -> eval ->
//! transfer, and tune -> best -> emit, asserting on the reports.

use std::path::{Path, PathBuf};

use tessel::{
    Architecture, DatasetOptions, Emit, EvalOptions, HeldOutOptions, ModelChoice, NoProgress,
    Notes, PretrainOptions, RefitOptions, RemeasureOptions, TargetSpec, TransferOptions,
    TuneOptions,
};

/// Test harnesses cannot serve as workers: the façade's worker binary does.
fn worker() -> Option<PathBuf> {
    Some(env!("CARGO_BIN_EXE_tessel-worker").into())
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn dataset_options(platform: &str, out: PathBuf) -> DatasetOptions {
    DatasetOptions {
        target: TargetSpec::Cpu,
        networks: Vec::new(),
        workload: Some("gemm:m=32,n=48,k=64,dtype=f32".parse().unwrap()),
        per_task: 12,
        out,
        shard: Some("0/1".into()),
        platform: Some(platform.into()),
        batch: 1,
        threads: 1,
        seed: 1,
        search_share: 0.5,
        max_tasks: None,
        worker_exe: worker(),
    }
}

#[test]
fn dataset_pretrain_eval_and_transfer_on_a_tiny_dataset() {
    let dir = fresh_dir("lib-pipeline");
    for (platform, out) in [("avx2-fma", "a.jsonl"), ("scalar", "b.jsonl")] {
        let o = dataset_options(platform, dir.join(out));
        let report = tessel::dataset(&o, &mut NoProgress).unwrap();
        assert_eq!((report.tasks, report.measured, report.existing), (1, 12, 0));
        assert_eq!(report.platform, platform);
        assert!(report.errors < 12, "every schedule failed: {report:?}");
        // Half random samples of the whole space, half from search rounds; records say which.
        assert_eq!(report.searched, 6, "{report:?}");
        let text = std::fs::read_to_string(dir.join(out)).unwrap();
        assert_eq!(text.matches(r#""sampler":"search""#).count(), 6);
        assert_eq!(text.matches(r#""sampler":"random""#).count(), 6);
        // The canary opened the task, in its own log next to the dataset.
        let canary = report.canary.as_ref().expect("a canary");
        assert!(canary.runs >= 1 && canary.min_ms > 0.0, "{canary:?}");
        let stem = out.trim_end_matches(".jsonl");
        assert_eq!(canary.log, dir.join(format!("{stem}.canary.jsonl")));
        assert!(
            std::fs::read_to_string(&canary.log)
                .unwrap()
                .contains(r#""sampler":"canary""#)
        );
    }
    // Rerunning resumes: nothing new to measure.
    let again = tessel::dataset(
        &dataset_options("avx2-fma", dir.join("a.jsonl")),
        &mut NoProgress,
    )
    .unwrap();
    assert_eq!((again.measured, again.existing), (0, 12));
    let all = dir.join("all.jsonl");
    let merged = tessel::merge(
        &all,
        &[dir.join("a.jsonl"), dir.join("b.jsonl")],
        &mut NoProgress,
    )
    .unwrap();
    assert_eq!(merged, 24);
    // merge writes a new file, never over an old one.
    assert!(tessel::merge(&all, &[dir.join("a.jsonl")], &mut NoProgress).is_err());

    let pretrain = PretrainOptions {
        epochs: 2,
        val_fraction: 0.5,
        // The roofline prior on: trained, saved and loaded with it.
        architecture: Architecture {
            d_model: 16,
            heads: 2,
            layers: 1,
            prior: true,
        },
        ..PretrainOptions::new(vec![all.clone()], dir.join("m/model"))
    };
    let mut notes = Notes::default();
    let trained = tessel::pretrain(&pretrain, &mut notes).unwrap();
    assert_eq!(trained.tasks, 2);
    assert!(trained.records > 12 && trained.records <= 24);
    assert_eq!(trained.training.epochs.len(), 2);
    assert!(trained.validation.is_some() && trained.validation_tasks == 1);
    assert!(notes.0.iter().any(|n| n.starts_with("epoch")), "{notes:?}");
    assert!(trained.saved.0.exists() && trained.saved.1.exists());
    let saved = tessel::model::Model::load(&trained.saved.0).unwrap();
    assert!(
        saved.config().prior,
        "the prior flag is saved with the model"
    );
    // The trees of the ensemble, fitted on the training tasks, ship beside it.
    assert_eq!(
        trained.saved_ensemble.as_deref(),
        Some(dir.join("m/model.ensemble.json.gz").as_path())
    );
    assert!(saved.companions.is_some() && trained.validation_ensemble.is_some());
    // The instructions it was trained on, which `tune` checks before trusting it.
    assert!(
        saved.info.provenance["instructions"].is_array(),
        "{}",
        saved.info.provenance
    );
    // And the tasks it was validated on, by key: what its trees are judged on later.
    let own = tessel::validation_tasks_of(&saved).expect("validation tasks listed");
    assert_eq!(own.len(), trained.validation_tasks);
    let refit = |validation_tasks: Option<PathBuf>| {
        tessel::refit_trees(
            &RefitOptions {
                model: dir.join("m/model"),
                data: vec![all.clone()],
                networks: Vec::new(),
                exclude_networks: Vec::new(),
                val_fraction: 0.2,
                seed: 1,
                fastest_run: false,
                // Judged, not written: the model stays as pretrain saved it.
                force: false,
                trees: "rounds=20".parse().unwrap(),
                validation_tasks,
            },
            &mut NoProgress,
        )
    };
    let r = refit(None).unwrap();
    assert_eq!(
        (r.validation_tasks, r.validation_from.as_str()),
        (1, "the model's own")
    );
    // One validation task says nothing of the noise: whatever the new trees score there,
    // the old ones stay.
    let gain = r.gain.expect("the model had trees to compare with");
    assert_eq!(gain.tasks, 1);
    assert!(!r.replaced && r.before_criterion.is_some());
    // Named in a file: one key per line; unknown keys, an empty file and repeats are errors.
    let keys = dir.join("val.txt");
    std::fs::write(&keys, format!("{}\n", own[0])).unwrap();
    let r = refit(Some(keys.clone())).unwrap();
    assert_eq!(r.validation_from, keys.display().to_string());
    for (text, why) in [
        (
            "no such task\n".to_string(),
            "1 of 1 named tasks are not in the data",
        ),
        ("\n\n".to_string(), "lists no task keys"),
        (format!("{0}\n{0}\n", own[0]), "twice"),
    ] {
        std::fs::write(&keys, text).unwrap();
        let e = refit(Some(keys.clone())).unwrap_err();
        let mut chain = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            chain = format!("{chain}: {s}");
            source = s.source();
        }
        assert!(chain.contains(why), "{chain}");
    }

    let eval = tessel::eval(
        &EvalOptions {
            model: Some(dir.join("m/model")),
            data: vec![all.clone()],
            plot: Some(dir.join("plots")),
            ..EvalOptions::default()
        },
        &mut NoProgress,
    )
    .unwrap();
    assert_eq!((eval.tasks, eval.records), (2, trained.records));
    for v in [
        eval.top1,
        eval.top5,
        eval.pairwise_accuracy,
        eval.kendall_tau,
    ] {
        assert!((-1.0..=1.0).contains(&v), "{eval:?}");
    }
    assert!(eval.top5 >= eval.top1);
    assert!(eval.ensemble.is_some_and(|e| e.top5 >= e.top1), "{eval:?}");
    let svg = std::fs::read_to_string(dir.join("plots/top_k.svg")).unwrap();
    assert!(svg.starts_with("<svg"));
    // Against another model (here itself) on the tasks a file lists: the same figures, no
    // gain; unknown task keys are an error naming the file.
    std::fs::write(&keys, format!("{}\n", own[0])).unwrap();
    let against = |tasks: &Path| {
        tessel::eval(
            &EvalOptions {
                model: Some(dir.join("m/model")),
                data: vec![all.clone()],
                tasks: Some(tasks.to_path_buf()),
                against: Some(dir.join("m/model")),
                ..EvalOptions::default()
            },
            &mut NoProgress,
        )
    };
    let e = against(&keys).unwrap();
    assert_eq!(e.tasks, 1);
    let a = e.against.expect("--against");
    assert_eq!(a.criterion, a.model_criterion);
    assert_eq!((a.gain.mean, a.gain.tasks), (0.0, 1));
    assert_eq!(Some(a.ranking), e.ensemble);
    std::fs::write(&keys, "no such task\n").unwrap();
    let err = against(&keys).unwrap_err().to_string();
    assert!(err.contains("--tasks") && err.contains("val.txt"), "{err}");

    let options = TransferOptions {
        model: dir.join("m/model"),
        data: vec![all],
        networks: Vec::new(),
        shots: 6,
        shots_per_task: tessel::DEFAULT_SHOTS_PER_TASK,
        out: dir.join("m/tuned"),
        mode: "all".into(),
        epochs: 1,
        seed: 1,
        correction_trees: tessel::model::ensemble::CORRECTION_RECIPE,
        force: false,
    };
    // One record a task orders nothing; more shots than the half holds are an error.
    for (per_task, shots, says) in [(1, 6, "shots per task 1"), (2, 10_000, "holds only")] {
        let err = tessel::transfer(
            &TransferOptions {
                shots_per_task: per_task,
                shots,
                ..options.clone()
            },
            &mut NoProgress,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains(says), "{err}");
    }
    // A correction grown as a regression cannot learn an order from the carried scores:
    // refused before anything is trained, not left out without a word.
    let regression = tessel::model::gbt::TreeRecipe {
        objective: tessel::model::gbt::TreeObjective::Regression,
        ..tessel::model::ensemble::CORRECTION_RECIPE
    };
    let err = tessel::transfer(
        &TransferOptions {
            correction_trees: regression,
            ..options.clone()
        },
        &mut NoProgress,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("--correction-trees") && err.contains("lambdarank"),
        "{err}"
    );
    let transfer = tessel::transfer(&options, &mut NoProgress).unwrap();
    assert_eq!(transfer.shots, 6);
    assert_eq!(transfer.test_tasks, 1);
    assert!(transfer.saved.0.exists());
    // The shots come from one task: nothing to validate a fine-tuning on, so the
    // pretrained model is saved as it came, with its own trees.
    assert!(transfer.validation.is_none());
    assert_eq!(transfer.chosen, "pretrained+trees");
    assert_eq!(Some(transfer.after.model), transfer.before_ensemble);
    assert_eq!(
        std::fs::read(dir.join("m/tuned.safetensors")).unwrap(),
        std::fs::read(dir.join("m/model.safetensors")).unwrap()
    );
    let trees = |m: &str| {
        let c = tessel::model::Model::load(&dir.join(m))
            .unwrap()
            .companions
            .unwrap();
        (c.scales, c.weights, c.records)
    };
    assert_eq!(trees("m/tuned"), trees("m/model"));
    // Trees were fitted on the shots and scored on the test task, but without validation
    // they are not what is kept.
    assert!(transfer.fine_tuned_ensemble.is_some());
    // So was a correction of the pretrained ensemble, on the shots' one task.
    assert!(transfer.pretrained_corrected.is_some());
    // The test task's pick, by the kept model and by the model as it came (the same here).
    assert_eq!(transfer.task_picks.len(), 1);
    assert_eq!(
        transfer.task_picks[0].chosen_s,
        transfer.before_task_picks[0].chosen_s
    );
    // A lone GEMM belongs to no known network: no figures by network.
    assert!(transfer.by_network.is_empty());
}

#[test]
fn remeasure_supersedes_the_chosen_records_and_resumes() {
    let dir = fresh_dir("lib-remeasure");
    let data = dir.join("a.jsonl");
    let o = DatasetOptions {
        per_task: 6,
        search_share: 0.0,
        ..dataset_options("avx2-fma", data.clone())
    };
    assert_eq!(tessel::dataset(&o, &mut NoProgress).unwrap().measured, 6);
    let text = std::fs::read_to_string(&data).unwrap();
    // Records carry the digest of the kernel they timed.
    assert_eq!(text.matches(r#""kernel":""#).count(), 6, "{text}");
    let options = |out: &str| RemeasureOptions {
        dataset: data.clone(),
        out: Some(dir.join(out)),
        worker_exe: worker(),
        threads: 1,
        ..RemeasureOptions::default()
    };

    // Nothing named, nothing measured; a compressed output cannot be appended to.
    let e = tessel::remeasure(&options("re.jsonl"), &mut NoProgress).unwrap_err();
    assert!(e.to_string().contains("--all"), "{e}");
    let gz = RemeasureOptions {
        all: true,
        ..options("re.jsonl.gz")
    };
    let e = tessel::remeasure(&gz, &mut NoProgress).unwrap_err();
    assert!(e.to_string().contains("compressed"), "{e}");
    // A time that is no time, empty text and a missing dataset are errors that name them.
    let nan = RemeasureOptions {
        before: Some(f64::NAN),
        ..options("re.jsonl")
    };
    let e = tessel::remeasure(&nan, &mut NoProgress).unwrap_err();
    assert!(e.to_string().contains("--before"), "{e}");
    let empty = RemeasureOptions {
        source_contains: Some(String::new()),
        ..options("re.jsonl")
    };
    let e = tessel::remeasure(&empty, &mut NoProgress).unwrap_err();
    assert!(e.to_string().contains("--source-contains"), "{e}");
    let missing = RemeasureOptions {
        dataset: dir.join("missing.jsonl"),
        all: true,
        ..options("re.jsonl")
    };
    let e = tessel::remeasure(&missing, &mut NoProgress).unwrap_err();
    assert!(e.to_string().contains("no such dataset"), "{e}");
    assert!(
        !dir.join("re.jsonl").exists(),
        "a refused run wrote nothing"
    );

    // Today's code generator builds what these records timed: nothing changed.
    let changed = RemeasureOptions {
        changed: true,
        ..options("re.jsonl")
    };
    assert_eq!(
        tessel::remeasure(&changed, &mut NoProgress)
            .unwrap()
            .selected,
        0
    );
    // A record whose digest names other code is selected.
    let forged = dir.join("forged.jsonl");
    let first = text.lines().next().unwrap();
    let at = first.find(r#""kernel":""#).unwrap() + r#""kernel":""#.len();
    let other = format!("{}{}{}", &first[..at], "0".repeat(16), &first[at + 16..]);
    std::fs::write(&forged, format!("{other}\n")).unwrap();
    let dry = RemeasureOptions {
        dataset: forged,
        dry_run: true,
        ..changed.clone()
    };
    let r = tessel::remeasure(&dry, &mut NoProgress).unwrap();
    assert_eq!((r.selected, r.measured), (1, 0));
    // Records without a digest: none here, and a record stripped of its digest is selected.
    let undigested = RemeasureOptions {
        undigested: true,
        dry_run: true,
        ..options("re.jsonl")
    };
    assert_eq!(
        tessel::remeasure(&undigested, &mut NoProgress)
            .unwrap()
            .selected,
        0
    );
    let digest = &first[at - r#","kernel":""#.len()..at + 17];
    assert!(digest.starts_with(',') && digest.ends_with('"'), "{digest}");
    let stripped_first = first.replacen(digest, "", 1);
    assert_ne!(stripped_first, first);
    let stripped = dir.join("stripped.jsonl");
    std::fs::write(&stripped, format!("{first}\n{stripped_first}\n")).unwrap();
    let r = tessel::remeasure(
        &RemeasureOptions {
            dataset: stripped,
            ..undigested.clone()
        },
        &mut NoProgress,
    )
    .unwrap();
    assert_eq!(
        r.selected, 1,
        "the later, undigested record supersedes the first"
    );
    // Selecting by the generated text.
    let text_of = |t: &str| RemeasureOptions {
        source_contains: Some(t.into()),
        dry_run: true,
        ..options("re.jsonl")
    };
    let all = tessel::remeasure(&text_of("void kernel("), &mut NoProgress).unwrap();
    assert_eq!(all.selected, 6);
    let none = tessel::remeasure(&text_of("no such text"), &mut NoProgress).unwrap();
    assert_eq!(none.selected, 0);
    // Selecting the records cut short after their checked run: exactly those saying so.
    let cut = RemeasureOptions {
        cut_short: true,
        dry_run: true,
        ..options("re.jsonl")
    };
    let cut_in_data = text.matches(r#""cut_short":true"#).count();
    let r = tessel::remeasure(&cut, &mut NoProgress).unwrap();
    assert_eq!(r.selected, cut_in_data);
    let forged_cut = dir.join("forged-cut.jsonl");
    let marked = first.replacen(r#""max_error""#, r#""cut_short":true,"max_error""#, 1);
    assert_ne!(marked, first);
    std::fs::write(&forged_cut, format!("{marked}\n")).unwrap();
    let r = tessel::remeasure(
        &RemeasureOptions {
            dataset: forged_cut,
            ..cut.clone()
        },
        &mut NoProgress,
    )
    .unwrap();
    assert_eq!(r.selected, 1);
    // Selecting the records whose median run was far slower than their fastest.
    let spread = |ratio: f64| RemeasureOptions {
        spread_above: Some(ratio),
        dry_run: true,
        ..options("re.jsonl")
    };
    let expected = |ratio: f64| {
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| {
                let t = &v["result"]["Ok"]["timing"];
                Some(t["median_s"].as_f64()? > ratio * t["min_s"].as_f64()?)
            })
            .filter(|&b| b)
            .count()
    };
    for ratio in [1.0, 1.01, 1.2, 100.0] {
        let r = tessel::remeasure(&spread(ratio), &mut NoProgress).unwrap();
        assert_eq!(r.selected, expected(ratio), "--spread-above {ratio}");
    }
    assert_eq!(
        tessel::remeasure(&spread(100.0), &mut NoProgress)
            .unwrap()
            .selected,
        0
    );
    for bad in [0.5, f64::NAN, f64::INFINITY] {
        let e = tessel::remeasure(&spread(bad), &mut NoProgress).unwrap_err();
        assert!(e.to_string().contains("--spread-above"), "{e}");
    }

    // Everything measured before now, measured again; a rerun has nothing left to do (the
    // new records are later).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let before = RemeasureOptions {
        before: Some(now),
        ..options("re.jsonl")
    };
    let r = tessel::remeasure(&before, &mut NoProgress).unwrap();
    assert_eq!((r.selected, r.measured, r.other_machine), (6, 6, 0));
    assert!(r.geomean_ratio.is_some_and(|g| g > 0.0), "{r:?}");
    let again = tessel::remeasure(&before, &mut NoProgress).unwrap();
    assert_eq!((again.selected, again.measured), (0, 0));

    // Readers keep the latest record of each schedule.
    let mut notes = Notes::default();
    let loaded = tessel::load(&[data.clone(), dir.join("re.jsonl")], None, &mut notes).unwrap();
    assert!(loaded.samples.len() <= 6);
    assert!(
        notes.0.iter().any(|n| n.contains("6 records left out")),
        "{notes:?}"
    );
    let merged = dir.join("merged.jsonl");
    let n = tessel::merge(&merged, &[data, dir.join("re.jsonl")], &mut NoProgress).unwrap();
    assert_eq!(n, 6);
    assert_eq!(
        std::fs::read_to_string(&merged).unwrap(),
        std::fs::read_to_string(dir.join("re.jsonl")).unwrap()
    );
}

#[test]
fn tune_logs_every_trial_and_its_best_becomes_c() {
    let dir = fresh_dir("lib-tune");
    let log = dir.join("tune.jsonl");
    let opts = TuneOptions {
        trials: 8,
        measure_batch: 4,
        population: 16,
        model: ModelChoice::Random,
        log: Some(log.clone()),
        worker_exe: worker(),
        ..TuneOptions::workload("gemm:m=32,n=32,k=32,dtype=f32".parse().unwrap())
    };
    let report = tessel::tune(&opts, &mut NoProgress).unwrap();
    assert_eq!((report.trials, report.measured_this_run), (8, 8));
    assert!(!report.estimates && report.target == "cpu");
    let task = &report.tasks[0];
    assert!(task.gflops.is_some_and(|g| g > 0.0), "{report:?}");
    assert!(
        task.percent_of_peak.is_some_and(|p| p > 0.0 && p < 150.0),
        "{task:?}"
    );
    // The finalists were timed again on fresh allocations of their buffers, the fastest
    // of them reported, and each new timing appended to the log as a `remeasure` record.
    assert!(task.remeasured_ms.is_some_and(|ms| ms > 0.0), "{task:?}");
    assert!(task.allocation_spread.is_some_and(|s| s >= 0.0));
    assert!(task.finalists >= 1 && task.winner_search_rank.is_some());
    let remeasured = |path: &std::path::Path| {
        tessel::search::read_log(path)
            .unwrap()
            .records
            .iter()
            .filter(|r| r.sampler.as_deref() == Some(tessel::search::REMEASURE_SAMPLER))
            .count()
    };
    let lines = std::fs::read_to_string(&log).unwrap().lines().count();
    assert_eq!(lines, 8 + task.finalists);
    assert_eq!(remeasured(&log), task.finalists);

    // Resuming from the log measures nothing new.
    let again = tessel::tune(&opts, &mut NoProgress).unwrap();
    assert_eq!((again.measured_this_run, again.resumed_from_log), (0, 8));
    let resumed_remeasured_ms = again.tasks[0].remeasured_ms;

    // Without the pipeline (each batch proposed after the last one's results), the same
    // count, in a log of its own. (With two cores, the run above was pipelined.)
    let serial_log = dir.join("serial.jsonl");
    let serial = TuneOptions {
        no_pipeline: true,
        log: Some(serial_log.clone()),
        ..opts.clone()
    };
    let report = tessel::tune(&serial, &mut NoProgress).unwrap();
    assert_eq!((report.trials, report.measured_this_run), (8, 8));
    let lines = std::fs::read_to_string(&serial_log)
        .unwrap()
        .lines()
        .count();
    assert_eq!(lines, 8 + report.tasks[0].finalists);

    // Timed with the weights packed beforehand: another latency, so a copy of the log has
    // nothing to resume; the new records say how they were timed.
    let mixed = dir.join("mixed.jsonl");
    std::fs::copy(&log, &mixed).unwrap();
    let prepacked = TuneOptions {
        prepacked_weights: true,
        log: Some(mixed.clone()),
        ..opts.clone()
    };
    let before = tessel::search::read_log(&mixed).unwrap().records.len();
    let report = tessel::tune(&prepacked, &mut NoProgress).unwrap();
    assert_eq!((report.measured_this_run, report.resumed_from_log), (8, 0));
    let records = tessel::search::read_log(&mixed).unwrap().records;
    let finalists = report.tasks[0].finalists;
    assert_eq!(records.len(), before + 8 + finalists);
    assert_eq!(
        records.iter().filter(|r| r.prepacked_weights).count(),
        8 + finalists
    );

    // The log's best is a re-measurement, the latest of its schedule (the resumed run
    // above timed its finalists again too): no slower than that run's reported best.
    let best = tessel::best(&log, &mut NoProgress).unwrap();
    assert_eq!(best.len(), 1);
    assert_eq!(
        best[0].sampler.as_deref(),
        Some(tessel::search::REMEASURE_SAMPLER)
    );
    let best_ms = best[0].latency().map(|l| l * 1e3).unwrap();
    assert!(
        resumed_remeasured_ms.is_some_and(|ms| best_ms <= ms),
        "{best_ms}"
    );
    let c = tessel::emit(&best[0], Emit::C).unwrap();
    assert!(c.contains("void kernel(void *const *args)"), "{c}");
    // The trace it emits is one that replays.
    let trace = tessel::emit(&best[0], Emit::Trace).unwrap();
    assert_eq!(tessel::Trace::from_json(&trace).unwrap(), best[0].trace);
}

#[test]
fn narrow_types_tune_through_convert_on_pack_on_the_avx2_instructions() {
    let host = tessel::intrin::HostCpu::detect();
    for (spec, family, instruction, convert) in [
        // A ResNet-style int8 3x3 conv: u8 x i8 widened to i16 for vpmaddwd.
        (
            "conv2d:n=1,h=8,w=8,c=16,k=16,r=3,s=3,pad=1,dtype=u8,wdtype=i8",
            "avx2-int8",
            "avx2.vpmaddwd",
            "to i16",
        ),
        // bf16 converted to f32 for the FMA.
        (
            "gemm:m=32,n=32,k=32,dtype=bf16",
            "avx2-fma",
            "avx2.vfmadd231ps",
            "to f32",
        ),
    ] {
        let opts = TuneOptions {
            trials: 4,
            measure_batch: 4,
            population: 16,
            model: ModelChoice::Random,
            instructions: vec![family.into()],
            worker_exe: worker(),
            ..TuneOptions::workload(spec.parse().unwrap())
        };
        if !host.has("avx2") {
            let e = tessel::tune(&opts, &mut NoProgress)
                .unwrap_err()
                .to_string();
            assert!(e.contains("--instructions"), "{e}");
            continue;
        }
        let report = tessel::tune(&opts, &mut NoProgress).unwrap();
        assert_eq!(report.instructions, vec![instruction.to_string()]);
        let mapping = report.tasks[0].mapping.clone().unwrap_or_default();
        // Random schedules may all fall back to plain loops: only a mapping must convert.
        if !mapping.is_empty() {
            assert!(
                mapping.starts_with(instruction) && mapping.contains(convert),
                "{mapping}"
            );
        }
        assert!(report.tasks[0].gflops.is_some(), "{report:?}");
    }
    // The saturating vpmaddubsw is searched only when named: not by default, not by prefix.
    if host.has("avx2") {
        let named = |items: &[&str]| {
            tessel::cpu_instructions(&items.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap()
        };
        assert!(!named(&["avx2"]).contains(&"avx2.vpmaddubsw".to_string()));
        assert_eq!(named(&["avx2-int8-saturating"]), vec!["avx2.vpmaddubsw"]);
        let opts = TuneOptions {
            trials: 2,
            measure_batch: 2,
            population: 8,
            model: ModelChoice::Random,
            worker_exe: worker(),
            ..TuneOptions::workload("dense:m=16,n=16,k=16,dtype=u8,wdtype=i8".parse().unwrap())
        };
        let default = tessel::tune(&opts, &mut NoProgress).unwrap();
        assert!(!default.instructions.iter().any(|i| i == "avx2.vpmaddubsw"));
        let opted = TuneOptions {
            instructions: vec!["avx2.vpmaddubsw".into()],
            ..opts
        };
        let report = tessel::tune(&opted, &mut NoProgress).unwrap();
        assert_eq!(report.instructions, vec!["avx2.vpmaddubsw".to_string()]);
        assert!(report.tasks[0].gflops.is_some(), "{report:?}");
    }
    // Names that are no instruction, and instructions this CPU lacks, are refused.
    let bad = TuneOptions {
        instructions: vec!["avx3".into()],
        worker_exe: worker(),
        ..TuneOptions::workload("gemm:m=8,n=8,k=8,dtype=f32".parse().unwrap())
    };
    let e = tessel::tune(&bad, &mut NoProgress).unwrap_err().to_string();
    assert!(e.contains("`avx3`") && e.contains("avx2.vpmaddwd"), "{e}");
    // Pre-packed weights are a CPU timing: a GPU target refuses them.
    let gpu = TuneOptions {
        prepacked_weights: true,
        target: "sim:a100".parse().unwrap(),
        instructions: Vec::new(),
        ..bad.clone()
    };
    let e = tessel::tune(&gpu, &mut NoProgress).unwrap_err().to_string();
    assert!(
        e.contains("--prepacked-weights") && e.contains("sim:a100"),
        "{e}"
    );
    if !host.has("amx_tile") {
        let amx = TuneOptions {
            instructions: vec!["amx.tdpbf16ps".into()],
            ..bad
        };
        let e = tessel::tune(&amx, &mut NoProgress).unwrap_err().to_string();
        assert!(e.contains("cannot run on this CPU"), "{e}");
    }
}

#[test]
fn bad_options_are_errors_that_name_them() {
    let w = "gemm:m=8,n=8,k=8,dtype=f32".parse().unwrap();
    let zero_trials = TuneOptions {
        trials: 0,
        model: ModelChoice::Random,
        ..TuneOptions::workload(w)
    };
    let e = tessel::tune(&zero_trials, &mut NoProgress).unwrap_err();
    assert!(e.to_string().contains("trials"), "{e}");
    let e = "tpu".parse::<TargetSpec>().unwrap_err().to_string();
    assert!(e.contains("tpu") && e.contains("sim:a100"), "{e}");
    assert_eq!(
        "sim:h100".parse::<TargetSpec>().unwrap().to_string(),
        "sim:h100"
    );
    let mut o = dataset_options("tpu", Path::new("/nonexistent/x.jsonl").into());
    let e = tessel::dataset(&o, &mut NoProgress)
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown platform `tpu`"), "{e}");
    o.platform = Some("avx2-fma".into());
    o.shard = Some("3/2".into());
    let e = tessel::dataset(&o, &mut NoProgress)
        .unwrap_err()
        .to_string();
    assert!(e.contains("shard"), "{e}");
}

#[test]
fn gpu_model_targets_tune_without_a_gpu() {
    let opts = TuneOptions {
        target: "sim:a100".parse().unwrap(),
        trials: 24,
        ..TuneOptions::workload("gemm:m=512,n=512,k=512,dtype=f16".parse().unwrap())
    };
    let mut notes = Notes::default();
    let report = tessel::tune(&opts, &mut notes).unwrap();
    assert!(report.estimates && report.target == "sim:a100");
    assert!(report.machine.contains("analytical model"), "{report:?}");
    assert!(notes.0.iter().any(|n| n.contains("estimates")), "{notes:?}");
    // Estimates of an A100 land below its 312 TFLOPS fp16 peak.
    let pct = report.percent_of_peak.unwrap();
    assert!(pct > 0.0 && pct <= 100.0, "{pct}");
}

#[test]
fn log_records_whose_trace_does_not_replay_are_not_trials() {
    let dir = fresh_dir("lib-resume-bad-trace");
    let log = dir.join("tune.jsonl");
    let w: tessel::Workload = "gemm:m=16,n=16,k=16,dtype=f32".parse().unwrap();
    // A record of this workload on this machine whose trace names a loop it does not have.
    let mut trace = tessel::Trace::new();
    trace.split("nope", &[4]);
    let fp = tessel::cpu_measurer(&tessel::TargetOptions {
        worker_exe: worker(),
        ..Default::default()
    })
    .unwrap();
    let fingerprint = tessel::measurement::Measurer::fingerprint(&fp).clone();
    let timing = tessel::measurement::Timing {
        min_s: 1e-6,
        median_s: 1e-6,
        spread: 0.0,
        runs: 3,
    };
    let forged = tessel::TuningRecord::new(
        &w,
        "cpu",
        fingerprint,
        trace,
        None,
        Ok(tessel::measurement::Measurement {
            timing,
            compile_time_s: 0.0,
            max_error: 0.0,
            emulated: false,
            gflops: w.flops() as f64 / 1e-6 / 1e9,
            cut_short: false,
            censored: false,
            allocation_spread: None,
            kernel: None,
        }),
    );
    tessel::search::RecordLog::open(&log)
        .unwrap()
        .append(&[forged])
        .unwrap();
    let opts = TuneOptions {
        trials: 2,
        measure_batch: 2,
        population: 8,
        model: ModelChoice::Random,
        log: Some(log),
        worker_exe: worker(),
        ..TuneOptions::workload(w)
    };
    let report = tessel::tune(&opts, &mut NoProgress).unwrap();
    assert_eq!((report.resumed_from_log, report.measured_this_run), (0, 2));
}

#[test]
fn every_shipped_dataset_reads_cleanly() {
    let dir = tessel::fixtures_dir().join("datasets");
    let mut files = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let mut notes = Notes::default();
        let records = tessel::strict_read(&path, &mut notes).unwrap();
        assert!(!records.is_empty(), "{}", path.display());
        assert!(notes.0.is_empty(), "{}: {:?}", path.display(), notes.0);
        files += 1;
    }
    assert!(files >= 5);
}

#[test]
fn held_out_networks_are_never_trained_on_and_are_scored_per_network() {
    // One task of BERT-tiny (the test network) and one task of no network (training).
    let dir = fresh_dir("lib-held-out");
    for (spec, out) in [
        ("bmm:b=2,m=128,n=64,k=128,dtype=f32", "test.jsonl"),
        ("gemm:m=32,n=48,k=64,dtype=f32", "train.jsonl"),
    ] {
        let o = DatasetOptions {
            workload: Some(spec.parse().unwrap()),
            per_task: 8,
            ..dataset_options("avx2-fma", dir.join(out))
        };
        tessel::dataset(&o, &mut NoProgress).unwrap();
    }
    let data = vec![dir.join("test.jsonl"), dir.join("train.jsonl")];
    let o = HeldOutOptions {
        test_networks: vec!["bert-tiny-128".into()],
        epochs: 2,
        architecture: Architecture {
            d_model: 16,
            heads: 2,
            layers: 1,
            prior: false,
        },
        ..HeldOutOptions::new(data.clone())
    };
    let r = tessel::held_out(&o, &mut NoProgress).unwrap();
    assert_eq!((r.train_tasks, r.test_tasks), (1, 1));
    assert_eq!(r.networks.len(), 1);
    let n = &r.networks[0];
    assert_eq!(
        (n.network.as_str(), n.tasks, n.tasks_in_network),
        ("bert-tiny-128", 1, 5)
    );
    assert_eq!(n.records, r.test_records);
    let ablation = n
        .scores
        .primitives
        .expect("the primitive-sequence ablation");
    for m in [
        n.scores.model,
        ablation,
        n.scores.ridge,
        n.scores.gbt,
        n.scores.ensemble,
        n.scores.random,
    ] {
        assert!((0.0..=1.0).contains(&m.top1) && m.top5 >= m.top1, "{m:?}");
    }
    // The one task's picks are what its top-1 figures say.
    let [p] = n.picks.as_slice() else {
        panic!("one task, one set of picks: {:?}", n.picks)
    };
    assert_eq!(p.workload, "bmm:b=2,m=128,n=64,k=128,dtype=f32");
    assert_eq!(p.records, n.records);
    assert!((p.best_s / p.ensemble_s - n.scores.ensemble.top1).abs() < 1e-9);
    assert!((p.best_s / p.model_s - n.scores.model.top1).abs() < 1e-9);
    assert!((p.best_s / p.trees_s - n.scores.gbt.top1).abs() < 1e-9);
    let lost = p.ensemble_s > p.best_s;
    assert_eq!(p.loss_share, if lost { 1.0 } else { 0.0 }, "{p:?}");
    assert!(!r.trees_refit);
    // With the trees fitted again on every training task the report says so.
    let refit = tessel::held_out(
        &HeldOutOptions {
            refit_trees: true,
            no_ablation: true,
            ..o.clone()
        },
        &mut NoProgress,
    )
    .unwrap();
    assert!(refit.trees_refit);
    assert_eq!(refit.networks[0].scores.model, n.scores.model);
    // A test network without records, an unknown one, and data that is all test: errors.
    for (nets, why) in [
        (
            vec!["resnet50".to_string()],
            "no record of the test networks",
        ),
        (vec!["nonet".to_string()], "nonet"),
    ] {
        let e = tessel::held_out(
            &HeldOutOptions {
                test_networks: nets,
                ..o.clone()
            },
            &mut NoProgress,
        )
        .unwrap_err();
        assert!(e.to_string().contains(why), "{e}");
    }
    let e = tessel::held_out(
        &HeldOutOptions {
            data: vec![dir.join("test.jsonl")],
            ..o.clone()
        },
        &mut NoProgress,
    )
    .unwrap_err();
    assert!(e.to_string().contains("nothing to train on"), "{e}");
}

#[test]
fn search_eval_tunes_with_the_model_and_at_random_and_reports_from_the_logs() {
    let dir = fresh_dir("lib-search-eval");
    let out = dir.join("runs");
    let opts = tessel::SearchEvalOptions {
        trials: 4,
        seeds: 1,
        worker_exe: worker(),
        ..tessel::SearchEvalOptions::new(
            vec!["gemm:m=32,n=32,k=32,dtype=f32".parse().unwrap()],
            out.clone(),
        )
    };
    let report = tessel::search_eval(&opts, &mut NoProgress).unwrap();
    assert_eq!(report.tasks.len(), 1);
    let task = &report.tasks[0];
    assert_eq!(task.runs.len(), 2);
    assert!(task.best_gflops > 0.0, "{task:?}");
    for run in &task.runs {
        assert_eq!(run.trials, 4, "{run:?}");
        assert_eq!(
            std::fs::read_to_string(&run.log).unwrap().lines().count(),
            4
        );
        assert!(run.wall_s.is_some());
        // Best-so-far never falls.
        assert!(run.best_so_far.windows(2).all(|w| w[0] <= w[1]));
    }
    // The run that found the best reached 95% of it.
    assert!(task.runs.iter().any(|r| r.trials_to_threshold.is_some()));
    assert!(report.trials_ratio.is_some_and(|x| x > 0.0));

    // A rerun resumes: nothing measured, the same figures from the logs.
    let again = tessel::search_eval(&opts, &mut NoProgress).unwrap();
    assert_eq!(again.tasks[0].best_gflops, task.best_gflops);
    assert!(again.tasks[0].runs.iter().all(|r| r.wall_s.is_none()));
    let only = tessel::search_eval(
        &tessel::SearchEvalOptions {
            report_only: true,
            ..opts.clone()
        },
        &mut NoProgress,
    )
    .unwrap();
    assert_eq!(only.trials_ratio, report.trials_ratio);

    // Other settings in the same directory would mix two searches in one report.
    let e = tessel::search_eval(
        &tessel::SearchEvalOptions {
            population: 32,
            ..opts.clone()
        },
        &mut NoProgress,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("population 512 there, 32 here"), "{e}");
    let e = tessel::search_eval(
        &tessel::SearchEvalOptions {
            report_only: true,
            out: dir.join("nothing-here"),
            ..opts.clone()
        },
        &mut NoProgress,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("holds no search-eval runs"), "{e}");
}

#[test]
fn search_eval_refuses_settings_that_cannot_compare_and_names_them() {
    let dir = fresh_dir("lib-search-eval-bad");
    let base = tessel::SearchEvalOptions {
        worker_exe: worker(),
        ..tessel::SearchEvalOptions::new(
            vec!["gemm:m=32,n=32,k=32,dtype=f32".parse().unwrap()],
            dir.join("runs"),
        )
    };
    let err = |o: tessel::SearchEvalOptions| {
        tessel::search_eval(&o, &mut NoProgress)
            .unwrap_err()
            .to_string()
    };
    let e = err(tessel::SearchEvalOptions {
        model: ModelChoice::Random,
        ..base.clone()
    });
    assert!(e.contains("random is the baseline"), "{e}");
    let e = err(tessel::SearchEvalOptions {
        threshold: 1.5,
        ..base.clone()
    });
    assert!(e.contains("--threshold 1.5"), "{e}");
    let e = err(tessel::SearchEvalOptions {
        population: 0,
        ..base.clone()
    });
    assert!(e.contains("population"), "{e}");
    let e = err(tessel::SearchEvalOptions {
        instructions: vec!["avx9".into()],
        ..base.clone()
    });
    assert!(e.contains("avx9"), "{e}");
    let e = err(tessel::SearchEvalOptions {
        seeds: 0,
        ..base.clone()
    });
    assert!(e.contains("--seeds"), "{e}");
    let e = err(tessel::SearchEvalOptions {
        workloads: Vec::new(),
        ..base.clone()
    });
    assert!(e.contains("--workload") && e.contains("--network"), "{e}");
    let e = err(tessel::SearchEvalOptions {
        tasks: Some(2),
        ..base.clone()
    });
    assert!(e.contains("give --network"), "{e}");
    let e = err(tessel::SearchEvalOptions {
        workloads: Vec::new(),
        network: Some("resnet51".into()),
        ..base.clone()
    });
    assert!(e.contains("resnet51"), "{e}");
    // A model file that is not one fails before anything is measured.
    let bogus = dir.join("bogus.safetensors");
    std::fs::write(&bogus, b"not a model").unwrap();
    let e = err(tessel::SearchEvalOptions {
        model: ModelChoice::File(bogus),
        ..base.clone()
    });
    assert!(e.contains("bogus"), "{e}");
    assert!(
        !dir.join("runs").exists(),
        "a refused evaluation creates nothing"
    );
}

#[test]
fn tune_says_when_its_model_never_saw_the_instructions_it_ranks() {
    let dir = fresh_dir("lib-tune-unfamiliar");
    let mut model =
        tessel::model::Model::new(tessel::model::ModelConfig::new(tessel::features::WIDTH), 1)
            .unwrap();
    // A model whose records all ran on an instruction this gemm never maps to.
    model.info.provenance = serde_json::json!({"instructions": ["amx.tdpbf16ps"]});
    model.save(&dir.join("m")).unwrap();
    let opts = TuneOptions {
        trials: 4,
        measure_batch: 4,
        population: 16,
        model: ModelChoice::File(dir.join("m")),
        worker_exe: worker(),
        ..TuneOptions::workload("gemm:m=32,n=32,k=32,dtype=f32".parse().unwrap())
    };
    let mut notes = Notes::default();
    let report = tessel::tune(&opts, &mut notes).unwrap();
    assert_eq!(report.trials, 4);
    // A model the user named is used, with a note; only the shipped one gives way.
    assert!(
        notes
            .0
            .iter()
            .any(|n| n.contains("was never trained on") && n.contains("--model roofline")),
        "{notes:?}"
    );
}
