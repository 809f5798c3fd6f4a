//! `shardfuzz bench sensitivity`: detection rate of each corruption per target and dtype, and the
//! false positives on the uncorrupted runs (`shardfuzz_fuzz::sensitivity`).

use std::path::PathBuf;
use std::process::ExitCode;

use shardfuzz_fuzz::generate::random_case;
use shardfuzz_fuzz::library_ops::{random_library_case, Vocabulary};
use shardfuzz_fuzz::oracle::Oracle;
use shardfuzz_fuzz::sensitivity::{run_case, CORRUPTIONS};
use shardfuzz_harnesses::target::registry::{self, TargetOptions};
use shardfuzz_kernels::DType;

#[derive(clap::Args)]
pub struct SensitivityArgs {
    /// Clean cases per target and dtype (cases the target completes; others are skipped).
    #[arg(long, default_value_t = 200)]
    cases: u64,
    /// One dtype (default: f64, f32, bf16 and f16).
    #[arg(long)]
    dtype: Option<DType>,
    /// Targets, comma-separated.
    #[arg(long, default_value = "native")]
    target: String,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long)]
    json: bool,
    /// Divergence threshold of the statistics over a whole tensor (rms, norm, sum, direction), in
    /// every dtype (default: 8).
    #[arg(long)]
    stat_threshold: Option<f64>,
    /// Divergence threshold of the normwise error (rms) alone (default: 8).
    #[arg(long)]
    rms_threshold: Option<f64>,
    /// Print every corruption the oracle passed.
    #[arg(long)]
    show_misses: bool,
    /// Cases drawn from the target's own op vocabulary (`random_library_case`: OpInfo / jax.numpy ops
    /// on random meshes and placements) instead of model and built-in op cases. A flagged clean run
    /// there may be a framework bug as well as a false positive: each is listed to be triaged.
    #[arg(long)]
    library_ops: bool,
    /// Where the CSV goes.
    #[arg(long, default_value = "sensitivity.csv")]
    csv: PathBuf,
    /// Write every flagged clean case here (`<target>-<dtype>-<seed>.json`), to be triaged with `run`.
    #[arg(long)]
    save: Option<PathBuf>,
}

#[derive(serde::Serialize)]
struct Row {
    target: String,
    dtype: String,
    corruption: String,
    cases: u64,
    detected: u64,
    rate: f64,
}

struct Totals {
    rows: Vec<Row>,
    clean_runs: u64,
    false_positives: Vec<String>,
    harness_errors: u64,
}

