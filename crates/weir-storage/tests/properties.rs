//! Property tests: the indexes and retention agree with naive models on random logs.

mod common;

use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use weir_storage::testing::{batch, BatchSpec};
use weir_storage::{Log, ManualClock, OpenOptions};

/// One appended batch as the model sees it.
#[derive(Debug, Clone)]
struct Appended {
    base: i64,
    records: usize,
    first_timestamp: i64,
}

fn build(dir: &std::path::Path, specs: &[(usize, usize, i64)], pairs: &[(&str, &str)]) -> (Log, Vec<Appended>) {
    let log = open(dir, config(pairs), Arc::new(ManualClock::new(T0)), OpenOptions::default());
    let mut appended = Vec::new();
    for (i, (records, value_bytes, timestamp)) in specs.iter().enumerate() {
        let mut bytes = batch(&BatchSpec {
            records: *records,
            value_bytes: *value_bytes,
            timestamp: *timestamp,
            fill: i as u8,
            ..Default::default()
        });
        let info = log.append(&mut bytes, 0).expect("append");
        appended.push(Appended { base: info.first_offset, records: *records, first_timestamp: *timestamp });
    }
    (log, appended)
}

/// Naive: base offset of the batch holding `offset`.
fn batch_holding(appended: &[Appended], offset: i64) -> i64 {
    appended.iter().find(|a| offset < a.base + a.records as i64).map(|a| a.base).expect("offset below end")
}

/// Naive: the first record (in offset order) whose timestamp is >= target.
fn first_at_or_after(appended: &[Appended], target: i64) -> Option<(i64, i64)> {
    appended
        .iter()
        .flat_map(|a| (0..a.records).map(move |i| (a.base + i as i64, a.first_timestamp + i as i64)))
        .find(|(_, ts)| *ts >= target)
}

