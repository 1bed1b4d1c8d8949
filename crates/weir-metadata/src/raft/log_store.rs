//! The Raft log of the metadata quorum, on the storage engine: one partition log under
//! `__cluster_metadata/raft/log`, one RecordBatch per Raft entry at offset = entry index, fsynced
//! before openraft is told an append is done. Batches carry the entry as JSON (its log id and
//! payload), so recovery, CRC checks and truncation are the storage engine's.
//!
//! One batch per entry matters: `Log::truncate_to` drops whole batches, and a truncation must
//! keep every entry below the index it is given.
//!
//! Beside the log: `vote.json` (the vote, fsynced before openraft relies on it),
//! `committed.json` (the last committed log id, so a restart re-applies what was committed) and
//! `purged.json` (the last purged log id: after a purge the log no longer holds its term).

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;
use weir_storage::{Clock, DeletionQueue, FlushPolicy, Log, LogConfig, OpenOptions};

use super::{MetadataRaft, NodeId};
use weir_storage::internal_records;

const VOTE_FILE: &str = "vote.json";
const COMMITTED_FILE: &str = "committed.json";
const PURGED_FILE: &str = "purged.json";
/// The key of every entry's record (the value is the entry).
const ENTRY_KEY: &[u8] = b"raft";
/// Bytes one read asks for when openraft reads entries back.
const READ_BYTES: u64 = 1 << 20;

type StoreResult<T> = Result<T, StorageError<NodeId>>;

fn io_error(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageError::IO { source: StorageIOError::write_logs(&e) }
}

fn read_error(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageError::IO { source: StorageIOError::read_logs(&e) }
}

/// Shared by the store and its readers (openraft reads entries from other tasks).
struct Inner {
    dir: PathBuf,
    log: Log,
}

#[derive(Clone)]
pub(crate) struct RaftLogStore {
    inner: Arc<Inner>,
}

impl RaftLogStore {
    /// Opens (or creates) the log under `dir`. Blocking.
    pub fn open(dir: &Path, clock: Arc<dyn Clock>) -> Result<RaftLogStore, weir_storage::StorageError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| weir_storage::StorageError::Io { path: dir.to_path_buf(), source: e })?;
        let config = LogConfig {
            flush: FlushPolicy::Sync,
            segment_bytes: 64 << 20,
            segment_index_bytes: 1 << 20,
            // Purged entries are gone as soon as Raft says so, and only then: no time or size
            // retention (`apply_retention` then only drops segments below the log start).
            file_delete_delay_ms: 0,
            retention_ms: -1,
            retention_bytes: -1,
            // One entry is one batch: the log takes any entry the quorum lets through
            // (`MAX_ENTRY_BYTES`, with room for its JSON envelope), never refuses one midway.
            max_message_bytes: 2 * super::MAX_ENTRY_BYTES as u64,
            ..LogConfig::default()
        };
        // Small: always recovered fully rather than trusting a clean-shutdown marker.
        let options = OpenOptions {
            clean_shutdown: false,
            recovery_point: None,
            log_start_offset: read_json::<Option<LogId<NodeId>>>(&dir.join(PURGED_FILE))
                .ok()
                .flatten()
                .flatten()
                .map(|id| id.index as i64 + 1),
            page_cache_survived: false,
        };
        let log = Log::open(&dir.join("log"), config, clock, options, Arc::new(DeletionQueue::new()))?;
        Ok(RaftLogStore { inner: Arc::new(Inner { dir: dir.to_path_buf(), log }) })
    }

    /// Entries `[start, end)`. Blocking (reads the log).
    fn read_entries(&self, start: u64, end: u64) -> StoreResult<Vec<Entry<MetadataRaft>>> {
        let log = &self.inner.log;
        let end = (end as i64).min(log.log_end_offset());
        let mut next = (start as i64).max(log.log_start_offset());
        let mut out = Vec::new();
        while next < end {
            let read = log.read(next, READ_BYTES, end).map_err(read_error)?;
            let Some(slice) = read.slice else { break };
            let bytes = Bytes::from(slice.read_to_vec().map_err(read_error)?);
            let records = internal_records::decode_batches(bytes)
                .map_err(|e| read_error(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
            for record in records.into_iter().filter(|r| r.offset >= next && r.offset < end) {
                let value = record.value.unwrap_or_default();
                let entry: Entry<MetadataRaft> = serde_json::from_slice(&value).map_err(read_error)?;
                if entry.log_id.index as i64 != record.offset {
                    return Err(read_error(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("entry {} stored at offset {}", entry.log_id.index, record.offset),
                    )));
                }
                out.push(entry);
            }
            if slice.next_offset <= next {
                break;
            }
            next = slice.next_offset;
        }
        Ok(out)
    }

    fn last_purged(&self) -> StoreResult<Option<LogId<NodeId>>> {
        Ok(read_json::<Option<LogId<NodeId>>>(&self.inner.dir.join(PURGED_FILE)).map_err(read_error)?.flatten())
    }

    /// Flushes and closes the log (shutdown).
    pub fn close(&self) {
        if let Err(e) = self.inner.log.close() {
            tracing::warn!(error = %e, "closing the metadata quorum's log");
        }
    }
}

