//! `shardfuzz triage OUT/ [--json] [--sarif FILE]`: one table of a campaign's deduplicated findings.

use std::path::PathBuf;
use std::process::ExitCode;

use shardfuzz_fuzz::findings::write_atomic;
use shardfuzz_fuzz::report::sarif;
use shardfuzz_fuzz::triage::triage;

#[derive(clap::Args)]
pub struct TriageArgs {
    /// Campaign directory.
    out: PathBuf,
    /// Print the rows as JSON.
    #[arg(long)]
    json: bool,
    /// Also write the findings as SARIF 2.1.0 to this file.
    #[arg(long)]
    sarif: Option<PathBuf>,
}

pub fn run(a: TriageArgs) -> anyhow::Result<ExitCode> {
    let (rows, findings) = triage(&a.out)?;
    if let Some(p) = &a.sarif {
        write_atomic(p, serde_json::to_string_pretty(&sarif(&findings, &a.out.join("findings")))?.as_bytes())?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<16} {:<14} {:<10} {:>6} {:>8} {:>8} {:>9}  site / classes / report",
        "id", "target", "kind", "hits", "first s", "smallest", "minimized"
    );
    for r in &rows {
        let site = r.signature.split('|').nth(2).unwrap_or("");
        let num = |x: Option<usize>| x.map_or("-".to_string(), |e| e.to_string());
        println!(
            "{:<16} {:<14} {:<10} {:>6} {:>8.0} {:>8} {:>9}  {site}",
            r.id,
            r.target,
            r.kind,
            r.hits,
            r.first_seen_elapsed_s,
            num(r.smallest_elements),
            num(r.minimized_elements)
        );
        println!("{:<16} classes: {}", "", if r.classes.is_empty() { "-".into() } else { r.classes.join(", ") });
        if let Some(rep) = &r.report {
            println!("{:<16} report: {rep}", "");
        }
    }
    let kinds = rows.iter().fold(std::collections::BTreeMap::<&str, usize>::new(), |mut m, r| {
        *m.entry(r.kind.as_str()).or_default() += 1;
        m
    });
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
    println!("{} distinct findings ({})", rows.len(), kinds.join(", "));
    Ok(ExitCode::SUCCESS)
}
