//! The invisible-time engine: what a front-end calls to consume by invisible time (receive,
//! ack, change of invisible time, giving up on a message), and the tasks that keep the state
//! moving without a call: the dead-letter sweep (`super::dead_letter`), the renewer of held
//! messages ([`super::renew`]) and the progress mirror ([`super::progress`]).
//!
//! A front-end names a delivery by (queue, offset, nonce) and presents it to its clients as it
//! likes (RocketMQ's receipt handle); it keeps no state of its own.

use std::sync::Arc;
use std::time::Duration;

use super::receive::{self, Delivery, ReceiveRequest, ReceiveTurns, Received};
use super::renew::Renewals;
use crate::pop::{HandleError, QueueKey, QueueState};
use weir_broker::BrokerError;
use weir_coordinators::group::GroupCoordinator;

use crate::Messaging;

/// A refused change of a delivery (`Err(HandleError)`), inside the result of the I/O that made
/// it durable.
pub type HandleResult<T> = Result<Result<T, HandleError>, BrokerError>;

pub struct PopEngine {
    pub(super) messaging: Arc<Messaging>,
    turns: ReceiveTurns,
    pub(super) renewals: Arc<Renewals>,
}

impl PopEngine {
    /// The engine over the queue states (`Messaging::pop`), with its tasks started; they end
    /// when the broker shuts down. Call within a tokio runtime.
    pub fn start(messaging: &Arc<Messaging>, groups: &Arc<GroupCoordinator>) -> Arc<PopEngine> {
        let renewals = Arc::new(Renewals::default());
        renewals.start(messaging, groups);
        super::progress::start(messaging, groups);
        super::dead_letter::start_sweep(messaging);
        super::adopt::start(messaging);
        Arc::new(PopEngine { messaging: messaging.clone(), turns: ReceiveTurns::default(), renewals })
    }

    /// A receive with long polling (see [`super::receive`]): what it hands out, empty when
    /// nothing came before its deadline. Deliveries held for a client are renewed while it
    /// lives.
    pub async fn receive(&self, request: ReceiveRequest) -> Result<Vec<Delivery>, BrokerError> {
        debug_assert!(!request.whole_batches, "a receive of whole batches is receive_batches");
        let received = self.receive_batches(request).await?;
        debug_assert!(received.batches.is_empty(), "whole batches to a receive of records");
        Ok(received.deliveries)
    }

    /// Receives from several queues as one long poll, as a Kafka share fetch does over its
    /// partitions: a pass over each queue in turn (each asking for what is left of
    /// `max_records`, at most its own `batch`), then, until `min_bytes` (at least one byte) have
    /// come or `wait` has passed, another pass whenever any of the partitions grows or one of
    /// the queues' messages becomes visible again. The requests' own `long_polling` is not
    /// used. One result per request, in order: a queue that failed after handing something
    /// out keeps what it handed out (those messages are out, under their invisible time).
    pub async fn receive_many(
        &self,
        requests: &[ReceiveRequest],
        max_records: usize,
        min_bytes: usize,
        wait: Duration,
    ) -> Vec<Result<Received, BrokerError>> {
        let broker = &self.messaging.broker;
        let deadline = tokio::time::Instant::now() + wait;
        let mut shutdown = broker.shutdown_signal();
        let mut results: Vec<Result<Received, BrokerError>> =
            requests.iter().map(|_| Ok(Received::default())).collect();
        let (mut remaining, mut bytes) = (max_records, 0usize);
        loop {
            // Register first: an append between a pass and the wait still wakes this one.
            let waiter = Arc::new(tokio::sync::Notify::new());
            for request in requests {
                request.partition.register_waiter(&waiter);
            }
            for (request, result) in requests.iter().zip(results.iter_mut()) {
                if remaining == 0 {
                    break;
                }
                let Ok(so_far) = result else { continue };
                let pass = ReceiveRequest {
                    batch: remaining.min(request.batch),
                    long_polling: Duration::ZERO,
                    ..request.clone()
                };
                // Another consumer's pass over the same queue is waited for: it may leave
                // messages this one can take, and no append would wake this one for them.
                match self.receive_in_turn(pass, Some(deadline)).await {
                    Ok(got) => {
                        remaining = remaining.saturating_sub(got.len());
                        bytes = bytes.saturating_add(got.bytes());
                        so_far.append(got);
                    }
                    Err(e) if so_far.is_empty() => *result = Err(e),
                    Err(e) => tracing::debug!(error = %e, "a queue failed after handing messages out"),
                }
            }
            let now = tokio::time::Instant::now();
            let failed = results.iter().all(|r| r.is_err());
            if bytes >= min_bytes.max(1) || remaining == 0 || failed || now >= deadline || *shutdown.borrow() {
                return results;
            }
            // Wake at the next expiry too: that message is deliverable again then.
            let next_expiry = requests.iter().filter_map(|r| self.messaging.pop.next_expiry_ms(&r.key)).min();
            let wake = next_expiry.map_or(deadline, |at| {
                let wait_ms = u64::try_from(at - broker.now_ms()).unwrap_or(0).max(1);
                deadline.min(now + Duration::from_millis(wait_ms))
            });
            tokio::select! {
                _ = waiter.notified() => {}
                _ = tokio::time::sleep_until(wake) => {}
                _ = shutdown.wait_for(|down| *down) => return results,
            }
        }
    }

