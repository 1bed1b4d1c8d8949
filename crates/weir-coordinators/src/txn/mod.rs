//! The transaction coordinator (KIP-98): transactional ids, their producer ids and epochs, the
//! partitions and consumer groups a transaction touches, and its completion with markers.
//!
//! State of each `transactional.id` lives in the compacted internal topic `__transaction_state`,
//! a JSON record per change, appended and fsynced before a request is answered. A transactional
//! id belongs to one partition (Kafka's hash), and the broker leading that partition is its
//! coordinator: this one holds the ids of the partitions it leads (see `coordinator_shards`).
//! Completing a transaction is two-phase and crash-safe:
//! 1. `PrepareCommit`/`PrepareAbort` is made durable (with the partitions and pending offsets);
//! 2. a marker (control batch) is appended to every partition of the transaction, and on commit
//!    the pending group offsets are stored;
//! 3. `CompleteCommit`/`CompleteAbort` is made durable.
//!
//! Markers go to each partition's leader, over the cluster's RPC when it is another broker
//! (`txn.write_markers`), and the offsets to the group's coordinator (`group.txn_commit`).
//! Once step 1 is durable the outcome is decided: if step 2 fails (a leader is down), the
//! timer task retries it until it succeeds, and after a crash or a move of the coordinator the
//! new coordinator does. A second marker for a transaction already ended is harmless (the
//! partition sees no open transaction to end).
//! Transactions open longer than their timeout are aborted with a bumped epoch, which fences the
//! producer that let them time out.

mod service;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::group::{GroupCoordinator, OffsetToCommit};
use crate::shards::{self, ShardOwner, Shards};
use weir_broker::partition::Partition;
use weir_broker::{internal_records, Broker, BrokerError, ErrorKind};
use weir_storage::sync::lock;

pub use weir_broker::metadata::TRANSACTION_STATE_TOPIC;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
}

impl TxnState {
    /// The name DescribeTransactions and ListTransactions use.
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
        }
    }
}

/// An offset a transaction will commit for a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingOffset {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// The leader epoch the consumer read the offset at, when it knows it.
    #[serde(with = "stored_leader_epoch")]
    pub leader_epoch: Option<i32>,
    pub metadata: Option<String>,
}

/// A pending offset's leader epoch as `__transaction_state` records and the coordinators' RPC
/// carry it: -1 when unknown, so that records written before it was an `Option` still load and
/// brokers of either version understand each other.
mod stored_leader_epoch {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    const UNKNOWN: i32 = -1;

    pub(crate) fn serialize<S: Serializer>(epoch: &Option<i32>, serializer: S) -> Result<S::Ok, S::Error> {
        epoch.unwrap_or(UNKNOWN).serialize(serializer)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<i32>, D::Error> {
        Ok(Some(i32::deserialize(deserializer)?).filter(|&epoch| epoch != UNKNOWN))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnMetadata {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    pub state: TxnState,
    pub partitions: BTreeSet<(String, i32)>,
    /// Offsets by group, stored when the transaction commits.
    pub(crate) pending_offsets: BTreeMap<String, Vec<PendingOffset>>,
    /// When the open transaction began (ms), for the timeout.
    pub started_ms: i64,
    pub(crate) updated_ms: i64,
}

/// A transaction's identity as a request states it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct ProducerIdentity {
    pub producer_id: i64,
    pub producer_epoch: i16,
}

pub struct TxnCoordinator {
    broker: Arc<Broker>,
    groups: Arc<GroupCoordinator>,
    /// The transactional ids of the loaded shards. One lock for all of them: every change is a
    /// durable append anyway. Lock order: `state`, then the shards.
    state: Mutex<HashMap<String, TxnMetadata>>,
    /// The `__transaction_state` partitions this broker coordinates.
    shards: Shards<TxnShard>,
    /// Transactional ids whose completion (markers, offsets) runs right now, so that the timer's
    /// retry and a request do not complete the same transaction at once.
    completing: Mutex<HashSet<String>>,
}

/// A loaded partition of `__transaction_state`.
pub struct TxnShard {
    partition: Arc<Partition>,
}

/// Marks a transactional id as completing while it lives.
struct Completing<'a> {
    set: &'a Mutex<HashSet<String>>,
    id: String,
}

impl Drop for Completing<'_> {
    fn drop(&mut self) {
        lock(self.set).remove(&self.id);
    }
}

