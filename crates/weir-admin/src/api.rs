//! The JSON bodies of the admin API, as Rust types.
//!
//! API boundary: these types *are* the wire format. The server serializes them and the `weir`
//! command line deserializes the same types, so a field renamed here is renamed for both; and
//! `docs/admin-api.md` shows every one of them. Optional request fields have serde defaults, so a
//! client sends only what it means.

use std::collections::BTreeMap;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

// ----- errors and probes ---------------------------------------------------------------------

/// Every error response: `{"error":{"code":"UNKNOWN_TOPIC_OR_PARTITION","message":"..."}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// `code` is Kafka's error name (SCREAMING_SNAKE_CASE, e.g. `TOPIC_ALREADY_EXISTS`), or one of
/// the HTTP-level codes `NOT_FOUND` and `METHOD_NOT_ALLOWED` for a request no endpoint matches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
}

/// `/health` and `/ready`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Status {
    /// `ok` (live), `ready`, `starting` or `shutting_down`.
    pub status: String,
}

// ----- broker --------------------------------------------------------------------------------

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BrokerInfo {
    pub node_id: i32,
    pub cluster_id: String,
    /// Weir's version.
    pub version: String,
    pub listeners: Listeners,
    /// Absolute path of the data directory.
    pub data_dir: String,
    /// Milliseconds since `weir server` started.
    pub uptime_ms: u64,
    /// Topics, internal ones included.
    pub topics: usize,
    /// Partitions of all topics.
    pub partitions: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Listeners {
    /// The bound Kafka listener.
    pub kafka: String,
    /// What Metadata tells Kafka clients to connect to.
    pub kafka_advertised: String,
    /// The bound admin HTTP listener.
    pub admin: String,
}

/// One config with its effective value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigEntry {
    pub name: String,
    pub value: String,
    /// Topic configs: `topic` (the topic's own override), `broker` (the broker-wide `log.*`
    /// default) or `default` (Kafka's default). Broker settings: `static` (set in the config
    /// file, environment or command line) or `default`. Group settings: `group` (set for the
    /// group) or `default`.
    pub source: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Configs {
    pub configs: Vec<ConfigEntry>,
}

// ----- cluster -------------------------------------------------------------------------------

/// `GET /v1/cluster`: the core's own types, serialized as they are (one definition of the
/// shape, in `weir_broker::cluster::status`).
pub use weir_broker::cluster::{ClusterStatus, NodeInfo, QuorumMembership};
pub use weir_broker::metadata::raft::QuorumStatus;
pub use weir_broker::NodeStatus;

// ----- reassignments -------------------------------------------------------------------------

/// `POST /v1/reassignments`: Kafka's reassignment JSON (`kafka-reassign-partitions.sh
/// --reassignment-json-file`), `{"version":1,"partitions":[{"topic":"t","partition":0,
/// "replicas":[2,3]}]}`. `"replicas": null` cancels the partition's reassignment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReassignmentPlan {
    #[serde(default = "plan_version")]
    pub version: i32,
    pub partitions: Vec<PlannedPartition>,
    /// False refuses targets that change a partition's number of replicas.
    #[serde(default = "yes")]
    pub allow_replication_factor_change: bool,
}

fn plan_version() -> i32 {
    1
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedPartition {
    pub topic: String,
    pub partition: i32,
    /// The target replicas, the preferred leader first; `null` cancels.
    pub replicas: Option<Vec<i32>>,
    /// Kafka's plans carry log dirs (`"any"`); Weir has one data directory per broker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_dirs: Option<Vec<String>>,
}

/// The answer to a plan: one result per partition, in plan order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReassignmentResults {
    pub results: Vec<ReassignmentResult>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReassignmentResult {
    pub topic: String,
    pub partition: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorDetail>,
}

/// `GET /v1/reassignments`: those in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reassignments {
    pub reassignments: Vec<OngoingReassignment>,
}

pub use weir_broker::cluster::reassignment::OngoingReassignment;

/// `GET`/`PUT /v1/replication-throttle`: the cluster-wide replication throttle, bytes per second
/// both for leaders sending and followers fetching a reassignment's copy; `null` is no limit.
/// (Per-broker values are set with Kafka's IncrementalAlterConfigs.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicationThrottle {
    pub bytes_per_second: Option<u64>,
}

