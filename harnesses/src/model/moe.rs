//! Mixture of experts: top-k routing with a per-sequence capacity, experts spread over the
//! expert-parallel group (all-to-all dispatch and combine), each expert an MLP split over the
//! tensor-parallel group like the dense one.

use shardfuzz_kernels as k;

use super::blocks::{activation_bwd, activation_fwd, NormState};
use super::region::{exit_bwd, exit_fwd, Geom};
use super::shared_expert::{shared_bwd, shared_fwd, SharedState};
use super::{accumulate, mat, Bug, CResult, Ctx, Mat, ParamSet};
use crate::tensor::Tensor;

/// One routed (token, choice) pair.
#[derive(Debug, Clone, Copy)]
struct Entry {
    token: usize,
    choice: usize,
    expert: usize,
}

/// What an owner computed for one local expert, kept for the backward pass.
struct ExpertRun {
    /// (source member, position in that source's message) of each row.
    rows: Vec<(usize, usize)>,
    x: Mat,
    up: Mat,
    gate: Option<Mat>,
    act: Mat,
}

pub struct MoeCache {
    pub(super) norm: NormState,
    y: Mat,
    routing: k::Routing,
    /// Gradient of the auxiliary loss with respect to every router probability, when there is one.
    aux: Option<Mat>,
    /// Entries sent to each expert-parallel member, in message order.
    sent: Vec<Vec<Entry>>,
    /// For each member's returned rows: the entry each row is combined into.
    combine: Vec<Vec<Entry>>,
    /// Returned (partial) expert outputs, per member, `[rows, hidden]`.
    results: Vec<Mat>,
    runs: Vec<(usize, ExpertRun)>,
    /// Row counts received from each member.
    received: Vec<usize>,
    shared: Option<Box<SharedState>>,
}

fn ep_size(ctx: &Ctx) -> usize {
    ctx.ep.map_or(1, |g| g.size())
}

/// Owner (expert-parallel member) of global expert `e`.
fn owner(ctx: &Ctx, e: usize) -> usize {
    let total = ctx.model.moe.as_ref().map_or(1, |c| c.experts as usize);
    e / (total / ep_size(ctx)).max(1)
}

fn exchange(ctx: &Ctx, send: Vec<Vec<f64>>) -> CResult<Vec<Vec<f64>>> {
    match ctx.ep {
        Some(g) if g.size() > 1 => g.all_to_all(send),
        _ => Ok(send),
    }
}

/// Slice `[e]` of a stacked `[experts, rows, cols]` tensor as a matrix.
fn expert_mat(t: &Tensor, e: usize) -> Mat {
    let (r, c) = (t.shape[1], t.shape[2]);
    Mat::from_shape_vec((r, c), t.data[e * r * c..(e + 1) * r * c].to_vec()).expect("expert slice")
}

fn expert_row(t: &Tensor, e: usize) -> ndarray::Array1<f64> {
    let c = t.shape[1];
    ndarray::Array1::from_vec(t.data[e * c..(e + 1) * c].to_vec())
}

/// Adds `g` into slice `[e]` of the stacked gradient `name`.
fn accumulate_expert(grads: &mut ParamSet, name: &str, shape: &[usize], e: usize, g: &[f64], ctx: &Ctx) {
    let t = grads.entry(name.to_string()).or_insert_with(|| Tensor::zeros(shape.to_vec()));
    let n = g.len();
    k::sum_into(&mut t.data[e * n..(e + 1) * n], g, ctx.dtype());
}

