//! `weir bench produce`: a broker's produce capacity, measured with a raw Kafka-protocol client
//! that sends pre-encoded requests, so the client's own CPU stays small next to the broker's. See
//! `PRODUCE_LONG_ABOUT` in `cli.rs` for what is measured.

use std::io::{IsTerminal, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use hdrhistogram::Histogram;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::ProduceRequest;
use serde::Serialize;
use weir_harness::kafka_client::{self, topic_name, Client, REQUEST_TIMEOUT_MS};
use weir_proc::Pid;

use crate::cli::ProduceBenchArgs;
use crate::raw_protocol::{self, Server};

/// Produce v9: flexible, the version librdkafka 2.x sends.
pub(crate) const PRODUCE_VERSION: i16 = 9;
/// Latencies above this (10 minutes, in µs) are recorded as this.
const MAX_LATENCY_US: u64 = 600_000_000;
/// The broker's default `socket.request.max.bytes`.
const BROKER_MAX_REQUEST: usize = 100 << 20;

/// The broker under measurement.
pub(crate) struct Target {
    pub(crate) addr: SocketAddr,
    pub(crate) pid: Option<u32>,
    /// Our own child, when there is no --bootstrap; dropping it kills the broker.
    pub(crate) server: Option<Server>,
}

impl Target {
    fn open(args: &ProduceBenchArgs) -> anyhow::Result<Target> {
        if let Some(bootstrap) = &args.bootstrap {
            let addr = bootstrap
                .to_socket_addrs()
                .with_context(|| format!("cannot resolve --bootstrap {bootstrap}"))?
                .next()
                .with_context(|| format!("--bootstrap {bootstrap} resolves to no address"))?;
            return Ok(Target { addr, pid: args.broker_pid, server: None });
        }
        // admin.listeners first, so that a --set of it wins.
        let mut settings = vec![("admin.listeners".to_string(), String::new())];
        settings.extend(args.settings.iter().cloned());
        let server = Server::start("weir-bench-produce-", &settings, args.data_dir.as_deref())?;
        Ok(Target { addr: server.addr, pid: Some(server.pid()), server: Some(server) })
    }

    fn cpu_seconds(&self) -> Option<f64> {
        self.pid.and_then(|pid| weir_proc::cpu_seconds(Pid::Of(pid)))
    }

    fn rss_bytes(&self) -> Option<u64> {
        self.pid.and_then(|pid| weir_proc::memory(Pid::Of(pid))?.resident_bytes)
    }

    fn hwm_bytes(&self) -> Option<u64> {
        self.pid.and_then(|pid| weir_proc::memory(Pid::Of(pid))?.resident_peak_bytes)
    }
}

/// One RecordBatch v2 of `records` values of `size` bytes, no keys, no compression, producer id
/// -1, CRC32C set.
pub(crate) fn encode_records(size: usize, records: usize) -> anyhow::Result<Bytes> {
    let value = Bytes::from((0..size).map(|i| b'a' + (i % 26) as u8).collect::<Vec<u8>>());
    let timestamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64;
    let records: Vec<_> =
        (0..records).map(|i| weir_storage::testing::record(i as i64, timestamp, None, Some(value.clone()))).collect();
    Ok(Bytes::from(weir_storage::testing::encode(&records, weir_storage::Compression::None)))
}

/// One RecordBatch v2 of as many `size`-byte values as fit in `batch_bytes` (at least one), as
/// [`encode_records`] makes them. Returns the batch and its record count.
pub(crate) fn encode_batch(size: usize, batch_bytes: u64) -> anyhow::Result<(Bytes, usize)> {
    let mut n = usize::try_from(batch_bytes / size as u64).unwrap_or(usize::MAX).max(1);
    loop {
        let batch = encode_records(size, n)?;
        if batch.len() as u64 <= batch_bytes || n == 1 {
            return Ok((batch, n));
        }
        // Shrink in proportion to the overshoot (the per-record overhead), at least by one.
        let fits = (n as u128 * batch_bytes as u128 / batch.len() as u128) as usize;
        n = fits.min(n - 1).max(1);
    }
}

/// The partitions connection `c` of `connections` sends to: p with p % C == c, or with fewer
/// partitions than connections, partition c % P.
fn assignment(partitions: i32, connections: u32) -> Vec<Vec<i32>> {
    let connections = connections as i32;
    (0..connections)
        .map(|c| {
            if partitions >= connections {
                (0..partitions).filter(|p| p % connections == c).collect()
            } else {
                vec![c % partitions]
            }
        })
        .collect()
}

/// What is left to send, shared by the connections: a byte budget and a deadline.
struct Budget {
    claimed: AtomicU64,
    limit: Option<u64>,
    deadline: Option<Instant>,
    failed: AtomicBool,
}

impl Budget {
    /// Whether a connection may send another request carrying `bytes` of values.
    fn claim(&self, bytes: u64) -> bool {
        if self.failed.load(Ordering::Relaxed) || self.deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
        match self.limit {
            Some(limit) => self.claimed.fetch_add(bytes, Ordering::Relaxed) < limit,
            None => true,
        }
    }
}

/// One connection's pre-encoded request and what it carries.
struct Load {
    frame: Vec<u8>,
    partitions: Vec<i32>,
    records: u64,
    value_bytes: u64,
}

struct ConnectionStats {
    requests: u64,
    records: u64,
    latency_us: Option<Histogram<u64>>,
    /// When the last response was read (with acks=0: the last request written).
    finished: Instant,
}

impl ConnectionStats {
    fn new() -> ConnectionStats {
        ConnectionStats { requests: 0, records: 0, latency_us: None, finished: Instant::now() }
    }
}

/// Sends `load` over one connection until the budget runs out, with up to `in_flight` requests
/// outstanding; a reader thread takes the responses in order and checks them.
fn run_connection(
    addr: SocketAddr,
    mut load: Load,
    topic: &str,
    acks: i16,
    in_flight: usize,
    budget: &Budget,
    acked: &AtomicU64,
) -> anyhow::Result<ConnectionStats> {
    let mut stream = kafka_client::connect(addr, raw_protocol::IO_TIMEOUT)?;
    if acks == 0 {
        // No responses: write as fast as the broker reads.
        let mut stats = ConnectionStats::new();
        let mut correlation = 0i32;
        while budget.claim(load.value_bytes) {
            correlation = correlation.wrapping_add(1);
            load.frame[kafka_client::CORRELATION_ID_AT].copy_from_slice(&correlation.to_be_bytes());
            stream.write_all(&load.frame).context("sending a Produce request")?;
            stats.requests += 1;
            stats.records += load.records;
            acked.fetch_add(load.records, Ordering::Relaxed);
        }
        stats.finished = Instant::now();
        return Ok(stats);
    }
    let reader_stream = stream.try_clone()?;
    // Writer -> reader: (correlation id, send time) of each request, in order.
    let (sent_tx, sent_rx) = mpsc::channel::<(i32, Instant)>();
    // Reader -> writer: one token per response, which frees an in-flight slot.
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let partitions = load.partitions.clone();
    let records = load.records;
    std::thread::scope(|scope| {
        let reader = scope.spawn(move || {
            let result = read_responses(reader_stream, sent_rx, done_tx, topic, &partitions, records, acked);
            if result.is_err() {
                budget.failed.store(true, Ordering::Relaxed);
            }
            result
        });
        let written = write_requests(&mut stream, &mut load, in_flight, budget, sent_tx, done_rx);
        if written.is_err() {
            budget.failed.store(true, Ordering::Relaxed);
        }
        let read = reader.join().map_err(|_| anyhow!("the response reader panicked"))?;
        // A failed response explains a failed write (the broker closed the connection), so it
        // is reported first.
        let stats = read?;
        written?;
        Ok(stats)
    })
}

fn write_requests(
    stream: &mut TcpStream,
    load: &mut Load,
    in_flight: usize,
    budget: &Budget,
    sent_tx: mpsc::Sender<(i32, Instant)>,
    done_rx: mpsc::Receiver<()>,
) -> anyhow::Result<()> {
    let mut outstanding = 0usize;
    let mut correlation = 0i32;
    loop {
        while done_rx.try_recv().is_ok() {
            outstanding -= 1;
        }
        if outstanding >= in_flight {
            if done_rx.recv().is_err() {
                return Ok(()); // the reader stopped; its result says why
            }
            outstanding -= 1;
        }
        if !budget.claim(load.value_bytes) {
            return Ok(());
        }
        correlation = correlation.wrapping_add(1);
        load.frame[kafka_client::CORRELATION_ID_AT].copy_from_slice(&correlation.to_be_bytes());
        // Announced before the write: the response may arrive before write_all returns.
        if sent_tx.send((correlation, Instant::now())).is_err() {
            return Ok(());
        }
        stream.write_all(&load.frame).context("sending a Produce request")?;
        outstanding += 1;
    }
}

fn read_responses(
    mut stream: TcpStream,
    sent_rx: mpsc::Receiver<(i32, Instant)>,
    done_tx: mpsc::Sender<()>,
    topic: &str,
    partitions: &[i32],
    records: u64,
    acked: &AtomicU64,
) -> anyhow::Result<ConnectionStats> {
    let mut latency = latency_histogram()?;
    let mut stats = ConnectionStats::new();
    // Ends when the writer is done and every response it announced has been read.
    for (correlation, sent) in sent_rx {
        let frame = kafka_client::read_frame(&mut stream)
            .with_context(|| format!("waiting for the response to Produce request {correlation}"))?;
        latency.saturating_record(sent.elapsed().as_micros() as u64);
        let response = kafka_client::decode_response::<ProduceRequest>(frame, PRODUCE_VERSION, correlation)?;
        let answered: Vec<_> = response.responses.iter().flat_map(|t| &t.partition_responses).collect();
        for &p in partitions {
            let r = answered
                .iter()
                .find(|r| r.index == p)
                .with_context(|| format!("the Produce response has no result for {topic}-{p}"))?;
            if r.error_code != 0 {
                bail!(
                    "Produce to {topic}-{p} failed: {} {}",
                    raw_protocol::error_name(r.error_code),
                    r.error_message.as_deref().unwrap_or("")
                );
            }
        }
        stats.requests += 1;
        stats.records += records;
        acked.fetch_add(records, Ordering::Relaxed);
        let _ = done_tx.send(());
    }
    stats.latency_us = Some(latency);
    stats.finished = Instant::now();
    Ok(stats)
}

/// Request latency percentiles in milliseconds.
#[derive(Debug, Serialize)]
pub(crate) struct Latency {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
    pub(crate) max: f64,
}

impl Latency {
    /// The percentiles of a histogram of microseconds; `None` when it is empty.
    pub(crate) fn of(us: &Histogram<u64>) -> Option<Latency> {
        (!us.is_empty()).then(|| Latency {
            p50: us.value_at_quantile(0.5) as f64 / 1e3,
            p99: us.value_at_quantile(0.99) as f64 / 1e3,
            p999: us.value_at_quantile(0.999) as f64 / 1e3,
            max: us.max() as f64 / 1e3,
        })
    }
}

/// An empty histogram of request latencies in microseconds, up to [`MAX_LATENCY_US`].
pub(crate) fn latency_histogram() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::<u64>::new_with_bounds(1, MAX_LATENCY_US, 3)?)
}

