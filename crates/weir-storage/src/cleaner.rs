//! Log compaction (`cleanup.policy=compact`), done the way Kafka's LogCleaner does it, so a
//! compacted topic keeps at least the latest record of every key and consumers can rebuild
//! state from offset 0.
//!
//! One pass over one log ([`clean`]):
//! 1. Cleanable range: from the first segment up to the first uncleanable offset, the smallest
//!    of the active segment's base offset (the writer owns it), the high watermark (replicas may
//!    not have the data yet) and the base of the first segment holding a record newer than
//!    `min.compaction.lag.ms` (so consumers get that long to see every record). The range is
//!    fsynced first: a record may only go for a newer one that a crash cannot take back.
//! 2. Offset map: key -> latest offset over the dirty part, `[cleaner checkpoint, cleanable
//!    end)`, within a byte budget. If the keys do not fit, the pass stops at the batch where the
//!    map filled (`end`) and the next pass continues from there.
//! 3. Every segment below `end` is rewritten: a record survives unless its key has a later
//!    offset in the map, or it is a tombstone whose batch is older than `delete.retention.ms`.
//!    Records without a key, records at or after `end`, control and transactional batches are
//!    kept. Offsets never change; batches left empty disappear; intact batches are copied byte
//!    for byte; others are re-encoded with their original compression.
//! 4. Swap: each changed segment is written as `<base>.log.cleaned` (plus `.index.cleaned`,
//!    `.timeindex.cleaned`), fsynced, renamed to `<base>.log.swap` (the commit point), the old
//!    files are renamed to `.deleted` (readers holding them keep reading), the swap file and the
//!    indexes take the final names, and the map entry is replaced. `Log::open` deletes
//!    `.cleaned` leftovers and completes a `.swap`, so a crash at any step leaves either the old
//!    or the new segment.
//!
//! Where Weir differs from Kafka, and why:
//! - Retained records of a partly cleaned batch are written as one batch per run of consecutive
//!   offsets, not one batch with offset gaps: the rest of this crate validates stored batches as
//!   it validates produced ones (`lastOffsetDelta + 1 == recordsCount`, offset deltas 0..n), and
//!   recovery or a scrub would otherwise call compacted data corrupt.
//! - Segments are not merged: `Log::open` completes a swap for one segment name only, so a
//!   merged swap would not be crash safe. A non-first segment that comes out empty is removed.
//! - Tombstone expiry uses the batch's maxTimestamp instead of a delete horizon stored in the
//!   batch (KIP-534); a pass with nothing dirty still drops expired tombstones when asked.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU64;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::batch::{self, BatchHeader};
use crate::checkpoint::fsync_dir;
use crate::config::LogConfig;
use crate::error::{IoContext, Result, StorageError};
use crate::log::{decode_records, Log};
use crate::records::{encode_batch, BatchOptions, Record};
use crate::segment::Segment;
use crate::sync::{lock, write};

/// Heap bytes one offset-map entry costs beyond its key: the boxed key's pointer and length, the
/// offset, the table's control byte and free slots, and the allocator's header.
const MAP_ENTRY_OVERHEAD_BYTES: usize = 48;
/// Read and write size: large sequential I/O, bounded memory.
const IO_CHUNK_BYTES: usize = 1 << 20;
/// The throttle lets debt below this accumulate instead of sleeping for microseconds per batch.
const MIN_THROTTLE_SLEEP: Duration = Duration::from_millis(5);

/// Cleaner-wide settings (Kafka's broker-level `log.cleaner.*`), as opposed to the per-topic
/// settings in [`LogConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanerConfig {
    /// `log.cleaner.dedupe.buffer.size`: memory for the key -> offset map. A dirty range with
    /// more keys is cleaned over several passes.
    pub offset_map_bytes: usize,
    /// `log.cleaner.io.max.bytes.per.second`: read plus write rate, so compaction leaves disk
    /// bandwidth to producers and consumers. `None` is unlimited (the setting's 0).
    pub io_bytes_per_second: Option<NonZeroU64>,
}

