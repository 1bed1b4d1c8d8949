//! Crash safety of the partition log.
//!
//! A child process (this test binary, re-executed with an environment variable naming the log
//! directory) appends with `flush.policy=sync` from several threads and prints one `ACK` line per
//! batch after `sync_to` returned for it. The parent kills it with SIGKILL after a random delay,
//! then recovers a copy of the directory and checks that every acknowledged batch is there,
//! byte-identical, at its acknowledged offset, exactly once, and that nothing corrupt is readable.
//! The next child continues on the original (not yet recovered) directory, so recovery itself runs
//! in the child, can be killed half-way, and runs again on a growing log.
//!
//! Batch contents are a pure function of (seed, batch id), and the id is stored in the batch's
//! base timestamp, so the parent can rebuild the exact bytes of every batch it finds in the log,
//! acknowledged or not. Reproduce a failure with `WEIR_CRASH_TEST_SEED=<seed printed>`.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::*;
use weir_storage::batch::{assign_offsets, validate_batches, BatchHeader};
use weir_storage::testing::{batch, BatchSpec};
use weir_storage::{Compression, Log, LogConfig, ManualClock, OpenOptions, TimestampOffset};

/// The directory the child appends to; the child test does nothing without it.
const CHILD_DIR_ENV: &str = "WEIR_CRASH_CHILD_DIR";
/// Seed of the batch contents.
const CHILD_SEED_ENV: &str = "WEIR_CRASH_SEED";
/// Which kill iteration this child is (part of every batch id, and its leader epoch).
const CHILD_ITERATION_ENV: &str = "WEIR_CRASH_ITERATION";
/// Optional recovery point for the child's own (unclean) open.
const CHILD_RECOVERY_POINT_ENV: &str = "WEIR_CRASH_RECOVERY_POINT";
/// Overrides the parent's random seed (to reproduce a failure).
const SEED_OVERRIDE_ENV: &str = "WEIR_CRASH_TEST_SEED";
const CHILD_TEST_NAME: &str = "given_crash_child_environment_when_run_should_append_and_acknowledge_until_killed";

const ITERATIONS: u64 = 50;
const MIN_ITERATIONS_WITH_ACKS: u64 = 40;
const APPENDER_THREADS: u64 = 4;
/// Each appender pauses up to this long after an acknowledgement.
const APPENDER_PAUSE_MAX_MICROS: u64 = 2_000;
const KILL_DELAY_MS: std::ops::RangeInclusive<u64> = 5..=150;
/// A child must open the log within this (recovery of a few MiB takes milliseconds).
const CHILD_OPEN_TIMEOUT: Duration = Duration::from_secs(20);
/// One kill in this many counts its delay from the spawn rather than from the open.
const KILL_AFTER_SPAWN_ONE_IN: u64 = 6;
/// A child that is never killed (a parent that died) stops on its own after this.
const CHILD_MAX_RUNTIME: Duration = Duration::from_secs(10);

fn crash_config() -> LogConfig {
    config(&[
        ("flush.policy", "sync"),
        ("segment.bytes", "65536"),
        ("index.interval.bytes", "512"),
        // 128 offset-index and 85 time-index entries: some rolls happen because an index is full.
        ("segment.index.bytes", "1024"),
    ])
}

/// SplitMix64: a tiny, good-enough PRNG (no new dependencies).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    fn in_range(&mut self, range: std::ops::RangeInclusive<u64>) -> u64 {
        range.start() + self.next() % (range.end() - range.start() + 1)
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Batch ids: iteration (bits 24..), appender thread (bits 20..24), sequence number (bits 0..20).
/// Iteration 0 is reserved for the parent's own probe appends.
fn batch_id(iteration: u64, thread: u64, sequence: u64) -> u64 {
    assert!(thread < 16 && sequence < 1 << 20);
    (iteration << 24) | (thread << 20) | sequence
}

fn iteration_of(id: u64) -> u64 {
    id >> 24
}

/// The leader epoch a child stamps on its batches (so that the epoch rewrite is checked too).
fn epoch_of(id: u64) -> i32 {
    iteration_of(id) as i32
}

