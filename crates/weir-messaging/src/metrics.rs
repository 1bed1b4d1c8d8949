//! The messaging layer's part of `/metrics`: the timer store of delayed messages and the open
//! transactions.

use std::sync::Arc;

use weir_broker::metrics::{Exposition, Kind, MetricsSection};
use weir_broker::Partition;

use crate::Messaging;

impl MetricsSection for Messaging {
    fn render(&self, out: &mut Exposition, _partitions: &[Arc<Partition>]) {
        render_messaging(out, self);
    }
}

/// The timer store of delayed messages and the open transactions (half messages).
fn render_messaging(out: &mut Exposition, messaging: &Messaging) {
    use std::sync::atomic::Ordering::Relaxed;
    let (pending, in_memory) = messaging.timer.pending();
    let stats = &messaging.timer.stats;
    let gauges: [(&str, Kind, &str, u64); 10] = [
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
            messaging.half.pending_count() as u64,
        ),
        (
            "weir_pop_queue_states",
            Kind::Gauge,
            "Invisible-time queue states (group, partition, broadcasting consumer) loaded for the partitions this broker leads.",
            messaging.pop.len() as u64,
        ),
        (
            "weir_pop_state_shard_queues",
            Kind::Gauge,
            "Queues whose invisible-time state the partitions of __share_group_state this broker leads hold.",
            messaging.pop_states.queue_count() as u64,
        ),
    ];
    for (name, kind, help, value) in gauges {
        out.family(name, kind, help);
        out.sample(name, &[], value);
    }
}

#[cfg(test)]
mod tests {
    //! A full render of a real broker with its groups in a temporary directory: every family
    //! docs/metrics.md lists, with the values the broker and the groups hold.

    use std::collections::BTreeMap;
    use std::path::Path;
    use std::time::Duration;

    use bytes::Bytes;
    use weir_broker::metrics::render_prometheus;
    use weir_broker::metrics::text::{self, Sample};
    use weir_broker::{Acks, Broker, BrokerConfig, NewTopic};

    use weir_coordinators::group::{CommitParams, GroupCoordinator, OffsetToCommit};

    use crate::Messaging;

