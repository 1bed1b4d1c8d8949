//! Metrics: the counting primitives, the exposition format (encoder and checker), and a full
//! render of a real broker in a temporary directory.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;

use super::text::{self, Exposition, Kind, Sample};
use super::*;
use crate::group::{CommitParams, OffsetToCommit};
use crate::{Acks, BrokerConfig, NewTopic};

fn find<'a>(samples: &'a [Sample], name: &str, labels: &[(&str, &str)]) -> Option<&'a Sample> {
    samples.iter().find(|s| s.name == name && labels.iter().all(|(n, v)| s.label(n) == Some(v)))
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    find(samples, name, labels).unwrap_or_else(|| panic!("no sample {name} {labels:?}")).value
}

// ----- primitives ---------------------------------------------------------------------------

#[test]
fn histogram_bounds_are_inclusive_and_overflow_goes_to_inf() {
    let h = Histogram::default();
    h.observe(Duration::from_nanos(0));
    h.observe(Duration::from_nanos(100_000)); // exactly the first bound: first bucket
    h.observe(Duration::from_nanos(100_001)); // second bucket
    h.observe(Duration::from_secs(60)); // the last finite bound
    h.observe(Duration::from_secs(3600)); // +Inf
    let counts = h.bucket_counts();
    assert_eq!(counts[0], 2);
    assert_eq!(counts[1], 1);
    assert_eq!(counts[LATENCY_BUCKETS_NANOS.len() - 1], 1);
    assert_eq!(counts[LATENCY_BUCKETS_NANOS.len()], 1);
    assert_eq!(h.count(), 5);
    assert!((h.sum_seconds() - 3_660.000_200_001).abs() < 1e-6, "{}", h.sum_seconds());
    assert!(LATENCY_BUCKETS_NANOS.windows(2).all(|w| w[0] < w[1]));
}

fn test_error_name(code: i32) -> String {
    format!("E{code}")
}

#[test]
fn operation_slots_are_named_once_and_errors_skip_code_zero() {
    let requests = ProtocolMetrics::new("test", 4, test_error_name);
    let produce = requests.operation(0, || "Produce".into()).expect("slot 0");
    assert_eq!(produce.name(), Some("Produce"));
    let again = requests.operation(0, || unreachable!("named already")).expect("slot 0");
    assert!(std::ptr::eq(produce, again));
    assert!(requests.operation(-1, || "negative".into()).is_none());
    assert!(requests.operation(4, || "too big".into()).is_none());

    produce.count_errors([0, 3, 0, 3, 10]);
    produce.count_errors([0, 0]);
    produce.count_errors([-1, 40_401]);
    assert_eq!(produce.errors(), vec![(-1, 1), (3, 2), (10, 1), (40_401, 1)]);
    assert_eq!(requests.named().map(|(name, _)| name).collect::<Vec<_>>(), vec!["Produce"]);
    assert_eq!(requests.error_name(3), "E3");
}

#[test]
fn each_protocol_is_registered_once_with_its_own_slots() {
    let metrics = BrokerMetrics::default();
    let kafka = metrics.register_protocol("kafka", 8, test_error_name);
    let again = metrics.register_protocol("kafka", 1, test_error_name);
    assert!(Arc::ptr_eq(&kafka, &again));
    let other = metrics.register_protocol("other", 8, test_error_name);
    kafka.operation(0, || "Produce".into()).expect("slot").observe(Duration::from_millis(1));
    other.operation(0, || "SendMessage".into()).expect("slot").observe(Duration::from_millis(1));
    assert_eq!(kafka.operation(0, || unreachable!()).map(|o| o.latency().count()), Some(1));
    assert_eq!(
        other.operation(0, || unreachable!()).and_then(|o| o.name().map(str::to_string)).as_deref(),
        Some("SendMessage")
    );
    let names: Vec<&str> = metrics.protocols().iter().map(|p| p.protocol()).collect();
    assert_eq!(names, vec!["kafka", "other"]);
}

// ----- the exposition format -----------------------------------------------------------------

