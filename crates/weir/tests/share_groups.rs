//! Kafka share groups (KIP-932) over the raw protocol, against the real `weir server`: what
//! librdkafka's ShareConsumer cannot show (tests/python/test_share_groups.py covers the client):
//! delivery counts as the broker sends them, an acknowledgement of a record another member
//! holds (INVALID_RECORD_STATE), RENEW keeping a lock (KIP-1222), the share offset APIs, and
//! the group configs set through IncrementalAlterConfigs on a GROUP resource.

mod support;

use std::time::{Duration, Instant};

use kafka_protocol::messages::*;
use support::*;

const TOPIC: &str = "queue";
const INVALID_RECORD_STATE: i16 = 121;
const GROUP_RESOURCE: i8 = 32;
const ACCEPT: i8 = 1;
const RELEASE: i8 = 2;
const REJECT: i8 = 3;
const RENEW: i8 = 4;

struct Member {
    group: String,
    id: String,
    topic_id: uuid::Uuid,
    /// The share session's next epoch.
    epoch: i32,
}

fn set_group_configs(client: &mut Client, group: &str, configs: &[(&str, &str)]) {
    let request = IncrementalAlterConfigsRequest::default().with_resources(vec![
        incremental_alter_configs_request::AlterConfigsResource::default()
            .with_resource_type(GROUP_RESOURCE)
            .with_resource_name(s(group))
            .with_configs(
                configs
                    .iter()
                    .map(|(name, value)| {
                        incremental_alter_configs_request::AlterableConfig::default()
                            .with_name(s(name))
                            .with_config_operation(0)
                            .with_value(Some(s(value)))
                    })
                    .collect(),
            ),
    ]);
    let response = client.send(1, &request).expect("IncrementalAlterConfigs");
    assert_eq!(response.responses[0].error_code, code::NONE, "{:?}", response.responses[0].error_message);
}

fn join(client: &mut Client, group: &str, topic_id: uuid::Uuid) -> Member {
    join_at(client, group, topic_id).0
}

/// A new member of `group`, with the member epoch its join was answered.
fn join_at(client: &mut Client, group: &str, topic_id: uuid::Uuid) -> (Member, i32) {
    let id = uuid::Uuid::new_v4().to_string();
    let request = ShareGroupHeartbeatRequest::default()
        .with_group_id(group_id(group))
        .with_member_id(s(&id))
        .with_member_epoch(0)
        .with_subscribed_topic_names(Some(vec![TopicName(s(TOPIC))]));
    let response = client.send(1, &request).expect("ShareGroupHeartbeat");
    assert_eq!(response.error_code, code::NONE, "{:?}", response.error_message);
    (Member { group: group.to_string(), id, topic_id, epoch: 0 }, response.member_epoch)
}

/// A ShareFetch of partition 0 by `member`, waiting up to `wait_ms` for up to `max_records`,
/// with `acks` (first, last, type) piggy-backed.
fn share_fetch_request(
    member: &Member,
    wait_ms: i32,
    max_records: i32,
    acks: Vec<(i64, i64, i8)>,
) -> ShareFetchRequest {
    let batches = acks
        .into_iter()
        .map(|(first, last, kind)| {
            share_fetch_request::AcknowledgementBatch::default()
                .with_first_offset(first)
                .with_last_offset(last)
                .with_acknowledge_types(vec![kind])
        })
        .collect();
    ShareFetchRequest::default()
        .with_group_id(Some(group_id(&member.group)))
        .with_member_id(Some(s(&member.id)))
        .with_share_session_epoch(member.epoch)
        .with_max_wait_ms(wait_ms)
        .with_max_records(max_records)
        .with_topics(vec![share_fetch_request::FetchTopic::default().with_topic_id(member.topic_id).with_partitions(
            vec![share_fetch_request::FetchPartition::default()
                .with_partition_index(0)
                .with_acknowledgement_batches(batches)],
        )])
}

/// (offset, delivery count) of each record a ShareFetch answer acquired; its partition and
/// acknowledgement errors must be none, and its records exactly those acquired.
fn acquired(response: &ShareFetchResponse) -> Vec<(i64, i16)> {
    let mut acquired = Vec::new();
    for p in response.responses.iter().flat_map(|t| &t.partitions) {
        assert_eq!((p.error_code, p.acknowledge_error_code), (code::NONE, code::NONE), "{p:?}");
        let mut here = Vec::new();
        for range in &p.acquired_records {
            here.extend((range.first_offset..=range.last_offset).map(|offset| (offset, range.delivery_count)));
        }
        if !here.is_empty() {
            let records = decode_records(p.records.clone().expect("records with the acquired ranges"));
            let offsets: Vec<i64> = records.iter().map(|r| r.offset).collect();
            let wanted: Vec<i64> = here.iter().map(|(o, _)| *o).collect();
            assert_eq!(offsets, wanted, "the records are those acquired");
        }
        acquired.extend(here);
    }
    acquired
}

