//! The coordinator's entry points for Kafka share groups (KIP-932): ShareGroupHeartbeat,
//! ShareGroupDescribe, and what ShareFetch, ListGroups, DeleteGroups and the share offset APIs
//! ask of a share group. The group's rules live in `share`; here are the coordinator checks
//! (ownership, activity), the group settings, and the one namespace with the other group types:
//! a group id names a classic, a consumer or a share group, never two at once (Kafka's rule), so
//! a member of another type is refused while the group has members (GROUP_ID_NOT_FOUND for
//! heartbeats, INCONSISTENT_GROUP_PROTOCOL for a classic JoinGroup).
//!
//! A share group and a RocketMQ group of the same name are one group: both consume through the
//! same invisible-time state in `weir-messaging`, keyed by the group name. RocketMQ consumers
//! never join, so they never conflict with a share group's members.
//!
//! Durability: a share group's membership (members, epochs, assignment) is one record in
//! `__consumer_offsets`, rewritten and fsynced by every heartbeat that changes it before the
//! answer (as a consumer group's is), and loaded with the partition: after a coordinator move or
//! a restart its members carry on at their epochs, each with a whole session from the load. What
//! they consumed is durable in the invisible-time state. A member whose session ran out is
//! dropped from the record at the group's next written change. An empty share group made by
//! AlterShareGroupOffsets gets its record at once.
//!
//! Concurrency: share groups are kept under their own mutex (`share_groups`). Lock order:
//! the shard's writer, `groups`, then `share_groups`; the shards are never asked with
//! `share_groups` held. Sessions run out lazily: every call that reads a group first drops its
//! expired members.

use std::collections::BTreeSet;
use std::sync::{Arc, MutexGuard};

use uuid::Uuid;
use weir_storage::sync::lock;

use super::consumer_api::catalog;
use super::coordinator::{append_error_kind, GroupCoordinator, OffsetsPartition};
use super::offsets;
use super::share::{ShareGroup, ShareGroupDescription, ShareHeartbeatParams, ShareHeartbeatResult, ShareLimits};
use super::state::Group;
use super::{ErrorKind, GroupDescription, GroupListing, GroupState, MemberDescription};

/// GroupType name of a share group (ListGroups v5, DescribeGroups v6).
pub const GROUP_TYPE_SHARE: &str = "share";

/// Whether a classic or consumer group is in use: it has members, or members joining.
pub(super) fn in_use(group: &Group) -> bool {
    group.has_members() || !matches!(group.state, GroupState::Empty | GroupState::Dead)
}

