//! LayerNorm and RMSNorm over the last dimension. Statistics accumulate in the accumulation dtype.

use ndarray::{Array1, Array2};

use crate::Prec;

/// Per-row normalised input and inverse standard deviation, kept for the backward pass.
#[derive(Clone)]
pub struct NormCache {
    pub x_hat: Array2<f64>,
    pub rstd: Array1<f64>,
}

pub struct NormGrads {
    pub dx: Array2<f64>,
    pub dw: Array1<f64>,
    pub db: Option<Array1<f64>>,
}

fn row_stats(p: Prec, x: &Array2<f64>, center: bool, eps: f64) -> (Array2<f64>, Array1<f64>) {
    let acc = p.acc();
    let h = x.ncols() as f64;
    let mut x_hat = Array2::zeros(x.raw_dim());
    let mut rstd = Array1::zeros(x.nrows());
    for (i, (xr, mut hr)) in x.rows().into_iter().zip(x_hat.rows_mut()).enumerate() {
        let mean = if center { acc.round(xr.iter().fold(0.0, |s, &v| acc.round(s + v)) / h) } else { 0.0 };
        let var = acc.round(xr.iter().fold(0.0, |s, &v| acc.round(s + acc.round((v - mean) * (v - mean)))) / h);
        let r = acc.round(1.0 / (var + eps).sqrt());
        rstd[i] = r;
        for (o, &v) in hr.iter_mut().zip(xr.iter()) {
            *o = acc.round((v - mean) * r);
        }
    }
    (x_hat, rstd)
}

fn affine(p: Prec, x_hat: &Array2<f64>, w: &Array1<f64>, b: Option<&Array1<f64>>) -> Array2<f64> {
    let mut y = Array2::zeros(x_hat.raw_dim());
    for (hr, mut yr) in x_hat.rows().into_iter().zip(y.rows_mut()) {
        for (j, (o, &v)) in yr.iter_mut().zip(hr.iter()).enumerate() {
            let s = p.mid(v * w[j]);
            *o = p.r(match b {
                Some(b) => s + b[j],
                None => s,
            });
        }
    }
    y
}

pub fn layernorm_fwd(p: Prec, x: &Array2<f64>, w: &Array1<f64>, b: Option<&Array1<f64>>, eps: f64) -> (Array2<f64>, NormCache) {
    assert_eq!(x.ncols(), w.len(), "layernorm: x {:?} weight {}", x.dim(), w.len());
    let (x_hat, rstd) = row_stats(p, x, true, eps);
    (affine(p, &x_hat, w, b), NormCache { x_hat, rstd })
}

pub fn rmsnorm_fwd(p: Prec, x: &Array2<f64>, w: &Array1<f64>, eps: f64) -> (Array2<f64>, NormCache) {
    assert_eq!(x.ncols(), w.len(), "rmsnorm: x {:?} weight {}", x.dim(), w.len());
    let (x_hat, rstd) = row_stats(p, x, false, eps);
    (affine(p, &x_hat, w, None), NormCache { x_hat, rstd })
}

/// Weight and bias gradients summed over the rows given (a sequence-parallel rank passes its rows
/// and all-reduces the result).
pub fn layernorm_weight_grads(p: Prec, x_hat: &Array2<f64>, dy: &Array2<f64>) -> (Array1<f64>, Array1<f64>) {
    let acc = p.acc();
    let h = x_hat.ncols();
    let (mut dw, mut db) = (vec![0.0; h], vec![0.0; h]);
    // Summed over rows like a bias gradient: in `p.split_sums` chunks of rows when asked, each
    // partial sum rounded before it is added (ranks', micro-batches' and accumulation steps' partial
    // gradients; a clean f16 case with three accumulation steps had a final-norm gradient of 10⁻⁹,
    // below f16's smallest subnormal, come out a subnormal apart where the unsplit runs agreed).
    for chunk in p.chunks(x_hat.nrows()) {
        let (mut pw, mut pb) = (vec![0.0; h], vec![0.0; h]);
        for (hr, dr) in x_hat.rows().into_iter().zip(dy.rows()).skip(chunk.start).take(chunk.len()) {
            for j in 0..h {
                pw[j] = acc.round(pw[j] + acc.round(dr[j] * hr[j]));
                pb[j] = acc.round(pb[j] + dr[j]);
            }
        }
        dw.iter_mut().zip(pw).for_each(|(t, v)| *t = p.fold_chunk(*t, v));
        db.iter_mut().zip(pb).for_each(|(t, v)| *t = p.fold_chunk(*t, v));
    }
    (Array1::from_iter(dw.into_iter().map(|v| p.r(v))), Array1::from_iter(db.into_iter().map(|v| p.r(v))))
}

