//! Produce: batches are validated and appended as sent (compressed batches stay compressed), one
//! partition after another in request order, all in one blocking task (`Broker::write_many`).
//! The response waits as long as each topic's flush policy says an acknowledged write must wait,
//! but the connection does not: `handle` returns once the batches are written, with the wait
//! still to run, so the next request on the connection is appended while this one's fsync runs.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, TopicName, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use weir_broker::partition::{self, Partition};
use weir_broker::{Acks, BrokerError};
use weir_security::acl::{AclOperation, ResourceType};

use crate::context::{Client, Ctx};
use crate::errors::kafka_error;
use crate::handlers::message;

/// Writes the request's batches; the returned future waits until they are durable as promised
/// and builds the response. `body` is the request's frame after the header, which `request` was
/// decoded from: the batches are written from it in place (see [`take_record_sets`]).
pub(crate) async fn handle(
    ctx: &Ctx,
    client: &Client,
    mut request: ProduceRequest,
    body: Bytes,
) -> impl Future<Output = ProduceResponse> + Send + 'static {
    let mut record_sets = take_record_sets(&mut request, body).into_iter();
    let broker = &ctx.broker;
    let version = client.version;
    let acks = request.acks;
    let request_timeout_ms = request.timeout_ms;
    let fail = |index: i32, code: ResponseError, text: String| failed_partition(version, index, code, text);

    // First pass: resolve and check every partition; what passes is appended in one go.
    let mut slots: Vec<Vec<Slot>> = Vec::with_capacity(request.topic_data.len());
    let mut names = Vec::with_capacity(request.topic_data.len());
    let mut appends: Vec<(Arc<Partition>, BytesMut)> = Vec::new();
    // A transactional produce needs WRITE on its transactional id; every topic, WRITE on it.
    let transaction_refused = request
        .transactional_id
        .as_ref()
        .is_some_and(|id| !ctx.allowed(client, AclOperation::Write, ResourceType::TransactionalId, id));
    for topic in request.topic_data {
        let partitions = broker.topic_partitions(&topic.name);
        let mut topic_slots = Vec::with_capacity(topic.partition_data.len());
        let topic_refused = !transaction_refused && !ctx.allowed_on_topic(client, AclOperation::Write, &topic.name);
        for data in topic.partition_data {
            let index = data.index;
            // Taken first, so that a partition refused below does not pass its records on.
            let records = record_sets.next().flatten();
            if transaction_refused {
                let text = "WRITE on the transactional id is needed".to_string();
                topic_slots.push(Slot::Done(fail(index, ResponseError::TransactionalIdAuthorizationFailed, text)));
                continue;
            }
            if topic_refused {
                let text = format!("WRITE on topic {} is needed", topic.name.as_str());
                topic_slots.push(Slot::Done(fail(index, ResponseError::TopicAuthorizationFailed, text)));
                continue;
            }
            if !matches!(acks, -1..=1) {
                let text = format!("acks must be -1, 0 or 1, not {acks}");
                topic_slots.push(Slot::Done(fail(index, ResponseError::InvalidRequiredAcks, text)));
                continue;
            }
            let partition = partitions.as_deref().and_then(|list| partition::by_index(list, index));
            let Some(partition) = partition else {
                let e = broker.absent_partition_error(&topic.name, index);
                topic_slots.push(Slot::Done(fail(index, kafka_error(e.kind), e.message)));
                continue;
            };
            match records {
                Some(records) if !records.is_empty() => {
                    topic_slots.push(Slot::Appending(partition.clone()));
                    appends.push((partition.clone(), records));
                }
                _ => {
                    let text = "a produce request needs at least one record batch".to_string();
                    topic_slots.push(Slot::Done(fail(index, ResponseError::InvalidRecord, text)));
                }
            }
        }
        slots.push(topic_slots);
        names.push(topic.name);
    }

    // acks=0 waits like acks=1; the connection then sends no response.
    let acks = if acks == -1 { Acks::All } else { Acks::Leader };
    // acks=all waits for the in-sync replicas at most the request's timeout.
    let timeout = std::time::Duration::from_millis(request_timeout_ms.max(0) as u64);
    let pending = broker.write_many(appends, acks).await.with_timeout(timeout);
    async move {
        let results = pending.durable().await;
        respond(version, names, slots, results)
    }
}

