//! Idempotent producers at the log: duplicates, gaps, fencing, and state that survives a clean
//! close, a crash, and segment rolls.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::{config, open, T0};
use weir_storage::testing::{encode, record};
use weir_storage::{Compression, ManualClock, OpenOptions, ProducerError, StorageError};

/// A batch of `n` records from producer `pid` at `epoch`, sequences `seq..seq+n`.
fn batch(pid: i64, epoch: i16, seq: i32, n: usize) -> Vec<u8> {
    let records: Vec<_> = (0..n)
        .map(|i| {
            let mut r = record(i as i64, T0, None, Some(Bytes::from(vec![b'v'; 100])));
            r.producer_id = pid;
            r.producer_epoch = epoch;
            r.sequence = seq + i as i32;
            r
        })
        .collect();
    encode(&records, Compression::None)
}

fn producer_error(result: weir_storage::Result<weir_storage::AppendInfo>) -> ProducerError {
    match result {
        Err(StorageError::Producer(e)) => e,
        other => panic!("expected a producer error, got {other:?}"),
    }
}

#[test]
fn resent_batches_get_their_original_offsets_and_gaps_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let log = open(dir.path(), config(&[]), clock, OpenOptions::default());
    let first = log.append(&mut batch(7, 0, 0, 3), 0).unwrap();
    assert_eq!((first.first_offset, first.last_offset, first.duplicate), (0, 2, false));
    log.append(&mut batch(-1, -1, -1, 2), 0).unwrap(); // a plain producer in between
    let second = log.append(&mut batch(7, 0, 3, 2), 0).unwrap();
    assert_eq!((second.first_offset, second.last_offset), (5, 6));
    // The first batch again (a retry after a lost response): nothing written.
    let again = log.append(&mut batch(7, 0, 0, 3), 0).unwrap();
    assert_eq!((again.first_offset, again.last_offset, again.duplicate), (0, 2, true));
    assert_eq!(log.log_end_offset(), 7);
    assert!(matches!(producer_error(log.append(&mut batch(7, 0, 9, 1), 0)), ProducerError::OutOfOrderSequence(_)));
    assert!(matches!(producer_error(log.append(&mut batch(8, 0, 4, 1), 0)), ProducerError::UnknownProducerId(_)));
    // A new epoch fences the old one.
    log.append(&mut batch(7, 1, 0, 1), 0).unwrap();
    assert!(matches!(producer_error(log.append(&mut batch(7, 0, 5, 1), 0)), ProducerError::InvalidProducerEpoch(_)));
    // Two batches from an idempotent producer in one append are refused.
    let mut two = batch(9, 0, 0, 1);
    two.extend(batch(9, 0, 1, 1));
    assert!(matches!(producer_error(log.append(&mut two, 0)), ProducerError::Invalid(_)));
    assert_eq!(log.log_end_offset(), 8);
}

#[test]
fn producer_state_survives_close_crash_and_rolls() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    // Small segments: several rolls, each writing a snapshot.
    let cfg = config(&[("segment.bytes", "1024")]);
    {
        let log = open(dir.path(), cfg.clone(), clock.clone(), OpenOptions::default());
        for seq in 0..20 {
            log.append(&mut batch(7, 0, seq, 1), 0).unwrap();
        }
        assert!(log.segment_count() > 3);
        log.close().unwrap();
    }
    {
        // Clean reopen: the close snapshot is used.
        let options = OpenOptions { clean_shutdown: true, ..OpenOptions::default() };
        let log = open(dir.path(), cfg.clone(), clock.clone(), options);
        let dup = log.append(&mut batch(7, 0, 19, 1), 0).unwrap();
        assert!(dup.duplicate);
        assert_eq!(dup.first_offset, 19);
        log.append(&mut batch(7, 0, 20, 1), 0).unwrap();
        log.append(&mut batch(7, 0, 21, 1), 0).unwrap();
        // No close: a crash. The newest snapshot predates the last appends.
    }
    let snapshot_names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.ends_with(".snapshot"))
        .collect();
    assert!(!snapshot_names.is_empty() && snapshot_names.len() <= 2, "{snapshot_names:?}");
    let log = open(dir.path(), cfg, clock, OpenOptions::default());
    assert_eq!(log.log_end_offset(), 22);
    let dup = log.append(&mut batch(7, 0, 21, 1), 0).unwrap();
    assert!(dup.duplicate, "the batch appended after the last snapshot is known after recovery");
    assert_eq!(dup.first_offset, 21);
    assert!(matches!(producer_error(log.append(&mut batch(7, 0, 23, 1), 0)), ProducerError::OutOfOrderSequence(_)));
    log.append(&mut batch(7, 0, 22, 1), 0).unwrap();
}

