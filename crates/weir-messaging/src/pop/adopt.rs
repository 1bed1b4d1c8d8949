//! A broker that comes to lead a partition takes over the invisible-time state of every queue
//! on it at once, as a coordinator loads its groups when it takes over their partition, not
//! only at the queue's next receive. What runs without a receive then carries on there: the
//! dead-letter sweep moves the messages whose last delivery ran out, and the progress mirror
//! shows the group's position as committed offsets (lag), also for a group whose consumers
//! have all gone away. The same holds after a restart of a single node.
//!
//! Every [`ADOPT_INTERVAL`] the broker looks at the partitions it leads. For those it did not
//! lead at that epoch the last time, it asks the leader of each shard of `__share_group_state`
//! which queues of them it holds (`pop.queues_on`, one call per broker), and loads each
//! ([`super::store::PopStore::load`], which fences the previous leader's engine). A round that
//! fails is tried again at the next look; a load is idempotent.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use weir_broker::BrokerError;

use super::lines::QueueId;
use super::shard::TOPIC;
use super::store::QueueKey;
use crate::Messaging;

/// How often the partitions led here are looked at.
pub(crate) const ADOPT_INTERVAL: Duration = Duration::from_secs(1);

/// Starts the task; it ends when the broker shuts down (or is dropped).
pub(crate) fn start(messaging: &Arc<Messaging>) {
    let messaging: Weak<Messaging> = Arc::downgrade(messaging);
    tokio::spawn(async move {
        let Some(mut shutdown) = messaging.upgrade().map(|m| m.broker.shutdown_signal()) else { return };
        // (topic, partition) → the leader epoch at which its queues were adopted.
        let mut adopted: HashMap<(String, i32), i32> = HashMap::new();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(ADOPT_INTERVAL) => {}
                _ = shutdown.wait_for(|down| *down) => return,
            }
            let Some(messaging) = messaging.upgrade() else { return };
            adopt_new(&messaging, &mut adopted).await;
        }
    });
}

/// One look: adopts the queues of the partitions newly led here.
async fn adopt_new(messaging: &Arc<Messaging>, adopted: &mut HashMap<(String, i32), i32>) {
    let broker = &messaging.broker;
    // No state topic: no queue has state anywhere yet.
    if broker.metadata().topic(TOPIC).is_none() {
        return;
    }
    let led: HashMap<(String, i32), i32> = broker
        .partitions()
        .into_iter()
        .filter(|p| !p.topic.starts_with("__") && p.check_local_leader().is_ok())
        .map(|p| ((p.topic.clone(), p.index), p.leader_epoch()))
        .collect();
    adopted.retain(|key, _| led.contains_key(key));
    let new: Vec<(String, i32)> =
        led.iter().filter(|(key, epoch)| adopted.get(*key) != Some(*epoch)).map(|(key, _)| key.clone()).collect();
    if new.is_empty() {
        return;
    }
    match queues_on(messaging, &new).await {
        Ok(queues) => {
            let mut failed: HashSet<(String, i32)> = HashSet::new();
            for id in queues {
                let key = QueueKey::new(id.group.clone(), id.topic.clone(), id.partition);
                if let Err(e) = messaging.pop.load(&key).await {
                    tracing::debug!(group = %id.group, topic = %id.topic, partition = id.partition, error = %e,
                        "cannot take over a queue's state yet; trying again");
                    failed.insert((id.topic, id.partition));
                }
            }
            for key in new.into_iter().filter(|key| !failed.contains(key)) {
                let epoch = led[&key];
                adopted.insert(key, epoch);
            }
        }
        Err(e) => tracing::debug!(error = %e, "cannot list the queues of newly led partitions yet; trying again"),
    }
}

/// Every queue with state on `partitions`, from every shard's leader.
async fn queues_on(messaging: &Arc<Messaging>, partitions: &[(String, i32)]) -> Result<Vec<QueueId>, BrokerError> {
    let broker = &messaging.broker;
    let count = messaging.pop.shard_count(broker).await?;
    let metadata = broker.metadata();
    let mut by_leader: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for shard in 0..count {
        let leader = metadata.topic(TOPIC).and_then(|t| t.partition(shard)).map_or(-1, |p| p.leader);
        if leader < 0 {
            return Err(BrokerError::new(
                weir_broker::ErrorKind::CoordinatorNotAvailable,
                format!("{TOPIC}-{shard} has no leader right now"),
            ));
        }
        by_leader.entry(leader).or_default().push(shard);
    }
    let mut queues = Vec::new();
    for (leader, shards) in by_leader {
        let request = super::service::QueuesOnRequest { shards, partitions: partitions.to_vec() };
        queues.extend(if leader == broker.config.node_id {
            messaging.pop_states.queues_on_here(&request.shards, &request.partitions)?
        } else {
            super::service::call_queues_on(broker, leader, &request).await?
        });
    }
    Ok(queues)
}