/// The load-balancing loss's gradient with respect to the router probabilities, `[tokens,
/// experts]`, in loss-gradient units (`ctx.loss_grad_scale` per token): per sequence, coef ×
/// experts × Σ_e f_e P_e summed over its tokens' probabilities, so p[t, e] gets coef × experts ×
/// f_e. The routing counts (f_e) are not differentiated, as in every implementation. Every
/// tensor-parallel rank holds whole sequences here (gathered under sequence parallelism).
fn aux_loss_dprobs(ctx: &Ctx, g: &Geom, routing: &k::Routing, experts: usize) -> Option<Mat> {
    let coef = ctx.model.moe.as_ref()?.aux_loss?.get();
    let top_k = routing.gates.ncols();
    // The injected fault's region: sequence parallelism, where a rank holds a chunk of each
    // sequence outside the tensor-parallel region.
    let seq_tokens = if ctx.bug(Bug::AuxLossLocalTokens) && ctx.sp() { g.seq_range(ctx, ctx.tp_index()).len() } else { g.seq };
    let scale = coef * experts as f64 * ctx.loss_grad_scale.get() * ctx.counted_share / (seq_tokens * top_k) as f64;
    let mut d = Mat::zeros(routing.probs.raw_dim());
    for b in 0..g.batch {
        let toks = b * g.seq..(b + 1) * g.seq;
        let mut counts = vec![0usize; experts];
        routing.experts[toks.clone()].iter().flatten().for_each(|&e| counts[e] += 1);
        for t in toks {
            for (e, &n) in counts.iter().enumerate() {
                d[[t, e]] = ctx.p.r(scale * n as f64);
            }
        }
    }
    Some(d)
}

pub fn moe_fwd(ctx: &Ctx, pre: &str, params: &ParamSet, g: &Geom, y: Mat, norm: NormState) -> CResult<(Mat, MoeCache)> {
    let cfg = ctx.model.moe.as_ref().expect("validated: moe config present");
    let e_total = cfg.experts as usize;
    let h = y.ncols();
    let routing = route(ctx, pre, params, &y, cfg.top_k as usize, cfg.renormalize);
    let aux = aux_loss_dprobs(ctx, g, &routing, e_total);
    let cap = k::capacity(g.seq, e_total, cfg.top_k as usize, cfg.capacity_factor.get());
    // The injected fault's region: an all-to-all over several expert-parallel ranks.
    let drop_bug = ctx.bug(Bug::MoeSplitSizesDropped) && ep_size(ctx) > 1;
    let (sent, kept_only) = dispatch_lists(ctx, g, &routing, cap, drop_bug);
    let recv = exchange(ctx, pack_rows(&sent, &y))?;
    let received: Vec<usize> = recv.iter().map(|m| m.len() / (h + 1)).collect();
    let (out_msgs, runs) = run_experts(ctx, pre, params, &recv, h);
    let back = exchange(ctx, out_msgs)?;
    let combine = if drop_bug { kept_only } else { sent.clone() };
    let (mut partial, results) = combine_outputs(ctx, back, &combine, &routing, y.nrows(), h);
    let shared = shared_fwd(ctx, pre, params, &y).map(|(out, st)| {
        partial = k::add(ctx.p, &partial, &out);
        Box::new(st)
    });
    let out = exit_fwd(ctx, g, partial)?;
    Ok((out, MoeCache { norm, y, routing, aux, sent, combine, results, runs, received, shared }))
}

/// Top-k routing of every token; the noise members' near-tie flips and gate jitter applied.
fn route(ctx: &Ctx, pre: &str, params: &ParamSet, y: &Mat, top_k: usize, renormalize: bool) -> k::Routing {
    let wr = mat(params, &format!("{pre}.moe.router.weight"));
    let logits = k::matmul(ctx.p, y, &wr);
    let mut routing = k::router_fwd(ctx.p, &logits, top_k, renormalize);
    if let Some(probs) = ctx.router_probs.borrow_mut().as_mut() {
        probs.extend(routing.probs.iter());
    }
    let e_total = routing.probs.ncols();
    let mut flipped = false;
    if top_k < e_total {
        for t in 0..routing.experts.len() {
            let ex = &routing.experts[t];
            let chosen = routing.probs[[t, ex[top_k - 1]]];
            let (other, best_other) = (0..e_total)
                .filter(|e| !ex.contains(e))
                .map(|e| (e, routing.probs[[t, e]]))
                .fold((0, f64::NEG_INFINITY), |a, b| if b.1 > a.1 { b } else { a });
            ctx.routing_margin.set(ctx.routing_margin.get().min(chosen - best_other));
            if chosen - best_other < ctx.flip_routing_below {
                let i = ctx.near_ties.get();
                ctx.near_ties.set(i + 1);
                if ctx.flip_only.is_none_or(|set| set >> i.min(63) & 1 == 1) {
                    routing.experts[t][top_k - 1] = other;
                    flipped = true;
                }
            }
        }
    }
    if flipped {
        routing.refresh_gates(ctx.p);
    }
    if let Some(jitter) = ctx.gate_jitter {
        for ((t, c), gate) in routing.gates.indexed_iter_mut() {
            *gate += jitter.shift(t, c);
        }
    }
    routing
}

