//! Produce and consume over HTTP (REST-proxy style).
//!
//! Produce turns the JSON records into one uncompressed RecordBatch v2 per partition and appends
//! it with acks=all, exactly as a Kafka producer's batch would be appended, so Kafka consumers
//! read these records like any other. Consume is the core's fetch (`Broker::fetch`, the long
//! poll Kafka's Fetch uses): it reads whole batches up to the high watermark, decodes (and
//! decompresses) them and returns the records at or after the requested offset; with nothing to
//! return it parks until an append wakes it or `timeout_ms` passes.
//!
//! In a cluster, partitions this node does not host are produced to and read from their
//! leaders through `forward`; a read of partitions on several brokers asks them all at once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use weir_broker::fetch::{FetchPartition, FetchRequest, Isolation};
use weir_broker::metadata::elastic::LOGICAL_PARTITIONS;
use weir_broker::metadata::TopicMetadata;
use weir_broker::storage::records::{self, BatchOptions, Header, Record};
use weir_broker::storage::TimestampType;
use weir_broker::{Broker, ErrorKind, Partition};

use crate::api::{
    ConsumedRecord, Encoding, Headers, PartitionPosition, PartitionRecords, ProduceRequest, ProduceResponse,
    ProducedRecord, TopicRecords,
};
use crate::error::ApiError;
use crate::extract::{JsonBody, PathParams, QueryParams};
use crate::forward::{self, ConsumeCall, Consumed, Location};
use crate::partitioner::partition_for_key;
use crate::topics::require_topic;
use crate::SharedState;

/// Records returned by one consume request unless `max_records` says otherwise.
const MAX_RECORDS_DEFAULT: usize = 100;
const MAX_RECORDS_MAX: usize = 10_000;
/// Bytes of batches read by one consume request (at least one batch is always read).
const MAX_BYTES_DEFAULT: u64 = 1 << 20;
const MAX_BYTES_MAX: u64 = 16 << 20;
/// Longest long poll.
const TIMEOUT_MS_MAX: u64 = 60_000;

// ----- produce -------------------------------------------------------------------------------

fn decode_field(text: Option<&str>, encoding: Encoding, what: impl Fn() -> String) -> Result<Option<Bytes>, ApiError> {
    match (text, encoding) {
        (None, _) => Ok(None),
        (Some(text), Encoding::Utf8) => Ok(Some(Bytes::copy_from_slice(text.as_bytes()))),
        (Some(text), Encoding::Base64) => BASE64
            .decode(text)
            .map(|bytes| Some(Bytes::from(bytes)))
            .map_err(|e| ApiError::invalid(format!("{} is not valid base64: {e}", what()))),
    }
}

fn encode_batch(records: &[Record]) -> Result<BytesMut, ApiError> {
    records::encode_batch(records, &BatchOptions::default())
        .map_err(|e| ApiError::internal(format!("cannot encode the record batch: {e}")))
}

/// `POST /v1/topics/{topic}/records`. One batch per partition; each partition's append succeeds
/// or fails as a whole. 200 when at least one partition took its records (a failed one reports
/// its `error` on each of its records), else the first failure's error.
/// The stable partition of an elastic topic holding `logical`, the logical partition record
/// `i` names (`None` when it names none).
fn logical_route(topic: &TopicMetadata, logical: Option<i32>, i: usize) -> Result<Option<i32>, ApiError> {
    let Some(logical) = logical else { return Ok(None) };
    let Some(layout) = &topic.elastic else {
        return Err(ApiError::invalid(format!(
            "record {i}: logical_partition is for elastic topics; topic '{}' is not one (give `partition`)",
            topic.name
        )));
    };
    if !(0..LOGICAL_PARTITIONS).contains(&logical) {
        return Err(ApiError::invalid(format!(
            "record {i}: logical partition {logical} is out of range: an elastic topic has logical partitions 0 to {}",
            LOGICAL_PARTITIONS - 1
        )));
    }
    Ok(Some(layout.stable_for_logical(logical)))
}

