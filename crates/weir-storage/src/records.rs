//! Records inside RecordBatch v2: Weir's codec for the batches the broker builds itself (internal
//! topics, transaction markers, HTTP produce, recompression) and for the records it reads back
//! (HTTP consume, loading internal topics, timestamp lookups, compaction checks).
//!
//! Record layout, after the batch header (`batch`), optionally compressed as a whole:
//!
//! ```text
//! length: varint | attributes: i8 | timestampDelta: varlong | offsetDelta: varint
//! keyLength: varint (-1: null) | key | valueLength: varint (-1: null) | value
//! headerCount: varint | { keyLength: varint | key (UTF-8) | valueLength: varint (-1: null) | value }*
//! ```
//!
//! Headers are a list, not a map: Kafka allows a name more than once and keeps every value in
//! order, and so does this codec. Compression codecs come from the `kafka-protocol` crate (its
//! snappy is Kafka's xerial framing, read with the raw fallback Kafka has); nothing else of that
//! crate is used here.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::compression::{Compressor, Decompressor, Gzip, Lz4, Snappy, Zstd};

use crate::batch::{self, BatchHeader, Compression, TimestampType, HEADER_BYTES};
use crate::error::BatchError;

/// One header of a record. Names are UTF-8 in Kafka; bytes that are not are replaced (`�`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub value: Option<Bytes>,
}

impl Header {
    pub fn new(name: impl Into<String>, value: Option<Bytes>) -> Header {
        Header { name: name.into(), value }
    }
}

/// A record: what it carries and where it sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Absolute offset when decoded; ignored when encoding (records take offsets in order).
    pub offset: i64,
    /// Milliseconds since the epoch (with `LogAppendTime`, the broker's append time).
    pub timestamp: i64,
    pub key: Option<Bytes>,
    /// `None`: a tombstone.
    pub value: Option<Bytes>,
    pub headers: Vec<Header>,
}

impl Record {
    pub fn new(timestamp: i64, key: Option<Bytes>, value: Option<Bytes>) -> Record {
        Record { offset: 0, timestamp, key, value, headers: Vec::new() }
    }

    /// The value of the first header named `name`.
    pub fn header(&self, name: &str) -> Option<&Header> {
        self.headers.iter().find(|h| h.name == name)
    }
}

/// A decoded batch: its header and its records (none for a control batch's marker unless asked).
#[derive(Debug, Clone)]
pub struct DecodedBatch {
    pub header: BatchHeader,
    pub records: Vec<Record>,
}

/// Decodes every whole batch in `bytes` (as a log read returns them), decompressing as needed.
/// Bytes after the last whole batch are ignored; a batch that does not parse is an error.
pub fn decode_batches(bytes: &[u8]) -> Result<Vec<DecodedBatch>, BatchError> {
    decode_each(bytes, |body| Bytes::copy_from_slice(&bytes[body]))
}

/// As [`decode_batches`], without copying: the records of an uncompressed batch are slices of
/// `bytes` itself. Any of them keeps the whole buffer alive, so this is for readers that hand
/// the records out and drop them soon (a receive), not for records kept for long.
pub fn decode_shared_batches(bytes: &Bytes) -> Result<Vec<DecodedBatch>, BatchError> {
    decode_each(bytes, |body| bytes.slice(body))
}

/// Decodes each whole batch of `bytes`, its body (after the header) taken by `body_of`.
fn decode_each(
    bytes: &[u8],
    body_of: impl Fn(std::ops::Range<usize>) -> Bytes,
) -> Result<Vec<DecodedBatch>, BatchError> {
    let mut out = Vec::new();
    for (at, header) in batch::headers(bytes) {
        let size = header.size_bytes().ok_or_else(|| corrupt(format!("batch length {}", header.batch_length)))?;
        let end = at.checked_add(size).filter(|end| *end <= bytes.len()).ok_or_else(|| corrupt("truncated batch"))?;
        out.push(decode_batch(header, body_of(at + HEADER_BYTES..end))?);
    }
    Ok(out)
}

/// The records of every non-control batch in `bytes`, in offset order.
pub fn decode_records(bytes: &[u8]) -> Result<Vec<Record>, BatchError> {
    Ok(decode_batches(bytes)?.into_iter().filter(|b| !b.header.is_control()).flat_map(|b| b.records).collect())
}

fn corrupt(why: impl Into<String>) -> BatchError {
    BatchError::Corrupt(why.into())
}