/// A JSON file, `None` if it does not exist.
fn read_json<T: DeserializeOwned>(path: &Path) -> std::io::Result<Option<T>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(std::io::Error::other),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> StoreResult<()> {
    let bytes = serde_json::to_vec(value).map_err(io_error)?;
    weir_storage::write_atomically(path, &bytes).map_err(io_error)
}

impl RaftLogReader<MetadataRaft> for RaftLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StoreResult<Vec<Entry<MetadataRaft>>> {
        let start = match range.start_bound() {
            Bound::Included(x) => *x,
            Bound::Excluded(x) => x.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(x) => x.saturating_add(1),
            Bound::Excluded(x) => *x,
            Bound::Unbounded => u64::MAX,
        };
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.read_entries(start, end)).await.map_err(read_error)?
    }
}

impl RaftLogStorage<MetadataRaft> for RaftLogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StoreResult<LogState<MetadataRaft>> {
        let last_purged_log_id = self.last_purged()?;
        let end = self.inner.log.log_end_offset();
        let last = if end > self.inner.log.log_start_offset() {
            self.read_entries(end as u64 - 1, end as u64)?.pop().map(|e| e.log_id)
        } else {
            None
        };
        Ok(LogState { last_purged_log_id, last_log_id: last.or(last_purged_log_id) })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StoreResult<()> {
        write_json(&self.inner.dir.join(VOTE_FILE), vote)
    }

    async fn read_vote(&mut self) -> StoreResult<Option<Vote<NodeId>>> {
        read_json(&self.inner.dir.join(VOTE_FILE)).map_err(read_error)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StoreResult<()> {
        write_json(&self.inner.dir.join(COMMITTED_FILE), &committed)
    }

    async fn read_committed(&mut self) -> StoreResult<Option<LogId<NodeId>>> {
        Ok(read_json::<Option<LogId<NodeId>>>(&self.inner.dir.join(COMMITTED_FILE)).map_err(read_error)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<MetadataRaft>) -> StoreResult<()>
    where
        I: IntoIterator<Item = Entry<MetadataRaft>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<MetadataRaft>> = entries.into_iter().collect();
        let this = self.clone();
        let written = tokio::task::spawn_blocking(move || this.append_blocking(&entries)).await.map_err(io_error)?;
        match written {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        tracing::debug!(index = log_id.index, "truncating the metadata log");
        self.inner.log.truncate_to(log_id.index as i64).map_err(io_error)?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        write_json(&self.inner.dir.join(PURGED_FILE), &Some(log_id))?;
        let log = &self.inner.log;
        let upto = log_id.index as i64 + 1;
        if upto > log.log_end_offset() {
            // A snapshot from the leader replaced everything this log had.
            log.truncate_fully_and_start_at(upto).map_err(io_error)?;
        } else if upto > log.log_start_offset() {
            log.delete_records_before(upto).map_err(io_error)?;
            log.apply_retention().map_err(io_error)?;
        }
        Ok(())
    }
}

impl RaftLogStore {
    /// Appends one entry as `append` does, without openraft's flush callback.
    #[cfg(test)]
    pub(crate) fn append_for_tests(&self, entry: Entry<MetadataRaft>) {
        self.append_blocking(std::slice::from_ref(&entry)).expect("append");
    }

    /// Writes `entries`, one batch each, at offsets equal to their indexes, and fsyncs them.
    fn append_blocking(&self, entries: &[Entry<MetadataRaft>]) -> StoreResult<()> {
        let Some(first) = entries.first() else { return Ok(()) };
        let log = &self.inner.log;
        let first_index = first.log_id.index as i64;
        if first_index > log.log_end_offset() {
            // Only after a snapshot was installed past the log's end (purge starts it there).
            log.truncate_fully_and_start_at(first_index).map_err(io_error)?;
        }
        if first_index != log.log_end_offset() {
            return Err(io_error(std::io::Error::other(format!(
                "entry {first_index} appended at log end {}: openraft truncates before it overwrites",
                log.log_end_offset()
            ))));
        }
        let mut batches = bytes::BytesMut::new();
        for (i, entry) in entries.iter().enumerate() {
            debug_assert_eq!(entry.log_id.index as i64, first_index + i as i64, "entries are contiguous");
            let value = serde_json::to_vec(entry).map_err(io_error)?;
            batches.unsplit(internal_records::encode_batch(
                &[(Bytes::from_static(ENTRY_KEY), Some(Bytes::from(value)))],
                0,
            ));
        }
        let info = log.append(&mut batches, 0).map_err(io_error)?;
        log.sync_to(info.last_offset + 1).map_err(io_error)?;
        Ok(())
    }
}
