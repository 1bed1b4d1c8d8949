//! Criterion benchmarks of the storage hot paths: what every produce request costs before and
//! while it reaches the page cache (batch validation, offset assignment, `Log::append`), and
//! what locates the data of a fetch (index lookups, `Log::read`).
//!
//! `cargo bench -p weir-storage` (add `-- --quick` for a run of seconds, as CI does).

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use weir_storage::batch::{assign_offsets, headers, validate_batches};
use weir_storage::offset_index::OffsetIndex;
use weir_storage::testing::{batch, BatchSpec};
use weir_storage::time_index::TimeIndex;
use weir_storage::{Clock, DeletionQueue, Log, LogConfig, OpenOptions, SystemClock};

/// One RecordBatch v2 of 1,000 uncompressed records of 1 KiB: a 1 MiB produce request, as a
/// producer with `batch.size` 1 MiB sends under load.
fn one_mib_batch() -> Vec<u8> {
    batch(&BatchSpec { records: 1000, value_bytes: 1024, ..Default::default() })
}

/// 16 batches of 10 records of 100 bytes back to back: what a partition receives from a
/// producer with small batches (many partitions, short linger).
fn small_batches() -> Vec<u8> {
    (0..16u8).flat_map(|i| batch(&BatchSpec { records: 10, value_bytes: 100, fill: i, ..Default::default() })).collect()
}

/// Pseudo-random numbers below `bound` (xorshift64: no dependency, same sequence every run).
fn random_below(count: usize, bound: u64) -> Vec<u64> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % bound
        })
        .collect()
}

fn open_log(dir: &Path, config: LogConfig, deletion_queue: &Arc<DeletionQueue>) -> Log {
    Log::open(dir, config, Arc::new(SystemClock) as Arc<dyn Clock>, OpenOptions::default(), Arc::clone(deletion_queue))
        .expect("open log")
}

fn validation(c: &mut Criterion) {
    let max = LogConfig::default().max_message_bytes as usize;
    let mut group = c.benchmark_group("validate_batches");
    for (name, bytes) in [("1 batch x 1000 x 1 KiB", one_mib_batch()), ("16 batches x 10 x 100 B", small_batches())] {
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_function(name, |b| b.iter(|| validate_batches(black_box(&bytes), max).expect("valid")));
    }
    group.finish();
}

fn offsets(c: &mut Criterion) {
    let mut group = c.benchmark_group("assign_offsets");
    for (name, bytes) in [("1 batch x 1000 x 1 KiB", one_mib_batch()), ("16 batches x 10 x 100 B", small_batches())] {
        let batches = headers(&bytes).count() as u64;
        let mut buf = bytes.clone();
        // CreateTime: only baseOffset and partitionLeaderEpoch change (outside the CRC), so the
        // cost is per batch, whatever its size.
        group.throughput(Throughput::Elements(batches));
        group.bench_function(format!("{name}, CreateTime"), |b| {
            b.iter(|| assign_offsets(black_box(&mut buf), 1_000_000, 7, None))
        });
        // LogAppendTime: the broker's timestamp goes into every header, so every CRC is redone
        // over the whole batch.
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_function(format!("{name}, LogAppendTime"), |b| {
            b.iter(|| assign_offsets(black_box(&mut buf), 1_000_000, 7, Some(1_700_000_000_000)))
        });
    }
    group.finish();
}

