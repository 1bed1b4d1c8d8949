//! Prometheus metrics of the broker: what is counted on the hot paths, and the text exposition
//! (`GET /metrics` of the admin API) that adds what is computed at scrape time.
//!
//! Two kinds of numbers, and why:
//! - **Counted as it happens**, with relaxed atomics on structures that already exist on the
//!   request path: per-operation request latency histograms in a fixed array per protocol,
//!   indexed by the front-end's operation number ([`ProtocolMetrics`]), byte and record counters
//!   on each [`Partition`] the request already resolved ([`PartitionMetrics`]), connection and
//!   in-flight gauges ([`ConnectionMetrics`]).
//!   A request costs two clock reads and about four relaxed atomic adds; nothing allocates,
//!   looks up a label set or takes a lock, except a per-operation mutex taken only when a response
//!   carries an error code. Measured (release, loaded 2-core VM): ~45 ns per request on top of
//!   the two clock reads (~55 ns), ~120 ns more while two cores update the same API's
//!   histogram at once (the cache line moves between them). A produce request costs tens of
//!   microseconds, so this stays well under 1%; sharding the histograms per core is the next
//!   step if it ever shows in a profile.
//! - **Computed at scrape time** from the state the broker keeps anyway: offsets, sizes and
//!   segment counts of every partition, fsync counts and time (the storage engine's
//!   [`weir_storage::LogStats`]), consumer-group lag, and the process's CPU, memory and file
//!   descriptors from `/proc/self`. A scrape walks every partition and group once.
//!
//! Per-topic counters are per-partition atomics summed at scrape time: a topic deleted and
//! created again starts from zero, which Prometheus' `rate()` reads as a counter reset.
//!
//! The exposition is Prometheus' text format 0.0.4 ([`CONTENT_TYPE`]); [`text::parse`] checks
//! it (every sample belongs to a family with a TYPE, labels escaped, histograms consistent).
//! `docs/metrics.md` lists every metric.

pub mod process;
pub mod text;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use crate::partition::Partition;
use crate::Broker;
pub use text::{Exposition, Kind};
use weir_storage::sync::{lock, read, write};

/// The `Content-Type` of [`render_prometheus`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub use weir_storage::histogram::{Histogram, LATENCY_BUCKETS_NANOS};

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }

    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn inc(&self) {
        self.add(1);
    }

    pub fn dec(&self) {
        self.add(-1);
    }

    pub fn add(&self, n: i64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// One operation's request metrics (a Kafka API, a gRPC method). Aligned to a cache line so that
/// neighbours in the slot array (Kafka's Produce and Fetch, the two busiest APIs) do not share one.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct OperationMetrics {
    /// Set once, on the first use of the slot.
    name: OnceLock<String>,
    latency: Histogram,
    /// Requests that got no response because the connection was closed over them.
    failed: Counter,
    /// Error codes of the protocol sent in responses: (code, count). Few distinct codes per
    /// operation, so a short vector; the lock is taken only when a response carries an error.
    errors: Mutex<Vec<(i32, u64)>>,
}

impl OperationMetrics {
    /// A request handled (answered, or closed over: then also [`OperationMetrics::count_failure`]).
    pub fn observe(&self, elapsed: Duration) {
        self.latency.observe(elapsed);
    }

    pub fn count_failure(&self) {
        self.failed.inc();
    }

    /// Counts the error codes a response carries (0, "no error", is skipped), as Kafka's
    /// `ErrorsPerSec` does: one per topic, partition or group entry that has the code.
    pub fn count_errors(&self, codes: impl IntoIterator<Item = i32>) {
        let mut counter = self.error_counter();
        for code in codes {
            counter.count(code);
        }
    }

    /// A counter for the error codes of one response, for callers that visit them rather than
    /// iterate: it locks on the first non-zero code and unlocks when dropped. Do not hold it
    /// across an `.await`.
    pub fn error_counter(&self) -> ErrorCounter<'_> {
        ErrorCounter { operation: self, errors: None }
    }

    pub fn name(&self) -> Option<&str> {
        self.name.get().map(String::as_str)
    }

    pub fn latency(&self) -> &Histogram {
        &self.latency
    }

    pub fn failures(&self) -> u64 {
        self.failed.get()
    }

    /// (error code, count), by code.
    pub fn errors(&self) -> Vec<(i32, u64)> {
        let mut errors = lock(&self.errors).clone();
        errors.sort_unstable();
        errors
    }
}

