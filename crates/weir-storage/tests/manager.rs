//! The data directory as a whole: clean and unclean restarts, checkpoints, many partitions.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use weir_storage::testing::{batch, BatchSpec};
use weir_storage::{Clock, Log, LogManager, ManagerOptions, ManualClock, OpenOptions, StorageError, TopicPartition};

fn options(dir: &std::path::Path, clock: &Arc<ManualClock>) -> ManagerOptions {
    let mut options = ManagerOptions::new(dir);
    options.clock = Arc::clone(clock) as Arc<dyn Clock>;
    options
}

/// Bytes this process has read through read(2)/pread(2) so far (page-cache hits included).
fn bytes_read_by_process() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").expect("/proc/self/io");
    io.lines().find_map(|l| l.strip_prefix("rchar: ")).and_then(|v| v.trim().parse().ok()).expect("rchar")
}

#[test]
fn given_clean_shutdown_when_reopened_should_scan_nothing_and_keep_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let cfg = config(&[("segment.bytes", "4096")]);
    {
        let manager = LogManager::open(options(dir.path(), &clock)).expect("open");
        for p in 0..3 {
            let log = manager.get_or_create(&TopicPartition::new("orders-eu", p), cfg.clone()).expect("create");
            for i in 0..20u8 {
                log.append(&mut records(2, 300, T0, i), 0).expect("append");
            }
        }
        manager.shutdown().expect("shutdown");
    }
    let manager = LogManager::open(options(dir.path(), &clock)).expect("reopen");
    assert!(manager.recovered_from_clean_shutdown());
    assert_eq!(manager.logs().len(), 3);
    for (tp, log) in manager.logs() {
        assert_eq!(tp.topic, "orders-eu");
        assert_eq!(log.log_end_offset(), 40);
        assert_eq!(log.stats.segments_recovered.load(Ordering::Relaxed), 0);
        assert_eq!(read_all(&log, 0).len(), 20);
    }
    // The marker is consumed at start-up: a crash from now on is unclean.
    assert!(!dir.path().join(".weir_clean_shutdown").exists());
}

#[test]
fn given_crash_after_checkpoint_when_reopened_should_recover_only_from_recovery_point() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let cfg = config(&[("segment.bytes", "4096"), ("flush.policy", "sync")]);
    let tp = TopicPartition::new("payments", 0);
    let segments = {
        let manager = LogManager::open(options(dir.path(), &clock)).expect("open");
        let log = manager.get_or_create(&tp, cfg.clone()).expect("create");
        for i in 0..40u8 {
            let info = log.append(&mut records(2, 300, T0, i), 0).expect("append");
            log.sync_to(info.last_offset + 1).expect("sync");
        }
        manager.checkpoint().expect("checkpoint");
        // Appended after the checkpoint: recovery must still find these.
        for i in 0..3u8 {
            log.append(&mut records(1, 10, T0, i), 0).expect("append");
        }
        log.segment_count()
        // dropped without shutdown: a crash
    };
    assert!(segments > 5);
    let manager = LogManager::open(options(dir.path(), &clock)).expect("reopen");
    assert!(!manager.recovered_from_clean_shutdown());
    let log = manager.get(&tp).expect("log");
    assert_eq!(log.log_end_offset(), 83);
    assert_eq!(log.stats.segments_recovered.load(Ordering::Relaxed), 1, "only the segment holding the recovery point");
}

