//! The `Target` trait: something that runs a case through a sharded path and reports what happened.
//!
//! One file per target; [`registry`] maps names to constructors.

mod nop;
pub mod python;
pub mod registry;

pub use nop::NopTarget;
pub use python::PythonTarget;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::case::Case;
use crate::inputs::Inputs;
use crate::tensor::Tensor;

/// What a completed run produced, with tensors gathered to their full (global) shape.
///
/// Names: `loss/step{i}`, `logits` (first forward), `grad/{param}` (first step, after reduction and
/// accumulation, before clipping), `param/{param}` (after the last step); op cases: `out`, `grad/{input}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunOutput {
    pub tensors: Vec<(String, Tensor)>,
    /// For tensors replicated over several ranks: each holder's copy, `(rank, value)`.
    pub replicas: Vec<(String, Vec<(usize, Tensor)>)>,
    /// Semantic coverage features (strategy, divisibility, padding, collectives …), as strings.
    pub features: Vec<String>,
    /// Facts worth showing with the verdict (padding added, schedule used …).
    pub notes: Vec<String>,
    /// What the run measured about itself (loss-scaler decisions, routing margins, peaks).
    #[serde(default)]
    pub stats: RunStats,
    /// The framework's own single-device run of the case in the case dtype, when the target sent
    /// one: tensors under the same names, a noise sample with the framework's own rounding.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub baseline: Vec<(String, Tensor)>,
    /// The framework's own float64 single-device computation (library-op cases, whose reference
    /// only the framework can compute): the oracle's reference for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reference: Vec<(String, Tensor)>,
    /// The framework's own noise samples (library-op cases): `(member, tensors)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub noise: Vec<(String, Vec<(String, Tensor)>)>,
}

/// One attention query row of a run: the block it belongs to and its scaled scores over the keys
/// it sees, before the softmax.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttentionRow {
    pub layer: usize,
    pub scores: Vec<f64>,
}

/// Facts about a run that are not tensors to compare.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunStats {
    /// Per step: whether the dynamic loss scaler skipped it (runs with a loss scaler only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped_steps: Option<Vec<bool>>,
    /// Per step: the largest magnitude the loss-scaled backward reached (its seed, the residual
    /// stream's gradient and the parameters' gradients, before the scale is divided out; the
    /// forward's activations too), reference runs with a loss scaler only: how near the step came
    /// to overflowing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaled_peaks: Option<Vec<f64>>,
    /// Per step: whether a gradient had a non-finite element, with or without a loss scaler
    /// (reference runs): where a framework's own overflow check may skip the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonfinite_grad_steps: Option<Vec<bool>>,
    /// The smallest gap between a token's k-th and (k+1)-th router probability (MoE models only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_margin: Option<f64>,
    /// Every router probability of step 0, in call order (single-device reference runs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router_probs: Option<Vec<f64>>,
    /// Every attention query row of step 0, in call order (single-device reference runs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_scores: Option<Vec<AttentionRow>>,
    /// The loss at the final parameters, one forward past the last step (single-device reference
    /// runs of two or more steps): the oracle's chaos rule reads it, nothing compares it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_loss: Option<f64>,
    /// The largest magnitude the residual stream or its gradient reached (model cases only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_activation: Option<f64>,
    /// Tokens the run met within its routing-flip margin (reference runs with routing flips only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub near_ties: Option<u32>,
}

impl RunOutput {
    /// The float64 reference a library-op worker sent with the run, as a run of its own (the Rust
    /// kernels do not know the framework's ops).
    pub fn sent_reference(&self) -> RunOutput {
        RunOutput { tensors: self.reference.clone(), ..RunOutput::default() }
    }

    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    /// The framework's own single-device value of tensor `name`, if it sent one.
    pub fn baseline_tensor(&self, name: &str) -> Option<&Tensor> {
        self.baseline.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }
}

