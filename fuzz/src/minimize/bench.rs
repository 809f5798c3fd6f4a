//! The minimization benchmark: each injected native bug's trigger case, minimized on the native
//! target with that bug, with the executions, seconds and tensor elements before and after.

use std::path::Path;

use serde::Serialize;
use shardfuzz_harnesses::target::registry::{create, TargetOptions};

use crate::findings::FindingSource;

use super::{minimize, Budget, Minimized};
use crate::oracle::Oracle;
use crate::trigger_cases::{case, BUG_CASES};

/// One bug's minimization.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRow {
    pub bug: String,
    /// None when the trigger case does not fail in the case's own dtype (nothing to minimize).
    pub result: Option<Minimized>,
    pub note: String,
    /// Tensor elements of the case first recorded (campaign findings; minimization starts from the
    /// smallest member, whose size is `result.elements_before`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub original_elements: Option<usize>,
}

/// Minimizes every bug's trigger case (seed `seed`) within `budget`.
pub fn bench(seed: u64, budget: Budget) -> Result<Vec<BenchRow>, String> {
    let mut rows = vec![];
    for (bug, p, m, t, _) in BUG_CASES {
        let c = case(p, m, t, seed);
        let mut target = create("native", &TargetOptions { inject: vec![bug.to_string()], timeout_ms: 10_000 })?;
        let row = match minimize(target.as_mut(), &c, &Oracle::default(), budget) {
            Ok(r) => BenchRow { bug: bug.to_string(), result: Some(r), note: String::new(), original_elements: None },
            Err(e) => BenchRow { bug: bug.to_string(), result: None, note: e.to_string(), original_elements: None },
        };
        rows.push(row);
    }
    Ok(rows)
}

/// Minimizes every finding of a campaign directory (from its smallest member) within `budget`;
/// rows are named `<target>/<finding id>`.
pub fn bench_campaign(out: &Path, budget: Budget) -> anyhow::Result<Vec<BenchRow>> {
    let mut rows = vec![];
    let mut dirs: Vec<_> =
        std::fs::read_dir(out.join("findings"))?.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_dir()).collect();
    dirs.sort();
    for dir in dirs {
        let src = FindingSource::load(&dir)?;
        let name = src.target(None);
        let id = dir.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        let opts = TargetOptions { inject: src.injected(&[]), timeout_ms: 0 };
        let mut target = create(&name, &opts).map_err(|e| anyhow::anyhow!(e))?;
        let original_elements = Some(super::case_elements(&src.case));
        let row = match minimize(target.as_mut(), &src.smallest_case(), &Oracle::default(), budget) {
            Ok(r) => BenchRow { bug: format!("{name}/{id}"), result: Some(r), note: String::new(), original_elements },
            Err(e) => BenchRow { bug: format!("{name}/{id}"), result: None, note: e.to_string(), original_elements },
        };
        rows.push(row);
    }
    Ok(rows)
}
