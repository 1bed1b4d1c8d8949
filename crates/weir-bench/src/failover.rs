//! `weir bench failover`: how long acknowledgements stop when a node of a 3-node cluster dies,
//! with Weir's default timings. See `FAILOVER_LONG_ABOUT` in `cli.rs`.
//!
//! Every partition of a topic with replication factor 3 and `min.insync.replicas=2` has a writer
//! of its own: a thread that produces one small batch at a time with `acks=all` to the
//! partition's leader, and looks the leader up again (Metadata through any live node) whenever a
//! request fails. A stall is the longest time without an acknowledgement after the fault, until
//! the partition's acknowledgements flow again; it is counted by the dead node's part in the
//! partition (it led it, or it followed) and by whether the node was the active controller.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kafka_protocol::messages::describe_quorum_request::{PartitionData, TopicData};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    BrokerId, DescribeQuorumRequest, ElectLeadersRequest, MetadataRequest, MetadataResponse,
};
use serde::Serialize;
use weir_harness::kafka_client::{self, create_topics_request, topic_name, Client};

use crate::cli::FailoverBenchArgs;
use crate::metadata::{self, Setup};
use crate::produce::{self, PRODUCE_VERSION};
use crate::raw_protocol::{self, CLIENT_ID};

const TOPIC: &str = "failover";
/// A partition whose acknowledgements leave no gap longer than this over a second flows.
const FLOWING_GAP: Duration = Duration::from_millis(300);
/// How long the cluster may take to heal, or a partition to flow again, before the run fails.
const WAIT_LIMIT: Duration = Duration::from_secs(90);
/// The writers' connections give up on a leader that does not answer after this.
const WRITER_IO_TIMEOUT: Duration = Duration::from_secs(10);

/// When each partition's acknowledgements came.
pub(crate) type AckTimes = Arc<Vec<Mutex<Vec<Instant>>>>;

/// The stalls of one setting, in seconds, by the dead node's part.
#[derive(Debug, Default, Serialize)]
struct Stalls {
    led: Vec<f64>,
    followed: Vec<f64>,
    controller_led: Vec<f64>,
    controller_followed: Vec<f64>,
}

pub(crate) fn run(args: &FailoverBenchArgs) -> anyhow::Result<()> {
    let settings: &[bool] = if args.compare { &[true, false] } else { &[true] };
    let mut report = BTreeMap::new();
    for &watch in settings {
        let label = if watch { "liveness watch" } else { "session timeout only" };
        println!("{label}: {} rounds on 3 nodes, {} partitions", args.rounds, args.partitions);
        let stalls = measure(args, watch)?;
        print_stalls(&stalls);
        report.insert(label, stalls);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?).with_context(|| format!("writing {path:?}"))?;
    }
    Ok(())
}

fn measure(args: &FailoverBenchArgs, watch: bool) -> anyhow::Result<Stalls> {
    let enable = if watch { "true" } else { "false" };
    let mut setup = metadata::start(3, 1, &[("controller.liveness.watch.enable", enable)])?;
    let mut client = raw_protocol::connect(setup.nodes[0].addr)?;
    let create = create_topics_request(TOPIC, args.partitions, 3, &[("min.insync.replicas", "2")]);
    let created = client.send(5, &create).context("CreateTopics")?;
    if let Some(error) = created.topics.first().map(|t| t.error_code).filter(|code| *code != 0) {
        bail!("creating {TOPIC} failed: {}", raw_protocol::error_name(error));
    }
    let bootstrap = Arc::new(Mutex::new(setup.nodes.iter().map(|n| n.addr).collect::<Vec<_>>()));
    let acks: AckTimes = Arc::new((0..args.partitions).map(|_| Mutex::new(Vec::new())).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..args.partitions)
        .map(|p| {
            let (bootstrap, acks, stop) = (bootstrap.clone(), acks.clone(), stop.clone());
            std::thread::spawn(move || {
                write_partition(&bootstrap, TOPIC, p, produce::encode_records(100, 1)?, &acks, &stop)
            })
        })
        .collect();
    let mut stalls = Stalls::default();
    let result = (|| {
        for _ in 0..args.rounds {
            for kill_controller in [false, true] {
                kill_and_measure(&mut setup, &bootstrap, &acks, args.partitions, kill_controller, &mut stalls)?;
            }
        }
        anyhow::Ok(())
    })();
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.join().map_err(|_| anyhow::anyhow!("a writer thread panicked"))??;
    }
    result.map(|()| stalls)
}

