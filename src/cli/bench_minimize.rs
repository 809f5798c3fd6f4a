//! `shardfuzz bench minimize`: the minimizer on each injected bug's trigger case.

use std::process::ExitCode;
use std::time::Duration;

use shardfuzz_fuzz::minimize::bench::{bench, bench_campaign};
use shardfuzz_fuzz::minimize::Budget;

#[derive(clap::Args)]
pub struct MinimizeBenchArgs {
    /// Data seed of the trigger cases.
    #[arg(long, default_value_t = 5)]
    seed: u64,
    #[arg(long, default_value_t = Budget::default().max_execs)]
    max_execs: u64,
    #[arg(long, value_parser = super::fuzz::parse_duration, default_value = "60s")]
    max_time: Duration,
    #[arg(long)]
    json: bool,
    /// Minimize every finding of this campaign directory instead (from each one's smallest member).
    #[arg(long)]
    campaign: Option<std::path::PathBuf>,
}

pub fn run(a: MinimizeBenchArgs) -> anyhow::Result<ExitCode> {
    let budget = Budget { max_execs: a.max_execs, max_time: a.max_time };
    let rows = match &a.campaign {
        Some(dir) => bench_campaign(dir, budget)?,
        None => bench(a.seed, budget).map_err(|e| anyhow::anyhow!(e))?,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<32} {:>6} {:>7} {:>9} {:>9} {:>7}  minimized case / failure",
        "bug or finding", "execs", "seconds", "elements", "after", "after%"
    );
    for r in &rows {
        match &r.result {
            Some(m) => println!(
                "{:<32} {:>6} {:>7.2} {:>9} {:>9} {:>6.1}%  {} — {} {}{}",
                r.bug,
                m.execs,
                m.seconds,
                m.elements_before,
                m.elements_after,
                100.0 * m.elements_after as f64 / m.elements_before.max(1) as f64,
                m.case.summary(),
                m.key.kind,
                m.key.site,
                if m.budget_exhausted { " (budget exhausted)" } else { "" }
            ),
            None => println!("{:<32} {}", r.bug, r.note),
        }
    }
    Ok(ExitCode::SUCCESS)
}
