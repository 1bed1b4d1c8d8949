//! Recalling a delayed message before it is due (RocketMQ 5.3's RecallMessage): the message is
//! taken out of the timer store and never appended to its topic.
//!
//! A recall is a durable note, not an edit of the wheel: far slot files are never rewritten.
//! The note is the message's wheel key, appended to `<timer dir>/recalled` (16 bytes, as in a
//! slot file) before the recall is acknowledged, as durably as the flush policy promises.
//! When the key comes due, firing finds it recalled and settles it without appending anything.
//!
//! A delayed message waits in the timer store of the broker that took it; a recall that comes
//! to another broker goes there over the internal RPC (`timer.recall`,
//! [`Messaging::recall_delayed`]).
//!
//! **Invariant:** a recall and the firing of the same message never both succeed. Firing
//! claims the keys it takes (`firing`) under the wheel's lock, and a recall decides under the
//! same lock: a key claimed is being delivered (the recall fails), a key recalled before the
//! claim is settled as recalled. Asserted in debug builds by `Recalls::check_invariants` when
//! a round claims and when it settles: the keys claimed are in order (the recall's search
//! relies on it), and no key that fired (appended or dropped) is among the recalled.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;

use weir_storage::sync::lock;
use weir_storage::FlushPolicy;

use super::wheel::{decode_entry, encode_entry, Key, ENTRY_BYTES};
use super::{due_ms, headers, io_error, read_at, TimerStore};
use weir_broker::cluster::{decode_json, encode_json, RemoteError, RpcFuture, RpcHandler};
use weir_broker::message::headers::MESSAGE_ID;
use weir_broker::BrokerError;

use crate::Messaging;

const SERVICE: &str = "timer";
const RECALL: &str = "timer.recall";

/// The recall file is rewritten with only the live notes once it holds this many more.
const COMPACT_SLACK: u64 = 1024;

/// What a recall did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Recall {
    /// The message will not be delivered (recalled now, or by an earlier recall of the same
    /// handle). Carries its message id, when it has one.
    Recalled { message_id: Option<String> },
    /// No message of the topic waits under that handle: it was delivered already, or the
    /// handle names none.
    NotPending,
    /// The handle names a delayed message of another topic: it was given for that one.
    OtherTopic,
    /// The message is being appended to its topic right now: too late.
    Delivering,
}

/// The recalled keys not settled yet, and the keys a firing round has claimed.
#[derive(Debug)]
pub(super) struct Recalls {
    path: PathBuf,
    recalled: BTreeSet<Key>,
    /// The keys of the firing round in progress, in order (as the wheel hands them out).
    firing: Vec<Key>,
    /// Notes in the file, live or not.
    file_entries: u64,
}

