//! Reads of offsets only the object store holds, through a bounded cache of chunk files.
//!
//! A read of offset `o` finds the uploaded segment holding it, looks `o` up in the segment's
//! offset index (fetched once, kept in memory), and fetches `remote.log.read.ahead.bytes` of the
//! `.log` object from that index entry on: a *chunk* of whole batches, written to a file under
//! `<data-dir>/remote-cache/`. The fetch is then served from the chunk file like any local read
//! (a `FileSlice`, sent with `sendfile`), and so are the next fetches of a consumer reading on,
//! until the chunk is used up and the next one is fetched. Chunk files count against
//! `remote.log.cache.bytes`; the least recently used go first (an open read keeps its file
//! readable after it is unlinked). The cache directory is emptied at start-up: it is only a
//! cache.
//!
//! A directory store's objects are files already: those reads are served from the store's own
//! `.log` file in place (its batch headers read to find whole batches), with no chunk copied
//! into the cache. A file the store replaces or deletes meanwhile stays readable through the
//! descriptor a read holds.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use object_store::ObjectStoreExt;
use weir_storage::batch::{self, BatchHeader};
use weir_storage::{AbortedTxn, FileSlice};

use crate::error::TierError;
use crate::manifest::RemoteSegment;
use crate::store::Store;

/// The chunk cache's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSettings {
    /// `remote.log.cache.bytes`: the most bytes of chunk files kept.
    pub bytes: u64,
    /// `remote.log.read.ahead.bytes`: how much of a segment one fetch from the store brings.
    pub read_ahead: u64,
}

impl Default for CacheSettings {
    fn default() -> Self {
        CacheSettings { bytes: 256 << 20, read_ahead: 4 << 20 }
    }
}

/// What a remote read found: whole batches from the one holding the asked offset, and the
/// aborted transactions overlapping them (for read_committed).
#[derive(Debug, Clone)]
pub struct RemoteRead {
    pub slice: FileSlice,
    pub aborted: Vec<AbortedTxn>,
}

/// A chunk: whole batches of one uploaded segment, in a file of the cache.
struct Chunk {
    file: Arc<File>,
    path: PathBuf,
    /// (base offset, offset after the batch, position in the chunk file, size), ascending.
    batches: Vec<(i64, i64, u64, u64)>,
    last_used: u64,
}

impl Chunk {
    fn first_offset(&self) -> i64 {
        self.batches.first().map_or(i64::MAX, |b| b.0)
    }
    fn next_offset(&self) -> i64 {
        self.batches.last().map_or(i64::MIN, |b| b.1)
    }
    fn bytes(&self) -> u64 {
        self.batches.iter().map(|b| b.3).sum()
    }
}

/// A segment of a partition: (partition directory, segment base offset, generation).
type SegmentKey = (String, i64, u32);

/// A segment's offset index as (absolute offset, position), ascending.
type OffsetIndex = Arc<Vec<(i64, u64)>>;

/// What a read may return: whole batches from the one holding `offset`, below `upper`, at most
/// `max_bytes` of them unless `min_one_batch` lets the first exceed it (Kafka's rule).
#[derive(Debug, Clone, Copy)]
pub struct ReadRange {
    pub offset: i64,
    pub max_bytes: u64,
    pub upper: i64,
    pub min_one_batch: bool,
}

/// Chunks and segment indexes, by segment.
#[derive(Default)]
struct Cached {
    chunks: HashMap<SegmentKey, Vec<Chunk>>,
    indexes: HashMap<SegmentKey, OffsetIndex>,
    bytes: u64,
    clock: u64,
}

