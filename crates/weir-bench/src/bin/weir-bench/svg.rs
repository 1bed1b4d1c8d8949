//! The SVG chart: one row per case, throughput over time on the left and end-to-end latency over
//! time on the right, one colour per target, 1-second buckets. Written by hand: it is a few
//! rectangles, lines and text elements.
//!
//! Every data line is a `<polyline class="series">` with `data-target`, `data-case` and
//! `data-metric` (produce, consume, e2e-p50, e2e-p99) attributes, so the file can be checked or
//! restyled by a program; a line broken by a second without data is several polylines.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;

use crate::report::RunResult;
use crate::stats::SeriesPoint;

const WIDTH: f64 = 1100.0;
const HEADER: f64 = 78.0;
const ROW: f64 = 215.0;
const PANEL_LEFT: [f64; 2] = [70.0, 620.0];
const PANEL_WIDTH: f64 = 440.0;
const PANEL_TOP: f64 = 36.0;
const PANEL_HEIGHT: f64 = 140.0;
/// One colour per target, in --bootstrap order (then again from the start).
const COLOURS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf"];

pub fn write(path: &Path, results: &[RunResult], title: &str) -> anyhow::Result<()> {
    std::fs::write(path, render(results, title)).with_context(|| format!("cannot write {}", path.display()))
}

/// The chart as SVG text.
pub fn render(results: &[RunResult], title: &str) -> String {
    let mut targets: Vec<&str> = Vec::new();
    let mut cases: Vec<(String, String)> = Vec::new();
    for r in results {
        if !targets.contains(&r.target.as_str()) {
            targets.push(&r.target);
        }
        let case = (r.workload.name().to_string(), r.case.clone());
        if !cases.contains(&case) {
            cases.push(case);
        }
    }
    let colour = |target: &str| COLOURS[targets.iter().position(|t| *t == target).unwrap_or(0) % COLOURS.len()];
    let height = HEADER + ROW * cases.len().max(1) as f64;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(svg, r#"<text x="{}" y="22" font-size="15" font-weight="bold">{}</text>"#, 20, escape(title));
    // Legend: targets by colour, metrics by line style.
    let mut x = 20.0;
    for target in &targets {
        let _ = writeln!(
            svg,
            r#"<line x1="{x}" y1="42" x2="{}" y2="42" stroke="{}" stroke-width="3"/><text x="{}" y="46">{}</text>"#,
            x + 22.0,
            colour(target),
            x + 28.0,
            escape(target)
        );
        x += 40.0 + 7.0 * target.chars().count() as f64;
    }
    let _ = writeln!(
        svg,
        r##"<text x="20" y="66" fill="#444">left: MB/s per second (solid produce, dashed consume); right: end-to-end latency, ms, log scale (solid p99, dotted p50); grey: warm-up, not in the summary</text>"##
    );

    for (row, (workload, case)) in cases.iter().enumerate() {
        let top = HEADER + ROW * row as f64;
        let row_results: Vec<&RunResult> =
            results.iter().filter(|r| r.workload.name() == workload && &r.case == case).collect();
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" font-size="13" font-weight="bold">{} — {}</text>"#,
            20,
            top + 12.0,
            escape(workload),
            escape(case)
        );
        let seconds =
            row_results.iter().flat_map(|r| r.series.iter().map(|p| p.t_s + 1)).max().unwrap_or(1).max(1) as f64;
        let warmup = row_results.iter().map(|r| r.warmup_s).fold(0.0, f64::max);

        // Throughput panel.
        let max_mb = row_results
            .iter()
            .flat_map(|r| r.series.iter().map(|p| p.produce_mb_per_s.max(p.consume_mb_per_s)))
            .fold(0.0, f64::max);
        let y_top = nice_ceiling(max_mb);
        let panel = Panel { left: PANEL_LEFT[0], top: top + PANEL_TOP, seconds, scale: Scale::Linear { max: y_top } };
        panel.frame(&mut svg, warmup, "MB/s");
        for r in &row_results {
            let points = |f: fn(&SeriesPoint) -> Option<f64>| r.series.iter().map(move |p| (p.middle_s(), f(p)));
            panel.line(&mut svg, r, "produce", colour(&r.target), "", points(|p| Some(p.produce_mb_per_s)));
            panel.line(&mut svg, r, "consume", colour(&r.target), "6 3", points(|p| Some(p.consume_mb_per_s)));
        }

        // Latency panel (log scale).
        let latencies: Vec<f64> = row_results
            .iter()
            .flat_map(|r| r.series.iter().flat_map(|p| [p.e2e_p50_ms, p.e2e_p99_ms]))
            .flatten()
            .filter(|v| *v > 0.0)
            .collect();
        if latencies.is_empty() {
            let _ = writeln!(
                svg,
                r##"<text x="{}" y="{}" fill="#666">no end-to-end latency for this workload</text>"##,
                PANEL_LEFT[1] + 20.0,
                top + PANEL_TOP + PANEL_HEIGHT / 2.0
            );
            continue;
        }
        let low = latencies.iter().copied().fold(f64::MAX, f64::min).log10().floor();
        let high = latencies.iter().copied().fold(0.0, f64::max).log10().ceil().max(low + 1.0);
        let panel = Panel { left: PANEL_LEFT[1], top: top + PANEL_TOP, seconds, scale: Scale::Log { low, high } };
        panel.frame(&mut svg, warmup, "ms");
        for r in &row_results {
            let points = |f: fn(&SeriesPoint) -> Option<f64>| r.series.iter().map(move |p| (p.middle_s(), f(p)));
            panel.line(&mut svg, r, "e2e-p99", colour(&r.target), "", points(|p| p.e2e_p99_ms));
            panel.line(&mut svg, r, "e2e-p50", colour(&r.target), "2 3", points(|p| p.e2e_p50_ms));
        }
    }
    svg.push_str("</svg>\n");
    svg
}

