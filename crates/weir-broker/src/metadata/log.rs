//! The metadata log on one node: a partition log in `<data>/__cluster_metadata/log`, fsynced on
//! every append, plus a JSON snapshot of the state (`snapshot.json`) written atomically every
//! `snapshot_interval` records, after which the log prefix it covers is dropped.
//!
//! Start-up: load the snapshot (if any), then replay the log records after its offset. A record
//! is acknowledged only after its fsync, so a proposal that returned survives `kill -9`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use weir_storage::{Clock, DeletionQueue, FlushPolicy, Log, LogConfig, OpenOptions, StorageError};

use super::{MetadataRecord, MetadataState};
use crate::internal_records;

pub const METADATA_DIR: &str = "__cluster_metadata";
const SNAPSHOT_FILE: &str = "snapshot.json";

#[derive(Debug, thiserror::Error)]
pub enum MetadataLogError {
    #[error("metadata log: {0}")]
    Storage(#[from] StorageError),
    #[error("metadata log {path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
}

pub struct MetadataLog {
    dir: PathBuf,
    log: Log,
    snapshot_interval: u64,
    since_snapshot: u64,
}

impl MetadataLog {
    /// Opens (or creates) the metadata log under `data_dir` and rebuilds the state from the
    /// snapshot and the records after it.
    pub fn open(
        data_dir: &Path,
        clock: Arc<dyn Clock>,
        snapshot_interval: u64,
    ) -> Result<(MetadataLog, MetadataState), MetadataLogError> {
        let dir = data_dir.join(METADATA_DIR);
        let log_dir = dir.join("log");
        std::fs::create_dir_all(&log_dir).map_err(|e| StorageError::Io { path: log_dir.clone(), source: e })?;
        let snapshot_path = dir.join(SNAPSHOT_FILE);
        let mut state = match std::fs::read(&snapshot_path) {
            Ok(bytes) => {
                let mut state = serde_json::from_slice::<MetadataState>(&bytes)
                    .map_err(|e| MetadataLogError::Corrupt { path: snapshot_path.clone(), reason: e.to_string() })?;
                state.upgrade_loaded();
                state
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => MetadataState::new(),
            Err(e) => return Err(StorageError::Io { path: snapshot_path, source: e }.into()),
        };
        let config = LogConfig {
            flush: FlushPolicy::Sync,
            segment_bytes: 64 << 20,
            segment_index_bytes: 1 << 20,
            ..LogConfig::default()
        };
        // The log is small: always recover it fully rather than trusting a clean-shutdown marker.
        let options = OpenOptions {
            clean_shutdown: false,
            recovery_point: None,
            log_start_offset: None,
            page_cache_survived: false,
        };
        let log = Log::open(&log_dir, config, clock, options, Arc::new(DeletionQueue::new()))?;
        let mut replayed = 0u64;
        let mut next = (state.applied_offset + 1).max(log.log_start_offset());
        while next < log.log_end_offset() {
            let read = log.read(next, 1 << 20, log.log_end_offset())?;
            let Some(slice) = read.slice else { break };
            let bytes = Bytes::from(slice.read_to_vec()?);
            let records = internal_records::decode_batches(bytes)
                .map_err(|reason| MetadataLogError::Corrupt { path: log_dir.clone(), reason })?;
            for record in records {
                if record.offset < next {
                    continue;
                }
                let value = record.value.unwrap_or_default();
                let parsed: MetadataRecord = serde_json::from_slice(&value).map_err(|e| MetadataLogError::Corrupt {
                    path: log_dir.clone(),
                    reason: format!("record at offset {}: {e}", record.offset),
                })?;
                state.apply(record.offset, &parsed);
                replayed += 1;
            }
            next = slice.next_offset;
        }
        tracing::info!(topics = state.topics.len(), replayed, applied_offset = state.applied_offset, "loaded metadata");
        Ok((MetadataLog { dir, log, snapshot_interval, since_snapshot: replayed }, state))
    }

    /// Appends `records` durably and returns the offset of the first; the caller applies them
    /// at consecutive offsets from there.
    pub fn append(&mut self, records: &[MetadataRecord], now_ms: i64) -> Result<i64, MetadataLogError> {
        let entries: Vec<(Bytes, Option<Bytes>)> = records
            .iter()
            .map(|r| {
                // Serializing plain data to JSON cannot fail.
                let value = serde_json::to_vec(r).unwrap_or_default();
                (Bytes::from_static(b"metadata"), Some(Bytes::from(value)))
            })
            .collect();
        let mut batch = internal_records::encode_batch(&entries, now_ms);
        let info = self.log.append(&mut batch, 0)?;
        self.log.sync_to(info.last_offset + 1)?;
        self.since_snapshot += records.len() as u64;
        Ok(info.first_offset)
    }

    /// Writes a snapshot of `state` when enough records have accumulated since the last one,
    /// then drops the log prefix the snapshot covers.
    pub fn maybe_snapshot(&mut self, state: &MetadataState) -> Result<(), MetadataLogError> {
        if self.since_snapshot < self.snapshot_interval {
            return Ok(());
        }
        self.snapshot(state)
    }

    pub fn snapshot(&mut self, state: &MetadataState) -> Result<(), MetadataLogError> {
        let bytes = serde_json::to_vec_pretty(state).unwrap_or_default();
        weir_storage::write_atomically(&self.dir.join(SNAPSHOT_FILE), &bytes)?;
        self.since_snapshot = 0;
        let upto = (state.applied_offset + 1).min(self.log.high_watermark());
        if upto > self.log.log_start_offset() {
            self.log.delete_records_before(upto)?;
            self.log.apply_retention()?;
        }
        tracing::debug!(applied_offset = state.applied_offset, "wrote metadata snapshot");
        Ok(())
    }

    pub fn close(&self) -> Result<(), MetadataLogError> {
        self.log.close()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use uuid::Uuid;
    use weir_storage::SystemClock;

    use super::*;

    fn create(name: &str) -> MetadataRecord {
        MetadataRecord::CreateTopic {
            name: name.into(),
            id: Uuid::new_v4(),
            partitions: 3,
            configs: BTreeMap::new(),
            internal: false,
            assignments: vec![vec![0]; 3],
        }
    }

    #[test]
    fn state_survives_reopen_with_and_without_snapshots() {
        for interval in [1000, 3] {
            let dir = tempfile::tempdir().unwrap();
            let clock: Arc<dyn Clock> = Arc::new(SystemClock);
            let expected = {
                let (mut log, mut state) = MetadataLog::open(dir.path(), clock.clone(), interval).unwrap();
                for i in 0..10 {
                    let record = create(&format!("topic-{i}"));
                    let offset = log.append(std::slice::from_ref(&record), 0).unwrap();
                    state.apply(offset, &record);
                    log.maybe_snapshot(&state).unwrap();
                }
                // No close: reopening must not depend on a clean shutdown.
                state
            };
            let (_log, state) = MetadataLog::open(dir.path(), clock, interval).unwrap();
            assert_eq!(state, expected, "snapshot interval {interval}");
            assert_eq!(state.topics.len(), 10);
            assert_eq!(dir.path().join(METADATA_DIR).join(SNAPSHOT_FILE).exists(), interval == 3);
        }
    }
}