impl Default for CleanerConfig {
    fn default() -> Self {
        CleanerConfig { offset_map_bytes: 128 << 20, io_bytes_per_second: None }
    }
}

/// A token bucket in bytes per second that makes the cleaning thread sleep, so compaction never
/// takes the disk from producers and consumers. Shared by reference between cleaning threads,
/// the limit applies to their sum.
///
/// The sleep is a wait on a condition variable that [`Throttle::interrupt`] signals: at a low
/// limit one batch is a debt of minutes (160 bytes at 1 byte per second kept a broker's shutdown
/// waiting 157 s), and a shutdown must not wait it out.
#[derive(Debug)]
pub struct Throttle {
    /// `None`: never sleeps.
    bytes_per_second: Option<NonZeroU64>,
    bucket: Mutex<Bucket>,
    /// Signalled by `interrupt`; sleepers wait on it holding `bucket`'s mutex.
    wake: Condvar,
    /// Sleeps begun by `acquire` (for metrics: how often the limit held compaction back).
    sleeps: AtomicU64,
}

#[derive(Debug)]
struct Bucket {
    /// Bytes that may pass without waiting; negative is debt to sleep off.
    tokens: f64,
    refilled_at: Instant,
    /// Set once by `interrupt`: no caller sleeps from then on.
    interrupted: bool,
}

impl Throttle {
    /// A throttle allowing `bytes_per_second` on average and bursts of one second's worth;
    /// `None` never sleeps.
    pub fn new(bytes_per_second: Option<NonZeroU64>) -> Throttle {
        let burst = bytes_per_second.map_or(0.0, |rate| rate.get() as f64);
        Throttle {
            bytes_per_second,
            bucket: Mutex::new(Bucket { tokens: burst, refilled_at: Instant::now(), interrupted: false }),
            wake: Condvar::new(),
            sleeps: AtomicU64::new(0),
        }
    }

    /// For tests and for brokers that do not limit compaction I/O.
    pub fn unlimited() -> Throttle {
        Throttle::new(None)
    }

    /// Accounts for `bytes` of I/O, sleeping if the rate is exceeded, until the debt is paid or
    /// [`Throttle::interrupt`] is called.
    pub fn acquire(&self, bytes: u64) {
        let Some(rate) = self.bytes_per_second else { return };
        if bytes == 0 {
            return;
        }
        let rate = rate.get() as f64;
        let mut bucket = lock(&self.bucket);
        if bucket.interrupted {
            return;
        }
        let now = Instant::now();
        let elapsed = now.duration_since(bucket.refilled_at).as_secs_f64();
        bucket.refilled_at = now;
        bucket.tokens = (bucket.tokens + elapsed * rate).min(rate) - bytes as f64;
        if bucket.tokens >= 0.0 {
            return;
        }
        let wait = Duration::from_secs_f64(-bucket.tokens / rate);
        if wait < MIN_THROTTLE_SLEEP {
            return;
        }
        self.sleeps.fetch_add(1, Ordering::Relaxed);
        // Waiting releases the mutex, so other threads account their I/O meanwhile.
        let _ = self.wake.wait_timeout_while(bucket, wait, |b| !b.interrupted).unwrap_or_else(|p| p.into_inner());
    }

    /// Wakes every thread sleeping in [`Throttle::acquire`] and makes later calls return at
    /// once (for shutdown).
    pub fn interrupt(&self) {
        lock(&self.bucket).interrupted = true;
        self.wake.notify_all();
    }

    /// How many times [`Throttle::acquire`] made its caller sleep.
    pub fn sleeps(&self) -> u64 {
        self.sleeps.load(Ordering::Relaxed)
    }
}

