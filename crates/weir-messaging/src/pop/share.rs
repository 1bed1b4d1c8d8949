//! What Kafka share groups (KIP-932) ask of the invisible-time engine beyond what RocketMQ's
//! consumers do, kept apart from `engine` so that the engine's own calls stay as they are:
//! acknowledgements by offset (a share consumer names no nonce, so each member's deliveries
//! carry its own, see `ReceiveRequest::nonce`) need to know whether a member still holds a
//! record, RENEW extends a lock under the same nonce, and the share offset APIs and
//! `weir group describe` read a queue's position, on whichever broker leads the queue (the
//! internal RPC `pop.positions`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use weir_broker::cluster::{decode_json, encode_json, RemoteError};

use super::engine::{HandleResult, PopEngine};
use super::{receive, HandleError, QueueKey, QueueState};
use crate::Messaging;

/// The internal RPC answering a group's [`QueueStanding`]s on the queues a broker leads.
pub(crate) const POSITIONS: &str = "pop.positions";
/// How long a describe waits for another broker's answer: a dead one must not stall it long.
const POSITIONS_TIMEOUT: Duration = Duration::from_secs(3);

/// Where a group is on one queue: what a Kafka share group's offset APIs and describe show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueuePosition {
    /// Every offset below is done (Kafka's share-partition start offset).
    pub done_below: i64,
    /// The first offset never handed out.
    pub next: i64,
    /// Records handed out and not done yet.
    pub in_flight: usize,
}

/// A group's position on a queue with the end of the queue's log, as the queue's leader sees
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueStanding {
    pub position: QueuePosition,
    /// The partition's last stable offset: records at or past it are not for consumers yet.
    pub last_stable_offset: i64,
}

impl QueueStanding {
    /// Records the group is not done with: those in flight, and those not yet handed out up
    /// to the last stable offset (a Kafka share partition's lag).
    pub fn lag(&self) -> i64 {
        self.position.in_flight as i64 + (self.last_stable_offset - self.position.next).max(0)
    }
}

/// A `pop.positions` request: the group's standing on `queues` (topic, partition), or on every
/// queue it has a state for on the broker asked when `None`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct PositionsRequest {
    group: String,
    queues: Option<Vec<(String, i32)>>,
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

    /// `group`'s standing on each of `queues` (topic, partition), asked of each queue's
    /// leader; on every queue it has a state for anywhere in the cluster when `queues` is
    /// `None`. A queue whose leader does not answer in time, or where the group has no state,
    /// is left out; with `None`, so is a queue whose state is not loaded (the group has not
    /// consumed there since that broker came to lead it).
    pub async fn queue_standings(
        &self,
        group: &str,
        queues: Option<&[(String, i32)]>,
    ) -> BTreeMap<(String, i32), QueueStanding> {
        let mut asks: BTreeMap<i32, Option<Vec<(String, i32)>>> = BTreeMap::new();
        match queues {
            Some(queues) => {
                let metadata = self.broker.metadata();
                for (topic, partition) in queues {
                    let leader = metadata.topic(topic).and_then(|t| t.partition(*partition)).map_or(-1, |p| p.leader);
                    if leader >= 0 {
                        asks.entry(leader)
                            .or_insert_with(|| Some(Vec::new()))
                            .get_or_insert_with(Vec::new)
                            .push((topic.clone(), *partition));
                    }
                }
            }
            None => {
                for broker in self.broker.live_brokers() {
                    asks.insert(broker.id, None);
                }
                asks.insert(self.broker.config.node_id, None);
            }
        }
        let mut calls = tokio::task::JoinSet::new();
        for (node, queues) in asks {
            let request = PositionsRequest { group: group.to_string(), queues };
            let broker = self.broker.clone();
            calls.spawn(async move {
                let body = encode_json(POSITIONS, &request).ok()?;
                let answer = broker.call_broker(node, POSITIONS, body, POSITIONS_TIMEOUT).await;
                match answer.map(|bytes| decode_json::<Vec<((String, i32), QueueStanding)>>(POSITIONS, &bytes)) {
                    Ok(Ok(standings)) => Some(standings),
                    Ok(Err(e)) => {
                        tracing::warn!(node, error = %e.message(), "bad answer to pop.positions");
                        None
                    }
                    Err(e) => {
                        tracing::debug!(node, error = %e, "no answer to pop.positions");
                        None
                    }
                }
            });
        }
        let mut standings = BTreeMap::new();
        while let Some(joined) = calls.join_next().await {
            standings.extend(joined.ok().flatten().into_iter().flatten());
        }
        standings
    }

    /// [`Messaging::queue_standings`] of the queues this broker leads.
    fn queue_standings_here(&self, request: PositionsRequest) -> Vec<((String, i32), QueueStanding)> {
        let queues: BTreeSet<(String, i32)> = match request.queues {
            Some(queues) => queues.into_iter().collect(),
            None => self
                .pop
                .progress()
                .into_iter()
                .filter(|(key, _)| key.group == request.group && key.consumer.is_none())
                .map(|(key, _)| (key.topic, key.partition))
                .collect(),
        };
        queues
            .into_iter()
            .filter_map(|(topic, partition)| {
                let log = self.broker.partition(&topic, partition)?;
                log.check_local_leader().ok()?;
                let position =
                    self.queue_position(&QueueKey::new(request.group.as_str(), topic.as_str(), partition))?;
                let standing = QueueStanding { position, last_stable_offset: log.log.last_stable_offset() };
                Some(((topic, partition), standing))
            })
            .collect()
    }

    /// Serves `pop.positions`. Queues asked for by name are loaded first, so that a group's
    /// position there shows even before it consumes again after a restart or a move (its
    /// state is in its shard, not yet in memory).
    pub(crate) async fn serve_positions(&self, body: &Bytes) -> Result<Bytes, RemoteError> {
        let request: PositionsRequest = decode_json(POSITIONS, body)?;
        for (topic, partition) in request.queues.iter().flatten() {
            let key = QueueKey::new(request.group.as_str(), topic.as_str(), *partition);
            if let Err(e) = self.pop.load(&key).await {
                tracing::debug!(topic, partition, error = %e, "cannot load a queue for its position");
            }
        }
        encode_json(POSITIONS, &self.queue_standings_here(request))
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
