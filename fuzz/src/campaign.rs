//! A campaign: the out directory (AFL-like), the LibAFL wiring, resume, the status line and stats.
//!
//! ```text
//! out/queue/<hash>.json        corpus (the same JSON as hand-written cases)
//! out/findings/<id>/           case.json + verdict.json per deduplicated finding
//! out/stats.csv                elapsed_s,execs,execs_per_sec,corpus,edges,findings,rss_mb,framework_cov
//! out/fuzz.log                 what happened, with timestamps
//! ```

use std::collections::HashSet;
use std::io::Write;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
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
use shardfuzz_harnesses::target::Target;

use crate::coverage;
use crate::executor::CaseExecutor;
use crate::findings::{Finding, FindingStore};
use crate::generate::random_case;
use crate::input::{case_digest, CaseInput};
use crate::library_ops::Vocabulary;
use crate::minimize::background::BackgroundMinimizer;
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
    let mut journal = Journal::open(out)?;
    let elapsed_base = journal.elapsed_base;
    let (targets, vocabulary) = open_targets(opts)?;
    if !vocabulary.is_empty() {
        journal.note(elapsed_base, format_args!("library ops: {}", vocabulary.entries.len()))?;
    }
    let fresh_case = |seed: u64| fresh_case(seed, &vocabulary);
    let store = FindingStore::open(&out.join("findings"))?;
    let use_feedback = opts.feedback && !opts.random_generation;
    journal.note(
        elapsed_base,
        format_args!(
            "start: target {} seed {} feedback {}{} (resumed at {elapsed_base:.0} s)",
            opts.target,
            opts.seed,
            use_feedback,
            if opts.random_generation { " (pure random generation)" } else { "" }
        ),
    )?;

    // Coverage map → observer → feedback. Objectives are recorded by our own deduplicating store.
    let observer = HitcountsMapObserver::new(unsafe { StdMapObserver::from_mut_ptr("coverage", coverage::map_ptr(), coverage::MAP_SIZE) });
    let mut feedback = MaxMapFeedback::new(&observer);
    let mut objective = ConstFeedback::new(false);
    let mut state = new_state(opts, &mut feedback, &mut objective)?;
    let mut fuzzer = StdFuzzer::new(RareFeatureScheduler::new(), feedback, objective);
    let mut executor = CaseExecutor::new(tuple_list!(observer), targets, opts.oracle, store, use_feedback, elapsed_base);
    let mut mgr = SimpleEventManager::new(NopMonitor::new());
    let mut stages = tuple_list!(StdMutationalStage::with_max_iterations(
        SemanticMutator::new().with_vocabulary(vocabulary.clone()).with_offered(&registry::offered(&opts.target)),
        NonZeroUsize::new(8).expect("8 > 0")
    ));

    let started = Instant::now();
    let mut digests = HashSet::new();
    for case in seed_cases(opts, &mut journal.log, fresh_case) {
        if digests.insert(case_digest(&case)) {
            fuzzer.add_input(&mut state, &mut executor, &mut mgr, CaseInput(case))?;
        }
    }
    // (The exact time tells findings of the seeds, found while they load, from the search's.)
    journal.note(executor.elapsed(), format_args!("{} seed cases loaded at {:.2} s", state.corpus().count(), executor.elapsed()))?;

    let minimizer = opts.minimize.map(|b| BackgroundMinimizer::start(opts.target_options.clone(), opts.oracle, b));
    let mut ticker = Ticker::new(*state.executions());
    // Campaign seeds 0, 1, 2 … must start far apart: consecutive starts would draw the same fresh
    // cases shifted by one (two "independent" random-generation runs were the same run).
    let mut fresh = opts.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5eed;
    let mut round: u64 = 0;
    let mut share = crate::generation_share::GenerationShare::default();
    let mut sync = SyncDirs::default();
    while !should_stop(opts, started, *state.executions(), &executor.store) {
        let before = (*state.executions(), state.corpus().count());
        if !opts.random_generation {
            fuzzer.fuzz_one(&mut stages, &mut executor, &mut state, &mut mgr)?;
        }
        let round_execs = *state.executions() - before.0;
        share.record_mutations(round_execs, (state.corpus().count() - before.1) as u64);
        round += 1;
        for _ in 0..fresh_this_round(opts, use_feedback, round, round_execs, &mut share) {
            fresh = fresh.wrapping_add(1);
            let entries = state.corpus().count();
            fuzzer.evaluate_input(&mut state, &mut executor, &mut mgr, &CaseInput(fresh_case(fresh)))?;
            share.record_fresh((state.corpus().count() - entries) as u64);
        }
        journal.new_findings(&mut executor, minimizer.as_ref(), out)?;
        for case in sync.new_cases(&opts.sync_dirs, &mut digests) {
            fuzzer.evaluate_input(&mut state, &mut executor, &mut mgr, &CaseInput(case))?;
        }
        ticker.tick(*state.executions(), state.corpus().count(), &mut executor, &mut journal, opts.status)?;
    }
    let (execs, corpus) = (*state.executions(), state.corpus().count());
    let rate = execs as f64 / started.elapsed().as_secs_f64().max(1e-9);
    journal.sample(&Progress::of(&executor, execs, corpus, rate))?;
    journal.finish(&mut executor, minimizer, execs)?;
    Ok(summary(&executor, execs, corpus, started, elapsed_base))
}

