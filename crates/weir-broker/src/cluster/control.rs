//! Control requests: every metadata change any node is asked for, sent to the active
//! controller and decided there.
//!
//! [`Broker::control`] is the one way in. On the active controller it decides at once; on any
//! other node it forwards the request over the internal RPC to the controller the quorum names,
//! then waits until this node has applied the metadata the decision produced, so that the
//! caller's next request to this node sees it (a topic created through node 2 is in node 2's
//! Metadata answer). While the quorum has no leader (an election, a lost majority) it retries
//! until its patience runs out, then says so.
//!
//! The controller decides one request at a time, under the controller lock (KRaft's single
//! event loop): validate against the applied state, commit the records, apply them. A request
//! is decided only by a leader that has applied an entry of its own term, so its state holds
//! every decision of the leaders before it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
pub use weir_controller::request::{ControlAnswer, ControlRequest, HeartbeatAnswer};

use super::{methods, rpc};
use crate::broker::Broker;
use crate::error::{BrokerError, ErrorKind};

/// What crosses the wire: the answer, and the metadata offset the asking node must have applied
/// to see the decision's effects.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ControlResponse {
    pub applied_offset: i64,
    pub answer: Result<ControlAnswer, BrokerError>,
}

/// How long to wait between attempts while the quorum has no reachable leader.
const RETRY_BACKOFF: Duration = Duration::from_millis(100);

impl Broker {
    /// Has the active controller decide `request` (this node, or the one the quorum names),
    /// and returns once this node has applied the outcome.
    pub async fn control(self: &Arc<Self>, request: ControlRequest) -> Result<ControlAnswer, BrokerError> {
        let heartbeat = matches!(request, ControlRequest::Heartbeat { .. } | ControlRequest::RegisterBroker { .. });
        // A heartbeat is sent again at the next interval anyway; a user's request waits out an
        // election (a few election timeouts) before it fails.
        let patience = if heartbeat {
            Duration::from_millis(self.config.quorum_request_timeout_ms)
        } else {
            Duration::from_millis(self.config.quorum_request_timeout_ms + 4 * self.config.quorum_election_timeout_ms)
        };
        let deadline = Instant::now() + patience;
        loop {
            match self.control_once(&request, deadline, !heartbeat).await {
                Err(e)
                    if matches!(e.kind, ErrorKind::NotController | ErrorKind::Unavailable)
                        && Instant::now() + RETRY_BACKOFF < deadline
                        && !self.is_shutting_down() =>
                {
                    tracing::debug!(request = request.name(), error = %e, "control request: trying again");
                    tokio::time::sleep(RETRY_BACKOFF).await;
                }
                Err(e) if matches!(e.kind, ErrorKind::NotController | ErrorKind::Unavailable) => {
                    let message = format!(
                        "cannot {}: no active controller answered within {} ms (is a majority of the controllers \
                         down?); last: {}",
                        request.name(),
                        patience.as_millis(),
                        e.message
                    );
                    return Err(BrokerError::new(ErrorKind::NotController, message));
                }
                Err(e) => {
                    let message = format!("cannot {}: {}", request.name(), e.message);
                    return Err(BrokerError::new(e.kind, message));
                }
                Ok(answer) => return Ok(answer),
            }
        }
    }

    /// [`Broker::control`] from blocking code (a `spawn_blocking` thread or a worker thread of
    /// a multi-threaded runtime).
    pub(crate) fn control_blocking(self: &Arc<Self>, request: ControlRequest) -> Result<ControlAnswer, BrokerError> {
        crate::runtime::block_on(self.control(request))?
    }

    async fn control_once(
        self: &Arc<Self>,
        request: &ControlRequest,
        deadline: Instant,
        catch_up: bool,
    ) -> Result<ControlAnswer, BrokerError> {
        let addr = match self.quorum.leader() {
            Some(leader) if leader == self.quorum.node_id() => {
                return self.decide_forwarded(request.clone()).await.answer;
            }
            Some(leader) => self.quorum.voter_address(leader).ok_or_else(|| {
                BrokerError::new(ErrorKind::NotController, format!("no address for controller {leader}"))
            })?,
            // This node does not know the leader (a broker that is no learner yet, or an
            // election): ask a voter, which passes the request on to the leader it knows.
            None => match self.any_other_voter() {
                Some(addr) => addr,
                None => {
                    return Err(BrokerError::new(
                        ErrorKind::NotController,
                        "the metadata quorum has no leader (an election is under way, or a majority of the \
                         controllers is down)",
                    ))
                }
            },
        };
        let response = self.forward(&addr, request, deadline).await?;
        if catch_up && response.answer.is_ok() {
            self.catch_up(response.applied_offset, deadline).await;
        }
        response.answer
    }

