//! Pre-norm residual blocks: `x + attention(norm(x))`, `x + mlp(norm(x))`, `x + moe(norm(x))`, and the parallel block
//! `x + attention(norm(x)) + mlp(norm(x))`.
//! Column-parallel projections in, row-parallel projection out (Megatron); the bias of a
//! row-parallel layer is added once, after the partial sums are reduced.

use shardfuzz_kernels as k;

use super::moe::{moe_bwd, moe_fwd, MoeCache};
use super::qk_norm::{head_norm_bwd, head_norm_fwd, HeadNorm};
use super::region::{enter_bwd, enter_fwd, exit_bwd, exit_fwd, Geom};
use super::{accumulate, mat, opt_vec1, vec1, Bug, CResult, Ctx, Mat, ParamSet};
use crate::case::{Activation, LayerKind, NormKind};

const NORM_EPS: f64 = 1e-5;

#[derive(Clone)]
pub struct NormState {
    x: Mat,
    cache: k::NormCache,
}

/// Norm forward on the rows this rank holds.
pub fn norm_fwd(ctx: &Ctx, pre: &str, params: &ParamSet, x: &Mat) -> (Mat, NormState) {
    let w = vec1(params, &format!("{pre}.weight"));
    let (y, cache) = match ctx.model.norm {
        NormKind::Layernorm => {
            let b = opt_vec1(params, &format!("{pre}.bias"));
            k::layernorm_fwd(ctx.p, x, &w, b.as_ref(), NORM_EPS)
        }
        NormKind::Rmsnorm => k::rmsnorm_fwd(ctx.p, x, &w, NORM_EPS),
    };
    (y, NormState { x: x.clone(), cache })
}

/// The injected fault: under sequence parallelism the bias gradients of replicated parameters are
/// never reduced (callers check sequence parallelism).
fn sp_bias_grads_skipped(ctx: &Ctx) -> bool {
    ctx.bug(Bug::SpNormGradNotReduced)
}

/// Norm backward. Under sequence parallelism each rank saw only its rows, so the weight and bias
/// gradients are partial sums that must be all-reduced over the tensor-parallel group.
pub fn norm_bwd(ctx: &Ctx, pre: &str, params: &ParamSet, st: &NormState, dy: &Mat, grads: &mut ParamSet) -> CResult<Mat> {
    let wname = format!("{pre}.weight");
    let w = vec1(params, &wname);
    let g = match ctx.model.norm {
        NormKind::Layernorm => k::layernorm_bwd(ctx.p, &st.x, &w, &st.cache, dy),
        NormKind::Rmsnorm => k::rmsnorm_bwd(ctx.p, &st.x, &w, &st.cache, dy),
    };
    let mut dw = g.dw.to_vec();
    let mut db = g.db.as_ref().map(|d| d.to_vec());
    if ctx.sp() {
        let tp = ctx.tp.expect("sp implies tp");
        tp.all_reduce_sum(&mut dw)?;
        if let Some(db) = db.as_mut().filter(|_| !sp_bias_grads_skipped(ctx)) {
            tp.all_reduce_sum(db)?;
        }
    }
    accumulate(grads, &wname, &[dw.len()], &dw, ctx.dtype());
    if let (Some(db), true) = (db, params.contains_key(&format!("{pre}.bias"))) {
        accumulate(grads, &format!("{pre}.bias"), &[db.len()], &db, ctx.dtype());
    }
    Ok(g.dx)
}

/// Adds the bias of a row-parallel layer after the reduction (or, with the injected bug, on every
/// rank before it).
fn row_parallel_out(ctx: &Ctx, g: &Geom, partial: Mat, bias: Option<ndarray::Array1<f64>>) -> CResult<Mat> {
    let early = row_bias_early(ctx);
    let partial = match (&bias, early) {
        (Some(b), true) => k::add_row(ctx.p, &partial, b),
        _ => partial,
    };
    let out = exit_fwd(ctx, g, partial)?;
    Ok(match (&bias, early) {
        (Some(b), false) => k::add_row(ctx.p, &out, b),
        _ => out,
    })
}

/// The injected fault: the bias goes in before the reduction (a change only where there is one,
/// tp > 1).
pub(crate) fn row_bias_early(ctx: &Ctx) -> bool {
    ctx.bug(Bug::RowParallelBiasEveryRank)
}

