//! The sparse time index (`.timeindex`): 12-byte entries of (largest timestamp seen so far in the
//! segment: i64, relative offset of the batch that carries it: u32), big-endian as in Kafka.
//!
//! An entry is added alongside an offset-index entry when the segment's largest timestamp grew
//! since the last entry, and once more when the segment is rolled, so the last entry always
//! holds the segment's largest timestamp after a clean roll. Invariant: timestamps strictly
//! increase; offsets never decrease.

use std::path::Path;

use crate::error::Result;
use crate::index_file::IndexFile;

pub(crate) const ENTRY_BYTES: usize = 12;

pub struct TimeIndex {
    file: IndexFile,
    base_offset: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimestampOffset {
    pub timestamp: i64,
    pub offset: i64,
}

fn timestamp(entry: &[u8]) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&entry[..8]);
    i64::from_be_bytes(a)
}

fn relative_offset(entry: &[u8]) -> u32 {
    u32::from_be_bytes([entry[8], entry[9], entry[10], entry[11]])
}

impl TimeIndex {
    pub fn open(path: &Path, base_offset: i64, preallocate_bytes: Option<u64>) -> Result<TimeIndex> {
        Ok(TimeIndex { file: IndexFile::open(path, ENTRY_BYTES, preallocate_bytes)?, base_offset })
    }

    pub(crate) fn file(&mut self) -> &mut IndexFile {
        &mut self.file
    }

    pub(crate) fn entries(&self) -> usize {
        self.file.entries()
    }

    pub fn is_full(&self) -> bool {
        self.file.is_full()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.file.capacity()
    }

    fn entry(&self, i: usize) -> TimestampOffset {
        let e = self.file.entry(i);
        TimestampOffset { timestamp: timestamp(e), offset: self.base_offset + i64::from(relative_offset(e)) }
    }

    pub(crate) fn last_entry(&self) -> Option<TimestampOffset> {
        self.entries().checked_sub(1).map(|i| self.entry(i))
    }

    /// Adds (timestamp, offset) if `timestamp` is larger than the last entry's; otherwise the
    /// entry would add nothing a lookup can use.
    pub fn maybe_append(&mut self, timestamp: i64, offset: i64) {
        if let Some(last) = self.last_entry() {
            if timestamp <= last.timestamp || offset < last.offset {
                return;
            }
        }
        if self.is_full() {
            return;
        }
        let relative = u32::try_from(offset - self.base_offset).expect("relative offset fits u32 (roll guarantees)");
        let mut entry = [0u8; ENTRY_BYTES];
        entry[..8].copy_from_slice(&timestamp.to_be_bytes());
        entry[8..].copy_from_slice(&relative.to_be_bytes());
        self.file.push(&entry);
    }

    /// The last entry whose timestamp is strictly below `target`: every record before its offset
    /// has a smaller timestamp, so a search for the first record with timestamp >= `target`
    /// can start there. `None`: start at the segment's beginning.
    pub fn lookup_below(&self, target: i64) -> Option<TimestampOffset> {
        let below = target.checked_sub(1)?;
        self.file.largest_lower_bound(below, timestamp).map(|i| self.entry(i))
    }

    /// Removes the entries with offset `>= target`.
    pub(crate) fn truncate_to(&mut self, target: i64) -> Result<()> {
        // Everything goes (a rebuild): do not walk the entries. Before a rebuild the entry count
        // may be the length of a file a crash left preallocated, and walking its zero-filled tail
        // touched every page of it: 10 MiB per partition, 17 s and 16 GB of page cache for
        // 10,000 partitions.
        if target <= self.base_offset {
            return self.file.truncate_entries(0);
        }
        let mut keep = self.entries();
        while keep > 0 && self.entry(keep - 1).offset >= target {
            keep -= 1;
        }
        self.file.truncate_entries(keep)
    }

    pub(crate) fn sanity_check(&self, next_offset: i64) -> std::result::Result<(), String> {
        let mut previous: Option<TimestampOffset> = None;
        for i in 0..self.entries() {
            let e = self.entry(i);
            if e.offset >= next_offset.max(self.base_offset + 1) {
                return Err(format!("entry {i} points at offset {} past the segment", e.offset));
            }
            if let Some(p) = previous {
                if e.timestamp <= p.timestamp || e.offset < p.offset {
                    return Err(format!("entry {i} ({e:?}) does not follow {p:?}"));
                }
            }
            previous = Some(e);
        }
        Ok(())
    }
}
