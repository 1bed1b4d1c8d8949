//! Moves the broker-local timer store of earlier versions into `__delayed_messages`, once.
//!
//! Before the timer store was replicated, each broker kept its delayed messages in
//! `<data>/timer/`: a log (`log/`), a wheel of slot files (`wheel/`), a checkpoint
//! (`checkpoint.json`: up to which offset the wheel had every entry, and the last key fired)
//! and the recalled keys (`recalled`). At the first start of this version the messages still
//! pending there (in the wheel or in the log's unindexed tail, above the fired key, not
//! recalled) are scheduled again through [`Timer::schedule`], in offset order, with their
//! target and due time, and the old files are removed.
//!
//! A crash in the middle resumes after the last batch noted in `migration.json`: a batch
//! scheduled but not noted is scheduled again (at least once, never lost). A recall handle
//! given before the upgrade names the old store and no longer recalls anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use weir_broker::{Broker, BrokerError, ErrorKind};
use weir_storage::records::Record;
use weir_storage::{DeletionQueue, Log, OpenOptions};

use super::wheel::{self, decode_entry, Key, ENTRY_BYTES};
use super::{due_ms, holding_log_config, read_at, read_from, target_of, Timer};

/// How many messages one schedule of the migration carries at most.
const BATCH: usize = 256;

#[derive(serde::Deserialize)]
struct Checkpoint {
    indexed_through: i64,
    fired_due_ms: i64,
    fired_offset: i64,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Progress {
    /// Every pending message at or below this offset of the old log was scheduled again.
    done_through: i64,
}

fn legacy_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(Timer::DIR)
}

/// Whether `data_dir` holds a timer store of an earlier version.
pub fn has_legacy_store(data_dir: &Path) -> bool {
    legacy_dir(data_dir).join("log").is_dir()
}

fn storage(what: &str, path: &Path, e: impl std::fmt::Display) -> BrokerError {
    BrokerError::new(ErrorKind::Storage, format!("timer store migration: cannot {what} {}: {e}", path.display()))
}

/// The keys of the old store still to fire, by offset. Blocking.
fn pending_keys(dir: &Path, log: &Log, now: i64) -> Result<BTreeMap<i64, Key>, BrokerError> {
    let checkpoint_path = dir.join("checkpoint.json");
    let checkpoint = match std::fs::read(&checkpoint_path) {
        Ok(bytes) => serde_json::from_slice::<Checkpoint>(&bytes).map_err(|e| storage("read", &checkpoint_path, e))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Checkpoint { indexed_through: 0, fired_due_ms: i64::MIN, fired_offset: i64::MIN }
        }
        Err(e) => return Err(storage("read", &checkpoint_path, e)),
    };
    let fired = (checkpoint.fired_due_ms, checkpoint.fired_offset);
    // The wheel's slot files hold the keys as the wheel had them (raised ones included).
    let wheel_dir = dir.join("wheel");
    let mut slots = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&wheel_dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "slot") {
                slots.push((0, path));
            }
        }
    }
    let in_wheel = wheel::load_slots(&slots).map_err(|e| storage("read", &wheel_dir, e))?;
    let mut pending: BTreeMap<i64, Key> =
        in_wheel.into_iter().filter(|key| *key > fired).map(|key| (key.1, key)).collect();
    // The log's tail past the checkpoint may be missing from the wheel (a crash).
    let mut from = checkpoint.indexed_through.max(log.log_start_offset());
    while from < log.log_end_offset() {
        let (records, next) = read_from(log, from, 1 << 20)?;
        for record in &records {
            let key = (due_ms(record).unwrap_or(now), record.offset);
            if key > fired {
                pending.entry(record.offset).or_insert(key);
            }
        }
        if next <= from {
            break;
        }
        from = next;
    }
    let recalled_path = dir.join("recalled");
    let recalled: BTreeSet<Key> = match std::fs::read(&recalled_path) {
        Ok(bytes) => bytes.chunks_exact(ENTRY_BYTES).map(decode_entry).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeSet::new(),
        Err(e) => return Err(storage("read", &recalled_path, e)),
    };
    pending.retain(|_, key| !recalled.contains(key));
    Ok(pending)
}

