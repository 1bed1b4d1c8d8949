//! Log compaction: the cleaner keeps the latest record per key, expires tombstones, preserves
//! offsets, handles every codec, and leaves a consistent log after a crash at any swap step.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use common::*;
use kafka_protocol::records::{Record, RecordBatchDecoder};
use proptest::prelude::*;
use weir_storage::batch::{self, BatchHeader};
use weir_storage::cleaner::{clean, dirty_ratio, CleanOutcome, Cleaner, CleanerConfig, Throttle};
use weir_storage::testing::{encode, record};
use weir_storage::{Compression, Log, LogConfig, ManualClock, OpenOptions, TimestampType};

const RETENTION_MS: i64 = 1_000;

/// One record as a consumer sees it, with its batch's maxTimestamp for the tombstone rule.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    offset: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    batch_max_ts: i64,
}

type Kv = (Option<Vec<u8>>, Option<Vec<u8>>);

fn put(key: &str, value: &str) -> Kv {
    (Some(key.as_bytes().to_vec()), Some(value.as_bytes().to_vec()))
}

fn tombstone(key: &str) -> Kv {
    (Some(key.as_bytes().to_vec()), None)
}

fn keyless(value: &str) -> Kv {
    (None, Some(value.as_bytes().to_vec()))
}

/// A producer's batch whose records all carry `timestamp`, so the batch's maxTimestamp does not
/// change when compaction removes some of them.
fn kv_batch(kvs: &[Kv], timestamp: i64, compression: Compression) -> Vec<u8> {
    let records: Vec<Record> = kvs
        .iter()
        .enumerate()
        .map(|(i, (k, v))| record(i as i64, timestamp, k.clone().map(Bytes::from), v.clone().map(Bytes::from)))
        .collect();
    encode(&records, compression)
}

fn compact_config(extra: &[(&str, &str)]) -> LogConfig {
    let retention = RETENTION_MS.to_string();
    let mut pairs = vec![
        ("cleanup.policy", "compact"),
        ("segment.bytes", "400"),
        ("segment.index.bytes", "4096"),
        ("index.interval.bytes", "100"),
        ("delete.retention.ms", retention.as_str()),
        ("file.delete.delay.ms", "0"),
    ];
    pairs.extend_from_slice(extra);
    config(&pairs)
}

fn unlimited() -> CleanerConfig {
    CleanerConfig::default()
}

fn clean_now(log: &Log) -> CleanOutcome {
    clean(log, &unlimited(), &Throttle::unlimited()).expect("clean")
}

/// A log plus everything appended to it, for comparing with the model.
struct Harness {
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    config: LogConfig,
    log: Log,
    /// What a consumer should see, per the model (all appended records until a clean).
    expected: Vec<Rec>,
    /// Every appended batch as stored (offsets assigned), by base offset.
    appended: BTreeMap<i64, Vec<u8>>,
}

impl Harness {
    fn new(config: LogConfig) -> Harness {
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = Arc::new(ManualClock::new(T0));
        let log = open(dir.path(), config.clone(), Arc::clone(&clock), OpenOptions::default());
        Harness { dir, clock, config, log, expected: Vec::new(), appended: BTreeMap::new() }
    }

    fn now(&self) -> i64 {
        use weir_storage::Clock;
        self.clock.now_ms()
    }

    fn append(&mut self, kvs: &[Kv], compression: Compression) -> i64 {
        let timestamp = self.now();
        let mut bytes = kv_batch(kvs, timestamp, compression);
        let info = self.log.append(&mut bytes, 0).expect("append");
        let max_ts = BatchHeader::parse(&bytes).expect("header").max_timestamp;
        for (i, (key, value)) in kvs.iter().enumerate() {
            self.expected.push(Rec {
                offset: info.first_offset + i as i64,
                key: key.clone(),
                value: value.clone(),
                batch_max_ts: max_ts,
            });
        }
        self.appended.insert(info.first_offset, bytes);
        info.first_offset
    }

    fn active_base(&self) -> i64 {
        *self.log.segment_base_offsets().last().expect("active segment")
    }

