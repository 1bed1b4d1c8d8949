//! `weir bench replication`: what replication costs a producer, side by side in one run.
//!
//! It starts a cluster of three `weir server` children (every one a voter and a broker, as the
//! metadata benchmark does) and runs `weir bench produce`'s load against node 1 for each case in
//! turn, `--rounds` times, interleaved so that the machine's drift hits every case alike:
//!
//! - one replica, `acks=1` (the baseline: what a single node does);
//! - three replicas, `acks=1` (the leader answers after its own append; followers fetch meanwhile);
//! - three replicas, `acks=all` (the answer waits until both followers have fetched the batch).
//!
//! Every topic is created with node 1 leading all its partitions, so the load lands on one
//! broker in each case and only the replication differs. The difference between the two
//! three-replica cases' latencies is the replication lag under that load: the time from the
//! leader's append until the followers have the batch. It reports the median MB/s and p50/p99
//! latency per case and each as a ratio to the baseline.
//!
//! Then it moves a partition of `--move-bytes` from node 1 to node 2 (a reassignment), once
//! unthrottled and once under `--move-throttle`, and reports how fast each copy went: the
//! throttled rate as a ratio to the throttle says whether the throttle holds.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use kafka_protocol::messages::alter_partition_reassignments_request::{ReassignablePartition, ReassignableTopic};
use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, BrokerId, IncrementalAlterConfigsRequest, ListPartitionReassignmentsRequest,
};
use kafka_protocol::protocol::StrBytes;

use super::metadata::{self, Setup};
use super::produce::{self, Target};
use super::raw_protocol;
use crate::cli::{ProduceBenchArgs, ReplicationBenchArgs};
use weir_harness::kafka_client::{self, Client};

struct Case {
    label: &'static str,
    replicas: Vec<i32>,
    acks: i16,
}

