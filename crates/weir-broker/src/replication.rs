//! ISR replication: what the leader of a replicated partition tracks, and the operations a
//! follower's fetcher ([`crate::follower`]) applies.
//!
//! **Leader.** A follower fetches from its own log end, so the offset each of its fetches starts
//! at is its log end offset. The high watermark is the smallest log end over the *maximal* ISR:
//! the committed ISR plus an expansion sent to the controller and not committed yet (KIP-497).
//! A joining replica thus counts before it formally joins, and one leaving counts until its
//! removal is committed: the high watermark never passes what a replica that could be elected
//! lacks. The leader's own position is its log end, or what it has fsynced when the topic's
//! `flush.policy` is `sync`. Followers' positions are unknown (-1) when leadership begins, so
//! the high watermark waits until every in-sync follower has fetched from the new leader.
//!
//! **ISR changes** are proposals to the active controller (`AlterPartition`, sent by
//! [`crate::isr`]), which checks the
//! leader epoch and partition epoch they were computed from; the leader's view changes only when
//! the committed metadata does. One proposal per partition is in flight at a time. A follower
//! leaves the ISR when it has not caught up with the leader's log end for
//! `replica.lag.time.max.ms`, and joins it when it reaches the high watermark and the start of
//! the current leader epoch (Kafka's rules).
//!
//! **Follower.** `Broker::append_as_follower` ([`crate::follower`]) writes the leader's batches
//! with their offsets and epochs and takes the leader's high watermark as far as its own log
//! reaches; `Broker::truncate_follower` cuts a diverged tail, never below the high watermark
//! the follower learned, since every replica that could lead has everything below it.
//!
//! Partitions with one replica keep the log's own high watermark (it follows the log end, or
//! the fsynced end): the single-node path does not change.
//!
//! **Invariant** (asserted in debug builds by `ReplicaState::check_leader_high_watermark`
//! each time the leader moves it, under the replication lock): the leader's high watermark
//! never goes back, and never passes its own position or the position of any replica of the
//! maximal ISR as the leader knows it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use weir_storage::FlushPolicy;

use crate::error::{BrokerError, ErrorKind};
use crate::metadata::PartitionState;
use crate::partition::Partition;

/// What the leader knows of one follower, under the current leadership.
#[derive(Debug, Clone, Copy)]
struct Follower {
    /// The offset its last fetch started at; -1 until it fetched from this leadership.
    log_end: i64,
    /// The last time its log end reached the leader's (Kafka's lastCaughtUpTimeMs).
    last_caught_up: Instant,
    last_fetch: Instant,
    /// The leader's log end when the follower last fetched.
    last_fetch_leader_end: i64,
}

impl Follower {
    /// The follower as it stands after its fetch session's fetches up to `heartbeat` (see
    /// [`crate::watch::FollowerHeartbeats`]): each session fetch that did not read this
    /// partition was a fetch at `log_end`, the leader's end unmoved since `last_fetch`, and
    /// counts as Kafka's fetch-state update would (caught up if it was then).
    fn after_session_fetches(mut self, heartbeat: Option<Instant>) -> Follower {
        if let Some(at) = heartbeat.filter(|at| *at > self.last_fetch) {
            if self.log_end >= 0 && self.log_end >= self.last_fetch_leader_end {
                self.last_caught_up = self.last_caught_up.max(at);
            }
            self.last_fetch = at;
        }
        self
    }
}

/// How far one follower trails the leader, as the leader sees it (for `weir topic describe` and
/// `weir cluster health`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerLag {
    pub replica: i32,
    /// The leader's log end minus the follower's; `None` until it fetched from this leadership.
    pub offsets_behind: Option<i64>,
    /// Milliseconds since its log end last reached the leader's (Kafka's lastCaughtUpTimeMs): the
    /// follower leaves the ISR once this passes `replica.lag.time.max.ms`.
    pub caught_up_ms_ago: u64,
}

/// An ISR change proposed to the controller, not yet seen in the committed metadata.
#[derive(Debug, Clone)]
struct PendingIsr {
    isr: Vec<i32>,
    /// The partition epoch the proposal was computed from: a committed state with a later one
    /// settles it (accepted or not).
    partition_epoch: i32,
    sent: Instant,
}

