//! Kafka protocol conformance of the real `weir server` binary, over raw TCP: what ApiVersions
//! advertises, that every advertised version of every API answers with a response that decodes
//! at that version, and the semantics of Produce, Fetch (limits, long polling, topic ids),
//! ListOffsets, pipelining and the error codes of Produce and CreateTopics.

mod support;

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::FetchTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::Encodable;
use support::*;

// ----- ApiVersions --------------------------------------------------------------------------

/// The broker's list of implemented APIs, read from the source of `weir_kafka::versions` (the
/// binary's crate is not a dependency of these tests, and a copy of the list would go stale).
/// The APIs served at versions past what the `kafka-protocol` crate encodes (Kafka 4.2's share
/// group versions, read through earlier schemas by weir_kafka's `share_versions`): their later
/// versions are exercised over raw frames in `share_groups.rs`, not here.
const PAST_THE_CRATE: &[ApiKey] = &[ApiKey::ShareFetch, ApiKey::ShareAcknowledge, ApiKey::DescribeShareGroupOffsets];

fn implemented_apis() -> Vec<(ApiKey, i16, i16)> {
    let source = include_str!("../../weir-kafka/src/versions.rs");
    let table = source.split("const IMPLEMENTED").nth(1).expect("versions.rs declares IMPLEMENTED");
    let table = &table[..table.find("];").expect("end of IMPLEMENTED")];
    let mut apis = Vec::new();
    for line in table.lines().map(str::trim) {
        let Some(entry) = line.strip_prefix("(ApiKey::") else { continue };
        let fields: Vec<&str> = entry.trim_end_matches(',').trim_end_matches(')').split(',').map(str::trim).collect();
        assert_eq!(fields.len(), 3, "cannot read the IMPLEMENTED entry {line:?}");
        let key = ApiKey::iter()
            .find(|k| format!("{k:?}") == fields[0])
            .unwrap_or_else(|| panic!("unknown API {} in versions.rs", fields[0]));
        apis.push((key, fields[1].parse().expect("min version"), fields[2].parse().expect("max version")));
    }
    assert!(apis.len() >= 10, "read only {} APIs from versions.rs; has its format changed?", apis.len());
    apis
}

/// (API key, min, max) as advertised, in the order received.
fn advertised(response: &ApiVersionsResponse) -> Vec<(i16, i16, i16)> {
    response.api_keys.iter().map(|a| (a.api_key, a.min_version, a.max_version)).collect()
}

#[test]
fn api_versions_advertises_exactly_the_implemented_versions() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    let response = client.api_versions();
    let got = advertised(&response);

    let mut expected: Vec<(i16, i16, i16)> = implemented_apis()
        .into_iter()
        .filter_map(|(key, min, max)| {
            // What the broker can decode: its own range within the protocol crate's (past it
            // for the versions weir_kafka's share_versions reads through earlier schemas).
            if PAST_THE_CRATE.contains(&key) {
                return Some((key as i16, min, max));
            }
            let known = key.valid_versions();
            let (min, max) = (min.max(known.min), max.min(known.max));
            (min <= max).then_some((key as i16, min, max))
        })
        .collect();
    expected.sort();
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(sorted, expected, "advertised API versions differ from weir_kafka::versions");

    let mut keys: Vec<i16> = got.iter().map(|(k, _, _)| *k).collect();
    keys.dedup();
    assert_eq!(keys.len(), got.len(), "an API is advertised twice: {got:?}");
    for (key, min, max) in &got {
        assert!(min <= max, "empty range {min}..{max} for API {key}");
        let api = ApiKey::try_from(*key).unwrap_or_else(|_| panic!("advertised unknown API key {key}"));
        let known = api.valid_versions();
        let max = if PAST_THE_CRATE.contains(&api) { known.max.min(*max) } else { *max };
        assert!(*min >= known.min && max <= known.max, "API {key}: {min}..{max} outside what the protocol defines");
    }
    // What every client needs, at versions current clients use.
    for (key, version) in [
        (ApiKey::ApiVersions, 3),
        (ApiKey::Metadata, 12),
        (ApiKey::Produce, 9),
        (ApiKey::Fetch, 12),
        (ApiKey::ListOffsets, 7),
        (ApiKey::CreateTopics, 7),
    ] {
        assert!(
            got.iter().any(|(k, min, max)| *k == key as i16 && *min <= version && version <= *max),
            "{key:?} v{version} is not advertised: {got:?}"
        );
    }
}

/// An ApiVersions request frame at a version the broker may not know (the header is v2, as a
/// KIP-511 client sends it; the body is v3's).
fn api_versions_frame(version: i16, correlation_id: i32) -> BytesMut {
    let header = RequestHeader::default()
        .with_request_api_key(ApiKey::ApiVersions as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(s("weir-tests")));
    let mut frame = BytesMut::new();
    frame.put_i32(0);
    header.encode(&mut frame, 2).expect("header");
    api_versions_request().encode(&mut frame, 3).expect("body");
    let size = (frame.len() - 4) as i32;
    frame[..4].copy_from_slice(&size.to_be_bytes());
    frame
}

#[test]
fn api_versions_at_an_unknown_version_answers_in_v0_with_unsupported_version_and_the_list() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    let list = advertised(&client.api_versions());
    let max = list.iter().find(|(k, _, _)| *k == ApiKey::ApiVersions as i16).expect("ApiVersions advertised").2;

    // KIP-511: the broker cannot parse the body, so it answers in v0 (response header v0).
    for (i, version) in [max + 1, 99, i16::MAX].into_iter().enumerate() {
        let correlation_id = 1000 + i as i32;
        client.write_raw(&api_versions_frame(version, correlation_id)).expect("write");
        let frame = client.read_frame().unwrap_or_else(|e| panic!("ApiVersions v{version}: {e}"));
        let response: ApiVersionsResponse = decode_response::<ApiVersionsRequest>(frame, 0, correlation_id)
            .unwrap_or_else(|e| panic!("ApiVersions v{version} answer is not a v0 response: {e}"));
        assert_eq!(response.error_code, code::UNSUPPORTED_VERSION, "ApiVersions v{version}");
        assert_eq!(advertised(&response), list, "the v0 answer to v{version} carries the API list");
        // The connection is still usable, at a supported version.
        assert_eq!(advertised(&client.api_versions()), list, "ApiVersions after v{version}");
    }
    broker_still_serves(&broker);
}

fn broker_still_serves(broker: &Broker) {
    let mut fresh = broker.connect();
    fresh.api_versions();
}

// ----- every version of every API -----------------------------------------------------------

const GROUP_APIS: &[ApiKey] = &[
    ApiKey::OffsetCommit,
    ApiKey::OffsetFetch,
    ApiKey::FindCoordinator,
    ApiKey::JoinGroup,
    ApiKey::Heartbeat,
    ApiKey::LeaveGroup,
    ApiKey::SyncGroup,
    ApiKey::DescribeGroups,
    ApiKey::ListGroups,
    ApiKey::DeleteGroups,
    ApiKey::OffsetDelete,
    ApiKey::ConsumerGroupHeartbeat,
    ApiKey::ConsumerGroupDescribe,
    ApiKey::ShareGroupHeartbeat,
    ApiKey::ShareGroupDescribe,
    ApiKey::ShareFetch,
    ApiKey::ShareAcknowledge,
    ApiKey::DescribeShareGroupOffsets,
    ApiKey::AlterShareGroupOffsets,
    ApiKey::DeleteShareGroupOffsets,
];

/// What the per-version cases share.
struct Fixture {
    port: i32,
    /// Advertised (min, max) by API.
    versions: BTreeMap<i16, (i16, i16)>,
    /// 1 partition holding [`Fixture::messages`] at offsets 0..3.
    topic: String,
    topic_id: uuid::Uuid,
    messages: Vec<Message>,
    /// Produce cases append here; `produced` counts the records so far.
    produce_topic: String,
    produced: i64,
    /// DeleteRecords cases move its log start offset up, one record per case.
    delete_records_topic: String,
    /// AlterConfigs and IncrementalAlterConfigs cases change its configs.
    configs_topic: String,
    /// Producer ids InitProducerId handed out: each must be new.
    producer_ids: std::collections::HashSet<i64>,
}

impl Fixture {
    fn max_version(&self, key: ApiKey) -> i16 {
        self.versions.get(&(key as i16)).unwrap_or_else(|| panic!("{key:?} is not advertised")).1
    }
}

type CaseResult = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($message:tt)+) => {
        if !$cond {
            return Err(format!($($message)+));
        }
    };
}

fn call<R: kafka_protocol::protocol::Request>(
    client: &mut Client,
    version: i16,
    request: &R,
) -> Result<R::Response, String> {
    client.send(version, request).map_err(|e| e.to_string())
}

fn expect_code(what: &str, actual: i16, expected: i16) -> CaseResult {
    ensure!(actual == expected, "{what}: error code {actual}, expected {expected}");
    Ok(())
}

/// Runs every advertised version of every API that `wanted` selects; one failure does not stop
/// the others, and all are reported together.
fn exercise_every_version(wanted: impl Fn(ApiKey) -> bool) {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    let response = client.api_versions();
    let topic = "conformance".to_string();
    let topic_id = client.create_topic(&topic, 1, &[]);
    let messages =
        vec![Message::new("k0", "v0", 1_000), Message::new("k1", "v1", 1_001), Message::new("k2", "v2", 1_002)];
    assert_eq!(client.produce_ok(&topic, 0, batch(&messages)), 0);
    let mut fx = Fixture {
        port: broker.addr().port() as i32,
        versions: response.api_keys.iter().map(|a| (a.api_key, (a.min_version, a.max_version))).collect(),
        topic,
        topic_id,
        messages,
        produce_topic: "conformance-produce".into(),
        produced: 0,
        delete_records_topic: "conformance-delete-records".into(),
        configs_topic: "conformance-configs".into(),
        producer_ids: Default::default(),
    };
    client.create_topic(&fx.produce_topic, 1, &[]);
    client.create_topic(&fx.delete_records_topic, 1, &[]);
    let many: Vec<Message> = (0..10).map(|i| Message::new("k", &format!("v{i}"), 1_000 + i)).collect();
    client.produce_ok(&fx.delete_records_topic, 0, batch(&many));
    client.create_topic(&fx.configs_topic, 1, &[]);

    let mut failures = Vec::new();
    let mut checked = 0;
    let apis: Vec<(i16, (i16, i16))> = fx.versions.iter().map(|(k, v)| (*k, *v)).collect();
    for (key, (min, max)) in apis {
        let key = ApiKey::try_from(key).expect("advertised keys are known (checked elsewhere)");
        if !wanted(key) {
            continue;
        }
        // (Versions the crate cannot encode are exercised in share_groups.rs, over raw frames.)
        let max = if PAST_THE_CRATE.contains(&key) { max.min(key.valid_versions().max) } else { max };
        for version in min..=max {
            checked += 1;
            if let Err(why) = check_version(&mut client, &mut fx, key, version) {
                failures.push(format!("{key:?} v{version}: {why}"));
                // The broker may have closed the connection; carry on with a fresh one.
                client = broker.connect();
            }
        }
    }
    let mut broker = broker;
    broker.assert_running("after every API version");
    assert!(checked >= 10, "only {checked} API versions were exercised");
    assert!(
        failures.is_empty(),
        "{} of {checked} API versions failed:\n{}\n\nbroker log:\n{}",
        failures.len(),
        failures.join("\n"),
        broker.logs()
    );
}

