//! The Kafka RecordBatch v2 byte layout, and the validation and rewriting that the append path
//! does on it.
//!
//! Layout of one batch (all integers big-endian):
//!
//! ```text
//!  0 baseOffset: i64            12 partitionLeaderEpoch: i32   16 magic: i8 (= 2)
//!  8 batchLength: i32           17 crc: u32 (CRC-32C of bytes 21..end)
//! 21 attributes: i16           23 lastOffsetDelta: i32        27 baseTimestamp: i64
//! 35 maxTimestamp: i64         43 producerId: i64             51 producerEpoch: i16
//! 53 baseSequence: i32         57 recordsCount: i32           61 records...
//! ```
//!
//! `batchLength` counts the bytes after itself, so a batch occupies `12 + batchLength` bytes.
//! The broker rewrites only `baseOffset` and `partitionLeaderEpoch`, which the CRC does not cover,
//! so assigning offsets never recomputes the CRC. Only `LogAppendTime` (which changes attributes
//! and maxTimestamp) does.

use crate::error::BatchError;

pub const BASE_OFFSET_AT: usize = 0;
pub const LENGTH_AT: usize = 8;
pub(crate) const PARTITION_LEADER_EPOCH_AT: usize = 12;
pub const MAGIC_AT: usize = 16;
pub const CRC_AT: usize = 17;
pub const ATTRIBUTES_AT: usize = 21;
pub const LAST_OFFSET_DELTA_AT: usize = 23;
pub(crate) const BASE_TIMESTAMP_AT: usize = 27;
pub(crate) const MAX_TIMESTAMP_AT: usize = 35;
pub(crate) const PRODUCER_ID_AT: usize = 43;
pub(crate) const PRODUCER_EPOCH_AT: usize = 51;
pub(crate) const BASE_SEQUENCE_AT: usize = 53;
pub const RECORDS_COUNT_AT: usize = 57;
/// Bytes of the fixed batch header; records follow.
pub const HEADER_BYTES: usize = 61;
/// baseOffset + batchLength: the bytes not counted by `batchLength`.
pub(crate) const LOG_OVERHEAD: usize = 12;
pub(crate) const MAGIC_V2: i8 = 2;

const ATTR_COMPRESSION_MASK: i16 = 0x07;
const ATTR_TIMESTAMP_TYPE_LOG_APPEND: i16 = 0x08;
pub(crate) const ATTR_TRANSACTIONAL: i16 = 0x10;
pub(crate) const ATTR_CONTROL: i16 = 0x20;

/// How the timestamps of a batch were set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampType {
    /// The producer's clock (Kafka's default).
    CreateTime,
    /// The broker's clock when the batch was appended.
    LogAppendTime,
}

/// The compression codec of a batch (attributes bits 0..3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

/// The fixed header of one batch, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    pub(crate) batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records_count: i32,
}

impl BatchHeader {
    /// Decodes the header from the first [`HEADER_BYTES`] of `bytes`, without checking anything.
    /// Returns `None` if `bytes` is shorter than a header.
    pub fn parse(bytes: &[u8]) -> Option<BatchHeader> {
        if bytes.len() < HEADER_BYTES {
            return None;
        }
        Some(BatchHeader {
            base_offset: be_i64(bytes, BASE_OFFSET_AT),
            batch_length: be_i32(bytes, LENGTH_AT),
            partition_leader_epoch: be_i32(bytes, PARTITION_LEADER_EPOCH_AT),
            magic: bytes[MAGIC_AT] as i8,
            crc: be_u32(bytes, CRC_AT),
            attributes: be_i16(bytes, ATTRIBUTES_AT),
            last_offset_delta: be_i32(bytes, LAST_OFFSET_DELTA_AT),
            base_timestamp: be_i64(bytes, BASE_TIMESTAMP_AT),
            max_timestamp: be_i64(bytes, MAX_TIMESTAMP_AT),
            producer_id: be_i64(bytes, PRODUCER_ID_AT),
            producer_epoch: be_i16(bytes, PRODUCER_EPOCH_AT),
            base_sequence: be_i32(bytes, BASE_SEQUENCE_AT),
            records_count: be_i32(bytes, RECORDS_COUNT_AT),
        })
    }

