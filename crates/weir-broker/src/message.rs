//! One message model for every protocol: what a RocketMQ message carries beyond a Kafka record,
//! and where each part lives in the record a Kafka client reads.
//!
//! A message is stored as one record:
//! - the body is the record's value;
//! - the message group, when there is one, is also the record's key, so a Kafka producer keying
//!   by the group lands in the same queue as a RocketMQ producer sending in that group;
//! - the message's system properties are record headers named `weir.*` ([`headers`]): the tag,
//!   each key (one header per key, in order), the message id, the born time and host, the
//!   message group and the delivery time;
//! - each user property is a header of its own name (names starting with `weir.` are reserved).
//!
//! Read the other way, any record is a message: no `weir.tag` header means untagged; a record
//! without `weir.message-id` gets an id derived from where it is stored (topic, partition,
//! offset), the same on every delivery; its other headers are its user properties (values that
//! are not UTF-8 are replaced, a name given twice keeps its last value, as a map must).

use bytes::Bytes;
use weir_storage::records::{Header, Record};

/// The names of the headers that carry a message's system properties.
pub mod headers {
    /// The prefix of every header Weir gives a meaning to; not a user property.
    pub const RESERVED_PREFIX: &str = "weir.";
    /// The message's tag (RocketMQ's `TAGS`), used by server-side filtering.
    pub const TAG: &str = "weir.tag";
    /// One of the message's keys (RocketMQ's `KEYS`); a header per key.
    pub const KEY: &str = "weir.key";
    /// The id the producer gave the message.
    pub const MESSAGE_ID: &str = "weir.message-id";
    /// When the producer created the message, in milliseconds since the epoch (decimal).
    pub(crate) const BORN_TIMESTAMP: &str = "weir.born-timestamp";
    /// The producer's host.
    pub(crate) const BORN_HOST: &str = "weir.born-host";
    /// The FIFO message group.
    pub(crate) const MESSAGE_GROUP: &str = "weir.message-group";
    /// When the message is to become visible, in milliseconds since the epoch (decimal).
    pub const DELIVERY_TIMESTAMP: &str = "weir.delivery-timestamp";
    /// A dead letter's original topic, partition (queue) and offset there.
    pub const ORIGIN_TOPIC: &str = "weir.origin-topic";
    pub const ORIGIN_PARTITION: &str = "weir.origin-partition";
    pub const ORIGIN_OFFSET: &str = "weir.origin-offset";
    /// How many times a dead letter was delivered before it was given up on (decimal).
    pub const DELIVERY_ATTEMPTS: &str = "weir.delivery-attempts";
}

/// The user properties under which RocketMQ clients see a dead letter's origin (RocketMQ's own
/// names for them).
pub(crate) mod dead_letter_properties {
    pub const ORIGIN_TOPIC: &str = "DLQ_ORIGIN_TOPIC";
    pub(crate) const ORIGIN_MESSAGE_ID: &str = "DLQ_ORIGIN_MESSAGE_ID";
}

/// A message as every front-end sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    pub body: Bytes,
    pub tag: Option<String>,
    pub keys: Vec<String>,
    pub message_id: Option<String>,
    /// User properties, in order; names are unique and do not start with `weir.`.
    pub properties: Vec<(String, String)>,
    pub born_timestamp_ms: Option<i64>,
    pub born_host: Option<String>,
    pub message_group: Option<String>,
    pub delivery_timestamp_ms: Option<i64>,
}

impl Message {
    /// The record that stores this message, with `timestamp` as its create time.
    pub fn to_record(&self, timestamp: i64) -> Record {
        let key = self.message_group.as_ref().map(|g| Bytes::from(g.clone()));
        let mut record = Record::new(timestamp, key, Some(self.body.clone()));
        let mut push =
            |name: &str, value: &str| record.headers.push(Header::new(name, Some(Bytes::from(value.to_string()))));
        if let Some(tag) = &self.tag {
            push(headers::TAG, tag);
        }
        for key in &self.keys {
            push(headers::KEY, key);
        }
        if let Some(id) = &self.message_id {
            push(headers::MESSAGE_ID, id);
        }
        if let Some(born) = self.born_timestamp_ms {
            push(headers::BORN_TIMESTAMP, &born.to_string());
        }
        if let Some(host) = &self.born_host {
            push(headers::BORN_HOST, host);
        }
        if let Some(group) = &self.message_group {
            push(headers::MESSAGE_GROUP, group);
        }
        if let Some(at) = self.delivery_timestamp_ms {
            push(headers::DELIVERY_TIMESTAMP, &at.to_string());
        }
        for (name, value) in &self.properties {
            push(name, value);
        }
        record
    }

    /// The message a stored record is, read from `topic`-`partition` at its offset.
    pub fn from_record(topic: &str, partition: i32, record: &Record) -> Message {
        let mut message = Message { body: record.value.clone().unwrap_or_default(), ..Message::default() };
        let mut origin_topic = None;
        for header in &record.headers {
            let text = || header.value.as_deref().map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default();
            match header.name.as_str() {
                headers::TAG => message.tag = Some(text()),
                headers::KEY => message.keys.push(text()),
                headers::MESSAGE_ID => message.message_id = Some(text()),
                headers::BORN_TIMESTAMP => message.born_timestamp_ms = text().parse().ok(),
                headers::BORN_HOST => message.born_host = Some(text()),
                headers::MESSAGE_GROUP => message.message_group = Some(text()),
                headers::DELIVERY_TIMESTAMP => message.delivery_timestamp_ms = text().parse().ok(),
                headers::ORIGIN_TOPIC => origin_topic = Some(text()),
                name if name.starts_with(headers::RESERVED_PREFIX) => {}
                name => {
                    let value = text();
                    match message.properties.iter_mut().find(|(n, _)| n == name) {
                        Some(existing) => existing.1 = value,
                        None => message.properties.push((name.to_string(), value)),
                    }
                }
            }
        }
        if message.message_id.is_none() {
            message.message_id = Some(derived_message_id(topic, partition, record.offset));
        }
        if let Some(origin) = origin_topic {
            // A dead letter keeps its message id: the original's.
            let id = message.id().to_string();
            for (name, value) in
                [(dead_letter_properties::ORIGIN_TOPIC, origin), (dead_letter_properties::ORIGIN_MESSAGE_ID, id)]
            {
                message.properties.retain(|(n, _)| n != name);
                message.properties.push((name.to_string(), value));
            }
        }
        message
    }

