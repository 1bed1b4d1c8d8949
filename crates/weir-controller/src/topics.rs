//! Decisions about topics: creating them (by clients, by auto-creation, and the internal
//! topics), deleting them, adding partitions and changing their configs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;
use weir_error::{BrokerError, ErrorKind};
use weir_metadata::{
    MetadataRecord, MetadataState, PartitionState, TopicMetadata, DELAYED_MESSAGES_TOPIC, HALF_MESSAGES_TOPIC,
    OFFSETS_TOPIC, SHARE_GROUP_STATE_TOPIC, TRANSACTION_STATE_TOPIC,
};

use crate::topic_config::{self, ConfigEdit};
use crate::{capacity, placement, ControllerConfig, Decision, Entropy};

/// Longest legal topic name (Kafka's limit, which keeps `<topic>-<partition>` a valid file name).
pub const MAX_TOPIC_NAME_LEN: usize = 249;

/// A topic to create.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NewTopic {
    pub name: String,
    /// -1: the broker's `num.partitions`.
    pub partitions: i32,
    /// -1: the broker's `default.replication.factor`.
    pub replication_factor: i16,
    /// Manual assignment: partition → replica broker ids. Empty for automatic.
    pub assignments: Vec<(i32, Vec<i32>)>,
    pub configs: BTreeMap<String, String>,
}

/// A created (or, with validate-only, validated) topic.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CreatedTopic {
    pub topic: TopicMetadata,
    pub replication_factor: i16,
}

/// The prefix of RocketMQ's dead-letter topics, `%DLQ%<group>`: the one exception to Kafka's
/// naming rule.
pub const DEAD_LETTER_PREFIX: &str = "%DLQ%";

/// Checks a topic name against Kafka's rules.
pub fn validate_topic_name(name: &str) -> Result<(), BrokerError> {
    let invalid = |why: String| Err(BrokerError::new(ErrorKind::InvalidTopic, why));
    if name.is_empty() {
        return invalid("Topic name is illegal, it can't be empty".into());
    }
    if name == "." || name == ".." {
        return invalid(format!("Topic name cannot be \"{name}\""));
    }
    if name.len() > MAX_TOPIC_NAME_LEN {
        return invalid(format!(
            "Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LEN} characters, topic name: {name}"
        ));
    }
    let rest = match name.strip_prefix(DEAD_LETTER_PREFIX) {
        Some("") => return invalid("Topic name is illegal, a dead-letter topic names its group".into()),
        Some(group) => group,
        None => name,
    };
    if !rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-') {
        return invalid(format!(
            "Topic name \"{name}\" is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'"
        ));
    }
    Ok(())
}

/// Checks a partition count against `max.partitions.per.topic`.
fn check_partition_count(config: &ControllerConfig, partitions: i32) -> Result<(), BrokerError> {
    if partitions < 1 {
        return Err(BrokerError::new(ErrorKind::InvalidPartitionCount, "Number of partitions must be larger than 0."));
    }
    if partitions > config.max_partitions_per_topic {
        return Err(BrokerError::new(
            ErrorKind::InvalidPartitionCount,
            format!(
                "Number of partitions {partitions} exceeds the limit of {} per topic (max.partitions.per.topic).",
                config.max_partitions_per_topic
            ),
        ));
    }
    Ok(())
}

/// Decides the creation of one topic a client asked for. With `validate_only` nothing is
/// committed and the answer shows the topic as it would be.
pub fn decide_create(
    state: &MetadataState,
    config: &ControllerConfig,
    entropy: &mut dyn Entropy,
    topic: &NewTopic,
    validate_only: bool,
) -> Result<Decision<CreatedTopic>, BrokerError> {
    let assignments = validate_new_topic(state, config, entropy, topic)?;
    let partitions = assignments.len() as i32;
    let replication_factor = assignments.first().map_or(0, |r| r.len() as i16);
    let id = if validate_only { Uuid::nil() } else { entropy.topic_id() };
    let configs = topic_config::with_rocketmq_defaults(topic.configs.clone());
    let created = TopicMetadata {
        name: topic.name.clone(),
        id,
        partitions,
        configs: configs.clone(),
        internal: false,
        assignments: assignments.iter().cloned().map(PartitionState::new).collect(),
        elastic: None,
    };
    let records = if validate_only {
        Vec::new()
    } else {
        vec![MetadataRecord::CreateTopic {
            name: topic.name.clone(),
            id,
            partitions,
            configs,
            // Only the broker creates internal topics (decide_ensure_internal).
            internal: false,
            assignments,
        }]
    };
    Ok(Decision { records, answer: CreatedTopic { topic: created, replication_factor } })
}

