//! The model, written once the way Megatron writes it: every block takes a [`Ctx`] that says which
//! slice of the weights this rank holds and which collectives connect it to its tensor-parallel and
//! expert-parallel peers. With no peers (the reference) every collective is the identity and the
//! code computes the plain single-device model.
//!
//! Activations are `[tokens, features]` matrices, tokens batch-major (`t = b * seq + s`). Under
//! sequence parallelism a rank holds, for every batch row, its chunk of the sequence.

mod blocks;
mod bugs;
mod embed;
mod layout;
mod moe;
mod qk_norm;
mod region;
mod shared_expert;

pub use blocks::{block_bwd, block_fwd, BlockCache};
pub use bugs::{Bug, Bugs};
pub use embed::{embed_bwd, embed_fwd, head_bwd, head_fwd, HeadCache};
pub use layout::{chunk_range, Layout, Reject};
pub use region::Geom;

use std::collections::BTreeMap;

use shardfuzz_kernels::{DType, Prec};

use crate::case::Model;
use crate::tensor::Tensor;

pub type Mat = ndarray::Array2<f64>;
/// Parameters (or gradients) by canonical name; shapes are this rank's local shapes.
pub type ParamSet = BTreeMap<String, Tensor>;

/// Why a rank could not finish: a failed collective (the comm layer records hangs and crashes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommFailure(pub String);

impl std::fmt::Display for CommFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub type CResult<T> = Result<T, CommFailure>;

/// The collectives of one process group, as the model code uses them. Reductions run in the
/// group's reduce dtype.
pub trait GroupOps {
    fn size(&self) -> usize;
    /// This rank's position in the group.
    fn index(&self) -> usize;
    fn all_reduce_sum(&self, buf: &mut [f64]) -> CResult<()>;
    /// All-reduce sum in an explicit dtype (statistics kept in f32 whatever the reduce dtype, as
    /// Megatron's vocab-parallel cross-entropy upcasts its logits).
    fn all_reduce_sum_in(&self, buf: &mut [f64], dtype: DType) -> CResult<()>;
    fn all_reduce_max(&self, buf: &mut [f64]) -> CResult<()>;
    fn all_gather(&self, local: &[f64]) -> CResult<Vec<Vec<f64>>>;
    /// Sums `input` over the group and returns this member's chunk (`counts` per member, in order).
    fn reduce_scatter(&self, input: &[f64], counts: &[usize]) -> CResult<Vec<f64>>;
    fn all_to_all(&self, send: Vec<Vec<f64>>) -> CResult<Vec<Vec<f64>>>;
}

/// Everything a block needs to know about where it runs.
pub struct Ctx<'a> {
    pub p: Prec,
    /// The loss weight of each vocabulary entry (`data.class_weights`); empty: unweighted.
    pub class_weights: &'a [f64],
    /// The cross-entropy's label smoothing ε (`train.label_smoothing`; 0: none).
    pub label_smoothing: f64,
    pub model: &'a Model,
    pub layout: &'a Layout,
    /// Tensor-parallel group (None: single device along this axis).
    pub tp: Option<&'a dyn GroupOps>,
    /// Expert-parallel group (None: every expert is local).
    pub ep: Option<&'a dyn GroupOps>,
    pub bugs: Bugs,
    /// Smallest gap seen between the k-th and (k+1)-th router probability of any token: how close
    /// the routing came to a tie (a discontinuity round-off can flip).
    pub routing_margin: std::cell::Cell<f64>,
    /// Tokens whose router margin is below this take their best unchosen expert instead of their
    /// k-th choice: the routing another correct implementation's round-off may pick (0: never).
    pub flip_routing_below: f64,
    /// Which of those near-tie tokens flip, by the order the run meets them (bit i: the i-th; the
    /// 64th and later follow bit 63); every one when None. A correct run's round-off may flip any
    /// subset of them, and with expert capacity each subset drops other tokens.
    pub flip_only: Option<u64>,
    /// Near-tie tokens met so far (below `flip_routing_below`).
    pub near_ties: std::cell::Cell<u32>,
    /// Gates (a chosen expert's router probability, which scales its output) moved by their
    /// round-off (see `reference::GateJitter`). None: not moved.
    pub gate_jitter: Option<crate::reference::GateJitter>,
    /// While `Some`, every router probability computed, in call order (a single-device run's first
    /// step: the noise members' routing is compared with the reference's to measure how far
    /// round-off moves it). `None`, the default, records nothing.
    pub router_probs: std::cell::RefCell<Option<Vec<f64>>>,
    /// While `Some`, every attention query row's scores, in call order (a single-device run's
    /// first step, as `router_probs`). `None`, the default, records nothing.
    pub attention_scores: std::cell::RefCell<Option<Vec<crate::target::AttentionRow>>>,
    /// Some expert was full and dropped a token's choice (the capacity path of the MoE dispatch).
    pub tokens_dropped: std::cell::Cell<bool>,
    /// Largest magnitude the residual stream or its gradient reached at a block boundary: how close
    /// the run's intermediates came to the dtype's range, which a tensor's own size does not show.
    pub peak_activation: std::cell::Cell<f64>,
    /// What the loss gradient of each token is multiplied by in the micro-batch being run (1 /
    /// global tokens, times the loss scale): auxiliary losses take their gradients in these units.
    pub loss_grad_scale: std::cell::Cell<f64>,
    /// The token loss's denominator (counted targets, class-weighted) over the batch's tokens: an
    /// auxiliary loss averaged over sequences takes `loss_grad_scale` times this per token, so that
    /// ignored targets, which shrink the token loss's denominator, do not weigh it.
    pub counted_share: f64,
}

