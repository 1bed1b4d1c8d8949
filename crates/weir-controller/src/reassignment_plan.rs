//! Reassignment plans (what `kafka-reassign-partitions.sh --generate` proposes): the replicas
//! each partition should move to, so that some brokers hold nothing any more (before they are
//! decommissioned) or so that replicas and preferred leaders spread evenly over the brokers.
//!
//! A plan is only a proposal: it commits nothing. It is executed as any plan is, through
//! [`crate::reassignment`] (throttled, each new replica copies, joins the ISR, then the old one
//! is dropped), so a plan generated here and one written by hand behave the same.
//!
//! Planning reads the *settled* replicas of a partition: during a reassignment its replicas
//! are the target plus the ones being removed, and the target is where it is going.
//!
//! Invariants of every plan (checked by the unit tests, and by `check_plan` in debug builds):
//! a proposed replica list has as many replicas as the current one, none twice, only brokers
//! the plan may use; a partition appears only if its replicas change.

use std::collections::{BTreeMap, BTreeSet};

use weir_error::{BrokerError, ErrorKind};
use weir_metadata::MetadataState;

use crate::placement::unfenced_brokers;

/// What a plan is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanGoal {
    /// Move every replica off these brokers, onto the other live brokers, the least loaded
    /// first (and the one in the replaced broker's rack when there is one).
    RemoveBrokers(Vec<i32>),
    /// Spread replicas over the live brokers (no broker more than one above another), then
    /// the preferred leaders (each partition's first replica) likewise as far as swapping
    /// replicas within a partition allows.
    Balance,
}

/// One partition's move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMove {
    pub topic: String,
    pub partition: i32,
    /// Its settled replicas now, the preferred leader first.
    pub current: Vec<i32>,
    /// Where the plan puts them; the same length.
    pub proposed: Vec<i32>,
}

/// One partition as the planner sees it.
struct Slot {
    topic: String,
    partition: i32,
    current: Vec<i32>,
    replicas: Vec<i32>,
    /// Whether the plan may move it (its topic was asked for).
    movable: bool,
}

/// The plan for `goal` over the partitions of `topics` (every topic when `None`; replicas of
/// the others still count in the brokers' loads). Errors when a broker to remove is unknown or
/// when too few brokers would remain to hold a partition's replicas.
pub fn plan(
    state: &MetadataState,
    goal: &PlanGoal,
    topics: Option<&[String]>,
) -> Result<Vec<PlannedMove>, BrokerError> {
    if let Some(unknown) = topics.into_iter().flatten().find(|t| state.topic(t).is_none()) {
        return Err(BrokerError::new(ErrorKind::UnknownTopicOrPartition, format!("topic '{unknown}' does not exist")));
    }
    let mut slots = slots(state, topics);
    let usable = match goal {
        PlanGoal::RemoveBrokers(removed) => {
            check_removed(state, &slots, removed)?;
            let usable: Vec<i32> = unfenced_brokers(state).into_iter().filter(|b| !removed.contains(b)).collect();
            move_off(state, &mut slots, removed, &usable)?;
            usable
        }
        PlanGoal::Balance => {
            let usable = unfenced_brokers(state);
            if usable.is_empty() {
                return Err(BrokerError::new(ErrorKind::InvalidRequest, "no live broker to balance over"));
            }
            balance_replicas(&mut slots, &usable);
            balance_leaders(&mut slots, &usable);
            usable
        }
    };
    let moves: Vec<PlannedMove> = slots
        .into_iter()
        .filter(|s| s.movable && s.replicas != s.current)
        .map(|s| PlannedMove { topic: s.topic, partition: s.partition, current: s.current, proposed: s.replicas })
        .collect();
    check_plan(&moves, &usable);
    Ok(moves)
}

