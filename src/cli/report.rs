//! `shardfuzz report FINDING_DIR | CASE.json [--format md|json]`: a bug report for a finding (its
//! minimized case if there is one, else its smallest member), with a repro beside it.
//! Exit 0 when the report was written and the case still fails; 1 when it no longer fails.

use std::path::PathBuf;
use std::process::ExitCode;

use shardfuzz_fuzz::bugreport::{build, markdown};
use shardfuzz_fuzz::findings::{write_atomic, FindingSource};
use shardfuzz_fuzz::oracle::Oracle;
use shardfuzz_fuzz::triage::REPORT;
use shardfuzz_harnesses::target::registry::{self, TargetOptions};

#[derive(Clone, Copy, clap::ValueEnum)]
enum Format {
    Md,
    Json,
}

#[derive(clap::Args)]
pub struct ReportArgs {
    /// A finding directory (`OUT/findings/<id>`) or a case file.
    input: PathBuf,
    /// Target (default: the finding's; `native` for a bare case).
    #[arg(long)]
    target: Option<String>,
    /// Bugs injected into the native target (default: those the finding recorded).
    #[arg(long)]
    inject: Vec<String>,
    #[arg(long, value_enum, default_value = "md")]
    format: Format,
    /// Directory for report.md and repro/ (default: the finding directory, or beside the case).
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(a: ReportArgs) -> anyhow::Result<ExitCode> {
    let src = FindingSource::load(&a.input)?;
    super::apply_recorded_known_fixes(&src);
    let name = src.target(a.target.as_deref());
    let injected = src.injected(&a.inject);
    let mut target = registry::create(&name, &TargetOptions { inject: injected.clone(), timeout_ms: 0 })
        .map_err(|e| anyhow::anyhow!("--target: {e}"))?;
    let case = src.minimized().unwrap_or_else(|| src.smallest_case());
    let dir = a.out.clone().or_else(|| src.dir.clone()).unwrap_or_else(|| a.input.with_extension("report"));
    let report = build(target.as_mut(), &case, &Oracle::default(), &dir.join("repro"), &injected);
    let md = markdown(&report);
    write_atomic(&dir.join(REPORT), md.as_bytes())?;
    write_atomic(&dir.join("report.json"), serde_json::to_string_pretty(&report)?.as_bytes())?;
    match a.format {
        Format::Md => print!("{md}"),
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    eprintln!("written: {} and {}", dir.join(REPORT).display(), dir.join("repro").display());
    if !report.verdict.kind.is_finding() {
        eprintln!("note: the case no longer fails on {name}: {} ({})", report.verdict.kind, report.verdict.reason);
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
