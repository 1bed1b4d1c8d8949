//! One partition's tier: which of its segments the store holds, uploading the closed ones, and
//! deleting the uploaded ones that retention has passed.
//!
//! The broker that leads the partition calls [`PartitionTier::sync`] now and then (every
//! `remote.log.manager.task.interval.ms`). A pass:
//! 1. lists the store once, the first time (the manifests are the truth: see `manifest`);
//! 2. deletes the uploaded segments wholly below the log start offset (retention or
//!    DeleteRecords moved it: `retention.*` covers both tiers);
//! 3. uploads, oldest first, each closed segment below the last stable offset that ends after
//!    what the store holds, and stops at the first failure (the next pass resumes there).
//!
//! Only committed data is uploaded: below the high watermark, no replica will ever truncate it,
//! and below the last stable offset, no open transaction is in it, so the segment's aborted
//! transactions are final when its manifest records them.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload, WriteMultipart};
use serde::Serialize;
use uuid::Uuid;
use weir_storage::{Log, SealedSegment};

use crate::error::TierError;
use crate::manifest::{self, RemoteFile, RemoteSegment, MANIFEST_FORMAT, MANIFEST_SUFFIX};
use crate::reader::{self, ChunkCache, ReadRange, RemoteRead};
use crate::store::Store;

/// Files up to this size go up in one request; larger ones in parts of this size, two at a
/// time (so an upload holds at most about three parts in memory).
const PART_BYTES: usize = 8 << 20;
const PARTS_IN_FLIGHT: usize = 2;

/// What `weir topic describe`, the admin API and the metrics show of a partition's tier.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TierStatus {
    /// The store was listed: the figures below are the store's, not a guess.
    pub loaded: bool,
    /// The first offset the store holds, and the offset after its last uploaded segment.
    pub remote_start_offset: Option<i64>,
    pub remote_end_offset: Option<i64>,
    pub remote_segments: usize,
    /// Bytes of the uploaded `.log` objects.
    pub remote_bytes: u64,
    /// Closed, committed segments not uploaded yet, as of the last pass (Kafka's
    /// `RemoteCopyLagSegments` and `RemoteCopyLagBytes`).
    pub lag_segments: usize,
    pub lag_bytes: u64,
    pub uploaded_segments_total: u64,
    pub uploaded_bytes_total: u64,
    pub deleted_segments_total: u64,
    pub failures_total: u64,
    /// Compacted topics: segments the store's compaction rewrote, and the records it removed.
    pub compacted_segments_total: u64,
    pub compacted_records_total: u64,
    /// The last failure, until a pass succeeds.
    pub last_error: Option<String>,
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncOutcome {
    pub uploaded_segments: usize,
    pub uploaded_bytes: u64,
    pub deleted_segments: usize,
}

/// One partition's tier. Cheap to keep for every partition: nothing is read before the first
/// pass.
pub struct PartitionTier {
    pub(crate) store: Arc<Store>,
    pub(crate) cache: Arc<ChunkCache>,
    pub(crate) topic: String,
    topic_id: Uuid,
    pub(crate) partition: i32,
    /// `<topic>-<topic id>/<partition>`.
    pub(crate) dir: ObjectPath,
    /// The uploaded segments by base offset; `None` until the store was listed. The async lock
    /// makes passes of one partition take turns.
    pub(crate) segments: tokio::sync::Mutex<Option<BTreeMap<i64, RemoteSegment>>>,
    /// A copy of the segments for readers, who must not wait for a pass's uploads; `None`
    /// until listed.
    view: Mutex<Option<Arc<BTreeMap<i64, RemoteSegment>>>>,
    pub(crate) status: Mutex<TierStatus>,
    /// `status.uploaded_bytes_total` when the store's part was last compacted (compacted
    /// topics: see `compact`).
    pub(crate) compacted_at_upload_bytes: Mutex<u64>,
    /// Each listed manifest's size and modification time: a listing reads again a manifest
    /// that changed (a compaction's next generation), and only those.
    manifest_versions: Mutex<HashMap<i64, (u64, i64)>>,
}