/// Gradient of a row-parallel bias: summed over the rows held; partial under sequence parallelism.
fn row_bias_grad(ctx: &Ctx, name: &str, dy: &Mat, grads: &mut ParamSet) -> CResult<()> {
    let mut db = k::sum_rows(ctx.p, dy).to_vec();
    if ctx.sp() && !sp_bias_grads_skipped(ctx) {
        ctx.tp.expect("sp implies tp").all_reduce_sum(&mut db)?;
    }
    accumulate(grads, name, &[db.len()], &db, ctx.dtype());
    Ok(())
}

pub enum BlockCache {
    Attention(AttnState),
    Mlp(MlpState),
    Moe(MoeCache),
    Parallel(Box<(AttnState, MlpState)>),
}

pub struct AttnState {
    norm: NormState,
    y: Mat,
    q: Mat,
    k: Mat,
    v: Mat,
    a: Mat,
    cache: k::AttnCache,
    shape: k::AttnShape,
    scale: f64,
    /// The query and key norms' states (`model.qk_norm`).
    qk_norms: Option<Box<(HeadNorm, HeadNorm)>>,
}

pub struct MlpState {
    norm: NormState,
    y: Mat,
    up: Mat,
    gate: Option<Mat>,
    act: Mat,
}

/// Forward of block `i`; returns the new residual stream.
pub fn block_fwd(ctx: &Ctx, i: usize, kind: LayerKind, params: &ParamSet, g: &Geom, x: &Mat) -> CResult<(Mat, BlockCache)> {
    let pre = format!("layers.{i}");
    let (yn, norm) = norm_fwd(ctx, &format!("{pre}.norm"), params, x);
    let y = enter_fwd(ctx, g, yn)?;
    let (out, cache) = match kind {
        LayerKind::Attention => {
            let (out, st) = attention_fwd(ctx, &pre, params, g, y, norm)?;
            (out, BlockCache::Attention(st))
        }
        LayerKind::Mlp => {
            let (out, st) = mlp_fwd(ctx, &pre, params, g, y, norm)?;
            (out, BlockCache::Mlp(st))
        }
        LayerKind::Moe => {
            let (out, c) = moe_fwd(ctx, &pre, params, g, y, norm)?;
            (out, BlockCache::Moe(c))
        }
        LayerKind::Parallel => {
            // Both sublayers read the one normalised input; each reduces its own output over the tensor-parallel
            // ranks, as its block alone does.
            let (a, attn) = attention_fwd(ctx, &pre, params, g, y.clone(), norm.clone())?;
            let (m, mlp) = mlp_fwd(ctx, &pre, params, g, y, norm)?;
            (k::add(ctx.p, &a, &m), BlockCache::Parallel(Box::new((attn, mlp))))
        }
    };
    Ok((k::add(ctx.p, x, &out), cache))
}

/// Backward of block `i`: gradient of the residual stream in, out; parameter gradients accumulated.
pub fn block_bwd(ctx: &Ctx, i: usize, params: &ParamSet, g: &Geom, cache: BlockCache, dx: &Mat, grads: &mut ParamSet) -> CResult<Mat> {
    let pre = format!("layers.{i}");
    let (dy_full, norm) = match cache {
        BlockCache::Attention(st) => (attention_bwd(ctx, &pre, params, g, &st, dx, grads)?, st.norm),
        BlockCache::Mlp(st) => (mlp_bwd(ctx, &pre, params, g, &st, dx, grads)?, st.norm),
        BlockCache::Moe(st) => {
            let d = moe_bwd(ctx, &pre, params, g, &st, dx, grads)?;
            (d, st.norm)
        }
        BlockCache::Parallel(both) => {
            let (attn, mlp) = *both;
            let da = attention_bwd(ctx, &pre, params, g, &attn, dx, grads)?;
            let dm = mlp_bwd(ctx, &pre, params, g, &mlp, dx, grads)?;
            (k::add(ctx.p, &da, &dm), attn.norm)
        }
    };
    let dyn_local = enter_bwd(ctx, g, dy_full)?;
    let dnorm = norm_bwd(ctx, &format!("{pre}.norm"), params, &norm, &dyn_local, grads)?;
    Ok(k::add(ctx.p, dx, &dnorm))
}

