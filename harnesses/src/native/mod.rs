//! The native target: our own sharded implementation, written as a real framework would be. One
//! thread per rank; ranks talk only through the message-passing process group in [`comm`].
//! Strategies: Megatron tensor parallelism (+ sequence parallelism), data parallelism with ZeRO
//! 1/2/3, pipeline parallelism (GPipe, 1F1B), expert parallelism, gradient accumulation, clipping by
//! the true global norm, dynamic loss scaling. Op-level cases run DTensor-style sharding rules.

pub mod comm;
mod groups;
mod op;
mod plan;
mod rank;
mod sharding;
mod zero;

pub use plan::balanced;
pub use sharding::{placement, ParamPlacement, Split, TpPlacement};

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use comm::{World, WorldOptions};
use groups::Groups;
use plan::Plan;
use rank::{run_rank, RankOut};
use sharding::{local_ranges, unshard_into};

use crate::case::{Axis, Case, ParamSpec};
use crate::inputs::Inputs;
use crate::model::{Bugs, CResult};
use crate::target::{Outcome, RunOutput, StuckRank, Target};
use crate::tensor::Tensor;

/// The native sharded target.
pub struct NativeTarget {
    pub bugs: Bugs,
    pub timeout: Duration,
}

impl NativeTarget {
    pub fn new(bugs: Bugs, timeout: Duration) -> NativeTarget {
        install_quiet_panic_hook();
        NativeTarget { bugs, timeout }
    }
}

impl Default for NativeTarget {
    fn default() -> Self {
        NativeTarget::new(Bugs::none(), Duration::from_secs(10))
    }
}

const RANK_THREAD_PREFIX: &str = "shardfuzz-rank-";

/// Panics in rank threads become `crash` outcomes; their message is taken from the payload, so the
/// default hook's print is suppressed for those threads only.
pub fn install_quiet_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let quiet = std::thread::current().name().is_some_and(|n| n.starts_with(RANK_THREAD_PREFIX));
            if !quiet {
                previous(info);
            }
        }));
    });
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".into()
    }
}

/// Runs `f(rank, comm)` on one thread per rank and collects each rank's result (or panic message).
pub(crate) fn run_ranks<T: Send>(
    world: &std::sync::Arc<World>,
    f: impl Fn(&comm::Comm) -> CResult<T> + Sync,
) -> Vec<Result<CResult<T>, String>> {
    let n = world.size();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let f = &f;
                std::thread::Builder::new()
                    .name(format!("{RANK_THREAD_PREFIX}{r}"))
                    .spawn_scoped(s, move || {
                        let comm = world.comm(r);
                        let res = catch_unwind(AssertUnwindSafe(|| f(&comm)));
                        match &res {
                            Ok(_) => comm.finish(),
                            Err(p) => world.mark_crashed(r, &panic_message(p.as_ref())),
                        }
                        res.map_err(|p| panic_message(p.as_ref()))
                    })
                    .expect("spawn rank thread")
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| Err(panic_message(p.as_ref())))).collect()
    })
}

/// Turns failed ranks into a crash or hang outcome; `None` when every rank succeeded.
pub(crate) fn failure_outcome<T>(world: &World, results: &[Result<CResult<T>, String>], features: &[String]) -> Option<Outcome> {
    if let Some((rank, msg)) = results.iter().enumerate().find_map(|(r, x)| x.as_ref().err().map(|m| (r, m))) {
        return Some(Outcome::Crash { rank: Some(rank), message: msg.clone(), features: features.to_vec() });
    }
    let failures: Vec<(usize, String)> = results
        .iter()
        .enumerate()
        .filter_map(|(r, x)| match x {
            Ok(Err(e)) => Some((r, e.0.clone())),
            _ => None,
        })
        .collect();
    if failures.is_empty() {
        return None;
    }
    let stuck: Vec<StuckRank> =
        world.stuck().into_iter().map(|s| StuckRank { rank: s.rank, collective: s.collective, group: s.group }).collect();
    if !stuck.is_empty() {
        let names: Vec<String> = stuck.iter().map(|s| format!("rank {} in {} on {}", s.rank, s.collective, s.group)).collect();
        return Some(Outcome::Hang {
            detail: format!("{} rank(s) stuck: {}", stuck.len(), names.join("; ")),
            stuck,
            features: features.to_vec(),
        });
    }
    let (rank, msg) = &failures[0];
    Some(Outcome::Crash { rank: Some(*rank), message: msg.clone(), features: features.to_vec() })
}

impl Target for NativeTarget {
    fn name(&self) -> &str {
        "native"
    }