/// The broker's cache of chunks read from the store.
pub struct ChunkCache {
    dir: PathBuf,
    settings: CacheSettings,
    cached: Mutex<Cached>,
    next_file: AtomicU64,
    /// Bytes fetched from the store, and reads served from the cache (for the metrics).
    pub fetched_bytes: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

/// Indexes kept in memory: a few KiB each.
const INDEXES_KEPT: usize = 1024;

impl ChunkCache {
    /// The cache in `dir`, emptied.
    pub fn open(dir: &Path, settings: CacheSettings) -> Result<ChunkCache, TierError> {
        let io = |e: std::io::Error| TierError::Io {
            context: format!("the remote read cache {}", dir.display()),
            source: e,
        };
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(io)?;
        }
        std::fs::create_dir_all(dir).map_err(io)?;
        Ok(ChunkCache {
            dir: dir.to_path_buf(),
            settings,
            cached: Mutex::new(Cached::default()),
            next_file: AtomicU64::new(0),
            fetched_bytes: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// Bytes of chunk files held now.
    pub fn held_bytes(&self) -> u64 {
        weir_storage::sync::lock(&self.cached).bytes
    }

    /// Reads `range` of `segment`, an uploaded segment of the partition under `partition_dir`.
    /// `None` when no batch at or after the offset is below the upper bound.
    pub(crate) async fn read(
        &self,
        store: &Store,
        partition_dir: &object_store::path::Path,
        segment: &RemoteSegment,
        range: ReadRange,
    ) -> Result<Option<FileSlice>, TierError> {
        let offset = range.offset;
        let key = (partition_dir.to_string(), segment.base_offset, segment.generation);
        if let Some(slice) = self.serve(&key, range) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(slice);
        }
        let stem = segment.data_stem();
        let index = self.index(store, partition_dir, &key, &stem).await?;
        let position = index.iter().rev().find(|(o, _)| *o <= offset).map_or(0, |(_, p)| *p);
        let size = segment.log_bytes();
        if size == 0 {
            return Ok(None); // compacted away entirely: the offsets are gaps
        }
        if position >= size {
            return Err(TierError::Corrupt {
                key: format!("{partition_dir}/{stem}.index"),
                reason: format!("position {position} past the .log's {size} bytes"),
            });
        }
        let log_key = partition_dir.clone().join(format!("{stem}.log"));
        if let Some(path) = store.local_file(&log_key) {
            let slice = tokio::task::spawn_blocking(move || read_in_place(&path, position, size, range))
                .await
                .map_err(|e| TierError::Io {
                    context: "reading a directory store's segment".into(),
                    source: std::io::Error::other(e.to_string()),
                })??;
            self.fetched_bytes.fetch_add(slice.as_ref().map_or(0, |s| s.len), Ordering::Relaxed);
            return Ok(slice);
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let mut end = (position + self.settings.read_ahead.max(batch::HEADER_BYTES as u64)).min(size);
        let mut bytes = store.objects.get_range(&log_key, position..end).await?;
        // A batch larger than the read-ahead: fetch exactly the batch.
        if let Some(header) = BatchHeader::parse(&bytes) {
            let first = header.size_bytes().map(|s| s as u64).unwrap_or(0);
            if first > bytes.len() as u64 && position + first <= size {
                end = position + first;
                bytes = store.objects.get_range(&log_key, position..end).await?;
            }
        }
        self.fetched_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        let batches = whole_batches(&bytes);
        if batches.is_empty() {
            return Err(TierError::Corrupt {
                key: log_key.to_string(),
                reason: format!("no whole batch at byte {position}"),
            });
        }
        let keep = batches.last().map_or(0, |b| (b.2 + b.3) as usize);
        self.insert(key.clone(), bytes.slice(..keep), batches).await?;
        Ok(self.serve(&key, range).flatten())
    }

    /// A slice of a cached chunk holding `offset`, if one does (`Some(None)`: it does, but
    /// nothing below `upper`).
    fn serve(&self, key: &SegmentKey, range: ReadRange) -> Option<Option<FileSlice>> {
        let ReadRange { offset, max_bytes, upper, min_one_batch } = range;
        let mut cached = weir_storage::sync::lock(&self.cached);
        cached.clock += 1;
        let now = cached.clock;
        let chunk =
            cached.chunks.get_mut(key)?.iter_mut().find(|c| c.first_offset() <= offset && offset < c.next_offset())?;
        chunk.last_used = now;
        let from = chunk.batches.iter().position(|b| b.1 > offset)?;
        let (mut len, mut next) = (0u64, 0i64);
        for (i, (base, after, _, size)) in chunk.batches[from..].iter().enumerate() {
            if *base >= upper || (len + size > max_bytes && !(i == 0 && min_one_batch)) {
                break;
            }
            len += size;
            next = *after;
        }
        if len == 0 {
            return Some(None);
        }
        let (first, _, position, _) = chunk.batches[from];
        Some(Some(FileSlice {
            file: Arc::clone(&chunk.file),
            path: chunk.path.clone(),
            position,
            len,
            first_offset: first,
            next_offset: next,
            data: None,
        }))
    }

    /// The segment's offset index, fetched once.
    async fn index(
        &self,
        store: &Store,
        partition_dir: &object_store::path::Path,
        key: &SegmentKey,
        stem: &str,
    ) -> Result<OffsetIndex, TierError> {
        if let Some(index) = weir_storage::sync::lock(&self.cached).indexes.get(key) {
            return Ok(Arc::clone(index));
        }
        let index_key = partition_dir.clone().join(format!("{stem}.index"));
        let bytes = store.objects.get(&index_key).await?.bytes().await?;
        let entries: Vec<(i64, u64)> = bytes
            .chunks_exact(8)
            .map(|e| {
                let relative = u32::from_be_bytes([e[0], e[1], e[2], e[3]]);
                let position = u32::from_be_bytes([e[4], e[5], e[6], e[7]]);
                (key.1 + i64::from(relative), u64::from(position))
            })
            .collect();
        let index = Arc::new(entries);
        let mut cached = weir_storage::sync::lock(&self.cached);
        if cached.indexes.len() >= INDEXES_KEPT {
            cached.indexes.clear();
        }
        cached.indexes.insert(key.clone(), Arc::clone(&index));
        Ok(index)
    }

    /// Writes a chunk's file and keeps it, evicting the least recently used beyond the budget.
    async fn insert(&self, key: SegmentKey, bytes: Bytes, batches: Vec<(i64, i64, u64, u64)>) -> Result<(), TierError> {
        let path = self.dir.join(format!("{}.chunk", self.next_file.fetch_add(1, Ordering::Relaxed)));
        let file = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || -> std::io::Result<File> {
                let mut file = File::create(&path)?;
                file.write_all(&bytes)?;
                File::open(&path)
            })
            .await
            .map_err(|e| TierError::Io {
                context: "writing a cache chunk".into(),
                source: std::io::Error::other(e.to_string()),
            })?
        };
        let file = file.map_err(|e| TierError::Io { context: format!("writing {}", path.display()), source: e })?;
        let mut cached = weir_storage::sync::lock(&self.cached);
        cached.clock += 1;
        let chunk = Chunk { file: Arc::new(file), path, batches, last_used: cached.clock };
        cached.bytes += chunk.bytes();
        cached.chunks.entry(key).or_default().push(chunk);
        while cached.bytes > self.settings.bytes {
            let Some((key, at)) = cached
                .chunks
                .iter()
                .flat_map(|(k, list)| list.iter().enumerate().map(move |(i, c)| (k, i, c.last_used)))
                .min_by_key(|(_, _, used)| *used)
                .map(|(k, i, _)| (k.clone(), i))
            else {
                break;
            };
            let Some(list) = cached.chunks.get_mut(&key) else { break };
            let evicted = list.swap_remove(at);
            if list.is_empty() {
                cached.chunks.remove(&key);
            }
            cached.bytes -= evicted.bytes();
            // An open read keeps the file readable; the name goes now.
            let _ = std::fs::remove_file(&evicted.path);
            if cached.chunks.is_empty() {
                break;
            }
        }
        Ok(())
    }

