//! A campaign: the out directory (AFL-like), the LibAFL wiring, resume, the status line and stats.
//!
//! ```text
//! out/queue/<hash>.json        corpus (the same JSON as hand-written cases)
//! out/findings/<id>/           case.json + verdict.json per deduplicated finding
//! out/stats.csv                elapsed_s,execs,execs_per_sec,corpus,edges,findings,rss_mb,framework_cov
//! out/fuzz.log                 what happened, with timestamps
//! ```

use std::io::Write;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use libafl::corpus::{Corpus, InMemoryCorpus, InMemoryOnDiskCorpus};
use libafl::events::SimpleEventManager;
use libafl::feedbacks::{ConstFeedback, MaxMapFeedback};
use libafl::monitors::NopMonitor;
use libafl::observers::{HitcountsMapObserver, StdMapObserver};
use libafl::stages::StdMutationalStage;
use libafl::state::{HasCorpus, HasExecutions, StdState};
use libafl::{Evaluator, Fuzzer, StdFuzzer};
use libafl_bolts::rands::StdRand;
use libafl_bolts::tuples::tuple_list;
use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::target::registry::{self, TargetOptions};

use crate::coverage;
use crate::executor::CaseExecutor;
use crate::findings::{Finding, FindingStore};
use crate::generate::random_case;
use crate::input::{case_digest, CaseInput};
use crate::mutators::SemanticMutator;
use crate::oracle::Oracle;
use crate::scheduler::RareFeatureScheduler;

/// Rounds (one corpus entry mutated up to 8 times) between two fresh random cases, unless
/// `--adaptive-generation` lets the share follow the yields (`generation_share`).
const FRESH_EVERY_ROUNDS: u64 = 64;

/// Everything `shardfuzz fuzz` needs.
#[derive(Debug, Clone)]
pub struct CampaignOptions {
    pub target: String,
    pub target_options: TargetOptions,
    pub corpus: Option<PathBuf>,
    pub out: PathBuf,
    pub time: Option<Duration>,
    pub execs: Option<u64>,
    pub seed: u64,
    pub feedback: bool,
    /// Pure random generation: every execution a fresh random case, no corpus, no mutation, no
    /// feedback (the baseline guidance is measured against).
    pub random_generation: bool,
    /// With feedback, the share of fresh cases follows what fresh cases and mutations have been
    /// finding lately (`generation_share`) instead of one fresh case every 64 rounds.
    pub adaptive_generation: bool,
    pub oracle: Oracle,
    /// Print the status line once a second.
    pub status: bool,
    /// Stop at the first finding (benchmarks).
    pub stop_on_finding: bool,
    /// Queue directories of sibling campaigns whose new entries are imported every few seconds
    /// (parallel jobs on one machine, or nodes sharing a synced directory).
    pub sync_dirs: Vec<PathBuf>,
    /// Minimize every new finding in the background, within this budget each.
    pub minimize: Option<crate::minimize::Budget>,
}

/// What a campaign did.
#[derive(Debug, Clone)]
pub struct CampaignSummary {
    pub execs: u64,
    /// Executions some target could express (not `unsupported` on every target): the cases that ran.
    pub expressed: u64,
    pub elapsed_s: f64,
    pub corpus: usize,
    pub coverage: usize,
    /// Distinct framework line/branch events reported by Python targets (`framework_cov`).
    pub framework_cov: usize,
    pub edges_instrumented: usize,
    /// Every finding of the out directory (old and new).
    pub findings: Vec<Finding>,
    /// Signatures first seen in this run.
    pub new_signatures: Vec<String>,
    /// Seconds spent inside the target and oracle.
    pub target_s: f64,
    /// Seconds this process fuzzed (the overhead is 1 − target_s / process_s).
    pub process_s: f64,
}

