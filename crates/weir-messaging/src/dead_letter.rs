//! Dead letters: a message its consumer group gave up on (delivered `max.delivery.attempts`
//! times without an ack) moves to the group's dead-letter topic, `%DLQ%<group>`, as RocketMQ
//! names it.
//!
//! The dead-letter topic is an ordinary topic of one partition, created the first time the group
//! needs it (whatever `auto.create.topics.enable` says, as RocketMQ does), with the message
//! index on so its messages can be found by key and id. Any client of either protocol reads it.
//! A dead letter is the original record (value, key, every header, the message id made explicit
//! when the original had only a derived one) plus the headers `weir.origin-topic`,
//! `weir.origin-partition`, `weir.origin-offset` and `weir.delivery-attempts`; its timestamp is
//! when it died.
//!
//! An operator resends dead letters to their topics once the cause is fixed
//! ([`resend_dead_letters`], `weir group resend-dead-letters`): each becomes the message it was
//! (without the origin headers), appended anew to its origin partition, so the group's
//! consumers receive it again as a first delivery.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use weir_storage::records::{self, BatchOptions, Header, Record};

use weir_broker::message::{derived_message_id, headers};
use weir_broker::{Broker, BrokerError, ErrorKind, NewTopic};

/// The prefix of dead-letter topics; the only name in which Weir accepts `%`.
pub use weir_controller::topics::DEAD_LETTER_PREFIX;

/// The dead-letter topic of `group`: `%DLQ%<group>`, with each character a topic name cannot
/// hold replaced by `_`.
pub fn dead_letter_topic(group: &str) -> String {
    let safe: String =
        group.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
    let mut name = format!("{DEAD_LETTER_PREFIX}{safe}");
    name.truncate(weir_broker::broker::MAX_TOPIC_NAME_LEN);
    name
}

/// The dead letter of `record`, read from `topic`-`partition`, after `attempts` deliveries.
pub(crate) fn dead_letter_record(topic: &str, partition: i32, record: &Record, attempts: u32, now_ms: i64) -> Record {
    let mut letter = Record::new(now_ms, record.key.clone(), record.value.clone());
    letter.headers = record.headers.iter().filter(|h| !is_origin_header(&h.name)).cloned().collect();
    let text = |value: String| Some(Bytes::from(value));
    if !letter.headers.iter().any(|h| h.name == headers::MESSAGE_ID) {
        letter
            .headers
            .push(Header::new(headers::MESSAGE_ID, text(derived_message_id(topic, partition, record.offset))));
    }
    letter.headers.push(Header::new(headers::ORIGIN_TOPIC, text(topic.to_string())));
    letter.headers.push(Header::new(headers::ORIGIN_PARTITION, text(partition.to_string())));
    letter.headers.push(Header::new(headers::ORIGIN_OFFSET, text(record.offset.to_string())));
    letter.headers.push(Header::new(headers::DELIVERY_ATTEMPTS, text(attempts.to_string())));
    letter
}

/// A message dead-lettered twice (from one dead-letter topic to another) keeps only its latest
/// origin.
fn is_origin_header(name: &str) -> bool {
    [headers::ORIGIN_TOPIC, headers::ORIGIN_PARTITION, headers::ORIGIN_OFFSET, headers::DELIVERY_ATTEMPTS]
        .contains(&name)
}

/// Moves `record` of `topic`-`partition` to the dead-letter topic of `group` after `attempts`
/// deliveries; returns its offset there. The caller then marks the original done.
pub(crate) async fn dead_letter(
    broker: &Arc<Broker>,
    group: &str,
    topic: &str,
    partition: i32,
    record: &Record,
    attempts: u32,
) -> Result<i64, BrokerError> {
    let dead_letters = ensure_dead_letter_topic(broker, group).await?;
    let letter = dead_letter_record(topic, partition, record, attempts, broker.now_ms());
    let batch = records::encode_batch(&[letter], &BatchOptions::default())
        .map_err(|e| BrokerError::new(ErrorKind::Internal, e.to_string()))?;
    let offset = broker.append_at_leader(&dead_letters, 0, batch).await?;
    tracing::info!(group, topic, partition, offset = record.offset, attempts, dead_letters, "dead-lettered a message");
    Ok(offset)
}

/// Most dead letters one resend reads: a call stays bounded; `next_offset` says where the next
/// one goes on.
pub const RESEND_MAX: usize = 100_000;
/// Bytes of the dead-letter log read per step.
const RESEND_READ_BYTES: u64 = 1 << 20;

