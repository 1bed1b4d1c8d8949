//! Shared helpers of the black-box tests: start the real `weir` binary on free ports, talk the
//! Kafka wire protocol to it with the raw client the benchmarks use too
//! ([`weir_harness::kafka_client`], re-exported here), and build and read record batches.
//!
//! Everything is blocking (std threads and sockets): the tests are about the broker's behaviour
//! on the wire, and a blocking client makes "no response arrived" and "the socket was closed"
//! easy to tell apart.
// Each test file uses a different subset of these helpers.
#![allow(dead_code)]

use std::fs::File;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::FetchTopic;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use weir_harness::address_lines::{self, WaitFor};
// The client and the requests it shares with the benchmarks, for every test file (each uses a
// different subset).
#[allow(unused_imports)]
pub use weir_harness::kafka_client::{
    create_topics_request, decode_response, encode_request, fetch_partition, fetch_request, produce_request,
    topic_name, Client, ClientError,
};

/// How long the broker may take to print its listening line (recovery of a killed broker
/// included; debug builds on a loaded 2-core machine are slow).
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Default read timeout of a [`Client`]: longer than any long poll the tests ask for.
pub const IO_TIMEOUT: Duration = Duration::from_secs(15);
/// What the tests' clients call themselves in request headers.
pub const CLIENT_ID: &str = "weir-tests";

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
    pub const INVALID_REPLICA_ASSIGNMENT: i16 = 39;
    pub const ELECTION_NOT_NEEDED: i16 = 84;
    pub const BROKER_ID_NOT_REGISTERED: i16 = 102;
    pub const INVALID_REQUEST: i16 = 42;
    pub const INVALID_RECORD: i16 = 87;
    pub const THROTTLING_QUOTA_EXCEEDED: i16 = 89;
    pub const NO_REASSIGNMENT_IN_PROGRESS: i16 = 85;
    pub const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;
    pub const UNKNOWN_TOPIC_ID: i16 = 100;
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    pub const FENCED_MEMBER_EPOCH: i16 = 110;
    pub const STALE_MEMBER_EPOCH: i16 = 113;
}

pub fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
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

/// The `weir` binary under test, without the test run's WEIR_* variables: its settings come from
/// the command line only, whatever the environment.
pub fn weir_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_weir"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("WEIR_") {
            command.env_remove(key);
        }
    }
    command
}