// ----- topics --------------------------------------------------------------------------------

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TopicList {
    pub topics: Vec<TopicSummary>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TopicSummary {
    pub name: String,
    pub id: String,
    pub partitions: i32,
    pub internal: bool,
}

/// `POST /v1/topics`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTopic {
    pub name: String,
    /// Default: the broker's `num.partitions`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<i32>,
    /// Default: the broker's `default.replication.factor`. At most the number of live brokers
    /// (1 on a single node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_factor: Option<i16>,
    /// Topic config overrides by Kafka name (`retention.ms`, `cleanup.policy`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub configs: BTreeMap<String, String>,
    /// Run every check, create nothing.
    #[serde(default)]
    pub validate_only: bool,
    /// An elastic topic (`docs/elastic.md`): `partitions` is then its physical partition count.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub elastic: bool,
    /// An elastic topic's stable partitions, the ones Kafka clients see: a power of two, at
    /// least `partitions`. Default: 16 per physical partition, rounded up to a power of two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_partitions: Option<i32>,
}

/// The answer to `POST /v1/topics`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CreatedTopic {
    pub name: String,
    /// Nil with `validate_only` (no topic was created).
    pub id: String,
    pub partitions: i32,
    pub replication_factor: i16,
    pub configs: Vec<ConfigEntry>,
    pub validate_only: bool,
    /// An elastic topic's physical partitions (`partitions` counts its stable ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physical_partitions: Option<i32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TopicDescription {
    pub name: String,
    pub id: String,
    pub internal: bool,
    pub replication_factor: i16,
    pub partitions: Vec<PartitionInfo>,
    /// Every topic config with its effective value and source, sorted by name.
    pub configs: Vec<ConfigEntry>,
    /// Bytes on disk, all partitions.
    pub size_bytes: u64,
    /// An elastic topic's layout; absent for a plain topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<ElasticDescription>,
}

/// An elastic topic's layout (`docs/elastic.md`): its `partitions` are the stable ones.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ElasticDescription {
    /// Always 65,536.
    pub logical_partitions: i32,
    pub stable_partitions: i32,
    /// Every physical partition it has had, active ones first, each by range.
    pub physical: Vec<PhysicalPartitionInfo>,
}

/// One physical partition of an elastic topic.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PhysicalPartitionInfo {
    pub id: i32,
    /// `active`, `sealed` (replaced; some of its range is still moving) or `retired`.
    pub state: String,
    /// Its stable partitions, `[first, last]`.
    pub stable_first: i32,
    pub stable_last: i32,
    /// Its logical partitions, `[first, last]`.
    pub logical_first: i32,
    pub logical_last: i32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<i32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<i32>,
    /// The replicas its stable partitions share (the preferred leader first); for a sealed or
    /// retired one, where its range was.
    pub replicas: Vec<i32>,
    /// The broker leading its stable partitions: -1 when none does, or when they are led by
    /// different brokers (a move or a failover in progress; see `leaders`).
    pub leader: i32,
    /// Every broker leading one of its stable partitions.
    pub leaders: Vec<i32>,
    /// Stable partitions of its range whose reassignment is in progress.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moving: Vec<i32>,
    /// Its stable partitions' traffic (active ones only), over the leaders' last load window.
    pub bytes_in_per_sec: f64,
    pub bytes_out_per_sec: f64,
    pub size_bytes: u64,
}

/// `GET /v1/cluster/balance`: every broker's load, the balancer's next move and the elastic
/// moves in progress (the controller's own types).
pub use weir_broker::balance::{BalanceReport, BrokerLoad, PlannedMove};