fn attention_scale(ctx: &Ctx) -> f64 {
    let d = ctx.model.head_dim() as f64;
    // The injected fault: the head size computed from the local heads (wrong wherever tp > 1).
    if ctx.bug(Bug::AttnScaleLocalHeads) {
        let local = ctx.layout.local_heads().max(1) as f64;
        1.0 / (ctx.model.hidden as f64 / local).sqrt()
    } else {
        1.0 / d.sqrt()
    }
}

fn attention_fwd(ctx: &Ctx, pre: &str, params: &ParamSet, g: &Geom, y: Mat, norm: NormState) -> CResult<(Mat, AttnState)> {
    let proj = |n: &str| {
        let w = mat(params, &format!("{pre}.attn.{n}.weight"));
        let b = opt_vec1(params, &format!("{pre}.attn.{n}.bias"));
        k::linear_fwd(ctx.p, &y, &w, b.as_ref())
    };
    let (q, kk, v) = (proj("q"), proj("k"), proj("v"));
    let (q, kk, qk_norms) = if ctx.model.qk_norm {
        let (q, qn) = head_norm_fwd(ctx, &format!("{pre}.attn.q_norm.weight"), params, q);
        let (kk, kn) = head_norm_fwd(ctx, &format!("{pre}.attn.k_norm.weight"), params, kk);
        (q, kk, Some(Box::new((qn, kn))))
    } else {
        (q, kk, None)
    };
    let (q, kk) = match rotary(ctx, g) {
        Some((rq, rk)) => (k::rotary_fwd(ctx.p, &q, rq), k::rotary_fwd(ctx.p, &kk, rk)),
        None => (q, kk),
    };
    let shape = k::AttnShape {
        batch: g.batch,
        seq: g.seq,
        q_heads: ctx.layout.local_heads(),
        kv_heads: ctx.layout.kv_heads.len(),
        head_dim: ctx.model.head_dim(),
    };
    let scale = attention_scale(ctx);
    let (a, cache) = k::attention_fwd(ctx.p, &q, &kk, &v, shape, scale);
    record_attention_scores(ctx, pre, &cache);
    let wo = mat(params, &format!("{pre}.attn.o.weight"));
    let partial = k::matmul(ctx.p, &a, &wo);
    let out = row_parallel_out(ctx, g, partial, opt_vec1(params, &format!("{pre}.attn.o.bias")))?;
    Ok((out, AttnState { norm, y, q, k: kk, v, a, cache, shape, scale, qk_norms }))
}

/// The rotary embeddings of the local query and key heads (`model.rotary_base`), or None without one. Attention
/// always sees whole sequences here (sequence parallelism gathers them first), so row r is position r mod seq.
fn rotary(ctx: &Ctx, g: &Geom) -> Option<(k::RotaryShape, k::RotaryShape)> {
    let base = f64::from(ctx.model.rotary_base?);
    let at = |heads| k::RotaryShape { seq: g.seq, heads, head_dim: ctx.model.head_dim(), base };
    Some((at(ctx.layout.local_heads()), at(ctx.layout.kv_heads.len())))
}

/// Appends every query row's scores to `ctx.attention_scores` while it records (the oracle reads
/// how far round-off moves them against each row's margin to its runner-up).
fn record_attention_scores(ctx: &Ctx, pre: &str, cache: &k::AttnCache) {
    let mut recorded = ctx.attention_scores.borrow_mut();
    let Some(rows) = recorded.as_mut() else { return };
    let layer = pre.rsplit('.').next().and_then(|n| n.parse().ok()).unwrap_or(0);
    for sc in &cache.scores {
        for (i, row) in sc.rows().into_iter().enumerate() {
            rows.push(crate::target::AttentionRow { layer, scores: row.iter().take(i + 1).copied().collect() });
        }
    }
}

