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
    /// Where each tensor argument starts, per mesh dimension, before a redistribution takes it to its
    /// `placements` (forward; the backward runs back through it): `[["P(avg)"], ["S(0)"]]` reduces a
    /// partial value into shards. Arguments beyond the list start at their placements; a mesh
    /// dimension whose placement is Partial starts there too (DTensor makes a Partial only from
    /// Replicate, so no other start has a redistribution to it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<Vec<Placement>>,
    /// Run the backward pass too (when the op has one): gradients of every float argument.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub backward: bool,
    /// Redistributions every tensor output goes through, in order, before it is gathered: each a
    /// placement per mesh dimension (`S(d)` taken modulo the output's dimensions, or `R`); the
    /// backward runs back through them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redistribute: Vec<Vec<Placement>>,
    /// Views every tensor output goes through, in order, right after the op (before `redistribute`),
    /// in the sharded run and the reference alike; the backward runs back through them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub views: Vec<View>,
    /// Changes to the sample's own arguments (its dims, keepdim flags, scalars and index tensors),
    /// applied in order before anything runs, the single-device reference included.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub edits: Vec<SampleEdit>,
    /// A warm-up call: before the case's own call, the op runs once on the same sharded inputs with
    /// these edits in place of `edits` (forward and, as the case asks, backward; its results
    /// discarded). A framework's result must not depend on an earlier call: a cache keyed without
    /// an argument (DTensor's sharding propagation keyed without a scalar) shows as a divergence.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warmup: Vec<SampleEdit>,
    /// Where the backward's cotangents (the seeded gradient of each float output) enter the sharded
    /// run, per mesh dimension (`S(d)` taken modulo the output's dimensions; `P(sum)` / `P(avg)` as
    /// uneven random summands where the target can express a partial gradient): the gradient
    /// arrives at the op's output (after views and redistributions) already sharded or partial, as
    /// it does from the layer after it in training, and the op's backward sharding rules take it
    /// from there. Empty: the cotangent of the gathered, replicated output.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cotangent: Vec<Placement>,
    /// The cotangents enter the compiled program in the case dtype instead of float64 converted to
    /// the output's dtype inside it (JAX: a convert in the program, or none; a DTensor's backward
    /// takes them in the output's dtype either way). The values are the same: they are rounded to
    /// the case dtype.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cotangent_in_dtype: bool,
}

/// One change to a sample argument. `arg` picks the n-th *editable* argument of the sample, in call
/// order and taken modulo their count: a Python number (int, float or bool) or an integer tensor
/// (indices). A sample with none of them is run unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SampleEdit {
    pub arg: u32,
    pub edit: Edit,
}

/// What an edit does to an int / float / bool / index tensor. Each is defined for every kind, so any
/// edit applies to any argument; the worker documents the table (`sample_edits.py`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Edit {
    /// int +1, float +1, bool flipped, indices +1.
    Increment,
    /// int −1, float −1, bool flipped, indices −1 (a 0 becomes −1).
    Decrement,
    /// int −x, float −x, bool flipped, indices i → −i−1 (the same element counted from the end).
    Negate,
    /// int 0, float 0, bool false; indices sorted (the same set, another pairing).
    Zero,
    /// int x xor 1 (dim 0 ↔ 1, 2 ↔ 3), float 1/x, bool flipped; indices reversed in order.
    Flip,
    /// int as the other end counts it (a dim d ↔ d − ndim of the first tensor), float ×1e4 (an
    /// overflow in low precision), bool flipped; indices i → i − (max + 1) (negative indexing).
    Wrap,
    /// int +32 (past every dimension of a sample: an out-of-range dim, index or size), float +32,
    /// bool flipped; the first index +32.
    Beyond,
    /// An int inside a list of ints: that list emptied (a dim list `[0, 1]` → `[]`, which ATen reads
    /// as every dim); a lone int 0, float 0, bool false; indices: none (size 0 along dim 0).
    Empty,
}

impl Edit {
    pub const ALL: [Edit; 8] =
        [Edit::Increment, Edit::Decrement, Edit::Negate, Edit::Zero, Edit::Flip, Edit::Wrap, Edit::Beyond, Edit::Empty];

    pub fn name(self) -> &'static str {
        match self {
            Edit::Increment => "increment",
            Edit::Decrement => "decrement",
            Edit::Negate => "negate",
            Edit::Zero => "zero",
            Edit::Flip => "flip",
            Edit::Wrap => "wrap",
            Edit::Beyond => "beyond",
            Edit::Empty => "empty",
        }
    }
}

/// A view of an output (a tensor of `n` dimensions); one that does not apply to it (a transpose of a
/// vector) leaves it as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum View {
    /// Dims 0 and n − 1 swapped (n ≥ 2).
    Transpose,
    /// Every dim reversed (`permute(n−1, …, 0)`, n ≥ 3).
    Permute,
    /// `reshape(-1)` (n ≥ 2).
    Flatten,
    /// A new leading dim of size 1.
    Unsqueeze,
    /// The first row along dim 0 dropped (`narrow(0, 1, size − 1)`, size ≥ 2).
    Narrow,
}

impl View {
    pub const ALL: [View; 5] = [View::Transpose, View::Permute, View::Flatten, View::Unsqueeze, View::Narrow];

    pub fn name(self) -> &'static str {
        match self {
            View::Transpose => "transpose",
            View::Permute => "permute",
            View::Flatten => "flatten",
            View::Unsqueeze => "unsqueeze",
            View::Narrow => "narrow",
        }
    }
}

/// The most output views a library-op case may carry.
pub const MAX_VIEWS: usize = 4;

/// The most sample edits a library-op case may carry.
pub const MAX_SAMPLE_EDITS: usize = 4;

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
