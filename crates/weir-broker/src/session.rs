//! Sessions of the native write protocol (Swift's): a writer and a partition agree on the
//! partition's (V, S) and the writer learns C as it moves.
//!
//! - **V, the partition version**, names the topic the partition belongs to: it changes when the
//!   topic is deleted and created again under the same name.
//! - **S, the load stamp**, is the time (ms) this broker took the partition over: at start-up
//!   (the log reopened, and for a memory-first topic brought back to what the object store has)
//!   and each time it becomes leader. What a broker held only in memory and lost is gone with
//!   the S it had.
//! - **C, the checkpoint**, is the partition's high watermark: every record below it is in the
//!   object store (memory-first topics, see `crate::memory`), or on the in-sync replicas. It
//!   only moves forward while S stays the same.
//!
//! A native write is answered as soon as it is in the log, without waiting for C to pass it;
//! the writer keeps its records until C does. A write naming another (V, S) than the
//! partition's is refused with the current triple and the writer's own progress in the log
//! ([`ProducerProgress`]: the last sequence number of its idempotent producer id the log holds,
//! at which offset): the writer resends exactly the records after that sequence. Records are
//! Kafka batches of an idempotent producer, so a batch resent on the same session is answered
//! with its first offsets and never stored twice.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::sync::Notify;
use weir_storage::{AppendInfo, ProducerProgress};

use crate::broker::{Acks, Broker};
use crate::error::{BrokerError, ErrorKind};
use crate::partition::Partition;

/// A partition's (V, S, C), and its log end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionStamp {
    /// V: the partition's version.
    pub version: i64,
    /// S: when this broker took the partition over (ms since the epoch).
    pub load_stamp: i64,
    /// C: every offset below it is persisted.
    pub checkpoint: i64,
    pub log_end_offset: i64,
}

/// What a native write asks.
#[derive(Debug)]
pub struct SessionWrite {
    /// The (V, S) the writer holds; `None` opens a session (nothing to refuse).
    pub session: Option<(i64, i64)>,
    /// The writer's idempotent producer id, whose progress the answer reports.
    pub producer_id: i64,
    /// One batch of the producer's records; `None` asks for the triple only.
    pub records: Option<BytesMut>,
    /// With no records: wait at most this long for C to pass `checkpoint_after`.
    pub wait: Option<(i64, Duration)>,
}

/// The answer to a native write: the append's outcome and where the session stands after it.
#[derive(Debug)]
pub struct SessionWriteOutcome {
    /// The append (`Ok(None)` when nothing was sent, or the session was stale).
    pub result: Result<Option<AppendInfo>, BrokerError>,
    pub stamp: SessionStamp,
    /// The producer's last batch in the log.
    pub writer: Option<ProducerProgress>,
}

impl Partition {
    /// The partition's (V, S, C) now.
    pub fn session_stamp(&self) -> SessionStamp {
        SessionStamp {
            version: partition_version(self.topic_id),
            load_stamp: self.load_stamp.load(Ordering::Acquire),
            checkpoint: self.log.high_watermark(),
            log_end_offset: self.log.log_end_offset(),
        }
    }

    /// This broker takes the partition over now: a new S, later than any before it (the wall
    /// clock may repeat a millisecond, or step back).
    pub(crate) fn mark_loaded(&self, now_ms: i64) {
        let _ = self.load_stamp.fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| Some(now_ms.max(old + 1)));
    }

    /// Waits until the high watermark passes `offset`, at most until `deadline`; returns
    /// whether it did.
    async fn wait_checkpoint_past(&self, offset: i64, deadline: tokio::time::Instant) -> bool {
        loop {
            let waiter = Arc::new(Notify::new());
            self.register_waiter(&waiter);
            if self.log.high_watermark() > offset {
                return true;
            }
            if self.closing.load(Ordering::Acquire)
                || tokio::time::timeout_at(deadline, waiter.notified()).await.is_err()
            {
                return false;
            }
        }
    }
}

/// V of a topic's partitions: from the topic id, which a topic created again under the same
/// name does not share. Never negative (-1 stands for "none" on the wire).
fn partition_version(topic_id: uuid::Uuid) -> i64 {
    let (high, low) = topic_id.as_u64_pair();
    ((high ^ low) & i64::MAX as u64) as i64
}

/// The longest a native write waits for its checkpoint.
pub const MAX_CHECKPOINT_WAIT: Duration = Duration::from_secs(30);

impl Broker {
    /// A native write (see the module doc): refuses a stale session, appends the batch without
    /// waiting for it to be persisted, or waits for the checkpoint when there is nothing to
    /// append.
    pub async fn session_write(&self, partition: Arc<Partition>, request: SessionWrite) -> SessionWriteOutcome {
        let answer = |result| SessionWriteOutcome {
            result,
            stamp: partition.session_stamp(),
            writer: partition.log.producer_progress(request.producer_id),
        };
        if let Err(e) = partition.check_local_leader() {
            return answer(Err(e));
        }
        let current = partition.session_stamp();
        if let Some((version, load_stamp)) = request.session {
            if (version, load_stamp) != (current.version, current.load_stamp) {
                return answer(Err(BrokerError::new(
                    ErrorKind::FencedLeaderEpoch,
                    format!(
                        "{}-{}: the session (version {version}, load stamp {load_stamp}) is stale: the partition is at \
                         (version {}, load stamp {}); resend what is after the writer's last sequence",
                        partition.topic, partition.index, current.version, current.load_stamp
                    ),
                )));
            }
        }
        let Some(records) = request.records else {
            if let Some((after, wait)) = request.wait {
                let deadline = tokio::time::Instant::now() + wait.min(MAX_CHECKPOINT_WAIT);
                partition.wait_checkpoint_past(after, deadline).await;
            }
            return answer(Ok(None));
        };
        let mut results = self
            .write_many(vec![(partition.clone(), records)], Acks::Leader)
            .await
            .without_persistence_wait()
            .durable()
            .await;
        let result = results.pop().unwrap_or_else(|| Err(BrokerError::internal("append lost its result")));
        answer(result.map(Some))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_versions_are_never_negative_and_differ_by_topic() {
        let a = partition_version(uuid::Uuid::from_u128(u128::MAX));
        let b = partition_version(uuid::Uuid::from_u128(7));
        assert!(a >= 0 && b >= 0);
        assert_ne!(a, b);
    }
}