/// A partition's replication state on this broker.
#[derive(Debug)]
pub(crate) struct ReplicaState {
    /// The leader epoch the positions below belong to; `None` when this broker does not lead.
    leading_epoch: Option<i32>,
    /// The log end when this leadership began: a follower joins the ISR only past it.
    epoch_start_offset: i64,
    followers: BTreeMap<i32, Follower>,
    pending_isr: Option<PendingIsr>,
    /// As a follower: the highest high watermark a leader sent this process. Truncation never
    /// goes below it.
    known_high_watermark: i64,
}

impl ReplicaState {
    pub(crate) fn new() -> ReplicaState {
        ReplicaState {
            leading_epoch: None,
            epoch_start_offset: 0,
            followers: BTreeMap::new(),
            pending_isr: None,
            known_high_watermark: 0,
        }
    }

    /// Asserts the invariant of the module doc (debug builds only; nothing in release): the
    /// leader `local` moved the high watermark from `previous` to `high_watermark`, with its
    /// own position at `own_position`, over `isr` (the committed ISR; the pending one is added
    /// here). Every follower of the maximal ISR has a known position at or above it.
    fn check_leader_high_watermark(
        &self,
        local: i32,
        isr: &[i32],
        previous: i64,
        high_watermark: i64,
        own_position: i64,
    ) {
        if !cfg!(debug_assertions) {
            return;
        }
        assert!(
            high_watermark >= previous,
            "the leader's high watermark went back from {previous} to {high_watermark}"
        );
        assert!(
            high_watermark <= own_position,
            "the leader's high watermark {high_watermark} passed its own position {own_position}"
        );
        let pending = self.pending_isr.as_ref().map_or(&[][..], |p| &p.isr[..]);
        for id in isr.iter().chain(pending).filter(|id| **id != local) {
            let position = self.followers.get(id).map_or(-1, |f| f.log_end);
            assert!(
                high_watermark <= position,
                "the high watermark {high_watermark} passed in-sync replica {id}'s position {position} (ISR {isr:?}, pending {pending:?})"
            );
        }
    }
}

/// A proposed ISR for the controller (Kafka's AlterPartition), decided by `weir-controller`.
pub use weir_controller::isr::IsrProposal;

/// How long a proposal may stay unsettled before the leader may propose again (the controller
/// lost it, or this broker missed the answer).
const PENDING_ISR_PATIENCE: Duration = Duration::from_secs(5);

/// How long the broker's own appends (offsets, transaction state, markers) wait for the ISR,
/// as Kafka's `offsets.commit.timeout.ms`.
pub(crate) const INTERNAL_REPLICATION_TIMEOUT: Duration = Duration::from_secs(5);

impl Partition {
    /// More than one replica: the high watermark follows the ISR, not the local log.
    pub(crate) fn is_replicated(&self) -> bool {
        self.state().replicas.len() > 1
    }

    /// Brings the replication state in line with a committed partition state (called with the
    /// new state in place): a new leadership starts with unknown follower positions; losing it
    /// drops them; a committed ISR settles the pending proposal. Wakes the waiters either way,
    /// so that `acks=all` produces see the change.
    pub(crate) fn on_state_change(&self, state: &PartitionState) {
        self.log.set_high_watermark_managed(state.replicas.len() > 1);
        {
            let mut replication = weir_storage::sync::lock(&self.replication);
            if state.leader == self.local_broker {
                let now = Instant::now();
                if replication.leading_epoch != Some(state.leader_epoch) {
                    // A new S for the native write protocol (`crate::session`).
                    self.mark_loaded(crate::partition::wall_clock_ms());
                    replication.leading_epoch = Some(state.leader_epoch);
                    replication.epoch_start_offset = self.log.log_end_offset();
                    replication.followers.clear();
                    replication.pending_isr = None;
                }
                let me = self.local_broker;
                replication.followers.retain(|id, _| state.replicas.contains(id));
                for &id in state.replicas.iter().filter(|id| **id != me) {
                    replication.followers.entry(id).or_insert(Follower {
                        log_end: -1,
                        last_caught_up: now,
                        last_fetch: now,
                        last_fetch_leader_end: -1,
                    });
                }
                if replication.pending_isr.as_ref().is_some_and(|p| state.partition_epoch > p.partition_epoch) {
                    replication.pending_isr = None;
                }
            } else {
                replication.leading_epoch = None;
                replication.followers.clear();
                replication.pending_isr = None;
            }
        }
        self.maybe_advance_high_watermark();
        self.wake_waiters();
    }

