//! Shared helpers of the black-box protocol tests: start the real `weir` binary on a free port,
//! talk the Kafka wire protocol to it over plain TCP (encoding and decoding with the
//! `kafka-protocol` crate), and build and read record batches.
//!
//! Everything is blocking (std threads and sockets): the tests are about the broker's behaviour
//! on the wire, and a blocking client makes "no response arrived" and "the socket was closed"
//! easy to tell apart.
// Each test file uses a different subset of these helpers.
#![allow(dead_code)]

use std::fs::File;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

/// How long the broker may take to print its listening line (recovery of a killed broker
/// included; debug builds on a loaded 2-core machine are slow).
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Default read timeout of a [`Client`]: longer than any long poll the tests ask for.
pub const IO_TIMEOUT: Duration = Duration::from_secs(15);

/// Kafka error codes the tests expect, by Kafka's names.
pub mod code {
    pub const NONE: i16 = 0;
    pub const OFFSET_OUT_OF_RANGE: i16 = 1;
    pub const CORRUPT_MESSAGE: i16 = 2;
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub const MESSAGE_TOO_LARGE: i16 = 10;
    pub const INVALID_TOPIC_EXCEPTION: i16 = 17;
    pub const INVALID_REQUIRED_ACKS: i16 = 21;
    pub const UNSUPPORTED_VERSION: i16 = 35;
    pub const TOPIC_ALREADY_EXISTS: i16 = 36;
    pub const INVALID_PARTITIONS: i16 = 37;
    pub const INVALID_REPLICATION_FACTOR: i16 = 38;
    pub const INVALID_CONFIG: i16 = 40;
    pub const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
    pub const MEMBER_ID_REQUIRED: i16 = 79;
    pub const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;
    pub const UNKNOWN_TOPIC_ID: i16 = 100;
}

pub fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

pub fn topic_name(name: &str) -> TopicName {
    TopicName(s(name))
}

pub fn group_id(name: &str) -> GroupId {
    GroupId(s(name))
}

/// A name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Polls `condition` every 10 ms until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ----- the broker process -------------------------------------------------------------------

/// A `weir server` child process on 127.0.0.1 with its own scratch directory (data directory
/// plus one log file per start). Killed when dropped.
pub struct Broker {
    child: Option<Child>,
    scratch: tempfile::TempDir,
    settings: Vec<String>,
    addr: SocketAddr,
    starts: u32,
}

