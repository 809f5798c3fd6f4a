//! Op-level cases on the native target (DTensor-style sharding rules): being written.

use super::NativeTarget;
use crate::case::Case;
use crate::inputs::Inputs;
use crate::target::Outcome;

pub fn run(_t: &mut NativeTarget, _case: &Case, _inputs: &Inputs) -> Outcome {
    Outcome::Unsupported { reason: "op-level cases are not implemented by the native target yet".into() }
}
