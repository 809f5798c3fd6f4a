//! Query/key normalisation (`model.qk_norm`): each head's query and key vectors normalised over the head size by the
//! model's norm kind, without bias, with a weight per element of every head (Cohere Command R+'s `q_norm` /
//! `k_norm`), before the rotary embedding. A rank holds the weights of its own heads.

use ndarray::s;
use shardfuzz_kernels as k;

use super::{vec1, Ctx, Mat, ParamSet};
use crate::case::NormKind;

const NORM_EPS: f64 = 1e-5;

pub struct HeadNorm {
    x: Mat,
    caches: Vec<k::NormCache>,
}

/// The per-head norm of `x` [rows, heads * head_dim] with weight `name` [heads * head_dim].
pub fn head_norm_fwd(ctx: &Ctx, name: &str, params: &ParamSet, x: Mat) -> (Mat, HeadNorm) {
    let w = vec1(params, name);
    let d = ctx.model.head_dim();
    let mut out = Mat::zeros(x.dim());
    let mut caches = Vec::new();
    for h in 0..x.ncols() / d.max(1) {
        let (xh, wh) = (x.slice(s![.., h * d..(h + 1) * d]).to_owned(), w.slice(s![h * d..(h + 1) * d]).to_owned());
        let (y, cache) = match ctx.model.norm {
            NormKind::Layernorm => k::layernorm_fwd(ctx.p, &xh, &wh, None, NORM_EPS),
            NormKind::Rmsnorm => k::rmsnorm_fwd(ctx.p, &xh, &wh, NORM_EPS),
        };
        out.slice_mut(s![.., h * d..(h + 1) * d]).assign(&y);
        caches.push(cache);
    }
    (out, HeadNorm { x, caches })
}

/// Backward of [`head_norm_fwd`]: (input gradient, weight gradient).
pub fn head_norm_bwd(ctx: &Ctx, name: &str, params: &ParamSet, st: &HeadNorm, dy: &Mat) -> (Mat, Vec<f64>) {
    let w = vec1(params, name);
    let d = ctx.model.head_dim();
    let mut dx = Mat::zeros(st.x.dim());
    let mut dw = vec![0.0; w.len()];
    for (h, cache) in st.caches.iter().enumerate() {
        let cols = h * d..(h + 1) * d;
        let xh = st.x.slice(s![.., cols.clone()]).to_owned();
        let (wh, dyh) = (w.slice(s![cols.clone()]).to_owned(), dy.slice(s![.., cols.clone()]).to_owned());
        let g = match ctx.model.norm {
            NormKind::Layernorm => k::layernorm_bwd(ctx.p, &xh, &wh, cache, &dyh),
            NormKind::Rmsnorm => k::rmsnorm_bwd(ctx.p, &xh, &wh, cache, &dyh),
        };
        dx.slice_mut(s![.., cols.clone()]).assign(&g.dx);
        dw[cols].copy_from_slice(g.dw.as_slice().expect("standard layout"));
    }
    (dx, dw)
}
