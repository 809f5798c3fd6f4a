//! Helpers for the kernel tests: seeded random inputs and finite-difference gradient checks.

use ndarray::{Array1, Array2};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub fn rand_mat(r: usize, c: usize, seed: u64) -> Array2<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Array2::from_shape_fn((r, c), |_| rng.gen_range(-1.0..1.0))
}

pub fn rand_vec(n: usize, seed: u64) -> Array1<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Array1::from_shape_fn(n, |_| rng.gen_range(-1.0..1.0))
}

pub fn assert_close(a: &Array2<f64>, b: &Array2<f64>, tol: f64) {
    assert_eq!(a.dim(), b.dim());
    let scale = b.iter().fold(1e-300f64, |m, v| m.max(v.abs()));
    for (x, y) in a.iter().zip(b.iter()) {
        assert!((x - y).abs() <= tol * scale, "{x} vs {y} (tol {tol}, scale {scale})");
    }
}

/// Checks an analytic gradient of the scalar function `f` at `x` against central differences.
pub fn check_grad(what: &str, grad: &Array2<f64>, x: &Array2<f64>, f: impl Fn(&Array2<f64>) -> f64) {
    assert_eq!(grad.dim(), x.dim(), "{what}: gradient shape");
    let h = 1e-6;
    let scale = grad.iter().fold(1e-8f64, |m, v| m.max(v.abs()));
    for i in 0..x.nrows() {
        for j in 0..x.ncols() {
            let mut xp = x.clone();
            xp[[i, j]] += h;
            let mut xm = x.clone();
            xm[[i, j]] -= h;
            let fd = (f(&xp) - f(&xm)) / (2.0 * h);
            let an = grad[[i, j]];
            assert!((fd - an).abs() <= 1e-6 * scale.max(1.0), "{what}[{i},{j}]: analytic {an} vs finite difference {fd}");
        }
    }
}
