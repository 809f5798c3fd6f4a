//! `shardfuzz triage OUT/ [--json] [--sarif FILE] [--minimize]`: one table of a campaign's deduplicated
//! findings, and the probable bugs they group into.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use shardfuzz_fuzz::cluster::ProbableBug;
use shardfuzz_fuzz::findings::write_atomic;
use shardfuzz_fuzz::minimize::Budget;
use shardfuzz_fuzz::oracle::Oracle;
use shardfuzz_fuzz::report::sarif;
use shardfuzz_fuzz::triage::{minimize_missing, triage};

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
    /// First minimize every finding that has no minimized case yet (`minimized.json` beside it), so the
    /// findings group into probable bugs by what their minimized cases need.
    #[arg(long)]
    minimize: bool,
    /// Most time per finding for `--minimize`, e.g. 60s, 10m.
    #[arg(long, value_parser = super::fuzz::parse_duration, default_value = "3m")]
    minimize_time: Duration,
}

pub fn run(a: TriageArgs) -> anyhow::Result<ExitCode> {
    if a.minimize {
        let budget = Budget { max_execs: Budget::default().max_execs, max_time: a.minimize_time };
        for line in minimize_missing(&a.out, budget, &Oracle::default())? {
            eprintln!("{line}");
        }
    }
    let (rows, findings, bugs) = triage(&a.out)?;
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
    print_probable_bugs(&bugs);
    Ok(ExitCode::SUCCESS)
}

fn print_probable_bugs(bugs: &[ProbableBug]) {
    println!();
    println!("probable bugs (divergences grouped by what their minimized cases need):");
    for b in bugs {
        let needs = match &b.needs {
            Some(n) if n.is_empty() => "needs nothing beyond one rank".to_string(),
            Some(n) => format!("needs {}", n.join(", ")),
            None => "not minimized".to_string(),
        };
        let phase = b.phase.as_ref().map(|p| format!(" in the {p}")).unwrap_or_default();
        println!("{:<16} {} {}{phase}, {} hits, first at {:.0} s; {needs}", b.id, b.target, b.kind, b.hits, b.first_seen_elapsed_s);
        println!("{:<16} findings: {}", "", b.findings.join(", "));
    }
    let unminimized = bugs.iter().filter(|b| b.needs.is_none()).count();
    let hint =
        if unminimized > 0 { format!("; {unminimized} not minimized (`triage --minimize` or `fuzz --minimize`)") } else { String::new() };
    println!("{} probable bugs{hint}", bugs.len());
}
