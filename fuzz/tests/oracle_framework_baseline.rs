//! The oracle on a target's own single-device run (`baseline/…`, the "framework" noise sample): it widens ε by
//! the framework's own rounding, in step-0 tensors up to `check::FRAMEWORK_CAP` times the emulated members' ε,
//! never without limit.
//! A worker whose model of the case is wrong computes its single-device run with the same error as its sharded
//! one; taken whole, that error became ε and the run passed.

use std::path::Path;

mod common;

use common::{native_output, verdict};
use shardfuzz_fuzz::oracle::VerdictKind;
use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::inputs::Inputs;
use shardfuzz_harnesses::target::{NopTarget, Outcome, RunOutput, Target};

fn case(file: &str) -> Case {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/clean-cases").join(file);
    Case::from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A single-device run in the case dtype (the `nop` target), as a framework's baseline.
fn single_device(case: &Case, inputs: &Inputs) -> Vec<(String, shardfuzz_harnesses::tensor::Tensor)> {
    match NopTarget.run(case, inputs) {
        Outcome::Completed(o) => o.tensors,
        other => panic!("the single-device run did not complete: {}", other.kind()),
    }
}

fn with_baseline(mut out: RunOutput, baseline: Vec<(String, shardfuzz_harnesses::tensor::Tensor)>) -> RunOutput {
    out.baseline = baseline;
    out
}

#[test]
fn a_single_device_run_in_the_case_dtype_counts_as_noise() {
    for file in ["f32-200795.json", "bf16-300884.json"] {
        let case = case(file);
        let inputs = Inputs::generate(&case);
        let v = verdict(&case, &inputs, with_baseline(native_output(&case, &inputs), single_device(&case, &inputs)));
        assert_eq!(v.kind, VerdictKind::Pass, "{file}: {}", v.reason);
        assert!(v.checks.iter().all(|c| !c.note.as_deref().unwrap_or_default().contains("single-device run")), "{file}");
    }
}

/// In f32 a 1 % error of the worker's model shows; in bf16 the cap (16 × an ε of ~1 %, times the threshold 8) leaves
/// room for errors of the order of the tensor itself: a halved gradient there passes (checked: 4.0 ε), a sign flip
/// does not. The worker's model is the same code in every dtype, so its f32 cases are the ones that vouch for it.
#[test]
fn a_single_device_run_as_wrong_as_the_sharded_one_does_not_hide_the_error() {
    for (file, scale) in [("f32-200795.json", 0.99), ("bf16-300884.json", -1.0)] {
        let case = case(file);
        let inputs = Inputs::generate(&case);
        let name = "grad/lm_head.weight";
        let scaled = |mut tensors: Vec<(String, shardfuzz_harnesses::tensor::Tensor)>| {
            let t = tensors.iter_mut().find(|(n, _)| n == name).unwrap();
            t.1.data.iter_mut().for_each(|x| *x *= scale);
            tensors
        };
        let mut out = native_output(&case, &inputs);
        out.tensors = scaled(out.tensors);
        let v = verdict(&case, &inputs, with_baseline(out, scaled(single_device(&case, &inputs))));
        assert_eq!(v.kind, VerdictKind::Divergent, "{file}: {}", v.reason);
        assert!(v.reason.starts_with(name), "{file}: {}", v.reason);
        let check = v.checks.iter().find(|c| c.tensor == name).unwrap();
        assert!(check.note.as_deref().unwrap_or_default().contains("single-device run"), "{file}: {:?}", check.note);
    }
}
