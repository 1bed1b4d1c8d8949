//! Transactional messages over the `HalfStore`: a front-end prepares a message (stored
//! invisible, answered with its transaction id) and ends its transaction (committed: appended to
//! its topic; rolled back: gone). A transaction left open is checked with a producer of its
//! topic: the first check comes after the message's own recovery time, else
//! `transaction.check.interval.ms`; then one each interval; after `transaction.check.max`
//! checks the transaction is rolled back and logged. Any producer publishing the topic may
//! answer, so a transaction outlives the producer that began it.
//!
//! Deciding when to check and when to give up is the core's; reaching a producer is a
//! front-end's: it registers a [`TransactionChecker`] (RocketMQ's sends a
//! RecoverOrphanedTransactionCommand over a producer's Telemetry stream, which the producer
//! answers with an EndTransaction).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use weir_storage::records::{self, BatchOptions, Record};

use crate::half::{Decision, HalfStore, Pending};
use weir_broker::message::Message;
use weir_broker::{Broker, BrokerError, ErrorKind};

use crate::Messaging;

/// How often open transactions are looked at.
pub(crate) const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Most transactions checked in one sweep; the rest wait for the next.
const CHECKS_PER_SWEEP_MAX: usize = 1024;

/// Whether a checker reached a producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// What front-ends call about transactional messages, and the sweep that finishes them.
pub struct TransactionalMessages {
    broker: Arc<Broker>,
    half: Arc<HalfStore>,
    /// Which partition the next committed message goes to, in turn.
    commit_turn: AtomicU32,
    /// Who can reach producers, asked in order until one did.
    checkers: RwLock<Vec<Arc<dyn TransactionChecker>>>,
}

impl TransactionalMessages {
    /// Starts the sweep over the half messages (`Messaging::half`); it runs every
    /// `SWEEP_INTERVAL` until the broker shuts down, the first time at once (committed
    /// messages a crash left unappended go to their topics now). Call within a tokio runtime.
    pub fn start(messaging: &Arc<Messaging>) -> Arc<TransactionalMessages> {
        let broker = &messaging.broker;
        let transactions = Arc::new(TransactionalMessages {
            broker: broker.clone(),
            half: messaging.half.clone(),
            commit_turn: AtomicU32::new(0),
            checkers: RwLock::new(Vec::new()),
        });
        let weak: Weak<TransactionalMessages> = Arc::downgrade(&transactions);
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
        transactions
    }

    /// From now on, open transactions are also checked through `checker`.
    pub fn register_checker(&self, checker: Arc<dyn TransactionChecker>) {
        self.checkers.write().unwrap_or_else(|e| e.into_inner()).push(checker);
    }

    /// Stores `message`, sent to `topic` within a transaction, until its transaction ends; its
    /// producer is first asked about it after `recovery` (else `transaction.check.interval.ms`).
    /// Returns its offset among the half messages and its transaction id, once durable.
    pub async fn prepare(
        &self,
        topic: &str,
        message: Message,
        recovery: Option<Duration>,
    ) -> Result<(i64, String), BrokerError> {
        let broker = &self.broker;
        let now = broker.now_ms();
        let first_check = recovery.unwrap_or(Duration::from_millis(broker.config.transaction_check_interval_ms));
        let check_at = now + first_check.as_millis() as i64;
        let record = message.to_record(now);
        let (half, topic, id) = (self.half.clone(), topic.to_string(), message.id().to_string());
        tokio::task::spawn_blocking(move || half.prepare(&topic, &record, &id, check_at))
            .await
            .map_err(|e| BrokerError::internal(e.to_string()))?
    }

    /// The producer's decision about `transaction_id` (of message `message_id`, when not
    /// empty): commit appends the message to its topic, rollback drops it. The first decision
    /// wins.
    pub async fn end(&self, transaction_id: &str, message_id: &str, commit: bool) -> Result<(), EndError> {
        let decided = {
            let (half, id, message_id) = (self.half.clone(), transaction_id.to_string(), message_id.to_string());
            tokio::task::spawn_blocking(move || half.decide(&id, &message_id, commit))
                .await
                .unwrap_or_else(|e| Err(BrokerError::internal(e.to_string())))
        };
        match decided {
            Ok(Decision::RolledBack) => {
                tracing::debug!(transaction = %transaction_id, "transaction rolled back");
                Ok(())
            }
            Ok(Decision::Commit { offset, topic, record }) => match self.commit_record(&topic, offset, record).await {
                Ok(()) => Ok(()),
                // Decided and kept: the sweep appends it later.
                Err(e) => {
                    self.half.release(offset);
                    Err(EndError::Failed(e))
                }
            },
            Err(e) if e.kind == ErrorKind::InvalidRequest => Err(EndError::NotOpen(e)),
            Err(e) => Err(EndError::Failed(e)),
        }
    }