pub(crate) async fn produce(
    State(state): State<SharedState>,
    PathParams(topic): PathParams<String>,
    JsonBody(request): JsonBody<ProduceRequest>,
) -> Result<Json<ProduceResponse>, ApiError> {
    let core = state.core()?;
    let broker = &core.broker;
    let metadata = require_topic(broker, &topic)?;
    if request.records.is_empty() {
        return Err(ApiError::invalid("no records to produce: `records` is empty"));
    }
    let encoding = request.encoding;
    let now = broker.now_ms();
    // Partition → (index in the request, record), in request order.
    let mut by_partition: BTreeMap<i32, Vec<(usize, Record)>> = BTreeMap::new();
    for (i, r) in request.records.iter().enumerate() {
        let key = decode_field(r.key.as_deref(), encoding, || format!("record {i}: the key"))?;
        let value = decode_field(r.value.as_deref(), encoding, || format!("record {i}: the value"))?;
        let mut headers = Vec::with_capacity(r.headers.0.len());
        for (name, text) in &r.headers.0 {
            let value = decode_field(text.as_deref(), encoding, || format!("record {i}: header '{name}'"))?;
            headers.push(Header::new(name.clone(), value));
        }
        let timestamp = match r.timestamp {
            Some(t) if t < 0 => {
                return Err(ApiError::new(
                    ErrorKind::InvalidTimestamp,
                    format!("record {i}: timestamp {t} is negative; give ms since the epoch or leave it out"),
                ))
            }
            Some(t) => t,
            None => now,
        };
        let partition = match (r.partition.or(logical_route(&metadata, r.logical_partition, i)?), &key) {
            (Some(p), _) if (0..metadata.partitions).contains(&p) => p,
            (Some(p), _) => return Err(ApiError::unknown_partition(&topic, p)),
            (None, Some(key)) => partition_for_key(key, metadata.partitions),
            (None, None) => {
                let next = state.round_robin.fetch_add(1, Ordering::Relaxed);
                (next % metadata.partitions as u32) as i32
            }
        };
        let mut record = Record::new(timestamp, key, value);
        record.headers = headers;
        by_partition.entry(partition).or_default().push((i, record));
    }

    let mut offsets: Vec<Option<ProducedRecord>> = vec![None; request.records.len()];
    let mut first_error: Option<ApiError> = None;
    let mut appended_any = false;
    for (index, records) in by_partition {
        let batch: Vec<Record> = records.iter().map(|(_, r)| r.clone()).collect();
        let outcome = match encode_batch(&batch) {
            Err(e) => Err(e),
            Ok(buf) => forward::append(broker, &topic, index, buf).await,
        };
        match outcome {
            Ok(info) => {
                appended_any = true;
                for (position, (i, record)) in records.iter().enumerate() {
                    offsets[*i] = Some(ProducedRecord {
                        partition: index,
                        offset: Some(info.first_offset + position as i64),
                        timestamp: Some(info.log_append_time_ms.unwrap_or(record.timestamp)),
                        error: None,
                    });
                }
            }
            Err(e) => {
                tracing::info!(topic = %topic, partition = index, error = %e.message, "HTTP produce failed");
                for (i, _) in &records {
                    offsets[*i] = Some(ProducedRecord {
                        partition: index,
                        offset: None,
                        timestamp: None,
                        error: Some(e.detail()),
                    });
                }
                first_error.get_or_insert(e);
            }
        }
    }
    // One answer per record, in request order: a client matches them up by position.
    debug_assert!(
        offsets.iter().all(Option::is_some),
        "HTTP produce to {topic}: records {:?} got no answer",
        offsets.iter().enumerate().filter(|(_, o)| o.is_none()).map(|(i, _)| i).collect::<Vec<_>>()
    );
    match first_error {
        Some(e) if !appended_any => Err(e),
        _ => Ok(Json(ProduceResponse { offsets: offsets.into_iter().flatten().collect() })),
    }
}

