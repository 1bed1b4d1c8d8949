//! What a follower needs from the log: appends that keep the leader's offsets and epochs, the
//! leader-epoch cache (OffsetForLeaderEpoch) across truncation, retention and reopen, and a high
//! watermark that replication sets.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::{config, open, read_all, records, T0};
use weir_storage::testing::{encode, record};
use weir_storage::{Compression, EpochEntry, ManualClock, OpenOptions, StorageError};

/// A batch of `n` records from idempotent producer `pid`, sequences `seq..seq+n`.
fn producer_batch(pid: i64, seq: i32, n: usize) -> Vec<u8> {
    let records: Vec<_> = (0..n)
        .map(|i| {
            let mut r = record(i as i64, T0, None, Some(Bytes::from(vec![b'p'; 50])));
            r.producer_id = pid;
            r.producer_epoch = 0;
            r.sequence = seq + i as i32;
            r
        })
        .collect();
    encode(&records, Compression::None)
}

fn entries(pairs: &[(i32, i64)]) -> Vec<EpochEntry> {
    pairs.iter().map(|&(epoch, start_offset)| EpochEntry { epoch, start_offset }).collect()
}

#[test]
fn given_a_leaders_batches_when_a_follower_appends_them_should_keep_offsets_epochs_and_bytes() {
    let clock = Arc::new(ManualClock::new(T0));
    let (leader_dir, follower_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let leader = open(leader_dir.path(), config(&[]), clock.clone(), OpenOptions::default());
    leader.append(&mut records(3, 20, T0, 1), 0).unwrap();
    leader.append(&mut producer_batch(42, 0, 2), 0).unwrap();
    leader.append(&mut records(4, 20, T0, 2), 5).unwrap(); // a new leader at epoch 5
    leader.append(&mut producer_batch(42, 2, 1), 5).unwrap();
    assert_eq!(leader.leader_epoch_entries().unwrap(), entries(&[(0, 0), (5, 5)]));

    let follower = open(follower_dir.path(), config(&[]), clock, OpenOptions::default());
    for (_, bytes) in read_all(&leader, 0) {
        let info = follower.append_replicated(&bytes).unwrap();
        assert!(!info.duplicate);
    }
    assert_eq!(read_all(&follower, 0), read_all(&leader, 0), "the follower's log is the leader's, byte for byte");
    assert_eq!(follower.log_end_offset(), 10);
    assert_eq!(follower.leader_epoch_entries().unwrap(), leader.leader_epoch_entries().unwrap());
    assert_eq!(follower.end_offset_for_epoch(0).unwrap(), (0, 5));
    assert_eq!(follower.end_offset_for_epoch(5).unwrap(), (5, 10));
    assert_eq!(follower.producer_count(), 1, "the producer's state came along");
    // The follower could lead now: the producer's next sequence is accepted, a gap refused.
    follower.append(&mut producer_batch(42, 3, 1), 6).unwrap();
    assert!(matches!(follower.append(&mut producer_batch(42, 9, 1), 6), Err(StorageError::Producer(_))));
}

#[test]
fn given_batches_behind_the_log_end_when_replicated_should_refuse_them_and_accept_a_gap() {
    let clock = Arc::new(ManualClock::new(T0));
    let (leader_dir, follower_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let leader = open(leader_dir.path(), config(&[]), clock.clone(), OpenOptions::default());
    for fill in 0..4 {
        leader.append(&mut records(2, 20, T0, fill), 1).unwrap();
    }
    let batches = read_all(&leader, 0);
    let follower = open(follower_dir.path(), config(&[]), clock, OpenOptions::default());
    follower.append_replicated(&batches[0].1).unwrap();
    follower.append_replicated(&batches[1].1).unwrap();
    let again = follower.append_replicated(&batches[1].1);
    assert!(matches!(again, Err(StorageError::Batch(_))), "{again:?}");
    // Offsets 4..6 were compacted away on the leader: the follower goes on from 6.
    let info = follower.append_replicated(&batches[3].1).unwrap();
    assert_eq!((info.first_offset, info.last_offset), (6, 7));
    assert_eq!(follower.log_end_offset(), 8);
    assert_eq!(follower.read(4, 1 << 20, i64::MAX).unwrap().slice.map(|s| s.first_offset), Some(6));
}

#[test]
fn given_epochs_when_truncated_retained_and_reopened_should_keep_the_cache_consistent() {
    let clock = Arc::new(ManualClock::new(T0));
    let dir = tempfile::tempdir().unwrap();
    let segment_config = config(&[("segment.bytes", "400")]);
    {
        let log = open(dir.path(), segment_config.clone(), clock.clone(), OpenOptions::default());
        for epoch in [0, 0, 2, 2, 7, 7] {
            log.append(&mut records(2, 100, T0, epoch as u8), epoch).unwrap();
        }
        assert_eq!(log.leader_epoch_entries().unwrap(), entries(&[(0, 0), (2, 4), (7, 8)]));
        assert_eq!(log.end_offset_for_epoch(1).unwrap(), (0, 4), "an epoch this log never had");
        assert_eq!(log.end_offset_for_epoch(8).unwrap(), (-1, -1));
        // A diverging former leader truncates to where epoch 2 ended on the new leader.
        log.truncate_to(10).unwrap();
        assert_eq!(log.leader_epoch_entries().unwrap(), entries(&[(0, 0), (2, 4), (7, 8)]));
        log.truncate_to(8).unwrap();
        assert_eq!(log.leader_epoch_entries().unwrap(), entries(&[(0, 0), (2, 4)]));
        assert_eq!(log.end_offset_for_epoch(2).unwrap(), (2, 8));
        // Becoming leader at epoch 9 starts the epoch at the log end before anything is written.
        log.assign_leader_epoch(9).unwrap();
        assert_eq!(log.end_offset_for_epoch(9).unwrap(), (9, 8));
        assert_eq!(log.end_offset_for_epoch(2).unwrap(), (2, 8));
        log.append(&mut records(2, 100, T0, 9), 9).unwrap();
        log.delete_records_before(5).unwrap();
        assert_eq!(log.leader_epoch_entries().unwrap(), entries(&[(2, 5), (9, 8)]));
        // No close: the checkpoint must not depend on a clean shutdown.
    }
    let reopened = open(dir.path(), segment_config, clock, OpenOptions::default());
    assert_eq!(reopened.leader_epoch_entries().unwrap(), entries(&[(2, 5), (9, 8)]));
    assert_eq!(reopened.end_offset_for_epoch(9).unwrap(), (9, 10));
}

#[test]
fn given_a_log_with_one_epoch_and_no_checkpoint_when_reopened_should_read_the_epoch_from_its_batches() {
    let clock = Arc::new(ManualClock::new(T0));
    let dir = tempfile::tempdir().unwrap();
    {
        let log = open(dir.path(), config(&[]), clock.clone(), OpenOptions::default());
        log.append(&mut records(3, 20, T0, 1), 4).unwrap();
        log.append(&mut records(3, 20, T0, 2), 4).unwrap();
        log.close().unwrap();
    }
    assert!(
        !dir.path().join(weir_storage::leader_epoch::CHECKPOINT_FILE).exists(),
        "a single epoch from the first batch is not written: the batch says it"
    );
    let clean = OpenOptions { clean_shutdown: true, ..OpenOptions::default() };
    let log = open(dir.path(), config(&[]), clock.clone(), clean);
    assert_eq!(log.leader_epoch_entries().unwrap(), entries(&[(4, 0)]));
    assert_eq!(log.end_offset_for_epoch(4).unwrap(), (4, 6));
    log.close().unwrap();
    drop(log);
    // A leader taking epoch 5 before the batches were read: the epoch begins at the log end.
    let log = open(dir.path(), config(&[]), clock, clean);
    log.assign_leader_epoch(5).unwrap();
    log.append(&mut records(1, 20, T0, 3), 5).unwrap();
    assert_eq!(log.leader_epoch_entries().unwrap(), entries(&[(4, 0), (5, 6)]));
    assert_eq!(log.end_offset_for_epoch(4).unwrap(), (4, 6));
}

#[test]
fn given_a_managed_high_watermark_when_set_should_only_move_forward_within_the_log() {
    let clock = Arc::new(ManualClock::new(T0));
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), config(&[]), clock, OpenOptions::default());
    log.set_high_watermark_managed(true);
    for _ in 0..3 {
        log.append(&mut records(2, 20, T0, 1), 0).unwrap();
    }
    assert_eq!(log.high_watermark(), 0, "replication, not the append, moves it");
    assert!(log.read(0, 1 << 20, log.high_watermark()).unwrap().slice.is_none(), "nothing readable yet");
    log.set_high_watermark(4);
    assert_eq!(log.high_watermark(), 4);
    let visible = log.read(0, 1 << 20, log.high_watermark()).unwrap().slice.expect("data below the high watermark");
    assert_eq!(visible.next_offset, 4);
    log.set_high_watermark(6);
    assert_eq!(log.high_watermark(), 6);
    log.truncate_to(2).unwrap();
    assert_eq!(log.high_watermark(), 2, "truncation lowers it");
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "high watermark set from 4 to 3")]
fn given_a_managed_high_watermark_when_set_backwards_should_assert() {
    let clock = Arc::new(ManualClock::new(T0));
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), config(&[]), clock, OpenOptions::default());
    log.set_high_watermark_managed(true);
    log.append(&mut records(6, 20, T0, 1), 0).unwrap();
    log.set_high_watermark(4);
    log.set_high_watermark(3);
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "to 3 (log end 2)")]
fn given_a_managed_high_watermark_when_set_past_the_log_end_should_assert() {
    let clock = Arc::new(ManualClock::new(T0));
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), config(&[]), clock, OpenOptions::default());
    log.set_high_watermark_managed(true);
    log.append(&mut records(2, 20, T0, 1), 0).unwrap();
    log.set_high_watermark(3);
}

