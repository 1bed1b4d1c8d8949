//! Delayed messages: the timer store. A message with a delivery time in the future is kept
//! here, not in its topic, and appended to its topic when it comes due (RocketMQ 5's timer
//! store; Kafka's purgatory is the in-memory cousin).
//!
//! - **The timer log** (`<data>/timer/log/`) is a log of the storage engine, local to this
//!   broker: each scheduled message is a record as it will be appended to its topic, plus the
//!   headers `headers::TARGET_TOPIC` (and `headers::TARGET_PARTITION` when the producer
//!   chose one), with its due time in `weir.delivery-timestamp`. A schedule is acknowledged once
//!   it is in this log as durably as the broker's `flush.policy` promises (the page cache, which
//!   survives `kill -9`, by default).
//! - **The wheel** ([`wheel`]) indexes the log by due time: minute slots on disk, the next few
//!   seconds in memory, so a million messages pending for a week cost little RAM.
//! - **Firing:** one task takes what is due, in (due time, offset) order, reads those records
//!   back, strips the timer headers and appends them to their topics (`acks=all`, at each
//!   partition's leader, see [`weir_broker::forward`]) with the firing time as their timestamp. A
//!   message without a chosen partition goes to the partitions this broker leads in turn.
//! - **The checkpoint** (`checkpoint.json`) says up to which log offset the wheel has every
//!   entry on disk and which (due time, offset) fired last. Start-up indexes the log's tail past
//!   the first again and skips every key at or below the second, so messages that came due while
//!   the broker was down fire at once, and fired ones do not fire again — except those fired
//!   in the last 100 ms (`CHECKPOINT_EVERY_MS`) before a crash (at least once, never lost).
//! - **Retention:** the log keeps everything from the smallest offset still pending.
//! - **Recall** ([`recall`]): a message recalled before it is due is settled at its due time
//!   without an append.
//!
//! Not yet: the timer store is not replicated; a broker's pending messages fire when that
//! broker runs.

pub mod recall;
pub mod wheel;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use weir_storage::records::{self, BatchOptions, Header, Record};
use weir_storage::sync::lock;
use weir_storage::{Clock, DeletionQueue, FlushPolicy, Log, LogConfig, OpenOptions};

pub use recall::Recall;
use recall::Recalls;
use weir_broker::message::headers::DELIVERY_TIMESTAMP;
use weir_broker::{Broker, BrokerError, ErrorKind};
use wheel::{Key, Wheel};

/// The timer's own headers, stripped when a message fires.
pub mod headers {
    /// The prefix of the timer's headers.
    pub const PREFIX: &str = "weir.timer.";
    /// The topic the message goes to.
    pub(crate) const TARGET_TOPIC: &str = "weir.timer.topic";
    /// The partition the producer chose, when it chose one (decimal).
    pub(crate) const TARGET_PARTITION: &str = "weir.timer.partition";
}

/// The segment size of the holding logs: what was dealt with stays on disk until its whole
/// segment has.
const TIMER_SEGMENT_BYTES: u64 = 64 << 20;

/// The config of a broker-local log that holds messages until they are dealt with (the timer
/// store's, the half messages'), from the broker's default topic config (its flush policy
/// applies): kept until dealt with, not by age or size (the owner trims it below what is
/// pending); one record of a 4 MiB body with its headers fits; small segments rolled hourly, so
/// what was dealt with goes promptly, a segment at a time.
pub(crate) fn holding_log_config(mut config: LogConfig) -> LogConfig {
    config.retention_ms = -1;
    config.retention_bytes = -1;
    config.max_message_bytes = config.max_message_bytes.max(8 << 20);
    config.segment_bytes = config.segment_bytes.min(TIMER_SEGMENT_BYTES);
    config.segment_ms = config.segment_ms.min(3_600_000);
    config
}

