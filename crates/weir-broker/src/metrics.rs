//! Prometheus metrics of the broker: what is counted on the hot paths, and the text exposition
//! (`GET /metrics` of the admin API) that adds what is computed at scrape time.
//!
//! Two kinds of numbers, and why:
//! - **Counted as it happens**, with relaxed atomics on structures that already exist on the
//!   request path: per-API request latency histograms in a fixed array indexed by the API key
//!   ([`RequestMetrics`]), byte and record counters on each [`Partition`] the request already
//!   resolved ([`PartitionMetrics`]), connection and in-flight gauges ([`ConnectionMetrics`]).
//!   A request costs two clock reads and about four relaxed atomic adds; nothing allocates,
//!   looks up a label set or takes a lock, except a per-API mutex taken only when a response
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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::group::{GroupCoordinator, GroupState};
use crate::partition::Partition;
use crate::Broker;
use text::{Exposition, Kind};

/// The `Content-Type` of [`render_prometheus`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Slots of [`RequestMetrics`], indexed by API key. Kafka's keys are below 100 today; a key at
/// or above this is counted as an unknown API.
pub const API_SLOTS: usize = 128;

/// Upper bounds of the request latency buckets, in nanoseconds: 100 µs to 60 s. The low end
/// resolves a page-cache produce or an in-memory metadata answer; the high end covers long-poll
/// fetches (`max_wait_ms`, 500 ms by default in clients) and JoinGroup, which waits up to the
/// rebalance timeout.
pub const LATENCY_BUCKETS_NANOS: [u64; 18] = [
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
    60_000_000_000,
];

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

/// A latency histogram with the fixed buckets of [`LATENCY_BUCKETS_NANOS`]. Each observation
/// adds to one bucket (not cumulative: the exposition sums them) and to the sum, so it costs
/// two atomic adds; the count is the sum of the buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    /// `buckets[i]` counts observations in `(bound[i-1], bound[i]]`; the last one is +Inf.
    buckets: [AtomicU64; LATENCY_BUCKETS_NANOS.len() + 1],
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        // The first bucket whose upper bound is >= nanos (Prometheus' `le` is inclusive).
        let index = LATENCY_BUCKETS_NANOS.partition_point(|bound| *bound < nanos);
        self.buckets[index].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Observations per bucket (not cumulative), the +Inf bucket last.
    pub fn bucket_counts(&self) -> [u64; LATENCY_BUCKETS_NANOS.len() + 1] {
        std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed))
    }

    pub fn count(&self) -> u64 {
        self.bucket_counts().iter().sum()
    }

    pub fn sum_seconds(&self) -> f64 {
        self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9
    }
}

/// One API's request metrics. Aligned to a cache line so that Produce and Fetch, neighbours in
/// the slot array and the two busiest APIs, do not share one.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct ApiMetrics {
    /// Set once, on the first use of the slot (or when the front-end registers its APIs).
    name: OnceLock<String>,
    latency: Histogram,
    /// Requests that got no response because the connection was closed over them.
    failed: Counter,
    /// Error codes sent in responses: (code, count). Few distinct codes per API, so a short
    /// vector; the lock is taken only when a response carries an error.
    errors: Mutex<Vec<(i16, u64)>>,
}

impl ApiMetrics {
    /// A request handled (answered, or closed over: then also [`ApiMetrics::count_failure`]).
    pub fn observe(&self, elapsed: Duration) {
        self.latency.observe(elapsed);
    }

    pub fn count_failure(&self) {
        self.failed.inc();
    }

    /// Counts the error codes a response carries (0, "no error", is skipped), as Kafka's
    /// `ErrorsPerSec` does: one per topic, partition or group entry that has the code.
    pub fn count_errors(&self, codes: impl IntoIterator<Item = i16>) {
        let mut counter = self.error_counter();
        for code in codes {
            counter.count(code);
        }
    }

    /// A counter for the error codes of one response, for callers that visit them rather than
    /// iterate: it locks on the first non-zero code and unlocks when dropped. Do not hold it
    /// across an `.await`.
    pub fn error_counter(&self) -> ErrorCounter<'_> {
        ErrorCounter { api: self, errors: None }
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
    pub fn errors(&self) -> Vec<(i16, u64)> {
        let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner()).clone();
        errors.sort_unstable();
        errors
    }
}