/// One fault: balances the leaders, kills a node that leads two partitions (the active
/// controller, or a node that is not), records every partition's stall, and restarts it.
fn kill_and_measure(
    setup: &mut Setup,
    bootstrap: &Mutex<Vec<SocketAddr>>,
    acks: &AckTimes,
    partitions: i32,
    kill_controller: bool,
    stalls: &mut Stalls,
) -> anyhow::Result<()> {
    let (leaders, controller) = balanced_leaders(setup, partitions)?;
    let victim = if kill_controller {
        controller
    } else {
        (1..=3).find(|id| *id != controller && leaders.values().any(|l| l == id)).context("no victim")?
    };
    let node = usize::try_from(victim - 1).context("node id")?;
    let killed_at = Instant::now();
    setup.nodes[node].kill()?;
    wait_flowing(acks, killed_at)?;
    for (partition, leader) in &leaders {
        let times = lock(&acks[*partition as usize]).clone();
        let stall = stall(&times, killed_at).context("no acknowledgement after the fault")?;
        let list = match (kill_controller, *leader == victim) {
            (false, true) => &mut stalls.led,
            (false, false) => &mut stalls.followed,
            (true, true) => &mut stalls.controller_led,
            (true, false) => &mut stalls.controller_followed,
        };
        list.push(stall.as_secs_f64());
    }
    setup.nodes[node].restart()?;
    lock(bootstrap)[node] = setup.nodes[node].addr;
    Ok(())
}

/// Elects the preferred leaders and waits until every partition has its preferred leader and
/// three replicas in sync; returns the leaders and the active controller.
fn balanced_leaders(setup: &Setup, partitions: i32) -> anyhow::Result<(BTreeMap<i32, i32>, i32)> {
    let deadline = Instant::now() + WAIT_LIMIT;
    let mut elected: Option<Instant> = None;
    loop {
        let mut client = raw_protocol::connect(setup.nodes[0].addr)?;
        let response = metadata(&mut client)?;
        let topic = response.topics.first().context("no topic in Metadata")?;
        let in_sync = topic.partitions.len() == partitions as usize
            && topic.partitions.iter().all(|p| p.isr_nodes.len() == 3 && p.leader_id.0 >= 0);
        let balanced = topic.partitions.iter().all(|p| p.replica_nodes.first() == Some(&p.leader_id));
        if in_sync && balanced {
            if let Some(controller) = active_controller(&mut client)? {
                let leaders = topic.partitions.iter().map(|p| (p.partition_index, p.leader_id.0)).collect();
                return Ok((leaders, controller));
            }
        }
        if in_sync && !balanced && elected.is_none_or(|at| at.elapsed() > Duration::from_secs(2)) {
            // Preferred election of every partition (a restarted node leads nothing).
            let request = ElectLeadersRequest::default()
                .with_election_type(0)
                .with_topic_partitions(None)
                .with_timeout_ms(30_000);
            client.send(2, &request).context("ElectLeaders")?;
            elected = Some(Instant::now());
        }
        if Instant::now() > deadline {
            let states: Vec<_> =
                topic.partitions.iter().map(|p| (p.partition_index, p.leader_id.0, p.isr_nodes.len())).collect();
            bail!(
                "the cluster did not heal within {WAIT_LIMIT:?}: (partition, leader, in sync) {states:?}, controller \
                 {:?}",
                active_controller(&mut client)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The metadata quorum's leader, from DescribeQuorum (Metadata's controller id is the broker
/// asked, as in KRaft); `None` during an election.
fn active_controller(client: &mut Client) -> anyhow::Result<Option<i32>> {
    let request = DescribeQuorumRequest::default().with_topics(vec![TopicData::default()
        .with_topic_name(topic_name("__cluster_metadata"))
        .with_partitions(vec![PartitionData::default().with_partition_index(0)])]);
    let response = client.send(0, &request).context("DescribeQuorum")?;
    let leader = response.topics.first().and_then(|t| t.partitions.first()).map(|p| p.leader_id.0);
    Ok(leader.filter(|id| *id >= 0))
}

fn metadata(client: &mut Client) -> anyhow::Result<MetadataResponse> {
    topic_metadata(client, TOPIC)
}

/// Metadata of `topic` alone.
pub(crate) fn topic_metadata(client: &mut Client, topic: &str) -> anyhow::Result<MetadataResponse> {
    let request = MetadataRequest::default()
        .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(topic_name(topic)))]))
        .with_allow_auto_topic_creation(false);
    client.send(12, &request).context("Metadata")
}