/// The most messages one firing round takes.
const ROUND_MAX: usize = 4096;
/// The largest batch a firing appends.
const FIRE_BATCH_BYTES: usize = 512 << 10;
/// How long the firing loop sleeps at most (it also wakes when a message is scheduled).
const IDLE_WAKE: Duration = Duration::from_secs(1);
/// How long it waits after an append failed (a leader away) before trying again.
const RETRY_WAIT: Duration = Duration::from_millis(500);
/// How often the checkpoint is fsynced and the log trimmed.
const MAINTENANCE_EVERY_MS: i64 = 1_000;
/// How often, at most, the checkpoint is written between those: a crash fires again what
/// fired since the last one (at least once, never lost).
const CHECKPOINT_EVERY_MS: i64 = 100;

/// What firing did with a due message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Appended,
    /// Given up: its topic is gone or refuses it for good.
    Dropped,
    /// Not appended now (its partition's leader is away, say): tried again shortly.
    Retry,
    /// Recalled before it came due: settled without an append.
    Recalled,
}

/// Failures no retry mends: the topic refuses the message as it is.
fn is_permanent(error: &BrokerError) -> bool {
    matches!(
        error.kind,
        ErrorKind::TooLarge
            | ErrorKind::InvalidRecord
            | ErrorKind::Corrupt
            | ErrorKind::InvalidTimestamp
            | ErrorKind::InvalidTopic
    )
}

/// About what a record takes in a batch.
fn record_bytes(record: &Option<Record>) -> usize {
    record.as_ref().map_or(0, |r| {
        let headers: usize = r.headers.iter().map(|h| h.name.len() + h.value.as_ref().map_or(0, |v| v.len()) + 4).sum();
        r.value.as_ref().map_or(0, |v| v.len()) + r.key.as_ref().map_or(0, |k| k.len()) + headers + 24
    })
}

/// `topic`'s `max.message.bytes`.
fn max_message_bytes(broker: &Broker, topic: &str) -> Option<usize> {
    let metadata = broker.metadata();
    let configs = &metadata.topic(topic)?.configs;
    weir_broker::topic_config::log_config(&broker.config.topic_defaults, configs)
        .ok()
        .map(|c| c.max_message_bytes as usize)
}

#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
struct Checkpoint {
    /// Every record of the log below this offset has its wheel entry on disk.
    indexed_through: i64,
    fired_due_ms: i64,
    fired_offset: i64,
}

/// Counters for metrics and the benchmark.
#[derive(Debug, Default)]
pub struct TimerStats {
    pub scheduled: AtomicU64,
    pub fired: AtomicU64,
    /// Messages dropped at firing because their topic was deleted meanwhile.
    pub dropped: AtomicU64,
    /// Messages recalled before they came due.
    pub recalled: AtomicU64,
    /// The largest lateness of a fired message so far (firing time less due time), ms.
    pub(crate) lateness_ms_max: AtomicI64,
}

/// The due messages of a firing round by target (topic, partition): indexes into the round.
type Routes = BTreeMap<(String, i32), Vec<usize>>;

pub struct TimerStore {
    dir: PathBuf,
    log: Log,
    deletion_queue: Arc<DeletionQueue>,
    /// Log appends and wheel additions happen together under this lock, so the log end is
    /// always wholly indexed when it is held.
    wheel: Mutex<Wheel>,
    /// Recalled messages and the keys being fired. Lock order: `wheel`, then `recalls`.
    recalls: Mutex<Recalls>,
    wake: tokio::sync::Notify,
    round_robin: AtomicU32,
    pub stats: TimerStats,
}

fn io_error(what: &str, path: &Path, e: impl std::fmt::Display) -> BrokerError {
    BrokerError::new(ErrorKind::Storage, format!("timer store: cannot {what} {}: {e}", path.display()))
}

/// A record's due time (its `weir.delivery-timestamp`).
pub fn due_ms(record: &Record) -> Option<i64> {
    let header = record.headers.iter().rev().find(|h| h.name == DELIVERY_TIMESTAMP)?;
    std::str::from_utf8(header.value.as_deref()?).ok()?.trim().parse().ok()
}

impl TimerStore {
    /// The directory under the data directory.
    pub const DIR: &'static str = "timer";

