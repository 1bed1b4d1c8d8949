//! Fetch: long polling (the core's `Broker::fetch`), zero copy and incremental fetch sessions.
//!
//! The handler resolves the requested partitions, lets the core read them (parking until
//! `min_bytes` are there or `max_wait_ms` passes), and encodes the response with a placeholder
//! where each file range goes; `zero_copy` sends the ranges with `sendfile`.
//!
//! Fetch sessions (KIP-227, Fetch v7+) are granted as Kafka grants them (see `fetch_session`
//! for the rules): a request at epoch 0 opens one if the cache has room, and later requests
//! name only what changed. A session's fetch reads the partitions its request names and those
//! its watch marked changed, answers with the ones that have something new, and when there is
//! nothing parks on the session's watch (one `Notify`), not on every partition: an idle session
//! costs the same at 10 partitions as at 10,000. Sessionless requests (epoch -1) read every
//! partition they name, as before.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, EpochEndOffset, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use uuid::Uuid;
use weir_broker::fetch::{FetchPartition, FetchRequest as CoreFetch, FetchedPartition, Isolation};
use weir_broker::metrics::OperationMetrics;
use weir_broker::partition::{self, Partition, TopicPartitions};
use weir_security::acl::AclOperation;
use weir_storage::sync::lock;
use weir_storage::FileSlice;

use crate::context::{Client, Ctx};
use crate::errors::kafka_error;
use crate::fetch_session::{Found, Position, Session, TopicRef, FINAL_EPOCH, INITIAL_EPOCH};
use crate::frame::{self, FrameError, ResponseFrame};
use crate::quota::Charge;
use crate::zero_copy;

/// One requested partition: its place in the response, and either its index in the core's
/// fetch or the error it gets without a read.
struct Wanted {
    topic_index: usize,
    partition_index: i32,
    target: Result<usize, ResponseError>,
}

pub(crate) async fn handle(
    ctx: &Ctx,
    client: &Client,
    correlation_id: i32,
    request: FetchRequest,
    charge: Option<&Charge>,
) -> Result<ResponseFrame, FrameError> {
    let version = client.version;
    let metrics = crate::dispatch::api_metrics(&ctx.metrics, ApiKey::Fetch);
    // A follower replicating from this leader names itself: the replica id (v15+: in the
    // replica state); consumers send -1.
    let replica_id = if version >= 15 { request.replica_state.replica_id.0 } else { request.replica_id.0 };
    let replica_id = (replica_id >= 0).then_some(replica_id);

    if version >= 7 {
        let sessions = &ctx.fetch_sessions;
        let uses_topic_ids = version >= 13;
        let now = Instant::now();
        match request.session_epoch {
            FINAL_EPOCH => {
                if request.session_id != 0 {
                    sessions.remove(request.session_id);
                }
            }
            INITIAL_EPOCH => {
                if request.session_id != 0 {
                    sessions.remove(request.session_id);
                }
                let size = request.topics.iter().map(|t| t.partitions.len()).sum();
                if let Some(session) = sessions.create(replica_id.is_some(), uses_topic_ids, size, now) {
                    let turn = Turn { ctx, client, metrics, version, correlation_id, replica_id, full: true, charge };
                    return turn.fetch(&request, session).await;
                }
            }
            epoch => match sessions.take_turn(request.session_id, epoch, uses_topic_ids, now) {
                Ok(session) => {
                    let turn = Turn { ctx, client, metrics, version, correlation_id, replica_id, full: false, charge };
                    return turn.fetch(&request, session).await;
                }
                Err(code) => return refuse_session(metrics, version, correlation_id, code),
            },
        }
    }

    let Resolved { topics, wanted, reads } = resolve(ctx, client, &request, version, replica_id);
    // A partition that failed already answers the fetch: no waiting (as Kafka does).
    let any_failed = wanted.iter().any(|w| w.target.is_err());
    let fetch = core_fetch(&request, version, reads, any_failed, replica_id);
    let mut found: Vec<Option<FetchedPartition>> = match ctx.broker.fetch(fetch).await {
        Ok(found) => found.into_iter().map(Some).collect(),
        Err(e) => return Err(FrameError::Io(std::io::Error::other(e))),
    };

    // Build the response with a placeholder where each file range goes.
    let mut files = Vec::new();
    let mut responses: Vec<FetchableTopicResponse> =
        topics.iter().map(|(name, id)| topic_response(version, name.clone(), *id)).collect();
    // Error codes are counted as the response is built (the write may still fail).
    let mut errors = metrics.map(|m| m.error_counter());
    for w in wanted.iter() {
        let fetched = match w.target {
            Ok(index) => found.get_mut(index).and_then(Option::take).ok_or(ResponseError::UnknownServerError),
            Err(code) => Err(code),
        };
        let data = PartitionData::default().with_partition_index(w.partition_index);
        let data = match fetched {
            Err(code) => failed_partition(data, code),
            Ok(f) => fetched_partition(data, f, version, &mut files),
        };
        if let Some(errors) = &mut errors {
            errors.count(data.error_code);
        }
        responses[w.topic_index].partitions.push(data);
    }
    drop(errors);
    let response = FetchResponse::default().with_session_id(0).with_responses(responses);
    send(version, correlation_id, response, files, charge.map(|c| (ctx, c)))
}

