//! `shardfuzz baseline out/ > known.json`: the current findings as a baseline.

use std::path::PathBuf;
use std::process::ExitCode;

use shardfuzz_fuzz::findings::FindingStore;
use shardfuzz_fuzz::report::Baseline;

#[derive(clap::Args)]
pub struct BaselineArgs {
    /// Campaign directory.
    out: PathBuf,
}

pub fn run(a: BaselineArgs) -> anyhow::Result<ExitCode> {
    let dir = a.out.join("findings");
    if !dir.is_dir() {
        anyhow::bail!("{}: no findings directory (is this a campaign directory?)", a.out.display());
    }
    let store = FindingStore::open(&dir)?;
    let findings: Vec<_> = store.findings.values().cloned().collect();
    println!("{}", serde_json::to_string_pretty(&Baseline::from_findings(&findings))?);
    Ok(ExitCode::SUCCESS)
}
