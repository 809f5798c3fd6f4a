//! Triage: one row per deduplicated finding of a campaign directory — signature, target, kind,
//! hits, first seen, its configuration classes, the smallest member, minimized or not, the report.

use std::path::Path;

use serde::Serialize;

use std::collections::BTreeMap;

use shardfuzz_harnesses::target::registry::TargetOptions;

use crate::cluster::{probable_bugs, ProbableBug};
use crate::findings::{Finding, FindingStore, MINIMIZATION, MINIMIZED};
use crate::minimize::background::minimize_one;
use crate::minimize::{Budget, Minimized};
use crate::oracle::Oracle;

/// The name of a finding's Markdown report.
pub const REPORT: &str = "report.md";

/// One finding in the triage table.
#[derive(Debug, Clone, Serialize)]
pub struct TriageRow {
    pub id: String,
    pub signature: String,
    pub target: String,
    pub kind: String,
    pub hits: u64,
    pub first_seen_elapsed_s: f64,
    /// Configuration classes it was seen under.
    pub classes: Vec<String>,
    /// The smallest case seen: its tensor elements and summary.
    pub smallest_elements: Option<usize>,
    pub smallest_summary: Option<String>,
    /// Tensor elements of the minimized case, when the finding was minimized.
    pub minimized_elements: Option<usize>,
    pub report: Option<String>,
    pub reason: String,
    /// The probable bug it belongs to (`crate::cluster`): findings whose minimized cases need the same things.
    pub probable_bug: String,
}

/// Every finding of `out/findings`, most hits first, and the probable bugs they group into.
pub fn triage(out: &Path) -> anyhow::Result<(Vec<TriageRow>, Vec<Finding>, Vec<ProbableBug>)> {
    let dir = out.join("findings");
    anyhow::ensure!(dir.is_dir(), "{}: no findings directory (is this a campaign directory?)", out.display());
    let store = FindingStore::open(&dir)?;
    let mut findings: Vec<Finding> = store.findings.values().cloned().collect();
    findings.sort_by(|a, b| b.hits.cmp(&a.hits).then(a.first_seen_elapsed_s.total_cmp(&b.first_seen_elapsed_s)));
    let bugs = probable_bugs(&findings, &dir);
    let bug_of: BTreeMap<&str, &str> = bugs.iter().flat_map(|b| b.findings.iter().map(|f| (f.as_str(), b.id.as_str()))).collect();
    let rows = findings.iter().map(|f| row(f, &dir.join(&f.id), bug_of.get(f.id.as_str()).unwrap_or(&"").to_string())).collect();
    Ok((rows, findings, bugs))
}

/// Minimizes every finding of the campaign directory `out` that has no minimized case yet, within
/// `budget` each; one log line per finding.
pub fn minimize_missing(out: &Path, budget: Budget, oracle: &Oracle) -> anyhow::Result<Vec<String>> {
    let dir = out.join("findings");
    let store = FindingStore::open(&dir)?;
    let mut targets = BTreeMap::new();
    let missing = store.findings.values().map(|f| dir.join(&f.id)).filter(|d| !d.join(MINIMIZED).exists());
    Ok(missing.map(|d| minimize_one(&d, &mut targets, &TargetOptions::default(), oracle, budget)).collect())
}

fn row(f: &Finding, dir: &Path, probable_bug: String) -> TriageRow {
    let minimized: Option<Minimized> = std::fs::read_to_string(dir.join(MINIMIZATION)).ok().and_then(|t| serde_json::from_str(&t).ok());
    let smallest = f.smallest_member();
    let report = dir.join(REPORT);
    TriageRow {
        id: f.id.clone(),
        signature: f.signature.clone(),
        target: f.target.clone(),
        kind: f.kind.clone(),
        hits: f.hits,
        first_seen_elapsed_s: f.first_seen_elapsed_s,
        classes: f.members.keys().cloned().collect(),
        smallest_elements: smallest.map(|(_, m)| m.elements),
        smallest_summary: smallest.map(|(_, m)| m.summary.clone()),
        minimized_elements: minimized.map(|m| m.elements_after),
        report: report.exists().then(|| report.display().to_string()),
        reason: f.verdict.reason.clone(),
        probable_bug,
    }
}