    /// Opens (or creates) the timer store of `data_dir`, indexing what the last run left
    /// unindexed. `config` is the broker's default topic config (its flush policy applies).
    /// Blocking.
    pub fn open(data_dir: &Path, config: LogConfig, clock: Arc<dyn Clock>) -> Result<TimerStore, BrokerError> {
        let dir = data_dir.join(Self::DIR);
        let config = holding_log_config(config);
        let deletion_queue = Arc::new(DeletionQueue::new());
        let log_dir = dir.join("log");
        let log = Log::open(&log_dir, config, clock.clone(), OpenOptions::default(), deletion_queue.clone())
            .map_err(BrokerError::from)?;
        let checkpoint_path = dir.join("checkpoint.json");
        let checkpoint = match std::fs::read(&checkpoint_path) {
            Ok(bytes) => {
                serde_json::from_slice::<Checkpoint>(&bytes).map_err(|e| io_error("read", &checkpoint_path, e))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Checkpoint { indexed_through: 0, fired_due_ms: i64::MIN, fired_offset: i64::MIN }
            }
            Err(e) => return Err(io_error("read", &checkpoint_path, e)),
        };
        let wheel_dir = dir.join("wheel");
        let now = clock.now_ms();
        // The log's tail that a crash may have left out of the wheel (or partly in it).
        let mut from = checkpoint.indexed_through.max(log.log_start_offset());
        let fired = (checkpoint.fired_due_ms, checkpoint.fired_offset);
        let (mut wheel, indexed) =
            Wheel::open_noting(&wheel_dir, fired, now, from).map_err(|e| io_error("open", &wheel_dir, e))?;
        let mut reindexed = 0;
        while from < log.log_end_offset() {
            let (records, next) = read_from(&log, from, 1 << 20)?;
            let entries: Vec<Key> = records
                .iter()
                .filter(|r| !indexed.contains(&r.offset))
                .map(|r| (due_ms(r).unwrap_or(now), r.offset))
                .collect();
            wheel.add(&entries).map_err(|e| io_error("index", &wheel_dir, e))?;
            reindexed += entries.len();
            if next <= from {
                break;
            }
            from = next;
        }
        let recalls = Recalls::open(&dir, fired).map_err(|e| io_error("read the recalls in", &dir, e))?;
        let store = TimerStore {
            dir,
            log,
            deletion_queue,
            wheel: Mutex::new(wheel),
            recalls: Mutex::new(recalls),
            wake: tokio::sync::Notify::new(),
            round_robin: AtomicU32::new(0),
            stats: TimerStats::default(),
        };
        store.write_checkpoint(true)?;
        let wheel = lock(&store.wheel);
        tracing::info!(pending = wheel.pending(), in_memory = wheel.in_memory(), reindexed, "timer store opened");
        drop(wheel);
        Ok(store)
    }

    /// How many messages wait (recalled ones not counted), and how many wheel entries are in
    /// memory.
    pub fn pending(&self) -> (u64, usize) {
        let wheel = lock(&self.wheel);
        let recalled = lock(&self.recalls).len() as u64;
        (wheel.pending().saturating_sub(recalled), wheel.in_memory())
    }

