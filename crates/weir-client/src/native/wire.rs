//! The SessionWrite request and response, Weir's own API on the Kafka listener
//! (`docs/native-protocol.md` describes it for other implementations).
//!
//! A SessionWrite frame is a Kafka frame: `[i32 size][request header v1][body]`, answered with
//! `[i32 size][response header v0][body]`, all integers big-endian. Its API key,
//! [`SESSION_WRITE_KEY`], is outside Kafka's range; version 0 is the only one. Fields, in order:
//!
//! | request              | type            | response             | type            |
//! |----------------------|-----------------|----------------------|-----------------|
//! | topic                | STRING          | error_code           | INT16           |
//! | partition            | INT32           | error_message        | NULLABLE_STRING |
//! | partition_version    | INT64 (-1 none) | partition_version    | INT64           |
//! | load_stamp           | INT64 (-1 none) | load_stamp           | INT64           |
//! | producer_id          | INT64           | checkpoint           | INT64           |
//! | checkpoint_after     | INT64           | log_end_offset       | INT64           |
//! | max_wait_ms          | INT32           | base_offset          | INT64 (-1 none) |
//! | records              | NULLABLE_BYTES  | last_offset          | INT64 (-1 none) |
//! |                      |                 | writer_epoch         | INT16 (-1 none) |
//! |                      |                 | writer_sequence      | INT32 (-1 none) |
//! |                      |                 | writer_last_offset   | INT64 (-1 none) |
//!
//! `records` comes last so that a broker can take it out of the frame without a copy.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The API key of SessionWrite (Kafka's own keys are below 100).
pub const SESSION_WRITE_KEY: i16 = 22341;
/// The only version of SessionWrite.
pub const SESSION_WRITE_VERSION: i16 = 0;

/// The error code of a stale session: the (V, S) named is not the partition's (Kafka's
/// FENCED_LEADER_EPOCH). The response carries the current triple and the writer's progress.
pub const STALE_SESSION: i16 = 74;

/// What a writer asks of one partition. See the module doc for the encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionWriteRequest {
    pub topic: String,
    pub partition: i32,
    /// The (V, S) the writer holds, or `None` to open a session.
    pub session: Option<(i64, i64)>,
    /// The writer's idempotent producer id (its batches carry it).
    pub producer_id: i64,
    /// With no records: answer once the checkpoint is above this offset, or after
    /// `max_wait_ms`.
    pub checkpoint_after: i64,
    pub max_wait_ms: i32,
    /// One record batch (Kafka's v2 format) of the producer, or `None` to ask for the triple.
    pub records: Option<Bytes>,
}

/// The broker's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionWriteResponse {
    /// 0, [`STALE_SESSION`], or a Kafka error code.
    pub error_code: i16,
    pub error_message: Option<String>,
    /// V.
    pub partition_version: i64,
    /// S.
    pub load_stamp: i64,
    /// C: every record below it is persisted.
    pub checkpoint: i64,
    pub log_end_offset: i64,
    /// The offsets the batch got (its first ones when it was a duplicate); -1 when none.
    pub base_offset: i64,
    pub last_offset: i64,
    /// The producer's last batch in the log: its epoch, last sequence number and that
    /// record's offset; -1 each when the log holds none.
    pub writer_epoch: i16,
    pub writer_sequence: i32,
    pub writer_last_offset: i64,
}

/// Why a SessionWrite body does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed SessionWrite: {0}")]
pub struct MalformedSessionWrite(pub String);

fn need(buf: &Bytes, bytes: usize, field: &str) -> Result<(), MalformedSessionWrite> {
    if buf.remaining() < bytes {
        return Err(MalformedSessionWrite(format!("{field} is cut short")));
    }
    Ok(())
}

fn get_i16(buf: &mut Bytes, field: &str) -> Result<i16, MalformedSessionWrite> {
    need(buf, 2, field)?;
    Ok(buf.get_i16())
}

fn get_i32(buf: &mut Bytes, field: &str) -> Result<i32, MalformedSessionWrite> {
    need(buf, 4, field)?;
    Ok(buf.get_i32())
}

fn get_i64(buf: &mut Bytes, field: &str) -> Result<i64, MalformedSessionWrite> {
    need(buf, 8, field)?;
    Ok(buf.get_i64())
}

fn get_string(buf: &mut Bytes, field: &str) -> Result<Option<String>, MalformedSessionWrite> {
    let len = get_i16(buf, field)?;
    if len < 0 {
        return Ok(None);
    }
    need(buf, len as usize, field)?;
    let bytes = buf.split_to(len as usize);
    String::from_utf8(bytes.to_vec()).map(Some).map_err(|_| MalformedSessionWrite(format!("{field} is not UTF-8")))
}

fn put_string(buf: &mut BytesMut, value: Option<&str>) {
    match value {
        // Longer strings are cut at a character boundary: they are names and messages.
        Some(s) => {
            let mut end = s.len().min(i16::MAX as usize);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            buf.put_i16(end as i16);
            buf.put_slice(&s.as_bytes()[..end]);
        }
        None => buf.put_i16(-1),
    }
}

impl SessionWriteRequest {
    /// Appends the body to `buf`.
    pub fn encode(&self, buf: &mut BytesMut) {
        put_string(buf, Some(&self.topic));
        buf.put_i32(self.partition);
        let (version, stamp) = self.session.unwrap_or((-1, -1));
        buf.put_i64(version);
        buf.put_i64(stamp);
        buf.put_i64(self.producer_id);
        buf.put_i64(self.checkpoint_after);
        buf.put_i32(self.max_wait_ms);
        match &self.records {
            Some(records) => {
                buf.put_i32(records.len() as i32);
                buf.put_slice(records);
            }
            None => buf.put_i32(-1),
        }
    }

