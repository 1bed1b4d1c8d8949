//! Partition reassignment (KIP-455: Kafka's AlterPartitionReassignments and
//! ListPartitionReassignments, `kafka-reassign-partitions.sh`, `weir partitions reassign`).
//!
//! A reassignment moves a partition from its original replicas to a target set without a gap in
//! availability or durability:
//!
//! 1. **Start.** The controller commits replicas = target + the original replicas not in the
//!    target, with `adding` = target − original and `removing` = original − target. The adding
//!    replicas create their logs and fetch from the leader like any follower; while they catch
//!    up they are outside the ISR, so `acks=all` does not wait for them.
//! 2. **Catch up.** The leader proposes each adding replica for the ISR once it has caught up
//!    (AlterPartition, as for any follower). A replication throttle
//!    (`follower.replication.throttled.rate`, see [`crate::throttle`]) can bound the copy.
//! 3. **Complete.** Once every target replica is in the ISR, the controller commits
//!    replicas = target and ISR = ISR ∩ target in the same decision that accepted the ISR
//!    change. If the leader is being removed, an in-sync target replica takes over at a new
//!    leader epoch. Brokers that no longer hold a replica delete their logs.
//!
//! A new reassignment of a partition that is being reassigned replaces the old one (its target
//! is measured against the original replicas); cancelling one (no target) goes back to the
//! original replicas.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use weir_error::{BrokerError, ErrorKind};
use weir_metadata::{MetadataRecord, MetadataState, PartitionState, TopicMetadata, NO_LEADER};

use crate::Decision;

/// One partition's wanted replicas; `None` cancels its reassignment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReassignmentTarget {
    pub topic: String,
    pub partition: i32,
    pub replicas: Option<Vec<i32>>,
}

/// One partition's outcome, in request order.
pub type ReassignmentResult = (String, i32, Result<(), BrokerError>);

/// A reassignment in progress, as ListPartitionReassignments reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OngoingReassignment {
    pub topic: String,
    pub partition: i32,
    /// The current replicas: target first, then the original ones being removed.
    pub replicas: Vec<i32>,
    pub adding: Vec<i32>,
    pub removing: Vec<i32>,
}

/// The change that starts, replaces or cancels (`target` = the original replicas) the
/// reassignment of `partition` to `target`, completing it at once when the target is in sync
/// already. `None` when nothing changes.
fn start(
    state: &MetadataState,
    topic: &TopicMetadata,
    index: i32,
    partition: &PartitionState,
    target: &[i32],
) -> Result<Option<MetadataRecord>, BrokerError> {
    let original = partition.original_replicas();
    let mut replicas: Vec<i32> = target.to_vec();
    replicas.extend(original.iter().copied().filter(|b| !target.contains(b)));
    let adding: Vec<i32> = target.iter().copied().filter(|b| !original.contains(b)).collect();
    let removing: Vec<i32> = original.iter().copied().filter(|b| !target.contains(b)).collect();
    let isr: Vec<i32> = partition.isr.iter().copied().filter(|b| replicas.contains(b)).collect();
    let leader = if partition.leader == NO_LEADER || replicas.contains(&partition.leader) {
        partition.leader
    } else {
        // Only when replacing a reassignment whose adding replica led: an in-sync one leads.
        first_live(state, &isr).unwrap_or(NO_LEADER)
    };
    if isr.is_empty() {
        return Err(BrokerError::new(
            ErrorKind::InvalidReplicaAssignment,
            format!(
                "none of the replicas {replicas:?} of {}-{index} is in sync (ISR {:?}): the partition would have \
                 no in-sync replica",
                topic.name, partition.isr
            ),
        ));
    }
    let mut next = PartitionState {
        replicas,
        isr,
        leader,
        adding_replicas: adding,
        removing_replicas: removing,
        ..partition.clone()
    };
    if let Some(done) = completed(state, &next) {
        next = done;
    }
    let unchanged = next.replicas == partition.replicas
        && next.isr == partition.isr
        && next.leader == partition.leader
        && next.adding_replicas == partition.adding_replicas
        && next.removing_replicas == partition.removing_replicas;
    Ok((!unchanged).then(|| change(topic, index, next)))
}

/// `partition` with its reassignment completed, if it is one whose target replicas are all in
/// sync and one of them alive to lead.
fn completed(state: &MetadataState, partition: &PartitionState) -> Option<PartitionState> {
    if !partition.is_reassigning() {
        return None;
    }
    let target = partition.target_replicas();
    if !target.iter().all(|b| partition.isr.contains(b)) {
        return None;
    }
    let isr: Vec<i32> = partition.isr.iter().copied().filter(|b| target.contains(b)).collect();
    let leader = if target.contains(&partition.leader) { partition.leader } else { first_live(state, &isr)? };
    Some(PartitionState {
        replicas: target,
        isr,
        leader,
        adding_replicas: Vec::new(),
        removing_replicas: Vec::new(),
        ..partition.clone()
    })
}

