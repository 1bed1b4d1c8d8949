//! The HTTP API in a cluster: records of a partition this node does not host are produced and
//! consumed at the broker that leads it, over the cluster's internal RPC, so `POST` and `GET`
//! of records work against any node (as Kafka clients find leaders themselves, HTTP clients
//! should not have to).
//!
//! Requests about a consumer group run at the group's coordinator: [`at_coordinator`] forwards
//! the whole HTTP request there (`admin.http`), where it goes through that node's router as if it
//! had come over HTTP. Lists (groups, partitions) ask every broker and merge.
//!
//! The methods (`admin.append`, `admin.consume`, `admin.partitions`, `admin.offset_at`,
//! `admin.http`, `admin.group_clients`, `admin.lagging_followers`, `admin.delete_records`) are served by every broker, whether its own HTTP
//! listener is on or not: [`register`] is called when the node starts. Errors cross the wire
//! with their HTTP status and name, so a client hears the leader's answer as it is.

use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use tower::ServiceExt as _;
use weir_broker::cluster::{decode_json, encode_json, RemoteError, RpcFuture, RpcHandler};
use weir_broker::fetch::Isolation;
use weir_broker::replication::FollowerLag;
use weir_broker::{Acks, Broker, ErrorKind, OffsetQuery, Partition};
use weir_coordinators::group::clients::ConnectedClient;
use weir_coordinators::group::OFFSETS_TOPIC;

use crate::api::{ConsumedRecord, Encoding, LaggingFollower, PartitionInfo, PartitionPosition, RemoteTier, ReplicaLag};
use crate::error::ApiError;
use crate::{AdminState, SharedState};

const SERVICE: &str = "admin";
const APPEND: &str = "admin.append";
const CONSUME: &str = "admin.consume";
const PARTITIONS: &str = "admin.partitions";
const OFFSET_AT: &str = "admin.offset_at";
const HTTP: &str = "admin.http";
const GROUP_CLIENTS: &str = "admin.group_clients";
const LAGGING_FOLLOWERS: &str = "admin.lagging_followers";
const DELETE_RECORDS: &str = "admin.delete_records";
/// Marks a request another node forwarded: it is answered here, never forwarded again (two
/// nodes whose metadata disagree for a moment must not bounce it between them).
const FORWARDED: &str = "x-weir-forwarded";
/// Largest body of a forwarded request (the API's own body limit).
const FORWARDED_BODY_MAX: usize = crate::BODY_BYTES_MAX;

/// Where a partition's records are read and written.
pub(crate) enum Location {
    /// On this broker, which leads it.
    Here(Arc<Partition>),
    /// At the broker with this id, which leads it.
    Leader(i32),
}

/// Finds the leader of `topic`-`index`: this broker, another one, or nobody right now (an error
/// for the client). A replica here that follows is no place to read or write: records are
/// appended and read at the leader, as Kafka clients do, whatever this broker hosts.
pub(crate) fn locate(broker: &Broker, topic: &str, index: i32) -> Result<Location, ApiError> {
    let here = broker.partition(topic, index);
    let leader = match &here {
        // The partition's own state: the metadata it was last brought in line with.
        Some(partition) => partition.state().leader,
        None => {
            let metadata = broker.metadata();
            let state = metadata
                .topic(topic)
                .and_then(|t| t.partition(index))
                .ok_or_else(|| ApiError::unknown_partition(topic, index))?;
            state.leader
        }
    };
    match here {
        Some(partition) if leader == broker.config.node_id => Ok(Location::Here(partition)),
        _ if leader < 0 || leader == broker.config.node_id => Err(ApiError::new(
            ErrorKind::LeaderNotAvailable,
            format!("{topic}-{index} has no leader right now; retry shortly"),
        )),
        _ => Ok(Location::Leader(leader)),
    }
}

/// An [`ApiError`] as it crosses the wire.
#[derive(Debug, Serialize, Deserialize)]
struct WireError {
    status: u16,
    code: String,
    message: String,
}

impl From<ApiError> for WireError {
    fn from(e: ApiError) -> WireError {
        WireError { status: e.status.as_u16(), code: e.code, message: e.message }
    }
}

