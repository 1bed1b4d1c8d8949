//! The wire format: one message is one frame, big-endian.
//!
//! ```text
//!  u32 length      bytes that follow this field (header + method + body), at most the limit
//!  u8  version     1
//!  u8  kind        0 request, 1 response, 2 error
//!  u64 correlation the caller's id for the call; 0 is never a call's: an error frame with id 0
//!                  is about the whole connection, which its sender closes next
//!  u16 method len  1..=65535 in a request, 0 in a response or an error
//!  ... method      UTF-8, requests only
//!  ... body        the rest: the handler's bytes; in an error frame, a u8 code and a UTF-8 message
//! ```
//!
//! An error code with its high bit set (0x80 and up) means the sender closes the connection
//! after this frame and reads nothing more from it; this holds for codes of later versions too,
//! so a reader knows whether the connection goes on without knowing the code.
//!
//! The first five bytes (length, version) keep their meaning in every version to come, so a
//! reader can refuse any frame without understanding it, and a peer of any version can read the
//! version-1 error frame that tells it which versions this one speaks.
//!
//! A frame is refused on its length before anything past the 12-byte header is read: a declared
//! length is never allocated unless it is within the limit.

use std::io;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::OwnedSemaphorePermit;

/// The version this crate writes, and the only one it reads.
pub(crate) const VERSION: u8 = 1;
/// The versions a server answers, as its error frame for any other names them.
pub(crate) const SUPPORTED_VERSIONS: &[u8] = &[VERSION];

/// The default limit on a frame's length field: 16 MiB holds a Raft snapshot chunk or a batch
/// of log entries with room to spare, and bounds what one call can make a peer allocate.
pub(crate) const DEFAULT_MAX_FRAME_BYTES: u32 = 16 * 1024 * 1024;
/// The smallest limit a client or server may be configured with: an error frame with the
/// longest message ([`MAX_ERROR_MESSAGE_BYTES`]) must always fit.
pub(crate) const MIN_MAX_FRAME_BYTES: u32 = 8 * 1024;
/// Error messages are cut to this many bytes (at a character boundary) on the wire.
pub(crate) const MAX_ERROR_MESSAGE_BYTES: usize = 4 * 1024;

/// Asserts that a configured frame limit is usable.
///
/// # Panics
/// If `max_frame_bytes` is below [`MIN_MAX_FRAME_BYTES`].
pub(crate) fn check_max_frame_bytes(max_frame_bytes: u32) {
    assert!(
        max_frame_bytes >= MIN_MAX_FRAME_BYTES,
        "max_frame_bytes={max_frame_bytes} is below the minimum of {MIN_MAX_FRAME_BYTES}"
    );
}

const LENGTH_BYTES: usize = 4;
/// Version, kind, correlation id and method length: what follows the length in every frame.
pub(crate) const HEADER_BYTES: usize = 1 + 1 + 8 + 2;
/// The correlation id of error frames about the connection rather than one call.
pub(crate) const CONNECTION_ID: u64 = 0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Request,
    Response,
    Error,
}

impl Kind {
    fn byte(self) -> u8 {
        match self {
            Kind::Request => 0,
            Kind::Response => 1,
            Kind::Error => 2,
        }
    }

    fn from_byte(byte: u8) -> Option<Kind> {
        match byte {
            0 => Some(Kind::Request),
            1 => Some(Kind::Response),
            2 => Some(Kind::Error),
            _ => None,
        }
    }
}

/// The first byte of an error frame's body: what kind of failure the message describes, and
/// (its high bit, [`CLOSES_CONNECTION`]) whether the connection ends with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorCode {
    /// The handler answered with an error (unknown methods included).
    Handler,
    /// The handler's response is larger than the server's limit.
    ResponseTooLarge,
    /// The request is larger than the server's limit; closes the connection.
    RequestTooLarge,
    /// The frame's version is not one the server speaks; the message lists those it does.
    UnsupportedVersion,
    /// The frame breaks this format.
    Malformed,
    /// The server will not serve this connection (too many connections, shutting down). It
    /// has answered every request it read from it, so the calls still pending were not read.
    Refused,
}