    /// Cleans and applies the model with the end the cleaner reports, checking that end.
    fn clean(&mut self, cleaner: &CleanerConfig) -> CleanOutcome {
        let upper = self.active_base().min(self.log.high_watermark());
        let outcome = clean(&self.log, cleaner, &Throttle::unlimited()).expect("clean");
        assert!(outcome.end_offset <= upper, "{outcome:?} beyond the cleanable end {upper}");
        if !outcome.map_full && self.config.min_compaction_lag_ms == 0 {
            assert_eq!(outcome.end_offset, upper, "{outcome:?}");
        }
        self.expected = model_clean(&self.expected, outcome.end_offset, self.now(), RETENTION_MS);
        outcome
    }

    fn reopen(&mut self, clean_shutdown: bool) {
        if clean_shutdown {
            self.log.close().expect("close");
        }
        // Without close this is a crash: the old handle (which has no Drop) just goes away.
        self.log = open(
            self.dir.path(),
            self.config.clone(),
            Arc::clone(&self.clock),
            OpenOptions { clean_shutdown, ..Default::default() },
        );
    }
}

/// The rules, naively: below `end` a keyed record survives only as the latest of its key, and a
/// tombstone only until its batch is `retention` old. (Earlier passes left at most one record per
/// key below their end, so "latest among the survivors" is "latest in the dirty range".)
fn model_clean(current: &[Rec], end: i64, now: i64, retention: i64) -> Vec<Rec> {
    let mut latest: HashMap<&[u8], i64> = HashMap::new();
    for r in current.iter().filter(|r| r.offset < end) {
        if let Some(k) = &r.key {
            latest.insert(k, r.offset);
        }
    }
    current
        .iter()
        .filter(|r| {
            let Some(key) = &r.key else { return true };
            r.offset >= end
                || (latest[key.as_slice()] == r.offset && (r.value.is_some() || r.batch_max_ts + retention > now))
        })
        .cloned()
        .collect()
}

/// Every record a consumer reading from the log start sees, in order.
fn consume(log: &Log) -> Vec<Rec> {
    let mut out = Vec::new();
    let mut last = -1;
    for (_, bytes) in read_all(log, log.log_start_offset()) {
        let header = BatchHeader::parse(&bytes).expect("header");
        let mut buf = Bytes::from(bytes);
        for set in RecordBatchDecoder::decode_all(&mut buf).expect("decode") {
            for r in set.records {
                assert!(r.offset > last, "offsets must increase: {} after {last}", r.offset);
                last = r.offset;
                out.push(Rec {
                    offset: r.offset,
                    key: r.key.map(|k| k.to_vec()),
                    value: r.value.map(|v| v.to_vec()),
                    batch_max_ts: header.max_timestamp,
                });
            }
        }
    }
    out
}

/// (offset, key, value): what a consumer compares.
type Seen = (i64, Option<Vec<u8>>, Option<Vec<u8>>);

fn strip(recs: &[Rec]) -> Vec<Seen> {
    recs.iter().map(|r| (r.offset, r.key.clone(), r.value.clone())).collect()
}

fn assert_matches_model(h: &Harness) {
    assert_eq!(strip(&consume(&h.log)), strip(&h.expected));
    h.log.verify().expect("every stored batch passes verification");
}

fn file_bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).expect("read file")
}

fn segment_file(dir: &Path, base: i64, suffix: &str) -> std::path::PathBuf {
    dir.join(format!("{base:020}{suffix}"))
}

