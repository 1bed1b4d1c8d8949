//! One phase of a run: producer threads and an optional consumer thread against one topic, a
//! monitor (progress bar, broker sampling) on the calling thread, and what they measured.
//!
//! Every client is created and connected before the clock starts: each thread says it is ready
//! and waits; then the monitor sets the epoch that every timestamp of the phase counts from and
//! lets them go. Each
//! thread records into its own [`stats`](crate::stats) values; they are merged after the join.
//!
//! A producer thread owns one librdkafka producer (its own connections) and sends keyless
//! messages that librdkafka's partitioner places (or, with `--partitioner round-robin`, names
//! the next partition for each), polling for delivery reports as it goes. The consumer is assigned
//! every partition from the beginning, without a group, and stops once it has received as many
//! messages as were acknowledged, or when it has received nothing for `stall_timeout` while
//! messages were due.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{Offset, TopicPartitionList};

use crate::cli::{Acks, Partitioner};
use crate::kafka::{self, payload};
use crate::procstat::{ProcessMonitor, ProcessUsage};
use crate::stats::{Flow, Latency, Series};

/// Messages a producer claims at a time from a shared --messages budget.
const CLAIM_BLOCK: u64 = 1000;
/// Problems kept per phase (the first ones say what went wrong; the rest repeat it).
const PROBLEMS_MAX: usize = 5;