#[test]
fn every_version_of_every_advertised_non_group_api_answers() {
    exercise_every_version(|key| !GROUP_APIS.contains(&key));
}

#[test]
fn every_version_of_every_advertised_group_api_answers() {
    exercise_every_version(|key| GROUP_APIS.contains(&key));
}

/// One minimal valid request of `key` at `version` and the checks on its response.
/// A KIP-848 member joining `group` (subscribed to the fixture's topic) at `version`; returns
/// its member id and epoch. v0 lets the broker name the member; v1 names it here.
fn consumer_join(client: &mut Client, fx: &Fixture, group: &str, version: i16) -> Result<(String, i32), String> {
    let member = if version >= 1 { uuid::Uuid::new_v4().to_string() } else { String::new() };
    let request = ConsumerGroupHeartbeatRequest::default()
        .with_group_id(group_id(group))
        .with_member_id(s(&member))
        .with_member_epoch(0)
        .with_rebalance_timeout_ms(30_000)
        .with_subscribed_topic_names(Some(vec![topic_name(&fx.topic)]));
    let response = call(client, version, &request)?;
    expect_code("join", response.error_code, code::NONE)?;
    let id = response.member_id.map(|m| m.to_string()).unwrap_or_default();
    ensure!(!id.is_empty() && (version == 0 || id == member), "member id {id:?}");
    ensure!(response.member_epoch >= 1, "epoch {}", response.member_epoch);
    let assignment = response.assignment.ok_or("no assignment")?;
    let ids: Vec<uuid::Uuid> = assignment.topic_partitions.iter().map(|t| t.topic_id).collect();
    ensure!(ids == vec![fx.topic_id], "assigned topics {ids:?}");
    Ok((id, response.member_epoch))
}

/// A share group member joining `group` (subscribed to the fixture's topic); returns its member
/// id and epoch.
fn share_join(client: &mut Client, fx: &Fixture, group: &str) -> Result<(String, i32), String> {
    let member = uuid::Uuid::new_v4().to_string();
    let request = ShareGroupHeartbeatRequest::default()
        .with_group_id(group_id(group))
        .with_member_id(s(&member))
        .with_member_epoch(0)
        .with_subscribed_topic_names(Some(vec![topic_name(&fx.topic)]));
    let response = call(client, 1, &request)?;
    expect_code("share join", response.error_code, code::NONE)?;
    ensure!(response.member_id.as_ref().map(|m| m.as_str()) == Some(member.as_str()), "member id");
    ensure!(response.member_epoch >= 1, "epoch {}", response.member_epoch);
    let assignment = response.assignment.ok_or("no assignment")?;
    let ids: Vec<uuid::Uuid> = assignment.topic_partitions.iter().map(|t| t.topic_id).collect();
    ensure!(ids == vec![fx.topic_id], "assigned topics {ids:?}");
    Ok((member, response.member_epoch))
}

/// A share group member's ShareGroupHeartbeat leaving `group`.
fn share_leave(client: &mut Client, group: &str, member: &str) -> CaseResult {
    let leave = ShareGroupHeartbeatRequest::default()
        .with_group_id(group_id(group))
        .with_member_id(s(member))
        .with_member_epoch(-1);
    let response = call(client, 1, &leave)?;
    expect_code("share leave", response.error_code, code::NONE)?;
    ensure!(response.member_epoch == -1, "leave epoch {}", response.member_epoch);
    Ok(())
}

/// Opens `member`'s share session on the fixture's partition (session epoch 0).
fn share_open_session(client: &mut Client, fx: &Fixture, group: &str, member: &str) -> CaseResult {
    let request = ShareFetchRequest::default()
        .with_group_id(Some(group_id(group)))
        .with_member_id(Some(s(member)))
        .with_share_session_epoch(0)
        .with_max_wait_ms(0)
        .with_max_records(10)
        .with_topics(vec![share_fetch_request::FetchTopic::default()
            .with_topic_id(fx.topic_id)
            .with_partitions(vec![share_fetch_request::FetchPartition::default().with_partition_index(0)])]);
    let response = call(client, 1, &request)?;
    expect_code("share fetch", response.error_code, code::NONE)?;
    for p in response.responses.iter().flat_map(|t| &t.partitions) {
        expect_code("share fetch partition", p.error_code, code::NONE)?;
    }
    Ok(())
}

