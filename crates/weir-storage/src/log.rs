//! A partition log: a directory of segments with one writer, many readers, flush policies with
//! group commit, retention, truncation and recovery.
//!
//! Offsets: `log_start_offset <= high_watermark <= log_end_offset`, and
//! `recovery_point <= log_end_offset`. Everything below `recovery_point` is fsynced; recovery
//! after a crash rescans from the segment that contains it. Offsets are `i64` as in Kafka.
//!
//! Locks, always taken in this order: `maintenance` (retention, compaction, truncation: one at a
//! time), `writer` (appends, rolls), `leader_epochs`, `segments` (the map; held only to clone or
//! swap entries), then a segment's own state lock. `sync` is independent: it is never held while
//! taking others.
//!
//! Two writers, one at a time: the leader's [`Log::append`] assigns offsets and stamps its
//! leader epoch on the batches; a follower's [`Log::append_replicated`] keeps the offsets and
//! epochs the leader gave them. Both keep the leader-epoch cache (`leader-epoch-checkpoint`,
//! see `leader_epoch`), which answers OffsetForLeaderEpoch ([`Log::end_offset_for_epoch`]).
//!
//! The invariants above are checked by [`Log::check_invariants`] after every append,
//! truncation, DeleteRecords and sync in debug builds.

use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::Instant;

use crate::batch::{self, TimestampType, HEADER_BYTES};
use crate::checkpoint::fsync_dir;
use crate::clock::Clock;
use crate::config::{FlushPolicy, LogConfig};
use crate::deletion::DeletionQueue;
use crate::error::{IoContext, Result, StorageError};
use crate::file_slice::FileSlice;
use crate::leader_epoch::{EpochEntry, LeaderEpochCache, UNDEFINED_EPOCH};
use crate::producer_state::{ProducerCheck, ProducerError, ProducerProgress, ProducerStateManager, NO_PRODUCER_ID};
use crate::segment::{Segment, SegmentRead};
use crate::sync::{lock, read, write};
use crate::txn_index::{AbortedTxn, TxnIndex};

/// What `append` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    /// True when an idempotent producer resent a batch the log already holds: nothing was
    /// written, and the offsets are those of the original append.
    pub duplicate: bool,
    pub first_offset: i64,
    pub last_offset: i64,
    /// The broker's time stamped on the batches with `LogAppendTime`, else `None`.
    pub log_append_time_ms: Option<i64>,
    pub batch_count: u32,
    pub record_count: u64,
    pub bytes: u64,
}

impl AppendInfo {
    /// What an append that wrote `summary`'s batches (`bytes` of them) at `first_offset..next_offset` did.
    fn written(
        first_offset: i64,
        next_offset: i64,
        log_append_time_ms: Option<i64>,
        summary: &batch::BatchesSummary,
        bytes: usize,
    ) -> AppendInfo {
        AppendInfo {
            duplicate: false,
            first_offset,
            last_offset: next_offset - 1,
            log_append_time_ms,
            batch_count: summary.batch_count,
            record_count: summary.record_count,
            bytes: bytes as u64,
        }
    }
}

/// What `read` found.
#[derive(Debug, Clone)]
pub struct ReadResult {
    /// `None` when there is nothing at or after the requested offset below the upper bound.
    pub slice: Option<FileSlice>,
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    pub high_watermark: i64,
}

/// A closed segment's files, for copying them elsewhere (the object-store tier above this
/// crate). Its offsets never change: only the active segment takes appends, and truncation
/// never reaches below the high watermark, which [`Log::sealed_segments`] bounds it by.
#[derive(Debug, Clone)]
pub struct SealedSegment {
    pub base_offset: i64,
    /// The next segment's base offset: every offset of this segment is below it.
    pub next_offset: i64,
    /// Bytes of the `.log`.
    pub size: u64,
    /// The largest batch timestamp and the base offset of its batch; `None` for no timestamp.
    pub max_timestamp: Option<(i64, i64)>,
    /// The open `.log`: a copy reads through it, so retention renaming the file meanwhile does
    /// not break the copy.
    pub log: Arc<std::fs::File>,
    /// The `.index` and `.timeindex`, trimmed to their entries (Kafka's formats). Retention may
    /// rename them at any time: reading them can find nothing.
    pub index_path: PathBuf,
    pub time_index_path: PathBuf,
}

/// An offset found by timestamp, with the record's timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimestampOffset {
    pub timestamp: i64,
    pub offset: i64,
}

/// How `open` should treat the files it finds.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    /// The data directory was shut down cleanly: trust the files, scan nothing.
    pub clean_shutdown: bool,
    /// From the recovery-point checkpoint; `None` rescans the whole log after a crash.
    pub recovery_point: Option<i64>,
    /// From the log-start-offset checkpoint (DeleteRecords moves it inside a segment).
    pub log_start_offset: Option<i64>,
    /// After a crash: only the process died, the machine did not (same kernel boot), so the
    /// page cache still holds every byte written. Recovery then reads only the headers after
    /// each segment's last index entry instead of checksumming whole segments (CRCs are checked
    /// lazily, before first served). Never set it after a machine crash or for files that may
    /// have been damaged on disk.
    pub page_cache_survived: bool,
}

/// Counters a benchmark or metrics exporter reads.
#[derive(Debug, Default)]
pub struct LogStats {
    pub appended_batches: AtomicU64,
    pub appended_bytes: AtomicU64,
    pub fsyncs: AtomicU64,
    pub fsync_nanos: AtomicU64,
    /// How long each flush (the fdatasyncs of one group commit) took.
    pub fsync_latency: crate::histogram::Histogram,
    pub rolls: AtomicU64,
    pub recovered_truncated_bytes: AtomicU64,
    /// Segments scanned by recovery when the log was opened.
    pub segments_recovered: AtomicU64,
    /// Segments whose index files were missing or failed their checks when loaded (at open or
    /// lazily, on first use) and were rebuilt from the log's batch headers. A sound index is
    /// never rebuilt; recovery's rescan after a machine crash is counted in
    /// `segments_recovered`, not here. Shared with the segments, which load their indexes.
    pub index_rebuilds: Arc<AtomicU64>,
}

/// What a retention pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    pub deleted_segments: usize,
    pub(crate) deleted_bytes: u64,
}

/// `latest_leader_epoch` before the cache is seeded.
const EPOCHS_NOT_SEEDED: i32 = i32::MIN;

/// Where a leader epoch noted in the cache comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EpochSource {
    /// This broker starts to lead at the epoch (nothing written yet).
    StartedLeading,
    /// A leader's own write, stamped with its epoch.
    LeaderWrite,
    /// A batch replicated from the leader, with the epoch it was written in.
    Replicated,
}

/// The leader-epoch cache and its lazy seeding (see `Log::epochs`).
struct EpochState {
    cache: LeaderEpochCache,
    /// False while the cache may still have to be seeded from the log's first batch.
    seeded: bool,
    /// An epoch this broker began leading in before the seed was read.
    pending: Option<i32>,
}

struct SyncState {
    /// Every offset below this is on disk.
    durable_end: i64,
    /// One thread is running fdatasync on behalf of all waiters.
    syncing: bool,
}

pub struct Log {
    dir: PathBuf,
    config: RwLock<Arc<LogConfig>>,
    clock: Arc<dyn Clock>,
    pub(crate) segments: RwLock<BTreeMap<i64, Arc<Segment>>>,
    writer: Mutex<()>,
    pub(crate) maintenance: Mutex<()>,
    log_start_offset: AtomicI64,
    log_end_offset: AtomicI64,
    high_watermark: AtomicI64,
    recovery_point: AtomicI64,
    unflushed_messages: AtomicU64,
    last_flush_ms: AtomicI64,
    sync: Mutex<SyncState>,
    sync_done: Condvar,
    closed: AtomicBool,
    /// Replication decides the high watermark (cluster mode); otherwise the log advances it
    /// itself: to the log end on append, or, with `flush=sync`, to what is durable, so that no
    /// consumer ever reads data that a power failure could take back.
    high_watermark_managed: AtomicBool,
    /// `config.memory_first`, read on every append without taking the config's lock.
    memory_first: AtomicBool,
    pub(crate) deletion_queue: Arc<DeletionQueue>,
    /// Where compaction has reached (first uncleaned offset); kept by the cleaner.
    pub(crate) cleaner_checkpoint: AtomicI64,
    jitter: RandomState,
    /// Idempotent producers' sequence state; changed only under the writer lock.
    producers: Mutex<ProducerStateManager>,
    /// Set (never cleared) once a transactional batch is appended or found at open. Until then
    /// no transaction can be open, and the last stable offset is the high watermark without
    /// taking `producers`: every read_committed fetch asks, for every partition it names.
    /// Set before the high watermark moves past the batch (see `last_stable_offset`).
    transactions_seen: AtomicBool,
    /// Aborted transactions, for read_committed fetches. Lock order: writer, producers, this.
    aborted: Mutex<Option<TxnIndex>>,
    /// Where each leader epoch began. Entries are added only under the writer lock.
    leader_epochs: Mutex<EpochState>,
    /// Tiered logs (`remote.storage.enable`): every offset below this is in the object store, as
    /// the tier last said ([`Log::set_remote_range`]); -1 when nothing is, or the log is not
    /// tiered. Local retention deletes only segments below it.
    remote_end: AtomicI64,
    /// The lowest the log start may go back to when the tier says the store holds older
    /// offsets: the log-start checkpoint at open, raised by DeleteRecords and by every deletion
    /// that moves the log start. (The log start of a tiered log may precede its first local
    /// segment: those offsets are in the store.)
    start_floor: AtomicI64,
    /// The latest epoch in `leader_epochs` once seeded (`UNDEFINED_EPOCH` when it has none,
    /// `EPOCHS_NOT_SEEDED` before), so that an append in the current epoch checks it without
    /// the lock.
    latest_leader_epoch: AtomicI32,
    pub stats: LogStats,
}

