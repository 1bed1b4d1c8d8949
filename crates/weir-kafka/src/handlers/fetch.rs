//! Fetch: long polling and zero copy.
//!
//! A fetch reads every requested partition up to its high watermark, honouring `max_bytes`,
//! `partition_max_bytes` and Kafka's at-least-one-batch rule (the first partition that has data
//! returns at least its first batch, whatever the limits). When fewer than `min_bytes` are
//! available it parks until an append wakes it or `max_wait_ms` passes — no polling loop.
//!
//! Fetch sessions (KIP-227) are declined: a request to open one (epoch 0) is answered with
//! session id 0, which tells the client to keep sending full fetch requests; a request naming a
//! session gets FETCH_SESSION_ID_NOT_FOUND.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_response::{AbortedTransaction, FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{ApiKey, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use tokio::sync::Notify;
use uuid::Uuid;
use weir_broker::partition::{self, Partition};
use weir_broker::{Broker, BrokerError};
use weir_storage::FileSlice;

use crate::context::{Client, Ctx};
use crate::frame::{self, FrameError, ResponseFrame};
use crate::handlers::list_offsets::check_leader_epoch;
use crate::zero_copy;

/// One requested partition, resolved.
struct Wanted {
    topic_index: usize,
    partition_index: i32,
    fetch_offset: i64,
    partition_max_bytes: i32,
    target: Result<Arc<Partition>, ResponseError>,
}

/// What a read found for one partition.
struct Found {
    error: ResponseError,
    high_watermark: i64,
    last_stable_offset: i64,
    log_start_offset: i64,
    slice: Option<FileSlice>,
    /// read_committed: (producer id, first offset) of aborted transactions in the slice.
    aborted: Option<Vec<(i64, i64)>>,
    /// The high watermark read before the read: if it moved since, there may be more to read.
    seen_high_watermark: i64,
}

