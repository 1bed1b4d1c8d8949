//! ListOffsets (earliest, latest, by timestamp, max timestamp) and OffsetForLeaderEpoch, both
//! answered from the partition's log and its leader-epoch cache.

use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
use kafka_protocol::messages::{
    ListOffsetsRequest, ListOffsetsResponse, OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse,
};
use weir_broker::fetch::Isolation;
use weir_broker::OffsetQuery;

use weir_security::acl::{AclOperation, ResourceType};

use crate::context::{Client, Ctx};
use crate::errors;

/// ListOffsets' special timestamps.
const LATEST_TIMESTAMP: i64 = -1;
const EARLIEST_TIMESTAMP: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
/// KIP-405: the earliest offset on local storage; without tiered storage, the log start.
const EARLIEST_LOCAL_TIMESTAMP: i64 = -4;
/// KIP-1005 (v9+): the last offset the object store holds of a tiered log.
const LATEST_TIERED_TIMESTAMP: i64 = -5;

fn query(timestamp: i64) -> OffsetQuery {
    match timestamp {
        LATEST_TIMESTAMP => OffsetQuery::Latest,
        EARLIEST_TIMESTAMP => OffsetQuery::Earliest,
        EARLIEST_LOCAL_TIMESTAMP => OffsetQuery::EarliestLocal,
        LATEST_TIERED_TIMESTAMP => OffsetQuery::LatestTiered,
        MAX_TIMESTAMP => OffsetQuery::MaxTimestamp,
        t => OffsetQuery::AtTimestamp(t),
    }
}

fn leader_epoch(epoch: i32) -> Option<i32> {
    (epoch >= 0).then_some(epoch)
}

pub(crate) async fn handle(ctx: &Ctx, client: &Client, request: ListOffsetsRequest) -> ListOffsetsResponse {
    let broker = ctx.broker.clone();
    // Leader epochs exist from v4 (the encoder refuses fields a version does not have).
    let with_epochs = client.version >= 4;
    // v2+: a read_committed consumer's "latest" is the last stable offset.
    let isolation = if request.isolation_level == 1 { Isolation::Committed } else { Isolation::HighWatermark };
    // DESCRIBE on each topic, decided before the blocking work.
    let refused: Vec<Option<weir_broker::BrokerError>> = request
        .topics
        .iter()
        .map(|t| ctx.require(client, AclOperation::Describe, ResourceType::Topic, &t.name).err())
        .collect();
    // Timestamp lookups read index files: off the async threads.
    let topics = tokio::task::spawn_blocking(move || {
        request
            .topics
            .into_iter()
            .zip(refused)
            .map(|(topic, refused)| {
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
                        let found = match &refused {
                            Some(e) => Err(e.clone()),
                            None => broker.require_partition(&name, p.partition_index),
                        };
                        let answer = found.and_then(|partition| {
                            partition.check_leader_epoch(leader_epoch(p.current_leader_epoch))?;
                            broker.list_offset(&partition, query(p.timestamp), isolation)
                        });
                        // Kafka's -1 for "none": no timestamp, no matching record, no epoch.
                        match answer {
                            Ok(Some(a)) => base
                                .with_timestamp(a.timestamp.unwrap_or(-1))
                                .with_offset(a.offset)
                                .with_leader_epoch(if with_epochs { a.leader_epoch.unwrap_or(-1) } else { -1 }),
                            Ok(None) => base,
                            Err(e) => base.with_error_code(errors::code(&e)),
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

pub(crate) async fn offset_for_leader_epoch(
    ctx: &Ctx,
    client: &Client,
    request: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let broker = ctx.broker.clone();
    // A follower (replica id set) needs CLUSTER_ACTION, implied on a cluster's inter-broker
    // listener; a consumer DESCRIBE on each topic.
    let follower = request.replica_id.0 >= 0;
    let refused: Vec<Option<weir_broker::BrokerError>> = request
        .topics
        .iter()
        .map(|t| {
            if follower && ctx.on_inter_broker_listener(client) {
                None
            } else if follower {
                ctx.require_on_cluster(client, AclOperation::ClusterAction).err()
            } else {
                ctx.require(client, AclOperation::Describe, ResourceType::Topic, &t.topic).err()
            }
        })
        .collect();
    // The first question after a restart reads a batch header per partition: off the async
    // threads.
    let topics = tokio::task::spawn_blocking(move || {
        request
            .topics
            .into_iter()
            .zip(refused)
            .map(|(topic, refused)| {
                let name = topic.topic.to_string();
                let partitions = topic
                    .partitions
                    .into_iter()
                    .map(|p| {
                        let base = EpochEndOffset::default()
                            .with_partition(p.partition)
                            .with_leader_epoch(-1)
                            .with_end_offset(-1);
                        let found = match &refused {
                            Some(e) => Err(e.clone()),
                            None => broker.require_partition(&name, p.partition),
                        };
                        let answer = found.and_then(|partition| {
                            partition.check_leader_epoch(leader_epoch(p.current_leader_epoch))?;
                            broker.end_offset_for_epoch(&partition, p.leader_epoch)
                        });
                        match answer {
                            Ok((epoch, end_offset)) => base.with_leader_epoch(epoch).with_end_offset(end_offset),
                            Err(e) => base.with_error_code(errors::code(&e)),
                        }
                    })
                    .collect();
                OffsetForLeaderTopicResult::default().with_topic(topic.topic).with_partitions(partitions)
            })
            .collect()
    })
    .await
    .unwrap_or_default();
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}
