//! Kafka's incremental fetch sessions (KIP-227): the session cache and what a session holds.
//!
//! A client opens a session with a full fetch (epoch 0); the answer names a session id. Its
//! next fetches carry that id and the epoch the broker expects (1, 2, ...; after `i32::MAX`
//! comes 1) and name only the partitions whose fetch position changed (added or updated) and
//! those it drops (`forgotten_topics_data`); the broker keeps the rest. The answer to such an
//! incremental fetch lists only the partitions that changed: records, a new high watermark,
//! last stable offset or log start, an error, a diverging epoch or a preferred replica (Kafka's
//! `CachedPartition.maybeUpdateResponseData`). Epoch -1 closes the session (a sessionless full
//! fetch). An unknown id answers FETCH_SESSION_ID_NOT_FOUND, a wrong epoch
//! INVALID_FETCH_SESSION_EPOCH, a session used with topic ids by a version without them (or
//! the reverse) FETCH_SESSION_TOPIC_ID_ERROR; the client then opens a new one.
//!
//! Sessions are kept by id, not by connection, at most `max.incremental.fetch.session.cache.slots`
//! of them. When full, a new session takes the place of one unused for two minutes, or else of
//! the least valuable one if it is worth more (followers' sessions over consumers', then more
//! partitions over fewer: Kafka's `FetchSessionCache.tryEvict`); otherwise it is not opened
//! and the client keeps sending full fetches.
//!
//! Weir reads fewer partitions than Kafka: each session watches its partitions
//! ([`weir_broker::watch`]), and an incremental fetch reads only those named in the request and
//! those marked changed since the last fetch. A partition neither named nor marked has nothing
//! to report, so it is omitted without a read, and an idle session costs O(1) per fetch.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;
use uuid::Uuid;
use weir_broker::metrics::ProtocolMetrics;
use weir_broker::partition::Partition;
use weir_broker::watch::PartitionWatch;
use weir_storage::sync::lock;

/// A session unused this long may be evicted for a new one (Kafka's `evictionMs`).
const EVICTION_AFTER: Duration = Duration::from_secs(120);

/// The epoch of a request that opens a session.
pub(crate) const INITIAL_EPOCH: i32 = 0;
/// The epoch of a sessionless request (which also closes the session it names).
pub(crate) const FINAL_EPOCH: i32 = -1;

/// The epoch after `epoch` (Kafka's `FetchMetadata.nextEpoch`).
pub(crate) fn next_epoch(epoch: i32) -> i32 {
    if epoch < 0 {
        FINAL_EPOCH
    } else if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

/// How a request names a topic: by name before Fetch v13, by id from it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum TopicRef {
    Name(String),
    Id(Uuid),
}

/// A partition of a session.
pub(crate) type Key = (TopicRef, i32);

/// What the client asked for one partition, as its last request that named it said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    pub(crate) fetch_offset: i64,
    pub(crate) max_bytes: i32,
    pub(crate) current_leader_epoch: i32,
    pub(crate) last_fetched_epoch: i32,
}

/// What a fetch found in one partition, as far as the omission rule looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Found {
    pub(crate) high_watermark: i64,
    pub(crate) last_stable_offset: i64,
    pub(crate) log_start_offset: i64,
    pub(crate) has_records: bool,
    pub(crate) has_error: bool,
    pub(crate) diverging: bool,
    pub(crate) preferred_replica: bool,
}

/// The offsets last sent for a partition; a partition whose new ones equal them (and that has
/// no records, no error, ...) is omitted from an incremental answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sent {
    high_watermark: i64,
    last_stable_offset: i64,
    log_start_offset: i64,
}

/// One partition of a session.
pub(crate) struct Slot {
    pub(crate) key: Key,
    /// The topic's name, once known (v13+ requests name only its id).
    pub(crate) topic_name: Option<String>,
    pub(crate) position: Position,
    /// The partition, watched by the session's watch under this slot's number; `None` while it
    /// is not hosted here (it then answers an error at every fetch, as in Kafka).
    pub(crate) partition: Option<Arc<Partition>>,
    /// `None` until first sent (a new partition is always sent).
    sent: Option<Sent>,
}

