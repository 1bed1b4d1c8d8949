//! The metadata quorum: the metadata log is the replicated log of a Raft group of controller
//! voters (openraft), and the Raft leader is the active controller (the KRaft idea).
//!
//! One Raft entry carries one [`MetadataCommand`]: the records of one controller decision,
//! applied together. A single node is a quorum of one voter, with the same code path.
//!
//! Code map: `log_store` keeps the Raft log on the storage engine, `state_machine` applies
//! committed commands to the `MetadataState` and publishes it, [`network`] carries Raft
//! messages over the process's transport.
//!
//! Why openraft: a well-kept Rust implementation on tokio with the storage and network behind
//! traits this crate implements on its own log and transport, joint-consensus membership, leader
//! leases and snapshots; TiKV's `raft` would leave the event loop, timers and message plumbing
//! to write by hand.

// openraft's `StorageError` and `RaftError` are large, and its traits return them by value.
#![allow(clippy::result_large_err)]

pub(crate) mod log_store;
pub mod network;
pub(crate) mod state_machine;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, Config, Raft, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use weir_storage::Clock;

use self::log_store::RaftLogStore;
use self::network::{Network, RaftTransport};
use self::state_machine::MetadataStateMachine;
use super::{MetadataRecord, MetadataState};
use weir_error::{BrokerError, ErrorKind};

/// A voter's id: the node's `node.id`.
pub type NodeId = u64;

/// The records of one controller decision, committed and applied as one Raft entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetadataCommand {
    pub records: Vec<MetadataRecord>,
}

impl std::fmt::Display for MetadataCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} metadata record(s)", self.records.len())
    }
}

/// What applying a command answers: the index it was applied at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandResult {
    pub index: u64,
}

openraft::declare_raft_types!(
    /// The Raft types of the metadata quorum.
    pub MetadataRaft:
        D = MetadataCommand,
        R = CommandResult,
);

/// The largest metadata change one log entry may carry, encoded. A fencing of a broker holding
/// 15,000 replicas is about 2 MiB; the internal RPC carries frames of up to 16 MiB, so an
/// AppendEntries call always has room for one entry (see `network::MAX_APPEND_BYTES`).
pub const MAX_ENTRY_BYTES: usize = 8 << 20;

/// How the quorum runs.
#[derive(Debug, Clone)]
pub struct QuorumConfig {
    pub node_id: NodeId,
    /// Every voter's id and the address of its controller listener (empty for a quorum of one).
    pub voters: BTreeMap<NodeId, String>,
    /// Leaderless this long (at least; up to half as long again, at random), a voter stands for
    /// election (`controller.quorum.election.timeout.ms`).
    pub election_timeout_ms: u64,
    /// A snapshot is written after this many entries (`metadata.snapshot.interval.records`).
    pub snapshot_interval: u64,
    /// The longest a proposal waits to be committed (`controller.quorum.request.timeout.ms`):
    /// past it the quorum is taken to have lost its majority.
    pub commit_timeout_ms: u64,
}

/// This node's view of the quorum (`weir cluster info`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuorumStatus {
    /// Leader, Follower, Candidate or Learner.
    pub role: String,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub applied_index: Option<u64>,
    pub last_log_index: Option<u64>,
    pub voters: BTreeSet<NodeId>,
    pub learners: BTreeSet<NodeId>,
    /// On the leader: how long since a majority last acknowledged it.
    pub(crate) millis_since_quorum_ack: Option<u64>,
    /// On the leader: the last log index each other voter and learner is known to hold.
    #[serde(default)]
    pub replication: BTreeMap<NodeId, Option<u64>>,
}

/// Answers other voters' Raft messages on this node (see [`Quorum::messages`]).
#[derive(Clone)]
pub struct RaftMessages {
    raft: Raft<MetadataRaft>,
    leader_contact: LeaderContact,
}

/// When this voter last took an AppendEntries from a leader: openraft's leader lease runs from
/// then, and it does not say so itself.
type LeaderContact = Arc<Mutex<Option<Instant>>>;

impl RaftMessages {
    /// Whether `method` of the internal RPC is a Raft message.
    pub fn is_raft_method(method: &str) -> bool {
        method.starts_with(network::METHOD_PREFIX)
    }

    /// Answers the Raft message `method` with its JSON `body`; the error says why it could not.
    pub async fn handle(&self, method: &str, body: &[u8]) -> Result<Vec<u8>, String> {
        let (answer, leader_heard) = network::handle(&self.raft, method, body).await?;
        if leader_heard {
            *weir_storage::sync::lock(&self.leader_contact) = Some(Instant::now());
        }
        Ok(answer)
    }
}

