//! `bench sensitivity`: does the oracle see the errors real bugs make?
//!
//! Each random clean case runs once through a target; the correct run's outputs are then corrupted
//! the way real bugs corrupt them, and the oracle judges each corrupted copy against the same
//! prepared reference. A corruption the oracle passes is a bug it would miss; a clean run it flags is
//! a false positive.
//!
//! The corrupted tensor is drawn (from the case seed) among the tensors the oracle compares and the
//! case dtype can represent: passing, comparable, ε below 10 %, and not round-off in exact
//! arithmetic (a tensor measured against its family's scale, such as a key bias's gradient, has no
//! value a bug could scale).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::reference;
use shardfuzz_harnesses::target::{Outcome, RunOutput, Target};
use shardfuzz_harnesses::tensor::Tensor;

use crate::oracle::{judge_prepared, ErrorScale, Oracle, Prepared, Verdict, VerdictKind};

/// A way a bug corrupts a correct run's outputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Corruption {
    /// One tensor multiplied by a factor (a wrong divisor, a missing or doubled reduction).
    Scale(f64),
    /// One tensor all zeros (a gradient never reduced into, a buffer never written).
    Zeroed,
    /// Two ranks' shards of one tensor swapped (a wrong rank order or group).
    Swapped,
    /// One shard's rows read one row late (an offset bug).
    Shifted,
    /// The last row of one tensor replaced by the padding's zeros (padding read as data).
    PaddingLeak,
    /// Every step-0 gradient without the first micro-batch's contribution.
    MicrobatchDropped,
    /// One rank's copy of a replicated tensor multiplied by 0.95 (replicas that drifted apart).
    ReplicaPerturbed,
}

/// Every corruption the benchmark applies, in table order.
pub const CORRUPTIONS: [Corruption; 12] = [
    Corruption::Scale(0.5),
    Corruption::Scale(0.8),
    Corruption::Scale(0.95),
    Corruption::Scale(1.05),
    Corruption::Scale(1.25),
    Corruption::Scale(2.0),
    Corruption::Zeroed,
    Corruption::Swapped,
    Corruption::Shifted,
    Corruption::PaddingLeak,
    Corruption::MicrobatchDropped,
    Corruption::ReplicaPerturbed,
];

impl Corruption {
    pub fn name(&self) -> String {
        match self {
            Corruption::Scale(f) => format!("x{f}"),
            Corruption::Zeroed => "zeroed".into(),
            Corruption::Swapped => "swapped".into(),
            Corruption::Shifted => "shifted".into(),
            Corruption::PaddingLeak => "padding-leak".into(),
            Corruption::MicrobatchDropped => "microbatch-dropped".into(),
            Corruption::ReplicaPerturbed => "replica-perturbed".into(),
        }
    }
}

/// What one case showed: its clean verdict and, per corruption, whether the oracle flagged it
/// (`None`: the corruption does not apply to this case, e.g. no replicated tensor).
pub struct CaseResult {
    pub clean: Verdict,
    pub detected: Vec<(Corruption, Option<bool>)>,
    /// For each corruption the oracle passed: what was corrupted and why it passed.
    pub misses: Vec<String>,
}

/// Runs `case` once through `target` and judges the clean output and every corruption of it.
/// `None` when the target did not complete the case (unsupported, rejected, crashed).
pub fn run_case(target: &mut dyn Target, case: &Case, oracle: &Oracle) -> Option<CaseResult> {
    let prep = Prepared::new(case);
    let out = match target.run(case, &prep.inputs) {
        Outcome::Completed(out) => out,
        _ => return None,
    };
    let (name, versions) = (target.name().to_string(), target.versions());
    let judge = |o: RunOutput, oracle: &Oracle| judge_prepared(&name, versions.clone(), &prep, Outcome::Completed(o), oracle);
    // The clean run judged with the whole ensemble (the verdict is the fast path's, and its ε is
    // the one a corrupted run is judged with, which picks the candidates).
    let clean = judge(out.clone(), &Oracle { fast_path: false, ..*oracle });
    if clean.kind != VerdictKind::Pass {
        return Some(CaseResult { clean, detected: vec![], misses: vec![] });
    }
    let candidates = candidates(&prep, &clean, &out);
    let mut misses = vec![];
    let detected = CORRUPTIONS
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut rng = ChaCha8Rng::seed_from_u64(case.data.seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let corrupted = corrupt(*c, &out, &candidates, &prep, &mut rng);
            (
                *c,
                corrupted.map(|(o, what)| {
                    let v = judge(o, oracle);
                    let found = v.kind == VerdictKind::Divergent;
                    if !found {
                        misses.push(miss(c, &what, &v));
                    }
                    found
                }),
            )
        })
        .collect();
    Some(CaseResult { clean, detected, misses })
}

