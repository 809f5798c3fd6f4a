//! The single-device reference: the whole model on one device, in f64 (the truth) or in the case
//! dtype (the noise baseline). No sharding, no communication.

mod optim;

pub use optim::{clip_coefficient_of, clip_measure, combine_measures, OptState};

use shardfuzz_kernels::{DType, Prec};

use crate::case::Case;
use crate::inputs::Inputs;
use crate::model::{forward_backward, forward_loss, Bugs, Ctx, Geom, Layout, ParamSet};
use crate::target::RunOutput;
use crate::tensor::Tensor;

/// Name of the per-rank copies of the loss scaler's skip decisions, which must agree across ranks
/// (a replica check; the decisions themselves travel in [`crate::target::RunStats`]).
pub const SKIPPED_STEPS: &str = "scaler/skipped";

/// Why the reference could not run a case.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ReferenceError(pub String);

/// Runs `case` on a single device in `dtype`.
pub fn run(case: &Case, inputs: &Inputs, dtype: DType) -> Result<RunOutput, ReferenceError> {
    run_with_gradient_noise(case, inputs, dtype, None)
}

/// Absolute noise added to every gradient element before each optimizer step: ± the larger of
/// `relative` times the largest gradient element of the step and the parameter's own entry in
/// `absolute`, signs from `seed`. Models the round-off a sharded implementation's reductions put
/// into gradients — absolute, not relative to each element, which matters after optimizers (Adam)
/// that normalise each element by its own size.
#[derive(Debug, Clone, Default)]
pub struct GradientNoise {
    pub relative: f64,
    /// Per parameter: an absolute noise level (e.g. what the noise ensemble measured on its step-0
    /// gradient).
    pub absolute: std::collections::BTreeMap<String, f64>,
    pub seed: u64,
}

pub fn run_with_gradient_noise(
    case: &Case,
    inputs: &Inputs,
    dtype: DType,
    noise: Option<GradientNoise>,
) -> Result<RunOutput, ReferenceError> {
    run_with(case, inputs, Prec::new(dtype), noise)
}

/// The reference with its dot products summed in reverse order (another round-off pattern).
pub fn run_reversed(case: &Case, inputs: &Inputs, dtype: DType) -> Result<RunOutput, ReferenceError> {
    run_with(case, inputs, Prec::new(dtype).reversed(), None)
}

/// The reference at an arbitrary precision (a dtype with reversed sums or jittered roundings).
pub fn run_prec(case: &Case, inputs: &Inputs, p: Prec) -> Result<RunOutput, ReferenceError> {
    run_with(case, inputs, p, None)
}

/// Which near-tie tokens a reference run routes the other way (see `Ctx::flip_only`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Flips {
    /// Tokens whose top-k router margin is below this are near ties (0: none).
    pub below: f64,
    /// The near ties that flip, by the order the run meets them (bit i: the i-th); all when None.
    pub only: Option<u64>,
    /// The gates of one group of tokens moved by their round-off (see [`GateJitter`]).
    pub gate_jitter: Option<GateJitter>,
}

/// The gates a token's chosen experts are weighted with are router probabilities, which carry the
/// router's round-off; where the experts' outputs are large, that round-off moves the token's
/// output, and whatever is downstream of it, far more than any rounding of the output itself.
/// A run with a `GateJitter` moves by ±`delta` every gate of the tokens in group `group` of
/// `groups` (token index modulo `groups`), choice c by the sign of bit c (mod 3) of `signs`: one
/// group at a time, so that the tokens' moves do not add up coherently over the whole batch, as
/// correct runs' round-off does not (moving every token at once left a halved output-layer
/// gradient of a clean bf16 case within what the member moved).
#[derive(Debug, Clone, Copy)]
pub struct GateJitter {
    pub delta: f64,
    pub group: usize,
    pub groups: usize,
    pub signs: u64,
}

impl GateJitter {
    /// What gate `choice` of token `token` moves by.
    pub fn shift(&self, token: usize, choice: usize) -> f64 {
        if token % self.groups.max(1) != self.group {
            0.0
        } else if self.signs >> (choice % 3) & 1 == 1 {
            -self.delta
        } else {
            self.delta
        }
    }
}

