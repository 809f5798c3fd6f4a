//! Causal multi-head attention with grouped-query heads. Heads are contiguous column blocks of
//! width `head_dim`; query head h reads kv head h / (q_heads / kv_heads). Scores and softmax run in
//! the accumulation dtype; probabilities are rounded to the storage dtype, as GPU kernels do.

use ndarray::Array2;

use crate::Prec;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    pub batch: usize,
    pub seq: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// Attention probabilities per (batch, head), each `[seq, seq]` (zero above the diagonal).
pub struct AttnCache {
    pub probs: Vec<Array2<f64>>,
    /// Per (batch, head), the scaled scores of each query row over the keys it sees (row i holds
    /// keys 0..=i; the rest is −∞): how far a row's top score stands from its runner-up.
    pub scores: Vec<Array2<f64>>,
}

impl AttnShape {
    fn group(&self) -> usize {
        assert!(
            self.kv_heads > 0 && self.q_heads % self.kv_heads == 0,
            "attention: q_heads {} not a multiple of kv_heads {}",
            self.q_heads,
            self.kv_heads
        );
        self.q_heads / self.kv_heads
    }
}

fn check(q: &Array2<f64>, k: &Array2<f64>, v: &Array2<f64>, s: &AttnShape) {
    let n = s.batch * s.seq;
    assert_eq!(q.dim(), (n, s.q_heads * s.head_dim), "attention: q {:?} for {s:?}", q.dim());
    assert_eq!(k.dim(), (n, s.kv_heads * s.head_dim), "attention: k {:?} for {s:?}", k.dim());
    assert_eq!(v.dim(), k.dim(), "attention: v {:?} k {:?}", v.dim(), k.dim());
}

#[allow(clippy::too_many_arguments)]
fn dot(p: Prec, a: &Array2<f64>, ar: usize, ac: usize, b: &Array2<f64>, br: usize, bc: usize, d: usize) -> f64 {
    let acc = p.acc();
    let mut s = 0.0;
    for c in 0..d {
        s = acc.round(s + acc.round(a[[ar, ac + c]] * b[[br, bc + c]]));
    }
    s
}

pub fn attention_fwd(p: Prec, q: &Array2<f64>, k: &Array2<f64>, v: &Array2<f64>, s: AttnShape, scale: f64) -> (Array2<f64>, AttnCache) {
    if q.nrows() == 0 || s.q_heads == 0 {
        return (Array2::zeros(q.raw_dim()), AttnCache { probs: vec![], scores: vec![] });
    }
    check(q, k, v, &s);
    let acc = p.acc();
    let (t, d, g) = (s.seq, s.head_dim, s.group());
    let mut out = Array2::zeros(q.raw_dim());
    let mut probs = Vec::with_capacity(s.batch * s.q_heads);
    let mut all_scores = Vec::with_capacity(s.batch * s.q_heads);
    for b in 0..s.batch {
        for h in 0..s.q_heads {
            let kv = h / g;
            let mut pr = Array2::zeros((t, t));
            let mut sc = Array2::from_elem((t, t), f64::NEG_INFINITY);
            for i in 0..t {
                let row = b * t + i;
                let scores: Vec<f64> = (0..=i).map(|j| acc.round(dot(p, q, row, h * d, k, b * t + j, kv * d, d) * scale)).collect();
                let m = scores.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(x));
                let e: Vec<f64> = scores.iter().map(|x| acc.round((x - m).exp())).collect();
                let sum = e.iter().fold(0.0, |a, x| acc.round(a + x));
                for j in 0..=i {
                    pr[[i, j]] = p.r(e[j] / sum);
                    sc[[i, j]] = scores[j];
                }
                for c in 0..d {
                    let mut o = 0.0;
                    for j in 0..=i {
                        o = acc.round(o + acc.round(pr[[i, j]] * v[[b * t + j, kv * d + c]]));
                    }
                    out[[row, h * d + c]] = p.r(o);
                }
            }
            probs.push(pr);
            all_scores.push(sc);
        }
    }
    (out, AttnCache { probs, scores: all_scores })
}