/// The campaign's LibAFL state.
type State = StdState<InMemoryOnDiskCorpus<CaseInput>, CaseInput, StdRand, InMemoryCorpus<CaseInput>>;

fn new_state<F, O>(opts: &CampaignOptions, feedback: &mut F, objective: &mut O) -> anyhow::Result<State>
where
    F: libafl::feedbacks::StateInitializer<State>,
    O: libafl::feedbacks::StateInitializer<State>,
{
    Ok(StdState::new(
        StdRand::with_seed(opts.seed),
        // One file per entry: no LibAFL lock or metadata files (three file creations per entry
        // were a tenth of a campaign's time). Entries are named by content, so two jobs sharing a
        // queue write the same name with the same bytes.
        InMemoryOnDiskCorpus::<CaseInput>::with_meta_format_and_prefix(opts.out.join("queue"), None, None, false)?,
        InMemoryCorpus::<CaseInput>::new(),
        feedback,
        objective,
    )?)
}

fn should_stop(opts: &CampaignOptions, started: Instant, execs: u64, store: &FindingStore) -> bool {
    opts.time.is_some_and(|t| started.elapsed() >= t)
        || opts.execs.is_some_and(|n| execs >= n)
        || (opts.stop_on_finding && !store.findings.is_empty())
}

/// The targets a campaign runs on.
type Targets = Vec<Box<dyn Target>>;

/// The targets a campaign runs on, and the library ops they offer together.
fn open_targets(opts: &CampaignOptions) -> anyhow::Result<(Targets, Arc<Vocabulary>)> {
    let mut targets = vec![];
    for name in opts.target.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        targets.push(registry::create(name, &opts.target_options).map_err(|e| anyhow::anyhow!("--target: {e}"))?);
    }
    anyhow::ensure!(!targets.is_empty(), "--target: no target named");
    let mut ops = vec![];
    for t in targets.iter_mut() {
        ops.extend(t.vocabulary().map_err(|e| anyhow::anyhow!("--target: {e}"))?);
    }
    Ok((targets, Arc::new(Vocabulary::new(ops))))
}

/// Seeds: the queue of a resumed campaign, then --corpus; random cases if there is nothing.
fn seed_cases(opts: &CampaignOptions, log: &mut impl Write, fresh_case: impl Fn(u64) -> Case) -> Vec<Case> {
    let mut seeds = load_cases(&opts.out.join("queue"), log);
    if let Some(dir) = opts.corpus.as_ref().filter(|_| !opts.random_generation) {
        seeds.extend(load_cases(dir, log));
    }
    if seeds.is_empty() && !opts.random_generation {
        seeds = (0..16).map(|i| fresh_case(opts.seed.wrapping_add(i))).collect();
    }
    seeds
}

