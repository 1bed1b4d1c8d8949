//! Records of the broker's own logs (the metadata log, `__consumer_offsets`): key/value pairs in
//! ordinary RecordBatch v2 batches, so the storage engine, recovery and compaction treat them
//! like any topic's data.

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

/// A record as a non-idempotent producer sends it, at `offset` within its batch.
///
/// The sequence is `offset - 1`: the encoder keeps records in one batch only while
/// `offset - sequence` stays constant, and takes the batch's base sequence from the first
/// record, so this gives one batch with base sequence -1 ("none"). A constant -1 would split
/// every record into a batch of its own.
pub fn plain_record(offset: i64, timestamp_ms: i64, key: Option<Bytes>, value: Option<Bytes>) -> Record {
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset,
        sequence: (offset as i32).wrapping_sub(1),
        timestamp: timestamp_ms,
        key,
        value,
        headers: Default::default(),
    }
}

/// Encodes records (offsets 0.. within the batch) as uncompressed RecordBatch v2 bytes.
pub fn encode_records(records: &[Record]) -> Result<BytesMut, String> {
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(&mut buf, records, &RecordEncodeOptions { version: 2, compression: Compression::None })
        .map_err(|e| e.to_string())?;
    Ok(buf)
}

/// Encodes `entries` (key, value; `None` value is a tombstone) as one uncompressed batch.
pub fn encode_batch(entries: &[(Bytes, Option<Bytes>)], timestamp_ms: i64) -> BytesMut {
    let records: Vec<Record> = entries
        .iter()
        .enumerate()
        .map(|(i, (key, value))| plain_record(i as i64, timestamp_ms, Some(key.clone()), value.clone()))
        .collect();
    // Encoding in-memory records into a growable buffer has no failure mode but an encoder bug;
    // an empty buffer then makes the append fail loudly instead of writing garbage.
    encode_records(&records).unwrap_or_else(|e| {
        tracing::error!(error = %e, "cannot encode an internal record batch");
        BytesMut::new()
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_encode_as_one_batch() {
        let entries: Vec<(Bytes, Option<Bytes>)> =
            (0..5).map(|i| (Bytes::from(format!("k{i}")), (i != 3).then(|| Bytes::from_static(b"v")))).collect();
        let bytes = encode_batch(&entries, 1_700_000_000_000).freeze();
        assert_eq!(weir_storage::batch::headers(&bytes).count(), 1);
        let records = decode_batches(bytes).unwrap();
        assert_eq!(records.len(), 5);
        assert!(records[3].value.is_none());
        assert_eq!(records[4].key.as_deref(), Some(&b"k4"[..]));
    }
}