/// `POST /v1/topics/{topic}/split`: split a physical partition of an elastic topic.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitPhysical {
    pub partition: i32,
    /// How long to wait for the moves the split starts (default 60,000 ms; 0: do not wait).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// `POST /v1/topics/{topic}/merge`: merge two adjacent physical partitions of an elastic topic.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergePhysical {
    pub partitions: [i32; 2],
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// What a split or merge did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ElasticChanged {
    pub topic: String,
    /// The physical partitions it created.
    pub created: Vec<i32>,
    /// The physical partitions it replaced.
    pub replaced: Vec<i32>,
    /// Stable partitions whose replicas moved (or are moving, when not `in_force`).
    pub moving: Vec<i32>,
    /// Stable partitions that stayed on their replicas under another preferred leader.
    pub new_leaders: Vec<i32>,
    /// The replaced physical partitions are retired: every moved stable partition serves from
    /// its new replicas. False when the wait ended first (the moves go on).
    pub in_force: bool,
    /// The topic's layout afterwards.
    pub elastic: ElasticDescription,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartitionInfo {
    pub partition: i32,
    /// The broker leading the partition; -1 when it has none.
    pub leader: i32,
    /// Bumped on every change of leader.
    #[serde(default)]
    pub leader_epoch: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    /// The first offset still in the log (retention and DeleteRecords move it).
    pub log_start_offset: i64,
    /// Consumers read up to here (exclusive).
    pub high_watermark: i64,
    /// The offset the next record appended gets.
    pub log_end_offset: i64,
    pub size_bytes: u64,
    /// Producers' bytes appended per second and bytes fetched per second, over the leader's
    /// last load window (5 s); 0 when the leader did not answer.
    #[serde(default)]
    pub bytes_in_per_sec: f64,
    #[serde(default)]
    pub bytes_out_per_sec: f64,
    /// Each follower's lag as the leader sees it; empty when the leader did not answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replica_lags: Vec<ReplicaLag>,
    /// A tiered topic's object-store tier, as the leader sees it (absent for other topics).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteTier>,
}

/// What the object store holds of a tiered partition, and what is still to upload.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteTier {
    /// The leader listed the store: until then the figures below are zeros.
    pub loaded: bool,
    /// The first offset on local disk (KIP-405's local log start): below it, down to
    /// `log_start_offset`, reads are served from the store.
    #[serde(default)]
    pub local_log_start_offset: i64,
    /// The first offset in the store, and the offset after its last uploaded segment.
    pub remote_start_offset: Option<i64>,
    pub remote_end_offset: Option<i64>,
    pub remote_segments: usize,
    pub remote_bytes: u64,
    /// Closed, committed segments not uploaded yet (Kafka's RemoteCopyLagSegments/Bytes).
    pub upload_lag_segments: usize,
    pub upload_lag_bytes: u64,
    pub upload_failures: u64,
    /// Compacted topics: segments the store's compaction rewrote, and the records it removed.
    #[serde(default)]
    pub compacted_segments: u64,
    #[serde(default)]
    pub compacted_records: u64,
    /// The last failed pass's error, until a pass succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// How far a follower trails its leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaLag {
    pub replica: i32,
    /// The leader's log end minus the follower's; `null` until it fetched from this leader.
    pub offsets_behind: Option<i64>,
    /// Milliseconds since the follower last reached the leader's log end.
    pub caught_up_ms_ago: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeletedTopic {
    pub name: String,
    pub id: String,
}

/// `PATCH /v1/topics/{topic}/configs`: an incremental change.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlterConfigs {
    /// Overrides to set (added or replaced).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, String>,
    /// Overrides to remove (the config falls back to the broker's default).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delete: Vec<String>,
    #[serde(default)]
    pub validate_only: bool,
}

/// `POST /v1/topics/{topic}/partitions`: grow the topic to `count` partitions.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreatePartitions {
    pub count: i32,
    #[serde(default)]
    pub validate_only: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartitionCount {
    pub name: String,
    pub partitions: i32,
    pub validate_only: bool,
}

// ----- records -------------------------------------------------------------------------------

/// How keys, values and header values are written in JSON.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// UTF-8 text. Reading a record whose bytes are not UTF-8 replaces the invalid sequences
    /// with U+FFFD; use base64 for binary data.
    #[default]
    Utf8,
    /// Standard base64 with padding (RFC 4648 §4).
    Base64,
}

impl Encoding {
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Utf8 => "utf8",
            Encoding::Base64 => "base64",
        }
    }

    pub fn parse(text: &str) -> Option<Encoding> {
        match text {
            "utf8" | "utf-8" => Some(Encoding::Utf8),
            "base64" => Some(Encoding::Base64),
            _ => None,
        }
    }
}

