//! Transactional messages (RocketMQ's half messages): a message sent within a transaction is
//! stored here, invisible, until its producer commits it (it is appended to its topic, once)
//! or rolls it back (it never is). A transaction left open is checked with its producer, and
//! rolled back after `transaction.check.max` checks.
//!
//! - [`transactions`]: [`TransactionalMessages`], what front-ends call (prepare, end) and the
//!   sweep that appends committed messages, checks open transactions and rolls back those
//!   checked too often. How to reach a producer is a front-end's ([`TransactionChecker`]: the
//!   RocketMQ front-end owns the producers' Telemetry streams);
//! - this module: `HalfStore`, the messages and their state on disk.
//!
//! - **Bodies:** `<data>/half/log/`, a log of the storage engine local to this broker: the
//!   message as it will be appended, acknowledged as durably as the broker's `flush.policy`
//!   promises.
//! - **State:** `<data>/half/journal.jsonl`: one JSON line per change (added, checked,
//!   committing, done), written before the call is answered; start-up replays it, ignoring a
//!   torn last line. When it passes `COMPACT_AFTER_BYTES` it is rewritten with only what is
//!   pending (a new file, fsynced, renamed over the old one).
//! - **Commit** writes `committing` first, then appends the message to its topic, then `done`.
//!   A crash in between leaves it `committing`: it is appended again at start-up (or by the
//!   next retry), so a committed message is never lost; it can be appended twice only when the
//!   crash falls between its append and the `done` line.
//! - The log keeps everything from the smallest pending offset.
//!
//! Asserted in debug builds by `HalfStore::check_invariants` after every change of the state:
//! each message being appended is a pending committed one (else a second append could begin),
//! and every pending message is in the log.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions as FileOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use weir_storage::records::{self, BatchOptions, Record};
use weir_storage::sync::lock;
use weir_storage::{Clock, DeletionQueue, FlushPolicy, Log, LogConfig, OpenOptions};

use weir_broker::{BrokerError, ErrorKind};

/// The journal is rewritten once it is this large.
pub(crate) const COMPACT_AFTER_BYTES: u64 = 16 << 20;

/// Most half messages pending on one broker; a transactional send beyond gets an error.
pub(crate) const MAX_PENDING: usize = 1_000_000;

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

#[derive(serde::Serialize, serde::Deserialize)]
enum Line {
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
    /// Committed: append `record` to `topic`, then call `HalfStore::done` with `offset`.
    Commit { offset: i64, topic: String, record: Record },
}

pub(crate) struct HalfStore {
    dir: PathBuf,
    log: Log,
    deletion_queue: Arc<DeletionQueue>,
    inner: Mutex<Inner>,
}

struct Inner {
    pending: BTreeMap<i64, Pending>,
    /// Committed messages someone is appending right now (an EndTransaction, or the sweep):
    /// no one else may, or the message would be in its topic twice. In memory only: after a
    /// restart nobody is.
    appending: std::collections::HashSet<i64>,
    journal: File,
    journal_bytes: u64,
}

fn io_error(what: &str, path: &Path, e: impl std::fmt::Display) -> BrokerError {
    BrokerError::new(ErrorKind::Storage, format!("half messages: cannot {what} {}: {e}", path.display()))
}

/// The transaction id of the half message at `offset`: the offset and a random part, so an id
/// is not guessed from another.
fn transaction_id(offset: i64) -> String {
    format!("{:016X}{:016X}", offset as u64, rand_u64())
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    hasher.finish()
}

/// The offset a transaction id names (`None` for one this store did not make).
pub(crate) fn offset_of(transaction_id: &str) -> Option<i64> {
    if transaction_id.len() != 32 || !transaction_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(&transaction_id[..16], 16).ok().map(|o| o as i64).filter(|o| *o >= 0)
}

impl HalfStore {
    pub const DIR: &'static str = "half";
    const JOURNAL: &'static str = "journal.jsonl";

