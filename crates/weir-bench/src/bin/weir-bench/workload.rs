//! The four workloads as cases (one run each, per target), and how a case runs against a target.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::cli::{Acks, Plan, Target, Workload};
use crate::kafka;
use crate::report::{FlowSummary, RssTrend, RunResult};
use crate::run::{run_phase, ConsumerMode, PhaseOutcome, PhaseSpec};
use crate::stats::{SeriesPoint, NANOS_PER_SEC};

/// linger.ms of the throughput workloads: batches fill up (the OpenMessaging Kafka driver's
/// throughput settings use a few milliseconds too).
const LINGER_MS_THROUGHPUT: u32 = 5;
/// linger.ms of the latency workload: the OpenMessaging Kafka driver's value.
const LINGER_MS_LATENCY: u32 = 1;

/// One run's settings, the same for every target.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub workload: Workload,
    pub label: String,
    pub partitions: u32,
    pub producers: u32,
    pub acks: Acks,
    pub rate: Option<u64>,
    pub linger_ms: u32,
}

/// Every case of the plan's workloads, in running order.
pub fn cases(plan: &Plan) -> Vec<Case> {
    let first_producers = plan.producers.first().copied().unwrap_or(1);
    let first_acks = plan.acks.first().copied().unwrap_or(Acks::One);
    let mut cases = Vec::new();
    for &workload in &plan.workloads {
        match workload {
            Workload::MaxThroughput => {
                for &producers in &plan.producers {
                    for &acks in &plan.acks {
                        cases.push(Case {
                            workload,
                            label: format!(
                                "{} {}, acks={}",
                                producers,
                                plural(producers, "producer"),
                                acks.config_value()
                            ),
                            partitions: plan.partitions,
                            producers,
                            acks,
                            rate: None,
                            linger_ms: LINGER_MS_THROUGHPUT,
                        });
                    }
                }
            }
            Workload::Latency => cases.push(Case {
                workload,
                label: format!("{} msg/s, acks=all", plan.rate),
                partitions: plan.partitions,
                producers: 1,
                acks: Acks::All,
                rate: Some(plan.rate),
                linger_ms: LINGER_MS_LATENCY,
            }),
            Workload::ManyPartitions => cases.push(Case {
                workload,
                label: format!(
                    "{} partitions, {} {}, acks={}",
                    plan.many_partitions,
                    first_producers,
                    plural(first_producers, "producer"),
                    first_acks.config_value()
                ),
                partitions: plan.many_partitions,
                producers: first_producers,
                acks: first_acks,
                rate: None,
                linger_ms: LINGER_MS_THROUGHPUT,
            }),
            Workload::CatchUp => cases.push(Case {
                workload,
                label: format!("{} backlog", human_bytes(plan.backlog_bytes)),
                partitions: plan.partitions,
                producers: first_producers,
                acks: first_acks,
                rate: None,
                linger_ms: LINGER_MS_THROUGHPUT,
            }),
        }
    }
    cases
}

fn plural(n: u32, word: &str) -> String {
    if n == 1 {
        word.to_string()
    } else {
        format!("{word}s")
    }
}

/// 2 GiB, 16 MiB, 1.5 GiB, 512 KiB, 100 B.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if bytes >= size {
            let value = bytes as f64 / size as f64;
            return if bytes.is_multiple_of(size) {
                format!("{} {unit}", bytes / size)
            } else {
                format!("{value:.1} {unit}")
            };
        }
    }
    format!("{bytes} B")
}

