//! Metrics: the counting primitives, the exposition format (encoder and checker), and a full
//! render of a real broker in a temporary directory.

use std::time::Duration;

use super::text::{self, Exposition, Kind, Sample};
use super::*;

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
