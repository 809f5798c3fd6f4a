//! `shardfuzz bench clean`: random cases on the clean target; counts false positives and measures
//! cases per second.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use shardfuzz_fuzz::generate::random_case;
use shardfuzz_fuzz::oracle::{evaluate, Oracle, VerdictKind};
use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::target::registry::{self, TargetOptions};
use shardfuzz_kernels::DType;

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Random cases on the clean target: every finding is a false positive.
    Clean(CleanArgs),
    /// Time to find each injected bug, with and without coverage feedback.
    Bugs(super::bugs::BugsArgs),
    /// Python targets: cases/s with persistent workers against respawning them for every case.
    Frameworks(super::bench_frameworks::FrameworksArgs),
}

#[derive(clap::Args)]
pub struct CleanArgs {
    #[arg(long, default_value_t = 1000)]
    cases: u64,
    /// Force this compute dtype on every case (f64, f32, bf16, f16).
    #[arg(long)]
    dtype: Option<DType>,
    #[arg(long, default_value = "native")]
    target: String,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long)]
    json: bool,
    /// Write every false-positive case here.
    #[arg(long)]
    save: Option<PathBuf>,
}

/// A generated case with its dtype forced.
pub fn with_dtype(mut case: Case, dtype: Option<DType>) -> Case {
    if let Some(d) = dtype {
        case.train.dtype = d;
        case.train.reduce_dtype = None;
        if d != DType::F16 {
            case.train.loss_scale = None;
        }
    }
    case
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    let a = match cmd {
        BenchCommand::Clean(a) => a,
        BenchCommand::Bugs(b) => return super::bugs::run(b),
        BenchCommand::Frameworks(f) => return super::bench_frameworks::run(f),
    };
    let mut target = registry::create(&a.target, &TargetOptions::default()).map_err(|e| anyhow::anyhow!("--target: {e}"))?;
    let oracle = Oracle::default();
    let mut counts = std::collections::BTreeMap::<VerdictKind, u64>::new();
    let mut false_positives = vec![];
    let start = Instant::now();
    for i in 0..a.cases {
        let case = with_dtype(random_case(a.seed.wrapping_add(i)), a.dtype);
        let v = evaluate(target.as_mut(), &case, &oracle);
        *counts.entry(v.kind).or_default() += 1;
        if v.kind.is_finding() {
            if let Some(dir) = &a.save {
                std::fs::create_dir_all(dir)?;
                std::fs::write(dir.join(format!("fp-{i:07}.json")), case.to_json())?;
            }
            false_positives.push((i, v.signature(&case), v.reason.clone()));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let rate = a.cases as f64 / secs.max(1e-9);
    let dtype = a.dtype.map_or("mixed".to_string(), |d| d.to_string());
    if a.json {
        let by_kind: serde_json::Map<String, serde_json::Value> = counts.iter().map(|(k, n)| (k.name().to_string(), (*n).into())).collect();
        let obj = serde_json::json!({
            "target": a.target, "dtype": dtype, "cases": a.cases, "false_positives": false_positives.len(),
            "cases_per_sec": rate, "seconds": secs, "verdicts": by_kind,
            "examples": false_positives.iter().take(10).map(|(i, s, r)| serde_json::json!({"seed": a.seed + i, "signature": s, "reason": r})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&obj)?);
    } else {
        println!("target {} dtype {dtype}: {} cases in {secs:.1} s = {rate:.0} cases/s", a.target, a.cases);
        for (k, n) in &counts {
            println!("  {:<12} {n}", k.name());
        }
        println!("  false positives: {}", false_positives.len());
        for (i, s, r) in false_positives.iter().take(10) {
            println!("    seed {}: {s}: {r}", a.seed + i);
        }
    }
    Ok(if false_positives.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
