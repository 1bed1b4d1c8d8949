//! Consumer group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
//! OffsetCommit, OffsetFetch, OffsetDelete, ListGroups, DescribeGroups, DeleteGroups.
//!
//! Each handler turns the decoded request into the plain parameters of
//! `weir_coordinators::group::GroupCoordinator` and its answer into the response of the request's
//! version. The coordinator owns every rule; here are only the version differences (which
//! fields exist, where an error goes when a version has no place for it).

use std::collections::HashMap;

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::offset_delete_response::{OffsetDeleteResponsePartition, OffsetDeleteResponseTopic};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions, OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{
    BrokerId, DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse,
    FindCoordinatorRequest, FindCoordinatorResponse, GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
    JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse, OffsetFetchRequest,
    OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use weir_coordinators::group::{
    CommitParams, ErrorKind, FetchedOffset, GroupState, HeartbeatParams, JoinGroupParams, LeavingMember,
    OffsetToCommit, Protocol, SyncGroupParams,
};

use kafka_protocol::ResponseError;
use weir_coordinators::group::OFFSETS_TOPIC;
use weir_coordinators::txn::TRANSACTION_STATE_TOPIC;

use weir_security::acl::{AclOperation, ResourceType};

use super::{commit_generation, committed_leader_epoch};
use crate::context::{Client, Ctx};
use crate::errors::{code_of, kafka_error};

/// FindCoordinator key types.
const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;

/// The answer when the authorizer refuses the group.
const GROUP_REFUSED: ResponseError = ResponseError::GroupAuthorizationFailed;
/// "Not requested" in DescribeGroups' authorized operations.
const AUTHORIZED_OPERATIONS_OMITTED: i32 = i32::MIN;

fn s(text: impl Into<String>) -> StrBytes {
    StrBytes::from_string(text.into())
}

fn code(error: Option<ErrorKind>) -> i16 {
    code_of(error)
}

/// Kafka reports client hosts as `InetAddress.toString()`: "/127.0.0.1".
fn client_host(client: &Client) -> String {
    if client.host.starts_with('/') {
        client.host.clone()
    } else {
        format!("/{}", client.host)
    }
}

/// Groups `(topic, item)` pairs by topic, topics in order of first appearance.
fn by_topic<T>(items: impl IntoIterator<Item = (String, T)>) -> Vec<(String, Vec<T>)> {
    let mut order: Vec<(String, Vec<T>)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for (topic, item) in items {
        match index.get(&topic) {
            Some(&i) => order[i].1.push(item),
            None => {
                index.insert(topic.clone(), order.len());
                order.push((topic, vec![item]));
            }
        }
    }
    order
}

/// A response's topic entries from per-partition results: grouped by topic (in order of first
/// appearance), each result made an entry by `partition`, each topic by `topic`.
fn topic_entries<R, P, T>(
    results: impl IntoIterator<Item = (String, R)>,
    partition: impl Fn(R) -> P,
    topic: impl Fn(TopicName, Vec<P>) -> T,
) -> Vec<T> {
    by_topic(results)
        .into_iter()
        .map(|(name, items)| topic(TopicName(s(name)), items.into_iter().map(&partition).collect()))
        .collect()
}

/// The `(topic, partition)` pairs of a request's topics, each given with its partition indexes.
fn requested_partitions(topics: impl IntoIterator<Item = (TopicName, Vec<i32>)>) -> Vec<(String, i32)> {
    topics
        .into_iter()
        .flat_map(|(name, partitions)| {
            let name = name.to_string();
            partitions.into_iter().map(move |p| (name.clone(), p))
        })
        .collect()
}

// ----- FindCoordinator ---------------------------------------------------------------------

pub(crate) async fn find_coordinator(
    ctx: &Ctx,
    client: &Client,
    req: FindCoordinatorRequest,
) -> FindCoordinatorResponse {
    if client.version >= 4 {
        let mut coordinators = Vec::with_capacity(req.coordinator_keys.len());
        for key in req.coordinator_keys {
            let found = coordinator_of(ctx, client, req.key_type, key.as_str()).await;
            let base = Coordinator::default().with_key(key);
            coordinators.push(match found {
                Ok((node, host, port)) => base.with_node_id(node).with_host(host).with_port(port),
                Err((error, text)) => base
                    .with_node_id(BrokerId(-1))
                    .with_port(-1)
                    .with_error_code(error.code())
                    .with_error_message(super::message(&text)),
            });
        }
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    let response = FindCoordinatorResponse::default();
    match coordinator_of(ctx, client, req.key_type, req.key.as_str()).await {
        Ok((node, host, port)) => response.with_node_id(node).with_host(host).with_port(port),
        Err((error, text)) => {
            let response = response.with_error_code(error.code()).with_node_id(BrokerId(-1)).with_port(-1);
            if client.version >= 1 {
                response.with_error_message(super::message(&text))
            } else {
                response
            }
        }
    }
}

/// The coordinator of a group (a transactional id): the broker leading its partition of
/// `__consumer_offsets` (`__transaction_state`), which the first FindCoordinator creates.
async fn coordinator_of(
    ctx: &Ctx,
    client: &Client,
    key_type: i8,
    key: &str,
) -> Result<(BrokerId, StrBytes, i32), (ResponseError, String)> {
    if matches!(key_type, KEY_TYPE_GROUP | KEY_TYPE_TRANSACTION) && ctx.broker.is_shutting_down() {
        return Err((ResponseError::CoordinatorNotAvailable, "The broker is shutting down.".to_string()));
    }
    let refused = match key_type {
        KEY_TYPE_GROUP => (!ctx.allowed_on_group(client, AclOperation::Describe, key)).then_some(GROUP_REFUSED),
        KEY_TYPE_TRANSACTION => (!ctx.allowed(client, AclOperation::Describe, ResourceType::TransactionalId, key))
            .then_some(ResponseError::TransactionalIdAuthorizationFailed),
        _ => None,
    };
    if let Some(error) = refused {
        return Err((error, "DESCRIBE on the coordinator key is needed.".to_string()));
    }
    let located = match key_type {
        KEY_TYPE_GROUP => ctx.groups.coordinator_partition(key).await.map(|p| (OFFSETS_TOPIC, p)),
        KEY_TYPE_TRANSACTION => ctx.txns.coordinator_partition(key).await.map(|p| (TRANSACTION_STATE_TOPIC, p)),
        _ => return Err((ResponseError::InvalidRequest, "Unknown coordinator key type.".to_string())),
    };
    // A topic that could not be created yet (no controller right now): retriable for clients.
    let (topic, partition) = located.map_err(|e| (ResponseError::CoordinatorNotAvailable, e.message))?;
    match ctx.broker.leader_endpoint(topic, partition) {
        Ok(leader) => {
            let (host, port) = ctx.endpoint(&leader, client.listener);
            Ok((BrokerId(leader.id), s(host), i32::from(port)))
        }
        Err(e) => Err((kafka_error(e.kind), e.message)),
    }
}

// ----- membership --------------------------------------------------------------------------

pub(crate) async fn join_group(ctx: &Ctx, client: &Client, req: JoinGroupRequest) -> JoinGroupResponse {
    let version = client.version;
    if !ctx.allowed_on_group(client, AclOperation::Read, &req.group_id) {
        return JoinGroupResponse::default()
            .with_error_code(GROUP_REFUSED.code())
            .with_generation_id(-1)
            .with_protocol_name((version < 7).then(|| s("")))
            .with_member_id(req.member_id);
    }
    let params = JoinGroupParams {
        group_id: req.group_id.to_string(),
        member_id: req.member_id.to_string(),
        group_instance_id: req.group_instance_id.map(|i| i.to_string()),
        client_id: client.client_id.clone(),
        client_host: client_host(client),
        session_timeout_ms: req.session_timeout_ms,
        // v0 has no rebalance timeout: the session timeout serves as both.
        rebalance_timeout_ms: if version == 0 { req.session_timeout_ms } else { req.rebalance_timeout_ms },
        protocol_type: req.protocol_type.to_string(),
        protocols: req
            .protocols
            .into_iter()
            .map(|p| Protocol { name: p.name.to_string(), metadata: p.metadata })
            .collect(),
        require_known_member_id: version >= 4,
        reason: req.reason.map(|r| r.to_string()),
    };
    let result = ctx.groups.join_group(params).await;
    let members = result
        .members
        .into_iter()
        .map(|m| {
            JoinGroupResponseMember::default()
                .with_member_id(s(m.member_id))
                .with_group_instance_id(if version >= 5 { m.group_instance_id.map(s) } else { None })
                .with_metadata(m.metadata)
        })
        .collect();
    // Before v7 the protocol name is a non-nullable string and there is no protocol type.
    let (protocol_type, protocol_name) = if version >= 7 {
        (result.protocol_type.map(s), result.protocol_name.map(s))
    } else {
        (None, Some(s(result.protocol_name.unwrap_or_default())))
    };
    JoinGroupResponse::default()
        .with_error_code(code(result.error))
        .with_generation_id(result.generation_id.unwrap_or(-1))
        .with_protocol_type(protocol_type)
        .with_protocol_name(protocol_name)
        .with_leader(s(result.leader_id))
        .with_skip_assignment(version >= 9 && result.skip_assignment)
        .with_member_id(s(result.member_id))
        .with_members(members)
}

pub(crate) async fn sync_group(ctx: &Ctx, client: &Client, req: SyncGroupRequest) -> SyncGroupResponse {
    if !ctx.allowed_on_group(client, AclOperation::Read, &req.group_id) {
        return SyncGroupResponse::default().with_error_code(GROUP_REFUSED.code());
    }
    let params = SyncGroupParams {
        group_id: req.group_id.to_string(),
        generation_id: req.generation_id,
        member_id: req.member_id.to_string(),
        group_instance_id: req.group_instance_id.map(|i| i.to_string()),
        protocol_type: req.protocol_type.map(|t| t.to_string()),
        protocol_name: req.protocol_name.map(|n| n.to_string()),
        assignments: req.assignments.into_iter().map(|a| (a.member_id.to_string(), a.assignment)).collect(),
    };
    let result = ctx.groups.sync_group(params).await;
    let response = SyncGroupResponse::default().with_error_code(code(result.error)).with_assignment(result.assignment);
    if client.version >= 5 {
        response.with_protocol_type(result.protocol_type.map(s)).with_protocol_name(result.protocol_name.map(s))
    } else {
        response
    }
}

pub(crate) async fn heartbeat(ctx: &Ctx, client: &Client, req: HeartbeatRequest) -> HeartbeatResponse {
    if !ctx.allowed_on_group(client, AclOperation::Read, &req.group_id) {
        return HeartbeatResponse::default().with_error_code(GROUP_REFUSED.code());
    }
    let params = HeartbeatParams {
        group_id: req.group_id.to_string(),
        generation_id: req.generation_id,
        member_id: req.member_id.to_string(),
        group_instance_id: req.group_instance_id.map(|i| i.to_string()),
    };
    let result = ctx.groups.heartbeat(params).await;
    HeartbeatResponse::default().with_error_code(code(result.err()))
}

pub(crate) async fn leave_group(ctx: &Ctx, client: &Client, req: LeaveGroupRequest) -> LeaveGroupResponse {
    if !ctx.allowed_on_group(client, AclOperation::Read, &req.group_id) {
        return LeaveGroupResponse::default().with_error_code(GROUP_REFUSED.code());
    }
    let members = if client.version >= 3 {
        req.members
            .into_iter()
            .map(|m| LeavingMember {
                member_id: m.member_id.to_string(),
                group_instance_id: m.group_instance_id.map(|i| i.to_string()),
                reason: m.reason.map(|r| r.to_string()),
            })
            .collect()
    } else {
        vec![LeavingMember { member_id: req.member_id.to_string(), group_instance_id: None, reason: None }]
    };
    let result = ctx.groups.leave_group(&req.group_id, members).await;
    if client.version < 3 {
        // One member, no per-member results: its error is the response's.
        let error = result.error.or_else(|| result.members.first().and_then(|m| m.error));
        return LeaveGroupResponse::default().with_error_code(code(error));
    }
    let members = result
        .members
        .into_iter()
        .map(|m| {
            MemberResponse::default()
                .with_member_id(s(m.member_id))
                .with_group_instance_id(m.group_instance_id.map(s))
                .with_error_code(code(m.error))
        })
        .collect();
    LeaveGroupResponse::default().with_error_code(code(result.error)).with_members(members)
}

// ----- offsets -----------------------------------------------------------------------------

pub(crate) async fn offset_commit(ctx: &Ctx, client: &Client, req: OffsetCommitRequest) -> OffsetCommitResponse {
    let group_refused = !ctx.allowed_on_group(client, AclOperation::Read, &req.group_id);
    let mut offsets = Vec::new();
    // Partitions answered without the coordinator: the group or their topic is not allowed.
    let mut refused: Vec<(String, (i32, ResponseError))> = Vec::new();
    for topic in &req.topics {
        let topic_refused = !group_refused && !ctx.allowed_on_topic(client, AclOperation::Read, &topic.name);
        for p in &topic.partitions {
            if group_refused || topic_refused {
                let error = if group_refused { GROUP_REFUSED } else { ResponseError::TopicAuthorizationFailed };
                refused.push((topic.name.to_string(), (p.partition_index, error)));
                continue;
            }
            offsets.push(OffsetToCommit {
                topic: topic.name.to_string(),
                partition: p.partition_index,
                offset: p.committed_offset,
                // Leader epochs exist from v6.
                leader_epoch: if client.version >= 6 { committed_leader_epoch(p.committed_leader_epoch) } else { None },
                metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
            });
        }
    }
    let params = CommitParams {
        group_id: req.group_id.to_string(),
        generation_id: commit_generation(req.generation_id_or_member_epoch),
        member_id: req.member_id.to_string(),
        group_instance_id: req.group_instance_id.map(|i| i.to_string()),
        offsets,
    };
    let results = if params.offsets.is_empty() && !refused.is_empty() {
        Vec::new()
    } else {
        ctx.groups.commit_offsets(params).await
    };
    let answered = results.into_iter().map(|r| (r.topic, (r.partition, code(r.error))));
    let topics = topic_entries(
        answered.chain(refused.into_iter().map(|(topic, (index, error))| (topic, (index, error.code())))),
        |(index, error)| OffsetCommitResponsePartition::default().with_partition_index(index).with_error_code(error),
        |name, partitions| OffsetCommitResponseTopic::default().with_name(name).with_partitions(partitions),
    );
    OffsetCommitResponse::default().with_topics(topics)
}

pub(crate) async fn offset_fetch(ctx: &Ctx, client: &Client, req: OffsetFetchRequest) -> OffsetFetchResponse {
    let version = client.version;
    // v7+ (KIP-447): a read_committed consumer asks for stable offsets only.
    let require_stable = version >= 7 && req.require_stable;
    if version >= 8 {
        let mut groups = Vec::with_capacity(req.groups.len());
        for group in req.groups {
            let partitions = group
                .topics
                .map(|topics| requested_partitions(topics.into_iter().map(|t| (t.name, t.partition_indexes))));
            let response = OffsetFetchResponseGroup::default().with_group_id(group.group_id.clone());
            // v9 names the fetching member: a consumer-protocol member reads under its epoch.
            let member = group.member_id.as_deref().unwrap_or_default();
            if !ctx.allowed_on_group(client, AclOperation::Describe, &group.group_id) {
                groups.push(response.with_error_code(GROUP_REFUSED.code()));
                continue;
            }
            if let Err(error) = ctx.groups.validate_offset_fetch(&group.group_id, member, group.member_epoch) {
                groups.push(response.with_error_code(kafka_error(error).code()));
                continue;
            }
            groups.push(match ctx.groups.fetch_offsets(&group.group_id, partitions, require_stable).await {
                Ok(fetched) => response.with_topics(topic_entries(
                    described_only(ctx, client, fetched).into_iter().map(|f| (f.topic.clone(), f)),
                    partition_v8,
                    |name, partitions| OffsetFetchResponseTopics::default().with_name(name).with_partitions(partitions),
                )),
                Err(error) => response.with_error_code(kafka_error(error).code()),
            });
        }
        return OffsetFetchResponse::default().with_groups(groups);
    }
    let requested: Option<Vec<(String, i32)>> =
        req.topics.map(|topics| requested_partitions(topics.into_iter().map(|t| (t.name, t.partition_indexes))));
    if !ctx.allowed_on_group(client, AclOperation::Describe, &req.group_id) {
        // (v1 has no top-level error: it gets no offsets.)
        let code = if version >= 2 { GROUP_REFUSED.code() } else { 0 };
        return OffsetFetchResponse::default().with_error_code(code);
    }
    let fetched = match ctx.groups.fetch_offsets(&req.group_id, requested.clone(), require_stable).await {
        Ok(fetched) => fetched,
        Err(error) if version >= 2 => return OffsetFetchResponse::default().with_error_code(kafka_error(error).code()),
        // v1 has no top-level error: each requested partition carries it.
        Err(error) => requested
            .unwrap_or_default()
            .into_iter()
            .map(|(topic, partition)| FetchedOffset {
                topic,
                partition,
                offset: None,
                leader_epoch: None,
                metadata: String::new(),
                error: Some(error),
            })
            .collect(),
    };
    let topics = topic_entries(
        described_only(ctx, client, fetched).into_iter().map(|f| (f.topic.clone(), f)),
        |f| {
            let p = OffsetFetchResponsePartition::default()
                .with_partition_index(f.partition)
                .with_committed_offset(f.offset.unwrap_or(-1))
                .with_metadata(Some(s(f.metadata)))
                .with_error_code(code(f.error));
            // Leader epochs exist from v5.
            if version >= 5 {
                p.with_committed_leader_epoch(f.leader_epoch.unwrap_or(-1))
            } else {
                p
            }
        },
        |name, partitions| OffsetFetchResponseTopic::default().with_name(name).with_partitions(partitions),
    );
    OffsetFetchResponse::default().with_topics(topics)
}

/// The fetched offsets of topics the client may describe (Kafka leaves the others out).
fn described_only(ctx: &Ctx, client: &Client, fetched: Vec<FetchedOffset>) -> Vec<FetchedOffset> {
    if !ctx.broker.authorizer_enabled() {
        return fetched;
    }
    fetched.into_iter().filter(|f| ctx.allowed_on_topic(client, AclOperation::Describe, &f.topic)).collect()
}

fn partition_v8(f: FetchedOffset) -> OffsetFetchResponsePartitions {
    OffsetFetchResponsePartitions::default()
        .with_partition_index(f.partition)
        .with_committed_offset(f.offset.unwrap_or(-1))
        .with_committed_leader_epoch(f.leader_epoch.unwrap_or(-1))
        .with_metadata(Some(s(f.metadata)))
        .with_error_code(code(f.error))
}

pub(crate) async fn offset_delete(ctx: &Ctx, client: &Client, req: OffsetDeleteRequest) -> OffsetDeleteResponse {
    if !ctx.allowed_on_group(client, AclOperation::Delete, &req.group_id) {
        return OffsetDeleteResponse::default().with_error_code(GROUP_REFUSED.code());
    }
    if let Some(topic) = req.topics.iter().find(|t| !ctx.allowed_on_topic(client, AclOperation::Read, &t.name)) {
        tracing::debug!(topic = topic.name.as_str(), "OffsetDelete without READ on a topic");
        return OffsetDeleteResponse::default().with_error_code(ResponseError::TopicAuthorizationFailed.code());
    }
    let partitions: Vec<(String, i32)> =
        req.topics.iter().flat_map(|t| t.partitions.iter().map(|p| (t.name.to_string(), p.partition_index))).collect();
    match ctx.groups.delete_offsets(req.group_id.to_string(), partitions).await {
        Ok(results) => OffsetDeleteResponse::default().with_topics(topic_entries(
            results.into_iter().map(|r| (r.topic, (r.partition, r.error))),
            |(index, error)| {
                OffsetDeleteResponsePartition::default().with_partition_index(index).with_error_code(code(error))
            },
            |name, partitions| OffsetDeleteResponseTopic::default().with_name(name).with_partitions(partitions),
        )),
        Err(error) => OffsetDeleteResponse::default().with_error_code(kafka_error(error).code()),
    }
}

// ----- administration ----------------------------------------------------------------------

pub(crate) async fn list_groups(ctx: &Ctx, client: &Client, req: ListGroupsRequest) -> ListGroupsResponse {
    let states: Vec<GroupState> = req.states_filter.iter().filter_map(|name| GroupState::parse(name)).collect();
    // A filter naming only unknown states matches no group.
    if !req.states_filter.is_empty() && states.is_empty() {
        return ListGroupsResponse::default();
    }
    // v5 (KIP-848): GroupType "classic" or "consumer", ignoring case; an empty filter is all.
    let types: Vec<String> = req.types_filter.iter().map(|t| t.to_lowercase()).collect();
    match ctx.groups.list_groups(&states).await {
        Ok(groups) => {
            let all_visible = ctx.allowed_on_cluster(client, AclOperation::Describe);
            let groups = groups
                .into_iter()
                .filter(|g| types.is_empty() || types.iter().any(|t| t == g.group_type))
                .filter(|g| all_visible || ctx.allowed_on_group(client, AclOperation::Describe, &g.group_id))
                .map(|g| {
                    let mut listed = ListedGroup::default()
                        .with_group_id(GroupId(s(g.group_id)))
                        .with_protocol_type(s(g.protocol_type));
                    if client.version >= 4 {
                        listed = listed.with_group_state(s(g.state.as_str()));
                    }
                    if client.version >= 5 {
                        listed = listed.with_group_type(s(g.group_type));
                    }
                    listed
                })
                .collect();
            ListGroupsResponse::default().with_groups(groups)
        }
        Err(error) => ListGroupsResponse::default().with_error_code(kafka_error(error).code()),
    }
}

pub(crate) async fn describe_groups(ctx: &Ctx, client: &Client, req: DescribeGroupsRequest) -> DescribeGroupsResponse {
    let version = client.version;
    let ids: Vec<String> = req.groups.iter().map(|g| g.to_string()).collect();
    let wants_operations = version >= 3 && req.include_authorized_operations;
    let (ids, refused): (Vec<String>, Vec<String>) =
        ids.into_iter().partition(|id| ctx.allowed_on_group(client, AclOperation::Describe, id));
    let refused = refused.into_iter().map(|id| {
        DescribedGroup::default()
            .with_error_code(GROUP_REFUSED.code())
            .with_group_id(GroupId(s(id)))
            .with_authorized_operations(AUTHORIZED_OPERATIONS_OMITTED)
    });
    let groups = ctx
        .groups
        .describe_groups(&ids)
        .await
        .into_iter()
        .map(|g| {
            let authorized_operations = if wants_operations {
                super::authorized_operations::on_group(ctx, client, &g.group_id)
            } else {
                AUTHORIZED_OPERATIONS_OMITTED
            };
            let members = g
                .members
                .into_iter()
                .map(|m| {
                    DescribedGroupMember::default()
                        .with_member_id(s(m.member_id))
                        .with_group_instance_id(if version >= 4 { m.group_instance_id.map(s) } else { None })
                        .with_client_id(s(m.client_id))
                        .with_client_host(s(m.client_host))
                        .with_member_metadata(m.metadata)
                        .with_member_assignment(m.assignment)
                })
                .collect();
            DescribedGroup::default()
                .with_error_code(code(g.error))
                .with_group_id(GroupId(s(g.group_id)))
                .with_group_state(s(g.state.as_str()))
                .with_protocol_type(s(g.protocol_type))
                .with_protocol_data(s(g.protocol_data))
                .with_members(members)
                .with_authorized_operations(authorized_operations)
        })
        .chain(refused)
        .collect();
    DescribeGroupsResponse::default().with_groups(groups)
}

pub(crate) async fn delete_groups(ctx: &Ctx, client: &Client, req: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let ids: Vec<String> = req.groups_names.iter().map(|g| g.to_string()).collect();
    let (ids, refused): (Vec<String>, Vec<String>) =
        ids.into_iter().partition(|id| ctx.allowed_on_group(client, AclOperation::Delete, id));
    let refused = refused
        .into_iter()
        .map(|id| DeletableGroupResult::default().with_group_id(GroupId(s(id))).with_error_code(GROUP_REFUSED.code()));
    let results = ctx
        .groups
        .delete_groups(ids)
        .await
        .into_iter()
        .map(|(id, error)| DeletableGroupResult::default().with_group_id(GroupId(s(id))).with_error_code(code(error)))
        .chain(refused)
        .collect();
    DeleteGroupsResponse::default().with_results(results)
}

#[cfg(test)]
mod tests {
    //! Every handler at every advertised version: the response must encode at that version and
    //! decode back (a field set that the version lacks makes the encoder fail).
    use std::collections::BTreeMap;

    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::leave_group_request::MemberIdentity;
    use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
    use kafka_protocol::messages::offset_delete_request::{OffsetDeleteRequestPartition, OffsetDeleteRequestTopic};
    use kafka_protocol::messages::offset_fetch_request::{OffsetFetchRequestGroup, OffsetFetchRequestTopic};
    use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
    use kafka_protocol::protocol::{Decodable, Encodable};
    use weir_broker::{Broker, BrokerConfig, NewTopic};

    use super::*;

    fn round_trip<T: Encodable + Decodable>(response: &T, version: i16) -> T {
        let mut buf = BytesMut::new();
        response.encode(&mut buf, version).unwrap_or_else(|e| panic!("encode v{version}: {e}"));
        let mut bytes = buf.freeze();
        let decoded = T::decode(&mut bytes, version).unwrap_or_else(|e| panic!("decode v{version}: {e}"));
        assert!(bytes.is_empty(), "v{version}: trailing bytes");
        decoded
    }

    async fn context() -> (Ctx, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("weir-groups-handlers-{}", uuid::Uuid::new_v4()));
        let mut settings = BTreeMap::new();
        settings.insert("log.dirs".to_string(), dir.display().to_string());
        settings.insert("group.initial.rebalance.delay.ms".to_string(), "0".to_string());
        settings.insert("offsets.topic.num.partitions".to_string(), "2".to_string());
        let config = BrokerConfig::from_settings(&settings).unwrap();
        let broker = tokio::task::spawn_blocking(move || {
            let broker = Broker::open(config).unwrap();
            let topic = NewTopic {
                name: "t".into(),
                partitions: 2,
                replication_factor: -1,
                assignments: Vec::new(),
                configs: BTreeMap::new(),
            };
            broker.create_topics_blocking(vec![topic], false).pop().unwrap().unwrap();
            let groups = weir_coordinators::group::GroupCoordinator::start(broker.clone()).unwrap();
            let txns = weir_coordinators::txn::TxnCoordinator::start(broker.clone(), groups.clone()).unwrap();
            (broker, groups, txns)
        })
        .await
        .unwrap();
        (Ctx::new(broker.0, broker.1, broker.2), dir)
    }

    fn client(version: i16) -> Client {
        Client {
            version,
            client_id: "test-client".into(),
            host: "127.0.0.1".into(),
            connection: 1,
            listener: 0,
            principal: weir_security::acl::ANONYMOUS.into(),
            charge: None,
        }
    }

    fn join_request(group: &str, member_id: &str) -> JoinGroupRequest {
        JoinGroupRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_session_timeout_ms(10_000)
            .with_rebalance_timeout_ms(10_000)
            .with_member_id(s(member_id))
            .with_protocol_type(s("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(s("range"))
                .with_metadata(Bytes::from_static(b"\0\0\0\0\0\x01\0\x01t\xff\xff\xff\xff"))])
    }

    /// Joins (twice from v4: MEMBER_ID_REQUIRED first) and syncs at `version`s; returns the
    /// member id and generation.
    async fn join_and_sync(ctx: &Ctx, group: &str, join_version: i16, sync_version: i16) -> (String, i32) {
        let mut member_id = String::new();
        if join_version >= 4 {
            let first = join_group(ctx, &client(join_version), join_request(group, "")).await;
            let first = round_trip(&first, join_version);
            assert_eq!(first.error_code, ResponseError::MemberIdRequired.code());
            assert_eq!(first.generation_id, -1, "no generation yet");
            member_id = first.member_id.to_string();
        }
        let joined = join_group(ctx, &client(join_version), join_request(group, &member_id)).await;
        let joined = round_trip(&joined, join_version);
        assert_eq!(joined.error_code, 0, "join v{join_version}");
        assert_eq!(joined.leader, joined.member_id);
        assert_eq!(joined.members.len(), 1);
        assert_eq!(joined.protocol_name.as_ref().map(|n| n.to_string()), Some("range".to_string()));
        let member_id = joined.member_id.to_string();
        let sync = SyncGroupRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_generation_id(joined.generation_id)
            .with_member_id(s(member_id.clone()))
            .with_assignments(vec![SyncGroupRequestAssignment::default()
                .with_member_id(s(member_id.clone()))
                .with_assignment(Bytes::from_static(b"assignment"))]);
        let synced = round_trip(&sync_group(ctx, &client(sync_version), sync).await, sync_version);
        assert_eq!(synced.error_code, 0, "sync v{sync_version}");
        assert_eq!(synced.assignment, Bytes::from_static(b"assignment"));
        (member_id, joined.generation_id)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_group_api_answers_at_every_advertised_version() {
        let (ctx, dir) = context().await;

        for version in 0..=4 {
            let request = FindCoordinatorRequest::default().with_key(s("g")).with_coordinator_keys(if version >= 4 {
                vec![s("g"), s("h")]
            } else {
                Vec::new()
            });
            let response = round_trip(&find_coordinator(&ctx, &client(version), request).await, version);
            if version >= 4 {
                assert_eq!(response.coordinators.len(), 2);
                assert!(response.coordinators.iter().all(|c| c.error_code == 0 && c.port > 0));
            } else {
                assert_eq!(response.error_code, 0);
                assert_eq!(response.host.as_str(), ctx.broker.config.advertised_host);
            }
            let txn = FindCoordinatorRequest::default()
                .with_key(s("txn"))
                .with_key_type(1)
                .with_coordinator_keys(if version >= 4 { vec![s("txn")] } else { Vec::new() });
            if version >= 1 {
                let response = round_trip(&find_coordinator(&ctx, &client(version), txn).await, version);
                let error = if version >= 4 { response.coordinators[0].error_code } else { response.error_code };
                assert_eq!(error, 0, "this broker coordinates transactions too");
            }
        }

        for join_version in 0..=9i16 {
            let group = format!("group-v{join_version}");
            let sync_version = join_version.min(5);
            let (member_id, generation) = join_and_sync(&ctx, &group, join_version, sync_version).await;

            for version in 0..=4i16 {
                let request = HeartbeatRequest::default()
                    .with_group_id(GroupId(s(group.clone())))
                    .with_generation_id(generation)
                    .with_member_id(s(member_id.clone()));
                let response = round_trip(&heartbeat(&ctx, &client(version), request).await, version);
                assert_eq!(response.error_code, 0, "heartbeat v{version}");
            }

            let commit_version = join_version.clamp(2, 8);
            let commit = OffsetCommitRequest::default()
                .with_group_id(GroupId(s(group.clone())))
                .with_generation_id_or_member_epoch(generation)
                .with_member_id(s(member_id.clone()))
                .with_topics(vec![OffsetCommitRequestTopic::default().with_name(TopicName(s("t"))).with_partitions(
                    vec![
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(0)
                            .with_committed_offset(7)
                            .with_committed_leader_epoch(if commit_version >= 6 { 3 } else { -1 })
                            .with_committed_metadata(Some(s("meta"))),
                        OffsetCommitRequestPartition::default().with_partition_index(9).with_committed_offset(1),
                    ],
                )]);
            let response = round_trip(&offset_commit(&ctx, &client(commit_version), commit).await, commit_version);
            let errors: Vec<i16> = response.topics[0].partitions.iter().map(|p| p.error_code).collect();
            assert_eq!(errors, vec![0, ResponseError::UnknownTopicOrPartition.code()], "commit v{commit_version}");

            for version in 1..=8i16 {
                let response = if version >= 8 {
                    let request = OffsetFetchRequest::default().with_groups(vec![
                        OffsetFetchRequestGroup::default().with_group_id(GroupId(s(group.clone()))).with_topics(None),
                        OffsetFetchRequestGroup::default().with_group_id(GroupId(s("unknown"))).with_topics(None),
                    ]);
                    let response = round_trip(&offset_fetch(&ctx, &client(version), request).await, version);
                    assert_eq!(response.groups.len(), 2);
                    assert!(response.groups[1].topics.is_empty());
                    let p = &response.groups[0].topics[0].partitions[0];
                    (p.committed_offset, p.metadata.clone(), p.committed_leader_epoch)
                } else {
                    let request =
                        OffsetFetchRequest::default().with_group_id(GroupId(s(group.clone()))).with_topics(Some(vec![
                            OffsetFetchRequestTopic::default()
                                .with_name(TopicName(s("t")))
                                .with_partition_indexes(vec![0, 1]),
                        ]));
                    let response = round_trip(&offset_fetch(&ctx, &client(version), request).await, version);
                    let partitions = &response.topics[0].partitions;
                    assert_eq!(partitions[1].committed_offset, -1);
                    if version >= 5 {
                        assert_eq!(partitions[1].committed_leader_epoch, -1);
                    }
                    let p = &partitions[0];
                    (p.committed_offset, p.metadata.clone(), p.committed_leader_epoch)
                };
                assert_eq!(response.0, 7, "fetch v{version}");
                assert_eq!(response.1.as_ref().map(|m| m.to_string()), Some("meta".to_string()));
                if version >= 5 {
                    assert_eq!(response.2, if commit_version >= 6 { 3 } else { -1 });
                }
            }

            for version in 0..=4i16 {
                let request = ListGroupsRequest::default().with_states_filter(if version >= 4 {
                    vec![s("stable")]
                } else {
                    Vec::new()
                });
                let response = round_trip(&list_groups(&ctx, &client(version), request).await, version);
                let listed = response.groups.iter().find(|g| g.group_id.as_str() == group).expect("listed");
                assert_eq!(listed.protocol_type.as_str(), "consumer");
                if version >= 4 {
                    assert_eq!(listed.group_state.as_str(), "Stable");
                }
            }

            for version in 0..=5i16 {
                let request = DescribeGroupsRequest::default()
                    .with_groups(vec![GroupId(s(group.clone())), GroupId(s("unknown"))])
                    .with_include_authorized_operations(version >= 3);
                let response = round_trip(&describe_groups(&ctx, &client(version), request).await, version);
                let described = &response.groups[0];
                assert_eq!(described.group_state.as_str(), "Stable");
                assert_eq!(described.protocol_data.as_str(), "range");
                assert_eq!(described.members[0].client_host.as_str(), "/127.0.0.1");
                assert_eq!(described.members[0].member_assignment, Bytes::from_static(b"assignment"));
                assert_eq!(response.groups[1].group_state.as_str(), "Dead");
            }

            let delete = OffsetDeleteRequest::default().with_group_id(GroupId(s(group.clone()))).with_topics(vec![
                OffsetDeleteRequestTopic::default()
                    .with_name(TopicName(s("t")))
                    .with_partitions(vec![OffsetDeleteRequestPartition::default().with_partition_index(0)]),
            ]);
            let response = round_trip(&offset_delete(&ctx, &client(0), delete).await, 0);
            assert_eq!(response.error_code, 0);
            assert_eq!(
                response.topics[0].partitions[0].error_code,
                ResponseError::GroupSubscribedToTopic.code(),
                "the member subscribes to t"
            );

            let leave_version = join_version.min(5);
            let request = if leave_version >= 3 {
                LeaveGroupRequest::default()
                    .with_group_id(GroupId(s(group.clone())))
                    .with_members(vec![MemberIdentity::default().with_member_id(s(member_id.clone()))])
            } else {
                LeaveGroupRequest::default().with_group_id(GroupId(s(group.clone()))).with_member_id(s(member_id))
            };
            let response = round_trip(&leave_group(&ctx, &client(leave_version), request).await, leave_version);
            assert_eq!(response.error_code, 0);
            if leave_version >= 3 {
                assert_eq!(response.members[0].error_code, 0);
            }

            let delete_version = join_version.min(2);
            let request =
                DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s(group)), GroupId(s("unknown"))]);
            let response = round_trip(&delete_groups(&ctx, &client(delete_version), request).await, delete_version);
            let errors: Vec<i16> = response.results.iter().map(|r| r.error_code).collect();
            assert_eq!(errors, vec![0, ResponseError::GroupIdNotFound.code()]);
        }

        ctx.groups.shutdown();
        let broker = ctx.broker.clone();
        tokio::task::spawn_blocking(move || broker.shutdown()).await.unwrap().unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }
}
