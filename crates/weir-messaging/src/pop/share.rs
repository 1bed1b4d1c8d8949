//! What Kafka share groups (KIP-932) ask of the invisible-time engine beyond what RocketMQ's
//! consumers do, kept apart from `engine` so that the engine's own calls stay as they are:
//! acknowledgements by offset (a share consumer names no nonce, so each member's deliveries
//! carry its own, see `ReceiveRequest::nonce`) need to know whether a member still holds a
//! record, RENEW extends a lock under the same nonce, and the share offset APIs and
//! `weir group describe` read a queue's position.

use std::time::Duration;

use super::engine::{HandleResult, PopEngine};
use super::{receive, HandleError, QueueKey, QueueState};
use crate::Messaging;

/// Where a group is on one queue: what a Kafka share group's offset APIs and describe show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePosition {
    /// Every offset below is done (Kafka's share-partition start offset).
    pub done_below: i64,
    /// The first offset never handed out.
    pub next: i64,
    /// Records handed out and not done yet.
    pub in_flight: usize,
}

impl Messaging {
    /// Where the group of `key` is on its queue (on this broker); `None` when it has no state
    /// loaded here (not used since this broker came to lead the partition).
    pub fn queue_position(&self, key: &QueueKey) -> Option<QueuePosition> {
        self.pop.get(key).map(|q| QueuePosition {
            done_below: q.done_below,
            next: q.next,
            in_flight: q.inflight.values().filter(|i| i.attempt > 0).count(),
        })
    }
}

impl PopEngine {
    /// Where the group of `key` is on its queue; `None` when it has no state there.
    pub fn position(&self, key: &QueueKey) -> Option<QueuePosition> {
        self.messaging.queue_position(key)
    }

    /// Whether the delivery `nonce` of `offset` in `key` is still invisible: handed out under
    /// that nonce, and its invisible time not run out (a Kafka share consumer's acquisition
    /// lock: once it runs out the record is available again, and its holder may no longer
    /// acknowledge it, even before it is handed out anew).
    pub async fn is_held(&self, key: &QueueKey, offset: i64, nonce: u64) -> bool {
        if self.messaging.pop.load(key).await.is_err() {
            return false;
        }
        self.messaging.pop.held(key, nonce, self.messaging.broker.now_ms(), &[offset]) == [true]
    }

    /// [`PopEngine::is_held`] of each of `offsets`, at once.
    pub async fn are_held(&self, key: &QueueKey, offsets: &[i64], nonce: u64) -> Vec<bool> {
        if self.messaging.pop.load(key).await.is_err() {
            return vec![false; offsets.len()];
        }
        self.messaging.pop.held(key, nonce, self.messaging.broker.now_ms(), offsets)
    }

    /// The offsets of `key` handed out under `nonce` and still invisible: what one Kafka share
    /// consumer holds there.
    pub async fn held_by(&self, key: &QueueKey, nonce: u64) -> Vec<i64> {
        if self.messaging.pop.load(key).await.is_err() {
            return Vec::new();
        }
        let now = self.messaging.broker.now_ms();
        self.messaging.pop.get(key).map_or_else(Vec::new, |q| {
            q.inflight
                .iter()
                .filter(|(_, i)| i.nonce == nonce && i.attempt > 0 && i.visible_at_ms > now)
                .map(|(offset, _)| *offset)
                .collect()
        })
    }

    /// The (topic, partition) queues `group` has a state for on this broker (clustering only).
    pub fn queues_of(&self, group: &str) -> Vec<(String, i32)> {
        let mut queues: Vec<(String, i32)> = self
            .messaging
            .pop
            .progress()
            .into_iter()
            .filter(|(key, _)| key.group == group && key.consumer.is_none())
            .map(|(key, _)| (key.topic, key.partition))
            .collect();
        queues.sort();
        queues
    }

    /// The delivery `nonce` of `offset` in `key` stays invisible `invisible` from now, under
    /// the same nonce (a Kafka share consumer renewing its acquisition lock, KIP-1222: its later
    /// ack by offset still names it). [`PopEngine::change_invisible`] with the nonce kept.
    pub async fn extend_invisible(
        &self,
        key: &QueueKey,
        offset: i64,
        nonce: u64,
        invisible: Duration,
    ) -> HandleResult<()> {
        debug_assert!(invisible <= receive::MAX_INVISIBLE, "invisible {invisible:?}");
        self.messaging.pop.load(key).await?;
        if !self.messaging.pop.contains(key) {
            return Ok(Err(HandleError::NotInFlight));
        }
        let visible_at = self.messaging.broker.now_ms() + invisible.as_millis() as i64;
        let (changed, durable) = self.messaging.pop.update(
            key,
            || QueueState::starting_at(0),
            |q| q.change_invisible(offset, nonce, visible_at, nonce),
        )?;
        if let Err(refused) = changed {
            return Ok(Err(refused));
        }
        durable.wait().await?;
        self.renewals.release(key, offset);
        Ok(Ok(()))
    }
}
