//! Compaction of a compacted topic's segments in the store: Kafka refuses to tier compacted
//! topics, because its cleaner only ever sees local segments. Here the store's part is the
//! log's older part, and it is compacted by the same rules, so a compacted topic with tiering
//! on keeps at least the latest record of every key, over both tiers, and its store does not
//! grow with every superseded value.
//!
//! A pass ([`PartitionTier::compact`]) runs on the partition's leader, within a tier pass, once
//! the bytes uploaded since the last compaction reach `min.cleanable.dirty.ratio` of what the
//! store holds (Kafka's dirty ratio, with the uploads as the dirty part):
//! 1. A key map of the local part: the latest offset of every key from the local log start up
//!    to the last stable offset (transactional batches are left out of it and kept, as the
//!    local cleaner does).
//! 2. The segments only the store holds, newest first. Each is fetched, its records judged by
//!    the map and by the segment's own later records: a record goes when its key has a later
//!    offset, or when it is a tombstone whose batch is older than `delete.retention.ms`.
//!    Control and transactional batches stay whole; offsets never change, so a removed record
//!    leaves a gap that readers step over (a segment may end up with no batch at all, and
//!    stays, so the store's offsets stay contiguous). The segment's keys then join the map.
//! 3. A segment that changed is written as its next generation: the `.c<N>.log`, `.index` and
//!    `.timeindex` objects, then its manifest (the switch). The previous generation's objects
//!    go at the next pass, so reads that began on them finish.
//!
//! The key map is bounded ([`KEY_MAP_BYTES`]): when the keys do not fit, the pass stops where
//! they filled it, and the older segments wait for a later pass.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload};
use weir_storage::batch::{self, BatchHeader};
use weir_storage::Log;

use crate::error::TierError;
use crate::manifest::{self, RemoteFile, RemoteSegment, MANIFEST_SUFFIX};
use crate::partition::{blocking, PartitionTier};

/// Most heap bytes of a pass's key map (keys plus their bookkeeping).
pub(crate) const KEY_MAP_BYTES: usize = 64 << 20;
/// What an entry of the key map costs beyond its key.
const ENTRY_OVERHEAD_BYTES: usize = 48;
/// An offset index entry every this many bytes of a rewritten segment (and one per first batch).
const INDEX_INTERVAL_BYTES: usize = 4096;
/// How much of the local log one read of the key map takes.
const LOCAL_READ_BYTES: u64 = 1 << 20;

/// What one compaction pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactOutcome {
    /// Segments written as a new generation.
    pub rewritten_segments: usize,
    pub removed_records: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// The key map filled before the oldest segments were reached.
    pub map_full: bool,
}

/// The latest offset of each key, within a byte budget.
struct KeyMap {
    latest: HashMap<Bytes, i64>,
    bytes: usize,
}

impl KeyMap {
    /// Notes `key` at `offset`; false when the budget has no room for a new key.
    fn note(&mut self, key: &Bytes, offset: i64) -> bool {
        if let Some(latest) = self.latest.get_mut(key) {
            *latest = (*latest).max(offset);
            return true;
        }
        let cost = key.len() + ENTRY_OVERHEAD_BYTES;
        if self.bytes + cost > KEY_MAP_BYTES {
            return false;
        }
        self.bytes += cost;
        self.latest.insert(key.clone(), offset);
        true
    }

    fn latest(&self, key: &[u8]) -> Option<i64> {
        self.latest.get(key).copied()
    }
}

impl PartitionTier {
    /// Whether a compaction pass is due: the bytes uploaded since the last one reach `ratio` of
    /// what the store holds.
    pub(crate) fn compaction_due(&self, remote_bytes: u64, ratio: f64) -> bool {
        let uploaded = weir_storage::sync::lock(&self.status).uploaded_bytes_total;
        let since = uploaded.saturating_sub(*weir_storage::sync::lock(&self.compacted_at_upload_bytes));
        since > 0 && since as f64 >= ratio * remote_bytes as f64
    }

    /// Compacts the segments only the store holds (see the module doc), whether due or not.
    pub async fn compact(&self, log: &Arc<Log>, now_ms: i64) -> Result<CompactOutcome, TierError> {
        let mut guard = self.segments.lock().await;
        let segments = self.loaded(&mut guard).await?;
        self.compact_locked(log, segments, now_ms).await
    }

