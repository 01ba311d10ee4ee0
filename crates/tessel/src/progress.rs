//! How long pipelines report what they are doing. The library prints nothing; a CLI draws
//! bars from these calls (xtask uses indicatif), a service may log them, a test ignores them.

/// Receives a pipeline's progress. Every method has a default that does nothing.
pub trait Progress {
    /// A phase of `total` steps of `unit` (trials, schedules, epochs) begins.
    fn start(&mut self, unit: &str, total: u64) {
        let _ = (unit, total);
    }
    /// `done` of the phase's steps are done; `message` says what is being worked on.
    fn update(&mut self, done: u64, message: &str) {
        let _ = (done, message);
    }
    /// A line worth showing a person (a skipped instruction, a corrupt record, an epoch).
    fn note(&mut self, line: &str) {
        let _ = line;
    }
    /// The phase ended.
    fn finish(&mut self) {}
}

/// Ignores progress.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}

/// Collects the notes (for tests and for callers that show them at the end).
#[derive(Clone, Debug, Default)]
pub struct Notes(pub Vec<String>);

impl Progress for Notes {
    fn note(&mut self, line: &str) {
        self.0.push(line.to_string());
    }
}
