//! Helpers shared by the storage integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use weir_storage::testing::{batch, BatchSpec};
use weir_storage::{Clock, DeletionQueue, Log, LogConfig, ManualClock, OpenOptions};

pub const T0: i64 = 1_700_000_000_000;

pub fn config(pairs: &[(&str, &str)]) -> LogConfig {
    let props: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    LogConfig::default().with_overrides(&props).expect("valid test config")
}

pub fn open(dir: &Path, config: LogConfig, clock: Arc<ManualClock>, options: OpenOptions) -> Log {
    Log::open(dir, config, clock as Arc<dyn Clock>, options, Arc::new(DeletionQueue::new())).expect("open log")
}

pub fn records(n: usize, value_bytes: usize, timestamp: i64, fill: u8) -> Vec<u8> {
    batch(&BatchSpec { records: n, value_bytes, timestamp, fill, ..Default::default() })
}

/// Reads every batch from `from` to the log end, returning (base offset, bytes) per batch.
pub fn read_all(log: &Log, from: i64) -> Vec<(i64, Vec<u8>)> {
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
