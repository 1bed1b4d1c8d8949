//! One client connection: a reader that reads frames ahead (bounded), a processor that handles
//! them one at a time in arrival order (Kafka's per-connection ordering: a producer's pipelined
//! batches are appended in the order sent), and a writer that sends responses in the same
//! order while the next request is being handled. A produce is handed to the writer once its
//! batches are written, with its fsync still to wait for (`Reply::Later`): the processor goes on
//! to the next request, and the writer awaits the fsync before writing that response and the
//! ones after it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::BufReader;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

use crate::context::Ctx;
use crate::dispatch::{self, Reply};
use crate::frame::{self, FrameError};
use crate::zero_copy;

pub async fn serve_connection(ctx: Arc<Ctx>, stream: TcpStream, peer: SocketAddr, mut shutdown: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let config = &ctx.broker.config;
    let max_frame = config.socket_request_max_bytes;
    let queued = config.queued_requests_per_connection;
    let idle = Duration::from_millis(config.connections_max_idle_ms);
    let use_sendfile = config.fetch_sendfile;
    let (read_half, mut write_half) = stream.into_split();
    let (request_tx, mut request_rx) = mpsc::channel::<Bytes>(queued);
    let (response_tx, mut response_rx) = mpsc::channel::<Reply>(queued);
    let in_flight = Arc::new(InFlight { count: AtomicUsize::new(0), ctx: ctx.clone() });

    let reader = {
        let in_flight = in_flight.clone();
        async move {
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
                        if request_tx.send(frame).await.is_err() {
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
    };

    let processor = {
        let ctx = ctx.clone();
        let in_flight = in_flight.clone();
        async move {
            let host = peer.ip().to_string();
            while let Some(frame) = request_rx.recv().await {
                match dispatch::handle(&ctx, &host, frame).await {
                    Ok(Reply::Now(None)) => in_flight.done(),
                    Ok(reply) => {
                        if response_tx.send(reply).await.is_err() {
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
    };

    let writer = async move {
        while let Some(reply) = response_rx.recv().await {
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
    };

    // The three run concurrently on this task. When the processor stops (protocol error), the
    // reader's channel closes; when the reader stops (EOF, shutdown), the processor drains what
    // was read and the writer sends what was answered, then the socket closes.
    tokio::join!(reader, processor, writer);
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
