//! `weir bench storage`: throughput of the partition log (`weir_storage::Log`) against plain file
//! writes in the same directory. What each figure means is in `weir bench storage --help`
//! (`cli::STORAGE_LONG_ABOUT`); in short:
//!
//! - append: batches of up to 16 KiB and up to 1 MiB of 1 KiB records (a batch never exceeds its
//!   nominal size, as a producer's `batch.size` caps it), `flush.policy` none and sync, 1, 8 and
//!   64 appender threads on one log. Sync threads call `append` then `sync_to(last_offset + 1)`.
//!   A none run is timed until one final `Log::flush`.
//! - read: a catch-up read of the 1-appender none log: `Log::read` then `pread` into one reused
//!   buffer (the user-space path from the page cache, not sendfile).
//! - reference: `write_all` in 1 MiB chunks (and in 16 KiB-batch-sized chunks) + one fdatasync;
//!   `write_all` of 16 KiB + fdatasync each.
//!
//! Shared VMs are noisy (fsync latency drifts, large buffered writes stall now and then), so: one
//! untimed write warms up first; the plain write runs several times and the ratios use its best
//! run; the sync runs of one batch size take turns in slices rather than running one after the
//! other.
//!
//! Nothing is encoded or copied while timing: batches are encoded once, and every thread appends
//! from its own pool of copies again and again. That is sound because `append` rewrites only
//! `baseOffset` and `partitionLeaderEpoch` in place, which the batch CRC does not cover.

use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use weir_storage::testing::{batch, BatchSpec};
use weir_storage::{Clock, DeletionQueue, FlushPolicy, Log, LogConfig, OpenOptions, SystemClock};

use crate::cli::StorageBenchArgs;

const RECORD_VALUE_BYTES: usize = 1024;
const APPENDERS: [usize; 3] = [1, 8, 64];
/// What a consumer fetches from one partition at a time (Kafka's `max.partition.fetch.bytes`).
const READ_MAX_BYTES: u64 = 1 << 20;
/// Chunk of the plain-write reference.
const PLAIN_CHUNK_BYTES: usize = 1 << 20;
/// Chunk of the fdatasync-per-write reference.
const PLAIN_SYNC_CHUNK_BYTES: usize = 16 << 10;
/// Prebuilt batches per appender thread: up to this many bytes, between 1 and 4 batches.
const POOL_BYTES: usize = 2 << 20;
/// Distinct prebuilt batches (different value bytes) per batch size.
const TEMPLATES: usize = 4;
const DEFAULT_BYTES: u64 = 1 << 30;
const QUICK_BYTES: u64 = 16 << 20;
const DEFAULT_SYNC_TIME: Duration = Duration::from_secs(3);
const QUICK_SYNC_TIME: Duration = Duration::from_millis(250);
const NONE_VS_PLAIN_TARGET: f64 = 0.8;
const SYNC_SCALING_TARGET: f64 = 20.0;
/// The sync runs of one batch size take turns in this many slices of `--sync-seconds / SYNC_ROUNDS`.
const SYNC_ROUNDS: u32 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    None,
    Sync,
}

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::Sync => "sync",
        }
    }

    fn flush(self) -> FlushPolicy {
        match self {
            Policy::None => FlushPolicy::None,
            Policy::Sync => FlushPolicy::Sync,
        }
    }
}

/// One batch size, with its prebuilt batches.
struct Shape {
    label: &'static str,
    key: &'static str,
    records: usize,
    batch_bytes: usize,
    templates: Vec<Vec<u8>>,
}

impl Shape {
    /// The largest batch of 1 KiB records that fits in `nominal` bytes and `max.message.bytes`.
    fn build(label: &'static str, key: &'static str, nominal: usize, max_message_bytes: usize) -> Shape {
        let limit = nominal.min(max_message_bytes);
        // Current timestamps: with old ones, `segment.ms` would roll the segment on every append.
        let timestamp = SystemClock.now_ms();
        let make = |records: usize, fill: u8| {
            batch(&BatchSpec { records, value_bytes: RECORD_VALUE_BYTES, timestamp, fill, ..Default::default() })
        };
        let mut records = (limit / (RECORD_VALUE_BYTES + 16)).max(1);
        while make(records + 1, b'a').len() <= limit {
            records += 1;
        }
        while records > 1 && make(records, b'a').len() > limit {
            records -= 1;
        }
        let templates: Vec<Vec<u8>> = (0..TEMPLATES).map(|i| make(records, b'a' + 16 * i as u8)).collect();
        let batch_bytes = templates[0].len();
        Shape { label, key, records, batch_bytes, templates }
    }