#[test]
fn given_crash_when_recovered_should_not_move_the_recovery_point_past_unsynced_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let tp = TopicPartition::new("clicks", 0);
    {
        let manager = LogManager::open(options(dir.path(), &clock)).expect("open");
        let log = manager.get_or_create(&tp, config(&[("segment.bytes", "4096")])).expect("create");
        for i in 0..20u8 {
            log.append(&mut records(2, 300, T0, i), 0).expect("append");
        }
        manager.checkpoint().expect("checkpoint");
        // dropped without shutdown: a crash, with nothing fsynced by the log
    }
    for round in 0..2 {
        let manager = LogManager::open(options(dir.path(), &clock)).expect("reopen");
        assert!(!manager.recovered_from_clean_shutdown());
        let log = manager.get(&tp).expect("log");
        assert_eq!(log.log_end_offset(), 40 + round, "round {round}");
        // Recovery validated the data but did not fsync it: the recovery point stays where
        // the checkpoint put it, so the next crash rescans the same segments.
        assert!(log.recovery_point() < log.log_end_offset(), "round {round}: {}", log.recovery_point());
        assert!(log.stats.segments_recovered.load(Ordering::Relaxed) > 1, "round {round}");
        log.append(&mut records(1, 10, T0, 99), 0).expect("append");
        // a crash again
    }
    // A flush after recovery makes everything durable and moves the recovery point.
    let manager = LogManager::open(options(dir.path(), &clock)).expect("reopen");
    let log = manager.get(&tp).expect("log");
    log.flush().expect("flush");
    assert_eq!(log.recovery_point(), log.log_end_offset());
    assert_eq!(read_all(&log, 0).len(), 20 + 2, "batches");
}

/// Ten 2-record batches in `clicks-0`, then a crash (the manager dropped without shutdown).
/// Returns the path of the segment and the size of one batch.
fn crashed_log_of_ten_batches(dir: &std::path::Path, clock: &Arc<ManualClock>) -> (std::path::PathBuf, usize) {
    let manager = LogManager::open(options(dir, clock)).expect("open");
    let log = manager.get_or_create(&TopicPartition::new("clicks", 0), config(&[])).expect("create");
    for i in 0..10u8 {
        log.append(&mut records(2, 300, T0, i), 0).expect("append");
    }
    (dir.join("clicks-0").join("00000000000000000000.log"), records(2, 300, T0, 0).len())
}

#[test]
fn given_process_crash_with_a_write_cut_short_when_reopened_should_cut_only_that_tail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let (segment, batch_bytes) = crashed_log_of_ten_batches(dir.path(), &clock);
    // The kill landed inside the write of an eleventh batch: only its first 100 bytes made it.
    let mut file = std::fs::OpenOptions::new().append(true).open(&segment).expect("segment");
    std::io::Write::write_all(&mut file, &records(2, 300, T0, 10)[..100]).expect("append");
    drop(file);

    let manager = LogManager::open(options(dir.path(), &clock)).expect("reopen");
    let log = manager.get(&TopicPartition::new("clicks", 0)).expect("log");
    assert_eq!(log.log_end_offset(), 20);
    assert_eq!(log.stats.recovered_truncated_bytes.load(Ordering::Relaxed), 100);
    assert_eq!(std::fs::metadata(&segment).expect("segment").len(), 10 * batch_bytes as u64);
    assert_eq!(read_all(&log, 0).len(), 10);
    log.verify().expect("every batch valid");
    // Appends continue after the cut.
    assert_eq!(log.append(&mut records(1, 10, T0, 11), 0).expect("append").first_offset, 20);
}

#[test]
fn given_process_crash_when_reopened_should_leave_checksums_to_the_first_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let (segment, batch_bytes) = crashed_log_of_ten_batches(dir.path(), &clock);
    // Damage inside the fourth batch's records, which a process crash cannot cause.
    let mut bytes = std::fs::read(&segment).expect("segment");
    bytes[3 * batch_bytes + batch_bytes / 2] ^= 0xff;
    std::fs::write(&segment, &bytes).expect("write");

    // Same boot: the tail-only recovery does not read the CRCs, so the log opens whole...
    {
        let manager = LogManager::open(options(dir.path(), &clock)).expect("reopen");
        let log = manager.get(&TopicPartition::new("clicks", 0)).expect("log");
        assert_eq!(log.log_end_offset(), 20);
        // ...and the damage is found before it is served, not sent to a consumer: a read stops
        // before the damaged batch, and a read of it fails.
        let first = log.read(0, 1 << 20, i64::MAX).expect("read").slice.expect("the first batches");
        assert_eq!(first.next_offset, 6);
        match log.read(6, 1 << 20, i64::MAX) {
            Err(StorageError::CorruptSegment { .. }) => {}
            other => panic!("expected CorruptSegment, got {other:?}"),
        }
        // crash again
    }

    // Another boot id (a machine crash): recovery checksums the segment and cuts at the damage.
    std::fs::write(dir.path().join(".weir_boot_id"), "another-boot").expect("boot id");
    let manager = LogManager::open(options(dir.path(), &clock)).expect("reopen");
    let log = manager.get(&TopicPartition::new("clicks", 0)).expect("log");
    assert_eq!(log.log_end_offset(), 6);
    assert_eq!(read_all(&log, 0).len(), 3);
}

