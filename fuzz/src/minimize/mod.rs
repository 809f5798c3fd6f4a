//! The minimizer: a deterministic shrinker built from small named passes run to a fixpoint
//! (Hypothesis style). A candidate is kept only when it is valid, strictly simpler than the current
//! case (no measure of [`Complexity`] grows and one shrinks) and still fails the same way: same
//! target, verdict kind, and first divergent tensor's family (layer indices generalised, `.weight` /
//! `.bias` dropped) or crash site. A framework target runs the candidates one after another in the same
//! processes, so a candidate may fail only because of what an earlier one left there: a candidate is
//! kept only when it also fails in fresh processes (`Target::rerun_fresh`).

pub mod background;
pub mod bench;
pub mod needs;
mod passes;

pub use passes::{Pass, PASSES};

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shardfuzz_harnesses::case::{Case, Distribution, Limits, OptimizerKind, Placement, RankOrder};
use shardfuzz_harnesses::inputs::Inputs;
use shardfuzz_harnesses::target::Target;

use crate::oracle::{crash_site, evaluate, generalise, hang_site, judge_fresh, tensor_family, Oracle, Prepared, Verdict, VerdictKind};

/// How a finding fails: what a smaller case must reproduce.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureKey {
    pub target: String,
    pub kind: VerdictKind,
    pub site: String,
}

impl FailureKey {
    /// The key of a finding verdict (None for a verdict that is not a finding).
    pub fn of(v: &Verdict) -> Option<FailureKey> {
        let site = match v.kind {
            // (A divergence no tensor shows, such as a result where the reference refused, by its reason.)
            // (The tensor's family, as in signatures: dropping biases may move it from `.bias` to `.weight`.)
            VerdictKind::Divergent => match v.first_divergent() {
                Some(c) => tensor_family(&c.tensor),
                None => generalise(&v.reason).chars().take(120).collect(),
            },
            VerdictKind::Crash => crash_site(v),
            VerdictKind::Hang => hang_site(v),
            _ => return None,
        };
        Some(FailureKey { target: v.target.clone(), kind: v.kind, site })
    }
}

/// Tensor elements of a case's inputs (parameters or op operands, and token ids).
pub fn case_elements(case: &Case) -> usize {
    let inputs = Inputs::generate(case);
    inputs.tensors.iter().map(|(_, t)| t.numel()).sum::<usize>() + inputs.tokens.len() + inputs.targets.len()
}

/// Every measure of how complex a case is; lower is simpler in each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Complexity(Vec<u64>);

impl Complexity {
    pub fn of(case: &Case) -> Complexity {
        let p = &case.parallel;
        let t = &case.train;
        let b = |x: bool| u64::from(x);
        let mut v = vec![
            p.world(),
            (p.dp + p.tp + p.pp + p.cp + p.ep) as u64,
            b(p.sequence_parallel) + p.zero_stage as u64 + p.microbatches as u64,
            b(p.pipeline_schedule != Default::default()) + p.virtual_stages as u64 + b(p.rank_order != RankOrder::default()),
            t.steps as u64,
            t.grad_accumulation as u64,
            case_elements(case) as u64,
            passes::dtype_rank(t.dtype) as u64,
            b(t.reduce_dtype.is_some()),
            passes::realisation_options(case),
            b(case.data.distribution != Distribution::Normal) + b(case.data.ignored.is_some()) + b(case.data.class_weights),
            b(t.clip_grad_norm.is_some())
                + b(t.loss_scale.is_some())
                + b(t.optimizer.kind != OptimizerKind::Sgd)
                + b(t.optimizer.weight_decay.0 != 0.0),
            // (Each frozen prefix, so that unfreezing one of several is a shrink too.)
            t.frozen.len() as u64,
        ];
        if let Some(m) = &case.model {
            let moe = m.moe.as_ref().map_or(0, |e| e.experts + e.top_k);
            // (Passes count on their own: with no blocks left, fewer passes is still a shrink.)
            v.push(m.block_sequence().len() as u64 + m.layer_passes as u64);
            v.push((m.hidden + m.ffn + m.vocab + m.seq + m.batch + m.heads + m.kv_heads + moe) as u64);
            v.push(b(m.bias) + b(m.tied_embeddings) + b(m.activation != Default::default()));
        }
        if let Some(op) = &case.op {
            v.push(op.shape.iter().map(|&x| x as u64).sum());
            let weight = |pl: &Placement| match pl {
                Placement::Partial(_) => 2,
                Placement::Shard(_) => 1,
                Placement::Replicate => 0,
            };
            v.push(op.placements.values().flatten().map(weight).sum());
            v.push(b(op.dim.is_some_and(|d| d != 1)));
        }
        if let Some(l) = &case.library_op {
            v.push(l.world() + l.mesh.len() as u64);
            let weight = |pl: &Placement| match pl {
                Placement::Partial(shardfuzz_harnesses::case::Reduce::Sum) => 2,
                Placement::Partial(_) => 3,
                Placement::Shard(_) => 1,
                Placement::Replicate => 0,
            };
            v.push(l.placements.iter().flatten().map(weight).sum());
            v.push(l.placements.len() as u64 + b(l.backward));
            v.push(
                l.redistribute.len() as u64
                    + l.edits.len() as u64
                    + l.views.len() as u64
                    + l.warmup.len() as u64
                    + b(!l.cotangent.is_empty())
                    + b(l.cotangent_in_dtype),
            );
            v.push(l.sources.iter().enumerate().filter(|(i, s)| l.placements.get(*i) != Some(*s)).count() as u64);
        }
        Complexity(v)
    }

