//! Errors of the search.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error("tuning log {path}: {source}")]
    Log {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot encode a record: {0}")]
    Encode(String),
    #[error("no tasks to tune")]
    NoTasks,
}
