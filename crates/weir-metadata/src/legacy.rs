//! The metadata log of Weir 0.1, read once to move a data directory to the Raft quorum.
//!
//! Weir 0.1 kept the metadata in `<data>/__cluster_metadata/log` (a partition log of JSON
//! `MetadataRecord`s, fsynced per append) plus `snapshot.json`. At the first start of this
//! version the broker loads that state ([`load`]), proposes it to the quorum as one
//! `RestoreLegacy` record, and once that is committed retires the old files ([`retire`]), so the
//! next start reads the quorum's log only.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use weir_storage::{Clock, DeletionQueue, FlushPolicy, Log, LogConfig, OpenOptions, StorageError};

use super::{MetadataRecord, MetadataState};
use weir_storage::internal_records;

pub const METADATA_DIR: &str = "__cluster_metadata";
const LOG_DIR: &str = "log";
const SNAPSHOT_FILE: &str = "snapshot.json";
/// Where [`retire`] moves the old log and snapshot (kept for an operator, never read again).
const RETIRED_SUFFIX: &str = "v0-migrated";

#[derive(Debug, thiserror::Error)]
pub enum LegacyError {
    #[error("legacy metadata log: {0}")]
    Storage(#[from] StorageError),
    #[error("legacy metadata {path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
}

fn log_config() -> LogConfig {
    LogConfig {
        flush: FlushPolicy::Sync,
        segment_bytes: 64 << 20,
        segment_index_bytes: 1 << 20,
        ..LogConfig::default()
    }
}

/// The state a Weir 0.1 data directory holds, or `None` if it has no old metadata log (a new
/// directory, or one already moved to the quorum).
pub fn load(data_dir: &Path, clock: Arc<dyn Clock>) -> Result<Option<MetadataState>, LegacyError> {
    let dir = data_dir.join(METADATA_DIR);
    let log_dir = dir.join(LOG_DIR);
    if !log_dir.is_dir() {
        return Ok(None);
    }
    let snapshot_path = dir.join(SNAPSHOT_FILE);
    let mut state = match std::fs::read(&snapshot_path) {
        Ok(bytes) => {
            let mut state = serde_json::from_slice::<MetadataState>(&bytes)
                .map_err(|e| LegacyError::Corrupt { path: snapshot_path.clone(), reason: e.to_string() })?;
            state.upgrade_loaded();
            state
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => MetadataState::new(),
        Err(e) => return Err(StorageError::Io { path: snapshot_path, source: e }.into()),
    };
    // The log is small: always recover it fully rather than trusting a clean-shutdown marker.
    let options =
        OpenOptions { clean_shutdown: false, recovery_point: None, log_start_offset: None, page_cache_survived: false };
    let log = Log::open(&log_dir, log_config(), clock, options, Arc::new(DeletionQueue::new()))?;
    let mut replayed = 0u64;
    let mut next = (state.applied_offset + 1).max(log.log_start_offset());
    while next < log.log_end_offset() {
        let read = log.read(next, 1 << 20, log.log_end_offset())?;
        let Some(slice) = read.slice else { break };
        let bytes = Bytes::from(slice.read_to_vec()?);
        let records = internal_records::decode_batches(bytes)
            .map_err(|reason| LegacyError::Corrupt { path: log_dir.clone(), reason })?;
        for record in records {
            if record.offset < next {
                continue;
            }
            let value = record.value.unwrap_or_default();
            let parsed: MetadataRecord = serde_json::from_slice(&value).map_err(|e| LegacyError::Corrupt {
                path: log_dir.clone(),
                reason: format!("record at offset {}: {e}", record.offset),
            })?;
            state.apply(record.offset, &parsed);
            replayed += 1;
        }
        next = slice.next_offset;
    }
    log.close()?;
    if state.cluster_id.is_empty() && state.topics.is_empty() {
        return Ok(None);
    }
    tracing::info!(topics = state.topics.len(), replayed, "read the metadata of a Weir 0.1 data directory");
    Ok(Some(state))
}

/// True when `data_dir` holds a Weir 0.1 metadata log not yet moved to the quorum.
pub fn exists(data_dir: &Path) -> bool {
    data_dir.join(METADATA_DIR).join(LOG_DIR).is_dir()
}

/// Moves the old log and snapshot aside once their state is committed to the quorum.
pub fn retire(data_dir: &Path) -> std::io::Result<()> {
    let dir = data_dir.join(METADATA_DIR);
    for name in [LOG_DIR, SNAPSHOT_FILE] {
        let from = dir.join(name);
        if from.exists() {
            std::fs::rename(&from, dir.join(format!("{name}.{RETIRED_SUFFIX}")))?;
        }
    }
    weir_storage::fsync_dir(&dir).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use uuid::Uuid;
    use weir_storage::SystemClock;

    use super::*;

    /// Writes records as Weir 0.1 did: one JSON value per record, key `metadata`.
    fn write_old_log(data_dir: &Path, records: &[MetadataRecord]) {
        let log_dir = data_dir.join(METADATA_DIR).join(LOG_DIR);
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let log =
            Log::open(&log_dir, log_config(), clock, OpenOptions::default(), Arc::new(DeletionQueue::new())).unwrap();
        for record in records {
            let value = Bytes::from(serde_json::to_vec(record).unwrap());
            let mut batch = internal_records::encode_batch(&[(Bytes::from_static(b"metadata"), Some(value))], 0);
            log.append(&mut batch, 0).unwrap();
        }
        log.flush().unwrap();
        log.close().unwrap();
    }

    #[test]
    fn an_old_log_is_read_once_and_retired() {
        let dir = tempfile::tempdir().unwrap();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        assert!(load(dir.path(), clock.clone()).unwrap().is_none(), "nothing to migrate in a new directory");
        let records = [
            MetadataRecord::InitCluster { cluster_id: "old-cluster".into() },
            MetadataRecord::CreateTopic {
                name: "t".into(),
                id: Uuid::new_v4(),
                partitions: 2,
                configs: BTreeMap::new(),
                internal: false,
                assignments: Vec::new(),
            },
        ];
        write_old_log(dir.path(), &records);
        let state = load(dir.path(), clock.clone()).unwrap().expect("the old state");
        assert_eq!(state.cluster_id, "old-cluster");
        assert_eq!(state.topic("t").map(|t| t.partitions), Some(2));
        assert!(state.has_unassigned_partitions());
        retire(dir.path()).unwrap();
        assert!(load(dir.path(), clock).unwrap().is_none(), "retired: not read again");
        assert!(dir.path().join(METADATA_DIR).join("log.v0-migrated").is_dir());
    }
}