/// What a resend did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Resent {
    pub dead_letter_topic: String,
    /// The first dead letter's offset considered, and where a next resend would begin.
    pub from_offset: i64,
    pub next_offset: i64,
    /// Dead letters resent, by the topic they went back to.
    pub resent: BTreeMap<String, u64>,
    /// Dead letters that could not go back (their topic is gone, or they name none).
    pub skipped: Vec<SkippedLetter>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SkippedLetter {
    pub offset: i64,
    pub reason: String,
}

/// The message a dead letter was, to append to its origin again: `(topic, partition, record)`,
/// stamped `now_ms`, without the headers that said where it died; `Err` says why it cannot go
/// back.
fn resent_record(broker: &Broker, letter: &Record, now_ms: i64) -> Result<(String, i32, Record), String> {
    let text = |name: &str| {
        letter.header(name).and_then(|h| h.value.as_ref()).map(|v| String::from_utf8_lossy(v).into_owned())
    };
    let topic = text(headers::ORIGIN_TOPIC).ok_or("it names no origin topic")?;
    let partitions = broker
        .metadata()
        .topic(&topic)
        .map(|t| t.partitions)
        .ok_or_else(|| format!("its topic '{topic}' no longer exists"))?;
    // Its own partition: a FIFO message group's queue stays the same.
    let partition =
        text(headers::ORIGIN_PARTITION).and_then(|p| p.parse::<i32>().ok()).filter(|p| (0..partitions).contains(p));
    let partition = partition.ok_or_else(|| format!("its partition of '{topic}' no longer exists"))?;
    let mut record = Record::new(now_ms, letter.key.clone(), letter.value.clone());
    record.headers = letter.headers.iter().filter(|h| !is_origin_header(&h.name)).cloned().collect();
    Ok((topic, partition, record))
}

/// Resends `group`'s dead letters from `from` (default: the oldest kept) to the high
/// watermark, at most `max`, each to the partition it died in; returns what went where and
/// where a next resend would begin. Runs where the dead-letter partition is led (else
/// NOT_LEADER_OR_FOLLOWER); the appends go to each origin partition's leader with acks=all,
/// one batch per origin partition and step, in dead-letter order.
pub async fn resend_dead_letters(
    broker: &Arc<Broker>,
    group: &str,
    from: Option<i64>,
    max: usize,
) -> Result<Resent, BrokerError> {
    let topic = dead_letter_topic(group);
    let partition = broker.partition(&topic, 0).ok_or_else(|| {
        BrokerError::new(
            ErrorKind::UnknownTopicOrPartition,
            format!("group '{group}' has no dead letters (no topic {topic})"),
        )
    })?;
    partition.check_local_leader()?;
    let (start, end) = (partition.log.log_start_offset(), partition.log.high_watermark());
    let from = from.unwrap_or(start);
    if from < start || from > end {
        return Err(BrokerError::new(
            ErrorKind::OffsetOutOfRange,
            format!(
                "offset {from} is out of range for {topic}: its dead letters are at offsets {start} to {}",
                end - 1
            ),
        ));
    }
    let max = max.min(RESEND_MAX);
    let mut done = Resent {
        dead_letter_topic: topic,
        from_offset: from,
        next_offset: from,
        resent: BTreeMap::new(),
        skipped: Vec::new(),
    };
    let mut seen = 0;
    while done.next_offset < end && seen < max {
        let (broker2, partition2, at) = (broker.clone(), partition.clone(), done.next_offset);
        let (letters, next) =
            tokio::task::spawn_blocking(move || broker2.read_records(&partition2, at, RESEND_READ_BYTES))
                .await
                .map_err(|e| BrokerError::internal(format!("reading the dead letters: {e}")))??;
        let now_ms = broker.now_ms();
        let mut batches: BTreeMap<(String, i32), Vec<Record>> = BTreeMap::new();
        let mut last = next;
        for letter in letters.into_iter().filter(|l| l.offset < end) {
            if seen == max {
                last = letter.offset;
                break;
            }
            seen += 1;
            match resent_record(broker, &letter, now_ms) {
                Ok((topic, partition, record)) => batches.entry((topic, partition)).or_default().push(record),
                Err(reason) => done.skipped.push(SkippedLetter { offset: letter.offset, reason }),
            }
        }
        for ((topic, index), records) in batches {
            let batch = records::encode_batch(&records, &BatchOptions::default())
                .map_err(|e| BrokerError::new(ErrorKind::Internal, e.to_string()))?;
            broker.append_at_leader(&topic, index, batch).await?;
            *done.resent.entry(topic).or_default() += records.len() as u64;
        }
        done.next_offset = last;
        if next <= at {
            break; // nothing readable: the high watermark is where it was read
        }
    }
    tracing::info!(group, resent = ?done.resent, skipped = done.skipped.len(), "resent dead letters");
    Ok(done)
}