/// A topic name unique to this process and run.
fn topic_name(workload: Workload) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let unique = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    format!(
        "weir-bench-{}-{}-{unique}-{}",
        workload.name(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs `case` against `target`: creates its topic, runs the phases, deletes the topic.
pub fn run_case(plan: &Plan, case: &Case, target: &Target, broker_pid: Option<u32>) -> anyhow::Result<RunResult> {
    let topic = topic_name(case.workload);
    kafka::create_topic(&target.bootstrap, &plan.client_config, &topic, case.partitions, plan.replication_factor)?;
    let label = format!("{}: {} {}", target.name, case.workload.name(), case.label);
    let base = PhaseSpec {
        label: shorten(&label, 32),
        bootstrap: target.bootstrap.clone(),
        client_config: plan.client_config.clone(),
        topic: topic.clone(),
        partitions: case.partitions,
        producers: case.producers,
        acks: case.acks,
        linger_ms: case.linger_ms,
        producer_buffer_kib: plan.producer_buffer_kib,
        message_bytes: plan.message_bytes,
        partitioner: plan.partitioner,
        rate: case.rate,
        duration: plan.duration,
        messages: plan.messages,
        warmup: plan.warmup,
        consumer: ConsumerMode::Concurrent,
        broker_pid,
        stall_timeout: plan.stall_timeout,
        progress: plan.progress,
    };
    let result = match case.workload {
        Workload::CatchUp => run_catch_up(plan, case, target, base),
        _ => run_phase(&base).map(|outcome| result_of(plan, case, target, &outcome, None)),
    };
    if !plan.keep_topics {
        if let Err(e) = kafka::delete_topic(&target.bootstrap, &plan.client_config, &topic) {
            eprintln!("warning: {e:#}");
        }
    }
    result
}

/// Writes the backlog (producers only, as fast as they go), then drains it with one consumer.
fn run_catch_up(plan: &Plan, case: &Case, target: &Target, base: PhaseSpec) -> anyhow::Result<RunResult> {
    let messages = plan.backlog_bytes.div_ceil(plan.message_bytes);
    let fill = PhaseSpec {
        label: shorten(&format!("{}: catch-up (writing)", target.name), 32),
        duration: None,
        messages: Some(messages),
        warmup: Duration::ZERO,
        consumer: ConsumerMode::None,
        ..base.clone()
    };
    let fill = run_phase(&fill)?;
    let drain = PhaseSpec {
        label: shorten(&format!("{}: catch-up (reading)", target.name), 32),
        producers: 0,
        duration: None,
        messages: None,
        warmup: Duration::ZERO,
        consumer: ConsumerMode::Drain { messages: fill.acked_total },
        ..base
    };
    let drain =
        if fill.produce_errors == 0 && fill.problems.is_empty() { run_phase(&drain)? } else { PhaseOutcome::default() };
    let mut result = result_of(plan, case, target, &drain, Some(&fill));
    result.warmup_s = 0.0;
    Ok(result)
}

fn shorten(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_string();
    }
    let mut short: String = text.chars().take(max_chars.saturating_sub(1)).collect();
    short.push('…');
    short
}

/// The figures of a run. For catch-up, `fill` is the phase that wrote the backlog: its produce
/// figures stand in the produce columns, and its series comes before the drain's in the chart.
fn result_of(plan: &Plan, case: &Case, target: &Target, main: &PhaseOutcome, fill: Option<&PhaseOutcome>) -> RunResult {
    let producing = fill.unwrap_or(main);
    let mut problems: Vec<String> = fill.map(|f| f.problems.clone()).unwrap_or_default();
    problems.extend(main.problems.iter().cloned());
    if !main.complete && problems.is_empty() {
        problems.push(format!("the consumer received {} of {} messages", main.received_total, producing.acked_total));
    }
    let mut notes: Vec<String> = fill.map(|f| f.notes.clone()).unwrap_or_default();
    notes.extend(main.notes.iter().cloned());
    let mut series: Vec<SeriesPoint> = Vec::new();
    let mut offset_s = 0;
    if let Some(fill) = fill {
        series = fill.series.points(fill.end_ns);
        add_rss(&mut series, &fill.broker_rss);
        offset_s = fill.end_ns.div_ceil(NANOS_PER_SEC);
    }
    let mut main_series = main.series.points(main.end_ns);
    add_rss(&mut main_series, &main.broker_rss);
    series.extend(main_series.into_iter().map(|mut p| {
        p.t_s += offset_s;
        p
    }));
    let warmup_ns = u64::try_from(plan.warmup.as_nanos()).unwrap_or(u64::MAX);
    let broker_rss_trend = rss_trend(&producing.broker_rss, warmup_ns);
    let broker = match (fill.and_then(|f| f.broker), main.broker) {
        // CPU of the drain (the read path); peak memory of the whole run.
        (Some(fill), Some(mut drain)) => {
            drain.rss_peak_bytes = drain.rss_peak_bytes.max(fill.rss_peak_bytes);
            Some(drain)
        }
        (fill, drain) => drain.or(fill),
    };
    RunResult {
        target: target.name.clone(),
        bootstrap: target.bootstrap.clone(),
        workload: case.workload,
        case: case.label.clone(),
        partitions: case.partitions,
        producers: case.producers,
        acks: case.acks,
        linger_ms: case.linger_ms,
        message_bytes: plan.message_bytes,
        partitioner: plan.partitioner,
        target_rate_msgs_per_s: case.rate,
        warmup_s: plan.warmup.as_secs_f64(),
        produced: FlowSummary::new(&producing.produced, producing.acked_total, producing.produce_errors),
        consumed: FlowSummary::new(&main.consumed, main.received_total, main.consume_errors),
        publish_latency: producing.publish.percentiles(),
        e2e_latency: main.e2e.percentiles(),
        broker,
        client: main.client,
        broker_write: fill.and_then(|f| f.broker),
        client_write: fill.and_then(|f| f.client),
        broker_rss_trend,
        complete: main.complete && producing.produce_errors == 0 && problems.is_empty(),
        problems,
        notes,
        series,
    }
}

/// Puts the highest RSS sample of each second into that second's point.
fn add_rss(series: &mut [SeriesPoint], samples: &[(u64, u64)]) {
    for &(at_ns, rss) in samples {
        let t_s = at_ns / NANOS_PER_SEC;
        if let Some(point) = series.iter_mut().find(|p| p.t_s == t_s) {
            let mib = rss as f64 / (1u64 << 20) as f64;
            point.broker_rss_mib = Some(point.broker_rss_mib.map_or(mib, |m: f64| m.max(mib)));
        }
    }
}

/// The peak RSS over the first and the last quarter of the samples after the warm-up.
fn rss_trend(samples: &[(u64, u64)], warmup_ns: u64) -> Option<RssTrend> {
    let measured: Vec<u64> = samples.iter().filter(|(at, _)| *at >= warmup_ns).map(|&(_, rss)| rss).collect();
    let quarter = measured.len() / 4;
    if quarter == 0 {
        return None;
    }
    let peak = |s: &[u64]| s.iter().copied().max().unwrap_or(0);
    Some(RssTrend {
        early_peak_bytes: peak(&measured[..quarter]),
        late_peak_bytes: peak(&measured[measured.len() - quarter..]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Args, Plan};
    use clap::Parser;

    fn plan(args: &[&str]) -> Plan {
        let args = Args::try_parse_from(std::iter::once("weir-bench").chain(args.iter().copied())).unwrap();
        Plan::from_args(&args).unwrap()
    }

    #[test]
    fn all_workloads_make_seven_cases() {
        let cases = cases(&plan(&["--bootstrap", "h:1"]));
        let labels: Vec<String> = cases.iter().map(|c| format!("{} {}", c.workload.name(), c.label)).collect();
        assert_eq!(
            labels,
            vec![
                "max-throughput 1 producer, acks=1",
                "max-throughput 1 producer, acks=all",
                "max-throughput 4 producers, acks=1",
                "max-throughput 4 producers, acks=all",
                "latency 20000 msg/s, acks=all",
                "many-partitions 1000 partitions, 1 producer, acks=1",
                "catch-up 2 GiB backlog",
            ]
        );
        assert_eq!(cases[5].partitions, 1000);
        assert_eq!(cases[4].rate, Some(20_000));
    }

    #[test]
    fn human_bytes_reads_well() {
        assert_eq!(human_bytes(2 << 30), "2 GiB");
        assert_eq!(human_bytes(16 << 20), "16 MiB");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
        assert_eq!(human_bytes(100), "100 B");
    }

    #[test]
    fn topic_names_are_unique_and_valid() {
        let a = topic_name(Workload::CatchUp);
        let b = topic_name(Workload::CatchUp);
        assert_ne!(a, b);
        assert!(a.len() <= 249 && a.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'), "{a}");
    }

    #[test]
    fn labels_are_shortened_on_a_char_boundary() {
        assert_eq!(shorten("short", 32), "short");
        assert_eq!(shorten("ééééé", 3), "éé…");
    }
}
