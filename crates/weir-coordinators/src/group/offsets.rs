//! `__consumer_offsets` records: their encoding, and their loading at start-up.
//!
//! Every record is a key/value pair in an ordinary RecordBatch (see `internal_records`), so the
//! storage engine recovers, indexes and compacts it like any topic's data. The topic is
//! compacted: the last record of a key is what survives, and a tombstone (a record without
//! value) deletes the key. All records of one group live in partition
//! [`partition_for`](super::partition_for)`(group)`, so replaying a partition in offset order
//! rebuilds each of its groups exactly.
//!
//! Keys. The first byte says which kind of key it is; keys carry no version, so one logical key
//! is always the same bytes (compaction relies on that):
//! ```text
//! offset key: u8 1 | u32 len | group id | u32 len | topic | i32 partition
//! group key:  u8 2 | u32 len | group id
//! consumer group key: u8 3 | u32 len | group id
//! share group key: u8 4 | u32 len | group id
//! transaction offsets key: u8 5 | u32 len | group id | i64 producer id
//! ```
//! Values start with a version byte (0 today). A value of a version this code does not know is
//! skipped with an error in the log rather than guessed at:
//! ```text
//! offset value v0: u8 0 | i64 offset | i32 leader epoch (-1: unknown) | i64 commit timestamp ms
//!                  | u32 len | metadata
//! group value v0:  u8 0 | i32 generation | u32 len | protocol type
//!                  | i32 len (-1: none) | protocol name | i64 timestamp ms (when written)
//! consumer group value v0: u8 0 | JSON of the group's state (`ConsumerGroupSnapshot`)
//! share group value v0: u8 0 | JSON of the group's membership (`ShareGroupSnapshot`)
//! transaction offsets value v0: u8 0 | i64 expiry ms | u32 count
//!                               | count × (u32 len | topic | i32 partition)
//! ```
//! A transaction offsets record says that the open transaction of a producer has sent offsets
//! of these partitions for the group (TxnOffsetCommit), so they read as unstable for
//! `RequireStable` until it ends (see `unstable`). It is written before the TxnOffsetCommit is
//! answered, and tombstoned when the transaction's offsets are stored or its abort reaches the
//! group's partition; a coordinator that loads one whose expiry has not passed takes it over.
//! The consumer group record (KIP-848 groups) holds the whole group: epochs, the target
//! assignment, every member with its subscription, epoch and assignment. It is rewritten (and
//! fsynced) whenever a heartbeat changes any of that, before the heartbeat is answered, so a new
//! coordinator carries the group on where the old one left it. The share group record (KIP-932
//! groups) does the same for a share group's members, epochs and assignment; what its members
//! consumed is the invisible-time state's, in `__share_group_state`.
//! Integers are big-endian, strings UTF-8. Classic group membership is deliberately absent:
//! after a restart the members rejoin, so only what outlives them is kept (offsets, protocol
//! type, generation).

use std::collections::HashMap;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use weir_broker::broker::Broker;
use weir_broker::error::BrokerError;
use weir_broker::internal_records;
use weir_broker::partition::Partition;

use super::consumer::ConsumerGroupSnapshot;
use super::share::ShareGroupSnapshot;
use super::state::CommittedOffset;

const KEY_OFFSET: u8 = 1;
const KEY_GROUP: u8 = 2;
const KEY_CONSUMER_GROUP: u8 = 3;
const KEY_SHARE_GROUP: u8 = 4;
const KEY_TRANSACTION_OFFSETS: u8 = 5;
const VALUE_VERSION: u8 = 0;
/// An unknown leader epoch in an offset value (Kafka's `NO_PARTITION_LEADER_EPOCH`).
const UNKNOWN_LEADER_EPOCH: i32 = -1;

/// How much one read asks for while loading.
const LOAD_READ_BYTES: u64 = 1024 * 1024;

/// A decoded key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RecordKey {
    Offset { group: String, topic: String, partition: i32 },
    Group { group: String },
    ConsumerGroup { group: String },
    ShareGroup { group: String },
    TransactionOffsets { group: String, producer_id: i64 },
}

/// What a transaction offsets record keeps: the partitions an open transaction sent offsets
/// of, and when the note lapses if no end is heard of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TransactionOffsetsNote {
    pub(crate) expires_ms: i64,
    pub(crate) partitions: Vec<(String, i32)>,
}