    /// Appends a committed message to its topic (a partition this broker leads, in turn, else
    /// any), then marks it done.
    async fn commit_record(&self, topic: &str, offset: i64, mut record: Record) -> Result<(), BrokerError> {
        let broker = &self.broker;
        let turn = self.commit_turn.fetch_add(1, Ordering::Relaxed) as usize;
        let Some(partition) = broker.partition_in_turn(topic, turn) else {
            tracing::warn!(topic, "dropping a committed transactional message: its topic no longer exists");
            return self.done(offset).await;
        };
        // Stored when committed, as RocketMQ does: consumers see the commit time.
        record.timestamp = broker.now_ms();
        let batch = records::encode_batch(&[record], &BatchOptions::default())
            .map_err(|e| BrokerError::new(ErrorKind::InvalidRecord, e.to_string()))?;
        broker.append_at_leader(topic, partition, batch).await?;
        self.done(offset).await
    }

    async fn done(&self, offset: i64) -> Result<(), BrokerError> {
        let half = self.half.clone();
        tokio::task::spawn_blocking(move || half.done(offset))
            .await
            .map_err(|e| BrokerError::internal(e.to_string()))?
    }

    /// One round: appends committed messages whose append failed, checks open transactions
    /// with their producers, rolls back those checked too often, trims the store.
    async fn sweep(&self) {
        let half: &HalfStore = &self.half;
        for (offset, pending) in half.claim_committing() {
            let appended = match half.read(offset) {
                Ok(record) => self.commit_record(&pending.topic, offset, record).await,
                Err(e) => Err(e),
            };
            if let Err(e) = appended {
                half.release(offset);
                tracing::warn!(offset, topic = %pending.topic, error = %e, "cannot append a committed transactional message yet");
            }
        }
        self.check_due();
        half.maintain();
    }

    /// Checks the open transactions due for it; rolls back those checked
    /// `transaction.check.max` times already.
    fn check_due(&self) {
        let broker = &self.broker;
        let now = broker.now_ms();
        let interval = broker.config.transaction_check_interval_ms as i64;
        for (offset, pending) in self.half.due_checks(now, CHECKS_PER_SWEEP_MAX) {
            if pending.checks >= broker.config.transaction_check_max {
                if let Ok(true) = self.half.give_up(offset) {
                    tracing::warn!(topic = %pending.topic, message_id = %pending.message_id, transaction = %pending.transaction_id,
                        checks = pending.checks, "rolled back a transaction its producers never decided");
                }
                continue;
            }
            self.ask_producer(offset, &pending);
            // Counted whether or not a producer was there: a transaction nobody answers for ends.
            if let Err(e) = self.half.checked(offset, now + interval) {
                tracing::warn!(offset, error = %e, "cannot record a transaction check");
            }
        }
    }

    /// Asks the registered checkers, in turn, until one reached a producer.
    fn ask_producer(&self, offset: i64, pending: &Pending) {
        let checkers = self.checkers.read().unwrap_or_else(|e| e.into_inner()).clone();
        if checkers.is_empty() {
            tracing::debug!(topic = %pending.topic, "no front-end reaches producers to check a transaction with");
            return;
        }
        let message = match self.half.read(offset) {
            Ok(message) => message,
            Err(e) => {
                tracing::warn!(offset, error = %e, "cannot read a half message back");
                return;
            }
        };
        for checker in checkers {
            if checker.check(pending, &message) == CheckSent::Sent {
                return;
            }
        }
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
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let (broker, messaging) = crate::testing::open_with_topic(settings, "t").await;
        // No sweep task: the test drives the rounds itself.
        let transactions = TransactionalMessages {
            broker: broker.clone(),
            half: messaging.half.clone(),
            commit_turn: AtomicU32::new(0),
            checkers: RwLock::new(Vec::new()),
        };
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
        assert_eq!(messaging.half.pending_count(), 0, "rolled back after transaction.check.max checks");
        let partition = broker.require_partition("t", 0).expect("partition");
        assert_eq!(partition.log.log_end_offset(), 1, "the committed message only");
        broker.begin_shutdown();
    }
}