/// One ShareFetch of partition 0 (waiting up to `wait_ms`): (offset, delivery count) of each
/// acquired record; the top-level, partition and acknowledgement errors must be none.
fn fetch(client: &mut Client, member: &mut Member, wait_ms: i32, acks: Vec<(i64, i64, i8)>) -> Vec<(i64, i16)> {
    let response = client.send(1, &share_fetch_request(member, wait_ms, 100, acks)).expect("ShareFetch");
    assert_eq!(response.error_code, code::NONE, "{:?}", response.error_message);
    member.epoch += 1;
    acquired(&response)
}

/// A ShareAcknowledge of partition 0; returns its partition error code.
fn acknowledge(client: &mut Client, member: &mut Member, first: i64, last: i64, kind: i8) -> i16 {
    let request = ShareAcknowledgeRequest::default()
        .with_group_id(Some(group_id(&member.group)))
        .with_member_id(Some(s(&member.id)))
        .with_share_session_epoch(member.epoch)
        .with_topics(vec![share_acknowledge_request::AcknowledgeTopic::default()
            .with_topic_id(member.topic_id)
            .with_partitions(vec![share_acknowledge_request::AcknowledgePartition::default()
                .with_partition_index(0)
                .with_acknowledgement_batches(vec![share_acknowledge_request::AcknowledgementBatch::default()
                    .with_first_offset(first)
                    .with_last_offset(last)
                    .with_acknowledge_types(vec![kind])])])]);
    let response = client.send(1, &request).expect("ShareAcknowledge");
    assert_eq!(response.error_code, code::NONE, "{:?}", response.error_message);
    member.epoch += 1;
    response.responses[0].partitions[0].error_code
}

/// The group's start offset on partition 0 (DescribeShareGroupOffsets).
fn start_offset(client: &mut Client, group: &str) -> i64 {
    let request = DescribeShareGroupOffsetsRequest::default().with_groups(vec![
        describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup::default()
            .with_group_id(group_id(group))
            .with_topics(Some(vec![
                describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestTopic::default()
                    .with_topic_name(TopicName(s(TOPIC)))
                    .with_partitions(vec![0]),
            ])),
    ]);
    let response = client.send(0, &request).expect("DescribeShareGroupOffsets");
    response.groups[0].topics[0].partitions[0].start_offset
}

/// AlterShareGroupOffsets of `group`: partition 0 of `TOPIC` starts at `offset`.
fn alter_start_offset(group: &str, offset: i64) -> AlterShareGroupOffsetsRequest {
    AlterShareGroupOffsetsRequest::default().with_group_id(group_id(group)).with_topics(vec![
        alter_share_group_offsets_request::AlterShareGroupOffsetsRequestTopic::default()
            .with_topic_name(TopicName(s(TOPIC)))
            .with_partitions(vec![alter_share_group_offsets_request::AlterShareGroupOffsetsRequestPartition::default(
            )
            .with_partition_index(0)
            .with_start_offset(offset)]),
    ])
}

/// Fetches until something is acquired or `timeout` passes.
fn fetch_some(client: &mut Client, member: &mut Member, timeout: Duration) -> Vec<(i64, i16)> {
    let deadline = Instant::now() + timeout;
    loop {
        let got = fetch(client, member, 500, Vec::new());
        if !got.is_empty() || Instant::now() > deadline {
            return got;
        }
    }
}

