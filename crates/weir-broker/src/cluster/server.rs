//! The internal RPC server every node of a cluster runs on its CONTROLLER listener.
//!
//! It answers Raft messages as soon as it runs (the quorum needs them to elect a leader before
//! the broker exists), control requests and status once the broker is open, and the methods of
//! the registered services.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use weir_rpc::{BoxFuture as RpcFuture, Handler, RemoteError};

use super::methods;
use super::rpc::ServerHandle;
use crate::broker::Broker;
use crate::metadata::raft::RaftMessages;

/// Starts serving `listener`. Call within a tokio runtime. `broker` is set once the broker is
/// open: until then only Raft messages are answered.
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
            methods::LIVENESS => Box::pin(super::liveness::hold(broker.shutdown_signal())),
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