// ----- consume -------------------------------------------------------------------------------

/// Where a consume request reads one partition.
struct Position {
    partition: Arc<Partition>,
    offset: i64,
}

/// What the query string says beyond the positions.
struct ReadLimits {
    max_records: usize,
    max_bytes: u64,
    timeout: Duration,
    encoding: Encoding,
}

impl ReadLimits {
    /// A consume of `positions` of `topic` within these limits.
    fn call(&self, topic: &str, positions: Vec<(i32, String)>) -> ConsumeCall {
        ConsumeCall {
            topic: topic.to_string(),
            positions,
            max_records: self.max_records,
            max_bytes: self.max_bytes,
            timeout_ms: u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
            encoding: self.encoding,
        }
    }
}

/// The `encoding` query parameter (default utf8).
pub(crate) fn encoding_of(query: &QueryParams) -> Result<Encoding, ApiError> {
    match query.get("encoding") {
        None => Ok(Encoding::Utf8),
        Some(text) => Encoding::parse(text)
            .ok_or_else(|| ApiError::invalid(format!("query parameter encoding={text:?}: expected utf8 or base64"))),
    }
}

fn read_limits(query: &QueryParams) -> Result<ReadLimits, ApiError> {
    let encoding = encoding_of(query)?;
    Ok(ReadLimits {
        max_records: query.parse_in("max_records", MAX_RECORDS_DEFAULT, 1, MAX_RECORDS_MAX)?,
        max_bytes: query.parse_in("max_bytes", MAX_BYTES_DEFAULT, 1, MAX_BYTES_MAX)?,
        timeout: Duration::from_millis(query.parse_in("timeout_ms", 0, 0, TIMEOUT_MS_MAX)?),
        encoding,
    })
}

/// Resolves `earliest`, `latest` or a number to an offset the partition can be read from.
fn resolve_offset(partition: &Partition, text: &str) -> Result<i64, ApiError> {
    let log = &partition.log;
    let offset = match text.trim() {
        "earliest" => return Ok(log.log_start_offset()),
        "latest" => return Ok(log.high_watermark()),
        number => number
            .parse::<i64>()
            .map_err(|_| ApiError::invalid(format!("offset {text:?}: expected a number, `earliest` or `latest`")))?,
    };
    let (start, end) = (log.log_start_offset(), log.log_end_offset());
    if offset < start || offset > end {
        return Err(ApiError::new(
            ErrorKind::OffsetOutOfRange,
            format!(
                "offset {offset} is out of range for {}-{}: the log holds offsets {start} to {} (high watermark {})",
                partition.topic,
                partition.index,
                end - 1,
                log.high_watermark()
            ),
        ));
    }
    Ok(offset)
}

pub(crate) fn text_of(bytes: Option<Bytes>, encoding: Encoding) -> Option<String> {
    bytes.map(|b| match encoding {
        Encoding::Utf8 => String::from_utf8_lossy(&b).into_owned(),
        Encoding::Base64 => BASE64.encode(&b),
    })
}

fn consumed(partition: i32, record: Record, timestamp_type: TimestampType, encoding: Encoding) -> ConsumedRecord {
    let timestamp_type = match timestamp_type {
        TimestampType::CreateTime => "CreateTime",
        TimestampType::LogAppendTime => "LogAppendTime",
    };
    ConsumedRecord {
        partition,
        offset: record.offset,
        timestamp: record.timestamp,
        timestamp_type: timestamp_type.to_string(),
        key: text_of(record.key, encoding),
        value: text_of(record.value, encoding),
        headers: Headers(record.headers.into_iter().map(|h| (h.name, text_of(h.value, encoding))).collect()),
    }
}

