//! Fetch: reading partitions with long polling, the one read path of every front-end (Kafka's
//! Fetch, HTTP consume; RocketMQ's receive and follower replication build on it).
//!
//! A fetch reads every wanted partition once, in order, up to its isolation's bound (the high
//! watermark, or the last stable offset for `read_committed`), honouring the request's
//! `max_bytes`, each partition's `max_bytes`, and Kafka's at-least-one-batch rule: the first
//! partition that has data returns at least its first batch, whatever the limits, so a consumer
//! never starves on a large batch. When fewer than `min_bytes` are available it parks until an
//! append wakes it, `max_wait` passes or the broker shuts down; there is no polling loop.
//!
//! Wake-ups are never lost: after a read that found too little, the fetch registers its waiter
//! on every partition and then checks whether any high watermark moved since that read. An
//! append that lands before the registration is seen by the check; one after it notifies the
//! waiter (a `Notify` keeps the permit if the wait has not started yet). Fetches that find data
//! at once never touch the waiter lists.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use weir_storage::{AbortedTxn, FileSlice};

use crate::error::{BrokerError, ErrorKind};
use crate::partition::Partition;
use crate::replication::IsrProposal;
use crate::Broker;

pub use crate::partition::Isolation;

/// One partition to read.
#[derive(Clone)]
pub struct FetchPartition {
    pub partition: Arc<Partition>,
    /// The first offset wanted.
    pub offset: i64,
    /// At most this many bytes from this partition (the at-least-one-batch rule aside).
    pub max_bytes: u64,
    /// The leader epoch the caller believes current, checked against the partition's; `None`
    /// when it does not say (old clients, HTTP).
    pub current_leader_epoch: Option<i32>,
    /// A follower's fetch: the epoch of the last batch it has, so the leader can tell where
    /// their logs diverge (Fetch v12+). `None` otherwise.
    pub last_fetched_epoch: Option<i32>,
}

/// A fetch over several partitions.
#[derive(Clone)]
pub struct FetchRequest {
    pub partitions: Vec<FetchPartition>,
    /// At most this many bytes in all (the at-least-one-batch rule aside).
    pub max_bytes: u64,
    /// Return once this many bytes are available; 0 returns at once.
    pub min_bytes: u64,
    /// The longest the fetch parks waiting for `min_bytes`.
    pub max_wait: Duration,
    pub isolation: Isolation,
    /// The broker id of a follower replicating the partitions (Kafka's replica id); `None` for
    /// a consumer. A follower reads up to the log end, not the high watermark, and its fetch
    /// offset is its position in the ISR.
    pub replica_id: Option<i32>,
    /// A consumer that may read from a follower (Kafka's Fetch v11+, KIP-392): a follower of
    /// the partition serves it up to its own high watermark instead of refusing.
    pub follower_reads: bool,
    /// The consumer's rack (`client.rack`): with `replica.selector.class` rack-aware, the leader
    /// points it to an in-sync replica in that rack.
    pub client_rack: Option<String>,
    /// A follower's fetch through a fetch session: the session's previous fetch, which read
    /// only the partitions that changed (see [`crate::watch::FollowerHeartbeats`]).
    pub session_heartbeat: Option<std::time::Instant>,
}

/// A partition's offsets, as a fetch found them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionOffsets {
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
}

impl PartitionOffsets {
    fn of(partition: &Partition) -> PartitionOffsets {
        let log = &partition.log;
        PartitionOffsets {
            high_watermark: log.high_watermark(),
            last_stable_offset: log.last_stable_offset(),
            log_start_offset: log.log_start_offset(),
        }
    }
}