    fn versions(&self) -> BTreeMap<String, String> {
        let mut v = BTreeMap::from([("shardfuzz-native".to_string(), env!("CARGO_PKG_VERSION").to_string())]);
        if !self.bugs.is_empty() {
            let names: Vec<&str> = crate::model::Bug::ALL.iter().filter(|b| self.bugs.has(**b)).map(|b| b.name()).collect();
            v.insert("injected".into(), names.join(","));
        }
        v
    }

    fn run(&mut self, case: &Case, inputs: &Inputs) -> Outcome {
        if case.library_op.is_some() {
            return Outcome::Unsupported { reason: "the native target has no library ops (a framework's own op vocabulary)".into() };
        }
        if case.op.is_some() {
            return op::run(self, case, inputs);
        }
        let p = &case.parallel;
        if p.sequence_parallel && p.tp > 1 && !p.sequence_parallel_mode.is_default() {
            let reason =
                format!("the native target realises sequence parallelism as split_gather only, not {}", p.sequence_parallel_mode.name());
            return Outcome::Unsupported { reason };
        }
        if p.cp > 1 {
            // Not a configuration the native target refuses but one it does not implement: `unsupported`, so a
            // native-only campaign neither keeps nor mutates such a case (a rejection is cheap, and its mutants would
            // take most of the schedule).
            return Outcome::Unsupported { reason: "the native target has no context parallelism (cp > 1)".into() };
        }
        if p.zero_offload && p.zero_stage > 0 {
            return Outcome::Unsupported { reason: "the native target has no ZeRO offloading".into() };
        }
        if !case.train.frozen.is_empty() {
            return Outcome::Unsupported { reason: "the native target trains every parameter (no train.frozen)".into() };
        }
        if p.pp > 1 && case.model.as_ref().is_some_and(|m| m.layer_passes > 1) {
            let reason = "the native target does not share blocks across pipeline stages (model.layer_passes > 1 with pp > 1)";
            return Outcome::Unsupported { reason: reason.into() };
        }
        let plan = match Plan::new(case, self.bugs) {
            // The loss is the mean over the counted targets of every rank (a sharded loader
            // all-reduces that count; here it comes from the global batch).
            Ok(p) => Plan { loss_denominator: inputs.loss_denominator(), class_weights: inputs.class_weights.clone(), ..p },
            Err(r) => {
                let class: String = r.0.chars().map(|c| if c.is_ascii_digit() { '#' } else { c }).collect();
                return Outcome::Rejected { features: vec![format!("rejected:{class}")], reason: r.0 };
            }
        };
        let world = World::new(plan.world, WorldOptions { timeout: self.timeout });
        let results = run_ranks(&world, |comm| {
            let groups = Groups::new(&plan, comm);
            run_rank(&plan, &groups, comm.rank(), inputs)
        });
        let mut features: Vec<String> =
            results.iter().filter_map(|r| r.as_ref().ok().and_then(|r| r.as_ref().ok())).flat_map(|o| o.features.iter().cloned()).collect();
        features.extend(world.features());
        features.sort();
        features.dedup();
        if let Some(o) = failure_outcome(&world, &results, &features) {
            return o;
        }
        let outs: Vec<RankOut> = results.into_iter().map(|r| r.expect("no panic").expect("no failure")).collect();
        Outcome::Completed(assemble(&plan, &outs, features))
    }
}

/// Which ranks' shards make up one full copy of a parameter: replica `copy` along data parallelism.
fn holders<'a>(plan: &Plan, outs: &'a [RankOut], name: &str, copy: usize, stage: usize) -> Vec<&'a RankOut> {
    let spec = plan.specs.iter().find(|s| s.name == name).expect("spec");
    let pl = placement(spec);
    outs.iter()
        .filter(|o| o.stage == stage)
        .filter(|o| {
            let d = plan.coord(o.rank, Axis::Dp);
            if pl.expert_sharded {
                d / plan.ep == copy
            } else {
                d == copy
            }
        })
        .filter(|o| matches!(pl.tp, TpPlacement::Shard { .. }) || plan.coord(o.rank, Axis::Tp) == 0)
        .collect()
}

fn assemble_param(plan: &Plan, holders: &[&RankOut], name: &str, pick: impl Fn(&RankOut) -> Option<&Tensor>) -> Option<Tensor> {
    let spec = plan.specs.iter().find(|s| s.name == name).expect("spec");
    let mut full = Tensor::zeros(spec.shape.clone());
    let hd = plan.model.head_dim();
    for o in holders {
        unshard_into(&mut full, pick(o)?, &local_ranges(spec, &o.layout, hd));
    }
    Some(full)
}

