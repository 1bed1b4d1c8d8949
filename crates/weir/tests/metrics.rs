//! `GET /metrics` of the real binary: valid Prometheus exposition, and numbers that follow what
//! clients did over the Kafka protocol (requests, errors, bytes and records in and out, offsets,
//! consumer lag, connections).

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::OffsetCommitRequest;
use support::{batch, code, group_id, topic_name, wait_until, Broker, Client, ClientExt, Message};
use weir_broker::metrics::text::{self, Sample};

/// `GET /metrics`: checks status and content type, parses and validates the exposition.
fn scrape(broker: &Broker) -> Vec<Sample> {
    let (status, headers, body) = http_get(broker.admin_addr(), "/metrics");
    assert_eq!(status, 200, "GET /metrics: {body}");
    let content_type = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.as_str())
        .unwrap_or_default();
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "content type {content_type:?}");
    text::parse(&body).unwrap_or_else(|e| panic!("invalid exposition: {e}\n{body}"))
}

/// A plain HTTP/1.1 GET over a std socket: (status, headers, body). Handles a Content-Length or
/// a chunked body.
fn http_get(addr: SocketAddr, path: &str) -> (u16, Vec<(String, String)>, String) {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect to admin");
    stream.set_read_timeout(Some(Duration::from_secs(15))).expect("timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").expect("send GET");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read response");
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("end of headers");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut body = raw[split + 4..].to_vec();
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).expect("status line");
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect();
    let chunked = headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        let mut out = Vec::new();
        let mut rest = &body[..];
        loop {
            let eol = rest.windows(2).position(|w| w == b"\r\n").expect("chunk size line");
            let size = usize::from_str_radix(String::from_utf8_lossy(&rest[..eol]).trim(), 16).expect("chunk size");
            if size == 0 {
                break;
            }
            out.extend_from_slice(&rest[eol + 2..eol + 2 + size]);
            rest = &rest[eol + 2 + size + 2..];
        }
        body = out;
    }
    (status, headers, String::from_utf8(body).expect("UTF-8 body"))
}

fn find<'a>(samples: &'a [Sample], name: &str, labels: &[(&str, &str)]) -> Option<&'a Sample> {
    samples.iter().find(|s| s.name == name && labels.iter().all(|(n, v)| s.label(n) == Some(v)))
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    find(samples, name, labels).unwrap_or_else(|| panic!("no sample {name} {labels:?}")).value
}

fn commit(client: &mut Client, group: &str, topic: &str, offset: i64) {
    let request = OffsetCommitRequest::default()
        .with_group_id(group_id(group))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![OffsetCommitRequestTopic::default().with_name(topic_name(topic)).with_partitions(vec![
            OffsetCommitRequestPartition::default().with_partition_index(0).with_committed_offset(offset),
        ])]);
    let response = client.send(8, &request).expect("OffsetCommit v8");
    assert_eq!(response.topics[0].partitions[0].error_code, code::NONE, "commit");
}

