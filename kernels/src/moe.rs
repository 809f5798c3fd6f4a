//! Mixture-of-experts routing: softmax router, top-k choice, capacity assignment.

use ndarray::Array2;

use crate::{softmax_rows, softmax_rows_bwd, Prec};

/// Indices of the k largest entries per row, by decreasing value, ties to the lower index.
pub fn topk_rows(probs: &Array2<f64>, k: usize) -> Vec<Vec<usize>> {
    probs
        .rows()
        .into_iter()
        .map(|r| {
            let mut idx: Vec<usize> = (0..r.len()).collect();
            idx.sort_by(|&a, &b| r[b].partial_cmp(&r[a]).unwrap_or(std::cmp::Ordering::Equal).then(a.cmp(&b)));
            idx.truncate(k);
            idx
        })
        .collect()
}

pub struct Routing {
    /// Softmax over experts, `[tokens, experts]`.
    pub probs: Array2<f64>,
    /// Chosen experts per token.
    pub experts: Vec<Vec<usize>>,
    /// Gates of the chosen experts, `[tokens, k]`: their router probabilities, or with `renormalized` those
    /// divided by their sum over the token's chosen experts.
    pub gates: Array2<f64>,
    pub renormalized: bool,
}

impl Routing {
    /// Recomputes the gates from the probabilities and the chosen experts (after a choice changed).
    pub fn refresh_gates(&mut self, p: Prec) {
        self.gates = chosen_gates(p, &self.probs, &self.experts, self.renormalized);
    }
}

/// Token `t`'s probabilities summed over its chosen experts `ex`, in the case dtype's accumulator.
fn chosen_sum(p: Prec, probs: &Array2<f64>, ex: &[usize], t: usize) -> f64 {
    ex.iter().fold(0.0, |s, &e| p.acc().round(s + probs[[t, e]]))
}

/// The chosen experts' probabilities, divided by their sum per token when `renormalize` (the quotient rounded to
/// the case dtype).
pub fn chosen_gates(p: Prec, probs: &Array2<f64>, experts: &[Vec<usize>], renormalize: bool) -> Array2<f64> {
    let k = experts.first().map_or(0, Vec::len);
    let mut gates = Array2::zeros((probs.nrows(), k));
    for (t, ex) in experts.iter().enumerate() {
        let sum = chosen_sum(p, probs, ex, t);
        for (c, &e) in ex.iter().enumerate() {
            gates[[t, c]] = if renormalize { p.r(probs[[t, e]] / sum) } else { probs[[t, e]] };
        }
    }
    gates
}

pub fn router_fwd(p: Prec, logits: &Array2<f64>, k: usize, renormalize: bool) -> Routing {
    let probs = softmax_rows(p, logits);
    let experts = topk_rows(&probs, k);
    let gates = chosen_gates(p, &probs, &experts, renormalize);
    Routing { probs, experts, gates, renormalized: renormalize }
}

/// Gradient of the chosen experts' probabilities given their gates' gradient: the gates themselves when
/// not renormalised; renormalised, g_c = p_c / s with s their sum, so dp_c = (dg_c − Σ_j dg_j g_j) / s.
fn dchosen(p: Prec, routing: &Routing, dgates: &Array2<f64>, t: usize) -> Vec<f64> {
    let ex = &routing.experts[t];
    if !routing.renormalized {
        return (0..ex.len()).map(|c| dgates[[t, c]]).collect();
    }
    let acc = p.acc();
    let sum = chosen_sum(p, &routing.probs, ex, t);
    let gate = |e: usize| acc.round(routing.probs[[t, e]] / sum);
    let dot = ex.iter().enumerate().fold(0.0, |s, (c, &e)| acc.round(s + acc.round(dgates[[t, c]] * gate(e))));
    (0..ex.len()).map(|c| p.r(acc.round(dgates[[t, c]] - dot) / sum)).collect()
}

/// Gradient of the router logits given the gradient of the gates and, when some loss (an
/// auxiliary one) reads every probability, the gradient of the probabilities `[tokens, experts]`.
pub fn router_bwd(p: Prec, routing: &Routing, dgates: &Array2<f64>, dprobs_extra: Option<&Array2<f64>>) -> Array2<f64> {
    let mut dprobs = dprobs_extra.cloned().unwrap_or_else(|| Array2::zeros(routing.probs.raw_dim()));
    for (t, ex) in routing.experts.iter().enumerate() {
        for (&e, dg) in ex.iter().zip(dchosen(p, routing, dgates, t)) {
            dprobs[[t, e]] = if dprobs_extra.is_some() { p.r(dprobs[[t, e]] + dg) } else { dg };
        }
    }
    softmax_rows_bwd(p, &routing.probs, &dprobs)
}

