//! The admin HTTP API of the real `weir server` binary: probes, metrics, broker info, topics,
//! consumer groups, produce and consume over HTTP, their error answers, and interoperation with
//! the Kafka protocol (records produced over HTTP read by a Kafka fetch and the other way round).

mod admin_support;
mod support;

use std::time::{Duration, Instant};

use admin_support::Server;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedPartition;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::Encodable;
use serde_json::{json, Value};
use support::{batch, group_id, s, topic_name, Client, ClientExt, Message};

fn body(value: Value) -> String {
    value.to_string()
}

// ----- probes and broker ---------------------------------------------------------------------

#[test]
fn probes_metrics_and_broker_info_answer() {
    let server = Server::start(&[]);
    assert_eq!(server.get_ok("/health"), json!({"status": "ok"}));
    assert_eq!(server.get_ok("/ready"), json!({"status": "ready"}));

    let (status, content_type, text) = server.call_raw("GET", "/metrics", None);
    assert_eq!(status, 200, "{text}");
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "content type {content_type:?}");
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        assert!(line.split_whitespace().count() >= 2, "not a Prometheus sample line: {line:?}");
    }

    let info = server.get_ok("/v1/broker");
    assert_eq!(info["node_id"], 0);
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(info["listeners"]["kafka"], server.kafka.to_string());
    assert_eq!(format!("http://{}", info["listeners"]["admin"].as_str().unwrap()), server.admin);
    assert_eq!(info["cluster_id"].as_str().map(str::len), Some(22), "{info}");
    let data_dir = std::fs::canonicalize(server.data_dir()).unwrap();
    assert_eq!(info["data_dir"], data_dir.display().to_string());
    assert!(info["uptime_ms"].as_u64().is_some(), "{info}");
    assert!(info["topics"].as_u64().unwrap() >= 1, "__consumer_offsets exists: {info}");

    let configs = server.get_ok("/v1/broker/configs");
    let entries = configs["configs"].as_array().unwrap();
    let find = |name: &str| entries.iter().find(|c| c["name"] == name).cloned().unwrap_or(Value::Null);
    assert_eq!(find("admin.listeners"), json!({"name": "admin.listeners", "value": "127.0.0.1:0", "source": "static"}));
    assert_eq!(find("num.partitions")["source"], "default");

    server.expect_error("GET", "/v1/nothing-here", None, 404, "NOT_FOUND");
    server.expect_error("PUT", "/v1/topics", Some("{}"), 405, "METHOD_NOT_ALLOWED");
}

