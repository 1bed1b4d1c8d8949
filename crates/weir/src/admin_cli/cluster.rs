//! `weir cluster info|health|decommission|unregister|config`.

use std::io::Write;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use weir_admin::api::{
    AlterConfigs, ClusterHealth, ClusterStatus, Configs, Decommission, GeneratePlan, GeneratedPlan, NodeInfo,
    PartitionHealth, QuorumMembership, ReplicationThrottle, UnregisteredBroker,
};

use super::{human_bytes, parse_key_value, print_json, AdminClient, Connection, Table};

/// `weir cluster health`'s exit status when the cluster is unhealthy: apart from 1, which says
/// the question could not be asked (no answer, a bad flag), so a script can tell the two.
pub const UNHEALTHY_EXIT: i32 = 2;

#[derive(Debug, Args)]
pub struct ClusterArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    pub command: ClusterCommand,
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// The nodes with their roles, the controller, which brokers are fenced, and how far each
    /// node has applied the metadata (unreachable nodes included, after at most a second).
    Info,
    /// What needs attention: fenced brokers, leaderless, under-replicated and under-min-ISR
    /// partitions, followers lagging more than replica.lag.time.max.ms, draining brokers.
    /// Exits 0 when healthy, 2 when not (1 when it cannot tell).
    Health,
    /// Move every replica off a broker (a throttled reassignment) so that it can be stopped
    /// and removed; `weir cluster health` shows it draining meanwhile.
    Decommission(DecommissionArgs),
    /// Remove a decommissioned broker once its process is stopped (Kafka's `kafka-cluster.sh
    /// unregister`): it leaves `weir cluster info` and the health report. Refused while it runs
    /// or holds a replica; if it starts again, it registers anew.
    Unregister(UnregisterArgs),
    /// The dynamic broker configs (those that change while the cluster runs, kept in the
    /// metadata): cluster-wide, or one broker's with --broker.
    Config(ConfigArgs),
    /// Every broker's traffic, CPU and disk as the controller measures them, the balancer's next
    /// move of an elastic topic's physical partition, and the moves in progress.
    Balance,
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub command: ConfigCommand,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Every dynamic config in force, and where its value comes from (broker, cluster, default).
    Get(ConfigTarget),
    /// Set dynamic configs: NAME=VALUE ...
    Set(SetConfigArgs),
    /// Remove dynamic configs: a broker's fall back to the cluster's, the cluster's to Kafka's
    /// defaults.
    Delete(DeleteConfigArgs),
}

#[derive(Debug, Args)]
pub struct ConfigTarget {
    /// This broker's own configs. [default: the cluster-wide ones]
    #[arg(long, value_name = "ID")]
    pub broker: Option<i32>,
}

#[derive(Debug, Args)]
pub struct SetConfigArgs {
    #[arg(required = true, value_name = "NAME=VALUE", value_parser = parse_key_value)]
    pub configs: Vec<(String, String)>,
    #[command(flatten)]
    pub target: ConfigTarget,
}

#[derive(Debug, Args)]
pub struct DeleteConfigArgs {
    #[arg(required = true, value_name = "NAME")]
    pub names: Vec<String>,
    #[command(flatten)]
    pub target: ConfigTarget,
}

#[derive(Debug, Args)]
pub struct UnregisterArgs {
    /// The broker to remove.
    pub broker: i32,
}

#[derive(Debug, Args)]
pub struct DecommissionArgs {
    /// The broker to empty.
    pub broker: i32,
    /// Bytes per second the copying may take, cluster-wide; stays set until `weir partition
    /// throttle --clear`.
    #[arg(long, value_name = "BYTES_PER_SEC")]
    pub throttle: Option<u64>,
    /// Wait until the broker holds no replica and nothing is under-replicated.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up (exit 1) after this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub timeout: u64,
}

