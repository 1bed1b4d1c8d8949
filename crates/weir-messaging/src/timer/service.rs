//! The timer's internal RPCs: `timer.schedule` and `timer.recall`, answered by the broker that
//! leads the shard named (another broker's schedule or recall comes here over weir-rpc).
//!
//! `timer.schedule`'s body is binary, so the messages are not re-encoded: the length of a JSON
//! [`ScheduleRequest`] (u32, big endian), that JSON, then the messages' batches as the shard
//! stores them. `timer.recall`'s is a JSON [`RecallRequest`]. Both answer with JSON: the result,
//! or the shard's error (NOT_COORDINATOR and its kin send the caller to try again).

use std::sync::{Arc, Weak};

use crate::state_topic::rpc_timeout;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use weir_broker::cluster::{decode_json, encode_json, RemoteError, RpcFuture, RpcHandler};
use weir_broker::{Broker, BrokerError, ErrorKind};

use super::{Recall, Timer};

const SERVICE: &str = "timer";
const SCHEDULE: &str = "timer.schedule";
const RECALL: &str = "timer.recall";

/// Where messages go and when they are due (one due time per batch of the body).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct ScheduleRequest {
    pub(crate) shard: i32,
    pub(crate) dues: Vec<i64>,
}

/// What a recall names.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct RecallRequest {
    pub(crate) shard: i32,
    pub(crate) topic: String,
    pub(crate) due_ms: i64,
    pub(crate) offset: i64,
}

fn encode_schedule(request: &ScheduleRequest, batch: &[u8]) -> Result<Bytes, BrokerError> {
    let json = serde_json::to_vec(request).map_err(|e| BrokerError::internal(e.to_string()))?;
    let mut body = BytesMut::with_capacity(4 + json.len() + batch.len());
    body.put_u32(json.len() as u32);
    body.put_slice(&json);
    body.put_slice(batch);
    Ok(body.freeze())
}

fn decode_schedule(mut body: Bytes) -> Option<(ScheduleRequest, BytesMut)> {
    if body.len() < 4 {
        return None;
    }
    let len = body.get_u32() as usize;
    if body.len() < len {
        return None;
    }
    let request = serde_json::from_slice(&body.split_to(len)).ok()?;
    Some((request, BytesMut::from(&body[..])))
}

struct TimerService {
    timer: Weak<Timer>,
}

impl RpcHandler for TimerService {
    fn handle(&self, method: &str, body: Bytes) -> RpcFuture<'static, Result<Bytes, RemoteError>> {
        let timer = self.timer.upgrade();
        let method = method.to_string();
        Box::pin(async move {
            let timer = timer.ok_or_else(|| RemoteError::new("the broker is shutting down"))?;
            match method.as_str() {
                SCHEDULE => {
                    let answer = match decode_schedule(body) {
                        Some((request, batch)) => timer.schedule_here(request, batch).await,
                        None => Err(BrokerError::new(ErrorKind::InvalidRequest, "a malformed timer.schedule")),
                    };
                    encode_json(&method, &answer)
                }
                RECALL => {
                    let request: RecallRequest = decode_json(&method, &body)?;
                    let answer = timer.recall_here(&request).await;
                    encode_json(&method, &answer)
                }
                _ => Err(RemoteError::unknown_method(&method)),
            }
        })
    }
}

/// Serves the timer's RPCs on this broker's internal RPC.
pub(crate) fn register(broker: &Arc<Broker>, timer: &Arc<Timer>) {
    broker.cluster.register_service(SERVICE, Arc::new(TimerService { timer: Arc::downgrade(timer) }));
}

pub(crate) async fn call_schedule(
    broker: &Broker,
    node: i32,
    request: &ScheduleRequest,
    batch: &[u8],
) -> Result<i64, BrokerError> {
    let answer = broker.call_broker(node, SCHEDULE, encode_schedule(request, batch)?, rpc_timeout(broker)).await?;
    decode_json::<Result<i64, BrokerError>>(SCHEDULE, &answer)
        .map_err(|e| BrokerError::internal(e.message().to_string()))?
}

pub(crate) async fn call_recall(broker: &Broker, node: i32, request: &RecallRequest) -> Result<Recall, BrokerError> {
    let body = encode_json(RECALL, request).map_err(|e| BrokerError::internal(e.message().to_string()))?;
    let answer = broker.call_broker(node, RECALL, body, rpc_timeout(broker)).await?;
    decode_json::<Result<Recall, BrokerError>>(RECALL, &answer)
        .map_err(|e| BrokerError::internal(e.message().to_string()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_body_decodes_as_it_was_encoded_and_garbage_does_not() {
        let request = ScheduleRequest { shard: 3, dues: vec![5, 6] };
        let body = encode_schedule(&request, b"batches").expect("encode");
        let (decoded, batch) = decode_schedule(body.clone()).expect("decodes");
        assert_eq!((decoded.shard, decoded.dues, &batch[..]), (3, vec![5, 6], &b"batches"[..]));
        assert!(decode_schedule(body.slice(..6)).is_none());
        assert!(decode_schedule(Bytes::from_static(&[0, 0, 0, 2, b'{', b'x'])).is_none());
    }
}
