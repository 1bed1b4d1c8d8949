//! The `weir` client commands (`topic`, `group`, `produce`, `consume`, `cluster`) against the real
//! `weir server` binary: their tables, their `--json`, and their errors (exit status 1 with one
//! `error: ...` line on stderr).

mod admin_support;
mod support;

use admin_support::{run_weir, Server};
use serde_json::{json, Value};

#[test]
fn topic_commands_create_list_describe_alter_and_delete() {
    let server = Server::start(&[]);
    let created =
        server.weir(&["topic", "create", "orders", "--partitions", "3", "--config", "retention.ms=60000"], "");
    assert_eq!(created.ok(), "created topic 'orders' with 3 partitions\n");
    let checked = server.weir(&["topic", "create", "dry", "--validate-only"], "");
    assert_eq!(checked.ok(), "topic 'dry' is valid: 1 partition (nothing created)\n");
    let json = server.weir(&["topic", "create", "events", "--json"], "").json_lines();
    assert_eq!(json.len(), 1);
    assert_eq!((json[0]["name"].as_str(), json[0]["partitions"].as_i64()), (Some("events"), Some(1)));

    let listed = server.weir(&["topic", "list"], "");
    let lines: Vec<&str> = listed.ok().lines().collect();
    assert_eq!(lines[0].split_whitespace().collect::<Vec<_>>(), ["TOPIC", "PARTITIONS", "INTERNAL", "ID"]);
    let orders = lines.iter().find(|l| l.starts_with("orders ")).expect("orders is listed");
    assert_eq!(orders.split_whitespace().take(3).collect::<Vec<_>>(), ["orders", "3", "no"]);
    assert!(lines.iter().any(|l| l.starts_with("__consumer_offsets ")));
    // Columns line up: every row's second column starts where the header's does.
    let column = lines[0].find("PARTITIONS").unwrap();
    assert!(lines[1..].iter().all(|l| l[column..].starts_with(|c: char| c.is_ascii_digit())), "{lines:?}");
    let internal_free = server.weir(&["topic", "list", "--exclude-internal", "--json"], "").json_lines();
    let names: Vec<&str> =
        internal_free[0]["topics"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["events", "orders"]);

    let described = server.weir(&["topic", "describe", "orders"], "");
    let text = described.ok();
    assert!(text.starts_with("Topic: orders\n"), "{text}");
    assert!(text.contains("Partitions: 3   Replication factor: 1"), "{text}");
    assert!(
        text.contains("PARTITION  LEADER  REPLICAS  ISR  REPLICA-LAG  LOG-START  HIGH-WATERMARK  LOG-END  SIZE"),
        "{text}"
    );
    let config_line = text.lines().find(|l| l.starts_with("retention.ms")).expect("the override is shown");
    assert_eq!(config_line.split_whitespace().collect::<Vec<_>>(), ["retention.ms", "60000", "topic"]);
    assert!(!text.contains("cleanup.policy"), "defaults only with --all-configs: {text}");
    assert!(server.weir(&["topic", "describe", "orders", "--all-configs"], "").ok().contains("cleanup.policy"));
    let json = server.weir(&["topic", "describe", "orders", "--json"], "").json_lines();
    assert_eq!(json[0]["partitions"].as_array().map(Vec::len), Some(3));

    let altered = server.weir(
        &[
            "topic",
            "alter",
            "orders",
            "--set",
            "segment.bytes=1048576",
            "--delete",
            "retention.ms",
            "--partitions",
            "4",
        ],
        "",
    );
    assert_eq!(altered.ok(), "altered topic 'orders': set segment.bytes=1048576, deleted retention.ms, 4 partitions\n");
    let after = server.get_ok("/v1/topics/orders");
    assert_eq!(after["partitions"].as_array().map(Vec::len), Some(4));
    let source = |name: &str| {
        after["configs"].as_array().unwrap().iter().find(|c| c["name"] == name).map(|c| c["source"].clone())
    };
    assert_eq!(source("segment.bytes"), Some(json!("topic")));
    assert_eq!(source("retention.ms"), Some(json!("default")));

    // Errors: one line, Kafka's code, exit status 1.
    assert_eq!(
        server.weir(&["topic", "describe", "nope"], "").failed(),
        "error: topic 'nope' does not exist (UNKNOWN_TOPIC_OR_PARTITION)"
    );
    assert_eq!(
        server.weir(&["topic", "create", "orders"], "").failed(),
        "error: topic 'orders' already exists (TOPIC_ALREADY_EXISTS)"
    );
    assert!(server
        .weir(&["topic", "create", "x", "--config", "retention.ms=soon"], "")
        .failed()
        .ends_with("(INVALID_CONFIG)"));
    assert!(server
        .weir(&["topic", "alter", "orders", "--partitions", "2"], "")
        .failed()
        .ends_with("(INVALID_PARTITIONS)"));
    assert_eq!(
        server.weir(&["topic", "alter", "orders"], "").failed(),
        "error: nothing to alter: give --set NAME=VALUE, --delete NAME or --partitions N"
    );

    assert_eq!(server.weir(&["topic", "delete", "orders"], "").ok(), "deleted topic 'orders'\n");
    assert!(server.weir(&["topic", "delete", "orders"], "").failed().ends_with("(UNKNOWN_TOPIC_OR_PARTITION)"));
}

