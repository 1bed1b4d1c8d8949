//! Aborted transactions of a partition, for `read_committed` fetches: which producer's records
//! in which offset range a consumer must drop (Kafka's `.txnindex`).
//!
//! One append-only file per partition, `aborted-transactions.txnindex`, of fixed 34-byte
//! entries in Kafka's layout (version i16 = 0, producerId i64, firstOffset i64, lastOffset i64,
//! lastStableOffset i64), also held in memory (an abort is rare and an entry small). The file is
//! not fsynced on every abort: the markers themselves are in the log, and the producer state
//! rebuild at start-up re-derives every abort after the newest producer snapshot; the file is
//! fsynced before each snapshot is written, so the two together always cover the whole log.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::checkpoint::write_atomically;
use crate::error::{IoContext, Result};

pub(crate) const TXN_INDEX_FILE: &str = "aborted-transactions.txnindex";
const ENTRY_BYTES: usize = 34;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: i64,
    /// The transaction's first offset in this partition.
    pub first_offset: i64,
    /// The offset of its abort marker.
    pub last_offset: i64,
    /// The last stable offset right after the abort.
    pub last_stable_offset: i64,
}

impl AbortedTxn {
    fn encode(&self) -> [u8; ENTRY_BYTES] {
        let mut out = [0u8; ENTRY_BYTES];
        out[2..10].copy_from_slice(&self.producer_id.to_be_bytes());
        out[10..18].copy_from_slice(&self.first_offset.to_be_bytes());
        out[18..26].copy_from_slice(&self.last_offset.to_be_bytes());
        out[26..34].copy_from_slice(&self.last_stable_offset.to_be_bytes());
        out
    }

    fn decode(b: &[u8]) -> Option<AbortedTxn> {
        let i64_at = |at: usize| b.get(at..at + 8).and_then(|s| s.try_into().ok()).map(i64::from_be_bytes);
        if b.get(0..2)? != [0, 0] {
            return None;
        }
        Some(AbortedTxn {
            producer_id: i64_at(2)?,
            first_offset: i64_at(10)?,
            last_offset: i64_at(18)?,
            last_stable_offset: i64_at(26)?,
        })
    }
}

/// Holds no file descriptor between calls (a broker has one per partition, and aborts are
/// rare), and creates its file only at the first abort.
pub(crate) struct TxnIndex {
    path: PathBuf,
    entries: Vec<AbortedTxn>,
}

impl TxnIndex {
    /// The empty index of a partition created just now: no file to read (it is made at the
    /// first abort).
    pub fn empty(dir: &Path) -> TxnIndex {
        TxnIndex { path: dir.join(TXN_INDEX_FILE), entries: Vec::new() }
    }

    /// Opens the index of the partition in `dir`, keeping entries that end before `log_end`
    /// (a torn last entry, or entries past a truncated log end, are dropped).
    pub fn open(dir: &Path, log_end: i64) -> Result<TxnIndex> {
        let path = dir.join(TXN_INDEX_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e).at(&path),
        };
        let decoded: Vec<AbortedTxn> = bytes.chunks_exact(ENTRY_BYTES).map_while(AbortedTxn::decode).collect();
        let kept: Vec<AbortedTxn> = decoded.iter().copied().filter(|e| e.last_offset < log_end).collect();
        if kept.len() * ENTRY_BYTES != bytes.len() {
            write_atomically(&path, &encode_all(&kept))?;
        }
        Ok(TxnIndex { path, entries: kept })
    }

    #[cfg(test)]
    pub fn entries(&self) -> &[AbortedTxn] {
        &self.entries
    }

    pub fn contains(&self, producer_id: i64, last_offset: i64) -> bool {
        self.entries.iter().any(|e| e.producer_id == producer_id && e.last_offset == last_offset)
    }

    pub fn append(&mut self, entry: AbortedTxn) -> Result<()> {
        let mut file = OpenOptions::new().create(true).append(true).open(&self.path).at(&self.path)?;
        file.write_all(&entry.encode()).at(&self.path)?;
        self.entries.push(entry);
        Ok(())
    }

    pub fn sync(&self) -> Result<()> {
        if self.entries.is_empty() {
            return Ok(());
        }
        File::open(&self.path).and_then(|f| f.sync_data()).at(&self.path)
    }

    /// Drops entries at or after `log_end` (the log was truncated).
    pub fn truncate(&mut self, log_end: i64) -> Result<()> {
        let before = self.entries.len();
        self.entries.retain(|e| e.last_offset < log_end);
        if self.entries.len() != before {
            self.rewrite()?;
        }
        Ok(())
    }

    /// Drops entries wholly below `log_start` (retention removed their data).
    pub(crate) fn prune(&mut self, log_start: i64) -> Result<()> {
        let before = self.entries.len();
        self.entries.retain(|e| e.last_offset >= log_start);
        if self.entries.len() != before {
            self.rewrite()?;
        }
        Ok(())
    }

    fn rewrite(&mut self) -> Result<()> {
        write_atomically(&self.path, &encode_all(&self.entries))
    }

    /// The aborted transactions a fetch of `[from, upper)` must report: those whose range
    /// overlaps it.
    pub fn overlapping(&self, from: i64, upper: i64) -> Vec<AbortedTxn> {
        self.entries.iter().copied().filter(|e| e.last_offset >= from && e.first_offset < upper).collect()
    }
}

fn encode_all(entries: &[AbortedTxn]) -> Vec<u8> {
    entries.iter().flat_map(|e| e.encode()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(pid: i64, first: i64, last: i64) -> AbortedTxn {
        AbortedTxn { producer_id: pid, first_offset: first, last_offset: last, last_stable_offset: last + 1 }
    }

    #[test]
    fn entries_persist_and_truncate() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut index = TxnIndex::open(dir.path(), 0).unwrap();
            index.append(txn(1, 0, 5)).unwrap();
            index.append(txn(2, 3, 9)).unwrap();
            index.append(txn(3, 12, 20)).unwrap();
            index.sync().unwrap();
        }
        // A torn entry at the end is dropped, as are entries past the log end.
        let path = dir.path().join(TXN_INDEX_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&[0, 0, 1, 2]);
        std::fs::write(&path, &bytes).unwrap();
        let mut index = TxnIndex::open(dir.path(), 15).unwrap();
        assert_eq!(index.entries(), &[txn(1, 0, 5), txn(2, 3, 9)]);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * ENTRY_BYTES as u64);
        assert_eq!(index.overlapping(6, 100), vec![txn(2, 3, 9)]);
        assert_eq!(index.overlapping(0, 3), vec![txn(1, 0, 5)]);
        index.prune(6).unwrap();
        index.append(txn(4, 10, 11)).unwrap();
        let index = TxnIndex::open(dir.path(), 100).unwrap();
        assert_eq!(index.entries(), &[txn(2, 3, 9), txn(4, 10, 11)]);
        assert!(index.contains(4, 11));
    }
}
