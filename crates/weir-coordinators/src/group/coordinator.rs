//! The group coordinator: every classic group of this broker, their committed offsets, and the
//! timers that drive them.
//!
//! Concurrency contract:
//! - `groups` (one mutex over every group) guards all group state. It is held only for
//!   in-memory work, never across I/O or an `.await`.
//! - Each `__consumer_offsets` partition has a writer mutex. Whatever appends to a partition
//!   (commits, the group record of a completed rebalance, deletions, offset expiry) holds it
//!   from validating against the group state, through the fsynced append, to applying the
//!   result to the cache. So the cache changes in log order, and a validation cannot be
//!   overtaken by another append to the same group. Lock order: writer, then `groups`.
//! - The coordinator holds the groups of the `__consumer_offsets` partitions this broker leads
//!   (its shards, see `coordinator_shards`); a request for a group of another partition is
//!   answered NOT_COORDINATOR, one of a partition still loading COORDINATOR_LOAD_IN_PROGRESS.
//!   Ownership is checked with `groups` held, and a lost shard's groups are removed under it,
//!   so no group outlives its shard. Lock order when both are held: `groups`, then the shards.
//! - JoinGroup and SyncGroup replies travel through one-shot channels held by the members
//!   (see `state`); shutdown answers every one of them, so no request waits forever.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{oneshot, watch, Notify};

use crate::shards::{self, ShardOwner, Shards};
use weir_broker::broker::Broker;
use weir_broker::error::BrokerError;
use weir_broker::internal_records::encode_batch;
use weir_broker::partition::Partition;
use weir_storage::sync::lock;

use super::consumer::{ConsumerGroup, ConsumerLimits};
use super::offsets::{self, LoadedGroup};
use super::state::{CommittedOffset, Group, Limits, SyncOutcome};
use super::{
    partition_for, CommitParams, ErrorKind, FetchedOffset, GroupDescription, GroupListing, GroupOffsets, GroupState,
    HeartbeatParams, JoinGroupParams, JoinGroupResult, LeaveGroupResult, LeavingMember, MemberLeaveResult,
    PartitionResult, SyncGroupParams, SyncGroupResult, OFFSETS_TOPIC, OFFSET_METADATA_MAX_BYTES,
};

/// Longest sleep of the timer task: it re-checks its deadlines (and whether the coordinator
/// still exists) at least this often.
const TIMER_TICK_MAX_MS: i64 = 1000;
/// Bytes of records per batch appended to `__consumer_offsets`, well under the topic's
/// `max.message.bytes` (1 MiB by default); a larger commit becomes several batches of one append.
const BATCH_BYTES_MAX: usize = 256 * 1024;

pub struct OffsetsPartition {
    partition: Arc<Partition>,
    /// Held across validate → append → apply (see the module doc).
    pub(super) writer: Mutex<()>,
}

pub struct GroupCoordinator {
    pub(super) broker: Arc<Broker>,
    pub(super) limits: Limits,
    /// The consumer protocol's settings (KIP-848).
    pub(super) consumer_limits: ConsumerLimits,
    session_timeout_ms_min: i32,
    session_timeout_ms_max: i32,
    offsets_retention_ms: i64,
    offsets_retention_check_interval_ms: i64,
    groups: Mutex<HashMap<String, Group>>,
    /// Kafka share groups (KIP-932), in memory (see `share_api`). Lock order: `groups` first.
    pub(super) share_groups: Mutex<HashMap<String, super::share::ShareGroup>>,
    /// Partitions whose offsets an open transaction is about to commit (RequireStable).
    unstable: super::unstable::UnstableOffsets,
    /// The `__consumer_offsets` partitions this broker coordinates.
    shards: Shards<OffsetsPartition>,
    /// Wakes the timer task when a deadline may have moved earlier.
    pub(super) timer_wake: Arc<Notify>,
    shut_down: AtomicBool,
    /// The groups' consumers that receive by invisible time and talk to this broker.
    pub clients: super::clients::ConnectedClients,
}

/// The offsets of `known` (indexes into `params.offsets`) as they are stored, with the time of
/// the commit; one whose metadata is too large is refused in `results` instead.
fn offsets_to_store(
    params: &CommitParams,
    known: &[usize],
    now: i64,
    results: &mut [PartitionResult],
) -> Vec<(usize, CommittedOffset)> {
    let mut stored = Vec::with_capacity(known.len());
    for &i in known {
        let o = &params.offsets[i];
        let metadata = o.metadata.clone().unwrap_or_default();
        if metadata.len() > OFFSET_METADATA_MAX_BYTES {
            results[i].error = Some(ErrorKind::OffsetMetadataTooLarge);
            continue;
        }
        let committed =
            CommittedOffset { offset: o.offset, leader_epoch: o.leader_epoch, metadata, commit_timestamp_ms: now };
        stored.push((i, committed));
    }
    stored
}

/// The error a client sees when an append to `__consumer_offsets` fails (Kafka's mapping:
/// retriable coordinator errors for storage trouble, so clients retry or rediscover).
pub(super) fn append_error_kind(e: &BrokerError, too_large: ErrorKind) -> ErrorKind {
    match e.kind {
        ErrorKind::UnknownTopicOrPartition | ErrorKind::NotEnoughReplicas | ErrorKind::NotEnoughReplicasAfterAppend => {
            ErrorKind::CoordinatorNotAvailable
        }
        ErrorKind::NotLeader | ErrorKind::Storage => ErrorKind::NotCoordinator,
        ErrorKind::TooLarge => too_large,
        other => other,
    }
}