impl From<WireError> for ApiError {
    fn from(e: WireError) -> ApiError {
        ApiError {
            status: StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            code: e.code,
            message: e.message,
        }
    }
}

/// Calls `method` at broker `leader` and decodes its answer. `timeout` bounds the whole call.
async fn call<Req: Serialize, Resp: DeserializeOwned>(
    broker: &Broker,
    leader: i32,
    method: &str,
    request: &Req,
    timeout: Duration,
) -> Result<Resp, ApiError> {
    let body = serde_json::to_vec(request).map_err(|e| ApiError::internal(e.to_string()))?;
    let answer = broker.call_broker(leader, method, Bytes::from(body), timeout).await?;
    let decoded: Result<Resp, WireError> = serde_json::from_slice(&answer)
        .map_err(|e| ApiError::internal(format!("{method}: unreadable answer from broker {leader}: {e}")))?;
    decoded.map_err(ApiError::from)
}

/// Longest an internal call may take beyond the wait the request itself asked for.
fn rpc_timeout(broker: &Broker, wait: Duration) -> Duration {
    wait + Duration::from_millis(broker.config.quorum_request_timeout_ms)
}

#[derive(Debug, Serialize, Deserialize)]
struct AppendCall {
    topic: String,
    partition: i32,
    /// One RecordBatch v2, base64.
    batch: String,
}

/// What an append gave the records: the first one's offset, and the broker's time when the
/// topic stamps LogAppendTime.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct Appended {
    pub(crate) first_offset: i64,
    pub(crate) log_append_time_ms: Option<i64>,
}

/// Appends `batch` with acks=all, here or at the leader.
pub(crate) async fn append(broker: &Broker, topic: &str, index: i32, batch: BytesMut) -> Result<Appended, ApiError> {
    match locate(broker, topic, index)? {
        Location::Here(partition) => append_here(broker, partition, batch).await,
        Location::Leader(leader) => {
            let request = AppendCall { topic: topic.to_string(), partition: index, batch: BASE64.encode(&batch) };
            call(broker, leader, APPEND, &request, rpc_timeout(broker, Duration::ZERO)).await
        }
    }
}

async fn append_here(broker: &Broker, partition: Arc<Partition>, batch: BytesMut) -> Result<Appended, ApiError> {
    let info = broker.append(partition, batch, Acks::All).await?;
    Ok(Appended { first_offset: info.first_offset, log_append_time_ms: info.log_append_time_ms })
}

/// A consume of some partitions of one topic, as the broker hosting them runs it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ConsumeCall {
    pub(crate) topic: String,
    /// Partition and where to start: an offset, `earliest` or `latest`.
    pub(crate) positions: Vec<(i32, String)>,
    pub(crate) max_records: usize,
    pub(crate) max_bytes: u64,
    pub(crate) timeout_ms: u64,
    pub(crate) encoding: Encoding,
}

/// What a consume returned: the records, and a position per partition asked for, in order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Consumed {
    pub(crate) records: Vec<ConsumedRecord>,
    pub(crate) positions: Vec<PartitionPosition>,
}

/// Runs `request` at broker `leader`.
pub(crate) async fn consume_at(broker: &Broker, leader: i32, request: &ConsumeCall) -> Result<Consumed, ApiError> {
    call(broker, leader, CONSUME, request, rpc_timeout(broker, Duration::from_millis(request.timeout_ms))).await
}

/// The `admin.*` methods of a broker's internal RPC.
struct AdminService {
    broker: Weak<Broker>,
    state: Weak<AdminState>,
}

