//! The statistics the oracle compares per tensor, each a dimensionless error against the reference.
//!
//! The worst element (`max`) sees a bug confined to a few elements (an off-by-one shard, a padding
//! value leaking in), but its noise is the noise of the worst element. Bugs that move a whole
//! tensor coherently (a wrong divisor, a missing or doubled reduction, a dropped micro-batch) show
//! in statistics whose round-off averages out over the tensor: the normwise error (`rms`), the norm
//! (`norm`, blind to a permutation, sharp for a scale), the sum (`sum`) and the direction (`direction`,
//! blind to a scale, sharp for a permutation or a shift). Each gets its own ε from the same noise
//! ensemble (see `ensemble`).

use serde::{Deserialize, Serialize};
use shardfuzz_harnesses::tensor::Tensor;

/// One statistic of a tensor against its reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stat {
    /// max |t − r| / scale: the worst element.
    Max,
    /// ‖t − r‖₂ / ‖r‖₂: the normwise error.
    Rms,
    /// |‖t‖₂ − ‖r‖₂| / ‖r‖₂: a coherent scale.
    Norm,
    /// |Σt − Σr| / Σ|r|: a shifted mean.
    Sum,
    /// ‖t/‖t‖ − r/‖r‖‖₂: the direction, whatever the scale.
    Direction,
}

impl Stat {
    pub const ALL: [Stat; 5] = [Stat::Max, Stat::Rms, Stat::Norm, Stat::Sum, Stat::Direction];

    pub fn name(self) -> &'static str {
        match self {
            Stat::Max => "max",
            Stat::Rms => "rms",
            Stat::Norm => "norm",
            Stat::Sum => "sum",
            Stat::Direction => "direction",
        }
    }
}

impl std::fmt::Display for Stat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The value of every statistic, in [`Stat::ALL`] order.
pub type Stats = [f64; 5];

/// Every statistic of `t` against `r`. `scale` is the tensor's error scale (its largest reference
/// value, or a fraction of its family's for tensors that are round-off in exact arithmetic); it
/// also bounds the normwise denominators from below, so such tensors do not divide by zero.
///
/// Only the elements `mask` marks are compared (all when None). An element whose reference is not
/// finite is left out when `t` holds the same value there (both overflowed alike); a non-finite
/// element of `t` anywhere else makes every statistic NaN.
pub fn statistics(t: &Tensor, r: &Tensor, scale: f64, mask: Option<&[bool]>) -> Stats {
    let mut acc = Sums::default();
    let k = headroom(&[t, r], scale);
    for (i, (&x, &y)) in t.data.iter().zip(&r.data).enumerate() {
        if mask.is_some_and(|m| !m[i]) {
            continue;
        }
        if !x.is_finite() || !y.is_finite() {
            if x.to_bits() == y.to_bits() {
                continue;
            }
            return [f64::NAN; 5];
        }
        acc.add(x * k, y * k);
    }
    acc.finish(scale * k)
}

/// A power of two that brings the largest finite value of `tensors` (or `scale`) below 2^500, 1
/// when it already is: every statistic is a ratio, and values near f64's range (an op's extremal
/// samples) would otherwise overflow their squares and read as NaN. Multiplying by a power of two
/// is exact, so ordinary tensors are untouched.
fn headroom(tensors: &[&Tensor], scale: f64) -> f64 {
    let largest = tensors.iter().flat_map(|t| t.data.iter()).copied().filter(|v| v.is_finite()).fold(scale.abs(), |a, v| a.max(v.abs()));
    if largest.is_finite() && largest > 2f64.powi(500) {
        // (2^-e for e above 1023 would read as 1 / inf = 0; values then stay below 2^24.)
        2f64.powi(-(largest.log2().ceil() as i32).min(1000))
    } else {
        1.0
    }
}

/// How far the `sum` statistic moves, per unit of the `rms` statistic, when the error is a sum of
/// independent random-sign element errors: |Σδ| is then about ‖δ‖₂ (one standard deviation), and
/// the two statistics divide by different scales. `sum`'s noise is a single number per member,
/// so a handful of members can all land near zero by chance (a clean f32 campaign met a key-bias
/// gradient, round-off in exact arithmetic, whose members' sums all cancelled and whose sharded
/// run's did not); this ties it to the normwise noise, which many elements sample.
pub fn sum_per_rms(r: &Tensor, scale: f64, mask: Option<&[bool]>) -> f64 {
    let mut acc = Sums::default();
    let k = headroom(&[r], scale);
    for (i, &y) in r.data.iter().enumerate() {
        if mask.is_some_and(|m| !m[i]) || !y.is_finite() {
            continue;
        }
        acc.add(y * k, y * k);
    }
    let (norm_scale, sum_scale) = acc.scales(scale * k);
    if sum_scale > 0.0 {
        norm_scale / sum_scale
    } else {
        1.0
    }
}

