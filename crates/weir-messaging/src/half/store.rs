//! Transactional messages (RocketMQ's half messages): a message sent within a transaction is
//! kept here, invisible, until its producer commits it (it is appended to its topic, once) or
//! rolls it back (it never is). A transaction left open is checked with a producer, and rolled
//! back after `transaction.check.max` checks.
//!
//! - [`transactions`](super::transactions): [`TransactionalMessages`](super::TransactionalMessages),
//!   what front-ends call (prepare, end), the routing to the broker leading a message's shard,
//!   and the sweep that appends committed messages, checks open transactions and rolls back
//!   those checked too often.
//! - this module: [`HalfShard`], one partition of the replicated internal topic
//!   `__half_messages` that this broker leads: the messages and their states, in memory, from
//!   that partition's log.
//!
//! - **Bodies:** a record of the shard's log each, the message as it will be appended.
//! - **States:** notes in the same log (header [`NOTE`], a JSON [`Line`] as the value): set
//!   (prepared, checked, committing) and done. Loading replays them in log order.
//! - A prepare, a decision and a done are acknowledged once the shard's ISR has them, as durably
//!   as the flush policy promises: the loss of a broker loses no transaction it answered for.
//! - **Commit** notes `committing` first, then appends the message to its topic, then `done`.
//!   A failover in between leaves it `committing`: the new leader appends it (so a committed
//!   message is never lost; it can be appended twice only when the failover falls between its
//!   append and the `done` note).
//! - The log is trimmed below the oldest pending message (its notes all come after it).
//!
//! Asserted in debug builds by `HalfShard::check_invariants` after every change of the state:
//! each message being appended is a pending committed one (else a second append could begin),
//! and every pending message is in the log.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use weir_broker::broker::InternalWrite;
use weir_broker::{Broker, BrokerError, ErrorKind, Partition};
use weir_storage::records::{self, BatchOptions, Header, Record};
use weir_storage::sync::lock;

/// Most half messages pending in one shard; a transactional send beyond gets an error.
pub(crate) const MAX_PENDING: usize = 1_000_000;

/// The header that marks a note of the shard's log (its value: a JSON [`Line`]).
pub(crate) const NOTE: &str = "weir.half.note";

/// One open transaction's message.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Pending {
    pub topic: String,
    pub message_id: String,
    pub transaction_id: String,
    /// How many times the producer was asked.
    pub checks: u32,
    /// When to ask it (next).
    pub(crate) check_at_ms: i64,
    /// Committed by the producer, not yet appended to its topic.
    #[serde(default)]
    pub committing: bool,
}

/// A change of a message's state (the notes of a shard, and the journal lines of the
/// broker-local store of earlier versions).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) enum Line {
    #[serde(rename = "set")]
    Set { offset: i64, pending: Pending },
    #[serde(rename = "done")]
    Done { offset: i64 },
}

/// What EndTransaction decided.
#[derive(Debug)]
pub enum Decision {
    /// Rolled back: the message is gone.
    RolledBack,
    /// Committed: append `record` to `topic`, then call `HalfShard::done` with `offset`.
    Commit { offset: i64, topic: String, record: Record },
}

/// One shard of the half messages, loaded on the broker leading its partition.
pub struct HalfShard {
    pub(crate) index: i32,
    partition: Arc<Partition>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    pending: BTreeMap<i64, Pending>,
    /// Committed messages someone is appending right now (an EndTransaction, or the sweep):
    /// no one else may, or the message would be in its topic twice. In memory only: after a
    /// failover nobody is.
    appending: HashSet<i64>,
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    hasher.finish()
}

/// The transaction id of the half message at `offset` of shard `shard`: `H<shard>.`, then the
/// offset and a random part (16 hex digits each), so an id is not guessed from another.
fn transaction_id(shard: i32, offset: i64) -> String {
    format!("H{shard}.{:016X}{:016X}", offset as u64, rand_u64())
}

/// The shard and offset a transaction id names (`None` for one Weir did not make).
pub(crate) fn parse_transaction_id(transaction_id: &str) -> Option<(i32, i64)> {
    let (shard, rest) = transaction_id.strip_prefix('H')?.split_once('.')?;
    let shard = shard.parse::<i32>().ok().filter(|s| *s >= 0)?;
    if rest.len() != 32 || !rest.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let offset = u64::from_str_radix(&rest[..16], 16).ok().map(|o| o as i64).filter(|o| *o >= 0)?;
    Some((shard, offset))
}

