//! `weir bench rocketmq`: what a message costs through the RocketMQ 5 gRPC front-end against the
//! Kafka front-end of the same broker, side by side in one run. See `ROCKETMQ_LONG_ABOUT` in
//! `cli.rs` for what is measured.
//!
//! One broker child serves both protocols. The send cases take turns in `--rounds` slices of
//! the messages; the gRPC case's topic is then read back by Kafka Fetch, by gRPC receivers, and
//! by gRPC receivers with a tag filter. Message `i` of the gRPC case has the id
//! `01` + 16 hex digits of `i`, a body that starts with `i` (big-endian), and the tag `hit` when
//! `i % HIT_EVERY == 0`, else `miss`; that is how every receive checks what it got.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use hdrhistogram::Histogram;
use kafka_protocol::messages::{GroupId, OffsetCommitRequest, ProduceRequest};
use kafka_protocol::protocol::StrBytes;
use serde::Serialize;
use weir_harness::kafka_client::{self, produce_request, Client as KafkaClient};
use weir_rocketmq::proto::{Message, MessageQueue};

use crate::cli::RocketMqBenchArgs;
use crate::produce::{self, Latency, PRODUCE_VERSION};
use crate::raw_protocol::{self, Pid, Server};
use crate::rocketmq_client::{self as grpc, Receive};
use crate::share_consumer;

const TOPIC_GRPC: &str = "bench-rocketmq-grpc";
const TOPIC_KAFKA: &str = "bench-rocketmq-kafka";
const TOPIC_KAFKA_BATCHED: &str = "bench-rocketmq-kafka-batched";
/// The consumer group that receives everything, and the one that receives the hits only.
const GROUP_ALL: &str = "weir-bench-all";
const GROUP_HIT: &str = "weir-bench-hit";
/// The classic Kafka consumer's group (Fetch + OffsetCommit) and the share group (KIP-932).
const GROUP_CLASSIC: &str = "weir-bench-classic";
const GROUP_SHARE: &str = "weir-bench-share";
/// Records a share member acquires per ShareFetch at most: librdkafka's ShareConsumer's
/// `max.poll.records`, Kafka's default.
const SHARE_MAX_RECORDS: i32 = 500;
/// The OffsetCommit version the classic consumer sends (librdkafka 2.x's).
const OFFSET_COMMIT_VERSION: i16 = 8;
/// One message in this many carries the tag `hit`: the filter matches 1 %.
const HIT_EVERY: u64 = 100;
const TAG_HIT: &str = "hit";
const TAG_MISS: &str = "miss";
/// A SimpleConsumer's receive, as RocketMQ's clients default to: up to 32 messages, invisible
/// for 30 s (the run acks each batch at once, so nothing becomes visible again).
const RECEIVE_BATCH: i32 = 32;
const INVISIBLE: Duration = Duration::from_secs(30);
/// The long poll of a receive: short, so that receivers notice soon that the run is over.
const LONG_POLLING: Duration = Duration::from_millis(200);
/// Receivers that get nothing for this long, short of the messages expected, fail the run.
const STALL_LIMIT: Duration = Duration::from_secs(15);
/// What Kafka's consumer fetches from a partition at a time (`max.partition.fetch.bytes`).
const FETCH_PARTITION_BYTES: i32 = 1 << 20;
/// The largest --size: 32 such records make a request well within the broker's default
/// `socket.request.max.bytes` (100 MiB).
const MAX_SIZE: usize = 1 << 20;

/// The message id of gRPC message `index`.
fn message_id(index: u64) -> String {
    format!("01{index:016X}")
}

/// The index of a message id made by [`message_id`].
fn index_of(id: &str) -> Option<u64> {
    let hex = id.strip_prefix("01").filter(|h| h.len() == 16)?;
    u64::from_str_radix(hex, 16).ok()
}

fn tag_of(index: u64) -> &'static str {
    if index.is_multiple_of(HIT_EVERY) {
        TAG_HIT
    } else {
        TAG_MISS
    }
}

/// The body of message `index` (also the timer bench's): `index` big-endian (as much of it as
/// fits), then letters.
pub(super) fn body(index: u64, size: usize) -> Vec<u8> {
    let mut body: Vec<u8> = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
    let prefix = index.to_be_bytes();
    let n = prefix.len().min(size);
    body[..n].copy_from_slice(&prefix[..n]);
    body
}

/// Checks a received message against what message `index_of(its id)` was sent as; returns the
/// index.
fn check_received(message: &Message, size: usize) -> anyhow::Result<u64> {
    let system = message.system_properties.as_ref().context("a received message has no system properties")?;
    let id = &system.message_id;
    let index =
        index_of(id).with_context(|| format!("received a message with id {id:?}, which this run never sent"))?;
    let prefix = index.to_be_bytes();
    let n = prefix.len().min(size);
    if message.body.len() != size || message.body[..n] != prefix[..n] {
        bail!("message {id} came back with a body of {} bytes that is not the one sent", message.body.len());
    }
    if system.tag.as_deref() != Some(tag_of(index)) {
        bail!("message {id} came back with tag {:?}, not {:?}", system.tag, tag_of(index));
    }
    if system.delivery_attempt.unwrap_or(1) != 1 {
        bail!("message {id} was delivered again (attempt {:?}) although it was acked", system.delivery_attempt);
    }
    Ok(index)
}