/// The response's entry for a topic: v13+ identifies topics by id only, earlier versions by
/// name only.
fn topic_response(version: i16, name: TopicName, id: Uuid) -> FetchableTopicResponse {
    if version >= 13 {
        FetchableTopicResponse::default().with_topic_id(id)
    } else {
        FetchableTopicResponse::default().with_topic(name)
    }
}

/// Encodes `response` and splices the file ranges in. With a client quota, the response's
/// bytes are counted against its consumer_byte_rate first, and the throttle goes in it.
fn send(
    version: i16,
    correlation_id: i32,
    mut response: FetchResponse,
    files: Vec<FileSlice>,
    charge: Option<(&Ctx, &Charge)>,
) -> Result<ResponseFrame, FrameError> {
    if let Some((ctx, charge)) = charge {
        charge.fetched(ctx, response_bytes(&response, &files));
        response.throttle_time_ms = charge.throttle_time_ms(ctx);
    }
    let encoded = frame::encode_response(ApiKey::Fetch, version, correlation_id, &response)?;
    zero_copy::splice_files(encoded, files, version >= 12).map_err(|reason| FrameError::Encode {
        api_key: ApiKey::Fetch,
        version,
        reason,
    })
}

/// About what a fetch response weighs: its records (in files or in memory) and some bytes of
/// framing per partition (what consumer_byte_rate counts).
fn response_bytes(response: &FetchResponse, files: &[FileSlice]) -> u64 {
    const PER_PARTITION: u64 = 64;
    let in_files: u64 = files.iter().map(|f| f.len).sum();
    let partitions = response.responses.iter().flat_map(|t| &t.partitions);
    let in_memory: u64 = partitions.map(|p| PER_PARTITION + p.records.as_ref().map_or(0, |r| r.len() as u64)).sum();
    in_files + in_memory
}

/// One fetch through a session.
struct Turn<'a> {
    ctx: &'a Ctx,
    client: &'a Client,
    metrics: Option<&'a OperationMetrics>,
    version: i16,
    correlation_id: i32,
    replica_id: Option<i32>,
    /// A full request (epoch 0): every partition is read and answered.
    full: bool,
    /// What the fetch costs its client, with a client quota.
    charge: Option<&'a Charge>,
}

/// A session partition's read: what the core found, or the error it gets without a read.
type SlotRead = Result<FetchedPartition, ResponseError>;