/// Checks a topic to create; returns the replicas of each of its partitions.
pub(crate) fn validate_new_topic(
    state: &MetadataState,
    config: &ControllerConfig,
    entropy: &mut dyn Entropy,
    topic: &NewTopic,
) -> Result<Vec<Vec<i32>>, BrokerError> {
    validate_topic_name(&topic.name)?;
    if state.topic(&topic.name).is_some() {
        return Err(BrokerError::new(ErrorKind::TopicExists, format!("Topic '{}' already exists.", topic.name)));
    }
    let brokers = placement::unfenced_brokers(state);
    let assignments = if topic.assignments.is_empty() {
        let partitions = if topic.partitions == -1 { config.num_partitions } else { topic.partitions };
        let rf =
            if topic.replication_factor == -1 { config.default_replication_factor } else { topic.replication_factor };
        check_partition_count(config, partitions)?;
        let rf = placement::check_replication_factor(rf, &brokers)?;
        placement::assign_replicas(0, partitions, rf, &brokers, entropy.below(brokers.len()))
    } else {
        if topic.partitions != -1 || topic.replication_factor != -1 {
            return Err(BrokerError::new(
                ErrorKind::InvalidRequest,
                "Both numPartitions or replicationFactor and replicasAssignments were set. Both cannot be used at the same time.",
            ));
        }
        let mut by_partition: Vec<Option<Vec<i32>>> = vec![None; topic.assignments.len()];
        for (partition, replicas) in &topic.assignments {
            let slot = usize::try_from(*partition).ok().and_then(|p| by_partition.get_mut(p));
            match slot {
                Some(slot @ None) => *slot = Some(replicas.clone()),
                _ => {
                    return Err(BrokerError::new(
                        ErrorKind::InvalidReplicaAssignment,
                        "Partitions should be a consecutive 0-based integer sequence",
                    ))
                }
            }
        }
        let assignments: Vec<Vec<i32>> = by_partition.into_iter().flatten().collect();
        check_partition_count(config, assignments.len() as i32)?;
        placement::check_manual_assignment(&assignments, &brokers)?;
        assignments
    };
    topic_config::validate(&topic.configs).map_err(|e| BrokerError::new(ErrorKind::InvalidConfig, e.message))?;
    capacity::check_capacity(state, &assignments, config.replica_capacity.as_ref())?;
    Ok(assignments)
}

/// Decides the creation of internal topic `name` unless it exists (the answer is its metadata
/// either way, once committed). Internal topics get their configured replication factor (3 by
/// default), as far as there are brokers for it: one broker alone still has its offsets topic.
pub fn decide_ensure_internal(
    state: &MetadataState,
    config: &ControllerConfig,
    entropy: &mut dyn Entropy,
    name: &str,
    partitions: i32,
    configs: BTreeMap<String, String>,
) -> Result<Decision<()>, BrokerError> {
    if state.topic(name).is_some() {
        return Ok(Decision::nothing(()));
    }
    if !name.starts_with("__") {
        return Err(BrokerError::new(ErrorKind::InvalidTopic, format!("{name} is not an internal topic name")));
    }
    validate_topic_name(name)?;
    check_partition_count(config, partitions)?;
    let brokers = placement::unfenced_brokers(state);
    if brokers.is_empty() {
        return Err(BrokerError::new(ErrorKind::Unavailable, "no broker is registered and unfenced yet"));
    }
    let wanted = match name {
        TRANSACTION_STATE_TOPIC => config.transaction_state_replication_factor,
        OFFSETS_TOPIC => config.offsets_topic_replication_factor,
        DELAYED_MESSAGES_TOPIC | HALF_MESSAGES_TOPIC | SHARE_GROUP_STATE_TOPIC => {
            config.messaging_state_replication_factor
        }
        _ => config.default_replication_factor,
    };
    let rf = (wanted.max(1) as usize).min(brokers.len());
    // A min ISR above the replicas the topic got would refuse every write: capped at them.
    let mut configs = configs;
    if let Some(min_isr) = configs.get_mut("min.insync.replicas") {
        if min_isr.parse::<usize>().is_ok_and(|m| m > rf) {
            *min_isr = rf.to_string();
        }
    }
    let start = entropy.below(brokers.len());
    let record = MetadataRecord::CreateTopic {
        name: name.to_string(),
        id: entropy.topic_id(),
        partitions,
        configs,
        internal: true,
        assignments: placement::assign_replicas(0, partitions, rf, &brokers, start),
    };
    Ok(Decision { records: vec![record], answer: () })
}

