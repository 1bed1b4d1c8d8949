//! The active controller's duties beyond topic changes: broker registrations, heartbeats,
//! fencing and the leader changes that follow, and the cluster's first record.
//!
//! Sessions live in the active controller's memory only (as in KRaft): a new controller starts
//! every registered broker's session afresh, so a failover fences nobody by itself; a broker
//! that died meanwhile is fenced one session timeout later. The leader changes are computed
//! from the applied state and committed with the fencing record, in one entry, so no node ever
//! sees a fenced broker still leading.

use std::collections::HashMap;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use uuid::Uuid;
use weir_storage::sync::lock;

use super::control::HeartbeatAnswer;
use crate::broker::Broker;
use crate::error::{BrokerError, ErrorKind};
use crate::metadata::{BrokerRegistration, MetadataRecord, MetadataState, TopicMetadata, NO_LEADER};
use crate::replication::IsrProposal;
use crate::runtime::block_on;

/// What the active controller knows of each broker's liveness.
#[derive(Debug, Default)]
pub struct Sessions {
    /// The Raft term these sessions belong to: a new term (a new controller) starts afresh.
    term: u64,
    brokers: HashMap<i32, Session>,
    /// When the leader balance was last checked (`auto.leader.rebalance.enable`).
    pub(crate) last_rebalance_check: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
struct Session {
    incarnation: Uuid,
    last_heartbeat: Instant,
    /// The broker is unfenced once it has applied the metadata up to here (its registration).
    catch_up_to: i64,
}

impl Sessions {
    /// Starts afresh if the controller's term changed since the sessions began.
    fn for_term(&mut self, term: u64) -> &mut Sessions {
        if self.term != term {
            self.term = term;
            self.brokers.clear();
        }
        self
    }
}

/// How often the active controller looks for expired sessions.
pub(crate) fn tick_interval(session_timeout_ms: u64) -> Duration {
    Duration::from_millis((session_timeout_ms / 8).clamp(50, 500))
}

impl Broker {
    fn term(&self) -> u64 {
        self.quorum.status().term
    }

    /// A broker (re)registers: a new incarnation replaces the old one and starts fenced; the
    /// partitions it led have no leader until it is unfenced.
    pub(crate) fn decide_register_broker(
        &self,
        held: &MutexGuard<'_, ()>,
        registration: BrokerRegistration,
    ) -> Result<(), BrokerError> {
        if registration.id < 0 {
            return Err(BrokerError::new(ErrorKind::InvalidRequest, "a broker id must not be negative"));
        }
        let state = self.metadata();
        let same = state.brokers.get(&registration.id).is_some_and(|known| {
            known.incarnation == registration.incarnation
                && known.host == registration.host
                && known.port == registration.port
                && known.internal == registration.internal
                && known.rack == registration.rack
        });
        let voter = self.quorum.voters().contains(&(registration.id as u64));
        if !voter && !registration.internal.is_empty() {
            // A broker that does not vote follows the metadata log as a Raft learner.
            block_on(self.quorum.add_learner(registration.id as u64, registration.internal.clone()))??;
        }
        let index = if same {
            state.applied_offset
        } else {
            let mut records = Vec::new();
            if state.cluster_id.is_empty() {
                // The cluster's id comes first, so no broker is ever unfenced without one (the
                // tick would write it too, but a registration may come before the first tick).
                records.push(MetadataRecord::InitCluster { cluster_id: crate::broker::new_cluster_id() });
            }
            records.push(MetadataRecord::RegisterBroker { registration: registration.clone() });
            records.extend(leaderless_changes(&state, registration.id, &|t| self.unclean_allowed(t)));
            self.commit(held, records)?;
            tracing::info!(
                broker = registration.id,
                host = %registration.host,
                port = registration.port,
                incarnation = %registration.incarnation,
                "broker registered (fenced until it catches up)"
            );
            self.metadata().applied_offset
        };
        let term = self.term();
        lock(&self.cluster.sessions).for_term(term).brokers.insert(
            registration.id,
            Session { incarnation: registration.incarnation, last_heartbeat: Instant::now(), catch_up_to: index },
        );
        Ok(())
    }

