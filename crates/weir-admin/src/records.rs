//! Produce and consume over HTTP (REST-proxy style).
//!
//! Produce turns the JSON records into one uncompressed RecordBatch v2 per partition and appends
//! it with acks=-1, exactly as a Kafka producer's batch would be appended, so Kafka consumers
//! read these records like any other. Consume reads whole batches up to the high watermark,
//! decodes (and decompresses) them and returns the records at or after the requested offset;
//! with nothing to return it parks until an append wakes it or `timeout_ms` passes, with the
//! same waiter mechanism as a Kafka fetch.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Record, RecordBatchDecoder, TimestampType};
use tokio::sync::Notify;
use weir_broker::{internal_records, Broker, BrokerError, ErrorCode, Partition};

use crate::api::{
    ConsumedRecord, Encoding, Headers, PartitionPosition, PartitionRecords, ProduceRequest, ProduceResponse,
    ProducedRecord, TopicRecords,
};
use crate::error::ApiError;
use crate::extract::{JsonBody, PathParams, QueryParams};
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

/// A record as a non-idempotent Kafka producer sends it; `offset` is relative to the batch.
fn new_record(
    offset: i64,
    timestamp: i64,
    key: Option<Bytes>,
    value: Option<Bytes>,
    headers: Vec<(String, Option<Bytes>)>,
) -> Record {
    let mut record = internal_records::plain_record(offset, timestamp, key, value);
    record.headers = headers.into_iter().map(|(name, value)| (StrBytes::from_string(name), value)).collect();
    record
}

fn encode_batch(records: &[Record]) -> Result<BytesMut, ApiError> {
    internal_records::encode_records(records)
        .map_err(|e| ApiError::internal(format!("cannot encode the record batch: {e}")))
}

