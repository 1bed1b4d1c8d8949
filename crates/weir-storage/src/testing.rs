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
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: KTimestampType::Creation,
            offset: i as i64,
            // The encoder groups records whose offset - sequence agree; -1 + i keeps baseSequence = -1.
            sequence: i as i32 - 1,
            timestamp: spec.timestamp + i as i64,
            key: spec.keys.as_ref().filter(|k| !k.is_empty()).map(|k| Bytes::from(k[i % k.len()].clone())),
            value: if spec.tombstones.contains(&i) {
                None
            } else {
                Some(Bytes::from(vec![spec.fill.wrapping_add(i as u8); spec.value_bytes]))
            },
            headers: Default::default(),
        })
        .collect();
    encode(&records, spec.compression)
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
