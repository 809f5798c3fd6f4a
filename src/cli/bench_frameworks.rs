//! `shardfuzz bench frameworks`: per Python target, cases per second with the persistent worker
//! and rank pool against respawning the worker (and its ranks) for every case, and cases per second
//! on shapes never seen before (JAX compiles each new shape) and on fresh library-op cases.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use shardfuzz_fuzz::campaign::load_cases;
use shardfuzz_fuzz::generate::random_case;
use shardfuzz_fuzz::library_ops::{random_library_case, Vocabulary};
use shardfuzz_fuzz::oracle::{evaluate, Oracle, VerdictKind};
use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::target::python::RESPAWN_ENV;
use shardfuzz_harnesses::target::registry::{self, TargetOptions};
use shardfuzz_harnesses::target::Target;

#[derive(clap::Args)]
pub struct FrameworksArgs {
    /// Targets (comma-separated); default: every available Python target.
    #[arg(long)]
    targets: Option<String>,
    /// Timed passes over the target's seed cases with the persistent worker.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Cases timed with a respawn for every case (the first of the same seed cases).
    #[arg(long, default_value_t = 3)]
    respawn_cases: usize,
    /// Fresh random cases (new shapes) offered to each target.
    #[arg(long, default_value_t = 200)]
    new_cases: u64,
    /// Fresh random library-op cases (drawn from the target's own op vocabulary, as a campaign's fresh
    /// cases are) offered to each target that has one.
    #[arg(long, default_value_t = 300)]
    library_cases: u64,
    #[arg(long, default_value = "corpus")]
    corpus: PathBuf,
    #[arg(long, default_value = "bench-frameworks.csv")]
    csv: PathBuf,
}

struct Row {
    target: String,
    seed_cases: usize,
    persistent: f64,
    respawn: f64,
    new_shape: f64,
    new_shape_cases: usize,
    library: LibraryRate,
}

/// Fresh library-op cases: cases/s over all of them, and over those that did not hang (a hang costs
/// its timeout, which says nothing of the per-case cost).
#[derive(Default)]
struct LibraryRate {
    offered: usize,
    expressed: usize,
    hangs: usize,
    per_s: f64,
    per_s_without_hangs: f64,
}

fn library_rate(target: &mut dyn Target, oracle: &Oracle, count: u64) -> anyhow::Result<LibraryRate> {
    let vocab = Vocabulary::new(target.vocabulary().map_err(|e| anyhow::anyhow!("{e}"))?);
    if vocab.is_empty() {
        return Ok(LibraryRate::default());
    }
    let cases: Vec<Case> = (0..count).filter_map(|i| random_library_case(9_500_000 + i, &vocab)).collect();
    let (mut all, mut hung) = (0.0, 0.0);
    let mut r = LibraryRate { offered: cases.len(), ..LibraryRate::default() };
    for c in &cases {
        let t0 = Instant::now();
        let kind = evaluate(target, c, oracle).kind;
        let s = t0.elapsed().as_secs_f64();
        all += s;
        if kind == VerdictKind::Hang {
            let op = c.library_op.as_ref().map_or("?", |l| l.name.as_str());
            eprintln!("  a library-op case hung ({s:.1} s with its patient rerun): {op}");
            r.hangs += 1;
            hung += s;
        }
        if kind != VerdictKind::Unsupported {
            r.expressed += 1;
        }
    }
    r.per_s = r.offered as f64 / all.max(1e-9);
    r.per_s_without_hangs = (r.offered - r.hangs) as f64 / (all - hung).max(1e-9);
    Ok(r)
}

fn rate(target: &mut dyn Target, cases: &[Case], oracle: &Oracle) -> (f64, usize) {
    let t0 = Instant::now();
    let mut ran = 0;
    for c in cases {
        if evaluate(target, c, oracle).kind != VerdictKind::Unsupported {
            ran += 1;
        }
    }
    (ran as f64 / t0.elapsed().as_secs_f64().max(1e-9), ran)
}

