//! Fetch: long polling (the core's `Broker::fetch`) and zero copy.
//!
//! The handler resolves the requested partitions, lets the core read them (parking until
//! `min_bytes` are there or `max_wait_ms` passes), and encodes the response with a placeholder
//! where each file range goes; `zero_copy` sends the ranges with `sendfile`.
//!
//! Fetch sessions (KIP-227) are declined: a request to open one (epoch 0) is answered with
//! session id 0, which tells the client to keep sending full fetch requests; a request naming a
//! session gets FETCH_SESSION_ID_NOT_FOUND.

use std::time::Duration;

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
use weir_broker::partition;
use weir_broker::Broker;
use weir_storage::FileSlice;

use crate::context::{Client, Ctx};
use crate::errors::kafka_error;
use crate::frame::{self, FrameError, ResponseFrame};
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
) -> Result<ResponseFrame, FrameError> {
    let version = client.version;
    let metrics = crate::dispatch::api_metrics(&ctx.metrics, ApiKey::Fetch);
    if version >= 7 && request.session_id != 0 {
        return refuse_session(metrics, version, correlation_id);
    }

    // A follower replicating from this leader names itself: the replica id (v15+: in the
    // replica state); consumers send -1.
    let replica_id = if version >= 15 { request.replica_state.replica_id.0 } else { request.replica_id.0 };
    let replica_id = (replica_id >= 0).then_some(replica_id);
    let Resolved { topics, wanted, reads } = resolve(&ctx.broker, &request, version, replica_id);
    // A partition that failed already answers the fetch: no waiting (as Kafka does).
    let any_failed = wanted.iter().any(|w| w.target.is_err());
    let fetch = core_fetch(&request, version, reads, any_failed, replica_id);
    let mut found: Vec<Option<FetchedPartition>> = match ctx.broker.fetch(fetch).await {
        Ok(found) => found.into_iter().map(Some).collect(),
        Err(e) => return Err(FrameError::Io(std::io::Error::other(e))),
    };

    // Build the response with a placeholder where each file range goes.
    let mut files = Vec::new();
    let mut responses: Vec<FetchableTopicResponse> = topics
        .iter()
        .map(|(name, id)| {
            // v13+ identifies topics by id only, earlier versions by name only.
            if version >= 13 {
                FetchableTopicResponse::default().with_topic_id(*id)
            } else {
                FetchableTopicResponse::default().with_topic(name.clone())
            }
        })
        .collect();
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
    let encoded = frame::encode_response(ApiKey::Fetch, version, correlation_id, &response)?;
    zero_copy::splice_files(encoded, files, version >= 12).map_err(|reason| FrameError::Encode {
        api_key: ApiKey::Fetch,
        version,
        reason,
    })
}

/// Fetch sessions are declined (see the module header): a request naming one gets
/// FETCH_SESSION_ID_NOT_FOUND, and the client falls back to full fetch requests.
fn refuse_session(
    metrics: Option<&OperationMetrics>,
    version: i16,
    correlation_id: i32,
) -> Result<ResponseFrame, FrameError> {
    if let Some(metrics) = metrics {
        metrics.count_errors([i32::from(ResponseError::FetchSessionIdNotFound.code())]);
    }
    let response = FetchResponse::default().with_error_code(ResponseError::FetchSessionIdNotFound.code());
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
fn resolve(broker: &Broker, request: &FetchRequest, version: i16, replica_id: Option<i32>) -> Resolved {
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
        resolved.topics.push((TopicName(StrBytes::from_string(name.clone().unwrap_or_default())), id));
        for p in &topic.partitions {
            let found = partitions.as_deref().and_then(|list| partition::by_index(list, p.partition));
            let target = match (&name, found) {
                (None, _) => Err(ResponseError::UnknownTopicId),
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
