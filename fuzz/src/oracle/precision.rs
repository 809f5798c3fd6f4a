//! Whether a low-precision divergence of a library-op case is round-off: the same case run again in
//! other dtypes, with the answer as a note on the finding.
//!
//! The oracle's bounds in low precision are where a false positive would come from, and float64
//! leaves them no room: a case that diverges in f64 too is the framework's. A case that passes in
//! f64 is not cleared by that alone, since a float64 program is another program (the JAX targets
//! pass cotangents in f64 and convert them inside the jitted step, and XLA doubles a conv weight
//! gradient after that convert: `docs/findings/jax-0.12-gspmd-conv-weight-grad-doubled-converted-cotangent.py`).
//! Round-off scales with the unit round-off, f32's and bf16's 2^16 apart, while a dropped element
//! or a doubled sum does not: a divergence whose error stays within [`SCALE_FREE_FACTOR`] from f32
//! to bf16 is not round-off either. The test suite applies the same rules
//! (`harnesses/python/shardfuzz_worker/ci_findings.py`).

use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::target::Target;
use shardfuzz_kernels::DType;

use super::{evaluate, Oracle, Stat, Verdict, VerdictKind};

/// A divergence whose error moves by less than this factor between f32 and bf16 is not round-off.
pub const SCALE_FREE_FACTOR: f64 = 4.0;

/// How the note of a divergence that only low precision shows begins.
pub const LOW_PRECISION_ONLY: &str = "precision: low precision only";

/// Whether a verdict gets a precision note: a divergence of a library-op case in a dtype below f64.
pub fn wants_note(case: &Case, v: &Verdict) -> bool {
    v.kind == VerdictKind::Divergent && case.library_op.is_some() && case.train.dtype != DType::F64
}

/// The note for a divergence `v` of `case` (see the module): runs the case again in f64, and when
/// that passes, in f32 and bf16 (`v` itself stands for the case's own dtype).
pub fn note(target: &mut dyn Target, case: &Case, v: &Verdict, oracle: &Oracle) -> String {
    let mut rerun = |dtype| {
        if dtype == case.train.dtype {
            return v.clone();
        }
        let mut c = case.clone();
        c.train.dtype = dtype;
        evaluate(target, &c, oracle)
    };
    let f64_run = rerun(DType::F64);
    if f64_run.kind == VerdictKind::Divergent {
        return format!("precision: divergent in f64 as well — {}", f64_run.reason);
    }
    let (f32_run, bf16_run) = (rerun(DType::F32), rerun(DType::BF16));
    match scale_free(v, &f32_run, &bf16_run) {
        Some((a, b)) => format!(
            "precision: passes in f64 ({}), but the same error in f32 ({a:.3e}) and bf16 ({b:.3e}): not round-off, which scales with the unit round-off",
            f64_run.kind
        ),
        None => format!(
            "{LOW_PRECISION_ONLY} — passes in f64 ({}); f32: {}, bf16: {}; the error scales with the unit round-off",
            f64_run.kind, f32_run.kind, bf16_run.kind
        ),
    }
}

/// A campaign's verdict on divergence `v` given its precision `note`: a finite divergence that only
/// low precision shows, shrinking with the unit round-off, is round-off the op's conditioning
/// amplifies past what the library-op ensemble samples (partial results rounded before a
/// reduction: torch-dtensor's `dist` with p = 36 in bf16 has its gradient's scale off by 20 %,
/// and passes in f32 and f64), so it is not reported: `unsupported`, with the oracle's verdict in
/// the notes. A non-finite result (an overflow only the sharded run has) stays a finding.
pub fn judged(mut v: Verdict, note: String) -> Verdict {
    let finite = v.first_divergent().is_some_and(|c| c.error.is_finite() && c.stats.iter().all(|s| s.error.is_finite()));
    let round_off = note.starts_with(LOW_PRECISION_ONLY) && finite;
    v.notes.push(note);
    if round_off {
        v.notes.push(format!("the oracle gave: divergent — {}", v.reason));
        v.reason = "a divergence only low precision shows, scaling with the unit round-off (passes in f64 and f32): round-off of an ill-conditioned op, not judged".into();
        v.kind = VerdictKind::Unsupported;
    }
    v
}

