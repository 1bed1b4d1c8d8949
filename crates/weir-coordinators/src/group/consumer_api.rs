//! The coordinator's entry points for the consumer group protocol (KIP-848):
//! ConsumerGroupHeartbeat, ConsumerGroupDescribe, and DescribeGroups of a consumer group. The
//! group's rules live in `consumer`; here are the coordinator checks (ownership, activity), the
//! topic catalog built from the cluster metadata, and the bridge to the classic group record
//! the group shares (committed offsets, ListGroups, deletion).
//!
//! Same concurrency contract as `coordinator`: every change runs under the `groups` mutex.
//! A change to a consumer group (members, epochs, assignments, its classic members' too) is
//! answered once the group's record in `__consumer_offsets` is durable, so a new coordinator
//! carries the group on where the old one left it (see `offsets`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedPartition;
use kafka_protocol::messages::{ConsumerProtocolAssignment, ConsumerProtocolSubscription, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};
use uuid::Uuid;
use weir_broker::metadata::MetadataState;
use weir_storage::sync::lock;

use super::assignor::TopicSpec;
use super::consumer::{compile_regex, Catalog, ConsumerGroup, TopicInfo};
use super::coordinator::{append_error_kind, GroupCoordinator};
use super::offsets;
use super::state::{decode_subscription, Group};
use super::{
    ConsumerGroupDescription, ConsumerHeartbeatParams, ConsumerHeartbeatResult, ErrorKind, GroupDescription,
    GroupState, HeartbeatParams, JoinGroupParams, JoinGroupResult, LeaveGroupResult, LeavingMember, MemberDescription,
    MemberLeaveResult, SyncGroupParams, SyncGroupResult,
};

/// The topics named in `names` or matched by one of `patterns` (internal topics only by name),
/// with their partitions' replica racks.
pub(super) fn catalog(metadata: &MetadataState, names: &BTreeSet<&str>, patterns: &BTreeSet<&str>) -> Catalog {
    let regexes: Vec<regex::Regex> = patterns.iter().filter_map(|p| compile_regex(p).ok()).collect();
    let racks: HashMap<i32, &str> =
        metadata.brokers.values().filter_map(|b| b.rack.as_deref().map(|r| (b.id, r))).collect();
    let mut out = Catalog::new();
    for (name, topic) in &metadata.topics {
        let named = names.contains(name.as_str());
        if !named && (topic.internal || !regexes.iter().any(|r| r.is_match(name))) {
            continue;
        }
        let partition_racks = if racks.is_empty() {
            Vec::new()
        } else {
            topic
                .assignments
                .iter()
                .map(|p| p.replicas.iter().filter_map(|b| racks.get(b).map(|r| r.to_string())).collect())
                .collect()
        };
        out.insert(
            topic.id,
            TopicInfo { name: name.clone(), spec: TopicSpec { partitions: topic.partitions, racks: partition_racks } },
        );
    }
    out
}

impl GroupCoordinator {
    /// ConsumerGroupHeartbeat: join, heartbeat, acknowledge revocations, leave. A heartbeat that
    /// changes the group is answered once the group's record is fsynced.
    pub async fn consumer_heartbeat(self: &Arc<Self>, params: ConsumerHeartbeatParams) -> ConsumerHeartbeatResult {
        if params.group_id.is_empty() {
            return ConsumerHeartbeatResult::error(ErrorKind::InvalidGroupId);
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.consumer_heartbeat_blocking(params))
            .await
            .unwrap_or_else(|_| ConsumerHeartbeatResult::error(ErrorKind::Internal))
    }

