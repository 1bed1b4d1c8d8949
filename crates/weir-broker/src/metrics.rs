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

pub mod counted;
pub mod process;
pub mod text;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::partition::Partition;
use crate::Broker;
pub use counted::{
    BrokerMetrics, ConnectionMetrics, Counter, ErrorCounter, Gauge, OperationMetrics, PartitionLoad, PartitionMetrics,
    ProtocolMetrics,
};
pub use text::{Exposition, Kind};

/// The `Content-Type` of [`render_prometheus`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub use weir_storage::histogram::{Histogram, LATENCY_BUCKETS_NANOS};

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
    render_tier(&mut out, broker, &partitions);
    render_memory(&mut out, broker);
    out.family(
        "weir_authorization_denials_total",
        Kind::Counter,
        "Operations the authorizer refused (authorizer.class.name), on every front-end: a request refused, or a topic or group left out of a listing.",
    );
    out.sample("weir_authorization_denials_total", &[], broker.metrics.authorization_denials.load(Ordering::Relaxed));
    render_quotas(&mut out, broker);
    for section in sections {
        section.render(&mut out, &partitions);
    }
    process::render(&mut out, &process::ProcessStats::read());
    out.finish()
}

/// Client quotas (`crate::quotas`): how often clients were throttled, and for how long.
fn render_quotas(out: &mut Exposition, broker: &Broker) {
    let totals: Vec<_> = crate::quotas::QuotaKind::ALL
        .iter()
        .map(|kind| (kind.name(), broker.client_quotas.throttle_totals(*kind)))
        .collect();
    out.family(
        "weir_client_quota_throttles_total",
        Kind::Counter,
        "Times a client went over a client quota (AlterClientQuotas) and was made to wait, by quota.",
    );
    for (quota, (count, _)) in &totals {
        out.sample("weir_client_quota_throttles_total", &[("quota", quota)], *count);
    }
    out.family(
        "weir_client_quota_throttle_seconds_total",
        Kind::Counter,
        "The waits of weir_client_quota_throttles_total added up, by quota.",
    );
    for (quota, (_, time)) in &totals {
        out.sample("weir_client_quota_throttle_seconds_total", &[("quota", quota)], time.as_secs_f64());
    }
}

fn render_requests(out: &mut Exposition, protocols: &[Arc<ProtocolMetrics>]) {
    out.family("weir_requests_total", Kind::Counter, "Requests handled, by protocol and API.");
    for p in protocols {
        for (api, slot) in p.named() {
            out.sample("weir_requests_total", &[("protocol", &p.protocol()), ("api", &api)], slot.latency().count());
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
            let labels: [(&str, &dyn std::fmt::Display); 2] = [("protocol", &p.protocol()), ("api", &api)];
            out.histogram("weir_request_duration_seconds", &labels, &LATENCY_BUCKETS_NANOS, slot.latency());
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
                    [("protocol", &p.protocol()), ("api", &api), ("error", &error)];
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
            out.sample("weir_requests_failed_total", &[("protocol", &p.protocol()), ("api", &api)], slot.failures());
        }
        out.sample(
            "weir_requests_failed_total",
            &[("protocol", &p.protocol()), ("api", &"unknown")],
            p.unknown_operation.get(),
        );
    }
}