/// Record headers in order; a name may repeat (Kafka allows it and keeps every value). Written
/// as a JSON array of `[name, value]` pairs (`[["trace","abc"]]`), which keeps repeats and order;
/// read from such an array or from an object (`{"trace":"abc"}`). A `null` value is a header
/// without value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(pub Vec<(String, Option<String>)>);

impl Headers {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for Headers {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for pair in &self.0 {
            seq.serialize_element(pair)?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for Headers {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Headers, D::Error> {
        struct HeadersVisitor;
        impl<'de> Visitor<'de> for HeadersVisitor {
            type Value = Headers;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of header names to values, or an array of [name, value] pairs")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Headers, A::Error> {
                let mut out = Vec::new();
                while let Some((name, value)) = access.next_entry::<String, Option<String>>()? {
                    out.push((name, value));
                }
                Ok(Headers(out))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Headers, A::Error> {
                let mut out = Vec::new();
                while let Some((name, value)) = access.next_element::<(String, Option<String>)>()? {
                    out.push((name, value));
                }
                Ok(Headers(out))
            }

            fn visit_unit<E: de::Error>(self) -> Result<Headers, E> {
                Ok(Headers::default())
            }
        }
        deserializer.deserialize_any(HeadersVisitor)
    }
}

/// `POST /v1/topics/{topic}/records`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProduceRequest {
    pub records: Vec<ProduceRecord>,
    #[serde(default)]
    pub encoding: Encoding,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProduceRecord {
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Headers::is_empty")]
    pub headers: Headers,
    /// Default: by Kafka's murmur2 hash of the key (as the Java client's default partitioner), or
    /// round-robin for a null key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<i32>,
    /// An elastic topic's logical partition (0 to 65,535) instead of `partition`: the record
    /// goes to the stable partition holding it (`docs/elastic.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logical_partition: Option<i32>,
    /// CreateTime in ms since the epoch. Default: now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<i64>,
}

/// One entry per record, in request order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProduceResponse {
    pub offsets: Vec<ProducedRecord>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProducedRecord {
    pub partition: i32,
    /// Absent when the append to this partition failed (see `error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorDetail>,
}

/// A record read back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumedRecord {
    pub partition: i32,
    pub offset: i64,
    pub timestamp: i64,
    /// `CreateTime` or `LogAppendTime`.
    pub timestamp_type: String,
    pub key: Option<String>,
    pub value: Option<String>,
    #[serde(default)]
    pub headers: Headers,
}

/// A message a query found (`GET /v1/topics/{topic}/messages`), in the RocketMQ terms of the
/// one message model (see `docs/rocketmq.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FoundMessage {
    /// The producer's id, or the one Weir derives for a record stored without one.
    pub message_id: String,
    pub partition: i32,
    pub offset: i64,
    pub timestamp: i64,
    pub tag: Option<String>,
    pub keys: Vec<String>,
    pub message_group: Option<String>,
    /// The record's key (a Kafka producer's; a RocketMQ message's is its message group), in the
    /// answer's encoding.
    #[serde(default)]
    pub key: Option<String>,
    /// User properties (headers outside `weir.*`), by name.
    pub properties: BTreeMap<String, String>,
    /// The body, in the answer's encoding.
    pub body: Option<String>,
}

/// `GET /v1/topics/{topic}/messages`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FoundMessages {
    pub topic: String,
    pub encoding: Encoding,
    /// By partition and offset.
    pub messages: Vec<FoundMessage>,
}

/// `GET /v1/topics/{topic}/partitions/{partition}/records`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PartitionRecords {
    pub topic: String,
    pub partition: i32,
    pub encoding: Encoding,
    pub records: Vec<ConsumedRecord>,
    /// Where to continue: the offset after the last record returned (or after the batches read
    /// when they held nothing to return).
    pub next_offset: i64,
    pub high_watermark: i64,
    pub log_start_offset: i64,
}