impl Turn<'_> {
    async fn fetch(self, request: &FetchRequest, session: Arc<Session>) -> Result<ResponseFrame, FrameError> {
        let broker = &self.ctx.broker;
        let mut candidates = self.apply(request, &session);
        let heartbeat = self.replica_id.and_then(|replica| broker.follower_heartbeats.last(replica));
        if let Some(replica) = self.replica_id {
            // Before the watch is drained: a change after this is read at the next fetch.
            broker.follower_heartbeats.beat(replica, Instant::now());
        }
        let deadline = tokio::time::Instant::now() + Duration::from_millis(request.max_wait_ms.max(0) as u64);
        let max_bytes = if request.max_bytes <= 0 { i32::MAX as u64 } else { request.max_bytes as u64 };
        let min_bytes = request.min_bytes.max(0) as u64;
        // The latest read of each slot, in the order first read.
        let mut reads: Vec<(u32, SlotRead)> = Vec::new();
        let mut read_at: HashMap<u32, usize> = HashMap::new();
        loop {
            candidates.extend(session.watch.drain());
            candidates.extend(lock(&session.partitions).unresolved());
            let mut seen = HashSet::new();
            candidates.retain(|slot| seen.insert(*slot));
            if !candidates.is_empty() {
                let bytes: u64 = reads.iter().map(|(_, r)| r.as_ref().map_or(0, FetchedPartition::bytes)).sum();
                let fresh = self
                    .read(
                        request,
                        &session,
                        std::mem::take(&mut candidates),
                        max_bytes.saturating_sub(bytes),
                        heartbeat,
                    )
                    .await?;
                for (slot, read) in fresh {
                    match read_at.get(&slot) {
                        Some(&at) => reads[at].1 = read,
                        None => {
                            read_at.insert(slot, reads.len());
                            reads.push((slot, read));
                        }
                    }
                }
            }
            let bytes: u64 = reads.iter().map(|(_, r)| r.as_ref().map_or(0, FetchedPartition::bytes)).sum();
            // A failed partition, or a follower that must truncate first, answers at once.
            let failed = reads.iter().any(|(_, r)| match r {
                Err(_) => true,
                Ok(f) => f.error.is_some() || f.diverging_epoch.is_some() || f.preferred_read_replica.is_some(),
            });
            if bytes >= min_bytes || failed || tokio::time::Instant::now() >= deadline || broker.is_shutting_down() {
                break;
            }
            broker.wait_for_change(&session.watch, deadline).await;
        }
        self.answer(request, &session, reads)
    }

    /// Brings the session in line with the request (its partitions added or updated, then the
    /// forgotten ones removed); returns the slots to read: those the request named, or every
    /// one for a full request.
    fn apply(&self, request: &FetchRequest, session: &Session) -> Vec<u32> {
        let state = self.ctx.broker.metadata();
        let mut partitions = lock(&session.partitions);
        let mut named = Vec::new();
        for topic in &request.topics {
            let (key, name) = if session.uses_topic_ids {
                (TopicRef::Id(topic.topic_id), state.topic_by_id(topic.topic_id).map(|t| t.name.clone()))
            } else {
                let name = topic.topic.to_string();
                (TopicRef::Name(name.clone()), Some(name))
            };
            for p in &topic.partitions {
                let position = Position {
                    fetch_offset: p.fetch_offset,
                    max_bytes: p.partition_max_bytes,
                    current_leader_epoch: p.current_leader_epoch,
                    last_fetched_epoch: p.last_fetched_epoch,
                };
                named.push(partitions.upsert((key.clone(), p.partition), name.clone(), position));
            }
        }
        for topic in &request.forgotten_topics_data {
            let key = if session.uses_topic_ids {
                TopicRef::Id(topic.topic_id)
            } else {
                TopicRef::Name(topic.topic.to_string())
            };
            for index in &topic.partitions {
                if let Some((slot, Some(partition))) = partitions.forget(&(key.clone(), *index)) {
                    partition.unwatch(&session.watch, slot);
                }
            }
        }
        self.ctx.fetch_sessions.resize(session.id, partitions.len());
        if self.full {
            return partitions.all();
        }
        named.retain(|slot| partitions.slot(*slot).is_some());
        named
    }

    /// Reads `slots` once (no waiting), each from the position the session holds; resolves
    /// (and watches) their partitions first, so that a change after the read marks them.
    async fn read(
        &self,
        request: &FetchRequest,
        session: &Session,
        slots: Vec<u32>,
        max_bytes: u64,
        heartbeat: Option<Instant>,
    ) -> Result<Vec<(u32, SlotRead)>, FrameError> {
        let broker = &self.ctx.broker;
        let mut out: Vec<(u32, SlotRead)> = Vec::with_capacity(slots.len());
        let mut core = Vec::new();
        let mut core_slots = Vec::new();
        {
            let state = broker.metadata();
            let mut topics: HashMap<String, Option<TopicPartitions>> = HashMap::new();
            let mut partitions = lock(&session.partitions);
            for slot in slots {
                let Some(entry) = partitions.slot_mut(slot) else { continue };
                if entry.topic_name.is_none() {
                    if let TopicRef::Id(id) = &entry.key.0 {
                        entry.topic_name = state.topic_by_id(*id).map(|t| t.name.clone());
                    }
                }
                let (index, position) = (entry.key.1, entry.position);
                let Some(name) = entry.topic_name.clone() else {
                    out.push((slot, Err(ResponseError::UnknownTopicId)));
                    continue;
                };
                if !may_read(self.ctx, self.client, self.replica_id, &name) {
                    out.push((slot, Err(ResponseError::TopicAuthorizationFailed)));
                    continue;
                }
                let list = topics.entry(name.clone()).or_insert_with(|| broker.topic_partitions(&name));
                let current: Option<Arc<Partition>> =
                    list.as_deref().and_then(|list| partition::by_index(list, index)).cloned();
                let unchanged = match (&entry.partition, &current) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    (None, None) => true,
                    _ => false,
                };
                if !unchanged {
                    if let Some(p) = &current {
                        p.watch(&session.watch, slot);
                    }
                    if let Some(old) = partitions.resolve(slot, current.clone()) {
                        old.unwatch(&session.watch, slot);
                    }
                }
                let Some(partition) = current else {
                    out.push((slot, Err(kafka_error(broker.absent_partition_error(&name, index).kind))));
                    continue;
                };
                core.push(FetchPartition {
                    partition,
                    offset: position.fetch_offset,
                    max_bytes: position.max_bytes.max(0) as u64,
                    current_leader_epoch: (position.current_leader_epoch >= 0).then_some(position.current_leader_epoch),
                    last_fetched_epoch: (self.replica_id.is_some()
                        && self.version >= 12
                        && position.last_fetched_epoch >= 0)
                        .then_some(position.last_fetched_epoch),
                });
                core_slots.push(slot);
            }
        }
        if core.is_empty() {
            return Ok(out);
        }
        let mut fetch = core_fetch(request, self.version, core, true, self.replica_id);
        fetch.max_bytes = max_bytes;
        fetch.min_bytes = 0;
        fetch.session_heartbeat = heartbeat;
        let found = self.ctx.broker.fetch(fetch).await.map_err(|e| FrameError::Io(std::io::Error::other(e)))?;
        out.extend(core_slots.into_iter().zip(found.into_iter().map(Ok)));
        Ok(out)
    }

    /// The answer: every partition read for a full request; for an incremental one, those with
    /// something new (see `fetch_session`). A partition that may still have something to say
    /// (an error, records after what was sent) stays marked, so the next fetch reads it again,
    /// as Kafka, which reads every partition each time, would.
    fn answer(
        &self,
        request: &FetchRequest,
        session: &Session,
        reads: Vec<(u32, SlotRead)>,
    ) -> Result<ResponseFrame, FrameError> {
        let version = self.version;
        let mut files = Vec::new();
        let mut responses: Vec<FetchableTopicResponse> = Vec::new();
        let mut topic_at: HashMap<TopicRef, usize> = HashMap::new();
        let mut errors = self.metrics.map(|m| m.error_counter());
        let mut again = Vec::new();
        let mut answered = Vec::with_capacity(reads.len());
        {
            let mut partitions = lock(&session.partitions);
            for (slot, read) in reads {
                let found = match &read {
                    Err(_) => Found {
                        high_watermark: -1,
                        last_stable_offset: -1,
                        log_start_offset: -1,
                        has_error: true,
                        ..Found::default()
                    },
                    Ok(f) => Found {
                        high_watermark: f.offsets.map_or(-1, |o| o.high_watermark),
                        last_stable_offset: f.offsets.map_or(-1, |o| o.last_stable_offset),
                        log_start_offset: f.offsets.map_or(-1, |o| o.log_start_offset),
                        has_records: f.slice.is_some(),
                        has_error: f.error.is_some(),
                        diverging: f.diverging_epoch.is_some(),
                        preferred_replica: f.preferred_read_replica.is_some(),
                    },
                };
                let respond = partitions.must_respond(slot, found) || self.full;
                let Some(entry) = partitions.slot(slot) else { continue };
                if found.has_error
                    || found.has_records
                    || self.has_more(request, entry.partition.as_deref(), entry.position.fetch_offset)
                {
                    again.push(slot);
                }
                if !respond {
                    continue;
                }
                let topic = entry.key.0.clone();
                let at = *topic_at.entry(topic.clone()).or_insert_with(|| {
                    let (name, id) = match &topic {
                        TopicRef::Name(name) => (name.clone(), Uuid::nil()),
                        TopicRef::Id(id) => (entry.topic_name.clone().unwrap_or_default(), *id),
                    };
                    responses.push(topic_response(version, TopicName(StrBytes::from_string(name)), id));
                    responses.len() - 1
                });
                answered.push((at, entry.key.1, read));
            }
        }
        // Grouped by topic, in the order the response encodes them: the file ranges are
        // spliced in by placeholders numbered in that order (reads of several passes can
        // interleave topics).
        answered.sort_by_key(|(at, _, _)| *at);
        for (at, index, read) in answered {
            let data = PartitionData::default().with_partition_index(index);
            let data = match read {
                Err(code) => failed_partition(data, code),
                Ok(f) => fetched_partition(data, f, version, &mut files),
            };
            if let Some(errors) = &mut errors {
                errors.count(data.error_code);
            }
            responses[at].partitions.push(data);
        }
        drop(errors);
        for slot in again {
            session.watch.mark(slot);
        }
        let response = FetchResponse::default().with_session_id(session.id).with_responses(responses);
        send(version, self.correlation_id, response, files, self.charge.map(|c| (self.ctx, c)))
    }

    /// Whether `partition` has records at or after `fetch_offset` that this reader may read
    /// (up to the log end for a follower, the high watermark or last stable offset for a
    /// consumer) and a read did not return: the byte limits left it out.
    fn has_more(&self, request: &FetchRequest, partition: Option<&Partition>, fetch_offset: i64) -> bool {
        let Some(partition) = partition else { return false };
        let log = &partition.log;
        let bound = match (self.replica_id, request.isolation_level) {
            (Some(_), _) => log.log_end_offset(),
            (None, 1) => log.last_stable_offset(),
            (None, _) => log.high_watermark(),
        };
        bound > fetch_offset
    }
}