/// See [`OperationMetrics::error_counter`].
pub struct ErrorCounter<'a> {
    operation: &'a OperationMetrics,
    errors: Option<std::sync::MutexGuard<'a, Vec<(i32, u64)>>>,
}

impl ErrorCounter<'_> {
    /// Counts `code`, unless it is 0 ("no error").
    pub fn count(&mut self, code: impl Into<i32>) {
        let code = code.into();
        if code == 0 {
            return;
        }
        let errors = self.errors.get_or_insert_with(|| lock(&self.operation.errors));
        match errors.iter_mut().find(|(c, _)| *c == code) {
            Some((_, n)) => *n += 1,
            None => errors.push((code, 1)),
        }
    }
}

/// The request and connection metrics of one protocol front-end. Its operations sit in a fixed
/// array indexed by the front-end's own operation number (Kafka: the API key), so a request finds
/// its slot without hashing or locking. Rendered with the labels `protocol` and `api`.
#[derive(Debug)]
pub struct ProtocolMetrics {
    /// `kafka`, `rocketmq`, `http`: the `protocol` label.
    protocol: &'static str,
    operations: Box<[OperationMetrics]>,
    /// Requests for an operation the front-end does not know (or beyond its slots).
    unknown_operation: Counter,
    /// The protocol's name of one of its error codes (Kafka: `UNKNOWN_TOPIC_OR_PARTITION`), for
    /// the `error` label.
    error_name: fn(i32) -> String,
    pub connections: ConnectionMetrics,
}

impl ProtocolMetrics {
    pub fn new(protocol: &'static str, operation_slots: usize, error_name: fn(i32) -> String) -> ProtocolMetrics {
        ProtocolMetrics {
            protocol,
            operations: (0..operation_slots).map(|_| OperationMetrics::default()).collect(),
            unknown_operation: Counter::default(),
            error_name,
            connections: ConnectionMetrics::default(),
        }
    }

    pub fn protocol(&self) -> &'static str {
        self.protocol
    }

    /// The slot of operation `index`, named with `name()` the first time (later calls do not
    /// call it). `None` for an index outside the slots.
    pub fn operation(&self, index: i32, name: impl FnOnce() -> String) -> Option<&OperationMetrics> {
        let slot = self.operations.get(usize::try_from(index).ok()?)?;
        slot.name.get_or_init(name);
        Some(slot)
    }

    /// A request for an operation this front-end does not know; its connection was closed.
    pub fn count_unknown_operation(&self) {
        self.unknown_operation.inc();
    }

    pub fn error_name(&self, code: i32) -> String {
        (self.error_name)(code)
    }

    /// The named slots, by operation number.
    fn named(&self) -> impl Iterator<Item = (&str, &OperationMetrics)> {
        self.operations.iter().filter_map(|slot| slot.name().map(|name| (name, slot)))
    }
}

/// Connection gauges and counters of one front-end's listener.
#[derive(Debug, Default)]
pub struct ConnectionMetrics {
    pub open: Gauge,
    pub accepted: Counter,
    /// Closed at once because the listener's connection limit was reached.
    pub refused: Counter,
    /// Requests read and not yet answered, over all connections.
    pub requests_in_flight: Gauge,
}

/// Traffic counters of one partition, kept on the [`Partition`] itself so that the produce
/// and fetch paths, which have already resolved it, count without a lookup.
#[derive(Debug, Default)]
pub struct PartitionMetrics {
    /// Bytes of record batches appended by producers (as stored).
    pub bytes_in: Counter,
    /// Records appended by producers (the batches' record counts).
    pub messages_in: Counter,
    /// Bytes of record batches put into Fetch responses.
    pub bytes_out: Counter,
}

/// The broker's metrics counted as they happen (see the module doc): one [`ProtocolMetrics`]
/// per front-end, registered by the front-end when it starts.
#[derive(Debug, Default)]
pub struct BrokerMetrics {
    protocols: RwLock<Vec<Arc<ProtocolMetrics>>>,
}