fn attention_bwd(ctx: &Ctx, pre: &str, params: &ParamSet, g: &Geom, st: &AttnState, dx: &Mat, grads: &mut ParamSet) -> CResult<Mat> {
    let dt = ctx.dtype();
    let bname = format!("{pre}.attn.o.bias");
    if params.contains_key(&bname) {
        row_bias_grad(ctx, &bname, dx, grads)?;
    }
    let dout = exit_bwd(ctx, g, dx.clone())?;
    let wo_name = format!("{pre}.attn.o.weight");
    let wo = mat(params, &wo_name);
    let dwo = k::matmul_tn(ctx.p, &st.a, &dout);
    accumulate(grads, &wo_name, &[wo.nrows(), wo.ncols()], dwo.as_slice().expect("std"), dt);
    let da = k::matmul_nt(ctx.p, &dout, &wo);
    let (dq, dk, dv) = k::attention_bwd(ctx.p, &st.q, &st.k, &st.v, &st.cache, &da, st.shape, st.scale);
    let (dq, dk) = match rotary(ctx, g) {
        Some((rq, rk)) => (k::rotary_bwd(ctx.p, &dq, rq), k::rotary_bwd(ctx.p, &dk, rk)),
        None => (dq, dk),
    };
    let (dq, dk) = match st.qk_norms.as_deref() {
        Some((qn, kn)) => (qk_norm_bwd(ctx, pre, params, "q", qn, &dq, grads)?, qk_norm_bwd(ctx, pre, params, "k", kn, &dk, grads)?),
        None => (dq, dk),
    };
    let mut dy: Option<Mat> = None;
    for (n, d) in [("q", dq), ("k", dk), ("v", dv)] {
        let wname = format!("{pre}.attn.{n}.weight");
        let w = mat(params, &wname);
        let lg = k::linear_bwd(ctx.p, &st.y, &w, &d);
        let mut dw = lg.dw.as_slice().expect("std").to_vec();
        let bname = format!("{pre}.attn.{n}.bias");
        let has_bias = params.contains_key(&bname);
        let mut db = lg.db.to_vec();
        if n != "q" && ctx.layout.kv_replicated && ctx.tp_size() > 1 {
            // Ranks sharing a replicated kv head each hold part of its gradient.
            reduce_replicated_kv(ctx, &mut dw)?;
            if has_bias {
                reduce_replicated_kv(ctx, &mut db)?;
            }
        }
        accumulate(grads, &wname, &[w.nrows(), w.ncols()], &dw, dt);
        if has_bias {
            accumulate(grads, &bname, &[db.len()], &db, dt);
        }
        dy = Some(match dy {
            None => lg.dx,
            Some(acc) => k::add(ctx.p, &acc, &lg.dx),
        });
    }
    Ok(dy.expect("three projections"))
}

/// Backward of the query (`which` "q") or key ("k") norm: its weight's gradient accumulated (a replicated kv head's
/// summed over the ranks sharing it, as its projection's), the input gradient returned.
fn qk_norm_bwd(ctx: &Ctx, pre: &str, params: &ParamSet, which: &str, st: &HeadNorm, dy: &Mat, grads: &mut ParamSet) -> CResult<Mat> {
    let name = format!("{pre}.attn.{which}_norm.weight");
    let (dx, mut dw) = head_norm_bwd(ctx, &name, params, st, dy);
    if which == "k" && ctx.layout.kv_replicated && ctx.tp_size() > 1 {
        reduce_replicated_kv(ctx, &mut dw)?;
    }
    accumulate(grads, &name, &[dw.len()], &dw, ctx.dtype());
    Ok(dx)
}

/// Sums the gradient of a replicated kv head over the tensor-parallel ranks that share it: each
/// rank writes its contribution at its head's slot of a buffer over all kv heads, the buffer is
/// all-reduced, and each rank reads its slot back.
fn reduce_replicated_kv(ctx: &Ctx, g: &mut [f64]) -> CResult<()> {
    let kv = ctx.model.kv_heads as usize;
    let slot = ctx.layout.kv_heads.start;
    let n = g.len();
    let mut buf = vec![0.0; n * kv];
    buf[slot * n..(slot + 1) * n].copy_from_slice(g);
    ctx.tp.expect("tp").all_reduce_sum(&mut buf)?;
    g.copy_from_slice(&buf[slot * n..(slot + 1) * n]);
    Ok(())
}