/// The f64 reference with near-tie tokens (router margin below `flips.below`) routed to their best
/// unchosen expert instead of their k-th choice: what a correct implementation whose round-off
/// flips those near-ties computes. `stats.near_ties` counts the near ties the run met.
pub fn run_routing_flipped(case: &Case, inputs: &Inputs, flips: Flips) -> Result<RunOutput, ReferenceError> {
    run_variant(case, inputs, Prec::new(DType::F64), Variant { flips, ..Variant::default() })
}

/// The reference in f64 with every rounding jittered by `ulps` unit round-offs and its dot products
/// summed in reverse order: what another correct f64 implementation may legitimately differ by.
pub fn run_jittered(case: &Case, inputs: &Inputs, ulps: u8) -> Result<RunOutput, ReferenceError> {
    run_with(case, inputs, Prec::new(DType::F64).reversed().jittered(ulps), None)
}

/// The loss at the parameters the last step left (one more forward): where the last step's
/// gradients, which no later loss shows, took the run. Leaves the run's statistics as they were.
fn final_loss(ctx: &Ctx, params: &ParamSet, g: &Geom, inputs: &Inputs) -> Option<f64> {
    let (margin, peak) = (ctx.routing_margin.get(), ctx.peak_activation.get());
    let loss = forward_loss(ctx, params, g, &inputs.tokens, &inputs.targets).ok();
    ctx.routing_margin.set(margin);
    ctx.peak_activation.set(peak);
    loss
}

/// The context of a single-device run: no groups, one micro-batch, no injected bug.
fn single_device_ctx<'a>(case: &'a Case, layout: &'a Layout, p: Prec, inputs: &'a Inputs) -> Ctx<'a> {
    let m = case.model.as_ref().expect("a model case");
    let (class_weights, counted_share) = (&inputs.class_weights[..], inputs.loss_denominator() / m.tokens() as f64);
    Ctx {
        p,
        model: m,
        layout,
        tp: None,
        ep: None,
        bugs: Bugs::none(),
        routing_margin: std::cell::Cell::new(f64::INFINITY),
        flip_routing_below: 0.0,
        flip_only: None,
        near_ties: std::cell::Cell::new(0),
        gate_jitter: None,
        router_probs: std::cell::RefCell::new(Some(vec![])),
        attention_scores: std::cell::RefCell::new(Some(vec![])),
        tokens_dropped: std::cell::Cell::new(false),
        loss_grad_scale: std::cell::Cell::new(0.0),
        counted_share,
        peak_activation: std::cell::Cell::new(0.0),
        class_weights,
        label_smoothing: case.train.label_smoothing(),
    }
}

/// Elementwise over the batch rows, in f64: √(Σ (each row's step-0 gradient)²), each row's loss
/// scaled as in the whole batch. A sharded run sums partial gradients (ranks, micro-batches,
/// accumulation steps), each a sum of rows; a reduction that rounds every partial to a unit
/// round-off u adds errors of independent signs, about u times this per rounding in quadrature,
/// however much the partials cancel in their sum.
pub fn row_gradient_root_sum_squares(case: &Case, inputs: &Inputs) -> Result<ParamSet, ReferenceError> {
    let m = case.model.as_ref().ok_or_else(|| ReferenceError("only model cases have gradients".into()))?;
    let mut total: ParamSet = inputs.tensors.iter().map(|(n, t)| (n.clone(), Tensor::zeros(t.shape.clone()))).collect();
    for b in 0..m.batch as usize {
        for (name, g) in &rows_gradient(case, inputs, b..b + 1)? {
            if let Some(t) = total.get_mut(name) {
                t.data.iter_mut().zip(&g.data).for_each(|(a, x)| *a += x * x);
            }
        }
    }
    for t in total.values_mut() {
        t.data.iter_mut().for_each(|a| *a = a.sqrt());
    }
    Ok(total)
}

/// In f64, the step-0 gradient of the batch rows `rows` alone, each row's loss scaled as in the
/// whole batch: the contribution of one micro-batch to the batch gradient (what a schedule that
/// drops a micro-batch loses).
pub fn rows_gradient(case: &Case, inputs: &Inputs, rows: std::ops::Range<usize>) -> Result<ParamSet, ReferenceError> {
    let m = case.model.as_ref().ok_or_else(|| ReferenceError("only model cases have gradients".into()))?;
    let layout = Layout::single(m);
    let ctx = single_device_ctx(case, &layout, Prec::new(DType::F64), inputs);
    let params: ParamSet = inputs.tensors.iter().cloned().collect();
    let seq = m.seq as usize;
    let tokens = rows.start * seq..rows.end * seq;
    let mut grads = ParamSet::new();
    let g = Geom { batch: rows.len(), seq };
    forward_backward(
        &ctx,
        &params,
        &g,
        &inputs.tokens[tokens.clone()],
        &inputs.targets[tokens],
        1.0 / inputs.loss_denominator(),
        &mut grads,
    )
    .map_err(|e| ReferenceError(e.to_string()))?;
    Ok(grads)
}

