//! From a request frame to a response frame: check the API and version, decode with the
//! `kafka-protocol` crate, call the handler, encode. Every request is timed here and its
//! response's error codes counted (`weir_request_duration_seconds`, `weir_request_errors_total`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::VersionRange;
use weir_broker::metrics::{ErrorCounter, OperationMetrics, ProtocolMetrics};

use crate::context::{Client, Ctx, Peer};
use crate::frame::{self, FrameError, ResponseFrame};
use crate::handlers::{self, admin, groups};
use crate::quota::{self, Charge, Throttle, Timed};
use crate::share_versions;
use crate::versions;

/// The request metrics of `api_key` (named after the key, as Kafka names its APIs: `Produce`,
/// `ApiVersions`). `None` only for a key beyond the metrics' slots.
pub(crate) fn api_metrics(metrics: &ProtocolMetrics, api_key: ApiKey) -> Option<&OperationMetrics> {
    metrics.operation(i32::from(api_key as i16), || format!("{api_key:?}"))
}

/// The rest of a request's work, run after the connection has moved on to its next request.
/// Resolves to the response, `None` when none is due, or an error that closes the connection.
pub(crate) type Deferred = Pin<Box<dyn Future<Output = Result<Option<ResponseFrame>, FrameError>> + Send>>;

/// What handling a request produced. Responses go out in request order either way.
pub(crate) enum Reply {
    /// The response, or `None` when none is due (Produce with acks=0).
    Now(Option<ResponseFrame>),
    /// A produce whose batches are written but whose fsync (`flush.policy=sync`) is still to
    /// come: the connection takes its next request meanwhile, so pipelined produces share
    /// fsyncs, and the writer awaits this before the responses after it.
    Later(Deferred),
}

/// What handling a request produced: its reply, and how its client must wait when it is over a
/// quota (`crate::quota`).
pub(crate) struct Handled {
    pub(crate) reply: Reply,
    pub(crate) throttle: Option<Throttle>,
}

/// Handles one request. `Err`: the connection must be closed (the error says why, for the log).
///
/// The time measured runs from here (the request was read and its turn on the connection has
/// come) to the response being encoded, before it is written: for Fetch it includes the
/// long-poll wait, for JoinGroup the wait for the other members, for Produce the fsync.
pub(crate) async fn handle(ctx: &Ctx, peer: &Peer, frame: Bytes) -> Result<Handled, FrameError> {
    if handlers::session_write::is_session_write(&frame) {
        let reply = handlers::session_write::handle(ctx, peer, frame).await?;
        return Ok(Handled { reply, throttle: None });
    }
    let Some(charge) = Charge::for_request(ctx) else {
        return Ok(Handled { reply: timed(ctx, peer, frame, None).await?, throttle: None });
    };
    let prefix = frame::peek_prefix(&frame).ok();
    let reply = Timed::new(timed(ctx, peer, frame, Some(charge.clone())), charge.clone()).await?;
    let delay = charge.throttle(ctx);
    let throttle = match prefix.and_then(|p| ApiKey::try_from(p.api_key).ok().map(|key| (key, p.version))) {
        Some((api_key, version)) if !delay.is_zero() => {
            Some(Throttle { delay, client_waits: quota::client_waits(api_key, version) })
        }
        _ => None,
    };
    Ok(Handled { reply, throttle })
}

/// [`route`], timed into the request metrics.
async fn timed(ctx: &Ctx, peer: &Peer, frame: Bytes, charge: Option<Arc<Charge>>) -> Result<Reply, FrameError> {
    let started = Instant::now();
    let known = frame::peek_prefix(&frame).ok().and_then(|p| ApiKey::try_from(p.api_key).ok());
    let Some((key, metrics)) = known.and_then(|key| api_metrics(&ctx.metrics, key).map(|m| (key, m))) else {
        ctx.metrics.count_unknown_operation();
        return route(ctx, peer, frame, None, charge).await;
    };
    let result = route(ctx, peer, frame, Some(metrics), charge).await;
    match result {
        Ok(Reply::Later(deferred)) => {
            let protocol = ctx.metrics.clone();
            Ok(Reply::Later(Box::pin(async move {
                let result = deferred.await;
                if let Some(metrics) = api_metrics(&protocol, key) {
                    metrics.observe(started.elapsed());
                    if result.is_err() {
                        metrics.count_failure();
                    }
                }
                result
            })))
        }
        result => {
            metrics.observe(started.elapsed());
            if result.is_err() {
                metrics.count_failure();
            }
            result
        }
    }
}