/// What one case measured: over all its slices.
#[derive(Debug)]
struct Measured {
    messages: u64,
    requests: u64,
    seconds: f64,
    latency_us: Histogram<u64>,
    broker_cpu_seconds: f64,
    client_cpu_seconds: f64,
}

impl Measured {
    fn new() -> anyhow::Result<Measured> {
        Ok(Measured {
            messages: 0,
            requests: 0,
            seconds: 0.0,
            latency_us: produce::latency_histogram()?,
            broker_cpu_seconds: 0.0,
            client_cpu_seconds: 0.0,
        })
    }

    fn add(&mut self, other: &Measured) -> anyhow::Result<()> {
        self.messages += other.messages;
        self.requests += other.requests;
        self.seconds += other.seconds;
        self.latency_us.add(&other.latency_us).map_err(|e| anyhow!("merging latency histograms: {e:?}"))?;
        self.broker_cpu_seconds += other.broker_cpu_seconds;
        self.client_cpu_seconds += other.client_cpu_seconds;
        Ok(())
    }

    fn msgs_per_s(&self) -> f64 {
        self.messages as f64 / self.seconds
    }

    fn row(&self, label: String, size: usize) -> Row {
        let per_message_us = |seconds: f64| seconds * 1e6 / self.messages.max(1) as f64;
        Row {
            label,
            messages: self.messages,
            requests: self.requests,
            seconds: self.seconds,
            msgs_per_s: self.msgs_per_s(),
            mb_per_s: self.messages as f64 * size as f64 / 1e6 / self.seconds,
            latency_ms: Latency::of(&self.latency_us),
            broker_cpu_us_per_msg: per_message_us(self.broker_cpu_seconds),
            client_cpu_us_per_msg: per_message_us(self.client_cpu_seconds),
        }
    }
}

/// What a case's work did.
struct Done {
    messages: u64,
    requests: u64,
    latency_us: Histogram<u64>,
    /// How long it took to get the last message, when that is sooner than the work's end (the
    /// receivers still in a long poll then finish it).
    until_last: Option<Duration>,
}

/// Times `work` and charges it the broker's and this process's CPU.
fn timed(server: &Server, work: impl FnOnce() -> anyhow::Result<Done>) -> anyhow::Result<Measured> {
    let broker_before = server.cpu_seconds()?;
    let client_before = raw_protocol::cpu_seconds(Pid::SelfProcess)?;
    let started = Instant::now();
    let done = work()?;
    let seconds = done.until_last.unwrap_or_else(|| started.elapsed()).as_secs_f64();
    Ok(Measured {
        messages: done.messages,
        requests: done.requests,
        seconds,
        latency_us: done.latency_us,
        broker_cpu_seconds: server.cpu_seconds()? - broker_before,
        client_cpu_seconds: raw_protocol::cpu_seconds(Pid::SelfProcess)? - client_before,
    })
}

/// A row of the report.
#[derive(Debug, Serialize)]
struct Row {
    label: String,
    messages: u64,
    requests: u64,
    seconds: f64,
    msgs_per_s: f64,
    mb_per_s: f64,
    /// Latency of a request (a receive: the call until its stream ended), milliseconds.
    latency_ms: Option<Latency>,
    broker_cpu_us_per_msg: f64,
    client_cpu_us_per_msg: f64,
}

#[derive(Debug, Serialize)]
struct FilterReport {
    hit_every: u64,
    /// Messages of the topic the filtered receive went through.
    scanned: u64,
    hits_expected: u64,
    hits_delivered: u64,
    seconds: f64,
    msgs_per_s_delivered: f64,
    /// The unfiltered gRPC receive of the same topic.
    unfiltered_seconds: f64,
    filtered_over_unfiltered_seconds: f64,
}

/// gRPC / Kafka; `None` where the Kafka figure is 0 (CPU time comes from /proc in clock
/// ticks, 10 ms, so a tiny run may see none).
#[derive(Debug, Serialize)]
struct Ratios {
    send_msgs_per_s: Option<f64>,
    send_latency_p50: Option<f64>,
    send_latency_p99: Option<f64>,
    send_broker_cpu_per_msg: Option<f64>,
    /// gRPC one message per call against Kafka with --kafka-batch records per request.
    send_msgs_per_s_vs_batched: Option<f64>,
    receive_msgs_per_s: Option<f64>,
    receive_broker_cpu_per_msg: Option<f64>,
    /// Share group (ShareFetch + ShareAcknowledge) / classic consumer (Fetch + OffsetCommit).
    share_vs_classic_msgs_per_s: Option<f64>,
    share_vs_classic_broker_cpu_per_msg: Option<f64>,
}

/// `measured / reference`, `None` unless both are finite and the reference is positive.
pub(super) fn ratio(grpc: f64, kafka: f64) -> Option<f64> {
    (kafka > 0.0 && grpc.is_finite() && kafka.is_finite()).then(|| grpc / kafka)
}

#[derive(Debug, Serialize)]
struct Report {
    kafka: String,
    rocketmq: String,
    messages: u64,
    size: usize,
    concurrency: u32,
    partitions: i32,
    grpc_connections: u32,
    kafka_batch: u32,
    share_members: u32,
    rounds: u32,
    send: Vec<Row>,
    receive: Vec<Row>,
    filter: FilterReport,
    ratios: Ratios,
}