impl Ctx<'_> {
    pub fn tp_size(&self) -> usize {
        self.tp.map_or(1, |g| g.size())
    }
    pub fn tp_index(&self) -> usize {
        self.tp.map_or(0, |g| g.index())
    }
    pub fn sp(&self) -> bool {
        self.layout.sequence_parallel && self.tp_size() > 1
    }
    pub fn bug(&self, b: Bug) -> bool {
        self.bugs.has(b)
    }
    pub fn dtype(&self) -> DType {
        self.p.dtype
    }
    /// Raises `peak_activation` to `m`'s largest magnitude (NaN counts as nothing).
    pub fn note_peak(&self, m: &Mat) {
        let peak = m.iter().fold(self.peak_activation.get(), |p, x| p.max(x.abs()));
        self.peak_activation.set(peak);
    }
}

/// Adds `g` into the gradient `name` (created on first use), rounding to `dtype` after each add.
pub fn accumulate(grads: &mut ParamSet, name: &str, shape: &[usize], g: &[f64], dtype: DType) {
    let t = grads.entry(name.to_string()).or_insert_with(|| Tensor::zeros(shape.to_vec()));
    debug_assert_eq!(t.data.len(), g.len(), "gradient {name} has the wrong size");
    shardfuzz_kernels::sum_into(&mut t.data, g, dtype);
}

/// A parameter as a matrix (1-D parameters become one row).
pub fn mat(params: &ParamSet, name: &str) -> Mat {
    params.get(name).unwrap_or_else(|| panic!("parameter {name} missing")).to_mat()
}

pub fn vec1(params: &ParamSet, name: &str) -> ndarray::Array1<f64> {
    params.get(name).unwrap_or_else(|| panic!("parameter {name} missing")).to_vec1()
}

pub fn opt_vec1(params: &ParamSet, name: &str) -> Option<ndarray::Array1<f64>> {
    params.get(name).map(|t| t.to_vec1())
}

/// Forward and backward of the whole stack on one micro-batch (no pipeline). Returns the sum of
/// the per-token losses of every token of the micro-batch and this rank's logits.
#[allow(clippy::too_many_arguments)]
pub fn forward_backward(
    ctx: &Ctx,
    params: &ParamSet,
    g: &Geom,
    ids: &[usize],
    targets: &[usize],
    grad_scale: f64,
    grads: &mut ParamSet,
) -> CResult<(f64, Mat)> {
    ctx.loss_grad_scale.set(grad_scale);
    let mut x = embed_fwd(ctx, params, g, ids)?;
    ctx.note_peak(&x);
    let blocks = ctx.model.block_sequence();
    let mut caches = Vec::with_capacity(blocks.len());
    for &(i, kind) in &blocks {
        let (nx, c) = block_fwd(ctx, i, kind, params, g, &x)?;
        caches.push(c);
        x = nx;
        ctx.note_peak(&x);
    }
    let (losses, logits, hc) = head_fwd(ctx, params, g, &x, targets, grad_scale)?;
    let mut dx = head_bwd(ctx, params, g, hc, grads)?;
    ctx.note_peak(&dx);
    for (&(i, _), c) in blocks.iter().zip(caches).rev() {
        dx = block_bwd(ctx, i, params, g, c, &dx, grads)?;
        ctx.note_peak(&dx);
    }
    embed_bwd(ctx, params, g, ids, &dx, grads)?;
    Ok((loss_sum(ctx, &losses), logits))
}

/// The summed loss of a forward pass alone (no gradients).
pub fn forward_loss(ctx: &Ctx, params: &ParamSet, g: &Geom, ids: &[usize], targets: &[usize]) -> CResult<f64> {
    let mut x = embed_fwd(ctx, params, g, ids)?;
    for (i, kind) in ctx.model.block_sequence() {
        x = block_fwd(ctx, i, kind, params, g, &x)?.0;
    }
    let (losses, _, _) = head_fwd(ctx, params, g, &x, targets, 1.0)?;
    Ok(loss_sum(ctx, &losses))
}

/// Sum of per-token losses in the accumulation precision.
pub fn loss_sum(ctx: &Ctx, losses: &[f64]) -> f64 {
    let acc = ctx.p.acc();
    losses.iter().fold(0.0, |s, l| acc.round(s + l))
}