/// Reads `positions` with the core's fetch until records come back, `limits.timeout` passes or
/// the broker shuts down, and advances each position past what it returns (and past batches
/// with nothing to return: control records, records compacted away).
async fn long_poll(
    broker: &Arc<Broker>,
    mut positions: Vec<Position>,
    limits: ReadLimits,
) -> Result<(Vec<ConsumedRecord>, Vec<Position>), ApiError> {
    let deadline = tokio::time::Instant::now() + limits.timeout;
    loop {
        let request = FetchRequest {
            partitions: positions
                .iter()
                .map(|p| FetchPartition {
                    partition: p.partition.clone(),
                    offset: p.offset,
                    max_bytes: limits.max_bytes,
                    current_leader_epoch: None,
                    last_fetched_epoch: None,
                })
                .collect(),
            max_bytes: limits.max_bytes,
            min_bytes: 1,
            max_wait: deadline.saturating_duration_since(tokio::time::Instant::now()),
            isolation: Isolation::HighWatermark,
            replica_id: None,
            follower_reads: false,
            client_rack: None,
            session_heartbeat: None,
        };
        let fetched = broker.fetch(request).await?;
        let mut out = Vec::new();
        let mut read_any = false;
        for (position, fetched) in positions.iter_mut().zip(fetched) {
            if let Some(e) = fetched.error {
                return Err(e.into());
            }
            let Some(slice) = fetched.slice else { continue };
            // A read that returned records found the partition's offsets too.
            let Some(offsets) = fetched.offsets else { continue };
            read_any = true;
            let (topic, index, from) = (position.partition.topic.clone(), position.partition.index, position.offset);
            let (records, next) = tokio::task::spawn_blocking(move || -> Result<_, ApiError> {
                let bytes = slice.read_to_vec().map_err(weir_broker::BrokerError::from)?;
                let batches = records::decode_batches(&bytes).map_err(|e| {
                    ApiError::new(
                        ErrorKind::Corrupt,
                        format!("cannot decode the batches of {topic}-{index} at offset {from}: {e}"),
                    )
                })?;
                Ok((batches, slice.next_offset))
            })
            .await
            .map_err(|e| ApiError::internal(format!("decode task failed: {e}")))??;
            let mut full = false;
            for batch in records.into_iter().filter(|b| !b.header.is_control()) {
                let timestamp_type = batch.header.timestamp_type();
                for record in batch.records {
                    if record.offset < position.offset || record.offset >= offsets.high_watermark {
                        continue;
                    }
                    if out.len() >= limits.max_records {
                        full = true;
                        break;
                    }
                    position.offset = record.offset + 1;
                    out.push(consumed(index, record, timestamp_type, limits.encoding));
                }
            }
            if full {
                return Ok((out, positions));
            }
            position.offset = position.offset.max(next);
        }
        // With nothing read the fetch waited out the deadline (or the broker is stopping); with
        // only batches that held nothing to return, read on from past them.
        if !out.is_empty() || !read_any || tokio::time::Instant::now() >= deadline || broker.is_shutting_down() {
            return Ok((out, positions));
        }
    }
}

fn position_of(position: &Position) -> PartitionPosition {
    let log = &position.partition.log;
    PartitionPosition {
        partition: position.partition.index,
        next_offset: position.offset,
        high_watermark: log.high_watermark(),
        log_start_offset: log.log_start_offset(),
        error: None,
    }
}

/// The position of a partition that could not be read: where to try again, and why.
fn unread(index: i32, offset: &str, error: &ApiError) -> PartitionPosition {
    PartitionPosition {
        partition: index,
        next_offset: offset.trim().parse().unwrap_or(-1),
        high_watermark: -1,
        log_start_offset: -1,
        error: Some(error.detail()),
    }
}