fn decode_batch(header: BatchHeader, body: Bytes) -> Result<DecodedBatch, BatchError> {
    if header.magic != batch::MAGIC_V2 {
        return Err(BatchError::UnsupportedMagic(header.magic));
    }
    let compression = header.compression().ok_or_else(|| {
        BatchError::Invalid(format!("unknown compression codec in attributes {:#x}", header.attributes))
    })?;
    let raw = decompress(compression, body)?;
    let count = usize::try_from(header.records_count).map_err(|_| corrupt("negative record count"))?;
    // Every record takes at least 7 bytes: a count beyond that is a lie, not an allocation.
    let mut records = Vec::with_capacity(count.min(raw.len() / 7 + 1));
    let mut cursor = Cursor { bytes: raw, at: 0 };
    for n in 0..count {
        let record = cursor
            .record(&header)
            .map_err(|why| corrupt(format!("record {n} of the batch at offset {}: {why}", header.base_offset)))?;
        records.push(record);
    }
    Ok(DecodedBatch { header, records })
}

fn decompress(compression: Compression, mut input: Bytes) -> Result<Bytes, BatchError> {
    let take = |buf: &mut Bytes| Ok(buf.copy_to_bytes(buf.remaining()));
    let result = match compression {
        Compression::None => return Ok(input),
        Compression::Gzip => Gzip::decompress(&mut input, take),
        Compression::Snappy => Snappy::decompress(&mut input, take),
        Compression::Lz4 => Lz4::decompress(&mut input, take),
        Compression::Zstd => Zstd::decompress(&mut input, take),
    };
    result.map_err(|e| corrupt(format!("cannot decompress {compression:?} records: {e:#}")))
}

fn compress(compression: Compression, raw: &[u8]) -> Result<BytesMut, BatchError> {
    let mut out = BytesMut::with_capacity(raw.len() / 2 + 64);
    let fill = |buf: &mut BytesMut| {
        buf.put_slice(raw);
        Ok(())
    };
    let result = match compression {
        Compression::None => {
            out.put_slice(raw);
            Ok(())
        }
        Compression::Gzip => Gzip::compress(&mut out, fill),
        Compression::Snappy => Snappy::compress(&mut out, fill),
        Compression::Lz4 => Lz4::compress(&mut out, fill),
        Compression::Zstd => Zstd::compress(&mut out, fill),
    };
    result.map_err(|e| BatchError::Invalid(format!("cannot compress records with {compression:?}: {e:#}")))?;
    Ok(out)
}

/// Reads the fields of records; the byte fields it returns are slices of `bytes` (no copy).
struct Cursor {
    bytes: Bytes,
    at: usize,
}

impl Cursor {
    fn varlong(&mut self) -> Result<i64, String> {
        let mut raw: u64 = 0;
        for i in 0..10 {
            let byte = *self.bytes.get(self.at).ok_or("truncated varint")?;
            self.at += 1;
            raw |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(((raw >> 1) as i64) ^ -((raw & 1) as i64));
            }
        }
        Err("varint longer than 10 bytes".into())
    }

    fn varint(&mut self) -> Result<i32, String> {
        i32::try_from(self.varlong()?).map_err(|_| "varint out of range".to_string())
    }

    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|end| *end <= self.bytes.len()).ok_or("truncated field")?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    /// A length-prefixed field; length -1 is null.
    fn nullable(&mut self) -> Result<Option<Bytes>, String> {
        match self.varint()? {
            -1 => Ok(None),
            n if n < 0 => Err(format!("negative length {n}")),
            n => {
                let start = self.at;
                self.take(n as usize)?;
                Ok(Some(self.bytes.slice(start..self.at)))
            }
        }
    }

    fn record(&mut self, header: &BatchHeader) -> Result<Record, String> {
        let length = usize::try_from(self.varint()?).map_err(|_| "negative record length")?;
        let end = self.at.checked_add(length).filter(|end| *end <= self.bytes.len()).ok_or("record past the batch")?;
        // One copy of the record, whose key, value and header values are slices of it: one
        // allocation a record instead of one a field, and a record kept (the timer keeps
        // some in memory) does not keep its whole batch alive.
        let mut fields = Cursor { bytes: Bytes::copy_from_slice(&self.bytes[self.at..end]), at: 0 };
        self.at = end;
        fields.take(1)?; // attributes: unused
        let timestamp_delta = fields.varlong()?;
        let offset_delta = fields.varint()?;
        let key = fields.nullable()?;
        let value = fields.nullable()?;
        let count = usize::try_from(fields.varint()?).map_err(|_| "negative header count")?;
        let mut headers = Vec::with_capacity(count.min(length / 2 + 1));
        for _ in 0..count {
            let name = fields.nullable()?.ok_or("a header without a name")?;
            let value = fields.nullable()?;
            let name = match std::str::from_utf8(&name) {
                Ok(name) => name.to_owned(),
                Err(_) => String::from_utf8_lossy(&name).into_owned(),
            };
            headers.push(Header { name, value });
        }
        if fields.at != length {
            return Err(format!("record length {length} does not match its fields"));
        }
        let timestamp = match header.timestamp_type() {
            TimestampType::LogAppendTime => header.max_timestamp,
            TimestampType::CreateTime => header.base_timestamp.wrapping_add(timestamp_delta),
        };
        Ok(Record { offset: header.base_offset + i64::from(offset_delta), timestamp, key, value, headers })
    }
}