/// `histograms` added up.
pub(crate) fn merge<'a>(histograms: impl IntoIterator<Item = &'a Histogram<u64>>) -> anyhow::Result<Histogram<u64>> {
    let mut merged = latency_histogram()?;
    for h in histograms {
        merged.add(h).map_err(|e| anyhow!("merging latency histograms: {e:?}"))?;
    }
    Ok(merged)
}

#[derive(Debug, Serialize)]
struct ConsumeReport {
    records: u64,
    value_bytes: u64,
    seconds: f64,
    mb_per_s: f64,
    msgs_per_s: f64,
    broker_cpu_seconds: Option<f64>,
    broker_cpu_percent: Option<f64>,
    client_cpu_percent: f64,
}

#[derive(Debug, Serialize)]
pub(crate) struct Report {
    broker: String,
    topic: String,
    partitions: i32,
    topic_configs: Vec<String>,
    connections: u32,
    in_flight: u32,
    acks: i16,
    value_size: u64,
    records_per_batch: usize,
    batch_bytes: usize,
    requests: u64,
    records: u64,
    value_bytes: u64,
    seconds: f64,
    pub(crate) mb_per_s: f64,
    msgs_per_s: f64,
    /// Produce latency (request write to response) in milliseconds; none with acks=0.
    pub(crate) latency_ms: Option<Latency>,
    broker_cpu_seconds: Option<f64>,
    broker_cpu_percent: Option<f64>,
    /// Highest VmRSS sampled during the run.
    broker_peak_rss_bytes: Option<u64>,
    /// VmHWM at the end: the peak over the broker's life.
    broker_hwm_bytes: Option<u64>,
    client_cpu_seconds: f64,
    client_cpu_percent: f64,
    /// Sum over the partitions of the offsets the run added (ListOffsets latest, after - before).
    log_end_offset_total: i64,
    offsets_match: bool,
    consume: Option<ConsumeReport>,
}

