//! Charts: coverage and findings over time (`shardfuzz plot`), and the bug benchmark's medians.
//! Text needs a TrueType font; DejaVu Sans is used when installed, otherwise the chart is drawn
//! without labels.

use std::path::Path;

use plotters::prelude::*;

const FONT_PATHS: &[&str] = &["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/dejavu/DejaVuSans.ttf"];

/// Registers a system font for text; false when none is available.
fn fonts() -> bool {
    static FONT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FONT.get_or_init(|| {
        FONT_PATHS.iter().find_map(|p| std::fs::read(p).ok()).is_some_and(|bytes| {
            let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, leaked).is_ok()
        })
    })
}

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("plot: {e}")
}

/// One row of stats.csv.
#[derive(Debug, Clone, Copy)]
pub struct StatsRow {
    pub elapsed_s: f64,
    pub execs: f64,
    pub coverage: f64,
    pub findings: f64,
    /// Distinct framework line/branch events (0 for campaigns before the column existed).
    pub framework_cov: f64,
}

pub fn read_stats(path: &Path) -> anyhow::Result<Vec<StatsRow>> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(text
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<f64> = l.split(',').filter_map(|x| x.parse().ok()).collect();
            (f.len() >= 6).then(|| StatsRow {
                elapsed_s: f[0],
                execs: f[1],
                coverage: f[4],
                findings: f[5],
                framework_cov: f.get(7).copied().unwrap_or(0.0),
            })
        })
        .collect())
}

/// Coverage (left) and findings (right) over campaign time.
pub fn campaign_chart(rows: &[StatsRow], png: &Path) -> anyhow::Result<()> {
    let text = fonts();
    let root = BitMapBackend::new(png, (1000, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (left, right) = root.split_horizontally(500);
    let t_max = rows.iter().map(|r| r.elapsed_s).fold(1.0, f64::max);
    for (area, title, pick, color) in [
        (left, "coverage (map entries)", (|r: &StatsRow| r.coverage) as fn(&StatsRow) -> f64, BLUE),
        (right, "findings (deduplicated)", |r: &StatsRow| r.findings, RED),
    ] {
        let y_max = rows.iter().map(pick).fold(1.0, f64::max) * 1.1;
        let mut b = ChartBuilder::on(&area);
        b.margin(15).x_label_area_size(if text { 35 } else { 5 }).y_label_area_size(if text { 50 } else { 5 });
        if text {
            b.caption(title, ("sans-serif", 18));
        }
        let mut chart = b.build_cartesian_2d(0.0..t_max, 0.0..y_max).map_err(err)?;
        if text {
            chart.configure_mesh().x_desc("elapsed s").draw().map_err(err)?;
        } else {
            chart.configure_mesh().disable_x_mesh().disable_y_mesh().x_labels(0).y_labels(0).draw().map_err(err)?;
        }
        chart.draw_series(LineSeries::new(rows.iter().map(|r| (r.elapsed_s, pick(r))), color.stroke_width(2))).map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Median time to first finding per bug, with (blue) and without (grey) coverage feedback.
pub fn bug_chart(png: &Path, rows: &[(String, f64, f64)]) -> anyhow::Result<()> {
    let text = fonts();
    let h = 80 + 28 * rows.len() as u32;
    let root = BitMapBackend::new(png, (1000, h)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let x_max = rows.iter().map(|r| r.1.max(r.2)).filter(|x| x.is_finite()).fold(1.0, f64::max) * 1.1;
    let mut b = ChartBuilder::on(&root);
    b.margin(15).x_label_area_size(if text { 35 } else { 5 }).y_label_area_size(if text { 260 } else { 5 });
    if text {
        b.caption("median seconds to first finding (blue: feedback, grey: none)", ("sans-serif", 18));
    }
    let n = rows.len().max(1);
    let mut chart = b.build_cartesian_2d(0.0..x_max, 0.0..n as f64).map_err(err)?;
    let names: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    let label = move |y: &f64| names.get(*y as usize).cloned().unwrap_or_default();
    if text {
        chart.configure_mesh().y_labels(n).y_label_formatter(&label).x_desc("seconds").draw().map_err(err)?;
    }
    for (i, (_, fb, nf)) in rows.iter().enumerate() {
        let y = i as f64;
        if nf.is_finite() {
            chart
                .draw_series(std::iter::once(Rectangle::new([(0.0, y + 0.5), (*nf, y + 0.9)], RGBColor(160, 160, 160).filled())))
                .map_err(err)?;
        }
        if fb.is_finite() {
            chart.draw_series(std::iter::once(Rectangle::new([(0.0, y + 0.1), (*fb, y + 0.5)], BLUE.filled()))).map_err(err)?;
        }
    }
    root.present().map_err(err)?;
    Ok(())
}

/// A labelled, coloured line of (seconds, value) points.
pub type Series = (String, RGBColor, Vec<(f64, f64)>);

/// Framework code covered over time, one line per series.
pub fn series_chart(png: &Path, title: &str, series: &[Series]) -> anyhow::Result<()> {
    let text = fonts();
    let root = BitMapBackend::new(png, (1000, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let points = || series.iter().flat_map(|s| s.2.iter());
    let t_max = points().map(|p| p.0).fold(1.0, f64::max);
    let y_max = points().map(|p| p.1).fold(1.0, f64::max) * 1.1;
    let mut b = ChartBuilder::on(&root);
    b.margin(15).x_label_area_size(if text { 35 } else { 5 }).y_label_area_size(if text { 60 } else { 5 });
    if text {
        b.caption(title, ("sans-serif", 18));
    }
    let mut chart = b.build_cartesian_2d(0.0..t_max, 0.0..y_max).map_err(err)?;
    if text {
        chart.configure_mesh().x_desc("elapsed s").draw().map_err(err)?;
    }
    for (label, color, pts) in series {
        let drawn = chart.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2))).map_err(err)?;
        if text {
            let c = *color;
            drawn.label(label.as_str()).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        }
    }
    if text {
        chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}
