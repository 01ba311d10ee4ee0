//! The façade's error: what went wrong, with the context it happened in.

use std::fmt::Display;

/// What a pipeline returns.
pub type Result<T, E = Error> = std::result::Result<T, E>;

type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A pipeline's error. `Display` shows this level only; the `source()` chain carries the
/// rest (print it with `{:#}` through anyhow, or walk it).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An option or an input the caller gave is wrong: the message names it and why.
    #[error("{0}")]
    Invalid(String),
    /// An error of one of tessel's crates (or of I/O), with what was being done.
    #[error("{context}")]
    Context {
        /// What was being done, e.g. "--model m.safetensors".
        context: String,
        /// The cause.
        #[source]
        source: Source,
    },
    /// An error of one of tessel's crates, as it is.
    #[error(transparent)]
    Other(Source),
}

impl Error {
    /// An `Invalid` error with this message.
    pub fn invalid(message: impl Display) -> Self {
        Error::Invalid(message.to_string())
    }
}

macro_rules! from_errors {
    ($($t:ty),* $(,)?) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Self {
                Error::Other(Box::new(e))
            }
        }
    )*};
}

from_errors!(
    std::io::Error,
    serde_json::Error,
    tessel_ir::SpecError,
    tessel_ir::NetworkError,
    tessel_ir::ScheduleError,
    tessel_ir::TraceIoError,
    tessel_intrin::MatchError,
    tessel_intrin::UnknownPlatform,
    tessel_features::FeatureError,
    tessel_model::ModelError,
    tessel_search::SearchError,
    tessel_cpu::CpuError,
    tessel_cpu::CodegenError,
    tessel_cpu::CompileError,
    tessel_gpu::GpuError,
    tessel_measure::MeasureError,
);

/// Adds what was being done to an error, as anyhow's `Context` does.
pub trait Context<T> {
    /// Wraps the error with `context`.
    fn context(self, context: impl Display) -> Result<T>;
    /// Wraps the error with the context `f` builds (only on failure).
    fn with_context<C: Display>(self, f: impl FnOnce() -> C) -> Result<T>;
}

impl<T, E: Into<Source>> Context<T> for std::result::Result<T, E> {
    fn context(self, context: impl Display) -> Result<T> {
        self.map_err(|e| Error::Context {
            context: context.to_string(),
            source: e.into(),
        })
    }
    fn with_context<C: Display>(self, f: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|e| Error::Context {
            context: f().to_string(),
            source: e.into(),
        })
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, context: impl Display) -> Result<T> {
        self.ok_or_else(|| Error::Invalid(context.to_string()))
    }
    fn with_context<C: Display>(self, f: impl FnOnce() -> C) -> Result<T> {
        self.ok_or_else(|| Error::Invalid(f().to_string()))
    }
}

/// Returns an [`Error::Invalid`] built like `format!`.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::Error::Invalid(format!($($arg)*)))
    };
}
pub(crate) use bail;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_keeps_the_cause_as_the_source() {
        let e: Result<u32> = "x"
            .parse::<u32>()
            .with_context(|| format!("--trials `{}`", "x"));
        let e = e.unwrap_err();
        assert_eq!(e.to_string(), "--trials `x`");
        let cause = std::error::Error::source(&e).map(|s| s.to_string());
        assert_eq!(cause.as_deref(), Some("invalid digit found in string"));
    }
}
