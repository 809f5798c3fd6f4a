//! The report as Markdown, ready to paste into a framework's issue tracker.

use std::fmt::Write;

use super::BugReport;

fn sci(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3e}")
    } else {
        format!("{x}")
    }
}

/// The Markdown text of a report.
pub fn markdown(r: &BugReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# {}\n", r.title);
    for line in &r.summary {
        let _ = writeln!(s, "{line}");
    }
    let _ = writeln!(s, "\n## Environment\n\n| | |\n|---|---|");
    for (k, v) in &r.environment {
        let _ = writeln!(s, "| {k} | {v} |");
    }
    let _ = writeln!(s, "\n## Configuration (minimized)\n");
    for line in &r.configuration {
        let _ = writeln!(s, "- {line}");
    }
    let _ = writeln!(s, "\n<details><summary>case.json</summary>\n\n```json\n{}\n```\n</details>\n", r.case.to_json());
    observed(&mut s, r);
    if let Some(l) = &r.localization {
        let _ = writeln!(s, "## Where it first shows\n\n```\n{l}```\n");
    }
    let _ = writeln!(s, "## Likely root cause\n\n{}", r.cause);
    for e in &r.evidence {
        let _ = writeln!(s, "- {e}");
    }
    repro(&mut s, r);
    s
}

fn observed(s: &mut String, r: &BugReport) {
    let _ = writeln!(s, "## Observed vs expected\n\n{}: {}\n", r.verdict.kind, r.verdict.reason);
    // How the run was made (a simulated finding confirmed on real ranks, tensors not compared …).
    for note in &r.verdict.notes {
        let _ = writeln!(s, "- {}", note.lines().next().unwrap_or_default());
    }
    if !r.verdict.notes.is_empty() {
        let _ = writeln!(s);
    }
    if r.observed.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "Errors against a float64 single-device reference; ε is the largest error any correct run of this case shows \
         (single-device runs in the case dtype, split and reordered reductions), the bound a fixed multiple of it.\n"
    );
    let _ = writeln!(s, "| tensor | statistic | error | ε | bound | error / ε |\n|---|---|---|---|---|---|");
    for o in &r.observed {
        let _ = writeln!(s, "| `{}` | {} | {} | {} | {} | {:.1} |", o.tensor, o.stat, sci(o.error), sci(o.noise), sci(o.bound), o.ratio);
    }
    if !r.values.is_empty() {
        let _ = writeln!(s, "\nLargest differences (flat index: sharded vs expected):\n");
        for (i, t, e) in &r.values {
            let _ = writeln!(s, "- [{i}]: {} vs {}", sci(*t), sci(*e));
        }
    }
    let _ = writeln!(s);
}

fn repro(s: &mut String, r: &BugReport) {
    let _ = writeln!(s, "\n## Reproduce\n");
    if r.repro.standalone {
        let _ = writeln!(
            s,
            "`repro.py` needs only the framework, numpy and the standard library; the inputs are embedded. It runs the sharded \
             path and the single-device path, prints both and the mismatch, and exits 1 when the bug shows (0 otherwise):\n"
        );
    } else {
        let _ = writeln!(s, "With shardfuzz, in the directory holding `case.json`:\n");
    }
    let _ = writeln!(s, "```sh\n{}\n```", r.repro.command);
    if let Some(n) = &r.repro.note {
        let _ = writeln!(s, "\n{n}");
    }
}