fn batch_specs() -> impl Strategy<Value = Vec<(usize, usize, i64)>> {
    prop::collection::vec((1usize..6, 1usize..2500, 0i64..10_000), 1..120)
        .prop_map(|v| v.into_iter().map(|(r, b, t)| (r, b, T0 + t)).collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn offset_lookups_equal_a_naive_scan(
        specs in batch_specs(),
        interval in 0u64..8192,
        segment_bytes in 2048u64..40_000,
        probes in prop::collection::vec(any::<prop::sample::Index>(), 1..40),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let interval = interval.to_string();
        let segment_bytes = segment_bytes.to_string();
        let pairs = [("index.interval.bytes", interval.as_str()), ("segment.bytes", segment_bytes.as_str())];
        let (log, appended) = build(dir.path(), &specs, &pairs);
        let end = log.log_end_offset();
        let check = |log: &Log| {
            for probe in &probes {
                let target = probe.index(end as usize) as i64;
                let slice = log.read(target, 1, i64::MAX).expect("read").slice.expect("data below the end");
                prop_assert_eq!(slice.first_offset, batch_holding(&appended, target), "target {}", target);
            }
            Ok(())
        };
        check(&log)?;
        log.close().expect("close");
        drop(log);
        // After a clean reopen (indexes loaded from disk)...
        let log = open(dir.path(), config(&pairs), Arc::new(ManualClock::new(T0)), OpenOptions { clean_shutdown: true, ..Default::default() });
        check(&log)?;
        drop(log);
        // ...and after a crash (indexes rebuilt by recovery).
        for entry in std::fs::read_dir(dir.path()).expect("ls") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "index") {
                std::fs::remove_file(path).expect("rm");
            }
        }
        let log = open(dir.path(), config(&pairs), Arc::new(ManualClock::new(T0)), OpenOptions::default());
        check(&log)?;
    }

    #[test]
    fn a_read_in_memory_is_the_read_of_the_file_range(
        specs in batch_specs(),
        segment_bytes in 2048u64..40_000,
        probes in prop::collection::vec((any::<prop::sample::Index>(), 1u64..20_000, any::<prop::sample::Index>(), any::<bool>()), 1..40),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let segment_bytes = segment_bytes.to_string();
        let (log, _) = build(dir.path(), &specs, &[("segment.bytes", segment_bytes.as_str())]);
        let end = log.log_end_offset();
        for (from, max_bytes, upper, min_one) in probes {
            let from = from.index(end as usize) as i64;
            let upper = from + upper.index((end - from) as usize + 1) as i64;
            let file = log.read_with(from, max_bytes, upper, min_one).expect("read").slice;
            let memory = log.read_in_memory(from, max_bytes, upper, min_one).expect("read").slice;
            let context = format!("read({from}, {max_bytes}, {upper}, {min_one})");
            prop_assert_eq!(file.is_some(), memory.is_some(), "{}", context);
            if let (Some(file), Some(memory)) = (file, memory) {
                prop_assert!(file.data.is_none(), "{}", context);
                let range = |s: &weir_storage::FileSlice| (s.position, s.len, s.first_offset, s.next_offset);
                prop_assert_eq!(range(&file), range(&memory), "{}", context);
                let bytes = memory.clone().into_bytes().expect("bytes");
                prop_assert!(memory.data.is_some(), "{}: read at once", context);
                prop_assert_eq!(&bytes[..], &file.read_to_vec().expect("bytes")[..], "{}", context);
            }
        }
    }

    #[test]
    fn timestamp_lookups_equal_a_naive_scan(
        specs in batch_specs(),
        interval in 0u64..4096,
        segment_bytes in 2048u64..40_000,
        targets in prop::collection::vec(-10i64..10_020, 1..40),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let interval = interval.to_string();
        let segment_bytes = segment_bytes.to_string();
        let pairs = [("index.interval.bytes", interval.as_str()), ("segment.bytes", segment_bytes.as_str())];
        let (log, appended) = build(dir.path(), &specs, &pairs);
        for target in &targets {
            let found = log.offset_for_timestamp(T0 + target).expect("lookup").map(|t| (t.offset, t.timestamp));
            prop_assert_eq!(found, first_at_or_after(&appended, T0 + target), "target T0+{}", target);
        }
        log.close().expect("close");
        drop(log);
        let log = open(dir.path(), config(&pairs), Arc::new(ManualClock::new(T0)), OpenOptions { clean_shutdown: true, ..Default::default() });
        for target in &targets {
            let found = log.offset_for_timestamp(T0 + target).expect("lookup").map(|t| (t.offset, t.timestamp));
            prop_assert_eq!(found, first_at_or_after(&appended, T0 + target), "after reopen, target T0+{}", target);
        }
    }

    #[test]
    fn retention_keeps_exactly_what_the_rules_say(
        specs in batch_specs(),
        segment_bytes in 2048u64..20_000,
        retention_ms in prop::option::of(0i64..12_000),
        retention_bytes in prop::option::of(0i64..200_000),
        now_offset in 0i64..15_000,
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let segment_bytes = segment_bytes.to_string();
        let rms = retention_ms.unwrap_or(-1).to_string();
        let rbytes = retention_bytes.unwrap_or(-1).to_string();
        let pairs = [("segment.bytes", segment_bytes.as_str()), ("retention.ms", rms.as_str()), ("retention.bytes", rbytes.as_str())];
        let clock = Arc::new(ManualClock::new(T0));
        let log = open(dir.path(), config(&pairs), Arc::clone(&clock), OpenOptions::default());
        let mut appended = Vec::new();
        for (i, (records, value_bytes, timestamp)) in specs.iter().enumerate() {
            let mut bytes = batch(&BatchSpec { records: *records, value_bytes: *value_bytes, timestamp: *timestamp, fill: i as u8, ..Default::default() });
            let size = bytes.len() as u64;
            let info = log.append(&mut bytes, 0).expect("append");
            appended.push((info.first_offset, info.last_offset, timestamp + *records as i64 - 1, size));
        }
        let end = log.log_end_offset();
        // The model: segments as the log cut them, with their largest timestamps and sizes.
        let bases = log.segment_base_offsets();
        let mut segments: Vec<(i64, i64, u64)> = bases.iter().map(|b| (*b, i64::MIN, 0)).collect();
        for (first, _, max_ts, size) in &appended {
            let s = segments.iter_mut().rev().find(|s| s.0 <= *first).expect("segment");
            s.1 = s.1.max(*max_ts);
            s.2 += size;
        }
        let now = T0 + now_offset;
        clock.set_ms(now);
        log.apply_retention().expect("retention");

        let mut start = 0usize; // index of the first surviving segment
        let mut expected_start = 0i64;
        if let Some(ms) = retention_ms {
            let expired = |s: &(i64, i64, u64)| now - s.1 > ms;
            if segments.iter().all(|s| s.2 == 0 || expired(s)) && segments.last().is_some_and(|s| s.2 > 0) {
                // Everything expired: the active segment is rolled and all of it goes.
                start = segments.len();
                expected_start = end;
            } else {
                while start + 1 < segments.len() && expired(&segments[start]) {
                    start += 1;
                }
                expected_start = segments[start].0;
            }
        }
        if let Some(limit) = retention_bytes {
            if start < segments.len() {
                let mut excess = segments[start..].iter().map(|s| s.2).sum::<u64>() as i64 - limit;
                while start + 1 < segments.len() && excess >= segments[start].2 as i64 {
                    excess -= segments[start].2 as i64;
                    start += 1;
                }
                expected_start = expected_start.max(segments[start].0);
            }
        }
        prop_assert_eq!(log.log_start_offset(), expected_start);
        prop_assert_eq!(log.log_end_offset(), end);
        // What remains is readable from the new start to the end, in order.
        let batches = read_all(&log, log.log_start_offset());
        let expected: Vec<i64> = appended.iter().map(|a| a.0).filter(|b| *b >= expected_start).collect();
        prop_assert_eq!(batches.iter().map(|(b, _)| *b).collect::<Vec<_>>(), expected);
    }
}