#[test]
fn given_directory_in_use_when_opened_twice_should_refuse() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let _first = LogManager::open(options(dir.path(), &clock)).expect("open");
    match LogManager::open(options(dir.path(), &clock)) {
        Err(StorageError::DirectoryLocked(_)) => {}
        Err(other) => panic!("expected DirectoryLocked, got {other}"),
        Ok(_) => panic!("a second manager opened a locked directory"),
    }
}

#[test]
fn given_deleted_partition_when_reopened_should_stay_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let tp = TopicPartition::new("temp", 0);
    {
        let manager = LogManager::open(options(dir.path(), &clock)).expect("open");
        let log = manager.get_or_create(&tp, config(&[])).expect("create");
        log.append(&mut records(1, 10, T0, 0), 0).expect("append");
        assert!(manager.delete(&tp).expect("delete"));
        assert!(manager.get(&tp).is_none());
        manager.shutdown().expect("shutdown");
    }
    let manager = LogManager::open(options(dir.path(), &clock)).expect("reopen");
    assert!(manager.get(&tp).is_none());
    assert!(!dir.path().join("temp-0").exists());
}

#[test]
fn given_retention_due_when_maintenance_runs_should_delete_and_later_unlink() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let manager = LogManager::open(options(dir.path(), &clock)).expect("open");
    let log = manager
        .get_or_create(
            &TopicPartition::new("logs", 0),
            config(&[("segment.bytes", "1024"), ("retention.ms", "1000"), ("file.delete.delay.ms", "5000")]),
        )
        .expect("create");
    for _ in 0..10 {
        log.append(&mut records(1, 300, T0, 0), 0).expect("append");
    }
    clock.advance_ms(10_000);
    manager.run_maintenance(true).expect("maintenance");
    assert_eq!(log.log_start_offset(), 10);
    assert!(manager.pending_deletions() > 0, "files linger for file.delete.delay.ms");
    clock.advance_ms(5_000);
    manager.run_maintenance(false).expect("maintenance");
    assert_eq!(manager.pending_deletions(), 0);
    let leftovers = std::fs::read_dir(log.dir())
        .expect("ls")
        .filter(|e| e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".deleted")))
        .count();
    assert_eq!(leftovers, 0);
}

