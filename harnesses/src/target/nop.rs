//! A target that runs the single-device reference in the case dtype: always agrees within noise.
//! Makes engine and oracle tests short.

use std::collections::BTreeMap;

use super::{Outcome, Target};
use crate::case::Case;
use crate::inputs::Inputs;

#[derive(Debug, Default)]
pub struct NopTarget;

impl Target for NopTarget {
    fn name(&self) -> &str {
        "nop"
    }

    fn versions(&self) -> BTreeMap<String, String> {
        BTreeMap::from([("shardfuzz".to_string(), env!("CARGO_PKG_VERSION").to_string())])
    }

    fn run(&mut self, case: &Case, inputs: &Inputs) -> Outcome {
        match crate::reference::run(case, inputs, case.train.dtype) {
            Ok(out) => Outcome::Completed(out),
            Err(e) => Outcome::Unsupported { reason: e.to_string() },
        }
    }
}