    /// Sends `request` to the node at `addr` (the controller, or a voter that knows it).
    async fn forward(
        &self,
        addr: &str,
        request: &ControlRequest,
        deadline: Instant,
    ) -> Result<ControlResponse, BrokerError> {
        let body = serde_json::to_vec(request).map_err(|e| BrokerError::internal(format!("encode: {e}")))?;
        let remaining = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(10));
        let answer = rpc::call(&self.cluster.rpc, addr, methods::CONTROL, Bytes::from(body), remaining).await?;
        serde_json::from_slice(&answer)
            .map_err(|e| BrokerError::internal(format!("{addr} answered {}: {e}", request.name())))
    }

    /// A configured voter other than this node, a different one at each call.
    fn any_other_voter(&self) -> Option<String> {
        let me = self.config.node_id;
        let others: Vec<String> = self
            .config
            .voters
            .iter()
            .filter(|(id, _)| **id != me)
            .map(|(_, (host, port))| format!("{host}:{port}"))
            .collect();
        if others.is_empty() {
            return None;
        }
        let turn = self.cluster.next_voter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        others.get(turn % others.len()).cloned()
    }

    /// A control request that came over the internal RPC: decided here when this node is the
    /// active controller, else passed on once to the leader this node knows (a broker that is
    /// not a learner yet cannot know it).
    pub(crate) async fn serve_control(self: &Arc<Self>, request: ControlRequest) -> ControlResponse {
        let leader = self.quorum.leader();
        let me = self.quorum.node_id();
        let Some(addr) = leader.filter(|l| *l != me).and_then(|l| self.quorum.voter_address(l)) else {
            return self.decide_forwarded(request).await;
        };
        let deadline = Instant::now() + Duration::from_millis(self.config.quorum_request_timeout_ms);
        match self.forward(&addr, &request, deadline).await {
            Ok(response) => response,
            Err(e) => ControlResponse { applied_offset: -1, answer: Err(e) },
        }
    }

    /// Decides a request on this node, which must be the active controller (the RPC handler's
    /// entry, and the local path of [`Broker::control`]).
    pub(crate) async fn decide_forwarded(self: &Arc<Self>, request: ControlRequest) -> ControlResponse {
        let this = self.clone();
        match tokio::task::spawn_blocking(move || this.decide(request)).await {
            Ok(response) => response,
            Err(e) => ControlResponse {
                applied_offset: -1,
                answer: Err(BrokerError::internal(format!("the control task failed: {e}"))),
            },
        }
    }

    /// Waits (until `deadline`) for this node to apply the metadata up to `offset`, and brings
    /// its partitions in line with it.
    async fn catch_up(self: &Arc<Self>, offset: i64, deadline: Instant) {
        let mut states = self.quorum.subscribe();
        let wait = states.wait_for(|state| state.applied_offset >= offset);
        let remaining = deadline.saturating_duration_since(Instant::now());
        if tokio::time::timeout(remaining, wait).await.is_err() {
            tracing::warn!(offset, "the controller's decision is not applied here yet");
            return;
        }
        let this = self.clone();
        let latest = self.quorum.applied();
        match tokio::task::spawn_blocking(move || this.reconcile_to(latest)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "cannot bring the partitions in line with the metadata"),
            Err(e) => tracing::error!(error = %e, "the metadata reconciliation task failed"),
        }
    }

    /// Decides `request` under the controller lock. Blocking.
    fn decide(self: &Arc<Self>, request: ControlRequest) -> ControlResponse {
        let held = self.lock_controller();
        let answer = self.quorum.check_active_controller().and_then(|()| self.run_decision(&held, request));
        ControlResponse { applied_offset: self.quorum.applied().applied_offset, answer }
    }
}
