//! Op-level cases: one op on sharded inputs over a 2-D device mesh `[dp, tp]`, as DTensor and
//! jit+NamedSharding see the world.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpCase {
    pub kind: OpKind,
    /// Sizes; their meaning depends on `kind` (see [`OpKind::shape_help`]).
    pub shape: Vec<u32>,
    /// Dimension reduced / normalised over (sum, max, softmax); default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dim: Option<u32>,
    /// Target shape of `reshape`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_shape: Option<Vec<u32>>,
    /// Placement of each input on each mesh dimension `[dp, tp]`, e.g. `{"a": ["R", "S(0)"]}`.
    /// Inputs not listed are replicated.
    #[serde(default)]
    pub placements: BTreeMap<String, Vec<Placement>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    Matmul,
    Linear,
    Sum,
    Max,
    Softmax,
    Layernorm,
    Embedding,
    CrossEntropy,
    Reshape,
    Transpose,
}

impl OpKind {
    pub const ALL: [OpKind; 10] = [
        OpKind::Matmul,
        OpKind::Linear,
        OpKind::Sum,
        OpKind::Max,
        OpKind::Softmax,
        OpKind::Layernorm,
        OpKind::Embedding,
        OpKind::CrossEntropy,
        OpKind::Reshape,
        OpKind::Transpose,
    ];

    /// The meaning of `shape` for this op.
    pub fn shape_help(self) -> &'static str {
        match self {
            OpKind::Matmul | OpKind::Linear => "[m, k, n]",
            OpKind::Embedding => "[tokens, vocab, hidden]",
            OpKind::CrossEntropy => "[rows, vocab]",
            _ => "[rows, cols]",
        }
    }

    pub fn shape_len(self) -> usize {
        match self {
            OpKind::Matmul | OpKind::Linear | OpKind::Embedding => 3,
            _ => 2,
        }
    }

    /// Floating-point inputs of the op and their shapes.
    pub fn inputs(self, shape: &[usize]) -> Vec<(&'static str, Vec<usize>)> {
        let s = |i: usize| shape.get(i).copied().unwrap_or(1);
        match self {
            OpKind::Matmul => vec![("a", vec![s(0), s(1)]), ("b", vec![s(1), s(2)])],
            OpKind::Linear => vec![("x", vec![s(0), s(1)]), ("w", vec![s(1), s(2)]), ("bias", vec![s(2)])],
            OpKind::Layernorm => vec![("x", vec![s(0), s(1)]), ("w", vec![s(1)]), ("bias", vec![s(1)])],
            OpKind::Embedding => vec![("table", vec![s(1), s(2)])],
            OpKind::CrossEntropy => vec![("logits", vec![s(0), s(1)])],
            _ => vec![("x", vec![s(0), s(1)])],
        }
    }
}

/// How a tensor is laid out over one mesh dimension (DTensor's placements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Split along a tensor dimension like `torch.chunk` (uneven: last shards smaller or empty).
    Shard(usize),
    Replicate,
    /// Every rank holds a partial value; the value is their reduction over the mesh dimension
    /// (`P` is a sum; `P(avg)`, `P(max)`, `P(min)` the other reductions DTensor's `Partial` knows).
    Partial(Reduce),
}

/// The reduction a `Partial` placement stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reduce {
    Sum,
    Avg,
    Max,
    Min,
}

impl Reduce {
    pub const ALL: [Reduce; 4] = [Reduce::Sum, Reduce::Avg, Reduce::Max, Reduce::Min];

    pub fn name(self) -> &'static str {
        match self {
            Reduce::Sum => "sum",
            Reduce::Avg => "avg",
            Reduce::Max => "max",
            Reduce::Min => "min",
        }
    }
}

impl Placement {
    /// A partial sum: the one partial placement the built-in op kinds take.
    pub const PARTIAL: Placement = Placement::Partial(Reduce::Sum);
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Placement::Shard(d) => write!(f, "S({d})"),
            Placement::Replicate => f.write_str("R"),
            Placement::Partial(Reduce::Sum) => f.write_str("P"),
            Placement::Partial(r) => write!(f, "P({})", r.name()),
        }
    }
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "R" => Ok(Placement::Replicate),
            "P" => Ok(Placement::PARTIAL),
            _ if s.starts_with("P(") => Reduce::ALL
                .into_iter()
                .find(|r| s == format!("P({})", r.name()))
                .map(Placement::Partial)
                .ok_or_else(|| format!("a partial placement is \"P\" or \"P(sum|avg|max|min)\" (got \"{s}\")")),
            _ => s
                .strip_prefix("S(")
                .and_then(|r| r.strip_suffix(')'))
                .and_then(|d| d.parse().ok())
                .map(Placement::Shard)
                .ok_or_else(|| format!("placement must be \"R\", \"P\", \"P(avg|max|min)\" or \"S(dim)\" (got \"{s}\")")),
        }
    }
}

impl Serialize for Placement {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Placement {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Placement {
    fn schema_name() -> String {
        "Placement".into()
    }
    fn json_schema(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
        schemars::schema::SchemaObject {
            instance_type: Some(schemars::schema::InstanceType::String.into()),
            string: Some(Box::new(schemars::schema::StringValidation {
                pattern: Some(r"^(R|P|P\((sum|avg|max|min)\)|S\([0-9]+\))$".into()),
                ..Default::default()
            })),
            ..Default::default()
        }
        .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_parse_and_print() {
        for s in ["R", "P", "S(0)", "S(1)"] {
            assert_eq!(s.parse::<Placement>().unwrap().to_string(), s);
        }
        assert!("S(x)".parse::<Placement>().is_err());
        assert!("Shard".parse::<Placement>().is_err());
    }
}