#[derive(Debug, Clone)]
pub struct PhaseSpec {
    pub label: String,
    pub bootstrap: String,
    pub client_config: Vec<(String, String)>,
    pub topic: String,
    pub partitions: u32,
    /// Producer threads; 0 for a consumer-only phase.
    pub producers: u32,
    pub acks: Acks,
    pub linger_ms: u32,
    /// queue.buffering.max.kbytes of each producer.
    pub producer_buffer_kib: u32,
    pub message_bytes: u64,
    pub partitioner: Partitioner,
    /// Messages per second of all producers together; None: as fast as they go.
    pub rate: Option<u64>,
    /// Producing stops at warm-up + duration (None: no time limit) ...
    pub duration: Option<Duration>,
    /// ... or after this many messages in all (None: no count limit).
    pub messages: Option<u64>,
    pub warmup: Duration,
    pub consumer: ConsumerMode,
    pub broker_pid: Option<u32>,
    pub stall_timeout: Duration,
    pub progress: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerMode {
    None,
    /// Reads while the producers write, and times each message from its send stamp.
    Concurrent,
    /// Reads this many messages already in the topic (a backlog written by an earlier phase):
    /// the send stamps are from another epoch, so no latency is recorded.
    Drain {
        messages: u64,
    },
}

/// What a phase measured. Times in nanoseconds since the phase's epoch.
#[derive(Debug, Default)]
pub struct PhaseOutcome {
    /// Acknowledged messages after the warm-up.
    pub produced: Flow,
    /// Received messages after the warm-up.
    pub consumed: Flow,
    /// From send stamp to delivery report, messages sent after the warm-up.
    pub publish: Latency,
    /// From send stamp to receipt, messages sent after the warm-up.
    pub e2e: Latency,
    pub series: Series,
    pub acked_total: u64,
    pub received_total: u64,
    pub produce_errors: u64,
    pub consume_errors: u64,
    /// The consumer received every acknowledged message.
    pub complete: bool,
    pub problems: Vec<String>,
    /// Errors the clients logged, which did not stop the phase.
    pub notes: Vec<String>,
    /// The last event of the phase.
    pub end_ns: u64,
    pub broker: Option<ProcessUsage>,
    /// The broker's VmRSS over the phase: (ns since the epoch, bytes), every 200 ms.
    pub broker_rss: Vec<(u64, u64)>,
    /// This process: the clients (producers, consumer and librdkafka's threads).
    pub client: Option<ProcessUsage>,
}

/// State shared by the threads of a phase.
struct Shared {
    epoch: OnceLock<Instant>,
    /// Threads whose clients are set up (or failed to be).
    ready: AtomicUsize,
    /// Set after the epoch: the threads may start.
    go: AtomicBool,
    abort: AtomicBool,
    producers_running: AtomicU32,
    /// Messages acknowledged by finished producers, plus a drain's expected count.
    acked_final: AtomicU64,
    /// Live counters for the progress bar and the stall check.
    sent: AtomicU64,
    acked_msgs: AtomicU64,
    acked_bytes: AtomicU64,
    received_msgs: AtomicU64,
    received_bytes: AtomicU64,
    /// Messages claimed from the --messages budget.
    claimed: AtomicU64,
    /// What made the phase fail.
    problems: Mutex<Vec<String>>,
    /// What the clients logged as errors (often transient: a connection retried).
    notes: Mutex<Vec<String>>,
}

impl Shared {
    /// Before any thread starts: the epoch unset, `producers_running` at every producer, and a
    /// drain's expected count already in `acked_final` (no producer acknowledges it).
    fn new(spec: &PhaseSpec) -> Shared {
        Shared {
            epoch: OnceLock::new(),
            ready: AtomicUsize::new(0),
            go: AtomicBool::new(false),
            abort: AtomicBool::new(false),
            producers_running: AtomicU32::new(spec.producers),
            acked_final: AtomicU64::new(match spec.consumer {
                ConsumerMode::Drain { messages } => messages,
                _ => 0,
            }),
            sent: AtomicU64::new(0),
            acked_msgs: AtomicU64::new(0),
            acked_bytes: AtomicU64::new(0),
            received_msgs: AtomicU64::new(0),
            received_bytes: AtomicU64::new(0),
            claimed: AtomicU64::new(0),
            problems: Mutex::new(Vec::new()),
            notes: Mutex::new(Vec::new()),
        }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.get().map_or(0, |epoch| u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    fn problem(&self, text: String) {
        push_bounded(&self.problems, text);
    }

    fn note(&self, text: String) {
        push_bounded(&self.notes, text);
    }

    fn fail(&self, text: String) {
        self.problem(text);
        self.abort.store(true, Ordering::SeqCst);
    }

    fn aborted(&self) -> bool {
        self.abort.load(Ordering::Relaxed)
    }

    /// Called by each thread once its client is set up (or failed to be).
    fn ready_and_wait(&self) {
        self.ready.fetch_add(1, Ordering::SeqCst);
        while !self.go.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

#[derive(Debug, Default)]
struct ProducerStats {
    produced: Flow,
    publish: Latency,
    series: Series,
    acked: u64,
    errors: u64,
}

struct ProducerCtx {
    shared: Arc<Shared>,
    warmup_ns: u64,
    stats: Mutex<ProducerStats>,
}

impl ClientContext for ProducerCtx {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel::*;
        if matches!(level, Emerg | Alert | Critical | Error) {
            self.shared.note(format!("producer: librdkafka {facility}: {message}"));
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.shared.note(format!("producer: {error}: {reason}"));
    }
}

impl ProducerContext for ProducerCtx {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let now = self.shared.now_ns();
        let Ok(mut stats) = self.stats.lock() else { return };
        match result {
            Ok(message) => {
                let value = message.payload().unwrap_or_default();
                let bytes = value.len() as u64;
                stats.acked += 1;
                stats.produced.record(now, bytes);
                stats.series.record_produced(now, bytes);
                if let Some((send_ns, _)) = payload::read_header(value) {
                    if send_ns >= self.warmup_ns {
                        stats.publish.record_ns(now.saturating_sub(send_ns));
                    }
                }
                self.shared.acked_msgs.fetch_add(1, Ordering::Relaxed);
                self.shared.acked_bytes.fetch_add(bytes, Ordering::Relaxed);
            }
            Err((error, _)) => {
                stats.errors += 1;
                drop(stats);
                self.shared.problem(format!("delivery failed: {error}"));
            }
        }
    }
}

struct ConsumerCtx {
    shared: Arc<Shared>,
}

impl ClientContext for ConsumerCtx {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel::*;
        if matches!(level, Emerg | Alert | Critical | Error) {
            self.shared.note(format!("consumer: librdkafka {facility}: {message}"));
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.shared.note(format!("consumer: {error}: {reason}"));
    }
}

impl ConsumerContext for ConsumerCtx {}

#[derive(Debug, Default)]
struct ConsumerStats {
    consumed: Flow,
    e2e: Latency,
    series: Series,
    received: u64,
    errors: u64,
    complete: bool,
}

pub fn run_phase(spec: &PhaseSpec) -> anyhow::Result<PhaseOutcome> {
    let shared = Arc::new(Shared::new(spec));
    let warmup_ns = u64::try_from(spec.warmup.as_nanos()).unwrap_or(u64::MAX);
    let threads = run_threads(spec, &shared, warmup_ns);
    let (broker, broker_rss) = match threads.broker.transpose() {
        Ok(Some((usage, rss))) => (Some(usage), rss),
        Ok(None) => (None, Vec::new()),
        Err(e) => {
            shared.note(format!("cannot read the broker's /proc figures: {e}"));
            (None, Vec::new())
        }
    };

    let mut outcome = PhaseOutcome {
        produced: Flow::new(warmup_ns),
        consumed: Flow::new(warmup_ns),
        broker,
        broker_rss,
        client: threads.client.ok().map(|(usage, _)| usage),
        ..PhaseOutcome::default()
    };
    outcome.add_producers(threads.producers, &shared);
    outcome.complete = spec.consumer == ConsumerMode::None;
    if let Some(stats) = threads.consumer {
        outcome.add_consumer(stats, &shared);
    }
    outcome.end_ns = outcome.produced.last_ns.max(outcome.consumed.last_ns);
    outcome.problems = shared.problems.lock().map(|p| p.clone()).unwrap_or_default();
    outcome.notes = shared.notes.lock().map(|p| p.clone()).unwrap_or_default();
    Ok(outcome)
}

/// What a thread of the phase returned: its stats, or the error it failed with, or its panic.
type Joined<T> = std::thread::Result<anyhow::Result<T>>;

/// What the phase's threads returned, and what the monitor measured meanwhile.
struct Threads {
    producers: Vec<Joined<ProducerStats>>,
    consumer: Option<Joined<ConsumerStats>>,
    broker: Option<Sampled>,
    client: Sampled,
}

/// Starts the producer threads and the consumer thread, sets the epoch once every one has
/// its client set up (connecting is not timed), and monitors them until all have finished.
fn run_threads(spec: &PhaseSpec, shared: &Arc<Shared>, warmup_ns: u64) -> Threads {
    let has_consumer = spec.consumer != ConsumerMode::None;
    let threads = spec.producers as usize + usize::from(has_consumer);
    std::thread::scope(|scope| {
        let producers: Vec<_> = (0..spec.producers)
            .map(|index| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("producer-{index}"))
                    .spawn_scoped(scope, move || producer_thread(spec, index, shared, warmup_ns))
            })
            .collect();
        let consumer = has_consumer.then(|| {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("consumer".into())
                .spawn_scoped(scope, move || consumer_thread(spec, shared, warmup_ns))
        });
        let mut handles = Vec::new();
        for producer in producers {
            match producer {
                Ok(handle) => handles.push(handle),
                Err(e) => shared.fail(format!("cannot start a producer thread: {e}")),
            }
        }
        let consumer =
            consumer.and_then(|c| c.map_err(|e| shared.fail(format!("cannot start the consumer: {e}"))).ok());
        let started = handles.len() + usize::from(consumer.is_some());
        debug_assert!(started <= threads);
        while shared.ready.load(Ordering::SeqCst) < started {
            std::thread::sleep(Duration::from_micros(200));
        }
        shared.epoch.get_or_init(Instant::now);
        shared.go.store(true, Ordering::SeqCst);
        let (broker, client) = monitor(spec, shared, || {
            handles.iter().all(|h| h.is_finished()) && consumer.as_ref().is_none_or(|c| c.is_finished())
        });
        let producers = handles.into_iter().map(|h| h.join()).collect();
        let consumer = consumer.map(|c| c.join());
        Threads { producers, consumer, broker, client }
    })
}

impl PhaseOutcome {
    /// Merges what the producers measured; one that failed or panicked leaves a problem
    /// instead, which fails the phase.
    fn add_producers(&mut self, producers: Vec<Joined<ProducerStats>>, shared: &Shared) {
        for stats in producers {
            match stats {
                Ok(Ok(stats)) => {
                    self.produced.merge(&stats.produced);
                    self.publish.merge(&stats.publish);
                    self.series.merge(&stats.series);
                    self.acked_total += stats.acked;
                    self.produce_errors += stats.errors;
                }
                Ok(Err(e)) => shared.problem(format!("producer: {e:#}")),
                Err(_) => shared.problem("a producer thread panicked".into()),
            }
        }
    }

