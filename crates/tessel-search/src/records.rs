//! Tuning records: JSON Lines, one measured candidate per line, append-only.
//!
//! A batch is written, flushed and synced before the next one is measured, so a kill loses at
//! most the batch in flight. Reading a log reports every corrupt or truncated line with its
//! number and skips it; it never fails the whole log.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tessel_ir::{IntrinsicResolver, Program, Trace, Workload};
use tessel_measure::{HardwareFingerprint, MeasureError, Measurement};

use crate::error::SearchError;

/// The version written into every record.
pub const TESSEL_VERSION: &str = concat!("tessel ", env!("CARGO_PKG_VERSION"));

/// One measured candidate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuningRecord {
    /// The workload spec (`gemm:m=...`).
    pub workload: String,
    /// `cpu`, `cpu:emulated`, `sim:a100`, ...
    pub target: String,
    pub fingerprint: HardwareFingerprint,
    pub trace: Trace,
    /// The instruction and mapping (`amx.tdpbf16ps: m <- (m) ...`), absent for the fallback.
    pub mapping: Option<String>,
    pub result: Result<Measurement, MeasureError>,
    pub version: String,
    /// Seconds since the Unix epoch.
    pub time: f64,
    /// How the candidate was chosen: `random` (a dataset's uniform sample of the whole
    /// space) or `search` (proposed by the evolutionary search: `tune`, or a dataset's search
    /// share). Absent in records written before samplers were recorded (datasets then were
    /// all random).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampler: Option<String>,
    /// Timed with the weights packed beforehand (`tune --prepacked-weights`): a root pack of
    /// the weights is not in the latency. Such records are not comparable with the others,
    /// so a run resumes only the records of its own kind.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prepacked_weights: bool,
}

impl TuningRecord {
    /// A record of `trace` of `workload` measured now on the machine `fingerprint` names.
    pub fn new(
        workload: &Workload,
        target: &str,
        fingerprint: HardwareFingerprint,
        trace: Trace,
        mapping: Option<String>,
        result: Result<Measurement, MeasureError>,
    ) -> Self {
        TuningRecord {
            workload: workload.to_string(),
            target: target.to_string(),
            fingerprint,
            trace,
            mapping,
            result,
            version: TESSEL_VERSION.to_string(),
            time: now(),
            sampler: None,
            prepacked_weights: false,
        }
    }

    /// The record of a candidate timed with its weights packed beforehand.
    pub fn with_prepacked_weights(mut self, prepacked: bool) -> Self {
        self.prepacked_weights = prepacked;
        self
    }

    /// The record with how its candidate was chosen (`random` or `search`).
    pub fn with_sampler(mut self, sampler: &str) -> Self {
        self.sampler = Some(sampler.to_string());
        self
    }

    /// The record's workload, parsed from its spec.
    pub fn parse_workload(&self) -> Result<Workload, SearchError> {
        self.workload
            .parse()
            .map_err(|source| SearchError::RecordWorkload {
                spec: self.workload.clone(),
                source,
            })
    }

    /// The program the record measured: its trace replayed on its workload and lowered.
    pub fn program(&self, intrinsics: &dyn IntrinsicResolver) -> Result<Program, SearchError> {
        let op = self.parse_workload()?.to_op();
        self.trace
            .lower(&op, intrinsics)
            .map_err(|source| SearchError::RecordTrace {
                workload: self.workload.clone(),
                source,
            })
    }

