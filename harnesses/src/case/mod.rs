//! The case: one human-editable JSON file saying what to compute and how to shard it.
//!
//! Validation is structural only. A size that a parallel degree does not divide is *valid*: it is
//! exactly what the fuzzer is after, and a target either supports it or rejects it cleanly.

mod data;
mod library_op;
mod model;
mod op;
mod parallel;
mod real;
mod train;
mod validate;

pub use data::{Data, Distribution, IgnorePattern, Ignored};
pub use library_op::{Edit, LibraryOp, SampleEdit, View, VocabularyEntry, MAX_MESH_DIMS, MAX_MESH_RANKS, MAX_SAMPLE_EDITS, MAX_VIEWS};
pub use model::{
    Activation, HfModel, LayerKind, Model, MoeConfig, NormKind, ParamRole, ParamSpec, Recompute, MAX_LAYER_PASSES, MIN_HIDDEN,
};
pub use op::{OpCase, OpKind, Placement, Reduce};
pub use parallel::{Axis, FrameworkCheckpoint, Mesh, Parallel, PipelineSchedule, RankOrder, SequenceParallelMode, VocabLoss};
pub use real::Real;
pub use train::{CheckpointLayout, ClipNorm, Optimizer, OptimizerImplementation, OptimizerKind, Train};
pub use validate::{Limits, Violation, MAX_GRAD_PREDIVIDE, MAX_REDISTRIBUTIONS, MAX_REDUCE_BUCKET, MAX_VOCAB_DIVISOR};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Version of the case format written in every file.
pub const SCHEMA_VERSION: u32 = 1;

/// A fuzz case: a parallel configuration, a workload (a model or a single op), a training step and data.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// Format version; must be 1.
    pub schema: u32,
    /// Free-form label (seed corpus files describe what they exercise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub parallel: Parallel,
    /// A model to train; exactly one of `model` and `op` is present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<Model>,
    /// A single op on sharded inputs; exactly one of `model`, `op` and `library_op` is present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<OpCase>,
    /// One op of a framework's own vocabulary on its sample inputs, over an N-D mesh (the
    /// `parallel` degrees are not used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub library_op: Option<LibraryOp>,
    pub train: Train,
    pub data: Data,
}

/// Why a case could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{}", .0.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<Violation>),
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}

impl Case {
    /// Parses and validates a case with the default limits.
    pub fn from_json(text: &str) -> Result<Case, CaseError> {
        Self::from_json_with(text, &Limits::default())
    }

    pub fn from_json_with(text: &str, limits: &Limits) -> Result<Case, CaseError> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let case: Case = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let path = if path == "." { "case".to_string() } else { path };
            CaseError::Parse { path, message: inner.to_string() }
        })?;
        case.validate(limits).map_err(CaseError::Invalid)?;
        Ok(case)
    }

    /// Reads, parses and validates a case file.
    pub fn load(path: &std::path::Path) -> Result<Case, CaseError> {
        let text = std::fs::read_to_string(path).map_err(|source| CaseError::Io { path: path.display().to_string(), source })?;
        Self::from_json(&text)
    }

    /// Pretty JSON, the form written to corpus and findings.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a case always serialises")
    }

    /// The JSON Schema of a case, for harnesses written in other languages.
    pub fn json_schema() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(Case)).expect("schema serialises")
    }

    pub fn world(&self) -> usize {
        match &self.library_op {
            Some(l) => l.world() as usize,
            None => self.parallel.world() as usize,
        }
    }

    /// A short description used in tables and logs.
    pub fn summary(&self) -> String {
        let p = &self.parallel;
        let mut s = format!("dp{} tp{} pp{}", p.dp, p.tp, p.pp);
        if p.cp > 1 {
            s += &format!(" cp{}", p.cp);
        }
        if p.ep > 1 {
            s += &format!(" ep{}", p.ep);
        }
        if p.sequence_parallel {
            s += " sp";
        }
        if p.zero_stage > 0 {
            s += &format!(" zero{}", p.zero_stage);
        }
        if let Some(m) = &self.model {
            s += &format!(
                " | v{} h{} f{} heads{}/{} s{} b{} L{}{}",
                m.vocab,
                m.hidden,
                m.ffn,
                m.heads,
                m.kv_heads,
                m.seq,
                m.batch,
                m.layers.len(),
                if m.layer_passes > 1 { format!("x{}", m.layer_passes) } else { String::new() }
            );
            if let Some(ig) = &self.data.ignored {
                s += &format!(" ignored {:.0}% {:?}", ig.fraction.get() * 100.0, ig.pattern).to_lowercase();
            }
            if self.data.class_weights {
                s += " class-weighted";
            }
        }
        if let Some(o) = &self.op {
            s += &format!(" | op {:?} {:?}", o.kind, o.shape);
        }
        if let Some(l) = &self.library_op {
            let places: Vec<String> = l.placements.iter().map(|p| p.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("/")).collect();
            s = format!("mesh {:?} | {} sample {} [{}]", l.mesh, l.full_name(), l.sample, places.join(", "));
            if !l.sources.is_empty() {
                let sources: Vec<String> =
                    l.sources.iter().map(|p| p.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("/")).collect();
                s += &format!(" from [{}]", sources.join(", "));
            }
            for v in &l.views {
                s += &format!(" → {}", v.name());
            }
            for r in &l.redistribute {
                s += &format!(" → {}", r.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("/"));
            }
            for e in &l.edits {
                s += &format!(" | arg {} {}", e.arg, e.edit.name());
            }
            if !l.warmup.is_empty() {
                let w: Vec<String> = l.warmup.iter().map(|e| format!("arg {} {}", e.arg, e.edit.name())).collect();
                s += &format!(" | after a warm-up call ({})", w.join(", "));
            }
            if !l.cotangent.is_empty() {
                s += &format!(" | cotangent {}", l.cotangent.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("/"));
            }
            if l.cotangent_in_dtype {
                s += " | cotangent in the case dtype";
            }
        }
        s + &format!(" | {}", self.train.dtype)
    }
}

#[cfg(test)]
pub(crate) mod tests;
