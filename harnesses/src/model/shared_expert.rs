//! A MoE block's shared expert: an MLP (no biases) every token passes through, split over the tensor-parallel
//! group like the dense MLP; its partial output joins the routed experts' before the block's reduction. With a
//! shared gate, each token's output is scaled by sigmoid(y · w), w replicated over the group.

use shardfuzz_kernels as k;

use super::blocks::{activation_bwd, activation_fwd};
use super::{accumulate, mat, CResult, Ctx, Mat, ParamSet};

pub struct SharedState {
    up: Mat,
    gate: Option<Mat>,
    act: Mat,
    /// The MLP's (partial) output before the gate, `[tokens, hidden]`.
    raw: Mat,
    /// The gate's sigmoid per token, `[tokens, 1]`.
    score: Option<Mat>,
}

fn weight_name(pre: &str, n: &str) -> String {
    format!("{pre}.moe.shared.{n}.weight")
}

fn gate_name(pre: &str) -> String {
    format!("{pre}.moe.shared_gate.weight")
}

/// Each row of `m` times the matching entry of the column `s`.
fn scale_rows(ctx: &Ctx, m: &Mat, s: &Mat) -> Mat {
    let mut out = m.clone();
    for (mut row, &v) in out.rows_mut().into_iter().zip(s.column(0).iter()) {
        row.mapv_inplace(|x| ctx.p.r(x * v));
    }
    out
}

/// The shared expert's (partial) output on the block input `y` and its state, or None without one.
pub fn shared_fwd(ctx: &Ctx, pre: &str, params: &ParamSet, y: &Mat) -> Option<(Mat, SharedState)> {
    if !params.contains_key(&weight_name(pre, "up")) {
        return None;
    }
    let lin = |n: &str| k::matmul(ctx.p, y, &mat(params, &weight_name(pre, n)));
    let (up, gate, act) = activation_fwd(ctx, lin);
    let raw = k::matmul(ctx.p, &act, &mat(params, &weight_name(pre, "down")));
    let score = params.get(&gate_name(pre)).map(|_| {
        let logits = k::matmul(ctx.p, y, &mat(params, &gate_name(pre)));
        logits.mapv(|v| ctx.p.r(k::sigmoid(v)))
    });
    let out = score.as_ref().map_or_else(|| raw.clone(), |s| scale_rows(ctx, &raw, s));
    Some((out, SharedState { up, gate, act, raw, score }))
}

/// Backward of [`shared_fwd`] given the gradient of the block's (partial) output: the weights' gradients
/// accumulated, the gradient of `y` returned (partial over the group, the gate's part on rank 0 only).
pub fn shared_bwd(ctx: &Ctx, pre: &str, params: &ParamSet, st: &SharedState, y: &Mat, dout: &Mat, grads: &mut ParamSet) -> CResult<Mat> {
    let dt = ctx.dtype();
    let (draw, dy_gate) = match &st.score {
        None => (dout.clone(), None),
        Some(s) => (scale_rows(ctx, dout, s), Some(gate_bwd(ctx, pre, params, st, y, dout, grads)?)),
    };
    let wd_name = weight_name(pre, "down");
    let wd = mat(params, &wd_name);
    let lg = k::linear_bwd(ctx.p, &st.act, &wd, &draw);
    accumulate(grads, &wd_name, &[wd.nrows(), wd.ncols()], lg.dw.as_slice().expect("std"), dt);
    let lin_bwd = |n: &str, d: &Mat| -> Mat {
        let name = weight_name(pre, n);
        let w = mat(params, &name);
        let lg = k::linear_bwd(ctx.p, y, &w, d);
        accumulate(grads, &name, &[w.nrows(), w.ncols()], lg.dw.as_slice().expect("std"), dt);
        lg.dx
    };
    let dy = activation_bwd(ctx, &st.up, st.gate.as_ref(), &lg.dx, lin_bwd);
    Ok(match dy_gate {
        Some(d) => k::add(ctx.p, &dy, &d),
        None => dy,
    })
}

/// The gate's backward: d score per token is the row dot of the output gradient with the MLP's output, a sum over
/// the group (each rank holds a partial output); the gate weight's gradient accumulated, its input gradient returned.
fn gate_bwd(ctx: &Ctx, pre: &str, params: &ParamSet, st: &SharedState, y: &Mat, dout: &Mat, grads: &mut ParamSet) -> CResult<Mat> {
    let s = st.score.as_ref().expect("a gated shared expert");
    let acc = ctx.p.acc();
    let mut dscore: Vec<f64> = dout
        .rows()
        .into_iter()
        .zip(st.raw.rows())
        .map(|(d, r)| d.iter().zip(r.iter()).fold(0.0, |a, (x, v)| acc.round(a + x * v)))
        .collect();
    if let Some(tp) = ctx.tp.filter(|t| t.size() > 1) {
        tp.all_reduce_sum(&mut dscore)?;
    }
    let dlogit = Mat::from_shape_fn((dscore.len(), 1), |(t, _)| {
        let v = s[[t, 0]];
        ctx.p.r(ctx.p.r(dscore[t]) * acc.round(v * (1.0 - v)))
    });
    let name = gate_name(pre);
    let w = mat(params, &name);
    let dw = k::matmul_tn(ctx.p, y, &dlogit);
    accumulate(grads, &name, &[w.nrows(), w.ncols()], dw.as_slice().expect("std"), ctx.dtype());
    // Every rank computes the replicated gate alike: its input gradient is added once (rank 0).
    let dy = k::matmul_nt(ctx.p, &dlogit, &w);
    Ok(if ctx.tp_index() == 0 { dy } else { Mat::zeros(dy.raw_dim()) })
}