pub(crate) fn run(args: &ProduceBenchArgs) -> anyhow::Result<()> {
    let size = usize::try_from(args.size).ok().filter(|&s| s <= 64 << 20).context("--size must be at most 64 MiB")?;
    if args.batch_bytes > 1 << 30 {
        bail!("--batch-bytes must be at most 1 GiB");
    }
    let target = Target::open(args)?;
    let result = measure_new_topic(args, &target, size);
    let report = result?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    report.check()
}

impl Report {
    /// Fails unless the broker stored exactly what it acknowledged (and, with --consume, gave
    /// it all back).
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        if !self.offsets_match {
            bail!(
                "the topic's offsets grew by {}, but {} records were acknowledged",
                self.log_end_offset_total,
                self.records
            );
        }
        if let Some(consume) = &self.consume {
            if consume.records != self.records {
                bail!("read back {} records, but {} were acknowledged", consume.records, self.records);
            }
        }
        Ok(())
    }
}

/// Creates a fresh topic on `target` (on `args.replicas` if given), measures it, and deletes
/// it again on a broker this run did not start (unless --keep-topic).
pub(crate) fn measure_new_topic(args: &ProduceBenchArgs, target: &Target, size: usize) -> anyhow::Result<Report> {
    let topic = format!("weir-bench-produce-{}", SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos());
    let mut admin = raw_protocol::connect(target.addr)?;
    let replicas = (!args.replicas.is_empty()).then_some(&args.replicas[..]);
    raw_protocol::create_topic(&mut admin, &topic, args.partitions, &args.topic_config, replicas)?;
    if replicas.is_some() {
        // The leaders must know of the topic before the first Produce.
        std::thread::sleep(Duration::from_millis(200));
    }
    let result = measure(args, target, &topic, size, &mut admin);
    if target.server.is_none() && !args.keep_topic {
        if let Err(e) = raw_protocol::delete_topic(&mut admin, &topic) {
            eprintln!("warning: could not delete topic {topic}: {e:#}");
        }
    }
    result
}

