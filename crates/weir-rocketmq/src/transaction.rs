//! Transactional messages over the core's [`weir_broker::half`] store: SendMessage of a
//! TRANSACTION message stores it as a half message (invisible) and answers its transaction id;
//! EndTransaction commits it (appended to its topic) or rolls it back. A transaction left open
//! is checked with a producer of its topic: a RecoverOrphanedTransactionCommand on that
//! producer's Telemetry stream, which the producer answers with an EndTransaction
//! (`SOURCE_SERVER_CHECK`). The first check comes after the message's
//! `orphaned_transaction_recovery_duration`, else `transaction.check.interval.ms`; then one each
//! interval; after `transaction.check.max` checks the transaction is rolled back and logged.
//! Any producer publishing the topic may answer, so a transaction outlives the producer that
//! began it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use weir_broker::half::{Decision, Pending};
use weir_broker::message::Message;
use weir_broker::storage::records::{self, BatchOptions, Record};
use weir_broker::storage::sync::lock;
use weir_broker::{Broker, BrokerError, ErrorKind};

use crate::proto::{self, telemetry_command, Code, RecoverOrphanedTransactionCommand, TelemetryCommand};
use crate::status::{self, status};

/// How often open transactions are looked at.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

type TelemetrySender = mpsc::Sender<Result<TelemetryCommand, tonic::Status>>;

/// A producer's open Telemetry stream and the topics it publishes.
struct ProducerStream {
    generation: u64,
    topics: Vec<String>,
    commands: TelemetrySender,
}

/// The producers connected to this broker, by client id: who can be asked about a transaction.
#[derive(Default)]
pub struct Producers {
    streams: Mutex<HashMap<String, ProducerStream>>,
    generations: AtomicU64,
    turn: AtomicU32,
}

impl Producers {
    /// `client` publishes `topics` and listens on `commands`; returns the registration's
    /// generation, for [`Producers::gone`].
    pub fn register(&self, client: &str, topics: Vec<String>, commands: TelemetrySender) -> u64 {
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        lock(&self.streams).insert(client.to_string(), ProducerStream { generation, topics, commands });
        generation
    }

    /// The stream of registration `generation` of `client` ended.
    pub fn gone(&self, client: &str, generation: u64) {
        let mut streams = lock(&self.streams);
        if streams.get(client).is_some_and(|s| s.generation == generation) {
            streams.remove(client);
        }
    }

    /// A producer of `topic`, in turn among them.
    fn one_for(&self, topic: &str) -> Option<(String, TelemetrySender)> {
        let streams = lock(&self.streams);
        let mut candidates: Vec<(&String, &ProducerStream)> =
            streams.iter().filter(|(_, s)| s.topics.iter().any(|t| t == topic)).collect();
        if candidates.is_empty() {
            return None;
        }
        candidates.sort_by(|a, b| a.0.cmp(b.0));
        let turn = self.turn.fetch_add(1, Ordering::Relaxed) as usize % candidates.len();
        let (client, stream) = candidates[turn];
        Some((client.clone(), stream.commands.clone()))
    }
}

/// Stores a transactional message; the entry's offset is its half-message offset.
pub async fn prepare(
    broker: &Arc<Broker>,
    topic: &str,
    message: Message,
    recovery: Option<Duration>,
) -> Result<(i64, String), BrokerError> {
    let now = broker.now_ms();
    let first_check = recovery.unwrap_or(Duration::from_millis(broker.config.transaction_check_interval_ms));
    let check_at = now + first_check.as_millis() as i64;
    let record = message.to_record(now);
    let (broker, topic, id) = (broker.clone(), topic.to_string(), message.id().to_string());
    tokio::task::spawn_blocking(move || broker.half.prepare(&topic, &record, &id, check_at))
        .await
        .map_err(|e| BrokerError::internal(e.to_string()))?
}

/// EndTransaction.
pub async fn end(broker: &Arc<Broker>, request: &proto::EndTransactionRequest, turn: &AtomicU32) -> proto::Status {
    let commit = match proto::TransactionResolution::try_from(request.resolution) {
        Ok(proto::TransactionResolution::Commit) => true,
        Ok(proto::TransactionResolution::Rollback) => false,
        _ => return status(Code::BadRequest, "the resolution is neither COMMIT nor ROLLBACK"),
    };
    if request.transaction_id.is_empty() {
        return status(Code::InvalidTransactionId, "the request names no transaction id");
    }
    let decided = {
        let (broker, id, message_id) = (broker.clone(), request.transaction_id.clone(), request.message_id.clone());
        tokio::task::spawn_blocking(move || broker.half.decide(&id, &message_id, commit))
            .await
            .unwrap_or_else(|e| Err(BrokerError::internal(e.to_string())))
    };
    match decided {
        Ok(Decision::RolledBack) => {
            tracing::debug!(transaction = %request.transaction_id, "transaction rolled back");
            status::ok()
        }
        Ok(Decision::Commit { offset, topic, record }) => {
            match commit_record(broker, &topic, offset, record, turn).await {
                Ok(()) => status::ok(),
                // Decided and kept: the sweep appends it later.
                Err(e) => {
                    broker.half.release(offset);
                    status::of_error(&e)
                }
            }
        }
        Err(e) if e.kind == ErrorKind::InvalidRequest => status(Code::InvalidTransactionId, e.message),
        Err(e) => status::of_error(&e),
    }
}

