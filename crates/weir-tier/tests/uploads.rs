//! Uploads of closed segments to a directory store, as a broker leading the partition runs
//! them: what reaches the store, resuming after an upload cut short, and retention.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use weir_storage::testing::{batch, BatchSpec};
use weir_storage::{DeletionQueue, Log, LogConfig, OpenOptions, SystemClock};
use weir_tier::{CacheSettings, StoreSettings, Tier};

fn open_log(dir: &Path) -> Arc<Log> {
    open_log_with(dir, &[], OpenOptions::default())
}

fn open_log_with(dir: &Path, extra: &[(&str, &str)], options: OpenOptions) -> Arc<Log> {
    let overrides: BTreeMap<String, String> =
        [("segment.bytes", "1024"), ("remote.storage.enable", "true"), ("file.delete.delay.ms", "0")]
            .iter()
            .chain(extra)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    let config = LogConfig::default().with_overrides(&overrides).expect("config");
    Arc::new(Log::open(dir, config, Arc::new(SystemClock), options, Arc::new(DeletionQueue::new())).expect("open log"))
}

fn append(log: &Log, batches: usize, fill: u8) {
    for i in 0..batches {
        // Stamped now: retention.ms (7 days) must not find these expired.
        let timestamp =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let spec = BatchSpec {
            records: 2,
            value_bytes: 100,
            timestamp,
            fill: fill.wrapping_add(i as u8),
            ..Default::default()
        };
        let mut bytes = batch(&spec);
        log.append(&mut bytes, 0).expect("append");
    }
}

fn tier_at(objects: &Path) -> Tier {
    tier_with_cache(objects, CacheSettings::default())
}

fn tier_with_cache(objects: &Path, cache: CacheSettings) -> Tier {
    let settings = StoreSettings { url: format!("file://{}", objects.display()), ..Default::default() };
    let data_dir = objects.parent().expect("the store's parent").join("broker");
    Tier::open(&settings, &data_dir, cache).expect("open the store")
}

/// Every batch from `from` up to the local log start, read back through the tier.
async fn read_remote(partition: &weir_tier::PartitionTier, from: i64, upto: i64) -> Vec<(i64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut next = from;
    while next < upto {
        let read = partition.read(next, 700, i64::MAX, true).await.expect("remote read").expect("a batch");
        let bytes = read.slice.read_to_vec().expect("chunk bytes");
        for (at, header) in weir_storage::batch::headers(&bytes) {
            let size = header.size_bytes().expect("size");
            out.push((header.base_offset, bytes[at..at + size].to_vec()));
        }
        assert!(read.slice.next_offset > next, "no progress at {next}");
        next = read.slice.next_offset;
    }
    out
}

/// Every batch of the log from `from`, read locally.
fn read_local(log: &Log, from: i64) -> Vec<(i64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut next = from;
    loop {
        let result = log.read(next, 1 << 20, i64::MAX).expect("read");
        let Some(slice) = result.slice else { break };
        let bytes = slice.read_to_vec().expect("read slice");
        for (at, header) in weir_storage::batch::headers(&bytes) {
            let size = header.size_bytes().expect("size");
            out.push((header.base_offset, bytes[at..at + size].to_vec()));
        }
        next = slice.next_offset;
    }
    out
}

/// The local `.log` files of the log's closed segments, by base offset.
fn local_segments(dir: &Path) -> BTreeMap<i64, Vec<u8>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("log dir") {
        let path = entry.expect("entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        if let Some(base) = name.strip_suffix(".log") {
            files.insert(base.parse::<i64>().expect("base offset"), std::fs::read(&path).expect("read"));
        }
    }
    files
}

