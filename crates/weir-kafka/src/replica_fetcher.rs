//! Followers replicate with Kafka's Fetch, as Kafka's replica fetcher threads do.
//!
//! A follower runs one fetcher per leader broker it follows partitions of. Each fetcher sends
//! Fetch v12 requests to the leader's Kafka listener, naming this broker as the replica (the
//! leader reads up to its log end, not the high watermark, takes each fetch offset as this
//! replica's log end, and sends the file ranges with `sendfile`, as for any consumer). For each
//! partition the request carries the leader epoch the follower knows (a stale one gets
//! FENCED_LEADER_EPOCH) and the epoch of its last batch, so the leader can answer with a
//! diverging epoch when their logs differ (KIP-320 / KIP-595's truncation in the fetch path):
//! the follower then truncates to where they agree and fetches again.
//!
//! The broker core does the writing (`Broker::append_as_follower`, `truncate_follower`): this
//! module only speaks the protocol. The fetchers follow the metadata: a new leader starts a
//! fetcher, and one whose partitions all moved away ends.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ReplicaState};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, FetchResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::ResponseError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use weir_broker::partition::Partition;
use weir_broker::replication::Followed;
use weir_broker::Broker;

/// The Fetch version followers send: the first with diverging epochs, and topics by name.
const FETCH_VERSION: i16 = 12;
/// Most bytes in one fetch response over all partitions (Kafka's `replica.fetch.response.max.bytes`).
const RESPONSE_MAX_BYTES: i32 = 10 * 1024 * 1024;
/// Pause after a failed connection or a round in which every partition failed.
const BACKOFF: Duration = Duration::from_millis(200);

