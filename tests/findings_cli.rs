//! From finding to report on the native target: a campaign meets one injected crash under several
//! configuration classes and keeps it as one finding; `minimize`, `report` and `triage` then work
//! on it.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn shardfuzz(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardfuzz")).args(args).output().expect("run shardfuzz")
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// Seeds that meet the empty-shard crash (ffn < tp with SwiGLU and micro-batches) under two
/// configuration classes: tensor parallel alone, and with data parallel + ZeRO-1.
fn seeds(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for (name, dp) in [("tp.json", r#""dp": 1"#), ("tp-dp-zero.json", r#""dp": 2, "zero_stage": 1"#)] {
        let text = format!(
            r#"{{"schema": 1, "parallel": {{{dp}, "tp": 2, "pp": 1, "microbatches": 2}},
            "model": {{"vocab": 5, "hidden": 4, "ffn": 1, "heads": 2, "kv_heads": 2, "seq": 2, "batch": 4,
                      "layers": ["attention", "mlp"], "activation": "swiglu"}},
            "train": {{"steps": 1, "optimizer": {{"kind": "sgd", "lr": 0.01}}, "dtype": "f32"}},
            "data": {{"seed": 9}}}}"#
        );
        std::fs::write(dir.join(name), text).unwrap();
    }
}

fn campaign(out: &Path) -> Vec<Value> {
    let dir = out.display().to_string();
    let corpus = out.join("seeds");
    seeds(&corpus);
    let corpus = corpus.display().to_string();
    let o = shardfuzz(&[
        "fuzz",
        "--inject",
        "empty-shard-indexed",
        "--corpus",
        &corpus,
        "--execs",
        "300",
        "--seed",
        "3",
        "--quiet",
        "--out",
        &dir,
    ]);
    ok(&o);
    serde_json::from_str(&ok(&shardfuzz(&["triage", &dir, "--json"]))).unwrap()
}

#[test]
fn one_crash_under_several_configurations_is_one_finding_that_minimizes_and_reports() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = campaign(tmp.path());
    let crashes: Vec<&Value> = rows.iter().filter(|r| r["kind"] == "crash").collect();
    assert_eq!(crashes.len(), 1, "{rows:#?}");
    let crash = crashes[0];
    assert!(crash["classes"].as_array().unwrap().len() >= 2, "seen under one class only: {crash:#?}");

    let dir = tmp.path().join("findings").join(crash["id"].as_str().unwrap());
    let record: Value = serde_json::from_str(&ok(&shardfuzz(&["minimize", &dir.display().to_string(), "--json"]))).unwrap();
    assert!(record["elements_after"].as_u64() < record["elements_before"].as_u64(), "{record:#?}");
    assert!(record["execs"].as_u64().unwrap() <= 200);
    assert!(dir.join("minimized.json").exists());

    let md = ok(&shardfuzz(&["report", &dir.display().to_string()]));
    for section in ["## Environment", "## Configuration (minimized)", "## Observed vs expected", "## Likely root cause", "## Reproduce"] {
        assert!(md.contains(section), "{section} missing:\n{md}");
    }
    assert!(md.contains("index out of bounds"), "{md}");
    assert!(md.contains("--inject empty-shard-indexed"), "the replay command must inject the bug:\n{md}");
    // The replay command of the report reproduces the crash.
    let repro = dir.join("repro").join("case.json");
    let o = shardfuzz(&["run", "--inject", "empty-shard-indexed", &repro.display().to_string()]);
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stdout));

    let triage =
        ok(&shardfuzz(&["triage", &tmp.path().display().to_string(), "--sarif", &tmp.path().join("t.sarif").display().to_string()]));
    assert!(triage.contains("report: "), "{triage}");
    let sarif: Value = serde_json::from_str(&std::fs::read_to_string(tmp.path().join("t.sarif")).unwrap()).unwrap();
    assert_eq!(sarif["runs"][0]["results"].as_array().unwrap().len(), rows.len());
}

#[test]
fn a_divergence_report_names_the_first_divergent_tensor_and_a_likely_cause() {
    let tmp = tempfile::tempdir().unwrap();
    let case = tmp.path().join("case.json");
    let text = r#"{"schema": 1, "parallel": {"dp": 2, "tp": 2, "pp": 1, "ep": 2, "microbatches": 2},
        "model": {"vocab": 11, "hidden": 8, "ffn": 13, "heads": 2, "kv_heads": 2, "seq": 4, "batch": 8,
                  "layers": ["moe"], "moe": {"experts": 4, "top_k": 2, "capacity_factor": 4.0}},
        "train": {"steps": 1, "optimizer": {"kind": "sgd", "lr": 0.01}, "grad_accumulation": 2, "dtype": "f32"},
        "data": {"seed": 5}}"#;
    std::fs::write(&case, text).unwrap();
    let md = ok(&shardfuzz(&["report", &case.display().to_string(), "--inject", "dp-average-world"]));
    assert!(md.contains("first divergent tensor: grad/layers.0.moe."), "{md}");
    assert!(md.contains("wrong scaling"), "{md}");
}

/// One injected forward bug met under two strategy sets is two signatures; minimized, both cases need the
/// same things (tensor parallelism with biases), so `triage --minimize` groups them into one probable bug.
#[test]
fn one_bug_under_two_strategy_sets_is_one_probable_bug_once_minimized() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("seeds");
    std::fs::create_dir_all(&corpus).unwrap();
    for (name, dp) in [("tp.json", 1), ("tp-dp.json", 2)] {
        let text = format!(
            r#"{{"schema": 1, "parallel": {{"dp": {dp}, "tp": 2, "pp": 1}},
            "model": {{"vocab": 8, "hidden": 4, "ffn": 4, "heads": 2, "kv_heads": 2, "seq": 2, "batch": 4,
                      "layers": ["attention", "mlp"], "bias": true}},
            "train": {{"steps": 1, "optimizer": {{"kind": "sgd", "lr": 0.01}}, "dtype": "f32"}},
            "data": {{"seed": 9}}}}"#
        );
        std::fs::write(corpus.join(name), text).unwrap();
    }
    let dir = tmp.path().join("out").display().to_string();
    let corpus = corpus.display().to_string();
    let args = ["fuzz", "--inject", "row-parallel-bias-every-rank", "--corpus", &corpus, "--execs", "2", "--quiet", "--out", &dir];
    ok(&shardfuzz(&args));
    let before: Vec<Value> = serde_json::from_str(&ok(&shardfuzz(&["triage", &dir, "--json"]))).unwrap();
    let divergent = |rows: &[Value]| rows.iter().filter(|r| r["kind"] == "divergent").cloned().collect::<Vec<_>>();
    assert_eq!(divergent(&before).len(), 2, "{before:#?}");
    assert_ne!(divergent(&before)[0]["probable_bug"], divergent(&before)[1]["probable_bug"], "not minimized yet: {before:#?}");

    let text = ok(&shardfuzz(&["triage", &dir, "--minimize"]));
    assert!(text.contains("1 probable bugs"), "{text}");
    assert!(text.contains("needs bias, dtype=f64, tp"), "{text}");
    let after: Vec<Value> = serde_json::from_str(&ok(&shardfuzz(&["triage", &dir, "--json"]))).unwrap();
    assert_eq!(divergent(&after)[0]["probable_bug"], divergent(&after)[1]["probable_bug"], "{after:#?}");
}
