//! How each parameter is laid out over the tensor-parallel and expert-parallel groups, expressed as
//! placements (`Shard(dim)` over a named split, or `Replicate`), and the two directions of that
//! layout: full → local shard, and local shards → full.

use std::ops::Range;

use crate::case::{ParamRole, ParamSpec};
use crate::model::Layout;
use crate::tensor::Tensor;

/// Which split of a dimension a tensor-parallel shard follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Query heads × head_dim.
    Heads,
    /// Key/value heads × head_dim (one replicated head when kv_heads < tp).
    KvHeads,
    Ffn,
    /// Columns of a MoE block's shared expert.
    SharedFfn,
    /// Rows of the padded vocabulary.
    Vocab,
}

/// Tensor-parallel placement of a parameter (DTensor's `Shard(dim)` / `Replicate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TpPlacement {
    Replicate,
    Shard { dim: usize, split: Split },
}

/// The placement of a parameter: over TP, and whether its leading (expert) dimension is sharded over EP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamPlacement {
    pub tp: TpPlacement,
    pub expert_sharded: bool,
}

/// The placement rules, one line per parameter family.
pub fn placement(spec: &ParamSpec) -> ParamPlacement {
    use Split::*;
    use TpPlacement::*;
    let n = spec.name.as_str();
    let shard = |dim, split| Shard { dim, split };
    let tp = match spec.role {
        // (query/key norms: one weight per element of every head, held with the rank's heads)
        _ if n.ends_with("attn.q_norm.weight") => shard(0, Heads),
        _ if n.ends_with("attn.k_norm.weight") => shard(0, KvHeads),
        ParamRole::Embedding => shard(0, Vocab),
        ParamRole::NormWeight | ParamRole::NormBias | ParamRole::Router => Replicate,
        _ if n.ends_with("attn.q.weight") => shard(1, Heads),
        _ if n.ends_with("attn.q.bias") => shard(0, Heads),
        _ if n.ends_with("attn.k.weight") || n.ends_with("attn.v.weight") => shard(1, KvHeads),
        _ if n.ends_with("attn.k.bias") || n.ends_with("attn.v.bias") => shard(0, KvHeads),
        _ if n.ends_with("attn.o.weight") => shard(0, Heads),
        // Row-parallel biases are added once after the reduction: replicated.
        _ if n.ends_with("o.bias") || n.ends_with("down.bias") => Replicate,
        _ if n.ends_with("mlp.down.weight") => shard(0, Ffn),
        _ if n.ends_with("moe.shared.down.weight") => shard(0, SharedFfn),
        _ if n.contains(".moe.shared.") => shard(1, SharedFfn),
        _ if n.ends_with("moe.down.weight") => shard(1, Ffn),
        _ if n.starts_with("layers.") && n.contains(".mlp.") => shard(if spec.shape.len() == 1 { 0 } else { 1 }, Ffn),
        _ if n.contains(".moe.") => shard(spec.shape.len() - 1, Ffn),
        _ => Replicate,
    };
    ParamPlacement { tp, expert_sharded: matches!(spec.role, ParamRole::ExpertWeight | ParamRole::ExpertBias) }
}

fn split_range(layout: &Layout, split: Split, head_dim: usize) -> Range<usize> {
    match split {
        Split::Heads => layout.heads.start * head_dim..layout.heads.end * head_dim,
        Split::KvHeads => layout.kv_heads.start * head_dim..layout.kv_heads.end * head_dim,
        Split::Ffn => layout.ffn.clone(),
        Split::SharedFfn => layout.shared_ffn.clone(),
        Split::Vocab => layout.vocab.clone(),
    }
}

/// The index range this rank holds along each dimension (ranges may run past the end: padding).
pub fn local_ranges(spec: &ParamSpec, layout: &Layout, head_dim: usize) -> Vec<Range<usize>> {
    let pl = placement(spec);
    let mut r: Vec<Range<usize>> = spec.shape.iter().map(|&d| 0..d).collect();
    if let TpPlacement::Shard { dim, split } = pl.tp {
        r[dim] = split_range(layout, split, head_dim);
    }
    if pl.expert_sharded {
        r[0] = layout.experts.clone();
    }
    r
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Visits every index of the block `ranges`, calling `f(local_flat, Some(full_flat) | None-if-padding)`.
fn for_each_index(full_shape: &[usize], ranges: &[Range<usize>], mut f: impl FnMut(usize, Option<usize>)) {
    let local_shape: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
    let n: usize = local_shape.iter().product();
    let fs = strides(full_shape);
    let mut idx = vec![0usize; ranges.len()];
    for local in 0..n {
        let mut full = 0;
        let mut inside = true;
        for d in 0..ranges.len() {
            let g = ranges[d].start + idx[d];
            if g >= full_shape[d] {
                inside = false;
            }
            full += g * fs[d];
        }
        f(local, inside.then_some(full));
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < local_shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// The local shard of a full tensor (padding rows are zero).
pub fn shard(full: &Tensor, ranges: &[Range<usize>]) -> Tensor {
    let shape: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
    let mut out = Tensor::zeros(shape);
    for_each_index(&full.shape, ranges, |l, g| {
        if let Some(g) = g {
            out.data[l] = full.data[g];
        }
    });
    out
}

/// Writes a local shard back into the full tensor (padding is dropped).
pub fn unshard_into(full: &mut Tensor, local: &Tensor, ranges: &[Range<usize>]) {
    for_each_index(&full.shape.clone(), ranges, |l, g| {
        if let Some(g) = g {
            full.data[g] = local.data[l];
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_and_unshard_round_trip_with_padding() {
        let full = Tensor::new(vec![5, 2], (0..10).map(|x| x as f64).collect());
        let mut back = Tensor::zeros(vec![5, 2]);
        for i in 0..2 {
            let r = vec![i * 3..i * 3 + 3, 0..2];
            let s = shard(&full, &r);
            assert_eq!(s.shape, vec![3, 2]);
            unshard_into(&mut back, &s, &r);
        }
        assert_eq!(back, full);
        let last = shard(&full, &[3..6, 0..2]);
        assert_eq!(last.data, vec![6.0, 7.0, 8.0, 9.0, 0.0, 0.0]);
    }
}