/// The dead-letter topic of `group`, created if needed.
async fn ensure_dead_letter_topic(broker: &Arc<Broker>, group: &str) -> Result<String, BrokerError> {
    let name = dead_letter_topic(group);
    if broker.metadata().topic(&name).is_some() {
        return Ok(name);
    }
    let configs = BTreeMap::from([
        (weir_broker::topic_config::MESSAGE_INDEX.to_string(), "true".to_string()),
        // Whatever the original took (RocketMQ's 4 MiB bodies with their properties).
        ("max.message.bytes".to_string(), (8 << 20).to_string()),
    ]);
    let topic = |replication_factor: i16| NewTopic {
        name: name.clone(),
        partitions: 1,
        replication_factor,
        assignments: Vec::new(),
        configs: configs.clone(),
    };
    let mut result = create_one(broker, topic(-1)).await;
    // A cluster short of brokers (one lost for good, below default.replication.factor) still
    // takes its dead letters, on every broker it has, rather than keep them in flight until an
    // operator adds one: the group's consumers have given up on them already.
    let live = i16::try_from(broker.live_brokers().len()).unwrap_or(i16::MAX);
    if matches!(&result, Err(e) if e.kind == ErrorKind::InvalidReplicationFactor)
        && (1..broker.config.default_replication_factor).contains(&live)
    {
        tracing::warn!(topic = %name, replicas = live, wanted = broker.config.default_replication_factor,
            "too few brokers for default.replication.factor: creating the dead-letter topic with fewer replicas");
        result = create_one(broker, topic(live)).await;
    }
    result.map(|()| name)
}

async fn create_one(broker: &Arc<Broker>, topic: NewTopic) -> Result<(), BrokerError> {
    match broker.create_topics(vec![topic], false).await.pop() {
        Some(Ok(_)) => Ok(()),
        Some(Err(e)) if e.kind == ErrorKind::TopicExists => Ok(()),
        Some(Err(e)) => Err(e),
        None => Err(BrokerError::internal("creating the dead-letter topic gave no result")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_topic_name_is_always_a_valid_topic_name() {
        assert_eq!(dead_letter_topic("billing"), "%DLQ%billing");
        assert_eq!(dead_letter_topic("a b/c%d"), "%DLQ%a_b_c_d");
        assert!(Broker::validate_topic_name(&dead_letter_topic(&"g".repeat(400))).is_ok());
        assert!(Broker::validate_topic_name("%DLQ%").is_err(), "a dead-letter prefix alone");
        assert!(Broker::validate_topic_name("%x").is_err());
        assert!(Broker::validate_topic_name("a%DLQ%b").is_err());
    }

    #[test]
    fn a_dead_letter_keeps_the_message_and_says_where_it_came_from() {
        let mut record = Record::new(5, Some(Bytes::from_static(b"k")), Some(Bytes::from_static(b"v")));
        record.offset = 42;
        record.headers.push(Header::new(headers::TAG, Some(Bytes::from_static(b"TagA"))));
        let letter = dead_letter_record("orders", 3, &record, 17, 1_000);
        let header = |name: &str| {
            letter.headers.iter().find(|h| h.name == name).and_then(|h| h.value.clone()).map(|v| v.to_vec())
        };
        assert_eq!((&letter.key, &letter.value, letter.timestamp), (&record.key, &record.value, 1_000));
        assert_eq!(header(headers::TAG), Some(b"TagA".to_vec()));
        assert_eq!(header(headers::MESSAGE_ID), Some(derived_message_id("orders", 3, 42).into_bytes()));
        assert_eq!(header(headers::ORIGIN_TOPIC), Some(b"orders".to_vec()));
        assert_eq!(header(headers::ORIGIN_PARTITION), Some(b"3".to_vec()));
        assert_eq!(header(headers::ORIGIN_OFFSET), Some(b"42".to_vec()));
        assert_eq!(header(headers::DELIVERY_ATTEMPTS), Some(b"17".to_vec()));
        // Dead-lettered again, it has one origin: the latest.
        let again = dead_letter_record("%DLQ%g", 0, &letter, 2, 2_000);
        assert_eq!(again.headers.iter().filter(|h| h.name == headers::ORIGIN_TOPIC).count(), 1);
    }
}