impl Recalls {
    /// Reads the notes in `dir` of keys not fired (above `fired`).
    pub(super) fn open(dir: &Path, fired: Key) -> io::Result<Recalls> {
        let path = dir.join("recalled");
        let mut bytes = Vec::new();
        match File::open(&path) {
            Ok(mut file) => {
                file.read_to_end(&mut bytes)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        // A torn last note (a crash mid-write) belongs to a recall never acknowledged.
        let recalled: BTreeSet<Key> =
            bytes.chunks_exact(ENTRY_BYTES).map(decode_entry).filter(|key| *key > fired).collect();
        let file_entries = (bytes.len() / ENTRY_BYTES) as u64;
        Ok(Recalls { path, recalled, firing: Vec::new(), file_entries })
    }

    /// How many recalled messages have not come due yet.
    pub(super) fn len(&self) -> usize {
        self.recalled.len()
    }

    pub(super) fn is_recalled(&self, key: &Key) -> bool {
        self.recalled.contains(key)
    }

    /// A firing round takes `keys`: from now until [`Recalls::settle`], they cannot be recalled.
    /// (Every round of the firing loop claims: reusing the vector, it allocates nothing.)
    pub(super) fn claim(&mut self, keys: &[Key]) {
        self.firing.clear();
        self.firing.extend_from_slice(keys);
        self.check_invariants(&[]);
    }

    /// The firing round ended; `recalled` were settled without an append.
    pub(super) fn settle(&mut self, recalled: &[Key]) {
        self.firing.clear();
        for key in recalled {
            self.recalled.remove(key);
        }
    }

    /// Asserts the invariant of the module doc (debug builds only; nothing in release), with
    /// `fired` the keys of the round that were appended or dropped: none of them was recalled.
    /// Called under the wheel's lock, where recalls decide.
    pub(super) fn check_invariants(&self, fired: &[Key]) {
        if !cfg!(debug_assertions) {
            return;
        }
        assert!(
            self.firing.windows(2).all(|w| w[0] < w[1]),
            "{}: the keys of a firing round are out of order: {:?}",
            self.path.display(),
            self.firing
        );
        if let Some(both) = fired.iter().find(|key| self.recalled.contains(key)) {
            panic!("{}: message {both:?} was both recalled and fired", self.path.display());
        }
    }

    /// Notes `key` as recalled, durably as `flush` promises.
    fn note(&mut self, key: Key, flush: FlushPolicy) -> io::Result<()> {
        let mut file = OpenOptions::new().create(true).append(true).open(&self.path)?;
        file.write_all(&encode_entry(key))?;
        if flush == FlushPolicy::Sync {
            file.sync_data()?;
        }
        self.file_entries += 1;
        self.recalled.insert(key);
        Ok(())
    }

    /// Rewrites the file with the live notes only, once it holds many settled ones.
    pub(super) fn compact(&mut self) -> io::Result<()> {
        if self.file_entries <= self.recalled.len() as u64 * 2 + COMPACT_SLACK {
            return Ok(());
        }
        let bytes: Vec<u8> = self.recalled.iter().flat_map(|key| encode_entry(*key)).collect();
        weir_storage::write_atomically(&self.path, &bytes).map_err(io::Error::other)?;
        self.file_entries = self.recalled.len() as u64;
        Ok(())
    }
}

impl TimerStore {
    /// Recalls the message of `topic` scheduled at `offset` of the timer log, due at `due_ms`
    /// (what [`TimerStore::schedule`] answered and the message's delivery time): it will not
    /// be delivered.
    pub async fn recall(self: &Arc<Self>, topic: &str, due_ms: i64, offset: i64) -> Result<Recall, BrokerError> {
        let (store, topic) = (self.clone(), topic.to_string());
        tokio::task::spawn_blocking(move || store.recall_blocking(&topic, due_ms, offset))
            .await
            .map_err(|e| BrokerError::internal(e.to_string()))?
    }

    fn recall_blocking(&self, topic: &str, due: i64, offset: i64) -> Result<Recall, BrokerError> {
        if offset < self.log.log_start_offset() || offset >= self.log.log_end_offset() {
            return Ok(Recall::NotPending);
        }
        // The handle must name this message: its topic and its delivery time.
        let Some(record) = read_at(&self.log, &[offset])?.into_iter().next().flatten() else {
            return Ok(Recall::NotPending);
        };
        let header = |name: &str| record.headers.iter().rev().find(|h| h.name == name).and_then(|h| h.value.as_deref());
        if due_ms(&record) != Some(due) {
            return Ok(Recall::NotPending);
        }
        if header(headers::TARGET_TOPIC) != Some(topic.as_bytes()) {
            return Ok(Recall::OtherTopic);
        }
        let message_id = header(MESSAGE_ID).map(|id| String::from_utf8_lossy(id).into_owned());
        let key = (due, offset);
        let wheel = lock(&self.wheel);
        let mut recalls = lock(&self.recalls);
        if recalls.firing.binary_search(&key).is_ok() {
            return Ok(Recall::Delivering);
        }
        if !wheel.is_pending(key) {
            return Ok(Recall::NotPending);
        }
        if !recalls.is_recalled(&key) {
            recalls.note(key, self.log.config().flush).map_err(|e| io_error("write", &recalls.path, e))?;
            self.stats.recalled.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(topic, offset, due, "timer store: recalled a delayed message");
        }
        Ok(Recall::Recalled { message_id })
    }
}

/// What `timer.recall` asks.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct RecallRequest {
    topic: String,
    due_ms: i64,
    offset: i64,
}

struct TimerService {
    timer: Weak<TimerStore>,
}

impl RpcHandler for TimerService {
    fn handle(&self, method: &str, body: Bytes) -> RpcFuture<'static, Result<Bytes, RemoteError>> {
        let timer = self.timer.upgrade();
        let method = method.to_string();
        Box::pin(async move {
            let timer = timer.ok_or_else(|| RemoteError::new("the broker is shutting down"))?;
            if method != RECALL {
                return Err(RemoteError::unknown_method(&method));
            }
            let request: RecallRequest = decode_json(&method, &body)?;
            let answer = timer.recall(&request.topic, request.due_ms, request.offset).await;
            encode_json(&method, &answer)
        })
    }
}

/// Serves `timer.recall` on this broker's internal RPC.
pub fn register(messaging: &Arc<Messaging>) {
    let service = Arc::new(TimerService { timer: Arc::downgrade(&messaging.timer) });
    messaging.broker.cluster.register_service(SERVICE, service);
}