/// A request for a session that is not there (or at the wrong epoch, or with topic ids where
/// the session has names): the top-level error, session id 0, no partitions; the client opens
/// a new session.
fn refuse_session(
    metrics: Option<&OperationMetrics>,
    version: i16,
    correlation_id: i32,
    error: ResponseError,
) -> Result<ResponseFrame, FrameError> {
    if let Some(metrics) = metrics {
        metrics.count_errors([i32::from(error.code())]);
    }
    let response = FetchResponse::default().with_error_code(error.code());
    let encoded = frame::encode_response(ApiKey::Fetch, version, correlation_id, &response)?;
    Ok(ResponseFrame { chunks: vec![frame::Chunk::Bytes(encoded.freeze())] })
}

/// The request's topics and partitions, resolved against the metadata.
struct Resolved {
    /// Each requested topic's name and id, in request order.
    topics: Vec<(TopicName, Uuid)>,
    /// Each requested partition, in request order.
    wanted: Vec<Wanted>,
    /// What the core reads: the partitions that exist here.
    reads: Vec<FetchPartition>,
}

/// Finds each requested partition (v13+ names topics by id, earlier versions by name); one that
/// does not exist here gets its error without a read.
/// May this fetch read `topic`? A follower needs CLUSTER_ACTION on the cluster (implied on a
/// cluster's inter-broker listener); a consumer, READ on the topic.
fn may_read(ctx: &Ctx, client: &Client, replica_id: Option<i32>, topic: &str) -> bool {
    if !ctx.broker.authorizer_enabled() {
        return true;
    }
    match replica_id {
        Some(_) => ctx.on_inter_broker_listener(client) || ctx.allowed_on_cluster(client, AclOperation::ClusterAction),
        None => ctx.allowed_on_topic(client, AclOperation::Read, topic),
    }
}

