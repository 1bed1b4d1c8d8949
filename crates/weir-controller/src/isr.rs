//! A partition leader's ISR proposals (Kafka's AlterPartition): the leader computes the ISR
//! from its followers' positions; the controller accepts it only if it was computed from the
//! current state, and commits it before it counts anywhere.

use weir_error::{BrokerError, ErrorKind};
use weir_metadata::{MetadataRecord, MetadataState};

use crate::Decision;

/// A proposed ISR for the controller (Kafka's AlterPartition), computed by the leader from
/// the state at `leader_epoch` / `partition_epoch`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IsrProposal {
    pub topic: String,
    pub topic_id: uuid::Uuid,
    pub partition: i32,
    pub leader: i32,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
    pub isr: Vec<i32>,
}

/// A leader's ISR proposal (AlterPartition): accepted when it was computed from the current
/// state (same leader, leader epoch and partition epoch), names replicas only, keeps the
/// leader, and adds no fenced broker. Committed before it counts anywhere. The answer says
/// whether the change completes a reassignment (the ISR now holds its last target replica).
pub fn decide_alter_partition(state: &MetadataState, proposal: &IsrProposal) -> Result<Decision<bool>, BrokerError> {
    let stale = |why: String| BrokerError::new(ErrorKind::FencedLeaderEpoch, why);
    let Some(topic) = state.topic(&proposal.topic).filter(|t| t.id == proposal.topic_id) else {
        return Err(BrokerError::new(ErrorKind::UnknownTopicOrPartition, format!("no topic {}", proposal.topic)));
    };
    let Some(current) = topic.partition(proposal.partition) else {
        return Err(BrokerError::new(
            ErrorKind::UnknownTopicOrPartition,
            format!("no partition {}-{}", proposal.topic, proposal.partition),
        ));
    };
    if current.leader != proposal.leader || current.leader_epoch != proposal.leader_epoch {
        return Err(stale(format!(
            "broker {} at epoch {} no longer leads {}-{} (broker {} at epoch {} does)",
            proposal.leader,
            proposal.leader_epoch,
            proposal.topic,
            proposal.partition,
            current.leader,
            current.leader_epoch
        )));
    }
    if current.partition_epoch != proposal.partition_epoch {
        return Err(stale(format!(
            "{}-{} changed since the proposal (partition epoch {} now, {} proposed from)",
            proposal.topic, proposal.partition, current.partition_epoch, proposal.partition_epoch
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    for id in &proposal.isr {
        if !current.replicas.contains(id) || !seen.insert(*id) {
            return Err(BrokerError::new(
                ErrorKind::InvalidRequest,
                format!("ISR {:?} is no subset of replicas {:?}", proposal.isr, current.replicas),
            ));
        }
        let added = !current.isr.contains(id);
        if added && state.brokers.get(id).is_none_or(|b| b.fenced) {
            return Err(BrokerError::new(
                ErrorKind::InvalidRequest,
                format!("broker {id} is fenced: it cannot join the ISR"),
            ));
        }
    }
    if !proposal.isr.contains(&proposal.leader) {
        return Err(BrokerError::new(ErrorKind::InvalidRequest, "the leader must stay in the ISR"));
    }
    // The ISR change that brings the last target replica of a reassignment in sync
    // completes the reassignment in the same record.
    let record = crate::reassignment::completion_with_isr(state, topic, proposal.partition, &proposal.isr)
        .unwrap_or_else(|| MetadataRecord::PartitionChange {
            topic: proposal.topic.clone(),
            id: proposal.topic_id,
            partition: proposal.partition,
            replicas: None,
            isr: Some(proposal.isr.clone()),
            leader: None,
        });
    let completes = matches!(record, MetadataRecord::PartitionReassignment { .. });
    Ok(Decision { records: vec![record], answer: completes })
}
