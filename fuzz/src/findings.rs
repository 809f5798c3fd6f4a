//! Findings, deduplicated by signature and stored once: `findings/<id>/case.json` and
//! `findings/<id>/verdict.json` (the verdict, framework versions, hits, first and last seen).
//! Every write is atomic (temp file + rename), so a kill -9 never leaves a torn file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use shardfuzz_harnesses::case::Case;

use crate::oracle::{signature_id, Verdict};

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut tmp, bytes)?;
    tmp.as_file().sync_data()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

fn now_unix() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The stored record of one deduplicated finding.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Finding {
    pub id: String,
    pub signature: String,
    pub kind: String,
    pub target: String,
    pub summary: String,
    pub hits: u64,
    pub first_seen_unix: f64,
    pub last_seen_unix: f64,
    /// Campaign time (seconds, across resumes) when it was first seen.
    pub first_seen_elapsed_s: f64,
    pub versions: BTreeMap<String, String>,
    pub verdict: Verdict,
    /// The configurations this finding was seen under, by configuration class (`tp+sp`, `dp+zero2`…);
    /// each member's smallest case is `members/<class>.json`.
    #[serde(default)]
    pub members: BTreeMap<String, Member>,
}

/// One configuration class of a finding.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Member {
    pub hits: u64,
    pub first_seen_elapsed_s: f64,
    /// The smallest case seen in this class: its summary and tensor elements.
    pub summary: String,
    pub elements: usize,
}

impl Finding {
    /// The member whose stored case is smallest: (class, member).
    pub fn smallest_member(&self) -> Option<(&String, &Member)> {
        self.members.iter().min_by_key(|(_, m)| m.elements)
    }
}

fn member_file(class: &str) -> String {
    let safe: String = class.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    format!("members/{safe}.json")
}

/// All findings of a campaign directory.
pub struct FindingStore {
    dir: PathBuf,
    pub findings: BTreeMap<String, Finding>,
    dirty: BTreeSet<String>,
    last_flush: Instant,
}

impl FindingStore {
    /// Opens `dir` (created if needed) and loads the findings already there.
    pub fn open(dir: &Path) -> std::io::Result<FindingStore> {
        std::fs::create_dir_all(dir)?;
        let mut findings = BTreeMap::new();
        for entry in std::fs::read_dir(dir)? {
            let p = entry?.path().join("verdict.json");
            if let Ok(text) = std::fs::read_to_string(&p) {
                match serde_json::from_str::<Finding>(&text) {
                    Ok(f) => {
                        findings.insert(f.signature.clone(), f);
                    }
                    Err(e) => eprintln!("warning: {}: {e}", p.display()),
                }
            }
        }
        Ok(FindingStore { dir: dir.to_path_buf(), findings, dirty: BTreeSet::new(), last_flush: Instant::now() })
    }

    /// Records a finding; returns true when its signature is new. New findings are written at
    /// once; hit counts of known ones are flushed at most once a second.
    /// Stores a harness error (our code failed, not the framework) beside the findings, in
    /// `harness-errors/<id>/`: never a finding, but kept so the test suite can fail on it and the
    /// case can be replayed. Returns whether it was new.
    pub fn record_harness_error(&self, case: &Case, verdict: &Verdict) -> std::io::Result<bool> {
        let dir = self.dir.parent().unwrap_or(Path::new(".")).join("harness-errors").join(signature_id(&verdict.signature(case)));
        if dir.exists() {
            return Ok(false);
        }
        write_atomic(&dir.join("case.json"), case.to_json().as_bytes())?;
        write_atomic(&dir.join("verdict.json"), serde_json::to_string_pretty(verdict).expect("verdict serialises").as_bytes())?;
        Ok(true)
    }

    pub fn record(&mut self, case: &Case, verdict: &Verdict, elapsed_s: f64) -> std::io::Result<bool> {
        let signature = verdict.signature(case);
        let now = now_unix();
        if let Some(f) = self.findings.get_mut(&signature) {
            f.hits += 1;
            f.last_seen_unix = now;
            let dir = self.dir.join(&f.id);
            if add_member(f, &dir, case, elapsed_s)? {
                write_atomic(&dir.join("verdict.json"), serde_json::to_string_pretty(&*f).expect("finding serialises").as_bytes())?;
            } else {
                self.dirty.insert(signature);
            }
            if self.last_flush.elapsed().as_secs_f64() > 1.0 {
                self.flush()?;
            }
            return Ok(false);
        }
        let id = signature_id(&signature);
        let mut f = Finding {
            id: id.clone(),
            signature: signature.clone(),
            kind: verdict.kind.name().to_string(),
            target: verdict.target.clone(),
            summary: case.summary(),
            hits: 1,
            first_seen_unix: now,
            last_seen_unix: now,
            first_seen_elapsed_s: elapsed_s,
            versions: verdict.versions.clone(),
            verdict: verdict.clone(),
            members: BTreeMap::new(),
        };
        let d = self.dir.join(&id);
        write_atomic(&d.join("case.json"), case.to_json().as_bytes())?;
        add_member(&mut f, &d, case, elapsed_s)?;
        write_atomic(&d.join("verdict.json"), serde_json::to_string_pretty(&f).expect("finding serialises").as_bytes())?;
        self.findings.insert(signature, f);
        Ok(true)
    }