fn err(kind: ErrorKind, message: impl Into<String>) -> BrokerError {
    BrokerError::new(kind, message)
}

impl TxnCoordinator {
    /// Partitions of `__transaction_state`: 0 before it exists.
    fn partition_count(&self) -> i32 {
        self.broker.metadata().topic(TRANSACTION_STATE_TOPIC).map_or(0, |t| t.partitions)
    }

    /// The `__transaction_state` partition holding `transactional_id`'s state (Kafka's hash):
    /// of the topic as it is, or as it will be created.
    pub fn partition_for(&self, transactional_id: &str) -> i32 {
        let count = self.partition_count();
        let count = if count > 0 { count } else { self.broker.config.transaction_state_partitions.max(1) };
        crate::group::partition_for(transactional_id, count)
    }

    /// FindCoordinator's part: creates `__transaction_state` when it does not exist yet, then
    /// names the partition whose leader coordinates `transactional_id`.
    pub async fn coordinator_partition(&self, transactional_id: &str) -> Result<i32, BrokerError> {
        if self.partition_count() == 0 {
            ensure_state_topic(&self.broker).await?;
        }
        Ok(self.partition_for(transactional_id))
    }

    /// The shard holding `transactional_id`, if this broker coordinates it.
    fn shard_of(&self, transactional_id: &str) -> Result<Arc<TxnShard>, BrokerError> {
        if self.partition_count() == 0 {
            return Err(err(
                ErrorKind::CoordinatorNotAvailable,
                format!("{TRANSACTION_STATE_TOPIC} does not exist yet"),
            ));
        }
        self.shards.get(self.partition_for(transactional_id))
    }

    /// Checks that this broker coordinates `transactional_id` (NOT_COORDINATOR otherwise: the
    /// client looks for its coordinator again).
    pub fn check_coordinator(&self, transactional_id: &str) -> Result<(), BrokerError> {
        self.shard_of(transactional_id).map(|_| ())
    }

