//! Behaviour of one partition log: append, read, roll, reopen, truncate, retention.

mod common;

use std::sync::Arc;

use common::*;
use weir_storage::batch::BatchHeader;
use weir_storage::{ManualClock, OpenOptions, StorageError};

#[test]
fn given_appends_when_read_back_should_return_same_bytes_with_assigned_offsets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let log = open(dir.path(), config(&[]), clock, OpenOptions::default());
    let mut expected = Vec::new();
    for i in 0..20u8 {
        let mut b = records(1 + i as usize % 4, 100, T0, i);
        let info = log.append(&mut b, 3).expect("append");
        assert_eq!(info.first_offset, expected.iter().map(|(_, n)| *n as i64).sum::<i64>());
        expected.push((b, 1 + i as usize % 4));
    }
    let all = read_all(&log, 0);
    assert_eq!(all.len(), 20);
    for ((_, got), (want, _)) in all.iter().zip(&expected) {
        assert_eq!(got, want);
        assert_eq!(BatchHeader::parse(got).expect("header").partition_leader_epoch, 3);
    }
    assert_eq!(log.log_end_offset(), 50);
}

#[test]
fn given_offset_inside_batch_when_read_should_start_at_that_batch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = open(dir.path(), config(&[]), Arc::new(ManualClock::new(T0)), OpenOptions::default());
    for _ in 0..5 {
        log.append(&mut records(10, 10, T0, 1), 0).expect("append");
    }
    let slice = log.read(25, 1, i64::MAX).expect("read").slice.expect("data");
    assert_eq!(slice.first_offset, 20);
    assert_eq!(slice.next_offset, 30, "max_bytes=1 still returns one whole batch");
    let none = log.read_with(25, 1, i64::MAX, false).expect("read").slice;
    assert!(none.is_none(), "without min-one-batch nothing fits in 1 byte");
    let bounded = log.read(0, 1 << 20, 30).expect("read").slice.expect("data");
    assert_eq!(bounded.next_offset, 30, "never past the upper bound");
    assert!(log.read(50, 1 << 20, i64::MAX).expect("read at end").slice.is_none());
    match log.read(51, 100, i64::MAX) {
        Err(StorageError::OffsetOutOfRange { log_start_offset: 0, log_end_offset: 50, .. }) => {}
        other => panic!("expected out of range, got {other:?}"),
    }
}

#[test]
fn given_small_segment_bytes_when_appending_should_roll_and_read_across_segments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = open(
        dir.path(),
        config(&[("segment.bytes", "4096"), ("index.interval.bytes", "200")]),
        Arc::new(ManualClock::new(T0)),
        OpenOptions::default(),
    );
    for i in 0..100u8 {
        log.append(&mut records(2, 100, T0 + i64::from(i), i), 0).expect("append");
    }
    assert!(log.segment_count() > 5, "rolled into {} segments", log.segment_count());
    let bases = log.segment_base_offsets();
    for base in &bases {
        assert!(dir.path().join(format!("{base:020}.log")).exists());
        assert!(dir.path().join(format!("{base:020}.index")).exists());
        assert!(dir.path().join(format!("{base:020}.timeindex")).exists());
    }
    assert_eq!(read_all(&log, 0).len(), 100);
    for target in [0, 1, 57, 198, 199] {
        let slice = log.read(target, 1, i64::MAX).expect("read").slice.expect("data");
        assert_eq!(slice.first_offset, target - target % 2);
    }
}

#[test]
fn given_segment_ms_when_time_passes_should_roll() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let log = open(dir.path(), config(&[("segment.ms", "1000")]), Arc::clone(&clock), OpenOptions::default());
    log.append(&mut records(1, 10, T0, 0), 0).expect("append");
    clock.advance_ms(500);
    log.append(&mut records(1, 10, T0 + 500, 0), 0).expect("append");
    assert_eq!(log.segment_count(), 1);
    clock.advance_ms(1000);
    log.append(&mut records(1, 10, T0 + 1500, 0), 0).expect("append");
    assert_eq!(log.segment_base_offsets(), vec![0, 2]);
}