pub async fn handle(
    ctx: &Ctx,
    client: &Client,
    correlation_id: i32,
    request: FetchRequest,
) -> Result<ResponseFrame, FrameError> {
    let version = client.version;
    let broker = &ctx.broker;
    let metrics = crate::dispatch::api_metrics(ctx, ApiKey::Fetch);
    if version >= 7 && request.session_id != 0 {
        if let Some(metrics) = metrics {
            metrics.count_errors([ResponseError::FetchSessionIdNotFound.code()]);
        }
        let response = FetchResponse::default().with_error_code(ResponseError::FetchSessionIdNotFound.code());
        let encoded = frame::encode_response(ApiKey::Fetch, version, correlation_id, &response)?;
        return Ok(ResponseFrame { chunks: vec![frame::Chunk::Bytes(encoded.freeze())] });
    }

    let state = broker.metadata();
    let mut topics: Vec<(TopicName, Uuid)> = Vec::new();
    let mut wanted = Vec::new();
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
        let topic_index = topics.len();
        // One lookup per topic, not per partition: a consumer of 1,000 partitions names them all
        // in every fetch (librdkafka has no fetch sessions).
        let partitions = name.as_deref().and_then(|name| broker.topic_partitions(name));
        topics.push((TopicName(StrBytes::from_string(name.clone().unwrap_or_default())), id));
        for p in &topic.partitions {
            let target = match &name {
                None => Err(ResponseError::UnknownTopicId),
                Some(_) => match check_leader_epoch(p.current_leader_epoch) {
                    Err(code) => Err(code),
                    Ok(()) => partitions
                        .as_deref()
                        .and_then(|list| partition::by_index(list, p.partition))
                        .cloned()
                        .ok_or(ResponseError::UnknownTopicOrPartition),
                },
            };
            wanted.push(Wanted {
                topic_index,
                partition_index: p.partition,
                fetch_offset: p.fetch_offset,
                partition_max_bytes: p.partition_max_bytes,
                target,
            });
        }
    }
    let wanted = Arc::new(wanted);

    let max_wait = Duration::from_millis(request.max_wait_ms.max(0) as u64);
    let deadline = tokio::time::Instant::now() + max_wait;
    let min_bytes = request.min_bytes.max(0) as u64;
    let max_bytes = if request.max_bytes <= 0 { i32::MAX as u64 } else { request.max_bytes as u64 };
    // isolation_level 1 = READ_COMMITTED: read up to the last stable offset and get the aborted
    // transactions of what is returned.
    let read_committed = request.isolation_level == 1;
    let found = loop {
        let reader_broker = broker.clone();
        let reader_wanted = wanted.clone();
        let found =
            tokio::task::spawn_blocking(move || read_all(&reader_broker, &reader_wanted, max_bytes, read_committed))
                .await
                .map_err(|e| FrameError::Io(std::io::Error::other(e)))?;
        let bytes: u64 = found.iter().filter_map(|f| f.slice.as_ref()).map(|s| s.len).sum();
        let any_error = found.iter().any(|f| f.error != ResponseError::Unknown(0));
        if bytes >= min_bytes
            || bytes > 0 && min_bytes == 0
            || any_error
            || tokio::time::Instant::now() >= deadline
            || broker.is_shutting_down()
        {
            break found;
        }
        // Not enough yet: park. Register first, then check that no high watermark moved since
        // the read (`Notify` keeps a permit for a wake-up after the registration, so none is
        // lost). Registering only here keeps fetches that find data off the waiter lists.
        let waiter = Arc::new(Notify::new());
        for w in wanted.iter() {
            if let Ok(partition) = &w.target {
                partition.register_waiter(&waiter);
            }
        }
        let moved = wanted.iter().zip(&found).any(|(w, f)| match &w.target {
            Ok(partition) => partition.log.high_watermark() != f.seen_high_watermark,
            Err(_) => false,
        });
        if !moved {
            broker.wait_for_data(&waiter, deadline).await;
        }
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
    // Error codes and bytes out are counted as the response is built (the write may still fail).
    let mut errors = metrics.map(|m| m.error_counter());
    for (w, f) in wanted.iter().zip(found) {
        let records = match f.slice {
            Some(slice) => {
                if let Ok(partition) = &w.target {
                    partition.metrics.bytes_out.add(slice.len);
                }
                let placeholder = zero_copy::placeholder(files.len());
                files.push(slice);
                placeholder
            }
            None => Bytes::new(),
        };
        let error_code = if f.error == ResponseError::Unknown(0) { 0 } else { f.error.code() };
        if let Some(errors) = &mut errors {
            errors.count(error_code);
        }
        let data = PartitionData::default()
            .with_partition_index(w.partition_index)
            .with_error_code(error_code)
            .with_high_watermark(f.high_watermark)
            .with_last_stable_offset(f.last_stable_offset)
            .with_log_start_offset(if version >= 5 { f.log_start_offset } else { -1 })
            .with_aborted_transactions(f.aborted.map(|list| {
                list.into_iter()
                    .map(|(producer_id, first_offset)| {
                        AbortedTransaction::default()
                            .with_producer_id(kafka_protocol::messages::ProducerId(producer_id))
                            .with_first_offset(first_offset)
                    })
                    .collect()
            }))
            .with_records(Some(records));
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

/// Reads every wanted partition once. `ResponseError::Unknown(0)` stands for "no error".
fn read_all(broker: &Broker, wanted: &[Wanted], max_bytes: u64, read_committed: bool) -> Vec<Found> {
    let mut total: u64 = 0;
    let mut out = Vec::with_capacity(wanted.len());
    for w in wanted {
        let partition = match &w.target {
            Ok(p) => p,
            Err(code) => {
                out.push(Found {
                    error: *code,
                    high_watermark: -1,
                    last_stable_offset: -1,
                    log_start_offset: -1,
                    slice: None,
                    aborted: None,
                    seen_high_watermark: -1,
                });
                continue;
            }
        };
        let log = &partition.log;
        let seen_high_watermark = log.high_watermark();
        let remaining = max_bytes.saturating_sub(total);
        let limit = remaining.min(w.partition_max_bytes.max(0) as u64);
        let min_one = total == 0;
        let result = if limit == 0 && !min_one {
            Ok(None)
        } else {
            broker.read_isolated(partition, w.fetch_offset, limit, min_one, read_committed).map(|r| r.slice)
        };
        match result {
            Ok(slice) => {
                if let Some(s) = &slice {
                    total += s.len;
                }
                // A read_committed consumer must drop the records of transactions aborted in
                // what it receives.
                let aborted = read_committed.then(|| match &slice {
                    Some(s) => log
                        .aborted_transactions(s.first_offset, s.next_offset)
                        .into_iter()
                        .map(|t| (t.producer_id, t.first_offset))
                        .collect(),
                    None => Vec::new(),
                });
                out.push(Found {
                    error: ResponseError::Unknown(0),
                    high_watermark: log.high_watermark(),
                    last_stable_offset: log.last_stable_offset(),
                    log_start_offset: log.log_start_offset(),
                    slice,
                    aborted,
                    seen_high_watermark,
                });
            }
            Err(BrokerError { code, message }) => {
                if code != ResponseError::OffsetOutOfRange {
                    tracing::warn!(topic = %partition.topic, partition = partition.index, error = %message, "fetch failed");
                }
                out.push(Found {
                    error: code,
                    high_watermark: log.high_watermark(),
                    last_stable_offset: log.last_stable_offset(),
                    log_start_offset: log.log_start_offset(),
                    slice: None,
                    aborted: None,
                    seen_high_watermark,
                });
            }
        }
    }
    out
}