/// The entries sent to each expert-parallel member (with the injected fault, dropped ones too) and
/// the entries each member keeps within capacity, in message order.
fn dispatch_lists(ctx: &Ctx, g: &Geom, routing: &k::Routing, cap: usize, drop_bug: bool) -> (Vec<Vec<Entry>>, Vec<Vec<Entry>>) {
    let members = ep_size(ctx);
    let e_total = routing.probs.ncols();
    let mut sent: Vec<Vec<Entry>> = vec![vec![]; members];
    let mut kept_only: Vec<Vec<Entry>> = vec![vec![]; members];
    for b in 0..g.batch {
        let toks = b * g.seq..(b + 1) * g.seq;
        let slots = k::assign_capacity(&routing.experts[toks.clone()], e_total, cap);
        for (j, t) in toks.enumerate() {
            for (c, slot) in slots[j].iter().enumerate() {
                let e = routing.experts[t][c];
                let entry = Entry { token: t, choice: c, expert: e };
                let o = owner(ctx, e);
                if slot.is_some() {
                    sent[o].push(entry);
                    kept_only[o].push(entry);
                } else {
                    ctx.tokens_dropped.set(true);
                    if drop_bug {
                        sent[o].push(entry);
                    }
                }
            }
        }
    }
    (sent, kept_only)
}

/// Dispatch messages: each entry travels as [expert id, row of y].
fn pack_rows(sent: &[Vec<Entry>], y: &Mat) -> Vec<Vec<f64>> {
    let h = y.ncols();
    sent.iter()
        .map(|entries| {
            let mut m = Vec::with_capacity(entries.len() * (h + 1));
            for en in entries {
                m.push(en.expert as f64);
                m.extend(y.row(en.token).iter());
            }
            m
        })
        .collect()
}

/// Each local expert's MLP on the rows it received: the messages returned to each member and what
/// the backward pass needs.
fn run_experts(ctx: &Ctx, pre: &str, params: &ParamSet, recv: &[Vec<f64>], h: usize) -> (Vec<Vec<f64>>, Vec<(usize, ExpertRun)>) {
    let mut out_msgs: Vec<Vec<f64>> = recv.iter().map(|m| vec![0.0; m.len() / (h + 1) * h]).collect();
    let mut runs = vec![];
    for e in ctx.layout.experts.clone() {
        let mut rows = vec![];
        let mut data = vec![];
        for (src, m) in recv.iter().enumerate() {
            for (pos, chunk) in m.chunks_exact(h + 1).enumerate() {
                if chunk[0] as usize == e {
                    rows.push((src, pos));
                    data.extend_from_slice(&chunk[1..]);
                }
            }
        }
        if rows.is_empty() {
            continue;
        }
        let le = e - ctx.layout.experts.start;
        let x = Mat::from_shape_vec((rows.len(), h), data).expect("rows");
        let lin = |n: &str| {
            let w = expert_mat(&params[&format!("{pre}.moe.{n}.weight")], le);
            let b = params.get(&format!("{pre}.moe.{n}.bias")).map(|t| expert_row(t, le));
            k::linear_fwd(ctx.p, &x, &w, b.as_ref())
        };
        let (up, gate, act) = activation_fwd(ctx, lin);
        let wd = expert_mat(&params[&format!("{pre}.moe.down.weight")], le);
        let mut out = k::matmul(ctx.p, &act, &wd);
        let bias_here = ctx.tp_index() == 0 || super::blocks::row_bias_early(ctx);
        if let (Some(bd), true) = (params.get(&format!("{pre}.moe.down.bias")), bias_here) {
            out = k::add_row(ctx.p, &out, &expert_row(bd, le));
        }
        for (i, &(src, pos)) in rows.iter().enumerate() {
            out_msgs[src][pos * h..(pos + 1) * h].copy_from_slice(out.row(i).as_slice().expect("std"));
        }
        runs.push((le, ExpertRun { rows, x, up, gate, act }));
    }
    (out_msgs, runs)
}