    /// The chunk size of the plain write that a flush=none run of this shape is compared with:
    /// the batch size itself for small batches (so both make as many write calls), else 1 MiB.
    fn reference_chunk(&self) -> usize {
        if self.batch_bytes < PLAIN_CHUNK_BYTES / 2 {
            self.batch_bytes
        } else {
            PLAIN_CHUNK_BYTES
        }
    }
}

struct Settings {
    bytes: u64,
    sync_time: Duration,
    quick: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    settings: SettingsReport,
    reference: Reference,
    append: Vec<AppendResult>,
    read: Vec<ReadResult>,
    ratios: Ratios,
}

#[derive(Debug, Serialize)]
struct SettingsReport {
    dir: PathBuf,
    bytes: u64,
    sync_time_limit_secs: f64,
    sync_rounds: u32,
    quick: bool,
    record_value_bytes: usize,
    read_max_bytes: u64,
    cpus: usize,
}

#[derive(Debug, Serialize)]
struct Reference {
    /// `write_all` in 1 MiB chunks, one fdatasync at the end: the best such run of `plain_write_runs`.
    plain_write: PlainResult,
    /// Each plain write (one fdatasync at the end): in 1 MiB chunks before the runs of each batch
    /// size and after the last; in 16 KiB-batch-sized chunks before the 16 KiB runs and at the end.
    plain_write_runs: Vec<PlainResult>,
    /// `write_all` of 16 KiB then fdatasync, repeated (time-limited, in turns with the 16 KiB
    /// sync runs).
    plain_write_fdatasync_each_16kib: PlainResult,
}

#[derive(Debug, Clone, Serialize)]
struct PlainResult {
    chunk_bytes: usize,
    bytes: u64,
    secs: f64,
    mb_per_s: f64,
    fsyncs: u64,
    fsync_secs: f64,
}

#[derive(Debug, Clone, Serialize)]
struct AppendResult {
    batch: &'static str,
    batch_bytes: usize,
    records_per_batch: usize,
    policy: &'static str,
    appenders: usize,
    bytes: u64,
    batches: u64,
    /// Appends plus, for none, the final flush.
    secs: f64,
    append_secs: f64,
    flush_secs: f64,
    mb_per_s: f64,
    batches_per_s: f64,
    /// `Log::stats.fsyncs`.
    fsyncs: u64,
    fsync_secs: f64,
    /// For none: `mb_per_s` over the best plain write in chunks of about the batch size (1 MiB
    /// for 1 MiB batches); for sync: over the 1-appender sync run of the same batch size.
    ratio: f64,
    /// What `ratio` compares with.
    ratio_to: String,
}

#[derive(Debug, Serialize)]
struct ReadResult {
    batch: &'static str,
    bytes: u64,
    reads: u64,
    secs: f64,
    mb_per_s: f64,
}

#[derive(Debug, Serialize)]
struct Ratios {
    /// flush=none, 1 MiB batches, 1 appender over the best plain write in 1 MiB chunks.
    none_vs_plain_write: f64,
    /// The lowest `ratio` of all flush=none runs (each over the plain write of its chunk size).
    none_vs_plain_write_min: f64,
    none_vs_plain_write_target: f64,
    sync_64_vs_1_appender_16kib: f64,
    sync_64_vs_1_appender_1mib: f64,
    sync_64_vs_1_appender_target: f64,
}