    /// Loads the transactions of the `__transaction_state` partitions this broker leads and
    /// completes those a crash left half done. On a single node it first creates the topic;
    /// in a cluster the first FindCoordinator does. Blocking; call from a tokio runtime
    /// context (it starts the timeout task).
    pub fn start(broker: Arc<Broker>, groups: Arc<GroupCoordinator>) -> Result<Arc<TxnCoordinator>, BrokerError> {
        if !broker.config.is_cluster() {
            weir_broker::runtime::block_on(ensure_state_topic(&broker))??;
        }
        let coordinator = Arc::new(TxnCoordinator {
            broker,
            groups,
            state: Mutex::new(HashMap::new()),
            shards: Shards::new(TRANSACTION_STATE_TOPIC),
            completing: Mutex::new(HashSet::new()),
        });
        if !shards::reconcile_blocking(&coordinator.broker, &*coordinator) {
            return Err(err(
                ErrorKind::Storage,
                format!("cannot load the transactions of {TRANSACTION_STATE_TOPIC} (see the log)"),
            ));
        }
        coordinator.complete_unfinished();
        tracing::info!(transactional_ids = lock(&coordinator.state).len(), "loaded transactions");
        service::register(&coordinator);
        shards::spawn_watcher(&coordinator.broker, Arc::downgrade(&coordinator));
        let timer = Arc::downgrade(&coordinator);
        let mut shutdown = coordinator.broker.shutdown_signal();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = shutdown.changed() => return,
                }
                let Some(coordinator) = timer.upgrade() else { return };
                let expired = tokio::task::spawn_blocking(move || {
                    coordinator.complete_unfinished();
                    coordinator.abort_timed_out()
                })
                .await;
                if let Ok(Err(e)) = expired {
                    tracing::warn!(error = %e, "aborting timed-out transactions failed");
                }
            }
        });
        Ok(coordinator)
    }

    /// Completes every prepared transaction (after a crash, a move of the coordinator, or a
    /// failed completion); what still fails is tried again at the next call. Blocking.
    fn complete_unfinished(&self) {
        let unfinished: Vec<TxnMetadata> = lock(&self.state)
            .values()
            .filter(|m| matches!(m.state, TxnState::PrepareCommit | TxnState::PrepareAbort))
            .cloned()
            .collect();
        for meta in unfinished {
            let id = meta.transactional_id.clone();
            tracing::info!(transactional_id = %id, state = meta.state.name(), "completing a prepared transaction");
            if let Err(e) = self.complete(meta) {
                tracing::warn!(transactional_id = %id, error = %e, "cannot complete the transaction yet; will retry");
            }
        }
    }

    /// Appends `meta` to the transaction log (durably) and makes it the current state.
    fn persist(&self, state: &mut HashMap<String, TxnMetadata>, mut meta: TxnMetadata) -> Result<(), BrokerError> {
        meta.updated_ms = self.broker.now_ms();
        let partition = self.shard_of(&meta.transactional_id)?.partition.clone();
        let value = serde_json::to_vec(&meta).map_err(|e| err(ErrorKind::Internal, e.to_string()))?;
        let batch = internal_records::encode_batch(
            &[(Bytes::from(meta.transactional_id.clone()), Some(Bytes::from(value)))],
            meta.updated_ms,
        );
        self.broker.append_internal_blocking(&partition, batch)?;
        state.insert(meta.transactional_id.clone(), meta);
        Ok(())
    }

    /// Checks that a request speaks for the current producer of `transactional_id`.
    fn check_producer(meta: Option<&TxnMetadata>, who: ProducerIdentity) -> Result<&TxnMetadata, BrokerError> {
        let meta = meta.ok_or_else(|| {
            err(
                ErrorKind::InvalidProducerIdMapping,
                "the transactional id has no producer id: call InitProducerId first",
            )
        })?;
        if meta.producer_id != who.producer_id {
            return Err(err(
                ErrorKind::InvalidProducerIdMapping,
                format!("producer id {} does not belong to this transactional id", who.producer_id),
            ));
        }
        if who.producer_epoch < meta.producer_epoch {
            return Err(err(
                ErrorKind::ProducerFenced,
                format!("epoch {} is fenced by epoch {}", who.producer_epoch, meta.producer_epoch),
            ));
        }
        if who.producer_epoch > meta.producer_epoch {
            return Err(err(ErrorKind::InvalidProducerEpoch, format!("unknown epoch {}", who.producer_epoch)));
        }
        if matches!(meta.state, TxnState::PrepareCommit | TxnState::PrepareAbort) {
            return Err(err(ErrorKind::ConcurrentTransactions, "the previous transaction is still completing"));
        }
        Ok(meta)
    }

    /// InitProducerId with a transactional id: a producer id (new, or the id's own) with a
    /// bumped epoch; an open transaction of the previous producer is aborted first, which
    /// fences it. Blocking.
    pub fn init_producer_id(&self, transactional_id: &str, timeout_ms: i32) -> Result<ProducerIdentity, BrokerError> {
        if transactional_id.is_empty() {
            return Err(err(ErrorKind::InvalidRequest, "empty transactional id"));
        }
        let max = self.broker.config.transaction_max_timeout_ms;
        if timeout_ms <= 0 || timeout_ms > max {
            return Err(err(
                ErrorKind::InvalidTransactionTimeout,
                format!("transaction.timeout.ms {timeout_ms} must be in (0, {max}] (transaction.max.timeout.ms)"),
            ));
        }
        self.check_coordinator(transactional_id)?;
        let existing = lock(&self.state).get(transactional_id).cloned();
        if let Some(meta) = existing.clone() {
            match meta.state {
                TxnState::Ongoing => self.abort_with_bump(meta)?,
                TxnState::PrepareCommit | TxnState::PrepareAbort => self.complete(meta)?,
                _ => {}
            }
        }
        let mut state = lock(&self.state);
        if let Some(m) = state.get(transactional_id) {
            if matches!(m.state, TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::Ongoing) {
                // Another thread is completing it (the timer's retry): the client retries.
                return Err(err(ErrorKind::ConcurrentTransactions, "the previous transaction is still completing"));
            }
        }
        let now = self.broker.now_ms();
        let meta = match state.get(transactional_id).cloned() {
            Some(mut meta) => {
                if meta.producer_epoch >= i16::MAX - 1 {
                    // Epochs exhausted: a new producer id, as Kafka does.
                    meta.producer_id = self.broker.allocate_producer_id()?;
                    meta.producer_epoch = 0;
                } else {
                    meta.producer_epoch += 1;
                }
                meta.state = TxnState::Empty;
                meta.timeout_ms = timeout_ms;
                meta.partitions.clear();
                meta.pending_offsets.clear();
                meta
            }
            None => TxnMetadata {
                transactional_id: transactional_id.to_string(),
                producer_id: self.broker.allocate_producer_id()?,
                producer_epoch: 0,
                timeout_ms,
                state: TxnState::Empty,
                partitions: BTreeSet::new(),
                pending_offsets: BTreeMap::new(),
                started_ms: now,
                updated_ms: now,
            },
        };
        let identity = ProducerIdentity { producer_id: meta.producer_id, producer_epoch: meta.producer_epoch };
        self.persist(&mut state, meta)?;
        Ok(identity)
    }

    /// AddPartitionsToTxn: returns an error per partition (None = added). Blocking.
    pub fn add_partitions(
        &self,
        transactional_id: &str,
        who: ProducerIdentity,
        partitions: &[(String, i32)],
    ) -> Vec<Option<BrokerError>> {
        let unknown: Vec<bool> = partitions.iter().map(|(t, p)| !self.broker.partition_exists(t, *p)).collect();
        let fail_all = |e: BrokerError| partitions.iter().map(|_| Some(e.clone())).collect();
        if let Err(e) = self.check_coordinator(transactional_id) {
            return fail_all(e);
        }
        let mut state = lock(&self.state);
        let mut meta = match Self::check_producer(state.get(transactional_id), who) {
            Ok(meta) => meta.clone(),
            Err(e) => return fail_all(e),
        };
        if unknown.iter().any(|u| *u) {
            // Kafka fails the whole request: the unknown partitions with their error, the
            // others with OPERATION_NOT_ATTEMPTED.
            return unknown
                .iter()
                .map(|u| {
                    Some(if *u {
                        err(ErrorKind::UnknownTopicOrPartition, "unknown partition")
                    } else {
                        err(ErrorKind::NotAttempted, "another partition of the request is unknown")
                    })
                })
                .collect();
        }
        self.begin_if_needed(&mut meta);
        meta.partitions.extend(partitions.iter().cloned());
        match self.persist(&mut state, meta) {
            Ok(()) => partitions.iter().map(|_| None).collect(),
            Err(e) => fail_all(e),
        }
    }

    fn begin_if_needed(&self, meta: &mut TxnMetadata) {
        if meta.state != TxnState::Ongoing {
            meta.state = TxnState::Ongoing;
            meta.started_ms = self.broker.now_ms();
            meta.partitions.clear();
            meta.pending_offsets.clear();
        }
    }

    /// AddOffsetsToTxn: the group's offsets partition joins the transaction. Blocking.
    pub fn add_offsets(
        &self,
        transactional_id: &str,
        who: ProducerIdentity,
        group_id: &str,
    ) -> Result<(), BrokerError> {
        if group_id.is_empty() {
            return Err(err(ErrorKind::InvalidGroupId, "empty group id"));
        }
        self.check_coordinator(transactional_id)?;
        let mut state = lock(&self.state);
        let mut meta = Self::check_producer(state.get(transactional_id), who)?.clone();
        self.begin_if_needed(&mut meta);
        meta.pending_offsets.entry(group_id.to_string()).or_default();
        self.persist(&mut state, meta)
    }

    /// TxnOffsetCommit at the transaction's coordinator: records the offsets the transaction
    /// will commit for `group_id`. Blocking.
    fn record_txn_offsets(
        &self,
        transactional_id: &str,
        who: ProducerIdentity,
        group_id: &str,
        offsets: Vec<PendingOffset>,
    ) -> Result<(), BrokerError> {
        self.check_coordinator(transactional_id)?;
        let mut state = lock(&self.state);
        let mut meta = Self::check_producer(state.get(transactional_id), who)?.clone();
        if meta.state != TxnState::Ongoing || !meta.pending_offsets.contains_key(group_id) {
            return Err(err(
                ErrorKind::InvalidTransactionState,
                format!("group {group_id} was not added to the transaction (AddOffsetsToTxn)"),
            ));
        }
        let pending = meta.pending_offsets.entry(group_id.to_string()).or_default();
        for offset in offsets {
            pending.retain(|p| !(p.topic == offset.topic && p.partition == offset.partition));
            pending.push(offset);
        }
        self.persist(&mut state, meta)
    }

    /// EndTxn: commit or abort. Blocking; returns once every marker is written.
    pub fn end_txn(&self, transactional_id: &str, who: ProducerIdentity, commit: bool) -> Result<(), BrokerError> {
        self.check_coordinator(transactional_id)?;
        let prepared = {
            let mut state = lock(&self.state);
            let meta = state.get(transactional_id);
            // A retry of an EndTxn that completed: answer as the first time.
            if let Some(m) = meta {
                let done = if commit { TxnState::CompleteCommit } else { TxnState::CompleteAbort };
                if m.producer_id == who.producer_id && m.producer_epoch == who.producer_epoch && m.state == done {
                    return Ok(());
                }
            }
            let mut meta = Self::check_producer(meta, who)?.clone();
            match meta.state {
                TxnState::Ongoing => {}
                TxnState::Empty if !commit => {
                    // Aborting nothing (e.g. after a failed begin) is allowed.
                    meta.state = TxnState::CompleteAbort;
                    return self.persist(&mut state, meta);
                }
                other => {
                    return Err(err(
                        ErrorKind::InvalidTransactionState,
                        format!(
                            "cannot {} a transaction in state {}",
                            if commit { "commit" } else { "abort" },
                            other.name()
                        ),
                    ))
                }
            }
            meta.state = if commit { TxnState::PrepareCommit } else { TxnState::PrepareAbort };
            self.persist(&mut state, meta.clone())?;
            meta
        };
        // The outcome is durable now: a completion that fails here is retried by the timer,
        // and the producer meanwhile gets CONCURRENT_TRANSACTIONS for its next transaction.
        if let Err(e) = self.complete(prepared) {
            tracing::warn!(transactional_id, error = %e, "the transaction is decided but not completed yet; will retry");
        }
        Ok(())
    }

    /// Steps 2 and 3 of completion for a prepared transaction. Blocking.
    fn complete(&self, meta: TxnMetadata) -> Result<(), BrokerError> {
        let id = meta.transactional_id.clone();
        if !lock(&self.completing).insert(id.clone()) {
            return Err(err(ErrorKind::ConcurrentTransactions, "the transaction is being completed"));
        }
        let _completing = Completing { set: &self.completing, id };
        let commit = meta.state == TxnState::PrepareCommit;
        let marker_partitions: Vec<(String, i32)> = meta
            .partitions
            .iter()
            .cloned()
            .chain(
                meta.pending_offsets
                    .keys()
                    .map(|g| (crate::group::OFFSETS_TOPIC.to_string(), self.groups.partition_for(g))),
            )
            .collect();
        let markers = service::Markers {
            producer_id: meta.producer_id,
            producer_epoch: meta.producer_epoch,
            commit,
            partitions: marker_partitions,
        };
        service::write_markers_everywhere(&self.broker, &self.groups, markers)?;
        if commit {
            for (group, offsets) in &meta.pending_offsets {
                let offsets: Vec<OffsetToCommit> = offsets
                    .iter()
                    .map(|p| OffsetToCommit {
                        topic: p.topic.clone(),
                        partition: p.partition,
                        offset: p.offset,
                        leader_epoch: p.leader_epoch,
                        metadata: p.metadata.clone(),
                    })
                    .collect();
                service::commit_group_offsets(&self.broker, &self.groups, group, offsets, meta.producer_id)?;
            }
        }
        let mut done = meta;
        done.state = if commit { TxnState::CompleteCommit } else { TxnState::CompleteAbort };
        done.partitions.clear();
        done.pending_offsets.clear();
        let mut state = lock(&self.state);
        self.persist(&mut state, done)
    }

    /// Aborts an open transaction with the epoch bumped, fencing its producer.
    fn abort_with_bump(&self, mut meta: TxnMetadata) -> Result<(), BrokerError> {
        meta.producer_epoch = meta.producer_epoch.saturating_add(1);
        meta.state = TxnState::PrepareAbort;
        {
            let mut state = lock(&self.state);
            self.persist(&mut state, meta.clone())?;
        }
        self.complete(meta)
    }

    /// Aborts transactions open longer than their timeout. Blocking.
    pub(crate) fn abort_timed_out(&self) -> Result<(), BrokerError> {
        let now = self.broker.now_ms();
        let expired: Vec<TxnMetadata> = lock(&self.state)
            .values()
            .filter(|m| m.state == TxnState::Ongoing && now.saturating_sub(m.started_ms) > i64::from(m.timeout_ms))
            .cloned()
            .collect();
        for meta in expired {
            tracing::info!(transactional_id = %meta.transactional_id, timeout_ms = meta.timeout_ms, "aborting a timed-out transaction");
            self.abort_with_bump(meta)?;
        }
        self.expire_ids(now)
    }

    /// Forgets transactional ids idle longer than `transactional.id.expiration.ms` with no
    /// transaction in progress, writing a tombstone so compaction drops them too.
    fn expire_ids(&self, now: i64) -> Result<(), BrokerError> {
        let expiration = self.broker.config.transactional_id_expiration_ms;
        let mut state = lock(&self.state);
        let idle: Vec<String> = state
            .values()
            .filter(|m| !matches!(m.state, TxnState::Ongoing | TxnState::PrepareCommit | TxnState::PrepareAbort))
            .filter(|m| now.saturating_sub(m.updated_ms) > expiration)
            .map(|m| m.transactional_id.clone())
            .collect();
        if idle.is_empty() {
            return Ok(());
        }
        let mut by_partition: BTreeMap<i32, Vec<String>> = BTreeMap::new();
        for id in idle {
            by_partition.entry(self.partition_for(&id)).or_default().push(id);
        }
        for (index, ids) in by_partition {
            let Ok(shard) = self.shards.get(index) else { continue };
            let tombstones: Vec<(Bytes, Option<Bytes>)> =
                ids.iter().map(|id| (Bytes::from(id.clone()), None)).collect();
            self.broker.append_internal_blocking(&shard.partition, internal_records::encode_batch(&tombstones, now))?;
            for id in &ids {
                state.remove(id);
            }
            tracing::info!(expired = ids.len(), partition = index, "expired idle transactional ids");
        }
        Ok(())
    }

    /// DescribeTransactions.
    pub fn describe(&self, transactional_id: &str) -> Option<TxnMetadata> {
        lock(&self.state).get(transactional_id).cloned()
    }

    /// ListTransactions, filtered by state names and producer ids (empty filters match all).
    pub fn list(&self, states: &[String], producer_ids: &[i64]) -> Vec<TxnMetadata> {
        let mut out: Vec<TxnMetadata> = lock(&self.state)
            .values()
            .filter(|m| states.is_empty() || states.iter().any(|s| s == m.state.name()))
            .filter(|m| producer_ids.is_empty() || producer_ids.contains(&m.producer_id))
            .cloned()
            .collect();
        out.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        out
    }
}