fn run_with(case: &Case, inputs: &Inputs, p: Prec, noise: Option<GradientNoise>) -> Result<RunOutput, ReferenceError> {
    run_variant(case, inputs, p, Variant { noise, ..Variant::default() })
}

/// The f64 reference whose first step uses `gradients` (a target's reported step-0 gradients, by
/// parameter name) instead of its own; later steps use its own. A correct target's later steps
/// follow this run: where it lands far from the reference, the target's legitimate gradient
/// round-off alone (amplified by an adaptive step) takes the run there.
pub fn run_from_step0_gradients(case: &Case, inputs: &Inputs, gradients: &ParamSet) -> Result<RunOutput, ReferenceError> {
    run_variant(case, inputs, Prec::new(DType::F64), Variant { step0_gradients: Some(gradients), ..Variant::default() })
}

/// How a reference run departs from the plain one.
#[derive(Default)]
struct Variant<'a> {
    noise: Option<GradientNoise>,
    flips: Flips,
    step0_gradients: Option<&'a ParamSet>,
}

/// Adds `n`'s absolute noise (per parameter, never below its relative share of the largest
/// gradient) to every gradient element, with pseudo-random signs.
fn add_gradient_noise(n: &GradientNoise, step: u32, order: &[String], grads: &mut ParamSet) {
    let global = grads.values().map(|t| t.max_abs()).fold(0.0, f64::max) * n.relative;
    let mut state = n.seed.wrapping_add(u64::from(step)).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for name in order {
        let scale = n.absolute.get(name).copied().unwrap_or(0.0).max(global);
        for x in &mut grads.get_mut(name).expect("grad").data {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *x += if state & 1 == 0 { scale } else { -scale };
        }
    }
}

fn run_variant(case: &Case, inputs: &Inputs, p: Prec, variant: Variant) -> Result<RunOutput, ReferenceError> {
    if let Some(op) = &case.op {
        return crate::ops::reference(op, inputs, p).map_err(ReferenceError);
    }
    let m = case.model.as_ref().ok_or_else(|| ReferenceError("case has neither model nor op".into()))?;
    let layout = Layout::single(m);
    let mut ctx = single_device_ctx(case, &layout, p, inputs);
    let flips = variant.flips;
    (ctx.flip_routing_below, ctx.flip_only, ctx.gate_jitter) = (flips.below, flips.only, flips.gate_jitter);
    let mut params: ParamSet = inputs
        .tensors
        .iter()
        .map(|(n, t)| {
            let mut t = t.clone();
            p.dtype.round_slice(&mut t.data);
            (n.clone(), t)
        })
        .collect();
    // The parameters that train: a frozen one's gradient is neither reported, clipped nor applied.
    let order: Vec<String> = inputs.tensors.iter().map(|(n, _)| n.clone()).filter(|n| !case.train.is_frozen(n)).collect();
    let mut opt = OptState::new(&case.train, &m.params(), &params);
    let mut scale = case.train.loss_scale.map(|s| s.get());
    let g = Geom { batch: m.batch as usize, seq: m.seq as usize };
    let tokens = inputs.loss_denominator();
    let mut out = RunOutput::default();
    let (mut skipped, mut nonfinite_steps, mut peaks) = (vec![], vec![], vec![]);
    for step in 0..case.train.steps {
        let mut grads = ParamSet::new();
        let s = scale.unwrap_or(1.0);
        let before = ctx.peak_activation.replace(0.0);
        let (loss, logits) = forward_backward(&ctx, &params, &g, &inputs.tokens, &inputs.targets, s / tokens, &mut grads)
            .map_err(|e| ReferenceError(e.to_string()))?;
        // (the backward's seed, s / tokens per token, counts: where every gradient is exactly 0 it is all there is)
        peaks.push(grads.values().fold(ctx.peak_activation.get().max(s / tokens), |m, t| m.max(t.max_abs())));
        ctx.peak_activation.set(before.max(ctx.peak_activation.get()));
        out.tensors.push((format!("loss/step{step}"), Tensor::scalar(p.r(loss / tokens))));
        adjust_gradients(&variant, p, scale.map(|_| s), step, &order, &mut grads);
        if step == 0 {
            out.stats.router_probs = ctx.router_probs.take().filter(|p| !p.is_empty());
            out.stats.attention_scores = ctx.attention_scores.take().filter(|p| !p.is_empty());
            out.tensors.push(("logits".into(), Tensor::from_mat(logits)));
            out.tensors.extend(order.iter().map(|n| (format!("grad/{n}"), grads[n].clone())));
        }
        let nonfinite = order.iter().any(|n| !grads[n].all_finite());
        nonfinite_steps.push(nonfinite);
        let overflow = scale.is_some() && nonfinite;
        skipped.push(overflow);
        if overflow {
            scale = Some(s / 2.0);
            continue;
        }
        // Adam's step count is that of the updates applied: a step the scaler skipped is not one.
        let applied = step - skipped.iter().filter(|&&s| s).count() as u32;
        clip_and_update(case, p, &order, &mut grads, &mut params, &mut opt, applied);
    }
    out.tensors.extend(inputs.tensors.iter().map(|(n, _)| (format!("param/{n}"), params[n].clone())));
    out.stats.routing_margin = ctx.routing_margin.get().is_finite().then(|| ctx.routing_margin.get());
    out.stats.peak_activation = Some(ctx.peak_activation.get());
    if case.train.steps >= 2 {
        out.stats.final_loss = final_loss(&ctx, &params, &g, inputs).map(|l| l / tokens);
    }
    out.stats.skipped_steps = case.train.loss_scale.is_some().then_some(skipped);
    out.stats.scaled_peaks = case.train.loss_scale.is_some().then_some(peaks);
    out.stats.nonfinite_grad_steps = Some(nonfinite_steps);
    out.stats.near_ties = (flips.below > 0.0).then(|| ctx.near_ties.get());
    Ok(out)
}