impl GroupCoordinator {
    pub(super) fn share_groups(&self) -> MutexGuard<'_, std::collections::HashMap<String, ShareGroup>> {
        lock(&self.share_groups)
    }

    /// The settings `group` obeys: its `share.*` configs over the broker's `group.share.*`.
    pub(super) fn share_limits(&self, group: &str) -> ShareLimits {
        let settings = self.broker.group_settings(group);
        let config = &self.broker.config;
        ShareLimits {
            session_timeout_ms: settings.share_session_timeout_ms.unwrap_or(config.group_share_session_timeout_ms),
            heartbeat_interval_ms: settings
                .share_heartbeat_interval_ms
                .unwrap_or(config.group_share_heartbeat_interval_ms),
            max_size: config.group_max_size,
        }
    }

    /// Whether `group_id` is a share group on this coordinator (with members or not).
    pub(super) fn is_share_group(&self, group_id: &str) -> bool {
        self.share_groups().contains_key(group_id)
    }

    /// ShareGroupHeartbeat: join (epoch 0), heartbeat, leave (epoch -1). A heartbeat that
    /// changes the group (its members, epochs or assignment) is answered once the group's
    /// record is fsynced, so a new coordinator carries the group on.
    pub async fn share_heartbeat(self: &Arc<Self>, params: ShareHeartbeatParams) -> ShareHeartbeatResult {
        if params.group_id.is_empty() {
            return ShareHeartbeatResult::error(ErrorKind::InvalidGroupId);
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.share_heartbeat_blocking(params))
            .await
            .unwrap_or_else(|_| ShareHeartbeatResult::error(ErrorKind::Internal))
    }

    fn share_heartbeat_blocking(&self, params: ShareHeartbeatParams) -> ShareHeartbeatResult {
        let target = match self.shard_of(&params.group_id) {
            Ok(target) => target,
            Err(kind) => return ShareHeartbeatResult::error(kind),
        };
        // Held through the append, so records of the group reach the log in state order.
        let _writer = lock(&target.writer);
        let limits = self.share_limits(&params.group_id);
        let metadata = self.broker.metadata();
        let (result, record) = {
            let groups = self.groups();
            if !self.is_active() {
                return ShareHeartbeatResult::error(ErrorKind::CoordinatorNotAvailable);
            }
            if let Err(kind) = self.check_coordinator(&params.group_id) {
                return ShareHeartbeatResult::error(kind);
            }
            if groups.get(&params.group_id).is_some_and(in_use) {
                // Kafka: "Group X is not a share group."
                return ShareHeartbeatResult::error(ErrorKind::UnknownGroup);
            }
            let mut shares = self.share_groups();
            let now = self.now_ms();
            if params.member_epoch != 0 && !shares.contains_key(&params.group_id) {
                return ShareHeartbeatResult::error(ErrorKind::UnknownMember);
            }
            let group = shares.entry(params.group_id.clone()).or_default();
            group.expire(now);
            let mut names: BTreeSet<String> = group.subscribed_names();
            names.extend(params.subscribed_topic_names.iter().flatten().cloned());
            let names_ref: BTreeSet<&str> = names.iter().map(String::as_str).collect();
            let catalog = catalog(&metadata, &names_ref, &BTreeSet::new());
            let result = group.heartbeat(&params, &catalog, now, &limits);
            if let Some(kind) = result.error {
                tracing::debug!(group = %params.group_id, member = %params.member_id, ?kind, "share heartbeat refused");
            }
            let value = offsets::share_group_value(&group.snapshot());
            (result, (group.persisted_value.as_ref() != Some(&value)).then_some(value))
        };
        let Some(value) = record else { return result };
        let entry = (offsets::share_group_key(&params.group_id), Some(value.clone()));
        if let Err(e) = self.append(&target, std::slice::from_ref(&entry)) {
            tracing::error!(group = %params.group_id, error = %e, "cannot store the share group record");
            return ShareHeartbeatResult::error(append_error_kind(&e, ErrorKind::Internal));
        }
        if let Some(group) = self.share_groups().get_mut(&params.group_id) {
            group.persisted_value = Some(value);
        }
        result
    }

    /// ShareGroupDescribe, in request order: GROUP_ID_NOT_FOUND for a group that is not a share
    /// group of this coordinator.
    pub async fn share_group_describe(&self, group_ids: &[String]) -> Vec<ShareGroupDescription> {
        self.describe_share_groups(group_ids)
    }

    fn describe_share_groups(&self, group_ids: &[String]) -> Vec<ShareGroupDescription> {
        let metadata = self.broker.metadata();
        let name_of = |id: Uuid| metadata.topic_by_id(id).map(|t| t.name.clone());
        let active = self.is_active();
        let now = self.now_ms();
        // Ownership first: `share_groups` is never held while the shards are asked.
        let owned: Vec<Result<(), ErrorKind>> = group_ids.iter().map(|id| self.check_coordinator(id)).collect();
        let mut shares = self.share_groups();
        group_ids
            .iter()
            .zip(owned)
            .map(|(id, owned)| {
                let error = |kind| ShareGroupDescription {
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
                if let Err(kind) = owned {
                    return error(kind);
                }
                match shares.get_mut(id) {
                    Some(group) => {
                        group.expire(now);
                        group.describe(id, &name_of)
                    }
                    None => error(ErrorKind::UnknownGroup),
                }
            })
            .collect()
    }

    /// Whether `member_id` is a live member of share group `group_id`; `None` when this broker
    /// does not coordinate the group (a fetch then trusts the member, as the partition's leader
    /// need not be its coordinator).
    pub fn share_member_known(&self, group_id: &str, member_id: &str) -> Option<bool> {
        if self.check_coordinator(group_id).is_err() {
            return None;
        }
        let now = self.now_ms();
        let mut shares = self.share_groups();
        Some(shares.get_mut(group_id).is_some_and(|g| {
            g.expire(now);
            g.has_member(member_id)
        }))
    }

    /// The state of share group `group_id` (`None`: not a share group here), its members
    /// dropped first when their sessions ran out.
    pub fn share_group_state(&self, group_id: &str) -> Option<GroupState> {
        let now = self.now_ms();
        let mut shares = self.share_groups();
        shares.get_mut(group_id).map(|g| {
            g.expire(now);
            g.state()
        })
    }

    /// Makes `group_id` a share group, with no members, unless it is one already or another
    /// group type uses the name (AlterShareGroupOffsets of a new group, as Kafka creates it).
    /// The new group's record is fsynced before this returns, so a coordinator move or a
    /// restart keeps it (and its settings' owner) even if no member ever joins.
    pub async fn ensure_share_group(self: &Arc<Self>, group_id: &str) -> Result<(), ErrorKind> {
        let (this, group_id) = (self.clone(), group_id.to_string());
        tokio::task::spawn_blocking(move || this.ensure_share_group_blocking(&group_id))
            .await
            .unwrap_or(Err(ErrorKind::Internal))
    }

    fn ensure_share_group_blocking(&self, group_id: &str) -> Result<(), ErrorKind> {
        let target = self.shard_of(group_id)?;
        // Held through the append, as a heartbeat's record is.
        let _writer = lock(&target.writer);
        let value = {
            let groups = self.groups();
            if !self.is_active() {
                return Err(ErrorKind::CoordinatorNotAvailable);
            }
            self.check_coordinator(group_id)?;
            if groups.get(group_id).is_some_and(in_use) {
                return Err(ErrorKind::UnknownGroup);
            }
            let mut shares = self.share_groups();
            let group = shares.entry(group_id.to_string()).or_default();
            let value = offsets::share_group_value(&group.snapshot());
            if group.persisted_value.as_ref() == Some(&value) {
                return Ok(());
            }
            value
        };
        if let Err(e) = self.append(&target, &[(offsets::share_group_key(group_id), Some(value.clone()))]) {
            tracing::error!(group = group_id, error = %e, "cannot store the share group record");
            return Err(append_error_kind(&e, ErrorKind::Internal));
        }
        if let Some(group) = self.share_groups().get_mut(group_id) {
            group.persisted_value = Some(value);
        }
        Ok(())
    }

    /// The share groups of ListGroups, filtered by state.
    pub(super) fn list_share_groups(&self, states: &[GroupState]) -> Vec<GroupListing> {
        let now = self.now_ms();
        let mut shares = self.share_groups();
        shares
            .iter_mut()
            .filter_map(|(id, g)| {
                g.expire(now);
                let state = g.state();
                (states.is_empty() || states.contains(&state)).then(|| GroupListing {
                    group_id: id.clone(),
                    protocol_type: "share".to_string(),
                    state,
                    group_type: GROUP_TYPE_SHARE,
                })
            })
            .collect()
    }

    /// DeleteGroups of a share group: `None` when `group_id` is no share group here, else
    /// NON_EMPTY_GROUP while it has members; its record is deleted (a tombstone, fsynced) before
    /// the group is. Its invisible-time state is the messaging layer's.
    pub(super) fn delete_share_group(
        &self,
        target: &OffsetsPartition,
        group_id: &str,
    ) -> Option<Result<(), ErrorKind>> {
        let _writer = lock(&target.writer);
        let now = self.now_ms();
        let persisted = {
            let mut shares = self.share_groups();
            let group = shares.get_mut(group_id)?;
            group.expire(now);
            if !group.is_empty() {
                return Some(Err(ErrorKind::GroupNotEmpty));
            }
            group.persisted_value.is_some()
        };
        if persisted {
            if let Err(e) = self.append(target, &[(offsets::share_group_key(group_id), None)]) {
                tracing::error!(group = group_id, error = %e, "cannot delete the share group record");
                return Some(Err(append_error_kind(&e, ErrorKind::Internal)));
            }
        }
        self.share_groups().remove(group_id);
        Some(Ok(()))
    }

    /// DescribeGroups of a share group: protocol type "share", the simple assignor as protocol,
    /// each member with its client (no classic metadata or assignment).
    pub(super) fn describe_share_as_classic(&self, group_id: &str) -> Option<GroupDescription> {
        let described = self.describe_share_groups(&[group_id.to_string()]);
        let described = described.into_iter().next().filter(|d| d.error.is_none())?;
        Some(GroupDescription {
            group_id: group_id.to_string(),
            error: None,
            state: described.state,
            protocol_type: "share".to_string(),
            protocol_data: described.assignor_name,
            members: described
                .members
                .into_iter()
                .map(|m| MemberDescription {
                    member_id: m.member_id,
                    group_instance_id: None,
                    client_id: m.client_id,
                    client_host: m.client_host,
                    metadata: bytes::Bytes::new(),
                    assignment: bytes::Bytes::new(),
                })
                .collect(),
            consumer: None,
        })
    }

    /// Every share group's id, members and assignment (for the admin API).
    pub fn share_group_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.share_groups().keys().cloned().collect();
        ids.sort();
        ids
    }
}
