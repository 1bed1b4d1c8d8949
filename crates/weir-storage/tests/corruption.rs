//! Damaged files: corrupt and torn tails are truncated by recovery, bit rot in closed segments is
//! reported instead of served, lost or garbage indexes are rebuilt, and garbage handed to
//! `append` is refused with a typed error.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use weir_storage::batch::{self, validate_batches, BatchHeader};
use weir_storage::testing::{batch, BatchSpec};
use weir_storage::{BatchError, Compression, Log, LogConfig, ManualClock, OpenOptions, StorageError, TimestampOffset};

/// Small segments so a few dozen batches make several of them, and index entries every few
/// batches.
fn small_segments() -> LogConfig {
    config(&[("segment.bytes", "4096"), ("index.interval.bytes", "1000"), ("segment.index.bytes", "4096")])
}

/// Segments spanning several offset-index entries (even at the 4096-byte interval that a lazily
/// loaded segment rebuilds with), so a rebuilt time index has entries but not necessarily the
/// segment's largest timestamp.
fn larger_segments() -> LogConfig {
    config(&[("segment.bytes", "10000"), ("index.interval.bytes", "1000"), ("segment.index.bytes", "4096")])
}

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(T0 + 1_000_000))
}

fn unclean() -> OpenOptions {
    OpenOptions::default()
}

fn clean() -> OpenOptions {
    OpenOptions { clean_shutdown: true, ..Default::default() }
}

fn segment_path(dir: &Path, base: i64, ext: &str) -> PathBuf {
    dir.join(format!("{base:020}.{ext}"))
}

/// Timestamps that grow with the offset but not monotonically, so a segment's largest timestamp
/// is near its end but not always its last batch's.
fn timestamp_of_batch(i: usize) -> i64 {
    T0 + i as i64 * 100 + ((i * 37) % 5) as i64 * 40
}

/// Appends `n` batches of 1–3 records; returns them as stored (base offset, bytes).
fn append_batches(log: &Log, n: usize) -> Vec<(i64, Vec<u8>)> {
    append_batch_range(log, 0..n)
}

/// Appends the batches `range` of the sequence `append_batches` starts (so timestamps go on
/// growing across calls).
fn append_batch_range(log: &Log, range: std::ops::Range<usize>) -> Vec<(i64, Vec<u8>)> {
    range
        .map(|i| {
            let mut bytes = records(1 + i % 3, 90 + i % 50, timestamp_of_batch(i), i as u8);
            let info = log.append(&mut bytes, 1).expect("append");
            (info.first_offset, bytes)
        })
        .collect()
}

/// A log of several segments written and then shut down cleanly or not (dropped without close).
fn write_log(dir: &Path, n: usize, close: bool) -> Vec<(i64, Vec<u8>)> {
    write_log_with(dir, small_segments(), n, close)
}

fn write_log_with(dir: &Path, config: LogConfig, n: usize, close: bool) -> Vec<(i64, Vec<u8>)> {
    let log = open(dir, config, clock(), OpenOptions::default());
    let batches = append_batches(&log, n);
    if close {
        log.close().expect("close");
    }
    batches
}

fn flip_byte(path: &Path, position: u64, mask: u8) {
    let mut bytes = std::fs::read(path).expect("read file");
    bytes[position as usize] ^= mask;
    std::fs::write(path, bytes).expect("write file");
}

fn append_to_file(path: &Path, tail: &[u8]) {
    let mut bytes = std::fs::read(path).expect("read file");
    bytes.extend_from_slice(tail);
    std::fs::write(path, bytes).expect("write file");
}

/// Position of each batch inside the segment that holds it, by index into `batches`.
fn positions_in_segments(log: &Log, batches: &[(i64, Vec<u8>)]) -> Vec<(i64, u64)> {
    let bases = log.segment_base_offsets();
    let mut out = Vec::new();
    let mut position = 0u64;
    let mut current_base = None;
    for (offset, bytes) in batches {
        let base = *bases.iter().rev().find(|b| *b <= offset).expect("segment of batch");
        if current_base != Some(base) {
            current_base = Some(base);
            position = 0;
        }
        out.push((base, position));
        position += bytes.len() as u64;
    }
    out
}

/// The answer `offset_for_timestamp` must give, worked out from the batches themselves: the first
/// record in offset order whose timestamp is `>= target` (records of a test batch have timestamps
/// `base_timestamp + i`).
fn expected_offset_for_timestamp(batches: &[(i64, Vec<u8>)], target: i64) -> Option<TimestampOffset> {
    batches.iter().find_map(|(base, bytes)| {
        let header = BatchHeader::parse(bytes).expect("header");
        (header.max_timestamp >= target).then(|| {
            let i = target.saturating_sub(header.base_timestamp).max(0);
            TimestampOffset { timestamp: header.base_timestamp + i, offset: base + i }
        })
    })
}

fn expected_max_timestamp(batches: &[(i64, Vec<u8>)]) -> Option<TimestampOffset> {
    let mut best: Option<TimestampOffset> = None;
    for (base, bytes) in batches {
        let header = BatchHeader::parse(bytes).expect("header");
        if best.is_none_or(|b| header.max_timestamp > b.timestamp) {
            best = Some(TimestampOffset {
                timestamp: header.max_timestamp,
                offset: base + i64::from(header.last_offset_delta),
            });
        }
    }
    best
}

