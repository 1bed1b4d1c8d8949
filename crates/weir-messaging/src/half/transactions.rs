//! Transactional messages over the shards of `__half_messages` ([`HalfShard`]): a front-end
//! prepares a message (stored invisible in a shard of its topic, in turn, answered with its
//! transaction id, which names the shard) and ends its transaction (committed: appended to its
//! topic; rolled back: gone), on whichever broker: both go to the broker leading the shard
//! (internal RPCs `half.prepare`, `half.end`). A transaction left open is checked with a producer of its
//! topic: the first check comes after the message's own recovery time, else
//! `transaction.check.interval.ms`; then one each interval; after `transaction.check.max`
//! checks the transaction is rolled back and logged. Any producer publishing the topic may
//! answer, so a transaction outlives the producer that began it.
//!
//! Deciding when to check and when to give up is the core's; reaching a producer is a
//! front-end's: it registers a [`TransactionChecker`] (RocketMQ's sends a
//! RecoverOrphanedTransactionCommand over a producer's Telemetry stream, which the producer
//! answers with an EndTransaction). The broker leading a shard asks its own checkers first,
//! then the other brokers' (`half.check`): a producer connected anywhere answers.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use weir_coordinators::shards::{ShardOwner, Shards};
use weir_storage::records::{self, BatchOptions, Record};

use super::store::{self, parse_transaction_id, Decision, HalfShard, Pending};
use super::{service, TOPIC};
use weir_broker::message::Message;
use weir_broker::{Broker, BrokerError, ErrorKind, Partition};

/// How often open transactions are looked at.
pub(crate) const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Most transactions checked in one sweep; the rest wait for the next.
const CHECKS_PER_SWEEP_MAX: usize = 1024;

/// Whether a checker reached a producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CheckSent {
    /// A producer was asked; its answer comes as an end of the transaction.
    Sent,
    /// No producer of the topic could be asked now (none connected, or its stream is full).
    Unsent,
}

/// How the core reaches a producer to ask it about an open transaction; implemented by a
/// front-end that holds producers' connections.
pub trait TransactionChecker: Send + Sync {
    /// Asks one producer of `pending.topic` to end the transaction of `message` (the half
    /// message as stored). Called from the sweep: it must not block.
    fn check(&self, pending: &Pending, message: &Record) -> CheckSent;
}

/// Why ending a transaction failed.
#[derive(Debug)]
pub enum EndError {
    /// No open transaction of that id (and message): decided already, or never begun.
    NotOpen(BrokerError),
    /// The decision could not be made durable, or a committed message not appended yet (the
    /// sweep appends it later).
    Failed(BrokerError),
}

/// What front-ends call about transactional messages, the shards of `__half_messages` this
/// broker leads, and the sweep that finishes them.
pub struct TransactionalMessages {
    broker: Weak<Broker>,
    pub(crate) shards: Shards<Arc<HalfShard>>,
    /// Which partition the next committed message goes to, in turn.
    commit_turn: AtomicU32,
    /// Which shard the next prepared message goes to, in turn.
    prepare_turn: AtomicU32,
    /// Who can reach producers on this broker, asked in order until one did.
    checkers: RwLock<Vec<Arc<dyn TransactionChecker>>>,
}

impl TransactionalMessages {
    pub(crate) fn new(broker: &Arc<Broker>) -> TransactionalMessages {
        TransactionalMessages {
            broker: Arc::downgrade(broker),
            shards: Shards::new(TOPIC),
            commit_turn: AtomicU32::new(0),
            prepare_turn: AtomicU32::new(0),
            checkers: RwLock::new(Vec::new()),
        }
    }

    fn broker(&self) -> Result<Arc<Broker>, BrokerError> {
        self.broker.upgrade().ok_or_else(|| BrokerError::internal("the broker is shutting down"))
    }

    /// Loads the shards this broker leads (now and as leadership moves) and starts the sweep
    /// over them; it runs every `SWEEP_INTERVAL` until the broker shuts down. Call within a
    /// tokio runtime, once.
    pub(crate) fn start(self: &Arc<Self>, broker: &Arc<Broker>) {
        crate::state_topic::start_shards(broker, self);
        let weak: Weak<TransactionalMessages> = Arc::downgrade(self);
        let mut shutdown = broker.shutdown_signal();
        tokio::spawn(async move {
            loop {
                let Some(transactions) = weak.upgrade() else { return };
                transactions.sweep().await;
                drop(transactions);
                tokio::select! {
                    _ = tokio::time::sleep(SWEEP_INTERVAL) => {}
                    _ = shutdown.wait_for(|down| *down) => return,
                }
            }
        });
    }

    /// From now on, open transactions are also checked through `checker`.
    pub fn register_checker(&self, checker: Arc<dyn TransactionChecker>) {
        self.checkers.write().unwrap_or_else(|e| e.into_inner()).push(checker);
    }

