//! Log and dataset files as a file system gives them: arbitrary bytes, torn and edited lines.
//! Reading never panics or fails the whole file; every bad line is reported with its number.

use proptest::prelude::*;
use tessel_ir::{Trace, Workload};
use tessel_measure::{HardwareFingerprint, Measurement, Timing};
use tessel_search::{REMEASURE_SAMPLER, TuningRecord, read_log, supersede};

fn record() -> TuningRecord {
    let w: Workload = "gemm:m=16,n=16,k=16,dtype=f32".parse().unwrap();
    let timing = Timing {
        min_s: 1e-6,
        median_s: 2e-6,
        spread: 0.01,
        runs: 5,
    };
    let m = Measurement {
        timing,
        compile_time_s: 0.1,
        max_error: 0.0,
        emulated: false,
        gflops: w.flops() as f64 / timing.median_s / 1e9,
        cut_short: false,
        censored: false,
        allocation_spread: None,
        kernel: None,
    };
    TuningRecord::new(
        &w,
        "cpu",
        HardwareFingerprint::default(),
        Trace::new(),
        None,
        Ok(m),
    )
}

fn write(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("log-files");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}-{}.jsonl", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn a_valid_record_reads_back() {
    let mut r = record();
    // A time whose decimal form reads back to the same f64 (serde_json may be one ulp off
    // on others, which is no loss for a timestamp).
    r.time = 1_700_000_000.5;
    let line = serde_json::to_string(&r).unwrap();
    let path = write("valid", format!("{line}\n").as_bytes());
    let c = read_log(&path).unwrap();
    assert_eq!((c.records.len(), c.corrupt.len()), (1, 0));
    assert_eq!(c.records[0], r);
}

#[test]
fn records_that_contradict_themselves_are_corrupt_lines() {
    let good = serde_json::to_string(&record()).unwrap();
    let forged = [
        good.replace("gemm:m=16", "gemm:m=0"),
        good.replace("\"median_s\":2e-6", "\"median_s\":-1.0"),
        good.replacen("\"gflops\":", "\"gflops\":1e30,\"_\":", 1),
    ];
    for (i, f) in forged.iter().enumerate() {
        assert_ne!(f, &good, "forgery {i} changed nothing");
        let path = write(&format!("forged{i}"), format!("{good}\n{f}\n").as_bytes());
        let c = read_log(&path).unwrap();
        assert_eq!(c.records.len(), 1, "forgery {i}");
        assert_eq!(c.corrupt[0].line, 2);
        assert!(c.corrupt[0].last);
    }
}

#[test]
fn a_later_record_of_the_same_schedule_supersedes_the_earlier() {
    let timed = |median_s: f64, trace: Trace| {
        let mut r = record();
        r.trace = trace;
        if let Ok(m) = &mut r.result {
            m.gflops *= m.timing.median_s / median_s;
            m.timing.median_s = median_s;
        }
        r
    };
    let mut split = Trace::new();
    split.split("n", &[4]);
    let records = vec![
        timed(3.0, Trace::new()),
        timed(5.0, split.clone()),
        timed(1.0, Trace::new()),
    ];
    let kept = supersede(records.clone());
    // One record per schedule, the latest, in the order of the records kept.
    assert_eq!(kept, vec![records[1].clone(), records[2].clone()]);
    // Another machine's record of the same trace is another schedule.
    let mut elsewhere = timed(2.0, Trace::new());
    elsewhere.fingerprint.model = "another CPU".into();
    assert_eq!(supersede(vec![records[0].clone(), elsewhere]).len(), 2);
    // So is its latency with the weights packed beforehand.
    let prepacked = timed(0.5, Trace::new()).with_prepacked_weights(true);
    assert_eq!(supersede(vec![records[0].clone(), prepacked]).len(), 2);
    // Readers that want one record per schedule read the log this way.
    let lines: Vec<String> = records
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    let path = write("superseded", format!("{}\n", lines.join("\n")).as_bytes());
    let log = read_log(&path).unwrap();
    assert_eq!(log.records.len(), 3);
    assert_eq!(log.latest().records.len(), 2);
}