/// `POST /v1/topics/{topic}/records`. One batch per partition; each partition's append succeeds
/// or fails as a whole. 200 when at least one partition took its records (a failed one reports
/// its `error` on each of its records), else the first failure's error.
pub async fn produce(
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
        let mut names = HashSet::new();
        for (name, text) in &r.headers.0 {
            if !names.insert(name.as_str()) {
                return Err(ApiError::invalid(format!(
                    "record {i}: header '{name}' appears twice; a record carries one value per header name here"
                )));
            }
            let value = decode_field(text.as_deref(), encoding, || format!("record {i}: header '{name}'"))?;
            headers.push((name.clone(), value));
        }
        let timestamp = match r.timestamp {
            Some(t) if t < 0 => {
                return Err(ApiError::new(
                    ErrorCode::InvalidTimestamp,
                    format!("record {i}: timestamp {t} is negative; give ms since the epoch or leave it out"),
                ))
            }
            Some(t) => t,
            None => now,
        };
        let partition = match (r.partition, &key) {
            (Some(p), _) if (0..metadata.partitions).contains(&p) => p,
            (Some(p), _) => return Err(ApiError::unknown_partition(&topic, p)),
            (None, Some(key)) => partition_for_key(key, metadata.partitions),
            (None, None) => {
                let next = state.round_robin.fetch_add(1, Ordering::Relaxed);
                (next % metadata.partitions as u32) as i32
            }
        };
        let records = by_partition.entry(partition).or_default();
        let offset = records.len() as i64;
        records.push((i, new_record(offset, timestamp, key, value, headers)));
    }

    let mut offsets: Vec<Option<ProducedRecord>> = vec![None; request.records.len()];
    let mut first_error: Option<ApiError> = None;
    let mut appended_any = false;
    for (index, records) in by_partition {
        let batch: Vec<Record> = records.iter().map(|(_, r)| r.clone()).collect();
        let outcome = match (broker.partition(&topic, index), encode_batch(&batch)) {
            (None, _) => Err(ApiError::unknown_partition(&topic, index)),
            (_, Err(e)) => Err(e),
            (Some(partition), Ok(buf)) => broker.append(partition, buf, -1).await.map_err(ApiError::from),
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

fn read_limits(query: &QueryParams) -> Result<ReadLimits, ApiError> {
    let encoding = match query.get("encoding") {
        None => Encoding::Utf8,
        Some(text) => Encoding::parse(text)
            .ok_or_else(|| ApiError::invalid(format!("query parameter encoding={text:?}: expected utf8 or base64")))?,
    };
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
            ErrorCode::OffsetOutOfRange,
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

fn text_of(bytes: Option<Bytes>, encoding: Encoding) -> Option<String> {
    bytes.map(|b| match encoding {
        Encoding::Utf8 => String::from_utf8_lossy(&b).into_owned(),
        Encoding::Base64 => BASE64.encode(&b),
    })
}

fn consumed(partition: i32, record: Record, encoding: Encoding) -> ConsumedRecord {
    let timestamp_type = match record.timestamp_type {
        TimestampType::Creation => "CreateTime",
        TimestampType::LogAppend => "LogAppendTime",
    };
    ConsumedRecord {
        partition,
        offset: record.offset,
        timestamp: record.timestamp,
        timestamp_type: timestamp_type.to_string(),
        key: text_of(record.key, encoding),
        value: text_of(record.value, encoding),
        headers: Headers(
            record.headers.into_iter().map(|(name, value)| (name.to_string(), text_of(value, encoding))).collect(),
        ),
    }
}

/// Reads from every position in turn until `max_records` or `max_bytes` is reached, advancing
/// each position past what it returned. Blocking (reads the log files).
fn read_positions(
    broker: &Broker,
    positions: &mut [Position],
    limits: &ReadLimits,
) -> Result<Vec<ConsumedRecord>, ApiError> {
    let mut out = Vec::new();
    let mut bytes_left = limits.max_bytes;
    for position in positions.iter_mut() {
        let partition = position.partition.clone();
        loop {
            if out.len() >= limits.max_records || bytes_left == 0 {
                return Ok(out);
            }
            let high_watermark = partition.log.high_watermark();
            if position.offset >= high_watermark {
                break;
            }
            // The first batch of the request is read whatever its size (a consumer never
            // starves on a large batch); after that `max_bytes` holds.
            let first = bytes_left == limits.max_bytes;
            let read = broker.read(&partition, position.offset, bytes_left, first)?;
            let Some(slice) = read.slice else { break };
            let data = slice.read_to_vec().map_err(BrokerError::from)?;
            bytes_left = bytes_left.saturating_sub(slice.len);
            let mut buf = Bytes::from(data);
            let sets = RecordBatchDecoder::decode_all(&mut buf).map_err(|e| {
                ApiError::new(
                    ErrorCode::CorruptMessage,
                    format!(
                        "cannot decode the batches of {}-{} at offset {}: {e}",
                        partition.topic, partition.index, position.offset
                    ),
                )
            })?;
            let mut full = false;
            for record in sets.into_iter().flat_map(|set| set.records) {
                if record.control || record.offset < position.offset {
                    continue;
                }
                if out.len() >= limits.max_records || record.offset >= high_watermark {
                    full = true;
                    break;
                }
                position.offset = record.offset + 1;
                out.push(consumed(partition.index, record, limits.encoding));
            }
            if full {
                return Ok(out);
            }
            // Past the batches read, also when they held nothing to return (control records,
            // records compacted away).
            position.offset = position.offset.max(slice.next_offset);
        }
    }
    Ok(out)
}

/// Reads `positions`; with nothing to return, parks until an append to one of them, the
/// timeout, or shutdown.
async fn long_poll(
    broker: &Arc<Broker>,
    mut positions: Vec<Position>,
    limits: ReadLimits,
) -> Result<(Vec<ConsumedRecord>, Vec<Position>), ApiError> {
    let deadline = tokio::time::Instant::now() + limits.timeout;
    let limits = Arc::new(limits);
    loop {
        // Register before reading: an append between the read and the wait is not missed.
        let waiter = Arc::new(Notify::new());
        for position in &positions {
            position.partition.register_waiter(&waiter);
        }
        let (reader, reader_limits) = (broker.clone(), limits.clone());
        let (result, returned) = tokio::task::spawn_blocking(move || {
            let result = read_positions(&reader, &mut positions, &reader_limits);
            (result, positions)
        })
        .await
        .map_err(|e| ApiError::internal(format!("read task failed: {e}")))?;
        positions = returned;
        let records = result?;
        if !records.is_empty() || tokio::time::Instant::now() >= deadline || broker.is_shutting_down() {
            return Ok((records, positions));
        }
        broker.wait_for_data(&waiter, deadline).await;
    }
}

fn position_of(position: &Position) -> PartitionPosition {
    let log = &position.partition.log;
    PartitionPosition {
        partition: position.partition.index,
        next_offset: position.offset,
        high_watermark: log.high_watermark(),
        log_start_offset: log.log_start_offset(),
    }
}

/// `GET /v1/topics/{topic}/partitions/{partition}/records?offset=N&max_records=M&...`.
pub async fn consume_partition(
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
    let partition = broker.partition(&topic, index).ok_or_else(|| ApiError::unknown_partition(&topic, index))?;
    let limits = read_limits(&query)?;
    let encoding = limits.encoding;
    let offset = resolve_offset(&partition, query.get("offset").unwrap_or("earliest"))?;
    let (records, positions) = long_poll(broker, vec![Position { partition, offset }], limits).await?;
    let position = positions.first().map(position_of).ok_or_else(|| ApiError::internal("position lost"))?;
    Ok(Json(PartitionRecords {
        topic,
        partition: index,
        encoding,
        records,
        next_offset: position.next_offset,
        high_watermark: position.high_watermark,
        log_start_offset: position.log_start_offset,
    }))
}

/// `GET /v1/topics/{topic}/records?offsets=0:15,1:earliest&...`: several partitions in one
/// long poll (every partition from `earliest` without `offsets`).
pub async fn consume_topic(
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
    let mut positions = Vec::with_capacity(wanted.len());
    for (index, offset) in wanted {
        if !seen.insert(index) {
            return Err(ApiError::invalid(format!("partition {index} appears twice in `offsets`")));
        }
        let partition = broker
            .partition(&topic, index)
            .filter(|_| index < metadata.partitions)
            .ok_or_else(|| ApiError::unknown_partition(&topic, index))?;
        let offset = resolve_offset(&partition, &offset)?;
        positions.push(Position { partition, offset });
    }
    let (records, positions) = long_poll(broker, positions, limits).await?;
    Ok(Json(TopicRecords { topic, encoding, records, partitions: positions.iter().map(position_of).collect() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_of_new_records_is_one_batch_that_decodes_back() {
        let records: Vec<Record> = (0..5)
            .map(|i| {
                new_record(
                    i,
                    1_000 + i,
                    Some(Bytes::from(format!("k{i}"))),
                    Some(Bytes::from(format!("v{i}"))),
                    vec![("h".to_string(), Some(Bytes::from_static(b"x"))), ("empty".to_string(), None)],
                )
            })
            .collect();
        let mut buf = encode_batch(&records).unwrap().freeze();
        let sets = RecordBatchDecoder::decode_all(&mut buf).unwrap();
        assert_eq!(sets.len(), 1, "one batch");
        let decoded = &sets[0].records;
        assert_eq!(decoded.len(), 5);
        assert_eq!(decoded[3].key.as_deref(), Some(&b"k3"[..]));
        assert_eq!(decoded[3].timestamp, 1_003);
        assert_eq!(decoded[3].headers.len(), 2);
        let c = consumed(0, decoded[3].clone(), Encoding::Base64);
        assert_eq!(c.value.as_deref(), Some("djM="));
        assert_eq!(c.headers.0[1], ("empty".to_string(), None));
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