fn measure(
    args: &ProduceBenchArgs,
    target: &Target,
    topic: &str,
    size: usize,
    admin: &mut Client,
) -> anyhow::Result<Report> {
    let partition_ids: Vec<i32> = (0..args.partitions).collect();
    let before = raw_protocol::latest_offsets(admin, topic, &partition_ids)?;
    let (batch, records_per_batch) = encode_batch(size, args.batch_bytes)?;
    let loads = connection_loads(args, topic, &batch, records_per_batch)?;
    let limit = byte_limit(args);
    print_plan(args, target, topic, &loads, limit, records_per_batch, batch.len());

    let broker_cpu_before = target.cpu_seconds();
    let client_cpu_before = raw_protocol::cpu_seconds(Pid::SelfProcess)?;
    let Produced { stats, started, mut peak_rss } = produce_on_every_connection(args, target, topic, loads, limit)?;
    let records: u64 = stats.iter().map(|s| s.records).sum();
    let requests: u64 = stats.iter().map(|s| s.requests).sum();
    let expected = before.iter().sum::<i64>() + records as i64;
    // With acks=0 nothing says when the broker has appended; the run ends when the offsets show it.
    let (after, seconds) = if args.acks == 0 {
        let after = raw_protocol::wait_for_offsets(admin, topic, &partition_ids, expected, Duration::from_secs(60))?;
        (after, started.elapsed().as_secs_f64())
    } else {
        let finished = stats.iter().map(|s| s.finished).max().unwrap_or(started);
        (Vec::new(), (finished - started).as_secs_f64())
    };
    let broker_cpu = target.cpu_seconds().zip(broker_cpu_before).map(|(a, b)| a - b);
    let client_cpu = raw_protocol::cpu_seconds(Pid::SelfProcess)? - client_cpu_before;
    peak_rss = peak_rss.max(target.rss_bytes());
    let after = if after.is_empty() {
        // Acknowledged is appended; with flush.policy=sync the high watermark can trail the
        // acknowledgement of acks=1 by an fsync, so give it a moment.
        raw_protocol::wait_for_offsets(admin, topic, &partition_ids, expected, Duration::from_secs(30))?
    } else {
        after
    };
    let log_end_offset_total = after.iter().sum::<i64>() - before.iter().sum::<i64>();

    let latency_ms = Latency::of(&merge(stats.iter().filter_map(|s| s.latency_us.as_ref()))?);
    let value_bytes = records * args.size;
    let mut report = Report {
        broker: target.addr.to_string(),
        topic: topic.to_string(),
        partitions: args.partitions,
        topic_configs: args.topic_config.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        connections: args.connections,
        in_flight: args.in_flight,
        acks: args.acks,
        value_size: args.size,
        records_per_batch,
        batch_bytes: batch.len(),
        requests,
        records,
        value_bytes,
        seconds,
        mb_per_s: value_bytes as f64 / 1e6 / seconds,
        msgs_per_s: records as f64 / seconds,
        latency_ms,
        broker_cpu_seconds: broker_cpu,
        broker_cpu_percent: broker_cpu.map(|c| 100.0 * c / seconds),
        broker_peak_rss_bytes: peak_rss,
        broker_hwm_bytes: target.hwm_bytes(),
        client_cpu_seconds: client_cpu,
        client_cpu_percent: 100.0 * client_cpu / seconds,
        log_end_offset_total,
        offsets_match: log_end_offset_total == records as i64,
        consume: None,
    };
    print_produce_report(&report);

    if args.consume && report.offsets_match {
        let ranges: Vec<(i32, i64, i64)> =
            partition_ids.iter().zip(before.iter().zip(&after)).map(|(&p, (&b, &a))| (p, b, a)).collect();
        report.consume = Some(consume_back(args, target, topic, &ranges)?);
    }
    Ok(report)
}