/// A note record of `line`.
fn note(line: &Line) -> Result<BytesMut, BrokerError> {
    let value = serde_json::to_vec(line).map_err(|e| BrokerError::internal(e.to_string()))?;
    let mut record = Record::new(0, None, Some(Bytes::from(value)));
    record.headers.push(Header::new(NOTE, Some(Bytes::from_static(b"1"))));
    records::encode_batch(&[record], &BatchOptions::default()).map_err(|e| BrokerError::internal(e.to_string()))
}

/// Replays a shard's records (in offset order) into what is pending. A body is pending once a
/// set note names it; a done note ends it.
pub(crate) fn replay(records: impl IntoIterator<Item = Record>) -> BTreeMap<i64, Pending> {
    let mut pending = BTreeMap::new();
    for record in records {
        if !record.headers.iter().any(|h| h.name == NOTE) {
            continue;
        }
        match record.value.as_deref().map(serde_json::from_slice::<Line>) {
            Some(Ok(Line::Set { offset, pending: p })) => {
                pending.insert(offset, p);
            }
            Some(Ok(Line::Done { offset })) => {
                pending.remove(&offset);
            }
            _ => tracing::warn!(offset = record.offset, "half messages: skipping a note that does not parse"),
        }
    }
    pending
}

/// Loads shard `index` from its partition's log. Blocking.
pub(crate) fn load(broker: &Broker, index: i32, partition: Arc<Partition>) -> Result<HalfShard, BrokerError> {
    let all = crate::state_topic::read_log(broker, &partition)?;
    let mut pending = replay(all);
    pending.retain(|offset, _| *offset < partition.log.log_end_offset() && *offset >= partition.log.log_start_offset());
    tracing::info!(shard = index, pending = pending.len(), "half messages: loaded a partition of {}", super::TOPIC);
    let shard = HalfShard { index, partition, inner: Mutex::new(Inner { pending, appending: HashSet::new() }) };
    shard.check_invariants(&lock(&shard.inner));
    Ok(shard)
}

impl HalfShard {
    /// Stores `record`, a message of `topic` sent in a transaction, invisible until decided;
    /// its producer is first asked about it at `check_at_ms`. Returns its offset and
    /// transaction id, and the write that counts once durable. Blocking.
    pub(crate) fn prepare(
        &self,
        broker: &Broker,
        topic: &str,
        record: &Record,
        message_id: &str,
        check_at_ms: i64,
    ) -> Result<(i64, String, InternalWrite), BrokerError> {
        let batch = records::encode_batch(std::slice::from_ref(record), &BatchOptions::default())
            .map_err(|e| BrokerError::new(ErrorKind::InvalidRecord, e.to_string()))?;
        let mut inner = lock(&self.inner);
        if inner.pending.len() >= MAX_PENDING {
            return Err(BrokerError::new(
                ErrorKind::Unavailable,
                format!("{MAX_PENDING} transactional messages are pending in this shard already"),
            ));
        }
        let offset = broker.write_internal(&self.partition, batch)?.info.first_offset;
        let pending = Pending {
            topic: topic.to_string(),
            message_id: message_id.to_string(),
            transaction_id: transaction_id(self.index, offset),
            checks: 0,
            check_at_ms,
            committing: false,
        };
        let id = pending.transaction_id.clone();
        let write = broker.write_internal(&self.partition, note(&Line::Set { offset, pending: pending.clone() })?)?;
        inner.pending.insert(offset, pending);
        self.check_invariants(&inner);
        Ok((offset, id, write))
    }