pub fn run(a: FrameworksArgs) -> anyhow::Result<ExitCode> {
    let oracle = Oracle::default();
    let names: Vec<String> = match &a.targets {
        Some(t) => t.split(',').map(|s| s.trim().to_string()).collect(),
        None => registry::TARGETS.iter().filter(|t| registry::is_python(t.name)).map(|t| t.name.to_string()).collect(),
    };
    let mut sink = Vec::new();
    let seeds = load_cases(&a.corpus, &mut sink);
    let mut rows = vec![];
    for name in names {
        if let Some(row) = measure(&name, &a, &seeds, &oracle)? {
            eprintln!("{}: {:.1} cases/s persistent, {:.2} respawning", row.target, row.persistent, row.respawn);
            rows.push(row);
        }
    }
    write_table(&rows, &a.csv)?;
    eprintln!("wrote {}", a.csv.display());
    Ok(ExitCode::SUCCESS)
}

/// One target's row; `None` when the target cannot be created here.
fn measure(name: &str, a: &FrameworksArgs, seeds: &[Case], oracle: &Oracle) -> anyhow::Result<Option<Row>> {
    let mut target = match registry::create(name, &TargetOptions::default()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("skipped: {e}");
            return Ok(None);
        }
    };
    // Warm-up pass: finds the seed cases this target runs cleanly (pass or rejected: a crash or
    // hang replaces the rank pool on purpose, which is not what is measured) and starts its pools.
    let mine: Vec<Case> = seeds
        .iter()
        .filter(|c| matches!(evaluate(target.as_mut(), c, oracle).kind, VerdictKind::Pass | VerdictKind::Rejected))
        .cloned()
        .collect();
    let repeated: Vec<Case> = (0..a.repeats).flat_map(|_| mine.iter().cloned()).collect();
    let (persistent, _) = rate(target.as_mut(), &repeated, oracle);
    let fresh: Vec<Case> = (0..a.new_cases).map(|i| random_case(9_000_000 + i)).collect();
    let (new_shape, new_shape_cases) = rate(target.as_mut(), &fresh, oracle);
    let library = library_rate(target.as_mut(), oracle, a.library_cases)?;
    drop(target);
    std::env::set_var(RESPAWN_ENV, "1");
    let respawn = match registry::create(name, &TargetOptions::default()) {
        Ok(mut t) => rate(t.as_mut(), &mine[..a.respawn_cases.min(mine.len())], oracle).0,
        Err(_) => f64::NAN,
    };
    std::env::remove_var(RESPAWN_ENV);
    Ok(Some(Row { target: name.to_string(), seed_cases: mine.len(), persistent, respawn, new_shape, new_shape_cases, library }))
}

impl Row {
    fn table_line(&self) -> String {
        let Row { target, seed_cases, persistent, respawn, new_shape, new_shape_cases, library: l } = self;
        let (ratio, lib, no_hang, n) = (persistent / respawn, l.per_s, l.per_s_without_hangs, format!("{}/{}", l.expressed, l.hangs));
        format!("{target:<17} {seed_cases:>5} {persistent:>12.1} {respawn:>9.2} {ratio:>5.0}× {new_shape:>11.1} {new_shape_cases:>5} {lib:>8.1} {no_hang:>10.1} {n:>9}")
    }

    fn csv_line(&self) -> String {
        let Row { target, seed_cases, persistent, respawn, new_shape, new_shape_cases, library: l } = self;
        let ratio = persistent / respawn;
        let LibraryRate { offered, expressed, hangs, per_s, per_s_without_hangs } = l;
        format!("{target},{seed_cases},{persistent:.3},{respawn:.4},{ratio:.1},{new_shape:.3},{new_shape_cases},{per_s:.3},{per_s_without_hangs:.3},{offered},{expressed},{hangs}")
    }
}

fn write_table(rows: &[Row], csv_path: &std::path::Path) -> anyhow::Result<()> {
    println!(
        "{:<17} {:>5} {:>12} {:>9} {:>6} {:>11} {:>5} {:>8} {:>10} {:>9}",
        "target", "seeds", "persistent/s", "respawn/s", "ratio", "new-shape/s", "(n)", "lib-op/s", "w/o-hang/s", "(n/hangs)"
    );
    let mut csv = std::fs::File::create(csv_path)?;
    writeln!(
        csv,
        "target,seed_cases,persistent_cases_per_s,respawn_cases_per_s,ratio,new_shape_cases_per_s,new_shape_cases,\
         library_cases_per_s,library_cases_per_s_without_hangs,library_cases,library_expressed,library_hangs"
    )?;
    for r in rows {
        println!("{}", r.table_line());
        writeln!(csv, "{}", r.csv_line())?;
    }
    Ok(())
}