/// Every partition with replicas, in topic and partition order.
fn slots(state: &MetadataState, topics: Option<&[String]>) -> Vec<Slot> {
    let mut out = Vec::new();
    for topic in state.topics.values() {
        let movable = topics.is_none_or(|wanted| wanted.contains(&topic.name));
        for (index, partition) in topic.assignments.iter().enumerate() {
            let settled: Vec<i32> =
                partition.replicas.iter().copied().filter(|b| !partition.removing_replicas.contains(b)).collect();
            if settled.is_empty() {
                continue;
            }
            let partition = i32::try_from(index).unwrap_or(i32::MAX);
            out.push(Slot {
                topic: topic.name.clone(),
                partition,
                current: settled.clone(),
                replicas: settled,
                movable,
            });
        }
    }
    out
}

/// A broker to remove must be registered or hold a replica (a typo would otherwise plan
/// nothing and look like success), and some broker must remain.
fn check_removed(state: &MetadataState, slots: &[Slot], removed: &[i32]) -> Result<(), BrokerError> {
    if removed.is_empty() {
        return Err(BrokerError::new(ErrorKind::InvalidRequest, "name at least one broker to move replicas off"));
    }
    for id in removed {
        if !state.brokers.contains_key(id) && !slots.iter().any(|s| s.replicas.contains(id)) {
            return Err(BrokerError::new(
                ErrorKind::InvalidRequest,
                format!("broker {id} is not registered and holds no replica"),
            ));
        }
    }
    Ok(())
}

/// Replicas per usable broker over every slot (movable or not).
fn loads(slots: &[Slot], usable: &[i32]) -> BTreeMap<i32, usize> {
    let mut load: BTreeMap<i32, usize> = usable.iter().map(|b| (*b, 0)).collect();
    for b in slots.iter().flat_map(|s| &s.replicas) {
        if let Some(count) = load.get_mut(b) {
            *count += 1;
        }
    }
    load
}

fn move_off(state: &MetadataState, slots: &mut [Slot], removed: &[i32], usable: &[i32]) -> Result<(), BrokerError> {
    let mut load = loads(slots, usable);
    let rack = |b: i32| state.brokers.get(&b).and_then(|r| r.rack.clone());
    for slot in slots.iter_mut().filter(|s| s.movable) {
        for position in 0..slot.replicas.len() {
            let gone = slot.replicas[position];
            if !removed.contains(&gone) {
                continue;
            }
            let gone_rack = rack(gone);
            // Least loaded first; in the replaced broker's rack before others; then by id.
            let replacement = usable
                .iter()
                .copied()
                .filter(|b| !slot.replicas.contains(b))
                .min_by_key(|b| (gone_rack.is_some() && rack(*b) != gone_rack, load.get(b).copied(), *b));
            let Some(replacement) = replacement else {
                return Err(BrokerError::new(
                    ErrorKind::InvalidReplicationFactor,
                    format!(
                        "{}-{} has {} replicas, more than the {} live brokers that would remain ({usable:?})",
                        slot.topic,
                        slot.partition,
                        slot.replicas.len(),
                        usable.len()
                    ),
                ));
            };
            // The replacement takes the removed broker's place, so a partition whose preferred
            // leader moves keeps a preferred leader on the broker that got its load.
            slot.replicas[position] = replacement;
            *load.entry(replacement).or_default() += 1;
        }
    }
    Ok(())
}

/// Moves one replica at a time from the most loaded broker to the least loaded one that the
/// partition does not hold yet, while some pair differs by two or more. Each move lowers the
/// sum of squared loads, so this ends; it stops early when no movable partition allows a move.
fn balance_replicas(slots: &mut [Slot], usable: &[i32]) {
    let mut load = loads(slots, usable);
    loop {
        let mut by_load: Vec<(usize, i32)> = load.iter().map(|(b, n)| (*n, *b)).collect();
        by_load.sort_unstable();
        let mut moved = false;
        'pairs: for &(high_load, high) in by_load.iter().rev() {
            for &(low_load, low) in &by_load {
                if high_load < low_load + 2 {
                    break;
                }
                let found =
                    slots.iter_mut().find(|s| s.movable && s.replicas.contains(&high) && !s.replicas.contains(&low));
                if let Some(slot) = found {
                    for b in slot.replicas.iter_mut().filter(|b| **b == high) {
                        *b = low;
                    }
                    *load.entry(high).or_default() -= 1;
                    *load.entry(low).or_default() += 1;
                    moved = true;
                    break 'pairs;
                }
            }
        }
        if !moved {
            return;
        }
    }
}