    /// Merges what the consumer measured; only a consumer that finished says whether the
    /// phase is complete (one that failed leaves a problem instead).
    fn add_consumer(&mut self, consumer: Joined<ConsumerStats>, shared: &Shared) {
        match consumer {
            Ok(Ok(stats)) => {
                self.consumed.merge(&stats.consumed);
                self.e2e.merge(&stats.e2e);
                self.series.merge(&stats.series);
                self.received_total = stats.received;
                self.consume_errors = stats.errors;
                self.complete = stats.complete;
            }
            Ok(Err(e)) => shared.problem(format!("consumer: {e:#}")),
            Err(_) => shared.problem("the consumer thread panicked".into()),
        }
    }
}

type Sampled = std::io::Result<(ProcessUsage, Vec<(u64, u64)>)>;

/// Updates the progress bar and samples the broker every 200 ms until `done`; measures this
/// process's CPU over the same time. Returns (broker, clients).
fn monitor(spec: &PhaseSpec, shared: &Shared, done: impl Fn() -> bool) -> (Option<Sampled>, Sampled) {
    let mut broker = spec.broker_pid.map(ProcessMonitor::start);
    let client = ProcessMonitor::start(std::process::id());
    let total_ns = spec.duration.map(|d| (spec.warmup + d).as_nanos() as u64);
    let bar = if spec.progress { ProgressBar::new(1000) } else { ProgressBar::hidden() };
    if spec.progress {
        bar.set_draw_target(ProgressDrawTarget::stderr_with_hz(5));
    }
    let style = ProgressStyle::with_template("{prefix:>32} [{bar:30}] {percent:>3}% {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(spec.label.clone());
    let mut last = (Instant::now(), 0u64, 0u64);
    while !done() {
        std::thread::sleep(Duration::from_millis(200));
        let now_ns = shared.now_ns();
        if let Some(Ok(monitor)) = &mut broker {
            monitor.sample(now_ns);
        }
        let acked = shared.acked_bytes.load(Ordering::Relaxed);
        let received = shared.received_bytes.load(Ordering::Relaxed);
        let fraction = match (spec.consumer, total_ns, spec.messages) {
            (ConsumerMode::Drain { messages }, _, _) => {
                shared.received_msgs.load(Ordering::Relaxed) as f64 / messages.max(1) as f64
            }
            (_, Some(total), limit) => {
                let by_time = now_ns as f64 / total as f64;
                let by_count = limit.map_or(0.0, |l| shared.sent.load(Ordering::Relaxed) as f64 / l as f64);
                by_time.max(by_count)
            }
            (_, None, Some(limit)) => shared.sent.load(Ordering::Relaxed) as f64 / limit as f64,
            (_, None, None) => 0.0,
        };
        bar.set_position((fraction.clamp(0.0, 1.0) * 1000.0) as u64);
        let seconds = last.0.elapsed().as_secs_f64().max(1e-3);
        let produce_mb_per_s = acked.saturating_sub(last.1) as f64 / 1e6 / seconds;
        let consume_mb_per_s = received.saturating_sub(last.2) as f64 / 1e6 / seconds;
        bar.set_message(format!("produce {produce_mb_per_s:7.1} MB/s  consume {consume_mb_per_s:7.1} MB/s"));
        last = (Instant::now(), acked, received);
    }
    bar.finish_and_clear();
    (broker.map(|b| b.and_then(ProcessMonitor::finish)), client.and_then(ProcessMonitor::finish))
}

fn producer_thread(spec: &PhaseSpec, index: u32, shared: Arc<Shared>, warmup_ns: u64) -> anyhow::Result<ProducerStats> {
    let context = ProducerCtx {
        shared: shared.clone(),
        warmup_ns,
        stats: Mutex::new(ProducerStats { produced: Flow::new(warmup_ns), ..ProducerStats::default() }),
    };
    let setup = (|| -> anyhow::Result<BaseProducer<ProducerCtx>> {
        let producer: BaseProducer<ProducerCtx> = kafka::producer_config(
            &spec.bootstrap,
            spec.acks,
            spec.linger_ms,
            spec.producer_buffer_kib,
            &spec.client_config,
        )
        .create_with_context(context)
        .context("cannot create a librdkafka producer")?;
        // Connect and learn the partition leaders before the clock starts.
        producer
            .client()
            .fetch_metadata(Some(&spec.topic), Duration::from_secs(10))
            .with_context(|| format!("no metadata for topic {}", spec.topic))?;
        Ok(producer)
    })();
    shared.ready_and_wait();
    let producer = match setup {
        Ok(producer) => producer,
        Err(e) => {
            shared.fail(format!("{e:#}"));
            shared.producers_running.fetch_sub(1, Ordering::SeqCst);
            return Err(e);
        }
    };
    let result = produce(spec, index, &shared, &producer);
    // Wait for every outstanding acknowledgement, whatever happened.
    if let Err(e) = producer.flush(Duration::from_secs(90)) {
        shared.problem(format!("producer flush: {e} ({} messages unacknowledged)", producer.in_flight_count()));
    }
    let stats = producer.context().stats.lock().map(|mut s| std::mem::take(&mut *s)).unwrap_or_default();
    shared.acked_final.fetch_add(stats.acked, Ordering::SeqCst);
    shared.producers_running.fetch_sub(1, Ordering::SeqCst);
    result.map(|()| stats)
}

fn produce(spec: &PhaseSpec, index: u32, shared: &Shared, producer: &BaseProducer<ProducerCtx>) -> anyhow::Result<()> {
    let epoch_ns = shared.now_ns(); // ~0: the epoch was set at the barrier
    let deadline_ns = spec.duration.map(|d| u64::try_from((spec.warmup + d).as_nanos()).unwrap_or(u64::MAX));
    // With a rate, message i of producer k is due at (i * producers + k) / rate seconds.
    let interval_ns = spec.rate.map(|rate| 1e9 / rate as f64);
    let mut value = payload::new(spec.message_bytes, u64::from(index) + 1);
    let mut sequence = 0u64;
    let mut claimed_until = 0u64;
    let partitions = u64::from(spec.partitions);
    loop {
        if shared.aborted() {
            return Ok(());
        }
        let mut now = shared.now_ns();
        if deadline_ns.is_some_and(|d| now >= d) {
            return Ok(());
        }
        if let Some(limit) = spec.messages {
            if sequence == claimed_until {
                let start = shared.claimed.fetch_add(CLAIM_BLOCK, Ordering::Relaxed);
                if start >= limit {
                    return Ok(());
                }
                claimed_until = sequence + CLAIM_BLOCK.min(limit - start);
            }
        }
        let send_ns = match interval_ns {
            None => now,
            Some(interval) => {
                let due =
                    epoch_ns + ((sequence * u64::from(spec.producers) + u64::from(index)) as f64 * interval) as u64;
                while now < due {
                    let wait = Duration::from_nanos(due - now);
                    if wait > Duration::from_millis(2) {
                        producer.poll(Duration::ZERO);
                        std::thread::sleep(Duration::from_millis(1));
                    } else {
                        std::thread::sleep(wait);
                    }
                    if shared.aborted() {
                        return Ok(());
                    }
                    now = shared.now_ns();
                }
                // The intended time, not the actual: if the producer falls behind, the
                // latency shows it (no coordinated omission).
                due
            }
        };
        payload::write_header(&mut value, send_ns, sequence);
        let partition = match spec.partitioner {
            Partitioner::Client => None,
            Partitioner::RoundRobin => Some(((sequence + u64::from(index)) % partitions) as i32),
        };
        loop {
            let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&spec.topic).payload(&value[..]);
            if let Some(partition) = partition {
                record = record.partition(partition);
            }
            match producer.send(record) {
                Ok(()) => break,
                Err((e, _)) if kafka::is_queue_full(&e) => wait_for_queue_room(producer),
                Err((e, _)) => {
                    shared.fail(format!("send failed: {e}"));
                    return Err(anyhow::anyhow!("send failed: {e}"));
                }
            }
        }
        sequence += 1;
        shared.sent.fetch_add(1, Ordering::Relaxed);
        if sequence.is_multiple_of(64) || interval_ns.is_some() {
            producer.poll(Duration::ZERO);
        }
    }
}

/// Serves every pending delivery report, then gives the CPU away for a moment if none was
/// pending. Not `poll(1 ms)`: rdkafka 0.39 hands librdkafka the remaining wait truncated to
/// whole milliseconds and loops until its deadline, so the last fraction of every blocking poll
/// is a busy spin. With a full queue that spin took half of the producer thread's CPU, from the
/// broker and librdkafka's own threads on a 2-core machine. `poll(0)` serves one event (one
/// partition's batch), so it repeats while it frees messages: with 1,000 partitions a response
/// brings 1,000 events. 200 µs is far below the time the 32 MiB buffer takes to drain.
fn wait_for_queue_room(producer: &BaseProducer<ProducerCtx>) {
    let mut waiting = producer.in_flight_count();
    loop {
        producer.poll(Duration::ZERO);
        let now = producer.in_flight_count();
        if now >= waiting {
            break;
        }
        waiting = now;
    }
    std::thread::sleep(Duration::from_micros(200));
}

fn consumer_thread(spec: &PhaseSpec, shared: Arc<Shared>, warmup_ns: u64) -> anyhow::Result<ConsumerStats> {
    let setup = (|| -> anyhow::Result<BaseConsumer<ConsumerCtx>> {
        let group = format!("{}-reader", spec.topic);
        let consumer: BaseConsumer<ConsumerCtx> = kafka::consumer_config(&spec.bootstrap, &group, &spec.client_config)
            .create_with_context(ConsumerCtx { shared: shared.clone() })
            .context("cannot create a librdkafka consumer")?;
        consumer
            .client()
            .fetch_metadata(Some(&spec.topic), Duration::from_secs(10))
            .with_context(|| format!("no metadata for topic {}", spec.topic))?;
        // A concurrent reader starts fetching before the clock (the topic is empty); a drain
        // only once the clock runs, so that no part of the backlog is read ahead untimed.
        if spec.consumer == ConsumerMode::Concurrent {
            assign_all(spec, &consumer)?;
        }
        Ok(consumer)
    })();
    shared.ready_and_wait();
    let consumer = match setup.and_then(|consumer| {
        if spec.consumer != ConsumerMode::Concurrent {
            assign_all(spec, &consumer)?;
        }
        Ok(consumer)
    }) {
        Ok(consumer) => consumer,
        Err(e) => {
            shared.fail(format!("{e:#}"));
            return Err(e);
        }
    };
    let record_latency = spec.consumer == ConsumerMode::Concurrent;
    let stall_ns = u64::try_from(spec.stall_timeout.as_nanos()).unwrap_or(u64::MAX);
    let mut stats = ConsumerStats { consumed: Flow::new(warmup_ns), ..ConsumerStats::default() };
    let mut last_progress_ns = 0u64;
    loop {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => {
                let now = shared.now_ns();
                let value = message.payload().unwrap_or_default();
                let bytes = value.len() as u64;
                let send_ns = payload::read_header(value).map(|(send_ns, _)| send_ns);
                let latency_ns = send_ns.filter(|_| record_latency).map(|sent| now.saturating_sub(sent));
                stats.received += 1;
                stats.consumed.record(now, bytes);
                stats.series.record_consumed(now, bytes, latency_ns);
                if let (Some(latency), Some(sent)) = (latency_ns, send_ns) {
                    if sent >= warmup_ns {
                        stats.e2e.record_ns(latency);
                    }
                }
                shared.received_msgs.fetch_add(1, Ordering::Relaxed);
                shared.received_bytes.fetch_add(bytes, Ordering::Relaxed);
                last_progress_ns = now;
            }
            Some(Err(e)) => {
                stats.errors += 1;
                shared.note(format!("consume: {e}"));
            }
            None => {}
        }
        if shared.aborted() {
            break;
        }
        // Finished producers have added their acknowledged counts before leaving the count.
        if shared.producers_running.load(Ordering::SeqCst) == 0
            && stats.received >= shared.acked_final.load(Ordering::SeqCst)
        {
            stats.complete = true;
            break;
        }
        let now = shared.now_ns();
        let due =
            stats.received < shared.acked_msgs.load(Ordering::Relaxed).max(shared.acked_final.load(Ordering::Relaxed));
        if due && now.saturating_sub(last_progress_ns) > stall_ns {
            shared.problem(format!(
                "the consumer received nothing for {:?} with messages due ({} of {} received)",
                spec.stall_timeout,
                stats.received,
                shared.acked_msgs.load(Ordering::Relaxed).max(shared.acked_final.load(Ordering::Relaxed))
            ));
            shared.abort.store(true, Ordering::SeqCst);
            break;
        }
        if !due {
            // Nothing is owed yet (the producers have not been acknowledged): not a stall.
            last_progress_ns = now;
        }
    }
    Ok(stats)
}

/// Assigns every partition of the topic from its first offset.
fn assign_all(spec: &PhaseSpec, consumer: &BaseConsumer<ConsumerCtx>) -> anyhow::Result<()> {
    let mut assignment = TopicPartitionList::new();
    for partition in 0..spec.partitions {
        let partition = i32::try_from(partition).context("too many partitions")?;
        assignment.add_partition_offset(&spec.topic, partition, Offset::Beginning)?;
    }
    consumer.assign(&assignment).context("cannot assign the partitions")
}

fn push_bounded(list: &Mutex<Vec<String>>, text: String) {
    if let Ok(mut list) = list.lock() {
        if list.len() < PROBLEMS_MAX && !list.contains(&text) {
            list.push(text);
        }
    }
}