async fn route(
    ctx: &Ctx,
    peer: &Peer,
    mut frame: Bytes,
    metrics: Option<&OperationMetrics>,
    charge: Option<Arc<Charge>>,
) -> Result<Reply, FrameError> {
    let prefix = frame::peek_prefix(&frame)?;
    let Ok(api_key) = ApiKey::try_from(prefix.api_key) else {
        return Err(FrameError::UnknownApiKey { api_key: prefix.api_key, correlation_id: prefix.correlation_id });
    };
    let version = prefix.version;
    // Counts the error codes of a response (not across an await: the counter holds a lock).
    let count_errors = |response: &dyn ErrorCodes| {
        if let Some(metrics) = metrics {
            response.error_codes(&mut metrics.error_counter());
        }
    };
    if let Some(reply) = check_version(api_key, version, prefix.correlation_id)? {
        return Ok(reply);
    }
    let (mut client, correlation_id) = decode_header(&mut frame, &prefix, api_key, peer)?;
    if let Some(charge) = &charge {
        charge.identify(&client);
        client.charge = Some(charge.clone());
    }
    let mut body = frame;

    macro_rules! call {
        ($request:ty, $handler:path) => {{
            let request: $request = frame::decode_body(&mut body, api_key, version)?;
            let mut response = $handler(ctx, &client, request).await;
            count_errors(&response);
            if let Some(charge) = &charge {
                response.set_throttle_time_ms(charge.throttle_time_ms(ctx));
            }
            Some(single(frame::encode_response(api_key, version, correlation_id, &response)?))
        }};
    }

    let response = match api_key {
        ApiKey::ApiVersions => call!(ApiVersionsRequest, handlers::api_versions::handle),
        ApiKey::Metadata => call!(MetadataRequest, handlers::metadata::handle),
        ApiKey::Produce => {
            let whole_body = body.clone();
            let request: ProduceRequest = frame::decode_body(&mut body, api_key, version)?;
            drop(body);
            return Ok(produce(ctx, &client, correlation_id, request, whole_body, charge).await);
        }
        ApiKey::Fetch => {
            let mut request: FetchRequest = frame::decode_body(&mut body, api_key, version)?;
            let replica_id = if version >= 15 { request.replica_state.replica_id.0 } else { request.replica_id.0 };
            if let Some(charge) = charge.as_ref().filter(|_| replica_id >= 0 && ctx.on_inter_broker_listener(&client)) {
                charge.exempt();
            }
            // Never more than the client's consumer_byte_rate allows in one window, or the
            // fetch would be throttled whatever it waited (Kafka's getMaxValueInQuotaWindow).
            if let Some(limit) = charge.as_ref().and_then(|c| c.fetch_limit(ctx)) {
                let asked = if request.max_bytes <= 0 { u64::MAX } else { request.max_bytes as u64 };
                request.max_bytes = asked.min(limit).min(i32::MAX as u64) as i32;
            }
            Some(handlers::fetch::handle(ctx, &client, correlation_id, request, charge.as_deref()).await?)
        }
        ApiKey::ListOffsets => call!(ListOffsetsRequest, handlers::list_offsets::handle),
        ApiKey::InitProducerId => call!(InitProducerIdRequest, handlers::producer::init_producer_id),
        ApiKey::AddPartitionsToTxn => call!(AddPartitionsToTxnRequest, handlers::txn::add_partitions),
        ApiKey::AddOffsetsToTxn => call!(AddOffsetsToTxnRequest, handlers::txn::add_offsets),
        ApiKey::EndTxn => call!(EndTxnRequest, handlers::txn::end_txn),
        ApiKey::TxnOffsetCommit => call!(TxnOffsetCommitRequest, handlers::txn::txn_offset_commit),
        ApiKey::DescribeTransactions => call!(DescribeTransactionsRequest, handlers::txn::describe_transactions),
        ApiKey::ListTransactions => call!(ListTransactionsRequest, handlers::txn::list_transactions),
        ApiKey::OffsetForLeaderEpoch => {
            call!(OffsetForLeaderEpochRequest, handlers::list_offsets::offset_for_leader_epoch)
        }
        ApiKey::CreateTopics => call!(CreateTopicsRequest, admin::create_topics),
        ApiKey::DeleteTopics => call!(DeleteTopicsRequest, admin::delete_topics),
        ApiKey::CreatePartitions => call!(CreatePartitionsRequest, admin::create_partitions),
        ApiKey::DescribeConfigs => call!(DescribeConfigsRequest, admin::describe_configs),
        ApiKey::AlterConfigs => call!(AlterConfigsRequest, admin::alter_configs),
        ApiKey::IncrementalAlterConfigs => call!(IncrementalAlterConfigsRequest, admin::incremental_alter_configs),
        ApiKey::DeleteRecords => call!(DeleteRecordsRequest, admin::delete_records),
        ApiKey::DescribeCluster => call!(DescribeClusterRequest, admin::describe_cluster),
        ApiKey::DescribeQuorum => call!(DescribeQuorumRequest, admin::describe_quorum),
        ApiKey::ElectLeaders => call!(ElectLeadersRequest, admin::elect_leaders),
        ApiKey::UnregisterBroker => call!(UnregisterBrokerRequest, admin::unregister_broker),
        ApiKey::AlterPartitionReassignments => {
            call!(AlterPartitionReassignmentsRequest, admin::alter_partition_reassignments)
        }
        ApiKey::ListPartitionReassignments => {
            call!(ListPartitionReassignmentsRequest, admin::list_partition_reassignments)
        }
        ApiKey::DescribeLogDirs => call!(DescribeLogDirsRequest, admin::describe_log_dirs),
        ApiKey::FindCoordinator => call!(FindCoordinatorRequest, groups::find_coordinator),
        ApiKey::JoinGroup => call!(JoinGroupRequest, groups::join_group),
        ApiKey::SyncGroup => call!(SyncGroupRequest, groups::sync_group),
        ApiKey::Heartbeat => call!(HeartbeatRequest, groups::heartbeat),
        ApiKey::LeaveGroup => call!(LeaveGroupRequest, groups::leave_group),
        ApiKey::OffsetCommit => call!(OffsetCommitRequest, groups::offset_commit),
        ApiKey::OffsetFetch => call!(OffsetFetchRequest, groups::offset_fetch),
        ApiKey::OffsetDelete => call!(OffsetDeleteRequest, groups::offset_delete),
        ApiKey::ListGroups => call!(ListGroupsRequest, groups::list_groups),
        ApiKey::DescribeGroups => call!(DescribeGroupsRequest, groups::describe_groups),
        ApiKey::DeleteGroups => call!(DeleteGroupsRequest, groups::delete_groups),
        ApiKey::ConsumerGroupHeartbeat => {
            call!(ConsumerGroupHeartbeatRequest, handlers::consumer_groups::heartbeat)
        }
        ApiKey::ConsumerGroupDescribe => call!(ConsumerGroupDescribeRequest, handlers::consumer_groups::describe),
        ApiKey::ShareGroupHeartbeat => call!(ShareGroupHeartbeatRequest, handlers::share_groups::heartbeat),
        ApiKey::ShareGroupDescribe => call!(ShareGroupDescribeRequest, handlers::share_groups::describe),
        // Version 2 is read as v1 with its extra fields taken out (`share_versions`).
        ApiKey::ShareFetch => {
            let malformed = |reason| FrameError::Malformed { api_key, version, reason };
            let (mut v1, extras) = share_versions::fetch_request(version, body).map_err(malformed)?;
            let request: ShareFetchRequest = frame::decode_body(&mut v1, api_key, 1)?;
            let response = handlers::share_fetch::share_fetch(ctx, &client, request, extras).await;
            count_errors(&response);
            // (A v2 answer is v1's.)
            Some(single(frame::encode_response(api_key, 1, correlation_id, &response)?))
        }
        ApiKey::ShareAcknowledge => {
            let malformed = |reason| FrameError::Malformed { api_key, version, reason };
            let (mut v1, _renew_ack) = share_versions::acknowledge_request(version, body).map_err(malformed)?;
            let request: ShareAcknowledgeRequest = frame::decode_body(&mut v1, api_key, 1)?;
            let group = request.group_id.as_ref().map(|g| g.to_string()).unwrap_or_default();
            let response = handlers::share_fetch::share_acknowledge(ctx, &client, request).await;
            count_errors(&response);
            let frame = frame::encode_response(api_key, 1, correlation_id, &response)?;
            if version >= share_versions::V2 {
                let lock_ms = handlers::share_fetch::record_lock_ms(ctx, &group);
                let encode = |reason| FrameError::Encode { api_key, version, reason };
                Some(single(share_versions::acknowledge_response(frame, lock_ms).map_err(encode)?))
            } else {
                Some(single(frame))
            }
        }
        ApiKey::DescribeShareGroupOffsets => {
            // v1 asks as v0 does; its answer adds each partition's lag (`share_versions`).
            let request: DescribeShareGroupOffsetsRequest = frame::decode_body(&mut body, api_key, 0)?;
            let described = handlers::share_groups::describe_offsets(ctx, &client, request).await;
            count_errors(&described.response);
            Some(single(if version >= 1 {
                share_versions::describe_offsets_response(correlation_id, &described.response, |group, topic, p| {
                    described.lag(group, topic, p)
                })
            } else {
                frame::encode_response(api_key, version, correlation_id, &described.response)?
            }))
        }
        ApiKey::AlterShareGroupOffsets => call!(AlterShareGroupOffsetsRequest, handlers::share_groups::alter_offsets),
        // On a SASL listener these never get here (`connection` answers them); elsewhere
        // there is nothing to authenticate.
        ApiKey::SaslHandshake => call!(SaslHandshakeRequest, handlers::users::handshake_without_sasl),
        ApiKey::SaslAuthenticate => call!(SaslAuthenticateRequest, handlers::users::authenticate_without_sasl),
        ApiKey::AlterUserScramCredentials => {
            call!(AlterUserScramCredentialsRequest, handlers::users::alter_scram_credentials)
        }
        ApiKey::CreateAcls => call!(CreateAclsRequest, handlers::acls::create_acls),
        ApiKey::DescribeAcls => call!(DescribeAclsRequest, handlers::acls::describe_acls),
        ApiKey::DeleteAcls => call!(DeleteAclsRequest, handlers::acls::delete_acls),
        ApiKey::DescribeClientQuotas => call!(DescribeClientQuotasRequest, handlers::quotas::describe_client_quotas),
        ApiKey::AlterClientQuotas => call!(AlterClientQuotasRequest, handlers::quotas::alter_client_quotas),
        ApiKey::DescribeUserScramCredentials => {
            call!(DescribeUserScramCredentialsRequest, handlers::users::describe_scram_credentials)
        }
        ApiKey::DeleteShareGroupOffsets => {
            call!(DeleteShareGroupOffsetsRequest, handlers::share_groups::delete_offsets)
        }
        // versions::supported() admitted only the keys above.
        other => return Err(FrameError::UnsupportedVersion { api_key: other, version, correlation_id }),
    };
    Ok(Reply::Now(response))
}