/// Opening 10,000 partitions after a clean shutdown reads almost nothing: only the header of the
/// last batch of each log (to learn its end offset), never the data.
#[test]
fn given_ten_thousand_partitions_when_reopened_cleanly_should_not_read_their_data() {
    // tmpfs keeps the 30,000 file creations and fsyncs of the set-up fast; the property checked
    // (bytes read by the process) does not depend on the file system.
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = tempfile::tempdir_in(base).expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let cfg = config(&[("segment.index.bytes", "4096")]);
    let partitions = 10_000;
    let mut data_bytes = 0u64;
    {
        let mut opts = options(dir.path(), &clock);
        opts.default_config = cfg.clone();
        let manager = LogManager::open(opts).expect("open");
        let batch = records(8, 1000, T0, 7);
        for p in 0..partitions {
            let log = manager.get_or_create(&TopicPartition::new("wide", p), cfg.clone()).expect("create");
            log.append(&mut batch.clone(), 0).expect("append");
            data_bytes += batch.len() as u64;
        }
        manager.shutdown().expect("shutdown");
    }
    let before = bytes_read_by_process();
    let started = Instant::now();
    let mut opts = options(dir.path(), &clock);
    opts.default_config = cfg;
    let manager = LogManager::open(opts).expect("reopen");
    let elapsed = started.elapsed();
    let read = bytes_read_by_process() - before;
    eprintln!("opened {partitions} partitions in {elapsed:?}, read {read} bytes of {data_bytes} stored");
    assert_eq!(manager.logs().len(), partitions as usize);
    assert!(read < data_bytes / 20, "read {read} bytes while opening {data_bytes} bytes of logs");
    let log = manager.get(&TopicPartition::new("wide", 9_999)).expect("log");
    assert_eq!(log.log_end_offset(), 8);
    manager.shutdown().expect("shutdown");
}

/// Appends `rounds` batches of four records, one for each of the keys `k0`..`k3`, so every round
/// supersedes the one before it.
fn append_rounds_of_four_keys(log: &Log, rounds: u8, value_bytes: usize) {
    for round in 0..rounds {
        let keys = (0..4u8).map(|k| vec![b'k', k]).collect();
        let mut b = batch(&BatchSpec { records: 4, value_bytes, keys: Some(keys), fill: round, ..Default::default() });
        log.append(&mut b, 0).expect("append");
    }
}

#[test]
fn given_compacted_topic_when_background_cleaner_runs_should_keep_latest_per_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let mut opts = options(dir.path(), &clock);
    opts.cleaner_backoff_ms = 20;
    opts.flush_check_interval_ms = 20;
    let manager = LogManager::open(opts).expect("open");
    let log = manager
        .get_or_create(
            &TopicPartition::new("users", 0),
            config(&[("cleanup.policy", "compact"), ("segment.bytes", "2048")]),
        )
        .expect("create");
    append_rounds_of_four_keys(&log, 20, 100);
    let before = log.size_bytes();
    manager.start_background().expect("start");
    let deadline = Instant::now() + Duration::from_secs(20);
    while log.size_bytes() * 2 > before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    manager.shutdown().expect("shutdown");
    assert!(log.size_bytes() * 2 <= before, "compaction shrank {before} bytes to {}", log.size_bytes());
    // Every key's latest value (round 19, or the active segment's) is still readable.
    let all = read_all(&log, log.log_start_offset());
    let last = all.last().expect("data");
    assert_eq!(last.0, 76);
}

/// A compacted partition shaped like a `__consumer_offsets` one, whose closed segments the
/// cleaner can shrink at once, in a manager whose background threads run with
/// `log.cleaner.io.max.bytes.per.second` set to `io_limit` (passed on as the broker passes the
/// setting), with the log's size before the cleaner started.
struct CleanerUnderTest {
    _dir: tempfile::TempDir,
    manager: Arc<LogManager>,
    log: Arc<Log>,
    bytes_before: u64,
}

fn start_cleaner_on_a_dirty_compacted_log(io_limit: u64) -> CleanerUnderTest {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut opts = options(dir.path(), &Arc::new(ManualClock::new(T0)));
    opts.cleaner_io_max_bytes_per_second = io_limit;
    let manager = LogManager::open(opts).expect("open");
    let cfg = config(&[("cleanup.policy", "compact"), ("segment.bytes", "8192")]);
    let log = manager.get_or_create(&TopicPartition::new("__consumer_offsets", 0), cfg).expect("create");
    // Six segments of one round each: few files for shutdown to flush.
    append_rounds_of_four_keys(&log, 6, 1000);
    log.roll_now().expect("roll");
    let bytes_before = log.size_bytes();
    manager.start_background().expect("start");
    CleanerUnderTest { _dir: dir, manager, log, bytes_before }
}

