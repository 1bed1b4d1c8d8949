//! Brokers' standing with the controller: registrations, heartbeats, the sessions that say who
//! is alive, fencing and unfencing, and the leader changes they imply.
//!
//! Sessions live in the active controller's memory only (as in KRaft): a new controller starts
//! every registered broker's session afresh, so a failover fences nobody by itself; a broker
//! that died meanwhile is fenced one session timeout later. The leader changes are computed
//! from the applied state and committed with the fencing record, in one entry, so no node ever
//! sees a fenced broker still leading.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use uuid::Uuid;
use weir_error::{BrokerError, ErrorKind};
use weir_metadata::{BrokerRegistration, MetadataRecord, MetadataState, TopicMetadata, NO_LEADER};

use crate::request::HeartbeatAnswer;
use crate::{unclean_allowed, ControllerConfig, Decision};

/// What the active controller knows of each broker's liveness.
#[derive(Debug, Default)]
pub struct Sessions {
    /// The Raft term these sessions belong to: a new term (a new controller) starts afresh.
    term: u64,
    brokers: HashMap<i32, Session>,
    /// When the leader balance was last checked (`auto.leader.rebalance.enable`).
    pub last_rebalance_check: Option<Instant>,
    /// What each broker reported of its load in its last heartbeat of this term.
    pub loads: std::collections::BTreeMap<i32, crate::balance::LoadReport>,
    /// When the load balance was last checked (`elastic.balance.enable`).
    pub last_balance_check: Option<Instant>,
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
            self.loads.clear();
        }
        self
    }

    /// Broker `id`, incarnation `incarnation`, registered at `now`: unfenced once it has applied
    /// the metadata up to `catch_up_to`.
    pub fn registered(&mut self, term: u64, id: i32, incarnation: Uuid, now: Instant, catch_up_to: i64) {
        self.for_term(term).brokers.insert(id, Session { incarnation, last_heartbeat: now, catch_up_to });
    }

    /// The unfenced brokers of `state` not heard from for longer than `timeout` at `now`, with
    /// how long each was silent. A broker without a session (registered under an earlier
    /// controller) gets one from now.
    pub fn expired(
        &mut self,
        term: u64,
        state: &MetadataState,
        now: Instant,
        timeout: Duration,
    ) -> Vec<(i32, Duration)> {
        let sessions = self.for_term(term);
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
    }
}

/// Decides a broker's (re)registration: a new incarnation replaces the old one and starts
/// fenced; the partitions it led have no leader until it is unfenced. Nothing changes when it
/// registers again as it is. The cluster's id comes first when there is none yet, so no broker
/// is ever unfenced without one (the tick writes it too, but a registration may come first).
pub fn decide_register(
    state: &MetadataState,
    config: &ControllerConfig,
    registration: &BrokerRegistration,
) -> Result<Decision<()>, BrokerError> {
    if registration.id < 0 {
        return Err(BrokerError::new(ErrorKind::InvalidRequest, "a broker id must not be negative"));
    }
    let same = state.brokers.get(&registration.id).is_some_and(|known| {
        known.incarnation == registration.incarnation
            && known.host == registration.host
            && known.port == registration.port
            && known.internal == registration.internal
            && known.rack == registration.rack
    });
    if same {
        return Ok(Decision::nothing(()));
    }
    let mut records = Vec::new();
    if state.cluster_id.is_empty() {
        records.push(MetadataRecord::InitCluster { cluster_id: crate::new_cluster_id() });
    }
    records.push(MetadataRecord::RegisterBroker { registration: registration.clone() });
    records.extend(leaderless_changes(state, registration.id, &|t| unclean_allowed(config, t)));
    Ok(Decision { records, answer: () })
}