/// One session's partitions.
#[derive(Default)]
pub(crate) struct Partitions {
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    by_key: HashMap<Key, u32>,
    /// Slots without a partition: read at every fetch (they answer an error).
    unresolved: HashSet<u32>,
}

impl Partitions {
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    pub(crate) fn slot(&self, slot: u32) -> Option<&Slot> {
        self.slots.get(slot as usize)?.as_ref()
    }

    pub(crate) fn slot_mut(&mut self, slot: u32) -> Option<&mut Slot> {
        self.slots.get_mut(slot as usize)?.as_mut()
    }

    /// Adds `key`, or updates its position; returns its slot.
    pub(crate) fn upsert(&mut self, key: Key, topic_name: Option<String>, position: Position) -> u32 {
        if let Some(&slot) = self.by_key.get(&key) {
            if let Some(existing) = self.slot_mut(slot) {
                existing.position = position;
                if existing.topic_name.is_none() {
                    existing.topic_name = topic_name;
                }
            }
            return slot;
        }
        let slot = self.free.pop().unwrap_or(self.slots.len() as u32);
        let entry = Slot { key: key.clone(), topic_name, position, partition: None, sent: None };
        if slot as usize == self.slots.len() {
            self.slots.push(Some(entry));
        } else {
            self.slots[slot as usize] = Some(entry);
        }
        self.by_key.insert(key, slot);
        self.unresolved.insert(slot);
        slot
    }

    /// Removes `key`; returns the partition it watched (to unwatch) with its slot.
    pub(crate) fn forget(&mut self, key: &Key) -> Option<(u32, Option<Arc<Partition>>)> {
        let slot = self.by_key.remove(key)?;
        let removed = self.slots.get_mut(slot as usize)?.take()?;
        self.unresolved.remove(&slot);
        self.free.push(slot);
        Some((slot, removed.partition))
    }

    /// Sets the partition of `slot` (`None`: not hosted here); returns the one it replaces.
    pub(crate) fn resolve(&mut self, slot: u32, partition: Option<Arc<Partition>>) -> Option<Arc<Partition>> {
        let resolved = partition.is_some();
        let previous = match self.slot_mut(slot) {
            Some(s) => std::mem::replace(&mut s.partition, partition),
            None => return None,
        };
        if resolved {
            self.unresolved.remove(&slot);
        } else {
            self.unresolved.insert(slot);
        }
        previous
    }

    /// The slots without a partition.
    pub(crate) fn unresolved(&self) -> impl Iterator<Item = u32> + '_ {
        self.unresolved.iter().copied()
    }

    /// Every slot in use.
    pub(crate) fn all(&self) -> Vec<u32> {
        (0..self.slots.len() as u32).filter(|s| self.slots[*s as usize].is_some()).collect()
    }

    /// Whether an incremental answer must list `slot` after a fetch found `found`, and records
    /// what is sent (Kafka's rules; see the module doc). A partition with an error is always
    /// listed, and its high watermark is forgotten so that it is listed again once the error
    /// is gone.
    pub(crate) fn must_respond(&mut self, slot: u32, found: Found) -> bool {
        let Some(entry) = self.slot_mut(slot) else { return false };
        let now = Sent {
            high_watermark: found.high_watermark,
            last_stable_offset: found.last_stable_offset,
            log_start_offset: found.log_start_offset,
        };
        let changed = entry.sent != Some(now);
        entry.sent = Some(if found.has_error { Sent { high_watermark: -1, ..now } } else { now });
        changed || found.has_records || found.has_error || found.diverging || found.preferred_replica
    }
}

/// One session. Its partitions are used by one fetch at a time: the epoch check lets one
/// request through per epoch.
pub(crate) struct Session {
    pub(crate) id: i32,
    pub(crate) uses_topic_ids: bool,
    pub(crate) watch: Arc<PartitionWatch>,
    pub(crate) partitions: Mutex<Partitions>,
}