    /// Checks what a record claims against itself: a workload spec that parses within
    /// tessel's limits, a time, and a measurement whose latencies are positive and whose
    /// GFLOP/s are the workload's FLOPs over the median (a hand-edited or foreign record is
    /// refused, not learned from).
    pub fn validate(&self) -> Result<(), String> {
        let w = self.parse_workload().map_err(|e| e.to_string())?;
        if !(self.time.is_finite() && self.time >= 0.0) {
            return Err(format!("time {} is not a time", self.time));
        }
        if let Ok(m) = &self.result {
            let t = &m.timing;
            let positive = |x: f64| x.is_finite() && x > 0.0;
            if !(positive(t.median_s) && positive(t.min_s) && t.min_s <= t.median_s * 1.000_001) {
                return Err(format!(
                    "latencies min {} s, median {} s are not positive with min <= median",
                    t.min_s, t.median_s
                ));
            }
            let expected = w.flops() as f64 / t.median_s / 1e9;
            if !(m.gflops.is_finite() && (m.gflops - expected).abs() <= 0.01 * expected) {
                return Err(format!(
                    "{} GFLOP/s does not match {} FLOPs in {} s ({expected:.3} GFLOP/s)",
                    m.gflops,
                    w.flops(),
                    t.median_s
                ));
            }
        }
        Ok(())
    }

    /// Median latency in seconds, if the candidate ran.
    pub fn latency(&self) -> Option<f64> {
        self.result.as_ref().ok().map(|m| m.timing.median_s)
    }

    /// What identifies a measured candidate: workload, target, machine and trace, and
    /// whether its weights were packed beforehand (another latency of the same schedule).
    pub fn key(&self) -> RecordKey {
        let key = RecordKey::new(&self.workload, &self.target, &self.fingerprint, &self.trace);
        if self.prepacked_weights {
            RecordKey(format!("{}|prepacked-weights", key.0))
        } else {
            key
        }
    }
}

/// Identity of a candidate for resuming: the same key is never measured twice.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordKey(String);

impl RecordKey {
    pub fn new(workload: &str, target: &str, fp: &HardwareFingerprint, trace: &Trace) -> Self {
        RecordKey(format!(
            "{workload}|{target}|{}|{}",
            fp.key(),
            trace.to_json()
        ))
    }
}

/// `records` less every record that a later one of the same key (workload, target, machine,
/// trace) supersedes, in the order of the records kept. Logs are append-only, so a schedule
/// measured again (`remeasure`, after a code-generation fix) is appended, and readers that
/// want one label per schedule keep the latest.
pub fn supersede(records: Vec<TuningRecord>) -> Vec<TuningRecord> {
    supersede_by(records, |r| r)
}

/// [`supersede`] over items that each carry a record (with where it was read, say).
pub fn supersede_by<T>(items: Vec<T>, record: impl Fn(&T) -> &TuningRecord) -> Vec<T> {
    let mut seen = std::collections::HashSet::new();
    let mut kept: Vec<T> = items
        .into_iter()
        .rev()
        .filter(|i| seen.insert(record(i).key()))
        .collect();
    kept.reverse();
    kept
}

/// A line of a log that could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorruptLine {
    pub line: usize,
    pub reason: String,
    /// The file's last line: most likely torn by a writer that was killed or ran out of disk.
    pub last: bool,
}

/// Everything a log holds.
#[derive(Debug, Default)]
pub struct LogContents {
    pub records: Vec<TuningRecord>,
    pub corrupt: Vec<CorruptLine>,
}

impl LogContents {
    /// These contents less superseded records ([`supersede`]).
    pub fn latest(self) -> LogContents {
        LogContents {
            records: supersede(self.records),
            corrupt: self.corrupt,
        }
    }

    /// The fastest successful record per (workload, target), in key order. Where `tune`
    /// timed its finalists again ([`REMEASURE_SAMPLER`] records), the fastest of those:
    /// the search's own timings were one allocation each, and its fastest the luckiest.
    pub fn best(&self) -> BTreeMap<(String, String), &TuningRecord> {
        let mut best: BTreeMap<(String, String), &TuningRecord> = BTreeMap::new();
        for r in &self.records {
            let key = (r.workload.clone(), r.target.clone());
            if better(r, best.get(&key).copied()) {
                best.insert(key, r);
            }
        }
        best
    }

    /// The fastest successful record of `workload` (any target), as [`LogContents::best`]
    /// chooses.
    pub fn best_of(&self, workload: &str) -> Option<&TuningRecord> {
        self.records
            .iter()
            .filter(|r| r.workload == workload)
            .fold(None, |b, r| if better(r, b) { Some(r) } else { b })
    }
}

