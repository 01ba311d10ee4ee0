//! The ablation's features: a schedule as the sequence of its primitives, one token per trace
//! step, as TLP encodes Ansor's schedules (primitive type, the loops it names, its numeric
//! parameters), with no knowledge of the program the steps produce, of the instruction's
//! shape or of the memory hierarchy. Comparing a model trained on these with one trained on
//! allocation features, same network, same records, is what shows whether the allocation
//! view earns its keep.

use tessel_ir::{Step, Trace};

/// Step kinds, in one-hot order.
const KINDS: usize = 14;
/// Buckets of the hashed variable and instruction names.
const NAME_BUCKETS: usize = 8;
/// Numeric parameter slots (split factors, operand, stages, ...).
const PARAMS: usize = 4;

/// Columns of a primitive token: kind one-hot, the named loop's variable (hashed one-hot) and
/// split level, the numeric parameters, the scope (local / shared), the instruction (hashed
/// one-hot), the step's position in the trace.
pub const PRIMITIVE_WIDTH: usize = KINDS + NAME_BUCKETS + 1 + PARAMS + 2 + NAME_BUCKETS + 1;

fn kind(step: &Step) -> usize {
    match step {
        Step::Split { .. } => 0,
        Step::Reorder { .. } => 1,
        Step::Fuse { .. } => 2,
        Step::Parallel { .. } => 3,
        Step::Vectorize { .. } => 4,
        Step::Unroll { .. } => 5,
        Step::Bind { .. } => 6,
        Step::CacheRead { .. } => 7,
        Step::CacheWrite { .. } => 8,
        // A padded copy is a pack in the tensor's own layout (no kind of its own: the
        // primitive tokens' width stays that of the models trained on them).
        Step::Pack { .. } | Step::Pad { .. } => 9,
        Step::Cast { .. } => 10,
        Step::Tensorize { .. } => 11,
        Step::Pipeline { .. } => 12,
        Step::Annotate { .. } => 13,
    }
}

/// FNV-1a: a stable hash (the std hasher may change between releases).
fn bucket(name: &str) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % NAME_BUCKETS as u64) as usize
}

fn magnitude(x: u64) -> f32 {
    (1.0 + x as f64).log2() as f32
}

/// `m.2` -> (`m`, 2); `m` -> (`m`, 0).
fn loop_name(name: &str) -> (&str, u64) {
    match name.split_once('.') {
        Some((base, level)) => (base, level.parse().unwrap_or(0)),
        None => (name, 0),
    }
}

/// The trace's tokens, `PRIMITIVE_WIDTH` columns each, one per step (at least one token: an
/// empty trace, the naive nest, is one all-zero token).
pub fn primitive_tokens(trace: &Trace) -> Vec<f32> {
    let mut out = Vec::with_capacity(trace.steps.len().max(1) * PRIMITIVE_WIDTH);
    let n = trace.steps.len().max(1) as f32;
    for (i, step) in trace.steps.iter().enumerate() {
        let mut t = [0f32; PRIMITIVE_WIDTH];
        t[kind(step)] = 1.0;
        let name_at = KINDS;
        let level_at = name_at + NAME_BUCKETS;
        let params_at = level_at + 1;
        let scope_at = params_at + PARAMS;
        let intrinsic_at = scope_at + 2;
        let position_at = intrinsic_at + NAME_BUCKETS;
        let name = |t: &mut [f32; PRIMITIVE_WIDTH], target: &str| {
            let (base, level) = loop_name(target);
            t[name_at + bucket(base)] = 1.0;
            t[level_at] = level as f32;
        };
        let params = |t: &mut [f32; PRIMITIVE_WIDTH], values: &[u64]| {
            for (slot, &v) in values.iter().take(PARAMS).enumerate() {
                t[params_at + slot] = magnitude(v);
            }
        };
        let scope = |t: &mut [f32; PRIMITIVE_WIDTH], s: &str| {
            if s == "shared" {
                t[scope_at + 1] = 1.0;
            } else {
                t[scope_at] = 1.0;
            }
        };
        match step {
            Step::Split { target, factors } => {
                name(&mut t, target);
                params(&mut t, factors);
            }
            Step::Reorder { order } => {
                if let Some(first) = order.first() {
                    name(&mut t, first);
                }
                params(&mut t, &[order.len() as u64]);
            }
            Step::Fuse { loops } => {
                if let Some(first) = loops.first() {
                    name(&mut t, first);
                }
                params(&mut t, &[loops.len() as u64]);
            }
            Step::Parallel { target } | Step::Vectorize { target } | Step::Unroll { target } => {
                name(&mut t, target)
            }
            Step::Bind { target, .. } => name(&mut t, target),
            Step::CacheRead {
                operand,
                scope: s,
                at,
            } => {
                if let Some(at) = at {
                    name(&mut t, at);
                }
                params(&mut t, &[*operand as u64]);
                scope(&mut t, s.as_str());
            }
            Step::CacheWrite { scope: s, at } => {
                if let Some(at) = at {
                    name(&mut t, at);
                }
                scope(&mut t, s.as_str());
            }
            Step::Pack { operand, layout } => {
                let factors: Vec<u64> = layout.splits.iter().map(|s| s.1).collect();
                let mut p = vec![*operand as u64, layout.splits.len() as u64];
                p.extend(factors);
                params(&mut t, &p);
            }
            Step::Pad { operand } => params(&mut t, &[*operand as u64, 0]),
            Step::Cast { operand, dtype } => {
                params(&mut t, &[*operand as u64, dtype.bytes() as u64])
            }
            Step::Tensorize {
                intrinsic,
                bindings,
                ..
            } => {
                t[intrinsic_at + bucket(intrinsic)] = 1.0;
                if let Some((_, first)) = bindings.first() {
                    name(&mut t, first);
                }
                params(&mut t, &[bindings.len() as u64]);
            }
            Step::Pipeline { target, stages } => {
                name(&mut t, target);
                params(&mut t, &[*stages as u64]);
            }
            Step::Annotate { target, .. } => name(&mut t, target),
        }
        t[position_at] = i as f32 / n;
        out.extend_from_slice(&t);
    }
    if out.is_empty() {
        out.resize(PRIMITIVE_WIDTH, 0.0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_token_per_step_naming_its_kind_and_factors() {
        let mut t = Trace::new();
        t.split("m", &[4, 8])
            .reorder(&["m.0", "n", "k", "m.1", "m.2"]);
        t.vectorize("m.2");
        let x = primitive_tokens(&t);
        assert_eq!(x.len(), 3 * PRIMITIVE_WIDTH);
        let split = &x[..PRIMITIVE_WIDTH];
        assert_eq!(split[0], 1.0);
        let params_at = KINDS + NAME_BUCKETS + 1;
        assert_eq!(split[params_at], 5f32.log2());
        assert_eq!(split[params_at + 1], 9f32.log2());
        let vectorize = &x[2 * PRIMITIVE_WIDTH..];
        assert_eq!(vectorize[4], 1.0);
        assert_eq!(
            vectorize[KINDS + NAME_BUCKETS],
            2.0,
            "the loop's split level"
        );
    }

    #[test]
    fn the_naive_nest_is_one_zero_token() {
        assert_eq!(primitive_tokens(&Trace::new()), vec![0.0; PRIMITIVE_WIDTH]);
    }
}
