//! Relative errors, normalised so that tensors that are mathematically zero do not look divergent.

use std::collections::BTreeMap;

use shardfuzz_harnesses::tensor::Tensor;

/// max|a − b| / denominator; NaN when `a` holds a non-finite value the reference does not.
pub fn relative_error(a: &Tensor, reference: &Tensor, denominator: f64) -> f64 {
    let mut worst = 0.0f64;
    for (x, r) in a.data.iter().zip(&reference.data) {
        if !x.is_finite() {
            if x.to_bits() == r.to_bits() {
                continue;
            }
            return f64::NAN;
        }
        worst = worst.max((x - r).abs());
    }
    if denominator > 0.0 {
        worst / denominator
    } else {
        worst
    }
}

/// The scale each tensor's error is measured against.
///
/// A tensor is normally measured against its own largest reference value. Some tensors are zero in
/// exact arithmetic (the gradient of a key bias: softmax ignores a per-row shift) and hold only
/// round-off; they are measured against a tenth of the largest value in their family
/// (`grad/…`, `param/…`, `loss/…`), the scale their round-off legitimately has (gradients flow into each other).
pub struct ErrorScale {
    family_max: BTreeMap<String, f64>,
}

/// Fraction of the family's scale below which a tensor is measured against the family.
const FAMILY_FRACTION: f64 = 0.1;

fn family(name: &str) -> &str {
    name.split('/').next().unwrap_or(name)
}

impl ErrorScale {
    pub fn new(reference: &[(String, Tensor)]) -> ErrorScale {
        let mut family_max: BTreeMap<String, f64> = BTreeMap::new();
        for (name, t) in reference {
            let m = t.data.iter().filter(|x| x.is_finite()).fold(0.0f64, |m, x| m.max(x.abs()));
            let e = family_max.entry(family(name).to_string()).or_insert(0.0);
            *e = e.max(m);
        }
        ErrorScale { family_max }
    }

    pub fn denominator(&self, name: &str, reference: &Tensor) -> f64 {
        let own = reference.data.iter().filter(|x| x.is_finite()).fold(0.0f64, |m, x| m.max(x.abs()));
        let fam = self.family_max.get(family(name)).copied().unwrap_or(0.0);
        own.max(FAMILY_FRACTION * fam)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f64]) -> Tensor {
        Tensor::new(vec![v.len()], v.to_vec())
    }

    #[test]
    fn relative_error_is_normwise() {
        assert_eq!(relative_error(&t(&[1.0, 2.0]), &t(&[1.0, 2.0]), 2.0), 0.0);
        assert!((relative_error(&t(&[1.0, 2.2]), &t(&[1.0, 2.0]), 2.0) - 0.1).abs() < 1e-12);
        assert!(relative_error(&t(&[f64::NAN, 2.0]), &t(&[1.0, 2.0]), 2.0).is_nan());
    }

    #[test]
    fn round_off_tensors_are_measured_against_their_family() {
        let refs = vec![("grad/a".to_string(), t(&[1.0, -2.0])), ("grad/k_bias".to_string(), t(&[1e-17, -1e-17]))];
        let s = ErrorScale::new(&refs);
        assert_eq!(s.denominator("grad/a", &refs[0].1), 2.0);
        assert_eq!(s.denominator("grad/k_bias", &refs[1].1), 0.2);
    }
}
