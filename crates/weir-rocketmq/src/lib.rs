//! Weir's RocketMQ 5 front-end: `apache.rocketmq.v2.MessagingService`, the gRPC service a
//! RocketMQ 5 proxy serves, over the broker core. The official RocketMQ 5 clients (Java, Go,
//! Python, Node.js, Rust, ...) connect to `rocketmq.listeners` as they would to a proxy.
//!
//! The model (see `docs/rocketmq.md`): a RocketMQ topic is a Weir topic and its message queues
//! are the topic's partitions; a message is a record ([`weir_broker::message`]); a consumer
//! group is a Weir group. Like the Kafka front-end, this crate decodes requests, calls the core
//! and encodes answers; every core error becomes a status once, in [`status`]. What RocketMQ's
//! proxies and brokers decide (which messages a receive hands out, redeliveries, dead letters,
//! renewals, transaction checks) is the core's messaging ([`weir_messaging`]): this
//! crate owns no state beyond its connections, no periodic task and no file.
//!
//! - `service`: the calls, one method each;
//! - `route`: topic routes (which queue is where) and the endpoints in them;
//! - `send`: SendMessage, messages to records (a message group's queue led by another broker
//!   gets its messages through the core's `Broker::append_at_leader`);
//! - `receive`: ReceiveMessage's answers and receipt handles, over the core's
//!   invisible-time engine ([`weir_messaging::pop`]), with `filter` for tag expressions;
//! - `transaction`: EndTransaction, and the producers' streams the core checks open
//!   transactions through;
//! - `recall`: RecallMessage, delayed messages taken back before they are due;
//! - `telemetry`: the bidirectional Telemetry stream, where the client's settings meet the
//!   server's.

#![deny(unsafe_code)]
#![deny(clippy::unwrap_used)]

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};

mod auth;
mod filter;
mod recall;
mod receive;
mod route;
mod send;
mod service;
pub mod status;
mod telemetry;
mod transaction;

/// The protocol's messages and the service trait, generated from `proto/` at build time.
#[allow(clippy::all, clippy::unwrap_used, missing_docs)]
pub mod proto {
    tonic::include_proto!("apache.rocketmq.v2");
}

pub use service::Service;

/// The largest gRPC message taken or sent: a SendMessage of one message at the largest body a
/// topic can be given, with room for its properties. tonic's default (4 MiB) would refuse
/// RocketMQ's own default body limit with its headers.
pub const MAX_GRPC_MESSAGE_BYTES: usize = 64 << 20;

/// The accepted connections, with Nagle's algorithm off: a unary call's answer is one small
/// write the client waits for, and Nagle held it back up to 40 ms behind the client's delayed
/// ack. (tonic's `tcp_nodelay` applies to the listeners it binds itself, not to this stream.)
fn incoming(listener: TcpListener) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    TcpListenerStream::new(listener).map(|accepted| {
        let stream = accepted?;
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot turn Nagle's algorithm off on a RocketMQ connection");
        }
        Ok(stream)
    })
}

/// Serves RocketMQ clients on `listener` (over TLS when `tls` is given) until `shutdown`
/// completes, then lets the calls in progress finish.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<weir_security::tls::ReloadingTls>>,
    service: Arc<Service>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let metrics = service.metrics.clone();
    let authenticate =
        auth::Authenticate { broker: service.broker.clone(), metrics: metrics.clone(), failures: Default::default() };
    let server = proto::messaging_service_server::MessagingServiceServer::from_arc(service)
        .max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_GRPC_MESSAGE_BYTES);
    let server = tonic::service::interceptor::InterceptedService::new(server, authenticate);
    let router = tonic::transport::Server::builder()
        // Clients keep their connections for the client's life; tell dead peers apart.
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .add_service(server);
    match tls {
        None => router.serve_with_incoming_shutdown(incoming(listener), shutdown).await,
        Some(tls) => {
            let on_failure = move || metrics.connections.tls_handshake_failures.inc();
            let (sender, connections) = tokio::sync::mpsc::channel(16);
            let mut accepted = match weir_security::tls::TlsIncoming::new(listener, tls, "rocketmq", on_failure) {
                Ok(accepted) => accepted,
                Err(e) => {
                    // (Only when the listener has no local address: send the error as a
                    // connection that fails, which tonic reports.)
                    let _ = sender.try_send(Err(e));
                    return router.serve_with_incoming_shutdown(ReceiverStream::new(connections), shutdown).await;
                }
            };
            // The accepted connections, until the server stops taking them (drops the stream).
            tokio::spawn(async move {
                while let Some((stream, peer)) = accepted.accept().await {
                    if sender.send(Ok(TlsConnection { stream, peer })).await.is_err() {
                        return;
                    }
                }
            });
            let connections = ReceiverStream::new(connections);
            router.serve_with_incoming_shutdown(connections, shutdown).await
        }
    }
}

/// A client's TLS connection, with its peer address for `Request::remote_addr`.
struct TlsConnection {
    stream: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    peer: std::net::SocketAddr,
}

impl tonic::transport::server::Connected for TlsConnection {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::TcpConnectInfo {
            local_addr: self.stream.get_ref().0.local_addr().ok(),
            remote_addr: Some(self.peer),
        }
    }
}

impl tokio::io::AsyncRead for TlsConnection {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for TlsConnection {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
