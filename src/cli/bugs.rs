//! `shardfuzz bench bugs`: for each injected bug, K campaigns (seeds) from the seed corpus minus the
//! cases that already trigger the bug, time to the first finding with coverage feedback and without.
//! A finding counts only when the fault caused it: the clean target does not fail the same way on
//! its case.

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
    #[arg(long, conflicts_with = "no_feedback_only")]
    feedback_only: bool,
    /// Skip the runs with feedback.
    #[arg(long)]
    no_feedback_only: bool,
    /// Campaigns run at once, one process (and one bug) each; every campaign still has one core
    /// when this is at most the number of cores.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Instead of campaigns: how often N random cases, and N seed cases mutated 1–3 times, trigger
    /// each bug (how deep its region lies without guidance).
    #[arg(long, value_name = "N")]
    rates: Option<u64>,
    /// Also run pure random generation (fresh random cases, no corpus, no mutation) for the same budget
    /// and seeds: the baseline guidance must beat.
    #[arg(long)]
    random: bool,
    /// Instead of campaigns: each bug's trigger case run in every dtype, and whether the oracle
    /// flags it where the bug changes the run.
    #[arg(long)]
    per_dtype: bool,
    /// With --per-dtype: also random cases forced to each dtype, until N of them are in each
    /// fault's region (the fault changes the run, the clean target passes), at most 40·N drawn;
    /// prints found/fired per fault and dtype.
    #[arg(long, default_value_t = 0, value_name = "N")]
    region_cases: u64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct BugResult {
    pub bug: String,
    pub seeds: u64,
    pub found: u64,
    pub found_no_feedback: u64,
    /// Median seconds to the first finding (a campaign that found nothing counts as the budget;
    /// NaN, written as null, when that mode did not run).
    #[serde(deserialize_with = "shardfuzz_fuzz::oracle::nan::f64_or_nan")]
    pub median_s: f64,
    #[serde(deserialize_with = "shardfuzz_fuzz::oracle::nan::f64_or_nan")]
    pub median_s_no_feedback: f64,
    pub times_s: Vec<Option<f64>>,
    pub times_s_no_feedback: Vec<Option<f64>>,
    pub excluded_seed_cases: usize,
    /// Pure random generation (`--random`): found, median, times.
    #[serde(default)]
    pub found_random: u64,
    #[serde(default = "nan", deserialize_with = "shardfuzz_fuzz::oracle::nan::f64_or_nan")]
    pub median_s_random: f64,
    #[serde(default)]
    pub times_s_random: Vec<Option<f64>>,
}

fn nan() -> f64 {
    f64::NAN
}

/// One bug's result as it completes (stderr, before the table).
fn progress_line(r: &BugResult) -> String {
    let mode = |times: &[Option<f64>], found: u64, median: f64| {
        if times.is_empty() {
            "skipped".to_string()
        } else {
            format!("found {found}/{} median {median:>6.2} s", r.seeds)
        }
    };
    format!(
        "{:<32} {} | no feedback {} | random generation {} (excluded {} seed cases)",
        r.bug,
        mode(&r.times_s, r.found, r.median_s),
        mode(&r.times_s_no_feedback, r.found_no_feedback, r.median_s_no_feedback),
        mode(&r.times_s_random, r.found_random, r.median_s_random),
        r.excluded_seed_cases
    )
}

/// Median seconds, a campaign that found nothing counting as the budget.
fn median(times: &[Option<f64>], budget: f64) -> f64 {
    shardfuzz_fuzz::guidance::median(times.iter().map(|t| t.unwrap_or(budget)).collect())
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
        random_generation: false,
        adaptive_generation: false,
        oracle: Oracle::default(),
        status: false,
        stop_on_finding: true,
        sync_dirs: vec![],
        minimize: None,
    };
    let s = run_campaign(&opts)?;
    let caused: Vec<f64> = s.findings.iter().filter(|f| caused_by_fault(f, out.path())).map(|f| f.first_seen_elapsed_s).collect();
    Ok(caused.into_iter().min_by(|a, b| a.total_cmp(b)))
}

