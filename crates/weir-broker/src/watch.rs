//! Watching a set of partitions for change: how a long-lived reader (a Kafka fetch session,
//! KIP-227) learns which of its partitions changed without looking at each one.
//!
//! A [`PartitionWatch`] is a set of slots, one per watched partition (the slot numbers are the
//! reader's). A partition marks the slot of each watch on it whenever it wakes its long-poll
//! waiters: an append (the log end moves, which a follower reads up to), a high watermark or
//! last stable offset move, a log start moved by DeleteRecords, a leadership or ISR change, a
//! deletion. The reader drains the marked slots, reads those partitions only, and parks on the
//! watch's `Notify` when none is marked: an idle session costs O(1) per fetch, not O(partitions),
//! and its wait is one `Notify`, not a waiter registered on every partition.
//!
//! Wake-ups are never lost: a mark that lands after a drain keeps a `Notify` permit, so a
//! reader that drains, reads, and then waits sees it at once.
//!
//! Not seen: a log start moved by the retention sweep (`weir-storage` moves it without the
//! partition knowing); it is reported with the partition's next change.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;
use weir_storage::sync::lock;

/// The slots of a watch that changed since the reader last drained them.
#[derive(Debug, Default)]
struct Marked {
    /// Marked slots, each once, in the order they were marked.
    slots: Vec<u32>,
    /// `is_marked[slot]`: whether `slot` is in `slots` (grown on demand).
    is_marked: Vec<bool>,
}

/// A set of watched partitions, by slot. See the module doc.
#[derive(Debug, Default)]
pub struct PartitionWatch {
    marked: Mutex<Marked>,
    changed: Notify,
}

impl PartitionWatch {
    pub fn new() -> Arc<PartitionWatch> {
        Arc::new(PartitionWatch::default())
    }

    /// Marks `slot` changed and wakes the reader (a no-op for an already marked slot but the
    /// wake-up).
    pub fn mark(&self, slot: u32) {
        {
            let mut marked = lock(&self.marked);
            let index = slot as usize;
            if marked.is_marked.len() <= index {
                marked.is_marked.resize(index + 1, false);
            }
            if !marked.is_marked[index] {
                marked.is_marked[index] = true;
                marked.slots.push(slot);
            }
        }
        self.changed.notify_one();
    }

    /// Takes the marked slots, in the order they were marked.
    pub fn drain(&self) -> Vec<u32> {
        let mut marked = lock(&self.marked);
        let slots = std::mem::take(&mut marked.slots);
        for slot in &slots {
            marked.is_marked[*slot as usize] = false;
        }
        slots
    }

    /// Waits until a slot is marked after the last `drain` (at once if one already was).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

/// When each follower last fetched through a fetch session, as the leader saw it.
///
/// A session's fetch reads only the partitions that changed; for the others the follower's
/// position is the one the leader recorded when it last read them, and the leader's log end
/// has not moved since (a move would have marked them). Each session fetch is thus a fetch at
/// an unchanged position for every partition it did not read: the ISR bookkeeping
/// (`replica.lag.time.max.ms`) counts it as one, as Kafka, which reads every partition of the
/// session each time, does. A caught-up follower of an idle partition stays in the ISR as long
/// as its session keeps fetching.
#[derive(Debug, Default)]
pub struct FollowerHeartbeats {
    last: Mutex<HashMap<i32, Instant>>,
}

impl FollowerHeartbeats {
    /// Follower `replica` fetched through its session at `at`.
    pub fn beat(&self, replica: i32, at: Instant) {
        let mut last = lock(&self.last);
        let entry = last.entry(replica).or_insert(at);
        *entry = (*entry).max(at);
    }

    /// The last session fetch of `replica`, if any.
    pub fn last(&self, replica: i32) -> Option<Instant> {
        lock(&self.last).get(&replica).copied()
    }
}

impl crate::Broker {
    /// Parks until a slot of `watch` is marked, `deadline` passes or the broker shuts down.
    pub async fn wait_for_change(&self, watch: &PartitionWatch, deadline: tokio::time::Instant) {
        let mut shutdown = self.shutdown_signal();
        if *shutdown.borrow() {
            return;
        }
        tokio::select! {
            _ = watch.changed() => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = shutdown.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn marks_are_drained_once_each_in_order() {
        let watch = PartitionWatch::new();
        watch.mark(7);
        watch.mark(2);
        watch.mark(7);
        assert_eq!(watch.drain(), vec![7, 2]);
        assert!(watch.drain().is_empty());
        watch.mark(7);
        assert_eq!(watch.drain(), vec![7], "a drained slot can be marked again");
    }

    #[tokio::test]
    async fn a_mark_between_drain_and_wait_is_not_lost() {
        let watch = PartitionWatch::new();
        assert!(watch.drain().is_empty());
        watch.mark(1);
        tokio::time::timeout(Duration::from_secs(5), watch.changed()).await.expect("the permit is kept");
        assert_eq!(watch.drain(), vec![1]);
    }
}
