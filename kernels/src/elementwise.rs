//! Elementwise sums and scaling with storage rounding.

use ndarray::Array2;

use crate::{DType, Prec};

pub fn add(p: Prec, a: &Array2<f64>, b: &Array2<f64>) -> Array2<f64> {
    assert_eq!(a.dim(), b.dim(), "add: a {:?} b {:?}", a.dim(), b.dim());
    ndarray::Zip::from(a).and(b).map_collect(|&x, &y| p.r(x + y))
}

pub fn add_in_place(p: Prec, a: &mut Array2<f64>, b: &Array2<f64>) {
    assert_eq!(a.dim(), b.dim(), "add_in_place: a {:?} b {:?}", a.dim(), b.dim());
    ndarray::Zip::from(a).and(b).for_each(|x, &y| *x = p.r(*x + y));
}

pub fn scale(p: Prec, a: &Array2<f64>, s: f64) -> Array2<f64> {
    a.mapv(|x| p.r(x * s))
}

/// `acc[i] = round(acc[i] + x[i])` in `dtype` (gradient accumulation, reductions).
pub fn sum_into(acc: &mut [f64], x: &[f64], dtype: DType) {
    assert_eq!(acc.len(), x.len(), "sum_into: {} vs {}", acc.len(), x.len());
    for (a, &b) in acc.iter_mut().zip(x) {
        *a = dtype.round(*a + b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_round_to_the_dtype() {
        let mut a = vec![1.0, 256.0];
        sum_into(&mut a, &[1e-3, 1.0], DType::BF16);
        assert_eq!(a, vec![1.0, 256.0]);
        let mut b = vec![1.0];
        sum_into(&mut b, &[1e-3], DType::F64);
        assert_eq!(b, vec![1.001]);
        let x = Array2::from_elem((1, 1), 1.0);
        assert_eq!(add(Prec::new(DType::BF16), &x, &Array2::from_elem((1, 1), 1e-3))[[0, 0]], 1.0);
    }
}
