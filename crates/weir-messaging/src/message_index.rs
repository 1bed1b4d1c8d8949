//! An index of messages by key and message id, per partition, for queries (RocketMQ's
//! IndexFile): which offsets hold a message with key K, or with id I.
//!
//! A background thread (`MessageIndex::start`) tails every local partition of the topics with
//! `message.index.enable` (leaders and followers alike, so a new leader can answer at once),
//! from where it stopped up to the high watermark, and records for each message a 64-bit hash
//! of each of its keys (`weir.key` headers), of its message id (`weir.message-id`) and of its
//! tag (`weir.tag`), with its offset and timestamp. Messages are queryable a moment after they
//! are committed. The tag entries are RocketMQ's ConsumeQueue tag codes: a receive with a tag
//! filter reads only the batches holding a matching message (`MessageIndex::tagged_offsets`).
//!
//! Layout, under `<data>/message-index/<topic>-<partition>/`: entries collect in memory until
//! `CHUNK_ENTRIES` of them, then are sorted by hash and written as one immutable chunk file
//! named by the offsets it covers (written to a temporary name, then renamed), with the topic
//! id, the offset and time range it covers and a CRC of its entries. A lookup binary-searches
//! each chunk. The index is bounded: a partition keeps at most `MAX_CHUNKS` chunks (the
//! oldest go first), and chunks wholly below the log start offset are deleted.
//!
//! Invariants and recovery: the chunks of a partition cover contiguous offset ranges from the
//! oldest kept; the in-memory entries cover `[open_base, next)`. Nothing in memory is durable:
//! after a restart indexing resumes at the end of the last valid chunk and reads that stretch of
//! the log again. A chunk that fails its CRC (a crash while it was written), names another topic
//! id (the topic was deleted and made again) or breaks contiguity is deleted with all chunks
//! after it. A hash is not proof: every candidate offset is read back and its record checked for
//! the key or id before it is answered, so collisions, entries of a truncated log and stale
//! entries never show as results. The invariants are asserted in debug builds by
//! `PartitionIndex::check_invariants` after every change of a partition's index.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use uuid::Uuid;
use weir_storage::records::Record;
use weir_storage::sync::lock;

use weir_broker::broker::Broker;

use crate::Messaging;
use weir_broker::error::{BrokerError, ErrorKind};
use weir_broker::message::headers;
use weir_broker::partition::Partition;

/// The directory under the data directory.
pub(crate) const INDEX_DIR: &str = "message-index";
/// Entries per chunk file (24 bytes each: a chunk is at most 384 KiB plus its header).
pub(crate) const CHUNK_ENTRIES: usize = 16_384;
/// Chunks a partition keeps at most: about 4 million entries, 96 MiB.
pub(crate) const MAX_CHUNKS: usize = 256;
/// How often the indexer looks for new messages.
const PASS_INTERVAL: Duration = Duration::from_millis(200);
/// Bytes of log one read takes, and one partition's share of one pass (so a partition with a
/// large backlog does not hold up the others).
const READ_BYTES: u64 = 1 << 20;
const PASS_BYTES_PER_PARTITION: u64 = 32 << 20;
/// The most candidates one lookup reads back.
pub const MAX_CANDIDATES: usize = 1024;

const MAGIC: &[u8; 8] = b"WEIRIDX1";
/// magic, topic id, base offset, end offset, min timestamp, max timestamp, count, entries' CRC.
const HEADER_BYTES: usize = 8 + 16 + 8 * 4 + 4 + 4;
const ENTRY_BYTES: usize = 24;

/// What a lookup is for.
#[derive(Debug, Clone, Copy)]
pub enum Lookup<'a> {
    Key(&'a str),
    MessageId(&'a str),
}

impl Lookup<'_> {
    fn hash(&self) -> u64 {
        match self {
            Lookup::Key(key) => hash_of(b'k', key.as_bytes()),
            Lookup::MessageId(id) => hash_of(b'i', id.as_bytes()),
        }
    }

    /// Whether `record` really is what the lookup asks for.
    pub fn matches(&self, record: &Record) -> bool {
        let (name, wanted) = match self {
            Lookup::Key(key) => (headers::KEY, key),
            Lookup::MessageId(id) => (headers::MESSAGE_ID, id),
        };
        record.headers.iter().any(|h| h.name == name && h.value.as_deref() == Some(wanted.as_bytes()))
    }
}

