//! `weir bench fetch`: zero-copy (sendfile) fetch against the user-space copy path, measured on
//! two real brokers side by side. See `FETCH_LONG_ABOUT` in `cli.rs` for what is measured.

use std::time::Instant;

use anyhow::Context;
use serde::Serialize;

use crate::cli::FetchBenchArgs;
use crate::raw_protocol::{self, Server};

const TOPIC: &str = "bench-fetch";
const RECORD_BYTES: usize = 1024;
const RECORDS_PER_BATCH: usize = 1000;

fn start_server(sendfile: bool) -> anyhow::Result<Server> {
    let settings =
        [("fetch.sendfile.enable".to_string(), sendfile.to_string()), ("admin.listeners".to_string(), String::new())];
    Server::start("weir-bench-fetch-", &settings, None)
}

fn prepare(server: &Server, bytes: u64) -> anyhow::Result<i64> {
    let mut client = raw_protocol::connect(server.addr)?;
    raw_protocol::create_topic(&mut client, TOPIC, 1, &[], None)?;
    let (_, end) =
        raw_protocol::produce_filler(&mut client, TOPIC, bytes, RECORDS_PER_BATCH, RECORD_BYTES, 1_700_000_000_000)?;
    Ok(end)
}

/// Reads offsets `0..end`; returns the record bytes received.
fn fetch_all(server: &Server, end: i64, fetch_bytes: i32) -> anyhow::Result<u64> {
    let mut client = raw_protocol::connect(server.addr)?;
    Ok(raw_protocol::fetch_all(&mut client, TOPIC, &[(0, 0, end)], fetch_bytes)?.bytes)
}

#[derive(Debug, Serialize)]
struct ModeResult {
    mode: &'static str,
    best_mb_per_s: f64,
    cpu_seconds_per_gb: f64,
    rounds_mb_per_s: Vec<f64>,
}

pub(crate) fn run(args: &FetchBenchArgs) -> anyhow::Result<()> {
    let bytes = args.bytes.unwrap_or(if args.quick { 64 << 20 } else { 1 << 30 });
    let fetch_bytes = i32::try_from(args.fetch_bytes).context("--fetch-bytes must be below 2 GiB")?;
    let rounds = if args.quick { args.rounds.min(2) } else { args.rounds }.max(1);
    let modes = [("sendfile", true), ("copy", false)];
    let mut servers = Vec::new();
    for (name, sendfile) in modes {
        let server = start_server(sendfile)?;
        let end = prepare(&server, bytes)?;
        eprintln!("{name}: broker at {}, {} records written", server.addr, end);
        // One untimed pass brings both logs into the page cache alike.
        fetch_all(&server, end, fetch_bytes)?;
        servers.push((name, server, end, Vec::new(), 0.0f64, 0u64));
    }
    for round in 0..rounds {
        for (name, server, end, speeds, cpu, total) in servers.iter_mut() {
            let cpu_before = server.cpu_seconds()?;
            let started = Instant::now();
            let received = fetch_all(server, *end, fetch_bytes)?;
            let seconds = started.elapsed().as_secs_f64();
            *cpu += server.cpu_seconds()? - cpu_before;
            *total += received;
            let mb_per_s = received as f64 / 1e6 / seconds;
            eprintln!("round {}: {name} {:.0} MB/s", round + 1, mb_per_s);
            speeds.push(mb_per_s);
        }
    }
    let results: Vec<ModeResult> = servers
        .iter()
        .map(|(name, _, _, speeds, cpu, total)| ModeResult {
            mode: name,
            best_mb_per_s: speeds.iter().cloned().fold(0.0, f64::max),
            cpu_seconds_per_gb: cpu / (*total as f64 / 1e9),
            rounds_mb_per_s: speeds.clone(),
        })
        .collect();
    println!(
        "Fetch of {} MiB from the page cache, {} KiB per request, {rounds} rounds per mode",
        bytes >> 20,
        fetch_bytes >> 10
    );
    println!("{:<10} {:>12} {:>18}", "mode", "best MB/s", "broker CPU s/GB");
    for r in &results {
        println!("{:<10} {:>12.0} {:>18.3}", r.mode, r.best_mb_per_s, r.cpu_seconds_per_gb);
    }
    if let [zero_copy, copy] = &results[..] {
        println!(
            "sendfile vs copy: {:.2}x throughput, {:.2}x broker CPU per GB",
            zero_copy.best_mb_per_s / copy.best_mb_per_s,
            zero_copy.cpu_seconds_per_gb / copy.cpu_seconds_per_gb
        );
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&results)?)?;
    }
    Ok(())
}
