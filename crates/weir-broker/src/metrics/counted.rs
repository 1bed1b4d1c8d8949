//! What is counted as it happens (see the parent module's doc): counters, gauges and latency
//! histograms that the request paths update with relaxed atomics. Nothing here reads the
//! broker: the partitions and the front-ends hold these, and the exposition reads them.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use weir_storage::histogram::Histogram;
use weir_storage::sync::{lock, read, write};

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
    pub(super) unknown_operation: Counter,
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
    pub(super) fn named(&self) -> impl Iterator<Item = (&str, &OperationMetrics)> {
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
    /// Incremental fetch sessions (Kafka's KIP-227) held for the protocol's clients.
    pub fetch_sessions: Gauge,
    /// TLS handshakes that failed or timed out.
    pub tls_handshake_failures: Counter,
    /// SASL authentications that succeeded, and that failed (a wrong password, a malformed or
    /// truncated exchange, too many failures from one address).
    pub authentications: Counter,
    pub authentication_failures: Counter,
}

/// Traffic counters of one partition, kept on the [`Partition`] itself so that the produce
/// and fetch paths, which have already resolved it, count without a lookup.
#[derive(Debug, Default)]
pub struct PartitionMetrics {
    /// Bytes of record batches appended by producers (as stored).
    pub bytes_in: Counter,
    /// Records appended by producers (the batches' record counts).
    pub(crate) messages_in: Counter,
    /// Bytes of record batches put into Fetch responses.
    pub bytes_out: Counter,
    /// The traffic's rates over the last sampling window (see [`PartitionLoad`]).
    load: Mutex<LoadSample>,
}

/// A partition's traffic in bytes per second, over the last window the broker's load sampler
/// closed (`Broker::sample_partition_loads`); zero until it closed two.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct PartitionLoad {
    pub bytes_in_per_sec: f64,
    pub bytes_out_per_sec: f64,
}

#[derive(Debug)]
struct LoadSample {
    /// When the window now open began, and the counters then.
    since: Option<(std::time::Instant, u64, u64)>,
    last: PartitionLoad,
}

impl Default for LoadSample {
    /// The first window opens with the partition (its counters start at zero).
    fn default() -> LoadSample {
        LoadSample { since: Some((std::time::Instant::now(), 0, 0)), last: PartitionLoad::default() }
    }
}

impl PartitionMetrics {
    /// Closes the current window at `now` and opens the next.
    pub(crate) fn sample_load(&self, now: std::time::Instant) {
        let (bytes_in, bytes_out) = (self.bytes_in.get(), self.bytes_out.get());
        let mut sample = lock(&self.load);
        if let Some((since, was_in, was_out)) = sample.since {
            let seconds = now.saturating_duration_since(since).as_secs_f64();
            if seconds > 0.0 {
                sample.last = PartitionLoad {
                    bytes_in_per_sec: bytes_in.saturating_sub(was_in) as f64 / seconds,
                    bytes_out_per_sec: bytes_out.saturating_sub(was_out) as f64 / seconds,
                };
            }
        }
        sample.since = Some((now, bytes_in, bytes_out));
    }

    /// The rates of the last closed window.
    pub fn load(&self) -> PartitionLoad {
        lock(&self.load).last
    }
}

/// The broker's metrics counted as they happen (see the module doc): one [`ProtocolMetrics`]
/// per front-end, registered by the front-end when it starts.
#[derive(Debug, Default)]
pub struct BrokerMetrics {
    protocols: RwLock<Vec<Arc<ProtocolMetrics>>>,
    /// Operations the authorizer refused (`Broker::authorize`), on any front-end.
    pub authorization_denials: std::sync::atomic::AtomicU64,
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
