//! One partition of `__delayed_messages` that this broker leads: its wheel, its recalls and the
//! task that fires what comes due (see the module above for the records it holds).
//!
//! **Invariants.**
//! - Every scheduled record below the partition's log end is in the wheel or covered by the
//!   fired mark: a record is appended and added to the wheel under the wheel's lock
//!   ([`TimerShard::schedule`]), and loading indexes the whole log.
//! - Only what the ISR has fires: a round stops at the first due key at or above the high
//!   watermark, so a message never fires that a new leader would not have.
//! - A fired note (the wheel's fired mark) is appended under the wheel's lock too, so the log
//!   orders it exactly against the schedules: every record before a note was in the wheel when
//!   the note's mark was read ([`load`] relies on it).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use weir_broker::{Broker, BrokerError, ErrorKind, Partition};
use weir_storage::records::{self, BatchOptions, Header, Record};
use weir_storage::sync::lock;

use super::recall::Recalls;
use super::wheel::{self, decode_entry, encode_entry, Key, Wheel};
use super::{
    due_ms, headers, is_permanent, max_message_bytes, record_bytes, Outcome, Routes, TimerStats, FIRE_BATCH_BYTES,
    IDLE_WAKE, RETRY_WAIT, ROUND_MAX,
};

/// How often, at most, the fired mark is noted in the log while messages fire: a failover fires
/// again what fired since the last note (at least once, never lost).
const NOTE_EVERY_MS: i64 = 100;
/// How often the log is trimmed below what is pending.
const MAINTENANCE_EVERY_MS: i64 = 1_000;
/// How long a round waits for its ISR to take a due message before looking again.
const REPLICATION_WAIT: Duration = Duration::from_millis(5);

/// The kinds of notes a shard's log holds beside scheduled messages (header [`headers::NOTE`]).
pub(super) const NOTE_FIRED: &[u8] = b"fired";
pub(super) const NOTE_RECALLED: &[u8] = b"recalled";
pub(super) const NOTE_RAISED: &[u8] = b"raised";

/// One shard of the timer store, loaded on the broker leading its partition.
pub struct TimerShard {
    pub(super) index: i32,
    pub(super) partition: Arc<Partition>,
    broker: Weak<Broker>,
    /// The wheel's slot files (this load's own directory).
    dir: PathBuf,
    /// Log appends and wheel additions happen together under this lock (the invariants above).
    pub(super) wheel: Mutex<Wheel>,
    /// Recalled messages and the keys being fired. Lock order: `wheel`, then `recalls`.
    pub(super) recalls: Mutex<Recalls>,
    wake: tokio::sync::Notify,
    /// Set when this broker stops leading the partition: the firing ends.
    stopped: AtomicBool,
    round_robin: AtomicU32,
    stats: Arc<TimerStats>,
}

fn io_error(what: &str, path: &Path, e: impl std::fmt::Display) -> BrokerError {
    BrokerError::new(ErrorKind::Storage, format!("timer store: cannot {what} {}: {e}", path.display()))
}

/// A note record: its kind and the key it is about.
pub(super) fn note(kind: &'static [u8], key: Key) -> BytesMut {
    let mut record = Record::new(0, None, Some(Bytes::copy_from_slice(&encode_entry(key))));
    record.headers.push(Header::new(headers::NOTE, Some(Bytes::from_static(kind))));
    records::encode_batch(&[record], &BatchOptions::default()).unwrap_or_default()
}

/// What a record of a shard's log is.
enum Entry {
    Scheduled(Key),
    Fired(Key),
    Recalled(i64),
    /// The key a scheduled message has in the wheel, when it is not its (due time, offset).
    Raised(Key),
}

fn entry_of(record: &Record, now: i64) -> Entry {
    let note = record.headers.iter().find(|h| h.name == headers::NOTE).and_then(|h| h.value.as_deref());
    let key = || record.value.as_deref().filter(|v| v.len() == wheel::ENTRY_BYTES).map(decode_entry);
    match (note, key()) {
        (Some(NOTE_FIRED), Some(key)) => Entry::Fired(key),
        (Some(NOTE_RECALLED), Some((_, offset))) => Entry::Recalled(offset),
        (Some(NOTE_RAISED), Some(key)) => Entry::Raised(key),
        _ => Entry::Scheduled((due_ms(record).unwrap_or(now), record.offset)),
    }
}

