//! `shardfuzz plot out/ [--png FILE]`: coverage and findings over time.

use std::path::PathBuf;
use std::process::ExitCode;

use shardfuzz_fuzz::plot::{campaign_chart, read_stats};

#[derive(clap::Args)]
pub struct PlotArgs {
    /// Campaign directory.
    out: PathBuf,
    /// Output image (default: OUT/progress.png).
    #[arg(long)]
    png: Option<PathBuf>,
}

pub fn run(a: PlotArgs) -> anyhow::Result<ExitCode> {
    let rows = read_stats(&a.out.join("stats.csv"))?;
    if rows.is_empty() {
        anyhow::bail!("{}: stats.csv has no rows yet", a.out.display());
    }
    let png = a.png.unwrap_or_else(|| a.out.join("progress.png"));
    campaign_chart(&rows, &png)?;
    let last = rows.last().expect("non-empty");
    println!(
        "{}: {} rows, {:.0} s, {} execs, coverage {}, findings {}",
        png.display(),
        rows.len(),
        last.elapsed_s,
        last.execs,
        last.coverage,
        last.findings
    );
    Ok(ExitCode::SUCCESS)
}