/// `GET /v1/topics/{topic}/partitions/{partition}/records?offset=N&max_records=M&...`.
pub(crate) async fn consume_partition(
    State(state): State<SharedState>,
    PathParams((topic, partition)): PathParams<(String, String)>,
    query: QueryParams,
) -> Result<Json<PartitionRecords>, ApiError> {
    let core = state.core()?;
    let broker = &core.broker;
    let metadata = require_topic(broker, &topic)?;
    let index: i32 = partition
        .parse()
        .map_err(|_| ApiError::invalid(format!("partition {partition:?}: expected a partition number")))?;
    if !(0..metadata.partitions).contains(&index) {
        return Err(ApiError::unknown_partition(&topic, index));
    }
    let limits = read_limits(&query)?;
    let encoding = limits.encoding;
    let offset = query.get("offset").unwrap_or("earliest").to_string();
    let consumed = consume_anywhere(broker, limits.call(&topic, vec![(index, offset)])).await?;
    let position = consumed.positions.first().ok_or_else(|| ApiError::internal("position lost"))?;
    Ok(Json(PartitionRecords {
        topic,
        partition: index,
        encoding,
        next_offset: position.next_offset,
        high_watermark: position.high_watermark,
        log_start_offset: position.log_start_offset,
        records: consumed.records,
    }))
}

/// `GET /v1/topics/{topic}/records?offsets=0:15,1:earliest&...`: several partitions in one
/// long poll (every partition from `earliest` without `offsets`).
pub(crate) async fn consume_topic(
    State(state): State<SharedState>,
    PathParams(topic): PathParams<String>,
    query: QueryParams,
) -> Result<Json<TopicRecords>, ApiError> {
    let core = state.core()?;
    let broker = &core.broker;
    let metadata = require_topic(broker, &topic)?;
    let limits = read_limits(&query)?;
    let encoding = limits.encoding;
    let wanted: Vec<(i32, String)> = match query.get("offsets") {
        None => (0..metadata.partitions).map(|p| (p, "earliest".to_string())).collect(),
        Some(list) => list
            .split(',')
            .filter(|item| !item.trim().is_empty())
            .map(|item| {
                let (partition, offset) = item.split_once(':').ok_or_else(|| {
                    ApiError::invalid(format!(
                        "offsets entry {item:?}: expected PARTITION:OFFSET, e.g. 0:42 or 1:earliest"
                    ))
                })?;
                let partition = partition.trim().parse::<i32>().map_err(|_| {
                    ApiError::invalid(format!("offsets entry {item:?}: {partition:?} is not a partition number"))
                })?;
                Ok((partition, offset.to_string()))
            })
            .collect::<Result<_, ApiError>>()?,
    };
    if wanted.is_empty() {
        return Err(ApiError::invalid("`offsets` names no partition"));
    }
    let mut seen = HashSet::new();
    for (index, _) in &wanted {
        if !seen.insert(*index) {
            return Err(ApiError::invalid(format!("partition {index} appears twice in `offsets`")));
        }
        if !(0..metadata.partitions).contains(index) {
            return Err(ApiError::unknown_partition(&topic, *index));
        }
    }
    let consumed = consume_anywhere(broker, limits.call(&topic, wanted)).await?;
    Ok(Json(TopicRecords { topic, encoding, records: consumed.records, partitions: consumed.positions }))
}

/// Reads partitions this broker hosts (a consume of this node's HTTP API, or one forwarded by
/// another node's).
pub(crate) async fn consume_here(broker: &Arc<Broker>, call: ConsumeCall) -> Result<Consumed, ApiError> {
    let mut positions = Vec::with_capacity(call.positions.len());
    for (index, offset) in &call.positions {
        let partition = broker.partition(&call.topic, *index).ok_or_else(|| {
            ApiError::new(
                ErrorKind::NotLeader,
                format!("broker {} does not host {}-{index}", broker.config.node_id, call.topic),
            )
        })?;
        let offset = resolve_offset(&partition, offset)?;
        positions.push(Position { partition, offset });
    }
    let limits = ReadLimits {
        max_records: call.max_records,
        max_bytes: call.max_bytes,
        timeout: Duration::from_millis(call.timeout_ms),
        encoding: call.encoding,
    };
    let (records, positions) = long_poll(broker, positions, limits).await?;
    Ok(Consumed { records, positions: positions.iter().map(position_of).collect() })
}