fn check_version(client: &mut Client, fx: &mut Fixture, key: ApiKey, version: i16) -> CaseResult {
    match key {
        ApiKey::ApiVersions => {
            let request = if version >= 3 { api_versions_request() } else { ApiVersionsRequest::default() };
            let response = call(client, version, &request)?;
            expect_code("top level", response.error_code, code::NONE)?;
            ensure!(
                response.api_keys.iter().any(|a| a.api_key == ApiKey::ApiVersions as i16 && a.max_version >= version),
                "the list does not include ApiVersions v{version}"
            );
        }
        ApiKey::Metadata => {
            let request = MetadataRequest::default().with_topics(Some(vec![
                metadata_request::MetadataRequestTopic::default().with_name(Some(topic_name(&fx.topic))),
            ]));
            let response = call(client, version, &request)?;
            ensure!(response.brokers.len() == 1, "{} brokers", response.brokers.len());
            ensure!(response.brokers[0].port == fx.port, "broker port {}", response.brokers[0].port);
            ensure!(response.topics.len() == 1, "{} topics", response.topics.len());
            let topic = &response.topics[0];
            expect_code("topic", topic.error_code, code::NONE)?;
            ensure!(topic.partitions.len() == 1, "{} partitions", topic.partitions.len());
            expect_code("partition", topic.partitions[0].error_code, code::NONE)?;
            if version >= 10 {
                ensure!(topic.topic_id == fx.topic_id, "topic id {} instead of {}", topic.topic_id, fx.topic_id);
            }
        }
        ApiKey::InitProducerId => {
            let request = InitProducerIdRequest::default().with_transaction_timeout_ms(60_000);
            let request =
                if version >= 3 { request.with_producer_id(ProducerId(-1)).with_producer_epoch(-1) } else { request };
            let response = call(client, version, &request)?;
            expect_code("top level", response.error_code, code::NONE)?;
            ensure!(response.producer_id.0 >= 0, "producer id {}", response.producer_id.0);
            ensure!(response.producer_epoch == 0, "producer epoch {}", response.producer_epoch);
            ensure!(
                fx.producer_ids.insert(response.producer_id.0),
                "producer id {} given twice",
                response.producer_id.0
            );
        }
        // The transaction APIs, asked about a transactional id that was never initialized:
        // each version must decode and answer with the error Kafka gives.
        ApiKey::AddPartitionsToTxn => {
            let request = AddPartitionsToTxnRequest::default()
                .with_v3_and_below_transactional_id(TransactionalId(s("conformance-unknown-tx")))
                .with_v3_and_below_producer_id(ProducerId(12345))
                .with_v3_and_below_producer_epoch(0)
                .with_v3_and_below_topics(vec![add_partitions_to_txn_request::AddPartitionsToTxnTopic::default()
                    .with_name(topic_name(&fx.topic))
                    .with_partitions(vec![0])]);
            let response = call(client, version, &request)?;
            let result = response
                .results_by_topic_v3_and_below
                .first()
                .and_then(|t| t.results_by_partition.first())
                .ok_or("no partition result")?;
            expect_code("partition", result.partition_error_code, code::INVALID_PRODUCER_ID_MAPPING)?;
        }
        ApiKey::AddOffsetsToTxn => {
            let request = AddOffsetsToTxnRequest::default()
                .with_transactional_id(TransactionalId(s("conformance-unknown-tx")))
                .with_producer_id(ProducerId(12345))
                .with_group_id(group_id("conformance-txn-group"));
            let response = call(client, version, &request)?;
            expect_code("top level", response.error_code, code::INVALID_PRODUCER_ID_MAPPING)?;
        }
        ApiKey::EndTxn => {
            let request = EndTxnRequest::default()
                .with_transactional_id(TransactionalId(s("conformance-unknown-tx")))
                .with_producer_id(ProducerId(12345))
                .with_committed(true);
            let response = call(client, version, &request)?;
            expect_code("top level", response.error_code, code::INVALID_PRODUCER_ID_MAPPING)?;
        }
        ApiKey::TxnOffsetCommit => {
            let request = TxnOffsetCommitRequest::default()
                .with_transactional_id(TransactionalId(s("conformance-unknown-tx")))
                .with_group_id(group_id("conformance-txn-group"))
                .with_producer_id(ProducerId(12345))
                .with_generation_id(-1)
                .with_topics(vec![txn_offset_commit_request::TxnOffsetCommitRequestTopic::default()
                    .with_name(topic_name(&fx.topic))
                    .with_partitions(vec![txn_offset_commit_request::TxnOffsetCommitRequestPartition::default()
                        .with_partition_index(0)
                        .with_committed_offset(1)])]);
            let response = call(client, version, &request)?;
            let partition = response.topics.first().and_then(|t| t.partitions.first()).ok_or("no partition result")?;
            expect_code("partition", partition.error_code, code::INVALID_PRODUCER_ID_MAPPING)?;
        }
        ApiKey::DescribeTransactions => {
            let request = DescribeTransactionsRequest::default()
                .with_transactional_ids(vec![TransactionalId(s("conformance-unknown-tx"))]);
            let response = call(client, version, &request)?;
            let state = response.transaction_states.first().ok_or("no transaction state")?;
            expect_code("transaction", state.error_code, code::TRANSACTIONAL_ID_NOT_FOUND)?;
        }
        ApiKey::ListTransactions => {
            let request = ListTransactionsRequest::default().with_state_filters(vec![s("Ongoing"), s("NoSuchState")]);
            let response = call(client, version, &request)?;
            expect_code("top level", response.error_code, code::NONE)?;
            ensure!(
                response.unknown_state_filters.iter().map(|f| f.as_str()).collect::<Vec<_>>() == ["NoSuchState"],
                "unknown state filters {:?}",
                response.unknown_state_filters
            );
        }
        ApiKey::Produce => {
            let message = Message::new("produce", &format!("v{version}"), 10_000 + version as i64);
            let response = call(client, version, &produce_request(&fx.produce_topic, 0, batch(&[message]), 1))?;
            let partition = response
                .responses
                .first()
                .and_then(|t| t.partition_responses.first())
                .ok_or("no partition in the response")?;
            expect_code("partition", partition.error_code, code::NONE)?;
            ensure!(
                partition.base_offset == fx.produced,
                "base offset {} instead of {}",
                partition.base_offset,
                fx.produced
            );
            fx.produced += 1;
        }
        ApiKey::Fetch => {
            let topic = if version >= 13 {
                fetch_topic_by_id(fx.topic_id, 0, 0, 1 << 20)
            } else {
                fetch_topic_by_name(&fx.topic, 0, 0, 1 << 20)
            };
            let response = call(client, version, &fetch_request(0, 0, 1 << 20).with_topics(vec![topic]))?;
            if version >= 7 {
                expect_code("top level", response.error_code, code::NONE)?;
            }
            let topic = response.responses.first().ok_or("no topic in the response")?;
            if version >= 13 {
                ensure!(topic.topic_id == fx.topic_id, "topic id {}", topic.topic_id);
            } else {
                ensure!(topic.topic.0.as_str() == fx.topic, "topic {:?}", topic.topic.0.as_str());
            }
            let partition = topic.partitions.first().ok_or("no partition in the response")?;
            expect_code("partition", partition.error_code, code::NONE)?;
            ensure!(partition.high_watermark == 3, "high watermark {}", partition.high_watermark);
            let records = decode_records(partition.records.clone().unwrap_or_default());
            ensure!(records.len() == 3, "{} records fetched", records.len());
            for (record, message) in records.iter().zip(&fx.messages) {
                ensure!(record.value == message.value, "record {} differs", record.offset);
            }
        }
        ApiKey::ListOffsets => {
            let request = ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![
                list_offsets_request::ListOffsetsTopic::default().with_name(topic_name(&fx.topic)).with_partitions(
                    vec![list_offsets_request::ListOffsetsPartition::default()
                        .with_partition_index(0)
                        .with_timestamp(-1)],
                ),
            ]);
            let response = call(client, version, &request)?;
            let partition = response.topics.first().and_then(|t| t.partitions.first()).ok_or("no partition")?;
            expect_code("partition", partition.error_code, code::NONE)?;
            ensure!(partition.offset == 3, "latest offset {}", partition.offset);
        }
        ApiKey::OffsetForLeaderEpoch => {
            let request = OffsetForLeaderEpochRequest::default().with_topics(vec![
                offset_for_leader_epoch_request::OffsetForLeaderTopic::default()
                    .with_topic(topic_name(&fx.topic))
                    .with_partitions(vec![offset_for_leader_epoch_request::OffsetForLeaderPartition::default()
                        .with_partition(0)
                        .with_current_leader_epoch(-1)
                        .with_leader_epoch(0)]),
            ]);
            let response = call(client, version, &request)?;
            let partition = response.topics.first().and_then(|t| t.partitions.first()).ok_or("no partition")?;
            expect_code("partition", partition.error_code, code::NONE)?;
            ensure!(partition.end_offset == 3, "end offset {}", partition.end_offset);
        }
        ApiKey::CreateTopics => {
            let name = unique(&format!("conformance-create-v{version}"));
            let response = call(client, version, &create_topics_request(&name, 2, 1, &[("retention.ms", "3600000")]))?;
            let topic = response.topics.first().ok_or("no topic in the response")?;
            expect_code("topic", topic.error_code, code::NONE)?;
            ensure!(topic.name.0.as_str() == name, "topic name {:?}", topic.name.0.as_str());
            if version >= 5 {
                ensure!(topic.num_partitions == 2, "num_partitions {}", topic.num_partitions);
                ensure!(topic.replication_factor == 1, "replication_factor {}", topic.replication_factor);
            }
            if version >= 7 {
                ensure!(!topic.topic_id.is_nil(), "nil topic id");
            }
        }
        ApiKey::DeleteTopics => {
            let name = unique(&format!("conformance-delete-v{version}"));
            client.create_topic(&name, 1, &[]);
            let request = if version >= 6 {
                DeleteTopicsRequest::default().with_topics(vec![
                    delete_topics_request::DeleteTopicState::default().with_name(Some(topic_name(&name)))
                ])
            } else {
                DeleteTopicsRequest::default().with_topic_names(vec![topic_name(&name)])
            }
            .with_timeout_ms(10_000);
            let response = call(client, version, &request)?;
            let result = response.responses.first().ok_or("no topic in the response")?;
            expect_code("topic", result.error_code, code::NONE)?;
        }
        ApiKey::CreatePartitions => {
            let name = unique(&format!("conformance-partitions-v{version}"));
            client.create_topic(&name, 1, &[]);
            let request = CreatePartitionsRequest::default().with_timeout_ms(10_000).with_topics(vec![
                create_partitions_request::CreatePartitionsTopic::default().with_name(topic_name(&name)).with_count(3),
            ]);
            let response = call(client, version, &request)?;
            let result = response.results.first().ok_or("no topic in the response")?;
            expect_code("topic", result.error_code, code::NONE)?;
        }
        ApiKey::DeleteRecords => {
            // Versions are checked in order: each moves the start up by one.
            let before = version as i64 + 1;
            let request = DeleteRecordsRequest::default().with_timeout_ms(10_000).with_topics(vec![
                delete_records_request::DeleteRecordsTopic::default()
                    .with_name(topic_name(&fx.delete_records_topic))
                    .with_partitions(vec![delete_records_request::DeleteRecordsPartition::default()
                        .with_partition_index(0)
                        .with_offset(before)]),
            ]);
            let response = call(client, version, &request)?;
            let partition = response.topics.first().and_then(|t| t.partitions.first()).ok_or("no partition")?;
            expect_code("partition", partition.error_code, code::NONE)?;
            ensure!(partition.low_watermark == before, "low watermark {} instead of {before}", partition.low_watermark);
        }
        ApiKey::DescribeConfigs => {
            let request = DescribeConfigsRequest::default().with_resources(vec![
                describe_configs_request::DescribeConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(s(&fx.topic))
                    .with_configuration_keys(None),
            ]);
            let response = call(client, version, &request)?;
            let result = response.results.first().ok_or("no resource in the response")?;
            expect_code("resource", result.error_code, code::NONE)?;
            for name in ["retention.ms", "max.message.bytes", "cleanup.policy"] {
                ensure!(result.configs.iter().any(|c| c.name.as_str() == name), "{name} is not described");
            }
        }
        ApiKey::AlterConfigs => {
            let request = AlterConfigsRequest::default().with_resources(vec![
                alter_configs_request::AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(s(&fx.configs_topic))
                    .with_configs(vec![alter_configs_request::AlterableConfig::default()
                        .with_name(s("retention.ms"))
                        .with_value(Some(s(&format!("{}", 3_600_000 + version as i64))))]),
            ]);
            let response = call(client, version, &request)?;
            let result = response.responses.first().ok_or("no resource in the response")?;
            expect_code("resource", result.error_code, code::NONE)?;
        }
        ApiKey::IncrementalAlterConfigs => {
            let request = IncrementalAlterConfigsRequest::default().with_resources(vec![
                incremental_alter_configs_request::AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(s(&fx.configs_topic))
                    .with_configs(vec![incremental_alter_configs_request::AlterableConfig::default()
                        .with_name(s("segment.ms"))
                        .with_config_operation(0)
                        .with_value(Some(s(&format!("{}", 7_200_000 + version as i64))))]),
            ]);
            let response = call(client, version, &request)?;
            let result = response.responses.first().ok_or("no resource in the response")?;
            expect_code("resource", result.error_code, code::NONE)?;
        }
        ApiKey::DescribeLogDirs => {
            let response = call(client, version, &DescribeLogDirsRequest::default().with_topics(None))?;
            if version >= 3 {
                expect_code("top level", response.error_code, code::NONE)?;
            }
            let dir = response.results.first().ok_or("no log dir")?;
            expect_code("log dir", dir.error_code, code::NONE)?;
            let topic =
                dir.topics.iter().find(|t| t.name.0.as_str() == fx.topic).ok_or("the fixture topic is not listed")?;
            ensure!(
                topic.partitions.first().is_some_and(|p| p.partition_size > 0),
                "partition size: {:?}",
                topic.partitions
            );
        }
        ApiKey::DescribeCluster => {
            let response = call(client, version, &DescribeClusterRequest::default())?;
            expect_code("top level", response.error_code, code::NONE)?;
            ensure!(!response.cluster_id.as_str().is_empty(), "empty cluster id");
            ensure!(
                response.brokers.len() == 1 && response.brokers[0].port == fx.port,
                "brokers {:?}",
                response.brokers
            );
        }
        ApiKey::DescribeQuorum => {
            use kafka_protocol::messages::describe_quorum_request::{PartitionData, TopicData};
            let request = DescribeQuorumRequest::default().with_topics(vec![TopicData::default()
                .with_topic_name(TopicName(s("__cluster_metadata")))
                .with_partitions(vec![PartitionData::default().with_partition_index(0)])]);
            let response = call(client, version, &request)?;
            expect_code("top level", response.error_code, code::NONE)?;
            let p = response.topics.first().and_then(|t| t.partitions.first()).ok_or("no partition")?;
            expect_code("partition", p.error_code, code::NONE)?;
            ensure!(p.leader_id.0 == 0 && p.leader_epoch >= 1 && p.high_watermark > 0, "{p:?}");
            ensure!(
                p.current_voters.len() == 1
                    && p.current_voters[0].replica_id.0 == 0
                    && p.current_voters[0].log_end_offset >= p.high_watermark
                    && p.observers.is_empty(),
                "voters {:?}, observers {:?}",
                p.current_voters,
                p.observers
            );
            let elsewhere = call(client, version, &DescribeQuorumRequest::default())?;
            expect_code("no topic", elsewhere.error_code, code::UNKNOWN_TOPIC_OR_PARTITION)?;
        }
        ApiKey::ElectLeaders => {
            // One node leads everything already: a preferred election has nothing to do, and
            // an unknown partition says so.
            use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
            let request = ElectLeadersRequest::default().with_timeout_ms(10_000).with_topic_partitions(Some(vec![
                TopicPartitions::default().with_topic(TopicName(s(&fx.produce_topic))).with_partitions(vec![0, 7]),
            ]));
            let response = call(client, version, &request)?;
            expect_code("top level", response.error_code, code::NONE)?;
            let results =
                &response.replica_election_results.first().ok_or("no topic in the response")?.partition_result;
            let by_partition: Vec<(i32, i16)> = results.iter().map(|p| (p.partition_id, p.error_code)).collect();
            ensure!(
                by_partition == vec![(0, code::ELECTION_NOT_NEEDED), (7, code::UNKNOWN_TOPIC_OR_PARTITION)],
                "{by_partition:?}"
            );
        }
        ApiKey::AlterPartitionReassignments => {
            // Node 0 holds the only replica: moving it onto itself changes nothing, cancelling
            // finds no move, a broker that does not exist is refused, as is an unknown partition.
            use kafka_protocol::messages::alter_partition_reassignments_request::{
                ReassignablePartition, ReassignableTopic,
            };
            let moves = |partitions: Vec<(i32, Option<Vec<i32>>)>| {
                let partitions = partitions
                    .into_iter()
                    .map(|(p, replicas)| {
                        ReassignablePartition::default()
                            .with_partition_index(p)
                            .with_replicas(replicas.map(|r| r.into_iter().map(BrokerId).collect()))
                    })
                    .collect();
                AlterPartitionReassignmentsRequest::default().with_timeout_ms(10_000).with_topics(vec![
                    ReassignableTopic::default().with_name(TopicName(s(&fx.produce_topic))).with_partitions(partitions),
                ])
            };
            let request = moves(vec![(0, Some(vec![0])), (0, None), (0, Some(vec![0, 42])), (7, Some(vec![0]))]);
            let response = call(client, version, &request)?;
            expect_code("top level", response.error_code, code::NONE)?;
            let results: Vec<i16> =
                response.responses.iter().flat_map(|t| &t.partitions).map(|p| p.error_code).collect();
            ensure!(
                results
                    == vec![
                        code::NONE,
                        code::NO_REASSIGNMENT_IN_PROGRESS,
                        code::INVALID_REPLICA_ASSIGNMENT,
                        code::UNKNOWN_TOPIC_OR_PARTITION
                    ],
                "{results:?}"
            );
        }
        ApiKey::ListPartitionReassignments => {
            let response =
                call(client, version, &ListPartitionReassignmentsRequest::default().with_timeout_ms(10_000))?;
            expect_code("top level", response.error_code, code::NONE)?;
            ensure!(response.topics.is_empty(), "nothing moves on one node: {:?}", response.topics);
        }
        // ----- security (this broker's listener is PLAINTEXT) -----
        ApiKey::SaslHandshake => {
            let response = call(client, version, &SaslHandshakeRequest::default().with_mechanism(s("PLAIN")))?;
            expect_code("no SASL on a PLAINTEXT listener", response.error_code, 33)?;
        }
        ApiKey::SaslAuthenticate => {
            let request = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from_static(b"\0u\0p"));
            let response = call(client, version, &request)?;
            expect_code("no SASL exchange to take part in", response.error_code, 34)?;
        }
        ApiKey::AlterUserScramCredentials => {
            use kafka_protocol::messages::alter_user_scram_credentials_request::ScramCredentialUpsertion;
            let user = unique("conformance-user");
            let upsert = |iterations| {
                ScramCredentialUpsertion::default()
                    .with_name(s(&user))
                    .with_mechanism(1)
                    .with_iterations(iterations)
                    .with_salt(Bytes::from_static(b"0123456789abcdef"))
                    .with_salted_password(Bytes::from(vec![7u8; 32]))
            };
            let response = call(
                client,
                version,
                &AlterUserScramCredentialsRequest::default().with_upsertions(vec![upsert(4096)]),
            )?;
            let result = response.results.first().ok_or("no result")?;
            expect_code("upsert", result.error_code, code::NONE)?;
            let response =
                call(client, version, &AlterUserScramCredentialsRequest::default().with_upsertions(vec![upsert(10)]))?;
            let result = response.results.first().ok_or("no result")?;
            expect_code("too few iterations (UNACCEPTABLE_CREDENTIAL)", result.error_code, 93)?;
        }
        ApiKey::DescribeUserScramCredentials => {
            use kafka_protocol::messages::describe_user_scram_credentials_request::UserName;
            let unknown = unique("conformance-nobody");
            let request = DescribeUserScramCredentialsRequest::default()
                .with_users(Some(vec![UserName::default().with_name(s(&unknown))]));
            let response = call(client, version, &request)?;
            expect_code("top level", response.error_code, code::NONE)?;
            let result = response.results.first().ok_or("no result")?;
            expect_code("an unknown user", result.error_code, 91)?;
        }
        ApiKey::CreateAcls | ApiKey::DescribeAcls | ApiKey::DeleteAcls => {
            // At every version of each: create two ACLs on a fresh topic name (one refused: no
            // `User:` in its principal), describe them back, delete them. (A filter's principal
            // and host are null to match any: "" names the empty principal.)
            use kafka_protocol::messages::create_acls_request::AclCreation;
            use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
            let topic = unique("conformance-acl");
            let creation = |principal: &str| {
                AclCreation::default()
                    .with_resource_type(2)
                    .with_resource_name(s(&topic))
                    .with_resource_pattern_type(3)
                    .with_principal(s(principal))
                    .with_host(s("*"))
                    .with_operation(3)
                    .with_permission_type(3)
            };
            let create_version = if key == ApiKey::CreateAcls { version } else { 1 };
            let created = call(
                client,
                create_version,
                &CreateAclsRequest::default().with_creations(vec![creation("User:conformance"), creation("nobody")]),
            )?;
            ensure!(created.results.len() == 2, "one result per creation");
            expect_code("a good ACL", created.results[0].error_code, code::NONE)?;
            expect_code("a principal without User:", created.results[1].error_code, code::INVALID_REQUEST)?;
            let describe_version = if key == ApiKey::DescribeAcls { version } else { 1 };
            let described = call(
                client,
                describe_version,
                &DescribeAclsRequest::default()
                    .with_resource_type_filter(2)
                    .with_resource_name_filter(Some(s(&topic)))
                    .with_pattern_type_filter(3)
                    .with_principal_filter(None)
                    .with_host_filter(None)
                    .with_operation(1)
                    .with_permission_type(1),
            )?;
            expect_code("describe", described.error_code, code::NONE)?;
            let acls: Vec<&str> =
                described.resources.iter().flat_map(|r| r.acls.iter().map(|a| a.principal.as_str())).collect();
            ensure!(acls == ["User:conformance"], "described {acls:?}");
            let delete_version = if key == ApiKey::DeleteAcls { version } else { 1 };
            let filter = DeleteAclsFilter::default()
                .with_resource_type_filter(2)
                .with_resource_name_filter(Some(s(&topic)))
                .with_pattern_type_filter(3)
                .with_principal_filter(None)
                .with_host_filter(None)
                .with_operation(1)
                .with_permission_type(1);
            let deleted = call(client, delete_version, &DeleteAclsRequest::default().with_filters(vec![filter]))?;
            let result = deleted.filter_results.first().ok_or("no filter result")?;
            expect_code("delete", result.error_code, code::NONE)?;
            ensure!(result.matching_acls.len() == 1, "deleted {} ACLs", result.matching_acls.len());
        }
        ApiKey::DescribeClientQuotas | ApiKey::AlterClientQuotas => {
            // At every version of each: set a quota on a fresh client id (a second entry with a
            // key no entity takes fails alone), describe it back by an exact filter, remove it.
            use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
            use kafka_protocol::messages::describe_client_quotas_request::ComponentData;
            let client_id = unique("conformance-quota");
            let entry = |key: &str, value: f64, remove: bool| {
                EntryData::default()
                    .with_entity(vec![EntityData::default()
                        .with_entity_type(s("client-id"))
                        .with_entity_name(Some(s(&client_id)))])
                    .with_ops(vec![OpData::default().with_key(s(key)).with_value(value).with_remove(remove)])
            };
            let alter_version = if key == ApiKey::AlterClientQuotas { version } else { 0 };
            let altered = call(
                client,
                alter_version,
                &AlterClientQuotasRequest::default()
                    .with_entries(vec![entry("producer_byte_rate", 1048576.0, false), entry("bogus", 1.0, false)]),
            )?;
            ensure!(altered.entries.len() == 2, "one result per entry");
            expect_code("a good quota", altered.entries[0].error_code, code::NONE)?;
            expect_code("an unknown key", altered.entries[1].error_code, code::INVALID_REQUEST)?;
            let describe_version = if key == ApiKey::DescribeClientQuotas { version } else { 0 };
            let described = call(
                client,
                describe_version,
                &DescribeClientQuotasRequest::default().with_strict(true).with_components(vec![
                    ComponentData::default()
                        .with_entity_type(s("client-id"))
                        .with_match_type(0)
                        .with_match(Some(s(&client_id))),
                ]),
            )?;
            expect_code("describe", described.error_code, code::NONE)?;
            let values: Vec<(String, f64)> = described
                .entries
                .iter()
                .flatten()
                .flat_map(|e| e.values.iter().map(|v| (v.key.to_string(), v.value)))
                .collect();
            ensure!(values == [("producer_byte_rate".to_string(), 1048576.0)], "described {values:?}");
            let removed = call(
                client,
                alter_version,
                &AlterClientQuotasRequest::default().with_entries(vec![entry("producer_byte_rate", 0.0, true)]),
            )?;
            expect_code("remove", removed.entries[0].error_code, code::NONE)?;
        }
        ApiKey::UnregisterBroker => {
            // An id nobody registered is unknown; the only broker, a running voter, stays.
            let unknown = call(client, version, &UnregisterBrokerRequest::default().with_broker_id(BrokerId(42)))?;
            expect_code("unknown broker", unknown.error_code, code::BROKER_ID_NOT_REGISTERED)?;
            let itself = call(client, version, &UnregisterBrokerRequest::default().with_broker_id(BrokerId(0)))?;
            expect_code("the running broker", itself.error_code, code::INVALID_REQUEST)?;
            let message = itself.error_message.as_ref().map(|m| m.to_string()).unwrap_or_default();
            ensure!(message.contains("broker 0"), "the refusal says why: {message:?}");
        }
        // ----- groups -----
        ApiKey::FindCoordinator => {
            let group = unique("conformance-find");
            let response = if version >= 4 {
                call(client, version, &FindCoordinatorRequest::default().with_coordinator_keys(vec![s(&group)]))?
            } else {
                call(client, version, &FindCoordinatorRequest::default().with_key(s(&group)))?
            };
            let (error, node, port) = if version >= 4 {
                let c = response.coordinators.first().ok_or("no coordinator in the response")?;
                ensure!(c.key.as_str() == group, "coordinator key {:?}", c.key.as_str());
                (c.error_code, c.node_id.0, c.port)
            } else {
                (response.error_code, response.node_id.0, response.port)
            };
            expect_code("coordinator", error, code::NONE)?;
            ensure!(node == 0 && port == fx.port, "coordinator node {node} port {port}");
        }
        ApiKey::JoinGroup => {
            let group = unique("conformance-join");
            let first = call(client, version, &join_request(&group, ""))?;
            let joined = if version >= 4 {
                // KIP-394: a new member first gets its id.
                expect_code("first join", first.error_code, code::MEMBER_ID_REQUIRED)?;
                ensure!(!first.member_id.is_empty(), "MEMBER_ID_REQUIRED without a member id");
                call(client, version, &join_request(&group, first.member_id.as_str()))?
            } else {
                first
            };
            expect_code("join", joined.error_code, code::NONE)?;
            ensure!(joined.generation_id >= 1, "generation {}", joined.generation_id);
            ensure!(!joined.member_id.is_empty() && joined.leader == joined.member_id, "the only member leads");
            ensure!(joined.members.len() == 1, "the leader sees {} members", joined.members.len());
        }
        ApiKey::SyncGroup => {
            let group = unique("conformance-sync");
            let (member, generation) = join(client, fx, &group)?;
            let assignment = Bytes::from_static(b"assignment");
            let mut request = SyncGroupRequest::default()
                .with_group_id(group_id(&group))
                .with_generation_id(generation)
                .with_member_id(s(&member))
                .with_assignments(vec![sync_group_request::SyncGroupRequestAssignment::default()
                    .with_member_id(s(&member))
                    .with_assignment(assignment.clone())]);
            if version >= 5 {
                request = request.with_protocol_type(Some(s("consumer"))).with_protocol_name(Some(s("range")));
            }
            let response = call(client, version, &request)?;
            expect_code("sync", response.error_code, code::NONE)?;
            ensure!(response.assignment == assignment, "assignment {:?}", response.assignment);
        }
        ApiKey::Heartbeat => {
            let group = unique("conformance-heartbeat");
            let (member, generation) = join_and_sync(client, fx, &group)?;
            let request = HeartbeatRequest::default()
                .with_group_id(group_id(&group))
                .with_generation_id(generation)
                .with_member_id(s(&member));
            expect_code("heartbeat", call(client, version, &request)?.error_code, code::NONE)?;
        }
        ApiKey::LeaveGroup => {
            let group = unique("conformance-leave");
            let (member, _) = join_and_sync(client, fx, &group)?;
            let request = if version >= 3 {
                LeaveGroupRequest::default()
                    .with_group_id(group_id(&group))
                    .with_members(vec![leave_group_request::MemberIdentity::default().with_member_id(s(&member))])
            } else {
                LeaveGroupRequest::default().with_group_id(group_id(&group)).with_member_id(s(&member))
            };
            let response = call(client, version, &request)?;
            expect_code("leave", response.error_code, code::NONE)?;
            if version >= 3 {
                let m = response.members.first().ok_or("no member in the response")?;
                expect_code("member", m.error_code, code::NONE)?;
            }
        }
        ApiKey::OffsetCommit => {
            let group = unique("conformance-commit");
            let response = call(client, version, &commit_request(&group, &fx.topic, 2))?;
            let partition = response.topics.first().and_then(|t| t.partitions.first()).ok_or("no partition")?;
            expect_code("partition", partition.error_code, code::NONE)?;
        }
        ApiKey::OffsetFetch => {
            let group = unique("conformance-offset-fetch");
            commit(client, fx, &group)?;
            let (error, offset) = if version >= 8 {
                let request = OffsetFetchRequest::default().with_groups(vec![
                    offset_fetch_request::OffsetFetchRequestGroup::default()
                        .with_group_id(group_id(&group))
                        .with_topics(Some(vec![offset_fetch_request::OffsetFetchRequestTopics::default()
                            .with_name(topic_name(&fx.topic))
                            .with_partition_indexes(vec![0])])),
                ]);
                let response = call(client, version, &request)?;
                let g = response.groups.first().ok_or("no group in the response")?;
                expect_code("group", g.error_code, code::NONE)?;
                let p = g.topics.first().and_then(|t| t.partitions.first()).ok_or("no partition")?;
                (p.error_code, p.committed_offset)
            } else {
                let request = OffsetFetchRequest::default().with_group_id(group_id(&group)).with_topics(Some(vec![
                    offset_fetch_request::OffsetFetchRequestTopic::default()
                        .with_name(topic_name(&fx.topic))
                        .with_partition_indexes(vec![0]),
                ]));
                let response = call(client, version, &request)?;
                if version >= 2 {
                    expect_code("top level", response.error_code, code::NONE)?;
                }
                let p = response.topics.first().and_then(|t| t.partitions.first()).ok_or("no partition")?;
                (p.error_code, p.committed_offset)
            };
            expect_code("partition", error, code::NONE)?;
            ensure!(offset == 2, "committed offset {offset}, expected 2");
            if version >= 9 {
                // A consumer-protocol member fetches under its current epoch; an admin (-1) freely.
                let group = unique("conformance-offset-fetch-member");
                let (member, epoch) = consumer_join(client, fx, &group, 1)?;
                for (who, member_epoch, expected) in [
                    (member.as_str(), epoch, code::NONE),
                    (member.as_str(), epoch - 1, code::STALE_MEMBER_EPOCH),
                    (member.as_str(), epoch + 1, code::FENCED_MEMBER_EPOCH),
                    ("someone-else", epoch, code::UNKNOWN_MEMBER_ID),
                    ("", -1, code::NONE),
                ] {
                    let request = OffsetFetchRequest::default().with_groups(vec![
                        offset_fetch_request::OffsetFetchRequestGroup::default()
                            .with_group_id(group_id(&group))
                            .with_member_id(Some(s(who)))
                            .with_member_epoch(member_epoch)
                            .with_topics(None),
                    ]);
                    let response = call(client, version, &request)?;
                    let g = response.groups.first().ok_or("no group in the response")?;
                    expect_code(&format!("fetch by {who:?} at epoch {member_epoch}"), g.error_code, expected)?;
                }
            }
        }
        ApiKey::DescribeGroups => {
            let group = unique("conformance-describe");
            let (member, _) = join_and_sync(client, fx, &group)?;
            let response =
                call(client, version, &DescribeGroupsRequest::default().with_groups(vec![group_id(&group)]))?;
            let g = response.groups.first().ok_or("no group in the response")?;
            expect_code("group", g.error_code, code::NONE)?;
            ensure!(g.group_state.as_str() == "Stable", "state {:?}", g.group_state.as_str());
            ensure!(g.protocol_type.as_str() == "consumer" && g.protocol_data.as_str() == "range", "protocol {:?}", g);
            ensure!(g.members.len() == 1 && g.members[0].member_id.as_str() == member, "members {:?}", g.members);
        }
        ApiKey::ListGroups => {
            let group = unique("conformance-list");
            join_and_sync(client, fx, &group)?;
            let response = call(client, version, &ListGroupsRequest::default())?;
            expect_code("top level", response.error_code, code::NONE)?;
            ensure!(response.groups.iter().any(|g| g.group_id.0.as_str() == group), "{group} is not listed");
        }
        ApiKey::ConsumerGroupHeartbeat => {
            let group = unique("conformance-consumer-heartbeat");
            let (member, epoch) = consumer_join(client, fx, &group, version)?;
            let leave = ConsumerGroupHeartbeatRequest::default()
                .with_group_id(group_id(&group))
                .with_member_id(s(&member))
                .with_member_epoch(-1)
                .with_rebalance_timeout_ms(-1);
            let response = call(client, version, &leave)?;
            expect_code("leave", response.error_code, code::NONE)?;
            ensure!(response.member_epoch == -1, "leave epoch {} (was {epoch})", response.member_epoch);
        }
        ApiKey::ConsumerGroupDescribe => {
            let group = unique("conformance-consumer-describe");
            let (member, epoch) = consumer_join(client, fx, &group, 1)?;
            let request = ConsumerGroupDescribeRequest::default().with_group_ids(vec![group_id(&group)]);
            let response = call(client, version, &request)?;
            let g = response.groups.first().ok_or("no group in the response")?;
            expect_code("group", g.error_code, code::NONE)?;
            ensure!(
                g.group_epoch == epoch && g.assignment_epoch == epoch,
                "epochs {} {}",
                g.group_epoch,
                g.assignment_epoch
            );
            ensure!(g.members.len() == 1 && g.members[0].member_id.as_str() == member, "members {:?}", g.members);
            ensure!(g.members[0].member_epoch == epoch, "member epoch {}", g.members[0].member_epoch);
        }
        ApiKey::ShareGroupHeartbeat => {
            let group = unique("conformance-share-heartbeat");
            let (member, epoch) = share_join(client, fx, &group)?;
            let beat = ShareGroupHeartbeatRequest::default()
                .with_group_id(group_id(&group))
                .with_member_id(s(&member))
                .with_member_epoch(epoch);
            let response = call(client, version, &beat)?;
            expect_code("heartbeat", response.error_code, code::NONE)?;
            ensure!(response.member_epoch == epoch, "epoch {} (was {epoch})", response.member_epoch);
            share_leave(client, &group, &member)?;
        }
        ApiKey::ShareGroupDescribe => {
            let group = unique("conformance-share-describe");
            let (member, epoch) = share_join(client, fx, &group)?;
            let request = ShareGroupDescribeRequest::default().with_group_ids(vec![group_id(&group)]);
            let response = call(client, version, &request)?;
            let g = response.groups.first().ok_or("no group in the response")?;
            expect_code("group", g.error_code, code::NONE)?;
            ensure!(
                g.group_epoch == epoch && g.assignment_epoch == epoch,
                "epochs {} {}",
                g.group_epoch,
                g.assignment_epoch
            );
            ensure!(g.members.len() == 1 && g.members[0].member_id.as_str() == member, "members {:?}", g.members);
            ensure!(g.assignor_name.as_str() == "simple", "assignor {}", g.assignor_name.as_str());
        }
        ApiKey::ShareFetch => {
            let group = unique("conformance-share-fetch");
            let (member, _) = share_join(client, fx, &group)?;
            share_open_session(client, fx, &group, &member)?;
            // The next epoch is 1; 5 is refused.
            let request = ShareFetchRequest::default()
                .with_group_id(Some(group_id(&group)))
                .with_member_id(Some(s(&member)))
                .with_share_session_epoch(5);
            let response = call(client, version, &request)?;
            expect_code("wrong epoch", response.error_code, 123)?;
            share_leave(client, &group, &member)?;
        }
        ApiKey::ShareAcknowledge => {
            let group = unique("conformance-share-ack");
            let (member, _) = share_join(client, fx, &group)?;
            share_open_session(client, fx, &group, &member)?;
            let ack = |epoch| {
                ShareAcknowledgeRequest::default()
                    .with_group_id(Some(group_id(&group)))
                    .with_member_id(Some(s(&member)))
                    .with_share_session_epoch(epoch)
            };
            let response = call(client, version, &ack(1))?;
            expect_code("ack", response.error_code, code::NONE)?;
            let response = call(client, version, &ack(-1))?;
            expect_code("closing ack", response.error_code, code::NONE)?;
            share_leave(client, &group, &member)?;
        }
        ApiKey::DescribeShareGroupOffsets => {
            let group = unique("conformance-share-offsets");
            let (member, _) = share_join(client, fx, &group)?;
            share_open_session(client, fx, &group, &member)?;
            let request = DescribeShareGroupOffsetsRequest::default().with_groups(vec![
                describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup::default()
                    .with_group_id(group_id(&group))
                    .with_topics(Some(vec![
                        describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestTopic::default()
                            .with_topic_name(topic_name(&fx.topic))
                            .with_partitions(vec![0]),
                    ])),
            ]);
            let response = call(client, version, &request)?;
            let g = response.groups.first().ok_or("no group")?;
            expect_code("group", g.error_code, code::NONE)?;
            let p = g.topics.first().and_then(|t| t.partitions.first()).ok_or("no partition")?;
            expect_code("partition", p.error_code, code::NONE)?;
            // A new share group starts at the end (share.auto.offset.reset latest).
            ensure!(p.start_offset == fx.messages.len() as i64, "start offset {}", p.start_offset);
            share_leave(client, &group, &member)?;
        }
        ApiKey::AlterShareGroupOffsets => {
            let group = unique("conformance-share-alter");
            let (member, _) = share_join(client, fx, &group)?;
            share_open_session(client, fx, &group, &member)?;
            let request = AlterShareGroupOffsetsRequest::default().with_group_id(group_id(&group)).with_topics(vec![
                alter_share_group_offsets_request::AlterShareGroupOffsetsRequestTopic::default()
                    .with_topic_name(topic_name(&fx.topic))
                    .with_partitions(vec![
                        alter_share_group_offsets_request::AlterShareGroupOffsetsRequestPartition::default()
                            .with_partition_index(0)
                            .with_start_offset(1),
                    ]),
            ]);
            let response = call(client, version, &request)?;
            expect_code("while a member is in", response.error_code, 68)?;
            share_leave(client, &group, &member)?;
            let response = call(client, version, &request)?;
            expect_code("empty group", response.error_code, code::NONE)?;
            let p = response.responses.first().and_then(|t| t.partitions.first()).ok_or("no partition")?;
            expect_code("partition", p.error_code, code::NONE)?;
        }
        ApiKey::DeleteShareGroupOffsets => {
            let group = unique("conformance-share-delete");
            let (member, _) = share_join(client, fx, &group)?;
            share_open_session(client, fx, &group, &member)?;
            share_leave(client, &group, &member)?;
            let request = DeleteShareGroupOffsetsRequest::default()
                .with_group_id(group_id(&group))
                .with_topics(vec![delete_share_group_offsets_request::DeleteShareGroupOffsetsRequestTopic::default()
                    .with_topic_name(topic_name(&fx.topic))]);
            let response = call(client, version, &request)?;
            expect_code("group", response.error_code, code::NONE)?;
            let t = response.responses.first().ok_or("no topic")?;
            expect_code("topic", t.error_code, code::NONE)?;
        }
        ApiKey::DeleteGroups => {
            let group = unique("conformance-delete-group");
            commit(client, fx, &group)?;
            let response =
                call(client, version, &DeleteGroupsRequest::default().with_groups_names(vec![group_id(&group)]))?;
            let result = response.results.first().ok_or("no group in the response")?;
            expect_code("group", result.error_code, code::NONE)?;
        }
        ApiKey::OffsetDelete => {
            let group = unique("conformance-offset-delete");
            commit(client, fx, &group)?;
            let request = OffsetDeleteRequest::default().with_group_id(group_id(&group)).with_topics(vec![
                offset_delete_request::OffsetDeleteRequestTopic::default()
                    .with_name(topic_name(&fx.topic))
                    .with_partitions(vec![
                        offset_delete_request::OffsetDeleteRequestPartition::default().with_partition_index(0)
                    ]),
            ]);
            let response = call(client, version, &request)?;
            expect_code("top level", response.error_code, code::NONE)?;
            let p = response.topics.first().and_then(|t| t.partitions.first()).ok_or("no partition")?;
            expect_code("partition", p.error_code, code::NONE)?;
        }
        other => return Err(format!("no conformance case for {other:?}: add one to check_version")),
    }
    Ok(())
}

