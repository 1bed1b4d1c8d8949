//! Memory-first topics (`storage.mode=memory`): Swift's write path on Weir's log, with the
//! object store as the shared file system.
//!
//! A write to a memory-first partition goes into the partition's log without an fsync (the
//! page cache is the memory it lives in) and counts once the object store has it:
//! - **The pool.** Bytes written and not yet in the store are counted over all memory-first
//!   partitions against `memory.pool.bytes`; a produce that would go past it waits for room
//!   (producers slow down when the store does, nothing is dropped). A cold partition holds
//!   nothing in it.
//! - **The writer.** One task per broker takes, every `memory.flush.ms` (sooner once
//!   `memory.flush.bytes` wait), the new batches of every memory-first partition it leads and
//!   puts them in the store as one write-ahead object (`weir_tier::wal`), in one PUT. Then each
//!   partition's high watermark moves to what the object holds: the produces waiting on it are
//!   answered, and consumers see the records. A PUT that fails is tried again at the next round;
//!   the writes wait.
//! - **Older data** is the tier's: memory-first topics are tiered (`remote.storage.enable`), so
//!   closed segments are uploaded as for any tiered topic. A write-ahead object is deleted once
//!   the uploaded segments hold all it holds; one older than `memory.wal.max.age.ms` has its
//!   partitions' active segments rolled, so that the tier uploads them.
//! - **Recovery.** At start-up each memory-first partition is brought to what the store holds
//!   ([`Broker::recover_memory_partitions`]): a local tail the store never took (never
//!   acknowledged) is cut; what the store has and the local log lost (no fsync, or a lost disk)
//!   is written back from the write-ahead objects; offsets older than those are the tier's.
//!
//! Memory-first partitions have one replica: the store makes them durable, not the ISR.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;
use uuid::Uuid;
use weir_storage::sync::lock;
use weir_tier::{Wal, WalObject, WalRange, WalWrite};

use crate::broker::Broker;
use crate::config::MemorySettings;
use crate::error::{BrokerError, ErrorKind};
use crate::partition::Partition;

/// A pause after a round whose PUT failed.
const RETRY_BACKOFF: Duration = Duration::from_millis(200);

/// A partition, as the pool counts it.
type PartitionKey = (Uuid, i32);

/// The pool and the writer's state (see the module doc).
pub struct MemoryWriter {
    settings: MemorySettings,
    /// Bytes reserved or written and not in the store yet. Signed: the writer may take a write
    /// into the store before its producer's bookkeeping ([`MemoryWriter::written`]) ran, and
    /// the broker's own records (transaction markers) are taken without a reservation.
    pending: Mutex<i64>,
    /// Woken when the pool has room again.
    room: Notify,
    /// Woken when `memory.flush.bytes` wait.
    kick: Notify,
    sequence: AtomicU64,
    /// The write-ahead objects this broker wrote and has not deleted yet, oldest first.
    live: Mutex<Vec<WalObject>>,
    /// Whether `live` holds the objects written before this start too (listed once the store
    /// answers; until then none of them is collected).
    live_listed: std::sync::atomic::AtomicBool,
    pub flushes: AtomicU64,
    pub flushed_bytes: AtomicU64,
    pub failures: AtomicU64,
}

