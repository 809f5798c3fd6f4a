//! `shardfuzz fuzz`: a coverage-guided campaign; CI mode with exit codes, baseline, SARIF, JUnit.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use shardfuzz_fuzz::campaign::{run_campaign, CampaignOptions};
use shardfuzz_fuzz::findings::write_atomic;
use shardfuzz_fuzz::oracle::Oracle;
use shardfuzz_fuzz::report::{junit, sarif, Baseline};
use shardfuzz_harnesses::target::registry::TargetOptions;

#[derive(clap::Args)]
pub struct FuzzArgs {
    /// Target, or a comma-separated list: each case goes to every listed target that can express it.
    #[arg(long, default_value = "native")]
    target: String,
    /// Seed cases (JSON files).
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// Campaign directory; the same directory again resumes the campaign.
    #[arg(long, default_value = "out")]
    out: PathBuf,
    /// Time budget, e.g. 60s, 10m, 2h.
    #[arg(long, value_parser = parse_duration)]
    time: Option<Duration>,
    /// Execution budget.
    #[arg(long)]
    execs: Option<u64>,
    /// Parallel campaigns, one per core, sharing the out directory's queue.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Turn coverage feedback off (random generation and mutation only).
    #[arg(long)]
    no_feedback: bool,
    /// Pure random generation: every execution a fresh random case, no corpus, no mutation, no
    /// feedback (the baseline coverage guidance is measured against; `bench guidance`).
    #[arg(long)]
    random_generation: bool,
    /// Fresh random cases in proportion to what they find against mutations (a two-armed bandit
    /// on corpus additions per execution) instead of one every 64 rounds.
    #[arg(long)]
    adaptive_generation: bool,
    /// Exit 1 when a finding whose signature is not in the baseline appears.
    #[arg(long)]
    fail_on_finding: bool,
    #[arg(long)]
    baseline: Option<PathBuf>,
    #[arg(long)]
    sarif: Option<PathBuf>,
    #[arg(long)]
    junit: Option<PathBuf>,
    /// Inject a bug into the native target; repeatable.
    #[arg(long)]
    inject: Vec<String>,
    /// Time a case may take before it is a hang, in milliseconds (0: the target's default).
    #[arg(long, default_value_t = 0)]
    timeout_ms: u64,
    #[arg(long, default_value_t = Oracle::default().threshold)]
    threshold: f64,
    /// No status line.
    #[arg(long)]
    quiet: bool,
    /// Queue directory of another campaign to import from (repeatable; used by --jobs and for
    /// campaigns spread over machines that share or rsync their out directories).
    #[arg(long)]
    sync: Vec<PathBuf>,
    /// Minimize every new finding in the background of the search (`minimized.json` beside it).
    #[arg(long)]
    minimize: bool,
    /// Most time one background minimization may take.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    minimize_time: Duration,
}

/// Parses `90`, `90s`, `10m`, `2h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, mult) = match s.chars().last() {
        Some('s') => (&s[..s.len() - 1], 1.0),
        Some('m') => (&s[..s.len() - 1], 60.0),
        Some('h') => (&s[..s.len() - 1], 3600.0),
        _ => (s, 1.0),
    };
    num.parse::<f64>()
        .ok()
        .filter(|v| *v >= 0.0)
        .map(|v| Duration::from_secs_f64(v * mult))
        .ok_or_else(|| format!("`{s}` is not a duration like 60s, 10m or 2h"))
}

pub fn run(a: FuzzArgs) -> anyhow::Result<ExitCode> {
    if a.time.is_none() && a.execs.is_none() && a.fail_on_finding {
        anyhow::bail!("--fail-on-finding needs --time or --execs");
    }
    let baseline = match &a.baseline {
        Some(p) => Baseline::load(p)?,
        None => Baseline::default(),
    };
    let opts = CampaignOptions {
        target: a.target.clone(),
        target_options: TargetOptions { inject: a.inject.clone(), timeout_ms: a.timeout_ms },
        corpus: a.corpus.clone(),
        out: a.out.clone(),
        time: a.time,
        execs: a.execs,
        seed: a.seed,
        feedback: !a.no_feedback,
        random_generation: a.random_generation,
        adaptive_generation: a.adaptive_generation,
        oracle: Oracle { threshold: a.threshold, ..Oracle::default() },
        status: !a.quiet,
        stop_on_finding: false,
        sync_dirs: a.sync.clone(),
        minimize: a.minimize.then_some(shardfuzz_fuzz::minimize::Budget {
            max_execs: shardfuzz_fuzz::minimize::Budget::default().max_execs,
            max_time: a.minimize_time,
        }),
    };
    let summary = if a.jobs > 1 { super::jobs::run_jobs(&opts, a.jobs)? } else { run_campaign(&opts)? };
    let new: Vec<_> = summary.findings.iter().filter(|f| !baseline.contains(&f.signature)).collect();
    eprintln!(
        "done: {} execs in {:.1} s ({:.0}/s), corpus {}, coverage {}, {} finding(s), {} not in the baseline; time in target+oracle {:.0} %; {} of them expressed by a target ({:.1}/s){}",
        summary.execs,
        summary.process_s,
        summary.execs as f64 / summary.process_s.max(1e-9),
        summary.corpus,
        summary.coverage,
        summary.findings.len(),
        new.len(),
        100.0 * summary.target_s / summary.process_s.max(1e-9),
        summary.expressed,
        summary.expressed as f64 / summary.process_s.max(1e-9),
        if summary.framework_cov > 0 { format!("; framework lines/branches covered {}", summary.framework_cov) } else { String::new() }
    );
    for f in &new {
        eprintln!("  {} {} [{}] {}: {}", f.id, f.kind, f.target, f.summary, f.verdict.reason);
    }
    let findings_dir = a.out.join("findings");
    if let Some(p) = &a.sarif {
        write_atomic(p, serde_json::to_string_pretty(&sarif(&summary.findings, &findings_dir))?.as_bytes())?;
    }
    if let Some(p) = &a.junit {
        write_atomic(p, junit(&summary.findings, &baseline)?.as_bytes())?;
    }
    Ok(if a.fail_on_finding && !new.is_empty() { ExitCode::from(1) } else { ExitCode::SUCCESS })
}