/// Decides the deletion of a topic named by `name` (when given and not empty) or by `id`; the
/// answer is the topic deleted.
pub fn decide_delete(
    state: &MetadataState,
    config: &ControllerConfig,
    name: Option<&str>,
    id: Option<Uuid>,
) -> Result<Decision<TopicMetadata>, BrokerError> {
    if !config.delete_topic_enable {
        return Err(BrokerError::new(
            ErrorKind::TopicDeletionDisabled,
            "Topic deletion is disabled (delete.topic.enable=false).",
        ));
    }
    let topic = match (name, id) {
        (Some(name), _) if !name.is_empty() => state.topic(name),
        (_, Some(id)) => state.topic_by_id(id),
        _ => None,
    };
    let Some(topic) = topic.cloned() else {
        return Err(match id {
            Some(id) if name.is_none_or(str::is_empty) => {
                BrokerError::new(ErrorKind::UnknownTopicId, format!("Topic id {id} does not exist."))
            }
            _ => BrokerError::new(
                ErrorKind::UnknownTopicOrPartition,
                format!("Topic '{}' does not exist.", name.unwrap_or_default()),
            ),
        });
    };
    if topic.internal {
        return Err(BrokerError::new(
            ErrorKind::InvalidRequest,
            format!("Internal topic {} cannot be deleted.", topic.name),
        ));
    }
    let record = MetadataRecord::DeleteTopic { name: topic.name.clone(), id: topic.id };
    Ok(Decision { records: vec![record], answer: topic })
}

/// Decides growing topic `name` to `count` partitions, the new ones on the `assignments` given
/// (one replica list per new partition) or placed like the topic's.
pub fn decide_create_partitions(
    state: &MetadataState,
    config: &ControllerConfig,
    name: &str,
    count: i32,
    assignments: Option<Vec<Vec<i32>>>,
    validate_only: bool,
) -> Result<Decision<()>, BrokerError> {
    let topic = state.topic(name).ok_or_else(|| {
        BrokerError::new(ErrorKind::UnknownTopicOrPartition, format!("The topic '{name}' does not exist."))
    })?;
    if topic.elastic.is_some() {
        return Err(BrokerError::new(
            ErrorKind::InvalidPartitionCount,
            format!(
                "Topic '{name}' is elastic: its {} partitions are stable, so that every key keeps its partition; \
                 split a physical partition instead (weir topic split)",
                topic.partitions
            ),
        ));
    }
    if count < topic.partitions {
        return Err(BrokerError::new(
            ErrorKind::InvalidPartitionCount,
            format!("Topic currently has {} partitions, which is higher than the requested {count}.", topic.partitions),
        ));
    }
    if count == topic.partitions {
        return Err(BrokerError::new(
            ErrorKind::InvalidPartitionCount,
            format!("Topic already has {count} partitions."),
        ));
    }
    if count > config.max_partitions_per_topic {
        return Err(BrokerError::new(
            ErrorKind::InvalidPartitionCount,
            format!("Number of partitions {count} exceeds the limit of {} per topic.", config.max_partitions_per_topic),
        ));
    }
    let brokers = placement::unfenced_brokers(state);
    let added = count - topic.partitions;
    let assignments = match assignments {
        Some(assignments) => {
            if assignments.len() != added as usize {
                return Err(BrokerError::new(
                    ErrorKind::InvalidReplicaAssignment,
                    format!(
                        "Increasing the number of partitions by {added} but {} assignments provided.",
                        assignments.len()
                    ),
                ));
            }
            placement::check_manual_assignment(&assignments, &brokers)?;
            assignments
        }
        None => {
            let rf = topic.partition(0).map_or(1, |p| p.replicas.len()).clamp(1, brokers.len());
            // Go on from where the topic's replicas stop.
            let start = topic
                .partition(0)
                .and_then(|p| p.replicas.first())
                .and_then(|b| brokers.iter().position(|x| x == b))
                .unwrap_or(0);
            placement::assign_replicas(topic.partitions, added, rf, &brokers, start)
        }
    };
    capacity::check_capacity(state, &assignments, config.replica_capacity.as_ref())?;
    if validate_only {
        return Ok(Decision::nothing(()));
    }
    let record =
        MetadataRecord::CreatePartitions { name: name.to_string(), id: topic.id, partitions: count, assignments };
    Ok(Decision { records: vec![record], answer: () })
}