/// Swaps a partition's first replica with the one of its replicas that is the preferred
/// leader of the fewest partitions, while that one leads at least two fewer than the first.
/// Each swap lowers the sum of squared leader counts, so the passes end.
fn balance_leaders(slots: &mut [Slot], usable: &[i32]) {
    let mut leads: BTreeMap<i32, usize> = usable.iter().map(|b| (*b, 0)).collect();
    for slot in slots.iter() {
        if let Some(count) = slot.replicas.first().and_then(|b| leads.get_mut(b)) {
            *count += 1;
        }
    }
    let count = |leads: &BTreeMap<i32, usize>, b: i32| leads.get(&b).copied();
    loop {
        let mut swapped = false;
        for slot in slots.iter_mut().filter(|s| s.movable) {
            let Some(first_leads) = slot.replicas.first().and_then(|b| count(&leads, *b)) else { continue };
            let fewest = (1..slot.replicas.len()).filter_map(|i| count(&leads, slot.replicas[i]).map(|n| (n, i))).min();
            if let Some((other_leads, other)) = fewest.filter(|(n, _)| n + 2 <= first_leads) {
                let (from, to) = (slot.replicas[0], slot.replicas[other]);
                slot.replicas.swap(0, other);
                leads.insert(from, first_leads - 1);
                leads.insert(to, other_leads + 1);
                swapped = true;
            }
        }
        if !swapped {
            return;
        }
    }
}