/// Decides a broker's heartbeat at `now`: renews its session, fences it when it shuts down,
/// unfences it once it has applied the metadata up to its registration (with the leader
/// changes that follow). A broker the metadata does not know under this incarnation must
/// register again.
#[allow(clippy::too_many_arguments)]
pub fn decide_heartbeat(
    state: &MetadataState,
    config: &ControllerConfig,
    sessions: &mut Sessions,
    term: u64,
    now: Instant,
    id: i32,
    incarnation: Uuid,
    applied_offset: i64,
    shutting_down: bool,
) -> Decision<HeartbeatAnswer> {
    let Some(registration) = state.brokers.get(&id).filter(|b| b.incarnation == incarnation) else {
        return Decision::nothing(HeartbeatAnswer { must_register: true, fenced: true });
    };
    let session = {
        let session = sessions.for_term(term).brokers.entry(id).or_insert(Session {
            incarnation,
            last_heartbeat: now,
            // Registered under an earlier controller: caught up once it has what this one has.
            catch_up_to: state.applied_offset,
        });
        if session.incarnation != incarnation {
            *session = Session { incarnation, last_heartbeat: now, catch_up_to: state.applied_offset };
        }
        session.last_heartbeat = now;
        *session
    };
    if shutting_down {
        let records = if registration.fenced { Vec::new() } else { decide_fence(state, config, id).records };
        return Decision { records, answer: HeartbeatAnswer { must_register: false, fenced: true } };
    }
    if registration.fenced && applied_offset >= session.catch_up_to {
        let mut records = vec![MetadataRecord::UnfenceBroker { id }];
        records.extend(leader_changes_on_unfence(state, id, &|t| unclean_allowed(config, t)));
        // Memory-first partitions no live broker holds come to this one.
        let mut homes = crate::elastic::placement_load(state);
        homes.entry(id).or_insert(0.0);
        records.extend(memory_first_moves(state, config, homes));
        return Decision { records, answer: HeartbeatAnswer { must_register: false, fenced: false } };
    }
    Decision::nothing(HeartbeatAnswer { must_register: false, fenced: registration.fenced })
}

/// Decides the unregistration of broker `id` (Kafka's UnregisterBroker), for a broker that was
/// decommissioned and stopped: refused while it is unfenced (its process would only register
/// again) or still holds a replica (the partition would stay under-replicated for good).
/// `voter`: the node is a voter of the metadata quorum, which stays.
pub fn decide_unregister(state: &MetadataState, id: i32, voter: bool) -> Result<Decision<()>, BrokerError> {
    let Some(broker) = state.brokers.get(&id) else {
        return Err(BrokerError::new(ErrorKind::BrokerNotRegistered, format!("no broker {id} is registered")));
    };
    if voter {
        return Err(BrokerError::new(
            ErrorKind::InvalidRequest,
            format!("broker {id} is a voter of the metadata quorum (controller.quorum.voters); only a broker-only node can be unregistered"),
        ));
    }
    if !broker.fenced {
        return Err(BrokerError::new(
            ErrorKind::InvalidRequest,
            format!("broker {id} is running (not fenced): stop it first, or it registers again"),
        ));
    }
    let holding: Vec<String> = state
        .topics
        .values()
        .flat_map(|t| {
            t.assignments
                .iter()
                .enumerate()
                .filter(|(_, p)| p.replicas.contains(&id))
                .map(move |(index, _)| format!("{}-{index}", t.name))
        })
        .collect();
    if let Some(first) = holding.first() {
        return Err(BrokerError::new(
            ErrorKind::InvalidRequest,
            format!(
                "broker {id} still holds {} replica(s) (first: {first}); `weir cluster decommission {id}` moves them off first",
                holding.len()
            ),
        ));
    }
    Ok(Decision { records: vec![MetadataRecord::UnregisterBroker { id }], answer: () })
}

/// Decides the fencing of broker `id` with the leader changes it implies; the answer is how
/// many partitions change.
pub fn decide_fence(state: &MetadataState, config: &ControllerConfig, id: i32) -> Decision<usize> {
    let mut changes = leaderless_changes(state, id, &|t| unclean_allowed(config, t));
    let mut homes = crate::elastic::placement_load(state);
    homes.remove(&id);
    changes.extend(memory_first_moves(state, config, homes));
    let partitions = changes.len();
    let mut records = vec![MetadataRecord::FenceBroker { id }];
    records.extend(changes);
    Decision { records, answer: partitions }
}

/// Whether a topic is memory-first (`storage.mode=memory`): its partitions are durable in the
/// object store, not on their replicas.
fn memory_first(config: &ControllerConfig, topic: &TopicMetadata) -> bool {
    crate::topic_config::log_config(&config.topic_defaults, &topic.configs).is_ok_and(|c| c.memory_first)
}

