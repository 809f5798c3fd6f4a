//! Matrix products and linear layers. Dot products accumulate in the accumulation dtype, rounding
//! after every addition; the result is rounded to the storage dtype.

use ndarray::{Array1, Array2, ArrayView2};
use rayon::prelude::*;

use crate::Prec;

/// Above this many multiply-adds, output rows are computed in parallel (never splitting a sum).
const PAR_THRESHOLD: usize = 1 << 17;

fn dot_rows(p: Prec, a: ArrayView2<f64>, bt: ArrayView2<f64>) -> Array2<f64> {
    // a: [m, k], bt: [n, k] (b transposed, contiguous rows) -> [m, n]
    let (m, k) = a.dim();
    let n = bt.nrows();
    let a = a.as_standard_layout();
    let bt = bt.as_standard_layout();
    let a_s = a.as_slice().expect("standard layout");
    let b_s = bt.as_slice().expect("standard layout");
    let acc = p.acc();
    let exact = p.is_exact();
    let row = |i: usize, out: &mut [f64]| {
        let ar = &a_s[i * k..(i + 1) * k];
        for (j, o) in out.iter_mut().enumerate() {
            let br = &b_s[j * k..(j + 1) * k];
            let mut s = 0.0;
            if exact && !p.reversed_sums {
                for (x, y) in ar.iter().zip(br) {
                    s += x * y;
                }
                *o = s;
            } else if exact {
                for (x, y) in ar.iter().zip(br).rev() {
                    s += x * y;
                }
                *o = s;
            } else if p.split_sums > 1 {
                *o = p.r(split_dot(p, ar, br));
            } else if p.reversed_sums {
                for (x, y) in ar.iter().zip(br).rev() {
                    s = acc.round(s + acc.round(x * y));
                }
                *o = p.r(s);
            } else {
                for (x, y) in ar.iter().zip(br) {
                    s = acc.round(s + acc.round(x * y));
                }
                *o = p.r(s);
            }
        }
    };
    let mut out = vec![0.0; m * n];
    if m * n * k >= PAR_THRESHOLD && n > 0 {
        out.par_chunks_mut(n).enumerate().for_each(|(i, o)| row(i, o));
    } else if n > 0 {
        for (i, o) in out.chunks_mut(n).enumerate() {
            row(i, o);
        }
    }
    Array2::from_shape_vec((m, n), out).expect("shape")
}

/// `a @ b` for a `[m, k]`, b `[k, n]`.
pub fn matmul(p: Prec, a: &Array2<f64>, b: &Array2<f64>) -> Array2<f64> {
    assert_eq!(a.ncols(), b.nrows(), "matmul: a {:?} b {:?}", a.dim(), b.dim());
    dot_rows(p, a.view(), b.t())
}

/// `aᵀ @ b` for a `[k, m]`, b `[k, n]`.
pub fn matmul_tn(p: Prec, a: &Array2<f64>, b: &Array2<f64>) -> Array2<f64> {
    assert_eq!(a.nrows(), b.nrows(), "matmul_tn: a {:?} b {:?}", a.dim(), b.dim());
    dot_rows(p, a.t(), b.t())
}

/// `a @ bᵀ` for a `[m, k]`, b `[n, k]`.
pub fn matmul_nt(p: Prec, a: &Array2<f64>, b: &Array2<f64>) -> Array2<f64> {
    assert_eq!(a.ncols(), b.ncols(), "matmul_nt: a {:?} b {:?}", a.dim(), b.dim());
    dot_rows(p, a.view(), b.view())
}

/// Adds `b` to every row of `x`.
pub fn add_row(p: Prec, x: &Array2<f64>, b: &Array1<f64>) -> Array2<f64> {
    assert_eq!(x.ncols(), b.len(), "add_row: x {:?} bias {}", x.dim(), b.len());
    let mut y = x.as_standard_layout().to_owned();
    for mut row in y.rows_mut() {
        for (v, bb) in row.iter_mut().zip(b.iter()) {
            *v = p.r(*v + bb);
        }
    }
    y
}

/// `x @ w + b` for x `[n, in]`, w `[in, out]`.
pub fn linear_fwd(p: Prec, x: &Array2<f64>, w: &Array2<f64>, b: Option<&Array1<f64>>) -> Array2<f64> {
    let y = matmul(p, x, w);
    match b {
        Some(b) => add_row(p, &y, b),
        None => y,
    }
}

/// A dot product split into `p.split_sums` chunks whose sums are rounded (to the storage dtype, or
/// `p.split_dtype`)
/// before they are added (a row-parallel product's partial sums before the all-reduce).
fn split_dot(p: Prec, a: &[f64], b: &[f64]) -> f64 {
    let acc = p.acc();
    p.chunks(a.len()).fold(0.0, |total, r| {
        let part = a[r.clone()].iter().zip(&b[r]).fold(0.0, |s, (x, y)| acc.round(s + acc.round(x * y)));
        p.add_partial(total, part)
    })
}

/// Column sums of `x` (the gradient of a bias), accumulated in order (in `p.split_sums` chunks of
/// rows, each rounded to the storage dtype, when asked).
pub fn sum_rows(p: Prec, x: &Array2<f64>) -> Array1<f64> {
    let acc = p.acc();
    let mut total = vec![0.0; x.ncols()];
    for chunk in p.chunks(x.nrows()) {
        let mut s = vec![0.0; x.ncols()];
        for row in x.rows().into_iter().skip(chunk.start).take(chunk.len()) {
            for (a, v) in s.iter_mut().zip(row.iter()) {
                *a = acc.round(*a + v);
            }
        }
        total.iter_mut().zip(s).for_each(|(t, v)| *t = p.fold_chunk(*t, v));
    }
    Array1::from_vec(total.into_iter().map(|v| p.r(v)).collect())
}

