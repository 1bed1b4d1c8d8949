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
    tls: Option<weir_rpc::ServerTls>,
) -> std::io::Result<ServerHandle> {
    listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(listener)?;
    let handler: Arc<dyn Handler> = Arc::new(InternalHandler { raft, broker });
    let (stop, stopped) = oneshot::channel::<()>();
    let config = weir_rpc::ServerConfig { shutdown_grace: Duration::from_secs(2), tls, ..Default::default() };
    let task = tokio::spawn(weir_rpc::serve(listener, handler, config, async {
        let _ = stopped.await;
    }));
    Ok(ServerHandle { stop, task })
}

/// The CONTROLLER listener's TLS (`CONTROLLER:SSL`), certificates reloaded when their files
/// change. With the authorizer on, only the cluster's own nodes are admitted: the principal of
/// the certificate a peer presents must be a super user (Kafka's brokers and controllers need
/// CLUSTER_ACTION there, which their super-user principals have). With it off, whoever the TLS
/// settings let in (`ssl.client.auth=required`: a certificate the truststore trusts).
pub(crate) fn server_tls(config: &crate::config::BrokerConfig) -> Result<Option<weir_rpc::ServerTls>, String> {
    let Some(settings) = &config.controller_tls else { return Ok(None) };
    let reloading = Arc::new(weir_security::tls::ReloadingTls::new(settings.clone())?);
    let admit: Option<weir_rpc::Admit> = config.authorizer.enabled.then(|| {
        let super_users = config.authorizer.super_users.clone();
        let rules = config.controller_principal_rules.clone();
        Arc::new(move |chain: Option<&[rustls::pki_types::CertificateDer<'static>]>| {
            let principal = match chain.and_then(|c| c.first()) {
                None => weir_security::acl::ANONYMOUS.to_string(),
                Some(leaf) => rules.principal_of_certificate(leaf)?,
            };
            if super_users.contains(&principal) {
                Ok(())
            } else {
                Err(format!(
                    "the CONTROLLER listener admits the cluster's nodes only, and {principal} is not in super.users"
                ))
            }
        }) as weir_rpc::Admit
    });
    Ok(Some(weir_rpc::ServerTls {
        acceptor: Arc::new(move || reloading.acceptor()),
        admit,
        handshake_timeout: weir_security::tls::HANDSHAKE_TIMEOUT,
    }))
}

/// This node's TLS as a client of the other nodes' CONTROLLER listeners: the same keystore
/// (presented when asked) and truststore, reloaded when their files change.
pub(crate) fn client_tls(config: &crate::config::BrokerConfig) -> Result<Option<weir_rpc::ClientTls>, String> {
    let Some(settings) = &config.controller_tls else { return Ok(None) };
    let reloading = weir_security::tls::ReloadingClientTls::new(settings.clone(), config.verify_peer_names)?;
    Ok(Some(weir_rpc::ClientTls::new(move || reloading.config())))
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
