//! Moving a group's invisible-time position (RocketMQ's `resetOffsetByTime`, and what
//! `weir group reset-offsets` does for a group whose consumers receive by invisible time): each
//! partition's queue states are reset on the broker that leads it, this one or another over the
//! internal RPC (`pop.reset`).
//!
//! A reset needs no pause of the group's consumers, as in RocketMQ: a receive racing it hands out
//! nothing of what it read before the reset (see `super::state::QueueState::resets`), and the
//! handles of earlier deliveries go stale.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;

use weir_broker::cluster::{decode_json, encode_json, RemoteError, RpcFuture, RpcHandler};
use weir_broker::error::ErrorKind;
use weir_broker::BrokerError;

use crate::Messaging;

const SERVICE: &str = "pop";
const RESET: &str = "pop.reset";

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct ResetRequest {
    group: String,
    topic: String,
    /// (partition, offset) for partitions the receiving broker leads.
    positions: Vec<(i32, i64)>,
    /// Give the group a state where it has none (a Kafka share group's offsets set before
    /// its first fetch).
    #[serde(default)]
    create: bool,
}

impl Messaging {
    /// Starts `group`'s consumption of `topic` by invisible time again at the given (partition,
    /// offset) positions, each where its partition is led. A group that has no state for a
    /// queue gets one when it is a group that receives by invisible time (it has state on that
    /// broker, or group settings); other groups are Kafka's, and keep none. Returns how many
    /// queue states were set; fails, naming the partition, when a leader is missing or refuses.
    pub async fn reset_queues(&self, group: &str, topic: &str, positions: &[(i32, i64)]) -> Result<usize, BrokerError> {
        self.reset_queues_with(group, topic, positions, false).await
    }

    /// [`Messaging::reset_queues`] of a Kafka share group: a queue it has no state for gets
    /// one at the position (AlterShareGroupOffsets before the first fetch).
    pub async fn reset_share_queues(
        &self,
        group: &str,
        topic: &str,
        positions: &[(i32, i64)],
    ) -> Result<usize, BrokerError> {
        self.reset_queues_with(group, topic, positions, true).await
    }

    async fn reset_queues_with(
        &self,
        group: &str,
        topic: &str,
        positions: &[(i32, i64)],
        create: bool,
    ) -> Result<usize, BrokerError> {
        let metadata = self.broker.metadata();
        let meta = metadata.topic(topic).ok_or_else(|| {
            BrokerError::new(ErrorKind::UnknownTopicOrPartition, format!("topic '{topic}' does not exist"))
        })?;
        let mut by_leader: BTreeMap<i32, Vec<(i32, i64)>> = BTreeMap::new();
        for &(partition, offset) in positions {
            debug_assert!(offset >= 0, "reset of {topic}-{partition} to {offset}");
            let leader = meta.partition(partition).map(|p| p.leader).ok_or_else(|| {
                BrokerError::new(
                    ErrorKind::UnknownTopicOrPartition,
                    format!("topic '{topic}' has no partition {partition}"),
                )
            })?;
            if leader < 0 {
                return Err(BrokerError::new(
                    ErrorKind::LeaderNotAvailable,
                    format!("{topic}-{partition} has no leader right now; retry shortly"),
                ));
            }
            by_leader.entry(leader).or_default().push((partition, offset));
        }
        let mut reset = 0;
        for (leader, positions) in by_leader {
            reset += if leader == self.broker.config.node_id {
                self.reset_queues_here(group, topic, &positions, create).await?
            } else {
                let request = ResetRequest { group: group.to_string(), topic: topic.to_string(), positions, create };
                let body = encode_json(RESET, &request).map_err(|e| BrokerError::internal(e.message().to_string()))?;
                let timeout = Duration::from_millis(self.broker.config.quorum_request_timeout_ms);
                let answer = self.broker.call_broker(leader, RESET, body, timeout).await?;
                decode_json::<Result<usize, BrokerError>>(RESET, &answer)
                    .map_err(|e| BrokerError::internal(e.message().to_string()))??
            };
        }
        Ok(reset)
    }

    /// [`Messaging::reset_queues`] of partitions this broker leads.
    async fn reset_queues_here(
        &self,
        group: &str,
        topic: &str,
        positions: &[(i32, i64)],
        create: bool,
    ) -> Result<usize, BrokerError> {
        let create = !self.broker.group_settings(group).broadcast
            && (create || self.pop.has_group(group) || self.broker.group_configs(group).is_some());
        let mut reset = 0;
        for &(partition, offset) in positions {
            let here = self.broker.partition(topic, partition).ok_or_else(|| {
                BrokerError::new(
                    ErrorKind::NotLeader,
                    format!("broker {} does not host {topic}-{partition}", self.broker.config.node_id),
                )
            })?;
            here.check_local_leader()?;
            reset += self.pop.reset(group, topic, partition, offset, create).await?;
            // Long polls of the queue look again, from the new position.
            here.wake_waiters();
        }
        if reset > 0 {
            tracing::info!(group, topic, queues = reset, "reset the group's invisible-time positions");
        }
        Ok(reset)
    }
}

struct PopService {
    messaging: Weak<Messaging>,
}

impl RpcHandler for PopService {
    fn handle(&self, method: &str, body: Bytes) -> RpcFuture<'static, Result<Bytes, RemoteError>> {
        let messaging = self.messaging.upgrade();
        let method = method.to_string();
        Box::pin(async move {
            let messaging = messaging.ok_or_else(|| RemoteError::new("the broker is shutting down"))?;
            match method.as_str() {
                RESET => {
                    let request: ResetRequest = decode_json(&method, &body)?;
                    let answer = messaging
                        .reset_queues_here(&request.group, &request.topic, &request.positions, request.create)
                        .await;
                    encode_json(&method, &answer)
                }
                super::share::POSITIONS => messaging.serve_positions(&body).await,
                super::service::TAKE_OVER => {
                    let request: super::service::TakeOverRequest = decode_json(&method, &body)?;
                    let answer =
                        messaging.pop_states.take_over_here(request.shard, &request.queue, request.epoch).await;
                    encode_json(&method, &answer)
                }
                super::service::QUEUES_ON => {
                    let request: super::service::QueuesOnRequest = decode_json(&method, &body)?;
                    let answer = messaging.pop_states.queues_on_here(&request.shards, &request.partitions);
                    encode_json(&method, &answer)
                }
                super::service::WRITE => {
                    let request: super::service::WriteRequest = decode_json(&method, &body)?;
                    let answer = messaging.pop_states.write_here(request.shard, request.lines).await;
                    encode_json(&method, &answer)
                }
                _ => Err(RemoteError::unknown_method(&method)),
            }
        })
    }
}

/// Serves `pop.reset`, `pop.positions`, `pop.take_over`, `pop.write` and `pop.queues_on` on this broker's
/// internal RPC.
pub fn register(messaging: &Arc<Messaging>) {
    let service = Arc::new(PopService { messaging: Arc::downgrade(messaging) });
    messaging.broker.cluster.register_service(SERVICE, service);
}
