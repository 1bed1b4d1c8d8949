//! ReceiveMessage's answers and the receipt handles that AckMessage, ChangeInvisibleDuration
//! and ForwardMessageToDeadLetterQueue give back. Which messages a receive hands out, and what
//! an ack or a change does, is the core's invisible-time engine ([`weir_messaging::pop`]); this
//! module only presents its deliveries to RocketMQ clients.
//!
//! A receipt handle names the delivery: `w1.<partition>.<offset>.<nonce>`, the nonce the one
//! the core keeps with the in-flight message. A handle of an earlier delivery, of an acked
//! message, or made up gets `INVALID_RECEIPT_HANDLE`.

use std::time::Duration;

use weir_broker::message::Message;
use weir_broker::Broker;
use weir_messaging::pop::Delivery;
use weir_messaging::pop::{HandleError, QueueKey};

use crate::proto::{self, receive_message_response::Content, Code, ReceiveMessageResponse};
use crate::status::{self, status};

/// A receipt handle's parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handle {
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) nonce: u64,
}

impl Handle {
    /// The handle's text; [`Handle::decode`] gives this handle back (asserted in debug builds:
    /// a handle that does not round-trip would make its message unackable).
    pub(crate) fn encode(&self) -> String {
        let text = format!("w1.{}.{}.{:016x}", self.partition, self.offset, self.nonce);
        debug_assert_eq!(Handle::decode(&text), Some(*self), "receipt handle {text:?} does not round-trip");
        text
    }

    pub(crate) fn decode(text: &str) -> Option<Handle> {
        let mut parts = text.strip_prefix("w1.")?.split('.');
        let partition = parts.next()?.parse().ok().filter(|p: &i32| *p >= 0)?;
        let offset = parts.next()?.parse().ok().filter(|o: &i64| *o >= 0)?;
        let nonce_text = parts.next()?;
        if nonce_text.len() != 16 || parts.next().is_some() {
            return None;
        }
        let nonce = u64::from_str_radix(nonce_text, 16).ok()?;
        Some(Handle { partition, offset, nonce })
    }
}

/// The status of a refused ack or change.
pub(crate) fn handle_status(error: HandleError) -> proto::Status {
    match error {
        HandleError::NotInFlight => status(
            Code::InvalidReceiptHandle,
            "the receipt handle names no message in flight (acked already, or never delivered)",
        ),
        HandleError::Stale => status(
            Code::InvalidReceiptHandle,
            "the receipt handle is stale: the message was delivered again or its invisible time changed",
        ),
    }
}

/// A receive's answer of only `status`.
pub(crate) fn status_response(status: proto::Status) -> ReceiveMessageResponse {
    ReceiveMessageResponse { content: Some(Content::Status(status)) }
}

/// The answer of a receive that found nothing before its deadline.
pub(crate) fn not_found() -> Vec<ReceiveMessageResponse> {
    vec![status_response(status(Code::MessageNotFound, "no new message"))]
}

/// A protobuf timestamp of milliseconds since the epoch.
pub(crate) fn timestamp(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: ms.div_euclid(1000), nanos: (ms.rem_euclid(1000) * 1_000_000) as i32 }
}

/// The answer of a receive that handed out `found` (each queue's deliveries; not empty), each
/// invisible for `invisible`.
pub(crate) fn found(
    broker: &Broker,
    invisible: Duration,
    found: Vec<(QueueKey, Vec<Delivery>)>,
) -> Vec<ReceiveMessageResponse> {
    debug_assert!(found.iter().any(|(_, d)| !d.is_empty()), "an empty receive is not found");
    let count: usize = found.iter().map(|(_, d)| d.len()).sum();
    let mut responses = Vec::with_capacity(count + 2);
    responses.push(status_response(status::ok()));
    responses.push(ReceiveMessageResponse { content: Some(Content::DeliveryTimestamp(timestamp(broker.now_ms()))) });
    let store_host = format!("{}:{}", broker.config.advertised_host, broker.config.rocketmq_advertised_port);
    for (key, deliveries) in found {
        for delivery in deliveries {
            let message = Message::from_record(&key.topic, key.partition, &delivery.record);
            let handle = Handle { partition: key.partition, offset: delivery.record.offset, nonce: delivery.nonce };
            responses.push(ReceiveMessageResponse {
                content: Some(Content::Message(to_proto(
                    &key.topic,
                    message,
                    &delivery,
                    handle,
                    invisible,
                    &store_host,
                ))),
            });
        }
    }
    responses
}

/// `message` as RocketMQ's protobuf (taken by value: its strings move, not copied).
fn to_proto(
    topic: &str,
    message: Message,
    delivery: &Delivery,
    handle: Handle,
    invisible: Duration,
    store_host: &str,
) -> proto::Message {
    let body = message.body;
    let digest = format!("{:08X}", crc32fast::hash(&body));
    let message_type =
        if message.message_group.is_some() { proto::MessageType::Fifo } else { proto::MessageType::Normal };
    let system = proto::SystemProperties {
        tag: message.tag,
        keys: message.keys,
        message_id: message.message_id.unwrap_or_default(),
        body_digest: Some(proto::Digest { r#type: proto::DigestType::Crc32 as i32, checksum: digest }),
        body_encoding: proto::Encoding::Identity as i32,
        message_type: message_type as i32,
        born_timestamp: Some(timestamp(message.born_timestamp_ms.unwrap_or(delivery.record.timestamp))),
        born_host: message.born_host.unwrap_or_default(),
        store_timestamp: Some(timestamp(delivery.record.timestamp)),
        store_host: store_host.to_string(),
        delivery_timestamp: message.delivery_timestamp_ms.map(timestamp),
        receipt_handle: Some(handle.encode()),
        queue_id: handle.partition,
        queue_offset: Some(delivery.record.offset),
        invisible_duration: Some(prost_types::Duration {
            seconds: invisible.as_secs() as i64,
            nanos: invisible.subsec_nanos() as i32,
        }),
        delivery_attempt: Some(delivery.attempt as i32),
        message_group: message.message_group,
        ..Default::default()
    };
    proto::Message {
        topic: Some(proto::Resource { resource_namespace: String::new(), name: topic.to_string() }),
        user_properties: message.properties.into_iter().collect(),
        system_properties: Some(system),
        body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_made_up_ones_do_not_decode() {
        let handle = Handle { partition: 3, offset: 1_234_567, nonce: 0xdead_beef_0000_0001 };
        assert_eq!(Handle::decode(&handle.encode()), Some(handle));
        for bogus in [
            "",
            "w1.",
            "w1.3.4",
            "w1.3.4.5",
            "w1.-1.4.00000000000000ff",
            "w2.3.4.00000000000000ff",
            "w1.3.4.00000000000000ff.x",
        ] {
            assert_eq!(Handle::decode(bogus), None, "{bogus}");
        }
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "does not round-trip")]
    fn a_receipt_handle_that_does_not_round_trip_is_caught() {
        let _ = Handle { partition: -1, offset: 5, nonce: 1 }.encode();
    }
}