#[test]
fn given_updates_across_segments_when_cleaned_should_keep_latest_per_key_with_offsets() {
    let mut h = Harness::new(compact_config(&[]));
    for i in 0..60 {
        let key = format!("k{}", i % 7);
        if i % 5 == 0 {
            h.append(
                &[put(&key, &format!("v{i}")), keyless(&format!("n{i}")), put("k9", &format!("w{i}"))],
                Compression::None,
            );
        } else {
            h.append(&[put(&key, &format!("v{i}"))], Compression::None);
        }
    }
    assert!(h.log.segment_count() > 4, "{} segments", h.log.segment_count());
    let active = h.active_base();
    let active_path = segment_file(h.dir.path(), active, ".log");
    let active_before = file_bytes(&active_path);
    let end_before = h.log.log_end_offset();
    assert!((dirty_ratio(&h.log).expect("ratio") - 1.0).abs() < f64::EPSILON, "nothing cleaned yet: all dirty");

    let outcome = h.clean(&unlimited());

    assert_eq!(outcome.first_dirty_offset, 0);
    assert_eq!(outcome.end_offset, active);
    assert!(outcome.records_removed > 0 && outcome.bytes_after < outcome.bytes_before, "{outcome:?}");
    assert_eq!(file_bytes(&active_path), active_before, "the active segment is never touched");
    assert_eq!(h.log.log_end_offset(), end_before);
    assert!(h.log.recovery_point() >= active, "what the pass relied on is durable");
    assert_eq!(dirty_ratio(&h.log).expect("ratio"), 0.0);
    assert_matches_model(&h);
    // Below the active segment each key appears once.
    let mut seen = HashMap::new();
    for r in consume(&h.log).iter().filter(|r| r.offset < active) {
        if let Some(k) = &r.key {
            assert!(seen.insert(k.clone(), r.offset).is_none(), "key {k:?} twice");
        }
    }
    // Batches that lost nothing are the producer's bytes, untouched.
    let survivors: Vec<i64> = h.expected.iter().map(|r| r.offset).collect();
    for (base, bytes) in read_all(&h.log, 0) {
        if let Some(original) = h.appended.get(&base) {
            let header = BatchHeader::parse(original).expect("header");
            if (base..=header.last_offset()).all(|o| survivors.contains(&o)) {
                assert_eq!(&bytes, original, "batch at {base} was fully retained");
            }
        }
    }
    // Nothing dirty: a second pass changes nothing.
    let again = clean_now(&h.log);
    assert_eq!((again.segments_rewritten, again.segments_removed, again.records_removed), (0, 0, 0));
    assert_matches_model(&h);
}

#[test]
fn given_tombstones_should_keep_them_until_delete_retention_passes() {
    let mut h = Harness::new(compact_config(&[]));
    h.append(&[put("a", "1"), put("b", "1")], Compression::None);
    h.append(&[put("c", "1")], Compression::None);
    h.append(&[tombstone("a"), put("c", "2")], Compression::None);
    h.append(&[tombstone("d")], Compression::None);
    h.log.roll_now().expect("roll");

    h.clean(&unlimited());
    let seen = strip(&consume(&h.log));
    assert!(seen.contains(&(3, Some(b"a".to_vec()), None)), "tombstone for a kept: {seen:?}");
    assert!(!seen.iter().any(|(o, ..)| *o == 0), "a=1 is shadowed by its tombstone");
    assert_matches_model(&h);

    h.clock.advance_ms(RETENTION_MS - 1);
    h.clean(&unlimited());
    assert_eq!(consume(&h.log).iter().filter(|r| r.value.is_none()).count(), 2, "not yet expired");

    h.clock.advance_ms(1);
    h.clean(&unlimited());
    let seen = strip(&consume(&h.log));
    assert_eq!(
        seen,
        vec![(1, Some(b"b".to_vec()), Some(b"1".to_vec())), (4, Some(b"c".to_vec()), Some(b"2".to_vec()))]
    );
    assert_matches_model(&h);
}

#[test]
fn given_compressed_batches_when_cleaned_should_reencode_survivors_with_the_same_codec() {
    for compression in [Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd] {
        let mut h = Harness::new(compact_config(&[("segment.bytes", "100000")]));
        for round in 0..4 {
            let kvs: Vec<Kv> =
                (0..6).map(|k| put(&format!("key-{k}"), &format!("value-{round}-{k}-{}", "x".repeat(40)))).collect();
            h.append(&kvs, compression);
        }
        // Supersede some keys of every earlier batch, so those get partly retained.
        h.append(&[put("key-1", "new"), put("key-4", "new"), tombstone("key-5")], compression);
        h.append(&[put("key-0", "newer")], Compression::None);
        h.log.roll_now().expect("roll");
        h.append(&[put("key-2", "in the active segment")], compression);

        let outcome = h.clean(&unlimited());
        assert!(outcome.records_removed > 0, "{compression:?}: {outcome:?}");
        assert_matches_model(&h);
        for (base, bytes) in read_all(&h.log, 0) {
            let header = BatchHeader::parse(&bytes).expect("header");
            let original = h.appended.range(..=base).next_back().map(|(_, b)| BatchHeader::parse(b).expect("header"));
            let original = original.expect("an appended batch at or before");
            assert_eq!(header.compression(), original.compression(), "{compression:?} batch at {base}");
            batch::validate_one(&bytes, usize::MAX).expect("a valid batch");
        }
    }
}