/// Everything a consumer or ListOffsets can ask of the log agrees with `batches`.
fn assert_serves_exactly(log: &Log, batches: &[(i64, Vec<u8>)], context: &str) {
    log.verify().unwrap_or_else(|e| panic!("{context}: verify: {e}"));
    assert_eq!(read_all(log, log.log_start_offset()), batches, "{context}: all batches from the start");
    let end = batches.last().map_or(log.log_start_offset(), |(base, bytes)| {
        BatchHeader::parse(bytes).expect("header").next_offset().max(*base)
    });
    assert_eq!(log.log_end_offset(), end, "{context}: log end");
    for (base, bytes) in batches {
        let last = BatchHeader::parse(bytes).expect("header").last_offset();
        for offset in [*base, last] {
            let slice = log.read(offset, 1, i64::MAX).expect("read").slice.expect("a batch");
            assert_eq!(slice.first_offset, *base, "{context}: read({offset}) starts at its batch");
            assert_eq!(&slice.read_to_vec().expect("bytes"), bytes, "{context}: read({offset})");
        }
    }
    // Every batch's largest timestamp (which finds each segment's largest), a record inside some
    // batches, and the extremes.
    let mut targets: Vec<i64> = batches
        .iter()
        .enumerate()
        .flat_map(|(i, (_, bytes))| {
            let h = BatchHeader::parse(bytes).expect("header");
            [h.max_timestamp, if i % 4 == 0 { h.base_timestamp - 1 } else { h.max_timestamp }]
        })
        .collect();
    let largest = targets.iter().copied().max().unwrap_or(0);
    targets.extend([i64::MIN, 0, T0 - 1, largest + 1, i64::MAX]);
    targets.sort_unstable();
    targets.dedup();
    for target in targets {
        assert_eq!(
            log.offset_for_timestamp(target).expect("offset_for_timestamp"),
            expected_offset_for_timestamp(batches, target),
            "{context}: offset_for_timestamp({target})"
        );
    }
    assert_eq!(log.max_timestamp_offset().expect("max timestamp"), expected_max_timestamp(batches), "{context}");
}

fn is_corrupt_segment(result: &Result<impl std::fmt::Debug, StorageError>) -> bool {
    matches!(result, Err(StorageError::CorruptSegment { .. }))
}

// ---- (a) corrupt bytes in the tail of the active segment ----

#[test]
fn given_flipped_byte_in_active_segment_tail_when_reopened_uncleanly_should_truncate_from_the_corrupt_batch() {
    for recovery_point in [None, Some(0), Some(i64::MAX)] {
        for flip_at in [batch::ATTRIBUTES_AT as u64, batch::RECORDS_COUNT_AT as u64 + 2, 70, u64::MAX] {
            let dir = tempfile::tempdir().expect("tempdir");
            let batches = write_log(dir.path(), 60, false);
            let context = format!("recovery point {recovery_point:?}, flip at {flip_at}");
            let (active_base, positions) = {
                let log = open(dir.path(), small_segments(), clock(), clean());
                (*log.segment_base_offsets().last().expect("segments"), positions_in_segments(&log, &batches))
            };
            // The second-to-last batch of the active segment (which holds several batches).
            let victim = batches.len() - 2;
            assert_eq!(positions[victim].0, active_base, "{context}: the victim is in the active segment");
            assert!(positions[victim].1 > 0, "{context}: the victim is not the segment's first batch");
            let within = flip_at.min(batches[victim].1.len() as u64 - 1);
            flip_byte(&segment_path(dir.path(), active_base, "log"), positions[victim].1 + within, 0x10);

            let log = open(dir.path(), small_segments(), clock(), OpenOptions { recovery_point, ..unclean() });
            let kept = &batches[..victim];
            assert_serves_exactly(&log, kept, &context);
            assert_eq!(
                log.log_end_offset(),
                batches[victim].0,
                "{context}: the log ends where the corrupt batch began"
            );
            let truncated: usize = batches[victim..].iter().map(|(_, b)| b.len()).sum();
            assert_eq!(log.stats.recovered_truncated_bytes.load(Ordering::Relaxed), truncated as u64, "{context}");

            let mut more = records(2, 10, T0, 7);
            let info = log.append(&mut more, 1).expect("append after recovery");
            assert_eq!(info.first_offset, batches[victim].0, "{context}: appends continue at the cut");
            drop(log);
            let mut expected = kept.to_vec();
            expected.push((info.first_offset, more));
            let log = open(dir.path(), small_segments(), clock(), unclean());
            assert_serves_exactly(&log, &expected, &format!("{context}, reopened again"));
        }
    }
}

// ---- (b) torn tails ----

const WHOLE_BATCH_THEN_ZEROS: &str = "a whole batch followed by zeros";

