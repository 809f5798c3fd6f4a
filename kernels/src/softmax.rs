//! Row-wise softmax (max-subtracted, sums in the accumulation dtype).

use ndarray::Array2;

use crate::Prec;

pub fn softmax_rows(p: Prec, x: &Array2<f64>) -> Array2<f64> {
    let acc = p.acc();
    let mut y = Array2::zeros(x.raw_dim());
    for (xr, mut yr) in x.rows().into_iter().zip(y.rows_mut()) {
        let m = xr.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        let mut s = 0.0;
        for (o, &v) in yr.iter_mut().zip(xr.iter()) {
            *o = acc.round((v - m).exp());
            s = acc.round(s + *o);
        }
        for o in yr.iter_mut() {
            *o = p.r(*o / s);
        }
    }
    y
}

/// `dx = y * (dy - sum(dy * y))` per row.
pub fn softmax_rows_bwd(p: Prec, y: &Array2<f64>, dy: &Array2<f64>) -> Array2<f64> {
    let acc = p.acc();
    let mut dx = Array2::zeros(y.raw_dim());
    for ((yr, dr), mut xr) in y.rows().into_iter().zip(dy.rows()).zip(dx.rows_mut()) {
        let dot = yr.iter().zip(dr.iter()).fold(0.0, |s, (a, b)| acc.round(s + acc.round(a * b)));
        for ((o, &a), &b) in xr.iter_mut().zip(yr.iter()).zip(dr.iter()) {
            *o = p.r(acc.round(a * acc.round(b - dot)));
        }
    }
    dx
}

pub fn log_softmax_rows(p: Prec, x: &Array2<f64>) -> Array2<f64> {
    let acc = p.acc();
    let mut y = Array2::zeros(x.raw_dim());
    for (xr, mut yr) in x.rows().into_iter().zip(y.rows_mut()) {
        let m = xr.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
        let s = xr.iter().fold(0.0, |s, &v| acc.round(s + acc.round((v - m).exp())));
        let ls = acc.round(s.ln());
        for (o, &v) in yr.iter_mut().zip(xr.iter()) {
            *o = p.r(v - m - ls);
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn softmax_backward_matches_finite_differences_and_rows_sum_to_one() {
        let x = rand_mat(3, 5, 1) * 4.0;
        let dy = rand_mat(3, 5, 2);
        let y = softmax_rows(Prec::F64, &x);
        for r in y.rows() {
            assert!((r.sum() - 1.0).abs() < 1e-14);
        }
        check_grad("softmax", &softmax_rows_bwd(Prec::F64, &y, &dy), &x, |x| (softmax_rows(Prec::F64, x) * &dy).sum());
        let ls = log_softmax_rows(Prec::F64, &x);
        assert_close(&ls.mapv(f64::exp), &y, 1e-14);
    }
}