/// FNV-1a, 64 bits, over a kind byte and the text: stable across builds, unlike std's hasher.
fn hash_of(kind: u8, text: &[u8]) -> u64 {
    [kind, 0]
        .iter()
        .chain(text)
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    hash: u64,
    offset: i64,
    timestamp: i64,
}

/// One chunk file, as its header describes it.
#[derive(Debug, Clone)]
struct Chunk {
    path: PathBuf,
    base: i64,
    end: i64,
    min_timestamp: i64,
    max_timestamp: i64,
}

/// The index of one partition.
#[derive(Debug)]
struct PartitionIndex {
    dir: PathBuf,
    topic_id: Uuid,
    /// Ascending and contiguous: each chunk's `base` is the previous one's `end`.
    chunks: Vec<Chunk>,
    /// Entries of `[open_base, next)`, not yet in a chunk.
    open: Vec<Entry>,
    open_base: i64,
    /// The first offset not indexed yet.
    next: i64,
}

impl PartitionIndex {
    /// Loads the chunks in `dir` that are valid for `topic_id`; deletes the rest.
    fn open(dir: PathBuf, topic_id: Uuid) -> std::io::Result<PartitionIndex> {
        fs::create_dir_all(&dir)?;
        let mut found: Vec<(i64, PathBuf)> = Vec::new();
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            match name.strip_suffix(".chunk").and_then(|stem| stem.split('-').next()?.parse::<i64>().ok()) {
                Some(base) => found.push((base, path)),
                // Temporary files of an interrupted write, and anything else.
                None => {
                    let _ = fs::remove_file(&path);
                }
            }
        }
        found.sort();
        let mut chunks: Vec<Chunk> = Vec::new();
        let mut broken = false;
        for (_, path) in found {
            if !broken {
                match read_chunk(&path, topic_id) {
                    Ok(Some((chunk, _))) if chunks.last().is_none_or(|last| last.end == chunk.base) => {
                        chunks.push(chunk);
                        continue;
                    }
                    Ok(_) | Err(_) => {
                        tracing::warn!(path = %path.display(), "message index: dropping a chunk that is invalid here");
                        broken = true;
                    }
                }
            }
            let _ = fs::remove_file(&path);
        }
        let next = chunks.last().map_or(0, |c| c.end);
        let index = PartitionIndex { dir, topic_id, chunks, open: Vec::new(), open_base: next, next };
        index.check_invariants();
        Ok(index)
    }

    /// Asserts the invariants of the module doc (debug builds only; nothing in release): the
    /// chunks cover contiguous ranges, the open entries `[open_base, next)` follow the last one.
    /// Of the open entries (in offset order) only the first and the last are looked at.
    fn check_invariants(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        let dir = self.dir.display();
        for chunk in &self.chunks {
            assert!(chunk.base <= chunk.end, "{dir}: chunk [{}, {}) ends before it begins", chunk.base, chunk.end);
        }
        for pair in self.chunks.windows(2) {
            assert!(
                pair[0].end == pair[1].base,
                "{dir}: chunks not contiguous: [{}, {}) then [{}, {})",
                pair[0].base,
                pair[0].end,
                pair[1].base,
                pair[1].end
            );
        }
        if let Some(last) = self.chunks.last() {
            assert!(
                last.end == self.open_base,
                "{dir}: the open entries begin at {} but the last chunk ends at {}",
                self.open_base,
                last.end
            );
        }
        assert!(self.open_base <= self.next, "{dir}: open entries from {} to {}", self.open_base, self.next);
        for entry in self.open.first().into_iter().chain(self.open.last()) {
            assert!(
                (self.open_base..self.next).contains(&entry.offset),
                "{dir}: an open entry at {} outside [{}, {})",
                entry.offset,
                self.open_base,
                self.next
            );
        }
    }

    /// Brings the index in line with the log: drops what lies below its start, forgets what a
    /// truncation took from its end.
    fn follow_log(&mut self, log_start: i64, log_end: i64) {
        if self.next > log_end {
            // The log was truncated (a follower after a leader change): index it again from
            // the new end, or from the start of the first chunk that reaches past it.
            let mut popped_base = None;
            while let Some(last) = self.chunks.last() {
                if last.end <= log_end {
                    break;
                }
                let _ = fs::remove_file(&last.path);
                popped_base = Some(last.base);
                self.chunks.pop();
            }
            match popped_base {
                Some(base) => {
                    self.open.clear();
                    self.open_base = base.min(log_end);
                    self.next = self.open_base;
                }
                None => {
                    self.open.retain(|e| e.offset < log_end);
                    // Without chunks the open entries may have begun past the new end.
                    self.open_base = self.open_base.min(log_end);
                    self.next = log_end;
                }
            }
        }
        if self.next < log_start {
            self.open.clear();
            self.open_base = log_start;
            self.next = log_start;
        }
        while self.chunks.first().is_some_and(|c| c.end <= log_start) || self.chunks.len() > MAX_CHUNKS {
            let dropped = self.chunks.remove(0);
            let _ = fs::remove_file(&dropped.path);
        }
        self.check_invariants();
    }

    fn add(&mut self, record: &Record) {
        for header in &record.headers {
            let kind = match header.name.as_str() {
                headers::KEY => b'k',
                headers::MESSAGE_ID => b'i',
                headers::TAG => b't',
                _ => continue,
            };
            let Some(value) = &header.value else { continue };
            self.open.push(Entry { hash: hash_of(kind, value), offset: record.offset, timestamp: record.timestamp });
        }
    }

    /// Writes the open entries as a chunk once there are enough of them.
    /// (Called after each batch of entries: it checks the invariants too.)
    fn seal_if_full(&mut self) -> std::io::Result<()> {
        if self.open.len() >= CHUNK_ENTRIES {
            let mut entries = std::mem::take(&mut self.open);
            entries.sort_unstable();
            match write_chunk(&self.dir, self.topic_id, self.open_base, self.next, &entries) {
                Ok(chunk) => {
                    self.chunks.push(chunk);
                    self.open_base = self.next;
                }
                Err(e) => {
                    self.open = entries;
                    return Err(e);
                }
            }
        }
        self.check_invariants();
        Ok(())
    }
}