    /// Each follower's lag, in replica order, when this broker leads the partition; empty
    /// otherwise (a follower does not know the others' positions). `heartbeat`: each
    /// follower's last fetch through its fetch session (`Broker::follower_heartbeats`), which
    /// counts for the partitions it did not name, as in the ISR check.
    pub fn follower_lags(&self, heartbeat: impl Fn(i32) -> Option<Instant>) -> Vec<FollowerLag> {
        let state = self.state();
        if state.leader != self.local_broker {
            return Vec::new();
        }
        let now = Instant::now();
        let leader_end = self.log.log_end_offset();
        let replication = weir_storage::sync::lock(&self.replication);
        if replication.leading_epoch != Some(state.leader_epoch) {
            return Vec::new();
        }
        state
            .replicas
            .iter()
            .filter_map(|id| replication.followers.get(id).map(|f| (*id, f.after_session_fetches(heartbeat(*id)))))
            .map(|(replica, f)| FollowerLag {
                replica,
                offsets_behind: (f.log_end >= 0).then(|| (leader_end - f.log_end).max(0)),
                caught_up_ms_ago: u64::try_from(now.saturating_duration_since(f.last_caught_up).as_millis())
                    .unwrap_or(u64::MAX),
            })
            .collect()
    }

    /// This broker's own position in the ISR: its log end, or with `flush=sync` what is on disk.
    fn own_position(&self) -> i64 {
        if self.log.config().flush == FlushPolicy::Sync {
            self.log.durable_end_offset().min(self.log.log_end_offset())
        } else {
            self.log.log_end_offset()
        }
    }

    /// Moves the high watermark of a replicated partition this broker leads to the smallest
    /// position over the maximal ISR, and wakes the waiters if it moved.
    pub(crate) fn maybe_advance_high_watermark(&self) {
        let state = self.state();
        if state.replicas.len() <= 1 || state.leader != self.local_broker {
            return;
        }
        // Computed and set under the replication lock: two callers setting what each computed
        // after the other's check could move the high watermark back.
        let moved = {
            let replication = weir_storage::sync::lock(&self.replication);
            if replication.leading_epoch != Some(state.leader_epoch) {
                return;
            }
            let pending = replication.pending_isr.as_ref().map_or(&[][..], |p| &p.isr[..]);
            let own_position = self.own_position();
            let mut target = own_position;
            for id in state.isr.iter().chain(pending).filter(|id| **id != self.local_broker) {
                match replication.followers.get(id) {
                    Some(f) if f.log_end >= 0 => target = target.min(f.log_end),
                    // An in-sync follower that has not fetched from this leadership holds it.
                    _ => return,
                }
            }
            if self.log.is_memory_first() {
                // What the ISR has counts once the object store has it too: a replica being
                // added by a reassignment does not make a write durable.
                target = target.min(self.memory_persisted_end.load(std::sync::atomic::Ordering::Acquire));
            }
            let previous = self.log.high_watermark();
            let moved = target > previous && target <= self.log.log_end_offset();
            if moved {
                self.log.set_high_watermark(target);
                replication.check_leader_high_watermark(
                    self.local_broker,
                    &state.isr,
                    previous,
                    self.log.high_watermark(),
                    own_position,
                );
            }
            moved
        };
        if moved {
            self.wake_waiters();
        }
    }

