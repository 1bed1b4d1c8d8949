//! SendMessage: RocketMQ messages become records ([`weir_broker::message`]) appended to the
//! topic's partitions.
//!
//! The request names no queue: RocketMQ clients pick a broker from the route, and the broker
//! picks the queue. Weir picks, among the partitions this broker leads, the one of the message
//! group (Kafka's murmur2 partitioner over all partitions, so one group keeps one queue and a
//! Kafka producer keying by the group agrees), or the next in turn for messages without one.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use weir_broker::message::Message;
use weir_broker::partitioner::partition_for_key;
use weir_broker::storage::records::{self, BatchOptions, Record};
use weir_broker::topic_config::MessageType;
use weir_broker::{Acks, BrokerError, ErrorKind, Partition};
use weir_messaging::Messaging;

use crate::proto::{self, Code, SendResultEntry};
use crate::recall::RecallHandle;
use crate::status;

/// The longest tag, key, message group or property accepted (RocketMQ's proxies allow far
/// less in a property; this bounds what one message can make the broker store in headers).
pub(crate) const MAX_PROPERTY_CHARS: usize = 16 * 1024;

/// One message of a request, validated, with the partition it goes to.
struct Placed {
    index: usize,
    message: Message,
}

/// Refuses what RocketMQ refuses before a message is stored. `topic_type` is the topic's
/// `message.type`: as RocketMQ's proxy does by default, a message of another type is refused
/// (clients check too, but not all of them: the Rust client does not).
pub(crate) fn validate(
    message: &proto::Message,
    max_body_bytes: usize,
    topic_type: MessageType,
    max_delay_ms: i64,
) -> Result<Message, proto::Status> {
    let system = message.system_properties.clone().unwrap_or_default();
    check_body(message, &system, max_body_bytes)?;
    check_properties(message, &system)?;
    let delivery_ms = system.delivery_timestamp.as_ref().map(timestamp_ms);
    check_delivery_time(delivery_ms, max_delay_ms)?;
    check_type(&system, delivery_ms, topic_type)?;
    let mut properties: Vec<(String, String)> =
        message.user_properties.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
    // A map has no order on the wire; sorted, the stored headers are the same for the same map.
    properties.sort();
    Ok(Message {
        body: message.body.clone(),
        tag: system.tag.clone(),
        keys: system.keys.clone(),
        message_id: (!system.message_id.is_empty()).then(|| system.message_id.clone()),
        properties,
        born_timestamp_ms: system.born_timestamp.as_ref().map(timestamp_ms),
        born_host: (!system.born_host.is_empty()).then(|| system.born_host.clone()),
        message_group: system.message_group.clone(),
        delivery_timestamp_ms: delivery_ms,
    })
}

/// A body must be there, fit the topic's limit, and be stored as sent (no gzip).
fn check_body(
    message: &proto::Message,
    system: &proto::SystemProperties,
    max_body_bytes: usize,
) -> Result<(), proto::Status> {
    if message.body.is_empty() {
        return Err(status::status(Code::MessageBodyEmpty, "the message body is empty"));
    }
    if message.body.len() > max_body_bytes {
        return Err(status::status(
            Code::MessageBodyTooLarge,
            format!("the message body is {} bytes; this topic takes at most {max_body_bytes}", message.body.len()),
        ));
    }
    if system.body_encoding == proto::Encoding::Gzip as i32 {
        return Err(status::status(Code::Unsupported, "gzip-encoded bodies are not supported; send them as identity"));
    }
    Ok(())
}

/// Tags, keys, the message group and user properties: not blank, not too long, and no user
/// property in the broker's own namespace.
fn check_properties(message: &proto::Message, system: &proto::SystemProperties) -> Result<(), proto::Status> {
    if let Some(tag) = &system.tag {
        if tag.trim().is_empty() || tag.contains("||") || tag.len() > MAX_PROPERTY_CHARS {
            return Err(status::status(
                Code::IllegalMessageTag,
                format!("tag {tag:?} is blank, contains '||' or is too long"),
            ));
        }
    }
    for key in &system.keys {
        if key.trim().is_empty() || key.len() > MAX_PROPERTY_CHARS {
            return Err(status::status(Code::IllegalMessageKey, "a message key is blank or too long"));
        }
    }
    if let Some(group) = &system.message_group {
        if group.trim().is_empty() || group.len() > MAX_PROPERTY_CHARS {
            return Err(status::status(Code::IllegalMessageGroup, "the message group is blank or too long"));
        }
    }
    for (name, value) in &message.user_properties {
        if name.is_empty() || name.starts_with(weir_broker::message::headers::RESERVED_PREFIX) {
            return Err(status::status(
                Code::IllegalMessagePropertyKey,
                format!("property name {name:?} is empty or starts with the reserved prefix 'weir.'"),
            ));
        }
        if name.len() + value.len() > MAX_PROPERTY_CHARS {
            return Err(status::status(Code::MessagePropertiesTooLarge, format!("property {name:?} is too large")));
        }
    }
    Ok(())
}