/// The bit of an error code that says the sender closes the connection after the frame.
pub(crate) const CLOSES_CONNECTION: u8 = 0x80;

impl ErrorCode {
    fn byte(self) -> u8 {
        match self {
            ErrorCode::Handler => 0x01,
            ErrorCode::ResponseTooLarge => 0x02,
            ErrorCode::RequestTooLarge => 0x81,
            ErrorCode::UnsupportedVersion => 0x82,
            ErrorCode::Malformed => 0x83,
            ErrorCode::Refused => 0x84,
        }
    }

    fn from_byte(byte: u8) -> Option<ErrorCode> {
        [
            ErrorCode::Handler,
            ErrorCode::ResponseTooLarge,
            ErrorCode::RequestTooLarge,
            ErrorCode::UnsupportedVersion,
            ErrorCode::Malformed,
            ErrorCode::Refused,
        ]
        .into_iter()
        .find(|code| code.byte() == byte)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub kind: Kind,
    pub correlation_id: u64,
    pub method_bytes: u16,
}

/// A frame read whole: its method (empty unless a request) and body share one allocation.
#[derive(Debug)]
pub(crate) struct Frame {
    pub header: Header,
    pub method: Bytes,
    pub body: Bytes,
}

/// Why no frame could be read. After any of these but [`ReadError::TooLarge`] the stream is
/// not at a frame boundary any more and must be closed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error("the peer closed the connection")]
    Closed,
    #[error("the connection ended in the middle of a frame")]
    Truncated,
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("frame version {0} is not supported (supported: {versions})", versions = versions_list())]
    UnsupportedVersion(u8),
    /// An unsupported version after bytes that start a TLS record: one side of the connection
    /// speaks TLS and the other does not. Still names the versions, as any refused version does.
    #[error(
        "a TLS record where a frame should start: TLS is set up on one side of the connection only (frame versions supported: {versions})",
        versions = versions_list()
    )]
    Tls,
    /// The header was read and is sound; the `length - HEADER_BYTES` bytes after it were not.
    #[error("a frame of {length} bytes exceeds the limit of {max} bytes")]
    TooLarge { header: Header, length: u32, max: u32 },
    #[error("malformed frame: {reason}")]
    Malformed { correlation_id: Option<u64>, reason: String },
}

/// "1" today; "1, 2" once there are two.
pub(crate) fn versions_list() -> String {
    SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ")
}

fn eof_is_truncation(e: io::Error) -> ReadError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        ReadError::Truncated
    } else {
        ReadError::Io(e)
    }
}

