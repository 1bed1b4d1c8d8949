//! The follower's side of ISR replication: every partition this broker follows is kept in
//! step with its leader by a fetcher, one per leader broker, as Kafka's replica fetcher threads
//! do.
//!
//! A fetcher asks the leader for everything after its log end, naming this broker as the
//! replica (the leader reads up to its log end, not the high watermark, and takes each fetch
//! offset as this replica's log end). For each partition the request carries the leader epoch
//! the follower knows (a stale one is refused) and the epoch of its last batch, so the leader
//! can answer with a diverging epoch when their logs differ (KIP-320 / KIP-595's truncation in
//! the fetch path): the follower then truncates to where they agree and fetches again. Records
//! are appended with the leader's offsets and epochs (`Broker::append_as_follower`).
//!
//! What crosses the wire is a front-end's: followers speak Kafka's Fetch to the leader's Kafka
//! listener (so the leader serves them with the consumers' zero-copy path), which `weir-kafka`
//! implements as a [`ReplicaTransport`]. Everything else is here: which partitions to fetch and
//! from where, throttling, what an answer means for the log, and reporting what lasts. The
//! fetchers follow the metadata: a new leader starts a fetcher, and one whose partitions all
//! moved away ends.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::task::JoinHandle;

use weir_storage::{AppendInfo, FlushPolicy};

use crate::error::BrokerError;
use crate::partition::Partition;
use crate::Broker;

/// A future of a transport (boxed: the transport is a trait object).
pub type TransportFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How a follower reaches its leaders.
pub trait ReplicaTransport: Send + Sync + 'static {
    /// Connects to the leader whose client listener is `addr` (`host:port`).
    fn connect(&self, addr: &str) -> TransportFuture<'static, Result<Box<dyn ReplicaConnection>, String>>;
}

/// One connection to a leader.
pub trait ReplicaConnection: Send {
    /// Sends `request` and waits for the leader's answer (the caller bounds the wait).
    fn fetch<'a>(&'a mut self, request: &'a FollowerFetch) -> TransportFuture<'a, Result<LeaderAnswer, String>>;
}

/// A follower's fetch: from each followed partition's log end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowerFetch {
    /// This broker, the replica fetching.
    pub replica: i32,
    /// How long the leader may wait for new records before it answers.
    pub max_wait_ms: u64,
    /// Most record bytes in the answer, all partitions together.
    pub max_bytes: i32,
    pub partitions: Vec<FetchFrom>,
    /// Which list of partitions this is: the same generation means the same partitions in the
    /// same order as the fetch before, with only the `touched` ones possibly moved.
    pub generation: u64,
    /// Indexes in `partitions` whose position may have changed since the previous fetch of
    /// this generation; `None`: any may have.
    pub touched: Option<Vec<usize>>,
    /// Indexes in `partitions` to name to the leader even if their position did not move: the
    /// last answer for them could not be applied (dropped as stale, or refused). A fetch
    /// session's leader reads only the partitions a fetch names and those it marked: it marks
    /// again those whose answer had records or an error, but not one that answered a diverging
    /// epoch, so such an answer, once dropped, would not come again until the partition's next
    /// append (which an acks=all producer waiting for this very follower never sends).
    pub retry: Vec<usize>,
}

/// Where to fetch one partition from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchFrom {
    pub topic: String,
    pub partition: i32,
    /// The leader epoch the follower knows: a leader at another epoch refuses.
    pub current_leader_epoch: i32,
    /// The follower's log end.
    pub fetch_offset: i64,
    /// The epoch of the follower's last batch (`None` for an empty log): how the leader tells
    /// it has diverged.
    pub last_fetched_epoch: Option<i32>,
    pub log_start_offset: i64,
    /// Most record bytes for this partition.
    pub max_bytes: i32,
}

/// The leader's answer.
#[derive(Debug, Clone, Default)]
pub struct LeaderAnswer {
    /// The whole fetch was refused (the message says why).
    pub refused: Option<String>,
    pub partitions: Vec<LeaderPartition>,
}

