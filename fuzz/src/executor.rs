//! The executor: runs a case through the target and the oracle (never through a forked or
//! signal-driven harness: a panic is caught and becomes a crash finding, a hang is detected by the
//! target itself), feeds the coverage map and records findings.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use libafl::executors::{Executor, ExitKind, HasObservers};
use libafl::state::HasExecutions;
use libafl::Error;
use libafl_bolts::tuples::RefIndexable;
use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::target::Target;

use crate::coverage;
use crate::findings::FindingStore;
use crate::input::CaseInput;
use crate::oracle::{config_class, evaluate_confirming, precision, Confirmations, Oracle, Prepared, Verdict, VerdictKind};

pub struct CaseExecutor<OT> {
    pub observers: OT,
    /// Every case goes to each of these targets (those that cannot express it answer `unsupported`).
    pub targets: Vec<Box<dyn Target>>,
    pub oracle: Oracle,
    pub store: FindingStore,
    /// Coverage feedback on; off (`--no-feedback`) leaves the map empty so nothing is "interesting".
    pub feedback: bool,
    /// Campaign seconds before this process started (resumed campaigns).
    pub elapsed_base: f64,
    pub start: Instant,
    /// Time spent inside the target and the oracle.
    pub target_time: Duration,
    pub verdicts: BTreeMap<VerdictKind, u64>,
    /// Cases some target could express (not unsupported everywhere).
    pub expressed: u64,
    /// Every map slot ever hit.
    pub seen: Vec<bool>,
    pub coverage: usize,
    /// Distinct line/branch events of the frameworks' own code a Python target reported, in every
    /// mode (feedback or not): the FuzzBench-style measure of what a campaign exercised.
    pub framework_lines: std::collections::HashSet<u64>,
    pub new_findings: Vec<String>,
    /// Simulated findings already confirmed on real ranks, by signature.
    pub confirmations: Confirmations,
    /// Precision notes of low-precision library-op divergences (`oracle::precision`), by signature:
    /// the first case of a signature is run again in other dtypes, later ones reuse its note.
    pub precision_notes: std::collections::HashMap<String, String>,
}

impl<OT> CaseExecutor<OT> {
    pub fn new(
        observers: OT,
        targets: Vec<Box<dyn Target>>,
        oracle: Oracle,
        store: FindingStore,
        feedback: bool,
        elapsed_base: f64,
    ) -> Self {
        CaseExecutor {
            observers,
            targets,
            oracle,
            store,
            feedback,
            elapsed_base,
            start: Instant::now(),
            target_time: Duration::ZERO,
            verdicts: BTreeMap::new(),
            expressed: 0,
            seen: vec![false; coverage::MAP_SIZE],
            coverage: 0,
            framework_lines: Default::default(),
            new_findings: vec![],
            confirmations: Confirmations::for_campaign(),
            precision_notes: Default::default(),
        }
    }

    pub fn elapsed(&self) -> f64 {
        self.elapsed_base + self.start.elapsed().as_secs_f64()
    }

    /// Runs one case through every target; returns the verdicts in target order.
    pub fn run_case(&mut self, case: &Case) -> Vec<Verdict> {
        let t0 = Instant::now();
        let prep = Prepared::new(case);
        let verdicts: Vec<Verdict> = (0..self.targets.len()).map(|i| self.run_on(i, &prep)).collect();
        coverage::set_last_exec_time(t0.elapsed());
        let expressed = verdicts.iter().any(|v| v.kind != VerdictKind::Unsupported);
        self.expressed += u64::from(expressed);
        coverage::set_last_expressed(expressed);
        if !self.feedback || !expressed {
            // Without feedback nothing is interesting; when no target could express the case,
            // nothing it covered is worth keeping it for.
            coverage::clear();
            return verdicts;
        }
        coverage::scan_hits();
        for &slot in coverage::hits().iter() {
            if !self.seen[slot as usize] {
                self.seen[slot as usize] = true;
                self.coverage += 1;
            }
        }
        verdicts
    }