impl PartitionTier {
    pub fn new(
        store: Arc<Store>,
        cache: Arc<ChunkCache>,
        topic: &str,
        topic_id: Uuid,
        partition: i32,
    ) -> PartitionTier {
        let dir = store.key(&[&format!("{topic}-{}", topic_id.simple()), &partition.to_string()]);
        PartitionTier {
            store,
            cache,
            topic: topic.to_string(),
            topic_id,
            partition,
            dir,
            segments: tokio::sync::Mutex::new(None),
            view: Mutex::new(None),
            status: Mutex::new(TierStatus::default()),
            compacted_at_upload_bytes: Mutex::new(0),
            manifest_versions: Mutex::new(HashMap::new()),
        }
    }

    pub fn status(&self) -> TierStatus {
        weir_storage::sync::lock(&self.status).clone()
    }

    /// The uploaded segments, oldest first (listing the store if no pass has yet).
    pub async fn remote_segments(&self) -> Result<Vec<RemoteSegment>, TierError> {
        let mut segments = self.segments.lock().await;
        let segments = self.loaded(&mut segments).await?;
        Ok(segments.values().cloned().collect())
    }

    /// One pass over the partition (see the module doc). `node` is recorded in the manifests.
    /// A failure is also kept in the status; the next pass starts over where this one stopped.
    pub async fn sync(&self, log: &Arc<Log>, node: i32, now_ms: i64) -> Result<SyncOutcome, TierError> {
        let result = self.pass(log, node, now_ms).await;
        let mut status = weir_storage::sync::lock(&self.status);
        match &result {
            Ok(outcome) => {
                status.uploaded_segments_total += outcome.uploaded_segments as u64;
                status.uploaded_bytes_total += outcome.uploaded_bytes;
                status.deleted_segments_total += outcome.deleted_segments as u64;
                status.last_error = None;
            }
            Err(e) => {
                status.failures_total += 1;
                status.last_error = Some(e.to_string());
            }
        }
        result
    }

    async fn pass(&self, log: &Arc<Log>, node: i32, now_ms: i64) -> Result<SyncOutcome, TierError> {
        let mut guard = self.segments.lock().await;
        let segments = self.loaded(&mut guard).await?;
        let mut outcome = SyncOutcome::default();
        tell_log(log, segments).await?;

        // Retention over both tiers: `retention.*` passed the oldest segments only the store
        // holds; the log start moves past them (as DeleteRecords moves it), which deletes them.
        let config = log.config();
        if config.cleanup_policy.delete {
            let start = retention_start(segments, &config, log.local_log_start_offset(), log.size_bytes(), now_ms);
            if let Some(start) = start.filter(|s| *s > log.log_start_offset()) {
                let log = Arc::clone(log);
                let moved = blocking(move || log.delete_records_before(start).map_err(TierError::from)).await?;
                tracing::info!(topic = %self.topic, partition = self.partition, log_start_offset = moved, "retention passed segments in the object store");
            }
        }

        // What the log start offset has passed goes from the store too.
        let log_start = log.log_start_offset();
        let doomed: Vec<i64> =
            segments.values().take_while(|s| s.next_offset <= log_start).map(|s| s.base_offset).collect();
        for base in doomed {
            if let Some(segment) = segments.get(&base) {
                self.delete(segment).await?;
            }
            segments.remove(&base);
            self.cache.forget(&self.dir, base);
            outcome.deleted_segments += 1;
            self.publish(segments, None);
        }

        // Uploads: the closed, committed segments after what the store holds.
        let bound = log.last_stable_offset();
        let sealed = {
            let log = Arc::clone(log);
            blocking(move || log.sealed_segments(bound).map_err(TierError::from)).await?
        };
        let uploaded_end = segments.values().next_back().map_or(i64::MIN, |s| s.next_offset);
        let pending: Vec<SealedSegment> =
            sealed.into_iter().filter(|s| s.next_offset > uploaded_end && s.size > 0).collect();
        let mut lag = (pending.len(), pending.iter().map(|s| s.size).sum::<u64>());
        self.publish(segments, Some(lag));
        for segment in pending {
            let remote = self.upload(log, &segment, node, now_ms).await?;
            tracing::debug!(topic = %self.topic, partition = self.partition, base = remote.base_offset, next = remote.next_offset, bytes = remote.log_bytes(), "uploaded a segment");
            outcome.uploaded_segments += 1;
            outcome.uploaded_bytes += remote.log_bytes();
            segments.insert(remote.base_offset, remote);
            lag = (lag.0 - 1, lag.1.saturating_sub(segment.size));
            self.publish(segments, Some(lag));
        }
        // A compacted topic's part in the store is compacted too, once enough was uploaded.
        let remote_bytes: u64 = segments.values().map(RemoteSegment::log_bytes).sum();
        if config.cleanup_policy.compact && self.compaction_due(remote_bytes, config.min_cleanable_dirty_ratio) {
            let compacted = self.compact_locked(log, segments, now_ms).await?;
            if compacted.rewritten_segments > 0 {
                tracing::info!(topic = %self.topic, partition = self.partition, segments = compacted.rewritten_segments, records = compacted.removed_records, bytes_before = compacted.bytes_before, bytes_after = compacted.bytes_after, "compacted segments in the object store");
            }
        }
        tell_log(log, segments).await?;
        Ok(outcome)
    }