/// Decides a change of topic `name`'s config overrides by `edit`, applied to the overrides
/// current in `state` (so concurrent edits do not race). The records are empty when nothing
/// changes (or with `validate_only`).
pub fn decide_alter_configs(
    state: &MetadataState,
    config: &ControllerConfig,
    name: &str,
    validate_only: bool,
    edit: &ConfigEdit,
) -> Result<Decision<()>, BrokerError> {
    let topic = state
        .topic(name)
        .ok_or_else(|| BrokerError::new(ErrorKind::UnknownTopicOrPartition, format!("Topic {name} does not exist.")))?;
    let configs = edit
        .apply(&config.topic_defaults, &topic.configs)
        .map_err(|e| BrokerError::new(ErrorKind::InvalidConfig, e.message))?;
    topic_config::validate(&configs).map_err(|e| BrokerError::new(ErrorKind::InvalidConfig, e.message))?;
    if validate_only || configs == topic.configs {
        return Ok(Decision::nothing(()));
    }
    let record = MetadataRecord::SetTopicConfigs { name: name.to_string(), id: topic.id, configs };
    Ok(Decision { records: vec![record], answer: () })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::test_broker;

    /// Ids counting up, placement always starting at the first broker.
    struct Fixed(u128);

    impl Entropy for Fixed {
        fn topic_id(&mut self) -> Uuid {
            self.0 += 1;
            Uuid::from_u128(self.0)
        }
        fn below(&mut self, _n: usize) -> usize {
            0
        }
    }

    fn config() -> ControllerConfig {
        ControllerConfig {
            num_partitions: 2,
            default_replication_factor: 2,
            max_partitions_per_topic: 100,
            delete_topic_enable: true,
            offsets_topic_replication_factor: 3,
            transaction_state_replication_factor: 3,
            messaging_state_replication_factor: 3,
            topic_defaults: BTreeMap::new(),
            replica_capacity: None,
        }
    }

    fn cluster(brokers: &[i32], fenced: &[i32]) -> MetadataState {
        let mut state = MetadataState::new();
        for &b in brokers {
            state.brokers.insert(b, test_broker(b, fenced.contains(&b)));
        }
        state
    }

    fn new_topic(name: &str) -> NewTopic {
        NewTopic {
            name: name.into(),
            partitions: -1,
            replication_factor: -1,
            assignments: Vec::new(),
            configs: BTreeMap::new(),
        }
    }

    /// `state` with a decision's records applied, as the quorum would.
    fn applied(mut state: MetadataState, records: &[MetadataRecord]) -> MetadataState {
        for (offset, record) in records.iter().enumerate() {
            state.apply(offset as i64, record);
        }
        state
    }

    #[test]
    fn a_topic_created_with_a_message_type_takes_rocketmq_bodies_unless_its_size_was_set() {
        let state = cluster(&[1, 2], &[]);
        let create = |name: &str, configs: &[(&str, &str)]| {
            let topic = NewTopic {
                configs: configs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
                ..new_topic(name)
            };
            let decided = decide_create(&state, &config(), &mut Fixed(0), &topic, false).expect("created");
            let [MetadataRecord::CreateTopic { configs, .. }] = decided.records.as_slice() else {
                panic!("{:?}", decided.records)
            };
            assert_eq!(configs, &decided.answer.topic.configs, "the answer shows what is committed");
            configs.get("max.message.bytes").cloned()
        };
        let rocketmq = topic_config::ROCKETMQ_MAX_MESSAGE_BYTES.to_string();
        assert_eq!(create("fifo", &[("message.type", "FIFO")]), Some(rocketmq));
        assert_eq!(
            create("small", &[("message.type", "NORMAL"), ("max.message.bytes", "2000")]),
            Some("2000".into()),
            "the user's own limit is kept"
        );
        assert_eq!(create("kafka", &[]), None, "a Kafka topic keeps the broker's default");
    }

    #[test]
    fn a_topic_is_placed_on_the_live_brokers_with_the_defaults_and_exists_once_committed() {
        let state = cluster(&[1, 2, 3], &[2]);
        let decided = decide_create(&state, &config(), &mut Fixed(0), &new_topic("orders"), false).expect("created");
        let [MetadataRecord::CreateTopic { assignments, id, internal: false, .. }] = decided.records.as_slice() else {
            panic!("{:?}", decided.records)
        };
        assert_eq!(assignments, &vec![vec![1, 3], vec![3, 1]], "2 partitions, 2 replicas, none on fenced 2");
        assert_eq!((*id, decided.answer.replication_factor), (Uuid::from_u128(1), 2));
        let after = applied(state.clone(), &decided.records);
        let again = decide_create(&after, &config(), &mut Fixed(0), &new_topic("orders"), false).unwrap_err();
        assert_eq!(again.kind, ErrorKind::TopicExists);
        // Validating commits nothing and names no id.
        let checked = decide_create(&state, &config(), &mut Fixed(0), &new_topic("dry"), true).expect("valid");
        assert!(checked.records.is_empty() && checked.answer.topic.id.is_nil());
        let mut three = new_topic("three");
        three.replication_factor = 3;
        let refused = decide_create(&state, &config(), &mut Fixed(0), &three, false).unwrap_err();
        assert_eq!(refused.kind, ErrorKind::InvalidReplicationFactor, "only 2 brokers are live");
    }

    #[test]
    fn internal_topics_take_their_replication_factor_as_far_as_there_are_brokers() {
        let state = cluster(&[1, 2], &[]);
        let decided =
            decide_ensure_internal(&state, &config(), &mut Fixed(0), OFFSETS_TOPIC, 3, BTreeMap::new()).expect("made");
        let [MetadataRecord::CreateTopic { assignments, internal: true, .. }] = decided.records.as_slice() else {
            panic!("{:?}", decided.records)
        };
        assert!(assignments.iter().all(|r| r.len() == 2), "3 wanted, 2 brokers: {assignments:?}");
        let after = applied(state, &decided.records);
        let again =
            decide_ensure_internal(&after, &config(), &mut Fixed(0), OFFSETS_TOPIC, 3, BTreeMap::new()).expect("is");
        assert!(again.records.is_empty(), "it exists: nothing to do");
        let deleted = decide_delete(&after, &config(), Some(OFFSETS_TOPIC), None).unwrap_err();
        assert_eq!(deleted.kind, ErrorKind::InvalidRequest, "internal topics are not deleted");
        let not_internal =
            decide_ensure_internal(&after, &config(), &mut Fixed(0), "plain", 1, BTreeMap::new()).unwrap_err();
        assert_eq!(not_internal.kind, ErrorKind::InvalidTopic);
    }

    #[test]
    fn partitions_grow_where_the_topic_stopped_and_never_shrink() {
        let state = cluster(&[1, 2, 3], &[]);
        let created = decide_create(&state, &config(), &mut Fixed(0), &new_topic("t"), false).expect("created");
        let state = applied(state, &created.records);
        let grown = decide_create_partitions(&state, &config(), "t", 4, None, false).expect("grown");
        let [MetadataRecord::CreatePartitions { partitions: 4, assignments, .. }] = grown.records.as_slice() else {
            panic!("{:?}", grown.records)
        };
        assert_eq!(assignments, &vec![vec![3, 1], vec![1, 2]]);
        let shrink = decide_create_partitions(&state, &config(), "t", 1, None, false).unwrap_err();
        assert_eq!(shrink.kind, ErrorKind::InvalidPartitionCount);
        let too_many = decide_create_partitions(&state, &config(), "t", 101, None, false).unwrap_err();
        assert_eq!(too_many.kind, ErrorKind::InvalidPartitionCount);
        assert!(decide_create_partitions(&state, &config(), "t", 3, None, true).expect("valid").records.is_empty());
    }

    #[test]
    fn topic_names_follow_kafkas_rules_with_dead_letter_topics_the_one_exception() {
        assert!(validate_topic_name("orders.v1_2-x").is_ok());
        assert!(validate_topic_name("%DLQ%billing").is_ok());
        for bad in ["", ".", "..", "a b", "%DLQ%", "a%b", &"x".repeat(MAX_TOPIC_NAME_LEN + 1)] {
            assert_eq!(validate_topic_name(bad).unwrap_err().kind, ErrorKind::InvalidTopic, "{bad:?}");
        }
    }
}