/// The invariants of the module doc (debug builds only).
fn check_plan(moves: &[PlannedMove], usable: &[i32]) {
    if !cfg!(debug_assertions) {
        return;
    }
    for m in moves {
        assert_eq!(m.current.len(), m.proposed.len(), "{}-{}: the replication factor changed", m.topic, m.partition);
        let distinct: BTreeSet<i32> = m.proposed.iter().copied().collect();
        assert_eq!(distinct.len(), m.proposed.len(), "{}-{}: a broker twice in {:?}", m.topic, m.partition, m.proposed);
        assert_ne!(m.current, m.proposed, "{}-{}: a move that moves nothing", m.topic, m.partition);
        for b in m.proposed.iter().filter(|b| !m.current.contains(b)) {
            assert!(usable.contains(b), "{}-{}: broker {b} may not be used", m.topic, m.partition);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;
    use weir_metadata::{PartitionState, TopicMetadata};

    fn cluster(brokers: &[i32], topics: &[(&str, Vec<Vec<i32>>)]) -> MetadataState {
        let mut state = MetadataState::new();
        for &b in brokers {
            state.brokers.insert(b, crate::placement::test_broker(b, false));
        }
        for (name, assignments) in topics {
            state.topics.insert(
                name.to_string(),
                std::sync::Arc::new(TopicMetadata {
                    name: name.to_string(),
                    id: Uuid::new_v4(),
                    partitions: assignments.len() as i32,
                    configs: Default::default(),
                    internal: false,
                    assignments: assignments.iter().map(|r| PartitionState::new(r.clone())).collect(),
                    elastic: None,
                }),
            );
        }
        state
    }

    /// Replicas and preferred leaders per broker after `moves` are applied to `state`.
    fn after(state: &MetadataState, moves: &[PlannedMove]) -> (BTreeMap<i32, usize>, BTreeMap<i32, usize>) {
        let (mut replicas, mut leaders) = (BTreeMap::new(), BTreeMap::new());
        for topic in state.topics.values() {
            for (i, p) in topic.assignments.iter().enumerate() {
                let planned = moves.iter().find(|m| m.topic == topic.name && m.partition == i as i32);
                let list = planned.map_or(&p.replicas, |m| &m.proposed);
                for b in list {
                    *replicas.entry(*b).or_insert(0) += 1;
                }
                *leaders.entry(list[0]).or_insert(0) += 1;
            }
        }
        (replicas, leaders)
    }

    fn spread(counts: &BTreeMap<i32, usize>, brokers: &[i32]) -> usize {
        let of = |b: &i32| counts.get(b).copied().unwrap_or(0);
        brokers.iter().map(of).max().unwrap_or(0) - brokers.iter().map(of).min().unwrap_or(0)
    }

    #[test]
    fn removing_a_broker_moves_only_its_replicas_and_spreads_them() {
        let assignments: Vec<Vec<i32>> = (0..12).map(|i| vec![1 + i % 4, 1 + (i + 1) % 4, 1 + (i + 2) % 4]).collect();
        let state = cluster(&[1, 2, 3, 4], &[("t", assignments.clone())]);
        let moves = plan(&state, &PlanGoal::RemoveBrokers(vec![3]), None).expect("a plan");
        assert_eq!(moves.len(), assignments.iter().filter(|r| r.contains(&3)).count(), "every partition on 3, only");
        for m in &moves {
            assert!(!m.proposed.contains(&3), "{m:?}");
            let kept: Vec<(usize, i32)> = m.current.iter().copied().enumerate().filter(|(_, b)| *b != 3).collect();
            assert!(kept.iter().all(|(i, b)| m.proposed[*i] == *b), "the other replicas stay in place: {m:?}");
        }
        let (replicas, _) = after(&state, &moves);
        assert_eq!(replicas.get(&3), None);
        assert!(spread(&replicas, &[1, 2, 4]) <= 1, "{replicas:?}");
    }

    #[test]
    fn removing_too_many_or_unknown_brokers_is_refused() {
        let state = cluster(&[1, 2, 3], &[("t", vec![vec![1, 2, 3]])]);
        let too_many = plan(&state, &PlanGoal::RemoveBrokers(vec![3]), None).expect_err("3 replicas on 2 brokers");
        assert_eq!(too_many.kind, ErrorKind::InvalidReplicationFactor);
        let unknown = plan(&state, &PlanGoal::RemoveBrokers(vec![9]), None).expect_err("no broker 9");
        assert!(unknown.message.contains("broker 9"), "{unknown:?}");
        assert!(plan(&state, &PlanGoal::RemoveBrokers(vec![]), None).is_err());
        let missing = plan(&state, &PlanGoal::Balance, Some(&["nope".to_string()])).expect_err("no such topic");
        assert_eq!(missing.kind, ErrorKind::UnknownTopicOrPartition);
    }

    #[test]
    fn balancing_spreads_replicas_and_leaders_over_a_new_broker() {
        // Everything on 1 and 2, led by 1; broker 3 just joined.
        let state = cluster(&[1, 2, 3], &[("a", vec![vec![1, 2]; 6]), ("b", vec![vec![1, 2]; 3])]);
        let moves = plan(&state, &PlanGoal::Balance, None).expect("a plan");
        let (replicas, leaders) = after(&state, &moves);
        assert!(spread(&replicas, &[1, 2, 3]) <= 1, "{replicas:?}");
        assert!(spread(&leaders, &[1, 2, 3]) <= 1, "{leaders:?}");
        assert!(moves.iter().all(|m| m.current != m.proposed && m.proposed.len() == 2));
    }

    #[test]
    fn a_balanced_cluster_needs_no_moves_and_other_topics_stay_put() {
        let state = cluster(&[1, 2, 3], &[("t", vec![vec![1, 2], vec![2, 3], vec![3, 1]])]);
        assert_eq!(plan(&state, &PlanGoal::Balance, None).expect("a plan"), Vec::new());
        let lopsided = cluster(&[1, 2, 3], &[("a", vec![vec![1, 2]; 4]), ("b", vec![vec![1, 2]; 4])]);
        let only_b = plan(&lopsided, &PlanGoal::Balance, Some(&["b".to_string()])).expect("a plan");
        assert!(!only_b.is_empty() && only_b.iter().all(|m| m.topic == "b"), "{only_b:?}");
    }
}