/// What one pass did, for logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanOutcome {
    /// The log's directory, so a caller of [`Cleaner::run_once`] knows which log it was.
    pub dir: PathBuf,
    /// Where the dirty part began (the previous cleaner checkpoint).
    pub first_dirty_offset: i64,
    /// The new cleaner checkpoint: everything below was compacted against every key up to it.
    pub end_offset: i64,
    /// The offset map filled before the cleanable end; another pass will continue.
    pub map_full: bool,
    /// Segments swapped for a smaller copy; unchanged segments are left alone.
    pub segments_rewritten: usize,
    /// Segments that came out empty and were deleted instead of swapped.
    pub segments_removed: usize,
    /// Superseded records and expired tombstones dropped.
    pub records_removed: u64,
    /// Bytes of the rewritten and removed segments before and after the pass.
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// Compacts `log` once (see the module docs). Holds the log's maintenance lock for the whole
/// pass, so retention, DeleteRecords and truncation wait; appends and reads do not.
pub fn clean(log: &Log, config: &CleanerConfig, throttle: &Throttle) -> Result<CleanOutcome> {
    clean_until(log, config, throttle, &AtomicBool::new(false))
}

/// The share of the cleanable bytes that are dirty (not compacted since the last pass), to pick
/// the log that gains most from a pass (Kafka's `min.cleanable.dirty.ratio`). 0 when nothing is
/// dirty.
pub fn dirty_ratio(log: &Log) -> Result<f64> {
    let config = log.config();
    let range = cleanable_range(log, &config, log.clock().now_ms())?;
    if range.first_dirty >= range.upper {
        return Ok(0.0);
    }
    let (mut clean, mut dirty) = (0u64, 0u64);
    for (segment, next_base) in &range.segments {
        if *next_base <= range.first_dirty {
            clean += segment.size();
        } else {
            dirty += segment.size();
        }
    }
    Ok(if dirty == 0 { 0.0 } else { dirty as f64 / (clean + dirty) as f64 })
}

/// Compaction for a data directory: the log manager calls [`Cleaner::run_once`] periodically from
/// its cleaner thread with the logs it holds.
#[derive(Debug)]
pub struct Cleaner {
    config: CleanerConfig,
    throttle: Throttle,
    stopping: AtomicBool,
    /// Logs whose last pass failed for a reason other than shutdown (corrupt data, I/O error):
    /// skipped from then on, so one bad log does not take every pass (Kafka's uncleanable
    /// partitions).
    uncleanable: Mutex<HashSet<PathBuf>>,
}

impl Cleaner {
    /// One cleaner per data directory: its throttle bounds the compaction I/O of all its logs.
    pub fn new(config: CleanerConfig) -> Cleaner {
        let throttle = Throttle::new(config.io_bytes_per_second);
        Cleaner { config, throttle, stopping: AtomicBool::new(false), uncleanable: Mutex::new(HashSet::new()) }
    }

    /// Cleans the dirtiest of `logs` whose `cleanup.policy` includes `compact` and whose dirty
    /// ratio reaches its `min.cleanable.dirty.ratio`. `Ok(None)`: nothing needed cleaning. An
    /// error names a log that is now skipped (see [`Cleaner::uncleanable`]), except
    /// [`StorageError::Closed`] after [`Cleaner::stop`].
    pub fn run_once(&self, logs: &[Arc<Log>]) -> Result<Option<CleanOutcome>> {
        let mut best: Option<(f64, &Arc<Log>)> = None;
        for log in logs {
            if self.stopping.load(Ordering::Acquire) {
                return Ok(None);
            }
            let config = log.config();
            if !config.cleanup_policy.compact || lock(&self.uncleanable).contains(log.dir()) {
                continue;
            }
            let ratio = match dirty_ratio(log) {
                Ok(ratio) => ratio,
                Err(e) => {
                    tracing::warn!(dir = %log.dir().display(), error = %e, "cannot compute the dirty ratio; skipping the log");
                    lock(&self.uncleanable).insert(log.dir().to_path_buf());
                    continue;
                }
            };
            if ratio > 0.0 && ratio >= config.min_cleanable_dirty_ratio && best.is_none_or(|(b, _)| ratio > b) {
                best = Some((ratio, log));
            }
        }
        let Some((ratio, log)) = best else { return Ok(None) };
        match clean_until(log, &self.config, &self.throttle, &self.stopping) {
            Ok(outcome) => {
                tracing::info!(
                    dir = %log.dir().display(),
                    dirty_ratio = ratio,
                    end_offset = outcome.end_offset,
                    records_removed = outcome.records_removed,
                    bytes_before = outcome.bytes_before,
                    bytes_after = outcome.bytes_after,
                    "compacted log"
                );
                Ok(Some(outcome))
            }
            Err(e @ StorageError::Closed(_)) => Err(e),
            Err(e) => {
                tracing::error!(dir = %log.dir().display(), error = %e, "compaction failed; the log is now uncleanable");
                lock(&self.uncleanable).insert(log.dir().to_path_buf());
                Err(e)
            }
        }
    }