/// A send case.
#[derive(Clone, Copy)]
enum Sender {
    Grpc,
    /// Kafka Produce, acks=all, this many records per request.
    Kafka {
        records: u32,
    },
}

impl Sender {
    fn topic(self) -> &'static str {
        match self {
            Sender::Grpc => TOPIC_GRPC,
            Sender::Kafka { records: 1 } => TOPIC_KAFKA,
            Sender::Kafka { .. } => TOPIC_KAFKA_BATCHED,
        }
    }

    fn label(self) -> String {
        match self {
            Sender::Grpc => "gRPC SendMessage, 1 message/call".into(),
            Sender::Kafka { records: 1 } => "Kafka Produce acks=all, 1 record/request".into(),
            Sender::Kafka { records } => format!("Kafka Produce acks=all, {records} records/request"),
        }
    }
}

/// What every case of the run shares.
struct Bench<'a> {
    args: &'a RocketMqBenchArgs,
    server: Server,
    runtime: tokio::runtime::Runtime,
    clients: Vec<grpc::Client>,
    queues: Vec<MessageQueue>,
    size: usize,
}

pub(crate) fn run(args: &RocketMqBenchArgs) -> anyhow::Result<()> {
    let size = usize::try_from(args.size)
        .ok()
        .filter(|&s| s <= MAX_SIZE)
        .with_context(|| format!("--size must be at most {MAX_SIZE}"))?;
    let messages = args.messages.unwrap_or(if args.quick { 2_000 } else { 100_000 });
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 3 }).min(u32::try_from(messages).unwrap_or(u32::MAX));
    let server = Server::start_with_rocketmq("weir-bench-rocketmq-", &args.settings, args.data_dir.as_deref())?;
    let rocketmq = server.rocketmq.context("the broker has no RocketMQ listener")?;
    println!(
        "weir bench rocketmq: broker at {} (Kafka) and {rocketmq} (RocketMQ gRPC); {messages} messages of {size} bytes \
         per case, {} partitions, {} in flight, {rounds} round(s)",
        server.addr, args.partitions, args.concurrency
    );
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("a tokio runtime")?;
    let mut admin = raw_protocol::connect(server.addr)?;
    // Large enough for a batched request and for a RocketMQ body (the front-end keeps 64 KiB of a
    // topic's max.message.bytes for the properties).
    let max_message_bytes = u64::from(args.kafka_batch.max(1)) * (size as u64 + 512) + (64 << 10);
    let kafka_configs = [("max.message.bytes".to_string(), max_message_bytes.to_string())];
    // The gRPC topic is what the RocketMQ front-end makes of a topic it creates: its messages
    // are indexed by key and message id (the broker decodes every batch once more for that).
    let mut grpc_configs = kafka_configs.to_vec();
    grpc_configs.push((weir_broker::topic_config::MESSAGE_INDEX.to_string(), "true".to_string()));
    raw_protocol::create_topic(&mut admin, TOPIC_GRPC, args.partitions, &grpc_configs, None)?;
    for topic in [TOPIC_KAFKA, TOPIC_KAFKA_BATCHED] {
        raw_protocol::create_topic(&mut admin, topic, args.partitions, &kafka_configs, None)?;
    }
    let (clients, queues) = runtime.block_on(async {
        let mut clients = Vec::new();
        for c in 0..args.grpc_connections {
            clients.push(grpc::connect(rocketmq, &format!("weir-bench-{}-{c}", std::process::id())).await?);
        }
        let queues = grpc::query_route(&mut clients[0], TOPIC_GRPC).await?;
        anyhow::Ok((clients, queues))
    })?;
    let ids: Vec<i32> = queues.iter().map(|q| q.id).collect();
    if ids != (0..args.partitions).collect::<Vec<_>>() {
        bail!("the route of {TOPIC_GRPC} lists queues {ids:?}, not one per partition (0..{})", args.partitions);
    }
    let bench = Bench { args, server, runtime, clients, queues, size };
    let report = bench.measure(messages, rounds)?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