#[test]
fn given_old_producer_timestamps_when_appending_should_not_roll_every_batch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0 + 365 * 24 * 3600 * 1000));
    let log = open(dir.path(), config(&[("segment.ms", "60000")]), Arc::clone(&clock), OpenOptions::default());
    for i in 0..10u8 {
        // A year-old CreateTime, as when a producer replays history.
        log.append(&mut records(1, 10, T0, i), 0).expect("append");
    }
    assert_eq!(log.segment_count(), 1, "age is measured from the segment's creation");
    clock.advance_ms(61_000);
    log.append(&mut records(1, 10, T0, 0), 0).expect("append");
    assert_eq!(log.segment_count(), 2, "segment.ms still rolls it");
}

#[test]
fn given_clean_close_when_reopened_should_keep_everything_and_trim_indexes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let cfg = config(&[("segment.bytes", "8192"), ("index.interval.bytes", "100")]);
    let before = {
        let log = open(dir.path(), cfg.clone(), Arc::clone(&clock), OpenOptions::default());
        for i in 0..60u8 {
            log.append(&mut records(3, 150, T0 + i64::from(i) * 10, i), 0).expect("append");
        }
        let all = read_all(&log, 0);
        log.close().expect("close");
        all
    };
    for entry in std::fs::read_dir(dir.path()).expect("ls") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "index") {
            assert_eq!(std::fs::metadata(&path).expect("stat").len() % 8, 0);
            assert!(std::fs::metadata(&path).expect("stat").len() < 10 << 20, "trimmed");
        }
    }
    let log = open(dir.path(), cfg, clock, OpenOptions { clean_shutdown: true, ..Default::default() });
    assert_eq!(log.log_end_offset(), 180);
    assert_eq!(read_all(&log, 0), before);
    let at = log.offset_for_timestamp(T0 + 305).expect("lookup").expect("found");
    assert_eq!(
        at.offset, 93,
        "batch 30 (offsets 90..92) has timestamps T0+300..302; batch 31 starts at 93 with T0+310"
    );
    log.append(&mut records(1, 10, T0, 0), 0).expect("append after reopen");
    assert_eq!(log.log_end_offset(), 181);
}

#[test]
fn given_unclean_shutdown_with_garbage_tail_when_reopened_should_truncate_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let before = {
        let log = open(dir.path(), config(&[]), Arc::clone(&clock), OpenOptions::default());
        for i in 0..10u8 {
            log.append(&mut records(2, 50, T0, i), 0).expect("append");
        }
        read_all(&log, 0)
        // dropped without close: an unclean shutdown
    };
    let path = dir.path().join(format!("{:020}.log", 0));
    let mut bytes = std::fs::read(&path).expect("read");
    let half = before[3].1.len() / 2;
    bytes.extend_from_slice(&before[3].1[..half]);
    std::fs::write(&path, &bytes).expect("write torn tail");
    let log = open(dir.path(), config(&[]), clock, OpenOptions::default());
    assert_eq!(log.log_end_offset(), 20);
    assert_eq!(read_all(&log, 0), before);
    assert_eq!(log.stats.recovered_truncated_bytes.load(std::sync::atomic::Ordering::Relaxed), half as u64);
}

#[test]
fn given_truncate_to_when_appending_again_should_continue_from_cut() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log =
        open(dir.path(), config(&[("segment.bytes", "2048")]), Arc::new(ManualClock::new(T0)), OpenOptions::default());
    for i in 0..40u8 {
        log.append(&mut records(2, 100, T0, i), 0).expect("append");
    }
    assert_eq!(log.truncate_to(31).expect("truncate"), 30, "cut at the batch holding 31");
    assert_eq!(log.log_end_offset(), 30);
    assert_eq!(read_all(&log, 0).len(), 15);
    let info = log.append(&mut records(1, 10, T0, 9), 0).expect("append");
    assert_eq!(info.first_offset, 30);
    assert_eq!(log.truncate_to(0).expect("truncate all"), 0);
    assert_eq!(log.log_end_offset(), 0);
    assert_eq!(log.append(&mut records(1, 10, T0, 9), 0).expect("append").first_offset, 0);
}