pub(crate) fn run(args: &StorageBenchArgs) -> Result<()> {
    let settings = Settings {
        bytes: args.bytes.unwrap_or(if args.quick { QUICK_BYTES } else { DEFAULT_BYTES }),
        sync_time: args.sync_seconds.unwrap_or(if args.quick { QUICK_SYNC_TIME } else { DEFAULT_SYNC_TIME }),
        quick: args.quick,
    };
    let workspace = Workspace::create(args.dir.as_deref())?;
    let report = run_all(&settings, workspace.path())?;
    workspace.remove()?;
    print!("{}", render(&report));
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).context("serialising the results")?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn run_all(settings: &Settings, dir: &Path) -> Result<Report> {
    let max_message_bytes = LogConfig::default().max_message_bytes as usize;
    let shapes = [
        Shape::build("16 KiB", "16kib", 16 << 10, max_message_bytes),
        Shape::build("1 MiB", "1mib", 1 << 20, max_message_bytes),
    ];
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!(
        "weir bench storage: {} per run in {} ({cpus} CPUs){}",
        fmt_bytes(settings.bytes),
        dir.display(),
        if settings.quick { ", quick" } else { "" }
    );
    warm_up(dir, settings)?;

    let mut plain_runs = Vec::new();
    let mut plain_sync = None;
    let mut append = Vec::new();
    let mut read = Vec::new();
    for shape in &shapes {
        plain_runs.push(plain_write(dir, settings, PLAIN_CHUNK_BYTES)?);
        if shape.reference_chunk() != PLAIN_CHUNK_BYTES {
            plain_runs.push(plain_write(dir, settings, shape.reference_chunk())?);
        }
        run_none_cases(dir, shape, settings, &mut append, &mut read)?;
        // The fdatasync reference runs once, with the first batch size small enough for it.
        let (sync, reference) = run_sync_cases(dir, shape, settings, plain_sync.is_none())?;
        append.extend(sync);
        plain_sync = plain_sync.or(reference);
    }
    plain_runs.push(plain_write(dir, settings, PLAIN_CHUNK_BYTES)?);
    for shape in shapes.iter().filter(|s| s.reference_chunk() != PLAIN_CHUNK_BYTES) {
        plain_runs.push(plain_write(dir, settings, shape.reference_chunk())?);
    }
    let Some(plain_sync) = plain_sync else { bail!("no batch size small enough for the fdatasync reference") };

    let ratios = set_ratios(&mut append, &shapes, &plain_runs);
    let plain_write = plain_runs
        .iter()
        .filter(|r| r.chunk_bytes == PLAIN_CHUNK_BYTES)
        .max_by(|a, b| a.mb_per_s.total_cmp(&b.mb_per_s))
        .cloned()
        .context("no plain write run")?;
    Ok(Report {
        settings: SettingsReport {
            dir: dir.to_path_buf(),
            bytes: settings.bytes,
            sync_time_limit_secs: settings.sync_time.as_secs_f64(),
            sync_rounds: SYNC_ROUNDS,
            quick: settings.quick,
            record_value_bytes: RECORD_VALUE_BYTES,
            read_max_bytes: READ_MAX_BYTES,
            cpus,
        },
        reference: Reference {
            plain_write,
            plain_write_runs: plain_runs,
            plain_write_fdatasync_each_16kib: plain_sync,
        },
        append,
        read,
        ratios,
    })
}

/// The first large write of a process (or a fresh VM) pays for memory and file-system state
/// that later runs find ready; it is done once untimed so that no measured run pays it alone.
fn warm_up(dir: &Path, settings: &Settings) -> Result<()> {
    eprintln!("  warm-up: writing and removing {} ...", fmt_bytes(settings.bytes));
    PlainWriter::create(&dir.join("warm-up"), PLAIN_CHUNK_BYTES, false)?.run(settings.bytes, None)?.finish()?;
    Ok(())
}

/// The flush=none runs of `shape`, one after the other (each until its byte budget, then one
/// timed flush), adding to `append`. The catch-up read is measured on the 1-appender log,
/// before it is removed, and added to `read`.
fn run_none_cases(
    dir: &Path,
    shape: &Shape,
    settings: &Settings,
    append: &mut Vec<AppendResult>,
    read: &mut Vec<ReadResult>,
) -> Result<()> {
    for appenders in APPENDERS {
        let mut case = AppendCase::open(dir, shape, Policy::None, appenders, settings)?;
        case.run(None)?;
        case.flush()?;
        let result = case.result();
        eprintln!(
            "  append {:>6} flush=none appenders={appenders:<2}: {:8.1} MB/s, {} fsyncs",
            shape.label, result.mb_per_s, result.fsyncs
        );
        if appenders == 1 {
            let r = run_read(&case.log, shape.label)?;
            eprintln!("  read   {:>6}: {:8.1} MB/s", shape.label, r.mb_per_s);
            read.push(r);
        }
        case.remove()?;
        append.push(result);
    }
    Ok(())
}

/// The flush=sync runs of `shape`, and (`with_reference`, for a batch size of at most 16 KiB)
/// the fdatasync-per-write reference. They take turns in SYNC_ROUNDS slices, so that a change
/// of the disk's fsync latency during the benchmark (large on shared VMs) affects all alike.
fn run_sync_cases(
    dir: &Path,
    shape: &Shape,
    settings: &Settings,
    with_reference: bool,
) -> Result<(Vec<AppendResult>, Option<PlainResult>)> {
    let mut cases = APPENDERS
        .iter()
        .map(|&appenders| AppendCase::open(dir, shape, Policy::Sync, appenders, settings))
        .collect::<Result<Vec<_>>>()?;
    let mut reference = if shape.batch_bytes <= PLAIN_SYNC_CHUNK_BYTES && with_reference {
        Some(PlainWriter::create(&dir.join("plain-write-fdatasync"), PLAIN_SYNC_CHUNK_BYTES, true)?)
    } else {
        None
    };
    let slice = settings.sync_time / SYNC_ROUNDS;
    for _ in 0..SYNC_ROUNDS {
        if let Some(writer) = reference.take() {
            reference = Some(writer.run(settings.bytes, Some(slice))?);
        }
        for case in &mut cases {
            case.run(Some(slice))?;
        }
    }
    let reference = match reference {
        Some(writer) => {
            let result = writer.finish()?;
            eprintln!(
                "  reference: write_all 16 KiB + fdatasync each: {:8.1} MB/s, {} fdatasyncs",
                result.mb_per_s, result.fsyncs
            );
            Some(result)
        }
        None => None,
    };
    let mut results = Vec::new();
    for case in cases {
        let result = case.result();
        eprintln!(
            "  append {:>6} flush=sync appenders={:<2}: {:8.1} MB/s, {} fsyncs",
            shape.label, result.appenders, result.mb_per_s, result.fsyncs
        );
        case.remove()?;
        results.push(result);
    }
    Ok((results, reference))
}

