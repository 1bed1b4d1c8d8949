//! The native consumer: reads partitions of one topic from given offsets with long-polled
//! Fetch requests to their leaders, the records below the high watermark (on a memory-first
//! topic, what the object store has). Records of aborted transactions are not filtered out.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, ListOffsetsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::RecordBatchDecoder;

use crate::error::check;
use crate::native::connection::Connection;
use crate::native::routes::Routes;
use crate::ClientError;

/// Fetch v12: by topic name, with the high watermark and log start in the answer.
const FETCH_VERSION: i16 = 12;
/// ListOffsets v7.
const LIST_OFFSETS_VERSION: i16 = 7;
/// Kafka's error codes a fetch is retried after, at the leader Metadata names then.
const RETRIABLE: [i16; 5] = [3, 5, 6, 56, 75];

/// How a [`Consumer`] works. [`ConsumerConfig::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    pub bootstrap: String,
    pub client_id: String,
    /// How long a fetch waits at the broker for records.
    pub max_wait: Duration,
    /// The most bytes one fetch asks for per partition.
    pub partition_max_bytes: i32,
    pub request_timeout: Duration,
}

impl ConsumerConfig {
    pub fn new(bootstrap: impl Into<String>) -> ConsumerConfig {
        ConsumerConfig {
            bootstrap: bootstrap.into(),
            client_id: "weir-native-consumer".to_string(),
            max_wait: Duration::from_millis(500),
            partition_max_bytes: 4 << 20,
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// Where reading a partition starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    Earliest,
    Latest,
    Offset(i64),
}

/// A record read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub partition: i32,
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(String, Option<Bytes>)>,
}

/// An async reader of some of a topic's partitions.
///
/// ```no_run
/// # async fn run() -> Result<(), weir_client::ClientError> {
/// use weir_client::native::{Consumer, ConsumerConfig, StartAt};
///
/// let mut consumer = Consumer::connect(ConsumerConfig::new("127.0.0.1:9092"), "events").await?;
/// consumer.assign(0, StartAt::Earliest).await?;
/// for record in consumer.poll().await? {
///     println!("{} {:?}", record.offset, record.value);
/// }
/// # Ok(())
/// # }
/// ```
pub struct Consumer {
    routes: Routes,
    config: ConsumerConfig,
    /// The next offset to read of each assigned partition.
    positions: BTreeMap<i32, i64>,
    connections: HashMap<String, Connection>,
}

impl Consumer {
    pub async fn connect(config: ConsumerConfig, topic: &str) -> Result<Consumer, ClientError> {
        let routes = Routes::new(&config.bootstrap, &config.client_id, config.request_timeout, topic).await?;
        Ok(Consumer { routes, config, positions: BTreeMap::new(), connections: HashMap::new() })
    }

    /// The topic's partitions when the consumer connected.
    pub fn partitions(&self) -> i32 {
        self.routes.partition_count() as i32
    }

    /// Reads `partition` from now on, starting at `start`.
    pub async fn assign(&mut self, partition: i32, start: StartAt) -> Result<(), ClientError> {
        if partition < 0 || partition >= self.partitions() {
            return Err(ClientError::Unavailable(format!(
                "partition {partition} of '{}' does not exist (it has {})",
                self.routes.topic,
                self.partitions()
            )));
        }
        let offset = match start {
            StartAt::Offset(offset) => offset,
            StartAt::Earliest => self.list_offset(partition, -2).await?,
            StartAt::Latest => self.list_offset(partition, -1).await?,
        };
        self.positions.insert(partition, offset);
        Ok(())
    }

    /// The next offset to read of `partition`, if assigned.
    pub fn position(&self, partition: i32) -> Option<i64> {
        self.positions.get(&partition).copied()
    }

    async fn leader(&mut self, partition: i32) -> Result<(String, &mut Connection), ClientError> {
        let addr = self.routes.find_leader(partition).await?;
        if !self.connections.contains_key(&addr) {
            let connection = Connection::connect(&addr, &self.config.client_id, self.config.request_timeout).await?;
            self.connections.insert(addr.clone(), connection);
        }
        let connection = self
            .connections
            .get_mut(&addr)
            .ok_or_else(|| ClientError::Unavailable(format!("no connection to {addr}")))?;
        Ok((addr, connection))
    }