fn write_chunk(dir: &Path, topic_id: Uuid, base: i64, end: i64, entries: &[Entry]) -> std::io::Result<Chunk> {
    let min_timestamp = entries.iter().map(|e| e.timestamp).min().unwrap_or(-1);
    let max_timestamp = entries.iter().map(|e| e.timestamp).max().unwrap_or(-1);
    let mut body = Vec::with_capacity(entries.len() * ENTRY_BYTES);
    for e in entries {
        body.extend_from_slice(&e.hash.to_be_bytes());
        body.extend_from_slice(&e.offset.to_be_bytes());
        body.extend_from_slice(&e.timestamp.to_be_bytes());
    }
    let mut file = Vec::with_capacity(HEADER_BYTES + body.len());
    file.extend_from_slice(MAGIC);
    file.extend_from_slice(topic_id.as_bytes());
    for value in [base, end, min_timestamp, max_timestamp] {
        file.extend_from_slice(&value.to_be_bytes());
    }
    file.extend_from_slice(&(entries.len() as u32).to_be_bytes());
    file.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
    file.extend_from_slice(&body);
    let path = dir.join(format!("{base:020}-{end:020}.chunk"));
    let temporary = dir.join(format!("{base:020}.tmp"));
    let mut out = fs::File::create(&temporary)?;
    out.write_all(&file)?;
    // No fsync: a chunk lost or torn in a crash is rebuilt from the log.
    drop(out);
    fs::rename(&temporary, &path)?;
    Ok(Chunk { path, base, end, min_timestamp, max_timestamp })
}

/// The chunk at `path` and its bytes, if it is whole and of `topic_id`.
fn read_chunk(path: &Path, topic_id: Uuid) -> std::io::Result<Option<(Chunk, Vec<u8>)>> {
    let bytes = fs::read(path)?;
    if bytes.len() < HEADER_BYTES || &bytes[..8] != MAGIC || bytes[8..24] != *topic_id.as_bytes() {
        return Ok(None);
    }
    let i64_at = |at: usize| i64::from_be_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
    let u32_at = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap_or_default());
    let (base, end, min_timestamp, max_timestamp) = (i64_at(24), i64_at(32), i64_at(40), i64_at(48));
    let (count, crc) = (u32_at(56) as usize, u32_at(60));
    let body = &bytes[HEADER_BYTES..];
    if body.len() != count * ENTRY_BYTES || crc32c::crc32c(body) != crc || end < base {
        return Ok(None);
    }
    Ok(Some((Chunk { path: path.to_path_buf(), base, end, min_timestamp, max_timestamp }, bytes)))
}

/// The `i`-th entry of a chunk's bytes.
fn chunk_entry(bytes: &[u8], i: usize) -> Entry {
    let at = HEADER_BYTES + i * ENTRY_BYTES;
    let word = |o: usize| bytes[at + o..at + o + 8].try_into().map(u64::from_be_bytes).unwrap_or_default();
    Entry { hash: word(0), offset: word(8) as i64, timestamp: word(16) as i64 }
}

