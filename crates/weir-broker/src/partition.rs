//! A partition as the broker sees it: its log, its replicas and leader (from the metadata), and
//! the long-poll fetches waiting for it to grow.

use std::sync::atomic::{AtomicI32, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use tokio::sync::Notify;
use uuid::Uuid;
use weir_storage::Log;

use crate::error::{BrokerError, ErrorKind};
use crate::metadata::PartitionState;
use crate::metrics::counted::PartitionMetrics;
use crate::replication::ReplicaState;
use crate::throttle::ThrottledReplicas;
use crate::topic_config::TopicCompression;
use crate::watch::PartitionWatch;
use weir_storage::sync::{lock, read, write};

/// Where a read of a partition stops (a fetch's, a ListOffsets').
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Up to the high watermark: everything acknowledged (Kafka's `read_uncommitted`).
    HighWatermark,
    /// Up to the last stable offset: no record of a transaction still open, and the aborted
    /// transactions of what is returned are listed (Kafka's `read_committed`).
    Committed,
}

pub struct Partition {
    pub topic: String,
    pub topic_id: Uuid,
    pub index: i32,
    pub log: Arc<Log>,
    /// An internal topic's partition (`__consumer_offsets`, ...): clients may not produce to it.
    pub internal: bool,
    /// This broker's id: the partition is led here when its state names it leader.
    pub(crate) local_broker: i32,
    /// Replicas, ISR, leader and leader epoch as the applied metadata says; replaced by the
    /// broker whenever a metadata change touches the partition.
    state: RwLock<Arc<PartitionState>>,
    /// The topic's `min.insync.replicas`, kept current by the broker when configs change, so
    /// the produce path checks it without looking up the topic and parsing its configs.
    min_insync_replicas: AtomicI64,
    /// The topic's `compression.type`, kept current like `min_insync_replicas`.
    compression: Mutex<TopicCompression>,
    /// On a topic of `message.type=DELAY`, its `message.delay.max.ms`; 0 on any other. Kept
    /// current likewise: the produce path diverts delayed records of such topics to the timer.
    delay_max_ms: AtomicI64,
    /// The topic's leader and follower throttled-replica lists, kept current likewise.
    throttled_replicas: Mutex<(ThrottledReplicas, ThrottledReplicas)>,
    /// Bytes and records in and out, counted by the produce and fetch paths.
    pub metrics: PartitionMetrics,
    /// Fetches parked until new data is visible. Each holds its own `Notify`; an append wakes
    /// all of them (a fetch over many partitions registers the same `Notify` in each).
    waiters: Mutex<Vec<Weak<Notify>>>,
    /// Fetch sessions watching the partition, each with its slot for it (see `watch`): marked
    /// whenever the waiters are woken. Unlike a waiter, a watch stays until it is removed or
    /// dropped.
    watchers: Mutex<Vec<(Weak<PartitionWatch>, u32)>>,
    /// Followers' positions and the pending ISR change when this broker leads; the learned
    /// high watermark when it follows (see `replication`).
    pub(crate) replication: Mutex<ReplicaState>,
    /// The broker is shutting down: writes waiting for the ISR give up.
    pub(crate) closing: std::sync::atomic::AtomicBool,
    /// S of the native write protocol: when this broker last took the partition over, in ms
    /// (see `crate::session`). Set when the partition opens and each time this broker becomes
    /// its leader.
    pub(crate) load_stamp: AtomicI64,
    /// For a memory-first partition: the leader epoch at which this broker last brought it to
    /// what the object store holds (`crate::memory`); -1 before. Led at another epoch, it
    /// serves nothing until the memory writer has loaded it (a partition moved here, or led
    /// here again after a fence, may lack what the store has, or hold what it never took).
    memory_loaded_epoch: AtomicI32,
    /// For a memory-first partition led here: the end of what the object store holds of it.
    /// Its high watermark never passes it (`crate::memory`).
    pub(crate) memory_persisted_end: AtomicI64,
    /// For a memory-first partition led here: the batches of its produce requests as they were
    /// written (offsets assigned), by first offset, with the offset after them, until the
    /// object store has them. The memory writer sends these instead of reading the log back
    /// (`crate::memory`).
    pub(crate) memory_tail: Mutex<std::collections::BTreeMap<i64, (i64, bytes::Bytes)>>,
}

/// This broker leads at `epoch` from now on: the epoch begins at the log end (batches appended
/// from now on carry it). A failure only costs OffsetForLeaderEpoch precision: the epoch is
/// recorded again with its first batch.
fn record_leader_epoch(log: &Log, topic: &str, index: i32, epoch: i32) {
    if let Err(e) = log.assign_leader_epoch(epoch) {
        tracing::error!(topic, partition = index, error = %e, "cannot record the leader epoch");
    }
}

/// S is wall-clock time: it must keep growing across restarts, which a broker's test clock
/// need not.
pub(crate) fn wall_clock_ms() -> i64 {
    use weir_storage::Clock as _;
    weir_storage::SystemClock.now_ms()
}

/// A topic's partitions by index, as this broker holds them: `None` where the partition's
/// replicas are all on other brokers. The list is as long as the topic has partitions.
pub type TopicPartitions = Arc<[Option<Arc<Partition>>]>;

/// Partition `index` of a topic's list (see `Broker::topic_partitions`); `None` when out of range
/// or hosted elsewhere.
pub fn by_index(partitions: &[Option<Arc<Partition>>], index: i32) -> Option<&Arc<Partition>> {
    partitions.get(usize::try_from(index).ok()?)?.as_ref()
}

impl Partition {
    pub fn new(
        topic: String,
        topic_id: Uuid,
        index: i32,
        log: Arc<Log>,
        internal: bool,
        local_broker: i32,
        state: PartitionState,
    ) -> Partition {
        if state.leader == local_broker {
            record_leader_epoch(&log, &topic, index, state.leader_epoch);
        }
        // A partition new with its topic has nothing in the store to load.
        let new_with_topic = if state.leader_epoch == 0 && log.log_end_offset() == 0 { 0 } else { -1 };
        let partition = Partition {
            topic,
            topic_id,
            index,
            log,
            internal,
            local_broker,
            state: RwLock::new(Arc::new(state.clone())),
            min_insync_replicas: AtomicI64::new(1),
            compression: Mutex::new(TopicCompression::Producer),
            delay_max_ms: AtomicI64::new(0),
            throttled_replicas: Mutex::new(Default::default()),
            metrics: PartitionMetrics::default(),
            waiters: Mutex::new(Vec::new()),
            watchers: Mutex::new(Vec::new()),
            replication: Mutex::new(ReplicaState::new()),
            closing: std::sync::atomic::AtomicBool::new(false),
            load_stamp: AtomicI64::new(0),
            memory_loaded_epoch: AtomicI32::new(new_with_topic),
            memory_persisted_end: AtomicI64::new(0),
            memory_tail: Mutex::new(std::collections::BTreeMap::new()),
        };
        partition.mark_loaded(wall_clock_ms());
        partition.on_state_change(&state);
        partition
    }

    /// The replicas, ISR, leader and epochs the metadata gives the partition now.
    pub fn state(&self) -> Arc<PartitionState> {
        read(&self.state).clone()
    }

    pub(crate) fn set_state(&self, state: PartitionState) {
        let mut current = write(&self.state);
        debug_assert!(
            state.leader_epoch >= current.leader_epoch && state.partition_epoch >= current.partition_epoch,
            "{}-{}: epochs went back from {current:?} to {state:?}",
            self.topic,
            self.index
        );
        if state.leader == self.local_broker {
            record_leader_epoch(&self.log, &self.topic, self.index, state.leader_epoch);
        }
        *current = Arc::new(state.clone());
        drop(current);
        self.on_state_change(&state);
    }

    /// Runs `write` (an append of a client's or the broker's own batches) only while this
    /// broker leads the partition at `leader_epoch`, holding the partition state meanwhile: a
    /// change of leader waits for the write, and a write that finds the leadership moved since
    /// the request was checked writes nothing (NOT_LEADER_OR_FOLLOWER, so the client retries at
    /// the new leader). Without this, a deposed leader could append a client's batch among the
    /// batches it now replicates as a follower, stamped with its old epoch below newer ones,
    /// where the divergence check never finds it: the replicas' logs would differ for good.
    ///
    /// `write` must not read the partition state (the lock is held).
    pub(crate) fn write_as_leader<T, E: From<BrokerError>>(
        &self,
        leader_epoch: i32,
        write: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let state = read(&self.state);
        if state.leader != self.local_broker || state.leader_epoch != leader_epoch {
            return Err(BrokerError::new(
                ErrorKind::NotLeader,
                format!(
                    "{}-{}: leadership moved while the request waited (broker {} leads at epoch {} now)",
                    self.topic, self.index, state.leader, state.leader_epoch
                ),
            )
            .into());
        }
        write()
    }

    /// Runs `write` (an append or truncation from the leader's answer) only while this broker
    /// follows the partition from `leader` at `leader_epoch`, the leader and epoch the fetch
    /// was sent for, holding the state meanwhile, for the same reason as
    /// [`Partition::write_as_leader`]. An answer from a deposed leader that arrives late (one
    /// frozen with SIGSTOP answers the fetches it had read once it runs again) would otherwise
    /// put its unacknowledged tail into this log after the new leader took over: Kafka's fetcher
    /// drops such answers too, by their epoch.
    pub(crate) fn write_as_follower<T, E: From<BrokerError>>(
        &self,
        leader: i32,
        leader_epoch: i32,
        write: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let state = read(&self.state);
        if state.leader == self.local_broker {
            return Err(BrokerError::new(
                ErrorKind::NotLeader,
                format!("{}-{} is led here now: it takes no replicated batches", self.topic, self.index),
            )
            .into());
        }
        if state.leader != leader || state.leader_epoch != leader_epoch {
            return Err(BrokerError::new(
                ErrorKind::FencedLeaderEpoch,
                format!(
                    "{}-{}: an answer from broker {leader} at leader epoch {leader_epoch} came after broker {} \
                     took over at epoch {}: dropped",
                    self.topic, self.index, state.leader, state.leader_epoch
                ),
            )
            .into());
        }
        write()
    }

    pub fn leader_epoch(&self) -> i32 {
        self.state().leader_epoch
    }

    /// Ok when this broker leads the partition; the error to answer otherwise.
    pub fn check_local_leader(&self) -> Result<Arc<PartitionState>, BrokerError> {
        let state = self.state();
        if state.leader == self.local_broker {
            if self.log.is_memory_first() && !self.memory_loaded(state.leader_epoch) {
                return Err(BrokerError::new(
                    ErrorKind::LeaderNotAvailable,
                    format!(
                        "{}-{} is loading from the object store on this broker ({}): retry shortly",
                        self.topic, self.index, self.local_broker
                    ),
                ));
            }
            return Ok(state);
        }
        let (kind, why) = if state.leader == crate::metadata::NO_LEADER {
            (ErrorKind::LeaderNotAvailable, "has no leader right now".to_string())
        } else {
            (ErrorKind::NotLeader, format!("is led by broker {}", state.leader))
        };
        Err(BrokerError::new(
            kind,
            format!("{}-{} {why}, not by this broker ({}).", self.topic, self.index, self.local_broker),
        ))
    }

    /// Whether this broker brought the memory-first partition to what the object store holds
    /// at `leader_epoch` (see `crate::memory`).
    pub(crate) fn memory_loaded(&self, leader_epoch: i32) -> bool {
        self.memory_loaded_epoch.load(Ordering::Acquire) == leader_epoch
    }

    pub(crate) fn set_memory_loaded(&self, leader_epoch: i32) {
        self.memory_loaded_epoch.store(leader_epoch, Ordering::Release);
    }

    /// Checks the leader epoch a client believes current (`None`: it does not say): an older one
    /// means its metadata is stale, a newer one that this broker is behind.
    pub fn check_leader_epoch(&self, current: Option<i32>) -> Result<(), BrokerError> {
        let Some(current) = current.filter(|e| *e >= 0) else { return Ok(()) };
        let epoch = self.leader_epoch();
        match current.cmp(&epoch) {
            std::cmp::Ordering::Equal => Ok(()),
            std::cmp::Ordering::Less => Err(BrokerError::new(
                ErrorKind::FencedLeaderEpoch,
                format!("{}-{}: leader epoch {current} is older than the current {epoch}", self.topic, self.index),
            )),
            std::cmp::Ordering::Greater => Err(BrokerError::new(
                ErrorKind::UnknownLeaderEpoch,
                format!("{}-{}: leader epoch {current} is newer than this broker's {epoch}", self.topic, self.index),
            )),
        }
    }

    pub fn compression(&self) -> TopicCompression {
        *lock(&self.compression)
    }

    pub(crate) fn set_compression(&self, compression: TopicCompression) {
        *lock(&self.compression) = compression;
    }

    /// `Some(message.delay.max.ms)` on a DELAY topic.
    pub(crate) fn delay_max_ms(&self) -> Option<i64> {
        Some(self.delay_max_ms.load(Ordering::Relaxed)).filter(|ms| *ms > 0)
    }

    pub(crate) fn set_delay_max_ms(&self, delay_max_ms: Option<i64>) {
        self.delay_max_ms.store(delay_max_ms.unwrap_or(0), Ordering::Relaxed);
    }

    pub(crate) fn set_throttled_replicas(&self, lists: (ThrottledReplicas, ThrottledReplicas)) {
        *lock(&self.throttled_replicas) = lists;
    }

    /// Leading: is what this broker sends `replica` of this partition throttled?
    pub(crate) fn throttles_for_leader(&self, state: &PartitionState, replica: i32) -> bool {
        let lists = lock(&self.throttled_replicas);
        crate::throttle::is_throttled(state, self.index, replica, &lists.0, self.local_broker)
    }

    /// Following: is what this broker fetches for this partition throttled?
    pub(crate) fn throttled_as_follower(&self) -> bool {
        let state = self.state();
        let lists = lock(&self.throttled_replicas);
        crate::throttle::is_throttled(&state, self.index, self.local_broker, &lists.1, self.local_broker)
    }

    pub fn min_insync_replicas(&self) -> i64 {
        self.min_insync_replicas.load(Ordering::Relaxed)
    }

    pub(crate) fn set_min_insync_replicas(&self, value: i64) {
        self.min_insync_replicas.store(value, Ordering::Relaxed);
    }

    /// Registers `waiter` to be notified at the next change of the visible end (high
    /// watermark). Register first, then check for data: `Notify` keeps a permit, so a wake-up
    /// between the check and the wait is not lost.
    pub fn register_waiter(&self, waiter: &Arc<Notify>) {
        let mut waiters = lock(&self.waiters);
        // Fetches that timed out leave dead entries; drop them so an idle partition's list
        // stays as long as its live waiters.
        waiters.retain(|w| w.strong_count() > 0);
        waiters.push(Arc::downgrade(waiter));
    }

    /// How many registered waiters are still waiting: what a test waits on to know a long poll
    /// is parked (the messaging engines' tests too, so it is public).
    pub fn live_waiters(&self) -> usize {
        lock(&self.waiters).iter().filter(|w| w.strong_count() > 0).count()
    }

    /// Wakes every registered waiter; each re-registers if it still has to wait. Marks the
    /// partition's slot in every watch on it.
    pub fn wake_waiters(&self) {
        let waiters = std::mem::take(&mut *lock(&self.waiters));
        for waiter in waiters {
            if let Some(waiter) = waiter.upgrade() {
                waiter.notify_one();
            }
        }
        let watchers: Vec<(Arc<PartitionWatch>, u32)> =
            lock(&self.watchers).iter().filter_map(|(w, slot)| Some((w.upgrade()?, *slot))).collect();
        for (watch, slot) in watchers {
            watch.mark(slot);
        }
    }

    /// Marks `slot` of `watch` at each change of the partition from now on (see
    /// [`crate::watch`]), until [`Partition::unwatch`] or the watch is dropped.
    pub fn watch(&self, watch: &Arc<PartitionWatch>, slot: u32) {
        let mut watchers = lock(&self.watchers);
        watchers.retain(|(w, _)| w.strong_count() > 0);
        watchers.push((Arc::downgrade(watch), slot));
    }

    /// Stops marking `slot` of `watch`.
    pub fn unwatch(&self, watch: &Arc<PartitionWatch>, slot: u32) {
        let target = Arc::downgrade(watch);
        lock(&self.watchers).retain(|(w, s)| w.strong_count() > 0 && !(w.ptr_eq(&target) && *s == slot));
    }
}