/// One line on a corruption the oracle passed: the tensor, and its statistics against their bounds.
fn miss(c: &Corruption, what: &str, v: &Verdict) -> String {
    let wanted = if *c == Corruption::ReplicaPerturbed { format!("replicas/{what}") } else { what.to_string() };
    // A corruption of every gradient ("grad/*") lists each gradient's statistics.
    let every = wanted.strip_suffix('*');
    let stats: Vec<String> = v
        .checks
        .iter()
        .filter(|k| every.map_or(k.tensor == wanted, |prefix| k.tensor.starts_with(prefix)))
        .map(|k| {
            let stats: Vec<String> = k
                .stats
                .iter()
                .map(|s| format!("{} {:.2e}/{:.2e} [{}]", s.stat, s.error, s.bound, s.member.as_deref().unwrap_or("floor")))
                .collect();
            let note = k.note.as_deref().map(|n| format!("; note: {n}")).unwrap_or_default();
            if every.is_some() {
                format!("{}: {}{note}", k.tensor, stats.join(" "))
            } else {
                format!("{}{note}", stats.join(" "))
            }
        })
        .collect();
    format!("{} on {what}: {} (error/bound: {})", c.name(), v.kind, stats.join(" | "))
}

/// The tensors a corruption may hit: compared, passing, representable, not round-off.
fn candidates(prep: &Prepared, clean: &Verdict, out: &RunOutput) -> Vec<String> {
    // (A library-op case's reference is the framework's own, sent with the run.)
    let sent;
    let reference = match (&prep.case.library_op, prep.reference()) {
        (Some(_), _) => {
            sent = out.sent_reference();
            &sent
        }
        (None, Ok(r)) => r,
        (None, Err(_)) => return vec![],
    };
    let scale = ErrorScale::new(&reference.tensors);
    clean
        .checks
        .iter()
        .filter(|c| c.pass && c.note.is_none() && c.noise < 0.1 && !c.tensor.starts_with("replicas/"))
        .filter(|c| reference.tensor(&c.tensor).is_some_and(|r| r.max_abs() > 0.0 && scale.denominator(&c.tensor, r) <= r.max_abs()))
        .map(|c| c.tensor.clone())
        .collect()
}

fn corrupt(c: Corruption, out: &RunOutput, candidates: &[String], prep: &Prepared, rng: &mut ChaCha8Rng) -> Option<(RunOutput, String)> {
    let mut o = out.clone();
    match c {
        Corruption::MicrobatchDropped => return drop_microbatch(o, prep).map(|o| (o, "grad/*".to_string())),
        Corruption::ReplicaPerturbed => {
            let reps: Vec<usize> =
                (0..o.replicas.len()).filter(|&i| o.replicas[i].1.len() > 1 && candidates.contains(&o.replicas[i].0)).collect();
            let (name, copies) = &mut o.replicas[*pick(&reps, rng)?];
            let name = name.clone();
            let last = copies.len() - 1;
            copies[last].1.data.iter_mut().for_each(|x| *x *= 0.95);
            return Some((o, name));
        }
        _ => {}
    }
    let mut order: Vec<&String> = candidates.iter().collect();
    shuffle(&mut order, rng);
    let world = prep.case.world();
    for name in order {
        let i = o.tensors.iter().position(|(n, _)| n == name)?;
        let t = &o.tensors[i].1;
        let changed = match c {
            Corruption::Scale(f) => Some(Tensor::new(t.shape.clone(), t.data.iter().map(|x| x * f).collect())),
            Corruption::Zeroed => Some(Tensor::zeros(t.shape.clone())),
            Corruption::Swapped => along_split_dim(t, world, |i, c| {
                if i < c {
                    i + c
                } else if i < 2 * c {
                    i - c
                } else {
                    i
                }
            }),
            Corruption::Shifted => along_split_dim(t, world, |i, c| if i < c { i + 1 } else { i }),
            Corruption::PaddingLeak => along_split_dim(t, world, |i, _| i).map(|t| zero_last_row(t, world)),
            _ => None,
        };
        if let Some(new) = changed.filter(|n| n.data != t.data) {
            o.tensors[i].1 = new;
            return Some((o, name.clone()));
        }
    }
    None
}