    /// The producer's decision about the transaction at `offset` named `transaction_id` (of
    /// message `message_id`, when given). The first decision wins: a transaction committed
    /// already (its message maybe still being appended) or rolled back is not open any more. A
    /// commit hands the message to the caller to append, who calls [`HalfShard::done`] after,
    /// or [`HalfShard::release`] if it failed. Returns the decision and the note to wait for.
    /// Blocking.
    pub(crate) fn decide(
        &self,
        broker: &Broker,
        offset: i64,
        transaction_id: &str,
        message_id: &str,
        commit: bool,
    ) -> Result<(Decision, InternalWrite), BrokerError> {
        let unknown = || {
            BrokerError::new(
                ErrorKind::InvalidRequest,
                format!("no open transaction {transaction_id:?} (decided already, or never begun)"),
            )
        };
        let mut inner = lock(&self.inner);
        let pending = inner.pending.get(&offset).filter(|p| p.transaction_id == transaction_id).cloned();
        let Some(mut pending) = pending.filter(|p| !p.committing) else { return Err(unknown()) };
        if !message_id.is_empty() && message_id != pending.message_id {
            return Err(BrokerError::new(
                ErrorKind::InvalidRequest,
                format!("transaction {transaction_id} is of message {}, not {message_id}", pending.message_id),
            ));
        }
        if !commit {
            let write = broker.write_internal(&self.partition, note(&Line::Done { offset })?)?;
            inner.pending.remove(&offset);
            self.check_invariants(&inner);
            return Ok((Decision::RolledBack, write));
        }
        pending.committing = true;
        let write = broker.write_internal(&self.partition, note(&Line::Set { offset, pending: pending.clone() })?)?;
        inner.pending.insert(offset, pending.clone());
        inner.appending.insert(offset);
        self.check_invariants(&inner);
        drop(inner);
        match self.read(offset) {
            Ok(record) => Ok((Decision::Commit { offset, topic: pending.topic, record }, write)),
            Err(e) => {
                self.release(offset);
                Err(e)
            }
        }
    }

    /// The committed message at `offset` is in its topic. Returns the note to wait for.
    /// Blocking.
    pub(crate) fn done(&self, broker: &Broker, offset: i64) -> Result<Option<InternalWrite>, BrokerError> {
        let mut inner = lock(&self.inner);
        let write = if inner.pending.contains_key(&offset) {
            let write = broker.write_internal(&self.partition, note(&Line::Done { offset })?)?;
            inner.pending.remove(&offset);
            Some(write)
        } else {
            None
        };
        inner.appending.remove(&offset);
        self.check_invariants(&inner);
        Ok(write)
    }

    /// The append of the committed message at `offset` failed: the sweep tries it again.
    pub(crate) fn release(&self, offset: i64) {
        let mut inner = lock(&self.inner);
        inner.appending.remove(&offset);
        self.check_invariants(&inner);
    }

    /// Open transactions due for a check at `now_ms` (not committing), oldest first.
    pub(crate) fn due_checks(&self, now_ms: i64, limit: usize) -> Vec<(i64, Pending)> {
        lock(&self.inner)
            .pending
            .iter()
            .filter(|(_, p)| !p.committing && p.check_at_ms <= now_ms)
            .take(limit)
            .map(|(o, p)| (*o, p.clone()))
            .collect()
    }

    /// Committed transactions whose message is not in its topic yet and that nobody is
    /// appending: the caller now is (then [`HalfShard::done`] or [`HalfShard::release`]).
    pub(crate) fn claim_committing(&self) -> Vec<(i64, Pending)> {
        let mut inner = lock(&self.inner);
        let claimed: Vec<(i64, Pending)> = inner
            .pending
            .iter()
            .filter(|(offset, p)| p.committing && !inner.appending.contains(offset))
            .map(|(o, p)| (*o, p.clone()))
            .collect();
        inner.appending.extend(claimed.iter().map(|(offset, _)| *offset));
        self.check_invariants(&inner);
        claimed
    }

    /// The producer was asked about `offset` once more; the next check is at `next_check_ms`.
    /// Not waited for: a note lost in a failover only brings one more check. Blocking.
    pub(crate) fn checked(&self, broker: &Broker, offset: i64, next_check_ms: i64) -> Result<(), BrokerError> {
        let mut inner = lock(&self.inner);
        let Some(mut pending) = inner.pending.get(&offset).cloned() else { return Ok(()) };
        pending.checks += 1;
        pending.check_at_ms = next_check_ms;
        let _ = broker.write_internal(&self.partition, note(&Line::Set { offset, pending: pending.clone() })?)?;
        inner.pending.insert(offset, pending);
        self.check_invariants(&inner);
        Ok(())
    }

    /// Rolls back `offset` without its producer (checked too often). Returns whether it was
    /// open. Blocking.
    pub(crate) fn give_up(&self, broker: &Broker, offset: i64) -> Result<bool, BrokerError> {
        let mut inner = lock(&self.inner);
        if inner.pending.get(&offset).is_none_or(|p| p.committing) {
            return Ok(false);
        }
        let _ = broker.write_internal(&self.partition, note(&Line::Done { offset })?)?;
        inner.pending.remove(&offset);
        self.check_invariants(&inner);
        Ok(true)
    }