/// `Some(reply)` when the version is not one this broker speaks but the request is answered
/// anyway; an error (the connection closes) when it is not.
fn check_version(api_key: ApiKey, version: i16, correlation_id: i32) -> Result<Option<Reply>, FrameError> {
    let supported = versions::supported(api_key);
    if supported.is_some_and(|r| version >= r.min && version <= r.max) {
        return Ok(None);
    }
    if api_key == ApiKey::ApiVersions {
        // KIP-511: a client newer than the broker asks with a version the broker does not
        // know; answer in v0 with UNSUPPORTED_VERSION and the list, so it can pick one.
        let response = handlers::api_versions::unsupported_version_response();
        let bytes = frame::encode_response(api_key, 0, correlation_id, &response)?;
        return Ok(Some(Reply::Now(Some(single(bytes)))));
    }
    Err(FrameError::UnsupportedVersion { api_key, version, correlation_id })
}

/// The client and correlation id of the request header, which is consumed from `frame`. The
/// header is dropped here: its client id is a slice of the frame, and Produce needs to be the
/// frame's only holder to write into it.
pub(crate) fn decode_header(
    frame: &mut Bytes,
    prefix: &frame::RequestPrefix,
    api_key: ApiKey,
    peer: &Peer,
) -> Result<(Client, i32), FrameError> {
    let version = prefix.version;
    let header = frame::decode_header(frame, api_key, version)?;
    check_header(&header, prefix, versions::supported(api_key));
    let client = Client {
        version,
        client_id: header.client_id.as_ref().map(|s| s.to_string()).unwrap_or_default(),
        host: peer.host.clone(),
        connection: peer.connection,
        listener: peer.listener,
        principal: peer.principal.clone(),
        charge: None,
    };
    Ok((client, header.correlation_id))
}