#[test]
fn given_records_held_by_one_member_another_cannot_ack_them_and_renew_keeps_them_held() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    let topic_id = client.create_topic(TOPIC, 1, &[]);
    let messages: Vec<Message> = (0..3).map(|i| Message::new("k", &format!("v{i}"), 1_000 + i)).collect();
    client.produce_ok(TOPIC, 0, batch(&messages));
    let group = "workers";
    set_group_configs(
        &mut client,
        group,
        &[("share.auto.offset.reset", "earliest"), ("share.record.lock.duration.ms", "2000")],
    );
    let mut a = join(&mut client, group, topic_id);
    let mut b = join(&mut client, group, topic_id);

    assert_eq!(fetch_some(&mut client, &mut a, Duration::from_secs(10)), [(0, 1), (1, 1), (2, 1)]);
    assert_eq!(fetch(&mut client, &mut b, 0, Vec::new()), [], "a holds every record");
    assert_eq!(acknowledge(&mut client, &mut b, 0, 0, ACCEPT), INVALID_RECORD_STATE, "b holds none of them");

    // a renews its locks twice over more than one lock duration: they never run out.
    let acquired = Instant::now();
    while acquired.elapsed() < Duration::from_millis(3_000) {
        assert_eq!(acknowledge(&mut client, &mut a, 0, 2, RENEW), code::NONE);
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(fetch(&mut client, &mut b, 0, Vec::new()), [], "renewed locks still held after 3 s (lock 2 s)");

    // ACCEPT 0, RELEASE 1, REJECT 2: 1 goes to b, one delivery later.
    assert_eq!(acknowledge(&mut client, &mut a, 0, 0, ACCEPT), code::NONE);
    assert_eq!(acknowledge(&mut client, &mut a, 1, 1, RELEASE), code::NONE);
    assert_eq!(acknowledge(&mut client, &mut a, 2, 2, REJECT), code::NONE);
    assert_eq!(acknowledge(&mut client, &mut a, 0, 0, ACCEPT), INVALID_RECORD_STATE, "done already");
    assert_eq!(fetch_some(&mut client, &mut b, Duration::from_secs(10)), [(1, 2)]);
    assert_eq!(start_offset(&mut client, group), 1, "0 is done, 1 is in flight");
    // b accepts it with its next fetch's piggy-backed acknowledgement: everything is done.
    assert_eq!(fetch(&mut client, &mut b, 0, vec![(1, 1, ACCEPT)]), []);
    assert_eq!(start_offset(&mut client, group), 3);
}

#[test]
fn given_an_empty_share_group_its_start_offset_is_altered_and_deleted() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    let topic_id = client.create_topic(TOPIC, 1, &[]);
    let messages: Vec<Message> = (0..5).map(|i| Message::new("k", &format!("v{i}"), 1_000 + i)).collect();
    client.produce_ok(TOPIC, 0, batch(&messages));
    let group = "replayers";

    // Before any fetch: the group starts where the offset is set (not at the end, `latest`).
    let alter = alter_start_offset(group, 3);
    let response = client.send(0, &alter).expect("AlterShareGroupOffsets");
    assert_eq!(response.error_code, code::NONE);
    assert_eq!(response.responses[0].partitions[0].error_code, code::NONE);
    assert_eq!(start_offset(&mut client, group), 3);

    let mut member = join(&mut client, group, topic_id);
    assert_eq!(fetch_some(&mut client, &mut member, Duration::from_secs(10)), [(3, 1), (4, 1)]);
    let response = client.send(0, &alter).expect("AlterShareGroupOffsets");
    assert_eq!(response.error_code, 68, "NON_EMPTY_GROUP while it has a member");

    let leave = ShareGroupHeartbeatRequest::default()
        .with_group_id(group_id(group))
        .with_member_id(s(&member.id))
        .with_member_epoch(-1);
    assert_eq!(client.send(1, &leave).expect("leave").error_code, code::NONE);
    let delete = DeleteShareGroupOffsetsRequest::default()
        .with_group_id(group_id(group))
        .with_topics(vec![delete_share_group_offsets_request::DeleteShareGroupOffsetsRequestTopic::default()
            .with_topic_name(TopicName(s(TOPIC)))]);
    let response = client.send(0, &delete).expect("DeleteShareGroupOffsets");
    assert_eq!((response.error_code, response.responses[0].error_code), (code::NONE, code::NONE));
    assert_eq!(start_offset(&mut client, group), 5, "starts again at the end (share.auto.offset.reset latest)");

    // ListGroups knows it as a share group.
    let listed = client.send(5, &ListGroupsRequest::default().with_types_filter(vec![s("share")])).expect("ListGroups");
    let groups: Vec<(&str, &str)> =
        listed.groups.iter().map(|g| (g.group_id.as_str(), g.group_type.as_str())).collect();
    assert_eq!(groups, [(group, "share")]);
}

