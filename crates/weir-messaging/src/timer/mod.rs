//! Delayed messages: the timer store. A message with a delivery time in the future is kept
//! here, not in its topic, and appended to its topic when it comes due (RocketMQ 5's timer
//! store; Kafka's purgatory is the in-memory cousin).
//!
//! - **Where it lives:** the internal topic `__delayed_messages` (its partitions are the
//!   store's shards; `messaging.state.topic.*` sets their count, replication factor and min
//!   ISR). A scheduled message goes to the shard of its target partition (its topic's, for a
//!   RocketMQ message sent without one): a record as it will be appended to its topic, plus the
//!   headers `headers::TARGET_TOPIC` (and `headers::TARGET_PARTITION` when known), with its due
//!   time in `weir.delivery-timestamp`. A schedule is acknowledged once the shard's ISR has it,
//!   as durably as the flush policy promises, as an `acks=all` write is.
//! - **Who fires:** the broker leading a shard ([`shard::TimerShard`], loaded and dropped with
//!   the leadership as a coordinator's shard is). Loading replays the shard's log into a
//!   two-level timing wheel ([`wheel`]: minute slots on disk, the next few seconds in memory,
//!   so a million messages pending for a week cost little RAM). One task per shard takes what
//!   is due and committed, in (due time, offset) order, reads those records back, strips the
//!   timer headers and appends them to their topics (`acks=all`, at each partition's leader,
//!   see [`weir_broker::forward`]) with the firing time as their timestamp. A message without a
//!   chosen partition goes to the partitions this broker leads in turn.
//! - **What survives a failover:** the shard's log also holds notes: the fired mark (every key
//!   up to it fired), written at most every 100 ms while messages fire and before the task
//!   sleeps; recalls; and the wheel key of a message that was due already when it came. A new
//!   leader fires what the last mark does not cover: a message fired in the last 100 ms before
//!   its leader died may fire again (at least once, never lost; the window is measured in
//!   docs/rocketmq.md).
//! - **Retention:** each shard's log is trimmed below its smallest pending offset (after the
//!   fired mark is noted above it); followers follow the leader's log start.
//! - **Recall** ([`recall`]): a message recalled before it is due is settled at its due time
//!   without an append; the recall is a note in the shard, so it holds after a failover.
//! - **Upgrades** ([`migrate`]): the broker-local store of earlier versions (`<data>/timer/`)
//!   is moved into the shards once, at the first start.

pub mod migrate;
pub mod recall;
mod service;
pub mod shard;
pub mod wheel;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use weir_coordinators::shards::{ShardOwner, Shards};
use weir_storage::records::{self, BatchOptions, Header, Record};
use weir_storage::sync::lock;
use weir_storage::{Clock, Log, LogConfig};

use crate::state_topic;

pub use recall::Recall;
use shard::TimerShard;
use weir_broker::message::headers::DELIVERY_TIMESTAMP;
use weir_broker::{Broker, BrokerError, ErrorKind, Partition};

/// The timer's own headers, stripped when a message fires.
pub mod headers {
    /// The prefix of the timer's headers.
    pub const PREFIX: &str = "weir.timer.";
    /// The topic the message goes to.
    pub(crate) const TARGET_TOPIC: &str = "weir.timer.topic";
    /// The partition the producer chose, when it chose one (decimal).
    pub(crate) const TARGET_PARTITION: &str = "weir.timer.partition";
    /// On the store's own notes (the fired mark, a recall, a raised key): which kind.
    pub(crate) const NOTE: &str = "weir.timer.note";
}

/// The config of a broker-local log that holds messages until they are dealt with (the timer
/// store's, the half messages'), from the broker's default topic config (its flush policy
/// applies): kept until dealt with, not by age or size (the owner trims it below what is
/// pending); one record of a 4 MiB body with its headers fits; small segments rolled hourly, so
/// what was dealt with goes promptly, a segment at a time.
pub(crate) fn holding_log_config(mut config: LogConfig) -> LogConfig {
    config.retention_ms = -1;
    config.retention_bytes = -1;
    config.max_message_bytes = config.max_message_bytes.max(8 << 20);
    config.segment_bytes = config.segment_bytes.min(state_topic::SEGMENT_BYTES);
    config.segment_ms = config.segment_ms.min(3_600_000);
    config
}