/// Sets the `ratio` of every append run and returns the headline ratios. A none run's reference
/// is the best plain run of its chunk size: the log is compared with the fastest the file system
/// managed, not with an unlucky run.
fn set_ratios(append: &mut [AppendResult], shapes: &[Shape], plain_runs: &[PlainResult]) -> Ratios {
    let best_plain = |chunk: usize| {
        plain_runs.iter().filter(|r| r.chunk_bytes == chunk).map(|r| r.mb_per_s).fold(f64::NAN, f64::max)
    };
    let sync_one: Vec<f64> = append.iter().map(|r| mb_per_s(append, r.batch, "sync", 1)).collect();
    for (r, one) in append.iter_mut().zip(sync_one) {
        if r.policy == "none" {
            let chunk = shapes.iter().find(|s| s.label == r.batch).map_or(PLAIN_CHUNK_BYTES, Shape::reference_chunk);
            r.ratio = r.mb_per_s / best_plain(chunk);
            r.ratio_to = format!("plain write, {chunk} B chunks");
        } else {
            r.ratio = r.mb_per_s / one;
            r.ratio_to = "1 appender".into();
        }
    }
    let find = |batch: &str, policy: &str, appenders: usize| mb_per_s(append, batch, policy, appenders);
    Ratios {
        none_vs_plain_write: find("1 MiB", "none", 1) / best_plain(PLAIN_CHUNK_BYTES),
        none_vs_plain_write_min: append
            .iter()
            .filter(|r| r.policy == "none")
            .map(|r| r.ratio)
            .fold(f64::INFINITY, f64::min),
        none_vs_plain_write_target: NONE_VS_PLAIN_TARGET,
        sync_64_vs_1_appender_16kib: find("16 KiB", "sync", 64) / find("16 KiB", "sync", 1),
        sync_64_vs_1_appender_1mib: find("1 MiB", "sync", 64) / find("1 MiB", "sync", 1),
        sync_64_vs_1_appender_target: SYNC_SCALING_TARGET,
    }
}

fn mb_per_s(results: &[AppendResult], batch: &str, policy: &str, appenders: usize) -> f64 {
    results
        .iter()
        .find(|r| r.batch == batch && r.policy == policy && r.appenders == appenders)
        .map_or(f64::NAN, |r| r.mb_per_s)
}

/// The plain-write reference in `chunk`s: `settings.bytes` with one fdatasync at the end.
fn plain_write(dir: &Path, settings: &Settings, chunk: usize) -> Result<PlainResult> {
    let result = PlainWriter::create(&dir.join("plain-write"), chunk, false)?.run(settings.bytes, None)?.finish()?;
    eprintln!("  reference: write_all {chunk} B chunks + fdatasync at the end: {:8.1} MB/s", result.mb_per_s);
    Ok(result)
}

/// One append configuration: a log of its own in `dir`, and the appenders' prebuilt batches.
struct AppendCase<'s> {
    shape: &'s Shape,
    policy: Policy,
    appenders: usize,
    dir: PathBuf,
    log: Log,
    /// One pool of prebuilt batches per appender thread, appended again and again.
    pools: Vec<Vec<Vec<u8>>>,
    /// The byte budget (`--bytes`) in batches.
    total_batches: u64,
    append_time: Duration,
    flush_time: Duration,
}

impl<'s> AppendCase<'s> {
    fn open(root: &Path, shape: &'s Shape, policy: Policy, appenders: usize, settings: &Settings) -> Result<Self> {
        let dir = root.join(format!("{}-{}-{appenders}", shape.key, policy.name()));
        let config = LogConfig { flush: policy.flush(), ..LogConfig::default() };
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let log = Log::open(&dir, config, clock, OpenOptions::default(), Arc::new(DeletionQueue::new()))
            .with_context(|| format!("opening a log in {}", dir.display()))?;
        let total_batches = settings.bytes.div_ceil(shape.batch_bytes as u64);
        let per_thread = total_batches.div_ceil(appenders as u64).max(1) as usize;
        let pool_len = (POOL_BYTES / shape.batch_bytes).clamp(1, 4).min(per_thread);
        let pools = (0..appenders)
            .map(|t| (0..pool_len).map(|i| shape.templates[(t + i) % shape.templates.len()].clone()).collect())
            .collect();
        Ok(AppendCase {
            shape,
            policy,
            appenders,
            dir,
            log,
            pools,
            total_batches,
            append_time: Duration::ZERO,
            flush_time: Duration::ZERO,
        })
    }

