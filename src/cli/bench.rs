//! `shardfuzz bench clean`: random cases on the clean target; counts false positives and measures
//! cases per second.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use shardfuzz_fuzz::generate::random_case;
use shardfuzz_fuzz::oracle::{evaluate_prepared, Oracle, Prepared, Stat, Verdict, VerdictKind};
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
    /// The minimizer on each injected bug's trigger case: executions, seconds, elements before/after.
    Minimize(super::bench_minimize::MinimizeBenchArgs),
    /// Corrupt correct runs the way bugs do: how often the oracle sees it, per dtype.
    Sensitivity(super::sensitivity::SensitivityArgs),
    /// Framework code covered over time: coverage-guided campaigns against pure random generation.
    Guidance(super::bench_guidance::GuidanceArgs),
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
    /// Divergence threshold of the statistics over a whole tensor (rms, norm, sum, direction), in
    /// every dtype (default: 8).
    #[arg(long)]
    stat_threshold: Option<f64>,
    /// Divergence threshold of the normwise error (rms) alone (default: 8).
    #[arg(long)]
    rms_threshold: Option<f64>,
    /// Judge every case with the whole noise ensemble (no fast path): the margins then show how
    /// close clean runs come to the thresholds with the ε a failing tensor would get.
    #[arg(long)]
    full_ensemble: bool,
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
        BenchCommand::Sensitivity(s) => return super::sensitivity::run(s),
        BenchCommand::Guidance(g) => return super::bench_guidance::run(g),
        BenchCommand::Minimize(m) => return super::bench_minimize::run(m),
    };
    let mut target = registry::create(&a.target, &TargetOptions::default()).map_err(|e| anyhow::anyhow!("--target: {e}"))?;
    let oracle = Oracle { fast_path: !a.full_ensemble, ..Oracle::default() }
        .with_stat_threshold(a.stat_threshold)
        .with_rms_threshold(a.rms_threshold);
    let mut counts = std::collections::BTreeMap::<VerdictKind, u64>::new();
    let mut false_positives = vec![];
    let mut margins = Margins::default();
    let mut reference_runs = 0u64;
    let start = Instant::now();
    for i in 0..a.cases {
        let case = with_dtype(random_case(a.seed.wrapping_add(i)), a.dtype);
        let prep = Prepared::new(&case);
        let v = evaluate_prepared(target.as_mut(), &prep, &oracle);
        reference_runs += u64::from(prep.reference_runs());
        margins.add(&v, a.seed.wrapping_add(i));
        *counts.entry(v.kind).or_default() += 1;
        if v.kind.is_finding() || v.kind == VerdictKind::HarnessError {
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
            "reference_runs_per_case": reference_runs as f64 / a.cases.max(1) as f64,
            "worst_ratio": margins.json(),
            "examples": false_positives.iter().take(10).map(|(i, s, r)| serde_json::json!({"seed": a.seed + i, "signature": s, "reason": r})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&obj)?);
    } else {
        println!("target {} dtype {dtype}: {} cases in {secs:.1} s = {rate:.0} cases/s", a.target, a.cases);
        for (k, n) in &counts {
            println!("  {:<12} {n}", k.name());
        }
        println!("  reference runs per case: {:.2}", reference_runs as f64 / a.cases.max(1) as f64);
        println!("  {}", margins.line());
        println!("  false positives: {}", false_positives.len());
        for (i, s, r) in false_positives.iter().take(10) {
            println!("    seed {}: {s}: {r}", a.seed + i);
        }
    }
    Ok(if false_positives.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Per statistic, the worst error / ε over the comparable tensors of each passing case: how close
/// clean runs come to the thresholds.
#[derive(Default)]
struct Margins {
    per_stat: std::collections::BTreeMap<Stat, Vec<f64>>,
    /// The closest call: (error/ε, statistic, case name, tensor).
    closest: Option<(f64, Stat, String, String)>,
}

impl Margins {
    fn add(&mut self, v: &Verdict, seed: u64) {
        if v.kind != VerdictKind::Pass {
            return;
        }
        let comparable = v.checks.iter().filter(|c| !c.note.as_deref().is_some_and(|n| n.contains("not comparable")));
        let mut worst = std::collections::BTreeMap::<Stat, f64>::new();
        for c in comparable {
            for s in c.stats.iter().filter(|s| s.ratio.is_finite()) {
                let w = worst.entry(s.stat).or_default();
                *w = w.max(s.ratio);
                if s.stat != Stat::Max && self.closest.as_ref().is_none_or(|x| s.ratio > x.0) {
                    self.closest = Some((s.ratio, s.stat, format!("seed {seed}"), c.tensor.clone()));
                }
            }
        }
        for (stat, w) in worst {
            self.per_stat.entry(stat).or_default().push(w);
        }
    }

    fn quantiles(&self) -> Vec<(Stat, f64, f64, f64)> {
        self.per_stat
            .iter()
            .map(|(s, v)| {
                let mut v = v.clone();
                v.sort_by(f64::total_cmp);
                let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
                (*s, q(0.99), q(0.9999), q(1.0))
            })
            .collect()
    }

    fn line(&self) -> String {
        let parts: Vec<String> = self.quantiles().iter().map(|(s, a, b, c)| format!("{s} {a:.2}/{b:.2}/{c:.2}")).collect();
        let closest = self.closest.as_ref().map(|(r, s, c, t)| format!("; closest: {s} {r:.2}× ε on {t} of {c}")).unwrap_or_default();
        format!("worst error/ε per case, p99/p99.99/max: {}{closest}", parts.join(", "))
    }

    fn json(&self) -> serde_json::Value {
        self.quantiles()
            .iter()
            .map(|(s, a, b, c)| (s.name().to_string(), serde_json::json!({"p99": a, "p9999": b, "max": c})))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}
