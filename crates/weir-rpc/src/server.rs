//! The server side: [`serve`] accepts connections (at most `max_connections`) and answers each
//! request with the [`Handler`].
//!
//! A connection is two halves joined in one task: the reader admits a request only once it has
//! one of the connection's `max_in_flight_per_connection` slots, and runs it as a task of its
//! own; the writer writes answers as they come, in any order, and gives the slot back once the
//! answer is written. A client that sends and never reads therefore stops being read (its TCP
//! window closes), and no more than the limit of its requests and answers are held in memory.
//! The writer gives up on a frame not written within `write_timeout`, and closes the connection.
//!
//! A frame that breaks the format is answered with an error frame (with its correlation id when
//! the header could be read) and closes that connection only: the socket's input is then read
//! and dropped for up to [`LINGER`] so that the peer gets the error before a reset.
//!
//! With [`ServerTls`], a connection's task first runs the TLS handshake (holding the
//! connection's slot, within `handshake_timeout`, given up when shutdown begins) and asks
//! `admit` about the peer; then the two halves are those of the TLS stream (`tokio::io::split`)
//! instead of the socket's own (`TcpStream::into_split`), and everything else is the same code,
//! generic over the stream. Plain TCP pays nothing for TLS being possible.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::error::RemoteError;
use crate::frame::{self, ErrorCode, Frame, Kind, OutFrame, ReadError, CONNECTION_ID, DEFAULT_MAX_FRAME_BYTES};

/// A future that can be sent between threads, as [`Handler::handle`] returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Answers requests. One handler serves every connection; its futures run concurrently (up to
/// `max_in_flight_per_connection` per connection), each as its own task.
///
/// `handle` itself should return at once: the work belongs in the future. A future that panics
/// is answered with an error, as is one still running when the server's shutdown grace ends.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, method: &str, body: Bytes) -> BoxFuture<'static, Result<Bytes, RemoteError>>;
}

/// How long a closing connection's input is read and dropped, so that the error frame sent
/// before closing is not lost to a TCP reset: Linux resets a connection closed with unread
/// input, and the peer may then lose what it had not read yet. One second is many round trips
/// on the networks a cluster runs on.
pub(crate) const LINGER: Duration = Duration::from_secs(1);

/// TLS connections refused at once for `max_connections`. Over TLS a refusal takes a handshake
/// before its error frame can be read; these few are enough to tell the clients that come while
/// the server is full why, and bound what such clients can make it do. Past them, a connection
/// is closed without a word (its client's handshake fails: unreachable either way).
const TLS_REFUSALS_AT_ONCE: usize = 16;

/// Who checks a [`ServerTls`] peer once its handshake is done: given the certificate chain it
/// presented (`None` without one), an `Err` refuses the connection with that message.
pub type Admit = Arc<dyn Fn(Option<&[CertificateDer<'static>]>) -> Result<(), String> + Send + Sync>;

/// TLS on a server's connections ([`ServerConfig::tls`]): what to present and whom to accept.
///
/// The client's certificate, if any, is checked by the acceptor's rustls configuration (its
/// client verifier) during the handshake; `admit` then decides, on the chain that passed, whether
/// this peer may use the server at all.
#[derive(Clone)]
pub struct ServerTls {
    /// Called for each accepted connection, so that a reloaded certificate is used from the next
    /// connection on.
    pub acceptor: Arc<dyn Fn() -> TlsAcceptor + Send + Sync>,
    /// Checks the peer once its handshake is done, with the certificate chain it presented
    /// (None without one). An Err refuses the connection with that message: the peer gets a
    /// "refused" error frame (0x84) over TLS, and the connection closes.
    pub admit: Option<Admit>,
    /// The longest a handshake may take; a connection still handshaking then is dropped.
    pub handshake_timeout: Duration,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls")
            .field("acceptor", &"Fn() -> TlsAcceptor")
            .field("admit", &self.admit.as_ref().map(|_| "Fn(peer certificates) -> Result<(), String>"))
            .field("handshake_timeout", &self.handshake_timeout)
            .finish()
    }
}

/// Limits of a server. Every one of them is a bound on memory or tasks a peer can make it use.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The largest frame read or written (its length field). A larger request is refused with
    /// an error frame and its connection closed; a larger response becomes an error frame.
    pub max_frame_bytes: u32,
    /// Connections open at once; one more is refused with an error frame and closed.
    pub max_connections: usize,
    /// Requests of one connection being handled or answered at once; the next one is read
    /// when a slot frees up.
    pub max_in_flight_per_connection: usize,
    /// The longest one frame may take to write before the connection is given up as stuck.
    pub write_timeout: Duration,
    /// After shutdown begins, how long requests already read may take before they are cut off.
    pub shutdown_grace: Duration,
    /// TLS on every connection; `None` serves plain TCP.
    pub tls: Option<ServerTls>,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            // A cluster has tens of nodes, each with one connection to a peer per client.
            max_connections: 1024,
            max_in_flight_per_connection: 128,
            // 16 MiB in 10 s is 1.6 MB/s: slower than that, the peer is stuck, not slow.
            write_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(5),
            tls: None,
        }
    }
}

