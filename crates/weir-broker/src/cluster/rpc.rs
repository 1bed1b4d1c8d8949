//! The internal RPC as the cluster uses it: calls to other nodes (errors in Weir's terms), the
//! Raft transport over the RPC client, and the handle of the server ([`super::server`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::oneshot;
use weir_rpc::{RpcClient, RpcErrorKind};

use crate::error::{BrokerError, ErrorKind};
use crate::metadata::raft::network::{BoxFuture, RaftTransport, TransportError};
use crate::metadata::raft::NodeId;

/// The running RPC server.
pub(crate) struct ServerHandle {
    pub(super) stop: oneshot::Sender<()>,
    pub(super) task: tokio::task::JoinHandle<()>,
}

impl ServerHandle {
    /// Stops accepting, lets the requests under way finish (the server's grace) and waits.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        if let Err(e) = self.task.await {
            tracing::warn!(error = %e, "the internal RPC server task failed");
        }
    }
}

/// Resolves `host:port` (a name or an IP).
pub(crate) async fn resolve(addr: &str) -> Result<SocketAddr, String> {
    if let Ok(parsed) = addr.parse() {
        return Ok(parsed);
    }
    tokio::net::lookup_host(addr)
        .await
        .map_err(|e| format!("cannot resolve {addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr} resolves to no address"))
}

/// Calls `method` at the node listening on `addr`; the error in Weir's terms.
pub(crate) async fn call(
    rpc: &RpcClient,
    addr: &str,
    method: &str,
    body: Bytes,
    timeout: Duration,
) -> Result<Bytes, BrokerError> {
    let peer = resolve(addr).await.map_err(|e| BrokerError::new(ErrorKind::Unavailable, e))?;
    rpc.call(peer, method, body, timeout).await.map_err(|e| {
        let kind = match e.kind() {
            RpcErrorKind::Timeout { .. } => ErrorKind::TimedOut,
            RpcErrorKind::Unreachable(_) | RpcErrorKind::ConnectionLost(_) => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        };
        BrokerError::new(kind, e.to_string())
    })
}

/// Raft messages over the internal RPC client.
///
/// The quorum retries a peer that does not answer twice a second and logs each failure; the
/// server's default filter silences those (`default_log_filter`), and this transport says it
/// once instead: when a peer stops answering, and when it answers again.
pub(crate) struct RpcRaftTransport {
    pub rpc: RpcClient,
    /// The peers whose last call failed.
    pub silent: Arc<std::sync::Mutex<std::collections::HashSet<NodeId>>>,
}

impl RpcRaftTransport {
    pub fn new(rpc: RpcClient) -> RpcRaftTransport {
        RpcRaftTransport { rpc, silent: Arc::default() }
    }
}

impl RaftTransport for RpcRaftTransport {
    fn call(
        &self,
        target: NodeId,
        addr: String,
        method: &'static str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<Result<Vec<u8>, TransportError>> {
        let rpc = self.rpc.clone();
        let silent = self.silent.clone();
        Box::pin(async move {
            let answer = match resolve(&addr).await {
                Err(e) => Err(TransportError::Unreachable(e)),
                Ok(peer) => match rpc.call(peer, method, Bytes::from(body), timeout).await {
                    Ok(answer) => Ok(answer.to_vec()),
                    Err(e) => match e.kind() {
                        RpcErrorKind::Unreachable(_) => {
                            Err(TransportError::Unreachable(format!("voter {target} at {addr}: {e}")))
                        }
                        _ => Err(TransportError::Failed(format!("voter {target} at {addr}: {e}"))),
                    },
                },
            };
            let was_silent = match &answer {
                Ok(_) => weir_storage::sync::lock(&silent).remove(&target),
                Err(_) => !weir_storage::sync::lock(&silent).insert(target),
            };
            match (&answer, was_silent) {
                (Ok(_), true) => tracing::info!(node = target, %addr, "metadata quorum: the node answers again"),
                (Err(e), false) => {
                    tracing::warn!(node = target, %addr, error = %e, "metadata quorum: a node does not answer; retrying")
                }
                _ => {}
            }
            answer
        })
    }
}