    /// Total bytes the batch occupies on disk, or `None` if `batchLength` cannot describe a batch.
    pub fn size_bytes(&self) -> Option<usize> {
        let length = usize::try_from(self.batch_length).ok()?;
        if length + LOG_OVERHEAD < HEADER_BYTES {
            return None;
        }
        Some(length + LOG_OVERHEAD)
    }

    /// Offset of the last record in the batch.
    pub fn last_offset(&self) -> i64 {
        self.base_offset + i64::from(self.last_offset_delta)
    }

    /// The offset after this batch (the next batch's base offset, unless compaction left a gap).
    pub fn next_offset(&self) -> i64 {
        self.last_offset() + 1
    }

    pub fn compression(&self) -> Option<Compression> {
        match self.attributes & ATTR_COMPRESSION_MASK {
            0 => Some(Compression::None),
            1 => Some(Compression::Gzip),
            2 => Some(Compression::Snappy),
            3 => Some(Compression::Lz4),
            4 => Some(Compression::Zstd),
            _ => None,
        }
    }

    pub fn timestamp_type(&self) -> TimestampType {
        if self.attributes & ATTR_TIMESTAMP_TYPE_LOG_APPEND != 0 {
            TimestampType::LogAppendTime
        } else {
            TimestampType::CreateTime
        }
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & ATTR_TRANSACTIONAL != 0
    }

    pub fn is_control(&self) -> bool {
        self.attributes & ATTR_CONTROL != 0
    }
}

/// What the append path learned about a buffer of batches while validating it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchesSummary {
    pub batch_count: u32,
    /// Sum of `lastOffsetDelta + 1`: how many offsets the batches will take.
    pub(crate) offset_count: u64,
    pub record_count: u64,
    /// The largest maxTimestamp of the batches (CreateTime as the producer sent it).
    pub max_timestamp: i64,
    /// The first batch's maxTimestamp (used to decide time-based segment rolls, as Kafka does).
    pub(crate) first_max_timestamp: i64,
}

/// Checks that `bytes` is a sequence of whole, intact v2 batches, none larger than
/// `max_batch_bytes`, without copying or decompressing anything.
///
/// Checks: the length fields tile the buffer exactly; magic is 2; the CRC-32C matches;
/// the record count is positive and agrees with `lastOffsetDelta`; a known compression codec;
/// for uncompressed batches, the record framing (each record's length and offset delta) agrees
/// with the count. Compressed batches are not decompressed: the CRC already protects their bytes
/// and the consumer validates the records (Kafka's clients do).
pub fn validate_batches(bytes: &[u8], max_batch_bytes: usize) -> Result<BatchesSummary, BatchError> {
    if bytes.is_empty() {
        return Err(BatchError::Invalid("the record set holds no batch".into()));
    }
    let mut summary = BatchesSummary {
        batch_count: 0,
        offset_count: 0,
        record_count: 0,
        max_timestamp: i64::MIN,
        first_max_timestamp: i64::MIN,
    };
    let mut position = 0usize;
    while position < bytes.len() {
        let rest = &bytes[position..];
        let header = validate_one(rest, max_batch_bytes)?;
        let size = header.size_bytes().unwrap_or(0);
        if summary.batch_count == 0 {
            summary.first_max_timestamp = header.max_timestamp;
        }
        summary.batch_count += 1;
        summary.offset_count += u64::from(header.last_offset_delta as u32) + 1;
        summary.record_count += header.records_count as u64;
        summary.max_timestamp = summary.max_timestamp.max(header.max_timestamp);
        position += size;
    }
    Ok(summary)
}