/// The index of the first entry of a chunk's bytes at or after (`hash`, `offset`) (entries
/// are sorted by hash, then offset).
fn chunk_seek(bytes: &[u8], hash: u64, offset: i64) -> usize {
    let count = (bytes.len() - HEADER_BYTES) / ENTRY_BYTES;
    let (mut low, mut high) = (0, count);
    while low < high {
        let middle = (low + high) / 2;
        let e = chunk_entry(bytes, middle);
        if (e.hash, e.offset) < (hash, offset) {
            low = middle + 1;
        } else {
            high = middle;
        }
    }
    low
}

/// The offsets of entries with `hash` in a chunk's bytes, with a timestamp in `range`.
fn chunk_offsets(bytes: &[u8], hash: u64, range: (i64, i64), out: &mut Vec<i64>) {
    let count = (bytes.len() - HEADER_BYTES) / ENTRY_BYTES;
    let entry = |i: usize| chunk_entry(bytes, i);
    let low = chunk_seek(bytes, hash, i64::MIN);
    for i in low..count {
        let e = entry(i);
        if e.hash != hash || out.len() >= MAX_CANDIDATES {
            break;
        }
        if (range.0..=range.1).contains(&e.timestamp) {
            out.push(e.offset);
        }
    }
}

/// A partition's index, shared by the indexer and lookups.
type SharedIndex = Arc<Mutex<PartitionIndex>>;

/// Every partition's index, and the thread that keeps them up to date.
#[derive(Debug)]
pub(crate) struct MessageIndex {
    root: PathBuf,
    /// By (topic, partition).
    partitions: Mutex<HashMap<(String, i32), SharedIndex>>,
}

impl MessageIndex {
    pub fn new(data_dir: &Path) -> MessageIndex {
        MessageIndex { root: data_dir.join(INDEX_DIR), partitions: Mutex::new(HashMap::new()) }
    }

    /// Starts the indexer thread; it stops when the broker shuts down (or is dropped).
    pub fn start(messaging: &Arc<Messaging>) -> std::io::Result<()> {
        let weak: Weak<Messaging> = Arc::downgrade(messaging);
        std::thread::Builder::new().name("weir-message-index".into()).spawn(move || loop {
            let Some(messaging) = weak.upgrade() else { return };
            if *messaging.broker.shutdown_signal().borrow() {
                return;
            }
            messaging.message_index.pass(&messaging.broker);
            drop(messaging);
            std::thread::sleep(PASS_INTERVAL);
        })?;
        Ok(())
    }

    /// One round over the partitions: indexes what is new in each, drops the indexes of
    /// partitions that are gone.
    ///
    /// It walks the indexed topics, not every partition: it runs five times a second, and a
    /// broker of 15,000 partitions, none of them indexed, should not look at each of them to
    /// find nothing to do.
    fn pass(&self, broker: &Broker) {
        let metadata = broker.metadata();
        let mut live = HashSet::new();
        let defaults = &broker.config.topic_defaults;
        let indexed = metadata
            .topics
            .values()
            .filter(|topic| weir_broker::topic_config::message_index(defaults, &topic.configs))
            .filter_map(|topic| Some((topic, broker.topic_partitions(&topic.name)?)));
        for (topic, partitions) in indexed {
            for partition in partitions.iter().flatten() {
                self.index_partition(broker, partition, topic.id);
                live.insert((partition.topic.clone(), partition.index));
            }
        }
        let gone: Vec<(String, i32)> = {
            let mut partitions = lock(&self.partitions);
            let gone = partitions.keys().filter(|k| !live.contains(k)).cloned().collect::<Vec<_>>();
            for key in &gone {
                partitions.remove(key);
            }
            gone
        };
        for (topic, index) in gone {
            // The topic was deleted, or stopped being indexed, or moved away: its index would
            // only be stale. (Opening it again rebuilds it from the log.)
            let _ = fs::remove_dir_all(self.root.join(format!("{topic}-{index}")));
        }
    }

    /// Indexes what is new in one partition of an indexed topic.
    fn index_partition(&self, broker: &Broker, partition: &Partition, topic_id: Uuid) {
        let index = match self.partition_index(partition, topic_id) {
            Ok(index) => index,
            Err(e) => {
                tracing::warn!(topic = %partition.topic, partition = partition.index, error = %e, "message index: cannot open");
                return;
            }
        };
        if let Err(e) = index_new_records(broker, partition, &index) {
            tracing::warn!(topic = %partition.topic, partition = partition.index, error = %e, "message index: indexing failed");
        }
    }

