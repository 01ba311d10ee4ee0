//! How a backend emits each tensorized call: the seam through which the allocation features
//! learn what the code generator will do with a call the schedule alone does not decide.
//!
//! Two schedules can allocate the same work to the same instruction and differ 30-fold in
//! time because one call reads its operands in place and the other gathers them element by
//! element into scratch tiles at every call (an operand whose index is not in the
//! instruction's layout, a padded tile). Which of the two happens is the code generator's
//! decision, so the backend that makes it answers here; tessel-features takes the answer
//! per call and never depends on a backend.
//!
//! ```
//! use tessel_measure::CallPath;
//!
//! let staged = CallPath::Staged { elements: 3 * 256 };
//! assert!(staged.is_staged() && !CallPath::Direct.is_staged());
//! ```

use std::collections::BTreeMap;

use serde::Serialize;
use tessel_ir::Program;

/// How one tensorized call is emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CallPath {
    /// Inside a register block: the accumulators stay in registers (AMX tiles, vector
    /// registers) across the reduction loop; operands are loaded in place.
    RegisterBlock,
    /// One call on operands already in the instruction's layout, loaded and stored in place.
    Direct,
    /// Operands gathered into the instruction's layout and the accumulator scattered back
    /// at every call: `elements` are copied element by element per call.
    Staged { elements: u64 },
}

impl CallPath {
    pub fn is_staged(&self) -> bool {
        matches!(self, CallPath::Staged { .. })
    }
}

/// The paths of a program's tensorized calls, by the trace step that tensorized each
/// ([`tessel_ir::TensorizedCall::step`]).
pub type CallPaths = BTreeMap<usize, CallPath>;

/// A backend's answer to "how will you emit this program's tensorized calls?".
pub trait CodePaths: Send + Sync {
    /// The path of every tensorized call of `program`. An error (the backend cannot build
    /// the program) says why; the features then leave the paths unknown.
    fn call_paths(&self, program: &Program) -> Result<CallPaths, String>;
}
