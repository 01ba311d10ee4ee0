//! An analytic estimate of a program's run time from its allocation tokens alone: a roofline
//! over the compute statements and the traffic at each memory level, with the instruction's
//! latency bound when too few independent accumulators stay in registers.
//!
//! It is a ranker of its own in every comparison and the model's optional prior (with
//! `ModelConfig::prior` the model's score starts from it and learns the correction). It
//! reads only the tokens, so it applies to any stored record.
//! Magnitude columns are `log2(1 + x)` and loop products `log2`; this module undoes both.

use crate::schema::{Col, WIDTH};

/// Independent accumulators a vector FMA unit needs in flight to reach its peak: two ports times
/// a four-cycle latency on every x86 core tessel targets.
const VECTOR_ACCUMULATORS_IN_FLIGHT: f64 = 8.0;
/// The same for matrix instructions (AMX tiles, Tensor Core fragments).
const MATRIX_ACCUMULATORS_IN_FLIGHT: f64 = 2.0;
/// Bytes per cycle per core the L1 serves to loads and stores (two 32-byte loads and a store).
const L1_BYTES_PER_CYCLE: f64 = 64.0;
/// Bytes per cycle per core a packing or caching copy moves (compiled loops, often scalar).
const COPY_BYTES_PER_CYCLE: f64 = 24.0;
/// Bytes per cycle per core staged around a tensorized call whose operand is neither packed nor
/// in the instruction's layout, or is padded (element by element into a scratch tile).
const STAGING_BYTES_PER_CYCLE: f64 = 4.0;
/// A register-level access whose innermost stride reaches this many elements moves a whole
/// cache line per element.
const STRIDED_ELEMENTS: f64 = 16.0;
const CACHE_LINE_BYTES: f64 = 64.0;
/// FMA ports of one core: compiled (non-tensorized) code issues at most this many per cycle.
const FMA_PORTS: f64 = 2.0;

fn unlog(v: f32) -> f64 {
    (2f64.powf(v as f64) - 1.0).max(0.0)
}

fn iterations(v: f32) -> f64 {
    2f64.powf(v as f64).max(1.0)
}

/// The estimate's terms, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Breakdown {
    /// The compute statements at their peak, slowed where too few accumulators are in flight.
    pub compute: f64,
    /// Traffic to and from main memory at its bandwidth.
    pub memory: f64,
    /// Traffic into and out of L2.
    pub l2: f64,
    /// Traffic into and out of L1.
    pub l1: f64,
    /// Work that does not overlap the compute: packing, caching and store statements, operands
    /// staged call by call, and compiled loops' element-wise gathers.
    pub copies: f64,
}

impl Breakdown {
    /// Compute and traffic overlap (the slowest bounds the kernel); copies run apart from it.
    pub fn seconds(&self) -> f64 {
        self.compute.max(self.memory).max(self.l2).max(self.l1) + self.copies
    }
}

/// The estimated seconds of the program whose tokens (row-major, `WIDTH` columns each) are
/// `tokens`. Larger is slower; only the order among candidates of one task is meaningful.
/// Tokens of the wrong width or without a hardware token give `f64::INFINITY`.
pub fn estimate_seconds(tokens: &[f32]) -> f64 {
    breakdown(tokens).map_or(f64::INFINITY, |b| b.seconds())
}