/// What a group record keeps of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupRecord {
    pub(crate) generation: i32,
    pub(crate) protocol_type: String,
    pub(crate) protocol_name: Option<String>,
    pub(crate) timestamp_ms: i64,
}

fn put_str(buf: &mut BytesMut, s: &str) {
    // Group ids, topics and protocol names arrive as Kafka strings (at most 32767 bytes) and
    // metadata is capped at OFFSET_METADATA_MAX_BYTES, so the length always fits.
    let len = u32::try_from(s.len()).unwrap_or(u32::MAX);
    buf.put_u32(len);
    buf.put_slice(&s.as_bytes()[..len as usize]);
}

fn get_str(buf: &mut &[u8], what: &str) -> Result<String, String> {
    if buf.remaining() < 4 {
        return Err(format!("truncated {what} length"));
    }
    let len = buf.get_u32() as usize;
    if buf.remaining() < len {
        return Err(format!("truncated {what}: {len} bytes announced, {} left", buf.remaining()));
    }
    let s = std::str::from_utf8(&buf[..len]).map_err(|e| format!("{what} is not UTF-8: {e}"))?.to_string();
    buf.advance(len);
    Ok(s)
}

fn need(buf: &[u8], n: usize, what: &str) -> Result<(), String> {
    if buf.len() < n {
        return Err(format!("truncated {what}"));
    }
    Ok(())
}

pub(crate) fn offset_key(group: &str, topic: &str, partition: i32) -> Bytes {
    let mut buf = BytesMut::with_capacity(1 + 4 + group.len() + 4 + topic.len() + 4);
    buf.put_u8(KEY_OFFSET);
    put_str(&mut buf, group);
    put_str(&mut buf, topic);
    buf.put_i32(partition);
    buf.freeze()
}

pub(crate) fn group_key(group: &str) -> Bytes {
    let mut buf = BytesMut::with_capacity(1 + 4 + group.len());
    buf.put_u8(KEY_GROUP);
    put_str(&mut buf, group);
    buf.freeze()
}

pub(crate) fn consumer_group_key(group: &str) -> Bytes {
    let mut buf = BytesMut::with_capacity(1 + 4 + group.len());
    buf.put_u8(KEY_CONSUMER_GROUP);
    put_str(&mut buf, group);
    buf.freeze()
}

pub(crate) fn share_group_key(group: &str) -> Bytes {
    let mut buf = BytesMut::with_capacity(1 + 4 + group.len());
    buf.put_u8(KEY_SHARE_GROUP);
    put_str(&mut buf, group);
    buf.freeze()
}

pub(crate) fn transaction_offsets_key(group: &str, producer_id: i64) -> Bytes {
    let mut buf = BytesMut::with_capacity(1 + 4 + group.len() + 8);
    buf.put_u8(KEY_TRANSACTION_OFFSETS);
    put_str(&mut buf, group);
    buf.put_i64(producer_id);
    buf.freeze()
}

pub(crate) fn transaction_offsets_value(note: &TransactionOffsetsNote) -> Bytes {
    let mut buf = BytesMut::with_capacity(1 + 8 + 4 + note.partitions.len() * 16);
    buf.put_u8(VALUE_VERSION);
    buf.put_i64(note.expires_ms);
    buf.put_u32(u32::try_from(note.partitions.len()).unwrap_or(u32::MAX));
    for (topic, partition) in &note.partitions {
        put_str(&mut buf, topic);
        buf.put_i32(*partition);
    }
    buf.freeze()
}

pub(crate) fn decode_transaction_offsets_value(mut buf: &[u8]) -> Result<TransactionOffsetsNote, String> {
    need(buf, 1, "value version")?;
    let version = buf.get_u8();
    if version != VALUE_VERSION {
        return Err(format!("unknown transaction offsets value version {version}"));
    }
    need(buf, 8 + 4, "transaction offsets value")?;
    let expires_ms = buf.get_i64();
    let count = buf.get_u32();
    let mut partitions = Vec::new();
    for _ in 0..count {
        let topic = get_str(&mut buf, "topic")?;
        need(buf, 4, "partition")?;
        partitions.push((topic, buf.get_i32()));
    }
    Ok(TransactionOffsetsNote { expires_ms, partitions })
}