fn norm_bwd(p: Prec, w: &Array1<f64>, cache: &NormCache, dy: &Array2<f64>, center: bool) -> Array2<f64> {
    let acc = p.acc();
    let h = w.len() as f64;
    let mut dx = Array2::zeros(dy.raw_dim());
    for (i, ((hr, dr), mut xr)) in cache.x_hat.rows().into_iter().zip(dy.rows()).zip(dx.rows_mut()).enumerate() {
        let g: Vec<f64> = dr.iter().zip(w.iter()).map(|(d, w)| acc.round(d * w)).collect();
        let mean_g = if center { acc.round(g.iter().fold(0.0, |s, v| acc.round(s + v)) / h) } else { 0.0 };
        let mean_gx = acc.round(g.iter().zip(hr.iter()).fold(0.0, |s, (a, b)| acc.round(s + acc.round(a * b))) / h);
        for (j, o) in xr.iter_mut().enumerate() {
            *o = p.r(acc.round(cache.rstd[i] * acc.round(g[j] - mean_g - hr[j] * mean_gx)));
        }
    }
    dx
}

pub fn layernorm_bwd(p: Prec, _x: &Array2<f64>, w: &Array1<f64>, cache: &NormCache, dy: &Array2<f64>) -> NormGrads {
    let (dw, db) = layernorm_weight_grads(p, &cache.x_hat, dy);
    NormGrads { dx: norm_bwd(p, w, cache, dy, true), dw, db: Some(db) }
}

pub fn rmsnorm_bwd(p: Prec, _x: &Array2<f64>, w: &Array1<f64>, cache: &NormCache, dy: &Array2<f64>) -> NormGrads {
    let (dw, _) = layernorm_weight_grads(p, &cache.x_hat, dy);
    NormGrads { dx: norm_bwd(p, w, cache, dy, false), dw, db: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    fn row(v: &Array1<f64>) -> Array2<f64> {
        Array2::from_shape_vec((1, v.len()), v.to_vec()).unwrap()
    }

    #[test]
    fn layernorm_backward_matches_finite_differences() {
        let f = Prec::F64;
        let x = rand_mat(3, 6, 1) * 2.0;
        let w = rand_vec(6, 2) + 1.0;
        let b = rand_vec(6, 3);
        let dy = rand_mat(3, 6, 4);
        let (_, c) = layernorm_fwd(f, &x, &w, Some(&b), 1e-5);
        let g = layernorm_bwd(f, &x, &w, &c, &dy);
        let loss = |x: &Array2<f64>, w: &Array1<f64>, b: &Array1<f64>| (layernorm_fwd(f, x, w, Some(b), 1e-5).0 * &dy).sum();
        check_grad("dx", &g.dx, &x, |xx| loss(xx, &w, &b));
        check_grad("dw", &row(&g.dw), &row(&w), |ww| loss(&x, &ww.row(0).to_owned(), &b));
        check_grad("db", &row(g.db.as_ref().unwrap()), &row(&b), |bb| loss(&x, &w, &bb.row(0).to_owned()));
        // Without bias.
        let (_, c) = layernorm_fwd(f, &x, &w, None, 1e-5);
        let g = layernorm_bwd(f, &x, &w, &c, &dy);
        check_grad("dx no bias", &g.dx, &x, |xx| (layernorm_fwd(f, xx, &w, None, 1e-5).0 * &dy).sum());
    }

    #[test]
    fn rmsnorm_backward_matches_finite_differences() {
        let f = Prec::F64;
        let x = rand_mat(4, 5, 5);
        let w = rand_vec(5, 6) + 1.0;
        let dy = rand_mat(4, 5, 7);
        let (_, c) = rmsnorm_fwd(f, &x, &w, 1e-5);
        let g = rmsnorm_bwd(f, &x, &w, &c, &dy);
        check_grad("dx", &g.dx, &x, |xx| (rmsnorm_fwd(f, xx, &w, 1e-5).0 * &dy).sum());
        check_grad("dw", &row(&g.dw), &row(&w), |ww| (rmsnorm_fwd(f, &x, &ww.row(0).to_owned(), 1e-5).0 * &dy).sum());
    }

    #[test]
    fn weight_grads_split_over_rows_sum_to_the_whole() {
        let f = Prec::F64;
        let x = rand_mat(6, 4, 8);
        let w = rand_vec(4, 9);
        let dy = rand_mat(6, 4, 10);
        let (_, c) = layernorm_fwd(f, &x, &w, None, 1e-5);
        let (dw, _) = layernorm_weight_grads(f, &c.x_hat, &dy);
        let top = ndarray::s![0..2, ..];
        let bot = ndarray::s![2..6, ..];
        let (a, _) = layernorm_weight_grads(f, &c.x_hat.slice(top).to_owned(), &dy.slice(top).to_owned());
        let (b, _) = layernorm_weight_grads(f, &c.x_hat.slice(bot).to_owned(), &dy.slice(bot).to_owned());
        assert_close(&row(&(a + b)), &row(&dw), 1e-14);
    }

    #[test]
    fn split_weight_grads_round_each_partial_sum() {
        // Two rows whose products cancel in f16: unsplit, the f32 accumulator keeps their sum
        // exactly; split in two, each product is rounded to f16 before they are added.
        let x_hat = ndarray::array![[1.0], [1.0]];
        let dy = ndarray::array![[1.0 + 2f64.powi(-12)], [-1.0]];
        let f16 = Prec::new(crate::DType::F16);
        assert_eq!(layernorm_weight_grads(f16, &x_hat, &dy).0[0], 2f64.powi(-12));
        let (dw, db) = layernorm_weight_grads(f16.split(2), &x_hat, &dy);
        assert_eq!((dw[0], db[0]), (0.0, 0.0));
    }
}
