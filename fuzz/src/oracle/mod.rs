//! The oracle: runs a case through a target and the f64 reference, and explains the verdict.
//!
//! Every compared tensor is judged on five statistics against the f64 reference (`stats`): the
//! worst element, the normwise error, the norm, the sum and the direction. Each statistic's noise ε
//! is the largest difference any member of a noise ensemble shows (`ensemble`: single-device runs
//! whose round-off varies the way a correct sharded run's does), never below a floor of a few unit
//! round-offs; a statistic fails when it exceeds its bound, threshold × ε (plus, for the
//! statistics over the whole tensor, the second-order term (8 ε)²/2: `check::stat_bound`).
//! The worst element keeps a wide threshold (its noise is that of one element); the statistics that
//! average over the tensor get a narrow one (8), so a coherent scale of a whole tensor shows in
//! every dtype. The norm's and the sum's ε are never below what a random error of the
//! normwise ε's size moves them by (two standard deviations of a projection): each is one number per
//! member, which a handful of members sample poorly. Replicated tensors must also agree across the
//! ranks that hold them, to a quarter of their own ensemble ε (never below u/2): copies of one run
//! are one computation, not two implementations (`check::REPLICA_SHARE`).

mod attention_tie;
mod check;
mod compare;
pub mod ensemble;
pub mod nan;
pub mod precision;
mod signature;
pub mod stats;

pub use compare::{relative_error, ErrorScale};
pub use ensemble::Prepared;
pub use signature::{config_class, crash_parts, crash_site, generalise, hang_site, signature, signature_id, tensor_family};
pub use stats::Stat;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::inputs::Inputs;
use shardfuzz_harnesses::target::{Outcome, StuckRank, Target};

/// Settings of the oracle.
#[derive(Debug, Clone, Copy)]
pub struct Oracle {
    /// A tensor diverges when its worst element's error exceeds `threshold × ε`.
    pub threshold: f64,
    /// The worst element's ε is never taken below `noise_floor_ulps × u` (u: the coarser of the
    /// compute and reduce dtypes' unit round-off; 64 times that in f64).
    pub noise_floor_ulps: f64,
    /// A tensor diverges when a statistic over the whole tensor (rms, norm, sum, direction)
    /// exceeds `stat_threshold × ε` of that statistic.
    pub stat_threshold: f64,
    /// The normwise error's threshold (the `rms` statistic; `stat_threshold` unless calibrating).
    /// Its second-order term keeps `stat_threshold`.
    pub rms_threshold: f64,
    /// Those statistics' ε is never taken below `stat_floor_ulps × u`.
    pub stat_floor_ulps: f64,
    /// Judge with the first ensemble members and compute the rest only when a tensor fails (the
    /// verdict is the same either way; off, every verdict reports ε from the whole ensemble).
    pub fast_path: bool,
    /// The share of a probe member's move that counts as ε (`check::PROBE_SHARE`; 1 counts the
    /// probes whole, as before 2026-11-29, the realistic members then only adding to ε).
    pub probe_share: f64,
}

impl Default for Oracle {
    fn default() -> Self {
        Oracle {
            threshold: 100.0,
            noise_floor_ulps: 4.0,
            stat_threshold: STAT_THRESHOLD,
            rms_threshold: RMS_THRESHOLD,
            stat_floor_ulps: STAT_FLOOR_ULPS,
            fast_path: true,
            probe_share: check::PROBE_SHARE,
        }
    }
}

impl Oracle {
    /// The statistics' threshold (the normwise error's included) set to `t` when given
    /// (calibration runs).
    pub fn with_stat_threshold(self, t: Option<f64>) -> Oracle {
        Oracle { stat_threshold: t.unwrap_or(self.stat_threshold), rms_threshold: t.unwrap_or(self.rms_threshold), ..self }
    }

    /// The normwise error's threshold set to `t` when given (calibration runs).
    pub fn with_rms_threshold(self, t: Option<f64>) -> Oracle {
        Oracle { rms_threshold: t.unwrap_or(self.rms_threshold), ..self }
    }
}

