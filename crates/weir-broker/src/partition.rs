//! A partition as the broker sees it: its log, and the long-poll fetches waiting for it to grow.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;
use uuid::Uuid;
use weir_storage::Log;

use crate::metrics::PartitionMetrics;

pub struct Partition {
    pub topic: String,
    pub topic_id: Uuid,
    pub index: i32,
    pub log: Arc<Log>,
    /// An internal topic's partition (`__consumer_offsets`, ...): clients may not produce to it.
    pub internal: bool,
    /// The topic's `min.insync.replicas`, kept current by the broker when configs change, so
    /// the produce path checks it without looking up the topic and parsing its configs.
    min_insync_replicas: AtomicI64,
    /// Bytes and records in and out, counted by the produce and fetch paths.
    pub metrics: PartitionMetrics,
    /// Fetches parked until new data is visible. Each holds its own `Notify`; an append wakes
    /// all of them (a fetch over many partitions registers the same `Notify` in each).
    waiters: Mutex<Vec<Weak<Notify>>>,
}

/// Partition `index` of a topic's list (see `Broker::topic_partitions`); `None` when out of range.
pub fn by_index(partitions: &[Arc<Partition>], index: i32) -> Option<&Arc<Partition>> {
    partitions.get(usize::try_from(index).ok()?)
}

impl Partition {
    pub fn new(topic: String, topic_id: Uuid, index: i32, log: Arc<Log>, internal: bool) -> Partition {
        Partition {
            topic,
            topic_id,
            index,
            log,
            internal,
            min_insync_replicas: AtomicI64::new(1),
            metrics: PartitionMetrics::default(),
            waiters: Mutex::new(Vec::new()),
        }
    }

    pub fn min_insync_replicas(&self) -> i64 {
        self.min_insync_replicas.load(Ordering::Relaxed)
    }

    pub(crate) fn set_min_insync_replicas(&self, value: i64) {
        self.min_insync_replicas.store(value, Ordering::Relaxed);
    }

    /// Registers `waiter` to be notified at the next change of the visible end (high
    /// watermark). Register first, then check for data: `Notify` keeps a permit, so a wake-up
    /// between the check and the wait is not lost.
    pub fn register_waiter(&self, waiter: &Arc<Notify>) {
        let mut waiters = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        // Fetches that timed out leave dead entries; drop them so an idle partition's list
        // stays as long as its live waiters.
        waiters.retain(|w| w.strong_count() > 0);
        waiters.push(Arc::downgrade(waiter));
    }

    /// Wakes every registered waiter; each re-registers if it still has to wait.
    pub fn wake_waiters(&self) {
        let waiters = std::mem::take(&mut *self.waiters.lock().unwrap_or_else(|p| p.into_inner()));
        for waiter in waiters {
            if let Some(waiter) = waiter.upgrade() {
                waiter.notify_one();
            }
        }
    }
}
