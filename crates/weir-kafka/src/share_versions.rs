//! ShareFetch and ShareAcknowledge v2, as Kafka 4.2 serves them (KIP-1206's acquire mode and
//! KIP-1222's renew flag), which the `kafka-protocol` crate does not have (it stops at v1).
//!
//! Version 2 changes little on the wire:
//! - a ShareFetch request is v1 with `ShareAcquireMode` (int8) and `IsRenewAck` (bool) after
//!   `BatchSize`; its response is v1's;
//! - a ShareAcknowledge request is v1 with `IsRenewAck` (bool) after `ShareSessionEpoch`; its
//!   response is v1's with `AcquisitionLockTimeoutMs` (int32) after `ErrorMessage`.
//!
//! So a v2 request is read by taking its new fields out and decoding the rest as v1, and a v2
//! response is v1's encoding with the new field put in. Both requests are flexible from v0 on:
//! strings are compact (an unsigned varint of length + 1, 0 for null).
//!
//! DescribeShareGroupOffsets v1 (Kafka 4.2, KIP-1226) is v0 with each partition's `Lag`
//! (int64) after its `LeaderEpoch`: its request reads as v0's, and its answer is encoded here
//! whole ([`describe_offsets_response`]), being short.

use bytes::{BufMut, Bytes, BytesMut};

/// The first version with the fields this module adds.
pub(crate) const V2: i16 = 2;

/// How a ShareFetch acquires records (KIP-1206).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum AcquireMode {
    /// Whole batches, even if that acquires more than `MaxRecords` (v1's only mode).
    #[default]
    BatchOptimized,
    /// Never more than `MaxRecords`.
    RecordLimit,
}

/// What a v2 ShareFetch adds to v1 (the defaults: a v1 request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct FetchExtras {
    pub(crate) acquire_mode: AcquireMode,
    /// The request only renews locks (KIP-1222): it acquires nothing, and its fetch
    /// parameters must all be zero.
    pub(crate) renew_ack: bool,
}

/// Reads past one compact nullable string at `at`; the offset after it.
fn skip_compact_string(body: &[u8], at: usize) -> Result<usize, String> {
    let (length_plus_one, at) = unsigned_varint(body, at)?;
    let length = length_plus_one.saturating_sub(1) as usize;
    at.checked_add(length).filter(|end| *end <= body.len()).ok_or_else(|| "a string runs past the request".into())
}

fn unsigned_varint(bytes: &[u8], mut at: usize) -> Result<(u64, usize), String> {
    let mut value = 0u64;
    for shift in (0..35).step_by(7) {
        let byte = *bytes.get(at).ok_or("the request ends inside a varint")?;
        at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok((value, at));
        }
    }
    Err("a varint longer than 5 bytes".into())
}

/// `body` without `count` bytes at `at`.
fn without(body: &Bytes, at: usize, count: usize) -> Result<Bytes, String> {
    if at + count > body.len() {
        return Err("the request ends before its version 2 fields".into());
    }
    let mut out = BytesMut::with_capacity(body.len() - count);
    out.put_slice(&body[..at]);
    out.put_slice(&body[at + count..]);
    Ok(out.freeze())
}

/// A ShareFetch body of `version` as v1's, and what v2 added.
pub(crate) fn fetch_request(version: i16, body: Bytes) -> Result<(Bytes, FetchExtras), String> {
    if version < V2 {
        return Ok((body, FetchExtras::default()));
    }
    // GroupId, MemberId, then ShareSessionEpoch, MaxWaitMs, MinBytes, MaxBytes, MaxRecords and
    // BatchSize (int32 each).
    let at = skip_compact_string(&body, 0)?;
    let at = skip_compact_string(&body, at)? + 6 * 4;
    let (mode, renew) = match body.get(at..at + 2) {
        Some(&[mode, renew]) => (mode as i8, renew != 0),
        _ => return Err("the request ends before its version 2 fields".into()),
    };
    let acquire_mode = match mode {
        0 => AcquireMode::BatchOptimized,
        1 => AcquireMode::RecordLimit,
        other => return Err(format!("unknown ShareAcquireMode {other}")),
    };
    Ok((without(&body, at, 2)?, FetchExtras { acquire_mode, renew_ack: renew }))
}

/// A ShareAcknowledge body of `version` as v1's, and its `IsRenewAck` (false before v2).
pub(crate) fn acknowledge_request(version: i16, body: Bytes) -> Result<(Bytes, bool), String> {
    if version < V2 {
        return Ok((body, false));
    }
    let at = skip_compact_string(&body, 0)?;
    let at = skip_compact_string(&body, at)? + 4;
    let renew = match body.get(at) {
        Some(flag) => *flag != 0,
        None => return Err("the request ends before its version 2 fields".into()),
    };
    Ok((without(&body, at, 1)?, renew))
}

