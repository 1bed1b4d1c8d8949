//! Groups' invisible-time progress as Kafka committed offsets, so that Kafka's tools and `weir
//! group describe` show how far a RocketMQ consumer group got, and its lag.
//!
//! Every `INTERVAL`, each queue's done-below offset (every message before it acked or
//! filtered out) that moved is committed for its group as a standalone commit (generation -1,
//! metadata `METADATA`), as `kafka-consumer-groups.sh` commits. The invisible-time state stays
//! the truth for its consumers; the commit only mirrors it. A group that also has Kafka members
//! refuses standalone commits: it is skipped until it has none. In a cluster, a group
//! coordinated by another broker is skipped too (not yet forwarded).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::pop::{PopStore, QueueKey};
use crate::Messaging;
use weir_coordinators::group::{CommitParams, GroupCoordinator, OffsetToCommit};

/// How often progress is committed.
pub(crate) const INTERVAL: Duration = Duration::from_secs(5);
/// The commit metadata that tells these commits apart (named when RocketMQ was the only
/// protocol consuming by invisible time; kept so that existing commits still read as these).
pub(crate) const METADATA: &str = "rocketmq";

/// Starts the committer; it ends when the broker shuts down (or it or the coordinator is
/// dropped).
pub(crate) fn start(messaging: &Arc<Messaging>, groups: &Arc<GroupCoordinator>) {
    let (messaging, groups): (Weak<Messaging>, Weak<GroupCoordinator>) =
        (Arc::downgrade(messaging), Arc::downgrade(groups));
    tokio::spawn(async move {
        let mut committed: HashMap<QueueKey, i64> = HashMap::new();
        let mut tick = tokio::time::interval(INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (Some(messaging), Some(groups)) = (Weak::upgrade(&messaging), Weak::upgrade(&groups)) else {
                return;
            };
            if messaging.broker.is_shutting_down() {
                return;
            }
            commit_moved(&groups, &messaging.pop, &mut committed).await;
        }
    });
}

/// Commits every queue's progress that moved since it was last committed (`committed`, which
/// it updates).
pub(crate) async fn commit_moved(
    groups: &Arc<GroupCoordinator>,
    store: &PopStore,
    committed: &mut HashMap<QueueKey, i64>,
) {
    let mut by_group: BTreeMap<String, Vec<(QueueKey, i64)>> = BTreeMap::new();
    for (key, done_below) in store.progress() {
        // A broadcasting consumer's own progress is no group's.
        if key.consumer.is_some() {
            continue;
        }
        if committed.get(&key) != Some(&done_below) {
            by_group.entry(key.group.clone()).or_default().push((key, done_below));
        }
    }
    for (group, moved) in by_group {
        let offsets = moved
            .iter()
            .map(|(key, offset)| OffsetToCommit {
                topic: key.topic.clone(),
                partition: key.partition,
                offset: *offset,
                leader_epoch: None,
                metadata: Some(METADATA.to_string()),
            })
            .collect();
        let params = CommitParams {
            group_id: group.clone(),
            generation_id: None,
            member_id: String::new(),
            group_instance_id: None,
            offsets,
        };
        let results = groups.commit_offsets(params).await;
        debug_assert_eq!(results.len(), moved.len(), "one commit result per offset");
        for ((key, offset), result) in moved.into_iter().zip(results) {
            match result.error {
                None => {
                    committed.insert(key, offset);
                }
                Some(error) => {
                    tracing::debug!(group = %group, topic = %key.topic, partition = key.partition, %error, "not committing a group's invisible-time progress");
                }
            }
        }
    }
}