/// Every partition's record set, in request order (`None` where it sent none), in a buffer the
/// log may write into: it assigns offsets in place.
///
/// Copying each set out of the frame cost a quarter of the broker's CPU at 1 GB/s. The sets are
/// slices of `body`, an allocation of its own (the connection reads each frame into a new
/// buffer), so once nothing else refers to it the frame is cut into disjoint mutable pieces
/// instead. For that the request must give up its other slices of the frame: its names are
/// copied (a few bytes each) and the tagged fields the broker does not read are dropped. If
/// something still shares the frame, or the sets are not where a decoded request puts them
/// (in order, within `body`), each set is copied as before.
fn take_record_sets(request: &mut ProduceRequest, body: Bytes) -> Vec<Option<BytesMut>> {
    let owned = |s: &StrBytes| StrBytes::from_string(s.to_string());
    request.transactional_id = request.transactional_id.as_ref().map(|id| TransactionalId(owned(id)));
    request.unknown_tagged_fields.clear();
    let mut sets = Vec::new();
    for topic in &mut request.topic_data {
        topic.name = TopicName(owned(&topic.name));
        topic.unknown_tagged_fields.clear();
        for data in &mut topic.partition_data {
            data.unknown_tagged_fields.clear();
            sets.push(data.records.take());
        }
    }

    // Where each non-empty set lies in `body`.
    let base = body.as_ptr() as usize;
    let mut ranges = Vec::with_capacity(sets.len());
    let mut end = 0;
    for set in sets.iter().flatten().filter(|set| !set.is_empty()) {
        let start = (set.as_ptr() as usize).wrapping_sub(base);
        match start.checked_add(set.len()) {
            Some(set_end) if start >= end && set_end <= body.len() => {
                ranges.push(start..set_end);
                end = set_end;
            }
            _ => return sets.into_iter().map(|set| set.map(|s| BytesMut::from(&s[..]))).collect(),
        }
    }
    let present: Vec<Option<bool>> = sets.iter().map(|set| set.as_ref().map(|s| !s.is_empty())).collect();
    drop(sets);
    let mut frame = match body.try_into_mut() {
        Ok(rest) => FrameBuffer::Unique { rest, offset: 0 },
        Err(shared) => {
            tracing::debug!("produce request frame still shared: copying its record sets");
            FrameBuffer::Shared(shared)
        }
    };
    let mut ranges = ranges.into_iter();
    present
        .into_iter()
        .map(|set| match set {
            None => None,
            Some(false) => Some(BytesMut::new()),
            Some(true) => ranges.next().map(|range| frame.cut(range)),
        })
        .collect()
}

/// The frame that [`take_record_sets`] cuts the sets from.
enum FrameBuffer {
    /// Nothing else refers to it: what follows `offset` in the frame.
    Unique {
        rest: BytesMut,
        offset: usize,
    },
    Shared(Bytes),
}

impl FrameBuffer {
    /// The bytes at `range` of the frame. Ranges come in increasing order and do not overlap.
    fn cut(&mut self, range: Range<usize>) -> BytesMut {
        match self {
            Self::Unique { rest, offset } => {
                rest.advance(range.start - *offset);
                *offset = range.end;
                rest.split_to(range.len())
            }
            Self::Shared(frame) => BytesMut::from(&frame[range]),
        }
    }
}

/// The response: each partition's slot, either decided before the append or filled from its
/// append's result (the appends' results come in slot order).
fn respond(
    version: i16,
    names: Vec<kafka_protocol::messages::TopicName>,
    slots: Vec<Vec<Slot>>,
    results: Vec<Result<weir_storage::AppendInfo, BrokerError>>,
) -> ProduceResponse {
    let mut results = results.into_iter();
    let mut responses = Vec::with_capacity(slots.len());
    for (name, topic_slots) in names.into_iter().zip(slots) {
        let partitions = topic_slots
            .into_iter()
            .map(|slot| match slot {
                Slot::Done(response) => response,
                Slot::Appending(partition) => {
                    match results.next() {
                        Some(Ok(info)) => PartitionProduceResponse::default()
                            .with_index(partition.index)
                            .with_base_offset(info.first_offset)
                            .with_log_append_time_ms(info.log_append_time_ms.unwrap_or(-1))
                            .with_log_start_offset(if version >= 5 { partition.log.log_start_offset() } else { -1 }),
                        Some(Err(e)) => {
                            tracing::debug!(topic = %partition.topic, partition = partition.index, error = %e, "produce refused");
                            let failed = failed_partition(version, partition.index, kafka_error(e.kind), e.message);
                            // Record errors exist from v8 (KIP-467): the client fails exactly those.
                            if version >= 8 && !e.record_errors.is_empty() {
                                failed.with_record_errors(
                                    e.record_errors
                                        .into_iter()
                                        .map(|r| {
                                            BatchIndexAndErrorMessage::default()
                                                .with_batch_index(r.index)
                                                .with_batch_index_error_message(message(r.message))
                                        })
                                        .collect(),
                                )
                            } else {
                                failed
                            }
                        }
                        None => failed_partition(
                            version,
                            partition.index,
                            ResponseError::UnknownServerError,
                            "append lost its result".into(),
                        ),
                    }
                }
            })
            .collect();
        responses.push(TopicProduceResponse::default().with_name(name).with_partition_responses(partitions));
    }
    ProduceResponse::default().with_responses(responses)
}

