//! Retries end in the dead letters: a message whose invisible time runs out after its group's
//! `max.delivery.attempts`-th delivery is not delivered again but moved to the group's
//! dead-letter topic ([`crate::dead_letter`]) and marked done in its queue.
//!
//! That happens when a receive of the queue finds it (before handing anything out), and every
//! [`SWEEP_INTERVAL`] for every queue this broker leads ([`start_sweep`]), so a message whose
//! consumers all went away still gets there. A consumer that gives up on a message itself
//! ([`give_up`], RocketMQ's ForwardMessageToDeadLetterQueue) has it moved at once.

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::pop::{HandleError, Inflight, QueueKey, QueueState};
use weir_broker::{BrokerError, ErrorKind};

use crate::Messaging;

/// How often every queue is looked at.
pub(crate) const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Moves the messages of `key` that used up their `max_attempts` deliveries to the dead
/// letters; returns how many moved. A message that cannot be moved now (the dead-letter topic's
/// leader is away) stays in flight and is tried again later.
pub(crate) async fn move_exhausted(messaging: &Arc<Messaging>, key: &QueueKey, max_attempts: u32) -> usize {
    let mut moved = 0;
    for (offset, inflight) in messaging.pop.exhausted(key, messaging.broker.now_ms(), max_attempts) {
        match move_one(messaging, key, offset, inflight).await {
            Ok(()) => moved += 1,
            Err(e) => {
                tracing::warn!(group = %key.group, topic = %key.topic, partition = key.partition, offset, error = %e,
                    "cannot dead-letter a message now; trying again later");
                break;
            }
        }
    }
    moved
}

/// Moves the delivery `inflight` of `offset` to the dead letters and marks it done. When the
/// delivery is no longer in flight by the time it is marked (acked meanwhile), the dead letter
/// stays: a copy too many, never a loss.
async fn move_one(
    messaging: &Arc<Messaging>,
    key: &QueueKey,
    offset: i64,
    inflight: Inflight,
) -> Result<(), BrokerError> {
    let broker = &messaging.broker;
    let partition = broker
        .partition(&key.topic, key.partition)
        .ok_or_else(|| BrokerError::new(ErrorKind::NotLeader, "the queue is no longer on this broker"))?;
    partition.check_local_leader()?;
    let record = {
        let (broker, partition) = (broker.clone(), partition.clone());
        tokio::task::spawn_blocking(move || broker.read_record(&partition, offset))
            .await
            .map_err(|e| BrokerError::internal(e.to_string()))??
    };
    let store = &messaging.pop;
    // One mover at a time, and only while the delivery is still the one it was told of (one
    // that finished just before moved it already).
    let Some(_claim) = store.claim_dead_letter(key, offset) else { return Ok(()) };
    if store.get_inflight(key, offset) != Some(inflight) {
        return Ok(());
    }
    match record {
        Some(record) => {
            crate::dead_letter::dead_letter(broker, &key.group, &key.topic, key.partition, &record, inflight.attempt)
                .await?;
            let (_, durable) = store.update(key, || QueueState::starting_at(0), |q| q.ack(offset, inflight.nonce))?;
            durable.wait().await?;
            if inflight.group.is_some() {
                // The next message of its FIFO group may go out now.
                partition.wake_waiters();
            }
        }
        // Compacted or deleted away meanwhile: nothing to keep.
        None => {
            let (_, durable) = store.update(
                key,
                || QueueState::starting_at(0),
                |q| {
                    q.forget(offset);
                    Ok::<_, ()>(())
                },
            )?;
            durable.wait().await?;
        }
    }
    Ok(())
}

/// Sweeps every queue of this broker each [`SWEEP_INTERVAL`] until the broker shuts down (or
/// is dropped). Each delivery carries the limit of the receive that handed it out (a Kafka
/// share group's `share.delivery.count.limit` is not its RocketMQ `max.delivery.attempts`), so
/// a broker that took the queue over dead-letters by the limit its consumers used; the group's
/// RocketMQ setting applies only to deliveries recorded without one.
pub(crate) fn start_sweep(messaging: &Arc<Messaging>) {
    let messaging: Weak<Messaging> = Arc::downgrade(messaging);
    tokio::spawn(async move {
        let Some(mut shutdown) = messaging.upgrade().map(|m| m.broker.shutdown_signal()) else { return };
        loop {
            tokio::select! {
                _ = tokio::time::sleep(SWEEP_INTERVAL) => {}
                _ = shutdown.wait_for(|down| *down) => return,
            }
            let Some(messaging) = messaging.upgrade() else { return };
            let broker = &messaging.broker;
            for key in messaging.pop.queues_with_expired(broker.now_ms(), 1) {
                let leads = broker.partition(&key.topic, key.partition).is_some_and(|p| p.check_local_leader().is_ok());
                if leads {
                    let fallback = broker.group_settings(&key.group).max_delivery_attempts;
                    move_exhausted(&messaging, &key, fallback).await;
                }
            }
        }
    });
}

/// The consumer gives up on the delivery `nonce` of `offset`: it goes to the dead letters now.
pub(crate) async fn give_up(
    messaging: &Arc<Messaging>,
    key: &QueueKey,
    offset: i64,
    nonce: u64,
) -> Result<Result<(), HandleError>, BrokerError> {
    if messaging.broker.partition(&key.topic, key.partition).is_none() {
        return Ok(Err(HandleError::NotInFlight));
    }
    messaging.pop.load(key).await?;
    let inflight = match messaging.pop.get_inflight(key, offset) {
        Some(inflight) if inflight.nonce == nonce => inflight,
        Some(_) => return Ok(Err(HandleError::Stale)),
        None => return Ok(Err(HandleError::NotInFlight)),
    };
    move_one(messaging, key, offset, inflight).await.map(Ok)
}