    /// A follower's pass: lists the store again (its leader uploads) and tells the log, so that
    /// local retention here deletes what the store holds too. Uploads and deletes nothing; reads
    /// only the manifests it has not seen.
    pub async fn refresh(&self, log: &Arc<Log>) -> Result<(), TierError> {
        let mut guard = self.segments.lock().await;
        let known = guard.take().unwrap_or_default();
        let listed = self.list(&known).await?;
        self.publish(&listed, None);
        let segments = guard.insert(listed);
        tell_log(log, segments).await
    }

    /// The uploaded segments, listed from the store on first use.
    pub(crate) async fn loaded<'a>(
        &self,
        slot: &'a mut Option<BTreeMap<i64, RemoteSegment>>,
    ) -> Result<&'a mut BTreeMap<i64, RemoteSegment>, TierError> {
        if slot.is_none() {
            let segments = self.list(&BTreeMap::new()).await?;
            tracing::info!(topic = %self.topic, partition = self.partition, segments = segments.len(), "listed the partition's uploaded segments");
            self.publish(&segments, None);
            *slot = Some(segments);
        }
        Ok(slot.get_or_insert_with(BTreeMap::new))
    }

    /// The segments whose manifests the store lists now; those in `known` (same offsets) are
    /// not read again.
    async fn list(&self, known: &BTreeMap<i64, RemoteSegment>) -> Result<BTreeMap<i64, RemoteSegment>, TierError> {
        let listed: Vec<_> = self.store.objects.list(Some(&self.dir)).try_collect().await?;
        let mut segments = BTreeMap::new();
        for meta in listed {
            let Some(name) = meta.location.filename() else { continue };
            let Some((base, next, MANIFEST_SUFFIX)) = manifest::parse_name(name) else { continue };
            let version = (meta.size, meta.last_modified.timestamp_millis());
            let unchanged = weir_storage::sync::lock(&self.manifest_versions).get(&base) == Some(&version);
            if let Some(seen) = known.get(&base).filter(|s| s.next_offset == next && unchanged) {
                segments.insert(base, seen.clone());
                continue;
            }
            weir_storage::sync::lock(&self.manifest_versions).insert(base, version);
            let bytes = self.store.objects.get(&meta.location).await?.bytes().await?;
            let segment: RemoteSegment = serde_json::from_slice(&bytes)
                .map_err(|e| TierError::Corrupt { key: meta.location.to_string(), reason: e.to_string() })?;
            if segment.format != MANIFEST_FORMAT {
                return Err(TierError::Corrupt {
                    key: meta.location.to_string(),
                    reason: format!("manifest format {} (this build reads {MANIFEST_FORMAT})", segment.format),
                });
            }
            segments.insert(segment.base_offset, segment);
        }
        Ok(segments)
    }

    /// Copies one segment: its data objects, then its manifest.
    async fn upload(
        &self,
        log: &Arc<Log>,
        segment: &SealedSegment,
        node: i32,
        now_ms: i64,
    ) -> Result<RemoteSegment, TierError> {
        let stem = manifest::stem(segment.base_offset, segment.next_offset);
        let base = segment.base_offset;
        let gone = move |e: std::io::Error, what: &std::path::Path| {
            if e.kind() == std::io::ErrorKind::NotFound {
                TierError::SegmentGone(base)
            } else {
                TierError::Io { context: format!("reading {}", what.display()), source: e }
            }
        };
        let mut files = Vec::with_capacity(3);
        for (kind, path) in [("index", &segment.index_path), ("timeindex", &segment.time_index_path)] {
            let bytes = {
                let path = path.clone();
                blocking(move || std::fs::read(&path).map_err(|e| gone(e, &path))).await?
            };
            let crc32c = crc32c::crc32c(&bytes);
            let size = bytes.len() as u64;
            self.store.objects.put(&self.dir.clone().join(format!("{stem}.{kind}")), PutPayload::from(bytes)).await?;
            files.push(RemoteFile { kind: kind.to_string(), size, crc32c });
        }
        let (size, crc32c) = self.upload_log(segment, &self.dir.clone().join(format!("{stem}.log"))).await?;
        files.insert(0, RemoteFile { kind: "log".into(), size, crc32c });

        let epochs = {
            let log = Arc::clone(log);
            blocking(move || log.leader_epoch_entries().map_err(TierError::from)).await?
        };
        let remote = RemoteSegment {
            format: MANIFEST_FORMAT,
            topic: self.topic.clone(),
            topic_id: self.topic_id,
            partition: self.partition,
            base_offset: segment.base_offset,
            next_offset: segment.next_offset,
            max_timestamp: segment.max_timestamp,
            files,
            leader_epochs: manifest::epochs_within(&epochs, segment.base_offset, segment.next_offset),
            aborted_transactions: manifest::aborted(
                &log.aborted_transactions(segment.base_offset, segment.next_offset),
            ),
            uploaded_by: node,
            uploaded_at_ms: now_ms,
            generation: 0,
        };
        let json = serde_json::to_vec_pretty(&remote)
            .map_err(|e| TierError::Corrupt { key: format!("{stem}{MANIFEST_SUFFIX}"), reason: e.to_string() })?;
        self.store
            .objects
            .put(&self.dir.clone().join(format!("{stem}{MANIFEST_SUFFIX}")), PutPayload::from(json))
            .await?;
        Ok(remote)
    }

    /// Copies the `.log` through its open file (so a rename by retention does not cut the copy
    /// short): in one request when small, else in parts. Returns its size and CRC32C.
    async fn upload_log(&self, segment: &SealedSegment, key: &ObjectPath) -> Result<(u64, u32), TierError> {
        let size = segment.size;
        let read = |range: Range<u64>| {
            let file = Arc::clone(&segment.log);
            blocking(move || {
                let mut buf = vec![0u8; (range.end - range.start) as usize];
                file.read_exact_at(&mut buf, range.start).map_err(|e| TierError::Io {
                    context: format!("reading a segment at byte {}", range.start),
                    source: e,
                })?;
                Ok(Bytes::from(buf))
            })
        };
        if size <= PART_BYTES as u64 {
            let bytes = read(0..size).await?;
            let crc = crc32c::crc32c(&bytes);
            self.store.objects.put(key, PutPayload::from(bytes)).await?;
            return Ok((size, crc));
        }
        let upload = self.store.objects.put_multipart(key).await?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        let mut crc = 0u32;
        let mut at = 0u64;
        while at < size {
            let end = (at + PART_BYTES as u64).min(size);
            let bytes = match read(at..end).await {
                Ok(bytes) => bytes,
                Err(e) => {
                    let _ = writer.abort().await;
                    return Err(e);
                }
            };
            crc = crc32c::crc32c_append(crc, &bytes);
            if let Err(e) = writer.wait_for_capacity(PARTS_IN_FLIGHT).await {
                return Err(e.into());
            }
            writer.write(&bytes);
            at = end;
        }
        writer.finish().await?;
        Ok((size, crc))
    }

    /// Removes one segment from the store: its manifest first, so that no reader finds it half
    /// gone. Objects already missing are no error (a delete cut short is finished later).
    async fn delete(&self, segment: &RemoteSegment) -> Result<(), TierError> {
        let stem = manifest::stem(segment.base_offset, segment.next_offset);
        let data = segment.data_stem();
        let names = [
            format!("{stem}{MANIFEST_SUFFIX}"),
            format!("{data}.log"),
            format!("{data}.index"),
            format!("{data}.timeindex"),
        ];
        for name in names {
            match self.store.objects.delete(&self.dir.clone().join(name)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Reads from `offset`, which the log no longer holds locally (see [`ChunkCache::read`]):
    /// `None` when nothing at or after it is below `upper`; [`TierError::NotInStore`] when the
    /// store does not hold it either.
    pub async fn read(
        &self,
        offset: i64,
        max_bytes: u64,
        upper: i64,
        min_one_batch: bool,
    ) -> Result<Option<RemoteRead>, TierError> {
        let view = self.view().await?;
        let Some(mut segment) = view.range(..=offset).rev().find(|(_, s)| s.next_offset > offset).map(|(_, s)| s)
        else {
            return Err(TierError::NotInStore(offset));
        };
        let mut at = offset;
        loop {
            let range = ReadRange { offset: at, max_bytes, upper, min_one_batch };
            if let Some(slice) = self.cache.read(&self.store, &self.dir, segment, range).await? {
                let aborted = reader::aborted_within(segment, slice.first_offset, slice.next_offset);
                return Ok(Some(RemoteRead { slice, aborted }));
            }
            // Nothing from `at` to the segment's end: a compacted segment's gap (or `upper`).
            // The next segment goes on; past the store's end the caller reads the local log.
            match view.get(&segment.next_offset) {
                Some(next) if next.base_offset < upper => {
                    at = next.base_offset;
                    segment = next;
                }
                _ => return Ok(None),
            }
        }
    }

    /// ListOffsets by timestamp over the offsets only the store holds (those from `from` up
    /// to `below`, the local log start): the first record at or after `from` whose timestamp is
    /// at least `target`, as (timestamp, offset). `None` when no such record is there (the
    /// local log is asked next). Each segment's time index narrows where to read; the batches
    /// are then read through the cache, and the first batch whose largest timestamp reaches
    /// `target` is decoded.
    pub async fn offset_for_timestamp(
        &self,
        target: i64,
        from: i64,
        below: i64,
    ) -> Result<Option<(i64, i64)>, TierError> {
        let view = self.view().await?;
        for segment in view.values().filter(|s| s.base_offset < below && s.next_offset > from) {
            if segment.max_timestamp.is_none_or(|(max, _)| max < target) {
                continue;
            }
            let stem = segment.data_stem();
            let entries =
                self.store.objects.get(&self.dir.clone().join(format!("{stem}.timeindex"))).await?.bytes().await?;
            // The last index entry below the target: no batch before it can qualify.
            let mut at = entries
                .chunks_exact(12)
                .map(|e| {
                    let timestamp = i64::from_be_bytes([e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]]);
                    (timestamp, segment.base_offset + i64::from(u32::from_be_bytes([e[8], e[9], e[10], e[11]])))
                })
                .take_while(|(timestamp, _)| *timestamp < target)
                .last()
                .map_or(segment.base_offset, |(_, offset)| offset)
                .max(from);
            let end = segment.next_offset.min(below);
            while at < end {
                let Some(read) = self.read(at, 1 << 20, end, true).await? else { break };
                let bytes = read.slice.read_to_vec().map_err(TierError::from)?;
                for (position, header) in weir_storage::batch::headers(&bytes) {
                    if header.max_timestamp < target || header.last_offset() < from {
                        continue;
                    }
                    let size = header.size_bytes().unwrap_or(0);
                    let batch = bytes.get(position..position + size).unwrap_or_default();
                    let records = weir_storage::records::decode_records(batch).map_err(|e| TierError::Corrupt {
                        key: format!("{}/{stem}.log", self.dir),
                        reason: format!("batch at offset {}: {e}", header.base_offset),
                    })?;
                    if let Some(r) = records.iter().find(|r| r.timestamp >= target && r.offset >= from) {
                        return Ok(Some((r.timestamp, r.offset)));
                    }
                }
                at = read.slice.next_offset;
            }
        }
        Ok(None)
    }

    /// The segments as readers see them, listing the store first if no pass has yet.
    async fn view(&self) -> Result<Arc<BTreeMap<i64, RemoteSegment>>, TierError> {
        if let Some(view) = weir_storage::sync::lock(&self.view).clone() {
            return Ok(view);
        }
        let mut segments = self.segments.lock().await;
        self.loaded(&mut segments).await?;
        Ok(weir_storage::sync::lock(&self.view).clone().unwrap_or_default())
    }

    /// Puts the store's figures into the status; `lag` when the pass measured it.
    pub(crate) fn publish(&self, segments: &BTreeMap<i64, RemoteSegment>, lag: Option<(usize, u64)>) {
        *weir_storage::sync::lock(&self.view) = Some(Arc::new(segments.clone()));
        let mut status = weir_storage::sync::lock(&self.status);
        status.loaded = true;
        status.remote_start_offset = segments.values().next().map(|s| s.base_offset);
        status.remote_end_offset = segments.values().next_back().map(|s| s.next_offset);
        status.remote_segments = segments.len();
        status.remote_bytes = segments.values().map(RemoteSegment::log_bytes).sum();
        if let Some((count, bytes)) = lag {
            status.lag_segments = count;
            status.lag_bytes = bytes;
        }
    }
}

/// Tells the log what the store holds: local retention may then delete below its end, and the
/// log starts where the store does (see `Log::set_remote_range`).
async fn tell_log(log: &Arc<Log>, segments: &BTreeMap<i64, RemoteSegment>) -> Result<(), TierError> {
    let range =
        segments.values().next().zip(segments.values().next_back()).map(|(f, l)| (f.base_offset, l.next_offset));
    let log = Arc::clone(log);
    blocking(move || {
        log.set_remote_range(range);
        Ok(())
    })
    .await
}

/// Where `retention.ms` and `retention.bytes` put the log start, over both tiers: past the
/// oldest segments only the store holds (below the local log start) that are older than
/// `retention.ms`, or that `retention.bytes` has no room for counting every byte after them.
/// `None` when they keep every such segment.
pub(crate) fn retention_start(
    segments: &BTreeMap<i64, RemoteSegment>,
    config: &weir_storage::LogConfig,
    local_start: i64,
    local_bytes: u64,
    now_ms: i64,
) -> Option<i64> {
    let only_remote: Vec<&RemoteSegment> = segments.values().filter(|s| s.base_offset < local_start).collect();
    let mut start = None;
    if config.retention_ms >= 0 {
        for segment in &only_remote {
            let newest = segment.max_timestamp.map_or(segment.uploaded_at_ms, |(t, _)| t);
            if now_ms - newest <= config.retention_ms {
                break;
            }
            start = Some(segment.next_offset.min(local_start));
        }
    }
    if config.retention_bytes >= 0 {
        let mut total = only_remote.iter().map(|s| s.log_bytes()).sum::<u64>() + local_bytes;
        for segment in &only_remote {
            if total.saturating_sub(segment.log_bytes()) < config.retention_bytes as u64 {
                break;
            }
            total -= segment.log_bytes();
            start = start.max(Some(segment.next_offset.min(local_start)));
        }
    }
    start
}

/// Runs file work off the async workers.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, TierError> + Send + 'static,
) -> Result<T, TierError> {
    tokio::task::spawn_blocking(work).await.map_err(|e| TierError::Io {
        context: "a file task of the tier".into(),
        source: std::io::Error::other(e.to_string()),
    })?
}