    /// Makes a running pass give up at its next batch (its partial output is discarded), waking
    /// it if it sleeps in the throttle, and later [`Cleaner::run_once`] calls return at once, so
    /// shutdown need not wait for a pass.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.throttle.interrupt();
    }

    /// The throttle shared by this cleaner's passes (`log.cleaner.io.max.bytes.per.second`).
    pub fn throttle(&self) -> &Throttle {
        &self.throttle
    }

    /// Directories of the logs skipped after a failed pass (for metrics and operators).
    pub fn uncleanable(&self) -> Vec<PathBuf> {
        lock(&self.uncleanable).iter().cloned().collect()
    }

    /// Lets a log be cleaned again, e.g. once it was deleted, truncated or repaired.
    pub fn forget(&self, dir: &Path) {
        lock(&self.uncleanable).remove(dir);
    }
}

/// The non-active segments that overlap the cleanable range, and where its parts begin and end.
struct CleanableRange {
    /// Oldest first, each with the base offset of the segment after it.
    segments: Vec<(Arc<Segment>, i64)>,
    first_dirty: i64,
    /// The first uncleanable offset.
    upper: i64,
}

fn cleanable_range(log: &Log, config: &LogConfig, now: i64) -> Result<CleanableRange> {
    let all = log.segments_snapshot();
    let Some(active) = all.last() else {
        return Ok(CleanableRange { segments: Vec::new(), first_dirty: 0, upper: 0 });
    };
    // Never past the last stable offset: an open transaction's outcome is not known yet.
    let mut upper = active.base_offset().min(log.last_stable_offset());
    if config.min_compaction_lag_ms > 0 {
        let horizon = now.saturating_sub(i64::try_from(config.min_compaction_lag_ms).unwrap_or(i64::MAX));
        for segment in &all[..all.len() - 1] {
            if segment.base_offset() >= upper {
                break;
            }
            if segment.max_timestamp()?.is_some_and(|(max, _)| max > horizon) {
                upper = segment.base_offset();
                break;
            }
        }
    }
    let segments = all
        .windows(2)
        .filter(|pair| pair[0].base_offset() < upper)
        .map(|pair| (Arc::clone(&pair[0]), pair[1].base_offset()))
        .collect();
    // A checkpoint past the log end is stale (the log was truncated since): all of it is dirty.
    let checkpoint = log.cleaner_checkpoint.load(Ordering::Acquire).min(log.log_end_offset());
    let first_dirty = checkpoint.max(log.log_start_offset());
    Ok(CleanableRange { segments, first_dirty, upper })
}

/// Latest offset per key over the dirty range, and how far that range was covered.
struct OffsetMap {
    latest: HashMap<Box<[u8]>, i64>,
    bytes: usize,
    /// Offsets below this were mapped; records at or after it are not judged by this pass.
    end: i64,
    full: bool,
}

/// What the rewrite of one pass needs to judge a record.
struct Pass<'a> {
    log: &'a Log,
    config: &'a LogConfig,
    throttle: &'a Throttle,
    stop: &'a AtomicBool,
    map: OffsetMap,
    now: i64,
}

impl Pass<'_> {
    fn check_stop(&self) -> Result<()> {
        if self.stop.load(Ordering::Acquire) {
            return Err(StorageError::Closed(self.log.dir().to_path_buf()));
        }
        Ok(())
    }

    /// Kafka's retention rule for one record of a (non-control, non-transactional) batch.
    fn retains(&self, record: &Record, batch_max_timestamp: i64) -> bool {
        if record.offset >= self.map.end {
            return true;
        }
        let Some(key) = record.key.as_deref() else { return true };
        if self.map.latest.get(key).is_some_and(|latest| record.offset < *latest) {
            return false;
        }
        let retention = i64::try_from(self.config.delete_retention_ms).unwrap_or(i64::MAX);
        record.value.is_some() || batch_max_timestamp.saturating_add(retention) > self.now
    }
}