    /// How many transactions are open in the shards this broker leads.
    pub(crate) fn pending_count(&self) -> usize {
        self.shards.loaded().values().map(|shard| shard.pending_count()).sum()
    }

    /// Stores `message`, sent to `topic` within a transaction, until its transaction ends; its
    /// producer is first asked about it after `recovery` (else `transaction.check.interval.ms`).
    /// Returns its offset in its shard and its transaction id, once the shard's ISR has it.
    pub async fn prepare(
        &self,
        topic: &str,
        message: Message,
        recovery: Option<Duration>,
    ) -> Result<(i64, String), BrokerError> {
        let broker = self.broker()?;
        let now = broker.now_ms();
        let first_check = recovery.unwrap_or(Duration::from_millis(broker.config.transaction_check_interval_ms));
        let request = service::PrepareRequest {
            shard: 0,
            topic: topic.to_string(),
            message_id: message.id().to_string(),
            check_at_ms: now + first_check.as_millis() as i64,
        };
        self.prepare_record(request, message.to_record(now)).await
    }

    /// Prepares `record` (of `request`'s topic and id) in a shard of its topic, in turn.
    pub(crate) async fn prepare_record(
        &self,
        mut request: service::PrepareRequest,
        record: Record,
    ) -> Result<(i64, String), BrokerError> {
        let broker = self.broker()?;
        let count = crate::state_topic::partitions(&broker, TOPIC).await?;
        let turn = self.prepare_turn.fetch_add(1, Ordering::Relaxed) as i32;
        request.shard = crate::state_topic::shard_of(&request.topic, turn, count);
        crate::state_topic::at_leader(&broker, TOPIC, request.shard, |node| {
            let (request, record, broker) = (request.clone(), record.clone(), broker.clone());
            async move {
                match node {
                    None => self.prepare_here(&request, &record).await,
                    Some(node) => service::call_prepare(&broker, node, &request, &record).await,
                }
            }
        })
        .await
    }

    pub(crate) async fn prepare_here(
        &self,
        request: &service::PrepareRequest,
        record: &Record,
    ) -> Result<(i64, String), BrokerError> {
        let shard = self.shards.get(request.shard)?;
        let broker = self.broker()?;
        let (request, record) = (request.clone(), record.clone());
        let (offset, id, write) = tokio::task::spawn_blocking(move || {
            shard.prepare(&broker, &request.topic, &record, &request.message_id, request.check_at_ms)
        })
        .await
        .map_err(|e| BrokerError::internal(e.to_string()))??;
        write.durable().await?;
        Ok((offset, id))
    }

    /// The producer's decision about `transaction_id` (of message `message_id`, when not
    /// empty): commit appends the message to its topic, rollback drops it. The first decision
    /// wins. Goes to the broker leading the transaction's shard.
    pub async fn end(&self, transaction_id: &str, message_id: &str, commit: bool) -> Result<(), EndError> {
        let Some((shard, _)) = parse_transaction_id(transaction_id) else {
            return Err(EndError::NotOpen(BrokerError::new(
                ErrorKind::InvalidRequest,
                format!("{transaction_id:?} is no transaction id Weir gave (or one given before an upgrade)"),
            )));
        };
        let broker = self.broker().map_err(EndError::Failed)?;
        let request = service::EndRequest {
            transaction_id: transaction_id.to_string(),
            message_id: message_id.to_string(),
            commit,
        };
        let ended = crate::state_topic::at_leader(&broker, TOPIC, shard, |node| {
            let (request, broker) = (request.clone(), broker.clone());
            async move {
                match node {
                    None => self.end_here(&request).await,
                    Some(node) => service::call_end(&broker, node, &request).await,
                }
            }
        })
        .await;
        match ended {
            Ok(None) => Ok(()),
            Ok(Some(not_open)) => Err(EndError::NotOpen(not_open)),
            Err(e) => Err(EndError::Failed(e)),
        }
    }

    /// Ends a transaction of a shard this broker leads: `Ok(None)` when done, `Ok(Some(why))`
    /// when it is not open.
    pub(crate) async fn end_here(&self, request: &service::EndRequest) -> Result<Option<BrokerError>, BrokerError> {
        let (index, offset) = parse_transaction_id(&request.transaction_id)
            .ok_or_else(|| BrokerError::new(ErrorKind::InvalidRequest, "not a transaction id"))?;
        let shard = self.shards.get(index)?;
        let broker = self.broker()?;
        let decided = {
            let (shard, broker, request) = (shard.clone(), broker.clone(), request.clone());
            tokio::task::spawn_blocking(move || {
                shard.decide(&broker, offset, &request.transaction_id, &request.message_id, request.commit)
            })
            .await
            .map_err(|e| BrokerError::internal(e.to_string()))?
        };
        match decided {
            Ok((Decision::RolledBack, write)) => {
                write.durable().await?;
                tracing::debug!(transaction = %request.transaction_id, "transaction rolled back");
                Ok(None)
            }
            Ok((Decision::Commit { offset, topic, record }, write)) => {
                let appended = match write.durable().await {
                    Ok(_) => self.commit_record(&broker, &shard, &topic, offset, record).await,
                    Err(e) => Err(e),
                };
                match appended {
                    Ok(()) => Ok(None),
                    // Decided: the sweep appends it later (the new leader's, after a failover).
                    Err(e) => {
                        shard.release(offset);
                        Err(e)
                    }
                }
            }
            Err(e) if e.kind == ErrorKind::InvalidRequest => Ok(Some(e)),
            Err(e) => Err(e),
        }
    }