    /// Keeps `records` (each with its due time in `weir.delivery-timestamp`) until they are due,
    /// then appends them to `topic` (to `partition`, when given). Returns the first one's offset
    /// in the timer log once they are as durable as the flush policy promises.
    pub async fn schedule(
        self: &Arc<Self>,
        topic: &str,
        partition: Option<i32>,
        records: Vec<Record>,
    ) -> Result<i64, BrokerError> {
        if records.is_empty() {
            return Err(BrokerError::new(ErrorKind::InvalidRequest, "nothing to schedule"));
        }
        let mut dues = Vec::with_capacity(records.len());
        let mut stored = Vec::with_capacity(records.len());
        for mut record in records {
            let due = due_ms(&record).ok_or_else(|| {
                BrokerError::new(
                    ErrorKind::InvalidRecord,
                    format!("a scheduled record needs a {DELIVERY_TIMESTAMP} header"),
                )
            })?;
            dues.push(due);
            record.headers.retain(|h| !h.name.starts_with(headers::PREFIX));
            record.headers.push(Header::new(headers::TARGET_TOPIC, Some(Bytes::from(topic.to_string()))));
            if let Some(partition) = partition {
                record.headers.push(Header::new(headers::TARGET_PARTITION, Some(Bytes::from(partition.to_string()))));
            }
            stored.push(record);
        }
        let count = stored.len() as u64;
        // One batch per message: messages fire in due order, not in the order they came, so
        // each must be readable alone without decoding its neighbours.
        let mut batch = BytesMut::new();
        for record in &stored {
            let one = records::encode_batch(std::slice::from_ref(record), &BatchOptions::default())
                .map_err(|e| BrokerError::new(ErrorKind::InvalidRecord, e.to_string()))?;
            batch.extend_from_slice(&one);
        }
        let store = self.clone();
        let first = tokio::task::spawn_blocking(move || -> Result<i64, BrokerError> {
            let info = {
                let mut wheel = lock(&store.wheel);
                let info = store.log.append(&mut batch, 0).map_err(BrokerError::from)?;
                let entries: Vec<Key> =
                    dues.iter().enumerate().map(|(i, due)| (*due, info.first_offset + i as i64)).collect();
                wheel.add(&entries).map_err(|e| io_error("index", &store.dir, e))?;
                info
            };
            if store.log.config().flush == FlushPolicy::Sync {
                store.log.sync_to(info.last_offset + 1).map_err(BrokerError::from)?;
            }
            Ok(info.first_offset)
        })
        .await
        .map_err(|e| BrokerError::internal(e.to_string()))??;
        self.stats.scheduled.fetch_add(count, Ordering::Relaxed);
        self.wake.notify_one();
        Ok(first)
    }

    /// Fires due messages until the broker shuts down.
    pub fn start(self: &Arc<Self>, broker: &Arc<Broker>) {
        let (store, broker) = (self.clone(), Arc::downgrade(broker));
        tokio::spawn(async move { store.fire_loop(broker).await });
    }