    /// A broker's heartbeat: renews its session, unfences it once it has caught up, fences it
    /// when it shuts down.
    pub(crate) fn decide_heartbeat(
        &self,
        held: &MutexGuard<'_, ()>,
        id: i32,
        incarnation: Uuid,
        applied_offset: i64,
        shutting_down: bool,
    ) -> Result<HeartbeatAnswer, BrokerError> {
        let state = self.metadata();
        let Some(registration) = state.brokers.get(&id).filter(|b| b.incarnation == incarnation) else {
            return Ok(HeartbeatAnswer { must_register: true, fenced: true });
        };
        let term = self.term();
        let session = {
            let mut sessions = lock(&self.cluster.sessions);
            let session = sessions.for_term(term).brokers.entry(id).or_insert(Session {
                incarnation,
                last_heartbeat: Instant::now(),
                // Registered under an earlier controller: caught up once it has what this one has.
                catch_up_to: state.applied_offset,
            });
            if session.incarnation != incarnation {
                *session = Session { incarnation, last_heartbeat: Instant::now(), catch_up_to: state.applied_offset };
            }
            session.last_heartbeat = Instant::now();
            *session
        };
        if shutting_down {
            if !registration.fenced {
                self.fence(held, &state, id, "it is shutting down")?;
            }
            return Ok(HeartbeatAnswer { must_register: false, fenced: true });
        }
        if registration.fenced && applied_offset >= session.catch_up_to {
            let mut records = vec![MetadataRecord::UnfenceBroker { id }];
            records.extend(leader_changes_on_unfence(&state, id, &|t| self.unclean_allowed(t)));
            self.commit(held, records)?;
            tracing::info!(broker = id, applied_offset, "broker unfenced: it caught up with the metadata");
            return Ok(HeartbeatAnswer { must_register: false, fenced: false });
        }
        Ok(HeartbeatAnswer { must_register: false, fenced: registration.fenced })
    }

    /// Commits the fencing of broker `id` with the leader changes it implies.
    fn fence(&self, held: &MutexGuard<'_, ()>, state: &MetadataState, id: i32, why: &str) -> Result<(), BrokerError> {
        let mut records = vec![MetadataRecord::FenceBroker { id }];
        let changes = leaderless_changes(state, id, &|t| self.unclean_allowed(t));
        let partitions = changes.len();
        records.extend(changes);
        self.commit(held, records)?;
        tracing::warn!(broker = id, partitions, "broker fenced: {why}");
        Ok(())
    }

    /// The active controller's periodic duties: the cluster's first record, and fencing the
    /// brokers whose sessions expired. Blocking; does nothing on other nodes.
    pub(crate) fn controller_tick(self: &Arc<Self>) -> Result<(), BrokerError> {
        if self.quorum.leader() != Some(self.quorum.node_id()) {
            return Ok(());
        }
        let held = self.lock_controller();
        if self.quorum.check_active_controller().is_err() {
            return Ok(());
        }
        let state = self.metadata();
        if state.cluster_id.is_empty() {
            self.commit(&held, vec![MetadataRecord::InitCluster { cluster_id: crate::broker::new_cluster_id() }])?;
            tracing::info!(cluster_id = %self.cluster_id(), "initialized the cluster");
        }
        let timeout = Duration::from_millis(self.config.broker_session_timeout_ms);
        let term = self.term();
        let expired: Vec<(i32, Duration)> = {
            let mut sessions = lock(&self.cluster.sessions);
            let sessions = sessions.for_term(term);
            let now = Instant::now();
            state
                .brokers
                .values()
                .filter(|b| !b.fenced)
                .filter_map(|b| {
                    let session = sessions.brokers.entry(b.id).or_insert(Session {
                        incarnation: b.incarnation,
                        last_heartbeat: now,
                        catch_up_to: state.applied_offset,
                    });
                    let silent = now.saturating_duration_since(session.last_heartbeat);
                    (silent > timeout).then_some((b.id, silent))
                })
                .collect()
        };
        for (id, silent) in expired {
            let state = self.metadata();
            self.fence(&held, &state, id, &format!("no heartbeat for {} ms", silent.as_millis()))?;
        }
        self.complete_reassignments(&held)?;
        self.rebalance_leaders_if_due(&held, &self.metadata())
    }

    /// Runs [`Broker::controller_tick`] until shutdown.
    pub(crate) fn run_controller(self: &Arc<Self>) {
        self.every(tick_interval(self.config.broker_session_timeout_ms), |broker| async move {
            match tokio::task::spawn_blocking(move || broker.controller_tick()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "controller: periodic duties failed"),
                Err(e) => tracing::error!(error = %e, "controller: the periodic task failed"),
            }
        });
    }

    /// Runs `tick` every `interval` until the broker shuts down (or is dropped).
    pub(crate) fn every<F, Fut>(self: &Arc<Self>, interval: Duration, tick: F)
    where
        F: Fn(Arc<Broker>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let broker = Arc::downgrade(self);
        let mut shutdown = self.shutdown_signal();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = shutdown.changed() => return,
                }
                let Some(broker) = broker.upgrade() else { return };
                tick(broker).await;
            }
        });
    }
}

/// May a replica outside the ISR lead this topic's partitions (`unclean.leader.election.enable`)?
pub(crate) type UncleanPolicy<'a> = &'a dyn Fn(&TopicMetadata) -> bool;