/// The errors in f32 and bf16 of the tensor and statistic that decided `v`, when both runs diverge
/// with errors within [`SCALE_FREE_FACTOR`] of each other.
pub fn scale_free(v: &Verdict, f32_run: &Verdict, bf16_run: &Verdict) -> Option<(f64, f64)> {
    let decided = v.first_divergent()?;
    let stat = decided.decided_by.unwrap_or(Stat::Max);
    let error = |run: &Verdict| {
        let c = run.checks.iter().find(|c| c.tensor == decided.tensor)?;
        let e = if stat == Stat::Max { c.error } else { c.stats.iter().find(|s| s.stat == stat)?.error };
        (run.kind == VerdictKind::Divergent && e > 0.0 && e.is_finite()).then_some(e)
    };
    let (a, b) = (error(f32_run)?, error(bf16_run)?);
    (a.max(b) <= SCALE_FREE_FACTOR * a.min(b)).then_some((a, b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::{StatCheck, TensorCheck};

    fn run(kind: VerdictKind, tensor: &str, norm_error: f64) -> Verdict {
        let stat = |stat, error| StatCheck { stat, error, noise: 1e-3, bound: 8e-3, ratio: error / 1e-3, pass: error < 8e-3, member: None };
        let check = TensorCheck {
            tensor: tensor.into(),
            error: norm_error / 2.0,
            baseline_error: 0.0,
            perturbation_error: 0.0,
            noise: 1e-3,
            bound: 1.0,
            ratio: 1.0,
            pass: kind != VerdictKind::Divergent,
            note: None,
            decided_by: (kind == VerdictKind::Divergent).then_some(Stat::Norm),
            stats: vec![stat(Stat::Max, norm_error / 2.0), stat(Stat::Norm, norm_error)],
        };
        Verdict {
            target: "t".into(),
            kind,
            reason: String::new(),
            checks: vec![check],
            stuck: vec![],
            crash_rank: None,
            features: vec![],
            notes: vec![],
            versions: Default::default(),
            threshold: 100.0,
            members: vec![],
            localization: None,
        }
    }

    #[test]
    fn an_error_that_does_not_scale_with_the_unit_round_off_is_not_round_off() {
        let found = run(VerdictKind::Divergent, "grad/1", 0.999);
        let doubled = scale_free(&found, &run(VerdictKind::Divergent, "grad/1", 1.0), &run(VerdictKind::Divergent, "grad/1", 0.998));
        assert_eq!(doubled, Some((1.0, 0.998)));
        // Round-off: 2^12 smaller in f32, though still past f32's tighter bounds.
        assert_eq!(
            scale_free(&found, &run(VerdictKind::Divergent, "grad/1", 0.3 / 4096.0), &run(VerdictKind::Divergent, "grad/1", 0.3)),
            None
        );
        // Just past the factor.
        assert_eq!(scale_free(&found, &run(VerdictKind::Divergent, "grad/1", 0.2), &run(VerdictKind::Divergent, "grad/1", 0.81)), None);
    }

    #[test]
    fn only_a_finite_low_precision_only_divergence_is_set_aside() {
        let found = run(VerdictKind::Divergent, "grad/0", 0.2);
        let low = format!("{LOW_PRECISION_ONLY} — passes in f64 (pass)");
        assert_eq!(judged(found.clone(), low.clone()).kind, VerdictKind::Unsupported);
        assert_eq!(judged(found.clone(), "precision: divergent in f64 as well — x".into()).kind, VerdictKind::Divergent);
        assert_eq!(judged(found, "precision: passes in f64 (pass), but the same error".into()).kind, VerdictKind::Divergent);
        let overflow = run(VerdictKind::Divergent, "out/0", f64::NAN);
        assert_eq!(judged(overflow, low).kind, VerdictKind::Divergent);
    }

    #[test]
    fn a_rerun_that_passes_or_diverges_elsewhere_confirms_nothing() {
        let found = run(VerdictKind::Divergent, "grad/1", 1.0);
        assert_eq!(scale_free(&found, &run(VerdictKind::Pass, "grad/1", 1.0), &run(VerdictKind::Divergent, "grad/1", 1.0)), None);
        assert_eq!(scale_free(&found, &run(VerdictKind::Divergent, "out/0", 1.0), &run(VerdictKind::Divergent, "grad/1", 1.0)), None);
        assert_eq!(scale_free(&found, &run(VerdictKind::Divergent, "grad/1", f64::NAN), &run(VerdictKind::Divergent, "grad/1", 1.0)), None);
        assert_eq!(scale_free(&run(VerdictKind::Pass, "grad/1", 0.0), &found, &found), None);
    }
}