    /// The precision note of divergence `v` of `case` on target `i`, computed once per signature.
    fn precision_note(&mut self, i: usize, case: &Case, v: &Verdict) -> String {
        let sig = v.signature(case);
        if let Some(note) = self.precision_notes.get(&sig) {
            return note.clone();
        }
        let target = &mut self.targets[i];
        let oracle = self.oracle;
        let note = catch_unwind(AssertUnwindSafe(|| precision::note(target.as_mut(), case, v, &oracle)))
            .unwrap_or_else(|_| "precision: the runs in other dtypes panicked; not known".to_string());
        self.precision_notes.insert(sig, note.clone());
        note
    }

    /// Runs one case through target `i`; a panic anywhere below becomes a crash verdict.
    fn run_on(&mut self, i: usize, prep: &Prepared) -> Verdict {
        let case = &prep.case;
        let t0 = Instant::now();
        let target = &mut self.targets[i];
        let oracle = self.oracle;
        let name = target.name().to_string();
        let known = &mut self.confirmations;
        let mut v = catch_unwind(AssertUnwindSafe(|| evaluate_confirming(target.as_mut(), prep, &oracle, known))).unwrap_or_else(|p| {
            let msg = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default();
            Verdict {
                target: name,
                kind: VerdictKind::Crash,
                reason: format!("panic outside the ranks: {msg}"),
                checks: vec![],
                stuck: vec![],
                crash_rank: None,
                features: vec![],
                notes: vec![],
                versions: Default::default(),
                threshold: oracle.threshold,
                members: vec![],
                localization: None,
            }
        });
        if precision::wants_note(case, &v) {
            let note = self.precision_note(i, case, &v);
            v = precision::judged(v, note);
        }
        let external = self.targets[i].take_coverage();
        self.framework_lines.extend(external.iter().copied());
        self.target_time += t0.elapsed();
        *self.verdicts.entry(v.kind).or_default() += 1;
        if self.feedback {
            let mut features = v.features.clone();
            // A refused case covers its refusal (the target's feature), not the configuration it
            // asked for: otherwise every configuration class a refusal can carry becomes "new".
            if !matches!(v.kind, VerdictKind::Rejected | VerdictKind::Unsupported) {
                features.push(format!("dtype:{}|{}|{}", case.train.dtype, config_class(case), v.kind));
            }
            features.sort();
            features.dedup();
            coverage::add_features_and_combinations(&features);
            coverage::add_external_coverage(&external);
        }
        if v.kind == VerdictKind::HarnessError {
            match self.store.record_harness_error(case, &v) {
                Ok(true) => eprintln!("harness error (our code, not the framework): {}: {}", v.target, v.reason),
                Ok(false) => {}
                Err(e) => eprintln!("warning: could not write a harness error: {e}"),
            }
        }
        if v.kind.is_finding() {
            let elapsed = self.elapsed();
            match self.store.record(case, &v, elapsed) {
                Ok(true) => self.new_findings.push(v.signature(case)),
                Ok(false) => {}
                Err(e) => eprintln!("warning: could not write a finding: {e}"),
            }
        }
        v
    }
}

impl<OT> HasObservers for CaseExecutor<OT> {
    type Observers = OT;
    fn observers(&self) -> RefIndexable<&OT, OT> {
        RefIndexable::from(&self.observers)
    }
    fn observers_mut(&mut self) -> RefIndexable<&mut OT, OT> {
        RefIndexable::from(&mut self.observers)
    }
}

impl<OT, EM, S, Z> Executor<EM, CaseInput, S, Z> for CaseExecutor<OT>
where
    S: HasExecutions,
{
    fn run_target(&mut self, _fuzzer: &mut Z, state: &mut S, _mgr: &mut EM, input: &CaseInput) -> Result<ExitKind, Error> {
        *state.executions_mut() += 1;
        self.run_case(&input.0);
        Ok(ExitKind::Ok)
    }
}
