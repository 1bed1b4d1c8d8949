//! Weir's object-storage tier (KIP-405's model): closed segments of topics with
//! `remote.storage.enable=true` are copied to an object store, and retention deletes them there.
//!
//! Layering: this crate sits beside the data path, below nothing but `weir-storage`. It reads a
//! partition's sealed segments through [`weir_storage::Log::sealed_segments`] and never writes
//! the log; the broker decides which partitions it works on (the ones it leads) and when.
//! Which segments the store holds is the store's own listing of manifests (see [`manifest`]),
//! so a restarted or new leader needs nothing else to carry on.

pub mod compact;
pub mod error;
pub mod manifest;
pub mod partition;
pub mod reader;
pub mod store;
pub mod wal;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use uuid::Uuid;

pub use compact::CompactOutcome;
pub use error::TierError;
pub use manifest::RemoteSegment;
pub use partition::{PartitionTier, SyncOutcome, TierStatus};
pub use reader::{CacheSettings, ChunkCache, RemoteRead};
pub use store::{Store, StoreSettings};
pub use wal::{Wal, WalEntry, WalHeader, WalObject, WalRange, WalWrite};

/// The broker's tier: its store, and a [`PartitionTier`] for each partition it has worked on.
pub struct Tier {
    store: Arc<Store>,
    cache: Arc<ChunkCache>,
    partitions: Mutex<HashMap<(Uuid, i32), Arc<PartitionTier>>>,
}

impl Tier {
    /// Opens the store (see [`Store::open`]: nothing is read yet) and empties the read cache,
    /// `<data_dir>/remote-cache`.
    pub fn open(settings: &StoreSettings, data_dir: &Path, cache: CacheSettings) -> Result<Tier, TierError> {
        Ok(Tier {
            store: Arc::new(Store::open(settings, data_dir)?),
            cache: Arc::new(ChunkCache::open(&data_dir.join("remote-cache"), cache)?),
            partitions: Mutex::new(HashMap::new()),
        })
    }

    /// The cache of chunks read from the store.
    pub fn cache(&self) -> &ChunkCache {
        &self.cache
    }

    /// The store, as logs name it.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The partition's tier, made on first use.
    pub fn partition(&self, topic: &str, topic_id: Uuid, partition: i32) -> Arc<PartitionTier> {
        let mut partitions = weir_storage::sync::lock(&self.partitions);
        Arc::clone(partitions.entry((topic_id, partition)).or_insert_with(|| {
            Arc::new(PartitionTier::new(Arc::clone(&self.store), Arc::clone(&self.cache), topic, topic_id, partition))
        }))
    }

    /// The partition's tier if this broker has worked on it.
    pub fn existing(&self, topic_id: Uuid, partition: i32) -> Option<Arc<PartitionTier>> {
        weir_storage::sync::lock(&self.partitions).get(&(topic_id, partition)).cloned()
    }

    /// Forgets the partitions `keep` says no to (deleted topics, partitions moved away).
    pub fn retain(&self, mut keep: impl FnMut(Uuid, i32) -> bool) {
        weir_storage::sync::lock(&self.partitions).retain(|(id, p), _| keep(*id, *p));
    }

    /// Every partition's status, summed: the broker-wide figures of `/metrics`.
    pub fn totals(&self) -> TierStatus {
        let partitions: Vec<Arc<PartitionTier>> =
            weir_storage::sync::lock(&self.partitions).values().cloned().collect();
        let mut total = TierStatus::default();
        for partition in partitions {
            let s = partition.status();
            total.remote_segments += s.remote_segments;
            total.remote_bytes += s.remote_bytes;
            total.lag_segments += s.lag_segments;
            total.lag_bytes += s.lag_bytes;
            total.uploaded_segments_total += s.uploaded_segments_total;
            total.uploaded_bytes_total += s.uploaded_bytes_total;
            total.deleted_segments_total += s.deleted_segments_total;
            total.failures_total += s.failures_total;
            total.compacted_segments_total += s.compacted_segments_total;
            total.compacted_records_total += s.compacted_records_total;
        }
        total
    }
}
