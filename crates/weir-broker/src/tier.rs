//! Tiered storage on this broker (KIP-405's model, the `weir-tier` crate): every
//! `remote.log.manager.task.interval.ms`, each partition of a tiered topic (`remote.storage.enable`)
//! that this broker leads uploads its closed, committed segments to the object store and
//! deletes from it what retention has passed. Followers upload nothing: a leader change hands
//! the work over, and the new leader learns what the store holds from the store itself.
//!
//! Nothing a producer or consumer waits on goes through here: a store that is down only makes
//! passes fail (counted, logged, retried at the next pass).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

pub use weir_tier::{CacheSettings, RemoteSegment, Tier, TierStatus};

use crate::broker::{Broker, NewTopic};
use crate::error::{BrokerError, ErrorKind};
use crate::partition::Partition;
use crate::topic_config::ConfigEdit;

/// The topic config that turns tiering on (Kafka's name).
pub const REMOTE_STORAGE_ENABLE: &str = "remote.storage.enable";

impl Broker {
    /// Starts the periodic passes when tiered storage is on.
    pub(crate) fn run_tier_uploads(self: &Arc<Self>) {
        let Some(tier) = self.tier.clone() else { return };
        tracing::info!(store = ?tier.store(), "tiered storage is on");
        let interval = Duration::from_millis(self.config.remote_log_manager_interval_ms);
        // A first pass at once: after a restart it settles each tiered log's start on what the
        // store holds (the checkpoint it starts from may be a moment old).
        let first = Arc::clone(self);
        let first_tier = Arc::clone(&tier);
        tokio::spawn(async move { first.tier_pass(&first_tier).await });
        self.every(interval, move |broker| {
            let tier = Arc::clone(&tier);
            async move { broker.tier_pass(&tier).await }
        });
    }

    /// One pass over the tiered partitions this broker leads, one partition at a time.
    async fn tier_pass(&self, tier: &Tier) {
        let mut tiered = HashSet::new();
        for partition in self.partitions() {
            if !partition.log.config().remote_storage_enable {
                continue;
            }
            tiered.insert((partition.topic_id, partition.index));
            if self.is_shutting_down() {
                return;
            }
            let remote = tier.partition(&partition.topic, partition.topic_id, partition.index);
            if partition.state().leader != self.config.node_id {
                // A follower learns what its leader uploaded (a shared store), for its own
                // local retention.
                if let Err(e) = remote.refresh(&partition.log).await {
                    tracing::debug!(topic = %partition.topic, partition = partition.index, error = %e, "cannot list the object store");
                }
                continue;
            }
            match remote.sync(&partition.log, self.config.node_id, self.now_ms()).await {
                Ok(outcome) if outcome.uploaded_segments > 0 || outcome.deleted_segments > 0 => {
                    tracing::info!(topic = %partition.topic, partition = partition.index, uploaded = outcome.uploaded_segments, bytes = outcome.uploaded_bytes, deleted = outcome.deleted_segments, "tiered storage pass");
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(topic = %partition.topic, partition = partition.index, error = %e, "tiered storage pass failed; the next pass resumes where it stopped");
                }
            }
        }
        tier.retain(|id, index| tiered.contains(&(id, index)));
    }

    /// The tier's figures for `partition`, when its topic is tiered on a broker with tiering
    /// on (zeros until this broker's first pass over it, which only its leader makes).
    pub fn tier_status(&self, partition: &Partition) -> Option<TierStatus> {
        let tier = self.tier.as_ref()?;
        if !partition.log.config().remote_storage_enable {
            return None;
        }
        Some(tier.existing(partition.topic_id, partition.index).map(|t| t.status()).unwrap_or_default())
    }

    /// ListOffsets by timestamp over the part of a tiered log only the object store holds
    /// (blocking: called where `list_offset` is, off the async workers). `None` when the log
    /// has no such part or no record there is late enough.
    pub(crate) fn tiered_offset_for_timestamp(
        &self,
        partition: &Partition,
        target: i64,
    ) -> Result<Option<(i64, i64)>, BrokerError> {
        let Some((remote, start, local_start)) = self.store_only_part(partition) else { return Ok(None) };
        crate::runtime::block_on(remote.offset_for_timestamp(target, start, local_start))?.map_err(|e| {
            BrokerError::new(ErrorKind::Storage, format!("looking up a timestamp in the object store: {e}"))
        })
    }

    /// The tier of a partition whose log has a part only the store holds, with that part's
    /// bounds: `[log start, local log start)`. `None` without tiering or such a part.
    fn store_only_part(&self, partition: &Partition) -> Option<(Arc<weir_tier::PartitionTier>, i64, i64)> {
        let tier = self.tier.as_ref()?;
        let log = &partition.log;
        let (start, local_start) = (log.log_start_offset(), log.local_log_start_offset());
        (start < local_start)
            .then(|| (tier.partition(&partition.topic, partition.topic_id, partition.index), start, local_start))
    }

