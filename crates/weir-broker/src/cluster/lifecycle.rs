//! A broker's life in the cluster: register with the active controller, heartbeat every
//! `broker.heartbeat.interval.ms`, and know whether it may lead.
//!
//! A broker writes only to the partitions its applied metadata says it leads, and nothing while
//! the controller's last answer said it is fenced (starting, catching up, shutting down). A
//! broker that loses the controller keeps serving what it leads, as a KRaft broker does: when a
//! majority of the controllers is down nobody can fence it or move its partitions, so refusing
//! would only stop traffic; when it is cut off alone, the controller fences it and it learns
//! so from the metadata log as soon as it is reachable again. (With one replica per partition
//! no other broker can take a partition over meanwhile; ISR replication adds the checks that
//! a stale leader needs.)

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::control::{ControlAnswer, ControlRequest};
use crate::broker::Broker;
use crate::metadata::BrokerRegistration;

impl Broker {
    /// This broker's registration: who it is and where clients and peers reach it.
    pub(crate) fn registration(&self) -> BrokerRegistration {
        BrokerRegistration {
            id: self.config.node_id,
            incarnation: self.cluster.incarnation,
            host: self.config.advertised_host.clone(),
            port: self.advertised_port(),
            listeners: self
                .config
                .client_listeners
                .iter()
                .map(|l| crate::metadata::ListenerEndpoint {
                    name: l.name.clone(),
                    host: l.advertised_host.clone(),
                    port: l.advertised_port,
                })
                .collect(),
            internal: self.internal_address.clone().unwrap_or_default(),
            rack: self.config.rack.clone(),
            rocketmq_port: self.config.rocketmq_advertised_port,
            fenced: true,
        }
    }

    /// One round of the lifecycle: register if needed, else heartbeat. Returns whether the
    /// broker is registered afterwards.
    pub(crate) async fn lifecycle_round(self: &Arc<Self>, registered: bool, shutting_down: bool) -> bool {
        if !registered {
            let request = ControlRequest::RegisterBroker { registration: self.registration() };
            let failing = &self.cluster.lifecycle.registration_failing;
            return match self.control(request).await {
                Ok(_) => {
                    if failing.swap(false, Ordering::Relaxed) {
                        tracing::info!("registered with the controller");
                    }
                    true
                }
                Err(e) => {
                    if failing.swap(true, Ordering::Relaxed) {
                        tracing::debug!(error = %e, "cannot register with the controller yet");
                    } else {
                        tracing::info!(error = %e, "cannot register with the controller yet; retrying");
                    }
                    false
                }
            };
        }
        let request = ControlRequest::Heartbeat {
            id: self.config.node_id,
            incarnation: self.cluster.incarnation,
            applied_offset: self.reconciled_offset(),
            shutting_down,
            load: Some(weir_controller::balance::LoadReport::clone(&self.load_report())),
        };
        match self.control(request).await {
            Ok(ControlAnswer::Heartbeat(answer)) if answer.must_register => false,
            Ok(ControlAnswer::Heartbeat(answer)) => {
                let was = self.cluster.lifecycle.may_lead();
                self.cluster.lifecycle.acknowledged(answer.fenced);
                if was != self.cluster.lifecycle.may_lead() {
                    tracing::info!(fenced = answer.fenced, "the controller acknowledged this broker");
                }
                true
            }
            Ok(other) => {
                tracing::error!(answer = ?other, "the controller answered a heartbeat with something else");
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, "heartbeat not acknowledged");
                if !self.cluster.lifecycle.may_lead() {
                    tracing::debug!("this broker may not lead until a heartbeat is acknowledged");
                }
                true
            }
        }
    }

    /// Registers and heartbeats until shutdown (then tells the controller, once).
    pub(crate) fn run_lifecycle(self: &Arc<Self>) {
        let broker = Arc::downgrade(self);
        let mut shutdown = self.shutdown_signal();
        let interval = Duration::from_millis(self.config.broker_heartbeat_interval_ms.max(10));
        tokio::spawn(async move {
            let mut registered = false;
            loop {
                let Some(this) = broker.upgrade() else { return };
                registered = this.lifecycle_round(registered, false).await;
                // While fenced, check back soon: unfencing waits for the next heartbeat.
                let wait =
                    if this.cluster.lifecycle.may_lead() { interval } else { interval.min(Duration::from_millis(100)) };
                drop(this);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.changed() => return,
                }
            }
        });
    }

    /// Waits until the controller has unfenced this broker, logging now and then.
    pub(crate) async fn wait_until_unfenced(&self) {
        let started = Instant::now();
        let mut next_log = Duration::from_secs(5);
        while !self.cluster.lifecycle.may_lead() {
            if self.is_shutting_down() {
                return;
            }
            if started.elapsed() >= next_log {
                let leader = self.quorum.leader();
                tracing::info!(
                    waited_s = started.elapsed().as_secs(),
                    controller = ?leader,
                    "waiting to join the cluster (a majority of the controllers must be up)"
                );
                next_log += Duration::from_secs(10);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
