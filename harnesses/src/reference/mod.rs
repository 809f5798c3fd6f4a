//! The single-device reference: the whole model on one device, in f64 (the truth) or in the case
//! dtype (the noise baseline). No sharding, no communication.

mod optim;

pub use optim::{clip_coefficient_of, OptState};

use shardfuzz_kernels::{DType, Prec};

use crate::case::Case;
use crate::inputs::Inputs;
use crate::model::{forward_backward, Bugs, Ctx, Geom, Layout, ParamSet};
use crate::target::RunOutput;
use crate::tensor::Tensor;

/// Name of the tensor that records, per step, whether the dynamic loss scaler skipped it (1) or not (0).
pub const SKIPPED_STEPS: &str = "scaler/skipped";

/// Why the reference could not run a case.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ReferenceError(pub String);

/// Runs `case` on a single device in `dtype`.
pub fn run(case: &Case, inputs: &Inputs, dtype: DType) -> Result<RunOutput, ReferenceError> {
    if let Some(op) = &case.op {
        return crate::ops::reference(op, inputs, dtype).map_err(ReferenceError);
    }
    let m = case.model.as_ref().ok_or_else(|| ReferenceError("case has neither model nor op".into()))?;
    let p = Prec::new(dtype);
    let layout = Layout::single(m);
    let ctx = Ctx { p, model: m, layout: &layout, tp: None, ep: None, bugs: Bugs::none() };
    let mut params: ParamSet = inputs
        .tensors
        .iter()
        .map(|(n, t)| {
            let mut t = t.clone();
            dtype.round_slice(&mut t.data);
            (n.clone(), t)
        })
        .collect();
    let order: Vec<String> = inputs.tensors.iter().map(|(n, _)| n.clone()).collect();
    let mut opt = OptState::new(&case.train, &params);
    let mut scale = case.train.loss_scale.map(|s| s.get());
    let g = Geom { batch: m.batch as usize, seq: m.seq as usize };
    let tokens = m.tokens() as f64;
    let mut out = RunOutput::default();
    let mut skipped = vec![];
    for step in 0..case.train.steps {
        let mut grads = ParamSet::new();
        let s = scale.unwrap_or(1.0);
        let (loss, logits) = forward_backward(&ctx, &params, &g, &inputs.tokens, &inputs.targets, s / tokens, &mut grads)
            .map_err(|e| ReferenceError(e.to_string()))?;
        out.tensors.push((format!("loss/step{step}"), Tensor::scalar(p.r(loss / tokens))));
        if scale.is_some() {
            for t in grads.values_mut() {
                t.data.iter_mut().for_each(|x| *x = p.r(*x / s));
            }
        }
        if step == 0 {
            out.tensors.push(("logits".into(), Tensor::from_mat(logits)));
            for n in &order {
                out.tensors.push((format!("grad/{n}"), grads[n].clone()));
            }
        }
        let overflow = scale.is_some() && grads.values().any(|t| !t.all_finite());
        skipped.push(if overflow { 1.0 } else { 0.0 });
        if overflow {
            scale = Some(s / 2.0);
            continue;
        }
        if let Some(max_norm) = case.train.clip_grad_norm {
            let sq: f64 = order.iter().map(|n| shardfuzz_kernels::sum_squares(p, &grads[n].data)).sum();
            let c = clip_coefficient_of(sq, max_norm.get());
            for t in grads.values_mut() {
                shardfuzz_kernels::scale_in_place(p, &mut t.data, c);
            }
        }
        for n in &order {
            let param = params.get_mut(n).expect("param");
            opt.update(n, p, &mut param.data, &grads[n].data, 0, step + 1);
        }
    }
    for n in &order {
        out.tensors.push((format!("param/{n}"), params[n].clone()));
    }
    if case.train.loss_scale.is_some() {
        out.tensors.push((SKIPPED_STEPS.into(), Tensor::new(vec![skipped.len()], skipped)));
    }
    Ok(out)
}