fn join_request(group: &str, member_id: &str) -> JoinGroupRequest {
    JoinGroupRequest::default()
        .with_group_id(group_id(group))
        .with_session_timeout_ms(10_000)
        .with_rebalance_timeout_ms(10_000)
        .with_member_id(s(member_id))
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![join_group_request::JoinGroupRequestProtocol::default()
            .with_name(s("range"))
            .with_metadata(Bytes::from_static(b"subscription"))])
}

/// Joins `group` as its only member at the newest JoinGroup version; (member id, generation).
fn join(client: &mut Client, fx: &Fixture, group: &str) -> Result<(String, i32), String> {
    let version = fx.max_version(ApiKey::JoinGroup);
    let mut response = call(client, version, &join_request(group, ""))?;
    if response.error_code == code::MEMBER_ID_REQUIRED {
        response = call(client, version, &join_request(group, response.member_id.as_str()))?;
    }
    expect_code("helper join", response.error_code, code::NONE)?;
    Ok((response.member_id.to_string(), response.generation_id))
}

/// Joins and syncs `group` (one member, the leader); (member id, generation).
fn join_and_sync(client: &mut Client, fx: &Fixture, group: &str) -> Result<(String, i32), String> {
    let (member, generation) = join(client, fx, group)?;
    let request = SyncGroupRequest::default()
        .with_group_id(group_id(group))
        .with_generation_id(generation)
        .with_member_id(s(&member))
        .with_assignments(vec![sync_group_request::SyncGroupRequestAssignment::default()
            .with_member_id(s(&member))
            .with_assignment(Bytes::from_static(b"assignment"))]);
    let response = call(client, fx.max_version(ApiKey::SyncGroup), &request)?;
    expect_code("helper sync", response.error_code, code::NONE)?;
    Ok((member, generation))
}

