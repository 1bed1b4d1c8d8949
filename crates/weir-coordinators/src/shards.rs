//! Which partitions of an internal topic this broker coordinates.
//!
//! The group coordinator and the transaction coordinator keep their state in the partitions of
//! an internal topic (`__consumer_offsets`, `__transaction_state`); a key (a group, a
//! transactional id) belongs to one partition, and the broker leading that partition is the
//! key's coordinator. In a cluster the partitions are spread over the brokers, and leadership
//! moves when a broker is fenced or comes back, so each coordinator holds the state of the
//! partitions it leads right now: a *shard* per partition.
//!
//! [`Shards`] records, per partition, whether this broker has it loaded, is loading it, or does
//! not lead it, and answers a request with the error a client expects for the last two
//! (COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR). [`reconcile_blocking`] moves it towards what
//! the metadata says; [`spawn_watcher`] runs that after every metadata change.
//!
//! Invariant: a shard is `Loaded` only after the owner's `load_shard` returned, and it stops being
//! `Loaded` before the owner's `unload_shard` is called, so a request that found its shard
//! loaded finds the owner's state for it in memory (or is answered by the unload). Asserted
//! (debug builds) by `Shards::finish_load` (only a shard still loading becomes loaded) and
//! `Shards::drop_shard` (only a shard loading or loaded is dropped).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use weir_broker::broker::Broker;
use weir_broker::error::{BrokerError, ErrorKind};
use weir_broker::partition::Partition;
use weir_storage::sync::{read, write};

/// How long to wait before loading a shard again after a failed load.
const RETRY_LOAD_AFTER: Duration = Duration::from_secs(1);

enum ShardState<T> {
    Loading,
    Loaded(Arc<T>),
}

/// The shards of one coordinator: `T` is what it keeps per loaded partition.
pub struct Shards<T> {
    topic: &'static str,
    states: RwLock<HashMap<i32, ShardState<T>>>,
}

impl<T> Shards<T> {
    pub fn new(topic: &'static str) -> Shards<T> {
        Shards { topic, states: RwLock::new(HashMap::new()) }
    }

    /// The loaded shard `index`, or why this broker cannot serve it.
    pub fn get(&self, index: i32) -> Result<Arc<T>, BrokerError> {
        match read(&self.states).get(&index) {
            Some(ShardState::Loaded(shard)) => Ok(shard.clone()),
            Some(ShardState::Loading) => Err(BrokerError::new(
                ErrorKind::CoordinatorLoadInProgress,
                format!("this broker is loading {}-{index}", self.topic),
            )),
            None => Err(BrokerError::new(
                ErrorKind::NotCoordinator,
                format!("this broker does not lead {}-{index}", self.topic),
            )),
        }
    }

    /// Marks `index` loading (requests are refused with COORDINATOR_LOAD_IN_PROGRESS) unless
    /// this broker already has it; returns whether it was marked.
    fn begin_load(&self, index: i32) -> bool {
        let mut states = write(&self.states);
        if states.contains_key(&index) {
            return false;
        }
        states.insert(index, ShardState::Loading);
        true
    }

    /// Serves the shard `index` that its owner's `load_shard` just returned. Returns false
    /// (and serves nothing) when the shard was dropped meanwhile: a shard is never loaded
    /// after its unload.
    fn finish_load(&self, index: i32, shard: T) -> bool {
        let mut states = write(&self.states);
        let loading = matches!(states.get(&index), Some(ShardState::Loading));
        debug_assert!(loading, "{}-{index} finished loading but was not loading: dropped meanwhile", self.topic);
        if loading {
            states.insert(index, ShardState::Loaded(Arc::new(shard)));
        }
        loading
    }

    /// Stops serving `index` (loaded or loading), before its owner forgets its state.
    fn drop_shard(&self, index: i32) {
        let dropped = write(&self.states).remove(&index);
        debug_assert!(dropped.is_some(), "{}-{index} dropped but never loaded", self.topic);
    }

    /// Every loaded shard, by partition.
    pub fn loaded(&self) -> BTreeMap<i32, Arc<T>> {
        read(&self.states)
            .iter()
            .filter_map(|(index, state)| match state {
                ShardState::Loaded(shard) => Some((*index, shard.clone())),
                ShardState::Loading => None,
            })
            .collect()
    }
}