/// How far the `norm` statistic moves, per unit of the `rms` statistic, under a random error:
/// ‖t‖ − ‖r‖ is to first order the error's projection on r, about ‖δ‖/√n for n elements (one
/// standard deviation). Like the sum, it is one number per member; a clean bf16 case
/// (dp2 tp2 pp2, a 16-element bias gradient with 4 % normwise noise) had every member's norm within
/// 1 % and its sharded run's 6 %.
pub fn norm_per_rms(r: &Tensor, mask: Option<&[bool]>) -> f64 {
    let n = mask.map_or(r.data.len(), |m| m.iter().filter(|&&x| x).count()).max(1);
    1.0 / (n as f64).sqrt()
}

#[derive(Default)]
struct Sums {
    max_diff: f64,
    diff_sq: f64,
    t_sq: f64,
    r_sq: f64,
    t_sum: f64,
    r_sum: f64,
    r_abs: f64,
    r_max: f64,
}

impl Sums {
    fn add(&mut self, x: f64, y: f64) {
        let d = x - y;
        self.max_diff = self.max_diff.max(d.abs());
        self.diff_sq += d * d;
        self.t_sq += x * x;
        self.r_sq += y * y;
        self.t_sum += x;
        self.r_sum += y;
        self.r_abs += y.abs();
        self.r_max = self.r_max.max(y.abs());
    }

    /// The denominators of the normwise statistics and of the sum: the reference's norm and its
    /// sum of magnitudes, never below the tensor's error scale.
    fn scales(&self, scale: f64) -> (f64, f64) {
        (self.r_sq.sqrt().max(scale), self.r_abs.max(scale))
    }

    fn finish(&self, scale: f64) -> Stats {
        let div = |a: f64, b: f64| if b > 0.0 { a / b } else { a };
        let (tn, rn) = (self.t_sq.sqrt(), self.r_sq.sqrt());
        let (norm_scale, sum_scale) = self.scales(scale);
        // ‖t̂ − r̂‖² = 2 − 2 cos, computed from the difference so it stays exact near cos = 1:
        // ‖t̂ − r̂‖² = ‖d‖²/(‖t‖‖r‖) − (‖t‖ − ‖r‖)²/(‖t‖‖r‖). A tensor that is round-off in exact
        // arithmetic (measured against its family's scale, above its own values) has no direction
        // to lose: each vector is then normalised by no less than that scale.
        let floor = if scale > self.r_max { scale } else { 0.0 };
        let (tn_s, rn_s) = (tn.max(floor), rn.max(floor));
        let direction = match (tn > 0.0, rn > 0.0) {
            (true, true) => {
                let cross = (self.diff_sq - (tn - rn).powi(2)).max(0.0) / (tn * rn);
                // Scale the unit-vector distance down by how far each vector falls short of `scale`.
                (cross * (tn / tn_s) * (rn / rn_s) + (tn / tn_s - rn / rn_s).powi(2)).sqrt()
            }
            (false, false) => 0.0,
            // A reference that is zero with its whole family (no scale at all: a loss with no
            // gradient in exact arithmetic) has no direction; the magnitude statistics, absolute
            // then, judge the target's values.
            (true, false) if scale == 0.0 => 0.0,
            (true, false) => tn / tn_s,
            (false, true) => rn / rn_s,
        };
        [
            div(self.max_diff, scale),
            div(self.diff_sq.sqrt(), norm_scale),
            div((tn - rn).abs(), norm_scale),
            div((self.t_sum - self.r_sum).abs(), sum_scale),
            direction,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f64]) -> Tensor {
        Tensor::new(vec![v.len()], v.to_vec())
    }