    /// Whether a read of `offset` goes to the object store: the partition is tiered, the
    /// offset is in the log but no longer on local disk.
    pub(crate) fn reads_remote(&self, partition: &Partition, offset: i64) -> bool {
        let log = &partition.log;
        self.tier.is_some() && offset >= log.log_start_offset() && offset < log.local_log_start_offset()
    }

    /// Whether a replica's fetch of `offset` is answered OFFSET_MOVED_TO_TIERED_STORAGE: only the
    /// store holds it, and the store is one every broker sees (S3). With a directory store,
    /// which may be each broker's own, the leader serves the replica from its store instead.
    pub(crate) fn replicas_skip_store(&self, partition: &Partition, offset: i64) -> bool {
        self.tier.as_ref().is_some_and(|t| t.store().is_shared()) && self.reads_remote(partition, offset)
    }

    /// Whole batches from `offset` (which only the object store holds) up to `upper`, about
    /// `max_bytes` of them (at least one), with the aborted transactions among them: what the
    /// broker's own readers (RocketMQ receives, the message index, redeliveries) read of a
    /// tiered log's older part. `None` when nothing is there below `upper`. Blocking (from
    /// a worker it steps aside with `block_in_place`).
    pub(crate) fn read_tiered_blocking(
        &self,
        partition: &Partition,
        offset: i64,
        max_bytes: u64,
        upper: i64,
    ) -> Result<Option<(bytes::Bytes, Vec<weir_storage::AbortedTxn>)>, BrokerError> {
        let Some(tier) = &self.tier else { return Ok(None) };
        let remote = tier.partition(&partition.topic, partition.topic_id, partition.index);
        match crate::runtime::block_on(remote.read(offset, max_bytes, upper, true))? {
            Ok(Some(read)) => Ok(Some((read.slice.into_bytes().map_err(BrokerError::from)?, read.aborted))),
            Ok(None) => Ok(None),
            Err(weir_tier::TierError::NotInStore(offset)) => Err(BrokerError::new(
                ErrorKind::OffsetOutOfRange,
                format!(
                    "offset {offset} is neither on local disk (from {}) nor in the object store",
                    partition.log.local_log_start_offset()
                ),
            )),
            Err(e) => Err(BrokerError::new(ErrorKind::Storage, format!("reading the object store: {e}"))),
        }
    }

    /// The record with the largest timestamp in the part of a tiered log only the object store
    /// holds, as (timestamp, offset): the first such segment by its manifest, then the last
    /// record of its batch with that timestamp, as the local log answers MAX_TIMESTAMP.
    /// Blocking.
    pub(crate) fn tiered_max_timestamp(&self, partition: &Partition) -> Result<Option<(i64, i64)>, BrokerError> {
        let Some((remote, start, local_start)) = self.store_only_part(partition) else { return Ok(None) };
        let segments = crate::runtime::block_on(remote.remote_segments())?
            .map_err(|e| BrokerError::new(ErrorKind::Storage, format!("listing the object store: {e}")))?;
        let mut best: Option<(i64, i64)> = None;
        for segment in segments.iter().filter(|s| s.next_offset > start && s.base_offset < local_start) {
            if let Some((timestamp, offset)) = segment.max_timestamp {
                if best.is_none_or(|(t, _)| timestamp > t) {
                    best = Some((timestamp, offset.max(start)));
                }
            }
        }
        let Some((timestamp, offset)) = best else { return Ok(None) };
        // Refine from the batch to its record carrying the timestamp.
        let Some((bytes, _)) = self.read_tiered_blocking(partition, offset, 1, local_start)? else {
            return Ok(best);
        };
        let refined = weir_storage::records::decode_records(&bytes)
            .ok()
            .and_then(|records| records.into_iter().filter(|r| r.timestamp == timestamp).map(|r| r.offset).max());
        Ok(Some((timestamp, refined.unwrap_or(offset))))
    }

