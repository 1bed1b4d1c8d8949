//! A minimal blocking Kafka client on a plain `TcpStream`: encode a request with the
//! kafka-protocol crate the broker itself uses, write it, read one response frame, decode it.
//! No buffering layer, no batching, no threads of its own, so it costs next to nothing next to
//! the broker it talks to.
//!
//! It serves the raw-protocol benchmarks (`weir bench fetch`, `weir bench produce`) and the
//! black-box tests of the binary (`crates/weir/tests`). Both need what a full client hides:
//! requests at any version, pipelining ([`Client::write`], then [`Client::read`] in order),
//! bytes that are no request at all ([`Client::write_raw`]), and errors that tell "the broker
//! closed the connection" from "nothing arrived in time" ([`ClientError`]).
//!
//! **API boundary:** nothing here knows the broker's internals; only the Kafka wire format.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::fetch_request::FetchPartition;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};

/// Why a request got no decodable response.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {addr}: {error}")]
    Connect { addr: SocketAddr, error: std::io::Error },
    /// The broker closed the connection (end of stream, reset, broken pipe) instead of answering.
    #[error("the broker closed the connection instead of answering")]
    Closed,
    /// Nothing arrived within the read timeout (or a write could not finish in the write timeout).
    #[error("no response within the read timeout")]
    Timeout,
    #[error("i/o error: {0}")]
    Io(std::io::Error),
    /// The request does not encode at that version (a field the version lacks, a string over
    /// 32 KiB, a frame over 2 GiB).
    #[error("cannot encode the request: {0}")]
    Encode(String),
    /// A frame arrived but does not decode as the expected response.
    #[error("undecodable response: {0}")]
    Decode(String),
}

impl From<std::io::Error> for ClientError {
    /// Sorts an I/O error of the connection into what it says about the broker.
    fn from(e: std::io::Error) -> ClientError {
        match e.kind() {
            ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe => ClientError::Closed,
            ErrorKind::WouldBlock | ErrorKind::TimedOut => ClientError::Timeout,
            _ => ClientError::Io(e),
        }
    }
}

/// Where the correlation id sits in a frame from [`encode_request`]: after the size (4), the api
/// key (2) and the api version (2), in every request header version. A writer that sends one
/// encoded frame many times patches it here.
pub const CORRELATION_ID_AT: std::ops::Range<usize> = 8..12;

fn api_key<R: Request>() -> Result<ApiKey, ClientError> {
    ApiKey::try_from(R::KEY).map_err(|_| ClientError::Encode(format!("unknown API key {}", R::KEY)))
}

/// A whole request frame, `[i32 size][request header][body]`, of `request` at `version`, ready to
/// write to the socket. `client_id` goes into the header (header v0, ControlledShutdown v0's,
/// has none).
pub fn encode_request<R: Request>(
    version: i16,
    correlation_id: i32,
    client_id: &'static str,
    request: &R,
) -> Result<BytesMut, ClientError> {
    let key = api_key::<R>()?;
    let header_version = key.request_header_version(version);
    let mut header = RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id);
    if header_version >= 1 {
        header = header.with_client_id(Some(StrBytes::from_static_str(client_id)));
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

/// Reads one response frame and returns it without its size prefix. A frame too short to hold
/// a correlation id is a decode error, read no further.
pub fn read_frame(stream: &mut impl Read) -> Result<Bytes, ClientError> {
    let mut size = [0u8; 4];
    stream.read_exact(&mut size)?;
    let size = i32::from_be_bytes(size);
    let Some(size) = usize::try_from(size).ok().filter(|&s| s >= 4) else {
        return Err(ClientError::Decode(format!("response frame size {size}")));
    };
    let mut frame = vec![0u8; size];
    stream.read_exact(&mut frame)?;
    Ok(Bytes::from(frame))
}

/// Decodes a response frame (without its size prefix): the header's correlation id must be
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

/// A TCP connection to a broker without Nagle's delay, whose reads and writes (and the connect
/// itself) give up after `io_timeout`, so that a hung broker fails the caller instead of
/// hanging it.
pub fn connect(addr: SocketAddr, io_timeout: Duration) -> Result<TcpStream, ClientError> {
    let stream = TcpStream::connect_timeout(&addr, io_timeout).map_err(|error| ClientError::Connect { addr, error })?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(io_timeout))?;
    stream.set_write_timeout(Some(io_timeout))?;
    Ok(stream)
}

