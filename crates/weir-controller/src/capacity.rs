//! How many partition replicas a broker can hold open, and the check that refuses a topic or
//! partition creation that would put more on one broker.
//!
//! Every replica a broker hosts keeps its active segment open: the `.log` file (one open file)
//! and its `.index` and `.timeindex` memory-mapped (two memory maps). A process has at most
//! `ulimit -n` open files and `vm.max_map_count` maps, so a broker can hold only so many
//! replicas; past that, opening the next log fails with EMFILE or ENOMEM deep inside a metadata
//! change, on whichever broker reaches its limit first, after the controller committed the
//! change. Refusing the creation up front, naming the limit, is what an operator can act on
//! (as Redpanda does with its per-partition file and memory budgets; Kafka just fails the open).
//!
//! The controller knows the limits of its own process only, and checks every broker against
//! them: the nodes of a cluster run with the same limits (the same unit file or container
//! spec), and a broker with lower limits still fails its opens clearly, with the OS's "Too many
//! open files" in its log.

use std::collections::HashMap;

use weir_error::{BrokerError, ErrorKind};
use weir_metadata::MetadataState;

/// Open files one replica's active segment keeps (its `.log`).
pub const OPEN_FILES_PER_REPLICA: u64 = 1;
/// Memory maps one replica's active segment keeps (its `.index` and `.timeindex`).
pub const MEMORY_MAPS_PER_REPLICA: u64 = 2;
/// Open files a broker keeps for everything but its replicas' segments: client and peer
/// connections, the listeners, the metadata quorum's log, checkpoints, older segments read
/// now and then. 1,000 leaves room for several hundred connections.
pub const OPEN_FILES_RESERVED: u64 = 1_000;
/// Memory maps a broker keeps for everything but its replicas' segments: the executable and
/// its libraries, thread stacks, the allocator's arenas, the indexes of older segments read.
pub const MEMORY_MAPS_RESERVED: u64 = 1_000;

/// The replicas one broker can hold, and why that many.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaCapacity {
    pub replicas_max: u64,
    /// The limits it comes from, for the refusal's message.
    pub limits: String,
}

impl ReplicaCapacity {
    /// The capacity under `open_files_max` (`ulimit -n`) and `memory_maps_max`
    /// (`vm.max_map_count`), either unknown (`None`: not limited by it); `None` when neither is
    /// known.
    pub fn of_limits(open_files_max: Option<u64>, memory_maps_max: Option<u64>) -> Option<ReplicaCapacity> {
        let by_files = open_files_max.map(|max| max.saturating_sub(OPEN_FILES_RESERVED) / OPEN_FILES_PER_REPLICA);
        let by_maps = memory_maps_max.map(|max| max.saturating_sub(MEMORY_MAPS_RESERVED) / MEMORY_MAPS_PER_REPLICA);
        let replicas_max = by_files.into_iter().chain(by_maps).min()?;
        let mut limits = Vec::new();
        if let Some(max) = open_files_max {
            limits.push(format!("{max} open files (ulimit -n), {OPEN_FILES_PER_REPLICA} per replica"));
        }
        if let Some(max) = memory_maps_max {
            limits.push(format!("{max} memory maps (vm.max_map_count), {MEMORY_MAPS_PER_REPLICA} per replica"));
        }
        Some(ReplicaCapacity { replicas_max, limits: limits.join(" and ") })
    }
}

/// Refuses `added` (the replica lists of partitions about to be created) when it would give
/// some broker more replicas than `capacity` allows. Counts every replica of `state`: one pass
/// over the partitions, a few microseconds per thousand.
pub fn check_capacity(
    state: &MetadataState,
    added: &[Vec<i32>],
    capacity: Option<&ReplicaCapacity>,
) -> Result<(), BrokerError> {
    let Some(capacity) = capacity else { return Ok(()) };
    let mut adding: HashMap<i32, u64> = HashMap::new();
    for broker in added.iter().flatten() {
        *adding.entry(*broker).or_default() += 1;
    }
    let mut hosted: HashMap<i32, u64> = adding.keys().map(|b| (*b, 0)).collect();
    for partition in state.topics.values().flat_map(|t| &t.assignments) {
        for broker in &partition.replicas {
            if let Some(count) = hosted.get_mut(broker) {
                *count += 1;
            }
        }
    }
    let mut over: Vec<(i32, u64, u64)> = adding
        .iter()
        .map(|(broker, more)| (*broker, hosted.get(broker).copied().unwrap_or(0), *more))
        .filter(|(_, has, more)| has + more > capacity.replicas_max)
        .collect();
    over.sort_unstable();
    let Some((broker, has, more)) = over.first() else { return Ok(()) };
    Err(BrokerError::new(
        ErrorKind::InvalidPartitionCount,
        format!(
            "Creating these partitions would put {} replicas on broker {broker} (it has {has}), more than the {} a \
             broker can keep open under its limits of {}. Raise the limits, add brokers, or delete topics.",
            has + more,
            capacity.replicas_max,
            capacity.limits
        ),
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use weir_metadata::{PartitionState, TopicMetadata};

    use super::*;

    fn state_with(replicas: &[Vec<i32>]) -> MetadataState {
        let mut state = MetadataState::new();
        let topic = TopicMetadata {
            name: "t".into(),
            id: uuid::Uuid::new_v4(),
            partitions: replicas.len() as i32,
            configs: BTreeMap::new(),
            internal: false,
            assignments: replicas.iter().cloned().map(PartitionState::new).collect(),
            elastic: None,
        };
        state.topics.insert("t".into(), Arc::new(topic));
        state
    }

    #[test]
    fn capacity_is_the_tighter_of_the_two_limits_after_the_reserve() {
        // This machine: 20,000 files allow 19,000 replicas; 65,530 maps allow 32,265.
        let both = ReplicaCapacity::of_limits(Some(20_000), Some(65_530)).expect("limited");
        assert_eq!(both.replicas_max, 19_000);
        assert!(both.limits.contains("20000 open files") && both.limits.contains("65530 memory maps"));
        let maps_only = ReplicaCapacity::of_limits(None, Some(65_530)).expect("limited");
        assert_eq!(maps_only.replicas_max, 32_265);
        assert_eq!(ReplicaCapacity::of_limits(None, None), None);
        // A limit below the reserve leaves no room rather than wrapping around.
        assert_eq!(ReplicaCapacity::of_limits(Some(10), None).map(|c| c.replicas_max), Some(0));
    }

    #[test]
    fn creation_past_a_brokers_capacity_is_refused_naming_the_broker_and_the_limits() {
        let capacity = ReplicaCapacity { replicas_max: 3, limits: "20000 open files (ulimit -n)".into() };
        // Broker 1 holds 2 replicas, broker 2 one.
        let state = state_with(&[vec![1, 2], vec![1]]);
        assert!(check_capacity(&state, &[vec![1, 2]], Some(&capacity)).is_ok(), "3 on broker 1 fits exactly");
        let refused = check_capacity(&state, &[vec![1, 2], vec![2, 1]], Some(&capacity)).expect_err("4 on broker 1");
        assert_eq!(refused.kind, ErrorKind::InvalidPartitionCount);
        assert!(refused.message.contains("4 replicas on broker 1"), "{}", refused.message);
        assert!(refused.message.contains("20000 open files"), "{}", refused.message);
        assert!(check_capacity(&state, &[vec![1, 2], vec![2, 1]], None).is_ok(), "no limit known");
        assert!(check_capacity(&state, &vec![vec![3]; 3], Some(&capacity)).is_ok(), "broker 3 holds nothing yet");
    }
}