/// See `Oracle::stat_threshold`; the README's oracle section has the measurement behind it.
pub const STAT_THRESHOLD: f64 = 8.0;
/// See `Oracle::rms_threshold`: the statistics' threshold. A lower one was measured and not
/// adopted: with 4, clean runs went past it (README, oracle section: a key-bias gradient at 4.2 ε,
/// two earlier calibration cases at 5.6 and 5.7 ε), though 200,000 full-ensemble clean cases met
/// none above 3.2 ε.
pub const RMS_THRESHOLD: f64 = STAT_THRESHOLD;
/// See `Oracle::stat_floor_ulps`.
pub const STAT_FLOOR_ULPS: f64 = 2.0;

/// The verdict classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    Pass,
    Rejected,
    Unsupported,
    Divergent,
    Crash,
    Hang,
    /// Our harness failed (worker code raised, a tensor was not returned): the test suite fails.
    HarnessError,
}

impl VerdictKind {
    /// Divergent, crash and hang are findings; the rest are not.
    pub fn is_finding(self) -> bool {
        matches!(self, VerdictKind::Divergent | VerdictKind::Crash | VerdictKind::Hang)
    }

    pub fn name(self) -> &'static str {
        match self {
            VerdictKind::Pass => "pass",
            VerdictKind::Rejected => "rejected",
            VerdictKind::Unsupported => "unsupported",
            VerdictKind::Divergent => "divergent",
            VerdictKind::Crash => "crash",
            VerdictKind::Hang => "hang",
            VerdictKind::HarnessError => "harness_error",
        }
    }
}

impl std::fmt::Display for VerdictKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The comparison of one tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorCheck {
    pub tensor: String,
    /// Relative error of the target against the f64 reference.
    #[serde(deserialize_with = "nan::f64_or_nan")]
    pub error: f64,
    /// Relative error of the single-device run in the case dtype (0 for f64).
    #[serde(deserialize_with = "nan::f64_or_nan")]
    pub baseline_error: f64,
    /// Change of the f64 reference when the inputs are perturbed by the dtype's unit round-off, or
    /// (larger of the two) the error of a second dtype run on inputs one ulp away.
    #[serde(deserialize_with = "nan::f64_or_nan")]
    pub perturbation_error: f64,
    /// ε = max(baseline, perturbation, floor).
    #[serde(deserialize_with = "nan::f64_or_nan")]
    pub noise: f64,
    /// threshold × ε.
    #[serde(deserialize_with = "nan::f64_or_nan")]
    pub bound: f64,
    /// error / ε.
    #[serde(deserialize_with = "nan::f64_or_nan")]
    pub ratio: f64,
    pub pass: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The statistic that failed (worst against its bound), when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<Stat>,
    /// Every statistic with its own ε and bound (`error`… above repeat the worst element's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stats: Vec<StatCheck>,
}

impl TensorCheck {
    /// The target's tensor had another shape than the reference's (nothing else was compared).
    pub fn has_wrong_shape(&self) -> bool {
        self.note.as_deref().is_some_and(|n| n.starts_with(check::WRONG_SHAPE))
    }
}

/// One statistic of one tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatCheck {
    pub stat: Stat,
    #[serde(deserialize_with = "nan::f64_or_nan")]
    pub error: f64,
    /// ε: the largest value of this statistic over the noise ensemble, or the floor.
    #[serde(deserialize_with = "nan::f64_or_nan")]
    pub noise: f64,
    #[serde(deserialize_with = "nan::f64_or_nan")]
    pub bound: f64,
    /// error / ε.
    #[serde(deserialize_with = "nan::f64_or_nan")]
    pub ratio: f64,
    pub pass: bool,
    /// The ensemble member that set ε (none: the floor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
}

/// The oracle's verdict on one case and one target, with everything needed to explain it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub target: String,
    pub kind: VerdictKind,
    /// One line: why this verdict.
    pub reason: String,
    pub checks: Vec<TensorCheck>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stuck: Vec<StuckRank>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crash_rank: Option<usize>,
    pub features: Vec<String>,
    pub notes: Vec<String>,
    pub versions: BTreeMap<String, String>,
    #[serde(deserialize_with = "nan::f64_or_nan")]
    pub threshold: f64,
    /// Noise-ensemble members this verdict was judged with (the fast path stops at the first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<String>,
    /// Where a divergence first shows: tensor, phase, layer or op, and which ranks' pieces disagree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub localization: Option<crate::localize::Localization>,
}