fn clean_until(log: &Log, config: &CleanerConfig, throttle: &Throttle, stop: &AtomicBool) -> Result<CleanOutcome> {
    let _maintenance = lock(&log.maintenance);
    let log_config = log.config();
    let now = log.clock().now_ms();
    let range = cleanable_range(log, &log_config, now)?;
    // A record may only be removed for a newer one that a crash cannot take back: recovery
    // truncates what was not fsynced, and the old value would be gone with the new.
    log.sync_to(range.upper)?;
    let map = build_offset_map(log, &range, config.offset_map_bytes, throttle, stop)?;
    let mut outcome = CleanOutcome {
        dir: log.dir().to_path_buf(),
        first_dirty_offset: range.first_dirty,
        end_offset: map.end,
        map_full: map.full,
        segments_rewritten: 0,
        segments_removed: 0,
        records_removed: 0,
        bytes_before: 0,
        bytes_after: 0,
    };
    let pass = Pass { log, config: &log_config, throttle, stop, map, now };
    let first_base = log.segment_base_offsets().first().copied();
    for (segment, _) in range.segments.iter().filter(|(s, _)| s.base_offset() < pass.map.end) {
        pass.check_stop()?;
        clean_segment(&pass, segment, first_base == Some(segment.base_offset()), &mut outcome)?;
    }
    log.cleaner_checkpoint.fetch_max(pass.map.end, Ordering::AcqRel);
    Ok(outcome)
}

fn build_offset_map(
    log: &Log,
    range: &CleanableRange,
    budget: usize,
    throttle: &Throttle,
    stop: &AtomicBool,
) -> Result<OffsetMap> {
    let mut map = OffsetMap { latest: HashMap::new(), bytes: 0, end: range.upper, full: false };
    if range.first_dirty >= range.upper {
        return Ok(map);
    }
    let (first, upper) = (range.first_dirty, range.upper);
    let mapped = |r: &&Record| r.key.is_some() && r.offset >= first && r.offset < upper;
    for (segment, next_base) in &range.segments {
        if *next_base <= first {
            continue;
        }
        // One sequential validation pass; per-batch reads would each validate separately.
        segment.ensure_verified(segment.size())?;
        let mut reader = BatchReader::new(segment);
        for (position, header) in segment.batch_headers()? {
            if stop.load(Ordering::Acquire) {
                return Err(StorageError::Closed(log.dir().to_path_buf()));
            }
            if header.base_offset >= upper {
                return Ok(map);
            }
            if header.last_offset() < first || header.is_control() || header.is_transactional() {
                continue;
            }
            let bytes = reader.read(position, &header)?;
            throttle.acquire(bytes.len() as u64);
            let records = decode_records(bytes).map_err(|e| corrupt(segment, position, &e.to_string()))?;
            let cost: usize = records
                .iter()
                .filter(mapped)
                .filter_map(|r| r.key.as_deref())
                .filter(|k| !map.latest.contains_key(*k))
                .map(|k| k.len() + MAP_ENTRY_OVERHEAD_BYTES)
                .sum();
            if map.bytes + cost > budget {
                if header.base_offset <= first {
                    return Err(StorageError::InvalidArgument(format!(
                        "the cleaner's offset map ({budget} bytes) cannot hold the keys of the batch at offset {} in {}",
                        header.base_offset,
                        segment.log_path().display()
                    )));
                }
                map.end = header.base_offset;
                map.full = true;
                return Ok(map);
            }
            for record in records.iter().filter(mapped) {
                let Some(key) = record.key.as_deref() else { continue };
                match map.latest.get_mut(key) {
                    Some(latest) => *latest = (*latest).max(record.offset),
                    None => {
                        map.bytes += key.len() + MAP_ENTRY_OVERHEAD_BYTES;
                        map.latest.insert(Box::from(key), record.offset);
                    }
                }
            }
        }
    }
    Ok(map)
}

