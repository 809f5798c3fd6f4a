//! `shardfuzz bench guidance`: what coverage guidance buys on the real frameworks, FuzzBench-style.
//! For each target, coverage-guided campaigns (seed corpus, feedback) and pure random generation
//! (a fresh random case every execution, no corpus) run for the same wall time, interleaved so both
//! modes share the machine alike; the measure is the number of distinct line/branch events of the
//! frameworks' own sharding code the Python worker reported (`framework_cov` in `stats.csv`),
//! recorded in both modes, and the findings each mode made.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::campaign::{run_campaign, CampaignOptions};
use crate::plot::{read_stats, series_chart, StatsRow};

/// Guided (coverage feedback over the seed corpus) or pure random generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Guided,
    Random,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Guided => "guided",
            Mode::Random => "random",
        }
    }
}

/// One campaign of the benchmark: where it ran and what it left.
#[derive(Debug, Clone)]
pub struct GuidanceRun {
    pub target: String,
    pub mode: Mode,
    pub run: u64,
    pub dir: PathBuf,
    pub rows: Vec<StatsRow>,
    pub findings: usize,
    pub expressed: u64,
}

/// Runs `runs` campaigns per mode on `target`, each for `time`, under `out/TARGET/MODE-RUN`.
pub fn run_target(base: &CampaignOptions, out: &Path, runs: u64, time: Duration) -> anyhow::Result<Vec<GuidanceRun>> {
    let mut done = vec![];
    for run in 0..runs {
        for mode in [Mode::Guided, Mode::Random] {
            let dir = out.join(&base.target).join(format!("{}-{run}", mode.name()));
            if dir.exists() {
                std::fs::remove_dir_all(&dir)?;
            }
            let opts = CampaignOptions {
                out: dir.clone(),
                time: Some(time),
                seed: base.seed + run,
                random_generation: mode == Mode::Random,
                ..base.clone()
            };
            let s = run_campaign(&opts)?;
            let rows = read_stats(&dir.join("stats.csv"))?;
            eprintln!(
                "{} {} run {run}: framework coverage {}, {} findings, {} execs ({} expressed)",
                base.target,
                mode.name(),
                s.framework_cov,
                s.findings.len(),
                s.execs,
                s.expressed
            );
            done.push(GuidanceRun {
                target: base.target.clone(),
                mode,
                run,
                dir,
                rows,
                findings: s.findings.len(),
                expressed: s.expressed,
            });
        }
    }
    Ok(done)
}

/// A campaign's framework coverage at `t` seconds (its last row not after `t`).
pub fn coverage_at(rows: &[StatsRow], t: f64) -> f64 {
    rows.iter().take_while(|r| r.elapsed_s <= t + 1e-9).last().map_or(0.0, |r| r.framework_cov)
}

/// The median (NaN of nothing).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The targets of `runs`, in the order they ran.
fn targets(runs: &[GuidanceRun]) -> Vec<&str> {
    let mut t: Vec<&str> = runs.iter().map(|r| r.target.as_str()).collect();
    t.dedup();
    t
}

/// The median over a mode's runs of one target, at each checkpoint.
pub fn median_curve(runs: &[GuidanceRun], target: &str, mode: Mode, checkpoints: &[f64]) -> Vec<f64> {
    let mine: Vec<&GuidanceRun> = runs.iter().filter(|r| r.target == target && r.mode == mode).collect();
    checkpoints.iter().map(|&t| median(mine.iter().map(|r| coverage_at(&r.rows, t)).collect())).collect()
}

/// One row of the summary: a target's median final coverage and findings in each mode.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GuidanceRow {
    pub target: String,
    pub runs: usize,
    pub guided_cov: f64,
    pub random_cov: f64,
    pub ratio: f64,
    pub guided_findings: f64,
    pub random_findings: f64,
    pub guided_expressed: f64,
    pub random_expressed: f64,
}