#[test]
fn given_repeated_header_names_when_reencoded_should_keep_every_value() {
    use weir_storage::records::{self, BatchOptions, Header, Record as WeirRecord};
    let mut h = Harness::new(compact_config(&[("segment.bytes", "100000")]));
    let headers = vec![
        Header::new("trace", Some(Bytes::from_static(b"a"))),
        Header::new("trace", Some(Bytes::from_static(b"b"))),
        Header::new("trace", None),
    ];
    let batch: Vec<WeirRecord> = ["k1", "k2", "k1"]
        .iter()
        .map(|key| {
            let mut record =
                WeirRecord::new(T0, Some(Bytes::from_static(key.as_bytes())), Some(Bytes::from_static(b"v")));
            record.headers = headers.clone();
            record
        })
        .collect();
    let mut bytes = records::encode_batch(&batch, &BatchOptions::default()).expect("encode").to_vec();
    h.log.append(&mut bytes, 0).expect("append");
    h.log.roll_now().expect("roll");
    h.append(&[put("k9", "active")], Compression::None);
    let outcome = h.clean(&unlimited());
    assert_eq!(outcome.records_removed, 1, "{outcome:?}");
    let survivors: Vec<WeirRecord> =
        read_all(&h.log, 0).iter().flat_map(|(_, b)| records::decode_records(b).expect("decode")).collect();
    assert_eq!(survivors.len(), 3);
    for record in &survivors[..2] {
        assert_eq!(record.headers, headers, "offset {}", record.offset);
    }
}

#[test]
fn given_log_append_time_when_reencoded_should_keep_the_brokers_timestamp() {
    let mut h = Harness::new(compact_config(&[("message.timestamp.type", "LogAppendTime")]));
    h.append(&[put("a", "1"), put("b", "1"), put("c", "1")], Compression::Lz4);
    h.clock.advance_ms(10);
    h.append(&[put("b", "2")], Compression::None);
    h.log.roll_now().expect("roll");
    h.clean(&unlimited());
    let batches = read_all(&h.log, 0);
    let first = BatchHeader::parse(&batches[0].1).expect("header");
    assert_eq!(first.base_offset, 0);
    assert_eq!(first.records_count, 1, "a run of one: offset 0");
    assert_eq!(first.timestamp_type(), TimestampType::LogAppendTime);
    assert_eq!(first.max_timestamp, T0, "the broker's append time, not the records' own");
    assert_eq!(first.compression(), Some(Compression::Lz4));
    assert_eq!(strip(&consume(&h.log)).iter().map(|r| r.0).collect::<Vec<_>>(), vec![0, 2, 3]);
    h.log.verify().expect("verify");
}

#[test]
fn given_transactional_and_control_batches_should_keep_them_untouched() {
    let mut h = Harness::new(compact_config(&[]));
    let txn = |kvs: &[Kv], control: bool| {
        let records: Vec<Record> = kvs
            .iter()
            .enumerate()
            .map(|(i, (k, v))| Record {
                transactional: true,
                control,
                producer_id: 7,
                producer_epoch: 0,
                sequence: i as i32,
                ..record(i as i64, T0, k.clone().map(Bytes::from), v.clone().map(Bytes::from))
            })
            .collect();
        encode(&records, Compression::None)
    };
    let mut in_txn = txn(&[put("a", "txn-old"), put("b", "txn-new")], false);
    let txn_base = h.log.append(&mut in_txn, 0).expect("append").first_offset;
    // A commit marker: control key (version 0, type 1), value (version 0, coordinator epoch 0).
    let marker = (Some(vec![0, 0, 0, 1]), Some(vec![0, 0, 0, 0, 0, 0]));
    let mut commit = txn(&[marker], true);
    let marker_base = h.log.append(&mut commit, 0).expect("append").first_offset;
    h.append(&[put("a", "plain-new")], Compression::None);
    h.log.roll_now().expect("roll");
    clean_now(&h.log);
    let batches: BTreeMap<i64, Vec<u8>> = read_all(&h.log, 0).into_iter().collect();
    assert_eq!(batches.get(&txn_base), Some(&in_txn), "transactional batch kept byte for byte");
    assert_eq!(batches.get(&marker_base), Some(&commit), "control batch kept byte for byte");
    h.log.verify().expect("verify");
}

