//! Elastic topics (`docs/elastic.md`): creating one, splitting a physical partition, merging two,
//! and retiring the physical partitions a split or merge replaced once their moves are done.
//!
//! An elastic topic's partitions are its *stable* partitions, the ones Kafka clients see; a
//! physical partition is a range of them that shares one replica list (the first replica the
//! preferred leader). A split gives the upper half of a range a new physical partition and
//! places it on the least loaded brokers; a merge gives the upper range the lower one's
//! replicas. Either moves stable partitions with the partition reassignment of
//! [`crate::reassignment`] (throttled like any), never by rewriting records: a stable
//! partition's records and offsets stay what they were, so per-key order and committed offsets
//! hold across any number of splits and merges, for every client.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use weir_error::{BrokerError, ErrorKind};
use weir_metadata::elastic::{ElasticLayout, PhysicalPartition, PhysicalState, LOGICAL_PARTITIONS};
use weir_metadata::{MetadataRecord, MetadataState, PartitionState, TopicMetadata};

use crate::reassignment::{self, ReassignmentTarget};
use crate::topics::{CreatedTopic, NewTopic};
use crate::{capacity, topic_config, ControllerConfig, Decision, Entropy};

/// Stable partitions per physical partition when the creator does not say: room for four
/// levels of splits.
pub const DEFAULT_STABLE_PER_PHYSICAL: i32 = 16;

/// The stable partition count of a new elastic topic of `physical` physical partitions: the
/// one asked for, else the power of two at or above 16 per physical partition (at most
/// 65,536, and at most `max.partitions.per.topic`, rounded down to a power of two).
pub fn stable_partitions(config: &ControllerConfig, physical: i32, asked: Option<i32>) -> Result<i32, BrokerError> {
    let invalid = |message: String| Err(BrokerError::new(ErrorKind::InvalidPartitionCount, message));
    if physical < 1 {
        return invalid("an elastic topic needs at least one physical partition".into());
    }
    let stable = match asked {
        Some(stable) => stable,
        None => {
            let wanted = (i64::from(physical) * i64::from(DEFAULT_STABLE_PER_PHYSICAL))
                .min(i64::from(LOGICAL_PARTITIONS)) as u32;
            let cap = config.max_partitions_per_topic.clamp(1, LOGICAL_PARTITIONS) as u32;
            let cap = 1 << (31 - cap.leading_zeros());
            wanted.next_power_of_two().min(cap) as i32
        }
    };
    if !(1..=LOGICAL_PARTITIONS).contains(&stable) || stable.count_ones() != 1 {
        return invalid(format!(
            "{stable} stable partitions: an elastic topic's stable partition count is a power of two from 1 to \
             {LOGICAL_PARTITIONS}"
        ));
    }
    if stable < physical {
        return invalid(format!(
            "{physical} physical partitions over {stable} stable partitions: each physical partition serves at least \
             one stable partition"
        ));
    }
    if stable > config.max_partitions_per_topic {
        return invalid(format!(
            "{stable} stable partitions exceed the limit of {} per topic (max.partitions.per.topic)",
            config.max_partitions_per_topic
        ));
    }
    Ok(stable)
}