impl Verdict {
    /// The first tensor that failed its check, if any (checks are in execution order).
    pub fn first_divergent(&self) -> Option<&TensorCheck> {
        self.checks.iter().find(|c| !c.pass)
    }

    pub fn signature(&self, case: &Case) -> String {
        signature(self, case)
    }
}

/// Runs `case` through `target` and judges the outcome against the reference.
pub fn evaluate(target: &mut dyn Target, case: &Case, oracle: &Oracle) -> Verdict {
    evaluate_prepared(target, &Prepared::new(case), oracle)
}

/// Runs a prepared case through `target`: the reference and the noise ensemble are shared by every
/// target the same `Prepared` goes to.
pub fn evaluate_prepared(target: &mut dyn Target, prep: &Prepared, oracle: &Oracle) -> Verdict {
    evaluate_confirming(target, prep, oracle, &mut Confirmations::default())
}

/// How a worker's notes say a library-op case already ran on real ranks (nothing to confirm).
pub const REAL_RANKS_NOTE: &str = "ran on real process-group ranks";

/// Real-rank verdicts of simulated findings, by signature. A confirmation starts a process group
/// (seconds): a campaign confirms the first case of each signature and judges the later ones by
/// it. A campaign's (`for_campaign`) also reruns the first finding of each signature in processes
/// started for it (`Target::rerun_fresh`): its targets' processes run case after case, and a
/// finding that an earlier case's leftovers caused is not reproducible from the case.
#[derive(Default)]
pub struct Confirmations {
    simulated: std::collections::HashMap<String, Verdict>,
    /// Signatures whose finding reproduced in fresh processes; `None` outside campaigns.
    fresh: Option<std::collections::HashSet<String>>,
}

impl Confirmations {
    pub fn for_campaign() -> Confirmations {
        Confirmations { fresh: Some(Default::default()), ..Default::default() }
    }
}

/// `evaluate_prepared`, reusing the confirmations already made for a finding's signature.
pub fn evaluate_confirming(target: &mut dyn Target, prep: &Prepared, oracle: &Oracle, known: &mut Confirmations) -> Verdict {
    let outcome = target.run(&prep.case, &prep.inputs);
    let v = judge_prepared(target.name(), target.versions(), prep, outcome, oracle);
    if !needs_confirmation(&v, prep) {
        return match known.fresh.as_mut() {
            Some(reproduced) => reproduced_fresh(target, prep, oracle, reproduced, v),
            None => v,
        };
    }
    let sig = v.signature(&prep.case);
    if let Some(real) = known.simulated.get(&sig) {
        return judged_by_earlier(v, real);
    }
    match target.confirm(&prep.case, &prep.inputs, patience(&v)) {
        Some(outcome) => {
            let real = judge_prepared(target.name(), target.versions(), prep, outcome, oracle);
            // Only an agreement, or a clean real run (the simulation's own failure), speaks for later
            // cases of the signature: a different finding on real ranks belongs to this case alone. A
            // model case's hang that finished given more time was slow on this machine at that moment,
            // which says nothing of a later case's wait at the same site.
            let simulation_only = prep.case.library_op.is_some() && !(real.kind.is_finding() || real.kind == VerdictKind::HarnessError);
            if agrees(&v, &real) || simulation_only {
                known.simulated.insert(sig, real.clone());
            }
            confirmed(v, real)
        }
        None => v,
    }
}

/// A divergence or crash of a model case, the first of its signature, run again in fresh processes:
/// kept when it reproduces there; else the fresh run's verdict is the case's (the same case gives the
/// same verdict whatever ran before it), with what the reused processes gave in its notes.
fn reproduced_fresh(
    target: &mut dyn Target,
    prep: &Prepared,
    oracle: &Oracle,
    reproduced: &mut std::collections::HashSet<String>,
    v: Verdict,
) -> Verdict {
    if !matches!(v.kind, VerdictKind::Divergent | VerdictKind::Crash) || prep.case.library_op.is_some() {
        return v;
    }
    let sig = v.signature(&prep.case);
    if reproduced.contains(&sig) {
        return v;
    }
    let Some(fresh) = judge_fresh(target, prep, oracle) else { return v };
    if agrees(&v, &fresh) {
        reproduced.insert(sig);
        return v;
    }
    let mut fresh = fresh;
    fresh.notes.push(format!(
        "in processes that had run earlier cases it gave {} — {}; in processes started for it, not (state an earlier case left behind)",
        v.kind, v.reason
    ));
    fresh
}