/// Reads the next frame. A frame over `max` is refused after its header ([`ReadError::TooLarge`]):
/// the caller decides whether to [`skip`] its payload or close the connection.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R, max: u32) -> Result<Frame, ReadError> {
    let mut length = [0u8; LENGTH_BYTES];
    // A clean end of stream is one that falls between frames.
    if reader.read(&mut length[..1]).await? == 0 {
        return Err(ReadError::Closed);
    }
    reader.read_exact(&mut length[1..]).await.map_err(eof_is_truncation)?;
    let length_bytes = length;
    let length = u32::from_be_bytes(length);
    if length == 0 {
        return Err(ReadError::Malformed { correlation_id: None, reason: "empty frame".into() });
    }
    let version = reader.read_u8().await.map_err(eof_is_truncation)?;
    if version != VERSION {
        // A TLS record begins with its content type (20 to 23) and the major version 3: what a
        // TLS server's alert or a TLS client's hello puts where a frame's length should be.
        if matches!(length_bytes, [20..=23, 3, ..]) {
            return Err(ReadError::Tls);
        }
        return Err(ReadError::UnsupportedVersion(version));
    }
    if (length as usize) < HEADER_BYTES {
        let reason = format!("a frame of {length} bytes is shorter than the {HEADER_BYTES}-byte header");
        return Err(ReadError::Malformed { correlation_id: None, reason });
    }
    let mut rest = [0u8; HEADER_BYTES - 1];
    reader.read_exact(&mut rest).await.map_err(eof_is_truncation)?;
    let [kind, c0, c1, c2, c3, c4, c5, c6, c7, m0, m1] = rest;
    let correlation_id = u64::from_be_bytes([c0, c1, c2, c3, c4, c5, c6, c7]);
    let method_bytes = u16::from_be_bytes([m0, m1]);
    let Some(kind) = Kind::from_byte(kind) else {
        return Err(ReadError::Malformed {
            correlation_id: Some(correlation_id),
            reason: format!("unknown kind {kind}"),
        });
    };
    let header = Header { kind, correlation_id, method_bytes };
    if length > max {
        return Err(ReadError::TooLarge { header, length, max });
    }
    let payload_bytes = length as usize - HEADER_BYTES;
    let malformed = |reason: String| ReadError::Malformed { correlation_id: Some(correlation_id), reason };
    if usize::from(method_bytes) > payload_bytes {
        return Err(malformed(format!("a method of {method_bytes} bytes in a frame of {length}")));
    }
    match (kind, method_bytes) {
        (Kind::Request, 0) => return Err(malformed("a request without a method".into())),
        (Kind::Response | Kind::Error, 1..) => return Err(malformed(format!("a {kind:?} that names a method"))),
        _ => {}
    }
    let mut payload = BytesMut::with_capacity(payload_bytes);
    let mut limited = (&mut *reader).take(payload_bytes as u64);
    while payload.len() < payload_bytes {
        if limited.read_buf(&mut payload).await? == 0 {
            return Err(ReadError::Truncated);
        }
    }
    let mut body = payload.freeze();
    let method = body.split_to(usize::from(method_bytes));
    Ok(Frame { header, method, body })
}

/// Reads and drops the payload of a frame refused for its size, through a small buffer.
pub(crate) async fn skip<R: AsyncRead + Unpin>(reader: &mut R, header_length: u32) -> Result<(), ReadError> {
    let payload_bytes = u64::from(header_length).saturating_sub(HEADER_BYTES as u64);
    let skipped = tokio::io::copy(&mut (&mut *reader).take(payload_bytes), &mut tokio::io::sink()).await?;
    if skipped < payload_bytes {
        return Err(ReadError::Truncated);
    }
    Ok(())
}

/// A frame ready to be written: its length, header and method in `head`, then `body` as the
/// caller gave it (never copied here).
#[derive(Debug)]
pub(crate) struct OutFrame {
    pub correlation_id: u64,
    pub(crate) head: Bytes,
    pub body: Bytes,
    /// The server's in-flight slot of the request this answers: held until the frame is
    /// written, so queued responses count against the limit too.
    pub permit: Option<OwnedSemaphorePermit>,
}

/// A frame whose length field would exceed the limit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Oversize {
    pub length: u64,
    pub max: u32,
}

impl OutFrame {
    fn new(kind: Kind, correlation_id: u64, method: &[u8], body: Bytes, max: u32) -> Result<OutFrame, Oversize> {
        let length = (HEADER_BYTES + method.len()) as u64 + body.len() as u64;
        if length > u64::from(max) || method.len() > usize::from(u16::MAX) {
            return Err(Oversize { length, max });
        }
        Ok(OutFrame::encode(kind, correlation_id, method, body))
    }

    /// The frame, whose length the caller has checked: it fits a `u32` and the method a `u16`.
    fn encode(kind: Kind, correlation_id: u64, method: &[u8], body: Bytes) -> OutFrame {
        let length = HEADER_BYTES + method.len() + body.len();
        debug_assert!(u32::try_from(length).is_ok() && u16::try_from(method.len()).is_ok());
        let mut head = BytesMut::with_capacity(LENGTH_BYTES + HEADER_BYTES + method.len());
        head.put_u32(length as u32);
        head.put_u8(VERSION);
        head.put_u8(kind.byte());
        head.put_u64(correlation_id);
        head.put_u16(method.len() as u16);
        head.put_slice(method);
        OutFrame { correlation_id, head: head.freeze(), body, permit: None }
    }