/// The leader's answer for one partition.
#[derive(Debug, Clone, Default)]
pub struct LeaderPartition {
    pub topic: String,
    pub partition: i32,
    pub error: Option<LeaderError>,
    /// `None` when the leader does not say.
    pub high_watermark: Option<i64>,
    /// `None` when the leader does not say.
    pub log_start_offset: Option<i64>,
    /// Where the logs diverge, when they do: the leader's end of that epoch.
    pub diverging: Option<DivergingEpoch>,
    /// Whole batches, or a trailing partial one (cut by the byte limit).
    pub records: Bytes,
}

/// Where a follower's log and the leader's part: `epoch` (`None` when the leader has none in
/// common with the follower) ends at `end_offset` on the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DivergingEpoch {
    pub epoch: Option<i32>,
    pub end_offset: i64,
}

/// Why the leader did not serve a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderError {
    /// The fetch offset is outside the leader's log.
    OffsetOutOfRange,
    /// The fetch offset is in the leader's tiered log, but only the object store holds it: the
    /// follower starts where the store ends instead of copying it (KIP-405).
    MovedToTieredStorage,
    /// Anything else (not the leader any more, a stale epoch, ...), by name.
    Other(String),
}

/// Most bytes in one fetch answer over all partitions (Kafka's `replica.fetch.response.max.bytes`).
const RESPONSE_MAX_BYTES: i32 = 10 * 1024 * 1024;
/// Pause after a failed connection or a round in which every partition failed.
const BACKOFF: Duration = Duration::from_millis(200);
/// Runs the fetchers of `broker`, reaching the leaders through `transport`, until it shuts
/// down.
pub fn spawn(broker: Arc<Broker>, transport: Arc<dyn ReplicaTransport>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut metadata = broker.subscribe_metadata();
        let mut shutdown = broker.shutdown_signal();
        let mut fetchers: HashMap<i32, JoinHandle<()>> = HashMap::new();
        loop {
            let leaders = broker.followed_leaders();
            fetchers.retain(|_, task| !task.is_finished());
            for leader in leaders {
                fetchers
                    .entry(leader)
                    .or_insert_with(|| tokio::spawn(run_fetcher(broker.clone(), transport.clone(), leader)));
            }
            tokio::select! {
                changed = metadata.changed() => if changed.is_err() { return },
                _ = shutdown.changed() => return,
                // A fetcher that ended while its leader still leads something is restarted.
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    })
}

/// How long a fetcher keeps its list of partitions and their positions without looking at
/// every partition again: it rebuilds it at once on a metadata change, and this often anyway
/// (a follower's log start moved by its own retention is seen then).
const PLAN_REFRESH: Duration = Duration::from_secs(10);

/// What a fetcher fetches: its partitions and their positions, kept between rounds so that an
/// idle round does not look at every partition (see [`FollowerFetch::touched`]).
struct Plan {
    partitions: Arc<Vec<Arc<Partition>>>,
    fetch: FollowerFetch,
    /// Index in `partitions` by topic and partition.
    index: HashMap<(String, i32), usize>,
    built: Instant,
}