impl MemoryWriter {
    pub(crate) fn new(settings: MemorySettings) -> MemoryWriter {
        MemoryWriter {
            settings,
            pending: Mutex::new(0),
            room: Notify::new(),
            kick: Notify::new(),
            sequence: AtomicU64::new(0),
            live: Mutex::new(Vec::new()),
            live_listed: std::sync::atomic::AtomicBool::new(false),
            flushes: AtomicU64::new(0),
            flushed_bytes: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    /// Bytes written to memory-first partitions and not in the store yet.
    pub fn pending_bytes(&self) -> u64 {
        u64::try_from(*lock(&self.pending)).unwrap_or(0)
    }

    /// Write-ahead objects in the store.
    pub fn live_objects(&self) -> usize {
        lock(&self.live).len()
    }

    /// Takes `bytes` of the pool for a produce, waiting while it is full (a produce larger
    /// than the whole pool goes when the pool is empty). Returns false at `deadline`.
    pub(crate) async fn reserve(&self, bytes: u64, deadline: tokio::time::Instant) -> bool {
        loop {
            let waiter = self.room.notified();
            {
                let mut pending = lock(&self.pending);
                let held = u64::try_from(*pending).unwrap_or(0);
                if held == 0 || held + bytes <= self.settings.pool_bytes {
                    *pending += i64::try_from(bytes).unwrap_or(i64::MAX);
                    if held + bytes >= self.settings.flush_bytes {
                        self.kick.notify_one();
                    }
                    return true;
                }
            }
            self.kick.notify_one();
            if tokio::time::timeout_at(deadline, waiter).await.is_err() {
                return false;
            }
        }
    }

    /// A reserved write is done: `written` bytes of it went into a log (0: it failed; more or
    /// less than reserved when the topic recompresses).
    pub(crate) fn written(&self, reserved: u64, written: u64) {
        *lock(&self.pending) += written as i64 - reserved as i64;
        if written < reserved {
            self.room.notify_waiters();
        }
    }

    /// A reservation that wrote nothing (its task failed).
    pub(crate) fn release(&self, reserved: u64) {
        self.written(reserved, 0);
    }

    /// `bytes` are in the store now.
    fn persisted(&self, bytes: u64) {
        *lock(&self.pending) -= bytes as i64;
        self.room.notify_waiters();
    }
}

impl Broker {
    /// Starts the writer of memory-first topics when tiered storage is on (they need it).
    pub(crate) fn run_memory_writer(self: &Arc<Self>) {
        if self.tier.is_none() {
            return;
        }
        let broker = Arc::downgrade(self);
        let mut shutdown = self.shutdown_signal();
        tokio::spawn(async move {
            loop {
                let Some(this) = broker.upgrade() else { return };
                let flush = Duration::from_millis(this.config.memory.flush_ms.max(1));
                let kicked = this.memory.kick.notified();
                let stopping = tokio::select! {
                    _ = tokio::time::sleep(flush) => false,
                    _ = kicked => false,
                    _ = shutdown.wait_for(|down| *down) => true,
                };
                if stopping {
                    // What is written goes to the store before the broker stops.
                    let _ = this.flush_memory_partitions().await;
                    return;
                }
                this.load_taken_over_memory_partitions();
                match this.flush_memory_partitions().await {
                    Ok(_) => {}
                    Err(e) => {
                        this.memory.failures.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(error = %e, "the writer of memory-first topics cannot write to the object store; retrying");
                        tokio::time::sleep(RETRY_BACKOFF).await;
                    }
                }
                if let Err(e) = this.collect_memory_objects().await {
                    tracing::debug!(error = %e, "cannot delete write-ahead objects now");
                }
            }
        });
    }

    /// One round of the writer: the new batches of every memory-first partition this broker
    /// leads, in one object; returns the bytes written.
    async fn flush_memory_partitions(&self) -> Result<u64, BrokerError> {
        let Some(tier) = self.tier.clone() else { return Ok(0) };
        let budget = self.config.memory.flush_bytes.max(1).saturating_mul(2);
        let mut partitions: Vec<Arc<Partition>> = self
            .partitions()
            .into_iter()
            .filter(|p| {
                let state = p.state();
                p.log.is_memory_first()
                    && state.leader == self.config.node_id
                    && p.memory_loaded(state.leader_epoch)
                    && p.log.log_end_offset() > p.unpersisted_from()
            })
            .collect();
        if partitions.is_empty() {
            return Ok(0);
        }
        // A round takes at most twice `memory.flush.bytes`: start each at another partition,
        // so that none waits behind busier ones round after round.
        let turn = self.memory.sequence.load(Ordering::Relaxed) as usize % partitions.len();
        partitions.rotate_left(turn);
        let reads = {
            let partitions = partitions.clone();
            tokio::task::spawn_blocking(move || -> Result<Vec<(Arc<Partition>, WalWrite)>, BrokerError> {
                let mut writes = Vec::new();
                let mut total = 0u64;
                for partition in partitions {
                    if total >= budget {
                        break;
                    }
                    let log = &partition.log;
                    let (from, end) = (partition.unpersisted_from(), log.log_end_offset());
                    let (chunks, next_offset) = match partition.kept_unpersisted(from, end, budget - total) {
                        Some(kept) => kept,
                        // Not all kept (the broker's own batches, a transaction marker, or a
                        // write from before a restart): read back from the log.
                        None => {
                            let read = log.read_with(from, budget - total, end, true)?;
                            let Some(slice) = read.slice else { continue };
                            (vec![Bytes::from(slice.read_to_vec()?)], slice.next_offset)
                        }
                    };
                    let range = WalRange {
                        topic: partition.topic.clone(),
                        topic_id: partition.topic_id,
                        partition: partition.index,
                        base_offset: from,
                        next_offset,
                        leader_epoch: partition.state().leader_epoch,
                    };
                    let write = WalWrite { range, chunks };
                    total += write.len();
                    writes.push((partition, write));
                }
                Ok(writes)
            })
            .await
            .map_err(|e| BrokerError::internal(format!("the memory writer's read failed: {e}")))??
        };
        if reads.is_empty() {
            return Ok(0);
        }
        let (partitions, writes): (Vec<_>, Vec<_>) = reads.into_iter().unzip();
        let sequence = self.memory.sequence.fetch_add(1, Ordering::Relaxed);
        let object = Wal::new(tier.store())
            .write(self.config.node_id, self.now_ms(), sequence, writes)
            .await
            .map_err(|e| BrokerError::new(ErrorKind::Storage, format!("writing a write-ahead object: {e}")))?;
        let mut bytes = 0u64;
        // A broker fenced meanwhile, or a partition led elsewhere now, acknowledges nothing
        // of this object: the new leader may have loaded the partition before the PUT, and
        // never reads what came after (see `deposed`).
        let may_lead = self.cluster.lifecycle.check_may_lead(self.config.node_id).is_ok();
        for (partition, entry) in partitions.iter().zip(&object.header.entries) {
            bytes += entry.length;
            let state = partition.state();
            let still_leads = state.leader == self.config.node_id && state.leader_epoch == entry.range.leader_epoch;
            if may_lead && still_leads {
                partition.persisted_to(entry.range.next_offset, state.replicas.len());
            }
            partition.wake_waiters();
            self.memory.persisted(entry.length);
        }
        self.memory.flushes.fetch_add(1, Ordering::Relaxed);
        self.memory.flushed_bytes.fetch_add(bytes, Ordering::Relaxed);
        lock(&self.memory.live).push(object);
        if self.memory.pending_bytes() >= self.config.memory.flush_bytes {
            self.memory.kick.notify_one();
        }
        Ok(bytes)
    }

    /// Deletes the write-ahead objects whose entries the tier holds (or whose partitions are
    /// gone), and rolls the active segments of partitions an object too old still waits on.
    async fn collect_memory_objects(&self) -> Result<(), BrokerError> {
        let Some(tier) = self.tier.clone() else { return Ok(()) };
        if !self.memory.live_listed.load(Ordering::Acquire) {
            // The store did not answer at start-up: the objects of the last run are listed now.
            let listed = Wal::new(tier.store())
                .list()
                .await
                .map_err(|e| BrokerError::new(ErrorKind::Storage, format!("listing write-ahead objects: {e}")))?;
            self.memory.sequence.fetch_max(listed.len() as u64, Ordering::Relaxed);
            self.adopt_own_objects(listed);
        }
        let objects: Vec<WalObject> = lock(&self.memory.live).clone();
        if objects.is_empty() {
            return Ok(());
        }
        let partitions: HashMap<PartitionKey, Arc<Partition>> =
            self.partitions().into_iter().map(|p| ((p.topic_id, p.index), p)).collect();
        let metadata = self.metadata();
        let now = self.now_ms();
        let max_age = i64::try_from(self.config.memory.wal_max_age_ms).unwrap_or(i64::MAX);
        let mut done = Vec::new();
        for object in &objects {
            let mut covered = true;
            for entry in &object.header.entries {
                let Some(partition) = partitions.get(&(entry.range.topic_id, entry.range.partition)) else {
                    // A deleted topic's entries are done with; a partition hosted elsewhere
                    // (moved) keeps the object until its broker has it in the tier.
                    covered &= metadata.topic_by_id(entry.range.topic_id).is_none();
                    continue;
                };
                let remote_end = partition.log.remote_end_offset();
                if remote_end >= entry.range.next_offset {
                    continue;
                }
                covered = false;
                let active_base = partition.log.segment_base_offsets().last().copied().unwrap_or(0);
                if now - object.header.written_at_ms > max_age && active_base < entry.range.next_offset {
                    // Its segment must close for the tier to upload it (once: the next active
                    // segment starts past the entry).
                    let log = Arc::clone(&partition.log);
                    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || log.roll_now()).await {
                        tracing::warn!(topic = %partition.topic, partition = partition.index, error = %e, "cannot roll a memory-first partition's segment");
                    }
                }
            }
            if covered {
                done.push(object.key.clone());
            }
        }
        let wal = Wal::new(tier.store());
        for object in objects.iter().filter(|o| done.contains(&o.key)) {
            wal.delete(object)
                .await
                .map_err(|e| BrokerError::new(ErrorKind::Storage, format!("deleting a write-ahead object: {e}")))?;
        }
        lock(&self.memory.live).retain(|o| !done.contains(&o.key));
        Ok(())
    }

    /// Brings every memory-first partition hosted here to what the object store holds (see
    /// [`Broker::recover_memory_partition_list`]). Blocking; at start-up, before clients are
    /// served.
    ///
    /// A store that cannot be read does not stop the broker: its memory-first partitions serve
    /// nothing (LEADER_NOT_AVAILABLE) until the memory writer, trying again every round, has
    /// loaded them; every other topic is served meanwhile.
    pub(crate) fn recover_memory_partitions(&self) {
        let partitions: Vec<Arc<Partition>> = self
            .partitions()
            .into_iter()
            .filter(|p| p.log.is_memory_first() && p.state().replicas.contains(&self.config.node_id))
            .collect();
        for partition in &partitions {
            // Whatever its leader epoch, it is loaded only by what follows.
            partition.set_memory_loaded(-1);
        }
        if let Err(e) = self.recover_memory_partition_list(&partitions, true) {
            tracing::error!(error = %e, partitions = partitions.len(),
                "cannot load the memory-first partitions from the object store at start-up: they serve nothing until it answers");
        }
    }

    /// This broker collects the objects it wrote (listed: `objects`); another broker's are its
    /// own to collect.
    fn adopt_own_objects(&self, objects: Vec<WalObject>) {
        *lock(&self.memory.live) = objects.into_iter().filter(|o| o.header.node == self.config.node_id).collect();
        self.memory.live_listed.store(true, Ordering::Release);
    }

    /// Loads the memory-first partitions this broker leads at an epoch it has not loaded
    /// them at: moved here from a broker that died, or led here again after a fence. Until
    /// then they serve nothing (`Partition::check_local_leader`).
    fn load_taken_over_memory_partitions(&self) {
        let node = self.config.node_id;
        let waiting: Vec<Arc<Partition>> = self
            .partitions()
            .into_iter()
            .filter(|p| {
                let state = p.state();
                p.log.is_memory_first() && state.leader == node && !p.memory_loaded(state.leader_epoch)
            })
            .collect();
        if waiting.is_empty() {
            return;
        }
        if let Err(e) = self.recover_memory_partition_list(&waiting, false) {
            tracing::warn!(error = %e, "cannot load memory-first partitions taken over from the object store; retrying");
        }
    }

    /// Brings `partitions` to what the object store holds (see the module doc): cuts a local
    /// tail the store never took, writes back from the write-ahead objects what the local log
    /// lacks, and puts the high watermark at the end of what the store holds. Each is then
    /// marked loaded at the leader epoch it had when its loading began. Blocking.
    ///
    /// Write-ahead entries of an older leader epoch that begin at or after the first entry of a
    /// newer one are a deposed leader's, written after the new leader loaded: never
    /// acknowledged, and not part of the log.
    fn recover_memory_partition_list(&self, partitions: &[Arc<Partition>], at_start: bool) -> Result<(), BrokerError> {
        let Some(tier) = self.tier.clone() else { return Ok(()) };
        if partitions.is_empty() {
            return Ok(());
        }
        let store_error = |what: &str, e: weir_tier::TierError| {
            BrokerError::new(ErrorKind::Storage, format!("recovering memory-first topics, {what}: {e}"))
        };
        let objects =
            crate::runtime::block_on(Wal::new(tier.store()).list())?.map_err(|e| store_error("listing", e))?;
        if at_start {
            self.memory.sequence.fetch_max(objects.len() as u64, Ordering::Relaxed);
        }
        let mut by_partition: HashMap<PartitionKey, Vec<(usize, usize)>> = HashMap::new();
        for (o, object) in objects.iter().enumerate() {
            for (e, entry) in object.header.entries.iter().enumerate() {
                by_partition.entry((entry.range.topic_id, entry.range.partition)).or_default().push((o, e));
            }
        }
        for partition in partitions {
            let epoch = partition.state().leader_epoch;
            partition.forget_unpersisted();
            let remote = tier.partition(&partition.topic, partition.topic_id, partition.index);
            crate::runtime::block_on(remote.refresh(&partition.log))?
                .map_err(|e| store_error("listing the tier", e))?;
            let remote_end = partition.log.remote_end_offset();
            let log = &partition.log;
            let found = by_partition.remove(&(partition.topic_id, partition.index)).unwrap_or_default();
            let ranges: Vec<&WalRange> = found.iter().map(|(o, e)| &objects[*o].header.entries[*e].range).collect();
            let entries: BTreeMap<i64, (usize, usize)> = found
                .iter()
                .zip(&ranges)
                .filter(|(_, range)| !deposed(range, &ranges))
                .map(|(at, range)| (range.base_offset, *at))
                .collect();
            let store_end = entries
                .values()
                .map(|(o, e)| objects[*o].header.entries[*e].range.next_offset)
                .max()
                .unwrap_or(-1)
                .max(remote_end)
                .max(0);
            let local_end = log.log_end_offset();
            if local_end > store_end {
                tracing::info!(topic = %partition.topic, partition = partition.index, local_end, store_end,
                    "a memory-first partition's tail never reached the object store (never acknowledged): cutting it");
                log.truncate_to(store_end)?;
            }
            if log.log_end_offset() < remote_end {
                // Lost below what the tier holds (a lost disk, or a partition new here): the
                // local part starts anew.
                log.truncate_fully_and_start_tiered_at(log.log_start_offset().min(remote_end), remote_end)?;
                log.set_remote_range(partition_remote_range(&tier, partition));
            }
            for (o, e) in entries.values() {
                let entry = &objects[*o].header.entries[*e];
                let at = log.log_end_offset();
                if entry.range.next_offset <= at {
                    continue;
                }
                let bytes = crate::runtime::block_on(Wal::new(tier.store()).read(&objects[*o], entry))?
                    .map_err(|e| store_error("reading a write-ahead object", e))?;
                let mut tail = Vec::with_capacity(bytes.len());
                for (position, header) in weir_storage::batch::headers(&bytes) {
                    let size = header.size_bytes().unwrap_or(0);
                    if header.base_offset >= at {
                        tail.extend_from_slice(&bytes[position..position + size]);
                    }
                }
                if !tail.is_empty() {
                    log.append_replicated(&tail)?;
                }
            }
            let end = log.log_end_offset();
            partition.memory_persisted_end.store(end, Ordering::Release);
            if end > log.high_watermark() {
                log.set_high_watermark(end);
            }
            if partition.state().leader == self.config.node_id {
                // Its leader epoch begins where the loaded log ends.
                if let Err(e) = log.assign_leader_epoch(epoch) {
                    tracing::warn!(topic = %partition.topic, partition = partition.index, error = %e, "cannot record the leader epoch");
                }
            }
            partition.set_memory_loaded(epoch);
            partition.wake_waiters();
            tracing::info!(topic = %partition.topic, partition = partition.index, log_end = end, remote_end, leader_epoch = epoch,
                "loaded a memory-first partition from the object store");
        }
        if at_start {
            self.adopt_own_objects(objects);
        }
        Ok(())
    }
}

impl Partition {
    /// Where the part of this memory-first partition the object store lacks begins (past the
    /// high watermark while a reassignment's new replicas catch up).
    fn unpersisted_from(&self) -> i64 {
        self.log.high_watermark().max(self.memory_persisted_end.load(Ordering::Acquire))
    }

