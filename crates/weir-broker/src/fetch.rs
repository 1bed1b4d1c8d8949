//! Fetch: reading partitions with long polling, the one read path of every front-end (Kafka's
//! Fetch, HTTP consume; RocketMQ's receive and follower replication build on it).
//!
//! A fetch reads every wanted partition once, in order, up to its isolation's bound (the high
//! watermark, or the last stable offset for `read_committed`), honouring the request's
//! `max_bytes`, each partition's `max_bytes`, and Kafka's at-least-one-batch rule: the first
//! partition that has data returns at least its first batch, whatever the limits, so a consumer
//! never starves on a large batch. When fewer than `min_bytes` are available it parks until an
//! append wakes it, `max_wait` passes or the broker shuts down; there is no polling loop.
//!
//! Wake-ups are never lost: after a read that found too little, the fetch registers its waiter
//! on every partition and then checks whether any high watermark moved since that read. An
//! append that lands before the registration is seen by the check; one after it notifies the
//! waiter (a `Notify` keeps the permit if the wait has not started yet). Fetches that find data
//! at once never touch the waiter lists.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use weir_storage::{AbortedTxn, FileSlice};

use crate::error::{BrokerError, ErrorKind};
use crate::partition::Partition;
use crate::Broker;

/// Where a fetch stops reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Up to the high watermark: everything acknowledged (Kafka's `read_uncommitted`).
    HighWatermark,
    /// Up to the last stable offset: no record of a transaction still open, and the aborted
    /// transactions of what is returned are listed (Kafka's `read_committed`).
    Committed,
}

/// One partition to read.
#[derive(Clone)]
pub struct FetchPartition {
    pub partition: Arc<Partition>,
    /// The first offset wanted.
    pub offset: i64,
    /// At most this many bytes from this partition (the at-least-one-batch rule aside).
    pub max_bytes: u64,
    /// The leader epoch the caller believes current, checked against the partition's; `None`
    /// when it does not say (old clients, HTTP).
    pub current_leader_epoch: Option<i32>,
}

/// A fetch over several partitions.
#[derive(Clone)]
pub struct FetchRequest {
    pub partitions: Vec<FetchPartition>,
    /// At most this many bytes in all (the at-least-one-batch rule aside).
    pub max_bytes: u64,
    /// Return once this many bytes are available; 0 returns at once.
    pub min_bytes: u64,
    /// The longest the fetch parks waiting for `min_bytes`.
    pub max_wait: Duration,
    pub isolation: Isolation,
}

/// What a fetch found in one partition, in request order.
#[derive(Debug, Clone)]
pub struct FetchedPartition {
    /// Why nothing was read (offset out of range, fenced epoch, ...); the offsets below are
    /// still the partition's, or -1 if it could not be read at all.
    pub error: Option<BrokerError>,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    /// Whole batches from the batch that holds the wanted offset; `None` when there is nothing
    /// (yet) at or after it below the bound.
    pub slice: Option<FileSlice>,
    /// With [`Isolation::Committed`]: the aborted transactions overlapping the slice (empty
    /// without a slice). `None` otherwise.
    pub aborted: Option<Vec<AbortedTxn>>,
}

impl FetchedPartition {
    fn failed(error: BrokerError, partition: Option<&Partition>) -> FetchedPartition {
        let (high_watermark, last_stable_offset, log_start_offset) = match partition {
            Some(p) => (p.log.high_watermark(), p.log.last_stable_offset(), p.log.log_start_offset()),
            None => (-1, -1, -1),
        };
        FetchedPartition {
            error: Some(error),
            high_watermark,
            last_stable_offset,
            log_start_offset,
            slice: None,
            aborted: None,
        }
    }

    pub fn bytes(&self) -> u64 {
        self.slice.as_ref().map_or(0, |s| s.len)
    }
}