/// Whether the fault caused finding `f`: the clean target does not fail the same way on its case.
fn caused_by_fault(f: &shardfuzz_fuzz::findings::Finding, out: &Path) -> bool {
    let Ok(case) = shardfuzz_harnesses::case::Case::load(&out.join("findings").join(&f.id).join("case.json")) else { return false };
    let Ok(mut clean) = registry::create("native", &TargetOptions { inject: vec![], timeout_ms: 10_000 }) else { return false };
    let v = evaluate(clean.as_mut(), &case, &Oracle::default());
    !(v.kind.is_finding() && v.signature(&case) == f.signature)
}

/// Seconds until a fresh random case (seeded from `seed`) fails on the buggy target in a way the
/// clean target does not, within `budget`.
fn time_to_finding_random(bug: &str, seed: u64, budget: Duration) -> anyhow::Result<Option<f64>> {
    let opts = TargetOptions { inject: vec![bug.to_string()], timeout_ms: 10_000 };
    let mut buggy = registry::create("native", &opts).map_err(|e| anyhow::anyhow!(e))?;
    let mut clean = registry::create("native", &TargetOptions { inject: vec![], timeout_ms: 10_000 }).map_err(|e| anyhow::anyhow!(e))?;
    let start = std::time::Instant::now();
    let mut i: u64 = 0;
    while start.elapsed() < budget {
        let case = shardfuzz_fuzz::generate::random_case(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(i));
        i += 1;
        let v = evaluate(buggy.as_mut(), &case, &Oracle::default());
        if v.kind.is_finding() {
            let c = evaluate(clean.as_mut(), &case, &Oracle::default());
            if !(c.kind.is_finding() && c.signature(&case) == v.signature(&case)) {
                return Ok(Some(start.elapsed().as_secs_f64()));
            }
        }
    }
    Ok(None)
}

/// Every campaign of one bug: `seeds` with feedback, `seeds` without.
fn bench_one(bug: Bug, a: &BugsArgs) -> anyhow::Result<BugResult> {
    let budget = a.budget.as_secs_f64();
    let name = bug.name();
    let tmp = tempfile::tempdir()?;
    let excluded = filtered_corpus(&a.corpus, name, tmp.path())?;
    let mut times = vec![];
    let mut times_nf = vec![];
    let mut times_rnd = vec![];
    for s in 0..a.seeds {
        if a.random {
            times_rnd.push(time_to_finding_random(name, s, a.budget)?);
        }
        if !a.no_feedback_only {
            times.push(time_to_finding(name, tmp.path(), s, a.budget, true)?);
        }
        if !a.feedback_only {
            times_nf.push(time_to_finding(name, tmp.path(), s, a.budget, false)?);
        }
    }
    Ok(BugResult {
        bug: name.to_string(),
        seeds: a.seeds,
        found: times.iter().filter(|t| t.is_some()).count() as u64,
        found_no_feedback: times_nf.iter().filter(|t| t.is_some()).count() as u64,
        median_s: median(&times, budget),
        median_s_no_feedback: median(&times_nf, budget),
        times_s: times,
        times_s_no_feedback: times_nf,
        excluded_seed_cases: excluded,
        found_random: times_rnd.iter().flatten().count() as u64,
        median_s_random: median(&times_rnd, budget),
        times_s_random: times_rnd,
    })
}

/// Every campaign of every bug taken together: the benchmark's overall medians with and without
/// feedback (`seeds` counts the campaigns of each mode).
fn pooled(results: &[BugResult], budget: f64) -> BugResult {
    let times: Vec<Option<f64>> = results.iter().flat_map(|r| r.times_s.iter().copied()).collect();
    let times_nf: Vec<Option<f64>> = results.iter().flat_map(|r| r.times_s_no_feedback.iter().copied()).collect();
    let times_rnd: Vec<Option<f64>> = results.iter().flat_map(|r| r.times_s_random.iter().copied()).collect();
    BugResult {
        bug: "all bugs (pooled campaigns)".into(),
        seeds: times.len().max(times_nf.len()) as u64,
        found: times.iter().flatten().count() as u64,
        found_no_feedback: times_nf.iter().flatten().count() as u64,
        median_s: median(&times, budget),
        median_s_no_feedback: median(&times_nf, budget),
        times_s: times,
        times_s_no_feedback: times_nf,
        excluded_seed_cases: results.iter().map(|r| r.excluded_seed_cases).sum(),
        found_random: times_rnd.iter().flatten().count() as u64,
        median_s_random: median(&times_rnd, budget),
        times_s_random: times_rnd,
    }
}

