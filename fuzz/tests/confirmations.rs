//! Findings of an in-process rank simulation are confirmed on real ranks, and a confirmation speaks
//! for later cases of the same signature only when it can: when the real ranks agreed, or when they
//! ran cleanly (the simulation's own failure). A different finding on real ranks is that case's alone.
//! In a campaign, a model case's finding is run again in fresh processes: one that an earlier case's
//! leftovers caused does not reproduce there, and the case's verdict is the fresh run's.

use std::collections::{BTreeMap, VecDeque};

use shardfuzz_fuzz::oracle::{evaluate_confirming, Confirmations, Oracle, Prepared, VerdictKind};
use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::inputs::Inputs;
use shardfuzz_harnesses::target::{Outcome, Target};

/// Replays scripted outcomes: `runs` for the simulated runs, `real` for confirmations and reruns in
/// fresh processes.
#[derive(Default)]
struct Scripted {
    runs: VecDeque<Outcome>,
    real: VecDeque<Outcome>,
    confirmations: usize,
    patience: Vec<u32>,
    fresh_reruns: usize,
}

impl Target for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }
    fn versions(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }
    fn run(&mut self, _case: &Case, _inputs: &Inputs) -> Outcome {
        self.runs.pop_front().expect("a scripted simulated run")
    }
    fn confirm(&mut self, _case: &Case, _inputs: &Inputs, patience: u32) -> Option<Outcome> {
        self.confirmations += 1;
        self.patience.push(patience);
        Some(self.real.pop_front().expect("a scripted confirmation"))
    }
    fn rerun_fresh(&mut self, _case: &Case, _inputs: &Inputs) -> Option<Outcome> {
        self.fresh_reruns += 1;
        Some(self.real.pop_front().expect("a scripted fresh rerun"))
    }
}

fn crash(message: &str) -> Outcome {
    Outcome::Crash { rank: None, message: message.to_string(), features: vec![] }
}

fn hang() -> Outcome {
    Outcome::Hang { stuck: vec![], detail: "ranks [0] did not finish within 20.0 s".into(), features: vec![] }
}

fn library_op_case() -> Prepared {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../corpus/lib-torch-sum-uneven-3.json")).unwrap();
    Prepared::new(&Case::from_json(&text).unwrap())
}

const SIM_ONLY: &str = "RuntimeError: Could not resolve the process group registered under the name 19 (at File \"/x/torch/distributed/_local_tensor/__init__.py\", line 1443, in __torch_dispatch__)";

#[test]
fn a_different_finding_on_real_ranks_is_not_reused_for_the_signature() {
    let prep = library_op_case();
    let mut target = Scripted {
        runs: VecDeque::from([crash(SIM_ONLY), crash(SIM_ONLY)]),
        real: VecDeque::from([hang(), crash("ok")]),
        ..Default::default()
    };
    let mut known = Confirmations::default();
    let first = evaluate_confirming(&mut target, &prep, &Oracle::default(), &mut known);
    assert_eq!(first.kind, VerdictKind::Hang, "the real ranks' finding is the one a user meets: {first:?}");
    // The scripted second confirmation is a crash elsewhere: confirmed again, not judged by the hang.
    let second = evaluate_confirming(&mut target, &prep, &Oracle::default(), &mut known);
    assert_eq!(target.confirmations, 2, "the second case of the signature must be confirmed itself");
    assert_eq!(second.kind, VerdictKind::Crash);
    assert!(second.notes.iter().any(|n| n.contains("simulation gave")), "{:?}", second.notes);
}

#[test]
fn an_agreeing_or_clean_confirmation_speaks_for_later_cases() {
    let prep = library_op_case();
    let boom = "IndexError: amax(): Expected reduction dim 0 to have non-zero size. (at File \"/x/torch/_ops.py\", line 916, in __call__)";
    let mut target = Scripted {
        runs: VecDeque::from([crash(boom), crash(boom), crash(SIM_ONLY), crash(SIM_ONLY)]),
        real: VecDeque::from([crash(boom), Outcome::Unsupported { reason: "clean".into() }]),
        ..Default::default()
    };
    let mut known = Confirmations::default();
    let oracle = Oracle::default();
    assert_eq!(evaluate_confirming(&mut target, &prep, &oracle, &mut known).kind, VerdictKind::Crash);
    let again = evaluate_confirming(&mut target, &prep, &oracle, &mut known);
    assert_eq!((again.kind, target.confirmations), (VerdictKind::Crash, 1), "{:?}", again.notes);
    assert_eq!(evaluate_confirming(&mut target, &prep, &oracle, &mut known).kind, VerdictKind::Unsupported);
    let later = evaluate_confirming(&mut target, &prep, &oracle, &mut known);
    assert_eq!((later.kind, target.confirmations), (VerdictKind::Unsupported, 2), "a simulation-only crash stays the simulation's");
}

#[test]
fn a_simulated_hang_gets_more_time_on_real_ranks_and_a_case_that_then_finishes_is_slow_not_a_finding() {
    let prep = library_op_case();
    let mut target = Scripted {
        runs: VecDeque::from([hang(), crash(SIM_ONLY)]),
        real: VecDeque::from([Outcome::Rejected { reason: "no sharding strategy".into(), features: vec![] }, crash("ok")]),
        ..Default::default()
    };
    let mut known = Confirmations::default();
    let v = evaluate_confirming(&mut target, &prep, &Oracle::default(), &mut known);
    assert_eq!(v.kind, VerdictKind::Rejected, "{v:?}");
    assert!(v.notes.iter().any(|n| n.starts_with("slow, not a hang")), "{:?}", v.notes);
    let _ = evaluate_confirming(&mut target, &prep, &Oracle::default(), &mut known);
    assert_eq!(target.patience, vec![shardfuzz_fuzz::oracle::HANG_PATIENCE, 1], "a hang waits longer, a crash does not");
}

