//! Produce: batches are validated and appended as sent (compressed batches stay compressed), one
//! partition after another in request order. The response waits as long as the topic's flush
//! policy says an acknowledged write must wait (see `Broker::append`).

use bytes::BytesMut;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::ResponseError;

use crate::context::{Client, Ctx};
use crate::handlers::message;

pub async fn handle(ctx: &Ctx, client: &Client, request: ProduceRequest) -> ProduceResponse {
    let broker = &ctx.broker;
    let version = client.version;
    let acks = request.acks;
    let mut responses = Vec::with_capacity(request.topic_data.len());
    for topic in request.topic_data {
        let name = topic.name.to_string();
        let mut partitions = Vec::with_capacity(topic.partition_data.len());
        for data in topic.partition_data {
            let base = PartitionProduceResponse::default()
                .with_index(data.index)
                .with_base_offset(-1)
                .with_log_append_time_ms(-1)
                .with_log_start_offset(-1);
            let fail = |code: ResponseError, text: String| {
                let failed = base.clone().with_error_code(code.code());
                // Error messages exist from v8.
                if version >= 8 {
                    failed.with_error_message(message(text))
                } else {
                    failed
                }
            };
            if !matches!(acks, -1..=1) {
                partitions
                    .push(fail(ResponseError::InvalidRequiredAcks, format!("acks must be -1, 0 or 1, not {acks}")));
                continue;
            }
            let partition = match broker.require_partition(&name, data.index) {
                Ok(p) => p,
                Err(e) => {
                    partitions.push(fail(e.code, e.message));
                    continue;
                }
            };
            if partition.internal {
                partitions.push(fail(
                    ResponseError::InvalidTopicException,
                    format!("Cannot append to internal topic {name}"),
                ));
                continue;
            }
            let records = match data.records {
                Some(records) if !records.is_empty() => BytesMut::from(&records[..]),
                _ => {
                    partitions.push(fail(
                        ResponseError::InvalidRecord,
                        "a produce request needs at least one record batch".into(),
                    ));
                    continue;
                }
            };
            match broker.append(partition.clone(), records, acks).await {
                Ok(info) => partitions.push(
                    base.with_base_offset(info.first_offset)
                        .with_log_append_time_ms(info.log_append_time_ms.unwrap_or(-1))
                        .with_log_start_offset(if version >= 5 { partition.log.log_start_offset() } else { -1 }),
                ),
                Err(e) => {
                    tracing::debug!(topic = %name, partition = data.index, error = %e, "produce refused");
                    partitions.push(fail(e.code, e.message));
                }
            }
        }
        responses.push(TopicProduceResponse::default().with_name(topic.name).with_partition_responses(partitions));
    }
    ProduceResponse::default().with_responses(responses)
}
