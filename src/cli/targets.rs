//! `shardfuzz targets`: every registered target, whether it can run here, and the versions it runs.

use std::process::ExitCode;

use shardfuzz_harnesses::target::registry::{self, TargetOptions};

pub fn run() -> anyhow::Result<ExitCode> {
    println!("python: {}", shardfuzz_harnesses::target::python::python_interpreter().display());
    // Workers import their frameworks in parallel (several seconds each).
    let probes: Vec<_> = registry::TARGETS
        .iter()
        .map(|t| std::thread::spawn(move || (t, (t.create)(&TargetOptions::default()).map(|t| t.versions()))))
        .collect();
    println!("{:<16} {:<11} {:<44} description", "target", "status", "versions");
    for p in probes {
        let (t, result) = p.join().map_err(|_| anyhow::anyhow!("probing a target panicked"))?;
        let (status, versions) = match result {
            Ok(v) => {
                let shown: Vec<String> =
                    v.iter().filter(|(k, _)| k.as_str() != "python-executable").map(|(k, v)| format!("{k} {v}")).collect();
                ("available", shown.join(", "))
            }
            Err(e) => ("unavailable", e.chars().take(120).collect()),
        };
        println!("{:<16} {:<11} {:<44} {}", t.name, status, versions, t.description);
    }
    Ok(ExitCode::SUCCESS)
}