#[test]
fn idle_producers_expire() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let log = open(dir.path(), config(&[]), clock.clone(), OpenOptions::default());
    log.append(&mut batch(7, 0, 0, 1), 0).unwrap();
    assert_eq!(log.producer_count(), 1);
    clock.advance_ms(1000);
    assert_eq!(log.expire_producers(10_000), 0);
    clock.advance_ms(20_000);
    assert_eq!(log.expire_producers(10_000), 1);
    // An expired producer continuing its sequence is told so.
    assert!(matches!(producer_error(log.append(&mut batch(7, 0, 1, 1), 0)), ProducerError::UnknownProducerId(_)));
}

/// A transactional batch, or with `marker` a transaction marker (0 abort, 1 commit).
fn txn_batch(pid: i64, epoch: i16, seq: i32, n: usize, marker: Option<i16>) -> Vec<u8> {
    let records: Vec<_> = (0..n)
        .map(|i| {
            let (key, value) = match marker {
                Some(kind) => {
                    let mut key = vec![0u8, 0];
                    key.extend_from_slice(&kind.to_be_bytes());
                    (Some(Bytes::from(key)), Some(Bytes::from_static(&[0, 0, 0, 0, 0, 0])))
                }
                None => (None, Some(Bytes::from(vec![b't'; 50]))),
            };
            let mut r = record(i as i64, T0, key, value);
            r.producer_id = pid;
            r.producer_epoch = epoch;
            r.sequence = if marker.is_some() { -1 } else { seq + i as i32 };
            r.transactional = true;
            r.control = marker.is_some();
            r
        })
        .collect();
    encode(&records, Compression::None)
}

#[test]
fn open_transactions_hold_back_the_last_stable_offset_and_aborts_are_indexed() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let cfg = config(&[]);
    {
        let log = open(dir.path(), cfg.clone(), clock.clone(), OpenOptions::default());
        log.append(&mut batch(-1, -1, -1, 2), 0).unwrap(); // 0..2 plain
        log.append(&mut txn_batch(5, 0, 0, 3, None), 0).unwrap(); // 2..5 txn of 5
        log.append(&mut txn_batch(6, 0, 0, 2, None), 0).unwrap(); // 5..7 txn of 6
        assert_eq!(log.high_watermark(), 7);
        assert_eq!(log.last_stable_offset(), 2);
        log.append(&mut txn_batch(5, 0, 0, 1, Some(0)), 0).unwrap(); // 7: abort 5
        assert_eq!(log.last_stable_offset(), 5, "6's transaction is still open");
        log.append(&mut txn_batch(6, 0, 0, 1, Some(1)), 0).unwrap(); // 8: commit 6
        assert_eq!(log.last_stable_offset(), 9);
        let aborted = log.aborted_transactions(0, 9);
        assert_eq!(aborted.len(), 1);
        assert_eq!((aborted[0].producer_id, aborted[0].first_offset, aborted[0].last_offset), (5, 2, 7));
        assert!(log.aborted_transactions(8, 9).is_empty());
        // A marker from an older epoch is fenced.
        log.append(&mut txn_batch(5, 1, 0, 1, None), 0).unwrap(); // 9: new epoch opens a txn
        assert!(matches!(
            producer_error(log.append(&mut txn_batch(5, 0, 0, 1, Some(0)), 0)),
            ProducerError::InvalidProducerEpoch(_)
        ));
        assert_eq!(log.last_stable_offset(), 9);
        // Crash: no close, no snapshot since the first segment; everything comes from replay.
    }
    let log = open(dir.path(), cfg, clock, OpenOptions::default());
    assert_eq!(log.last_stable_offset(), 9, "the open transaction is still open after recovery");
    let aborted = log.aborted_transactions(0, 10);
    assert_eq!(aborted.len(), 1, "the abort is known after recovery, once");
    log.append(&mut txn_batch(5, 1, 0, 1, Some(0)), 0).unwrap(); // 10: abort it
    assert_eq!(log.last_stable_offset(), 11);
    assert_eq!(log.aborted_transactions(0, 11).len(), 2);
}