    /// No measure larger and at least one smaller.
    pub fn strictly_simpler_than(&self, other: &Complexity) -> bool {
        self.0.len() == other.0.len() && self.0.iter().zip(&other.0).all(|(a, b)| a <= b) && self.0 != other.0
    }
}

/// Limits on the work a minimization may do.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub max_execs: u64,
    pub max_time: Duration,
}

impl Default for Budget {
    fn default() -> Self {
        Budget { max_execs: 500, max_time: Duration::from_secs(600) }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PassStats {
    pub name: String,
    /// Candidates run through the target.
    pub calls: u64,
    /// Candidates kept.
    pub successes: u64,
}

/// The result of a minimization.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Minimized {
    pub key: FailureKey,
    pub case: Case,
    pub verdict: Verdict,
    /// Target runs, the original's included.
    pub execs: u64,
    pub seconds: f64,
    pub elements_before: usize,
    pub elements_after: usize,
    pub passes: Vec<PassStats>,
    /// The budget ran out before the fixpoint.
    pub budget_exhausted: bool,
    /// For a divergence: what it needs (`cluster::needs` of the minimized case after [`needs::probe`] dropped
    /// what it could while the case still diverged), and the target runs that took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs: Option<Vec<String>>,
    #[serde(default)]
    pub needs_execs: u64,
    /// Candidates not kept because they failed only in processes that had run earlier candidates (each kept
    /// candidate is run again in fresh processes where the target keeps state between cases).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stale_candidates: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Shrinks `case`, which must fail on `target`, to a fixpoint of [`PASSES`] within `budget`.
pub fn minimize(target: &mut dyn Target, case: &Case, oracle: &Oracle, budget: Budget) -> anyhow::Result<Minimized> {
    let start = Instant::now();
    let verdict = evaluate(target, case, oracle);
    let key = FailureKey::of(&verdict)
        .ok_or_else(|| anyhow::anyhow!("the case does not fail on {}: {} ({})", target.name(), verdict.kind, verdict.reason))?;
    let mut m = Minimized {
        key,
        case: case.clone(),
        verdict,
        execs: 1,
        seconds: 0.0,
        elements_before: case_elements(case),
        elements_after: 0,
        passes: PASSES.iter().map(|p| PassStats { name: p.name.into(), ..Default::default() }).collect(),
        budget_exhausted: false,
        needs: None,
        needs_execs: 0,
        stale_candidates: 0,
    };
    let mut tried: HashSet<Case> = HashSet::from([case.clone()]);
    let out_of_budget = |m: &Minimized| m.execs >= budget.max_execs || start.elapsed() >= budget.max_time;
    'fixpoint: loop {
        let mut progressed = false;
        for (i, pass) in PASSES.iter().enumerate() {
            loop {
                if out_of_budget(&m) {
                    m.budget_exhausted = true;
                    break 'fixpoint;
                }
                match try_pass(target, oracle, pass, &mut m, i, &mut tried, &out_of_budget) {
                    true => progressed = true,
                    false => break,
                }
            }
        }
        if !progressed {
            break;
        }
    }
    if m.key.kind == VerdictKind::Divergent {
        let (essential, execs) = needs::probe(target, &m.case, oracle);
        (m.needs, m.needs_execs) = (Some(crate::cluster::needs(&essential)), execs);
    }
    m.seconds = start.elapsed().as_secs_f64();
    m.elements_after = case_elements(&m.case);
    if let Some(n) = &case.name {
        m.case.name = Some(format!("{n} (minimized)"));
    }
    Ok(m)
}

/// Runs `case` again in fresh processes (`Target::rerun_fresh`): None where the target keeps no state
/// between cases, else its verdict there if it fails the way `key` says.
fn fails_fresh(target: &mut dyn Target, oracle: &Oracle, case: &Case, key: &FailureKey) -> Option<Option<Verdict>> {
    let v = judge_fresh(target, &Prepared::new(case), oracle)?;
    Some((FailureKey::of(&v).as_ref() == Some(key)).then_some(v))
}

/// Runs one pass's candidates until one is kept (true) or none is.
fn try_pass(
    target: &mut dyn Target,
    oracle: &Oracle,
    pass: &Pass,
    m: &mut Minimized,
    index: usize,
    tried: &mut HashSet<Case>,
    out_of_budget: &dyn Fn(&Minimized) -> bool,
) -> bool {
    let current = Complexity::of(&m.case);
    for cand in (pass.candidates)(&m.case) {
        if out_of_budget(m) {
            return false;
        }
        if !tried.insert(cand.clone())
            || cand.validate(&Limits::default()).is_err()
            || !Complexity::of(&cand).strictly_simpler_than(&current)
        {
            continue;
        }
        m.execs += 1;
        m.passes[index].calls += 1;
        let v = evaluate(target, &cand, oracle);
        if v.kind.is_finding() && FailureKey::of(&v).as_ref() == Some(&m.key) {
            let fresh = fails_fresh(target, oracle, &cand, &m.key);
            m.execs += u64::from(fresh.is_some());
            let v = match fresh {
                None => v,
                Some(Some(fresh)) => fresh,
                Some(None) => {
                    m.stale_candidates += 1;
                    continue;
                }
            };
            m.passes[index].successes += 1;
            m.case = cand;
            m.verdict = v;
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simpler_means_nothing_grows() {
        let a = Complexity(vec![2, 3, 4]);
        assert!(Complexity(vec![1, 3, 4]).strictly_simpler_than(&a));
        assert!(!Complexity(vec![1, 3, 5]).strictly_simpler_than(&a));
        assert!(!a.strictly_simpler_than(&a));
    }
}