/// Produce: the batches are written now; the response follows once they are durable, so the
/// connection takes its next request meanwhile (see [`Reply::Later`]).
async fn produce(
    ctx: &Ctx,
    client: &Client,
    correlation_id: i32,
    request: ProduceRequest,
    whole_body: Bytes,
    charge: Option<Arc<Charge>>,
) -> Reply {
    let version = client.version;
    if let Some(charge) = &charge {
        charge.produced(ctx, whole_body.len());
    }

    let acks = request.acks;
    let asked = produce_partitions(&request);
    let durable = handlers::produce::handle(ctx, client, request, whole_body).await;
    // Test-only fault: the append happens, the producer never hears of it.
    let drop_response = acks != 0 && drop_response_for_fault_injection(ctx);
    let protocol = ctx.metrics.clone();
    Reply::Later(Box::pin(async move {
        let mut response = durable.await;
        // By now the request is handled and its throttle decided (`handle`).
        if let Some(charge) = &charge {
            response.throttle_time_ms = charge.decided_throttle_ms();
        }
        check_produce_response(&asked, &response);
        if let Some(metrics) = api_metrics(&protocol, ApiKey::Produce) {
            response.error_codes(&mut metrics.error_counter());
        }
        if acks == 0 {
            acks_0_outcome(&response)
        } else if drop_response {
            Err(FrameError::FaultInjected("dropped a produce response"))
        } else {
            Ok(Some(single(frame::encode_response(ApiKey::Produce, version, correlation_id, &response)?)))
        }
    }))
}