/// Lookups in full indexes of the default `segment.index.bytes` (10 MiB): random targets go
/// through the binary search of the whole index, tail targets stay in its warm section.
fn indexes(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let index_bytes = LogConfig::default().segment_index_bytes;
    let base = 1_000_000i64;

    // One entry per 16 offsets and 2 KiB of log (positions stay below u32::MAX).
    let mut offset_index = OffsetIndex::open(&dir.path().join("bench.index"), base, Some(index_bytes)).expect("open");
    let mut entries = 0i64;
    while !offset_index.is_full() {
        offset_index.append(base + entries * 16, (entries * 2048) as u32);
        entries += 1;
    }
    let last_offset = base + (entries - 1) * 16;
    let targets: Vec<i64> = random_below(4096, (entries * 16) as u64).into_iter().map(|r| base + r as i64).collect();
    let mut group = c.benchmark_group("offset_index");
    group.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    group.bench_function(format!("lookup, random, full ({entries} entries)"), |b| {
        b.iter(|| {
            i = (i + 1) % targets.len();
            offset_index.lookup(black_box(targets[i]))
        })
    });
    group.bench_function("lookup, tail (warm section)", |b| {
        b.iter(|| offset_index.lookup(black_box(last_offset - 100)))
    });
    group.finish();

    // One entry per 16 offsets, each 10 ms later than the previous one.
    let mut time_index = TimeIndex::open(&dir.path().join("bench.timeindex"), base, Some(index_bytes)).expect("open");
    let t0 = 1_700_000_000_000i64;
    let mut entries = 0i64;
    while !time_index.is_full() {
        time_index.maybe_append(t0 + entries * 10, base + entries * 16);
        entries += 1;
    }
    let last_timestamp = t0 + (entries - 1) * 10;
    let targets: Vec<i64> = random_below(4096, (entries * 10) as u64).into_iter().map(|r| t0 + r as i64).collect();
    let mut group = c.benchmark_group("time_index");
    group.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    group.bench_function(format!("lookup_below, random, full ({entries} entries)"), |b| {
        b.iter(|| {
            i = (i + 1) % targets.len();
            time_index.lookup_below(black_box(targets[i]))
        })
    });
    group.bench_function("lookup_below, tail (warm section)", |b| {
        b.iter(|| time_index.lookup_below(black_box(last_timestamp - 100)))
    });
    group.finish();
}

/// `Log::append` of a 1 MiB batch with `flush.policy=none` (it ends in the page cache), and
/// `Log::read` from a random offset of a 68 MB log.
fn log(c: &mut Criterion) {
    let mut group = c.benchmark_group("log");

    // The log is emptied (outside the measured time) after every 64 appends, so it stays small
    // however many iterations criterion asks for, and no segment roll (fsync of the directory)
    // falls inside the measured time.
    let dir = tempfile::tempdir().expect("tempdir");
    let deletion_queue = Arc::new(DeletionQueue::new());
    let log = open_log(dir.path(), LogConfig::default(), &deletion_queue);
    let empty = |log: &Log| {
        log.truncate_to(log.log_start_offset()).expect("truncate");
        deletion_queue.remove_due(i64::MAX);
    };
    // The batch is validated on every append; assign_offsets rewrites only fields outside the
    // CRC, so the same buffer can be appended again.
    let mut records = one_mib_batch();
    group.throughput(Throughput::Bytes(records.len() as u64));
    group.bench_function("append 1 MiB batch, flush none", |b| {
        b.iter_custom(|iters| {
            let mut measured = Duration::ZERO;
            for n in 0..iters {
                let started = Instant::now();
                black_box(log.append(&mut records, 0).expect("append"));
                measured += started.elapsed();
                if n % 64 == 63 {
                    empty(&log);
                }
            }
            empty(&log);
            measured
        })
    });
    drop(log);

    // 4,096 batches of 16 x 1 KiB records (68 MB) in 16 MiB segments; a read returns up to 1 MiB
    // (a consumer's max.partition.fetch.bytes) from the batch holding the offset, as a file range
    // (the data itself is not read: the broker sends it with sendfile).
    let dir = tempfile::tempdir().expect("tempdir");
    let config = LogConfig { segment_bytes: 16 << 20, ..LogConfig::default() };
    let log = open_log(dir.path(), config, &deletion_queue);
    let batch16 = batch(&BatchSpec { records: 16, value_bytes: 1024, ..Default::default() });
    for _ in 0..4096 {
        log.append(&mut batch16.clone(), 0).expect("append");
    }
    let end = log.log_end_offset();
    let targets = random_below(4096, end as u64);
    group.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    group.bench_function(format!("read 1 MiB at a random offset ({} segments)", log.segment_count()), |b| {
        b.iter_batched(
            || {
                i = (i + 1) % targets.len();
                targets[i] as i64
            },
            |from| log.read(from, 1 << 20, end).expect("read"),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, validation, offsets, indexes, log);
criterion_main!(benches);
