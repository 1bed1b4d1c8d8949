//! Results: one [`RunResult`] per case and target, the summary table, and the JSON document.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use crate::cli::{Acks, Partitioner, Workload};
use crate::procstat::ProcessUsage;
use crate::reference::Reference;
use crate::stats::{Flow, Percentiles, SeriesPoint};

/// Messages and bytes after the warm-up, as rates, plus the whole run's totals.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FlowSummary {
    /// MB = 10^6 bytes of message values, per second, over the measured window.
    pub mb_per_s: f64,
    pub msgs_per_s: f64,
    /// Counted in the measured window.
    pub msgs: u64,
    pub bytes: u64,
    pub seconds: f64,
    /// The whole run, warm-up included (acknowledged, or received).
    pub msgs_total: u64,
    pub errors: u64,
}

impl FlowSummary {
    pub fn new(flow: &Flow, msgs_total: u64, errors: u64) -> FlowSummary {
        let rate = flow.rate();
        FlowSummary {
            mb_per_s: rate.mb_per_s,
            msgs_per_s: rate.msgs_per_s,
            msgs: rate.msgs,
            bytes: rate.bytes,
            seconds: rate.seconds,
            msgs_total,
            errors,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub target: String,
    pub bootstrap: String,
    pub workload: Workload,
    pub case: String,
    pub partitions: u32,
    pub producers: u32,
    pub acks: Acks,
    pub linger_ms: u32,
    pub message_bytes: u64,
    pub partitioner: Partitioner,
    pub target_rate_msgs_per_s: Option<u64>,
    pub warmup_s: f64,
    /// Acknowledged by the broker (for catch-up: while writing the backlog).
    pub produced: FlowSummary,
    /// Received by the consumer (for catch-up: draining the backlog).
    pub consumed: FlowSummary,
    /// Send stamp to delivery report (the producer's acknowledgement).
    pub publish_latency: Option<Percentiles>,
    /// Send stamp to the consumer's receipt; none for catch-up.
    pub e2e_latency: Option<Percentiles>,
    pub broker: Option<ProcessUsage>,
    /// This process (producers, consumer, librdkafka's threads) over the same time as `broker`.
    pub client: Option<ProcessUsage>,
    /// Catch-up only: the broker and the clients while the backlog was written (`broker` and
    /// `client` are the drain).
    pub broker_write: Option<ProcessUsage>,
    pub client_write: Option<ProcessUsage>,
    /// The broker's peak RSS early in the measured window and late in it (first and last
    /// quarter): a soak shows whether memory grows with the bytes written.
    pub broker_rss_trend: Option<RssTrend>,
    /// Every acknowledged message was received, with no error.
    pub complete: bool,
    pub problems: Vec<String>,
    /// Errors the clients logged without failing the run (a connection retried, say).
    pub notes: Vec<String>,
    /// 1-second buckets from the start of the run (catch-up: the write, then the drain).
    pub series: Vec<SeriesPoint>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RssTrend {
    pub early_peak_bytes: u64,
    pub late_peak_bytes: u64,
}

/// The JSON file: everything the table shows and the series behind the chart.
#[derive(Debug, Serialize)]
pub struct Document<'a> {
    pub tool: &'static str,
    pub version: &'static str,
    /// Seconds since the Unix epoch at the start of the run.
    pub started_unix_s: u64,
    pub command: Vec<String>,
    pub quick: bool,
    pub cores: usize,
    pub reference: Option<&'a Reference>,
    pub results: &'a [RunResult],
}

pub fn write_json(path: &Path, document: &Document<'_>) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(document)?;
    std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))
}