/// Fresh cases keep the search from narrowing onto the seeds: with feedback as many as the
/// yields say (`generation_share`), without it one every few rounds. Pure random generation runs
/// one every round and nothing else.
fn fresh_this_round(
    opts: &CampaignOptions,
    use_feedback: bool,
    round: u64,
    round_execs: u64,
    share: &mut crate::generation_share::GenerationShare,
) -> usize {
    match (opts.random_generation, use_feedback) {
        (true, _) => 1,
        (false, true) if opts.adaptive_generation => share.fresh_after(round_execs),
        (false, _) => usize::from(round % FRESH_EVERY_ROUNDS == 0),
    }
}

fn summary<OT>(executor: &CaseExecutor<OT>, execs: u64, corpus: usize, started: Instant, elapsed_base: f64) -> CampaignSummary {
    CampaignSummary {
        execs,
        expressed: executor.expressed,
        elapsed_s: executor.elapsed(),
        corpus,
        coverage: executor.coverage,
        framework_cov: executor.framework_lines.len(),
        edges_instrumented: coverage::edge_guards(),
        findings: executor.store.findings.values().cloned().collect(),
        new_signatures: executor
            .store
            .findings
            .values()
            .filter(|f| f.first_seen_elapsed_s >= elapsed_base)
            .map(|f| f.signature.clone())
            .collect(),
        target_s: executor.target_time.as_secs_f64(),
        process_s: started.elapsed().as_secs_f64(),
    }
}

/// An out directory's fuzz.log and stats.csv, and where a resumed campaign left off.
struct Journal {
    log: std::fs::File,
    stats: std::fs::File,
    elapsed_base: f64,
    execs_base: u64,
}

impl Journal {
    fn open(out: &Path) -> anyhow::Result<Self> {
        let append = |p: &Path| std::fs::OpenOptions::new().create(true).append(true).open(p);
        let log = append(&out.join("fuzz.log"))?;
        let stats_path = out.join("stats.csv");
        let (elapsed_base, execs_base) = previous_progress(&stats_path);
        let new_stats = !stats_path.exists();
        let mut stats = append(&stats_path)?;
        if new_stats {
            writeln!(stats, "elapsed_s,execs,execs_per_sec,corpus,edges,findings,rss_mb,framework_cov")?;
        }
        Ok(Self { log, stats, elapsed_base, execs_base })
    }

    /// A fuzz.log line stamped with the campaign time.
    fn note(&mut self, elapsed: f64, what: impl std::fmt::Display) -> std::io::Result<()> {
        writeln!(self.log, "[{}] {what}", hms(elapsed))
    }

    /// A stats.csv row (executions counted from the campaign's start, resumes included).
    fn sample(&mut self, p: &Progress) -> std::io::Result<()> {
        writeln!(
            self.stats,
            "{:.1},{},{:.1},{},{},{},{:.0},{}",
            p.elapsed,
            self.execs_base + p.execs,
            p.rate,
            p.corpus,
            p.coverage,
            p.findings,
            rss_mb(),
            p.framework_cov
        )
    }

    /// Logs the findings of the last executions and hands each to the background minimizer.
    fn new_findings<OT>(
        &mut self,
        executor: &mut CaseExecutor<OT>,
        minimizer: Option<&BackgroundMinimizer>,
        out: &Path,
    ) -> std::io::Result<()> {
        for sig in std::mem::take(&mut executor.new_findings) {
            self.note(executor.elapsed(), format_args!("new finding: {sig}"))?;
            if let Some(m) = minimizer {
                m.submit(out.join("findings").join(crate::oracle::signature_id(&sig)));
            }
        }
        Ok(())
    }

    /// Flushes the findings, waits for the minimizer and logs the campaign's totals.
    fn finish<OT>(&mut self, executor: &mut CaseExecutor<OT>, minimizer: Option<BackgroundMinimizer>, execs: u64) -> anyhow::Result<()> {
        executor.store.flush()?;
        if let Some(m) = minimizer {
            for line in m.finish() {
                self.note(executor.elapsed(), line)?;
            }
        }
        let by_kind: Vec<String> = executor.verdicts.iter().map(|(k, n)| format!("{k} {n}")).collect();
        self.note(
            executor.elapsed(),
            format_args!("stop: {execs} execs ({}), {} findings", by_kind.join(", "), executor.store.findings.len()),
        )?;
        Ok(())
    }
}