impl BrokerMetrics {
    /// The metrics of front-end `protocol`, created by the first call (later calls return the
    /// same, whatever their other arguments): one registration per front-end, so each adds its
    /// own rows instead of sharing another protocol's slots.
    pub fn register_protocol(
        &self,
        protocol: &'static str,
        operation_slots: usize,
        error_name: fn(i32) -> String,
    ) -> Arc<ProtocolMetrics> {
        let mut protocols = write(&self.protocols);
        if let Some(existing) = protocols.iter().find(|p| p.protocol == protocol) {
            return existing.clone();
        }
        let metrics = Arc::new(ProtocolMetrics::new(protocol, operation_slots, error_name));
        protocols.push(metrics.clone());
        protocols.sort_by_key(|p| p.protocol);
        metrics
    }

    /// Every registered front-end, by protocol name.
    pub fn protocols(&self) -> Vec<Arc<ProtocolMetrics>> {
        read(&self.protocols).clone()
    }
}

/// What a layer above the data path adds to the exposition (the coordinators' groups, ...), so
/// that `/metrics` shows every layer while this crate knows none of them.
pub trait MetricsSection {
    /// Adds this section's families; `partitions` are the broker's, read once per scrape.
    fn render(&self, out: &mut Exposition, partitions: &[Arc<Partition>]);
}

/// The Prometheus text exposition of every metric: the data path's, then each of `sections`.
pub fn render_prometheus(broker: &Broker, sections: &[&dyn MetricsSection]) -> String {
    let partitions = broker.partitions();
    let mut out = Exposition::with_capacity(16 * 1024 + partitions.len() * 1024);

    out.family("weir_build_info", Kind::Gauge, "Always 1; the version label says which Weir is running.");
    out.sample("weir_build_info", &[("version", &env!("CARGO_PKG_VERSION"))], 1u64);

    let protocols = broker.metrics.protocols();
    render_requests(&mut out, &protocols);
    render_connections(&mut out, &protocols);
    render_topics(&mut out, broker, &partitions);
    render_partitions(&mut out, &partitions);
    for section in sections {
        section.render(&mut out, &partitions);
    }
    render_messaging(&mut out, broker);
    process::render(&mut out, &process::ProcessStats::read());
    out.finish()
}

/// The timer store of delayed messages and the open transactions (half messages).
fn render_messaging(out: &mut Exposition, broker: &Broker) {
    use std::sync::atomic::Ordering::Relaxed;
    let (pending, in_memory) = broker.timer.pending();
    let stats = &broker.timer.stats;
    let gauges: [(&str, Kind, &str, u64); 8] = [
        ("weir_timer_messages_pending", Kind::Gauge, "Delayed messages waiting in the timer store.", pending),
        (
            "weir_timer_messages_in_memory",
            Kind::Gauge,
            "Delayed messages of the timer wheel's near slots, held in memory.",
            in_memory as u64,
        ),
        (
            "weir_timer_messages_scheduled_total",
            Kind::Counter,
            "Delayed messages taken by the timer store since start.",
            stats.scheduled.load(Relaxed),
        ),
        (
            "weir_timer_messages_fired_total",
            Kind::Counter,
            "Delayed messages appended to their topics since start.",
            stats.fired.load(Relaxed),
        ),
        (
            "weir_timer_messages_dropped_total",
            Kind::Counter,
            "Delayed messages dropped when due because their topic was deleted.",
            stats.dropped.load(Relaxed),
        ),
        (
            "weir_timer_messages_recalled_total",
            Kind::Counter,
            "Delayed messages recalled before they came due (RocketMQ RecallMessage).",
            stats.recalled.load(Relaxed),
        ),
        (
            "weir_timer_lateness_max_milliseconds",
            Kind::Gauge,
            "The largest lateness of a fired delayed message since start (firing time less due time).",
            stats.lateness_ms_max.load(Relaxed).max(0) as u64,
        ),
        (
            "weir_transactions_open",
            Kind::Gauge,
            "RocketMQ transactional (half) messages neither committed nor rolled back.",
            broker.half.pending_count() as u64,
        ),
    ];
    for (name, kind, help, value) in gauges {
        out.family(name, kind, help);
        out.sample(name, &[], value);
    }
}