impl AdminService {
    async fn serve(
        broker: Arc<Broker>,
        state: Option<Arc<AdminState>>,
        method: String,
        body: Bytes,
    ) -> Result<Bytes, RemoteError> {
        match method.as_str() {
            PARTITIONS => {
                let topic: String = decode_json(&method, &body)?;
                encode_json(&method, &Ok::<_, WireError>(local_partition_infos(&broker, &topic, true)))
            }
            OFFSET_AT => {
                let (topic, index, timestamp): (String, i32, i64) = decode_json(&method, &body)?;
                let result = offset_at_here(&broker, &topic, index, timestamp).await;
                encode_json(&method, &result.map_err(WireError::from))
            }
            GROUP_CLIENTS => {
                let group: String = decode_json(&method, &body)?;
                let state = state.ok_or_else(|| RemoteError::new("the admin API has stopped"))?;
                let clients = match state.core() {
                    Ok(core) => Ok(core.groups.clients.of_group(&group, broker.now_ms())),
                    Err(e) => Err(WireError::from(e)),
                };
                encode_json(&method, &clients)
            }
            HTTP => {
                let request: HttpCall = decode_json(&method, &body)?;
                let state = state.ok_or_else(|| RemoteError::new("the admin API has stopped"))?;
                let answer = run_forwarded(state, request).await;
                encode_json(&method, &Ok::<_, WireError>(answer))
            }
            APPEND => {
                let request: AppendCall = decode_json(&method, &body)?;
                let result = match (broker.partition(&request.topic, request.partition), BASE64.decode(&request.batch))
                {
                    (None, _) => Err(ApiError::new(
                        ErrorKind::NotLeader,
                        format!(
                            "broker {} does not host {}-{}",
                            broker.config.node_id, request.topic, request.partition
                        ),
                    )),
                    (_, Err(e)) => Err(ApiError::invalid(format!("the forwarded batch is not base64: {e}"))),
                    (Some(partition), Ok(batch)) => append_here(&broker, partition, BytesMut::from(&batch[..])).await,
                };
                encode_json(&method, &result.map_err(WireError::from))
            }
            LAGGING_FOLLOWERS => encode_json(&method, &Ok::<_, WireError>(local_lagging_followers(&broker))),
            DELETE_RECORDS => {
                let (topic, index, point): (String, i32, TrimPoint) = decode_json(&method, &body)?;
                let result = delete_records_here(&broker, &topic, index, point).await;
                encode_json(&method, &result.map_err(WireError::from))
            }
            CONSUME => {
                let request: ConsumeCall = decode_json(&method, &body)?;
                let result = crate::records::consume_here(&broker, request).await;
                encode_json(&method, &result.map_err(WireError::from))
            }
            other => Err(RemoteError::unknown_method(other)),
        }
    }
}

impl RpcHandler for AdminService {
    fn handle(&self, method: &str, body: Bytes) -> RpcFuture<'static, Result<Bytes, RemoteError>> {
        let broker = self.broker.upgrade();
        let state = self.state.upgrade();
        let method = method.to_string();
        Box::pin(async move {
            let broker = broker.ok_or_else(|| RemoteError::new("the broker is shutting down"))?;
            AdminService::serve(broker, state, method, body).await
        })
    }
}

/// Serves the `admin.*` methods on this broker's internal RPC, for the other nodes' HTTP APIs.
pub fn register(state: &Arc<AdminState>, broker: &Arc<Broker>) {
    let service = AdminService { broker: Arc::downgrade(broker), state: Arc::downgrade(state) };
    broker.cluster.register_service(SERVICE, Arc::new(service));
}

// ----- partitions everywhere -----------------------------------------------------------------

/// What this broker knows of the `topic` partitions it hosts; with `led_only`, of those it
/// leads (a follower's offsets trail the leader's, so they are what is asked of a leader).
fn local_partition_infos(broker: &Broker, topic: &str, led_only: bool) -> Vec<PartitionInfo> {
    let count = broker.metadata().topic(topic).map_or(0, |t| t.partitions);
    (0..count)
        .filter_map(|index| broker.partition(topic, index))
        .filter(|p| !led_only || p.state().leader == broker.config.node_id)
        .map(|p| partition_info(broker, &p))
        .collect()
}