impl ServerConfig {
    fn check(&self) {
        frame::check_max_frame_bytes(self.max_frame_bytes);
        assert!(self.max_connections > 0, "max_connections must be positive");
        assert!(self.max_in_flight_per_connection > 0, "max_in_flight_per_connection must be positive");
        if let Some(tls) = &self.tls {
            assert!(!tls.handshake_timeout.is_zero(), "the TLS handshake_timeout must be positive");
        }
    }
}

/// Where a server is in its life; connections watch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    Serving,
    /// Shutdown has begun: read no more, finish what was read.
    Draining,
    /// The grace is over: abort the handlers still running (each is answered with an error).
    CuttingOff,
}

/// Serves `listener` until `shutdown` completes. Then it stops accepting and reading, lets the
/// requests already read finish and be answered (up to `shutdown_grace`; those still running
/// then are answered with an error), tells each client the server is shutting down, closes
/// every connection and returns. A connection whose last frames cannot be written within
/// `write_timeout` after that is dropped as it is.
///
/// With `config.tls`, each connection's TLS handshake runs in that connection's own task (never
/// in the accept loop), holding its slot of `max_connections`.
///
/// # Panics
/// If `config` is unusable (a zero limit, `max_frame_bytes` below `frame::MIN_MAX_FRAME_BYTES`).
pub async fn serve(
    listener: TcpListener,
    handler: Arc<dyn Handler>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) {
    config.check();
    let config = Arc::new(config);
    let slots = Arc::new(Semaphore::new(config.max_connections));
    let (stage_tx, stage_rx) = watch::channel(Stage::Serving);
    let mut connections = JoinSet::new();
    // TLS refusals (see TLS_REFUSALS_AT_ONCE); dropped, so aborted, when this function returns.
    let tls_refusal_slots = Arc::new(Semaphore::new(TLS_REFUSALS_AT_ONCE));
    let mut tls_refusals = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            (stream, peer) = accept(&listener) => {
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    tracing::warn!(%peer, max_connections = config.max_connections, "rpc: refusing a connection");
                    let message = format!("the server has its max_connections={} open", config.max_connections);
                    match &config.tls {
                        None => refuse(&stream, &message),
                        Some(tls) => {
                            while tls_refusals.try_join_next().is_some() {}
                            if let Ok(refusal_slot) = tls_refusal_slots.clone().try_acquire_owned() {
                                let (tls, write_timeout) = (tls.clone(), config.write_timeout);
                                tls_refusals.spawn(async move {
                                    refuse_tls(stream, peer, &tls, &message, write_timeout).await;
                                    drop(refusal_slot);
                                });
                            }
                        }
                    }
                    continue;
                };
                let (handler, config, stage) = (handler.clone(), config.clone(), stage_rx.clone());
                connections.spawn(async move {
                    serve_connection(stream, peer, handler, &config, stage).await;
                    drop(slot);
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    tracing::debug!(connections = connections.len(), "rpc: shutting down");
    stage_tx.send_replace(Stage::Draining);
    if drain(&mut connections, config.shutdown_grace).await {
        return;
    }
    tracing::warn!(connections = connections.len(), "rpc: cutting off requests still running after the shutdown grace");
    stage_tx.send_replace(Stage::CuttingOff);
    if drain(&mut connections, config.write_timeout).await {
        return;
    }
    tracing::warn!(connections = connections.len(), "rpc: dropping connections that cannot write their last frames");
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}

/// Whether every connection ended within `limit`.
async fn drain(connections: &mut JoinSet<()>, limit: Duration) -> bool {
    tokio::time::timeout(limit, async { while connections.join_next().await.is_some() {} }).await.is_ok()
}

/// The next connection. Failures (out of file descriptors and the like) are waited out
/// instead of spun on, as they pass once connections close.
async fn accept(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(accepted) => return accepted,
            Err(e) => {
                tracing::warn!(error = %e, "rpc: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Tells a plain TCP connection it will not be served, without waiting: the frame is small
/// enough for any fresh socket's buffer, and if even that fails, the close says enough.
fn refuse(stream: &TcpStream, message: &str) {
    let frame = OutFrame::error(CONNECTION_ID, ErrorCode::Refused, message).to_bytes();
    let _ = stream.try_write(&frame);
}

/// Tells a TLS connection it will not be served: its bytes must be TLS records, so this takes
/// the handshake first (within `handshake_timeout`), then [`refuse_and_close`].
async fn refuse_tls(stream: TcpStream, peer: SocketAddr, tls: &ServerTls, message: &str, write_timeout: Duration) {
    let Some(stream) = handshake(stream, peer, tls).await else { return };
    refuse_and_close(stream, message, write_timeout).await;
}

/// Writes the "refused" error frame, closes the sending side (with TLS's close_notify first)
/// and reads what the peer still sends for up to [`LINGER`], so that the frame is not lost to a
/// TCP reset. Within `write_timeout`, like any frame.
async fn refuse_and_close<S: AsyncRead + AsyncWrite + Unpin + Send>(
    mut stream: S,
    message: &str,
    write_timeout: Duration,
) {
    let frame = OutFrame::error(CONNECTION_ID, ErrorCode::Refused, message).to_bytes();
    let written = write_within(write_timeout, async {
        stream.write_all(&frame).await?;
        stream.flush().await?;
        stream.shutdown().await
    })
    .await;
    if written.is_ok() {
        linger(stream).await;
    }
}

/// The TLS handshake of an accepted connection, within `handshake_timeout`; `None` (logged at
/// debug) if it failed or took too long, and the connection is to be dropped.
async fn handshake(stream: TcpStream, peer: SocketAddr, tls: &ServerTls) -> Option<TlsStream<TcpStream>> {
    let acceptor = (tls.acceptor)();
    match tokio::time::timeout(tls.handshake_timeout, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "rpc: TLS handshake failed; dropping the connection");
            None
        }
        Err(_) => {
            let timeout = tls.handshake_timeout;
            tracing::debug!(%peer, ?timeout, "rpc: no TLS handshake within handshake_timeout; dropping the connection");
            None
        }
    }
}

/// How a connection's reading ended.
enum ReadEnd {
    /// The client closed its side (or the socket broke): answer what is in flight, then close.
    Closed,
    /// The server is shutting down: the same, then say so.
    Stopped,
    /// The client broke the format; an error frame is queued. Close, lingering.
    Fatal,
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    handler: Arc<dyn Handler>,
    config: &ServerConfig,
    mut stage: watch::Receiver<Stage>,
) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "rpc: cannot set TCP_NODELAY");
    }
    match &config.tls {
        None => {
            tracing::debug!(%peer, "rpc: connection accepted");
            let (read, write) = stream.into_split();
            serve_halves(read, write, peer, handler, config, stage).await;
        }
        Some(tls) => {
            // Nothing was read from a connection still handshaking: shutdown drops it at once.
            let stream = tokio::select! {
                stream = handshake(stream, peer, tls) => stream,
                _ = stage.wait_for(|stage| *stage >= Stage::Draining) => None,
            };
            let Some(stream) = stream else { return };
            if let Some(admit) = &tls.admit {
                if let Err(message) = admit(stream.get_ref().1.peer_certificates()) {
                    tracing::warn!(%peer, "rpc: refusing a TLS connection: {message}");
                    refuse_and_close(stream, &message, config.write_timeout).await;
                    return;
                }
            }
            tracing::debug!(%peer, "rpc: TLS connection accepted");
            let (read, write) = tokio::io::split(stream);
            serve_halves(read, write, peer, handler, config, stage).await;
        }
    }
    tracing::debug!(%peer, "rpc: connection closed");
}