#[test]
fn given_a_share_group_made_by_altering_its_offsets_it_survives_kill_9_before_any_member_joins() {
    let mut broker = Broker::start(&[]);
    let mut client = broker.connect();
    let topic_id = client.create_topic(TOPIC, 1, &[]);
    let messages: Vec<Message> = (0..5).map(|i| Message::new("k", &format!("v{i}"), 1_000 + i)).collect();
    client.produce_ok(TOPIC, 0, batch(&messages));
    let group = "prepared";
    let response = client.send(0, &alter_start_offset(group, 2)).expect("AlterShareGroupOffsets");
    assert_eq!((response.error_code, response.responses[0].partitions[0].error_code), (code::NONE, code::NONE));

    broker.kill();
    broker.restart();
    let mut client = broker.connect();
    let listed = client.send(5, &ListGroupsRequest::default().with_types_filter(vec![s("share")])).expect("ListGroups");
    let groups: Vec<(&str, &str)> =
        listed.groups.iter().map(|g| (g.group_id.as_str(), g.group_type.as_str())).collect();
    assert_eq!(groups, [(group, "share")], "the empty share group came back with its record");
    assert_eq!(start_offset(&mut client, group), 2, "its start offset is read from its stored state");
    let mut member = join(&mut client, group, topic_id);
    assert_eq!(fetch_some(&mut client, &mut member, Duration::from_secs(10)), [(2, 1), (3, 1), (4, 1)]);
}

#[test]
fn given_a_share_group_a_consumer_protocol_member_is_refused_and_given_a_consumer_group_a_share_member_is() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    let topic_id = client.create_topic(TOPIC, 1, &[]);
    const GROUP_ID_NOT_FOUND: i16 = 69;
    let consumer_join = |client: &mut Client, group: &str| {
        let request = ConsumerGroupHeartbeatRequest::default()
            .with_group_id(group_id(group))
            .with_member_id(s(&uuid::Uuid::new_v4().to_string()))
            .with_member_epoch(0)
            .with_rebalance_timeout_ms(30_000)
            .with_subscribed_topic_names(Some(vec![TopicName(s(TOPIC))]));
        client.send(1, &request).expect("ConsumerGroupHeartbeat").error_code
    };
    let share_join = |client: &mut Client, group: &str| {
        let request = ShareGroupHeartbeatRequest::default()
            .with_group_id(group_id(group))
            .with_member_id(s(&uuid::Uuid::new_v4().to_string()))
            .with_member_epoch(0)
            .with_subscribed_topic_names(Some(vec![TopicName(s(TOPIC))]));
        client.send(1, &request).expect("ShareGroupHeartbeat").error_code
    };

    join(&mut client, "sharing", topic_id);
    assert_eq!(consumer_join(&mut client, "sharing"), GROUP_ID_NOT_FOUND, "a share group is no consumer group");
    assert_eq!(consumer_join(&mut client, "consuming"), code::NONE);
    assert_eq!(share_join(&mut client, "consuming"), GROUP_ID_NOT_FOUND, "a consumer group is no share group");
    assert_eq!(share_join(&mut client, "sharing"), code::NONE, "a second share member is welcome");

    let described = client
        .send(5, &DescribeGroupsRequest::default().with_groups(vec![group_id("sharing")]))
        .expect("DescribeGroups");
    let g = &described.groups[0];
    assert_eq!((g.protocol_type.as_str(), g.group_state.as_str(), g.members.len()), ("share", "Stable", 2));
}

#[test]
fn given_a_groups_heartbeat_interval_config_its_members_are_told_it() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    client.create_topic(TOPIC, 1, &[]);
    let heartbeat_interval = |client: &mut Client, group: &str| {
        let request = ConsumerGroupHeartbeatRequest::default()
            .with_group_id(group_id(group))
            .with_member_id(s(&uuid::Uuid::new_v4().to_string()))
            .with_member_epoch(0)
            .with_rebalance_timeout_ms(30_000)
            .with_subscribed_topic_names(Some(vec![TopicName(s(TOPIC))]));
        let response = client.send(1, &request).expect("ConsumerGroupHeartbeat");
        assert_eq!(response.error_code, code::NONE, "{:?}", response.error_message);
        response.heartbeat_interval_ms
    };
    assert_eq!(heartbeat_interval(&mut client, "plain"), 5_000, "the broker's group.consumer.heartbeat.interval.ms");
    set_group_configs(&mut client, "tuned", &[("consumer.heartbeat.interval.ms", "750")]);
    assert_eq!(heartbeat_interval(&mut client, "tuned"), 750);
}

