//! Minimization during a campaign: new findings go to a thread with its own target instances, which
//! stores `minimized.json` and `minimization.json` beside each finding while the search goes on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Sender};
use std::thread::JoinHandle;

use shardfuzz_harnesses::target::registry::{create, TargetOptions};
use shardfuzz_harnesses::target::Target;

use super::{minimize, Budget};
use crate::findings::{write_atomic, FindingSource, MINIMIZATION, MINIMIZED};
use crate::oracle::Oracle;

/// The background minimizer of one campaign.
pub struct BackgroundMinimizer {
    tx: Option<Sender<PathBuf>>,
    handle: Option<JoinHandle<Vec<String>>>,
}

impl BackgroundMinimizer {
    pub fn start(options: TargetOptions, oracle: Oracle, budget: Budget) -> BackgroundMinimizer {
        let (tx, rx) = channel::<PathBuf>();
        let handle = std::thread::spawn(move || {
            let mut targets: BTreeMap<String, Box<dyn Target>> = BTreeMap::new();
            rx.iter().map(|dir| minimize_one(&dir, &mut targets, &options, &oracle, budget)).collect()
        });
        BackgroundMinimizer { tx: Some(tx), handle: Some(handle) }
    }

    /// Queues a finding directory.
    pub fn submit(&self, dir: PathBuf) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(dir);
        }
    }

    /// Waits for the queued findings; returns one log line per finding.
    pub fn finish(mut self) -> Vec<String> {
        drop(self.tx.take());
        self.handle.take().and_then(|h| h.join().ok()).unwrap_or_default()
    }
}

/// Minimizes the finding in `dir` and stores `minimized.json` and `minimization.json` beside it; one log
/// line. `targets` keeps the target instances between calls (keyed by name and injected bugs); the
/// bugs injected are `options.inject`, else those the finding recorded.
pub fn minimize_one(
    dir: &Path,
    targets: &mut BTreeMap<String, Box<dyn Target>>,
    options: &TargetOptions,
    oracle: &Oracle,
    budget: Budget,
) -> String {
    let mut run = || -> anyhow::Result<String> {
        let src = FindingSource::load(dir)?;
        let name = src.target(None);
        let options = TargetOptions { inject: src.injected(&options.inject), ..options.clone() };
        let key = format!("{name}|{}", options.inject.join(","));
        if !targets.contains_key(&key) {
            targets.insert(key.clone(), create(&name, &options).map_err(|e| anyhow::anyhow!(e))?);
        }
        let target = targets.get_mut(&key).expect("inserted above");
        let m = minimize(target.as_mut(), &src.smallest_case(), oracle, budget)?;
        write_atomic(&dir.join(MINIMIZED), m.case.to_json().as_bytes())?;
        write_atomic(&dir.join(MINIMIZATION), serde_json::to_string_pretty(&m)?.as_bytes())?;
        Ok(format!("{} executions, {:.1} s, {} → {} elements", m.execs, m.seconds, m.elements_before, m.elements_after))
    };
    let id = dir.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    match run() {
        Ok(s) => format!("minimized {id}: {s}"),
        Err(e) => format!("could not minimize {id}: {e}"),
    }
}