    /// Keeps the bytes of a produce written at `[first, next)` for the memory writer.
    pub(crate) fn keep_unpersisted(&self, first: i64, next: i64, bytes: Bytes) {
        lock(&self.memory_tail).insert(first, (next, bytes));
    }

    /// The kept batches from `from`, contiguous, up to `end` and about `budget` bytes (at least
    /// one), with the offset after them; `None` when the batch at `from` was not kept.
    fn kept_unpersisted(&self, from: i64, end: i64, budget: u64) -> Option<(Vec<Bytes>, i64)> {
        let tail = lock(&self.memory_tail);
        let mut chunks = Vec::new();
        let (mut at, mut bytes) = (from, 0u64);
        for (first, (next, chunk)) in tail.range(from..) {
            if *first != at || *next > end || (!chunks.is_empty() && bytes + chunk.len() as u64 > budget) {
                break;
            }
            bytes += chunk.len() as u64;
            chunks.push(chunk.clone());
            at = *next;
        }
        (!chunks.is_empty()).then_some((chunks, at))
    }

    /// Forgets the kept batches (the log was cut, or is loaded anew).
    fn forget_unpersisted(&self) {
        lock(&self.memory_tail).clear();
    }

    /// The object store holds this memory-first partition up to `end`: its high watermark
    /// moves there, or, while a reassignment adds replicas, as far as the in-sync ones have
    /// it too.
    fn persisted_to(&self, end: i64, replicas: usize) {
        if end > self.log.log_end_offset() {
            return;
        }
        self.memory_persisted_end.fetch_max(end, Ordering::AcqRel);
        lock(&self.memory_tail).retain(|_, (next, _)| *next > end);
        if replicas > 1 {
            self.maybe_advance_high_watermark();
        } else if end > self.log.high_watermark() {
            self.log.set_high_watermark(end);
        }
    }
}

/// Whether a write-ahead entry is a deposed leader's: a newer leader epoch's entries begin at
/// or before it (see [`Broker::recover_memory_partition_list`]).
fn deposed(range: &WalRange, all: &[&WalRange]) -> bool {
    all.iter().any(|other| other.leader_epoch > range.leader_epoch && other.base_offset <= range.base_offset)
}

fn partition_remote_range(tier: &crate::tier::Tier, partition: &Partition) -> Option<(i64, i64)> {
    let status = tier.existing(partition.topic_id, partition.index)?.status();
    status.remote_start_offset.zip(status.remote_end_offset)
}