/// Runs one broker's part of a consume: this one's, or `leader`'s over the internal RPC.
async fn consume_part(broker: Arc<Broker>, leader: Option<i32>, call: ConsumeCall) -> Result<Consumed, ApiError> {
    match leader {
        None => consume_here(&broker, call).await,
        Some(leader) => forward::consume_at(&broker, leader, &call).await,
    }
}

/// Reads the partitions of `call` wherever they are led. Partitions on one broker are one
/// long poll there. Partitions on several: first every broker is asked at once without waiting
/// (which also resolves `earliest`/`latest`); if that finds nothing, every broker long-polls
/// from there at once, and the first to return records ends the wait for all.
///
/// A partition whose leader is down, or does not answer, is left out with its `error` in its
/// position, so one broker down does not stop a read of the others; when nothing can be read,
/// the first such error is the answer.
async fn consume_anywhere(broker: &Arc<Broker>, call: ConsumeCall) -> Result<Consumed, ApiError> {
    let mut parts: BTreeMap<Option<i32>, Vec<(i32, String)>> = BTreeMap::new();
    let mut unread_positions = Vec::new();
    for (index, offset) in &call.positions {
        let at = match forward::locate(broker, &call.topic, *index) {
            Ok(Location::Here(_)) => None,
            Ok(Location::Leader(leader)) => Some(leader),
            Err(e) if e.status == axum::http::StatusCode::SERVICE_UNAVAILABLE && call.positions.len() > 1 => {
                unread_positions.push(unread(*index, offset, &e));
                continue;
            }
            Err(e) => return Err(e),
        };
        parts.entry(at).or_default().push((*index, offset.clone()));
    }
    if parts.is_empty() {
        return Err(ApiError::new(ErrorKind::LeaderNotAvailable, "no partition asked for has a leader right now"));
    }
    if parts.len() == 1 && unread_positions.is_empty() {
        let leader = parts.into_keys().next().flatten();
        return consume_part(broker.clone(), leader, call).await;
    }
    let part_call =
        |positions: Vec<(i32, String)>, timeout_ms: u64| ConsumeCall { positions, timeout_ms, ..call.clone() };
    let quick = run_parts(broker, parts.iter().map(|(at, p)| (*at, part_call(p.clone(), 0))).collect(), false).await;
    let mut quick = settle(&parts, quick, &mut unread_positions)?;
    if call.timeout_ms == 0 || quick.values().any(|c| !c.records.is_empty()) {
        // Under a key no broker has, so that merge() puts them in with the others.
        quick.insert(Some(-1), Consumed { records: Vec::new(), positions: unread_positions });
        return Ok(merge(&call, quick));
    }
    let resumed: Vec<(Option<i32>, ConsumeCall)> = quick
        .iter()
        .map(|(at, consumed)| {
            let from = consumed.positions.iter().map(|p| (p.partition, p.next_offset.to_string())).collect();
            (*at, part_call(from, call.timeout_ms))
        })
        .collect();
    let waited = run_parts(broker, resumed, true).await;
    // A part that fails now keeps the positions its quick answer gave, as does one cut short.
    let mut waited: BTreeMap<Option<i32>, Consumed> =
        waited.into_iter().filter_map(|(at, consumed)| Some((at, consumed.ok()?))).collect();
    for (at, consumed) in quick {
        waited.entry(at).or_insert(Consumed { records: Vec::new(), ..consumed });
    }
    waited.insert(Some(-1), Consumed { records: Vec::new(), positions: unread_positions });
    Ok(merge(&call, waited))
}

