//! Property tests: every program that lowers computes what the operator's naive definition
//! computes; invalid traces are rejected with an error, never a panic.

mod common;

use common::*;
use proptest::prelude::*;
use tessel_ir::{DType, GpuAxis, LayoutTransform, Scope, Step, Trace, Workload};

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn one_element_of_the_reference_is_the_reference_at_that_element(w in arb_workload(), seed in any::<u64>()) {
        let op = w.to_op();
        let inputs = op.random_inputs(seed);
        let whole = op.reference(&inputs).unwrap();
        let shape = &op.output.tensor.shape;
        let mut index = vec![0i64; shape.len()];
        for at in 0..whole.data.len() {
            let mut rest = at as u64;
            for d in (0..shape.len()).rev() {
                index[d] = (rest % shape[d]) as i64;
                rest /= shape[d];
            }
            prop_assert_eq!(op.reference_at(&inputs, &index).unwrap(), whole.data[at], "{} at {:?}", w, index);
        }
        index[0] = shape[0] as i64;
        prop_assert!(op.reference_at(&inputs, &index).is_err());
    }

    #[test]
    fn random_valid_traces_match_the_reference(w in arb_workload(), seed in any::<u64>()) {
        let op = w.to_op();
        let trace = random_valid_trace(&op, seed);
        if let Err(e) = check_against_reference(&op, &trace, seed) {
            panic!("{w}: {e}");
        }
    }

    #[test]
    fn random_steps_never_panic_and_what_lowers_is_correct(
        w in arb_workload(),
        seed in any::<u64>(),
        steps in prop::collection::vec(arb_step(), 0..8),
    ) {
        let op = w.to_op();
        // Start from a valid trace and append arbitrary, mostly invalid, steps.
        let mut trace = random_valid_trace(&op, seed);
        trace.steps.extend(steps);
        match trace.apply(&op, &TestIntrinsics) {
            Err(e) => prop_assert!(e.to_string().contains("trace step")),
            Ok(schedule) => {
                if schedule.lower().is_ok()
                    && let Err(e) = check_against_reference(&op, &trace, seed)
                {
                    panic!("{w}: {e}");
                }
            }
        }
    }

    #[test]
    fn spec_strings_round_trip(w in arb_workload()) {
        let s = w.to_string();
        let back: Workload = s.parse().unwrap();
        prop_assert_eq!(back, w);
        prop_assert_eq!(back.to_string(), s);
    }

    #[test]
    fn traces_round_trip_through_json_and_bincode(w in arb_workload(), seed in any::<u64>(),
                                                  extra in prop::collection::vec(arb_step(), 0..4)) {
        let mut trace = random_valid_trace(&w.to_op(), seed);
        trace.steps.extend(extra);
        let json = trace.to_json();
        prop_assert_eq!(&Trace::from_json(&json).unwrap(), &trace);
        let bytes = trace.to_bincode().unwrap();
        prop_assert_eq!(&Trace::from_bincode(&bytes).unwrap(), &trace);
    }
}

fn arb_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("m".to_string()),
        Just("n".to_string()),
        Just("k".to_string()),
        Just("c".to_string()),
        Just("p.0".to_string()),
        Just("m.1".to_string()),
        Just("k.0".to_string()),
        Just("n.1".to_string()),
        Just("nope".to_string()),
    ]
}

fn arb_step() -> impl Strategy<Value = Step> {
    let scope = prop_oneof![Just("local"), Just("shared"), Just("global")]
        .prop_map(|s| Scope::new(s).unwrap());
    prop_oneof![
        (arb_name(), prop::collection::vec(0u64..5, 0..3))
            .prop_map(|(target, factors)| Step::Split { target, factors }),
        prop::collection::vec(arb_name(), 0..4).prop_map(|order| Step::Reorder { order }),
        prop::collection::vec(arb_name(), 0..3).prop_map(|loops| Step::Fuse { loops }),
        arb_name().prop_map(|target| Step::Parallel { target }),
        arb_name().prop_map(|target| Step::Vectorize { target }),
        arb_name().prop_map(|target| Step::Unroll { target }),
        arb_name().prop_map(|target| Step::Bind {
            target,
            axis: GpuAxis::ThreadX
        }),
        (0usize..3, scope.clone(), prop::option::of(arb_name()))
            .prop_map(|(operand, scope, at)| Step::CacheRead { operand, scope, at }),
        (scope, prop::option::of(arb_name()))
            .prop_map(|(scope, at)| Step::CacheWrite { scope, at }),
        (
            0usize..3,
            0usize..5,
            0u64..4,
            prop::collection::vec(0usize..6, 0..6)
        )
            .prop_map(|(operand, d, f, order)| Step::Pack {
                operand,
                layout: LayoutTransform {
                    splits: vec![(d, f)],
                    order
                },
            }),
        (
            0usize..3,
            prop_oneof![Just(DType::F32), Just(DType::I16), Just(DType::BF16)]
        )
            .prop_map(|(operand, dtype)| Step::Cast { operand, dtype }),
        (arb_name(), arb_name(), arb_name()).prop_map(|(a, b, c)| Step::Tensorize {
            intrinsic: "mma.2x2x2.bf16.bf16".into(),
            bindings: vec![("i".into(), a), ("j".into(), b), ("kk".into(), c)],
            operands: vec![0, 1],
        }),
        (arb_name(), 0u32..20).prop_map(|(target, stages)| Step::Pipeline { target, stages }),
    ]
}