/// The batch with this id, as a producer sends it (before `append` assigns offsets). The id is
/// in the base timestamp, so it can be read back from any batch header.
fn producer_batch(seed: u64, id: u64) -> Vec<u8> {
    let r = mix(seed ^ id.wrapping_mul(0xD6E8_FEB8_6659_FD93));
    let compression = match r % 16 {
        0 => Compression::Gzip,
        1 => Compression::Snappy,
        2 => Compression::Lz4,
        3 => Compression::Zstd,
        _ => Compression::None,
    };
    batch(&BatchSpec {
        records: 1 + (r >> 8) as usize % 4,
        value_bytes: (r >> 16) as usize % 200,
        timestamp: timestamp_of(id),
        keys: (r >> 32).is_multiple_of(2).then(|| vec![id.to_be_bytes().to_vec()]),
        compression,
        fill: (r >> 40) as u8,
        ..Default::default()
    })
}

/// Batch `id`'s first record has this timestamp, record `i` this plus `i`; batches have at most
/// four records, so no two records anywhere share a timestamp.
fn timestamp_of(id: u64) -> i64 {
    T0 + id as i64 * 8
}

fn id_of(header: &BatchHeader) -> u64 {
    ((header.base_timestamp - T0) / 8) as u64
}

/// The bytes `append` leaves on disk for batch `id` at `base_offset`.
fn appended_batch(seed: u64, id: u64, base_offset: i64) -> Vec<u8> {
    let mut bytes = producer_batch(seed, id);
    assign_offsets(&mut bytes, base_offset, epoch_of(id), None);
    bytes
}

fn env_u64(name: &str) -> u64 {
    let value = std::env::var(name).unwrap_or_else(|_| panic!("{name} is set with {CHILD_DIR_ENV}"));
    value.parse().unwrap_or_else(|_| panic!("{name}={value} is not a number"))
}

/// Writes one whole line with a single `write` (atomic on a pipe), or ends the child if the
/// parent is gone.
fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    if out.write_all(line.as_bytes()).and_then(|()| out.flush()).is_err() {
        std::process::exit(0);
    }
}

/// The child: does nothing in a normal test run; under the crash test it opens the log
/// (recovering it) and appends from several threads until it is killed.
///
/// Lines: `OPEN <log end> <recovery point> <milliseconds the open took>` once opened; then
/// `ACK <first offset> <batch id> <crc32c of the appended bytes> <recovery point>` for each batch
/// after `sync_to` returned for it.
#[test]
fn given_crash_child_environment_when_run_should_append_and_acknowledge_until_killed() {
    let Some(dir) = std::env::var_os(CHILD_DIR_ENV) else { return };
    let seed = env_u64(CHILD_SEED_ENV);
    let iteration = env_u64(CHILD_ITERATION_ENV);
    let recovery_point = std::env::var(CHILD_RECOVERY_POINT_ENV).ok().map(|v| v.parse().expect("recovery point"));
    let started = Instant::now();
    let log = Arc::new(open(
        Path::new(&dir),
        crash_config(),
        Arc::new(ManualClock::new(T0)),
        // Every kill is of the process alone, so both recoveries apply: the full scan on even
        // iterations, the tail-only one that trusts the page cache on odd ones.
        OpenOptions {
            clean_shutdown: false,
            recovery_point,
            log_start_offset: None,
            page_cache_survived: iteration % 2 == 1,
        },
    ));
    emit(&format!("OPEN {} {} {}\n", log.log_end_offset(), log.recovery_point(), started.elapsed().as_millis()));
    let threads: Vec<_> = (0..APPENDER_THREADS)
        .map(|thread| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for sequence in 0.. {
                    if started.elapsed() > CHILD_MAX_RUNTIME {
                        return;
                    }
                    let id = batch_id(iteration, thread, sequence);
                    let mut bytes = producer_batch(seed, id);
                    let info = log.append(&mut bytes, epoch_of(id)).expect("child: append");
                    log.sync_to(info.last_offset + 1).expect("child: sync");
                    let crc = crc32c::crc32c(&bytes);
                    emit(&format!("ACK {} {id} {crc} {}\n", info.first_offset, log.recovery_point()));
                    // Keep the log small enough that 50 recoveries stay fast; with four threads
                    // some thread is still appending or syncing at almost every moment.
                    std::thread::sleep(Duration::from_micros(mix(id) % APPENDER_PAUSE_MAX_MICROS));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("child: appender thread");
    }
}

/// One acknowledged batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ack {
    id: u64,
    crc: u32,
}