/// The configs `__consumer_offsets` is created with.
fn offsets_topic_configs() -> BTreeMap<String, String> {
    [("cleanup.policy", "compact"), ("segment.bytes", "104857600")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Creates `__consumer_offsets` unless it exists (through the controller, like any topic).
async fn ensure_offsets_topic(broker: &Arc<Broker>) -> Result<(), BrokerError> {
    let wanted = broker.config.offsets_topic_partitions;
    let topic = broker.ensure_internal_topic(OFFSETS_TOPIC, wanted, offsets_topic_configs()).await?;
    if topic.partitions != wanted {
        tracing::warn!(
            existing = topic.partitions,
            configured = wanted,
            "{OFFSETS_TOPIC} exists with a different partition count than offsets.topic.num.partitions; keeping the existing one"
        );
    }
    Ok(())
}

fn ensure_offsets_topic_blocking(broker: &Arc<Broker>) -> Result<(), BrokerError> {
    weir_broker::runtime::block_on(ensure_offsets_topic(broker))?
}

impl ShardOwner for GroupCoordinator {
    type Shard = OffsetsPartition;

    fn shards(&self) -> &Shards<OffsetsPartition> {
        &self.shards
    }

    fn load_shard(&self, index: i32, partition: Arc<Partition>) -> Result<OffsetsPartition, BrokerError> {
        let started = std::time::Instant::now();
        let mut loaded: HashMap<String, LoadedGroup> = HashMap::new();
        let records = offsets::load_partition(&self.broker, &partition, &mut loaded)?;
        let count = loaded.len();
        let now = self.now_ms();
        let mut groups = self.groups();
        for (id, mut group) in loaded {
            if let Some((snapshot, value)) = group.share.take() {
                // A share group carries on with its members and epochs (lock order: `groups`
                // first, held here).
                let session_ms = self.share_limits(&id).session_timeout_ms;
                let share = super::share::ShareGroup::from_snapshot(snapshot, value, now, session_ms);
                self.share_groups().insert(id.clone(), share);
            }
            // Open transactions' offsets stay unstable here as they were at the predecessor.
            for (producer_id, note) in group.transaction_offsets.drain() {
                if note.expires_ms > now {
                    self.unstable.restore(producer_id, &id, note.partitions, note.expires_ms);
                }
            }
            if !group.has_group_state() {
                continue;
            }
            let consumer = group.consumer.take();
            let mut group = Group::from_loaded(id.clone(), group);
            if let Some(snapshot) = consumer {
                // A consumer-protocol group carries on with its members, epochs and assignment.
                let value = offsets::consumer_group_value(&snapshot);
                group.consumer =
                    Some(ConsumerGroup::from_snapshot(snapshot, value, now, &self.consumer_limits_of(&id)));
                group.protocol_type = Some("consumer".to_string());
                group.sync_consumer_state(now);
            }
            groups.insert(id, group);
        }
        drop(groups);
        tracing::debug!(
            partition = index,
            groups = count,
            records,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "loaded a partition of {OFFSETS_TOPIC}"
        );
        self.timer_wake.notify_one();
        Ok(OffsetsPartition { partition, writer: Mutex::new(()) })
    }

    fn unload_shard(&self, index: i32) {
        let count = self.partition_count();
        self.unstable.forget_groups(|id| count == 0 || partition_for(id, count) == index);
        let mut groups = self.groups();
        self.share_groups().retain(|id, _| count != 0 && partition_for(id, count) != index);
        groups.retain(|id, group| {
            let keep = count == 0 || partition_for(id, count) != index;
            if !keep {
                group.fail_waiters(ErrorKind::NotCoordinator);
            }
            keep
        });
    }
}

impl GroupCoordinator {
    /// The limits a consumer-protocol `group` obeys: its `consumer.*` group configs over the
    /// broker's `group.consumer.*` settings.
    pub(super) fn consumer_limits_of(&self, group: &str) -> ConsumerLimits {
        let settings = self.broker.group_settings(group);
        let mut limits = self.consumer_limits.clone();
        if let Some(ms) = settings.consumer_session_timeout_ms {
            limits.session_timeout_ms = ms;
        }
        if let Some(ms) = settings.consumer_heartbeat_interval_ms {
            limits.heartbeat_interval_ms = ms;
        }
        limits
    }

    /// Starts the coordinator: loads the groups of every `__consumer_offsets` partition this
    /// broker leads, and starts the timer task and the task that follows leadership changes.
    /// On a single node it first creates the topic, as it always did; in a cluster the first
    /// FindCoordinator does (see [`GroupCoordinator::coordinator_partition`]), so its
    /// partitions spread over the brokers that are up by then. Blocking (it reads the
    /// partitions); call it from within a tokio runtime, e.g. in `spawn_blocking` or before
    /// serving.
    pub fn start(broker: Arc<Broker>) -> Result<Arc<GroupCoordinator>, BrokerError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            BrokerError::new(ErrorKind::Internal, "GroupCoordinator::start must run within a tokio runtime")
        })?;
        if !broker.config.is_cluster() {
            ensure_offsets_topic_blocking(&broker)?;
        }
        let config = &broker.config;
        let coordinator = Arc::new(GroupCoordinator {
            limits: Limits {
                initial_rebalance_delay_ms: i64::try_from(config.group_initial_rebalance_delay_ms).unwrap_or(i64::MAX),
                max_size: config.group_max_size,
                migration: config.group_consumer_migration_policy,
            },
            consumer_limits: ConsumerLimits {
                session_timeout_ms: config.group_consumer_session_timeout_ms,
                heartbeat_interval_ms: config.group_consumer_heartbeat_interval_ms,
                max_size: config.group_max_size,
                assignors: config.group_consumer_assignors.clone(),
            },
            session_timeout_ms_min: config.group_min_session_timeout_ms,
            session_timeout_ms_max: config.group_max_session_timeout_ms,
            offsets_retention_ms: config.offsets_retention_ms,
            offsets_retention_check_interval_ms: i64::try_from(config.offsets_retention_check_interval_ms)
                .unwrap_or(i64::MAX),
            groups: Mutex::new(HashMap::new()),
            share_groups: Mutex::new(HashMap::new()),
            unstable: Default::default(),
            shards: Shards::new(OFFSETS_TOPIC),
            timer_wake: Arc::new(Notify::new()),
            shut_down: AtomicBool::new(false),
            clients: Default::default(),
            broker,
        });
        let started = std::time::Instant::now();
        if !shards::reconcile_blocking(&coordinator.broker, &*coordinator) {
            return Err(BrokerError::new(
                ErrorKind::Storage,
                format!("cannot load the consumer groups of {OFFSETS_TOPIC} (see the log)"),
            ));
        }
        let (groups, offsets) = {
            let groups = coordinator.groups();
            (groups.len(), groups.values().map(|g| g.offsets.len()).sum::<usize>())
        };
        tracing::info!(
            groups,
            offsets,
            partitions = coordinator.shards.loaded().len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "loaded consumer groups from {OFFSETS_TOPIC}"
        );
        let _guard = runtime.enter();
        shards::spawn_watcher(&coordinator.broker, Arc::downgrade(&coordinator));
        runtime.spawn(run_timers(
            Arc::downgrade(&coordinator),
            coordinator.timer_wake.clone(),
            coordinator.broker.shutdown_signal(),
        ));
        Ok(coordinator)
    }

    /// Stops the timers and answers every waiting JoinGroup/SyncGroup with
    /// COORDINATOR_NOT_AVAILABLE; later requests get the same. Committed offsets are already
    /// durable, so nothing needs flushing.
    pub fn shutdown(&self) {
        // The flag first: a request that takes the lock after the drain below sees it.
        if self.shut_down.swap(true, Ordering::SeqCst) {
            return; // already stopped (the timer task also stops it on broker shutdown)
        }
        let mut groups = self.groups();
        for group in groups.values_mut() {
            group.fail_waiters(ErrorKind::CoordinatorNotAvailable);
        }
        drop(groups);
        self.timer_wake.notify_one();
        tracing::info!("group coordinator stopped");
    }

    pub(super) fn groups(&self) -> Groups<'_> {
        Groups(lock(&self.groups))
    }

    pub(super) fn is_active(&self) -> bool {
        !self.shut_down.load(Ordering::SeqCst) && !self.broker.is_shutting_down()
    }

    pub(super) fn now_ms(&self) -> i64 {
        self.broker.now_ms()
    }

    /// Partitions of `__consumer_offsets`: 0 before it exists.
    fn partition_count(&self) -> i32 {
        self.broker.metadata().topic(OFFSETS_TOPIC).map_or(0, |t| t.partitions)
    }

    /// The shard holding `group_id`, if this broker coordinates the group; else the error its
    /// client gets (it then looks for the coordinator again, or retries).
    pub(super) fn shard_of(&self, group_id: &str) -> Result<Arc<OffsetsPartition>, ErrorKind> {
        let count = self.partition_count();
        if count == 0 {
            return Err(ErrorKind::CoordinatorNotAvailable);
        }
        self.shards.get(partition_for(group_id, count)).map_err(|e| e.kind)
    }

    /// Checks that this broker coordinates `group_id` (with `groups` held, see the module doc).
    pub(super) fn check_coordinator(&self, group_id: &str) -> Result<(), ErrorKind> {
        self.shard_of(group_id).map(|_| ())
    }

    /// The `__consumer_offsets` partition holding `group_id`: of the topic as it is, or as it
    /// will be created (`offsets.topic.num.partitions`).
    pub fn partition_for(&self, group_id: &str) -> i32 {
        let count = self.partition_count();
        partition_for(group_id, if count > 0 { count } else { self.broker.config.offsets_topic_partitions.max(1) })
    }

    /// FindCoordinator's part: creates `__consumer_offsets` when it does not exist yet (Kafka
    /// does so on the first FindCoordinator too), then names the partition whose leader is the
    /// group's coordinator.
    pub async fn coordinator_partition(&self, group_id: &str) -> Result<i32, BrokerError> {
        if self.partition_count() == 0 {
            ensure_offsets_topic(&self.broker).await?;
        }
        Ok(self.partition_for(group_id))
    }

    fn validate_session_timeout(&self, session_timeout_ms: i32) -> bool {
        (self.session_timeout_ms_min..=self.session_timeout_ms_max).contains(&session_timeout_ms)
    }

    /// Appends `entries` to the group's partition and waits for the fsync. The caller holds the
    /// partition's writer lock.
    pub(super) fn append(
        &self,
        target: &OffsetsPartition,
        entries: &[(Bytes, Option<Bytes>)],
    ) -> Result<(), BrokerError> {
        let now = self.now_ms();
        let mut records = bytes::BytesMut::new();
        let mut chunk_start = 0;
        let mut chunk_bytes = 0;
        for (i, (key, value)) in entries.iter().enumerate() {
            let size = key.len() + value.as_ref().map_or(0, Bytes::len) + 32;
            if chunk_bytes + size > BATCH_BYTES_MAX && i > chunk_start {
                records.unsplit(encode_batch(&entries[chunk_start..i], now));
                chunk_start = i;
                chunk_bytes = 0;
            }
            chunk_bytes += size;
        }
        if chunk_start < entries.len() {
            records.unsplit(encode_batch(&entries[chunk_start..], now));
        }
        if records.is_empty() {
            return Err(BrokerError::new(ErrorKind::Internal, "cannot encode group records"));
        }
        self.broker.append_internal_blocking(&target.partition, records).map(|_| ())
    }

    // ----- membership ---------------------------------------------------------------------

    /// JoinGroup: returns when the join phase completes (or at once with an error, a
    /// MEMBER_ID_REQUIRED, or the current generation for a member that changed nothing).
    pub async fn join_group(self: &Arc<Self>, params: JoinGroupParams) -> JoinGroupResult {
        let member_id = params.member_id.clone();
        if params.group_id.is_empty() {
            return JoinGroupResult::error(member_id, ErrorKind::InvalidGroupId);
        }
        if !self.validate_session_timeout(params.session_timeout_ms) {
            return JoinGroupResult::error(member_id, ErrorKind::InvalidSessionTimeout);
        }
        let (reply, answer) = oneshot::channel();
        let in_consumer_group = 'join: {
            let mut groups = self.groups();
            if !self.is_active() {
                return JoinGroupResult::error(member_id, ErrorKind::CoordinatorNotAvailable);
            }
            if let Err(kind) = self.check_coordinator(&params.group_id) {
                return JoinGroupResult::error(member_id, kind);
            }
            let now = self.now_ms();
            let group_id = params.group_id.clone();
            if self.is_share_group(&group_id) {
                // A share group's name: Kafka refuses a member of another group type.
                return JoinGroupResult::error(member_id, ErrorKind::InconsistentGroupProtocol);
            }
            if let Some(group) =
                groups.get_mut(&group_id).filter(|g| g.consumer.as_ref().is_some_and(|c| !c.is_empty()))
            {
                // A classic member of a consumer group (one converted from classic).
                break 'join Some((group_id, self.classic_join_in_consumer_group(group, params, now)));
            }
            if !groups.contains_key(&group_id) {
                if !member_id.is_empty() {
                    return JoinGroupResult::error(member_id, ErrorKind::UnknownMember);
                }
                groups.insert(group_id.clone(), Group::new(group_id.clone(), now));
            }
            if let Some(group) = groups.get_mut(&group_id) {
                group.join(params, reply, now, &self.limits);
                if group.is_vacant() && !group.persisted {
                    groups.remove(&group_id);
                }
            }
            None
        };
        self.timer_wake.notify_one();
        if let Some((group_id, result)) = in_consumer_group {
            if result.error.is_none() {
                if let Err(kind) = self.store_consumer_record(&group_id).await {
                    return JoinGroupResult::error(result.member_id, kind);
                }
            }
            return result;
        }
        answer.await.unwrap_or_else(|_| JoinGroupResult::error(member_id, ErrorKind::CoordinatorNotAvailable))
    }

    /// SyncGroup: a follower's reply waits for the leader's; the leader's assignment is handed
    /// out once the group record is durable.
    pub async fn sync_group(self: &Arc<Self>, params: SyncGroupParams) -> SyncGroupResult {
        if params.group_id.is_empty() {
            return SyncGroupResult::error(ErrorKind::InvalidGroupId);
        }
        let group_id = params.group_id.clone();
        let (reply, answer) = oneshot::channel();
        let outcome = {
            let mut groups = self.groups();
            if !self.is_active() {
                return SyncGroupResult::error(ErrorKind::CoordinatorNotAvailable);
            }
            if let Err(kind) = self.check_coordinator(&group_id) {
                return SyncGroupResult::error(kind);
            }
            let now = self.now_ms();
            match groups.get_mut(&group_id) {
                None => return SyncGroupResult::error(ErrorKind::UnknownMember),
                Some(group) if group.consumer.as_ref().is_some_and(|c| !c.is_empty()) => {
                    Err(self.classic_sync_in_consumer_group(group, &params))
                }
                Some(group) => Ok(group.sync(params, reply, now)),
            }
        };
        // A classic member's sync in a consumer group is answered here, once durable.
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(result) if result.error.is_none() => {
                if let Err(kind) = self.store_consumer_record(&group_id).await {
                    return SyncGroupResult::error(kind);
                }
                return result;
            }
            Err(result) => return result,
        };
        if let SyncOutcome::Store { generation, assignments } = outcome {
            // Detached: the store completes (and the followers get their assignment) even if
            // the leader's connection goes away meanwhile.
            let this = self.clone();
            let id = group_id.clone();
            tokio::task::spawn_blocking(move || this.store_group_blocking(&id, generation, assignments));
        }
        self.timer_wake.notify_one();
        answer.await.unwrap_or_else(|_| SyncGroupResult::error(ErrorKind::CoordinatorNotAvailable))
    }

    fn store_group_blocking(&self, group_id: &str, generation: i32, assignments: HashMap<String, Bytes>) {
        let target = match self.shard_of(group_id) {
            Ok(target) => target,
            Err(kind) => {
                // The shard was lost meanwhile; its unload answered the members already, unless
                // the group is still here.
                if let Some(group) = self.groups().get_mut(group_id) {
                    group.complete_sync(generation, &assignments, Err(kind), self.now_ms(), &self.limits);
                }
                return;
            }
        };
        let _writer = lock(&target.writer);
        let now = self.now_ms();
        let (record, stale_consumer_record) = {
            let groups = self.groups();
            match groups.get(group_id) {
                Some(g) if g.state == GroupState::CompletingRebalance && g.generation == generation => {
                    (g.record(now), g.stale_consumer_record)
                }
                // Moved on meanwhile; its members were told (REBALANCE_IN_PROGRESS).
                _ => return,
            }
        };
        let mut entries = vec![(offsets::group_key(group_id), Some(offsets::group_value(&record)))];
        if stale_consumer_record {
            entries.push((offsets::consumer_group_key(group_id), None));
        }
        let stored = self.append(&target, &entries).map_err(|e| {
            tracing::error!(group = group_id, error = %e, "cannot store the group record");
            append_error_kind(&e, ErrorKind::Internal)
        });
        let mut groups = self.groups();
        if let Some(group) = groups.get_mut(group_id) {
            if stored.is_ok() && stale_consumer_record {
                group.stale_consumer_record = false;
            }
            group.complete_sync(generation, &assignments, stored, self.now_ms(), &self.limits);
        }
        drop(groups);
        self.timer_wake.notify_one();
    }

    pub async fn heartbeat(self: &Arc<Self>, params: HeartbeatParams) -> Result<(), ErrorKind> {
        if params.group_id.is_empty() {
            return Err(ErrorKind::InvalidGroupId);
        }
        let result = {
            let mut groups = self.groups();
            if !self.is_active() {
                return Err(ErrorKind::CoordinatorNotAvailable);
            }
            self.check_coordinator(&params.group_id)?;
            let now = self.now_ms();
            match groups.get_mut(&params.group_id) {
                None => return Err(ErrorKind::UnknownMember),
                Some(group) if group.consumer.as_ref().is_some_and(|c| !c.is_empty()) => {
                    self.classic_heartbeat_in_consumer_group(group, &params, now)
                }
                Some(group) => return group.heartbeat(&params, now),
            }
        };
        // A classic member's heartbeat in a consumer group may move it on (a revocation done).
        self.store_consumer_record(&params.group_id).await?;
        result
    }

    /// LeaveGroup for one or more members (v3+ batches them).
    pub async fn leave_group(self: &Arc<Self>, group_id: &str, members: Vec<LeavingMember>) -> LeaveGroupResult {
        if group_id.is_empty() {
            return LeaveGroupResult { error: Some(ErrorKind::InvalidGroupId), members: Vec::new() };
        }
        let (result, in_consumer_group) = {
            let mut groups = self.groups();
            if !self.is_active() {
                return LeaveGroupResult { error: Some(ErrorKind::CoordinatorNotAvailable), members: Vec::new() };
            }
            if let Err(kind) = self.check_coordinator(group_id) {
                return LeaveGroupResult { error: Some(kind), members: Vec::new() };
            }
            let now = self.now_ms();
            match groups.get_mut(group_id) {
                None => {
                    let members = members
                        .into_iter()
                        .map(|m| MemberLeaveResult {
                            member_id: m.member_id,
                            group_instance_id: m.group_instance_id,
                            error: Some(ErrorKind::UnknownMember),
                        })
                        .collect();
                    (LeaveGroupResult { error: None, members }, false)
                }
                Some(group) if group.consumer.as_ref().is_some_and(|c| !c.is_empty()) => {
                    (self.classic_leave_in_consumer_group(group, members, now), true)
                }
                Some(group) => {
                    let result = group.leave(members, now, &self.limits);
                    if group.is_vacant() && !group.persisted {
                        groups.remove(group_id);
                    }
                    (result, false)
                }
            }
        };
        self.timer_wake.notify_one();
        if in_consumer_group {
            if let Err(kind) = self.store_consumer_record(group_id).await {
                return LeaveGroupResult { error: Some(kind), members: Vec::new() };
            }
        }
        result
    }

    // ----- offsets ------------------------------------------------------------------------

    /// OffsetCommit. Returns once the commit is fsynced (or refused), one result per offset in
    /// request order.
    pub async fn commit_offsets(self: &Arc<Self>, params: CommitParams) -> Vec<PartitionResult> {
        let fallback: Vec<PartitionResult> = params
            .offsets
            .iter()
            .map(|o| PartitionResult {
                topic: o.topic.clone(),
                partition: o.partition,
                error: Some(ErrorKind::Internal),
            })
            .collect();
        let this = self.clone();
        match tokio::task::spawn_blocking(move || this.commit_blocking(params)).await {
            Ok(results) => results,
            Err(e) => {
                tracing::error!(error = %e, "offset commit task failed");
                fallback
            }
        }
    }

    fn commit_blocking(&self, params: CommitParams) -> Vec<PartitionResult> {
        self.commit_checked(params, true, None)
    }

    /// Stores the offsets a transaction committed (TxnOffsetCommit, materialized when EndTxn
    /// commits): the member was checked when the offsets were sent, so the group's current
    /// generation is not checked again. Blocking.
    ///
    /// The offsets of `producer_id`'s transaction are stable from here on, stored or not (a
    /// refusal is final and logged by the caller).
    pub(crate) fn commit_transaction_offsets_blocking(
        &self,
        group_id: &str,
        offsets: Vec<super::OffsetToCommit>,
        producer_id: Option<i64>,
    ) -> Vec<PartitionResult> {
        let params = CommitParams {
            group_id: group_id.to_string(),
            generation_id: None,
            member_id: String::new(),
            group_instance_id: None,
            offsets,
        };
        // The transaction's note goes with its offsets (a tombstone of one that is not there
        // is harmless, and covers a note this coordinator never loaded).
        let tombstone = producer_id.map(|id| (offsets::transaction_offsets_key(group_id, id), None));
        let results = self.commit_checked(params, false, tombstone);
        if let Some(producer_id) = producer_id {
            self.unstable.stored(producer_id, group_id);
        }
        results
    }

    /// A TxnOffsetCommit of `producer_id`'s open transaction was accepted for `group_id`: its
    /// partitions' offsets are unstable until the transaction ends. Returns once the note is
    /// durable in the group's partition, so a coordinator that takes the group over knows it
    /// too. Blocking.
    pub(crate) fn note_transactional_offsets(
        &self,
        producer_id: i64,
        group_id: &str,
        partitions: impl IntoIterator<Item = (String, i32)>,
    ) -> Result<(), BrokerError> {
        let target = self
            .shard_of(group_id)
            .map_err(|kind| BrokerError::new(kind, format!("this broker does not coordinate group {group_id}")))?;
        let _writer = lock(&target.writer);
        let max_ms = i64::from(self.broker.config.transaction_max_timeout_ms);
        let note = self.unstable.note(producer_id, group_id, partitions, self.now_ms(), max_ms);
        let entry =
            (offsets::transaction_offsets_key(group_id, producer_id), Some(offsets::transaction_offsets_value(&note)));
        self.append(&target, std::slice::from_ref(&entry))
    }

    /// `producer_id`'s transaction aborted (its marker reached this broker's
    /// `__consumer_offsets` partition): the offsets it sent will never be stored. Blocking
    /// (tombstones the notes of the groups it had sent offsets for).
    pub(crate) fn transaction_aborted(&self, producer_id: i64) {
        for group_id in self.unstable.ended(producer_id) {
            let Ok(target) = self.shard_of(&group_id) else { continue };
            let _writer = lock(&target.writer);
            let tombstone = (offsets::transaction_offsets_key(&group_id, producer_id), None);
            if let Err(e) = self.append(&target, std::slice::from_ref(&tombstone)) {
                // The note lapses on its own (`unstable`'s expiry); a successor may hold the
                // group's offsets back until then.
                tracing::warn!(group = %group_id, producer_id, error = %e, "cannot remove an aborted transaction's offsets note");
            }
        }
    }

    /// Checks a transactional commit's member as an OffsetCommit would (TxnOffsetCommit v3+
    /// carries the generation and member id); a commit without generation is accepted, as
    /// older clients send no member.
    pub fn validate_transactional_commit(
        &self,
        group_id: &str,
        generation_id: Option<i32>,
        member_id: &str,
        group_instance_id: Option<&str>,
    ) -> Result<(), ErrorKind> {
        if generation_id.is_none() {
            return Ok(());
        }
        let now = self.now_ms();
        let mut groups = self.groups();
        self.check_coordinator(group_id)?;
        match groups.get_mut(group_id) {
            Some(group) => group.validate_commit(generation_id, member_id, group_instance_id, now).map(|_| ()),
            None => Err(ErrorKind::WrongGeneration),
        }
    }

    /// `also`: one more record to append with the offsets (a transaction's note to remove).
    fn commit_checked(
        &self,
        params: CommitParams,
        validate: bool,
        also: Option<(Bytes, Option<Bytes>)>,
    ) -> Vec<PartitionResult> {
        let mut results: Vec<PartitionResult> = params
            .offsets
            .iter()
            .map(|o| PartitionResult { topic: o.topic.clone(), partition: o.partition, error: None })
            .collect();
        // Offsets of partitions that do not exist are refused before the group is consulted.
        let mut known = Vec::with_capacity(results.len());
        for (i, o) in params.offsets.iter().enumerate() {
            if !self.broker.partition_exists(&o.topic, o.partition) {
                results[i].error = Some(ErrorKind::UnknownTopicOrPartition);
            } else {
                known.push(i);
            }
        }
        if known.is_empty() {
            return results;
        }
        let group_id = params.group_id.as_str();
        let target = match self.shard_of(group_id) {
            Ok(target) => target,
            Err(kind) => {
                for &i in &known {
                    results[i].error = Some(kind);
                }
                return results;
            }
        };
        let _writer = lock(&target.writer);
        let now = self.now_ms();
        let validation = self.validate_commit_params(&params, validate, now);
        if let Err(code) = validation {
            for &i in &known {
                results[i].error = Some(code);
            }
            return results;
        }
        let stored = offsets_to_store(&params, &known, now, &mut results);
        if stored.is_empty() && also.is_none() {
            return results;
        }
        let entries: Vec<(Bytes, Option<Bytes>)> = stored
            .iter()
            .map(|(i, committed)| {
                let o = &params.offsets[*i];
                (offsets::offset_key(group_id, &o.topic, o.partition), Some(offsets::offset_value(committed)))
            })
            .chain(also)
            .collect();
        if let Err(e) = self.append(&target, &entries) {
            tracing::error!(group = group_id, error = %e, "cannot store committed offsets");
            let code = append_error_kind(&e, ErrorKind::InvalidCommitOffsetSize);
            for (i, _) in &stored {
                results[*i].error = Some(code);
            }
            return results;
        }
        let mut groups = self.groups();
        if self.check_coordinator(group_id).is_err() {
            // Durable, but the shard was lost meanwhile: whoever loads it next reads the commit.
            return results;
        }
        let group = groups.entry(group_id.to_string()).or_insert_with(|| Group::new(group_id.to_string(), now));
        for (i, committed) in stored {
            let o = &params.offsets[i];
            group.offsets.insert((o.topic.clone(), o.partition), committed);
        }
        results
    }

    /// Whether the group takes this commit now: the coordinator is active and, with
    /// `validate`, the member and generation are the group's (a simple commit, without a
    /// generation, to a group that does not exist creates it).
    fn validate_commit_params(&self, params: &CommitParams, validate: bool, now: i64) -> Result<(), ErrorKind> {
        if !self.is_active() {
            return Err(ErrorKind::CoordinatorNotAvailable);
        }
        if !validate {
            return Ok(());
        }
        let group_id = params.group_id.as_str();
        let mut groups = self.groups();
        let validate_in = |group: &mut Group| {
            group.validate_commit(params.generation_id, &params.member_id, params.group_instance_id.as_deref(), now)
        };
        match groups.get_mut(group_id) {
            Some(group) => validate_in(group),
            // A group that does not exist takes only simple commits (it is created by the first
            // one); a generation means a member of a group that is gone.
            None if params.generation_id.is_none() => validate_in(&mut Group::new(group_id.to_string(), now)),
            None => Err(ErrorKind::WrongGeneration),
        }
    }

    /// OffsetFetch v9's member check: in a consumer-protocol group a member fetches under its
    /// current epoch (see [`super::consumer::ConsumerGroup::validate_fetch`]); other groups take any fetch.
    pub fn validate_offset_fetch(&self, group_id: &str, member_id: &str, member_epoch: i32) -> Result<(), ErrorKind> {
        let groups = self.groups();
        match groups.get(group_id).and_then(|g| g.consumer.as_ref()) {
            Some(consumer) => consumer.validate_fetch(member_id, member_epoch),
            None => Ok(()),
        }
    }

    /// OffsetFetch: the listed partitions (without offset where nothing is committed), or every
    /// committed partition of the group with `None`. With `require_stable` (KIP-447), a
    /// partition an open transaction is about to commit an offset for answers
    /// UNSTABLE_OFFSET_COMMIT instead, and the client asks again.
    pub async fn fetch_offsets(
        &self,
        group_id: &str,
        partitions: Option<Vec<(String, i32)>>,
        require_stable: bool,
    ) -> Result<Vec<FetchedOffset>, ErrorKind> {
        let unstable = if require_stable { self.unstable.of_group(group_id, self.now_ms()) } else { BTreeSet::new() };
        let groups = self.groups();
        if !self.is_active() {
            return Err(ErrorKind::CoordinatorNotAvailable);
        }
        self.check_coordinator(group_id)?;
        let group = groups.get(group_id);
        let fetched = |key: (String, i32), committed: Option<&CommittedOffset>| match committed {
            _ if unstable.contains(&key) => FetchedOffset {
                topic: key.0,
                partition: key.1,
                offset: None,
                leader_epoch: None,
                metadata: String::new(),
                error: Some(ErrorKind::UnstableOffsetCommit),
            },
            Some(c) => FetchedOffset {
                topic: key.0,
                partition: key.1,
                offset: Some(c.offset),
                leader_epoch: c.leader_epoch,
                metadata: c.metadata.clone(),
                error: None,
            },
            None => FetchedOffset {
                topic: key.0,
                partition: key.1,
                offset: None,
                leader_epoch: None,
                metadata: String::new(),
                error: None,
            },
        };
        Ok(match partitions {
            Some(list) => list
                .into_iter()
                .map(|key| {
                    let committed = group.and_then(|g| g.offsets.get(&key));
                    fetched(key, committed)
                })
                .collect(),
            None => {
                let mut all: Vec<FetchedOffset> = group
                    .map(|g| g.offsets.iter().map(|(key, c)| fetched(key.clone(), Some(c))).collect())
                    .unwrap_or_default();
                all.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
                all
            }
        })
    }

    /// OffsetDelete. An Empty group's offsets can all go; a consumer group with members keeps
    /// those of topics its members subscribe to (GROUP_SUBSCRIBED_TO_TOPIC); another group with
    /// members refuses (NON_EMPTY_GROUP). An Empty group left without offsets is deleted.
    pub async fn delete_offsets(
        self: &Arc<Self>,
        group_id: String,
        partitions: Vec<(String, i32)>,
    ) -> Result<Vec<PartitionResult>, ErrorKind> {
        if group_id.is_empty() {
            return Err(ErrorKind::InvalidGroupId);
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.delete_offsets_blocking(&group_id, partitions))
            .await
            .unwrap_or(Err(ErrorKind::Internal))
    }

    fn delete_offsets_blocking(
        &self,
        group_id: &str,
        partitions: Vec<(String, i32)>,
    ) -> Result<Vec<PartitionResult>, ErrorKind> {
        let target = self.shard_of(group_id)?;
        let _writer = lock(&target.writer);
        let metadata = self.broker.metadata();
        let mut results = Vec::with_capacity(partitions.len());
        let mut entries: Vec<(Bytes, Option<Bytes>)> = Vec::new();
        let mut removed: Vec<(String, i32)> = Vec::new();
        let deletes_group;
        {
            let groups = self.groups();
            if !self.is_active() {
                return Err(ErrorKind::CoordinatorNotAvailable);
            }
            let Some(group) = groups.get(group_id).filter(|g| g.state != GroupState::Dead) else {
                return Err(ErrorKind::UnknownGroup);
            };
            let checks_subscriptions = match group.state {
                GroupState::Empty => false,
                _ if group.is_consumer_group() => true,
                _ => return Err(ErrorKind::GroupNotEmpty),
            };
            for (topic, partition) in partitions {
                let error = if metadata.topic(&topic).is_none() {
                    Some(ErrorKind::UnknownTopicOrPartition)
                } else if checks_subscriptions && group.is_subscribed_to(&topic) {
                    Some(ErrorKind::GroupSubscribedToTopic)
                } else {
                    let key = (topic.clone(), partition);
                    if group.offsets.contains_key(&key) && !removed.contains(&key) {
                        entries.push((offsets::offset_key(group_id, &topic, partition), None));
                        removed.push(key);
                    }
                    None
                };
                results.push(PartitionResult { topic, partition, error });
            }
            deletes_group = group.state == GroupState::Empty
                && group.offsets.keys().all(|key| removed.contains(key))
                && !group.offsets.is_empty();
            if deletes_group && group.persisted {
                entries.push((offsets::group_key(group_id), None));
            }
        }
        if entries.is_empty() {
            return Ok(results);
        }
        if let Err(e) = self.append(&target, &entries) {
            tracing::error!(group = group_id, error = %e, "cannot delete offsets");
            return Err(append_error_kind(&e, ErrorKind::Internal));
        }
        let mut groups = self.groups();
        if let Some(group) = groups.get_mut(group_id) {
            for key in &removed {
                group.offsets.remove(key);
            }
            if deletes_group && group.is_vacant() {
                groups.remove(group_id);
                tracing::info!(group = group_id, "group deleted: its last offsets were deleted");
            }
        }
        Ok(results)
    }

    // ----- administration -----------------------------------------------------------------

    /// ListGroups, sorted by group id; an empty `states` lists every state.
    pub async fn list_groups(&self, states: &[GroupState]) -> Result<Vec<GroupListing>, ErrorKind> {
        let groups = self.groups();
        if !self.is_active() {
            return Err(ErrorKind::CoordinatorNotAvailable);
        }
        let mut listed: Vec<GroupListing> = groups
            .values()
            .filter(|g| g.state != GroupState::Dead && (states.is_empty() || states.contains(&g.state)))
            .map(|g| GroupListing {
                group_id: g.id.clone(),
                protocol_type: g.protocol_type.clone().unwrap_or_default(),
                state: g.state,
                group_type: if g.consumer.is_some() { super::GROUP_TYPE_CONSUMER } else { super::GROUP_TYPE_CLASSIC },
            })
            .collect();
        let shares = self.list_share_groups(states);
        // A share group's name may also hold a RocketMQ group's mirrored offsets: listed once,
        // as the share group.
        listed.retain(|g| !shares.iter().any(|s| s.group_id == g.group_id));
        listed.extend(shares);
        listed.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        Ok(listed)
    }

    /// DescribeGroups, in request order. A group that does not exist is described as Dead
    /// without error (as Kafka does before DescribeGroups v6).
    pub async fn describe_groups(&self, group_ids: &[String]) -> Vec<GroupDescription> {
        let groups = self.groups();
        let active = self.is_active();
        group_ids
            .iter()
            .map(|id| match (groups.get(id), self.check_coordinator(id)) {
                _ if !active => GroupDescription { error: Some(ErrorKind::CoordinatorNotAvailable), ..dead_group(id) },
                (_, Err(kind)) => GroupDescription { error: Some(kind), ..dead_group(id) },
                _ if self.is_share_group(id) => self.describe_share_as_classic(id).unwrap_or_else(|| dead_group(id)),
                (Some(group), Ok(())) if group.consumer.is_some() => self.describe_consumer_as_classic(group),
                (Some(group), Ok(())) => group.describe(),
                (None, Ok(())) => dead_group(id),
            })
            .collect()
    }

    /// Every live group's state and committed offsets, sorted by group id: a copy taken under
    /// the groups mutex (in-memory work only), for metrics.
    pub(crate) fn committed_offsets(&self) -> Vec<GroupOffsets> {
        let groups = self.groups();
        let mut out: Vec<GroupOffsets> = groups
            .values()
            .filter(|g| g.state != GroupState::Dead)
            .map(|g| {
                let mut offsets: Vec<(String, i32, i64)> =
                    g.offsets.iter().map(|((topic, partition), c)| (topic.clone(), *partition, c.offset)).collect();
                offsets.sort_unstable();
                GroupOffsets { group_id: g.id.clone(), state: g.state, offsets }
            })
            .collect();
        drop(groups);
        out.sort_unstable_by(|a, b| a.group_id.cmp(&b.group_id));
        out
    }

    /// DeleteGroups: each Empty group is deleted with its offsets (tombstones, fsynced);
    /// NON_EMPTY_GROUP while it has members, GROUP_ID_NOT_FOUND if unknown.
    pub async fn delete_groups(self: &Arc<Self>, group_ids: Vec<String>) -> Vec<(String, Option<ErrorKind>)> {
        let this = self.clone();
        let fallback: Vec<(String, Option<ErrorKind>)> =
            group_ids.iter().map(|id| (id.clone(), Some(ErrorKind::Internal))).collect();
        tokio::task::spawn_blocking(move || {
            group_ids
                .into_iter()
                .map(|id| {
                    let error = this.delete_group_blocking(&id).err();
                    (id, error)
                })
                .collect()
        })
        .await
        .unwrap_or(fallback)
    }

    fn delete_group_blocking(&self, group_id: &str) -> Result<(), ErrorKind> {
        let target = self.shard_of(group_id)?;
        if let Some(deleted) = self.delete_share_group(&target, group_id) {
            deleted?;
            // Its mirrored offsets, if any, go too; none is no error for a share group.
            return match self.delete_group_blocking_classic(&target, group_id) {
                Err(ErrorKind::UnknownGroup) | Ok(()) => Ok(()),
                Err(kind) => Err(kind),
            };
        }
        self.delete_group_blocking_classic(&target, group_id)
    }

    fn delete_group_blocking_classic(&self, target: &Arc<OffsetsPartition>, group_id: &str) -> Result<(), ErrorKind> {
        let _writer = lock(&target.writer);
        let mut entries: Vec<(Bytes, Option<Bytes>)> = Vec::new();
        {
            let mut groups = self.groups();
            if !self.is_active() {
                return Err(ErrorKind::CoordinatorNotAvailable);
            }
            let group = match groups.get_mut(group_id) {
                None => return Err(ErrorKind::UnknownGroup),
                Some(g) if g.state == GroupState::Dead => return Err(ErrorKind::UnknownGroup),
                Some(g) if g.state != GroupState::Empty => return Err(ErrorKind::GroupNotEmpty),
                Some(g) => g,
            };
            // Dead until the tombstones are durable: joins meanwhile get
            // COORDINATOR_NOT_AVAILABLE and retry.
            group.state = GroupState::Dead;
            for (topic, partition) in group.offsets.keys() {
                entries.push((offsets::offset_key(group_id, topic, *partition), None));
            }
            if group.persisted {
                entries.push((offsets::group_key(group_id), None));
            }
            if group.stale_consumer_record || group.consumer.as_ref().is_some_and(|c| c.persisted_value.is_some()) {
                entries.push((offsets::consumer_group_key(group_id), None));
            }
        }
        let appended = if entries.is_empty() { Ok(()) } else { self.append(target, &entries) };
        let mut groups = self.groups();
        match appended {
            Ok(()) => {
                groups.remove(group_id);
                tracing::info!(group = group_id, offsets = entries.len(), "group deleted");
                Ok(())
            }
            Err(e) => {
                tracing::error!(group = group_id, error = %e, "cannot delete the group");
                if let Some(group) = groups.get_mut(group_id) {
                    group.state = GroupState::Empty;
                }
                Err(append_error_kind(&e, ErrorKind::Internal))
            }
        }
    }

    // ----- timers -------------------------------------------------------------------------

    /// Runs every group's due timers; returns the earliest next deadline. Also forgets groups
    /// with nothing left in memory or on disk.
    fn poll_groups(&self, now_ms: i64) -> Option<i64> {
        let mut groups = self.groups();
        let mut next: Option<i64> = None;
        groups.retain(|_, group| {
            group.poll(now_ms, &self.limits);
            if let Some(deadline) = group.next_deadline_ms() {
                next = Some(next.map_or(deadline, |n| n.min(deadline)));
            }
            !group.is_vacant() || group.persisted
        });
        next
    }

    /// Deletes committed offsets of Empty groups that have not been committed (nor the group
    /// been non-empty) for `offsets.retention.minutes`, and Empty groups left with nothing.
    /// Blocking (appends tombstones).
    pub(crate) fn expire_offsets_blocking(&self) {
        self.expire_offsets_at(self.now_ms());
    }

    pub(crate) fn expire_offsets_at(&self, now: i64) {
        let retention = self.offsets_retention_ms;
        let count = self.partition_count();
        if count == 0 {
            return;
        }
        let due: Vec<i32> = {
            let groups = self.groups();
            let mut due: Vec<i32> = groups
                .values()
                .filter(|g| {
                    g.state == GroupState::Empty
                        && (g.offsets.is_empty()
                            || g.offsets
                                .values()
                                .any(|c| c.commit_timestamp_ms.max(g.empty_since_ms) + retention <= now))
                })
                .map(|g| partition_for(&g.id, count))
                .collect();
            due.sort_unstable();
            due.dedup();
            due
        };
        for index in due {
            let Ok(target) = self.shards.get(index) else { continue };
            let _writer = lock(&target.writer);
            let mut entries: Vec<(Bytes, Option<Bytes>)> = Vec::new();
            let mut expired: Vec<(String, Vec<(String, i32)>)> = Vec::new();
            {
                let groups = self.groups();
                for group in groups.values() {
                    if group.state != GroupState::Empty || partition_for(&group.id, count) != index {
                        continue;
                    }
                    let keys: Vec<(String, i32)> = group
                        .offsets
                        .iter()
                        .filter(|(_, c)| c.commit_timestamp_ms.max(group.empty_since_ms) + retention <= now)
                        .map(|(key, _)| key.clone())
                        .collect();
                    for (topic, partition) in &keys {
                        entries.push((offsets::offset_key(&group.id, topic, *partition), None));
                    }
                    let emptied = keys.len() == group.offsets.len();
                    if emptied && group.persisted && !group.has_members() {
                        entries.push((offsets::group_key(&group.id), None));
                    }
                    let consumer_stored = group.stale_consumer_record
                        || group.consumer.as_ref().is_some_and(|c| c.persisted_value.is_some());
                    if emptied && consumer_stored && !group.has_members() {
                        entries.push((offsets::consumer_group_key(&group.id), None));
                    }
                    if !keys.is_empty() || emptied {
                        expired.push((group.id.clone(), keys));
                    }
                }
            }
            if !entries.is_empty() {
                if let Err(e) = self.append(&target, &entries) {
                    tracing::error!(partition = index, error = %e, "cannot expire offsets");
                    continue;
                }
            }
            let mut groups = self.groups();
            for (group_id, keys) in expired {
                let Some(group) = groups.get_mut(&group_id) else { continue };
                for key in &keys {
                    group.offsets.remove(key);
                }
                if !keys.is_empty() {
                    tracing::info!(group = %group_id, offsets = keys.len(), "expired committed offsets");
                }
                if group.is_vacant() {
                    // Its group record (if any) was tombstoned above; a member that joined
                    // meanwhile makes it non-vacant, and its next rebalance rewrites the record.
                    groups.remove(&group_id);
                    tracing::info!(group = %group_id, "removed an empty group without offsets");
                }
            }
        }
    }
}