    /// Appends with all threads until the byte budget is spent or `time_limit` has passed.
    fn run(&mut self, time_limit: Option<Duration>) -> Result<()> {
        let done = self.log.stats.appended_batches.load(Ordering::Relaxed);
        let budget = self.total_batches.saturating_sub(done);
        if budget == 0 {
            return Ok(());
        }
        let claimed = AtomicU64::new(0);
        let barrier = Barrier::new(self.appenders + 1);
        let sync = self.policy == Policy::Sync;
        let log = &self.log;
        let (elapsed, outcomes) = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .pools
                .iter_mut()
                .map(|pool| {
                    let (claimed, barrier) = (&claimed, &barrier);
                    scope.spawn(move || appender(log, pool, claimed, budget, barrier, time_limit, sync))
                })
                .collect();
            barrier.wait();
            let started = Instant::now();
            let outcomes: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
            (started.elapsed(), outcomes)
        });
        for outcome in outcomes {
            match outcome {
                Ok(result) => result?,
                Err(_) => bail!("an appender thread panicked"),
            }
        }
        self.append_time += elapsed;
        Ok(())
    }

    /// One `Log::flush`, timed: ends a none run with its data on disk, as the reference ends.
    fn flush(&mut self) -> Result<()> {
        let started = Instant::now();
        self.log.flush().context("flushing the log")?;
        self.flush_time += started.elapsed();
        Ok(())
    }

    fn result(&self) -> AppendResult {
        let bytes = self.log.stats.appended_bytes.load(Ordering::Relaxed);
        let batches = self.log.stats.appended_batches.load(Ordering::Relaxed);
        let secs = (self.append_time + self.flush_time).as_secs_f64();
        AppendResult {
            batch: self.shape.label,
            batch_bytes: self.shape.batch_bytes,
            records_per_batch: self.shape.records,
            policy: self.policy.name(),
            appenders: self.appenders,
            bytes,
            batches,
            secs,
            append_secs: self.append_time.as_secs_f64(),
            flush_secs: self.flush_time.as_secs_f64(),
            mb_per_s: bytes as f64 / secs / 1e6,
            batches_per_s: batches as f64 / secs,
            fsyncs: self.log.stats.fsyncs.load(Ordering::Relaxed),
            fsync_secs: self.log.stats.fsync_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            ratio: 0.0,
            ratio_to: String::new(),
        }
    }

    /// Closes the log and removes its files.
    fn remove(self) -> Result<()> {
        drop(self.log);
        std::fs::remove_dir_all(&self.dir).with_context(|| format!("removing {}", self.dir.display()))
    }
}

/// One appender thread: claims batches from the shared budget until it is spent or the deadline
/// passes; with `sync`, waits for each batch to be durable before the next, as a producer whose
/// batch is acknowledged only when on disk.
fn appender(
    log: &Log,
    pool: &mut [Vec<u8>],
    claimed: &AtomicU64,
    total_batches: u64,
    barrier: &Barrier,
    time_limit: Option<Duration>,
    sync: bool,
) -> Result<()> {
    barrier.wait();
    let deadline = time_limit.map(|limit| Instant::now() + limit);
    let pool_len = pool.len();
    let mut next = 0;
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) || claimed.fetch_add(1, Ordering::Relaxed) >= total_batches {
            return Ok(());
        }
        let records = &mut pool[next];
        next = (next + 1) % pool_len;
        let info = log.append(records, 0).context("append")?;
        if sync {
            log.sync_to(info.last_offset + 1).context("sync_to")?;
        }
    }
}

/// A consumer catching up from the start: `Log::read` of up to 1 MiB, then `pread` of the slice
/// into one reused buffer.
fn run_read(log: &Log, label: &'static str) -> Result<ReadResult> {
    let end = log.high_watermark();
    let expected = log.stats.appended_bytes.load(Ordering::Relaxed);
    let mut buf = vec![0u8; READ_MAX_BYTES as usize];
    let mut next = log.log_start_offset();
    let mut bytes = 0u64;
    let mut reads = 0u64;
    let started = Instant::now();
    while next < end {
        let result = log.read(next, READ_MAX_BYTES, end).context("read")?;
        let Some(slice) = result.slice else { break };
        let len = slice.len as usize;
        if buf.len() < len {
            buf.resize(len, 0);
        }
        slice.file.read_exact_at(&mut buf[..len], slice.position).with_context(|| slice.path.display().to_string())?;
        bytes += slice.len;
        reads += 1;
        next = slice.next_offset;
    }
    let secs = started.elapsed().as_secs_f64();
    if bytes != expected {
        bail!("the catch-up read returned {bytes} bytes, but {expected} were appended");
    }
    Ok(ReadResult { batch: label, bytes, reads, secs, mb_per_s: bytes as f64 / secs / 1e6 })
}