/// The gate-weighted sum of the returned expert outputs per token (this rank's partial), and the
/// returned rows per member.
fn combine_outputs(
    ctx: &Ctx,
    back: Vec<Vec<f64>>,
    combine: &[Vec<Entry>],
    routing: &k::Routing,
    tokens: usize,
    h: usize,
) -> (Mat, Vec<Mat>) {
    let mut partial = Mat::zeros((tokens, h));
    let mut results = Vec::with_capacity(back.len());
    for (o, msg) in back.into_iter().enumerate() {
        let r = Mat::from_shape_vec((msg.len() / h.max(1), h), msg).expect("returned rows");
        for (row, en) in r.rows().into_iter().zip(&combine[o]) {
            let gate = routing.gates[[en.token, en.choice]];
            let mut dst = partial.row_mut(en.token);
            for (d, v) in dst.iter_mut().zip(row.iter()) {
                *d = ctx.p.r(*d + ctx.p.r(gate * v));
            }
        }
        results.push(r);
    }
    (partial, results)
}

pub fn moe_bwd(ctx: &Ctx, pre: &str, params: &ParamSet, g: &Geom, st: &MoeCache, dx: &Mat, grads: &mut ParamSet) -> CResult<Mat> {
    let h = st.y.ncols();
    let dout = exit_bwd(ctx, g, dx.clone())?;
    let (dgates, dres_msgs) = combine_bwd(ctx, st, &dout)?;
    let drecv = exchange(ctx, dres_msgs)?;
    let mut dx_msgs: Vec<Vec<f64>> = st.received.iter().map(|&n| vec![0.0; n * h]).collect();
    for (le, run) in &st.runs {
        let dxe = expert_bwd(ctx, pre, params, *le, run, &drecv, h, grads);
        for (i, &(src, pos)) in run.rows.iter().enumerate() {
            dx_msgs[src][pos * h..(pos + 1) * h].copy_from_slice(dxe.row(i).as_slice().expect("std"));
        }
    }
    let dback = exchange(ctx, dx_msgs)?;
    let mut dy = Mat::zeros((st.y.nrows(), h));
    for (o, msg) in dback.iter().enumerate() {
        for (en, row) in st.sent[o].iter().zip(msg.chunks_exact(h.max(1))) {
            let mut dst = dy.row_mut(en.token);
            for (d, v) in dst.iter_mut().zip(row) {
                *d = ctx.p.r(*d + v);
            }
        }
    }
    // Router: replicated over the tensor-parallel group, so its input gradient is added once.
    let dlogits = k::router_bwd(ctx.p, &st.routing, &dgates, st.aux.as_ref());
    let wr_name = format!("{pre}.moe.router.weight");
    let wr = mat(params, &wr_name);
    let dwr = k::matmul_tn(ctx.p, &st.y, &dlogits);
    accumulate(grads, &wr_name, &[wr.nrows(), wr.ncols()], dwr.as_slice().expect("std"), ctx.dtype());
    if ctx.tp_index() == 0 {
        let dy_router = k::matmul_nt(ctx.p, &dlogits, &wr);
        dy = k::add(ctx.p, &dy, &dy_router);
    }
    if let Some(shared) = &st.shared {
        dy = k::add(ctx.p, &dy, &shared_bwd(ctx, pre, params, shared, &st.y, &dout, grads)?);
    }
    Ok(dy)
}

