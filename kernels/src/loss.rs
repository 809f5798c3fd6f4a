//! Cross-entropy, whole or in the pieces a vocab-parallel implementation composes:
//! loss = ln(Σ_global exp(x − m)) + m − x_target, with m the global row max, each piece computed
//! on a slice of the vocabulary and all-reduced (max, sum, sum).

use ndarray::{Array1, Array2};

use crate::Prec;

/// The target of a row the loss ignores (torch's `ignore_index`): its loss and its gradient are zero.
pub const IGNORED_TARGET: usize = usize::MAX;

/// Zeroes the loss and the logits' gradient of every row whose target is [`IGNORED_TARGET`].
pub fn mask_ignored(targets: &[usize], losses: &mut [f64], dlogits: &mut Array2<f64>) {
    for (i, _) in targets.iter().enumerate().filter(|(_, &t)| t == IGNORED_TARGET) {
        losses[i] = 0.0;
        dlogits.row_mut(i).fill(0.0);
    }
}

pub struct CrossEntropy {
    /// Per-row loss −log softmax(x)[target].
    pub losses: Array1<f64>,
    /// `(softmax − onehot) × grad_scale`.
    pub dlogits: Array2<f64>,
}

pub fn cross_entropy_fwd_bwd(p: Prec, logits: &Array2<f64>, targets: &[usize], grad_scale: f64) -> CrossEntropy {
    assert_eq!(logits.nrows(), targets.len(), "cross_entropy: logits {:?}, {} targets", logits.dim(), targets.len());
    let acc = p.acc();
    let m = row_max(p, logits);
    let s = row_sum_exp(p, logits, &m);
    let tl = target_logit(logits, targets, 0);
    let mut losses = Array1::zeros(logits.nrows());
    let mut d = Array2::zeros(logits.raw_dim());
    for i in 0..logits.nrows() {
        losses[i] = p.r(acc.round(acc.round(s[i].ln()) + m[i] - tl[i]));
        for j in 0..logits.ncols() {
            let prob = acc.round(acc.round((logits[[i, j]] - m[i]).exp()) / s[i]);
            let onehot = if j == targets[i] { 1.0 } else { 0.0 };
            d[[i, j]] = p.r(acc.round(prob - onehot) * grad_scale);
        }
    }
    mask_ignored(targets, losses.as_slice_mut().expect("contiguous"), &mut d);
    CrossEntropy { losses, dlogits: d }
}

/// Largest logit per row (−∞ for an empty slice).
pub fn row_max(_p: Prec, logits: &Array2<f64>) -> Array1<f64> {
    logits.rows().into_iter().map(|r| r.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b))).collect()
}

/// Σ exp(x − max) per row, in the accumulation dtype. With split sums (`Prec::split`) the vocabulary
/// is cut into that many slices, each summed on its own and the slices' sums added last to first:
/// a vocab-parallel cross-entropy all-reduces per-rank sums, so a correct sharded run adds the same
/// terms grouped by rank and in another order. Near a saturated softmax that order is all the
/// gradient has: the target's probability is 1 − p within an ulp, and its gradient p − 1 inherits
/// that ulp as a relative error of u / p (a clean f64 case, tp4 with the vocabulary 3 padded to 4,
/// p ≈ 2e-10, had every gradient 1e-6 off the reference where each sequential member agreed to 1e-14).
pub fn row_sum_exp(p: Prec, logits: &Array2<f64>, row_max: &Array1<f64>) -> Array1<f64> {
    let acc = p.acc();
    let slices: Vec<_> = p.chunks(logits.ncols()).collect();
    logits
        .rows()
        .into_iter()
        .zip(row_max.iter())
        .map(|(r, &m)| {
            let sum = |cols: &std::ops::Range<usize>| cols.clone().fold(0.0, |s, j| acc.round(s + acc.round((r[j] - m).exp())));
            match slices.as_slice() {
                [whole] => sum(whole),
                _ => slices.iter().rev().fold(0.0, |s, cols| acc.round(s + sum(cols))),
            }
        })
        .collect()
}

/// The target's logit per row when it falls in this slice `[col_offset, col_offset + cols)`, else 0.
pub fn target_logit(logits: &Array2<f64>, targets: &[usize], col_offset: usize) -> Array1<f64> {
    let v = logits.ncols();
    targets
        .iter()
        .enumerate()
        .map(|(i, &t)| if t >= col_offset && t < col_offset + v { logits[[i, t - col_offset]] } else { 0.0 })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn an_ignored_row_has_no_loss_and_no_gradient() {
        let x = rand_mat(3, 5, 2) * 3.0;
        let ce = cross_entropy_fwd_bwd(Prec::F64, &x, &[1, IGNORED_TARGET, 4], 1.0);
        let whole = cross_entropy_fwd_bwd(Prec::F64, &x, &[1, 2, 4], 1.0);
        assert_eq!(ce.losses[1], 0.0);
        assert!(ce.dlogits.row(1).iter().all(|&d| d == 0.0));
        assert_eq!((ce.losses[0], ce.losses[2]), (whole.losses[0], whole.losses[2]));
        assert_eq!(ce.dlogits.row(2), whole.dlogits.row(2));
    }

    #[test]
    fn cross_entropy_gradient_matches_finite_differences() {
        let x = rand_mat(3, 5, 1) * 3.0;
        let t = [0, 4, 2];
        let ce = cross_entropy_fwd_bwd(Prec::F64, &x, &t, 0.5);
        check_grad("dlogits", &ce.dlogits, &x, |x| 0.5 * cross_entropy_fwd_bwd(Prec::F64, x, &t, 1.0).losses.sum());
    }

    #[test]
    fn vocab_slices_compose_to_the_full_loss() {
        let x = rand_mat(4, 7, 2) * 2.0;
        let t = [6, 0, 3, 5];
        let full = cross_entropy_fwd_bwd(Prec::F64, &x, &t, 1.0).losses;
        for cuts in [vec![0, 4, 7], vec![0, 3, 6, 7]] {
            let slices: Vec<(usize, Array2<f64>)> =
                cuts.windows(2).map(|w| (w[0], x.slice(ndarray::s![.., w[0]..w[1]]).to_owned())).collect();
            let m: Array1<f64> =
                (0..4).map(|i| slices.iter().map(|(_, s)| row_max(Prec::F64, s)[i]).fold(f64::NEG_INFINITY, f64::max)).collect();
            let se: Array1<f64> = (0..4).map(|i| slices.iter().map(|(_, s)| row_sum_exp(Prec::F64, s, &m)[i]).sum()).collect();
            let tl: Array1<f64> = (0..4).map(|i| slices.iter().map(|(o, s)| target_logit(s, &t, *o)[i]).sum()).collect();
            for i in 0..4 {
                let l = se[i].ln() + m[i] - tl[i];
                assert!((l - full[i]).abs() < 1e-12, "{l} vs {}", full[i]);
            }
        }
    }
}