fn render_requests(out: &mut Exposition, protocols: &[Arc<ProtocolMetrics>]) {
    out.family("weir_requests_total", Kind::Counter, "Requests handled, by protocol and API.");
    for p in protocols {
        for (api, slot) in p.named() {
            out.sample("weir_requests_total", &[("protocol", &p.protocol), ("api", &api)], slot.latency.count());
        }
    }

    out.family(
        "weir_request_duration_seconds",
        Kind::Histogram,
        "Time to handle a request, from its turn on its connection to its encoded response (queueing behind \
         earlier requests and the write excluded), by protocol and API. Kafka's Fetch includes its long-poll wait.",
    );
    for p in protocols {
        for (api, slot) in p.named() {
            let labels: [(&str, &dyn std::fmt::Display); 2] = [("protocol", &p.protocol), ("api", &api)];
            out.histogram("weir_request_duration_seconds", &labels, &LATENCY_BUCKETS_NANOS, &slot.latency);
        }
    }

    out.family(
        "weir_request_errors_total",
        Kind::Counter,
        "Error codes sent in responses, by protocol, API and the protocol's error name: one per topic, partition \
         or group entry carrying it.",
    );
    for p in protocols {
        for (api, slot) in p.named() {
            for (code, count) in slot.errors() {
                let error = p.error_name(code);
                let labels: [(&str, &dyn std::fmt::Display); 3] =
                    [("protocol", &p.protocol), ("api", &api), ("error", &error)];
                out.sample("weir_request_errors_total", &labels, count);
            }
        }
    }

    out.family(
        "weir_requests_failed_total",
        Kind::Counter,
        "Requests answered by closing the connection (unknown API or version, undecodable request), by protocol \
         and API.",
    );
    for p in protocols {
        for (api, slot) in p.named() {
            out.sample("weir_requests_failed_total", &[("protocol", &p.protocol), ("api", &api)], slot.failures());
        }
        out.sample(
            "weir_requests_failed_total",
            &[("protocol", &p.protocol), ("api", &"unknown")],
            p.unknown_operation.get(),
        );
    }
}

