//! The repro beside a report: for a Python target, a standalone script the worker package writes
//! (`python -m shardfuzz_worker.repro`: the framework, numpy and the standard library only, the
//! inputs embedded, exit 1 when the mismatch shows); for the native target, the `shardfuzz run`
//! command and the case.

use std::path::Path;
use std::process::Command;

use serde::Serialize;
use shardfuzz_harnesses::case::Case;
use shardfuzz_harnesses::target::python::{worker_pythonpath, write_inputs};
use shardfuzz_harnesses::target::registry::{interpreter, is_python};

use crate::findings::write_atomic;
use crate::oracle::{Prepared, Stat, Verdict};

/// How to reproduce a finding.
#[derive(Debug, Clone, Serialize)]
pub struct Repro {
    /// The command, run in the repro directory.
    pub command: String,
    /// Files in the repro directory.
    pub files: Vec<String>,
    /// The command needs nothing from shardfuzz.
    pub standalone: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Writes the repro of `case` into `dir`.
pub fn write(target: &str, case: &Case, prep: &Prepared, v: &Verdict, dir: &Path, injected: &[String]) -> Repro {
    let mut repro = Repro { command: String::new(), files: vec!["case.json".into()], standalone: false, note: None };
    if let Err(e) = write_atomic(&dir.join("case.json"), case.to_json().as_bytes()) {
        repro.note = Some(format!("could not write {}: {e}", dir.display()));
        return repro;
    }
    let inject: String = injected.iter().map(|b| format!(" --inject {b}")).collect();
    repro.command = format!("shardfuzz run --target {target}{inject} case.json");
    if !is_python(target) {
        return repro;
    }
    match script(target, prep, v, dir) {
        Ok(command) => {
            repro.command = command;
            repro.files.push("repro.py".into());
            repro.standalone = true;
        }
        Err(e) => repro.note = Some(format!("no standalone script: {e}; the shardfuzz command replays it")),
    }
    repro
}

/// The fuzzer's bounds for every tensor it compared in full: `{tensor: {stat: bound}}`.
fn bounds(v: &Verdict) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for c in v.checks.iter().filter(|c| c.note.is_none() || !c.pass) {
        let stats: serde_json::Map<String, serde_json::Value> = c
            .stats
            .iter()
            .filter(|s| matches!(s.stat, Stat::Max | Stat::Rms | Stat::Norm) && s.bound.is_finite())
            .map(|s| (s.stat.name().to_string(), serde_json::json!(s.bound)))
            .collect();
        if !stats.is_empty() {
            out.insert(c.tensor.clone(), serde_json::Value::Object(stats));
        }
    }
    serde_json::Value::Object(out)
}

/// Has the worker package write `dir/repro.py`; returns the command that runs it.
fn script(target: &str, prep: &Prepared, v: &Verdict, dir: &Path) -> Result<String, String> {
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (inputs, bounds_file) = (tmp.path().join("inputs.safetensors"), tmp.path().join("bounds.json"));
    write_inputs(&inputs, &prep.inputs).map_err(|e| e.to_string())?;
    std::fs::write(&bounds_file, bounds(v).to_string()).map_err(|e| e.to_string())?;
    let python = interpreter(target);
    let out = Command::new(&python)
        .args(["-m", "shardfuzz_worker.repro", "--target", target, "--case"])
        .arg(dir.join("case.json"))
        .arg("--inputs")
        .arg(&inputs)
        .arg("--bounds")
        .arg(&bounds_file)
        .arg("--out")
        .arg(dir)
        .env("PYTHONPATH", worker_pythonpath())
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("the generator failed").trim().to_string());
    }
    let cmd = String::from_utf8_lossy(&out.stdout).lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string();
    if cmd.is_empty() {
        return Err("the generator printed no command".into());
    }
    Ok(cmd)
}

/// The Python version of the interpreter `target` runs in.
pub fn python_version(target: &str) -> Option<String> {
    let out = Command::new(interpreter(target)).args(["-c", "import platform; print(platform.python_version())"]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}
