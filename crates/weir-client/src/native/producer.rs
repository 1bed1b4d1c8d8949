//! The native producer: keeps every message until the partition's checkpoint passes it, and
//! after a stale session resends exactly the messages the broker no longer holds.
//!
//! Each partition the producer writes to has a lane: the messages not persisted yet, in
//! order, and two tasks.
//! - **The writer** sends the messages not accepted yet, one batch at a time, each answered as
//!   soon as the broker has it in memory. After a reconnect, or when the broker refuses the
//!   session, it first asks where the log stands (an empty write) and takes the broker's word:
//!   the messages up to the writer's last sequence in the log are there; the others are sent
//!   again, in order.
//! - **The watcher** asks for the checkpoint on a connection of its own while accepted
//!   messages wait for it (a long poll: the broker answers once C moves), and releases the
//!   messages below it.
//!
//! Messages are identified by sequence numbers of the producer's idempotent producer id, so a
//! batch sent twice on the same session is stored once.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::native::connection::Connection;
use crate::native::routes::Routes;
use crate::native::wire::{SessionWriteRequest, SessionWriteResponse, STALE_SESSION};
use crate::ClientError;

/// Sequence numbers wrap at `i32::MAX` back to 0, as Kafka's do.
const SEQUENCE_SPACE: i64 = i32::MAX as i64 + 1;

/// Kafka error codes a write is retried after (at the leader Metadata names then).
const RETRIABLE: [i16; 9] = [
    3,  // UNKNOWN_TOPIC_OR_PARTITION: the partition is moving here
    5,  // LEADER_NOT_AVAILABLE
    6,  // NOT_LEADER_OR_FOLLOWER
    7,  // REQUEST_TIMED_OUT: the memory pool stayed full
    13, // NETWORK_EXCEPTION
    15, // COORDINATOR_NOT_AVAILABLE
    19, // NOT_ENOUGH_REPLICAS
    56, // KAFKA_STORAGE_ERROR
    75, // UNKNOWN_LEADER_EPOCH
];

/// How a [`Producer`] works. [`ProducerConfig::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// `host:port[,host:port...]` of the Kafka listeners to start from.
    pub bootstrap: String,
    pub client_id: String,
    /// The most bytes of messages one write carries (one message always goes, whatever its size).
    pub batch_bytes: usize,
    /// The most bytes of messages a partition keeps unpersisted: [`Producer::send`] waits
    /// beyond it.
    pub buffer_bytes: usize,
    /// How long a write waits for more messages before it goes (0: at once; messages sent
    /// while a write is out go together in the next one anyway).
    pub linger: Duration,
    /// How long one checkpoint poll may wait at the broker for C to move.
    pub checkpoint_wait: Duration,
    /// Bounds each connect and exchange.
    pub request_timeout: Duration,
    /// The pause before trying again after a broker could not be reached or refused.
    pub retry_backoff: Duration,
}

impl ProducerConfig {
    pub fn new(bootstrap: impl Into<String>) -> ProducerConfig {
        ProducerConfig {
            bootstrap: bootstrap.into(),
            client_id: "weir-native-producer".to_string(),
            batch_bytes: 1 << 20,
            buffer_bytes: 64 << 20,
            linger: Duration::ZERO,
            checkpoint_wait: Duration::from_secs(1),
            request_timeout: Duration::from_secs(30),
            retry_backoff: Duration::from_millis(100),
        }
    }
}

/// A message to send. `sequence` is the caller's own number for it, increasing; the producer
/// reports the highest one persisted ([`Checkpoint::sequence`]), so the caller can record how
/// far it got.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(String, Bytes)>,
    /// Milliseconds since the epoch; the time of sending when `None`.
    pub timestamp: Option<i64>,
    pub sequence: Option<u64>,
}

impl Message {
    pub fn new(value: impl Into<Bytes>) -> Message {
        Message { value: Some(value.into()), ..Message::default() }
    }

    pub fn with_key(mut self, key: impl Into<Bytes>) -> Message {
        self.key = Some(key.into());
        self
    }

    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Bytes>) -> Message {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn with_sequence(mut self, sequence: u64) -> Message {
        self.sequence = Some(sequence);
        self
    }

    fn size(&self) -> usize {
        let headers: usize = self.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.key.as_ref().map_or(0, Bytes::len) + self.value.as_ref().map_or(0, Bytes::len) + headers + 16
    }
}