/// Gradients of a linear layer.
pub struct LinearGrads {
    pub dx: Array2<f64>,
    pub dw: Array2<f64>,
    pub db: Array1<f64>,
}

pub fn linear_bwd(p: Prec, x: &Array2<f64>, w: &Array2<f64>, dy: &Array2<f64>) -> LinearGrads {
    LinearGrads { dx: matmul_nt(p, dy, w), dw: matmul_tn(p, x, dy), db: sum_rows(p, dy) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;
    use crate::DType;

    #[test]
    fn linear_backward_matches_finite_differences() {
        let x = rand_mat(3, 4, 1);
        let w = rand_mat(4, 5, 2);
        let b = rand_vec(5, 3);
        let dy = rand_mat(3, 5, 4);
        let g = linear_bwd(Prec::F64, &x, &w, &dy);
        let f = |x: &Array2<f64>, w: &Array2<f64>, b: &Array1<f64>| (linear_fwd(Prec::F64, x, w, Some(b)) * &dy).sum();
        check_grad("dx", &g.dx, &x, |xx| f(xx, &w, &b));
        check_grad("dw", &g.dw, &w, |ww| f(&x, ww, &b));
        let gb = Array2::from_shape_vec((1, 5), g.db.to_vec()).unwrap();
        let b2 = Array2::from_shape_vec((1, 5), b.to_vec()).unwrap();
        check_grad("db", &gb, &b2, |bb| f(&x, &w, &bb.row(0).to_owned()));
    }

    #[test]
    fn transposed_products_agree_with_plain_matmul() {
        let a = rand_mat(4, 3, 5);
        let b = rand_mat(4, 6, 6);
        let c = rand_mat(6, 3, 7);
        assert_close(&matmul_tn(Prec::F64, &a, &b), &matmul(Prec::F64, &a.t().to_owned(), &b), 1e-14);
        assert_close(&matmul_nt(Prec::F64, &a, &c), &matmul(Prec::F64, &a, &c.t().to_owned()), 1e-14);
    }

    #[test]
    fn bf16_matmul_is_representable_and_close() {
        let p = Prec::new(DType::BF16);
        let a = rand_mat(8, 16, 8).mapv(|x| p.r(x));
        let b = rand_mat(16, 4, 9).mapv(|x| p.r(x));
        let y = matmul(p, &a, &b);
        assert!(y.iter().all(|&v| DType::BF16.round(v) == v));
        let exact = matmul(Prec::F64, &a, &b);
        let err = (&y - &exact).iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let scale = exact.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(err <= 4.0 * DType::BF16.unit_roundoff() * scale * 4.0, "err {err}");
        assert!(err > 0.0);
    }

    #[test]
    fn f32_accumulation_loses_small_addends_like_f32_does() {
        let p = Prec::new(DType::F32);
        let k = 4097;
        let mut a = Array2::zeros((1, k));
        a[[0, 0]] = 16777216.0; // 2^24
        for j in 1..k {
            a[[0, j]] = 1.0;
        }
        let b = Array2::ones((k, 1));
        // In f32, 2^24 + 1 rounds back to 2^24 every time.
        assert_eq!(matmul(p, &a, &b)[[0, 0]], 16777216.0);
        assert_eq!(matmul(Prec::F64, &a, &b)[[0, 0]], 16777216.0 + 4096.0);
    }

    #[test]
    fn large_matmuls_are_deterministic_and_empty_shapes_work() {
        let a = rand_mat(64, 64, 10);
        let b = rand_mat(64, 64, 11);
        let p = Prec::new(DType::F32);
        assert_eq!(matmul(p, &a, &b), matmul(p, &a, &b));
        let e = Array2::<f64>::zeros((3, 0));
        let f = Array2::<f64>::zeros((0, 5));
        assert_eq!(matmul(p, &e, &f), Array2::zeros((3, 5)));
        assert_eq!(matmul(p, &rand_mat(2, 3, 1), &Array2::zeros((3, 0))).dim(), (2, 0));
    }

    #[test]
    fn split_partial_sums_are_added_in_the_dtype_they_travel_in() {
        // The gradient of a bias from five rows that cancel to 0.039: exact when the partial sums are
        // added in f32, one bf16 rounding of the running sum (±1.76) off when they are added in bf16,
        // as a bf16 all-reduce adds them.
        let rows = [0.8125, -1.6953125, -0.87890625, 2.171875, -0.44921875];
        let x = Array2::from_shape_vec((5, 1), rows.to_vec()).unwrap();
        let p = Prec::new(DType::BF16);
        assert_eq!(sum_rows(p, &x)[0], -0.0390625);
        let split = sum_rows(p.split(5), &x)[0];
        let sequential_bf16 = rows.iter().fold(0.0, |s, v| DType::BF16.round(s + v));
        assert_eq!(split, sequential_bf16);
        assert!((split + 0.0390625).abs() >= 0.5 * DType::BF16.unit_roundoff(), "split {split}");
        // With an f32 reduce dtype the same partial sums add exactly.
        assert_eq!(sum_rows(p.split_into(5, DType::F32), &x)[0], -0.0390625);
    }
}