    /// [`PopEngine::receive`], with new messages handed out as whole stored batches when the
    /// request asks for [`ReceiveRequest::whole_batches`].
    pub async fn receive_batches(&self, request: ReceiveRequest) -> Result<Received, BrokerError> {
        self.receive_in_turn(request, None).await
    }

    async fn receive_in_turn(
        &self,
        request: ReceiveRequest,
        turn_deadline: Option<tokio::time::Instant>,
    ) -> Result<Received, BrokerError> {
        let (key, slice, hold_for) = (request.key.clone(), request.invisible, request.hold_for.clone());
        let received = receive::receive(&self.messaging, &self.turns, request, turn_deadline).await?;
        if let Some(client) = hold_for {
            let now = self.messaging.broker.now_ms();
            for (offset, nonce) in received.offsets() {
                self.renewals.hold(&key, offset, nonce, &client, slice, now);
            }
        }
        Ok(received)
    }

    /// Whether this broker hosts the partition of `key` (a handle naming another is none of
    /// its deliveries).
    fn hosts(&self, key: &QueueKey) -> bool {
        self.messaging.broker.partition(&key.topic, key.partition).is_some()
    }

    /// The delivery `nonce` of `offset` in `key` is done with.
    pub async fn ack(&self, key: &QueueKey, offset: i64, nonce: u64) -> HandleResult<()> {
        let mut results = self.ack_many(&[(key.clone(), offset, nonce)]).await;
        results.pop().unwrap_or_else(|| Err(BrokerError::internal("no ack result")))
    }