#[test]
fn given_min_compaction_lag_should_not_clean_recent_segments() {
    let mut h = Harness::new(compact_config(&[("min.compaction.lag.ms", "3600000")]));
    h.clock.set_ms(T0 - 7_200_000);
    h.append(&[put("a", "old"), put("b", "old")], Compression::None);
    h.append(&[put("a", "older-but-later")], Compression::None);
    h.log.roll_now().expect("roll");
    h.clock.set_ms(T0);
    let recent = h.append(&[put("a", "new"), put("c", "1")], Compression::None);
    h.append(&[put("c", "2")], Compression::None);
    h.log.roll_now().expect("roll");
    h.append(&[put("z", "active")], Compression::None);

    let outcome = h.clean(&unlimited());
    assert_eq!(outcome.end_offset, recent, "stops at the first segment newer than the lag");
    let seen = strip(&consume(&h.log));
    assert!(!seen.iter().any(|r| r.0 == 0), "a=old superseded inside the old segment");
    assert!(seen.iter().any(|r| r.0 == 2), "a's latest in the cleanable range stays: the newer one is protected");
    assert!(seen.iter().any(|r| r.0 == recent + 1), "c=1 protected by the lag");
    assert_matches_model(&h);

    h.clock.advance_ms(3_600_001);
    let outcome = h.clean(&unlimited());
    assert_eq!(outcome.end_offset, h.active_base());
    let seen = strip(&consume(&h.log));
    assert!(!seen.iter().any(|r| r.0 == 2 || r.0 == recent + 1), "{seen:?}");
    assert_matches_model(&h);
}

#[test]
fn given_small_offset_map_should_clean_in_several_passes() {
    let mut h = Harness::new(compact_config(&[]));
    for i in 0..40 {
        h.append(&[put(&format!("k{}", i % 13), &format!("v{i}"))], Compression::None);
    }
    h.log.roll_now().expect("roll");
    let small = CleanerConfig { offset_map_bytes: 300, ..CleanerConfig::default() };
    let mut passes = 0;
    loop {
        let outcome = h.clean(&small);
        passes += 1;
        assert_matches_model(&h);
        if !outcome.map_full {
            break;
        }
        assert!(outcome.end_offset > outcome.first_dirty_offset, "every pass makes progress");
    }
    assert!(passes > 2, "{passes} passes");
    let seen = consume(&h.log);
    assert_eq!(seen.len(), 13, "one record per key once all passes ran");
}

#[test]
fn given_leftover_cleaned_files_when_reopened_should_discard_them() {
    let mut h = Harness::new(compact_config(&[]));
    for i in 0..20 {
        h.append(&[put(&format!("k{}", i % 3), &format!("v{i}"))], Compression::None);
    }
    h.log.close().expect("close");
    let before = consume(&h.log);
    for suffix in [".log.cleaned", ".index.cleaned", ".timeindex.cleaned"] {
        std::fs::write(segment_file(h.dir.path(), 0, suffix), b"half-written garbage").expect("write");
    }
    h.reopen(false);
    for suffix in [".log.cleaned", ".index.cleaned", ".timeindex.cleaned"] {
        assert!(!segment_file(h.dir.path(), 0, suffix).exists(), "{suffix} removed");
    }
    assert_eq!(consume(&h.log), before);
    h.log.verify().expect("verify");
}