impl Broker {
    /// Starts a broker with `group.initial.rebalance.delay.ms=0` and `settings` (`name=value`).
    pub fn start(settings: &[&str]) -> Broker {
        let scratch = tempfile::Builder::new().prefix("weir-test-").tempdir().expect("scratch dir");
        let mut broker = Broker {
            child: None,
            scratch,
            settings: settings.iter().map(|s| s.to_string()).collect(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            starts: 0,
        };
        broker.spawn();
        broker
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn data_dir(&self) -> PathBuf {
        self.scratch.path().join("data")
    }

    fn log_path(&self, start: u32) -> PathBuf {
        self.scratch.path().join(format!("broker-{start}.log"))
    }

    /// Everything the broker processes logged (stderr), for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for start in 1..=self.starts {
            let text = std::fs::read_to_string(self.log_path(start)).unwrap_or_default();
            out.push_str(&format!("--- start {start} ---\n{text}"));
        }
        // Keep failure messages readable: the end is what matters.
        if out.len() > 20_000 {
            out = format!("[...]{}", &out[out.len() - 20_000..]);
        }
        out
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "the broker is already running");
        self.starts += 1;
        let log = File::create(self.log_path(self.starts)).expect("broker log file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_weir"));
        command
            .arg("server")
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(self.data_dir())
            .args(["--set", "group.initial.rebalance.delay.ms=0"])
            // Tests run brokers side by side: a free admin port each, not the fixed default.
            .args(["--set", "admin.listeners=127.0.0.1:0"]);
        for setting in &self.settings {
            command.args(["--set", setting]);
        }
        // Settings come from the command line only, whatever the environment of the test run.
        for (key, _) in std::env::vars() {
            if key.starts_with("WEIR_") {
                command.env_remove(key);
            }
        }
        command.env("RUST_LOG", "info").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::from(log));
        let mut child = command.spawn().expect("spawn weir server");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        // Reads the listening line, then drains stdout so the broker never blocks on it.
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = parse_listening_line(&line) {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(addr);
                    }
                }
            }
        });
        self.child = Some(child);
        match rx.recv_timeout(STARTUP_TIMEOUT) {
            Ok(addr) => self.addr = addr,
            Err(_) => {
                let status = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
                self.kill();
                panic!(
                    "weir server did not print its listening line within {STARTUP_TIMEOUT:?} (exit status {status:?})\n{}",
                    self.logs()
                );
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("broker running").id()
    }

    /// Whether the process is still running (it has not exited or crashed).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => child.try_wait().expect("try_wait").is_none(),
            None => false,
        }
    }

    /// Panics, with the broker's log, unless the process is still running.
    pub fn assert_running(&mut self, context: &str) {
        if !self.is_running() {
            let status = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            panic!("{context}: the broker process exited ({status:?})\n{}", self.logs());
        }
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits (up to 30 s) for the process to exit and returns its status.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("broker running");
        let sent = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("run kill");
        assert!(sent.success(), "kill -TERM failed");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("weir did not exit within 30 s of SIGTERM\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the broker again on the same data directory (on a new port).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop the broker before restarting it");
        self.spawn();
    }

    pub fn connect(&self) -> Client {
        Client::connect(self.addr)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `weir 0.1.0 listening on 127.0.0.1:PORT (Kafka protocol), data in DIR` → the address.
fn parse_listening_line(line: &str) -> Option<SocketAddr> {
    let rest = line.strip_prefix("weir ")?;
    let (_, rest) = rest.split_once(" listening on ")?;
    let (addr, _) = rest.split_once(' ')?;
    addr.parse().ok()
}

// ----- the wire -----------------------------------------------------------------------------

/// Why a request got no decodable response.
#[derive(Debug)]
pub enum ClientError {
    /// The broker closed the connection (EOF or reset) instead of answering.
    Closed,
    /// Nothing arrived within the read timeout.
    Timeout,
    Io(std::io::Error),
    /// A frame arrived but does not decode as the expected response.
    Decode(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Closed => write!(f, "the broker closed the connection instead of answering"),
            ClientError::Timeout => write!(f, "no response within the read timeout"),
            ClientError::Io(e) => write!(f, "i/o error: {e}"),
            ClientError::Decode(why) => write!(f, "undecodable response: {why}"),
        }
    }
}

fn classify(e: std::io::Error) -> ClientError {
    match e.kind() {
        ErrorKind::UnexpectedEof
        | ErrorKind::ConnectionReset
        | ErrorKind::ConnectionAborted
        | ErrorKind::BrokenPipe => ClientError::Closed,
        ErrorKind::WouldBlock | ErrorKind::TimedOut => ClientError::Timeout,
        _ => ClientError::Io(e),
    }
}

pub fn api_key_of<R: Request>() -> ApiKey {
    ApiKey::try_from(R::KEY).expect("known API key")
}

/// `[i32 size][request header][body]` for `request` at `version`.
pub fn encode_request<R: Request>(version: i16, correlation_id: i32, request: &R) -> BytesMut {
    let key = api_key_of::<R>();
    let header_version = key.request_header_version(version);
    let mut header = RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id);
    // Header v0 (ControlledShutdown v0 only) has no client id.
    if header_version >= 1 {
        header = header.with_client_id(Some(s("weir-tests")));
    }
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    header.encode(&mut buf, header_version).unwrap_or_else(|e| panic!("encode {key:?} v{version} header: {e}"));
    request.encode(&mut buf, version).unwrap_or_else(|e| panic!("encode {key:?} v{version} request: {e}"));
    let size = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&size.to_be_bytes());
    buf
}

/// Decodes a response frame (without its size prefix): the header's correlation id must be
/// `correlation_id` and the body must decode at `version` with no bytes left over.
pub fn decode_response<R: Request>(
    mut frame: Bytes,
    version: i16,
    correlation_id: i32,
) -> Result<R::Response, ClientError> {
    let key = api_key_of::<R>();
    let header = ResponseHeader::decode(&mut frame, key.response_header_version(version))
        .map_err(|e| ClientError::Decode(format!("{key:?} v{version} response header: {e}")))?;
    if header.correlation_id != correlation_id {
        return Err(ClientError::Decode(format!(
            "{key:?} v{version}: correlation id {} where {correlation_id} was expected",
            header.correlation_id
        )));
    }
    let response = R::Response::decode(&mut frame, version)
        .map_err(|e| ClientError::Decode(format!("{key:?} v{version} response body: {e}")))?;
    if frame.has_remaining() {
        return Err(ClientError::Decode(format!(
            "{key:?} v{version}: {} bytes after the response body",
            frame.remaining()
        )));
    }
    Ok(response)
}