impl Log {
    /// Opens the log in `dir` (creating it if needed), recovering after a crash as `options`
    /// says.
    pub fn open(
        dir: &Path,
        config: LogConfig,
        clock: Arc<dyn Clock>,
        options: OpenOptions,
        deletion_queue: Arc<DeletionQueue>,
    ) -> Result<Log> {
        if !dir.exists() {
            std::fs::create_dir_all(dir).at(dir)?;
            if let Some(parent) = dir.parent() {
                fsync_dir(parent)?;
            }
        }
        let now = clock.now_ms();
        let bases = prepare_directory(dir)?;
        let epochs = LeaderEpochCache::load(dir)?;
        let log = Log::new(dir, config, clock, deletion_queue, epochs, now);
        log.load_segments(&bases, options, now)?;
        log.rebuild_producer_state()?;
        log.load_leader_epochs()?;
        log.check_invariants();
        Ok(log)
    }

    /// Creates a brand-new, empty log in `dir`, which must not exist yet (its parent must).
    /// Nothing is read: a directory made just now holds no segment, checkpoint, snapshot or
    /// transaction index, so the probes [`Log::open`] makes for them (three directory listings
    /// and two failing opens) are skipped, and the segment's indexes are made on first use
    /// (see `Segment::create_in_new_dir`). That makes a new log a `mkdir` and one `open`.
    ///
    /// Nothing is fsynced either: the caller ([`crate::LogManager::get_or_create_many`]) makes
    /// the directory of every log it creates durable, with its files, before any of them is
    /// used, one journal commit for all of them instead of two fsyncs per log. A crash before
    /// that leaves either no directory or one with some of the files, which [`Log::open`]
    /// recovers as an empty log at the next start.
    pub(crate) fn create(
        dir: &Path,
        config: LogConfig,
        clock: Arc<dyn Clock>,
        deletion_queue: Arc<DeletionQueue>,
    ) -> Result<Log> {
        std::fs::create_dir(dir).at(dir)?;
        let now = clock.now_ms();
        let log = Log::new(dir, config, clock, deletion_queue, LeaderEpochCache::empty(dir), now);
        let config = log.config();
        let segment = Segment::create_in_new_dir(
            dir,
            0,
            config.segment_index_bytes,
            log.roll_jitter(&config, 0),
            now,
            &log.stats.index_rebuilds,
        )?;
        write(&log.segments).insert(0, Arc::new(segment));
        *lock(&log.aborted) = Some(TxnIndex::empty(dir));
        {
            // An empty log has no epoch to seed from: `load_leader_epochs` of an empty log.
            let mut epochs = lock(&log.leader_epochs);
            epochs.seeded = true;
        }
        log.latest_leader_epoch.store(UNDEFINED_EPOCH, Ordering::Release);
        log.check_invariants();
        Ok(log)
    }

    /// A log with no segment yet, every offset 0: [`Log::open`] loads its segments into it,
    /// [`Log::create`] makes the first one.
    fn new(
        dir: &Path,
        config: LogConfig,
        clock: Arc<dyn Clock>,
        deletion_queue: Arc<DeletionQueue>,
        epochs: LeaderEpochCache,
        now: i64,
    ) -> Log {
        Log {
            dir: dir.to_path_buf(),
            memory_first: AtomicBool::new(config.memory_first),
            config: RwLock::new(Arc::new(config)),
            clock,
            segments: RwLock::new(BTreeMap::new()),
            writer: Mutex::new(()),
            maintenance: Mutex::new(()),
            log_start_offset: AtomicI64::new(0),
            remote_end: AtomicI64::new(-1),
            start_floor: AtomicI64::new(0),
            log_end_offset: AtomicI64::new(0),
            high_watermark: AtomicI64::new(0),
            recovery_point: AtomicI64::new(0),
            unflushed_messages: AtomicU64::new(0),
            last_flush_ms: AtomicI64::new(now),
            sync: Mutex::new(SyncState { durable_end: 0, syncing: false }),
            sync_done: Condvar::new(),
            closed: AtomicBool::new(false),
            high_watermark_managed: AtomicBool::new(false),
            deletion_queue,
            cleaner_checkpoint: AtomicI64::new(0),
            jitter: RandomState::new(),
            producers: Mutex::new(ProducerStateManager::new()),
            transactions_seen: AtomicBool::new(false),
            aborted: Mutex::new(None),
            leader_epochs: Mutex::new(EpochState { cache: epochs, seeded: false, pending: None }),
            latest_leader_epoch: AtomicI32::new(EPOCHS_NOT_SEEDED),
            stats: LogStats::default(),
        }
    }

    /// Trims a leader-epoch checkpoint to the recovered log (a crash can leave it longer or
    /// shorter than the log). Without a checkpoint the cache is seeded later, on first use
    /// (`epochs`), so that opening thousands of partitions reads no batch for it.
    fn load_leader_epochs(&self) -> Result<()> {
        let (log_start, log_end) = (self.log_start_offset(), self.log_end_offset());
        let mut epochs = lock(&self.leader_epochs);
        epochs.cache.truncate_from_end(log_end, log_start)?;
        epochs.cache.truncate_from_start(log_start)?;
        epochs.seeded = epochs.cache.latest().is_some() || log_start == log_end;
        if epochs.seeded {
            self.latest_leader_epoch
                .store(epochs.cache.latest().map_or(UNDEFINED_EPOCH, |e| e.epoch), Ordering::Release);
        }
        Ok(())
    }