/// The reference: whole `chunk`s written with `write_all` to a new file, with fdatasync after
/// every chunk (`sync_each`) or once at the end (in `finish`).
struct PlainWriter {
    path: PathBuf,
    file: File,
    data: Vec<u8>,
    sync_each: bool,
    written: u64,
    fsyncs: u64,
    fsync_time: Duration,
    elapsed: Duration,
}

impl PlainWriter {
    fn create(path: &Path, chunk: usize, sync_each: bool) -> Result<PlainWriter> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .with_context(|| path.display().to_string())?;
        Ok(PlainWriter {
            path: path.to_path_buf(),
            file,
            data: (0..chunk).map(|i| (i % 251) as u8).collect(),
            sync_each,
            written: 0,
            fsyncs: 0,
            fsync_time: Duration::ZERO,
            elapsed: Duration::ZERO,
        })
    }

    /// Writes until `total` bytes are in the file or `time_limit` has passed.
    fn run(mut self, total: u64, time_limit: Option<Duration>) -> Result<PlainWriter> {
        let started = Instant::now();
        let deadline = time_limit.map(|limit| started + limit);
        while self.written < total && deadline.is_none_or(|d| Instant::now() < d) {
            self.file.write_all(&self.data).with_context(|| self.path.display().to_string())?;
            self.written += self.data.len() as u64;
            if self.sync_each {
                self.fdatasync()?;
            }
        }
        self.elapsed += started.elapsed();
        Ok(self)
    }

    fn fdatasync(&mut self) -> Result<()> {
        let started = Instant::now();
        self.file.sync_data().with_context(|| format!("fdatasync {}", self.path.display()))?;
        self.fsync_time += started.elapsed();
        self.fsyncs += 1;
        Ok(())
    }

    /// The final fdatasync (timed) unless every chunk had one; removes the file.
    fn finish(mut self) -> Result<PlainResult> {
        if !self.sync_each {
            let started = Instant::now();
            self.fdatasync()?;
            self.elapsed += started.elapsed();
        }
        let secs = self.elapsed.as_secs_f64();
        std::fs::remove_file(&self.path).with_context(|| format!("removing {}", self.path.display()))?;
        Ok(PlainResult {
            chunk_bytes: self.data.len(),
            bytes: self.written,
            secs,
            mb_per_s: self.written as f64 / secs / 1e6,
            fsyncs: self.fsyncs,
            fsync_secs: self.fsync_time.as_secs_f64(),
        })
    }
}

/// The report as text whose tables are Markdown, so they can be pasted into a document as is.
fn render(report: &Report) -> String {
    let mut out = String::new();
    render_settings(&mut out, &report.settings);
    render_reference(&mut out, &report.reference);
    render_append(&mut out, &report.append, report.settings.sync_rounds);
    render_read(&mut out, &report.read, report.settings.read_max_bytes);
    render_ratios(&mut out, &report.ratios);
    out
}

/// What the figures below depend on: the run's sizes and machine, and the units they are in.
fn render_settings(out: &mut String, s: &SettingsReport) {
    let _ = writeln!(
        out,
        "weir bench storage: 1 KiB record values, {} per run (sync runs: at most {} s), {} CPUs, dir {}",
        fmt_bytes(s.bytes),
        s.sync_time_limit_secs,
        s.cpus,
        s.dir.display()
    );
    let _ = writeln!(out, "MB = 10^6 bytes; fsyncs = fdatasync calls (Log::stats.fsyncs for the log).");
    let _ = writeln!(out);
}

/// The plain-file runs, in run order: the ratios use the best of a chunk size, and the order
/// shows whether the disk drifted while the log was measured between them.
fn render_reference(out: &mut String, reference: &Reference) {
    let _ = writeln!(
        out,
        "Reference: a plain file in the same directory, in run order (1 MiB chunks before each batch size's runs and \
         at the end, 16 KiB-batch-sized chunks before the 16 KiB runs and at the end; ratios use the best run of a \
         chunk size)"
    );
    let _ = writeln!(out);
    let mut rows = vec![row(&["write", "bytes", "time", "MB/s", "fsyncs", "avg fsync"])];
    let runs =
        reference.plain_write_runs.iter().enumerate().map(|(i, r)| {
            (format!("{}. write_all {} chunks, 1 fdatasync at the end", i + 1, fmt_chunk(r.chunk_bytes)), r)
        });
    let sync_each =
        ("write_all 16 KiB chunks, fdatasync after each".to_string(), &reference.plain_write_fdatasync_each_16kib);
    for (name, r) in runs.chain(std::iter::once(sync_each)) {
        rows.push(vec![
            name,
            fmt_bytes(r.bytes),
            format!("{:.2} s", r.secs),
            format!("{:.1}", r.mb_per_s),
            r.fsyncs.to_string(),
            fmt_secs(r.fsync_secs / r.fsyncs.max(1) as f64),
        ]);
    }
    table(out, &rows, 1);
    let _ = writeln!(out);
}