#[test]
fn given_an_epoch_without_batches_when_truncated_at_the_log_end_should_drop_it() {
    // A broker that became leader at epoch 4 (recorded at the log end) and lost leadership
    // before writing: as a follower it must not keep naming epoch 4 as its last.
    let clock = Arc::new(ManualClock::new(T0));
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), config(&[]), clock, OpenOptions::default());
    log.append(&mut records(3, 20, T0, 1), 2).unwrap();
    log.assign_leader_epoch(4).unwrap();
    assert_eq!(log.latest_leader_epoch().unwrap(), Some(4));
    assert_eq!(log.truncate_to(3).unwrap(), 3, "nothing to cut");
    assert_eq!(log.leader_epoch_entries().unwrap(), entries(&[(2, 0)]));
    assert_eq!(log.latest_leader_epoch().unwrap(), Some(2));
    assert_eq!(log.truncate_to(7).unwrap(), 3, "past the log end: nothing happens");
    assert_eq!(log.leader_epoch_entries().unwrap(), entries(&[(2, 0)]));
}

#[test]
fn given_a_newer_epoch_when_a_deposed_leader_writes_at_an_older_one_should_refuse_it() {
    let clock = Arc::new(ManualClock::new(T0));
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path(), config(&[]), clock, OpenOptions::default());
    log.append(&mut records(2, 20, T0, 1), 3).unwrap();
    log.assign_leader_epoch(4).unwrap();
    let stale = log.append(&mut records(2, 20, T0, 2), 3);
    assert!(matches!(stale, Err(StorageError::StaleLeaderEpoch { epoch: 3, latest: 4 })), "{stale:?}");
    assert_eq!(log.log_end_offset(), 2, "nothing was written");
    // Starting to lead at an older epoch changes nothing and is no error.
    log.assign_leader_epoch(2).unwrap();
    log.append(&mut records(1, 20, T0, 3), 4).unwrap();
    assert_eq!(log.leader_epoch_entries().unwrap(), entries(&[(3, 0), (4, 2)]));
}