    fn consumer_heartbeat_blocking(&self, params: ConsumerHeartbeatParams) -> ConsumerHeartbeatResult {
        let target = match self.shard_of(&params.group_id) {
            Ok(target) => target,
            Err(kind) => return ConsumerHeartbeatResult::error(kind),
        };
        // Held through the append, so records of the group reach the log in state order.
        let _writer = lock(&target.writer);
        let metadata = self.broker.metadata();
        let limits = self.consumer_limits_of(&params.group_id);
        let (result, record) = {
            let mut groups = self.groups();
            if !self.is_active() {
                return ConsumerHeartbeatResult::error(ErrorKind::CoordinatorNotAvailable);
            }
            if let Err(kind) = self.check_coordinator(&params.group_id) {
                return ConsumerHeartbeatResult::error(kind);
            }
            if self.is_share_group(&params.group_id) {
                // Kafka: "Group X is not a consumer group."
                return ConsumerHeartbeatResult::error(ErrorKind::UnknownGroup);
            }
            let now = self.now_ms();
            match groups.get(&params.group_id) {
                Some(g) if g.state == GroupState::Dead => {
                    return ConsumerHeartbeatResult::error(ErrorKind::CoordinatorNotAvailable);
                }
                Some(g) if g.consumer.is_none() && g.has_members() && params.member_epoch != 0 => {
                    return ConsumerHeartbeatResult::error(ErrorKind::UnknownMember);
                }
                Some(g) if g.consumer.is_none() && g.has_members() => {}
                Some(g) if g.consumer.is_some() => {}
                _ if params.member_epoch != 0 => return ConsumerHeartbeatResult::error(ErrorKind::UnknownMember),
                _ => {}
            }
            let group =
                groups.entry(params.group_id.clone()).or_insert_with(|| Group::new(params.group_id.clone(), now));
            if group.consumer.is_none() && group.has_members() {
                // A running classic group converts when `group.consumer.migration.policy`
                // allows upgrades and the group is Stable; otherwise Kafka's GROUP_ID_NOT_FOUND
                // ("not a consumer group"), and the member retries.
                if !self.limits.migration.upgrades() {
                    return ConsumerHeartbeatResult::error(ErrorKind::UnknownGroup);
                }
                let Some((generation, seeds)) = group.take_members_for_migration() else {
                    return ConsumerHeartbeatResult::error(ErrorKind::UnknownGroup);
                };
                let names: BTreeSet<&str> = seeds
                    .iter()
                    .flat_map(|s| s.subscribed.iter().chain(s.assigned.iter().map(|(t, _)| t)).map(String::as_str))
                    .collect();
                let catalog = catalog(&metadata, &names, &BTreeSet::new());
                tracing::info!(group = %params.group_id, members = seeds.len(), generation, "converting a classic group to the consumer protocol");
                group.consumer = Some(ConsumerGroup::from_classic(generation, seeds, &catalog, now));
                group.protocol_name = None;
            }
            if group.consumer.is_none() {
                // A new group, or an empty classic group (with its committed offsets) that
                // becomes a consumer group.
                group.consumer = Some(ConsumerGroup::default());
                group.protocol_type = Some("consumer".to_string());
                group.protocol_name = None;
            }
            let result = match group.consumer.as_mut() {
                Some(consumer) => {
                    let (names, patterns) = consumer.subscriptions(&params);
                    let catalog = catalog(&metadata, &names, &patterns);
                    consumer.heartbeat(&params, &catalog, now, &limits)
                }
                None => ConsumerHeartbeatResult::error(ErrorKind::Internal),
            };
            group.sync_consumer_state(now);
            // A leave that left classic members only may turn the group classic again.
            group.downgrade_if_only_classic(now, &self.limits);
            let record = group.consumer.as_ref().and_then(|c| {
                let value = offsets::consumer_group_value(&c.snapshot());
                (c.persisted_value.as_ref() != Some(&value)).then_some(value)
            });
            let stored = group.consumer.as_ref().is_some_and(|c| c.persisted_value.is_some());
            if group.is_vacant() && !group.persisted && !stored {
                groups.remove(&params.group_id);
                (result, None)
            } else {
                (result, record)
            }
        };
        self.timer_wake.notify_one();
        let Some(value) = record else { return result };
        let entry = (offsets::consumer_group_key(&params.group_id), Some(value.clone()));
        if let Err(e) = self.append(&target, std::slice::from_ref(&entry)) {
            tracing::error!(group = %params.group_id, error = %e, "cannot store the consumer group record");
            return ConsumerHeartbeatResult::error(append_error_kind(&e, ErrorKind::Internal));
        }
        if let Some(consumer) = self.groups().get_mut(&params.group_id).and_then(|g| g.consumer.as_mut()) {
            consumer.persisted_value = Some(value);
        }
        result
    }

    /// Writes `group_id`'s consumer group record when the group changed since it was last
    /// written: what a classic member's JoinGroup, SyncGroup, Heartbeat or LeaveGroup changed in
    /// a consumer group, answered only once it is durable, as a consumer heartbeat's change is.
    /// The record holds the group's state as of when the shard's writer lock is held, so records
    /// reach the log in state order however callers race. Blocking.
    pub(super) fn store_consumer_record_blocking(&self, group_id: &str) -> Result<(), ErrorKind> {
        let target = self.shard_of(group_id)?;
        let _writer = lock(&target.writer);
        let value = {
            let groups = self.groups();
            let Some(consumer) = groups.get(group_id).and_then(|g| g.consumer.as_ref()) else { return Ok(()) };
            let value = offsets::consumer_group_value(&consumer.snapshot());
            if consumer.persisted_value.as_ref() == Some(&value) {
                return Ok(());
            }
            value
        };
        let entry = (offsets::consumer_group_key(group_id), Some(value.clone()));
        if let Err(e) = self.append(&target, std::slice::from_ref(&entry)) {
            tracing::error!(group = group_id, error = %e, "cannot store the consumer group record");
            return Err(append_error_kind(&e, ErrorKind::Internal));
        }
        if let Some(consumer) = self.groups().get_mut(group_id).and_then(|g| g.consumer.as_mut()) {
            consumer.persisted_value = Some(value);
        }
        Ok(())
    }

