//! Library-op cases: one op of a framework's own vocabulary (a PyTorch OpInfo entry such as
//! `addmm`, or a `jax.numpy` / `jax.lax` function), on one of the sample inputs the framework ships
//! for it, over an N-D device mesh with a placement per tensor argument and mesh dimension.
//!
//! The inputs are the framework's sample inputs (drawn by the worker from `data.seed`) and the
//! reference is the framework's own single-device computation in float64: the Rust kernels know
//! none of these ops.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Placement;

/// Most dimensions of a library-op mesh.
pub const MAX_MESH_DIMS: usize = 3;
/// Most ranks of a library-op mesh.
pub const MAX_MESH_RANKS: u64 = 8;

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LibraryOp {
    /// The framework's name of the op: an OpInfo name for PyTorch (`"addmm"`,
    /// `"nn.functional.cross_entropy"`), a qualified function for JAX (`"jax.lax.cumsum"`).
    pub name: String,
    /// The OpInfo variant (`variant_test_name`), empty for the op's main entry.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub variant: String,
    /// Which of the op's sample inputs (taken modulo how many the framework generates).
    #[serde(default)]
    pub sample: u32,
    /// The device mesh: 1 to 3 dimensions, at most 8 ranks (`[2, 3]`, `[8]`, `[2, 2, 2]`).
    pub mesh: Vec<u32>,
    /// Placement of each tensor argument on each mesh dimension, in the sample's order (the input,
    /// then the positional arguments, then the keyword arguments, each tensor once); arguments
    /// beyond the list are replicated. `S(d)` of a dimension the argument lacks is taken modulo
    /// its rank by the target (a scalar tensor is replicated).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placements: Vec<Vec<Placement>>,
    /// Run the backward pass too (when the op has one): gradients of every float argument.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub backward: bool,
    /// Redistributions every tensor output goes through, in order, before it is gathered: each a
    /// placement per mesh dimension (`S(d)` taken modulo the output's dimensions, or `R`); the
    /// backward runs back through them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redistribute: Vec<Vec<Placement>>,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

impl LibraryOp {
    pub fn world(&self) -> u64 {
        self.mesh.iter().map(|&d| d as u64).product()
    }

    /// The name with its variant, as `shardfuzz targets` lists it (`"max.reduction_with_dim"`).
    pub fn full_name(&self) -> String {
        if self.variant.is_empty() {
            self.name.clone()
        } else {
            format!("{}.{}", self.name, self.variant)
        }
    }
}

/// One op a target can express, as its worker announced it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct VocabularyEntry {
    pub name: String,
    #[serde(default)]
    pub variant: String,
    /// The op's family (OpInfo class: unary, binary, reduction, shape …): mutations swap ops
    /// within it.
    #[serde(default)]
    pub family: String,
}