/// Replicates every partition `leader` leads and this broker follows, until there is none.
async fn run_fetcher(broker: Arc<Broker>, transport: Arc<dyn ReplicaTransport>, leader: i32) {
    let mut connection: Option<Box<dyn ReplicaConnection>> = None;
    let mut stalls = Stalls::default();
    let whole_connection = (String::new(), -1);
    let mut metadata = broker.subscribe_metadata();
    let mut plan: Option<Plan> = None;
    let mut generation: u64 = 0;
    tracing::info!(leader, "replica fetcher started");
    loop {
        if broker.is_shutting_down() {
            return;
        }
        // A throttled follower decides per round which partitions it fetches: no plan kept.
        let limited = broker.replication_quotas.follower.is_limited();
        let stale = match &plan {
            None => true,
            Some(plan) => limited || metadata.has_changed().unwrap_or(true) || plan.built.elapsed() >= PLAN_REFRESH,
        };
        if stale {
            metadata.borrow_and_update();
            let followed = broker.followed_from(leader);
            if followed.is_empty() {
                tracing::info!(leader, "replica fetcher stopped: no partition to follow from this leader");
                return;
            }
            // A reassignment's copy pauses while this follower's throttle budget is spent.
            let followed: Vec<Arc<Partition>> = if broker.replication_quotas.follower.exceeded() {
                followed.into_iter().filter(|p| !p.throttled_as_follower()).collect()
            } else {
                followed
            };
            generation += 1;
            let mut fetch = fetch_request(&broker, &followed);
            fetch.generation = generation;
            let index = followed.iter().enumerate().map(|(i, p)| ((p.topic.clone(), p.index), i)).collect();
            plan = Some(Plan { partitions: Arc::new(followed), fetch, index, built: Instant::now() });
        }
        let Some(current) = plan.as_mut() else { continue };
        let Some(addr) = broker.metadata().brokers.get(&leader).map(|b| format!("{}:{}", b.host, b.port)) else {
            tokio::time::sleep(BACKOFF).await;
            continue;
        };
        let mut stream = match connection.take() {
            Some(stream) => stream,
            None => match within(Duration::from_secs(2), transport.connect(&addr)).await {
                Ok(stream) => stream,
                Err(e) => {
                    stalls.stuck(leader, whole_connection.clone(), &format!("cannot connect to {addr}: {e}"));
                    tokio::time::sleep(BACKOFF).await;
                    continue;
                }
            },
        };
        if current.partitions.is_empty() {
            connection = Some(stream);
            plan = None;
            tokio::time::sleep(BACKOFF / 10).await;
            continue;
        }
        // Counted only under a follower throttle: an idle round over thousands of partitions
        // should not look up each one's throttle to count nothing.
        let throttled: Vec<PartitionKey> = if limited {
            current
                .partitions
                .iter()
                .filter(|p| p.throttled_as_follower())
                .map(|p| (p.topic.clone(), p.index))
                .collect()
        } else {
            Vec::new()
        };
        let wait = Duration::from_millis(broker.config.replica_fetch_wait_max_ms)
            + Duration::from_millis(broker.config.quorum_request_timeout_ms);
        let response = match within(wait, stream.fetch(&current.fetch)).await {
            Ok(response) => response,
            Err(e) => {
                stalls.stuck(leader, whole_connection.clone(), &format!("fetch from {addr} failed: {e}"));
                tokio::time::sleep(BACKOFF).await;
                continue;
            }
        };
        stalls.fine(&whole_connection);
        connection = Some(stream);
        if !throttled.is_empty() {
            broker.replication_quotas.follower.record(throttled_bytes(&response, &throttled));
        }
        // The partitions the answer names are the ones whose position may move now; each is
        // applied only while `leader` still leads it at the epoch this fetch asked for.
        let mut touched = Vec::with_capacity(response.partitions.len());
        // In the answer's order: the leader and leader epoch each partition was fetched at.
        let mut asked = Vec::with_capacity(response.partitions.len());
        for p in &response.partitions {
            let i = current.index.get(&(p.topic.clone(), p.partition)).copied();
            touched.extend(i);
            asked.push(i.map(|i| (leader, current.fetch.partitions[i].current_leader_epoch)));
        }
        let broker2 = broker.clone();
        let followed = current.partitions.clone();
        let fetched = followed.len();
        let applied = tokio::task::spawn_blocking(move || apply_response(&broker2, &followed, response, &asked)).await;
        for &i in &touched {
            if let Some(partition) = current.partitions.get(i) {
                current.fetch.partitions[i] = fetch_from(&broker, partition);
            }
        }
        current.fetch.touched = Some(touched);
        current.fetch.retry.clear();
        match applied {
            Ok(Ok(stuck)) => {
                stalls.fine_but(&stuck);
                current.fetch.retry.extend(stuck.iter().filter_map(|(key, _)| current.index.get(key).copied()));
                // A stuck partition makes the leader answer at once (no long poll): pause
                // briefly so that the fetcher does not spin, and longer when nothing moved.
                let pause = match stuck.len() {
                    0 => None,
                    n if n == fetched => Some(BACKOFF),
                    _ => Some(BACKOFF / 10),
                };
                for (key, why) in stuck {
                    stalls.stuck(leader, key, &why);
                }
                if let Some(pause) = pause {
                    tokio::time::sleep(pause).await;
                }
            }
            Ok(Err(why)) => {
                stalls.stuck(leader, whole_connection.clone(), &why);
                tokio::time::sleep(BACKOFF).await;
            }
            Err(e) => {
                tracing::error!(leader, error = %e, "replica fetcher: applying a response failed");
                plan = None;
                // A new connection: its first fetch names every partition again.
                connection = None;
                tokio::time::sleep(BACKOFF).await;
            }
        }
    }
}