/// A standalone (no generation) commit of partition 0 of `topic` at `offset`.
fn commit_request(group: &str, topic: &str, offset: i64) -> OffsetCommitRequest {
    OffsetCommitRequest::default().with_group_id(group_id(group)).with_generation_id_or_member_epoch(-1).with_topics(
        vec![offset_commit_request::OffsetCommitRequestTopic::default().with_name(topic_name(topic)).with_partitions(
            vec![offset_commit_request::OffsetCommitRequestPartition::default()
                .with_partition_index(0)
                .with_committed_offset(offset)],
        )],
    )
}

/// Commits offset 2 of the fixture topic for `group` at the newest OffsetCommit version.
fn commit(client: &mut Client, fx: &Fixture, group: &str) -> CaseResult {
    let response = call(client, fx.max_version(ApiKey::OffsetCommit), &commit_request(group, &fx.topic, 2))?;
    let partition = response.topics.first().and_then(|t| t.partitions.first()).ok_or("helper commit: no partition")?;
    expect_code("helper commit", partition.error_code, code::NONE)
}

// ----- Produce and Fetch --------------------------------------------------------------------

#[test]
fn produce_assigns_consecutive_offsets_and_fetch_returns_the_batches_verbatim() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    client.create_topic("verbatim", 1, &[]);
    let batches: Vec<Vec<Message>> = vec![
        vec![Message::new("a", "one", 1_000)],
        vec![Message::new("b", "two", 1_001)],
        vec![Message::new("c", "three", 1_002)],
        vec![Message::new("d", "four", 1_003), Message::new("e", "five", 1_004), Message::new("f", "six", 1_005)],
        vec![Message { key: None, value: None, timestamp: 1_006 }],
        vec![Message::new("g", "seven", 1_007)],
    ];
    let encoded: Vec<Bytes> = batches.iter().map(|b| batch(b)).collect();
    let bases: Vec<i64> = encoded.iter().map(|b| client.produce_ok("verbatim", 0, b.clone())).collect();
    assert_eq!(bases, vec![0, 1, 2, 3, 6, 7], "base offsets of acks=1 produces");

    for version in [4, 12] {
        let request = fetch_request(0, 0, 1 << 20).with_topics(vec![fetch_topic_by_name("verbatim", 0, 0, 1 << 20)]);
        let response = client.send(version, &request).expect("Fetch");
        let partition = &response.responses[0].partitions[0];
        assert_eq!(partition.error_code, code::NONE);
        assert_eq!(partition.high_watermark, 8);
        let records = partition.records.clone().expect("records");
        let spans = batch_spans(&records);
        assert_eq!(spans.len(), batches.len(), "Fetch v{version} returns every batch");
        for ((span, produced), base) in spans.iter().zip(&encoded).zip(&bases) {
            assert_same_batch(&records[span.0..span.0 + span.1], produced, *base);
        }
        let all: Vec<Message> = batches.iter().flatten().cloned().collect();
        assert_records(&decode_records(records), &all, 0);
    }

    // Fetching from the middle of a batch returns the whole batch (Kafka's clients skip the
    // records before the offset they asked for).
    let (error, _, records) = client.fetch("verbatim", 0, 4, 1 << 20);
    assert_eq!(error, code::NONE);
    assert_eq!(decode_records(records).first().map(|r| r.offset), Some(3), "fetch at offset 4 starts with its batch");
}