/// A rank stuck in a collective when a run hung.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StuckRank {
    pub rank: usize,
    /// The collective it waits in, e.g. `all_reduce`.
    pub collective: String,
    /// The group, e.g. `tp[0, 1]`.
    pub group: String,
}

/// How a run ended.
// Nearly every run completes, so boxing the large variant would only add an allocation per run.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// The run finished; the oracle compares its tensors.
    Completed(RunOutput),
    /// The target cannot express this case (not a run, not a finding).
    Unsupported { reason: String },
    /// The framework's own validation refused the configuration, cleanly.
    Rejected { reason: String, features: Vec<String> },
    /// A panic, internal error, abort or segfault.
    Crash { rank: Option<usize>, message: String, features: Vec<String> },
    /// The run's behaviour differs from the reference's where no tensor can show it: the target
    /// returned a result for a call the single-device framework refuses (an out-of-range index).
    Divergent { reason: String, features: Vec<String> },
    /// Ranks waited in a collective that never completed.
    Hang { stuck: Vec<StuckRank>, detail: String, features: Vec<String> },
    /// Our own harness failed (worker code raised, a tensor was not returned): neither a pass nor a
    /// finding, and the test suite fails on it.
    HarnessError { message: String },
}

impl Outcome {
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::Completed(_) => "completed",
            Outcome::Unsupported { .. } => "unsupported",
            Outcome::Rejected { .. } => "rejected",
            Outcome::Crash { .. } => "crash",
            Outcome::Divergent { .. } => "divergent",
            Outcome::Hang { .. } => "hang",
            Outcome::HarnessError { .. } => "harness_error",
        }
    }

    /// Semantic features whatever the outcome.
    pub fn features(&self) -> &[String] {
        match self {
            Outcome::Completed(o) => &o.features,
            Outcome::Rejected { features, .. }
            | Outcome::Crash { features, .. }
            | Outcome::Divergent { features, .. }
            | Outcome::Hang { features, .. } => features,
            Outcome::Unsupported { .. } | Outcome::HarnessError { .. } => &[],
        }
    }
}

/// A framework (or our native implementation) under test.
pub trait Target: Send {
    /// Registry name, e.g. `native`, `torch-tp`.
    fn name(&self) -> &str;
    /// Versions of everything the verdict depends on (recorded in every finding).
    fn versions(&self) -> BTreeMap<String, String>;
    /// Runs one case. Must not panic on a valid case.
    fn run(&mut self, case: &Case, inputs: &Inputs) -> Outcome;
    /// Code coverage of the last run as 32-bit location hashes (external targets: the framework's
    /// Python lines and branches). Feeds the engine's map; empty for targets without it.
    fn take_coverage(&mut self) -> Vec<u64> {
        vec![]
    }
    /// The library ops (a framework's own op vocabulary) this target runs as `library_op` cases;
    /// empty for targets without one.
    fn vocabulary(&mut self) -> Result<Vec<crate::case::VocabularyEntry>, String> {
        Ok(vec![])
    }
    /// Runs a library-op case again on real ranks (one process each) when `run` simulated them in
    /// one process: a finding of the simulation is confirmed, or shown to be the simulation's.
    /// With `patience` above 1 (a hang), the case runs again with that many times its timeout
    /// where `run` ran it instead: a case that is only slow is then judged as it ends, one that
    /// still does not finish is the hang confirmed; a model case's hang is run again only that way,
    /// where the target ran it in its own process. `None` when the target has no other way to run it.
    fn confirm(&mut self, _case: &Case, _inputs: &Inputs, _patience: u32) -> Option<Outcome> {
        None
    }
    /// Runs a case again in processes started for it (a new worker and new ranks), where `run` may
    /// have reused processes that ran earlier cases: a finding that state left by an earlier case
    /// caused (a framework's module globals, a process group) does not reproduce here, and is not
    /// this case's. `None` when the target keeps no state between cases.
    fn rerun_fresh(&mut self, _case: &Case, _inputs: &Inputs) -> Option<Outcome> {
        None
    }
}