pub fn run(a: SensitivityArgs) -> anyhow::Result<ExitCode> {
    let dtypes = a.dtype.map_or_else(|| vec![DType::F64, DType::F32, DType::BF16, DType::F16], |d| vec![d]);
    let mut totals = Totals { rows: vec![], clean_runs: 0, false_positives: vec![], harness_errors: 0 };
    for name in a.target.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let mut target = registry::create(name, &TargetOptions::default()).map_err(|e| anyhow::anyhow!("--target {name}: {e}"))?;
        let vocab = match a.library_ops {
            true => Some(Vocabulary::new(target.vocabulary().map_err(|e| anyhow::anyhow!("--target {name}: {e}"))?)),
            false => None,
        };
        anyhow::ensure!(vocab.as_ref().is_none_or(|v| !v.is_empty()), "--library-ops: target `{name}` has no op vocabulary");
        for &dtype in &dtypes {
            measure(target.as_mut(), dtype, vocab.as_ref(), &a, &mut totals);
        }
    }
    write_csv(&a.csv, &totals.rows)?;
    if a.json {
        let obj = serde_json::json!({
            "false_positives": totals.false_positives.len(), "clean_runs": totals.clean_runs,
            "harness_errors": totals.harness_errors, "rows": totals.rows, "examples": totals.false_positives.iter().take(10).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&obj)?);
    } else {
        print_table(&totals, &a.csv, a.library_ops);
    }
    Ok(if totals.false_positives.is_empty() && totals.harness_errors == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Writes a flagged clean case to `--save` (a failure to write is reported, not fatal: the listing
/// still names the seed).
fn save_flagged(a: &SensitivityArgs, name: &str, case: &shardfuzz_harnesses::case::Case) {
    let Some(dir) = &a.save else { return };
    let path = dir.join(format!("{name}.json"));
    if let Err(e) = std::fs::create_dir_all(dir).and_then(|_| std::fs::write(&path, case.to_json())) {
        eprintln!("warning: could not write {}: {e}", path.display());
    }
}

fn measure(
    target: &mut dyn shardfuzz_harnesses::target::Target,
    dtype: DType,
    vocab: Option<&Vocabulary>,
    a: &SensitivityArgs,
    totals: &mut Totals,
) {
    let oracle = Oracle::default().with_stat_threshold(a.stat_threshold).with_rms_threshold(a.rms_threshold);
    let mut counts = vec![(0u64, 0u64); CORRUPTIONS.len()];
    let (mut clean, mut tried) = (0u64, 0u64);
    while clean < a.cases && tried < a.cases * 50 {
        let seed = a.seed.wrapping_add(tried);
        tried += 1;
        let drawn = match vocab {
            Some(v) => random_library_case(seed, v),
            None => Some(random_case(seed)),
        };
        let Some(case) = drawn.map(|c| super::bench::with_dtype(c, Some(dtype))) else {
            continue;
        };
        let Some(result) = run_case(target, &case, &oracle) else {
            continue;
        };
        clean += 1;
        if result.clean.kind.is_finding() || result.clean.kind == shardfuzz_fuzz::oracle::VerdictKind::HarnessError {
            save_flagged(a, &format!("{}-{dtype}-{seed}", target.name()), &case);
        }
        if result.clean.kind.is_finding() {
            totals.false_positives.push(format!(
                "{} {dtype} seed {}: {}",
                target.name(),
                a.seed.wrapping_add(tried - 1),
                result.clean.reason
            ));
        }
        if result.clean.kind == shardfuzz_fuzz::oracle::VerdictKind::HarnessError {
            totals.harness_errors += 1;
        }
        if a.show_misses {
            result.misses.iter().for_each(|m| eprintln!("miss: {} {dtype} seed {}: {m}", target.name(), a.seed.wrapping_add(tried - 1)));
        }
        for (i, (_, d)) in result.detected.iter().enumerate() {
            if let Some(d) = d {
                counts[i].0 += 1;
                counts[i].1 += u64::from(*d);
            }
        }
    }
    totals.clean_runs += clean;
    for (c, (n, d)) in CORRUPTIONS.iter().zip(counts) {
        let rate = if n > 0 { d as f64 / n as f64 } else { f64::NAN };
        totals.rows.push(Row {
            target: target.name().to_string(),
            dtype: dtype.to_string(),
            corruption: c.name(),
            cases: n,
            detected: d,
            rate,
        });
    }
}

fn write_csv(path: &std::path::Path, rows: &[Row]) -> anyhow::Result<()> {
    let mut s = String::from("target,dtype,corruption,cases,detected,rate\n");
    for r in rows {
        s += &format!(
            "{},{},{},{},{},{}\n",
            r.target,
            r.dtype,
            r.corruption,
            r.cases,
            r.detected,
            if r.rate.is_nan() { String::new() } else { format!("{:.4}", r.rate) }
        );
    }
    let tmp = path.with_extension("csv.tmp");
    std::fs::write(&tmp, s)?;
    std::fs::rename(tmp, path)?;
    Ok(())
}

/// The distinct values, in the order they first appear.
fn in_order<'a>(values: impl Iterator<Item = &'a String>) -> Vec<String> {
    let mut out: Vec<String> = vec![];
    for v in values {
        if !out.contains(v) {
            out.push(v.clone());
        }
    }
    out
}

fn print_table(t: &Totals, csv: &std::path::Path, library_ops: bool) {
    let dtypes = in_order(t.rows.iter().map(|r| &r.dtype));
    let targets = in_order(t.rows.iter().map(|r| &r.target));
    for target in &targets {
        println!("target {target}: detected / cases per corruption and dtype");
        print!("  {:<20}", "corruption");
        dtypes.iter().for_each(|d| print!("  {d:>14}"));
        println!();
        for c in CORRUPTIONS {
            print!("  {:<20}", c.name());
            for d in &dtypes {
                let r = t.rows.iter().find(|r| &r.target == target && &r.dtype == d && r.corruption == c.name());
                let cell = r.map_or("-".to_string(), |r| {
                    if r.cases == 0 {
                        "n/a".into()
                    } else {
                        format!("{}/{} {:>3.0}%", r.detected, r.cases, 100.0 * r.rate)
                    }
                });
                print!("  {cell:>14}");
            }
            println!();
        }
    }
    // (On the frameworks' own ops a flagged clean run is as likely a framework bug: triage each.)
    let flagged = if library_ops { "flagged clean runs (framework bugs or false positives)" } else { "false positives" };
    println!("clean runs: {}, {flagged}: {}, harness errors: {}", t.clean_runs, t.false_positives.len(), t.harness_errors);
    for fp in t.false_positives.iter().take(if library_ops { 50 } else { 10 }) {
        println!("  {fp}");
    }
    println!("CSV: {}", csv.display());
}