/// Returns `(dq, dk, dv)`; dk and dv sum over the query heads that share a kv head.
#[allow(clippy::too_many_arguments)]
pub fn attention_bwd(
    p: Prec,
    q: &Array2<f64>,
    k: &Array2<f64>,
    v: &Array2<f64>,
    cache: &AttnCache,
    dout: &Array2<f64>,
    s: AttnShape,
    scale: f64,
) -> (Array2<f64>, Array2<f64>, Array2<f64>) {
    if q.nrows() == 0 || s.q_heads == 0 {
        return (Array2::zeros(q.raw_dim()), Array2::zeros(k.raw_dim()), Array2::zeros(v.raw_dim()));
    }
    check(q, k, v, &s);
    let acc = p.acc();
    let (t, d, g) = (s.seq, s.head_dim, s.group());
    let mut dq = Array2::zeros(q.raw_dim());
    // Accumulate dk/dv unrounded per element in the accumulation dtype, round once at the end.
    let mut dk = Array2::zeros(k.raw_dim());
    let mut dv = Array2::zeros(v.raw_dim());
    for b in 0..s.batch {
        for h in 0..s.q_heads {
            let kv = h / g;
            let pr = &cache.probs[b * s.q_heads + h];
            for i in 0..t {
                let row = b * t + i;
                let dp: Vec<f64> = (0..=i).map(|j| dot(p, dout, row, h * d, v, b * t + j, kv * d, d)).collect();
                let sum = (0..=i).fold(0.0, |a, j| acc.round(a + acc.round(pr[[i, j]] * dp[j])));
                let ds: Vec<f64> = (0..=i).map(|j| acc.round(acc.round(pr[[i, j]] * acc.round(dp[j] - sum)) * scale)).collect();
                for c in 0..d {
                    let mut o = 0.0;
                    for (j, dsj) in ds.iter().enumerate() {
                        o = acc.round(o + acc.round(dsj * k[[b * t + j, kv * d + c]]));
                    }
                    dq[[row, h * d + c]] = p.r(o);
                }
                for (j, dsj) in ds.iter().enumerate() {
                    let col = b * t + j;
                    for c in 0..d {
                        let x = &mut dk[[col, kv * d + c]];
                        *x = acc.round(*x + acc.round(dsj * q[[row, h * d + c]]));
                        let y = &mut dv[[col, kv * d + c]];
                        *y = acc.round(*y + acc.round(pr[[i, j]] * dout[[row, h * d + c]]));
                    }
                }
            }
        }
    }
    (dq, dk.mapv(|x| p.r(x)), dv.mapv(|x| p.r(x)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    fn grads(hq: usize, hkv: usize) {
        let s = AttnShape { batch: 2, seq: 3, q_heads: hq, kv_heads: hkv, head_dim: 2 };
        let n = 6;
        let q = rand_mat(n, hq * 2, 1);
        let k = rand_mat(n, hkv * 2, 2);
        let v = rand_mat(n, hkv * 2, 3);
        let dout = rand_mat(n, hq * 2, 4);
        let f = Prec::F64;
        let sc = 0.7;
        let (_, c) = attention_fwd(f, &q, &k, &v, s, sc);
        let (dq, dk, dv) = attention_bwd(f, &q, &k, &v, &c, &dout, s, sc);
        let loss = |q: &Array2<f64>, k: &Array2<f64>, v: &Array2<f64>| (attention_fwd(f, q, k, v, s, sc).0 * &dout).sum();
        check_grad("dq", &dq, &q, |x| loss(x, &k, &v));
        check_grad("dk", &dk, &k, |x| loss(&q, x, &v));
        check_grad("dv", &dv, &v, |x| loss(&q, &k, x));
    }

    #[test]
    fn mha_and_gqa_backward_match_finite_differences() {
        grads(2, 2);
        grads(4, 2);
        grads(4, 1);
    }

    #[test]
    fn attention_is_causal() {
        let s = AttnShape { batch: 1, seq: 4, q_heads: 1, kv_heads: 1, head_dim: 3 };
        let q = rand_mat(4, 3, 5);
        let k = rand_mat(4, 3, 6);
        let v = rand_mat(4, 3, 7);
        let (a, _) = attention_fwd(Prec::F64, &q, &k, &v, s, 0.5);
        let mut k2 = k.clone();
        let mut v2 = v.clone();
        k2.row_mut(3).fill(9.0);
        v2.row_mut(3).fill(-9.0);
        let (b, _) = attention_fwd(Prec::F64, &q, &k2, &v2, s, 0.5);
        assert_eq!(a.slice(ndarray::s![0..3, ..]), b.slice(ndarray::s![0..3, ..]));
        assert_ne!(a.row(3), b.row(3));
    }
}
