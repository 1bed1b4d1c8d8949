//! Raft messages between the voters, over whatever transport the process gives the quorum
//! ([`RaftTransport`]: the internal RPC listener in cluster mode, nothing for a single voter).
//! Requests and responses are JSON; a response carries openraft's own result, so a remote Raft
//! error reaches the local Raft as such.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{MetadataRaft, NodeId};

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The RPC methods of the quorum.
/// What every Raft method's name starts with.
pub(crate) const METHOD_PREFIX: &str = "raft.";
pub(crate) const APPEND_ENTRIES: &str = "raft.append_entries";
pub(crate) const VOTE: &str = "raft.vote";
pub(crate) const INSTALL_SNAPSHOT: &str = "raft.install_snapshot";

/// Why a message did not get an answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransportError {
    /// The peer could not be reached at all (nothing listens, no route): try it later.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// Sent, or being sent, but no answer (timeout, connection lost, bad frame).
    #[error("{0}")]
    Failed(String),
}

/// Delivers one request to the voter `target` listening at `addr` and returns its answer.
pub trait RaftTransport: Send + Sync + 'static {
    fn call(
        &self,
        target: NodeId,
        addr: String,
        method: &'static str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<Result<Vec<u8>, TransportError>>;
}

/// A quorum of one voter has nobody to talk to.
pub struct NoPeers;

impl RaftTransport for NoPeers {
    fn call(
        &self,
        target: NodeId,
        _: String,
        _: &'static str,
        _: Vec<u8>,
        _: Duration,
    ) -> BoxFuture<Result<Vec<u8>, TransportError>> {
        Box::pin(async move { Err(TransportError::Unreachable(format!("no transport to voter {target}"))) })
    }
}

/// The most entry bytes one AppendEntries call carries (the internal RPC's frames go to 16 MiB;
/// one entry is at most `MAX_ENTRY_BYTES`, so one always fits).
const MAX_APPEND_BYTES: usize = 12 << 20;

#[derive(Clone)]
pub(crate) struct Network {
    transport: Arc<dyn RaftTransport>,
    /// The longest a message waits for its answer, unless openraft gives a shorter deadline.
    timeout: Duration,
}

impl Network {
    pub fn new(transport: Arc<dyn RaftTransport>, timeout: Duration) -> Network {
        Network { transport, timeout }
    }
}

impl RaftNetworkFactory<MetadataRaft> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        Peer { network: self.clone(), target, addr: node.addr.clone() }
    }
}

pub struct Peer {
    network: Network,
    target: NodeId,
    addr: String,
}

impl Peer {
    async fn send<Req, Resp, E>(
        &self,
        method: &'static str,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let body = serde_json::to_vec(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let timeout = option.hard_ttl().min(self.network.timeout);
        let answer =
            self.network.transport.call(self.target, self.addr.clone(), method, body, timeout).await.map_err(|e| {
                match e {
                    TransportError::Unreachable(_) => RPCError::Unreachable(Unreachable::new(&e)),
                    TransportError::Failed(_) => RPCError::Network(NetworkError::new(&e)),
                }
            })?;
        let result: Result<Resp, RaftError<NodeId, E>> =
            serde_json::from_slice(&answer).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<MetadataRaft> for Peer {
    async fn append_entries(
        &mut self,
        request: AppendEntriesRequest<MetadataRaft>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        // Entries of up to MAX_ENTRY_BYTES each: several large ones (a follower catching up
        // over fencings of big brokers) would not fit one frame. openraft then sends fewer.
        let entries = request.entries.len();
        if entries > 1 {
            let size: usize =
                request.entries.iter().map(|e| serde_json::to_vec(e).map_or(usize::MAX, |v| v.len())).sum();
            if size > MAX_APPEND_BYTES {
                let fit = (entries as u64 * MAX_APPEND_BYTES as u64 / size.max(1) as u64).clamp(1, entries as u64 - 1);
                return Err(PayloadTooLarge::new_entries_hint(fit).into());
            }
        }
        self.send(APPEND_ENTRIES, &request, &option).await
    }

    async fn install_snapshot(
        &mut self,
        request: InstallSnapshotRequest<MetadataRaft>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>>
    {
        self.send(INSTALL_SNAPSHOT, &request, &option).await
    }

    async fn vote(
        &mut self,
        request: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.send(VOTE, &request, &option).await
    }
}

/// Answers one Raft message from a peer: the JSON of openraft's result, or why the request
/// could not be read; and whether it came from a leader this voter follows (an AppendEntries
/// it did not refuse for a higher vote), which renews that leader's lease here.
pub async fn handle(raft: &openraft::Raft<MetadataRaft>, method: &str, body: &[u8]) -> Result<(Vec<u8>, bool), String> {
    fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, String> {
        serde_json::to_vec(value).map_err(|e| format!("cannot encode the answer: {e}"))
    }
    fn decode<T: DeserializeOwned>(method: &str, body: &[u8]) -> Result<T, String> {
        serde_json::from_slice(body).map_err(|e| format!("{method}: cannot decode the request: {e}"))
    }
    match method {
        APPEND_ENTRIES => {
            let answer = raft.append_entries(decode(method, body)?).await;
            let heard = matches!(&answer, Ok(response) if !matches!(response, AppendEntriesResponse::HigherVote(_)));
            Ok((encode(&answer)?, heard))
        }
        VOTE => Ok((encode(&raft.vote(decode(method, body)?).await)?, false)),
        INSTALL_SNAPSHOT => Ok((encode(&raft.install_snapshot(decode(method, body)?).await)?, false)),
        other => Err(format!("unknown Raft method {other:?}")),
    }
}