/// Runs `shardfuzz bench bugs --bug B --json` for every bug, `jobs` processes at a time (the
/// coverage map is per process), and collects their results.
fn in_child_processes(bugs: &[Bug], a: &BugsArgs) -> anyhow::Result<Vec<BugResult>> {
    let exe = std::env::current_exe()?;
    let scratch = tempfile::tempdir()?;
    let mut pending: Vec<Bug> = bugs.iter().rev().copied().collect();
    let mut running: Vec<(Bug, std::process::Child)> = vec![];
    let mut results = vec![];
    while !pending.is_empty() || !running.is_empty() {
        while running.len() < a.jobs {
            let Some(bug) = pending.pop() else { break };
            let mut cmd = std::process::Command::new(&exe);
            cmd.args(["bench", "bugs", "--json", "--bug", bug.name(), "--seeds", &a.seeds.to_string()])
                .args(["--budget", &format!("{}s", a.budget.as_secs_f64())])
                .arg("--corpus")
                .arg(&a.corpus)
                .arg("--csv")
                .arg(scratch.path().join(format!("{}.csv", bug.name())))
                .stdout(std::process::Stdio::piped());
            if a.feedback_only {
                cmd.arg("--feedback-only");
            }
            if a.no_feedback_only {
                cmd.arg("--no-feedback-only");
            }
            if a.random {
                cmd.arg("--random");
            }
            running.push((bug, cmd.spawn()?));
        }
        std::thread::sleep(Duration::from_millis(200));
        let mut still = vec![];
        for (bug, mut child) in running {
            if child.try_wait()?.is_none() {
                still.push((bug, child));
                continue;
            }
            let out = child.wait_with_output()?;
            anyhow::ensure!(out.status.success(), "the campaigns of {} failed ({})", bug.name(), out.status);
            let mut r: Vec<BugResult> = serde_json::from_slice(&out.stdout)?;
            let r = r.pop().ok_or_else(|| anyhow::anyhow!("no result for {}", bug.name()))?;
            eprintln!("{}", progress_line(&r));
            results.push(r);
        }
        running = still;
    }
    Ok(results)
}

/// A run's median is censored when at least half its campaigns found nothing: the median is then
/// the budget, and the true one is larger.
fn censored(found: u64, seeds: u64) -> bool {
    seeds > 0 && 2 * found <= seeds
}

/// How the no-feedback median compares with the feedback one: a ratio, a lower bound on it (the
/// no-feedback runs mostly found nothing, so their median is the budget), or unknown (the feedback
/// runs mostly found nothing).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ratio {
    Measured(f64),
    AtLeast(f64),
    Unknown,
    /// One of the modes was skipped (`--feedback-only`, `--no-feedback-only`).
    NotRun,
}

fn ratio(r: &BugResult) -> Ratio {
    let x = r.median_s_no_feedback / r.median_s.max(1e-3);
    if r.times_s.is_empty() || r.times_s_no_feedback.is_empty() {
        Ratio::NotRun
    } else if censored(r.found, r.seeds) {
        Ratio::Unknown
    } else if censored(r.found_no_feedback, r.seeds) {
        Ratio::AtLeast(x)
    } else {
        Ratio::Measured(x)
    }
}