    /// How many transactions are open.
    pub(crate) fn pending_count(&self) -> usize {
        lock(&self.inner).pending.len()
    }

    /// The stored message at `offset`. Blocking.
    pub(crate) fn read(&self, offset: i64) -> Result<Record, BrokerError> {
        let log = &self.partition.log;
        let missing = || BrokerError::new(ErrorKind::Corrupt, format!("half message {offset} is not in the log"));
        let read = log.read(offset, 1, log.log_end_offset()).map_err(BrokerError::from)?;
        let slice = read.slice.ok_or_else(missing)?;
        let bytes = slice.read_to_vec().map_err(BrokerError::from)?;
        let batches =
            records::decode_batches(&bytes).map_err(|e| BrokerError::new(ErrorKind::Corrupt, e.to_string()))?;
        batches.into_iter().flat_map(|b| b.records).find(|r| r.offset == offset).ok_or_else(missing)
    }

    /// Trims the log below the oldest pending message (its notes come after it). Blocking.
    pub(crate) fn maintain(&self, broker: &Broker) {
        let log = &self.partition.log;
        let committed = log.high_watermark();
        let oldest = lock(&self.inner).pending.keys().next().copied().unwrap_or(committed);
        let target = oldest.min(committed);
        if target > log.log_start_offset() {
            let trimmed = broker
                .delete_records(&self.partition, target)
                .and_then(|_| log.apply_retention().map_err(BrokerError::from));
            if let Err(e) = trimmed {
                tracing::debug!(error = %e, shard = self.index, "half messages: cannot trim the log yet");
            }
        }
    }

    /// Asserts the invariants of the module doc (debug builds only; nothing in release), with
    /// the state's lock held. Cheap: the messages being appended are few, and of the pending
    /// ones only the last is looked at.
    fn check_invariants(&self, inner: &Inner) {
        if !cfg!(debug_assertions) {
            return;
        }
        for offset in &inner.appending {
            assert!(
                inner.pending.get(offset).is_some_and(|p| p.committing),
                "shard {}: half message {offset} is being appended but is not a pending committed one",
                self.index
            );
        }
        if let Some((last, _)) = inner.pending.last_key_value() {
            let log_end = self.partition.log.log_end_offset();
            assert!(
                *last < log_end,
                "shard {}: half message {last} is pending but the log ends at {log_end}",
                self.index
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noted(offset: i64, line: &Line) -> Record {
        let mut record = records::decode_records(&note(line).expect("note")).expect("decode").remove(0);
        record.offset = offset;
        record
    }

    fn pending(id: &str, committing: bool) -> Pending {
        Pending {
            topic: "t".into(),
            message_id: id.into(),
            transaction_id: transaction_id(0, 0),
            checks: 0,
            check_at_ms: 0,
            committing,
        }
    }

    #[test]
    fn a_replay_keeps_the_last_state_of_what_is_not_done() {
        let body = |offset| {
            let mut r = Record::new(0, None, Some(Bytes::from_static(b"m")));
            r.offset = offset;
            r
        };
        let log = vec![
            body(0),
            noted(1, &Line::Set { offset: 0, pending: pending("A", false) }),
            body(2),
            noted(3, &Line::Set { offset: 2, pending: pending("B", false) }),
            noted(4, &Line::Set { offset: 0, pending: pending("A", true) }),
            noted(5, &Line::Done { offset: 2 }),
        ];
        let replayed = replay(log);
        assert_eq!(replayed.keys().copied().collect::<Vec<_>>(), vec![0]);
        assert!(replayed[&0].committing, "the last note of a message wins");
    }

    #[test]
    fn transaction_ids_name_their_shard_and_offset_and_made_up_ones_do_not() {
        let id = transaction_id(7, 1234);
        assert_eq!(parse_transaction_id(&id), Some((7, 1234)));
        for bogus in
            ["", "H", "H7.", "H-1.00000000000004D2AAAAAAAAAAAAAAAA", "7.00000000000004D2AAAAAAAAAAAAAAAA", "H7.XYZ"]
        {
            assert_eq!(parse_transaction_id(bogus), None, "{bogus}");
        }
        // An earlier version's id (32 hex digits, no shard) names nothing now.
        assert_eq!(parse_transaction_id("00000000000004D2AAAAAAAAAAAAAAAA"), None);
    }
}