    /// Opens (or creates) the half messages of `data_dir`. Blocking.
    pub fn open(data_dir: &Path, config: LogConfig, clock: Arc<dyn Clock>) -> Result<HalfStore, BrokerError> {
        let dir = data_dir.join(Self::DIR);
        let config = crate::timer::holding_log_config(config);
        let deletion_queue = Arc::new(DeletionQueue::new());
        let log = Log::open(&dir.join("log"), config, clock, OpenOptions::default(), deletion_queue.clone())
            .map_err(BrokerError::from)?;
        let path = dir.join(Self::JOURNAL);
        let mut pending = BTreeMap::new();
        match File::open(&path) {
            Ok(file) => {
                for line in BufReader::new(file).split(b'\n') {
                    let line = line.map_err(|e| io_error("read", &path, e))?;
                    match serde_json::from_slice::<Line>(&line) {
                        Ok(Line::Set { offset, pending: p }) => {
                            pending.insert(offset, p);
                        }
                        Ok(Line::Done { offset }) => {
                            pending.remove(&offset);
                        }
                        Err(_) if line.is_empty() => {}
                        Err(e) => tracing::warn!(error = %e, "half messages: skipping a torn or corrupt journal line"),
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error("open", &path, e)),
        }
        // What the log lost (a power cut before the page cache was written) cannot be committed.
        pending.retain(|offset, _| *offset < log.log_end_offset());
        let journal =
            FileOptions::new().create(true).append(true).open(&path).map_err(|e| io_error("open", &path, e))?;
        let store = HalfStore {
            dir,
            log,
            deletion_queue,
            inner: Mutex::new(Inner { pending, appending: Default::default(), journal, journal_bytes: 0 }),
        };
        // Start from a compact journal (it also ends a torn last line).
        store.compact(&mut lock(&store.inner))?;
        store.check_invariants(&lock(&store.inner));
        tracing::info!(pending = lock(&store.inner).pending.len(), "half messages opened");
        Ok(store)
    }

    /// Stores `record`, a message of `topic` sent in a transaction, invisible until decided;
    /// its producer is first asked about it at `check_at_ms`. Returns its offset and its
    /// transaction id once durable. Blocking.
    pub fn prepare(
        &self,
        topic: &str,
        record: &Record,
        message_id: &str,
        check_at_ms: i64,
    ) -> Result<(i64, String), BrokerError> {
        let mut batch = records::encode_batch(std::slice::from_ref(record), &BatchOptions::default())
            .map_err(|e| BrokerError::new(ErrorKind::InvalidRecord, e.to_string()))?;
        let (offset, id) = {
            let mut inner = lock(&self.inner);
            if inner.pending.len() >= MAX_PENDING {
                return Err(BrokerError::new(
                    ErrorKind::Unavailable,
                    format!("{MAX_PENDING} transactional messages are pending on this broker already"),
                ));
            }
            let offset = self.log.append(&mut batch, 0).map_err(BrokerError::from)?.first_offset;
            let pending = Pending {
                topic: topic.to_string(),
                message_id: message_id.to_string(),
                transaction_id: transaction_id(offset),
                checks: 0,
                check_at_ms,
                committing: false,
            };
            let id = pending.transaction_id.clone();
            self.write(&mut inner, Line::Set { offset, pending: pending.clone() })?;
            inner.pending.insert(offset, pending);
            self.check_invariants(&inner);
            (offset, id)
        };
        if self.log.config().flush == FlushPolicy::Sync {
            self.log.sync_to(offset + 1).map_err(BrokerError::from)?;
        }
        Ok((offset, id))
    }

    /// The producer's decision about `transaction_id` (of message `message_id`, when given).
    /// The first decision wins: a transaction committed already (its message maybe still being
    /// appended) or rolled back is not open any more. A commit hands the message to the caller
    /// to append, who calls [`HalfStore::done`] after, or [`HalfStore::release`] if it failed.
    /// Blocking.
    pub fn decide(&self, transaction_id: &str, message_id: &str, commit: bool) -> Result<Decision, BrokerError> {
        let unknown = || {
            BrokerError::new(
                ErrorKind::InvalidRequest,
                format!("no open transaction {transaction_id:?} on this broker (decided already, or never begun)"),
            )
        };
        let offset = offset_of(transaction_id).ok_or_else(unknown)?;
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
            self.write(&mut inner, Line::Done { offset })?;
            inner.pending.remove(&offset);
            self.check_invariants(&inner);
            return Ok(Decision::RolledBack);
        }
        pending.committing = true;
        self.write(&mut inner, Line::Set { offset, pending: pending.clone() })?;
        inner.pending.insert(offset, pending.clone());
        inner.appending.insert(offset);
        self.check_invariants(&inner);
        drop(inner);
        match self.read(offset) {
            Ok(record) => Ok(Decision::Commit { offset, topic: pending.topic, record }),
            Err(e) => {
                self.release(offset);
                Err(e)
            }
        }
    }

    /// The committed message at `offset` is in its topic.
    pub fn done(&self, offset: i64) -> Result<(), BrokerError> {
        let mut inner = lock(&self.inner);
        if inner.pending.contains_key(&offset) {
            self.write(&mut inner, Line::Done { offset })?;
            inner.pending.remove(&offset);
        }
        inner.appending.remove(&offset);
        self.check_invariants(&inner);
        Ok(())
    }

    /// The append of the committed message at `offset` failed: the sweep tries it again.
    pub fn release(&self, offset: i64) {
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
    /// appending: the caller now is (then [`HalfStore::done`] or [`HalfStore::release`]).
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
    pub fn checked(&self, offset: i64, next_check_ms: i64) -> Result<(), BrokerError> {
        let mut inner = lock(&self.inner);
        let Some(mut pending) = inner.pending.get(&offset).cloned() else { return Ok(()) };
        pending.checks += 1;
        pending.check_at_ms = next_check_ms;
        self.write(&mut inner, Line::Set { offset, pending: pending.clone() })?;
        inner.pending.insert(offset, pending);
        self.check_invariants(&inner);
        Ok(())
    }

    /// Rolls back `offset` without its producer (checked too often). Returns whether it was open.
    pub fn give_up(&self, offset: i64) -> Result<bool, BrokerError> {
        let mut inner = lock(&self.inner);
        if inner.pending.get(&offset).is_none_or(|p| p.committing) {
            return Ok(false);
        }
        self.write(&mut inner, Line::Done { offset })?;
        inner.pending.remove(&offset);
        self.check_invariants(&inner);
        Ok(true)
    }

    /// How many transactions are open.
    pub(crate) fn pending_count(&self) -> usize {
        lock(&self.inner).pending.len()
    }

    /// The stored message at `offset`.
    pub fn read(&self, offset: i64) -> Result<Record, BrokerError> {
        let missing = || BrokerError::new(ErrorKind::Corrupt, format!("half message {offset} is not in the log"));
        let read = self.log.read(offset, 1, self.log.log_end_offset()).map_err(BrokerError::from)?;
        let slice = read.slice.ok_or_else(missing)?;
        let bytes = slice.read_to_vec().map_err(BrokerError::from)?;
        let batches =
            records::decode_batches(&bytes).map_err(|e| BrokerError::new(ErrorKind::Corrupt, e.to_string()))?;
        batches.into_iter().flat_map(|b| b.records).find(|r| r.offset == offset).ok_or_else(missing)
    }

    /// Trims the log below the oldest pending message; flushes on the `interval` policy.
    pub(crate) fn maintain(&self) {
        let min = lock(&self.inner).pending.keys().next().copied().unwrap_or_else(|| self.log.log_end_offset());
        if min > self.log.log_start_offset() {
            if let Err(e) = self.log.delete_records_before(min).and_then(|_| self.log.apply_retention()) {
                tracing::warn!(error = %e, "half messages: cannot trim the log");
            }
        }
        if let Err(e) = self.log.flush_if_due() {
            tracing::warn!(error = %e, "half messages: cannot flush the log");
        }
        self.deletion_queue.remove_due(i64::MAX);
    }

    /// Asserts the invariants of the module doc (debug builds only; nothing in release), with
    /// the state's lock held. Cheap: the messages being appended are few, and of the pending
    /// ones only the last is looked at.
    fn check_invariants(&self, inner: &Inner) {
        if !cfg!(debug_assertions) {
            return;
        }
        let dir = self.dir.display();
        for offset in &inner.appending {
            assert!(
                inner.pending.get(offset).is_some_and(|p| p.committing),
                "{dir}: half message {offset} is being appended but is not a pending committed one"
            );
        }
        if let Some((last, _)) = inner.pending.last_key_value() {
            let log_end = self.log.log_end_offset();
            assert!(*last < log_end, "{dir}: half message {last} is pending but the log ends at {log_end}");
        }
    }

    fn write(&self, inner: &mut Inner, line: Line) -> Result<(), BrokerError> {
        let path = self.dir.join(Self::JOURNAL);
        let mut bytes = serde_json::to_vec(&line).map_err(|e| BrokerError::internal(e.to_string()))?;
        bytes.push(b'\n');
        inner.journal.write_all(&bytes).map_err(|e| io_error("write", &path, e))?;
        inner.journal_bytes += bytes.len() as u64;
        if inner.journal_bytes > COMPACT_AFTER_BYTES {
            if let Err(e) = self.compact(inner) {
                tracing::warn!(error = %e, "half messages: cannot compact the journal; it keeps growing");
            }
        }
        Ok(())
    }

    /// Rewrites the journal with what is pending only.
    fn compact(&self, inner: &mut Inner) -> Result<(), BrokerError> {
        let path = self.dir.join(Self::JOURNAL);
        let tmp = self.dir.join("journal.jsonl.tmp");
        let mut bytes = Vec::new();
        for (offset, pending) in &inner.pending {
            serde_json::to_writer(&mut bytes, &Line::Set { offset: *offset, pending: pending.clone() })
                .map_err(|e| BrokerError::internal(e.to_string()))?;
            bytes.push(b'\n');
        }
        weir_storage::write_atomically(&path, &bytes).map_err(|e| io_error("write", &tmp, e))?;
        inner.journal = FileOptions::new().append(true).open(&path).map_err(|e| io_error("open", &path, e))?;
        inner.journal_bytes = bytes.len() as u64;
        fs::metadata(&path).map_err(|e| io_error("stat", &path, e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use weir_storage::SystemClock;

    fn open(dir: &Path) -> HalfStore {
        HalfStore::open(dir, LogConfig::default(), Arc::new(SystemClock)).expect("open")
    }

    fn record(value: &'static [u8]) -> Record {
        Record::new(1, None, Some(Bytes::from_static(value)))
    }

    #[test]
    fn a_half_message_is_committed_once_or_rolled_back_and_survives_a_reopen_either_way() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b, c) = {
            let store = open(dir.path());
            let a = store.prepare("t", &record(b"a"), "A", 100).expect("prepare");
            let b = store.prepare("t", &record(b"b"), "B", 100).expect("prepare");
            let c = store.prepare("u", &record(b"c"), "C", 100).expect("prepare");
            assert!(matches!(store.decide(&b.1, "B", false), Ok(Decision::RolledBack)));
            assert!(store.decide(&b.1, "B", true).is_err(), "decided already");
            assert!(store.decide(&a.1, "not-A", true).is_err(), "another message's id");
            match store.decide(&a.1, "A", true) {
                Ok(Decision::Commit { offset, topic, record }) => {
                    assert_eq!((offset, topic.as_str(), record.value), (a.0, "t", Some(Bytes::from_static(b"a"))));
                }
                other => panic!("not a commit: {other:?}"),
            }
            // A second commit (a check-back's, racing the producer's) is refused, and the
            // sweep leaves alone what the first is appending.
            assert!(store.decide(&a.1, "A", true).is_err(), "committed already");
            assert!(store.decide(&a.1, "A", false).is_err(), "committed already");
            assert!(store.claim_committing().is_empty());
            store.release(a.0);
            assert_eq!(store.claim_committing().iter().map(|(o, _)| *o).collect::<Vec<_>>(), vec![a.0]);
            assert!(store.claim_committing().is_empty(), "claimed once");
            (a, b, c)
        };
        // Committing but not done when the process died: still to append.
        let store = open(dir.path());
        assert_eq!(store.claim_committing().iter().map(|(o, _)| *o).collect::<Vec<_>>(), vec![a.0]);
        assert_eq!(store.due_checks(100, 10).iter().map(|(o, _)| *o).collect::<Vec<_>>(), vec![c.0]);
        store.done(a.0).expect("done");
        store.checked(c.0, 500).expect("checked");
        assert!(store.due_checks(499, 10).is_empty());
        drop(store);
        let store = open(dir.path());
        assert_eq!(store.pending_count(), 1);
        let (_, pending) = store.due_checks(500, 10).pop().expect("c is pending");
        assert_eq!((pending.checks, pending.topic.as_str()), (1, "u"));
        assert!(store.give_up(c.0).expect("give up"));
        assert!(store.decide(&c.1, "", true).is_err(), "given up: rolled back");
        assert_eq!(store.pending_count(), 0);
        assert_eq!(offset_of(&b.1), Some(b.0));
        assert_eq!(offset_of("nonsense"), None);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "not a pending committed one")]
    fn an_append_of_an_undecided_message_is_caught() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let (offset, _) = store.prepare("t", &record(b"a"), "A", 100).expect("prepare");
        lock(&store.inner).appending.insert(offset);
        store.release(offset + 1);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "the log ends at")]
    fn a_pending_message_past_the_log_end_is_caught() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        store.prepare("t", &record(b"a"), "A", 100).expect("prepare");
        let mut inner = lock(&store.inner);
        let pending = inner.pending.values().next().cloned().expect("pending");
        inner.pending.insert(5, pending);
        store.check_invariants(&inner);
    }
}
