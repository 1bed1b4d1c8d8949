//! Records of the broker's own logs (the metadata log, `__consumer_offsets`): key/value pairs in
//! ordinary RecordBatch v2 batches, so the storage engine, recovery and compaction treat them
//! like any topic's data.

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

/// Encodes `entries` (key, value; `None` value is a tombstone) as one uncompressed batch.
pub fn encode_batch(entries: &[(Bytes, Option<Bytes>)], timestamp_ms: i64) -> BytesMut {
    let records: Vec<Record> = entries
        .iter()
        .enumerate()
        .map(|(i, (key, value))| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: -1,
            timestamp: timestamp_ms,
            key: Some(key.clone()),
            value: value.clone(),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    // Encoding in-memory records into a growable buffer has no failure mode but an encoder bug;
    // an empty buffer then makes the append fail loudly instead of writing garbage.
    if let Err(e) = RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions { version: 2, compression: Compression::None },
    ) {
        tracing::error!(error = %e, "cannot encode an internal record batch");
        buf.clear();
    }
    buf
}

/// One record read back: its offset, key and value (`None` for a tombstone).
pub struct InternalRecord {
    pub offset: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
}

/// Decodes every record of whole batches in `bytes` (as a log read returns them); control
/// records are skipped.
pub fn decode_batches(bytes: Bytes) -> Result<Vec<InternalRecord>, String> {
    let mut buf = bytes;
    let mut out = Vec::new();
    while !buf.is_empty() {
        let set = RecordBatchDecoder::decode(&mut buf).map_err(|e| e.to_string())?;
        for record in set.records {
            if record.control {
                continue;
            }
            out.push(InternalRecord { offset: record.offset, key: record.key, value: record.value });
        }
    }
    Ok(out)
}