/// Every append run; the ratio column says what each is compared with, which differs between
/// flush=none (a plain write) and flush=sync (the 1-appender run).
fn render_append(out: &mut String, append: &[AppendResult], sync_rounds: u32) {
    let _ = writeln!(
        out,
        "Append: none = appends, then one Log::flush (timed); sync = append + sync_to(last_offset + 1) per batch, \
         the runs of one batch size taking turns in {sync_rounds} slices"
    );
    let _ = writeln!(out);
    let mut rows = vec![row(&[
        "batch",
        "records",
        "flush",
        "appenders",
        "MB/s",
        "batches/s",
        "fsyncs",
        "batches/fsync",
        "avg fsync",
        "time",
        "ratio",
    ])];
    for r in append {
        let ratio = match (r.policy, r.appenders) {
            ("none", _) => format!(
                "{:.2}x plain {}",
                r.ratio,
                if r.batch_bytes < PLAIN_CHUNK_BYTES / 2 { "same-size chunks" } else { "1 MiB chunks" }
            ),
            (_, 1) => "-".into(),
            _ => format!("{:.1}x 1 appender", r.ratio),
        };
        let per_fsync =
            if r.policy == "sync" { format!("{:.1}", r.batches as f64 / r.fsyncs.max(1) as f64) } else { "-".into() };
        rows.push(vec![
            format!("{} ({} B)", r.batch, r.batch_bytes),
            r.records_per_batch.to_string(),
            r.policy.to_string(),
            r.appenders.to_string(),
            format!("{:.1}", r.mb_per_s),
            format!("{:.0}", r.batches_per_s),
            r.fsyncs.to_string(),
            per_fsync,
            fmt_secs(r.fsync_secs / r.fsyncs.max(1) as f64),
            format!("{:.2} s", r.secs),
            ratio,
        ]);
    }
    table(out, &rows, 1);
    let _ = writeln!(out);
}

/// The catch-up reads; the heading says which path they take, as it is not the broker's.
fn render_read(out: &mut String, read: &[ReadResult], read_max_bytes: u64) {
    let _ = writeln!(
        out,
        "Read: catch-up from the start of a flush=none log, Log::read of up to {} + pread into one reused buffer \
         (the user-space path from the page cache, not the broker's sendfile path)",
        fmt_bytes(read_max_bytes)
    );
    let _ = writeln!(out);
    let mut rows = vec![row(&["batch", "bytes", "reads", "time", "MB/s"])];
    for r in read {
        rows.push(vec![
            r.batch.to_string(),
            fmt_bytes(r.bytes),
            r.reads.to_string(),
            format!("{:.2} s", r.secs),
            format!("{:.1}", r.mb_per_s),
        ]);
    }
    table(out, &rows, 1);
    let _ = writeln!(out);
}

/// The ratios with their targets, each marked met or MISSED.
fn render_ratios(out: &mut String, r: &Ratios) {
    let verdict = |value: f64, target: f64| if value >= target { "met" } else { "MISSED" };
    let _ = writeln!(out, "Ratios");
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "- flush=none append vs plain write (1 MiB batches, 1 appender): {:.2}x (target >= {}x: {}); \
         lowest of all flush=none runs: {:.2}x",
        r.none_vs_plain_write,
        r.none_vs_plain_write_target,
        verdict(r.none_vs_plain_write, r.none_vs_plain_write_target),
        r.none_vs_plain_write_min
    );
    for (label, value) in [("16 KiB", r.sync_64_vs_1_appender_16kib), ("1 MiB", r.sync_64_vs_1_appender_1mib)] {
        let _ = writeln!(
            out,
            "- flush=sync 64 vs 1 appender ({label} batches): {value:.1}x (target >= {}x: {})",
            r.sync_64_vs_1_appender_target,
            verdict(value, r.sync_64_vs_1_appender_target)
        );
    }
}