/// The verdict of `prep` run again in processes started for it (`Target::rerun_fresh`); `None` where
/// the target keeps no state between cases.
pub fn judge_fresh(target: &mut dyn Target, prep: &Prepared, oracle: &Oracle) -> Option<Verdict> {
    let outcome = target.rerun_fresh(&prep.case, &prep.inputs)?;
    Some(judge_prepared(target.name(), target.versions(), prep, outcome, oracle))
}

/// Whether real ranks found what the simulation found: the same kind, and a crash at the same site.
fn agrees(simulated: &Verdict, real: &Verdict) -> bool {
    real.kind == simulated.kind && (simulated.kind != VerdictKind::Crash || crash_site(simulated) == crash_site(real))
}

/// How many times its timeout a simulated finding gets when it is confirmed: a hang three times (a
/// case merely slow, such as a campaign's `_chunk_cat` with partial sources on a 2×4 mesh, 15 s in
/// the simulation against the 10-s timeout and over 60 s on 8 real ranks sharing 2 cores, then
/// finishes and is judged as it ends; see `Target::confirm`), anything else once. Each new hang
/// signature costs a campaign this many timeouts once: six cost a 60-s campaign its whole minute.
pub const HANG_PATIENCE: u32 = 3;

fn patience(v: &Verdict) -> u32 {
    if v.kind == VerdictKind::Hang {
        HANG_PATIENCE
    } else {
        1
    }
}

/// A verdict of a simulated run (library ops), confirmed on real ranks as `evaluate` does.
pub fn confirm_finding(target: &mut dyn Target, prep: &Prepared, v: Verdict, oracle: &Oracle) -> Verdict {
    if !needs_confirmation(&v, prep) {
        return v;
    }
    match target.confirm(&prep.case, &prep.inputs, patience(&v)) {
        Some(outcome) => confirmed(v, judge_prepared(target.name(), target.versions(), prep, outcome, oracle)),
        None => v,
    }
}

/// A simulated finding whose signature an earlier case already took to real ranks.
fn judged_by_earlier(mut v: Verdict, real: &Verdict) -> Verdict {
    if real.kind.is_finding() || real.kind == VerdictKind::HarnessError {
        v.notes.push(if v.kind == VerdictKind::Hang && real.kind == VerdictKind::Hang {
            format!("an earlier case with this signature still hung given {HANG_PATIENCE} times the timeout: {}", real.reason)
        } else {
            format!("an earlier case with this signature gave on real process-group ranks: {} — {}", real.kind, real.reason)
        });
        return v;
    }
    v.notes.push(format!("the in-process simulation gave: {} — {}", v.kind, v.reason));
    v.reason = format!(
        "the in-process rank simulation (LocalTensorMode) differs from real ranks for this signature (an earlier case gave {} there)",
        real.kind
    );
    v.kind = VerdictKind::Unsupported;
    v
}

/// A finding to run again before it stands: a library-op finding that did not run on real ranks
/// already, and a hang of any case (a model case that a target ran in its own process, such as JAX's
/// host devices, whose compilation alone can outlast the timeout on a loaded machine, gets more time
/// where the target can give it: `Target::confirm`).
fn needs_confirmation(v: &Verdict, prep: &Prepared) -> bool {
    let op = prep.case.library_op.is_some();
    v.kind.is_finding() && (op || v.kind == VerdictKind::Hang) && !v.notes.iter().any(|n| n.starts_with(REAL_RANKS_NOTE))
}

