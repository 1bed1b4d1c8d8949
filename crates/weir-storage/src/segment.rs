//! One segment of a partition log: `<base offset>.log` with its `.index` and `.timeindex`.
//!
//! Concurrency contract: one writer at a time (the owning `Log` serialises `append`, `truncate_to`
//! and `roll` behind its writer lock); any number of concurrent readers. Readers see only
//! `size` bytes, which the writer publishes after the bytes are in the file and the indexes are
//! updated, so a reader never observes a partial batch.
//!
//! Lazy verification: a segment loaded without a recovery scan (clean shutdown, or below the
//! recovery point) has not had its CRCs checked by this process. Before a range is served for the
//! first time its batches are validated (`verified_bytes` marks how far), so bit rot in a closed
//! segment becomes a `CorruptSegment` error instead of bytes sent silently to a consumer. Data
//! appended or recovered by this process is validated already and costs nothing.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::batch::{self, BatchHeader, HEADER_BYTES};
use crate::error::{IoContext, Result, StorageError};
use crate::file_slice::FileSlice;
use crate::offset_index::{self, OffsetIndex};
use crate::sync::lock;
use crate::time_index::{self, TimeIndex};

/// The largest batch recovery accepts; anything claiming more is a corrupt length field.
const RECOVERY_MAX_BATCH_BYTES: usize = i32::MAX as usize;
/// Read size for sequential scans (recovery, verification).
const SCAN_CHUNK_BYTES: usize = 1 << 20;

pub(crate) fn file_name(base_offset: i64, suffix: &str) -> String {
    format!("{base_offset:020}{suffix}")
}

pub(crate) struct Segment {
    base_offset: i64,
    dir: PathBuf,
    /// `dir`'s `<base offset>.log`, kept: reads name it in their errors.
    log_path: PathBuf,
    log: Arc<File>,
    /// Bytes of whole batches visible to readers.
    size: AtomicU64,
    /// Bytes from the start whose batches passed CRC validation in this process.
    verified_bytes: AtomicU64,
    state: Mutex<SegmentState>,
    /// Subtracted from `segment.ms` so that many partitions do not roll at once.
    pub(crate) roll_jitter_ms: u64,
    /// Wall-clock creation (or load) time; used for time-based rolls of an empty-timestamp segment.
    pub(crate) created_ms: i64,
    /// The segment started empty in this process, so `created_ms` is its true age.
    pub(crate) created_empty: bool,
    /// The log's count of index rebuilds (`LogStats::index_rebuilds`).
    index_rebuilds: Arc<AtomicU64>,
}

struct SegmentState {
    offset_index: Option<OffsetIndex>,
    time_index: Option<TimeIndex>,
    /// True for the active segment: its indexes stay preallocated.
    active: bool,
    index_preallocate_bytes: u64,
    /// `index.interval.bytes` in force (refreshed by every append).
    index_interval_bytes: u64,
    bytes_since_last_index_entry: u64,
    /// Largest batch maxTimestamp in the segment (`i64::MIN` when unknown or empty).
    max_timestamp: i64,
    /// Base offset of the batch carrying `max_timestamp`.
    offset_of_max_timestamp: i64,
    /// maxTimestamp of the first batch, which decides time-based rolls (as in Kafka).
    first_batch_timestamp: Option<i64>,
    /// The offset after the last batch, once known.
    next_offset: Option<i64>,
    /// Where recent reads found batches ([`ReadPositions`]).
    read_positions: ReadPositions,
}

/// How many reads a segment remembers the batches of: about as many readers as a partition
/// has at once (its followers, consumer groups, receiving groups).
const READS_REMEMBERED: usize = 8;

/// Where the last [`READS_REMEMBERED`] reads of a segment found batches: for each, ascending,
/// the (base offset, position) of every batch of an in-memory read (its reader decodes and may
/// stop within it: a receive of 32 messages out of a larger read), then the offset after the
/// read with the position where it ended (where a follower or a consumer goes on). Such a
/// reader then starts at its batch's header, not at the sparse index entry below it with a
/// 16 KiB read of the headers between. Invariant: every position remembered is the start of a
/// batch of this file, or its end; so they are forgotten whenever the file is cut.
#[derive(Default)]
struct ReadPositions {
    reads: std::collections::VecDeque<Vec<(i64, u64)>>,
}

impl ReadPositions {
    /// The position of the batch whose base offset is `offset`, if a read found or ended there.
    fn position_of(&self, offset: i64) -> Option<u64> {
        self.reads.iter().rev().find_map(|batches| {
            let (first, last) = (batches.first()?, batches.last()?);
            if offset < first.0 || offset > last.0 {
                return None;
            }
            batches.binary_search_by_key(&offset, |(base, _)| *base).ok().map(|i| batches[i].1)
        })
    }

    /// A read's batches, as [`ReadPositions`] keeps them.
    fn remember(&mut self, batches: Vec<(i64, u64)>) {
        debug_assert!(batches.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1), "batches out of order");
        if self.reads.len() == READS_REMEMBERED {
            self.reads.pop_front();
        }
        self.reads.push_back(batches);
    }

    fn clear(&mut self) {
        self.reads.clear();
    }
}

/// What the index files of a segment being loaded may hold, which decides how their entries are
/// counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IndexFiles {
    /// As roll, close or a rebuild left them: trimmed to their entries (the active segment's are
    /// preallocated again after loading). An all-zero entry after the first is damage.
    Trimmed,
    /// As a crash of the process left them: the segment that was active (or whose roll the
    /// crash cut short) still has its preallocated, zero-filled tail, which must not be taken
    /// for entries. Only after `page_cache_survived`: after a machine crash, recovery rebuilds.
    LeftByProcessCrash,
}

/// What a recovery scan found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecoveryOutcome {
    pub(crate) truncated_bytes: u64,
    pub next_offset: Option<i64>,
}

/// Where a read for an offset landed in this segment.
pub(crate) enum SegmentRead {
    Slice(FileSlice),
    /// The first batch at or after the offset is at or beyond the upper bound.
    AtUpperBound,
    /// No batch at or after the offset in this segment: look in the next one.
    NotHere,
}

impl Segment {
    pub(crate) fn log_path(&self) -> &Path {
        &self.log_path
    }
    pub(crate) fn index_path(&self) -> PathBuf {
        self.dir.join(file_name(self.base_offset, ".index"))
    }
    pub(crate) fn time_index_path(&self) -> PathBuf {
        self.dir.join(file_name(self.base_offset, ".timeindex"))
    }

    /// Creates a new, empty, active segment.
    pub(crate) fn create(
        dir: &Path,
        base_offset: i64,
        index_bytes: u64,
        roll_jitter_ms: u64,
        now_ms: i64,
        index_rebuilds: &Arc<AtomicU64>,
    ) -> Result<Segment> {
        Segment::create_with(dir, base_offset, index_bytes, roll_jitter_ms, now_ms, index_rebuilds, false)
    }