/// A versioned JSON value (the consumer and share group records).
fn json_value<T: serde::Serialize>(snapshot: &T) -> Bytes {
    let mut buf = BytesMut::with_capacity(256);
    buf.put_u8(VALUE_VERSION);
    // Serializing plain data (strings, numbers, maps with string keys) cannot fail.
    buf.extend_from_slice(&serde_json::to_vec(snapshot).unwrap_or_default());
    buf.freeze()
}

fn decode_json_value<T: serde::de::DeserializeOwned>(mut buf: &[u8], what: &str) -> Result<T, String> {
    need(buf, 1, "value version")?;
    let version = buf.get_u8();
    if version != VALUE_VERSION {
        return Err(format!("unknown {what} value version {version}"));
    }
    serde_json::from_slice(buf).map_err(|e| format!("bad {what} value: {e}"))
}

pub(crate) fn consumer_group_value(snapshot: &ConsumerGroupSnapshot) -> Bytes {
    json_value(snapshot)
}

pub(crate) fn decode_consumer_group_value(buf: &[u8]) -> Result<ConsumerGroupSnapshot, String> {
    decode_json_value(buf, "consumer group")
}

pub(crate) fn share_group_value(snapshot: &ShareGroupSnapshot) -> Bytes {
    json_value(snapshot)
}

pub(crate) fn decode_share_group_value(buf: &[u8]) -> Result<ShareGroupSnapshot, String> {
    decode_json_value(buf, "share group")
}

pub(crate) fn decode_key(mut buf: &[u8]) -> Result<RecordKey, String> {
    need(buf, 1, "key kind")?;
    let kind = buf.get_u8();
    let key = match kind {
        KEY_OFFSET => {
            let group = get_str(&mut buf, "group id")?;
            let topic = get_str(&mut buf, "topic")?;
            need(buf, 4, "partition")?;
            RecordKey::Offset { group, topic, partition: buf.get_i32() }
        }
        KEY_GROUP => RecordKey::Group { group: get_str(&mut buf, "group id")? },
        KEY_CONSUMER_GROUP => RecordKey::ConsumerGroup { group: get_str(&mut buf, "group id")? },
        KEY_SHARE_GROUP => RecordKey::ShareGroup { group: get_str(&mut buf, "group id")? },
        KEY_TRANSACTION_OFFSETS => {
            let group = get_str(&mut buf, "group id")?;
            need(buf, 8, "producer id")?;
            RecordKey::TransactionOffsets { group, producer_id: buf.get_i64() }
        }
        other => return Err(format!("unknown key kind {other}")),
    };
    if !buf.is_empty() {
        return Err(format!("{} trailing bytes after the key", buf.len()));
    }
    Ok(key)
}

pub(crate) fn offset_value(offset: &CommittedOffset) -> Bytes {
    let mut buf = BytesMut::with_capacity(1 + 8 + 4 + 8 + 4 + offset.metadata.len());
    buf.put_u8(VALUE_VERSION);
    buf.put_i64(offset.offset);
    buf.put_i32(offset.leader_epoch.unwrap_or(UNKNOWN_LEADER_EPOCH));
    buf.put_i64(offset.commit_timestamp_ms);
    put_str(&mut buf, &offset.metadata);
    buf.freeze()
}

pub(crate) fn decode_offset_value(mut buf: &[u8]) -> Result<CommittedOffset, String> {
    need(buf, 1, "value version")?;
    let version = buf.get_u8();
    if version != VALUE_VERSION {
        return Err(format!("unknown offset value version {version}"));
    }
    need(buf, 8 + 4 + 8, "offset value")?;
    let offset = buf.get_i64();
    let leader_epoch = Some(buf.get_i32()).filter(|&epoch| epoch != UNKNOWN_LEADER_EPOCH);
    let commit_timestamp_ms = buf.get_i64();
    let metadata = get_str(&mut buf, "metadata")?;
    Ok(CommittedOffset { offset, leader_epoch, metadata, commit_timestamp_ms })
}

pub(crate) fn group_value(record: &GroupRecord) -> Bytes {
    let mut buf = BytesMut::with_capacity(64);
    buf.put_u8(VALUE_VERSION);
    buf.put_i32(record.generation);
    put_str(&mut buf, &record.protocol_type);
    match &record.protocol_name {
        Some(name) => put_str(&mut buf, name),
        None => buf.put_i32(-1),
    }
    buf.put_i64(record.timestamp_ms);
    buf.freeze()
}