#[test]
fn produce_reads_stdin_lines_and_consume_prints_them() {
    let server = Server::start(&[]);
    server.create_topic("lines", 1);
    let produced = server.weir(
        &["produce", "lines", "--key-separator", ":", "--header", "source=cli"],
        "k1:hello\nk2:world: with a colon\nno key here\n\nlast\r\n",
    );
    assert_eq!(produced.ok(), "produced 5 record(s) to 'lines'\n");

    let consumed = server.weir(&["consume", "lines", "--from-beginning", "--timeout", "1"], "");
    assert_eq!(
        consumed.ok(),
        "partition=0 offset=0 key=k1 headers=source:cli value=hello\n\
         partition=0 offset=1 key=k2 headers=source:cli value=world: with a colon\n\
         partition=0 offset=2 key=(null) headers=source:cli value=no key here\n\
         partition=0 offset=3 key=(null) headers=source:cli value=\n\
         partition=0 offset=4 key=(null) headers=source:cli value=last\n"
    );
    assert_eq!(consumed.stderr, "consumed 5 record(s)\n");

    let json =
        server.weir(&["consume", "lines", "--partition", "0", "--offset", "1", "--max-messages", "2", "--json"], "");
    let records = json.json_lines();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0]["topic"], "lines");
    assert_eq!(records[0]["offset"], 1);
    assert_eq!(records[0]["key"], "k2");
    assert_eq!(records[0]["headers"], json!([["source", "cli"]]));
    assert_eq!(records[1]["value"], "no key here");
    let base64 = server.weir(
        &["consume", "lines", "--offset", "earliest", "--max-messages", "1", "--json", "--encoding", "base64"],
        "",
    );
    assert_eq!(base64.json_lines()[0]["value"], "aGVsbG8=");

    // Binary lines round-trip; --json prints each record's partition and offset.
    let produced = server.weir(&["produce", "lines", "--json", "--partition", "0"], "\u{1}\u{2}\n");
    assert_eq!(
        produced.json_lines(),
        vec![json!({"partition": 0, "offset": 5, "timestamp": produced.json_lines()[0]["timestamp"]})]
    );

    // Only new records without --from-beginning: nothing arrives within the timeout.
    let quiet = server.weir(&["consume", "lines", "--timeout", "0.5"], "");
    assert_eq!(quiet.ok(), "");
    assert_eq!(quiet.stderr, "consumed 0 record(s)\n");

    // Errors.
    assert_eq!(
        server.weir(&["produce", "nope"], "x\n").failed(),
        "error: topic 'nope' does not exist (UNKNOWN_TOPIC_OR_PARTITION)"
    );
    assert!(server
        .weir(&["produce", "lines", "--partition", "3"], "x\n")
        .failed()
        .ends_with("(UNKNOWN_TOPIC_OR_PARTITION)"));
    assert_eq!(
        server.weir(&["consume", "nope", "--timeout", "0.1"], "").failed(),
        "error: topic 'nope' does not exist (UNKNOWN_TOPIC_OR_PARTITION)"
    );
    assert!(server
        .weir(&["consume", "lines", "--partition", "0", "--offset", "99", "--timeout", "0.1"], "")
        .failed()
        .contains("offset 99 is out of range for lines-0"));
    assert_eq!(
        server.weir(&["consume", "lines", "--offset", "7", "--timeout", "0.1"], "").failed(),
        "error: --offset 7 needs --partition (or use earliest or latest)"
    );
    assert_eq!(
        server.weir(&["consume", "lines", "--partition", "2", "--timeout", "0.1"], "").failed(),
        "error: topic 'lines' has no partition 2"
    );
}

