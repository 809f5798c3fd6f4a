//! The precision context every op takes: storage dtype, accumulation dtype, rounding.

use crate::DType;

/// Emulated precision of an op: outputs are rounded to `dtype`; reductions accumulate in `acc()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prec {
    pub dtype: DType,
    /// Accumulate dot products in reverse order: the same math with another round-off pattern, which
    /// the oracle uses to measure how much summation order alone moves a result.
    pub reversed_sums: bool,
    /// When nonzero, every rounding also moves its result by this many unit round-offs of `dtype`,
    /// up or down (Monte Carlo arithmetic). A correct implementation may round each op differently,
    /// or compute it a few ulps less accurately (an `rsqrt`, an `exp`); where the math cancels
    /// (a LayerNorm over two features, whose output hardly depends on its input), that difference is
    /// amplified far beyond anything perturbing the inputs shows, and such a run measures it.
    pub jitter_ulps: u8,
    /// Round stochastically instead of to nearest: up with probability (x − below) / spacing, the
    /// draw a hash of the exact value (deterministic). Unbiased, and each rounding moves by less
    /// than one spacing: the size of the differences between correct implementations that round
    /// their intermediates at other points, which `jitter_ulps` (a whole ulp every time) overstates.
    pub stochastic: bool,
    /// When above 1, matrix products and row sums split their reduction into this many contiguous
    /// chunks (as torch.chunk shards a dimension), round each chunk's sum to the storage dtype, and
    /// add the rounded partial sums: the rounding of a row-parallel product or a data-parallel
    /// gradient, whose ranks' partial sums are rounded before the all-reduce.
    pub split_sums: u8,
    /// The dtype split partial sums are rounded to (the reduce dtype of an all-reduce, which may be
    /// coarser than the compute dtype); the storage dtype when None.
    pub split_dtype: Option<DType>,
}

impl Prec {
    pub const F64: Prec =
        Prec { dtype: DType::F64, reversed_sums: false, jitter_ulps: 0, stochastic: false, split_sums: 0, split_dtype: None };

    pub fn new(dtype: DType) -> Prec {
        Prec { dtype, ..Prec::F64 }
    }

    /// Reductions split into `parts` partial sums rounded to the storage dtype (see `split_sums`).
    pub fn split(self, parts: u8) -> Prec {
        Prec { split_sums: parts, ..self }
    }

    /// Split partial sums rounded to `dtype` instead of the storage dtype (see `split_dtype`).
    pub fn split_into(self, parts: u8, dtype: DType) -> Prec {
        Prec { split_sums: parts, split_dtype: Some(dtype), ..self }
    }

    /// Rounds a split partial sum.
    #[inline]
    pub fn partial(self, x: f64) -> f64 {
        match self.split_dtype {
            Some(d) => self.rounding_to(d).round(x),
            None => self.r(x),
        }
    }

    /// Adds a split partial sum to the running total of its reduction, the total rounded to the
    /// dtype the partial sums travel in at every addition: a reduction across ranks in that dtype
    /// (gloo's and NCCL's sum of a bf16 buffer) rounds each addition, and where the partial sums
    /// cancel that rounding is many units of the result (a bf16 bias gradient of 0.039 summed from
    /// partial sums of ±2 came out 0.0039 off, where adding them in f32 is exact).
    #[inline]
    pub fn add_partial(self, total: f64, part: f64) -> f64 {
        self.partial(total + self.partial(part))
    }

    /// The running total of a reduction after its next chunk's sum `part`: `add_partial` when the
    /// reduction is split, else the one chunk's sum itself.
    #[inline]
    pub fn fold_chunk(self, total: f64, part: f64) -> f64 {
        if self.split_sums > 1 {
            self.add_partial(total, part)
        } else {
            part
        }
    }

    /// The chunks a reduction of length `n` is split into: one unless `split_sums` asks for more.
    pub fn chunks(self, n: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
        let parts = usize::from(self.split_sums.max(1));
        let c = n.div_ceil(parts).max(1);
        (0..parts).map(move |i| (i * c).min(n)..((i + 1) * c).min(n)).filter(|r| !r.is_empty())
    }

    /// The accumulation rounding (f32 for every low-precision dtype).
    #[inline]
    pub fn acc(self) -> Rounding {
        self.rounding_to(self.dtype.accum())
    }

    /// Rounds to the storage dtype.
    #[inline]
    pub fn r(self, x: f64) -> f64 {
        self.rounding_to(self.dtype).round(x)
    }

    fn rounding_to(self, dtype: DType) -> Rounding {
        Rounding { dtype, jitter_ulps: self.jitter_ulps, stochastic: self.stochastic }
    }

    /// Rounds an elementwise intermediate: f32 for low precision, f64 otherwise.
    #[inline]
    pub fn mid(self, x: f64) -> f64 {
        self.acc().round(x)
    }

