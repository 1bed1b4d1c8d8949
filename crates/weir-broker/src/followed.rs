//! The partitions this broker follows, by leader: what each replica fetcher fetches.
//!
//! Kept up to date by the reconciliation, topic by topic, for the topics a metadata change
//! touched only; so a change costs what it changed, not a walk over every partition (at 15,000
//! partitions such a walk on every CreateTopics was most of the cost of creating a topic), and
//! a fetcher finds its partitions without looking at those of other leaders.
//!
//! Invariant (`FollowedPartitions::check`, after every reconciliation in debug builds): a
//! partition is listed under leader `L` exactly when it is open here, this broker is one of its
//! replicas, and its state names `L`, another broker, as the leader.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::metadata::NO_LEADER;
use crate::partition::Partition;

/// Partitions by (topic, index), as a fetcher lists them in its requests.
pub(crate) type ByName = BTreeMap<(String, i32), Arc<Partition>>;

#[derive(Default)]
pub(crate) struct FollowedPartitions {
    by_leader: HashMap<i32, ByName>,
}

impl FollowedPartitions {
    /// Takes every partition of `topic` out, before its partitions are listed again.
    pub(crate) fn forget_topic(&mut self, topic: &str) {
        for partitions in self.by_leader.values_mut() {
            let keys: Vec<(String, i32)> = partitions
                .range((topic.to_string(), i32::MIN)..=(topic.to_string(), i32::MAX))
                .map(|(key, _)| key.clone())
                .collect();
            for key in keys {
                partitions.remove(&key);
            }
        }
        self.by_leader.retain(|_, partitions| !partitions.is_empty());
    }

    /// Lists `partition` under its leader if another broker leads it.
    pub(crate) fn add(&mut self, partition: &Arc<Partition>) {
        if let Some(leader) = followed_leader(partition) {
            self.by_leader
                .entry(leader)
                .or_default()
                .insert((partition.topic.clone(), partition.index), partition.clone());
        }
    }

    /// The leaders this broker follows some partition of.
    pub(crate) fn leaders(&self) -> Vec<i32> {
        self.by_leader.keys().copied().collect()
    }

    /// The partitions `leader` leads and this broker follows.
    pub(crate) fn of_leader(&self, leader: i32) -> Vec<Arc<Partition>> {
        self.by_leader.get(&leader).map(|p| p.values().cloned().collect()).unwrap_or_default()
    }

    /// Checks the invariant of the module doc against every open partition; panics if broken.
    pub(crate) fn check<'a>(&self, open: impl Iterator<Item = &'a Arc<Partition>>) {
        let mut expected = 0;
        for partition in open {
            let key = (partition.topic.clone(), partition.index);
            let listed: Vec<i32> =
                self.by_leader.iter().filter(|(_, p)| p.contains_key(&key)).map(|(leader, _)| *leader).collect();
            let leader = followed_leader(partition);
            assert_eq!(listed, leader.into_iter().collect::<Vec<_>>(), "{key:?}: followed under the wrong leader");
            expected += usize::from(leader.is_some());
        }
        let listed: usize = self.by_leader.values().map(|p| p.len()).sum();
        assert_eq!(listed, expected, "a partition no longer open is still followed");
    }
}

/// The leader this broker fetches `partition` from: another broker that leads it, when this
/// broker is one of its replicas.
fn followed_leader(partition: &Partition) -> Option<i32> {
    let state = partition.state();
    let me = partition.local_broker;
    (state.leader != me && state.leader != NO_LEADER && state.replicas.contains(&me)).then_some(state.leader)
}