/// Validates the batch at the start of `bytes` (which may continue past it) and returns its header.
pub fn validate_one(bytes: &[u8], max_batch_bytes: usize) -> Result<BatchHeader, BatchError> {
    let header = BatchHeader::parse(bytes).ok_or_else(|| {
        BatchError::Corrupt(format!("truncated batch header: {} bytes, a header needs {HEADER_BYTES}", bytes.len()))
    })?;
    if header.magic != MAGIC_V2 {
        return Err(BatchError::UnsupportedMagic(header.magic));
    }
    let size = header
        .size_bytes()
        .ok_or_else(|| BatchError::Corrupt(format!("invalid batch length {}", header.batch_length)))?;
    if size > max_batch_bytes {
        return Err(BatchError::TooLarge { size, max: max_batch_bytes });
    }
    if size > bytes.len() {
        return Err(BatchError::Corrupt(format!("batch length says {size} bytes but only {} remain", bytes.len())));
    }
    let batch = &bytes[..size];
    let computed = crc32c::crc32c(&batch[ATTRIBUTES_AT..]);
    if computed != header.crc {
        return Err(BatchError::Corrupt(format!(
            "CRC mismatch: stored {:#010x}, computed {computed:#010x}",
            header.crc
        )));
    }
    if header.records_count <= 0 {
        return Err(BatchError::Invalid(format!("record count {} is not positive", header.records_count)));
    }
    if header.last_offset_delta < 0 || i64::from(header.last_offset_delta) + 1 != i64::from(header.records_count) {
        return Err(BatchError::Invalid(format!(
            "inconsistent batch: lastOffsetDelta {} for {} records",
            header.last_offset_delta, header.records_count
        )));
    }
    let compression = header.compression().ok_or_else(|| {
        BatchError::Invalid(format!("unknown compression codec in attributes {:#x}", header.attributes))
    })?;
    if compression == Compression::None {
        check_record_framing(&batch[HEADER_BYTES..], header.records_count)?;
    }
    Ok(header)
}

/// Walks the records of an uncompressed batch: each is `length: varint` then `length` bytes,
/// starting with `attributes: i8`, `timestampDelta: varlong`, `offsetDelta: varint`.
fn check_record_framing(mut records: &[u8], count: i32) -> Result<(), BatchError> {
    for expected_delta in 0..count {
        let (length, used) = read_varint(records)
            .ok_or_else(|| BatchError::Corrupt(format!("record {expected_delta}: bad length varint")))?;
        records = &records[used..];
        let length = usize::try_from(length)
            .ok()
            .filter(|l| *l <= records.len() && *l > 0)
            .ok_or_else(|| BatchError::Corrupt(format!("record {expected_delta}: length {length} out of bounds")))?;
        let body = &records[..length];
        // attributes (1 byte, unused), timestampDelta (varlong), offsetDelta (varint)
        let after_attributes = &body[1..];
        let (_, ts_used) = read_varlong(after_attributes)
            .ok_or_else(|| BatchError::Corrupt(format!("record {expected_delta}: bad timestamp delta")))?;
        let (offset_delta, _) = read_varint(&after_attributes[ts_used..])
            .ok_or_else(|| BatchError::Corrupt(format!("record {expected_delta}: bad offset delta")))?;
        if offset_delta != expected_delta {
            return Err(BatchError::Invalid(format!("record {expected_delta} has offset delta {offset_delta}")));
        }
        records = &records[length..];
    }
    if !records.is_empty() {
        return Err(BatchError::Invalid(format!("{} bytes after the last of {count} records", records.len())));
    }
    Ok(())
}