    async fn list_offset(&mut self, partition: i32, timestamp: i64) -> Result<i64, ClientError> {
        let topic = self.routes.topic.clone();
        let request =
            ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.clone())))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(partition)
                    .with_timestamp(timestamp)])]);
        let (addr, connection) = self.leader(partition).await?;
        let response = match connection.request(LIST_OFFSETS_VERSION, &request, Duration::ZERO).await {
            Ok(response) => response,
            Err(e) => {
                self.connections.remove(&addr);
                return Err(e);
            }
        };
        let answer = response
            .topics
            .first()
            .and_then(|t| t.partitions.first())
            .ok_or_else(|| ClientError::Decode("a ListOffsets answer without the partition asked".into()))?;
        check(answer.error_code, || format!("listing offsets of {topic}-{partition}"))?;
        Ok(answer.offset)
    }

    /// Fetches from each assigned partition's leader and returns the records that came (none
    /// when the wait ran out), in offset order per partition. A leader that moved or cannot
    /// be reached is looked up again at the next poll.
    pub async fn poll(&mut self) -> Result<Vec<Received>, ClientError> {
        let mut by_leader: BTreeMap<String, Vec<(i32, i64)>> = BTreeMap::new();
        for (&partition, &offset) in &self.positions {
            if let Some(addr) = self.routes.leader(partition) {
                by_leader.entry(addr).or_default().push((partition, offset));
            }
        }
        if by_leader.is_empty() && !self.positions.is_empty() {
            self.routes.refresh().await?;
            return Ok(Vec::new());
        }
        let mut received = Vec::new();
        let mut stale_routes = false;
        let leaders = by_leader.len() as u32;
        for (addr, partitions) in by_leader {
            let Some(&(first, _)) = partitions.first() else { continue };
            let request = self.fetch_request(&partitions, leaders);
            let wait = self.config.max_wait;
            let result = match self.leader(first).await {
                Ok((_, connection)) => connection.request(FETCH_VERSION, &request, wait).await,
                Err(e) => Err(e),
            };
            let response = match result {
                Ok(response) => response,
                Err(e) if e.is_unreachable() => {
                    self.connections.remove(&addr);
                    stale_routes = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            check(response.error_code, || format!("fetching from {addr}"))?;
            for topic in response.responses {
                for partition in topic.partitions {
                    let index = partition.partition_index;
                    if RETRIABLE.contains(&partition.error_code) {
                        stale_routes = true;
                        continue;
                    }
                    check(partition.error_code, || format!("fetching {}-{index}", self.routes.topic))?;
                    let Some(mut records) = partition.records else { continue };
                    let position = self.positions.get(&index).copied().unwrap_or(0);
                    let mut next = position;
                    let sets = RecordBatchDecoder::decode_all(&mut records)
                        .map_err(|e| ClientError::Decode(format!("records of partition {index}: {e:#}")))?;
                    for record in sets.into_iter().flat_map(|set| set.records) {
                        // A batch starts before the offset asked for when the fetch began in it.
                        if record.control || record.offset < position {
                            next = next.max(record.offset + 1);
                            continue;
                        }
                        next = next.max(record.offset + 1);
                        received.push(Received {
                            partition: index,
                            offset: record.offset,
                            timestamp: record.timestamp,
                            key: record.key,
                            value: record.value,
                            headers: record.headers.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
                        });
                    }
                    self.positions.insert(index, next);
                }
            }
        }
        if stale_routes {
            self.routes.refresh().await?;
        }
        Ok(received)
    }

    fn fetch_request(&self, partitions: &[(i32, i64)], leaders: u32) -> FetchRequest {
        let wait = self.config.max_wait / leaders.max(1);
        FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(i32::try_from(wait.as_millis()).unwrap_or(i32::MAX))
            .with_min_bytes(1)
            .with_max_bytes(i32::MAX)
            .with_isolation_level(0)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_string(self.routes.topic.clone())))
                .with_partitions(
                    partitions
                        .iter()
                        .map(|&(partition, offset)| {
                            FetchPartition::default()
                                .with_partition(partition)
                                .with_fetch_offset(offset)
                                .with_current_leader_epoch(-1)
                                .with_log_start_offset(-1)
                                .with_partition_max_bytes(self.config.partition_max_bytes)
                        })
                        .collect(),
                )])
    }
}