impl Bench<'_> {
    fn measure(&self, messages: u64, rounds: u32) -> anyhow::Result<Report> {
        let args = self.args;
        let mut senders = vec![Sender::Grpc, Sender::Kafka { records: 1 }];
        if args.kafka_batch > 1 {
            senders.push(Sender::Kafka { records: args.kafka_batch });
        }
        let mut sent: Vec<Measured> = senders.iter().map(|_| Measured::new()).collect::<anyhow::Result<_>>()?;
        for round in 0..u64::from(rounds) {
            let slice = messages * round / u64::from(rounds)..messages * (round + 1) / u64::from(rounds);
            for (sender, total) in senders.iter().zip(sent.iter_mut()) {
                let measured = match *sender {
                    Sender::Grpc => timed(&self.server, || self.grpc_send(slice.clone()))?,
                    Sender::Kafka { records } => {
                        timed(&self.server, || self.kafka_send(slice.clone(), sender.topic(), records))?
                    }
                };
                let latency = Latency::of(&measured.latency_us).context("no latency was recorded")?;
                println!(
                    "round {}: {:<44} {:>9.0} msg/s  p50 {:>7.2} ms  p99 {:>7.2} ms",
                    round + 1,
                    sender.label(),
                    measured.msgs_per_s(),
                    latency.p50,
                    latency.p99
                );
                total.add(&measured)?;
            }
        }
        for (sender, total) in senders.iter().zip(&sent) {
            self.check_offsets(sender.topic(), total.messages)?;
        }
        println!("offsets: every topic grew by exactly the messages acknowledged");

        let sent_grpc = sent[0].messages;
        let fetched = timed(&self.server, || self.kafka_fetch(sent_grpc))?;
        println!("Kafka Fetch of {TOPIC_GRPC}: {:.0} msg/s", fetched.msgs_per_s());
        let all = timed(&self.server, || self.grpc_receive(GROUP_ALL, None, 0..sent_grpc))?;
        println!(
            "gRPC receive of {TOPIC_GRPC}: {:.0} msg/s, {} receive calls ({:.1} messages per call)",
            all.msgs_per_s(),
            all.requests,
            all.messages as f64 / all.requests.max(1) as f64
        );
        let hits = timed(&self.server, || self.grpc_receive(GROUP_HIT, Some(TAG_HIT), 0..sent_grpc))?;
        println!("gRPC receive of {TOPIC_GRPC} with TAG {TAG_HIT}: {:.0} msg/s delivered", hits.msgs_per_s());
        let classic = timed(&self.server, || self.kafka_fetch_commit(sent_grpc))?;
        println!("Kafka Fetch + OffsetCommit of {TOPIC_GRPC}: {:.0} msg/s", classic.msgs_per_s());
        let mut admin = raw_protocol::connect(self.server.addr)?;
        share_consumer::set_group_configs(&mut admin, GROUP_SHARE, &[("share.auto.offset.reset", "earliest")])?;
        let shared = timed(&self.server, || self.share_consume(sent_grpc))?;
        println!("Kafka share group ShareFetch + ShareAcknowledge of {TOPIC_GRPC}: {:.0} msg/s", shared.msgs_per_s());

        let send: Vec<Row> = senders.iter().zip(&sent).map(|(s, m)| m.row(s.label(), self.size)).collect();
        let receive = vec![
            fetched.row(format!("Kafka Fetch, 1 connection, {} KiB/partition", FETCH_PARTITION_BYTES >> 10), self.size),
            all.row(format!("gRPC Receive({RECEIVE_BATCH}) + Ack, {} receivers", args.concurrency), self.size),
            hits.row(
                format!("gRPC Receive TAG {TAG_HIT} (1 in {HIT_EVERY}), {} receivers", args.concurrency),
                self.size,
            ),
            classic.row("Kafka Fetch + OffsetCommit, 1 connection".to_string(), self.size),
            shared.row(
                format!("Kafka share group: ShareFetch({SHARE_MAX_RECORDS}) + Ack, {} members", args.share_members),
                self.size,
            ),
        ];
        let filter = FilterReport {
            hit_every: HIT_EVERY,
            scanned: sent_grpc,
            hits_expected: (0..sent_grpc).filter(|&i| tag_of(i) == TAG_HIT).count() as u64,
            hits_delivered: hits.messages,
            seconds: hits.seconds,
            msgs_per_s_delivered: hits.msgs_per_s(),
            unfiltered_seconds: all.seconds,
            filtered_over_unfiltered_seconds: hits.seconds / all.seconds,
        };
        let latency = |row: &Row| row.latency_ms.as_ref().map_or((f64::NAN, f64::NAN), |l| (l.p50, l.p99));
        let ((grpc_p50, grpc_p99), (kafka_p50, kafka_p99)) = (latency(&send[0]), latency(&send[1]));
        let ratios = Ratios {
            send_msgs_per_s: ratio(send[0].msgs_per_s, send[1].msgs_per_s),
            send_latency_p50: ratio(grpc_p50, kafka_p50),
            send_latency_p99: ratio(grpc_p99, kafka_p99),
            send_broker_cpu_per_msg: ratio(send[0].broker_cpu_us_per_msg, send[1].broker_cpu_us_per_msg),
            send_msgs_per_s_vs_batched: send.get(2).and_then(|batched| ratio(send[0].msgs_per_s, batched.msgs_per_s)),
            receive_msgs_per_s: ratio(receive[1].msgs_per_s, receive[0].msgs_per_s),
            receive_broker_cpu_per_msg: ratio(receive[1].broker_cpu_us_per_msg, receive[0].broker_cpu_us_per_msg),
            share_vs_classic_msgs_per_s: ratio(receive[4].msgs_per_s, receive[3].msgs_per_s),
            share_vs_classic_broker_cpu_per_msg: ratio(
                receive[4].broker_cpu_us_per_msg,
                receive[3].broker_cpu_us_per_msg,
            ),
        };
        let report = Report {
            kafka: self.server.addr.to_string(),
            rocketmq: self.server.rocketmq.map(|a| a.to_string()).unwrap_or_default(),
            messages,
            size: self.size,
            concurrency: args.concurrency,
            partitions: args.partitions,
            grpc_connections: args.grpc_connections,
            kafka_batch: args.kafka_batch,
            share_members: args.share_members,
            rounds,
            send,
            receive,
            filter,
            ratios,
        };
        print_report(&report);
        Ok(report)
    }

    /// Fails unless the offsets of `topic` add up to `messages`.
    fn check_offsets(&self, topic: &str, messages: u64) -> anyhow::Result<()> {
        let mut admin = raw_protocol::connect(self.server.addr)?;
        let partitions: Vec<i32> = (0..self.args.partitions).collect();
        let offsets = raw_protocol::latest_offsets(&mut admin, topic, &partitions)?;
        let total: i64 = offsets.iter().sum();
        if total != messages as i64 {
            bail!("{topic}'s offsets add up to {total}, but {messages} messages were acknowledged");
        }
        Ok(())
    }

    /// Sends messages `slice` with gRPC SendMessage, one per call, --concurrency calls at a time.
    fn grpc_send(&self, slice: Range<u64>) -> anyhow::Result<Done> {
        let next = Arc::new(AtomicU64::new(slice.start));
        let failed = Arc::new(AtomicBool::new(false));
        let size = self.size;
        let latencies = self.runtime.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for task in 0..self.args.concurrency as usize {
                let mut client = self.clients[task % self.clients.len()].clone();
                let (next, failed, end) = (next.clone(), failed.clone(), slice.end);
                tasks.spawn(async move {
                    let mut latency = produce::latency_histogram()?;
                    while !failed.load(Ordering::Relaxed) {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        if index >= end {
                            break;
                        }
                        let message = grpc::message(TOPIC_GRPC, message_id(index), tag_of(index), body(index, size));
                        let started = Instant::now();
                        if let Err(e) = grpc::send(&mut client, message).await {
                            failed.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                        latency.saturating_record(started.elapsed().as_micros() as u64);
                    }
                    Ok(latency)
                });
            }
            joined(tasks).await
        })?;
        let count = slice.end - slice.start;
        Ok(Done { messages: count, requests: count, latency_us: produce::merge(&latencies)?, until_last: None })
    }

    /// Sends `slice.len()` messages (rounded up to whole requests) with Kafka Produce, acks=all,
    /// `records` per request, over --concurrency connections with one request outstanding each.
    /// Request n goes to partition n % P.
    fn kafka_send(&self, slice: Range<u64>, topic: &str, records: u32) -> anyhow::Result<Done> {
        let requests = (slice.end - slice.start).div_ceil(u64::from(records));
        let batch = produce::encode_records(self.size, records as usize)?;
        let frames = (0..self.args.partitions)
            .map(|p| {
                let request = produce_request(topic, p, batch.clone(), -1);
                Ok(kafka_client::encode_request(PRODUCE_VERSION, 0, raw_protocol::CLIENT_ID, &request)?.to_vec())
            })
            .collect::<anyhow::Result<Vec<Vec<u8>>>>()?;
        let next = AtomicU64::new(0);
        let failed = AtomicBool::new(false);
        let addr = self.server.addr;
        let results: Vec<anyhow::Result<Histogram<u64>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..self.args.concurrency)
                .map(|_| {
                    let (next, failed, frames) = (&next, &failed, frames.clone());
                    scope.spawn(move || {
                        let result = kafka_connection(addr, topic, frames, requests, next, failed);
                        if result.is_err() {
                            failed.store(true, Ordering::Relaxed);
                        }
                        result
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a sender thread panicked")))).collect()
        });
        let latencies = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Done {
            messages: requests * u64::from(records),
            requests,
            latency_us: produce::merge(&latencies)?,
            until_last: None,
        })
    }

    /// Reads the `messages` of the gRPC topic back with Kafka Fetch over one connection.
    fn kafka_fetch(&self, messages: u64) -> anyhow::Result<Done> {
        let mut client = raw_protocol::connect(self.server.addr)?;
        let partitions: Vec<i32> = (0..self.args.partitions).collect();
        let ends = raw_protocol::latest_offsets(&mut client, TOPIC_GRPC, &partitions)?;
        let ranges: Vec<(i32, i64, i64)> = partitions.iter().zip(&ends).map(|(&p, &end)| (p, 0, end)).collect();
        let fetched = raw_protocol::fetch_all(&mut client, TOPIC_GRPC, &ranges, FETCH_PARTITION_BYTES)?;
        if fetched.records != messages {
            bail!("Kafka Fetch read {} records of {TOPIC_GRPC}, but {messages} were sent", fetched.records);
        }
        // fetch_all does not time its requests one by one.
        Ok(Done {
            messages: fetched.records,
            requests: fetched.requests,
            latency_us: produce::latency_histogram()?,
            until_last: None,
        })
    }

    /// Reads the `messages` of the gRPC topic back as a classic Kafka consumer does: Fetch over
    /// one connection, and after each Fetch an OffsetCommit (group GROUP_CLASSIC, no generation:
    /// a consumer with assigned partitions) of the partitions that moved.
    fn kafka_fetch_commit(&self, messages: u64) -> anyhow::Result<Done> {
        let mut client = raw_protocol::connect(self.server.addr)?;
        let partitions: Vec<i32> = (0..self.args.partitions).collect();
        let ends = raw_protocol::latest_offsets(&mut client, TOPIC_GRPC, &partitions)?;
        let ranges: Vec<(i32, i64, i64)> = partitions.iter().zip(&ends).map(|(&p, &end)| (p, 0, end)).collect();
        let mut commits = 0u64;
        let fetched =
            raw_protocol::fetch_all_then(&mut client, TOPIC_GRPC, &ranges, FETCH_PARTITION_BYTES, |client, moved| {
                commits += 1;
                commit_offsets(client, GROUP_CLASSIC, TOPIC_GRPC, moved)
            })?;
        if fetched.records != messages {
            bail!("Kafka Fetch read {} records of {TOPIC_GRPC}, but {messages} were sent", fetched.records);
        }
        Ok(Done {
            messages: fetched.records,
            requests: fetched.requests + commits,
            latency_us: produce::latency_histogram()?,
            until_last: None,
        })
    }

    /// Reads the `messages` of the gRPC topic back once through share group GROUP_SHARE with
    /// --share-members members; fails unless every offset of every partition came exactly once.
    fn share_consume(&self, messages: u64) -> anyhow::Result<Done> {
        let mut admin = raw_protocol::connect(self.server.addr)?;
        let partitions: Vec<i32> = (0..self.args.partitions).collect();
        let ends = raw_protocol::latest_offsets(&mut admin, TOPIC_GRPC, &partitions)?;
        let mut expected: Vec<(i32, i64)> =
            partitions.iter().zip(&ends).flat_map(|(&p, &end)| (0..end).map(move |o| (p, o))).collect();
        if expected.len() as u64 != messages {
            bail!("{TOPIC_GRPC} holds {} records, but {messages} were sent", expected.len());
        }
        let mut consumed = share_consumer::consume(
            self.server.addr,
            GROUP_SHARE,
            TOPIC_GRPC,
            self.args.share_members,
            SHARE_MAX_RECORDS,
            messages,
            STALL_LIMIT,
        )?;
        consumed.records.sort_unstable();
        expected.sort_unstable();
        if let Some(pair) = consumed.records.windows(2).find(|w| w[0] == w[1]) {
            bail!("share group {GROUP_SHARE} acquired {TOPIC_GRPC}-{} offset {} more than once", pair[0].0, pair[0].1);
        }
        if consumed.records != expected {
            bail!(
                "share group {GROUP_SHARE} acquired {} records of {TOPIC_GRPC} where {} were expected",
                consumed.records.len(),
                expected.len()
            );
        }
        Ok(Done {
            messages,
            requests: consumed.requests,
            latency_us: consumed.latency_us,
            until_last: Some(consumed.until_last),
        })
    }

    /// Receives from the gRPC topic for `group`, filtered by `tags`, with --concurrency
    /// SimpleConsumer-style receivers, until every message of `sent` that the filter matches has
    /// come; fails unless exactly those came, each once.
    fn grpc_receive(&self, group: &'static str, tags: Option<&'static str>, sent: Range<u64>) -> anyhow::Result<Done> {
        let expected: Vec<u64> = sent.filter(|&i| tags.is_none_or(|t| t == tag_of(i))).collect();
        let target = expected.len() as u64;
        let shared = Arc::new(Receivers {
            received: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            started: Instant::now(),
            last_progress_us: AtomicU64::new(0),
            indices: Mutex::new(Vec::with_capacity(expected.len())),
        });
        let latencies = self.runtime.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for task in 0..self.args.concurrency as usize {
                let client = self.clients[task % self.clients.len()].clone();
                let (shared, queues, size) = (shared.clone(), self.queues.clone(), self.size);
                tasks.spawn(async move {
                    let result = receiver(client, task, &queues, group, tags, target, size, &shared).await;
                    if result.is_err() {
                        shared.failed.store(true, Ordering::Relaxed);
                    }
                    result
                });
            }
            joined(tasks).await
        })?;
        let mut indices = std::mem::take(&mut *shared.indices.lock().unwrap_or_else(|e| e.into_inner()));
        check_exactly(&mut indices, &expected, group)?;
        Ok(Done {
            messages: target,
            requests: shared.requests.load(Ordering::Relaxed),
            latency_us: produce::merge(&latencies)?,
            until_last: Some(Duration::from_micros(shared.last_progress_us.load(Ordering::Relaxed))),
        })
    }
}

