//! One client connection: a reader that reads frames ahead (bounded), a processor that handles
//! them one at a time in arrival order (Kafka's per-connection ordering: a producer's pipelined
//! batches are appended in the order sent), and a writer that sends responses in the same
//! order while the next request is being handled. A produce is handed to the writer once its
//! batches are written, with its fsync still to wait for (`Reply::Later`): the processor goes on
//! to the next request, and the writer awaits the fsync before writing that response and the
//! ones after it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;
use tokio::io::{AsyncRead, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

use crate::context::{Ctx, Peer};
use crate::dispatch::{self, Reply};
use crate::frame::{self, FrameError};
use crate::sasl::{Authentication, Outcome};
use crate::zero_copy::{self, ResponseSink};

/// The number of the next connection (see [`Peer::connection`]).
static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// How long a client has to finish its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) async fn serve_connection(
    ctx: Arc<Ctx>,
    listener: usize,
    stream: TcpStream,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    match &ctx.listener(listener).tls {
        None => {
            let (read_half, write_half) = stream.into_split();
            let sink = ResponseSink::Plain(write_half);
            serve_stream(ctx.clone(), listener, read_half, sink, peer, None, shutdown).await;
        }
        Some(Err(_)) => {
            ctx.metrics.connections.tls_handshake_failures.inc();
            tracing::warn!(%peer, "refusing a connection: the listener's TLS certificate does not load");
        }
        Some(Ok(tls)) => {
            let accepted = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.acceptor().accept(stream)).await;
            match accepted {
                Ok(Ok(stream)) => {
                    let principal = match certificate_principal(&ctx, listener, &stream) {
                        Ok(principal) => principal,
                        Err(why) => {
                            ctx.metrics.connections.authentication_failures.inc();
                            tracing::info!(%peer, why, "refusing a client certificate");
                            return;
                        }
                    };
                    let (read_half, write_half) = tokio::io::split(stream);
                    let sink = ResponseSink::Tls(write_half);
                    serve_stream(ctx.clone(), listener, read_half, sink, peer, principal, shutdown).await;
                }
                Ok(Err(e)) => {
                    ctx.metrics.connections.tls_handshake_failures.inc();
                    tracing::info!(%peer, error = %e, "TLS handshake failed");
                }
                Err(_) => {
                    ctx.metrics.connections.tls_handshake_failures.inc();
                    tracing::info!(%peer, "TLS handshake timed out");
                }
            }
        }
    }
}

/// The principal of a client that presented a certificate on an SSL listener (Kafka's
/// `User:<subject>`, mapped by `ssl.principal.mapping.rules`); `None` without one, or on a
/// SASL_SSL listener, where SASL says who the client is. `Err`: a certificate no rule maps.
fn certificate_principal(
    ctx: &Ctx,
    listener: usize,
    stream: &tokio_rustls::server::TlsStream<TcpStream>,
) -> Result<Option<Arc<str>>, String> {
    let security = &ctx.listener(listener).security;
    if security.protocol.uses_sasl() {
        return Ok(None);
    }
    let Some(leaf) = stream.get_ref().1.peer_certificates().and_then(|chain| chain.first()) else {
        return Ok(None);
    };
    Ok(Some(security.principal_rules.principal_of_certificate(leaf)?.into()))
}

