//! Errors of the search.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error("records file {path}: {source}")]
    Log {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot encode a record: {0}")]
    Encode(String),
    #[error("record of `{spec}`: {source}")]
    RecordWorkload {
        spec: String,
        #[source]
        source: tessel_ir::SpecError,
    },
    #[error("record of {workload}: its trace does not lower: {source}")]
    RecordTrace {
        workload: String,
        #[source]
        source: tessel_ir::ScheduleError,
    },
    #[error("no tasks to tune")]
    NoTasks,
}