#[test]
fn metrics_follow_produce_fetch_commits_and_connections() {
    // Few `__consumer_offsets` partitions to count.
    let broker = Broker::start(&["offsets.topic.num.partitions=3"]);

    // Before any traffic: valid, every implemented API listed with zero requests.
    let before = scrape(&broker);
    assert_eq!(value(&before, "weir_requests_total", &[("api", "Produce")]), 0.0);
    assert_eq!(value(&before, "weir_requests_total", &[("api", "Fetch")]), 0.0);
    assert_eq!(value(&before, "weir_connections_open", &[("protocol", "kafka")]), 0.0);
    assert!(value(&before, "process_resident_memory_bytes", &[]) > 0.0);
    assert!(value(&before, "process_open_fds", &[]) > 0.0);

    let mut client = broker.connect();
    client.create_topic("metered", 1, &[]);
    // 3 produce requests, 1 + 2 + 3 records.
    let mut produced_bytes = 0usize;
    for n in 1..=3usize {
        let messages: Vec<Message> = (0..n).map(|i| Message::with_value_len(&format!("k{i}"), 200, 1_000)).collect();
        let records: Bytes = batch(&messages);
        produced_bytes += records.len();
        client.produce_ok("metered", 0, records);
    }
    // One produce to a partition that does not exist: UNKNOWN_TOPIC_OR_PARTITION.
    let (error, _) = client.produce("metered", 7, batch(&[Message::new("k", "v", 1_000)]));
    assert_eq!(error, code::UNKNOWN_TOPIC_OR_PARTITION);
    // Fetch everything once.
    let (error, high_watermark, fetched) = client.fetch("metered", 0, 0, 1 << 20);
    assert_eq!((error, high_watermark), (code::NONE, 6));
    assert_eq!(fetched.len(), produced_bytes, "the fetch returns the batches as produced");
    // A consumer that read 2 of the 6 records.
    let group = "metrics \"lag\" group";
    commit(&mut client, group, "metered", 2);

    let during = scrape(&broker);
    assert_eq!(value(&during, "weir_requests_total", &[("api", "Produce")]), 4.0);
    assert_eq!(value(&during, "weir_request_duration_seconds_count", &[("api", "Produce")]), 4.0);
    assert_eq!(value(&during, "weir_requests_total", &[("api", "Fetch")]), 1.0);
    assert_eq!(value(&during, "weir_requests_total", &[("api", "CreateTopics")]), 1.0);
    assert_eq!(
        value(&during, "weir_request_errors_total", &[("api", "Produce"), ("error", "UNKNOWN_TOPIC_OR_PARTITION")]),
        1.0
    );
    assert_eq!(value(&during, "weir_topic_bytes_in_total", &[("topic", "metered")]), produced_bytes as f64);
    assert_eq!(value(&during, "weir_topic_messages_in_total", &[("topic", "metered")]), 6.0);
    assert_eq!(value(&during, "weir_topic_bytes_out_total", &[("topic", "metered")]), produced_bytes as f64);
    let partition = [("topic", "metered"), ("partition", "0")];
    assert_eq!(value(&during, "weir_partition_log_end_offset", &partition), 6.0);
    assert_eq!(value(&during, "weir_partition_high_watermark", &partition), 6.0);
    assert_eq!(value(&during, "weir_partition_log_start_offset", &partition), 0.0);
    assert!(value(&during, "weir_partition_size_bytes", &partition) >= produced_bytes as f64);
    let lag = [("group", group), ("topic", "metered"), ("partition", "0")];
    assert_eq!(value(&during, "weir_consumer_group_committed_offset", &lag), 2.0);
    assert_eq!(value(&during, "weir_consumer_group_lag_records", &lag), 4.0);
    assert_eq!(value(&during, "weir_consumer_groups", &[("state", "Empty")]), 1.0);
    // The commit was fsynced on its __consumer_offsets partition.
    let fsyncs: f64 = during.iter().filter(|s| s.name == "weir_partition_fsync_seconds_count").map(|s| s.value).sum();
    assert!(fsyncs >= 1.0, "no fsync counted after an offset commit");
    assert_eq!(value(&during, "weir_connections_open", &[("protocol", "kafka")]), 1.0);
    assert_eq!(value(&during, "weir_connections_accepted_total", &[("protocol", "kafka")]), 1.0);
    // The gauge drops once the response is written, which may be a moment after the client
    // read it.
    let idle = wait_until(Duration::from_secs(10), || {
        value(&scrape(&broker), "weir_requests_in_flight", &[("protocol", "kafka")]) == 0.0
    });
    assert!(idle, "weir_requests_in_flight stayed above 0 with no request outstanding");

    // A frame with an unknown API key closes its connection and counts as a failed request.
    let mut bad = broker.connect();
    bad.write_raw(&[0, 0, 0, 8, 0x03, 0xE7, 0, 0, 0, 0, 0, 1]).expect("write");
    assert!(bad.wait_closed(Duration::from_secs(10)).is_ok(), "the broker keeps a connection that sent API key 999");
    let after_bad = scrape(&broker);
    assert_eq!(value(&after_bad, "weir_requests_failed_total", &[("protocol", "kafka"), ("api", "unknown")]), 1.0);

    // Closing every connection brings the gauge back to 0.
    drop(client);
    drop(bad);
    let closed = wait_until(Duration::from_secs(10), || {
        value(&scrape(&broker), "weir_connections_open", &[("protocol", "kafka")]) == 0.0
    });
    assert!(closed, "weir_connections_open did not return to 0 after the clients disconnected");
    let last = scrape(&broker);
    assert_eq!(value(&last, "weir_connections_accepted_total", &[("protocol", "kafka")]), 2.0);
    assert_eq!(value(&last, "weir_requests_in_flight", &[("protocol", "kafka")]), 0.0);
    assert!(value(&last, "process_cpu_seconds_total", &[]) >= 0.0);
}
