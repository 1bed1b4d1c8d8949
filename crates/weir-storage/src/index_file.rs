//! A fixed-entry-size index file, preallocated and memory-mapped, shared by the offset and time
//! indexes.
//!
//! Invariants:
//! - `entries * entry_bytes <= mapped length`; entries are stored back to back from byte 0.
//! - Keys (the first field of an entry) are strictly increasing, so lookups binary-search.
//! - While a segment is active the file is preallocated to `segment.index.bytes` (rounded down
//!   to whole entries); it is trimmed to `entries * entry_bytes` when the segment is rolled or
//!   closed, so after a clean shutdown the entry count is the file length divided by the entry size.
//! - Every byte after the last entry is zero: the preallocated tail is a hole, `push` fills it in
//!   order, and truncation zeroes what it drops. So after a crash of the process alone, when the
//!   mapped pages survive in the page cache but the file is still preallocated, the entries end
//!   where the zero tail begins ([`IndexFile::drop_zero_tail`]). Example: a 10 MiB offset index
//!   holding 3 entries is 24 bytes of entries and 10,485,736 zero bytes; its length says
//!   1,310,720 entries, the zero tail says 3.
//!
//! Concurrency: not synchronised; the owning segment guards it with a mutex.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

use memmap2::MmapMut;

use crate::error::{IoContext, Result};

/// Bytes of entries searched first, Kafka's "warm section". Appends and tail reads (the common
/// case: consumers near the end of the log) only touch the entries at the end of the index, and
/// 8 KiB is two pages on most systems, so a lookup in the warm section stays within pages that
/// the writer keeps hot. A 10 MiB index at 4 KiB per entry covers ~5 GiB of log with 1024 warm
/// entries covering the newest ~4 MiB.
const WARM_SECTION_BYTES: usize = 8192;

pub(crate) struct IndexFile {
    path: PathBuf,
    /// `None` while the mapped length is zero (an empty, trimmed index cannot be mapped).
    mmap: Option<MmapMut>,
    entry_bytes: usize,
    entries: usize,
    /// Entries that fit in the current mapping.
    capacity: usize,
}

