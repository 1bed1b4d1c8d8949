//! Weir's admin HTTP front-end: liveness and readiness probes, Prometheus metrics, and a JSON
//! API over topics, consumer groups, records, the broker and the cluster. The `weir` command line
//! (`weir topic`, `weir group`, `weir produce`, `weir consume`, `weir cluster`) is a client of
//! this API.
//!
//! Like the Kafka front-end it is a thin adapter: parse the request, call the broker core
//! (`weir-broker`), write the answer. Every failure is Kafka's error code under its Kafka name
//! with a fitting HTTP status (`error`).
//!
//! Layout: [`api`] the JSON bodies (shared with the CLI), `error` the error mapping,
//! `probes` (`/health`, `/ready`, `/metrics`), `broker_info`, `cluster`, `operations` (health,
//! elections, DeleteRecords, reassignment plans, decommissioning), `topics`, `groups`,
//! `records` (produce and consume over HTTP), [`partitioner`] (Kafka's murmur2 key partitioner).
//!
//! Architecture invariant: every change goes through `Broker` and `GroupCoordinator` (appends,
//! commits, metadata changes), exactly as the Kafka front-end makes it, so the Kafka protocol
//! and HTTP see the same topics, records and offsets; reads use what `Broker::read` returns. The
//! only state of its own is a round-robin counter for records without key.
//!
//! Start-up: the listener serves from the moment it is bound, before the broker has recovered
//! its data: `/health` answers at once (the process is alive), `/ready` and the API answer 503
//! until [`AdminState::set_ready`] hands over the broker.
#![deny(unsafe_code)]
#![deny(clippy::unwrap_used)]

pub mod api;
mod broker_info;
mod cluster;
mod dynamic_configs;
mod error;
mod extract;
pub mod forward;
mod groups;
mod messages;
mod operations;
/// Kafka's murmur2 key partitioner, which lives in the core (RocketMQ sends with a message
/// group use it too).
pub use weir_broker::partitioner;
mod acls;
mod auth;
mod elastic;
mod probes;
mod quotas;
mod records;
mod topics;
mod users;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use axum::Router;
use tokio::net::TcpListener;
use weir_broker::{Broker, ErrorKind};
use weir_coordinators::group::GroupCoordinator;

use crate::error::ApiError;

/// Largest request body (a produce request's records, base64 included). Bodies above it get
/// 413 before they are parsed.
pub const BODY_BYTES_MAX: usize = 16 << 20;

/// The broker's parts the API calls, available once the broker has recovered.
pub struct Core {
    pub broker: Arc<Broker>,
    pub groups: Arc<GroupCoordinator>,
    /// Message queries and invisible-time resets.
    pub messaging: Arc<weir_messaging::Messaging>,
}

/// Shared by every request.
pub struct AdminState {
    started: Instant,
    /// `None` on a controller-only node.
    kafka_listener: Option<SocketAddr>,
    /// `None` when the admin listener is off (the state still serves forwarded requests).
    admin_listener: Option<SocketAddr>,
    core: OnceLock<Core>,
    /// Next partition for a record without key (round-robin over requests and topics).
    round_robin: AtomicU32,
    /// Admin API passwords checked lately (`auth`).
    checked_passwords: auth::CheckedPasswords,
}

impl AdminState {
    /// `started`: when the process started (uptime is measured from it).
    pub fn new(
        started: Instant,
        kafka_listener: Option<SocketAddr>,
        admin_listener: Option<SocketAddr>,
    ) -> Arc<AdminState> {
        Arc::new(AdminState {
            started,
            kafka_listener,
            admin_listener,
            core: OnceLock::new(),
            round_robin: AtomicU32::new(0),
            checked_passwords: Default::default(),
        })
    }

    /// The broker has recovered and serves: the API and `/ready` start answering.
    pub fn set_ready(&self, core: Core) {
        if self.core.set(core).is_err() {
            tracing::warn!("admin API: the broker was handed over twice; keeping the first");
        }
    }

    /// The broker, or 503 BROKER_NOT_AVAILABLE while it is starting.
    fn core(&self) -> Result<&Core, ApiError> {
        self.core.get().ok_or_else(|| {
            ApiError::new(ErrorKind::Unavailable, "the broker is starting (recovering its logs); retry shortly")
        })
    }
}

type SharedState = Arc<AdminState>;