/// One Produce request per connection, encoded once and sent again and again: each connection
/// writes the same batch to each of its partitions.
fn connection_loads(
    args: &ProduceBenchArgs,
    topic: &str,
    batch: &Bytes,
    records_per_batch: usize,
) -> anyhow::Result<Vec<Load>> {
    assignment(args.partitions, args.connections)
        .into_iter()
        .map(|partitions| {
            let request = ProduceRequest::default()
                .with_acks(args.acks)
                .with_timeout_ms(REQUEST_TIMEOUT_MS)
                .with_topic_data(vec![TopicProduceData::default().with_name(topic_name(topic)).with_partition_data(
                    partitions
                        .iter()
                        .map(|&p| PartitionProduceData::default().with_index(p).with_records(Some(batch.clone())))
                        .collect(),
                )]);
            let frame = kafka_client::encode_request(PRODUCE_VERSION, 0, raw_protocol::CLIENT_ID, &request)?.to_vec();
            let records = (records_per_batch * partitions.len()) as u64;
            Ok(Load { frame, partitions, records, value_bytes: records * args.size })
        })
        .collect()
}

/// How many value bytes the run may write: --bytes, none when only --duration bounds it, and
/// 1 GiB when neither is given.
fn byte_limit(args: &ProduceBenchArgs) -> Option<u64> {
    match (args.bytes, args.duration) {
        (Some(bytes), _) => Some(bytes),
        (None, Some(_)) => None,
        (None, None) => Some(1 << 30),
    }
}

