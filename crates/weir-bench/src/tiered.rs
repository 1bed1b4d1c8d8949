//! `weir bench tiered`: fetching what only the object store holds against fetching local data,
//! on one broker, side by side. See `TIERED_LONG_ABOUT` in `cli.rs`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use serde::Serialize;
use weir_harness::kafka_client::produce_request;

use crate::cli::TieredBenchArgs;
use crate::elastic::weir_json;
use crate::raw_protocol::{self, Server};

const TOPIC: &str = "bench-tiered";
const RECORD_BYTES: usize = 1024;
const RECORDS_PER_BATCH: usize = 1000;

#[derive(Debug, Serialize)]
struct TierResult {
    source: &'static str,
    best_mb_per_s: f64,
    cpu_seconds_per_gb: f64,
    rounds_mb_per_s: Vec<f64>,
}

pub(crate) fn run(args: &TieredBenchArgs) -> anyhow::Result<()> {
    let bytes = args.bytes.unwrap_or(if args.quick { 48 << 20 } else { 512 << 20 });
    let rounds = if args.quick { args.rounds.min(2) } else { args.rounds }.max(1);
    let settings: Vec<(String, String)> = [
        ("remote.log.storage.system.enable", "true".to_string()),
        ("remote.log.manager.task.interval.ms", "200".to_string()),
        ("log.retention.check.interval.ms", "200".to_string()),
        ("remote.log.read.ahead.bytes", args.read_ahead.to_string()),
        // Smaller than a round's reads: every round reads the store, not the cache.
        ("remote.log.cache.bytes", (args.read_ahead * 2).to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let server = Server::start_with_admin("weir-bench-tiered-", &settings, None)?;
    let admin = server.admin.context("the broker has no admin listener")?;
    // Sixteen segments or more, and a quarter of the data left on local disk.
    let segment_bytes = (bytes / 16).clamp(1 << 20, 64 << 20);
    let end = prepare(&server, bytes, segment_bytes, (bytes / 4).max(segment_bytes))?;
    let local_start = wait_for_local_retention(admin, end)?;
    // Equal offsets from each: the oldest from the store, the newest from local disk.
    let span = end - local_start;
    let ranges = [("object store", 0, span), ("local disk", local_start, end)];
    eprintln!("{end} records, the last {span} on local disk; reading {span} from each");
    let mut client = raw_protocol::connect(server.addr)?;
    // One untimed read of the local part: it is then in the page cache, as a consumer's tail is.
    raw_protocol::fetch_all(&mut client, TOPIC, &[(0, local_start, end)], 1 << 20)?;
    let mut results: Vec<(&'static str, Vec<f64>, f64, u64)> =
        ranges.iter().map(|(name, _, _)| (*name, Vec::new(), 0.0, 0)).collect();
    for round in 0..rounds {
        for ((name, from, to), (_, speeds, cpu, total)) in ranges.iter().zip(results.iter_mut()) {
            let cpu_before = server.cpu_seconds()?;
            let started = Instant::now();
            let fetched = raw_protocol::fetch_all(&mut client, TOPIC, &[(0, *from, *to)], 1 << 20)?;
            let seconds = started.elapsed().as_secs_f64();
            *cpu += server.cpu_seconds()? - cpu_before;
            *total += fetched.bytes;
            let mb_per_s = fetched.bytes as f64 / 1e6 / seconds;
            eprintln!("round {}: {name} {mb_per_s:.0} MB/s", round + 1);
            speeds.push(mb_per_s);
        }
    }
    let results: Vec<TierResult> = results
        .into_iter()
        .map(|(source, speeds, cpu, total)| TierResult {
            source,
            best_mb_per_s: speeds.iter().cloned().fold(0.0, f64::max),
            cpu_seconds_per_gb: cpu / (total as f64 / 1e9),
            rounds_mb_per_s: speeds,
        })
        .collect();
    println!(
        "Fetch of {:.0} MiB from each source, 1 MiB per request, read-ahead {} KiB, {rounds} rounds (directory store)",
        (span as u64 * RECORD_BYTES as u64) as f64 / f64::from(1 << 20),
        args.read_ahead >> 10
    );
    println!("{:<14} {:>12} {:>18}", "source", "best MB/s", "broker CPU s/GB");
    for r in &results {
        println!("{:<14} {:>12.0} {:>18.3}", r.source, r.best_mb_per_s, r.cpu_seconds_per_gb);
    }
    if let [store, local] = &results[..] {
        println!(
            "object store vs local: {:.2}x throughput, {:.2}x broker CPU per GB",
            store.best_mb_per_s / local.best_mb_per_s,
            store.cpu_seconds_per_gb / local.cpu_seconds_per_gb
        );
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&results)?)?;
    }
    Ok(())
}

/// Creates the tiered topic and writes `bytes` of 1 KiB records; returns the log end offset.
fn prepare(server: &Server, bytes: u64, segment_bytes: u64, local_bytes: u64) -> anyhow::Result<i64> {
    let mut client = raw_protocol::connect(server.addr)?;
    let configs: Vec<(String, String)> = [
        ("remote.storage.enable", "true".to_string()),
        ("segment.bytes", segment_bytes.to_string()),
        ("local.retention.bytes", local_bytes.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    raw_protocol::create_topic(&mut client, TOPIC, 1, &configs, None)?;
    // Stamped now: retention.ms (7 days) must not find the records expired.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let records: Vec<_> = (0..RECORDS_PER_BATCH)
        .map(|i| {
            let value = Bytes::from(vec![b'x'; RECORD_BYTES]);
            weir_storage::testing::record(i as i64, now + i as i64, None, Some(value))
        })
        .collect();
    let batch = Bytes::from(weir_storage::testing::encode(&records, weir_storage::Compression::None));
    let mut end = 0;
    for _ in 0..bytes.div_ceil(batch.len() as u64).max(1) {
        let response = client.send(9, &produce_request(TOPIC, 0, batch.clone(), 1))?;
        let partition =
            response.responses.first().and_then(|t| t.partition_responses.first()).context("empty produce response")?;
        if partition.error_code != 0 {
            bail!("Produce failed with error {}", raw_protocol::error_name(partition.error_code));
        }
        end = partition.base_offset + RECORDS_PER_BATCH as i64;
    }
    Ok(end)
}

/// Waits until every closed segment is uploaded and local retention kept only the newest ones;
/// returns the local log start offset.
fn wait_for_local_retention(admin: SocketAddr, end: i64) -> anyhow::Result<i64> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let described = weir_json(admin, &["topic", "describe", TOPIC])?;
        let remote = &described["partitions"][0]["remote"];
        let local_start = remote["local_log_start_offset"].as_i64().unwrap_or(0);
        let lag = remote["upload_lag_segments"].as_u64().unwrap_or(u64::MAX);
        if lag == 0 && local_start * 2 >= end {
            return Ok(local_start);
        }
        if Instant::now() > deadline {
            bail!("uploads and local retention did not finish within 300 s: {remote}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
