//! Builders of real RecordBatch v2 bytes for tests and benchmarks. Batches are encoded with the
//! `kafka-protocol` crate's encoder, an implementation independent of this crate's parser.

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{
    Compression as KCompression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType as KTimestampType,
};

use crate::batch::Compression;

/// One batch to build.
#[derive(Debug, Clone)]
pub struct BatchSpec {
    pub records: usize,
    pub value_bytes: usize,
    /// Timestamp of the first record; record `i` gets `timestamp + i`.
    pub timestamp: i64,
    /// Keys for the records (`None`: no keys). Cycled if shorter than `records`.
    pub keys: Option<Vec<Vec<u8>>>,
    /// Records whose value is null (tombstones), by index.
    pub tombstones: Vec<usize>,
    pub compression: Compression,
    /// Fill byte for values, so batches differ.
    pub fill: u8,
}

impl Default for BatchSpec {
    fn default() -> Self {
        BatchSpec {
            records: 1,
            value_bytes: 16,
            timestamp: 1_700_000_000_000,
            keys: None,
            tombstones: Vec::new(),
            compression: Compression::None,
            fill: b'x',
        }
    }
}

/// Encodes one batch as a producer would send it (base offset 0, no producer id).
pub fn batch(spec: &BatchSpec) -> Vec<u8> {
    let records: Vec<Record> = (0..spec.records)
        .map(|i| {
            let key = spec.keys.as_ref().filter(|k| !k.is_empty()).map(|k| Bytes::from(k[i % k.len()].clone()));
            let value = (!spec.tombstones.contains(&i))
                .then(|| Bytes::from(vec![spec.fill.wrapping_add(i as u8); spec.value_bytes]));
            record(i as i64, spec.timestamp + i as i64, key, value)
        })
        .collect();
    encode(&records, spec.compression)
}

/// A producer's record (no producer id) at `offset` within its batch.
pub fn record(offset: i64, timestamp: i64, key: Option<Bytes>, value: Option<Bytes>) -> Record {
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: KTimestampType::Creation,
        offset,
        // The encoder groups records whose offset - sequence agree; offset - 1 keeps baseSequence = -1.
        sequence: offset as i32 - 1,
        timestamp,
        key,
        value,
        headers: Default::default(),
    }
}

/// Encodes `records` into one batch (records must share producer fields, as a producer's do).
pub fn encode(records: &[Record], compression: Compression) -> Vec<u8> {
    let compression = match compression {
        Compression::None => KCompression::None,
        Compression::Gzip => KCompression::Gzip,
        Compression::Snappy => KCompression::Snappy,
        Compression::Lz4 => KCompression::Lz4,
        Compression::Zstd => KCompression::Zstd,
    };
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(&mut buf, records, &RecordEncodeOptions { version: 2, compression })
        .expect("encoding in-memory records cannot fail");
    buf.to_vec()
}
