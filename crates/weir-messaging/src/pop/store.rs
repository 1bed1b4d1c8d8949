//! `PopStore`: the engine's side of the invisible-time state. It holds the states of the
//! queues this broker's partitions lead, as loaded from their shards of `__share_group_state`
//! ([`super::shard`]), and writes every change through to its shard before the engine answers.
//!
//! - **Loading.** A queue ([`super::lines::QueueId`]: a group's queue, with each broadcasting
//!   consumer's state of it) is loaded before its first use and again whenever its partition's
//!   leader epoch changed ([`PopStore::load`]); the load fences the previous leader's engine.
//! - **Writing.** [`PopStore::update`] changes a state in memory, under one lock, and queues
//!   what changed ([`super::lines::Change`]) for its shard; one writer task per shard sends the
//!   queued lines in order, many at a time (group commit), and acknowledges each once the
//!   shard's ISR has it ([`Durable`]). Callers answer only after that.
//! - **Failures.** A line that could not be written (or was fenced) drops its queue's states
//!   from memory, and lines queued after it for that queue are not sent: the queue is loaded
//!   again, as durable as it is, at its next use. Memory is never behind what was answered.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{mpsc, oneshot, watch};

use std::borrow::Cow;

use super::lines::StateLine;
use super::shard::{StateShards, TOPIC};
use super::state::{Inflight, QueueState};
use weir_storage::sync::lock;

use weir_broker::error::{BrokerError, ErrorKind};
use weir_broker::Broker;

/// The directory of the broker-local store of earlier versions, under the data directory
/// (moved into `__share_group_state` at the first start, see `super::migrate`).
pub const DIR: &str = "rocketmq-pop";

/// Most lines one write of a shard's writer carries.
const WRITE_BATCH: usize = 4096;

/// Most messages one queue may have in flight (delivered, not done) for one group; a receive
/// beyond it gets only redeliveries. Bounds the state whatever consumers do.
pub(crate) const MAX_INFLIGHT_PER_QUEUE: usize = 4096;

/// Most FIFO messages one queue may hold waiting behind their group's active message, for one
/// group. Past it, the rest of the queue waits too: a message is never skipped. 65,536 entries
/// of about 60 bytes: 4 MiB at most per queue and group.
pub(crate) const MAX_PARKED_PER_QUEUE: usize = 65_536;

/// Which queue of which group (and, in a broadcasting group, of which consumer).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct QueueKey {
    pub group: String,
    pub topic: String,
    pub partition: i32,
    /// In a group with `consume.broadcast`, the client id of the consumer: each consumer has
    /// its own progress. `None` in a clustering group, whose consumers share it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer: Option<String>,
}

impl QueueKey {
    /// The queue `partition` of `topic` for `group` (clustering).
    pub fn new(group: impl Into<String>, topic: impl Into<String>, partition: i32) -> QueueKey {
        QueueKey { group: group.into(), topic: topic.into(), partition, consumer: None }
    }
}

/// A change made in memory, durable once [`Durable::wait`] says so.
#[must_use = "a change counts only once durable"]
pub(crate) struct Durable(Option<oneshot::Receiver<Result<(), BrokerError>>>);

impl Durable {
    /// Nothing to wait for (nothing changed).
    pub(crate) fn none() -> Durable {
        Durable(None)
    }

    /// Waits until the change is in its shard's ISR; an error means it may be lost (and the
    /// queue is loaded again at its next use).
    pub(crate) async fn wait(self) -> Result<(), BrokerError> {
        match self.0 {
            None => Ok(()),
            Some(rx) => rx.await.unwrap_or_else(|_| Err(BrokerError::internal("the state writer stopped"))),
        }
    }
}

/// A line waiting for its shard's writer.
struct Queued {
    /// Its queue ([`queue_of`]).
    id: QueueKey,
    /// The load of the queue it was made in ([`Loaded::load`]).
    load: u64,
    line: StateLine,
    done: oneshot::Sender<Result<(), BrokerError>>,
}

/// A queue loaded here.
#[derive(Clone)]
struct Loaded {
    /// The leader epoch of its partition when it was loaded.
    epoch: i32,
    /// Which load this is (each load of any queue gets the next number).
    load: u64,
    writer: mpsc::UnboundedSender<Queued>,
}

