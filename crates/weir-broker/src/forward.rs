//! Appends at a partition's leader, wherever it is: the broker's own appends that do not choose
//! their partition by where they run (see also [`Broker::partition_in_turn`]) (a RocketMQ message group's queue, a dead letter, a delayed
//! message come due) go through [`Broker::append_at_leader`].
//!
//! On the leader it is a plain [`Broker::append`] with `acks=all`; elsewhere the batch goes to
//! the leader over the internal RPC (`partition.append`), which answers with the leader's result.
//! The request body is binary, so a batch is not re-encoded: the topic's length (u16, big
//! endian), the topic, the partition (i32), then the RecordBatch. The answer is JSON: the first
//! offset, or the leader's error.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};

use crate::cluster::{decode_json, encode_json, RemoteError, RpcFuture, RpcHandler};
use crate::{Acks, Broker, BrokerError, ErrorKind};

const SERVICE: &str = "partition";
const APPEND: &str = "partition.append";

struct ForwardService {
    broker: Weak<Broker>,
}

impl RpcHandler for ForwardService {
    fn handle(&self, method: &str, body: Bytes) -> RpcFuture<'static, Result<Bytes, RemoteError>> {
        let broker = self.broker.upgrade();
        let method = method.to_string();
        Box::pin(async move {
            let broker = broker.ok_or_else(|| RemoteError::new("the broker is shutting down"))?;
            if method != APPEND {
                return Err(RemoteError::unknown_method(&method));
            }
            let answer = match decode(&body) {
                None => Err(BrokerError::new(ErrorKind::InvalidRequest, "a malformed forwarded append")),
                Some((topic, index, batch)) => match broker.partition(&topic, index) {
                    None => Err(BrokerError::new(
                        ErrorKind::NotLeader,
                        format!("broker {} does not host {topic}-{index}", broker.config.node_id),
                    )),
                    Some(partition) => broker.append(partition, batch, Acks::All).await.map(|info| info.first_offset),
                },
            };
            encode_json(&method, &answer)
        })
    }
}

/// Serves `partition.append` on this broker's internal RPC.
pub fn register(broker: &Arc<Broker>) {
    broker.cluster.register_service(SERVICE, Arc::new(ForwardService { broker: Arc::downgrade(broker) }));
}

fn encode(topic: &str, index: i32, batch: &[u8]) -> Bytes {
    let mut body = BytesMut::with_capacity(2 + topic.len() + 4 + batch.len());
    body.put_u16(topic.len() as u16);
    body.put_slice(topic.as_bytes());
    body.put_i32(index);
    body.put_slice(batch);
    body.freeze()
}

fn decode(body: &[u8]) -> Option<(String, i32, BytesMut)> {
    let length = usize::from(u16::from_be_bytes(body.get(..2)?.try_into().ok()?));
    let topic = std::str::from_utf8(body.get(2..2 + length)?).ok()?.to_string();
    let index = i32::from_be_bytes(body.get(2 + length..6 + length)?.try_into().ok()?);
    Some((topic, index, BytesMut::from(body.get(6 + length..)?)))
}

impl Broker {
    /// A partition of `topic` for the broker's own append of a message that names none (a
    /// delayed one come due, a committed transactional one): the `turn`-th of those this broker
    /// leads, else of all. `None` when the topic is gone or has no partition.
    pub fn partition_in_turn(&self, topic: &str, turn: usize) -> Option<i32> {
        let count = self.metadata().topic(topic).map(|t| t.partitions).filter(|c| *c > 0)?;
        let led: Vec<i32> = self
            .topic_partitions(topic)
            .unwrap_or_default()
            .iter()
            .flatten()
            .filter(|p| p.check_local_leader().is_ok())
            .map(|p| p.index)
            .collect();
        Some(if led.is_empty() { (turn % count as usize) as i32 } else { led[turn % led.len()] })
    }

    /// Appends `batch` to `topic`-`index` with `acks=all` at the partition's leader: here when
    /// this broker leads it, else forwarded. Returns the first offset.
    pub async fn append_at_leader(&self, topic: &str, index: i32, batch: BytesMut) -> Result<i64, BrokerError> {
        if let Some(partition) = self.partition(topic, index).filter(|p| p.check_local_leader().is_ok()) {
            return self.append(partition, batch, Acks::All).await.map(|info| info.first_offset);
        }
        let metadata = self.metadata();
        let leader = metadata.topic(topic).and_then(|t| t.partition(index)).map_or(-1, |p| p.leader);
        if leader < 0 || leader == self.config.node_id {
            return Err(BrokerError::new(
                ErrorKind::LeaderNotAvailable,
                format!("partition {index} of {topic} has no leader right now"),
            ));
        }
        // Long enough for an acks=all append that waits for the ISR.
        let timeout = Duration::from_millis(self.config.quorum_request_timeout_ms) + Duration::from_secs(30);
        let answer = self.call_broker(leader, APPEND, encode(topic, index, &batch), timeout).await?;
        decode_json::<Result<i64, BrokerError>>(APPEND, &answer)
            .map_err(|e| BrokerError::internal(e.message().to_string()))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forwarded_append_decodes_as_it_was_encoded_and_garbage_does_not() {
        let body = encode("orders", 7, b"batch bytes");
        let (topic, index, batch) = decode(&body).expect("decodes");
        assert_eq!((topic.as_str(), index, &batch[..]), ("orders", 7, &b"batch bytes"[..]));
        assert!(decode(&body[..5]).is_none());
        assert!(decode(&[0xff, 0xff, b'x']).is_none());
    }
}