    /// Decodes a body; `records` is a slice of `body`, which nothing else follows.
    pub fn decode(mut body: Bytes) -> Result<SessionWriteRequest, MalformedSessionWrite> {
        let topic = get_string(&mut body, "topic")?.ok_or_else(|| MalformedSessionWrite("no topic".into()))?;
        let partition = get_i32(&mut body, "partition")?;
        let version = get_i64(&mut body, "partition_version")?;
        let stamp = get_i64(&mut body, "load_stamp")?;
        let producer_id = get_i64(&mut body, "producer_id")?;
        let checkpoint_after = get_i64(&mut body, "checkpoint_after")?;
        let max_wait_ms = get_i32(&mut body, "max_wait_ms")?;
        let len = get_i32(&mut body, "records")?;
        let records = if len < 0 {
            None
        } else {
            need(&body, len as usize, "records")?;
            Some(body.split_to(len as usize))
        };
        if body.has_remaining() {
            return Err(MalformedSessionWrite(format!("{} bytes after the records", body.remaining())));
        }
        let session = (version >= 0 || stamp >= 0).then_some((version, stamp));
        Ok(SessionWriteRequest { topic, partition, session, producer_id, checkpoint_after, max_wait_ms, records })
    }
}

impl SessionWriteResponse {
    /// An answer carrying only an error (nothing known of the partition).
    pub fn error(error_code: i16, message: impl Into<String>) -> SessionWriteResponse {
        SessionWriteResponse {
            error_code,
            error_message: Some(message.into()),
            partition_version: -1,
            load_stamp: -1,
            checkpoint: -1,
            log_end_offset: -1,
            base_offset: -1,
            last_offset: -1,
            writer_epoch: -1,
            writer_sequence: -1,
            writer_last_offset: -1,
        }
    }

    pub fn encode(&self, buf: &mut BytesMut) {
        buf.put_i16(self.error_code);
        put_string(buf, self.error_message.as_deref());
        buf.put_i64(self.partition_version);
        buf.put_i64(self.load_stamp);
        buf.put_i64(self.checkpoint);
        buf.put_i64(self.log_end_offset);
        buf.put_i64(self.base_offset);
        buf.put_i64(self.last_offset);
        buf.put_i16(self.writer_epoch);
        buf.put_i32(self.writer_sequence);
        buf.put_i64(self.writer_last_offset);
    }

    pub fn decode(mut body: Bytes) -> Result<SessionWriteResponse, MalformedSessionWrite> {
        let response = SessionWriteResponse {
            error_code: get_i16(&mut body, "error_code")?,
            error_message: get_string(&mut body, "error_message")?,
            partition_version: get_i64(&mut body, "partition_version")?,
            load_stamp: get_i64(&mut body, "load_stamp")?,
            checkpoint: get_i64(&mut body, "checkpoint")?,
            log_end_offset: get_i64(&mut body, "log_end_offset")?,
            base_offset: get_i64(&mut body, "base_offset")?,
            last_offset: get_i64(&mut body, "last_offset")?,
            writer_epoch: get_i16(&mut body, "writer_epoch")?,
            writer_sequence: get_i32(&mut body, "writer_sequence")?,
            writer_last_offset: get_i64(&mut body, "writer_last_offset")?,
        };
        if body.has_remaining() {
            return Err(MalformedSessionWrite(format!("{} bytes after the response", body.remaining())));
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_responses_round_trip_and_truncations_are_refused() {
        let request = SessionWriteRequest {
            topic: "orders".into(),
            partition: 3,
            session: Some((11, 1_700_000_000_000)),
            producer_id: 42,
            checkpoint_after: 99,
            max_wait_ms: 500,
            records: Some(Bytes::from_static(b"batch")),
        };
        let mut buf = BytesMut::new();
        request.encode(&mut buf);
        let bytes = buf.freeze();
        assert_eq!(SessionWriteRequest::decode(bytes.clone()), Ok(request));
        for cut in 0..bytes.len() {
            assert!(SessionWriteRequest::decode(bytes.slice(..cut)).is_err(), "cut at {cut}");
        }
        let mut longer = BytesMut::from(&bytes[..]);
        longer.put_u8(0);
        assert!(SessionWriteRequest::decode(longer.freeze()).is_err());

        let mut response = SessionWriteResponse::error(STALE_SESSION, "stale");
        response.writer_sequence = 9;
        let mut buf = BytesMut::new();
        response.encode(&mut buf);
        let bytes = buf.freeze();
        assert_eq!(SessionWriteResponse::decode(bytes.clone()), Ok(response));
        assert!(SessionWriteResponse::decode(bytes.slice(..bytes.len() - 1)).is_err());
    }

    #[test]
    fn a_request_without_a_session_or_records_says_so() {
        let request = SessionWriteRequest {
            topic: "t".into(),
            partition: 0,
            session: None,
            producer_id: 1,
            checkpoint_after: -1,
            max_wait_ms: 0,
            records: None,
        };
        let mut buf = BytesMut::new();
        request.encode(&mut buf);
        assert_eq!(SessionWriteRequest::decode(buf.freeze()), Ok(request));
    }
}