/// One TCP connection speaking the Kafka protocol, one request at a time unless the caller
/// pipelines with [`Client::write`] and [`Client::read`].
pub struct Client {
    pub stream: TcpStream,
    next_correlation_id: i32,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect to the broker");
        stream.set_nodelay(true).expect("nodelay");
        stream.set_read_timeout(Some(IO_TIMEOUT)).expect("read timeout");
        stream.set_write_timeout(Some(IO_TIMEOUT)).expect("write timeout");
        Client { stream, next_correlation_id: 1 }
    }

    pub fn set_read_timeout(&mut self, timeout: Duration) {
        self.stream.set_read_timeout(Some(timeout)).expect("read timeout");
    }

    /// Sends `request` and waits for its response; panics on any failure.
    pub fn send<R: Request>(&mut self, version: i16, request: &R) -> R::Response {
        self.try_send(version, request).unwrap_or_else(|e| panic!("{:?} v{version}: {e}", api_key_of::<R>()))
    }

    pub fn try_send<R: Request>(&mut self, version: i16, request: &R) -> Result<R::Response, ClientError> {
        let correlation_id = self.write(version, request).map_err(classify)?;
        self.read::<R>(version, correlation_id)
    }

    /// Writes one request without waiting; returns its correlation id.
    pub fn write<R: Request>(&mut self, version: i16, request: &R) -> std::io::Result<i32> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id += 1;
        let frame = encode_request(version, correlation_id, request);
        self.stream.write_all(&frame)?;
        Ok(correlation_id)
    }

    /// Reads the next response, which must be the one to `correlation_id`.
    pub fn read<R: Request>(&mut self, version: i16, correlation_id: i32) -> Result<R::Response, ClientError> {
        let frame = self.read_frame()?;
        decode_response::<R>(frame, version, correlation_id)
    }

    /// Reads one response frame, without its size prefix.
    pub fn read_frame(&mut self) -> Result<Bytes, ClientError> {
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).map_err(classify)?;
        let size = i32::from_be_bytes(size);
        if size < 4 {
            return Err(ClientError::Decode(format!("response frame size {size}")));
        }
        let mut frame = vec![0u8; size as usize];
        self.stream.read_exact(&mut frame).map_err(classify)?;
        Ok(Bytes::from(frame))
    }

    pub fn write_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Half-closes the connection: the broker sees end of stream.
    pub fn shutdown_write(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }

    /// Waits up to `timeout` for the broker to close the connection. `Ok(())`: closed (EOF or
    /// reset) with nothing sent first; `Err(bytes)`: it sent something (or, with an empty
    /// vector, did nothing within the timeout).
    pub fn wait_closed(&mut self, timeout: Duration) -> Result<(), Vec<u8>> {
        self.set_read_timeout(timeout);
        let mut received = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) if received.is_empty() => return Ok(()),
                Ok(0) => return Err(received),
                Ok(n) => received.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted) => {
                    return if received.is_empty() { Ok(()) } else { Err(received) };
                }
                Err(_) => return Err(received),
            }
        }
    }

    // ----- requests the tests use all the time ----------------------------------------------

    /// ApiVersions v3; panics unless it answers without error.
    pub fn api_versions(&mut self) -> ApiVersionsResponse {
        let response = self.send(3, &api_versions_request());
        assert_eq!(response.error_code, code::NONE, "ApiVersions error");
        assert!(!response.api_keys.is_empty(), "ApiVersions lists no API");
        response
    }

    /// Creates a topic (1 replica) with `configs`; panics unless it succeeds. Returns its id.
    pub fn create_topic(&mut self, name: &str, partitions: i32, configs: &[(&str, &str)]) -> uuid::Uuid {
        let response = self.send(7, &create_topics_request(name, partitions, 1, configs, false));
        let result = &response.topics[0];
        assert_eq!(result.error_code, code::NONE, "create topic {name}: {:?}", result.error_message);
        assert!(!result.topic_id.is_nil(), "CreateTopics v7 returns the topic id");
        result.topic_id
    }

    /// Produces one record set (acks=1, Produce v9); returns (error code, base offset).
    pub fn produce(&mut self, topic: &str, partition: i32, records: Bytes) -> (i16, i64) {
        let response = self.send(9, &produce_request(topic, partition, records, 1));
        let p = &response.responses[0].partition_responses[0];
        (p.error_code, p.base_offset)
    }

    /// Produces and panics unless it succeeded; returns the base offset.
    pub fn produce_ok(&mut self, topic: &str, partition: i32, records: Bytes) -> i64 {
        let (error, base) = self.produce(topic, partition, records);
        assert_eq!(error, code::NONE, "produce to {topic}-{partition}");
        base
    }

    /// Fetch v12 (by name, no waiting) of one partition from `offset`: (error, high watermark,
    /// record bytes).
    pub fn fetch(&mut self, topic: &str, partition: i32, offset: i64, max_bytes: i32) -> (i16, i64, Bytes) {
        let request =
            fetch_request(0, 0, max_bytes).with_topics(vec![fetch_topic_by_name(topic, partition, offset, max_bytes)]);
        let response = self.send(12, &request);
        assert_eq!(response.error_code, code::NONE, "fetch top-level error");
        let p = &response.responses[0].partitions[0];
        (p.error_code, p.high_watermark, p.records.clone().unwrap_or_default())
    }

    /// Every record of `topic`-`partition` from offset 0 to the high watermark.
    pub fn fetch_all(&mut self, topic: &str, partition: i32) -> Vec<Record> {
        let mut out = Vec::new();
        let mut offset = 0;
        loop {
            let (error, high_watermark, bytes) = self.fetch(topic, partition, offset, 1 << 20);
            assert_eq!(error, code::NONE, "fetch {topic}-{partition} at {offset}");
            let records = decode_records(bytes);
            if let Some(last) = records.last() {
                offset = last.offset + 1;
            }
            let done = records.is_empty() || offset >= high_watermark;
            out.extend(records);
            if done {
                return out;
            }
        }
    }
}