/// The reassignment record that makes `index` of `topic` look like `next`.
fn change(topic: &TopicMetadata, index: i32, next: PartitionState) -> MetadataRecord {
    MetadataRecord::PartitionReassignment {
        topic: topic.name.clone(),
        id: topic.id,
        partition: index,
        replicas: next.replicas,
        isr: next.isr,
        leader: next.leader,
        adding: next.adding_replicas,
        removing: next.removing_replicas,
    }
}

fn first_live(state: &MetadataState, candidates: &[i32]) -> Option<i32> {
    candidates.iter().copied().find(|b| state.brokers.get(b).is_some_and(|r| !r.fenced))
}

/// The record completing the reassignment of `index` once its ISR is `isr`, if that completes
/// it (the controller commits it instead of the plain ISR change).
pub(crate) fn completion_with_isr(
    state: &MetadataState,
    topic: &TopicMetadata,
    index: i32,
    isr: &[i32],
) -> Option<MetadataRecord> {
    let partition = topic.partition(index)?;
    let next = PartitionState { isr: isr.to_vec(), ..partition.clone() };
    completed(state, &next).map(|done| change(topic, index, done))
}

/// Checks a target replica list against the registered brokers.
fn validate_target(
    state: &MetadataState,
    partition: &PartitionState,
    target: &[i32],
    allow_replication_factor_change: bool,
) -> Result<(), BrokerError> {
    let invalid = |message: String| Err(BrokerError::new(ErrorKind::InvalidReplicaAssignment, message));
    if target.is_empty() {
        return invalid("the replica list is empty".into());
    }
    let mut seen = std::collections::BTreeSet::new();
    for id in target {
        if !seen.insert(*id) {
            return invalid(format!("broker {id} is listed twice in {target:?}"));
        }
        if !state.brokers.contains_key(id) {
            return invalid(format!("broker {id} is not registered with the cluster"));
        }
    }
    let original = partition.original_replicas().len();
    if !allow_replication_factor_change && target.len() != original {
        return Err(BrokerError::new(
            ErrorKind::InvalidReplicationFactor,
            format!(
                "the reassignment changes the replication factor from {original} to {}, which the request does not \
                 allow",
                target.len()
            ),
        ));
    }
    Ok(())
}

/// The reassignments in progress in `state`, of `partitions` (topic → partitions) or of all of
/// them, ordered by topic and partition.
pub fn ongoing(state: &MetadataState, partitions: Option<&BTreeMap<String, Vec<i32>>>) -> Vec<OngoingReassignment> {
    let mut out = Vec::new();
    for topic in state.topics.values() {
        let wanted = match partitions {
            Some(filter) => match filter.get(&topic.name) {
                Some(list) => Some(list),
                None => continue,
            },
            None => None,
        };
        for (index, partition) in topic.assignments.iter().enumerate() {
            let index = index as i32;
            if !partition.is_reassigning() || wanted.is_some_and(|list| !list.contains(&index)) {
                continue;
            }
            out.push(OngoingReassignment {
                topic: topic.name.clone(),
                partition: index,
                replicas: partition.replicas.clone(),
                adding: partition.adding_replicas.clone(),
                removing: partition.removing_replicas.clone(),
            });
        }
    }
    out
}

/// Decides a batch of reassignment changes: the accepted ones are committed together; one
/// result per target, in order. `allow_replication_factor_change` false refuses targets with
/// another number of replicas (AlterPartitionReassignments v1).
pub fn decide_alter(
    state: &MetadataState,
    targets: Vec<ReassignmentTarget>,
    allow_replication_factor_change: bool,
) -> Decision<Vec<ReassignmentResult>> {
    let mut records = Vec::new();
    let mut results = Vec::with_capacity(targets.len());
    for target in targets {
        let outcome = (|| {
            let (topic, partition) = state
                .topic(&target.topic)
                .and_then(|t| t.partition(target.partition).map(|p| (t, p)))
                .ok_or_else(|| BrokerError::unknown_partition(&target.topic, target.partition))?;
            let wanted = match &target.replicas {
                Some(list) => {
                    validate_target(state, partition, list, allow_replication_factor_change)?;
                    list.clone()
                }
                None if partition.is_reassigning() => partition.original_replicas(),
                None => {
                    return Err(BrokerError::new(
                        ErrorKind::NoReassignmentInProgress,
                        format!("no reassignment of {}-{} is in progress", target.topic, target.partition),
                    ))
                }
            };
            start(state, topic, target.partition, partition, &wanted)
        })();
        match outcome {
            Ok(Some(record)) => {
                records.push(record);
                results.push((target.topic, target.partition, Ok(())));
            }
            Ok(None) => results.push((target.topic, target.partition, Ok(()))),
            Err(e) => results.push((target.topic, target.partition, Err(e))),
        }
    }
    Decision { records, answer: results }
}

