//! Bug reports a maintainer can act on: the minimized configuration in words, observed against
//! expected in units of the noise ε, where the divergence first shows and on which ranks, the
//! likely root-cause class, the environment, and a standalone repro script (`repro`).

mod cause;
mod describe;
mod markdown;
pub mod repro;

pub use cause::likely_cause;
pub use describe::describe;
pub use markdown::markdown;

use std::collections::BTreeMap;

use serde::Serialize;
use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::target::{Outcome, Target};

use crate::localize::{place_of, Localization};
use crate::oracle::{judge_prepared, Oracle, Prepared, Stat, Verdict};

/// One statistic of a tensor, observed against its bound.
#[derive(Debug, Clone, Serialize)]
pub struct Observation {
    pub tensor: String,
    pub stat: Stat,
    pub error: f64,
    pub noise: f64,
    pub bound: f64,
    pub ratio: f64,
}

/// Everything a report says.
#[derive(Debug, Clone, Serialize)]
pub struct BugReport {
    pub title: String,
    pub summary: Vec<String>,
    pub environment: BTreeMap<String, String>,
    pub configuration: Vec<String>,
    pub case: Case,
    pub verdict: Verdict,
    /// The failing statistics of the first divergent tensor.
    pub observed: Vec<Observation>,
    /// A few elements of the first divergent tensor: (index, sharded, reference).
    pub values: Vec<(usize, f64, f64)>,
    pub localization: Option<Localization>,
    pub cause: String,
    pub evidence: Vec<String>,
    pub repro: repro::Repro,
}

/// Runs `case` on `target` once more and builds its report; `repro_dir` receives the repro files.
pub fn build(target: &mut dyn Target, case: &Case, oracle: &Oracle, repro_dir: &std::path::Path, injected: &[String]) -> BugReport {
    let prep = Prepared::new(case);
    let outcome = target.run(case, &prep.inputs);
    let verdict = judge_prepared(target.name(), target.versions(), &prep, outcome.clone(), oracle);
    let mut verdict = crate::oracle::confirm_finding(target, &prep, verdict, oracle);
    if crate::oracle::precision::wants_note(case, &verdict) {
        let note = crate::oracle::precision::note(target, case, &verdict, oracle);
        verdict.notes.push(note);
    }
    // The oracle localized the divergence already; only the values are read here.
    let loc = verdict.localization.clone();
    let (mut values, mut scale_dir) = (vec![], None);
    // A library op's reference is the framework's own, sent with the run.
    let worker_reference = match &outcome {
        Outcome::Completed(out) if case.library_op.is_some() => Ok(out.sent_reference()),
        _ => Err(String::new()),
    };
    let reference = if case.library_op.is_some() { &worker_reference } else { prep.reference() };
    if let (Outcome::Completed(out), Ok(reference)) = (&outcome, reference) {
        if let Some(l) = &loc {
            // Elements of tensors of different shapes do not correspond: the reason states the shapes.
            if let (Some(t), Some(r)) = (out.tensor(&l.tensor), reference.tensor(&l.tensor)) {
                if t.shape == r.shape {
                    values = worst_elements(t, r, 6);
                    scale_dir = Some(cause::scale_and_direction(t, r));
                }
            }
        }
    }
    let (cause, evidence) = likely_cause(case, &verdict, loc.as_ref(), scale_dir);
    let repro = repro::write(target.name(), case, &prep, &verdict, repro_dir, injected);
    BugReport {
        title: title(case, &verdict),
        summary: summary(case, &verdict, loc.as_ref()),
        environment: environment(target.name(), &verdict),
        configuration: describe(case),
        case: case.clone(),
        observed: observed(&verdict),
        values,
        localization: loc,
        cause,
        evidence,
        repro,
        verdict,
    }
}