#[test]
fn produce_with_acks_0_gets_no_response_but_is_stored() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    client.create_topic("fire-and-forget", 1, &[]);
    let messages = [Message::new("k", "no-ack-1", 1), Message::new("k", "no-ack-2", 2)];
    for m in &messages {
        client.write(9, &produce_request("fire-and-forget", 0, batch(std::slice::from_ref(m)), 0)).expect("write");
    }
    // The next response on this connection must be the ApiVersions one: the produces got none.
    let id = client.write(3, &api_versions_request()).expect("write");
    let response = client.read::<ApiVersionsRequest>(3, id).unwrap_or_else(|e| panic!("after acks=0 produces: {e}"));
    assert_eq!(response.error_code, code::NONE);
    // Requests on a connection are handled in order, so the records are there by now.
    assert_records(&client.fetch_all("fire-and-forget", 0), &messages, 0);
}

#[test]
fn a_failed_produce_with_acks_0_closes_the_connection() {
    // Kafka's rule: with acks=0 there is no response to carry the error, so the broker closes
    // the connection and the producer notices (librdkafka and the Java client reconnect and
    // refresh their metadata).
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    let message = Message::new("k", "lost?", 1);
    client.write(9, &produce_request("no-such-topic", 0, batch(std::slice::from_ref(&message)), 0)).expect("write");
    assert_eq!(client.wait_closed(Duration::from_secs(10)), Ok(()), "closed, nothing sent");
    // The broker is fine; other connections work.
    let mut other = broker.connect();
    other.create_topic("still-fine", 1, &[]);
}

#[test]
fn each_partition_of_a_produce_gets_its_own_batches_when_some_are_refused() {
    // The batches are written in place in the request's frame; partitions refused before the
    // append (unknown partition, unknown topic) must not shift the batches onto the others.
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    client.create_topic("mixed", 2, &[]);
    let message = |value: &str| Message::new("k", value, 1);
    let partition = |index: i32, value: &str| {
        PartitionProduceData::default().with_index(index).with_records(Some(batch(&[message(value)])))
    };
    let topic = |name: &str, partitions| {
        TopicProduceData::default().with_name(topic_name(name)).with_partition_data(partitions)
    };
    for version in [3, 9] {
        let request = ProduceRequest::default().with_acks(1).with_timeout_ms(10_000).with_topic_data(vec![
            topic("absent", vec![partition(0, "to nowhere")]),
            topic("mixed", vec![partition(99, "to no partition"), partition(0, "zero"), partition(1, "one")]),
        ]);
        let response = client.send(version, &request).expect("Produce");
        let codes: Vec<(String, i32, i16)> = response
            .responses
            .iter()
            .flat_map(|t| t.partition_responses.iter().map(move |p| (t.name.to_string(), p.index, p.error_code)))
            .collect();
        assert_eq!(
            codes,
            vec![
                ("absent".to_string(), 0, code::UNKNOWN_TOPIC_OR_PARTITION),
                ("mixed".to_string(), 99, code::UNKNOWN_TOPIC_OR_PARTITION),
                ("mixed".to_string(), 0, code::NONE),
                ("mixed".to_string(), 1, code::NONE),
            ],
            "v{version}"
        );
    }
    assert_records(&client.fetch_all("mixed", 0), &[message("zero"), message("zero")], 0);
    assert_records(&client.fetch_all("mixed", 1), &[message("one"), message("one")], 0);
}

/// Produces `count` one-record batches of about `value_len` bytes each; returns them encoded.
fn produce_batches(client: &mut Client, topic: &str, partition: i32, count: usize, value_len: usize) -> Vec<Bytes> {
    (0..count)
        .map(|i| {
            let encoded = batch(&[Message::with_value_len(&format!("key-{i}"), value_len, i as i64)]);
            client.produce_ok(topic, partition, encoded.clone());
            encoded
        })
        .collect()
}

fn fetch_spans(client: &mut Client, request: FetchRequest) -> Vec<Vec<usize>> {
    let response = client.send(12, &request).expect("Fetch v12");
    assert_eq!(response.error_code, code::NONE);
    response
        .responses
        .iter()
        .flat_map(|t| t.partitions.iter())
        .map(|p| {
            assert_eq!(p.error_code, code::NONE, "partition {}", p.partition_index);
            batch_spans(p.records.as_deref().unwrap_or_default()).into_iter().map(|(_, len)| len).collect()
        })
        .collect()
}

#[test]
fn fetch_returns_at_least_one_batch_and_otherwise_honours_max_bytes_and_partition_max_bytes() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    client.create_topic("limits", 2, &[]);
    let batches = produce_batches(&mut client, "limits", 0, 3, 1_000);
    produce_batches(&mut client, "limits", 1, 3, 1_000);
    let size = batches[0].len();
    assert!(batches.iter().all(|b| b.len() == size), "equal-size batches");
    let one_partition = |max_bytes: i32, partition_max_bytes: i32| {
        fetch_request(0, 0, max_bytes).with_topics(vec![fetch_topic_by_name("limits", 0, 0, partition_max_bytes)])
    };

    // max_bytes smaller than the first batch: that batch anyway, and nothing more.
    assert_eq!(fetch_spans(&mut client, one_partition(100, 1 << 20)), vec![vec![size]]);
    // Room for one and a half batches: one.
    assert_eq!(fetch_spans(&mut client, one_partition((size + size / 2) as i32, 1 << 20)), vec![vec![size]]);
    // Exactly two batches: two.
    assert_eq!(fetch_spans(&mut client, one_partition((2 * size) as i32, 1 << 20)), vec![vec![size, size]]);
    // partition_max_bytes limits the same way.
    assert_eq!(fetch_spans(&mut client, one_partition(1 << 20, 100)), vec![vec![size]]);
    assert_eq!(fetch_spans(&mut client, one_partition(1 << 20, (2 * size + 10) as i32)), vec![vec![size, size]]);
    assert_eq!(fetch_spans(&mut client, one_partition(1 << 20, 1 << 20)), vec![vec![size, size, size]]);

    // Two partitions: only the first response is exempt from the limit.
    let both = |max_bytes: i32, partition_max_bytes: i32| {
        let partitions = vec![fetch_partition(0, 0, partition_max_bytes), fetch_partition(1, 0, partition_max_bytes)];
        fetch_request(0, 0, max_bytes)
            .with_topics(vec![FetchTopic::default().with_topic(topic_name("limits")).with_partitions(partitions)])
    };
    assert_eq!(fetch_spans(&mut client, both(100, 1 << 20)), vec![vec![size], vec![]]);
    assert_eq!(
        fetch_spans(&mut client, both((4 * size) as i32, (2 * size) as i32)),
        vec![vec![size, size], vec![size, size]]
    );
    assert_eq!(fetch_spans(&mut client, both((3 * size) as i32, 1 << 20)), vec![vec![size, size, size], vec![]]);
}

