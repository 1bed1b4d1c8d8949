//! The transaction coordinator (KIP-98): transactional ids, their producer ids and epochs, the
//! partitions and consumer groups a transaction touches, and its completion with markers.
//!
//! State of each `transactional.id` lives in the compacted internal topic `__transaction_state`
//! (one partition here: one coordinator), a JSON record per change, appended and fsynced before a
//! request is answered. Completing a transaction is two-phase and crash-safe:
//! 1. `PrepareCommit`/`PrepareAbort` is made durable (with the partitions and pending offsets);
//! 2. a marker (control batch) is appended to every partition of the transaction, and on commit
//!    the pending group offsets are stored;
//! 3. `CompleteCommit`/`CompleteAbort` is made durable.
//!
//! After a crash between 1 and 3, start-up finishes step 2 and 3 again; a second marker for a
//! transaction already ended is harmless (the partition sees no open transaction to end).
//! Transactions open longer than their timeout are aborted with a bumped epoch, which fences the
//! producer that let them time out.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::group::{GroupCoordinator, OffsetToCommit};
use crate::{internal_records, Broker, BrokerError, ErrorKind};
use weir_storage::sync::lock;

pub const TRANSACTION_STATE_TOPIC: &str = "__transaction_state";

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
    pub leader_epoch: i32,
    pub metadata: Option<String>,
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
    pub pending_offsets: BTreeMap<String, Vec<PendingOffset>>,
    /// When the open transaction began (ms), for the timeout.
    pub started_ms: i64,
    pub updated_ms: i64,
}

/// A transaction's identity as a request states it.
#[derive(Debug, Clone, Copy)]
pub struct ProducerIdentity {
    pub producer_id: i64,
    pub producer_epoch: i16,
}

pub struct TxnCoordinator {
    broker: Arc<Broker>,
    groups: Arc<GroupCoordinator>,
    /// One lock for all transactional ids: every change is a durable append anyway.
    state: Mutex<HashMap<String, TxnMetadata>>,
}

fn err(kind: ErrorKind, message: impl Into<String>) -> BrokerError {
    BrokerError::new(kind, message)
}

impl TxnCoordinator {
    /// The `__transaction_state` partition holding `transactional_id`'s state.
    pub fn partition_for(&self, _transactional_id: &str) -> i32 {
        0
    }

    /// Loads the transaction log and completes transactions a crash left half done. Blocking;
    /// call from a tokio runtime context (it starts the timeout task).
    pub fn start(broker: Arc<Broker>, groups: Arc<GroupCoordinator>) -> Result<Arc<TxnCoordinator>, BrokerError> {
        let configs = [("cleanup.policy".to_string(), "compact".to_string())].into_iter().collect();
        broker.ensure_internal_topic_blocking(TRANSACTION_STATE_TOPIC, 1, configs)?;
        let partition = broker.require_partition(TRANSACTION_STATE_TOPIC, 0)?;
        let mut state: HashMap<String, TxnMetadata> = HashMap::new();
        let mut next = partition.log.log_start_offset();
        while next < partition.log.high_watermark() {
            let read = broker.read(&partition, next, 4 << 20, true)?;
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
        let coordinator = Arc::new(TxnCoordinator { broker, groups, state: Mutex::new(state) });
        let unfinished: Vec<TxnMetadata> = lock(&coordinator.state)
            .values()
            .filter(|m| matches!(m.state, TxnState::PrepareCommit | TxnState::PrepareAbort))
            .cloned()
            .collect();
        for meta in unfinished {
            tracing::info!(transactional_id = %meta.transactional_id, state = meta.state.name(), "completing a transaction left unfinished");
            coordinator.complete(meta)?;
        }
        tracing::info!(transactional_ids = lock(&coordinator.state).len(), "loaded transactions");
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
                let expired = tokio::task::spawn_blocking(move || coordinator.abort_timed_out()).await;
                if let Ok(Err(e)) = expired {
                    tracing::warn!(error = %e, "aborting timed-out transactions failed");
                }
            }
        });
        Ok(coordinator)
    }

    /// Appends `meta` to the transaction log (durably) and makes it the current state.
    fn persist(&self, state: &mut HashMap<String, TxnMetadata>, mut meta: TxnMetadata) -> Result<(), BrokerError> {
        meta.updated_ms = self.broker.now_ms();
        let partition = self.broker.require_partition(TRANSACTION_STATE_TOPIC, 0)?;
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
        let existing = lock(&self.state).get(transactional_id).cloned();
        if let Some(meta) = existing.clone() {
            match meta.state {
                TxnState::Ongoing => self.abort_with_bump(meta)?,
                TxnState::PrepareCommit | TxnState::PrepareAbort => self.complete(meta)?,
                _ => {}
            }
        }
        let mut state = lock(&self.state);
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
        let unknown: Vec<bool> = partitions.iter().map(|(t, p)| self.broker.partition(t, *p).is_none()).collect();
        let mut state = lock(&self.state);
        let fail_all = |e: BrokerError| partitions.iter().map(|_| Some(e.clone())).collect();
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
        let mut state = lock(&self.state);
        let mut meta = Self::check_producer(state.get(transactional_id), who)?.clone();
        self.begin_if_needed(&mut meta);
        meta.pending_offsets.entry(group_id.to_string()).or_default();
        self.persist(&mut state, meta)
    }

    /// TxnOffsetCommit: offsets the transaction will commit for `group_id`. Blocking.
    pub fn txn_offset_commit(
        &self,
        transactional_id: &str,
        who: ProducerIdentity,
        group_id: &str,
        offsets: Vec<PendingOffset>,
    ) -> Result<(), BrokerError> {
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
        self.complete(prepared)
    }

    /// Steps 2 and 3 of completion for a prepared transaction.
    fn complete(&self, meta: TxnMetadata) -> Result<(), BrokerError> {
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
        for (topic, index) in marker_partitions {
            // A partition deleted meanwhile has nothing left to mark.
            let Some(partition) = self.broker.partition(&topic, index) else { continue };
            let marker = weir_storage::records::control_batch(
                meta.producer_id,
                meta.producer_epoch,
                commit,
                self.broker.now_ms(),
            );
            match self.broker.append_internal_blocking(&partition, marker) {
                Ok(_) => {}
                // The producer was fenced by a newer epoch in that partition: nothing to end.
                Err(e) if e.kind == ErrorKind::InvalidProducerEpoch => {
                    tracing::warn!(topic, partition = index, error = %e, "transaction marker refused");
                }
                Err(e) => return Err(e),
            }
        }
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
                for result in self.groups.commit_transaction_offsets_blocking(group, offsets) {
                    if let Some(code) = result.error {
                        tracing::warn!(group, topic = %result.topic, partition = result.partition, ?code, "a transactional offset was not stored");
                    }
                }
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
    pub fn abort_timed_out(&self) -> Result<(), BrokerError> {
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
        let partition = self.broker.require_partition(TRANSACTION_STATE_TOPIC, 0)?;
        let tombstones: Vec<(Bytes, Option<Bytes>)> = idle.iter().map(|id| (Bytes::from(id.clone()), None)).collect();
        self.broker.append_internal_blocking(&partition, internal_records::encode_batch(&tombstones, now))?;
        for id in &idle {
            state.remove(id);
        }
        tracing::info!(expired = idle.len(), "expired idle transactional ids");
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
