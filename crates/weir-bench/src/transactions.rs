//! `weir bench timer --transactions`: RocketMQ 5 transactional messages against normal ones on
//! the gRPC front-end, side by side in one run. See `TIMER_LONG_ABOUT` in `cli.rs`.
//!
//! A normal send is one SendMessage of a NORMAL message to a NORMAL topic. A transactional send
//! is SendMessage of a TRANSACTION message to a topic of `message.type=TRANSACTION` (the broker
//! keeps it as a half message and answers a transaction id), then EndTransaction COMMIT (the
//! broker appends it to its topic), as a RocketMQ producer does when its local transaction
//! succeeded. Both cases send from the same number of tasks over one HTTP/2 connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context};
use hdrhistogram::Histogram;
use serde::Serialize;
use weir_broker::message::headers::MESSAGE_ID;
use weir_harness::kafka_client::Client as KafkaClient;
use weir_rocketmq::proto::{
    Code, EndTransactionRequest, MessageType, Resource, SendMessageRequest, Status, TransactionResolution,
    TransactionSource,
};

use crate::cli::TimerBenchArgs;
use crate::produce::{self, Latency};
use crate::raw_protocol::{self, Pid, Server};
use crate::rocketmq::ratio;
use crate::rocketmq_client as grpc;
use crate::timer::fetch_once;

const TOPIC_NORMAL: &str = "bench-txn-normal";
const TOPIC_TRANSACTION: &str = "bench-txn";
const TAG: &str = "bench";

/// The two cases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Normal,
    Transactional,
}

impl Case {
    fn topic(self) -> &'static str {
        match self {
            Case::Normal => TOPIC_NORMAL,
            Case::Transactional => TOPIC_TRANSACTION,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Case::Normal => "SendMessage (NORMAL)",
            Case::Transactional => "SendMessage (TRANSACTION) + EndTransaction COMMIT",
        }
    }

    /// Message ids: `02`/`03` + 16 hex digits of the index, unique over the run.
    fn message_id(self, index: u64) -> String {
        format!("{}{index:016X}", self.id_prefix())
    }

    fn id_prefix(self) -> &'static str {
        match self {
            Case::Normal => "02",
            Case::Transactional => "03",
        }
    }

    /// The index of a message id made by [`Case::message_id`].
    fn index_of(self, id: &str) -> Option<u64> {
        let hex = id.strip_prefix(self.id_prefix()).filter(|h| h.len() == 16)?;
        u64::from_str_radix(hex, 16).ok()
    }
}

/// What one case measured, over all its slices.
struct Measured {
    messages: u64,
    seconds: f64,
    /// The whole send: SendMessage, and for a transaction EndTransaction too (µs).
    latency_us: Histogram<u64>,
    /// SendMessage alone and EndTransaction alone (µs; the latter empty for normal sends).
    send_us: Histogram<u64>,
    end_us: Histogram<u64>,
    broker_cpu_seconds: f64,
    client_cpu_seconds: f64,
}

impl Measured {
    fn new() -> anyhow::Result<Measured> {
        Ok(Measured {
            messages: 0,
            seconds: 0.0,
            latency_us: produce::latency_histogram()?,
            send_us: produce::latency_histogram()?,
            end_us: produce::latency_histogram()?,
            broker_cpu_seconds: 0.0,
            client_cpu_seconds: 0.0,
        })
    }

    fn add(&mut self, other: &Measured) -> anyhow::Result<()> {
        let merge = |a: &mut Histogram<u64>, b: &Histogram<u64>| a.add(b).map_err(|e| anyhow!("merging: {e:?}"));
        self.messages += other.messages;
        self.seconds += other.seconds;
        merge(&mut self.latency_us, &other.latency_us)?;
        merge(&mut self.send_us, &other.send_us)?;
        merge(&mut self.end_us, &other.end_us)?;
        self.broker_cpu_seconds += other.broker_cpu_seconds;
        self.client_cpu_seconds += other.client_cpu_seconds;
        Ok(())
    }

    fn msgs_per_s(&self) -> f64 {
        self.messages as f64 / self.seconds
    }
}

#[derive(Debug, Serialize)]
struct Row {
    label: String,
    messages: u64,
    seconds: f64,
    msgs_per_s: f64,
    latency_ms: Option<Latency>,
    send_latency_ms: Option<Latency>,
    end_latency_ms: Option<Latency>,
    broker_cpu_us_per_msg: f64,
    client_cpu_us_per_msg: f64,
}