/// A delivery time no further away than the topic's `message.delay.max.ms`.
fn check_delivery_time(delivery_ms: Option<i64>, max_delay_ms: i64) -> Result<(), proto::Status> {
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    if let Some(at) = delivery_ms {
        if at.saturating_sub(now_ms) > max_delay_ms {
            return Err(status::status(
                Code::IllegalDeliveryTime,
                format!(
                    "the delivery time is {} ms away; this topic takes at most {max_delay_ms} ms (message.delay.max.ms)",
                    at - now_ms
                ),
            ));
        }
    }
    Ok(())
}

/// The message's type must be the topic's: as the client says, else as its properties make it.
fn check_type(
    system: &proto::SystemProperties,
    delivery_ms: Option<i64>,
    topic_type: MessageType,
) -> Result<(), proto::Status> {
    let kind = match proto::MessageType::try_from(system.message_type) {
        Ok(proto::MessageType::Transaction) if delivery_ms.is_some() || system.message_group.is_some() => {
            return Err(status::status(
                Code::MessagePropertyConflictWithType,
                "a transactional message can have neither a delivery time nor a message group",
            ));
        }
        Ok(proto::MessageType::Transaction) => MessageType::Transaction,
        Ok(proto::MessageType::Fifo) => MessageType::Fifo,
        Ok(proto::MessageType::Normal) => MessageType::Normal,
        Ok(proto::MessageType::Delay) => MessageType::Delay,
        _ if delivery_ms.is_some() => MessageType::Delay,
        _ if system.message_group.is_some() => MessageType::Fifo,
        _ => MessageType::Normal,
    };
    if kind == MessageType::Delay && delivery_ms.is_none() {
        return Err(status::status(Code::IllegalDeliveryTime, "a DELAY message needs a delivery timestamp"));
    }
    if kind != topic_type {
        return Err(status::status(
            Code::MessagePropertyConflictWithType,
            format!(
                "a {} message cannot go to a {} topic{}",
                kind.name(),
                topic_type.name(),
                match kind {
                    MessageType::Fifo => " (a message group makes a message FIFO)",
                    MessageType::Delay => " (a delivery timestamp makes a message DELAY)",
                    _ => "",
                }
            ),
        ));
    }
    Ok(())
}

/// Milliseconds since the epoch of a protobuf timestamp.
pub(crate) fn timestamp_ms(t: &prost_types::Timestamp) -> i64 {
    t.seconds.saturating_mul(1000).saturating_add(i64::from(t.nanos / 1_000_000))
}

/// Chooses partitions for messages without a group, in turn.
#[derive(Default)]
pub(crate) struct RoundRobin(AtomicU32);

impl RoundRobin {
    fn next(&self, count: usize) -> usize {
        self.0.fetch_add(1, Ordering::Relaxed) as usize % count.max(1)
    }
}

/// Where the messages of one topic go.
pub(crate) struct Target<'a> {
    pub(crate) topic: &'a str,
    /// The topic's partition count.
    pub(crate) count: i32,
    /// This broker's partitions of the topic, by index (`None`: hosted elsewhere).
    pub(crate) partitions: &'a [Option<Arc<Partition>>],
    /// The indexes of those this broker leads.
    pub(crate) led: &'a [i32],
}