impl Broker {
    /// Reads `request.partitions`, parking until `min_bytes` are available, `max_wait` passes, a
    /// partition fails, or the broker shuts down. Returns one entry per wanted partition, in
    /// order; the bytes returned are counted in each partition's `bytes_out`.
    pub async fn fetch(self: &Arc<Self>, request: FetchRequest) -> Result<Vec<FetchedPartition>, BrokerError> {
        let deadline = tokio::time::Instant::now() + request.max_wait;
        let request = Arc::new(request);
        let found = loop {
            let (broker, wanted) = (self.clone(), request.clone());
            let (found, seen_high_watermarks) = tokio::task::spawn_blocking(move || broker.read_once(&wanted))
                .await
                .map_err(|e| BrokerError::internal(format!("fetch task failed: {e}")))?;
            let bytes: u64 = found.iter().map(FetchedPartition::bytes).sum();
            let failed = found.iter().any(|f| f.error.is_some());
            if bytes >= request.min_bytes
                || bytes > 0 && request.min_bytes == 0
                || failed
                || tokio::time::Instant::now() >= deadline
                || self.is_shutting_down()
            {
                break found;
            }
            // Not enough yet: register, then check that no high watermark moved since the read
            // (see the module doc), then park.
            let waiter = Arc::new(Notify::new());
            for wanted in &request.partitions {
                wanted.partition.register_waiter(&waiter);
            }
            let moved = request
                .partitions
                .iter()
                .zip(&seen_high_watermarks)
                .any(|(wanted, seen)| wanted.partition.log.high_watermark() != *seen);
            if !moved {
                self.wait_for_data(&waiter, deadline).await;
            }
        };
        for (wanted, fetched) in request.partitions.iter().zip(&found) {
            if fetched.slice.is_some() {
                wanted.partition.metrics.bytes_out.add(fetched.bytes());
            }
        }
        Ok(found)
    }

    /// One pass over the wanted partitions; also returns the high watermark each had before
    /// its read. Blocking (reads index and segment headers).
    fn read_once(&self, request: &FetchRequest) -> (Vec<FetchedPartition>, Vec<i64>) {
        let mut total: u64 = 0;
        let mut out = Vec::with_capacity(request.partitions.len());
        let mut seen = Vec::with_capacity(request.partitions.len());
        for wanted in &request.partitions {
            let partition = &wanted.partition;
            let log = &partition.log;
            seen.push(log.high_watermark());
            if let Err(e) = partition.check_leader_epoch(wanted.current_leader_epoch) {
                out.push(FetchedPartition::failed(e, Some(partition)));
                continue;
            }
            let limit = request.max_bytes.saturating_sub(total).min(wanted.max_bytes);
            let min_one_batch = total == 0;
            let upper = match request.isolation {
                Isolation::HighWatermark => log.high_watermark(),
                Isolation::Committed => log.last_stable_offset(),
            };
            let read = if limit == 0 && !min_one_batch {
                Ok(None)
            } else {
                log.read_with(wanted.offset, limit, upper, min_one_batch).map(|r| r.slice).map_err(BrokerError::from)
            };
            match read {
                Ok(slice) => {
                    total += slice.as_ref().map_or(0, |s| s.len);
                    // A read_committed consumer must drop the records of transactions aborted in
                    // what it receives.
                    let aborted = (request.isolation == Isolation::Committed).then(|| match &slice {
                        Some(s) => log.aborted_transactions(s.first_offset, s.next_offset),
                        None => Vec::new(),
                    });
                    out.push(FetchedPartition {
                        error: None,
                        high_watermark: log.high_watermark(),
                        last_stable_offset: log.last_stable_offset(),
                        log_start_offset: log.log_start_offset(),
                        slice,
                        aborted,
                    });
                }
                Err(e) => {
                    if e.kind != ErrorKind::OffsetOutOfRange {
                        tracing::warn!(topic = %partition.topic, partition = partition.index, error = %e, "fetch failed");
                    }
                    out.push(FetchedPartition::failed(e, Some(partition)));
                }
            }
        }
        (out, seen)
    }
}
