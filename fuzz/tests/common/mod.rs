//! Helpers the oracle tests share: a case's native run and its verdict.

use std::collections::BTreeMap;
use std::time::Duration;

use shardfuzz_fuzz::oracle::{judge, Oracle, Verdict};
use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::inputs::Inputs;
use shardfuzz_harnesses::model::Bugs;
use shardfuzz_harnesses::native::NativeTarget;
use shardfuzz_harnesses::target::{Outcome, RunOutput, Target};

/// The native target's output for a case that must complete.
pub fn native_output(case: &Case, inputs: &Inputs) -> RunOutput {
    match NativeTarget::new(Bugs::none(), Duration::from_secs(60)).run(case, inputs) {
        Outcome::Completed(o) => o,
        other => panic!("the native target did not complete: {}", other.kind()),
    }
}

/// The default oracle's verdict on an output of the native target.
pub fn verdict(case: &Case, inputs: &Inputs, out: RunOutput) -> Verdict {
    judge("native", BTreeMap::new(), case, inputs, Outcome::Completed(out), &Oracle::default())
}