/// Reads every `*.json` case under `dir`; a malformed file is a warning naming it and the field.
pub fn load_cases(dir: &Path, log: &mut impl Write) -> Vec<Case> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(_) => return vec![],
    };
    files.sort();
    let mut cases = vec![];
    for p in files {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with('.') || p.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        match Case::load(&p) {
            Ok(c) => cases.push(c),
            Err(e) => {
                let msg = match e {
                    shardfuzz_harnesses::case::CaseError::Io { .. } => format!("warning: {e}, skipped"),
                    _ => format!("warning: {}: {e}, skipped", p.display()),
                };
                eprintln!("{msg}");
                let _ = writeln!(log, "{msg}");
            }
        }
    }
    cases
}

/// Campaign seconds and executions already spent (the last complete line of stats.csv; a line
/// torn by a kill is skipped).
fn previous_progress(stats: &Path) -> (f64, u64) {
    std::fs::read_to_string(stats)
        .ok()
        .and_then(|t| {
            t.lines().rev().find_map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                (f.len() >= 6).then(|| Some((f[0].parse::<f64>().ok()?, f[1].parse::<u64>().ok()?))).flatten()
            })
        })
        .unwrap_or((0.0, 0))
}

/// This process's resident set size in MiB (0 where /proc is not available).
pub fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok());
    kb.unwrap_or(0.0) / 1024.0
}

