//! tessel-search: finds fast schedules.
//!
//! - [`Space`]: the schedule space of an operator: every mapping onto every usable instruction
//!   (multi-level tiling, register blocks within the register file, B packing, loop order,
//!   parallelism, unrolling) and the non-tensorized fallback. Points are [`Sketch`]es that
//!   become ordinary tessel-ir traces; capacity checks reject impossible ones before any
//!   compilation.
//! - [`Tuner`]: evolutionary search (sample, mutate, rank with a
//!   [`CostModel`](tessel_measure::CostModel), measure the top plus an epsilon share of random
//!   candidates, learn), across the tasks of a network with an Ansor-style task scheduler.
//! - [`records`]: append-only JSON Lines tuning logs that survive a kill and resume.
//!
//! ```
//! use tessel_search::{InstructionSet, Space, rng::Rng};
//!
//! let op = "gemm:m=64,n=64,k=64,dtype=f32".parse::<tessel_ir::Workload>().unwrap().to_op();
//! let space = Space::new(&op, &InstructionSet::Only(vec!["avx2.vfmadd231ps".into()]));
//! let mut rng = Rng::new(7);
//! let sketch = space.sample(&mut rng);
//! let (trace, program) = space.lower(&sketch).unwrap();
//! assert!(!trace.steps.is_empty());
//! # let _ = program;
//! ```

mod error;
pub mod records;
pub mod rng;
mod search;
mod space;

pub use error::SearchError;
pub use records::{REMEASURE_SAMPLER, RecordLog, TuningRecord, read_log, supersede, supersede_by};
pub use search::{
    Best, CUT_SHORT_FACTOR, CUT_SHORT_FLOOR_S, FINALISTS_BY_EACH, Progress, RandomModel,
    SearchOptions, Stats, Task, Tuner, cut_short_budget,
};
pub use space::gpu::{GPU_MAX_SHARED_BYTES, GPU_MAX_THREADS};
pub use space::{CPU_INSTRUCTIONS, InstructionSet, Sketch, Space, SpaceMapping, max_accumulators};
