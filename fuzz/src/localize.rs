//! Localization: where a divergence first shows in execution order (forward, backward, optimizer
//! step), which layer or op it belongs to, and which ranks' pieces of it disagree.
//!
//! The gathered tensor does not say which rank held which element, so the per-rank view splits it
//! the way `torch.chunk` shards a dimension over a mesh axis (the layout every target here uses for
//! `Shard(d)`), and shows each chunk's error in units of the tensor's noise ε. Replicated tensors
//! come with each holder's copy; those are compared to the reference and to each other.

use serde::{Deserialize, Serialize};
use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::target::RunOutput;
use shardfuzz_harnesses::tensor::Tensor;

use crate::oracle::{ErrorScale, TensorCheck, Verdict};

/// Position of tensor `name` in execution order: forward (logits, the first loss), backward
/// (gradients from the output back to the embedding), later steps, the optimizer's parameters.
pub fn execution_order(case: &Case, name: &str) -> (u32, usize) {
    let params: Vec<String> = case.model.as_ref().map(|m| m.params().into_iter().map(|p| p.name).collect()).unwrap_or_default();
    let inputs: Vec<&str> = case.op.as_ref().map(|o| o.kind.inputs(&[1, 1, 1]).into_iter().map(|(n, _)| n).collect()).unwrap_or_default();
    let index_of = |p: &str| params.iter().position(|x| x == p).or_else(|| inputs.iter().position(|x| *x == p)).unwrap_or(usize::MAX);
    if name == "logits" || name == "out" {
        return (0, 0);
    }
    if let Some(step) = name.strip_prefix("loss/step").and_then(|s| s.parse::<usize>().ok()) {
        return if step == 0 { (1, 0) } else { (3, step) };
    }
    if let Some(p) = name.strip_prefix("grad/") {
        // Backward runs from the last parameter to the first.
        return (2, usize::MAX - index_of(p));
    }
    if let Some(p) = name.strip_prefix("param/") {
        return (4, index_of(p));
    }
    (5, 0)
}

/// The failing check that comes first in execution order.
pub fn first_divergent<'a>(v: &'a Verdict, case: &Case) -> Option<&'a TensorCheck> {
    v.checks.iter().filter(|c| !c.pass).min_by_key(|c| execution_order(case, &c.tensor))
}

/// The phase and the layer / op a tensor belongs to, in words.
pub fn place_of(case: &Case, name: &str) -> (String, String) {
    let phase = match execution_order(case, name).0 {
        0 | 1 => "forward",
        2 => "backward",
        3 => "a later training step",
        4 => "optimizer step",
        _ => "output",
    };
    let owner = match (name.split_once('/'), &case.op) {
        (_, Some(op)) => format!("op {:?}", op.kind).to_lowercase(),
        (Some((_, param)), None) => param.rsplit_once('.').map_or(param, |(layer, _)| layer).to_string(),
        (None, None) => "the model output".into(),
    };
    (phase.into(), owner)
}

/// One chunk of a tensor dimension and its error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkError {
    pub index: usize,
    /// Element range `[start, end)` of the dimension.
    pub start: usize,
    pub end: usize,
    /// Worst element error of the chunk in units of the tensor's ε.
    #[serde(deserialize_with = "crate::oracle::nan::f64_or_nan")]
    pub ratio: f64,
}

/// A split of one dimension over `parts` ranks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkSplit {
    pub dim: usize,
    pub parts: usize,
    pub chunks: Vec<ChunkError>,
}

/// One holder's copy of a replicated tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaError {
    pub rank: usize,
    /// Against the reference, in ε.
    #[serde(deserialize_with = "crate::oracle::nan::f64_or_nan")]
    pub vs_reference: f64,
    /// Against the first holder's copy, in ε.
    #[serde(deserialize_with = "crate::oracle::nan::f64_or_nan")]
    pub vs_first: f64,
}

/// Where a divergence shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Localization {
    pub tensor: String,
    pub phase: String,
    pub owner: String,
    #[serde(deserialize_with = "crate::oracle::nan::f64_or_nan")]
    pub ratio: f64,
    /// The split that separates good from bad chunks best (none for a scalar or an even error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<ChunkSplit>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaError>,
}

