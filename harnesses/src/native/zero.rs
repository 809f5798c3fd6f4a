//! ZeRO: the local gradients and parameters flattened into one buffer, padded to a multiple of the
//! data-parallel degree and partitioned; each rank updates its partition and the partitions are
//! all-gathered back.

use std::ops::Range;

use super::rank::Rank;
use crate::case::{Axis, ClipNorm};
use crate::model::{Bug, CResult, GroupOps, ParamSet};
use crate::reference::OptState;

pub struct Flat {
    names: Vec<String>,
    /// (start, len) of each parameter in the flat buffer.
    spans: Vec<(usize, usize)>,
    numel: usize,
    part: usize,
    dp: usize,
}

impl Flat {
    pub fn new(names: &[String], params: &ParamSet, dp: usize) -> Flat {
        let mut spans = vec![];
        let mut off = 0;
        for n in names {
            let len = params[n].numel();
            spans.push((off, len));
            off += len;
        }
        let part = off.div_ceil(dp.max(1));
        Flat { names: names.to_vec(), spans, numel: off, part, dp }
    }

    pub fn padding(&self) -> usize {
        self.part * self.dp - self.numel
    }

    fn dp_index(rank: &Rank) -> usize {
        rank.plan.coord(rank.rank, Axis::Dp)
    }

    /// This rank's partition of the padded buffer.
    fn range(&self, rank: &Rank) -> Range<usize> {
        let d = Self::dp_index(rank);
        d * self.part..(d + 1) * self.part
    }

    fn flatten(&self, set: &ParamSet, stale_padding: bool) -> Vec<f64> {
        let mut v: Vec<f64> = Vec::with_capacity(self.part * self.dp);
        for n in &self.names {
            v.extend_from_slice(&set[n].data);
        }
        for i in 0..self.padding() {
            // A reused bucket: the padding still holds whatever was there before.
            let stale = if stale_padding && self.numel > 0 { v[i % self.numel] } else { 0.0 };
            v.push(stale);
        }
        v
    }

    fn unflatten(&self, flat: &[f64], into: &mut ParamSet) {
        for (n, &(s, len)) in self.names.iter().zip(&self.spans) {
            into.get_mut(n).expect("param").data.copy_from_slice(&flat[s..s + len]);
        }
    }

    /// ZeRO-2/3: reduce-scatter of the gradients; returns this rank's partition, averaged.
    pub fn reduce_scatter(&self, rank: &Rank, grads: &ParamSet) -> CResult<Vec<f64>> {
        let flat = self.flatten(grads, stale_padding(rank));
        let counts = vec![self.part; self.dp];
        let part = rank.groups.dp.reduce_scatter(&flat, &counts)?;
        let divisor = rank.plan.dp as f64;
        Ok(part.into_iter().map(|x| rank.p.r(x / divisor)).collect())
    }

    /// ZeRO-1: the partition of already all-reduced gradients.
    pub fn partition_of(&self, rank: &Rank, grads: &ParamSet) -> Vec<f64> {
        self.flatten(grads, stale_padding(rank))[self.range(rank)].to_vec()
    }

    /// All partitions gathered back into full local gradients (for reporting).
    pub fn gather_grads(&self, rank: &Rank, part: &[f64], like: &ParamSet) -> CResult<ParamSet> {
        let pieces = rank.groups.dp.all_gather(part)?;
        let flat: Vec<f64> = pieces.concat();
        let mut out = like.clone();
        self.unflatten(&flat, &mut out);
        Ok(out)
    }

    /// The clipping norm's measure (`clip_measure`) over the partition, counting each element once across the mesh.
    pub fn owned_measure(&self, rank: &Rank, part: &[f64]) -> f64 {
        let r = self.range(rank);
        let count_padding = stale_padding(rank);
        let kind = rank.plan.case.train.clip_norm();
        let acc = rank.p.acc();
        let mut total = 0.0;
        for (i, x) in r.clone().zip(part) {
            let owned = match self.spans.iter().position(|&(s, len)| i >= s && i < s + len) {
                Some(pi) => rank.counts_in_norm(&self.names[pi], true),
                None => count_padding,
            };
            if owned {
                total = match kind {
                    ClipNorm::L2 => acc.round(total + x * x),
                    ClipNorm::L1 => acc.round(total + x.abs()),
                    ClipNorm::Inf => shardfuzz_kernels::max_abs(&[total, *x]),
                };
            }
        }
        total
    }

    /// Updates this rank's partition of the parameters and all-gathers the result.
    pub fn update(&self, rank: &Rank, params: &mut ParamSet, grad_part: &[f64], opt: &mut OptState, step: u32) -> CResult<()> {
        let mut flat = self.flatten(params, false);
        let d = Self::dp_index(rank);
        let floor = rank.plan.bug(Bug::ZeroPartitionOffset);
        let start = if floor { d * (self.numel / self.dp) } else { d * self.part };
        let end = (start + self.part).min(flat.len());
        for (pi, &(s, len)) in self.spans.iter().enumerate() {
            let lo = s.max(start);
            let hi = (s + len).min(end);
            if lo >= hi {
                continue;
            }
            let g = &grad_part[lo - start..hi - start];
            opt.update(&self.names[pi], rank.p, &mut flat[lo..hi], g, lo - s, step);
        }
        let mine = flat[start..end].to_vec();
        let pieces = rank.groups.dp.all_gather(&mine)?;
        let mut gathered = vec![0.0; self.part * self.dp];
        for (i, piece) in pieces.iter().enumerate() {
            let s = i * self.part;
            let n = piece.len().min(gathered.len() - s);
            gathered[s..s + n].copy_from_slice(&piece[..n]);
        }
        self.unflatten(&gathered, params);
        Ok(())
    }
}

/// The injected fault: padding that holds whatever the reused bucket held before.
fn stale_padding(rank: &Rank) -> bool {
    rank.plan.bug(Bug::ZeroPadInNorm)
}