#[test]
fn given_the_default_cleaner_io_limit_of_zero_when_compacting_should_not_throttle() {
    // 0 is the broker's default and documented as "no limit".
    let t = start_cleaner_on_a_dirty_compacted_log(0);
    let started = Instant::now();
    while t.log.size_bytes() >= t.bytes_before {
        assert!(started.elapsed() < Duration::from_secs(5), "no compaction within {:?}", started.elapsed());
        std::thread::sleep(Duration::from_millis(10));
    }
    t.manager.shutdown().expect("shutdown");
    assert_eq!(read_all(&t.log, t.log.log_start_offset()).last().expect("data").0, 20, "the latest round is kept");
}

#[test]
fn given_a_cleaner_sleeping_off_its_io_limit_when_shutting_down_should_return_promptly() {
    // 100 bytes per second: the first batch of about 4 KiB alone puts the cleaner 40 s in debt.
    let t = start_cleaner_on_a_dirty_compacted_log(100);
    let cleaner = t.manager.cleaner().expect("the cleaner is enabled");
    let waiting = Instant::now();
    while cleaner.throttle().sleeps() == 0 {
        assert!(waiting.elapsed() < Duration::from_secs(10), "the cleaner never reached its throttle");
        std::thread::sleep(Duration::from_millis(5));
    }
    let started = Instant::now();
    t.manager.shutdown().expect("shutdown");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "shutdown waited {took:?} for a throttled cleaner");
    assert_eq!(t.log.size_bytes(), t.bytes_before, "the interrupted pass changed nothing");
}

/// What a reader sees of an empty log: every offset, and the leader epochs.
fn empty_log_view(log: &Log) -> (i64, i64, i64, i64, Option<i32>) {
    (
        log.log_start_offset(),
        log.log_end_offset(),
        log.high_watermark(),
        log.recovery_point(),
        log.latest_leader_epoch().expect("epochs"),
    )
}

#[test]
fn given_a_topic_created_at_once_when_written_and_reopened_should_keep_every_partition() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let cfg = config(&[("segment.bytes", "4096")]);
    let existing = TopicPartition::new("old", 0);
    let wanted: Vec<(TopicPartition, weir_storage::LogConfig)> =
        (0..10).map(|p| (TopicPartition::new("batch", p), cfg.clone())).collect();
    {
        let manager = LogManager::open(options(dir.path(), &clock)).expect("open");
        let old = manager.get_or_create(&existing, cfg.clone()).expect("create one");
        // An existing log comes back as it is; a partition named twice is made once.
        let mut asked = wanted.clone();
        asked.push((existing.clone(), cfg.clone()));
        asked.push((TopicPartition::new("batch", 3), cfg.clone()));
        let logs = manager.get_or_create_many(asked).expect("create many");
        assert_eq!(logs.len(), 12);
        assert!(Arc::ptr_eq(&logs[10], &old));
        assert!(Arc::ptr_eq(&logs[11], &logs[3]));
        // A new log reads as one `Log::open` makes in an empty directory.
        let reference = open(&dir.path().join("reference"), cfg.clone(), Arc::clone(&clock), OpenOptions::default());
        for ((tp, _), log) in wanted.iter().zip(&logs) {
            assert_eq!(manager.get(tp).map(|l| Arc::as_ptr(&l)), Some(Arc::as_ptr(log)));
            assert_eq!(empty_log_view(log), empty_log_view(&reference), "{tp}");
            // The indexes are made on first use.
            assert!(log.dir().join("00000000000000000000.log").exists(), "{tp}: .log missing");
            assert!(!log.dir().join("00000000000000000000.index").exists(), "{tp}: .index made early");
        }
        for (p, log) in logs.iter().take(10).enumerate() {
            log.assign_leader_epoch(3).expect("epoch");
            for _ in 0..=p {
                log.append(&mut records(1, 100, T0, p as u8), 3).expect("append");
            }
            log.flush().expect("flush");
            assert_eq!(log.leader_epoch_entries().expect("epochs").len(), 1);
            for file in ["00000000000000000000.index", "00000000000000000000.timeindex"] {
                assert!(log.dir().join(file).exists(), "{file} not made by the first append");
            }
        }
        // A log never written to shuts down and reopens without index files.
        let idle = manager.get_or_create(&TopicPartition::new("idle", 0), cfg.clone()).expect("create idle");
        assert_eq!(idle.read(0, 1024, i64::MAX).expect("read empty").slice.map(|_| ()), None);
        idle.close().expect("close idle");
        // No shutdown: the next open recovers as after a crash.
    }
    let manager = LogManager::open(options(dir.path(), &clock)).expect("reopen");
    for (p, (tp, _)) in wanted.iter().enumerate() {
        let log = manager.get(tp).unwrap_or_else(|| panic!("{tp} lost"));
        assert_eq!(log.log_end_offset(), p as i64 + 1, "{tp}");
        assert_eq!(read_all(&log, 0).len(), p + 1, "{tp}");
        assert_eq!(log.latest_leader_epoch().expect("epochs"), Some(3), "{tp}");
    }
    let idle = manager.get(&TopicPartition::new("idle", 0)).expect("idle log lost");
    idle.append(&mut records(1, 100, T0, 9), 0).expect("append to the idle log");
    assert_eq!(read_all(&idle, 0).len(), 1);
    manager.shutdown().expect("shutdown");
}