    /// A request; `method` must be 1..=65535 bytes (the caller checks, to say so in its error).
    pub fn request(correlation_id: u64, method: &str, body: Bytes, max: u32) -> Result<OutFrame, Oversize> {
        debug_assert!(!method.is_empty() && method.len() <= usize::from(u16::MAX));
        OutFrame::new(Kind::Request, correlation_id, method.as_bytes(), body, max)
    }

    pub fn response(correlation_id: u64, body: Bytes, max: u32) -> Result<OutFrame, Oversize> {
        OutFrame::new(Kind::Response, correlation_id, &[], body, max)
    }

    /// An error frame; always fits, as every limit is at least [`MIN_MAX_FRAME_BYTES`].
    pub fn error(correlation_id: u64, code: ErrorCode, message: &str) -> OutFrame {
        let message = truncate(message, MAX_ERROR_MESSAGE_BYTES);
        let mut body = BytesMut::with_capacity(1 + message.len());
        body.put_u8(code.byte());
        body.put_slice(message.as_bytes());
        // At most 12 + 1 + 4096 bytes, under every limit.
        OutFrame::encode(Kind::Error, correlation_id, &[], body.freeze())
    }

    /// Every byte of the frame, for writes that cannot take two buffers.
    pub(crate) fn to_bytes(&self) -> Bytes {
        let mut all = BytesMut::with_capacity(self.head.len() + self.body.len());
        all.put_slice(&self.head);
        all.put_slice(&self.body);
        all.freeze()
    }
}

pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(writer: &mut W, frame: &OutFrame) -> io::Result<()> {
    writer.write_all(&frame.head).await?;
    if !frame.body.is_empty() {
        writer.write_all(&frame.body).await?;
    }
    Ok(())
}

/// An error frame's body: its code (`None` if this version does not know it) and message.
pub(crate) fn parse_error(body: &[u8]) -> (Option<ErrorCode>, u8, String) {
    match body.split_first() {
        Some((&code, message)) => (ErrorCode::from_byte(code), code, String::from_utf8_lossy(message).into_owned()),
        None => (None, 0, String::new()),
    }
}