    /// The leader-epoch cache, seeded first if it still has to be: from the batch holding the
    /// log start offset, then with the epoch a leader took before the seed was read.
    fn epochs(&self) -> Result<MutexGuard<'_, EpochState>> {
        let mut epochs = lock(&self.leader_epochs);
        if !epochs.seeded {
            let (log_start, log_end) = (self.log_start_offset(), self.log_end_offset());
            if log_start < log_end {
                if let Some(slice) = self.read(log_start, 1, log_end)?.slice {
                    let mut header = [0u8; HEADER_BYTES];
                    slice.file.read_exact_at(&mut header, slice.position).at(&slice.path)?;
                    if let Some(header) = batch::BatchHeader::parse(&header) {
                        epochs.cache.seed(header.partition_leader_epoch, log_start);
                    }
                }
            }
            epochs.seeded = true;
            if let Some(pending) = epochs.pending.take() {
                epochs.cache.assign(pending, log_end, log_start)?;
            }
            self.latest_leader_epoch
                .store(epochs.cache.latest().map_or(UNDEFINED_EPOCH, |e| e.epoch), Ordering::Release);
        }
        Ok(epochs)
    }

    /// Records in the cache that `epoch` begins at `start_offset`, if it is newer than the
    /// latest. Called with the writer lock held, before the epoch's first batch is written.
    /// An older epoch (see [`EpochSource`]) changes nothing when a broker starts to lead, is
    /// refused for a leader's write (it was deposed meanwhile), and for a replicated batch
    /// replaces the newer epochs that hold no batch yet (see `LeaderEpochCache::assign_older`),
    /// or is refused when one does.
    fn note_leader_epoch(&self, epoch: i32, start_offset: i64, source: EpochSource) -> Result<()> {
        if epoch == self.latest_leader_epoch.load(Ordering::Acquire) {
            return Ok(());
        }
        let log_start = self.log_start_offset();
        let mut epochs = self.epochs()?;
        match epochs.cache.latest() {
            Some(latest) if epoch >= 0 && epoch < latest.epoch && source != EpochSource::StartedLeading => {
                if source == EpochSource::LeaderWrite {
                    return Err(StorageError::StaleLeaderEpoch { epoch, latest: latest.epoch });
                }
                if let Some(conflict) = epochs.cache.assign_older(epoch, start_offset, log_start)? {
                    return Err(StorageError::Batch(crate::error::BatchError::Invalid(format!(
                        "replicated batch at offset {start_offset} carries leader epoch {epoch}, older than epoch {} \
                         whose batches begin at offset {}",
                        conflict.epoch, conflict.start_offset
                    ))));
                }
                tracing::warn!(
                    dir = %self.dir.display(),
                    epoch,
                    start_offset,
                    dropped = latest.epoch,
                    "a replicated batch of an older leader epoch follows epochs without batches: dropped them"
                );
                self.latest_leader_epoch
                    .store(epochs.cache.latest().map_or(UNDEFINED_EPOCH, |e| e.epoch), Ordering::Release);
            }
            _ => {
                if epochs.cache.assign(epoch, start_offset, log_start)? {
                    self.latest_leader_epoch.store(epoch, Ordering::Release);
                }
            }
        }
        Ok(())
    }

    /// This broker leads the partition from now on at `epoch`: the epoch begins at the log end
    /// (Kafka's `maybeAssignEpochStartOffset` on becoming leader). An epoch not newer than the
    /// latest changes nothing.
    pub fn assign_leader_epoch(&self, epoch: i32) -> Result<()> {
        let _writer = lock(&self.writer);
        {
            let mut epochs = lock(&self.leader_epochs);
            if !epochs.seeded {
                // Applied at the log end when the seed is read, before any append (every
                // append reads it first), so the log end is still this one.
                epochs.pending = Some(epochs.pending.map_or(epoch, |p| p.max(epoch)));
                return Ok(());
            }
        }
        self.note_leader_epoch(epoch, self.log_end_offset(), EpochSource::StartedLeading)
    }

    /// The latest leader epoch with an entry in the cache, if any.
    pub fn latest_leader_epoch(&self) -> Result<Option<i32>> {
        Ok(self.epochs()?.cache.latest().map(|e| e.epoch))
    }

    /// OffsetForLeaderEpoch: (the largest epoch at or below `epoch` that this log has, the offset
    /// where it ended), or `(-1, -1)` when `epoch` is newer than every epoch here (see
    /// `leader_epoch`).
    pub fn end_offset_for_epoch(&self, epoch: i32) -> Result<(i32, i64)> {
        let epochs = self.epochs()?;
        Ok(epochs.cache.end_offset_for(epoch, self.log_end_offset()))
    }

    /// The leader epoch `offset` belongs to (-1 offsets: none).
    pub fn epoch_for_offset(&self, offset: i64) -> Result<Option<i32>> {
        if offset < 0 {
            return Ok(None);
        }
        Ok(self.epochs()?.cache.epoch_for(offset))
    }

    /// Every (leader epoch, start offset) entry, oldest first.
    pub fn leader_epoch_entries(&self) -> Result<Vec<EpochEntry>> {
        Ok(self.epochs()?.cache.entries().to_vec())
    }

    fn load_segments(&self, bases: &[i64], options: OpenOptions, now: i64) -> Result<()> {
        let config = self.config();
        let mut map = BTreeMap::new();
        // After a crash, where fsynced data is known to end: the checkpointed recovery point
        // (or nothing). Recovery validates what follows without fsyncing it; the background
        // flush of rolled segments (or the next sync) makes it durable later.
        let mut durable_until = None;
        for (i, base) in bases.iter().enumerate() {
            let active = i + 1 == bases.len();
            let segment = Segment::open(
                &self.dir,
                *base,
                active,
                config.segment_index_bytes,
                self.roll_jitter(&config, *base),
                now,
                &self.stats.index_rebuilds,
            )?;
            map.insert(*base, Arc::new(segment));
        }
        if !options.clean_shutdown && !map.is_empty() {
            let recovery_point = options.recovery_point.unwrap_or(i64::MIN);
            durable_until = Some(recovery_point);
            let first_to_recover = map.range(..=recovery_point).next_back().map_or(i64::MIN, |(b, _)| *b);
            let mut min_offset = i64::MIN;
            let mut cut = None;
            for (base, segment) in map.range(first_to_recover..) {
                let tail_only = if options.page_cache_survived {
                    segment.recover_tail(config.index_interval_bytes, min_offset)?
                } else {
                    None
                };
                let outcome = match tail_only {
                    Some(outcome) => outcome,
                    None => segment.recover(config.index_interval_bytes, min_offset)?,
                };
                self.stats.segments_recovered.fetch_add(1, Ordering::Relaxed);
                self.stats.recovered_truncated_bytes.fetch_add(outcome.truncated_bytes, Ordering::Relaxed);
                min_offset = outcome.next_offset.unwrap_or(*base);
                if outcome.truncated_bytes > 0 {
                    cut = Some(*base);
                    break;
                }
            }
            if let Some(cut) = cut {
                // Everything after a corrupt batch is unreachable by offset order: drop it, as Kafka does.
                let later: Vec<i64> = map.range(cut + 1..).map(|(b, _)| *b).collect();
                for base in later {
                    if let Some(segment) = map.remove(&base) {
                        tracing::warn!(segment = %segment.log_path().display(), "deleting segment after a corrupt tail");
                        let paths = segment.rename_to_deleted()?;
                        self.deletion_queue.schedule(paths, now);
                    }
                }
                if let Some((_, last)) = map.iter().next_back() {
                    last.reactivate()?;
                }
            }
        }
        if map.is_empty() {
            let base = options.log_start_offset.unwrap_or(0).max(0);
            let segment = self.create_segment(&config, base, now)?;
            fsync_dir(&self.dir)?;
            map.insert(base, Arc::new(segment));
        }
        let last = map.values().next_back().map(Arc::clone).expect("at least one segment");
        let first_base = *map.keys().next().expect("at least one segment");
        let log_end = last.next_offset()?;
        let log_start = options.log_start_offset.unwrap_or(first_base).max(first_base).min(log_end);
        *write(&self.segments) = map;
        self.log_end_offset.store(log_end, Ordering::Release);
        self.log_start_offset.store(log_start, Ordering::Release);
        self.start_floor.store(options.log_start_offset.unwrap_or(-1).min(log_start), Ordering::Release);
        self.high_watermark.store(log_end, Ordering::Release);
        // Not fsyncing at recovery keeps a restart after a crash fast (10 GiB in the page cache
        // took seconds to fsync); the recovery point stays below what was recovered, so a
        // second crash rescans it.
        let durable = durable_until.map_or(log_end, |d| d.clamp(first_base, log_end));
        self.recovery_point.store(durable, Ordering::Release);
        lock(&self.sync).durable_end = durable;
        self.cleaner_checkpoint.store(log_start, Ordering::Release);
        Ok(())
    }

    /// A new, empty, active segment at `base`; the caller fsyncs the directory.
    fn create_segment(&self, config: &LogConfig, base: i64, now: i64) -> Result<Segment> {
        let jitter = self.roll_jitter(config, base);
        Segment::create(&self.dir, base, config.segment_index_bytes, jitter, now, &self.stats.index_rebuilds)
    }

    fn roll_jitter(&self, config: &LogConfig, base: i64) -> u64 {
        let bound = config.segment_jitter_ms.min(config.segment_ms);
        if bound == 0 {
            0
        } else {
            self.jitter.hash_one(base) % bound
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> Arc<LogConfig> {
        Arc::clone(&read(&self.config))
    }

    /// Replaces the configuration; it applies to the next append, roll and retention pass.
    ///
    /// A tiered log (`remote.storage.enable`) may start before its first local segment. Opened
    /// before its topic's configs were known, its log start was put at the first local segment;
    /// it goes back to the log-start checkpoint now, so that the offsets only the store holds
    /// are readable at once after a restart (the tier corrects it when it lists the store).
    pub fn set_config(&self, config: LogConfig) {
        let tiered = config.remote_storage_enable;
        self.memory_first.store(config.memory_first, Ordering::Release);
        *write(&self.config) = Arc::new(config);
        if tiered {
            let first = read(&self.segments).keys().next().copied().unwrap_or(0);
            let floor = self.start_floor.load(Ordering::Acquire);
            if floor >= 0 && floor < first {
                let _ = self.log_start_offset.compare_exchange(first, floor, Ordering::AcqRel, Ordering::Acquire);
            }
        }
    }

    pub fn log_start_offset(&self) -> i64 {
        self.log_start_offset.load(Ordering::Acquire)
    }

    pub fn log_end_offset(&self) -> i64 {
        self.log_end_offset.load(Ordering::Acquire)
    }

    /// The first offset on local disk: the log start, unless the log is tiered and its oldest
    /// offsets are only in the object store (Kafka's local-log-start-offset, KIP-405).
    pub fn local_log_start_offset(&self) -> i64 {
        let first = read(&self.segments).keys().next().copied().unwrap_or(0);
        first.max(self.log_start_offset())
    }

    /// Tiered logs: the offset below which the object store holds everything; -1 when it holds
    /// nothing (or the log is not tiered).
    pub fn remote_end_offset(&self) -> i64 {
        self.remote_end.load(Ordering::Acquire)
    }

    /// What the object store holds of this (tiered) log, `[start, end)`, or `None` for nothing:
    /// the tier says so after listing the store and after each pass. Local retention may then
    /// delete the local segments below `end`; and when the store reaches the local segments, the
    /// log starts where the store does (after a restart the log start is first the first local
    /// segment's), never below what DeleteRecords or retention asked for.
    pub fn set_remote_range(&self, range: Option<(i64, i64)>) {
        let _maintenance = lock(&self.maintenance);
        let Some((start, end)) = range else {
            self.remote_end.store(-1, Ordering::Release);
            self.settle_tiered_start(None, -1);
            return;
        };
        self.remote_end.store(end, Ordering::Release);
        self.settle_tiered_start(Some(start), end);
    }

    /// A tiered log's start once the store's contents are known: where the store starts (never
    /// below the floor DeleteRecords and the checkpoint set), if the store reaches the local
    /// segments; else the first local segment (a gap would be offsets nobody holds). A log start
    /// inside the local segments (DeleteRecords) stays.
    fn settle_tiered_start(&self, store_start: Option<i64>, store_end: i64) {
        if !self.config().remote_storage_enable {
            return;
        }
        let first = read(&self.segments).keys().next().copied().unwrap_or(0);
        let current = self.log_start_offset();
        if current > first {
            return;
        }
        let wanted = match store_start {
            Some(start) if store_end >= first => self.start_floor.load(Ordering::Acquire).max(start).min(first),
            _ => first,
        };
        if wanted != current {
            self.log_start_offset.store(wanted, Ordering::Release);
            tracing::info!(dir = %self.dir.display(), log_start_offset = wanted, local_log_start_offset = first, "the tiered log's start follows the object store");
        }
    }

    pub fn high_watermark(&self) -> i64 {
        self.high_watermark.load(Ordering::Acquire)
    }

    /// Hands the high watermark to the caller's replication (see [`Log::set_high_watermark`]).
    /// Whether the log is memory-first (`LogConfig::memory_first`), without taking the
    /// config's lock.
    pub fn is_memory_first(&self) -> bool {
        self.memory_first.load(Ordering::Acquire)
    }

    pub fn set_high_watermark_managed(&self, managed: bool) {
        self.high_watermark_managed.store(managed, Ordering::Release);
    }

    fn advance_high_watermark(&self, offset: i64) {
        // A memory-first log's high watermark is where the object store has it: the broker's
        // writer sets it (see `LogConfig::memory_first`).
        if !self.high_watermark_managed.load(Ordering::Acquire) && !self.memory_first.load(Ordering::Acquire) {
            self.high_watermark.fetch_max(offset.min(self.log_end_offset()), Ordering::AcqRel);
        }
    }

    /// Sets the high watermark, as the broker's replication decides it (see
    /// [`Log::set_high_watermark_managed`]): the offset up to which every in-sync replica has
    /// the log. It only moves forward and never past the log end; the caller keeps a
    /// follower's below its own log end (the leader's may be ahead). Truncation lowers it
    /// ([`Log::truncate_to`]), nothing else does.
    ///
    /// A backward move or one past the log end is a bug of the caller: it asserts in debug
    /// builds; in release builds the high watermark stays where it was and the error is logged,
    /// rather than clamping a wrong value into place.
    pub fn set_high_watermark(&self, offset: i64) {
        let (current, log_end) = (self.high_watermark(), self.log_end_offset());
        let valid = offset >= current && offset <= log_end;
        debug_assert!(
            valid,
            "{}: high watermark set from {current} to {offset} (log end {log_end})",
            self.dir.display()
        );
        if !valid {
            tracing::error!(dir = %self.dir.display(), current, offset, log_end, "refusing to move the high watermark backwards or past the log end");
            return;
        }
        self.high_watermark.fetch_max(offset, Ordering::AcqRel);
    }

    /// Every offset below this is on disk as far as [`Log::sync_to`] knows (what a replica with
    /// `flush=sync` may count as its own).
    pub fn durable_end_offset(&self) -> i64 {
        lock(&self.sync).durable_end
    }

    /// Every offset below this is fsynced.
    pub fn recovery_point(&self) -> i64 {
        self.recovery_point.load(Ordering::Acquire)
    }

    /// Total bytes of all segments.
    pub fn size_bytes(&self) -> u64 {
        self.segments_snapshot().iter().map(|s| s.size()).sum()
    }

    pub fn segment_count(&self) -> usize {
        read(&self.segments).len()
    }

    /// Base offsets of the segments, oldest first.
    pub fn segment_base_offsets(&self) -> Vec<i64> {
        read(&self.segments).keys().copied().collect()
    }

    /// The closed segments whose every offset is below `bound` (the caller's committed end:
    /// the high watermark or the last stable offset), oldest first; never the active segment.
    /// Their index files are on disk when this returns (an index never loaded is loaded, or
    /// rebuilt, first).
    pub fn sealed_segments(&self, bound: i64) -> Result<Vec<SealedSegment>> {
        let segments = self.segments_snapshot();
        let mut sealed = Vec::new();
        for pair in segments.windows(2) {
            let (segment, next) = (&pair[0], &pair[1]);
            if next.base_offset() > bound {
                break;
            }
            segment.open_indexes()?;
            sealed.push(SealedSegment {
                base_offset: segment.base_offset(),
                next_offset: next.base_offset(),
                size: segment.size(),
                max_timestamp: segment.max_timestamp()?,
                log: Arc::clone(segment.file()),
                index_path: segment.index_path(),
                time_index_path: segment.time_index_path(),
            });
        }
        Ok(sealed)
    }

    pub(crate) fn segments_snapshot(&self) -> Vec<Arc<Segment>> {
        read(&self.segments).values().map(Arc::clone).collect()
    }

    pub(crate) fn active_segment(&self) -> Arc<Segment> {
        let segments = read(&self.segments);
        Arc::clone(segments.values().next_back().expect("a log always has an active segment"))
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StorageError::Closed(self.dir.clone()));
        }
        Ok(())
    }

    /// Appends one or more whole batches as the leader: validates them (the log is untouched if
    /// any is invalid), assigns offsets from the log end offset by rewriting `baseOffset` and
    /// `partitionLeaderEpoch` in `records` in place, stamps `LogAppendTime` if configured, and
    /// writes them. The data is in the page cache on return; with `flush=sync`, call
    /// [`Log::sync_to`] with `last_offset + 1` before acknowledging.
    pub fn append(&self, records: &mut [u8], partition_leader_epoch: i32) -> Result<AppendInfo> {
        let config = self.config();
        // Validation (CRC over every byte) runs before the writer lock, so concurrent appenders
        // validate in parallel and the lock covers only offset assignment and the write.
        let summary = batch::validate_batches(records, config.max_message_bytes as usize)?;
        let producer_batch = batch::headers(records).map(|(_, h)| h).find(|h| h.producer_id != NO_PRODUCER_ID);
        if producer_batch.is_some() && summary.batch_count > 1 {
            // Kafka's rule: a request from an idempotent producer carries one batch per partition.
            return Err(ProducerError::Invalid(format!(
                "{} batches in one append; an idempotent producer sends one per partition",
                summary.batch_count
            ))
            .into());
        }
        let writer = lock(&self.writer);
        self.check_open()?;
        let now = self.clock.now_ms();
        if let Some(header) = &producer_batch {
            if let ProducerCheck::Duplicate { first_offset, last_offset } = lock(&self.producers).check(header)? {
                return Ok(AppendInfo {
                    duplicate: true,
                    first_offset,
                    last_offset,
                    log_append_time_ms: None,
                    batch_count: 0,
                    record_count: 0,
                    bytes: 0,
                });
            }
        }
        let first_offset = self.log_end_offset();
        let last_offset = first_offset + summary.offset_count as i64 - 1;
        let segment = self.maybe_roll(&config, records.len() as u64, last_offset, now)?;
        let append_time = (config.timestamp_type == TimestampType::LogAppendTime).then_some(now);
        let next_offset = batch::assign_offsets(records, first_offset, partition_leader_epoch, append_time);
        self.note_leader_epoch(partition_leader_epoch, first_offset, EpochSource::LeaderWrite)?;
        segment.append(records, config.index_interval_bytes)?;
        self.after_write(&config, records, producer_batch.is_some(), next_offset, now)?;
        self.check_invariants_locked(&writer);
        drop(writer);
        self.count_append(&config, &summary, records.len())?;
        Ok(AppendInfo::written(first_offset, next_offset, append_time, &summary, records.len()))
    }

    /// Appends batches as a follower: they keep the offsets and leader epochs the leader gave
    /// them (and its `LogAppendTime` stamps). Validates them like [`Log::append`] (the log is
    /// untouched if any is invalid) and also that their offsets go on from the log end in
    /// order; gaps are allowed (a compacted leader's batches skip offsets). Idempotent
    /// producers' sequences are not checked again (the leader did), only recorded, so this log
    /// can take over as leader with the same state. The high watermark does not move unless
    /// the log manages it itself; a follower's replication sets it from the leader's.
    pub fn append_replicated(&self, records: &[u8]) -> Result<AppendInfo> {
        let config = self.config();
        let summary = batch::validate_batches(records, config.max_message_bytes as usize)?;
        let writer = lock(&self.writer);
        self.check_open()?;
        let now = self.clock.now_ms();
        let log_end = self.log_end_offset();
        let mut next_offset = log_end;
        let mut has_producer_batch = false;
        for (_, header) in batch::headers(records) {
            if header.base_offset < next_offset {
                return Err(StorageError::Batch(crate::error::BatchError::Invalid(format!(
                    "replicated batch at offset {} does not follow offset {} (log end {log_end})",
                    header.base_offset,
                    next_offset - 1
                ))));
            }
            next_offset = header.next_offset();
            has_producer_batch |= header.producer_id != NO_PRODUCER_ID;
        }
        let first_offset = batch::headers(records).next().map_or(log_end, |(_, h)| h.base_offset);
        let segment = self.maybe_roll(&config, records.len() as u64, next_offset - 1, now)?;
        for (_, header) in batch::headers(records) {
            self.note_leader_epoch(header.partition_leader_epoch, header.base_offset, EpochSource::Replicated)?;
        }
        segment.append(records, config.index_interval_bytes)?;
        self.after_write(&config, records, has_producer_batch, next_offset, now)?;
        self.check_invariants_locked(&writer);
        drop(writer);
        self.count_append(&config, &summary, records.len())?;
        Ok(AppendInfo::written(first_offset, next_offset, None, &summary, records.len()))
    }

    /// What every append does once its batches are in the file: the producers' state, the log
    /// end, and (without `flush=sync`) the high watermark. Called with the writer lock held.
    fn after_write(
        &self,
        config: &LogConfig,
        records: &[u8],
        has_producer_batch: bool,
        next_offset: i64,
        now: i64,
    ) -> Result<()> {
        if has_producer_batch {
            let mut producers = lock(&self.producers);
            for (at, header) in batch::headers(records) {
                if header.producer_id == NO_PRODUCER_ID {
                    continue;
                }
                if header.is_transactional() {
                    self.transactions_seen.store(true, Ordering::Release);
                }
                let control = header.is_control().then(|| batch::control_type(&records[at..])).flatten();
                if let Some(aborted) = producers.update(&header, control, now) {
                    self.record_abort(aborted)?;
                }
            }
        }
        self.log_end_offset.store(next_offset, Ordering::Release);
        if config.flush != FlushPolicy::Sync {
            self.advance_high_watermark(next_offset);
        }
        Ok(())
    }

    /// Counts an append and flushes when `flush.messages` is reached. After the writer lock.
    fn count_append(&self, config: &LogConfig, summary: &batch::BatchesSummary, bytes: usize) -> Result<()> {
        self.stats.appended_batches.fetch_add(u64::from(summary.batch_count), Ordering::Relaxed);
        self.stats.appended_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        let unflushed =
            self.unflushed_messages.fetch_add(summary.record_count, Ordering::AcqRel) + summary.record_count;
        if let FlushPolicy::Interval { messages, .. } = config.flush {
            if unflushed >= messages {
                self.flush()?;
            }
        }
        Ok(())
    }

    /// Rolls the active segment if the append would overflow it or it is old enough; returns
    /// the segment to append to. Called with the writer lock held.
    /// `last_offset` is the last offset the append will write.
    fn maybe_roll(&self, config: &LogConfig, bytes: u64, last_offset: i64, now: i64) -> Result<Arc<Segment>> {
        let active = self.active_segment();
        let size = active.size();
        let log_end = self.log_end_offset();
        // Kafka measures segment.ms from the first batch's timestamp, which survives restarts.
        // A producer replaying old data (timestamps far in the past) would then roll a segment
        // per append; for a segment this process created, its creation time bounds the age.
        let rolling_since = match active.first_batch_timestamp() {
            Some(ts) if active.created_empty => ts.max(active.created_ms),
            Some(ts) => ts,
            None => active.created_ms,
        };
        let reason = if size > 0 && size + bytes > config.segment_bytes {
            Some("segment.bytes")
        } else if size > 0
            && now.saturating_sub(rolling_since)
                > (config.segment_ms - active.roll_jitter_ms.min(config.segment_ms)) as i64
        {
            Some("segment.ms")
        } else if size > 0 && active.indexes_full()? {
            Some("index full")
        } else if last_offset - active.base_offset() > i64::from(u32::MAX) {
            Some("relative offset overflow")
        } else if log_end != active.base_offset() && size == 0 {
            // An empty active segment whose base is not the log end (after DeleteRecords or
            // truncation of everything) is replaced so that file name = first offset holds.
            Some("empty segment at a stale base offset")
        } else {
            None
        };
        match reason {
            Some(reason) => self.roll(config, reason, now),
            None => Ok(active),
        }
    }

    fn roll(&self, config: &LogConfig, reason: &str, now: i64) -> Result<Arc<Segment>> {
        let active = self.active_segment();
        let base = self.log_end_offset();
        // Recovery then replays at most the new segment's batches; aborts before the snapshot
        // must be durable in the transaction index first.
        self.sync_txn_index()?;
        lock(&self.producers).write_snapshot(&self.dir, base)?;
        tracing::debug!(dir = %self.dir.display(), base, reason, "rolling segment");
        if active.size() == 0 {
            // Replace an empty segment rather than leaving an empty file behind.
            let mut segments = write(&self.segments);
            segments.remove(&active.base_offset());
            drop(segments);
            let paths = active.rename_to_deleted()?;
            self.deletion_queue.schedule(paths, now);
        } else {
            active.on_roll()?;
        }
        let segment = Arc::new(self.create_segment(config, base, now)?);
        // The new file's directory entry must be durable before any data in it is acknowledged.
        fsync_dir(&self.dir)?;
        write(&self.segments).insert(base, Arc::clone(&segment));
        self.stats.rolls.fetch_add(1, Ordering::Relaxed);
        Ok(segment)
    }

    /// Rolls the active segment now if it holds data (e.g. before time-based retention).
    pub fn roll_now(&self) -> Result<()> {
        let _writer = lock(&self.writer);
        if self.active_segment().size() > 0 {
            let config = self.config();
            self.roll(&config, "requested", self.clock.now_ms())?;
        }
        Ok(())
    }

    /// Blocks until every offset below `end_offset` is on disk. Concurrent callers share one
    /// fdatasync (group commit): while one thread syncs, others queue; when it finishes, one of
    /// them syncs everything appended meanwhile for all of them.
    pub fn sync_to(&self, end_offset: i64) -> Result<()> {
        let mut state = lock(&self.sync);
        loop {
            if state.durable_end >= end_offset {
                return Ok(());
            }
            if !state.syncing {
                state.syncing = true;
                drop(state);
                let target = self.log_end_offset();
                let result = self.flush_data_to(target);
                state = lock(&self.sync);
                state.syncing = false;
                if result.is_ok() {
                    state.durable_end = state.durable_end.max(target);
                    self.advance_high_watermark(target);
                }
                self.sync_done.notify_all();
                result?;
                if cfg!(debug_assertions) {
                    drop(state);
                    self.check_invariants();
                    state = lock(&self.sync);
                }
                continue;
            }
            state = self.sync_done.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// fsyncs everything appended so far.
    pub fn flush(&self) -> Result<()> {
        self.sync_to(self.log_end_offset())
    }

    /// fdatasyncs the segments holding offsets in `[recovery_point, target)`.
    fn flush_data_to(&self, target: i64) -> Result<()> {
        let from = self.recovery_point();
        if from >= target {
            return Ok(());
        }
        let segments: Vec<Arc<Segment>> = {
            let map = read(&self.segments);
            let first = map.range(..=from).next_back().map_or(i64::MIN, |(b, _)| *b);
            map.range(first..target).map(|(_, s)| Arc::clone(s)).collect()
        };
        let started = Instant::now();
        for segment in &segments {
            segment.file().sync_data().at(segment.log_path())?;
        }
        let elapsed = started.elapsed();
        self.stats.fsyncs.fetch_add(segments.len() as u64, Ordering::Relaxed);
        self.stats.fsync_nanos.fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
        self.stats.fsync_latency.observe(elapsed);
        self.recovery_point.fetch_max(target, Ordering::AcqRel);
        self.unflushed_messages.store(0, Ordering::Release);
        self.last_flush_ms.store(self.clock.now_ms(), Ordering::Release);
        Ok(())
    }

    /// For `flush=interval`: flushes if `flush.ms` has passed since the last flush. For
    /// `flush=none`: flushes segments that were rolled, as Kafka does after a roll, so recovery
    /// after a crash only rescans the active segment. Called periodically by the manager.
    pub fn flush_if_due(&self) -> Result<()> {
        let config = self.config();
        match config.flush {
            FlushPolicy::Interval { interval_ms, .. } => {
                let since = self.clock.now_ms() - self.last_flush_ms.load(Ordering::Acquire);
                if since >= interval_ms as i64 && self.recovery_point() < self.log_end_offset() {
                    self.flush()?;
                }
            }
            FlushPolicy::None | FlushPolicy::Sync => {
                let active_base = self.active_segment().base_offset();
                if self.recovery_point() < active_base {
                    self.sync_to(active_base)?;
                }
            }
        }
        Ok(())
    }

    /// Reads whole batches starting at the batch that contains `from`: at most `max_bytes`, but
    /// always at least one batch so a consumer never starves on a large batch, and never a batch
    /// that reaches `max_offset_exclusive` (the high watermark or last stable offset).
    pub fn read(&self, from: i64, max_bytes: u64, max_offset_exclusive: i64) -> Result<ReadResult> {
        self.read_with(from, max_bytes, max_offset_exclusive, true)
    }

    /// As [`Log::read`], with `min_one_batch = false` allowing an empty answer when the first
    /// batch exceeds `max_bytes` (Kafka applies the at-least-one rule to one partition per fetch).
    pub fn read_with(
        &self,
        from: i64,
        max_bytes: u64,
        max_offset_exclusive: i64,
        min_one_batch: bool,
    ) -> Result<ReadResult> {
        self.read_segments(from, max_bytes, max_offset_exclusive, min_one_batch, false)
    }

    /// [`Log::read_with`] for a reader that wants the bytes in memory (to decode them, or to
    /// hand them on): the slice comes with its [`FileSlice::data`], read in one go.
    pub fn read_in_memory(
        &self,
        from: i64,
        max_bytes: u64,
        max_offset_exclusive: i64,
        min_one_batch: bool,
    ) -> Result<ReadResult> {
        self.read_segments(from, max_bytes, max_offset_exclusive, min_one_batch, true)
    }

    fn read_segments(
        &self,
        from: i64,
        max_bytes: u64,
        max_offset_exclusive: i64,
        min_one_batch: bool,
        in_memory: bool,
    ) -> Result<ReadResult> {
        let log_start = self.log_start_offset();
        let log_end = self.log_end_offset();
        let mut result = ReadResult {
            slice: None,
            log_start_offset: log_start,
            log_end_offset: log_end,
            high_watermark: self.high_watermark(),
        };
        if from < log_start || from > log_end {
            return Err(StorageError::OffsetOutOfRange {
                offset: from,
                log_start_offset: log_start,
                log_end_offset: log_end,
            });
        }
        let upper = max_offset_exclusive.min(log_end);
        if from >= upper {
            return Ok(result);
        }
        let mut cursor = {
            let map = read(&self.segments);
            map.range(..=from).next_back().or_else(|| map.iter().next()).map(|(_, s)| Arc::clone(s))
        };
        while let Some(segment) = cursor {
            if segment.base_offset() >= upper {
                break;
            }
            match segment.read(from, max_bytes, upper, min_one_batch, in_memory)? {
                SegmentRead::Slice(slice) => {
                    result.slice = Some(slice);
                    break;
                }
                SegmentRead::AtUpperBound => break,
                SegmentRead::NotHere => {
                    let map = read(&self.segments);
                    cursor = map.range(segment.base_offset() + 1..).next().map(|(_, s)| Arc::clone(s));
                }
            }
        }
        Ok(result)
    }

    /// The first record with timestamp `>= target` at or after the log start offset (ListOffsets
    /// by timestamp), or `None` if every record is older.
    pub fn offset_for_timestamp(&self, target: i64) -> Result<Option<TimestampOffset>> {
        let log_start = self.log_start_offset();
        let log_end = self.log_end_offset();
        for segment in self.segments_snapshot() {
            match segment.max_timestamp()? {
                Some((max, _)) if max >= target => {}
                _ => continue,
            }
            let mut min_offset = log_start;
            while let Some((position, header)) = segment.find_batch_by_timestamp(target, min_offset)? {
                // Read (and so CRC- and offset-check) the batch before trusting its base offset: a
                // corrupted one must be an error, not a silent "no such record".
                let batch = segment.read_batch(position, &header)?;
                if header.base_offset >= log_end {
                    return Ok(None);
                }
                if let Some(found) = first_record_at_or_after(&batch, target, log_start, log_end)? {
                    return Ok(Some(found));
                }
                // Only records below the log start qualified; keep looking after this batch.
                min_offset = header.next_offset();
            }
        }
        Ok(None)
    }

    /// The record with the largest timestamp (ListOffsets MAX_TIMESTAMP, KIP-734).
    pub fn max_timestamp_offset(&self) -> Result<Option<TimestampOffset>> {
        let mut best: Option<TimestampOffset> = None;
        for segment in self.segments_snapshot() {
            if let Some((timestamp, offset)) = segment.max_timestamp()? {
                if best.is_none_or(|b| timestamp > b.timestamp) {
                    best = Some(TimestampOffset { timestamp, offset });
                }
            }
        }
        // Refine from the batch to the record carrying the timestamp.
        if let Some(b) = best {
            let read = self.read(b.offset.max(self.log_start_offset()), 1, self.log_end_offset())?;
            if let Some(slice) = read.slice {
                let bytes = slice.read_to_vec()?;
                if let Ok(records) = decode_records(&bytes) {
                    if let Some(r) = records.iter().filter(|r| r.timestamp == b.timestamp).max_by_key(|r| r.offset) {
                        return Ok(Some(TimestampOffset { timestamp: r.timestamp, offset: r.offset }));
                    }
                }
            }
        }
        Ok(best)
    }

    /// DeleteRecords: moves the log start offset up to `offset` (at most the high watermark) and
    /// removes the segments entirely below it. Returns the new log start offset.
    pub fn delete_records_before(&self, offset: i64) -> Result<i64> {
        let hw = self.high_watermark();
        if offset > hw || offset < 0 {
            return Err(StorageError::OffsetOutOfRange {
                offset,
                log_start_offset: self.log_start_offset(),
                log_end_offset: hw,
            });
        }
        let _maintenance = lock(&self.maintenance);
        self.log_start_offset.fetch_max(offset, Ordering::AcqRel);
        self.start_floor.fetch_max(offset, Ordering::AcqRel);
        self.delete_segments_below_log_start()?;
        self.trim_leader_epochs()?;
        self.check_invariants();
        Ok(self.log_start_offset())
    }

    /// The epochs that ended before the log start are gone (after DeleteRecords or retention).
    fn trim_leader_epochs(&self) -> Result<()> {
        let mut epochs = lock(&self.leader_epochs);
        // An unseeded cache is empty: it will be seeded from the new log start.
        epochs.cache.truncate_from_start(self.log_start_offset())
    }

    fn delete_segments_below_log_start(&self) -> Result<RetentionOutcome> {
        let log_start = self.log_start_offset();
        let bases = self.segment_base_offsets();
        let mut doomed = Vec::new();
        for pair in bases.windows(2) {
            if pair[1] <= log_start {
                doomed.push(pair[0]);
            }
        }
        self.delete_segments(&doomed)
    }

    /// Removes the given (non-active) segments: out of the map first, so no new reader finds
    /// them, then renamed to `.deleted` and queued for unlinking after `file.delete.delay.ms`.
    pub(crate) fn delete_segments(&self, bases: &[i64]) -> Result<RetentionOutcome> {
        self.delete_segments_moving_start(bases, true)
    }

    /// [`Log::delete_segments`]; with `move_start` false the log start stays (a tiered log's
    /// local retention: the store still holds those offsets).
    fn delete_segments_moving_start(&self, bases: &[i64], move_start: bool) -> Result<RetentionOutcome> {
        let mut outcome = RetentionOutcome::default();
        if bases.is_empty() {
            return Ok(outcome);
        }
        let now = self.clock.now_ms();
        let delay = self.config().file_delete_delay_ms as i64;
        let removed: Vec<Arc<Segment>> = {
            let mut map = write(&self.segments);
            let active = *map.keys().next_back().expect("active segment");
            let removed = bases.iter().filter(|b| **b != active).filter_map(|b| map.remove(b)).collect();
            if let Some(first) = map.keys().next().filter(|_| move_start) {
                self.log_start_offset.fetch_max(*first, Ordering::AcqRel);
                self.start_floor.fetch_max(*first, Ordering::AcqRel);
            }
            removed
        };
        for segment in removed {
            outcome.deleted_segments += 1;
            outcome.deleted_bytes += segment.size();
            let paths = segment.rename_to_deleted()?;
            self.deletion_queue.schedule(paths, now + delay);
        }
        if outcome.deleted_segments > 0 {
            tracing::info!(dir = %self.dir.display(), segments = outcome.deleted_segments, bytes = outcome.deleted_bytes, log_start_offset = self.log_start_offset(), "deleted segments");
            self.trim_leader_epochs()?;
        }
        Ok(outcome)
    }

    /// One retention pass: segments below the log start offset; with `cleanup.policy` containing
    /// `delete`, segments older than `retention.ms` (by their largest timestamp) and the oldest
    /// segments beyond `retention.bytes`. Never deletes data at or above the high watermark.
    pub fn apply_retention(&self) -> Result<RetentionOutcome> {
        let _maintenance = lock(&self.maintenance);
        let config = self.config();
        let now = self.clock.now_ms();
        let mut outcome = self.delete_segments_below_log_start()?;
        // A tiered log keeps only its local tail of what the store holds, compacted or not
        // (the store's part of a compacted log is compacted there).
        if config.remote_storage_enable {
            let local = self.apply_local_retention(&config, now)?;
            outcome.deleted_segments += local.deleted_segments;
            outcome.deleted_bytes += local.deleted_bytes;
            return Ok(outcome);
        }
        if !config.cleanup_policy.delete {
            return Ok(outcome);
        }
        if config.retention_ms >= 0 {
            let expired = |segment: &Segment| -> Result<bool> {
                let largest = segment.max_timestamp()?.map_or(segment.created_ms, |(t, _)| t);
                Ok(now - largest > config.retention_ms)
            };
            let active = self.active_segment();
            // If everything including the active segment expired, roll so the data can go.
            let all_expired = self
                .segments_snapshot()
                .iter()
                .try_fold(true, |acc, s| Ok::<bool, StorageError>(acc && (s.size() == 0 || expired(s)?)))?;
            if all_expired && active.size() > 0 && self.high_watermark() >= self.log_end_offset() {
                self.roll_now()?;
            }
            let mut doomed = Vec::new();
            let segments = self.segments_snapshot();
            for pair in segments.windows(2) {
                let (segment, next) = (&pair[0], &pair[1]);
                if next.base_offset() > self.high_watermark() || !expired(segment)? {
                    break;
                }
                doomed.push(segment.base_offset());
            }
            let o = self.delete_segments(&doomed)?;
            outcome.deleted_segments += o.deleted_segments;
            outcome.deleted_bytes += o.deleted_bytes;
        }
        if config.retention_bytes >= 0 {
            let segments = self.segments_snapshot();
            let mut excess = segments.iter().map(|s| s.size()).sum::<u64>() as i64 - config.retention_bytes;
            let mut doomed = Vec::new();
            for pair in segments.windows(2) {
                let (segment, next) = (&pair[0], &pair[1]);
                if excess < segment.size() as i64 || next.base_offset() > self.high_watermark() {
                    break;
                }
                excess -= segment.size() as i64;
                doomed.push(segment.base_offset());
            }
            let o = self.delete_segments(&doomed)?;
            outcome.deleted_segments += o.deleted_segments;
            outcome.deleted_bytes += o.deleted_bytes;
        }
        Ok(outcome)
    }

    /// A tiered log's retention on local disk: `local.retention.ms` and `local.retention.bytes`
    /// (`-2`: `retention.*`) over the segments the object store already holds (below
    /// [`Log::remote_end_offset`] and the high watermark). The log start does not move: the
    /// tier applies `retention.*` to both tiers and moves it (by DeleteRecords' path). A segment
    /// not uploaded yet stays, whatever its age: with the store down, local disk carries on.
    fn apply_local_retention(&self, config: &LogConfig, now: i64) -> Result<RetentionOutcome> {
        let mut outcome = RetentionOutcome::default();
        let bound = self.remote_end_offset().min(self.high_watermark());
        let segments = self.segments_snapshot();
        let deletable = |next: &Segment| next.base_offset() <= bound;
        let retention_ms = config.effective_local_retention_ms();
        let mut doomed = Vec::new();
        if retention_ms >= 0 {
            for pair in segments.windows(2) {
                let (segment, next) = (&pair[0], &pair[1]);
                let largest = segment.max_timestamp()?.map_or(segment.created_ms, |(t, _)| t);
                if !deletable(next) || now - largest <= retention_ms {
                    break;
                }
                doomed.push(segment.base_offset());
            }
        }
        let retention_bytes = config.effective_local_retention_bytes();
        if retention_bytes >= 0 {
            let mut excess = segments.iter().map(|s| s.size()).sum::<u64>() as i64 - retention_bytes;
            for pair in segments.windows(2) {
                let (segment, next) = (&pair[0], &pair[1]);
                if excess < segment.size() as i64 || !deletable(next) {
                    break;
                }
                excess -= segment.size() as i64;
                if !doomed.contains(&segment.base_offset()) {
                    doomed.push(segment.base_offset());
                }
            }
        }
        if !doomed.is_empty() {
            let o = self.delete_segments_moving_start(&doomed, false)?;
            outcome.deleted_segments += o.deleted_segments;
            outcome.deleted_bytes += o.deleted_bytes;
        }
        Ok(outcome)
    }

    /// Removes every batch at or after the batch containing `offset` (a follower truncating to
    /// the leader). Returns the new log end offset. Truncating below the log start offset
    /// empties the log and restarts it at `offset`.
    pub fn truncate_to(&self, offset: i64) -> Result<i64> {
        let _maintenance = lock(&self.maintenance);
        let _writer = lock(&self.writer);
        self.check_open()?;
        let log_end = self.log_end_offset();
        if offset > log_end {
            return Ok(log_end);
        }
        if offset == log_end {
            // Nothing to cut, but an epoch that begins at the log end has no batch yet (a leader
            // records its epoch when it starts to lead): a replica that truncates here diverged
            // from the leader in that epoch and must stop naming it as its last one.
            self.epochs()?.cache.truncate_from_end(log_end, self.log_start_offset())?;
            self.refresh_latest_epoch()?;
            return Ok(log_end);
        }
        if offset <= self.log_start_offset() {
            self.reset_to(offset)?;
            self.rebuild_producer_state()?;
            self.check_invariants_locked(&_writer);
            return Ok(offset);
        }
        let doomed: Vec<Arc<Segment>> = {
            let mut map = write(&self.segments);
            let floor = map.range(..=offset).next_back().map_or(i64::MIN, |(b, _)| *b);
            let later: Vec<i64> = map.range(floor + 1..).map(|(b, _)| *b).collect();
            later.iter().filter_map(|b| map.remove(b)).collect()
        };
        let now = self.clock.now_ms();
        for segment in doomed {
            let paths = segment.rename_to_deleted()?;
            self.deletion_queue.schedule(paths, now);
        }
        let active = self.active_segment();
        active.truncate_to(offset)?;
        active.reactivate()?;
        let log_end = active.next_offset()?;
        self.log_end_offset.store(log_end, Ordering::Release);
        self.recovery_point.fetch_min(log_end, Ordering::AcqRel);
        self.high_watermark.fetch_min(log_end, Ordering::AcqRel);
        self.cleaner_checkpoint.fetch_min(log_end, Ordering::AcqRel);
        {
            let mut sync = lock(&self.sync);
            sync.durable_end = sync.durable_end.min(log_end);
        }
        self.rebuild_producer_state()?;
        self.epochs()?.cache.truncate_from_end(log_end, self.log_start_offset())?;
        self.latest_leader_epoch.store(EPOCHS_NOT_SEEDED, Ordering::Release);
        self.refresh_latest_epoch()?;
        self.check_invariants_locked(&_writer);
        Ok(log_end)
    }

    /// Re-reads the latest epoch into its lock-free copy after the cache lost entries.
    fn refresh_latest_epoch(&self) -> Result<()> {
        let epochs = self.epochs()?;
        self.latest_leader_epoch.store(epochs.cache.latest().map_or(UNDEFINED_EPOCH, |e| e.epoch), Ordering::Release);
        Ok(())
    }

    /// Empties the log and starts it again at `offset` (Kafka's truncateFullyAndStartAt): a
    /// replica whose log is replaced by a snapshot, or one that fell behind the leader's log
    /// start. Everything is scheduled for deletion; the high watermark and the log start are
    /// `offset` after it.
    pub fn truncate_fully_and_start_at(&self, offset: i64) -> Result<()> {
        let _maintenance = lock(&self.maintenance);
        let writer = lock(&self.writer);
        self.check_open()?;
        self.reset_to(offset)?;
        self.rebuild_producer_state()?;
        self.check_invariants_locked(&writer);
        Ok(())
    }

    /// Empties a tiered log and starts its local part at `local_start`, with the log starting
    /// at `log_start` (at most `local_start`): a replica that starts where its leader's local
    /// part does, the offsets before it being in the object store (KIP-405). Like
    /// [`Log::truncate_fully_and_start_at`] otherwise.
    pub fn truncate_fully_and_start_tiered_at(&self, log_start: i64, local_start: i64) -> Result<()> {
        let _maintenance = lock(&self.maintenance);
        let writer = lock(&self.writer);
        self.check_open()?;
        self.reset_to(local_start)?;
        if self.config().remote_storage_enable {
            let log_start = log_start.clamp(0, local_start);
            self.log_start_offset.store(log_start, Ordering::Release);
            self.start_floor.store(log_start, Ordering::Release);
        }
        self.rebuild_producer_state()?;
        self.check_invariants_locked(&writer);
        Ok(())
    }

    /// Empties the log and restarts it at `offset` (Kafka's truncateFullyAndStartAt).
    fn reset_to(&self, offset: i64) -> Result<()> {
        let now = self.clock.now_ms();
        let old: Vec<Arc<Segment>> = std::mem::take(&mut *write(&self.segments)).into_values().collect();
        for segment in old {
            let paths = segment.rename_to_deleted()?;
            self.deletion_queue.schedule(paths, now);
        }
        let config = self.config();
        let segment = self.create_segment(&config, offset, now)?;
        fsync_dir(&self.dir)?;
        write(&self.segments).insert(offset, Arc::new(segment));
        for value in [
            &self.log_start_offset,
            &self.log_end_offset,
            &self.high_watermark,
            &self.recovery_point,
            &self.cleaner_checkpoint,
            &self.start_floor,
        ] {
            value.store(offset, Ordering::Release);
        }
        lock(&self.sync).durable_end = offset;
        let mut epochs = lock(&self.leader_epochs);
        epochs.cache.clear()?;
        epochs.seeded = true;
        epochs.pending = None;
        self.latest_leader_epoch.store(UNDEFINED_EPOCH, Ordering::Release);
        Ok(())
    }

    /// Validates every batch of every segment (a scrub); reports the first corruption.
    pub fn verify(&self) -> Result<()> {
        let segments = self.segments_snapshot();
        for (i, segment) in segments.iter().enumerate() {
            segment.verify_all()?;
            // baseOffset is outside the CRC. `verify_all` checks the order of offsets inside the
            // segment; only the next segment's base offset bounds its last batch.
            let Some(next) = segments.get(i + 1) else { continue };
            if let Some((position, last)) = segment.batch_headers()?.pop() {
                let end = last.base_offset.checked_add(i64::from(last.last_offset_delta) + 1);
                if end.is_none_or(|end| end > next.base_offset()) {
                    return Err(StorageError::CorruptSegment {
                        path: segment.log_path().to_path_buf(),
                        position,
                        reason: format!(
                            "the last batch (base offset {}) runs into the next segment at {}",
                            last.base_offset,
                            next.base_offset()
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// Flushes everything and trims the indexes; the log accepts no more appends.
    pub fn close(&self) -> Result<()> {
        let _writer = lock(&self.writer);
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        for segment in self.segments_snapshot() {
            segment.close()?;
        }
        // After a clean shutdown the next open loads this and reads no batches.
        self.sync_txn_index()?;
        lock(&self.producers).write_snapshot(&self.dir, self.log_end_offset())?;
        self.recovery_point.store(self.log_end_offset(), Ordering::Release);
        Ok(())
    }

    /// Rebuilds the producer state from the newest snapshot at or below the log end plus the
    /// batch headers after it (at open and after truncation).
    fn rebuild_producer_state(&self) -> Result<()> {
        let log_end = self.log_end_offset();
        {
            let mut aborted = lock(&self.aborted);
            match aborted.as_mut() {
                Some(index) => index.truncate(log_end)?,
                None => {
                    let mut index = TxnIndex::open(&self.dir, log_end)?;
                    index.prune(self.log_start_offset())?;
                    *aborted = Some(index);
                }
            }
        }
        let (mut state, from) = match ProducerStateManager::load_snapshot(&self.dir, log_end)? {
            Some((state, offset)) => (state, offset.max(self.log_start_offset())),
            None => (ProducerStateManager::new(), self.log_start_offset()),
        };
        // Headers only: after a crash the newest snapshot can be a whole active segment behind,
        // and reading (and checksumming) gigabytes of batches here made start-up as slow as a
        // full recovery. Control batches, the only ones whose records matter, are read whole.
        // After a clean shutdown the snapshot is at the log end: nothing to read.
        let segments = if from < log_end { self.segments_snapshot() } else { Vec::new() };
        let first = segments.iter().rposition(|s| s.base_offset() <= from).unwrap_or(0);
        'segments: for segment in &segments[first..] {
            if segment.base_offset() >= log_end {
                break;
            }
            let walked = segment.visit_headers(from, |position, header| {
                if header.base_offset >= log_end {
                    return Ok(false);
                }
                if header.producer_id == NO_PRODUCER_ID || header.next_offset() <= from {
                    return Ok(true);
                }
                let control = if header.is_control() {
                    let size = header.size_bytes().unwrap_or(HEADER_BYTES);
                    batch::control_type(&segment.read_batch_unchecked(position, size)?)
                } else {
                    None
                };
                if let Some(aborted) = state.update(header, control, header.max_timestamp) {
                    let known = lock(&self.aborted)
                        .as_ref()
                        .is_some_and(|i| i.contains(aborted.producer_id, aborted.last_offset));
                    if !known {
                        self.record_abort(aborted)?;
                    }
                }
                Ok(true)
            });
            if let Err(e) = walked {
                // A corrupt old segment must not stop the log from opening: reads report it. The
                // state then lacks what that segment held, as after producer expiry.
                tracing::warn!(dir = %self.dir.display(), segment = segment.base_offset(), error = %e, "producer state rebuilt only up to an unreadable batch");
                break 'segments;
            }
        }
        if state.first_unstable_offset().is_some() {
            self.transactions_seen.store(true, Ordering::Release);
        }
        *lock(&self.producers) = state;
        Ok(())
    }

    fn record_abort(&self, aborted: AbortedTxn) -> Result<()> {
        match lock(&self.aborted).as_mut() {
            Some(index) => index.append(aborted),
            None => Ok(()),
        }
    }

    fn sync_txn_index(&self) -> Result<()> {
        match lock(&self.aborted).as_ref() {
            Some(index) => index.sync(),
            None => Ok(()),
        }
    }

    /// The last stable offset: the first offset of the oldest open transaction, or the high
    /// watermark. `read_committed` consumers read up to here.
    pub fn last_stable_offset(&self) -> i64 {
        // The high watermark first: an append sets `transactions_seen` before it moves the high
        // watermark, so a high watermark past a transactional batch implies the flag is seen.
        let hw = self.high_watermark();
        self.first_unstable_offset().map_or(hw, |first| first.min(hw))
    }

    /// Aborted transactions overlapping `[from, upper)`, for a read_committed fetch of that range.
    pub fn aborted_transactions(&self, from: i64, upper: i64) -> Vec<AbortedTxn> {
        lock(&self.aborted).as_ref().map(|i| i.overlapping(from, upper)).unwrap_or_default()
    }

    /// Forgets producers idle longer than `expiration_ms` (`producer.id.expiration.ms`).
    pub fn expire_producers(&self, expiration_ms: i64) -> usize {
        let now = self.clock.now_ms();
        lock(&self.producers).expire(now, expiration_ms)
    }

    /// Where an idempotent producer's last batch in this log stands (`None`: the log knows no
    /// batch of it, or forgot it at expiry).
    pub fn producer_progress(&self, producer_id: i64) -> Option<ProducerProgress> {
        lock(&self.producers).progress(producer_id)
    }

    /// The idempotent producers this partition knows.
    pub fn producer_count(&self) -> usize {
        lock(&self.producers).len()
    }

    /// The first offset of the oldest open transaction, if any.
    pub(crate) fn first_unstable_offset(&self) -> Option<i64> {
        if !self.transactions_seen.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.producers).first_unstable_offset()
    }

    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Asserts the offset invariants of the module doc (debug builds only; nothing in release).
    /// Takes the writer lock, so that no append or truncation is half done.
    pub fn check_invariants(&self) {
        if cfg!(debug_assertions) {
            let writer = lock(&self.writer);
            self.check_invariants_locked(&writer);
        }
    }

    /// [`Log::check_invariants`] for a caller holding the writer lock. Values are read from the
    /// one that only grows to the one that may shrink, so that a concurrent sync (which raises
    /// the high watermark) or DeleteRecords (which raises the log start) cannot make a sound
    /// state look broken.
    fn check_invariants_locked(&self, _writer: &MutexGuard<'_, ()>) {
        if !cfg!(debug_assertions) {
            return;
        }
        let dir = self.dir.display();
        // Retention moves the log start while holding the map's write lock: read both under it.
        let segments = read(&self.segments);
        let log_start = self.log_start_offset();
        let (Some(first), Some(active)) = (segments.keys().next().copied(), segments.values().next_back().cloned())
        else {
            panic!("{dir}: a log without segments");
        };
        drop(segments);
        let high_watermark = self.high_watermark();
        let recovery_point = self.recovery_point();
        let log_end = self.log_end_offset();
        // A tiered log may start in the object store, which then reaches the local segments.
        let in_store = self.config().remote_storage_enable;
        assert!(
            first <= log_start || in_store,
            "{dir}: the first segment ({first}) begins after the log start {log_start}"
        );
        assert!(log_start <= high_watermark, "{dir}: log start {log_start} > high watermark {high_watermark}");
        assert!(high_watermark <= log_end, "{dir}: high watermark {high_watermark} > log end {log_end}");
        assert!(recovery_point <= log_end, "{dir}: recovery point {recovery_point} > log end {log_end}");
        assert!(
            active.base_offset() <= log_end,
            "{dir}: active segment {} past the log end {log_end}",
            active.base_offset()
        );
        let epochs = lock(&self.leader_epochs);
        let entries = epochs.cache.entries();
        assert!(
            entries.windows(2).all(|w| w[0].epoch < w[1].epoch && w[0].start_offset < w[1].start_offset),
            "{dir}: leader epochs out of order: {entries:?}"
        );
        if let Some(latest) = entries.last() {
            assert!(latest.start_offset <= log_end, "{dir}: epoch {latest:?} starts past the log end {log_end}");
        }
    }
}

/// Decodes the records of the batches in `bytes` (decompressing as needed).
pub(crate) fn decode_records(bytes: &[u8]) -> Result<Vec<crate::records::Record>> {
    crate::records::decode_records(bytes)
        .map_err(|e| StorageError::from(crate::error::BatchError::Corrupt(format!("cannot decode records: {e}"))))
}

fn first_record_at_or_after(
    batch: &[u8],
    target: i64,
    log_start: i64,
    log_end: i64,
) -> Result<Option<TimestampOffset>> {
    let records = decode_records(batch)?;
    Ok(records
        .iter()
        .find(|r| r.timestamp >= target && r.offset >= log_start && r.offset < log_end)
        .map(|r| TimestampOffset { timestamp: r.timestamp, offset: r.offset }))
}

/// Cleans up what an interrupted operation left in `dir` and returns the segment base offsets,
/// ascending. `.deleted` and `.cleaned` files are removed; a `.swap` file (a finished compaction
/// whose swap was interrupted) replaces the segment of the same name.
fn prepare_directory(dir: &Path) -> Result<Vec<i64>> {
    let mut bases = Vec::new();
    let entries = std::fs::read_dir(dir).at(dir)?;
    let mut swaps = Vec::new();
    for entry in entries {
        let entry = entry.at(dir)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.ends_with(".deleted") || name.ends_with(".cleaned") || name.ends_with(".tmp") {
            std::fs::remove_file(&path).at(&path)?;
        } else if name.ends_with(".swap") {
            swaps.push(path);
        }
    }
    for swap in swaps {
        let final_path = swap.with_extension("");
        // `<base>.log.swap` -> `<base>.log`; indexes of that segment are stale now.
        tracing::info!(file = %swap.display(), "completing an interrupted compaction swap");
        std::fs::rename(&swap, &final_path).at(&swap)?;
        if let Some(stem) = final_path.file_stem() {
            for ext in ["index", "timeindex"] {
                let _ = std::fs::remove_file(dir.join(format!("{}.{ext}", stem.to_string_lossy())));
            }
        }
    }
    for entry in std::fs::read_dir(dir).at(dir)? {
        let entry = entry.at(dir)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".log") {
            if stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()) {
                if let Ok(base) = stem.parse::<i64>() {
                    bases.push(base);
                }
            }
        }
    }
    bases.sort_unstable();
    // Index files without a log are leftovers of a deleted segment.
    for entry in std::fs::read_dir(dir).at(dir)? {
        let entry = entry.at(dir)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        for ext in [".index", ".timeindex"] {
            if let Some(stem) = name.strip_suffix(ext) {
                if stem.parse::<i64>().is_ok_and(|b| bases.binary_search(&b).is_err()) {
                    std::fs::remove_file(entry.path()).at(&entry.path())?;
                }
            }
        }
    }
    Ok(bases)
}