/// What a shard's log says is still to fire: the pending keys (as the wheel had them), the
/// recalled offsets among them, and the fired mark.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Replayed {
    pub(super) pending: Vec<Key>,
    pub(super) recalled: BTreeSet<i64>,
    pub(super) fired: Option<Key>,
}

/// Replays a shard's records (in offset order). A scheduled message fired when the last fired
/// mark covers its key in the wheel: its (due time, offset), or the key a raised note gives
/// when the wheel raised it (it was due already when it came). Exact: a key added after a note
/// sorts above that note's mark (the wheel raises what would not), and every key up to a mark
/// had fired when it was noted.
pub(super) fn replay(records: impl IntoIterator<Item = Record>, now: i64) -> Replayed {
    let mut keys: BTreeMap<i64, Key> = BTreeMap::new();
    let mut fired: Option<Key> = None;
    let mut recalled = BTreeSet::new();
    for record in records {
        match entry_of(&record, now) {
            Entry::Scheduled(key) => {
                keys.insert(key.1, key);
            }
            Entry::Raised(key) => {
                if let Some(stored) = keys.get_mut(&key.1) {
                    *stored = key;
                }
            }
            Entry::Fired(mark) => fired = fired.max(Some(mark)),
            Entry::Recalled(offset) => {
                recalled.insert(offset);
            }
        }
    }
    let mut pending: Vec<Key> = keys.into_values().filter(|key| fired.is_none_or(|mark| *key > mark)).collect();
    pending.sort_unstable();
    let offsets: BTreeSet<i64> = pending.iter().map(|(_, offset)| *offset).collect();
    recalled.retain(|offset| offsets.contains(offset));
    Replayed { pending, recalled, fired }
}

/// Loads shard `index` from its partition's log: the wheel is built again from the log (its
/// files are this load's own), with the recalls and the fired mark the notes leave. Blocking.
pub(super) fn load(
    broker: &Arc<Broker>,
    index: i32,
    partition: Arc<Partition>,
    stats: Arc<TimerStats>,
) -> Result<TimerShard, BrokerError> {
    let root = super::shards_dir(&broker.config.data_dir);
    let epoch = partition.check_local_leader()?.leader_epoch;
    // Earlier loads' wheels (another leadership, another run) describe a log that may have
    // changed since: never reused.
    if let Ok(entries) = std::fs::read_dir(&root) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.split('.').next() == Some(index.to_string().as_str()) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = root.join(format!("{index}.{epoch}"));
    let now = broker.now_ms();
    let all = crate::state_topic::read_log(broker, &partition)?;
    let replayed = replay(all, now);
    let fired = replayed.fired.unwrap_or((i64::MIN, i64::MIN));
    let mut wheel = Wheel::open_noting(&dir, fired, now, i64::MAX).map_err(|e| io_error("open", &dir, e))?.0;
    let stored = wheel.add(&replayed.pending).map_err(|e| io_error("index", &dir, e))?;
    let recalled: BTreeSet<Key> = stored.into_iter().filter(|(_, offset)| replayed.recalled.contains(offset)).collect();
    tracing::info!(
        shard = index,
        pending = wheel.pending(),
        recalled = recalled.len(),
        "timer store: loaded a partition of {}",
        super::TOPIC
    );
    Ok(TimerShard {
        index,
        partition,
        broker: Arc::downgrade(broker),
        dir,
        wheel: Mutex::new(wheel),
        recalls: Mutex::new(Recalls::new(recalled)),
        wake: tokio::sync::Notify::new(),
        stopped: AtomicBool::new(false),
        round_robin: AtomicU32::new(0),
        stats,
    })
}

impl TimerShard {
    /// How many messages wait (recalled ones not counted), and how many wheel entries are in
    /// memory.
    pub fn pending(&self) -> (u64, usize) {
        let wheel = lock(&self.wheel);
        let recalled = lock(&self.recalls).len() as u64;
        (wheel.pending().saturating_sub(recalled), wheel.in_memory())
    }