    #[test]
    fn values_near_the_end_of_the_range_compare_without_overflowing_their_squares() {
        // hypot's extremal OpInfo sample: finite values near 1e308 beside an inf both runs share.
        let r = t(&[1.5e308, f64::INFINITY, -1.2e308, 3.0]);
        let same = statistics(&r.clone(), &r, 1.5e308, None);
        assert_eq!(same, [0.0; 5]);
        let halved = statistics(&t(&[0.75e308, f64::INFINITY, -1.2e308, 3.0]), &r, 1.5e308, None);
        assert!(halved.iter().all(|s| s.is_finite()), "{halved:?}");
        assert!((halved[Stat::Max as usize] - 0.5).abs() < 1e-12 && halved[Stat::Norm as usize] > 0.2, "{halved:?}");
        assert!(sum_per_rms(&r, 1.5e308, None).is_finite());
    }

    #[test]
    fn a_scale_shows_in_norm_and_sum_but_not_in_direction() {
        let r = t(&[1.0, -2.0, 3.0, 0.5]);
        let s = statistics(&t(&[0.8, -1.6, 2.4, 0.4]), &r, 3.0, None);
        assert!((s[Stat::Norm as usize] - 0.2).abs() < 1e-12);
        assert!((s[Stat::Rms as usize] - 0.2).abs() < 1e-12);
        assert!((s[Stat::Sum as usize] - 0.2 * 2.5 / 6.5).abs() < 1e-12);
        assert!(s[Stat::Direction as usize] < 1e-7);
    }

    #[test]
    fn a_permutation_shows_in_direction_but_not_in_norm() {
        let r = t(&[1.0, -2.0, 3.0, 0.5]);
        let s = statistics(&t(&[-2.0, 1.0, 3.0, 0.5]), &r, 3.0, None);
        assert!(s[Stat::Norm as usize] < 1e-15);
        assert!(s[Stat::Direction as usize] > 0.5);
        assert_eq!(s[Stat::Max as usize], 1.0);
    }

    #[test]
    fn zeroed_and_non_finite() {
        let r = t(&[1.0, -2.0]);
        let s = statistics(&t(&[0.0, 0.0]), &r, 2.0, None);
        assert_eq!(s[Stat::Direction as usize], 1.0);
        assert!((s[Stat::Norm as usize] - 1.0).abs() < 1e-15);
        assert!(statistics(&t(&[f64::NAN, 0.0]), &r, 2.0, None)[0].is_nan());
        let inf = t(&[f64::INFINITY, 1.0]);
        assert_eq!(statistics(&inf, &inf, 1.0, None), [0.0; 5], "an element overflowed alike is left out");
    }

    #[test]
    fn a_scalar_has_no_direction_error_and_a_round_off_tensor_little() {
        let s = statistics(&t(&[1.0 - 1e-12]), &t(&[1.0]), 1.0, None);
        assert_eq!(s[Stat::Direction as usize], 0.0);
        let s = statistics(&t(&[0.8, -1.6]), &t(&[1.0, -2.0]), 2.0, None);
        assert!(s[Stat::Direction as usize] < 1e-15, "a scale is not a direction even below the tensor's own max");
        let s = statistics(&t(&[-1e-6, 1e-6]), &t(&[1e-6, -1e-6]), 1.0, None);
        assert!(s[Stat::Direction as usize] < 1e-5, "{}", s[4]);
    }

    #[test]
    fn a_family_that_is_zero_has_no_direction_and_is_judged_by_magnitude() {
        // A clean campaign (vocabulary of one: no language-model gradient; a load-balancing loss
        // that is constant, top_k = experts) met every reference gradient exactly zero and a
        // sharded run's round-off of 1e-17: no direction to compare.
        let zero = t(&[0.0, 0.0, 0.0]);
        let s = statistics(&t(&[4e-17, -1e-17, 0.0]), &zero, 0.0, None);
        assert_eq!(s[Stat::Direction as usize], 0.0);
        assert!(s[Stat::Rms as usize] < 1e-16);
        let s = statistics(&t(&[0.5, 0.0, 0.0]), &zero, 0.0, None);
        assert_eq!(s[Stat::Max as usize], 0.5, "a real value where the family is zero still shows, absolutely");
        let s = statistics(&zero, &t(&[0.5, 0.0, 0.0]), 0.5, None);
        assert_eq!(s[Stat::Direction as usize], 1.0, "a zeroed tensor still has lost its direction");
    }

    #[test]
    fn the_direction_of_a_tiny_error_is_not_lost_to_cancellation() {
        let r = t(&[1.0, 2.0, 3.0]);
        let s = statistics(&t(&[1.0, 2.0, 3.0 + 1e-12]), &r, 3.0, None);
        assert!(s[Stat::Direction as usize] > 1e-14 && s[Stat::Direction as usize] < 1e-12, "{}", s[4]);
    }
}