pub fn summarize(runs: &[GuidanceRun], time_s: f64) -> Vec<GuidanceRow> {
    targets(runs)
        .into_iter()
        .map(|t| {
            let pick = |mode: Mode, f: &dyn Fn(&GuidanceRun) -> f64| {
                median(runs.iter().filter(|r| r.target == t && r.mode == mode).map(f).collect())
            };
            let cov = |r: &GuidanceRun| coverage_at(&r.rows, time_s);
            let (g, r) = (pick(Mode::Guided, &cov), pick(Mode::Random, &cov));
            GuidanceRow {
                runs: runs.iter().filter(|r| r.target == t && r.mode == Mode::Guided).count(),
                guided_cov: g,
                random_cov: r,
                ratio: g / r,
                guided_findings: pick(Mode::Guided, &|r| r.findings as f64),
                random_findings: pick(Mode::Random, &|r| r.findings as f64),
                guided_expressed: pick(Mode::Guided, &|r| r.expressed as f64),
                random_expressed: pick(Mode::Random, &|r| r.expressed as f64),
                target: t.to_string(),
            }
        })
        .collect()
}

/// The coverage-over-time table: median framework coverage per target and mode at each checkpoint.
pub fn over_time_table(runs: &[GuidanceRun], checkpoints: &[f64]) -> String {
    let mut out = format!("{:<20} {:<7}", "target", "mode");
    for t in checkpoints {
        out += &format!(" {:>8}", format!("{t:.0}s"));
    }
    out.push('\n');
    for t in targets(runs) {
        for mode in [Mode::Guided, Mode::Random] {
            out += &format!("{t:<20} {:<7}", mode.name());
            for v in median_curve(runs, t, mode, checkpoints) {
                out += &format!(" {v:>8.0}");
            }
            out.push('\n');
        }
    }
    out
}

/// The plot: one line per target and mode (solid colours guided, grey-blended random).
pub fn chart(runs: &[GuidanceRun], time_s: f64, png: &Path) -> anyhow::Result<()> {
    use plotters::style::{RGBColor, BLUE, GREEN, MAGENTA, RED};
    let palette = [BLUE, RED, GREEN, MAGENTA, RGBColor(200, 120, 0), RGBColor(0, 150, 150), RGBColor(120, 60, 160), RGBColor(90, 90, 30)];
    let checkpoints: Vec<f64> = (0..=60).map(|i| time_s * i as f64 / 60.0).collect();
    let mut series = vec![];
    for (i, t) in targets(runs).into_iter().enumerate() {
        let c = palette[i % palette.len()];
        let faded = RGBColor(c.0 / 2 + 110, c.1 / 2 + 110, c.2 / 2 + 110);
        for (mode, color) in [(Mode::Guided, c), (Mode::Random, faded)] {
            let curve = median_curve(runs, t, mode, &checkpoints);
            series.push((format!("{t} {}", mode.name()), color, checkpoints.iter().copied().zip(curve).collect()));
        }
    }
    series_chart(png, "framework lines/branches covered (median of runs)", &series)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(t: f64, cov: f64) -> StatsRow {
        StatsRow { elapsed_s: t, execs: 0.0, coverage: 0.0, findings: 0.0, framework_cov: cov }
    }

    fn run(mode: Mode, n: u64, rows: Vec<StatsRow>) -> GuidanceRun {
        GuidanceRun { target: "t".into(), mode, run: n, dir: PathBuf::new(), rows, findings: n as usize, expressed: 10 }
    }

    #[test]
    fn coverage_at_a_time_is_the_last_row_not_after_it_and_medians_are_per_mode() {
        let rows = vec![row(2.0, 10.0), row(4.0, 30.0), row(6.0, 35.0)];
        assert_eq!(coverage_at(&rows, 1.0), 0.0);
        assert_eq!(coverage_at(&rows, 4.0), 30.0);
        assert_eq!(coverage_at(&rows, 5.9), 30.0);
        let runs = vec![
            run(Mode::Guided, 0, vec![row(10.0, 100.0)]),
            run(Mode::Guided, 1, vec![row(10.0, 140.0)]),
            run(Mode::Guided, 2, vec![row(10.0, 120.0)]),
            run(Mode::Random, 0, vec![row(10.0, 60.0)]),
            run(Mode::Random, 1, vec![row(10.0, 80.0)]),
            run(Mode::Random, 2, vec![row(10.0, 100.0)]),
        ];
        let s = summarize(&runs, 10.0);
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].guided_cov, s[0].random_cov, s[0].ratio), (120.0, 80.0, 1.5));
        assert_eq!(s[0].guided_findings, 1.0);
        let table = over_time_table(&runs, &[5.0, 10.0]);
        assert!(table.contains("guided") && table.contains("120") && table.contains("80"), "{table}");
    }
}
