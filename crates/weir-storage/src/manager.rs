//! The data directory: every partition log in it, and the background work they share.
//!
//! Files at the top of the data directory:
//! - `.lock`: held with `flock` while a process uses the directory, so two brokers never share it.
//! - `.weir_clean_shutdown`: written last by a clean shutdown, removed once the logs are loaded.
//!   Present at start-up: no file is scanned. Absent: each log is recovered from its recovery point.
//! - `.weir_boot_id`: the kernel boot id of the last process that opened the directory. After a
//!   crash with the same boot id, only the process died and the page cache kept every write, so
//!   recovery reads only segment tails (see `OpenOptions::page_cache_survived`); after a machine
//!   crash the id differs (or the file is lost) and recovery checksums whole segments.
//! - `recovery-point-offset-checkpoint`, `log-start-offset-checkpoint`,
//!   `cleaner-offset-checkpoint`: Kafka-format checkpoints, written atomically.
//!
//! Background work runs on two threads: the scheduler (flushes by policy, retention, deferred
//! deletion, checkpoints) and the cleaner (compaction), so a long compaction never delays a flush.

use std::collections::HashMap;
use std::fs::{File, OpenOptions as FsOpenOptions};
use std::num::NonZeroU64;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::checkpoint::{self, fsync_dir, OffsetMap};
use crate::cleaner::{Cleaner, CleanerConfig};
use crate::clock::{Clock, SystemClock};
use crate::config::LogConfig;
use crate::deletion::DeletionQueue;
use crate::error::{IoContext, Result, StorageError};
use crate::log::{Log, OpenOptions};
use crate::sync::{lock, read, write};

const CLEAN_SHUTDOWN_FILE: &str = ".weir_clean_shutdown";
const BOOT_ID_FILE: &str = ".weir_boot_id";
const LOCK_FILE: &str = ".lock";
const RECOVERY_POINT_CHECKPOINT: &str = "recovery-point-offset-checkpoint";
const LOG_START_CHECKPOINT: &str = "log-start-offset-checkpoint";
const CLEANER_CHECKPOINT: &str = "cleaner-offset-checkpoint";
/// Suffix of a deleted partition directory awaiting removal (as Kafka names them).
const DELETED_DIR_SUFFIX: &str = "-delete";

/// A topic name and partition number; the log directory is `<topic>-<partition>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: i32,
}

impl TopicPartition {
    pub fn new(topic: impl Into<String>, partition: i32) -> TopicPartition {
        TopicPartition { topic: topic.into(), partition }
    }

    pub(crate) fn dir_name(&self) -> String {
        format!("{}-{}", self.topic, self.partition)
    }

    /// Parses a log directory name. Topic names may contain `-`, so the partition is after the last one.
    pub(crate) fn parse_dir_name(name: &str) -> Option<TopicPartition> {
        let (topic, partition) = name.rsplit_once('-')?;
        let partition: i32 = partition.parse().ok().filter(|p| *p >= 0)?;
        (!topic.is_empty()).then(|| TopicPartition::new(topic, partition))
    }
}

impl std::fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// Broker-level storage settings, with Kafka's names in the docs of each field.
#[derive(Clone)]
pub struct ManagerOptions {
    pub data_dir: PathBuf,
    /// Config for logs opened at start-up before the broker applies topic overrides.
    pub default_config: LogConfig,
    pub clock: Arc<dyn Clock>,
    /// `log.retention.check.interval.ms` (Kafka: 300000).
    pub retention_check_interval_ms: u64,
    /// `log.flush.scheduler.interval.ms`: how often `flush.ms` and rolled segments are checked.
    pub flush_check_interval_ms: u64,
    /// `log.flush.offset.checkpoint.interval.ms` (Kafka: 60000).
    pub checkpoint_interval_ms: u64,
    /// `log.cleaner.enable`.
    pub cleaner_enabled: bool,
    /// `log.cleaner.backoff.ms`: pause between cleaner passes that found nothing to do.
    pub cleaner_backoff_ms: u64,
    /// `log.cleaner.io.max.bytes.per.second`: compaction's read plus write rate; 0 (the
    /// default, as in the broker's setting) is no limit.
    pub cleaner_io_max_bytes_per_second: u64,
    /// `num.recovery.threads.per.data.dir`: threads that open (and recover) logs at start-up.
    pub recovery_threads: usize,
    /// `producer.id.expiration.ms`: forget an idempotent producer idle this long (Kafka: 1 day).
    pub producer_id_expiration_ms: i64,
}