pub(crate) fn decode_group_value(mut buf: &[u8]) -> Result<GroupRecord, String> {
    need(buf, 1, "value version")?;
    let version = buf.get_u8();
    if version != VALUE_VERSION {
        return Err(format!("unknown group value version {version}"));
    }
    need(buf, 4, "generation")?;
    let generation = buf.get_i32();
    let protocol_type = get_str(&mut buf, "protocol type")?;
    need(buf, 4, "protocol name length")?;
    let protocol_name = if i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) == -1 {
        buf.advance(4);
        None
    } else {
        Some(get_str(&mut buf, "protocol name")?)
    };
    need(buf, 8, "timestamp")?;
    let timestamp_ms = buf.get_i64();
    Ok(GroupRecord { generation, protocol_type, protocol_name, timestamp_ms })
}

/// What the log says about one group.
#[derive(Debug, Default)]
pub(crate) struct LoadedGroup {
    pub(crate) record: Option<GroupRecord>,
    pub(crate) offsets: HashMap<(String, i32), CommittedOffset>,
    /// A consumer-protocol group's last state.
    pub(crate) consumer: Option<ConsumerGroupSnapshot>,
    /// A share group's last membership, with the record's value as stored.
    pub(crate) share: Option<(ShareGroupSnapshot, Bytes)>,
    /// Offsets of open transactions (by producer id), not stored yet.
    pub(crate) transaction_offsets: HashMap<i64, TransactionOffsetsNote>,
}

impl LoadedGroup {
    /// Whether anything besides a share group's membership was loaded (a classic or consumer
    /// group's record, or committed offsets).
    pub(crate) fn has_group_state(&self) -> bool {
        self.record.is_some() || !self.offsets.is_empty() || self.consumer.is_some()
    }
}

/// Replays one partition of `__consumer_offsets` into `groups`. Blocking. Records that cannot be
/// decoded are skipped with an error in the log: one bad record must not keep every other
/// group's offsets from loading.
pub(crate) fn load_partition(
    broker: &Broker,
    partition: &Partition,
    groups: &mut HashMap<String, LoadedGroup>,
) -> Result<u64, BrokerError> {
    let mut offset = partition.log.log_start_offset();
    let mut records_read = 0u64;
    loop {
        let read = broker.read_to_log_end(partition, offset, LOAD_READ_BYTES)?;
        let Some(slice) = read.slice else { break };
        let bytes = slice.read_to_vec().map_err(BrokerError::from)?;
        let records = internal_records::decode_batches(Bytes::from(bytes)).map_err(|e| {
            BrokerError::new(
                weir_broker::error::ErrorKind::Storage,
                format!("cannot decode {}-{} at offset {offset}: {e}", partition.topic, partition.index),
            )
        })?;
        for record in records {
            records_read += 1;
            apply_record(partition, record, groups);
        }
        if slice.next_offset <= offset {
            break; // no progress: never loop on a broken read
        }
        offset = slice.next_offset;
    }
    groups.retain(|_, g| g.has_group_state() || g.share.is_some() || !g.transaction_offsets.is_empty());
    Ok(records_read)
}