/// Rewrites one segment if any of its batches changes, and swaps the result in.
fn clean_segment(pass: &Pass<'_>, old: &Arc<Segment>, is_first: bool, outcome: &mut CleanOutcome) -> Result<()> {
    old.open_indexes()?;
    old.ensure_verified(old.size())?;
    let headers = old.batch_headers()?;
    let mut reader = BatchReader::new(old);
    // Created at the first batch that changes: an unchanged segment is only read.
    let mut out: Option<CleanedWriter<'_>> = None;
    let mut removed = 0u64;
    for (i, (position, header)) in headers.iter().enumerate() {
        pass.check_stop()?;
        let bytes = reader.read(*position, header)?;
        pass.throttle.acquire(bytes.len() as u64);
        let filtered = if header.is_control() || header.is_transactional() || header.base_offset >= pass.map.end {
            None
        } else {
            filter_batch(pass, bytes, header).map_err(|e| corrupt(old, *position, &e))?
        };
        match filtered {
            None => {
                if let Some(writer) = out.as_mut() {
                    writer.write(bytes)?;
                }
            }
            Some(filtered) => {
                removed += filtered.removed;
                if out.is_none() {
                    let mut writer = CleanedWriter::create(pass, old)?;
                    for (p, h) in &headers[..i] {
                        writer.write(reader.read(*p, h)?)?;
                    }
                    out = Some(writer);
                }
                if let Some(writer) = out.as_mut() {
                    writer.write(&filtered.bytes)?;
                }
            }
        }
    }
    let Some(mut writer) = out else { return Ok(()) };
    let cleaned = writer.seal()?;
    outcome.records_removed += removed;
    outcome.bytes_before += old.size();
    outcome.bytes_after += cleaned.size();
    let log = pass.log;
    let base = old.base_offset();
    if cleaned.size() == 0 && !is_first {
        // Nothing left: drop the segment instead of keeping an empty file. The first segment
        // stays, so the log start offset does not move.
        drop(writer);
        log.delete_segments(&[base])?;
        outcome.segments_removed += 1;
        return Ok(());
    }
    cleaned.cleaned_to_swap()?;
    let cleaned = writer.disarm();
    fsync_dir(log.dir())?;
    // Committed: from here a crash completes the swap on open.
    let old_paths = old.rename_to_deleted()?;
    cleaned.swap_into_place()?;
    fsync_dir(log.dir())?;
    write(&log.segments).insert(base, Arc::new(cleaned));
    let delay = i64::try_from(pass.config.file_delete_delay_ms).unwrap_or(i64::MAX);
    log.deletion_queue.schedule(old_paths, log.clock().now_ms().saturating_add(delay));
    outcome.segments_rewritten += 1;
    tracing::debug!(segment = %old.log_path().display(), before = old.size(), "swapped in a cleaned segment");
    Ok(())
}

fn corrupt(segment: &Segment, position: u64, reason: &str) -> StorageError {
    StorageError::CorruptSegment {
        path: segment.log_path().to_path_buf(),
        position,
        reason: format!("cannot compact the batch: {reason}"),
    }
}

/// Compacts whole stored batches held outside a log (a tiered log's segments in the object
/// store), by the same rules as a pass: `retains(record, its batch's max timestamp)` says which
/// records of a data batch stay; control and transactional batches stay whole; a partly kept
/// batch is re-encoded as runs of consecutive offsets, and a batch with nothing left goes.
/// Returns the new bytes and how many records went, or `None` when every record stays.
pub fn compact_batches(
    bytes: &[u8],
    retains: impl Fn(&Record, i64) -> bool,
) -> std::result::Result<Option<(Vec<u8>, u64)>, String> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut removed = 0u64;
    let mut end = 0usize;
    for (at, header) in batch::headers(bytes) {
        let size = header
            .size_bytes()
            .filter(|size| at + size <= bytes.len())
            .ok_or_else(|| format!("the batch at offset {} is cut short", header.base_offset))?;
        end = at + size;
        let whole = &bytes[at..end];
        if header.is_control() || header.is_transactional() {
            out.extend_from_slice(whole);
            continue;
        }
        let records = decode_records(whole).map_err(|e| format!("batch at offset {}: {e}", header.base_offset))?;
        let keep: Vec<bool> = records.iter().map(|r| retains(r, header.max_timestamp)).collect();
        let kept = keep.iter().filter(|k| **k).count();
        if kept == records.len() {
            out.extend_from_slice(whole);
        } else {
            removed += (records.len() - kept) as u64;
            if kept > 0 {
                out.extend_from_slice(&encode_retained(&header, &records, &keep)?);
            }
        }
    }
    if end != bytes.len() {
        return Err(format!("{} bytes after the last whole batch", bytes.len() - end));
    }
    Ok((removed > 0).then_some((out, removed)))
}

