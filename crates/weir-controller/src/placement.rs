//! Where new partitions' replicas go: round-robin over the brokers from a random start, as
//! Kafka places them. Replica `i` of partition `p` goes to broker
//! `brokers[(start + p + i) % n]`, so leaders (replica 0) spread one per broker in turn and no
//! partition has two replicas on one broker. When brokers have racks, the list is in Kafka's
//! rack-alternating order (`placement_order`), so consecutive brokers (the leaders of
//! successive partitions, and a partition's replicas when the racks are balanced) are in
//! different racks.
//!
//! Validation of manual assignments (CreateTopics, CreatePartitions) lives here too, so that
//! both placements obey the same rules.

use std::collections::BTreeSet;

use weir_error::{BrokerError, ErrorKind};
use weir_metadata::MetadataState;

/// The brokers, `(id, rack)`, in the order placement walks them: by id when no broker has a
/// rack; else the first broker (by id) of each rack (by name), then the second of each, and so
/// on, as Kafka's rack-aware assignment orders them. A broker without a rack counts as one of
/// the rack "".
pub(crate) fn placement_order(brokers: &[(i32, Option<String>)]) -> Vec<i32> {
    let mut ids: Vec<i32> = brokers.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    if brokers.iter().all(|(_, rack)| rack.is_none()) {
        return ids;
    }
    let mut racks: std::collections::BTreeMap<&str, Vec<i32>> = std::collections::BTreeMap::new();
    for (id, rack) in brokers {
        racks.entry(rack.as_deref().unwrap_or("")).or_default().push(*id);
    }
    for members in racks.values_mut() {
        members.sort_unstable();
    }
    let deepest = racks.values().map(Vec::len).max().unwrap_or(0);
    (0..deepest)
        .flat_map(|i| racks.values().filter_map(move |members| members.get(i).copied()).collect::<Vec<_>>())
        .collect()
}

/// The brokers partitions may be placed on and led by in `state`: registered and not fenced,
/// in placement order.
pub fn unfenced_brokers(state: &MetadataState) -> Vec<i32> {
    let brokers: Vec<(i32, Option<String>)> =
        state.brokers.values().filter(|b| !b.fenced).map(|b| (b.id, b.rack.clone())).collect();
    placement_order(&brokers)
}

/// A registered broker for tests: host `h`, port 1, no rack.
#[cfg(test)]
pub(crate) fn test_broker(id: i32, fenced: bool) -> weir_metadata::BrokerRegistration {
    weir_metadata::BrokerRegistration {
        id,
        incarnation: uuid::Uuid::new_v4(),
        host: "h".into(),
        port: 1,
        listeners: Vec::new(),
        internal: String::new(),
        rack: None,
        rocketmq_port: 0,
        fenced,
    }
}

/// Replica lists for partitions `first..first + count`, `replication_factor` replicas each, on
/// `brokers` (sorted ids, at least `replication_factor` of them; the caller checks).
pub(crate) fn assign_replicas(
    first: i32,
    count: i32,
    replication_factor: usize,
    brokers: &[i32],
    start: usize,
) -> Vec<Vec<i32>> {
    debug_assert!(!brokers.is_empty() && replication_factor <= brokers.len());
    let n = brokers.len();
    (first..first + count)
        .map(|p| (0..replication_factor).map(|i| brokers[(start + p as usize + i) % n]).collect())
        .collect()
}

/// Checks that `replication_factor` replicas can be placed on `brokers`.
pub(crate) fn check_replication_factor(replication_factor: i16, brokers: &[i32]) -> Result<usize, BrokerError> {
    if replication_factor < 1 {
        return Err(BrokerError::new(ErrorKind::InvalidReplicationFactor, "Replication factor must be larger than 0."));
    }
    let rf = replication_factor as usize;
    if rf > brokers.len() {
        return Err(BrokerError::new(
            ErrorKind::InvalidReplicationFactor,
            format!(
                "Unable to replicate the partition {rf} time(s): The target replication factor of {rf} cannot be \
                 reached because only {} broker(s) are registered.",
                brokers.len()
            ),
        ));
    }
    Ok(rf)
}

