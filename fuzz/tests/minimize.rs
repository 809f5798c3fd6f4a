//! The minimizer on every injected native bug's trigger case: the issue's goals (≤ 200 executions,
//! ≤ 10 s, ≤ 1/4 of the tensor elements) and the same failure after minimization.

use std::time::Duration;

use shardfuzz_fuzz::cluster::needs as needs_of;
use shardfuzz_fuzz::minimize::bench::bench;
use shardfuzz_fuzz::minimize::needs::MAX_PROBE_EXECS;
use shardfuzz_fuzz::minimize::{Budget, FailureKey};
use shardfuzz_fuzz::oracle::{evaluate, Oracle, VerdictKind};
use shardfuzz_harnesses::case::MIN_HIDDEN;
use shardfuzz_harnesses::target::registry::{create, TargetOptions};

#[test]
fn every_trigger_case_shrinks_to_a_quarter_within_200_executions_and_fails_the_same_way() {
    let rows = bench(5, Budget { max_execs: 200, max_time: Duration::from_secs(10) }).unwrap();
    assert!(rows.len() >= 10);
    let mut bias_seen = false;
    for r in rows {
        let m = r.result.unwrap_or_else(|| panic!("{}: {}", r.bug, r.note));
        assert!(!m.budget_exhausted, "{}: no fixpoint within 200 executions / 10 s ({} executions)", r.bug, m.execs);
        assert!(m.elements_after * 4 <= m.elements_before, "{}: {} → {} elements", r.bug, m.elements_before, m.elements_after);
        let hidden = m.case.model.as_ref().map_or(MIN_HIDDEN, |mm| mm.hidden);
        assert!(hidden >= MIN_HIDDEN, "{}: minimized into degenerate norms (hidden {hidden})", r.bug);
        // Replaying the minimized case on the buggy target fails the same way; the clean one passes it.
        let mut buggy = create("native", &TargetOptions { inject: vec![r.bug.clone()], timeout_ms: 10_000 }).unwrap();
        let v = evaluate(buggy.as_mut(), &m.case, &Oracle::default());
        assert_eq!(FailureKey::of(&v).as_ref(), Some(&m.key), "{}", r.bug);
        let mut clean = create("native", &TargetOptions::default()).unwrap();
        let v = evaluate(clean.as_mut(), &m.case, &Oracle::default());
        assert!(!v.kind.is_finding(), "{}: the minimized case fails on the clean target too: {}", r.bug, v.reason);
        // A divergence's needs: some of what the minimized case has, never more.
        if m.key.kind == VerdictKind::Divergent {
            let needs = m.needs.as_ref().unwrap_or_else(|| panic!("{}: a divergence without its needs", r.bug));
            let kept = needs_of(&m.case);
            assert!(needs.iter().all(|n| kept.contains(n)), "{}: needs {needs:?} beyond the case's {kept:?}", r.bug);
            assert!(m.needs_execs <= MAX_PROBE_EXECS, "{}", r.bug);
            if r.bug == "row-parallel-bias-every-rank" {
                bias_seen = true;
                assert!(needs.contains(&"bias".to_string()) && needs.contains(&"tp".to_string()), "{needs:?}");
            }
        }
    }
    assert!(bias_seen, "the row-parallel bias fault's trigger case diverges");
}

#[test]
fn a_case_that_does_not_fail_is_refused() {
    let case = shardfuzz_fuzz::trigger_cases::case(r#", "tp": 2"#, "", "", 1);
    let mut clean = create("native", &TargetOptions::default()).unwrap();
    let e = shardfuzz_fuzz::minimize::minimize(clean.as_mut(), &case, &Oracle::default(), Budget::default()).unwrap_err();
    assert!(e.to_string().contains("does not fail"), "{e}");
}
