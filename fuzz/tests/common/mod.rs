//! Helpers the oracle tests share: a case's native run and its verdict.
// Each test file compiles this module on its own and uses only some of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use shardfuzz_fuzz::oracle::{judge, judge_prepared, Oracle, Prepared, Verdict};
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

/// The default oracle's verdict on an output of the native target, against a prepared case (its
/// reference and noise members computed once for several verdicts).
pub fn verdict_prepared(prep: &Prepared, out: RunOutput) -> Verdict {
    judge_prepared("native", BTreeMap::new(), prep, Outcome::Completed(out), &Oracle::default())
}
