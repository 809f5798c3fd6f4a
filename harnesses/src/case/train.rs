//! The training step of a case: optimizer, clipping, accumulation, precision.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use shardfuzz_kernels::DType;

use super::{Parallel, Real};

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Train {
    /// Optimizer steps.
    pub steps: u32,
    pub optimizer: Optimizer,
    /// Clip gradients to this global norm (`clip_norm_type`'s, L2 when absent); absent = no clipping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_grad_norm: Option<Real>,
    /// The norm `clip_grad_norm` bounds, torch's `norm_type`: `l2` (√Σg²), `l1` (Σ|g|) or `inf` (max |g|), each over
    /// every trained gradient element at once; a sharded run combines its ranks' parts by a sum (l1, l2 squared) or a
    /// maximum (inf). Only with `clip_grad_norm`. Absent: l2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_norm_type: Option<ClipNorm>,
    /// Gradient-accumulation steps per optimizer step: the batch is processed this many times
    /// (the loss is divided by it), as a user accumulating over identical micro-steps would.
    #[serde(default = "one")]
    pub grad_accumulation: u32,
    /// Compute and storage dtype of activations, parameters and gradients.
    #[schemars(with = "String")]
    pub dtype: DType,
    /// Dtype of gradient reductions (all-reduce / reduce-scatter); defaults to `dtype`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub reduce_dtype: Option<DType>,
    /// Dtype gradients are accumulated in across micro-batches and handed to the optimizer, where a
    /// framework offers the choice (DeepSpeed's `data_types.grad_accum_dtype`; Megatron's distributed optimizer,
    /// given the compute dtype with an f32 `reduce_dtype`, its `reduce_scatter_with_fp32_accumulation`); absent:
    /// the target's own (the compute dtype). The same result up to rounding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub grad_accum_dtype: Option<DType>,
    /// Dtype parameters and optimizer states are kept in, wider than the compute dtype `dtype`, where a
    /// framework offers it (mixed precision: FSDP2's `MixedPrecisionPolicy(param_dtype=dtype)` over a model held
    /// in this dtype, each forward computing with a copy cast to `dtype`); absent: the target's own (parameters
    /// in `dtype`). The same result up to the compute dtype's rounding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub master_dtype: Option<DType>,
    /// Dynamic loss scaling (meant for f16): initial scale; absent = off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<Real>,
    /// The run checkpointed after this many optimizer steps (0 ≤ k < `steps`) with the framework's own save
    /// (model and optimizer state) and resumed from that checkpoint into a freshly built model, optimizer and
    /// framework state, where a target offers it; the same result as the uninterrupted run (up to one rounding of
    /// the parameters to the compute dtype where a framework checkpoints its working copy). 0 checkpoints the
    /// initialised model and its optimizer before any step (a seed checkpoint, as torchtitan's
    /// `create_seed_checkpoint` writes one): the optimizer has no state yet. Absent: uninterrupted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_after: Option<u32>,
    /// How `resume_after`'s checkpoint is laid out, where a target offers the choice: `sharded`, each rank writing
    /// and reading its own shards (megatron's distributed checkpoint, `--ckpt-format torch_dist`; torch's
    /// distributed checkpoint of sharded state dicts), or `gathered`, the state gathered to one rank to write and
    /// scattered from it on load (megatron's legacy `--ckpt-format torch`, the distributed optimizer's state by
    /// `save_parameter_state`). Only with `resume_after`. Absent: sharded, the frameworks' default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_layout: Option<CheckpointLayout>,
    /// The parallel layout the run resumes into from `resume_after`'s checkpoint, where a target can load its
    /// checkpoint into another one (a user resuming with HSDP where FSDP saved, another ZeRO stage, bucket size or
    /// shard dimension): every field as `parallel`'s, over the same world size. The same result as the uninterrupted
    /// run (every parallel layout computes the single-device result). Only with `resume_after`. Absent: `parallel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_parallel: Option<Parallel>,
    /// Parameters left out of training (`requires_grad=False`), by name prefix at a `.` boundary
    /// (`embed`, `layers.0`, `layers.1.attn`, `final_norm.weight`), as in fine-tuning with a frozen backbone:
    /// their gradients are neither computed nor reduced nor counted in the clipping norm, and the optimizer
    /// leaves them unchanged (no weight decay). Where a target offers it; empty: every parameter trains.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frozen: Vec<String>,
    /// The framework normalises the loss by the global token count itself, where a target offers it
    /// (Megatron's `calculate_per_token_loss`): each rank backpropagates its summed token loss unscaled, the
    /// gradients are summed over the data-parallel ranks, and the framework divides them by the count of
    /// counted tokens all-reduced over those ranks. Absent (false): each rank scales its loss by dp / global
    /// tokens before a gradient average. The same result (the global token mean) either way.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub per_token_loss: bool,
    /// Each micro-batch's loss is the mean over its own counted tokens (the frameworks' default
    /// `reduction="mean"`, as most training scripts write it), which the training loop then weights by that
    /// count over the global one, where a target offers it. Absent (false): the micro-batch's summed token loss
    /// scaled by dp / global tokens. The same result (the global token mean) either way; what differs is the
    /// framework code the loss runs through (a mean's own division, e.g. in a vocab-parallel loss's backward).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub local_mean_loss: bool,
    /// The model run through the framework's graph compiler, where a target offers it: `torch.compile` with the
    /// `aot_eager` backend (Dynamo's graph capture and AOTAutograd's joint forward / backward graphs, run by the
    /// eager kernels), over the framework's own compiler integration (DDP's DDPOptimizer, one subgraph per
    /// gradient bucket; DTensor traced as a tensor subclass). The same result up to rounding. Absent (false): eager.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compiled: bool,
    /// Label smoothing ε of the cross-entropy, as torch's `label_smoothing` defines it: each counted token's
    /// target distribution is 1 − ε on its target plus ε / V on each of the V vocabulary entries, so its loss is
    /// (1 − ε)·(−log p_target) + ε·mean_j(−log p_j) (Megatron's `label_smoothing` α is the same distribution with
    /// α = ε·(V − 1) / V). 0 < ε < 1; absent: none. Model cases without class weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_smoothing: Option<Real>,
}