/// Tails a crash can leave after the last whole batch.
fn torn_tails(next_batch: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let with_length = |length: i32| {
        let mut b = next_batch.to_vec();
        b[batch::LENGTH_AT..batch::LENGTH_AT + 4].copy_from_slice(&length.to_be_bytes());
        b
    };
    vec![
        ("the first bytes of a batch", next_batch[..5].to_vec()),
        ("a batch cut inside its 12-byte prefix", next_batch[..11].to_vec()),
        ("a batch cut inside its header", next_batch[..40].to_vec()),
        ("a batch cut inside its records", next_batch[..next_batch.len() - 3].to_vec()),
        ("a batch missing its last byte", next_batch[..next_batch.len() - 1].to_vec()),
        ("a garbage length field: i32::MAX", with_length(i32::MAX)),
        ("a garbage length field: negative", with_length(-7)),
        ("a garbage length field: zero", with_length(0)),
        ("a garbage length field: shorter than a header", with_length(30)),
        ("a garbage length field: one byte too long", with_length(next_batch.len() as i32 - 11)),
        ("a zero-filled tail (preallocating filesystem)", vec![0; 4096]),
        ("a short zero-filled tail", vec![0; 20]),
        (WHOLE_BATCH_THEN_ZEROS, [next_batch, &[0u8; 100][..]].concat()),
        ("random garbage", (0..300u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()),
    ]
}

#[test]
fn given_torn_tail_when_reopened_uncleanly_should_truncate_it_and_keep_every_whole_batch() {
    let cases = {
        // Only the shapes matter here; each case below rebuilds the batch at the real log end.
        torn_tails(&records(3, 120, T0 + 5_000, 9)).len()
    };
    for case in 0..cases {
        for recovery_point in [None, Some(i64::MAX)] {
            let dir = tempfile::tempdir().expect("tempdir");
            let batches = write_log(dir.path(), 40, false);
            let log_end = {
                let (base, bytes) = batches.last().expect("batches");
                base + i64::from(BatchHeader::parse(bytes).expect("header").records_count)
            };
            // The batch a crash interrupted, with the offsets it would have had.
            let mut next_batch = records(3, 120, T0 + 5_000, 9);
            batch::assign_offsets(&mut next_batch, log_end, 1, None);
            let (what, tail) = torn_tails(&next_batch).swap_remove(case);
            let context = format!("{what}, recovery point {recovery_point:?}");
            let active_base =
                *open(dir.path(), small_segments(), clock(), clean()).segment_base_offsets().last().expect("segments");
            let active = segment_path(dir.path(), active_base, "log");
            let whole = std::fs::metadata(&active).expect("stat").len();
            append_to_file(&active, &tail);

            let log = open(dir.path(), small_segments(), clock(), OpenOptions { recovery_point, ..unclean() });
            let mut expected = batches.clone();
            let mut kept = whole;
            if what == WHOLE_BATCH_THEN_ZEROS {
                // The batch is intact and continues the log: only the zeros after it go.
                expected.push((log_end, next_batch.clone()));
                kept += next_batch.len() as u64;
            }
            assert_eq!(std::fs::metadata(&active).expect("stat").len(), kept, "{context}: cut back to whole batches");
            assert_eq!(
                log.stats.recovered_truncated_bytes.load(Ordering::Relaxed),
                whole + tail.len() as u64 - kept,
                "{context}"
            );
            assert_serves_exactly(&log, &expected, &context);
            let end = log.log_end_offset();
            let info = log.append(&mut records(1, 10, T0, 1), 1).expect("append after recovery");
            assert_eq!(info.first_offset, end, "{context}: appends continue at the log end");
        }
    }
}

#[test]
fn given_empty_active_segment_with_preallocated_indexes_when_reopened_uncleanly_should_recover() {
    let dir = tempfile::tempdir().expect("tempdir");
    let batches = write_log(dir.path(), 30, false);
    let log = open(dir.path(), small_segments(), clock(), unclean());
    log.roll_now().expect("roll");
    let bases = log.segment_base_offsets();
    drop(log);
    // A crash right after the roll: an empty active segment with zero-filled preallocated indexes.
    let active = *bases.last().expect("segments");
    assert_eq!(std::fs::metadata(segment_path(dir.path(), active, "log")).expect("stat").len(), 0);
    for recovery_point in [None, Some(active), Some(i64::MAX)] {
        let log = open(dir.path(), small_segments(), clock(), OpenOptions { recovery_point, ..unclean() });
        assert_serves_exactly(&log, &batches, &format!("recovery point {recovery_point:?}"));
    }
}

// ---- (c) bit rot in a closed segment ----

#[test]
fn given_flipped_byte_in_closed_segment_when_read_should_report_corrupt_segment_and_keep_other_segments_readable() {
    let cases = [
        ("a record value", 100u64),
        ("the last byte", u64::MAX),
        ("the attributes", batch::ATTRIBUTES_AT as u64),
        ("the record count", batch::RECORDS_COUNT_AT as u64 + 3),
        ("the CRC", batch::CRC_AT as u64 + 1),
        ("the magic byte", batch::MAGIC_AT as u64),
        ("the length field", batch::LENGTH_AT as u64 + 3),
        // baseOffset is outside the CRC: only the order of offsets can give it away.
        ("the base offset's high byte", batch::BASE_OFFSET_AT as u64),
        ("the base offset's low word", batch::BASE_OFFSET_AT as u64 + 4),
    ];
    for (what, within) in cases {
        for open_options in [clean(), OpenOptions { recovery_point: Some(i64::MAX), ..unclean() }] {
            let context = format!("flip in {what}, {open_options:?}");
            let dir = tempfile::tempdir().expect("tempdir");
            let batches = write_log(dir.path(), 60, true);
            let log = open(dir.path(), small_segments(), clock(), clean());
            let bases = log.segment_base_offsets();
            assert!(bases.len() >= 4, "several segments: {bases:?}");
            let positions = positions_in_segments(&log, &batches);
            drop(log);
            // A batch in the middle of the first segment.
            let in_first: Vec<usize> = (0..batches.len()).filter(|i| positions[*i].0 == bases[0]).collect();
            assert!(in_first.len() >= 3, "{context}");
            let victim = in_first[in_first.len() / 2];
            let within = within.min(batches[victim].1.len() as u64 - 1);
            flip_byte(&segment_path(dir.path(), bases[0], "log"), positions[victim].1 + within, 0x04);

            let log = open(dir.path(), small_segments(), clock(), open_options);
            let (victim_offset, _) = batches[victim];
            let read = log.read(victim_offset, 1 << 20, i64::MAX);
            assert!(is_corrupt_segment(&read), "{context}: read over the corrupt batch gave {read:?}");
            // A consumer reading from the start gets every batch before the corrupt one, then the
            // error: never the corrupt batch, never anything past it in that segment.
            let mut served = Vec::new();
            let mut next = batches[0].0;
            let error = loop {
                match log.read(next, 1 << 20, i64::MAX) {
                    Ok(result) => {
                        let slice = result.slice.expect("data before the corrupt batch");
                        let bytes = slice.read_to_vec().expect("bytes");
                        for (at, h) in batch::headers(&bytes) {
                            served.push((h.base_offset, bytes[at..at + h.size_bytes().expect("size")].to_vec()));
                        }
                        next = slice.next_offset;
                    }
                    Err(e) => break e,
                }
            };
            assert!(matches!(error, StorageError::CorruptSegment { .. }), "{context}: {error:?}");
            assert_eq!(served, batches[..victim], "{context}: served before the error");
            match log.verify() {
                Err(StorageError::CorruptSegment { path, position, .. }) => {
                    assert_eq!(path, segment_path(dir.path(), bases[0], "log"), "{context}");
                    assert_eq!(position, positions[victim].1, "{context}: verify names the corrupt batch");
                }
                other => panic!("{context}: verify() gave {other:?}"),
            }
            // Batches before the corrupt one in the same segment are served one at a time.
            for (offset, bytes) in &batches[..victim] {
                let slice = log.read_with(*offset, 1, i64::MAX, true).expect("read before the corrupt batch");
                assert_eq!(&slice.slice.expect("batch").read_to_vec().expect("bytes"), bytes, "{context}");
            }
            // Every other segment is intact and readable.
            let rest: Vec<_> = batches.iter().filter(|(o, _)| *o >= bases[1]).cloned().collect();
            assert_eq!(read_all(&log, bases[1]), rest, "{context}: later segments");
            // ListOffsets by a timestamp of the corrupt batch does not answer from bad data.
            let header = BatchHeader::parse(&batches[victim].1).expect("header");
            let earlier_max = batches[..victim]
                .iter()
                .map(|(_, b)| BatchHeader::parse(b).expect("header").max_timestamp)
                .max()
                .unwrap_or(i64::MIN);
            if header.max_timestamp > earlier_max {
                let found = log.offset_for_timestamp(header.max_timestamp);
                assert!(found.is_err(), "{context}: offset_for_timestamp over the corrupt batch gave {found:?}");
            }
            // The same holds on a second attempt: the corruption is not forgotten.
            assert!(is_corrupt_segment(&log.read(victim_offset, 1 << 20, i64::MAX)), "{context}: read again");
            assert!(is_corrupt_segment(&log.verify()), "{context}: verify again");
        }
    }
}

#[test]
fn given_flipped_base_offset_in_last_batch_of_closed_segment_when_verified_should_report_corrupt_segment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let batches = write_log(dir.path(), 60, true);
    let log = open(dir.path(), small_segments(), clock(), clean());
    let bases = log.segment_base_offsets();
    let positions = positions_in_segments(&log, &batches);
    drop(log);
    let last_of_first = (0..batches.len()).rev().find(|i| positions[*i].0 == bases[0]).expect("a batch");
    // Moves the batch's offsets up by 2^26: past the next segment, but still in order within its own.
    flip_byte(&segment_path(dir.path(), bases[0], "log"), positions[last_of_first].1 + 4, 0x04);
    let log = open(dir.path(), small_segments(), clock(), clean());
    match log.verify() {
        Err(StorageError::CorruptSegment { path, position, .. }) => {
            assert_eq!(path, segment_path(dir.path(), bases[0], "log"));
            assert_eq!(position, positions[last_of_first].1);
        }
        other => panic!("verify() gave {other:?}"),
    }
    assert_eq!(read_all(&log, bases[1]), batches[last_of_first + 1..], "the other segments stay readable");
}