#[test]
fn a_tunes_timings_of_its_finalists_decide_its_best_over_the_search_timings() {
    let timed = |median_s: f64, trace: Trace, sampler: &str| {
        let mut r = record().with_sampler(sampler);
        r.trace = trace;
        if let Ok(m) = &mut r.result {
            m.gflops *= m.timing.median_s / median_s;
            m.timing.median_s = median_s;
            m.timing.min_s = median_s;
        }
        r
    };
    let mut direct = Trace::new();
    direct.split("n", &[4]);
    let mut lucky = Trace::new();
    lucky.split("m", &[4]);
    let w = "gemm:m=16,n=16,k=16,dtype=f32";
    let best = |records: Vec<TuningRecord>| {
        let lines: Vec<String> = records
            .iter()
            .map(|r| serde_json::to_string(r).unwrap())
            .collect();
        let path = write("finalists", format!("{}\n", lines.join("\n")).as_bytes());
        let log = read_log(&path).unwrap();
        let by_key = log
            .best()
            .values()
            .map(|r| r.trace.clone())
            .collect::<Vec<_>>();
        let of = log.best_of(w).map(|r| r.trace.clone());
        assert_eq!(by_key, of.clone().into_iter().collect::<Vec<_>>());
        of.unwrap()
    };
    // The search timed the lucky schedule fastest; timed again, the direct one is faster.
    let search = vec![
        timed(2.1e-3, lucky.clone(), "search"),
        timed(2.7e-3, direct.clone(), "search"),
    ];
    assert_eq!(best(search.clone()), lucky);
    let mut all = search.clone();
    all.push(timed(2.3e-3, lucky.clone(), REMEASURE_SAMPLER));
    all.push(timed(2.0e-3, direct.clone(), REMEASURE_SAMPLER));
    assert_eq!(best(all.clone()), direct);
    // A re-measurement beats a faster search timing even when it is slower than that one.
    let mut slow = search;
    slow.push(timed(2.5e-3, direct.clone(), REMEASURE_SAMPLER));
    assert_eq!(best(slow), direct);
    // A failed re-measurement is no best.
    let mut failed = timed(1.0e-3, Trace::new(), REMEASURE_SAMPLER);
    failed.result = Err(tessel_measure::MeasureError::new(
        tessel_measure::MeasureErrorKind::Compile,
        "gcc said no",
    ));
    all.push(failed);
    assert_eq!(best(all), direct);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn arbitrary_bytes_read_as_records_or_numbered_corrupt_lines(
        bytes in prop::collection::vec(any::<u8>(), 0..2048)
    ) {
        let path = write("bytes", &bytes);
        let c = read_log(&path).unwrap();
        let lines = bytes.split(|&b| b == b'\n').count();
        for bad in &c.corrupt {
            prop_assert!(bad.line >= 1 && bad.line <= lines);
        }
    }

    #[test]
    fn an_edited_record_is_either_valid_or_a_numbered_corrupt_line(
        at in 0usize..400, byte in any::<u8>(), cut in any::<bool>()
    ) {
        let line = serde_json::to_string(&record()).unwrap();
        let mut b = line.into_bytes();
        let at = at % b.len();
        // One line stays one line (a newline would make two, each read on its own).
        let byte = if byte == b'\n' { b'x' } else { byte };
        if cut { b.truncate(at) } else { b[at] = byte }
        b.push(b'\n');
        let path = write("edited", &b);
        let c = read_log(&path).unwrap();
        // A blank line is no line; anything else is one record or one corrupt line.
        let blank = b.iter().all(u8::is_ascii_whitespace);
        prop_assert_eq!(c.records.len() + c.corrupt.len(), usize::from(!blank));
        for r in &c.records {
            prop_assert!(r.validate().is_ok());
        }
    }
}