/// A coordinator whose state is sharded over the partitions of an internal topic.
pub trait ShardOwner: Send + Sync + 'static {
    type Shard: Send + Sync + 'static;

    fn shards(&self) -> &Shards<Self::Shard>;

    /// Reads the state of partition `index` from its log into memory. Blocking. Called when
    /// this broker has come to lead the partition; requests for it are refused meanwhile.
    fn load_shard(&self, index: i32, partition: Arc<Partition>) -> Result<Self::Shard, BrokerError>;

    /// Forgets the state of partition `index` and answers whoever waits on it: this broker no
    /// longer leads it.
    fn unload_shard(&self, index: i32);
}

/// The `topic` partitions this broker leads and hosts, by index.
fn led_here(broker: &Broker, topic: &str) -> BTreeMap<i32, Arc<Partition>> {
    let state = broker.metadata();
    let Some(meta) = state.topic(topic) else { return BTreeMap::new() };
    (0..meta.partitions)
        .filter(|index| meta.partition(*index).is_some_and(|p| p.leader == broker.config.node_id))
        .filter_map(|index| Some((index, broker.partition(topic, index)?)))
        .collect()
}

/// Loads the shards this broker now leads and unloads those it no longer leads. Blocking.
/// Returns false when a load failed (to be tried again).
pub fn reconcile_blocking<O: ShardOwner>(broker: &Broker, owner: &O) -> bool {
    let shards = owner.shards();
    let wanted = led_here(broker, shards.topic);
    let lost: Vec<i32> = read(&shards.states).keys().filter(|index| !wanted.contains_key(index)).copied().collect();
    for index in lost {
        // Not served any more before the owner forgets it (the invariant above).
        shards.drop_shard(index);
        owner.unload_shard(index);
        tracing::info!(topic = shards.topic, partition = index, "no longer the coordinator of this partition");
    }
    let gained: Vec<(i32, Arc<Partition>)> =
        wanted.into_iter().filter(|(index, _)| shards.begin_load(*index)).collect();
    let mut all_loaded = true;
    for (index, partition) in gained {
        match owner.load_shard(index, partition) {
            Ok(shard) => {
                if !shards.finish_load(index, shard) {
                    owner.unload_shard(index);
                }
            }
            Err(e) => {
                tracing::warn!(topic = shards.topic, partition = index, error = %e, "cannot load this partition yet");
                shards.drop_shard(index);
                all_loaded = false;
            }
        }
    }
    all_loaded
}

/// Runs [`reconcile_blocking`] after every metadata change this broker applies, until the broker
/// shuts down or the owner is dropped.
pub fn spawn_watcher<O: ShardOwner>(broker: &Arc<Broker>, owner: Weak<O>) {
    let mut changes = broker.subscribe_metadata();
    let mut shutdown = broker.shutdown_signal();
    let broker = Arc::downgrade(broker);
    tokio::spawn(async move {
        let mut retry = false;
        loop {
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(RETRY_LOAD_AFTER), if retry => {}
                _ = shutdown.changed() => return,
            }
            let (Some(broker), Some(owner)) = (broker.upgrade(), owner.upgrade()) else { return };
            if broker.is_shutting_down() {
                return;
            }
            retry = match tokio::task::spawn_blocking(move || !reconcile_blocking(&broker, &*owner)).await {
                Ok(retry) => retry,
                Err(e) => {
                    tracing::error!(error = %e, "reconciling coordinator shards failed");
                    true
                }
            };
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_is_served_between_its_load_and_its_drop() {
        let shards: Shards<u32> = Shards::new("__t");
        assert_eq!(shards.get(0).map_err(|e| e.kind).err(), Some(ErrorKind::NotCoordinator));
        assert!(shards.begin_load(0));
        assert!(!shards.begin_load(0), "already loading");
        assert_eq!(shards.get(0).map_err(|e| e.kind).err(), Some(ErrorKind::CoordinatorLoadInProgress));
        assert!(shards.finish_load(0, 7));
        assert_eq!(shards.get(0).map(|s| *s).ok(), Some(7));
        shards.drop_shard(0);
        assert_eq!(shards.get(0).map_err(|e| e.kind).err(), Some(ErrorKind::NotCoordinator));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "was not loading")]
    fn a_shard_loaded_after_its_drop_is_caught() {
        let shards: Shards<u32> = Shards::new("__t");
        assert!(shards.begin_load(0));
        shards.drop_shard(0);
        shards.finish_load(0, 7);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "never loaded")]
    fn a_shard_dropped_without_a_load_is_caught() {
        let shards: Shards<u32> = Shards::new("__t");
        shards.drop_shard(3);
    }
}