fn render_connections(out: &mut Exposition, protocols: &[Arc<ProtocolMetrics>]) {
    type Read = fn(&ConnectionMetrics) -> i64;
    let families: [(&'static str, Kind, &str, Read); 8] = [
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
        (
            "weir_fetch_sessions",
            Kind::Gauge,
            "Incremental fetch sessions (KIP-227) in the session cache, by protocol.",
            |c| c.fetch_sessions.get(),
        ),
        (
            "weir_tls_handshake_failures_total",
            Kind::Counter,
            "TLS handshakes that failed or timed out, by protocol.",
            |c| c.tls_handshake_failures.get() as i64,
        ),
        (
            "weir_authentications_total",
            Kind::Counter,
            "SASL authentications that succeeded, by protocol.",
            |c| c.authentications.get() as i64,
        ),
        (
            "weir_authentication_failures_total",
            Kind::Counter,
            "SASL authentications that failed (wrong credentials, a malformed exchange, too many failures from one address), by protocol.",
            |c| c.authentication_failures.get() as i64,
        ),
    ];
    for (name, kind, help, read) in families {
        out.family(name, kind, help);
        for p in protocols {
            out.sample(name, &[("protocol", &p.protocol())], read(&p.connections));
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

/// Memory-first topics: the pool and the writer (`crate::memory`).
fn render_memory(out: &mut Exposition, broker: &Broker) {
    let memory = &broker.memory;
    let gauges: [(&str, &str, u64); 2] = [
        (
            "weir_memory_pending_bytes",
            "Bytes written to memory-first topics and not in the object store yet (at most memory.pool.bytes).",
            memory.pending_bytes(),
        ),
        (
            "weir_memory_wal_objects",
            "Write-ahead objects of memory-first topics in the object store.",
            memory.live_objects() as u64,
        ),
    ];
    for (name, help, value) in gauges {
        out.family(name, Kind::Gauge, help);
        out.sample(name, &[], value);
    }
    let counters: [(&str, &str, u64); 3] = [
        (
            "weir_memory_flushes_total",
            "Write-ahead objects the writer of memory-first topics put in the object store.",
            memory.flushes.load(Ordering::Relaxed),
        ),
        (
            "weir_memory_flushed_bytes_total",
            "Bytes of memory-first topics the writer put in the object store.",
            memory.flushed_bytes.load(Ordering::Relaxed),
        ),
        (
            "weir_memory_flush_failures_total",
            "Rounds of the writer of memory-first topics that failed (the store down or refusing); each is retried.",
            memory.failures.load(Ordering::Relaxed),
        ),
    ];
    for (name, help, value) in counters {
        out.family(name, Kind::Counter, help);
        out.sample(name, &[], value);
    }
}

/// Tiered storage: the broker's totals (zeros when it is off), and each tiered partition's upload
/// lag as its leader here sees it.
fn render_tier(out: &mut Exposition, broker: &Broker, partitions: &[Arc<Partition>]) {
    let total = broker.tier_totals().unwrap_or_default();
    let counters: [(&str, &str, u64); 6] = [
        (
            "weir_remote_log_uploaded_segments_total",
            "Segments uploaded to the object store.",
            total.uploaded_segments_total,
        ),
        (
            "weir_remote_log_uploaded_bytes_total",
            "Bytes of segments uploaded to the object store.",
            total.uploaded_bytes_total,
        ),
        (
            "weir_remote_log_deleted_segments_total",
            "Uploaded segments deleted from the object store by retention.",
            total.deleted_segments_total,
        ),
        (
            "weir_remote_log_upload_failures_total",
            "Passes of a partition that failed (the store down or refusing); each is retried.",
            total.failures_total,
        ),
        (
            "weir_remote_log_compacted_segments_total",
            "Segments of compacted topics that compaction rewrote in the object store.",
            total.compacted_segments_total,
        ),
        (
            "weir_remote_log_compacted_records_total",
            "Records of compacted topics that compaction removed from the object store.",
            total.compacted_records_total,
        ),
    ];
    for (name, help, value) in counters {
        out.family(name, Kind::Counter, help);
        out.sample(name, &[], value);
    }
    let cache = broker.tier_cache();
    let read = |counter: fn(&weir_tier::ChunkCache) -> &std::sync::atomic::AtomicU64| {
        cache.map_or(0, |c| counter(c).load(Ordering::Relaxed))
    };
    let reads: [(&str, &str, u64); 3] = [
        (
            "weir_remote_log_read_bytes_total",
            "Bytes read from the object store to serve fetches of offsets no longer on local disk.",
            read(|c| &c.fetched_bytes),
        ),
        (
            "weir_remote_log_cache_hits_total",
            "Reads from the object store's tier served by a chunk already in the local cache.",
            read(|c| &c.hits),
        ),
        (
            "weir_remote_log_cache_misses_total",
            "Reads from the object store's tier that fetched a chunk from the store.",
            read(|c| &c.misses),
        ),
    ];
    for (name, help, value) in reads {
        out.family(name, Kind::Counter, help);
        out.sample(name, &[], value);
    }
    out.family("weir_remote_log_cache_bytes", Kind::Gauge, "Bytes of chunk files in the remote read cache.");
    out.sample("weir_remote_log_cache_bytes", &[], cache.map_or(0, |c| c.held_bytes()));
    let led: Vec<(&Arc<Partition>, crate::tier::TierStatus)> = partitions
        .iter()
        .filter(|p| p.state().leader == broker.config.node_id)
        .filter_map(|p| broker.tier_status(p).map(|s| (p, s)))
        .collect();
    type Read = fn(&crate::tier::TierStatus) -> u64;
    let gauges: [(&str, &str, Read); 4] = [
        ("weir_remote_log_segments", "Segments of the partition in the object store.", |s| s.remote_segments as u64),
        ("weir_remote_log_size_bytes", "Bytes of the partition in the object store.", |s| s.remote_bytes),
        (
            "weir_remote_log_upload_lag_bytes",
            "Bytes of closed, committed segments not uploaded yet (Kafka's RemoteCopyLagBytes).",
            |s| s.lag_bytes,
        ),
        (
            "weir_remote_log_upload_lag_segments",
            "Closed, committed segments not uploaded yet (Kafka's RemoteCopyLagSegments).",
            |s| s.lag_segments as u64,
        ),
    ];
    for (name, help, read) in gauges {
        out.family(name, Kind::Gauge, help);
        for (p, status) in &led {
            out.sample(name, &[("topic", &p.topic), ("partition", &p.index)], read(status));
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

impl Broker {
    /// Closes every local partition's load window every [`LOAD_SAMPLE_INTERVAL`], until
    /// shutdown: the rates `weir topic describe` shows, and elastic topics are split and placed by.
    pub(crate) fn run_load_sampler(self: &Arc<Self>) {
        self.every(LOAD_SAMPLE_INTERVAL, |broker| async move {
            let now = std::time::Instant::now();
            for partition in broker.partitions() {
                partition.metrics.sample_load(now);
            }
            sample_process_cpu(now);
            let report = Arc::new(broker.measure_load());
            *weir_storage::sync::lock(&broker.load_report) = report;
        });
    }

    /// What this broker reports of its load in its heartbeats, as of the last load window.
    pub(crate) fn load_report(&self) -> Arc<weir_controller::balance::LoadReport> {
        weir_storage::sync::lock(&self.load_report).clone()
    }

    /// Each partition this broker leads that carried traffic in the last window, its CPU and
    /// the bytes of its logs.
    fn measure_load(&self) -> weir_controller::balance::LoadReport {
        let mut report = weir_controller::balance::LoadReport {
            cpu_cores: f64::from_bits(PROCESS_CPU_CORES.load(std::sync::atomic::Ordering::Relaxed)),
            ..Default::default()
        };
        for partition in self.partitions() {
            report.disk_bytes += partition.log.size_bytes();
            let load = partition.metrics.load();
            let traffic = load.bytes_in_per_sec > 0.0 || load.bytes_out_per_sec > 0.0;
            if traffic && partition.state().leader == self.config.node_id {
                report.partitions.push(weir_controller::balance::PartitionRate {
                    topic: partition.topic.clone(),
                    partition: partition.index,
                    bytes_in_per_sec: load.bytes_in_per_sec,
                    bytes_out_per_sec: load.bytes_out_per_sec,
                });
            }
        }
        report
    }
}

/// The process's CPU use over the last load window, in cores (an `f64`'s bits): one process,
/// one figure, whichever broker of it reports.
static PROCESS_CPU_CORES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn sample_process_cpu(now: std::time::Instant) {
    static LAST: std::sync::Mutex<Option<(std::time::Instant, f64)>> = std::sync::Mutex::new(None);
    let Some(cpu) = weir_proc::cpu_seconds(weir_proc::Pid::SelfProcess) else { return };
    let mut last = weir_storage::sync::lock(&LAST);
    if let Some((then, was)) = *last {
        let seconds = now.saturating_duration_since(then).as_secs_f64();
        if seconds > 0.0 {
            let cores = ((cpu - was) / seconds).max(0.0);
            PROCESS_CPU_CORES.store(cores.to_bits(), std::sync::atomic::Ordering::Relaxed);
        }
    }
    *last = Some((now, cpu));
}

/// How long a partition's load window is.
pub const LOAD_SAMPLE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

#[cfg(test)]
mod tests;