fn model_case() -> Prepared {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../corpus/dp2-even-f32.json")).unwrap();
    Prepared::new(&Case::from_json(&text).unwrap())
}

const LEFTOVER: &str =
    "AttributeError: 'NoneType' object has no attribute 'group' (at File \"/x/deepspeed/utils/groups.py\", line 9, in _get_group)";

#[test]
fn a_campaign_finding_that_does_not_reproduce_in_fresh_processes_is_not_the_cases() {
    let prep = model_case();
    let mut target = Scripted {
        runs: VecDeque::from([crash(LEFTOVER), crash(LEFTOVER), crash(LEFTOVER)]),
        real: VecDeque::from([Outcome::Unsupported { reason: "fresh".into() }, crash(LEFTOVER)]),
        ..Default::default()
    };
    let mut known = Confirmations::for_campaign();
    let oracle = Oracle::default();
    let v = evaluate_confirming(&mut target, &prep, &oracle, &mut known);
    assert_eq!(v.kind, VerdictKind::Unsupported, "{v:?}");
    assert!(v.notes.iter().any(|n| n.contains("in processes that had run earlier cases it gave crash")), "{:?}", v.notes);
    // Not reproduced: the next case of the signature is rerun too; this one reproduces, and speaks for later ones.
    assert_eq!(evaluate_confirming(&mut target, &prep, &oracle, &mut known).kind, VerdictKind::Crash);
    assert_eq!(evaluate_confirming(&mut target, &prep, &oracle, &mut known).kind, VerdictKind::Crash);
    assert_eq!(target.fresh_reruns, 2);
    // Outside campaigns (`shardfuzz run`: one worker per invocation) nothing is rerun.
    let mut target = Scripted { runs: VecDeque::from([crash(LEFTOVER)]), ..Default::default() };
    let v = evaluate_confirming(&mut target, &prep, &oracle, &mut Confirmations::default());
    assert_eq!((v.kind, target.fresh_reruns), (VerdictKind::Crash, 0));
}

/// Crashes at one site on every case in its reused processes; in fresh ones only with two or more data-parallel
/// ranks (a fewer-ranks candidate fails only after what the earlier cases left behind).
struct Leaky {
    fresh_reruns: usize,
}

impl Target for Leaky {
    fn name(&self) -> &str {
        "leaky"
    }
    fn versions(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }
    fn run(&mut self, _case: &Case, _inputs: &Inputs) -> Outcome {
        crash(LEFTOVER)
    }
    fn rerun_fresh(&mut self, case: &Case, _inputs: &Inputs) -> Option<Outcome> {
        self.fresh_reruns += 1;
        Some(if case.parallel.dp >= 2 { crash(LEFTOVER) } else { Outcome::Unsupported { reason: "fresh".into() } })
    }
}

#[test]
fn the_minimizer_keeps_only_candidates_that_fail_in_fresh_processes() {
    use shardfuzz_fuzz::minimize::{minimize, Budget};

    let case = model_case().case;
    assert_eq!(case.parallel.dp, 2);
    let mut target = Leaky { fresh_reruns: 0 };
    let m = minimize(&mut target, &case, &Oracle::default(), Budget::default()).unwrap();
    assert_eq!(m.case.parallel.dp, 2, "one rank fails only in reused processes: {:?}", m.case.parallel);
    assert!(m.stale_candidates >= 1 && target.fresh_reruns > m.stale_candidates, "{} {}", m.stale_candidates, target.fresh_reruns);
}

/// A model case's hang is run again with more time where the target can (its own process: JAX's host devices). One
/// that then finishes was slow, and says nothing of a later hang at the same site, which is given more time too; one
/// that still hangs is confirmed, and speaks for later cases of its signature.
#[test]
fn a_model_cases_hang_gets_more_time_and_only_a_confirmed_one_speaks_for_its_signature() {
    let prep = model_case();
    let mut target = Scripted {
        runs: VecDeque::from([hang(), hang(), hang()]),
        real: VecDeque::from([Outcome::Unsupported { reason: "finished".into() }, hang()]),
        ..Default::default()
    };
    let mut known = Confirmations::for_campaign();
    let oracle = Oracle::default();
    let slow = evaluate_confirming(&mut target, &prep, &oracle, &mut known);
    assert_eq!(slow.kind, VerdictKind::Unsupported, "{slow:?}");
    assert!(slow.notes.iter().any(|n| n.starts_with("slow, not a hang")), "{:?}", slow.notes);
    let hung = evaluate_confirming(&mut target, &prep, &oracle, &mut known);
    assert_eq!((hung.kind, target.confirmations), (VerdictKind::Hang, 2), "an earlier slow run is no verdict on this one");
    let later = evaluate_confirming(&mut target, &prep, &oracle, &mut known);
    assert_eq!((later.kind, target.confirmations), (VerdictKind::Hang, 2), "{:?}", later.notes);
    assert!(later.notes.iter().any(|n| n.contains("still hung given 3 times the timeout")), "{:?}", later.notes);
    let patience = shardfuzz_fuzz::oracle::HANG_PATIENCE;
    assert_eq!(target.patience, vec![patience, patience]);
}