pub fn run(args: &ClusterArgs) -> anyhow::Result<()> {
    let client = AdminClient::new(&args.connection)?;
    let mut out = std::io::stdout().lock();
    match &args.command {
        ClusterCommand::Info => {
            let cluster: ClusterStatus = client.get("/v1/cluster", &[])?;
            if args.connection.json {
                return print_json(&mut out, &cluster);
            }
            write_info(&mut out, &cluster)?;
        }
        ClusterCommand::Balance => {
            let report: weir_admin::api::BalanceReport = client.get("/v1/cluster/balance", &[])?;
            if args.connection.json {
                print_json(&mut out, &report)?;
            } else {
                write_balance(&mut out, &report)?;
            }
        }
        ClusterCommand::Health => {
            let health: ClusterHealth = client.get("/v1/cluster/health", &[])?;
            if args.connection.json {
                print_json(&mut out, &health)?;
            } else {
                write_health(&mut out, &health)?;
            }
            if !health.healthy {
                out.flush()?;
                std::process::exit(UNHEALTHY_EXIT);
            }
        }
        ClusterCommand::Config(config) => run_config(&client, &mut out, &config.command, args.connection.json)?,
        ClusterCommand::Decommission(decommission) => {
            run_decommission(&client, &mut out, decommission, args.connection.json)?
        }
        ClusterCommand::Unregister(unregister) => {
            let removed: UnregisteredBroker = client.delete(&format!("/v1/brokers/{}", unregister.broker))?;
            if args.connection.json {
                print_json(&mut out, &removed)?;
            } else {
                writeln!(out, "broker {} unregistered", removed.broker)?;
            }
        }
    }
    Ok(())
}

fn run_config(client: &AdminClient, out: &mut impl Write, command: &ConfigCommand, json: bool) -> anyhow::Result<()> {
    let path = |target: &ConfigTarget| match target.broker {
        Some(id) => format!("/v1/cluster/configs?broker={id}"),
        None => "/v1/cluster/configs".to_string(),
    };
    let configs: Configs = match command {
        ConfigCommand::Get(target) => client.get(&path(target), &[])?,
        ConfigCommand::Set(set) => {
            let request = AlterConfigs { set: set.configs.iter().cloned().collect(), ..AlterConfigs::default() };
            client.patch(&path(&set.target), &request)?
        }
        ConfigCommand::Delete(delete) => {
            let request = AlterConfigs { delete: delete.names.clone(), ..AlterConfigs::default() };
            client.patch(&path(&delete.target), &request)?
        }
    };
    if json {
        return print_json(out, &configs);
    }
    let mut table = Table::new(&["CONFIG", "VALUE", "SOURCE"]);
    for c in configs.configs {
        table.row(vec![c.name, c.value, c.source]);
    }
    table.write(out)?;
    Ok(())
}

/// `rpk cluster health`'s layout: one line per kind of trouble, its count and its members.
fn write_health(out: &mut impl Write, health: &ClusterHealth) -> anyhow::Result<()> {
    let ids = |list: &[i32]| list.iter().map(i32::to_string).collect::<Vec<_>>().join(" ");
    let partitions = |list: &[PartitionHealth]| {
        list.iter().map(|p| format!("{}-{}", p.topic, p.partition)).collect::<Vec<_>>().join(" ")
    };
    let lagging: Vec<String> = health
        .lagging_followers
        .iter()
        .map(|f| {
            let behind = f.lag.offsets_behind.map_or_else(|| "?".to_string(), |n| n.to_string());
            format!(
                "{}-{}:{} ({behind} behind leader {}, caught up {} ms ago)",
                f.topic, f.partition, f.lag.replica, f.leader, f.lag.caught_up_ms_ago
            )
        })
        .collect();
    let draining: Vec<String> = health
        .draining_brokers
        .iter()
        .map(|d| format!("{} ({} replicas, {} moving off)", d.broker, d.replicas, d.moving_off))
        .collect();
    let rows = [
        ("Fenced brokers", health.fenced_brokers.len(), ids(&health.fenced_brokers)),
        ("Unanswered brokers", health.unanswered_brokers.len(), ids(&health.unanswered_brokers)),
        ("Leaderless partitions", health.leaderless.len(), partitions(&health.leaderless)),
        ("Under-replicated partitions", health.under_replicated.len(), partitions(&health.under_replicated)),
        ("Under min ISR partitions", health.under_min_isr.len(), partitions(&health.under_min_isr)),
        ("Lagging followers", lagging.len(), lagging.join(" ")),
        ("Draining brokers", draining.len(), draining.join(" ")),
    ];
    let mut table = Table::new(&["CHECK", "COUNT", "WHICH"]);
    for (label, count, which) in rows {
        table.row(vec![label.to_string(), count.to_string(), if which.is_empty() { "-".into() } else { which }]);
    }
    writeln!(out, "Healthy: {}", health.healthy)?;
    table.write(out)?;
    Ok(())
}