fn put_varlong(buf: &mut BytesMut, value: i64) {
    let mut raw = ((value << 1) ^ (value >> 63)) as u64;
    while raw >= 0x80 {
        buf.put_u8((raw as u8) | 0x80);
        raw >>= 7;
    }
    buf.put_u8(raw as u8);
}

fn put_nullable(buf: &mut BytesMut, bytes: Option<&[u8]>) {
    match bytes {
        None => put_varlong(buf, -1),
        Some(b) => {
            put_varlong(buf, b.len() as i64);
            buf.put_slice(b);
        }
    }
}

/// How to build a batch: who produced it and how it is stored. The default is what the broker
/// writes for itself: no producer, uncompressed, `CreateTime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchOptions {
    /// The first record's offset (the log assigns the real one when it appends a batch).
    pub base_offset: i64,
    pub compression: Compression,
    pub timestamp_type: TimestampType,
    /// -1: no producer (no idempotence).
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// The first record's sequence (-1 without a producer); record `i` has `base + i`.
    pub base_sequence: i32,
    pub transactional: bool,
    pub control: bool,
    pub partition_leader_epoch: i32,
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions {
            base_offset: 0,
            compression: Compression::None,
            timestamp_type: TimestampType::CreateTime,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            transactional: false,
            control: false,
            partition_leader_epoch: -1,
        }
    }
}

impl BatchOptions {
    /// The options a decoded batch was written with, for writing its records again (the
    /// broker recompressing a producer's batch keeps who produced it).
    pub fn of(header: &BatchHeader) -> BatchOptions {
        BatchOptions {
            base_offset: header.base_offset,
            compression: header.compression().unwrap_or(Compression::None),
            timestamp_type: header.timestamp_type(),
            producer_id: header.producer_id,
            producer_epoch: header.producer_epoch,
            base_sequence: header.base_sequence,
            transactional: header.is_transactional(),
            control: header.is_control(),
            partition_leader_epoch: header.partition_leader_epoch,
        }
    }
}

