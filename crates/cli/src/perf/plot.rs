//! `--plot FILE.svg`: a bandwidth-vs-size curve (bw) or a latency histogram (lat; a
//! median-and-p99-vs-size curve when several sizes ran); with `--qps-sweep`, bandwidth
//! against QPs, one curve per size.

use std::path::Path;

use plotters::prelude::*;

use super::PerfError;
use super::baseline::Baseline;
use super::report::Report;
use super::spec::Mode;

/// Draws `report` into the SVG file `path`.
pub(crate) fn draw(report: &Report, path: &Path) -> Result<(), PerfError> {
    let fail = |e: String| PerfError::Io(format!("drawing {}: {e}", path.display()));
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let title = format!("softrdma perf {} ({}, {} QP)", report.test, report.spec.conn, report.spec.qps);
    let results = &report.results;
    match report.spec.mode {
        Mode::Bw => {
            let points: Vec<(u64, f64)> =
                results.iter().map(|r| (r.bytes, r.bw_avg_gbit_per_sec.unwrap_or(0.0))).collect();
            let top = points.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-3) * 1.15;
            let (lo, hi) = size_range(results.iter().map(|r| r.bytes));
            let mut chart = log_chart(&root, &title, (lo, hi), top, "message size (bytes)", "average bandwidth (Gb/s)")
                .map_err(fail)?;
            curve(&mut chart, &points, BLUE.to_rgba(), "softrdma".into()).map_err(fail)?;
            if let Some(b) = &report.baseline {
                let limit = b.udp_gso_gro_gbytes_per_sec * 8.0;
                if limit < top * 4.0 {
                    limit_line(&mut chart, (lo, hi), limit).map_err(fail)?;
                }
            }
            legend(&mut chart).map_err(fail)?;
        }
        Mode::Lat if results.len() > 1 => {
            let med: Vec<(u64, f64)> =
                results.iter().filter_map(|r| r.latency_us.map(|l| (r.bytes, l.median))).collect();
            let p99: Vec<(u64, f64)> = results.iter().filter_map(|r| r.latency_us.map(|l| (r.bytes, l.p99))).collect();
            let top = p99.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-3) * 1.15;
            let (lo, hi) = size_range(results.iter().map(|r| r.bytes));
            let mut chart =
                log_chart(&root, &title, (lo, hi), top, "message size (bytes)", "latency (us)").map_err(fail)?;
            for (points, color, name) in [(med, BLUE, "median"), (p99, RED, "p99")] {
                chart
                    .draw_series(LineSeries::new(points, color.stroke_width(2)))
                    .map_err(|e| fail(e.to_string()))?
                    .label(name)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            }
            legend(&mut chart).map_err(fail)?;
        }
        Mode::Lat => {
            let r = results.first().ok_or_else(|| fail("no results".into()))?;
            let mut us = r.samples_us.clone();
            us.sort_by(f64::total_cmp);
            if us.is_empty() {
                return Err(fail("no latency samples".into()));
            }
            // Up to the p99: the tail past it (scheduler hiccups, a few samples tens of
            // microseconds long) would squash the body into a bin or two; it is counted in
            // the axis label instead, and the median is marked.
            let pick = |q: f64| us[((us.len() as f64 * q).ceil() as usize).clamp(1, us.len()) - 1];
            let (lo, median, hi) = (us[0], pick(0.5), pick(0.99));
            let beyond = us.iter().filter(|x| **x > hi).count();
            let bins = 60usize;
            let width = ((hi - lo) / bins as f64).max(1e-3);
            let mut counts = vec![0u32; bins];
            for x in us.iter().filter(|x| **x <= hi) {
                counts[(((x - lo) / width) as usize).min(bins - 1)] += 1;
            }
            let ymax = f64::from(counts.iter().copied().max().unwrap_or(1)) * 1.1;
            let mut chart = ChartBuilder::on(&root)
                .caption(format!("{title}, {} B", r.bytes), ("sans-serif", 22))
                .margin(16)
                .x_label_area_size(44)
                .y_label_area_size(64)
                .build_cartesian_2d(lo..lo + width * bins as f64, 0f64..ymax)
                .map_err(|e| fail(e.to_string()))?;
            chart
                .configure_mesh()
                .x_desc(format!(
                    "latency (us), {}; up to the p99, {beyond} slower not shown",
                    report.latency_is.unwrap_or("")
                ))
                .y_desc("operations")
                .draw()
                .map_err(|e| fail(e.to_string()))?;
            chart
                .draw_series(counts.iter().enumerate().map(|(i, &c)| {
                    let x0 = lo + width * i as f64;
                    Rectangle::new([(x0, 0.0), (x0 + width, f64::from(c))], BLUE.mix(0.7).filled())
                }))
                .map_err(|e| fail(e.to_string()))?;
            chart
                .draw_series(LineSeries::new([(median, 0.0), (median, ymax)], RED.stroke_width(2)))
                .map_err(|e| fail(e.to_string()))?
                .label(format!("median {median:.2} us"))
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
            legend(&mut chart).map_err(fail)?;
        }
    }
    root.present().map_err(|e| fail(e.to_string()))?;
    Ok(())
}

