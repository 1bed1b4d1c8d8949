//! The consumer group protocol's APIs (KIP-848): ConsumerGroupHeartbeat and
//! ConsumerGroupDescribe. The coordinator owns the rules; here are only the wire types.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::messages::consumer_group_describe_response::{
    Assignment as DescribedAssignment, DescribedGroup, Member, TopicPartitions as DescribedPartitions,
};
use kafka_protocol::messages::consumer_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse, GroupId, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;
use weir_coordinators::group::ConsumerHeartbeatParams;

use super::authorized_operations;
use crate::context::{Client, Ctx};
use crate::errors::code_of;

fn s(text: impl Into<String>) -> StrBytes {
    StrBytes::from_string(text.into())
}

/// Describe's member type of a consumer-protocol member (v1).
const MEMBER_TYPE_CONSUMER: i8 = 1;

pub(crate) async fn heartbeat(
    ctx: &Ctx,
    client: &Client,
    req: ConsumerGroupHeartbeatRequest,
) -> ConsumerGroupHeartbeatResponse {
    if !ctx.allowed_on_group(client, weir_security::acl::AclOperation::Read, &req.group_id) {
        return ConsumerGroupHeartbeatResponse::default()
            .with_error_code(kafka_protocol::ResponseError::GroupAuthorizationFailed.code())
            .with_error_message(Some(s("READ on the group is needed")));
    }
    let owned = req.topic_partitions.map(|topics| {
        let mut owned: BTreeMap<Uuid, BTreeSet<i32>> = BTreeMap::new();
        for t in topics {
            owned.entry(t.topic_id).or_default().extend(t.partitions);
        }
        owned.retain(|_, p| !p.is_empty());
        owned
    });
    let params = ConsumerHeartbeatParams {
        group_id: req.group_id.to_string(),
        member_id: req.member_id.to_string(),
        member_epoch: req.member_epoch,
        instance_id: req.instance_id.map(|i| i.to_string()),
        rack_id: req.rack_id.map(|r| r.to_string()),
        rebalance_timeout_ms: req.rebalance_timeout_ms,
        subscribed_topic_names: req.subscribed_topic_names.map(|n| n.into_iter().map(|t| t.to_string()).collect()),
        // Empty clears the member's pattern (the coordinator's rule).
        subscribed_topic_regex: req.subscribed_topic_regex.map(|r| r.to_string()),
        server_assignor: req.server_assignor.map(|a| a.to_string()),
        owned,
        client_id: client.client_id.clone(),
        client_host: if client.host.starts_with('/') { client.host.clone() } else { format!("/{}", client.host) },
        version: client.version,
    };
    let result = ctx.groups.consumer_heartbeat(params).await;
    let mut response = ConsumerGroupHeartbeatResponse::default()
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

fn described(assignment: Vec<(Uuid, String, Vec<i32>)>) -> DescribedAssignment {
    DescribedAssignment::default().with_topic_partitions(
        assignment
            .into_iter()
            .map(|(id, name, partitions)| {
                DescribedPartitions::default()
                    .with_topic_id(id)
                    .with_topic_name(TopicName(s(name)))
                    .with_partitions(partitions)
            })
            .collect(),
    )
}

pub(crate) async fn describe(
    ctx: &Ctx,
    client: &Client,
    req: ConsumerGroupDescribeRequest,
) -> ConsumerGroupDescribeResponse {
    let (ids, refused) = authorized_operations::describable_groups(ctx, client, &req.group_ids);
    let refused = refused.into_iter().map(|id| {
        DescribedGroup::default()
            .with_error_code(kafka_protocol::ResponseError::GroupAuthorizationFailed.code())
            .with_group_id(GroupId(s(id)))
            .with_authorized_operations(authorized_operations::NOT_REQUESTED)
    });
    let operations_of =
        |group: &str| authorized_operations::of_group(ctx, client, group, req.include_authorized_operations);
    let version = client.version;
    let groups = ctx
        .groups
        .consumer_group_describe(&ids)
        .await
        .into_iter()
        .map(|g| {
            let members = g
                .members
                .into_iter()
                .map(|m| {
                    let member = Member::default()
                        .with_member_id(s(m.member_id))
                        .with_instance_id(m.instance_id.map(s))
                        .with_rack_id(m.rack_id.map(s))
                        .with_member_epoch(m.member_epoch)
                        .with_client_id(s(m.client_id))
                        .with_client_host(s(m.client_host))
                        .with_subscribed_topic_names(
                            m.subscribed_topic_names.into_iter().map(|t| TopicName(s(t))).collect(),
                        )
                        .with_subscribed_topic_regex(m.subscribed_topic_regex.map(s))
                        .with_assignment(described(m.assignment))
                        .with_target_assignment(described(m.target_assignment));
                    if version >= 1 {
                        member.with_member_type(MEMBER_TYPE_CONSUMER)
                    } else {
                        member
                    }
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
    ConsumerGroupDescribeResponse::default().with_groups(groups)
}