    /// Several acks ([`PopEngine::ack`]) made together: their writes go to the state shards as
    /// one. One result per ack, in order.
    pub async fn ack_many<K: std::borrow::Borrow<QueueKey>>(&self, acks: &[(K, i64, u64)]) -> Vec<HandleResult<()>> {
        let store = &self.messaging.pop;
        // The acks of each queue, in their order: one update (and one line written) per queue.
        let mut by_queue: Vec<(&QueueKey, Vec<usize>)> = Vec::new();
        for (i, (key, _, _)) in acks.iter().enumerate() {
            let key = key.borrow();
            match by_queue.iter_mut().find(|(k, _)| *k == key) {
                Some((_, indices)) => indices.push(i),
                None => by_queue.push((key, vec![i])),
            }
        }
        let mut results: Vec<Option<HandleResult<()>>> = acks.iter().map(|_| None).collect();
        let mut waiting = Vec::new();
        for (key, indices) in by_queue {
            let refused = |results: &mut Vec<Option<HandleResult<()>>>, outcome: &dyn Fn() -> HandleResult<()>| {
                for &i in &indices {
                    results[i] = Some(outcome());
                }
            };
            if !self.hosts(key) {
                refused(&mut results, &|| Ok(Err(HandleError::NotInFlight)));
                continue;
            }
            if let Err(e) = store.load(key).await {
                refused(&mut results, &|| Err(e.clone()));
                continue;
            }
            // A queue without a state has nothing in flight; asking `update` would make it one.
            if !store.contains(key) {
                refused(&mut results, &|| Ok(Err(HandleError::NotInFlight)));
                continue;
            }
            let updated = store.update(
                key,
                || QueueState::starting_at(0),
                |q| Ok::<_, ()>(indices.iter().map(|&i| q.ack(acks[i].1, acks[i].2)).collect::<Vec<_>>()),
            );
            match updated {
                // (The update never refuses as a whole: each ack has its own result.)
                Ok((acked, durable)) => waiting.push((key, indices, acked.unwrap_or_default(), durable)),
                Err(e) => refused(&mut results, &|| Err(e.clone())),
            }
        }
        for (key, indices, acked, durable) in waiting {
            if let Err(e) = durable.wait().await {
                for i in indices {
                    results[i] = Some(Err(e.clone()));
                }
                continue;
            }
            let mut wake = false;
            let renewed = !self.renewals.is_empty();
            for (i, acked) in indices.into_iter().zip(acked) {
                results[i] = Some(match acked {
                    Ok(inflight) => {
                        if renewed {
                            self.renewals.release(key, acks[i].1);
                        }
                        wake |= inflight.group.is_some();
                        Ok(Ok(()))
                    }
                    Err(refused) => Ok(Err(refused)),
                });
            }
            if wake {
                // The next message of a FIFO group may go out now: wake the receives.
                if let Some(partition) = self.messaging.broker.partition(&key.topic, key.partition) {
                    partition.wake_waiters();
                }
            }
        }
        results.into_iter().map(|r| r.unwrap_or_else(|| Err(BrokerError::internal("no ack result")))).collect()
    }

    /// The delivery `nonce` of `offset` in `key` becomes visible `invisible` from now instead
    /// (a failed consume's back-off: the client decides its time now, so it is renewed no
    /// more). Returns the delivery's new nonce: the old one goes stale.
    pub async fn change_invisible(
        &self,
        key: &QueueKey,
        offset: i64,
        nonce: u64,
        invisible: Duration,
    ) -> HandleResult<u64> {
        debug_assert!(invisible <= receive::MAX_INVISIBLE, "invisible {invisible:?}");
        if !self.hosts(key) {
            return Ok(Err(HandleError::NotInFlight));
        }
        self.messaging.pop.load(key).await?;
        if !self.messaging.pop.contains(key) {
            return Ok(Err(HandleError::NotInFlight));
        }
        let visible_at = self.messaging.broker.now_ms() + invisible.as_millis() as i64;
        let renewed = rand::random::<u64>();
        let (changed, durable) = self.messaging.pop.update(
            key,
            || QueueState::starting_at(0),
            |q| q.change_invisible(offset, nonce, visible_at, renewed),
        )?;
        if let Err(refused) = changed {
            return Ok(Err(refused));
        }
        durable.wait().await?;
        self.renewals.release(key, offset);
        // A receive parked on this queue sleeps until the expiry it last saw: one sooner now
        // (a failed consume's back-off) must wake it, or the message waits out the long poll.
        if let Some(partition) = self.messaging.broker.partition(&key.topic, key.partition) {
            partition.wake_waiters();
        }
        Ok(Ok(renewed))
    }

    /// The consumer gives up on the delivery `nonce` of `offset` in `key` (a push consumer after
    /// its last attempt): the message goes to the group's dead letters and is done in its queue.
    pub async fn give_up(&self, key: &QueueKey, offset: i64, nonce: u64) -> HandleResult<()> {
        let moved = super::dead_letter::give_up(&self.messaging, key, offset, nonce).await?;
        if moved.is_ok() {
            self.renewals.release(key, offset);
        }
        Ok(moved)
    }
}

#[cfg(test)]
mod tests {
    //! The engine on a real broker in a temporary directory, driven as a front-end drives it.
    //! Expiry is simulated by moving a delivery's invisible time into the past, so no test
    //! sleeps for an invisible duration.

    use std::path::Path;

    use super::*;
    use crate::pop::{BatchOffsets, TagFilter};
    use weir_broker::message::Message;
    use weir_broker::{Acks, Broker, Partition};

