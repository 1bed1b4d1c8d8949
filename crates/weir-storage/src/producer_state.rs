//! Per-partition state of idempotent producers: for each producer id, its epoch and the
//! sequence ranges of its last five batches, so that the log can refuse gaps, answer a resent
//! batch with the offsets it got the first time, and fence producers of an older epoch.
//!
//! Rules (Kafka's, from KIP-98 and KIP-360), checked under the log's writer lock so that they
//! see appends in offset order:
//! - an epoch older than the producer's current one is refused (`InvalidProducerEpoch`);
//! - a batch whose sequence range equals one of the producer's last five batches (same epoch)
//!   is a duplicate: nothing is written and the original offsets are returned;
//! - a new epoch must start at sequence 0;
//! - otherwise the first sequence must follow the last one (`OutOfOrderSequence`), wrapping at
//!   `i32::MAX`; a producer the log knows nothing about that does not start at 0 gets
//!   `UnknownProducerId` (its state may have expired).
//!
//! The state is rebuilt at start-up from a snapshot (`<offset>.snapshot`, written when a segment
//! rolls and when the log closes) plus the batch headers after the snapshot's offset, so
//! recovery never scans more than the active segment.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};

use crate::batch::{BatchHeader, ControlType};
use crate::error::{IoContext, Result, StorageError};
use crate::txn_index::AbortedTxn;

/// How many batches per producer are remembered for duplicate detection (Kafka's constant;
/// clients keep at most five requests in flight per partition with idempotence).
pub(crate) const BATCHES_REMEMBERED: usize = 5;
pub(crate) const NO_PRODUCER_ID: i64 = -1;
pub(crate) const SNAPSHOT_SUFFIX: &str = ".snapshot";
const SNAPSHOT_MAGIC: &[u8; 4] = b"WPS1";

/// Why an idempotent or transactional batch was refused. Each maps to one Kafka error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProducerError {
    /// Kafka: OUT_OF_ORDER_SEQUENCE_NUMBER.
    #[error("out of order sequence: {0}")]
    OutOfOrderSequence(String),
    /// Kafka: INVALID_PRODUCER_EPOCH.
    #[error("invalid producer epoch: {0}")]
    InvalidProducerEpoch(String),
    /// Kafka: UNKNOWN_PRODUCER_ID.
    #[error("unknown producer id: {0}")]
    UnknownProducerId(String),
    /// Kafka: INVALID_RECORD (e.g. several batches from one producer in one request).
    #[error("invalid producer batch: {0}")]
    Invalid(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchMetadata {
    pub(crate) first_seq: i32,
    pub(crate) last_seq: i32,
    pub first_offset: i64,
    pub last_offset: i64,
    pub timestamp: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProducerEntry {
    pub epoch: i16,
    /// Oldest first; at most [`BATCHES_REMEMBERED`].
    pub batches: VecDeque<BatchMetadata>,
    /// Wall-clock time of the producer's last append, for expiry.
    pub(crate) last_timestamp_ms: i64,
    /// First offset of the producer's open transaction, if one is open in this partition.
    pub(crate) txn_first_offset: Option<i64>,
}

impl ProducerEntry {
    fn last_seq(&self) -> Option<i32> {
        self.batches.back().map(|b| b.last_seq)
    }
}

/// An idempotent producer's last batch in a log: its epoch, the sequence number of its last
/// record and that record's offset. Every record of the producer with a sequence at or below
/// `last_sequence` (in the epoch) is in the log at or below `last_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerProgress {
    pub epoch: i16,
    pub last_sequence: i32,
    pub last_offset: i64,
}

/// What [`ProducerStateManager::check`] decided for a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProducerCheck {
    /// Not from an idempotent producer, or new and in sequence: append it.
    Append,
    /// Already in the log at these offsets: do not append again.
    Duplicate { first_offset: i64, last_offset: i64 },
}

fn in_sequence(last: i32, next: i32) -> bool {
    i64::from(next) == i64::from(last) + 1 || (next == 0 && last == i32::MAX)
}

/// The sequence number of the last record of a batch, wrapping as Kafka does.
fn last_sequence(header: &BatchHeader) -> i32 {
    let last = i64::from(header.base_sequence) + i64::from(header.last_offset_delta);
    if last > i64::from(i32::MAX) {
        (last - i64::from(i32::MAX) - 1) as i32
    } else {
        last as i32
    }
}