#[test]
fn given_leftover_swap_file_when_reopened_should_complete_the_swap() {
    // Two identical logs; one is compacted, and its cleaned first segment is planted in the
    // other as a `.swap` file, at both crash points after the commit.
    let build = || {
        let mut h = Harness::new(compact_config(&[]));
        h.append(&[put("only-here", "1"), put("k0", "first")], Compression::Gzip);
        for i in 0..30 {
            h.append(&[put(&format!("k{}", i % 4), &format!("v{i}"))], Compression::Gzip);
        }
        h
    };
    let mut cleaned = build();
    cleaned.clean(&unlimited());
    cleaned.log.close().expect("close");
    let first_base = cleaned.log.segment_base_offsets()[0];
    let cleaned_segment = file_bytes(&segment_file(cleaned.dir.path(), first_base, ".log"));
    assert!(!cleaned_segment.is_empty());

    for old_already_renamed in [false, true] {
        let mut h = build();
        h.log.close().expect("close");
        let next_base = h.log.segment_base_offsets()[1];
        let dir = h.dir.path().to_path_buf();
        std::fs::write(segment_file(&dir, first_base, ".log.swap"), &cleaned_segment).expect("plant swap");
        std::fs::write(segment_file(&dir, first_base, ".index.cleaned"), b"stale").expect("plant index");
        if old_already_renamed {
            for ext in [".log", ".index", ".timeindex"] {
                let from = segment_file(&dir, first_base, ext);
                std::fs::rename(&from, segment_file(&dir, first_base, &format!("{ext}.deleted"))).expect("rename");
            }
        }
        h.reopen(false);
        assert!(!segment_file(&dir, first_base, ".log.swap").exists());
        assert_eq!(file_bytes(&segment_file(&dir, first_base, ".log")), cleaned_segment);
        let seen = consume(&h.log);
        let want: Vec<Rec> = consume(&cleaned.log).into_iter().filter(|r| r.offset < next_base).collect();
        assert_eq!(strip(&seen.iter().filter(|r| r.offset < next_base).cloned().collect::<Vec<_>>()), strip(&want));
        h.log.verify().expect("verify");
        // The rest of the log is as it was, and cleaning still works on top.
        assert_eq!(h.log.log_end_offset(), 32);
        h.expected = seen;
        h.clean(&unlimited());
        assert_matches_model(&h);
    }
}

#[test]
fn given_compacted_log_when_reopened_cleanly_or_not_should_keep_it_readable() {
    for clean_shutdown in [true, false] {
        let mut h = Harness::new(compact_config(&[]));
        for i in 0..50 {
            h.append(
                &[put(&format!("k{}", i % 6), &format!("v{i}")), tombstone(&format!("t{i}"))],
                Compression::Snappy,
            );
        }
        h.clean(&unlimited());
        let before = consume(&h.log);
        h.reopen(clean_shutdown);
        assert_eq!(consume(&h.log), before, "clean_shutdown={clean_shutdown}");
        h.log.verify().expect("verify");
        assert!(h.log.offset_for_timestamp(T0).expect("lookup").is_some());
        // And it keeps working: more data, another clean.
        for i in 0..10 {
            h.append(&[put(&format!("k{}", i % 6), "again")], Compression::None);
        }
        h.log.roll_now().expect("roll");
        h.clean(&unlimited());
        assert_matches_model(&h);
    }
}

#[test]
fn given_reader_holding_a_slice_when_segment_swapped_should_still_read_old_bytes() {
    let mut h = Harness::new(compact_config(&[]));
    for i in 0..20 {
        h.append(&[put("same", &format!("v{i}"))], Compression::None);
    }
    let slice = h.log.read(0, 1 << 20, i64::MAX).expect("read").slice.expect("data");
    let before = slice.read_to_vec().expect("read");
    h.clean(&unlimited());
    assert_eq!(slice.read_to_vec().expect("read old file"), before, "the old file lives on for the reader");
    assert_matches_model(&h);
    assert!(h.log.segment_base_offsets()[0] == 0, "the first segment stays even if emptied");
}

