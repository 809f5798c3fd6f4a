//! Which slice of each dimension a tensor-parallel rank owns. Splits follow `torch.chunk`: chunks of
//! ceil(n / parts), so the last chunks may be smaller or empty.

use std::ops::Range;

use crate::case::Model;

/// `torch.chunk` semantics: part `i` of `n` split into `parts`.
pub fn chunk_range(n: usize, parts: usize, i: usize) -> Range<usize> {
    let c = n.div_ceil(parts.max(1));
    let start = (i * c).min(n);
    start..(start + c).min(n)
}

/// A configuration this implementation refuses, with the reason (a clean rejection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject(pub String);

/// The slices one tensor-parallel rank holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub tp: usize,
    pub rank: usize,
    pub sequence_parallel: bool,
    /// Query heads held (global head indices).
    pub heads: Range<usize>,
    /// Key/value heads held; a single replicated head when kv_heads < tp.
    pub kv_heads: Range<usize>,
    pub kv_replicated: bool,
    /// FFN columns held (uneven allowed, possibly empty).
    pub ffn: Range<usize>,
    /// Columns of a MoE block's shared expert held (the same split, of its own width).
    pub shared_ffn: Range<usize>,
    /// Rows of the (padded) vocabulary held.
    pub vocab: Range<usize>,
    pub vocab_padded: usize,
    pub vocab_real: usize,
    /// Experts held by this rank's expert-parallel position (all experts when ep = 1).
    pub experts: Range<usize>,
}

impl Layout {
    /// The single-device layout: everything local.
    pub fn single(m: &Model) -> Layout {
        Layout::new(m, 1, 0, false, 1, 0).expect("a single device supports every model")
    }

    /// The layout of tensor-parallel rank `rank` of `tp`, expert-parallel position `ep_rank` of `ep`.
    pub fn new(m: &Model, tp: usize, rank: usize, sp: bool, ep: usize, ep_rank: usize) -> Result<Layout, Reject> {
        let (hq, hkv) = (m.heads as usize, m.kv_heads as usize);
        let has_attention = m.has_attention();
        if has_attention && hq % tp != 0 {
            return Err(Reject(format!("attention heads ({hq}) must be divisible by the tensor-parallel degree ({tp})")));
        }
        let (kv_heads, kv_replicated) = if hkv >= tp {
            if has_attention && hkv % tp != 0 {
                return Err(Reject(format!("kv_heads ({hkv}) must be divisible by the tensor-parallel degree ({tp})")));
            }
            (chunk_range(hkv, tp, rank), false)
        } else {
            if tp % hkv != 0 {
                return Err(Reject(format!("tensor-parallel degree ({tp}) must be a multiple of kv_heads ({hkv}) to replicate kv heads")));
            }
            let group = hq / hkv;
            let first_q = rank * (hq / tp);
            let kv = first_q / group;
            (kv..kv + 1, true)
        };
        let experts_total = m.moe.as_ref().map_or(0, |c| c.experts as usize);
        if ep > 1 && experts_total % ep != 0 {
            return Err(Reject(format!("experts ({experts_total}) must be divisible by the expert-parallel degree ({ep})")));
        }
        let v = m.vocab as usize;
        let vocab_padded = v.div_ceil(tp) * tp;
        let per = vocab_padded / tp;
        Ok(Layout {
            tp,
            rank,
            sequence_parallel: sp && tp > 1,
            heads: chunk_range(hq, tp, rank),
            kv_heads,
            kv_replicated,
            ffn: chunk_range(m.ffn as usize, tp, rank),
            shared_ffn: chunk_range(m.moe.as_ref().and_then(|c| c.shared_ffn).unwrap_or(0) as usize, tp, rank),
            vocab: rank * per..(rank + 1) * per,
            vocab_padded,
            vocab_real: v,
            experts: chunk_range(experts_total, ep.max(1), ep_rank),
        })
    }

    pub fn local_heads(&self) -> usize {
        self.heads.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_follow_torch_chunk() {
        let sizes: Vec<usize> = (0..4).map(|i| chunk_range(10, 4, i).len()).collect();
        assert_eq!(sizes, vec![3, 3, 3, 1]);
        let sizes: Vec<usize> = (0..4).map(|i| chunk_range(5, 4, i).len()).collect();
        assert_eq!(sizes, vec![2, 2, 1, 0]);
        assert_eq!(chunk_range(0, 3, 2), 0..0);
    }
}