fn run_decommission(
    client: &AdminClient,
    out: &mut impl Write,
    args: &DecommissionArgs,
    json: bool,
) -> anyhow::Result<()> {
    if let Some(rate) = args.throttle {
        let _: ReplicationThrottle =
            client.put("/v1/replication-throttle", &ReplicationThrottle { bytes_per_second: Some(rate) })?;
    }
    let started: Decommission = client.post(&format!("/v1/brokers/{}/decommission", args.broker), &())?;
    let failed: Vec<String> = started
        .results
        .iter()
        .filter_map(|r| r.error.as_ref().map(|e| format!("{}-{}: {} ({})", r.topic, r.partition, e.message, e.code)))
        .collect();
    if json {
        print_json(out, &started)?;
    } else {
        writeln!(
            out,
            "moving {} partitions off broker {}; `weir cluster health` shows it draining",
            started.plan.proposed.partitions.len(),
            args.broker
        )?;
    }
    if !failed.is_empty() {
        anyhow::bail!("{} moves were refused: {}", failed.len(), failed.join("; "));
    }
    if args.wait {
        out.flush()?;
        wait_drained(client, args.broker, Duration::from_secs(args.timeout))?;
        if !json {
            writeln!(
                out,
                "broker {} holds no replica and nothing is under-replicated: it can be stopped, then removed with \
                 `weir cluster unregister {}`",
                args.broker, args.broker
            )?;
        }
    }
    Ok(())
}

