//! Leader elections asked for by an operator (Kafka's ElectLeaders) or by the controller's
//! balance check (`auto.leader.rebalance.enable`).
//!
//! A *preferred* election gives a partition back to its preferred replica (the first of its
//! replica list, where placement put the leader), if that replica is alive and in sync. After a
//! failover the leaders pile up on the brokers that stayed; preferred elections spread them
//! again. An *unclean* election gives a partition without a leader to a live replica, out of the
//! ISR if need be (losing what only the ISR had).
//!
//! The balance check runs every `leader.imbalance.check.interval.seconds` on the active
//! controller: a broker that is the preferred replica of N partitions but leads fewer than
//! N × (1 − `leader.imbalance.per.broker.percentage` / 100) of them gets them back, as far as it
//! is in their ISR.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use weir_error::{BrokerError, ErrorKind};
use weir_metadata::{MetadataRecord, MetadataState, PartitionState, NO_LEADER};

use crate::Decision;

/// Which leader an election picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ElectionType {
    Preferred,
    Unclean,
}

/// One partition's election outcome: the leader it has now, or why none was elected.
pub type ElectionResult = (String, i32, Result<i32, BrokerError>);

/// The leader an election of `kind` picks for `partition`, or why it picks none.
fn elect(
    state: &MetadataState,
    partition: &PartitionState,
    kind: ElectionType,
) -> Result<(i32, Option<Vec<i32>>), BrokerError> {
    let live = |b: &i32| state.brokers.get(b).is_some_and(|r| !r.fenced);
    match kind {
        ElectionType::Preferred => {
            let Some(&preferred) = partition.replicas.first() else {
                return Err(BrokerError::new(ErrorKind::PreferredLeaderNotAvailable, "the partition has no replicas"));
            };
            if partition.leader == preferred {
                return Err(BrokerError::new(
                    ErrorKind::ElectionNotNeeded,
                    format!("broker {preferred} leads already"),
                ));
            }
            if !live(&preferred) || !partition.isr.contains(&preferred) {
                return Err(BrokerError::new(
                    ErrorKind::PreferredLeaderNotAvailable,
                    format!("the preferred replica {preferred} is not alive and in sync (ISR {:?})", partition.isr),
                ));
            }
            Ok((preferred, None))
        }
        ElectionType::Unclean => {
            if partition.leader != NO_LEADER {
                return Err(BrokerError::new(
                    ErrorKind::ElectionNotNeeded,
                    format!("broker {} leads already", partition.leader),
                ));
            }
            if let Some(next) = partition.isr.iter().copied().find(live) {
                return Ok((next, None));
            }
            // Not a replica a reassignment is adding: it may have copied next to nothing.
            match partition.replicas.iter().copied().filter(|b| !partition.adding_replicas.contains(b)).find(live) {
                Some(next) => Ok((next, Some(vec![next]))),
                None => Err(BrokerError::new(ErrorKind::EligibleLeadersNotAvailable, "no replica is alive")),
            }
        }
    }
}

/// The leaderless partitions of the topics that allow unclean elections
/// (`unclean.leader.election.enable`): what to elect once that setting turns on, as Kafka does,
/// rather than leave them offline until a replica of their ISR comes back.
pub fn unclean_candidates(state: &MetadataState, config: &crate::ControllerConfig) -> Vec<(String, i32)> {
    state
        .topics
        .values()
        .filter(|t| crate::unclean_allowed(config, t))
        .flat_map(|t| {
            t.assignments
                .iter()
                .enumerate()
                .filter(|(_, p)| p.leader == weir_metadata::NO_LEADER)
                .map(|(index, _)| (t.name.clone(), index as i32))
        })
        .collect()
}

/// Elects leaders of `kind` for `partitions` (all partitions when `None`, reporting only those
/// that changed or could not): one result per partition, and the leader changes, committed
/// together.
pub fn decide_elect(
    state: &MetadataState,
    kind: ElectionType,
    partitions: Option<Vec<(String, i32)>>,
) -> Decision<Vec<ElectionResult>> {
    let all = partitions.is_none();
    let wanted: Vec<(String, i32)> = match partitions {
        Some(list) => list,
        None => state.topics.values().flat_map(|t| (0..t.partitions).map(move |p| (t.name.clone(), p))).collect(),
    };
    let mut records = Vec::new();
    let mut results = Vec::new();
    for (topic_name, index) in wanted {
        let Some((topic, partition)) = state.topic(&topic_name).and_then(|t| t.partition(index).map(|p| (t, p))) else {
            let error = BrokerError::new(
                ErrorKind::UnknownTopicOrPartition,
                format!("This server does not host this topic-partition: {topic_name}-{index}"),
            );
            results.push((topic_name, index, Err(error)));
            continue;
        };
        match elect(state, partition, kind) {
            Ok((leader, isr)) => {
                records.push(MetadataRecord::PartitionChange {
                    topic: topic.name.clone(),
                    id: topic.id,
                    partition: index,
                    replicas: None,
                    isr,
                    leader: Some(leader),
                });
                results.push((topic_name, index, Ok(leader)));
            }
            Err(e) if all && e.kind == ErrorKind::ElectionNotNeeded => {}
            Err(e) => results.push((topic_name, index, Err(e))),
        }
    }
    Decision { records, answer: results }
}