/// A simulated run's finding against the same case on real ranks: kept (with the real run's
/// verdict in its notes) when the real run finds it too, else not a finding of the framework.
fn confirmed(simulated: Verdict, real: Verdict) -> Verdict {
    if agrees(&simulated, &real) {
        let mut v = simulated;
        let how = if v.kind == VerdictKind::Hang {
            format!("given {HANG_PATIENCE} times the timeout in the worker")
        } else {
            "on real process-group ranks".to_string()
        };
        v.notes.push(format!("confirmed {how}: {} — {}", real.kind, real.reason));
        return v;
    }
    if real.kind.is_finding() || real.kind == VerdictKind::HarnessError {
        // Both are findings of another kind or site (a crash on real ranks where the simulation
        // diverged, or crashed elsewhere): the real ranks' verdict is the one a user meets.
        let mut v = real;
        v.notes.push(format!("the in-process simulation gave: {} — {}", simulated.kind, simulated.reason));
        return v;
    }
    if simulated.kind == VerdictKind::Hang {
        // Real ranks, given more time, finished: the case is slow, not hung, and its verdict is theirs.
        let mut v = real;
        v.notes.push(format!(
            "slow, not a hang: the first run did not finish in time ({}); given {HANG_PATIENCE} times the timeout it finished",
            simulated.reason
        ));
        return v;
    }
    let mut v = simulated;
    v.notes.push(format!("the in-process simulation gave: {} — {}", v.kind, v.reason));
    v.reason =
        format!("the in-process rank simulation (LocalTensorMode) differs from real ranks, which give {}: {}", real.kind, real.reason);
    v.kind = VerdictKind::Unsupported;
    v
}

/// Judges an outcome a target already produced.
pub fn judge(target: &str, versions: BTreeMap<String, String>, case: &Case, inputs: &Inputs, outcome: Outcome, oracle: &Oracle) -> Verdict {
    judge_prepared(target, versions, &Prepared::with_inputs(case, inputs.clone()), outcome, oracle)
}

/// Judges an outcome against a prepared case.
pub fn judge_prepared(target: &str, versions: BTreeMap<String, String>, prep: &Prepared, outcome: Outcome, oracle: &Oracle) -> Verdict {
    let mut v = Verdict {
        target: target.to_string(),
        kind: VerdictKind::Pass,
        reason: String::new(),
        checks: vec![],
        stuck: vec![],
        crash_rank: None,
        features: outcome.features().to_vec(),
        notes: vec![],
        versions,
        threshold: oracle.threshold,
        members: vec![],
        localization: None,
    };
    match outcome {
        Outcome::Unsupported { reason } => {
            v.kind = VerdictKind::Unsupported;
            v.reason = reason;
        }
        Outcome::Rejected { reason, .. } => {
            v.kind = VerdictKind::Rejected;
            v.reason = reason;
        }
        Outcome::Crash { rank, message, .. } => {
            v.kind = VerdictKind::Crash;
            v.crash_rank = rank;
            v.reason = match rank {
                Some(r) => format!("rank {r}: {message}"),
                None => message,
            };
        }
        Outcome::Divergent { reason, .. } => {
            v.kind = VerdictKind::Divergent;
            v.reason = reason;
        }
        Outcome::Hang { stuck, detail, .. } => {
            v.kind = VerdictKind::Hang;
            v.reason = detail;
            v.stuck = stuck;
        }
        Outcome::HarnessError { message } => {
            v.kind = VerdictKind::HarnessError;
            v.reason = message;
        }
        Outcome::Completed(out) if prep.case.library_op.is_some() => judge_library_op(&mut v, prep, &out, oracle),
        Outcome::Completed(out) => match prep.reference() {
            Err(e) => {
                v.kind = VerdictKind::Unsupported;
                v.reason = format!("the f64 reference cannot run this case: {e}");
            }
            Ok(reference) => judge_completed(&mut v, prep, reference, &out, oracle),
        },
    }
    v
}

/// Judges with the first ensemble member, and with all of them only when a tensor fails.
fn judge_completed(
    v: &mut Verdict,
    prep: &Prepared,
    reference: &shardfuzz_harnesses::target::RunOutput,
    out: &shardfuzz_harnesses::target::RunOutput,
    oracle: &Oracle,
) {
    let stages: &[usize] = if oracle.fast_path { &[ensemble::FAST_MEMBERS, ensemble::MEMBERS] } else { &[ensemble::MEMBERS] };
    for &n in stages {
        let members = prep.members(n);
        let (checks, notes) = check::compare_run(prep, reference, out, &members, oracle);
        v.checks = checks;
        v.notes = notes;
        v.members = member_names(&members);
        if v.first_divergent().is_none() {
            break;
        }
    }
    if v.checks.iter().any(|c| !c.pass && ensemble::is_later_step(&c.tensor)) {
        if let Some(own) = prep.target_gradients_member(out) {
            let mut members = prep.members(ensemble::MEMBERS);
            members.push(&own);
            let (checks, notes) = check::compare_run(prep, reference, out, &members, oracle);
            (v.checks, v.notes) = (checks, notes);
            v.members = member_names(&members);
        }
    }
    // In execution order, so that the first failing check is where the divergence first shows.
    v.checks.sort_by_key(|c| crate::localize::execution_order(&prep.case, &c.tensor));
    conclude(v);
    if v.kind == VerdictKind::Divergent {
        v.localization = crate::localize::localize(&prep.case, v, out, reference);
    }
}