#[test]
fn fetch_outside_the_log_is_offset_out_of_range() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    client.create_topic("range", 1, &[]);
    client.produce_ok("range", 0, batch(&[Message::new("k", "a", 1), Message::new("k", "b", 2)]));

    let (error, high_watermark, records) = client.fetch("range", 0, 2, 1 << 20);
    assert_eq!((error, high_watermark), (code::NONE, 2), "fetch at the log end: no error, no data");
    assert!(records.is_empty(), "fetch at the log end returned data");
    for offset in [3, 1_000, -1] {
        let (error, high_watermark, records) = client.fetch("range", 0, offset, 1 << 20);
        assert_eq!(error, code::OFFSET_OUT_OF_RANGE, "fetch at offset {offset}");
        assert_eq!(high_watermark, 2, "the high watermark comes with OFFSET_OUT_OF_RANGE");
        assert!(records.is_empty());
    }
    // An unknown partition of a known topic, and an unknown topic.
    assert_eq!(client.fetch("range", 7, 0, 1 << 20).0, code::UNKNOWN_TOPIC_OR_PARTITION);
    assert_eq!(client.fetch("no-such-topic", 0, 0, 1 << 20).0, code::UNKNOWN_TOPIC_OR_PARTITION);
}

#[test]
fn fetch_by_topic_id_from_v13_and_unknown_ids_are_unknown_topic_id() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    let id = client.create_topic("by-id", 1, &[]);
    let messages = [Message::new("k", "by id", 42)];
    client.produce_ok("by-id", 0, batch(&messages));
    let max = client
        .api_versions()
        .api_keys
        .iter()
        .find(|a| a.api_key == ApiKey::Fetch as i16)
        .expect("Fetch advertised")
        .max_version;
    assert!(max >= 13, "Fetch v13 (topic ids) is not advertised");

    let unknown = uuid::Uuid::new_v4();
    for version in 13..=max {
        let request = fetch_request(0, 0, 1 << 20)
            .with_topics(vec![fetch_topic_by_id(id, 0, 0, 1 << 20), fetch_topic_by_id(unknown, 0, 0, 1 << 20)]);
        let response = client.send(version, &request).expect("Fetch by topic id");
        assert_eq!(response.error_code, code::NONE);
        assert_eq!(response.responses.len(), 2, "Fetch v{version}: one answer per topic");
        let known = &response.responses[0];
        assert_eq!(known.topic_id, id);
        assert_eq!(known.partitions[0].error_code, code::NONE, "Fetch v{version} by id");
        assert_records(&decode_records(known.partitions[0].records.clone().unwrap_or_default()), &messages, 0);
        let missing = &response.responses[1];
        assert_eq!(missing.topic_id, unknown, "the unknown id is echoed");
        assert_eq!(missing.partitions[0].error_code, code::UNKNOWN_TOPIC_ID, "Fetch v{version} of an unknown id");
    }
}

#[test]
fn long_poll_fetch_returns_as_soon_as_data_arrives() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    client.create_topic("long-poll", 1, &[]);
    let addr = broker.addr();

    let started = Instant::now();
    let request = fetch_request(5_000, 1, 1 << 20).with_topics(vec![fetch_topic_by_name("long-poll", 0, 0, 1 << 20)]);
    let id = client.write(12, &request).expect("write fetch");
    let producer = thread::spawn(move || {
        // Give the fetch time to park (the one fixed sleep: it is what is being measured).
        thread::sleep(Duration::from_millis(300));
        let sent = started.elapsed();
        let mut other = connect(addr);
        other.produce_ok("long-poll", 0, batch(&[Message::new("k", "wake up", 7)]));
        (sent, started.elapsed())
    });
    let response = client.read::<FetchRequest>(12, id).expect("fetch response");
    let returned = started.elapsed();
    let (produce_sent, produce_acked) = producer.join().expect("producer thread");

    let partition = &response.responses[0].partitions[0];
    assert_eq!(partition.error_code, code::NONE);
    assert_eq!(
        decode_records(partition.records.clone().unwrap_or_default()).len(),
        1,
        "the fetch returned the new record"
    );
    assert!(
        returned >= produce_sent,
        "the fetch returned after {returned:?}, before the produce was sent ({produce_sent:?})"
    );
    assert!(
        returned < produce_acked + Duration::from_secs(1),
        "the fetch returned {returned:?} after it was sent, the produce was acknowledged at {produce_acked:?}"
    );
    assert!(returned < Duration::from_secs(3), "the fetch waited {returned:?} of its 5 s");
}

#[test]
fn long_poll_fetch_without_data_returns_after_max_wait() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    client.create_topic("quiet", 1, &[]);
    let max_wait = Duration::from_millis(700);
    let request = fetch_request(max_wait.as_millis() as i32, 1, 1 << 20).with_topics(vec![fetch_topic_by_name(
        "quiet",
        0,
        0,
        1 << 20,
    )]);
    let started = Instant::now();
    let response = client.send(12, &request).expect("Fetch v12");
    let waited = started.elapsed();
    let partition = &response.responses[0].partitions[0];
    assert_eq!(partition.error_code, code::NONE);
    assert!(partition.records.as_ref().is_none_or(|r| r.is_empty()), "no data was produced");
    assert!(waited >= max_wait, "returned after {waited:?}, before max_wait_ms");
    assert!(waited < max_wait + Duration::from_secs(1), "returned after {waited:?}, long after max_wait_ms");
}

/// A session fetch whose first read finds too little parks; a partition that changes meanwhile
/// is read in a second pass. When that partition's topic came first in the first pass, the
/// answer groups partitions by topic in another order than they were read: each partition must
/// still get its own records (once this closed the connection, "placeholder missing").
#[test]
fn a_session_fetch_read_in_two_passes_answers_every_partition_with_its_own_records() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    client.create_topic("pass-a", 2, &[]);
    client.create_topic("pass-b", 1, &[]);
    let both = |a: Vec<i32>, b: Vec<i32>| {
        let topic = |name: &str, partitions: Vec<i32>| {
            FetchTopic::default()
                .with_topic(topic_name(name))
                .with_partitions(partitions.into_iter().map(|p| fetch_partition(p, 0, 1 << 20)).collect())
        };
        vec![topic("pass-a", a), topic("pass-b", b)]
    };

    // Open the session over all three partitions, while they are empty.
    let open =
        fetch_request(0, 0, 1 << 20).with_session_id(0).with_session_epoch(0).with_topics(both(vec![0, 1], vec![0]));
    let opened = client.send(12, &open).expect("Fetch v12 opening a session");
    assert_eq!(opened.error_code, code::NONE);
    assert_ne!(opened.session_id, 0, "the broker granted no fetch session");

    client.produce_ok("pass-a", 0, batch(&[Message::new("k", "a0", 1)]));
    client.produce_ok("pass-b", 0, batch(&[Message::new("k", "b0", 2)]));
    // Named in this order, pass-a/0 and pass-b/0 are the first pass; min_bytes is out of reach,
    // so the fetch waits, and pass-a/1's record below is the second pass.
    let incremental = fetch_request(1_500, 1 << 20, 1 << 20)
        .with_session_id(opened.session_id)
        .with_session_epoch(1)
        .with_topics(both(vec![0], vec![0]));
    let id = client.write(12, &incremental).expect("write the incremental fetch");
    let addr = broker.addr();
    let producer = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        connect(addr).produce_ok("pass-a", 1, batch(&[Message::new("k", "a1", 3)]));
    });
    let response = client.read::<FetchRequest>(12, id).expect("the incremental fetch's answer");
    producer.join().expect("producer thread");

    assert_eq!(response.error_code, code::NONE);
    let mut values = BTreeMap::new();
    for topic in &response.responses {
        for partition in &topic.partitions {
            assert_eq!(partition.error_code, code::NONE, "{}/{}", topic.topic.as_str(), partition.partition_index);
            let records = decode_records(partition.records.clone().unwrap_or_default());
            let value =
                records.iter().map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned());
            values.insert(format!("{}/{}", topic.topic.as_str(), partition.partition_index), value.collect::<Vec<_>>());
        }
    }
    let expected =
        [("pass-a/0", "a0"), ("pass-a/1", "a1"), ("pass-b/0", "b0")].map(|(p, v)| (p.to_string(), vec![v.to_string()]));
    assert_eq!(values, BTreeMap::from(expected));
    broker_still_serves(&broker);
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    client.create_topic("pipeline", 1, &[]);
    const REQUESTS: usize = 50;
    // Even: a produce of one record; odd: Metadata or ApiVersions. All written before any read.
    let mut sent = Vec::new();
    for i in 0..REQUESTS {
        let id = match i % 4 {
            0 | 2 => {
                let records = batch(&[Message::new("k", &format!("pipelined-{i}"), i as i64)]);
                client.write(9, &produce_request("pipeline", 0, records, 1))
            }
            1 => client.write(12, &MetadataRequest::default().with_topics(None)),
            _ => client.write(3, &api_versions_request()),
        }
        .expect("write");
        sent.push((i, id));
    }
    let mut next_offset = 0;
    for (i, id) in sent {
        // Each read checks the correlation id: responses come back in request order.
        match i % 4 {
            0 | 2 => {
                let response = client.read::<ProduceRequest>(9, id).unwrap_or_else(|e| panic!("response {i}: {e}"));
                let p = &response.responses[0].partition_responses[0];
                assert_eq!((p.error_code, p.base_offset), (code::NONE, next_offset), "produce {i}");
                next_offset += 1;
            }
            1 => {
                client.read::<MetadataRequest>(12, id).unwrap_or_else(|e| panic!("response {i}: {e}"));
            }
            _ => {
                client.read::<ApiVersionsRequest>(3, id).unwrap_or_else(|e| panic!("response {i}: {e}"));
            }
        }
    }
    let values: Vec<String> = client
        .fetch_all("pipeline", 0)
        .iter()
        .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into())
        .collect();
    let expected: Vec<String> = (0..REQUESTS).filter(|i| i % 2 == 0).map(|i| format!("pipelined-{i}")).collect();
    assert_eq!(values, expected, "the produces were appended in request order");
}

// ----- ListOffsets --------------------------------------------------------------------------