impl Row {
    fn of(case: Case, m: &Measured) -> Row {
        let per_message_us = |seconds: f64| seconds * 1e6 / m.messages.max(1) as f64;
        Row {
            label: case.label().to_string(),
            messages: m.messages,
            seconds: m.seconds,
            msgs_per_s: m.msgs_per_s(),
            latency_ms: Latency::of(&m.latency_us),
            send_latency_ms: Latency::of(&m.send_us),
            end_latency_ms: Latency::of(&m.end_us),
            broker_cpu_us_per_msg: per_message_us(m.broker_cpu_seconds),
            client_cpu_us_per_msg: per_message_us(m.client_cpu_seconds),
        }
    }
}

/// Transactional / normal; `None` where the normal figure is 0 (CPU ticks in a tiny run).
#[derive(Debug, Serialize)]
struct Ratios {
    msgs_per_s: Option<f64>,
    latency_p50: Option<f64>,
    latency_p99: Option<f64>,
    broker_cpu_per_msg: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Report {
    rocketmq: String,
    messages: u64,
    size: usize,
    concurrency: u32,
    partitions: i32,
    rounds: u32,
    normal: Row,
    transactional: Row,
    ratios: Ratios,
}

pub(crate) fn run(args: &TimerBenchArgs) -> anyhow::Result<()> {
    let messages = args.messages.unwrap_or(if args.quick { 1_000 } else { 20_000 });
    let size = usize::try_from(args.size).ok().filter(|&s| s <= 1 << 20).context("--size must be at most 1 MiB")?;
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 3 }).min(u32::try_from(messages).unwrap_or(u32::MAX));
    let server = Server::start_with_rocketmq("weir-bench-transactions-", &args.settings, args.data_dir.as_deref())?;
    let rocketmq = server.rocketmq.context("the broker has no RocketMQ listener")?;
    println!(
        "weir bench timer --transactions: broker at {rocketmq} (RocketMQ gRPC); {messages} messages of {size} bytes \
         per case, {} partitions, {} in flight on one connection, {rounds} round(s)",
        args.partitions, args.concurrency
    );
    let mut admin = raw_protocol::connect(server.addr)?;
    // Both indexed by key and message id, as the topics the RocketMQ front-end creates are.
    let index = (weir_broker::topic_config::MESSAGE_INDEX.to_string(), "true".to_string());
    let type_of = |t: &str| (weir_broker::topic_config::MESSAGE_TYPE.to_string(), t.to_string());
    raw_protocol::create_topic(&mut admin, TOPIC_NORMAL, args.partitions, &[index.clone(), type_of("NORMAL")], None)?;
    raw_protocol::create_topic(&mut admin, TOPIC_TRANSACTION, args.partitions, &[index, type_of("TRANSACTION")], None)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("a tokio runtime")?;
    let client = runtime.block_on(grpc::connect(rocketmq, &format!("weir-bench-txn-{}", std::process::id())))?;

    let cases = [Case::Normal, Case::Transactional];
    let mut totals = [Measured::new()?, Measured::new()?];
    for round in 0..u64::from(rounds) {
        let slice = messages * round / u64::from(rounds)..messages * (round + 1) / u64::from(rounds);
        for (case, total) in cases.iter().zip(totals.iter_mut()) {
            let measured =
                timed(&server, || runtime.block_on(send_case(&client, *case, slice.clone(), size, args.concurrency)))?;
            let latency = Latency::of(&measured.latency_us).context("no latency was recorded")?;
            println!(
                "round {}: {:<50} {:>8.0} msg/s  p50 {:>6.2} ms  p99 {:>6.2} ms",
                round + 1,
                case.label(),
                measured.msgs_per_s(),
                latency.p50,
                latency.p99
            );
            total.add(&measured)?;
        }
    }

    let (normal, transactional) = (Row::of(Case::Normal, &totals[0]), Row::of(Case::Transactional, &totals[1]));
    let p = |row: &Row, pick: fn(&Latency) -> f64| row.latency_ms.as_ref().map_or(f64::NAN, pick);
    let ratios = Ratios {
        msgs_per_s: ratio(transactional.msgs_per_s, normal.msgs_per_s),
        latency_p50: ratio(p(&transactional, |l| l.p50), p(&normal, |l| l.p50)),
        latency_p99: ratio(p(&transactional, |l| l.p99), p(&normal, |l| l.p99)),
        broker_cpu_per_msg: ratio(transactional.broker_cpu_us_per_msg, normal.broker_cpu_us_per_msg),
    };
    let report = Report {
        rocketmq: rocketmq.to_string(),
        messages,
        size,
        concurrency: args.concurrency,
        partitions: args.partitions,
        rounds,
        normal,
        transactional,
        ratios,
    };
    print_report(&report);
    // Every committed message is in its topic, once; nothing else is. (Checked after the
    // figures are printed, so that a failing run still shows them; it writes no JSON.)
    let partitions: Vec<i32> = (0..args.partitions).collect();
    for case in cases {
        check_topic(&mut admin, case, &partitions, messages)?;
    }
    println!("\nread back: each topic holds every message sent (committed) exactly once, and nothing else");
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Reads `case`'s topic back and fails unless it holds message `0..messages` each exactly once.
fn check_topic(client: &mut KafkaClient, case: Case, partitions: &[i32], messages: u64) -> anyhow::Result<()> {
    let topic = case.topic();
    let ends = raw_protocol::latest_offsets(client, topic, partitions)?;
    let mut positions = vec![0i64; partitions.len()];
    let mut ids: Vec<Option<String>> = Vec::new();
    while positions.iter().zip(&ends).any(|(at, end)| at < end) {
        let before = positions.clone();
        fetch_once(client, topic, partitions, &mut positions, 0, |_, record| {
            let id = record.header(MESSAGE_ID).and_then(|h| h.value.as_deref());
            ids.push(id.map(|id| String::from_utf8_lossy(id).into_owned()));
        })?;
        if positions == before {
            bail!("a Fetch of {topic} made no progress at offsets {positions:?} (ends {ends:?})");
        }
    }
    let mut seen: HashMap<String, u32> = HashMap::with_capacity(ids.len());
    for id in ids.iter().flatten() {
        *seen.entry(id.clone()).or_default() += 1;
    }
    let mut twice: Vec<(&String, &u32)> = seen.iter().filter(|(_, n)| **n > 1).collect();
    twice.sort();
    let missing = (0..messages).filter(|&i| !seen.contains_key(&case.message_id(i))).count();
    let unknown = seen.keys().filter(|id| case.index_of(id).is_none_or(|i| i >= messages)).count();
    let without_id = ids.iter().filter(|id| id.is_none()).count();
    if !twice.is_empty() || missing > 0 || unknown > 0 || without_id > 0 {
        let first: Vec<String> = twice.iter().take(5).map(|(id, n)| format!("{id} x{n}")).collect();
        bail!(
            "{topic} holds {} records for {messages} messages sent: {} message(s) more than once (first: {}), \
             {missing} missing, {unknown} never sent, {without_id} without a message id",
            ids.len(),
            twice.len(),
            first.join(", ")
        );
    }
    Ok(())
}

