//! The loop order of the naive C kernel that checks candidates too large for the interpreter.
//!
//! The operator's own order puts the reduction innermost. For a GEMM with `B[k, n]` that
//! loop reads B a row apart at every step: the naive reference of LLaMA prefill's 46 GFLOP
//! GEMM ran past the worker's 60 s timeout, so `measure` could not check it at all. Moving
//! the loop that walks the most operands contiguously innermost lets gcc vectorize it,
//! while each output element still sums its products in the same order: the result is the
//! naive nest's.

use tessel_ir::{ComputeOp, IterKind, Operand, Trace};

/// The reference's schedule: the operator's loops in their order, with the best loop for the
/// innermost position moved there. Only a spatial loop moves (moving a reduction would
/// change the order of the sums); the current innermost loop stays unless another does
/// strictly better: more operands read or written at a stride of 0 or 1, then a longer
/// extent.
pub fn naive_order(op: &ComputeOp) -> Trace {
    let vars = &op.iter_vars;
    let Some(last) = vars.len().checked_sub(1) else {
        return Trace::new();
    };
    let operands: Vec<&Operand> = op.inputs.iter().chain([&op.output]).collect();
    let score = |v: usize| {
        let contiguous = operands
            .iter()
            .filter(|o| o.stride(v).unsigned_abs() <= 1)
            .count();
        (contiguous, vars[v].extent)
    };
    let best = (0..last)
        .filter(|&v| vars[v].kind == IterKind::Spatial)
        .filter(|&v| score(v) > score(last))
        .max_by_key(|&v| (score(v), v));
    let Some(best) = best else {
        return Trace::new();
    };
    let order: Vec<&str> = (0..vars.len())
        .filter(|&v| v != best)
        .chain([best])
        .map(|v| vars[v].name.as_str())
        .collect();
    let mut t = Trace::new();
    t.reorder(&order);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(spec: &str) -> Trace {
        let w: tessel_ir::Workload = spec.parse().expect("spec");
        naive_order(&w.to_op())
    }

    fn reordered(order: &[&str]) -> Trace {
        let mut t = Trace::new();
        t.reorder(order);
        t
    }

    #[test]
    fn the_loop_that_walks_memory_contiguously_goes_innermost() {
        // gemm reads B[k, n]: n walks B and C.
        assert_eq!(
            order("gemm:m=64,n=64,k=64,dtype=f32"),
            reordered(&["m", "k", "n"])
        );
        // dense reads W[n, k]: k already walks A and W.
        assert_eq!(order("dense:m=64,n=64,k=64,dtype=f32"), Trace::new());
        assert_eq!(
            order("bmm:b=2,m=8,n=8,k=8,dtype=f32"),
            reordered(&["b", "m", "k", "n"])
        );
    }
}