/// What one child reported before it was killed.
#[derive(Debug, Default)]
struct ChildReport {
    opened: bool,
    open_ms: Option<u64>,
    acks: Vec<(i64, Ack)>,
    /// The largest recovery point the child reported (everything below it was fsynced).
    recovery_point: Option<i64>,
}

/// What the kill delay counts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KillAt {
    /// From the spawn: the kill may land in start-up or in the child's own recovery.
    AfterSpawn,
    /// From the child's `OPEN` line: the kill lands while the appenders run.
    AfterOpen,
}

/// Kills the child if the parent panics before it does.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run_child(
    dir: &Path,
    stderr_path: &Path,
    seed: u64,
    iteration: u64,
    recovery_point: Option<i64>,
    kill_at: KillAt,
    delay: Duration,
) -> ChildReport {
    let exe = std::env::current_exe().expect("current test binary");
    let mut command = Command::new(exe);
    command
        .args(["--exact", CHILD_TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR_ENV, dir)
        .env(CHILD_SEED_ENV, seed.to_string())
        .env(CHILD_ITERATION_ENV, iteration.to_string())
        .env_remove(CHILD_RECOVERY_POINT_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(stderr_path).expect("child stderr file"));
    if let Some(rp) = recovery_point {
        command.env(CHILD_RECOVERY_POINT_ENV, rp.to_string());
    }
    let mut child = KillOnDrop(command.spawn().expect("spawn child"));
    let stdout = child.0.stdout.take().expect("child stdout");
    let (lines_tx, lines_rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                // A line cut off by the kill was not acknowledged.
                Ok(_) if line.ends_with('\n') => {
                    if lines_tx.send(line).is_err() {
                        break;
                    }
                }
                Ok(_) => break,
            }
        }
    });
    let child_failed = |child: &mut KillOnDrop, what: &str| -> ! {
        let status = child.0.wait().map_or_else(|e| e.to_string(), |s| s.to_string());
        let mut stderr = String::new();
        let _ = std::fs::File::open(stderr_path).and_then(|mut f| f.read_to_string(&mut stderr));
        panic!("iteration {iteration}: the child {what} (exit status {status}):\n{stderr}");
    };
    let mut lines = Vec::new();
    if kill_at == KillAt::AfterOpen {
        let deadline = Instant::now() + CHILD_OPEN_TIMEOUT;
        loop {
            match lines_rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => {
                    let opened = line.split_whitespace().any(|f| f == "OPEN");
                    lines.push(line);
                    if opened {
                        break;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => child_failed(&mut child, "did not open the log in time"),
                Err(mpsc::RecvTimeoutError::Disconnected) => child_failed(&mut child, "exited before opening the log"),
            }
        }
    }
    std::thread::sleep(delay);
    if child.0.try_wait().expect("poll child").is_some() {
        child_failed(&mut child, "exited before it was killed");
    }
    child.0.kill().expect("SIGKILL the child");
    child.0.wait().expect("reap the child");
    reader.join().expect("stdout reader");
    lines.extend(lines_rx.try_iter());
    let mut report = ChildReport::default();
    for line in lines {
        // With --nocapture the harness's "test <name> ... " has no newline, so a marker may
        // start mid-line.
        let fields: Vec<&str> = line.split_whitespace().skip_while(|f| *f != "OPEN" && *f != "ACK").collect();
        let number = |i: usize| -> i64 { fields[i].parse().unwrap_or_else(|_| panic!("bad child line {line:?}")) };
        match fields.first() {
            Some(&"OPEN") => {
                report.opened = true;
                report.recovery_point = report.recovery_point.max(Some(number(2)));
                report.open_ms = Some(number(3) as u64);
            }
            Some(&"ACK") => {
                let ack = Ack { id: number(2) as u64, crc: number(3) as u32 };
                report.acks.push((number(1), ack));
                report.recovery_point = report.recovery_point.max(Some(number(4)));
            }
            _ => {} // the test harness's own output
        }
    }
    report
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create copy");
    for entry in std::fs::read_dir(from).expect("list log dir") {
        let entry = entry.expect("dir entry");
        if entry.file_type().expect("file type").is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy file");
        }
    }
}