/// Moves the old store of `broker`'s data directory into `timer`, if there is one; tries
/// again until it is done or the broker shuts down. Call within a tokio runtime.
pub(crate) fn spawn(broker: &Arc<Broker>, timer: &Arc<Timer>) {
    if !has_legacy_store(&broker.config.data_dir) {
        return;
    }
    let timer = timer.clone();
    crate::state_topic::spawn_migration(broker, "timer store", move |broker| {
        let timer = timer.clone();
        async move { migrate(&broker, &timer).await }
    });
}

async fn migrate(broker: &Arc<Broker>, timer: &Arc<Timer>) -> Result<usize, BrokerError> {
    let dir = legacy_dir(&broker.config.data_dir);
    let config = weir_broker::topic_config::log_config(&broker.config.topic_defaults, &BTreeMap::new())
        .map_err(|e| BrokerError::new(ErrorKind::InvalidConfig, e.message))?;
    let (log_dir, clock) = (dir.join("log"), broker.clock());
    let log = Arc::new(
        Log::open(&log_dir, holding_log_config(config), clock, OpenOptions::default(), Arc::new(DeletionQueue::new()))
            .map_err(BrokerError::from)?,
    );
    let progress_path = dir.join("migration.json");
    let done_through = match std::fs::read(&progress_path) {
        Ok(bytes) => {
            serde_json::from_slice::<Progress>(&bytes).map_err(|e| storage("read", &progress_path, e))?.done_through
        }
        Err(_) => -1,
    };
    let now = broker.now_ms();
    let pending = {
        let (dir, log) = (dir.clone(), log.clone());
        tokio::task::spawn_blocking(move || pending_keys(&dir, &log, now))
            .await
            .map_err(|e| BrokerError::internal(e.to_string()))??
    };
    let offsets: Vec<i64> = pending.keys().copied().filter(|offset| *offset > done_through).collect();
    let mut moved = 0;
    for chunk in offsets.chunks(BATCH) {
        let records = {
            let (log, chunk) = (log.clone(), chunk.to_vec());
            tokio::task::spawn_blocking(move || read_at(&log, &chunk))
                .await
                .map_err(|e| BrokerError::internal(e.to_string()))??
        };
        // Consecutive messages of one target go in one schedule.
        let mut run: Vec<Record> = Vec::new();
        let mut run_target: Option<(String, Option<i32>)> = None;
        for record in records.into_iter().flatten() {
            let this = target_of(&record);
            if run_target.as_ref().is_some_and(|t| *t != this) {
                if let Some((topic, partition)) = run_target.take() {
                    moved += run.len();
                    timer.schedule(&topic, partition, std::mem::take(&mut run)).await?;
                }
            }
            run_target = Some(this);
            run.push(record);
        }
        if let Some((topic, partition)) = run_target.take() {
            moved += run.len();
            timer.schedule(&topic, partition, run).await?;
        }
        let last = chunk.last().copied().unwrap_or(done_through);
        let bytes =
            serde_json::to_vec(&Progress { done_through: last }).map_err(|e| BrokerError::internal(e.to_string()))?;
        weir_storage::write_atomically(&progress_path, &bytes).map_err(|e| storage("write", &progress_path, e))?;
    }
    drop(log);
    for name in ["log", "wheel"] {
        match std::fs::remove_dir_all(dir.join(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(storage("remove", &dir.join(name), e)),
            _ => {}
        }
    }
    for name in ["checkpoint.json", "recalled", "migration.json"] {
        match std::fs::remove_file(dir.join(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(storage("remove", &dir.join(name), e)),
            _ => {}
        }
    }
    Ok(moved)
}