/// Polls until no reassignment moves replicas off `broker`, no partition has a replica on it
/// (a topic created meanwhile may have put one there: the plan says so), and nothing is
/// under-replicated.
fn wait_drained(client: &AdminClient, broker: i32, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let ask = GeneratePlan { remove_brokers: vec![broker], ..GeneratePlan::default() };
    loop {
        let health: ClusterHealth = client.get("/v1/cluster/health", &[])?;
        let left: GeneratedPlan = client.post("/v1/reassignments/generate", &ask)?;
        let draining = health.draining_brokers.iter().find(|d| d.broker == broker).map_or(0, |d| d.moving_off);
        let still_there = left.proposed.partitions.len();
        let under = health.under_replicated.len();
        if draining == 0 && still_there == 0 && under == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "after {} s broker {broker} is not empty yet: {draining} replicas moving off, {still_there} partitions \
                 not moving, {under} partitions under-replicated (run `weir cluster decommission {broker}` again for \
                 partitions placed on it since)",
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn write_info(out: &mut impl Write, cluster: &ClusterStatus) -> anyhow::Result<()> {
    let controller = cluster.controller.map_or_else(|| "none (no quorum leader)".to_string(), |id| id.to_string());
    writeln!(out, "Cluster: {}", cluster.cluster_id)?;
    writeln!(
        out,
        "Controller: {controller}   Metadata offset: {} (applied by node {})",
        cluster.metadata_offset, cluster.node_id
    )?;
    writeln!(out)?;
    let mut table = Table::new(&["ID", "ROLES", "QUORUM", "RAFT", "BROKER", "APPLIED", "LAG", "RACK", "ADDRESS"]);
    for node in &cluster.nodes {
        let status = node.status.as_ref();
        table.row(vec![
            node.id.to_string(),
            roles(node),
            match node.quorum {
                Some(QuorumMembership::Voter) => "voter".to_string(),
                Some(QuorumMembership::Learner) => "learner".to_string(),
                None => "-".to_string(),
            },
            status.map_or_else(|| "-".to_string(), |s| s.quorum.role.to_lowercase()),
            broker_state(node).to_string(),
            status.map_or_else(|| "-".to_string(), |s| s.applied_offset.to_string()),
            // A node ahead of the answering one (it applied more since) lags by nothing.
            status.map_or_else(|| "-".to_string(), |s| (cluster.metadata_offset - s.applied_offset).max(0).to_string()),
            node.rack.clone().unwrap_or_else(|| "-".to_string()),
            node.advertised.clone().unwrap_or_else(|| "-".to_string()),
        ]);
    }
    table.write(out)?;
    for node in cluster.nodes.iter().filter(|n| !n.reachable) {
        writeln!(out, "node {} is unreachable: {}", node.id, node.error.as_deref().unwrap_or("no reason given"))?;
    }
    Ok(())
}

fn roles(node: &NodeInfo) -> String {
    match (node.broker, node.controller) {
        (true, true) => "broker,controller",
        (true, false) => "broker",
        (false, true) => "controller",
        (false, false) => "-",
    }
    .to_string()
}

/// One word for the broker's standing: a fenced broker leads nothing, reachable or not; an
/// unfenced one that does not answer is `unreachable` (the controller has not fenced it yet).
/// A node without the broker role has none (`-`).
fn broker_state(node: &NodeInfo) -> &'static str {
    match (node.fenced, node.reachable) {
        (None, _) if !node.broker => "-",
        (None, _) => "unregistered",
        (Some(true), _) => "fenced",
        (Some(false), true) => "active",
        (Some(false), false) => "unreachable",
    }
}

fn write_balance(out: &mut impl Write, report: &weir_admin::api::BalanceReport) -> anyhow::Result<()> {
    let state = if report.enabled { "on" } else { "off (elastic.balance.enable=false)" };
    writeln!(
        out,
        "Load balance: {state}; band {}x of the mean ({}/s); nothing moves below {}/s",
        report.band,
        human_bytes(report.mean_bytes_per_sec as u64),
        human_bytes(report.min_bytes_per_sec as u64)
    )?;
    let mut table = Table::new(&["BROKER", "TRAFFIC/S", "x MEAN", "CPU", "DISK"]);
    for b in &report.brokers {
        let ratio = if report.mean_bytes_per_sec > 0.0 { b.bytes_per_sec / report.mean_bytes_per_sec } else { 0.0 };
        let traffic = if b.reported { human_bytes(b.bytes_per_sec as u64) } else { "not reported".to_string() };
        table.row(vec![
            b.broker.to_string(),
            traffic,
            format!("{ratio:.2}"),
            format!("{:.2} cores", b.cpu_cores),
            human_bytes(b.disk_bytes),
        ]);
    }
    table.write(out)?;
    match &report.plan {
        Some(p) => writeln!(
            out,
            "Next move: physical partition {} of '{}' ({}/s) from broker {} to broker {}, replicas {:?}",
            p.physical,
            p.topic,
            human_bytes(p.bytes_per_sec as u64),
            p.from,
            p.to,
            p.replicas
        )?,
        None => writeln!(out, "Next move: none")?,
    }
    if report.moving.is_empty() {
        writeln!(out, "Moving: nothing")?;
    }
    for m in &report.moving {
        writeln!(
            out,
            "Moving: {}-{} to {:?} (adding {:?}, removing {:?})",
            m.topic, m.partition, m.replicas, m.adding, m.removing
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: i32, fenced: Option<bool>, reachable: bool) -> NodeInfo {
        NodeInfo {
            id,
            broker: true,
            controller: true,
            quorum: Some(QuorumMembership::Voter),
            registered: fenced.is_some(),
            fenced,
            rack: None,
            advertised: Some(format!("127.0.0.1:{}", 9090 + id)),
            internal_address: None,
            reachable,
            error: (!reachable).then(|| "connection refused".to_string()),
            status: None,
        }
    }

    #[test]
    fn unreachable_nodes_are_listed_with_the_reason() {
        let cluster = ClusterStatus {
            cluster_id: "c".into(),
            node_id: 1,
            controller: None,
            metadata_offset: 7,
            nodes: vec![
                node(1, Some(false), true),
                node(2, Some(false), false),
                node(3, None, false),
                NodeInfo { broker: false, ..node(4, None, true) },
            ],
        };
        let mut out = Vec::new();
        write_info(&mut out, &cluster).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("Cluster: c\nController: none (no quorum leader)   Metadata offset: 7"), "{text}");
        let rows: Vec<Vec<&str>> = text.lines().skip(4).take(4).map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(rows[1][4], "unreachable", "{text}");
        assert_eq!(rows[2][4], "unregistered", "{text}");
        assert_eq!((rows[3][1], rows[3][4]), ("controller", "-"), "a controller-only node has no broker state: {text}");
        assert!(text.contains("node 2 is unreachable: connection refused\n"), "{text}");
    }
}