#[test]
fn given_a_lock_that_ran_out_its_holder_can_no_longer_acknowledge_the_record() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    let topic_id = client.create_topic(TOPIC, 1, &[]);
    client.produce_ok(TOPIC, 0, batch(&[Message::new("k", "v", 1_000)]));
    let group = "slow";
    set_group_configs(
        &mut client,
        group,
        &[("share.auto.offset.reset", "earliest"), ("share.record.lock.duration.ms", "1000")],
    );
    let mut a = join(&mut client, group, topic_id);
    let acquired = Instant::now();
    assert_eq!(fetch_some(&mut client, &mut a, Duration::from_secs(10)), [(0, 1)]);
    while acquired.elapsed() < Duration::from_millis(1_200) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(acknowledge(&mut client, &mut a, 0, 0, ACCEPT), INVALID_RECORD_STATE, "the lock ran out");
    let mut b = join(&mut client, group, topic_id);
    assert_eq!(fetch_some(&mut client, &mut b, Duration::from_secs(10)), [(0, 2)]);
    assert_eq!(acknowledge(&mut client, &mut b, 0, 0, ACCEPT), code::NONE);
}

#[test]
fn given_a_closed_share_session_or_connection_what_its_member_held_is_available_again_at_once() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    let topic_id = client.create_topic(TOPIC, 1, &[]);
    let messages: Vec<Message> = (0..2).map(|i| Message::new("k", &format!("v{i}"), 1_000 + i)).collect();
    client.produce_ok(TOPIC, 0, batch(&messages));
    let group = "leavers";
    // A lock far longer than the test: only the release can bring the record back.
    set_group_configs(
        &mut client,
        group,
        &[("share.auto.offset.reset", "earliest"), ("share.record.lock.duration.ms", "600000")],
    );
    let mut a = join(&mut client, group, topic_id);
    assert_eq!(fetch_some(&mut client, &mut a, Duration::from_secs(10)), [(0, 1), (1, 1)]);
    // a closes its session accepting 0 only (as a consumer's close does): 1 goes back.
    a.epoch = -1;
    assert_eq!(acknowledge(&mut client, &mut a, 0, 0, ACCEPT), code::NONE);
    let mut b = join(&mut client, group, topic_id);
    assert_eq!(fetch(&mut client, &mut b, 0, Vec::new()), [(1, 2)]);

    // b leaves the group without closing its session: the same.
    let leave = ShareGroupHeartbeatRequest::default()
        .with_group_id(group_id(group))
        .with_member_id(s(&b.id))
        .with_member_epoch(-1);
    assert_eq!(client.send(1, &leave).expect("leave").error_code, code::NONE);
    let mut c = join(&mut client, group, topic_id);
    assert_eq!(fetch(&mut client, &mut c, 0, Vec::new()), [(1, 3)]);

    // d's consumer dies holding the record: its connection closes, and so does its session.
    let mut dying = broker.connect();
    let mut d = join(&mut dying, group, topic_id);
    c.epoch = -1;
    assert_eq!(acknowledge(&mut client, &mut c, 1, 1, RELEASE), code::NONE);
    assert_eq!(fetch(&mut dying, &mut d, 0, Vec::new()), [(1, 4)]);
    drop(dying);
    let mut e = join(&mut client, group, topic_id);
    assert_eq!(fetch_some(&mut client, &mut e, Duration::from_secs(10)), [(1, 5)], "back long before its lock ran out");
}

/// A request frame of `api_key` at version 2, from `request` encoded at v1 with `extra` (the
/// v2 fields) put in `at` bytes into the body: what Kafka 4.2's clients send.
fn v2_frame<R: kafka_protocol::protocol::Encodable>(api_key: i16, request: &R, at: usize, extra: &[u8]) -> Vec<u8> {
    raw_frame(api_key, 2, request, 1, at, extra)
}

/// A request frame of `api_key` at `version`: `request` encoded at `body_version`, with `extra`
/// put in `at` bytes into the body.
fn raw_frame<R: kafka_protocol::protocol::Encodable>(
    api_key: i16,
    version: i16,
    request: &R,
    body_version: i16,
    at: usize,
    extra: &[u8],
) -> Vec<u8> {
    use bytes::BufMut;
    let mut body = bytes::BytesMut::new();
    request.encode(&mut body, body_version).expect("encodes");
    let mut frame = bytes::BytesMut::new();
    frame.put_i16(api_key);
    frame.put_i16(version);
    frame.put_i32(7); // correlation id
    frame.put_i16(4);
    frame.put_slice(b"test");
    frame.put_u8(0); // no tagged fields
    frame.put_slice(&body[..at]);
    frame.put_slice(extra);
    frame.put_slice(&body[at..]);
    let mut out = (frame.len() as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&frame);
    out
}

/// The body of the next response frame (after the correlation id and the header's tagged fields).
fn response_body(client: &mut Client) -> bytes::Bytes {
    let frame = client.read_frame().expect("a response");
    assert_eq!(i32::from_be_bytes(frame[..4].try_into().expect("4 bytes")), 7, "correlation id");
    assert_eq!(frame[4], 0, "no tagged fields");
    frame.slice(5..)
}

