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

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::fetch_request::FetchPartition;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Request, StrBytes};

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
    /// The TLS configuration (the CA given) is unusable.
    #[error("TLS: {0}")]
    Tls(String),
}

impl From<std::io::Error> for ClientError {
    /// Sorts an I/O error of the connection into what it says about the broker, as
    /// `weir_client` does.
    fn from(e: std::io::Error) -> ClientError {
        ClientError::from(weir_client::ClientError::from(e))
    }
}

/// Where the correlation id sits in a frame from [`encode_request`]: after the size (4), the api
/// key (2) and the api version (2), in every request header version. A writer that sends one
/// encoded frame many times patches it here.
pub const CORRELATION_ID_AT: std::ops::Range<usize> = 8..12;

impl From<weir_client::ClientError> for ClientError {
    /// The framing errors of `weir_client::wire`, which this client shares.
    fn from(e: weir_client::ClientError) -> ClientError {
        use weir_client::ClientError as Wire;
        match e {
            Wire::Closed => ClientError::Closed,
            Wire::Timeout => ClientError::Timeout,
            Wire::Io(e) => ClientError::Io(e),
            Wire::Encode(message) => ClientError::Encode(message),
            other => ClientError::Decode(other.to_string()),
        }
    }
}

/// A whole request frame, `[i32 size][request header][body]`, of `request` at `version`, ready to
/// write to the socket (`weir_client::wire`'s framing). `client_id` goes into the header
/// (header v0, ControlledShutdown v0's, has none).
pub fn encode_request<R: Request>(
    version: i16,
    correlation_id: i32,
    client_id: &'static str,
    request: &R,
) -> Result<BytesMut, ClientError> {
    Ok(weir_client::wire::encode_request(version, correlation_id, client_id, request)?)
}

/// Reads one response frame and returns it without its size prefix; a size too short for a
/// correlation id, or over `weir_client::wire::RESPONSE_BYTES_MAX`, is a decode error.
pub fn read_frame(stream: &mut impl Read) -> Result<Bytes, ClientError> {
    Ok(weir_client::wire::read_frame(stream)?)
}

/// Decodes a response frame (without its size prefix): the header's correlation id must be
/// `correlation_id` and the body must decode at `version` with no bytes left over.
pub fn decode_response<R: Request>(
    frame: Bytes,
    version: i16,
    correlation_id: i32,
) -> Result<R::Response, ClientError> {
    Ok(weir_client::wire::decode_response::<R>(frame, version, correlation_id)?)
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

/// A client's connection: plain TCP, or TLS over it (rustls, blocking).
enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    fn socket(&self) -> &TcpStream {
        match self {
            Stream::Plain(socket) => socket,
            Stream::Tls(tls) => &tls.sock,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// One connection speaking the Kafka protocol: one request at a time with [`Client::send`], or
/// pipelined with [`Client::write`] and [`Client::read`] (responses come back in request order).
pub struct Client {
    stream: Stream,
    client_id: &'static str,
    next_correlation_id: i32,
}

impl Client {
    /// Connects as [`connect`] does; `client_id` names this client in every request header.
    pub fn connect(addr: SocketAddr, client_id: &'static str, io_timeout: Duration) -> Result<Client, ClientError> {
        Ok(Client { stream: Stream::Plain(connect(addr, io_timeout)?), client_id, next_correlation_id: 1 })
    }

    /// Connects over TLS to a broker whose certificate `ca_pem` (PEM) vouches for, for the
    /// address's IP (the certificate must name it). The handshake happens with the first
    /// request.
    pub fn connect_tls(
        addr: SocketAddr,
        client_id: &'static str,
        io_timeout: Duration,
        ca_pem: &[u8],
    ) -> Result<Client, ClientError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, ServerName};
        let tls = |e: &dyn std::fmt::Display| ClientError::Tls(e.to_string());
        let mut roots = rustls::RootCertStore::empty();
        for certificate in CertificateDer::pem_slice_iter(ca_pem) {
            roots.add(certificate.map_err(|e| tls(&e))?).map_err(|e| tls(&e))?;
        }
        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls(&e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connection = rustls::ClientConnection::new(std::sync::Arc::new(config), ServerName::from(addr.ip()))
            .map_err(|e| tls(&e))?;
        let socket = connect(addr, io_timeout)?;
        let stream = Stream::Tls(Box::new(rustls::StreamOwned::new(connection, socket)));
        Ok(Client { stream, client_id, next_correlation_id: 1 })
    }

    pub fn set_read_timeout(&mut self, timeout: Duration) -> Result<(), ClientError> {
        Ok(self.stream.socket().set_read_timeout(Some(timeout))?)
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
        // (rustls may hold the last record until flushed; a plain socket has nothing to flush.)
        self.stream.flush()?;
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
        Ok(self.stream.socket().shutdown(Shutdown::Write)?)
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
    use std::io::ErrorKind;

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
