//! Smoke test of `weir bench rocketmq --quick`: the real binary starts its own broker with both
//! listeners, sends through gRPC and Kafka, receives everything back (unfiltered and with a tag
//! filter), checks what came back itself, and reports positive figures and their ratios.

mod bench_support;

use bench_support::{args, run_bench};
use serde_json::Value;

fn number(value: &Value, key: &str) -> f64 {
    value[key].as_f64().unwrap_or_else(|| panic!("{key} is not a number in {value}"))
}

#[test]
fn rocketmq_bench_quick_measures_every_case_and_checks_what_came_back() {
    let (report, stdout) = run_bench(&args(&["rocketmq", "--quick", "--messages", "1000", "--concurrency", "4"]));
    assert!(stdout.contains("every topic grew by exactly the messages acknowledged"), "{stdout}");
    assert_eq!(report["messages"], 1000, "{report}");
    assert_eq!(report["concurrency"], 4, "{report}");

    let send = report["send"].as_array().expect("send rows");
    let labels: Vec<&str> = send.iter().filter_map(|r| r["label"].as_str()).collect();
    assert_eq!(
        labels,
        [
            "gRPC SendMessage, 1 message/call",
            "Kafka Produce acks=all, 1 record/request",
            "Kafka Produce acks=all, 32 records/request"
        ],
        "{report}"
    );
    // The batched case rounds up to whole requests of 32: 32 requests carry 1,024 records.
    let requests: Vec<u64> = send.iter().map(|r| r["requests"].as_u64().expect("requests")).collect();
    let messages: Vec<u64> = send.iter().map(|r| r["messages"].as_u64().expect("messages")).collect();
    assert_eq!((requests, messages), (vec![1000, 1000, 32], vec![1000, 1000, 1024]), "{report}");
    for row in send {
        assert!(number(row, "msgs_per_s") > 0.0, "{row}");
        let latency = &row["latency_ms"];
        assert!(number(latency, "p50") > 0.0 && number(latency, "p50") <= number(latency, "p99"), "{row}");
    }

    let receive = report["receive"].as_array().expect("receive rows");
    assert_eq!(receive.len(), 5, "{report}");
    // Kafka Fetch, the unfiltered gRPC receive, the classic consumer and the share group read
    // all 1,000; the filter exactly the 10 hits.
    let received: Vec<u64> = receive.iter().map(|r| r["messages"].as_u64().expect("messages")).collect();
    assert_eq!(received, [1000, 1000, 10, 1000, 1000], "{report}");
    let labels: Vec<&str> = receive.iter().filter_map(|r| r["label"].as_str()).collect();
    assert_eq!(labels[3], "Kafka Fetch + OffsetCommit, 1 connection", "{report}");
    assert!(labels[4].starts_with("Kafka share group: ShareFetch"), "{report}");
    for row in receive {
        assert!(number(row, "msgs_per_s") > 0.0 && number(row, "seconds") > 0.0, "{row}");
    }

    let filter = &report["filter"];
    assert_eq!((filter["hits_expected"].as_u64(), filter["hits_delivered"].as_u64()), (Some(10), Some(10)), "{filter}");
    assert!(number(filter, "unfiltered_seconds") > 0.0, "{filter}");
    let ratios = &report["ratios"];
    // (The CPU ratios may be null in a run this small: /proc counts CPU time in 10 ms ticks.)
    for key in
        ["send_msgs_per_s", "send_latency_p50", "send_latency_p99", "receive_msgs_per_s", "share_vs_classic_msgs_per_s"]
    {
        let ratio = number(ratios, key);
        assert!(ratio > 0.0 && ratio.is_finite(), "{key} = {ratio} in {ratios}");
    }
}
