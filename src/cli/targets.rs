//! `shardfuzz targets`: every registered target, whether it can run here, the versions it runs, and
//! how many library ops (a framework's own op vocabulary) it can express.

use std::process::ExitCode;

use shardfuzz_harnesses::case::VocabularyEntry;
use shardfuzz_harnesses::target::registry::{self, TargetOptions};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// One JSON object per target: name, available, versions, ops (the library-op count), description.
    #[arg(long)]
    json: bool,
    /// Also list every library op of every target (`name` or `name.variant`, with its family).
    #[arg(long)]
    ops: bool,
}

struct Probe {
    versions: std::collections::BTreeMap<String, String>,
    ops: Vec<VocabularyEntry>,
}

fn probe(info: &registry::TargetInfo) -> Result<Probe, String> {
    let mut t = (info.create)(&TargetOptions::default())?;
    let ops = t.vocabulary()?;
    Ok(Probe { versions: t.versions(), ops })
}

pub fn run(a: &Args) -> anyhow::Result<ExitCode> {
    // Workers import their frameworks in parallel (several seconds each).
    let probes: Vec<_> = registry::TARGETS.iter().map(|t| std::thread::spawn(move || (t, probe(t)))).collect();
    if !a.json {
        println!("{:<16} {:<11} {:>5} {:<44} description", "target", "status", "ops", "versions");
    }
    for p in probes {
        let (t, result) = p.join().map_err(|_| anyhow::anyhow!("probing a target panicked"))?;
        if a.json {
            let mut o = serde_json::json!({"name": t.name, "description": t.description, "available": result.is_ok()});
            if t.env.is_some() {
                o["python"] = serde_json::json!(registry::interpreter(t.name));
                o["env"] = serde_json::json!(t.env);
            }
            match &result {
                Ok(p) => {
                    o["versions"] = serde_json::json!(p.versions);
                    o["ops"] = serde_json::json!(p.ops.len());
                    if a.ops {
                        o["op_names"] = serde_json::json!(p.ops);
                    }
                }
                Err(e) => {
                    o["versions"] = serde_json::json!({});
                    o["ops"] = serde_json::json!(0);
                    o["reason"] = serde_json::json!(e);
                }
            }
            println!("{o}");
            continue;
        }
        let (status, ops, versions) = match &result {
            Ok(p) => {
                let shown: Vec<String> =
                    p.versions.iter().filter(|(k, _)| k.as_str() != "python-executable").map(|(k, v)| format!("{k} {v}")).collect();
                ("available", if p.ops.is_empty() { "-".to_string() } else { p.ops.len().to_string() }, shown.join(", "))
            }
            Err(e) => ("unavailable", "-".to_string(), e.chars().take(120).collect()),
        };
        println!("{:<16} {:<11} {:>5} {:<44} {}", t.name, status, ops, versions, t.description);
        if let Some(env) = t.env {
            println!("{:<16} python ({env}): {}", "", registry::interpreter(t.name).display());
        }
        if let (true, Ok(p)) = (a.ops, &result) {
            for op in &p.ops {
                let name = if op.variant.is_empty() { op.name.clone() } else { format!("{}.{}", op.name, op.variant) };
                println!("    {name:<48} {}", op.family);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