/// Checks a manual assignment: every partition names the same number of distinct, existing
/// brokers. Returns the replication factor.
pub(crate) fn check_manual_assignment(assignments: &[Vec<i32>], brokers: &[i32]) -> Result<i16, BrokerError> {
    let invalid = |why: String| Err(BrokerError::new(ErrorKind::InvalidReplicaAssignment, why));
    let Some(first) = assignments.first() else { return invalid("The replica assignment is empty.".into()) };
    for (index, replicas) in assignments.iter().enumerate() {
        if replicas.is_empty() {
            return invalid(format!("Partition {index} has no replicas."));
        }
        if replicas.len() != first.len() {
            return invalid(format!(
                "All partitions should have the same number of replicas; partition {index} has {}, partition 0 has {}.",
                replicas.len(),
                first.len()
            ));
        }
        if replicas.iter().collect::<BTreeSet<_>>().len() != replicas.len() {
            return invalid(format!("Duplicate brokers in the replicas {replicas:?} of partition {index}."));
        }
        if let Some(unknown) = replicas.iter().find(|b| !brokers.contains(b)) {
            return invalid(format!(
                "Partition {index}'s replicas {replicas:?} name broker {unknown}, which is not registered; the brokers are {brokers:?}."
            ));
        }
    }
    i16::try_from(first.len()).or_else(|_| invalid("Too many replicas.".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn racks_alternate_in_the_placement_order() {
        let rack = |r: &str| Some(r.to_string());
        assert_eq!(placement_order(&[(3, None), (1, None), (2, None)]), vec![1, 2, 3], "by id without racks");
        // Kafka's example: racks a (1, 2, 3), b (4, 5), c (6): 1, 4, 6, 2, 5, 3.
        let brokers = [(5, rack("b")), (1, rack("a")), (6, rack("c")), (2, rack("a")), (4, rack("b")), (3, rack("a"))];
        let order = placement_order(&brokers);
        assert_eq!(order, vec![1, 4, 6, 2, 5, 3]);
        // Leaders of successive partitions, and the replicas of one (3 racks, 3 replicas), are
        // in different racks while every rack still has brokers left.
        let rack_of = |id: i32| brokers.iter().find(|(b, _)| *b == id).and_then(|(_, r)| r.clone());
        for replicas in assign_replicas(0, 2, 3, &order, 0) {
            let racks: BTreeSet<_> = replicas.iter().map(|id| rack_of(*id)).collect();
            assert_eq!(racks.len(), 3, "{replicas:?}");
        }
        // A broker without a rack is in the rack "" (first by name).
        assert_eq!(placement_order(&[(1, rack("a")), (2, None), (3, rack("a"))]), vec![2, 1, 3]);
    }

    #[test]
    fn replicas_go_round_robin_from_the_start_without_sharing_a_broker() {
        let placed = assign_replicas(0, 4, 2, &[1, 2, 3], 1);
        assert_eq!(placed, vec![vec![2, 3], vec![3, 1], vec![1, 2], vec![2, 3]]);
        let grown = assign_replicas(4, 2, 2, &[1, 2, 3], 1);
        assert_eq!(grown, vec![vec![3, 1], vec![1, 2]], "new partitions go on where the old ones stopped");
        assert_eq!(assign_replicas(0, 3, 1, &[7], 5), vec![vec![7]; 3]);
        let mut entropy = crate::RandomEntropy;
        for start in 0..10 {
            assert!(crate::Entropy::below(&mut entropy, 3) < 3, "start {start}");
        }
    }

    #[test]
    fn manual_assignments_must_be_uniform_distinct_and_known() {
        let brokers = [1, 2, 3];
        assert_eq!(check_manual_assignment(&[vec![1, 2], vec![3, 1]], &brokers).unwrap(), 2);
        for bad in [vec![vec![1, 2], vec![3]], vec![vec![1, 1]], vec![vec![4]], vec![vec![]], vec![]] {
            let e = check_manual_assignment(&bad, &brokers).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidReplicaAssignment, "{bad:?}");
        }
        assert_eq!(check_replication_factor(3, &brokers).unwrap(), 3);
        assert!(check_replication_factor(4, &brokers).unwrap_err().message.contains("only 3 broker(s)"));
        assert_eq!(check_replication_factor(0, &brokers).unwrap_err().kind, ErrorKind::InvalidReplicationFactor);
    }
}