    async fn fire_loop(self: Arc<Self>, broker: Weak<Broker>) {
        let Some(mut shutdown) = broker.upgrade().map(|b| b.shutdown_signal()) else { return };
        let mut last_maintenance = 0;
        let mut last_checkpoint = 0;
        // Due messages whose append failed for now (a leader away), and when to try again:
        // the others go on meanwhile.
        let mut held: HashMap<Key, i64> = HashMap::new();
        loop {
            let Some(broker) = broker.upgrade() else { return };
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
                        tracing::error!(error, "timer store: cannot load a slot of the wheel; trying again");
                        lock(&self.wheel).abort_advance(&to_load);
                    }
                }
            }
            let (due, wake_at) = {
                let wheel = lock(&self.wheel);
                let due = wheel.due_where(now, ROUND_MAX, |key| !waiting(key));
                // Claimed under the wheel's lock: a recall decides under it too.
                lock(&self.recalls).claim(&due);
                (due, wheel.next_wake_ms_where(|key| !waiting(key)))
            };
            if now - last_maintenance >= MAINTENANCE_EVERY_MS {
                last_maintenance = now;
                last_checkpoint = now;
                let store = self.clone();
                let _ = tokio::task::spawn_blocking(move || store.maintain()).await;
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
                // Cheap without an fsync, but a rename can still take tens of milliseconds
                // under writeback: at most every CHECKPOINT_EVERY_MS, off the async workers.
                if now - last_checkpoint >= CHECKPOINT_EVERY_MS {
                    last_checkpoint = now;
                    let store = self.clone();
                    let written = tokio::task::spawn_blocking(move || store.write_checkpoint(false)).await;
                    if let Ok(Err(e)) = written {
                        tracing::warn!(error = %e, "timer store: cannot write the checkpoint");
                    }
                }
                continue;
            }
            let retry = held.values().min().copied();
            let wake_at = wake_at.into_iter().chain(retry).min();
            let wait = wake_at.map_or(IDLE_WAKE, |at| Duration::from_millis((at - now).max(1) as u64).min(IDLE_WAKE));
            drop(broker);
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.wait_for(|down| *down) => {
                    // What fired since the last checkpoint must not fire again after a restart.
                    if let Err(e) = self.write_checkpoint(true) {
                        tracing::warn!(error = %e, "timer store: cannot write the checkpoint");
                    }
                    return;
                }
            }
        }
    }

    /// Records in the wheel what a firing round of `due` did. `first_held` is the smallest key
    /// still waiting to be tried again: the checkpoint may not pass it.
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
            let (store, offsets) = (self.clone(), offsets.clone());
            match tokio::task::spawn_blocking(move || read_at(&store.log, &offsets))
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
        // (topic, partition) → the indexes of its records in `due`.
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
            let header = |name: &str| {
                record
                    .headers
                    .iter()
                    .find(|h| h.name == name)
                    .and_then(|h| h.value.as_deref())
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            };
            let topic = header(headers::TARGET_TOPIC).unwrap_or_default();
            let chosen = header(headers::TARGET_PARTITION).and_then(|p| p.parse::<i32>().ok());
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

    /// Durably records the checkpoint, trims the log below what is pending, flushes on the
    /// `interval` policy.
    fn maintain(&self) {
        if let Err(e) = self.write_checkpoint(true) {
            tracing::warn!(error = %e, "timer store: cannot write the checkpoint");
        }
        if let Err(e) = lock(&self.recalls).compact() {
            tracing::warn!(error = %e, "timer store: cannot compact the recall notes");
        }
        let min_pending = lock(&self.wheel).min_pending_offset().unwrap_or_else(|| self.log.log_end_offset());
        if min_pending > self.log.log_start_offset() {
            let trimmed = self.log.delete_records_before(min_pending).and_then(|_| self.log.apply_retention());
            if let Err(e) = trimmed {
                tracing::warn!(error = %e, "timer store: cannot trim the log");
            }
        }
        if let Err(e) = self.log.flush_if_due() {
            tracing::warn!(error = %e, "timer store: cannot flush the log");
        }
        self.deletion_queue.remove_due(i64::MAX);
    }

    /// Writes the checkpoint; `durable` fsyncs it (else a rename, which survives `kill -9`).
    fn write_checkpoint(&self, durable: bool) -> Result<(), BrokerError> {
        let checkpoint = {
            let wheel = lock(&self.wheel);
            let (fired_due_ms, fired_offset) = wheel.fired_through();
            Checkpoint { indexed_through: self.log.log_end_offset(), fired_due_ms, fired_offset }
        };
        let path = self.dir.join("checkpoint.json");
        let bytes = serde_json::to_vec(&checkpoint).map_err(|e| BrokerError::internal(e.to_string()))?;
        if durable {
            weir_storage::write_atomically(&path, &bytes).map_err(|e| io_error("write", &path, e))
        } else {
            let tmp = self.dir.join("checkpoint.json.tmp");
            std::fs::write(&tmp, &bytes).map_err(|e| io_error("write", &tmp, e))?;
            std::fs::rename(&tmp, &path).map_err(|e| io_error("rename", &path, e))
        }
    }
}

/// A producer's batches for a DELAY topic, split by `split_delayed`.
#[derive(Debug)]
pub struct Split {
    /// The records whose delivery time is to come, for the timer.
    pub delayed: Vec<Record>,
    /// One batch of the others, to append now (`None` when every record was delayed).
    pub now: Option<BytesMut>,
}

/// Splits `batches` (as a producer sent them) into the records due later than `now_ms`, by
/// their `weir.delivery-timestamp` header, and the rest. `None` when no record is delayed: the
/// batches are appended as they are. A delivery time more than `max_delay_ms` away, or a
/// delayed record in an idempotent or transactional batch, is refused (the producer's sequence
/// numbers or transaction would no longer match what the partition holds; send delayed records
/// with `enable.idempotence=false`).
/// The timer as the data path's append sees it ([`weir_broker::delayed`]): a DELAY topic's
/// records that are not due go to the store, the others are appended at once.
pub(crate) struct Diversion {
    pub(crate) timer: Arc<TimerStore>,
    pub(crate) clock: Arc<dyn Clock>,
}