    /// The message's id: the producer's, or the one derived from where it is stored.
    pub fn id(&self) -> &str {
        self.message_id.as_deref().unwrap_or_default()
    }
}

/// The message group a record is ordered by under FIFO consumption: its `weir.message-group`
/// header, else its key (what a Kafka producer orders by); `None` for neither.
pub fn fifo_group(record: &Record) -> Option<&[u8]> {
    match record.headers.iter().rev().find(|h| h.name == headers::MESSAGE_GROUP) {
        Some(header) => header.value.as_deref(),
        None => record.key.as_deref(),
    }
}

/// The id of a record stored without one (a Kafka client's): 34 upper-case hex digits, as long as
/// a RocketMQ 5 message id, made of a version byte `00` (RocketMQ's own ids start `01`), a hash
/// of the topic, the partition and the offset. The same record always gets the same id.
pub fn derived_message_id(topic: &str, partition: i32, offset: i64) -> String {
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let topic_hash = topic.bytes().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    format!("00{topic_hash:08X}{:08X}{:016X}", partition as u32, offset as u64)
}

/// Longest message id a lookup takes: RocketMQ's are 32 (4.x) or 34 (5.x) hex digits.
pub(crate) const MESSAGE_ID_LEN_MAX: usize = 64;

/// Whether `id` can be a message id: hex digits, as every RocketMQ client and Weir itself make
/// them, at most `MESSAGE_ID_LEN_MAX`.
pub fn is_message_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MESSAGE_ID_LEN_MAX && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The partition and offset a [`derived_message_id`] of `topic` names; `None` for any other id.
pub fn parse_derived_message_id(topic: &str, id: &str) -> Option<(i32, i64)> {
    if id.len() != 34 || !id.starts_with("00") || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let partition = u32::from_str_radix(&id[10..18], 16).ok()? as i32;
    let offset = u64::from_str_radix(&id[18..], 16).ok()? as i64;
    (derived_message_id(topic, partition, offset) == id.to_ascii_uppercase()).then_some((partition, offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_derived_message_id_names_its_partition_and_offset_in_its_topic_only() {
        let id = derived_message_id("orders", 3, 123_456);
        assert_eq!(parse_derived_message_id("orders", &id), Some((3, 123_456)));
        assert_eq!(parse_derived_message_id("orders", &id.to_ascii_lowercase()), Some((3, 123_456)));
        assert_eq!(parse_derived_message_id("invoices", &id), None);
        assert_eq!(parse_derived_message_id("orders", &format!("01{}", &id[2..])), None);
        assert_eq!(parse_derived_message_id("orders", "00"), None);
        assert!(is_message_id(&id) && is_message_id("7F0000010F1C18B4AAC2720B67E30000"));
        assert!(!is_message_id("nonsense") && !is_message_id("") && !is_message_id(&"0".repeat(65)));
    }

    fn full() -> Message {
        Message {
            body: Bytes::from_static(b"\x00\xffbody"),
            tag: Some("TagA".into()),
            keys: vec!["k1".into(), "ключ".into()],
            message_id: Some("01ABCDEF".into()),
            properties: vec![("colour".into(), "красный".into()), ("size".into(), "L".into())],
            born_timestamp_ms: Some(1_700_000_000_123),
            born_host: Some("10.0.0.1".into()),
            message_group: Some("order-7".into()),
            delivery_timestamp_ms: Some(1_700_000_060_000),
        }
    }

    #[test]
    fn a_message_survives_the_trip_through_a_record() {
        let message = full();
        let mut record = message.to_record(5);
        record.offset = 42;
        assert_eq!(record.key.as_deref(), Some(&b"order-7"[..]));
        assert_eq!(record.value.as_deref(), Some(&b"\x00\xffbody"[..]));
        assert_eq!(Message::from_record("t", 0, &record), message);
    }

    #[test]
    fn a_kafka_record_is_an_untagged_message_with_a_stable_derived_id() {
        let mut record = Record::new(1, Some(Bytes::from_static(b"key")), Some(Bytes::from_static(b"v")));
        record.offset = 7;
        record.headers.push(Header::new("trace", Some(Bytes::from_static(b"a"))));
        record.headers.push(Header::new("trace", Some(Bytes::from_static(b"b"))));
        record.headers.push(Header::new("bin", Some(Bytes::from_static(b"\xff"))));
        record.headers.push(Header::new("weir.future-thing", Some(Bytes::from_static(b"x"))));
        let message = Message::from_record("orders", 3, &record);
        assert_eq!(message.tag, None);
        assert_eq!(message.body, Bytes::from_static(b"v"));
        assert_eq!(message.properties, vec![("trace".into(), "b".into()), ("bin".into(), "\u{fffd}".into())]);
        let id = message.id().to_string();
        assert_eq!(id.len(), 34);
        assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(Message::from_record("orders", 3, &record).id(), id);
        record.offset = 8;
        assert_ne!(Message::from_record("orders", 3, &record).id(), id);
        assert_ne!(Message::from_record("orders", 4, &record).id(), derived_message_id("orders", 3, 8));
    }
}
