//! What recovery after a crash costs when a log's index files are still preallocated: it must
//! not touch their unused pages (each is 10 MiB by default; 10,000 partitions made that 17 s and
//! 16 GB of page cache before the time index stopped walking its zero-filled tail).

mod common;

use std::sync::Arc;

use common::{config, open, records, T0};
use weir_storage::{ManualClock, OpenOptions};

/// File-backed resident memory of this process, in KiB (`RssFile` in /proc/self/status). This
/// test file holds one test, so nothing else runs in the process meanwhile.
fn resident_file_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssFile:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssFile")
}

#[test]
fn recovery_does_not_touch_the_unused_part_of_preallocated_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    // Kafka's default: 10 MiB per index file, 2,560 pages each.
    let cfg = config(&[("segment.index.bytes", "10485760")]);
    {
        let log = open(dir.path(), cfg.clone(), clock.clone(), OpenOptions::default());
        log.append(&mut records(4, 100, T0, 1), 0).unwrap();
        // No close and no drop (dropping trims the indexes): the files stay preallocated, as
        // after kill -9.
        std::mem::forget(log);
    }
    let before = resident_file_kib();
    let log = open(dir.path(), cfg, clock, OpenOptions::default());
    let grown = resident_file_kib().saturating_sub(before);
    assert_eq!(log.log_end_offset(), 4);
    // Walking a 10 MiB index maps all of it; recovery proper touches a few pages.
    assert!(grown < 2048, "recovery mapped {grown} KiB of file pages: it walked the preallocated index");
}
