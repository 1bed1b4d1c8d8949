//! `weir bench elastic`: what a split costs producers, and what an elastic topic costs against a
//! plain one. See `ELASTIC_LONG_ABOUT` in `cli.rs`.
//!
//! - **A split under load**, on three nodes with replication factor 2: a writer per stable
//!   partition produces one batch at a time with `acks=all`; after `--seconds` the first physical
//!   partition is split (`weir topic split`, which answers once its moves are done), then the
//!   writers go on for `--seconds` more. Reported: the acknowledged messages per second before,
//!   during and after the split, and each stable partition's stall (the longest time without
//!   an acknowledgement from the split's start until a second after it was in force), split by
//!   whether the partition moved.
//! - **The cost of elastic**, on one node: a plain topic and an elastic topic of the same
//!   partition count take turns, each written by the same writers for `--seconds` and then read
//!   whole with Fetch; reported as MB/s and broker CPU seconds per GB of each.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

use crate::cli::ElasticBenchArgs;
use crate::failover::{lock, stall, write_partition, AckTimes};
use crate::raw_protocol::{self, Server};
use crate::{metadata, produce};

/// Records per batch each writer sends, and their value size.
const RECORDS_PER_BATCH: usize = 10;
const VALUE_BYTES: usize = 100;

#[derive(Debug, Serialize)]
struct SplitReport {
    stable_partitions: i32,
    moved: Vec<i32>,
    acks_per_sec_before: f64,
    acks_per_sec_during: f64,
    acks_per_sec_after: f64,
    split_seconds: f64,
    stall_moved_p50_ms: f64,
    stall_moved_p99_ms: f64,
    stall_stayed_p50_ms: f64,
    stall_stayed_p99_ms: f64,
}

#[derive(Debug, Serialize)]
struct CostReport {
    kind: &'static str,
    produce_mb_per_s: Vec<f64>,
    produce_cpu_seconds_per_gb: f64,
    fetch_mb_per_s: Vec<f64>,
    fetch_cpu_seconds_per_gb: f64,
}

pub(crate) fn run(args: &ElasticBenchArgs) -> anyhow::Result<()> {
    let split = measure_split(args)?;
    print_split(&split);
    let costs = measure_cost(args)?;
    print_costs(&costs);
    if let Some(path) = &args.json {
        let report = serde_json::json!({ "split": split, "cost": costs });
        std::fs::write(path, serde_json::to_vec_pretty(&report)?).with_context(|| format!("writing {path:?}"))?;
    }
    Ok(())
}

/// Runs `weir ARGS --admin URL --json` (this binary's own client commands) and parses its answer.
pub(crate) fn weir_json(admin: SocketAddr, args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let exe = std::env::current_exe().context("this binary's path")?;
    let output = Command::new(exe)
        .args(args)
        .args(["--admin", &format!("http://{admin}"), "--json"])
        .output()
        .with_context(|| format!("weir {}", args.join(" ")))?;
    if !output.status.success() {
        bail!("weir {} failed: {}", args.join(" "), String::from_utf8_lossy(&output.stderr));
    }
    serde_json::from_slice(&output.stdout).with_context(|| format!("the answer of weir {}", args.join(" ")))
}