/// Reads of one batch at a time, each going on where the last ended (as a consumer reads),
/// from `from` to the log end: (base offset, bytes) per batch.
fn read_stepwise(log: &weir_storage::Log, from: i64, in_memory: bool) -> Vec<(i64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut next = from;
    loop {
        let result = if in_memory {
            log.read_in_memory(next, 1, i64::MAX, true)
        } else {
            log.read_with(next, 1, i64::MAX, true)
        };
        let Some(slice) = result.expect("read").slice else { break };
        let bytes = slice.read_to_vec().expect("read slice");
        out.extend(weir_storage::batch::headers(&bytes).map(|(at, header)| {
            let size = header.size_bytes().expect("size");
            (header.base_offset, bytes[at..at + size].to_vec())
        }));
        next = slice.next_offset;
    }
    out
}

#[test]
fn given_reads_going_on_where_they_ended_when_the_log_is_cut_and_rewritten_should_read_what_it_holds() {
    let dir = tempfile::tempdir().expect("tempdir");
    // One index entry per MiB: a read that does not start where one ended scans from the start.
    let log = open(
        dir.path(),
        config(&[("index.interval.bytes", "1048576")]),
        Arc::new(ManualClock::new(T0)),
        OpenOptions::default(),
    );
    for i in 0..30u8 {
        log.append(&mut records(2, 100, T0, i), 0).expect("append");
    }
    for in_memory in [false, true] {
        assert_eq!(read_stepwise(&log, 0, in_memory), read_all(&log, 0), "in memory: {in_memory}");
    }
    // Cut in the middle and written again with batches of other sizes: the positions where
    // the reads above ended now lie inside other batches.
    assert_eq!(log.truncate_to(21).expect("truncate"), 20);
    for i in 0..8u8 {
        log.append(&mut records(3, 37 + usize::from(i), T0, 100 + i), 0).expect("append");
    }
    for in_memory in [false, true] {
        let stepwise = read_stepwise(&log, 20, in_memory);
        assert_eq!(stepwise, read_all(&log, 20), "in memory: {in_memory}");
        assert_eq!(stepwise.iter().map(|(base, _)| *base).collect::<Vec<_>>(), (20..44).step_by(3).collect::<Vec<_>>());
        for from in (20..44).step_by(3) {
            let first = log.read_in_memory(from, 1, i64::MAX, true).expect("read").slice.expect("a batch");
            assert_eq!(first.first_offset, from, "the batch at {from}");
        }
    }
}

#[test]
fn given_delete_records_when_reading_below_should_be_out_of_range() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log =
        open(dir.path(), config(&[("segment.bytes", "2048")]), Arc::new(ManualClock::new(T0)), OpenOptions::default());
    for i in 0..40u8 {
        log.append(&mut records(2, 100, T0, i), 0).expect("append");
    }
    let segments_before = log.segment_count();
    assert_eq!(log.delete_records_before(45).expect("delete"), 45);
    assert!(log.segment_count() < segments_before);
    assert!(matches!(log.read(44, 100, i64::MAX), Err(StorageError::OffsetOutOfRange { log_start_offset: 45, .. })));
    assert_eq!(log.read(45, 1, i64::MAX).expect("read").slice.expect("data").first_offset, 44);
    assert!(log.delete_records_before(81).is_err(), "beyond the high watermark");
}

