//! Records of the broker's own logs (the metadata log, `__consumer_offsets`,
//! `__transaction_state`): key/value pairs in ordinary RecordBatch v2 batches built with the
//! storage engine's codec ([`crate::records`]), so recovery and compaction treat them like
//! any topic's data.

use crate::records::{self, BatchOptions, Record};
use bytes::{Bytes, BytesMut};

/// Encodes `entries` (key, value; `None` value is a tombstone) as one uncompressed batch.
pub fn encode_batch(entries: &[(Bytes, Option<Bytes>)], timestamp_ms: i64) -> BytesMut {
    let records: Vec<Record> =
        entries.iter().map(|(key, value)| Record::new(timestamp_ms, Some(key.clone()), value.clone())).collect();
    // Encoding in-memory records without compression has no failure mode but an empty list
    // (a caller's bug); an empty buffer then makes the append fail loudly instead of writing
    // garbage.
    records::encode_batch(&records, &BatchOptions::default()).unwrap_or_else(|e| {
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
    let records = records::decode_records(&bytes).map_err(|e| e.to_string())?;
    Ok(records.into_iter().map(|r| InternalRecord { offset: r.offset, key: r.key, value: r.value }).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_encode_as_one_batch() {
        let entries: Vec<(Bytes, Option<Bytes>)> =
            (0..5).map(|i| (Bytes::from(format!("k{i}")), (i != 3).then(|| Bytes::from_static(b"v")))).collect();
        let bytes = encode_batch(&entries, 1_700_000_000_000).freeze();
        assert_eq!(crate::batch::headers(&bytes).count(), 1);
        let records = decode_batches(bytes).unwrap();
        assert_eq!(records.len(), 5);
        assert!(records[3].value.is_none());
        assert_eq!(records[4].key.as_deref(), Some(&b"k4"[..]));
    }
}