/// The partition changes when `broker` stops (fenced, re-registered, shut down): where it leads,
/// another in-sync replica on an unfenced broker takes over (the broker leaves the ISR), or,
/// with none, a live replica outside the ISR if the topic allows unclean elections, else
/// nobody (the ISR keeps its last member, as Kafka does, so it can lead again). Where it
/// follows, it leaves the ISR, so that `acks=all` writes stop waiting for it; the last member
/// of an ISR stays.
fn leaderless_changes(state: &MetadataState, broker: i32, unclean: UncleanPolicy<'_>) -> Vec<MetadataRecord> {
    let live = |b: &i32| *b != broker && state.brokers.get(b).is_some_and(|r| !r.fenced);
    let mut out = Vec::new();
    for topic in state.topics.values() {
        for (index, partition) in topic.assignments.iter().enumerate() {
            let change = |isr: Vec<i32>, leader: Option<i32>| MetadataRecord::PartitionChange {
                topic: topic.name.clone(),
                id: topic.id,
                partition: index as i32,
                replicas: None,
                isr: Some(isr),
                leader,
            };
            let others: Vec<i32> = partition.isr.iter().copied().filter(|b| *b != broker).collect();
            if partition.leader != broker {
                if partition.isr.contains(&broker) && !others.is_empty() {
                    out.push(change(others, None));
                }
                continue;
            }
            if let Some(next) = partition.isr.iter().copied().find(live) {
                out.push(change(others, Some(next)));
            } else if let Some(next) = partition
                .replicas
                .iter()
                .copied()
                // A replica a reassignment is adding may have copied next to nothing.
                .filter(|b| !partition.adding_replicas.contains(b))
                .find(live)
                .filter(|_| unclean(topic))
            {
                tracing::warn!(topic = %topic.name, partition = index, leader = next, "unclean leader election: a replica outside the ISR leads; what only the ISR had is lost");
                out.push(change(vec![next], Some(next)));
            } else {
                out.push(change(partition.isr.clone(), Some(NO_LEADER)));
            }
        }
    }
    out
}

/// The partition changes when `broker` is unfenced: it leads where nobody does and it is in
/// sync, or, where the topic allows unclean elections and no in-sync replica is alive, as the
/// ISR's only member.
fn leader_changes_on_unfence(state: &MetadataState, broker: i32, unclean: UncleanPolicy<'_>) -> Vec<MetadataRecord> {
    let live = |b: &i32| state.brokers.get(b).is_some_and(|r| !r.fenced);
    let mut out = Vec::new();
    for topic in state.topics.values() {
        for (index, partition) in topic.assignments.iter().enumerate() {
            if partition.leader != NO_LEADER || !partition.replicas.contains(&broker) {
                continue;
            }
            let (isr, leader) = if partition.isr.contains(&broker) {
                (None, broker)
            } else if !partition.isr.iter().any(live) && unclean(topic) && !partition.adding_replicas.contains(&broker)
            {
                tracing::warn!(topic = %topic.name, partition = index, leader = broker, "unclean leader election: a replica outside the ISR leads; what only the ISR had is lost");
                (Some(vec![broker]), broker)
            } else {
                continue;
            };
            out.push(MetadataRecord::PartitionChange {
                topic: topic.name.clone(),
                id: topic.id,
                partition: index as i32,
                replicas: None,
                isr,
                leader: Some(leader),
            });
        }
    }
    out
}

impl Broker {
    /// The topic's `unclean.leader.election.enable`, with this broker's defaults.
    fn unclean_allowed(&self, topic: &TopicMetadata) -> bool {
        crate::topic_config::unclean_leader_election(&self.config.topic_defaults, &topic.configs)
    }