/// The estimate's terms (`None` for tokens of the wrong width or without a hardware token).
pub fn breakdown(tokens: &[f32]) -> Option<Breakdown> {
    if tokens.is_empty() || tokens.len() % WIDTH != 0 {
        return None;
    }
    let rows: Vec<&[f32]> = tokens.chunks_exact(WIDTH).collect();
    let col = |t: &[f32], c: Col| t[c as usize];
    let hw = rows.iter().find(|t| col(t, Col::KindHardware) == 1.0)?;
    let clock = (col(hw, Col::HardwareClock) as f64).max(0.1) * 1e9;
    let cores = unlog(col(hw, Col::HardwareCores)).max(1.0);
    let memory_bw = unlog(col(hw, Col::HardwareMemoryBandwidth)).max(1.0) * 1e9;
    let l2_bw = unlog(col(hw, Col::HardwareL2Bandwidth)).max(1.0) * 1e9;

    // Accumulator bytes held in registers: how many independent chains the kernel runs.
    let accumulator_in_registers = rows
        .iter()
        .filter(|t| {
            col(t, Col::KindData) == 1.0
                && col(t, Col::DataLevelRegister) == 1.0
                && col(t, Col::DataRoleAccumulator) == 1.0
        })
        .map(|t| unlog(col(t, Col::DataFootprint)))
        .fold(0.0, f64::max);

    let statements: Vec<&[f32]> = rows
        .iter()
        .copied()
        .filter(|t| col(t, Col::KindCompute) == 1.0)
        .collect();
    // Cores a statement runs on: its parallel loops', at most the machine's.
    let cores_of = |t: &[f32]| iterations(col(t, Col::ComputeParallel)).min(cores);
    let used_cores = statements.iter().map(|t| cores_of(t)).fold(1.0, f64::max);
    let compiled_only = !statements
        .iter()
        .any(|t| col(t, Col::ComputeTensorized) == 1.0);

    let mut compute = 0.0;
    let mut copies = 0.0;
    for &t in &statements {
        let work = unlog(col(t, Col::ComputeFlops));
        let used = cores_of(t);
        if col(t, Col::ComputeCopy) == 1.0 || col(t, Col::ComputeStore) == 1.0 {
            copies += work / (COPY_BYTES_PER_CYCLE * clock * used);
            continue;
        }
        let mut peak = unlog(col(t, Col::ComputePeak)).max(0.25);
        let efficiency;
        if col(t, Col::ComputeTensorized) == 0.0 {
            // Compiled code: the lanes its vectorized loops really span, and as many
            // independent chains as unrolling gives it (a reduction carried in one register
            // waits on the FMA latency).
            let lanes = iterations(col(t, Col::ComputeVectorized))
                .min(unlog(col(t, Col::ComputeInstrN)).max(1.0));
            peak = peak.min(FMA_PORTS * lanes);
            let chains = iterations(col(t, Col::ComputeUnrolled));
            efficiency = (chains / VECTOR_ACCUMULATORS_IN_FLIGHT).clamp(0.125, 1.0);
        } else {
            let (m, n, k) = (
                unlog(col(t, Col::ComputeInstrM)).max(1.0),
                unlog(col(t, Col::ComputeInstrN)).max(1.0),
                unlog(col(t, Col::ComputeInstrK)).max(1.0),
            );
            let acc_bytes = (col(t, Col::ComputeAccBytes) as f64).max(1.0);
            let needed = if m > 1.0 {
                MATRIX_ACCUMULATORS_IN_FLIGHT
            } else {
                VECTOR_ACCUMULATORS_IN_FLIGHT
            };
            let guarded = [Col::ComputeUtilM, Col::ComputeUtilN, Col::ComputeUtilK]
                .iter()
                .any(|&c| col(t, c) < 1.0);
            if guarded {
                // A padded call stages every operand element by element (zeros where a guard
                // fails), scatters the accumulator back, and blocks nothing in registers.
                let input_bytes = (col(t, Col::ComputeInputBytes) as f64).max(1.0);
                let staged = (m * k + k * n) * input_bytes + 2.0 * m * n * acc_bytes;
                let calls = unlog(col(t, Col::ComputeInvocations));
                copies += calls * staged / (STAGING_BYTES_PER_CYCLE * clock * used);
                efficiency = 1.0 / needed;
            } else {
                let chains = accumulator_in_registers / (m * n * acc_bytes);
                efficiency = (chains / needed).clamp(1.0 / needed, 1.0);
            }
        }
        compute += work / (2.0 * peak * efficiency * clock * used);
    }

    let (mut memory, mut l2, mut l1) = (0.0, 0.0, 0.0);
    for t in rows.iter().filter(|t| col(t, Col::KindData) == 1.0) {
        let moved = unlog(col(t, Col::DataBytesIn)) + unlog(col(t, Col::DataBytesOut));
        if col(t, Col::DataLevelMemory) == 1.0 {
            memory += moved / memory_bw;
            // An operator input transformed in place (not a packed copy, whose copy statement
            // counts already) is staged call by call; every level repeats the figure, so
            // main memory's token alone counts it.
            if col(t, Col::DataRoleInput) == 1.0 {
                copies += unlog(col(t, Col::DataTransformBytes))
                    / (STAGING_BYTES_PER_CYCLE * clock * used_cores);
            }
        } else if col(t, Col::DataLevelL2) == 1.0 {
            l2 += moved / l2_bw;
        } else if col(t, Col::DataLevelL1) == 1.0 {
            l1 += moved / (L1_BYTES_PER_CYCLE * clock * cores);
        } else if compiled_only
            && col(t, Col::DataLevelRegister) == 1.0
            && col(t, Col::DataContiguous) == 0.0
            && unlog(col(t, Col::DataStride)) >= STRIDED_ELEMENTS
        {
            // Compiled loops fill registers element by element from addresses a cache line or
            // more apart: every element costs a line from L2. (A tensorized call's broadcast
            // operand strides too, but one element feeds a whole vector of work.)
            let elements = moved / (col(t, Col::DataDtypeBytes) as f64).max(1.0);
            copies += elements * CACHE_LINE_BYTES / l2_bw;
        }
    }
    Some(Breakdown {
        compute,
        memory,
        l2,
        l1,
        copies,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tessel_ir::{Trace, Workload};

    use super::*;
    use crate::{Target, extract};

    fn seconds(trace: &Trace, workload: &str) -> f64 {
        let op = workload.parse::<Workload>().unwrap().to_op();
        let program = trace.apply(&op, &()).unwrap().lower().unwrap();
        let target = Target::cpu(
            "avx2",
            &["avx2".into(), "fma".into()],
            1,
            &BTreeMap::new(),
            None,
        );
        estimate_seconds(&extract(&program, &target).unwrap().tokens)
    }

    proptest::proptest! {
        /// Any tokens at all (stored records can be corrupt): an estimate, never a panic, and
        /// never negative.
        #[test]
        fn arbitrary_tokens_never_panic(
            tokens in proptest::collection::vec(proptest::num::f32::ANY, 0..4 * WIDTH),
            hardware_row in 0usize..4,
        ) {
            let mut tokens = tokens;
            if let Some(t) = tokens.get_mut(hardware_row * WIDTH + Col::KindHardware as usize) {
                *t = 1.0;
            }
            let s = estimate_seconds(&tokens);
            proptest::prop_assert!(s.is_nan() || s >= 0.0, "{}", s);
        }
    }

    #[test]
    fn malformed_tokens_estimate_infinity() {
        assert_eq!(estimate_seconds(&[]), f64::INFINITY);
        assert_eq!(estimate_seconds(&[0.0; 3]), f64::INFINITY);
        assert_eq!(estimate_seconds(&vec![0.0; WIDTH]), f64::INFINITY);
    }

    #[test]
    fn vectorized_gemm_is_estimated_faster_than_scalar_and_bigger_work_slower() {
        let gemm = "gemm:m=64,n=64,k=64,dtype=f32";
        let scalar = seconds(&Trace::new(), gemm);
        let mut vector = Trace::new();
        vector
            .split("m", &[8])
            .split("n", &[8])
            .reorder(&["m.0", "n.0", "k", "m.1", "n.1"]);
        vector.vectorize("n.1");
        let vectorized = seconds(&vector, gemm);
        assert!(vectorized.is_finite() && scalar.is_finite());
        assert!(vectorized < scalar, "{vectorized} vs {scalar}");
        let bigger = seconds(&Trace::new(), "gemm:m=128,n=64,k=64,dtype=f32");
        assert!(bigger > scalar, "{bigger} vs {scalar}");
    }
}