#[test]
fn given_concurrent_appends_and_reads_when_cleaning_should_stay_consistent() {
    let h = Harness::new(compact_config(&[]));
    let log = Arc::new(h.log);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let log = Arc::clone(&log);
        std::thread::spawn(move || {
            for i in 0..150 {
                let kvs = [put(&format!("k{}", i % 10), &format!("v{i}")), keyless(&format!("n{i}"))];
                log.append(&mut kv_batch(&kvs, T0, Compression::Lz4), 0).expect("append");
            }
        })
    };
    let reader = {
        let (log, done) = (Arc::clone(&log), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut reads = 0;
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                let seen = consume(&log);
                let keyless = seen.iter().filter(|r| r.key.is_none()).count();
                assert_eq!(
                    keyless as i64 * 2,
                    seen.last().map_or(0, |r| r.offset + 1),
                    "keyless records are never removed"
                );
                reads += 1;
            }
            reads
        })
    };
    let mut passes = 0;
    while !writer.is_finished() || passes < 3 {
        clean_now(&log);
        passes += 1;
    }
    writer.join().expect("writer");
    done.store(true, std::sync::atomic::Ordering::Release);
    assert!(reader.join().expect("reader") > 0);
    log.roll_now().expect("roll");
    clean_now(&log);
    let seen = consume(&log);
    assert_eq!(seen.iter().filter(|r| r.key.is_some()).count(), 10, "one per key");
    assert!(seen.iter().any(|r| r.value.as_deref() == Some(b"v149".as_slice())));
    log.verify().expect("verify");
}

#[test]
fn given_several_logs_when_run_once_should_clean_the_dirtiest_compacted_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let mk = |name: &str, policy: &str, ratio: &str, batches: usize| {
        let cfg = compact_config(&[("cleanup.policy", policy), ("min.cleanable.dirty.ratio", ratio)]);
        let log = Arc::new(open(&dir.path().join(name), cfg, Arc::clone(&clock), OpenOptions::default()));
        for i in 0..batches {
            log.append(&mut kv_batch(&[put(&format!("k{}", i % 20), &format!("v{i}"))], T0, Compression::None), 0)
                .expect("append");
        }
        log
    };
    let delete_only = mk("delete", "delete", "0.1", 30);
    let compacted = mk("compact", "compact", "0.5", 30);
    let other = mk("other", "compact,delete", "0.5", 30);
    let cleaner = Cleaner::new(CleanerConfig::default());
    let logs = vec![Arc::clone(&delete_only), Arc::clone(&compacted), Arc::clone(&other)];

    let first = cleaner.run_once(&logs).expect("run").expect("something to clean");
    let second = cleaner.run_once(&logs).expect("run").expect("something to clean");
    let mut dirs = vec![first.dir, second.dir];
    dirs.sort();
    assert_eq!(dirs, vec![compacted.dir().to_path_buf(), other.dir().to_path_buf()]);
    assert!(cleaner.run_once(&logs).expect("run").is_none(), "nothing dirty left; delete-only logs are ignored");
    assert!(delete_only.segment_count() > 1 && dirty_ratio(&delete_only).expect("ratio") > 0.9);

    // A little new dirt stays under the ratio.
    compacted.roll_now().expect("roll");
    compacted.append(&mut kv_batch(&[put("k", "late")], T0, Compression::None), 0).expect("append");
    compacted.roll_now().expect("roll");
    let ratio = dirty_ratio(&compacted).expect("ratio");
    assert!(ratio > 0.0 && ratio < 0.5, "{ratio}");
    assert!(cleaner.run_once(&logs).expect("run").is_none());
    assert!(cleaner.uncleanable().is_empty());

    cleaner.stop();
    for i in 0..30 {
        compacted.append(&mut kv_batch(&[put("k", &format!("v{i}"))], T0, Compression::None), 0).expect("append");
    }
    compacted.roll_now().expect("roll");
    assert!(cleaner.run_once(&logs).expect("stopped").is_none(), "a stopped cleaner does nothing");
}

