//! The ends of the model: vocab-parallel embedding, and the LM head with vocab-parallel
//! cross-entropy (Megatron's `vocab_parallel_cross_entropy`). The vocabulary is padded to a multiple
//! of the tensor-parallel degree; padded logits are masked out of the softmax.

use shardfuzz_kernels as k;

use super::blocks::{norm_bwd, norm_fwd, NormState};
use super::region::{enter_bwd, enter_fwd, exit_bwd, exit_fwd, Geom};
use super::{accumulate, mat, Bug, CResult, Ctx, Mat, ParamSet};

/// Embedding lookup of `ids` (every token of the micro-batch); returns the rows this rank holds.
pub fn embed_fwd(ctx: &Ctx, params: &ParamSet, g: &Geom, ids: &[usize]) -> CResult<Mat> {
    let table = mat(params, "embed.weight");
    let partial = k::embedding_fwd(ctx.p, ids, &table, ctx.layout.vocab.start);
    exit_fwd(ctx, g, partial)
}

pub fn embed_bwd(ctx: &Ctx, params: &ParamSet, g: &Geom, ids: &[usize], dx: &Mat, grads: &mut ParamSet) -> CResult<()> {
    let table = &params["embed.weight"];
    let dfull = exit_bwd(ctx, g, dx.clone())?;
    let dt = k::embedding_bwd(ctx.p, ids, &dfull, table.shape[0], ctx.layout.vocab.start);
    accumulate(grads, "embed.weight", &table.shape, dt.as_slice().expect("std"), ctx.dtype());
    Ok(())
}

fn head_name(ctx: &Ctx) -> &'static str {
    if ctx.model.tied_embeddings {
        "embed.weight"
    } else {
        "lm_head.weight"
    }
}

pub struct HeadCache {
    norm: NormState,
    z: Mat,
    dlogits: Mat,
}

/// Final norm, LM head and cross-entropy. Returns the per-token losses (every token of the
/// micro-batch), this rank's logits `[tokens, local vocab]` and the cache for the backward pass.
/// `grad_scale` multiplies the loss gradient (1 / global tokens, times the loss scale).
pub fn head_fwd(
    ctx: &Ctx,
    params: &ParamSet,
    g: &Geom,
    x: &Mat,
    targets: &[usize],
    grad_scale: f64,
) -> CResult<(Vec<f64>, Mat, HeadCache)> {
    let (zl, norm) = norm_fwd(ctx, "final_norm", params, x);
    let z = enter_fwd(ctx, g, zl)?;
    let w = mat(params, head_name(ctx));
    let mut logits = k::matmul_nt(ctx.p, &z, &w);
    let lay = ctx.layout;
    let unmasked = ctx.bug(Bug::VocabPadUnmasked);
    if !unmasked {
        for (j, mut col) in logits.columns_mut().into_iter().enumerate() {
            if lay.vocab.start + j >= lay.vocab_real {
                col.fill(f64::NEG_INFINITY);
            }
        }
    }
    let smoothing = k::LabelSmoothing { eps: ctx.label_smoothing, vocab: lay.vocab_real };
    let (losses, dlogits) = match ctx.tp.filter(|t| t.size() > 1) {
        None => {
            let ce = k::cross_entropy_fwd_bwd(ctx.p, &logits, targets, grad_scale, smoothing);
            (ce.losses.to_vec(), ce.dlogits)
        }
        Some(tp) => vocab_parallel_cross_entropy(ctx, tp, &logits, targets, grad_scale, smoothing)?,
    };
    let (losses, dlogits) = weighted(ctx, targets, losses, dlogits);
    let shown = logits.mapv(|x| if x == f64::NEG_INFINITY { 0.0 } else { x });
    Ok((losses, shown, HeadCache { norm, z, dlogits }))
}

/// Cross-entropy over this rank's vocabulary slice of the logits (padding columns −∞): the row max, the
/// sum of exponentials and the target's logit (with label smoothing, the sum of the real logits too)
/// all-reduced over the tensor-parallel group.
fn vocab_parallel_cross_entropy(
    ctx: &Ctx,
    tp: &dyn super::GroupOps,
    logits: &Mat,
    targets: &[usize],
    grad_scale: f64,
    smoothing: k::LabelSmoothing,
) -> CResult<(Vec<f64>, Mat)> {
    let lay = ctx.layout;
    let real = |j: usize| lay.vocab.start + j < lay.vocab_real;
    let mut mx = k::row_max(ctx.p, logits).to_vec();
    tp.all_reduce_max(&mut mx)?;
    let mx = ndarray::Array1::from_vec(mx);
    let mut se = k::row_sum_exp(ctx.p, logits, &mx).to_vec();
    let acc = ctx.p.acc();
    tp.all_reduce_sum_in(&mut se, acc.dtype)?;
    let mut tl = k::target_logit(logits, targets, lay.vocab.start).to_vec();
    tp.all_reduce_sum_in(&mut tl, acc.dtype)?;
    let mut sums = vec![0.0; logits.nrows()];
    if smoothing.eps > 0.0 {
        sums = k::row_sum(ctx.p, logits, real).to_vec();
        tp.all_reduce_sum_in(&mut sums, acc.dtype)?;
    }
    let mut losses: Vec<f64> = (0..logits.nrows())
        .map(|t| ctx.p.r(smoothing.loss(acc, acc.round(acc.round(se[t].ln()) + mx[t] - tl[t]), tl[t], sums[t])))
        .collect();
    let mut d = Mat::zeros(logits.raw_dim());
    for t in 0..logits.nrows() {
        for j in 0..logits.ncols() {
            let prob = acc.round(acc.round((logits[[t, j]] - mx[t]).exp()) / se[t]);
            let mass = smoothing.target_mass(lay.vocab.start + j == targets[t], real(j));
            d[[t, j]] = ctx.p.r(acc.round(prob - mass) * grad_scale);
        }
    }
    k::mask_ignored(targets, &mut losses, &mut d);
    Ok((losses, d))
}

/// Each row's loss and logits' gradient times its target's class weight (as torch's weighted
/// cross-entropy: the weight multiplies the loss in the case dtype).
fn weighted(ctx: &Ctx, targets: &[usize], mut losses: Vec<f64>, mut d: Mat) -> (Vec<f64>, Mat) {
    if ctx.class_weights.is_empty() {
        return (losses, d);
    }
    for (i, &t) in targets.iter().enumerate() {
        if let Some(&w) = ctx.class_weights.get(t) {
            losses[i] = ctx.p.r(losses[i] * w);
            d.row_mut(i).mapv_inplace(|x| ctx.p.r(x * w));
        }
    }
    (losses, d)
}

/// Backward of [`head_fwd`]: returns the gradient of the residual stream rows this rank holds.
pub fn head_bwd(ctx: &Ctx, params: &ParamSet, g: &Geom, cache: HeadCache, grads: &mut ParamSet) -> CResult<Mat> {
    let name = head_name(ctx);
    let w = mat(params, name);
    let dz = k::matmul(ctx.p, &cache.dlogits, &w);
    let dw = k::matmul_tn(ctx.p, &cache.dlogits, &cache.z);
    accumulate(grads, name, &[w.nrows(), w.ncols()], dw.as_slice().expect("std"), ctx.dtype());
    let dzl = enter_bwd(ctx, g, dz)?;
    norm_bwd(ctx, "final_norm", params, &cache.norm, &dzl, grads)
}