#[test]
fn given_base_offset_flipped_downwards_in_closed_segment_when_read_should_report_the_batches_out_of_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let batches = write_log(dir.path(), 60, true);
    let log = open(dir.path(), small_segments(), clock(), clean());
    let bases = log.segment_base_offsets();
    let positions = positions_in_segments(&log, &batches);
    drop(log);
    let in_first: Vec<usize> = (0..batches.len()).filter(|i| positions[*i].0 == bases[0]).collect();
    let victim = in_first[in_first.len() / 2];
    // Clear the lowest set bit of the base offset: the batch now starts inside the one before it.
    let base = batches[victim].0;
    assert!(base > 0 && base < 256);
    flip_byte(&segment_path(dir.path(), bases[0], "log"), positions[victim].1 + 7, (base & -base) as u8);
    let log = open(dir.path(), small_segments(), clock(), clean());
    // Either of the two batches may be the damaged one, so neither is served.
    let previous = victim - 1;
    match log.verify() {
        Err(StorageError::CorruptSegment { position, .. }) => assert_eq!(position, positions[previous].1),
        other => panic!("verify() gave {other:?}"),
    }
    let from_start = log.read(0, 1 << 20, i64::MAX).expect("read from the start").slice.expect("data");
    assert_eq!(from_start.next_offset, batches[previous].0, "served up to the out-of-order pair");
    assert!(is_corrupt_segment(&log.read(batches[previous].0, 1 << 20, i64::MAX)));
    assert_eq!(read_all(&log, bases[1]), batches.iter().filter(|(o, _)| *o >= bases[1]).cloned().collect::<Vec<_>>());
}

// ---- (d) lost or garbage indexes ----

/// Damage done to an index file after a clean shutdown.
#[derive(Debug, Clone, Copy)]
enum IndexDamage {
    Missing,
    Empty,
    ZeroFilled,
    RandomBytes,
    CutMidEntry,
}

fn damage(path: &Path, how: IndexDamage) {
    let len = std::fs::metadata(path).expect("stat").len() as usize;
    match how {
        IndexDamage::Missing => std::fs::remove_file(path).expect("rm"),
        IndexDamage::Empty => std::fs::write(path, []).expect("truncate"),
        IndexDamage::ZeroFilled => std::fs::write(path, vec![0u8; len.max(48)]).expect("zero"),
        IndexDamage::RandomBytes => {
            let mut x = 0x2545_F491_4F6C_DD1Du64 ^ len as u64;
            let garbage: Vec<u8> = (0..len.max(48))
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            std::fs::write(path, garbage).expect("garbage");
        }
        IndexDamage::CutMidEntry => {
            let bytes = std::fs::read(path).expect("read");
            std::fs::write(path, &bytes[..len.saturating_sub(3)]).expect("cut");
        }
    }
}