/// Recovers the log in `dir` and checks it against everything acknowledged so far. Returns the
/// recovered log end offset.
fn verify_recovered(
    dir: &Path,
    seed: u64,
    recovery_point: Option<i64>,
    acked: &BTreeMap<i64, Ack>,
    expected_bytes: &mut HashMap<u64, Vec<u8>>,
    context: &str,
) -> i64 {
    let log = open(
        dir,
        crash_config(),
        Arc::new(ManualClock::new(T0)),
        // Tail-only recovery, then verify() checksums everything: a torn or wrong tail that
        // the tail scan let through fails here.
        OpenOptions { clean_shutdown: false, recovery_point, log_start_offset: None, page_cache_survived: true },
    );
    if let Err(e) = log.verify() {
        panic!("{context}: verify() after recovery: {e}");
    }
    assert_eq!(log.log_start_offset(), 0, "{context}");
    let batches = read_all(&log, 0);
    let mut next_offset = 0;
    let mut ids = HashSet::new();
    let mut found: HashMap<i64, u64> = HashMap::new();
    for (base_offset, bytes) in &batches {
        assert_eq!(*base_offset, next_offset, "{context}: offsets must be contiguous");
        if let Err(e) = validate_batches(bytes, usize::MAX) {
            panic!("{context}: batch at {base_offset} is served but invalid: {e}");
        }
        let header = BatchHeader::parse(bytes).expect("header");
        let id = id_of(&header);
        assert!(
            (1..=ITERATIONS).contains(&iteration_of(id)),
            "{context}: batch at {base_offset} has an id {id} no child wrote"
        );
        assert!(ids.insert(id), "{context}: batch {id} is in the log twice (again at {base_offset})");
        let expected = expected_bytes.entry(id).or_insert_with(|| producer_batch(seed, id));
        let mut expected = expected.clone();
        assign_offsets(&mut expected, *base_offset, epoch_of(id), None);
        assert!(*bytes == expected, "{context}: batch {id} at {base_offset} is not the bytes the child appended");
        found.insert(*base_offset, id);
        next_offset = header.next_offset();
    }
    assert_eq!(next_offset, log.log_end_offset(), "{context}: the log end is right after the last batch");
    for (offset, ack) in acked {
        match found.get(offset) {
            Some(id) if *id == ack.id => {}
            Some(id) => panic!("{context}: acknowledged batch {} at {offset} was replaced by batch {id}", ack.id),
            None => {
                panic!("{context}: acknowledged batch {} at offset {offset} is missing (log end {next_offset})", ack.id)
            }
        }
    }
    check_timestamp_lookups(&log, &batches, context);
    // Appends continue right after what recovery kept, at the latest leader epoch it kept (an
    // older one is a deposed leader's write, refused).
    let mut probe = producer_batch(seed, batch_id(0, 0, 0));
    let epoch = log.latest_leader_epoch().expect("epochs after recovery").unwrap_or(0);
    let info = log.append(&mut probe, epoch).expect("append after recovery");
    assert_eq!(info.first_offset, next_offset, "{context}: appends continue at the recovered log end");
    log.sync_to(info.last_offset + 1).expect("sync after recovery");
    next_offset
}

/// ListOffsets by timestamp finds, for each segment's largest timestamp, the first record in
/// offset order at or after it (so every segment's largest timestamp must be known after
/// recovery), and the record with the largest timestamp.
fn check_timestamp_lookups(log: &Log, batches: &[(i64, Vec<u8>)], context: &str) {
    let headers: Vec<BatchHeader> = batches.iter().map(|(_, b)| BatchHeader::parse(b).expect("header")).collect();
    let first_at_or_after = |target: i64| {
        headers.iter().find(|h| h.max_timestamp >= target).map(|h| {
            let i = (target - h.base_timestamp).max(0);
            TimestampOffset { timestamp: h.base_timestamp + i, offset: h.base_offset + i }
        })
    };
    let bases = log.segment_base_offsets();
    for (i, base) in bases.iter().enumerate() {
        let end = bases.get(i + 1).copied().unwrap_or(i64::MAX);
        let Some(largest) =
            headers.iter().filter(|h| h.base_offset >= *base && h.base_offset < end).map(|h| h.max_timestamp).max()
        else {
            continue;
        };
        assert_eq!(
            log.offset_for_timestamp(largest).expect("offset_for_timestamp"),
            first_at_or_after(largest),
            "{context}: offset_for_timestamp of the largest timestamp of segment {base}"
        );
    }
    let largest = headers.iter().max_by_key(|h| h.max_timestamp);
    assert_eq!(
        log.max_timestamp_offset().expect("max_timestamp_offset"),
        largest.map(|h| TimestampOffset { timestamp: h.max_timestamp, offset: h.last_offset() }),
        "{context}: max_timestamp_offset"
    );
}