    fn find<'a>(samples: &'a [Sample], name: &str, labels: &[(&str, &str)]) -> Option<&'a Sample> {
        samples.iter().find(|s| s.name == name && labels.iter().all(|(n, v)| s.label(n) == Some(v)))
    }

    fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
        find(samples, name, labels).unwrap_or_else(|| panic!("no sample {name} {labels:?}")).value
    }

    fn test_error_name(code: i32) -> String {
        format!("E{code}")
    }

    fn config(dir: &Path) -> BrokerConfig {
        let mut map: BTreeMap<String, String> = BTreeMap::new();
        map.insert("log.dirs".into(), dir.display().to_string());
        map.insert("offsets.topic.num.partitions".into(), "2".into());
        map.insert("log.cleaner.enable".into(), "false".into());
        BrokerConfig::from_settings(&map).expect("config")
    }

    fn batch(records: usize) -> bytes::BytesMut {
        let entries: Vec<(Bytes, Option<Bytes>)> =
            (0..records).map(|i| (Bytes::from(format!("key-{i}")), Some(Bytes::from(vec![b'v'; 100])))).collect();
        weir_broker::internal_records::encode_batch(&entries, 1_700_000_000_000)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_broker_renders_every_metric_in_valid_exposition_format() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = config(dir.path());
        let (broker, groups, messaging) = tokio::task::spawn_blocking(move || {
            let broker = Broker::open(config).expect("open");
            let messaging = Messaging::open(&broker).expect("messaging");
            let topic = NewTopic {
                name: "orders".into(),
                partitions: 2,
                replication_factor: -1,
                assignments: Vec::new(),
                configs: [("flush.policy".to_string(), "sync".to_string())].into(),
            };
            broker.create_topics_blocking(vec![topic], false).pop().expect("one result").expect("created");
            let gone = NewTopic {
                name: "gone".into(),
                partitions: 1,
                replication_factor: -1,
                assignments: Vec::new(),
                configs: BTreeMap::new(),
            };
            broker.create_topics_blocking(vec![gone], false).pop().expect("one result").expect("created");
            let groups = GroupCoordinator::start(broker.clone()).expect("groups");
            (broker, groups, messaging)
        })
        .await
        .expect("join");

        // Produce: 3 + 2 records to partition 0, 4 to partition 1.
        let p0 = broker.require_partition("orders", 0).expect("p0");
        let p1 = broker.require_partition("orders", 1).expect("p1");
        let mut bytes_in = 0u64;
        for (partition, records) in [(&p0, 3), (&p0, 2), (&p1, 4)] {
            let records = batch(records);
            bytes_in += records.len() as u64;
            broker.append(partition.clone(), records, Acks::Leader).await.expect("append");
        }
        // What the fetch path counts.
        p0.metrics.bytes_out.add(1234);

        // A group whose id needs escaping commits offset 1 on partition 0, and one on a topic that
        // is deleted afterwards (no lag for it).
        let group = "billing \"east\"\\prod\n2";
        let commit = CommitParams {
            group_id: group.into(),
            generation_id: None,
            member_id: String::new(),
            group_instance_id: None,
            offsets: vec![
                OffsetToCommit { topic: "orders".into(), partition: 0, offset: 1, leader_epoch: None, metadata: None },
                OffsetToCommit { topic: "gone".into(), partition: 0, offset: 9, leader_epoch: None, metadata: None },
            ],
        };
        let results = groups.commit_offsets(commit).await;
        assert!(results.iter().all(|r| r.error.is_none()), "{results:?}");
        broker.delete_topic(Some("gone".into()), None).await.expect("delete");

        // What a front-end counts.
        let requests = broker.metrics.register_protocol("kafka", 4, test_error_name);
        let produce = requests.operation(0, || "Produce".into()).expect("slot");
        produce.observe(Duration::from_micros(300));
        produce.observe(Duration::from_millis(3));
        produce.count_errors([3]);
        let fetch = requests.operation(1, || "Fetch".into()).expect("slot");
        fetch.observe(Duration::from_millis(500));
        fetch.count_failure();
        requests.count_unknown_operation();
        requests.connections.open.inc();
        requests.connections.accepted.add(2);
        requests.connections.requests_in_flight.inc();
        // A second front-end adds rows of its own.
        let other = broker.metrics.register_protocol("other", 4, test_error_name);
        other.operation(0, || "SendMessage".into()).expect("slot").observe(Duration::from_millis(1));

        let text = render_prometheus(&broker, &[&*groups, &*messaging]);
        let samples = text::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));

        // Every metric docs/metrics.md lists is there.
        let families: std::collections::HashSet<&str> = samples.iter().map(|s| s.family.as_str()).collect();
        let docs = include_str!("../../../docs/metrics.md");
        for line in docs.lines().filter(|l| l.starts_with("| `weir_") || l.starts_with("| `process_")) {
            let name = line.trim_start_matches("| `").split('`').next().unwrap_or_default();
            let expected = !name.starts_with("process_") || cfg!(target_os = "linux");
            if expected {
                assert!(
                    text.contains(&format!("# TYPE {name} ")),
                    "docs/metrics.md lists {name}, not rendered\n{text}"
                );
            }
        }
        for family in &families {
            assert!(docs.contains(&format!("`{family}`")), "{family} is not documented in docs/metrics.md");
        }

        assert_eq!(value(&samples, "weir_build_info", &[("version", env!("CARGO_PKG_VERSION"))]), 1.0);
        let kafka = |api: &'static str| [("protocol", "kafka"), ("api", api)];
        assert_eq!(value(&samples, "weir_requests_total", &kafka("Produce")), 2.0);
        assert_eq!(value(&samples, "weir_requests_total", &[("protocol", "other"), ("api", "SendMessage")]), 1.0);
        assert!(find(&samples, "weir_requests_total", &[("protocol", "other"), ("api", "Produce")]).is_none());
        assert_eq!(
            value(
                &samples,
                "weir_request_duration_seconds_bucket",
                &[("protocol", "kafka"), ("api", "Produce"), ("le", "0.0005")]
            ),
            1.0
        );
        assert_eq!(value(&samples, "weir_request_duration_seconds_count", &kafka("Fetch")), 1.0);
        assert_eq!(
            value(&samples, "weir_request_errors_total", &[("protocol", "kafka"), ("api", "Produce"), ("error", "E3")]),
            1.0
        );
        assert_eq!(value(&samples, "weir_requests_failed_total", &kafka("Fetch")), 1.0);
        assert_eq!(value(&samples, "weir_requests_failed_total", &kafka("unknown")), 1.0);
        assert_eq!(value(&samples, "weir_connections_open", &[("protocol", "kafka")]), 1.0);
        assert_eq!(value(&samples, "weir_connections_accepted_total", &[("protocol", "kafka")]), 2.0);
        assert_eq!(value(&samples, "weir_requests_in_flight", &[("protocol", "kafka")]), 1.0);
        assert_eq!(value(&samples, "weir_connections_open", &[("protocol", "other")]), 0.0);

        assert_eq!(value(&samples, "weir_topic_bytes_in_total", &[("topic", "orders")]), bytes_in as f64);
        assert_eq!(value(&samples, "weir_topic_messages_in_total", &[("topic", "orders")]), 9.0);
        assert_eq!(value(&samples, "weir_topic_bytes_out_total", &[("topic", "orders")]), 1234.0);
        // The internal topic is listed too, with nothing produced by clients.
        assert_eq!(value(&samples, "weir_topic_bytes_in_total", &[("topic", "__consumer_offsets")]), 0.0);
        assert_eq!(value(&samples, "weir_topics", &[]), 2.0);
        assert_eq!(value(&samples, "weir_partitions", &[]), 4.0);
        // One node leads everything, with every (single) replica in sync.
        assert_eq!(value(&samples, "weir_leader_partitions", &[]), 4.0);
        assert_eq!(value(&samples, "weir_under_replicated_partitions", &[]), 0.0);
        assert_eq!(value(&samples, "weir_under_min_isr_partitions", &[]), 0.0);

        let p = |i: &'static str| [("topic", "orders"), ("partition", i)];
        assert_eq!(value(&samples, "weir_partition_log_end_offset", &p("0")), 5.0);
        assert_eq!(value(&samples, "weir_partition_high_watermark", &p("0")), 5.0);
        assert_eq!(value(&samples, "weir_partition_log_end_offset", &p("1")), 4.0);
        assert_eq!(value(&samples, "weir_partition_log_start_offset", &p("1")), 0.0);
        assert_eq!(value(&samples, "weir_partition_size_bytes", &p("0")), p0.log.size_bytes() as f64);
        assert_eq!(value(&samples, "weir_partition_segments", &p("0")), 1.0);
        // flush.policy=sync: each append was fsynced.
        assert!(value(&samples, "weir_partition_fsync_seconds_count", &p("0")) >= 2.0, "{text}");
        assert!(value(&samples, "weir_partition_fsync_seconds_sum", &p("0")) > 0.0, "{text}");
        let flushes = value(&samples, "weir_fsync_duration_seconds_count", &[]);
        assert!(flushes >= 2.0, "every flush is in the broker-wide histogram: {text}");
        assert_eq!(value(&samples, "weir_fsync_duration_seconds_bucket", &[("le", "+Inf")]), flushes);

        assert_eq!(value(&samples, "weir_consumer_groups", &[("state", "Empty")]), 1.0);
        assert_eq!(value(&samples, "weir_consumer_groups", &[("state", "Stable")]), 0.0);
        let g = |topic: &'static str| [("group", group), ("topic", topic), ("partition", "0")];
        assert_eq!(value(&samples, "weir_consumer_group_committed_offset", &g("orders")), 1.0);
        assert_eq!(value(&samples, "weir_consumer_group_lag_records", &g("orders")), 4.0);
        assert_eq!(value(&samples, "weir_consumer_group_committed_offset", &g("gone")), 9.0);
        assert!(find(&samples, "weir_consumer_group_lag_records", &g("gone")).is_none());

        if cfg!(target_os = "linux") {
            assert!(value(&samples, "process_resident_memory_bytes", &[]) > 0.0);
            assert!(value(&samples, "process_open_fds", &[]) > 0.0);
            assert!(value(&samples, "process_cpu_seconds_total", &[]) >= 0.0);
        }

        groups.shutdown();
        tokio::task::spawn_blocking(move || broker.shutdown()).await.expect("join").expect("shutdown");
    }
}