/// Appends a committed message to its topic (a partition this broker leads, in turn, else any),
/// then marks it done.
async fn commit_record(
    broker: &Arc<Broker>,
    topic: &str,
    offset: i64,
    mut record: Record,
    turn: &AtomicU32,
) -> Result<(), BrokerError> {
    let Some(partition) = broker.partition_in_turn(topic, turn.fetch_add(1, Ordering::Relaxed) as usize) else {
        tracing::warn!(topic, "dropping a committed transactional message: its topic no longer exists");
        return done(broker, offset).await;
    };
    // Stored when committed, as RocketMQ does: consumers see the commit time.
    record.timestamp = broker.now_ms();
    let batch = records::encode_batch(&[record], &BatchOptions::default())
        .map_err(|e| BrokerError::new(ErrorKind::InvalidRecord, e.to_string()))?;
    broker.append_at_leader(topic, partition, batch).await?;
    done(broker, offset).await
}

async fn done(broker: &Arc<Broker>, offset: i64) -> Result<(), BrokerError> {
    let broker = broker.clone();
    tokio::task::spawn_blocking(move || broker.half.done(offset))
        .await
        .map_err(|e| BrokerError::internal(e.to_string()))?
}

/// The message a check shows the producer.
fn check_command(broker: &Broker, offset: i64, pending: &Pending) -> Result<TelemetryCommand, BrokerError> {
    let record = broker.half.read(offset)?;
    let message = Message::from_record(&pending.topic, -1, &record);
    let body = message.body.to_vec();
    let system = proto::SystemProperties {
        tag: message.tag.clone(),
        keys: message.keys.clone(),
        message_id: pending.message_id.clone(),
        body_digest: Some(proto::Digest {
            r#type: proto::DigestType::Crc32 as i32,
            checksum: format!("{:08X}", crc32fast::hash(&body)),
        }),
        // The Python client drops a command whose message has no encoding.
        body_encoding: proto::Encoding::Identity as i32,
        message_type: proto::MessageType::Transaction as i32,
        born_timestamp: Some(crate::receive::timestamp(message.born_timestamp_ms.unwrap_or(record.timestamp))),
        born_host: message.born_host.clone().unwrap_or_default(),
        store_timestamp: Some(crate::receive::timestamp(record.timestamp)),
        ..Default::default()
    };
    Ok(TelemetryCommand {
        status: Some(status::ok()),
        command: Some(telemetry_command::Command::RecoverOrphanedTransactionCommand(
            RecoverOrphanedTransactionCommand {
                message: Some(proto::Message {
                    topic: Some(proto::Resource { resource_namespace: String::new(), name: pending.topic.clone() }),
                    user_properties: message.properties.iter().cloned().collect(),
                    system_properties: Some(system),
                    body,
                }),
                transaction_id: pending.transaction_id.clone(),
            },
        )),
    })
}

/// Every second until the broker shuts down: appends committed messages whose append failed,
/// checks open transactions with their producers, rolls back those checked too often.
pub fn start(broker: &Arc<Broker>, producers: &Arc<Producers>) {
    let (broker, producers) = (broker.clone(), producers.clone());
    tokio::spawn(async move {
        let mut shutdown = broker.shutdown_signal();
        let turn = AtomicU32::new(0);
        loop {
            for (offset, pending) in broker.half.claim_committing() {
                let appended = match broker.half.read(offset) {
                    Ok(record) => commit_record(&broker, &pending.topic, offset, record, &turn).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = appended {
                    broker.half.release(offset);
                    tracing::warn!(offset, topic = %pending.topic, error = %e, "cannot append a committed transactional message yet");
                }
            }
            check(&broker, &producers).await;
            broker.half.maintain();
            tokio::select! {
                _ = tokio::time::sleep(SWEEP_INTERVAL) => {}
                _ = shutdown.wait_for(|down| *down) => return,
            }
        }
    });
}

async fn check(broker: &Arc<Broker>, producers: &Producers) {
    let now = broker.now_ms();
    let interval = broker.config.transaction_check_interval_ms as i64;
    for (offset, pending) in broker.half.due_checks(now, 1024) {
        if pending.checks >= broker.config.transaction_check_max {
            if let Ok(true) = broker.half.give_up(offset) {
                tracing::warn!(topic = %pending.topic, message_id = %pending.message_id, transaction = %pending.transaction_id,
                    checks = pending.checks, "rolled back a transaction its producers never decided");
            }
            continue;
        }
        match producers.one_for(&pending.topic) {
            Some((client, commands)) => match check_command(broker, offset, &pending) {
                Ok(command) => {
                    if commands.try_send(Ok(command)).is_err() {
                        tracing::debug!(client, "a producer's Telemetry stream is full or gone; checking later");
                    }
                }
                Err(e) => tracing::warn!(offset, error = %e, "cannot read a half message back"),
            },
            None => tracing::debug!(topic = %pending.topic, "no producer of the topic to check a transaction with"),
        }
        // Counted whether or not a producer was there: a transaction nobody answers for ends.
        if let Err(e) = broker.half.checked(offset, now + interval) {
            tracing::warn!(offset, error = %e, "cannot record a transaction check");
        }
    }
}