impl Messaging {
    /// Recalls a delayed message kept by broker `node` (this one, or another over the internal
    /// RPC): see [`TimerStore::recall`].
    pub async fn recall_delayed(
        &self,
        node: i32,
        topic: &str,
        due_ms: i64,
        offset: i64,
    ) -> Result<Recall, BrokerError> {
        if node == self.broker.config.node_id {
            return self.timer.recall(topic, due_ms, offset).await;
        }
        let request = RecallRequest { topic: topic.to_string(), due_ms, offset };
        let body = encode_json(RECALL, &request).map_err(|e| BrokerError::internal(e.message().to_string()))?;
        let timeout = Duration::from_millis(self.broker.config.quorum_request_timeout_ms);
        let answer = self.broker.call_broker(node, RECALL, body, timeout).await?;
        decode_json::<Result<Recall, BrokerError>>(RECALL, &answer)
            .map_err(|e| BrokerError::internal(e.message().to_string()))?
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use weir_storage::records::{Header, Record};
    use weir_storage::{Clock, LogConfig, SystemClock};

    use super::*;
    use weir_broker::message::headers::DELIVERY_TIMESTAMP;

    fn delayed(due: i64, id: &'static str) -> Record {
        let mut record = Record::new(1, None, Some(Bytes::from_static(b"body")));
        record.headers.push(Header::new(DELIVERY_TIMESTAMP, Some(Bytes::from(due.to_string()))));
        record.headers.push(Header::new(MESSAGE_ID, Some(Bytes::from_static(id.as_bytes()))));
        record
    }

    #[tokio::test]
    async fn a_recall_takes_a_pending_message_out_for_good_and_names_it_exactly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let open =
            || Arc::new(TimerStore::open(dir.path(), LogConfig::default(), Arc::new(SystemClock)).expect("open"));
        let now = SystemClock.now_ms();
        let (near, far) = (now + 2_000, now + 3_600_000);
        {
            let store = open();
            store
                .schedule("t", None, vec![delayed(near, "A"), delayed(far, "B"), delayed(far, "C")])
                .await
                .expect("schedule");
            assert_eq!(store.pending().0, 3);
            // Not this message: another topic, another due time, an offset never given.
            assert_eq!(store.recall("u", near, 0).await.expect("recall"), Recall::OtherTopic);
            assert_eq!(store.recall("t", near + 1, 0).await.expect("recall"), Recall::NotPending);
            assert_eq!(store.recall("t", near, 99).await.expect("recall"), Recall::NotPending);
            // In memory (due in 2 s) and on disk (in an hour): both recalled, twice alike.
            let a = Recall::Recalled { message_id: Some("A".into()) };
            assert_eq!(store.recall("t", near, 0).await.expect("recall"), a);
            assert_eq!(store.recall("t", near, 0).await.expect("recall"), a);
            let b = Recall::Recalled { message_id: Some("B".into()) };
            assert_eq!(store.recall("t", far, 1).await.expect("recall"), b);
            assert_eq!(store.pending().0, 1);
            assert_eq!(store.stats.recalled.load(Ordering::Relaxed), 2);
        }
        // Noted durably: still recalled after a reopen.
        let store = open();
        assert_eq!(store.pending().0, 1);
        assert!(lock(&store.recalls).is_recalled(&(near, 0)));
        // A firing round that claimed C: too late to recall it; settled, it is not pending.
        lock(&store.recalls).claim(&[(far, 2)]);
        assert_eq!(store.recall("t", far, 2).await.expect("recall"), Recall::Delivering);
        lock(&store.recalls).settle(&[]);
        {
            let mut wheel = lock(&store.wheel);
            wheel.advance(far).expect("advance");
            wheel.fired(&[(near, 0), (far, 1), (far, 2)], (far, 2)).expect("fired");
        }
        lock(&store.recalls).settle(&[(near, 0), (far, 1)]);
        assert_eq!(store.recall("t", far, 2).await.expect("recall"), Recall::NotPending);
        assert_eq!(store.pending().0, 0);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "both recalled and fired")]
    fn a_message_both_recalled_and_fired_is_caught() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut recalls = Recalls::open(dir.path(), (i64::MIN, i64::MIN)).expect("open");
        recalls.note((1_000, 7), FlushPolicy::None).expect("note");
        recalls.check_invariants(&[(1_000, 7)]);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "out of order")]
    fn a_round_claimed_out_of_order_is_caught() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut recalls = Recalls::open(dir.path(), (i64::MIN, i64::MIN)).expect("open");
        recalls.claim(&[(2_000, 1), (1_000, 2)]);
    }

    #[test]
    fn the_recall_file_keeps_only_live_notes_once_compacted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut recalls = Recalls::open(dir.path(), (i64::MIN, i64::MIN)).expect("open");
        for offset in 0..(COMPACT_SLACK as i64 + 20) {
            recalls.note((1_000, offset), FlushPolicy::Sync).expect("note");
        }
        let settled: Vec<Key> = (0..(COMPACT_SLACK as i64 + 15)).map(|offset| (1_000, offset)).collect();
        recalls.settle(&settled);
        recalls.compact().expect("compact");
        assert_eq!(recalls.file_entries, 5);
        // A torn note (a crash mid-write) and notes of what fired are left out on reading.
        let mut file = OpenOptions::new().append(true).open(dir.path().join("recalled")).expect("file");
        file.write_all(&[1, 2, 3]).expect("torn");
        let reread = Recalls::open(dir.path(), (1_000, COMPACT_SLACK as i64 + 16)).expect("reopen");
        let live: Vec<i64> = reread.recalled.iter().map(|(_, offset)| offset - COMPACT_SLACK as i64).collect();
        assert_eq!(live, vec![17, 18, 19]);
    }
}