/// With acks=0 there is no response to carry an error: as Kafka does, the connection closes
/// on a failed partition so the producer notices (it reconnects and refreshes its metadata)
/// instead of losing records silently.
fn acks_0_outcome(response: &ProduceResponse) -> Result<Option<ResponseFrame>, FrameError> {
    let failed = response
        .responses
        .iter()
        .flat_map(|t| t.partition_responses.iter().map(move |p| (t, p)))
        .find(|(_, p)| p.error_code != 0);
    match failed {
        Some((topic, partition)) => Err(FrameError::Acks0Failed {
            topic: topic.name.to_string(),
            partition: partition.index,
            error_code: partition.error_code,
        }),
        None => Ok(None),
    }
}

/// What decoding promises of a request header (debug builds only; nothing in release): it
/// names the API, version and correlation id its prefix named, and the version is one this
/// broker implements (the gate above let nothing else through).
fn check_header(header: &RequestHeader, prefix: &frame::RequestPrefix, supported: Option<VersionRange>) {
    if !cfg!(debug_assertions) {
        return;
    }
    assert!(
        header.request_api_key == prefix.api_key
            && header.request_api_version == prefix.version
            && header.correlation_id == prefix.correlation_id,
        "the decoded header {header:?} is not the request's prefix (key {}, version {}, correlation id {})",
        prefix.api_key,
        prefix.version,
        prefix.correlation_id
    );
    assert!(
        supported.is_some_and(|r| (r.min..=r.max).contains(&header.request_api_version)),
        "a request of version {} passed the gate (supported: {supported:?})",
        header.request_api_version
    );
}

/// The topics and partition indexes a produce request names, in order, for
/// [`check_produce_response`]. Empty in release builds, where nothing checks.
fn produce_partitions(request: &ProduceRequest) -> Vec<(TopicName, Vec<i32>)> {
    if !cfg!(debug_assertions) {
        return Vec::new();
    }
    request.topic_data.iter().map(|t| (t.name.clone(), t.partition_data.iter().map(|p| p.index).collect())).collect()
}

/// A produce response answers each partition of its request, in the request's order, once
/// (debug builds only; nothing in release): a client matches them up by position.
fn check_produce_response(asked: &[(TopicName, Vec<i32>)], response: &ProduceResponse) {
    if !cfg!(debug_assertions) {
        return;
    }
    let answered: Vec<(TopicName, Vec<i32>)> = response
        .responses
        .iter()
        .map(|t| (t.name.clone(), t.partition_responses.iter().map(|p| p.index).collect()))
        .collect();
    assert!(answered == asked, "the produce response answers {answered:?}, the request asked {asked:?}");
}