#[test]
fn given_an_epoch_without_batches_when_a_replicated_batch_of_an_older_epoch_comes_should_describe_the_batches() {
    let clock = Arc::new(ManualClock::new(T0));
    let (leader_dir, follower_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let leader = open(leader_dir.path(), config(&[]), clock.clone(), OpenOptions::default());
    leader.append(&mut records(2, 20, T0, 1), 3).unwrap();
    leader.append(&mut records(2, 20, T0, 2), 5).unwrap();
    let batches = read_all(&leader, 0);

    let follower = open(follower_dir.path(), config(&[]), clock, OpenOptions::default());
    follower.append_replicated(&batches[0].1).unwrap();
    // The follower led at epoch 6 for a moment, writing nothing, then followed again.
    follower.assign_leader_epoch(6).unwrap();
    follower.append_replicated(&batches[1].1).unwrap();
    assert_eq!(
        follower.leader_epoch_entries().unwrap(),
        entries(&[(3, 0), (5, 2)]),
        "the epoch without a batch gave way to the batch's: the follower names epoch 5 as its last"
    );
    assert_eq!(follower.end_offset_for_epoch(5).unwrap(), leader.end_offset_for_epoch(5).unwrap());

    // A batch of an older epoch after batches of a newer one is out of order: refused.
    let follower2_dir = tempfile::tempdir().unwrap();
    let follower2 = open(follower2_dir.path(), config(&[]), Arc::new(ManualClock::new(T0)), OpenOptions::default());
    follower2.append_replicated(&batches[1].1).unwrap();
    let mut older = records(1, 20, T0, 9);
    let other_dir = tempfile::tempdir().unwrap();
    let other = open(other_dir.path(), config(&[]), Arc::new(ManualClock::new(T0)), OpenOptions::default());
    other.append(&mut records(4, 20, T0, 8), 1).unwrap();
    other.append(&mut older, 1).unwrap();
    let late = read_all(&other, 4);
    let refused = follower2.append_replicated(&late[0].1);
    assert!(matches!(refused, Err(StorageError::Batch(_))), "{refused:?}");
    assert_eq!(follower2.log_end_offset(), 4);
}