/// Every endpoint. See `docs/admin-api.md`.
pub(crate) fn router(state: SharedState) -> Router {
    Router::new()
        .route("/health", get(probes::health))
        .route("/ready", get(probes::ready))
        .route("/metrics", get(probes::metrics))
        .route("/v1/broker", get(broker_info::info))
        .route("/v1/broker/configs", get(broker_info::configs))
        .route("/v1/cluster", get(cluster::info))
        .route("/v1/cluster/health", get(operations::health))
        .route("/v1/cluster/balance", get(elastic::balance))
        .route("/v1/cluster/configs", get(dynamic_configs::get).patch(dynamic_configs::alter))
        .route("/v1/elections", post(operations::elect))
        .route("/v1/reassignments/generate", post(operations::generate_plan))
        .route("/v1/brokers/{id}", delete(operations::unregister))
        .route("/v1/brokers/{id}/decommission", post(operations::decommission))
        .route("/v1/topics/{topic}/delete-records", post(operations::delete_records))
        .route("/v1/topics/{topic}/offsets", get(operations::offsets_at_time))
        .route("/v1/reassignments", get(cluster::reassignments).post(cluster::reassign))
        .route("/v1/replication-throttle", get(cluster::throttle).put(cluster::set_throttle))
        .route("/v1/users", get(users::list).post(users::create))
        .route("/v1/users/{name}", delete(users::delete))
        .route("/v1/acls", get(acls::list).post(acls::create).delete(acls::delete))
        .route("/v1/quotas", get(quotas::list).post(quotas::alter))
        .route("/v1/topics", get(topics::list).post(topics::create))
        .route("/v1/topics/{topic}", get(topics::describe).delete(topics::delete))
        .route("/v1/topics/{topic}/configs", get(topics::configs).patch(topics::alter_configs))
        .route("/v1/topics/{topic}/partitions", get(topics::partitions).post(topics::create_partitions))
        .route("/v1/topics/{topic}/split", post(elastic::split))
        .route("/v1/topics/{topic}/merge", post(elastic::merge))
        .route("/v1/topics/{topic}/records", get(records::consume_topic).post(records::produce))
        .route("/v1/topics/{topic}/partitions/{partition}/records", get(records::consume_partition))
        .route("/v1/topics/{topic}/messages", get(messages::query))
        .route("/v1/topics/{topic}/messages/{id}", get(messages::by_id))
        .route("/v1/groups", get(groups::list).post(groups::create))
        // Group settings are cluster metadata: any broker answers, the controller decides.
        .route("/v1/groups/{group}/configs", get(groups::configs).patch(groups::alter_configs))
        // Answered where the group's dead-letter partition is led.
        .route(
            "/v1/groups/{group}/dead-letters/resend",
            post(groups::resend_dead_letters)
                .route_layer(axum::middleware::from_fn_with_state(state.clone(), forward::at_dead_letter_leader)),
        )
        .merge(
            // Answered by the group's coordinator, wherever it is.
            Router::new()
                .route("/v1/groups/{group}", get(groups::describe).delete(groups::delete))
                .route("/v1/groups/{group}/offsets", post(groups::commit).delete(groups::delete_offsets))
                .route("/v1/groups/{group}/reset-offsets", post(groups::reset_offsets))
                .route_layer(axum::middleware::from_fn_with_state(state.clone(), forward::at_coordinator)),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::http(StatusCode::NOT_FOUND, "NOT_FOUND", "no such endpoint; see docs/admin-api.md")
}

async fn method_not_allowed() -> ApiError {
    ApiError::http(StatusCode::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED", "this endpoint does not take that method")
}

/// Serves `listener` (over TLS when `tls` is given) until `shutdown` completes, then stops
/// accepting and waits for the requests in progress (long polls return early once the broker
/// begins shutting down).
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<weir_security::tls::ReloadingTls>>,
    state: SharedState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = match tls {
        None => AdminListener::Plain(listener),
        Some(tls) => AdminListener::Tls(weir_security::tls::TlsIncoming::new(listener, tls, "admin", || {})?),
    };
    // Authentication wraps the router here, at the HTTP listener only: requests another node
    // forwards (`forward`) were authenticated there and go through `router` directly.
    let app = router(state.clone()).layer(axum::middleware::from_fn_with_state(state, auth::require));
    axum::serve(listener, app.into_make_service_with_connect_info::<Peer>()).with_graceful_shutdown(shutdown).await
}

/// The admin listener's connections: plain TCP, or TLS (`admin.ssl.enable`).
pub enum AdminListener {
    Plain(TcpListener),
    Tls(weir_security::tls::TlsIncoming),
}

/// One admin connection.
pub enum AdminStream {
    Plain(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>),
}

impl axum::serve::Listener for AdminListener {
    type Io = AdminStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (AdminStream, SocketAddr) {
        match self {
            AdminListener::Plain(listener) => {
                // (axum's accept for TCP retries failures itself.)
                let (stream, peer) = axum::serve::Listener::accept(listener).await;
                (AdminStream::Plain(stream), peer)
            }
            AdminListener::Tls(incoming) => match incoming.accept().await {
                Some((stream, peer)) => (AdminStream::Tls(Box::new(stream)), peer),
                // The accept task is gone (only when the listener is dropped): wait for the
                // shutdown that drops it.
                None => std::future::pending().await,
            },
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            AdminListener::Plain(listener) => listener.local_addr(),
            AdminListener::Tls(incoming) => Ok(incoming.local_addr()),
        }
    }
}

macro_rules! delegate_io {
    ($self:ident, $stream:ident => $call:expr) => {
        match $self.get_mut() {
            AdminStream::Plain($stream) => {
                let $stream = std::pin::Pin::new($stream);
                $call
            }
            AdminStream::Tls($stream) => {
                let $stream = std::pin::Pin::new(&mut **$stream);
                $call
            }
        }
    };
}

impl tokio::io::AsyncRead for AdminStream {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        delegate_io!(self, s => s.poll_read(cx, buf))
    }
}

impl tokio::io::AsyncWrite for AdminStream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        delegate_io!(self, s => s.poll_write(cx, buf))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        delegate_io!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        delegate_io!(self, s => s.poll_shutdown(cx))
    }
}

/// The peer of an admin request (what `auth` checks the loopback bootstrap and ACL hosts by).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub(crate) SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, AdminListener>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, AdminListener>) -> Peer {
        Peer(*stream.remote_addr())
    }
}