    /// Forgets what is cached of segments the store no longer holds.
    /// Drops what is cached of a segment, every generation of it.
    pub(crate) fn forget(&self, partition_dir: &object_store::path::Path, base_offset: i64) {
        let dir = partition_dir.to_string();
        let matches = |key: &SegmentKey| key.0 == dir && key.1 == base_offset;
        let mut cached = weir_storage::sync::lock(&self.cached);
        cached.indexes.retain(|key, _| !matches(key));
        let keys: Vec<SegmentKey> = cached.chunks.keys().filter(|k| matches(k)).cloned().collect();
        for key in keys {
            for chunk in cached.chunks.remove(&key).unwrap_or_default() {
                cached.bytes -= chunk.bytes();
                let _ = std::fs::remove_file(&chunk.path);
            }
        }
    }
}

/// The whole batches at the start of `bytes`: (base offset, offset after, position, size).
/// Whole batches of a directory store's `.log` file at `path` (`size` bytes, as its manifest
/// says), from the batch at or after `position` that holds `range.offset` on, as a slice of the
/// file itself. Blocking.
fn read_in_place(path: &Path, mut position: u64, size: u64, range: ReadRange) -> Result<Option<FileSlice>, TierError> {
    use std::os::unix::fs::FileExt;
    let io = |e: std::io::Error| TierError::Io { context: format!("reading {}", path.display()), source: e };
    let file = File::open(path).map_err(io)?;
    let mut header = [0u8; batch::HEADER_BYTES];
    let (mut first, mut len, mut first_offset, mut next_offset) = (None, 0u64, 0i64, 0i64);
    while position + batch::HEADER_BYTES as u64 <= size {
        file.read_exact_at(&mut header, position).map_err(io)?;
        let corrupt = |reason: String| TierError::Corrupt { key: path.display().to_string(), reason };
        let parsed =
            BatchHeader::parse(&header).ok_or_else(|| corrupt(format!("no batch header at byte {position}")))?;
        let batch_size = parsed
            .size_bytes()
            .map(|s| s as u64)
            .filter(|s| position + s <= size)
            .ok_or_else(|| corrupt(format!("the batch at byte {position} runs past the segment's end")))?;
        if parsed.next_offset() <= range.offset {
            position += batch_size;
            continue;
        }
        let is_first = first.is_none();
        if parsed.base_offset >= range.upper
            || (len + batch_size > range.max_bytes && !(is_first && range.min_one_batch))
        {
            break;
        }
        if is_first {
            first = Some(position);
            first_offset = parsed.base_offset;
        }
        len += batch_size;
        next_offset = parsed.next_offset();
        position += batch_size;
    }
    let Some(start) = first else { return Ok(None) };
    Ok(Some(FileSlice {
        file: Arc::new(file),
        path: path.to_path_buf(),
        position: start,
        len,
        first_offset,
        next_offset,
        data: None,
    }))
}

fn whole_batches(bytes: &[u8]) -> Vec<(i64, i64, u64, u64)> {
    let mut out = Vec::new();
    for (at, header) in batch::headers(bytes) {
        let Some(size) = header.size_bytes() else { break };
        if at + size > bytes.len() {
            break;
        }
        out.push((header.base_offset, header.last_offset() + 1, at as u64, size as u64));
    }
    out
}

/// The aborted transactions of `segment` overlapping `[from, to)`.
pub(crate) fn aborted_within(segment: &RemoteSegment, from: i64, to: i64) -> Vec<AbortedTxn> {
    segment
        .aborted_transactions
        .iter()
        .filter(|(_, first, last, _)| *first < to && *last >= from)
        .map(|&(producer_id, first_offset, last_offset, last_stable_offset)| AbortedTxn {
            producer_id,
            first_offset,
            last_offset,
            last_stable_offset,
        })
        .collect()
}