/// A whole v1 ShareAcknowledge response frame (size prefix, header v1, body) as v2's:
/// `AcquisitionLockTimeoutMs` put in after the body's `ErrorMessage`.
pub(crate) fn acknowledge_response(frame: BytesMut, lock_timeout_ms: i32) -> Result<BytesMut, String> {
    // Size (4), correlation id (4), the header's tagged fields, ThrottleTimeMs (4), ErrorCode (2).
    let (tagged, mut at) = unsigned_varint(&frame, 8)?;
    for _ in 0..tagged {
        let (_, after_tag) = unsigned_varint(&frame, at)?;
        let (size, after_size) = unsigned_varint(&frame, after_tag)?;
        at = after_size + size as usize;
    }
    let at = skip_compact_string(&frame, at + 6)?;
    let mut out = BytesMut::with_capacity(frame.len() + 4);
    out.put_i32(i32::try_from(frame.len()).map_err(|_| "response too large")?); // (size - 4 + 4)
    out.put_slice(&frame[4..at]);
    out.put_i32(lock_timeout_ms);
    out.put_slice(&frame[at..]);
    Ok(out)
}

fn put_unsigned_varint(out: &mut BytesMut, mut value: u64) {
    while value >= 0x80 {
        out.put_u8((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

fn put_compact_string(out: &mut BytesMut, text: Option<&str>) {
    match text {
        None => out.put_u8(0),
        Some(text) => {
            put_unsigned_varint(out, text.len() as u64 + 1);
            out.put_slice(text.as_bytes());
        }
    }
}

fn put_compact_array_length(out: &mut BytesMut, length: usize) {
    put_unsigned_varint(out, length as u64 + 1);
}

/// A whole DescribeShareGroupOffsets v1 response frame (size prefix, header v1, body) of
/// `response`, each partition's lag given by `lag(group, topic, partition)` (-1: unknown).
pub(crate) fn describe_offsets_response(
    correlation_id: i32,
    response: &kafka_protocol::messages::DescribeShareGroupOffsetsResponse,
    lag: impl Fn(&str, &str, i32) -> i64,
) -> BytesMut {
    let mut out = BytesMut::new();
    out.put_i32(0); // the size, set below
    out.put_i32(correlation_id);
    out.put_u8(0); // the header's tagged fields
    out.put_i32(response.throttle_time_ms);
    put_compact_array_length(&mut out, response.groups.len());
    for group in &response.groups {
        put_compact_string(&mut out, Some(&group.group_id));
        put_compact_array_length(&mut out, group.topics.len());
        for topic in &group.topics {
            put_compact_string(&mut out, Some(&topic.topic_name));
            out.put_slice(topic.topic_id.as_bytes());
            put_compact_array_length(&mut out, topic.partitions.len());
            for partition in &topic.partitions {
                out.put_i32(partition.partition_index);
                out.put_i64(partition.start_offset);
                out.put_i32(partition.leader_epoch);
                out.put_i64(lag(&group.group_id, &topic.topic_name, partition.partition_index));
                out.put_i16(partition.error_code);
                put_compact_string(&mut out, partition.error_message.as_deref());
                out.put_u8(0);
            }
            out.put_u8(0);
        }
        out.put_i16(group.error_code);
        put_compact_string(&mut out, group.error_message.as_deref());
        out.put_u8(0);
    }
    out.put_u8(0);
    let size = (out.len() - 4) as i32;
    out[..4].copy_from_slice(&size.to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::{
        share_acknowledge_response, GroupId, ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareFetchRequest,
    };
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    fn encoded<T: Encodable>(message: &T, version: i16) -> Bytes {
        let mut buf = BytesMut::new();
        message.encode(&mut buf, version).expect("encodes");
        buf.freeze()
    }

    fn s(text: &str) -> StrBytes {
        StrBytes::from_string(text.to_string())
    }

    #[test]
    fn a_v2_share_fetch_reads_as_v1_with_its_mode_and_renew_flag() {
        let request = ShareFetchRequest::default()
            .with_group_id(Some(GroupId(s("group"))))
            .with_member_id(Some(s("member-1")))
            .with_share_session_epoch(3)
            .with_max_wait_ms(500)
            .with_max_records(7)
            .with_batch_size(9);
        let v1 = encoded(&request, 1);
        // v2 on the wire: the two fields after BatchSize (5 + 1 + 8 + 1 bytes of strings, then 24).
        let at = 1 + 5 + 1 + 8 + 24;
        for (mode, renew, expected) in [
            (0u8, 0u8, FetchExtras::default()),
            (1, 1, FetchExtras { acquire_mode: AcquireMode::RecordLimit, renew_ack: true }),
        ] {
            let mut v2 = BytesMut::from(&v1[..at]);
            v2.put_u8(mode);
            v2.put_u8(renew);
            v2.put_slice(&v1[at..]);
            let (body, extras) = fetch_request(2, v2.freeze()).expect("reads");
            assert_eq!(extras, expected);
            assert_eq!(body, v1);
            let mut body = body;
            assert_eq!(ShareFetchRequest::decode(&mut body, 1).expect("decodes"), request);
        }
        assert_eq!(fetch_request(1, v1.clone()).expect("v1").0, v1, "v1 as it is");
        assert!(fetch_request(2, v1.slice(..10)).is_err(), "cut short");
        let mut bad = BytesMut::from(&v1[..at]);
        bad.put_slice(&[7, 0]);
        bad.put_slice(&v1[at..]);
        assert!(fetch_request(2, bad.freeze()).is_err(), "unknown mode");
    }

    #[test]
    fn a_v1_describe_share_group_offsets_answer_is_v0s_with_each_lag_after_the_leader_epoch() {
        use kafka_protocol::messages::describe_share_group_offsets_response::*;
        use kafka_protocol::messages::{ApiKey, DescribeShareGroupOffsetsResponse, TopicName};
        let partition = |index: i32| {
            DescribeShareGroupOffsetsResponsePartition::default()
                .with_partition_index(index)
                .with_start_offset(10 * i64::from(index))
                .with_leader_epoch(3)
        };
        let response = DescribeShareGroupOffsetsResponse::default().with_throttle_time_ms(5).with_groups(vec![
            DescribeShareGroupOffsetsResponseGroup::default().with_group_id(GroupId(s("g"))).with_topics(vec![
                DescribeShareGroupOffsetsResponseTopic::default()
                    .with_topic_name(TopicName(s("t")))
                    .with_topic_id(uuid::Uuid::from_u128(7))
                    .with_partitions(vec![
                        partition(0),
                        partition(1).with_error_code(3).with_error_message(Some(s("gone"))),
                    ]),
            ]),
        ]);
        let v1 = describe_offsets_response(9, &response, |group, topic, p| {
            assert_eq!((group, topic), ("g", "t"));
            100 + i64::from(p)
        });
        let v0 = crate::frame::encode_response(ApiKey::DescribeShareGroupOffsets, 0, 9, &response).expect("encodes");
        assert_eq!(v1.len(), v0.len() + 2 * 8, "one lag per partition");
        assert_eq!(i32::from_be_bytes(v1[..4].try_into().expect("4")) as usize, v1.len() - 4);
        // Taking the lags out gives v0's bytes: each sits after a partition's first 16 bytes.
        let first = 4 + 5 + 4 + 1 + 2 + 1 + 2 + 16 + 1;
        // (A partition of v1: index, start offset, epoch (16), lag (8), error (2), a null
        // message (1), no tagged fields (1).)
        let (lag0, lag1) = (first + 16, first + 28 + 16);
        assert_eq!(i64::from_be_bytes(v1[lag0..lag0 + 8].try_into().expect("8")), 100);
        assert_eq!(i64::from_be_bytes(v1[lag1..lag1 + 8].try_into().expect("8")), 101);
        let mut without = v1.to_vec();
        without.drain(lag1..lag1 + 8);
        without.drain(lag0..lag0 + 8);
        assert_eq!(&without[4..], &v0[4..]);
    }

    #[test]
    fn a_v2_share_acknowledge_reads_as_v1_and_its_answer_carries_the_lock_timeout() {
        let request = ShareAcknowledgeRequest::default()
            .with_group_id(Some(GroupId(s("g"))))
            .with_member_id(Some(s("m")))
            .with_share_session_epoch(2);
        let v1 = encoded(&request, 1);
        let at = 2 + 2 + 4;
        let mut v2 = BytesMut::from(&v1[..at]);
        v2.put_u8(1);
        v2.put_slice(&v1[at..]);
        let (body, renew) = acknowledge_request(2, v2.freeze()).expect("reads");
        assert!(renew);
        assert_eq!(body, v1);

        let response = ShareAcknowledgeResponse::default()
            .with_error_message(Some(s("why")))
            .with_responses(vec![share_acknowledge_response::ShareAcknowledgeTopicResponse::default()]);
        let frame = crate::frame::encode_response(kafka_protocol::messages::ApiKey::ShareAcknowledge, 1, 42, &response)
            .expect("encodes");
        let v2 = acknowledge_response(frame.clone(), 15_000).expect("v2");
        assert_eq!(v2.len(), frame.len() + 4);
        assert_eq!(i32::from_be_bytes(v2[..4].try_into().expect("4")) as usize, v2.len() - 4, "size prefix");
        // Header (4 + 1), throttle (4), error (2), "why" (1 + 3): the lock timeout follows.
        let at = 4 + 5 + 6 + 4;
        assert_eq!(&v2[4..at], &frame[4..at]);
        assert_eq!(i32::from_be_bytes(v2[at..at + 4].try_into().expect("4")), 15_000);
        assert_eq!(&v2[at + 4..], &frame[at..]);
    }
}
