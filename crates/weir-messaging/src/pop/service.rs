//! The state shards' internal RPCs (served by `super::reset`'s `pop` service), called by the
//! engine of a queue's partition leader on the broker leading the queue's state shard:
//!
//! - `pop.take_over`: a JSON [`TakeOverRequest`]; answers every consumer's state of the queue
//!   (see `StateShard::take_over`);
//! - `pop.write`: a JSON [`WriteRequest`]; answers, per line, whether it was accepted, once
//!   the shard's ISR has the accepted ones;
//! - `pop.queues_on`: a JSON [`QueuesOnRequest`]; answers the queues the shards hold on the
//!   partitions (for a new leader of them to take over, `super::adopt`).
//!
//! NOT_COORDINATOR and its kin send the caller to try again (`state_topic::at_leader`).

use crate::state_topic::{remote_failure, rpc_timeout};
use weir_broker::cluster::{decode_json, encode_json};
use weir_broker::{Broker, BrokerError};

use super::lines::{QueueId, StateLine};
use super::state::QueueState;
use super::store::QueueKey;

pub(crate) const TAKE_OVER: &str = "pop.take_over";
pub(crate) const WRITE: &str = "pop.write";
pub(crate) const QUEUES_ON: &str = "pop.queues_on";

/// Which queues shards `shards` (led by the broker asked) hold on `partitions` (see
/// `super::adopt`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct QueuesOnRequest {
    pub(crate) shards: Vec<i32>,
    pub(crate) partitions: Vec<(String, i32)>,
}

pub(crate) async fn call_queues_on(
    broker: &Broker,
    node: i32,
    request: &QueuesOnRequest,
) -> Result<Vec<QueueId>, BrokerError> {
    let body = encode_json(QUEUES_ON, request).map_err(remote_failure)?;
    let answer = broker.call_broker(node, QUEUES_ON, body, rpc_timeout(broker)).await?;
    decode_json::<Result<Vec<QueueId>, BrokerError>>(QUEUES_ON, &answer).map_err(remote_failure)?
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct TakeOverRequest {
    pub(crate) shard: i32,
    pub(crate) queue: QueueId,
    pub(crate) epoch: i32,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct WriteRequest {
    pub(crate) shard: i32,
    pub(crate) lines: Vec<StateLine>,
}

pub(crate) async fn call_take_over(
    broker: &Broker,
    node: i32,
    request: &TakeOverRequest,
) -> Result<Vec<(QueueKey, QueueState)>, BrokerError> {
    let body = encode_json(TAKE_OVER, request).map_err(remote_failure)?;
    let answer = broker.call_broker(node, TAKE_OVER, body, rpc_timeout(broker)).await?;
    decode_json::<Result<Vec<(QueueKey, QueueState)>, BrokerError>>(TAKE_OVER, &answer).map_err(remote_failure)?
}

pub(crate) async fn call_write(broker: &Broker, node: i32, request: &WriteRequest) -> Result<Vec<bool>, BrokerError> {
    let body = encode_json(WRITE, request).map_err(remote_failure)?;
    let answer = broker.call_broker(node, WRITE, body, rpc_timeout(broker)).await?;
    decode_json::<Result<Vec<bool>, BrokerError>>(WRITE, &answer).map_err(remote_failure)?
}
