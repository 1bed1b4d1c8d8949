//! The client side: [`RpcClient`] keeps one connection per peer, made on the first call and
//! again on the first call after it broke, and multiplexes every call to that peer over it.
//!
//! Concurrency contract: nothing is locked across I/O but one peer's own connection slot
//! (while connecting to that peer, so that concurrent calls share one attempt). The map of
//! peers is locked only to look one up. Calls to a peer that accepts and never answers wait on
//! that peer's connection, slots and answers only; calls to other peers never meet them.
//!
//! A connection is a writer task and a reader task around a table of pending calls. Cancelling
//! a call (its timeout, or the caller dropping it) removes it from the table; its request is
//! then not written if it is still queued, and its answer, if one comes, is dropped. When
//! either task finds the connection broken, every pending call fails at once with the reason.
//!
//! With [`ClientConfig::tls`], connecting includes the TLS handshake (in the peer's connect,
//! within `connect_timeout`), and the two tasks work on the halves of the TLS stream instead of
//! the socket's; they are the same code, generic over the stream.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use rustls::pki_types::ServerName;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsConnector;

use crate::error::{CallPhase, Failure, RpcError, RpcErrorKind};
use crate::frame::{self, ErrorCode, Frame, Kind, OutFrame, ReadError, CONNECTION_ID, DEFAULT_MAX_FRAME_BYTES};

/// Limits of a client, each per peer.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The largest frame written or read (its length field). A larger request fails before
    /// anything is sent; a larger response fails its call, and the connection goes on.
    pub max_frame_bytes: u32,
    /// The longest a connection attempt may take (within the call's own timeout).
    pub connect_timeout: Duration,
    /// Calls to one peer under way at once; the next call waits for a slot (within its
    /// timeout). This bounds the requests queued for a peer that does not read.
    pub max_in_flight_per_peer: usize,
    /// TLS on every connection; `None` connects in plain TCP. The server's certificate is
    /// checked for the peer's IP address (peers are socket addresses, not names) by whatever
    /// verifier this configuration has; its client certificate, if any, is presented.
    pub tls: Option<ClientTls>,
}

/// Gives the rustls configuration of each new connection, so that certificates rotated on
/// disk are used from the next connection on.
#[derive(Clone)]
pub struct ClientTls(Arc<dyn Fn() -> Arc<rustls::ClientConfig> + Send + Sync>);

impl ClientTls {
    /// The configuration `current` gives when a connection is made.
    pub fn new(current: impl Fn() -> Arc<rustls::ClientConfig> + Send + Sync + 'static) -> ClientTls {
        ClientTls(Arc::new(current))
    }

    /// Always `config`.
    pub fn fixed(config: Arc<rustls::ClientConfig>) -> ClientTls {
        ClientTls::new(move || config.clone())
    }

    fn current(&self) -> Arc<rustls::ClientConfig> {
        (self.0)()
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls(Fn() -> rustls::ClientConfig)")
    }
}

impl Default for ClientConfig {
    fn default() -> ClientConfig {
        ClientConfig {
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            // Long enough for a SYN lost once (Linux sends it again after 1 s), short enough
            // that a dead host is told from a slow one within a Raft election timeout or two.
            connect_timeout: Duration::from_secs(2),
            max_in_flight_per_peer: 128,
            tls: None,
        }
    }
}

/// Calls other nodes' RPC servers. Cheap to clone: clones share the connections.
#[derive(Clone)]
pub struct RpcClient {
    inner: Arc<Inner>,
}

struct Inner {
    config: ClientConfig,
    peers: Mutex<HashMap<SocketAddr, Arc<Peer>>>,
}

impl RpcClient {
    /// # Panics
    /// If `config` is unusable (no in-flight slot, a frame limit below
    /// `MIN_MAX_FRAME_BYTES`).
    pub fn new(config: ClientConfig) -> RpcClient {
        frame::check_max_frame_bytes(config.max_frame_bytes);
        assert!(config.max_in_flight_per_peer > 0, "max_in_flight_per_peer must be positive");
        RpcClient { inner: Arc::new(Inner { config, peers: Mutex::new(HashMap::new()) }) }
    }

