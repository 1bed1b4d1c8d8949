//! Appends of FIFO messages at the broker leading their queue, in a cluster.
//!
//! A message with a message group goes to the queue its group hashes to (so one group keeps one
//! queue, and Kafka producers keying by the group land in the same one). A RocketMQ client
//! picks the broker to send to with its own hash of the group, which need not name the same
//! queue: the broker it reached forwards the batch to the queue's leader over the internal RPC
//! (`rocketmq.append`), and answers the client with the leader's answer.
//!
//! The request body is binary, so a batch is not re-encoded: the topic's length (u16, big
//! endian), the topic, the partition (i32), then the RecordBatch. The answer is JSON: the first
//! offset, or the leader's error.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use weir_broker::cluster::{decode_json, encode_json, RemoteError, RpcFuture, RpcHandler};
use weir_broker::{Acks, Broker, BrokerError, ErrorKind};

const SERVICE: &str = "rocketmq";
const APPEND: &str = "rocketmq.append";

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

/// Serves `rocketmq.append` on this broker's internal RPC.
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

/// Appends `batch` to `topic`-`index` at its leader, another broker; returns the first offset.
pub async fn append_at_leader(broker: &Broker, topic: &str, index: i32, batch: &[u8]) -> Result<i64, BrokerError> {
    let metadata = broker.metadata();
    let leader = metadata.topic(topic).and_then(|t| t.partition(index)).map_or(-1, |p| p.leader);
    if leader < 0 || leader == broker.config.node_id {
        return Err(BrokerError::new(
            ErrorKind::LeaderNotAvailable,
            format!("the queue {index} of {topic} has no leader right now"),
        ));
    }
    // Long enough for an acks=all append that waits for the ISR.
    let timeout = Duration::from_millis(broker.config.quorum_request_timeout_ms) + Duration::from_secs(30);
    let answer = broker.call_broker(leader, APPEND, encode(topic, index, batch), timeout).await?;
    decode_json::<Result<i64, BrokerError>>(APPEND, &answer)
        .map_err(|e| BrokerError::internal(e.message().to_string()))?
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