/// The invisible-time states of the queues this broker leads (see the module above).
pub(crate) struct PopStore {
    broker: Weak<Broker>,
    states: Arc<StateShards>,
    inner: Mutex<Inner>,
    writers: Mutex<HashMap<i32, mpsc::UnboundedSender<Queued>>>,
    shard_count: tokio::sync::OnceCell<i32>,
    /// False while an earlier version's local store is being moved: nothing loads meanwhile.
    ready: watch::Sender<bool>,
    /// The deliveries being moved to the dead letters right now ([`PopStore::claim_dead_letter`]).
    dead_lettering: Mutex<std::collections::HashSet<(QueueKey, i64)>>,
}

/// The right to move one delivery to the dead letters, until dropped.
pub(crate) struct DeadLetterClaim<'a> {
    store: &'a PopStore,
    delivery: (QueueKey, i64),
}

impl Drop for DeadLetterClaim<'_> {
    fn drop(&mut self) {
        lock(&self.store.dead_lettering).remove(&self.delivery);
    }
}

#[derive(Default)]
struct Inner {
    /// By queue ([`queue_of`]).
    loaded: HashMap<QueueKey, Loaded>,
    queues: HashMap<QueueKey, QueueState>,
    loads: u64,
}

/// The queue a state belongs to, as `Inner::loaded` names it: the clustering state's key (the
/// key itself for that state: no copy on the paths every ack takes).
fn queue_of(key: &QueueKey) -> Cow<'_, QueueKey> {
    if key.consumer.is_none() {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(QueueKey { consumer: None, ..key.clone() })
    }
}

/// Whether `key` is a state of queue `queue` (a [`queue_of`]).
fn of_queue(key: &QueueKey, queue: &QueueKey) -> bool {
    key.partition == queue.partition && key.group == queue.group && key.topic == queue.topic
}

fn not_loaded(key: &QueueKey) -> BrokerError {
    BrokerError::new(
        ErrorKind::NotLeader,
        format!("the state of group {} on {}-{} is being loaded again; retry", key.group, key.topic, key.partition),
    )
}

impl PopStore {
    /// The store of `broker`, over the state shards `states`; it waits for the move of an
    /// earlier version's store in `data_dir` (if there is one) before it loads anything.
    pub(crate) fn new(broker: &Arc<Broker>, states: &Arc<StateShards>, data_dir: &Path) -> PopStore {
        let (ready, _) = watch::channel(!data_dir.join(DIR).is_dir());
        PopStore {
            broker: Arc::downgrade(broker),
            states: states.clone(),
            inner: Mutex::new(Inner::default()),
            writers: Mutex::new(HashMap::new()),
            shard_count: tokio::sync::OnceCell::new(),
            ready,
            dead_lettering: Mutex::new(std::collections::HashSet::new()),
        }
    }

    fn broker(&self) -> Result<Arc<Broker>, BrokerError> {
        self.broker.upgrade().ok_or_else(|| BrokerError::internal("the broker is shutting down"))
    }

    /// The earlier version's store was moved (or there was none): queues may load.
    pub(crate) fn set_ready(&self) {
        self.ready.send_replace(true);
    }

    pub(crate) async fn shard_count(&self, broker: &Arc<Broker>) -> Result<i32, BrokerError> {
        self.shard_count.get_or_try_init(|| crate::state_topic::partitions(broker, TOPIC)).await.copied()
    }

    /// The writer of shard `index`, started at its first use. Call within a tokio runtime.
    fn writer(self: &Arc<Self>, index: i32) -> mpsc::UnboundedSender<Queued> {
        let mut writers = lock(&self.writers);
        if let Some(writer) = writers.get(&index).filter(|w| !w.is_closed()) {
            return writer.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(Arc::downgrade(self), index, rx));
        writers.insert(index, tx.clone());
        tx
    }