    /// Sends `body` to `method` at `peer` and returns the answer. `timeout` covers everything:
    /// waiting for an in-flight slot, connecting, sending and the answer.
    pub async fn call(
        &self,
        peer: SocketAddr,
        method: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, RpcError> {
        let mut phase = CallPhase::WaitingForSlot;
        let result = tokio::time::timeout(timeout, self.call_within(peer, method, body, &mut phase)).await;
        match result {
            Ok(answer) => answer.map_err(|kind| RpcError::new(peer, method, kind)),
            Err(_) => Err(RpcError::new(peer, method, RpcErrorKind::Timeout { after: timeout, phase })),
        }
    }

    /// [`call`](RpcClient::call) with the request and the answer as JSON.
    pub async fn call_json<Req, Resp>(
        &self,
        peer: SocketAddr,
        method: &str,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, RpcError>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned,
    {
        let codec = |what, source| RpcError::new(peer, method, RpcErrorKind::Codec { what, source });
        let body = serde_json::to_vec(request).map_err(|e| codec("encode the request", e))?;
        let answer = self.call(peer, method, Bytes::from(body), timeout).await?;
        serde_json::from_slice(&answer).map_err(|e| codec("decode the response", e))
    }

    /// Closes the connection to `peer`, if there is one; its pending calls fail with
    /// [`RpcErrorKind::ConnectionLost`]. The next call connects again. For a caller that has
    /// reason to distrust a connection no error has shown to be broken.
    pub async fn disconnect(&self, peer: SocketAddr) {
        let Some(peer) = lock(&self.inner.peers).get(&peer).cloned() else { return };
        let connection = peer.connection.lock().await.take();
        if let Some(connection) = connection {
            connection.shared.close(Failure::Lost("disconnected by this client".into()));
        }
    }

    async fn call_within(
        &self,
        peer: SocketAddr,
        method: &str,
        body: Bytes,
        phase: &mut CallPhase,
    ) -> Result<Bytes, RpcErrorKind> {
        let config = &self.inner.config;
        if method.is_empty() || method.len() > usize::from(u16::MAX) {
            let message = format!("a method name is 1 to 65535 bytes long, not {}", method.len());
            return Err(RpcErrorKind::Protocol(message));
        }
        let length = (frame::HEADER_BYTES + method.len()) as u64 + body.len() as u64;
        if length > u64::from(config.max_frame_bytes) {
            let max = config.max_frame_bytes;
            let message = format!("the request of {length} bytes exceeds this client's frame limit of {max} bytes");
            return Err(RpcErrorKind::TooLarge(message));
        }
        let peer = self.peer(peer);
        *phase = CallPhase::WaitingForSlot;
        // The semaphore is never closed; this error cannot happen.
        let Ok(_slot) = peer.slots.acquire().await else {
            return Err(RpcErrorKind::ConnectionLost("the client is closing".into()));
        };
        // Sent again once at most, and only if the server cannot have read it: the connection
        // was found closed before the request was queued on it, or the server refused the
        // connection (it does so only after answering every request it read from it). Both
        // happen when the peer restarted while the connection was idle.
        let mut again = false;
        loop {
            *phase = CallPhase::Connecting;
            let connection = peer.connection(config).await?;
            *phase = CallPhase::Sending;
            let failure = match connection.send(method, body.clone(), config.max_frame_bytes).await {
                Ok(pending) => {
                    *phase = CallPhase::WaitingForAnswer;
                    match pending.answer().await {
                        Err(refused @ Failure::Refused(_)) => refused,
                        answer => return answer.map_err(RpcErrorKind::from),
                    }
                }
                Err(not_sent) => not_sent,
            };
            if again {
                return Err(failure.into());
            }
            tracing::debug!(peer = %peer.addr, method, ?failure, "rpc: the request was not read; sending it on a new connection");
            again = true;
        }
    }

    fn peer(&self, addr: SocketAddr) -> Arc<Peer> {
        let mut peers = lock(&self.inner.peers);
        let max_in_flight = self.inner.config.max_in_flight_per_peer;
        peers.entry(addr).or_insert_with(|| Arc::new(Peer::new(addr, max_in_flight))).clone()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while these locks are held; a poisoned one still holds consistent data.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the client keeps for one peer.
struct Peer {
    addr: SocketAddr,
    /// One per call under way to this peer, from before connecting until the answer.
    slots: Semaphore,
    /// The current connection. Locked to use it or, when there is none or it is closed, to
    /// make one (the only lock held across I/O: this peer's connect).
    connection: tokio::sync::Mutex<Option<Arc<Connection>>>,
}

impl Peer {
    fn new(addr: SocketAddr, max_in_flight: usize) -> Peer {
        Peer { addr, slots: Semaphore::new(max_in_flight), connection: tokio::sync::Mutex::new(None) }
    }

    async fn connection(&self, config: &ClientConfig) -> Result<Arc<Connection>, RpcErrorKind> {
        let mut current = self.connection.lock().await;
        if let Some(connection) = current.as_ref().filter(|c| !c.shared.is_closed()) {
            return Ok(connection.clone());
        }
        *current = None;
        // The TCP connect and the TLS handshake share the one connect timeout.
        let deadline = Instant::now() + config.connect_timeout;
        let stream = match tokio::time::timeout_at(deadline, TcpStream::connect(self.addr)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(RpcErrorKind::Unreachable(e.to_string())),
            Err(_) => {
                let message = format!("no connection within the connect timeout of {:?}", config.connect_timeout);
                return Err(RpcErrorKind::Unreachable(message));
            }
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(peer = %self.addr, error = %e, "rpc: cannot set TCP_NODELAY");
        }
        let connection = match &config.tls {
            None => {
                tracing::debug!(peer = %self.addr, "rpc: connected");
                let (read, write) = stream.into_split();
                Connection::open(read, write, self.addr, config)
            }
            Some(tls) => {
                let name = ServerName::IpAddress(self.addr.ip().into());
                let handshake = TlsConnector::from(tls.current()).connect(name, stream);
                let stream = match tokio::time::timeout_at(deadline, handshake).await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => {
                        let message = format!("TLS handshake with {} failed: {e}", self.addr);
                        return Err(RpcErrorKind::Unreachable(message));
                    }
                    Err(_) => {
                        let message = format!(
                            "no TLS handshake with {} within the connect timeout of {:?}",
                            self.addr, config.connect_timeout
                        );
                        return Err(RpcErrorKind::Unreachable(message));
                    }
                };
                tracing::debug!(peer = %self.addr, "rpc: connected over TLS");
                let (read, write) = tokio::io::split(stream);
                Connection::open(read, write, self.addr, config)
            }
        };
        let connection = Arc::new(connection);
        *current = Some(connection.clone());
        Ok(connection)
    }
}

/// One connection to a peer, plain or TLS. Dropping the last handle closes it.
struct Connection {
    /// To the writer task; room for one request per in-flight slot.
    requests: mpsc::Sender<OutFrame>,
    shared: Arc<Shared>,
    /// 1 and up: 0 is the connection's own id ([`CONNECTION_ID`]).
    next_correlation_id: AtomicU64,
}

impl Connection {
    fn open<R, W>(read: R, write: W, peer: SocketAddr, config: &ClientConfig) -> Connection
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let shared = Arc::new(Shared {
            peer,
            state: Mutex::new(State { pending: HashMap::new(), closed: None }),
            closed: watch::channel(false).0,
        });
        let (requests, queued) = mpsc::channel(config.max_in_flight_per_peer);
        tokio::spawn(read_answers(read, shared.clone(), config.max_frame_bytes));
        tokio::spawn(write_requests(write, queued, shared.clone()));
        Connection { requests, shared, next_correlation_id: AtomicU64::new(CONNECTION_ID + 1) }
    }

    /// Queues the request. An error means it was not sent: the connection was closed.
    async fn send(&self, method: &str, body: Bytes, max: u32) -> Result<PendingCall, Failure> {
        let correlation_id = self.next_correlation_id.fetch_add(1, Ordering::Relaxed);
        let request = OutFrame::request(correlation_id, method, body, max).map_err(|too_large| {
            Failure::TooLarge(format!("the request of {} bytes exceeds this client's frame limit", too_large.length))
        })?;
        let answer = self.shared.register(correlation_id)?;
        let pending = PendingCall { shared: self.shared.clone(), correlation_id, answer };
        if self.requests.send(request).await.is_err() {
            return Err(Failure::Lost("the connection's writer has stopped".into()));
        }
        Ok(pending)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.shared.close(Failure::Lost("the connection was dropped".into()));
    }
}

/// What a connection's two tasks and its callers share.
struct Shared {
    peer: SocketAddr,
    state: Mutex<State>,
    /// Becomes `true` once, when the connection closes: stops both tasks.
    closed: watch::Sender<bool>,
}

struct State {
    /// The calls waiting for an answer, by correlation id.
    pending: HashMap<u64, oneshot::Sender<Result<Bytes, Failure>>>,
    /// Why the connection closed; once set, `pending` stays empty.
    closed: Option<Failure>,
}

impl Shared {
    fn register(&self, correlation_id: u64) -> Result<oneshot::Receiver<Result<Bytes, Failure>>, Failure> {
        let mut state = lock(&self.state);
        if let Some(failure) = &state.closed {
            return Err(failure.clone());
        }
        let (tx, rx) = oneshot::channel();
        state.pending.insert(correlation_id, tx);
        Ok(rx)
    }

    fn is_pending(&self, correlation_id: u64) -> bool {
        lock(&self.state).pending.contains_key(&correlation_id)
    }

    fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    fn answer(&self, correlation_id: u64, answer: Result<Bytes, Failure>) {
        let waiter = lock(&self.state).pending.remove(&correlation_id);
        Shared::deliver(self.peer, correlation_id, waiter, answer);
    }

    /// An error frame after which the server closes the connection. The connection is closed
    /// here before the call learns of it, so that the caller's next call makes a new one.
    fn answer_and_close(&self, correlation_id: u64, answer: Failure, others: Failure) {
        let waiter = lock(&self.state).pending.remove(&correlation_id);
        self.close(others);
        Shared::deliver(self.peer, correlation_id, waiter, Err(answer));
    }

    fn deliver(
        peer: SocketAddr,
        correlation_id: u64,
        waiter: Option<oneshot::Sender<Result<Bytes, Failure>>>,
        answer: Result<Bytes, Failure>,
    ) {
        match waiter {
            Some(waiter) => {
                let _ = waiter.send(answer);
            }
            None => tracing::debug!(%peer, correlation_id, "rpc: an answer nobody waits for any more"),
        }
    }

    /// Fails every pending call with `failure` and stops the connection's tasks; the first
    /// reason given is the one kept.
    fn close(&self, failure: Failure) {
        let pending = {
            let mut state = lock(&self.state);
            if state.closed.is_some() {
                return;
            }
            state.closed = Some(failure.clone());
            std::mem::take(&mut state.pending)
        };
        match &failure {
            Failure::Protocol(reason) => {
                tracing::warn!(peer = %self.peer, failed_calls = pending.len(), "rpc: closing the connection: {reason}")
            }
            other => {
                tracing::debug!(peer = %self.peer, failed_calls = pending.len(), "rpc: connection closed: {other:?}")
            }
        }
        // Closed before any caller learns why, so that a caller retrying sees it closed.
        self.closed.send_replace(true);
        for waiter in pending.into_values() {
            let _ = waiter.send(Err(failure.clone()));
        }
    }
}

/// A call whose request is queued or sent. Dropping it (a timeout) forgets the call.
struct PendingCall {
    shared: Arc<Shared>,
    correlation_id: u64,
    answer: oneshot::Receiver<Result<Bytes, Failure>>,
}

impl PendingCall {
    async fn answer(mut self) -> Result<Bytes, Failure> {
        (&mut self.answer).await.unwrap_or_else(|_| Err(Failure::Lost("the connection's reader has stopped".into())))
    }
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        lock(&self.shared.state).pending.remove(&self.correlation_id);
    }
}

/// `work`, unless the connection closes first.
async fn unless_closed<T>(closed: &mut watch::Receiver<bool>, work: impl Future<Output = T>) -> Option<T> {
    tokio::select! {
        done = work => Some(done),
        _ = closed.wait_for(|closed| *closed) => None,
    }
}

async fn write_requests<W: AsyncWrite + Unpin + Send>(
    write: W,
    mut queued: mpsc::Receiver<OutFrame>,
    shared: Arc<Shared>,
) {
    let mut closed = shared.closed.subscribe();
    let mut writer = BufWriter::new(write);
    let failure = loop {
        let Some(Some(request)) = unless_closed(&mut closed, queued.recv()).await else { return };
        if !shared.is_pending(request.correlation_id) {
            continue; // its caller has given up
        }
        let write = async {
            frame::write_frame(&mut writer, &request).await?;
            if queued.is_empty() {
                writer.flush().await?;
            }
            Ok::<(), std::io::Error>(())
        };
        match unless_closed(&mut closed, write).await {
            None => return,
            Some(Ok(())) => {}
            Some(Err(e)) => break Failure::Lost(format!("write failed: {e}")),
        }
    };
    shared.close(failure);
}

async fn read_answers<R: AsyncRead + Unpin + Send>(read: R, shared: Arc<Shared>, max: u32) {
    let mut closed = shared.closed.subscribe();
    let mut reader = BufReader::new(read);
    let failure = loop {
        let Some(next) = unless_closed(&mut closed, frame::read_frame(&mut reader, max)).await else { return };
        match next {
            Ok(Frame { header, body, .. }) => match header.kind {
                Kind::Response => shared.answer(header.correlation_id, Ok(body)),
                Kind::Error => {
                    let (failure, closes) = error_failure(&body);
                    match (header.correlation_id, closes) {
                        (CONNECTION_ID, _) => break failure,
                        (correlation_id, false) => shared.answer(correlation_id, Err(failure)),
                        (correlation_id, true) => {
                            let others = match &failure {
                                Failure::Refused(_) => failure.clone(),
                                other => Failure::Lost(format!(
                                    "the server closed the connection after another call's error: {}",
                                    other.message()
                                )),
                            };
                            shared.answer_and_close(correlation_id, failure, others);
                            return;
                        }
                    }
                }
                Kind::Request => break Failure::Protocol("the server sent a request".into()),
            },
            Err(ReadError::TooLarge { header, length, max }) if header.kind != Kind::Request => {
                let message =
                    format!("the response of {length} bytes exceeds this client's frame limit of {max} bytes");
                shared.answer(header.correlation_id, Err(Failure::TooLarge(message)));
                match unless_closed(&mut closed, frame::skip(&mut reader, length)).await {
                    None => return,
                    Some(Ok(())) => {}
                    Some(Err(e)) => break Failure::Lost(e.to_string()),
                }
            }
            Err(e @ (ReadError::Closed | ReadError::Truncated | ReadError::Io(_))) => {
                break Failure::Lost(e.to_string())
            }
            Err(
                e @ (ReadError::TooLarge { .. }
                | ReadError::UnsupportedVersion(_)
                | ReadError::Tls
                | ReadError::Malformed { .. }),
            ) => break Failure::Protocol(e.to_string()),
        }
    };
    shared.close(failure);
}

/// What an error frame from the server means for its call (or, with id 0, for all of them),
/// and whether the server closes the connection after it.
fn error_failure(body: &[u8]) -> (Failure, bool) {
    let (code, byte, message) = frame::parse_error(body);
    let failure = match code {
        Some(ErrorCode::Handler) => Failure::Remote(message),
        Some(ErrorCode::ResponseTooLarge | ErrorCode::RequestTooLarge) => Failure::TooLarge(message),
        Some(ErrorCode::UnsupportedVersion | ErrorCode::Malformed) => {
            Failure::Protocol(format!("the server says: {message}"))
        }
        Some(ErrorCode::Refused) => Failure::Refused(format!("the server refused the connection: {message}")),
        // A code from a later version: its message is all this one can pass on.
        None => Failure::Remote(format!("{message} (error code {byte:#04x})")),
    };
    (failure, byte & frame::CLOSES_CONNECTION != 0)
}