#[derive(Debug, Default)]
pub(crate) struct ProducerStateManager {
    producers: HashMap<i64, ProducerEntry>,
    /// Open transactions by first offset (for the last stable offset).
    ongoing: BTreeMap<i64, i64>,
}

impl ProducerStateManager {
    pub fn new() -> ProducerStateManager {
        ProducerStateManager::default()
    }

    #[cfg(test)]
    pub fn producer(&self, producer_id: i64) -> Option<&ProducerEntry> {
        self.producers.get(&producer_id)
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    /// Where a producer's last batch stands: see [`ProducerProgress`].
    pub fn progress(&self, producer_id: i64) -> Option<ProducerProgress> {
        let entry = self.producers.get(&producer_id)?;
        let last = entry.batches.back()?;
        Some(ProducerProgress { epoch: entry.epoch, last_sequence: last.last_seq, last_offset: last.last_offset })
    }

    /// The first offset of the oldest open transaction, if any (bounds the last stable offset).
    pub(crate) fn first_unstable_offset(&self) -> Option<i64> {
        self.ongoing.keys().next().copied()
    }

    /// Decides whether a validated batch from a producer may be appended. Batches without a
    /// producer id always may.
    pub fn check(&self, header: &BatchHeader) -> std::result::Result<ProducerCheck, ProducerError> {
        if header.producer_id == NO_PRODUCER_ID {
            return Ok(ProducerCheck::Append);
        }
        let pid = header.producer_id;
        let epoch = header.producer_epoch;
        if header.is_control() {
            // A transaction marker from the coordinator: it may bump the epoch, never lower it.
            return match self.producers.get(&pid) {
                Some(entry) if epoch < entry.epoch => Err(ProducerError::InvalidProducerEpoch(format!(
                    "marker for producer {pid} at epoch {epoch}, older than the current epoch {}",
                    entry.epoch
                ))),
                _ => Ok(ProducerCheck::Append),
            };
        }
        let first_seq = header.base_sequence;
        let Some(entry) = self.producers.get(&pid) else {
            return if first_seq == 0 {
                Ok(ProducerCheck::Append)
            } else {
                Err(ProducerError::UnknownProducerId(format!(
                    "no state for producer {pid} (it may have expired); its batch starts at sequence {first_seq}"
                )))
            };
        };
        if epoch < entry.epoch {
            return Err(ProducerError::InvalidProducerEpoch(format!(
                "producer {pid} epoch {epoch} is older than the current epoch {}",
                entry.epoch
            )));
        }
        if epoch == entry.epoch {
            let last_seq = last_sequence(header);
            if let Some(original) = entry.batches.iter().find(|b| b.first_seq == first_seq && b.last_seq == last_seq) {
                return Ok(ProducerCheck::Duplicate {
                    first_offset: original.first_offset,
                    last_offset: original.last_offset,
                });
            }
            match entry.last_seq() {
                Some(last) if !in_sequence(last, first_seq) => Err(ProducerError::OutOfOrderSequence(format!(
                    "producer {pid}: sequence {first_seq} does not follow {last}"
                ))),
                None if first_seq != 0 => Err(ProducerError::OutOfOrderSequence(format!(
                    "producer {pid}: sequence {first_seq}, expected 0 after the epoch began"
                ))),
                _ => Ok(ProducerCheck::Append),
            }
        } else if first_seq != 0 {
            Err(ProducerError::OutOfOrderSequence(format!(
                "producer {pid}: new epoch {epoch} must start at sequence 0, not {first_seq}"
            )))
        } else {
            Ok(ProducerCheck::Append)
        }
    }

    /// Records an appended batch (at `header.base_offset`, already assigned); `control` is the
    /// marker type of a control batch. Returns the transaction an abort marker aborted.
    pub fn update(&mut self, header: &BatchHeader, control: Option<ControlType>, now_ms: i64) -> Option<AbortedTxn> {
        if header.producer_id == NO_PRODUCER_ID {
            return None;
        }
        let pid = header.producer_id;
        let entry = self.producers.entry(pid).or_insert_with(|| ProducerEntry {
            epoch: header.producer_epoch,
            batches: VecDeque::new(),
            last_timestamp_ms: now_ms,
            txn_first_offset: None,
        });
        if header.producer_epoch > entry.epoch {
            entry.epoch = header.producer_epoch;
            entry.batches.clear();
        }
        entry.last_timestamp_ms = now_ms.max(entry.last_timestamp_ms);
        if header.is_control() {
            // A transaction marker ends the producer's open transaction here.
            let first = entry.txn_first_offset.take()?;
            self.ongoing.remove(&first);
            let marker = header.base_offset;
            return (control == Some(ControlType::Abort)).then(|| AbortedTxn {
                producer_id: pid,
                first_offset: first,
                last_offset: marker,
                last_stable_offset: self.first_unstable_offset().unwrap_or(marker + 1),
            });
        }
        if header.is_transactional() && entry.txn_first_offset.is_none() {
            entry.txn_first_offset = Some(header.base_offset);
            self.ongoing.insert(header.base_offset, pid);
        }
        entry.batches.push_back(BatchMetadata {
            first_seq: header.base_sequence,
            last_seq: last_sequence(header),
            first_offset: header.base_offset,
            last_offset: header.last_offset(),
            timestamp: header.max_timestamp,
        });
        while entry.batches.len() > BATCHES_REMEMBERED {
            entry.batches.pop_front();
        }
        None
    }

    /// Forgets producers idle for longer than `expiration_ms` with no open transaction
    /// (`producer.id.expiration.ms`). Returns how many were removed.
    pub fn expire(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        let before = self.producers.len();
        self.producers
            .retain(|_, e| e.txn_first_offset.is_some() || now_ms.saturating_sub(e.last_timestamp_ms) <= expiration_ms);
        before - self.producers.len()
    }

    /// Encodes the state: magic, CRC-32C of the rest, then the producers.
    fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(16 + self.producers.len() * 64);
        body.extend_from_slice(&(self.producers.len() as u32).to_be_bytes());
        let mut pids: Vec<&i64> = self.producers.keys().collect();
        pids.sort();
        for pid in pids {
            let e = &self.producers[pid];
            body.extend_from_slice(&pid.to_be_bytes());
            body.extend_from_slice(&e.epoch.to_be_bytes());
            body.extend_from_slice(&e.last_timestamp_ms.to_be_bytes());
            body.extend_from_slice(&e.txn_first_offset.unwrap_or(-1).to_be_bytes());
            body.push(e.batches.len() as u8);
            for b in &e.batches {
                body.extend_from_slice(&b.first_seq.to_be_bytes());
                body.extend_from_slice(&b.last_seq.to_be_bytes());
                body.extend_from_slice(&b.first_offset.to_be_bytes());
                body.extend_from_slice(&b.last_offset.to_be_bytes());
                body.extend_from_slice(&b.timestamp.to_be_bytes());
            }
        }
        let mut out = Vec::with_capacity(8 + body.len());
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    fn decode(bytes: &[u8]) -> Option<ProducerStateManager> {
        if bytes.len() < 12 || &bytes[..4] != SNAPSHOT_MAGIC {
            return None;
        }
        let crc = u32::from_be_bytes(bytes[4..8].try_into().ok()?);
        let body = &bytes[8..];
        if crc32c::crc32c(body) != crc {
            return None;
        }
        let mut r = Reader { bytes: body, at: 0 };
        let count = r.u32()?;
        let mut state = ProducerStateManager::new();
        for _ in 0..count {
            let pid = r.i64()?;
            let epoch = r.i16()?;
            let last_timestamp_ms = r.i64()?;
            let txn_first = r.i64()?;
            let batch_count = r.u8()?;
            let mut batches = VecDeque::with_capacity(usize::from(batch_count));
            for _ in 0..batch_count {
                batches.push_back(BatchMetadata {
                    first_seq: r.i32()?,
                    last_seq: r.i32()?,
                    first_offset: r.i64()?,
                    last_offset: r.i64()?,
                    timestamp: r.i64()?,
                });
            }
            let txn_first_offset = (txn_first >= 0).then_some(txn_first);
            if let Some(first) = txn_first_offset {
                state.ongoing.insert(first, pid);
            }
            state.producers.insert(pid, ProducerEntry { epoch, batches, last_timestamp_ms, txn_first_offset });
        }
        (r.at == body.len()).then_some(state)
    }

    /// Writes the state as valid at `offset` (everything below it applied) to `dir`, then
    /// removes older snapshots but the previous one.
    ///
    /// Not fsynced: a snapshot only saves replay work. One lost or torn by a power failure
    /// fails its CRC and is ignored, and the state is rebuilt from an older one plus the log.
    pub fn write_snapshot(&self, dir: &Path, offset: i64) -> Result<()> {
        let path = snapshot_path(dir, offset);
        let tmp = dir.join(format!("{offset:020}{SNAPSHOT_SUFFIX}.tmp"));
        std::fs::write(&tmp, self.encode()).at(&tmp)?;
        std::fs::rename(&tmp, &path).at(&path)?;
        let mut offsets = snapshot_offsets(dir)?;
        offsets.sort_unstable();
        if offsets.len() > 2 {
            for old in &offsets[..offsets.len() - 2] {
                let path = snapshot_path(dir, *old);
                std::fs::remove_file(&path).at(&path)?;
            }
        }
        Ok(())
    }

    /// Loads the newest intact snapshot at or below `max_offset`, deleting snapshots above it
    /// (they describe data that recovery truncated). Returns the state and its offset.
    pub(crate) fn load_snapshot(dir: &Path, max_offset: i64) -> Result<Option<(ProducerStateManager, i64)>> {
        let mut offsets = snapshot_offsets(dir)?;
        offsets.sort_unstable();
        for offset in offsets.iter().filter(|o| **o > max_offset) {
            let path = snapshot_path(dir, *offset);
            std::fs::remove_file(&path).at(&path)?;
        }
        for offset in offsets.iter().rev().filter(|o| **o <= max_offset) {
            let path = snapshot_path(dir, *offset);
            let bytes = std::fs::read(&path).at(&path)?;
            match ProducerStateManager::decode(&bytes) {
                Some(state) => return Ok(Some((state, *offset))),
                None => tracing::warn!(path = %path.display(), "ignoring a corrupt producer-state snapshot"),
            }
        }
        Ok(None)
    }
}

pub fn snapshot_path(dir: &Path, offset: i64) -> PathBuf {
    dir.join(format!("{offset:020}{SNAPSHOT_SUFFIX}"))
}

fn snapshot_offsets(dir: &Path) -> Result<Vec<i64>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).at(dir)? {
        let entry = entry.at(dir)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(offset) = name.strip_suffix(SNAPSHOT_SUFFIX).and_then(|n| n.parse::<i64>().ok()) {
            out.push(offset);
        }
    }
    Ok(out)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let slice = self.bytes.get(self.at..self.at + N)?;
        self.at += N;
        slice.try_into().ok()
    }
    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|b| b[0])
    }
    fn i16(&mut self) -> Option<i16> {
        self.take().map(i16::from_be_bytes)
    }
    fn i32(&mut self) -> Option<i32> {
        self.take().map(i32::from_be_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_be_bytes)
    }
    fn i64(&mut self) -> Option<i64> {
        self.take().map(i64::from_be_bytes)
    }
}