/// Says what the run will do, and warns when a request is larger than a default broker takes.
fn print_plan(
    args: &ProduceBenchArgs,
    target: &Target,
    topic: &str,
    loads: &[Load],
    limit: Option<u64>,
    records_per_batch: usize,
    batch_bytes: usize,
) {
    let biggest = loads.iter().map(|l| l.frame.len()).max().unwrap_or(0);
    if biggest > BROKER_MAX_REQUEST {
        eprintln!(
            "warning: requests of {biggest} bytes are above the default socket.request.max.bytes ({BROKER_MAX_REQUEST}); \
             lower --batch-bytes or use more --connections"
        );
    }
    let per_request = loads.iter().map(|l| l.partitions.len()).max().unwrap_or(1);
    println!(
        "weir bench produce: {} {}-byte values to {} partition(s) of {topic} at {}, {} connection(s) x {} in flight, acks={}{}",
        match (limit, args.duration) {
            (Some(l), Some(d)) => format!("{:.0} MB (or {:.0} s) of", l as f64 / 1e6, d.as_secs_f64()),
            (Some(l), None) => format!("{:.0} MB of", l as f64 / 1e6),
            (None, Some(d)) => format!("{:.0} s of", d.as_secs_f64()),
            (None, None) => String::new(),
        },
        args.size,
        args.partitions,
        target.addr,
        args.connections,
        args.in_flight,
        if args.acks == -1 { "all".to_string() } else { args.acks.to_string() },
        if args.topic_config.is_empty() {
            String::new()
        } else {
            let configs: Vec<String> = args.topic_config.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!(", topic {}", configs.join(" "))
        }
    );
    println!(
        "  batches of {records_per_batch} values ({batch_bytes} B), up to {per_request} per request ({biggest} B)"
    );
}

/// What the connections did, from when they started, and the broker's peak RSS meanwhile.
struct Produced {
    stats: Vec<ConnectionStats>,
    started: Instant,
    peak_rss: Option<u64>,
}

/// Runs every connection on its own thread until the budget is spent. Meanwhile this thread
/// samples the broker's RSS every 100 ms (a peak between samples is in the broker's high-water
/// mark) and, on a terminal, prints the acknowledged rate every second.
fn produce_on_every_connection(
    args: &ProduceBenchArgs,
    target: &Target,
    topic: &str,
    loads: Vec<Load>,
    limit: Option<u64>,
) -> anyhow::Result<Produced> {
    let budget = Budget {
        claimed: AtomicU64::new(0),
        limit,
        deadline: args.duration.map(|d| Instant::now() + d),
        failed: AtomicBool::new(false),
    };
    let acked = AtomicU64::new(0);
    let in_flight = args.in_flight as usize;
    let progress = std::io::stderr().is_terminal();
    let mut peak_rss = target.rss_bytes();
    let started = Instant::now();
    let results: Vec<anyhow::Result<ConnectionStats>> = std::thread::scope(|scope| {
        let handles: Vec<_> = loads
            .into_iter()
            .map(|load| {
                let (budget, acked) = (&budget, &acked);
                scope.spawn(move || run_connection(target.addr, load, topic, args.acks, in_flight, budget, acked))
            })
            .collect();
        let mut next_report = started + Duration::from_secs(1);
        let mut last = (started, 0u64);
        let mut next_sample = started;
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(5));
            let now = Instant::now();
            if now >= next_sample {
                peak_rss = peak_rss.max(target.rss_bytes());
                next_sample = now + Duration::from_millis(100);
            }
            if progress && now >= next_report {
                let records = acked.load(Ordering::Relaxed);
                let mb = (records - last.1) as f64 * args.size as f64 / 1e6;
                eprintln!("  {:5.1} s: {:6.0} MB/s", (now - started).as_secs_f64(), mb / (now - last.0).as_secs_f64());
                last = (now, records);
                next_report = now + Duration::from_secs(1);
            }
        }
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a connection thread panicked")))).collect()
    });
    let mut stats = Vec::new();
    for (c, result) in results.into_iter().enumerate() {
        stats.push(result.with_context(|| format!("connection {c}"))?);
    }
    Ok(Produced { stats, started, peak_rss })
}