#[test]
fn given_sync_appends_when_the_process_is_killed_at_random_moments_should_keep_every_acknowledged_batch() {
    let seed = std::env::var(SEED_OVERRIDE_ENV).ok().map_or_else(
        || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64),
        |s| s.parse().expect("seed"),
    );
    println!("crash test seed {seed} (set {SEED_OVERRIDE_ENV}={seed} to repeat the kill schedule)");
    let started = Instant::now();
    let mut rng = Rng(seed);
    let root = tempfile::tempdir().expect("tempdir");
    let log_dir = root.path().join("log");
    let stderr_path = root.path().join("child.stderr");
    let mut acked: BTreeMap<i64, Ack> = BTreeMap::new();
    let mut expected_bytes: HashMap<u64, Vec<u8>> = HashMap::new();
    // A recovery point some child reported: all offsets below it were fsynced, so later opens
    // may trust the segments below it without scanning them (as the broker's checkpoint does).
    let mut checkpoint: Option<i64> = None;
    let mut iterations_with_acks = 0;
    let mut log_end = 0;
    for iteration in 1..=ITERATIONS {
        let context = format!("seed {seed}, iteration {iteration}");
        let delay = Duration::from_millis(rng.in_range(KILL_DELAY_MS));
        let child_recovery_point = checkpoint.filter(|_| rng.next().is_multiple_of(2));
        let kill_at =
            if rng.next().is_multiple_of(KILL_AFTER_SPAWN_ONE_IN) { KillAt::AfterSpawn } else { KillAt::AfterOpen };
        let report = run_child(&log_dir, &stderr_path, seed, iteration, child_recovery_point, kill_at, delay);
        if !report.acks.is_empty() {
            iterations_with_acks += 1;
        }
        for (offset, ack) in &report.acks {
            assert_eq!(
                crc32c::crc32c(&appended_batch(seed, ack.id, *offset)),
                ack.crc,
                "{context}: the parent rebuilds batch {} exactly as the child appended it",
                ack.id
            );
            assert!(*offset >= log_end, "{context}: batch {} acknowledged at {offset} below the old log end", ack.id);
            if let Some(previous) = acked.insert(*offset, *ack) {
                panic!("{context}: offset {offset} acknowledged twice: {previous:?} and {ack:?}");
            }
        }
        checkpoint = checkpoint.max(report.recovery_point);
        let verify_recovery_point = checkpoint.filter(|_| rng.next().is_multiple_of(2));
        let verify_started = Instant::now();
        let copy = root.path().join(format!("verify-{iteration}"));
        copy_dir(&log_dir, &copy);
        log_end = verify_recovered(&copy, seed, verify_recovery_point, &acked, &mut expected_bytes, &context);
        std::fs::remove_dir_all(&copy).expect("remove copy");
        println!(
            "iteration {iteration}: killed {delay:?} {kill_at:?} (child opened: {} in {:?} ms, rp {:?}), {} acks, log end {log_end}, verified in {:?}",
            report.opened,
            report.open_ms,
            child_recovery_point,
            report.acks.len(),
            verify_started.elapsed()
        );
    }
    let size: u64 =
        std::fs::read_dir(&log_dir).expect("ls").map(|e| e.expect("entry").metadata().expect("stat").len()).sum();
    println!(
        "{} acknowledged batches over {ITERATIONS} kills, {iterations_with_acks} kills after an ack; log end {log_end}, {size} bytes on disk; {:?}",
        acked.len(),
        started.elapsed()
    );
    assert!(
        iterations_with_acks >= MIN_ITERATIONS_WITH_ACKS,
        "seed {seed}: only {iterations_with_acks} of {ITERATIONS} children acknowledged anything before the kill"
    );
}