    /// [`Self::store_consumer_record_blocking`] off the async worker.
    pub(super) async fn store_consumer_record(self: &Arc<Self>, group_id: &str) -> Result<(), ErrorKind> {
        let this = self.clone();
        let group_id = group_id.to_string();
        tokio::task::spawn_blocking(move || this.store_consumer_record_blocking(&group_id))
            .await
            .unwrap_or(Err(ErrorKind::Internal))
    }

    /// ConsumerGroupDescribe, in request order: GROUP_ID_NOT_FOUND for a group that does not
    /// exist or is a classic group.
    pub async fn consumer_group_describe(&self, group_ids: &[String]) -> Vec<ConsumerGroupDescription> {
        let metadata = self.broker.metadata();
        let name_of = |id: Uuid| metadata.topic_by_id(id).map(|t| t.name.clone());
        let groups = self.groups();
        let active = self.is_active();
        group_ids
            .iter()
            .map(|id| {
                let error = |kind| ConsumerGroupDescription {
                    group_id: id.clone(),
                    error: Some(kind),
                    state: GroupState::Dead,
                    group_epoch: 0,
                    assignment_epoch: 0,
                    assignor_name: String::new(),
                    members: Vec::new(),
                };
                if !active {
                    return error(ErrorKind::CoordinatorNotAvailable);
                }
                if let Err(kind) = self.check_coordinator(id) {
                    return error(kind);
                }
                match groups.get(id).and_then(|g| g.consumer.as_ref()) {
                    Some(consumer) => consumer.describe(id, &name_of),
                    None => error(ErrorKind::UnknownGroup),
                }
            })
            .collect()
    }

    /// DescribeGroups of a consumer group, as Kafka answers it: protocol type "consumer", the
    /// consumer group's state, the assignor as protocol, and each member's subscription and
    /// assignment in the classic consumer protocol's encoding.
    pub(super) fn describe_consumer_as_classic(&self, group: &Group) -> GroupDescription {
        let metadata = self.broker.metadata();
        let name_of = |id: Uuid| metadata.topic_by_id(id).map(|t| t.name.clone());
        let Some(consumer) = group.consumer.as_ref() else { return group.describe() };
        let described = consumer.describe(&group.id, &name_of);
        let members = described
            .members
            .iter()
            .map(|m| MemberDescription {
                member_id: m.member_id.clone(),
                group_instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                metadata: encode_subscription(&m.subscribed_topic_names, m.rack_id.as_deref()),
                assignment: encode_assignment(&m.assignment),
            })
            .collect();
        GroupDescription {
            group_id: group.id.clone(),
            error: None,
            state: described.state,
            protocol_type: "consumer".to_string(),
            protocol_data: described.assignor_name.clone(),
            members,
            consumer: Some(described),
        }
    }
}

impl GroupCoordinator {
    /// JoinGroup of a classic member into a consumer group with members: answered at once (the
    /// broker assigns), with the member's epoch as generation.
    pub(super) fn classic_join_in_consumer_group(
        &self,
        group: &mut Group,
        params: JoinGroupParams,
        now: i64,
    ) -> JoinGroupResult {
        let member_id = if params.member_id.is_empty() {
            format!("{}-{}", params.group_instance_id.as_deref().unwrap_or(&params.client_id), Uuid::new_v4())
        } else {
            params.member_id.clone()
        };
        let decoded = params.protocols.first().and_then(|p| decode_subscription(&p.metadata));
        let Some((subscribed, owned_names)) = decoded.filter(|_| params.protocol_type == "consumer") else {
            return JoinGroupResult::error(params.member_id.clone(), ErrorKind::InconsistentGroupProtocol);
        };
        let limits = self.consumer_limits_of(&params.group_id);
        let Some(consumer) = group.consumer.as_mut() else {
            return JoinGroupResult::error(member_id, ErrorKind::Internal);
        };
        let metadata = self.broker.metadata();
        let (mut names, patterns) = consumer.subscribed_sets();
        names.extend(subscribed.iter().cloned());
        let names_ref: BTreeSet<&str> = names.iter().map(String::as_str).collect();
        let patterns_ref: BTreeSet<&str> = patterns.iter().map(String::as_str).collect();
        let catalog = catalog(&metadata, &names_ref, &patterns_ref);
        let mut owned: BTreeMap<Uuid, BTreeSet<i32>> = BTreeMap::new();
        for (topic, partitions) in owned_names {
            if let Some(t) = metadata.topic(&topic) {
                owned.entry(t.id).or_default().extend(partitions);
            }
        }
        let result = consumer.classic_join(&member_id, &params, subscribed, owned, &catalog, now, &limits);
        group.sync_consumer_state(now);
        match result {
            Ok((generation, protocol)) => JoinGroupResult {
                error: None,
                member_id,
                generation_id: Some(generation),
                protocol_type: Some("consumer".to_string()),
                protocol_name: Some(protocol),
                // Nobody leads: the broker assigns, so no member gets the member list.
                leader_id: String::new(),
                skip_assignment: false,
                members: Vec::new(),
            },
            Err(kind) => JoinGroupResult::error(member_id, kind),
        }
    }