/// A chart of bandwidth against a log axis, as `log_chart` makes it.
type LogChart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<LogCoord<u64>, plotters::coord::types::RangedCoordf64>>;

/// Draws `points` as a labelled line with a dot at each point.
fn curve(chart: &mut LogChart<'_, '_>, points: &[(u64, f64)], color: RGBAColor, label: String) -> Result<(), String> {
    chart
        .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
        .map_err(|e| e.to_string())?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(|e| e.to_string())?;
    Ok(())
}

/// Draws the machine's UDP GSO+GRO goodput across the chart, as the limit it is.
fn limit_line(chart: &mut LogChart<'_, '_>, (lo, hi): (u64, u64), limit: f64) -> Result<(), String> {
    chart
        .draw_series(LineSeries::new([(lo, limit), (hi, limit)], RED.stroke_width(1)))
        .map_err(|e| e.to_string())?
        .label("UDP GSO+GRO goodput (baseline)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    Ok(())
}

/// Draws the legend of `chart`'s labelled series, in its one style.
fn legend<'a, 'b: 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, CT>,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| e.to_string())
}

/// `--qps-sweep --plot`: average bandwidth against QPs (log axis), one curve per size,
/// and the machine's UDP GSO+GRO goodput when it was measured.
pub(crate) fn draw_sweep(reports: &[Report], baseline: Option<&Baseline>, path: &Path) -> Result<(), PerfError> {
    let fail = |e: String| PerfError::Io(format!("drawing {}: {e}", path.display()));
    let Some(first) = reports.first() else { return Ok(()) };
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let title = format!("softrdma perf {} ({}): bandwidth against QPs", first.test, first.spec.conn);
    let gbits = |mb: Option<f64>| mb.unwrap_or(0.0) * 8.0 / 1e3;
    let mut top: f64 = 1e-3;
    for r in reports {
        for x in &r.results {
            top = top.max(gbits(x.bw_avg_mb_per_sec));
        }
    }
    let limit = baseline.map(|b| b.udp_gso_gro_gbytes_per_sec * 8.0).filter(|l| *l < top * 4.0);
    let top = top.max(limit.unwrap_or(0.0)) * 1.15;
    let (lo, hi) = size_range(reports.iter().map(|r| u64::from(r.spec.qps)));
    let mut chart = log_chart(&root, &title, (lo, hi), top, "queue pairs", "average bandwidth (Gb/s)").map_err(fail)?;
    for (k, &size) in first.spec.sizes.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        let points: Vec<(u64, f64)> = reports
            .iter()
            .filter_map(|r| r.results.iter().find(|x| x.bytes == size).map(|x| (u64::from(r.spec.qps), x)))
            .map(|(q, x)| (q, gbits(x.bw_avg_mb_per_sec)))
            .collect();
        curve(&mut chart, &points, color, format!("{size} B")).map_err(fail)?;
    }
    if let Some(limit) = limit {
        limit_line(&mut chart, (lo, hi), limit).map_err(fail)?;
    }
    legend(&mut chart).map_err(fail)?;
    root.present().map_err(|e| fail(e.to_string()))?;
    Ok(())
}

/// A chart of some figure (0 to `top`, named `y_desc`) against a log axis (named
/// `x_desc`) over `lo..hi`, with its mesh drawn.
fn log_chart<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    title: &str,
    (lo, hi): (u64, u64),
    top: f64,
    x_desc: &str,
    y_desc: &str,
) -> Result<LogChart<'a, 'b>, String> {
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..top)
        .map_err(|e| e.to_string())?;
    chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw().map_err(|e| e.to_string())?;
    Ok(chart)
}

/// The x range of a log axis over `sizes` (or QP counts), a little wider than they span.
fn size_range(sizes: impl Iterator<Item = u64>) -> (u64, u64) {
    let (mut lo, mut hi) = (u64::MAX, 1);
    for s in sizes {
        lo = lo.min(s);
        hi = hi.max(s);
    }
    ((lo / 2).max(1), hi.saturating_mul(2).max(lo.saturating_mul(4)))
}
