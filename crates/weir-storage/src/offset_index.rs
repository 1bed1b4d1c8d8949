//! The sparse offset index (`.index`): 8-byte entries of (offset relative to the segment's base
//! offset: u32, position of the batch in the `.log`: u32), both big-endian as in Kafka.
//!
//! An entry is added after every `index.interval.bytes` of appended log, pointing at the start
//! of the batch that crossed the interval. Invariant: relative offsets and positions are both
//! strictly increasing, and every position is the start of a batch in the segment's `.log`.

use std::path::Path;

use crate::error::Result;
use crate::index_file::IndexFile;

pub(crate) const ENTRY_BYTES: usize = 8;

pub struct OffsetIndex {
    file: IndexFile,
    base_offset: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetPosition {
    pub offset: i64,
    pub position: u32,
}

fn relative_offset(entry: &[u8]) -> u32 {
    u32::from_be_bytes([entry[0], entry[1], entry[2], entry[3]])
}

fn position(entry: &[u8]) -> u32 {
    u32::from_be_bytes([entry[4], entry[5], entry[6], entry[7]])
}

impl OffsetIndex {
    pub fn open(path: &Path, base_offset: i64, preallocate_bytes: Option<u64>) -> Result<OffsetIndex> {
        Ok(OffsetIndex { file: IndexFile::open(path, ENTRY_BYTES, preallocate_bytes)?, base_offset })
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

    fn entry(&self, i: usize) -> OffsetPosition {
        let e = self.file.entry(i);
        OffsetPosition { offset: self.base_offset + i64::from(relative_offset(e)), position: position(e) }
    }

    pub(crate) fn last_entry(&self) -> Option<OffsetPosition> {
        self.entries().checked_sub(1).map(|i| self.entry(i))
    }

    /// The entry before the last one.
    pub(crate) fn second_to_last_entry(&self) -> Option<OffsetPosition> {
        self.entries().checked_sub(2).map(|i| self.entry(i))
    }

    /// Adds an entry; the caller guarantees `offset` and `position` exceed the last entry's and
    /// that the index is not full.
    pub fn append(&mut self, offset: i64, position: u32) {
        let relative = u32::try_from(offset - self.base_offset).expect("relative offset fits u32 (roll guarantees)");
        if let Some(last) = self.last_entry() {
            assert!(offset > last.offset && position > last.position, "offset index must grow");
        }
        let mut entry = [0u8; ENTRY_BYTES];
        entry[..4].copy_from_slice(&relative.to_be_bytes());
        entry[4..].copy_from_slice(&position.to_be_bytes());
        self.file.push(&entry);
    }

    /// The last entry with offset `<= target`, or the segment start if there is none.
    pub fn lookup(&self, target: i64) -> OffsetPosition {
        let Ok(relative) = u32::try_from(target.saturating_sub(self.base_offset)) else {
            return OffsetPosition { offset: self.base_offset, position: 0 };
        };
        match self.file.largest_lower_bound(relative, relative_offset) {
            Some(i) => self.entry(i),
            None => OffsetPosition { offset: self.base_offset, position: 0 },
        }
    }

    /// Removes the entries with offset `>= target`.
    pub(crate) fn truncate_to(&mut self, target: i64) -> Result<()> {
        let keep = if target <= self.base_offset {
            0
        } else {
            match u32::try_from(target.saturating_sub(self.base_offset)) {
                Err(_) => self.entries(),
                Ok(relative) => self.file.largest_lower_bound(relative - 1, relative_offset).map_or(0, |i| i + 1),
            }
        };
        self.file.truncate_entries(keep)
    }

    /// Checks the invariants against the segment: entries strictly increasing, positions inside
    /// the log. A failure means the index must be rebuilt from the log.
    pub(crate) fn sanity_check(&self, log_bytes: u64) -> std::result::Result<(), String> {
        let mut previous: Option<OffsetPosition> = None;
        for i in 0..self.entries() {
            let e = self.entry(i);
            if u64::from(e.position) >= log_bytes.max(1) {
                return Err(format!("entry {i} points at byte {} past the log's {log_bytes}", e.position));
            }
            if let Some(p) = previous {
                if e.offset <= p.offset || e.position <= p.position {
                    return Err(format!("entry {i} ({e:?}) does not follow {p:?}"));
                }
            }
            previous = Some(e);
        }
        Ok(())
    }
}
