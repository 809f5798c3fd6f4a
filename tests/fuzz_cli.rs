//! End-to-end tests of `shardfuzz fuzz`: the out directory, resume, CI mode (exit codes, baseline,
//! SARIF, JUnit), a malformed corpus file, and kill -9 in the middle of a campaign.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shardfuzz"))
}

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

fn fuzz(out: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["fuzz", "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    bin().args(&args).output().expect("run shardfuzz fuzz")
}

fn stats_lines(out: &Path) -> Vec<String> {
    std::fs::read_to_string(out.join("stats.csv")).unwrap().lines().map(String::from).collect()
}

/// Every non-hidden JSON file under `dir` parses.
fn assert_all_json_parses(dir: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if e.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        if p.is_dir() {
            n += assert_all_json_parses(&p);
        } else if p.extension().is_some_and(|x| x == "json") {
            let text = std::fs::read_to_string(&p).unwrap();
            serde_json::from_str::<serde_json::Value>(&text).unwrap_or_else(|e| panic!("{}: torn or invalid JSON: {e}", p.display()));
            n += 1;
        }
    }
    n
}

#[test]
fn a_campaign_leaves_its_directory_and_a_second_run_resumes_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = fuzz(&out, &["--corpus", corpus().to_str().unwrap(), "--time", "4s"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("execs") && err.contains("corpus") && err.contains("findings"), "no status line: {err}");
    assert!(out.join("queue").read_dir().unwrap().count() >= 40);
    assert!(out.join("findings").is_dir() && out.join("fuzz.log").is_file());
    let first = stats_lines(&out);
    assert_eq!(first[0], "elapsed_s,execs,execs_per_sec,corpus,edges,findings,rss_mb,framework_cov");
    let rss: f64 = first.last().unwrap().split(',').nth(6).unwrap().parse().unwrap();
    assert!(rss > 1.0, "no RSS recorded: {first:?}");
    let last_elapsed: f64 = first.last().unwrap().split(',').next().unwrap().parse().unwrap();
    let o = fuzz(&out, &["--time", "3s", "--quiet"]);
    assert_eq!(o.status.code(), Some(0));
    let second = stats_lines(&out);
    assert!(second.len() > first.len(), "stats not appended");
    let resumed: f64 = second.last().unwrap().split(',').next().unwrap().parse().unwrap();
    assert!(resumed > last_elapsed + 2.0, "elapsed did not continue: {last_elapsed} -> {resumed}");
    assert!(std::fs::read_to_string(out.join("fuzz.log")).unwrap().contains("resumed at"));
}

/// The verdict counts of the last `stop:` line of fuzz.log ("pass 2366, rejected 2138, ...").
fn stopped_verdicts(out: &Path) -> std::collections::BTreeMap<String, u64> {
    let log = std::fs::read_to_string(out.join("fuzz.log")).unwrap();
    let line = log.lines().rev().find(|l| l.contains("stop:")).unwrap_or_else(|| panic!("no stop line: {log}"));
    let inner = line.split_once('(').and_then(|(_, r)| r.split_once(')')).map(|(i, _)| i).unwrap_or_else(|| panic!("{line}"));
    inner.split(", ").map(|kv| kv.rsplit_once(' ').map(|(k, v)| (k.to_string(), v.parse().unwrap())).unwrap()).collect()
}

#[test]
fn without_feedback_the_seeds_no_target_can_run_are_not_mutated() {
    // The seed corpus holds op cases the native target does not express; they are the cheapest
    // runs, and a baseline without feedback used to spend two thirds of its executions on them.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = fuzz(&out, &["--corpus", corpus().to_str().unwrap(), "--execs", "1500", "--no-feedback", "--quiet", "--seed", "3"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let v = stopped_verdicts(&out);
    let total: u64 = v.values().sum();
    let unsupported = v.get("unsupported").copied().unwrap_or(0);
    let passed = v.get("pass").copied().unwrap_or(0);
    assert!(total >= 1500, "{v:?}");
    // The seeds themselves (11 op cases) and the op cases among fresh random cases remain.
    assert!(unsupported * 20 < total, "{unsupported} of {total} executions unsupported: {v:?}");
    // The scheduler weighs entries by their measured execution time, so the share that passes
    // depends on the machine's load: 38–44 % alone, 28 % under the whole suite on 2 cores
    // (2026-11-26); a quarter still fails a campaign that spends most runs on rejections.
    assert!(passed * 4 > total, "only {passed} of {total} executions passed: {v:?}");
}