    /// [`Segment::create`] in a directory made just now, where no stale index file of an
    /// earlier life of this base offset can be: none is looked for, and the indexes are made
    /// on first use (the first append, read or roll check), as those of a segment opened at
    /// start-up are loaded. A new partition is then a `mkdir` and one file until it is written
    /// to: making the two preallocated, mapped index files was most of the cost of creating a
    /// partition (about 0.6 ms per file operation on the test VM under load), and a partition
    /// created and never written holds no map. A crash before the first use leaves the `.log`
    /// alone, which `Segment::open` takes as it is (an empty segment needs no index).
    pub(crate) fn create_in_new_dir(
        dir: &Path,
        base_offset: i64,
        index_bytes: u64,
        roll_jitter_ms: u64,
        now_ms: i64,
        index_rebuilds: &Arc<AtomicU64>,
    ) -> Result<Segment> {
        Segment::create_with(dir, base_offset, index_bytes, roll_jitter_ms, now_ms, index_rebuilds, true)
    }

    fn create_with(
        dir: &Path,
        base_offset: i64,
        index_bytes: u64,
        roll_jitter_ms: u64,
        now_ms: i64,
        index_rebuilds: &Arc<AtomicU64>,
        new_dir: bool,
    ) -> Result<Segment> {
        let path = dir.join(file_name(base_offset, ".log"));
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).at(&path)?;
        let segment =
            Segment::new(dir, base_offset, file, 0, true, index_bytes, roll_jitter_ms, now_ms, index_rebuilds);
        {
            let mut state = segment.lock();
            if !new_dir {
                // Stale index files from an earlier life of this base offset must not survive.
                for p in [segment.index_path(), segment.time_index_path()] {
                    let _ = std::fs::remove_file(&p);
                }
                segment.load_indexes(&mut state)?;
            }
            state.next_offset = Some(base_offset);
        }
        Ok(segment)
    }

    /// Opens an existing segment without reading its data. Indexes load on first use.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn open(
        dir: &Path,
        base_offset: i64,
        active: bool,
        index_bytes: u64,
        roll_jitter_ms: u64,
        now_ms: i64,
        index_rebuilds: &Arc<AtomicU64>,
    ) -> Result<Segment> {
        let path = dir.join(file_name(base_offset, ".log"));
        let file = OpenOptions::new().read(true).write(true).open(&path).at(&path)?;
        let size = file.metadata().at(&path)?.len();
        Ok(Segment::new(dir, base_offset, file, size, active, index_bytes, roll_jitter_ms, now_ms, index_rebuilds))
    }

    #[allow(clippy::too_many_arguments)]
    fn new(
        dir: &Path,
        base_offset: i64,
        file: File,
        size: u64,
        active: bool,
        index_bytes: u64,
        roll_jitter_ms: u64,
        now_ms: i64,
        index_rebuilds: &Arc<AtomicU64>,
    ) -> Segment {
        Segment {
            base_offset,
            dir: dir.to_path_buf(),
            log_path: dir.join(file_name(base_offset, ".log")),
            log: Arc::new(file),
            size: AtomicU64::new(size),
            verified_bytes: AtomicU64::new(0),
            state: Mutex::new(SegmentState {
                offset_index: None,
                time_index: None,
                active,
                index_preallocate_bytes: index_bytes,
                index_interval_bytes: 4096,
                bytes_since_last_index_entry: 0,
                max_timestamp: i64::MIN,
                offset_of_max_timestamp: base_offset,
                first_batch_timestamp: None,
                next_offset: if size == 0 { Some(base_offset) } else { None },
                read_positions: ReadPositions::default(),
            }),
            roll_jitter_ms,
            created_ms: now_ms,
            created_empty: size == 0,
            index_rebuilds: Arc::clone(index_rebuilds),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SegmentState> {
        // A panic while holding this lock is a bug already reported; the state it guards is
        // rebuilt from the log on the next open, so continuing with it is safe.
        lock(&self.state)
    }

    pub(crate) fn base_offset(&self) -> i64 {
        self.base_offset
    }

    pub(crate) fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    pub(crate) fn file(&self) -> &Arc<File> {
        &self.log
    }

    /// Opens the indexes if they are not open yet, rebuilding them from the log when they are
    /// missing or fail their sanity check.
    fn load_indexes(&self, state: &mut SegmentState) -> Result<()> {
        self.load_indexes_left_as(state, IndexFiles::Trimmed)
    }

    fn load_indexes_left_as(&self, state: &mut SegmentState, files: IndexFiles) -> Result<()> {
        if state.offset_index.is_some() && state.time_index.is_some() {
            return Ok(());
        }
        let prealloc = state.active.then_some(state.index_preallocate_bytes);
        let index_path = self.index_path();
        let time_index_path = self.time_index_path();
        let missing = !index_path.exists() || !time_index_path.exists();
        // Index files hold whole entries (trimmed or preallocated alike); a length that is not a
        // multiple of the entry size is damage. Checked before opening: `open` rounds the file
        // down to whole entries, silently dropping the last (often the largest-timestamp) entry.
        let torn = [(&index_path, offset_index::ENTRY_BYTES), (&time_index_path, time_index::ENTRY_BYTES)]
            .into_iter()
            .any(|(path, entry)| std::fs::metadata(path).is_ok_and(|m| m.len() % entry as u64 != 0));
        let mut offset_index = OffsetIndex::open(&index_path, self.base_offset, prealloc)?;
        let mut time_index = TimeIndex::open(&time_index_path, self.base_offset, prealloc)?;
        if files == IndexFiles::LeftByProcessCrash {
            // The length of a file the crash left preallocated counts its zero tail as entries,
            // which the sanity check below then found out of order: every partition's active
            // segment was rebuilt at every restart after kill -9.
            offset_index.file().drop_zero_tail();
            time_index.file().drop_zero_tail();
        }
        let size = self.size();
        // After a process crash the caller reads every batch header after the last offset-index
        // entry, which restores the segment's largest timestamp; with no offset-index entry that
        // is the whole segment, whose time index is empty too until its first entry.
        let tail_scan_finds_largest_timestamp = files == IndexFiles::LeftByProcessCrash && offset_index.entries() == 0;
        let problem = if missing && size > 0 {
            Some("index files missing".to_string())
        } else if torn {
            Some("index file cut inside an entry".to_string())
        } else if size > 0 && time_index.entries() == 0 && !tail_scan_finds_largest_timestamp {
            // Roll, close and recovery always leave the largest timestamp as the last time-index
            // entry, so a segment with batches and an empty time index lost it (an emptied or
            // lost file). Without it the segment's largest timestamp would read as "none", and
            // ListOffsets by timestamp and time-based retention would skip the segment.
            Some("time index empty for a non-empty segment".to_string())
        } else {
            offset_index.sanity_check(size).err().or_else(|| time_index.sanity_check(i64::MAX).err())
        };
        state.offset_index = Some(offset_index);
        state.time_index = Some(time_index);
        if let Some(problem) = problem {
            tracing::warn!(segment = %self.log_path().display(), %problem, "rebuilding indexes");
            self.index_rebuilds.fetch_add(1, Ordering::Relaxed);
            self.rebuild_indexes(state)?;
        } else {
            let ti = state.time_index.as_ref().and_then(TimeIndex::last_entry);
            if let Some(last) = ti {
                if last.timestamp > state.max_timestamp {
                    state.max_timestamp = last.timestamp;
                    state.offset_of_max_timestamp = last.offset;
                }
            }
            let last_position =
                state.offset_index.as_ref().and_then(OffsetIndex::last_entry).map_or(0, |e| u64::from(e.position));
            state.bytes_since_last_index_entry = size.saturating_sub(last_position);
        }
        Ok(())
    }

    fn indexes<'a>(&self, state: &'a mut SegmentState) -> Result<(&'a mut OffsetIndex, &'a mut TimeIndex)> {
        self.load_indexes(state)?;
        match (state.offset_index.as_mut(), state.time_index.as_mut()) {
            (Some(o), Some(t)) => Ok((o, t)),
            _ => unreachable!("load_indexes opens both"),
        }
    }

    /// Rebuilds both indexes by scanning batch headers (no CRC check). Used when an index file
    /// is missing or insane but the log itself is trusted.
    fn rebuild_indexes(&self, state: &mut SegmentState) -> Result<()> {
        let interval = state.index_interval_bytes;
        self.reset_indexes(state)?;
        let mut scanner = HeaderScanner::new(&self.log, self.log_path(), 0, self.size());
        while let Some((position, header)) = scanner.next()? {
            self.index_batch(state, position, &header, interval);
        }
        state.next_offset = Some(scanner.last_next_offset.unwrap_or(self.base_offset));
        // As at roll and close: persist the largest timestamp, which `index_batch` only indexes
        // at interval boundaries; without it the next open would understate it. A closed segment's
        // indexes are trimmed again (`indexes_raw` preallocated them for the rebuild).
        append_largest_timestamp_entry(state);
        if !state.active {
            let (oi, ti) = self.indexes_raw(state)?;
            oi.file().trim()?;
            ti.file().trim()?;
        }
        Ok(())
    }

    fn reset_indexes(&self, state: &mut SegmentState) -> Result<()> {
        let (oi, ti) = self.indexes_raw(state)?;
        oi.truncate_to(i64::MIN)?;
        ti.truncate_to(i64::MIN)?;
        state.bytes_since_last_index_entry = 0;
        state.max_timestamp = i64::MIN;
        state.offset_of_max_timestamp = self.base_offset;
        state.first_batch_timestamp = None;
        Ok(())
    }

    /// The indexes without sanity checks (for rebuilding them).
    fn indexes_raw<'a>(&self, state: &'a mut SegmentState) -> Result<(&'a mut OffsetIndex, &'a mut TimeIndex)> {
        let prealloc = Some(state.index_preallocate_bytes);
        if state.offset_index.is_none() {
            state.offset_index = Some(OffsetIndex::open(&self.index_path(), self.base_offset, prealloc)?);
        }
        if state.time_index.is_none() {
            state.time_index = Some(TimeIndex::open(&self.time_index_path(), self.base_offset, prealloc)?);
        }
        let bytes = state.index_preallocate_bytes;
        match (state.offset_index.as_mut(), state.time_index.as_mut()) {
            (Some(o), Some(t)) => {
                // A rebuild may need more room than a trimmed file has.
                o.file().preallocate(bytes)?;
                t.file().preallocate(bytes)?;
                Ok((o, t))
            }
            _ => unreachable!("opened above"),
        }
    }

    /// Records one batch (at `position`, already in the file) in the indexes and statistics.
    fn index_batch(&self, state: &mut SegmentState, position: u64, header: &BatchHeader, interval: u64) {
        if state.first_batch_timestamp.is_none() {
            state.first_batch_timestamp = Some(header.max_timestamp);
        }
        if header.max_timestamp > state.max_timestamp {
            state.max_timestamp = header.max_timestamp;
            state.offset_of_max_timestamp = header.base_offset;
        }
        let size = header.size_bytes().unwrap_or(0) as u64;
        if state.bytes_since_last_index_entry >= interval && position > 0 {
            let (max_ts, max_ts_offset) = (state.max_timestamp, state.offset_of_max_timestamp);
            if let (Some(oi), Some(ti)) = (state.offset_index.as_mut(), state.time_index.as_mut()) {
                if !oi.is_full() {
                    oi.append(header.base_offset, position as u32);
                    ti.maybe_append(max_ts, max_ts_offset);
                }
            }
            state.bytes_since_last_index_entry = 0;
        }
        state.bytes_since_last_index_entry += size;
        state.next_offset = Some(header.next_offset());
    }

    /// True when the indexes cannot take another entry (the log must roll).
    pub(crate) fn indexes_full(&self) -> Result<bool> {
        let mut state = self.lock();
        let (oi, ti) = self.indexes(&mut state)?;
        // Keep one time-index slot for the entry written at roll.
        Ok(oi.is_full() || ti.entries() + 1 >= ti.capacity())
    }

    /// Appends whole, validated batches whose offsets are already assigned. Called by the single
    /// writer only. On an I/O error the file is cut back so no partial batch remains visible.
    pub(crate) fn append(&self, bytes: &[u8], index_interval_bytes: u64) -> Result<()> {
        let position = self.size();
        let path = self.log_path();
        if let Err(e) = self.log.write_all_at(bytes, position) {
            let _ = self.log.set_len(position);
            return Err(StorageError::io(path, e));
        }
        let mut state = self.lock();
        state.index_interval_bytes = index_interval_bytes;
        self.indexes(&mut state)?;
        for (at, header) in batch::headers(bytes) {
            self.index_batch(&mut state, position + at as u64, &header, index_interval_bytes);
        }
        drop(state);
        let end = position + bytes.len() as u64;
        // Appended bytes were validated on the way in.
        if self.verified_bytes.load(Ordering::Acquire) == position {
            self.verified_bytes.store(end, Ordering::Release);
        }
        self.size.store(end, Ordering::Release);
        Ok(())
    }

    /// Scans the whole log validating every batch, truncates at the first invalid one (a torn or
    /// corrupt tail), and rebuilds the indexes.
    pub(crate) fn recover(&self, index_interval_bytes: u64, min_base_offset: i64) -> Result<RecoveryOutcome> {
        let mut state = self.lock();
        state.index_interval_bytes = index_interval_bytes;
        self.reset_indexes(&mut state)?;
        let path = self.log_path();
        let file_len = self.log.metadata().at(path)?.len();
        let mut position = 0u64;
        let mut expected_min_offset = min_base_offset.max(self.base_offset);
        let mut buf = Vec::new();
        let mut buf_start = 0u64;
        let mut reason = None;
        while position < file_len {
            let header_bytes =
                match read_span(&self.log, path, &mut buf, &mut buf_start, position, HEADER_BYTES, file_len)? {
                    Some(b) => b,
                    None => {
                        reason = Some("truncated header".to_string());
                        break;
                    }
                };
            let Some(header) = BatchHeader::parse(header_bytes) else { break };
            let Some(size) = header.size_bytes().filter(|s| *s <= RECOVERY_MAX_BATCH_BYTES) else {
                reason = Some(format!("bad length {}", header.batch_length));
                break;
            };
            let Some(batch_bytes) = read_span(&self.log, path, &mut buf, &mut buf_start, position, size, file_len)?
            else {
                reason = Some("truncated batch".to_string());
                break;
            };
            if let Err(e) = batch::validate_one(batch_bytes, RECOVERY_MAX_BATCH_BYTES) {
                reason = Some(e.to_string());
                break;
            }
            if header.base_offset < expected_min_offset {
                reason =
                    Some(format!("offset {} goes backwards (expected >= {expected_min_offset})", header.base_offset));
                break;
            }
            self.index_batch(&mut state, position, &header, index_interval_bytes);
            expected_min_offset = header.next_offset();
            position += size as u64;
        }
        let truncated_bytes = self.cut_after(&mut state, file_len, position, reason.as_deref())?;
        // The rebuilt time index lacks the entry roll wrote with the segment's largest timestamp
        // (Kafka's recovery appends it too). Without it, an open that trusts this segment's
        // indexes (below a later recovery point, or after a clean shutdown) understates the
        // largest timestamp: ListOffsets by timestamp skips the segment and time-based retention
        // deletes it early.
        append_largest_timestamp_entry(&mut state);
        if !state.active {
            let (oi, ti) = self.indexes_raw(&mut state)?;
            oi.file().trim()?;
            ti.file().trim()?;
        }
        self.size.store(position, Ordering::Release);
        self.verified_bytes.store(position, Ordering::Release);
        Ok(RecoveryOutcome { truncated_bytes, next_offset: state.next_offset })
    }

    /// Ends a recovery scan that found valid batches up to `valid` of the file's `file_len`
    /// bytes: cuts the rest off (a torn or corrupt tail) and returns how many bytes that was.
    fn cut_after(&self, state: &mut SegmentState, file_len: u64, valid: u64, reason: Option<&str>) -> Result<u64> {
        let path = self.log_path();
        let truncated_bytes = file_len - valid;
        if truncated_bytes > 0 {
            tracing::warn!(
                segment = %path.display(),
                valid_bytes = valid,
                truncated_bytes,
                reason = reason.unwrap_or("unknown"),
                "truncating invalid tail found by recovery"
            );
            state.read_positions.clear();
            self.log.set_len(valid).at(path)?;
        }
        if valid == 0 {
            state.next_offset = Some(self.base_offset);
        }
        Ok(truncated_bytes)
    }

    /// Recovery after a crash of the process alone, while the machine kept running (the caller
    /// checked the kernel's boot id): the page cache kept every byte written before the crash,
    /// in order, so only the end of the segment can be wrong, cut inside a write by the kill.
    /// The indexes are kept (each entry was written after the data it points at; the entries
    /// of an index the crash left preallocated end where its zero-filled tail begins), and only
    /// the batch headers after the last offset-index entry are read; a batch cut short there is
    /// truncated. CRCs are not read here: like every segment this process did not write or
    /// recover, its batches are validated before they are first served (`verified_bytes`).
    /// Returns `None` when the indexes cannot be trusted or the indexed batch is unreadable; the
    /// caller then runs the full [`Segment::recover`].
    pub(crate) fn recover_tail(
        &self,
        index_interval_bytes: u64,
        min_base_offset: i64,
    ) -> Result<Option<RecoveryOutcome>> {
        let mut state = self.lock();
        state.index_interval_bytes = index_interval_bytes;
        if self.load_indexes_left_as(&mut state, IndexFiles::LeftByProcessCrash).is_err() {
            return Ok(None);
        }
        let path = self.log_path();
        let file_len = self.size();
        let start = state.offset_index.as_ref().and_then(OffsetIndex::last_entry).map_or(0, |e| u64::from(e.position));
        // An offset-index entry is written before its time-index entry: a process killed between
        // the two lost the largest timestamp of the batches since the entry before the last.
        // Read their headers again (they are indexed already) and write the entry it lost.
        let previous = state
            .offset_index
            .as_ref()
            .and_then(OffsetIndex::second_to_last_entry)
            .map_or(0, |e| u64::from(e.position));
        if previous < start {
            let mut scanner = HeaderScanner::new(&self.log, path, previous, start).headers_only();
            let mut largest: Option<(i64, i64)> = None;
            while let Ok(Some((_, header))) = scanner.next() {
                if largest.is_none_or(|(max, _)| header.max_timestamp > max) {
                    largest = Some((header.max_timestamp, header.base_offset));
                }
            }
            if let Some((timestamp, offset)) = largest.filter(|(max, _)| *max > state.max_timestamp) {
                state.max_timestamp = timestamp;
                state.offset_of_max_timestamp = offset;
                if let Some(ti) = state.time_index.as_mut() {
                    ti.maybe_append(timestamp, offset);
                }
            }
        }
        // The batch at `start` already has its entry: rescanning it must not add another.
        state.bytes_since_last_index_entry = 0;
        // A clean open leaves the first batch's timestamp unknown unless it scans from 0; so does this.
        let first_batch_timestamp = state.first_batch_timestamp;
        let mut scanner = HeaderScanner::new(&self.log, path, start, file_len).headers_only();
        let mut position = start;
        let mut expected_min_offset = min_base_offset.max(self.base_offset);
        let mut reason = None;
        loop {
            match scanner.next() {
                Ok(Some((at, header))) if header.base_offset >= expected_min_offset => {
                    self.index_batch(&mut state, at, &header, index_interval_bytes);
                    expected_min_offset = header.next_offset();
                    position = at + header.size_bytes().unwrap_or(0) as u64;
                }
                Ok(Some((_, header))) => {
                    reason = Some(format!("offset {} goes backwards", header.base_offset));
                    break;
                }
                Ok(None) => break,
                Err(StorageError::CorruptSegment { reason: why, .. }) => {
                    reason = Some(why);
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        if position == start && start > 0 && position < file_len {
            // The batch the index points at is unreadable: nothing here can be trusted.
            return Ok(None);
        }
        if start > 0 {
            state.first_batch_timestamp = first_batch_timestamp;
        }
        let truncated_bytes = self.cut_after(&mut state, file_len, position, reason.as_deref())?;
        if !state.active {
            // As roll and the full recovery leave it, so that later opens know the largest
            // timestamp: a crash in the middle of a roll may have cut it short before that entry.
            append_largest_timestamp_entry(&mut state);
            let (oi, ti) = self.indexes_raw(&mut state)?;
            oi.file().trim()?;
            ti.file().trim()?;
        }
        self.size.store(position, Ordering::Release);
        Ok(Some(RecoveryOutcome { truncated_bytes, next_offset: state.next_offset }))
    }

    /// The offset after the last batch, reading the tail headers (from the last index entry)
    /// if not yet known.
    pub(crate) fn next_offset(&self) -> Result<i64> {
        let mut state = self.lock();
        if let Some(n) = state.next_offset {
            return Ok(n);
        }
        let (oi, _) = self.indexes(&mut state)?;
        let start = oi.last_entry().map_or(0, |e| u64::from(e.position));
        // Read only headers: opening a log after a clean shutdown must not read its data.
        let mut scanner = HeaderScanner::new(&self.log, self.log_path(), start, self.size()).headers_only();
        while scanner.next()?.is_some() {}
        let next = scanner.last_next_offset.unwrap_or(self.base_offset);
        state.next_offset = Some(next);
        Ok(next)
    }

    /// Largest batch timestamp in the segment, if it has any batch with a timestamp.
    pub(crate) fn max_timestamp(&self) -> Result<Option<(i64, i64)>> {
        let mut state = self.lock();
        self.load_indexes(&mut state)?;
        Ok((state.max_timestamp != i64::MIN).then_some((state.max_timestamp, state.offset_of_max_timestamp)))
    }

    /// The first batch's timestamp (for `segment.ms` rolls).
    pub(crate) fn first_batch_timestamp(&self) -> Option<i64> {
        self.lock().first_batch_timestamp
    }

    /// Finds the first batch whose last offset is `>= offset`, starting from the index.
    fn find_batch(&self, offset: i64, end: u64) -> Result<Option<(u64, BatchHeader)>> {
        Ok(self.seek_batch(offset, end)?.map(|(position, header, _)| (position, header)))
    }

    /// As `find_batch`, also returning the scanner positioned after that batch, so a read goes on
    /// from the buffer it already has instead of reading the first batch's header again.
    fn seek_batch(&self, offset: i64, end: u64) -> Result<Option<(u64, BatchHeader, HeaderScanner<'_>)>> {
        // Where a read found the batch, it is the one (its header read alone); any doubt (a
        // header that does not start at `offset`) falls back to the index.
        let remembered = self.lock().read_positions.position_of(offset).filter(|position| *position < end);
        if let Some(position) = remembered {
            let mut scanner = HeaderScanner::new(&self.log, self.log_path(), position, end).header_first();
            if let Ok(Some((position, header))) = scanner.next() {
                if header.base_offset == offset {
                    return Ok(Some((position, header, scanner)));
                }
            }
        }
        let start = {
            let mut state = self.lock();
            let (oi, _) = self.indexes(&mut state)?;
            oi.lookup(offset).position
        };
        let mut scanner = HeaderScanner::new(&self.log, self.log_path(), u64::from(start), end);
        while let Some((position, header)) = scanner.next()? {
            if header.last_offset() >= offset {
                return Ok(Some((position, header, scanner)));
            }
        }
        Ok(None)
    }

    /// Walks the batch headers from the first batch holding an offset `>= from`, calling `visit`
    /// with each position and header until it returns `false`. Batch bodies are not read (when
    /// batches are large, only their headers are) and CRCs are not checked: for state that
    /// needs headers only (producers), which must not cost a read of the data at start-up.
    pub(crate) fn visit_headers(
        &self,
        from: i64,
        mut visit: impl FnMut(u64, &BatchHeader) -> Result<bool>,
    ) -> Result<()> {
        let end = self.size();
        let Some((position, header, mut scanner)) = self.seek_batch(from, end)? else {
            return Ok(());
        };
        if !visit(position, &header)? {
            return Ok(());
        }
        while let Some((position, header)) = scanner.next()? {
            if !visit(position, &header)? {
                break;
            }
        }
        Ok(())
    }

    /// One batch's bytes at `position` (a control batch, say), without a CRC check.
    pub(crate) fn read_batch_unchecked(&self, position: u64, size: usize) -> Result<Vec<u8>> {
        let mut bytes = vec![0; size];
        self.log.read_exact_at(&mut bytes, position).at(self.log_path())?;
        Ok(bytes)
    }

    /// Whole batches from the first batch containing an offset `>= from`, at most `max_bytes`
    /// (but at least one batch if `min_one_batch`), none with an offset `>= upper_bound`.
    /// `in_memory`: the reader wants the bytes, not the file range (it decodes them): they are
    /// read at once, `max_bytes` in one read, and the headers found in them, rather than scanned
    /// in the file and read a second time ([`FileSlice::data`]).
    pub(crate) fn read(
        &self,
        from: i64,
        max_bytes: u64,
        upper_bound: i64,
        min_one_batch: bool,
        in_memory: bool,
    ) -> Result<SegmentRead> {
        let end = self.size();
        let Some((start, first, mut scanner)) = self.seek_batch(from, end)? else {
            return Ok(SegmentRead::NotHere);
        };
        if first.last_offset() >= upper_bound {
            // Check the batch before trusting its offsets: one whose baseOffset was corrupted
            // upwards would otherwise hide the records at `from` behind an empty answer forever.
            self.ensure_verified(start + first.size_bytes().unwrap_or(HEADER_BYTES) as u64)?;
            return Ok(SegmentRead::AtUpperBound);
        }
        let first_size = first.size_bytes().unwrap_or(0) as u64;
        if first_size > max_bytes && !min_one_batch {
            return Ok(SegmentRead::AtUpperBound);
        }
        let mut len = first_size;
        let mut next_offset = first.next_offset();
        // Where each batch of an in-memory read starts, for the reads that go on within it (a
        // file-range read is sent on whole: only its end is kept).
        let mut batches = if in_memory { vec![(first.base_offset, start)] } else { Vec::new() };
        // In memory: what may be served, read once (not when the first batch alone runs past
        // the segment's end: the scan below reports that).
        let mut data = None;
        if in_memory && start + first_size <= end {
            let mut buf = vec![0; max_bytes.max(first_size).min(end - start) as usize];
            self.log.read_exact_at(&mut buf, start).at(self.log_path())?;
            data = Some(buf);
        }
        loop {
            let header = match &data {
                // A header not whole in what was read, or of an impossible length, ends the read
                // before it, as the scan's corrupt header does (len > 0 here).
                Some(buf) => match buf.get(len as usize..).and_then(BatchHeader::parse) {
                    Some(header) if header.size_bytes().is_some_and(|size| len + size as u64 <= buf.len() as u64) => {
                        header
                    }
                    _ => break,
                },
                None => match scanner.next() {
                    Ok(Some((_, header))) => header,
                    Ok(None) => break,
                    // A corrupt header after whole batches ends the read there: the batches before it
                    // are served (and CRC-checked below); a read that starts at the corrupt header
                    // reports it. Failing the whole read would make intact data unreadable.
                    Err(StorageError::CorruptSegment { .. }) if len > 0 => break,
                    Err(e) => return Err(e),
                },
            };
            let size = header.size_bytes().unwrap_or(0) as u64;
            if header.last_offset() >= upper_bound {
                break;
            }
            if len + size > max_bytes && !(len == 0 && min_one_batch) {
                break;
            }
            if in_memory {
                batches.push((header.base_offset, start + len));
            }
            len += size;
            next_offset = header.next_offset();
        }
        if len == 0 {
            return Ok(SegmentRead::AtUpperBound);
        }
        match self.ensure_verified(start + len) {
            Ok(()) => {}
            // Bit rot inside the range: serve the batches before the corrupt one, which passed
            // their CRC check; the read that starts at the corrupt batch reports it. A consumer
            // so gets every intact batch and then the error at the exact offset, rather than an
            // error at its position that it can never get past.
            Err(StorageError::CorruptSegment { position, .. }) if position > start && position < start + len => {
                let mut scanner = HeaderScanner::new(&self.log, self.log_path(), start, position);
                while scanner.next()?.is_some() {}
                len = position - start;
                next_offset = scanner.last_next_offset.unwrap_or(first.base_offset);
            }
            Err(e) => return Err(e),
        }
        let data = data.map(|mut buf| {
            buf.truncate(len as usize);
            bytes::Bytes::from(buf)
        });
        batches.retain(|(_, position)| *position < start + len);
        batches.push((next_offset, start + len));
        self.lock().read_positions.remember(batches);
        Ok(SegmentRead::Slice(FileSlice {
            file: Arc::clone(&self.log),
            path: self.log_path().to_path_buf(),
            position: start,
            len,
            first_offset: first.base_offset,
            next_offset,
            data,
        }))
    }

    /// Validates every batch up to byte `end` that this process has not validated yet.
    pub(crate) fn ensure_verified(&self, end: u64) -> Result<()> {
        let mut position = self.verified_bytes.load(Ordering::Acquire);
        if position >= end {
            return Ok(());
        }
        let path = self.log_path();
        let mut buf = Vec::new();
        let mut buf_start = 0;
        let file_end = self.size();
        // baseOffset is outside the CRC, so a flipped bit there shows only in the offsets: each
        // batch must lie in [segment base, segment next offset) and start at or after the end of
        // the batch before it (checked within this call; `verify_all` walks the segment in one).
        // Without this, such a batch is served with wrong offsets, or hides its records from a
        // read at their offset. The next offset is only a bound when the tail is readable.
        let segment_end = self.next_offset().ok();
        let mut previous: Option<(u64, i64)> = None;
        while position < end {
            let corrupt = |reason: String| StorageError::CorruptSegment { path: path.to_path_buf(), position, reason };
            let header_bytes = read_span(&self.log, path, &mut buf, &mut buf_start, position, HEADER_BYTES, file_end)?
                .ok_or_else(|| corrupt("truncated header".into()))?;
            let header = BatchHeader::parse(header_bytes).ok_or_else(|| corrupt("truncated header".into()))?;
            let size = header.size_bytes().ok_or_else(|| corrupt(format!("bad length {}", header.batch_length)))?;
            let bytes = read_span(&self.log, path, &mut buf, &mut buf_start, position, size, file_end)?
                .ok_or_else(|| corrupt("batch runs past the end of the segment".into()))?;
            batch::validate_one(bytes, RECOVERY_MAX_BATCH_BYTES).map_err(|e| corrupt(e.to_string()))?;
            let first = header.base_offset;
            let next = first.checked_add(i64::from(header.last_offset_delta) + 1);
            if first < self.base_offset || next.is_none_or(|n| segment_end.is_some_and(|end| n > end)) {
                return Err(corrupt(format!(
                    "batch base offset {first} outside the segment's offsets [{}, {})",
                    self.base_offset,
                    segment_end.map_or("?".to_string(), |e| e.to_string())
                )));
            }
            if let Some((previous_position, previous_next)) = previous.filter(|(_, n)| first < *n) {
                // Either batch may carry the bad offset: report the earlier one, and unmark it as
                // verified so that the next call, which would otherwise start alone at this batch,
                // checks the pair again.
                self.verified_bytes.fetch_min(previous_position, Ordering::AcqRel);
                return Err(StorageError::CorruptSegment {
                    path: path.to_path_buf(),
                    position: previous_position,
                    reason: format!("the next batch starts at offset {first}, before this one ends ({previous_next})"),
                });
            }
            previous = next.map(|n| (position, n));
            position += size as u64;
            self.verified_bytes.fetch_max(position, Ordering::AcqRel);
        }
        Ok(())
    }

    /// Validates the whole segment (an operator's scrub).
    pub(crate) fn verify_all(&self) -> Result<()> {
        self.verified_bytes.store(0, Ordering::Release);
        self.ensure_verified(self.size())
    }

    /// First batch whose maxTimestamp is `>= target` and that holds an offset `>= min_offset`,
    /// starting from the time index.
    pub(crate) fn find_batch_by_timestamp(&self, target: i64, min_offset: i64) -> Result<Option<(u64, BatchHeader)>> {
        let start = {
            let mut state = self.lock();
            let (oi, ti) = self.indexes(&mut state)?;
            let from_offset = ti.lookup_below(target).map_or(self.base_offset, |e| e.offset);
            oi.lookup(from_offset.max(min_offset)).position
        };
        let mut scanner = HeaderScanner::new(&self.log, self.log_path(), u64::from(start), self.size());
        while let Some((position, header)) = scanner.next()? {
            if header.max_timestamp >= target && header.last_offset() >= min_offset {
                return Ok(Some((position, header)));
            }
        }
        Ok(None)
    }

    /// Reads one whole batch at `position`.
    pub(crate) fn read_batch(&self, position: u64, header: &BatchHeader) -> Result<Vec<u8>> {
        let size = header.size_bytes().unwrap_or(HEADER_BYTES);
        self.ensure_verified(position + size as u64)?;
        let mut buf = vec![0u8; size];
        self.log.read_exact_at(&mut buf, position).at(self.log_path())?;
        Ok(buf)
    }

    /// All batch headers with positions (for compaction and tests).
    pub(crate) fn batch_headers(&self) -> Result<Vec<(u64, BatchHeader)>> {
        let mut scanner = HeaderScanner::new(&self.log, self.log_path(), 0, self.size());
        let mut out = Vec::new();
        while let Some(h) = scanner.next()? {
            out.push(h);
        }
        Ok(out)
    }

    /// Removes every batch with an offset `>= offset` (cutting at the start of the batch that
    /// contains it). Returns the bytes removed.
    pub(crate) fn truncate_to(&self, offset: i64) -> Result<u64> {
        let size = self.size();
        let Some((position, header)) = self.find_batch(offset, size)? else {
            return Ok(0);
        };
        let path = self.log_path();
        let mut state = self.lock();
        state.read_positions.clear();
        self.size.store(position, Ordering::Release);
        self.log.set_len(position).at(path)?;
        self.verified_bytes.fetch_min(position, Ordering::AcqRel);
        let (oi, ti) = self.indexes(&mut state)?;
        oi.truncate_to(header.base_offset)?;
        ti.truncate_to(header.base_offset)?;
        // Recompute the statistics from what remains: the last time-index entry, then the batches
        // after the last offset-index entry.
        let last_indexed = oi.last_entry().map_or(0, |e| u64::from(e.position));
        let ti_last = ti.last_entry();
        state.max_timestamp = ti_last.map_or(i64::MIN, |e| e.timestamp);
        state.offset_of_max_timestamp = ti_last.map_or(self.base_offset, |e| e.offset);
        state.next_offset = Some(if position == 0 { self.base_offset } else { header.base_offset });
        let mut scanner = HeaderScanner::new(&self.log, path, last_indexed, position);
        state.bytes_since_last_index_entry = 0;
        while let Some((_, h)) = scanner.next()? {
            if h.max_timestamp > state.max_timestamp {
                state.max_timestamp = h.max_timestamp;
                state.offset_of_max_timestamp = h.base_offset;
            }
            state.bytes_since_last_index_entry += h.size_bytes().unwrap_or(0) as u64;
        }
        if position == 0 {
            state.first_batch_timestamp = None;
        }
        Ok(size - position)
    }

    /// Marks the segment active again (after truncation made it the last one).
    pub(crate) fn reactivate(&self) -> Result<()> {
        let mut state = self.lock();
        state.active = true;
        let bytes = state.index_preallocate_bytes;
        let (oi, ti) = self.indexes(&mut state)?;
        oi.file().preallocate(bytes)?;
        ti.file().preallocate(bytes)?;
        Ok(())
    }

    /// The segment stops being active: write the final time-index entry (so the segment's largest
    /// timestamp is known after restart without scanning) and trim the indexes.
    pub(crate) fn on_roll(&self) -> Result<()> {
        let mut state = self.lock();
        let (max_ts, max_offset) = (state.max_timestamp, state.offset_of_max_timestamp);
        let (oi, ti) = self.indexes(&mut state)?;
        if max_ts != i64::MIN {
            ti.maybe_append(max_ts, max_offset);
        }
        oi.file().trim()?;
        ti.file().trim()?;
        state.active = false;
        Ok(())
    }

    /// fdatasync the log (the durability point) and flush the indexes.
    pub(crate) fn flush(&self) -> Result<()> {
        self.log.sync_data().at(self.log_path())?;
        let mut state = self.lock();
        if let Some(oi) = state.offset_index.as_mut() {
            oi.file().flush()?;
        }
        if let Some(ti) = state.time_index.as_mut() {
            ti.file().flush()?;
        }
        Ok(())
    }

    /// Trims and flushes the indexes for a clean shutdown.
    pub(crate) fn close(&self) -> Result<()> {
        self.flush()?;
        let mut state = self.lock();
        // As at roll: the last time-index entry carries the largest timestamp, so a reopened
        // segment knows it without reading data.
        let (max_ts, max_offset) = (state.max_timestamp, state.offset_of_max_timestamp);
        if max_ts != i64::MIN {
            if let Some(ti) = state.time_index.as_mut() {
                ti.maybe_append(max_ts, max_offset);
            }
        }
        if let Some(oi) = state.offset_index.as_mut() {
            oi.file().trim()?;
        }
        if let Some(ti) = state.time_index.as_mut() {
            ti.file().trim()?;
        }
        Ok(())
    }

    /// Renames all files to `<name>.deleted`; the caller removes them later. Open handles (and
    /// slices being sent) keep working.
    pub(crate) fn rename_to_deleted(&self) -> Result<Vec<PathBuf>> {
        let mut guard = self.lock();
        let state = &mut *guard;
        let mut renamed = vec![with_suffix(self.log_path(), ".deleted")];
        std::fs::rename(self.log_path(), &renamed[0]).at(self.log_path())?;
        let loaded =
            [state.offset_index.as_mut().map(OffsetIndex::file), state.time_index.as_mut().map(TimeIndex::file)];
        for (path, loaded) in [self.index_path(), self.time_index_path()].into_iter().zip(loaded) {
            let to = with_suffix(&path, ".deleted");
            match loaded {
                // A loaded index follows its file, so a late remap does not recreate the old name.
                Some(index) => index.rename(&to)?,
                // An index never loaded may not exist yet.
                None if path.exists() => std::fs::rename(&path, &to).at(&path)?,
                None => continue,
            }
            renamed.push(to);
        }
        Ok(renamed)
    }
}

/// Appends the segment's largest timestamp as the last time-index entry, as roll and close do,
/// so that a later open that trusts the indexes knows it without reading the log. A no-op when
/// it is indexed already (`maybe_append` keeps timestamps increasing) or the index is full.
fn append_largest_timestamp_entry(state: &mut SegmentState) {
    let (max_ts, max_offset) = (state.max_timestamp, state.offset_of_max_timestamp);
    if max_ts != i64::MIN {
        if let Some(ti) = state.time_index.as_mut() {
            ti.maybe_append(max_ts, max_offset);
        }
    }
}

pub(crate) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Returns `len` bytes at `position` from a buffered sequential reader over `file`, or `None`
/// when the file ends first.
fn read_span<'a>(
    file: &File,
    path: &Path,
    buf: &'a mut Vec<u8>,
    buf_start: &mut u64,
    position: u64,
    len: usize,
    file_len: u64,
) -> Result<Option<&'a [u8]>> {
    if position + len as u64 > file_len {
        return Ok(None);
    }
    let in_buf = position >= *buf_start && position + len as u64 <= *buf_start + buf.len() as u64;
    if !in_buf {
        let want = (len.max(SCAN_CHUNK_BYTES) as u64).min(file_len - position) as usize;
        buf.resize(want, 0);
        file.read_exact_at(buf, position).at(path)?;
        *buf_start = position;
    }
    let at = (position - *buf_start) as usize;
    Ok(Some(&buf[at..at + len]))
}