/// One Kafka sender: takes request numbers from `next` until `requests`, sends each to
/// partition n % P and waits for its answer, which must carry no error.
fn kafka_connection(
    addr: SocketAddr,
    topic: &str,
    mut frames: Vec<Vec<u8>>,
    requests: u64,
    next: &AtomicU64,
    failed: &AtomicBool,
) -> anyhow::Result<Histogram<u64>> {
    let mut client: KafkaClient = raw_protocol::connect(addr)?;
    let mut latency = produce::latency_histogram()?;
    let mut correlation = 0i32;
    while !failed.load(Ordering::Relaxed) {
        let n = next.fetch_add(1, Ordering::Relaxed);
        if n >= requests {
            break;
        }
        let partition = (n % frames.len() as u64) as usize;
        correlation = correlation.wrapping_add(1);
        let frame = &mut frames[partition];
        frame[kafka_client::CORRELATION_ID_AT].copy_from_slice(&correlation.to_be_bytes());
        let started = Instant::now();
        client.write_raw(frame).context("sending a Produce request")?;
        let response = client
            .read::<ProduceRequest>(PRODUCE_VERSION, correlation)
            .with_context(|| format!("waiting for the answer to a Produce to {topic}-{partition}"))?;
        latency.saturating_record(started.elapsed().as_micros() as u64);
        let answer =
            response.responses.iter().flat_map(|t| &t.partition_responses).find(|p| p.index == partition as i32);
        let answer = answer.with_context(|| format!("the Produce response has no result for {topic}-{partition}"))?;
        if answer.error_code != 0 {
            bail!(
                "Produce to {topic}-{partition} failed: {} {}",
                raw_protocol::error_name(answer.error_code),
                answer.error_message.as_deref().unwrap_or("")
            );
        }
    }
    Ok(latency)
}