/// The longest prefix of `text` of at most `max` bytes that ends at a character boundary.
fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().expect("runtime").block_on(future)
    }

    fn read(bytes: &[u8], max: u32) -> Result<Frame, ReadError> {
        let mut reader = bytes;
        block_on(read_frame(&mut reader, max))
    }

    #[test]
    fn a_request_frame_has_the_documented_layout() {
        let frame = OutFrame::request(0x0102_0304_0506_0708, "ab", Bytes::from_static(b"xyz"), 1024).unwrap();
        let bytes = frame.to_bytes();
        #[rustfmt::skip]
        let expected: &[u8] = &[
            0, 0, 0, 17,                // length: 12 + 2 + 3
            1,                          // version
            0,                          // kind: request
            1, 2, 3, 4, 5, 6, 7, 8,     // correlation id
            0, 2,                       // method length
            b'a', b'b',                 // method
            b'x', b'y', b'z',           // body
        ];
        assert_eq!(&bytes[..], expected);
        let back = read(&bytes, 1024).unwrap();
        assert_eq!(back.header, Header { kind: Kind::Request, correlation_id: 0x0102_0304_0506_0708, method_bytes: 2 });
        assert_eq!(&back.method[..], b"ab");
        assert_eq!(&back.body[..], b"xyz");
    }

    #[test]
    fn an_error_frame_carries_its_code_and_a_message_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_ERROR_MESSAGE_BYTES); // two bytes each
        let frame = OutFrame::error(7, ErrorCode::ResponseTooLarge, &long);
        let back = read(&frame.to_bytes(), MIN_MAX_FRAME_BYTES).unwrap();
        assert_eq!(back.header.kind, Kind::Error);
        let (code, _, message) = parse_error(&back.body);
        assert_eq!(code, Some(ErrorCode::ResponseTooLarge));
        assert_eq!(message.len(), MAX_ERROR_MESSAGE_BYTES);
        assert!(message.chars().all(|c| c == 'é'));
    }

    #[test]
    fn a_frame_over_the_limit_is_refused_after_its_header() {
        let mut bytes = vec![0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 1];
        bytes.extend_from_slice(b"m"); // nothing else: a reader that allocated would wait for 4 GiB
        match read(&bytes, 1024) {
            Err(ReadError::TooLarge { header, length: u32::MAX, max: 1024 }) => assert_eq!(header.correlation_id, 9),
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert!(matches!(
            OutFrame::response(1, Bytes::from(vec![0; 1024]), 1024),
            Err(Oversize { length: 1036, max: 1024 })
        ));
    }

    #[test]
    fn bad_headers_are_named() {
        assert!(matches!(read(&[], 1024), Err(ReadError::Closed)));
        assert!(matches!(read(&[0, 0], 1024), Err(ReadError::Truncated)));
        assert!(matches!(read(&[0, 0, 0, 0], 1024), Err(ReadError::Malformed { .. })));
        assert!(matches!(read(&[0, 0, 0, 12, 2], 1024), Err(ReadError::UnsupportedVersion(2))));
        // A TLS alert (content type 21, version 3.3, length 2) where a frame should be.
        let tls_alert = [21, 3, 3, 0, 2, 2, 40];
        assert!(matches!(read(&tls_alert, 1024), Err(ReadError::Tls)));
        assert!(ReadError::Tls.to_string().contains("supported: 1"));
        assert!(matches!(read(&[0, 0, 0, 5, 1], 1024), Err(ReadError::Malformed { correlation_id: None, .. })));
        let unknown_kind = [0, 0, 0, 12, 1, 7, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0];
        assert!(matches!(read(&unknown_kind, 1024), Err(ReadError::Malformed { correlation_id: Some(3), .. })));
        let request_without_method = [0, 0, 0, 12, 1, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0];
        assert!(matches!(read(&request_without_method, 1024), Err(ReadError::Malformed { .. })));
        let response_with_method = [0, 0, 0, 13, 1, 1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 1, b'm'];
        assert!(matches!(read(&response_with_method, 1024), Err(ReadError::Malformed { .. })));
        let method_past_the_end = [0, 0, 0, 13, 1, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 2, b'm'];
        assert!(matches!(read(&method_past_the_end, 1024), Err(ReadError::Malformed { .. })));
        let short_body = [0, 0, 0, 20, 1, 1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 1];
        assert!(matches!(read(&short_body, 1024), Err(ReadError::Truncated)));
    }

    #[test]
    fn skip_drops_a_refused_payload_and_leaves_the_next_frame() {
        let next = OutFrame::response(2, Bytes::from_static(b"ok"), 1024).unwrap().to_bytes();
        let mut bytes = OutFrame::response(1, Bytes::from(vec![7; 3000]), 4096).unwrap().to_bytes().to_vec();
        bytes.extend_from_slice(&next);
        let mut reader = &bytes[..];
        block_on(async {
            let Err(ReadError::TooLarge { length, .. }) = read_frame(&mut reader, 1024).await else {
                panic!("expected TooLarge");
            };
            skip(&mut reader, length).await.unwrap();
            let frame = read_frame(&mut reader, 1024).await.unwrap();
            assert_eq!((frame.header.correlation_id, &frame.body[..]), (2, &b"ok"[..]));
        });
    }

    proptest! {
        /// Whatever the bytes, reading never panics, and a frame read back encodes to the
        /// bytes it came from.
        #[test]
        fn reading_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64), max in 12u32..48) {
            if let Ok(frame) = read(&bytes, max) {
                let out = match frame.header.kind {
                    Kind::Request => {
                        let method = std::str::from_utf8(&frame.method).map(str::to_owned);
                        match method {
                            Ok(method) => OutFrame::request(frame.header.correlation_id, &method, frame.body.clone(), max),
                            Err(_) => return Ok(()),
                        }
                    }
                    Kind::Response => OutFrame::response(frame.header.correlation_id, frame.body.clone(), max),
                    Kind::Error => OutFrame::new(Kind::Error, frame.header.correlation_id, &[], frame.body.clone(), max),
                };
                let out = out.expect("a frame that was read fits the limit it was read under");
                let encoded = out.to_bytes();
                prop_assert_eq!(&encoded[..], &bytes[..encoded.len()]);
            }
        }
    }
}