/// Rewrites the header of every batch in `bytes` (already validated) for append at `base_offset`:
/// sets baseOffset and partitionLeaderEpoch, and with `LogAppendTime` the timestamp type and
/// maxTimestamp (recomputing the CRC). Returns the next offset after the last batch.
pub fn assign_offsets(
    bytes: &mut [u8],
    mut next_offset: i64,
    partition_leader_epoch: i32,
    log_append_time_ms: Option<i64>,
) -> i64 {
    let mut position = 0usize;
    while position + HEADER_BYTES <= bytes.len() {
        let batch_length = be_i32(bytes, position + LENGTH_AT);
        let size = batch_length as usize + LOG_OVERHEAD;
        let last_offset_delta = be_i32(bytes, position + LAST_OFFSET_DELTA_AT);
        let batch = &mut bytes[position..position + size];
        batch[BASE_OFFSET_AT..BASE_OFFSET_AT + 8].copy_from_slice(&next_offset.to_be_bytes());
        batch[PARTITION_LEADER_EPOCH_AT..PARTITION_LEADER_EPOCH_AT + 4]
            .copy_from_slice(&partition_leader_epoch.to_be_bytes());
        if let Some(now) = log_append_time_ms {
            let attributes = be_i16(batch, ATTRIBUTES_AT) | ATTR_TIMESTAMP_TYPE_LOG_APPEND;
            batch[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&attributes.to_be_bytes());
            batch[MAX_TIMESTAMP_AT..MAX_TIMESTAMP_AT + 8].copy_from_slice(&now.to_be_bytes());
            let crc = crc32c::crc32c(&batch[ATTRIBUTES_AT..]);
            batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        }
        next_offset += i64::from(last_offset_delta) + 1;
        position += size;
    }
    next_offset
}

/// The type of a transaction marker (the key of a control batch's record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ControlType {
    Abort,
    Commit,
    /// A control record this version does not know (e.g. leader-change records of KRaft).
    Other(i16),
}

/// Reads the control type of a control batch (uncompressed, as Kafka writes them): the key of
/// its first record is `version: i16, type: i16`. `None` if the bytes do not hold one.
pub(crate) fn control_type(batch: &[u8]) -> Option<ControlType> {
    let header = BatchHeader::parse(batch)?;
    if !header.is_control() || header.compression() != Some(Compression::None) {
        return None;
    }
    let records = batch.get(HEADER_BYTES..)?;
    let (_length, used) = read_varint(records)?;
    let body = records.get(used..)?;
    // attributes (1 byte), timestampDelta (varlong), offsetDelta (varint), keyLength (varint)
    let rest = body.get(1..)?;
    let (_, ts_used) = read_varlong(rest)?;
    let rest = rest.get(ts_used..)?;
    let (_, delta_used) = read_varint(rest)?;
    let rest = rest.get(delta_used..)?;
    let (key_length, key_used) = read_varint(rest)?;
    if key_length < 4 {
        return None;
    }
    let key = rest.get(key_used..key_used + 4)?;
    Some(match i16::from_be_bytes([key[2], key[3]]) {
        0 => ControlType::Abort,
        1 => ControlType::Commit,
        other => ControlType::Other(other),
    })
}

/// The length of the longest prefix of `bytes` made of whole batches: a fetch response may end
/// with a partial batch (Kafka leaders cut at the byte limit), which a follower leaves for its
/// next fetch.
pub fn whole_batches_len(bytes: &[u8]) -> usize {
    let mut position = 0usize;
    while let Some(size) = bytes.get(position..).and_then(BatchHeader::parse).and_then(|h| h.size_bytes()) {
        if size == 0 || position + size > bytes.len() {
            break;
        }
        position += size;
    }
    position
}

/// Iterates over the headers of a buffer of whole batches (already validated), with each
/// batch's position in the buffer.
pub fn headers(bytes: &[u8]) -> impl Iterator<Item = (usize, BatchHeader)> + '_ {
    let mut position = 0usize;
    std::iter::from_fn(move || {
        let header = BatchHeader::parse(bytes.get(position..)?)?;
        let at = position;
        position += header.size_bytes()?;
        Some((at, header))
    })
}