#[test]
fn ci_mode_fails_on_new_findings_writes_sarif_and_junit_and_honours_the_baseline() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let sarif = dir.path().join("f.sarif");
    let junit = dir.path().join("f.xml");
    let bug = ["--inject", "row-parallel-bias-every-rank"];
    // The seed corpus has cases in the bug's region (tensor parallelism with biases).
    let seeds = dir.path().join("seeds");
    std::fs::create_dir(&seeds).unwrap();
    for e in std::fs::read_dir(corpus()).unwrap().flatten() {
        std::fs::copy(e.path(), seeds.join(e.file_name())).unwrap();
    }
    let mut args = vec!["--corpus", seeds.to_str().unwrap(), "--time", "5s", "--quiet", "--fail-on-finding"];
    args.extend_from_slice(&bug);
    args.extend_from_slice(&["--sarif", sarif.to_str().unwrap(), "--junit", junit.to_str().unwrap()]);
    let o = fuzz(&out, &args);
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&sarif).unwrap()).unwrap();
    assert_eq!(s["version"], "2.1.0");
    let results = s["runs"][0]["results"].as_array().unwrap();
    assert!(!results.is_empty());
    assert!(results.iter().all(|r| r["ruleId"].is_string() && r["message"]["text"].is_string()));
    let x = std::fs::read_to_string(&junit).unwrap();
    assert!(x.starts_with("<?xml") && x.contains("<testsuites") && x.contains("<failure"), "{x}");
    // Every finding names its target and records versions.
    let f = out.join("findings").read_dir().unwrap().next().unwrap().unwrap().path();
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(f.join("verdict.json")).unwrap()).unwrap();
    assert_eq!(v["target"], "native");
    assert!(v["versions"]["injected"].as_str().unwrap().contains("row-parallel"));
    assert!(v["hits"].as_u64().unwrap() >= 1 && v["first_seen_unix"].as_f64().unwrap() > 0.0);

    let b = bin().args(["baseline", out.to_str().unwrap()]).output().unwrap();
    assert_eq!(b.status.code(), Some(0));
    let known = dir.path().join("known.json");
    std::fs::write(&known, &b.stdout).unwrap();
    // Re-running the queue (every case of which was judged before) finds only known signatures.
    let mut args = vec!["--execs", "1", "--quiet", "--fail-on-finding", "--baseline", known.to_str().unwrap()];
    args.extend_from_slice(&bug);
    let o = fuzz(&out, &args);
    assert_eq!(o.status.code(), Some(0), "known findings must not fail CI: {}", String::from_utf8_lossy(&o.stderr));

    let clean = dir.path().join("clean");
    let o = fuzz(&clean, &["--corpus", seeds.to_str().unwrap(), "--time", "3s", "--quiet", "--fail-on-finding"]);
    assert_eq!(o.status.code(), Some(0), "clean target: {}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_malformed_corpus_file_is_a_warning_naming_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let seeds = dir.path().join("seeds");
    std::fs::create_dir(&seeds).unwrap();
    std::fs::copy(corpus().join("tp2-even.json"), seeds.join("good.json")).unwrap();
    let bad = std::fs::read_to_string(corpus().join("tp2-even.json")).unwrap().replace("\"hidden\": 8", "\"hidden\": 0");
    std::fs::write(seeds.join("bad.json"), bad).unwrap();
    std::fs::write(seeds.join("broken.json"), "{ not json").unwrap();
    let o = fuzz(&dir.path().join("out"), &["--corpus", seeds.to_str().unwrap(), "--time", "2s"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("bad.json") && err.contains("model.hidden"), "{err}");
    assert!(err.contains("broken.json"), "{err}");
    assert!(err.contains("execs"), "campaign did not go on: {err}");
}

#[test]
fn kill_9_loses_nothing_and_the_campaign_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    for round in 0..2 {
        let mut child = bin()
            .args(["fuzz", "--out", out.to_str().unwrap(), "--corpus", corpus().to_str().unwrap(), "--time", "60s", "--quiet"])
            .args(["--inject", "vocab-pad-unmasked"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(3500 + 700 * round));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let n = assert_all_json_parses(&out);
        assert!(n > 40, "round {round}: only {n} JSON files");
    }
    let o = fuzz(&out, &["--time", "2s", "--quiet", "--inject", "vocab-pad-unmasked"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read_to_string(out.join("fuzz.log")).unwrap().matches("start:").count() >= 3);
    assert_all_json_parses(&out);
}

#[test]
fn pure_random_generation_ignores_the_corpus_and_keeps_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = fuzz(&out, &["--corpus", corpus().to_str().unwrap(), "--time", "2s", "--quiet", "--random-generation", "--seed", "3"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let log = std::fs::read_to_string(out.join("fuzz.log")).unwrap();
    assert!(log.contains("0 seed cases loaded") && log.contains("pure random generation"), "{log}");
    assert_eq!(out.join("queue").read_dir().unwrap().count(), 0, "random generation added corpus entries");
    let last = stats_lines(&out).last().unwrap().clone();
    let execs: u64 = last.split(',').nth(1).unwrap().parse().unwrap();
    assert!(execs > 20, "{last}");
}