    /// Appends `batch` (one batch per scheduled message, due at `dues`) to the shard and indexes
    /// it; returns the first message's offset once the write counts (durable as the flush
    /// policy promises, and in the ISR).
    pub(super) async fn schedule(self: &Arc<Self>, batch: BytesMut, dues: Vec<i64>) -> Result<i64, BrokerError> {
        let count = dues.len() as u64;
        let broker = self.broker.upgrade().ok_or_else(|| BrokerError::internal("the broker is shutting down"))?;
        let shard = self.clone();
        let write = tokio::task::spawn_blocking(move || {
            let mut wheel = lock(&shard.wheel);
            if shard.stopped.load(Ordering::Acquire) {
                return Err(BrokerError::new(
                    ErrorKind::NotCoordinator,
                    format!("this broker no longer leads {}-{}", super::TOPIC, shard.index),
                ));
            }
            let write = broker.write_internal(&shard.partition, batch)?;
            let first = write.info.first_offset;
            let keys: Vec<Key> = dues.iter().enumerate().map(|(i, due)| (*due, first + i as i64)).collect();
            let stored = wheel.add(&keys).map_err(|e| io_error("index", &shard.dir, e))?;
            // A message due already sorts above the fired mark in the wheel: the log says so,
            // or a new leader could take it for fired (see `replay`).
            let mut last = write;
            for (key, stored) in keys.iter().zip(&stored).filter(|(key, stored)| key != stored) {
                debug_assert_eq!(key.1, stored.1);
                last = broker.write_internal(&shard.partition, note(NOTE_RAISED, *stored))?;
            }
            Ok((first, last))
        })
        .await
        .map_err(|e| BrokerError::internal(e.to_string()))??;
        let (first, last) = write;
        // The last write counts once everything up to it does.
        last.durable().await?;
        self.stats.scheduled.fetch_add(count, Ordering::Relaxed);
        self.wake.notify_one();
        Ok(first)
    }

    pub(super) fn stats(&self) -> &TimerStats {
        &self.stats
    }

    /// Stops the firing: this broker no longer leads the partition.
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    pub(super) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Fires due messages until stopped or the broker shuts down. Call within a tokio runtime.
    pub(super) fn start(self: &Arc<Self>) {
        let shard = self.clone();
        tokio::spawn(async move { shard.fire_loop().await });
    }

