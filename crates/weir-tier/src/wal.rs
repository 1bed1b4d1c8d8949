//! The write-ahead objects of memory-first topics (`storage.mode=memory`): what the broker's
//! writer puts in the object store, many partitions' new batches in one object, before it
//! acknowledges them (the broker side is `weir-broker/src/memory.rs`).
//!
//! An object is `<prefix>/wal/<node>/<written at ms, 20 digits>-<sequence, 10 digits>.wal`:
//! ```text
//! "WEIRWAL1" | u32 header length | header (JSON: `WalHeader`) | the entries' bytes, in order
//! ```
//! Each entry is whole stored batches of one partition, `[base_offset, next_offset)`, at
//! `position` (from the end of the header) for `length` bytes. An object is written whole or
//! not at all (one PUT), so a listed object is complete. It is deleted once the partition's
//! tiered segments hold every entry of it (the tier uploads memory-first partitions as any
//! tiered partition), or its partitions are gone.

use bytes::{BufMut, Bytes, BytesMut};
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::TierError;
use crate::store::Store;

const MAGIC: &[u8; 8] = b"WEIRWAL1";
const PREAMBLE_BYTES: u64 = 12;
/// A header larger than this is not one this code wrote.
const HEADER_BYTES_MAX: u64 = 64 << 20;

/// Which batches of which partition: `[base_offset, next_offset)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalRange {
    pub topic: String,
    pub topic_id: Uuid,
    pub partition: i32,
    pub base_offset: i64,
    pub next_offset: i64,
    /// The leader epoch the batches were written in.
    pub leader_epoch: i32,
}

/// One partition's batches in an object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalEntry {
    #[serde(flatten)]
    pub range: WalRange,
    /// Where the entry's bytes are, counted from the end of the header.
    pub position: u64,
    pub length: u64,
}

/// An object's header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalHeader {
    pub node: i32,
    pub written_at_ms: i64,
    pub entries: Vec<WalEntry>,
}

/// A listed object: its key and its header, and where its data starts.
#[derive(Debug, Clone)]
pub struct WalObject {
    pub key: ObjectPath,
    pub header: WalHeader,
    pub data_start: u64,
}

/// An entry to write: its partition's batches.
pub struct WalWrite {
    pub range: WalRange,
    /// The range's batches, in order: the pieces the broker kept of its produce requests, or
    /// what it read back from the log. They go into the object as they are (no copy here).
    pub chunks: Vec<Bytes>,
}

impl WalWrite {
    pub fn len(&self) -> u64 {
        self.chunks.iter().map(|c| c.len() as u64).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The write-ahead objects of one store.
pub struct Wal<'a> {
    store: &'a Store,
}

impl<'a> Wal<'a> {
    pub fn new(store: &'a Store) -> Wal<'a> {
        Wal { store }
    }

    fn dir(&self) -> ObjectPath {
        self.store.key(&["wal"])
    }

    /// Writes one object holding `writes`, in one PUT; returns what it wrote.
    pub async fn write(
        &self,
        node: i32,
        written_at_ms: i64,
        sequence: u64,
        writes: Vec<WalWrite>,
    ) -> Result<WalObject, TierError> {
        let mut entries = Vec::with_capacity(writes.len());
        let mut position = 0u64;
        for w in &writes {
            entries.push(WalEntry { range: w.range.clone(), position, length: w.len() });
            position += w.len();
        }
        let header = WalHeader { node, written_at_ms, entries };
        let json = serde_json::to_vec(&header)
            .map_err(|e| TierError::Corrupt { key: "a write-ahead object's header".into(), reason: e.to_string() })?;
        let mut head = BytesMut::with_capacity(PREAMBLE_BYTES as usize + json.len());
        head.put_slice(MAGIC);
        head.put_u32(json.len() as u32);
        head.put_slice(&json);
        // The object is the head, then every write's chunks: one PUT of the pieces, not of a
        // copy of them.
        let body: PutPayload =
            std::iter::once(head.freeze()).chain(writes.into_iter().flat_map(|w| w.chunks)).collect();
        let key = self.dir().join(format!("{node:05}")).join(format!("{written_at_ms:020}-{sequence:010}.wal"));
        self.store.objects.put(&key, body).await?;
        Ok(WalObject { key, header, data_start: PREAMBLE_BYTES + json.len() as u64 })
    }

    /// Every object in the store, oldest first (by name: time, then sequence), with its header.
    pub async fn list(&self) -> Result<Vec<WalObject>, TierError> {
        let mut listed: Vec<_> = self.store.objects.list(Some(&self.dir())).try_collect().await?;
        listed.sort_by(|a, b| a.location.filename().cmp(&b.location.filename()));
        let mut out = Vec::with_capacity(listed.len());
        for meta in listed {
            if !meta.location.as_ref().ends_with(".wal") {
                continue;
            }
            let key = meta.location.clone();
            let corrupt = |reason: String| TierError::Corrupt { key: key.to_string(), reason };
            let preamble = self.store.objects.get_range(&key, 0..PREAMBLE_BYTES).await?;
            if preamble.len() < PREAMBLE_BYTES as usize || &preamble[..8] != MAGIC {
                return Err(corrupt("not a write-ahead object".into()));
            }
            let length = u64::from(u32::from_be_bytes([preamble[8], preamble[9], preamble[10], preamble[11]]));
            if length > HEADER_BYTES_MAX || PREAMBLE_BYTES + length > meta.size {
                return Err(corrupt(format!("a header of {length} bytes in an object of {}", meta.size)));
            }
            let json = self.store.objects.get_range(&key, PREAMBLE_BYTES..PREAMBLE_BYTES + length).await?;
            let header: WalHeader = serde_json::from_slice(&json).map_err(|e| corrupt(e.to_string()))?;
            out.push(WalObject { key, header, data_start: PREAMBLE_BYTES + length });
        }
        Ok(out)
    }

    /// The bytes of one entry of `object`.
    pub async fn read(&self, object: &WalObject, entry: &WalEntry) -> Result<Bytes, TierError> {
        let start = object.data_start + entry.position;
        Ok(self.store.objects.get_range(&object.key, start..start + entry.length).await?)
    }

    /// Deletes an object (one already gone is no error).
    pub async fn delete(&self, object: &WalObject) -> Result<(), TierError> {
        match self.store.objects.delete(&object.key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