#[allow(clippy::too_many_arguments)]
async fn serve_stream<R: AsyncRead + Unpin>(
    ctx: Arc<Ctx>,
    listener: usize,
    read_half: R,
    write_half: ResponseSink,
    peer: SocketAddr,
    principal: Option<Arc<str>>,
    shutdown: watch::Receiver<bool>,
) {
    let connection = NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed);
    let queued = ctx.broker.config.queued_requests_per_connection;
    let (request_tx, request_rx) = mpsc::channel::<Bytes>(queued);
    let (response_tx, response_rx) = mpsc::channel::<Reply>(queued);
    let in_flight = InFlight { count: AtomicUsize::new(0), ctx: ctx.clone() };
    // On a SASL listener, nothing but the SASL requests is served until this is set.
    let authenticated = AtomicBool::new(!ctx.listener(listener).security.protocol.uses_sasl());

    // The three run concurrently on this task. When the processor stops (protocol error), the
    // reader's channel closes; when the reader stops (EOF, shutdown), the processor drains what
    // was read and the writer sends what was answered, then the socket closes.
    let process_shutdown = shutdown.clone();
    tokio::join!(
        read_requests(&ctx, listener, read_half, request_tx, &in_flight, peer, shutdown, &authenticated),
        process_requests(
            &ctx,
            listener,
            request_rx,
            response_tx,
            &in_flight,
            peer,
            principal,
            connection,
            &authenticated,
            process_shutdown,
        ),
        write_responses(&ctx, write_half, response_rx, &in_flight, peer),
    );
    // A share consumer gone without closing its share sessions: what it held is released now.
    crate::handlers::share_fetch::connection_closed(&ctx, connection).await;
}

/// Reads frames ahead into `requests` until EOF, a bad frame, shutdown, or an idle period with
/// nothing in flight.
#[allow(clippy::too_many_arguments)]
async fn read_requests<R: AsyncRead + Unpin>(
    ctx: &Ctx,
    listener: usize,
    read_half: R,
    requests: mpsc::Sender<Bytes>,
    in_flight: &InFlight,
    peer: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
    authenticated: &AtomicBool,
) {
    let security = &ctx.listener(listener).security;
    let idle = Duration::from_millis(ctx.broker.config.connections_max_idle_ms);
    // A client that has not authenticated by then is cut off.
    let must_authenticate_by = tokio::time::Instant::now() + Duration::from_millis(security.max_unauthenticated_ms);
    // Armed until the first authentication only: a session that expires later (KIP-368) is
    // the processor's to end, and a client re-authenticating late is not cut off here.
    let mut must_authenticate = !authenticated.load(Ordering::Acquire);
    let mut reader = BufReader::with_capacity(64 * 1024, read_half);
    loop {
        if authenticated.load(Ordering::Acquire) {
            must_authenticate = false;
        }
        // Before authentication a frame may be a SASL token at most (Kafka's
        // sasl.server.max.receive.size), so an unauthenticated client cannot make the broker
        // buffer 100 MiB.
        let max_frame = if authenticated.load(Ordering::Acquire) {
            ctx.broker.config.socket_request_max_bytes
        } else {
            security.sasl_max_receive_size
        };
        // The read of one frame lives across idle ticks: cancelling it when the timer
        // fires would drop the bytes of a partly read frame and desynchronize the stream
        // (a long poll in flight keeps the connection open while the next request is
        // still arriving).
        let frame = {
            let read = frame::read_frame(&mut reader, max_frame);
            tokio::pin!(read);
            loop {
                tokio::select! {
                    frame = &mut read => break frame,
                    _ = tokio::time::sleep(idle) => {
                        if in_flight.count.load(Ordering::Acquire) == 0 {
                            tracing::info!(%peer, idle_ms = idle.as_millis() as u64, "closing idle connection");
                            return;
                        }
                    }
                    _ = shutdown.changed() => return,
                    // The processor stopped (a protocol error, a failed authentication).
                    _ = requests.closed() => return,
                    _ = tokio::time::sleep_until(must_authenticate_by), if must_authenticate => {
                        // (Authenticated while this read was waiting for the next frame.)
                        if authenticated.load(Ordering::Acquire) {
                            must_authenticate = false;
                            continue;
                        }
                        ctx.metrics.connections.authentication_failures.inc();
                        tracing::info!(%peer, "closing a connection that did not authenticate in connections.max.unauthenticated.ms");
                        return;
                    }
                }
            }
        };
        match frame {
            Ok(Some(frame)) => {
                in_flight.add();
                if requests.send(frame).await.is_err() {
                    return;
                }
            }
            Ok(None) => return,
            Err(FrameError::Io(e)) => {
                tracing::debug!(%peer, error = %e, "connection read failed");
                return;
            }
            Err(e) => {
                tracing::warn!(%peer, error = %e, "closing connection");
                return;
            }
        }
    }
}

