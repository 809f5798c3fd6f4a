//! The verdict table printed by `shardfuzz run`.

use shardfuzz_fuzz::oracle::Verdict;

fn sci(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2e}")
    } else {
        format!("{x}")
    }
}

/// One header line and a row per compared tensor.
pub fn render(v: &Verdict) -> String {
    let mut s = format!("target {}: {} — {}\n", v.target, v.kind.name().to_uppercase(), v.reason);
    if v.checks.is_empty() {
        return s;
    }
    let w = v.checks.iter().map(|c| c.tensor.len()).max().unwrap_or(6).max(6);
    s += &format!("  {:<w$}  {:>9}  {:>9}  {:>9}  {:>9}  {:>8}  verdict\n", "tensor", "error", "bound", "ε", "baseline", "ratio");
    for c in &v.checks {
        s += &format!(
            "  {:<w$}  {:>9}  {:>9}  {:>9}  {:>9}  {:>8}  {}{}\n",
            c.tensor,
            sci(c.error),
            sci(c.bound),
            sci(c.noise),
            sci(c.baseline_error),
            if c.ratio.is_finite() { format!("{:.1}", c.ratio) } else { "inf".into() },
            if c.pass { "pass" } else { "DIVERGENT" },
            c.note.as_ref().map(|n| format!(" ({n})")).unwrap_or_default()
        );
    }
    for n in &v.notes {
        s += &format!("  note: {n}\n");
    }
    s
}