/// OffsetCommit of `positions` (partition, next offset) of `topic` for `group`, as a consumer
/// with assigned partitions commits (no generation, no member); fails on any error.
fn commit_offsets(client: &mut KafkaClient, group: &str, topic: &str, positions: &[(i32, i64)]) -> anyhow::Result<()> {
    use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
    let request = OffsetCommitRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(kafka_client::topic_name(topic))
            .with_partitions(
                positions
                    .iter()
                    .map(|&(p, offset)| {
                        OffsetCommitRequestPartition::default().with_partition_index(p).with_committed_offset(offset)
                    })
                    .collect(),
            )]);
    let response = client.send(OFFSET_COMMIT_VERSION, &request).context("OffsetCommit")?;
    if let Some(p) = response.topics.iter().flat_map(|t| &t.partitions).find(|p| p.error_code != 0) {
        bail!(
            "OffsetCommit of {topic}-{} for {group} failed: {}",
            p.partition_index,
            raw_protocol::error_name(p.error_code)
        );
    }
    Ok(())
}

/// What the receivers of one receive case share.
struct Receivers {
    received: AtomicU64,
    requests: AtomicU64,
    failed: AtomicBool,
    started: Instant,
    /// When a receiver last acked messages, in µs since `started`.
    last_progress_us: AtomicU64,
    /// The indices of every message received.
    indices: Mutex<Vec<u64>>,
}