fn drop_microbatch(mut o: RunOutput, prep: &Prepared) -> Option<RunOutput> {
    let m = prep.case.model.as_ref()?;
    let batch = m.batch as usize;
    let parts = (prep.case.parallel.microbatches as usize).max(2);
    if batch < 2 {
        return None;
    }
    let dropped = reference::rows_gradient(&prep.case, &prep.inputs, 0..batch.div_ceil(parts)).ok()?;
    // A micro-batch that contributes nothing (every target of its rows ignored) changes no
    // gradient when dropped: no bug to see, so the corruption does not apply.
    if dropped.values().all(|g| g.data.iter().all(|&x| x == 0.0)) {
        return None;
    }
    for (name, t) in o.tensors.iter_mut() {
        if let Some(g) = name.strip_prefix("grad/").and_then(|p| dropped.get(p)) {
            t.data.iter_mut().zip(&g.data).for_each(|(x, d)| *x -= d);
        }
    }
    Some(o)
}

fn pick<'a, T>(xs: &'a [T], rng: &mut ChaCha8Rng) -> Option<&'a T> {
    (!xs.is_empty()).then(|| &xs[rng.gen_range(0..xs.len())])
}

fn shuffle<T>(xs: &mut [T], rng: &mut ChaCha8Rng) {
    for i in (1..xs.len()).rev() {
        xs.swap(i, rng.gen_range(0..=i));
    }
}

/// The dimension a sharding would split (the first of size ≥ 2) and the chunk size of a split
/// into min(world, size) ≥ 2 parts, as torch.chunk makes them.
fn split_dim(t: &Tensor, world: usize) -> Option<(usize, usize)> {
    let d = t.shape.iter().position(|&n| n >= 2)?;
    let parts = world.clamp(2, t.shape[d]);
    Some((d, t.shape[d].div_ceil(parts)))
}

/// `t` with index `i` along the split dimension reading index `from(i, chunk)` (clamped in range).
fn along_split_dim(t: &Tensor, world: usize, from: impl Fn(usize, usize) -> usize) -> Option<Tensor> {
    let (d, chunk) = split_dim(t, world)?;
    let n = t.shape[d];
    let inner: usize = t.shape[d + 1..].iter().product();
    let outer: usize = t.shape[..d].iter().product();
    let mut data = t.data.clone();
    for o in 0..outer {
        for i in 0..n {
            let src = from(i, chunk).min(n - 1);
            let (a, b) = ((o * n + i) * inner, (o * n + src) * inner);
            data[a..a + inner].copy_from_slice(&t.data[b..b + inner]);
        }
    }
    Some(Tensor::new(t.shape.clone(), data))
}

fn zero_last_row(mut t: Tensor, world: usize) -> Tensor {
    if let Some((d, _)) = split_dim(&t, world) {
        let n = t.shape[d];
        let inner: usize = t.shape[d + 1..].iter().product();
        let outer: usize = t.shape[..d].iter().product();
        for o in 0..outer {
            let a = (o * n + n - 1) * inner;
            t.data[a..a + inner].iter_mut().for_each(|x| *x = 0.0);
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], v: &[f64]) -> Tensor {
        Tensor::new(shape.to_vec(), v.to_vec())
    }

    #[test]
    fn swap_and_shift_move_rows_of_the_first_split_dim() {
        let x = t(&[4, 2], &[0., 1., 2., 3., 4., 5., 6., 7.]);
        let swapped = along_split_dim(&x, 2, |i, c| {
            if i < c {
                i + c
            } else if i < 2 * c {
                i - c
            } else {
                i
            }
        })
        .unwrap();
        assert_eq!(swapped.data, vec![4., 5., 6., 7., 0., 1., 2., 3.]);
        let shifted = along_split_dim(&x, 2, |i, c| if i < c { i + 1 } else { i }).unwrap();
        assert_eq!(shifted.data, vec![2., 3., 4., 5., 4., 5., 6., 7.]);
        assert_eq!(zero_last_row(x.clone(), 2).data, vec![0., 1., 2., 3., 4., 5., 0., 0.]);
        let col = t(&[1, 3], &[1., 2., 3.]);
        assert_eq!(along_split_dim(&col, 4, |i, c| if i < c { i + 1 } else { i }).unwrap().data, vec![2., 2., 3.]);
        assert!(split_dim(&t(&[1], &[1.]), 2).is_none());
    }
}