/// `GET /v1/topics/{topic}/records?offsets=P:O,...`: several partitions in one long poll.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TopicRecords {
    pub topic: String,
    pub encoding: Encoding,
    pub records: Vec<ConsumedRecord>,
    /// One entry per requested partition, in request order.
    pub partitions: Vec<PartitionPosition>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartitionPosition {
    pub partition: i32,
    pub next_offset: i64,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    /// Why this partition could not be read this time (in a cluster: its leader is down); the
    /// offsets are then -1 (or `next_offset` the one asked for) and the other partitions were read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorDetail>,
}

// ----- consumer groups -----------------------------------------------------------------------

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupList {
    pub groups: Vec<GroupSummary>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupSummary {
    pub group_id: String,
    /// Kafka's names: `Empty`, `PreparingRebalance`, `CompletingRebalance`, `Stable`.
    pub state: String,
    /// `consumer` for Kafka consumers; empty for a group that only ever had standalone commits.
    pub protocol_type: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupDescription {
    pub group_id: String,
    pub state: String,
    pub protocol_type: String,
    /// The assignor of a Stable group (`range`, `cooperative-sticky`, ...), else empty.
    pub protocol: String,
    pub members: Vec<GroupMember>,
    /// Committed and assigned partitions, sorted by topic and partition.
    pub offsets: Vec<GroupOffset>,
    /// The sum of every known lag.
    pub total_lag: i64,
    /// The group's settings in force (`consume.fifo`, `max.delivery.attempts`,
    /// `retry.backoff`), each with source `group` (set for it) or `default`.
    #[serde(default)]
    pub configs: Vec<ConfigEntry>,
    /// A consumer-protocol group's (KIP-848) epochs: the group epoch and the target
    /// assignment's; absent for classic groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_epoch: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignment_epoch: Option<i32>,
}

/// `POST /v1/groups`: a consumer group with settings (RocketMQ's subscription group). Groups
/// need not be created: one without settings has the defaults.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateGroup {
    pub name: String,
    /// Group settings by name; those left out keep their defaults.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub configs: BTreeMap<String, String>,
    /// Run every check, change nothing.
    #[serde(default)]
    pub validate_only: bool,
}

/// The answer to `POST /v1/groups`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CreatedGroup {
    pub name: String,
    pub configs: Vec<ConfigEntry>,
    pub validate_only: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GroupMember {
    pub member_id: String,
    /// A consumer-protocol member's epoch; absent for classic members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_epoch: Option<i32>,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    /// Decoded for `consumer` groups while Stable; empty otherwise.
    pub assignment: Vec<TopicPartitions>,
    /// A RocketMQ consumer's kind (`SimpleConsumer`, `PushConsumer`, `PullConsumer`, or
    /// `Consumer` until it says); absent for members of the group protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_type: Option<String>,
    /// A RocketMQ consumer's language (`JAVA`, `PYTHON`, ...) and client version, once it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// A RocketMQ consumer's subscription: topic → filter expression (`*`, `TagA || TagB`),
    /// as `mqadmin consumerConnection` lists it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub subscriptions: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicPartitions {
    pub topic: String,
    pub partitions: Vec<i32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupOffset {
    pub topic: String,
    pub partition: i32,
    /// `null`: nothing committed (the partition is only assigned).
    pub committed_offset: Option<i64>,
    /// `null`: the partition no longer exists.
    pub high_watermark: Option<i64>,
    /// high watermark − committed offset (never negative); `null` when either is unknown.
    pub lag: Option<i64>,
    /// The member the partition is assigned to, if any.
    pub member_id: Option<String>,
    /// The commit's metadata string.
    pub metadata: Option<String>,
    /// A share group's records handed out and not yet acknowledged on this partition (from
    /// the invisible-time state, where the partition is led by the broker answering).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<usize>,
}

/// Which partitions of a topic to reset: `"orders"` (all of them) or
/// `{"topic":"orders","partitions":[0,2]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TopicSelector {
    All(String),
    Some { topic: String, partitions: Vec<i32> },
}

impl TopicSelector {
    pub(crate) fn topic(&self) -> &str {
        match self {
            TopicSelector::All(topic) | TopicSelector::Some { topic, .. } => topic,
        }
    }
}

/// Where to move a group's offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResetTo {
    /// `"earliest"`: the log start offset.
    Earliest,
    /// `"latest"`: the high watermark.
    Latest,
    /// `{"timestamp": ms}`: the first record with a timestamp at or after it (the high watermark
    /// if none is that recent), as ListOffsets resolves it.
    Timestamp(i64),
    /// `{"offset": n}`: exactly n, which must lie between the log start offset and the high
    /// watermark.
    Offset(i64),
    /// `{"shift_by": n}`: the committed offset plus n (negative moves back), kept between the log
    /// start offset and the high watermark.
    ShiftBy(i64),
}