#[test]
fn label_values_are_escaped_and_parse_back() {
    let nasty = "a\"quoted\" back\\slash\nnew line, {brace}=";
    let mut out = Exposition::with_capacity(256);
    out.family("weir_test_total", Kind::Counter, "A test counter.");
    out.sample("weir_test_total", &[("group", &nasty), ("partition", &7i32)], 3u64);
    out.family("weir_test_ratio", Kind::Gauge, "A test gauge.");
    out.sample("weir_test_ratio", &[], 0.25f64);
    out.sample("weir_test_ratio", &[("x", &"")], f64::INFINITY);
    let text = out.finish();
    assert!(text.contains(r#"group="a\"quoted\" back\\slash\nnew line, {brace}=""#), "{text}");
    let samples = text::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(samples.len(), 3);
    assert_eq!(samples[0].label("group"), Some(nasty));
    assert_eq!(samples[0].label("partition"), Some("7"));
    assert_eq!(samples[0].value, 3.0);
    assert_eq!(samples[1].value, 0.25);
    assert_eq!(samples[2].value, f64::INFINITY);
}

#[test]
fn histogram_exposition_is_cumulative_with_inf_equal_to_count() {
    let h = Histogram::default();
    for ms in [0u64, 1, 1, 7, 400, 100_000] {
        h.observe(Duration::from_millis(ms));
    }
    let mut out = Exposition::with_capacity(4096);
    out.family("weir_test_seconds", Kind::Histogram, "A test histogram.");
    out.histogram("weir_test_seconds", &[("api", &"Fetch")], &LATENCY_BUCKETS_NANOS, &h);
    let text = out.finish();
    let samples = text::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(value(&samples, "weir_test_seconds_bucket", &[("le", "0.0001")]), 1.0);
    assert_eq!(value(&samples, "weir_test_seconds_bucket", &[("le", "0.001")]), 3.0);
    assert_eq!(value(&samples, "weir_test_seconds_bucket", &[("le", "0.01")]), 4.0);
    assert_eq!(value(&samples, "weir_test_seconds_bucket", &[("le", "0.5")]), 5.0);
    assert_eq!(value(&samples, "weir_test_seconds_bucket", &[("le", "60")]), 5.0);
    assert_eq!(value(&samples, "weir_test_seconds_bucket", &[("le", "+Inf")]), 6.0);
    assert_eq!(value(&samples, "weir_test_seconds_count", &[]), 6.0);
    assert!((value(&samples, "weir_test_seconds_sum", &[]) - 100.409).abs() < 1e-9);
    // Every bound prints as a short decimal.
    let les: Vec<&str> = samples.iter().filter_map(|s| s.label("le")).collect();
    assert_eq!(les.first(), Some(&"0.0001"));
    assert!(les.iter().all(|le| le.len() <= 7), "{les:?}");
}

#[test]
fn the_checker_rejects_malformed_expositions() {
    let good = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 1\n";
    assert!(text::parse(good).is_ok());
    let bad = [
        ("a_total 1\n", "sample without a TYPE"),
        ("# TYPE a_total counter\na_total 1\n", "TYPE without HELP"),
        ("# HELP a A.\n# TYPE a counter\na 1\n", "counter not named _total"),
        ("# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"\"} 1\n", "unescaped quote"),
        ("# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"\\t\"} 1\n", "unknown escape"),
        ("# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1} 1\n", "unterminated value"),
        ("# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 1\na_total{x=\"1\"} 2\n", "repeated sample"),
        ("# HELP a_total A.\n# TYPE a_total counter\na_total one\n", "not a number"),
        ("# HELP a_total A.\n# TYPE a_total counter\na_total 1", "no final line feed"),
        (
            "# HELP a_total A.\n# TYPE a_total counter\n# HELP b B.\n# TYPE b gauge\nb 1\na_total 1\n",
            "family split in two blocks",
        ),
        (
            "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 3\nh_sum 1\nh_count 4\n",
            "+Inf bucket differs from count",
        ),
        (
            "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"2\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_count 2\n",
            "buckets not cumulative",
        ),
        ("# HELP g G.\n# TYPE g gauge\ng_count 1\n", "gauge with a histogram suffix"),
        ("# HELP g G.\n# TYPE g gauge\n1g 1\n", "bad metric name"),
    ];
    for (text, why) in bad {
        assert!(text::parse(text).is_err(), "accepted ({why}): {text:?}");
    }
}

// ----- a full render of a real broker ---------------------------------------------------------

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
    crate::internal_records::encode_batch(&entries, 1_700_000_000_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_renders_every_metric_in_valid_exposition_format() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path());
    let (broker, groups) = tokio::task::spawn_blocking(move || {
        let broker = Broker::open(config).expect("open");
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
        let groups = crate::group::GroupCoordinator::start(broker.clone()).expect("groups");
        (broker, groups)
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
        generation_id: -1,
        member_id: String::new(),
        group_instance_id: None,
        offsets: vec![
            OffsetToCommit { topic: "orders".into(), partition: 0, offset: 1, leader_epoch: -1, metadata: None },
            OffsetToCommit { topic: "gone".into(), partition: 0, offset: 9, leader_epoch: -1, metadata: None },
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

    let text = render_prometheus(&broker, &groups);
    let samples = text::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));

    // Every metric docs/metrics.md lists is there.
    let families: std::collections::HashSet<&str> = samples.iter().map(|s| s.family.as_str()).collect();
    let docs = include_str!("../../../../docs/metrics.md");
    for line in docs.lines().filter(|l| l.starts_with("| `weir_") || l.starts_with("| `process_")) {
        let name = line.trim_start_matches("| `").split('`').next().unwrap_or_default();
        let expected = !name.starts_with("process_") || cfg!(target_os = "linux");
        if expected {
            assert!(text.contains(&format!("# TYPE {name} ")), "docs/metrics.md lists {name}, not rendered\n{text}");
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