fn title(case: &Case, v: &Verdict) -> String {
    let class = crate::oracle::config_class(case);
    match v.first_divergent() {
        Some(c) => format!("[{}] wrong `{}` under {class} ({})", v.target, c.tensor, case.train.dtype),
        None if v.kind == crate::oracle::VerdictKind::Crash => {
            let (message, frame) = crate::oracle::crash_parts(v);
            let message: String = message.chars().take(100).collect();
            let at = if frame.is_empty() { String::new() } else { format!(" in {frame}") };
            format!("[{}] crash under {class}: {message}{at}", v.target)
        }
        None => format!("[{}] {} under {class}: {}", v.target, v.kind, v.reason.chars().take(90).collect::<String>()),
    }
}

fn summary(case: &Case, v: &Verdict, loc: Option<&Localization>) -> Vec<String> {
    let mut s = vec![format!(
        "The sharded run ({}) {} on a case that a single device runs correctly.",
        case.summary(),
        match v.kind {
            crate::oracle::VerdictKind::Divergent => "computes a different result",
            crate::oracle::VerdictKind::Crash => "crashes",
            crate::oracle::VerdictKind::Hang => "hangs",
            _ => "behaves differently",
        }
    )];
    let wrong_shape = v.first_divergent().filter(|c| c.has_wrong_shape());
    match loc {
        Some(l) if wrong_shape.is_some() => s.push(format!(
            "`{}` ({}, {}): {}.",
            l.tensor,
            l.phase,
            l.owner,
            wrong_shape.and_then(|c| c.note.as_deref()).unwrap_or_default()
        )),
        Some(l) => s.push(format!(
            "`{}` ({}, {}) is {:.0}× beyond the round-off a correct sharded run shows.",
            l.tensor, l.phase, l.owner, l.ratio
        )),
        None => s.push(v.reason.clone()),
    }
    s
}

fn observed(v: &Verdict) -> Vec<Observation> {
    let Some(c) = v.first_divergent() else { return vec![] };
    c.stats
        .iter()
        .map(|s| Observation { tensor: c.tensor.clone(), stat: s.stat, error: s.error, noise: s.noise, bound: s.bound, ratio: s.ratio })
        .collect()
}

/// The `n` elements with the largest difference: (flat index, sharded, reference).
fn worst_elements(t: &shardfuzz_harnesses::tensor::Tensor, r: &shardfuzz_harnesses::tensor::Tensor, n: usize) -> Vec<(usize, f64, f64)> {
    let mut idx: Vec<usize> = (0..t.data.len().min(r.data.len())).collect();
    idx.sort_by(|&a, &b| (r.data[b] - t.data[b]).abs().total_cmp(&(r.data[a] - t.data[a]).abs()));
    idx.truncate(n);
    idx.sort_unstable();
    idx.into_iter().map(|i| (i, t.data[i], r.data[i])).collect()
}

fn environment(target: &str, v: &Verdict) -> BTreeMap<String, String> {
    let mut env = v.versions.clone();
    env.insert("target".into(), target.into());
    env.insert("shardfuzz".into(), env!("CARGO_PKG_VERSION").into());
    env.insert("os".into(), os_release());
    if let Some(cpu) = cpu_model() {
        env.insert("cpu".into(), cpu);
    }
    if shardfuzz_harnesses::target::registry::is_python(target) {
        if let Some(py) = repro::python_version(target) {
            env.insert("python".into(), py);
        }
    }
    env
}

fn os_release() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let pretty = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("PRETTY_NAME=").map(|v| v.trim_matches('"').to_string())));
    format!("{} {} ({})", std::env::consts::OS, kernel.trim(), pretty.unwrap_or_else(|| std::env::consts::ARCH.into()))
}

fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let model = text.lines().find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_string()))?;
    let cores = text.lines().filter(|l| l.starts_with("processor")).count();
    Some(format!("{model} ({cores} logical cores), no GPU used"))
}

/// Where a tensor lives, for the Markdown.
pub fn tensor_place(case: &Case, name: &str) -> String {
    let (phase, owner) = place_of(case, name);
    format!("{phase}, {owner}")
}