#[test]
fn a_single_node_describes_itself_as_a_cluster_of_one() {
    let server = Server::start(&["broker.rack=eu-1a"]);
    server.create_topic("orders", 1);
    let cluster = server.get_ok("/v1/cluster");
    let info = server.get_ok("/v1/broker");
    assert_eq!(cluster["cluster_id"], info["cluster_id"]);
    assert_eq!((cluster["node_id"].as_i64(), cluster["controller"].as_i64()), (Some(0), Some(0)), "{cluster}");
    let offset = cluster["metadata_offset"].as_i64().unwrap();
    assert!(offset > 0, "the topic is in the metadata: {cluster}");
    let nodes = cluster["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1, "{cluster}");
    let node = &nodes[0];
    assert_eq!(node["id"], 0);
    assert_eq!((node["broker"].as_bool(), node["controller"].as_bool()), (Some(true), Some(true)), "{node}");
    assert_eq!(node["quorum"], "voter");
    assert_eq!((node["registered"].as_bool(), node["fenced"].as_bool()), (Some(true), Some(false)), "{node}");
    assert_eq!(node["rack"], "eu-1a");
    assert_eq!(node["advertised"], info["listeners"]["kafka_advertised"]);
    assert_eq!((node["reachable"].as_bool(), node["error"].is_null()), (Some(true), true), "{node}");
    let status = &node["status"];
    assert_eq!(status["applied_offset"].as_i64(), Some(offset), "{node}");
    assert_eq!(status["quorum"]["role"], "Leader");
    assert_eq!(status["may_lead"], true);
    assert!(status["heartbeat_acknowledged_ms_ago"].as_u64().is_some(), "{node}");
    server.expect_error("POST", "/v1/cluster", Some("{}"), 405, "METHOD_NOT_ALLOWED");
}

// ----- topics --------------------------------------------------------------------------------

#[test]
fn topics_are_created_described_altered_grown_and_deleted() {
    let server = Server::start(&[]);
    let created = server.expect(
        "POST",
        "/v1/topics",
        Some(&body(json!({"name": "orders", "partitions": 3, "configs": {"retention.ms": "3600000"}}))),
        201,
    );
    assert_eq!(created["name"], "orders");
    assert_eq!(created["partitions"], 3);
    assert_eq!(created["replication_factor"], 1);
    assert_eq!(created["validate_only"], false);

    // validate_only checks and creates nothing.
    let checked = server.expect(
        "POST",
        "/v1/topics",
        Some(&body(json!({"name": "dry", "partitions": 2, "validate_only": true}))),
        200,
    );
    assert_eq!(checked["validate_only"], true);
    server.expect_error("GET", "/v1/topics/dry", None, 404, "UNKNOWN_TOPIC_OR_PARTITION");

    // Errors, by Kafka's names.
    let message =
        server.expect_error("POST", "/v1/topics", Some(&body(json!({"name": "orders"}))), 409, "TOPIC_ALREADY_EXISTS");
    assert_eq!(message, "topic 'orders' already exists");
    server.expect_error(
        "POST",
        "/v1/topics",
        Some(&body(json!({"name": "bad name!"}))),
        400,
        "INVALID_TOPIC_EXCEPTION",
    );
    server.expect_error(
        "POST",
        "/v1/topics",
        Some(&body(json!({"name": "x", "configs": {"retention.ms": "soon"}}))),
        400,
        "INVALID_CONFIG",
    );
    server.expect_error(
        "POST",
        "/v1/topics",
        Some(&body(json!({"name": "x", "partitions": 0}))),
        400,
        "INVALID_PARTITIONS",
    );
    server.expect_error(
        "POST",
        "/v1/topics",
        Some(&body(json!({"name": "x", "replication_factor": 3}))),
        400,
        "INVALID_REPLICATION_FACTOR",
    );
    let message = server.expect_error("POST", "/v1/topics", Some("{\"name\": "), 400, "INVALID_REQUEST");
    assert!(message.starts_with("invalid JSON body"), "{message}");
    server.expect_error(
        "POST",
        "/v1/topics",
        Some(&body(json!({"name": "x", "color": "red"}))),
        400,
        "INVALID_REQUEST",
    );
    server.expect_error("POST", "/v1/topics", Some(&body(json!({"partitions": 1}))), 400, "INVALID_REQUEST");

    let list = server.get_ok("/v1/topics");
    let topics = list["topics"].as_array().unwrap();
    let orders = topics.iter().find(|t| t["name"] == "orders").expect("orders is listed");
    assert_eq!(orders["partitions"], 3);
    assert_eq!(orders["internal"], false);
    assert!(topics.iter().any(|t| t["name"] == "__consumer_offsets" && t["internal"] == true));

    let described = server.get_ok("/v1/topics/orders");
    assert_eq!(described["id"], created["id"]);
    let partitions = described["partitions"].as_array().unwrap();
    assert_eq!(partitions.len(), 3);
    for (i, p) in partitions.iter().enumerate() {
        assert_eq!(p["partition"], i);
        assert_eq!(p["leader"], 0);
        assert_eq!(p["replicas"], json!([0]));
        assert_eq!(p["isr"], json!([0]));
        assert_eq!((p["log_start_offset"].as_i64(), p["high_watermark"].as_i64()), (Some(0), Some(0)));
    }
    let config = |configs: &Value, name: &str| {
        configs.as_array().unwrap().iter().find(|c| c["name"] == name).cloned().unwrap_or(Value::Null)
    };
    assert_eq!(
        config(&described["configs"], "retention.ms"),
        json!({"name": "retention.ms", "value": "3600000", "source": "topic"})
    );
    assert_eq!(config(&described["configs"], "cleanup.policy")["source"], "default");
    assert_eq!(server.get_ok("/v1/topics/orders/configs")["configs"], described["configs"]);
    assert_eq!(server.get_ok("/v1/topics/orders/partitions").as_array().map(Vec::len), Some(3));

    // Incremental config changes: set one, delete another, leave the rest.
    let altered = server.expect(
        "PATCH",
        "/v1/topics/orders/configs",
        Some(&body(json!({"set": {"segment.bytes": "1048576"}, "delete": ["retention.ms"]}))),
        200,
    );
    assert_eq!(config(&altered["configs"], "segment.bytes")["source"], "topic");
    assert_eq!(config(&altered["configs"], "retention.ms")["source"], "default");
    let dry = server.expect(
        "PATCH",
        "/v1/topics/orders/configs",
        Some(&body(json!({"set": {"retention.ms": "1000"}, "validate_only": true}))),
        200,
    );
    assert_eq!(config(&dry["configs"], "retention.ms")["value"], "1000", "validate_only shows the outcome");
    let now = server.get_ok("/v1/topics/orders/configs");
    assert_eq!(config(&now["configs"], "retention.ms")["source"], "default", "validate_only changed nothing");
    server.expect_error(
        "PATCH",
        "/v1/topics/orders/configs",
        Some(&body(json!({"set": {"retention.mss": "1"}}))),
        400,
        "INVALID_CONFIG",
    );
    server.expect_error(
        "PATCH",
        "/v1/topics/orders/configs",
        Some(&body(json!({"set": {"cleanup.policy": "shred"}}))),
        400,
        "INVALID_CONFIG",
    );
    server.expect_error("PATCH", "/v1/topics/orders/configs", Some("{}"), 400, "INVALID_REQUEST");
    server.expect_error(
        "PATCH",
        "/v1/topics/nope/configs",
        Some(&body(json!({"set": {"retention.ms": "1"}}))),
        404,
        "UNKNOWN_TOPIC_OR_PARTITION",
    );

    // Partitions only grow.
    let grown = server.expect("POST", "/v1/topics/orders/partitions", Some(&body(json!({"count": 5}))), 200);
    assert_eq!(grown, json!({"name": "orders", "partitions": 5, "validate_only": false}));
    assert_eq!(server.get_ok("/v1/topics/orders")["partitions"].as_array().map(Vec::len), Some(5));
    server.expect_error(
        "POST",
        "/v1/topics/orders/partitions",
        Some(&body(json!({"count": 2}))),
        400,
        "INVALID_PARTITIONS",
    );
    server.expect_error(
        "POST",
        "/v1/topics/nope/partitions",
        Some(&body(json!({"count": 2}))),
        404,
        "UNKNOWN_TOPIC_OR_PARTITION",
    );

    let deleted = server.expect("DELETE", "/v1/topics/orders", None, 200);
    assert_eq!(deleted["name"], "orders");
    assert_eq!(deleted["id"], created["id"]);
    let message = server.expect_error("GET", "/v1/topics/orders", None, 404, "UNKNOWN_TOPIC_OR_PARTITION");
    assert_eq!(message, "topic 'orders' does not exist");
    server.expect_error("DELETE", "/v1/topics/orders", None, 404, "UNKNOWN_TOPIC_OR_PARTITION");
    server.expect_error("DELETE", "/v1/topics/__consumer_offsets", None, 400, "INVALID_REQUEST");
}

// ----- records -------------------------------------------------------------------------------

#[test]
fn records_produced_over_http_are_read_back_over_http() {
    let server = Server::start(&[]);
    server.create_topic("events", 4);

    // Keyed records land where Kafka's murmur2 partitioner puts them ("user-1" in partition 0,
    // "bob" in 2, which leaves 1 and 3 to the records below); records with an explicit partition
    // go where they are told.
    let produced = server.expect(
        "POST",
        "/v1/topics/events/records",
        Some(&body(json!({"records": [
            {"key": "user-1", "value": "signed up", "headers": {"source": "web", "trace": null}},
            {"key": "bob", "value": "logged in", "headers": [["source", "app"]], "timestamp": 1_700_000_000_000_i64},
            {"key": "user-1", "value": "logged out"},
            {"value": "to partition 3", "partition": 3},
            {"key": null, "value": null, "partition": 3},
        ]}))),
        200,
    );
    let offsets = produced["offsets"].as_array().unwrap();
    assert_eq!(offsets.len(), 5);
    let expected = |key: &str| weir_admin::partitioner::partition_for_key(key.as_bytes(), 4);
    assert_eq!(offsets[0]["partition"], expected("user-1"));
    assert_eq!(offsets[1]["partition"], expected("bob"));
    assert_eq!(offsets[2]["partition"], expected("user-1"));
    assert_eq!(offsets[2]["offset"].as_i64(), offsets[0]["offset"].as_i64().map(|o| o + 1), "same key, next offset");
    assert_eq!(offsets[1]["timestamp"], 1_700_000_000_000_i64);
    assert_eq!((offsets[3]["partition"].as_i64(), offsets[3]["offset"].as_i64()), (Some(3), Some(0)));
    assert_eq!((offsets[4]["partition"].as_i64(), offsets[4]["offset"].as_i64()), (Some(3), Some(1)));

    let p = expected("user-1");
    let read = server.get_ok(&format!("/v1/topics/events/partitions/{p}/records?offset=0"));
    assert_eq!(read["topic"], "events");
    assert_eq!(read["partition"], p);
    assert_eq!(read["encoding"], "utf8");
    let records = read["records"].as_array().unwrap();
    let user1: Vec<&Value> = records.iter().filter(|r| r["key"] == "user-1").collect();
    assert_eq!(user1.len(), 2);
    assert_eq!(user1[0]["value"], "signed up");
    assert_eq!(
        user1[0]["headers"],
        json!([["source", "web"], ["trace", null]]),
        "headers come back as [name, value] pairs"
    );
    assert_eq!(user1[0]["timestamp_type"], "CreateTime");
    assert_eq!(user1[1]["value"], "logged out");
    assert_eq!(read["next_offset"], read["high_watermark"]);

    let nulls = server.get_ok("/v1/topics/events/partitions/3/records?offset=1");
    assert_eq!(
        nulls["records"],
        json!([{"partition": 3, "offset": 1, "timestamp": nulls["records"][0]["timestamp"], "timestamp_type": "CreateTime", "key": null, "value": null, "headers": []}])
    );

    // Binary data through base64, both ways.
    let binary: Vec<u8> = (0..=255).collect();
    let produced = server.expect(
        "POST",
        "/v1/topics/events/records",
        Some(&body(json!({"encoding": "base64", "records": [
            {"key": BASE64.encode(b"\xff\x00key"), "value": BASE64.encode(&binary), "headers": {"h": BASE64.encode(b"\x01\x02")}, "partition": 0},
        ]}))),
        200,
    );
    let offset = produced["offsets"][0]["offset"].as_i64().unwrap();
    let read = server.get_ok(&format!("/v1/topics/events/partitions/0/records?offset={offset}&encoding=base64"));
    assert_eq!(read["encoding"], "base64");
    let record = &read["records"][0];
    assert_eq!(BASE64.decode(record["value"].as_str().unwrap()).unwrap(), binary);
    assert_eq!(BASE64.decode(record["key"].as_str().unwrap()).unwrap(), b"\xff\x00key");
    assert_eq!(record["headers"], json!([["h", BASE64.encode(b"\x01\x02")]]));
    let lossy = server.get_ok(&format!("/v1/topics/events/partitions/0/records?offset={offset}"));
    assert!(lossy["records"][0]["key"].as_str().unwrap().ends_with("key"), "utf8 replaces invalid bytes");

    // max_records, earliest/latest and the topic-wide read.
    let many: Vec<Value> = (0..10).map(|i| json!({"value": format!("m{i}"), "partition": 1})).collect();
    server.expect("POST", "/v1/topics/events/records", Some(&body(json!({"records": many}))), 200);
    let page = server.get_ok("/v1/topics/events/partitions/1/records?offset=earliest&max_records=4");
    let values: Vec<&str> = page["records"].as_array().unwrap().iter().map(|r| r["value"].as_str().unwrap()).collect();
    assert_eq!(values, ["m0", "m1", "m2", "m3"]);
    assert_eq!(page["next_offset"], 4);
    let rest = server.get_ok("/v1/topics/events/partitions/1/records?offset=4&max_records=100");
    assert_eq!(rest["records"].as_array().map(Vec::len), Some(6));
    let latest = server.get_ok("/v1/topics/events/partitions/1/records?offset=latest");
    assert_eq!(latest["records"], json!([]));
    assert_eq!(latest["next_offset"], 10);
    let all = server.get_ok("/v1/topics/events/records?max_records=1000");
    assert_eq!(all["records"].as_array().map(Vec::len), Some(16));
    assert_eq!(all["partitions"].as_array().map(Vec::len), Some(4));
    let some = server.get_ok("/v1/topics/events/records?offsets=1:8,3:earliest");
    let got: Vec<(i64, i64)> = some["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["partition"].as_i64().unwrap(), r["offset"].as_i64().unwrap()))
        .collect();
    assert_eq!(got, [(1, 8), (1, 9), (3, 0), (3, 1)]);
    assert_eq!(
        some["partitions"][0],
        json!({"partition": 1, "next_offset": 10, "high_watermark": 10, "log_start_offset": 0})
    );
}

#[test]
fn bad_produce_and_consume_requests_get_clear_errors() {
    let server = Server::start(&[]);
    server.create_topic("t", 2);
    let post =
        |b: &str, status: u16, code: &str| server.expect_error("POST", "/v1/topics/t/records", Some(b), status, code);

    let message = server.expect_error(
        "POST",
        "/v1/topics/nope/records",
        Some(&body(json!({"records": [{"value": "x"}]}))),
        404,
        "UNKNOWN_TOPIC_OR_PARTITION",
    );
    assert_eq!(message, "topic 'nope' does not exist");
    let message =
        post(&body(json!({"encoding": "base64", "records": [{"value": "not base64!"}]})), 400, "INVALID_REQUEST");
    assert!(message.contains("record 0: the value is not valid base64"), "{message}");
    post(
        &body(json!({"encoding": "base64", "records": [{"value": "aGk=", "headers": {"h": "%%"}}]})),
        400,
        "INVALID_REQUEST",
    );
    post(&body(json!({"records": []})), 400, "INVALID_REQUEST");
    post(&body(json!({"records": [{"value": "x", "partition": 2}]})), 404, "UNKNOWN_TOPIC_OR_PARTITION");
    post(&body(json!({"records": [{"value": "x", "timestamp": -5}]})), 400, "INVALID_TIMESTAMP");
    post(&body(json!({"encoding": "hex", "records": [{"value": "x"}]})), 400, "INVALID_REQUEST");
    post(&body(json!({"records": [{"value": 5}]})), 400, "INVALID_REQUEST");
    post("not json at all", 400, "INVALID_REQUEST");
    post(&body(json!({"records": [{"value": "x".repeat(2_000_000)}]})), 413, "MESSAGE_TOO_LARGE");
    // Nothing above was appended.
    assert_eq!(server.get_ok("/v1/topics/t/records")["records"], json!([]));

    server.expect(
        "POST",
        "/v1/topics/t/records",
        Some(&body(json!({"records": [{"value": "a", "partition": 0}]}))),
        200,
    );
    let get = |query: &str, status: u16, code: &str| {
        server.expect_error("GET", &format!("/v1/topics/t/partitions/0/records{query}"), None, status, code)
    };
    get("?offset=abc", 400, "INVALID_REQUEST");
    get("?offset=-1", 400, "OFFSET_OUT_OF_RANGE");
    let message = get("?offset=99", 400, "OFFSET_OUT_OF_RANGE");
    assert!(message.contains("offset 99 is out of range for t-0"), "{message}");
    get("?max_records=0", 400, "INVALID_REQUEST");
    get("?max_records=many", 400, "INVALID_REQUEST");
    get("?timeout_ms=3600000", 400, "INVALID_REQUEST");
    get("?encoding=hex", 400, "INVALID_REQUEST");
    server.expect_error("GET", "/v1/topics/t/partitions/7/records", None, 404, "UNKNOWN_TOPIC_OR_PARTITION");
    server.expect_error("GET", "/v1/topics/t/partitions/x/records", None, 400, "INVALID_REQUEST");
    server.expect_error("GET", "/v1/topics/nope/partitions/0/records", None, 404, "UNKNOWN_TOPIC_OR_PARTITION");
    server.expect_error("GET", "/v1/topics/t/records?offsets=0", None, 400, "INVALID_REQUEST");
    server.expect_error("GET", "/v1/topics/t/records?offsets=0:1,0:0", None, 400, "INVALID_REQUEST");
    server.expect_error("GET", "/v1/topics/t/records?offsets=5:0", None, 404, "UNKNOWN_TOPIC_OR_PARTITION");
}

#[test]
fn a_consume_with_timeout_waits_for_the_next_append() {
    let server = Server::start(&[]);
    server.create_topic("wait", 1);

    // Nothing arrives: the answer comes after the timeout, empty.
    let started = Instant::now();
    let empty = server.get_ok("/v1/topics/wait/partitions/0/records?offset=latest&timeout_ms=300");
    assert_eq!(empty["records"], json!([]));
    assert!(started.elapsed() >= Duration::from_millis(290), "returned after {:?}", started.elapsed());

    // An append wakes a parked consume long before its timeout.
    std::thread::scope(|scope| {
        let waiting = scope.spawn(|| {
            let started = Instant::now();
            let answer = server.get_ok("/v1/topics/wait/partitions/0/records?offset=0&timeout_ms=20000");
            (answer, started.elapsed())
        });
        std::thread::sleep(Duration::from_millis(300));
        server.expect("POST", "/v1/topics/wait/records", Some(&body(json!({"records": [{"value": "late"}]}))), 200);
        let (answer, elapsed) = waiting.join().unwrap();
        assert_eq!(answer["records"][0]["value"], "late");
        assert!(elapsed < Duration::from_secs(10), "the append did not wake the consume ({elapsed:?})");
    });
}

#[test]
fn shutdown_answers_a_parked_consume_and_stops_the_admin_listener() {
    let mut server = Server::start(&[]);
    server.create_topic("quiet", 1);
    let admin = server.admin.clone();
    let waiting = std::thread::spawn({
        let url = format!("{admin}/v1/topics/quiet/partitions/0/records?offset=latest&timeout_ms=60000");
        move || {
            let started = Instant::now();
            let answer = ureq::get(&url).call().map(|mut r| r.body_mut().read_to_string());
            (answer, started.elapsed())
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    let status = server.terminate();
    assert!(status.success(), "exit status {status:?}\n{}", server.logs());
    let (answer, elapsed) = waiting.join().unwrap();
    let text = answer.expect("the parked consume is answered").expect("body");
    assert!(text.contains(r#""records":[]"#), "{text}");
    assert!(elapsed < Duration::from_secs(20), "the consume waited {elapsed:?} despite the shutdown");
    assert!(ureq::get(&format!("{admin}/health")).call().is_err(), "the admin listener is closed");
    let logs = server.logs();
    assert!(logs.contains("admin listener stopped") && logs.contains("shut down cleanly"), "{logs}");
}

// ----- interop with the Kafka protocol -------------------------------------------------------

#[test]
fn records_cross_between_http_and_the_kafka_protocol() {
    let server = Server::start(&[]);
    server.create_topic("bridge", 1);
    let mut kafka = support::connect(server.kafka);

    // HTTP → Kafka fetch: same key, value, headers and timestamp.
    server.expect(
        "POST",
        "/v1/topics/bridge/records",
        Some(&body(json!({"records": [
            {"key": "k1", "value": "from http", "headers": {"content-type": "text/plain", "empty": null}, "timestamp": 1_000},
            {"value": "no key", "timestamp": 1_001},
        ]}))),
        200,
    );
    let fetched = kafka.fetch_all("bridge", 0);
    assert_eq!(fetched.len(), 2);
    assert_eq!(fetched[0].key.as_deref(), Some(&b"k1"[..]));
    assert_eq!(fetched[0].value.as_deref(), Some(&b"from http"[..]));
    assert_eq!(fetched[0].timestamp, 1_000);
    let headers: Vec<(String, Option<Bytes>)> =
        fetched[0].headers.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    assert_eq!(
        headers,
        vec![("content-type".to_string(), Some(Bytes::from_static(b"text/plain"))), ("empty".to_string(), None)]
    );
    assert_eq!((fetched[1].key.clone(), fetched[1].offset), (None, 1));

    // Kafka produce → HTTP GET.
    let messages = [Message::new("a", "from kafka", 2_000), Message::new("b", "second", 2_001)];
    let base = kafka.produce_ok("bridge", 0, batch(&messages));
    assert_eq!(base, 2);
    let read = server.get_ok("/v1/topics/bridge/partitions/0/records?offset=2");
    let records = read["records"].as_array().unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(
        records[0],
        json!({"partition": 0, "offset": 2, "timestamp": 2_000, "timestamp_type": "CreateTime", "key": "a", "value": "from kafka", "headers": []})
    );
    assert_eq!(records[1]["value"], "second");
    assert_eq!(records[1]["offset"], 3);
}

#[test]
fn a_header_name_given_twice_keeps_every_value_in_order() {
    let server = Server::start(&[]);
    server.create_topic("repeats", 1);
    let headers = json!([["trace", "a"], ["other", "x"], ["trace", "b"], ["trace", null]]);
    server.expect(
        "POST",
        "/v1/topics/repeats/records",
        Some(&body(json!({"records": [{"value": "v", "headers": headers}]}))),
        200,
    );
    let read = server.get_ok("/v1/topics/repeats/partitions/0/records?offset=0");
    assert_eq!(read["records"][0]["headers"], headers);
}

#[test]
fn internal_topics_cannot_be_written_over_http() {
    let server = Server::start(&[]);
    let record = body(json!({"records": [{"key": "k", "value": "forged offset commit", "partition": 0}]}));
    for topic in ["__consumer_offsets", "__transaction_state"] {
        let message = server.expect_error(
            "POST",
            &format!("/v1/topics/{topic}/records"),
            Some(&record),
            400,
            "INVALID_TOPIC_EXCEPTION",
        );
        assert!(message.contains("internal topic"), "{message}");
    }
    let partitions = server.get_ok("/v1/topics/__consumer_offsets/partitions");
    assert!(
        partitions.as_array().unwrap().iter().all(|p| p["log_end_offset"] == 0),
        "nothing was written: {partitions}"
    );
}

#[test]
fn http_consume_counts_toward_the_topics_bytes_out() {
    let server = Server::start(&[]);
    server.create_topic("counted", 1);
    server.expect(
        "POST",
        "/v1/topics/counted/records",
        Some(&body(json!({"records": [{"value": "twelve bytes"}]}))),
        200,
    );
    let bytes_out = |server: &Server| -> f64 {
        let (status, _, text) = server.call_raw("GET", "/metrics", None);
        assert_eq!(status, 200);
        text.lines()
            .find(|l| l.starts_with("weir_topic_bytes_out_total{topic=\"counted\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no weir_topic_bytes_out_total for the topic:\n{text}"))
    };
    assert_eq!(bytes_out(&server), 0.0);
    let read = server.get_ok("/v1/topics/counted/partitions/0/records?offset=0");
    assert_eq!(read["records"][0]["value"], "twelve bytes");
    let size = server.get_ok("/v1/topics/counted/partitions")[0]["size_bytes"].as_f64().unwrap();
    assert_eq!(bytes_out(&server), size, "the one batch read, as stored");
}

// ----- consumer groups -----------------------------------------------------------------------

/// A consumer assignment as a leader sends it in SyncGroup (ConsumerProtocolAssignment v0).
fn assignment(topic: &str, partitions: &[i32]) -> Bytes {
    let value = ConsumerProtocolAssignment::default().with_assigned_partitions(vec![AssignedPartition::default()
        .with_topic(topic_name(topic))
        .with_partitions(partitions.to_vec())]);
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&0i16.to_be_bytes());
    value.encode(&mut buf, 0).expect("encode assignment");
    buf.freeze()
}

/// Joins `group` as its only member and syncs with `assigned`; returns the member id.
fn join_and_sync(kafka: &mut Client, group: &str, assigned: Bytes) -> String {
    let join = |member: &str| {
        JoinGroupRequest::default()
            .with_group_id(group_id(group))
            .with_session_timeout_ms(60_000)
            .with_rebalance_timeout_ms(60_000)
            .with_member_id(s(member))
            .with_protocol_type(s("consumer"))
            .with_protocols(vec![join_group_request::JoinGroupRequestProtocol::default()
                .with_name(s("range"))
                .with_metadata(Bytes::from_static(b"\0\0\0\0\0\0\0\0"))])
    };
    let mut response = kafka.send(5, &join("")).expect("JoinGroup v5");
    if response.error_code == 79 {
        response = kafka.send(5, &join(response.member_id.as_str())).expect("JoinGroup v5");
    }
    assert_eq!(response.error_code, 0, "JoinGroup");
    let member = response.member_id.to_string();
    let sync = SyncGroupRequest::default()
        .with_group_id(group_id(group))
        .with_generation_id(response.generation_id)
        .with_member_id(s(&member))
        .with_assignments(vec![sync_group_request::SyncGroupRequestAssignment::default()
            .with_member_id(s(&member))
            .with_assignment(assigned)]);
    let synced = kafka.send(3, &sync).expect("SyncGroup v3");
    assert_eq!(synced.error_code, 0, "SyncGroup");
    member
}

#[test]
fn groups_are_listed_described_with_lag_reset_and_deleted() {
    let server = Server::start(&["offsets.topic.num.partitions=3"]);
    server.create_topic("jobs", 2);
    let values: Vec<Value> = (0..10).map(|i| json!({"value": format!("j{i}"), "partition": i % 2})).collect();
    server.expect("POST", "/v1/topics/jobs/records", Some(&body(json!({"records": values}))), 200);
    // Each partition now holds 5 records.

    server.expect_error("GET", "/v1/groups/workers", None, 404, "GROUP_ID_NOT_FOUND");
    let committed = server.expect(
        "POST",
        "/v1/groups/workers/offsets",
        Some(&body(json!({"offsets": [{"topic": "jobs", "partition": 0, "offset": 2}, {"topic": "jobs", "partition": 1, "offset": 5, "metadata": "done"}]}))),
        200,
    );
    assert_eq!(committed["group_id"], "workers");
    let listed = server.get_ok("/v1/groups");
    assert_eq!(listed["groups"], json!([{"group_id": "workers", "state": "Empty", "protocol_type": ""}]));
    assert_eq!(server.get_ok("/v1/groups?state=Stable")["groups"], json!([]));
    server.expect_error("GET", "/v1/groups?state=Sleeping", None, 400, "INVALID_REQUEST");

    let described = server.get_ok("/v1/groups/workers");
    assert_eq!(described["state"], "Empty");
    assert_eq!(described["members"], json!([]));
    assert_eq!(described["total_lag"], 3);
    assert_eq!(
        described["offsets"],
        json!([
            {"topic": "jobs", "partition": 0, "committed_offset": 2, "high_watermark": 5, "lag": 3, "member_id": null, "metadata": ""},
            {"topic": "jobs", "partition": 1, "committed_offset": 5, "high_watermark": 5, "lag": 0, "member_id": null, "metadata": "done"},
        ])
    );

    // Resets: dry run, earliest, latest, explicit, by timestamp, shifted.
    let reset = |to: Value, extra: Value| {
        let mut request = json!({"topics": ["jobs"], "to": to});
        if let (Some(r), Some(e)) = (request.as_object_mut(), extra.as_object()) {
            r.extend(e.clone());
        }
        server.expect("POST", "/v1/groups/workers/reset-offsets", Some(&body(request)), 200)
    };
    let new_offsets = |answer: &Value| -> Vec<i64> {
        answer["offsets"].as_array().unwrap().iter().map(|o| o["new_offset"].as_i64().unwrap()).collect()
    };
    let dry = reset(json!("earliest"), json!({"dry_run": true}));
    assert_eq!(dry["dry_run"], true);
    assert_eq!(new_offsets(&dry), [0, 0]);
    assert_eq!(dry["offsets"][0]["previous_offset"], 2);
    assert_eq!(server.get_ok("/v1/groups/workers")["total_lag"], 3, "a dry run commits nothing");
    assert_eq!(new_offsets(&reset(json!("earliest"), json!({}))), [0, 0]);
    assert_eq!(server.get_ok("/v1/groups/workers")["total_lag"], 10);
    assert_eq!(new_offsets(&reset(json!("latest"), json!({}))), [5, 5]);
    assert_eq!(server.get_ok("/v1/groups/workers")["total_lag"], 0);
    assert_eq!(new_offsets(&reset(json!({"offset": 3}), json!({}))), [3, 3]);
    assert_eq!(new_offsets(&reset(json!({"shift_by": -5}), json!({}))), [0, 0], "shifts stop at the log start");
    assert_eq!(new_offsets(&reset(json!({"shift_by": 2}), json!({}))), [2, 2]);
    assert_eq!(new_offsets(&reset(json!({"timestamp": 0}), json!({}))), [0, 0]);
    assert_eq!(
        new_offsets(&reset(json!({"timestamp": 32_503_680_000_000_i64}), json!({}))),
        [5, 5],
        "none that recent: latest"
    );
    let one = server.expect(
        "POST",
        "/v1/groups/workers/reset-offsets",
        Some(&body(json!({"topics": [{"topic": "jobs", "partitions": [1]}], "to": "earliest"}))),
        200,
    );
    assert_eq!(one["offsets"], json!([{"topic": "jobs", "partition": 1, "previous_offset": 5, "new_offset": 0}]));
    // Without topics: every topic with committed offsets.
    assert_eq!(
        new_offsets(&server.expect(
            "POST",
            "/v1/groups/workers/reset-offsets",
            Some(&body(json!({"to": "latest"}))),
            200
        )),
        [5, 5]
    );

    // Invalid resets and commits.
    let bad_reset = |request: Value, status: u16, code: &str| {
        server.expect_error("POST", "/v1/groups/workers/reset-offsets", Some(&body(request)), status, code)
    };
    let message = bad_reset(json!({"topics": ["jobs"], "to": {"offset": 99}}), 400, "OFFSET_OUT_OF_RANGE");
    assert!(message.contains("offset 99 is out of range for jobs-0"), "{message}");
    bad_reset(json!({"topics": ["jobs"], "to": {"offset": -1}}), 400, "OFFSET_OUT_OF_RANGE");
    bad_reset(json!({"topics": ["nope"], "to": "earliest"}), 404, "UNKNOWN_TOPIC_OR_PARTITION");
    bad_reset(
        json!({"topics": [{"topic": "jobs", "partitions": [9]}], "to": "earliest"}),
        404,
        "UNKNOWN_TOPIC_OR_PARTITION",
    );
    bad_reset(json!({"topics": ["jobs"], "to": "sideways"}), 400, "INVALID_REQUEST");
    bad_reset(json!({"topics": ["jobs"]}), 400, "INVALID_REQUEST");
    bad_reset(json!({"topics": ["jobs"], "to": {"timestamp": -3}}), 400, "INVALID_TIMESTAMP");
    server.expect_error(
        "POST",
        "/v1/groups/fresh/reset-offsets",
        Some(&body(json!({"to": "earliest"}))),
        400,
        "INVALID_REQUEST",
    );
    server.expect_error(
        "POST",
        "/v1/groups/workers/offsets",
        Some(&body(json!({"offsets": [{"topic": "jobs", "partition": 0, "offset": -4}]}))),
        400,
        "INVALID_REQUEST",
    );
    server.expect_error(
        "POST",
        "/v1/groups/workers/offsets",
        Some(&body(json!({"offsets": [{"topic": "nope", "partition": 0, "offset": 1}]}))),
        404,
        "UNKNOWN_TOPIC_OR_PARTITION",
    );

    // A member joins over the Kafka protocol: the group is Stable, its assignment and the
    // partitions' owner show, and offsets can be neither reset nor committed, nor the group
    // deleted.
    let mut kafka = support::connect(server.kafka);
    let member = join_and_sync(&mut kafka, "workers", assignment("jobs", &[0, 1]));
    let described = server.get_ok("/v1/groups/workers");
    assert_eq!(described["state"], "Stable");
    assert_eq!(described["protocol_type"], "consumer");
    assert_eq!(described["protocol"], "range");
    assert_eq!(described["members"][0]["member_id"], member.as_str());
    assert_eq!(described["members"][0]["client_id"], support::CLIENT_ID);
    assert_eq!(described["members"][0]["assignment"], json!([{"topic": "jobs", "partitions": [0, 1]}]));
    assert_eq!(described["offsets"][0]["member_id"], member.as_str());
    assert_eq!(server.get_ok("/v1/groups?state=Stable")["groups"][0]["group_id"], "workers");
    let message = bad_reset(json!({"topics": ["jobs"], "to": "earliest"}), 409, "NON_EMPTY_GROUP");
    assert!(message.contains("group 'workers' has active members (state Stable)"), "{message}");
    server.expect_error(
        "POST",
        "/v1/groups/workers/offsets",
        Some(&body(json!({"offsets": [{"topic": "jobs", "partition": 0, "offset": 1}]}))),
        409,
        "NON_EMPTY_GROUP",
    );
    server.expect_error("DELETE", "/v1/groups/workers", None, 409, "NON_EMPTY_GROUP");

    // Once the member leaves, the group can be deleted.
    let leave = LeaveGroupRequest::default()
        .with_group_id(group_id("workers"))
        .with_members(vec![leave_group_request::MemberIdentity::default().with_member_id(s(&member))]);
    assert_eq!(kafka.send(3, &leave).expect("LeaveGroup v3").error_code, 0, "LeaveGroup");
    assert_eq!(server.get_ok("/v1/groups/workers")["state"], "Empty");
    assert_eq!(server.expect("DELETE", "/v1/groups/workers", None, 200), json!({"group_id": "workers"}));
    server.expect_error("GET", "/v1/groups/workers", None, 404, "GROUP_ID_NOT_FOUND");
    let message = server.expect_error("DELETE", "/v1/groups/workers", None, 404, "GROUP_ID_NOT_FOUND");
    assert_eq!(message, "group 'workers' does not exist");
}