/// The parts that answered; those that failed become unread positions (their leader died or
/// moved meanwhile). Fails only when no part answered.
fn settle(
    parts: &BTreeMap<Option<i32>, Vec<(i32, String)>>,
    answers: BTreeMap<Option<i32>, Result<Consumed, ApiError>>,
    unread_positions: &mut Vec<PartitionPosition>,
) -> Result<BTreeMap<Option<i32>, Consumed>, ApiError> {
    let mut answered = BTreeMap::new();
    let mut first_error = None;
    for (at, answer) in answers {
        match answer {
            Ok(consumed) => {
                answered.insert(at, consumed);
            }
            Err(e) => {
                for (index, offset) in parts.get(&at).into_iter().flatten() {
                    unread_positions.push(unread(*index, offset, &e));
                }
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) if answered.is_empty() => Err(e),
        _ => Ok(answered),
    }
}

/// Runs the parts at once; with `first_records`, stops at the first part that returns records
/// (the others are dropped: a read changes nothing, so nothing is lost).
async fn run_parts(
    broker: &Arc<Broker>,
    parts: Vec<(Option<i32>, ConsumeCall)>,
    first_records: bool,
) -> BTreeMap<Option<i32>, Result<Consumed, ApiError>> {
    let mut tasks = tokio::task::JoinSet::new();
    for (at, call) in parts {
        let broker = broker.clone();
        tasks.spawn(async move { (at, consume_part(broker, at, call).await) });
    }
    let mut done = BTreeMap::new();
    while let Some(joined) = tasks.join_next().await {
        let Ok((at, consumed)) = joined else { continue };
        let found = consumed.as_ref().is_ok_and(|c| !c.records.is_empty());
        done.insert(at, consumed);
        if first_records && found {
            tasks.abort_all();
            break;
        }
    }
    done
}

/// The parts' answers as one: at most `max_records` records (a partition cut short resumes at
/// its first record left out), positions in request order.
fn merge(call: &ConsumeCall, parts: BTreeMap<Option<i32>, Consumed>) -> Consumed {
    let mut records = Vec::new();
    let mut positions: HashMap<i32, PartitionPosition> = HashMap::new();
    for consumed in parts.into_values() {
        records.extend(consumed.records);
        positions.extend(consumed.positions.into_iter().map(|p| (p.partition, p)));
    }
    if records.len() > call.max_records {
        for left_out in records.split_off(call.max_records).into_iter().rev() {
            // Reversed, so the earliest left-out record of each partition is written last.
            if let Some(position) = positions.get_mut(&left_out.partition) {
                position.next_offset = left_out.offset;
            }
        }
    }
    let positions = call.positions.iter().filter_map(|(index, _)| positions.remove(index)).collect();
    let consumed = Consumed { records, positions };
    check_consumed(call, &consumed);
    consumed
}

/// What a consume answer promises (debug builds only; nothing in release): at most
/// `max_records` records, each of a partition the request asked for, and the positions of
/// those partitions only, in the request's order, once each.
fn check_consumed(call: &ConsumeCall, consumed: &Consumed) {
    if !cfg!(debug_assertions) {
        return;
    }
    assert!(
        consumed.records.len() <= call.max_records,
        "{} records answered, at most {} asked",
        consumed.records.len(),
        call.max_records
    );
    let asked: Vec<i32> = call.positions.iter().map(|(index, _)| *index).collect();
    if let Some(record) = consumed.records.iter().find(|r| !asked.contains(&r.partition)) {
        panic!("a record of partition {} answered, partitions {asked:?} asked", record.partition);
    }
    let mut order = asked.iter();
    for position in &consumed.positions {
        assert!(
            order.any(|index| *index == position.partition),
            "the position of partition {} answered out of order or unasked (asked {asked:?})",
            position.partition
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_of_new_records_is_one_batch_that_decodes_back_with_every_header() {
        let records: Vec<Record> = (0..5)
            .map(|i| {
                let mut record =
                    Record::new(1_000 + i, Some(Bytes::from(format!("k{i}"))), Some(Bytes::from(format!("v{i}"))));
                record.headers = vec![
                    Header::new("h", Some(Bytes::from_static(b"x"))),
                    Header::new("h", Some(Bytes::from_static(b"y"))),
                    Header::new("empty", None),
                ];
                record
            })
            .collect();
        let buf = encode_batch(&records).unwrap().freeze();
        let batches = records::decode_batches(&buf).unwrap();
        assert_eq!(batches.len(), 1, "one batch");
        let decoded = &batches[0].records;
        assert_eq!(decoded.len(), 5);
        assert_eq!(decoded[3].key.as_deref(), Some(&b"k3"[..]));
        assert_eq!(decoded[3].timestamp, 1_003);
        let c = consumed(0, decoded[3].clone(), TimestampType::CreateTime, Encoding::Base64);
        assert_eq!(c.value.as_deref(), Some("djM="));
        assert_eq!(
            c.headers.0,
            vec![
                ("h".to_string(), Some("eA==".to_string())),
                ("h".to_string(), Some("eQ==".to_string())),
                ("empty".to_string(), None)
            ],
            "a repeated header keeps every value, in order"
        );
    }

    #[test]
    fn fields_decode_by_encoding() {
        let what = || "the value".to_string();
        assert_eq!(decode_field(Some("aGk="), Encoding::Base64, what).unwrap().as_deref(), Some(&b"hi"[..]));
        assert_eq!(decode_field(Some("aGk="), Encoding::Utf8, what).unwrap().as_deref(), Some(&b"aGk="[..]));
        assert_eq!(decode_field(None, Encoding::Base64, what).unwrap(), None);
        let err = decode_field(Some("not base64!"), Encoding::Base64, what).unwrap_err();
        assert_eq!(err.code, "INVALID_REQUEST");
        assert!(err.message.contains("the value is not valid base64"), "{}", err.message);
    }
}

#[cfg(all(test, debug_assertions))]
mod invariant_tests {
    use super::*;

    fn call(partitions: &[i32], max_records: usize) -> ConsumeCall {
        ConsumeCall {
            topic: "t".into(),
            positions: partitions.iter().map(|p| (*p, "earliest".to_string())).collect(),
            max_records,
            max_bytes: 1 << 20,
            timeout_ms: 0,
            encoding: Encoding::default(),
        }
    }

    fn record(partition: i32) -> ConsumedRecord {
        ConsumedRecord {
            partition,
            offset: 0,
            timestamp: 0,
            timestamp_type: "CreateTime".into(),
            key: None,
            value: None,
            headers: Headers::default(),
        }
    }

    fn position(partition: i32) -> PartitionPosition {
        PartitionPosition { partition, next_offset: 0, high_watermark: 0, log_start_offset: 0, error: None }
    }

    #[test]
    fn merged_parts_answer_what_was_asked_in_order() {
        let parts = BTreeMap::from([
            (Some(2), Consumed { records: vec![record(1), record(1)], positions: vec![position(1)] }),
            (Some(1), Consumed { records: vec![record(0)], positions: vec![position(0)] }),
        ]);
        let merged = merge(&call(&[0, 1], 2), parts);
        assert_eq!(merged.records.len(), 2);
        assert_eq!(merged.positions.iter().map(|p| p.partition).collect::<Vec<_>>(), vec![0, 1]);
    }

    #[test]
    #[should_panic(expected = "partitions [0] asked")]
    fn a_record_of_a_partition_not_asked_is_caught() {
        check_consumed(&call(&[0], 10), &Consumed { records: vec![record(3)], positions: vec![position(0)] });
    }

    #[test]
    #[should_panic(expected = "out of order")]
    fn positions_out_of_order_are_caught() {
        check_consumed(&call(&[0, 1], 10), &Consumed { records: vec![], positions: vec![position(1), position(0)] });
    }
}