/// A SimpleConsumer's loop: receive from the queues in turn (starting at queue `task`), check
/// each message, ack the batch in one request; until `target` messages have come altogether.
#[allow(clippy::too_many_arguments)]
async fn receiver(
    mut client: grpc::Client,
    task: usize,
    queues: &[MessageQueue],
    group: &str,
    tags: Option<&str>,
    target: u64,
    size: usize,
    shared: &Receivers,
) -> anyhow::Result<Histogram<u64>> {
    let mut latency = produce::latency_histogram()?;
    let mut turn = task;
    while shared.received.load(Ordering::Relaxed) < target && !shared.failed.load(Ordering::Relaxed) {
        let queue = &queues[turn % queues.len()];
        turn += 1;
        let receive =
            Receive { group, queue, tags, batch_size: RECEIVE_BATCH, invisible: INVISIBLE, long_polling: LONG_POLLING };
        let started = Instant::now();
        let messages = grpc::receive(&mut client, &receive).await?;
        latency.saturating_record(started.elapsed().as_micros() as u64);
        shared.requests.fetch_add(1, Ordering::Relaxed);
        if messages.is_empty() {
            let idle_us = shared.started.elapsed().as_micros() as u64;
            let idle_us = idle_us.saturating_sub(shared.last_progress_us.load(Ordering::Relaxed));
            if Duration::from_micros(idle_us) > STALL_LIMIT {
                bail!(
                    "group {group}: no message for {:?}, after {} of the {target} expected",
                    STALL_LIMIT,
                    shared.received.load(Ordering::Relaxed)
                );
            }
            continue;
        }
        let indices = messages.iter().map(|m| check_received(m, size)).collect::<anyhow::Result<Vec<u64>>>()?;
        grpc::ack(&mut client, group, TOPIC_GRPC, &messages).await?;
        shared.indices.lock().unwrap_or_else(|e| e.into_inner()).extend(&indices);
        shared.received.fetch_add(indices.len() as u64, Ordering::Relaxed);
        shared.last_progress_us.fetch_max(shared.started.elapsed().as_micros() as u64, Ordering::Relaxed);
    }
    Ok(latency)
}

/// Fails unless `received` (sorted here) is `expected` (sorted), each once.
fn check_exactly(received: &mut [u64], expected: &[u64], group: &str) -> anyhow::Result<()> {
    received.sort_unstable();
    if let Some(pair) = received.windows(2).find(|w| w[0] == w[1]) {
        bail!("group {group} received message {} more than once", message_id(pair[0]));
    }
    if received != expected {
        let (got, want): (BTreeSet<u64>, BTreeSet<u64>) =
            (received.iter().copied().collect(), expected.iter().copied().collect());
        let missing: Vec<String> = want.difference(&got).take(3).map(|&i| message_id(i)).collect();
        let extra: Vec<String> = got.difference(&want).take(3).map(|&i| message_id(i)).collect();
        bail!(
            "group {group} received {} messages where {} were expected: missing {}, unexpected {} (first: {missing:?}, {extra:?})",
            received.len(),
            expected.len(),
            want.difference(&got).count(),
            got.difference(&want).count()
        );
    }
    Ok(())
}

/// The results of every task, or the first failure (a panic is one).
async fn joined<T: 'static>(mut tasks: tokio::task::JoinSet<anyhow::Result<T>>) -> anyhow::Result<Vec<T>> {
    let mut results = Vec::with_capacity(tasks.len());
    let mut first_error = None;
    while let Some(joined) = tasks.join_next().await {
        match joined.map_err(|e| anyhow!("a task failed: {e}")).and_then(|r| r) {
            Ok(value) => results.push(value),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(results),
    }
}