// ----- request builders ---------------------------------------------------------------------

pub fn api_versions_request() -> ApiVersionsRequest {
    ApiVersionsRequest::default()
        .with_client_software_name(s("weir-tests"))
        .with_client_software_version(s(env!("CARGO_PKG_VERSION")))
}

pub fn create_topics_request(
    name: &str,
    partitions: i32,
    replication_factor: i16,
    configs: &[(&str, &str)],
    validate_only: bool,
) -> CreateTopicsRequest {
    let configs = configs
        .iter()
        .map(|(name, value)| CreatableTopicConfig::default().with_name(s(name)).with_value(Some(s(value))))
        .collect();
    CreateTopicsRequest::default()
        .with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(name))
            .with_num_partitions(partitions)
            .with_replication_factor(replication_factor)
            .with_configs(configs)])
        .with_timeout_ms(10_000)
        .with_validate_only(validate_only)
}

pub fn produce_request(topic: &str, partition: i32, records: Bytes, acks: i16) -> ProduceRequest {
    ProduceRequest::default().with_acks(acks).with_timeout_ms(10_000).with_topic_data(vec![TopicProduceData::default()
        .with_name(topic_name(topic))
        .with_partition_data(vec![PartitionProduceData::default().with_index(partition).with_records(Some(records))])])
}

/// A Fetch request without topics: add them with `with_topics`.
pub fn fetch_request(max_wait_ms: i32, min_bytes: i32, max_bytes: i32) -> FetchRequest {
    FetchRequest::default().with_max_wait_ms(max_wait_ms).with_min_bytes(min_bytes).with_max_bytes(max_bytes)
}

pub fn fetch_partition(partition: i32, offset: i64, partition_max_bytes: i32) -> FetchPartition {
    FetchPartition::default()
        .with_partition(partition)
        .with_fetch_offset(offset)
        .with_partition_max_bytes(partition_max_bytes)
}

/// For Fetch v4–v12.
pub fn fetch_topic_by_name(topic: &str, partition: i32, offset: i64, partition_max_bytes: i32) -> FetchTopic {
    FetchTopic::default().with_topic(topic_name(topic)).with_partitions(vec![fetch_partition(
        partition,
        offset,
        partition_max_bytes,
    )])
}

