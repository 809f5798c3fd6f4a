//! `--jobs N`: N campaign processes, one per core, each in `out/jobs/<i>/`, importing each other's
//! queues every few seconds (the AFL main/secondary scheme; the same sync works across machines
//! that share or rsync the directories). At the end the findings and queues are merged into `out/`.

use std::path::Path;
use std::process::{Command, Stdio};

use shardfuzz_fuzz::campaign::{CampaignOptions, CampaignSummary};
use shardfuzz_fuzz::findings::{write_atomic, FindingStore};

fn worker_args(opts: &CampaignOptions, i: usize, jobs: usize) -> Vec<String> {
    let dir = |j: usize| opts.out.join("jobs").join(j.to_string());
    let mut args =
        vec!["fuzz".into(), "--quiet".into(), "--target".into(), opts.target.clone(), "--out".into(), dir(i).display().to_string()];
    args.extend(["--seed".into(), (opts.seed + i as u64).to_string()]);
    if let Some(c) = &opts.corpus {
        args.extend(["--corpus".into(), c.display().to_string()]);
    }
    if let Some(t) = opts.time {
        args.extend(["--time".into(), format!("{}s", t.as_secs_f64())]);
    }
    if let Some(n) = opts.execs {
        args.extend(["--execs".into(), (n / jobs as u64).max(1).to_string()]);
    }
    if opts.random_generation {
        args.push("--random-generation".into());
    }
    if opts.adaptive_generation {
        args.push("--adaptive-generation".into());
    }
    if !opts.feedback {
        args.push("--no-feedback".into());
    }
    for b in &opts.target_options.inject {
        args.extend(["--inject".into(), b.clone()]);
    }
    if let Some(b) = opts.minimize {
        args.extend(["--minimize".into(), "--minimize-time".into(), format!("{}s", b.max_time.as_secs_f64())]);
    }
    args.extend(["--sync".into(), opts.out.join("queue").display().to_string()]);
    for j in (0..jobs).filter(|&j| j != i) {
        args.extend(["--sync".into(), dir(j).join("queue").display().to_string()]);
    }
    args
}

fn merge_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)?.flatten() {
        let p = e.path();
        let name = e.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        if p.is_dir() {
            merge_dir(&p, &to.join(&name))?;
        } else if !to.join(&name).exists() {
            write_atomic(&to.join(&name), &std::fs::read(&p)?)?;
        }
    }
    Ok(())
}

pub fn run_jobs(opts: &CampaignOptions, jobs: usize) -> anyhow::Result<CampaignSummary> {
    let exe = std::env::current_exe()?;
    let mut children = vec![];
    for i in 0..jobs {
        let child = Command::new(&exe).args(worker_args(opts, i, jobs)).stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?;
        children.push(child);
    }
    let mut summary = CampaignSummary {
        execs: 0,
        expressed: 0,
        elapsed_s: 0.0,
        corpus: 0,
        coverage: 0,
        framework_cov: 0,
        edges_instrumented: 0,
        findings: vec![],
        new_signatures: vec![],
        target_s: 0.0,
        process_s: 0.0,
    };
    for (i, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stderr);
        if let Some(line) = text.lines().find(|l| l.starts_with("done:")) {
            eprintln!("job {i}: {line}");
            let num = |key: &str| -> f64 {
                line.split(key)
                    .next()
                    .and_then(|s| s.split_whitespace().last())
                    .and_then(|v| v.trim_end_matches(',').parse().ok())
                    .unwrap_or(0.0)
            };
            summary.execs += num(" execs") as u64;
            summary.expressed += num(" of them expressed") as u64;
            summary.elapsed_s = summary.elapsed_s.max(num(" s ("));
            summary.process_s = summary.elapsed_s;
            summary.target_s += num(" %") / 100.0 * summary.elapsed_s / jobs as f64;
        }
        let dir = opts.out.join("jobs").join(i.to_string());
        merge_dir(&dir.join("queue"), &opts.out.join("queue"))?;
        merge_dir(&dir.join("findings"), &opts.out.join("findings"))?;
    }
    let store = FindingStore::open(&opts.out.join("findings"))?;
    summary.findings = store.findings.values().cloned().collect();
    summary.corpus = std::fs::read_dir(opts.out.join("queue"))?.count();
    Ok(summary)
}