/// See [`ApiMetrics::error_counter`].
pub struct ErrorCounter<'a> {
    api: &'a ApiMetrics,
    errors: Option<std::sync::MutexGuard<'a, Vec<(i16, u64)>>>,
}

impl ErrorCounter<'_> {
    /// Counts `code`, unless it is 0 ("no error").
    pub fn count(&mut self, code: i16) {
        if code == 0 {
            return;
        }
        let errors = self.errors.get_or_insert_with(|| self.api.errors.lock().unwrap_or_else(|p| p.into_inner()));
        match errors.iter_mut().find(|(c, _)| *c == code) {
            Some((_, n)) => *n += 1,
            None => errors.push((code, 1)),
        }
    }
}

/// Per-API request metrics of a protocol front-end, in a fixed array indexed by API key, so a
/// request finds its slot without hashing or locking.
#[derive(Debug)]
pub struct RequestMetrics {
    apis: Box<[ApiMetrics]>,
    /// Requests whose API key is unknown (or beyond [`API_SLOTS`]); the connection was closed.
    unknown_api: Counter,
}

impl Default for RequestMetrics {
    fn default() -> Self {
        RequestMetrics {
            apis: (0..API_SLOTS).map(|_| ApiMetrics::default()).collect(),
            unknown_api: Counter::default(),
        }
    }
}

impl RequestMetrics {
    /// The slot of API `key`, named with `name()` the first time (later calls do not call it).
    /// `None` for a key outside the slots.
    pub fn api(&self, key: i16, name: impl FnOnce() -> String) -> Option<&ApiMetrics> {
        let slot = self.apis.get(usize::try_from(key).ok()?)?;
        slot.name.get_or_init(name);
        Some(slot)
    }

    /// A request with an API key this broker does not know; its connection was closed.
    pub fn count_unknown_api(&self) {
        self.unknown_api.inc();
    }

    /// The named slots, by API key.
    fn named(&self) -> impl Iterator<Item = (&str, &ApiMetrics)> {
        self.apis.iter().filter_map(|slot| slot.name().map(|name| (name, slot)))
    }
}