    /// Appends a committed message to its topic (a partition this broker leads, in turn, else
    /// any), then marks it done.
    async fn commit_record(
        &self,
        broker: &Arc<Broker>,
        shard: &Arc<HalfShard>,
        topic: &str,
        offset: i64,
        mut record: Record,
    ) -> Result<(), BrokerError> {
        let turn = self.commit_turn.fetch_add(1, Ordering::Relaxed) as usize;
        let Some(partition) = broker.partition_in_turn(topic, turn) else {
            tracing::warn!(topic, "dropping a committed transactional message: its topic no longer exists");
            return Self::done(broker, shard, offset).await;
        };
        // Stored when committed, as RocketMQ does: consumers see the commit time.
        record.timestamp = broker.now_ms();
        let batch = records::encode_batch(&[record], &BatchOptions::default())
            .map_err(|e| BrokerError::new(ErrorKind::InvalidRecord, e.to_string()))?;
        broker.append_at_leader(topic, partition, batch).await?;
        Self::done(broker, shard, offset).await
    }

    async fn done(broker: &Arc<Broker>, shard: &Arc<HalfShard>, offset: i64) -> Result<(), BrokerError> {
        let (shard, broker) = (shard.clone(), broker.clone());
        let write = tokio::task::spawn_blocking(move || shard.done(&broker, offset))
            .await
            .map_err(|e| BrokerError::internal(e.to_string()))??;
        if let Some(write) = write {
            write.durable().await?;
        }
        Ok(())
    }

    /// One round over the shards this broker leads: appends committed messages whose append
    /// failed, checks open transactions with producers, rolls back those checked too often,
    /// trims the logs.
    async fn sweep(&self) {
        let Ok(broker) = self.broker() else { return };
        for shard in self.shards.loaded().into_values() {
            for (offset, pending) in shard.claim_committing() {
                let appended = match shard.read(offset) {
                    Ok(record) => self.commit_record(&broker, &shard, &pending.topic, offset, record).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = appended {
                    shard.release(offset);
                    tracing::warn!(offset, topic = %pending.topic, error = %e, "cannot append a committed transactional message yet");
                }
            }
            self.check_due(&broker, &shard).await;
            let (shard, broker) = (shard.clone(), broker.clone());
            let _ = tokio::task::spawn_blocking(move || shard.maintain(&broker)).await;
        }
    }

    /// Checks the open transactions of `shard` due for it; rolls back those checked
    /// `transaction.check.max` times already.
    async fn check_due(&self, broker: &Arc<Broker>, shard: &Arc<HalfShard>) {
        let now = broker.now_ms();
        let interval = broker.config.transaction_check_interval_ms as i64;
        for (offset, pending) in shard.due_checks(now, CHECKS_PER_SWEEP_MAX) {
            if pending.checks >= broker.config.transaction_check_max {
                if let Ok(true) = shard.give_up(broker, offset) {
                    tracing::warn!(topic = %pending.topic, message_id = %pending.message_id, transaction = %pending.transaction_id,
                        checks = pending.checks, "rolled back a transaction its producers never decided");
                }
                continue;
            }
            self.ask_producer(broker, shard, offset, &pending).await;
            // Counted whether or not a producer was there: a transaction nobody answers for ends.
            if let Err(e) = shard.checked(broker, offset, now + interval) {
                tracing::warn!(offset, error = %e, "cannot record a transaction check");
            }
        }
    }

    /// Asks a producer of the message's topic: through this broker's checkers in turn, then
    /// through the other brokers' (over the internal RPC), until one reached a producer.
    async fn ask_producer(&self, broker: &Arc<Broker>, shard: &HalfShard, offset: i64, pending: &Pending) {
        let message = match shard.read(offset) {
            Ok(message) => message,
            Err(e) => {
                tracing::warn!(offset, error = %e, "cannot read a half message back");
                return;
            }
        };
        if self.check_here(pending, &message) == CheckSent::Sent {
            return;
        }
        for node in broker.live_brokers().into_iter().map(|b| b.id).filter(|id| *id != broker.config.node_id) {
            match service::call_check(broker, node, pending, &message).await {
                Ok(CheckSent::Sent) => return,
                Ok(CheckSent::Unsent) => {}
                Err(e) => {
                    tracing::debug!(node, error = %e, "cannot ask another broker's producers about a transaction")
                }
            }
        }
        tracing::debug!(topic = %pending.topic, "no producer of the topic reached to check a transaction with");
    }

    /// Asks this broker's checkers, in turn, until one reached a producer.
    pub(crate) fn check_here(&self, pending: &Pending, message: &Record) -> CheckSent {
        let checkers = self.checkers.read().unwrap_or_else(|e| e.into_inner()).clone();
        for checker in checkers {
            if checker.check(pending, message) == CheckSent::Sent {
                return CheckSent::Sent;
            }
        }
        CheckSent::Unsent
    }
}

impl ShardOwner for TransactionalMessages {
    type Shard = Arc<HalfShard>;

