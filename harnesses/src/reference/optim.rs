//! Optimizer state kept per parameter (or per ZeRO partition of it), and the clip coefficient.

use std::collections::{BTreeMap, BTreeSet};

use shardfuzz_kernels::{self as k, Prec};

use crate::case::{ClipNorm, OptimizerKind, ParamSpec, Train};
use crate::model::ParamSet;

/// Adam moments per parameter name; SGD keeps none.
pub struct OptState {
    kind: OptimizerKind,
    cfg: k::AdamConfig,
    weight_decay: f64,
    moments: BTreeMap<String, (Vec<f64>, Vec<f64>)>,
    /// Parameters in the group without weight decay (`no_decay_vectors`: the vectors, `ParamRole::is_vector`).
    undecayed: BTreeSet<String>,
}

impl OptState {
    /// State for `params`, the model's `specs` (which say what is a vector) among them.
    pub fn new(train: &Train, specs: &[ParamSpec], params: &ParamSet) -> OptState {
        let o = &train.optimizer;
        let cfg = k::AdamConfig {
            lr: o.lr.get(),
            beta1: o.beta1.get(),
            beta2: o.beta2.get(),
            eps: o.eps.get(),
            weight_decay: o.weight_decay.get(),
            decoupled: o.kind == OptimizerKind::Adamw,
        };
        let moments = if o.kind == OptimizerKind::Sgd {
            BTreeMap::new()
        } else {
            params.iter().map(|(n, t)| (n.clone(), (vec![0.0; t.numel()], vec![0.0; t.numel()]))).collect()
        };
        let undecayed = specs
            .iter()
            .filter(|s| o.no_decay_vectors && s.role.is_vector() && params.contains_key(&s.name))
            .map(|s| s.name.clone())
            .collect();
        OptState { kind: o.kind, cfg, weight_decay: o.weight_decay.get(), moments, undecayed }
    }

    /// Updates `param[..]`, which starts at element `offset` of the parameter `name`.
    pub fn update(&mut self, name: &str, p: Prec, param: &mut [f64], grad: &[f64], offset: usize, step: u32) {
        let decay = if self.undecayed.contains(name) { 0.0 } else { self.weight_decay };
        match self.kind {
            OptimizerKind::Sgd => k::sgd_step(p, param, grad, self.cfg.lr, decay),
            _ => {
                let (m, v) = self.moments.get_mut(name).unwrap_or_else(|| panic!("no optimizer state for {name}"));
                let n = param.len();
                let cfg = k::AdamConfig { weight_decay: decay, ..self.cfg };
                k::adam_step(p, param, grad, &mut m[offset..offset + n], &mut v[offset..offset + n], step, &cfg);
            }
        }
    }
}

/// One set of gradient elements' part of the clipping norm's measure: Σx² (l2), Σ|x| (l1), max |x| (inf).
pub fn clip_measure(kind: ClipNorm, p: Prec, xs: &[f64]) -> f64 {
    match kind {
        ClipNorm::L2 => k::sum_squares(p, xs),
        ClipNorm::L1 => k::sum_abs(p, xs),
        ClipNorm::Inf => k::max_abs(xs),
    }
}

/// Two parts of the measure combined: their sum (`round` rounds it), for inf the larger (NaN if either is).
pub fn combine_measures(kind: ClipNorm, a: f64, b: f64, round: impl Fn(f64) -> f64) -> f64 {
    match kind {
        ClipNorm::Inf => k::max_abs(&[a, b]),
        _ => round(a + b),
    }
}

/// torch's clip coefficient from the global measure (the squared norm for l2, the norm itself otherwise).
pub fn clip_coefficient_of(kind: ClipNorm, measure: f64, max_norm: f64) -> f64 {
    let norm = if kind == ClipNorm::L2 { measure.sqrt() } else { measure };
    k::clip_coefficient(norm, max_norm)
}
