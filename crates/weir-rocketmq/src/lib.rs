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
use tokio_stream::wrappers::TcpListenerStream;

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

/// Serves RocketMQ clients on `listener` until `shutdown` completes, then lets the calls in
/// progress finish.
pub async fn serve(
    listener: TcpListener,
    service: Arc<Service>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let server = proto::messaging_service_server::MessagingServiceServer::from_arc(service)
        .max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_GRPC_MESSAGE_BYTES);
    tonic::transport::Server::builder()
        // Clients keep their connections for the client's life; tell dead peers apart.
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .add_service(server)
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await
}