#[test]
fn given_missing_or_garbage_index_files_when_reopened_should_rebuild_them_and_answer_correctly() {
    let damages = [
        IndexDamage::Missing,
        IndexDamage::Empty,
        IndexDamage::ZeroFilled,
        IndexDamage::RandomBytes,
        IndexDamage::CutMidEntry,
    ];
    // One cleanly shut down log, copied for each case.
    let template = tempfile::tempdir().expect("tempdir");
    let batches = write_log_with(template.path(), larger_segments(), 120, true);
    let bases = open(template.path(), larger_segments(), clock(), clean()).segment_base_offsets();
    assert!(bases.len() >= 3, "several segments: {bases:?}");
    for how in damages {
        for exts in [&["index"][..], &["timeindex"][..], &["index", "timeindex"][..]] {
            for reopen in [clean(), unclean(), OpenOptions { recovery_point: Some(i64::MAX), ..unclean() }] {
                let context = format!("{how:?} {exts:?}, reopened {reopen:?}");
                for shutdown_cleanly in [true, false] {
                    let context = format!("{context}, then shut down cleanly: {shutdown_cleanly}");
                    let dir = tempfile::tempdir().expect("tempdir");
                    for entry in std::fs::read_dir(template.path()).expect("ls") {
                        let entry = entry.expect("entry");
                        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).expect("copy");
                    }
                    // Damage every segment but the first, closed ones and the active one.
                    for base in &bases[1..] {
                        let base = *base;
                        for ext in exts {
                            damage(&segment_path(dir.path(), base, ext), how);
                        }
                    }
                    let log = open(dir.path(), larger_segments(), clock(), reopen);
                    assert_serves_exactly(&log, &batches, &context);
                    if shutdown_cleanly {
                        log.close().expect("close");
                    }
                    drop(log);
                    // What the rebuild wrote is trusted by the next open, so it must be right too:
                    // after a crash, segments below the recovery point are not scanned again.
                    let again = if shutdown_cleanly {
                        clean()
                    } else {
                        OpenOptions { recovery_point: Some(i64::MAX), ..unclean() }
                    };
                    let log = open(dir.path(), larger_segments(), clock(), again);
                    assert_serves_exactly(&log, &batches, &format!("{context}, reopened"));
                    let end = log.log_end_offset();
                    let info = log.append(&mut records(1, 10, T0 + 999_999, 3), 1).expect("append");
                    assert_eq!(info.first_offset, end, "{context}: appends continue at the log end");
                }
            }
        }
    }
}

#[test]
fn given_clean_shutdown_when_reopened_should_find_timestamps_written_after_the_last_index_entry() {
    // A single segment with fewer bytes than one index interval: no index entry was ever written,
    // so only what close() leaves in the time index tells the segment's largest timestamp.
    let dir = tempfile::tempdir().expect("tempdir");
    let log = open(dir.path(), config(&[]), clock(), unclean());
    let batches = append_batches(&log, 5);
    log.close().expect("close");
    drop(log);
    let log = open(dir.path(), config(&[]), clock(), clean());
    assert_serves_exactly(&log, &batches, "after a clean shutdown");
}

#[test]
fn given_recovered_closed_segments_when_reopened_later_should_still_know_their_largest_timestamps() {
    // An unclean shutdown recovers every segment (rebuilding its indexes); a later restart trusts
    // those indexes without scanning, so recovery must leave them complete.
    let dir = tempfile::tempdir().expect("tempdir");
    let batches = write_log(dir.path(), 60, false);
    let log = open(dir.path(), small_segments(), clock(), unclean());
    assert_serves_exactly(&log, &batches, "after recovery");
    drop(log);
    let log = open(dir.path(), small_segments(), clock(), OpenOptions { recovery_point: Some(i64::MAX), ..unclean() });
    assert_serves_exactly(&log, &batches, "reopened with a recovery point past the recovered segments");
    log.close().expect("close");
    drop(log);
    let log = open(dir.path(), small_segments(), clock(), clean());
    assert_serves_exactly(&log, &batches, "reopened after a clean shutdown");
}

// ---- (e) sound indexes are kept ----

fn index_rebuilds(log: &Log) -> u64 {
    log.stats.index_rebuilds.load(Ordering::Relaxed)
}

/// How one run of the process ends, and so how the next one opens its logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunEnd {
    CleanShutdown,
    /// The process dies (kill -9), the machine keeps its page cache: logs are dropped unclosed,
    /// their active indexes still preallocated, and reopened with `page_cache_survived`.
    ProcessCrash {
        from_recovery_point: bool,
    },
    /// As a process crash, reopened without `page_cache_survived`: recovery rescans (and
    /// rebuilds, as part of recovery) what follows the recovery point.
    MachineCrash {
        from_recovery_point: bool,
    },
}

impl RunEnd {
    fn reopen_options(self, recovery_point: i64) -> OpenOptions {
        let (page_cache_survived, from_recovery_point) = match self {
            RunEnd::CleanShutdown => return clean(),
            RunEnd::ProcessCrash { from_recovery_point } => (true, from_recovery_point),
            RunEnd::MachineCrash { from_recovery_point } => (false, from_recovery_point),
        };
        OpenOptions { page_cache_survived, recovery_point: from_recovery_point.then_some(recovery_point), ..unclean() }
    }
}

/// One partition's log across runs of the process.
struct Partition {
    dir: PathBuf,
    batches_per_run: usize,
    /// Everything appended so far.
    batches: Vec<(i64, Vec<u8>)>,
    /// How the next run opens it, as the last one ended.
    reopen: OpenOptions,
}

impl Partition {
    /// Opens the log as the next run does and checks that it serves everything appended and
    /// loaded every index of every segment (the checks read them all) without a rebuild.
    fn open_and_check(&self, context: &str) -> Log {
        let context = format!("{}, {context}, opened {:?}", self.dir.display(), self.reopen);
        let log = open(&self.dir, small_segments(), clock(), self.reopen);
        assert_serves_exactly(&log, &self.batches, &context);
        assert_eq!(index_rebuilds(&log), 0, "{context}: a sound index was rebuilt");
        log
    }
}