/// Serves a connection, plain or TLS, through its two halves.
async fn serve_halves<R, W>(
    read: R,
    write: W,
    peer: SocketAddr,
    handler: Arc<dyn Handler>,
    config: &ServerConfig,
    mut stage: watch::Receiver<Stage>,
) where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send,
{
    let mut read = BufReader::new(read);
    // Every queued frame but the last, connection-level one holds an in-flight slot, so this
    // channel never fills: answers never wait for room in it.
    let (out_tx, out_rx) = mpsc::channel(config.max_in_flight_per_connection + 1);
    let end = {
        let reader = read_requests(&mut read, out_tx, peer, handler, config, &mut stage);
        let writer = write_frames(write, out_rx, peer, config.write_timeout);
        tokio::pin!(reader, writer);
        tokio::select! {
            end = &mut reader => {
                // The reader has dropped its sender and waited for its requests: the writer
                // ends once their answers are written.
                writer.await;
                Some(end)
            }
            // The writer failed; dropping the reader drops (aborts) its requests.
            () = &mut writer => None,
        }
    };
    if let Some(ReadEnd::Fatal) = end {
        linger(read.into_inner()).await;
    }
}

async fn read_requests<R: AsyncRead + Unpin + Send>(
    read: &mut BufReader<R>,
    out: mpsc::Sender<OutFrame>,
    peer: SocketAddr,
    handler: Arc<dyn Handler>,
    config: &ServerConfig,
    stage: &mut watch::Receiver<Stage>,
) -> ReadEnd {
    let slots = Arc::new(Semaphore::new(config.max_in_flight_per_connection));
    let max = config.max_frame_bytes;
    let mut requests = JoinSet::new();
    let fatal = |out: &mpsc::Sender<OutFrame>, correlation_id: u64, code: ErrorCode, message: &str| {
        tracing::warn!(%peer, "rpc: closing the connection: {message}");
        let _ = out.try_send(OutFrame::error(correlation_id, code, message));
        ReadEnd::Fatal
    };
    let end = loop {
        while requests.try_join_next().is_some() {}
        // A slot before the frame, so that at most the limit of requests are read ahead.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot,
            _ = stage.wait_for(|stage| *stage >= Stage::Draining) => break ReadEnd::Stopped,
        };
        let Ok(slot) = slot else { break ReadEnd::Stopped }; // never closed
        let next = tokio::select! {
            next = frame::read_frame(read, max) => next,
            _ = stage.wait_for(|stage| *stage >= Stage::Draining) => break ReadEnd::Stopped,
        };
        match next {
            Ok(Frame { header, method, body }) if header.kind == Kind::Request => {
                let Ok(method) = String::from_utf8(method.to_vec()) else {
                    let message = "the method name is not UTF-8";
                    break fatal(&out, header.correlation_id, ErrorCode::Malformed, message);
                };
                let reply =
                    Reply { out: out.clone(), correlation_id: header.correlation_id, method, slot: Some(slot), max };
                let handler = handler.clone();
                requests.spawn(async move {
                    let answer = handler.handle(&reply.method, body).await;
                    reply.send(answer);
                });
            }
            Ok(Frame { header, .. }) => {
                let message = format!("a server takes requests only, not a {:?} frame", header.kind);
                break fatal(&out, header.correlation_id, ErrorCode::Malformed, &message);
            }
            Err(ReadError::Closed) => break ReadEnd::Closed,
            Err(e @ (ReadError::Truncated | ReadError::Io(_))) => {
                tracing::debug!(%peer, error = %e, "rpc: connection ended");
                break ReadEnd::Closed;
            }
            Err(ReadError::TooLarge { header, length, max }) => {
                let message = format!("a request frame of {length} bytes exceeds the server's limit of {max} bytes");
                break fatal(&out, header.correlation_id, ErrorCode::RequestTooLarge, &message);
            }
            Err(e @ (ReadError::UnsupportedVersion(_) | ReadError::Tls)) => {
                break fatal(&out, CONNECTION_ID, ErrorCode::UnsupportedVersion, &e.to_string());
            }
            Err(ReadError::Malformed { correlation_id, reason }) => {
                let message = format!("malformed frame: {reason}");
                break fatal(&out, correlation_id.unwrap_or(CONNECTION_ID), ErrorCode::Malformed, &message);
            }
        }
    };
    match end {
        // Their answers would follow an error frame the client may already have acted on.
        ReadEnd::Fatal => requests.abort_all(),
        ReadEnd::Closed | ReadEnd::Stopped => {
            let finished = async { while requests.join_next().await.is_some() {} };
            tokio::select! {
                () = finished => {}
                // Aborted, each one's `Reply` queues an error frame for the writer.
                _ = stage.wait_for(|stage| *stage == Stage::CuttingOff) => requests.abort_all(),
            }
        }
    }
    while requests.join_next().await.is_some() {}
    if let ReadEnd::Stopped = end {
        let _ = out.try_send(OutFrame::error(CONNECTION_ID, ErrorCode::Refused, "the server is shutting down"));
    }
    end
}

