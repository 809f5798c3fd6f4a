//! `shardfuzz minimize FINDING_DIR | CASE.json [--target T]`: shrink a failing case to a fixpoint of
//! the minimizer's passes and store it (`minimized.json` beside a finding, `CASE.min.json` beside a
//! case file). Exit 0 when minimized; 2 when the case does not fail.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use shardfuzz_fuzz::findings::{write_atomic, FindingSource, MINIMIZATION, MINIMIZED};
use shardfuzz_fuzz::minimize::{minimize, Budget, Minimized};
use shardfuzz_fuzz::oracle::Oracle;
use shardfuzz_harnesses::target::registry::{self, TargetOptions};

#[derive(clap::Args)]
pub struct MinimizeArgs {
    /// A finding directory (`OUT/findings/<id>`) or a case file.
    input: PathBuf,
    /// Target (default: the finding's; `native` for a bare case).
    #[arg(long)]
    target: Option<String>,
    /// Bugs injected into the native target (default: those the finding recorded).
    #[arg(long)]
    inject: Vec<String>,
    /// Most target runs.
    #[arg(long, default_value_t = Budget::default().max_execs)]
    max_execs: u64,
    /// Most time, e.g. 60s, 10m.
    #[arg(long, value_parser = super::fuzz::parse_duration, default_value = "10m")]
    max_time: Duration,
    /// Where to write the minimized case (default: beside the input).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the record as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(a: MinimizeArgs) -> anyhow::Result<ExitCode> {
    let src = FindingSource::load(&a.input)?;
    super::apply_recorded_known_fixes(&src);
    let name = src.target(a.target.as_deref());
    let opts = TargetOptions { inject: src.injected(&a.inject), timeout_ms: 0 };
    let mut target = registry::create(&name, &opts).map_err(|e| anyhow::anyhow!("--target: {e}"))?;
    let budget = Budget { max_execs: a.max_execs, max_time: a.max_time };
    let m = minimize(target.as_mut(), &src.smallest_case(), &Oracle::default(), budget)?;
    let out = a.out.clone().unwrap_or_else(|| match &src.dir {
        Some(d) => d.join(MINIMIZED),
        None => a.input.with_extension("min.json"),
    });
    write_atomic(&out, m.case.to_json().as_bytes())?;
    if let Some(d) = &src.dir {
        write_atomic(&d.join(MINIMIZATION), serde_json::to_string_pretty(&m)?.as_bytes())?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&m)?);
    } else {
        print_record(&m, &out);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_record(m: &Minimized, out: &std::path::Path) {
    println!("{} on {}: {}", m.key.kind, m.key.target, m.key.site);
    println!("{:<20} {:>6} {:>9}", "pass", "calls", "kept");
    for p in &m.passes {
        println!("{:<20} {:>6} {:>9}", p.name, p.calls, p.successes);
    }
    let ratio = m.elements_after as f64 / m.elements_before.max(1) as f64;
    println!(
        "{} executions, {:.1} s{}; tensor elements {} → {} ({:.1} % of the original)",
        m.execs,
        m.seconds,
        if m.budget_exhausted { " (budget exhausted before the fixpoint)" } else { "" },
        m.elements_before,
        m.elements_after,
        100.0 * ratio
    );
    if m.stale_candidates > 0 {
        println!("not kept: {} candidate(s) that failed only in processes that had run earlier candidates", m.stale_candidates);
    }
    println!("minimized: {} — {}", out.display(), m.case.summary());
    if let Some(n) = &m.needs {
        println!("needs ({} more executions, dropping what the divergence survives without): {}", m.needs_execs, n.join(", "));
    }
    println!("verdict: {}", m.verdict.reason);
}