/// A `weir server` child process on 127.0.0.1 with its own scratch directory (data directory
/// plus one log file per start), the Kafka and the admin listener each on a free port. Killed
/// when dropped.
pub struct Broker {
    child: Option<Child>,
    scratch: tempfile::TempDir,
    settings: Vec<String>,
    addr: SocketAddr,
    admin: SocketAddr,
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
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            starts: 0,
        };
        broker.spawn();
        broker
    }

    /// The Kafka listener's address (a new one after each restart).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin HTTP listener's address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
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
        let mut command = weir_command();
        command
            .arg("server")
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(self.data_dir())
            .args(["--set", "group.initial.rebalance.delay.ms=0"])
            // Tests run brokers side by side: a free admin port each, not the fixed default.
            .args(["--set", "admin.listeners=127.0.0.1:0", "--set", "rocketmq.listeners="]);
        for setting in &self.settings {
            command.args(["--set", setting]);
        }
        command.env("RUST_LOG", "info").stdin(Stdio::null()).stderr(Stdio::from(log));
        match address_lines::spawn_and_wait(&mut command, WaitFor::KafkaAndAdmin, STARTUP_TIMEOUT) {
            Ok((child, addresses)) => {
                self.child = Some(child);
                self.addr = addresses.kafka;
                self.admin = addresses.admin.expect("waited for the admin line");
            }
            Err(e) => panic!("{e}\n{}", self.logs()),
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
        connect(self.addr)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

// ----- the wire -----------------------------------------------------------------------------

/// A connection to the broker at `addr` with the tests' client id and [`IO_TIMEOUT`].
pub fn connect(addr: SocketAddr) -> Client {
    Client::connect(addr, CLIENT_ID, IO_TIMEOUT).unwrap_or_else(|e| panic!("{e}"))
}

/// What the tests check on a connection, and the requests they make all the time, each
/// asserting that it succeeds.
pub trait ClientExt {
    /// Waits up to `timeout` for the broker to close the connection. `Ok(())`: closed (end of
    /// stream or reset) with nothing sent first; `Err(bytes)`: it sent something (or, with an
    /// empty vector, did nothing within the timeout).
    fn wait_closed(&mut self, timeout: Duration) -> Result<(), Vec<u8>>;
    /// ApiVersions v3; panics unless it answers without error.
    fn api_versions(&mut self) -> ApiVersionsResponse;
    /// Creates a topic (1 replica) with `configs`; panics unless it succeeds. Returns its id.
    fn create_topic(&mut self, name: &str, partitions: i32, configs: &[(&str, &str)]) -> uuid::Uuid;
    /// Produces one record set (acks=1, Produce v9); returns (error code, base offset).
    fn produce(&mut self, topic: &str, partition: i32, records: Bytes) -> (i16, i64);
    /// Produces and panics unless it succeeded; returns the base offset.
    fn produce_ok(&mut self, topic: &str, partition: i32, records: Bytes) -> i64;
    /// Fetch v12 (by name, no waiting) of one partition from `offset`: (error, high watermark,
    /// record bytes).
    fn fetch(&mut self, topic: &str, partition: i32, offset: i64, max_bytes: i32) -> (i16, i64, Bytes);
    /// Every record of `topic`-`partition` from offset 0 to the high watermark.
    fn fetch_all(&mut self, topic: &str, partition: i32) -> Vec<Record>;
}

impl ClientExt for Client {
    fn wait_closed(&mut self, timeout: Duration) -> Result<(), Vec<u8>> {
        self.set_read_timeout(timeout).expect("read timeout");
        let mut received = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match self.read_raw(&mut buf) {
                Ok(0) | Err(ClientError::Closed) if received.is_empty() => return Ok(()),
                Ok(0) | Err(_) => return Err(received),
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    }

    fn api_versions(&mut self) -> ApiVersionsResponse {
        let response = self.send(3, &api_versions_request()).expect("ApiVersions v3");
        assert_eq!(response.error_code, code::NONE, "ApiVersions error");
        assert!(!response.api_keys.is_empty(), "ApiVersions lists no API");
        response
    }

    fn create_topic(&mut self, name: &str, partitions: i32, configs: &[(&str, &str)]) -> uuid::Uuid {
        let response = self.send(7, &create_topics_request(name, partitions, 1, configs)).expect("CreateTopics v7");
        let result = &response.topics[0];
        assert_eq!(result.error_code, code::NONE, "create topic {name}: {:?}", result.error_message);
        assert!(!result.topic_id.is_nil(), "CreateTopics v7 returns the topic id");
        result.topic_id
    }

    fn produce(&mut self, topic: &str, partition: i32, records: Bytes) -> (i16, i64) {
        let response = self.send(9, &produce_request(topic, partition, records, 1)).expect("Produce v9");
        let p = &response.responses[0].partition_responses[0];
        (p.error_code, p.base_offset)
    }

    fn produce_ok(&mut self, topic: &str, partition: i32, records: Bytes) -> i64 {
        let (error, base) = self.produce(topic, partition, records);
        assert_eq!(error, code::NONE, "produce to {topic}-{partition}");
        base
    }

    fn fetch(&mut self, topic: &str, partition: i32, offset: i64, max_bytes: i32) -> (i16, i64, Bytes) {
        let request =
            fetch_request(0, 0, max_bytes).with_topics(vec![fetch_topic_by_name(topic, partition, offset, max_bytes)]);
        let response = self.send(12, &request).expect("Fetch v12");
        assert_eq!(response.error_code, code::NONE, "fetch top-level error");
        let p = &response.responses[0].partitions[0];
        (p.error_code, p.high_watermark, p.records.clone().unwrap_or_default())
    }

    fn fetch_all(&mut self, topic: &str, partition: i32) -> Vec<Record> {
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
