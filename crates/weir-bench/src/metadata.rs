//! `weir bench metadata`: how fast metadata changes are decided, committed and seen, on one
//! node and on a cluster side by side in one run, and how long a cluster takes to decide again
//! after its active controller dies. See `METADATA_LONG_ABOUT` in `cli.rs`.

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{MetadataRequest, MetadataResponse};
use serde::Serialize;
use weir_harness::kafka_client::{create_topics_request, topic_name, Client};

use crate::cli::MetadataBenchArgs;
use crate::raw_protocol::{self, Server};

/// How long a topic may take to appear on every node, or the cluster to accept a change after
/// losing its controller, before the run fails.
const WAIT_LIMIT: Duration = Duration::from_secs(60);
/// Between two polls of a node's Metadata.
const POLL_EVERY: Duration = Duration::from_millis(1);

/// The nodes of one measured setup.
pub(crate) struct Setup {
    label: String,
    pub(crate) nodes: Vec<Server>,
}

/// A port on 127.0.0.1 that nothing listens on right now (a voter's CONTROLLER port must be
/// known before its node starts).
fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub(crate) fn start(nodes: usize, partitions: i32, extra: &[(&str, &str)]) -> anyhow::Result<Setup> {
    start_binary(nodes, partitions, extra, None)
}

/// [`start`] of a cluster (`nodes` > 1) whose nodes each serve the admin API too, on a port of
/// their own (in each node's `admin`).
pub(crate) fn start_with_admin(nodes: usize, extra: &[(&str, &str)]) -> anyhow::Result<Setup> {
    let admin: Vec<u16> = (0..nodes).map(|_| free_port()).collect::<anyhow::Result<_>>()?;
    let mut setup = start_nodes(nodes, 1, extra, None, Some(&admin))?;
    for (node, port) in setup.nodes.iter_mut().zip(admin) {
        node.admin = Some(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    Ok(setup)
}

/// [`start`] with the nodes running `exe` (`None`: this binary).
pub(crate) fn start_binary(
    nodes: usize,
    partitions: i32,
    extra: &[(&str, &str)],
    exe: Option<&std::path::Path>,
) -> anyhow::Result<Setup> {
    start_nodes(nodes, partitions, extra, exe, None)
}

fn start_nodes(
    nodes: usize,
    partitions: i32,
    extra: &[(&str, &str)],
    exe: Option<&std::path::Path>,
    admin_ports: Option<&[u16]>,
) -> anyhow::Result<Setup> {
    let mut settings = vec![
        ("admin.listeners".to_string(), String::new()),
        ("offsets.topic.num.partitions".to_string(), partitions.to_string()),
    ];
    settings.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    if nodes == 1 {
        let server = Server::start_binary("weir-bench-metadata-", "127.0.0.1:0", &settings, exe)?;
        return Ok(Setup { label: "1 node".into(), nodes: vec![server] });
    }
    let ports: Vec<u16> = (0..nodes).map(|_| free_port()).collect::<anyhow::Result<_>>()?;
    let voters: Vec<String> = ports.iter().enumerate().map(|(i, port)| format!("{}@127.0.0.1:{port}", i + 1)).collect();
    settings.push(("controller.quorum.voters".into(), voters.join(",")));
    // Started at once: each waits for the quorum, which needs a majority of them.
    let handles: Vec<_> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            let mut settings = settings.clone();
            settings.push(("node.id".into(), (i + 1).to_string()));
            if let Some(port) = admin_ports.and_then(|ports| ports.get(i)) {
                settings.push(("admin.listeners".into(), format!("127.0.0.1:{port}")));
            }
            let listeners = format!("PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:{port}");
            let exe = exe.map(|e| e.to_path_buf());
            std::thread::spawn(move || {
                Server::start_binary("weir-bench-metadata-", &listeners, &settings, exe.as_deref())
            })
        })
        .collect();
    let mut servers = Vec::with_capacity(nodes);
    for handle in handles {
        servers.push(handle.join().map_err(|_| anyhow::anyhow!("a node's start-up thread panicked"))??);
    }
    Ok(Setup { label: format!("{nodes} nodes"), nodes: servers })
}

fn metadata(client: &mut Client, topic: Option<&str>) -> anyhow::Result<MetadataResponse> {
    let request = MetadataRequest::default()
        .with_topics(topic.map(|t| vec![MetadataRequestTopic::default().with_name(Some(topic_name(t)))]))
        .with_allow_auto_topic_creation(false);
    client.send(12, &request).context("Metadata")
}

/// Whether the node behind `client` knows `topic` with all its partitions led.
fn knows(client: &mut Client, topic: &str, partitions: i32) -> anyhow::Result<bool> {
    let response = metadata(client, Some(topic))?;
    Ok(response.topics.first().is_some_and(|t| {
        t.error_code == 0
            && t.partitions.len() == partitions as usize
            && t.partitions.iter().all(|p| p.error_code == 0 && p.leader_id.0 >= 0)
    }))
}