/// Runs the fetchers of `broker` until it shuts down.
pub fn spawn(broker: Arc<Broker>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut metadata = broker.subscribe_metadata();
        let mut shutdown = broker.shutdown_signal();
        let mut fetchers: HashMap<i32, JoinHandle<()>> = HashMap::new();
        loop {
            let leaders: std::collections::BTreeSet<i32> =
                broker.followed_partitions().iter().map(|f| f.leader).collect();
            fetchers.retain(|_, task| !task.is_finished());
            for leader in leaders {
                fetchers.entry(leader).or_insert_with(|| tokio::spawn(run_fetcher(broker.clone(), leader)));
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

/// Replicates every partition `leader` leads and this broker follows, until there is none.
async fn run_fetcher(broker: Arc<Broker>, leader: i32) {
    let me = broker.config.node_id;
    let client_id = format!("weir-replica-fetcher-{me}-from-{leader}");
    let mut connection: Option<TcpStream> = None;
    let mut correlation_id = 0i32;
    let mut stalls = Stalls::default();
    let whole_connection = (String::new(), -1);
    tracing::info!(leader, "replica fetcher started");
    loop {
        if broker.is_shutting_down() {
            return;
        }
        let followed: Vec<Followed> = broker.followed_partitions().into_iter().filter(|f| f.leader == leader).collect();
        if followed.is_empty() {
            tracing::info!(leader, "replica fetcher stopped: no partition to follow from this leader");
            return;
        }
        let Some(addr) = broker.metadata().brokers.get(&leader).map(|b| format!("{}:{}", b.host, b.port)) else {
            tokio::time::sleep(BACKOFF).await;
            continue;
        };
        let connect = async { TcpStream::connect(&addr).await.map_err(|e| e.to_string()) };
        let mut stream = match connection.take() {
            Some(stream) => stream,
            None => match within(Duration::from_secs(2), connect).await {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    stream
                }
                Err(e) => {
                    stalls.stuck(leader, whole_connection.clone(), &format!("cannot connect to {addr}: {e}"));
                    tokio::time::sleep(BACKOFF).await;
                    continue;
                }
            },
        };
        // A reassignment's copy pauses while this follower's throttle budget is spent.
        let followed: Vec<Followed> = if broker.replication_quotas.follower.exceeded() {
            followed.into_iter().filter(|f| !f.partition.throttled_as_follower()).collect()
        } else {
            followed
        };
        if followed.is_empty() {
            connection = Some(stream);
            tokio::time::sleep(BACKOFF / 10).await;
            continue;
        }
        let throttled: Vec<PartitionKey> = followed
            .iter()
            .filter(|f| f.partition.throttled_as_follower())
            .map(|f| (f.partition.topic.clone(), f.partition.index))
            .collect();
        correlation_id = correlation_id.wrapping_add(1);
        let request = fetch_request(&broker, &followed);
        let wait = Duration::from_millis(broker.config.replica_fetch_wait_max_ms)
            + Duration::from_millis(broker.config.quorum_request_timeout_ms);
        let response = match within(wait, exchange(&mut stream, &client_id, correlation_id, &request)).await {
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
        let by_name: BTreeMap<(String, i32), Arc<Partition>> =
            followed.iter().map(|f| ((f.partition.topic.clone(), f.partition.index), f.partition.clone())).collect();
        let broker2 = broker.clone();
        let keys: Vec<(String, i32)> = by_name.keys().cloned().collect();
        let applied = tokio::task::spawn_blocking(move || apply_response(&broker2, &by_name, response)).await;
        match applied {
            Ok(Ok(stuck)) => {
                for key in keys.iter().filter(|k| !stuck.iter().any(|(s, _)| s == *k)) {
                    stalls.fine(key);
                }
                // A stuck partition makes the leader answer at once (no long poll): pause
                // briefly so that the fetcher does not spin, and longer when nothing moved.
                let pause = match stuck.len() {
                    0 => None,
                    n if n == keys.len() => Some(BACKOFF),
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
                tokio::time::sleep(BACKOFF).await;
            }
        }
    }
}

/// `work`, or an error once `limit` passes.
async fn within<T>(limit: Duration, work: impl std::future::Future<Output = Result<T, String>>) -> Result<T, String> {
    tokio::time::timeout(limit, work).await.unwrap_or_else(|_| Err(format!("no answer within {limit:?}")))
}

/// A Fetch for every followed partition, from its log end.
fn fetch_request(broker: &Broker, followed: &[Followed]) -> FetchRequest {
    let me = broker.config.node_id;
    let mut topics: BTreeMap<String, Vec<FetchPartition>> = BTreeMap::new();
    for f in followed {
        let log = &f.partition.log;
        let last_fetched_epoch = log.latest_leader_epoch().ok().flatten().unwrap_or(-1);
        topics.entry(f.partition.topic.clone()).or_default().push(
            FetchPartition::default()
                .with_partition(f.partition.index)
                .with_current_leader_epoch(f.leader_epoch)
                .with_fetch_offset(log.log_end_offset())
                .with_last_fetched_epoch(last_fetched_epoch)
                .with_log_start_offset(log.log_start_offset())
                .with_partition_max_bytes(broker.config.replica_fetch_max_bytes),
        );
    }
    FetchRequest::default()
        .with_replica_id(BrokerId(me))
        .with_replica_state(ReplicaState::default().with_replica_id(BrokerId(me)))
        .with_max_wait_ms(broker.config.replica_fetch_wait_max_ms.min(i32::MAX as u64) as i32)
        .with_min_bytes(1)
        .with_max_bytes(RESPONSE_MAX_BYTES)
        .with_isolation_level(0)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(
            topics
                .into_iter()
                .map(|(name, partitions)| {
                    FetchTopic::default().with_topic(TopicName(StrBytes::from_string(name))).with_partitions(partitions)
                })
                .collect(),
        )
}

/// Writes one request frame and reads its response.
async fn exchange(
    stream: &mut TcpStream,
    client_id: &str,
    correlation_id: i32,
    request: &FetchRequest,
) -> Result<FetchResponse, String> {
    let header = RequestHeader::default()
        .with_request_api_key(ApiKey::Fetch as i16)
        .with_request_api_version(FETCH_VERSION)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_string(client_id.to_string())));
    let mut body = BytesMut::new();
    header.encode(&mut body, ApiKey::Fetch.request_header_version(FETCH_VERSION)).map_err(|e| e.to_string())?;
    request.encode(&mut body, FETCH_VERSION).map_err(|e| e.to_string())?;
    let mut frame = BytesMut::with_capacity(body.len() + 4);
    frame.put_i32(body.len() as i32);
    frame.extend_from_slice(&body);
    stream.write_all(&frame).await.map_err(|e| e.to_string())?;

    let size = stream.read_i32().await.map_err(|e| e.to_string())?;
    // A response holds at most the request's bytes plus per-partition overhead.
    if size < 0 || size as usize > RESPONSE_MAX_BYTES as usize * 2 + (1 << 20) {
        return Err(format!("response frame of {size} bytes"));
    }
    let mut buf = vec![0u8; size as usize];
    stream.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
    let mut buf = Bytes::from(buf);
    let header = ResponseHeader::decode(&mut buf, ApiKey::Fetch.response_header_version(FETCH_VERSION))
        .map_err(|e| e.to_string())?;
    if header.correlation_id != correlation_id {
        return Err(format!("correlation id {} in answer to {correlation_id}", header.correlation_id));
    }
    let response = FetchResponse::decode(&mut buf, FETCH_VERSION).map_err(|e| e.to_string())?;
    if buf.has_remaining() {
        tracing::debug!(left = buf.remaining(), "replica fetcher: bytes after the fetch response");
    }
    Ok(response)
}

/// A partition by topic name and index.
type PartitionKey = (String, i32);

/// The record bytes `response` carries for the `throttled` partitions.
fn throttled_bytes(response: &FetchResponse, throttled: &[PartitionKey]) -> u64 {
    response
        .responses
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |p| (t.topic.as_str(), p)))
        .filter(|(topic, p)| throttled.iter().any(|(t, i)| t == topic && *i == p.partition_index))
        .map(|(_, p)| p.records.as_ref().map_or(0, |r| r.len() as u64))
        .sum()
}

