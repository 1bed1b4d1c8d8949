//! `PopStore`: every queue state and the journal that keeps them (see the module above).

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::state::{Inflight, QueueState};
use weir_storage::sync::lock;

use weir_broker::error::{BrokerError, ErrorKind};

/// The directory of the store, under the data directory (named when the RocketMQ front-end
/// kept it, so existing data directories keep their state).
pub const DIR: &str = "rocketmq-pop";

/// The journal is compacted into a snapshot once it is this large.
pub(crate) const COMPACT_AFTER_BYTES: u64 = 64 << 20;

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

/// A journal line: a queue's whole state (snapshots, and journals of older versions) ...
#[derive(serde::Serialize, serde::Deserialize)]
struct FullLine {
    #[serde(rename = "q")]
    key: QueueKey,
    #[serde(rename = "s")]
    state: QueueState,
}

/// ... or what one change did to it. (Two types tried in turn, not one untagged enum: serde's
/// untagged enums cannot read the in-flight map's integer keys.)
#[derive(serde::Serialize, serde::Deserialize)]
struct ChangeLine {
    #[serde(rename = "q")]
    key: QueueKey,
    #[serde(rename = "d")]
    change: Change,
}

/// What one update did to a queue's state.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Change {
    done_below: i64,
    next: i64,
    /// In-flight entries added or changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    set: Vec<(i64, Inflight)>,
    /// In-flight entries gone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    removed: Vec<i64>,
}

impl Change {
    /// What turned `before` into `after`.
    fn between(before: &QueueState, after: &QueueState) -> Change {
        let set = after
            .inflight
            .iter()
            .filter(|(offset, inflight)| before.inflight.get(offset) != Some(inflight))
            .map(|(o, i)| (*o, *i))
            .collect();
        let removed = before.inflight.keys().filter(|o| !after.inflight.contains_key(o)).copied().collect();
        Change { done_below: after.done_below, next: after.next, set, removed }
    }

    fn apply(self, state: &mut QueueState) {
        for offset in self.removed {
            state.inflight.remove(&offset);
        }
        state.inflight.extend(self.set);
        state.done_below = self.done_below;
        state.next = self.next;
    }
}

/// Every queue state of this broker, and the journal that keeps them.
pub(crate) struct PopStore {
    dir: PathBuf,
    inner: Mutex<Inner>,
}

struct Inner {
    queues: HashMap<QueueKey, QueueState>,
    journal: File,
    journal_bytes: u64,
}

fn storage_error(what: &str, path: &Path, e: std::io::Error) -> BrokerError {
    BrokerError::new(ErrorKind::Storage, format!("cannot {what} {}: {e}", path.display()))
}

impl PopStore {
    const SNAPSHOT: &'static str = "snapshot.jsonl";
    const JOURNAL: &'static str = "journal.jsonl";

