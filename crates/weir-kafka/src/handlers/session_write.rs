//! SessionWrite, Weir's native write API on the Kafka listener (Swift's write protocol: see
//! `weir_broker::session` for what it means, `weir_client::native::wire` for its encoding).
//!
//! It is not a Kafka API: its key is outside Kafka's range and ApiVersions does not list it,
//! so Kafka clients never meet it. Every failure is answered in a SessionWrite response (a
//! version this broker does not know included); only a frame too short for its header closes
//! the connection.

use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::ResponseError;
use weir_broker::partition;
use weir_broker::session::{SessionWrite, SessionWriteOutcome};
use weir_broker::storage::BatchHeader;
use weir_client::native::wire::{
    SessionWriteRequest, SessionWriteResponse, SESSION_WRITE_KEY, SESSION_WRITE_VERSION, STALE_SESSION,
};

use weir_security::acl::{AclOperation, ResourceType};

use crate::context::{Ctx, Peer, API_SLOTS};
use crate::dispatch::Reply;
use crate::errors::kafka_error;
use crate::frame::{self, Chunk, FrameError, ResponseFrame};

/// The metrics slot of SessionWrite: the last one, above Kafka's keys.
const METRICS_SLOT: i32 = API_SLOTS as i32 - 1;

/// Whether a request frame is a SessionWrite.
pub(crate) fn is_session_write(frame: &Bytes) -> bool {
    frame::peek_prefix(frame).is_ok_and(|p| p.api_key == SESSION_WRITE_KEY)
}

pub(crate) async fn handle(ctx: &Ctx, peer: &Peer, mut frame: Bytes) -> Result<Reply, FrameError> {
    let started = Instant::now();
    let prefix = frame::peek_prefix(&frame)?;
    let correlation_id = prefix.correlation_id;
    let response = if prefix.version != SESSION_WRITE_VERSION {
        SessionWriteResponse::error(
            ResponseError::UnsupportedVersion.code(),
            format!("SessionWrite v{} is unknown here: this broker speaks v{SESSION_WRITE_VERSION}", prefix.version),
        )
    } else {
        match skip_header(&mut frame).and_then(|()| SessionWriteRequest::decode(frame).map_err(|e| e.to_string())) {
            Ok(request)
                if !ctx.broker.authorize(
                    &peer.principal,
                    &peer.host,
                    AclOperation::Write,
                    ResourceType::Topic,
                    &request.topic,
                ) =>
            {
                SessionWriteResponse::error(
                    ResponseError::TopicAuthorizationFailed.code(),
                    format!("WRITE on topic {} is needed", request.topic),
                )
            }
            Ok(request) => write(ctx, request).await,
            Err(reason) => SessionWriteResponse::error(ResponseError::InvalidRequest.code(), reason),
        }
    };
    if let Some(metrics) = ctx.metrics.operation(METRICS_SLOT, || "SessionWrite".to_string()) {
        metrics.observe(started.elapsed());
        metrics.count_errors([i32::from(response.error_code)]);
    }
    let mut out = BytesMut::new();
    out.put_i32(0);
    out.put_i32(correlation_id);
    response.encode(&mut out);
    let size = (out.len() - 4) as i32;
    out[..4].copy_from_slice(&size.to_be_bytes());
    Ok(Reply::Now(Some(ResponseFrame { chunks: vec![Chunk::Bytes(out.freeze())] })))
}

/// Consumes the request header (v1: key, version, correlation id, client id).
fn skip_header(frame: &mut Bytes) -> Result<(), String> {
    if frame.remaining() < 10 {
        return Err("the request header is cut short".into());
    }
    frame.advance(8);
    let client_id_len = frame.get_i16();
    let skip = usize::try_from(client_id_len).unwrap_or(0);
    if frame.remaining() < skip {
        return Err("the client id is cut short".into());
    }
    frame.advance(skip);
    Ok(())
}

async fn write(ctx: &Ctx, request: SessionWriteRequest) -> SessionWriteResponse {
    let broker = &ctx.broker;
    let partitions = broker.topic_partitions(&request.topic);
    let Some(partition) = partitions.as_deref().and_then(|list| partition::by_index(list, request.partition)).cloned()
    else {
        let e = broker.absent_partition_error(&request.topic, request.partition);
        return SessionWriteResponse::error(kafka_error(e.kind).code(), e.message);
    };
    let records = match request.records {
        None => None,
        Some(records) => match check_batch(&records, request.producer_id) {
            // The slice is the frame's last piece and nothing else holds the frame now: the log
            // assigns offsets in it without a copy.
            Ok(()) => Some(records.try_into_mut().unwrap_or_else(|shared| BytesMut::from(&shared[..]))),
            Err(reason) => return SessionWriteResponse::error(ResponseError::InvalidRecord.code(), reason),
        },
    };
    let wait = (request.max_wait_ms > 0)
        .then(|| (request.checkpoint_after, Duration::from_millis(request.max_wait_ms as u64)));
    let outcome = broker
        .session_write(
            partition,
            SessionWrite { session: request.session, producer_id: request.producer_id, records, wait },
        )
        .await;
    respond(outcome)
}

/// A native write carries one batch of the writer's idempotent producer id: its sequence
/// numbers are what a resend after a stale session is counted by.
fn check_batch(records: &[u8], producer_id: i64) -> Result<(), String> {
    let header = BatchHeader::parse(records).ok_or("the records are shorter than a batch header")?;
    if header.producer_id != producer_id || producer_id < 0 {
        return Err(format!(
            "the batch's producer id {} is not the writer's {producer_id}: a native write carries a batch of its \
             idempotent producer",
            header.producer_id
        ));
    }
    Ok(())
}

fn respond(outcome: SessionWriteOutcome) -> SessionWriteResponse {
    let SessionWriteOutcome { result, stamp, writer } = outcome;
    let (error_code, error_message, base_offset, last_offset) = match result {
        Ok(Some(info)) => (0, None, info.first_offset, info.last_offset),
        Ok(None) => (0, None, -1, -1),
        Err(e) if e.kind == weir_broker::ErrorKind::FencedLeaderEpoch => (STALE_SESSION, Some(e.message), -1, -1),
        Err(e) => (kafka_error(e.kind).code(), Some(e.message), -1, -1),
    };
    SessionWriteResponse {
        error_code,
        error_message,
        partition_version: stamp.version,
        load_stamp: stamp.load_stamp,
        checkpoint: stamp.checkpoint,
        log_end_offset: stamp.log_end_offset,
        base_offset,
        last_offset,
        writer_epoch: writer.map_or(-1, |w| w.epoch),
        writer_sequence: writer.map_or(-1, |w| w.last_sequence),
        writer_last_offset: writer.map_or(-1, |w| w.last_offset),
    }
}
