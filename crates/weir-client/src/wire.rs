//! Kafka's frames: `[i32 size][request header][body]` out, `[i32 size][response header][body]`
//! back, encoded and decoded with the kafka-protocol crate the broker itself uses.

use std::io::Read;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};

use crate::ClientError;

/// Longest response frame read: a Fetch answer is bounded by the max bytes asked for (a few
/// MiB here), a Metadata answer of 100,000 partitions is about 10 MiB.
pub const RESPONSE_BYTES_MAX: usize = 256 << 20;

pub fn api_key<R: Request>() -> Result<ApiKey, ClientError> {
    ApiKey::try_from(R::KEY).map_err(|_| ClientError::Encode(format!("unknown API key {}", R::KEY)))
}

/// A whole request frame of `request` at `version`, ready to write to the socket.
pub fn encode_request<R: Request>(
    version: i16,
    correlation_id: i32,
    client_id: &str,
    request: &R,
) -> Result<BytesMut, ClientError> {
    let key = api_key::<R>()?;
    let header_version = key.request_header_version(version);
    let mut header = RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id);
    if header_version >= 1 {
        header = header.with_client_id(Some(StrBytes::from_string(client_id.to_string())));
    }
    let mut frame = BytesMut::new();
    frame.put_i32(0);
    header
        .encode(&mut frame, header_version)
        .map_err(|e| ClientError::Encode(format!("{key:?} v{version} header: {e:#}")))?;
    request.encode(&mut frame, version).map_err(|e| ClientError::Encode(format!("{key:?} v{version}: {e:#}")))?;
    let size = i32::try_from(frame.len() - 4)
        .map_err(|_| ClientError::Encode(format!("{key:?} v{version}: a frame of {} bytes", frame.len())))?;
    frame[..4].copy_from_slice(&size.to_be_bytes());
    Ok(frame)
}

/// Reads one response frame and returns it without its size prefix. A size too short for a
/// correlation id, or over [`RESPONSE_BYTES_MAX`], is refused before anything is allocated.
pub fn read_frame(stream: &mut impl Read) -> Result<Bytes, ClientError> {
    let mut size = [0u8; 4];
    stream.read_exact(&mut size)?;
    let size = i32::from_be_bytes(size);
    let Some(size) = usize::try_from(size).ok().filter(|&s| (4..=RESPONSE_BYTES_MAX).contains(&s)) else {
        return Err(ClientError::Decode(format!("response frame size {size}")));
    };
    let mut frame = vec![0u8; size];
    stream.read_exact(&mut frame)?;
    Ok(Bytes::from(frame))
}

/// Decodes a response frame (without its size prefix): its correlation id must be
/// `correlation_id` and the body must decode at `version` with no bytes left over.
pub fn decode_response<R: Request>(
    mut frame: Bytes,
    version: i16,
    correlation_id: i32,
) -> Result<R::Response, ClientError> {
    let key = api_key::<R>().map_err(|e| ClientError::Decode(e.to_string()))?;
    let header = ResponseHeader::decode(&mut frame, key.response_header_version(version))
        .map_err(|e| ClientError::Decode(format!("{key:?} v{version} response header: {e:#}")))?;
    if header.correlation_id != correlation_id {
        return Err(ClientError::Decode(format!(
            "{key:?} v{version}: correlation id {} where {correlation_id} was expected",
            header.correlation_id
        )));
    }
    let response = R::Response::decode(&mut frame, version)
        .map_err(|e| ClientError::Decode(format!("{key:?} v{version} response body: {e:#}")))?;
    if frame.has_remaining() {
        return Err(ClientError::Decode(format!(
            "{key:?} v{version}: {} bytes after the response body",
            frame.remaining()
        )));
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};

    #[test]
    fn a_response_decodes_only_with_its_correlation_id_and_nothing_left_over() {
        let mut frame = BytesMut::new();
        ResponseHeader::default().with_correlation_id(7).encode(&mut frame, 0).expect("header");
        ApiVersionsResponse::default().encode(&mut frame, 0).expect("body");
        let frame = frame.freeze();
        assert!(decode_response::<ApiVersionsRequest>(frame.clone(), 0, 7).is_ok());
        assert!(matches!(decode_response::<ApiVersionsRequest>(frame.clone(), 0, 8), Err(ClientError::Decode(_))));
        let mut longer = BytesMut::from(&frame[..]);
        longer.put_u8(0);
        assert!(matches!(decode_response::<ApiVersionsRequest>(longer.freeze(), 0, 7), Err(ClientError::Decode(_))));
    }

    #[test]
    fn frame_sizes_out_of_bounds_are_refused_unread() {
        for size in [-1i32, 0, 3, (RESPONSE_BYTES_MAX + 1) as i32] {
            let mut bytes = size.to_be_bytes().to_vec();
            bytes.extend_from_slice(&[0; 8]);
            assert!(matches!(read_frame(&mut &bytes[..]), Err(ClientError::Decode(_))), "size {size}");
        }
        assert_eq!(&read_frame(&mut &[0, 0, 0, 4, 1, 2, 3, 4][..]).expect("4 bytes")[..], &[1, 2, 3, 4]);
        assert!(matches!(read_frame(&mut &[0, 0, 0, 8, 1, 2][..]), Err(ClientError::Closed)));
    }
}