/// For Fetch v13+.
pub fn fetch_topic_by_id(id: uuid::Uuid, partition: i32, offset: i64, partition_max_bytes: i32) -> FetchTopic {
    FetchTopic::default().with_topic_id(id).with_partitions(vec![fetch_partition(
        partition,
        offset,
        partition_max_bytes,
    )])
}

// ----- records ------------------------------------------------------------------------------

/// A record to produce: key, value, CreateTime timestamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub timestamp: i64,
}

impl Message {
    pub fn new(key: &str, value: &str, timestamp: i64) -> Message {
        Message {
            key: Some(Bytes::copy_from_slice(key.as_bytes())),
            value: Some(Bytes::copy_from_slice(value.as_bytes())),
            timestamp,
        }
    }

    pub fn with_value_len(key: &str, value_len: usize, timestamp: i64) -> Message {
        Message {
            key: Some(Bytes::copy_from_slice(key.as_bytes())),
            value: Some(Bytes::from(vec![b'v'; value_len])),
            timestamp,
        }
    }
}

/// One uncompressed v2 record batch of `messages`, as a non-idempotent producer sends it (base
/// offset 0, no producer id).
pub fn batch(messages: &[Message]) -> Bytes {
    assert!(!messages.is_empty());
    let records: Vec<Record> = messages
        .iter()
        .enumerate()
        .map(|(i, m)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // The encoder keeps records in one batch while offset - sequence stays the same and
            // derives the base sequence from the first: i - 1 gives one batch with base -1.
            sequence: i as i32 - 1,
            timestamp: m.timestamp,
            key: m.key.clone(),
            value: m.value.clone(),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(&mut buf, &records, &RecordEncodeOptions { version: 2, compression: Compression::None })
        .expect("encode batch");
    let bytes = buf.freeze();
    assert_eq!(batch_spans(&bytes).len(), 1, "the encoder split the records into several batches");
    bytes
}

/// (start, length) of each whole batch in `bytes`.
pub fn batch_spans(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut at = 0;
    while at + 12 <= bytes.len() {
        let length = i32::from_be_bytes(bytes[at + 8..at + 12].try_into().expect("4 bytes")) as usize + 12;
        assert!(at + length <= bytes.len(), "partial batch at {at}: {length} bytes of {} left", bytes.len() - at);
        spans.push((at, length));
        at += length;
    }
    assert_eq!(at, bytes.len(), "trailing bytes after the last batch");
    spans
}

/// Decodes every record of a record set (a Fetch response's records field).
pub fn decode_records(mut bytes: Bytes) -> Vec<Record> {
    RecordBatchDecoder::decode_all(&mut bytes)
        .expect("fetched batches decode")
        .into_iter()
        .flat_map(|set| set.records)
        .collect()
}

/// Asserts that a fetched batch is `produced` as appended at `base_offset`: the broker rewrites
/// only the base offset and the partition leader epoch (bytes 0..8 and 12..16); the length,
/// magic, CRC, attributes and records are the producer's bytes.
pub fn assert_same_batch(fetched: &[u8], produced: &[u8], base_offset: i64) {
    assert_eq!(fetched.len(), produced.len(), "batch length");
    assert_eq!(i64::from_be_bytes(fetched[..8].try_into().expect("8 bytes")), base_offset, "base offset");
    assert_eq!(fetched[8..12], produced[8..12], "batch length field");
    assert!(fetched[16..] == produced[16..], "batch bytes after the leader epoch differ from what was produced");
}

/// Asserts the records read back are `messages` at offsets `first_offset..`.
pub fn assert_records(records: &[Record], messages: &[Message], first_offset: i64) {
    assert_eq!(records.len(), messages.len(), "record count");
    for (i, (record, message)) in records.iter().zip(messages).enumerate() {
        assert_eq!(record.offset, first_offset + i as i64, "offset of record {i}");
        assert_eq!(record.key, message.key, "key of record {i}");
        assert_eq!(record.value, message.value, "value of record {i}");
        assert_eq!(record.timestamp, message.timestamp, "timestamp of record {i}");
        assert_eq!(record.timestamp_type, TimestampType::Creation, "timestamp type of record {i}");
    }
}