/// One connection speaking the Kafka protocol: one request at a time with [`Client::send`], or
/// pipelined with [`Client::write`] and [`Client::read`] (responses come back in request order).
pub struct Client {
    stream: TcpStream,
    client_id: &'static str,
    next_correlation_id: i32,
}

impl Client {
    /// Connects as [`connect`] does; `client_id` names this client in every request header.
    pub fn connect(addr: SocketAddr, client_id: &'static str, io_timeout: Duration) -> Result<Client, ClientError> {
        Ok(Client { stream: connect(addr, io_timeout)?, client_id, next_correlation_id: 1 })
    }

    pub fn set_read_timeout(&mut self, timeout: Duration) -> Result<(), ClientError> {
        Ok(self.stream.set_read_timeout(Some(timeout))?)
    }

    /// Sends `request` at `version` and waits for its response.
    pub fn send<R: Request>(&mut self, version: i16, request: &R) -> Result<R::Response, ClientError> {
        let correlation_id = self.write(version, request)?;
        self.read::<R>(version, correlation_id)
    }

    /// Writes one request without waiting for its response; returns its correlation id.
    pub fn write<R: Request>(&mut self, version: i16, request: &R) -> Result<i32, ClientError> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let frame = encode_request(version, correlation_id, self.client_id, request)?;
        self.stream.write_all(&frame)?;
        Ok(correlation_id)
    }

    /// Reads the next response, which must be the one to the request `correlation_id`.
    pub fn read<R: Request>(&mut self, version: i16, correlation_id: i32) -> Result<R::Response, ClientError> {
        let frame = self.read_frame()?;
        decode_response::<R>(frame, version, correlation_id)
    }

    /// Reads one response frame, without its size prefix and undecoded.
    pub fn read_frame(&mut self) -> Result<Bytes, ClientError> {
        read_frame(&mut self.stream)
    }

    /// Writes `bytes` as they are: a frame built by hand, a part of one, or no frame at all.
    pub fn write_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream.write_all(bytes)?;
        Ok(self.stream.flush()?)
    }

    /// Reads whatever bytes arrive, frames or not, into `buf`; `Ok(0)` is the end of the stream.
    pub fn read_raw(&mut self, buf: &mut [u8]) -> Result<usize, ClientError> {
        Ok(self.stream.read(buf)?)
    }

    /// Half-closes the connection: the broker sees the end of the stream, and can still answer.
    pub fn shutdown_write(&mut self) -> Result<(), ClientError> {
        Ok(self.stream.shutdown(Shutdown::Write)?)
    }
}

// ----- requests both the benchmarks and the tests build -----------------------------------------

/// The request timeout of the requests built here: generous, a broker on a loaded machine must
/// not turn a slow answer into an error.
pub const REQUEST_TIMEOUT_MS: i32 = 30_000;

pub fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

/// CreateTopics of one topic with `configs` (name, value).
pub fn create_topics_request<K: AsRef<str>, V: AsRef<str>>(
    name: &str,
    partitions: i32,
    replication_factor: i16,
    configs: &[(K, V)],
) -> CreateTopicsRequest {
    let configs = configs
        .iter()
        .map(|(name, value)| {
            CreatableTopicConfig::default()
                .with_name(StrBytes::from_string(name.as_ref().to_string()))
                .with_value(Some(StrBytes::from_string(value.as_ref().to_string())))
        })
        .collect();
    CreateTopicsRequest::default()
        .with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(name))
            .with_num_partitions(partitions)
            .with_replication_factor(replication_factor)
            .with_configs(configs)])
        .with_timeout_ms(REQUEST_TIMEOUT_MS)
}

/// CreateTopics of `name` with `partitions` partitions, each on `replicas` (the leader first).
pub fn create_topics_request_on<K: AsRef<str>, V: AsRef<str>>(
    name: &str,
    partitions: i32,
    replicas: &[i32],
    configs: &[(K, V)],
) -> CreateTopicsRequest {
    use kafka_protocol::messages::create_topics_request::CreatableReplicaAssignment;
    let mut request = create_topics_request(name, -1, -1, configs);
    for topic in &mut request.topics {
        topic.assignments = (0..partitions)
            .map(|p| {
                CreatableReplicaAssignment::default()
                    .with_partition_index(p)
                    .with_broker_ids(replicas.iter().map(|&b| BrokerId(b)).collect())
            })
            .collect();
    }
    request
}