/// The most messages one firing round takes.
const ROUND_MAX: usize = 4096;
/// The largest batch a firing appends.
const FIRE_BATCH_BYTES: usize = 512 << 10;
/// How long the firing loop sleeps at most (it also wakes when a message is scheduled).
const IDLE_WAKE: Duration = Duration::from_secs(1);
/// How long it waits after an append failed (a leader away) before trying again.
const RETRY_WAIT: Duration = Duration::from_millis(500);

/// What firing did with a due message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Appended,
    /// Given up: its topic is gone or refuses it for good.
    Dropped,
    /// Not appended now (its partition's leader is away, say): tried again shortly.
    Retry,
    /// Recalled before it came due: settled without an append.
    Recalled,
}

/// Failures no retry mends: the topic refuses the message as it is.
fn is_permanent(error: &BrokerError) -> bool {
    matches!(
        error.kind,
        ErrorKind::TooLarge
            | ErrorKind::InvalidRecord
            | ErrorKind::Corrupt
            | ErrorKind::InvalidTimestamp
            | ErrorKind::InvalidTopic
    )
}

/// About what a record takes in a batch.
fn record_bytes(record: &Option<Record>) -> usize {
    record.as_ref().map_or(0, |r| {
        let headers: usize = r.headers.iter().map(|h| h.name.len() + h.value.as_ref().map_or(0, |v| v.len()) + 4).sum();
        r.value.as_ref().map_or(0, |v| v.len()) + r.key.as_ref().map_or(0, |k| k.len()) + headers + 24
    })
}

/// `topic`'s `max.message.bytes`.
fn max_message_bytes(broker: &Broker, topic: &str) -> Option<usize> {
    let metadata = broker.metadata();
    let configs = &metadata.topic(topic)?.configs;
    weir_broker::topic_config::log_config(&broker.config.topic_defaults, configs)
        .ok()
        .map(|c| c.max_message_bytes as usize)
}

/// Counters for metrics and the benchmark.
#[derive(Debug, Default)]
pub struct TimerStats {
    pub scheduled: AtomicU64,
    pub fired: AtomicU64,
    /// Messages dropped at firing because their topic was deleted meanwhile.
    pub dropped: AtomicU64,
    /// Messages recalled before they came due.
    pub recalled: AtomicU64,
    /// The largest lateness of a fired message so far (firing time less due time), ms.
    pub(crate) lateness_ms_max: AtomicI64,
}

/// The due messages of a firing round by target (topic, partition): indexes into the round.
type Routes = BTreeMap<(String, i32), Vec<usize>>;

/// Where a scheduled record goes: the topic and the partition chosen, if any (its timer
/// headers).
pub(crate) fn target_of(record: &Record) -> (String, Option<i32>) {
    let header = |name: &str| {
        record
            .headers
            .iter()
            .find(|h| h.name == name)
            .and_then(|h| h.value.as_deref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    (header(headers::TARGET_TOPIC).unwrap_or_default(), header(headers::TARGET_PARTITION).and_then(|p| p.parse().ok()))
}

/// A record's due time (its `weir.delivery-timestamp`).
pub fn due_ms(record: &Record) -> Option<i64> {
    let header = record.headers.iter().rev().find(|h| h.name == DELIVERY_TIMESTAMP)?;
    std::str::from_utf8(header.value.as_deref()?).ok()?.trim().parse().ok()
}

/// The timer store's topic.
pub const TOPIC: &str = weir_broker::metadata::DELAYED_MESSAGES_TOPIC;

/// Where a scheduled message waits: its shard and its offset there (what a recall names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduled {
    pub shard: i32,
    pub first_offset: i64,
}

/// The timer store of this broker: the shards it leads, and the way to the others.
pub struct Timer {
    broker: Weak<Broker>,
    shards: Shards<Arc<TimerShard>>,
    /// The shards loaded, to stop their firing when they are dropped.
    running: Mutex<HashMap<i32, Arc<TimerShard>>>,
    pub stats: Arc<TimerStats>,
    round_robin: AtomicU32,
}

/// The directory under the data directory that holds the loaded shards' wheels.
pub(crate) fn shards_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(Timer::DIR).join("shards")
}

impl Timer {
    /// The directory under the data directory (the broker-local store of earlier versions
    /// was there too).
    pub const DIR: &'static str = "timer";

    pub(crate) fn new(broker: &Arc<Broker>) -> Timer {
        Timer {
            broker: Arc::downgrade(broker),
            shards: Shards::new(TOPIC),
            running: Mutex::new(HashMap::new()),
            stats: Arc::new(TimerStats::default()),
            round_robin: AtomicU32::new(0),
        }
    }