/// Handles the requests one at a time, in arrival order, and passes the replies on in the same
/// order; stops at the first error that closes the connection. On a SASL listener, the SASL
/// requests come first (`sasl`).
#[allow(clippy::too_many_arguments)]
async fn process_requests(
    ctx: &Ctx,
    listener: usize,
    mut requests: mpsc::Receiver<Bytes>,
    replies: mpsc::Sender<Reply>,
    in_flight: &InFlight,
    peer: SocketAddr,
    principal: Option<Arc<str>>,
    connection: u64,
    authenticated: &AtomicBool,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut client = Peer::new(peer.ip().to_string(), connection, listener);
    if let Some(principal) = principal {
        client.principal = principal;
    }
    let mut sasl = ctx.listener(listener).security.protocol.uses_sasl().then(|| Authentication::new(listener));
    while let Some(frame) = requests.recv().await {
        let handled = match sasl.as_mut() {
            None => dispatch::handle(ctx, &client, frame).await,
            Some(auth) => {
                let result = authenticate(ctx, auth, frame, peer).await;
                authenticated.store(auth.is_authenticated(), Ordering::Release);
                if client.user.as_deref() != auth.user() {
                    client.set_user(auth.user());
                }
                match result {
                    Gate::Pass(frame) => dispatch::handle(ctx, &client, frame).await,
                    Gate::Answer(outcome) => {
                        let (frame, close) = match outcome {
                            Outcome::Reply(frame) => (frame, false),
                            Outcome::Close(frame) => (frame, true),
                        };
                        let reply = if frame.chunks.is_empty() { Reply::Now(None) } else { Reply::Now(Some(frame)) };
                        if matches!(reply, Reply::Now(None)) {
                            in_flight.done();
                        } else if replies.send(reply).await.is_err() {
                            return;
                        }
                        if close {
                            return;
                        }
                        continue;
                    }
                    Gate::Close(reason) => {
                        tracing::info!(%peer, reason, "closing connection");
                        return;
                    }
                }
            }
        };
        let (reply, throttle) = match handled {
            Ok(handled) => (handled.reply, handled.throttle),
            Err(e) => {
                tracing::warn!(%peer, error = %e, "closing connection");
                return;
            }
        };
        // Over a quota: a client that waits on its own gets its response now and the
        // connection is muted (nothing more is handled) for the throttle time; an older one
        // gets its response only once that time has passed (KIP-219).
        let hold = throttle.filter(|t| !t.client_waits).map(|t| t.delay);
        if let Some(delay) = hold {
            wait_out(delay, &mut shutdown).await;
        }
        match reply {
            Reply::Now(None) => in_flight.done(),
            reply => {
                if replies.send(reply).await.is_err() {
                    return;
                }
            }
        }
        if let Some(throttle) = throttle.filter(|t| t.client_waits) {
            wait_out(throttle.delay, &mut shutdown).await;
        }
    }
}

/// Waits out a client's throttle, or until the broker shuts down (a byte-rate wait can be long,
/// and shutting down must not wait for it).
async fn wait_out(delay: Duration, shutdown: &mut watch::Receiver<bool>) {
    if *shutdown.borrow() {
        return;
    }
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = shutdown.changed() => {}
    }
}

