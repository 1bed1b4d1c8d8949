//! Telling a dead process from a silent one, at once.
//!
//! A process that dies (`kill -9`, a crash, the OOM killer) has its sockets closed by the
//! kernel: its peers' connections to it end, and its listening port refuses new ones. A process
//! that is frozen (SIGSTOP, swapping) or cut off by the network does neither: its connections
//! stay open and silent, and only a timeout can tell. Weir acts on the first within
//! milliseconds and keeps its timeouts (`broker.session.timeout.ms`, the Raft election timeout)
//! for the second:
//! - the active controller watches every unfenced broker, and fences one whose process is gone
//!   with the leader and ISR changes that follow ([`Broker::sync_broker_watches`]), rather than
//!   wait for its session to expire;
//! - every other voter watches the active controller, and when its process is gone one voter
//!   stands for election as soon as the others will vote ([`Broker::run_leader_watch`]),
//!   rather than after an election timeout.
//!
//! A watch is one call to the peer's `cluster.liveness` method, which the peer holds open
//! ([`hold`]) and answers after a while; the watch then calls again. The call fails at once
//! when the connection ends. A new connection is tried then: *refused* means nothing listens on
//! the port any more, so the process is gone. Anything else (a timeout, an answer, a connection
//! made, a route missing) proves nothing, and the watch goes on.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use uuid::Uuid;
use weir_rpc::{RpcClient, RpcErrorKind};
use weir_storage::sync::lock;

use super::methods;
use super::rpc::resolve;
use crate::broker::Broker;
use crate::error::BrokerError;

/// How often the active controller starts and stops its watches: a new controller starts
/// them this soon, so a broker that died with the old one is fenced this soon after.
pub(crate) const SYNC_INTERVAL: Duration = Duration::from_millis(100);
/// How long a peer holds a liveness call before it answers (and the watch calls again).
const HOLD: Duration = Duration::from_secs(10);
/// How long a watch waits for the held call's answer beyond the hold: a peer this late is
/// frozen or cut off, which its timeouts decide.
const ANSWER_SLACK: Duration = Duration::from_secs(5);
/// How long a watch waits before calling again after a failure that proved nothing.
const RETRY: Duration = Duration::from_millis(200);
/// The longest a connection attempt of the probe may take: a refusal comes at once.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The peer's side of a watch: holds the call until [`HOLD`] passes or this node shuts down.
/// A node shutting down answers at once with an error, so that the watch does not call again
/// in a loop while the server drains.
pub(crate) async fn hold(mut shutdown: watch::Receiver<bool>) -> Result<Bytes, weir_rpc::RemoteError> {
    if *shutdown.borrow() {
        return Err(weir_rpc::RemoteError::new("the node is shutting down"));
    }
    tokio::select! {
        _ = tokio::time::sleep(HOLD) => {}
        _ = shutdown.changed() => {}
    }
    Ok(Bytes::new())
}