/// The records completing the reassignments whose target replicas are all in sync (a safety
/// net of the controller's tick: the ISR change that brings the last one in usually completes
/// it).
pub fn completions(state: &MetadataState) -> Vec<MetadataRecord> {
    state
        .topics
        .values()
        .flat_map(|topic| {
            topic.assignments.iter().enumerate().filter_map(move |(index, partition)| {
                completed(state, partition).map(|done| change(topic, index as i32, done))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn cluster(brokers: &[i32], fenced: &[i32]) -> MetadataState {
        let mut state = MetadataState::new();
        for &b in brokers {
            state.brokers.insert(b, crate::placement::test_broker(b, fenced.contains(&b)));
        }
        state
    }

    fn topic_with(partition: PartitionState) -> TopicMetadata {
        TopicMetadata {
            name: "t".into(),
            id: Uuid::new_v4(),
            partitions: 1,
            configs: Default::default(),
            internal: false,
            assignments: vec![partition],
            elastic: None,
        }
    }

    fn applied(topic: &TopicMetadata, record: &MetadataRecord) -> PartitionState {
        let mut state = cluster(&[], &[]);
        state.topics.insert(topic.name.clone(), std::sync::Arc::new(topic.clone()));
        state.apply(1, record);
        state.check_invariants();
        state.topic("t").and_then(|t| t.partition(0)).cloned().expect("the partition")
    }

    #[test]
    fn a_move_adds_the_target_then_completes_once_it_is_in_sync() {
        let state = cluster(&[1, 2, 3, 4], &[]);
        let topic = topic_with(PartitionState::new(vec![1, 2]));
        let partition = topic.partition(0).cloned().expect("partition");
        let record = start(&state, &topic, 0, &partition, &[3, 2]).expect("valid").expect("a change");
        let moving = applied(&topic, &record);
        assert_eq!(moving.replicas, vec![3, 2, 1], "target first, then the original ones being removed");
        assert_eq!((moving.adding_replicas.clone(), moving.removing_replicas.clone()), (vec![3], vec![1]));
        assert_eq!((moving.isr.clone(), moving.leader), (vec![1, 2], 1), "the new replica is not in sync yet");
        assert_eq!(moving.leader_epoch, 0);

        let topic = topic_with(moving);
        assert!(completion_with_isr(&state, &topic, 0, &[1, 2]).is_none(), "3 is not in sync yet");
        let done = completion_with_isr(&state, &topic, 0, &[1, 2, 3]).expect("3 caught up");
        let done = applied(&topic, &done);
        assert_eq!(done.replicas, vec![3, 2]);
        assert_eq!(done.isr, vec![2, 3]);
        assert_eq!(done.leader, 2, "the removed leader hands over to an in-sync target replica");
        assert_eq!(done.leader_epoch, 1, "a new leader, a new epoch");
        assert!(!done.is_reassigning());
    }

    #[test]
    fn a_reassignment_among_in_sync_replicas_completes_at_once_and_cancelling_restores_the_original() {
        let state = cluster(&[1, 2, 3], &[]);
        let topic = topic_with(PartitionState::new(vec![1, 2, 3]));
        let partition = topic.partition(0).cloned().expect("partition");
        let record = start(&state, &topic, 0, &partition, &[2, 3]).expect("valid").expect("a change");
        let shrunk = applied(&topic, &record);
        assert_eq!((shrunk.replicas.clone(), shrunk.isr.clone(), shrunk.leader), (vec![2, 3], vec![2, 3], 2));
        assert!(start(&state, &topic, 0, &partition, &[1, 2, 3]).expect("valid").is_none(), "nothing to do");

        let topic =
            topic_with(PartitionState { replicas: vec![2, 1], isr: vec![1], adding_replicas: vec![2], ..partition });
        let reverted = start(&state, &topic, 0, &topic.assignments[0], &[1]).expect("valid").expect("a change");
        let reverted = applied(&topic, &reverted);
        assert_eq!((reverted.replicas, reverted.isr, reverted.leader), (vec![1], vec![1], 1));
        assert!(reverted.adding_replicas.is_empty());
    }

    #[test]
    fn targets_are_validated() {
        let state = cluster(&[1, 2, 3], &[]);
        let partition = PartitionState::new(vec![1, 2]);
        let kind =
            |target: &[i32], allow: bool| validate_target(&state, &partition, target, allow).err().map(|e| e.kind);
        assert_eq!(kind(&[1, 1], true), Some(ErrorKind::InvalidReplicaAssignment));
        assert_eq!(kind(&[], true), Some(ErrorKind::InvalidReplicaAssignment));
        assert_eq!(kind(&[1, 9], true), Some(ErrorKind::InvalidReplicaAssignment));
        assert_eq!(kind(&[1, 2, 3], false), Some(ErrorKind::InvalidReplicationFactor));
        assert_eq!(kind(&[1, 2, 3], true), None);
        assert_eq!(kind(&[3, 1], false), None);
    }
}