/// A ShareFetch v2 of partition 0: its acquired (offset, count), with the acquire mode and
/// renew flag given, the acknowledgements piggy-backed, and max_records (max_wait 500 ms
/// unless the fetch only renews, whose fetch parameters are zero).
fn fetch_v2(
    client: &mut Client,
    member: &mut Member,
    mode: u8,
    renew: bool,
    max_records: i32,
    acks: Vec<(i64, i64, i8)>,
) -> (i16, Vec<(i64, i16)>) {
    let (wait, max_bytes) = if renew { (0, 0) } else { (500, 1 << 20) };
    let request = share_fetch_request(member, wait, max_records, acks).with_max_bytes(max_bytes);
    // GroupId and MemberId (compact strings), then six int32 up to BatchSize.
    let at = 1 + member.group.len() + 1 + member.id.len() + 24;
    client.write_raw(&v2_frame(78, &request, at, &[mode, u8::from(renew)])).expect("write");
    let mut body = response_body(client);
    let response =
        <ShareFetchResponse as kafka_protocol::protocol::Decodable>::decode(&mut body, 1).expect("v2 answers as v1");
    assert!(body.is_empty(), "nothing left over");
    if response.error_code != code::NONE {
        return (response.error_code, Vec::new());
    }
    member.epoch += 1;
    (code::NONE, acquired(&response))
}

#[test]
fn given_kafka_4_2s_share_fetch_v2_record_limit_mode_caps_what_is_acquired_and_a_renew_only_fetch_acquires_nothing() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    let versions = client.api_versions();
    for key in [78, 79] {
        let range = versions.api_keys.iter().find(|k| k.api_key == key).expect("listed");
        assert_eq!((range.min_version, range.max_version), (1, 2), "API {key}");
    }
    let topic_id = client.create_topic(TOPIC, 1, &[]);
    let messages: Vec<Message> = (0..5).map(|i| Message::new("k", &format!("v{i}"), 1_000 + i)).collect();
    client.produce_ok(TOPIC, 0, batch(&messages));
    client.produce_ok(TOPIC, 0, batch(&messages));
    let group = "kafka-4-2";
    set_group_configs(
        &mut client,
        group,
        &[("share.auto.offset.reset", "earliest"), ("share.record.lock.duration.ms", "2000")],
    );
    let mut member = join(&mut client, group, topic_id);

    // Record-limit mode: 2 of the first batch's 5 records, then 2 more.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut first = Vec::new();
    while first.is_empty() && Instant::now() < deadline {
        first = fetch_v2(&mut client, &mut member, 1, false, 2, Vec::new()).1;
    }
    assert_eq!(first, [(0, 1), (1, 1)], "record-limit: never more than max_records");
    assert_eq!(fetch_v2(&mut client, &mut member, 1, false, 2, Vec::new()).1, [(2, 1), (3, 1)]);
    // Batch-optimized mode (v1's): the rest of the batch and the whole next one, past max_records.
    let rest = fetch_v2(&mut client, &mut member, 0, false, 2, Vec::new()).1;
    assert_eq!(rest.iter().map(|(o, _)| *o).collect::<Vec<_>>(), [4, 5, 6, 7, 8, 9], "whole batches");

    // A renew-only fetch keeps the locks and acquires nothing; one with fetch parameters is refused.
    let renewed_at = Instant::now();
    while renewed_at.elapsed() < Duration::from_millis(3_000) {
        let (error, acquired) = fetch_v2(&mut client, &mut member, 0, true, 0, vec![(0, 9, RENEW)]);
        assert_eq!((error, acquired), (code::NONE, Vec::new()));
        std::thread::sleep(Duration::from_millis(500));
    }
    let mut other = join(&mut client, group, topic_id);
    assert_eq!(fetch(&mut client, &mut other, 0, Vec::new()), [], "renewed locks held after 3 s (lock 2 s)");
    let (error, _) = fetch_v2(&mut client, &mut member, 0, true, 5, vec![(0, 0, RENEW)]);
    assert_eq!(error, 42, "INVALID_REQUEST: a renew-only fetch with max_records");

    // DescribeShareGroupOffsets v1 (Kafka 4.2): the start offset and the lag (10 in flight).
    assert_eq!(start_offset_and_lag(&mut client, group), (0, 10));

    // ShareAcknowledge v2 answers with the lock duration.
    let request = ShareAcknowledgeRequest::default()
        .with_group_id(Some(group_id(group)))
        .with_member_id(Some(s(&member.id)))
        .with_share_session_epoch(member.epoch)
        .with_topics(vec![share_acknowledge_request::AcknowledgeTopic::default()
            .with_topic_id(topic_id)
            .with_partitions(vec![share_acknowledge_request::AcknowledgePartition::default()
                .with_partition_index(0)
                .with_acknowledgement_batches(vec![share_acknowledge_request::AcknowledgementBatch::default()
                    .with_first_offset(0)
                    .with_last_offset(9)
                    .with_acknowledge_types(vec![ACCEPT])])])]);
    let at = 1 + group.len() + 1 + member.id.len() + 4;
    client.write_raw(&v2_frame(79, &request, at, &[0])).expect("write");
    let body = response_body(&mut client);
    // ThrottleTimeMs, ErrorCode, ErrorMessage (null: one byte), then AcquisitionLockTimeoutMs.
    assert_eq!(i16::from_be_bytes(body[4..6].try_into().expect("2")), code::NONE);
    assert_eq!(body[6], 0, "no error message");
    assert_eq!(i32::from_be_bytes(body[7..11].try_into().expect("4")), 2000, "the group's lock duration");
    let mut v1 = bytes::BytesMut::from(&body[..7]);
    v1.extend_from_slice(&body[11..]);
    let mut v1 = v1.freeze();
    let response =
        <ShareAcknowledgeResponse as kafka_protocol::protocol::Decodable>::decode(&mut v1, 1).expect("the rest is v1");
    assert_eq!(response.responses[0].partitions[0].error_code, code::NONE, "every record accepted");
    member.epoch += 1;
    assert_eq!(start_offset(&mut client, group), 10, "all done");
    assert_eq!(start_offset_and_lag(&mut client, group), (10, 0), "no lag");
}

