//! Command-line interface: parses, dispatches, maps outcomes to exit codes
//! (0: all pass/rejected; 1: a finding; 2: usage or input error).

mod baseline;
mod bench;
mod bench_frameworks;
mod bench_guidance;
mod bench_minimize;
mod bugs;
mod fuzz;
mod gen;
mod jobs;
mod minimize;
mod plot;
mod report;
mod run;
mod sensitivity;
mod table;
mod targets;
mod triage;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "shardfuzz", version, about = "Coverage-guided differential fuzzer for distributed training frameworks")]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Python interpreter for the framework targets: a PATH for all of them, or TARGET=PATH for one
    /// (repeatable; default: $SHARDFUZZ_PYTHON, else the environment each target declares, `.venv` or
    /// `.venv-NAME`, as `shardfuzz targets` shows): point it at the environment whose framework builds
    /// you want to fuzz.
    #[arg(long, global = true, value_name = "[TARGET=]PATH")]
    python: Vec<String>,
}

#[derive(Subcommand)]
enum Command {
    /// A coverage-guided fuzz campaign (resumable; CI mode with --fail-on-finding).
    Fuzz(fuzz::FuzzArgs),
    /// Shrink a failing case (a finding directory or a case file) to a minimal one that fails the same way.
    Minimize(minimize::MinimizeArgs),
    /// One table of a campaign's deduplicated findings (also JSON and SARIF).
    Triage(triage::TriageArgs),
    /// A bug report for a finding: configuration in words, observed vs expected, localization, likely cause, a repro.
    Report(report::ReportArgs),
    /// Draw coverage and findings over time from a campaign directory.
    Plot(plot::PlotArgs),
    /// Print the findings of a campaign directory as a baseline of known signatures.
    Baseline(baseline::BaselineArgs),
    /// Run case files through a target and print the verdict table.
    Run(run::RunArgs),
    /// Write random valid cases.
    Gen(gen::GenArgs),
    /// Print the JSON Schema of a case.
    Schema,
    /// Benchmarks (`bench clean`: false positives and cases/s on the clean target).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// List the bugs that can be injected into the native target.
    Bugs,
    /// List the targets (with the number of library ops each can express).
    Targets(targets::Args),
}

pub fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    if !cli.python.is_empty() {
        // Read by the Python targets when they start their workers (and inherited by `--jobs` children).
        std::env::set_var(shardfuzz_harnesses::target::python::PYTHON_ENV, python_spec(&cli.python)?);
    }
    match cli.command {
        Command::Run(a) => run::run(a),
        Command::Fuzz(a) => fuzz::run(a),
        Command::Baseline(a) => baseline::run(a),
        Command::Plot(a) => plot::run(a),
        Command::Minimize(a) => minimize::run(a),
        Command::Triage(a) => triage::run(a),
        Command::Report(a) => report::run(a),
        Command::Gen(a) => gen::run(a),
        Command::Schema => {
            println!("{}", serde_json::to_string_pretty(&shardfuzz_harnesses::case::Case::json_schema())?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(b) => bench::run(b),
        Command::Bugs => {
            for b in shardfuzz_harnesses::model::Bug::ALL {
                println!("{:<34} {}", b.name(), b.description());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Targets(a) => targets::run(&a),
    }
}

/// Re-runs of a finding (report, minimize) apply the fixes of known framework bugs it was found under, so that they
/// meet the finding again and not a bug already known; `$SHARDFUZZ_KNOWN_FIXES`, where set, wins (empty: none).
fn apply_recorded_known_fixes(src: &shardfuzz_fuzz::findings::FindingSource) {
    const ENV: &str = "SHARDFUZZ_KNOWN_FIXES";
    if let (None, Some(fixes)) = (std::env::var_os(ENV), src.known_fixes()) {
        eprintln!("applying the fixes of known bugs the finding was found under ({ENV}={fixes})");
        std::env::set_var(ENV, fixes);
    }
}

/// The `--python` values as one `$SHARDFUZZ_PYTHON` list, each checked: a known Python target, an existing
/// interpreter, at most one plain path.
fn python_spec(values: &[String]) -> anyhow::Result<String> {
    use shardfuzz_harnesses::target::{python::is_target_entry, registry};
    let mut plain = 0;
    for v in values {
        anyhow::ensure!(!v.contains(','), "--python {v}: a path with a comma cannot be passed (give one entry per flag)");
        let path = if is_target_entry(v) {
            let (target, path) = v.split_once('=').expect("checked");
            anyhow::ensure!(registry::is_python(target), "--python {v}: `{target}` is not a Python target (see `shardfuzz targets`)");
            path
        } else {
            plain += 1;
            v.as_str()
        };
        anyhow::ensure!(std::path::Path::new(path).exists(), "--python {v}: {path} does not exist");
    }
    anyhow::ensure!(plain <= 1, "--python: at most one plain PATH (the others as TARGET=PATH)");
    Ok(values.join(","))
}