/// Decides the creation of an elastic topic of `topic.partitions` physical partitions (-1: the
/// broker's `num.partitions`) over `stable` stable partitions (`None`: [`stable_partitions`]'s
/// default). With `validate_only` nothing is committed.
pub fn decide_create(
    state: &MetadataState,
    config: &ControllerConfig,
    entropy: &mut dyn Entropy,
    topic: &NewTopic,
    stable: Option<i32>,
    validate_only: bool,
) -> Result<Decision<CreatedTopic>, BrokerError> {
    if !topic.assignments.is_empty() {
        return Err(BrokerError::new(
            ErrorKind::InvalidReplicaAssignment,
            "an elastic topic is placed by physical partition: manual replica assignments are not accepted",
        ));
    }
    let physical = if topic.partitions == -1 { config.num_partitions } else { topic.partitions };
    let stable = stable_partitions(config, physical, stable)?;
    // One replica list per physical partition, checked as a plain topic's would be.
    let per_physical =
        crate::topics::validate_new_topic(state, config, entropy, &NewTopic { partitions: physical, ..topic.clone() })?;
    let layout = ElasticLayout::new(stable, physical);
    let assignments: Vec<Vec<i32>> =
        layout.active().iter().flat_map(|p| p.stable_range().map(|_| per_physical[p.id as usize].clone())).collect();
    // Every stable partition is a log each of its replicas opens.
    capacity::check_capacity(state, &assignments, config.replica_capacity.as_ref())?;
    let id = if validate_only { uuid::Uuid::nil() } else { entropy.topic_id() };
    let configs = topic_config::with_rocketmq_defaults(topic.configs.clone());
    let replication_factor = assignments.first().map_or(0, |r| r.len() as i16);
    let created = TopicMetadata {
        name: topic.name.clone(),
        id,
        partitions: stable,
        configs: configs.clone(),
        internal: false,
        assignments: assignments.iter().cloned().map(PartitionState::new).collect(),
        elastic: Some(layout.clone()),
    };
    let records = if validate_only {
        Vec::new()
    } else {
        vec![
            MetadataRecord::CreateTopic {
                name: topic.name.clone(),
                id,
                partitions: stable,
                configs,
                internal: false,
                assignments,
            },
            MetadataRecord::SetElasticLayout { name: topic.name.clone(), id, layout },
        ]
    };
    Ok(Decision { records, answer: CreatedTopic { topic: created, replication_factor } })
}

/// What a split or merge did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElasticChange {
    /// The physical partitions it created, by range.
    pub created: Vec<i32>,
    /// The physical partitions it replaced (sealed until their moves are done, then retired).
    pub replaced: Vec<i32>,
    /// The stable partitions whose replicas move (by reassignment).
    pub moving: Vec<i32>,
    /// The stable partitions that keep their replicas but get another preferred leader (the
    /// caller elects it).
    pub new_leaders: Vec<i32>,
}

/// The load each broker carries, for placing what a split moves: each partition replica counts
/// one, each leadership one more. (A broker's measured load replaces it once brokers report it.)
pub fn placement_load(state: &MetadataState) -> BTreeMap<i32, f64> {
    let mut load: BTreeMap<i32, f64> = state.brokers.values().filter(|b| !b.fenced).map(|b| (b.id, 0.0)).collect();
    for topic in state.topics.values() {
        for partition in &topic.assignments {
            for replica in &partition.replicas {
                if let Some(l) = load.get_mut(replica) {
                    *l += 1.0;
                }
            }
            if let Some(l) = load.get_mut(&partition.leader) {
                *l += 1.0;
            }
        }
    }
    load
}

fn elastic_topic<'a>(
    state: &'a MetadataState,
    name: &str,
) -> Result<(&'a TopicMetadata, &'a ElasticLayout), BrokerError> {
    let topic = state.topic(name).ok_or_else(|| {
        BrokerError::new(ErrorKind::UnknownTopicOrPartition, format!("The topic '{name}' does not exist."))
    })?;
    let layout = topic.elastic.as_ref().ok_or_else(|| {
        BrokerError::new(
            ErrorKind::InvalidRequest,
            format!("topic '{name}' is not elastic: only an elastic topic's physical partitions split and merge"),
        )
    })?;
    Ok((topic, layout))
}