    const TOPIC: &str = "t";

    async fn open(dir: &Path) -> (Arc<Broker>, Arc<Messaging>) {
        crate::testing::open_with_state_shards(dir, TOPIC).await
    }

    /// The engine without its tasks: the tests drive every step.
    fn engine(messaging: &Arc<Messaging>) -> PopEngine {
        PopEngine { messaging: messaging.clone(), turns: ReceiveTurns::default(), renewals: Arc::default() }
    }

    fn partition(broker: &Broker) -> Arc<Partition> {
        broker.require_partition(TOPIC, 0).expect("partition")
    }

    /// Appends one message per `(tag, message group)`.
    async fn append(broker: &Arc<Broker>, messages: &[(Option<&str>, Option<&str>)]) {
        let records: Vec<_> = messages
            .iter()
            .map(|(tag, group)| {
                let message = Message {
                    body: bytes::Bytes::from_static(b"body"),
                    tag: tag.map(String::from),
                    message_group: group.map(String::from),
                    ..Message::default()
                };
                message.to_record(broker.now_ms())
            })
            .collect();
        let batch = weir_storage::records::encode_batch(&records, &Default::default()).expect("encode");
        broker.append(partition(broker), batch, Acks::All).await.expect("append");
    }

    fn request(broker: &Broker, key: &QueueKey) -> ReceiveRequest {
        ReceiveRequest {
            key: key.clone(),
            partition: partition(broker),
            filter: TagFilter::All,
            batch: 32,
            invisible: Duration::from_secs(60),
            long_polling: Duration::ZERO,
            max_attempts: 16,
            fifo: false,
            start: weir_broker::group_config::ConsumeFrom::FirstOffset,
            hold_for: None,
            nonce: None,
            whole_batches: false,
        }
    }

    /// A receive of `key` with a 30 s long poll, returned once it is parked (registered with
    /// the partition, so that whatever wakes it comes after).
    async fn park_receive(
        engine: &Arc<PopEngine>,
        broker: &Arc<Broker>,
        key: &QueueKey,
    ) -> tokio::task::JoinHandle<Result<Vec<Delivery>, BrokerError>> {
        let (engine, request) =
            (engine.clone(), ReceiveRequest { long_polling: Duration::from_secs(30), ..request(broker, key) });
        let polling = tokio::spawn(async move { engine.receive(request).await });
        while partition(broker).live_waiters() == 0 {
            tokio::task::yield_now().await;
        }
        polling
    }

    fn offsets(deliveries: &[Delivery]) -> Vec<(i64, u32)> {
        deliveries.iter().map(|d| (d.record.offset, d.attempt)).collect()
    }

