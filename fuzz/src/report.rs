//! Reports for CI: a baseline of known signatures, SARIF 2.1.0 and JUnit XML listing findings.

use std::collections::BTreeSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::findings::Finding;

/// Known findings: their signatures (what `shardfuzz baseline out/` writes).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Baseline {
    pub signatures: BTreeSet<String>,
}

impl Baseline {
    pub fn from_findings(findings: &[Finding]) -> Baseline {
        Baseline { signatures: findings.iter().map(|f| f.signature.clone()).collect() }
    }

    pub fn load(path: &Path) -> anyhow::Result<Baseline> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: not a baseline file: {e}", path.display()))
    }

    pub fn contains(&self, signature: &str) -> bool {
        self.signatures.contains(signature)
    }
}

/// SARIF 2.1.0: one result per finding, ruleId = verdict kind, location = the finding's case file.
pub fn sarif(findings: &[Finding], findings_dir: &Path) -> serde_json::Value {
    let results: Vec<serde_json::Value> = findings
        .iter()
        .map(|f| {
            serde_json::json!({
                "ruleId": f.kind,
                "level": "error",
                "message": {"text": format!("{} [{}]: {}", f.kind, f.target, f.verdict.reason)},
                "locations": [{"physicalLocation": {"artifactLocation": {"uri": findings_dir.join(&f.id).join("case.json").display().to_string()}}}],
                "partialFingerprints": {"shardfuzzSignature": f.signature},
                "properties": {"hits": f.hits, "summary": f.summary, "versions": f.versions},
            })
        })
        .collect();
    let rules: Vec<serde_json::Value> = ["divergent", "crash", "hang"]
        .iter()
        .map(|k| serde_json::json!({"id": k, "shortDescription": {"text": format!("{k} in a sharded run")}}))
        .collect();
    serde_json::json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "shardfuzz",
                "version": env!("CARGO_PKG_VERSION"),
                "rules": rules,
            }},
            "results": results,
        }]
    })
}

/// JUnit XML: one test case per finding (a failure) — or a single passing case when there is none.
pub fn junit(findings: &[Finding], baseline: &Baseline) -> anyhow::Result<String> {
    use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
    let mut report = Report::new("shardfuzz");
    let mut suite = TestSuite::new("fuzz");
    if findings.is_empty() {
        suite.add_test_case(TestCase::new("no findings", TestCaseStatus::success()));
    }
    for f in findings {
        let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
        status.set_message(f.verdict.reason.clone());
        status.set_type(if baseline.contains(&f.signature) { "known" } else { "new" });
        status.set_description(format!("{}\nsignature: {}\nhits: {}", f.summary, f.signature, f.hits));
        suite.add_test_case(TestCase::new(format!("{} {}", f.kind, f.id), status));
    }
    report.add_test_suite(suite);
    Ok(report.to_string()?)
}