impl ManagerOptions {
    pub fn new(data_dir: impl Into<PathBuf>) -> ManagerOptions {
        ManagerOptions {
            data_dir: data_dir.into(),
            default_config: LogConfig::default(),
            clock: Arc::new(SystemClock),
            retention_check_interval_ms: 300_000,
            flush_check_interval_ms: 1_000,
            checkpoint_interval_ms: 60_000,
            cleaner_enabled: true,
            cleaner_backoff_ms: 15_000,
            cleaner_io_max_bytes_per_second: 0,
            recovery_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            producer_id_expiration_ms: 86_400_000,
        }
    }
}

struct Shutdown {
    stopping: Mutex<bool>,
    wake: Condvar,
}

impl Shutdown {
    fn requested(&self) -> bool {
        *lock(&self.stopping)
    }

    /// Sleeps up to `ms`; returns true if shutdown was requested.
    fn sleep(&self, ms: u64) -> bool {
        let guard = lock(&self.stopping);
        let (guard, _) =
            self.wake.wait_timeout_while(guard, Duration::from_millis(ms), |s| !*s).unwrap_or_else(|p| p.into_inner());
        *guard
    }
}

pub struct LogManager {
    options: ManagerOptions,
    logs: RwLock<HashMap<TopicPartition, Arc<Log>>>,
    /// Held while logs are created or deleted, so that two never make or remove the same
    /// directory at once; `logs` is locked only to change the map.
    creating: Mutex<()>,
    deletion_queue: Arc<DeletionQueue>,
    /// Held for the manager's lifetime; the flock is released when it closes.
    _lock_file: File,
    /// Whether the data directory was shut down cleanly last time.
    recovered_from_clean_shutdown: bool,
    shutdown: Arc<Shutdown>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The running cleaner, so shutdown can abort a long pass instead of waiting for it.
    cleaner: Mutex<Option<Arc<Cleaner>>>,
    closed: Mutex<bool>,
}