/// The summary table, one line per run, grouped by case so that targets sit side by side.
pub fn table(results: &[RunResult], reference: Option<&Reference>) -> String {
    let mut out = String::new();
    if let Some(r) = reference {
        let _ = writeln!(
            out,
            "machine: sequential write {:.0} MB/s ({} in 1 MiB chunks + fdatasync, {}), loopback TCP {:.0} MB/s",
            r.disk_write_mb_per_s,
            crate::workload::human_bytes(r.disk_bytes),
            r.disk_dir.display(),
            r.loopback_mb_per_s
        );
    }
    let headers = [
        "target",
        "workload",
        "case",
        "prod MB/s",
        "prod msg/s",
        "cons MB/s",
        "cons msg/s",
        "e2e p50",
        "p99",
        "p99.9",
        "max ms",
        "pub p99",
        "%disk",
        "cpu %",
        "client %",
        "rss MiB",
        "ok",
    ];
    let mut rows: Vec<Vec<String>> = Vec::new();
    for r in results {
        let latency = |f: fn(&Percentiles) -> f64| r.e2e_latency.as_ref().map_or("-".to_string(), |p| ms(f(p)));
        rows.push(vec![
            r.target.clone(),
            r.workload.name().to_string(),
            r.case.clone(),
            format!("{:.1}", r.produced.mb_per_s),
            format!("{:.0}", r.produced.msgs_per_s),
            format!("{:.1}", r.consumed.mb_per_s),
            format!("{:.0}", r.consumed.msgs_per_s),
            latency(|p| p.p50_ms),
            latency(|p| p.p99_ms),
            latency(|p| p.p999_ms),
            latency(|p| p.max_ms),
            r.publish_latency.as_ref().map_or("-".to_string(), |p| ms(p.p99_ms)),
            reference.map_or("-".to_string(), |reference| {
                format!("{:.0}%", r.produced.mb_per_s / reference.disk_write_mb_per_s.max(1e-9) * 100.0)
            }),
            cpu_cell(r.broker_write, r.broker),
            cpu_cell(r.client_write, r.client),
            r.broker.map_or("-".to_string(), |b| format!("{:.0}", b.rss_peak_bytes as f64 / (1 << 20) as f64)),
            if r.complete { "yes".into() } else { "NO".into() },
        ]);
    }
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &[String], out: &mut String| {
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            // Text columns left-aligned, figures right-aligned.
            let _ = if i < 3 { write!(out, "{cell:<width$}  ") } else { write!(out, "{cell:>width$}  ") };
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
    };
    line(&headers.iter().map(|h| h.to_string()).collect::<Vec<_>>(), &mut out);
    for row in &rows {
        line(row, &mut out);
    }
    out.push_str(
        "MB = 10^6 bytes of message values. Latencies in ms: e2e from the send stamp to the consumer, pub to the \
         producer's acknowledgement.\ncatch-up: prod = writing the backlog, cons = draining it; cpu % = broker \
         CPU, client % = this process's CPU (all clients), both as write/drain for catch-up; 100 = one core. \
         %disk = prod MB/s over the sequential-write reference.\n",
    );
    for r in results.iter().filter(|r| !r.problems.is_empty() || !r.notes.is_empty()) {
        let _ = writeln!(out, "problems of {} {} {}:", r.target, r.workload.name(), r.case);
        for problem in &r.problems {
            let _ = writeln!(out, "  {problem}");
        }
        for note in &r.notes {
            let _ = writeln!(out, "  (client log) {note}");
        }
    }
    out
}

/// A latency in milliseconds with 3 significant figures or so.
fn ms(value: f64) -> String {
    if value < 10.0 {
        format!("{value:.2}")
    } else if value < 100.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.0}")
    }
}

