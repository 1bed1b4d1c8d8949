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

use anyhow::Context;

use super::metadata;
use super::produce::{self, Target};
use crate::cli::{ProduceBenchArgs, ReplicationBenchArgs};

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

pub fn run(args: &ReplicationBenchArgs) -> anyhow::Result<()> {
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
    Ok(())
}
