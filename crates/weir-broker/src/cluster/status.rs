//! The cluster as one node sees it, for `weir cluster info` and `GET /v1/cluster`: every node
//! (the voters of the metadata quorum and the registered brokers), what the metadata says of
//! it, and what it says of itself.
//!
//! What a node says of itself comes from asking it (`cluster.node_status`), all nodes at once
//! and each for at most [`NODE_STATUS_TIMEOUT`]: a dead or paused node costs the answer that
//! long and no longer, and is listed as unreachable with the reason. The answering node reads
//! its own status without a call, so a cluster of one needs no CONTROLLER listener.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use super::{methods, rpc};
use crate::broker::{Broker, NodeStatus};
use crate::error::{BrokerError, ErrorKind};
use crate::metadata::BrokerRegistration;

/// How long the answer waits for each node. A live node answers from memory in well under a
/// millisecond on a LAN; one second leaves room for a loaded one, and is as long as a person
/// at `weir cluster info` should wait when a node is down.
pub const NODE_STATUS_TIMEOUT: Duration = Duration::from_secs(1);

/// The cluster as the answering node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub cluster_id: String,
    /// The node that answered (whose metadata the registrations and the offset are).
    pub node_id: i32,
    /// The active controller (the quorum's leader), as the answering node knows it; `None`
    /// during an election or without a majority.
    pub controller: Option<i32>,
    /// The metadata offset the answering node has applied (and its partitions follow): what
    /// every node's `applied_offset` is compared with.
    pub metadata_offset: i64,
    /// Every voter and every registered broker, by id.
    pub nodes: Vec<NodeInfo>,
}

/// One node: what the answering node's metadata says of it, and what it reports itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: i32,
    /// Its roles: from its own report, else a registered node is a broker and a voter a
    /// controller.
    pub broker: bool,
    pub controller: bool,
    /// Its place in the metadata quorum's membership; `None` for a broker not yet added as a
    /// learner.
    pub quorum: Option<QuorumMembership>,
    /// It registered with the controller (a broker that never did has no registration).
    pub registered: bool,
    /// Its registration says it is fenced (it leads nothing); `None` when not registered.
    pub fenced: Option<bool>,
    pub rack: Option<String>,
    /// The advertised Kafka listener, `host:port`, from its registration.
    pub advertised: Option<String>,
    /// Its CONTROLLER listener, where the cluster's internal requests reach it.
    pub internal_address: Option<String>,
    /// It answered `cluster.node_status` within the timeout (the answering node always does).
    pub reachable: bool,
    /// Why it did not answer.
    pub error: Option<String>,
    /// What it says of itself: applied metadata offset, Raft role and term, whether it may
    /// lead, when the controller last acknowledged its heartbeat. `None` when unreachable.
    pub status: Option<NodeStatus>,
}

/// Where a node stands in the quorum's membership.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuorumMembership {
    /// Votes in elections and counts toward the majority (a controller).
    Voter,
    /// Is sent the metadata log but does not vote (a broker that is no controller: KRaft's
    /// observer).
    Learner,
}

impl Broker {
    /// The cluster as this node sees it; returns within about [`NODE_STATUS_TIMEOUT`] whatever
    /// the other nodes do.
    pub async fn cluster_status(&self) -> ClusterStatus {
        let me = self.config.node_id;
        let own = self.node_status();
        let metadata = self.metadata();
        let voters = ids(&own.quorum.voters);
        let learners = ids(&own.quorum.learners);
        let configured: BTreeMap<i32, String> = self
            .config
            .quorum_voters()
            .into_iter()
            .filter(|(_, (host, _))| !host.is_empty())
            .map(|(id, (host, port))| (id, format!("{host}:{port}")))
            .collect();
        let mut every: BTreeSet<i32> = metadata.brokers.keys().copied().collect();
        every.extend(configured.keys().copied().chain(voters.iter().copied()).chain(learners.iter().copied()));
        every.insert(me);

        // The address to ask: the registration's (what the node itself said), else the
        // quorum's, else the configured voter's (a voter that never registered).
        let address = |id: i32| -> Option<String> {
            let registered = metadata.brokers.get(&id).map(|b| b.internal.clone()).filter(|a| !a.is_empty());
            registered
                .or_else(|| u64::try_from(id).ok().and_then(|raft_id| self.quorum.voter_address(raft_id)))
                .filter(|a| !a.is_empty())
                .or_else(|| configured.get(&id).cloned())
        };
        let mut asking = JoinSet::new();
        for &id in every.iter().filter(|id| **id != me) {
            let Some(addr) = address(id) else { continue };
            let client = self.cluster.rpc.clone();
            asking.spawn(async move { (id, ask(&client, &addr).await) });
        }
        let mut answers: BTreeMap<i32, Result<NodeStatus, String>> = BTreeMap::new();
        while let Some(joined) = asking.join_next().await {
            match joined {
                Ok((id, answer)) => {
                    answers.insert(id, answer);
                }
                Err(e) => tracing::warn!(error = %e, "a cluster.node_status call failed"),
            }
        }

        let nodes = every
            .iter()
            .map(|&id| {
                let registration = metadata.brokers.get(&id);
                let answer = if id == me {
                    Ok(own.clone())
                } else {
                    answers.remove(&id).unwrap_or_else(|| {
                        Err(match address(id) {
                            Some(_) => "its status call did not finish".to_string(),
                            None => "no internal address is known for it".to_string(),
                        })
                    })
                };
                let quorum = if voters.contains(&id) {
                    Some(QuorumMembership::Voter)
                } else if learners.contains(&id) {
                    Some(QuorumMembership::Learner)
                } else {
                    None
                };
                node_info(id, registration, quorum, configured.contains_key(&id), address(id), answer)
            })
            .collect();
        ClusterStatus {
            cluster_id: metadata.cluster_id.clone(),
            node_id: me,
            controller: self.active_controller(),
            metadata_offset: own.applied_offset,
            nodes,
        }
    }
}