#[test]
fn given_sound_indexes_when_reopened_after_a_clean_shutdown_or_a_crash_should_keep_them() {
    // Partitions shaped as a broker has them: several segments with index entries in each; a few
    // batches and no index entry yet (most `__consumer_offsets` partitions); no batch at all.
    let root = tempfile::tempdir().expect("tempdir");
    let mut partitions: Vec<Partition> = [40, 2, 0]
        .into_iter()
        .enumerate()
        .map(|(p, n)| Partition {
            dir: root.path().join(format!("topic-{p}")),
            batches_per_run: n,
            batches: Vec::new(),
            reopen: unclean(),
        })
        .collect();
    let ends = [
        RunEnd::CleanShutdown,
        RunEnd::ProcessCrash { from_recovery_point: true },
        RunEnd::ProcessCrash { from_recovery_point: false },
        RunEnd::CleanShutdown,
        RunEnd::MachineCrash { from_recovery_point: true },
        RunEnd::ProcessCrash { from_recovery_point: true },
        RunEnd::MachineCrash { from_recovery_point: false },
        RunEnd::ProcessCrash { from_recovery_point: false },
    ];
    for (run, end) in ends.into_iter().enumerate() {
        for partition in &mut partitions {
            let log = partition.open_and_check(&format!("run {run}"));
            // New batches each run, so the active segment gets index entries of this process.
            let from = partition.batches.len();
            partition.batches.extend(append_batch_range(&log, from..from + partition.batches_per_run));
            if end == RunEnd::CleanShutdown {
                log.close().expect("close");
            }
            // Otherwise dropped unclosed: a crash.
            partition.reopen = end.reopen_options(log.recovery_point());
        }
    }
    for partition in &partitions {
        partition.open_and_check("after the last run");
    }
}