#[derive(Debug, Clone, Copy)]
enum Scale {
    /// 0 ..= max.
    Linear { max: f64 },
    /// 10^low ..= 10^high.
    Log { low: f64, high: f64 },
}

struct Panel {
    left: f64,
    top: f64,
    /// The x axis spans 0 ..= seconds.
    seconds: f64,
    scale: Scale,
}

impl Panel {
    fn x(&self, t_s: f64) -> f64 {
        self.left + t_s / self.seconds * PANEL_WIDTH
    }

    /// None for a value the scale cannot show (zero or less on a log scale).
    fn y(&self, value: f64) -> Option<f64> {
        let fraction = match self.scale {
            Scale::Linear { max } => value / max,
            Scale::Log { low, high } if value > 0.0 => (value.log10() - low) / (high - low),
            Scale::Log { .. } => return None,
        };
        Some(self.top + PANEL_HEIGHT * (1.0 - fraction.clamp(0.0, 1.0)))
    }

    fn frame(&self, svg: &mut String, warmup_s: f64, unit: &str) {
        let bottom = self.top + PANEL_HEIGHT;
        if warmup_s > 0.0 {
            let _ = writeln!(
                svg,
                r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{PANEL_HEIGHT}" fill="#eee"/>"##,
                self.left,
                self.top,
                self.x(warmup_s.min(self.seconds)) - self.left
            );
        }
        let _ = writeln!(
            svg,
            r##"<rect x="{:.1}" y="{:.1}" width="{PANEL_WIDTH}" height="{PANEL_HEIGHT}" fill="none" stroke="#999"/>"##,
            self.left, self.top
        );
        // y ticks and grid.
        let ticks: Vec<(f64, String)> = match self.scale {
            Scale::Linear { max } => {
                let step = nice_step(max / 4.0);
                (0..)
                    .map(|i| i as f64 * step)
                    .take_while(|v| *v <= max * 1.0001)
                    .map(|v| (v, format_number(v)))
                    .collect()
            }
            Scale::Log { low, high } => {
                (low as i32..=high as i32).map(|e| (10f64.powi(e), format_number(10f64.powi(e)))).collect()
            }
        };
        for (value, label) in ticks {
            let Some(y) = self.y(value) else { continue };
            let _ = writeln!(
                svg,
                r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"##,
                self.left,
                self.left + PANEL_WIDTH,
                self.left - 4.0,
                y + 4.0
            );
        }
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#444">{unit}</text>"##,
            self.left - 4.0,
            self.top - 6.0
        );
        // x ticks: seconds.
        let step = nice_step(self.seconds / 6.0).max(1.0);
        let mut t = 0.0;
        while t <= self.seconds + 1e-9 {
            let x = self.x(t);
            let _ = writeln!(
                svg,
                r##"<line x1="{x:.1}" y1="{bottom:.1}" x2="{x:.1}" y2="{:.1}" stroke="#999"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                bottom + 4.0,
                bottom + 15.0,
                format_number(t)
            );
            t += step;
        }
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#444">seconds</text>"##,
            self.left + PANEL_WIDTH,
            bottom + 28.0
        );
    }

    /// One series as polylines, broken where a second has no value. Each point is plotted at
    /// the middle of its bucket (`middle_s`).
    fn line(
        &self,
        svg: &mut String,
        result: &RunResult,
        metric: &str,
        colour: &str,
        dash: &str,
        points: impl Iterator<Item = (f64, Option<f64>)>,
    ) {
        let mut segments: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for (t_s, value) in points {
            match value.and_then(|v| self.y(v)) {
                Some(y) => segments.last_mut().map_or((), |s| s.push((self.x(t_s), y))),
                None => segments.push(Vec::new()),
            }
        }
        for segment in segments.iter().filter(|s| !s.is_empty()) {
            let mut coordinates = String::new();
            for (x, y) in segment {
                let _ = write!(coordinates, "{x:.1},{y:.1} ");
            }
            let dash = if dash.is_empty() { String::new() } else { format!(r#" stroke-dasharray="{dash}""#) };
            let _ = writeln!(
                svg,
                r#"<polyline class="series" data-target="{}" data-case="{}" data-metric="{metric}" fill="none" stroke="{colour}" stroke-width="1.5"{dash} points="{}"/>"#,
                escape(&result.target),
                escape(&format!("{} {}", result.workload.name(), result.case)),
                coordinates.trim_end()
            );
        }
    }
}

/// The smallest of 1, 2 or 5 times a power of ten that is at least `value` (positive).
fn nice_step(value: f64) -> f64 {
    if value <= 0.0 || !value.is_finite() {
        return 1.0;
    }
    let magnitude = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * magnitude).find(|step| *step >= value * 0.9999).unwrap_or(10.0 * magnitude)
}