    /// A follower fetched from `fetch_offset` (its log end) under the current leadership:
    /// record its position, move the high watermark, and return the ISR to propose if it
    /// should join. Called by the leader's fetch path once the fetch's epoch was checked.
    /// `session_heartbeat`: the follower's previous fetch through its fetch session, which did
    /// not read this partition if it is later than the last one that did. `may_join`: the
    /// follower's broker is unfenced (Kafka proposes only eligible replicas; the controller
    /// refuses a fenced one, and a pending proposal would hold the high watermark meanwhile).
    pub(crate) fn record_follower_fetch(
        &self,
        replica: i32,
        fetch_offset: i64,
        session_heartbeat: Option<Instant>,
        may_join: bool,
    ) -> Option<IsrProposal> {
        let state = self.state();
        if state.leader != self.local_broker || !state.replicas.contains(&replica) {
            return None;
        }
        let now = Instant::now();
        let leader_end = self.log.log_end_offset();
        let proposal = {
            let mut replication = weir_storage::sync::lock(&self.replication);
            if replication.leading_epoch != Some(state.leader_epoch) {
                return None;
            }
            let follower = replication.followers.entry(replica).or_insert(Follower {
                log_end: -1,
                last_caught_up: now,
                last_fetch: now,
                last_fetch_leader_end: -1,
            });
            *follower = follower.after_session_fetches(session_heartbeat);
            if fetch_offset >= leader_end {
                follower.last_caught_up = follower.last_caught_up.max(now);
            } else if fetch_offset >= follower.last_fetch_leader_end {
                follower.last_caught_up = follower.last_caught_up.max(follower.last_fetch);
            }
            follower.log_end = fetch_offset;
            follower.last_fetch = now;
            follower.last_fetch_leader_end = leader_end;
            let joins = may_join
                && !state.isr.contains(&replica)
                && replication.pending_isr.is_none()
                && fetch_offset >= self.log.high_watermark()
                && fetch_offset >= replication.epoch_start_offset;
            joins.then(|| {
                let mut isr = state.isr.clone();
                isr.push(replica);
                self.propose(&mut replication, &state, isr)
            })
        };
        self.maybe_advance_high_watermark();
        proposal
    }

    /// The ISR without the followers that have not caught up for `lag`, if any should go.
    /// `heartbeat`: each follower's last fetch through its fetch session.
    pub(crate) fn isr_to_shrink(
        &self,
        lag: Duration,
        heartbeat: impl Fn(i32) -> Option<Instant>,
    ) -> Option<IsrProposal> {
        let state = self.state();
        if state.leader != self.local_broker || state.isr.len() <= 1 {
            return None;
        }
        let now = Instant::now();
        let mut replication = self.replication_for_check(&state, now)?;
        let lagging = |id: &i32| {
            *id != self.local_broker
                && replication.followers.get(id).is_none_or(|f| {
                    let f = f.after_session_fetches(heartbeat(*id));
                    now.saturating_duration_since(f.last_caught_up) > lag
                })
        };
        let isr: Vec<i32> = state.isr.iter().copied().filter(|id| !lagging(id)).collect();
        if isr.len() == state.isr.len() {
            return None;
        }
        Some(self.propose(&mut replication, &state, isr))
    }

    /// A follower outside the ISR that has caught up (at or past the high watermark and the
    /// start of this leadership), still fetches, and may join (`eligible`: its broker is
    /// unfenced), when the fetch that took it there did not propose it: its broker was fenced
    /// then, or the controller refused or lost the proposal. Through a fetch session a caught-up
    /// follower of an idle partition names it no more, so no later fetch would propose it
    /// (Kafka re-reads every session partition on each fetch instead). The periodic check asks.
    pub(crate) fn isr_to_expand(
        &self,
        lag: Duration,
        heartbeat: impl Fn(i32) -> Option<Instant>,
        eligible: impl Fn(i32) -> bool,
    ) -> Option<IsrProposal> {
        let state = self.state();
        if state.leader != self.local_broker || state.isr.len() >= state.replicas.len() {
            return None;
        }
        let now = Instant::now();
        let mut replication = self.replication_for_check(&state, now)?;
        let high_watermark = self.log.high_watermark();
        let joining = state.replicas.iter().copied().find(|id| {
            *id != self.local_broker
                && !state.isr.contains(id)
                && eligible(*id)
                && replication.followers.get(id).is_some_and(|f| {
                    let f = f.after_session_fetches(heartbeat(*id));
                    f.log_end >= high_watermark
                        && f.log_end >= replication.epoch_start_offset
                        && now.saturating_duration_since(f.last_fetch) <= lag
                })
        })?;
        let mut isr = state.isr.clone();
        isr.push(joining);
        Some(self.propose(&mut replication, &state, isr))
    }