#[test]
fn given_an_active_segment_indexed_again_when_the_process_crashes_should_not_count_stale_entries() {
    // One active segment, an offset-index entry every other batch. Each rewrite below leaves
    // fewer entries than there were: the old entries after them must not pass for entries when
    // a crash leaves the file preallocated.
    let interval = |bytes: &str| {
        config(&[("segment.bytes", "1048576"), ("index.interval.bytes", bytes), ("segment.index.bytes", "4096")])
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let log = open(dir.path(), interval("1000"), clock(), unclean());
    let append = |log: &Log, from: usize, n: usize, value_bytes: usize| -> Vec<(i64, Vec<u8>)> {
        (from..from + n)
            .map(|i| {
                let mut bytes = records(1, value_bytes, timestamp_of_batch(i), i as u8);
                (log.append(&mut bytes, 1).expect("append").first_offset, bytes)
            })
            .collect()
    };
    let mut batches = append(&log, 0, 40, 450);
    // A follower truncating to its leader, then larger batches: fewer entries over the same bytes.
    log.truncate_to(10).expect("truncate");
    batches.truncate(10);
    batches.extend(append(&log, 10, 24, 520));
    drop(log);
    let process_crash = OpenOptions { page_cache_survived: true, ..unclean() };
    let log = open(dir.path(), interval("1000"), clock(), process_crash);
    assert_serves_exactly(&log, &batches, "truncated, then crashed");
    assert_eq!(index_rebuilds(&log), 0, "truncated, then crashed: a sound index was rebuilt");
    drop(log);
    // A machine crash: recovery indexes the segment again, here at a wider interval.
    let log = open(dir.path(), interval("3000"), clock(), unclean());
    assert_serves_exactly(&log, &batches, "recovered at a wider interval");
    drop(log);
    let log = open(dir.path(), interval("3000"), clock(), process_crash);
    assert_serves_exactly(&log, &batches, "recovered at a wider interval, then crashed");
    assert_eq!(index_rebuilds(&log), 0, "recovered at a wider interval, then crashed: a sound index was rebuilt");
}

/// Makes the second entry of an index file go backwards (its first field, the key, smaller than
/// the first entry's): plausible-looking bytes that break the invariant.
fn swap_first_two_entries(path: &Path, entry_bytes: usize) {
    let mut bytes = std::fs::read(path).expect("read index");
    let entry_is_set =
        |i: usize| bytes.get(i * entry_bytes..(i + 1) * entry_bytes).is_some_and(|e| e.iter().any(|b| *b != 0));
    assert!(entry_is_set(0) && entry_is_set(1), "{} has two entries", path.display());
    let (first, rest) = bytes.split_at_mut(entry_bytes);
    first.swap_with_slice(&mut rest[..entry_bytes]);
    std::fs::write(path, bytes).expect("write index");
}

#[test]
fn given_a_broken_offset_or_time_index_when_reopened_should_rebuild_that_one_segment() {
    for (ext, entry_bytes) in [("index", 8), ("timeindex", 12)] {
        for end in [RunEnd::CleanShutdown, RunEnd::ProcessCrash { from_recovery_point: true }] {
            let dir = tempfile::tempdir().expect("tempdir");
            let batches = write_log_with(dir.path(), larger_segments(), 130, end == RunEnd::CleanShutdown);
            let mut bases: Vec<i64> = std::fs::read_dir(dir.path())
                .expect("ls")
                .filter_map(|e| e.expect("entry").file_name().to_str()?.strip_suffix(".log")?.parse().ok())
                .collect();
            bases.sort_unstable();
            assert!(bases.len() >= 3, "several segments: {bases:?}");
            // A closed segment's index, and after the crash also the active one's, which is
            // still preallocated with a zero-filled tail.
            let mut damaged = vec![bases[1]];
            if end != RunEnd::CleanShutdown {
                damaged.push(*bases.last().expect("active"));
            }
            for base in &damaged {
                swap_first_two_entries(&segment_path(dir.path(), *base, ext), entry_bytes);
            }
            let context = format!("{ext} of segments {damaged:?} broken, reopened after {end:?}");
            // The recovery point a checkpoint could hold: the closed segments were flushed.
            let recovery_point = *bases.last().expect("active");
            let log = open(dir.path(), larger_segments(), clock(), end.reopen_options(recovery_point));
            assert_serves_exactly(&log, &batches, &context);
            assert_eq!(index_rebuilds(&log), damaged.len() as u64, "{context}");
        }
    }
}

// ---- (f) garbage handed to append ----

fn assert_refused(log: &Log, mut bytes: Vec<u8>, what: &str) -> BatchError {
    let (end, size) = (log.log_end_offset(), log.size_bytes());
    let error = match log.append(&mut bytes, 0) {
        Err(StorageError::Batch(e)) => e,
        other => panic!("{what}: expected a batch error, got {other:?}"),
    };
    assert_eq!((log.log_end_offset(), log.size_bytes()), (end, size), "{what}: the log is untouched");
    error
}

/// Overwrites a header field and recomputes the CRC, so that the checks behind the CRC are reached.
fn with_field(mut bytes: Vec<u8>, at: usize, value: &[u8]) -> Vec<u8> {
    bytes[at..at + value.len()].copy_from_slice(value);
    fix_crc(&mut bytes);
    bytes
}

fn fix_crc(bytes: &mut [u8]) {
    if bytes.len() >= batch::HEADER_BYTES {
        let crc = crc32c::crc32c(&bytes[batch::ATTRIBUTES_AT..]);
        bytes[batch::CRC_AT..batch::CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    }
}

type ErrorCheck = dyn Fn(&BatchError) -> bool;

#[test]
fn given_malformed_batches_when_appended_should_refuse_each_with_a_typed_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = open(dir.path(), config(&[("max.message.bytes", "100000")]), clock(), unclean());
    let good = records(3, 20, T0, 1);
    log.append(&mut good.clone(), 0).expect("a good batch first");
    let corrupt = |e: &BatchError| matches!(e, BatchError::Corrupt(_));
    let invalid = |e: &BatchError| matches!(e, BatchError::Invalid(_));
    let cases: Vec<(&str, Vec<u8>, &ErrorCheck)> = vec![
        ("nothing", vec![], &invalid),
        ("a few random bytes", vec![0xde, 0xad, 0xbe, 0xef], &corrupt),
        ("a truncated header", good[..30].to_vec(), &corrupt),
        ("a truncated batch", good[..good.len() - 1].to_vec(), &corrupt),
        ("a batch with trailing garbage", [&good[..], &[1, 2, 3]].concat(), &corrupt),
        ("a good batch then a truncated one", [&good[..], &good[..good.len() / 2]].concat(), &corrupt),
        ("a negative length", with_field(good.clone(), batch::LENGTH_AT, &(-1i32).to_be_bytes()), &corrupt),
        ("a zero length", with_field(good.clone(), batch::LENGTH_AT, &0i32.to_be_bytes()), &corrupt),
        ("a length past the buffer", with_field(good.clone(), batch::LENGTH_AT, &5000i32.to_be_bytes()), &corrupt),
        (
            "a length past max.message.bytes",
            with_field(good.clone(), batch::LENGTH_AT, &i32::MAX.to_be_bytes()),
            &|e| matches!(e, BatchError::TooLarge { .. }),
        ),
        ("magic 0", with_field(good.clone(), batch::MAGIC_AT, &[0]), &|e| *e == BatchError::UnsupportedMagic(0)),
        ("magic 1", with_field(good.clone(), batch::MAGIC_AT, &[1]), &|e| *e == BatchError::UnsupportedMagic(1)),
        ("magic -1", with_field(good.clone(), batch::MAGIC_AT, &[0xff]), &|e| *e == BatchError::UnsupportedMagic(-1)),
        (
            "a flipped record byte",
            {
                let mut b = good.clone();
                let n = b.len();
                b[n - 5] ^= 0x01;
                b
            },
            &corrupt,
        ),
        ("zero records", with_field(good.clone(), batch::RECORDS_COUNT_AT, &0i32.to_be_bytes()), &invalid),
        (
            "a negative record count",
            with_field(good.clone(), batch::RECORDS_COUNT_AT, &(-3i32).to_be_bytes()),
            &invalid,
        ),
        (
            "a record count beyond the records",
            with_field(good.clone(), batch::RECORDS_COUNT_AT, &4i32.to_be_bytes()),
            &|e| matches!(e, BatchError::Invalid(_) | BatchError::Corrupt(_)),
        ),
        (
            "a lastOffsetDelta disagreeing with the count",
            with_field(good.clone(), batch::LAST_OFFSET_DELTA_AT, &7i32.to_be_bytes()),
            &invalid,
        ),
        (
            "a negative lastOffsetDelta",
            with_field(good.clone(), batch::LAST_OFFSET_DELTA_AT, &(-1i32).to_be_bytes()),
            &invalid,
        ),
        ("an unknown compression codec", with_field(good.clone(), batch::ATTRIBUTES_AT, &7i16.to_be_bytes()), &invalid),
        (
            "garbage records with a valid CRC",
            {
                let mut b = good.clone();
                for byte in &mut b[batch::HEADER_BYTES..] {
                    *byte = 0xff;
                }
                fix_crc(&mut b);
                b
            },
            &|e| matches!(e, BatchError::Invalid(_) | BatchError::Corrupt(_)),
        ),
    ];
    for (what, bytes, expected) in cases {
        let error = assert_refused(&log, bytes, what);
        assert!(expected(&error), "{what}: unexpected error {error:?}");
    }
    assert_serves_exactly(
        &log,
        &[(0, {
            let mut g = good.clone();
            batch::assign_offsets(&mut g, 0, 0, None);
            g
        })],
        "after the refusals",
    );
}

/// A valid batch, then damage: byte flips, a cut, and sometimes a recomputed CRC so the damage
/// reaches the checks behind the CRC.
fn damaged_batch() -> impl Strategy<Value = Vec<u8>> {
    (
        1usize..5,
        0usize..40,
        prop_oneof![Just(Compression::None), Just(Compression::Gzip), Just(Compression::Lz4)],
        proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..4),
        proptest::option::of(any::<prop::sample::Index>()),
        any::<bool>(),
    )
        .prop_map(|(n, value_bytes, compression, flips, cut, recompute_crc)| {
            let mut bytes =
                batch(&BatchSpec { records: n, value_bytes, compression, timestamp: T0, ..Default::default() });
            for (at, mask) in flips {
                let i = at.index(bytes.len());
                bytes[i] ^= mask;
            }
            if let Some(cut) = cut {
                bytes.truncate(cut.index(bytes.len()));
            }
            if recompute_crc {
                fix_crc(&mut bytes);
            }
            bytes
        })
}