    /// Loads the shards this broker leads, now and whenever leadership moves. Call within a
    /// tokio runtime, once.
    pub(crate) fn start(self: &Arc<Self>, broker: &Arc<Broker>) {
        state_topic::start_shards(broker, self);
    }

    /// How many messages wait in the shards this broker leads (recalled ones not counted), and
    /// how many wheel entries are in memory.
    pub fn pending(&self) -> (u64, usize) {
        self.shards.loaded().values().map(|shard| shard.pending()).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    fn broker(&self) -> Result<Arc<Broker>, BrokerError> {
        self.broker.upgrade().ok_or_else(|| BrokerError::internal("the broker is shutting down"))
    }

    /// Keeps `records` (each with its due time in `weir.delivery-timestamp`) until they are due,
    /// then appends them to `topic` (to `partition`, when given). Returns where they wait once
    /// their shard's ISR has them, as durably as the flush policy promises.
    pub async fn schedule(
        self: &Arc<Self>,
        topic: &str,
        partition: Option<i32>,
        records: Vec<Record>,
    ) -> Result<Scheduled, BrokerError> {
        if records.is_empty() {
            return Err(BrokerError::new(ErrorKind::InvalidRequest, "nothing to schedule"));
        }
        let mut dues = Vec::with_capacity(records.len());
        // One batch per message: messages fire in due order, not in the order they came, so
        // each must be readable alone without decoding its neighbours.
        let mut batch = BytesMut::new();
        for mut record in records {
            let due = due_ms(&record).ok_or_else(|| {
                BrokerError::new(
                    ErrorKind::InvalidRecord,
                    format!("a scheduled record needs a {DELIVERY_TIMESTAMP} header"),
                )
            })?;
            dues.push(due);
            record.headers.retain(|h| !h.name.starts_with(headers::PREFIX));
            record.headers.push(Header::new(headers::TARGET_TOPIC, Some(Bytes::from(topic.to_string()))));
            if let Some(partition) = partition {
                record.headers.push(Header::new(headers::TARGET_PARTITION, Some(Bytes::from(partition.to_string()))));
            }
            let one = records::encode_batch(std::slice::from_ref(&record), &BatchOptions::default())
                .map_err(|e| BrokerError::new(ErrorKind::InvalidRecord, e.to_string()))?;
            batch.extend_from_slice(&one);
        }
        let broker = self.broker()?;
        let count = state_topic::partitions(&broker, TOPIC).await?;
        let key = partition.unwrap_or_else(|| self.round_robin.fetch_add(1, Ordering::Relaxed) as i32);
        let shard = state_topic::shard_of(topic, key, count);
        let request = service::ScheduleRequest { shard, dues };
        let first_offset = state_topic::at_leader(&broker, TOPIC, shard, |node| {
            let (request, batch, broker) = (request.clone(), batch.clone(), broker.clone());
            async move {
                match node {
                    None => self.schedule_here(request, batch).await,
                    Some(node) => service::call_schedule(&broker, node, &request, &batch).await,
                }
            }
        })
        .await?;
        Ok(Scheduled { shard, first_offset })
    }

    /// Schedules on a shard this broker leads.
    pub(crate) async fn schedule_here(
        &self,
        request: service::ScheduleRequest,
        batch: BytesMut,
    ) -> Result<i64, BrokerError> {
        let shard = self.shards.get(request.shard)?;
        shard.schedule(batch, request.dues).await
    }

    /// Recalls the message of `topic` scheduled at `offset` of shard `shard`, due at `due_ms`
    /// (what [`Timer::schedule`] answered and the message's delivery time): it will not be
    /// delivered. Goes to the broker leading the shard.
    pub async fn recall(
        self: &Arc<Self>,
        shard: i32,
        topic: &str,
        due_ms: i64,
        offset: i64,
    ) -> Result<Recall, BrokerError> {
        let broker = self.broker()?;
        let request = service::RecallRequest { shard, topic: topic.to_string(), due_ms, offset };
        state_topic::at_leader(&broker, TOPIC, shard, |node| {
            let (request, broker) = (request.clone(), broker.clone());
            async move {
                match node {
                    None => self.recall_here(&request).await,
                    Some(node) => service::call_recall(&broker, node, &request).await,
                }
            }
        })
        .await
    }

    pub(crate) async fn recall_here(&self, request: &service::RecallRequest) -> Result<Recall, BrokerError> {
        let shard = self.shards.get(request.shard)?;
        let broker = self.broker()?;
        shard.recall(&broker, &request.topic, request.due_ms, request.offset).await
    }
}

/// Serves the timer's internal RPCs on this broker.
pub(crate) fn register(broker: &Arc<Broker>, timer: &Arc<Timer>) {
    service::register(broker, timer);
}

impl ShardOwner for Timer {
    type Shard = Arc<TimerShard>;