/// Memory-first partitions whose every replica is on a fenced broker (or one fenced now) move
/// to a live broker of `homes` (each with its load; the least loaded first, then the lowest
/// id), which loads them from the object store: what the store has is all there is to them,
/// so no replica is needed to copy from. Each partition moved adds to its new home's load.
pub(crate) fn memory_first_moves(
    state: &MetadataState,
    config: &ControllerConfig,
    mut homes: BTreeMap<i32, f64>,
) -> Vec<MetadataRecord> {
    let mut out = Vec::new();
    for topic in state.topics.values().filter(|t| memory_first(config, t)) {
        for (index, partition) in topic.assignments.iter().enumerate() {
            if partition.replicas.iter().any(|b| homes.contains_key(b)) {
                continue;
            }
            let best = homes.iter().min_by(|a, b| a.1.total_cmp(b.1).then(a.0.cmp(b.0))).map(|(id, _)| *id);
            let Some(home) = best else { return out };
            if let Some(load) = homes.get_mut(&home) {
                *load += 2.0;
            }
            tracing::info!(topic = %topic.name, partition = index, from = ?partition.replicas, to = home,
                "a memory-first partition lost its broker: it moves and loads from the object store");
            out.push(MetadataRecord::PartitionReassignment {
                topic: topic.name.clone(),
                id: topic.id,
                partition: index as i32,
                replicas: vec![home],
                isr: vec![home],
                leader: home,
                adding: Vec::new(),
                removing: Vec::new(),
            });
        }
    }
    out
}

/// May a replica outside the ISR lead this topic's partitions (`unclean.leader.election.enable`)?
pub(crate) type UncleanPolicy<'a> = &'a dyn Fn(&TopicMetadata) -> bool;