/// Encodes `records` as one batch at `options.base_offset`, offsets in order. The batch is valid by
/// `batch::validate_one` (the tests check it). An empty list is refused: a batch has a record.
pub fn encode_batch(records: &[Record], options: &BatchOptions) -> Result<BytesMut, BatchError> {
    let Some(first) = records.first() else {
        return Err(BatchError::Invalid("a batch needs at least one record".into()));
    };
    let count =
        i32::try_from(records.len()).map_err(|_| BatchError::Invalid("too many records for one batch".into()))?;
    let base_timestamp = first.timestamp;
    let max_timestamp = records.iter().map(|r| r.timestamp).max().unwrap_or(base_timestamp);
    let mut raw = BytesMut::new();
    let mut body = BytesMut::new();
    for (i, record) in records.iter().enumerate() {
        body.clear();
        body.put_i8(0);
        put_varlong(&mut body, record.timestamp.wrapping_sub(base_timestamp));
        put_varlong(&mut body, i as i64);
        put_nullable(&mut body, record.key.as_deref());
        put_nullable(&mut body, record.value.as_deref());
        put_varlong(&mut body, record.headers.len() as i64);
        for h in &record.headers {
            put_nullable(&mut body, Some(h.name.as_bytes()));
            put_nullable(&mut body, h.value.as_deref());
        }
        put_varlong(&mut raw, body.len() as i64);
        raw.put_slice(&body);
    }
    let records_bytes = compress(options.compression, &raw)?;
    let mut attributes: i16 = match options.compression {
        Compression::None => 0,
        Compression::Gzip => 1,
        Compression::Snappy => 2,
        Compression::Lz4 => 3,
        Compression::Zstd => 4,
    };
    if options.timestamp_type == TimestampType::LogAppendTime {
        attributes |= 0x08;
    }
    if options.transactional {
        attributes |= batch::ATTR_TRANSACTIONAL;
    }
    if options.control {
        attributes |= batch::ATTR_CONTROL;
    }
    let batch_length = i32::try_from(HEADER_BYTES - batch::LOG_OVERHEAD + records_bytes.len())
        .map_err(|_| BatchError::TooLarge { size: records_bytes.len(), max: i32::MAX as usize })?;
    let mut out = BytesMut::with_capacity(HEADER_BYTES + records_bytes.len());
    out.put_i64(options.base_offset);
    out.put_i32(batch_length);
    out.put_i32(options.partition_leader_epoch);
    out.put_i8(batch::MAGIC_V2);
    out.put_u32(0); // CRC, below
    out.put_i16(attributes);
    out.put_i32(count - 1);
    out.put_i64(base_timestamp);
    out.put_i64(max_timestamp);
    out.put_i64(options.producer_id);
    out.put_i16(options.producer_epoch);
    out.put_i32(options.base_sequence);
    out.put_i32(count);
    out.put_slice(&records_bytes);
    let crc = crc32c::crc32c(&out[batch::ATTRIBUTES_AT..]);
    out[batch::CRC_AT..batch::CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}

/// Stores the batches of `bytes` with `target`'s codec, as a topic's `compression.type` asks:
/// each batch in another codec is validated, decoded and encoded again with everything but the
/// codec kept (producer id, epoch and sequences, the transactional flag, timestamps, headers).
/// Control batches and batches already in `target` are kept byte for byte. `None` when every
/// batch is already in `target`: then nothing is decoded or copied.
pub fn recompress(bytes: &[u8], target: Compression, max_batch_bytes: usize) -> Result<Option<BytesMut>, BatchError> {
    let keeps = |h: &BatchHeader| h.is_control() || h.compression() == Some(target);
    if batch::headers(bytes).all(|(_, h)| keeps(&h)) {
        return Ok(None);
    }
    // Checked first: a batch with a wrong CRC must be refused, not re-encoded with a right one.
    batch::validate_batches(bytes, max_batch_bytes)?;
    let mut out = BytesMut::with_capacity(bytes.len());
    for (at, header) in batch::headers(bytes) {
        let size = header.size_bytes().ok_or_else(|| corrupt(format!("batch length {}", header.batch_length)))?;
        let whole = &bytes[at..at + size];
        if keeps(&header) {
            out.extend_from_slice(whole);
            continue;
        }
        let decoded = decode_batch(header, Bytes::copy_from_slice(&whole[HEADER_BYTES..]))?;
        let options = BatchOptions { compression: target, ..BatchOptions::of(&header) };
        out.extend_from_slice(&encode_batch(&decoded.records, &options)?);
    }
    Ok(Some(out))
}

/// A transaction marker: a control batch of one record whose key is (version 0, type: 0 abort,
/// 1 commit) and whose value is (version 0, coordinator epoch 0).
pub fn control_batch(producer_id: i64, producer_epoch: i16, commit: bool, timestamp_ms: i64) -> BytesMut {
    let kind: i16 = if commit { 1 } else { 0 };
    let mut key = BytesMut::with_capacity(4);
    key.put_i16(0);
    key.put_i16(kind);
    let record = Record::new(timestamp_ms, Some(key.freeze()), Some(Bytes::from_static(&[0; 6])));
    let options =
        BatchOptions { producer_id, producer_epoch, transactional: true, control: true, ..BatchOptions::default() };
    // One uncompressed record of known size: encoding cannot fail.
    encode_batch(std::slice::from_ref(&record), &options).unwrap_or_else(|e| {
        tracing::error!(error = %e, "cannot encode a transaction marker");
        BytesMut::new()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: usize) -> Vec<Record> {
        (0..n)
            .map(|i| Record {
                offset: 0,
                timestamp: 1_700_000_000_000 + (i as i64 % 3) * 10 - 5,
                key: (i % 4 != 3).then(|| Bytes::from(format!("key-{i}"))),
                value: (i % 5 != 4).then(|| Bytes::from(vec![b'v'; i * 37 % 300])),
                headers: vec![
                    Header::new("trace", Some(Bytes::from_static(b"a"))),
                    Header::new("trace", Some(Bytes::from_static(b"b"))),
                    Header::new("empty", None),
                ],
            })
            .collect()
    }

    #[test]
    fn every_codec_round_trips_records_with_repeated_headers() {
        for compression in
            [Compression::None, Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd]
        {
            let records = sample(50);
            let options = BatchOptions {
                compression,
                producer_id: 7,
                producer_epoch: 2,
                base_sequence: 40,
                ..BatchOptions::default()
            };
            let bytes = encode_batch(&records, &options).unwrap();
            let header = batch::validate_one(&bytes, usize::MAX).unwrap_or_else(|e| panic!("{compression:?}: {e}"));
            assert_eq!((header.producer_id, header.producer_epoch, header.base_sequence), (7, 2, 40));
            assert_eq!(header.compression(), Some(compression));
            let decoded = decode_batches(&bytes).unwrap();
            assert_eq!(decoded.len(), 1);
            let got = &decoded[0].records;
            assert_eq!(got.len(), records.len(), "{compression:?}");
            for (i, (got, want)) in got.iter().zip(&records).enumerate() {
                assert_eq!(got.offset, i as i64);
                assert_eq!(
                    (&got.timestamp, &got.key, &got.value, &got.headers),
                    (&want.timestamp, &want.key, &want.value, &want.headers)
                );
            }
            assert_eq!(BatchOptions::of(&decoded[0].header), options);
        }
    }

    #[test]
    fn records_of_another_encoder_decode_with_their_offsets() {
        // The kafka-protocol crate's encoder, as the test helpers use it: an independent writer.
        let mut bytes = crate::testing::batch(&crate::testing::BatchSpec {
            records: 5,
            keys: Some(vec![b"k".to_vec()]),
            ..Default::default()
        });
        crate::batch::assign_offsets(&mut bytes, 100, 3, None);
        let records = decode_records(&bytes).unwrap();
        assert_eq!(records.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![100, 101, 102, 103, 104]);
        assert_eq!(records[2].key.as_deref(), Some(&b"k"[..]));
    }

    #[test]
    fn recompression_changes_only_the_codec_and_refuses_a_bad_crc() {
        let records = sample(20);
        let options = BatchOptions {
            compression: Compression::Gzip,
            producer_id: 3,
            producer_epoch: 1,
            base_sequence: 9,
            transactional: true,
            ..BatchOptions::default()
        };
        let mut bytes = encode_batch(&records, &options).unwrap().to_vec();
        let marker = control_batch(3, 1, true, 7);
        bytes.extend_from_slice(&marker);
        assert!(recompress(&bytes, Compression::Gzip, usize::MAX).unwrap().is_none(), "already gzip: nothing to do");
        let lz4 = recompress(&bytes, Compression::Lz4, usize::MAX).unwrap().expect("recompressed");
        let batches = decode_batches(&lz4).unwrap();
        assert_eq!(batches.len(), 2);
        assert_eq!(batches[0].header.compression(), Some(Compression::Lz4));
        assert_eq!(BatchOptions { compression: Compression::Gzip, ..BatchOptions::of(&batches[0].header) }, options);
        assert_eq!(batches[0].records, decode_batches(&bytes).unwrap()[0].records);
        assert_eq!(&lz4[lz4.len() - marker.len()..], &marker[..], "the marker is kept as it was");
        batch::validate_batches(&lz4, usize::MAX).unwrap();
        let mut corrupt = bytes.clone();
        corrupt[HEADER_BYTES + 3] ^= 0xff;
        assert!(matches!(recompress(&corrupt, Compression::Lz4, usize::MAX), Err(BatchError::Corrupt(_))));
    }

    #[test]
    fn markers_are_control_batches_and_skipped_as_records() {
        let marker = control_batch(9, 1, true, 5);
        let header = batch::validate_one(&marker, usize::MAX).unwrap();
        assert!(header.is_control() && header.is_transactional());
        assert_eq!(batch::control_type(&marker), Some(batch::ControlType::Commit));
        assert!(decode_records(&marker).unwrap().is_empty());
        assert_eq!(decode_batches(&marker).unwrap()[0].records.len(), 1);
    }

    #[test]
    fn malformed_records_are_errors_not_panics() {
        let good = encode_batch(&sample(3), &BatchOptions::default()).unwrap();
        for cut in [HEADER_BYTES + 1, good.len() / 2, good.len() - 1] {
            let mut bytes = good.to_vec();
            bytes.truncate(cut);
            // Keep the declared length, so the batch claims bytes it does not have.
            assert!(decode_batches(&bytes).map(|b| b.is_empty()).unwrap_or(true));
        }
        let mut lying = good.to_vec();
        lying[batch::RECORDS_COUNT_AT..batch::RECORDS_COUNT_AT + 4].copy_from_slice(&1_000_000i32.to_be_bytes());
        assert!(matches!(decode_batches(&lying), Err(BatchError::Corrupt(_))));
        let mut garbage = good.to_vec();
        for b in &mut garbage[HEADER_BYTES..] {
            *b = 0xff;
        }
        assert!(decode_batches(&garbage).is_err());
        assert!(encode_batch(&[], &BatchOptions::default()).is_err());
    }
}