#[test]
fn consume_prints_every_value_of_a_repeated_header_name_in_order() {
    // Kafka allows a header name more than once; each value is kept, in the order produced.
    let server = Server::start(&[]);
    server.create_topic("repeated", 1);
    let produced =
        server.weir(&["produce", "repeated", "--header", "t=a", "--header", "t=b", "--header", "u=c"], "x\n");
    assert_eq!(produced.ok(), "produced 1 record(s) to 'repeated'\n");

    let text = server.weir(&["consume", "repeated", "--from-beginning", "--timeout", "1"], "");
    assert_eq!(text.ok(), "partition=0 offset=0 key=(null) headers=t:a,t:b,u:c value=x\n");
    let json = server.weir(&["consume", "repeated", "--from-beginning", "--timeout", "1", "--json"], "");
    assert_eq!(json.json_lines()[0]["headers"], json!([["t", "a"], ["t", "b"], ["u", "c"]]));
}

#[test]
fn topic_create_sets_the_rocketmq_message_type() {
    let server = Server::start(&[]);
    let created = server.weir(&["topic", "create", "ordered", "--message-type", "FIFO"], "");
    assert_eq!(created.ok(), "created topic 'ordered' with 1 partition\n");
    let described = server.weir(&["topic", "describe", "ordered"], "");
    let text = described.ok();
    let line = text.lines().find(|l| l.starts_with("message.type")).expect("the override is shown");
    assert!(line.contains("FIFO"), "{text}");
    let refused = server.weir(&["topic", "create", "odd", "--message-type", "SOMETIMES"], "");
    assert!(refused.failed().contains("expected NORMAL, FIFO, DELAY or TRANSACTION"), "{}", refused.stderr);
}

#[test]
fn group_create_and_alter_set_a_groups_rocketmq_settings() {
    let server = Server::start(&[]);
    let created = server.weir(
        &["group", "create", "orders-app", "--fifo", "--max-delivery-attempts", "5", "--retry-backoff", "1s,10s"],
        "",
    );
    let text = created.ok();
    assert!(text.starts_with("created group 'orders-app'\n"), "{text}");
    let setting = |text: &str, name: &str| -> Vec<String> {
        let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in {text}"));
        line.split_whitespace().map(str::to_string).collect()
    };
    assert_eq!(setting(text, "consume.fifo"), ["consume.fifo", "true", "group"]);
    assert_eq!(setting(text, "max.delivery.attempts"), ["max.delivery.attempts", "5", "group"]);

    let again = server.weir(&["group", "create", "orders-app"], "");
    assert!(again.failed().contains("GROUP_ALREADY_EXISTS"), "{}", again.stderr);
    let bad = server.weir(&["group", "create", "other-app", "--retry-backoff", "soon"], "");
    assert!(bad.failed().contains("retry.backoff"), "{}", bad.stderr);

    let altered = server
        .weir(&["group", "alter", "orders-app", "--set", "max.delivery.attempts=9", "--delete", "consume.fifo"], "");
    let text = altered.ok();
    assert_eq!(setting(text, "max.delivery.attempts"), ["max.delivery.attempts", "9", "group"]);
    assert_eq!(setting(text, "consume.fifo"), ["consume.fifo", "false", "default"]);

    // A group known only by its settings is described, with them.
    let described = server.weir(&["group", "describe", "orders-app"], "");
    let text = described.ok();
    assert_eq!(setting(text, "retry.backoff"), ["retry.backoff", "1s,10s", "group"]);
    let configs = server.get_ok("/v1/groups/unknown-app/configs");
    let value = |name: &str| {
        let list = configs["configs"].as_array().cloned().unwrap_or_default();
        list.iter().find(|c| c["name"] == name).map(|c| c["value"].clone())
    };
    assert_eq!(value("max.delivery.attempts"), Some("17".into()), "{configs}");
    assert_eq!(value("consume.broadcast"), Some("false".into()), "{configs}");

    let broadcast = server.weir(&["group", "create", "fan-out", "--broadcast"], "");
    assert_eq!(setting(broadcast.ok(), "consume.broadcast"), ["consume.broadcast", "true", "group"]);
}