impl weir_broker::delayed::DelayedRecords for Diversion {
    fn divert<'a>(
        &'a self,
        partition: &'a weir_broker::Partition,
        records: BytesMut,
        max_delay_ms: i64,
    ) -> weir_broker::delayed::Diverted<'a> {
        Box::pin(async move {
            let Some(split) = split_delayed(&records, self.clock.now_ms(), max_delay_ms)? else {
                return Ok(Some(records));
            };
            self.timer.schedule(&partition.topic, Some(partition.index), split.delayed).await?;
            Ok(split.now)
        })
    }
}

pub(crate) fn split_delayed(batches: &[u8], now_ms: i64, max_delay_ms: i64) -> Result<Option<Split>, BrokerError> {
    let decoded =
        records::decode_batches(batches).map_err(|e| BrokerError::new(ErrorKind::InvalidRecord, e.to_string()))?;
    let refuse = |message: String| Err(BrokerError::new(ErrorKind::InvalidRecord, message));
    let mut delayed = Vec::new();
    let mut rest = Vec::new();
    for batch in decoded {
        let producer = batch.header.producer_id >= 0;
        for record in batch.records {
            match due_ms(&record) {
                Some(due) if due > now_ms => {
                    if due - now_ms > max_delay_ms {
                        return refuse(format!(
                            "a record's {DELIVERY_TIMESTAMP} is {} ms away; this topic takes at most {max_delay_ms} ms (message.delay.max.ms)",
                            due - now_ms
                        ));
                    }
                    if producer {
                        return refuse(format!(
                            "delayed records ({DELIVERY_TIMESTAMP} to come) need a producer without idempotence or transactions (enable.idempotence=false)"
                        ));
                    }
                    delayed.push(record);
                }
                _ => rest.push(record),
            }
        }
    }
    if delayed.is_empty() {
        return Ok(None);
    }
    let now = if rest.is_empty() {
        None
    } else {
        Some(
            records::encode_batch(&rest, &BatchOptions::default())
                .map_err(|e| BrokerError::new(ErrorKind::InvalidRecord, e.to_string()))?,
        )
    };
    Ok(Some(Split { delayed, now }))
}

/// The records of whole batches from `from` on (about `max_bytes`, at least one batch), and
/// where the next read starts.
fn read_from(log: &Log, from: i64, max_bytes: u64) -> Result<(Vec<Record>, i64), BrokerError> {
    let read = log.read(from, max_bytes, log.log_end_offset()).map_err(BrokerError::from)?;
    let Some(slice) = read.slice else { return Ok((Vec::new(), from)) };
    let bytes = slice.read_to_vec().map_err(BrokerError::from)?;
    let batches = records::decode_batches(&bytes).map_err(|e| BrokerError::new(ErrorKind::Corrupt, e.to_string()))?;
    let next = batches.last().map_or(from, |b| b.header.next_offset());
    let records = batches.into_iter().flat_map(|b| b.records).filter(|r| r.offset >= from).collect();
    Ok((records, next))
}