fn mlp_fwd(ctx: &Ctx, pre: &str, params: &ParamSet, g: &Geom, y: Mat, norm: NormState) -> CResult<(Mat, MlpState)> {
    let lin = |n: &str| {
        let w = mat(params, &format!("{pre}.mlp.{n}.weight"));
        let b = opt_vec1(params, &format!("{pre}.mlp.{n}.bias"));
        k::linear_fwd(ctx.p, &y, &w, b.as_ref())
    };
    if ctx.bug(Bug::EmptyShardIndexed) {
        if let Some(b) = params.get(&format!("{pre}.mlp.up.bias")) {
            // The injected fault: "peek at the first bias element" without checking the shard size.
            let _first = b.data[0];
        }
    }
    let (up, gate, act) = activation_fwd(ctx, lin);
    let wd = mat(params, &format!("{pre}.mlp.down.weight"));
    let partial = k::matmul(ctx.p, &act, &wd);
    let out = if ctx.bug(Bug::CollectiveNonEmptyOnly) && ctx.layout.ffn.is_empty() {
        // The injected fault: a rank with nothing to contribute skips the collective.
        partial
    } else {
        row_parallel_out(ctx, g, partial, opt_vec1(params, &format!("{pre}.mlp.down.bias")))?
    };
    Ok((out, MlpState { norm, y, up, gate, act }))
}

fn mlp_bwd(ctx: &Ctx, pre: &str, params: &ParamSet, g: &Geom, st: &MlpState, dx: &Mat, grads: &mut ParamSet) -> CResult<Mat> {
    let dt = ctx.dtype();
    let bname = format!("{pre}.mlp.down.bias");
    if params.contains_key(&bname) {
        row_bias_grad(ctx, &bname, dx, grads)?;
    }
    let dout = exit_bwd(ctx, g, dx.clone())?;
    let wd_name = format!("{pre}.mlp.down.weight");
    let wd = mat(params, &wd_name);
    let lg = k::linear_bwd(ctx.p, &st.act, &wd, &dout);
    accumulate(grads, &wd_name, &[wd.nrows(), wd.ncols()], lg.dw.as_slice().expect("std"), dt);
    let dact = lg.dx;
    let lin_bwd = |n: &str, d: &Mat| -> Mat {
        let wname = format!("{pre}.mlp.{n}.weight");
        let w = mat(params, &wname);
        let lg = k::linear_bwd(ctx.p, &st.y, &w, d);
        accumulate(grads, &wname, &[w.nrows(), w.ncols()], lg.dw.as_slice().expect("std"), dt);
        let bname = format!("{pre}.mlp.{n}.bias");
        if params.contains_key(&bname) {
            accumulate(grads, &bname, &[lg.db.len()], &lg.db.to_vec(), dt);
        }
        lg.dx
    };
    Ok(activation_bwd(ctx, &st.up, st.gate.as_ref(), &dact, lin_bwd))
}

/// The FFN's input projections and activation: `gelu(up(x))` or `silu(gate(x)) * up(x)`.
/// Returns (up, gate, activation); `lin` applies a named input projection.
pub(super) fn activation_fwd(ctx: &Ctx, lin: impl Fn(&str) -> Mat) -> (Mat, Option<Mat>, Mat) {
    let up = lin("up");
    match ctx.model.activation {
        Activation::Gelu => {
            let act = k::gelu_fwd(ctx.p, &up);
            (up, None, act)
        }
        Activation::Swiglu => {
            let gate = lin("gate");
            let act = k::swiglu_fwd(ctx.p, &gate, &up);
            (up, Some(gate), act)
        }
    }
}

/// Backward of [`activation_fwd`]: `lin_bwd` takes a projection's name and output gradient and
/// returns its input gradient; the result is the summed input gradient.
pub(super) fn activation_bwd(ctx: &Ctx, up: &Mat, gate: Option<&Mat>, dact: &Mat, mut lin_bwd: impl FnMut(&str, &Mat) -> Mat) -> Mat {
    match gate {
        None => {
            let dup = k::gelu_bwd(ctx.p, up, dact);
            lin_bwd("up", &dup)
        }
        Some(gate) => {
            let (dgate, dup) = k::swiglu_bwd(ctx.p, gate, up, dact);
            let a = lin_bwd("gate", &dgate);
            let b = lin_bwd("up", &dup);
            k::add(ctx.p, &a, &b)
        }
    }
}
