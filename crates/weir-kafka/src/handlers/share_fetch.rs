//! ShareFetch and ShareAcknowledge (KIP-932): a share consumer's fetches and acknowledgements,
//! mapped onto the invisible-time engine (`weir_messaging::pop::PopEngine`).
//!
//! - acquiring records is a receive whose invisible time is the group's record lock duration
//!   (`share.record.lock.duration.ms`, else `group.share.record.lock.duration.ms`); the
//!   delivery count is the delivery's attempt, and a record past the group's delivery count
//!   limit goes to the group's dead-letter topic instead (the engine's `max_attempts`);
//! - ACCEPT is an ack, RELEASE a change of invisible time to zero (the count is kept),
//!   REJECT gives the record up to the dead-letter topic (beyond Kafka 4.2, as RocketMQ does),
//!   RENEW (KIP-1222) keeps the lock for another lock duration; GAP needs nothing.
//!
//! Acknowledgements name records by offset, without the engine's delivery nonce: each member's
//! receives give their deliveries the member's own nonce ([`member_nonce`]), so an ack names
//! the member's delivery, and one of a record the member no longer holds (its lock ran out,
//! someone else has it, it was released or it is done) is refused with INVALID_RECORD_STATE.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::share_acknowledge_response::{
    LeaderIdAndEpoch as AckLeader, PartitionData as AckPartitionData, ShareAcknowledgeTopicResponse,
};
use kafka_protocol::messages::share_fetch_response::{
    AcquiredRecords, LeaderIdAndEpoch, NodeEndpoint, PartitionData, ShareFetchableTopicResponse,
};
use kafka_protocol::messages::{
    ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareFetchRequest, ShareFetchResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use uuid::Uuid;
use weir_broker::group_config::{ConsumeFrom, GroupSettings};
use weir_broker::Partition;
use weir_messaging::pop::{self, BatchOffsets, Delivery, HandleError, QueueKey, ReceiveRequest, Received, TagFilter};
use weir_storage::records::{encode_batch, BatchOptions, Record};

use crate::context::{Client, Ctx, ShareEngines};
use crate::errors::kafka_error;
use crate::share_session::{SessionError, FINAL_EPOCH, INITIAL_EPOCH};
use crate::share_versions::{AcquireMode, FetchExtras};

/// Kafka's acknowledge types.
const GAP: i8 = 0;
const ACCEPT: i8 = 1;
const RELEASE: i8 = 2;
const REJECT: i8 = 3;
const RENEW: i8 = 4;

/// Most offsets one acknowledgement batch may name: a bound on the work of one request.
const ACK_BATCH_OFFSETS_MAX: i64 = 10_000;
/// Records a fetch acquires when it does not say (`max_records` 0 or less); Kafka's
/// `max.poll.records` default.
const DEFAULT_MAX_RECORDS: usize = 500;

/// The nonce of every delivery to `member` of `group` (FNV-1a over both): stable, so the
/// member's acknowledgement by offset names its own delivery.
pub(crate) fn member_nonce(group: &str, member: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in group.bytes().chain([0u8]).chain(member.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

fn s(text: impl Into<String>) -> StrBytes {
    StrBytes::from_string(text.into())
}

/// A share group's settings in force: its `share.*` configs over the broker's.
struct ShareSettings {
    lock: Duration,
    delivery_count_limit: u32,
    start: ConsumeFrom,
}

fn share_settings(ctx: &Ctx, group: &str) -> ShareSettings {
    let settings: GroupSettings = ctx.broker.group_settings(group);
    let config = &ctx.broker.config;
    let lock_ms =
        settings.share_record_lock_duration_ms.unwrap_or(i64::from(config.group_share_record_lock_duration_ms));
    let lock =
        Duration::from_millis(lock_ms.max(0) as u64).clamp(pop::receive::MIN_INVISIBLE, pop::receive::MAX_INVISIBLE);
    ShareSettings {
        lock,
        delivery_count_limit: settings
            .share_delivery_count_limit
            .unwrap_or(config.group_share_delivery_count_limit)
            .max(1),
        start: if settings.share_from_earliest { ConsumeFrom::FirstOffset } else { ConsumeFrom::LastOffset },
    }
}

fn session_error(e: SessionError) -> ResponseError {
    match e {
        SessionError::NotFound => ResponseError::ShareSessionNotFound,
        SessionError::InvalidEpoch => ResponseError::InvalidShareSessionEpoch,
        SessionError::LimitReached => ResponseError::ShareSessionLimitReached,
        SessionError::TooManyPartitions => ResponseError::InvalidRequest,
    }
}

/// One partition's acknowledgement batches, as (first, last, types).
type AckBatches = Vec<(i64, i64, Vec<i8>)>;

/// Applies `batches` to the member's deliveries of `key`; the first error, if any (the rest
/// is still applied).
async fn acknowledge(
    engines: &ShareEngines,
    key: &QueueKey,
    nonce: u64,
    batches: &AckBatches,
    lock: Duration,
) -> Option<ResponseError> {
    let mut first_error = None;
    let mut note = |e: ResponseError| {
        first_error.get_or_insert(e);
    };
    // Every (offset, type) named, in order; whether the member holds each, asked at once.
    let mut named: Vec<(i64, i8)> = Vec::new();
    for (first, last, types) in batches {
        let count = last.saturating_sub(*first).saturating_add(1);
        if *first < 0
            || !(1..=ACK_BATCH_OFFSETS_MAX).contains(&count)
            || !(types.len() == 1 || types.len() as i64 == count)
        {
            note(ResponseError::InvalidRequest);
            continue;
        }
        for (i, offset) in (*first..=*last).enumerate() {
            let kind = if types.len() == 1 { types[0] } else { types[i] };
            if kind != GAP {
                named.push((offset, kind));
            }
        }
    }
    let offsets: Vec<i64> = named.iter().map(|(offset, _)| *offset).collect();
    let held = engines.pop.are_held(key, &offsets, nonce).await;
    let mut accepted = Vec::new();
    for ((offset, kind), held) in named.into_iter().zip(held) {
        if !held {
            // Not this member's, or its lock ran out: the record is no longer acquired.
            note(ResponseError::InvalidRecordState);
            continue;
        }
        let done = match kind {
            // Together below: their state writes go out as one.
            ACCEPT => {
                accepted.push((key, offset, nonce));
                continue;
            }
            RELEASE => engines.pop.change_invisible(key, offset, nonce, Duration::ZERO).await.map(|r| r.map(|_| ())),
            REJECT => engines.pop.give_up(key, offset, nonce).await,
            RENEW => engines.pop.extend_invisible(key, offset, nonce, lock).await,
            _ => {
                note(ResponseError::InvalidRequest);
                continue;
            }
        };
        outcome(done, &mut note);
    }
    for done in engines.pop.ack_many(&accepted).await {
        outcome(done, &mut note);
    }
    first_error
}

/// Notes the error of one acknowledgement, if it failed.
fn outcome(done: weir_messaging::pop::HandleResult<()>, note: &mut impl FnMut(ResponseError)) {
    match done {
        Ok(Ok(())) => {}
        Ok(Err(HandleError::NotInFlight | HandleError::Stale)) => note(ResponseError::InvalidRecordState),
        Err(e) => note(kafka_error(e.kind)),
    }
}

/// A member leaving its share group (ShareGroupHeartbeat with epoch -1) whose share session
/// on this broker is still open: the session closes and what the member holds is released.
pub(crate) async fn member_left(ctx: &Ctx, client: &Client, group: &str, member: &str) {
    let Some(engines) = ctx.share.as_ref() else { return };
    if let Ok(partitions) = ctx.share_sessions.advance(client.connection, group, member, FINAL_EPOCH, &[], &[]) {
        release_held(ctx, engines, group, member_nonce(group, member), &partitions).await;
    }
}

/// A closed connection: the share sessions it last served close, and what their members held
/// is released (Kafka's share session cache does the same on a disconnect). A consumer that
/// died thus gives its records back at once rather than after their locks.
pub(crate) async fn connection_closed(ctx: &Ctx, connection: u64) {
    let Some(engines) = ctx.share.as_ref() else { return };
    for session in ctx.share_sessions.connection_closed(connection) {
        let nonce = member_nonce(&session.group, &session.member);
        tracing::debug!(group = %session.group, member = %session.member, "share session closed with its connection");
        release_held(ctx, engines, &session.group, nonce, &session.partitions).await;
    }
}

/// A closed share session: what the member still holds on its partitions becomes available
/// again at once (its delivery count kept), as Kafka releases a departing consumer's records.
pub(crate) async fn release_held(
    ctx: &Ctx,
    engines: &ShareEngines,
    group: &str,
    nonce: u64,
    partitions: &[(Uuid, i32)],
) {
    for &(topic_id, index) in partitions {
        let Ok((name, _)) = local_partition(ctx, topic_id, index) else { continue };
        let key = QueueKey::new(group, name, index);
        for offset in engines.pop.held_by(&key, nonce).await {
            if let Err(e) = engines.pop.change_invisible(&key, offset, nonce, Duration::ZERO).await {
                tracing::warn!(group, offset, error = %e, "cannot release a closed share session's record");
            }
        }
    }
}

/// The partition a share consumer names, led here; or the error for it (with the leader, when
/// known).
fn local_partition(
    ctx: &Ctx,
    topic_id: Uuid,
    index: i32,
) -> Result<(String, Arc<Partition>), (ResponseError, i32, i32)> {
    let metadata = ctx.broker.metadata();
    let Some(topic) = metadata.topic_by_id(topic_id) else {
        return Err((ResponseError::UnknownTopicId, -1, -1));
    };
    let name = topic.name.clone();
    let leader = topic.partition(index).map(|p| (p.leader, p.leader_epoch)).unwrap_or((-1, -1));
    let Some(partition) = ctx.broker.partition(&name, index) else {
        let error = if index < 0 || index >= topic.partitions {
            ResponseError::UnknownTopicOrPartition
        } else {
            ResponseError::NotLeaderOrFollower
        };
        return Err((error, leader.0, leader.1));
    };
    match partition.check_local_leader() {
        Ok(_) => Ok((name, partition)),
        Err(_) => Err((ResponseError::NotLeaderOrFollower, leader.0, leader.1)),
    }
}

/// A receive's answer for one partition: the records, and the acquired ranges, one per run of
/// consecutive offsets with one delivery count. A batch handed out whole goes as the log
/// stores it; the other records (redeliveries, and what went out of a batch only in part) are
/// encoded again, one batch per run of consecutive offsets. Batches are in offset order.
fn encode_received(received: Received) -> (Option<Bytes>, Vec<AcquiredRecords>) {
    let Received { deliveries: mut loose, batches } = received;
    let mut pieces: Vec<(i64, Bytes)> = Vec::new();
    let mut ranges: Vec<(i64, i64, i16)> = Vec::new();
    for delivery in batches {
        let header = &delivery.batch.header;
        if delivery.is_whole() {
            ranges.push((header.base_offset, header.last_offset(), 1));
            pieces.push((header.base_offset, delivery.batch.bytes));
            continue;
        }
        match delivery.batch.transient_records() {
            Ok(records) => {
                let went_out = |offset: i64| match &delivery.offsets {
                    BatchOffsets::Range(first, last) => (*first..=*last).contains(&offset),
                    BatchOffsets::List(offsets) => offsets.binary_search(&offset).is_ok(),
                };
                let records = records.into_iter().filter(|r| went_out(r.offset));
                loose.extend(records.map(|record| Delivery { record, attempt: 1, nonce: delivery.nonce }));
            }
            Err(e) => tracing::warn!(error = %e, "cannot decode an acquired batch"),
        }
    }
    loose.sort_by_key(|d| d.record.offset);
    let mut run: Vec<Record> = Vec::new();
    let mut flush = |run: &mut Vec<Record>| {
        if let Some(first) = run.first() {
            let options = BatchOptions { base_offset: first.offset, ..BatchOptions::default() };
            match encode_batch(run, &options) {
                Ok(batch) => pieces.push((first.offset, batch.freeze())),
                Err(e) => tracing::warn!(error = %e, "cannot encode acquired records"),
            }
        }
        run.clear();
    };
    for delivery in loose {
        let offset = delivery.record.offset;
        if run.last().is_some_and(|r| r.offset + 1 != offset) {
            flush(&mut run);
        }
        ranges.push((offset, offset, i16::try_from(delivery.attempt).unwrap_or(i16::MAX)));
        run.push(delivery.record);
    }
    flush(&mut run);
    pieces.sort_by_key(|(first, _)| *first);
    ranges.sort_unstable();
    let mut acquired: Vec<AcquiredRecords> = Vec::new();
    for (first, last, count) in ranges {
        match acquired.last_mut() {
            Some(prev) if prev.last_offset + 1 == first && prev.delivery_count == count => prev.last_offset = last,
            _ => acquired.push(
                AcquiredRecords::default().with_first_offset(first).with_last_offset(last).with_delivery_count(count),
            ),
        }
    }
    let records = match pieces.len() {
        0 => None,
        1 => pieces.pop().map(|(_, bytes)| bytes),
        _ => {
            let mut bytes = BytesMut::with_capacity(pieces.iter().map(|(_, b)| b.len()).sum());
            for (_, piece) in &pieces {
                bytes.extend_from_slice(piece);
            }
            Some(bytes.freeze())
        }
    };
    (records, acquired)
}

/// What one partition of a ShareFetch answers.
#[derive(Default)]
struct PartitionAnswer {
    error: Option<ResponseError>,
    ack_error: Option<ResponseError>,
    acked: bool,
    leader: (i32, i32),
    received: Received,
}

/// A share group's record lock duration in force, in milliseconds (what ShareFetch, and
/// ShareAcknowledge from v2 on, tell the consumer).
pub(crate) fn record_lock_ms(ctx: &Ctx, group: &str) -> i32 {
    share_settings(ctx, group).lock.as_millis().min(i32::MAX as u128) as i32
}

/// A ShareFetch; `extras`: what a v2 request adds (KIP-1206's acquire mode, KIP-1222's
/// renew-only flag).
pub(crate) async fn share_fetch(
    ctx: &Ctx,
    client: &Client,
    req: ShareFetchRequest,
    extras: FetchExtras,
) -> ShareFetchResponse {
    let refuse = |error: ResponseError, message: &str| {
        ShareFetchResponse::default().with_error_code(error.code()).with_error_message(Some(s(message)))
    };
    let group = req.group_id.as_ref().map(|g| g.to_string()).unwrap_or_default();
    let member = req.member_id.as_ref().map(|m| m.to_string()).unwrap_or_default();
    if group.is_empty() || member.is_empty() {
        return refuse(ResponseError::InvalidRequest, "a share fetch names its group and member");
    }
    if !ctx.allowed_on_group(client, weir_security::acl::AclOperation::Read, &group) {
        return refuse(ResponseError::GroupAuthorizationFailed, "READ on the group is needed");
    }
    let Some(engines) = ctx.share.as_ref() else {
        return refuse(ResponseError::InvalidRequest, "this broker serves no share groups");
    };
    let epoch = req.share_session_epoch;
    if epoch == INITIAL_EPOCH && ctx.groups.share_member_known(&group, &member) == Some(false) {
        return refuse(ResponseError::UnknownMemberId, "not a member of the share group");
    }
    let added: Vec<(Uuid, i32)> =
        req.topics.iter().flat_map(|t| t.partitions.iter().map(move |p| (t.topic_id, p.partition_index))).collect();
    let forgotten: Vec<(Uuid, i32)> =
        req.forgotten_topics_data.iter().flat_map(|t| t.partitions.iter().map(move |p| (t.topic_id, *p))).collect();
    if epoch == FINAL_EPOCH
        && req.topics.iter().flat_map(|t| &t.partitions).any(|p| p.acknowledgement_batches.is_empty())
    {
        return refuse(ResponseError::InvalidRequest, "a closing share fetch only acknowledges");
    }
    // A renew-only fetch (KIP-1222) acquires nothing, and says so with zero fetch parameters.
    if extras.renew_ack && (req.max_wait_ms != 0 || req.min_bytes != 0 || req.max_bytes != 0 || req.max_records != 0) {
        return refuse(ResponseError::InvalidRequest, "a renew-only share fetch has zero fetch parameters");
    }
    let fetch_from = match ctx.share_sessions.advance(client.connection, &group, &member, epoch, &added, &forgotten) {
        Ok(partitions) => partitions,
        Err(e) => return refuse(session_error(e), "share session"),
    };
    let settings = share_settings(ctx, &group);
    let nonce = member_nonce(&group, &member);
    let mut answers: BTreeMap<(Uuid, i32), PartitionAnswer> = BTreeMap::new();

    // Piggy-backed acknowledgements first: what they release may be fetched right after.
    for topic in &req.topics {
        for p in topic.partitions.iter().filter(|p| !p.acknowledgement_batches.is_empty()) {
            let answer = answers.entry((topic.topic_id, p.partition_index)).or_default();
            answer.acked = true;
            match local_partition(ctx, topic.topic_id, p.partition_index) {
                Ok((name, _)) => {
                    let batches: AckBatches = p
                        .acknowledgement_batches
                        .iter()
                        .map(|b| (b.first_offset, b.last_offset, b.acknowledge_types.clone()))
                        .collect();
                    let key = QueueKey::new(group.clone(), name, p.partition_index);
                    answer.ack_error = acknowledge(engines, &key, nonce, &batches, settings.lock).await;
                }
                Err((error, leader, leader_epoch)) => {
                    answer.ack_error = Some(error);
                    answer.leader = (leader, leader_epoch);
                }
            }
        }
    }

    if epoch == FINAL_EPOCH {
        release_held(ctx, engines, &group, nonce, &fetch_from).await;
    } else if !extras.renew_ack {
        let max_records = if req.max_records > 0 {
            (req.max_records as usize).min(pop::receive::MAX_BATCH)
        } else {
            DEFAULT_MAX_RECORDS
        };
        let mut requests: Vec<((Uuid, i32), ReceiveRequest)> = Vec::new();
        for (topic_id, index) in fetch_from {
            match local_partition(ctx, topic_id, index) {
                Ok((name, partition)) => {
                    let request = ReceiveRequest {
                        key: QueueKey::new(group.clone(), name, index),
                        partition,
                        filter: TagFilter::All,
                        batch: max_records,
                        invisible: settings.lock,
                        long_polling: Duration::ZERO,
                        max_attempts: settings.delivery_count_limit,
                        fifo: false,
                        start: settings.start,
                        hold_for: None,
                        nonce: Some(nonce),
                        // Record-limit mode never hands out more than max_records: by record.
                        whole_batches: extras.acquire_mode == AcquireMode::BatchOptimized,
                    };
                    requests.push(((topic_id, index), request));
                }
                Err((error, leader, leader_epoch)) => {
                    let answer = answers.entry((topic_id, index)).or_default();
                    answer.error = Some(error);
                    answer.leader = (leader, leader_epoch);
                }
            }
        }
        // Waits up to MaxWaitMs until MinBytes (at least one record) are acquired, woken by
        // any of the partitions.
        let wait = Duration::from_millis(req.max_wait_ms.max(0) as u64).min(pop::receive::MAX_LONG_POLLING);
        let min_bytes = usize::try_from(req.min_bytes).unwrap_or(0);
        let (at, requests): (Vec<(Uuid, i32)>, Vec<ReceiveRequest>) = requests.into_iter().unzip();
        let received = engines.pop.receive_many(&requests, max_records, min_bytes, wait).await;
        for (at, result) in at.into_iter().zip(received) {
            let answer = answers.entry(at).or_default();
            match result {
                Ok(received) => answer.received = received,
                Err(e) => answer.error = Some(kafka_error(e.kind)),
            }
        }
    }

    let mut topics: BTreeMap<Uuid, Vec<PartitionData>> = BTreeMap::new();
    // The leaders of partitions led elsewhere, so the consumer fetches there (KIP-951).
    let mut elsewhere: std::collections::BTreeSet<i32> = std::collections::BTreeSet::new();
    for ((topic_id, index), mut answer) in answers {
        if answer.error == Some(ResponseError::NotLeaderOrFollower) && answer.leader.0 >= 0 {
            elsewhere.insert(answer.leader.0);
        }
        if answer.error.is_none() && !answer.acked && answer.received.is_empty() {
            continue;
        }
        let (records, acquired) = encode_received(std::mem::take(&mut answer.received));
        let mut data = PartitionData::default()
            .with_partition_index(index)
            .with_error_code(answer.error.map_or(0, |e| e.code()))
            .with_acknowledge_error_code(answer.ack_error.map_or(0, |e| e.code()))
            .with_current_leader(
                LeaderIdAndEpoch::default().with_leader_id(answer.leader.0).with_leader_epoch(answer.leader.1),
            )
            .with_records(records)
            .with_acquired_records(acquired);
        if answer.error.is_none() {
            let leader = (
                ctx.broker.config.node_id,
                ctx.broker
                    .metadata()
                    .topic_by_id(topic_id)
                    .and_then(|t| t.partition(index))
                    .map_or(-1, |p| p.leader_epoch),
            );
            data = data
                .with_current_leader(LeaderIdAndEpoch::default().with_leader_id(leader.0).with_leader_epoch(leader.1));
        }
        topics.entry(topic_id).or_default().push(data);
    }
    let node_endpoints = ctx
        .broker
        .brokers_for_clients()
        .into_iter()
        .filter(|b| elsewhere.contains(&b.id))
        .map(|b| {
            let (host, port) = ctx.endpoint(&b, client.listener);
            NodeEndpoint::default()
                .with_node_id(kafka_protocol::messages::BrokerId(b.id))
                .with_host(s(host))
                .with_port(i32::from(port))
                .with_rack(b.rack.map(s))
        })
        .collect();
    ShareFetchResponse::default()
        .with_node_endpoints(node_endpoints)
        .with_acquisition_lock_timeout_ms(settings.lock.as_millis().min(i32::MAX as u128) as i32)
        .with_responses(
            topics
                .into_iter()
                .map(|(topic_id, partitions)| {
                    ShareFetchableTopicResponse::default().with_topic_id(topic_id).with_partitions(partitions)
                })
                .collect(),
        )
}

pub(crate) async fn share_acknowledge(
    ctx: &Ctx,
    client: &Client,
    req: ShareAcknowledgeRequest,
) -> ShareAcknowledgeResponse {
    let refuse = |error: ResponseError, message: &str| {
        ShareAcknowledgeResponse::default().with_error_code(error.code()).with_error_message(Some(s(message)))
    };
    let group = req.group_id.as_ref().map(|g| g.to_string()).unwrap_or_default();
    let member = req.member_id.as_ref().map(|m| m.to_string()).unwrap_or_default();
    if group.is_empty() || member.is_empty() {
        return refuse(ResponseError::InvalidRequest, "an acknowledgement names its group and member");
    }
    if !ctx.allowed_on_group(client, weir_security::acl::AclOperation::Read, &group) {
        return refuse(ResponseError::GroupAuthorizationFailed, "READ on the group is needed");
    }
    let Some(engines) = ctx.share.as_ref() else {
        return refuse(ResponseError::InvalidRequest, "this broker serves no share groups");
    };
    let closed = match ctx.share_sessions.acknowledge(client.connection, &group, &member, req.share_session_epoch) {
        Ok(closed) => closed,
        Err(e) => return refuse(session_error(e), "share session"),
    };
    let settings = share_settings(ctx, &group);
    let nonce = member_nonce(&group, &member);
    let mut topics = Vec::with_capacity(req.topics.len());
    for topic in &req.topics {
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for p in &topic.partitions {
            let (error, leader) = match local_partition(ctx, topic.topic_id, p.partition_index) {
                Ok((name, partition)) => {
                    let batches: AckBatches = p
                        .acknowledgement_batches
                        .iter()
                        .map(|b| (b.first_offset, b.last_offset, b.acknowledge_types.clone()))
                        .collect();
                    let key = QueueKey::new(group.clone(), name, p.partition_index);
                    let error = acknowledge(engines, &key, nonce, &batches, settings.lock).await;
                    (error, (ctx.broker.config.node_id, partition.leader_epoch()))
                }
                Err((error, leader, epoch)) => (Some(error), (leader, epoch)),
            };
            partitions.push(
                AckPartitionData::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(error.map_or(0, |e| e.code()))
                    .with_current_leader(AckLeader::default().with_leader_id(leader.0).with_leader_epoch(leader.1)),
            );
        }
        topics.push(ShareAcknowledgeTopicResponse::default().with_topic_id(topic.topic_id).with_partitions(partitions));
    }
    release_held(ctx, engines, &group, nonce, &closed).await;
    ShareAcknowledgeResponse::default().with_responses(topics)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_members_nonce_is_stable_and_differs_between_members_and_groups() {
        assert_eq!(member_nonce("g", "a"), member_nonce("g", "a"));
        assert_ne!(member_nonce("g", "a"), member_nonce("g", "b"));
        assert_ne!(member_nonce("ga", ""), member_nonce("g", "a"));
    }

    fn delivery(offset: i64, attempt: u32) -> Delivery {
        let mut record = Record::new(0, None, Some(Bytes::from_static(b"v")));
        record.offset = offset;
        Delivery { record, attempt, nonce: 1 }
    }

    /// A stored batch of `offsets` (consecutive or not).
    fn stored(offsets: &[i64]) -> weir_broker::StoredBatch {
        let records: Vec<Record> = offsets
            .iter()
            .map(|o| {
                let mut record = Record::new(0, None, Some(Bytes::from_static(b"v")));
                record.offset = *o;
                record
            })
            .collect();
        let options = BatchOptions { base_offset: offsets[0], ..BatchOptions::default() };
        let bytes = encode_batch(&records, &options).expect("encodes").freeze();
        let header = weir_storage::BatchHeader::parse(&bytes).expect("a header");
        weir_broker::StoredBatch { header, bytes }
    }

    fn batch(offsets: &[i64], went_out: BatchOffsets) -> pop::BatchDelivery {
        pop::BatchDelivery { batch: stored(offsets), offsets: went_out, nonce: 1 }
    }

    fn offsets_of(records: &Bytes) -> Vec<i64> {
        let batches = weir_storage::records::decode_batches(records).expect("decodable");
        batches.iter().flat_map(|b| b.records.iter().map(|r| r.offset)).collect()
    }

    #[test]
    fn deliveries_are_acquired_in_ranges_of_consecutive_offsets_with_one_count() {
        let deliveries = vec![delivery(5, 1), delivery(3, 1), delivery(4, 2), delivery(9, 2), delivery(10, 2)];
        let (records, acquired) = encode_received(Received { deliveries, batches: Vec::new() });
        let ranges: Vec<(i64, i64, i16)> =
            acquired.iter().map(|a| (a.first_offset, a.last_offset, a.delivery_count)).collect();
        assert_eq!(ranges, [(3, 3, 1), (4, 4, 2), (5, 5, 1), (9, 10, 2)]);
        let records = records.expect("records");
        assert_eq!(offsets_of(&records), [3, 4, 5, 9, 10], "two batches: 3..=5 and 9..=10");
        assert_eq!(encode_received(Received::default()).0, None);
    }

    #[test]
    fn whole_batches_go_as_stored_and_partial_ones_only_with_what_went_out() {
        let whole = batch(&[20, 21, 22], BatchOffsets::Range(20, 22));
        let stored_bytes = whole.batch.bytes.clone();
        let received = Received {
            deliveries: vec![delivery(2, 3)],
            batches: vec![
                whole,
                // Begun before the receive's start: only 11 and 12 went out.
                batch(&[10, 11, 12], BatchOffsets::Range(11, 12)),
                // Named one by one (as a batch compaction thinned is): only 31 went out.
                batch(&[30, 31], BatchOffsets::List(vec![31])),
            ],
        };
        let (records, acquired) = encode_received(received);
        let ranges: Vec<(i64, i64, i16)> =
            acquired.iter().map(|a| (a.first_offset, a.last_offset, a.delivery_count)).collect();
        assert_eq!(ranges, [(2, 2, 3), (11, 12, 1), (20, 22, 1), (31, 31, 1)]);
        let records = records.expect("records");
        assert_eq!(offsets_of(&records), [2, 11, 12, 20, 21, 22, 31], "in offset order, nothing that did not go out");
        assert!(
            records.windows(stored_bytes.len()).any(|w| w == &stored_bytes[..]),
            "the whole batch is sent as stored"
        );
    }
}