/// Where a partition's session stands, as the producer last heard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checkpoint {
    /// V and S of the session (0 before the first answer).
    pub version: i64,
    pub load_stamp: i64,
    /// C: every record below this offset is persisted (-1 before the first answer). Only
    /// moves forward.
    pub offset: i64,
    /// The highest [`Message::sequence`] persisted so far.
    pub sequence: Option<u64>,
}

/// What the producer did, over all partitions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProducerStats {
    /// Messages the broker accepted.
    pub accepted: u64,
    /// Messages released because the checkpoint passed them.
    pub persisted: u64,
    /// Messages sent again after the broker lost them (a stale session) or never answered.
    pub resent: u64,
    /// The lowest [`Message::sequence`] sent again, if any was.
    pub lowest_resent: Option<u64>,
    /// Sessions refused as stale (the partition reloaded or moved).
    pub stale_sessions: u64,
}

/// An async producer of one topic over the native write protocol. See the module doc.
///
/// ```no_run
/// # async fn run() -> Result<(), weir_client::ClientError> {
/// use weir_client::native::{Message, Producer, ProducerConfig};
///
/// let producer = Producer::connect(ProducerConfig::new("127.0.0.1:9092"), "events").await?;
/// for n in 0..100u64 {
///     producer.send(0, Message::new(format!("event {n}")).with_sequence(n)).await?;
/// }
/// producer.flush().await?; // the broker has them (in memory)
/// producer.persisted().await?; // the object store has them
/// assert_eq!(producer.checkpoint(0).sequence, Some(99));
/// # Ok(())
/// # }
/// ```
pub struct Producer {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

struct Shared {
    routes: Routes,
    config: ProducerConfig,
    producer_id: i64,
    producer_epoch: i16,
    lanes: Vec<Lane>,
}

struct Lane {
    index: i32,
    state: Mutex<LaneState>,
    /// Woken (all waiters) at every change of `state`.
    changed: Notify,
}

#[derive(Default)]
struct LaneState {
    /// The messages not persisted yet, by sequence, with no gap.
    queue: VecDeque<Pending>,
    /// The sequence the next message gets.
    next_sequence: i64,
    /// The first message the broker has not accepted: those before it have an offset (exact,
    /// or a bound), those from it on have none.
    first_unaccepted: i64,
    session: Option<(i64, i64)>,
    checkpoint: i64,
    persisted_sequence: Option<u64>,
    buffered_bytes: usize,
    /// The writer must ask where the log stands before it writes again.
    needs_sync: bool,
    flush_asked: bool,
    failed: Option<String>,
    stats: ProducerStats,
}

struct Pending {
    sequence: i64,
    message: Message,
    /// Its offset, or an offset at or above it; `None` until the broker accepted it.
    offset: Option<i64>,
    /// Sent at least once.
    sent: bool,
    size: usize,
}

impl Lane {
    fn state(&self) -> MutexGuard<'_, LaneState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until `done` holds of the state, or the lane failed.
    async fn wait_until(&self, done: impl Fn(&LaneState) -> bool) -> Result<(), ClientError> {
        loop {
            let changed = self.changed.notified();
            {
                let state = self.state();
                if let Some(failure) = &state.failed {
                    return Err(ClientError::Unavailable(failure.clone()));
                }
                if done(&state) {
                    return Ok(());
                }
            }
            changed.await;
        }
    }
}

impl Producer {
    /// Looks the topic up, takes an idempotent producer id, and starts a writer and a watcher
    /// for each of the topic's partitions.
    pub async fn connect(config: ProducerConfig, topic: &str) -> Result<Producer, ClientError> {
        let routes = Routes::new(&config.bootstrap, &config.client_id, config.request_timeout, topic).await?;
        let (producer_id, producer_epoch) = routes.init_producer_id().await?;
        let lanes = (0..routes.partition_count())
            .map(|index| Lane {
                index: index as i32,
                state: Mutex::new(LaneState { checkpoint: -1, ..LaneState::default() }),
                changed: Notify::new(),
            })
            .collect();
        let shared = Arc::new(Shared { routes, config, producer_id, producer_epoch, lanes });
        let mut tasks = Vec::new();
        for lane in 0..shared.lanes.len() {
            tasks.push(tokio::spawn(run_writer(shared.clone(), lane)));
            tasks.push(tokio::spawn(run_watcher(shared.clone(), lane)));
        }
        Ok(Producer { shared, tasks })
    }