/// Judges a library-op case: its reference and noise members are the framework's own
/// single-device computations, sent with the run (the Rust kernels do not know the op).
fn judge_library_op(v: &mut Verdict, prep: &Prepared, out: &shardfuzz_harnesses::target::RunOutput, oracle: &Oracle) {
    if out.reference.is_empty() {
        v.kind = VerdictKind::HarnessError;
        v.reason = "the target sent no float64 reference for a library-op case".into();
        return;
    }
    let reference = out.sent_reference();
    let members: Vec<ensemble::Member> = out.noise.iter().map(|(name, t)| ensemble::Member::from_framework(name, t)).collect();
    let members: Vec<&ensemble::Member> = members.iter().collect();
    let (checks, notes) = check::compare_run(prep, &reference, out, &members, oracle);
    v.checks = checks;
    v.notes = notes;
    v.members = member_names(&members);
    v.checks.sort_by_key(|c| crate::localize::execution_order(&prep.case, &c.tensor));
    conclude(v);
    if v.kind == VerdictKind::Divergent {
        v.localization = crate::localize::localize(&prep.case, v, out, &reference);
    }
}

/// The larger of two errors, NaN if either is (`f64::max` would drop the NaN).
fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

fn conclude(v: &mut Verdict) {
    if let Some(c) = v.checks.iter().find(|c| c.note.as_deref().is_some_and(|n| n.starts_with(check::MISSING))) {
        v.kind = VerdictKind::HarnessError;
        v.reason = format!("{}: the target did not produce this tensor", c.tensor);
        return;
    }
    match v.first_divergent().cloned() {
        Some(c) => {
            v.kind = VerdictKind::Divergent;
            v.reason = match c.decided_by.and_then(|s| c.stats.iter().find(|x| x.stat == s)) {
                _ if c.has_wrong_shape() => format!("{}: {}", c.tensor, c.note.as_deref().unwrap_or_default()),
                Some(s) if s.stat != Stat::Max => format!(
                    "{}: {} error {:.3e} > bound {:.3e} ({:.1}× its noise ε = {:.3e}); worst element {:.1}× ε",
                    c.tensor, s.stat, s.error, s.bound, s.ratio, s.noise, c.ratio
                ),
                _ => format!("{}: error {:.3e} > bound {:.3e} ({:.1}× the noise ε = {:.3e})", c.tensor, c.error, c.bound, c.ratio, c.noise),
            };
        }
        None => {
            v.kind = VerdictKind::Pass;
            let comparable = |c: &&TensorCheck| c.ratio.is_finite() && !c.note.as_deref().is_some_and(|n| n.contains("not comparable"));
            let worst = v.checks.iter().filter(comparable).map(|c| c.ratio).fold(0.0, f64::max);
            let worst_stat = v
                .checks
                .iter()
                .filter(comparable)
                .flat_map(|c| &c.stats)
                .filter(|s| s.stat != Stat::Max)
                .map(|s| s.ratio)
                .fold(0.0, f64::max);
            let compared = v.checks.iter().filter(comparable).count();
            let worst = format!("worst element {worst:.2}× ε, worst statistic {worst_stat:.2}× ε");
            v.reason = if compared == v.checks.len() {
                format!("{} tensors within bounds ({worst})", v.checks.len())
            } else {
                format!("{compared} of {} tensors comparable, all within bounds ({worst}); see notes", v.checks.len())
            };
        }
    }
}

/// The members a verdict's ε came from, each probe marked (it counts at a share, `Member::probe_only`).
fn member_names(members: &[&ensemble::Member]) -> Vec<String> {
    members.iter().map(|m| if m.probe_only { format!("{} (probe)", m.name) } else { m.name.to_string() }).collect()
}