/// Applies a leader's answer to the followed partitions. Returns the partitions that made no
/// progress and why. Blocking.
fn apply_response(
    broker: &Broker,
    partitions: &BTreeMap<(String, i32), Arc<Partition>>,
    response: FetchResponse,
) -> Result<Vec<(PartitionKey, String)>, String> {
    if response.error_code != 0 {
        return Err(format!("the leader refused the fetch: error {}", response.error_code));
    }
    let mut stuck = Vec::new();
    for topic in response.responses {
        let name = topic.topic.to_string();
        for data in topic.partitions {
            let key = (name.clone(), data.partition_index);
            let Some(partition) = partitions.get(&key) else { continue };
            if let Err(why) = apply_partition(broker, partition, data) {
                stuck.push((key, why));
            }
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
}

/// One partition of a fetch response: append, truncate, or start over. `Err` says why the
/// partition made no progress (an error that needs a metadata change, or a truncation held at
/// the learned high watermark), so the fetcher backs off and reports it if it lasts.
fn apply_partition(
    broker: &Broker,
    partition: &Partition,
    data: kafka_protocol::messages::fetch_response::PartitionData,
) -> Result<(), String> {
    match ResponseError::try_from_code(data.error_code) {
        None => {}
        Some(ResponseError::OffsetOutOfRange) => {
            let fetch_offset = partition.log.log_end_offset();
            if data.log_start_offset >= 0 && fetch_offset < data.log_start_offset {
                broker.restart_follower_at(partition, data.log_start_offset).map_err(|e| e.to_string())?;
            } else if data.high_watermark >= 0 {
                // Past the leader's log end (it lost a tail in an unclean election):
                // truncate to what it acknowledged.
                broker.truncate_follower(partition, data.high_watermark).map_err(|e| e.to_string())?;
            }
            return Ok(());
        }
        Some(error) => return Err(format!("the leader answered {error:?}")),
    }
    let diverging = &data.diverging_epoch;
    if diverging.epoch >= 0 || diverging.end_offset >= 0 {
        let target = if diverging.epoch < 0 {
            partition.known_high_watermark()
        } else {
            let (my_epoch, my_end) = partition.log.end_offset_for_epoch(diverging.epoch).map_err(|e| e.to_string())?;
            if my_epoch == diverging.epoch {
                my_end.min(diverging.end_offset)
            } else {
                // This log lacks the leader's epoch: go back to the end of the last epoch it
                // has below it, and compare again at the next fetch.
                my_end
            }
        };
        let epoch_of = |p: &Partition| p.log.latest_leader_epoch().ok().flatten();
        let before = (partition.log.log_end_offset(), epoch_of(partition));
        broker.truncate_follower(partition, target.max(0)).map_err(|e| e.to_string())?;
        if (partition.log.log_end_offset(), epoch_of(partition)) == before {
            return Err(format!(
                "diverged at epoch {} (leader's end {}), but nothing below the learned high watermark may be cut",
                diverging.epoch, diverging.end_offset
            ));
        }
        return Ok(());
    }
    let records = data.records.unwrap_or_default();
    let whole = weir_broker::storage::batch::whole_batches_len(&records);
    broker.append_as_follower(partition, &records[..whole], data.high_watermark).map_err(|e| e.to_string())?;
    Ok(())
}
