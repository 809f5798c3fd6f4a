//! Optimizers on flat slices, elementwise, so a ZeRO partition can be updated alone with results
//! bitwise identical to updating the whole parameter. Math in f32 for low precision (the optimizer
//! state lives in f32), f64 otherwise; the parameter is rounded to the storage dtype.

use crate::Prec;

/// `grad += wd·param; param −= lr·grad`.
pub fn sgd_step(p: Prec, param: &mut [f64], grad: &[f64], lr: f64, weight_decay: f64) {
    assert_eq!(param.len(), grad.len(), "sgd_step: param {} grad {}", param.len(), grad.len());
    let a = p.acc();
    for (w, &g) in param.iter_mut().zip(grad) {
        let g = if weight_decay != 0.0 { a.round(g + a.round(weight_decay * *w)) } else { g };
        *w = p.r(a.round(*w - a.round(lr * g)));
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamConfig {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// AdamW: decoupled weight decay.
    pub decoupled: bool,
}

/// One Adam / AdamW step as `torch.optim.Adam(W)` computes it; `step` is 1-based.
pub fn adam_step(p: Prec, param: &mut [f64], grad: &[f64], m: &mut [f64], v: &mut [f64], step: u32, c: &AdamConfig) {
    assert!(param.len() == grad.len() && m.len() == grad.len() && v.len() == grad.len(), "adam_step: slice lengths differ");
    let a = p.acc();
    let bc1 = 1.0 - c.beta1.powi(step as i32);
    let bc2 = 1.0 - c.beta2.powi(step as i32);
    let step_size = a.round(c.lr / bc1);
    let bc2_sqrt = a.round(bc2.sqrt());
    for i in 0..param.len() {
        let mut w = param[i];
        let mut g = grad[i];
        if c.decoupled {
            w = a.round(w * a.round(1.0 - c.lr * c.weight_decay));
        } else if c.weight_decay != 0.0 {
            g = a.round(g + a.round(c.weight_decay * w));
        }
        m[i] = a.round(a.round(c.beta1 * m[i]) + a.round((1.0 - c.beta1) * g));
        v[i] = a.round(a.round(c.beta2 * v[i]) + a.round(a.round((1.0 - c.beta2) * g) * g));
        let denom = a.round(a.round(a.round(v[i].sqrt()) / bc2_sqrt) + c.eps);
        w = a.round(w - a.round(step_size * a.round(m[i] / denom)));
        param[i] = p.r(w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn cfg(decoupled: bool) -> AdamConfig {
        AdamConfig { lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, decoupled }
    }

    #[test]
    fn adam_first_step_matches_hand_computation() {
        let mut w = [1.0];
        let (mut m, mut v) = ([0.0], [0.0]);
        adam_step(Prec::F64, &mut w, &[0.5], &mut m, &mut v, 1, &cfg(false));
        // g = 0.5 + 0.01 = 0.51; m̂ = g, v̂ = g²: update = lr·g/(|g| + eps) ≈ 0.1
        let g: f64 = 0.51;
        let expect = 1.0 - 0.1 * g / (g.abs() + 1e-8);
        assert!((w[0] - expect).abs() < 1e-12, "{} vs {expect}", w[0]);
        let mut w = [1.0];
        let (mut m, mut v) = ([0.0], [0.0]);
        adam_step(Prec::F64, &mut w, &[0.5], &mut m, &mut v, 1, &cfg(true));
        let expect = 1.0 * (1.0 - 0.1 * 0.01) - 0.1 * 0.5 / (0.5 + 1e-8);
        assert!((w[0] - expect).abs() < 1e-12);
    }

    #[test]
    fn partitions_update_bitwise_like_the_whole() {
        let p = Prec::new(DType::BF16);
        let w0: Vec<f64> = (0..7).map(|i| p.r(0.1 * i as f64 - 0.3)).collect();
        let g: Vec<f64> = (0..7).map(|i| p.r(0.05 * (i as f64 - 3.0))).collect();
        let mut whole = w0.clone();
        let (mut m, mut v) = (vec![0.0; 7], vec![0.0; 7]);
        adam_step(p, &mut whole, &g, &mut m, &mut v, 1, &cfg(true));
        let mut parts = w0.clone();
        let (mut m2, mut v2) = (vec![0.0; 7], vec![0.0; 7]);
        let (a, b) = parts.split_at_mut(4);
        adam_step(p, a, &g[..4], &mut m2[..4], &mut v2[..4], 1, &cfg(true));
        adam_step(p, b, &g[4..], &mut m2[4..], &mut v2[4..], 1, &cfg(true));
        assert_eq!(whole, parts);
        let mut s1 = w0.clone();
        sgd_step(p, &mut s1, &g, 0.1, 0.0);
        assert!(s1.iter().all(|&x| DType::BF16.round(x) == x));
        assert_ne!(s1, w0);
    }
}