/// DescribeShareGroupOffsets v1 of partition 0 of TOPIC: (start offset, lag).
fn start_offset_and_lag(client: &mut Client, group: &str) -> (i64, i64) {
    let request = DescribeShareGroupOffsetsRequest::default().with_groups(vec![
        describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup::default()
            .with_group_id(group_id(group))
            .with_topics(Some(vec![
                describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestTopic::default()
                    .with_topic_name(TopicName(s(TOPIC)))
                    .with_partitions(vec![0]),
            ])),
    ]);
    client.write_raw(&raw_frame(90, 1, &request, 0, 0, &[])).expect("write");
    let body = response_body(client);
    // Throttle (4), one group (1), its id, one topic (1), its name, its id (16), one partition (1),
    // then index (4), start offset (8), leader epoch (4), lag (8), error (2).
    let at = 4 + 1 + 1 + group.len() + 1 + 1 + TOPIC.len() + 16 + 1;
    assert_eq!(i32::from_be_bytes(body[at..at + 4].try_into().expect("4")), 0, "partition 0");
    let start = i64::from_be_bytes(body[at + 4..at + 12].try_into().expect("8"));
    let lag = i64::from_be_bytes(body[at + 16..at + 24].try_into().expect("8"));
    assert_eq!(i16::from_be_bytes(body[at + 24..at + 26].try_into().expect("2")), code::NONE);
    (start, lag)
}

/// A ShareFetch of partitions 0 and 1 by `member`, waiting up to `wait_ms` for `min_bytes`.
fn fetch_both(client: &mut Client, member: &mut Member, wait_ms: i32, min_bytes: i32) -> Vec<(i32, i64)> {
    let partitions = (0..2).map(|p| share_fetch_request::FetchPartition::default().with_partition_index(p)).collect();
    let request = ShareFetchRequest::default()
        .with_group_id(Some(group_id(&member.group)))
        .with_member_id(Some(s(&member.id)))
        .with_share_session_epoch(member.epoch)
        .with_max_wait_ms(wait_ms)
        .with_min_bytes(min_bytes)
        .with_max_records(100)
        .with_topics(vec![share_fetch_request::FetchTopic::default()
            .with_topic_id(member.topic_id)
            .with_partitions(partitions)]);
    let response = client.send(1, &request).expect("ShareFetch");
    assert_eq!(response.error_code, code::NONE, "{:?}", response.error_message);
    member.epoch += 1;
    let mut got = Vec::new();
    for p in response.responses.iter().flat_map(|t| &t.partitions) {
        assert_eq!(p.error_code, code::NONE, "{p:?}");
        got.extend(
            p.acquired_records.iter().flat_map(|r| (r.first_offset..=r.last_offset).map(|o| (p.partition_index, o))),
        );
    }
    got
}