/// Writers, one per partition of `topic`, until the returned stop flag is set.
struct Writers {
    acks: AckTimes,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl Writers {
    fn start(nodes: Vec<SocketAddr>, topic: &str, partitions: i32) -> anyhow::Result<Writers> {
        let bootstrap = Arc::new(Mutex::new(nodes));
        let acks: AckTimes = Arc::new((0..partitions).map(|_| Mutex::new(Vec::new())).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let records = produce::encode_records(VALUE_BYTES, RECORDS_PER_BATCH)?;
        let threads = (0..partitions)
            .map(|p| {
                let (bootstrap, acks, stop, records) = (bootstrap.clone(), acks.clone(), stop.clone(), records.clone());
                let topic = topic.to_string();
                std::thread::spawn(move || write_partition(&bootstrap, &topic, p, records, &acks, &stop))
            })
            .collect();
        Ok(Writers { acks, stop, threads })
    }

    /// Acknowledged batches in `[from, to)`, all partitions.
    fn acked_between(&self, from: Instant, to: Instant) -> usize {
        self.acks.iter().map(|a| lock(a).iter().filter(|t| **t >= from && **t < to).count()).sum()
    }

    fn finish(self) -> anyhow::Result<AckTimes> {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().map_err(|_| anyhow::anyhow!("a writer thread panicked"))??;
        }
        Ok(self.acks)
    }
}

fn percentile_ms(mut values: Vec<f64>, p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let index = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[index.min(values.len() - 1)] * 1000.0
}

fn measure_split(args: &ElasticBenchArgs) -> anyhow::Result<SplitReport> {
    let setup = metadata::start_with_admin(3, &[("replica.lag.time.max.ms", "2000")])?;
    let admin = setup.nodes[0].admin.context("node 1 has no admin listener")?;
    let stable = args.stable_partitions.to_string();
    weir_json(
        admin,
        &[
            "topic",
            "create",
            "elastic-split",
            "--elastic",
            "--partitions",
            "2",
            "--stable-partitions",
            &stable,
            "--replication-factor",
            "2",
        ],
    )?;
    let phase = Duration::from_secs(args.seconds);
    let writers =
        Writers::start(setup.nodes.iter().map(|n| n.addr).collect(), "elastic-split", args.stable_partitions)?;
    let started = Instant::now();
    std::thread::sleep(phase);
    let split_at = Instant::now();
    let split = weir_json(admin, &["topic", "split", "elastic-split", "--partition", "0", "--wait-ms", "120000"]);
    let in_force_at = Instant::now();
    std::thread::sleep(phase);
    let ended = Instant::now();
    let acks = writers.finish();
    let (split, acks) = (split?, acks?);
    if split["in_force"] != serde_json::Value::Bool(true) {
        bail!("the split was not in force within 120 s: {split}");
    }
    let moved: Vec<i32> = ["moving", "new_leaders"]
        .iter()
        .flat_map(|field| split[field].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_i64().map(|v| v as i32))
        .collect();
    let until = in_force_at + Duration::from_secs(1);
    let (mut moved_stalls, mut stayed_stalls) = (Vec::new(), Vec::new());
    for (partition, times) in acks.iter().enumerate() {
        let times: Vec<Instant> = lock(times).iter().copied().filter(|t| *t <= until).collect();
        let stall = stall(&times, split_at).unwrap_or(until - split_at).as_secs_f64();
        if moved.contains(&(partition as i32)) {
            moved_stalls.push(stall);
        } else {
            stayed_stalls.push(stall);
        }
    }
    let count_between = |from: Instant, to: Instant| -> f64 {
        let n: usize = acks.iter().map(|a| lock(a).iter().filter(|t| **t >= from && **t < to).count()).sum();
        (n * RECORDS_PER_BATCH) as f64 / to.duration_since(from).as_secs_f64().max(1e-3)
    };
    Ok(SplitReport {
        stable_partitions: args.stable_partitions,
        moved,
        acks_per_sec_before: count_between(started, split_at),
        acks_per_sec_during: count_between(split_at, in_force_at),
        acks_per_sec_after: count_between(in_force_at, ended),
        split_seconds: in_force_at.duration_since(split_at).as_secs_f64(),
        stall_moved_p50_ms: percentile_ms(moved_stalls.clone(), 0.5),
        stall_moved_p99_ms: percentile_ms(moved_stalls, 0.99),
        stall_stayed_p50_ms: percentile_ms(stayed_stalls.clone(), 0.5),
        stall_stayed_p99_ms: percentile_ms(stayed_stalls, 0.99),
    })
}

fn measure_cost(args: &ElasticBenchArgs) -> anyhow::Result<Vec<CostReport>> {
    let server = Server::start_with_admin("weir-bench-elastic-", &[], None)?;
    let admin = server.admin.context("the node has no admin listener")?;
    let partitions = args.stable_partitions.to_string();
    weir_json(admin, &["topic", "create", "plain", "--partitions", &partitions])?;
    let physical = (args.stable_partitions / 4).max(1).to_string();
    weir_json(
        admin,
        &["topic", "create", "elastic", "--elastic", "--partitions", &physical, "--stable-partitions", &partitions],
    )?;
    let mut reports = Vec::new();
    let mut totals = Vec::new();
    for kind in ["plain", "elastic"] {
        reports.push(CostReport {
            kind,
            produce_mb_per_s: Vec::new(),
            produce_cpu_seconds_per_gb: 0.0,
            fetch_mb_per_s: Vec::new(),
            fetch_cpu_seconds_per_gb: 0.0,
        });
        totals.push((0.0f64, 0u64, 0.0f64, 0u64));
    }
    let batch_bytes = produce::encode_records(VALUE_BYTES, RECORDS_PER_BATCH)?.len() as u64;
    let all: Vec<i32> = (0..args.stable_partitions).collect();
    for _round in 0..args.rounds {
        for (i, kind) in ["plain", "elastic"].into_iter().enumerate() {
            let mut client = raw_protocol::connect(server.addr)?;
            let start_offsets = raw_protocol::latest_offsets(&mut client, kind, &all)?;
            let cpu_before = server.cpu_seconds()?;
            let writers = Writers::start(vec![server.addr], kind, args.stable_partitions)?;
            let started = Instant::now();
            std::thread::sleep(Duration::from_secs(args.seconds));
            let ended = Instant::now();
            let batches = writers.acked_between(started, ended);
            writers.finish()?;
            let cpu = server.cpu_seconds()? - cpu_before;
            let bytes = batches as u64 * batch_bytes;
            reports[i].produce_mb_per_s.push(bytes as f64 / 1e6 / ended.duration_since(started).as_secs_f64());
            totals[i].0 += cpu;
            totals[i].1 += bytes;
            let end_offsets = raw_protocol::latest_offsets(&mut client, kind, &all)?;
            let ranges: Vec<(i32, i64, i64)> =
                all.iter().map(|p| (*p, start_offsets[*p as usize], end_offsets[*p as usize])).collect();
            let cpu_before = server.cpu_seconds()?;
            let started = Instant::now();
            let fetched = raw_protocol::fetch_all(&mut client, kind, &ranges, 1 << 20)?;
            let seconds = started.elapsed().as_secs_f64();
            totals[i].2 += server.cpu_seconds()? - cpu_before;
            totals[i].3 += fetched.bytes;
            reports[i].fetch_mb_per_s.push(fetched.bytes as f64 / 1e6 / seconds.max(1e-6));
        }
    }
    for (report, (produce_cpu, produced, fetch_cpu, fetched)) in reports.iter_mut().zip(totals) {
        report.produce_cpu_seconds_per_gb = produce_cpu / (produced.max(1) as f64 / 1e9);
        report.fetch_cpu_seconds_per_gb = fetch_cpu / (fetched.max(1) as f64 / 1e9);
    }
    Ok(reports)
}

fn print_split(r: &SplitReport) {
    println!(
        "Split under load: 3 nodes, replication factor 2, {} stable partitions, one acks=all writer each",
        r.stable_partitions
    );
    println!("  stable partitions moved or given a new leader: {:?}", r.moved);
    println!(
        "  messages/s acknowledged: before {:.0}, during the split ({:.2} s) {:.0}, after {:.0}",
        r.acks_per_sec_before, r.split_seconds, r.acks_per_sec_during, r.acks_per_sec_after
    );
    println!(
        "  produce stall, moved partitions: p50 {:.0} ms, p99 {:.0} ms; the others: p50 {:.0} ms, p99 {:.0} ms",
        r.stall_moved_p50_ms, r.stall_moved_p99_ms, r.stall_stayed_p50_ms, r.stall_stayed_p99_ms
    );
}

fn print_costs(reports: &[CostReport]) {
    println!("Elastic against plain, one node, same partition count, taking turns:");
    println!(
        "  {:<8} {:>24} {:>16} {:>24} {:>16}",
        "topic", "produce MB/s (rounds)", "CPU s/GB", "fetch MB/s (rounds)", "CPU s/GB"
    );
    for r in reports {
        let rounds = |v: &[f64]| v.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(", ");
        println!(
            "  {:<8} {:>24} {:>16.1} {:>24} {:>16.2}",
            r.kind,
            rounds(&r.produce_mb_per_s),
            r.produce_cpu_seconds_per_gb,
            rounds(&r.fetch_mb_per_s),
            r.fetch_cpu_seconds_per_gb
        );
    }
}