impl Drop for Session {
    fn drop(&mut self) {
        // Stop the partitions marking a watch nobody reads (they would drop it lazily).
        let partitions = lock(&self.partitions);
        for slot in partitions.all() {
            if let Some(partition) = partitions.slot(slot).and_then(|s| s.partition.as_ref()) {
                partition.unwatch(&self.watch, slot);
            }
        }
    }
}

struct Entry {
    session: Arc<Session>,
    /// The epoch the next request must carry.
    epoch: i32,
    privileged: bool,
    size: usize,
    last_used: Instant,
}

impl Entry {
    /// Eviction order: the least valuable first (consumers before followers, then fewer
    /// partitions, then the lower id).
    fn value(&self) -> (bool, usize, i32) {
        (self.privileged, self.size, self.session.id)
    }
}

/// The sessions of the Kafka listener, by id. See the module doc.
pub(crate) struct SessionCache {
    slots_max: usize,
    inner: Mutex<Inner>,
    /// Where the `weir_fetch_sessions` gauge is.
    metrics: Option<Arc<ProtocolMetrics>>,
}

struct Inner {
    sessions: HashMap<i32, Entry>,
    /// State of the id generator (xorshift).
    seed: u64,
}

impl SessionCache {
    pub(crate) fn new(slots_max: usize, metrics: Option<Arc<ProtocolMetrics>>) -> SessionCache {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9e37_79b9_7f4a_7c15, |d| d.as_nanos() as u64)
            | 1;
        SessionCache { slots_max, inner: Mutex::new(Inner { sessions: HashMap::new(), seed }), metrics }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.inner).sessions.len()
    }

    fn set_gauge(&self, inner: &Inner) {
        if let Some(metrics) = &self.metrics {
            let open = &metrics.connections.fetch_sessions;
            open.add(inner.sessions.len() as i64 - open.get());
        }
    }

    /// Closes session `id` (a full request that names it).
    pub(crate) fn remove(&self, id: i32) {
        let mut inner = lock(&self.inner);
        inner.sessions.remove(&id);
        self.set_gauge(&inner);
    }

    /// Opens a session for `size` partitions if there is room or one may be evicted for it;
    /// its next request must carry epoch 1. `privileged`: a follower's.
    pub(crate) fn create(
        &self,
        privileged: bool,
        uses_topic_ids: bool,
        size: usize,
        now: Instant,
    ) -> Option<Arc<Session>> {
        if self.slots_max == 0 {
            return None;
        }
        let mut inner = lock(&self.inner);
        if inner.sessions.len() >= self.slots_max && !try_evict(&mut inner.sessions, privileged, size, now) {
            return None;
        }
        let id = loop {
            // xorshift64: ids need not be secret, only unlikely to repeat.
            let mut x = inner.seed;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            inner.seed = x;
            let id = (x >> 33) as i32;
            if id > 0 && !inner.sessions.contains_key(&id) {
                break id;
            }
        };
        let session = Arc::new(Session {
            id,
            uses_topic_ids,
            watch: PartitionWatch::new(),
            partitions: Mutex::new(Partitions::default()),
        });
        let entry =
            Entry { session: session.clone(), epoch: next_epoch(INITIAL_EPOCH), privileged, size, last_used: now };
        inner.sessions.insert(id, entry);
        self.set_gauge(&inner);
        Some(session)
    }

    /// The session of an incremental request (`epoch` > 0), whose epoch then moves on; or the
    /// error the request gets.
    pub(crate) fn take_turn(
        &self,
        id: i32,
        epoch: i32,
        uses_topic_ids: bool,
        now: Instant,
    ) -> Result<Arc<Session>, ResponseError> {
        let mut inner = lock(&self.inner);
        let entry = inner.sessions.get_mut(&id).ok_or(ResponseError::FetchSessionIdNotFound)?;
        if entry.epoch != epoch {
            return Err(ResponseError::InvalidFetchSessionEpoch);
        }
        if entry.session.uses_topic_ids != uses_topic_ids {
            return Err(ResponseError::FetchSessionTopicIdError);
        }
        entry.epoch = next_epoch(entry.epoch);
        entry.last_used = now;
        Ok(entry.session.clone())
    }

    /// The session now has `size` partitions (its value for eviction).
    pub(crate) fn resize(&self, id: i32, size: usize) {
        if let Some(entry) = lock(&self.inner).sessions.get_mut(&id) {
            entry.size = size;
        }
    }
}