fn single(bytes: bytes::BytesMut) -> ResponseFrame {
    ResponseFrame { chunks: vec![frame::Chunk::Bytes(bytes.freeze())] }
}

/// The error codes a response carries, as Kafka's `AbstractResponse.errorCounts()` counts them:
/// the top-level code and each topic, partition, group or member entry's. Visited in place, so
/// a response without errors costs a walk over its entries and no lock.
trait ErrorCodes {
    fn error_codes(&self, counter: &mut ErrorCounter<'_>);
}

macro_rules! error_codes {
    ($($response:ty => |$r:ident, $c:ident| $body:expr;)*) => {
        $(
            impl ErrorCodes for $response {
                fn error_codes(&self, $c: &mut ErrorCounter<'_>) {
                    let $r = self;
                    $body
                }
            }
        )*
    };
}

error_codes! {
    ApiVersionsResponse => |r, c| c.count(r.error_code);
    SaslHandshakeResponse => |r, c| c.count(r.error_code);
    SaslAuthenticateResponse => |r, c| c.count(r.error_code);
    AlterUserScramCredentialsResponse => |r, c| {
        for result in &r.results {
            c.count(result.error_code);
        }
    };
    CreateAclsResponse => |r, c| {
        for result in &r.results {
            c.count(result.error_code);
        }
    };
    DescribeAclsResponse => |r, c| c.count(r.error_code);
    DescribeClientQuotasResponse => |r, c| c.count(r.error_code);
    AlterClientQuotasResponse => |r, c| r.entries.iter().for_each(|e| c.count(e.error_code));
    DeleteAclsResponse => |r, c| {
        for result in &r.filter_results {
            c.count(result.error_code);
        }
    };
    DescribeUserScramCredentialsResponse => |r, c| {
        c.count(r.error_code);
        for result in &r.results {
            c.count(result.error_code);
        }
    };
    InitProducerIdResponse => |r, c| c.count(r.error_code);
    AddPartitionsToTxnResponse => |r, c| {
        for t in &r.results_by_topic_v3_and_below {
            for p in &t.results_by_partition {
                c.count(p.partition_error_code);
            }
        }
    };
    AddOffsetsToTxnResponse => |r, c| c.count(r.error_code);
    EndTxnResponse => |r, c| c.count(r.error_code);
    TxnOffsetCommitResponse => |r, c| {
        for t in &r.topics {
            for p in &t.partitions {
                c.count(p.error_code);
            }
        }
    };
    DescribeTransactionsResponse => |r, c| {
        for t in &r.transaction_states {
            c.count(t.error_code);
        }
    };
    ListTransactionsResponse => |r, c| c.count(r.error_code);
    MetadataResponse => |r, c| {
        c.count(r.error_code);
        for t in &r.topics {
            c.count(t.error_code);
            t.partitions.iter().for_each(|p| c.count(p.error_code));
        }
    };
    ProduceResponse => |r, c| r.responses.iter().flat_map(|t| &t.partition_responses).for_each(|p| c.count(p.error_code));
    ListOffsetsResponse => |r, c| r.topics.iter().flat_map(|t| &t.partitions).for_each(|p| c.count(p.error_code));
    OffsetForLeaderEpochResponse => |r, c| r.topics.iter().flat_map(|t| &t.partitions).for_each(|p| c.count(p.error_code));
    CreateTopicsResponse => |r, c| r.topics.iter().for_each(|t| c.count(t.error_code));
    DeleteTopicsResponse => |r, c| r.responses.iter().for_each(|t| c.count(t.error_code));
    CreatePartitionsResponse => |r, c| r.results.iter().for_each(|t| c.count(t.error_code));
    DescribeConfigsResponse => |r, c| r.results.iter().for_each(|t| c.count(t.error_code));
    AlterConfigsResponse => |r, c| r.responses.iter().for_each(|t| c.count(t.error_code));
    IncrementalAlterConfigsResponse => |r, c| r.responses.iter().for_each(|t| c.count(t.error_code));
    DeleteRecordsResponse => |r, c| r.topics.iter().flat_map(|t| &t.partitions).for_each(|p| c.count(p.error_code));
    DescribeClusterResponse => |r, c| c.count(r.error_code);
    DescribeQuorumResponse => |r, c| {
        c.count(r.error_code);
        r.topics.iter().flat_map(|t| &t.partitions).for_each(|p| c.count(p.error_code));
    };
    ElectLeadersResponse => |r, c| {
        c.count(r.error_code);
        r.replica_election_results.iter().flat_map(|t| &t.partition_result).for_each(|p| c.count(p.error_code));
    };
    AlterPartitionReassignmentsResponse => |r, c| {
        c.count(r.error_code);
        r.responses.iter().flat_map(|t| &t.partitions).for_each(|p| c.count(p.error_code));
    };
    ListPartitionReassignmentsResponse => |r, c| c.count(r.error_code);
    UnregisterBrokerResponse => |r, c| c.count(r.error_code);
    DescribeLogDirsResponse => |r, c| {
        c.count(r.error_code);
        r.results.iter().for_each(|d| c.count(d.error_code));
    };
    FindCoordinatorResponse => |r, c| {
        c.count(r.error_code);
        r.coordinators.iter().for_each(|k| c.count(k.error_code));
    };
    JoinGroupResponse => |r, c| c.count(r.error_code);
    SyncGroupResponse => |r, c| c.count(r.error_code);
    HeartbeatResponse => |r, c| c.count(r.error_code);
    LeaveGroupResponse => |r, c| {
        c.count(r.error_code);
        r.members.iter().for_each(|m| c.count(m.error_code));
    };
    OffsetCommitResponse => |r, c| r.topics.iter().flat_map(|t| &t.partitions).for_each(|p| c.count(p.error_code));
    OffsetFetchResponse => |r, c| {
        c.count(r.error_code);
        r.topics.iter().flat_map(|t| &t.partitions).for_each(|p| c.count(p.error_code));
        for g in &r.groups {
            c.count(g.error_code);
            g.topics.iter().flat_map(|t| &t.partitions).for_each(|p| c.count(p.error_code));
        }
    };
    OffsetDeleteResponse => |r, c| {
        c.count(r.error_code);
        r.topics.iter().flat_map(|t| &t.partitions).for_each(|p| c.count(p.error_code));
    };
    ListGroupsResponse => |r, c| c.count(r.error_code);
    DescribeGroupsResponse => |r, c| r.groups.iter().for_each(|g| c.count(g.error_code));
    DeleteGroupsResponse => |r, c| r.results.iter().for_each(|g| c.count(g.error_code));
    ConsumerGroupHeartbeatResponse => |r, c| c.count(r.error_code);
    ConsumerGroupDescribeResponse => |r, c| r.groups.iter().for_each(|g| c.count(g.error_code));
    ShareGroupHeartbeatResponse => |r, c| c.count(r.error_code);
    ShareGroupDescribeResponse => |r, c| r.groups.iter().for_each(|g| c.count(g.error_code));
    ShareFetchResponse => |r, c| {
        c.count(r.error_code);
        for p in r.responses.iter().flat_map(|t| &t.partitions) {
            c.count(p.error_code);
            c.count(p.acknowledge_error_code);
        }
    };
    ShareAcknowledgeResponse => |r, c| {
        c.count(r.error_code);
        r.responses.iter().flat_map(|t| &t.partitions).for_each(|p| c.count(p.error_code));
    };
    DescribeShareGroupOffsetsResponse => |r, c| {
        for g in &r.groups {
            c.count(g.error_code);
            g.topics.iter().flat_map(|t| &t.partitions).for_each(|p| c.count(p.error_code));
        }
    };
    AlterShareGroupOffsetsResponse => |r, c| {
        c.count(r.error_code);
        r.responses.iter().flat_map(|t| &t.partitions).for_each(|p| c.count(p.error_code));
    };
    DeleteShareGroupOffsetsResponse => |r, c| {
        c.count(r.error_code);
        r.responses.iter().for_each(|t| c.count(t.error_code));
    };
}

/// A response's `throttle_time_ms` (KIP-219), for the responses `route` builds through `call!`;
/// a response without the field (SASL's, DescribeQuorum's) ignores it.
trait ThrottleTime {
    fn set_throttle_time_ms(&mut self, ms: i32);
}

macro_rules! throttle_time {
    (with: $($response:ty),* ; without: $($bare:ty),* $(,)?) => {
        $(
            impl ThrottleTime for $response {
                fn set_throttle_time_ms(&mut self, ms: i32) {
                    self.throttle_time_ms = ms;
                }
            }
        )*
        $(
            impl ThrottleTime for $bare {
                fn set_throttle_time_ms(&mut self, _ms: i32) {}
            }
        )*
    };
}

throttle_time! {
    with: ApiVersionsResponse, MetadataResponse, ListOffsetsResponse, InitProducerIdResponse,
        AddPartitionsToTxnResponse, AddOffsetsToTxnResponse, EndTxnResponse, TxnOffsetCommitResponse,
        DescribeTransactionsResponse, ListTransactionsResponse, OffsetForLeaderEpochResponse,
        CreateTopicsResponse, DeleteTopicsResponse, CreatePartitionsResponse, DescribeConfigsResponse,
        AlterConfigsResponse, IncrementalAlterConfigsResponse, DeleteRecordsResponse, DescribeClusterResponse,
        ElectLeadersResponse, UnregisterBrokerResponse, AlterPartitionReassignmentsResponse,
        ListPartitionReassignmentsResponse, DescribeLogDirsResponse, FindCoordinatorResponse, JoinGroupResponse,
        SyncGroupResponse, HeartbeatResponse, LeaveGroupResponse, OffsetCommitResponse, OffsetFetchResponse,
        OffsetDeleteResponse, ListGroupsResponse, DescribeGroupsResponse, DeleteGroupsResponse,
        ConsumerGroupHeartbeatResponse, ConsumerGroupDescribeResponse, ShareGroupHeartbeatResponse,
        ShareGroupDescribeResponse, AlterShareGroupOffsetsResponse, AlterUserScramCredentialsResponse,
        CreateAclsResponse, DescribeAclsResponse, DeleteAclsResponse, DescribeUserScramCredentialsResponse,
        DeleteShareGroupOffsetsResponse, DescribeClientQuotasResponse, AlterClientQuotasResponse;
    without: SaslHandshakeResponse, SaslAuthenticateResponse, DescribeQuorumResponse,
}

/// `fault.produce.response.drop.every=N` (tests only; 0, the default, is off): every Nth produce
/// response is dropped and its connection closed after the append, as when a response is lost
/// in the network. Idempotent producers must then retry without duplicating anything.
fn drop_response_for_fault_injection(ctx: &Ctx) -> bool {
    static PRODUCE_RESPONSES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let every = ctx.broker.config.fault_produce_response_drop_every;
    every > 0 && PRODUCE_RESPONSES.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % every == every - 1
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};

