//! The minimization benchmark: each injected native bug's trigger case, minimized on the native
//! target with that bug, with the executions, seconds and tensor elements before and after.

use serde::Serialize;
use shardfuzz_harnesses::target::registry::{create, TargetOptions};

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
}

/// Minimizes every bug's trigger case (seed `seed`) within `budget`.
pub fn bench(seed: u64, budget: Budget) -> Result<Vec<BenchRow>, String> {
    let mut rows = vec![];
    for (bug, p, m, t, _) in BUG_CASES {
        let c = case(p, m, t, seed);
        let mut target = create("native", &TargetOptions { inject: vec![bug.to_string()], timeout_ms: 10_000 })?;
        let row = match minimize(target.as_mut(), &c, &Oracle::default(), budget) {
            Ok(r) => BenchRow { bug: bug.to_string(), result: Some(r), note: String::new() },
            Err(e) => BenchRow { bug: bug.to_string(), result: None, note: e.to_string() },
        };
        rows.push(row);
    }
    Ok(rows)
}