/// What a fetch found in one partition, in request order.
#[derive(Debug, Clone)]
pub struct FetchedPartition {
    /// Why nothing was read (offset out of range, fenced epoch, ...).
    pub error: Option<BrokerError>,
    /// The partition's offsets, also with an error; `None` when the partition could not be
    /// read at all (it is not hosted here).
    pub offsets: Option<PartitionOffsets>,
    /// Whole batches from the batch that holds the wanted offset; `None` when there is nothing
    /// (yet) at or after it below the bound.
    pub slice: Option<FileSlice>,
    /// With [`Isolation::Committed`]: the aborted transactions overlapping the slice (empty
    /// without a slice). `None` otherwise.
    pub aborted: Option<Vec<AbortedTxn>>,
    /// For a follower whose log diverged from the leader's: the epoch and end offset on the
    /// leader of the last epoch they share (Kafka's DivergingEpoch); nothing is read then.
    pub diverging_epoch: Option<(i32, i64)>,
    /// The replica the consumer should read from instead of this leader (KIP-392); nothing is
    /// read then.
    pub preferred_read_replica: Option<i32>,
}

impl FetchedPartition {
    fn failed(error: BrokerError, partition: Option<&Partition>) -> FetchedPartition {
        FetchedPartition {
            error: Some(error),
            offsets: partition.map(PartitionOffsets::of),
            slice: None,
            aborted: None,
            diverging_epoch: None,
            preferred_read_replica: None,
        }
    }

    /// Nothing read: the follower must truncate first.
    fn diverged(partition: &Partition, diverging: (i32, i64)) -> FetchedPartition {
        FetchedPartition {
            error: None,
            offsets: Some(PartitionOffsets::of(partition)),
            slice: None,
            aborted: None,
            diverging_epoch: Some(diverging),
            preferred_read_replica: None,
        }
    }

    /// Nothing read (a throttled replica whose budget is spent).
    fn empty(partition: &Partition) -> FetchedPartition {
        FetchedPartition { diverging_epoch: None, ..FetchedPartition::diverged(partition, (0, 0)) }
    }

    /// Nothing read: the consumer reads from `replica` (in its rack) instead.
    fn redirected(partition: &Partition, replica: i32) -> FetchedPartition {
        FetchedPartition {
            diverging_epoch: None,
            preferred_read_replica: Some(replica),
            ..FetchedPartition::diverged(partition, (0, 0))
        }
    }

    pub fn bytes(&self) -> u64 {
        self.slice.as_ref().map_or(0, |s| s.len)
    }
}

impl Broker {
    /// Reads `request.partitions`, parking until `min_bytes` are available, `max_wait` passes, a
    /// partition fails, or the broker shuts down. Returns one entry per wanted partition, in
    /// order; the bytes returned are counted in each partition's `bytes_out`.
    pub async fn fetch(self: &Arc<Self>, request: FetchRequest) -> Result<Vec<FetchedPartition>, BrokerError> {
        let deadline = tokio::time::Instant::now() + request.max_wait;
        let request = Arc::new(request);
        let found = loop {
            let (broker, wanted) = (self.clone(), request.clone());
            let (mut found, seen_bounds, proposals, remote) =
                tokio::task::spawn_blocking(move || broker.read_once(&wanted))
                    .await
                    .map_err(|e| BrokerError::internal(format!("fetch task failed: {e}")))?;
            if !remote.is_empty() {
                self.read_remote(&request, &mut found, remote).await;
            }
            for (partition, proposal) in proposals {
                self.send_isr_proposal(partition, proposal);
            }
            let bytes: u64 = found.iter().map(FetchedPartition::bytes).sum();
            // A failed partition, or a follower that must truncate first, answers at once.
            let failed = found
                .iter()
                .any(|f| f.error.is_some() || f.diverging_epoch.is_some() || f.preferred_read_replica.is_some());
            if bytes >= request.min_bytes
                || bytes > 0 && request.min_bytes == 0
                || failed
                || tokio::time::Instant::now() >= deadline
                || self.is_shutting_down()
            {
                break found;
            }
            // Not enough yet: register, then check that no bound (high watermark, or a
            // follower's log end) moved since the read (see the module doc), then park.
            let waiter = Arc::new(Notify::new());
            for wanted in &request.partitions {
                wanted.partition.register_waiter(&waiter);
            }
            let moved = request
                .partitions
                .iter()
                .zip(&seen_bounds)
                .any(|(wanted, seen)| request.bound(&wanted.partition) != *seen);
            if !moved {
                self.wait_for_data(&waiter, deadline).await;
            }
        };
        // Replication is not consumption: followers' fetches are not counted as bytes out.
        for (wanted, fetched) in request.partitions.iter().zip(&found).filter(|_| request.replica_id.is_none()) {
            if fetched.slice.is_some() {
                wanted.partition.metrics.bytes_out.add(fetched.bytes());
            }
        }
        Ok(found)
    }