/// Appends the validated `messages` of one topic (request order) and answers one entry per
/// message. Messages without a group go to a queue this broker leads, in turn; a message
/// group's queue led elsewhere gets its messages forwarded to its leader.
pub(crate) async fn append(
    messaging: &Arc<Messaging>,
    target: Target<'_>,
    messages: Vec<(usize, Message)>,
    round_robin: &RoundRobin,
    entries: &mut [SendResultEntry],
) {
    let Target { topic, count, partitions, led } = target;
    let broker = messaging.broker();
    let now = broker.now_ms();
    // Delayed messages go to the timer store, to be appended when they are due.
    let (delayed, messages): (Vec<_>, Vec<_>) =
        messages.into_iter().partition(|(_, m)| m.delivery_timestamp_ms.is_some_and(|at| at > now));
    if !delayed.is_empty() {
        schedule(messaging, topic, delayed, now, entries).await;
    }
    let mut by_partition: BTreeMap<i32, Vec<Placed>> = BTreeMap::new();
    for (index, message) in messages {
        let partition = match (&message.message_group, led.is_empty()) {
            (Some(group), _) if count > 0 => partition_for_key(group.as_bytes(), count),
            (None, false) => led[round_robin.next(led.len())],
            _ => {
                let error = BrokerError::new(
                    ErrorKind::NotLeader,
                    format!("this broker leads no queue of {topic}; refresh the route"),
                );
                fail(entries, &[Placed { index, message }], &error);
                continue;
            }
        };
        by_partition.entry(partition).or_default().push(Placed { index, message });
    }
    let mut appends = Vec::with_capacity(by_partition.len());
    let mut placed = Vec::with_capacity(by_partition.len());
    let mut forwarded = Vec::new();
    for (partition, messages) in by_partition {
        let records: Vec<Record> = messages.iter().map(|p| p.message.to_record(now)).collect();
        // A replica here that another broker leads (a queue moving, or just moved) is written
        // through its leader, like one hosted elsewhere.
        let target = partitions
            .get(partition as usize)
            .and_then(Option::as_ref)
            .filter(|p| p.state().leader == broker.config.node_id);
        match (target, records::encode_batch(&records, &BatchOptions::default())) {
            (Some(target), Ok(batch)) => {
                appends.push((target.clone(), batch.clone()));
                placed.push((partition, batch, messages));
            }
            // A message group's queue led by another broker: the append goes there.
            (None, Ok(batch)) => forwarded.push((partition, batch, messages)),
            (_, Err(e)) => fail(entries, &messages, &BrokerError::new(ErrorKind::Internal, e.to_string())),
        }
    }
    let results = broker.append_many(appends, Acks::All).await;
    for ((partition, batch, messages), result) in placed.into_iter().zip(results) {
        match result {
            Ok(info) => succeed(entries, &messages, info.first_offset),
            // Leadership moved while the request waited: its new leader takes it, as the
            // producer would resend it there. If the write here made it to the new leader
            // before the move, the message is there twice: RocketMQ's sends are at least once.
            Err(e) if e.kind == ErrorKind::NotLeader => forwarded.push((partition, batch, messages)),
            Err(e) => fail(entries, &messages, &e),
        }
    }
    // Requests carry one message, or a few: the forwarded appends go one after the other.
    for (partition, batch, messages) in &forwarded {
        match broker.append_at_leader(topic, *partition, batch.clone()).await {
            Ok(first_offset) => succeed(entries, messages, first_offset),
            Err(e) => fail(entries, messages, &e),
        }
    }
}

/// Hands delayed messages to the timer store; their offsets in the answer are their shard's.
async fn schedule(
    messaging: &Messaging,
    topic: &str,
    delayed: Vec<(usize, Message)>,
    now: i64,
    entries: &mut [SendResultEntry],
) {
    let records: Vec<Record> = delayed.iter().map(|(_, m)| m.to_record(now)).collect();
    let placed: Vec<Placed> = delayed.into_iter().map(|(index, message)| Placed { index, message }).collect();
    match messaging.timer.schedule(topic, None, records).await {
        Ok(scheduled) => {
            succeed(entries, &placed, scheduled.first_offset);
            // Each can be recalled until it is due: the handle says where it waits.
            for (position, p) in placed.iter().enumerate() {
                let due_ms = p.message.delivery_timestamp_ms.unwrap_or_default();
                let handle =
                    RecallHandle { shard: scheduled.shard, offset: scheduled.first_offset + position as i64, due_ms };
                entries[p.index].recall_handle = handle.encode();
            }
        }
        Err(e) => fail(entries, &placed, &e),
    }
}

fn succeed(entries: &mut [SendResultEntry], messages: &[Placed], first_offset: i64) {
    for (position, p) in messages.iter().enumerate() {
        entries[p.index] = SendResultEntry {
            status: Some(status::ok()),
            message_id: p.message.id().to_string(),
            transaction_id: String::new(),
            offset: first_offset + position as i64,
            recall_handle: String::new(),
        };
    }
}