#[test]
fn given_partition_dirs_a_crash_left_without_files_when_reopened_should_open_empty_logs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let cfg = config(&[]);
    {
        let manager = LogManager::open(options(dir.path(), &clock)).expect("open");
        manager.shutdown().expect("shutdown");
    }
    // A crash during a creation: one directory made and empty, one with its `.log` only, one
    // with a `.log` and an `.index` cut short of its preallocated size. Unclean: no marker.
    std::fs::remove_file(dir.path().join(".weir_clean_shutdown")).expect("unclean");
    let bare = dir.path().join("half-0");
    std::fs::create_dir(&bare).expect("mkdir");
    let log_only = dir.path().join("half-1");
    std::fs::create_dir(&log_only).expect("mkdir");
    std::fs::write(log_only.join("00000000000000000000.log"), b"").expect("log file");
    let short_index = dir.path().join("half-2");
    std::fs::create_dir(&short_index).expect("mkdir");
    std::fs::write(short_index.join("00000000000000000000.log"), b"").expect("log file");
    std::fs::write(short_index.join("00000000000000000000.index"), [0u8; 8]).expect("index file");
    let manager = LogManager::open(options(dir.path(), &clock)).expect("reopen");
    for p in 0..3 {
        let tp = TopicPartition::new("half", p);
        let log = manager.get(&tp).unwrap_or_else(|| panic!("{tp} not loaded"));
        assert_eq!((log.log_start_offset(), log.log_end_offset()), (0, 0), "{tp}");
        log.append(&mut records(2, 50, T0, 1), 0).expect("append");
        assert_eq!(read_all(&log, 0).len(), 1, "{tp}");
        // Asking for it again gives the loaded log, not a new one.
        let again = manager.get_or_create_many(vec![(tp.clone(), cfg.clone())]).expect("get");
        assert!(Arc::ptr_eq(&again[0], &log), "{tp}");
    }
    // A directory on disk the manager has not loaded (a creation that failed half-way while
    // the process kept running) is opened, not refused.
    let stray = dir.path().join("late-0");
    std::fs::create_dir(&stray).expect("mkdir");
    let logs = manager
        .get_or_create_many(vec![(TopicPartition::new("late", 0), cfg.clone()), (TopicPartition::new("late", 1), cfg)])
        .expect("create over a leftover directory");
    for log in &logs {
        assert_eq!(log.log_end_offset(), 0);
        log.append(&mut records(1, 50, T0, 2), 0).expect("append");
    }
    manager.shutdown().expect("shutdown");
}