/// The answer to one request, owed until sent: dropped unsent (the handler panicked, or was
/// aborted at shutdown) it answers with an error, so the caller learns of it at once.
struct Reply {
    out: mpsc::Sender<OutFrame>,
    correlation_id: u64,
    method: String,
    /// `Some` until the answer is queued; it then travels with the frame to the writer.
    slot: Option<OwnedSemaphorePermit>,
    max: u32,
}

impl Reply {
    fn send(mut self, answer: Result<Bytes, RemoteError>) {
        let frame = match answer {
            Ok(body) => OutFrame::response(self.correlation_id, body, self.max).unwrap_or_else(|too_large| {
                let message = format!(
                    "the response to {} of {} bytes exceeds the server's frame limit of {} bytes",
                    self.method, too_large.length, too_large.max
                );
                OutFrame::error(self.correlation_id, ErrorCode::ResponseTooLarge, &message)
            }),
            Err(e) => OutFrame::error(self.correlation_id, ErrorCode::Handler, e.message()),
        };
        self.queue(frame);
    }

    fn queue(&mut self, mut frame: OutFrame) {
        frame.permit = self.slot.take();
        // Full cannot happen (see the channel's capacity); closed means the writer is gone.
        let _ = self.out.try_send(frame);
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if self.slot.is_some() {
            let message =
                format!("the handler of {} ended without an answer (it panicked, or was cut off)", self.method);
            self.queue(OutFrame::error(self.correlation_id, ErrorCode::Handler, &message));
        }
    }
}