/// Slots per expert: ceil(capacity_factor × tokens × k / experts).
pub fn capacity(tokens: usize, experts: usize, k: usize, capacity_factor: f64) -> usize {
    (capacity_factor * (tokens * k) as f64 / experts.max(1) as f64).ceil() as usize
}

/// Slot of each (token, choice) in its expert, or None when the expert is full (dropped).
/// Tokens are assigned in token order, then choice order.
pub fn assign_capacity(experts: &[Vec<usize>], num_experts: usize, capacity: usize) -> Vec<Vec<Option<usize>>> {
    let mut used = vec![0usize; num_experts];
    experts
        .iter()
        .map(|ex| {
            ex.iter()
                .map(|&e| {
                    if used[e] < capacity {
                        used[e] += 1;
                        Some(used[e] - 1)
                    } else {
                        None
                    }
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn topk_orders_by_value_and_breaks_ties_low() {
        let p = Array2::from_shape_vec((1, 4), vec![0.1, 0.4, 0.4, 0.1]).unwrap();
        assert_eq!(topk_rows(&p, 3), vec![vec![1, 2, 0]]);
    }

    #[test]
    fn router_backward_matches_finite_differences() {
        let x = rand_mat(3, 4, 1);
        let r = router_fwd(Prec::F64, &x, 2, false);
        let dg = rand_mat(3, 2, 2);
        let d = router_bwd(Prec::F64, &r, &dg, None);
        // The choice is locally constant, so the gates are smooth in the logits.
        let ex = r.experts.clone();
        check_grad("router", &d, &x, |xx| {
            let probs = softmax_rows(Prec::F64, xx);
            ex.iter().enumerate().map(|(t, e)| e.iter().enumerate().map(|(c, &e)| probs[[t, e]] * dg[[t, c]]).sum::<f64>()).sum()
        });
    }

    #[test]
    fn router_backward_adds_the_probabilities_own_gradient() {
        let x = rand_mat(3, 4, 3);
        let r = router_fwd(Prec::F64, &x, 2, false);
        let dg = rand_mat(3, 2, 4);
        let dp = rand_mat(3, 4, 5);
        let d = router_bwd(Prec::F64, &r, &dg, Some(&dp));
        let ex = r.experts.clone();
        check_grad("router+probs", &d, &x, |xx| {
            let probs = softmax_rows(Prec::F64, xx);
            let gates: f64 =
                ex.iter().enumerate().map(|(t, e)| e.iter().enumerate().map(|(c, &e)| probs[[t, e]] * dg[[t, c]]).sum::<f64>()).sum();
            gates + (&probs * &dp).sum()
        });
    }

    #[test]
    fn renormalized_gates_sum_to_one_and_their_backward_matches_finite_differences() {
        let x = rand_mat(3, 4, 6);
        let r = router_fwd(Prec::F64, &x, 2, true);
        for row in r.gates.rows() {
            assert!((row.sum() - 1.0).abs() < 1e-12, "{row}");
        }
        let dg = rand_mat(3, 2, 7);
        let dp = rand_mat(3, 4, 8);
        let d = router_bwd(Prec::F64, &r, &dg, Some(&dp));
        let ex = r.experts.clone();
        check_grad("renormalized router", &d, &x, |xx| {
            let probs = softmax_rows(Prec::F64, xx);
            let gates = chosen_gates(Prec::F64, &probs, &ex, true);
            (&gates * &dg).sum() + (&probs * &dp).sum()
        });
    }

    #[test]
    fn one_renormalized_choice_has_gate_one_and_no_gate_gradient() {
        let x = rand_mat(3, 4, 9);
        let r = router_fwd(Prec::F64, &x, 1, true);
        assert!(r.gates.iter().all(|&g| g == 1.0));
        let d = router_bwd(Prec::F64, &r, &rand_mat(3, 1, 10), None);
        assert!(d.iter().all(|v| v.abs() < 1e-15), "{d}");
    }

    #[test]
    fn capacity_drops_late_tokens() {
        assert_eq!(capacity(4, 2, 1, 0.5), 1);
        let slots = assign_capacity(&[vec![0], vec![0], vec![1]], 2, 1);
        assert_eq!(slots, vec![vec![Some(0)], vec![None], vec![Some(0)]]);
    }
}