/// The active physical partition `id`, ready for a change: no move of its range in progress.
fn ready<'a>(topic: &TopicMetadata, layout: &'a ElasticLayout, id: i32) -> Result<&'a PhysicalPartition, BrokerError> {
    let physical = layout.physical(id).ok_or_else(|| {
        BrokerError::new(
            ErrorKind::UnknownTopicOrPartition,
            format!("topic '{}' has no physical partition {id}", topic.name),
        )
    })?;
    if physical.state != PhysicalState::Active {
        return Err(BrokerError::new(
            ErrorKind::InvalidRequest,
            format!(
                "physical partition {id} of topic '{}' is {}: it was replaced by {:?}",
                topic.name,
                physical.state.name(),
                physical.children
            ),
        ));
    }
    if let Some(s) = physical.stable_range().find(|s| topic.partition(*s).is_some_and(PartitionState::is_reassigning)) {
        return Err(BrokerError::new(
            ErrorKind::InvalidRequest,
            format!(
                "stable partition {s} of physical partition {id} of topic '{}' is still moving: wait until its \
                 reassignment completes",
                topic.name
            ),
        ));
    }
    Ok(physical)
}

/// The replicas a physical partition's stable partitions share (their first's targets).
fn replicas_of(topic: &TopicMetadata, physical: &PhysicalPartition) -> Vec<i32> {
    topic.partition(physical.first).map(PartitionState::target_replicas).unwrap_or_default()
}

/// Where the upper half of a split goes: the `replicas.len()` least loaded unfenced brokers,
/// least loaded first (the preferred leader). If those are the parent's own brokers, the half
/// stays on them with another preferred leader, so at least its leadership moves.
fn split_target(loads: &BTreeMap<i32, f64>, replicas: &[i32]) -> Vec<i32> {
    let mut by_load: Vec<(f64, i32)> = loads.iter().map(|(b, l)| (*l, *b)).collect();
    by_load.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let target: Vec<i32> = by_load.iter().map(|(_, b)| *b).take(replicas.len()).collect();
    let same_set = target.len() == replicas.len() && target.iter().all(|b| replicas.contains(b));
    if target.len() < replicas.len() || same_set {
        let mut rotated = replicas.to_vec();
        if !rotated.is_empty() {
            rotated.rotate_left(1);
        }
        return rotated;
    }
    target
}

/// A layout change and the moves it implies, as a decision. Physical partitions whose ranges
/// move nothing are retired at once, the others sealed until [`retirements`] finds their moves
/// done.
fn change_layout(
    state: &MetadataState,
    topic: &TopicMetadata,
    mut layout: ElasticLayout,
    replaced: &[i32],
    created: Vec<PhysicalPartition>,
    targets: &[(i32, Vec<i32>)],
) -> Result<Decision<ElasticChange>, BrokerError> {
    let mut moving = Vec::new();
    let mut new_leaders = Vec::new();
    let mut reassign = Vec::new();
    for (stable, target) in targets {
        let current = topic.partition(*stable).map(PartitionState::target_replicas).unwrap_or_default();
        if current == *target {
            continue;
        }
        let mut current_set = current.clone();
        current_set.sort_unstable();
        let mut target_set = target.clone();
        target_set.sort_unstable();
        if current_set == target_set {
            new_leaders.push(*stable);
        } else {
            moving.push(*stable);
        }
        reassign.push(ReassignmentTarget {
            topic: topic.name.clone(),
            partition: *stable,
            replicas: Some(target.clone()),
        });
    }
    let moves = reassignment::decide_alter(state, reassign, true);
    for (_, partition, outcome) in &moves.answer {
        if let Err(e) = outcome {
            return Err(BrokerError::new(e.kind, format!("stable partition {partition} cannot move: {}", e.message)));
        }
    }
    let sealed = !moving.is_empty();
    for physical in layout.physical.iter_mut().filter(|p| replaced.contains(&p.id)) {
        physical.state = if sealed { PhysicalState::Sealed } else { PhysicalState::Retired };
        physical.children = created.iter().map(|c| c.id).collect();
    }
    let created_ids = created.iter().map(|c| c.id).collect();
    layout.physical.extend(created);
    layout.check().map_err(|broken| BrokerError::internal(format!("elastic layout: {broken}")))?;
    let mut records = vec![MetadataRecord::SetElasticLayout { name: topic.name.clone(), id: topic.id, layout }];
    records.extend(moves.records);
    Ok(Decision {
        records,
        answer: ElasticChange { created: created_ids, replaced: replaced.to_vec(), moving, new_leaders },
    })
}

