//! Moves the broker-local half messages of earlier versions into `__half_messages`, once.
//!
//! Before the half messages were replicated, each broker kept them in `<data>/half/`: a log
//! (`log/`) of the messages and a journal (`journal.jsonl`) of their states. At the first start
//! of this version each message still pending there is prepared again in a shard (checked with
//! a producer of its topic at once, since its old transaction id names nothing now), and one
//! its producer had committed is committed again (appended to its topic); then the old files
//! are removed. A crash in the middle resumes after the last message noted in
//! `migration.json`: a message prepared but not noted is prepared twice (its producer is asked
//! about each; a commit of both delivers it twice).

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use weir_broker::{Broker, BrokerError, ErrorKind};
use weir_storage::records::{self, Record};
use weir_storage::{DeletionQueue, Log, OpenOptions};

use super::service::PrepareRequest;
use super::store::{Line, Pending};
use super::TransactionalMessages;

#[derive(serde::Serialize, serde::Deserialize)]
struct Progress {
    /// Every pending message at or below this offset of the old log was moved.
    done_through: i64,
}

fn legacy_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("half")
}

fn storage(what: &str, path: &Path, e: impl std::fmt::Display) -> BrokerError {
    BrokerError::new(ErrorKind::Storage, format!("half messages migration: cannot {what} {}: {e}", path.display()))
}

/// What the old journal says is pending. Blocking.
fn pending(dir: &Path) -> Result<BTreeMap<i64, Pending>, BrokerError> {
    let path = dir.join("journal.jsonl");
    let mut pending = BTreeMap::new();
    let file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(pending),
        Err(e) => return Err(storage("open", &path, e)),
    };
    for line in std::io::BufReader::new(file).split(b'\n') {
        let line = line.map_err(|e| storage("read", &path, e))?;
        match serde_json::from_slice::<Line>(&line) {
            Ok(Line::Set { offset, pending: p }) => {
                pending.insert(offset, p);
            }
            Ok(Line::Done { offset }) => {
                pending.remove(&offset);
            }
            // A torn last line (a crash mid-write) was never acknowledged.
            Err(_) => {}
        }
    }
    Ok(pending)
}

fn read(log: &Log, offset: i64) -> Result<Option<Record>, BrokerError> {
    let read = log.read(offset, 1, log.log_end_offset()).map_err(BrokerError::from)?;
    let Some(slice) = read.slice else { return Ok(None) };
    let bytes = slice.read_to_vec().map_err(BrokerError::from)?;
    let batches = records::decode_batches(&bytes).map_err(|e| BrokerError::new(ErrorKind::Corrupt, e.to_string()))?;
    Ok(batches.into_iter().flat_map(|b| b.records).find(|r| r.offset == offset))
}

/// Moves the old store of `broker`'s data directory, if there is one; tries again until it is
/// done or the broker shuts down. Call within a tokio runtime.
pub(crate) fn spawn(broker: &Arc<Broker>, transactions: &Arc<TransactionalMessages>) {
    if !legacy_dir(&broker.config.data_dir).join("log").is_dir() {
        return;
    }
    let transactions = transactions.clone();
    crate::state_topic::spawn_migration(broker, "half messages", move |broker| {
        let transactions = transactions.clone();
        async move { migrate(&broker, &transactions).await }
    });
}

async fn migrate(broker: &Arc<Broker>, transactions: &Arc<TransactionalMessages>) -> Result<usize, BrokerError> {
    let dir = legacy_dir(&broker.config.data_dir);
    let config = weir_broker::topic_config::log_config(&broker.config.topic_defaults, &BTreeMap::new())
        .map_err(|e| BrokerError::new(ErrorKind::InvalidConfig, e.message))?;
    let config = crate::timer::holding_log_config(config);
    let log =
        Log::open(&dir.join("log"), config, broker.clock(), OpenOptions::default(), Arc::new(DeletionQueue::new()))
            .map_err(BrokerError::from)?;
    let progress_path = dir.join("migration.json");
    let done_through = match std::fs::read(&progress_path) {
        Ok(bytes) => {
            serde_json::from_slice::<Progress>(&bytes).map_err(|e| storage("read", &progress_path, e))?.done_through
        }
        Err(_) => -1,
    };
    let mut moved = 0;
    for (offset, old) in pending(&dir)?.into_iter().filter(|(offset, _)| *offset > done_through) {
        let Some(record) = read(&log, offset)? else { continue };
        let request = PrepareRequest {
            shard: 0,
            topic: old.topic.clone(),
            message_id: old.message_id.clone(),
            check_at_ms: broker.now_ms(),
        };
        let (_, transaction_id) = transactions.prepare_record(request, record).await?;
        if old.committing {
            transactions.end(&transaction_id, &old.message_id, true).await.map_err(|e| match e {
                super::EndError::NotOpen(e) | super::EndError::Failed(e) => e,
            })?;
        }
        moved += 1;
        let bytes =
            serde_json::to_vec(&Progress { done_through: offset }).map_err(|e| BrokerError::internal(e.to_string()))?;
        weir_storage::write_atomically(&progress_path, &bytes).map_err(|e| storage("write", &progress_path, e))?;
    }
    drop(log);
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(storage("remove", &dir, e)),
        _ => Ok(moved),
    }
}