#[test]
fn given_corrupt_segment_when_run_once_should_mark_only_that_log_uncleanable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(T0));
    let cfg = compact_config(&[]);
    let bad_dir = dir.path().join("bad");
    {
        let log = open(&bad_dir, cfg.clone(), Arc::clone(&clock), OpenOptions::default());
        for i in 0..20 {
            log.append(&mut kv_batch(&[put("k", &format!("v{i}"))], T0, Compression::None), 0).expect("append");
        }
        log.close().expect("close");
    }
    // Flip a byte in the first segment's data; a clean open does not scan, the cleaner does.
    let path = segment_file(&bad_dir, 0, ".log");
    let mut bytes = file_bytes(&path);
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&path, bytes).expect("corrupt");
    let bad = Arc::new(open(
        &bad_dir,
        cfg.clone(),
        Arc::clone(&clock),
        OpenOptions { clean_shutdown: true, ..Default::default() },
    ));
    let good = Arc::new(open(&dir.path().join("good"), cfg, Arc::clone(&clock), OpenOptions::default()));
    for i in 0..10 {
        good.append(&mut kv_batch(&[put("k", &format!("v{i}"))], T0, Compression::None), 0).expect("append");
    }
    let cleaner = Cleaner::new(CleanerConfig::default());
    let logs = vec![Arc::clone(&bad), Arc::clone(&good)];
    let mut cleaned = Vec::new();
    let mut errors = 0;
    for _ in 0..3 {
        match cleaner.run_once(&logs) {
            Ok(Some(outcome)) => cleaned.push(outcome.dir),
            Ok(None) => {}
            Err(_) => errors += 1,
        }
    }
    assert_eq!(errors, 1, "the corrupt log fails once, then is skipped");
    assert_eq!(cleaned, vec![good.dir().to_path_buf()]);
    assert_eq!(cleaner.uncleanable(), vec![bad.dir().to_path_buf()]);
    let leftovers: Vec<_> = std::fs::read_dir(&bad_dir)
        .expect("ls")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cleaned") || n.ends_with(".swap"))
        .collect();
    assert!(leftovers.is_empty(), "an aborted pass leaves nothing: {leftovers:?}");
}

#[derive(Debug, Clone)]
enum Op {
    Append { records: Vec<(Option<u8>, bool)>, codec: u8 },
    Advance(i64),
    Roll,
    Clean,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (prop::collection::vec((prop::option::weighted(0.9, 0u8..6), prop::bool::weighted(0.2)), 1..5), 0u8..5)
            .prop_map(|(records, codec)| Op::Append { records, codec }),
        1 => (0i64..1_500).prop_map(Op::Advance),
        1 => Just(Op::Roll),
        2 => Just(Op::Clean),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    #[test]
    fn compaction_matches_a_model_of_the_rules(
        ops in prop::collection::vec(op(), 1..40),
        segment_bytes in 150u64..700,
        map_bytes in prop_oneof![Just(usize::MAX), 300usize..1_000],
    ) {
        let segment_bytes = segment_bytes.to_string();
        let mut h = Harness::new(compact_config(&[("segment.bytes", &segment_bytes)]));
        let cleaner = CleanerConfig { offset_map_bytes: map_bytes, ..CleanerConfig::default() };
        let mut n = 0u32;
        for op in ops.iter().chain([Op::Roll, Op::Clean].iter()) {
            match op {
                Op::Append { records, codec } => {
                    let kvs: Vec<Kv> = records
                        .iter()
                        .map(|(key, dead)| {
                            n += 1;
                            let key = key.map(|k| format!("k{k}").into_bytes());
                            let value = (!dead || key.is_none()).then(|| format!("v{n}").into_bytes());
                            (key, value)
                        })
                        .collect();
                    let codec = [Compression::None, Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd][*codec as usize];
                    h.append(&kvs, codec);
                }
                Op::Advance(ms) => h.clock.advance_ms(*ms),
                Op::Roll => h.log.roll_now().expect("roll"),
                Op::Clean => {
                    h.clean(&cleaner);
                }
            }
            prop_assert_eq!(strip(&consume(&h.log)), strip(&h.expected));
        }
        h.log.verify().expect("verify");
        h.reopen(false);
        prop_assert_eq!(strip(&consume(&h.log)), strip(&h.expected));
        h.log.verify().expect("verify after recovery");
    }
}
