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
    if args.store_down {
        return run_store_down(args);
    }
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

#[derive(Debug, Serialize)]
struct OutageResult {
    store: &'static str,
    produced_mb_per_s: f64,
    produce_p50_ms: f64,
    produce_p99_ms: f64,
    /// Local log bytes at the end, and how fast they grew.
    local_bytes: u64,
    local_growth_mb_per_s: f64,
    upload_failures: u64,
}

/// `--store-down`: the same paced produce to two brokers in turn, one whose store answers and
/// one whose store refuses every connection. What it shows: producing does not notice, and with
/// the store down local disk keeps everything (local retention deletes only what the store
/// holds), so a disk budget lasts budget / produce rate.
fn run_store_down(args: &TieredBenchArgs) -> anyhow::Result<()> {
    let rate = args.rate;
    let seconds = if args.quick { 3 } else { args.seconds };
    let unreachable = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    // The port is free again once the listener is dropped: connections are refused.
    let stores: [(&'static str, Vec<(String, String)>); 2] = [
        ("up (directory)", Vec::new()),
        (
            "down (refused)",
            vec![
                ("object.store.url".into(), "s3://unreachable/weir".into()),
                ("object.store.endpoint".into(), format!("http://{unreachable}")),
                ("object.store.access.key.id".into(), "k".into()),
                ("object.store.secret.access.key".into(), "s".into()),
                ("object.store.path.style".into(), "true".into()),
            ],
        ),
    ];
    let segment_bytes = (rate * seconds / 16).clamp(1 << 20, 64 << 20);
    let mut results = Vec::new();
    for (store, extra) in stores {
        let mut settings: Vec<(String, String)> = [
            ("remote.log.storage.system.enable", "true"),
            ("remote.log.manager.task.interval.ms", "500"),
            ("log.retention.check.interval.ms", "500"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        settings.extend(extra);
        let server = Server::start_with_admin("weir-bench-tiered-outage-", &settings, None)?;
        let admin = server.admin.context("the broker has no admin listener")?;
        let mut client = raw_protocol::connect(server.addr)?;
        let configs: Vec<(String, String)> = [
            ("remote.storage.enable", "true".to_string()),
            ("segment.bytes", segment_bytes.to_string()),
            ("local.retention.bytes", (2 * segment_bytes).to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        raw_protocol::create_topic(&mut client, TOPIC, 1, &configs, None)?;
        let batch = batch_of_now()?;
        let mut latencies = crate::produce::latency_histogram()?;
        let started = Instant::now();
        let mut sent = 0u64;
        while started.elapsed() < Duration::from_secs(seconds) {
            // Paced: a batch whenever the rate allows one.
            let due = Duration::from_secs_f64(sent as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
            let at = Instant::now();
            let response = client.send(9, &produce_request(TOPIC, 0, batch.clone(), 1))?;
            let code =
                response.responses.first().and_then(|t| t.partition_responses.first()).map_or(-1, |p| p.error_code);
            if code != 0 {
                bail!("Produce failed with error {}", raw_protocol::error_name(code));
            }
            latencies.record(at.elapsed().as_micros().max(1) as u64)?;
            sent += batch.len() as u64;
        }
        let elapsed = started.elapsed().as_secs_f64();
        // A pass and a retention check to settle.
        std::thread::sleep(Duration::from_millis(1500));
        let described = weir_json(admin, &["topic", "describe", TOPIC])?;
        let partition = &described["partitions"][0];
        let local_bytes = partition["size_bytes"].as_u64().unwrap_or(0);
        let latency = crate::produce::Latency::of(&latencies).context("no produce was timed")?;
        results.push(OutageResult {
            store,
            produced_mb_per_s: sent as f64 / 1e6 / elapsed,
            produce_p50_ms: latency.p50,
            produce_p99_ms: latency.p99,
            local_bytes,
            local_growth_mb_per_s: local_bytes as f64 / 1e6 / elapsed,
            upload_failures: partition["remote"]["upload_failures"].as_u64().unwrap_or(0),
        });
    }
    println!(
        "Produce at {:.0} MB/s for {seconds} s (batches of 1,000 1 KiB records, acks=1), local.retention.bytes {} MiB",
        rate as f64 / 1e6,
        (2 * segment_bytes) >> 20
    );
    println!(
        "{:<16} {:>10} {:>9} {:>9} {:>12} {:>14} {:>9}",
        "store", "MB/s", "p50 ms", "p99 ms", "local MiB", "growth MB/s", "failures"
    );
    for r in &results {
        println!(
            "{:<16} {:>10.1} {:>9.2} {:>9.2} {:>12.1} {:>14.1} {:>9}",
            r.store,
            r.produced_mb_per_s,
            r.produce_p50_ms,
            r.produce_p99_ms,
            r.local_bytes as f64 / f64::from(1 << 20),
            r.local_growth_mb_per_s,
            r.upload_failures
        );
    }
    if let [_, down] = &results[..] {
        let budget = args.budget as f64;
        println!(
            "with the store down, a {:.0} GiB disk budget lasts {:.1} h at this rate ({:.0} s per GiB)",
            budget / f64::from(1 << 30),
            budget / (down.local_growth_mb_per_s * 1e6) / 3600.0,
            f64::from(1 << 30) / (down.local_growth_mb_per_s * 1e6)
        );
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&results)?)?;
    }
    Ok(())
}

/// One batch of 1,000 records of 1 KiB (under `max.message.bytes`), stamped now.
fn batch_of_now() -> anyhow::Result<Bytes> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let records: Vec<_> = (0..RECORDS_PER_BATCH as i64)
        .map(|i| weir_storage::testing::record(i, now + i, None, Some(Bytes::from(vec![b'x'; RECORD_BYTES]))))
        .collect();
    Ok(Bytes::from(weir_storage::testing::encode(&records, weir_storage::Compression::None)))
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
    let (_, end) = raw_protocol::produce_filler(&mut client, TOPIC, bytes, RECORDS_PER_BATCH, RECORD_BYTES, now)?;
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