fn apply_record(
    partition: &Partition,
    record: internal_records::InternalRecord,
    groups: &mut HashMap<String, LoadedGroup>,
) {
    let at = || format!("{}-{}@{}", partition.topic, partition.index, record.offset);
    let Some(key) = record.key.as_deref() else {
        tracing::error!(record = %at(), "skipping a record without key");
        return;
    };
    let key = match decode_key(key) {
        Ok(key) => key,
        Err(e) => {
            tracing::error!(record = %at(), error = %e, "skipping a record with an undecodable key");
            return;
        }
    };
    match key {
        RecordKey::Offset { group, topic, partition: index } => {
            let entry = groups.entry(group).or_default();
            match record.value.as_deref() {
                None => {
                    entry.offsets.remove(&(topic, index));
                }
                Some(value) => match decode_offset_value(value) {
                    Ok(committed) => {
                        entry.offsets.insert((topic, index), committed);
                    }
                    Err(e) => tracing::error!(record = %at(), error = %e, "skipping an undecodable offset"),
                },
            }
        }
        RecordKey::Group { group } => match record.value.as_deref() {
            // A group tombstone deletes the group: its offsets were tombstoned before it.
            None => {
                groups.remove(&group);
            }
            Some(value) => match decode_group_value(value) {
                Ok(decoded) => groups.entry(group).or_default().record = Some(decoded),
                Err(e) => tracing::error!(record = %at(), error = %e, "skipping an undecodable group record"),
            },
        },
        RecordKey::ConsumerGroup { group } => match record.value.as_deref() {
            None => {
                if let Some(entry) = groups.get_mut(&group) {
                    entry.consumer = None;
                }
            }
            Some(value) => match decode_consumer_group_value(value) {
                Ok(decoded) => groups.entry(group).or_default().consumer = Some(decoded),
                Err(e) => tracing::error!(record = %at(), error = %e, "skipping an undecodable consumer group record"),
            },
        },
        RecordKey::TransactionOffsets { group, producer_id } => match record.value.as_deref() {
            None => {
                if let Some(entry) = groups.get_mut(&group) {
                    entry.transaction_offsets.remove(&producer_id);
                }
            }
            Some(value) => match decode_transaction_offsets_value(value) {
                Ok(note) => {
                    groups.entry(group).or_default().transaction_offsets.insert(producer_id, note);
                }
                Err(e) => {
                    tracing::error!(record = %at(), error = %e, "skipping an undecodable transaction offsets record")
                }
            },
        },
        RecordKey::ShareGroup { group } => match record.value {
            None => {
                if let Some(entry) = groups.get_mut(&group) {
                    entry.share = None;
                }
            }
            Some(value) => match decode_share_group_value(&value) {
                Ok(decoded) => groups.entry(group).or_default().share = Some((decoded, value)),
                Err(e) => tracing::error!(record = %at(), error = %e, "skipping an undecodable share group record"),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_are_distinct_per_kind() {
        let key = offset_key("g", "t", 3);
        assert_eq!(decode_key(&key).unwrap(), RecordKey::Offset { group: "g".into(), topic: "t".into(), partition: 3 });
        assert_eq!(decode_key(&group_key("g")).unwrap(), RecordKey::Group { group: "g".into() });
        assert_ne!(offset_key("g", "", 0)[..1], group_key("g")[..1]);
        assert!(decode_key(&key[..key.len() - 1]).is_err());
        assert!(decode_key(&[9]).is_err());
        assert_eq!(
            decode_key(&transaction_offsets_key("g", 77)).unwrap(),
            RecordKey::TransactionOffsets { group: "g".into(), producer_id: 77 }
        );
        assert_ne!(transaction_offsets_key("g", 1), transaction_offsets_key("g", 2));
    }

    #[test]
    fn values_round_trip() {
        let committed = CommittedOffset {
            offset: 42,
            leader_epoch: Some(7),
            metadata: "meta".into(),
            commit_timestamp_ms: 1_700_000_000_000,
        };
        assert_eq!(decode_offset_value(&offset_value(&committed)).unwrap(), committed);
        let unknown_epoch = CommittedOffset { leader_epoch: None, ..committed };
        let value = offset_value(&unknown_epoch);
        assert_eq!(value[9..13], (-1i32).to_be_bytes(), "an unknown epoch is stored as -1");
        assert_eq!(decode_offset_value(&value).unwrap(), unknown_epoch);
        for protocol_name in [None, Some("range".to_string())] {
            let record =
                GroupRecord { generation: 5, protocol_type: "consumer".into(), protocol_name, timestamp_ms: 123 };
            assert_eq!(decode_group_value(&group_value(&record)).unwrap(), record);
        }
        let note = TransactionOffsetsNote { expires_ms: 99, partitions: vec![("t".into(), 0), ("u".into(), 3)] };
        assert_eq!(decode_transaction_offsets_value(&transaction_offsets_value(&note)).unwrap(), note);
        assert!(decode_transaction_offsets_value(&transaction_offsets_value(&note)[..12]).is_err());
    }

    #[test]
    fn unknown_value_versions_are_refused() {
        let committed =
            CommittedOffset { offset: 1, leader_epoch: None, metadata: String::new(), commit_timestamp_ms: 0 };
        let mut value = offset_value(&committed).to_vec();
        value[0] = 1;
        assert!(decode_offset_value(&value).unwrap_err().contains("version"));
    }
}