/// The records at `offsets` (`None` for one the log no longer has); neighbours share reads.
fn read_at(log: &Log, offsets: &[i64]) -> Result<Vec<Option<Record>>, BrokerError> {
    let mut cached: Vec<Record> = Vec::new();
    let mut cached_range = (0, 0);
    let mut out = Vec::with_capacity(offsets.len());
    for (index, &offset) in offsets.iter().enumerate() {
        if offset < log.log_start_offset() {
            out.push(None);
            continue;
        }
        if !(cached_range.0..cached_range.1).contains(&offset) {
            // Messages scheduled together and due together sit together: read ahead then. A
            // lone one is read alone (one batch).
            let run = offsets[index..].windows(2).take_while(|w| w[1] == w[0] + 1).count();
            let max_bytes = if run > 0 { 256 << 10 } else { 1 };
            let (records, next) = read_from(log, offset, max_bytes)?;
            cached_range = (offset, next);
            cached = records;
        }
        out.push(cached.binary_search_by_key(&offset, |r| r.offset).ok().map(|i| cached[i].clone()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_storage::SystemClock;

    fn delayed(due: i64, value: &'static [u8]) -> Record {
        let mut record = Record::new(1, None, Some(Bytes::from_static(value)));
        record.headers.push(Header::new(DELIVERY_TIMESTAMP, Some(Bytes::from(due.to_string()))));
        record
    }

    #[test]
    fn a_producers_batch_splits_into_the_delayed_records_and_the_others() {
        let plain = Record::new(1, None, Some(Bytes::from_static(b"now")));
        let past = delayed(500, b"past");
        let batch =
            records::encode_batch(&[plain, delayed(5_000, b"later"), past], &BatchOptions::default()).expect("encode");
        let split = split_delayed(&batch, 1_000, 60_000).expect("valid").expect("something delayed");
        assert_eq!(
            split.delayed.iter().map(|r| r.value.clone()).collect::<Vec<_>>(),
            vec![Some(Bytes::from_static(b"later"))]
        );
        let now = records::decode_records(&split.now.expect("the others")).expect("decode");
        let values: Vec<_> = now.iter().filter_map(|r| r.value.clone()).collect();
        assert_eq!(values, vec![Bytes::from_static(b"now"), Bytes::from_static(b"past")]);

        let nothing_delayed = records::encode_batch(&[delayed(999, b"x")], &BatchOptions::default()).expect("encode");
        assert!(split_delayed(&nothing_delayed, 1_000, 60_000).expect("valid").is_none());
        let all_delayed = records::encode_batch(&[delayed(2_000, b"x")], &BatchOptions::default()).expect("encode");
        assert!(split_delayed(&all_delayed, 1_000, 60_000).expect("valid").expect("delayed").now.is_none());
    }

    #[test]
    fn a_delay_past_the_limit_or_in_an_idempotent_batch_is_refused() {
        let batch = records::encode_batch(&[delayed(100_000, b"x")], &BatchOptions::default()).expect("encode");
        assert_eq!(split_delayed(&batch, 0, 60_000).map(|_| ()).map_err(|e| e.kind), Err(ErrorKind::InvalidRecord));
        let idempotent =
            BatchOptions { producer_id: 7, producer_epoch: 0, base_sequence: 0, ..BatchOptions::default() };
        let batch = records::encode_batch(&[delayed(2_000, b"x")], &idempotent).expect("encode");
        assert_eq!(split_delayed(&batch, 0, 60_000).map(|_| ()).map_err(|e| e.kind), Err(ErrorKind::InvalidRecord));
    }

    #[tokio::test]
    async fn scheduled_messages_are_pending_again_after_a_reopen_and_a_lost_wheel_is_rebuilt_from_the_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        let open =
            || Arc::new(TimerStore::open(dir.path(), LogConfig::default(), Arc::new(SystemClock)).expect("open"));
        let far = SystemClock.now_ms() + 3_600_000;
        {
            let store = open();
            let first =
                store.schedule("t", None, vec![delayed(far, b"a"), delayed(far + 1, b"b")]).await.expect("schedule");
            assert_eq!(first, 0);
            assert_eq!(store.pending(), (2, 0), "an hour away: on disk, not in memory");
            store.schedule("t", Some(3), vec![delayed(far, b"c")]).await.expect("schedule");
        }
        assert_eq!(open().pending().0, 3);
        // The wheel's files lost (as if a crash came before they were written): rebuilt.
        std::fs::remove_dir_all(dir.path().join("timer/wheel")).expect("remove the wheel");
        std::fs::write(
            dir.path().join("timer/checkpoint.json"),
            br#"{"indexed_through":0,"fired_due_ms":0,"fired_offset":0}"#,
        )
        .expect("checkpoint");
        let store = open();
        assert_eq!(store.pending().0, 3);
        let records = read_at(&store.log, &[0, 1, 2]).expect("read");
        let target = |r: &Option<Record>| {
            r.as_ref()
                .and_then(|r| r.headers.iter().find(|h| h.name == headers::TARGET_PARTITION).map(|h| h.value.clone()))
        };
        assert_eq!(
            records.iter().map(target).collect::<Vec<_>>(),
            vec![None, None, Some(Some(Bytes::from_static(b"3")))]
        );
    }
}