    pub(crate) async fn compact_locked(
        &self,
        log: &Arc<Log>,
        segments: &mut BTreeMap<i64, RemoteSegment>,
        now_ms: i64,
    ) -> Result<CompactOutcome, TierError> {
        let mut outcome = CompactOutcome::default();
        let local_start = log.local_log_start_offset();
        if segments.values().all(|s| s.next_offset > local_start) {
            // Nothing only the store holds yet: what was uploaded stays dirty until local
            // retention leaves it to the store.
            return Ok(outcome);
        }
        self.remove_stale_generations(segments).await?;
        *weir_storage::sync::lock(&self.compacted_at_upload_bytes) =
            weir_storage::sync::lock(&self.status).uploaded_bytes_total;
        let Some(mut map) = ({
            let log = Arc::clone(log);
            blocking(move || local_key_map(&log, local_start)).await?
        }) else {
            outcome.map_full = true;
            tracing::warn!(topic = %self.topic, partition = self.partition, "the keys of the local log do not fit the tier's key map: the store's part is not compacted");
            return Ok(outcome);
        };
        let config = log.config();
        let delete_retention = i64::try_from(config.delete_retention_ms).unwrap_or(i64::MAX);
        let only_remote: Vec<RemoteSegment> =
            segments.values().filter(|s| s.next_offset <= local_start).rev().cloned().collect();
        for segment in only_remote {
            let key = self.dir.clone().join(format!("{}.log", segment.data_stem()));
            let bytes = self.store.objects.get(&key).await?.bytes().await?;
            // The segment's own latest offsets count too: an older value in it goes for a newer
            // one in it.
            let mut own: HashMap<Bytes, i64> = HashMap::new();
            for decoded in decode(&bytes, &key)? {
                if decoded.header.is_control() || decoded.header.is_transactional() {
                    continue;
                }
                for record in decoded.records {
                    if let Some(k) = record.key {
                        let latest = own.entry(k).or_insert(record.offset);
                        *latest = (*latest).max(record.offset);
                    }
                }
            }
            let retains = |record: &weir_storage::records::Record, batch_max_timestamp: i64| {
                let Some(k) = record.key.as_deref() else { return true };
                let later = map.latest(k).into_iter().chain(own.get(k).copied()).max();
                if later.is_some_and(|latest| latest > record.offset) {
                    return false;
                }
                record.value.is_some() || batch_max_timestamp.saturating_add(delete_retention) > now_ms
            };
            let compacted = weir_storage::cleaner::compact_batches(&bytes, retains)
                .map_err(|reason| TierError::Corrupt { key: key.to_string(), reason })?;
            let mut full = false;
            for (k, offset) in &own {
                if !map.note(k, *offset) {
                    full = true;
                    break;
                }
            }
            if let Some((cleaned, removed)) = compacted {
                let rewritten = self.write_generation(&segment, Bytes::from(cleaned), now_ms).await?;
                outcome.rewritten_segments += 1;
                outcome.removed_records += removed;
                outcome.bytes_before += segment.log_bytes();
                outcome.bytes_after += rewritten.log_bytes();
                segments.insert(rewritten.base_offset, rewritten);
                self.cache.forget(&self.dir, segment.base_offset);
                self.publish(segments, None);
            }
            if full {
                outcome.map_full = true;
                break;
            }
        }
        if outcome.rewritten_segments > 0 {
            let mut status = weir_storage::sync::lock(&self.status);
            status.compacted_segments_total += outcome.rewritten_segments as u64;
            status.compacted_records_total += outcome.removed_records;
        }
        Ok(outcome)
    }

    /// Writes `cleaned` as the next generation of `segment`: the data objects, then the
    /// manifest. Returns the new manifest.
    async fn write_generation(
        &self,
        segment: &RemoteSegment,
        cleaned: Bytes,
        now_ms: i64,
    ) -> Result<RemoteSegment, TierError> {
        let generation = segment.generation + 1;
        let data = manifest::data_stem(segment.base_offset, segment.next_offset, generation);
        let (index, time_index, max_timestamp) = indexes(&cleaned, segment.base_offset);
        let mut files = Vec::with_capacity(3);
        for (kind, bytes) in [("log", cleaned), ("index", Bytes::from(index)), ("timeindex", Bytes::from(time_index))] {
            files.push(RemoteFile { kind: kind.to_string(), size: bytes.len() as u64, crc32c: crc32c::crc32c(&bytes) });
            self.store.objects.put(&self.dir.clone().join(format!("{data}.{kind}")), PutPayload::from(bytes)).await?;
        }
        let rewritten = RemoteSegment {
            files,
            // None for a segment left empty: nothing in it has a timestamp any more.
            max_timestamp,
            generation,
            uploaded_at_ms: now_ms,
            ..segment.clone()
        };
        let stem = manifest::stem(segment.base_offset, segment.next_offset);
        let json = serde_json::to_vec_pretty(&rewritten)
            .map_err(|e| TierError::Corrupt { key: format!("{stem}{MANIFEST_SUFFIX}"), reason: e.to_string() })?;
        self.store
            .objects
            .put(&self.dir.clone().join(format!("{stem}{MANIFEST_SUFFIX}")), PutPayload::from(json))
            .await?;
        Ok(rewritten)
    }

