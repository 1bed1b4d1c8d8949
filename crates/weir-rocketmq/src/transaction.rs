//! Transactional messages, RocketMQ's side of the core's [`weir_messaging::half`]: SendMessage of
//! a TRANSACTION message is prepared there (stored invisible, answered with its transaction id)
//! and EndTransaction ends it. When and how often an open transaction is checked, and when it
//! is rolled back, is the core's; this module is how it reaches a producer ([`Producers`], a
//! [`TransactionChecker`]): a RecoverOrphanedTransactionCommand on the Telemetry stream of a
//! producer of the message's topic, which the producer answers with an EndTransaction
//! (`SOURCE_SERVER_CHECK`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::mpsc;
use weir_broker::message::Message;
use weir_broker::storage::records::Record;
use weir_broker::storage::sync::lock;
use weir_messaging::half::Pending;
use weir_messaging::half::{CheckSent, EndError, TransactionChecker, TransactionalMessages};

use crate::proto::{self, telemetry_command, Code, RecoverOrphanedTransactionCommand, TelemetryCommand};
use crate::status::{self, status};

type TelemetrySender = mpsc::Sender<Result<TelemetryCommand, tonic::Status>>;

/// A producer's open Telemetry stream and the topics it publishes.
struct ProducerStream {
    generation: u64,
    topics: Vec<String>,
    commands: TelemetrySender,
}

/// The producers connected to this broker, by client id: who can be asked about a transaction.
#[derive(Default)]
pub(crate) struct Producers {
    streams: Mutex<HashMap<String, ProducerStream>>,
    generations: AtomicU64,
    turn: AtomicU32,
}

impl Producers {
    /// `client` publishes `topics` and listens on `commands`; returns the registration's
    /// generation, for [`Producers::gone`].
    pub(crate) fn register(&self, client: &str, topics: Vec<String>, commands: TelemetrySender) -> u64 {
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        lock(&self.streams).insert(client.to_string(), ProducerStream { generation, topics, commands });
        generation
    }

    /// The stream of registration `generation` of `client` ended.
    pub(crate) fn gone(&self, client: &str, generation: u64) {
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

impl TransactionChecker for Producers {
    fn check(&self, pending: &Pending, message: &Record) -> CheckSent {
        let Some((client, commands)) = self.one_for(&pending.topic) else {
            tracing::debug!(topic = %pending.topic, "no producer of the topic to check a transaction with");
            return CheckSent::Unsent;
        };
        if commands.try_send(Ok(check_command(pending, message))).is_err() {
            tracing::debug!(client, "a producer's Telemetry stream is full or gone; checking later");
            return CheckSent::Unsent;
        }
        CheckSent::Sent
    }
}

/// EndTransaction.
pub(crate) async fn end(transactions: &TransactionalMessages, request: &proto::EndTransactionRequest) -> proto::Status {
    let commit = match proto::TransactionResolution::try_from(request.resolution) {
        Ok(proto::TransactionResolution::Commit) => true,
        Ok(proto::TransactionResolution::Rollback) => false,
        _ => return status(Code::BadRequest, "the resolution is neither COMMIT nor ROLLBACK"),
    };
    if request.transaction_id.is_empty() {
        return status(Code::InvalidTransactionId, "the request names no transaction id");
    }
    match transactions.end(&request.transaction_id, &request.message_id, commit).await {
        Ok(()) => status::ok(),
        Err(EndError::NotOpen(e)) => status(Code::InvalidTransactionId, e.message),
        Err(EndError::Failed(e)) => status::of_error(&e),
    }
}

/// The command that shows a producer the half message `record` of `pending`.
fn check_command(pending: &Pending, record: &Record) -> TelemetryCommand {
    let message = Message::from_record(&pending.topic, -1, record);
    let body = message.body.clone();
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
    TelemetryCommand {
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
    }
}