/// `POST /v1/groups/{group}/reset-offsets`. Only while the group has no members (Empty).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResetOffsets {
    /// Default: every topic the group has committed offsets for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topics: Option<Vec<TopicSelector>>,
    pub to: ResetTo,
    /// Compute and return the new offsets without committing them.
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResetOffsetsResult {
    pub group_id: String,
    pub dry_run: bool,
    pub offsets: Vec<OffsetChange>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OffsetChange {
    pub topic: String,
    pub partition: i32,
    pub previous_offset: Option<i64>,
    pub new_offset: i64,
}

/// `POST /v1/groups/{group}/offsets`: a standalone commit (as a consumer without group
/// membership commits), allowed only while the group has no members.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitOffsets {
    pub offsets: Vec<CommitOffset>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitOffset {
    pub topic: String,
    pub partition: i32,
    /// The next offset to consume.
    pub offset: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CommittedOffsets {
    pub group_id: String,
    pub offsets: Vec<CommitOffset>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeletedGroup {
    pub group_id: String,
}

/// `POST /v1/groups/{group}/dead-letters/resend`: the group's dead letters (`%DLQ%<group>`)
/// back to the topics they died in.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResendDeadLetters {
    /// The first dead letter's offset. Default: the oldest kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_offset: Option<i64>,
    /// At most this many. Default (and most): 100,000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<usize>,
}

/// The answer: the core's own type, serialized as it is.
pub use weir_messaging::dead_letter::{Resent as ResentDeadLetters, SkippedLetter};

/// `DELETE /v1/groups/{group}/offsets?topic=T`: the committed offsets of one topic removed
/// (Kafka's OffsetDelete).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeletedOffsets {
    pub group_id: String,
    pub topic: String,
    /// The topic's partitions whose offsets are gone (those without any included).
    pub partitions: Vec<i32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_read_objects_and_pairs_and_write_pairs_in_order() {
        let from_object: Headers = serde_json::from_str(r#"{"b":"2","a":null}"#).unwrap();
        assert_eq!(from_object.0.len(), 2);
        let from_pairs: Headers = serde_json::from_str(r#"[["z","1"],["a",null]]"#).unwrap();
        assert_eq!(from_pairs, Headers(vec![("z".into(), Some("1".into())), ("a".into(), None)]));
        assert_eq!(serde_json::to_string(&from_pairs).unwrap(), r#"[["z","1"],["a",null]]"#);
        let repeated = Headers(vec![("t".into(), Some("1".into())), ("t".into(), Some("2".into()))]);
        let written = serde_json::to_string(&repeated).unwrap();
        assert_eq!(serde_json::from_str::<Headers>(&written).unwrap(), repeated, "a repeated name keeps both values");
        assert!(serde_json::from_str::<Headers>(r#""text""#).is_err());
        assert!(serde_json::from_str::<Headers>(r#"[["only-a-name"]]"#).is_err());
    }

    #[test]
    fn reset_targets_are_strings_or_one_key_objects() {
        let parse = |s: &str| serde_json::from_str::<ResetTo>(s);
        assert_eq!(parse(r#""earliest""#).unwrap(), ResetTo::Earliest);
        assert_eq!(parse(r#"{"offset":5}"#).unwrap(), ResetTo::Offset(5));
        assert_eq!(parse(r#"{"shift_by":-2}"#).unwrap(), ResetTo::ShiftBy(-2));
        assert_eq!(parse(r#"{"timestamp":1700000000000}"#).unwrap(), ResetTo::Timestamp(1_700_000_000_000));
        assert!(parse(r#""newest""#).is_err());
        let selectors: Vec<TopicSelector> = serde_json::from_str(r#"["a",{"topic":"b","partitions":[1]}]"#).unwrap();
        assert_eq!(selectors[0].topic(), "a");
        assert_eq!(selectors[1], TopicSelector::Some { topic: "b".into(), partitions: vec![1] });
    }
}

// ----- operations: health, elections, trimming, plans, decommissioning ------------------------

/// `GET /v1/cluster/health`: what needs an operator's attention. `healthy` is true when every
/// list but `draining_brokers` is empty.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterHealth {
    pub healthy: bool,
    /// Registered brokers the controller fenced (stopped, or missing their heartbeats).
    pub fenced_brokers: Vec<i32>,
    /// Unfenced brokers that did not answer for their followers' lag.
    pub unanswered_brokers: Vec<i32>,
    /// Partitions with no leader: nobody can read or write them.
    pub leaderless: Vec<PartitionHealth>,
    /// Partitions whose ISR is smaller than their replica list.
    pub under_replicated: Vec<PartitionHealth>,
    /// Partitions whose ISR is smaller than their `min.insync.replicas`: `acks=all` producers
    /// are refused.
    pub under_min_isr: Vec<PartitionHealth>,
    /// Followers that have not caught up with their leader for more than the leader's
    /// `replica.lag.time.max.ms` (they leave the ISR, or have left it).
    pub lagging_followers: Vec<LaggingFollower>,
    /// Brokers a reassignment is moving replicas off (a decommission in progress): how many
    /// replicas each still holds and how many are moving away.
    pub draining_brokers: Vec<DrainingBroker>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionHealth {
    pub topic: String,
    pub partition: i32,
    pub leader: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    /// The topic's `min.insync.replicas`.
    pub min_insync_replicas: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaggingFollower {
    pub topic: String,
    pub partition: i32,
    pub leader: i32,
    #[serde(flatten)]
    pub lag: ReplicaLag,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainingBroker {
    pub broker: i32,
    /// Partitions with a replica on it (those being moved off included).
    pub replicas: usize,
    /// Of those, the ones a reassignment is removing.
    pub moving_off: usize,
}

/// `POST /v1/elections`: Kafka's ElectLeaders. `partitions: null` elects over every partition;
/// an entry without `partition` stands for every partition of its topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElectLeaders {
    /// `preferred` (give partitions back to their first replica) or `unclean` (a leader for
    /// leaderless partitions, out of the ISR if need be: records may be lost).
    #[serde(rename = "type")]
    pub election: String,
    #[serde(default)]
    pub partitions: Option<Vec<PartitionSelector>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionSelector {
    pub topic: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<i32>,
}

/// One result per partition asked for (with `partitions: null`, per partition that changed or
/// could not). `ELECTION_NOT_NEEDED` means the wanted leader leads already.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElectionResults {
    pub results: Vec<ElectionResult>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElectionResult {
    pub topic: String,
    pub partition: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorDetail>,
}

/// `POST /v1/topics/{topic}/delete-records`: Kafka's DeleteRecords. Exactly one of `offset`
/// (records before it; -1 is the high watermark) and `before_ms` (records before the first one
/// stamped at or after this time) is given; `partitions` absent means every partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteRecords {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<Vec<i32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_ms: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletedRecords {
    pub topic: String,
    pub results: Vec<DeletedRecordsResult>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletedRecordsResult {
    pub partition: i32,
    /// The new log start offset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_watermark: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorDetail>,
}

/// `POST /v1/reassignments/generate`: a plan, not executed. Either `remove_brokers` (move every
/// replica off them) or `balance` (spread replicas and preferred leaders); `topics` limits the
/// partitions moved (all when absent).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeneratePlan {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove_brokers: Vec<i32>,
    #[serde(default)]
    pub balance: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topics: Option<Vec<String>>,
}

/// What `kafka-reassign-partitions.sh --generate` prints: the current replicas of the
/// partitions the plan moves (to go back) and the proposed ones (to execute).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GeneratedPlan {
    pub current: ReassignmentPlan,
    pub proposed: ReassignmentPlan,
}

/// `POST /v1/brokers/{id}/decommission`: the plan moving everything off the broker, started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decommission {
    pub broker: i32,
    pub plan: GeneratedPlan,
    /// One result per partition of the plan.
    pub results: Vec<ReassignmentResult>,
}

/// `DELETE /v1/brokers/{id}`: the broker unregistered (Kafka's UnregisterBroker).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnregisteredBroker {
    pub broker: i32,
}

/// `GET /v1/topics/{topic}/offsets?timestamp=MS`: per partition, the first offset stamped at or
/// after the time (the high watermark where none is), as Kafka's ListOffsets by timestamp.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetsAtTime {
    pub topic: String,
    pub timestamp: i64,
    pub offsets: Vec<PartitionOffset>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionOffset {
    pub partition: i32,
    pub offset: i64,
}

/// `POST /v1/users`: sets a user's SCRAM credential for each mechanism (a new user, or a new
/// password). The password is salted and hashed here; only the credential is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateUser {
    pub name: String,
    pub password: String,
    /// SCRAM-SHA-256 and/or SCRAM-SHA-512. [default: both]
    #[serde(default)]
    pub mechanisms: Vec<String>,
    /// PBKDF2 iterations, 4096 to 16384. [default: 4096]
    #[serde(default)]
    pub iterations: Option<u32>,
    /// RocketMQ access: `true` lets RocketMQ clients sign with the user's name as access key
    /// and its password as secret key (the password is then kept whole, as RocketMQ keeps it);
    /// `false` takes that away. [default: unchanged; a new password replaces the secret]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rocketmq: Option<bool>,
}

/// A user and the SCRAM mechanisms it can log in with (`GET /v1/users`, and the answer to
/// `POST /v1/users`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo {
    pub name: String,
    pub credentials: Vec<UserCredential>,
    /// RocketMQ clients may sign as this user (see [`CreateUser::rocketmq`]).
    #[serde(default)]
    pub rocketmq: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserCredential {
    pub mechanism: String,
    pub iterations: u32,
}

/// `DELETE /v1/users/{name}`: the mechanisms whose credentials were removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletedUser {
    pub name: String,
    pub mechanisms: Vec<String>,
}

/// One ACL (`GET /v1/acls`, `POST /v1/acls`), by Kafka's names: `resource_type` TOPIC, GROUP,
/// CLUSTER, TRANSACTIONAL_ID, DELEGATION_TOKEN or USER; `pattern_type` LITERAL or PREFIXED;
/// `operation` READ, WRITE, ... or ALL; `permission` ALLOW or DENY.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acl {
    pub resource_type: String,
    pub resource_name: String,
    #[serde(default = "literal")]
    pub pattern_type: String,
    /// `User:<name>`, or `User:*`.
    pub principal: String,
    /// An IP address, or `*`.
    #[serde(default = "any_host")]
    pub host: String,
    pub operation: String,
    #[serde(default = "allow")]
    pub permission: String,
}

fn literal() -> String {
    "LITERAL".into()
}

fn any_host() -> String {
    "*".into()
}

fn allow() -> String {
    "ALLOW".into()
}

/// `POST /v1/acls`: the ACLs to add.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateAcls {
    pub acls: Vec<Acl>,
}

/// The answer to `POST /v1/acls`: each ACL, and why it was refused if it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclResult {
    pub acl: Acl,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The answer to `DELETE /v1/acls?...`: the ACLs removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletedAcls {
    pub deleted: Vec<Acl>,
}

/// A client quota entity (`GET /v1/quotas`, `POST /v1/quotas`): a user, a client id, both, or
/// an IP address. `<default>` names the default of its type, as Kafka prints it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaEntity {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
}

/// An entity's quotas (`GET /v1/quotas`), by Kafka's keys: `producer_byte_rate`,
/// `consumer_byte_rate`, `request_percentage`, `controller_mutation_rate`,
/// `connection_creation_rate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Quotas {
    pub entity: QuotaEntity,
    pub quotas: BTreeMap<String, f64>,
}

/// `POST /v1/quotas`: set some of an entity's quotas and remove others.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AlterQuotas {
    pub entity: QuotaEntity,
    #[serde(default)]
    pub set: BTreeMap<String, f64>,
    #[serde(default)]
    pub remove: Vec<String>,
    /// Check the change without making it.
    #[serde(default)]
    pub validate_only: bool,
}
