//! `weir cluster info`.

use std::io::Write;

use clap::{Args, Subcommand};
use weir_admin::api::{ClusterStatus, NodeInfo, QuorumMembership};

use super::{print_json, AdminClient, Connection, Table};

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
}

pub fn run(args: &ClusterArgs) -> anyhow::Result<()> {
    let client = AdminClient::new(&args.connection)?;
    let mut out = std::io::stdout().lock();
    match args.command {
        ClusterCommand::Info => {
            let cluster: ClusterStatus = client.get("/v1/cluster", &[])?;
            if args.connection.json {
                return print_json(&mut out, &cluster);
            }
            write_info(&mut out, &cluster)?;
        }
    }
    Ok(())
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