fn partition_info(broker: &Broker, p: &Partition) -> PartitionInfo {
    let log = &p.log;
    let state = p.state();
    PartitionInfo {
        partition: p.index,
        leader: state.leader,
        leader_epoch: state.leader_epoch,
        replicas: state.replicas.clone(),
        isr: state.isr.clone(),
        log_start_offset: log.log_start_offset(),
        high_watermark: log.high_watermark(),
        log_end_offset: log.log_end_offset(),
        size_bytes: log.size_bytes(),
        bytes_in_per_sec: p.metrics.load().bytes_in_per_sec,
        bytes_out_per_sec: p.metrics.load().bytes_out_per_sec,
        replica_lags: p.follower_lags(|id| broker.follower_heartbeats.last(id)).into_iter().map(replica_lag).collect(),
        remote: broker.tier_status(p).map(|s| RemoteTier {
            loaded: s.loaded,
            local_log_start_offset: log.local_log_start_offset(),
            remote_start_offset: s.remote_start_offset,
            remote_end_offset: s.remote_end_offset,
            remote_segments: s.remote_segments,
            remote_bytes: s.remote_bytes,
            upload_lag_segments: s.lag_segments,
            upload_lag_bytes: s.lag_bytes,
            upload_failures: s.failures_total,
            compacted_segments: s.compacted_segments_total,
            compacted_records: s.compacted_records_total,
            last_error: s.last_error,
        }),
    }
}

fn replica_lag(lag: FollowerLag) -> ReplicaLag {
    ReplicaLag { replica: lag.replica, offsets_behind: lag.offsets_behind, caught_up_ms_ago: lag.caught_up_ms_ago }
}

/// Every partition of `topic`, by index: as its leader says (this broker, or each leader over
/// the RPC); when its leader is down or does not answer, as a replica here says, else as the
/// metadata says with offsets -1.
pub(crate) async fn partition_infos(broker: &Arc<Broker>, topic: &str) -> Vec<PartitionInfo> {
    let metadata = broker.metadata();
    let Some(meta) = metadata.topic(topic) else { return Vec::new() };
    let mut infos: BTreeMap<i32, PartitionInfo> =
        local_partition_infos(broker, topic, true).into_iter().map(|p| (p.partition, p)).collect();
    let mut leaders: Vec<i32> = (0..meta.partitions)
        .filter(|index| !infos.contains_key(index))
        .filter_map(|index| meta.partition(index).map(|p| p.leader))
        .filter(|leader| *leader >= 0 && *leader != broker.config.node_id)
        .collect();
    leaders.sort_unstable();
    leaders.dedup();
    let timeout = rpc_timeout(broker, Duration::ZERO);
    let mut tasks = tokio::task::JoinSet::new();
    for leader in leaders {
        let (broker, topic) = (broker.clone(), topic.to_string());
        tasks.spawn(async move {
            (leader, call::<_, Vec<PartitionInfo>>(&broker, leader, PARTITIONS, &topic, timeout).await)
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let Ok((leader, answer)) = joined else { continue };
        match answer {
            Ok(remote) => infos.extend(remote.into_iter().map(|p| (p.partition, p))),
            Err(e) => tracing::info!(topic, broker = leader, error = %e.message, "cannot read partition offsets"),
        }
    }
    for replica in local_partition_infos(broker, topic, false) {
        infos.entry(replica.partition).or_insert(replica);
    }
    (0..meta.partitions)
        .filter_map(|index| {
            infos.remove(&index).or_else(|| {
                meta.partition(index).map(|p| PartitionInfo {
                    partition: index,
                    leader: p.leader,
                    leader_epoch: p.leader_epoch,
                    replicas: p.replicas.clone(),
                    isr: p.isr.clone(),
                    log_start_offset: -1,
                    high_watermark: -1,
                    log_end_offset: -1,
                    size_bytes: 0,
                    bytes_in_per_sec: 0.0,
                    bytes_out_per_sec: 0.0,
                    replica_lags: Vec::new(),
                    remote: None,
                })
            })
        })
        .collect()
}

/// The first offset at or after `timestamp` in `topic`-`index` (the high watermark when none is),
/// here or at its leader.
pub(crate) async fn offset_at(broker: &Arc<Broker>, topic: &str, index: i32, timestamp: i64) -> Result<i64, ApiError> {
    match locate(broker, topic, index)? {
        Location::Here(_) => offset_at_here(broker, topic, index, timestamp).await,
        Location::Leader(leader) => {
            call(broker, leader, OFFSET_AT, &(topic, index, timestamp), rpc_timeout(broker, Duration::ZERO)).await
        }
    }
}

async fn offset_at_here(broker: &Arc<Broker>, topic: &str, index: i32, timestamp: i64) -> Result<i64, ApiError> {
    let partition = broker.partition(topic, index).ok_or_else(|| ApiError::unknown_partition(topic, index))?;
    // Reads the time index: off the async workers.
    let broker = broker.clone();
    tokio::task::spawn_blocking(move || -> Result<i64, ApiError> {
        let hw = partition.log.high_watermark();
        let found = broker.list_offset(&partition, OffsetQuery::AtTimestamp(timestamp), Isolation::HighWatermark)?;
        Ok(found.map_or(hw, |found| found.offset))
    })
    .await
    .map_err(|e| ApiError::internal(format!("offset lookup failed: {e}")))?
}

// ----- health and trimming -------------------------------------------------------------------

/// The followers of partitions this broker leads that have not caught up for more than its
/// `replica.lag.time.max.ms`.
fn local_lagging_followers(broker: &Broker) -> Vec<LaggingFollower> {
    let lag_ms_max = broker.config.replica_lag_time_max_ms;
    let metadata = broker.metadata();
    let mut out = Vec::new();
    for topic in metadata.topics.values() {
        for index in 0..topic.partitions {
            let Some(partition) = broker.partition(&topic.name, index) else { continue };
            for lag in partition
                .follower_lags(|id| broker.follower_heartbeats.last(id))
                .into_iter()
                .filter(|l| l.caught_up_ms_ago > lag_ms_max)
            {
                out.push(LaggingFollower {
                    topic: topic.name.clone(),
                    partition: index,
                    leader: broker.config.node_id,
                    lag: replica_lag(lag),
                });
            }
        }
    }
    out
}

/// Every live broker's lagging followers (each leader knows its own), and the live brokers that
/// did not answer.
pub(crate) async fn lagging_followers(broker: &Arc<Broker>) -> (Vec<LaggingFollower>, Vec<i32>) {
    let mut lagging = local_lagging_followers(broker);
    let others: Vec<i32> =
        broker.live_brokers().into_iter().map(|b| b.id).filter(|id| *id != broker.config.node_id).collect();
    let timeout = rpc_timeout(broker, Duration::ZERO);
    let mut tasks = tokio::task::JoinSet::new();
    for id in others.iter().copied() {
        let broker = broker.clone();
        tasks.spawn(async move {
            (id, call::<_, Vec<LaggingFollower>>(&broker, id, LAGGING_FOLLOWERS, &(), timeout).await)
        });
    }
    let mut answered = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let Ok((id, answer)) = joined else { continue };
        match answer {
            Ok(remote) => {
                answered.push(id);
                lagging.extend(remote);
            }
            Err(e) => tracing::info!(broker = id, error = %e.message, "cannot read a broker's follower lags"),
        }
    }
    lagging.sort_by(|a, b| (&a.topic, a.partition, a.lag.replica).cmp(&(&b.topic, b.partition, b.lag.replica)));
    let unanswered = others.into_iter().filter(|id| !answered.contains(id)).collect();
    (lagging, unanswered)
}

/// Where DeleteRecords cuts a partition.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) enum TrimPoint {
    /// Before this offset (-1: the high watermark).
    Offset(i64),
    /// Before the first record stamped at or after this time (everything, if none is).
    Before(i64),
}