/// The sampler of the records `tune` appends when it times its finalists again after the
/// search, on several fresh allocations each.
pub const REMEASURE_SAMPLER: &str = "remeasure";

/// Whether `r` is a better best than `than`: a successful re-measurement beats any search
/// timing; otherwise the faster wins.
fn better(r: &TuningRecord, than: Option<&TuningRecord>) -> bool {
    let Some(lat) = r.latency() else {
        return false;
    };
    let Some(b) = than else { return true };
    let rank = |x: &TuningRecord| x.sampler.as_deref() == Some(REMEASURE_SAMPLER);
    match (rank(r), rank(b)) {
        (true, false) => true,
        (false, true) => false,
        _ => b.latency().is_none_or(|bl| lat < bl),
    }
}

/// Reads every record of `path` (gzip-compressed where the name ends in `.gz`, as the
/// committed datasets are); a missing file is an empty log.
pub fn read_log(path: &Path) -> Result<LogContents, SearchError> {
    let io = |source| SearchError::Log {
        path: path.to_path_buf(),
        source,
    };
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LogContents::default()),
        Err(e) => return Err(io(e)),
    };
    // A device or a pipe (`/dev/full`, `/dev/zero`) would be read without end.
    if !file.metadata().map_err(io)?.is_file() {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    let reader: Box<dyn std::io::Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let mut out = LogContents::default();
    let mut last_line = 0;
    for (i, line) in BufReader::new(reader).split(b'\n').enumerate() {
        let line = line.map_err(io)?;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let parsed = std::str::from_utf8(&line)
            .map_err(|e| e.to_string())
            .and_then(|s| serde_json::from_str::<TuningRecord>(s).map_err(|e| e.to_string()))
            .and_then(|r| r.validate().map(|()| r));
        match parsed {
            Ok(r) => out.records.push(r),
            Err(reason) => out.corrupt.push(CorruptLine {
                line: i + 1,
                reason,
                last: false,
            }),
        }
        last_line = i + 1;
    }
    if let Some(c) = out.corrupt.last_mut() {
        c.last = c.line == last_line;
    }
    Ok(out)
}

/// An open log to append batches to.
pub struct RecordLog {
    path: PathBuf,
    file: File,
}

impl RecordLog {
    /// Opens (or creates) `path` for appending. A last line cut short by a kill is ended, so
    /// that the next record starts on a line of its own.
    pub fn open(path: &Path) -> Result<Self, SearchError> {
        let io = |source| SearchError::Log {
            path: path.to_path_buf(),
            source,
        };
        if path.extension().is_some_and(|e| e == "gz") {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a compressed log is read-only: append to a plain .jsonl file",
            )));
        }
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        if path.exists() && !path.is_file() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file",
            )));
        }
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)
            .map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len > 0 {
            let mut last = [0u8; 1];
            file.seek(SeekFrom::Start(len - 1)).map_err(io)?;
            file.read_exact(&mut last).map_err(io)?;
            if last[0] != b'\n' {
                file.write_all(b"\n").map_err(io)?;
            }
        }
        Ok(RecordLog {
            path: path.to_path_buf(),
            file,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends a batch and syncs it to disk.
    pub fn append(&mut self, records: &[TuningRecord]) -> Result<(), SearchError> {
        let io = |source| SearchError::Log {
            path: self.path.clone(),
            source,
        };
        let mut text = String::new();
        for r in records {
            let line = serde_json::to_string(r).map_err(|e| SearchError::Encode(e.to_string()))?;
            text.push_str(&line);
            text.push('\n');
        }
        // One write per batch: a kill leaves whole lines, or one cut-short last line.
        self.file.write_all(text.as_bytes()).map_err(io)?;
        self.file.flush().map_err(io)?;
        self.file.sync_data().map_err(io)?;
        Ok(())
    }
}

/// Seconds since the Unix epoch, now.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