fn print_report(report: &Report) {
    let ms = |latency: &Option<Latency>, pick: fn(&Latency) -> f64| {
        latency.as_ref().map_or_else(|| "-".to_string(), |l| format!("{:.2}", pick(l)))
    };
    let header = format!(
        "{:<54} {:>10} {:>8} {:>8} {:>8} {:>8} {:>13} {:>13}",
        "", "msg/s", "MB/s", "p50 ms", "p99 ms", "max ms", "broker µs/msg", "client µs/msg"
    );
    let print_rows = |title: &str, rows: &[Row]| {
        println!("\n{title}");
        println!("{header}");
        for row in rows {
            println!(
                "{:<54} {:>10.0} {:>8.1} {:>8} {:>8} {:>8} {:>13.1} {:>13.1}",
                row.label,
                row.msgs_per_s,
                row.mb_per_s,
                ms(&row.latency_ms, |l| l.p50),
                ms(&row.latency_ms, |l| l.p99),
                ms(&row.latency_ms, |l| l.max),
                row.broker_cpu_us_per_msg,
                row.client_cpu_us_per_msg
            );
        }
    };
    print_rows(
        &format!(
            "send: {} messages of {} bytes per case, {} in flight",
            report.messages, report.size, report.concurrency
        ),
        &report.send,
    );
    print_rows("receive (receive latency: the call until its stream ended)", &report.receive);
    let f = &report.filter;
    println!(
        "\nfilter: {} of {} messages delivered with TAG {TAG_HIT} in {:.2} s ({:.0} msg/s delivered); \
         the unfiltered receive of the same topic took {:.2} s",
        f.hits_delivered, f.scanned, f.seconds, f.msgs_per_s_delivered, f.unfiltered_seconds
    );
    let r = &report.ratios;
    let x = |ratio: Option<f64>| ratio.map_or_else(|| "-".to_string(), times);
    println!("\nratios, gRPC / Kafka:");
    println!("send msg/s                                {}", x(r.send_msgs_per_s));
    if report.send.len() > 2 {
        println!("send msg/s against {:>4} records/request  {}", report.kafka_batch, x(r.send_msgs_per_s_vs_batched));
    }
    println!("send latency p50 / p99                    {} / {}", x(r.send_latency_p50), x(r.send_latency_p99));
    println!("send broker CPU per message               {}", x(r.send_broker_cpu_per_msg));
    println!("receive msg/s                             {}", x(r.receive_msgs_per_s));
    println!("receive broker CPU per message            {}", x(r.receive_broker_cpu_per_msg));
    println!("filtered (1 %) / unfiltered receive time  {}", times(f.filtered_over_unfiltered_seconds));
    println!("\nratios, Kafka share group / classic consumer (Fetch + OffsetCommit):");
    println!("receive msg/s                             {}", x(r.share_vs_classic_msgs_per_s));
    println!("receive broker CPU per message            {}", x(r.share_vs_classic_broker_cpu_per_msg));
}

/// A ratio with two significant digits at least: `1.57x`, `0.0036x`.
fn times(ratio: f64) -> String {
    let decimals = if ratio > 0.0 && ratio < 0.1 { (-ratio.log10()).ceil() as usize + 1 } else { 2 };
    format!("{ratio:.decimals$}x")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_round_trip_and_others_are_refused() {
        assert_eq!(index_of(&message_id(0)), Some(0));
        assert_eq!(index_of(&message_id(123_456_789)), Some(123_456_789));
        assert_eq!(index_of("01ABC"), None);
        assert_eq!(index_of("02000000000000000A"), None);
    }

    #[test]
    fn one_message_in_a_hundred_is_a_hit() {
        let hits = (0..10_000).filter(|&i| tag_of(i) == TAG_HIT).count();
        assert_eq!(hits, 100);
    }

    #[test]
    fn a_received_message_must_be_the_one_sent() {
        let sent = grpc::message(TOPIC_GRPC, message_id(200), tag_of(200), body(200, 64));
        assert_eq!(check_received(&sent, 64).ok(), Some(200));
        let mut wrong_body = sent.clone();
        wrong_body.body = body(201, 64).into();
        assert!(check_received(&wrong_body, 64).is_err());
        let mut wrong_tag = sent.clone();
        if let Some(system) = wrong_tag.system_properties.as_mut() {
            system.tag = Some(TAG_MISS.into());
        }
        assert!(check_received(&wrong_tag, 64).is_err());
        assert_eq!(check_received(&grpc::message(TOPIC_GRPC, message_id(7), TAG_MISS, body(7, 3)), 3).ok(), Some(7));
    }

    #[test]
    fn small_ratios_keep_two_significant_digits() {
        assert_eq!(times(1.574), "1.57x");
        assert_eq!(times(0.0036), "0.0036x");
        assert_eq!(times(0.05), "0.050x");
        assert_eq!(times(0.0), "0.00x");
    }

    #[test]
    fn the_received_set_must_be_exactly_the_expected_one() {
        assert!(check_exactly(&mut [3, 1, 2], &[1, 2, 3], "g").is_ok());
        let duplicate = check_exactly(&mut [1, 2, 2], &[1, 2, 3], "g");
        assert!(format!("{duplicate:?}").contains("more than once"), "{duplicate:?}");
        let missing = check_exactly(&mut [1, 2], &[1, 2, 3], "g");
        assert!(format!("{missing:?}").contains("missing 1"), "{missing:?}");
        let extra = check_exactly(&mut [1, 2, 3, 4], &[1, 2, 3], "g");
        assert!(format!("{extra:?}").contains("unexpected 1"), "{extra:?}");
    }
}