/// The combine's backward: the gates' gradients (summed over the tensor-parallel group) and the
/// gradient each returned row receives, as messages back to the members that computed them.
fn combine_bwd(ctx: &Ctx, st: &MoeCache, dout: &Mat) -> CResult<(Mat, Vec<Vec<f64>>)> {
    let h = st.y.ncols();
    let mut dgates = Mat::zeros((st.y.nrows(), st.routing.gates.ncols()));
    let mut dres_msgs = vec![];
    for (o, r) in st.results.iter().enumerate() {
        let mut m = vec![0.0; r.nrows() * h];
        for (i, en) in st.combine[o].iter().enumerate().take(r.nrows()) {
            let gate = st.routing.gates[[en.token, en.choice]];
            let d = dout.row(en.token);
            let mut dot = 0.0;
            for (j, (dv, rv)) in d.iter().zip(r.row(i).iter()).enumerate() {
                m[i * h + j] = ctx.p.r(gate * dv);
                dot = ctx.p.acc().round(dot + dv * rv);
            }
            dgates[[en.token, en.choice]] = ctx.p.r(dot);
        }
        dres_msgs.push(m);
    }
    if let Some(tp) = ctx.tp.filter(|t| t.size() > 1) {
        // Expert outputs were partial sums over the tensor-parallel group.
        tp.all_reduce_sum(dgates.as_slice_mut().expect("std"))?;
    }
    Ok((dgates, dres_msgs))
}

/// One local expert's backward on the rows it received (`drecv`: the returned rows' gradients per
/// member): its weight and bias gradients accumulated, the gradient of its input rows returned.
fn expert_bwd(
    ctx: &Ctx,
    pre: &str,
    params: &ParamSet,
    le: usize,
    run: &ExpertRun,
    drecv: &[Vec<f64>],
    h: usize,
    grads: &mut ParamSet,
) -> Mat {
    let shape_of = |n: &str| params.get(&format!("{pre}.moe.{n}")).map(|t| t.shape.clone());
    let mut dout_e = Mat::zeros((run.rows.len(), h));
    for (i, &(src, pos)) in run.rows.iter().enumerate() {
        dout_e.row_mut(i).as_slice_mut().expect("std").copy_from_slice(&drecv[src][pos * h..(pos + 1) * h]);
    }
    let wd_name = format!("{pre}.moe.down.weight");
    let wd = expert_mat(&params[&wd_name], le);
    let lg = k::linear_bwd(ctx.p, &run.act, &wd, &dout_e);
    accumulate_expert(grads, &wd_name, &shape_of("down.weight").unwrap(), le, lg.dw.as_slice().expect("std"), ctx);
    if let Some(s) = shape_of("down.bias") {
        accumulate_expert(grads, &format!("{pre}.moe.down.bias"), &s, le, &lg.db.to_vec(), ctx);
    }
    let lin_bwd = |n: &str, d: &Mat| -> Mat {
        let wname = format!("{pre}.moe.{n}.weight");
        let w = expert_mat(&params[&wname], le);
        let lg = k::linear_bwd(ctx.p, &run.x, &w, d);
        accumulate_expert(grads, &wname, &shape_of(&format!("{n}.weight")).unwrap(), le, lg.dw.as_slice().expect("std"), ctx);
        if let Some(s) = shape_of(&format!("{n}.bias")) {
            accumulate_expert(grads, &format!("{pre}.moe.{n}.bias"), &s, le, &lg.db.to_vec(), ctx);
        }
        lg.dx
    };
    activation_bwd(ctx, &run.up, run.gate.as_ref(), &lg.dx, lin_bwd)
}
