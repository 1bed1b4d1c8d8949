//! A partition as the broker sees it: its log, and the long-poll fetches waiting for it to grow.

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
    /// Bytes and records in and out, counted by the produce and fetch paths.
    pub metrics: PartitionMetrics,
    /// Fetches parked until new data is visible. Each holds its own `Notify`; an append wakes
    /// all of them (a fetch over many partitions registers the same `Notify` in each).
    waiters: Mutex<Vec<Weak<Notify>>>,
}

impl Partition {
    pub fn new(topic: String, topic_id: Uuid, index: i32, log: Arc<Log>) -> Partition {
        Partition { topic, topic_id, index, log, metrics: PartitionMetrics::default(), waiters: Mutex::new(Vec::new()) }
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