impl From<ProducerError> for StorageError {
    fn from(e: ProducerError) -> StorageError {
        StorageError::Producer(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(pid: i64, epoch: i16, first_seq: i32, records: i32, base_offset: i64) -> BatchHeader {
        BatchHeader {
            base_offset,
            batch_length: 0,
            partition_leader_epoch: 0,
            magic: 2,
            crc: 0,
            attributes: 0,
            last_offset_delta: records - 1,
            base_timestamp: 0,
            max_timestamp: 0,
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: first_seq,
            records_count: records,
        }
    }

    #[test]
    fn sequences_duplicates_and_epochs() {
        let mut s = ProducerStateManager::new();
        assert!(matches!(s.check(&header(7, 0, 3, 1, 0)), Err(ProducerError::UnknownProducerId(_))));
        assert_eq!(s.check(&header(7, 0, 0, 3, 0)), Ok(ProducerCheck::Append));
        s.update(&header(7, 0, 0, 3, 0), None, 1);
        // The same batch again: the original offsets.
        assert_eq!(s.check(&header(7, 0, 0, 3, 99)), Ok(ProducerCheck::Duplicate { first_offset: 0, last_offset: 2 }));
        // A gap.
        assert!(matches!(s.check(&header(7, 0, 4, 1, 3)), Err(ProducerError::OutOfOrderSequence(_))));
        assert_eq!(s.check(&header(7, 0, 3, 2, 3)), Ok(ProducerCheck::Append));
        s.update(&header(7, 0, 3, 2, 3), None, 2);
        // An older epoch is fenced; a newer one must start at 0.
        assert!(matches!(s.check(&header(7, -1, 5, 1, 5)), Err(ProducerError::InvalidProducerEpoch(_))));
        assert!(matches!(s.check(&header(7, 1, 5, 1, 5)), Err(ProducerError::OutOfOrderSequence(_))));
        assert_eq!(s.check(&header(7, 1, 0, 1, 5)), Ok(ProducerCheck::Append));
        s.update(&header(7, 1, 0, 1, 5), None, 3);
        assert!(matches!(s.check(&header(7, 0, 5, 1, 6)), Err(ProducerError::InvalidProducerEpoch(_))));
        // Only the last five batches are remembered.
        for i in 1..=6 {
            s.update(&header(7, 1, i, 1, 5 + i64::from(i)), None, 4);
        }
        assert_eq!(s.producer(7).map(|e| e.batches.len()), Some(BATCHES_REMEMBERED));
        assert!(matches!(s.check(&header(7, 1, 1, 1, 20)), Err(ProducerError::OutOfOrderSequence(_))));
        assert_eq!(
            s.check(&header(7, 1, 6, 1, 20)),
            Ok(ProducerCheck::Duplicate { first_offset: 11, last_offset: 11 })
        );
        // Non-idempotent batches pass.
        assert_eq!(s.check(&header(-1, -1, -1, 5, 0)), Ok(ProducerCheck::Append));
    }

    #[test]
    fn sequence_numbers_wrap() {
        let mut s = ProducerStateManager::new();
        s.update(&header(1, 0, 0, 1, 0), None, 0);
        // Pretend the producer has reached the top of the sequence space.
        let last = s.producers.get_mut(&1).unwrap().batches.back_mut().unwrap();
        last.first_seq = i32::MAX - 2;
        last.last_seq = i32::MAX - 2;
        let at_max = header(1, 0, i32::MAX - 1, 2, 1);
        assert_eq!(last_sequence(&at_max), i32::MAX);
        assert_eq!(s.check(&at_max), Ok(ProducerCheck::Append));
        s.update(&at_max, None, 0);
        // After i32::MAX comes 0.
        assert_eq!(s.check(&header(1, 0, 0, 1, 3)), Ok(ProducerCheck::Append));
        assert!(matches!(s.check(&header(1, 0, 1, 1, 3)), Err(ProducerError::OutOfOrderSequence(_))));
        // A batch that crosses the top wraps its last sequence.
        assert_eq!(last_sequence(&header(1, 0, i32::MAX, 3, 0)), 1);
    }

    #[test]
    fn snapshots_round_trip_and_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = ProducerStateManager::new();
        s.update(&header(1, 0, 0, 3, 0), None, 1000);
        let mut txn = header(2, 4, 0, 1, 3);
        txn.attributes = crate::batch::ATTR_TRANSACTIONAL;
        s.update(&txn, None, 5000);
        assert_eq!(s.first_unstable_offset(), Some(3));
        s.write_snapshot(dir.path(), 4).unwrap();
        s.write_snapshot(dir.path(), 10).unwrap();
        s.write_snapshot(dir.path(), 20).unwrap();
        assert_eq!(snapshot_offsets(dir.path()).unwrap().len(), 2);
        let (loaded, offset) = ProducerStateManager::load_snapshot(dir.path(), 15).unwrap().unwrap();
        assert_eq!(offset, 10);
        assert_eq!(loaded.producers, s.producers);
        assert_eq!(loaded.first_unstable_offset(), Some(3));
        assert!(!snapshot_path(dir.path(), 20).exists(), "a snapshot past the log end is removed");
        // Expiry keeps producers with an open transaction.
        let mut loaded = loaded;
        assert_eq!(loaded.expire(100_000, 10_000), 1);
        assert!(loaded.producer(2).is_some());
        // A corrupt snapshot is skipped.
        std::fs::write(snapshot_path(dir.path(), 12), b"WPS1garbage").unwrap();
        let (_, offset) = ProducerStateManager::load_snapshot(dir.path(), 15).unwrap().unwrap();
        assert_eq!(offset, 10);
    }
}