/// Deletes the records of `topic`-`index` before `point` at its leader, here or there; answers
/// the new log start offset.
pub(crate) async fn delete_records(
    broker: &Arc<Broker>,
    topic: &str,
    index: i32,
    point: TrimPoint,
) -> Result<i64, ApiError> {
    match locate(broker, topic, index)? {
        Location::Here(_) => delete_records_here(broker, topic, index, point).await,
        Location::Leader(leader) => {
            call(broker, leader, DELETE_RECORDS, &(topic, index, point), rpc_timeout(broker, Duration::ZERO)).await
        }
    }
}

/// Only the leader trims (`Broker::delete_records` checks): its log start offset is what
/// followers and consumers learn.
async fn delete_records_here(broker: &Arc<Broker>, topic: &str, index: i32, point: TrimPoint) -> Result<i64, ApiError> {
    let partition = broker.require_partition(topic, index)?;
    // Reads the time index and moves segments: off the async workers.
    let broker = broker.clone();
    tokio::task::spawn_blocking(move || -> Result<i64, ApiError> {
        let offset = match point {
            TrimPoint::Offset(offset) => offset,
            TrimPoint::Before(timestamp) => {
                let found =
                    broker.list_offset(&partition, OffsetQuery::AtTimestamp(timestamp), Isolation::HighWatermark)?;
                found.map_or_else(|| partition.log.high_watermark(), |found| found.offset)
            }
        };
        Ok(broker.delete_records(&partition, offset)?)
    })
    .await
    .map_err(|e| ApiError::internal(format!("delete records failed: {e}")))?
}