    fn partition_index(&self, partition: &Partition, topic_id: Uuid) -> std::io::Result<SharedIndex> {
        let key = (partition.topic.clone(), partition.index);
        if let Some(index) = lock(&self.partitions).get(&key) {
            if lock(index).topic_id == topic_id {
                return Ok(index.clone());
            }
        }
        let dir = self.root.join(format!("{}-{}", partition.topic, partition.index));
        let index = Arc::new(Mutex::new(PartitionIndex::open(dir, topic_id)?));
        lock(&self.partitions).insert(key, index.clone());
        Ok(index)
    }

    /// The offsets in `topic`-`partition` that may hold a message `lookup` names, with a
    /// timestamp in `[from, to]` (ms), ascending; at most [`MAX_CANDIDATES`]. `None` when this
    /// broker has no index of the partition.
    fn candidates(&self, topic: &str, partition: i32, lookup: Lookup<'_>, range: (i64, i64)) -> Option<Vec<i64>> {
        let index = lock(&self.partitions).get(&(topic.to_string(), partition))?.clone();
        let hash = lookup.hash();
        let (chunks, topic_id, mut out) = {
            let index = lock(&index);
            let open = index
                .open
                .iter()
                .filter(|e| e.hash == hash && (range.0..=range.1).contains(&e.timestamp))
                .map(|e| e.offset)
                .collect::<Vec<_>>();
            (index.chunks.clone(), index.topic_id, open)
        };
        for chunk in chunks.iter().rev() {
            if out.len() >= MAX_CANDIDATES {
                break;
            }
            if chunk.max_timestamp < range.0 || chunk.min_timestamp > range.1 {
                continue;
            }
            // A chunk deleted meanwhile (retention) has nothing to give.
            if let Ok(Some((_, bytes))) = read_chunk(&chunk.path, topic_id) {
                chunk_offsets(&bytes, hash, range, &mut out);
            }
        }
        out.sort_unstable();
        out.dedup();
        out.truncate(MAX_CANDIDATES);
        Some(out)
    }
}

impl MessageIndex {
    /// Where a receive with a tag filter finds its messages without reading the others: the
    /// offsets at or after `from` of `topic`-`partition` whose tag hash is one of `tags`'s,
    /// ascending, at most `limit`, and the offset up to which the index has looked (every
    /// matching message below it and at or after `from` is among the offsets, or past the
    /// last of them when `limit` cut the list short). `None` without an index of the
    /// partition. Candidates share a hash, not necessarily the tag: the caller checks them.
    pub(crate) fn tagged_offsets(
        &self,
        topic: &str,
        partition: i32,
        tags: &[String],
        from: i64,
        limit: usize,
    ) -> Option<(Vec<i64>, i64)> {
        let index = lock(&self.partitions).get(&(topic.to_string(), partition))?.clone();
        let hashes: Vec<u64> = tags.iter().map(|t| hash_of(b't', t.as_bytes())).collect();
        let (chunks, topic_id, indexed_to, mut out) = {
            let index = lock(&index);
            if from < index.chunks.first().map_or(index.open_base, |c| c.base) {
                // Below what the index covers (retention took its chunks): read the log.
                return None;
            }
            let open: Vec<i64> =
                index.open.iter().filter(|e| e.offset >= from && hashes.contains(&e.hash)).map(|e| e.offset).collect();
            (index.chunks.clone(), index.topic_id, index.next, open)
        };
        // Chunk entries are below the open ones, and each chunk's below the next one's.
        let mut from_chunks = 0;
        for chunk in chunks.iter().filter(|c| c.end > from) {
            let Ok(Some((_, bytes))) = read_chunk(&chunk.path, topic_id) else { return None };
            let count = (bytes.len() - HEADER_BYTES) / ENTRY_BYTES;
            for hash in &hashes {
                let mut i = chunk_seek(&bytes, *hash, from);
                let mut taken = 0;
                while i < count && taken < limit {
                    let e = chunk_entry(&bytes, i);
                    if e.hash != *hash {
                        break;
                    }
                    out.push(e.offset);
                    taken += 1;
                    i += 1;
                }
                from_chunks += taken;
            }
            // Once enough are found, later chunks and the open entries cannot come first.
            if from_chunks >= limit {
                break;
            }
        }
        out.sort_unstable();
        out.dedup();
        out.truncate(limit);
        Some((out, indexed_to))
    }
}