    /// Loads the queue of `key` (every consumer's state of it) from its shard unless it is
    /// loaded already for the current leader epoch of its partition, which this broker must
    /// lead.
    pub(crate) async fn load(self: &Arc<Self>, key: &QueueKey) -> Result<(), BrokerError> {
        let broker = self.broker()?;
        let partition = broker.partition(&key.topic, key.partition).ok_or_else(|| {
            BrokerError::new(
                ErrorKind::NotLeader,
                format!("broker {} does not host {}-{}", broker.config.node_id, key.topic, key.partition),
            )
        })?;
        partition.check_local_leader()?;
        let epoch = partition.leader_epoch();
        let queue = queue_of(key);
        if lock(&self.inner).loaded.get(&*queue).is_some_and(|l| l.epoch == epoch) {
            return Ok(());
        }
        let queue = queue.into_owned();
        let id = key.id();
        let mut ready = self.ready.subscribe();
        if !*ready.borrow() {
            ready
                .wait_for(|ready| *ready)
                .await
                .map_err(|_| BrokerError::internal("the invisible-time store was dropped"))?;
        }
        let count = self.shard_count(&broker).await?;
        let shard = id.shard(count);
        let writer = self.writer(shard);
        let states = crate::state_topic::at_leader(&broker, TOPIC, shard, |node| {
            let (broker, id) = (broker.clone(), id.clone());
            async move {
                match node {
                    None => self.states.take_over_here(shard, &id, epoch).await,
                    Some(node) => {
                        let request = super::service::TakeOverRequest { shard, queue: id, epoch };
                        super::service::call_take_over(&broker, node, &request).await
                    }
                }
            }
        })
        .await?;
        let mut inner = lock(&self.inner);
        if inner.loaded.get(&queue).is_some_and(|l| l.epoch >= epoch) {
            return Ok(()); // loaded meanwhile
        }
        // What a receive read before the load must not be handed out after it (as after a
        // reset): each state counts one reset more than the one it replaces.
        let old: HashMap<QueueKey, u64> =
            inner.queues.iter().filter(|(k, _)| of_queue(k, &queue)).map(|(k, s)| (k.clone(), s.resets)).collect();
        for key in old.keys() {
            inner.queues.remove(key);
        }
        inner.loads += 1;
        let load = inner.loads;
        inner.loaded.insert(queue, Loaded { epoch, load, writer });
        for (key, mut state) in states {
            state.resets = old.get(&key).map_or(0, |r| r + 1);
            inner.queues.insert(key, state);
        }
        Ok(())
    }

    /// Runs `change` on the state of `key` (made with `start` the first time), whose queue must
    /// be loaded ([`PopStore::load`]), and returns what `change` returned with the write to
    /// wait for before answering. A `change` that returns `Err` must leave the state as it
    /// found it: nothing is written then. A state made by `start` is written even when `change`
    /// leaves it as it is: where a group starts on a queue (`consume.from.where`, maybe the
    /// queue's end then) must outlive this broker.
    pub(crate) fn update<R, E>(
        &self,
        key: &QueueKey,
        start: impl FnOnce() -> QueueState,
        change: impl FnOnce(&mut QueueState) -> Result<R, E>,
    ) -> Result<(Result<R, E>, Durable), BrokerError> {
        let broker = self.broker()?;
        let epoch = broker.partition(&key.topic, key.partition).map(|p| p.leader_epoch());
        let mut inner = lock(&self.inner);
        let loaded = match inner.loaded.get(&*queue_of(key)) {
            Some(loaded) if Some(loaded.epoch) == epoch => loaded.clone(),
            _ => return Err(not_loaded(key)),
        };
        let started = !inner.queues.contains_key(key);
        let state = inner.queues.entry(key.clone()).or_insert_with(start);
        // What a change wrote is what it touched (not a comparison with a copy: a queue may
        // have thousands of messages out); debug builds check that it is all that changed.
        let before = cfg!(debug_assertions).then(|| state.clone());
        let position = (state.done_below, state.next);
        state.touched.0.clear();
        let result = change(state);
        if result.is_err() {
            state.touched.0.clear();
            return Ok((result, Durable::none()));
        }
        if state.touched.0.is_empty() && (state.done_below, state.next) == position && !started {
            return Ok((result, Durable::none()));
        }
        let change = state.take_change();
        if let Some(before) = before {
            let mut replayed = before;
            change.clone().apply(&mut replayed);
            debug_assert_eq!(&replayed, state, "a change of {key:?} that its touched offsets do not describe");
        }
        let line = StateLine::change(key.clone(), loaded.epoch, change);
        let (done, waited) = oneshot::channel();
        let queue = queue_of(key).into_owned();
        if let Err(unsent) = loaded.writer.send(Queued { id: queue, load: loaded.load, line, done }) {
            // Not written: memory must agree with the shard, so the queue loads again.
            let queue = unsent.0.id;
            inner.loaded.remove(&queue);
            inner.queues.retain(|k, _| !of_queue(k, &queue));
            return Err(BrokerError::internal("the state writer stopped"));
        }
        Ok((result, Durable(Some(waited))))
    }

