//! Share groups' APIs other than fetching (KIP-932): ShareGroupHeartbeat and ShareGroupDescribe
//! (the coordinator owns the rules; here are only the wire types), and the share offset APIs
//! (DescribeShareGroupOffsets, AlterShareGroupOffsets, DeleteShareGroupOffsets), which read and
//! move the group's invisible-time positions: a share partition's start offset is the engine's
//! `done_below`.

use std::collections::BTreeMap;

use kafka_protocol::messages::alter_share_group_offsets_response::{
    AlterShareGroupOffsetsResponsePartition, AlterShareGroupOffsetsResponseTopic,
};
use kafka_protocol::messages::delete_share_group_offsets_response::DeleteShareGroupOffsetsResponseTopic;
use kafka_protocol::messages::describe_share_group_offsets_response::{
    DescribeShareGroupOffsetsResponseGroup, DescribeShareGroupOffsetsResponsePartition,
    DescribeShareGroupOffsetsResponseTopic,
};
use kafka_protocol::messages::share_group_describe_response::{
    Assignment as DescribedAssignment, DescribedGroup, Member, TopicPartitions as DescribedPartitions,
};
use kafka_protocol::messages::share_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::{
    AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsResponse, DeleteShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsResponse, DescribeShareGroupOffsetsRequest, DescribeShareGroupOffsetsResponse, GroupId,
    ShareGroupDescribeRequest, ShareGroupDescribeResponse, ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use uuid::Uuid;
use weir_coordinators::group::{GroupState, ShareHeartbeatParams};

use super::authorized_operations;
use crate::context::{Client, Ctx};
use crate::errors::{code_of, kafka_error};

fn s(text: impl Into<String>) -> StrBytes {
    StrBytes::from_string(text.into())
}

pub(crate) async fn heartbeat(
    ctx: &Ctx,
    client: &Client,
    req: ShareGroupHeartbeatRequest,
) -> ShareGroupHeartbeatResponse {
    if !ctx.allowed_on_group(client, weir_security::acl::AclOperation::Read, &req.group_id) {
        return ShareGroupHeartbeatResponse::default()
            .with_error_code(ResponseError::GroupAuthorizationFailed.code())
            .with_error_message(Some(s("READ on the group is needed")));
    }
    let params = ShareHeartbeatParams {
        group_id: req.group_id.to_string(),
        member_id: req.member_id.to_string(),
        member_epoch: req.member_epoch,
        rack_id: req.rack_id.map(|r| r.to_string()),
        subscribed_topic_names: req.subscribed_topic_names.map(|n| n.into_iter().map(|t| t.to_string()).collect()),
        client_id: client.client_id.clone(),
        client_host: if client.host.starts_with('/') { client.host.clone() } else { format!("/{}", client.host) },
    };
    let leaving = (req.member_epoch == -1).then(|| (req.group_id.to_string(), req.member_id.to_string()));
    let result = ctx.groups.share_heartbeat(params).await;
    if let (Some((group, member)), None) = (leaving, result.error) {
        super::share_fetch::member_left(ctx, client, &group, &member).await;
    }
    let mut response = ShareGroupHeartbeatResponse::default()
        .with_error_code(code_of(result.error))
        .with_member_id(result.member_id.map(s))
        .with_member_epoch(result.member_epoch)
        .with_heartbeat_interval_ms(result.heartbeat_interval_ms);
    if let Some(error) = result.error {
        response = response.with_error_message(Some(s(error.describe())));
    }
    if let Some(assignment) = result.assignment {
        let topics = assignment
            .into_iter()
            .map(|(topic_id, partitions)| {
                TopicPartitions::default().with_topic_id(topic_id).with_partitions(partitions.into_iter().collect())
            })
            .collect();
        response = response.with_assignment(Some(Assignment::default().with_topic_partitions(topics)));
    }
    response
}

pub(crate) async fn describe(ctx: &Ctx, client: &Client, req: ShareGroupDescribeRequest) -> ShareGroupDescribeResponse {
    let (ids, refused) = authorized_operations::describable_groups(ctx, client, &req.group_ids);
    let refused = refused.into_iter().map(|id| {
        DescribedGroup::default()
            .with_error_code(kafka_protocol::ResponseError::GroupAuthorizationFailed.code())
            .with_group_id(GroupId(s(id)))
            .with_authorized_operations(authorized_operations::NOT_REQUESTED)
    });
    let operations_of =
        |group: &str| authorized_operations::of_group(ctx, client, group, req.include_authorized_operations);
    let groups = ctx
        .groups
        .share_group_describe(&ids)
        .await
        .into_iter()
        .map(|g| {
            let members = g
                .members
                .into_iter()
                .map(|m| {
                    let assignment = DescribedAssignment::default().with_topic_partitions(
                        m.assignment
                            .into_iter()
                            .map(|(id, name, partitions)| {
                                DescribedPartitions::default()
                                    .with_topic_id(id)
                                    .with_topic_name(TopicName(s(name)))
                                    .with_partitions(partitions)
                            })
                            .collect(),
                    );
                    Member::default()
                        .with_member_id(s(m.member_id))
                        .with_rack_id(m.rack_id.map(s))
                        .with_member_epoch(m.member_epoch)
                        .with_client_id(s(m.client_id))
                        .with_client_host(s(m.client_host))
                        .with_subscribed_topic_names(
                            m.subscribed_topic_names.into_iter().map(|t| TopicName(s(t))).collect(),
                        )
                        .with_assignment(assignment)
                })
                .collect();
            let operations = operations_of(&g.group_id);
            let group = DescribedGroup::default()
                .with_error_code(code_of(g.error))
                .with_group_id(GroupId(s(g.group_id)))
                .with_group_state(s(g.state.as_str()))
                .with_group_epoch(g.group_epoch)
                .with_assignment_epoch(g.assignment_epoch)
                .with_assignor_name(s(g.assignor_name))
                .with_members(members)
                .with_authorized_operations(operations);
            match g.error {
                Some(error) => group.with_error_message(Some(s(error.describe()))),
                None => group,
            }
        })
        .chain(refused)
        .collect();
    ShareGroupDescribeResponse::default().with_groups(groups)
}

/// A DescribeShareGroupOffsets answer, with each partition's lag for v1 (which the
/// `kafka-protocol` crate's schema lacks, see `share_versions`).
pub(crate) struct DescribedOffsets {
    pub(crate) response: DescribeShareGroupOffsetsResponse,
    /// (group, topic, partition) to lag, for the partitions whose leader answered.
    lags: BTreeMap<(String, String, i32), i64>,
}

impl DescribedOffsets {
    /// How many records of a share partition the group is not done with: those in flight, and
    /// those not yet handed out up to the last stable offset; -1 when the partition's leader
    /// knows no position of the group there.
    pub(crate) fn lag(&self, group: &str, topic: &str, partition: i32) -> i64 {
        self.lags.get(&(group.to_string(), topic.to_string(), partition)).copied().unwrap_or(-1)
    }
}

/// DescribeShareGroupOffsets: each partition's start offset (every record below it is done),
/// asked of the broker leading the partition, wherever that is; -1 for a partition the group
/// never consumed (Kafka's answer), or whose leader did not answer.
pub(crate) async fn describe_offsets(
    ctx: &Ctx,
    client: &Client,
    req: DescribeShareGroupOffsetsRequest,
) -> DescribedOffsets {
    let metadata = ctx.broker.metadata();
    let mut lags = BTreeMap::new();
    let mut groups = Vec::with_capacity(req.groups.len());
    for g in req.groups {
        let group = g.group_id.to_string();
        if !ctx.allowed_on_group(client, weir_security::acl::AclOperation::Describe, &group) {
            groups.push(
                DescribeShareGroupOffsetsResponseGroup::default()
                    .with_group_id(GroupId(s(group)))
                    .with_error_code(ResponseError::GroupAuthorizationFailed.code()),
            );
            continue;
        }
        let asked: Option<Vec<(String, Vec<i32>)>> =
            g.topics.map(|topics| topics.into_iter().map(|t| (t.topic_name.to_string(), t.partitions)).collect());
        let standings = match (ctx.share.as_ref(), &asked) {
            (None, _) => BTreeMap::new(),
            (Some(engines), Some(asked)) => {
                let queues: Vec<(String, i32)> = asked
                    .iter()
                    .flat_map(|(topic, partitions)| partitions.iter().map(move |p| (topic.clone(), *p)))
                    .collect();
                engines.messaging.queue_standings(&group, Some(&queues)).await
            }
            // Every partition the group has a position on, anywhere.
            (Some(engines), None) => engines.messaging.queue_standings(&group, None).await,
        };
        let wanted = asked.unwrap_or_else(|| {
            let mut by_topic: BTreeMap<String, Vec<i32>> = BTreeMap::new();
            for (topic, partition) in standings.keys() {
                by_topic.entry(topic.clone()).or_default().push(*partition);
            }
            by_topic.into_iter().collect()
        });
        let topics = wanted
            .into_iter()
            .map(|(name, mut partitions)| {
                partitions.sort_unstable();
                let topic = metadata.topic(&name);
                let partitions = partitions
                    .into_iter()
                    .map(|p| {
                        let answer = DescribeShareGroupOffsetsResponsePartition::default().with_partition_index(p);
                        match topic.and_then(|t| t.partition(p)) {
                            None => answer
                                .with_start_offset(-1)
                                .with_error_code(ResponseError::UnknownTopicOrPartition.code()),
                            Some(state) => {
                                let standing = standings.get(&(name.clone(), p));
                                if let Some(standing) = standing {
                                    lags.insert((group.clone(), name.clone(), p), standing.lag());
                                }
                                answer
                                    .with_start_offset(standing.map_or(-1, |s| s.position.done_below))
                                    .with_leader_epoch(state.leader_epoch)
                            }
                        }
                    })
                    .collect();
                DescribeShareGroupOffsetsResponseTopic::default()
                    .with_topic_name(TopicName(s(name)))
                    .with_topic_id(topic.map_or(Uuid::nil(), |t| t.id))
                    .with_partitions(partitions)
            })
            .collect();
        groups.push(
            DescribeShareGroupOffsetsResponseGroup::default().with_group_id(GroupId(s(group))).with_topics(topics),
        );
    }
    DescribedOffsets { response: DescribeShareGroupOffsetsResponse::default().with_groups(groups), lags }
}

/// Why a group's offsets cannot be changed now: it has members, or its name is another type's.
async fn check_offsets_changeable(ctx: &Ctx, group: &str) -> Result<(), ResponseError> {
    if group.is_empty() {
        return Err(ResponseError::InvalidGroupId);
    }
    if ctx.share.is_none() {
        return Err(ResponseError::InvalidRequest);
    }
    match ctx.groups.share_group_state(group) {
        Some(GroupState::Empty) => Ok(()),
        Some(_) => Err(ResponseError::NonEmptyGroup),
        None => ctx.groups.ensure_share_group(group).await.map_err(kafka_error),
    }
}

pub(crate) async fn alter_offsets(
    ctx: &Ctx,
    client: &Client,
    req: AlterShareGroupOffsetsRequest,
) -> AlterShareGroupOffsetsResponse {
    let group = req.group_id.to_string();
    if !ctx.allowed_on_group(client, weir_security::acl::AclOperation::Read, &group) {
        return AlterShareGroupOffsetsResponse::default()
            .with_error_code(ResponseError::GroupAuthorizationFailed.code());
    }
    if let Err(error) = check_offsets_changeable(ctx, &group).await {
        return AlterShareGroupOffsetsResponse::default().with_error_code(error.code());
    }
    let Some(engines) = ctx.share.as_ref() else { return AlterShareGroupOffsetsResponse::default() };
    let metadata = ctx.broker.metadata();
    let mut responses = Vec::with_capacity(req.topics.len());
    for topic in req.topics {
        let name = topic.topic_name.to_string();
        let meta = metadata.topic(&name);
        let valid: Vec<(i32, i64)> = topic
            .partitions
            .iter()
            .filter(|p| p.start_offset >= 0 && meta.is_some_and(|t| t.partition(p.partition_index).is_some()))
            .map(|p| (p.partition_index, p.start_offset))
            .collect();
        let moved =
            if valid.is_empty() { Ok(0) } else { engines.messaging.reset_share_queues(&group, &name, &valid).await };
        let partitions = topic
            .partitions
            .iter()
            .map(|p| {
                let error = if meta.is_none_or(|t| t.partition(p.partition_index).is_none()) {
                    ResponseError::UnknownTopicOrPartition.code()
                } else if p.start_offset < 0 {
                    ResponseError::InvalidRequest.code()
                } else {
                    moved.as_ref().err().map_or(0, |e| kafka_error(e.kind).code())
                };
                AlterShareGroupOffsetsResponsePartition::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(error)
            })
            .collect();
        responses.push(
            AlterShareGroupOffsetsResponseTopic::default()
                .with_topic_name(TopicName(s(name)))
                .with_topic_id(meta.map_or(Uuid::nil(), |t| t.id))
                .with_partitions(partitions),
        );
    }
    AlterShareGroupOffsetsResponse::default().with_responses(responses)
}

pub(crate) async fn delete_offsets(
    ctx: &Ctx,
    client: &Client,
    req: DeleteShareGroupOffsetsRequest,
) -> DeleteShareGroupOffsetsResponse {
    let group = req.group_id.to_string();
    if !ctx.allowed_on_group(client, weir_security::acl::AclOperation::Delete, &group) {
        return DeleteShareGroupOffsetsResponse::default()
            .with_error_code(ResponseError::GroupAuthorizationFailed.code());
    }
    if let Err(error) = check_offsets_changeable(ctx, &group).await {
        return DeleteShareGroupOffsetsResponse::default().with_error_code(error.code());
    }
    let Some(engines) = ctx.share.as_ref() else { return DeleteShareGroupOffsetsResponse::default() };
    let earliest = ctx.broker.group_settings(&group).share_from_earliest;
    let metadata = ctx.broker.metadata();
    let mut responses = Vec::with_capacity(req.topics.len());
    for topic in req.topics {
        let name = topic.topic_name.to_string();
        let answer = DeleteShareGroupOffsetsResponseTopic::default().with_topic_name(TopicName(s(name.clone())));
        let Some(meta) = metadata.topic(&name) else {
            responses.push(answer.with_error_code(ResponseError::UnknownTopicOrPartition.code()));
            continue;
        };
        // The state goes: the group starts again where `share.auto.offset.reset` says, taken
        // now (on partitions this broker leads; others are reset where they are led).
        let positions: Vec<(i32, i64)> = (0..meta.partitions)
            .filter_map(|p| {
                let partition = ctx.broker.partition(&name, p)?;
                let offset =
                    if earliest { partition.log.log_start_offset() } else { partition.log.last_stable_offset() };
                Some((p, offset))
            })
            .collect();
        let error = match engines.messaging.reset_queues(&group, &name, &positions).await {
            Ok(_) => 0,
            Err(e) => kafka_error(e.kind).code(),
        };
        responses.push(answer.with_topic_id(meta.id).with_error_code(error));
    }
    DeleteShareGroupOffsetsResponse::default().with_responses(responses)
}