/// One line of the table: the feedback and no-feedback columns, with censored medians marked `>`
/// and the ratio as `ratio` classifies it.
fn table_row(r: &BugResult) -> String {
    // One mode's found and median columns; a skipped mode shows dashes, not a count of 0 and a NaN median.
    let mode = |times: &[Option<f64>], found: u64, m: f64| {
        if times.is_empty() {
            ("-".to_string(), "-".to_string())
        } else {
            let marker = if censored(found, r.seeds) { ">" } else { "" };
            (format!("{found}/{}", r.seeds), format!("{marker}{m:.2}"))
        }
    };
    let (found, median) = mode(&r.times_s, r.found, r.median_s);
    let (found_nf, median_nf) = mode(&r.times_s_no_feedback, r.found_no_feedback, r.median_s_no_feedback);
    let ratio = match ratio(r) {
        Ratio::Measured(x) => format!("{x:.1}"),
        Ratio::AtLeast(x) => format!(">={x:.1}"),
        Ratio::Unknown => "?".to_string(),
        Ratio::NotRun => "-".to_string(),
    };
    let (found_rnd, median_rnd) = mode(&r.times_s_random, r.found_random, r.median_s_random);
    format!("{:<32} {:>7} {:>9} {:>9} {:>14} {:>7} {:>9} {:>12}", r.bug, found, median, found_nf, median_nf, ratio, found_rnd, median_rnd)
}

