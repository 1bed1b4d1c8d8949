//! One client connection: a reader that reads frames ahead (bounded), a processor that handles
//! them one at a time in arrival order (Kafka's per-connection ordering: a producer's pipelined
//! batches are appended in the order sent), and a writer that sends responses in the same
//! order while the next request is being handled. A produce is handed to the writer once its
//! batches are written, with its fsync still to wait for (`Reply::Later`): the processor goes on
//! to the next request, and the writer awaits the fsync before writing that response and the
//! ones after it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::BufReader;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

use crate::context::{Ctx, Peer};
use crate::dispatch::{self, Reply};
use crate::frame::{self, FrameError};
use crate::zero_copy;

/// The number of the next connection (see [`Peer::connection`]).
static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

pub(crate) async fn serve_connection(
    ctx: Arc<Ctx>,
    stream: TcpStream,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let connection = NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed);
    let queued = ctx.broker.config.queued_requests_per_connection;
    let (read_half, write_half) = stream.into_split();
    let (request_tx, request_rx) = mpsc::channel::<Bytes>(queued);
    let (response_tx, response_rx) = mpsc::channel::<Reply>(queued);
    let in_flight = InFlight { count: AtomicUsize::new(0), ctx: ctx.clone() };

    // The three run concurrently on this task. When the processor stops (protocol error), the
    // reader's channel closes; when the reader stops (EOF, shutdown), the processor drains what
    // was read and the writer sends what was answered, then the socket closes.
    tokio::join!(
        read_requests(&ctx, read_half, request_tx, &in_flight, peer, shutdown),
        process_requests(&ctx, request_rx, response_tx, &in_flight, peer, connection),
        write_responses(&ctx, write_half, response_rx, &in_flight, peer),
    );
    // A share consumer gone without closing its share sessions: what it held is released now.
    crate::handlers::share_fetch::connection_closed(&ctx, connection).await;
}

/// Reads frames ahead into `requests` until EOF, a bad frame, shutdown, or an idle period with
/// nothing in flight.
async fn read_requests(
    ctx: &Ctx,
    read_half: OwnedReadHalf,
    requests: mpsc::Sender<Bytes>,
    in_flight: &InFlight,
    peer: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
) {
    let max_frame = ctx.broker.config.socket_request_max_bytes;
    let idle = Duration::from_millis(ctx.broker.config.connections_max_idle_ms);
    let mut reader = BufReader::with_capacity(64 * 1024, read_half);
    loop {
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
/// order; stops at the first error that closes the connection.
async fn process_requests(
    ctx: &Ctx,
    mut requests: mpsc::Receiver<Bytes>,
    replies: mpsc::Sender<Reply>,
    in_flight: &InFlight,
    peer: SocketAddr,
    connection: u64,
) {
    let client = Peer { host: peer.ip().to_string(), connection };
    while let Some(frame) = requests.recv().await {
        match dispatch::handle(ctx, &client, frame).await {
            Ok(Reply::Now(None)) => in_flight.done(),
            Ok(reply) => {
                if replies.send(reply).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(%peer, error = %e, "closing connection");
                return;
            }
        }
    }
}

/// Writes the replies in order, awaiting a produce's fsync before its response and the ones
/// after it.
async fn write_responses(
    ctx: &Ctx,
    mut write_half: OwnedWriteHalf,
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