    /// The topic's partitions when the producer connected.
    pub fn partitions(&self) -> i32 {
        self.shared.lanes.len() as i32
    }

    fn lane(&self, partition: i32) -> Result<&Lane, ClientError> {
        usize::try_from(partition).ok().and_then(|i| self.shared.lanes.get(i)).ok_or_else(|| {
            ClientError::Unavailable(format!(
                "partition {partition} of '{}' does not exist (it has {})",
                self.shared.routes.topic,
                self.shared.lanes.len()
            ))
        })
    }

    /// Adds a message to the partition's buffer; waits while the buffer holds `buffer_bytes`
    /// not persisted. The message goes in the next write.
    pub async fn send(&self, partition: i32, message: Message) -> Result<(), ClientError> {
        let lane = self.lane(partition)?;
        let size = message.size();
        let limit = self.shared.config.buffer_bytes;
        lane.wait_until(|state| state.buffered_bytes == 0 || state.buffered_bytes + size <= limit).await?;
        let mut state = lane.state();
        let sequence = state.next_sequence;
        state.next_sequence += 1;
        state.buffered_bytes += size;
        state.queue.push_back(Pending { sequence, message, offset: None, sent: false, size });
        drop(state);
        lane.changed.notify_waiters();
        Ok(())
    }

    /// Sends to logical partition `logical` (0 to 65,535) of an elastic topic: to the stable
    /// partition that holds it, whatever the topic's physical layout (`docs/elastic.md`: stable
    /// partition `s` of `S` holds the logical partitions `[s·B, (s+1)·B)`, `B = 65536 / S`).
    /// A split or merge that moves the stable partition is, to the producer, a move: it
    /// resends there what was not persisted.
    pub async fn send_logical(&self, logical: i32, message: Message) -> Result<(), ClientError> {
        let partition = stable_partition(logical, self.partitions())?;
        self.send(partition, message).await
    }

    /// Moves every message sent so far into the brokers' memory: returns once each is
    /// accepted (not yet persisted: see [`Producer::persisted`]).
    pub async fn flush(&self) -> Result<(), ClientError> {
        for lane in &self.shared.lanes {
            lane.state().flush_asked = true;
            lane.changed.notify_waiters();
        }
        for lane in &self.shared.lanes {
            lane.wait_until(|state| state.first_unaccepted == state.next_sequence).await?;
        }
        Ok(())
    }

    /// Returns once every message sent so far is persisted (the checkpoints passed them).
    pub async fn persisted(&self) -> Result<(), ClientError> {
        self.flush().await?;
        for lane in &self.shared.lanes {
            lane.wait_until(|state| state.queue.is_empty()).await?;
        }
        Ok(())
    }

    /// Where the partition's session stands.
    pub fn checkpoint(&self, partition: i32) -> Checkpoint {
        let Ok(lane) = self.lane(partition) else { return Checkpoint::default() };
        let state = lane.state();
        let (version, load_stamp) = state.session.unwrap_or((0, 0));
        Checkpoint { version, load_stamp, offset: state.checkpoint, sequence: state.persisted_sequence }
    }

    /// Waits until the partition's checkpoint moves past `offset`.
    pub async fn checkpoint_past(&self, partition: i32, offset: i64) -> Result<Checkpoint, ClientError> {
        self.lane(partition)?.wait_until(|state| state.checkpoint > offset).await?;
        Ok(self.checkpoint(partition))
    }

    /// Messages in the partition's buffer (not persisted yet).
    pub fn unpersisted(&self, partition: i32) -> usize {
        self.lane(partition).map_or(0, |lane| lane.state().queue.len())
    }