    fn request(partitions: &[i32]) -> ProduceRequest {
        let data = partitions.iter().map(|index| PartitionProduceData::default().with_index(*index)).collect();
        ProduceRequest::default().with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(kafka_protocol::protocol::StrBytes::from_static_str("t")))
            .with_partition_data(data)])
    }

    fn response(partitions: &[i32]) -> ProduceResponse {
        let answers = partitions.iter().map(|index| PartitionProduceResponse::default().with_index(*index)).collect();
        ProduceResponse::default().with_responses(vec![TopicProduceResponse::default()
            .with_name(TopicName(kafka_protocol::protocol::StrBytes::from_static_str("t")))
            .with_partition_responses(answers)])
    }

    #[test]
    fn a_produce_response_that_answers_its_request_passes() {
        check_produce_response(&produce_partitions(&request(&[0, 2, 1])), &response(&[0, 2, 1]));
    }

    #[test]
    #[should_panic(expected = "the produce response answers")]
    fn a_produce_response_missing_a_partition_is_caught() {
        check_produce_response(&produce_partitions(&request(&[0, 2, 1])), &response(&[0, 1]));
    }

    #[test]
    #[should_panic(expected = "is not the request's prefix")]
    fn a_header_unlike_its_prefix_is_caught() {
        let header =
            RequestHeader::default().with_request_api_key(0).with_request_api_version(9).with_correlation_id(7);
        let prefix = frame::RequestPrefix { api_key: 0, version: 8, correlation_id: 7 };
        check_header(&header, &prefix, versions::supported(ApiKey::Produce));
    }
}