pub(crate) fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
pub(crate) fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
pub(crate) fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
pub(crate) fn be_i64(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(a)
}

/// Reads a zigzag varint (Kafka's `varint`), returning the value and the bytes used.
fn read_varint(bytes: &[u8]) -> Option<(i32, usize)> {
    let (raw, used) = read_unsigned(bytes, 5)?;
    let raw = u32::try_from(raw).ok()?;
    Some((((raw >> 1) as i32) ^ -((raw & 1) as i32), used))
}

/// Reads a zigzag varlong (Kafka's `varlong`).
fn read_varlong(bytes: &[u8]) -> Option<(i64, usize)> {
    let (raw, used) = read_unsigned(bytes, 10)?;
    Some((((raw >> 1) as i64) ^ -((raw & 1) as i64), used))
}

fn read_unsigned(bytes: &[u8], max_bytes: usize) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, byte) in bytes.iter().take(max_bytes).enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{batch, BatchSpec};

    #[test]
    fn given_valid_batch_when_validated_should_summarize_it() {
        let bytes = batch(&BatchSpec { records: 3, value_bytes: 10, timestamp: 1_000, ..Default::default() });
        let summary = validate_batches(&bytes, 1 << 20).expect("valid");
        assert_eq!(summary.batch_count, 1);
        assert_eq!(summary.offset_count, 3);
        assert_eq!(summary.max_timestamp, 1_002);
    }

    #[test]
    fn given_flipped_byte_when_validated_should_report_corrupt() {
        let mut bytes = batch(&BatchSpec { records: 2, value_bytes: 10, ..Default::default() });
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        assert!(matches!(validate_batches(&bytes, 1 << 20), Err(BatchError::Corrupt(_))));
    }

    #[test]
    fn given_oversize_batch_when_validated_should_report_too_large() {
        let bytes = batch(&BatchSpec { records: 2, value_bytes: 1000, ..Default::default() });
        assert!(matches!(validate_batches(&bytes, 500), Err(BatchError::TooLarge { .. })));
    }

    #[test]
    fn given_truncated_buffer_when_validated_should_report_corrupt() {
        let bytes = batch(&BatchSpec { records: 2, value_bytes: 10, ..Default::default() });
        for cut in [1, 30, HEADER_BYTES, bytes.len() - 1] {
            assert!(validate_batches(&bytes[..cut], 1 << 20).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn given_log_append_time_when_assigning_offsets_should_keep_crc_valid() {
        let mut bytes = batch(&BatchSpec { records: 4, value_bytes: 10, ..Default::default() });
        bytes.extend(batch(&BatchSpec { records: 2, value_bytes: 5, ..Default::default() }));
        let next = assign_offsets(&mut bytes, 100, 7, Some(42));
        assert_eq!(next, 106);
        validate_batches(&bytes, 1 << 20).expect("CRC recomputed");
        let all: Vec<_> = headers(&bytes).collect();
        assert_eq!(all[0].1.base_offset, 100);
        assert_eq!(all[1].1.base_offset, 104);
        assert_eq!(all[1].1.partition_leader_epoch, 7);
        assert_eq!(all[1].1.max_timestamp, 42);
        assert_eq!(all[1].1.timestamp_type(), TimestampType::LogAppendTime);
    }

    #[test]
    fn varints_round_trip_kafka_examples() {
        // zigzag: 0 -> 0, -1 -> 1, 1 -> 2, 300 -> 600 = [0xd8, 0x04]
        assert_eq!(read_varint(&[0x00]), Some((0, 1)));
        assert_eq!(read_varint(&[0x01]), Some((-1, 1)));
        assert_eq!(read_varint(&[0x02]), Some((1, 1)));
        assert_eq!(read_varint(&[0xd8, 0x04]), Some((300, 2)));
        assert_eq!(read_varint(&[0x80]), None);
    }
}