    pub fn stats(&self) -> ProducerStats {
        let mut total = ProducerStats::default();
        for lane in &self.shared.lanes {
            let stats = lane.state().stats;
            total.accepted += stats.accepted;
            total.persisted += stats.persisted;
            total.resent += stats.resent;
            total.stale_sessions += stats.stale_sessions;
            total.lowest_resent = match (total.lowest_resent, stats.lowest_resent) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        total
    }

    /// The idempotent producer id the messages carry.
    pub fn producer_id(&self) -> i64 {
        self.shared.producer_id
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The logical partitions of an elastic topic.
pub const LOGICAL_PARTITIONS: i32 = 65_536;

/// The stable partition of `logical` in a topic of `stable` partitions (a power of two, as an
/// elastic topic's count is).
pub fn stable_partition(logical: i32, stable: i32) -> Result<i32, ClientError> {
    if !(0..LOGICAL_PARTITIONS).contains(&logical) {
        return Err(ClientError::Unavailable(format!(
            "logical partition {logical} is outside 0..{LOGICAL_PARTITIONS}"
        )));
    }
    if !(1..=LOGICAL_PARTITIONS).contains(&stable) || stable.count_ones() != 1 {
        return Err(ClientError::Unavailable(format!(
            "a topic of {stable} partitions is not elastic: an elastic topic has a power of two of them"
        )));
    }
    Ok(logical / (LOGICAL_PARTITIONS / stable))
}

/// `sequence` as the wire carries it.
fn wire_sequence(sequence: i64) -> i32 {
    sequence.rem_euclid(SEQUENCE_SPACE) as i32
}

impl LaneState {
    /// Drops the messages the checkpoint passed.
    fn release(&mut self) -> bool {
        let mut released = false;
        while self.queue.front().is_some_and(|p| p.offset.is_some_and(|offset| offset < self.checkpoint)) {
            let Some(done) = self.queue.pop_front() else { break };
            self.buffered_bytes -= done.size;
            if let Some(sequence) = done.message.sequence {
                self.persisted_sequence = Some(self.persisted_sequence.map_or(sequence, |s| s.max(sequence)));
            }
            self.stats.persisted += 1;
            released = true;
        }
        released
    }

    fn learn_checkpoint(&mut self, checkpoint: i64) {
        self.checkpoint = self.checkpoint.max(checkpoint);
        self.release();
    }

    /// The broker accepted `count` messages from `first_unaccepted` at `response`'s offsets.
    fn accepted(&mut self, count: usize, response: &SessionWriteResponse) {
        let first = self.first_unaccepted;
        for pending in self.queue.iter_mut().filter(|p| p.sequence >= first).take(count) {
            pending.offset = Some(response.base_offset + (pending.sequence - first));
        }
        self.first_unaccepted += count as i64;
        self.stats.accepted += count as u64;
        self.learn_checkpoint(response.checkpoint);
    }

    /// Takes the broker's word on where the log stands for this writer (the answer to an
    /// empty write, or a refusal of a stale session). Errors when the answer cannot be true of
    /// this writer's messages.
    fn sync(&mut self, response: &SessionWriteResponse) -> Result<(), String> {
        let session = (response.partition_version, response.load_stamp);
        if self.session.is_some_and(|s| s != session) {
            self.stats.stale_sessions += 1;
        }
        self.session = Some(session);
        // Everything before the oldest message kept is persisted, so in the log: the writer's
        // last sequence there is at least the one before it, and at most the last one sent.
        let oldest = self.queue.front().map_or(self.next_sequence, |p| p.sequence);
        let in_log_through = if response.writer_sequence < 0 {
            if oldest > 0 {
                return Err(format!(
                    "the broker no longer knows this writer's sequence numbers (its producer state expired?): \
                     messages from sequence {oldest} on cannot be told apart from resends"
                ));
            }
            -1
        } else {
            let gap =
                (i64::from(response.writer_sequence) - i64::from(wire_sequence(oldest - 1))).rem_euclid(SEQUENCE_SPACE);
            oldest - 1 + gap
        };
        if in_log_through >= self.next_sequence {
            return Err(format!(
                "the log holds sequence {} of this writer's producer id, beyond the last one it sent: another writer \
                 uses the same producer id",
                response.writer_sequence
            ));
        }
        for pending in self.queue.iter_mut() {
            if pending.sequence <= in_log_through {
                pending.offset.get_or_insert(response.writer_last_offset);
            } else {
                pending.offset = None;
            }
        }
        self.first_unaccepted = in_log_through + 1;
        self.needs_sync = false;
        self.learn_checkpoint(response.checkpoint);
        Ok(())
    }

    /// The next write's batch: messages from `first_unaccepted`, up to `batch_bytes`, not
    /// across the wrap of sequence numbers (one batch, one run of sequences).
    fn next_batch(&mut self, producer_id: i64, producer_epoch: i16, batch_bytes: usize) -> (Bytes, usize) {
        let first = self.first_unaccepted;
        let mut records = Vec::new();
        let mut bytes = 0;
        let now = now_ms();
        let mut resent = 0;
        for pending in self.queue.iter_mut().filter(|p| p.sequence >= first) {
            let offset = pending.sequence - first;
            if !records.is_empty() && (bytes + pending.size > batch_bytes || wire_sequence(pending.sequence) == 0) {
                break;
            }
            bytes += pending.size;
            if pending.sent {
                resent += 1;
                if let Some(sequence) = pending.message.sequence {
                    self.stats.lowest_resent = Some(self.stats.lowest_resent.map_or(sequence, |s| s.min(sequence)));
                }
            }
            pending.sent = true;
            let message = &pending.message;
            records.push(Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: -1,
                producer_id,
                producer_epoch,
                timestamp_type: TimestampType::Creation,
                offset,
                sequence: wire_sequence(pending.sequence),
                timestamp: message.timestamp.unwrap_or(now),
                key: message.key.clone(),
                value: message.value.clone(),
                headers: message
                    .headers
                    .iter()
                    .map(|(k, v)| (StrBytes::from_string(k.clone()), Some(v.clone())))
                    .collect::<IndexMap<_, _>>(),
            });
        }
        self.stats.resent += resent;
        let mut buf = BytesMut::with_capacity(bytes + 128);
        let options = RecordEncodeOptions { version: 2, compression: Compression::None };
        if RecordBatchEncoder::encode(&mut buf, records.iter(), &options).is_err() {
            return (Bytes::new(), 0);
        }
        (buf.freeze(), records.len())
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// What a write's answer means for the task that sent it.
enum Next {
    Go,
    /// Reconnect (at the leader Metadata names) after a pause.
    Reconnect,
    Stop,
}

impl Shared {
    fn request(&self, lane: &Lane, state: &LaneState, records: Option<Bytes>, wait: Duration) -> SessionWriteRequest {
        SessionWriteRequest {
            topic: self.routes.topic.clone(),
            partition: lane.index,
            session: state.session,
            producer_id: self.producer_id,
            checkpoint_after: state.checkpoint,
            max_wait_ms: i32::try_from(wait.as_millis()).unwrap_or(i32::MAX),
            records,
        }
    }

    async fn connect_leader(&self, partition: i32) -> Result<Connection, ClientError> {
        let leader = self.routes.find_leader(partition).await?;
        Connection::connect(&leader, &self.config.client_id, self.config.request_timeout).await
    }

    async fn pause_and_refresh(&self) {
        tokio::time::sleep(self.config.retry_backoff).await;
        // A failed refresh leaves the routes as they were: the next attempt asks again.
        let _ = self.routes.refresh().await;
    }

    /// Sorts an answer that is neither OK nor a stale session.
    fn on_error(&self, lane: &Lane, response: &SessionWriteResponse) -> Next {
        if RETRIABLE.contains(&response.error_code) {
            return Next::Reconnect;
        }
        let mut state = lane.state();
        state.failed = Some(format!(
            "partition {} of '{}': the broker refused the write (error code {}): {}",
            lane.index,
            self.routes.topic,
            response.error_code,
            response.error_message.as_deref().unwrap_or("")
        ));
        drop(state);
        lane.changed.notify_waiters();
        Next::Stop
    }

    /// Takes the broker's word on where the log stands ([`LaneState::sync`]).
    fn sync(&self, lane: &Lane, response: &SessionWriteResponse) -> Next {
        let synced = lane.state().sync(response);
        lane.changed.notify_waiters();
        match synced {
            Ok(()) => Next::Go,
            Err(failure) => self.fail(lane, failure),
        }
    }

    fn fail(&self, lane: &Lane, failure: String) -> Next {
        lane.state().failed = Some(format!("partition {} of '{}': {failure}", lane.index, self.routes.topic));
        lane.changed.notify_waiters();
        Next::Stop
    }
}

/// The writer of one lane (see the module doc).
async fn run_writer(shared: Arc<Shared>, lane: usize) {
    let lane = &shared.lanes[lane];
    let mut connection: Option<Connection> = None;
    loop {
        // Wait for messages to send, or for a sync to make.
        let ready = lane.wait_until(|state| state.needs_sync || state.first_unaccepted < state.next_sequence).await;
        if ready.is_err() {
            return;
        }
        let linger = shared.config.linger;
        if !linger.is_zero() && !lane.state().flush_asked {
            tokio::time::sleep(linger).await;
        }
        let mut conn = match connection.take() {
            Some(conn) => conn,
            None => match shared.connect_leader(lane.index).await {
                Ok(conn) => {
                    // What the broker has of the messages sent on the last connection is known
                    // only by asking.
                    lane.state().needs_sync = true;
                    conn
                }
                Err(_) => {
                    shared.pause_and_refresh().await;
                    continue;
                }
            },
        };
        let needs_sync = lane.state().needs_sync;
        let next = if needs_sync {
            let request = shared.request(lane, &lane.state(), None, Duration::ZERO);
            match conn.session_write(&request).await {
                Ok(response) if response.error_code == 0 || response.error_code == STALE_SESSION => {
                    shared.sync(lane, &response)
                }
                Ok(response) => shared.on_error(lane, &response),
                Err(_) => Next::Reconnect,
            }
        } else {
            let (request, count) = {
                let mut state = lane.state();
                let (records, count) =
                    state.next_batch(shared.producer_id, shared.producer_epoch, shared.config.batch_bytes);
                (shared.request(lane, &state, Some(records), Duration::ZERO), count)
            };
            if count == 0 {
                shared.fail(lane, "its messages do not encode as a record batch".to_string())
            } else {
                match conn.session_write(&request).await {
                    Ok(response) if response.error_code == 0 => {
                        let mut state = lane.state();
                        state.accepted(count, &response);
                        if state.first_unaccepted == state.next_sequence {
                            state.flush_asked = false;
                        }
                        drop(state);
                        lane.changed.notify_waiters();
                        Next::Go
                    }
                    Ok(response) if response.error_code == STALE_SESSION => shared.sync(lane, &response),
                    Ok(response) => shared.on_error(lane, &response),
                    Err(_) => Next::Reconnect,
                }
            }
        };
        match next {
            Next::Go => connection = Some(conn),
            Next::Reconnect => {
                lane.state().needs_sync = true;
                shared.pause_and_refresh().await;
            }
            Next::Stop => return,
        }
    }
}

/// The watcher of one lane: polls the checkpoint while accepted messages wait for it.
async fn run_watcher(shared: Arc<Shared>, lane: usize) {
    let lane = &shared.lanes[lane];
    let mut connection: Option<Connection> = None;
    loop {
        let waiting = lane
            .wait_until(|state| {
                !state.needs_sync && state.queue.front().is_some_and(|p| p.sequence < state.first_unaccepted)
            })
            .await;
        if waiting.is_err() {
            return;
        }
        let mut conn = match connection.take() {
            Some(conn) => conn,
            None => match shared.connect_leader(lane.index).await {
                Ok(conn) => conn,
                Err(_) => {
                    shared.pause_and_refresh().await;
                    continue;
                }
            },
        };
        let request = shared.request(lane, &lane.state(), None, shared.config.checkpoint_wait);
        match conn.session_write(&request).await {
            Ok(response) if response.error_code == 0 => {
                lane.state().learn_checkpoint(response.checkpoint);
                lane.changed.notify_waiters();
                connection = Some(conn);
            }
            Ok(response) if response.error_code == STALE_SESSION => {
                // The writer takes the new session over and resends what the broker lost.
                lane.state().needs_sync = true;
                lane.changed.notify_waiters();
                connection = Some(conn);
            }
            _ => shared.pause_and_refresh().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(writer_sequence: i32, writer_last_offset: i64, checkpoint: i64, load_stamp: i64) -> SessionWriteResponse {
        SessionWriteResponse {
            error_code: 0,
            error_message: None,
            partition_version: 1,
            load_stamp,
            checkpoint,
            log_end_offset: writer_last_offset + 1,
            base_offset: -1,
            last_offset: -1,
            writer_epoch: 0,
            writer_sequence,
            writer_last_offset,
        }
    }

    fn lane_with(messages: u64) -> LaneState {
        let mut state = LaneState { checkpoint: -1, ..LaneState::default() };
        for n in 0..messages {
            let message = Message::new(format!("m{n}")).with_sequence(n * 10);
            let size = message.size();
            state.queue.push_back(Pending { sequence: n as i64, message, offset: None, sent: false, size });
            state.buffered_bytes += size;
            state.next_sequence += 1;
        }
        state
    }

    #[test]
    fn accepted_messages_are_released_as_the_checkpoint_passes_them() {
        let mut state = lane_with(5);
        state.sync(&answer(-1, -1, 0, 7)).expect("a new writer");
        let (_, count) = state.next_batch(9, 0, 1 << 20);
        assert_eq!(count, 5);
        let mut ok = answer(4, 104, 102, 7);
        ok.base_offset = 100;
        state.accepted(count, &ok);
        // Offsets 100 and 101 are below C = 102.
        assert_eq!(state.queue.len(), 3);
        assert_eq!(state.persisted_sequence, Some(10));
        state.learn_checkpoint(50);
        assert_eq!(state.checkpoint, 102, "a checkpoint never moves back");
        state.learn_checkpoint(105);
        assert!(state.queue.is_empty());
        assert_eq!(state.persisted_sequence, Some(40));
        assert_eq!(state.buffered_bytes, 0);
    }

    #[test]
    fn a_stale_session_resends_exactly_what_the_log_lost() {
        let mut state = lane_with(6);
        state.sync(&answer(-1, -1, 0, 7)).expect("a new writer");
        let (_, count) = state.next_batch(9, 0, 1 << 20);
        let mut ok = answer(5, 5, 0, 7);
        ok.base_offset = 0;
        state.accepted(count, &ok);
        assert_eq!(state.first_unaccepted, 6);
        // The broker reloaded with the first three persisted: sequences 3.. go again.
        state.sync(&answer(2, 2, 3, 8)).expect("a reload");
        assert_eq!(state.stats.stale_sessions, 1);
        assert_eq!(state.first_unaccepted, 3);
        assert_eq!(state.queue.len(), 3, "released below C = 3");
        let (_, count) = state.next_batch(9, 0, 1 << 20);
        assert_eq!((count, state.stats.resent), (3, 3));
        assert_eq!(state.stats.lowest_resent, Some(30), "the user's sequence of message 3");
    }

    #[test]
    fn a_write_whose_answer_was_lost_is_found_in_the_log() {
        let mut state = lane_with(4);
        state.sync(&answer(-1, -1, 0, 7)).expect("a new writer");
        let _ = state.next_batch(9, 0, 1 << 20);
        // The connection broke before the answer; the broker has them all at 10..=13.
        state.sync(&answer(3, 13, 0, 7)).expect("same session");
        assert_eq!(state.first_unaccepted, 4);
        assert!(state.queue.iter().all(|p| p.offset == Some(13)));
        state.learn_checkpoint(14);
        assert!(state.queue.is_empty());
    }

    #[test]
    fn impossible_answers_stop_the_writer() {
        let mut state = lane_with(2);
        assert!(state.sync(&answer(7, 7, 0, 7)).is_err(), "sequences never sent");
        let mut state = lane_with(2);
        state.queue.pop_front();
        assert!(state.sync(&answer(-1, -1, 0, 7)).is_err(), "a forgotten producer");
    }

    #[test]
    fn logical_partitions_map_to_their_stable_partition_blocks() {
        assert_eq!(stable_partition(0, 64).ok(), Some(0));
        assert_eq!(stable_partition(1023, 64).ok(), Some(0));
        assert_eq!(stable_partition(1024, 64).ok(), Some(1));
        assert_eq!(stable_partition(65_535, 64).ok(), Some(63));
        assert!(stable_partition(65_536, 64).is_err());
        assert!(stable_partition(-1, 64).is_err());
        assert!(stable_partition(5, 3).is_err(), "not a power of two");
    }

    #[test]
    fn sequences_wrap_as_kafka_wraps_them() {
        assert_eq!(wire_sequence(i32::MAX as i64), i32::MAX);
        assert_eq!(wire_sequence(i32::MAX as i64 + 1), 0);
        assert_eq!(wire_sequence(-1), i32::MAX);
    }
}