impl IndexFile {
    /// Opens (creating if needed) the index at `path`, taking the entry count from the file
    /// length: exact for a trimmed file; for a file a crash left preallocated the owner calls
    /// [`IndexFile::drop_zero_tail`]. If `preallocate_bytes` is given, the file grows to that
    /// many bytes (rounded down to whole entries) so appends need no remapping.
    pub(crate) fn open(path: &Path, entry_bytes: usize, preallocate_bytes: Option<u64>) -> Result<IndexFile> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).at(path)?;
        let length = file.metadata().at(path)?.len() as usize;
        let entries = length / entry_bytes;
        let mut index = IndexFile { path: path.to_path_buf(), mmap: None, entry_bytes, entries, capacity: 0 };
        let target = match preallocate_bytes {
            Some(bytes) => (bytes as usize / entry_bytes).max(entries) * entry_bytes,
            None => entries * entry_bytes,
        };
        index.map(&file, target)?;
        Ok(index)
    }

    /// Resizes the file and maps it again. The file descriptor is closed once mapped: a broker
    /// with 10,000 partitions would otherwise hold two more descriptors per segment.
    fn remap(&mut self, length: usize) -> Result<()> {
        self.mmap = None;
        let file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&self.path).at(&self.path)?;
        self.map(&file, length)
    }

    /// Resizes `file` (this index's, open read-write) and maps it; the old mapping must be gone.
    fn map(&mut self, file: &std::fs::File, length: usize) -> Result<()> {
        debug_assert!(self.mmap.is_none(), "{}: mapped twice", self.path.display());
        file.set_len(length as u64).at(&self.path)?;
        if length > 0 {
            // SAFETY: the mapping is of a file this process owns inside its data directory, opened
            // read-write; nothing else truncates it while mapped (the mapping is dropped before
            // every set_len). Other processes modifying it is outside the data directory contract.
            #[allow(unsafe_code)]
            let mmap = unsafe { MmapMut::map_mut(file) }.at(&self.path)?;
            // The file is preallocated and mostly a hole. Without this, every write fault in a
            // fresh page makes the kernel read ahead (zero-fill) the pages after it too: with a
            // thousand partitions that was most of the broker's CPU, and resident memory the
            // index never uses. Best effort: a kernel that refuses the hint just reads ahead.
            let _ = mmap.advise(memmap2::Advice::Random);
            self.mmap = Some(mmap);
        }
        self.capacity = length / self.entry_bytes;
        Ok(())
    }

    pub(crate) fn entries(&self) -> usize {
        self.entries
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn is_full(&self) -> bool {
        self.entries >= self.capacity
    }

    pub(crate) fn entry(&self, i: usize) -> &[u8] {
        debug_assert!(i < self.entries);
        let at = i * self.entry_bytes;
        match &self.mmap {
            Some(m) => &m[at..at + self.entry_bytes],
            None => &[],
        }
    }

    /// Appends one entry. The caller checks `is_full` first and keeps keys increasing.
    pub(crate) fn push(&mut self, entry: &[u8]) {
        assert_eq!(entry.len(), self.entry_bytes);
        assert!(!self.is_full(), "index {} is full", self.path.display());
        let at = self.entries * self.entry_bytes;
        if let Some(m) = &mut self.mmap {
            m[at..at + self.entry_bytes].copy_from_slice(entry);
            self.entries += 1;
        }
    }

    /// Keeps the first `entries` entries, zeroing the others so that the zero tail begins right
    /// after the last entry kept (stale entries after it would be counted again after a crash).
    pub(crate) fn truncate_entries(&mut self, entries: usize) -> Result<()> {
        let keep = self.entries.min(entries);
        if keep == 0 {
            return self.clear();
        }
        if let Some(m) = &mut self.mmap {
            m[keep * self.entry_bytes..self.entries * self.entry_bytes].fill(0);
        }
        self.entries = keep;
        Ok(())
    }

    /// Drops every entry by cutting the file to nothing and growing it back: the same zeroes
    /// as writing them, without touching a page. Before a rebuild the entry count may still be
    /// the length of a file a crash left preallocated, and zeroing 10 MiB per partition by hand
    /// was 17 s and 16 GB of page cache for 10,000 partitions.
    fn clear(&mut self) -> Result<()> {
        let length = self.capacity * self.entry_bytes;
        self.entries = 0;
        self.remap(0)?;
        self.remap(length)
    }

    /// Ends the entries where the zero-filled tail begins (see the module invariants), for a
    /// file that a crash may have left preallocated. Reads the entries up to the first all-zero
    /// one, not the tail. Only the first entry can be all zero in a sound index (keys strictly
    /// increase from it; for the offset index it is relative offset 0 at position 0); followed
    /// by another all-zero entry it cannot be told from the tail and is dropped, which loses
    /// nothing (an offset index with no entries also starts lookups at position 0, and an empty
    /// time index only makes the caller read the segment's batch headers).
    pub(crate) fn drop_zero_tail(&mut self) {
        let Some(m) = &self.mmap else { return };
        let is_zero = |i: usize| m[i * self.entry_bytes..(i + 1) * self.entry_bytes].iter().all(|b| *b == 0);
        let mut entries = self.entries.min(1);
        while entries < self.entries && !is_zero(entries) {
            entries += 1;
        }
        if entries == 1 && self.entries > 1 && is_zero(0) {
            entries = 0;
        }
        self.entries = entries;
    }

    /// Grows the file back to `bytes` (when a trimmed index becomes active again after truncation).
    pub(crate) fn preallocate(&mut self, bytes: u64) -> Result<()> {
        let target = (bytes as usize / self.entry_bytes).max(self.entries) * self.entry_bytes;
        if target / self.entry_bytes != self.capacity {
            self.flush()?;
            self.remap(target)?;
        }
        Ok(())
    }

    /// Shrinks the file to the used entries (on roll and close).
    pub(crate) fn trim(&mut self) -> Result<()> {
        if self.capacity != self.entries {
            self.flush()?;
            self.remap(self.entries * self.entry_bytes)?;
        }
        Ok(())
    }

    pub(crate) fn flush(&mut self) -> Result<()> {
        if let Some(m) = &self.mmap {
            m.flush().at(&self.path)?;
        }
        Ok(())
    }

    /// Index of the last entry whose key is `<= target`, searching the warm section first.
    /// `key` extracts an entry's key.
    pub(crate) fn largest_lower_bound<K: Ord + Copy>(&self, target: K, key: impl Fn(&[u8]) -> K) -> Option<usize> {
        if self.entries == 0 || key(self.entry(0)) > target {
            return None;
        }
        let warm_entries = (WARM_SECTION_BYTES / self.entry_bytes).max(1);
        let first_warm = self.entries.saturating_sub(warm_entries);
        if key(self.entry(first_warm)) <= target {
            return Some(self.search(first_warm, self.entries - 1, target, &key));
        }
        Some(self.search(0, first_warm, target, &key))
    }

    /// Binary search in `[low, high]` where `key(low) <= target`.
    fn search<K: Ord + Copy>(&self, mut low: usize, mut high: usize, target: K, key: &impl Fn(&[u8]) -> K) -> usize {
        while low < high {
            let mid = low + (high - low).div_ceil(2);
            if key(self.entry(mid)) <= target {
                low = mid;
            } else {
                high = mid - 1;
            }
        }
        low
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the file (its mapping stays valid).
    pub(crate) fn rename(&mut self, to: &Path) -> Result<()> {
        std::fs::rename(&self.path, to).at(&self.path)?;
        self.path = to.to_path_buf();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENTRY_BYTES: usize = 8;
    /// 512 entries, as `segment.index.bytes = 4096` preallocates an offset index.
    const PREALLOCATED_BYTES: u64 = 4096;

    fn entry(key: u32, value: u32) -> [u8; ENTRY_BYTES] {
        let mut e = [0u8; ENTRY_BYTES];
        e[..4].copy_from_slice(&key.to_be_bytes());
        e[4..].copy_from_slice(&value.to_be_bytes());
        e
    }

    /// An active index holding `entries`, left preallocated as a crash leaves it, then opened
    /// again as the next process opens it.
    fn reopened_after_a_crash(dir: &Path, entries: &[[u8; ENTRY_BYTES]]) -> IndexFile {
        let path = dir.join("00000000000000000000.index");
        let mut index = IndexFile::open(&path, ENTRY_BYTES, Some(PREALLOCATED_BYTES)).expect("open");
        for e in entries {
            index.push(e);
        }
        drop(index);
        let mut index = IndexFile::open(&path, ENTRY_BYTES, Some(PREALLOCATED_BYTES)).expect("reopen");
        assert_eq!(index.entries(), 512, "the length counts the zero tail");
        index.drop_zero_tail();
        index
    }

    #[test]
    fn given_a_preallocated_index_left_by_a_crash_when_its_zero_tail_is_dropped_should_count_its_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        let index = reopened_after_a_crash(dir.path(), &[entry(3, 4100), entry(7, 8200), entry(12, 12_300)]);
        assert_eq!(index.entries(), 3);
        assert_eq!(index.entry(2), entry(12, 12_300));
    }

    #[test]
    fn given_a_preallocated_index_with_no_entry_when_its_zero_tail_is_dropped_should_count_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(reopened_after_a_crash(dir.path(), &[]).entries(), 0);
    }

    #[test]
    fn given_a_first_entry_of_zeros_followed_by_others_when_the_zero_tail_is_dropped_should_keep_it() {
        // Relative offset 0 at position 0 is a legitimate first entry; what follows shows it is
        // not the tail.
        let dir = tempfile::tempdir().expect("tempdir");
        let index = reopened_after_a_crash(dir.path(), &[entry(0, 0), entry(5, 4100)]);
        assert_eq!(index.entries(), 2);
        assert_eq!(index.entry(0), entry(0, 0));
    }

    #[test]
    fn given_a_trimmed_index_of_one_zero_entry_when_the_zero_tail_is_dropped_should_keep_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("00000000000000000000.index");
        std::fs::write(&path, entry(0, 0)).expect("write");
        let mut index = IndexFile::open(&path, ENTRY_BYTES, None).expect("open");
        index.drop_zero_tail();
        assert_eq!(index.entries(), 1);
    }

    #[test]
    fn given_entries_truncated_when_reopened_after_a_crash_should_not_count_the_dropped_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("00000000000000000000.index");
        let mut index = IndexFile::open(&path, ENTRY_BYTES, Some(PREALLOCATED_BYTES)).expect("open");
        for i in 1..=6 {
            index.push(&entry(i * 10, i * 4000));
        }
        index.truncate_entries(2).expect("truncate");
        index.push(&entry(25, 9000));
        drop(index);
        let mut index = IndexFile::open(&path, ENTRY_BYTES, Some(PREALLOCATED_BYTES)).expect("reopen");
        index.drop_zero_tail();
        assert_eq!(index.entries(), 3, "entries 4 to 6 of before the truncation are gone");
        index.truncate_entries(0).expect("clear");
        drop(index);
        let mut index = IndexFile::open(&path, ENTRY_BYTES, Some(PREALLOCATED_BYTES)).expect("reopen");
        assert_eq!(index.capacity(), 512, "cleared, still preallocated");
        index.drop_zero_tail();
        assert_eq!(index.entries(), 0);
    }
}
