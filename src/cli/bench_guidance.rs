//! `shardfuzz bench guidance`: framework code covered over time by coverage-guided campaigns
//! against pure random generation, per Python target (see `shardfuzz_fuzz::guidance`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use shardfuzz_fuzz::campaign::CampaignOptions;
use shardfuzz_fuzz::guidance::{chart, over_time_table, run_target, summarize, GuidanceRow};
use shardfuzz_fuzz::oracle::Oracle;
use shardfuzz_harnesses::target::registry::{self, TargetOptions};

#[derive(clap::Args)]
pub struct GuidanceArgs {
    /// Targets (comma-separated); default: every Python target.
    #[arg(long)]
    targets: Option<String>,
    /// Wall time of each campaign.
    #[arg(long, default_value = "10m", value_parser = super::fuzz::parse_duration)]
    time: Duration,
    /// Campaigns per target and mode.
    #[arg(long, default_value_t = 3)]
    runs: u64,
    #[arg(long, default_value = "corpus")]
    corpus: PathBuf,
    /// Where the campaigns' directories go (TARGET/MODE-RUN).
    #[arg(long, default_value = "bench-guidance")]
    out: PathBuf,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The guided campaigns with `fuzz --adaptive-generation` (fresh cases in proportion to what
    /// they find).
    #[arg(long)]
    adaptive_generation: bool,
    /// Summary as JSON lines on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(a: GuidanceArgs) -> anyhow::Result<ExitCode> {
    let names: Vec<String> = match &a.targets {
        Some(t) => t.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
        None => registry::TARGETS.iter().filter(|t| registry::is_python(t.name)).map(|t| t.name.to_string()).collect(),
    };
    let mut runs = vec![];
    for name in &names {
        anyhow::ensure!(registry::is_python(name), "--targets: `{name}` reports no framework coverage (only Python targets do)");
        let base = CampaignOptions {
            target: name.clone(),
            target_options: TargetOptions::default(),
            corpus: Some(a.corpus.clone()),
            out: a.out.clone(),
            time: Some(a.time),
            execs: None,
            seed: a.seed,
            feedback: true,
            random_generation: false,
            adaptive_generation: a.adaptive_generation,
            oracle: Oracle::default(),
            status: false,
            stop_on_finding: false,
            sync_dirs: vec![],
            minimize: None,
        };
        runs.extend(run_target(&base, &a.out, a.runs, a.time)?);
    }
    let t = a.time.as_secs_f64();
    let checkpoints: Vec<f64> = [0.05, 0.1, 0.25, 0.5, 0.75, 1.0].iter().map(|f| f * t).collect();
    println!("framework lines/branches covered, median of {} runs per mode:", a.runs);
    print!("{}", over_time_table(&runs, &checkpoints));
    let csv = summary_table(&summarize(&runs, t), a.json)?;
    std::fs::create_dir_all(&a.out)?;
    shardfuzz_fuzz::findings::write_atomic(&a.out.join("guidance.csv"), csv.as_bytes())?;
    let png = a.out.join("guidance.png");
    chart(&runs, t, &png)?;
    eprintln!("wrote {} and {}", a.out.join("guidance.csv").display(), png.display());
    Ok(ExitCode::SUCCESS)
}

/// Prints the per-target summary (and its JSON lines with `json`); returns it as CSV.
fn summary_table(rows: &[GuidanceRow], json: bool) -> anyhow::Result<String> {
    let mut csv =
        String::from("target,runs,guided_cov,random_cov,ratio,guided_findings,random_findings,guided_expressed,random_expressed\n");
    println!("\n{:<20} {:>10} {:>10} {:>6} {:>15} {:>15}", "target", "guided", "random", "ratio", "findings g/r", "expressed g/r");
    for r in rows {
        println!(
            "{:<20} {:>10.0} {:>10.0} {:>6.2} {:>15} {:>15}",
            r.target,
            r.guided_cov,
            r.random_cov,
            r.ratio,
            format!("{}/{}", r.guided_findings, r.random_findings),
            format!("{}/{}", r.guided_expressed, r.random_expressed)
        );
        csv += &format!(
            "{},{},{},{},{:.3},{},{},{},{}\n",
            r.target,
            r.runs,
            r.guided_cov,
            r.random_cov,
            r.ratio,
            r.guided_findings,
            r.random_findings,
            r.guided_expressed,
            r.random_expressed
        );
        if json {
            println!("{}", serde_json::to_string(r)?);
        }
    }
    Ok(csv)
}