fn object(objects: &Path, partition_dir: &str, name: &str) -> Option<Vec<u8>> {
    std::fs::read(objects.join(partition_dir).join("0").join(name)).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_segments_are_uploaded_once_resumed_after_a_cut_and_deleted_by_retention() {
    let dir = tempfile::tempdir().expect("temp dir");
    let objects = dir.path().join("objects");
    let log = open_log(&dir.path().join("t-0"));
    let id = uuid::Uuid::new_v4();
    let partition_dir = format!("t-{}", id.simple());
    append(&log, 20, b'a');
    let sealed = log.sealed_segments(log.last_stable_offset()).expect("sealed");
    assert!(sealed.len() >= 3, "20 batches of 1 KiB segments make several closed segments");

    let tier = tier_at(&objects);
    let partition = tier.partition("t", id, 0);
    let outcome = partition.sync(&log, 7, 1_000).await.expect("first pass");
    assert_eq!(outcome.uploaded_segments, sealed.len());
    let status = partition.status();
    assert_eq!(status.remote_start_offset, Some(0));
    assert_eq!(status.remote_end_offset, sealed.last().map(|s| s.next_offset));
    assert_eq!((status.lag_segments, status.lag_bytes), (0, 0));
    let local = local_segments(&dir.path().join("t-0"));
    for segment in partition.remote_segments().await.expect("listed") {
        let stem = format!("{:020}-{:020}", segment.base_offset, segment.next_offset);
        let uploaded = object(&objects, &partition_dir, &format!("{stem}.log")).expect("the .log object");
        assert!(uploaded == local[&segment.base_offset], "segment {stem} differs from the local file");
        assert!(object(&objects, &partition_dir, &format!("{stem}.index")).is_some(), "{stem}.index");
        assert!(object(&objects, &partition_dir, &format!("{stem}.timeindex")).is_some(), "{stem}.timeindex");
        assert_eq!(segment.uploaded_by, 7);
        assert_eq!(segment.leader_epochs, vec![(0, 0)]);
    }
    assert_eq!(partition.sync(&log, 7, 2_000).await.expect("second pass").uploaded_segments, 0, "nothing twice");

    // An upload cut short (a kill -9): the next segment's data object is there, garbage, with
    // no manifest. A new process lists the store, finds the segment missing, uploads it again.
    append(&log, 8, b'k');
    let next = log.sealed_segments(log.last_stable_offset()).expect("sealed")[sealed.len()].clone();
    let stem = format!("{:020}-{:020}", next.base_offset, next.next_offset);
    std::fs::write(objects.join(&partition_dir).join("0").join(format!("{stem}.log")), b"torn").expect("torn object");
    let restarted = tier_at(&objects);
    let partition = restarted.partition("t", id, 0);
    assert_eq!(partition.remote_segments().await.expect("listed").len(), sealed.len(), "the torn one is not listed");
    let outcome = partition.sync(&log, 8, 3_000).await.expect("pass after the restart");
    assert!(outcome.uploaded_segments >= 1);
    let local = local_segments(&dir.path().join("t-0"));
    assert!(object(&objects, &partition_dir, &format!("{stem}.log")) == Some(local[&next.base_offset].clone()));

    // Retention (here DeleteRecords) moves the log start: the segments below it leave the store.
    let cut = sealed[2].base_offset;
    log.delete_records_before(cut).expect("delete records");
    log.apply_retention().expect("retention");
    let outcome = partition.sync(&log, 8, 4_000).await.expect("pass after retention");
    assert_eq!(outcome.deleted_segments, 2);
    assert_eq!(partition.status().remote_start_offset, Some(cut));
    for gone in &sealed[..2] {
        let stem = format!("{:020}-{:020}", gone.base_offset, gone.next_offset);
        for suffix in [".manifest.json", ".log", ".index", ".timeindex"] {
            assert!(object(&objects, &partition_dir, &format!("{stem}{suffix}")).is_none(), "{stem}{suffix} stayed");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_be_written_fails_the_pass_and_the_next_one_resumes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let objects = dir.path().join("objects");
    let log = open_log(&dir.path().join("t-0"));
    append(&log, 12, b'z');
    let tier = tier_at(&objects);
    let partition = tier.partition("t", uuid::Uuid::new_v4(), 0);
    // The store's directory turns into a file: every write fails, as with a store that is down.
    std::fs::remove_dir_all(&objects).expect("remove the store");
    std::fs::write(&objects, b"not a directory").expect("block the store");
    assert!(partition.sync(&log, 1, 0).await.is_err());
    let status = partition.status();
    assert_eq!(status.failures_total, 1);
    assert!(status.last_error.is_some());
    std::fs::remove_file(&objects).expect("unblock");
    std::fs::create_dir(&objects).expect("store back");
    let outcome = partition.sync(&log, 1, 0).await.expect("the store is back");
    assert!(outcome.uploaded_segments >= 2);
    assert_eq!(partition.status().last_error, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_retention_keeps_only_the_tail_and_the_store_serves_the_rest_byte_for_byte() {
    let dir = tempfile::tempdir().expect("temp dir");
    let objects = dir.path().join("objects");
    let log_dir = dir.path().join("t-0");
    let log = open_log_with(&log_dir, &[("local.retention.bytes", "2048")], OpenOptions::default());
    append(&log, 30, b'r');
    let everything = read_local(&log, 0);
    // A small read-ahead and cache (which a directory store does not use).
    let tier = tier_with_cache(&objects, CacheSettings { bytes: 3000, read_ahead: 1200 });
    let id = uuid::Uuid::new_v4();
    let partition = tier.partition("t", id, 0);
    partition.sync(&log, 1, 0).await.expect("pass");

    // Local retention deletes what the store holds beyond 2 KiB; the log still starts at 0.
    log.apply_retention().expect("retention");
    let local_start = log.local_log_start_offset();
    assert!(local_start > 0, "local retention deleted nothing");
    assert_eq!(log.log_start_offset(), 0, "the log starts in the store");
    assert!(log.size_bytes() <= 2048 + 1024, "local bytes {}", log.size_bytes());
    let remote = read_remote(&partition, 0, local_start).await;
    let expected: Vec<_> = everything.iter().filter(|(base, _)| *base < local_start).cloned().collect();
    assert!(remote == expected, "the store's batches differ from what was appended");
    // A directory store's segments are read in place: nothing is copied into the cache.
    assert_eq!(tier.cache().held_bytes(), 0, "the cache holds {} bytes", tier.cache().held_bytes());
    assert_eq!(tier.cache().misses.load(std::sync::atomic::Ordering::Relaxed), 0);
    // A read in the middle of a batch starts at that batch (as a local read does).
    let mid = partition.read(3, 1 << 20, i64::MAX, true).await.expect("read").expect("batch");
    assert_eq!(mid.slice.first_offset, 2);
    // DeleteRecords past the first segment: it leaves the store, and reads there find nothing.
    let cut = partition.remote_segments().await.expect("listed")[1].base_offset;
    log.delete_records_before(cut).expect("delete records");
    partition.sync(&log, 1, 0).await.expect("pass");
    assert!(matches!(partition.read(0, 1 << 20, i64::MAX, true).await, Err(weir_tier::TierError::NotInStore(0))));

    // A restart that lost the log-start checkpoint: the log starts at its first local segment
    // until the tier lists the store, then where the store does.
    log.close().expect("close");
    drop(log);
    let log = open_log_with(&log_dir, &[("local.retention.bytes", "2048")], OpenOptions::default());
    assert_eq!(log.log_start_offset(), local_start);
    let restarted = tier_at(&objects);
    restarted.partition("t", id, 0).sync(&log, 1, 0).await.expect("pass after restart");
    assert_eq!(log.log_start_offset(), cut, "the store's start, where DeleteRecords had moved it");

    // retention.bytes covers both tiers: the oldest segments leave the store and the log.
    let mut config = (*log.config()).clone();
    config.retention_bytes = (log.size_bytes() + 2000) as i64;
    log.set_config(config);
    let outcome = restarted.partition("t", id, 0).sync(&log, 1, 0).await.expect("retention pass");
    assert!(outcome.deleted_segments >= 1);
    let status = restarted.partition("t", id, 0).status();
    assert_eq!(status.remote_start_offset, Some(log.log_start_offset()));
    let local_start = log.local_log_start_offset();
    let only_remote: u64 = restarted
        .partition("t", id, 0)
        .remote_segments()
        .await
        .expect("listed")
        .iter()
        .filter(|s| s.base_offset < local_start)
        .map(|s| s.log_bytes())
        .sum();
    // Kafka's rule: a segment goes while what is left still reaches retention.bytes, so what
    // stays is within one segment above it.
    assert!(only_remote >= 2000, "retention deleted more than it had to: {only_remote} bytes left in the store");
    assert!(only_remote < 2000 + 1100, "{only_remote} bytes only in the store, retention.bytes leaves 2000");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_larger_than_a_part_goes_up_in_parts_and_comes_back_whole() {
    let dir = tempfile::tempdir().expect("temp dir");
    let objects = dir.path().join("objects");
    // 20 MiB segments: two and a half 8 MiB parts each.
    let log = open_log_with(&dir.path().join("t-0"), &[("segment.bytes", "20971520")], OpenOptions::default());
    for i in 0..2_200 {
        let timestamp =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let spec = BatchSpec { records: 10, value_bytes: 1_000, timestamp, fill: i as u8, ..Default::default() };
        log.append(&mut batch(&spec), 0).expect("append");
    }
    let sealed = log.sealed_segments(log.last_stable_offset()).expect("sealed");
    assert!(!sealed.is_empty() && sealed[0].size > 16 << 20, "a segment over two parts");
    let tier = tier_at(&objects);
    let id = uuid::Uuid::new_v4();
    let partition = tier.partition("t", id, 0);
    partition.sync(&log, 1, 0).await.expect("pass");
    let segment = &partition.remote_segments().await.expect("listed")[0];
    let stem = format!("{:020}-{:020}", segment.base_offset, segment.next_offset);
    let uploaded = object(&objects, &format!("t-{}", id.simple()), &format!("{stem}.log")).expect("the object");
    let local = local_segments(&dir.path().join("t-0"));
    assert!(uploaded == local[&segment.base_offset], "the multipart object differs from the local file");
    let crc = segment.files.iter().find(|f| f.kind == "log").expect("log file").crc32c;
    assert_eq!(crc, crc32c::crc32c(&uploaded), "the manifest's CRC is the object's");
}

/// Appends one batch of keyed records, `(key, value)` each (`None`: a tombstone).
fn append_keyed(log: &Log, records: &[(&str, Option<&str>)]) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let records: Vec<weir_storage::records::Record> = records
        .iter()
        .map(|(k, v)| {
            weir_storage::records::Record::new(
                now,
                Some(bytes::Bytes::from(k.to_string())),
                v.map(|v| bytes::Bytes::from(v.to_string())),
            )
        })
        .collect();
    let mut bytes = weir_storage::records::encode_batch(&records, &Default::default()).expect("encode");
    log.append(&mut bytes, 0).expect("append");
}

/// Every record from `from` to `upto`, read back through the tier, as (offset, key, value).
async fn records_in_store(
    partition: &weir_tier::PartitionTier,
    from: i64,
    upto: i64,
) -> Vec<(i64, String, Option<String>)> {
    let mut out = Vec::new();
    let mut next = from;
    while next < upto {
        let Some(read) = partition.read(next, 700, upto, true).await.expect("remote read") else { break };
        let bytes = read.slice.read_to_vec().expect("bytes");
        for r in weir_storage::records::decode_records(&bytes).expect("decode") {
            let text = |b: &bytes::Bytes| String::from_utf8_lossy(b).to_string();
            out.push((r.offset, r.key.as_ref().map(text).unwrap_or_default(), r.value.as_ref().map(text)));
        }
        assert!(read.slice.next_offset > next, "no progress at {next}");
        next = read.slice.next_offset;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_topics_segments_are_compacted_in_the_store_too() {
    let dir = tempfile::tempdir().expect("temp dir");
    let objects = dir.path().join("objects");
    let log_dir = dir.path().join("c-0");
    let settings = [("cleanup.policy", "compact"), ("local.retention.bytes", "2048"), ("delete.retention.ms", "0")];
    let log = open_log_with(&log_dir, &settings, OpenOptions::default());
    // Ten rounds over keys k0..k4, ten values each; k4 deleted in the last round.
    for round in 0..10 {
        let value = |k: usize| format!("{k}-{round}-{}", "x".repeat(60));
        let batch: Vec<(String, Option<String>)> =
            (0..5).map(|k| (format!("k{k}"), (round < 9 || k != 4).then(|| value(k)))).collect();
        let refs: Vec<(&str, Option<&str>)> = batch.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect();
        append_keyed(&log, &refs);
        if round == 0 {
            // A key written once: its only value stays, wherever it is.
            append_keyed(&log, &[("solo", Some("only")), ("gone", Some("soon")), ("gone", None)]);
        }
    }
    let tier = tier_at(&objects);
    let id = uuid::Uuid::new_v4();
    let partition = tier.partition("c", id, 0);
    partition.sync(&log, 1, 0).await.expect("pass");
    log.apply_retention().expect("retention");
    let local_start = log.local_log_start_offset();
    assert!(local_start > 10, "local retention left {local_start}");
    let before = records_in_store(&partition, 0, local_start).await;
    assert_eq!(before.len() as i64, local_start, "uncompacted: every offset is there");

    // A follower's tier (another broker, the same store) lists the store before the compaction.
    let follower_tier = tier_at(&objects);
    let follower = follower_tier.partition("c", id, 0);
    let follower_log = open_log_with(&dir.path().join("follower-c-0"), &settings, OpenOptions::default());
    follower.refresh(&follower_log).await.expect("follower listing");

    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let outcome = partition.compact(&log, now + 1).await.expect("compaction");
    assert!(outcome.rewritten_segments > 0 && outcome.removed_records > 0, "{outcome:?}");
    let after = records_in_store(&partition, 0, local_start).await;
    // Every key's records in the store are superseded by the local part (rounds go on there):
    // nothing but records newer than anything after them is left.
    let local = read_local(&log, local_start);
    let local_keys: std::collections::HashSet<String> = local
        .iter()
        .flat_map(|(_, b)| weir_storage::records::decode_records(b).expect("decode"))
        .filter_map(|r| r.key.map(|k| String::from_utf8_lossy(&k).to_string()))
        .collect();
    for (offset, key, _) in &after {
        assert!(!local_keys.contains(key), "{key}@{offset} is superseded locally but stayed in the store");
        assert_eq!(after.iter().filter(|(_, k, _)| k == key).count(), 1, "{key} twice in the store");
    }
    assert!(after.len() < before.len());
    assert_eq!(
        after.iter().map(|(_, k, v)| (k.as_str(), v.as_deref())).collect::<Vec<_>>(),
        [("solo", Some("only"))],
        "the store keeps the latest value of a key nothing later supersedes, and drops an expired tombstone"
    );
    // The follower's next listing reads the rewritten manifests again, and only those.
    follower.refresh(&follower_log).await.expect("follower listing");
    assert_eq!(follower.remote_segments().await.expect("listed"), partition.remote_segments().await.expect("listed"));
    let status = partition.status();
    assert_eq!(status.compacted_segments_total, outcome.rewritten_segments as u64);

    // The previous generation's objects go at the next pass; the current ones stay readable.
    let listed = |objects: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(objects.join(format!("c-{}", id.simple())).join("0"))
            .expect("partition dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        names
    };
    let manifests = partition.remote_segments().await.expect("listed");
    let rewritten = manifests.iter().find(|s| s.generation == 1).expect("a rewritten segment");
    let old_name = format!("{:020}-{:020}.log", rewritten.base_offset, rewritten.next_offset);
    assert!(listed(&objects).contains(&old_name), "the old generation is kept a pass");
    partition.compact(&log, now + 2).await.expect("second pass");
    let names = listed(&objects);
    for segment in manifests.iter().filter(|s| s.generation > 0) {
        let stem = format!("{:020}-{:020}", segment.base_offset, segment.next_offset);
        assert!(!names.contains(&format!("{stem}.log")), "{stem}.log outlived its generation: {names:?}");
        assert!(names.contains(&format!("{stem}.c{}.log", segment.generation)), "{names:?}");
    }
    assert_eq!(records_in_store(&partition, 0, local_start).await, after, "a pass with nothing new changes nothing");

    // A restart reads the compacted generations from the manifests.
    let restarted = tier_at(&objects);
    assert_eq!(records_in_store(&restarted.partition("c", id, 0), 0, local_start).await, after);
}