fn render_connections(out: &mut Exposition, protocols: &[Arc<ProtocolMetrics>]) {
    type Read = fn(&ConnectionMetrics) -> i64;
    let families: [(&'static str, Kind, &str, Read); 4] = [
        ("weir_connections_open", Kind::Gauge, "Open client connections, by protocol.", |c| c.open.get()),
        ("weir_connections_accepted_total", Kind::Counter, "Client connections accepted, by protocol.", |c| {
            c.accepted.get() as i64
        }),
        (
            "weir_connections_refused_total",
            Kind::Counter,
            "Client connections closed at once because the listener's connection limit was reached, by protocol.",
            |c| c.refused.get() as i64,
        ),
        (
            "weir_requests_in_flight",
            Kind::Gauge,
            "Requests read from their connections and not yet answered (queued, being handled or being written), \
             by protocol.",
            |c| c.requests_in_flight.get(),
        ),
    ];
    for (name, kind, help, read) in families {
        out.family(name, kind, help);
        for p in protocols {
            out.sample(name, &[("protocol", &p.protocol)], read(&p.connections));
        }
    }
}

fn render_topics(out: &mut Exposition, broker: &Broker, partitions: &[Arc<Partition>]) {
    let state = broker.metadata();
    out.family("weir_topics", Kind::Gauge, "Topics, internal ones included.");
    out.sample("weir_topics", &[], state.topics.len() as u64);
    out.family("weir_partitions", Kind::Gauge, "Partitions hosted by this broker, internal topics included.");
    out.sample("weir_partitions", &[], partitions.len() as u64);
    // What an operator of a replicated cluster watches (Kafka's LeaderCount,
    // UnderReplicatedPartitions and UnderMinIsrPartitionCount), over the partitions led here.
    let led: Vec<_> =
        partitions.iter().map(|p| (p, p.state())).filter(|(_, state)| state.leader == broker.config.node_id).collect();
    let under_replicated = led.iter().filter(|(_, s)| s.isr.len() < s.replicas.len()).count();
    let under_min_isr = led.iter().filter(|(p, s)| (s.isr.len() as i64) < p.min_insync_replicas()).count();
    let replication = [
        ("weir_leader_partitions", "Partitions this broker leads.", led.len()),
        (
            "weir_under_replicated_partitions",
            "Partitions led here with fewer in-sync replicas than replicas.",
            under_replicated,
        ),
        (
            "weir_under_min_isr_partitions",
            "Partitions led here whose ISR is below min.insync.replicas: acks=all writes to them are refused.",
            under_min_isr,
        ),
    ];
    for (name, help, value) in replication {
        out.family(name, Kind::Gauge, help);
        out.sample(name, &[], value as u64);
    }

    // Per-topic sums of the per-partition counters; `partitions` is sorted by topic.
    let mut topics: Vec<(&str, [u64; 3])> = Vec::new();
    for p in partitions {
        let counts = [p.metrics.bytes_in.get(), p.metrics.messages_in.get(), p.metrics.bytes_out.get()];
        match topics.last_mut() {
            Some((topic, sums)) if *topic == p.topic => {
                for (sum, n) in sums.iter_mut().zip(counts) {
                    *sum += n;
                }
            }
            _ => topics.push((&p.topic, counts)),
        }
    }
    let families = [
        ("weir_topic_bytes_in_total", "Bytes of record batches appended by producers, by topic."),
        ("weir_topic_messages_in_total", "Records appended by producers, by topic."),
        ("weir_topic_bytes_out_total", "Bytes of record batches sent in Fetch responses, by topic."),
    ];
    for (i, (name, help)) in families.into_iter().enumerate() {
        out.family(name, Kind::Counter, help);
        for (topic, sums) in &topics {
            out.sample(name, &[("topic", topic)], sums[i]);
        }
    }
}

fn render_partitions(out: &mut Exposition, partitions: &[Arc<Partition>]) {
    type Read = fn(&Partition) -> u64;
    let gauges: [(&str, &str, Read); 5] = [
        ("weir_partition_log_start_offset", "First offset still in the log.", |p| {
            p.log.log_start_offset().max(0) as u64
        }),
        ("weir_partition_log_end_offset", "Offset the next appended record will get.", |p| {
            p.log.log_end_offset().max(0) as u64
        }),
        (
            "weir_partition_high_watermark",
            "End of what consumers can read (below the log end while flush.policy=sync waits for fsync).",
            |p| p.log.high_watermark().max(0) as u64,
        ),
        ("weir_partition_size_bytes", "Bytes of the partition's segment files.", |p| p.log.size_bytes()),
        ("weir_partition_segments", "Segments of the partition's log.", |p| p.log.segment_count() as u64),
    ];
    for (name, help, read) in gauges {
        out.family(name, Kind::Gauge, help);
        for p in partitions {
            out.sample(name, &[("topic", &p.topic), ("partition", &p.index)], read(p));
        }
    }

    out.family(
        "weir_partition_fsync_seconds",
        Kind::Summary,
        "fdatasync calls on the partition's segment files (_count) and the time spent in them (_sum); \
         one flush of several segments counts each segment.",
    );
    for p in partitions {
        let labels: [(&str, &dyn std::fmt::Display); 2] = [("topic", &p.topic), ("partition", &p.index)];
        let stats = &p.log.stats;
        let nanos = stats.fsync_nanos.load(Ordering::Relaxed);
        out.sample_suffixed("weir_partition_fsync_seconds", "_sum", &labels, nanos as f64 / 1e9);
        out.sample_suffixed("weir_partition_fsync_seconds", "_count", &labels, stats.fsyncs.load(Ordering::Relaxed));
    }

    // One distribution for the whole broker: per-partition buckets would be 20 series each.
    let fsyncs = Histogram::default();
    for p in partitions {
        fsyncs.add(&p.log.stats.fsync_latency);
    }
    out.family(
        "weir_fsync_duration_seconds",
        Kind::Histogram,
        "Time of each flush of a partition's segment files to disk (the fdatasyncs of one group commit), over \
         every partition.",
    );
    out.histogram("weir_fsync_duration_seconds", &[], &LATENCY_BUCKETS_NANOS, &fsyncs);
}

#[cfg(test)]
mod tests;