/// Decides splitting physical partition `id` of elastic topic `name` in two: the lower half of
/// its range stays where it is, the upper half goes to the least loaded brokers by `loads`.
/// A physical partition of one stable partition cannot split: Kafka clients address stable
/// partitions, so nothing finer can move without breaking their per-key order.
pub fn decide_split(
    state: &MetadataState,
    name: &str,
    id: i32,
    loads: &BTreeMap<i32, f64>,
) -> Result<Decision<ElasticChange>, BrokerError> {
    let (topic, layout) = elastic_topic(state, name)?;
    let parent = ready(topic, layout, id)?;
    if parent.end - parent.first < 2 {
        return Err(BrokerError::new(
            ErrorKind::InvalidRequest,
            format!(
                "physical partition {id} of topic '{name}' serves a single stable partition ({}): it cannot split \
                 further, since Kafka clients address stable partitions (the topic has {}, fixed at creation by \
                 --stable-partitions)",
                parent.first, layout.stable_partitions
            ),
        ));
    }
    let middle = parent.first + (parent.end - parent.first) / 2;
    let next = layout.next_id();
    let child = |id, first, end| PhysicalPartition {
        id,
        first,
        end,
        state: PhysicalState::Active,
        parents: vec![parent.id],
        children: Vec::new(),
    };
    let lower = child(next, parent.first, middle);
    let upper = child(next + 1, middle, parent.end);
    let target = split_target(loads, &replicas_of(topic, parent));
    let targets: Vec<(i32, Vec<i32>)> = upper.stable_range().map(|s| (s, target.clone())).collect();
    change_layout(state, topic, layout.clone(), &[parent.id], vec![lower, upper], &targets)
}

/// Decides merging the adjacent active physical partitions `a` and `b` of elastic topic `name`
/// into one, on the replicas of the lower range.
pub fn decide_merge(state: &MetadataState, name: &str, a: i32, b: i32) -> Result<Decision<ElasticChange>, BrokerError> {
    let (topic, layout) = elastic_topic(state, name)?;
    if a == b {
        return Err(BrokerError::new(
            ErrorKind::InvalidRequest,
            format!("cannot merge physical partition {a} with itself"),
        ));
    }
    let (first, second) = (ready(topic, layout, a)?, ready(topic, layout, b)?);
    let (lower, upper) = if first.first < second.first { (first, second) } else { (second, first) };
    if lower.end != upper.first {
        return Err(BrokerError::new(
            ErrorKind::InvalidRequest,
            format!(
                "physical partitions {a} and {b} of topic '{name}' are not adjacent (stable partitions [{}, {}) and \
                 [{}, {})): only neighbouring ranges merge",
                lower.first, lower.end, upper.first, upper.end
            ),
        ));
    }
    let merged = PhysicalPartition {
        id: layout.next_id(),
        first: lower.first,
        end: upper.end,
        state: PhysicalState::Active,
        parents: vec![lower.id, upper.id],
        children: Vec::new(),
    };
    let target = replicas_of(topic, lower);
    let targets: Vec<(i32, Vec<i32>)> = upper.stable_range().map(|s| (s, target.clone())).collect();
    change_layout(state, topic, layout.clone(), &[lower.id, upper.id], vec![merged], &targets)
}