/// Walks batch headers from `position` to `end` without reading batch bodies when batches are
/// large, and with few reads when they are small: it reads 16 KiB at a time while batches are
/// small and only the 61 header bytes once they are large.
pub(crate) struct HeaderScanner<'f> {
    file: &'f File,
    path: &'f Path,
    position: u64,
    end: u64,
    buf: Vec<u8>,
    buf_start: u64,
    last_size: usize,
    pub(crate) last_next_offset: Option<i64>,
}

const SMALL_BATCH_BYTES: usize = 2048;
const HEADER_CHUNK_BYTES: usize = 16 * 1024;

impl<'f> HeaderScanner<'f> {
    pub(crate) fn new(file: &'f File, path: &'f Path, position: u64, end: u64) -> HeaderScanner<'f> {
        HeaderScanner { file, path, position, end, buf: Vec::new(), buf_start: 0, last_size: 0, last_next_offset: None }
    }

    /// Reads exactly the header bytes of each batch, never a chunk of batch data.
    pub(crate) fn headers_only(mut self) -> Self {
        self.last_size = usize::MAX;
        self
    }

    /// Reads only the first batch's header bytes (the caller expects that batch to be the one
    /// it wants), then goes on as [`HeaderScanner::new`] does.
    fn header_first(mut self) -> Self {
        self.last_size = SMALL_BATCH_BYTES;
        self
    }

    /// The next (position, header), or `None` at `end`. A header that is cut off or has an
    /// impossible length ends the scan with an error: the data is corrupt.
    pub(crate) fn next(&mut self) -> Result<Option<(u64, BatchHeader)>> {
        if self.position >= self.end {
            return Ok(None);
        }
        let corrupt = |position: u64, reason: &str| StorageError::CorruptSegment {
            path: self.path.to_path_buf(),
            position,
            reason: reason.into(),
        };
        if self.position + HEADER_BYTES as u64 > self.end {
            return Err(corrupt(self.position, "truncated batch header"));
        }
        let cached = self.position >= self.buf_start
            && self.position + HEADER_BYTES as u64 <= self.buf_start + self.buf.len() as u64;
        if !cached {
            let want = if self.last_size < SMALL_BATCH_BYTES { HEADER_CHUNK_BYTES } else { HEADER_BYTES };
            let want = (want as u64).min(self.end - self.position) as usize;
            self.buf.resize(want, 0);
            self.file.read_exact_at(&mut self.buf, self.position).at(self.path)?;
            self.buf_start = self.position;
        }
        let at = (self.position - self.buf_start) as usize;
        let header =
            BatchHeader::parse(&self.buf[at..]).ok_or_else(|| corrupt(self.position, "truncated batch header"))?;
        let size = header
            .size_bytes()
            .filter(|s| self.position + *s as u64 <= self.end && header.magic == batch::MAGIC_V2)
            .ok_or_else(|| corrupt(self.position, "batch header with an impossible length or magic"))?;
        let position = self.position;
        self.position += size as u64;
        if self.last_size != usize::MAX {
            self.last_size = size;
        }
        self.last_next_offset = Some(header.next_offset());
        Ok(Some((position, header)))
    }
}

