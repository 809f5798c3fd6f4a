//! `shardfuzz run CASE.json... [--target T|all] [--json]`. Exit 0: every verdict pass, rejected or
//! unsupported; 1: a divergence, crash or hang; 2: usage or input error; 3: a harness error.

use std::path::PathBuf;
use std::process::ExitCode;

use shardfuzz_fuzz::oracle::{evaluate_prepared, Oracle, Prepared, VerdictKind};
use shardfuzz_harnesses::case::{Case, CaseError};
use shardfuzz_harnesses::target::registry::{self, TargetOptions};

#[derive(clap::Args)]
pub struct RunArgs {
    /// Case files (JSON).
    #[arg(required = true)]
    cases: Vec<PathBuf>,
    /// Target name, a comma-separated list, or `all`.
    #[arg(long, default_value = "native")]
    target: String,
    /// Print verdicts as JSON lines instead of tables.
    #[arg(long)]
    json: bool,
    /// Inject a bug into the native target (see `shardfuzz bugs`); repeatable.
    #[arg(long)]
    inject: Vec<String>,
    /// Divergence threshold of the worst element, as a multiple of its noise ε.
    #[arg(long, default_value_t = Oracle::default().threshold)]
    threshold: f64,
    /// Divergence threshold of the statistics over a whole tensor (rms, norm, sum, direction), in
    /// every dtype (default: 8).
    #[arg(long)]
    stat_threshold: Option<f64>,
    /// Time a case may take before it is a hang, in milliseconds (0: the target's default, 10 s
    /// for the native target, 60 s for the Python targets).
    #[arg(long, default_value_t = 0)]
    timeout_ms: u64,
}

/// Target names from `--target` (`all`: every registered target).
pub fn target_names(spec: &str) -> Vec<String> {
    if spec == "all" {
        registry::TARGETS.iter().filter(|t| t.name != "nop").map(|t| t.name.to_string()).collect()
    } else {
        spec.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
    }
}

pub fn run(a: RunArgs) -> anyhow::Result<ExitCode> {
    let oracle = Oracle { threshold: a.threshold, ..Oracle::default() }.with_stat_threshold(a.stat_threshold);
    let opts = TargetOptions { inject: a.inject.clone(), timeout_ms: a.timeout_ms };
    let mut targets = vec![];
    for name in target_names(&a.target) {
        match registry::create(&name, &opts) {
            Ok(t) => targets.push(t),
            // `all` means every target that can run here; a named one must run.
            Err(e) if a.target == "all" => eprintln!("skipped: {e}"),
            Err(e) => anyhow::bail!("--target: {e}"),
        }
    }
    // Read every case first: a malformed one is an input error before anything runs.
    let mut cases = vec![];
    for path in &a.cases {
        let case = Case::load(path).map_err(|e| match e {
            CaseError::Io { .. } => anyhow::anyhow!("{e}"),
            _ => anyhow::anyhow!("{}: {e}", path.display()),
        })?;
        cases.push((path, case));
    }
    let (mut finding, mut harness_error) = (false, false);
    for (path, case) in &cases {
        let prep = Prepared::new(case);
        if !a.json {
            println!("case {} — {}", path.display(), case.summary());
        }
        for t in targets.iter_mut() {
            let v = evaluate_prepared(t.as_mut(), &prep, &oracle);
            finding |= v.kind.is_finding();
            harness_error |= v.kind == VerdictKind::HarnessError;
            if a.json {
                let mut obj = serde_json::to_value(&v)?;
                obj["case"] = serde_json::Value::String(path.display().to_string());
                obj["signature"] = serde_json::Value::String(v.signature(case));
                println!("{}", serde_json::to_string(&obj)?);
            } else {
                print!("{}", super::table::render(&v));
            }
        }
        if !a.json {
            println!();
        }
    }
    if harness_error {
        eprintln!("a harness error: our own code failed (see the verdicts above); not a finding");
        return Ok(ExitCode::from(3));
    }
    Ok(if finding { ExitCode::from(1) } else { ExitCode::SUCCESS })
}