/// A round axis top above `value`: a multiple of its tick step.
fn nice_ceiling(value: f64) -> f64 {
    if value <= 0.0 || !value.is_finite() {
        return 1.0;
    }
    let step = nice_step(value / 4.0);
    (value / step).ceil().max(1.0) * step
}

fn format_number(value: f64) -> String {
    if value == 0.0 || value.abs() >= 1.0 {
        format!("{}", (value * 100.0).round() / 100.0)
    } else {
        let text = format!("{value:.6}");
        text.trim_end_matches('0').to_string()
    }
}

/// Text and attribute values: the five characters XML reserves.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::cli::Workload;
    use crate::report::tests::sample_result;

    #[test]
    fn chart_is_well_formed_xml_with_every_series() {
        let mut catch_up = sample_result("kafka <&> \"3.9\"", Workload::CatchUp, "16 MiB backlog");
        for point in &mut catch_up.series {
            point.e2e_p50_ms = None;
            point.e2e_p99_ms = None;
        }
        let results = vec![
            sample_result("weir", Workload::MaxThroughput, "1 producer, acks=1"),
            sample_result("kafka <&> \"3.9\"", Workload::MaxThroughput, "1 producer, acks=1"),
            sample_result("weir", Workload::Latency, "20000 msg/s, acks=all"),
            catch_up,
        ];
        let svg = render(&results, "weir-bench <test>");
        let document = roxmltree::Document::parse(&svg).expect("well-formed XML");
        let root = document.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        assert_eq!(root.tag_name().namespace(), Some("http://www.w3.org/2000/svg"));

        let series: Vec<(String, String, String)> = document
            .descendants()
            .filter(|n| n.attribute("class") == Some("series"))
            .map(|n| {
                assert_eq!(n.tag_name().name(), "polyline");
                let points = n.attribute("points").unwrap();
                for pair in points.split(' ') {
                    let (x, y) = pair.split_once(',').unwrap();
                    let (x, y): (f64, f64) = (x.parse().unwrap(), y.parse().unwrap());
                    assert!((0.0..=WIDTH).contains(&x) && y >= HEADER, "point {pair} outside the chart");
                }
                (
                    n.attribute("data-target").unwrap().to_string(),
                    n.attribute("data-case").unwrap().to_string(),
                    n.attribute("data-metric").unwrap().to_string(),
                )
            })
            .collect();
        let distinct: BTreeSet<_> = series.iter().cloned().collect();
        let expect = |target: &str, case: &str, metric: &str| {
            assert!(
                distinct.contains(&(target.to_string(), case.to_string(), metric.to_string())),
                "no {metric} series for {target} {case}: {distinct:?}"
            );
        };
        for target in ["weir", "kafka <&> \"3.9\""] {
            for metric in ["produce", "consume", "e2e-p50", "e2e-p99"] {
                expect(target, "max-throughput 1 producer, acks=1", metric);
            }
        }
        expect("weir", "latency 20000 msg/s, acks=all", "e2e-p99");
        expect("kafka <&> \"3.9\"", "catch-up 16 MiB backlog", "consume");
        // 3 results x 4 metrics + catch-up's 2 throughput lines; latency has no value at t=2, so
        // each p99 line is two polylines.
        assert_eq!(distinct.len(), 3 * 4 + 2, "{distinct:?}");
        let p99_lines = series.iter().filter(|s| s.0 == "weir" && s.2 == "e2e-p99").count();
        assert_eq!(p99_lines, 4, "weir has two latency cases, each p99 line broken once");
        assert!(svg.contains("no end-to-end latency for this workload"));
        // One row title per case, and the warm-up shading.
        let titles: Vec<&str> = document
            .descendants()
            .filter(|n| n.attribute("font-size") == Some("13"))
            .filter_map(|n| n.text())
            .collect();
        assert_eq!(titles.len(), 3, "{titles:?}");
        assert!(document.descendants().any(|n| n.attribute("fill") == Some("#eee")));
    }

    #[test]
    fn an_empty_chart_is_still_valid() {
        let svg = render(&[], "nothing");
        roxmltree::Document::parse(&svg).expect("well-formed XML");
    }

    #[test]
    fn axis_steps_are_round() {
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(20.0), 20.0);
        assert_eq!(nice_step(21.0), 50.0);
        assert_eq!(nice_ceiling(103.0), 150.0);
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(format_number(0.01), "0.01");
        assert_eq!(format_number(250.0), "250");
    }

    #[test]
    fn escape_covers_xml_specials() {
        assert_eq!(escape(r#"a<b>&"c'"#), "a&lt;b&gt;&amp;&quot;c&apos;");
    }
}
