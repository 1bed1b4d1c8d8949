//! The internal RPC server every node of a cluster runs on its CONTROLLER listener, and the
//! Raft transport over the RPC client.
//!
//! The server answers Raft messages as soon as it runs (the quorum needs them to elect a
//! leader before the broker exists), control requests once the broker is open, and the methods
//! of the registered services.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use weir_rpc::{BoxFuture as RpcFuture, Handler, RemoteError, RpcClient, RpcErrorKind};

use super::methods;
use crate::broker::Broker;
use crate::error::{BrokerError, ErrorKind};
use crate::metadata::raft::network::{BoxFuture, RaftTransport, TransportError};
use crate::metadata::raft::{NodeId, RaftMessages};

/// The running RPC server.
pub(crate) struct ServerHandle {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
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

/// Starts serving `listener`. Call within a tokio runtime.
pub(crate) fn serve(
    listener: std::net::TcpListener,
    raft: RaftMessages,
    broker: Arc<OnceLock<Weak<Broker>>>,
) -> std::io::Result<ServerHandle> {
    listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(listener)?;
    let handler: Arc<dyn Handler> = Arc::new(InternalHandler { raft, broker });
    let (stop, stopped) = oneshot::channel::<()>();
    let config = weir_rpc::ServerConfig { shutdown_grace: Duration::from_secs(2), ..Default::default() };
    let task = tokio::spawn(weir_rpc::serve(listener, handler, config, async {
        let _ = stopped.await;
    }));
    Ok(ServerHandle { stop, task })
}

struct InternalHandler {
    raft: RaftMessages,
    broker: Arc<OnceLock<Weak<Broker>>>,
}

impl Handler for InternalHandler {
    fn handle(&self, method: &str, body: Bytes) -> RpcFuture<'static, Result<Bytes, RemoteError>> {
        if RaftMessages::is_raft_method(method) {
            let raft = self.raft.clone();
            let method = method.to_string();
            return Box::pin(
                async move { raft.handle(&method, &body).await.map(Bytes::from).map_err(RemoteError::new) },
            );
        }
        let Some(broker) = self.broker.get().and_then(Weak::upgrade) else {
            return Box::pin(async { Err(RemoteError::new("the node is starting: its broker is not open yet")) });
        };
        match method {
            methods::CONTROL => Box::pin(async move {
                let request = weir_rpc::decode_json(methods::CONTROL, &body)?;
                let answer = broker.serve_control(request).await;
                weir_rpc::encode_json(methods::CONTROL, &answer)
            }),
            methods::NODE_STATUS => {
                let status = broker.node_status();
                Box::pin(async move { weir_rpc::encode_json(methods::NODE_STATUS, &status) })
            }
            other => match broker.cluster.service(other) {
                Some(service) => service.handle(other, body),
                None => {
                    let error = RemoteError::unknown_method(other);
                    Box::pin(async move { Err(error) })
                }
            },
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