    pub(super) fn classic_sync_in_consumer_group(
        &self,
        group: &mut Group,
        params: &SyncGroupParams,
    ) -> SyncGroupResult {
        let Some(consumer) = group.consumer.as_mut() else { return SyncGroupResult::error(ErrorKind::UnknownMember) };
        match consumer.classic_sync(&params.member_id, params.generation_id) {
            Ok(assignment) => {
                let metadata = self.broker.metadata();
                let named: Vec<(Uuid, String, Vec<i32>)> = assignment
                    .iter()
                    .filter_map(|(id, ps)| {
                        metadata.topic_by_id(*id).map(|t| (*id, t.name.clone(), ps.iter().copied().collect()))
                    })
                    .collect();
                SyncGroupResult {
                    error: None,
                    protocol_type: Some("consumer".to_string()),
                    protocol_name: params.protocol_name.clone(),
                    assignment: encode_assignment(&named),
                }
            }
            Err(kind) => SyncGroupResult::error(kind),
        }
    }

    pub(super) fn classic_heartbeat_in_consumer_group(
        &self,
        group: &mut Group,
        params: &HeartbeatParams,
        now: i64,
    ) -> Result<(), ErrorKind> {
        let consumer = group.consumer.as_mut().ok_or(ErrorKind::UnknownMember)?;
        let result = consumer.classic_heartbeat(&params.member_id, params.generation_id, now);
        group.sync_consumer_state(now);
        result
    }

    pub(super) fn classic_leave_in_consumer_group(
        &self,
        group: &mut Group,
        members: Vec<LeavingMember>,
        now: i64,
    ) -> LeaveGroupResult {
        let Some(consumer) = group.consumer.as_mut() else {
            return LeaveGroupResult { error: Some(ErrorKind::UnknownMember), members: Vec::new() };
        };
        let results = members
            .into_iter()
            .map(|m| MemberLeaveResult {
                error: consumer.classic_leave(&m.member_id).err(),
                member_id: m.member_id,
                group_instance_id: m.group_instance_id,
            })
            .collect();
        group.sync_consumer_state(now);
        LeaveGroupResult { error: None, members: results }
    }
}

/// A ConsumerProtocolSubscription (v3, with the rack), as a classic consumer would send it.
pub(super) fn encode_subscription(topics: &[String], rack: Option<&str>) -> Bytes {
    let version = 3;
    let subscription = ConsumerProtocolSubscription::default()
        .with_topics(topics.iter().map(|t| StrBytes::from_string(t.clone())).collect())
        .with_rack_id(rack.map(|r| StrBytes::from_string(r.to_string())));
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&i16::to_be_bytes(version));
    match subscription.encode(&mut buf, version) {
        Ok(()) => buf.freeze(),
        Err(_) => Bytes::new(),
    }
}

/// A ConsumerProtocolAssignment (v0), as a classic leader would send it.
fn encode_assignment(assignment: &[(Uuid, String, Vec<i32>)]) -> Bytes {
    let version = 0;
    let partitions = assignment
        .iter()
        .map(|(_, name, ps)| {
            AssignedPartition::default()
                .with_topic(TopicName(StrBytes::from_string(name.clone())))
                .with_partitions(ps.clone())
        })
        .collect();
    let assignment = ConsumerProtocolAssignment::default().with_assigned_partitions(partitions);
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&i16::to_be_bytes(version));
    match assignment.encode(&mut buf, version) {
        Ok(()) => buf.freeze(),
        Err(_) => Bytes::new(),
    }
}