/// Where a campaign stands: what the status line and stats.csv show.
struct Progress {
    elapsed: f64,
    execs: u64,
    rate: f64,
    corpus: usize,
    coverage: usize,
    framework_cov: usize,
    findings: usize,
}

impl Progress {
    fn of<OT>(executor: &CaseExecutor<OT>, execs: u64, corpus: usize, rate: f64) -> Self {
        Self {
            elapsed: executor.elapsed(),
            execs,
            rate,
            corpus,
            coverage: executor.coverage,
            framework_cov: executor.framework_lines.len(),
            findings: executor.store.findings.len(),
        }
    }

    fn status_line(&self, store: &FindingStore) -> String {
        let kinds = store.count_by_kind();
        let k = |n: &str| kinds.get(n).copied().unwrap_or(0);
        format!(
            "[{}] execs {} | {:.0}/s | corpus {} | coverage {} (edges {}) | findings {} (divergent {}, crash {}, hang {})",
            hms(self.elapsed),
            self.execs,
            self.rate,
            self.corpus,
            self.coverage,
            if coverage::edge_guards() > 0 { "on" } else { "off" },
            self.findings,
            k("divergent"),
            k("crash"),
            k("hang")
        )
    }
}

/// Once a second the status line (when asked for); every two seconds a stats.csv row, and the
/// findings flushed.
struct Ticker {
    last_status: Instant,
    last_stats: Instant,
    last_execs: u64,
}

impl Ticker {
    fn new(execs: u64) -> Self {
        Self { last_status: Instant::now(), last_stats: Instant::now(), last_execs: execs }
    }

    fn tick<OT>(
        &mut self,
        execs: u64,
        corpus: usize,
        executor: &mut CaseExecutor<OT>,
        journal: &mut Journal,
        status: bool,
    ) -> anyhow::Result<()> {
        if self.last_status.elapsed() < Duration::from_secs(1) {
            return Ok(());
        }
        let rate = (execs - self.last_execs) as f64 / self.last_status.elapsed().as_secs_f64();
        self.last_execs = execs;
        self.last_status = Instant::now();
        let progress = Progress::of(executor, execs, corpus, rate);
        if status {
            eprintln!("{}", progress.status_line(&executor.store));
        }
        if self.last_stats.elapsed() >= Duration::from_secs(2) {
            journal.sample(&progress)?;
            self.last_stats = Instant::now();
            executor.store.flush()?;
        }
        Ok(())
    }
}

/// New queue entries of sibling campaigns (`--sync`), looked for every 3 s; each file is read once
/// and a case already in this campaign is skipped.
struct SyncDirs {
    imported: HashSet<PathBuf>,
    last: Instant,
}

impl Default for SyncDirs {
    fn default() -> Self {
        Self { imported: HashSet::new(), last: Instant::now() - Duration::from_secs(60) }
    }
}

impl SyncDirs {
    fn new_cases(&mut self, dirs: &[PathBuf], digests: &mut HashSet<u64>) -> Vec<Case> {
        if dirs.is_empty() || self.last.elapsed() < Duration::from_secs(3) {
            return vec![];
        }
        self.last = Instant::now();
        let mut cases = vec![];
        for dir in dirs {
            let Ok(rd) = std::fs::read_dir(dir) else { continue };
            for p in rd.filter_map(|e| e.ok().map(|e| e.path())) {
                let hidden = p.file_name().and_then(|n| n.to_str()).is_none_or(|n| n.starts_with('.'));
                if hidden || !self.imported.insert(p.clone()) {
                    continue;
                }
                if let Ok(c) = Case::load(&p) {
                    if digests.insert(case_digest(&c)) {
                        cases.push(c);
                    }
                }
            }
        }
        cases
    }
}