#[derive(Default)]
struct Samples {
    mb_per_s: Vec<f64>,
    p50_ms: Vec<f64>,
    p99_ms: Vec<f64>,
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A case again when it fails before it measured (the topic could not be created while the
/// quorum was busy): three attempts.
fn with_retries<T>(mut attempt: impl FnMut() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let mut tries = 0;
    loop {
        match attempt() {
            Ok(value) => return Ok(value),
            Err(e) if tries < 2 => {
                tries += 1;
                eprintln!("weir bench replication: {e:#}; trying again");
                std::thread::sleep(std::time::Duration::from_secs(2));
            }
            Err(e) => return Err(e),
        }
    }
}

pub(crate) fn run(args: &ReplicationBenchArgs) -> anyhow::Result<()> {
    let produce: &ProduceBenchArgs = &args.produce;
    let size =
        usize::try_from(produce.size).ok().filter(|&s| s <= 64 << 20).context("--size must be at most 64 MiB")?;
    let cases = [
        Case { label: "1 replica,  acks=1  ", replicas: vec![1], acks: 1 },
        Case { label: "3 replicas, acks=1  ", replicas: vec![1, 2, 3], acks: 1 },
        Case { label: "3 replicas, acks=all", replicas: vec![1, 2, 3], acks: -1 },
    ];
    println!("weir bench replication: starting 3 nodes");
    // All three nodes and the load share this machine, and the load saturates it: patient
    // control-plane timings keep a busy node from being fenced (or the quorum from electing)
    // in the middle of a case, which would measure the failover instead of replication.
    let patient = [
        ("controller.quorum.election.timeout.ms", "5000"),
        ("controller.quorum.request.timeout.ms", "10000"),
        ("broker.session.timeout.ms", "30000"),
    ];
    let setup = metadata::start(3, 3, &patient)?;
    let leader = &setup.nodes[0];
    let target = Target { addr: leader.addr, pid: Some(leader.pid()), server: None };
    let mut samples: Vec<Samples> = cases.iter().map(|_| Samples::default()).collect();
    for round in 1..=args.rounds {
        for (case, samples) in cases.iter().zip(samples.iter_mut()) {
            let mut case_args = produce.clone();
            case_args.acks = case.acks;
            case_args.replicas = case.replicas.clone();
            case_args.bootstrap = Some(leader.addr.to_string());
            let report = with_retries(|| produce::measure_new_topic(&case_args, &target, size))?;
            report.check()?;
            let latency = report.latency_ms.as_ref().context("no latency was recorded")?;
            println!(
                "round {round}: {}  {:>8.1} MB/s  p50 {:>7.2} ms  p99 {:>7.2} ms",
                case.label, report.mb_per_s, latency.p50, latency.p99
            );
            samples.mb_per_s.push(report.mb_per_s);
            samples.p50_ms.push(latency.p50);
            samples.p99_ms.push(latency.p99);
        }
    }
    let base = (median(&samples[0].mb_per_s), median(&samples[0].p50_ms), median(&samples[0].p99_ms));
    println!("\nmedians over {} round(s), ratios to 1 replica / acks=1:", args.rounds);
    for (case, s) in cases.iter().zip(&samples) {
        let (mb, p50, p99) = (median(&s.mb_per_s), median(&s.p50_ms), median(&s.p99_ms));
        println!(
            "{}  {mb:>8.1} MB/s ({:.2}x)  p50 {p50:>7.2} ms ({:.2}x)  p99 {p99:>7.2} ms ({:.2}x)",
            case.label,
            mb / base.0,
            p50 / base.1,
            p99 / base.2
        );
    }
    let lag_p50 = median(&samples[2].p50_ms) - median(&samples[1].p50_ms);
    let lag_p99 = median(&samples[2].p99_ms) - median(&samples[1].p99_ms);
    println!(
        "replication lag under this load (acks=all minus acks=1, 3 replicas): p50 {lag_p50:.2} ms, p99 {lag_p99:.2} ms"
    );
    if args.move_bytes > 0 {
        measure_moves(&setup, args.move_bytes, args.move_throttle)?;
    }
    Ok(())
}

/// Moves a partition of `bytes` from node 1 to node 2, unthrottled and then throttled at
/// `throttle` bytes per second, and prints each copy's rate.
fn measure_moves(setup: &Setup, bytes: u64, throttle: u64) -> anyhow::Result<()> {
    println!("\nmoving a partition of {} MB from node 1 to node 2:", bytes / 1_000_000);
    let mut admin = raw_protocol::connect(setup.nodes[0].addr)?;
    let mut unthrottled = None;
    for rate in [None, Some(throttle)] {
        let topic = format!("weir-bench-move-{}", SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos());
        with_retries(|| raw_protocol::create_topic(&mut admin, &topic, 1, &[], Some(&[1])))?;
        std::thread::sleep(Duration::from_millis(200));
        fill(&mut admin, &topic, bytes)?;
        set_throttle(&mut admin, rate)?;
        let started = Instant::now();
        reassign(&mut admin, &topic, vec![2])?;
        while moving(&mut admin)? {
            if started.elapsed() > Duration::from_secs(1800) {
                bail!("the move of {topic} did not complete within 30 minutes");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let seconds = started.elapsed().as_secs_f64();
        let mb_per_s = bytes as f64 / 1e6 / seconds;
        match rate {
            None => {
                println!("unthrottled            {mb_per_s:>8.1} MB/s ({seconds:.2} s)");
                unthrottled = Some(mb_per_s);
            }
            Some(rate) => println!(
                "throttled at {:>5.1} MB/s {mb_per_s:>8.1} MB/s ({seconds:.2} s): {:.2}x the throttle, {:.2}x unthrottled",
                rate as f64 / 1e6,
                mb_per_s / (rate as f64 / 1e6),
                unthrottled.map_or(f64::NAN, |u| mb_per_s / u)
            ),
        }
        set_throttle(&mut admin, None)?;
        raw_protocol::delete_topic(&mut admin, &topic)?;
    }
    Ok(())
}

/// Produces `bytes` of 1 KiB values in 1 MiB batches (acks=1) to partition 0 of `topic`.
fn fill(admin: &mut Client, topic: &str, bytes: u64) -> anyhow::Result<()> {
    let (batch, _) = produce::encode_batch(1024, 1 << 20)?;
    let mut sent = 0u64;
    while sent < bytes {
        let request = kafka_client::produce_request(topic, 0, batch.clone(), 1);
        let response = admin.send(produce::PRODUCE_VERSION, &request).context("Produce")?;
        let code = response.responses.iter().flat_map(|t| &t.partition_responses).map(|p| p.error_code).max();
        if code.unwrap_or(-1) != 0 {
            bail!("filling {topic} failed: {}", raw_protocol::error_name(code.unwrap_or(-1)));
        }
        sent += batch.len() as u64;
    }
    Ok(())
}

/// Both replication throttles, cluster-wide (or removed).
fn set_throttle(admin: &mut Client, rate: Option<u64>) -> anyhow::Result<()> {
    let configs = ["leader.replication.throttled.rate", "follower.replication.throttled.rate"]
        .into_iter()
        .map(|name| {
            AlterableConfig::default()
                .with_name(StrBytes::from_static_str(name))
                .with_config_operation(if rate.is_some() { 0 } else { 1 })
                .with_value(rate.map(|r| StrBytes::from_string(r.to_string())))
        })
        .collect();
    let request = IncrementalAlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
        .with_resource_type(4)
        .with_resource_name(StrBytes::from_static_str(""))
        .with_configs(configs)]);
    let response = admin.send(1, &request).context("IncrementalAlterConfigs")?;
    if let Some(r) = response.responses.iter().find(|r| r.error_code != 0) {
        bail!("setting the replication throttle failed: {}", raw_protocol::error_name(r.error_code));
    }
    Ok(())
}

fn reassign(admin: &mut Client, topic: &str, replicas: Vec<i32>) -> anyhow::Result<()> {
    let request = AlterPartitionReassignmentsRequest::default().with_timeout_ms(30_000).with_topics(vec![
        ReassignableTopic::default().with_name(kafka_client::topic_name(topic)).with_partitions(vec![
            ReassignablePartition::default()
                .with_partition_index(0)
                .with_replicas(Some(replicas.into_iter().map(BrokerId).collect())),
        ]),
    ]);
    let response = admin.send(0, &request).context("AlterPartitionReassignments")?;
    let code = response.responses.iter().flat_map(|t| &t.partitions).map(|p| p.error_code).find(|c| *c != 0);
    if let Some(code) = code.or((response.error_code != 0).then_some(response.error_code)) {
        bail!("reassigning {topic} failed: {}", raw_protocol::error_name(code));
    }
    Ok(())
}

/// Is any reassignment in progress?
fn moving(admin: &mut Client) -> anyhow::Result<bool> {
    let response = admin
        .send(0, &ListPartitionReassignmentsRequest::default().with_timeout_ms(10_000))
        .context("ListPartitionReassignments")?;
    Ok(!response.topics.is_empty())
}