/// Reads `partition` from where its index stopped up to the last stable offset (at most a
/// pass's share) and indexes what it finds: committed records only, so a query by key or id
/// never finds a record of an aborted transaction, and one of an open transaction only once
/// it commits (the index waits at the last stable offset until then). Blocking.
fn index_new_records(broker: &Broker, partition: &Partition, index: &Mutex<PartitionIndex>) -> Result<(), BrokerError> {
    let log = &partition.log;
    let mut budget = PASS_BYTES_PER_PARTITION;
    let mut next = {
        let mut index = lock(index);
        index.follow_log(log.log_start_offset(), log.log_end_offset());
        index.next
    };
    while budget > 0 && next < log.last_stable_offset() {
        let (records, end) = broker.read_records(partition, next, READ_BYTES)?;
        if end <= next {
            break;
        }
        let mut index = lock(index);
        if index.next != next {
            break; // changed under us (cannot happen: one indexer thread); look again next pass
        }
        for record in &records {
            index.add(record);
        }
        index.next = end;
        index.seal_if_full().map_err(|e| BrokerError::new(ErrorKind::Storage, format!("message index: {e}")))?;
        budget = budget.saturating_sub(READ_BYTES);
        next = end;
    }
    Ok(())
}

/// A message found by a query.
#[derive(Debug, Clone)]
pub struct Found {
    pub partition: i32,
    pub record: Record,
}