fn fail(entries: &mut [SendResultEntry], messages: &[Placed], error: &BrokerError) {
    tracing::debug!(error = %error, "RocketMQ send refused");
    for p in messages {
        entries[p.index] = SendResultEntry {
            status: Some(status::of_error(error)),
            message_id: p.message.id().to_string(),
            ..SendResultEntry::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(body: &[u8]) -> proto::Message {
        proto::Message {
            topic: None,
            user_properties: Default::default(),
            system_properties: Some(proto::SystemProperties { message_id: "01AB".into(), ..Default::default() }),
            body: bytes::Bytes::copy_from_slice(body),
        }
    }

    const WEEK_MS: i64 = 7 * 24 * 3600 * 1000;

    fn code(result: Result<Message, proto::Status>) -> i32 {
        result.err().map_or(Code::Ok as i32, |s| s.code)
    }

    #[test]
    fn what_rocketmq_refuses_gets_its_status() {
        assert_eq!(code(validate(&message(b""), 10, MessageType::Normal, WEEK_MS)), Code::MessageBodyEmpty as i32);
        assert_eq!(
            code(validate(&message(b"01234567890"), 10, MessageType::Normal, WEEK_MS)),
            Code::MessageBodyTooLarge as i32
        );
        let mut tagged = message(b"x");
        if let Some(system) = tagged.system_properties.as_mut() {
            system.tag = Some("a||b".into());
        }
        assert_eq!(code(validate(&tagged, 10, MessageType::Normal, WEEK_MS)), Code::IllegalMessageTag as i32);
        let mut reserved = message(b"x");
        reserved.user_properties.insert("weir.tag".into(), "x".into());
        assert_eq!(code(validate(&reserved, 10, MessageType::Normal, WEEK_MS)), Code::IllegalMessagePropertyKey as i32);
        let valid = validate(&message(b"x"), 10, MessageType::Normal, WEEK_MS).expect("a valid message");
        assert_eq!(valid.message_id.as_deref(), Some("01AB"));
    }

    #[test]
    fn a_message_of_another_type_than_its_topics_is_refused() {
        let conflict = Code::MessagePropertyConflictWithType as i32;
        let mut fifo = message(b"x");
        if let Some(system) = fifo.system_properties.as_mut() {
            system.message_group = Some("orders".into()); // no type given: the group makes it FIFO
        }
        assert_eq!(code(validate(&fifo, 10, MessageType::Normal, WEEK_MS)), conflict);
        assert_eq!(code(validate(&fifo, 10, MessageType::Fifo, WEEK_MS)), Code::Ok as i32);
        assert_eq!(code(validate(&message(b"x"), 10, MessageType::Fifo, WEEK_MS)), conflict);
        let mut typed = message(b"x");
        if let Some(system) = typed.system_properties.as_mut() {
            system.message_type = proto::MessageType::Fifo as i32;
        }
        assert_eq!(code(validate(&typed, 10, MessageType::Normal, WEEK_MS)), conflict);
        assert_eq!(code(validate(&message(b"x"), 10, MessageType::Delay, WEEK_MS)), conflict);
    }

    #[test]
    fn a_delayed_message_needs_a_delay_topic_and_a_delivery_time_within_its_limit() {
        let now_s =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        let delayed = |in_s: i64| {
            let mut m = message(b"x");
            if let Some(system) = m.system_properties.as_mut() {
                system.delivery_timestamp = Some(prost_types::Timestamp { seconds: now_s + in_s, nanos: 0 });
            }
            m
        };
        let valid = validate(&delayed(60), 10, MessageType::Delay, WEEK_MS).expect("a valid delayed message");
        assert_eq!(valid.delivery_timestamp_ms, Some((now_s + 60) * 1000));
        let conflict = Code::MessagePropertyConflictWithType as i32;
        assert_eq!(code(validate(&delayed(60), 10, MessageType::Normal, WEEK_MS)), conflict);
        assert_eq!(
            code(validate(&delayed(8 * 24 * 3600), 10, MessageType::Delay, WEEK_MS)),
            Code::IllegalDeliveryTime as i32
        );
        assert_eq!(code(validate(&delayed(120), 10, MessageType::Delay, 60_000)), Code::IllegalDeliveryTime as i32);
        let mut untimed = message(b"x");
        if let Some(system) = untimed.system_properties.as_mut() {
            system.message_type = proto::MessageType::Delay as i32;
        }
        assert_eq!(code(validate(&untimed, 10, MessageType::Delay, WEEK_MS)), Code::IllegalDeliveryTime as i32);
    }
}