#[test]
fn given_a_share_fetch_waiting_on_two_partitions_either_ones_record_answers_it_and_min_bytes_holds_it() {
    let broker = Broker::start(&[]);
    let mut client = broker.connect();
    let topic_id = client.create_topic(TOPIC, 2, &[]);
    let group = "waiters";
    set_group_configs(&mut client, group, &[("share.auto.offset.reset", "earliest")]);
    let mut member = join(&mut client, group, topic_id);
    assert_eq!(fetch_both(&mut client, &mut member, 0, 1), [], "nothing yet");

    let mut producer = broker.connect();
    let produce_later = |producer: &mut Client, partition: i32, after: Duration, value: &str| {
        std::thread::sleep(after);
        producer.produce_ok(TOPIC, partition, batch(&[Message::new("k", value, 1_000)]));
    };
    // A record on partition 1 answers the fetch at once, though partition 0 stays empty.
    let started = Instant::now();
    let got = std::thread::scope(|scope| {
        scope.spawn(|| produce_later(&mut producer, 1, Duration::from_millis(300), "one"));
        fetch_both(&mut client, &mut member, 10_000, 1)
    });
    assert_eq!(got, [(1, 0)]);
    assert!(started.elapsed() < Duration::from_secs(5), "answered after {:?}, not at its 10 s wait", started.elapsed());

    // MinBytes of 100 KB: one small record does not answer; the fetch waits out its 1.5 s and
    // answers with what it has.
    let started = Instant::now();
    let got = std::thread::scope(|scope| {
        scope.spawn(|| produce_later(&mut producer, 0, Duration::from_millis(200), "two"));
        fetch_both(&mut client, &mut member, 1_500, 100_000)
    });
    assert_eq!(got, [(0, 0)]);
    assert!(started.elapsed() >= Duration::from_millis(1_400), "answered after {:?}", started.elapsed());
}

/// A heartbeat of `member` at `epoch`: (error code, epoch answered).
fn heartbeat(client: &mut Client, group: &str, member: &str, epoch: i32) -> (i16, i32) {
    let request = ShareGroupHeartbeatRequest::default()
        .with_group_id(group_id(group))
        .with_member_id(s(member))
        .with_member_epoch(epoch);
    let response = client.send(1, &request).expect("ShareGroupHeartbeat");
    (response.error_code, response.member_epoch)
}

#[test]
fn given_a_share_group_its_members_carry_on_at_their_epochs_after_a_kill_9_and_restart() {
    let mut broker = Broker::start(&[]);
    let mut client = broker.connect();
    let topic_id = client.create_topic(TOPIC, 2, &[]);
    let group = "survivors";
    let (a, epoch_a) = join_at(&mut client, group, topic_id);
    let (b, epoch) = join_at(&mut client, group, topic_id);
    // a moves to the epoch of b's join: both at the group's epoch.
    assert_eq!(heartbeat(&mut client, group, &a.id, epoch_a), (code::NONE, epoch));
    assert_eq!(heartbeat(&mut client, group, &b.id, epoch), (code::NONE, epoch));

    broker.kill();
    broker.restart();
    let mut client = broker.connect();
    // Both carry on at their epochs: no UNKNOWN_MEMBER_ID, no rejoin.
    let found = wait_until(Duration::from_secs(20), || heartbeat(&mut client, group, &a.id, epoch).0 == code::NONE);
    assert!(found, "member a is unknown after the restart: {:?}", heartbeat(&mut client, group, &a.id, epoch));
    assert_eq!(heartbeat(&mut client, group, &b.id, epoch), (code::NONE, epoch));
    let describe = ShareGroupDescribeRequest::default().with_group_ids(vec![group_id(group)]);
    let described = client.send(1, &describe).expect("ShareGroupDescribe");
    let mut members: Vec<String> = described.groups[0].members.iter().map(|m| m.member_id.to_string()).collect();
    members.sort();
    let mut expected = vec![a.id.clone(), b.id.clone()];
    expected.sort();
    assert_eq!(members, expected);

    // A member that leaves is gone for good, a restart later too.
    assert_eq!(heartbeat(&mut client, group, &b.id, -1).0, code::NONE);
    // b's leave bumped the group epoch; a's next heartbeat (at its own epoch) moves it on.
    let (code_a, later) = heartbeat(&mut client, group, &a.id, epoch);
    assert_eq!((code_a, later > epoch), (code::NONE, true));
    broker.kill();
    broker.restart();
    let mut client = broker.connect();
    assert!(wait_until(Duration::from_secs(20), || heartbeat(&mut client, group, &a.id, later).0 == code::NONE));
    assert_eq!(heartbeat(&mut client, group, &b.id, later).0, code::UNKNOWN_MEMBER_ID);
}