// ----- requests about a group ----------------------------------------------------------------

/// An HTTP request forwarded to another node.
#[derive(Debug, Serialize, Deserialize)]
struct HttpCall {
    method: String,
    /// Path and query.
    uri: String,
    body: String,
}

/// Its answer.
#[derive(Debug, Serialize, Deserialize)]
struct HttpAnswer {
    status: u16,
    body: String,
}

async fn run_forwarded(state: Arc<AdminState>, call: HttpCall) -> HttpAnswer {
    let answer = async {
        let method = Method::from_bytes(call.method.as_bytes()).map_err(|e| ApiError::invalid(e.to_string()))?;
        let body = BASE64.decode(&call.body).map_err(|e| ApiError::invalid(e.to_string()))?;
        let request = Request::builder()
            .method(method)
            .uri(&call.uri)
            .header(FORWARDED, "1")
            .header("content-type", "application/json")
            .body(Body::from(body))
            .map_err(|e| ApiError::invalid(format!("forwarded request: {e}")))?;
        let Ok(response) = crate::router(state).oneshot(request).await;
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), FORWARDED_BODY_MAX)
            .await
            .map_err(|e| ApiError::internal(format!("forwarded answer: {e}")))?;
        Ok::<_, ApiError>(HttpAnswer { status, body: BASE64.encode(&body) })
    }
    .await;
    answer.unwrap_or_else(|e| {
        let status = e.status.as_u16();
        let body = serde_json::to_vec(&crate::api::ErrorBody { error: e.detail() }).unwrap_or_default();
        HttpAnswer { status, body: BASE64.encode(body) }
    })
}

/// Sends `request` to broker `to`'s admin API and turns its answer into this one's.
async fn forward_http(broker: &Broker, to: i32, request: Request) -> Result<Response, ApiError> {
    let method = request.method().to_string();
    let uri = request.uri().path_and_query().map_or_else(|| request.uri().path().to_string(), |pq| pq.to_string());
    let body = axum::body::to_bytes(request.into_body(), FORWARDED_BODY_MAX)
        .await
        .map_err(|e| ApiError::invalid(format!("cannot read the request body: {e}")))?;
    let call_body = HttpCall { method, uri, body: BASE64.encode(&body) };
    // Long enough for the slowest group request (a reset reads time indexes).
    let answer: HttpAnswer = call(broker, to, HTTP, &call_body, rpc_timeout(broker, Duration::from_secs(30))).await?;
    let body = BASE64.decode(&answer.body).map_err(|e| ApiError::internal(format!("forwarded answer: {e}")))?;
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
    Ok(response)
}

