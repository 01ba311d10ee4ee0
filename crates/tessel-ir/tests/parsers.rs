//! Every parser a user or a file reaches, fed arbitrary input: it answers with a value or an
//! error, never a panic, and what parses prints back to itself.

use proptest::prelude::*;
use tessel_ir::{MAX_EXTENT, SpecError, Trace, Workload};

/// Strings near the spec grammar (kinds, keys, numbers, separators, odd characters), and
/// arbitrary ones.
fn spec_like() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("gemm:".to_string()),
        Just("conv2d:".to_string()),
        Just("bmm:".to_string()),
        Just("dense:".to_string()),
        Just("m=".to_string()),
        Just("n=".to_string()),
        Just("k=".to_string()),
        Just("b=".to_string()),
        Just("h=".to_string()),
        Just("w=".to_string()),
        Just("c=".to_string()),
        Just("r=".to_string()),
        Just("s=".to_string()),
        Just("pad=".to_string()),
        Just("stride=".to_string()),
        Just("dilation=".to_string()),
        Just("dtype=f32".to_string()),
        Just("dtype=u8".to_string()),
        Just("wdtype=i8".to_string()),
        Just("epilogue=bias+relu".to_string()),
        Just(",".to_string()),
        Just("18446744073709551615".to_string()),
        Just("9223372036854775808".to_string()),
        Just("+64".to_string()),
        Just(" ".to_string()),
        Just("\u{7}".to_string()),
        (0u64..5000).prop_map(|n| n.to_string()),
        "\\PC{0,4}",
    ];
    prop_oneof![
        prop::collection::vec(token, 0..16).prop_map(|v| v.concat()),
        any::<String>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn workload_specs_parse_or_name_the_problem(s in spec_like()) {
        match s.parse::<Workload>() {
            Ok(w) => {
                // What parses is within the limits and prints back to exactly the input
                // (or to its canonical form, which parses to the same workload).
                prop_assert!(w.validate().is_ok());
                let printed = w.to_string();
                prop_assert_eq!(printed.parse::<Workload>().unwrap(), w);
                prop_assert!(w.flops() > 0);
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(!msg.is_empty());
                // Control characters never reach a message raw.
                prop_assert!(!msg.chars().any(|c| c.is_control() && c != '\n'), "{msg:?}");
            }
        }
    }

    #[test]
    fn trace_json_parses_or_errs(s in any::<String>()) {
        let _ = Trace::from_json(&s);
    }

    #[test]
    fn trace_bincode_parses_or_errs(b in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = Trace::from_bincode(&b);
    }

    #[test]
    fn huge_extents_are_refused_with_the_limit(m in MAX_EXTENT + 1..u64::MAX) {
        let e = format!("gemm:m={m},n=8,k=8,dtype=f32").parse::<Workload>().unwrap_err();
        prop_assert!(matches!(e, SpecError::TooLarge { .. }), "{e}");
        prop_assert!(e.to_string().contains(&MAX_EXTENT.to_string()));
    }
}

#[test]
fn specs_with_overflowing_or_oversized_values_are_refused() {
    for spec in [
        "conv2d:n=1,h=8,w=8,c=8,k=8,r=3,s=3,pad=18446744073709551615,dtype=f32",
        "conv2d:n=1,h=8,w=8,c=8,k=8,r=3,s=3,pad=9223372036854775808,dtype=f32",
        "conv2d:n=1,h=8,w=8,c=8,k=8,r=3,s=3,dilation=9223372036854775808,dtype=f32",
        "gemm:m=18446744073709551615,n=64,k=64,dtype=f32",
        "gemm:m=1000000000,n=1,k=1,dtype=f32",
        "gemm:m=2000000,n=2000000,k=1,dtype=f32",
        "bmm:b=100000,m=1000,n=1000,k=1000,dtype=f32",
    ] {
        let e = spec.parse::<Workload>().unwrap_err();
        assert!(matches!(e, SpecError::TooLarge { .. }), "{spec}: {e}");
    }
    // Large but possible: a LLaMA-7B MLP weight.
    assert!(
        "dense:m=512,n=11008,k=4096,dtype=f32"
            .parse::<Workload>()
            .is_ok()
    );
}

#[test]
fn specs_print_back_unchanged_so_odd_forms_are_refused() {
    for spec in [
        "gemm:m=+64,n=8,k=8,dtype=f32",
        "gemm:m=64, n=8,k=8,dtype=f32",
        " gemm:m=64,n=8,k=8,dtype=f32",
        "gemm:m=64,n=8,k=8,dtype=f32,",
        "gemm:m=64,,n=8,k=8,dtype=f32",
        "gemm:m=6\u{1b}4,n=8,k=8,dtype=f32",
    ] {
        let e = spec.parse::<Workload>().unwrap_err().to_string();
        assert!(!e.contains('\u{1b}'), "{e:?}");
    }
}

#[test]
fn a_network_too_large_at_its_batch_names_the_layer() {
    // A batch within the limit whose layers are not: the first one too large is named.
    let e = tessel_ir::network("resnet50", 1 << 31, tessel_ir::DType::F32).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("conv1") && msg.contains("too large"), "{msg}");
    // A batch over the limit is refused as such, before any layer multiplies it.
    let e = tessel_ir::network("resnet50", u64::MAX, tessel_ir::DType::F32).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("batch size") && msg.contains("too large"),
        "{msg}"
    );
}