/// A CPU cell: "45", or "45/22" when a write phase came first (catch-up).
fn cpu_cell(write: Option<ProcessUsage>, main: Option<ProcessUsage>) -> String {
    match (write, main) {
        (Some(w), Some(m)) => format!("{:.0}/{:.0}", w.cpu_percent, m.cpu_percent),
        (_, Some(m)) => format!("{:.0}", m.cpu_percent),
        (Some(w), None) => format!("{:.0}/-", w.cpu_percent),
        (None, None) => "-".to_string(),
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A result as a run would produce it, for the report and chart tests.
    pub fn sample_result(target: &str, workload: Workload, case: &str) -> RunResult {
        let series = (0..5)
            .map(|t| SeriesPoint {
                t_s: t,
                span_s: 1.0,
                produce_mb_per_s: 100.0 + t as f64,
                consume_mb_per_s: 99.0 + t as f64,
                produce_msgs_per_s: 100_000,
                consume_msgs_per_s: 99_000,
                e2e_p50_ms: Some(1.0 + t as f64),
                e2e_p99_ms: if t == 2 { None } else { Some(10.0 * (t + 1) as f64) },
                broker_rss_mib: Some(100.0),
            })
            .collect();
        let flow = FlowSummary {
            mb_per_s: 102.4,
            msgs_per_s: 100_000.0,
            msgs: 500_000,
            bytes: 512_000_000,
            seconds: 5.0,
            msgs_total: 500_000,
            errors: 0,
        };
        RunResult {
            target: target.into(),
            bootstrap: "127.0.0.1:9092".into(),
            workload,
            case: case.into(),
            partitions: 6,
            producers: 1,
            acks: Acks::One,
            linger_ms: 5,
            message_bytes: 1024,
            partitioner: Partitioner::Client,
            target_rate_msgs_per_s: None,
            warmup_s: 1.0,
            produced: flow,
            consumed: flow,
            publish_latency: Some(Percentiles {
                count: 10,
                mean_ms: 2.0,
                p50_ms: 1.5,
                p99_ms: 4.25,
                p999_ms: 5.0,
                max_ms: 6.0,
            }),
            e2e_latency: Some(Percentiles {
                count: 10,
                mean_ms: 3.0,
                p50_ms: 2.5,
                p99_ms: 12.5,
                p999_ms: 150.0,
                max_ms: 1234.0,
            }),
            broker: Some(ProcessUsage {
                pid: 1,
                cpu_percent: 87.4,
                cpu_seconds: 4.0,
                rss_peak_bytes: 100 << 20,
                vm_hwm_bytes: 120 << 20,
            }),
            client: None,
            broker_write: None,
            client_write: None,
            broker_rss_trend: None,
            complete: true,
            problems: vec![],
            notes: vec![],
            series,
        }
    }

    #[test]
    fn table_has_one_aligned_row_per_result() {
        let mut results = vec![
            sample_result("weir", Workload::MaxThroughput, "1 producer, acks=1"),
            sample_result("other-broker", Workload::MaxThroughput, "1 producer, acks=1"),
        ];
        results[1].complete = false;
        results[1].problems = vec!["the consumer received 1 of 2 messages".into()];
        results[1].broker = None;
        let reference = Reference {
            disk_write_mb_per_s: 204.8,
            disk_bytes: 1 << 30,
            disk_dir: "/tmp/x".into(),
            loopback_mb_per_s: 4000.0,
            loopback_seconds: 3.0,
        };
        let text = table(&results, Some(&reference));
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("machine: sequential write 205 MB/s (1 GiB"), "{text}");
        assert!(lines[1].starts_with("target"), "{text}");
        let weir = lines[2];
        assert!(weir.starts_with("weir "), "{text}");
        for cell in ["102.4", "100000", "2.50", "12.5", "150", "1234", "4.25", "50%", "87", "100", "yes"] {
            assert!(weir.split_whitespace().any(|c| c == cell), "no {cell} in {weir:?}");
        }
        assert!(lines[3].starts_with("other-broker") && lines[3].ends_with("NO"), "{text}");
        // Figures are right-aligned: both rows end at the same column.
        assert_eq!(lines[1].len(), lines[2].len(), "{text}");
        assert!(text.contains("problems of other-broker max-throughput 1 producer, acks=1:"), "{text}");
    }

    #[test]
    fn json_document_holds_every_result() {
        let results = vec![sample_result("weir", Workload::CatchUp, "16 MiB backlog")];
        let document = Document {
            tool: "weir-bench",
            version: "0",
            started_unix_s: 1,
            command: vec!["weir-bench".into()],
            quick: true,
            cores: 2,
            reference: None,
            results: &results,
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.json");
        write_json(&path, &document).unwrap();
        let value: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let result = &value["results"][0];
        assert_eq!(result["workload"], "catch-up");
        assert_eq!(result["acks"], "1");
        assert_eq!(result["produced"]["mb_per_s"], 102.4);
        assert_eq!(result["e2e_latency"]["p999_ms"], 150.0);
        assert_eq!(result["series"].as_array().unwrap().len(), 5);
        assert_eq!(result["series"][2]["e2e_p99_ms"], serde_json::Value::Null);
    }
}