    async fn fire_loop(self: Arc<Self>) {
        let Some(mut shutdown) = self.broker.upgrade().map(|b| b.shutdown_signal()) else { return };
        let mut last_maintenance = 0;
        let mut last_note = 0;
        let mut noted = lock(&self.wheel).fired_through();
        // Due messages whose append failed for now (a leader away), and when to try again:
        // the others go on meanwhile.
        let mut held: HashMap<Key, i64> = HashMap::new();
        loop {
            if self.is_stopped() {
                return;
            }
            let Some(broker) = self.broker.upgrade() else { return };
            let now = broker.now_ms();
            let waiting = |key: &Key| held.get(key).is_some_and(|at| *at > now);
            // Slots coming near are read without holding the wheel: scheduling goes on.
            let to_load = Arc::new(lock(&self.wheel).begin_advance(now));
            if !to_load.is_empty() {
                let slots = to_load.clone();
                let loaded = tokio::task::spawn_blocking(move || wheel::load_slots(&slots))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|read| read.map_err(|e| e.to_string()));
                match loaded {
                    Ok(loaded) => lock(&self.wheel).install(loaded),
                    Err(error) => {
                        if self.is_stopped() {
                            return;
                        }
                        tracing::error!(error, "timer store: cannot load a slot of the wheel; trying again");
                        lock(&self.wheel).abort_advance(&to_load);
                    }
                }
            }
            // What the ISR has: a round stops at the first due key above it (the invariant).
            let committed = self.partition.log.high_watermark();
            let (due, wake_at, unreplicated) = {
                let wheel = lock(&self.wheel);
                let mut due = wheel.due_where(now, ROUND_MAX, |key| !waiting(key));
                let replicated = due.iter().take_while(|(_, offset)| *offset < committed).count();
                let unreplicated = replicated < due.len();
                due.truncate(replicated);
                // Claimed under the wheel's lock: a recall decides under it too.
                lock(&self.recalls).claim(&due);
                (due, wheel.next_wake_ms_where(|key| !waiting(key)), unreplicated)
            };
            if now - last_maintenance >= MAINTENANCE_EVERY_MS {
                last_maintenance = now;
                self.maintain(&broker).await;
            }
            if !due.is_empty() {
                let outcomes = self.fire(&broker, &due).await;
                let retry_at = broker.now_ms() + RETRY_WAIT.as_millis() as i64;
                for (key, outcome) in due.iter().zip(&outcomes) {
                    match outcome {
                        Outcome::Retry => held.insert(*key, retry_at),
                        Outcome::Appended | Outcome::Dropped | Outcome::Recalled => held.remove(key),
                    };
                }
                self.settle(&due, &outcomes, held.keys().min().copied(), now);
                if now - last_note >= NOTE_EVERY_MS {
                    last_note = now;
                    noted = self.note_fired(&broker, noted).await;
                }
                continue;
            }
            let retry = held.values().min().copied();
            let wake_at = wake_at.into_iter().chain(retry).min();
            let mut wait =
                wake_at.map_or(IDLE_WAKE, |at| Duration::from_millis((at - now).max(1) as u64).min(IDLE_WAKE));
            if unreplicated {
                wait = wait.min(REPLICATION_WAIT);
            }
            // What fired since the last note is noted before the loop sleeps.
            if lock(&self.wheel).fired_through() != noted {
                last_note = now;
                noted = self.note_fired(&broker, noted).await;
            }
            drop(broker);
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.wait_for(|down| *down) => return,
            }
        }
    }

    /// Appends the wheel's fired mark to the log when it moved past `noted`; returns the mark
    /// noted. Not waited for: a note lost in a failover only fires messages again.
    async fn note_fired(self: &Arc<Self>, broker: &Arc<Broker>, noted: Key) -> Key {
        let (shard, broker) = (self.clone(), broker.clone());
        let written = tokio::task::spawn_blocking(move || {
            let wheel = lock(&shard.wheel);
            let mark = wheel.fired_through();
            if mark <= noted {
                return Ok(noted);
            }
            // Under the wheel's lock: ordered exactly against the schedules (the invariant).
            broker.write_internal(&shard.partition, note(NOTE_FIRED, mark)).map(|_| mark)
        })
        .await;
        match written {
            Ok(Ok(mark)) => mark,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, shard = self.index, "timer store: cannot note the fired mark");
                noted
            }
            Err(_) => noted,
        }
    }

    /// Records in the wheel what a firing round of `due` did. `first_held` is the smallest key
    /// still waiting to be tried again: the fired mark may not pass it.
    fn settle(&self, due: &[Key], outcomes: &[Outcome], first_held: Option<Key>, now: i64) {
        let done: Vec<Key> =
            due.iter().zip(outcomes).filter(|(_, o)| **o != Outcome::Retry).map(|(key, _)| *key).collect();
        let recalled: Vec<Key> =
            due.iter().zip(outcomes).filter(|(_, o)| **o == Outcome::Recalled).map(|(key, _)| *key).collect();
        // Keys fire in order, so what fired below the first key still waiting is a prefix.
        let through = due
            .iter()
            .zip(outcomes)
            .take_while(|(key, outcome)| **outcome != Outcome::Retry && first_held.is_none_or(|held| **key < held))
            .last()
            .map(|(key, _)| *key);
        // Fired: appended, or given up on (a recall is no firing).
        let fired = due.iter().zip(outcomes).filter(|(_, o)| **o == Outcome::Appended || **o == Outcome::Dropped);
        let lateness = fired.clone().map(|((due, _), _)| now - due).max().unwrap_or(0);
        self.stats.lateness_ms_max.fetch_max(lateness, Ordering::Relaxed);
        self.stats.fired.fetch_add(fired.count() as u64, Ordering::Relaxed);
        let mut wheel = lock(&self.wheel);
        let through = through.unwrap_or(wheel.fired_through());
        if let Err(e) = wheel.fired(&done, through) {
            tracing::warn!(error = %e, "timer store: cannot delete a fired slot file");
        }
        let mut recalls = lock(&self.recalls);
        if cfg!(debug_assertions) {
            let fired: Vec<Key> = due
                .iter()
                .zip(outcomes)
                .filter(|(_, o)| **o == Outcome::Appended || **o == Outcome::Dropped)
                .map(|(key, _)| *key)
                .collect();
            recalls.check_invariants(&fired);
        }
        recalls.settle(&recalled);
    }

    /// Fires `due` (keys in order): what became of each.
    async fn fire(self: &Arc<Self>, broker: &Arc<Broker>, due: &[Key]) -> Vec<Outcome> {
        // The round claimed `due`: no recall of them comes in meanwhile.
        let recalled: Vec<bool> = {
            let recalls = lock(&self.recalls);
            due.iter().map(|key| recalls.is_recalled(key)).collect()
        };
        let offsets: Vec<i64> =
            due.iter().zip(&recalled).filter(|(_, recalled)| !**recalled).map(|((_, offset), _)| *offset).collect();
        let records = {
            let (shard, offsets) = (self.clone(), offsets.clone());
            match tokio::task::spawn_blocking(move || super::read_at(&shard.partition.log, &offsets))
                .await
                .unwrap_or_else(|e| Err(BrokerError::internal(e.to_string())))
            {
                Ok(records) => records,
                Err(e) => {
                    tracing::error!(error = %e, "timer store: cannot read scheduled messages back");
                    return vec![Outcome::Retry; due.len()];
                }
            }
        };
        let now = broker.now_ms();
        let mut outcomes = vec![Outcome::Retry; due.len()];
        let (groups, fired) = self.route_fired(broker, due, &recalled, records, now, &mut outcomes);
        for ((topic, partition), indexes) in groups {
            self.append_fired(broker, &topic, partition, &indexes, &fired, &mut outcomes).await;
        }
        outcomes
    }

    /// Where each message of `due` goes, read back as `records` (those not recalled, in
    /// order): its target topic and partition (the record made ready to append: its own
    /// headers removed, stamped `now`), or its outcome in `outcomes` (recalled, gone from the
    /// log, or its topic gone). Returns the indexes into `due` by (topic, partition), and the
    /// records by index.
    fn route_fired(
        &self,
        broker: &Broker,
        due: &[Key],
        recalled: &[bool],
        records: Vec<Option<Record>>,
        now: i64,
        outcomes: &mut [Outcome],
    ) -> (Routes, Vec<Option<Record>>) {
        let mut groups = Routes::new();
        let mut fired_records: Vec<Option<Record>> = Vec::with_capacity(due.len());
        let mut records = records.into_iter();
        for index in 0..due.len() {
            if recalled[index] {
                outcomes[index] = Outcome::Recalled;
                fired_records.push(None);
                continue;
            }
            let Some(mut record) = records.next().flatten() else {
                tracing::warn!(offset = due[index].1, "timer store: a scheduled message is gone from the log");
                outcomes[index] = Outcome::Dropped;
                fired_records.push(None);
                continue;
            };
            let (topic, chosen) = super::target_of(&record);
            match self.partition_for(broker, &topic, chosen) {
                Some(partition) => {
                    record.headers.retain(|h| !h.name.starts_with(headers::PREFIX));
                    record.timestamp = now;
                    groups.entry((topic, partition)).or_default().push(index);
                }
                None => {
                    tracing::warn!(topic, "timer store: dropping a scheduled message: its topic no longer exists");
                    self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                    outcomes[index] = Outcome::Dropped;
                }
            }
            fired_records.push(Some(record));
        }
        (groups, fired_records)
    }

    /// Appends the due messages `indexes` (into `fired`) to `topic`-`partition`, in batches the
    /// topic takes, and records each one's outcome.
    async fn append_fired(
        &self,
        broker: &Arc<Broker>,
        topic: &str,
        partition: i32,
        indexes: &[usize],
        fired: &[Option<Record>],
        outcomes: &mut [Outcome],
    ) {
        // Batches the topic takes: half its max.message.bytes (room for the batch's own
        // framing), at most FIRE_BATCH_BYTES.
        let batch_bytes =
            max_message_bytes(broker, topic).map_or(FIRE_BATCH_BYTES, |max| (max / 2).min(FIRE_BATCH_BYTES));
        let mut start = 0;
        while start < indexes.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < indexes.len() && (end == start || bytes + record_bytes(&fired[indexes[end]]) <= batch_bytes) {
                bytes += record_bytes(&fired[indexes[end]]);
                end += 1;
            }
            let chunk: Vec<Record> = indexes[start..end].iter().filter_map(|i| fired[*i].clone()).collect();
            let appended = match records::encode_batch(&chunk, &BatchOptions::default()) {
                Ok(batch) => broker.append_at_leader(topic, partition, batch).await,
                Err(e) => Err(BrokerError::new(ErrorKind::InvalidRecord, e.to_string())),
            };
            let outcome = match appended {
                Ok(_) => Outcome::Appended,
                // The topic will never take it (its limits changed since it was scheduled).
                Err(e) if is_permanent(&e) => {
                    tracing::warn!(topic, partition, count = end - start, error = %e,
                        "timer store: dropping due messages their topic refuses");
                    self.stats.dropped.fetch_add((end - start) as u64, Ordering::Relaxed);
                    Outcome::Dropped
                }
                Err(e) => {
                    tracing::warn!(topic, partition, error = %e, "timer store: cannot append due messages yet");
                    Outcome::Retry
                }
            };
            indexes[start..end].iter().for_each(|i| outcomes[*i] = outcome);
            start = end;
        }
    }

    /// Where a due message of `topic` goes: the producer's partition, else the partitions this
    /// broker leads in turn (else all of them). `None` when the topic is gone.
    fn partition_for(&self, broker: &Broker, topic: &str, chosen: Option<i32>) -> Option<i32> {
        if let Some(partition) = chosen {
            let count = broker.metadata().topic(topic).map(|t| t.partitions)?;
            return (partition < count).then_some(partition);
        }
        broker.partition_in_turn(topic, self.round_robin.fetch_add(1, Ordering::Relaxed) as usize)
    }

    /// Trims the log below what is pending. The fired mark's note must stay: when the last one
    /// is below the trimming point it is noted again first (and waited for), so a new leader
    /// always finds the mark.
    async fn maintain(self: &Arc<Self>, broker: &Arc<Broker>) {
        let log = &self.partition.log;
        let committed = log.high_watermark();
        let target = lock(&self.wheel).min_pending_offset().unwrap_or(committed).min(committed);
        if target <= log.log_start_offset() {
            return;
        }
        let (shard, broker) = (self.clone(), broker.clone());
        let trimmed = async move {
            let write = {
                let (shard, broker) = (shard.clone(), broker.clone());
                tokio::task::spawn_blocking(move || {
                    let wheel = lock(&shard.wheel);
                    let mark = wheel.fired_through();
                    if mark == (i64::MIN, i64::MIN) {
                        return Ok(None);
                    }
                    broker.write_internal(&shard.partition, note(NOTE_FIRED, mark)).map(Some)
                })
                .await
                .map_err(|e| BrokerError::internal(e.to_string()))??
            };
            if let Some(write) = write {
                write.durable().await?;
            }
            let partition = shard.partition.clone();
            tokio::task::spawn_blocking(move || {
                broker.delete_records(&partition, target)?;
                partition.log.apply_retention().map_err(BrokerError::from)
            })
            .await
            .map_err(|e| BrokerError::internal(e.to_string()))?
        };
        if let Err(e) = trimmed.await {
            tracing::debug!(error = %e, shard = self.index, "timer store: cannot trim the log yet");
        }
    }
}