    /// Makes the delivery of `offset` visible again now, as if its invisible time ran out.
    async fn expire(messaging: &Messaging, key: &QueueKey, offset: i64) {
        let nonce = messaging.pop.get_inflight(key, offset).expect("in flight").nonce;
        let (expired, durable) = messaging
            .pop
            .update(key, || QueueState::starting_at(0), |q| q.change_invisible(offset, nonce, 0, nonce))
            .expect("update");
        assert!(expired.is_ok(), "{expired:?}");
        durable.wait().await.expect("durable");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn given_messages_when_received_each_goes_out_once_until_its_invisible_time_runs_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (broker, messaging) = open(dir.path()).await;
        let engine = engine(&messaging);
        let key = QueueKey::new("g", TOPIC, 0);
        append(&broker, &[(None, None); 3]).await;

        let first = engine.receive(ReceiveRequest { batch: 2, ..request(&broker, &key) }).await.expect("receive");
        assert_eq!(offsets(&first), [(0, 1), (1, 1)]);
        let second = engine.receive(request(&broker, &key)).await.expect("receive");
        assert_eq!(offsets(&second), [(2, 1)], "what is in flight is not handed out again");
        assert!(engine.receive(request(&broker, &key)).await.expect("receive").is_empty());

        expire(&messaging, &key, 0).await;
        let again = engine.receive(request(&broker, &key)).await.expect("receive");
        assert_eq!(offsets(&again), [(0, 2)], "back one attempt higher");
        assert_ne!(again[0].nonce, first[0].nonce, "a new delivery, a new nonce");
        assert_eq!(engine.ack(&key, 0, first[0].nonce).await.expect("io"), Err(HandleError::Stale));
        assert_eq!(engine.ack(&key, 0, again[0].nonce).await.expect("io"), Ok(()));
        assert_eq!(engine.ack(&key, 0, again[0].nonce).await.expect("io"), Err(HandleError::NotInFlight));
        let other = QueueKey::new("nobody", TOPIC, 0);
        assert_eq!(engine.ack(&other, 0, 1).await.expect("io"), Err(HandleError::NotInFlight));
        assert!(!messaging.pop.contains(&other), "a refused ack makes no state");

        let renewed =
            engine.change_invisible(&key, 1, first[1].nonce, Duration::ZERO).await.expect("io").expect("changed");
        assert_eq!(engine.ack(&key, 1, first[1].nonce).await.expect("io"), Err(HandleError::Stale));
        let back = engine.receive(request(&broker, &key)).await.expect("receive");
        assert_eq!(offsets(&back), [(1, 2)], "visible at once after a change to zero");
        assert_ne!(back[0].nonce, renewed);
        broker.begin_shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn given_whole_batches_when_received_each_goes_out_as_stored_and_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (broker, messaging) = open(dir.path()).await;
        let engine = engine(&messaging);
        let key = QueueKey::new("g", TOPIC, 0);
        append(&broker, &[(None, None); 3]).await;
        append(&broker, &[(None, None); 2]).await;
        let whole =
            |batch: usize| ReceiveRequest { batch, whole_batches: true, nonce: Some(7), ..request(&broker, &key) };

        // A record of the first batch went out as a record first: the batch now goes from 1 on.
        let first = engine.receive(ReceiveRequest { batch: 1, ..request(&broker, &key) }).await.expect("receive");
        assert_eq!(offsets(&first), [(0, 1)]);
        let rest = engine.receive_batches(whole(1)).await.expect("receive");
        assert!(rest.deliveries.is_empty());
        assert_eq!(rest.batches.len(), 1, "one batch fills a room of one");
        assert_eq!(rest.batches[0].offsets, BatchOffsets::Range(1, 2));
        assert!(!rest.batches[0].is_whole(), "offset 0 of it went out before");
        let second = engine.receive_batches(whole(1)).await.expect("receive");
        assert_eq!(second.batches.len(), 1);
        assert_eq!(second.batches[0].offsets, BatchOffsets::Range(3, 4), "overfills the room: batches go whole");
        assert!(second.batches[0].is_whole());
        assert_eq!(second.len(), 2);
        assert!(engine.receive_batches(whole(32)).await.expect("receive").is_empty(), "each offset once");

        for offset in 1..=4 {
            let inflight = messaging.pop.get_inflight(&key, offset).expect("in flight");
            assert_eq!((inflight.attempt, inflight.nonce), (1, 7), "offset {offset}");
        }
        expire(&messaging, &key, 3).await;
        let again = engine.receive_batches(whole(32)).await.expect("receive");
        assert!(again.batches.is_empty(), "a redelivery is a record, not a batch");
        assert_eq!(offsets(&again.deliveries), [(3, 2)]);
        assert_eq!(engine.ack(&key, 4, 7).await.expect("io"), Ok(()));
        broker.begin_shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn given_acks_of_one_request_when_made_together_each_gets_its_own_result() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (broker, messaging) = open(dir.path()).await;
        let engine = engine(&messaging);
        let key = QueueKey::new("g", TOPIC, 0);
        append(&broker, &[(None, None); 3]).await;
        let got = engine.receive(request(&broker, &key)).await.expect("receive");
        let nobody = QueueKey::new("nobody", TOPIC, 0);
        let acks = [
            (key.clone(), 0, got[0].nonce),
            (key.clone(), 1, got[1].nonce ^ 1),
            (nobody, 2, got[2].nonce),
            (key.clone(), 2, got[2].nonce),
            (key.clone(), 0, got[0].nonce),
        ];
        let results: Vec<_> = engine.ack_many(&acks).await.into_iter().map(|r| r.expect("io")).collect();
        assert_eq!(
            results,
            [Ok(()), Err(HandleError::Stale), Err(HandleError::NotInFlight), Ok(()), Err(HandleError::NotInFlight)]
        );
        let state = messaging.pop.get(&key).expect("state");
        assert_eq!(state.inflight.keys().copied().collect::<Vec<_>>(), [1], "only the stale one is still out");
        broker.begin_shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn given_a_new_group_from_the_last_offset_when_received_only_later_messages_go_out() {
        use weir_broker::group_config::ConsumeFrom;
        let dir = tempfile::tempdir().expect("tempdir");
        let (broker, messaging) = open(dir.path()).await;
        let engine = engine(&messaging);
        let key = QueueKey::new("late", TOPIC, 0);
        append(&broker, &[(None, None); 3]).await;
        let last = || ReceiveRequest { start: ConsumeFrom::LastOffset, ..request(&broker, &key) };

        assert!(engine.receive(last()).await.expect("receive").is_empty(), "nothing old");
        append(&broker, &[(None, None); 2]).await;
        let got = engine.receive(last()).await.expect("receive");
        assert_eq!(offsets(&got), [(3, 1), (4, 1)], "the position was taken at the first receive");

        // Another group, without the setting, starts at the oldest message.
        let other = QueueKey::new("first", TOPIC, 0);
        let got = engine.receive(request(&broker, &other)).await.expect("receive");
        assert_eq!(got.len(), 5, "the default is the oldest message");
        broker.begin_shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn given_a_tag_filter_when_received_only_its_tags_go_out_and_the_rest_is_done() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (broker, messaging) = open(dir.path()).await;
        let engine = engine(&messaging);
        let key = QueueKey::new("g", TOPIC, 0);
        append(&broker, &[(Some("A"), None), (Some("B"), None), (None, None), (Some("A"), None)]).await;

        let filter = TagFilter::Tags(vec!["A".into()]);
        let deliveries = engine.receive(ReceiveRequest { filter, ..request(&broker, &key) }).await.expect("receive");
        assert_eq!(offsets(&deliveries), [(0, 1), (3, 1)]);
        for delivery in &deliveries {
            assert_eq!(engine.ack(&key, delivery.record.offset, delivery.nonce).await.expect("io"), Ok(()));
        }
        let state = messaging.pop.get(&key).expect("state");
        assert_eq!((state.done_below, state.next), (4, 4), "what the filter skipped is done for the group");
        broker.begin_shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn given_fifo_when_received_a_message_group_goes_out_one_at_a_time_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (broker, messaging) = open(dir.path()).await;
        let engine = engine(&messaging);
        let key = QueueKey::new("g", TOPIC, 0);
        append(&broker, &[(None, Some("g1")), (None, Some("g1")), (None, Some("g2")), (None, Some("g1"))]).await;
        let fifo = || ReceiveRequest { fifo: true, ..request(&broker, &key) };

        let first = engine.receive(fifo()).await.expect("receive");
        assert_eq!(offsets(&first), [(0, 1), (2, 1)], "one message of each group");
        assert!(engine.receive(fifo()).await.expect("receive").is_empty(), "1 and 3 wait behind 0");
        assert_eq!(engine.ack(&key, 0, first[0].nonce).await.expect("io"), Ok(()));
        let second = engine.receive(fifo()).await.expect("receive");
        assert_eq!(offsets(&second), [(1, 1)], "the next of g1, and only it");
        assert_eq!(engine.ack(&key, 1, second[0].nonce).await.expect("io"), Ok(()));
        assert_eq!(offsets(&engine.receive(fifo()).await.expect("receive")), [(3, 1)]);
        broker.begin_shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn given_an_empty_queue_when_a_message_arrives_a_long_poll_returns_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (broker, messaging) = open(dir.path()).await;
        let engine = Arc::new(engine(&messaging));
        let key = QueueKey::new("g", TOPIC, 0);

        let started = tokio::time::Instant::now();
        let waited = ReceiveRequest { long_polling: Duration::from_millis(100), ..request(&broker, &key) };
        assert!(engine.receive(waited).await.expect("receive").is_empty());
        assert!(started.elapsed() >= Duration::from_millis(100), "an empty long poll waits out its time");

        // Then the append wakes it.
        let polling = park_receive(&engine, &broker, &key).await;
        let appended = tokio::time::Instant::now();
        append(&broker, &[(None, None)]).await;
        let deliveries = polling.await.expect("join").expect("receive");
        assert_eq!(offsets(&deliveries), [(0, 1)]);
        assert!(appended.elapsed() < Duration::from_secs(10), "woken by the append, not by the deadline");
        broker.begin_shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn given_a_parked_receive_when_a_delivery_is_made_visible_sooner_it_returns_it_then() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (broker, messaging) = open(dir.path()).await;
        let engine = Arc::new(engine(&messaging));
        let key = QueueKey::new("g", TOPIC, 0);
        append(&broker, &[(None, None)]).await;
        let first = engine.receive(request(&broker, &key)).await.expect("receive");
        assert_eq!(offsets(&first), [(0, 1)]);

        // Parked until the delivery's expiry (60 s) or its deadline (30 s).
        let polling = park_receive(&engine, &broker, &key).await;
        // The consumer failed it: back in 200 ms.
        let changed = tokio::time::Instant::now();
        engine
            .change_invisible(&key, 0, first[0].nonce, Duration::from_millis(200))
            .await
            .expect("io")
            .expect("changed");
        let again = polling.await.expect("join").expect("receive");
        assert_eq!(offsets(&again), [(0, 2)]);
        assert!(changed.elapsed() < Duration::from_secs(10), "woken for the new expiry, not at the deadline");
        broker.begin_shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn given_a_message_out_of_attempts_when_received_it_goes_to_the_dead_letters_instead() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (broker, messaging) = open(dir.path()).await;
        let engine = engine(&messaging);
        let key = QueueKey::new("g", TOPIC, 0);
        append(&broker, &[(None, None), (None, None)]).await;
        let once = || ReceiveRequest { max_attempts: 1, ..request(&broker, &key) };

        let first = engine.receive(once()).await.expect("receive");
        assert_eq!(offsets(&first), [(0, 1), (1, 1)]);
        expire(&messaging, &key, 0).await;
        assert!(engine.receive(once()).await.expect("receive").is_empty(), "not delivered a second time");
        let dead_letters = broker.require_partition(&crate::dead_letter::dead_letter_topic("g"), 0).expect("created");
        assert_eq!(dead_letters.log.log_end_offset(), 1);
        assert_eq!(messaging.pop.get_inflight(&key, 0), None, "done in its queue");

        // A consumer gives up on the other one itself.
        assert_eq!(engine.give_up(&key, 1, first[1].nonce ^ 1).await.expect("io"), Err(HandleError::Stale));
        assert_eq!(engine.give_up(&key, 1, first[1].nonce).await.expect("io"), Ok(()));
        assert_eq!(dead_letters.log.log_end_offset(), 2);
        assert_eq!(messaging.pop.get(&key).map(|q| (q.done_below, q.inflight.len())), Some((2, 0)));
        broker.begin_shutdown();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deliverys_limit_goes_with_it_to_whoever_loads_the_queue_next() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (broker, messaging) = open(dir.path()).await;
        let engine = engine(&messaging);
        let key = QueueKey::new("g", TOPIC, 0);
        append(&broker, &[(None, None)]).await;
        // A share group's receive: its delivery count limit is 1, not the group's RocketMQ 16.
        let first =
            engine.receive(ReceiveRequest { max_attempts: 1, ..request(&broker, &key) }).await.expect("receive");
        assert_eq!(offsets(&first), [(0, 1)]);
        expire(&messaging, &key, 0).await;

        // Another broker takes the queue over (a failover): it never saw the receive, and its
        // sweep's limit for deliveries recorded without one is the RocketMQ setting.
        let next = Arc::new(super::super::store::PopStore::new(&broker, &messaging.pop_states, dir.path()));
        next.load(&key).await.expect("load");
        let due = next.exhausted(&key, broker.now_ms(), 16);
        assert_eq!(due.iter().map(|(o, i)| (*o, i.attempt)).collect::<Vec<_>>(), [(0, 1)], "out of deliveries");
        broker.begin_shutdown();
    }
}
