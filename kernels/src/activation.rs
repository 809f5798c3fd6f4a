//! Elementwise activations (forward takes the input; backward takes the forward input and dy).
//! Low-precision math runs in f32, then rounds to the storage dtype.

use ndarray::Array2;

use crate::Prec;

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_C: f64 = 0.044_715;

fn map(p: Prec, x: &Array2<f64>, f: impl Fn(f64) -> f64) -> Array2<f64> {
    x.mapv(|v| p.r(p.mid(f(v))))
}

fn zip(p: Prec, x: &Array2<f64>, dy: &Array2<f64>, f: impl Fn(f64, f64) -> f64) -> Array2<f64> {
    assert_eq!(x.dim(), dy.dim(), "activation backward: x {:?} dy {:?}", x.dim(), dy.dim());
    ndarray::Zip::from(x).and(dy).map_collect(|&a, &b| p.r(p.mid(f(a, b))))
}

/// GELU, tanh approximation (torch `gelu(approximate="tanh")`).
pub fn gelu_fwd(p: Prec, x: &Array2<f64>) -> Array2<f64> {
    map(p, x, |v| 0.5 * v * (1.0 + (SQRT_2_OVER_PI * (v + GELU_C * v * v * v)).tanh()))
}

pub fn gelu_bwd(p: Prec, x: &Array2<f64>, dy: &Array2<f64>) -> Array2<f64> {
    zip(p, x, dy, |v, d| {
        let u = SQRT_2_OVER_PI * (v + GELU_C * v * v * v);
        let t = u.tanh();
        let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * v * v);
        d * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du)
    })
}

pub fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

pub fn silu_fwd(p: Prec, x: &Array2<f64>) -> Array2<f64> {
    map(p, x, |v| v * sigmoid(v))
}

pub fn silu_bwd(p: Prec, x: &Array2<f64>, dy: &Array2<f64>) -> Array2<f64> {
    zip(p, x, dy, |v, d| {
        let s = sigmoid(v);
        d * (s + v * s * (1.0 - s))
    })
}

pub fn relu_fwd(p: Prec, x: &Array2<f64>) -> Array2<f64> {
    map(p, x, |v| v.max(0.0))
}

pub fn relu_bwd(p: Prec, x: &Array2<f64>, dy: &Array2<f64>) -> Array2<f64> {
    zip(p, x, dy, |v, d| if v > 0.0 { d } else { 0.0 })
}

/// SwiGLU: `silu(a) * b`.
pub fn swiglu_fwd(p: Prec, a: &Array2<f64>, b: &Array2<f64>) -> Array2<f64> {
    assert_eq!(a.dim(), b.dim(), "swiglu: a {:?} b {:?}", a.dim(), b.dim());
    ndarray::Zip::from(a).and(b).map_collect(|&x, &y| p.r(p.mid(p.mid(x * sigmoid(x)) * y)))
}

/// Returns `(da, db)`.
pub fn swiglu_bwd(p: Prec, a: &Array2<f64>, b: &Array2<f64>, dy: &Array2<f64>) -> (Array2<f64>, Array2<f64>) {
    let da = ndarray::Zip::from(a).and(b).and(dy).map_collect(|&x, &y, &d| {
        let s = sigmoid(x);
        p.r(p.mid(d * y * (s + x * s * (1.0 - s))))
    });
    let db = ndarray::Zip::from(a).and(dy).map_collect(|&x, &d| p.r(p.mid(d * x * sigmoid(x))));
    (da, db)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn activation_backwards_match_finite_differences() {
        let x = rand_mat(3, 4, 1) * 3.0;
        let dy = rand_mat(3, 4, 2);
        let f = Prec::F64;
        check_grad("gelu", &gelu_bwd(f, &x, &dy), &x, |x| (gelu_fwd(f, x) * &dy).sum());
        check_grad("silu", &silu_bwd(f, &x, &dy), &x, |x| (silu_fwd(f, x) * &dy).sum());
        let b = rand_mat(3, 4, 3);
        let (da, db) = swiglu_bwd(f, &x, &b, &dy);
        check_grad("swiglu a", &da, &x, |x| (swiglu_fwd(f, x, &b) * &dy).sum());
        check_grad("swiglu b", &db, &b, |b| (swiglu_fwd(f, &x, b) * &dy).sum());
        let xr = x.mapv(|v| if v.abs() < 0.01 { 0.5 } else { v });
        check_grad("relu", &relu_bwd(f, &xr, &dy), &xr, |x| (relu_fwd(f, x) * &dy).sum());
    }

    #[test]
    fn gelu_matches_known_values() {
        let x = Array2::from_shape_vec((1, 3), vec![0.0, 1.0, -1.0]).unwrap();
        let y = gelu_fwd(Prec::F64, &x);
        assert!((y[[0, 1]] - 0.841_191_990_607_477_2).abs() < 1e-12);
        assert_eq!(y[[0, 0]], 0.0);
    }
}