fn resolve(ctx: &Ctx, client: &Client, request: &FetchRequest, version: i16, replica_id: Option<i32>) -> Resolved {
    let broker = &ctx.broker;
    let state = broker.metadata();
    let mut resolved = Resolved { topics: Vec::new(), wanted: Vec::new(), reads: Vec::new() };
    for topic in &request.topics {
        let (name, id) = if version >= 13 {
            match state.topic_by_id(topic.topic_id) {
                Some(t) => (Some(t.name.clone()), t.id),
                None => (None, topic.topic_id),
            }
        } else {
            let name = topic.topic.to_string();
            let id = state.topic(&name).map(|t| t.id).unwrap_or_default();
            (Some(name), id)
        };
        let topic_index = resolved.topics.len();
        // One lookup per topic, not per partition: a consumer of 1,000 partitions names them all
        // in every fetch (librdkafka has no fetch sessions).
        let partitions = name.as_deref().and_then(|name| broker.topic_partitions(name));
        let refused = name.as_deref().is_some_and(|name| !may_read(ctx, client, replica_id, name));
        resolved.topics.push((TopicName(StrBytes::from_string(name.clone().unwrap_or_default())), id));
        for p in &topic.partitions {
            let found = partitions.as_deref().and_then(|list| partition::by_index(list, p.partition));
            let target = match (&name, found) {
                (None, _) => Err(ResponseError::UnknownTopicId),
                (Some(_), _) if refused => Err(ResponseError::TopicAuthorizationFailed),
                (Some(name), None) => Err(kafka_error(broker.absent_partition_error(name, p.partition).kind)),
                (Some(_), Some(partition)) => {
                    resolved.reads.push(FetchPartition {
                        partition: partition.clone(),
                        offset: p.fetch_offset,
                        max_bytes: p.partition_max_bytes.max(0) as u64,
                        current_leader_epoch: (p.current_leader_epoch >= 0).then_some(p.current_leader_epoch),
                        last_fetched_epoch: (replica_id.is_some() && version >= 12 && p.last_fetched_epoch >= 0)
                            .then_some(p.last_fetched_epoch),
                    });
                    Ok(resolved.reads.len() - 1)
                }
            };
            resolved.wanted.push(Wanted { topic_index, partition_index: p.partition, target });
        }
    }
    resolved
}