    fn shards(&self) -> &Shards<Arc<TimerShard>> {
        &self.shards
    }

    fn load_shard(&self, index: i32, partition: Arc<Partition>) -> Result<Arc<TimerShard>, BrokerError> {
        let broker = self.broker()?;
        let shard = Arc::new(shard::load(&broker, index, partition, self.stats.clone())?);
        if let Some(old) = lock(&self.running).insert(index, shard.clone()) {
            old.stop();
        }
        shard.start();
        Ok(shard)
    }

    fn unload_shard(&self, index: i32) {
        if let Some(shard) = lock(&self.running).remove(&index) {
            shard.stop();
            tracing::info!(shard = index, "timer store: no longer leads this partition of {TOPIC}");
        }
    }
}

/// A producer's batches for a DELAY topic, split by `split_delayed`.
#[derive(Debug)]
pub struct Split {
    /// The records whose delivery time is to come, for the timer.
    pub delayed: Vec<Record>,
    /// One batch of the others, to append now (`None` when every record was delayed).
    pub now: Option<BytesMut>,
}

/// The timer as the data path's append sees it ([`weir_broker::delayed`]): a DELAY topic's
/// records that are not due go to the store, the others are appended at once.
pub(crate) struct Diversion {
    pub(crate) timer: Arc<Timer>,
    pub(crate) clock: Arc<dyn Clock>,
}

impl weir_broker::delayed::DelayedRecords for Diversion {
    fn divert<'a>(
        &'a self,
        partition: &'a weir_broker::Partition,
        records: BytesMut,
        max_delay_ms: i64,
    ) -> weir_broker::delayed::Diverted<'a> {
        Box::pin(async move {
            let Some(split) = split_delayed(&records, self.clock.now_ms(), max_delay_ms)? else {
                return Ok(Some(records));
            };
            self.timer.schedule(&partition.topic, Some(partition.index), split.delayed).await?;
            Ok(split.now)
        })
    }
}

/// Splits `batches` (as a producer sent them) into the records due later than `now_ms`, by
/// their `weir.delivery-timestamp` header, and the rest. `None` when no record is delayed: the
/// batches are appended as they are. A delivery time more than `max_delay_ms` away, or a
/// delayed record in an idempotent or transactional batch, is refused (the producer's sequence
/// numbers or transaction would no longer match what the partition holds; send delayed records
/// with `enable.idempotence=false`).
pub(crate) fn split_delayed(batches: &[u8], now_ms: i64, max_delay_ms: i64) -> Result<Option<Split>, BrokerError> {
    let decoded =
        records::decode_batches(batches).map_err(|e| BrokerError::new(ErrorKind::InvalidRecord, e.to_string()))?;
    let refuse = |message: String| Err(BrokerError::new(ErrorKind::InvalidRecord, message));
    let mut delayed = Vec::new();
    let mut rest = Vec::new();
    for batch in decoded {
        let producer = batch.header.producer_id >= 0;
        for record in batch.records {
            match due_ms(&record) {
                Some(due) if due > now_ms => {
                    if due - now_ms > max_delay_ms {
                        return refuse(format!(
                            "a record's {DELIVERY_TIMESTAMP} is {} ms away; this topic takes at most {max_delay_ms} ms (message.delay.max.ms)",
                            due - now_ms
                        ));
                    }
                    if producer {
                        return refuse(format!(
                            "delayed records ({DELIVERY_TIMESTAMP} to come) need a producer without idempotence or transactions (enable.idempotence=false)"
                        ));
                    }
                    delayed.push(record);
                }
                _ => rest.push(record),
            }
        }
    }
    if delayed.is_empty() {
        return Ok(None);
    }
    let now = if rest.is_empty() {
        None
    } else {
        Some(
            records::encode_batch(&rest, &BatchOptions::default())
                .map_err(|e| BrokerError::new(ErrorKind::InvalidRecord, e.to_string()))?,
        )
    };
    Ok(Some(Split { delayed, now }))
}