/// A step's gradients as the variant sees them: the loss scale divided out, its gradient noise
/// added, and at step 0 the gradients it was given in place of its own.
fn adjust_gradients(variant: &Variant, p: Prec, loss_scale: Option<f64>, step: u32, order: &[String], grads: &mut ParamSet) {
    if let Some(s) = loss_scale {
        for t in grads.values_mut() {
            t.data.iter_mut().for_each(|x| *x = p.r(*x / s));
        }
    }
    if let Some(n) = variant.noise.as_ref() {
        add_gradient_noise(n, step, order, grads);
    }
    if let (0, Some(given)) = (step, variant.step0_gradients) {
        for (name, g) in grads.iter_mut() {
            if let Some(t) = given.get(name).filter(|t| t.shape == g.shape) {
                g.data.clone_from(&t.data);
            }
        }
    }
}

/// Gradient clipping (when the case asks for it) and the optimizer step.
fn clip_and_update(case: &Case, p: Prec, order: &[String], grads: &mut ParamSet, params: &mut ParamSet, opt: &mut OptState, step: u32) {
    if let Some(max_norm) = case.train.clip_grad_norm {
        let kind = case.train.clip_norm();
        let measure = order.iter().map(|n| clip_measure(kind, p, &grads[n].data)).fold(0.0, |s, x| combine_measures(kind, s, x, |v| v));
        let c = clip_coefficient_of(kind, measure, max_norm.get());
        for n in order {
            shardfuzz_kernels::scale_in_place(p, &mut grads.get_mut(n).expect("grad").data, c);
        }
    }
    for n in order {
        let param = params.get_mut(n).expect("param");
        opt.update(n, p, &mut param.data, &grads[n].data, 0, step + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::ClipNorm;

    /// A frozen parameter reports no gradient, keeps its value (weight decay included) and stays out of the
    /// clipping norm: each trained one moves by lr · c · g with c from the trained gradients alone.
    #[test]
    fn frozen_parameters_take_no_gradient_no_update_and_no_part_in_the_clipping_norm() {
        let text = crate::case::tests::MINIMAL.replace(
            r#""optimizer": {"kind": "sgd", "lr": 0.1}, "dtype": "f32""#,
            r#""optimizer": {"kind": "sgd", "lr": 0.1, "weight_decay": 0.5}, "dtype": "f64", "clip_grad_norm": 0.01, "frozen": ["embed", "layers.1"]"#,
        );
        let case = Case::from_json(&text).unwrap();
        let inputs = Inputs::generate(&case);
        let out = run(&case, &inputs, DType::F64).unwrap();
        let frozen = ["embed.weight", "layers.1.mlp.up.weight", "layers.1.norm.weight"];
        for name in frozen {
            assert!(out.tensor(&format!("grad/{name}")).is_none(), "{name}");
            assert_eq!(out.tensor(&format!("param/{name}")), inputs.tensor(name), "{name}");
        }
        let trained: Vec<&String> = inputs.tensors.iter().map(|(n, _)| n).filter(|n| !case.train.is_frozen(n)).collect();
        let sum_squares: f64 =
            trained.iter().map(|n| out.tensor(&format!("grad/{n}")).unwrap().data.iter().map(|g| g * g).sum::<f64>()).sum();
        let c = clip_coefficient_of(ClipNorm::L2, sum_squares, 0.01);
        assert!(c < 0.5, "the case clips: {c}");
        for n in trained {
            let (w0, g, w1) =
                (inputs.tensor(n).unwrap(), out.tensor(&format!("grad/{n}")).unwrap(), out.tensor(&format!("param/{n}")).unwrap());
            for ((w0, g), w1) in w0.data.iter().zip(&g.data).zip(&w1.data) {
                let expected = w0 - 0.1 * (c * g + 0.5 * w0);
                assert!((w1 - expected).abs() <= 1e-12 * (1.0 + expected.abs()), "{n}: {w1} vs {expected}");
            }
        }
    }

    /// The MoE auxiliary loss is averaged over the batch's sequences whatever targets the token loss ignores: its
    /// share of the router's gradient (the run with it less the run without) is the same with and without ignored
    /// targets (campaign 186: it had been weighted by the token loss's denominator, batch tokens / counted ones).
    #[test]
    fn the_auxiliary_loss_is_averaged_over_sequences_whatever_targets_are_ignored() {
        let case_with = |aux: &str, ignored: &str| {
            let text = format!(
                r#"{{"schema": 1, "name": "aux", "parallel": {{"dp": 1, "tp": 1, "pp": 1}}, "model": {{"vocab": 13, "hidden": 8, "ffn": 12, "heads": 2,
                "kv_heads": 2, "seq": 4, "batch": 4, "layers": ["moe"], "moe": {{"experts": 2, "top_k": 1,
                "capacity_factor": 2.0{aux}}}}}, "train": {{"steps": 1, "optimizer": {{"kind": "sgd", "lr": 0.1}},
                "dtype": "f64"}}, "data": {{"seed": 7{ignored}}}}}"#
            );
            Case::from_json(&text).unwrap()
        };
        let aux_share = |ignored: &str| {
            let router = |aux: &str| {
                let case = case_with(aux, ignored);
                let out = run(&case, &Inputs::generate(&case), DType::F64).unwrap();
                out.tensor("grad/layers.0.moe.router.weight").unwrap().data.clone()
            };
            let (with, without) = (router(r#", "aux_loss": 0.5"#), router(""));
            with.iter().zip(&without).map(|(a, b)| a - b).collect::<Vec<f64>>()
        };
        let ignored = r#", "ignored": {"fraction": 0.4, "pattern": "padding"}"#;
        let inputs = Inputs::generate(&case_with("", ignored));
        assert!(inputs.loss_denominator() < 16.0, "the case ignores targets: {}", inputs.loss_denominator());
        let (all, some) = (aux_share(""), aux_share(ignored));
        assert!(all.iter().any(|g| g.abs() > 1e-6), "the auxiliary loss moves the router: {all:?}");
        for (a, s) in all.iter().zip(&some) {
            assert!((a - s).abs() <= 1e-12 * (1.0 + a.abs()), "{a} vs {s}");
        }
    }

    /// A gated shared expert's gradients (its MLP and its gate) are the loss's derivatives: each checked against a
    /// central difference of the f64 loss along a random direction.
    #[test]
    fn shared_expert_gradients_match_finite_differences() {
        let text = r#"{"schema": 1, "name": "shared", "parallel": {"dp": 1, "tp": 1, "pp": 1}, "model": {"vocab": 13,
            "hidden": 8, "ffn": 12, "heads": 2, "kv_heads": 2, "seq": 4, "batch": 2, "layers": ["moe"], "activation": "swiglu",
            "bias": false, "moe": {"experts": 4, "top_k": 2, "capacity_factor": 2.0, "renormalize": true, "shared_ffn": 5,
            "shared_gate": true}}, "train": {"steps": 1, "optimizer": {"kind": "sgd", "lr": 0.0}, "dtype": "f64"},
            "data": {"seed": 11}}"#;
        let case = Case::from_json(text).unwrap();
        let inputs = Inputs::generate(&case);
        let out = run(&case, &inputs, DType::F64).unwrap();
        let loss = |inputs: &Inputs| run(&case, inputs, DType::F64).unwrap().tensor("loss/step0").unwrap().data[0];
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for name in ["shared.up", "shared.gate", "shared.down", "shared_gate", "router"].map(|n| format!("layers.0.moe.{n}.weight")) {
            let dir: Vec<f64> = (0..inputs.tensor(&name).unwrap().data.len()).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let moved = |h: f64| {
                let mut moved = inputs.clone();
                let t = &mut moved.tensors.iter_mut().find(|(n, _)| *n == name).unwrap().1;
                t.data.iter_mut().zip(&dir).for_each(|(w, d)| *w += h * d);
                loss(&moved)
            };
            let h = 1e-5;
            let numeric = (moved(h) - moved(-h)) / (2.0 * h);
            let grad = out.tensor(&format!("grad/{name}")).unwrap();
            let analytic: f64 = grad.data.iter().zip(&dir).map(|(g, d)| g * d).sum();
            assert!((numeric - analytic).abs() <= 1e-6 * (1.0 + analytic.abs()), "{name}: {numeric} vs {analytic}");
        }
    }

    /// `no_decay_vectors`: biases and norm weights step without weight decay, matrices with it.
    #[test]
    fn vectors_step_without_weight_decay_in_their_own_group() {
        let text = crate::case::tests::MINIMAL.replace(
            r#""optimizer": {"kind": "sgd", "lr": 0.1}, "dtype": "f32""#,
            r#""optimizer": {"kind": "sgd", "lr": 0.1, "weight_decay": 0.5, "no_decay_vectors": true}, "dtype": "f64""#,
        );
        let decayed =
            [("layers.0.norm.weight", false), ("final_norm.weight", false), ("layers.1.mlp.up.weight", true), ("embed.weight", true)];
        assert_sgd_decay(&Case::from_json(&text).unwrap(), &decayed);
    }

    /// An expert's bias is a vector, though the experts' biases are stacked into `[experts, n]` (campaign 189: Megatron
    /// holds one bias vector per expert and leaves it undecayed); expert and router matrices decay.
    #[test]
    fn stacked_expert_biases_are_vectors_and_step_without_weight_decay() {
        let text = r#"{"schema": 1, "name": "moe-decay", "parallel": {"dp": 1, "tp": 1, "pp": 1}, "model": {"vocab": 13,
            "hidden": 8, "ffn": 12, "heads": 2, "kv_heads": 2, "seq": 4, "batch": 4, "layers": ["moe"], "bias": true,
            "moe": {"experts": 2, "top_k": 1, "capacity_factor": 2.0}}, "train": {"steps": 1, "optimizer": {"kind": "sgd",
            "lr": 0.1, "weight_decay": 0.5, "no_decay_vectors": true}, "dtype": "f64"}, "data": {"seed": 7}}"#;
        let decayed = [
            ("layers.0.moe.up.bias", false),
            ("layers.0.moe.down.bias", false),
            ("layers.0.moe.up.weight", true),
            ("layers.0.moe.router.weight", true),
        ];
        assert_sgd_decay(&Case::from_json(text).unwrap(), &decayed);
    }

    /// Each named parameter took one SGD step of lr 0.1 with weight decay 0.5 (`true`) or none.
    fn assert_sgd_decay(case: &Case, decayed: &[(&str, bool)]) {
        let inputs = Inputs::generate(case);
        let out = run(case, &inputs, DType::F64).unwrap();
        for &(name, decayed) in decayed {
            let (w0, g, w1) =
                (inputs.tensor(name).unwrap(), out.tensor(&format!("grad/{name}")).unwrap(), out.tensor(&format!("param/{name}")).unwrap());
            let decay = if decayed { 0.5 } else { 0.0 };
            for ((w0, g), w1) in w0.data.iter().zip(&g.data).zip(&w1.data) {
                let expected = w0 - 0.1 * (g + decay * w0);
                assert!((w1 - expected).abs() <= 1e-12 * (1.0 + expected.abs()), "{name}: {w1} vs {expected}");
            }
        }
    }
}
