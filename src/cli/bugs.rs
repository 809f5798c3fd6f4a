//! `shardfuzz bench bugs`: for each injected bug, K campaigns (seeds) from the seed corpus minus the
//! cases that already trigger the bug, time to the first finding with coverage feedback and without.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use shardfuzz_fuzz::campaign::{load_cases, run_campaign, CampaignOptions};
use shardfuzz_fuzz::oracle::{evaluate, Oracle};
use shardfuzz_harnesses::model::Bug;
use shardfuzz_harnesses::target::registry::{self, TargetOptions};

#[derive(clap::Args)]
pub struct BugsArgs {
    /// Only this bug (repeatable); default: every bug.
    #[arg(long)]
    bug: Vec<String>,
    /// Time budget of each campaign.
    #[arg(long, default_value = "60s", value_parser = super::fuzz::parse_duration)]
    budget: Duration,
    /// Campaign seeds per bug and mode.
    #[arg(long, default_value_t = 5)]
    seeds: u64,
    #[arg(long, default_value = "corpus")]
    corpus: PathBuf,
    #[arg(long)]
    json: bool,
    /// CSV output.
    #[arg(long, default_value = "bench-bugs.csv")]
    csv: PathBuf,
    /// PNG chart of the medians.
    #[arg(long)]
    png: Option<PathBuf>,
    /// Skip the runs without feedback.
    #[arg(long)]
    feedback_only: bool,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct BugResult {
    pub bug: String,
    pub seeds: u64,
    pub found: u64,
    pub found_no_feedback: u64,
    /// Median seconds to the first finding (a campaign that found nothing counts as the budget).
    pub median_s: f64,
    pub median_s_no_feedback: f64,
    pub times_s: Vec<Option<f64>>,
    pub times_s_no_feedback: Vec<Option<f64>>,
    pub excluded_seed_cases: usize,
}

fn median(times: &[Option<f64>], budget: f64) -> f64 {
    let mut v: Vec<f64> = times.iter().map(|t| t.unwrap_or(budget)).collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return f64::NAN;
    }
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The seed corpus without the cases that already trigger `bug`, written to `dir`.
fn filtered_corpus(corpus: &Path, bug: &str, dir: &Path) -> anyhow::Result<usize> {
    let opts = TargetOptions { inject: vec![bug.to_string()], timeout_ms: 10_000 };
    let mut target = registry::create("native", &opts).map_err(|e| anyhow::anyhow!(e))?;
    let mut excluded = 0;
    std::fs::create_dir_all(dir)?;
    for (i, case) in load_cases(corpus, &mut std::io::sink()).into_iter().enumerate() {
        if evaluate(target.as_mut(), &case, &Oracle::default()).kind.is_finding() {
            excluded += 1;
        } else {
            std::fs::write(dir.join(format!("seed-{i:03}.json")), case.to_json())?;
        }
    }
    Ok(excluded)
}

fn time_to_finding(bug: &str, corpus: &Path, seed: u64, budget: Duration, feedback: bool) -> anyhow::Result<Option<f64>> {
    let out = tempfile::tempdir()?;
    let opts = CampaignOptions {
        target: "native".into(),
        target_options: TargetOptions { inject: vec![bug.to_string()], timeout_ms: 10_000 },
        corpus: Some(corpus.to_path_buf()),
        out: out.path().to_path_buf(),
        time: Some(budget),
        execs: None,
        seed,
        feedback,
        oracle: Oracle::default(),
        status: false,
        stop_on_finding: true,
        sync_dirs: vec![],
    };
    let s = run_campaign(&opts)?;
    Ok(s.findings.iter().map(|f| f.first_seen_elapsed_s).min_by(|a, b| a.partial_cmp(b).unwrap()))
}

pub fn run(a: BugsArgs) -> anyhow::Result<ExitCode> {
    let bugs: Vec<Bug> = if a.bug.is_empty() {
        Bug::ALL.to_vec()
    } else {
        a.bug
            .iter()
            .map(|n| Bug::from_name(n).ok_or_else(|| anyhow::anyhow!("--bug: unknown bug `{n}` (see `shardfuzz bugs`)")))
            .collect::<anyhow::Result<_>>()?
    };
    let budget = a.budget.as_secs_f64();
    let mut results = vec![];
    for bug in bugs {
        let name = bug.name();
        let tmp = tempfile::tempdir()?;
        let excluded = filtered_corpus(&a.corpus, name, tmp.path())?;
        let mut times = vec![];
        let mut times_nf = vec![];
        for s in 0..a.seeds {
            times.push(time_to_finding(name, tmp.path(), s, a.budget, true)?);
            if !a.feedback_only {
                times_nf.push(time_to_finding(name, tmp.path(), s, a.budget, false)?);
            }
        }
        let r = BugResult {
            bug: name.to_string(),
            seeds: a.seeds,
            found: times.iter().filter(|t| t.is_some()).count() as u64,
            found_no_feedback: times_nf.iter().filter(|t| t.is_some()).count() as u64,
            median_s: median(&times, budget),
            median_s_no_feedback: median(&times_nf, budget),
            times_s: times,
            times_s_no_feedback: times_nf,
            excluded_seed_cases: excluded,
        };
        if !a.json {
            eprintln!(
                "{:<32} found {}/{} median {:>6.2} s | no feedback {}/{} median {:>6.2} s (excluded {} seed cases)",
                r.bug, r.found, r.seeds, r.median_s, r.found_no_feedback, r.seeds, r.median_s_no_feedback, excluded
            );
        }
        results.push(r);
    }
    let mut csv = String::from("bug,seeds,found,median_s,found_no_feedback,median_s_no_feedback,ratio\n");
    for r in &results {
        csv += &format!(
            "{},{},{},{:.3},{},{:.3},{:.2}\n",
            r.bug,
            r.seeds,
            r.found,
            r.median_s,
            r.found_no_feedback,
            r.median_s_no_feedback,
            r.median_s_no_feedback / r.median_s.max(1e-3)
        );
    }
    std::fs::write(&a.csv, &csv)?;
    if let Some(png) = &a.png {
        shardfuzz_fuzz::plot::bug_chart(
            png,
            &results.iter().map(|r| (r.bug.clone(), r.median_s, r.median_s_no_feedback)).collect::<Vec<_>>(),
        )?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        println!("{:<32} {:>7} {:>12} {:>14} {:>7}", "bug", "found", "median_s", "no_feedback_s", "ratio");
        for r in &results {
            println!(
                "{:<32} {:>3}/{:<3} {:>12.2} {:>14.2} {:>7.1}",
                r.bug,
                r.found,
                r.seeds,
                r.median_s,
                r.median_s_no_feedback,
                r.median_s_no_feedback / r.median_s.max(1e-3)
            );
        }
        println!("csv: {}", a.csv.display());
    }
    Ok(ExitCode::SUCCESS)
}
