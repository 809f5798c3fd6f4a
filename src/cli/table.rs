//! The verdict table printed by `shardfuzz run`.

use shardfuzz_fuzz::oracle::{StatCheck, TensorCheck, Verdict};

fn sci(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2e}")
    } else {
        format!("{x}")
    }
}

fn ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.1}")
    } else {
        "inf".into()
    }
}

/// The statistic closest to its bound, as `norm 3.1/16`: its error / ε against the threshold.
fn closest(c: &TensorCheck) -> String {
    let worst = c.stats.iter().filter(|s| s.bound > 0.0).max_by(|a, b| (a.error / a.bound).total_cmp(&(b.error / b.bound)));
    worst.map_or("-".into(), |s| format!("{} {}/{}", s.stat, ratio(s.ratio), ratio(s.bound / s.noise)))
}

fn stat_line(s: &StatCheck) -> String {
    let from = s.member.as_deref().unwrap_or("floor");
    let verdict = if s.pass { "≤" } else { ">" };
    format!("{} {} {verdict} bound {} (ε {} from {from}, {}× ε)", s.stat, sci(s.error), sci(s.bound), sci(s.noise), ratio(s.ratio))
}

/// One header line and a row per compared tensor; every statistic of a divergent tensor below it.
pub fn render(v: &Verdict) -> String {
    let mut s = format!("target {}: {} — {}\n", v.target, v.kind.name().to_uppercase(), v.reason);
    if v.checks.is_empty() {
        return s;
    }
    let w = v.checks.iter().map(|c| c.tensor.len()).max().unwrap_or(6).max(6);
    s += &format!(
        "  {:<w$}  {:>9}  {:>9}  {:>9}  {:>9}  {:>8}  {:>18}  verdict\n",
        "tensor", "error", "bound", "ε", "baseline", "ratio", "closest stat/limit"
    );
    for c in &v.checks {
        s += &format!(
            "  {:<w$}  {:>9}  {:>9}  {:>9}  {:>9}  {:>8}  {:>18}  {}{}\n",
            c.tensor,
            sci(c.error),
            sci(c.bound),
            sci(c.noise),
            sci(c.baseline_error),
            ratio(c.ratio),
            closest(c),
            if c.pass { "pass" } else { "DIVERGENT" },
            c.note.as_ref().map(|n| format!(" ({n})")).unwrap_or_default()
        );
        if !c.pass {
            for st in &c.stats {
                s += &format!("      {}\n", stat_line(st));
            }
        }
    }
    if !v.members.is_empty() {
        s += &format!("  ε from: {} (and the target's own single-device run where it sent one)\n", v.members.join(", "));
    }
    if let Some(l) = &v.localization {
        for line in l.to_string().lines() {
            s += &format!("  {line}\n");
        }
    }
    for n in &v.notes {
        s += &format!("  note: {n}\n");
    }
    s
}