fn assemble(plan: &Plan, outs: &[RankOut], features: Vec<String>) -> RunOutput {
    let p = shardfuzz_kernels::Prec::new(plan.case.train.dtype);
    let mut out = RunOutput { features, ..RunOutput::default() };
    let last = plan.pp - 1;
    let loss_ranks: Vec<&RankOut> = outs.iter().filter(|o| o.stage == last && plan.coord(o.rank, Axis::Tp) == 0).collect();
    for step in 0..plan.case.train.steps as usize {
        let sum = loss_ranks.iter().map(|o| o.loss_sums[step]).fold(0.0, |s, x| p.acc().round(s + x));
        out.tensors.push((format!("loss/step{step}"), Tensor::scalar(p.r(sum / plan.loss_denominator))));
    }
    out.tensors.push(("logits".into(), assemble_logits(plan, outs)));
    for spec in &plan.specs {
        let stage = plan.stages_of(&spec.name)[0];
        let h = holders(plan, outs, &spec.name, 0, stage);
        if let Some(g) = assemble_param(plan, &h, &spec.name, |o| o.grads0.get(&spec.name)) {
            out.tensors.push((format!("grad/{}", spec.name), g));
        }
    }
    for spec in &plan.specs {
        let name = &spec.name;
        let reps = parameter_copies(plan, outs, spec);
        if let Some((_, t)) = reps.first() {
            out.tensors.push((format!("param/{name}"), t.clone()));
        }
        if reps.len() > 1 {
            out.replicas.push((format!("param/{name}"), reps));
        }
    }
    if plan.case.train.loss_scale.is_some() {
        let copies: Vec<(usize, Tensor)> = outs.iter().map(|o| (o.rank, Tensor::new(vec![o.skipped.len()], o.skipped.clone()))).collect();
        out.stats.skipped_steps = Some(outs[0].skipped.iter().map(|&s| s != 0.0).collect());
        out.replicas.push((crate::reference::SKIPPED_STEPS.into(), copies));
    }
    out.notes = notes(plan);
    out
}

/// The step-0 logits from the last stage's pieces (vocab padding dropped).
fn assemble_logits(plan: &Plan, outs: &[RankOut]) -> Tensor {
    let m = plan.model;
    let v = m.vocab as usize;
    let mut logits = Tensor::zeros(vec![m.tokens(), v]);
    for o in outs.iter().filter(|o| o.stage == plan.pp - 1) {
        for (rows, cols, mat) in &o.logits {
            for (i, r) in rows.clone().enumerate() {
                for (j, c) in cols.clone().enumerate() {
                    if c < v {
                        logits.data[r * v + c] = mat[[i, j]];
                    }
                }
            }
        }
    }
    logits
}

/// Every full copy of a parameter after the last step, with the rank that holds its first piece:
/// one per stage holding it and data-parallel replica, plus the copies of a tensor-parallel
/// replicated parameter on the other tensor-parallel ranks.
fn parameter_copies(plan: &Plan, outs: &[RankOut], spec: &ParamSpec) -> Vec<(usize, Tensor)> {
    let name = &spec.name;
    let stages = plan.stages_of(name);
    let copies = if placement(spec).expert_sharded { plan.dp / plan.ep } else { plan.dp };
    let mut reps = vec![];
    for &stage in &stages {
        for copy in 0..copies {
            let h = holders(plan, outs, name, copy, stage);
            if let (Some(t), Some(first)) = (assemble_param(plan, &h, name, |o| o.params.get(name)), h.first()) {
                reps.push((first.rank, t));
            }
        }
    }
    if matches!(placement(spec).tp, TpPlacement::Replicate) && plan.tp > 1 {
        for o in outs.iter().filter(|o| o.stage == stages[0] && plan.coord(o.rank, Axis::Dp) == 0 && plan.coord(o.rank, Axis::Tp) > 0) {
            if let Some(t) = o.params.get(name) {
                reps.push((o.rank, t.clone()));
            }
        }
    }
    reps
}

fn notes(plan: &Plan) -> Vec<String> {
    let m = plan.model;
    let mut n = vec![];
    if plan.tp > 1 && m.vocab as usize % plan.tp != 0 {
        n.push(format!("vocab padded from {} to {}", m.vocab, (m.vocab as usize).div_ceil(plan.tp) * plan.tp));
    }
    if plan.tp > 1 && m.ffn as usize % plan.tp != 0 {
        n.push(format!("ffn {} split unevenly over tp {}", m.ffn, plan.tp));
    }
    if plan.pp > 1 {
        n.push(format!("{:?} schedule, {} stages, {} micro-batches", plan.schedule, plan.pp, plan.microbatches));
    }
    n
}