    /// Deletes the data objects of generations no manifest names any more (found by listing):
    /// those the last pass replaced, and any a pass cut short left behind.
    async fn remove_stale_generations(&self, segments: &BTreeMap<i64, RemoteSegment>) -> Result<(), TierError> {
        let current: HashMap<(i64, i64), u32> =
            segments.values().map(|s| ((s.base_offset, s.next_offset), s.generation)).collect();
        let mut doomed: Vec<ObjectPath> = Vec::new();
        let listed: Vec<_> = futures::TryStreamExt::try_collect(self.store.objects.list(Some(&self.dir))).await?;
        for meta in listed {
            let Some(name) = meta.location.filename() else { continue };
            let Some((base, next, suffix)) = manifest::parse_name(name) else { continue };
            let Some((generation, _)) = manifest::data_generation(suffix) else { continue };
            // Objects of segments without a manifest are an upload in progress or cut short:
            // the upload's business, not this pass's.
            if current.get(&(base, next)).is_some_and(|g| *g != generation) {
                doomed.push(meta.location.clone());
            }
        }
        for location in doomed {
            match self.store.objects.delete(&location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

fn decode(bytes: &[u8], key: &ObjectPath) -> Result<Vec<weir_storage::records::DecodedBatch>, TierError> {
    weir_storage::records::decode_batches(bytes)
        .map_err(|e| TierError::Corrupt { key: key.to_string(), reason: e.to_string() })
}

/// The latest offset of each key in the local log from `from` to the last stable offset;
/// `None` when the keys do not fit the budget. Blocking.
fn local_key_map(log: &Log, from: i64) -> Result<Option<KeyMap>, TierError> {
    let mut map = KeyMap { latest: HashMap::new(), bytes: 0 };
    let upper = log.last_stable_offset();
    let mut offset = from;
    while offset < upper {
        let read = log.read_with(offset, LOCAL_READ_BYTES, upper, true)?;
        let Some(slice) = read.slice else { break };
        let next = slice.next_offset;
        let bytes = slice.read_to_vec().map_err(TierError::from)?;
        let batches = weir_storage::records::decode_batches(&bytes).map_err(|e| TierError::Corrupt {
            key: format!("{} at offset {offset}", log.dir().display()),
            reason: e.to_string(),
        })?;
        for decoded in batches {
            if decoded.header.is_control() || decoded.header.is_transactional() {
                continue;
            }
            for record in decoded.records {
                if let Some(key) = &record.key {
                    if !map.note(key, record.offset) {
                        return Ok(None);
                    }
                }
            }
        }
        if next <= offset {
            break;
        }
        offset = next;
    }
    Ok(Some(map))
}

/// The `.index` and `.timeindex` of a segment's `.log` bytes (`base`: its base offset), in
/// the local files' formats, with the largest batch timestamp and its batch's base offset.
fn indexes(log: &[u8], base: i64) -> (Vec<u8>, Vec<u8>, Option<(i64, i64)>) {
    let (mut index, mut time_index) = (Vec::new(), Vec::new());
    let mut since_entry = usize::MAX;
    let mut max: Option<(i64, i64)> = None;
    for (position, header) in batch::headers(log) {
        let relative = u32::try_from(header.base_offset - base).unwrap_or(u32::MAX);
        if since_entry >= INDEX_INTERVAL_BYTES {
            index.extend_from_slice(&relative.to_be_bytes());
            index.extend_from_slice(&u32::try_from(position).unwrap_or(u32::MAX).to_be_bytes());
            since_entry = 0;
        }
        since_entry = since_entry.saturating_add(batch_size(&header));
        if max.is_none_or(|(t, _)| header.max_timestamp > t) {
            max = Some((header.max_timestamp, header.base_offset));
            time_index.extend_from_slice(&header.max_timestamp.to_be_bytes());
            time_index.extend_from_slice(&relative.to_be_bytes());
        }
    }
    (index, time_index, max)
}

fn batch_size(header: &BatchHeader) -> usize {
    header.size_bytes().unwrap_or(0)
}