impl LogManager {
    /// Locks the data directory and opens every log in it, recovering after a crash.
    pub fn open(options: ManagerOptions) -> Result<Arc<LogManager>> {
        let dir = options.data_dir.clone();
        std::fs::create_dir_all(&dir).at(&dir)?;
        let lock_file = lock_directory(&dir)?;
        let marker = dir.join(CLEAN_SHUTDOWN_FILE);
        let clean = marker.exists();
        let boot_id = current_boot_id();
        let boot_file = dir.join(BOOT_ID_FILE);
        let page_cache_survived = !clean
            && boot_id.is_some()
            && std::fs::read_to_string(&boot_file).ok().as_deref().map(str::trim) == boot_id.as_deref();
        let recovery_points = checkpoint::read_offsets(&dir.join(RECOVERY_POINT_CHECKPOINT))?;
        let log_starts = checkpoint::read_offsets(&dir.join(LOG_START_CHECKPOINT))?;
        let cleaner_points = checkpoint::read_offsets(&dir.join(CLEANER_CHECKPOINT))?;
        let deletion_queue = Arc::new(DeletionQueue::new());

        let mut partitions = Vec::new();
        let mut stale_dirs = Vec::new();
        for entry in std::fs::read_dir(&dir).at(&dir)? {
            let entry = entry.at(&dir)?;
            if !entry.file_type().at(&entry.path())?.is_dir() {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(DELETED_DIR_SUFFIX) {
                stale_dirs.push(entry.path());
            } else if let Some(tp) = TopicPartition::parse_dir_name(&name) {
                partitions.push(tp);
            }
        }
        for stale in stale_dirs {
            std::fs::remove_dir_all(&stale).at(&stale)?;
        }

        let started = std::time::Instant::now();
        let opened = open_logs(
            &options,
            &partitions,
            (clean, page_cache_survived),
            &recovery_points,
            &log_starts,
            &deletion_queue,
        )?;
        let mut logs = HashMap::with_capacity(opened.len());
        for (tp, log) in opened {
            let key = (tp.topic.clone(), tp.partition);
            if let Some(cleaned_to) = cleaner_points.get(&key) {
                // A checkpoint older than a crash-truncated log must not point past its end.
                let cleaned_to = (*cleaned_to).max(log.log_start_offset()).min(log.log_end_offset());
                log.cleaner_checkpoint.store(cleaned_to, Ordering::Release);
            }
            logs.insert(tp, Arc::new(log));
        }
        tracing::info!(
            dir = %dir.display(),
            partitions = logs.len(),
            clean_shutdown = clean,
            page_cache_survived,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "loaded logs"
        );
        // The next start compares its boot id with this one. Not fsynced: after a machine crash
        // the file holds an older id or nothing, and either means a full recovery.
        if let Some(id) = &boot_id {
            if let Err(e) = std::fs::write(&boot_file, id) {
                tracing::warn!(error = %e, "cannot record the boot id; a crash will be recovered in full");
            }
        }
        // From here on a crash must be treated as unclean.
        if clean {
            std::fs::remove_file(&marker).at(&marker)?;
            fsync_dir(&dir)?;
        }
        Ok(Arc::new(LogManager {
            options,
            logs: RwLock::new(logs),
            creating: Mutex::new(()),
            deletion_queue,
            _lock_file: lock_file,
            recovered_from_clean_shutdown: clean,
            shutdown: Arc::new(Shutdown { stopping: Mutex::new(false), wake: Condvar::new() }),
            threads: Mutex::new(Vec::new()),
            cleaner: Mutex::new(None),
            closed: Mutex::new(false),
        }))
    }

    pub fn data_dir(&self) -> &Path {
        &self.options.data_dir
    }

    pub fn recovered_from_clean_shutdown(&self) -> bool {
        self.recovered_from_clean_shutdown
    }

    pub fn get(&self, tp: &TopicPartition) -> Option<Arc<Log>> {
        read(&self.logs).get(tp).cloned()
    }

    /// Returns the log, creating an empty one with `config` if it does not exist.
    pub fn get_or_create(&self, tp: &TopicPartition, config: LogConfig) -> Result<Arc<Log>> {
        if let Some(log) = self.get(tp) {
            return Ok(log);
        }
        let mut logs = self.get_or_create_many(vec![(tp.clone(), config)])?;
        Ok(logs.pop().expect("one log asked, one given"))
    }

    /// Returns the log of each of `wanted`, in order, creating the missing ones, empty, with
    /// their config: a whole topic (or a whole metadata change) at once.
    ///
    /// Durability invariant: when this returns, the directory of every log it created, and the
    /// files in it, are durable; a broker never reports or acts on (leads, follows, acknowledges
    /// writes to) a partition whose directory a power failure could take back. The logs are
    /// made first, then each new directory and the data directory are fsynced: the first
    /// fsync commits the file system's journal with every `mkdir` and file of the batch in it,
    /// so the others find nothing left to write. Creating 10 partitions cost 20 fsyncs one
    /// after the other (the data directory's and the partition's, in `Log::open`); now the
    /// batch costs one journal commit.
    ///
    /// Only one creation runs at a time (`creating`), but the map's write lock is taken only to
    /// insert the new logs, so readers and appends are not held up by the file I/O.
    pub fn get_or_create_many(&self, wanted: Vec<(TopicPartition, LogConfig)>) -> Result<Vec<Arc<Log>>> {
        let _creating = lock(&self.creating);
        let mut found: Vec<Option<Arc<Log>>> = {
            let logs = read(&self.logs);
            wanted.iter().map(|(tp, _)| logs.get(tp).cloned()).collect()
        };
        let mut created: HashMap<TopicPartition, Arc<Log>> = HashMap::new();
        let mut made_dirs = Vec::new();
        let mut failure = None;
        for ((tp, config), slot) in wanted.iter().zip(found.iter_mut()) {
            if slot.is_some() || created.contains_key(tp) {
                continue;
            }
            let dir = self.options.data_dir.join(tp.dir_name());
            let clock = Arc::clone(&self.options.clock);
            let made = match Log::create(&dir, config.clone(), clock.clone(), Arc::clone(&self.deletion_queue)) {
                // Left by a creation that failed half-way (its logs were never handed out): open
                // what is there, as a restart would.
                Err(StorageError::Io { ref source, .. }) if source.kind() == std::io::ErrorKind::AlreadyExists => {
                    Log::open(&dir, config.clone(), clock, OpenOptions::default(), Arc::clone(&self.deletion_queue))
                }
                made => made,
            };
            match made {
                Ok(log) => {
                    made_dirs.push(dir);
                    created.insert(tp.clone(), Arc::new(log));
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        // Durable before anyone sees them (see above). What was made before a failure is kept.
        for dir in &made_dirs {
            fsync_dir(dir)?;
        }
        if !made_dirs.is_empty() {
            fsync_dir(&self.options.data_dir)?;
        }
        {
            let mut logs = write(&self.logs);
            for (tp, log) in &created {
                logs.insert(tp.clone(), Arc::clone(log));
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        Ok(wanted.iter().zip(found).map(|((tp, _), slot)| slot.unwrap_or_else(|| Arc::clone(&created[tp]))).collect())
    }

    /// Every log, in no particular order.
    pub fn logs(&self) -> Vec<(TopicPartition, Arc<Log>)> {
        read(&self.logs).iter().map(|(tp, l)| (tp.clone(), Arc::clone(l))).collect()
    }

    /// Removes a partition: closes its log, renames its directory to `<name>.<stamp>-delete`
    /// (durably) so a crash cannot resurrect it, then removes the files.
    pub fn delete(&self, tp: &TopicPartition) -> Result<bool> {
        let _creating = lock(&self.creating);
        let Some(log) = write(&self.logs).remove(tp) else {
            return Ok(false);
        };
        log.close()?;
        let stamp = self.options.clock.now_ms();
        let doomed = self.options.data_dir.join(format!("{}.{stamp}{DELETED_DIR_SUFFIX}", tp.dir_name()));
        std::fs::rename(log.dir(), &doomed).at(log.dir())?;
        fsync_dir(&self.options.data_dir)?;
        std::fs::remove_dir_all(&doomed).at(&doomed)?;
        Ok(true)
    }

    /// Writes the recovery-point, log-start and cleaner checkpoints for every log.
    pub fn checkpoint(&self) -> Result<()> {
        let mut recovery = OffsetMap::new();
        let mut starts = OffsetMap::new();
        let mut cleaned = OffsetMap::new();
        for (tp, log) in self.logs() {
            let key = (tp.topic.clone(), tp.partition);
            recovery.insert(key.clone(), log.recovery_point());
            starts.insert(key.clone(), log.log_start_offset());
            cleaned.insert(key, log.cleaner_checkpoint.load(Ordering::Acquire));
        }
        let dir = &self.options.data_dir;
        checkpoint::write_offsets(&dir.join(RECOVERY_POINT_CHECKPOINT), &recovery)?;
        checkpoint::write_offsets(&dir.join(LOG_START_CHECKPOINT), &starts)?;
        checkpoint::write_offsets(&dir.join(CLEANER_CHECKPOINT), &cleaned)?;
        Ok(())
    }

    /// One round of scheduled work; the scheduler thread calls this, tests may call it directly.
    pub fn run_maintenance(&self, retention: bool) -> Result<()> {
        // The logs without their names (a log names itself by its directory when it fails): this
        // runs every second, and a name copied per partition per second was most of an idle
        // node's cost here at 15,000 partitions.
        let logs: Vec<Arc<Log>> = read(&self.logs).values().cloned().collect();
        for log in logs {
            if let Err(e) = log.flush_if_due() {
                tracing::error!(partition = %log.dir().display(), error = %e, "flush failed");
            }
            if retention {
                if let Err(e) = log.apply_retention() {
                    tracing::error!(partition = %log.dir().display(), error = %e, "retention failed");
                }
                log.expire_producers(self.options.producer_id_expiration_ms);
            }
        }
        self.deletion_queue.remove_due(self.options.clock.now_ms());
        Ok(())
    }

    /// Files renamed to `.deleted` and not yet removed.
    pub fn pending_deletions(&self) -> usize {
        self.deletion_queue.len()
    }

    /// Starts the scheduler and cleaner threads.
    pub fn start_background(self: &Arc<Self>) -> Result<()> {
        let mut threads = lock(&self.threads);
        threads.push(self.spawn("weir-log-scheduler", LogManager::scheduler_loop)?);
        if self.options.cleaner_enabled {
            // Made before its thread starts (and under the `threads` lock that shutdown takes
            // first), so a shutdown racing the start still finds the cleaner to stop.
            let cleaner = Cleaner::new(CleanerConfig {
                io_bytes_per_second: NonZeroU64::new(self.options.cleaner_io_max_bytes_per_second),
                ..CleanerConfig::default()
            });
            *lock(&self.cleaner) = Some(Arc::new(cleaner));
            threads.push(self.spawn("weir-log-cleaner", LogManager::cleaner_loop)?);
        }
        Ok(())
    }

    /// The background cleaner once started, for metrics (its uncleanable logs, its throttle).
    pub fn cleaner(&self) -> Option<Arc<Cleaner>> {
        lock(&self.cleaner).clone()
    }

    fn spawn(self: &Arc<Self>, name: &str, body: fn(&LogManager)) -> Result<JoinHandle<()>> {
        let manager = Arc::clone(self);
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || body(&manager))
            .map_err(|e| StorageError::io(&self.options.data_dir, e))
    }

    fn scheduler_loop(&self) {
        let tick_ms = self.options.flush_check_interval_ms.clamp(10, 1000);
        let clock = &self.options.clock;
        let mut last_retention = clock.now_ms();
        let mut last_checkpoint = clock.now_ms();
        while !self.shutdown.sleep(tick_ms) {
            let now = clock.now_ms();
            let retention = now - last_retention >= self.options.retention_check_interval_ms as i64;
            if retention {
                last_retention = now;
            }
            if let Err(e) = self.run_maintenance(retention) {
                tracing::error!(error = %e, "log maintenance failed");
            }
            if now - last_checkpoint >= self.options.checkpoint_interval_ms as i64 {
                last_checkpoint = now;
                if let Err(e) = self.checkpoint() {
                    tracing::error!(error = %e, "writing checkpoints failed");
                }
            }
        }
    }

    fn cleaner_loop(&self) {
        let Some(cleaner) = self.cleaner() else { return };
        loop {
            let logs: Vec<Arc<Log>> = self.logs().into_iter().map(|(_, l)| l).collect();
            let did_work = match cleaner.run_once(&logs) {
                Ok(outcome) => outcome.is_some(),
                // A pass that shutdown interrupted did not fail.
                Err(_) if self.shutdown.requested() => return,
                Err(e) => {
                    tracing::error!(error = %e, "log cleaner pass failed");
                    false
                }
            };
            let pause = if did_work { 0 } else { self.options.cleaner_backoff_ms };
            if self.shutdown.sleep(pause) {
                return;
            }
        }
    }

    /// Stops background work, flushes and closes every log, writes the checkpoints and, last,
    /// the clean-shutdown marker. Safe to call more than once.
    pub fn shutdown(&self) -> Result<()> {
        let mut closed = lock(&self.closed);
        if *closed {
            return Ok(());
        }
        *lock(&self.shutdown.stopping) = true;
        self.shutdown.wake.notify_all();
        // Taking the threads first waits out a `start_background` under way, whose cleaner must be
        // stopped too. Stopping it wakes a pass sleeping in its throttle: joining must not wait
        // for the I/O limit.
        let threads: Vec<JoinHandle<()>> = lock(&self.threads).drain(..).collect();
        if let Some(cleaner) = self.cleaner() {
            cleaner.stop();
        }
        for thread in threads {
            let _ = thread.join();
        }
        for (tp, log) in self.logs() {
            log.close().map_err(|e| {
                tracing::error!(partition = %tp, error = %e, "closing log failed");
                e
            })?;
        }
        self.checkpoint()?;
        checkpoint::write_atomically(&self.options.data_dir.join(CLEAN_SHUTDOWN_FILE), b"")?;
        *closed = true;
        Ok(())
    }
}

fn lock_directory(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let file = FsOpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).at(&path)?;
    // SAFETY: flock on a valid, owned descriptor; no memory is involved.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(StorageError::DirectoryLocked(dir.to_path_buf()));
    }
    Ok(file)
}

/// Opens the logs on `recovery_threads` threads (recovery after a crash is CPU- and I/O-bound per log).
/// This boot of the kernel, from Linux's `/proc/sys/kernel/random/boot_id`; `None` elsewhere.
fn current_boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let id = id.trim();
    (!id.is_empty()).then(|| id.to_string())
}

fn open_logs(
    options: &ManagerOptions,
    partitions: &[TopicPartition],
    (clean, page_cache_survived): (bool, bool),
    recovery_points: &OffsetMap,
    log_starts: &OffsetMap,
    deletion_queue: &Arc<DeletionQueue>,
) -> Result<Vec<(TopicPartition, Log)>> {
    let threads = options.recovery_threads.clamp(1, 16).min(partitions.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Mutex<Vec<Result<(TopicPartition, Log)>>> = Mutex::new(Vec::with_capacity(partitions.len()));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(tp) = partitions.get(i) else { return };
                let key = (tp.topic.clone(), tp.partition);
                let open_options = OpenOptions {
                    clean_shutdown: clean,
                    recovery_point: recovery_points.get(&key).copied(),
                    log_start_offset: log_starts.get(&key).copied(),
                    page_cache_survived,
                };
                let result = Log::open(
                    &options.data_dir.join(tp.dir_name()),
                    options.default_config.clone(),
                    Arc::clone(&options.clock),
                    open_options,
                    Arc::clone(deletion_queue),
                )
                .map(|log| (tp.clone(), log));
                lock(&results).push(result);
            });
        }
    });
    results.into_inner().unwrap_or_else(|p| p.into_inner()).into_iter().collect()
}
