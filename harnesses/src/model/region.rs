//! The edges of a tensor-parallel region (Megatron's `f`/`g` operators and their sequence-parallel
//! forms): all-gather / reduce-scatter along the sequence, or identity / all-reduce without it.

use std::ops::Range;

use super::{chunk_range, CResult, Ctx, Mat};

/// Token geometry of the activations a rank holds for one micro-batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geom {
    /// Batch rows in this micro-batch.
    pub batch: usize,
    pub seq: usize,
}

impl Geom {
    pub fn full_rows(&self) -> usize {
        self.batch * self.seq
    }

    /// Sequence positions held by tensor-parallel rank `r` under sequence parallelism.
    pub fn seq_range(&self, ctx: &Ctx, r: usize) -> Range<usize> {
        if ctx.sp() {
            chunk_range(self.seq, ctx.tp_size(), r)
        } else {
            0..self.seq
        }
    }

    /// Rows this rank holds in the sequence-parallel region.
    pub fn local_rows(&self, ctx: &Ctx) -> usize {
        self.batch * self.seq_range(ctx, ctx.tp_index()).len()
    }
}

fn assemble(ctx: &Ctx, g: &Geom, pieces: &[Vec<f64>], width: usize) -> Mat {
    let mut full = Mat::zeros((g.full_rows(), width));
    for (r, piece) in pieces.iter().enumerate() {
        let range = g.seq_range(ctx, r);
        let n = range.len();
        for b in 0..g.batch {
            for (j, s) in range.clone().enumerate() {
                let src = &piece[(b * n + j) * width..(b * n + j + 1) * width];
                full.row_mut(b * g.seq + s).as_slice_mut().expect("standard layout").copy_from_slice(src);
            }
        }
    }
    full
}

/// Rows of `full` reordered rank by rank (each rank's sequence chunk, batch-major), with counts.
fn split_by_rank(ctx: &Ctx, g: &Geom, full: &Mat) -> (Vec<f64>, Vec<usize>) {
    let width = full.ncols();
    let mut data = Vec::with_capacity(full.len());
    let mut counts = Vec::with_capacity(ctx.tp_size());
    for r in 0..ctx.tp_size() {
        let range = g.seq_range(ctx, r);
        for b in 0..g.batch {
            for s in range.clone() {
                data.extend(full.row(b * g.seq + s).iter());
            }
        }
        counts.push(g.batch * range.len() * width);
    }
    (data, counts)
}

fn from_vec(rows: usize, cols: usize, data: Vec<f64>) -> Mat {
    Mat::from_shape_vec((rows, cols), data).expect("collective returned the expected size")
}

/// Entering a column-parallel region: sequence-parallel all-gather, else identity.
pub fn enter_fwd(ctx: &Ctx, g: &Geom, x: Mat) -> CResult<Mat> {
    match ctx.tp {
        Some(tp) if ctx.sp() => {
            let w = x.ncols();
            let pieces = tp.all_gather(x.as_slice().expect("standard layout"))?;
            Ok(assemble(ctx, g, &pieces, w))
        }
        _ => Ok(x),
    }
}

/// Backward of [`enter_fwd`]: reduce-scatter along the sequence, or all-reduce of the partial sums.
pub fn enter_bwd(ctx: &Ctx, g: &Geom, mut dx: Mat) -> CResult<Mat> {
    match ctx.tp {
        Some(tp) if ctx.sp() => {
            let w = dx.ncols();
            let (data, counts) = split_by_rank(ctx, g, &dx);
            let local = tp.reduce_scatter(&data, &counts)?;
            Ok(from_vec(g.local_rows(ctx), w, local))
        }
        Some(tp) if tp.size() > 1 => {
            tp.all_reduce_sum(dx.as_slice_mut().expect("standard layout"))?;
            Ok(dx)
        }
        _ => Ok(dx),
    }
}

/// Leaving a row-parallel region: sum the partial results (reduce-scatter under sequence parallelism).
pub fn exit_fwd(ctx: &Ctx, g: &Geom, partial: Mat) -> CResult<Mat> {
    enter_bwd(ctx, g, partial)
}

/// Backward of [`exit_fwd`]: all-gather along the sequence, else identity.
pub fn exit_bwd(ctx: &Ctx, g: &Geom, dy: Mat) -> CResult<Mat> {
    enter_fwd(ctx, g, dy)
}