/// Makes room for a new session (Kafka's `tryEvict`): drops the session unused longest if it
/// has been unused for `EVICTION_AFTER`, else the least valuable one if the new one is worth
/// more. Returns whether one was dropped.
fn try_evict(sessions: &mut HashMap<i32, Entry>, privileged: bool, size: usize, now: Instant) -> bool {
    let stale = sessions
        .values()
        .filter(|e| now.saturating_duration_since(e.last_used) > EVICTION_AFTER)
        .min_by_key(|e| e.last_used)
        .map(|e| e.session.id);
    if let Some(id) = stale {
        sessions.remove(&id);
        return true;
    }
    let Some(least) = sessions.values().min_by_key(|e| e.value()).map(|e| (e.value(), e.session.id)) else {
        return false;
    };
    // The new session would get an id above every existing one in the comparison: it wins a
    // tie of value (Kafka compares the ids too, and a new key's is the largest possible).
    if (privileged, size) < (least.0 .0, least.0 .1) {
        return false;
    }
    sessions.remove(&least.1);
    true
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn position(offset: i64) -> Position {
        Position { fetch_offset: offset, max_bytes: 1024, current_leader_epoch: 0, last_fetched_epoch: -1 }
    }

    fn key(topic: &str, partition: i32) -> Key {
        (TopicRef::Name(topic.into()), partition)
    }

    fn found(high_watermark: i64) -> Found {
        Found { high_watermark, last_stable_offset: high_watermark, log_start_offset: 0, ..Found::default() }
    }

    #[test]
    fn epochs_go_from_one_up_and_wrap_to_one() {
        assert_eq!(next_epoch(INITIAL_EPOCH), 1);
        assert_eq!(next_epoch(41), 42);
        assert_eq!(next_epoch(i32::MAX), 1);
        assert_eq!(next_epoch(FINAL_EPOCH), FINAL_EPOCH);
    }

    #[test]
    fn an_incremental_request_needs_the_id_and_the_expected_epoch() {
        let cache = SessionCache::new(10, None);
        let now = Instant::now();
        let session = cache.create(false, false, 3, now).expect("room");
        assert!(session.id > 0);
        assert_eq!(cache.take_turn(session.id + 1, 1, false, now).err(), Some(ResponseError::FetchSessionIdNotFound));
        assert_eq!(cache.take_turn(session.id, 2, false, now).err(), Some(ResponseError::InvalidFetchSessionEpoch));
        assert_eq!(cache.take_turn(session.id, 1, true, now).err(), Some(ResponseError::FetchSessionTopicIdError));
        assert!(cache.take_turn(session.id, 1, false, now).is_ok());
        assert_eq!(
            cache.take_turn(session.id, 1, false, now).err(),
            Some(ResponseError::InvalidFetchSessionEpoch),
            "an epoch is used once: a repeated request is refused"
        );
        assert!(cache.take_turn(session.id, 2, false, now).is_ok());
        cache.remove(session.id);
        assert_eq!(cache.take_turn(session.id, 3, false, now).err(), Some(ResponseError::FetchSessionIdNotFound));
    }

    #[test]
    fn a_full_cache_evicts_a_stale_session_first_then_the_least_valuable() {
        let cache = SessionCache::new(2, None);
        let start = Instant::now();
        let big_consumer = cache.create(false, false, 100, start).unwrap();
        let small_consumer = cache.create(false, false, 5, start).unwrap();
        // Nothing stale: a smaller consumer session is not worth evicting anyone for.
        assert!(cache.create(false, false, 1, start).is_none());
        // A bigger one takes the place of the smallest.
        let medium = cache.create(false, false, 50, start).unwrap();
        assert_eq!(
            cache.take_turn(small_consumer.id, 1, false, start).err(),
            Some(ResponseError::FetchSessionIdNotFound)
        );
        // A follower's session outranks any consumer's.
        let follower = cache.create(true, false, 1, start).unwrap();
        assert_eq!(cache.take_turn(medium.id, 1, false, start).err(), Some(ResponseError::FetchSessionIdNotFound));
        assert_eq!(cache.len(), 2);
        // Two minutes unused: even a small consumer session takes the place of the follower's
        // if it went unused (the big consumer session is used now).
        let later = start + EVICTION_AFTER + Duration::from_secs(1);
        assert!(cache.take_turn(big_consumer.id, 1, false, later).is_ok());
        let small = cache.create(false, false, 1, later).unwrap();
        assert_eq!(cache.take_turn(follower.id, 1, false, later).err(), Some(ResponseError::FetchSessionIdNotFound));
        assert!(cache.take_turn(small.id, 1, false, later).is_ok());
    }

    #[test]
    fn no_slots_means_no_sessions() {
        let cache = SessionCache::new(0, None);
        assert!(cache.create(true, false, 10, Instant::now()).is_none());
    }

    #[test]
    fn forgotten_partitions_leave_and_their_slots_are_reused() {
        let mut partitions = Partitions::default();
        let a = partitions.upsert(key("t", 0), Some("t".into()), position(0));
        let b = partitions.upsert(key("t", 1), Some("t".into()), position(0));
        assert_eq!(partitions.upsert(key("t", 0), None, position(7)), a, "an update keeps its slot");
        assert_eq!(partitions.slot(a).map(|s| s.position.fetch_offset), Some(7));
        assert_eq!(partitions.len(), 2);
        assert!(partitions.forget(&key("t", 0)).is_some());
        assert!(partitions.forget(&key("t", 0)).is_none(), "forgetting twice is harmless");
        assert_eq!(partitions.len(), 1);
        let c = partitions.upsert(key("u", 0), Some("u".into()), position(0));
        assert_eq!(c, a, "the freed slot is reused");
        assert_eq!(partitions.all(), vec![a, b]);
        assert_eq!(partitions.unresolved().count(), 2, "nothing resolved yet");
    }

    #[test]
    fn an_unchanged_partition_is_omitted_and_any_change_or_error_is_sent() {
        let mut partitions = Partitions::default();
        let slot = partitions.upsert(key("t", 0), Some("t".into()), position(0));
        assert!(partitions.must_respond(slot, found(5)), "a new partition is always sent");
        assert!(!partitions.must_respond(slot, found(5)), "nothing changed: omitted");
        assert!(partitions.must_respond(slot, found(6)), "the high watermark moved");
        assert!(partitions.must_respond(slot, Found { last_stable_offset: 5, ..found(6) }), "the LSO moved");
        assert!(partitions.must_respond(slot, Found { last_stable_offset: 5, log_start_offset: 2, ..found(6) }));
        let same = Found { last_stable_offset: 5, log_start_offset: 2, ..found(6) };
        assert!(!partitions.must_respond(slot, same));
        assert!(partitions.must_respond(slot, Found { has_records: true, ..same }), "records are sent");
        assert!(partitions.must_respond(slot, Found { diverging: true, ..same }));
        assert!(partitions.must_respond(slot, Found { preferred_replica: true, ..same }));
        assert!(partitions.must_respond(slot, Found { has_error: true, ..same }), "errors are always sent");
        assert!(partitions.must_respond(slot, same), "after an error the partition is sent again");
        assert!(!partitions.must_respond(slot, same));
    }
}
