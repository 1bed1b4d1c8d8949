//! The leader's side of ISR changes: proposals sent to the active controller, and the periodic
//! check that drops followers which fell behind. What is proposed, and when, is
//! [`crate::replication`]'s (from the followers' fetches and lag); the decision is the
//! controller's.

use std::sync::Arc;
use std::time::Duration;

use crate::cluster::control::{ControlAnswer, ControlRequest};
use crate::partition::Partition;
use crate::replication::IsrProposal;
use crate::Broker;

impl Broker {
    /// Sends an ISR proposal to the controller in the background; a refused or lost one is
    /// forgotten, so the next fetch or check proposes again from the current state.
    pub(crate) fn send_isr_proposal(self: &Arc<Self>, partition: Arc<Partition>, proposal: IsrProposal) {
        let broker = self.clone();
        tokio::spawn(async move {
            let request = ControlRequest::AlterPartition { proposal: proposal.clone() };
            match broker.control(request).await {
                Ok(ControlAnswer::Done) => {
                    tracing::info!(topic = %proposal.topic, partition = proposal.partition, isr = ?proposal.isr, "ISR changed");
                }
                Ok(other) => {
                    tracing::error!(answer = ?other, "AlterPartition: unexpected answer");
                    partition.drop_pending_isr(&proposal);
                }
                Err(e) => {
                    tracing::warn!(topic = %proposal.topic, partition = proposal.partition, isr = ?proposal.isr, error = %e, "ISR change refused");
                    partition.drop_pending_isr(&proposal);
                }
            }
        });
    }

    /// Checks the ISRs of the partitions this broker leads every half `replica.lag.time.max.ms`
    /// and proposes to drop followers that fell behind, or to add one that caught up without a
    /// fetch proposing it (see `Partition::isr_to_expand`), until shutdown.
    pub(crate) fn run_isr_checks(self: &Arc<Self>) {
        let lag = Duration::from_millis(self.config.replica_lag_time_max_ms);
        let interval = (lag / 2).clamp(Duration::from_millis(10), Duration::from_secs(5));
        self.every(interval, move |broker| async move {
            let metadata = broker.metadata();
            let unfenced = |id: i32| metadata.brokers.get(&id).is_some_and(|b| !b.fenced);
            for partition in broker.partitions() {
                let heartbeat = |id| broker.follower_heartbeats.last(id);
                let proposal = partition
                    .isr_to_shrink(lag, heartbeat)
                    .or_else(|| partition.isr_to_expand(lag, heartbeat, unfenced));
                if let Some(proposal) = proposal {
                    broker.send_isr_proposal(partition, proposal);
                }
            }
        });
    }
}