/// A batch that loses records: its replacement (empty when nothing is left).
struct Filtered {
    bytes: Vec<u8>,
    removed: u64,
}

/// `None` when every record survives (the batch is copied as it is).
fn filter_batch(pass: &Pass<'_>, bytes: &[u8], header: &BatchHeader) -> Result<Option<Filtered>, String> {
    let records = decode_records(bytes).map_err(|e| e.to_string())?;
    let keep: Vec<bool> = records.iter().map(|r| pass.retains(r, header.max_timestamp)).collect();
    let kept = keep.iter().filter(|k| **k).count();
    if kept == records.len() {
        return Ok(None);
    }
    let bytes = if kept == 0 { Vec::new() } else { encode_retained(header, &records, &keep)? };
    Ok(Some(Filtered { bytes, removed: (records.len() - kept) as u64 }))
}

/// Encodes the kept records as one batch per run of consecutive offsets (see the module docs),
/// with the original batch's compression, producer fields and timestamp type.
fn encode_retained(header: &BatchHeader, records: &[Record], keep: &[bool]) -> Result<Vec<u8>, String> {
    if header.compression().is_none() {
        return Err(format!("unknown compression in attributes {:#x}", header.attributes));
    }
    let mut out = Vec::new();
    let mut run: Vec<Record> = Vec::new();
    for (record, keep) in records.iter().zip(keep) {
        if !keep || run.last().is_some_and(|last| last.offset + 1 != record.offset) {
            encode_run(header, &mut run, &mut out)?;
        }
        if *keep {
            run.push(record.clone());
        }
    }
    encode_run(header, &mut run, &mut out)?;
    Ok(out)
}

fn encode_run(header: &BatchHeader, run: &mut Vec<Record>, out: &mut Vec<u8>) -> Result<(), String> {
    let Some(first) = run.first() else { return Ok(()) };
    let mut options = BatchOptions::of(header);
    options.base_offset = first.offset;
    // Without a producer id the batch's baseSequence is -1 whatever the run's position; with
    // one, the run's first record keeps its sequence (the batch's plus its offset delta).
    if header.base_sequence >= 0 {
        options.base_sequence = header.base_sequence.wrapping_add((first.offset - header.base_offset) as i32);
    }
    let encoded = encode_batch(run, &options).map_err(|e| format!("cannot re-encode records: {e}"))?;
    // What is stored must pass the checks recovery and scrubs apply.
    batch::validate_one(&encoded, usize::MAX).map_err(|e| format!("re-encoded batch is invalid: {e}"))?;
    out.extend_from_slice(&encoded);
    run.clear();
    Ok(())
}

/// Sequential reads of whole batches of a (non-active, hence immutable) segment, in chunks.
struct BatchReader<'s> {
    segment: &'s Segment,
    buf: Vec<u8>,
    start: u64,
}

