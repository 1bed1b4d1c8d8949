//! Smoke tests of `weir bench produce`: the real binary starts its own broker, produces with the
//! raw client, checks the topic's offsets against what was acknowledged, and reports positive
//! figures.

mod bench_support;

use std::process::Command;

use bench_support::{args, run_bench};
use serde_json::Value;

/// Runs `weir bench produce --bytes 8M EXTRA... --json F`; returns the JSON report.
fn bench_produce(extra: &[&str]) -> Value {
    let mut bench_args = args(&["produce", "--bytes", "8M"]);
    bench_args.extend(args(extra));
    let (report, stdout) = run_bench(&bench_args);
    assert!(stdout.contains("= records acknowledged"), "no offset check on stdout:\n{stdout}");
    let number = |key: &str| report[key].as_f64().unwrap_or_else(|| panic!("{key} is not a number in {report}"));
    let records = report["records"].as_u64().expect("records");
    assert!(number("value_bytes") >= (8 << 20) as f64, "{report}");
    assert_eq!(report["log_end_offset_total"].as_u64(), Some(records), "{report}");
    assert_eq!(report["offsets_match"], Value::Bool(true), "{report}");
    for key in ["mb_per_s", "msgs_per_s", "seconds"] {
        let value = number(key);
        assert!(value > 0.0 && value.is_finite(), "{key} = {value} in {report}");
    }
    // Its own child broker: CPU and RSS are known.
    assert!(number("broker_cpu_seconds") >= 0.0, "{report}");
    assert!(number("broker_peak_rss_bytes") > 0.0, "{report}");
    assert!(number("client_cpu_percent") >= 0.0, "{report}");
    report
}

#[test]
fn produce_bench_acks_one() {
    let report = bench_produce(&[]);
    assert_eq!(report["acks"], 1);
    assert_eq!(report["partitions"], 1);
    let latency = &report["latency_ms"];
    let (p50, p99) = (latency["p50"].as_f64().expect("p50"), latency["p99"].as_f64().expect("p99"));
    assert!(p50 > 0.0 && p50 <= p99, "{latency}");
}

#[test]
fn produce_bench_acks_all_with_sync_flush() {
    let report = bench_produce(&["--acks", "all", "--topic-config", "flush.policy=sync", "--consume"]);
    assert_eq!(report["acks"], -1);
    assert_eq!(report["topic_configs"][0], "flush.policy=sync");
    let consume = &report["consume"];
    assert_eq!(consume["records"], report["records"], "{report}");
    assert!(consume["mb_per_s"].as_f64().expect("consume MB/s") > 0.0, "{report}");
}

#[test]
fn produce_bench_two_connections_four_partitions() {
    let report = bench_produce(&["--connections", "2", "--partitions", "4"]);
    assert_eq!(report["connections"], 2);
    assert_eq!(report["partitions"], 4);
    // Each request carries two partitions' batches; both connections sent.
    assert!(report["requests"].as_u64().expect("requests") >= 2, "{report}");
}

#[test]
fn produce_bench_fails_when_the_broker_rejects_the_batches() {
    let output = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["bench", "produce", "--bytes", "4M", "--topic-config", "max.message.bytes=100000"])
        .env_remove("RUST_LOG")
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run weir");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "a rejected batch must fail the run:\n{stderr}");
    assert!(stderr.contains("MESSAGE_TOO_LARGE (10)"), "the error names the cause:\n{stderr}");
}