/// `slots[t][p]` of a request: the partition's response decided before the append, or the
/// partition being appended to.
enum Slot {
    Done(PartitionProduceResponse),
    Appending(Arc<Partition>),
}

fn failed_partition(version: i16, index: i32, code: ResponseError, text: String) -> PartitionProduceResponse {
    let failed = PartitionProduceResponse::default()
        .with_index(index)
        .with_error_code(code.code())
        .with_base_offset(-1)
        .with_log_append_time_ms(-1)
        .with_log_start_offset(-1);
    // Error messages exist from v8.
    if version >= 8 {
        failed.with_error_message(message(text))
    } else {
        failed
    }
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::protocol::{Decodable, Encodable};

    use super::*;

    /// A produce request with two topics of two partitions each (one sending no records), as
    /// the connection hands it over: decoded from a frame in an allocation of its own.
    fn decoded(version: i16) -> (ProduceRequest, Bytes, Vec<Option<Vec<u8>>>) {
        let sets = vec![Some(vec![1u8; 100]), None, Some(vec![2u8; 7]), Some(vec![3u8; 300])];
        let mut sets_iter = sets.iter();
        let topic = |name: &'static str, sets: &mut std::slice::Iter<'_, Option<Vec<u8>>>| {
            let partitions = (0..2)
                .map(|index| {
                    let records = sets.next().and_then(|s| s.clone()).map(Bytes::from);
                    PartitionProduceData::default().with_index(index).with_records(records)
                })
                .collect();
            TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_static_str(name)))
                .with_partition_data(partitions)
        };
        let request = ProduceRequest::default()
            .with_acks(1)
            .with_topic_data(vec![topic("alpha", &mut sets_iter), topic("beta", &mut sets_iter)]);
        let mut encoded = BytesMut::new();
        request.encode(&mut encoded, version).expect("encodes");
        // Like read_frame: a buffer of its own, frozen.
        let mut frame = BytesMut::with_capacity(encoded.len());
        frame.extend_from_slice(&encoded);
        let body = frame.freeze();
        let mut cursor = body.clone();
        let request = ProduceRequest::decode(&mut cursor, version).expect("decodes");
        (request, body, sets)
    }

    fn within(piece: &[u8], frame: (usize, usize)) -> bool {
        let start = piece.as_ptr() as usize;
        start >= frame.0 && start + piece.len() <= frame.0 + frame.1
    }

    #[test]
    fn record_sets_are_cut_from_the_frame_without_a_copy() {
        for version in [3, 8, 9] {
            let (mut request, body, expected) = decoded(version);
            let frame = (body.as_ptr() as usize, body.len());
            let sets = take_record_sets(&mut request, body);
            assert_eq!(sets.len(), expected.len());
            for (set, expected) in sets.iter().zip(&expected) {
                assert_eq!(set.as_deref(), expected.as_deref(), "v{version}");
                if let Some(set) = set {
                    assert!(within(set, frame), "v{version}: a set was copied out of the frame");
                }
            }
            // The names no longer point into the frame, and are intact.
            assert_eq!(&*request.topic_data[1].name, "beta");
            assert!(!within(request.topic_data[0].name.as_bytes(), frame));
        }
    }

    #[test]
    fn record_sets_are_copied_when_the_frame_is_shared() {
        let (mut request, body, expected) = decoded(9);
        let frame = (body.as_ptr() as usize, body.len());
        let other_holder = body.clone();
        let before = other_holder.to_vec();
        let mut sets = take_record_sets(&mut request, body);
        for (set, expected) in sets.iter_mut().zip(&expected) {
            assert_eq!(set.as_deref(), expected.as_deref());
            if let Some(set) = set {
                assert!(!within(set, frame), "a shared frame must not be written into");
                set.fill(0xff);
            }
        }
        assert_eq!(other_holder[..], before[..], "the other holder's bytes changed");
    }
}