impl<'s> BatchReader<'s> {
    fn new(segment: &'s Segment) -> BatchReader<'s> {
        BatchReader { segment, buf: Vec::new(), start: 0 }
    }

    fn read(&mut self, position: u64, header: &BatchHeader) -> Result<&[u8]> {
        let size = header.size_bytes().ok_or_else(|| corrupt(self.segment, position, "impossible batch length"))?;
        let end = position + size as u64;
        if position < self.start || end > self.start + self.buf.len() as u64 {
            let available = self.segment.size().saturating_sub(position);
            let len = (size.max(IO_CHUNK_BYTES) as u64).min(available) as usize;
            if len < size {
                return Err(corrupt(self.segment, position, "batch runs past the end of the segment"));
            }
            self.buf.resize(len, 0);
            self.segment.file().read_exact_at(&mut self.buf, position).at(self.segment.log_path())?;
            self.start = position;
        }
        let at = (position - self.start) as usize;
        Ok(&self.buf[at..at + size])
    }
}

/// The cleaned copy of one segment while it is written; dropping it before
/// [`CleanedWriter::disarm`] deletes its files, so an error or abort leaves nothing behind.
struct CleanedWriter<'a> {
    segment: Option<Segment>,
    buf: Vec<u8>,
    index_interval_bytes: u64,
    throttle: &'a Throttle,
}

impl<'a> CleanedWriter<'a> {
    fn create(pass: &Pass<'a>, old: &Segment) -> Result<CleanedWriter<'a>> {
        let segment = Segment::create_cleaned(
            pass.log.dir(),
            old.base_offset(),
            pass.config.segment_index_bytes,
            old.created_ms,
            &pass.log.stats.index_rebuilds,
        )?;
        Ok(CleanedWriter {
            segment: Some(segment),
            buf: Vec::new(),
            index_interval_bytes: pass.config.index_interval_bytes,
            throttle: pass.throttle,
        })
    }

    fn segment(&self) -> &Segment {
        self.segment.as_ref().expect("a cleaned writer holds its segment until disarmed")
    }

    fn write(&mut self, batches: &[u8]) -> Result<()> {
        self.buf.extend_from_slice(batches);
        if self.buf.len() >= IO_CHUNK_BYTES {
            self.flush_buf()?;
        }
        Ok(())
    }

    fn flush_buf(&mut self) -> Result<()> {
        if !self.buf.is_empty() {
            self.segment().append(&self.buf, self.index_interval_bytes)?;
            self.throttle.acquire(self.buf.len() as u64);
            self.buf.clear();
        }
        Ok(())
    }

    /// Writes what is buffered and makes the segment durable; returns it for the swap.
    fn seal(&mut self) -> Result<&Segment> {
        self.flush_buf()?;
        self.segment().seal_cleaned()?;
        Ok(self.segment())
    }

    /// Hands the segment over once its files are committed (renamed to `.swap`).
    fn disarm(mut self) -> Segment {
        self.segment.take().expect("a cleaned writer holds its segment until disarmed")
    }
}

impl Drop for CleanedWriter<'_> {
    fn drop(&mut self) {
        if let Some(segment) = self.segment.take() {
            segment.discard_cleaned();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_rate_when_burst_exceeded_should_sleep_for_the_debt() {
        let throttle = Throttle::new(NonZeroU64::new(100_000));
        let started = Instant::now();
        throttle.acquire(100_000); // the one-second burst
        assert!(started.elapsed() < Duration::from_millis(500));
        throttle.acquire(10_000); // 0.1 s of debt
        assert!(started.elapsed() >= Duration::from_millis(90), "slept {:?}", started.elapsed());
    }

    #[test]
    fn given_unlimited_throttle_should_never_sleep() {
        let throttle = Throttle::unlimited();
        let started = Instant::now();
        for _ in 0..1000 {
            throttle.acquire(u64::MAX / 2);
        }
        assert!(started.elapsed() < Duration::from_millis(500));
    }

    #[test]
    fn given_a_thread_sleeping_off_debt_when_interrupted_should_wake_it_at_once() {
        let throttle = Arc::new(Throttle::new(NonZeroU64::new(1)));
        let sleeper = {
            let throttle = Arc::clone(&throttle);
            std::thread::spawn(move || throttle.acquire(160))
        };
        while throttle.sleeps() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let started = Instant::now();
        throttle.interrupt();
        sleeper.join().expect("sleeper");
        assert!(started.elapsed() < Duration::from_secs(1), "woke after {:?}", started.elapsed());
        // Interrupted for good: more debt does not put anyone to sleep.
        throttle.acquire(1_000);
        assert_eq!(throttle.sleeps(), 1);
    }
}