/// The records of whole batches from `from` on (about `max_bytes`, at least one batch), and
/// where the next read starts.
fn read_from(log: &Log, from: i64, max_bytes: u64) -> Result<(Vec<Record>, i64), BrokerError> {
    let read = log.read(from, max_bytes, log.log_end_offset()).map_err(BrokerError::from)?;
    let Some(slice) = read.slice else { return Ok((Vec::new(), from)) };
    let bytes = slice.read_to_vec().map_err(BrokerError::from)?;
    let batches = records::decode_batches(&bytes).map_err(|e| BrokerError::new(ErrorKind::Corrupt, e.to_string()))?;
    let next = batches.last().map_or(from, |b| b.header.next_offset());
    let records = batches.into_iter().flat_map(|b| b.records).filter(|r| r.offset >= from).collect();
    Ok((records, next))
}

/// The records at `offsets` (`None` for one the log no longer has); neighbours share reads.
fn read_at(log: &Log, offsets: &[i64]) -> Result<Vec<Option<Record>>, BrokerError> {
    let mut cached: Vec<Record> = Vec::new();
    let mut cached_range = (0, 0);
    let mut out = Vec::with_capacity(offsets.len());
    for (index, &offset) in offsets.iter().enumerate() {
        if offset < log.log_start_offset() {
            out.push(None);
            continue;
        }
        if !(cached_range.0..cached_range.1).contains(&offset) {
            // Messages scheduled together and due together sit together: read ahead then. A
            // lone one is read alone (one batch).
            let run = offsets[index..].windows(2).take_while(|w| w[1] == w[0] + 1).count();
            let max_bytes = if run > 0 { 256 << 10 } else { 1 };
            let (records, next) = read_from(log, offset, max_bytes)?;
            cached_range = (offset, next);
            cached = records;
        }
        out.push(cached.binary_search_by_key(&offset, |r| r.offset).ok().map(|i| cached[i].clone()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delayed(due: i64, value: &'static [u8]) -> Record {
        let mut record = Record::new(1, None, Some(Bytes::from_static(value)));
        record.headers.push(Header::new(DELIVERY_TIMESTAMP, Some(Bytes::from(due.to_string()))));
        record
    }

    #[test]
    fn a_producers_batch_splits_into_the_delayed_records_and_the_others() {
        let plain = Record::new(1, None, Some(Bytes::from_static(b"now")));
        let past = delayed(500, b"past");
        let batch =
            records::encode_batch(&[plain, delayed(5_000, b"later"), past], &BatchOptions::default()).expect("encode");
        let split = split_delayed(&batch, 1_000, 60_000).expect("valid").expect("something delayed");
        assert_eq!(
            split.delayed.iter().map(|r| r.value.clone()).collect::<Vec<_>>(),
            vec![Some(Bytes::from_static(b"later"))]
        );
        let now = records::decode_records(&split.now.expect("the others")).expect("decode");
        let values: Vec<_> = now.iter().filter_map(|r| r.value.clone()).collect();
        assert_eq!(values, vec![Bytes::from_static(b"now"), Bytes::from_static(b"past")]);

        let nothing_delayed = records::encode_batch(&[delayed(999, b"x")], &BatchOptions::default()).expect("encode");
        assert!(split_delayed(&nothing_delayed, 1_000, 60_000).expect("valid").is_none());
        let all_delayed = records::encode_batch(&[delayed(2_000, b"x")], &BatchOptions::default()).expect("encode");
        assert!(split_delayed(&all_delayed, 1_000, 60_000).expect("valid").expect("delayed").now.is_none());
    }

    #[test]
    fn a_delay_past_the_limit_or_in_an_idempotent_batch_is_refused() {
        let batch = records::encode_batch(&[delayed(100_000, b"x")], &BatchOptions::default()).expect("encode");
        assert_eq!(split_delayed(&batch, 0, 60_000).map(|_| ()).map_err(|e| e.kind), Err(ErrorKind::InvalidRecord));
        let idempotent =
            BatchOptions { producer_id: 7, producer_epoch: 0, base_sequence: 0, ..BatchOptions::default() };
        let batch = records::encode_batch(&[delayed(2_000, b"x")], &idempotent).expect("encode");
        assert_eq!(split_delayed(&batch, 0, 60_000).map(|_| ()).map_err(|e| e.kind), Err(ErrorKind::InvalidRecord));
    }
}