    /// Opens (or creates) the store in `dir`, reading back every state. Blocking.
    pub fn open(dir: &Path) -> Result<PopStore, BrokerError> {
        fs::create_dir_all(dir).map_err(|e| storage_error("create", dir, e))?;
        let mut queues = HashMap::new();
        for name in [Self::SNAPSHOT, Self::JOURNAL] {
            let path = dir.join(name);
            let file = match File::open(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(storage_error("open", &path, e)),
            };
            for (number, line) in BufReader::new(file).split(b'\n').enumerate() {
                let line = line.map_err(|e| storage_error("read", &path, e))?;
                let parsed = serde_json::from_slice::<ChangeLine>(&line)
                    .map(|ChangeLine { key, change }| change.apply(queues.entry(key).or_default()))
                    .or_else(|_| {
                        serde_json::from_slice::<FullLine>(&line).map(|FullLine { key, state }| {
                            queues.insert(key, state);
                        })
                    });
                match parsed {
                    Ok(()) => {}
                    Err(e) if !line.is_empty() => {
                        tracing::warn!(file = %path.display(), line = number + 1, error = %e, "skipping a torn or corrupt POP state line");
                    }
                    Err(_) => {}
                }
            }
        }
        let journal_path = dir.join(Self::JOURNAL);
        let journal = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&journal_path)
            .map_err(|e| storage_error("open", &journal_path, e))?;
        let journal_bytes = journal.metadata().map(|m| m.len()).unwrap_or(0);
        // A torn last line must not glue onto the next write.
        let mut store = Inner { queues, journal, journal_bytes };
        if journal_bytes > 0 {
            store.journal.write_all(b"\n").map_err(|e| storage_error("write", &journal_path, e))?;
            store.journal_bytes += 1;
        }
        Ok(PopStore { dir: dir.to_path_buf(), inner: Mutex::new(store) })
    }

    /// Runs `change` on the state of `key` (made with `start` the first time) and makes the new
    /// state durable before returning what `change` returned. A `change` that returns `Err`
    /// must leave the state as it found it: nothing is written then. A state made by `start`
    /// is written even when `change` leaves it as it is: where a group starts on a queue
    /// (`consume.from.where`, maybe the queue's end then) must survive a restart.
    pub fn update<R, E>(
        &self,
        key: &QueueKey,
        start: impl FnOnce() -> QueueState,
        change: impl FnOnce(&mut QueueState) -> Result<R, E>,
    ) -> Result<Result<R, E>, BrokerError> {
        let mut inner = lock(&self.inner);
        let started = !inner.queues.contains_key(key);
        let state = inner.queues.entry(key.clone()).or_insert_with(start);
        let before = state.clone();
        let result = change(state);
        if result.is_err() || (*state == before && !started) {
            return Ok(result);
        }
        let line = ChangeLine { key: key.clone(), change: Change::between(&before, state) };
        let mut bytes = serde_json::to_vec(&line).map_err(|e| BrokerError::new(ErrorKind::Internal, e.to_string()))?;
        bytes.push(b'\n');
        if let Err(e) = self.journal(&mut inner, &bytes) {
            // Not durable: the caller must not answer as if it were, and memory must agree
            // with the journal.
            inner.queues.insert(key.clone(), before);
            return Err(e);
        }
        Ok(result)
    }

    /// Appends `bytes` (whole lines) to the journal, and compacts it when it grew too large.
    fn journal(&self, inner: &mut Inner, bytes: &[u8]) -> Result<(), BrokerError> {
        inner.journal.write_all(bytes).map_err(|e| storage_error("write", &self.dir.join(Self::JOURNAL), e))?;
        inner.journal_bytes += bytes.len() as u64;
        if inner.journal_bytes > COMPACT_AFTER_BYTES {
            if let Err(e) = self.compact(inner) {
                tracing::warn!(error = %e, "cannot compact the POP journal; it keeps growing");
            }
        }
        Ok(())
    }

    /// Moves every state of `group` for `topic`-`partition` (each broadcasting consumer's too)
    /// to start at `offset` ([`QueueState::reset_to`]); with `create`, a group without one for
    /// this queue gets one (clustering), so its first receive starts there too. Durable (as
    /// far as the journal is) before it returns; returns how many states it set.
    pub fn reset(
        &self,
        group: &str,
        topic: &str,
        partition: i32,
        offset: i64,
        create: bool,
    ) -> Result<usize, BrokerError> {
        let mut inner = lock(&self.inner);
        let mut keys: Vec<QueueKey> = inner
            .queues
            .keys()
            .filter(|k| k.group == group && k.topic == topic && k.partition == partition)
            .cloned()
            .collect();
        if keys.is_empty() && create {
            keys.push(QueueKey::new(group, topic, partition));
        }
        let mut bytes = Vec::new();
        let mut before = Vec::with_capacity(keys.len());
        for key in keys {
            let state = inner.queues.entry(key.clone()).or_default();
            before.push((key.clone(), state.clone()));
            state.reset_to(offset);
            // The whole (empty) state: smaller than a change listing every entry removed.
            let line = FullLine { key, state: state.clone() };
            serde_json::to_writer(&mut bytes, &line)
                .map_err(|e| BrokerError::new(ErrorKind::Internal, e.to_string()))?;
            bytes.push(b'\n');
        }
        let count = before.len();
        if count == 0 {
            return Ok(0);
        }
        if let Err(e) = self.journal(&mut inner, &bytes) {
            for (key, state) in before {
                inner.queues.insert(key, state);
            }
            return Err(e);
        }
        Ok(count)
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

    /// A copy of the state of `key`, if it has one.
    pub fn get(&self, key: &QueueKey) -> Option<QueueState> {
        lock(&self.inner).queues.get(key).cloned()
    }

    /// Writes every state to a new snapshot (fsynced, then renamed over the old one) and empties
    /// the journal.
    fn compact(&self, inner: &mut Inner) -> Result<(), BrokerError> {
        let tmp = self.dir.join("snapshot.jsonl.tmp");
        let mut out = std::io::BufWriter::new(File::create(&tmp).map_err(|e| storage_error("create", &tmp, e))?);
        let mut keys: Vec<&QueueKey> = inner.queues.keys().collect();
        keys.sort();
        for key in keys {
            let line = FullLine { key: key.clone(), state: inner.queues[key].clone() };
            serde_json::to_writer(&mut out, &line).map_err(|e| BrokerError::new(ErrorKind::Internal, e.to_string()))?;
            out.write_all(b"\n").map_err(|e| storage_error("write", &tmp, e))?;
        }
        let file = out.into_inner().map_err(|e| storage_error("write", &tmp, e.into_error()))?;
        file.sync_all().map_err(|e| storage_error("sync", &tmp, e))?;
        let snapshot = self.dir.join(Self::SNAPSHOT);
        fs::rename(&tmp, &snapshot).map_err(|e| storage_error("rename", &snapshot, e))?;
        weir_storage::fsync_dir(&self.dir)
            .map_err(|e| BrokerError::new(ErrorKind::Storage, format!("cannot sync {}: {e}", self.dir.display())))?;
        let journal = self.dir.join(Self::JOURNAL);
        inner.journal.set_len(0).map_err(|e| storage_error("truncate", &journal, e))?;
        inner.journal_bytes = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pop::HandleError;

    fn key(partition: i32) -> QueueKey {
        QueueKey::new("g", "t", partition)
    }

    #[test]
    fn states_survive_a_reopen_and_a_torn_last_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let store = PopStore::open(dir.path()).expect("open");
            let _ = store.update(&key(0), || QueueState::starting_at(0), |q| Ok::<_, ()>(q.deliver(0, 10, 1)));
            let _ = store.update(&key(0), || QueueState::starting_at(0), |q| Ok::<_, ()>(q.deliver(1, 10, 2)));
            let _ = store.update(&key(0), || QueueState::starting_at(0), |q| q.ack(0, 1));
            let _ = store.update(
                &key(1),
                || QueueState::starting_at(5),
                |q| {
                    q.skip_to(9);
                    Ok::<_, ()>(())
                },
            );
        }
        let mut journal = OpenOptions::new().append(true).open(dir.path().join("journal.jsonl")).expect("journal");
        journal.write_all(br#"{"q":{"group":"g","topic":"t","part"#).expect("torn write");
        let store = PopStore::open(dir.path()).expect("reopen");
        let q0 = store.get(&key(0)).expect("queue 0");
        assert_eq!(q0.inflight.keys().copied().collect::<Vec<_>>(), vec![1]);
        assert_eq!(q0.next, 2);
        assert_eq!(store.get(&key(1)).map(|q| q.next), Some(9));
        // The torn line does not corrupt what follows it.
        let _ = store.update(&key(0), || QueueState::starting_at(0), |q| q.ack(1, 2));
        drop(store);
        let store = PopStore::open(dir.path()).expect("reopen again");
        assert!(store.get(&key(0)).expect("queue 0").inflight.is_empty());
    }

    #[test]
    fn a_new_state_is_journalled_even_when_the_update_leaves_it_as_started() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let store = PopStore::open(dir.path()).expect("open");
            let _ = store.update(&key(0), || QueueState::starting_at(42), |_| Ok::<_, ()>(()));
        }
        let store = PopStore::open(dir.path()).expect("reopen");
        assert_eq!(store.get(&key(0)).map(|q| (q.done_below, q.next)), Some((42, 42)));
    }

    #[test]
    fn a_change_is_journalled_as_what_changed_and_an_older_full_state_line_still_reads() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let store = PopStore::open(dir.path()).expect("open");
            for offset in 0..1000 {
                let _ = store.update(&key(0), || QueueState::starting_at(0), |q| Ok::<_, ()>(q.deliver(offset, 10, 1)));
            }
            let before = fs::metadata(dir.path().join("journal.jsonl")).map(|m| m.len()).unwrap_or(0);
            let _ = store.update(&key(0), || QueueState::starting_at(0), |q| q.ack(500, 1));
            let line = fs::metadata(dir.path().join("journal.jsonl")).map(|m| m.len()).unwrap_or(0) - before;
            assert!(line < 200, "an ack with 1000 messages out wrote {line} bytes");
        }
        // Weir 0.2 wrote whole states; such a line is read, and later changes apply over it.
        let old = br#"{"q":{"group":"g","topic":"t","partition":1},"s":{"done_below":3,"next":5,"inflight":{"4":{"visible_at_ms":9,"attempt":2,"nonce":7}}}}"#;
        let mut journal = OpenOptions::new().append(true).open(dir.path().join("journal.jsonl")).expect("journal");
        journal.write_all(old).expect("old line");
        journal.write_all(b"\n").expect("newline");
        drop(journal);
        let store = PopStore::open(dir.path()).expect("reopen");
        let q0 = store.get(&key(0)).expect("queue 0");
        assert_eq!((q0.inflight.len(), q0.done_below, q0.next), (999, 0, 1000));
        assert!(!q0.inflight.contains_key(&500));
        let q1 = store.get(&key(1)).expect("queue 1");
        assert_eq!((q1.done_below, q1.next, q1.inflight.get(&4).map(|i| i.attempt)), (3, 5, Some(2)));
    }

    #[test]
    fn a_reset_moves_every_consumers_state_of_the_queue_and_survives_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let store = PopStore::open(dir.path()).expect("open");
            let broadcast = QueueKey { consumer: Some("c1".into()), ..key(0) };
            for k in [key(0), broadcast.clone(), key(1)] {
                let _ = store.update(&k, || QueueState::starting_at(0), |q| Ok::<_, ()>(q.deliver(5, 10, 1)));
            }
            assert_eq!(store.reset("g", "t", 0, 2, false).expect("reset"), 2, "the group's and c1's");
            for k in [key(0), broadcast] {
                let q = store.get(&k).expect("state");
                assert_eq!((q.done_below, q.next, q.inflight.len(), q.resets), (2, 2, 0, 1), "{k:?}");
            }
            assert_eq!(store.get(&key(1)).map(|q| q.inflight.len()), Some(1), "another partition");
            assert_eq!(store.reset("other", "t", 0, 9, false).expect("reset"), 0, "no state, none made");
            assert_eq!(store.reset("other", "t", 0, 9, true).expect("reset"), 1);
            assert!(store.has_group("other") && !store.has_group("nobody"));
        }
        let store = PopStore::open(dir.path()).expect("reopen");
        assert_eq!(store.get(&key(0)).map(|q| (q.done_below, q.next, q.inflight.len())), Some((2, 2, 0)));
        assert_eq!(store.get(&QueueKey::new("other", "t", 0)).map(|q| q.next), Some(9));
    }

    #[test]
    fn a_refused_change_writes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = PopStore::open(dir.path()).expect("open");
        let refused = store.update(&key(0), || QueueState::starting_at(0), |q| q.ack(3, 1)).expect("no I/O error");
        assert_eq!(refused, Err(HandleError::NotInFlight));
        assert_eq!(fs::metadata(dir.path().join("journal.jsonl")).map(|m| m.len()).ok(), Some(0));
    }

    #[test]
    fn compaction_keeps_every_state() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = PopStore::open(dir.path()).expect("open");
        for p in 0..3 {
            let _ = store.update(&key(p), || QueueState::starting_at(0), |q| Ok::<_, ()>(q.deliver(0, 1, 1)));
        }
        store.compact(&mut lock(&store.inner)).expect("compact");
        assert_eq!(fs::metadata(dir.path().join("journal.jsonl")).map(|m| m.len()).ok(), Some(0));
        let _ = store.update(&key(0), || QueueState::starting_at(0), |q| q.ack(0, 1));
        drop(store);
        let store = PopStore::open(dir.path()).expect("reopen");
        assert!(store.get(&key(0)).expect("queue 0").inflight.is_empty());
        assert_eq!(store.get(&key(2)).map(|q| q.inflight.len()), Some(1));
    }
}