/// What the SASL gate does with a frame.
enum Gate {
    /// Authenticated (or ApiVersions): handle it as usual.
    Pass(Bytes),
    /// A SASL request, answered here.
    Answer(Outcome),
    /// Anything else before authentication, or after the session expired.
    Close(&'static str),
}

async fn authenticate(ctx: &Ctx, auth: &mut Authentication, frame: Bytes, peer: SocketAddr) -> Gate {
    if auth.expects_raw_token() {
        return Gate::Answer(auth.raw_token(ctx, peer.ip(), frame).await);
    }
    let Ok(prefix) = frame::peek_prefix(&frame) else {
        return Gate::Close("a frame too short for a request header");
    };
    let api_key = ApiKey::try_from(prefix.api_key).ok();
    let version = prefix.version;
    match api_key {
        Some(key @ (ApiKey::SaslHandshake | ApiKey::SaslAuthenticate)) => {
            let Some(range) = crate::versions::supported(key) else {
                return Gate::Close("SASL API not supported");
            };
            if version < range.min || version > range.max {
                return Gate::Close("unsupported version of a SASL API");
            }
            let mut body = frame;
            let peer_host = crate::context::Peer::new(peer.ip().to_string(), 0, 0);
            let Ok((_, correlation_id)) = dispatch::decode_header(&mut body, &prefix, key, &peer_host) else {
                return Gate::Close("a malformed SASL request header");
            };
            let outcome = if key == ApiKey::SaslHandshake {
                auth.restart();
                match frame::decode_body::<kafka_protocol::messages::SaslHandshakeRequest>(&mut body, key, version) {
                    Ok(request) => auth.handshake(ctx, version, correlation_id, request).await,
                    Err(_) => return Gate::Close("a malformed SaslHandshake request"),
                }
            } else {
                match frame::decode_body::<kafka_protocol::messages::SaslAuthenticateRequest>(&mut body, key, version) {
                    Ok(request) => auth.authenticate(ctx, peer.ip(), version, correlation_id, request).await,
                    Err(_) => return Gate::Close("a malformed SaslAuthenticate request"),
                }
            };
            match outcome {
                Ok(outcome) => Gate::Answer(outcome),
                Err(_) => Gate::Close("cannot encode a SASL response"),
            }
        }
        Some(ApiKey::ApiVersions) => Gate::Pass(frame),
        _ if auth.is_authenticated() => Gate::Pass(frame),
        _ if auth.user().is_some() => Gate::Close("the SASL session expired (connections.max.reauth.ms)"),
        _ => Gate::Close("a request before SASL authentication"),
    }
}

/// Writes the replies in order, awaiting a produce's fsync before its response and the ones
/// after it.
async fn write_responses(
    ctx: &Ctx,
    mut write_half: ResponseSink,
    mut replies: mpsc::Receiver<Reply>,
    in_flight: &InFlight,
    peer: SocketAddr,
) {
    let use_sendfile = ctx.broker.config.fetch_sendfile;
    while let Some(reply) = replies.recv().await {
        let response = match reply {
            Reply::Now(response) => response,
            Reply::Later(deferred) => match deferred.await {
                Ok(response) => response,
                Err(e) => {
                    // Closing the connection: the requests after this one are dropped
                    // unanswered, as when the processor stops.
                    tracing::warn!(%peer, error = %e, "closing connection");
                    in_flight.done();
                    return;
                }
            },
        };
        let Some(response) = response else {
            in_flight.done();
            continue;
        };
        let result = zero_copy::write_response(&mut write_half, response, use_sendfile).await;
        in_flight.done();
        if let Err(e) = result {
            tracing::debug!(%peer, error = %e, "connection write failed");
            return;
        }
    }
}

/// Requests read from one connection but not yet answered (or dropped, for acks=0): a connection
/// with one is not idle. Mirrored in the broker's `requests_in_flight` gauge; whatever is left
/// when the connection ends (requests read but never answered) is taken off the gauge on drop.
struct InFlight {
    count: AtomicUsize,
    ctx: Arc<Ctx>,
}

impl InFlight {
    fn add(&self) {
        self.count.fetch_add(1, Ordering::AcqRel);
        self.ctx.metrics.connections.requests_in_flight.inc();
    }

    fn done(&self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
        self.ctx.metrics.connections.requests_in_flight.dec();
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let left = self.count.load(Ordering::Acquire);
        self.ctx.metrics.connections.requests_in_flight.add(-(left as i64));
    }
}