/// The layout changes that retire the sealed physical partitions whose ranges have moved: no
/// stable partition of theirs is being reassigned any more (a safety net of the controller's
/// tick, as reassignments complete on their own).
pub fn retirements(state: &MetadataState) -> Vec<MetadataRecord> {
    let mut records = Vec::new();
    for topic in state.topics.values() {
        let Some(layout) = &topic.elastic else { continue };
        let done = |p: &PhysicalPartition| {
            p.state == PhysicalState::Sealed
                && !p.stable_range().any(|s| topic.partition(s).is_some_and(PartitionState::is_reassigning))
        };
        if !layout.physical.iter().any(done) {
            continue;
        }
        let mut next = layout.clone();
        for physical in next.physical.iter_mut().filter(|p| done(p)) {
            physical.state = PhysicalState::Retired;
        }
        records.push(MetadataRecord::SetElasticLayout { name: topic.name.clone(), id: topic.id, layout: next });
    }
    records
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl Entropy for Fixed {
        fn topic_id(&mut self) -> uuid::Uuid {
            uuid::Uuid::from_u128(7)
        }
        fn below(&mut self, _n: usize) -> usize {
            0
        }
    }

    fn config() -> ControllerConfig {
        ControllerConfig {
            num_partitions: 1,
            default_replication_factor: 1,
            max_partitions_per_topic: 100_000,
            delete_topic_enable: true,
            offsets_topic_replication_factor: 1,
            transaction_state_replication_factor: 1,
            messaging_state_replication_factor: 1,
            topic_defaults: BTreeMap::new(),
            replica_capacity: None,
        }
    }

    fn cluster(brokers: &[i32]) -> MetadataState {
        let mut state = MetadataState::new();
        for &b in brokers {
            state.brokers.insert(b, crate::placement::test_broker(b, false));
        }
        state
    }

    fn apply(state: &mut MetadataState, records: &[MetadataRecord]) {
        for record in records {
            let offset = state.applied_offset + 1;
            state.apply(offset, record);
        }
    }

    fn create(state: &mut MetadataState, physical: i32, stable: Option<i32>, rf: i16) -> TopicMetadata {
        let topic = NewTopic {
            name: "e".into(),
            partitions: physical,
            replication_factor: rf,
            assignments: Vec::new(),
            configs: BTreeMap::new(),
        };
        let decision = decide_create(state, &config(), &mut Fixed, &topic, stable, false).expect("created");
        apply(state, &decision.records);
        state.topic("e").cloned().expect("topic")
    }

    #[test]
    fn the_stable_partition_count_defaults_to_sixteen_per_physical_partition_and_is_checked() {
        let config = config();
        assert_eq!(stable_partitions(&config, 1, None).ok(), Some(16));
        assert_eq!(stable_partitions(&config, 3, None).ok(), Some(64));
        assert_eq!(stable_partitions(&config, 5000, None).ok(), Some(65_536));
        assert_eq!(
            stable_partitions(&ControllerConfig { max_partitions_per_topic: 100, ..config.clone() }, 4, None).ok(),
            Some(64)
        );
        for (physical, asked) in [(1, 12), (4, 2), (1, 131_072), (0, 16)] {
            let refused = stable_partitions(&config, physical, Some(asked)).expect_err("refused");
            assert_eq!(refused.kind, ErrorKind::InvalidPartitionCount, "{refused}");
        }
    }

    #[test]
    fn an_elastic_topic_places_each_physical_partitions_range_together() {
        let mut state = cluster(&[1, 2, 3]);
        let topic = create(&mut state, 3, Some(16), 2);
        assert_eq!(topic.partitions, 16);
        let layout = topic.elastic.clone().expect("elastic");
        assert_eq!(layout.active().iter().map(|p| (p.first, p.end)).collect::<Vec<_>>(), [(0, 5), (5, 10), (10, 16)]);
        for p in layout.active() {
            let replicas = replicas_of(&topic, p);
            assert_eq!(replicas.len(), 2);
            assert!(p.stable_range().all(|s| topic.partition(s).map(|x| &x.replicas) == Some(&replicas)));
        }
        assert_ne!(replicas_of(&topic, layout.active()[0]), replicas_of(&topic, layout.active()[1]));
    }

    #[test]
    fn a_split_moves_the_upper_half_to_the_least_loaded_brokers_and_retires_the_parent_once_moved() {
        let mut state = cluster(&[1, 2, 3]);
        let topic = create(&mut state, 1, Some(8), 1);
        let parent_broker = topic.partition(0).map(|p| p.leader).expect("leader");
        let loads: BTreeMap<i32, f64> = [(1, 5.0), (2, 1.0), (3, 3.0)].into();
        let decision = decide_split(&state, "e", 0, &loads).expect("split");
        assert_eq!(decision.answer.created, [1, 2]);
        let expected_moving: Vec<i32> = if parent_broker == 2 { vec![] } else { (4..8).collect() };
        assert_eq!(decision.answer.moving, expected_moving);
        apply(&mut state, &decision.records);
        let topic = state.topic("e").cloned().expect("topic");
        let layout = topic.elastic.clone().expect("elastic");
        assert_eq!(layout.active().iter().map(|p| (p.id, p.first, p.end)).collect::<Vec<_>>(), [(1, 0, 4), (2, 4, 8)]);
        assert_eq!(layout.physical(0).map(|p| p.state), Some(PhysicalState::Sealed));
        assert!((4..8).all(|s| topic.partition(s).map(PartitionState::target_replicas) == Some(vec![2])));
        assert!((0..4).all(|s| topic.partition(s).map(PartitionState::target_replicas) == Some(vec![parent_broker])));
        // Moving stable partitions refuse another change; the parent is retired once they are in sync.
        assert!(decide_split(&state, "e", 2, &loads).is_err());
        assert!(retirements(&state).is_empty());
        for s in 4..8 {
            let record = reassignment::completion_with_isr(&state, &topic, s, &[parent_broker, 2]).expect("completes");
            apply(&mut state, &[record]);
        }
        let records = retirements(&state);
        apply(&mut state, &records);
        let layout = state.topic("e").and_then(|t| t.elastic.clone()).expect("elastic");
        assert_eq!(layout.physical(0).map(|p| p.state), Some(PhysicalState::Retired));
        assert!(retirements(&state).is_empty());
    }

    #[test]
    fn on_one_broker_a_split_moves_nothing_and_a_single_stable_partition_does_not_split() {
        let mut state = cluster(&[1]);
        create(&mut state, 1, Some(2), 1);
        let loads = placement_load(&state);
        let decision = decide_split(&state, "e", 0, &loads).expect("split");
        assert!(decision.answer.moving.is_empty() && decision.answer.new_leaders.is_empty());
        apply(&mut state, &decision.records);
        let layout = state.topic("e").and_then(|t| t.elastic.clone()).expect("elastic");
        assert_eq!(layout.physical(0).map(|p| p.state), Some(PhysicalState::Retired));
        let refused = decide_split(&state, "e", 1, &loads).expect_err("one stable partition");
        assert!(refused.message.contains("single stable partition"), "{refused}");
        let refused = decide_split(&state, "e", 0, &loads).expect_err("retired");
        assert!(refused.message.contains("retired"), "{refused}");
    }

    #[test]
    fn a_merge_takes_adjacent_ranges_onto_the_lower_ones_replicas() {
        let mut state = cluster(&[1, 2]);
        create(&mut state, 4, Some(8), 1);
        assert!(decide_merge(&state, "e", 0, 2).expect_err("not adjacent").message.contains("adjacent"));
        assert!(decide_merge(&state, "e", 1, 1).is_err());
        let decision = decide_merge(&state, "e", 2, 1).expect("merge");
        assert_eq!(decision.answer.created, [4]);
        apply(&mut state, &decision.records);
        let topic = state.topic("e").cloned().expect("topic");
        let layout = topic.elastic.clone().expect("elastic");
        let merged = layout.physical(4).expect("merged").clone();
        assert_eq!((merged.first, merged.end, merged.parents.clone()), (2, 6, vec![1, 2]));
        let lower = topic.partition(2).map(PartitionState::target_replicas).expect("lower");
        assert!((2..6).all(|s| topic.partition(s).map(PartitionState::target_replicas) == Some(lower.clone())));
        let refused = decide_split(&state, "plain", 0, &BTreeMap::new()).expect_err("unknown");
        assert_eq!(refused.kind, ErrorKind::UnknownTopicOrPartition);
    }
}