/// The configs `__transaction_state` is created with.
async fn ensure_state_topic(broker: &Arc<Broker>) -> Result<(), BrokerError> {
    let configs = [("cleanup.policy".to_string(), "compact".to_string())].into_iter().collect();
    let wanted = broker.config.transaction_state_partitions;
    broker.ensure_internal_topic(TRANSACTION_STATE_TOPIC, wanted, configs).await.map(|_| ())
}

/// Reads the transactions of one `__transaction_state` partition.
fn load_partition(broker: &Broker, partition: &Partition) -> Result<HashMap<String, TxnMetadata>, BrokerError> {
    let mut state: HashMap<String, TxnMetadata> = HashMap::new();
    let mut next = partition.log.log_start_offset();
    while next < partition.log.log_end_offset() {
        let read = broker.read_to_log_end(partition, next, 4 << 20)?;
        let Some(slice) = read.slice else { break };
        let bytes = slice.read_to_vec().map_err(BrokerError::from)?;
        let records = internal_records::decode_batches(Bytes::from(bytes))
            .map_err(|e| err(ErrorKind::Corrupt, format!("{TRANSACTION_STATE_TOPIC}: {e}")))?;
        for record in records {
            let Some(key) = record.key.as_ref().and_then(|k| std::str::from_utf8(k).ok()) else { continue };
            match record.value {
                Some(value) => match serde_json::from_slice::<TxnMetadata>(&value) {
                    Ok(meta) => {
                        state.insert(key.to_string(), meta);
                    }
                    Err(e) => {
                        tracing::warn!(transactional_id = key, error = %e, "skipping an unreadable transaction record")
                    }
                },
                None => {
                    state.remove(key);
                }
            }
        }
        next = slice.next_offset;
    }
    Ok(state)
}