impl Messaging {
    /// The messages of `topic`'s partitions on this broker that `lookup` names, with a
    /// timestamp within `[from, to]` ms, at most `max`, by partition and offset. A topic whose
    /// messages are not indexed is an error that says so. Blocking (reads the log).
    pub fn find_messages(
        &self,
        topic: &str,
        lookup: Lookup<'_>,
        range: (i64, i64),
        max: usize,
    ) -> Result<Vec<Found>, BrokerError> {
        let metadata = self.broker.metadata();
        let described = metadata.topic(topic).ok_or_else(|| {
            BrokerError::new(ErrorKind::UnknownTopicOrPartition, format!("Topic {topic} does not exist."))
        })?;
        if let Lookup::MessageId(id) = lookup {
            if !weir_broker::message::is_message_id(id) {
                return Err(BrokerError::new(
                    ErrorKind::InvalidRequest,
                    format!(
                        "invalid message id {id:?}: message ids are hex digits (RocketMQ's are 32 or 34 of them, \
                         as Weir's own)"
                    ),
                ));
            }
        }
        let mut found = Vec::new();
        let Some(partitions) = self.broker.topic_partitions(topic) else { return Ok(found) };
        // An id Weir derived for a record stored without one says where the record is.
        if let Lookup::MessageId(id) = lookup {
            if let Some((index, offset)) = weir_broker::message::parse_derived_message_id(topic, id) {
                if let Some(partition) = weir_broker::partition::by_index(&partitions, index) {
                    if let Some(record) = self.broker.read_record(partition, offset)? {
                        found.push(Found { partition: index, record });
                    }
                }
                return Ok(found);
            }
        }
        if !weir_broker::topic_config::message_index(&self.broker.config.topic_defaults, &described.configs) {
            return Err(BrokerError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "topic {topic} does not index its messages: set {}=true on it",
                    weir_broker::topic_config::MESSAGE_INDEX
                ),
            ));
        }
        for partition in partitions.iter().flatten() {
            let Some(offsets) = self.message_index.candidates(topic, partition.index, lookup, range) else { continue };
            for offset in offsets {
                if found.len() >= max {
                    return Ok(found);
                }
                if let Some(record) = self.broker.read_record(partition, offset)? {
                    if lookup.matches(&record) && (range.0..=range.1).contains(&record.timestamp) {
                        found.push(Found { partition: partition.index, record });
                    }
                }
            }
        }
        Ok(found)
    }

    /// The messages of `topic`'s partitions on this broker with a timestamp within `[from, to]`
    /// ms: from the first the time index finds at or after `from`, in offset order, until one
    /// past `to`; at most `max` over all partitions, by partition and offset. Works on every
    /// topic (the time index is the log's own). Blocking.
    pub fn messages_in_time_range(
        &self,
        topic: &str,
        range: (i64, i64),
        max: usize,
    ) -> Result<Vec<Found>, BrokerError> {
        let partitions = self.broker.topic_partitions(topic).ok_or_else(|| {
            BrokerError::new(ErrorKind::UnknownTopicOrPartition, format!("Topic {topic} does not exist."))
        })?;
        let mut found = Vec::new();
        for partition in partitions.iter().flatten() {
            let start = self.broker.list_offset(
                partition,
                weir_broker::broker::OffsetQuery::AtTimestamp(range.0.max(0)),
                weir_broker::fetch::Isolation::Committed,
            )?;
            // Committed records only (`read_records` stops at the last stable offset too).
            let end = partition.log.last_stable_offset();
            // No record at or after the range's start: nothing of this partition is in it.
            let Some(start) = start else { continue };
            let mut next = start.offset;
            'read: while next < end && found.len() < max {
                let (records, after) = self.broker.read_records(partition, next, READ_BYTES)?;
                for record in records {
                    if record.timestamp > range.1 {
                        break 'read;
                    }
                    if record.timestamp >= range.0 {
                        found.push(Found { partition: partition.index, record });
                        if found.len() >= max {
                            break 'read;
                        }
                    }
                }
                if after <= next {
                    break;
                }
                next = after;
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use weir_storage::records::Header;

    fn message(offset: i64, keys: &[&str], id: &str) -> Record {
        let mut record = Record::new(1_000 + offset, None, Some(Bytes::from_static(b"v")));
        record.offset = offset;
        for key in keys {
            record.headers.push(Header { name: headers::KEY.into(), value: Some(Bytes::from(key.to_string())) });
        }
        record.headers.push(Header { name: headers::MESSAGE_ID.into(), value: Some(Bytes::from(id.to_string())) });
        record
    }

    fn offsets(index: &MessageIndex, lookup: Lookup<'_>) -> Vec<i64> {
        index.candidates("t", 0, lookup, (0, i64::MAX)).expect("an index")
    }

    #[test]
    fn keys_and_ids_are_found_in_memory_in_sealed_chunks_and_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let index = MessageIndex::new(dir.path());
        let topic_id = Uuid::new_v4();
        let partition_dir = index.root.join("t-0");
        let mut p = PartitionIndex::open(partition_dir.clone(), topic_id).unwrap();
        let total = CHUNK_ENTRIES as i64 / 2 + 10; // two entries each: one chunk and a rest
        for offset in 0..total {
            p.add(&message(offset, &[&format!("key-{}", offset % 100)], &format!("ID{offset}")));
            p.next = offset + 1;
            p.seal_if_full().unwrap();
        }
        assert_eq!(p.chunks.len(), 1);
        assert_eq!((p.chunks[0].base, p.chunks[0].end), (0, CHUNK_ENTRIES as i64 / 2));
        lock(&index.partitions).insert(("t".into(), 0), Arc::new(Mutex::new(p)));

        let with_key_7: Vec<i64> = (0..total).filter(|o| o % 100 == 7).collect();
        assert_eq!(offsets(&index, Lookup::Key("key-7")), with_key_7);
        assert_eq!(offsets(&index, Lookup::MessageId(&format!("ID{}", total - 1))), vec![total - 1], "in memory");
        assert_eq!(offsets(&index, Lookup::MessageId("ID3")), vec![3], "in the chunk");
        assert!(offsets(&index, Lookup::Key("ID3")).is_empty(), "keys and ids are apart");
        let recent = index.candidates("t", 0, Lookup::Key("key-7"), (1_000 + 8_000, i64::MAX)).unwrap();
        assert!(recent.iter().all(|o| *o >= 8_000) && !recent.is_empty(), "{recent:?}");

        // Reopened: the chunk is back; the rest is indexed again from its end.
        let reopened = PartitionIndex::open(partition_dir, topic_id).unwrap();
        assert_eq!(reopened.next, CHUNK_ENTRIES as i64 / 2);
        assert_eq!(reopened.chunks.len(), 1);
    }

    #[test]
    fn tagged_offsets_come_in_offset_order_from_chunks_and_memory_and_stop_at_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let index = MessageIndex::new(dir.path());
        let mut p = PartitionIndex::open(index.root.join("t-0"), Uuid::new_v4()).unwrap();
        // One message in ten is tagged hit; each message has a tag and an id: two entries.
        let total = CHUNK_ENTRIES as i64 + 100; // two chunks' worth of messages and a rest
        for offset in 0..total {
            let mut record = message(offset, &[], &format!("ID{offset}"));
            let tag = if offset % 10 == 3 { "hit" } else { "miss" };
            record.headers.push(Header { name: headers::TAG.into(), value: Some(Bytes::from(tag)) });
            p.add(&record);
            p.next = offset + 1;
            p.seal_if_full().unwrap();
        }
        assert_eq!(p.chunks.len(), 2);
        lock(&index.partitions).insert(("t".into(), 0), Arc::new(Mutex::new(p)));
        let hits = |from: i64, limit: usize| index.tagged_offsets("t", 0, &["hit".to_string()], from, limit).unwrap();

        let (first, _) = hits(0, 5);
        assert_eq!(first, vec![3, 13, 23, 33, 43]);
        // Across the chunk boundary and into memory, every one after `from`, nothing else.
        let (all, indexed_to) = hits(5, usize::MAX);
        assert_eq!(indexed_to, total);
        assert_eq!(all, (5..total).filter(|o| o % 10 == 3).collect::<Vec<_>>());
        let (tail, _) = hits(total - 50, 3);
        assert_eq!(tail, ((total - 50)..total).filter(|o| o % 10 == 3).take(3).collect::<Vec<_>>());
        let (both, _) = index.tagged_offsets("t", 0, &["hit".to_string(), "miss".to_string()], 100, 4).unwrap();
        assert_eq!(both, vec![100, 101, 102, 103]);
        assert!(index.tagged_offsets("t", 1, &["hit".to_string()], 0, 1).is_none(), "no index");
    }

    #[test]
    fn torn_and_foreign_chunks_are_dropped_with_the_chunks_after_them() {
        let dir = tempfile::tempdir().unwrap();
        let topic_id = Uuid::new_v4();
        let entries = [Entry { hash: 1, offset: 0, timestamp: 5 }];
        write_chunk(dir.path(), topic_id, 0, 10, &entries).unwrap();
        let second = write_chunk(dir.path(), topic_id, 10, 20, &entries).unwrap();
        write_chunk(dir.path(), topic_id, 20, 30, &entries).unwrap();
        let mut bytes = fs::read(&second.path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(&second.path, bytes).unwrap();
        fs::write(dir.path().join("00000000000000000030.tmp"), b"half a chunk").unwrap();

        let index = PartitionIndex::open(dir.path().to_path_buf(), topic_id).unwrap();
        assert_eq!(index.chunks.len(), 1);
        assert_eq!(index.next, 10, "indexing resumes after the last good chunk");
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "the torn chunk, those after it and the temporary file are gone"
        );

        let other = PartitionIndex::open(dir.path().to_path_buf(), Uuid::new_v4()).unwrap();
        assert!(other.chunks.is_empty(), "a chunk of another topic id is dropped");
        assert_eq!(other.next, 0);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "chunks not contiguous")]
    fn chunks_with_a_gap_are_caught() {
        let dir = tempfile::tempdir().unwrap();
        let topic_id = Uuid::new_v4();
        let mut p = PartitionIndex::open(dir.path().to_path_buf(), topic_id).unwrap();
        for (base, end) in [(0, 10), (12, 20)] {
            p.chunks.push(write_chunk(dir.path(), topic_id, base, end, &[]).unwrap());
        }
        (p.open_base, p.next) = (20, 20);
        p.check_invariants();
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "outside")]
    fn an_open_entry_outside_the_open_range_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = PartitionIndex::open(dir.path().to_path_buf(), Uuid::new_v4()).unwrap();
        p.add(&message(5, &["k"], "x"));
        p.next = 5;
        let _ = p.seal_if_full();
    }

    #[test]
    fn the_index_follows_retention_and_truncation_of_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let topic_id = Uuid::new_v4();
        let mut p = PartitionIndex::open(dir.path().to_path_buf(), topic_id).unwrap();
        for (base, end) in [(0, 10), (10, 20)] {
            p.chunks.push(write_chunk(dir.path(), topic_id, base, end, &[]).unwrap());
        }
        p.open_base = 20;
        for offset in 20..30 {
            p.add(&message(offset, &["k"], "x"));
        }
        p.next = 30;
        p.follow_log(12, 25);
        assert_eq!(p.chunks.len(), 1, "the chunk below the log start is gone");
        assert_eq!(p.next, 25);
        assert!(p.open.iter().all(|e| e.offset < 25));
        p.follow_log(10, 15);
        assert!(p.chunks.is_empty(), "the chunk past the truncation point is gone");
        assert_eq!((p.open_base, p.next), (10, 10), "indexed again from that chunk's start");
        assert!(p.open.is_empty());
        p.follow_log(40, 40);
        assert!(p.chunks.is_empty() && p.open.is_empty());
        assert_eq!((p.open_base, p.next), (40, 40));
    }
}