    /// A leader's ISR proposal (AlterPartition): accepted when it was computed from the current
    /// state (same leader, leader epoch and partition epoch), names replicas only, keeps the
    /// leader, and adds no fenced broker. Committed before it counts anywhere.
    pub(crate) fn decide_alter_partition(
        &self,
        held: &MutexGuard<'_, ()>,
        proposal: IsrProposal,
    ) -> Result<(), BrokerError> {
        let state = self.metadata();
        let stale = |why: String| BrokerError::new(ErrorKind::FencedLeaderEpoch, why);
        let Some(topic) = state.topic(&proposal.topic).filter(|t| t.id == proposal.topic_id) else {
            return Err(BrokerError::new(ErrorKind::UnknownTopicOrPartition, format!("no topic {}", proposal.topic)));
        };
        let Some(current) = topic.partition(proposal.partition) else {
            return Err(BrokerError::new(
                ErrorKind::UnknownTopicOrPartition,
                format!("no partition {}-{}", proposal.topic, proposal.partition),
            ));
        };
        if current.leader != proposal.leader || current.leader_epoch != proposal.leader_epoch {
            return Err(stale(format!(
                "broker {} at epoch {} no longer leads {}-{} (broker {} at epoch {} does)",
                proposal.leader,
                proposal.leader_epoch,
                proposal.topic,
                proposal.partition,
                current.leader,
                current.leader_epoch
            )));
        }
        if current.partition_epoch != proposal.partition_epoch {
            return Err(stale(format!(
                "{}-{} changed since the proposal (partition epoch {} now, {} proposed from)",
                proposal.topic, proposal.partition, current.partition_epoch, proposal.partition_epoch
            )));
        }
        let mut seen = std::collections::BTreeSet::new();
        for id in &proposal.isr {
            if !current.replicas.contains(id) || !seen.insert(*id) {
                return Err(BrokerError::new(
                    ErrorKind::InvalidRequest,
                    format!("ISR {:?} is no subset of replicas {:?}", proposal.isr, current.replicas),
                ));
            }
            let added = !current.isr.contains(id);
            if added && state.brokers.get(id).is_none_or(|b| b.fenced) {
                return Err(BrokerError::new(
                    ErrorKind::InvalidRequest,
                    format!("broker {id} is fenced: it cannot join the ISR"),
                ));
            }
        }
        if !proposal.isr.contains(&proposal.leader) {
            return Err(BrokerError::new(ErrorKind::InvalidRequest, "the leader must stay in the ISR"));
        }
        // The ISR change that brings the last target replica of a reassignment in sync
        // completes the reassignment in the same record.
        let record = super::reassignment::completion_with_isr(&state, topic, proposal.partition, &proposal.isr)
            .unwrap_or_else(|| MetadataRecord::PartitionChange {
                topic: proposal.topic.clone(),
                id: proposal.topic_id,
                partition: proposal.partition,
                replicas: None,
                isr: Some(proposal.isr.clone()),
                leader: None,
            });
        let completes = matches!(record, MetadataRecord::PartitionReassignment { .. });
        self.commit(held, vec![record])?;
        if completes {
            tracing::info!(topic = %proposal.topic, partition = proposal.partition, "reassignment completed: every target replica is in sync");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::PartitionState;

    fn state_with(partitions: Vec<PartitionState>, fenced: &[i32]) -> MetadataState {
        let mut state = MetadataState::new();
        let id = Uuid::new_v4();
        state.topics.insert(
            "t".into(),
            crate::metadata::TopicMetadata {
                name: "t".into(),
                id,
                partitions: partitions.len() as i32,
                configs: Default::default(),
                internal: false,
                assignments: partitions,
            },
        );
        for b in 1..=3 {
            state.brokers.insert(b, crate::placement::test_broker(b, fenced.contains(&b)));
        }
        state
    }

    #[test]
    fn fencing_moves_leadership_to_a_live_in_sync_replica_or_to_nobody() {
        let state = state_with(
            vec![PartitionState::new(vec![1]), PartitionState::new(vec![1, 2]), PartitionState::new(vec![2])],
            &[],
        );
        let changes = leaderless_changes(&state, 1, &|_| false);
        assert_eq!(changes.len(), 2, "only the partitions broker 1 leads change");
        let MetadataRecord::PartitionChange { partition: 0, leader: Some(NO_LEADER), isr: Some(isr), .. } = &changes[0]
        else {
            panic!("{:?}", changes[0])
        };
        assert_eq!(isr, &vec![1], "the last in-sync replica stays in the ISR");
        let MetadataRecord::PartitionChange { partition: 1, leader: Some(2), isr: Some(isr), .. } = &changes[1] else {
            panic!("{:?}", changes[1])
        };
        assert_eq!(isr, &vec![2]);

        let mut offline = state.clone();
        for (change, offset) in changes.iter().zip(10..) {
            offline.apply(offset, change);
        }
        let back = leader_changes_on_unfence(&offline, 1, &|_| false);
        assert_eq!(back.len(), 1, "partition 0 had no leader and 1 in sync: {back:?}");
    }

    #[test]
    fn an_unclean_election_skips_a_replica_a_reassignment_is_adding() {
        let moving = PartitionState {
            replicas: vec![3, 1],
            isr: vec![1],
            adding_replicas: vec![3],
            removing_replicas: vec![1],
            ..PartitionState::new(vec![1])
        };
        let state = state_with(vec![moving], &[]);
        let changes = leaderless_changes(&state, 1, &|_| true);
        assert!(matches!(&changes[0], MetadataRecord::PartitionChange { leader: Some(NO_LEADER), .. }), "{changes:?}");
    }

    #[test]
    fn a_fenced_successor_is_not_elected() {
        let state = state_with(vec![PartitionState::new(vec![1, 2])], &[2]);
        let changes = leaderless_changes(&state, 1, &|_| false);
        assert!(matches!(&changes[0], MetadataRecord::PartitionChange { leader: Some(NO_LEADER), .. }), "{changes:?}");
    }
}