/// The partition changes when `broker` stops (fenced, re-registered, shut down): where it leads,
/// another in-sync replica on an unfenced broker takes over (the broker leaves the ISR), or,
/// with none, a live replica outside the ISR if the topic allows unclean elections, else
/// nobody (the ISR keeps its last member, as Kafka does, so it can lead again). Where it
/// follows, it leaves the ISR, so that `acks=all` writes stop waiting for it; the last member
/// of an ISR stays.
pub(crate) fn leaderless_changes(
    state: &MetadataState,
    broker: i32,
    unclean: UncleanPolicy<'_>,
) -> Vec<MetadataRecord> {
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
pub(crate) fn leader_changes_on_unfence(
    state: &MetadataState,
    broker: i32,
    unclean: UncleanPolicy<'_>,
) -> Vec<MetadataRecord> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;
    use weir_metadata::{PartitionState, TopicMetadata};

    fn state_with(partitions: Vec<PartitionState>, fenced: &[i32]) -> MetadataState {
        let mut state = MetadataState::new();
        let id = Uuid::new_v4();
        state.topics.insert(
            "t".into(),
            std::sync::Arc::new(TopicMetadata {
                name: "t".into(),
                id,
                partitions: partitions.len() as i32,
                configs: Default::default(),
                internal: false,
                assignments: partitions,
                elastic: None,
            }),
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
    fn only_a_stopped_broker_without_replicas_is_unregistered() {
        // Broker 1 holds t-0; broker 3 holds nothing; both fenced; broker 2 runs.
        let state = state_with(vec![PartitionState::new(vec![1, 2])], &[1, 3]);
        let refused = |id: i32, voter: bool| match decide_unregister(&state, id, voter) {
            Err(e) => (e.kind, e.message),
            Ok(d) => panic!("broker {id} unregistered: {:?}", d.records),
        };
        assert_eq!(refused(9, false).0, ErrorKind::BrokerNotRegistered);
        let (kind, message) = refused(2, false);
        assert!(kind == ErrorKind::InvalidRequest && message.contains("running"), "{message}");
        let (kind, message) = refused(1, false);
        assert!(kind == ErrorKind::InvalidRequest && message.contains("t-0"), "{message}");
        let (kind, message) = refused(3, true);
        assert!(kind == ErrorKind::InvalidRequest && message.contains("voter"), "{message}");

        let decision = decide_unregister(&state, 3, false).expect("a fenced, empty broker-only node");
        let mut after = state.clone();
        for (record, offset) in decision.records.iter().zip(10..) {
            after.apply(offset, record);
        }
        assert!(!after.brokers.contains_key(&3) && after.brokers.len() == 2, "{:?}", after.brokers.keys());
    }

    fn config() -> ControllerConfig {
        ControllerConfig {
            num_partitions: 1,
            default_replication_factor: 1,
            max_partitions_per_topic: 100,
            delete_topic_enable: true,
            offsets_topic_replication_factor: 3,
            transaction_state_replication_factor: 3,
            messaging_state_replication_factor: 3,
            topic_defaults: Default::default(),
            replica_capacity: None,
        }
    }

    #[test]
    fn memory_first_partitions_of_a_fenced_broker_move_to_the_least_loaded_live_ones() {
        let mut state = state_with(
            vec![PartitionState::new(vec![1]), PartitionState::new(vec![1]), PartitionState::new(vec![2])],
            &[3],
        );
        let mut topic = (*state.topics["t"]).clone();
        topic.configs.insert("storage.mode".into(), "memory".into());
        topic.configs.insert("remote.storage.enable".into(), "true".into());
        state.topics.insert("t".into(), std::sync::Arc::new(topic));
        // Broker 3 is fenced: both of broker 1's partitions go to broker 2.
        let decision = decide_fence(&state, &config(), 1);
        let moves: Vec<(i32, Vec<i32>, i32)> = decision
            .records
            .iter()
            .filter_map(|r| match r {
                MetadataRecord::PartitionReassignment { partition, replicas, leader, adding, removing, .. } => {
                    assert!(adding.is_empty() && removing.is_empty());
                    Some((*partition, replicas.clone(), *leader))
                }
                _ => None,
            })
            .collect();
        assert_eq!(moves, vec![(0, vec![2], 2), (1, vec![2], 2)]);
        let mut after = state.clone();
        for (record, offset) in decision.records.iter().zip(10..) {
            after.apply(offset, record);
        }
        assert_eq!(after.topics["t"].assignments[0].leader, 2);
        assert!(after.topics["t"].assignments[0].leader_epoch > state.topics["t"].assignments[0].leader_epoch);

        // With nowhere to go they wait; the next broker unfenced takes them.
        let alone = decide_fence(&after, &config(), 2);
        let mut offline = after.clone();
        for (record, offset) in alone.records.iter().zip(20..) {
            offline.apply(offset, record);
        }
        assert!(offline.topics["t"].assignments.iter().all(|p| p.leader == NO_LEADER));
        let homes = BTreeMap::from([(3, 0.0)]);
        assert_eq!(memory_first_moves(&offline, &config(), homes).len(), 3);

        // A topic on disk does not move.
        let plain = state_with(vec![PartitionState::new(vec![1])], &[]);
        assert!(memory_first_moves(&plain, &config(), BTreeMap::from([(2, 0.0)])).is_empty());
    }

    #[test]
    fn a_broker_is_fenced_until_it_catches_up_then_by_silence_or_shutdown() {
        let mut state = state_with(vec![PartitionState::new(vec![1, 4])], &[]);
        let mut registration = crate::placement::test_broker(4, false);
        registration.host = "new".into();
        let (mut sessions, t0) = (Sessions::default(), Instant::now());
        let registered = decide_register(&state, &config(), &registration).expect("registered");
        assert!(matches!(registered.records[0], MetadataRecord::InitCluster { .. }), "no cluster id yet");
        for (record, offset) in registered.records.iter().zip(10..) {
            state.apply(offset, record);
        }
        assert!(state.brokers[&4].fenced, "a registration starts fenced");
        sessions.registered(1, 4, registration.incarnation, t0, 11);
        let heartbeat = |state: &MetadataState, sessions: &mut Sessions, applied: i64, down: bool| {
            decide_heartbeat(state, &config(), sessions, 1, t0, 4, registration.incarnation, applied, down)
        };
        let behind = heartbeat(&state, &mut sessions, 10, false);
        assert_eq!((behind.records.len(), behind.answer.fenced), (0, true), "not caught up yet");
        let caught_up = heartbeat(&state, &mut sessions, 11, false);
        assert!(!caught_up.answer.fenced);
        assert!(matches!(caught_up.records[0], MetadataRecord::UnfenceBroker { id: 4 }), "{:?}", caught_up.records);
        for (record, offset) in caught_up.records.iter().zip(20..) {
            state.apply(offset, record);
        }
        let stranger = decide_heartbeat(&state, &config(), &mut sessions, 1, t0, 4, Uuid::new_v4(), 30, false);
        assert!(stranger.answer.must_register, "another incarnation must register");
        // Silence past the timeout, measured from the last heartbeat.
        let timeout = Duration::from_secs(2);
        assert!(sessions.expired(1, &state, t0 + Duration::from_secs(1), timeout).is_empty());
        let expired = sessions.expired(1, &state, t0 + Duration::from_secs(3), timeout);
        assert!(expired.iter().any(|(id, _)| *id == 4), "{expired:?}");
        // A new term (a new controller) starts every session afresh.
        assert!(sessions.expired(2, &state, t0 + Duration::from_secs(3), timeout).is_empty());
        let leaving = heartbeat(&state, &mut sessions, 30, true);
        assert!(leaving.answer.fenced);
        assert!(matches!(leaving.records[0], MetadataRecord::FenceBroker { id: 4 }), "{:?}", leaving.records);
    }

    #[test]
    fn a_fenced_successor_is_not_elected() {
        let state = state_with(vec![PartitionState::new(vec![1, 2])], &[2]);
        let changes = leaderless_changes(&state, 1, &|_| false);
        assert!(matches!(&changes[0], MetadataRecord::PartitionChange { leader: Some(NO_LEADER), .. }), "{changes:?}");
    }
}