    /// Moves every state of `group` for `topic`-`partition` (each broadcasting consumer's too)
    /// to start at `offset` ([`QueueState::reset_to`]); with `create`, a group without one for
    /// this queue gets one (clustering), so its first receive starts there too. Durable before
    /// it returns; returns how many states it set.
    pub(crate) async fn reset(
        self: &Arc<Self>,
        group: &str,
        topic: &str,
        partition: i32,
        offset: i64,
        create: bool,
    ) -> Result<usize, BrokerError> {
        let base = QueueKey::new(group, topic, partition);
        self.load(&base).await?;
        let broker = self.broker()?;
        let epoch = broker.partition(topic, partition).map(|p| p.leader_epoch());
        let mut waits = Vec::new();
        {
            let mut inner = lock(&self.inner);
            let loaded = match inner.loaded.get(&base) {
                Some(loaded) if Some(loaded.epoch) == epoch => loaded.clone(),
                _ => return Err(not_loaded(&base)),
            };
            let mut keys: Vec<QueueKey> = inner
                .queues
                .keys()
                .filter(|k| k.group == group && k.topic == topic && k.partition == partition)
                .cloned()
                .collect();
            if keys.is_empty() && create {
                keys.push(base.clone());
            }
            for key in keys {
                let state = inner.queues.entry(key.clone()).or_default();
                state.reset_to(offset);
                // The whole (empty) state: smaller than a change listing every entry removed.
                let line = StateLine::whole(key.clone(), loaded.epoch, state.clone());
                let (done, waited) = oneshot::channel();
                if loaded.writer.send(Queued { id: base.clone(), load: loaded.load, line, done }).is_err() {
                    return Err(BrokerError::internal("the state writer stopped"));
                }
                waits.push(Durable(Some(waited)));
            }
        }
        let count = waits.len();
        for wait in waits {
            wait.wait().await?;
        }
        Ok(count)
    }

    /// Drops the states of `id` if they are still those of load `load`: a line of theirs was
    /// not written.
    fn forget(&self, queue: &QueueKey, load: u64) {
        let mut inner = lock(&self.inner);
        if inner.loaded.get(queue).is_some_and(|l| l.load == load) {
            inner.loaded.remove(queue);
            inner.queues.retain(|k, _| !of_queue(k, queue));
        }
    }

    /// Whether `id` is still loaded as load `load`.
    fn is_current(&self, queue: &QueueKey, load: u64) -> bool {
        lock(&self.inner).loaded.get(queue).is_some_and(|l| l.load == load)
    }

