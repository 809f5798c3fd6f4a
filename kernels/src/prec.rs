//! The precision context every op takes: storage dtype, accumulation dtype, rounding.

use crate::DType;

/// Emulated precision of an op: outputs are rounded to `dtype`; reductions accumulate in `acc()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prec {
    pub dtype: DType,
    /// Accumulate dot products in reverse order: the same math with another round-off pattern, which
    /// the oracle uses to measure how much summation order alone moves a result.
    pub reversed_sums: bool,
}

impl Prec {
    pub const F64: Prec = Prec { dtype: DType::F64, reversed_sums: false };

    pub fn new(dtype: DType) -> Prec {
        Prec { dtype, reversed_sums: false }
    }

    /// The accumulation format (f32 for every low-precision dtype).
    #[inline]
    pub fn acc(self) -> DType {
        self.dtype.accum()
    }

    /// Rounds to the storage dtype.
    #[inline]
    pub fn r(self, x: f64) -> f64 {
        self.dtype.round(x)
    }

    /// Rounds an elementwise intermediate: f32 for low precision, f64 otherwise.
    #[inline]
    pub fn mid(self, x: f64) -> f64 {
        self.acc().round(x)
    }

    pub fn reversed(self) -> Prec {
        Prec { reversed_sums: true, ..self }
    }

    pub fn is_exact(self) -> bool {
        self.dtype == DType::F64
    }
}
