//! The Kafka listener: accepts connections up to `max.connections` and serves each on its own
//! task until shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use weir_broker::quotas::QuotaKind;

use crate::connection::serve_connection;
use crate::context::Ctx;

/// Serves `listener` until `shutdown` completes, then stops accepting, lets every connection
/// finish the requests it has read (up to `grace`), and returns.
/// `index` is the listener's in `config.client_listeners` (0 for the only one).
pub async fn serve(
    listener: TcpListener,
    index: usize,
    ctx: Arc<Ctx>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) {
    let limit = Arc::new(Semaphore::new(ctx.broker.config.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = limit.clone().try_acquire_owned() else {
                    ctx.metrics.connections.refused.inc();
                    tracing::warn!(%peer, limit = ctx.broker.config.max_connections, "refusing connection: max.connections reached");
                    drop(stream);
                    continue;
                };
                let open = OpenConnection::new(ctx.clone());
                let ctx = ctx.clone();
                let stop = stop_rx.clone();
                connections.spawn(async move {
                    if over_connection_rate(&ctx, peer).await {
                        return;
                    }
                    serve_connection(ctx, index, stream, peer, stop).await;
                    drop(permit);
                    drop(open);
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    tracing::info!(connections = connections.len(), "stopped accepting; finishing requests in progress");
    ctx.broker.begin_shutdown();
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(grace, async { while connections.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(remaining = connections.len(), "closing connections still busy after the grace period");
        connections.abort_all();
    }
}

/// Is `peer`'s address over its `connection_creation_rate` (an IP client quota)? Then, as Kafka
/// does, the connection is closed after the throttle time instead of served (the wait keeps a
/// client that reconnects at once from spinning).
async fn over_connection_rate(ctx: &Ctx, peer: std::net::SocketAddr) -> bool {
    let quotas = &ctx.broker.client_quotas;
    if !quotas.any_address_quota() {
        return false;
    }
    let wait = quotas.record(QuotaKind::Connection, &peer.ip().to_string(), "", 1.0);
    if wait.is_zero() {
        return false;
    }
    tracing::info!(%peer, wait_ms = wait.as_millis() as u64, "closing a connection over connection_creation_rate");
    tokio::time::sleep(wait).await;
    true
}

/// One open connection in the metrics: counted when accepted, uncounted when its task ends or
/// is aborted (the guard is dropped with the task's future either way).
struct OpenConnection(Arc<Ctx>);

impl OpenConnection {
    fn new(ctx: Arc<Ctx>) -> OpenConnection {
        ctx.metrics.connections.accepted.inc();
        ctx.metrics.connections.open.inc();
        OpenConnection(ctx)
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.metrics.connections.open.dec();
    }
}