    /// Claims the delivery of `offset` in `key` for a move to the dead letters; `None` when
    /// someone else is moving it (the sweep, a receive, a consumer giving up): two movers
    /// would write two dead letters.
    pub(crate) fn claim_dead_letter(&self, key: &QueueKey, offset: i64) -> Option<DeadLetterClaim<'_>> {
        let delivery = (key.clone(), offset);
        // The lock is let go before a claim exists: a refused claim built eagerly (as
        // `bool::then_some` builds it) is dropped at once, and its drop takes this lock; under
        // the guard that hung the worker for good, and then every worker, on the second mover.
        let claimed = lock(&self.dead_lettering).insert(delivery.clone());
        claimed.then(|| DeadLetterClaim { store: self, delivery })
    }

    /// Whether any queue of `group` has a state here (the group consumes by invisible time).
    pub(crate) fn has_group(&self, group: &str) -> bool {
        lock(&self.inner).queues.keys().any(|k| k.group == group)
    }

    /// Whether `key` has a state (without copying it).
    pub fn contains(&self, key: &QueueKey) -> bool {
        lock(&self.inner).queues.contains_key(key)
    }

    /// When the next in-flight message of `key` becomes visible again (without copying the state).
    pub(crate) fn next_expiry_ms(&self, key: &QueueKey) -> Option<i64> {
        lock(&self.inner).queues.get(key).and_then(QueueState::next_expiry_ms)
    }

    /// The in-flight messages of `key` due for the dead letters (see [`QueueState::exhausted`]).
    pub fn exhausted(&self, key: &QueueKey, now_ms: i64, max_attempts: u32) -> Vec<(i64, Inflight)> {
        lock(&self.inner).queues.get(key).map(|q| q.exhausted(now_ms, max_attempts)).unwrap_or_default()
    }

    /// The queues with a message whose invisible time ran out after at least `min_attempts`
    /// deliveries (the smallest `max.delivery.attempts` of any group to look at).
    pub(crate) fn queues_with_expired(&self, now_ms: i64, min_attempts: u32) -> Vec<QueueKey> {
        lock(&self.inner)
            .queues
            .iter()
            .filter(|(_, q)| q.inflight.values().any(|i| i.visible_at_ms <= now_ms && i.attempt >= min_attempts))
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Every queue's progress: the offset below which its group is done with every message.
    pub fn progress(&self) -> Vec<(QueueKey, i64)> {
        lock(&self.inner).queues.iter().map(|(key, state)| (key.clone(), state.done_below)).collect()
    }

    /// The delivery of `offset` in flight for `key`, if there is one.
    pub(crate) fn get_inflight(&self, key: &QueueKey, offset: i64) -> Option<Inflight> {
        lock(&self.inner).queues.get(key).and_then(|q| q.inflight.get(&offset).copied())
    }

    /// Of `offsets` of `key`, which are in flight under `nonce` (delivered, not parked) and
    /// still invisible at `now_ms`.
    pub(crate) fn held(&self, key: &QueueKey, nonce: u64, now_ms: i64, offsets: &[i64]) -> Vec<bool> {
        let inner = lock(&self.inner);
        let state = inner.queues.get(key);
        offsets
            .iter()
            .map(|offset| {
                state
                    .and_then(|q| q.inflight.get(offset))
                    .is_some_and(|i| i.nonce == nonce && i.attempt > 0 && i.visible_at_ms > now_ms)
            })
            .collect()
    }

    /// A copy of the state of `key`, if it has one.
    pub fn get(&self, key: &QueueKey) -> Option<QueueState> {
        lock(&self.inner).queues.get(key).cloned()
    }

    /// How many queue states are loaded here.
    pub(crate) fn len(&self) -> usize {
        lock(&self.inner).queues.len()
    }
}