    pub fn reversed(self) -> Prec {
        Prec { reversed_sums: true, ..self }
    }

    /// Every rounding moves its result by `ulps` unit round-offs, up or down (see `jitter_ulps`).
    pub fn jittered(self, ulps: u8) -> Prec {
        Prec { jitter_ulps: ulps, ..self }
    }

    /// Every rounding stochastic (see `stochastic`).
    pub fn stochastic_rounding(self) -> Prec {
        Prec { stochastic: true, ..self }
    }

    /// No op rounds anything: f64 without jitter or split sums.
    pub fn is_exact(self) -> bool {
        self.dtype == DType::F64 && self.jitter_ulps == 0 && self.split_sums <= 1
    }
}

/// How one result is rounded: to a dtype, then jittered when asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rounding {
    pub dtype: DType,
    pub jitter_ulps: u8,
    pub stochastic: bool,
}

impl Rounding {
    #[inline]
    pub fn round(self, x: f64) -> f64 {
        let r = if self.stochastic { self.round_stochastically(x) } else { self.dtype.round(x) };
        if self.jitter_ulps == 0 || r == 0.0 || !r.is_finite() {
            return r;
        }
        // The direction comes from the value itself, so a run stays deterministic (and, unlike a
        // uniform draw, never lands near zero jitter exactly where the cancellation is).
        let up = mix(r.to_bits()) & 1 == 0;
        let step = f64::from(self.jitter_ulps) * self.dtype.unit_roundoff() * r;
        self.dtype.round(if up { r + step } else { r - step })
    }
}

impl Rounding {
    /// `x` rounded to the neighbour above with probability (x − below) / (above − below).
    fn round_stochastically(self, x: f64) -> f64 {
        let nearest = self.dtype.round(x);
        if nearest == x || !nearest.is_finite() || !x.is_finite() {
            return nearest;
        }
        let other = self.dtype.next_toward(nearest, x);
        let (below, above) = if nearest < x { (nearest, other) } else { (other, nearest) };
        let p_up = (x - below) / (above - below);
        let draw = (mix(x.to_bits()) >> 11) as f64 / (1u64 << 53) as f64;
        if draw < p_up {
            above
        } else {
            below
        }
    }
}

/// SplitMix64's finaliser: a well-spread hash of a value's bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_moves_each_result_by_the_asked_ulps_both_ways_and_is_deterministic() {
        let p = Prec::F64.jittered(4);
        let u = DType::F64.unit_roundoff();
        let (mut ups, mut downs) = (0, 0);
        for i in 1..200 {
            let x = 1.0 + i as f64 / 7.0;
            let r = p.r(x);
            let rel = (r - x) / x;
            assert!((rel.abs() - 4.0 * u).abs() <= 2.0 * u, "{x}: moved by {} ulps", rel / u);
            assert_eq!(p.acc().round(x), r, "deterministic");
            if rel > 0.0 {
                ups += 1;
            } else {
                downs += 1;
            }
        }
        assert!(ups > 60 && downs > 60, "{ups} up, {downs} down");
        assert_eq!(p.r(0.0), 0.0);
        assert!(!p.is_exact() && Prec::F64.is_exact());
        assert_eq!(Prec::F64.r(1.0 / 3.0), 1.0 / 3.0, "no jitter unless asked");
    }

    #[test]
    fn stochastic_rounding_picks_a_neighbour_in_proportion_and_is_unbiased() {
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            let p = Prec::new(dtype).stochastic_rounding();
            let spacing = 2.0 * dtype.unit_roundoff();
            // x a quarter of the way from 1 to the next value: up about a quarter of the time.
            let (mut ups, n) = (0, 4000);
            let mut bias = 0.0;
            for i in 0..n {
                let base = 1.0 + (i % 16) as f64 * spacing;
                let x = base + spacing * (0.25 + 1e-4 * i as f64 / n as f64);
                let r = p.r(x);
                assert!(r == dtype.round(base) || r == dtype.round(base + spacing), "{dtype}: {x} -> {r}");
                ups += usize::from(r > x);
                bias += r - x;
                assert_eq!(p.r(x), r, "deterministic");
            }
            let share = ups as f64 / n as f64;
            assert!((share - 0.25).abs() < 0.04, "{dtype}: up {share}");
            assert!((bias / n as f64).abs() < 0.05 * spacing, "{dtype}: mean error {} spacings", bias / n as f64 / spacing);
            assert_eq!(p.r(1.0), 1.0, "representable values stay");
            assert!(p.r(-1.3) < 0.0 && (p.r(-1.3) + 1.3).abs() <= spacing * 1.3);
            assert_eq!(p.r(0.0), 0.0);
        }
    }
}