/// One line of the CSV: the ratio column is empty when unknown, `ratio_is_lower_bound` as the table's `>=`.
fn csv_row(r: &BugResult) -> String {
    let (x, lower_bound) = match ratio(r) {
        Ratio::Measured(x) => (format!("{x:.2}"), false),
        Ratio::AtLeast(x) => (format!("{x:.2}"), true),
        Ratio::Unknown | Ratio::NotRun => (String::new(), false),
    };
    // A skipped mode leaves its found and median fields empty, as the table shows dashes.
    let mode = |times: &[Option<f64>], found: u64, m: f64| if times.is_empty() { ",".to_string() } else { format!("{found},{m:.3}") };
    format!(
        "{},{},{},{},{x},{lower_bound},{}\n",
        r.bug,
        r.seeds,
        mode(&r.times_s, r.found, r.median_s),
        mode(&r.times_s_no_feedback, r.found_no_feedback, r.median_s_no_feedback),
        mode(&r.times_s_random, r.found_random, r.median_s_random)
    )
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
    if let Some(n) = a.rates {
        return region_rates(&bugs, &a.corpus, n);
    }
    if a.per_dtype {
        if a.region_cases > 0 {
            region_per_dtype(&bugs, a.region_cases, a.seed, a.json)?;
        }
        return per_dtype(&bugs, a.json);
    }
    let results_by_bug = if a.jobs > 1 { in_child_processes(&bugs, &a)? } else { vec![] };
    let mut results = vec![];
    for bug in bugs {
        // Results from child processes were printed as they arrived.
        let r = match results_by_bug.iter().find(|r: &&BugResult| r.bug == bug.name()) {
            Some(r) => r.clone(),
            None => {
                let r = bench_one(bug, &a)?;
                if !a.json {
                    eprintln!("{}", progress_line(&r));
                }
                r
            }
        };
        results.push(r);
    }
    let all = (results.len() > 1).then(|| pooled(&results, a.budget.as_secs_f64()));
    let mut csv = String::from(
        "bug,seeds,found,median_s,found_no_feedback,median_s_no_feedback,ratio,ratio_is_lower_bound,found_random,median_s_random\n",
    );
    for r in results.iter().chain(&all) {
        csv += &csv_row(r);
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
        println!(
            "{:<32} {:>7} {:>9} {:>9} {:>14} {:>7} {:>9} {:>12}",
            "bug", "found", "median_s", "nf_found", "nf_median_s", "ratio", "rnd_found", "rnd_median_s"
        );
        for r in &results {
            println!("{}", table_row(r));
        }
        if let Some(all) = &all {
            println!("{}", table_row(all));
        }
        println!("A median of at least half the runs finding nothing is the budget, marked >: the ratio is then a lower bound (>=).");
        println!("csv: {}", a.csv.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// For each bug: the share of random cases, and of seed cases mutated 1–3 times, that trigger it.
fn region_rates(bugs: &[Bug], corpus: &Path, n: u64) -> anyhow::Result<ExitCode> {
    use rand::{Rng, SeedableRng};
    let limits = shardfuzz_harnesses::case::Limits::default();
    println!("{:<32} {:>12} {:>14}", "bug", "random", "seed+mutation");
    for bug in bugs {
        let name = bug.name();
        let tmp = tempfile::tempdir()?;
        filtered_corpus(corpus, name, tmp.path())?;
        let seeds = load_cases(tmp.path(), &mut std::io::sink());
        let opts = TargetOptions { inject: vec![name.to_string()], timeout_ms: 10_000 };
        let mut target = registry::create("native", &opts).map_err(|e| anyhow::anyhow!(e))?;
        let mut hits = |c: &shardfuzz_harnesses::case::Case| evaluate(target.as_mut(), c, &Oracle::default()).kind.is_finding() as u64;
        let random: u64 = (0..n).map(|i| hits(&shardfuzz_fuzz::generate::random_case(i ^ 0xabcd))).sum();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut mutated = 0;
        for _ in 0..n {
            let mut c = seeds[rng.gen_range(0..seeds.len())].clone();
            for _ in 0..rng.gen_range(1..=3) {
                if let Some((m, _)) = shardfuzz_fuzz::mutators::mutate_case(&c, &mut rng, &limits) {
                    c = m;
                }
            }
            mutated += hits(&c);
        }
        println!("{:<32} {:>12.5} {:>14.5}", name, random as f64 / n as f64, mutated as f64 / n as f64);
    }
    Ok(ExitCode::SUCCESS)
}

/// The dtypes `--per-dtype` measures, in table order.
const DTYPES: [shardfuzz_kernels::DType; 4] =
    [shardfuzz_kernels::DType::F64, shardfuzz_kernels::DType::F32, shardfuzz_kernels::DType::BF16, shardfuzz_kernels::DType::F16];

/// `--per-dtype --region-cases N`: detection over random cases in each fault's region, per dtype.
fn region_per_dtype(bugs: &[Bug], want: u64, seed: u64, json: bool) -> anyhow::Result<()> {
    use shardfuzz_fuzz::trigger_cases::region_detection;
    let dtypes = DTYPES;
    if !json {
        println!("random cases in each fault's region: found / fired (tries), seed {seed}");
        println!("{:<34} {:>16} {:>16} {:>16} {:>16}", "bug", "f64", "f32", "bf16", "f16");
    }
    for bug in bugs {
        let mut cells = vec![];
        for &d in &dtypes {
            let r = region_detection(bug.name(), d, 40 * want, want, seed).map_err(|e| anyhow::anyhow!(e))?;
            cells.push((d, r));
        }
        if json {
            let v: serde_json::Map<String, serde_json::Value> =
                cells.iter().map(|(d, r)| (d.to_string(), serde_json::to_value(r).expect("plain struct"))).collect();
            println!("{}", serde_json::json!({"bug": bug.name(), "region": v}));
        } else {
            let cell = |r: &shardfuzz_fuzz::trigger_cases::RegionDetection| format!("{}/{} ({})", r.found, r.fired, r.tries);
            let c: Vec<String> = cells.iter().map(|(_, r)| cell(r)).collect();
            println!("{:<34} {:>16} {:>16} {:>16} {:>16}", bug.name(), c[0], c[1], c[2], c[3]);
        }
    }
    Ok(())
}

/// `--per-dtype`: detection of each bug on its trigger case, dtype by dtype.
fn per_dtype(bugs: &[Bug], json: bool) -> anyhow::Result<ExitCode> {
    use shardfuzz_fuzz::trigger_cases::{detect_in_dtype, Detection};
    let dtypes = DTYPES;
    let mut rows = vec![];
    for bug in bugs {
        let cells: Vec<Detection> =
            dtypes.iter().map(|&d| detect_in_dtype(bug.name(), d)).collect::<Result<_, _>>().map_err(|e| anyhow::anyhow!(e))?;
        rows.push((bug.name(), cells));
    }
    let missed = rows.iter().flat_map(|(_, c)| c).filter(|c| matches!(c, Detection::Missed | Detection::CleanNotPass(_))).count();
    if json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(b, cells)| serde_json::json!({"bug": b, "dtypes": dtypes.iter().zip(cells).map(|(d, c)| (d.to_string(), serde_json::to_value(c).unwrap())).collect::<serde_json::Map<_, _>>()}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("{:<34} {:>10} {:>10} {:>10} {:>10}", "bug", "f64", "f32", "bf16", "f16");
        for (b, cells) in &rows {
            let cell = |c: &Detection| match c {
                Detection::Found => "found".to_string(),
                Detection::Missed => "MISSED".into(),
                Detection::DoesNotFire => "-".into(),
                Detection::CleanNotPass(k) => format!("clean {k}"),
                Detection::NoTriggerCase => "no case".into(),
            };
            println!("{b:<34} {:>10} {:>10} {:>10} {:>10}", cell(&cells[0]), cell(&cells[1]), cell(&cells[2]), cell(&cells[3]));
        }
        println!("(-: the bug leaves every output bit-identical in that dtype)");
    }
    Ok(if missed == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(found: u64, found_nf: u64, median: f64, median_nf: f64) -> BugResult {
        BugResult {
            bug: "b".into(),
            seeds: 5,
            found,
            found_no_feedback: found_nf,
            median_s: median,
            median_s_no_feedback: median_nf,
            times_s: (0..5).map(|i| (i < found).then_some(median)).collect(),
            times_s_no_feedback: (0..5).map(|i| (i < found_nf).then_some(median_nf)).collect(),
            excluded_seed_cases: 0,
            found_random: 0,
            median_s_random: f64::NAN,
            times_s_random: vec![],
        }
    }

    #[test]
    fn a_skipped_mode_shows_dashes_not_a_nan_median() {
        let r = BugResult { times_s_no_feedback: vec![], median_s_no_feedback: f64::NAN, ..result(5, 0, 12.0, 0.0) };
        let row = table_row(&r);
        assert!(!row.contains("NaN") && row.contains("5/5") && row.contains("12.00"), "{row}");
        assert!(row.split_whitespace().skip(3).all(|c| c == "-"), "{row}");
        assert_eq!(csv_row(&r), "b,5,5,12.000,,,,false,,\n");
        assert!(progress_line(&r).contains("no feedback skipped"), "{}", progress_line(&r));
    }

    #[test]
    fn a_median_over_runs_that_mostly_found_nothing_is_marked_and_its_ratio_is_a_lower_bound() {
        assert!(censored(2, 5) && !censored(3, 5) && censored(0, 4) && censored(2, 4));
        let row = table_row(&result(5, 1, 12.0, 60.0));
        assert!(row.contains(" 12.00 ") && row.contains(">60.00") && row.contains(">=5.0"), "{row}");
        let row = table_row(&result(5, 4, 10.0, 30.0));
        assert!(!row.contains('>') && row.split_whitespace().nth(5) == Some("3.0"), "{row}");
        // Nothing is known of the ratio when the feedback runs themselves mostly found nothing.
        assert_eq!(table_row(&result(2, 0, 60.0, 60.0)).split_whitespace().nth(5), Some("?"));
        // The CSV says the same.
        assert!(csv_row(&result(5, 1, 12.0, 60.0)).ends_with(",5.00,true,,\n"));
        assert!(csv_row(&result(5, 4, 10.0, 30.0)).ends_with(",3.00,false,,\n"));
        assert!(csv_row(&result(2, 0, 60.0, 60.0)).ends_with(",,false,,\n"));
    }

    #[test]
    fn the_pooled_row_takes_the_median_over_every_campaign_of_every_bug() {
        let with = |times: Vec<Option<f64>>, times_nf: Vec<Option<f64>>| BugResult {
            times_s: times,
            times_s_no_feedback: times_nf,
            ..result(0, 0, 0.0, 0.0)
        };
        let a = with(vec![Some(1.0), Some(2.0), Some(3.0)], vec![None, None, Some(10.0)]);
        let b = with(vec![Some(4.0), None, Some(5.0)], vec![Some(20.0), None, Some(30.0)]);
        let all = pooled(&[a, b], 60.0);
        assert_eq!((all.seeds, all.found, all.found_no_feedback), (6, 5, 3));
        // Feedback: 1 2 3 4 5 60 → 3.5. Without: 10 20 30 60 60 60 → 45, censored (half found
        // nothing), so the ratio 45 / 3.5 is a lower bound.
        assert_eq!(all.median_s, 3.5);
        assert_eq!(all.median_s_no_feedback, 45.0);
        assert!(table_row(&all).contains(">=12.9"), "{}", table_row(&all));
    }
}