fn print_produce_report(report: &Report) {
    let Report { records, requests, seconds, log_end_offset_total, client_cpu_seconds, .. } = report;
    println!(
        "produce  {:8.0} MB/s {:10.0} msg/s   {records} records, {requests} requests in {seconds:.2} s",
        report.mb_per_s, report.msgs_per_s
    );
    if let Some(l) = &report.latency_ms {
        println!("latency  p50 {:.2} ms   p99 {:.2} ms   p99.9 {:.2} ms   max {:.2} ms", l.p50, l.p99, l.p999, l.max);
    }
    match (report.broker_cpu_seconds, report.broker_cpu_percent) {
        (Some(s), Some(p)) => println!(
            "broker   CPU {s:.2} s = {p:.0} %   peak RSS {}",
            report.broker_peak_rss_bytes.map(|b| format!("{} MiB", b >> 20)).unwrap_or_else(|| "?".into())
        ),
        _ => println!("broker   CPU and RSS unknown (give --broker-pid)"),
    }
    println!(
        "client   CPU {client_cpu_seconds:.2} s = {:.0} %   (this process, all threads)",
        report.client_cpu_percent
    );
    println!(
        "offsets  +{log_end_offset_total} over {} partition(s): {}",
        report.partitions,
        if report.offsets_match { "= records acknowledged" } else { "MISMATCH with the records acknowledged" }
    );
}

/// Reads back what was produced (`(partition, from, to)` ranges) on a connection of its own,
/// and measures it as the produce side was measured.
fn consume_back(
    args: &ProduceBenchArgs,
    target: &Target,
    topic: &str,
    ranges: &[(i32, i64, i64)],
) -> anyhow::Result<ConsumeReport> {
    let fetch_bytes = i32::try_from(args.batch_bytes.max(1 << 20)).unwrap_or(i32::MAX);
    let mut client = raw_protocol::connect(target.addr)?;
    let broker_cpu_before = target.cpu_seconds();
    let client_cpu_before = raw_protocol::cpu_seconds(Pid::SelfProcess)?;
    let started = Instant::now();
    let fetched = raw_protocol::fetch_all(&mut client, topic, ranges, fetch_bytes)?;
    let seconds = started.elapsed().as_secs_f64();
    let broker_cpu = target.cpu_seconds().zip(broker_cpu_before).map(|(a, b)| a - b);
    let client_cpu = raw_protocol::cpu_seconds(Pid::SelfProcess)? - client_cpu_before;
    let value_bytes = fetched.records * args.size;
    let consume = ConsumeReport {
        records: fetched.records,
        value_bytes,
        seconds,
        mb_per_s: value_bytes as f64 / 1e6 / seconds,
        msgs_per_s: fetched.records as f64 / seconds,
        broker_cpu_seconds: broker_cpu,
        broker_cpu_percent: broker_cpu.map(|c| 100.0 * c / seconds),
        client_cpu_percent: 100.0 * client_cpu / seconds,
    };
    println!(
        "consume  {:8.0} MB/s {:10.0} msg/s   {} records in {seconds:.2} s, broker CPU {}, client CPU {:.0} %",
        consume.mb_per_s,
        consume.msgs_per_s,
        consume.records,
        consume.broker_cpu_percent.map(|p| format!("{p:.0} %")).unwrap_or_else(|| "?".into()),
        consume.client_cpu_percent
    );
    Ok(consume)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_fill_but_do_not_exceed_their_size() {
        let (batch, n) = encode_batch(1024, 1 << 20).expect("encodes");
        assert!(batch.len() <= 1 << 20, "{}", batch.len());
        // About 10 bytes of record overhead per 1 KiB value.
        assert!(n > 1000 && n < 1024, "{n}");
        let (batch, n) = encode_batch(4096, 100).expect("encodes");
        assert_eq!(n, 1, "one record even when it does not fit");
        assert!(batch.len() > 4096);
    }

    #[test]
    fn partitions_are_spread_over_connections() {
        assert_eq!(assignment(4, 2), vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(assignment(1, 3), vec![vec![0], vec![0], vec![0]]);
        assert_eq!(assignment(2, 3), vec![vec![0], vec![1], vec![0]]);
        assert_eq!(assignment(5, 1), vec![vec![0, 1, 2, 3, 4]]);
    }

    #[test]
    fn the_budget_stops_at_the_byte_limit() {
        let budget =
            Budget { claimed: AtomicU64::new(0), limit: Some(10), deadline: None, failed: AtomicBool::new(false) };
        assert!(budget.claim(4));
        assert!(budget.claim(4));
        assert!(budget.claim(4)); // 8 < 10: the last request may overshoot
        assert!(!budget.claim(4));
    }
}