/// Writes frames until every sender is gone, then flushes and shuts the write side down.
async fn write_frames<W: AsyncWrite + Unpin + Send>(
    write: W,
    mut frames: mpsc::Receiver<OutFrame>,
    peer: SocketAddr,
    timeout: Duration,
) {
    let mut writer = BufWriter::new(write);
    let result: std::io::Result<()> = async {
        while let Some(frame) = frames.recv().await {
            write_within(timeout, frame::write_frame(&mut writer, &frame)).await?;
            drop(frame); // frees its in-flight slot
            if frames.is_empty() {
                write_within(timeout, writer.flush()).await?;
            }
        }
        write_within(timeout, writer.flush()).await?;
        write_within(timeout, writer.shutdown()).await
    }
    .await;
    match result {
        Ok(()) => {}
        // A client that stopped reading: worth knowing about.
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => tracing::warn!(%peer, "rpc: closing the connection: {e}"),
        // A client that went away: its unanswered calls are its own to report.
        Err(e) => tracing::debug!(%peer, "rpc: closing the connection: write failed: {e}"),
    }
}

async fn write_within(timeout: Duration, write: impl Future<Output = std::io::Result<()>>) -> std::io::Result<()> {
    tokio::time::timeout(timeout, write).await.unwrap_or_else(|_| {
        let message = format!("a frame was not written within write_timeout={timeout:?}");
        Err(std::io::Error::new(std::io::ErrorKind::TimedOut, message))
    })
}

/// Reads and drops what the peer still sends, until it closes or [`LINGER`] passes. Over TLS
/// this reads through the TLS stream, which is what keeps the socket's input drained.
async fn linger<R: AsyncRead + Unpin + Send>(mut read: R) {
    let mut scratch = [0u8; 8 * 1024];
    let _ = tokio::time::timeout(LINGER, async { while matches!(read.read(&mut scratch).await, Ok(1..)) {} }).await;
}