/// Whether the `train.frozen` entry `prefix` freezes the parameter `name` (itself or a module above it).
pub fn freezes(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

fn one() -> u32 {
    1
}

impl Train {
    pub fn reduce_dtype(&self) -> DType {
        self.reduce_dtype.unwrap_or(self.dtype)
    }

    /// The norm gradient clipping bounds (L2 unless `clip_norm_type` says otherwise).
    pub fn clip_norm(&self) -> ClipNorm {
        self.clip_norm_type.unwrap_or(ClipNorm::L2)
    }

    /// The label smoothing ε (0 when absent).
    pub fn label_smoothing(&self) -> f64 {
        self.label_smoothing.map_or(0.0, |r| r.get())
    }

    /// Whether the parameter `name` is frozen (`frozen` names it or a module above it).
    pub fn is_frozen(&self, name: &str) -> bool {
        self.frozen.iter().any(|f| freezes(f, name))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    Sgd,
    Adam,
    Adamw,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Optimizer {
    pub kind: OptimizerKind,
    pub lr: Real,
    #[serde(default = "beta1")]
    pub beta1: Real,
    #[serde(default = "beta2")]
    pub beta2: Real,
    #[serde(default = "eps")]
    pub eps: Real,
    #[serde(default)]
    pub weight_decay: Real,
    /// Weight decay on matrices only: the vectors (biases, norm weights; each expert's bias too, though stacked) in a
    /// second parameter group without it, as nanoGPT's `configure_optimizers` and most fine-tuning scripts do.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_decay_vectors: bool,
    /// Which of the framework's implementations of the optimizer runs the update, where a target offers the choice
    /// (torch's `foreach=False`, `foreach=True`, `fused=True`; with `foreach` gradient clipping takes the foreach
    /// path too). The same update up to rounding. Absent: the target's default (torch targets: fused for
    /// low-precision parameters, the for-loop otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub implementation: Option<OptimizerImplementation>,
}

/// How a checkpoint is laid out (`Train::checkpoint_layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointLayout {
    /// Each rank writes and reads its own shards.
    Sharded,
    /// Gathered to one rank to write, scattered from it on load.
    Gathered,
    /// Written sharded, then converted to a layout-free form (one file per parameter and optimizer state) that any
    /// layout loads: DeepSpeed's universal checkpoint (`ds_to_universal`, `checkpoint.load_universal`).
    Universal,
}

/// The norm gradient clipping bounds (`Train::clip_norm_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClipNorm {
    L1,
    L2,
    Inf,
}

/// An optimizer implementation (`Optimizer::implementation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerImplementation {
    /// One parameter at a time (torch's `foreach=False`).
    ForLoop,
    /// The multi-tensor `_foreach_*` ops over every parameter of a group (torch's `foreach=True`).
    Foreach,
    /// One fused kernel per group (torch's `fused=True`), its arithmetic in float32 whatever the parameters' dtype.
    Fused,
}

impl OptimizerImplementation {
    pub const ALL: [OptimizerImplementation; 3] = [Self::ForLoop, Self::Foreach, Self::Fused];
}

fn beta1() -> Real {
    Real(0.9)
}
fn beta2() -> Real {
    Real(0.999)
}
fn eps() -> Real {
    Real(1e-8)
}

impl Optimizer {
    pub fn sgd(lr: f64) -> Self {
        Optimizer {
            kind: OptimizerKind::Sgd,
            lr: Real(lr),
            beta1: beta1(),
            beta2: beta2(),
            eps: eps(),
            weight_decay: Real(0.0),
            no_decay_vectors: false,
            implementation: None,
        }
    }
}
