//! Rotary position embedding (RoPE) in the half-split layout Llama, Megatron and most frameworks use: within each
//! head of width d, element c < d/2 pairs with c + d/2 and the pair turns by position · base^(−2c/d). Row r of a
//! `[batch · seq, heads · d]` tensor holds position r mod seq. cos and sin are exact, rounded once to the storage
//! dtype (frameworks compute them in f32 or wider and cast them to the activations' dtype); each product and the sum
//! are rounded to the storage dtype, as `q * cos + rotate_half(q) * sin` does elementwise.

use ndarray::Array2;

use crate::Prec;

/// Where a rotary embedding acts: rows are `batch · seq` tokens, columns `heads` blocks of `head_dim`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RotaryShape {
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub base: f64,
}

/// (cos, sin) of each position's angle for pair `c` of a head, rounded to the storage dtype.
fn angles(p: Prec, s: &RotaryShape, pos: usize) -> Vec<(f64, f64)> {
    let half = s.head_dim / 2;
    (0..half)
        .map(|c| {
            let inv_freq = 1.0 / s.base.powf(2.0 * c as f64 / s.head_dim as f64);
            let a = pos as f64 * inv_freq;
            (p.r(a.cos()), p.r(a.sin()))
        })
        .collect()
}

/// `x` turned by each row's angles; `sign` −1 turns back (the transpose, which the backward applies).
fn turn(p: Prec, x: &Array2<f64>, s: RotaryShape, sign: f64) -> Array2<f64> {
    assert!(s.head_dim % 2 == 0, "rotary: head_dim {} is odd", s.head_dim);
    assert_eq!(x.ncols(), s.heads * s.head_dim, "rotary: {} columns for {s:?}", x.ncols());
    let half = s.head_dim / 2;
    let table: Vec<Vec<(f64, f64)>> = (0..s.seq.max(1)).map(|pos| angles(p, &s, pos)).collect();
    let mut out = Array2::zeros(x.raw_dim());
    for r in 0..x.nrows() {
        let cs = &table[r % table.len()];
        for h in 0..s.heads {
            let base = h * s.head_dim;
            for (c, &(cos, sin)) in cs.iter().enumerate() {
                let (lo, hi) = (x[[r, base + c]], x[[r, base + c + half]]);
                let sin = sign * sin;
                out[[r, base + c]] = p.r(p.r(lo * cos) - p.r(hi * sin));
                out[[r, base + c + half]] = p.r(p.r(hi * cos) + p.r(lo * sin));
            }
        }
    }
    out
}

/// `x · cos + rotate_half(x) · sin` at each row's position.
pub fn rotary_fwd(p: Prec, x: &Array2<f64>, s: RotaryShape) -> Array2<f64> {
    turn(p, x, s, 1.0)
}

/// The gradient of [`rotary_fwd`]'s input from its output's: the same turn backwards.
pub fn rotary_bwd(p: Prec, dy: &Array2<f64>, s: RotaryShape) -> Array2<f64> {
    turn(p, dy, s, -1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn shape() -> RotaryShape {
        RotaryShape { seq: 5, heads: 2, head_dim: 4, base: 10.0 }
    }

    fn input() -> Array2<f64> {
        Array2::from_shape_fn((10, 8), |(i, j)| ((i * 8 + j) as f64 * 0.37).sin())
    }

    #[test]
    fn position_zero_is_the_identity_and_later_positions_turn() {
        let x = input();
        let y = rotary_fwd(Prec::new(DType::F64), &x, shape());
        for j in 0..8 {
            assert_eq!(y[[0, j]], x[[0, j]]);
            assert_eq!(y[[5, j]], x[[5, j]], "row 5 is position 0 of the second sequence");
        }
        assert!((y[[1, 0]] - x[[1, 0]]).abs() > 1e-3);
        // A turn keeps each pair's length.
        let len = |m: &Array2<f64>, r: usize| m[[r, 1]].hypot(m[[r, 3]]);
        assert!((len(&y, 3) - len(&x, 3)).abs() < 1e-12);
    }

    #[test]
    fn the_backward_is_the_transpose() {
        let p = Prec::new(DType::F64);
        let x = input();
        let dy = Array2::from_shape_fn((10, 8), |(i, j)| ((i + 3 * j) as f64 * 0.11).cos());
        let lhs: f64 = (&rotary_fwd(p, &x, shape()) * &dy).sum();
        let rhs: f64 = (&x * &rotary_bwd(p, &dy, shape())).sum();
        assert!((lhs - rhs).abs() < 1e-12, "<Rx, dy> {lhs} != <x, R'dy> {rhs}");
    }
}
