//! Floating-point formats and their emulation on f64 storage.
//!
//! Every tensor is stored as `f64`; a value "in bf16" is an f64 that is exactly representable in bf16.
//! Rounding after each op (storage rounding) and f32 accumulation reproduce what GPU frameworks do.

use serde::{Deserialize, Serialize};

/// A compute, storage or reduction format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F64,
    F32,
    BF16,
    F16,
}

impl DType {
    pub const ALL: [DType; 4] = [DType::F64, DType::F32, DType::BF16, DType::F16];

    /// Rounds `x` to the nearest value representable in this format (ties to even).
    #[inline]
    pub fn round(self, x: f64) -> f64 {
        match self {
            DType::F64 => x,
            DType::F32 => x as f32 as f64,
            DType::BF16 => half::bf16::from_f64(x).to_f64(),
            DType::F16 => half::f16::from_f64(x).to_f64(),
        }
    }

    /// The representable value next to `r` (itself representable) in the direction of `x`.
    pub fn next_toward(self, r: f64, x: f64) -> f64 {
        // Positive values order like their bit patterns, negative ones in reverse.
        let step = |bits: u64, sign: u64| -> u64 {
            let magnitude = bits & !sign;
            let away_from_zero = (x > r) == (bits & sign == 0) || magnitude == 0;
            let sign = match (magnitude, x < r) {
                (0, true) => sign,
                (0, false) => 0,
                _ => bits & sign,
            };
            if away_from_zero {
                sign | (magnitude + 1)
            } else {
                sign | (magnitude - 1)
            }
        };
        match self {
            DType::F64 => f64::from_bits(step(r.to_bits(), 1 << 63)),
            DType::F32 => f32::from_bits(step(u64::from((r as f32).to_bits()), 1 << 31) as u32) as f64,
            DType::BF16 => half::bf16::from_bits(step(u64::from(half::bf16::from_f64(r).to_bits()), 1 << 15) as u16).to_f64(),
            DType::F16 => half::f16::from_bits(step(u64::from(half::f16::from_f64(r).to_bits()), 1 << 15) as u16).to_f64(),
        }
    }

    /// Rounds every element in place.
    pub fn round_slice(self, xs: &mut [f64]) {
        if self != DType::F64 {
            xs.iter_mut().for_each(|x| *x = self.round(*x));
        }
    }

    /// Unit round-off u = 2^-p (half the machine epsilon).
    pub fn unit_roundoff(self) -> f64 {
        match self {
            DType::F64 => 2f64.powi(-53),
            DType::F32 => 2f64.powi(-24),
            DType::BF16 => 2f64.powi(-8),
            DType::F16 => 2f64.powi(-11),
        }
    }

    /// Smallest positive (subnormal) value: the spacing of values near zero, where the rounding
    /// error is absolute, not relative.
    pub fn smallest_subnormal(self) -> f64 {
        match self {
            DType::F64 => f64::from_bits(1),
            DType::F32 => 2f64.powi(-149),
            DType::BF16 => 2f64.powi(-133),
            DType::F16 => 2f64.powi(-24),
        }
    }

    /// Largest finite value.
    pub fn max_finite(self) -> f64 {
        match self {
            DType::F64 => f64::MAX,
            DType::F32 => f32::MAX as f64,
            DType::BF16 => half::bf16::MAX.to_f64(),
            DType::F16 => half::f16::MAX.to_f64(),
        }
    }

    /// The format reductions (matmul, sums) accumulate in: f32 for every low-precision format.
    pub fn accum(self) -> DType {
        match self {
            DType::F64 => DType::F64,
            _ => DType::F32,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DType::ALL.into_iter().find(|d| d.name() == s).ok_or_else(|| format!("unknown dtype `{s}` (expected one of f64, f32, bf16, f16)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_idempotent_and_within_unit_roundoff() {
        for d in DType::ALL {
            for x in [1.0 / 3.0, -7.123456789, 1e-3, 12345.678] {
                let r = d.round(x);
                assert_eq!(d.round(r), r, "{d} not idempotent at {x}");
                assert!(((r - x) / x).abs() <= d.unit_roundoff(), "{d}: {x} -> {r}");
            }
        }
    }

    #[test]
    fn the_smallest_subnormal_is_the_spacing_near_zero() {
        for d in DType::ALL {
            let q = d.smallest_subnormal();
            assert_eq!(d.round(q), q, "{d}");
            assert_eq!(d.round(0.4 * q), 0.0, "{d}: below half the spacing rounds to zero");
            assert_eq!(d.round(2.6 * q), 3.0 * q, "{d}: multiples of it are the values near zero");
        }
    }

    #[test]
    fn the_next_value_toward_a_point_is_one_spacing_away() {
        for d in DType::ALL {
            let e = 2.0 * d.unit_roundoff();
            assert_eq!(d.next_toward(1.0, 2.0), 1.0 + e, "{d}");
            assert_eq!(d.next_toward(1.0, 0.0), 1.0 - e / 2.0, "{d}: below a power of two the spacing halves");
            assert_eq!(d.next_toward(-1.0, -2.0), -1.0 - e, "{d}");
            assert_eq!(d.next_toward(-1.0, 0.0), -1.0 + e / 2.0, "{d}");
            assert_eq!(d.next_toward(0.0, 1.0), d.smallest_subnormal(), "{d}");
            assert_eq!(d.next_toward(0.0, -1.0), -d.smallest_subnormal(), "{d}");
            assert_eq!(d.next_toward(-0.0, 1.0), d.smallest_subnormal(), "{d}");
        }
    }

    #[test]
    fn low_precision_accumulates_in_f32() {
        assert_eq!(DType::BF16.accum(), DType::F32);
        assert_eq!(DType::F64.accum(), DType::F64);
        assert_eq!("bf16".parse::<DType>().unwrap(), DType::BF16);
        assert!("f8".parse::<DType>().is_err());
    }
}