    fn shards(&self) -> &Shards<Arc<HalfShard>> {
        &self.shards
    }

    fn load_shard(&self, index: i32, partition: Arc<Partition>) -> Result<Arc<HalfShard>, BrokerError> {
        let broker = self.broker()?;
        Ok(Arc::new(store::load(&broker, index, partition)?))
    }

    fn unload_shard(&self, index: i32) {
        tracing::info!(shard = index, "half messages: no longer leads this partition of {TOPIC}");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use super::*;

    /// A checker that records what it was asked and answers as told.
    struct Recorder {
        asked: Mutex<Vec<String>>,
        sends: bool,
    }

    impl TransactionChecker for Recorder {
        fn check(&self, pending: &Pending, message: &Record) -> CheckSent {
            assert_eq!(message.value.as_deref(), Some(&b"body"[..]), "the half message as stored");
            self.asked.lock().unwrap_or_else(|e| e.into_inner()).push(pending.transaction_id.clone());
            if self.sends {
                CheckSent::Sent
            } else {
                CheckSent::Unsent
            }
        }
    }

    fn message() -> Message {
        Message { body: bytes::Bytes::from_static(b"body"), ..Message::default() }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_open_transaction_is_checked_until_the_limit_then_rolled_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let settings: BTreeMap<String, String> = [
            ("log.dirs", dir.path().display().to_string()),
            ("transaction.check.interval.ms", "100".to_string()),
            ("transaction.check.max", "2".to_string()),
            ("messaging.state.topic.num.partitions", "2".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let (broker, _messaging) = crate::testing::open_with_topic(settings, "t").await;
        // No sweep task: the test drives the rounds itself.
        let transactions = Arc::new(TransactionalMessages::new(&broker));
        crate::state_topic::partitions(&broker, TOPIC).await.expect("the half messages' topic");
        let owner = transactions.clone();
        let loaded = tokio::task::spawn_blocking({
            let broker = broker.clone();
            move || weir_coordinators::shards::reconcile_blocking(&broker, &*owner)
        });
        assert!(loaded.await.expect("join"), "every shard loaded");
        let unsent = Arc::new(Recorder { asked: Mutex::new(Vec::new()), sends: false });
        let sent = Arc::new(Recorder { asked: Mutex::new(Vec::new()), sends: true });
        let never = Arc::new(Recorder { asked: Mutex::new(Vec::new()), sends: true });
        transactions.register_checker(unsent.clone());
        transactions.register_checker(sent.clone());
        transactions.register_checker(never.clone());

        let (_, open) = transactions.prepare("t", message(), Some(Duration::ZERO)).await.expect("prepared");
        let (_, committed) =
            transactions.prepare("t", message(), Some(Duration::from_secs(3600))).await.expect("prepared");
        transactions.end(&committed, "", true).await.expect("committed");
        assert!(matches!(transactions.end(&committed, "", false).await, Err(EndError::NotOpen(_))), "decided already");
        assert!(matches!(transactions.end("nonsense", "", true).await, Err(EndError::NotOpen(_))));

        // A round each check interval: two checks, then the rollback.
        for _ in 0..3 {
            transactions.sweep().await;
            tokio::time::sleep(Duration::from_millis(110)).await;
        }
        let asked = |r: &Recorder| r.asked.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(asked(&unsent), [open.clone(), open.clone()], "asked at each of the two checks");
        assert_eq!(asked(&sent), [open.clone(), open.clone()], "the next checker when one could not send");
        assert!(asked(&never).is_empty(), "no checker after one that sent");
        assert_eq!(transactions.pending_count(), 0, "rolled back after transaction.check.max checks");
        let partition = broker.require_partition("t", 0).expect("partition");
        assert_eq!(partition.log.log_end_offset(), 1, "the committed message only");
        broker.begin_shutdown();
    }
}