    /// Writes the records whose hit counts changed.
    pub fn flush(&mut self) -> std::io::Result<()> {
        for sig in std::mem::take(&mut self.dirty) {
            if let Some(f) = self.findings.get(&sig) {
                let p = self.dir.join(&f.id).join("verdict.json");
                write_atomic(&p, serde_json::to_string_pretty(f).expect("finding serialises").as_bytes())?;
            }
        }
        self.last_flush = Instant::now();
        Ok(())
    }

    pub fn count_by_kind(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for f in self.findings.values() {
            *m.entry(f.kind.clone()).or_default() += 1;
        }
        m
    }
}

/// Counts a hit in the case's configuration class; stores the case when the class is new or the
/// case is smaller than the class's stored one. Returns whether the record must be written now.
fn add_member(f: &mut Finding, dir: &Path, case: &Case, elapsed_s: f64) -> std::io::Result<bool> {
    let class = crate::oracle::config_class(case);
    let elements = crate::minimize::case_elements(case);
    let member = f.members.entry(class.clone()).or_insert_with(|| Member {
        hits: 0,
        first_seen_elapsed_s: elapsed_s,
        summary: case.summary(),
        elements: usize::MAX,
    });
    member.hits += 1;
    if elements >= member.elements {
        return Ok(false);
    }
    member.elements = elements;
    member.summary = case.summary();
    write_atomic(&dir.join(member_file(&class)), case.to_json().as_bytes())?;
    Ok(true)
}

/// A case to work on: a finding directory (`case.json` + `verdict.json`) or a bare case file.
pub struct FindingSource {
    pub case: Case,
    /// The stored finding, when the source is a finding directory.
    pub finding: Option<Finding>,
    /// The finding directory, when it is one.
    pub dir: Option<PathBuf>,
}

impl FindingSource {
    pub fn load(path: &Path) -> anyhow::Result<FindingSource> {
        if path.is_dir() {
            let case = Case::load(&path.join("case.json")).map_err(|e| anyhow::anyhow!("{e}"))?;
            let verdict = path.join("verdict.json");
            let text = std::fs::read_to_string(&verdict).map_err(|e| anyhow::anyhow!("{}: {e}", verdict.display()))?;
            let finding: Finding =
                serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: not a finding record: {e}", verdict.display()))?;
            return Ok(FindingSource { case, finding: Some(finding), dir: Some(path.to_path_buf()) });
        }
        let case = Case::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(FindingSource { case, finding: None, dir: None })
    }

    /// The target: `--target` if given, else the finding's, else `native`.
    pub fn target(&self, flag: Option<&str>) -> String {
        flag.map(String::from).or_else(|| self.finding.as_ref().map(|f| f.target.clone())).unwrap_or_else(|| "native".into())
    }

    /// Bugs injected into the native target: `--inject` if given, else those the finding recorded.
    pub fn injected(&self, flag: &[String]) -> Vec<String> {
        if !flag.is_empty() {
            return flag.to_vec();
        }
        let recorded = self.finding.as_ref().and_then(|f| f.versions.get("injected"));
        recorded.map(|s| s.split(',').filter(|b| !b.is_empty()).map(String::from).collect()).unwrap_or_default()
    }

    /// The fixes of known framework bugs the finding was found under (`SHARDFUZZ_KNOWN_FIXES`, as the worker
    /// recorded them among its versions), comma-separated; None where it recorded none.
    pub fn known_fixes(&self) -> Option<&str> {
        self.finding.as_ref().and_then(|f| f.versions.get("known-fixes")).map(String::as_str).filter(|s| !s.is_empty())
    }

    /// The stored case of the finding's smallest member (the finding's own case if none).
    pub fn smallest_case(&self) -> Case {
        let stored = self.finding.as_ref().and_then(|f| f.smallest_member()).zip(self.dir.as_ref());
        stored.and_then(|((class, _), dir)| Case::load(&dir.join(member_file(class))).ok()).unwrap_or_else(|| self.case.clone())
    }

    /// The minimized case beside the finding, if one was stored.
    pub fn minimized(&self) -> Option<Case> {
        Case::load(&self.dir.as_ref()?.join(MINIMIZED)).ok()
    }
}

/// File name of a finding's minimized case.
pub const MINIMIZED: &str = "minimized.json";
/// File name of a finding's minimization record (passes, executions, sizes).
pub const MINIMIZATION: &str = "minimization.json";