/// Produce of one record set (`records`: whole record batches) to one partition.
pub fn produce_request(topic: &str, partition: i32, records: Bytes, acks: i16) -> ProduceRequest {
    ProduceRequest::default().with_acks(acks).with_timeout_ms(REQUEST_TIMEOUT_MS).with_topic_data(vec![
        TopicProduceData::default().with_name(topic_name(topic)).with_partition_data(vec![
            PartitionProduceData::default().with_index(partition).with_records(Some(records)),
        ]),
    ])
}

/// A Fetch request without topics (add them with `with_topics`) and, as the defaults have it
/// (session epoch -1), outside any fetch session.
pub fn fetch_request(max_wait_ms: i32, min_bytes: i32, max_bytes: i32) -> FetchRequest {
    FetchRequest::default().with_max_wait_ms(max_wait_ms).with_min_bytes(min_bytes).with_max_bytes(max_bytes)
}

pub fn fetch_partition(partition: i32, offset: i64, partition_max_bytes: i32) -> FetchPartition {
    FetchPartition::default()
        .with_partition(partition)
        .with_fetch_offset(offset)
        .with_partition_max_bytes(partition_max_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn correlation_id_is_where_the_writers_patch_it() {
        let request = ProduceRequest::default().with_acks(1);
        for version in [3, 9, 11] {
            let frame = encode_request(version, 0x0102_0304, "test", &request).expect("encodes");
            assert_eq!(&frame[CORRELATION_ID_AT], &[1, 2, 3, 4], "v{version}");
            let size = i32::from_be_bytes(frame[..4].try_into().expect("4 bytes"));
            assert_eq!(size as usize, frame.len() - 4);
        }
    }

    #[test]
    fn a_response_decodes_only_with_its_correlation_id_and_nothing_left_over() {
        let mut frame = BytesMut::new();
        ResponseHeader::default().with_correlation_id(7).encode(&mut frame, 0).expect("header");
        ApiVersionsResponse::default().encode(&mut frame, 0).expect("body");
        let frame = frame.freeze();
        assert!(decode_response::<ApiVersionsRequest>(frame.clone(), 0, 7).is_ok());
        let wrong_id = decode_response::<ApiVersionsRequest>(frame.clone(), 0, 8);
        assert!(matches!(wrong_id, Err(ClientError::Decode(_))), "{wrong_id:?}");
        let mut longer = BytesMut::from(&frame[..]);
        longer.put_u8(0);
        let trailing = decode_response::<ApiVersionsRequest>(longer.freeze(), 0, 7);
        assert!(matches!(trailing, Err(ClientError::Decode(ref why)) if why.contains("1 bytes after")), "{trailing:?}");
    }

    #[test]
    fn frames_too_short_for_a_correlation_id_are_refused_unread() {
        for size in [-1i32, 0, 3] {
            let mut bytes = size.to_be_bytes().to_vec();
            bytes.extend_from_slice(&[0; 8]);
            let read = read_frame(&mut &bytes[..]);
            assert!(matches!(read, Err(ClientError::Decode(_))), "size {size}: {read:?}");
        }
        let whole = read_frame(&mut &[0, 0, 0, 4, 1, 2, 3, 4][..]).expect("a 4-byte frame");
        assert_eq!(&whole[..], &[1, 2, 3, 4]);
        let cut = read_frame(&mut &[0, 0, 0, 8, 1, 2][..]);
        assert!(matches!(cut, Err(ClientError::Closed)), "a stream that ends inside a frame: {cut:?}");
    }

    #[test]
    fn connection_errors_say_what_the_broker_did() {
        let closed = [ErrorKind::UnexpectedEof, ErrorKind::ConnectionReset, ErrorKind::BrokenPipe];
        for kind in closed {
            assert!(matches!(ClientError::from(std::io::Error::from(kind)), ClientError::Closed), "{kind:?}");
        }
        for kind in [ErrorKind::WouldBlock, ErrorKind::TimedOut] {
            assert!(matches!(ClientError::from(std::io::Error::from(kind)), ClientError::Timeout), "{kind:?}");
        }
        let other = ClientError::from(std::io::Error::from(ErrorKind::PermissionDenied));
        assert!(matches!(other, ClientError::Io(_)), "{other:?}");
    }
}
