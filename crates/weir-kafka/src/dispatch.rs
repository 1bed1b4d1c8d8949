//! From a request frame to a response frame: check the API and version, decode with the
//! `kafka-protocol` crate, call the handler, encode.

use bytes::Bytes;
use kafka_protocol::messages::*;

use crate::context::{Client, Ctx};
use crate::frame::{self, FrameError, ResponseFrame};
use crate::handlers::{self, admin, groups};
use crate::versions;

/// Handles one request. `Ok(None)`: no response is due (Produce with acks=0). `Err`: the
/// connection must be closed (the error says why, for the log).
pub async fn handle(ctx: &Ctx, host: &str, mut frame: Bytes) -> Result<Option<ResponseFrame>, FrameError> {
    let prefix = frame::peek_prefix(&frame)?;
    let Ok(api_key) = ApiKey::try_from(prefix.api_key) else {
        return Err(FrameError::UnknownApiKey { api_key: prefix.api_key, correlation_id: prefix.correlation_id });
    };
    let version = prefix.version;
    let supported = versions::supported(api_key);
    let in_range = supported.is_some_and(|r| version >= r.min && version <= r.max);
    if !in_range {
        if api_key == ApiKey::ApiVersions {
            // KIP-511: a client newer than the broker asks with a version the broker does not
            // know; answer in v0 with UNSUPPORTED_VERSION and the list, so it can pick one.
            let response = handlers::api_versions::unsupported_version_response();
            let bytes = frame::encode_response(api_key, 0, prefix.correlation_id, &response)?;
            return Ok(Some(single(bytes)));
        }
        return Err(FrameError::UnsupportedVersion { api_key, version, correlation_id: prefix.correlation_id });
    }
    let header = frame::decode_header(&mut frame, api_key, version)?;
    let client = Client {
        version,
        client_id: header.client_id.as_ref().map(|s| s.to_string()).unwrap_or_default(),
        host: host.to_string(),
    };
    let correlation_id = header.correlation_id;
    let mut body = frame;

    macro_rules! call {
        ($request:ty, $handler:path) => {{
            let request: $request = frame::decode_body(&mut body, api_key, version)?;
            let response = $handler(ctx, &client, request).await;
            Some(single(frame::encode_response(api_key, version, correlation_id, &response)?))
        }};
    }

    let response = match api_key {
        ApiKey::ApiVersions => call!(ApiVersionsRequest, handlers::api_versions::handle),
        ApiKey::Metadata => call!(MetadataRequest, handlers::metadata::handle),
        ApiKey::Produce => {
            let request: ProduceRequest = frame::decode_body(&mut body, api_key, version)?;
            let acks = request.acks;
            let response = handlers::produce::handle(ctx, &client, request).await;
            if acks == 0 {
                None
            } else {
                Some(single(frame::encode_response(api_key, version, correlation_id, &response)?))
            }
        }
        ApiKey::Fetch => {
            let request: FetchRequest = frame::decode_body(&mut body, api_key, version)?;
            Some(handlers::fetch::handle(ctx, &client, correlation_id, request).await?)
        }
        ApiKey::ListOffsets => call!(ListOffsetsRequest, handlers::list_offsets::handle),
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
        // versions::supported() admitted only the keys above.
        other => return Err(FrameError::UnsupportedVersion { api_key: other, version, correlation_id }),
    };
    Ok(response)
}

fn single(bytes: bytes::BytesMut) -> ResponseFrame {
    ResponseFrame { chunks: vec![frame::Chunk::Bytes(bytes.freeze())] }
}