/// The metadata quorum as its leader describes it (Kafka's DescribeQuorum): Raft indexes are the
/// metadata log's offsets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumDescription {
    pub leader_id: i32,
    /// The Raft term (Kafka's leader epoch of `__cluster_metadata`).
    pub term: u64,
    /// The leader's last applied entry, so committed (Kafka's high watermark, exclusive).
    pub high_watermark: i64,
    /// (node id, log end offset as the leader knows it; -1 unknown), voters and observers.
    pub voters: Vec<(i32, i64)>,
    pub observers: Vec<(i32, i64)>,
}

impl Broker {
    /// The quorum as its leader sees it: this node's view when it leads, else the leader's,
    /// asked over the internal RPC (bounded by [`NODE_STATUS_TIMEOUT`]).
    pub async fn describe_quorum(&self) -> Result<QuorumDescription, BrokerError> {
        let local = self.node_status();
        let leader_status = match local.quorum.leader {
            None => return Err(BrokerError::new(ErrorKind::NotLeader, "the metadata quorum has no leader right now")),
            Some(leader) if leader == self.quorum.node_id() => local.quorum,
            Some(leader) => {
                let addr = self.quorum.voter_address(leader).filter(|a| !a.is_empty()).ok_or_else(|| {
                    BrokerError::new(ErrorKind::NotLeader, format!("the quorum leader {leader} has no known address"))
                })?;
                let status =
                    ask(&self.cluster.rpc, &addr).await.map_err(|e| BrokerError::new(ErrorKind::NotLeader, e))?;
                if status.quorum.leader != Some(leader) || status.quorum.role != "Leader" {
                    return Err(BrokerError::new(
                        ErrorKind::NotLeader,
                        format!("node {leader} no longer leads the quorum"),
                    ));
                }
                status.quorum
            }
        };
        let leader = leader_status.leader.unwrap_or_default();
        let end = |node: u64| -> i64 {
            let index = if node == leader {
                leader_status.last_log_index
            } else {
                leader_status.replication.get(&node).copied().flatten()
            };
            index.map_or(-1, |i| i64::try_from(i).unwrap_or(i64::MAX).saturating_add(1))
        };
        let list =
            |nodes: &BTreeSet<u64>| nodes.iter().filter_map(|n| Some((i32::try_from(*n).ok()?, end(*n)))).collect();
        Ok(QuorumDescription {
            leader_id: i32::try_from(leader).unwrap_or(-1),
            term: leader_status.term,
            high_watermark: leader_status
                .applied_index
                .map_or(0, |i| i64::try_from(i).unwrap_or(i64::MAX).saturating_add(1)),
            voters: list(&leader_status.voters),
            observers: list(&leader_status.learners),
        })
    }
}

/// Raft's node ids as Weir's (an id that does not fit is no node Weir configured).
fn ids(raft_ids: &BTreeSet<u64>) -> BTreeSet<i32> {
    raft_ids.iter().filter_map(|id| i32::try_from(*id).ok()).collect()
}

/// Asks the node at `addr` for its status, giving up after [`NODE_STATUS_TIMEOUT`]. The outer
/// timeout also bounds resolving the address, which the RPC client's own does not cover.
async fn ask(client: &weir_rpc::RpcClient, addr: &str) -> Result<NodeStatus, String> {
    let call = rpc::call(client, addr, methods::NODE_STATUS, Bytes::new(), NODE_STATUS_TIMEOUT);
    let answer = match tokio::time::timeout(NODE_STATUS_TIMEOUT, call).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => return Err(e.message),
        Err(_) => return Err(format!("{addr} did not answer within {} ms", NODE_STATUS_TIMEOUT.as_millis())),
    };
    serde_json::from_slice(&answer).map_err(|e| format!("{addr} answered {}: {e}", methods::NODE_STATUS))
}

fn node_info(
    id: i32,
    registration: Option<&BrokerRegistration>,
    quorum: Option<QuorumMembership>,
    configured_voter: bool,
    internal_address: Option<String>,
    answer: Result<NodeStatus, String>,
) -> NodeInfo {
    let (status, error) = match answer {
        Ok(status) => (Some(status), None),
        Err(error) => (None, Some(error)),
    };
    let (broker, controller) = match &status {
        Some(status) => (status.broker, status.controller),
        None => (registration.is_some(), configured_voter || quorum == Some(QuorumMembership::Voter)),
    };
    NodeInfo {
        id,
        broker,
        controller,
        quorum,
        registered: registration.is_some(),
        fenced: registration.map(|r| r.fenced),
        rack: registration.and_then(|r| r.rack.clone()),
        advertised: registration.map(|r| format!("{}:{}", r.host, r.port)),
        internal_address: status.as_ref().and_then(|s| s.internal_address.clone()).or(internal_address),
        reachable: status.is_some(),
        error,
        status,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[tokio::test]
    async fn a_node_that_never_answers_costs_the_timeout_and_no_more() {
        // Connections complete in the backlog, but nobody reads the request: as a paused node.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = silent.local_addr().expect("address").to_string();
        let client = weir_rpc::RpcClient::new(weir_rpc::ClientConfig::default());
        let started = Instant::now();
        let error = ask(&client, &addr).await.expect_err("no answer");
        let waited = started.elapsed();
        assert!(waited >= NODE_STATUS_TIMEOUT && waited < NODE_STATUS_TIMEOUT * 2, "waited {waited:?}: {error}");
        assert!(error.contains(&addr), "{error}");
    }
}