/// Waits until every partition's acknowledgements flow again after `fault_at`.
fn wait_flowing(acks: &AckTimes, fault_at: Instant) -> anyhow::Result<()> {
    loop {
        let now = Instant::now();
        if now.duration_since(fault_at) > WAIT_LIMIT {
            bail!("acknowledgements did not resume within {WAIT_LIMIT:?}");
        }
        let flowing = acks.iter().all(|times| {
            let recent: Vec<Instant> = lock(times)
                .iter()
                .copied()
                .filter(|t| *t > fault_at && now.duration_since(*t) < Duration::from_secs(1))
                .collect();
            now.duration_since(fault_at) > Duration::from_secs(1) && flows(&recent, now)
        });
        if flowing {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether the acknowledgements of the last second up to `now` leave no gap over FLOWING_GAP.
fn flows(recent: &[Instant], now: Instant) -> bool {
    let start = now - Duration::from_secs(1);
    let mut previous = start;
    for t in recent.iter().chain(std::iter::once(&now)) {
        if t.duration_since(previous) > FLOWING_GAP {
            return false;
        }
        previous = *t;
    }
    recent.len() >= 3
}

/// The longest time without an acknowledgement from `fault_at` on (the first acks after it may
/// answer requests served before it, so the first one is no measure).
pub(crate) fn stall(times: &[Instant], fault_at: Instant) -> Option<Duration> {
    let mut previous = fault_at;
    let mut longest = None;
    for t in times.iter().filter(|t| **t > fault_at) {
        let gap = t.duration_since(previous);
        longest = Some(longest.map_or(gap, |l: Duration| l.max(gap)));
        previous = *t;
    }
    longest
}

/// A writer: produces `records` (one batch) at a time with acks=all to `partition` of `topic`'s
/// leader until `stop`, noting when each acknowledgement came.
pub(crate) fn write_partition(
    bootstrap: &Mutex<Vec<SocketAddr>>,
    topic: &str,
    partition: i32,
    records: bytes::Bytes,
    acks: &AckTimes,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let request = kafka_client::produce_request(topic, partition, records, -1);
    while !stop.load(Ordering::Relaxed) {
        let Some(mut client) = leader_of(bootstrap, topic, partition) else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        while !stop.load(Ordering::Relaxed) {
            let Ok(response) = client.send(PRODUCE_VERSION, &request) else { break };
            let code = response.responses.first().and_then(|t| t.partition_responses.first()).map(|p| p.error_code);
            if code != Some(0) {
                break;
            }
            lock(&acks[partition as usize]).push(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A connection to `partition`'s leader, as the first live node that answers Metadata says.
fn leader_of(bootstrap: &Mutex<Vec<SocketAddr>>, topic: &str, partition: i32) -> Option<Client> {
    let nodes = lock(bootstrap).clone();
    for node in nodes {
        let Ok(mut client) = Client::connect(node, CLIENT_ID, WRITER_IO_TIMEOUT) else { continue };
        let Ok(response) = topic_metadata(&mut client, topic) else { continue };
        let leader = response
            .topics
            .first()
            .and_then(|t| t.partitions.iter().find(|p| p.partition_index == partition))
            .map(|p| p.leader_id)
            .filter(|id| id.0 >= 0)?;
        let broker = response.brokers.iter().find(|b| b.node_id == BrokerId(leader.0))?;
        let addr: SocketAddr = format!("{}:{}", broker.host, broker.port).parse().ok()?;
        return Client::connect(addr, CLIENT_ID, WRITER_IO_TIMEOUT).ok();
    }
    None
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn print_stalls(stalls: &Stalls) {
    let rows = [
        ("partitions it led", &stalls.led),
        ("partitions it followed", &stalls.followed),
        ("led, and it was the controller", &stalls.controller_led),
        ("followed, and it was the controller", &stalls.controller_followed),
    ];
    for (label, values) in rows {
        let mut sorted = values.clone();
        sorted.sort_by(f64::total_cmp);
        let at = |q: f64| sorted.get(((sorted.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(f64::NAN);
        println!(
            "  kill -9, {label:<36} stall p50 {:>6.2} s  p99 {:>6.2} s  max {:>6.2} s  ({} samples)",
            at(0.5),
            at(0.99),
            at(1.0),
            sorted.len()
        );
    }
}