/// `work`, or an error once `limit` passes.
async fn within<T>(limit: Duration, work: impl std::future::Future<Output = Result<T, String>>) -> Result<T, String> {
    tokio::time::timeout(limit, work).await.unwrap_or_else(|_| Err(format!("no answer within {limit:?}")))
}

/// A fetch of every followed partition, from its log end, at the leader epoch this broker
/// knows.
fn fetch_request(broker: &Broker, followed: &[Arc<Partition>]) -> FollowerFetch {
    FollowerFetch {
        replica: broker.config.node_id,
        max_wait_ms: broker.config.replica_fetch_wait_max_ms,
        max_bytes: RESPONSE_MAX_BYTES,
        partitions: followed.iter().map(|partition| fetch_from(broker, partition)).collect(),
        generation: 0,
        touched: None,
        retry: Vec::new(),
    }
}

/// Where to fetch `partition` from now: its log end, at the leader epoch this broker knows.
fn fetch_from(broker: &Broker, partition: &Partition) -> FetchFrom {
    let log = &partition.log;
    FetchFrom {
        topic: partition.topic.clone(),
        partition: partition.index,
        current_leader_epoch: partition.leader_epoch(),
        fetch_offset: log.log_end_offset(),
        last_fetched_epoch: log.latest_leader_epoch().ok().flatten(),
        log_start_offset: log.log_start_offset(),
        max_bytes: broker.config.replica_fetch_max_bytes,
    }
}

/// A partition by topic name and index.
type PartitionKey = (String, i32);

/// The record bytes `response` carries for the `throttled` partitions.
fn throttled_bytes(response: &LeaderAnswer, throttled: &[PartitionKey]) -> u64 {
    response
        .partitions
        .iter()
        .filter(|p| throttled.iter().any(|(t, i)| *t == p.topic && *i == p.partition))
        .map(|p| p.records.len() as u64)
        .sum()
}

/// Applies a leader's answer to the followed partitions. `asked` gives, for each partition of
/// the answer in its order, the leader and leader epoch its fetch was sent for (`None`: not
/// fetched). Returns the partitions that made no progress and why. Blocking.
fn apply_response(
    broker: &Broker,
    fetched: &[Arc<Partition>],
    response: LeaderAnswer,
    asked: &[Option<(i32, i32)>],
) -> Result<Vec<(PartitionKey, String)>, String> {
    if let Some(why) = response.refused {
        return Err(format!("the leader refused the fetch: {why}"));
    }
    // An idle round through a fetch session answers nothing: no map of every partition then.
    if response.partitions.is_empty() {
        return Ok(Vec::new());
    }
    // Borrowed keys: a round over thousands of idle partitions allocates no name per partition.
    let partitions: HashMap<(&str, i32), &Arc<Partition>> =
        fetched.iter().map(|p| ((p.topic.as_str(), p.index), p)).collect();
    let mut stuck = Vec::new();
    for (data, from) in response.partitions.into_iter().zip(asked) {
        let Some(partition) = partitions.get(&(data.topic.as_str(), data.partition)) else { continue };
        let Some(from) = *from else { continue };
        let key = (data.topic.clone(), data.partition);
        if let Err(why) = apply_partition(broker, partition, from, data) {
            stuck.push((key, why));
        }
    }
    Ok(stuck)
}

/// Problems that last: a follower that cannot replicate a partition says so once it has not
/// for `REPORT_AFTER`, and again every `REPORT_EVERY`, instead of at every fetch.
#[derive(Default)]
struct Stalls {
    /// By partition (or `("", -1)` for the whole connection): since when, last reported.
    since: HashMap<(String, i32), (Instant, Option<Instant>)>,
}

const REPORT_AFTER: Duration = Duration::from_secs(5);
const REPORT_EVERY: Duration = Duration::from_secs(30);

