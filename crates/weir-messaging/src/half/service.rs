//! The half messages' internal RPCs, answered by the broker that leads the shard named (or, for
//! `half.check`, by any broker whose producers may answer):
//!
//! - `half.prepare`: the length of a JSON [`PrepareRequest`] (u32, big endian), that JSON, then
//!   the message as one batch; answers its offset and transaction id.
//! - `half.end`: a JSON [`EndRequest`]; answers `None` when ended, `Some(why)` when the
//!   transaction is not open.
//! - `half.check`: the length of a JSON [`Pending`], that JSON, then the half message as one
//!   batch; answers whether a producer of this broker was asked.
//!
//! Every answer is JSON: the result, or the error (NOT_COORDINATOR and its kin send the caller
//! to try again).

use std::sync::{Arc, Weak};

use crate::state_topic::{remote_failure, rpc_timeout};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use weir_broker::cluster::{decode_json, encode_json, RemoteError, RpcFuture, RpcHandler};
use weir_broker::{Broker, BrokerError, ErrorKind};
use weir_storage::records::{self, BatchOptions, Record};

use super::store::Pending;
use super::transactions::{CheckSent, TransactionalMessages};

const SERVICE: &str = "half";
const PREPARE: &str = "half.prepare";
const END: &str = "half.end";
const CHECK: &str = "half.check";

/// Where a half message goes, and what it is.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct PrepareRequest {
    pub(crate) shard: i32,
    pub(crate) topic: String,
    pub(crate) message_id: String,
    pub(crate) check_at_ms: i64,
}

/// A producer's decision.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct EndRequest {
    pub(crate) transaction_id: String,
    pub(crate) message_id: String,
    pub(crate) commit: bool,
}

fn encode_with_record<T: serde::Serialize>(head: &T, record: &Record) -> Result<Bytes, BrokerError> {
    let json = serde_json::to_vec(head).map_err(|e| BrokerError::internal(e.to_string()))?;
    let batch = records::encode_batch(std::slice::from_ref(record), &BatchOptions::default())
        .map_err(|e| BrokerError::new(ErrorKind::InvalidRecord, e.to_string()))?;
    let mut body = BytesMut::with_capacity(4 + json.len() + batch.len());
    body.put_u32(json.len() as u32);
    body.put_slice(&json);
    body.put_slice(&batch);
    Ok(body.freeze())
}

fn decode_with_record<T: serde::de::DeserializeOwned>(mut body: Bytes) -> Option<(T, Record)> {
    if body.len() < 4 {
        return None;
    }
    let len = body.get_u32() as usize;
    if body.len() < len {
        return None;
    }
    let head = serde_json::from_slice(&body.split_to(len)).ok()?;
    let mut decoded = records::decode_records(&body).ok()?;
    (decoded.len() == 1).then(|| (head, decoded.remove(0)))
}

struct HalfService {
    transactions: Weak<TransactionalMessages>,
}

impl RpcHandler for HalfService {
    fn handle(&self, method: &str, body: Bytes) -> RpcFuture<'static, Result<Bytes, RemoteError>> {
        let transactions = self.transactions.upgrade();
        let method = method.to_string();
        Box::pin(async move {
            let transactions = transactions.ok_or_else(|| RemoteError::new("the broker is shutting down"))?;
            let malformed = || BrokerError::new(ErrorKind::InvalidRequest, format!("a malformed {method}"));
            match method.as_str() {
                PREPARE => {
                    let answer = match decode_with_record::<PrepareRequest>(body) {
                        Some((request, record)) => transactions.prepare_here(&request, &record).await,
                        None => Err(malformed()),
                    };
                    encode_json(&method, &answer)
                }
                END => {
                    let request: EndRequest = decode_json(&method, &body)?;
                    let answer = transactions.end_here(&request).await;
                    encode_json(&method, &answer)
                }
                CHECK => {
                    let answer = match decode_with_record::<Pending>(body) {
                        Some((pending, record)) => Ok(transactions.check_here(&pending, &record)),
                        None => Err(malformed()),
                    };
                    encode_json(&method, &answer)
                }
                _ => Err(RemoteError::unknown_method(&method)),
            }
        })
    }
}

/// Serves the half messages' RPCs on this broker's internal RPC.
pub(crate) fn register(broker: &Arc<Broker>, transactions: &Arc<TransactionalMessages>) {
    broker.cluster.register_service(SERVICE, Arc::new(HalfService { transactions: Arc::downgrade(transactions) }));
}

pub(crate) async fn call_prepare(
    broker: &Broker,
    node: i32,
    request: &PrepareRequest,
    record: &Record,
) -> Result<(i64, String), BrokerError> {
    let answer = broker.call_broker(node, PREPARE, encode_with_record(request, record)?, rpc_timeout(broker)).await?;
    decode_json::<Result<(i64, String), BrokerError>>(PREPARE, &answer).map_err(remote_failure)?
}

pub(crate) async fn call_end(
    broker: &Broker,
    node: i32,
    request: &EndRequest,
) -> Result<Option<BrokerError>, BrokerError> {
    let body = encode_json(END, request).map_err(remote_failure)?;
    let answer = broker.call_broker(node, END, body, rpc_timeout(broker)).await?;
    decode_json::<Result<Option<BrokerError>, BrokerError>>(END, &answer).map_err(remote_failure)?
}

pub(crate) async fn call_check(
    broker: &Broker,
    node: i32,
    pending: &Pending,
    record: &Record,
) -> Result<CheckSent, BrokerError> {
    let answer = broker.call_broker(node, CHECK, encode_with_record(pending, record)?, rpc_timeout(broker)).await?;
    decode_json::<Result<CheckSent, BrokerError>>(CHECK, &answer).map_err(remote_failure)?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_with_a_record_decodes_as_it_was_encoded_and_garbage_does_not() {
        let request = EndRequest { transaction_id: "H1.x".into(), message_id: "m".into(), commit: true };
        let record = Record::new(5, None, Some(Bytes::from_static(b"body")));
        let body = encode_with_record(&request, &record).expect("encode");
        let (decoded, got): (EndRequest, Record) = decode_with_record(body.clone()).expect("decodes");
        assert_eq!((decoded.transaction_id.as_str(), got.value), ("H1.x", Some(Bytes::from_static(b"body"))));
        assert!(decode_with_record::<EndRequest>(body.slice(..7)).is_none());
        assert!(decode_with_record::<EndRequest>(Bytes::from_static(&[0, 0, 0, 1, b'{'])).is_none());
    }
}