fn hms(s: f64) -> String {
    let s = s as u64;
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// A fresh random case: with library ops to draw from, three in four are library-op cases.
fn fresh_case(seed: u64, vocabulary: &crate::library_ops::Vocabulary) -> Case {
    if seed % 4 != 0 {
        if let Some(c) = crate::library_ops::random_library_case(seed, vocabulary) {
            return c;
        }
    }
    random_case(seed)
}

pub fn run_campaign(opts: &CampaignOptions) -> anyhow::Result<CampaignSummary> {
    let out = &opts.out;
    std::fs::create_dir_all(out.join("queue"))?;
    let mut log = std::fs::OpenOptions::new().create(true).append(true).open(out.join("fuzz.log"))?;
    let stats_path = out.join("stats.csv");
    let (elapsed_base, execs_base) = previous_progress(&stats_path);
    let new_stats = !stats_path.exists();
    let mut stats = std::fs::OpenOptions::new().create(true).append(true).open(&stats_path)?;
    if new_stats {
        writeln!(stats, "elapsed_s,execs,execs_per_sec,corpus,edges,findings,rss_mb,framework_cov")?;
    }
    let mut targets = vec![];
    for name in opts.target.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        targets.push(registry::create(name, &opts.target_options).map_err(|e| anyhow::anyhow!("--target: {e}"))?);
    }
    anyhow::ensure!(!targets.is_empty(), "--target: no target named");
    let mut ops = vec![];
    for t in targets.iter_mut() {
        ops.extend(t.vocabulary().map_err(|e| anyhow::anyhow!("--target: {e}"))?);
    }
    let vocabulary = std::sync::Arc::new(crate::library_ops::Vocabulary::new(ops));
    if !vocabulary.is_empty() {
        writeln!(log, "[{}] library ops: {}", hms(elapsed_base), vocabulary.entries.len())?;
    }
    let fresh_case = |seed: u64| fresh_case(seed, &vocabulary);
    let store = FindingStore::open(&out.join("findings"))?;
    let use_feedback = opts.feedback && !opts.random_generation;
    writeln!(
        log,
        "[{}] start: target {} seed {} feedback {}{} (resumed at {elapsed_base:.0} s)",
        hms(elapsed_base),
        opts.target,
        opts.seed,
        use_feedback,
        if opts.random_generation { " (pure random generation)" } else { "" }
    )?;

    // Coverage map → observer → feedback. Objectives are recorded by our own deduplicating store.
    let observer = HitcountsMapObserver::new(unsafe { StdMapObserver::from_mut_ptr("coverage", coverage::map_ptr(), coverage::MAP_SIZE) });
    let mut feedback = MaxMapFeedback::new(&observer);
    let mut objective = ConstFeedback::new(false);
    let mut state = StdState::new(
        StdRand::with_seed(opts.seed),
        // One file per entry: no LibAFL lock or metadata files (three file creations per entry
        // were a tenth of a campaign's time). Entries are named by content, so two jobs sharing a
        // queue write the same name with the same bytes.
        InMemoryOnDiskCorpus::<CaseInput>::with_meta_format_and_prefix(out.join("queue"), None, None, false)?,
        InMemoryCorpus::<CaseInput>::new(),
        &mut feedback,
        &mut objective,
    )?;
    let mut fuzzer = StdFuzzer::new(RareFeatureScheduler::new(), feedback, objective);
    let mut executor = CaseExecutor::new(tuple_list!(observer), targets, opts.oracle, store, use_feedback, elapsed_base);
    let mut mgr = SimpleEventManager::new(NopMonitor::new());
    let mut stages = tuple_list!(StdMutationalStage::with_max_iterations(
        SemanticMutator::new().with_vocabulary(vocabulary.clone()).with_offered(&registry::offered(&opts.target)),
        NonZeroUsize::new(8).expect("8 > 0")
    ));

    let started = Instant::now();
    // Seeds: the queue of a resumed campaign, then --corpus; random cases if there is nothing.
    let mut seeds = load_cases(&out.join("queue"), &mut log);
    if let Some(dir) = opts.corpus.as_ref().filter(|_| !opts.random_generation) {
        seeds.extend(load_cases(dir, &mut log));
    }
    if seeds.is_empty() && !opts.random_generation {
        seeds = (0..16).map(|i| fresh_case(opts.seed.wrapping_add(i))).collect();
    }
    let mut digests = std::collections::HashSet::new();
    for case in seeds {
        if digests.insert(case_digest(&case)) {
            fuzzer.add_input(&mut state, &mut executor, &mut mgr, CaseInput(case))?;
        }
    }
    writeln!(log, "[{}] {} seed cases loaded", hms(executor.elapsed()), state.corpus().count())?;

    let minimizer =
        opts.minimize.map(|b| crate::minimize::background::BackgroundMinimizer::start(opts.target_options.clone(), opts.oracle, b));
    let mut last_status = Instant::now();
    let mut last_stats = Instant::now();
    let mut last_execs = *state.executions();
    // Campaign seeds 0, 1, 2 … must start far apart: consecutive starts would draw the same fresh
    // cases shifted by one (two "independent" random-generation runs were the same run).
    let mut fresh = opts.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5eed;
    let mut round: u64 = 0;
    let mut share = crate::generation_share::GenerationShare::default();
    let mut imported: std::collections::HashSet<PathBuf> = std::collections::HashSet::new();
    let mut last_sync = Instant::now() - Duration::from_secs(60);
    let write_stats =
        |stats: &mut std::fs::File, elapsed: f64, execs: u64, rate: f64, corpus: usize, cov: (usize, usize), findings: usize| {
            writeln!(stats, "{elapsed:.1},{},{rate:.1},{corpus},{},{findings},{:.0},{}", execs_base + execs, cov.0, rss_mb(), cov.1)
        };
    loop {
        let stop = opts.time.is_some_and(|t| started.elapsed() >= t)
            || opts.execs.is_some_and(|n| *state.executions() >= n)
            || (opts.stop_on_finding && !executor.store.findings.is_empty());
        if stop {
            break;
        }
        let before = (*state.executions(), state.corpus().count());
        if !opts.random_generation {
            fuzzer.fuzz_one(&mut stages, &mut executor, &mut state, &mut mgr)?;
        }
        let round_execs = *state.executions() - before.0;
        share.record_mutations(round_execs, (state.corpus().count() - before.1) as u64);
        // Fresh cases keep the search from narrowing onto the seeds: with feedback as many as the
        // yields say (`generation_share`), without it one every few rounds. Pure random
        // generation runs one every round and nothing else.
        round += 1;
        let n_fresh = match (opts.random_generation, use_feedback) {
            (true, _) => 1,
            (false, true) if opts.adaptive_generation => share.fresh_after(round_execs),
            (false, _) => usize::from(round % FRESH_EVERY_ROUNDS == 0),
        };
        for _ in 0..n_fresh {
            fresh = fresh.wrapping_add(1);
            let entries = state.corpus().count();
            fuzzer.evaluate_input(&mut state, &mut executor, &mut mgr, &CaseInput(fresh_case(fresh)))?;
            share.record_fresh((state.corpus().count() - entries) as u64);
        }
        for sig in std::mem::take(&mut executor.new_findings) {
            writeln!(log, "[{}] new finding: {sig}", hms(executor.elapsed()))?;
            if let Some(m) = &minimizer {
                m.submit(out.join("findings").join(crate::oracle::signature_id(&sig)));
            }
        }
        if !opts.sync_dirs.is_empty() && last_sync.elapsed() >= Duration::from_secs(3) {
            last_sync = Instant::now();
            for dir in &opts.sync_dirs {
                let Ok(rd) = std::fs::read_dir(dir) else { continue };
                for p in rd.filter_map(|e| e.ok().map(|e| e.path())) {
                    let hidden = p.file_name().and_then(|n| n.to_str()).is_none_or(|n| n.starts_with('.'));
                    if hidden || !imported.insert(p.clone()) {
                        continue;
                    }
                    if let Ok(c) = Case::load(&p) {
                        if digests.insert(case_digest(&c)) {
                            fuzzer.evaluate_input(&mut state, &mut executor, &mut mgr, &CaseInput(c))?;
                        }
                    }
                }
            }
        }
        if last_status.elapsed() >= Duration::from_secs(1) {
            let execs = *state.executions();
            let rate = (execs - last_execs) as f64 / last_status.elapsed().as_secs_f64();
            last_execs = execs;
            last_status = Instant::now();
            if opts.status {
                let kinds = executor.store.count_by_kind();
                let k = |n: &str| kinds.get(n).copied().unwrap_or(0);
                eprintln!(
                    "[{}] execs {execs} | {rate:.0}/s | corpus {} | coverage {} (edges {}) | findings {} (divergent {}, crash {}, hang {})",
                    hms(executor.elapsed()),
                    state.corpus().count(),
                    executor.coverage,
                    if coverage::edge_guards() > 0 { "on" } else { "off" },
                    executor.store.findings.len(),
                    k("divergent"),
                    k("crash"),
                    k("hang")
                );
            }
            if last_stats.elapsed() >= Duration::from_secs(2) {
                write_stats(
                    &mut stats,
                    executor.elapsed(),
                    execs,
                    rate,
                    state.corpus().count(),
                    (executor.coverage, executor.framework_lines.len()),
                    executor.store.findings.len(),
                )?;
                last_stats = Instant::now();
                executor.store.flush()?;
            }
        }
    }
    let rate = *state.executions() as f64 / started.elapsed().as_secs_f64().max(1e-9);
    write_stats(
        &mut stats,
        executor.elapsed(),
        *state.executions(),
        rate,
        state.corpus().count(),
        (executor.coverage, executor.framework_lines.len()),
        executor.store.findings.len(),
    )?;
    executor.store.flush()?;
    if let Some(m) = minimizer {
        for line in m.finish() {
            writeln!(log, "[{}] {line}", hms(executor.elapsed()))?;
        }
    }
    let new_signatures: Vec<String> =
        executor.store.findings.values().filter(|f| f.first_seen_elapsed_s >= elapsed_base).map(|f| f.signature.clone()).collect();
    let by_kind: Vec<String> = executor.verdicts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    writeln!(
        log,
        "[{}] stop: {} execs ({}), {} findings",
        hms(executor.elapsed()),
        state.executions(),
        by_kind.join(", "),
        executor.store.findings.len()
    )?;
    Ok(CampaignSummary {
        execs: *state.executions(),
        expressed: executor.expressed,
        elapsed_s: executor.elapsed(),
        corpus: state.corpus().count(),
        coverage: executor.coverage,
        framework_cov: executor.framework_lines.len(),
        edges_instrumented: coverage::edge_guards(),
        findings: executor.store.findings.values().cloned().collect(),
        new_signatures,
        target_s: executor.target_time.as_secs_f64(),
        process_s: started.elapsed().as_secs_f64(),
    })
}
