//! The oracle near a dtype's underflow: values within a few subnormals of zero are rounded
//! absolutely, once per partial sum a sharded run adds, and a correct run may land a subnormal
//! away from every single-device member; an error beyond that is still divergent.

mod common;

use common::{native_output, verdict};
use shardfuzz_fuzz::oracle::VerdictKind;
use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::inputs::Inputs;

/// `bench clean` seed 15,044,849 in f16, minimized: one rank, three accumulation steps. The
/// final-norm gradient is ~10⁻⁹ in f64, below f16's smallest subnormal (6·10⁻⁸): every
/// single-device member rounds it to zero, the target's three accumulated partial sums leave ±q on
/// four elements.
fn case() -> Case {
    Case::from_json(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/clean-cases/f16-15044849-subnormal-final-norm-grad-over-accumulation-steps.json"
        ))
        .unwrap(),
    )
    .unwrap()
}

const GRAD: &str = "grad/final_norm.weight";

#[test]
fn a_subnormal_apart_over_accumulated_partial_sums_is_not_a_divergence() {
    let case = case();
    let inputs = Inputs::generate(&case);
    let out = native_output(&case, &inputs);
    assert!(out.tensor(GRAD).unwrap().data.iter().any(|&v| v != 0.0), "the target no longer leaves a subnormal: pick another case");
    let v = verdict(&case, &inputs, out);
    assert_eq!(v.kind, VerdictKind::Pass, "{}", v.reason);
}

#[test]
fn an_error_of_many_subnormals_is_still_divergent() {
    let case = case();
    let inputs = Inputs::generate(&case);
    let mut out = native_output(&case, &inputs);
    let q = 2f64.powi(-24);
    let grad = out.tensors.iter_mut().find(|(n, _)| n == GRAD).unwrap();
    grad.1.data.iter_mut().for_each(|v| *v += 64.0 * q);
    let v = verdict(&case, &inputs, out);
    assert_eq!(v.kind, VerdictKind::Divergent, "{}", v.reason);
    assert!(v.reason.starts_with(GRAD), "{}", v.reason);
}