/// Localizes the first divergent tensor of `v` with the outputs that produced it.
pub fn localize(case: &Case, v: &Verdict, out: &RunOutput, reference: &RunOutput) -> Option<Localization> {
    let check = first_divergent(v, case)?;
    let (phase, owner) = place_of(case, &check.tensor);
    let mut loc = Localization { tensor: check.tensor.clone(), phase, owner, ratio: check.ratio, split: None, replicas: vec![] };
    let (Some(t), Some(r)) = (out.tensor(&check.tensor), reference.tensor(&check.tensor)) else { return Some(loc) };
    if t.shape != r.shape || check.noise.is_nan() || check.noise <= 0.0 {
        return Some(loc);
    }
    let unit = ErrorScale::new(&reference.tensors).denominator(&check.tensor, r) * check.noise;
    loc.split = best_split(case, t, r, unit);
    if let Some((_, copies)) = out.replicas.iter().find(|(n, _)| *n == check.tensor) {
        let first = &copies[0].1;
        loc.replicas = copies
            .iter()
            .filter(|(_, c)| c.shape == r.shape)
            .map(|(rank, c)| ReplicaError {
                rank: *rank,
                vs_reference: max_diff(c, r, None) / unit,
                vs_first: max_diff(c, first, None) / unit,
            })
            .collect();
    }
    Some(loc)
}

/// The degrees a dimension may be sharded over in this case.
fn degrees(case: &Case) -> Vec<usize> {
    let p = &case.parallel;
    let mut d: Vec<usize> = [p.tp, p.dp, p.cp, p.pp, p.ep, p.dp * p.tp].iter().map(|&x| x as usize).filter(|&x| x > 1).collect();
    d.sort_unstable();
    d.dedup();
    d
}

fn best_split(case: &Case, t: &Tensor, r: &Tensor, unit: f64) -> Option<ChunkSplit> {
    let mut best: Option<(f64, ChunkSplit)> = None;
    for parts in degrees(case) {
        for dim in 0..t.shape.len() {
            if t.shape[dim] < parts {
                continue;
            }
            let chunks = chunk_errors(t, r, dim, parts, unit);
            let hi = chunks.iter().map(|c| c.ratio).fold(0.0, f64::max);
            let lo = chunks.iter().map(|c| c.ratio).fold(f64::INFINITY, f64::min);
            let spread = hi / lo.max(1e-300);
            if best.as_ref().is_none_or(|(s, _)| spread > *s) {
                best = Some((spread, ChunkSplit { dim, parts, chunks }));
            }
        }
    }
    best.filter(|(spread, _)| *spread > 4.0).map(|(_, s)| s)
}

/// `torch.chunk`'s split: chunks of ⌈n / parts⌉ elements, the last ones shorter or absent.
fn chunk_errors(t: &Tensor, r: &Tensor, dim: usize, parts: usize, unit: f64) -> Vec<ChunkError> {
    let n = t.shape[dim];
    let size = n.div_ceil(parts);
    let inner: usize = t.shape[dim + 1..].iter().product();
    (0..parts)
        .filter(|i| i * size < n)
        .map(|i| {
            let (start, end) = (i * size, ((i + 1) * size).min(n));
            let keep = |flat: usize| (start..end).contains(&((flat / inner) % n));
            ChunkError { index: i, start, end, ratio: max_diff(t, r, Some(&keep)) / unit }
        })
        .collect()
}

fn max_diff(a: &Tensor, b: &Tensor, keep: Option<&dyn Fn(usize) -> bool>) -> f64 {
    let mut worst = 0.0f64;
    for (i, (x, y)) in a.data.iter().zip(&b.data).enumerate() {
        if keep.is_some_and(|k| !k(i)) {
            continue;
        }
        let d = (x - y).abs();
        worst = if d.is_nan() && x.to_bits() != y.to_bits() { f64::INFINITY } else { worst.max(d) };
    }
    worst
}

impl std::fmt::Display for Localization {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "first divergent tensor: {} ({}, {}), {:.1}× ε", self.tensor, self.phase, self.owner, self.ratio)?;
        if let Some(s) = &self.split {
            writeln!(f, "  by chunk of dim {} over {} ranks (as torch.chunk shards it):", s.dim, s.parts)?;
            for c in &s.chunks {
                writeln!(f, "    chunk {} [{}..{}): {:.1}× ε", c.index, c.start, c.end, c.ratio)?;
            }
        }
        for rep in &self.replicas {
            writeln!(
                f,
                "  replica on rank {}: {:.1}× ε from the reference, {:.1}× ε from the first copy",
                rep.rank, rep.vs_reference, rep.vs_first
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_split_like_torch_chunk_and_find_the_bad_one() {
        let r = Tensor::new(vec![5, 2], vec![1.0; 10]);
        let mut t = r.clone();
        t.data[6] = 3.0; // row 3: the second chunk of ⌈5/2⌉ = 3 rows
        let c = chunk_errors(&t, &r, 0, 2, 1.0);
        assert_eq!((c[0].start, c[0].end, c[1].start, c[1].end), (0, 3, 3, 5));
        assert_eq!((c[0].ratio, c[1].ratio), (0.0, 2.0));
    }
}