/// Sends the lines queued for shard `index`, in order and many at a time, until the store is
/// dropped.
async fn write_loop(store: Weak<PopStore>, index: i32, mut queued: mpsc::UnboundedReceiver<Queued>) {
    while let Some(first) = queued.recv().await {
        let mut batch = vec![first];
        while batch.len() < WRITE_BATCH {
            match queued.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let Some(store) = store.upgrade() else { return };
        let Ok(broker) = store.broker() else { return };
        // Lines of a queue dropped since (one of its lines failed) are not sent: what follows a
        // lost change must not be applied without it.
        let (live, stale): (Vec<Queued>, Vec<Queued>) =
            batch.into_iter().partition(|q| store.is_current(&q.id, q.load));
        for q in stale {
            let _ = q.done.send(Err(BrokerError::new(ErrorKind::NotLeader, "the queue's state is being loaded again")));
        }
        if live.is_empty() {
            continue;
        }
        let lines: Vec<StateLine> = live.iter().map(|q| q.line.clone()).collect();
        let written = crate::state_topic::at_leader(&broker, TOPIC, index, |node| {
            let (broker, lines, states) = (broker.clone(), lines.clone(), store.states.clone());
            async move {
                match node {
                    None => states.write_here(index, lines).await,
                    Some(node) => {
                        let request = super::service::WriteRequest { shard: index, lines };
                        super::service::call_write(&broker, node, &request).await
                    }
                }
            }
        })
        .await;
        match written {
            Ok(accepted) if accepted.len() == live.len() => {
                for (q, ok) in live.into_iter().zip(accepted) {
                    if ok {
                        let _ = q.done.send(Ok(()));
                    } else {
                        store.forget(&q.id, q.load);
                        let _ = q.done.send(Err(BrokerError::new(
                            ErrorKind::NotLeader,
                            format!("a newer leader of {}-{} took the queue over", q.id.topic, q.id.partition),
                        )));
                    }
                }
            }
            other => {
                let error = match other {
                    Err(e) => e,
                    Ok(_) => BrokerError::internal("the state shard answered for other lines than it was sent"),
                };
                tracing::warn!(shard = index, error = %error, "invisible-time state: cannot write; the queues load again");
                for q in live {
                    store.forget(&q.id, q.load);
                    let _ = q.done.send(Err(error.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The store over a real broker's state shards in a temporary directory. A failover is
    //! played by a second store over the same shards (a new engine), and by loading a shard
    //! again from its log (a new shard leader).

    use super::*;
    use crate::pop::HandleError;
    use crate::Messaging;

    fn key(partition: i32) -> QueueKey {
        QueueKey::new("g", "t", partition)
    }

    async fn open(dir: &Path) -> (Arc<Broker>, Arc<Messaging>) {
        crate::testing::open_with_state_shards(dir, "t").await
    }

    async fn update<R: std::fmt::Debug, E: std::fmt::Debug>(
        store: &PopStore,
        key: &QueueKey,
        change: impl FnOnce(&mut QueueState) -> Result<R, E>,
    ) -> Result<R, E> {
        let (result, durable) = store.update(key, || QueueState::starting_at(0), change).expect("update");
        durable.wait().await.expect("durable");
        result
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn what_one_engine_wrote_a_new_engine_and_a_new_shard_leader_load() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (broker, messaging) = open(dir.path()).await;
        let store = &messaging.pop;
        store.load(&key(0)).await.expect("load");
        update(store, &key(0), |q| Ok::<_, ()>(q.deliver(0, 10, 1))).await.expect("deliver");
        update(store, &key(0), |q| Ok::<_, ()>(q.deliver(1, 10, 2))).await.expect("deliver");
        update(store, &key(0), |q| q.ack(0, 1)).await.expect("ack");
        let broadcast = QueueKey { consumer: Some("c1".into()), ..key(0) };
        update(store, &broadcast, |q| {
            q.skip_to(9);
            Ok::<_, ()>(())
        })
        .await
        .expect("skip");
        assert_eq!(
            update(store, &key(0), |q| q.ack(3, 1)).await,
            Err(HandleError::NotInFlight),
            "a refused change writes nothing"
        );

        let again = Arc::new(PopStore::new(&broker, &messaging.pop_states, dir.path()));
        again.load(&key(0)).await.expect("load");
        let q0 = again.get(&key(0)).expect("queue 0");
        assert_eq!((q0.inflight.keys().copied().collect::<Vec<_>>(), q0.next), (vec![1], 2));
        assert_eq!(again.get(&broadcast).map(|q| q.next), Some(9), "every consumer's state loads with the queue");

        // A new leader of the shard replays its log.
        let count = again.shard_count(&broker).await.expect("count");
        let index = key(0).id().shard(count);
        let partition = broker.require_partition(TOPIC, index).expect("shard partition");
        let replayed = super::super::shard::tests::load(&broker, index, partition);
        assert_eq!(replayed.get(&key(0).id()).map(|q| q.states[&None].clone()), Some(q0));
        broker.begin_shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_mover_of_a_dead_letter_is_refused_and_the_first_keeps_its_claim() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (broker, messaging) = open(dir.path()).await;
        // On a thread of its own: a claim that hangs (as a refused one once did, on its own
        // lock) fails the test instead of hanging it.
        let (done, finished) = std::sync::mpsc::channel();
        let store = messaging.clone();
        std::thread::spawn(move || {
            let store = &store.pop;
            let first = store.claim_dead_letter(&key(0), 7);
            let second = store.claim_dead_letter(&key(0), 7);
            let other = store.claim_dead_letter(&key(0), 8).is_some();
            let third = store.claim_dead_letter(&key(0), 7).is_some();
            drop(first);
            let after = store.claim_dead_letter(&key(0), 7).is_some();
            let _ = done.send((second.is_none(), other, third, after));
        });
        let outcome = finished.recv_timeout(std::time::Duration::from_secs(10)).expect("a claim hung");
        assert_eq!(outcome, (true, true, false, true), "(second refused, other offset, third while held, after)");
        broker.begin_shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_new_state_is_written_even_when_the_update_leaves_it_as_started() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (broker, messaging) = open(dir.path()).await;
        messaging.pop.load(&key(0)).await.expect("load");
        let (_, durable) =
            messaging.pop.update(&key(0), || QueueState::starting_at(42), |_| Ok::<_, ()>(())).expect("update");
        durable.wait().await.expect("durable");
        let again = Arc::new(PopStore::new(&broker, &messaging.pop_states, dir.path()));
        again.load(&key(0)).await.expect("load");
        assert_eq!(again.get(&key(0)).map(|q| (q.done_below, q.next)), Some((42, 42)));
        broker.begin_shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deposed_engine_is_fenced_and_drops_its_states() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (broker, messaging) = open(dir.path()).await;
        let store = &messaging.pop;
        store.load(&key(0)).await.expect("load");
        update(store, &key(0), |q| Ok::<_, ()>(q.deliver(0, 10, 1))).await.expect("deliver");
        // A later leader of the partition took the queue over.
        let count = store.shard_count(&broker).await.expect("count");
        let epoch = broker.require_partition("t", 0).expect("partition").leader_epoch();
        messaging.pop_states.take_over_here(key(0).id().shard(count), &key(0).id(), epoch + 1).await.expect("took");
        let (acked, durable) = store.update(&key(0), || QueueState::starting_at(0), |q| q.ack(0, 1)).expect("update");
        assert!(acked.is_ok(), "in memory, the ack is made");
        assert!(durable.wait().await.is_err(), "the write of a deposed engine is refused");
        assert!(!store.contains(&key(0)), "and its states are dropped");
        assert!(store.update(&key(0), || QueueState::starting_at(0), |q| q.ack(0, 1)).is_err(), "until loaded");
        broker.begin_shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reset_moves_every_consumers_state_of_the_queue() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (broker, messaging) = open(dir.path()).await;
        let store = &messaging.pop;
        let broadcast = QueueKey { consumer: Some("c1".into()), ..key(0) };
        store.load(&key(0)).await.expect("load");
        for k in [key(0), broadcast.clone()] {
            update(store, &k, |q| Ok::<_, ()>(q.deliver(5, 10, 1))).await.expect("deliver");
        }
        assert_eq!(store.reset("g", "t", 0, 2, false).await.expect("reset"), 2, "the group's and c1's");
        for k in [key(0), broadcast] {
            let q = store.get(&k).expect("state");
            assert_eq!((q.done_below, q.next, q.inflight.len(), q.resets), (2, 2, 0, 1), "{k:?}");
        }
        assert_eq!(store.reset("other", "t", 0, 9, false).await.expect("reset"), 0, "no state, none made");
        assert_eq!(store.reset("other", "t", 0, 9, true).await.expect("reset"), 1);
        assert!(store.has_group("other") && !store.has_group("nobody"));
        let again = Arc::new(PopStore::new(&broker, &messaging.pop_states, dir.path()));
        again.load(&key(0)).await.expect("load");
        assert_eq!(again.get(&key(0)).map(|q| (q.done_below, q.next, q.inflight.len())), Some((2, 2, 0)));
        broker.begin_shutdown();
    }

    #[test]
    fn the_local_store_of_an_earlier_version_reads_with_its_torn_last_line_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let snapshot = br#"{"q":{"group":"g","topic":"t","partition":1},"s":{"done_below":3,"next":5,"inflight":{"4":{"visible_at_ms":9,"attempt":2,"nonce":7}}}}"#;
        std::fs::write(dir.path().join("snapshot.jsonl"), [&snapshot[..], b"\n"].concat()).expect("snapshot");
        let journal = concat!(
            r#"{"q":{"group":"g","topic":"t","partition":1},"d":{"done_below":5,"next":6,"set":[[5,{"visible_at_ms":1,"attempt":1,"nonce":8}]],"removed":[4]}}"#,
            "\n",
            r#"{"q":{"group":"g","topic":"t","part"#
        );
        std::fs::write(dir.path().join("journal.jsonl"), journal).expect("journal");
        let queues = crate::pop::migrate::read_legacy(dir.path()).expect("read");
        let q = &queues.0[&key(1).id()].states[&None];
        assert_eq!((q.done_below, q.next, q.inflight.keys().copied().collect::<Vec<_>>()), (5, 6, vec![5]));
    }
}