fn row(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

/// Writes `rows` (the first is the header) as a Markdown table with aligned columns; columns
/// from `first_numeric` on are right-aligned.
fn table(out: &mut String, rows: &[Vec<String>], first_numeric: usize) {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|cell| cell.chars().count()).max().unwrap_or(0).max(3))
        .collect();
    let line = |out: &mut String, cells: &[String]| {
        out.push('|');
        for (c, width) in widths.iter().enumerate() {
            let cell = cells.get(c).map_or("", String::as_str);
            if c >= first_numeric {
                let _ = write!(out, " {cell:>width$} |");
            } else {
                let _ = write!(out, " {cell:<width$} |");
            }
        }
        out.push('\n');
    };
    if let Some((header, body)) = rows.split_first() {
        line(out, header);
        out.push('|');
        for (c, width) in widths.iter().enumerate() {
            let dashes = "-".repeat(width.saturating_sub(1));
            if c >= first_numeric {
                let _ = write!(out, " {dashes}: |");
            } else {
                let _ = write!(out, " {dashes}- |");
            }
        }
        out.push('\n');
        for cells in body {
            line(out, cells);
        }
    }
}

fn fmt_bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (size, unit) in UNITS {
        if bytes >= size {
            return format!("{:.2} {unit}", bytes as f64 / size as f64);
        }
    }
    format!("{bytes} B")
}

/// A chunk size: "1 MiB" when it is a whole number of KiB or MiB, else bytes.
fn fmt_chunk(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn fmt_secs(secs: f64) -> String {
    if secs >= 1.0 {
        format!("{secs:.2} s")
    } else if secs >= 1e-3 {
        format!("{:.2} ms", secs * 1e3)
    } else {
        format!("{:.0} µs", secs * 1e6)
    }
}

/// The benchmark's scratch directory: a fresh subdirectory of the chosen parent, removed at the
/// end (also when the run fails), with the parent when the benchmark created it.
struct Workspace {
    dir: Option<tempfile::TempDir>,
    created_parent: Option<PathBuf>,
}

impl Workspace {
    fn create(parent: Option<&Path>) -> Result<Workspace> {
        let (parent, created_parent) = match parent {
            Some(parent) => {
                let created = ensure_dir(parent).with_context(|| format!("creating {}", parent.display()))?;
                (parent.to_path_buf(), created)
            }
            None => {
                let default = std::env::current_dir().context("current directory")?.join("bench-data");
                match ensure_dir(&default) {
                    Ok(created) => (default, created),
                    Err(e) => {
                        tracing::warn!(dir = %default.display(), error = %e, "cannot create; using the system temp dir");
                        (std::env::temp_dir(), false)
                    }
                }
            }
        };
        let dir = tempfile::Builder::new()
            .prefix("weir-bench-storage-")
            .tempdir_in(&parent)
            .with_context(|| format!("creating a scratch directory in {}", parent.display()))?;
        Ok(Workspace { dir: Some(dir), created_parent: created_parent.then_some(parent) })
    }

    fn path(&self) -> &Path {
        self.dir.as_ref().map_or(Path::new("."), |d| d.path())
    }

    fn remove(mut self) -> Result<()> {
        if let Some(dir) = self.dir.take() {
            let path = dir.path().to_path_buf();
            dir.close().with_context(|| format!("removing {}", path.display()))?;
        }
        if let Some(parent) = self.created_parent.take() {
            // Only if empty: something else may have been put there meanwhile.
            let _ = std::fs::remove_dir(parent);
        }
        Ok(())
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        drop(self.dir.take());
        if let Some(parent) = self.created_parent.take() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// Creates `dir` if missing; true if it did.
fn ensure_dir(dir: &Path) -> std::io::Result<bool> {
    if dir.is_dir() {
        return Ok(false);
    }
    std::fs::create_dir_all(dir)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_fit_their_nominal_size_and_max_message_bytes() {
        let max = LogConfig::default().max_message_bytes as usize;
        for nominal in [16 << 10, 1 << 20] {
            let shape = Shape::build("x", "x", nominal, max);
            assert!(shape.batch_bytes <= nominal.min(max), "{} > {nominal}", shape.batch_bytes);
            assert!(shape.batch_bytes > nominal.min(max) - RECORD_VALUE_BYTES - 64, "{} too small", shape.batch_bytes);
            assert!(shape.templates.iter().all(|t| t.len() == shape.batch_bytes));
        }
    }

    #[test]
    fn a_reused_buffer_appends_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shape = Shape::build("x", "x", 16 << 10, 1 << 20);
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let log =
            Log::open(dir.path(), LogConfig::default(), clock, OpenOptions::default(), Arc::new(DeletionQueue::new()))
                .expect("open");
        let mut buf = shape.templates[0].clone();
        let first = log.append(&mut buf, 0).expect("first append");
        let second = log.append(&mut buf, 0).expect("append of the same, rewritten buffer");
        assert_eq!(second.first_offset, first.last_offset + 1);
        assert_eq!(log.segment_count(), 1, "current timestamps must not roll segments");
    }
}