    /// The replication state for a periodic ISR check of leadership `state`: `None` when this
    /// leadership's positions are not there yet, or a proposal is in flight and not overdue.
    fn replication_for_check(
        &self,
        state: &PartitionState,
        now: Instant,
    ) -> Option<std::sync::MutexGuard<'_, ReplicaState>> {
        let replication = weir_storage::sync::lock(&self.replication);
        if replication.leading_epoch != Some(state.leader_epoch) {
            return None;
        }
        let waiting = replication
            .pending_isr
            .as_ref()
            .is_some_and(|pending| now.saturating_duration_since(pending.sent) < PENDING_ISR_PATIENCE);
        (!waiting).then_some(replication)
    }

    fn propose(&self, replication: &mut ReplicaState, state: &PartitionState, isr: Vec<i32>) -> IsrProposal {
        replication.pending_isr =
            Some(PendingIsr { isr: isr.clone(), partition_epoch: state.partition_epoch, sent: Instant::now() });
        IsrProposal {
            topic: self.topic.clone(),
            topic_id: self.topic_id,
            partition: self.index,
            leader: self.local_broker,
            leader_epoch: state.leader_epoch,
            partition_epoch: state.partition_epoch,
            isr,
        }
    }

    /// The controller refused or lost a proposal: the next fetch or check may propose again.
    pub(crate) fn drop_pending_isr(&self, proposal: &IsrProposal) {
        let mut replication = weir_storage::sync::lock(&self.replication);
        if replication.pending_isr.as_ref().is_some_and(|p| p.isr == proposal.isr) {
            replication.pending_isr = None;
        }
    }

    /// Waits until the ISR has every offset below `end_offset`, written by this broker as leader
    /// at `leader_epoch` (`acks=all`). Fails when leadership moves first, when the ISR is below
    /// `min.insync.replicas` once it has it, or at `deadline`.
    pub(crate) async fn wait_replicated(
        &self,
        end_offset: i64,
        leader_epoch: i32,
        deadline: tokio::time::Instant,
    ) -> Result<(), BrokerError> {
        self.wait_high_watermark(end_offset, leader_epoch, deadline, true).await
    }

    /// Waits until the high watermark of a memory-first partition passes `end_offset`: the
    /// object store has the write (see `crate::memory`). Fails when leadership moves first, or
    /// at `deadline`.
    pub(crate) async fn wait_persisted(
        &self,
        end_offset: i64,
        leader_epoch: i32,
        deadline: tokio::time::Instant,
    ) -> Result<(), BrokerError> {
        self.wait_high_watermark(end_offset, leader_epoch, deadline, false).await
    }

    async fn wait_high_watermark(
        &self,
        end_offset: i64,
        leader_epoch: i32,
        deadline: tokio::time::Instant,
        check_isr: bool,
    ) -> Result<(), BrokerError> {
        loop {
            let waiter = Arc::new(Notify::new());
            self.register_waiter(&waiter);
            let state = self.state();
            if self.closing.load(std::sync::atomic::Ordering::Acquire) {
                return Err(BrokerError::new(
                    ErrorKind::NotLeader,
                    format!("{}-{}: the broker is shutting down", self.topic, self.index),
                ));
            }
            if state.leader != self.local_broker || state.leader_epoch != leader_epoch {
                return Err(BrokerError::new(
                    ErrorKind::NotLeader,
                    format!(
                        "{}-{}: leadership moved (now broker {} at epoch {}) before the in-sync replicas had the write",
                        self.topic, self.index, state.leader, state.leader_epoch
                    ),
                ));
            }
            if self.log.high_watermark() >= end_offset {
                let min_isr = self.min_insync_replicas();
                if check_isr && (state.isr.len() as i64) < min_isr {
                    return Err(BrokerError::new(
                        ErrorKind::NotEnoughReplicasAfterAppend,
                        format!(
                            "{}-{}: written, but the ISR ({}) shrank below min.insync.replicas ({min_isr})",
                            self.topic,
                            self.index,
                            state.isr.len()
                        ),
                    ));
                }
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, waiter.notified()).await.is_err() {
                let waited_for = if check_isr {
                    format!("the in-sync replicas {:?} did not replicate", state.isr)
                } else {
                    "the object store did not take".to_string()
                };
                return Err(BrokerError::new(
                    ErrorKind::TimedOut,
                    format!(
                        "{}-{}: {waited_for} offset {} in time (high watermark {})",
                        self.topic,
                        self.index,
                        end_offset - 1,
                        self.log.high_watermark()
                    ),
                ));
            }
        }
    }

    /// The broker is shutting down: writes waiting for the ISR answer now.
    pub(crate) fn stop_waits(&self) {
        self.closing.store(true, std::sync::atomic::Ordering::Release);
        self.wake_waiters();
    }

    /// As a follower: the high watermark the leader sent, as far as this log reaches.
    pub(crate) fn follow_high_watermark(&self, leader_high_watermark: i64) {
        let target = leader_high_watermark.min(self.log.log_end_offset());
        {
            let mut replication = weir_storage::sync::lock(&self.replication);
            replication.known_high_watermark = replication.known_high_watermark.max(target);
        }
        if target > self.log.high_watermark() {
            self.log.set_high_watermark(target);
            self.wake_waiters();
        }
    }

    /// The highest high watermark a leader told this broker (as a follower, in this process).
    pub(crate) fn known_high_watermark(&self) -> i64 {
        weir_storage::sync::lock(&self.replication).known_high_watermark
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_storage::testing::{batch, BatchSpec};
    use weir_storage::{DeletionQueue, Log, LogConfig, OpenOptions, SystemClock};

    /// Partition 0 of "t" with replicas 1, 2, 3, all in sync, led here (broker 1) at epoch 0.
    fn led_partition(dir: &std::path::Path, isr: &[i32]) -> Partition {
        let log = Log::open(
            dir,
            LogConfig::default(),
            Arc::new(SystemClock),
            OpenOptions::default(),
            Arc::new(DeletionQueue::new()),
        )
        .unwrap();
        let mut state = PartitionState::new(vec![1, 2, 3]);
        state.isr = isr.to_vec();
        Partition::new("t".into(), uuid::Uuid::new_v4(), 0, Arc::new(log), false, 1, state)
    }

    fn append(partition: &Partition, records: usize) {
        let mut bytes = batch(&BatchSpec { records, ..BatchSpec::default() });
        partition.log.append(&mut bytes, partition.leader_epoch()).unwrap();
        partition.maybe_advance_high_watermark();
    }

    #[test]
    fn a_deposed_leader_appends_no_client_batch_and_a_new_leader_no_replicated_one() {
        let dir = tempfile::tempdir().unwrap();
        let p = led_partition(dir.path(), &[1, 2, 3]);
        // The request was checked at epoch 0; broker 2 took over before its turn to write.
        let mut next = (*p.state()).clone();
        next.leader = 2;
        next.leader_epoch = 1;
        next.partition_epoch = 1;
        p.set_state(next.clone());
        let mut bytes = batch(&BatchSpec { records: 3, ..BatchSpec::default() });
        let refused = p.write_as_leader(0, || p.log.append(&mut bytes, 0).map_err(BrokerError::from));
        assert_eq!(refused.err().map(|e| e.kind), Some(ErrorKind::NotLeader));
        assert_eq!(p.log.log_end_offset(), 0, "nothing was written");
        // Following broker 2 at epoch 1: a late answer to a fetch sent for another leader or
        // epoch writes nothing (a deposed leader's tail must not enter this log).
        for (leader, epoch) in [(2, 0), (3, 1)] {
            let stale = p.write_as_follower(leader, epoch, || Ok::<_, BrokerError>(()));
            assert_eq!(stale.err().map(|e| e.kind), Some(ErrorKind::FencedLeaderEpoch), "{leader}@{epoch}");
        }
        assert!(p.write_as_follower(2, 1, || Ok::<_, BrokerError>(())).is_ok());
        // Leading again (epoch 2): the fetcher's late batches are refused, a client's taken.
        next.leader = 1;
        next.leader_epoch = 2;
        next.partition_epoch = 2;
        p.set_state(next);
        let late = p.write_as_follower(2, 1, || Ok::<_, BrokerError>(()));
        assert_eq!(late.err().map(|e| e.kind), Some(ErrorKind::NotLeader));
        let written = p.write_as_leader(2, || p.log.append(&mut bytes, 2).map_err(BrokerError::from));
        assert!(written.is_ok(), "{written:?}");
    }

    #[test]
    fn the_high_watermark_is_the_smallest_position_over_the_isr_once_every_follower_fetched() {
        let dir = tempfile::tempdir().unwrap();
        let p = led_partition(dir.path(), &[1, 2, 3]);
        append(&p, 10);
        assert_eq!(p.log.high_watermark(), 0, "followers' positions are unknown: nothing is acknowledged");
        assert_eq!(p.record_follower_fetch(2, 10, None, true), None);
        assert_eq!(p.log.high_watermark(), 0, "follower 3 has not fetched yet");
        assert_eq!(p.record_follower_fetch(3, 4, None, true), None);
        assert_eq!(p.log.high_watermark(), 4);
        p.record_follower_fetch(3, 10, None, true);
        assert_eq!(p.log.high_watermark(), 10);
        append(&p, 5);
        assert_eq!(p.log.high_watermark(), 10, "the leader's own append does not count for the others");
        // A replica outside the ISR does not hold the high watermark back.
        let dir2 = tempfile::tempdir().unwrap();
        let alone = led_partition(dir2.path(), &[1]);
        append(&alone, 3);
        assert_eq!(alone.log.high_watermark(), 3);
    }

    #[test]
    fn a_caught_up_follower_whose_fetch_could_not_propose_it_is_proposed_by_the_check() {
        let dir = tempfile::tempdir().unwrap();
        let p = led_partition(dir.path(), &[1, 2]);
        append(&p, 10);
        p.record_follower_fetch(2, 10, None, true);
        // Replica 3 catches up while its broker is fenced: its fetch proposes nothing, and
        // through a fetch session no later fetch names the idle partition.
        assert_eq!(p.record_follower_fetch(3, 10, None, false), None);
        let lag = Duration::from_secs(10);
        assert_eq!(p.isr_to_expand(lag, |_| None, |_| false), None, "still fenced");
        let proposal = p.isr_to_expand(lag, |_| None, |_| true).expect("unfenced and caught up");
        assert_eq!(proposal.isr, vec![1, 2, 3]);
        assert_eq!(p.isr_to_expand(lag, |_| None, |_| true), None, "one proposal in flight at a time");
        p.drop_pending_isr(&proposal);
        // A follower that stopped fetching is not brought back.
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(p.isr_to_expand(Duration::from_millis(1), |_| None, |_| true), None, "no recent fetch");
    }

    #[test]
    fn a_follower_that_reaches_the_high_watermark_is_proposed_for_the_isr_once() {
        let dir = tempfile::tempdir().unwrap();
        let p = led_partition(dir.path(), &[1, 2]);
        append(&p, 10);
        p.record_follower_fetch(2, 10, None, true);
        assert_eq!(p.log.high_watermark(), 10);
        assert_eq!(p.record_follower_fetch(3, 5, None, true), None, "below the high watermark: not in sync yet");
        assert_eq!(p.record_follower_fetch(3, 10, None, false), None, "a fenced broker is not proposed");
        let proposal = p.record_follower_fetch(3, 10, None, true).expect("caught up: propose it");
        assert_eq!((proposal.isr.clone(), proposal.leader, proposal.partition_epoch), (vec![1, 2, 3], 1, 0));
        assert_eq!(p.record_follower_fetch(3, 10, None, true), None, "one proposal in flight at a time");
        // While pending, the joining replica counts for the high watermark (the maximal ISR).
        append(&p, 5);
        p.record_follower_fetch(2, 15, None, true);
        assert_eq!(p.log.high_watermark(), 10, "replica 3 is at 10");
        // The committed ISR settles the proposal.
        let mut committed = (*p.state()).clone();
        committed.isr = vec![1, 2, 3];
        committed.partition_epoch += 1;
        p.set_state(committed);
        assert!(weir_storage::sync::lock(&p.replication).pending_isr.is_none());
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "passed in-sync replica 3's position")]
    fn a_high_watermark_past_an_in_sync_follower_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let p = led_partition(dir.path(), &[1, 2, 3]);
        append(&p, 10);
        p.record_follower_fetch(2, 10, None, true);
        p.record_follower_fetch(3, 4, None, true);
        weir_storage::sync::lock(&p.replication).check_leader_high_watermark(1, &[1, 2, 3], 4, 10, 10);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "went back")]
    fn a_high_watermark_that_goes_back_on_the_leader_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let p = led_partition(dir.path(), &[1, 2]);
        append(&p, 10);
        p.record_follower_fetch(2, 10, None, true);
        weir_storage::sync::lock(&p.replication).check_leader_high_watermark(1, &[1, 2], 10, 8, 10);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "passed its own position")]
    fn a_high_watermark_past_the_leaders_own_position_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let p = led_partition(dir.path(), &[1]);
        append(&p, 10);
        weir_storage::sync::lock(&p.replication).check_leader_high_watermark(1, &[1], 0, 11, 10);
    }

    #[test]
    fn followers_that_stop_catching_up_are_proposed_out_of_the_isr() {
        let dir = tempfile::tempdir().unwrap();
        let p = led_partition(dir.path(), &[1, 2, 3]);
        append(&p, 10);
        p.record_follower_fetch(2, 10, None, true);
        p.record_follower_fetch(3, 3, None, true);
        assert_eq!(p.isr_to_shrink(Duration::from_secs(60), |_| None), None, "nobody is late by a minute");
        std::thread::sleep(Duration::from_millis(30));
        p.record_follower_fetch(2, 10, None, true);
        let proposal = p.isr_to_shrink(Duration::from_millis(20), |_| None).expect("follower 3 is late");
        assert_eq!(proposal.isr, vec![1, 2]);
        // Until the change is committed, follower 3 still holds the high watermark.
        assert_eq!(p.log.high_watermark(), 3);
    }

    #[test]
    fn a_caught_up_follower_that_names_nothing_stays_in_the_isr_while_its_session_fetches() {
        let dir = tempfile::tempdir().unwrap();
        let p = led_partition(dir.path(), &[1, 2, 3]);
        append(&p, 10);
        p.record_follower_fetch(2, 10, None, true);
        p.record_follower_fetch(3, 10, None, true);
        std::thread::sleep(Duration::from_millis(30));
        // Nothing changed, so neither names the partition again; only 2's session fetches.
        let beat = Instant::now();
        let proposal = p.isr_to_shrink(Duration::from_millis(20), |id| (id == 2).then_some(beat));
        assert_eq!(proposal.map(|p| p.isr), Some(vec![1, 2]), "3 went silent; 2 is caught up and fetching");

        // An append after the follower's last session fetch: it was caught up until then, so it
        // is not late yet, though its last real read of the partition is.
        let dir2 = tempfile::tempdir().unwrap();
        let q = led_partition(dir2.path(), &[1, 2]);
        append(&q, 10);
        q.record_follower_fetch(2, 10, None, true);
        std::thread::sleep(Duration::from_millis(30));
        let beat = Instant::now();
        append(&q, 1);
        assert_eq!(q.isr_to_shrink(Duration::from_millis(20), |_| Some(beat)), None);
        assert!(q.isr_to_shrink(Duration::from_millis(20), |_| None).is_some(), "without the session it is late");
        // Its next fetch reads the partition; the session fetch before it counts as caught up.
        assert_eq!(q.record_follower_fetch(2, 11, Some(beat), true), None);
        assert_eq!(q.log.high_watermark(), 11);
    }

    #[tokio::test]
    async fn acks_all_waits_for_the_isr_and_fails_when_leadership_moves() {
        let dir = tempfile::tempdir().unwrap();
        let p = Arc::new(led_partition(dir.path(), &[1, 2]));
        append(&p, 4);
        let deadline = tokio::time::Instant::now() + Duration::from_millis(100);
        let late = p.wait_replicated(4, 0, deadline).await.unwrap_err();
        assert_eq!(late.kind, ErrorKind::TimedOut);
        let waiting = {
            let p = p.clone();
            tokio::spawn(
                async move { p.wait_replicated(4, 0, tokio::time::Instant::now() + Duration::from_secs(10)).await },
            )
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        p.record_follower_fetch(2, 4, None, true);
        waiting.await.unwrap().unwrap();

        append(&p, 1);
        let moved = {
            let p = p.clone();
            tokio::spawn(
                async move { p.wait_replicated(5, 0, tokio::time::Instant::now() + Duration::from_secs(10)).await },
            )
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut failover = (*p.state()).clone();
        failover.leader = 2;
        failover.leader_epoch += 1;
        failover.partition_epoch += 1;
        failover.isr = vec![2];
        p.set_state(failover);
        assert_eq!(moved.await.unwrap().unwrap_err().kind, ErrorKind::NotLeader);
    }
}
