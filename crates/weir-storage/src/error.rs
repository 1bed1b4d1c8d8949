//! Typed errors at the storage boundary. The broker maps each variant to one protocol error code.

use std::io;
use std::path::PathBuf;

/// Why a batch handed to `append` was refused. The log is untouched when this is returned.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BatchError {
    /// Bytes that do not form an intact batch (bad length, CRC mismatch, truncation).
    /// Kafka: CORRUPT_MESSAGE.
    #[error("corrupt record batch: {0}")]
    Corrupt(String),
    /// An intact batch that breaks a rule (record count, offsets, codec). Kafka: INVALID_RECORD.
    #[error("invalid record batch: {0}")]
    Invalid(String),
    /// A batch larger than `max.message.bytes`. Kafka: MESSAGE_TOO_LARGE.
    #[error("record batch of {size} bytes exceeds max.message.bytes={max}")]
    TooLarge { size: usize, max: usize },
    /// Message format v0/v1. Kafka: UNSUPPORTED_FOR_MESSAGE_FORMAT.
    #[error("record batch magic {0} is not supported; only v2 (Kafka 0.11+) batches are")]
    UnsupportedMagic(i8),
}

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error(transparent)]
    Batch(#[from] BatchError),
    /// Kafka: OFFSET_OUT_OF_RANGE. Carries the valid range so the caller can reset.
    #[error("offset {offset} is out of range [{log_start_offset}, {log_end_offset}]")]
    OffsetOutOfRange { offset: i64, log_start_offset: i64, log_end_offset: i64 },
    /// Data on disk failed its CRC or framing check when read. Kafka: KAFKA_STORAGE_ERROR.
    #[error("corrupt data in {path} at byte {position}: {reason}")]
    CorruptSegment { path: PathBuf, position: u64, reason: String },
    /// A configuration value outside its allowed range, naming the setting.
    #[error("invalid value {value:?} for {name}: {reason}")]
    InvalidConfig { name: String, value: String, reason: String },
    #[error("{0}")]
    InvalidArgument(String),
    /// The data directory is in use by another process.
    #[error("data directory {0} is locked by another process")]
    DirectoryLocked(PathBuf),
    /// The log was closed or deleted while the operation ran.
    #[error("log {0} is closed")]
    Closed(PathBuf),
    #[error("I/O error on {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// A leader's write stamped with a leader epoch older than one this log already has: the
    /// writer was deposed meanwhile (Kafka: NOT_LEADER_OR_FOLLOWER, so the client retries).
    #[error("a write at leader epoch {epoch} after leader epoch {latest} began: this leader was deposed")]
    StaleLeaderEpoch { epoch: i32, latest: i32 },
    /// An idempotent or transactional producer's batch broke the sequence or epoch rules.
    #[error(transparent)]
    Producer(crate::producer_state::ProducerError),
}

impl StorageError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> StorageError {
        StorageError::Io { path: path.into(), source }
    }

    /// True for errors that say the disk is full; the broker answers these without stopping.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, StorageError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC))
    }
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// Attaches a path to an `io::Result`.
pub(crate) trait IoContext<T> {
    fn at(self, path: &std::path::Path) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn at(self, path: &std::path::Path) -> Result<T> {
        self.map_err(|e| StorageError::io(path, e))
    }
}