/// Returns once the process listening on `addr` is known to be gone: a held liveness call
/// failed for a lost or refused connection, and a new connection is refused. Runs until then.
pub(crate) async fn until_gone(rpc: &RpcClient, addr: &str) {
    loop {
        let peer = match resolve(addr).await {
            Ok(peer) => peer,
            Err(_) => {
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        match rpc.call(peer, methods::LIVENESS, Bytes::new(), HOLD + ANSWER_SLACK).await {
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), RpcErrorKind::ConnectionLost(_) | RpcErrorKind::Unreachable(_)) => {
                if refused(peer).await {
                    return;
                }
            }
            // A timeout: frozen or cut off, for the timeouts to decide. An error answer: the
            // peer is starting or shutting down.
            Err(_) => {}
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Whether a new connection to `peer` is refused: nothing listens there.
async fn refused(peer: std::net::SocketAddr) -> bool {
    match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(peer)).await {
        Ok(Err(e)) => e.kind() == std::io::ErrorKind::ConnectionRefused,
        Ok(Ok(_)) | Err(_) => false,
    }
}

/// The active controller's watches, one per unfenced broker incarnation (not its own).
#[derive(Default)]
pub(crate) struct BrokerWatches {
    watching: HashMap<i32, (Uuid, AbortHandle)>,
}

impl BrokerWatches {
    fn stop_all(&mut self) {
        for (_, (_, task)) in self.watching.drain() {
            task.abort();
        }
    }
}

impl Drop for BrokerWatches {
    fn drop(&mut self) {
        self.stop_all();
    }
}

impl Broker {
    /// While this node leads the quorum: watches every unfenced broker but this node, under
    /// the incarnation the metadata has, and stops the watches of the others. Otherwise stops
    /// them all. (A leader that has not applied its own term yet may watch a little early:
    /// [`Broker::fence_gone`] checks that it is the active controller before it acts.)
    pub(crate) fn sync_broker_watches(self: &Arc<Self>) {
        let mut watches = lock(&self.cluster.watches);
        if self.quorum.leader() != Some(self.quorum.node_id()) {
            watches.stop_all();
            return;
        }
        let state = self.metadata();
        let me = self.config.node_id;
        let wanted = |id: &i32, incarnation: &Uuid| {
            *id != me && state.brokers.get(id).is_some_and(|b| !b.fenced && b.incarnation == *incarnation)
        };
        watches.watching.retain(|id, (incarnation, task)| {
            let keep = wanted(id, incarnation) && !task.is_finished();
            if !keep {
                task.abort();
            }
            keep
        });
        for broker in state.brokers.values() {
            if broker.internal.is_empty() || watches.watching.contains_key(&broker.id) {
                continue;
            }
            if !wanted(&broker.id, &broker.incarnation) {
                continue;
            }
            let task = self.spawn_broker_watch(broker.id, broker.incarnation, broker.internal.clone());
            watches.watching.insert(broker.id, (broker.incarnation, task));
        }
    }

    fn spawn_broker_watch(self: &Arc<Self>, id: i32, incarnation: Uuid, addr: String) -> AbortHandle {
        let rpc = self.cluster.rpc.clone();
        let broker = Arc::downgrade(self);
        tokio::spawn(async move {
            until_gone(&rpc, &addr).await;
            let Some(broker) = broker.upgrade() else { return };
            let fenced = tokio::task::spawn_blocking(move || broker.fence_gone(id, incarnation, &addr)).await;
            match fenced {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(broker = id, error = %e, "cannot fence a broker whose process is gone"),
                Err(e) => tracing::error!(broker = id, error = %e, "the fencing task failed"),
            }
        })
        .abort_handle()
    }

    /// Fences broker `id` now, if it is still unfenced under `incarnation` and this node is
    /// still the active controller. Blocking.
    fn fence_gone(&self, id: i32, incarnation: Uuid, addr: &str) -> Result<(), BrokerError> {
        let held = self.lock_controller();
        if self.quorum.check_active_controller().is_err() {
            return Ok(());
        }
        let state = self.metadata();
        if !state.brokers.get(&id).is_some_and(|b| !b.fenced && b.incarnation == incarnation) {
            return Ok(());
        }
        let why = format!("its process is gone (the connection to {addr} closed, and the port refuses connections)");
        self.fence(&held, id, &why)
    }

    /// On a voter: watches the active controller, and stands in for it when its process is
    /// gone ([`crate::metadata::raft::Quorum::stand_in_for_lost_leader`]). Runs until shutdown.
    pub(crate) fn run_leader_watch(self: &Arc<Self>) {
        let broker: Weak<Broker> = Arc::downgrade(self);
        let rpc = self.cluster.rpc.clone();
        let mut shutdown = self.shutdown_signal();
        tokio::spawn(async move {
            loop {
                let Some(this) = broker.upgrade() else { return };
                let leader = this.quorum.leader();
                let me = this.quorum.node_id();
                let target = leader.filter(|l| *l != me).and_then(|l| Some((l, this.quorum.voter_address(l)?)));
                drop(this);
                let Some((leader, addr)) = target else {
                    tokio::select! {
                        _ = tokio::time::sleep(RETRY) => continue,
                        _ = shutdown.changed() => return,
                    }
                };
                tokio::select! {
                    _ = until_gone(&rpc, &addr) => {
                        let Some(this) = broker.upgrade() else { return };
                        this.quorum.stand_in_for_lost_leader(leader).await;
                        // The quorum moves on by itself from here (or the election timeouts
                        // do): wait for it to name someone else before watching again.
                        leader_changes(&broker, leader).await;
                    }
                    _ = leader_changes(&broker, leader) => {}
                    _ = shutdown.changed() => return,
                }
            }
        });
    }
}

/// Returns once the quorum names a leader other than `leader` (or none), or the broker is gone.
async fn leader_changes(broker: &Weak<Broker>, leader: u64) {
    loop {
        match broker.upgrade() {
            Some(this) if this.quorum.leader() == Some(leader) => {}
            _ => return,
        }
        tokio::time::sleep(RETRY / 2).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use weir_rpc::{BoxFuture, Handler, RemoteError};

    use super::*;

    /// Holds every liveness call, as a node does.
    struct Holding;

    impl Handler for Holding {
        fn handle(&self, _: &str, _: Bytes) -> BoxFuture<'static, Result<Bytes, RemoteError>> {
            let (_keep, never) = watch::channel(false);
            Box::pin(async move {
                let _keep = _keep;
                hold(never).await
            })
        }
    }

    #[tokio::test]
    async fn a_process_that_dies_is_known_gone_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address").to_string();
        let server = tokio::spawn(weir_rpc::serve(
            listener,
            Arc::new(Holding),
            weir_rpc::ServerConfig::default(),
            std::future::pending(),
        ));
        let rpc = RpcClient::new(weir_rpc::ClientConfig::default());
        let watch = tokio::spawn({
            let rpc = rpc.clone();
            let addr = addr.clone();
            async move { until_gone(&rpc, &addr).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!watch.is_finished(), "a live process is not gone");
        // Its sockets close, as the kernel closes a killed process's.
        let died = Instant::now();
        server.abort();
        tokio::time::timeout(Duration::from_secs(3), watch).await.expect("known gone in time").expect("the watch");
        assert!(died.elapsed() < Duration::from_secs(1), "took {:?}", died.elapsed());
    }

    #[tokio::test]
    async fn a_frozen_process_is_not_taken_for_gone() {
        // Accepts and never answers, as a process under SIGSTOP (the kernel still accepts).
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address").to_string();
        let frozen = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let rpc = RpcClient::new(weir_rpc::ClientConfig::default());
        let gone = tokio::time::timeout(Duration::from_millis(1500), until_gone(&rpc, &addr)).await;
        assert!(gone.is_err(), "a frozen process was taken for gone");
        frozen.abort();
    }

    #[tokio::test]
    async fn nothing_listening_is_gone() {
        let addr = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            listener.local_addr().expect("address").to_string()
        };
        let rpc = RpcClient::new(weir_rpc::ClientConfig::default());
        tokio::time::timeout(Duration::from_secs(3), until_gone(&rpc, &addr)).await.expect("known gone in time");
    }
}