    /// A follower asked its leader for offsets only the object store holds (a new replica, or
    /// one that fell behind local retention): it lists the store, then empties its log and
    /// starts it where the store ends (the leader holds that offset locally: local retention
    /// deletes only below it), with the log starting at the leader's log start. What the store
    /// holds is read from there, by this broker too once it leads. Blocking.
    pub(crate) fn restart_follower_from_store(
        &self,
        partition: &Partition,
        from: (i32, i32),
        leader_log_start: i64,
    ) -> Result<(), BrokerError> {
        let Some(tier) = &self.tier else {
            return Err(BrokerError::new(
                ErrorKind::InvalidConfig,
                "the leader's log starts in the object store, and this broker has no tiered storage: set \
                 remote.log.storage.system.enable=true (and the same object.store.* settings) on every broker",
            ));
        };
        let remote = tier.partition(&partition.topic, partition.topic_id, partition.index);
        let store_error =
            |e: weir_tier::TierError| BrokerError::new(ErrorKind::Storage, format!("listing the object store: {e}"));
        crate::runtime::block_on(remote.refresh(&partition.log))?.map_err(store_error)?;
        let segments = crate::runtime::block_on(remote.remote_segments())?.map_err(store_error)?;
        let (Some(first), Some(last)) = (segments.first(), segments.last()) else {
            return Err(BrokerError::new(ErrorKind::Storage, "the object store holds nothing of this partition yet"));
        };
        let (store_start, store_end) = (first.base_offset, last.next_offset);
        let log = &partition.log;
        if store_end <= log.log_end_offset() {
            // The leader's local start is past this log's end, but the store's listing is
            // behind it: the next fetch asks again.
            return Err(BrokerError::new(ErrorKind::Storage, "the object store's listing is behind the leader's"));
        }
        partition.write_as_follower(from.0, from.1, || {
            tracing::info!(topic = %partition.topic, partition = partition.index, log_start = leader_log_start, local_start = store_end,
                "the leader's older offsets are in the object store: starting this replica where the store ends");
            log.truncate_fully_and_start_tiered_at(leader_log_start.max(store_start), store_end)?;
            log.set_remote_range(Some((store_start, store_end)));
            Ok(())
        })
    }

    /// The cache reads from the store go through, when tiering is on.
    pub fn tier_cache(&self) -> Option<&weir_tier::ChunkCache> {
        self.tier.as_deref().map(Tier::cache)
    }

    /// Every tiered partition's figures summed, for `/metrics`; `None` when tiering is off.
    pub fn tier_totals(&self) -> Option<TierStatus> {
        self.tier.as_ref().map(|tier| tier.totals())
    }

    /// Refuses a new topic that asks for tiering on a broker without it, as Kafka does.
    pub(crate) fn check_tiering_of_new(&self, topic: &NewTopic) -> Result<(), BrokerError> {
        if is_true(topic.configs.get(REMOTE_STORAGE_ENABLE)) && self.tier.is_none() {
            return Err(tiering_off());
        }
        if is_memory(topic.configs.get(STORAGE_MODE)) {
            // The object store makes a memory-first partition durable, not replicas.
            let factor = match topic.replication_factor {
                -1 if topic.assignments.is_empty() => self.config.default_replication_factor,
                -1 => topic.assignments.iter().map(|(_, r)| r.len() as i16).max().unwrap_or(1),
                n => n,
            };
            if factor != 1 {
                return Err(BrokerError::new(
                    ErrorKind::InvalidReplicationFactor,
                    format!(
                        "a memory-first topic (storage.mode=memory) has one replica: the object store makes it durable \
                         (asked for {factor})"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Refuses an edit that turns tiering on without a store, or off once on (what the store
    /// holds would be left behind: Kafka too refuses it unless told to delete it).
    pub(crate) fn check_tiering_edit(
        &self,
        current: &BTreeMap<String, String>,
        edit: &ConfigEdit,
    ) -> Result<(), BrokerError> {
        let was = is_true(current.get(REMOTE_STORAGE_ENABLE));
        let Ok(after) = edit.apply(&self.config.topic_defaults, current) else {
            return Ok(()); // the controller names what is wrong with the edit
        };
        let will = is_true(after.get(REMOTE_STORAGE_ENABLE));
        if will && !was && self.tier.is_none() {
            return Err(tiering_off());
        }
        if is_memory(current.get(STORAGE_MODE)) != is_memory(after.get(STORAGE_MODE)) {
            return Err(BrokerError::new(
                ErrorKind::InvalidConfig,
                "storage.mode cannot change once a topic exists: create a new topic and copy the records",
            ));
        }
        if was && !will {
            return Err(BrokerError::new(
                ErrorKind::InvalidConfig,
                "remote.storage.enable cannot be turned off once on: the object store holds the topic's older \
                 segments (delete the topic to remove them)",
            ));
        }
        Ok(())
    }
}

/// The topic config that makes a topic memory-first (`crate::memory`).
pub const STORAGE_MODE: &str = "storage.mode";

fn is_memory(value: Option<&String>) -> bool {
    value.is_some_and(|v| v.trim() == "memory")
}

fn is_true(value: Option<&String>) -> bool {
    value.is_some_and(|v| v.trim() == "true")
}

fn tiering_off() -> BrokerError {
    BrokerError::new(
        ErrorKind::InvalidConfig,
        "remote.storage.enable=true needs tiered storage on the brokers: set remote.log.storage.system.enable=true \
         (and object.store.url for a store other than <log.dirs>/objects)",
    )
}