impl Drop for TimerShard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_broker::message::headers::DELIVERY_TIMESTAMP;

    fn scheduled(offset: i64, due: i64) -> Record {
        let mut record = Record::new(0, None, Some(Bytes::from_static(b"m")));
        record.offset = offset;
        record.headers.push(Header::new(DELIVERY_TIMESTAMP, Some(Bytes::from(due.to_string()))));
        record
    }

    fn noted(offset: i64, kind: &'static [u8], key: Key) -> Record {
        let mut record = records::decode_records(&note(kind, key)).expect("decode").remove(0);
        record.offset = offset;
        record
    }

    #[test]
    fn a_replay_keeps_what_the_fired_mark_does_not_cover_and_the_recalls_of_those() {
        let log = vec![
            scheduled(0, 1_000),
            scheduled(1, 5_000),
            scheduled(2, 2_000),
            noted(3, NOTE_FIRED, (1_000, 0)),
            noted(4, NOTE_RECALLED, (5_000, 1)),
            noted(5, NOTE_FIRED, (2_000, 2)),
            scheduled(6, 3_000),
            noted(7, NOTE_RECALLED, (1_000, 0)),
        ];
        let replayed = replay(log, 0);
        assert_eq!(replayed.fired, Some((2_000, 2)));
        assert_eq!(replayed.pending, vec![(3_000, 6), (5_000, 1)]);
        // The recall of a message that fired is moot; the other stays.
        assert_eq!(replayed.recalled, BTreeSet::from([1]));
    }

    #[test]
    fn a_message_the_wheel_raised_above_the_mark_is_judged_by_its_raised_key() {
        // Scheduled at offset 3 when it was due already (1,500, below the mark 2,000): the
        // wheel raised it to 2,001, which the first mark does not cover and the second does.
        let log = vec![
            scheduled(0, 2_000),
            noted(1, NOTE_FIRED, (2_000, 0)),
            scheduled(2, 1_500),
            noted(3, NOTE_RAISED, (2_001, 2)),
        ];
        assert_eq!(replay(log.clone(), 0).pending, vec![(2_001, 2)]);
        let mut fired_too = log;
        fired_too.push(noted(4, NOTE_FIRED, (2_001, 2)));
        assert_eq!(replay(fired_too, 0).pending, Vec::<Key>::new());
    }
}