#[cfg(test)]
impl GroupCoordinator {
    pub(crate) fn check_invariants(&self) {
        for group in self.groups().values() {
            group.check_invariants();
        }
    }
}

/// The groups, locked. In debug builds every group's invariants are checked when the lock is
/// let go, so a state machine step that breaks one fails where it happened, in any test.
pub(super) struct Groups<'a>(MutexGuard<'a, HashMap<String, Group>>);

impl std::ops::Deref for Groups<'_> {
    type Target = HashMap<String, Group>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Groups<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Groups<'_> {
    fn drop(&mut self) {
        if cfg!(debug_assertions) && !std::thread::panicking() {
            for group in self.0.values() {
                group.check_invariants();
            }
        }
    }
}

fn dead_group(id: &str) -> GroupDescription {
    GroupDescription {
        group_id: id.to_string(),
        error: None,
        state: GroupState::Dead,
        protocol_type: String::new(),
        protocol_data: String::new(),
        members: Vec::new(),
        consumer: None,
    }
}

/// The timer task: polls the groups at their next deadline (at least every
/// TIMER_TICK_MAX_MS), expires offsets every `offsets.retention.check.interval.ms`. Holds only a
/// weak reference, so dropping the coordinator (a crash test) ends it.
async fn run_timers(coordinator: Weak<GroupCoordinator>, wake: Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
    let mut next_retention_check_ms: Option<i64> = None;
    loop {
        let sleep_ms = {
            let Some(c) = coordinator.upgrade() else { return };
            if *shutdown.borrow() {
                c.shutdown();
                return;
            }
            if c.shut_down.load(Ordering::SeqCst) {
                return;
            }
            let now = c.now_ms();
            let interval = c.offsets_retention_check_interval_ms;
            let retention_due = *next_retention_check_ms.get_or_insert(now.saturating_add(interval));
            if now >= retention_due {
                let task = c.clone();
                if let Err(e) = tokio::task::spawn_blocking(move || task.expire_offsets_blocking()).await {
                    tracing::error!(error = %e, "offset expiry task failed");
                }
                next_retention_check_ms = Some(c.now_ms().saturating_add(interval));
            }
            let now = c.now_ms();
            let next = c.poll_groups(now).unwrap_or(i64::MAX).min(next_retention_check_ms.unwrap_or(i64::MAX));
            (next.saturating_sub(now)).clamp(1, TIMER_TICK_MAX_MS)
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(sleep_ms as u64)) => {}
            _ = wake.notified() => {}
            changed = shutdown.changed() => {
                if changed.is_err() {
                    return; // the broker is gone
                }
            }
        }
    }
}