/// The core's read of `reads`, with the request's limits; no waiting when a partition failed.
fn core_fetch(
    request: &FetchRequest,
    version: i16,
    reads: Vec<FetchPartition>,
    any_failed: bool,
    replica_id: Option<i32>,
) -> CoreFetch {
    let max_wait = if any_failed { Duration::ZERO } else { Duration::from_millis(request.max_wait_ms.max(0) as u64) };
    CoreFetch {
        partitions: reads,
        max_bytes: if request.max_bytes <= 0 { i32::MAX as u64 } else { request.max_bytes as u64 },
        min_bytes: request.min_bytes.max(0) as u64,
        max_wait,
        // isolation_level 1 = READ_COMMITTED.
        isolation: if request.isolation_level == 1 { Isolation::Committed } else { Isolation::HighWatermark },
        replica_id,
        // KIP-392: consumers from v11 may read from a follower, which the leader names by rack.
        follower_reads: version >= 11 && replica_id.is_none(),
        client_rack: (version >= 11 && !request.rack_id.is_empty()).then(|| request.rack_id.to_string()),
        session_heartbeat: None,
    }
}

/// A partition that was not read: its error, no offsets, no records.
fn failed_partition(data: PartitionData, error: ResponseError) -> PartitionData {
    data.with_error_code(error.code())
        .with_high_watermark(-1)
        .with_last_stable_offset(-1)
        .with_log_start_offset(-1)
        .with_records(Some(Bytes::new()))
}

/// A partition the core read: its offsets and, in place of its records, a placeholder for the
/// file range pushed onto `files` (sent with `sendfile`).
fn fetched_partition(
    data: PartitionData,
    fetched: FetchedPartition,
    version: i16,
    files: &mut Vec<FileSlice>,
) -> PartitionData {
    let records = match fetched.slice {
        Some(slice) => {
            let placeholder = zero_copy::placeholder(files.len());
            files.push(slice);
            placeholder
        }
        None => Bytes::new(),
    };
    let error_code = fetched.error.as_ref().map_or(0, |e| kafka_error(e.kind).code());
    // Kafka's -1 for offsets a partition that could not be read does not have.
    let offsets = fetched.offsets;
    data.with_error_code(error_code)
        .with_high_watermark(offsets.map_or(-1, |o| o.high_watermark))
        .with_last_stable_offset(offsets.map_or(-1, |o| o.last_stable_offset))
        .with_log_start_offset(offsets.filter(|_| version >= 5).map_or(-1, |o| o.log_start_offset))
        .with_aborted_transactions(fetched.aborted.map(|list| {
            list.into_iter()
                .map(|t| {
                    AbortedTransaction::default()
                        .with_producer_id(kafka_protocol::messages::ProducerId(t.producer_id))
                        .with_first_offset(t.first_offset)
                })
                .collect()
        }))
        .with_preferred_read_replica(BrokerId(fetched.preferred_read_replica.unwrap_or(-1)))
        .with_diverging_epoch(match fetched.diverging_epoch {
            Some((epoch, end_offset)) if version >= 12 => {
                EpochEndOffset::default().with_epoch(epoch).with_end_offset(end_offset)
            }
            _ => EpochEndOffset::default(),
        })
        .with_records(Some(records))
}
