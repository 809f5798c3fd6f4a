//! `shardfuzz bench frameworks`: per Python target, cases per second with the persistent worker
//! and rank pool against respawning the worker (and its ranks) for every case, and cases per second
//! on shapes never seen before (JAX compiles each new shape).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use shardfuzz_fuzz::campaign::load_cases;
use shardfuzz_fuzz::generate::random_case;
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
        let mut target = match registry::create(&name, &TargetOptions::default()) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("skipped: {e}");
                continue;
            }
        };
        // Warm-up pass: finds the seed cases this target runs cleanly (pass or rejected: a crash or
        // hang replaces the rank pool on purpose, which is not what is measured) and starts its pools.
        let mine: Vec<Case> = seeds
            .iter()
            .filter(|c| matches!(evaluate(target.as_mut(), c, &oracle).kind, VerdictKind::Pass | VerdictKind::Rejected))
            .cloned()
            .collect();
        let repeated: Vec<Case> = (0..a.repeats).flat_map(|_| mine.iter().cloned()).collect();
        let (persistent, _) = rate(target.as_mut(), &repeated, &oracle);
        let fresh: Vec<Case> = (0..a.new_cases).map(|i| random_case(9_000_000 + i)).collect();
        let (new_shape, new_shape_cases) = rate(target.as_mut(), &fresh, &oracle);
        drop(target);
        std::env::set_var(RESPAWN_ENV, "1");
        let respawn = match registry::create(&name, &TargetOptions::default()) {
            Ok(mut t) => rate(t.as_mut(), &mine[..a.respawn_cases.min(mine.len())], &oracle).0,
            Err(_) => f64::NAN,
        };
        std::env::remove_var(RESPAWN_ENV);
        let row = Row { target: name, seed_cases: mine.len(), persistent, respawn, new_shape, new_shape_cases };
        eprintln!("{}: {:.1} cases/s persistent, {:.2} respawning", row.target, row.persistent, row.respawn);
        rows.push(row);
    }
    println!(
        "{:<16} {:>6} {:>12} {:>10} {:>8} {:>11} {:>6}",
        "target", "seeds", "persistent/s", "respawn/s", "ratio", "new-shape/s", "(n)"
    );
    let mut csv = std::fs::File::create(&a.csv)?;
    writeln!(csv, "target,seed_cases,persistent_cases_per_s,respawn_cases_per_s,ratio,new_shape_cases_per_s,new_shape_cases")?;
    for r in &rows {
        let ratio = r.persistent / r.respawn;
        println!(
            "{:<16} {:>6} {:>12.1} {:>10.2} {:>7.0}× {:>11.1} {:>6}",
            r.target, r.seed_cases, r.persistent, r.respawn, ratio, r.new_shape, r.new_shape_cases
        );
        writeln!(
            csv,
            "{},{},{:.3},{:.4},{:.1},{:.3},{}",
            r.target, r.seed_cases, r.persistent, r.respawn, ratio, r.new_shape, r.new_shape_cases
        )?;
    }
    eprintln!("wrote {}", a.csv.display());
    Ok(ExitCode::SUCCESS)
}
