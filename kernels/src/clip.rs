//! Global-norm gradient clipping, as `torch.nn.utils.clip_grad_norm_`.

use crate::Prec;

/// Σ x², accumulated in the accumulation dtype.
pub fn sum_squares(p: Prec, xs: &[f64]) -> f64 {
    let a = p.acc();
    xs.iter().fold(0.0, |s, x| a.round(s + a.round(x * x)))
}

/// Σ |x|, accumulated in the accumulation dtype.
pub fn sum_abs(p: Prec, xs: &[f64]) -> f64 {
    let a = p.acc();
    xs.iter().fold(0.0, |s, x| a.round(s + x.abs()))
}

/// max |x| (exact in every dtype; NaN if any element is NaN, as torch's max).
pub fn max_abs(xs: &[f64]) -> f64 {
    xs.iter().fold(0.0, |m: f64, x| if m.is_nan() || x.is_nan() { f64::NAN } else { m.max(x.abs()) })
}

/// min(1, max_norm / (total_norm + 1e-6)).
pub fn clip_coefficient(total_norm: f64, max_norm: f64) -> f64 {
    (max_norm / (total_norm + 1e-6)).min(1.0)
}

pub fn scale_in_place(p: Prec, xs: &mut [f64], c: f64) {
    if c != 1.0 {
        xs.iter_mut().for_each(|x| *x = p.r(*x * c));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clipping_scales_only_above_the_threshold() {
        let g = [3.0, 4.0];
        let n = sum_squares(Prec::F64, &g).sqrt();
        assert_eq!(n, 5.0);
        assert!((clip_coefficient(n, 1.0) - 0.2).abs() < 1e-6);
        assert_eq!(clip_coefficient(n, 10.0), 1.0);
        let mut h = g;
        scale_in_place(Prec::F64, &mut h, 0.5);
        assert_eq!(h, [1.5, 2.0]);
    }
}