/// This node's part in the metadata quorum: its Raft instance and the applied state.
pub struct Quorum {
    raft: Raft<MetadataRaft>,
    node_id: NodeId,
    commit_timeout: Duration,
    election_timeout: Duration,
    /// openraft's leader lease (its `election_timeout_max`): a voter refuses candidates until
    /// this long after it last heard the leader.
    leader_lease: Duration,
    leader_contact: LeaderContact,
    log: RaftLogStore,
    state: watch::Receiver<Arc<MetadataState>>,
}

/// How long after the lost leader's lease a voter stands in for it: the other voters heard the
/// leader last a little later or earlier than this one (its heartbeats leave one by one, and
/// this machine may be busy), and a vote asked within their lease is refused.
const LEASE_MARGIN: Duration = Duration::from_millis(150);

impl Quorum {
    /// Opens the quorum's log and state machine in `dir`, starts Raft, and at the first start of
    /// a voter forms the quorum from `config.voters` (every voter does it with the same voters,
    /// which openraft allows; the first vote decides). Call within a tokio runtime.
    pub async fn start(
        dir: &Path,
        config: QuorumConfig,
        transport: Arc<dyn RaftTransport>,
        clock: Arc<dyn Clock>,
    ) -> Result<Quorum, BrokerError> {
        let storage_error = |e: &dyn std::fmt::Display| {
            BrokerError::new(ErrorKind::Storage, format!("cannot open the metadata quorum's log: {e}"))
        };
        let (log, (machine, state)) = {
            let dir = dir.to_path_buf();
            tokio::task::spawn_blocking(move || {
                let log = RaftLogStore::open(&dir, clock).map_err(|e| storage_error(&e))?;
                let machine = MetadataStateMachine::open(&dir).map_err(|e| storage_error(&e))?;
                Ok::<_, BrokerError>((log, machine))
            })
            .await
            .map_err(|e| BrokerError::internal(format!("opening the metadata quorum: {e}")))??
        };
        let election = config.election_timeout_ms.max(10);
        let leader_lease = Duration::from_millis(election * 3 / 2);
        let raft_config = Config {
            cluster_name: "weir-metadata".to_string(),
            // openraft also bounds each AppendEntries call by this interval, so it must leave a
            // busy machine room to answer; a third of the election timeout still sends three
            // heartbeats before a follower gives up on its leader.
            heartbeat_interval: (election / 3).max(5),
            election_timeout_min: election,
            // openraft's leader lease is this maximum: voters refuse a candidate until it has
            // passed since they last heard the leader. Twice the minimum made a failover take
            // about 3.5 election timeouts; half as much again, about 2.9 (docs/performance.md).
            election_timeout_max: leader_lease.as_millis() as u64,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_interval),
            // Keep a snapshot's worth of entries for voters a little behind.
            max_in_snapshot_log_to_keep: config.snapshot_interval,
            ..Config::default()
        }
        .validate()
        .map_err(|e| BrokerError::new(ErrorKind::InvalidConfig, format!("metadata quorum: {e}")))?;
        let network = Network::new(transport, Duration::from_millis(election.max(1000)));
        let raft = Raft::new(config.node_id, Arc::new(raft_config), network, log.clone(), machine)
            .await
            .map_err(|e| BrokerError::internal(format!("cannot start the metadata quorum: {e}")))?;
        let quorum = Quorum {
            raft,
            node_id: config.node_id,
            commit_timeout: Duration::from_millis(config.commit_timeout_ms.max(1)),
            election_timeout: Duration::from_millis(election),
            leader_lease,
            leader_contact: LeaderContact::default(),
            log,
            state,
        };
        quorum.form(&config).await?;
        Ok(quorum)
    }

    /// Forms the quorum from the configured voters if this node never was part of one.
    async fn form(&self, config: &QuorumConfig) -> Result<(), BrokerError> {
        if !config.voters.contains_key(&config.node_id) {
            return Ok(());
        }
        let initialized =
            self.raft.is_initialized().await.map_err(|e| BrokerError::internal(format!("metadata quorum: {e}")))?;
        if initialized {
            return Ok(());
        }
        let members: BTreeMap<NodeId, BasicNode> =
            config.voters.iter().map(|(id, addr)| (*id, BasicNode { addr: addr.clone() })).collect();
        match self.raft.initialize(members).await {
            Ok(()) => {
                tracing::info!(voters = ?config.voters.keys().collect::<Vec<_>>(), "formed the metadata quorum");
                Ok(())
            }
            // Another voter formed it first: the goal is reached.
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(BrokerError::internal(format!("cannot form the metadata quorum: {e}"))),
        }
    }

    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    #[cfg(test)]
    pub(crate) fn raft(&self) -> &Raft<MetadataRaft> {
        &self.raft
    }

    /// What answers the Raft messages other voters send this one (the `raft.*` methods of the
    /// internal RPC): served as soon as the quorum runs, before the broker exists.
    pub fn messages(&self) -> RaftMessages {
        RaftMessages { raft: self.raft.clone(), leader_contact: self.leader_contact.clone() }
    }

    /// Stands for election now rather than after an election timeout (a quorum of one elects
    /// itself at once).
    pub async fn elect_now(&self) {
        if let Err(e) = self.raft.trigger().elect().await {
            tracing::debug!(error = %e, "metadata quorum: election not triggered");
        }
    }

    /// The leader `lost` is known to be gone (its process closed its connections and its port
    /// refuses new ones): rather than wait out an election timeout, which may fire before the
    /// other voters' leases pass and be refused, stand for election as soon as they will vote:
    /// once the lease has passed since this voter last heard the leader. Only one voter stands,
    /// the lowest id among the others, so that two survivors do not split the vote; if it is
    /// gone too, the election timeouts elect someone as they would have.
    pub async fn stand_in_for_lost_leader(&self, lost: NodeId) {
        let first_other = self.voters().into_iter().find(|id| *id != lost);
        if first_other != Some(self.node_id) {
            return;
        }
        let heard = *weir_storage::sync::lock(&self.leader_contact);
        let since = heard.map_or(self.leader_lease, |at| at.elapsed());
        tokio::time::sleep((self.leader_lease + LEASE_MARGIN).saturating_sub(since)).await;
        let leader = self.leader();
        if leader.is_some_and(|l| l != lost) {
            return;
        }
        tracing::info!(lost, "metadata quorum: the active controller's process is gone; standing for election");
        self.elect_now().await;
    }

    /// Commits `records` as one entry; returns its index once it is committed and applied here.
    /// Only the leader (the active controller) can; others get `NotController`, naming it.
    /// A proposal not committed within the commit timeout fails with `TimedOut` (it may still
    /// be committed later, when the majority is back).
    pub async fn propose(&self, records: Vec<MetadataRecord>) -> Result<u64, BrokerError> {
        // An entry the log or a follower could not take would stop the quorum on every node
        // that tried to write it: refuse it here, before it is in any log.
        let command = MetadataCommand { records };
        let size = serde_json::to_vec(&command).map(|v| v.len()).unwrap_or(usize::MAX);
        if size > MAX_ENTRY_BYTES {
            return Err(BrokerError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "a metadata change of {size} bytes ({} records) is larger than one entry of the metadata log may \
                     be ({MAX_ENTRY_BYTES} bytes): make it in smaller steps",
                    command.records.len()
                ),
            ));
        }
        let write = self.raft.client_write(command);
        let Ok(written) = tokio::time::timeout(self.commit_timeout, write).await else {
            return Err(BrokerError::new(
                ErrorKind::TimedOut,
                format!(
                    "the metadata quorum did not commit the change within {} ms: a majority of the controllers is \
                     unreachable (it is applied if they come back in time)",
                    self.commit_timeout.as_millis()
                ),
            ));
        };
        match written {
            Ok(response) => Ok(response.log_id.index),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => Err(BrokerError::new(
                ErrorKind::NotController,
                match forward.leader_id {
                    Some(leader) => format!("this node is not the active controller; node {leader} is"),
                    None => "the metadata quorum has no leader right now (an election is under way)".to_string(),
                },
            )),
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                Err(BrokerError::internal(format!("metadata quorum: {e}")))
            }
            Err(RaftError::Fatal(e)) => {
                Err(BrokerError::new(ErrorKind::Unavailable, format!("the metadata quorum stopped: {e}")))
            }
        }
    }

    /// The active controller, if the quorum has one now.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    /// Ok when this node may decide as the active controller: it leads, it has applied an entry
    /// of its own term (so every earlier leader's decisions are in its state), and a majority
    /// acknowledged it recently (else a change could not commit anyway: fail fast).
    pub fn check_active_controller(&self) -> Result<(), BrokerError> {
        let metrics = self.raft.metrics().borrow().clone();
        if metrics.current_leader != Some(self.node_id) {
            return Err(BrokerError::new(
                ErrorKind::NotController,
                match metrics.current_leader {
                    Some(leader) => format!("this node is not the active controller; node {leader} is"),
                    None => "the metadata quorum has no leader right now (an election is under way)".to_string(),
                },
            ));
        }
        let applied_term = metrics.last_applied.map(|id| id.leader_id.get_term());
        if applied_term != Some(metrics.current_term) {
            return Err(BrokerError::new(
                ErrorKind::NotController,
                "the new active controller is still applying the metadata log",
            ));
        }
        let lease = 2 * self.election_timeout.max(Duration::from_millis(500));
        if metrics.millis_since_quorum_ack.is_none_or(|ms| ms > lease.as_millis() as u64) && !self.is_alone() {
            return Err(BrokerError::new(
                ErrorKind::TimedOut,
                format!(
                    "the active controller has not heard from a majority of the controllers for {} ms: a majority \
                     is down or cut off, so no metadata change can be committed",
                    metrics.millis_since_quorum_ack.unwrap_or(0)
                ),
            ));
        }
        Ok(())
    }

    /// True when this node is the only voter.
    fn is_alone(&self) -> bool {
        let voters = self.voters();
        voters.len() == 1 && voters.contains(&self.node_id)
    }

    /// The address of a voter's (or learner's) controller listener, from the membership.
    pub fn voter_address(&self, id: NodeId) -> Option<String> {
        let metrics = self.raft.metrics().borrow().clone();
        metrics.membership_config.membership().get_node(&id).map(|node| node.addr.clone())
    }

    /// Adds a broker that is not a voter as a learner: the leader replicates the metadata log
    /// to it from now on. Returns once the change is committed (not when the learner caught up).
    pub async fn add_learner(&self, id: NodeId, addr: String) -> Result<(), BrokerError> {
        let known = self.raft.metrics().borrow().membership_config.membership().get_node(&id).map(|n| n.addr.clone());
        if known.as_deref() == Some(addr.as_str()) {
            return Ok(());
        }
        let add = self.raft.add_learner(id, BasicNode { addr }, false);
        match tokio::time::timeout(self.commit_timeout, add).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(BrokerError::new(ErrorKind::NotController, format!("cannot add learner {id}: {e}"))),
            Err(_) => Err(BrokerError::new(ErrorKind::TimedOut, format!("adding learner {id} did not commit in time"))),
        }
    }

    /// Removes a learner (a broker-only node unregistered for good): the leader stops
    /// replicating the metadata log to it. Nothing to do for a node the membership lacks.
    pub async fn remove_learner(&self, id: NodeId) -> Result<(), BrokerError> {
        let membership = self.raft.metrics().borrow().membership_config.membership().clone();
        if membership.voter_ids().any(|v| v == id) {
            return Err(BrokerError::new(
                ErrorKind::InvalidRequest,
                format!("node {id} is a voter of the metadata quorum, not a learner"),
            ));
        }
        if membership.get_node(&id).is_none() {
            return Ok(());
        }
        let remove = self.raft.change_membership(openraft::ChangeMembers::RemoveNodes(BTreeSet::from([id])), false);
        match tokio::time::timeout(self.commit_timeout, remove).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(BrokerError::new(ErrorKind::NotController, format!("cannot remove learner {id}: {e}"))),
            Err(_) => {
                Err(BrokerError::new(ErrorKind::TimedOut, format!("removing learner {id} did not commit in time")))
            }
        }
    }

    /// What this node's Raft reports: its role, term, applied and last log index.
    pub fn status(&self) -> QuorumStatus {
        let metrics = self.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        QuorumStatus {
            role: format!("{:?}", metrics.state),
            term: metrics.current_term,
            leader: metrics.current_leader,
            applied_index: metrics.last_applied.map(|id| id.index),
            last_log_index: metrics.last_log_index,
            voters: membership.voter_ids().collect(),
            learners: membership.learner_ids().collect(),
            millis_since_quorum_ack: metrics.millis_since_quorum_ack,
            replication: metrics
                .replication
                .iter()
                .flatten()
                .map(|(node, matched)| (*node, matched.as_ref().map(|id| id.index)))
                .collect(),
        }
    }

    /// Waits up to `timeout` for the quorum to have a leader.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<NodeId, BrokerError> {
        self.raft
            .wait(Some(timeout))
            .metrics(|m| m.current_leader.is_some(), "a leader")
            .await
            .ok()
            .and_then(|m| m.current_leader)
            .ok_or_else(|| {
                BrokerError::new(
                    ErrorKind::Unavailable,
                    format!("the metadata quorum elected no leader within {} ms", timeout.as_millis()),
                )
            })
    }

    /// The voters of the current membership.
    pub fn voters(&self) -> BTreeSet<NodeId> {
        self.raft.metrics().borrow().membership_config.membership().voter_ids().collect()
    }

    /// The latest applied state.
    pub fn applied(&self) -> Arc<MetadataState> {
        self.state.borrow().clone()
    }

    /// Every applied state from now on.
    pub fn subscribe(&self) -> watch::Receiver<Arc<MetadataState>> {
        self.state.clone()
    }

    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "stopping the metadata quorum");
        }
        self.log.close();
    }
}

#[cfg(test)]
mod tests;