/// The id of the broker Metadata names as the controller (the active one when it is a broker).
pub(crate) fn controller_id(addr: SocketAddr) -> anyhow::Result<i32> {
    let mut client = raw_protocol::connect(addr)?;
    Ok(metadata(&mut client, None)?.controller_id.0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[derive(Debug, Serialize)]
struct SetupResult {
    setup: String,
    nodes: usize,
    /// CreateTopics through one node, one topic per request, one after the other.
    creates_per_s: f64,
    create_p50_ms: f64,
    create_p99_ms: f64,
    /// From a CreateTopics answer until every other node's Metadata lists the topic led.
    visible_everywhere_p50_ms: f64,
    visible_everywhere_p99_ms: f64,
    visible_everywhere_max_ms: f64,
    /// From kill -9 of the active controller until a CreateTopics through a survivor succeeds.
    failover_ms: Option<f64>,
}

/// Creates `count` topics named `prefix-N` through node `via`; returns each create's latency.
fn create_topics(
    setup: &Setup,
    via: usize,
    prefix: &str,
    count: usize,
    partitions: i32,
    watch_others: bool,
) -> anyhow::Result<(Vec<f64>, Vec<f64>, f64)> {
    let mut client = raw_protocol::connect(setup.nodes[via].addr)?;
    let mut others: Vec<Client> = if watch_others {
        (0..setup.nodes.len())
            .filter(|i| *i != via)
            .map(|i| raw_protocol::connect(setup.nodes[i].addr))
            .collect::<anyhow::Result<_>>()?
    } else {
        Vec::new()
    };
    let (mut creates, mut visible) = (Vec::with_capacity(count), Vec::with_capacity(count));
    let started = Instant::now();
    for i in 0..count {
        let name = format!("{prefix}-{i}");
        let sent = Instant::now();
        raw_protocol::create_topic(&mut client, &name, partitions, &[], None)?;
        let answered = Instant::now();
        creates.push(answered.duration_since(sent).as_secs_f64() * 1e3);
        if watch_others {
            for other in &mut others {
                while !knows(other, &name, partitions)? {
                    if answered.elapsed() > WAIT_LIMIT {
                        bail!("topic {name} was not visible on every node within {WAIT_LIMIT:?}");
                    }
                    std::thread::sleep(POLL_EVERY);
                }
            }
            visible.push(answered.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok((creates, visible, started.elapsed().as_secs_f64()))
}

/// Kills the active controller and measures until a survivor accepts a CreateTopics again.
fn failover(setup: &mut Setup, partitions: i32) -> anyhow::Result<f64> {
    let controller = controller_id(setup.nodes[0].addr)?;
    let index = usize::try_from(controller - 1)
        .ok()
        .filter(|i| *i < setup.nodes.len())
        .with_context(|| format!("Metadata names broker {controller} as the controller, not one of ours"))?;
    let survivor = (index + 1) % setup.nodes.len();
    let mut client = raw_protocol::connect(setup.nodes[survivor].addr)?;
    setup.nodes[index].kill()?;
    let killed = Instant::now();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let no_configs: &[(String, String)] = &[];
        let create = create_topics_request(&format!("after-failover-{attempt}"), partitions, 1, no_configs);
        let answer = client.send(5, &create).context("CreateTopics")?;
        let code = answer.topics.first().map_or(-1, |t| t.error_code);
        if code == 0 {
            return Ok(killed.elapsed().as_secs_f64() * 1e3);
        }
        if killed.elapsed() > WAIT_LIMIT {
            bail!(
                "no CreateTopics succeeded within {WAIT_LIMIT:?} of killing the controller (last: {})",
                raw_protocol::error_name(code)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn measure(args: &MetadataBenchArgs, nodes: usize) -> anyhow::Result<SetupResult> {
    let mut setup = start(nodes, args.partitions, &[])?;
    // Through a node that is not the controller when there is one: the forwarding path.
    let controller = controller_id(setup.nodes[0].addr)?;
    let via = if nodes > 1 { usize::try_from(controller).unwrap_or(1) % nodes } else { 0 };
    let (mut creates, _, seconds) = create_topics(&setup, via, "rate", args.topics, args.partitions, false)?;
    let (_, mut visible, _) = create_topics(&setup, via, "seen", args.topics.min(200), args.partitions, nodes > 1)?;
    creates.sort_by(f64::total_cmp);
    visible.sort_by(f64::total_cmp);
    let failover_ms = if nodes >= 3 && !args.no_failover { Some(failover(&mut setup, args.partitions)?) } else { None };
    Ok(SetupResult {
        setup: setup.label.clone(),
        nodes,
        creates_per_s: args.topics as f64 / seconds,
        create_p50_ms: percentile(&creates, 50.0),
        create_p99_ms: percentile(&creates, 99.0),
        visible_everywhere_p50_ms: percentile(&visible, 50.0),
        visible_everywhere_p99_ms: percentile(&visible, 99.0),
        visible_everywhere_max_ms: visible.last().copied().unwrap_or(0.0),
        failover_ms,
    })
}

pub(crate) fn run(args: &MetadataBenchArgs) -> anyhow::Result<()> {
    if args.nodes < 2 {
        bail!("--nodes must be at least 2 (the cluster measured beside the single node)");
    }
    println!(
        "CreateTopics of {} topics x {} partitions, one per request, through one node (not the controller)",
        args.topics, args.partitions
    );
    let single = measure(args, 1)?;
    let cluster = measure(args, args.nodes)?;
    for r in [&single, &cluster] {
        print!(
            "{:<8} {:>8.0} creates/s  create p50 {:.2} ms p99 {:.2} ms",
            r.setup, r.creates_per_s, r.create_p50_ms, r.create_p99_ms
        );
        if r.nodes > 1 {
            print!(
                "  visible on every node p50 {:.2} ms p99 {:.2} ms max {:.2} ms",
                r.visible_everywhere_p50_ms, r.visible_everywhere_p99_ms, r.visible_everywhere_max_ms
            );
        }
        if let Some(ms) = r.failover_ms {
            print!("  controller failover {ms:.0} ms");
        }
        println!();
    }
    println!("cluster / single node creates/s: {:.2}", cluster.creates_per_s / single.creates_per_s);
    if let Some(path) = &args.json {
        let json = serde_json::json!({ "single": single, "cluster": cluster });
        std::fs::write(path, serde_json::to_vec_pretty(&json)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
