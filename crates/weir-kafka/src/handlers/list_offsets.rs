//! ListOffsets (earliest, latest, by timestamp, max timestamp) and OffsetForLeaderEpoch.
//!
//! One node never changes leader, so every partition has leader epoch 0 from offset 0.

use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
use kafka_protocol::messages::{
    ListOffsetsRequest, ListOffsetsResponse, OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse,
};
use kafka_protocol::ResponseError;

use crate::context::{Client, Ctx};

/// The leader epoch of every partition on a single node.
pub const LEADER_EPOCH: i32 = 0;

/// Checks a client's idea of the leader epoch (-1: unknown, accepted).
pub fn check_leader_epoch(current: i32) -> Result<(), ResponseError> {
    match current {
        -1 | LEADER_EPOCH => Ok(()),
        e if e > LEADER_EPOCH => Err(ResponseError::UnknownLeaderEpoch),
        _ => Err(ResponseError::FencedLeaderEpoch),
    }
}

pub async fn handle(ctx: &Ctx, client: &Client, request: ListOffsetsRequest) -> ListOffsetsResponse {
    let broker = ctx.broker.clone();
    // Leader epochs exist from v4 (the encoder refuses fields a version does not have).
    let epoch = if client.version >= 4 { LEADER_EPOCH } else { -1 };
    // v2+: a read_committed consumer's "latest" is the last stable offset.
    let read_committed = request.isolation_level == 1;
    // Timestamp lookups read index files: off the async threads.
    let topics = tokio::task::spawn_blocking(move || {
        request
            .topics
            .into_iter()
            .map(|topic| {
                let name = topic.name.to_string();
                let partitions = topic
                    .partitions
                    .into_iter()
                    .map(|p| {
                        let base = ListOffsetsPartitionResponse::default()
                            .with_partition_index(p.partition_index)
                            .with_timestamp(-1)
                            .with_offset(-1)
                            .with_leader_epoch(-1);
                        if let Err(code) = check_leader_epoch(p.current_leader_epoch) {
                            return base.with_error_code(code.code());
                        }
                        let answer = broker
                            .require_partition(&name, p.partition_index)
                            .and_then(|partition| broker.list_offset(&partition, p.timestamp, read_committed));
                        match answer {
                            Ok(a) => base.with_timestamp(a.timestamp).with_offset(a.offset).with_leader_epoch(epoch),
                            Err(e) => base.with_error_code(e.code.code()),
                        }
                    })
                    .collect();
                ListOffsetsTopicResponse::default().with_name(topic.name).with_partitions(partitions)
            })
            .collect()
    })
    .await
    .unwrap_or_default();
    ListOffsetsResponse::default().with_topics(topics)
}

pub async fn offset_for_leader_epoch(
    ctx: &Ctx,
    _client: &Client,
    request: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let broker = &ctx.broker;
    let topics = request
        .topics
        .into_iter()
        .map(|topic| {
            let name = topic.topic.to_string();
            let partitions = topic
                .partitions
                .into_iter()
                .map(|p| {
                    let base =
                        EpochEndOffset::default().with_partition(p.partition).with_leader_epoch(-1).with_end_offset(-1);
                    if let Err(code) = check_leader_epoch(p.current_leader_epoch) {
                        return base.with_error_code(code.code());
                    }
                    match broker.require_partition(&name, p.partition) {
                        // Epoch 0 covers the whole log; a later epoch was never used.
                        Ok(partition) if p.leader_epoch <= LEADER_EPOCH && p.leader_epoch >= 0 => {
                            base.with_leader_epoch(LEADER_EPOCH).with_end_offset(partition.log.log_end_offset())
                        }
                        Ok(_) => base,
                        Err(e) => base.with_error_code(e.code.code()),
                    }
                })
                .collect();
            OffsetForLeaderTopicResult::default().with_topic(topic.topic).with_partitions(partitions)
        })
        .collect();
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}