fn records_strategy() -> impl Strategy<Value = Vec<weir_storage::records::Record>> {
    let header = ("[a-z]{1,8}", prop::option::of(prop::collection::vec(any::<u8>(), 0..40)));
    let record = (
        prop::option::of(prop::collection::vec(any::<u8>(), 0..30)),
        prop::option::of(prop::collection::vec(any::<u8>(), 0..3000)),
        prop::collection::vec(header, 0..5),
        0i64..10_000,
    );
    prop::collection::vec(record, 1..8).prop_map(|records| {
        records
            .into_iter()
            .map(|(key, value, headers, timestamp)| {
                let mut record =
                    weir_storage::records::Record::new(T0 + timestamp, key.map(Into::into), value.map(Into::into));
                record.headers = headers
                    .into_iter()
                    .map(|(name, value)| weir_storage::records::Header::new(name, value.map(Into::into)))
                    .collect();
                record
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Records decoded as slices of the read buffer equal those decoded from a copy, compressed
    /// or not.
    #[test]
    fn shared_decoding_equals_copying_decoding(
        batches in prop::collection::vec((records_strategy(), 0usize..5), 1..6),
    ) {
        use weir_storage::batch::Compression;
        use weir_storage::records::{decode_batches, decode_shared_batches, encode_batch, BatchOptions};
        let codecs = [Compression::None, Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd];
        let mut bytes = Vec::new();
        let mut base_offset = 0;
        for (records, codec) in &batches {
            let options = BatchOptions { base_offset, compression: codecs[*codec], ..BatchOptions::default() };
            bytes.extend_from_slice(&encode_batch(records, &options).expect("encode"));
            base_offset += records.len() as i64;
        }
        let copied = decode_batches(&bytes).expect("decode");
        let shared = decode_shared_batches(&bytes::Bytes::from(bytes)).expect("decode");
        prop_assert_eq!(copied.len(), batches.len());
        prop_assert_eq!(
            copied.iter().map(|b| (&b.header, &b.records)).collect::<Vec<_>>(),
            shared.iter().map(|b| (&b.header, &b.records)).collect::<Vec<_>>()
        );
    }
}
