//! Embedding lookup on a slice of the table: ids outside `[row_offset, row_offset + rows)` give a
//! zero row (vocab-parallel embedding).

use ndarray::Array2;

use crate::Prec;

pub fn embedding_fwd(p: Prec, ids: &[usize], table: &Array2<f64>, row_offset: usize) -> Array2<f64> {
    let rows = table.nrows();
    let mut out = Array2::zeros((ids.len(), table.ncols()));
    for (i, &id) in ids.iter().enumerate() {
        if id >= row_offset && id < row_offset + rows {
            out.row_mut(i).assign(&table.row(id - row_offset).mapv(|x| p.r(x)));
        }
    }
    out
}

/// Scatter-add of `dy` rows into a `[rows, h]` gradient, in token order.
pub fn embedding_bwd(p: Prec, ids: &[usize], dy: &Array2<f64>, rows: usize, row_offset: usize) -> Array2<f64> {
    assert_eq!(ids.len(), dy.nrows(), "embedding_bwd: {} ids, dy {:?}", ids.len(), dy.dim());
    let acc = p.acc();
    let mut g = Array2::zeros((rows, dy.ncols()));
    for (i, &id) in ids.iter().enumerate() {
        if id >= row_offset && id < row_offset + rows {
            let mut r = g.row_mut(id - row_offset);
            for (a, &b) in r.iter_mut().zip(dy.row(i).iter()) {
                *a = acc.round(*a + b);
            }
        }
    }
    g.mapv(|x| p.r(x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn offset_masks_rows_and_backward_matches_finite_differences() {
        let table = rand_mat(3, 2, 1);
        let ids = [0, 4, 2, 3, 2];
        let y = embedding_fwd(Prec::F64, &ids, &table, 2);
        assert_eq!(y.row(0).sum(), 0.0);
        assert_eq!(y.row(1), table.row(2));
        assert_eq!(y.row(2), table.row(0));
        let dy = rand_mat(5, 2, 2);
        let g = embedding_bwd(Prec::F64, &ids, &dy, 3, 2);
        check_grad("table", &g, &table, |t| (embedding_fwd(Prec::F64, &ids, t, 2) * &dy).sum());
    }
}