#[test]
fn given_retention_ms_when_segments_expire_should_delete_oldest_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let log = open(
        dir.path(),
        config(&[("segment.bytes", "1024"), ("retention.ms", "10000"), ("file.delete.delay.ms", "0")]),
        Arc::clone(&clock),
        OpenOptions::default(),
    );
    for i in 0..30i64 {
        log.append(&mut records(1, 200, T0 + i * 1000, 0), 0).expect("append");
    }
    clock.set_ms(T0 + 29_000);
    let outcome = log.apply_retention().expect("retention");
    assert!(outcome.deleted_segments > 0);
    // Every remaining non-active segment holds a timestamp within retention.
    let first = log.log_start_offset();
    assert!((15..=20).contains(&first), "log start {first}");
    let oldest = log.read(first, 1, i64::MAX).expect("read").slice.expect("data");
    assert_eq!(oldest.first_offset, first);
    assert!(std::fs::read_dir(dir.path()).expect("ls").any(|e| e
        .expect("e")
        .file_name()
        .to_string_lossy()
        .ends_with(".deleted")));
    clock.set_ms(T0 + 1_000_000);
    log.apply_retention().expect("retention");
    assert_eq!(log.log_start_offset(), 30, "everything expired: rolled and deleted");
    assert_eq!(log.log_end_offset(), 30);
}

#[test]
fn given_retention_bytes_should_keep_total_under_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = open(
        dir.path(),
        config(&[("segment.bytes", "1024"), ("retention.bytes", "3000"), ("retention.ms", "-1")]),
        Arc::new(ManualClock::new(T0)),
        OpenOptions::default(),
    );
    for _ in 0..40 {
        log.append(&mut records(1, 200, T0, 0), 0).expect("append");
    }
    log.apply_retention().expect("retention");
    assert!(log.size_bytes() <= 3000 + 1024, "size {}", log.size_bytes());
    assert!(log.size_bytes() > 3000 - 1024);
}

#[test]
fn given_log_append_time_config_when_appending_should_stamp_broker_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = open(
        dir.path(),
        config(&[("message.timestamp.type", "LogAppendTime")]),
        Arc::new(ManualClock::new(T0 + 5)),
        OpenOptions::default(),
    );
    let info = log.append(&mut records(3, 10, 42, 0), 0).expect("append");
    assert_eq!(info.log_append_time_ms, Some(T0 + 5));
    let (_, bytes) = &read_all(&log, 0)[0];
    assert_eq!(BatchHeader::parse(bytes).expect("header").max_timestamp, T0 + 5);
}

#[test]
fn given_corrupt_batch_when_appending_should_refuse_and_leave_log_untouched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = open(
        dir.path(),
        config(&[("max.message.bytes", "1000")]),
        Arc::new(ManualClock::new(T0)),
        OpenOptions::default(),
    );
    let mut bad = records(2, 10, T0, 0);
    let n = bad.len();
    bad[n - 2] ^= 1;
    assert!(matches!(log.append(&mut bad, 0), Err(StorageError::Batch(weir_storage::BatchError::Corrupt(_)))));
    assert!(matches!(
        log.append(&mut records(2, 2000, T0, 0), 0),
        Err(StorageError::Batch(weir_storage::BatchError::TooLarge { .. }))
    ));
    assert_eq!(log.log_end_offset(), 0);
    assert_eq!(log.size_bytes(), 0);
}

#[test]
fn given_sync_policy_when_many_appenders_should_share_fsyncs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(open(
        dir.path(),
        config(&[("flush.policy", "sync")]),
        Arc::new(ManualClock::new(T0)),
        OpenOptions::default(),
    ));
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for _ in 0..20 {
                    let info = log.append(&mut records(1, 100, T0, t), 0).expect("append");
                    log.sync_to(info.last_offset + 1).expect("sync");
                    assert!(log.recovery_point() > info.last_offset);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    let fsyncs = log.stats.fsyncs.load(std::sync::atomic::Ordering::Relaxed);
    assert!(fsyncs < 320, "group commit: {fsyncs} fsyncs for 320 appends");
    assert_eq!(log.recovery_point(), 320);
}