/// The balance check (see the module doc): the preferred elections that give each broker back
/// the partitions it should lead, as far as it is in their ISR. `percentage` is
/// `leader.imbalance.per.broker.percentage`.
pub fn decide_rebalance(state: &MetadataState, percentage: u32) -> Decision<Vec<ElectionResult>> {
    let wanted = imbalanced(state, percentage);
    if wanted.is_empty() {
        return Decision::nothing(Vec::new());
    }
    decide_elect(state, ElectionType::Preferred, Some(wanted))
}

/// The partitions to give back to their preferred replica: those of every broker that leads
/// less than its share allows, where the preferred replica is alive and in sync.
fn imbalanced(state: &MetadataState, percentage: u32) -> Vec<(String, i32)> {
    let live = |b: &i32| state.brokers.get(b).is_some_and(|r| !r.fenced);
    let mut preferred_of: BTreeMap<i32, (usize, Vec<(String, i32)>)> = BTreeMap::new();
    for topic in state.topics.values() {
        for (index, partition) in topic.assignments.iter().enumerate() {
            let Some(&preferred) = partition.replicas.first() else { continue };
            let entry = preferred_of.entry(preferred).or_default();
            entry.0 += 1;
            if partition.leader != preferred && live(&preferred) && partition.isr.contains(&preferred) {
                entry.1.push((topic.name.clone(), index as i32));
            }
        }
    }
    preferred_of
        .into_values()
        .filter(|(total, movable)| *total > 0 && movable.len() * 100 > *total * percentage as usize)
        .flat_map(|(_, movable)| movable)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_metadata::{BrokerRegistration, TopicMetadata};

    fn state(partitions: Vec<PartitionState>, fenced: &[i32]) -> MetadataState {
        let mut state = MetadataState::new();
        let topic = TopicMetadata {
            name: "t".into(),
            id: uuid::Uuid::new_v4(),
            partitions: partitions.len() as i32,
            configs: Default::default(),
            internal: false,
            assignments: partitions,
            elastic: None,
        };
        state.topics.insert("t".into(), std::sync::Arc::new(topic));
        for id in 1..=3 {
            let registration = BrokerRegistration {
                id,
                incarnation: uuid::Uuid::new_v4(),
                host: "h".into(),
                port: 1,
                listeners: Vec::new(),
                internal: String::new(),
                rack: None,
                rocketmq_port: 0,
                fenced: fenced.contains(&id),
            };
            state.brokers.insert(id, registration);
        }
        state
    }

    fn led_by(replicas: Vec<i32>, leader: i32, isr: Vec<i32>) -> PartitionState {
        PartitionState { replicas, isr, leader, leader_epoch: 1, partition_epoch: 1, ..PartitionState::new(Vec::new()) }
    }

    #[test]
    fn a_preferred_election_needs_the_preferred_replica_alive_and_in_sync() {
        let s = state(vec![led_by(vec![1, 2], 2, vec![1, 2]), led_by(vec![1, 2], 2, vec![2])], &[]);
        let t = s.topic("t").unwrap();
        assert_eq!(elect(&s, &t.assignments[0], ElectionType::Preferred).unwrap(), (1, None));
        let out_of_sync = elect(&s, &t.assignments[1], ElectionType::Preferred).unwrap_err();
        assert_eq!(out_of_sync.kind, ErrorKind::PreferredLeaderNotAvailable);
        let leading = led_by(vec![1, 2], 1, vec![1, 2]);
        assert_eq!(elect(&s, &leading, ElectionType::Preferred).unwrap_err().kind, ErrorKind::ElectionNotNeeded);
        let fenced = state(vec![led_by(vec![1, 2], 2, vec![1, 2])], &[1]);
        let p = fenced.topic("t").unwrap().assignments[0].clone();
        assert_eq!(
            elect(&fenced, &p, ElectionType::Preferred).unwrap_err().kind,
            ErrorKind::PreferredLeaderNotAvailable
        );
    }

    #[test]
    fn an_unclean_election_prefers_the_isr_then_any_live_replica() {
        let s = state(vec![], &[1]);
        let in_sync = led_by(vec![1, 2, 3], NO_LEADER, vec![1, 3]);
        assert_eq!(elect(&s, &in_sync, ElectionType::Unclean).unwrap(), (3, None));
        let out_of_sync = led_by(vec![1, 2], NO_LEADER, vec![1]);
        assert_eq!(elect(&s, &out_of_sync, ElectionType::Unclean).unwrap(), (2, Some(vec![2])));
        let nobody = state(vec![], &[1, 2, 3]);
        assert_eq!(
            elect(&nobody, &out_of_sync, ElectionType::Unclean).unwrap_err().kind,
            ErrorKind::EligibleLeadersNotAvailable
        );
    }

    #[test]
    fn the_balance_check_moves_leaders_back_only_past_the_allowed_imbalance() {
        // Broker 1 is preferred for 4 partitions and leads 2: 50 % off.
        let partitions = vec![
            led_by(vec![1, 2], 1, vec![1, 2]),
            led_by(vec![1, 2], 1, vec![1, 2]),
            led_by(vec![1, 2], 2, vec![1, 2]),
            led_by(vec![1, 2], 2, vec![2]),
        ];
        let s = state(partitions, &[]);
        assert_eq!(imbalanced(&s, 10), vec![("t".to_string(), 2)], "partition 3 has broker 1 out of sync");
        assert!(imbalanced(&s, 50).is_empty(), "25 % movable is within a 50 % allowance");
    }
}