// Kafka's on-disk index formats: (u32 relative offset, u32 position) and (i64 timestamp, u32 relative offset).
const _: () = assert!(offset_index::ENTRY_BYTES == 8 && time_index::ENTRY_BYTES == 12);

// ---- Compaction support (cleaner.rs) ----

/// Suffix of the files a cleaner is still writing; `Log::open` deletes leftovers.
const CLEANED_SUFFIX: &str = ".cleaned";
/// Suffix of a finished cleaned log whose swap was interrupted; `Log::open` completes it.
const SWAP_SUFFIX: &str = ".swap";

impl Segment {
    /// A new, empty segment for `base_offset` written to `<base>.log.cleaned` (with
    /// `<base>.index.cleaned` and `<base>.timeindex.cleaned`), so the live segment of that name
    /// stays untouched until [`Segment::cleaned_to_swap`]. The cleaner fills it with
    /// [`Segment::append`]; `created_ms` is the replaced segment's, so retention's fallback age
    /// does not restart.
    pub(crate) fn create_cleaned(
        dir: &Path,
        base_offset: i64,
        index_bytes: u64,
        created_ms: i64,
        index_rebuilds: &Arc<AtomicU64>,
    ) -> Result<Segment> {
        let path = with_suffix(&dir.join(file_name(base_offset, ".log")), CLEANED_SUFFIX);
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).at(&path)?;
        let segment = Segment::new(dir, base_offset, file, 0, true, index_bytes, 0, created_ms, index_rebuilds);
        {
            let mut state = segment.lock();
            let index_path = with_suffix(&segment.index_path(), CLEANED_SUFFIX);
            let time_index_path = with_suffix(&segment.time_index_path(), CLEANED_SUFFIX);
            for p in [&index_path, &time_index_path] {
                let _ = std::fs::remove_file(p);
            }
            state.offset_index = Some(OffsetIndex::open(&index_path, base_offset, Some(index_bytes))?);
            state.time_index = Some(TimeIndex::open(&time_index_path, base_offset, Some(index_bytes))?);
            state.next_offset = Some(base_offset);
        }
        Ok(segment)
    }

    /// Opens the indexes now. A segment about to be replaced must hold its own index files open:
    /// loaded lazily after the swap, it would open the new segment's indexes by name.
    pub(crate) fn open_indexes(&self) -> Result<()> {
        let mut state = self.lock();
        self.load_indexes(&mut state)
    }

    /// Finishes a cleaned segment: final time-index entry, trimmed indexes, everything on disk.
    pub(crate) fn seal_cleaned(&self) -> Result<()> {
        self.on_roll()?;
        self.flush()
    }

    /// The commit point of a swap: `<base>.log.cleaned` becomes `<base>.log.swap`, which
    /// `Log::open` completes after a crash. The caller fsyncs the directory.
    pub(crate) fn cleaned_to_swap(&self) -> Result<()> {
        let cleaned = with_suffix(self.log_path(), CLEANED_SUFFIX);
        let swap = with_suffix(self.log_path(), SWAP_SUFFIX);
        std::fs::rename(&cleaned, &swap).at(&cleaned)
    }

    /// Moves a swapped segment to the final names, once the replaced segment's files are gone
    /// (renamed to `.deleted`): `.log.swap` to `.log`, then the indexes. The caller fsyncs the
    /// directory.
    pub(crate) fn swap_into_place(&self) -> Result<()> {
        let swap = with_suffix(self.log_path(), SWAP_SUFFIX);
        std::fs::rename(&swap, self.log_path()).at(&swap)?;
        let (index_path, time_index_path) = (self.index_path(), self.time_index_path());
        let mut state = self.lock();
        if let Some(oi) = state.offset_index.as_mut() {
            oi.file().rename(&index_path)?;
        }
        if let Some(ti) = state.time_index.as_mut() {
            ti.file().rename(&time_index_path)?;
        }
        Ok(())
    }

    /// Removes the files of a cleaned segment that will not be swapped in (nothing changed, it
    /// came out empty, or the clean was aborted). Only before [`Segment::cleaned_to_swap`]: after
    /// the commit point the `.swap` file is the segment's data.
    pub(crate) fn discard_cleaned(&self) {
        let mut paths = vec![with_suffix(self.log_path(), CLEANED_SUFFIX)];
        let mut state = self.lock();
        if let Some(oi) = state.offset_index.as_mut() {
            paths.push(oi.file().path().to_path_buf());
        }
        if let Some(ti) = state.time_index.as_mut() {
            paths.push(ti.file().path().to_path_buf());
        }
        drop(state);
        for path in paths {
            if let Err(e) = std::fs::remove_file(&path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), error = %e, "could not remove a cleaned segment file");
                }
            }
        }
    }
}