/// The sum of a topic's high watermarks: how many records it holds.
fn records_in(server: &Server, topic: &str) -> i64 {
    let described = server.get_ok(&format!("/v1/topics/{topic}"));
    described["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .map(|p| p["high_watermark"].as_i64().unwrap_or(0))
        .sum()
}

#[test]
fn produce_splits_lines_into_requests_that_fit_the_topics_max_message_bytes() {
    let server = Server::start(&[]);
    // 1,000 lines of 1.5 KB: 1.5 MB, more than the default max.message.bytes (1 MiB) in one batch.
    server.create_topic("wide", 1);
    let line = "x".repeat(1500);
    let input: String = (0..1000).map(|i| format!("{i:04}{line}\n")).collect();
    assert_eq!(server.weir(&["produce", "wide"], &input).ok(), "produced 1000 record(s) to 'wide'\n");
    assert_eq!(records_in(&server, "wide"), 1000);
    let last =
        server.weir(&["consume", "wide", "--partition", "0", "--offset", "999", "--max-messages", "1", "--json"], "");
    assert_eq!(last.json_lines()[0]["value"], format!("0999{line}"));

    // The topic's own max.message.bytes counts, with keys and headers, over several partitions.
    let created =
        server.weir(&["topic", "create", "narrow", "--partitions", "2", "--config", "max.message.bytes=8000"], "");
    created.ok();
    let input: String = (0..100).map(|i| format!("key-{i}:{line}\n")).collect();
    let produced = server.weir(&["produce", "narrow", "--key-separator", ":", "--header", "source=cli"], &input);
    assert_eq!(produced.ok(), "produced 100 record(s) to 'narrow'\n");
    assert_eq!(records_in(&server, "narrow"), 100);
}

#[test]
fn produce_says_how_many_records_were_produced_when_a_later_line_is_refused() {
    let server = Server::start(&[]);
    let created = server.weir(&["topic", "create", "small", "--config", "max.message.bytes=4096"], "");
    created.ok();
    let input = format!("{}{}\n{}", "fits\n".repeat(10), "y".repeat(5000), "after\n".repeat(10));
    let line = server.weir(&["produce", "small"], &input).failed().to_string();
    assert!(line.contains("exceeds max.message.bytes=4096"), "{line}");
    assert!(line.contains("(MESSAGE_TOO_LARGE); 10 record(s) were produced"), "{line}");
    assert_eq!(records_in(&server, "small"), 10, "the lines before the refused one are there, none after it");
}

#[test]
fn produce_refuses_a_line_too_long_for_one_admin_request_with_a_clear_message() {
    let server = Server::start(&["message.max.bytes=100000000"]);
    server.create_topic("huge", 1);
    let input = format!("first\n{}\nnever\n", "z".repeat(13 << 20));
    let line = server.weir(&["produce", "huge"], &input).failed().to_string();
    assert!(line.starts_with("error: line 2 does not fit in one request to the admin API"), "{line}");
    assert!(line.contains("16 MiB"), "{line}");
    assert!(line.contains("1 record(s) were produced"), "{line}");
    assert_eq!(records_in(&server, "huge"), 1);
    // Longer than any request: refused without reading the rest of it.
    let input = format!("{}\n", "z".repeat(17 << 20));
    let line = server.weir(&["produce", "huge"], &input).failed().to_string();
    assert!(line.starts_with("error: line 1 does not fit in one request"), "{line}");
    assert!(line.ends_with("it is longer than 16 MiB"), "{line}");
}

#[test]
fn group_commands_follow_a_consumer_group() {
    let server = Server::start(&["offsets.topic.num.partitions=3"]);
    server.create_topic("tasks", 2);
    let input: String = (0..6).map(|i| format!("t{i}\n")).collect();
    server.weir(&["produce", "tasks", "--partition", "0"], &input).ok();

    // A group member starts where nothing is committed (--from-beginning), commits what it
    // printed and leaves, and the next member resumes there.
    let first = server.weir(&["consume", "tasks", "--group", "crew", "--from-beginning", "--max-messages", "4"], "");
    assert_eq!(first.ok().lines().count(), 4);
    let second = server.weir(&["consume", "tasks", "--group", "crew", "--timeout", "1", "--json"], "");
    let values: Vec<Value> = second.json_lines().iter().map(|r| r["value"].clone()).collect();
    assert_eq!(values, [json!("t4"), json!("t5")]);

    let listed = server.weir(&["group", "list"], "");
    assert_eq!(
        listed.ok().lines().map(|l| l.split_whitespace().collect::<Vec<_>>()).collect::<Vec<_>>(),
        vec![vec!["GROUP", "STATE", "PROTOCOL-TYPE"], vec!["crew", "Empty", "consumer"],]
    );
    assert_eq!(
        server.weir(&["group", "list", "--state", "Stable", "--json"], "").json_lines(),
        vec![json!({"groups": []})]
    );

    let described = server.weir(&["group", "describe", "crew"], "");
    let text = described.ok();
    assert!(text.starts_with("Group: crew\nState: Empty   Protocol: consumer   Members: 0   Total lag: 0\n"), "{text}");
    let row = |text: &str, topic_partition: &str| -> Vec<String> {
        text.lines()
            .map(|l| l.split_whitespace().map(String::from).collect::<Vec<_>>())
            .find(|cells| cells.len() > 2 && format!("{} {}", cells[0], cells[1]) == topic_partition)
            .unwrap_or_else(|| panic!("no row for {topic_partition} in {text}"))
    };
    assert_eq!(row(text, "tasks 0"), ["tasks", "0", "6", "6", "0", "-", "-", "-"]);

    // Reset: a dry run shows, a real one commits.
    let dry =
        server.weir(&["group", "reset-offsets", "crew", "--topic", "tasks:0", "--to-offset", "2", "--dry-run"], "");
    let text = dry.ok();
    assert_eq!(row(text, "tasks 0"), ["tasks", "0", "6", "2"]);
    assert!(text.ends_with("dry run: nothing committed\n"), "{text}");
    assert_eq!(server.get_ok("/v1/groups/crew")["total_lag"], 0);
    let reset = server.weir(&["group", "reset-offsets", "crew", "--all-topics", "--to-earliest"], "");
    assert!(reset.ok().ends_with("reset 2 partition(s) of group 'crew'\n"), "{}", reset.stdout);
    assert_eq!(row(&server.weir(&["group", "describe", "crew"], "").stdout, "tasks 0")[4], "6", "lag after the reset");
    let shifted =
        server.weir(&["group", "reset-offsets", "crew", "--topic", "tasks:0", "--shift-by", "-1", "--json"], "");
    assert_eq!(shifted.json_lines()[0]["offsets"][0]["new_offset"], 0);
    server.weir(&["group", "reset-offsets", "crew", "--topic", "tasks", "--to-latest"], "").ok();
    let json = server.weir(&["group", "describe", "crew", "--json"], "").json_lines();
    assert_eq!(json[0]["total_lag"], 0);

    // Errors.
    assert!(server
        .weir(&["group", "reset-offsets", "crew", "--topic", "tasks", "--to-offset", "99"], "")
        .failed()
        .ends_with("(OFFSET_OUT_OF_RANGE)"));
    assert!(server
        .weir(&["group", "reset-offsets", "crew", "--topic", "nope", "--to-earliest"], "")
        .failed()
        .ends_with("(UNKNOWN_TOPIC_OR_PARTITION)"));
    let usage = server.weir(&["group", "reset-offsets", "crew", "--topic", "tasks"], "");
    assert_eq!(usage.code, Some(2), "clap refuses a reset without a target: {}", usage.stderr);
    assert_eq!(
        server.weir(&["group", "describe", "ghosts"], "").failed(),
        "error: group 'ghosts' does not exist (GROUP_ID_NOT_FOUND)"
    );

    assert_eq!(server.weir(&["group", "delete", "crew"], "").ok(), "deleted group 'crew'\n");
    assert_eq!(
        server.weir(&["group", "delete", "crew"], "").failed(),
        "error: group 'crew' does not exist (GROUP_ID_NOT_FOUND)"
    );
}

#[test]
fn the_admin_address_comes_from_the_flag_or_the_environment() {
    let server = Server::start(&[]);
    let by_flag = run_weir(&["topic", "list", "--admin", &server.admin, "--json"], "", &[]);
    assert!(by_flag.ok().contains("__consumer_offsets"));
    let by_env = run_weir(&["topic", "list"], "", &[("WEIR_ADMIN", &server.admin)]);
    assert!(by_env.ok().contains("__consumer_offsets"));

    let unreachable = run_weir(&["topic", "list", "--admin", "http://127.0.0.1:1"], "", &[]);
    let line = unreachable.failed();
    assert!(line.starts_with("error: cannot reach the admin API at http://127.0.0.1:1"), "{line}");
    let refused = run_weir(&["topic", "list", "--admin", "ftp://x"], "", &[]);
    assert!(refused.failed().contains("expected host:port, or an http:// or https:// URL"), "{}", refused.stderr);
    let without_scheme = server.admin.trim_start_matches("http://");
    let by_host_port = run_weir(&["topic", "list", "--admin", without_scheme], "", &[]);
    assert!(by_host_port.ok().contains("__consumer_offsets"), "http is assumed");
}

#[test]
fn cluster_info_prints_the_nodes_and_the_controller() {
    let server = Server::start(&[]);
    let text = server.weir(&["cluster", "info"], "").ok().to_string();
    let lines: Vec<&str> = text.lines().collect();
    let cluster_id = server.get_ok("/v1/broker")["cluster_id"].as_str().unwrap().to_string();
    assert_eq!(lines[0], format!("Cluster: {cluster_id}"), "{text}");
    assert!(lines[1].starts_with("Controller: 0   Metadata offset: "), "{text}");
    assert!(lines[1].ends_with(" (applied by node 0)"), "{text}");
    let offset = lines[1].split_whitespace().nth(4).unwrap();
    assert_eq!(
        lines[3].split_whitespace().collect::<Vec<_>>(),
        ["ID", "ROLES", "QUORUM", "RAFT", "BROKER", "APPLIED", "LAG", "RACK", "ADDRESS"]
    );
    let kafka = server.kafka.to_string();
    assert_eq!(
        lines[4].split_whitespace().collect::<Vec<_>>(),
        ["0", "broker,controller", "voter", "leader", "active", offset, "0", "-", kafka.as_str()],
        "{text}"
    );
    assert_eq!(lines.len(), 5, "one node, nothing unreachable: {text}");

    let json = server.weir(&["cluster", "info", "--json"], "").json_lines();
    assert_eq!(json.len(), 1);
    assert_eq!(json[0]["controller"], 0);
    assert_eq!(json[0]["nodes"][0]["fenced"], false);

    let line = run_weir(&["cluster", "info", "--admin", "http://127.0.0.1:1"], "", &[]).failed().to_string();
    assert!(line.starts_with("error: cannot reach the admin API at http://127.0.0.1:1"), "{line}");
}

#[test]
fn a_group_created_with_settings_is_empty_and_listed_before_its_first_use() {
    let server = Server::start(&[]);
    server.weir(&["group", "create", "billing", "--fifo"], "").ok();
    let described = server.weir(&["group", "describe", "billing"], "");
    assert!(described.ok().contains("State: Empty   Protocol: -   Members: 0"), "{}", described.stdout);
    let listed = server.weir(&["group", "list", "--json"], "").json_lines();
    let groups = listed[0]["groups"].as_array().cloned().unwrap_or_default();
    assert!(groups.contains(&json!({"group_id": "billing", "state": "Empty", "protocol_type": ""})), "{groups:?}");
    let text = server.weir(&["group", "list"], "").ok().to_string();
    assert!(text.lines().any(|l| l.split_whitespace().take(2).eq(["billing", "Empty"])), "{text}");
    // A group with neither settings nor offsets still does not exist.
    assert!(server.weir(&["group", "describe", "nobody"], "").failed().contains("GROUP_ID_NOT_FOUND"));
}

#[test]
fn unknown_config_names_are_refused_with_the_name_meant() {
    let server = Server::start(&[]);
    server.create_topic("orders", 1);
    let failed = server.weir(&["topic", "alter", "orders", "--set", "retenton.ms=5"], "");
    assert_eq!(
        failed.failed(),
        "error: Unknown topic config name: retenton.ms; did you mean retention.ms? (INVALID_CONFIG)"
    );
    let failed = server.weir(&["topic", "create", "other", "--config", "segment.byte=1048576"], "");
    assert!(failed.failed().contains("did you mean segment.bytes?"), "{}", failed.stderr);
    let failed = server.weir(&["group", "alter", "g", "--set", "max.delivery.attempt=3"], "");
    assert!(failed.failed().contains("did you mean max.delivery.attempts?"), "{}", failed.stderr);
    // Nothing close: no guess.
    let failed = server.weir(&["topic", "alter", "orders", "--set", "zzzz=1"], "");
    assert_eq!(failed.failed(), "error: Unknown topic config name: zzzz (INVALID_CONFIG)");
    // A replication factor a single node cannot have, and what the help says about it.
    let failed = server.weir(&["topic", "create", "three", "--replication-factor", "3"], "");
    assert!(failed.failed().contains("only 1 broker(s) are registered"), "{}", failed.stderr);
    let help = run_weir(&["topic", "create", "--help"], "", &[]);
    assert!(help.ok().contains("at most the number of live brokers (1 on a single node)"), "{}", help.stdout);
}

#[test]
fn message_lookups_refuse_a_malformed_id_and_show_a_kafka_records_key() {
    let server = Server::start(&[]);
    server.create_topic("plain", 1);
    server.weir(&["produce", "plain", "--key-separator", ":"], "k1:v1\n").ok();
    let failed = server.weir(&["message", "get", "plain", "nonsense"], "");
    assert!(failed.failed().starts_with("error: invalid message id \"nonsense\""), "{}", failed.stderr);
    let found = server.weir(&["message", "query", "plain", "--begin", "0"], "");
    let line = found.ok().lines().next().unwrap_or_default().to_string();
    assert!(line.contains(" key=k1 ") && line.ends_with(" body=v1"), "{line}");
    let json = server.weir(&["message", "query", "plain", "--begin", "0", "--json"], "").json_lines();
    assert_eq!(json[0]["messages"][0]["key"], "k1");
    // A well-formed id of a topic that does not index its messages: that is what is said.
    let failed = server.weir(&["message", "get", "plain", "7F0000010F1C18B4AAC2720B67E30000"], "");
    assert!(failed.failed().contains("does not index its messages"), "{}", failed.stderr);
}

#[test]
fn consume_stopped_by_ctrl_c_says_how_many_records_it_printed() {
    use std::io::BufRead;
    use std::process::Stdio;

    let server = Server::start(&[]);
    server.create_topic("orders", 2);
    server.weir(&["produce", "orders"], "a\nb\nc\n").ok();
    let mut child = support::weir_command()
        .args(["consume", "orders", "--from-beginning"])
        .env("WEIR_ADMIN", &server.admin)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn weir consume");
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    for _ in 0..3 {
        let line = lines.next().expect("a record line").expect("read stdout");
        assert!(line.starts_with("partition="), "{line}");
    }
    // Printed all three, now long-polling for more.
    let sent = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill");
    assert!(sent.success());
    let output = child.wait_with_output().expect("wait for weir consume");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr, "consumed 3 record(s)\n");
    assert_eq!(output.status.code(), Some(130), "{stderr}");
}

#[test]
fn a_command_whose_reader_closes_the_pipe_ends_quietly() {
    use std::io::Read;
    use std::process::Stdio;

    let server = Server::start(&[]);
    // Its description is far larger than a pipe holds (64 KiB).
    server.create_topic("wide", 1000);
    let mut child = support::weir_command()
        .args(["topic", "describe", "wide", "--json"])
        .env("WEIR_ADMIN", &server.admin)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn weir");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut first = [0_u8; 10];
    stdout.read_exact(&mut first).expect("the first bytes");
    assert_eq!(&first[..9], b"{\"name\":\"");
    drop(stdout); // as `| head -c 10` does
    let output = child.wait_with_output().expect("wait for weir");
    assert_eq!(String::from_utf8_lossy(&output.stderr), "");
    assert_eq!(output.status.code(), Some(0));
}
