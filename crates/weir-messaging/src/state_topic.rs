//! What the messaging layer's replicated state topics share (`__delayed_messages`,
//! `__half_messages`): their creation with the `messaging.state.topic.*` settings, the shard a
//! key falls in, and the way a call reaches the broker leading a shard, trying again while the
//! shard has no leader that has loaded it.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use weir_broker::{Broker, BrokerError, ErrorKind, Partition};
use weir_storage::records::{self, Record};

/// How long a call waits for its shard to have a leader that has loaded it.
const SHARD_WAIT: Duration = Duration::from_secs(10);
/// How long it waits between two tries meanwhile.
const SHARD_RETRY: Duration = Duration::from_millis(50);
/// The segment size of the state topics: what was dealt with stays on disk until its whole
/// segment has.
pub(crate) const SEGMENT_BYTES: u64 = 64 << 20;

/// How long a call to the broker leading a shard may take: an `acks=all` write that waits for
/// the ISR, and then some.
pub(crate) fn rpc_timeout(broker: &Broker) -> Duration {
    Duration::from_millis(broker.config.quorum_request_timeout_ms) + Duration::from_secs(10)
}

/// A remote broker's failure to answer, as an error of this one.
pub(crate) fn remote_failure(e: weir_broker::cluster::RemoteError) -> BrokerError {
    BrokerError::internal(e.message().to_string())
}

/// The partitions of state topic `name`, created (through the controller) at the first use:
/// kept until their owner trims them (no retention by age or size), one record of a 4 MiB body
/// with its headers fits, small segments rolled hourly.
pub(crate) async fn partitions(broker: &Arc<Broker>, name: &str) -> Result<i32, BrokerError> {
    if let Some(topic) = broker.metadata().topic(name) {
        return Ok(topic.partitions);
    }
    let config = &broker.config;
    let configs: BTreeMap<String, String> = [
        ("cleanup.policy", "delete".to_string()),
        ("retention.ms", "-1".to_string()),
        ("retention.bytes", "-1".to_string()),
        ("max.message.bytes", (8 << 20).to_string()),
        ("segment.bytes", SEGMENT_BYTES.to_string()),
        ("segment.ms", "3600000".to_string()),
        ("min.insync.replicas", config.messaging_state_min_isr.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Ok(broker.ensure_internal_topic(name, config.messaging_state_partitions, configs).await?.partitions)
}

/// The shard of (`name`, `number`) among `count`: stable (FNV-1a), so one key's state is in one
/// place.
pub(crate) fn shard_of(name: &str, number: i32, count: i32) -> i32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in name.as_bytes().iter().chain(&number.to_be_bytes()) {
        hash ^= u32::from(*byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    (hash % count.max(1) as u32) as i32
}

/// Errors that mean "this shard is not served right now, try again shortly".
fn is_transient(error: &BrokerError) -> bool {
    matches!(
        error.kind,
        ErrorKind::NotCoordinator
            | ErrorKind::CoordinatorLoadInProgress
            | ErrorKind::CoordinatorNotAvailable
            | ErrorKind::NotLeader
            | ErrorKind::LeaderNotAvailable
            | ErrorKind::Unavailable
            | ErrorKind::UnknownTopicOrPartition
    )
}

/// Runs `call` where shard `index` of `topic` is led: with `None` on this broker, with
/// `Some(node)` for another, trying again while the shard has no leader that has loaded it,
/// up to [`SHARD_WAIT`]; past it the error is a retriable NOT_ENOUGH_REPLICAS.
pub(crate) async fn at_leader<T, F, Fut>(broker: &Broker, topic: &str, index: i32, call: F) -> Result<T, BrokerError>
where
    F: Fn(Option<i32>) -> Fut,
    Fut: Future<Output = Result<T, BrokerError>>,
{
    let deadline = tokio::time::Instant::now() + SHARD_WAIT;
    loop {
        let leader = broker.metadata().topic(topic).and_then(|t| t.partition(index)).map_or(-1, |p| p.leader);
        let result = if leader < 0 {
            Err(BrokerError::new(
                ErrorKind::CoordinatorNotAvailable,
                format!("{topic}-{index} has no leader right now"),
            ))
        } else if leader == broker.config.node_id {
            call(None).await
        } else {
            call(Some(leader)).await
        };
        match result {
            Err(e) if is_transient(&e) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(SHARD_RETRY).await;
            }
            Err(e) if is_transient(&e) => {
                return Err(BrokerError::new(
                    ErrorKind::NotEnoughReplicas,
                    format!("{topic}-{index} is not available: {}", e.message),
                ))
            }
            other => return other,
        }
    }
}

/// Loads the shards of `owner` this broker leads now and whenever leadership moves (a load
/// that fails at start is tried again each second). Call within a tokio runtime, once.
pub(crate) fn start_shards<O: weir_coordinators::shards::ShardOwner>(broker: &Arc<Broker>, owner: &Arc<O>) {
    weir_coordinators::shards::spawn_watcher(broker, Arc::downgrade(owner));
    let (broker, owner) = (Arc::downgrade(broker), Arc::downgrade(owner));
    tokio::spawn(async move {
        loop {
            let (Some(broker), Some(owner)) = (broker.upgrade(), owner.upgrade()) else { return };
            if broker.is_shutting_down() {
                return;
            }
            let loaded =
                tokio::task::spawn_blocking(move || weir_coordinators::shards::reconcile_blocking(&broker, &*owner))
                    .await;
            if matches!(loaded, Ok(true)) {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
}

/// Every record of `partition`'s log (to its end, past the high watermark: what a new leader's
/// ISR will have), in offset order: how an owner loads a shard it has come to lead. Blocking.
pub(crate) fn read_log(broker: &Broker, partition: &Partition) -> Result<Vec<Record>, BrokerError> {
    let mut all = Vec::new();
    let mut from = partition.log.log_start_offset();
    while from < partition.log.log_end_offset() {
        let read = broker.read_to_log_end(partition, from, 4 << 20)?;
        let Some(slice) = read.slice else { break };
        let bytes = slice.read_to_vec().map_err(BrokerError::from)?;
        let batches =
            records::decode_batches(&bytes).map_err(|e| BrokerError::new(ErrorKind::Corrupt, e.to_string()))?;
        let next = batches.last().map_or(from, |b| b.header.next_offset());
        all.extend(batches.into_iter().flat_map(|b| b.records).filter(|r| r.offset >= from));
        if next <= from {
            break;
        }
        from = next;
    }
    Ok(all)
}

/// Runs `migrate` (the move of an earlier version's local store of `what` into its topic) until
/// it succeeds or the broker shuts down, a second apart. Call within a tokio runtime.
pub(crate) fn spawn_migration<F, Fut>(broker: &Arc<Broker>, what: &'static str, migrate: F)
where
    F: Fn(Arc<Broker>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<usize, BrokerError>> + Send,
{
    let broker = Arc::downgrade(broker);
    tokio::spawn(async move {
        loop {
            let Some(broker) = broker.upgrade() else { return };
            if broker.is_shutting_down() {
                return;
            }
            match migrate(broker.clone()).await {
                Ok(moved) => {
                    tracing::info!(moved, "{what}: moved the local store of an earlier version into its topic");
                    return;
                }
                Err(e) => tracing::info!(error = %e, "{what}: cannot move the local store of an earlier version yet"),
            }
            drop(broker);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
}