/// Times `work` and charges it the broker's and this process's CPU.
fn timed(server: &Server, work: impl FnOnce() -> anyhow::Result<Measured>) -> anyhow::Result<Measured> {
    let broker_before = server.cpu_seconds()?;
    let client_before = raw_protocol::cpu_seconds(Pid::SelfProcess)?;
    let started = Instant::now();
    let mut measured = work()?;
    measured.seconds = started.elapsed().as_secs_f64();
    measured.broker_cpu_seconds = server.cpu_seconds()? - broker_before;
    measured.client_cpu_seconds = raw_protocol::cpu_seconds(Pid::SelfProcess)? - client_before;
    Ok(measured)
}

/// Sends messages `slice` of `case` from `concurrency` tasks, one call outstanding each.
async fn send_case(
    client: &grpc::Client,
    case: Case,
    slice: std::ops::Range<u64>,
    size: usize,
    concurrency: u32,
) -> anyhow::Result<Measured> {
    let next = Arc::new(AtomicU64::new(slice.start));
    let failed = Arc::new(AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (mut client, next, failed, end) = (client.clone(), next.clone(), failed.clone(), slice.end);
        tasks.spawn(async move {
            let mut measured = Measured::new()?;
            while !failed.load(Ordering::Relaxed) {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= end {
                    break;
                }
                let result = send_one(&mut client, case, index, size, &mut measured).await;
                if result.is_err() {
                    failed.store(true, Ordering::Relaxed);
                    return result.map(|()| measured);
                }
                measured.messages += 1;
            }
            Ok(measured)
        });
    }
    let mut total = Measured::new()?;
    let mut first_error = None;
    while let Some(joined) = tasks.join_next().await {
        match joined.map_err(|e| anyhow!("a sender task failed: {e}")).and_then(|r| r) {
            Ok(measured) => total.add(&measured)?,
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(total),
    }
}

fn check(what: &str, status: Option<&Status>) -> anyhow::Result<()> {
    let status = status.with_context(|| format!("{what}: the answer has no status"))?;
    if status.code != Code::Ok as i32 {
        bail!("{what} failed: {} {}", grpc::code_name(status.code), status.message);
    }
    Ok(())
}

fn resource(name: &str) -> Option<Resource> {
    Some(Resource { resource_namespace: String::new(), name: name.to_string() })
}

/// One send of `case`: SendMessage, and for a transaction EndTransaction COMMIT.
async fn send_one(
    client: &mut grpc::Client,
    case: Case,
    index: u64,
    size: usize,
    measured: &mut Measured,
) -> anyhow::Result<()> {
    let id = case.message_id(index);
    let mut body = vec![b'x'; size];
    let prefix = index.to_be_bytes();
    let n = prefix.len().min(size);
    body[..n].copy_from_slice(&prefix[..n]);
    let started = Instant::now();
    if case == Case::Normal {
        grpc::send(client, grpc::message(case.topic(), id, TAG, body)).await?;
        let us = started.elapsed().as_micros() as u64;
        measured.latency_us.saturating_record(us);
        measured.send_us.saturating_record(us);
        return Ok(());
    }
    let mut message = grpc::message(case.topic(), id.clone(), TAG, body);
    if let Some(system) = message.system_properties.as_mut() {
        system.message_type = MessageType::Transaction as i32;
    }
    let response = client
        .send_message(SendMessageRequest { messages: vec![message] })
        .await
        .context("SendMessage (TRANSACTION)")?
        .into_inner();
    let what = format!("SendMessage of transactional message {id}");
    check(&what, response.status.as_ref())?;
    let [entry] = &response.entries[..] else {
        bail!("{what} answered {} entries", response.entries.len());
    };
    check(&what, entry.status.as_ref())?;
    if entry.message_id != id || entry.transaction_id.is_empty() {
        bail!("{what} answered message id {:?} and transaction id {:?}", entry.message_id, entry.transaction_id);
    }
    measured.send_us.saturating_record(started.elapsed().as_micros() as u64);
    let ended = Instant::now();
    let request = EndTransactionRequest {
        topic: resource(case.topic()),
        message_id: id.clone(),
        transaction_id: entry.transaction_id.clone(),
        resolution: TransactionResolution::Commit as i32,
        source: TransactionSource::SourceClient as i32,
        trace_context: String::new(),
    };
    let response = client.end_transaction(request).await.context("EndTransaction")?.into_inner();
    check(&format!("EndTransaction COMMIT of {id}"), response.status.as_ref())?;
    measured.end_us.saturating_record(ended.elapsed().as_micros() as u64);
    measured.latency_us.saturating_record(started.elapsed().as_micros() as u64);
    Ok(())
}

fn print_report(report: &Report) {
    let ms = |latency: &Option<Latency>, pick: fn(&Latency) -> f64| {
        latency.as_ref().map_or_else(|| "-".to_string(), |l| format!("{:.2}", pick(l)))
    };
    println!(
        "\n{} messages of {} bytes per case, {} in flight\n{:<52} {:>8} {:>8} {:>8} {:>8} {:>13} {:>13}",
        report.messages,
        report.size,
        report.concurrency,
        "",
        "msg/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "broker µs/msg",
        "client µs/msg"
    );
    for row in [&report.normal, &report.transactional] {
        println!(
            "{:<52} {:>8.0} {:>8} {:>8} {:>8} {:>13.1} {:>13.1}",
            row.label,
            row.msgs_per_s,
            ms(&row.latency_ms, |l| l.p50),
            ms(&row.latency_ms, |l| l.p99),
            ms(&row.latency_ms, |l| l.max),
            row.broker_cpu_us_per_msg,
            row.client_cpu_us_per_msg
        );
    }
    let t = &report.transactional;
    println!(
        "  of which SendMessage p50 {} / p99 {} ms, EndTransaction p50 {} / p99 {} ms",
        ms(&t.send_latency_ms, |l| l.p50),
        ms(&t.send_latency_ms, |l| l.p99),
        ms(&t.end_latency_ms, |l| l.p50),
        ms(&t.end_latency_ms, |l| l.p99)
    );
    let x = |r: Option<f64>| r.map_or_else(|| "-".to_string(), |r| format!("{r:.2}x"));
    let r = &report.ratios;
    println!("\nratios, transactional / normal:");
    println!("msg/s                     {}", x(r.msgs_per_s));
    println!("latency p50 / p99         {} / {}", x(r.latency_p50), x(r.latency_p99));
    println!("broker CPU per message    {}", x(r.broker_cpu_per_msg));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_differ_between_the_cases() {
        assert_eq!(Case::Normal.message_id(10), "02000000000000000A");
        assert_eq!(Case::Transactional.message_id(10), "03000000000000000A");
        assert!((0..100).all(|i| Case::Normal.message_id(i) != Case::Transactional.message_id(i)));
        assert_eq!(Case::Transactional.index_of(&Case::Transactional.message_id(77)), Some(77));
        assert_eq!(Case::Normal.index_of(&Case::Transactional.message_id(77)), None);
        assert_eq!(Case::Normal.index_of("02ABC"), None);
    }

    #[test]
    fn ratios_need_a_normal_figure() {
        assert_eq!(ratio(2.0, 4.0), Some(0.5));
        assert_eq!(ratio(2.0, 0.0), None);
        assert_eq!(ratio(f64::NAN, 1.0), None);
    }
}