/// Connection gauges and counters of the Kafka listener.
#[derive(Debug, Default)]
pub struct ConnectionMetrics {
    pub open: Gauge,
    pub accepted: Counter,
    /// Closed at once because `max.connections` were open.
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

/// The broker's metrics counted as they happen (see the module doc).
#[derive(Debug, Default)]
pub struct BrokerMetrics {
    /// Kafka API requests.
    pub requests: RequestMetrics,
    pub connections: ConnectionMetrics,
}

/// The Prometheus text exposition of every metric.
pub fn render_prometheus(broker: &Broker, groups: &GroupCoordinator) -> String {
    let partitions = broker.partitions();
    let mut out = Exposition::with_capacity(16 * 1024 + partitions.len() * 1024);

    out.family("weir_build_info", Kind::Gauge, "Always 1; the version label says which Weir is running.");
    out.sample("weir_build_info", &[("version", &env!("CARGO_PKG_VERSION"))], 1u64);

    render_requests(&mut out, &broker.metrics.requests);
    render_connections(&mut out, &broker.metrics.connections);
    render_topics(&mut out, broker, &partitions);
    render_partitions(&mut out, &partitions);
    render_groups(&mut out, &groups.committed_offsets(), &partitions);
    process::render(&mut out, &process::ProcessStats::read());
    out.finish()
}

fn render_requests(out: &mut Exposition, requests: &RequestMetrics) {
    out.family("weir_requests_total", Kind::Counter, "Kafka API requests handled, by API.");
    for (api, slot) in requests.named() {
        out.sample("weir_requests_total", &[("api", &api)], slot.latency.count());
    }

    out.family(
        "weir_request_duration_seconds",
        Kind::Histogram,
        "Time to handle a request, from its turn on its connection to its encoded response (queueing behind \
         earlier requests and the write excluded), by API. Fetch includes its long-poll wait.",
    );
    for (api, slot) in requests.named() {
        out.histogram("weir_request_duration_seconds", &[("api", &api)], &LATENCY_BUCKETS_NANOS, &slot.latency);
    }

    out.family(
        "weir_request_errors_total",
        Kind::Counter,
        "Error codes sent in responses, by API and Kafka error name: one per topic, partition or group entry carrying it.",
    );
    for (api, slot) in requests.named() {
        for (code, count) in slot.errors() {
            let error = error_name(code);
            out.sample("weir_request_errors_total", &[("api", &api), ("error", &error)], count);
        }
    }

    out.family(
        "weir_requests_failed_total",
        Kind::Counter,
        "Requests answered by closing the connection (unknown API or version, undecodable request), by API.",
    );
    for (api, slot) in requests.named() {
        out.sample("weir_requests_failed_total", &[("api", &api)], slot.failures());
    }
    out.sample("weir_requests_failed_total", &[("api", &"unknown")], requests.unknown_api.get());
}

fn render_connections(out: &mut Exposition, connections: &ConnectionMetrics) {
    out.family("weir_connections_open", Kind::Gauge, "Open Kafka client connections.");
    out.sample("weir_connections_open", &[], connections.open.get());
    out.family("weir_connections_accepted_total", Kind::Counter, "Kafka client connections accepted.");
    out.sample("weir_connections_accepted_total", &[], connections.accepted.get());
    out.family(
        "weir_connections_refused_total",
        Kind::Counter,
        "Kafka client connections closed at once because max.connections were open.",
    );
    out.sample("weir_connections_refused_total", &[], connections.refused.get());
    out.family(
        "weir_requests_in_flight",
        Kind::Gauge,
        "Requests read from their connections and not yet answered (queued, being handled or being written).",
    );
    out.sample("weir_requests_in_flight", &[], connections.requests_in_flight.get());
}

fn render_topics(out: &mut Exposition, broker: &Broker, partitions: &[Arc<Partition>]) {
    let state = broker.metadata();
    out.family("weir_topics", Kind::Gauge, "Topics, internal ones included.");
    out.sample("weir_topics", &[], state.topics.len() as u64);
    out.family("weir_partitions", Kind::Gauge, "Partitions hosted by this broker, internal topics included.");
    out.sample("weir_partitions", &[], partitions.len() as u64);

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
}

fn render_groups(out: &mut Exposition, groups: &[crate::group::GroupOffsets], partitions: &[Arc<Partition>]) {
    let mut states: BTreeMap<&str, u64> =
        [GroupState::Empty, GroupState::PreparingRebalance, GroupState::CompletingRebalance, GroupState::Stable]
            .into_iter()
            .map(|s| (s.as_str(), 0))
            .collect();
    for group in groups {
        *states.entry(group.state.as_str()).or_default() += 1;
    }
    out.family("weir_consumer_groups", Kind::Gauge, "Consumer groups, by state.");
    for (state, count) in &states {
        out.sample("weir_consumer_groups", &[("state", state)], *count);
    }

    let by_key: std::collections::HashMap<(&str, i32), &Partition> =
        partitions.iter().map(|p| ((p.topic.as_str(), p.index), &**p)).collect();
    out.family(
        "weir_consumer_group_committed_offset",
        Kind::Gauge,
        "The offset a group committed, by group, topic and partition.",
    );
    for group in groups {
        for (topic, partition, offset) in &group.offsets {
            let labels: [(&str, &dyn std::fmt::Display); 3] =
                [("group", &group.group_id), ("topic", topic), ("partition", partition)];
            out.sample("weir_consumer_group_committed_offset", &labels, *offset);
        }
    }
    out.family(
        "weir_consumer_group_lag_records",
        Kind::Gauge,
        "High watermark minus the committed offset (0 if the commit is ahead), by group, topic and partition; \
         absent for partitions that no longer exist.",
    );
    for group in groups {
        for (topic, partition, offset) in &group.offsets {
            let Some(p) = by_key.get(&(topic.as_str(), *partition)) else { continue };
            let lag = (p.log.high_watermark() - offset).max(0);
            let labels: [(&str, &dyn std::fmt::Display); 3] =
                [("group", &group.group_id), ("topic", topic), ("partition", partition)];
            out.sample("weir_consumer_group_lag_records", &labels, lag);
        }
    }
}

/// Kafka's name of an error code, as its documentation spells it: `UNKNOWN_TOPIC_OR_PARTITION`.
pub fn error_name(code: i16) -> String {
    match crate::ErrorCode::try_from_code(code) {
        None => "NONE".to_string(),
        Some(crate::ErrorCode::Unknown(code)) => format!("UNKNOWN_CODE_{code}"),
        Some(error) => {
            let camel = error.to_string();
            let mut snake = String::with_capacity(camel.len() + 8);
            for (i, c) in camel.chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    snake.push('_');
                }
                snake.push(c.to_ascii_uppercase());
            }
            snake
        }
    }
}

#[cfg(test)]
mod tests;