/// Middleware of the `/v1/groups/{group}...` routes: a request about a group whose coordinator
/// is another broker is answered by that broker. `__consumer_offsets` is created first if it
/// does not exist yet (as the first FindCoordinator would).
pub(crate) async fn at_coordinator(
    State(state): State<SharedState>,
    Path(params): Path<HashMap<String, String>>,
    request: Request,
    next: Next,
) -> Response {
    if request.headers().contains_key(FORWARDED) {
        return next.run(request).await;
    }
    let (Ok(core), Some(group)) = (state.core(), params.get("group")) else { return next.run(request).await };
    let partition = match core.groups.coordinator_partition(group).await {
        Ok(partition) => partition,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let leader = core.broker.metadata().topic(OFFSETS_TOPIC).and_then(|t| t.partition(partition)).map(|p| p.leader);
    match leader {
        // Here, or nowhere right now: the handler gives the answer (or the coordinator error).
        None => next.run(request).await,
        Some(leader) if leader < 0 || leader == core.broker.config.node_id => next.run(request).await,
        Some(leader) => forward_http(&core.broker, leader, request).await.unwrap_or_else(IntoResponse::into_response),
    }
}

/// Middleware of `/v1/groups/{group}/dead-letters/...`: answered by the broker that leads the
/// group's dead-letter partition (the handler says if there is none).
pub(crate) async fn at_dead_letter_leader(
    State(state): State<SharedState>,
    Path(params): Path<HashMap<String, String>>,
    request: Request,
    next: Next,
) -> Response {
    if request.headers().contains_key(FORWARDED) {
        return next.run(request).await;
    }
    let (Ok(core), Some(group)) = (state.core(), params.get("group")) else { return next.run(request).await };
    let topic = weir_messaging::dead_letter::dead_letter_topic(group);
    match locate(&core.broker, &topic, 0) {
        Ok(Location::Leader(leader)) => {
            forward_http(&core.broker, leader, request).await.unwrap_or_else(IntoResponse::into_response)
        }
        // Here, or nowhere: the handler answers (no dead letters, no leader).
        _ => next.run(request).await,
    }
}

/// `GET` of `path_and_query` at every other live broker's admin API (as a forwarded request,
/// so each answers for itself only), decoded; brokers that fail are logged and left out.
pub(crate) async fn ask_every_broker<T: DeserializeOwned>(broker: &Arc<Broker>, path_and_query: &str) -> Vec<T> {
    let others: Vec<i32> =
        broker.live_brokers().into_iter().map(|b| b.id).filter(|id| *id != broker.config.node_id).collect();
    let timeout = rpc_timeout(broker, Duration::ZERO);
    let mut tasks = tokio::task::JoinSet::new();
    for id in others {
        let broker = broker.clone();
        let request = HttpCall { method: "GET".into(), uri: path_and_query.to_string(), body: String::new() };
        tasks.spawn(async move { (id, call::<_, HttpAnswer>(&broker, id, HTTP, &request, timeout).await) });
    }
    let mut out = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let Ok((id, answer)) = joined else { continue };
        let decoded = answer.and_then(|a| {
            if a.status != 200 {
                return Err(ApiError::internal(format!("status {}", a.status)));
            }
            let body = BASE64.decode(&a.body).map_err(|e| ApiError::internal(e.to_string()))?;
            serde_json::from_slice::<T>(&body).map_err(|e| ApiError::internal(e.to_string()))
        });
        match decoded {
            Ok(value) => out.push(value),
            Err(e) => tracing::info!(broker = id, path = path_and_query, error = %e.message, "a broker did not answer"),
        }
    }
    out
}

/// The consumers of `group` that receive by invisible time, as every live broker knows them
/// (each knows those that talk to it), merged by client id: the most recently heard wins.
pub(crate) async fn group_clients(core: &crate::Core, group: &str) -> Vec<ConnectedClient> {
    let broker = &core.broker;
    let mut clients: BTreeMap<String, ConnectedClient> =
        core.groups.clients.of_group(group, broker.now_ms()).into_iter().map(|c| (c.client_id.clone(), c)).collect();
    let others: Vec<i32> =
        broker.live_brokers().into_iter().map(|b| b.id).filter(|id| *id != broker.config.node_id).collect();
    let timeout = rpc_timeout(broker, Duration::ZERO);
    let mut tasks = tokio::task::JoinSet::new();
    for id in others {
        let (broker, group) = (broker.clone(), group.to_string());
        tasks.spawn(
            async move { (id, call::<_, Vec<ConnectedClient>>(&broker, id, GROUP_CLIENTS, &group, timeout).await) },
        );
    }
    while let Some(joined) = tasks.join_next().await {
        let Ok((id, answer)) = joined else { continue };
        match answer {
            Ok(remote) => {
                for client in remote {
                    match clients.get(&client.client_id) {
                        Some(known) if known.last_heard_ms >= client.last_heard_ms => {}
                        _ => {
                            clients.insert(client.client_id.clone(), client);
                        }
                    }
                }
            }
            Err(e) => tracing::info!(broker = id, group, error = %e.message, "cannot list a group's connected clients"),
        }
    }
    clients.into_values().collect()
}

/// Whether `request` was forwarded by another node (which asks every broker itself).
pub(crate) fn is_forwarded(headers: &axum::http::HeaderMap) -> bool {
    headers.contains_key(FORWARDED)
}
