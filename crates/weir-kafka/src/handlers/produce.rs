//! Produce: batches are validated and appended as sent (compressed batches stay compressed), one
//! partition after another in request order, all in one blocking task (`Broker::write_many`).
//! The response waits as long as each topic's flush policy says an acknowledged write must wait,
//! but the connection does not: `handle` returns once the batches are written, with the wait
//! still to run, so the next request on the connection is appended while this one's fsync runs.

use std::future::Future;
use std::sync::Arc;

use bytes::BytesMut;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::ResponseError;
use weir_broker::partition::{self, Partition};
use weir_broker::BrokerError;

use crate::context::{Client, Ctx};
use crate::handlers::message;

/// Writes the request's batches; the returned future waits until they are durable as promised
/// and builds the response.
pub async fn handle(
    ctx: &Ctx,
    client: &Client,
    request: ProduceRequest,
) -> impl Future<Output = ProduceResponse> + Send + 'static {
    let broker = &ctx.broker;
    let version = client.version;
    let acks = request.acks;
    let fail = |index: i32, code: ResponseError, text: String| failed_partition(version, index, code, text);

    // First pass: resolve and check every partition; what passes is appended in one go.
    let mut slots: Vec<Vec<Slot>> = Vec::with_capacity(request.topic_data.len());
    let mut names = Vec::with_capacity(request.topic_data.len());
    let mut appends: Vec<(Arc<Partition>, BytesMut)> = Vec::new();
    for topic in request.topic_data {
        let partitions = broker.topic_partitions(&topic.name);
        let mut topic_slots = Vec::with_capacity(topic.partition_data.len());
        for data in topic.partition_data {
            let index = data.index;
            if !matches!(acks, -1..=1) {
                let text = format!("acks must be -1, 0 or 1, not {acks}");
                topic_slots.push(Slot::Done(fail(index, ResponseError::InvalidRequiredAcks, text)));
                continue;
            }
            let partition = partitions.as_deref().and_then(|list| partition::by_index(list, index));
            let Some(partition) = partition else {
                let e = BrokerError::unknown_topic(&topic.name, index);
                topic_slots.push(Slot::Done(fail(index, e.code, e.message)));
                continue;
            };
            if partition.internal {
                let text = format!("Cannot append to internal topic {}", &*topic.name);
                topic_slots.push(Slot::Done(fail(index, ResponseError::InvalidTopicException, text)));
                continue;
            }
            match data.records {
                // The batch is copied once into a buffer of its own: the log assigns offsets in
                // place, and the request's bytes are shared with the rest of the frame.
                Some(records) if !records.is_empty() => {
                    topic_slots.push(Slot::Appending(partition.clone()));
                    appends.push((partition.clone(), BytesMut::from(&records[..])));
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

    let pending = broker.write_many(appends, acks).await;
    async move {
        let results = pending.durable().await;
        respond(version, names, slots, results)
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
                            failed_partition(version, partition.index, e.code, e.message)
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