fn check_append_of_arbitrary_bytes(log: &Log, bytes: Vec<u8>) -> Result<(), TestCaseError> {
    let (end, size) = (log.log_end_offset(), log.size_bytes());
    let valid = validate_batches(&bytes, 1 << 20).is_ok();
    let mut appended = bytes.clone();
    match log.append(&mut appended, 0) {
        Ok(info) => {
            prop_assert!(valid, "append accepted what validate_batches refuses");
            prop_assert_eq!(info.first_offset, end);
            prop_assert_eq!(log.size_bytes(), size + bytes.len() as u64);
            let slice = log.read(info.first_offset, 1 << 20, i64::MAX).expect("read").slice.expect("data");
            prop_assert_eq!(slice.read_to_vec().expect("bytes"), appended);
            log.verify().expect("verify");
        }
        Err(StorageError::Batch(_)) => {
            prop_assert!(!valid, "append refused a valid batch");
            prop_assert_eq!((log.log_end_offset(), log.size_bytes()), (end, size), "log untouched");
        }
        // A damaged producer id or sequence still gives an intact batch that the producer
        // rules may refuse; the log must be untouched then too.
        Err(StorageError::Producer(_)) => {
            prop_assert_eq!((log.log_end_offset(), log.size_bytes()), (end, size), "log untouched");
        }
        Err(other) => prop_assert!(false, "not a batch error: {other:?}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn given_random_bytes_when_appended_should_return_a_typed_error_and_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = open(dir.path(), config(&[("segment.index.bytes", "4096")]), clock(), unclean());
        check_append_of_arbitrary_bytes(&log, bytes)?;
    }

    #[test]
    fn given_damaged_batches_when_appended_should_refuse_or_store_them_intact_and_never_panic(
        damaged in proptest::collection::vec(damaged_batch(), 1..4),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = open(dir.path(), config(&[("segment.index.bytes", "4096")]), clock(), unclean());
        for bytes in damaged {
            check_append_of_arbitrary_bytes(&log, bytes)?;
        }
        // Whatever was accepted survives an unclean restart unchanged.
        let before = read_all(&log, 0);
        drop(log);
        let log = open(dir.path(), config(&[("segment.index.bytes", "4096")]), clock(), unclean());
        prop_assert_eq!(log.stats.recovered_truncated_bytes.load(Ordering::Relaxed), 0);
        prop_assert_eq!(read_all(&log, 0), before);
    }
}

/// The entries of an index file left preallocated by a crash: up to its zero-filled tail.
fn written_entries(path: &Path, entry_bytes: usize) -> usize {
    let bytes = std::fs::read(path).expect("read index");
    bytes.chunks(entry_bytes).take_while(|e| e.len() == entry_bytes && e.iter().any(|b| *b != 0)).count()
}

#[test]
fn given_a_process_killed_between_an_offset_and_a_time_index_entry_should_keep_the_largest_timestamp() {
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = [("segment.bytes", "1048576"), ("index.interval.bytes", "1000"), ("segment.index.bytes", "4096")];
    let log = open(dir.path(), config(&settings), clock(), unclean());
    let (index, time_index) = (segment_path(dir.path(), 0, "index"), segment_path(dir.path(), 0, "timeindex"));
    // Timestamps grow for 12 batches, then older ones follow until the next offset-index entry:
    // that entry's time-index entry is the one carrying the largest timestamp.
    let largest = T0 + 11 * 100;
    for i in 0..12 {
        log.append(&mut records(1, 450, T0 + i * 100, i as u8), 1).expect("append");
    }
    let entries = written_entries(&index, 8);
    let mut i = 12;
    while written_entries(&index, 8) == entries {
        log.append(&mut records(1, 450, T0, i as u8), 1).expect("append");
        i += 1;
        assert!(i < 40, "no new offset-index entry");
    }
    drop(log); // a process crash: nothing is closed

    // The kill came after the offset-index entry, before its time-index entry.
    let mut bytes = std::fs::read(&time_index).expect("read time index");
    let last = written_entries(&time_index, 12).checked_sub(1).expect("a time-index entry");
    assert_eq!(i64::from_be_bytes(bytes[last * 12..last * 12 + 8].try_into().unwrap()), largest);
    bytes[last * 12..last * 12 + 12].fill(0);
    std::fs::write(&time_index, bytes).expect("write time index");

    // Only the process died: recovery reads the headers after the last index entries.
    let options = OpenOptions { page_cache_survived: true, recovery_point: Some(0), ..unclean() };
    let log = open(dir.path(), config(&settings), clock(), options);
    assert_eq!(
        log.offset_for_timestamp(largest).expect("lookup"),
        Some(TimestampOffset { timestamp: largest, offset: 11 })
    );
    assert_eq!(log.max_timestamp_offset().expect("max"), Some(TimestampOffset { timestamp: largest, offset: 11 }));
}