impl ShardOwner for TxnCoordinator {
    type Shard = TxnShard;

    fn shards(&self) -> &Shards<TxnShard> {
        &self.shards
    }

    fn load_shard(&self, index: i32, partition: Arc<Partition>) -> Result<TxnShard, BrokerError> {
        let loaded = load_partition(&self.broker, &partition)?;
        tracing::debug!(
            partition = index,
            transactional_ids = loaded.len(),
            "loaded a partition of {TRANSACTION_STATE_TOPIC}"
        );
        lock(&self.state).extend(loaded);
        Ok(TxnShard { partition })
    }

    fn unload_shard(&self, index: i32) {
        let count = self.partition_count();
        lock(&self.state).retain(|id, _| count > 0 && crate::group::partition_for(id, count) != index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_offset_stores_an_unknown_leader_epoch_as_minus_one() {
        let pending =
            |leader_epoch| PendingOffset { topic: "t".into(), partition: 0, offset: 5, leader_epoch, metadata: None };
        let unknown = serde_json::to_string(&pending(None)).unwrap();
        assert_eq!(unknown, r#"{"topic":"t","partition":0,"offset":5,"leader_epoch":-1,"metadata":null}"#);
        assert_eq!(serde_json::from_str::<PendingOffset>(&unknown).unwrap(), pending(None));
        let known = serde_json::to_string(&pending(Some(3))).unwrap();
        assert!(known.contains(r#""leader_epoch":3"#), "{known}");
        assert_eq!(serde_json::from_str::<PendingOffset>(&known).unwrap(), pending(Some(3)));
    }
}