    /// A remote read that found nothing below its bound, continued in the local log from its
    /// start (offsets between the two are a compacted topic's gap). As a remote read's answer.
    async fn read_local_after_gap(
        &self,
        partition: &Arc<Partition>,
        wanted: &RemoteWanted,
        isolation: Isolation,
    ) -> Result<Option<weir_tier::RemoteRead>, weir_tier::TierError> {
        let log = Arc::clone(&partition.log);
        let (max_bytes, upper, min_one_batch) = (wanted.max_bytes, wanted.upper, wanted.min_one_batch);
        let read = tokio::task::spawn_blocking(move || -> Result<_, weir_storage::StorageError> {
            let from = log.local_log_start_offset();
            let Some(slice) = log.read_with(from, max_bytes, upper, min_one_batch)?.slice else { return Ok(None) };
            let aborted = match isolation {
                Isolation::Committed => log.aborted_transactions(slice.first_offset, slice.next_offset),
                Isolation::HighWatermark => Vec::new(),
            };
            Ok(Some(weir_tier::RemoteRead { slice, aborted }))
        })
        .await
        .map_err(|e| weir_tier::TierError::Io {
            context: "a local read".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        read.map_err(weir_tier::TierError::from)
    }

    /// Reads what [`Broker::read_once`] left to the object store (offsets of a tiered
    /// partition below its local log start), into their places in `found`.
    async fn read_remote(&self, request: &FetchRequest, found: &mut [FetchedPartition], remote: Vec<RemoteWanted>) {
        let Some(tier) = self.tier.clone() else { return };
        for wanted in remote {
            let partition = &wanted.partition;
            let tiered = tier.partition(&partition.topic, partition.topic_id, partition.index);
            let mut read = tiered.read(wanted.offset, wanted.max_bytes, wanted.upper, wanted.min_one_batch).await;
            if matches!(read, Ok(None)) {
                // Nothing left in the store's part from the offset on (a compacted topic's
                // gap): the batches go on in the local log.
                read = self.read_local_after_gap(partition, &wanted, request.isolation).await;
            }
            found[wanted.at] = match read {
                Ok(read) => FetchedPartition {
                    error: None,
                    offsets: Some(PartitionOffsets::of(partition)),
                    aborted: (request.isolation == Isolation::Committed)
                        .then(|| read.as_ref().map(|r| r.aborted.clone()).unwrap_or_default()),
                    slice: read.map(|r| r.slice),
                    diverging_epoch: None,
                    preferred_read_replica: None,
                },
                Err(weir_tier::TierError::NotInStore(offset)) => {
                    let log = &partition.log;
                    let error = BrokerError::new(
                        ErrorKind::OffsetOutOfRange,
                        format!(
                            "offset {offset} is neither on local disk (from {}) nor in the object store",
                            log.local_log_start_offset()
                        ),
                    );
                    FetchedPartition::failed(error, Some(partition))
                }
                Err(e) => {
                    tracing::warn!(topic = %partition.topic, partition = partition.index, offset = wanted.offset, error = %e, "a read from the object store failed");
                    let error = BrokerError::new(ErrorKind::Storage, format!("reading the object store: {e}"));
                    FetchedPartition::failed(error, Some(partition))
                }
            };
        }
    }

    /// One pass over the wanted partitions; also returns the bound each had before its read,
    /// the ISR changes followers' fetches call for, and the reads left to the object store.
    /// Blocking (reads index and segment headers).
    #[allow(clippy::type_complexity)]
    fn read_once(
        &self,
        request: &FetchRequest,
    ) -> (Vec<FetchedPartition>, Vec<i64>, Vec<(Arc<Partition>, IsrProposal)>, Vec<RemoteWanted>) {
        let mut total: u64 = 0;
        let mut out = Vec::with_capacity(request.partitions.len());
        let mut seen = Vec::with_capacity(request.partitions.len());
        let mut proposals = Vec::new();
        let mut remote = Vec::new();
        // A follower's broker may join ISRs only while unfenced (one just fenced, or back and
        // catching up with the metadata, still fetches).
        let may_join = request.replica_id.is_some_and(|r| self.metadata().brokers.get(&r).is_some_and(|b| !b.fenced));
        for wanted in &request.partitions {
            let partition = &wanted.partition;
            let log = &partition.log;
            seen.push(request.bound(partition));
            // The leader serves reads; a follower serves consumers that may read from one.
            let state = partition.state();
            let leading = state.leader == self.config.node_id;
            let as_follower = !leading
                && request.follower_reads
                && request.replica_id.is_none()
                && state.replicas.contains(&self.config.node_id);
            let checked = if as_follower { Ok(state.clone()) } else { partition.check_local_leader() };
            if let Err(e) = checked.and_then(|_| partition.check_leader_epoch(wanted.current_leader_epoch)) {
                out.push(FetchedPartition::failed(e, Some(partition)));
                continue;
            }
            if leading && request.replica_id.is_none() {
                if let Some(replica) = self.preferred_read_replica(&state, request.client_rack.as_deref()) {
                    out.push(FetchedPartition::redirected(partition, replica));
                    continue;
                }
            }
            if let Some(replica) = request.replica_id {
                match diverging_epoch(partition, wanted) {
                    Ok(Some(diverging)) => {
                        out.push(FetchedPartition::diverged(partition, diverging));
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        out.push(FetchedPartition::failed(e, Some(partition)));
                        continue;
                    }
                }
                if wanted.offset <= log.log_end_offset() && wanted.offset >= log.log_start_offset() {
                    if let Some(proposal) =
                        partition.record_follower_fetch(replica, wanted.offset, request.session_heartbeat, may_join)
                    {
                        proposals.push((partition.clone(), proposal));
                    }
                }
            }
            // A reassignment's copy waits while the leader's throttle budget is spent.
            let throttled = request.replica_id.is_some_and(|replica| partition.throttles_for_leader(&state, replica));
            if throttled && self.replication_quotas.leader.exceeded() {
                out.push(FetchedPartition::empty(partition));
                continue;
            }
            let limit = request.max_bytes.saturating_sub(total).min(wanted.max_bytes);
            let min_one_batch = total == 0;
            let upper = match (request.replica_id, request.isolation) {
                (Some(_), _) => log.log_end_offset(),
                (None, Isolation::HighWatermark) => log.high_watermark(),
                (None, Isolation::Committed) => log.last_stable_offset(),
            };
            if request.replica_id.is_some() && self.replicas_skip_store(partition, wanted.offset) {
                // A replica does not copy what the store holds: it starts where the store ends
                // (KIP-405's OFFSET_MOVED_TO_TIERED_STORAGE; see `follower`).
                let error = BrokerError::new(
                    ErrorKind::OffsetMovedToTieredStorage,
                    format!(
                        "offset {} is only in the object store; this log's local part starts at {}",
                        wanted.offset,
                        log.local_log_start_offset()
                    ),
                );
                out.push(FetchedPartition::failed(error, Some(partition)));
                continue;
            }
            if (limit > 0 || min_one_batch) && self.reads_remote(partition, wanted.offset) {
                // Read after this pass, asynchronously; its budget is taken now.
                remote.push(RemoteWanted {
                    at: out.len(),
                    partition: Arc::clone(partition),
                    offset: wanted.offset,
                    max_bytes: limit,
                    upper,
                    min_one_batch,
                });
                total += limit;
                out.push(FetchedPartition::empty(partition));
                continue;
            }
            let read = if limit == 0 && !min_one_batch {
                Ok(None)
            } else {
                log.read_with(wanted.offset, limit, upper, min_one_batch).map(|r| r.slice).map_err(BrokerError::from)
            };
            match read {
                Ok(slice) => {
                    total += slice.as_ref().map_or(0, |s| s.len);
                    if throttled {
                        self.replication_quotas.leader.record(slice.as_ref().map_or(0, |s| s.len));
                    }
                    // A read_committed consumer must drop the records of transactions aborted in
                    // what it receives.
                    let aborted = (request.isolation == Isolation::Committed).then(|| match &slice {
                        Some(s) => log.aborted_transactions(s.first_offset, s.next_offset),
                        None => Vec::new(),
                    });
                    out.push(FetchedPartition {
                        error: None,
                        offsets: Some(PartitionOffsets::of(partition)),
                        slice,
                        aborted,
                        diverging_epoch: None,
                        preferred_read_replica: None,
                    });
                }
                Err(e) => {
                    if e.kind != ErrorKind::OffsetOutOfRange {
                        tracing::warn!(topic = %partition.topic, partition = partition.index, error = %e, "fetch failed");
                    }
                    out.push(FetchedPartition::failed(e, Some(partition)));
                }
            }
        }
        (out, seen, proposals, remote)
    }
}

/// A read [`Broker::read_once`] leaves to the object store: where its answer goes in the
/// fetch's list, and what it may read.
struct RemoteWanted {
    at: usize,
    partition: Arc<Partition>,
    offset: i64,
    max_bytes: u64,
    upper: i64,
    min_one_batch: bool,
}

impl Broker {
    /// KIP-392's rack-aware selector: for a consumer in `rack`, an in-sync replica on a live
    /// broker of that rack, unless this leader is in it (or the selector is off).
    fn preferred_read_replica(&self, state: &crate::metadata::PartitionState, rack: Option<&str>) -> Option<i32> {
        let rack = rack.filter(|r| !r.is_empty() && self.config.rack_aware_reads)?;
        if self.config.rack.as_deref() == Some(rack) {
            return None;
        }
        let metadata = self.metadata();
        state.isr.iter().copied().find(|id| {
            *id != self.config.node_id
                && metadata.brokers.get(id).is_some_and(|b| !b.fenced && b.rack.as_deref() == Some(rack))
        })
    }
}

impl FetchRequest {
    /// Where this fetch stops reading in `partition`: the log end for a follower, the high
    /// watermark for a consumer (whose `read_committed` bound moves only with it).
    fn bound(&self, partition: &Partition) -> i64 {
        match self.replica_id {
            Some(_) => partition.log.log_end_offset(),
            None => partition.log.high_watermark(),
        }
    }
}

/// Where a follower's log diverges from this leader's, if it does: the follower's last batch
/// has epoch `last_fetched_epoch`, and its log ends at the fetch offset. If this log's end for
/// that epoch is before the fetch offset, or the epoch is unknown here, the follower must
/// truncate to the answer (the last epoch both have, and its end here) before it goes on.
fn diverging_epoch(partition: &Partition, wanted: &FetchPartition) -> Result<Option<(i32, i64)>, BrokerError> {
    let Some(last_epoch) = wanted.last_fetched_epoch.filter(|e| *e >= 0) else { return Ok(None) };
    let (epoch, end_offset) = partition.log.end_offset_for_epoch(last_epoch)?;
    if epoch == last_epoch && end_offset >= wanted.offset {
        return Ok(None);
    }
    Ok(Some((epoch, end_offset)))
}
