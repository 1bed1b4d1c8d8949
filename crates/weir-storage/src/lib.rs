//! Weir's storage engine: the partition log.
//!
//! A partition is a directory of segments; a segment is a `.log` of Kafka RecordBatch v2 bytes
//! stored verbatim, with a sparse `.index` (offset → position) and `.timeindex` (timestamp →
//! offset). Files are named by the 20-digit base offset of the segment.
//!
//! Architecture invariant: this crate knows nothing of networking or protocols beyond the
//! RecordBatch v2 byte layout. The broker calls [`Log`] (one partition) and [`LogManager`] (a
//! data directory of partitions, with the background work: retention, flushing, compaction,
//! checkpoints, deferred deletion).
//!
//! API boundary: everything public here is what the broker may use; errors are typed
//! ([`StorageError`], [`BatchError`]) so the broker maps each to one protocol error code.
#![deny(unsafe_code)]
#![deny(clippy::unwrap_used)]

pub mod batch;
mod checkpoint;
pub mod cleaner;
pub mod clock;
pub mod config;
mod deletion;
pub mod error;
mod file_slice;
pub mod histogram;
mod index_file;
pub mod internal_records;
pub mod leader_epoch;
pub mod log;
pub mod manager;
pub mod offset_index;
pub(crate) mod producer_state;
pub mod records;
mod segment;
pub mod sync;
pub mod testing;
pub mod time_index;
pub(crate) mod txn_index;

pub use batch::{BatchHeader, Compression, TimestampType};
pub use checkpoint::{fsync_dir, write_atomically};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{CleanupPolicy, FlushPolicy, LogConfig};
pub use deletion::DeletionQueue;
pub use error::{BatchError, Result, StorageError};
pub use file_slice::FileSlice;
pub use leader_epoch::EpochEntry;
pub use log::{AppendInfo, Log, LogStats, OpenOptions, ReadResult, RetentionOutcome, SealedSegment, TimestampOffset};
pub use manager::{LogManager, ManagerOptions, TopicPartition};
pub use producer_state::{ProducerError, ProducerProgress};
pub use txn_index::AbortedTxn;

#[cfg(test)]
pub(crate) use testing as test_support;