impl Stalls {
    fn stuck(&mut self, leader: i32, key: (String, i32), why: &str) {
        let now = Instant::now();
        let (since, reported) = self.since.entry(key.clone()).or_insert((now, None));
        let due = now.duration_since(*since) >= REPORT_AFTER
            && reported.is_none_or(|at| now.duration_since(at) >= REPORT_EVERY);
        if due {
            *reported = Some(now);
            let seconds = now.duration_since(*since).as_secs();
            if key.1 < 0 {
                tracing::warn!(leader, seconds, "replica fetcher: cannot fetch from the leader: {why}");
            } else {
                tracing::warn!(leader, topic = %key.0, partition = key.1, seconds, "replica fetcher: not replicating: {why}");
            }
        }
    }

    fn fine(&mut self, key: &(String, i32)) {
        self.since.remove(key);
    }

    /// A round went through: every partition made progress but the `stuck` ones. Looks at
    /// the problems on record only, not at every partition of the round.
    fn fine_but(&mut self, stuck: &[(PartitionKey, String)]) {
        self.since.retain(|key, _| key.1 < 0 || stuck.iter().any(|(s, _)| s == key));
    }
}

/// One partition of a fetch response: append, truncate, or start over. `Err` says why the
/// partition made no progress (an error that needs a metadata change, or a truncation held at
/// the learned high watermark), so the fetcher backs off and reports it if it lasts.
/// `from` is the leader and leader epoch the fetch was sent for: an answer that comes after
/// either changed writes nothing.
fn apply_partition(
    broker: &Broker,
    partition: &Partition,
    from: (i32, i32),
    data: LeaderPartition,
) -> Result<(), String> {
    match data.error {
        None => {}
        Some(LeaderError::OffsetOutOfRange) => {
            let fetch_offset = partition.log.log_end_offset();
            match (data.log_start_offset, data.high_watermark) {
                (Some(log_start), _) if fetch_offset < log_start => {
                    broker.restart_follower_at(partition, from, log_start).map_err(|e| e.to_string())?;
                }
                // Past the leader's log end (it lost a tail in an unclean election):
                // truncate to what it acknowledged.
                (_, Some(high_watermark)) => {
                    broker
                        .truncate_follower(partition, from, high_watermark, "past the leader's log end")
                        .map_err(|e| e.to_string())?;
                }
                _ => {}
            }
            return Ok(());
        }
        Some(LeaderError::MovedToTieredStorage) => {
            let leader_log_start = data.log_start_offset.unwrap_or(0);
            broker.restart_follower_from_store(partition, from, leader_log_start).map_err(|e| e.to_string())?;
            return Ok(());
        }
        Some(LeaderError::Other(error)) => return Err(format!("the leader answered {error}")),
    }
    if let Some(diverging) = data.diverging {
        let target = match diverging.epoch {
            None => partition.known_high_watermark(),
            Some(epoch) => {
                let (my_epoch, my_end) = partition.log.end_offset_for_epoch(epoch).map_err(|e| e.to_string())?;
                if my_epoch == epoch {
                    my_end.min(diverging.end_offset)
                } else {
                    // This log lacks the leader's epoch: go back to the end of the last epoch it
                    // has below it, and compare again at the next fetch.
                    my_end
                }
            }
        };
        let epoch_of = |p: &Partition| p.log.latest_leader_epoch().ok().flatten();
        let before = (partition.log.log_end_offset(), epoch_of(partition));
        let why = match diverging.epoch {
            Some(epoch) => format!("the leader's epoch {epoch} ends at {}", diverging.end_offset),
            None => "no epoch in common with the leader".to_string(),
        };
        broker.truncate_follower(partition, from, target.max(0), &why).map_err(|e| e.to_string())?;
        if (partition.log.log_end_offset(), epoch_of(partition)) == before {
            return Err(format!(
                "diverged at epoch {:?} (leader's end {}), but nothing below the learned high watermark may be cut",
                diverging.epoch, diverging.end_offset
            ));
        }
        return Ok(());
    }
    let records = data.records;
    let whole = weir_storage::batch::whole_batches_len(&records);
    broker.append_as_follower(partition, from, &records[..whole], data.high_watermark).map_err(|e| e.to_string())?;
    if let Some(leader_log_start) = data.log_start_offset {
        follow_log_start(partition, leader_log_start).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Moves a follower's log start up to the leader's, as far as the high watermark it learned:
/// what DeleteRecords or an owner's trimming (the timer's) removed at the leader is gone here
/// too, so a failover never brings it back. Retention runs on each replica by itself; this
/// only catches up with a leader that went further.
fn follow_log_start(partition: &Partition, leader_log_start: i64) -> Result<(), BrokerError> {
    let log = &partition.log;
    let target = leader_log_start.min(partition.known_high_watermark()).min(log.log_end_offset());
    if target > log.log_start_offset() {
        log.delete_records_before(target)?;
    }
    Ok(())
}

impl Broker {
    /// Writes the leader's batches to a partition this broker follows from `from` (leader,
    /// leader epoch), keeping their offsets and epochs, fsyncs them with `flush=sync` (a
    /// replica's position counts only once it is as durable as the topic promises), and takes
    /// the leader's high watermark as far as the log reaches. Blocking.
    pub(crate) fn append_as_follower(
        &self,
        partition: &Partition,
        from: (i32, i32),
        records: &[u8],
        leader_high_watermark: Option<i64>,
    ) -> Result<Option<AppendInfo>, BrokerError> {
        // Under the state: it may have become the leader, or another broker may lead now.
        let info = partition.write_as_follower(from.0, from.1, || {
            let info = if records.is_empty() {
                None
            } else {
                Some(partition.log.append_replicated(records).map_err(BrokerError::from)?)
            };
            if let Some(leader_high_watermark) = leader_high_watermark {
                partition.follow_high_watermark(leader_high_watermark);
            }
            Ok::<_, BrokerError>(info)
        })?;
        if let Some(info) = &info {
            if partition.log.config().flush == FlushPolicy::Sync {
                partition.log.sync_to(info.last_offset + 1)?;
            }
        }
        Ok(info)
    }

    /// Cuts a follower's log back to `offset`, where it diverges from the leader's (`from`:
    /// leader, leader epoch), but never below the high watermark it learned: an acknowledged
    /// record is never removed. Returns the new log end. Blocking.
    pub(crate) fn truncate_follower(
        &self,
        partition: &Partition,
        from: (i32, i32),
        offset: i64,
        why: &str,
    ) -> Result<i64, BrokerError> {
        // Under the state: a replica that became the leader meanwhile must not cut its log.
        partition.write_as_follower(from.0, from.1, || Self::truncate_diverged(partition, from, offset, why))
    }

    fn truncate_diverged(partition: &Partition, from: (i32, i32), offset: i64, why: &str) -> Result<i64, BrokerError> {
        let floor = partition.known_high_watermark().min(partition.log.log_end_offset());
        let target = if offset < floor {
            tracing::error!(
                topic = %partition.topic,
                partition = partition.index,
                offset,
                high_watermark = floor,
                "the leader's log ends below the high watermark this replica learned (an unclean election?); \
                 keeping what is below the high watermark"
            );
            floor
        } else {
            offset
        };
        if target < partition.log.log_end_offset() {
            let last_epoch = partition.log.latest_leader_epoch().ok().flatten();
            tracing::info!(
                topic = %partition.topic,
                partition = partition.index,
                from = partition.log.log_end_offset(),
                to = target,
                last_epoch,
                leader = from.0,
                leader_epoch = from.1,
                "truncating a diverged follower log: {why}"
            );
        }
        // Also at the log end: that drops the epochs that begin there without a batch.
        Ok(partition.log.truncate_to(target)?)
    }

    /// Empties a follower's log and starts it at `offset`: it fell behind the leader's log start
    /// (retention deleted what it lacks). Blocking.
    pub(crate) fn restart_follower_at(
        &self,
        partition: &Partition,
        from: (i32, i32),
        offset: i64,
    ) -> Result<(), BrokerError> {
        partition.write_as_follower(from.0, from.1, || {
            tracing::warn!(topic = %partition.topic, partition = partition.index, offset, "follower behind the leader's log start: starting over there");
            Ok(partition.log.truncate_fully_and_start_at(offset)?)
        })
    }
}