#[test]
fn list_offsets_finds_earliest_latest_by_timestamp_and_max_timestamp() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    client.create_topic("times", 1, &[]);
    // Offsets 0 and 1 at t=1000 and 1001, offset 2 at t=5000 (the maximum), offset 3 at t=3000.
    client.produce_ok("times", 0, batch(&[Message::new("k", "a", 1_000), Message::new("k", "b", 1_001)]));
    client.produce_ok("times", 0, batch(&[Message::new("k", "c", 5_000)]));
    client.produce_ok("times", 0, batch(&[Message::new("k", "d", 3_000)]));

    let max = client
        .api_versions()
        .api_keys
        .iter()
        .find(|a| a.api_key == ApiKey::ListOffsets as i16)
        .map(|a| (a.min_version, a.max_version))
        .expect("ListOffsets advertised");
    // (query timestamp, expected offset, expected timestamp, lowest version)
    let cases: &[(i64, i64, i64, i16)] = &[
        (-2, 0, -1, 0),   // earliest
        (-1, 4, -1, 0),   // latest
        (0, 0, 1_000, 1), // the first record at or after t=0
        (1_001, 1, 1_001, 1),
        (2_000, 2, 5_000, 1), // first *by offset* with timestamp >= 2000
        (5_000, 2, 5_000, 1),
        (5_001, -1, -1, 1), // nothing that late
        (-3, 2, 5_000, 7),  // MAX_TIMESTAMP (KIP-734)
        (-4, 0, -1, 8),     // EARLIEST_LOCAL (KIP-405): the log start on a topic that is not tiered
        (-5, -1, -1, 9),    // LATEST_TIERED (KIP-1005): none on a topic that is not tiered
    ];
    for version in max.0..=max.1 {
        for &(timestamp, offset, found_timestamp, since) in cases {
            if version < since {
                continue;
            }
            let request = ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![
                list_offsets_request::ListOffsetsTopic::default().with_name(topic_name("times")).with_partitions(vec![
                    list_offsets_request::ListOffsetsPartition::default()
                        .with_partition_index(0)
                        .with_timestamp(timestamp),
                ]),
            ]);
            let response = client.send(version, &request).expect("ListOffsets");
            let p = &response.topics[0].partitions[0];
            let what = format!("ListOffsets v{version} timestamp {timestamp}");
            assert_eq!(p.error_code, code::NONE, "{what}");
            assert_eq!(p.offset, offset, "{what}: offset");
            if timestamp >= 0 || timestamp == -3 {
                assert_eq!(p.timestamp, found_timestamp, "{what}: timestamp");
            }
        }
    }
    let request = ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![
        list_offsets_request::ListOffsetsTopic::default().with_name(topic_name("no-such-topic")).with_partitions(vec![
            list_offsets_request::ListOffsetsPartition::default().with_partition_index(0).with_timestamp(-1),
        ]),
    ]);
    assert_eq!(
        client.send(7, &request).expect("ListOffsets v7").topics[0].partitions[0].error_code,
        code::UNKNOWN_TOPIC_OR_PARTITION
    );
}

// ----- errors -------------------------------------------------------------------------------

#[test]
fn produce_errors_are_reported_and_leave_the_log_unchanged() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    client.create_topic("errors", 1, &[]);
    client.create_topic("small", 1, &[("max.message.bytes", "1024")]);
    let good = [Message::new("k", "good-1", 1), Message::new("k", "good-2", 2)];
    assert_eq!(client.produce_ok("errors", 0, batch(&good[..1])), 0);
    let small_ok = [Message::with_value_len("k", 100, 3)];
    assert_eq!(client.produce_ok("small", 0, batch(&small_ok)), 0);

    let mut corrupt = BytesMut::from(&batch(&[Message::new("k", "flipped", 4)])[..]);
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    let too_large = batch(&[Message::with_value_len("k", 2_000, 5)]);
    let plain = batch(&[Message::new("k", "never stored", 6)]);
    let cases: Vec<(&str, ProduceRequest, i16)> = vec![
        ("a CRC mismatch", produce_request("errors", 0, corrupt.freeze(), 1), code::CORRUPT_MESSAGE),
        ("a batch over max.message.bytes", produce_request("small", 0, too_large, 1), code::MESSAGE_TOO_LARGE),
        ("an unknown topic", produce_request("no-such-topic", 0, plain.clone(), 1), code::UNKNOWN_TOPIC_OR_PARTITION),
        ("an unknown partition", produce_request("errors", 3, plain.clone(), 1), code::UNKNOWN_TOPIC_OR_PARTITION),
        ("acks=2", produce_request("errors", 0, plain.clone(), 2), code::INVALID_REQUIRED_ACKS),
    ];
    for (what, request, expected) in cases {
        let response = client.send(9, &request).unwrap_or_else(|e| panic!("produce with {what}: {e}"));
        let p = &response.responses[0].partition_responses[0];
        assert_eq!(p.error_code, expected, "produce with {what}");
        assert_eq!(p.base_offset, -1, "produce with {what}: base offset");
        assert!(p.error_message.as_ref().is_some_and(|m| !m.is_empty()), "produce with {what}: no error message");
    }

    // Only the good batches are in the logs.
    assert_eq!(client.produce_ok("errors", 0, batch(&good[1..])), 1, "the failed produces took no offsets");
    assert_records(&client.fetch_all("errors", 0), &good, 0);
    assert_records(&client.fetch_all("small", 0), &small_ok, 0);
    // Produce does not create topics.
    let metadata = client
        .send(
            12,
            &MetadataRequest::default()
                .with_topics(Some(vec![
                    metadata_request::MetadataRequestTopic::default().with_name(Some(topic_name("no-such-topic")))
                ]))
                .with_allow_auto_topic_creation(false),
        )
        .expect("Metadata v12");
    assert_eq!(metadata.topics[0].error_code, code::UNKNOWN_TOPIC_OR_PARTITION);
}

#[test]
fn create_topics_errors_have_codes_and_messages_and_validate_only_creates_nothing() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    client.create_topic("exists", 1, &[]);
    // (what, name, partitions, replication factor, configs, expected error)
    type Case<'a> = (&'a str, &'a str, i32, i16, &'a [(&'a str, &'a str)], i16);
    let cases: &[Case] = &[
        ("an existing name", "exists", 1, 1, &[], code::TOPIC_ALREADY_EXISTS),
        ("an invalid name", "bad/name", 1, 1, &[], code::INVALID_TOPIC_EXCEPTION),
        ("replication factor 3", "rf3", 1, 3, &[], code::INVALID_REPLICATION_FACTOR),
        ("0 partitions", "zero", 0, 1, &[], code::INVALID_PARTITIONS),
        ("an unknown config", "unknown-config", 1, 1, &[("no.such.config", "1")], code::INVALID_CONFIG),
        ("an invalid config value", "bad-value", 1, 1, &[("retention.ms", "soon")], code::INVALID_CONFIG),
    ];
    for validate_only in [false, true] {
        for &(what, name, partitions, replication_factor, configs, expected) in cases {
            let request =
                create_topics_request(name, partitions, replication_factor, configs).with_validate_only(validate_only);
            let response = client.send(7, &request).expect("CreateTopics v7");
            let result = &response.topics[0];
            let what = format!("{what} (validate_only={validate_only})");
            assert_eq!(result.error_code, expected, "{what}");
            assert!(result.error_message.as_ref().is_some_and(|m| !m.is_empty()), "{what}: no error message");
        }
    }

    let request = create_topics_request("validated", 3, 1, &[("retention.ms", "1000")]).with_validate_only(true);
    let response = client.send(7, &request).expect("CreateTopics v7");
    assert_eq!(response.topics[0].error_code, code::NONE, "validate_only of a valid topic");
    assert_eq!(response.topics[0].num_partitions, 3);
    let metadata = client
        .send(
            12,
            &MetadataRequest::default()
                .with_topics(Some(
                    ["validated", "rf3", "zero", "unknown-config", "bad-value"]
                        .iter()
                        .map(|n| metadata_request::MetadataRequestTopic::default().with_name(Some(topic_name(n))))
                        .collect(),
                ))
                .with_allow_auto_topic_creation(false),
        )
        .expect("Metadata v12");
    for topic in &metadata.topics {
        assert_eq!(topic.error_code, code::UNKNOWN_TOPIC_OR_PARTITION, "{:?} exists", topic.name);
    }
    // And creating it for real still works.
    client.create_topic("validated", 3, &[]);
}

/// KIP-599: a client over its controller_mutation_rate has topic creations, deletions and new
/// partitions refused with THROTTLING_QUOTA_EXCEEDED and told how long to wait (CreateTopics
/// v6+, DeleteTopics v5+, CreatePartitions v3+); an older request goes ahead and is throttled.
#[test]
fn mutations_over_the_controller_mutation_rate_are_refused_and_throttled() {
    use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
    use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::delete_topics_request::DeleteTopicState;

    let broker = Broker::start(&["quota.window.num=2"]);
    let mut admin = broker.connect();
    let quota = AlterClientQuotasRequest::default().with_entries(vec![EntryData::default()
        .with_entity(vec![EntityData::default().with_entity_type(s("client-id")).with_entity_name(Some(s("mutator")))])
        .with_ops(vec![OpData::default().with_key(s("controller_mutation_rate")).with_value(1.0)])]);
    let altered = admin.send(1, &quota).expect("AlterClientQuotas");
    assert_eq!(altered.entries[0].error_code, 0, "{altered:?}");

    let mut mutator = Client::connect(broker.addr(), "mutator", IO_TIMEOUT).expect("connects");
    let create = |name: &str| {
        CreateTopicsRequest::default().with_timeout_ms(10_000).with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(name))
            .with_num_partitions(8)
            .with_replication_factor(1)])
    };
    // Nothing counted yet: the first creation goes ahead, taking the rate far over 1/s.
    let first = mutator.send(7, &create("mutated-1")).expect("CreateTopics");
    assert_eq!(first.topics[0].error_code, 0, "{first:?}");
    let second = mutator.send(7, &create("mutated-2")).expect("CreateTopics");
    assert_eq!(second.topics[0].error_code, code::THROTTLING_QUOTA_EXCEEDED, "{second:?}");
    assert!(second.throttle_time_ms > 0, "{second:?}");
    let more =
        CreatePartitionsRequest::default().with_timeout_ms(10_000).with_topics(vec![CreatePartitionsTopic::default()
            .with_name(topic_name("mutated-1"))
            .with_count(9)
            .with_assignments(None)]);
    // (A connection over a quota is muted until the rate is back under it: ask on new ones,
    // under the same client id.)
    let fresh = || Client::connect(broker.addr(), "mutator", IO_TIMEOUT).expect("connects");
    let refused = fresh().send(3, &more).expect("CreatePartitions");
    assert_eq!(refused.results[0].error_code, code::THROTTLING_QUOTA_EXCEEDED, "{refused:?}");
    let delete = DeleteTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![DeleteTopicState::default().with_name(Some(topic_name("mutated-1")))]);
    let refused = fresh().send(6, &delete).expect("DeleteTopics");
    assert_eq!(refused.responses[0].error_code, code::THROTTLING_QUOTA_EXCEEDED, "{refused:?}");

    // Before KIP-599 (CreateTopics v5) the creation is made, and the client throttled after.
    let old = fresh().send(5, &create("mutated-3")).expect("CreateTopics");
    assert_eq!(old.topics[0].error_code, 0, "{old:?}");
    assert!(old.throttle_time_ms > 0, "{old:?}");
    // Another client is not held back.
    let other = admin.send(7, &create("mutated-4")).expect("CreateTopics");
    assert_eq!(other.topics[0].error_code, 0, "{other:?}");
}
