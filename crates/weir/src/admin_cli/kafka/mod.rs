//! The client commands over the Kafka protocol (`--bootstrap host:port[,host:port]` or
//! `WEIR_BOOTSTRAP`), for a cluster whose admin HTTP port is closed or out of reach, as rpk's
//! `--brokers` and Kafka's scripts' `--bootstrap-server` do. They answer with the admin API's
//! JSON types (`weir_admin::api`), so the tables and `--json` lines are printed by the same
//! code whichever way the answer came.
//!
//! A Kafka error is turned into the admin API's shape once, here ([`failure`]): its code is
//! Kafka's error name (`UNKNOWN_TOPIC_OR_PARTITION`), as the admin API's codes are.

pub mod consume;
pub mod groups;
pub mod member;
pub mod produce;
pub mod topics;

use std::time::Duration;

use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use weir_client::{ClientError, Cluster};

use super::ApiFailure;

/// What this client calls itself in request headers (the broker's logs, DescribeGroups).
pub const CLIENT_ID: &str = "weir-cli";
/// Longest wait for any one answer: beyond the longest Fetch wait and request timeout asked.
const IO_TIMEOUT: Duration = Duration::from_secs(45);
/// The timeout given to the broker for requests that wait on the cluster (CreateTopics, ...).
pub const REQUEST_TIMEOUT_MS: i32 = 30_000;

/// ListOffsets' special timestamps.
pub const LATEST: i64 = -1;
pub const EARLIEST: i64 = -2;

/// Kafka's error codes this client reacts to.
pub mod codes {
    pub const OFFSET_OUT_OF_RANGE: i16 = 1;
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub const LEADER_NOT_AVAILABLE: i16 = 5;
    pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;
    pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub const NOT_COORDINATOR: i16 = 16;
    pub const ILLEGAL_GENERATION: i16 = 22;
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    pub const REBALANCE_IN_PROGRESS: i16 = 27;
    pub const GROUP_ID_NOT_FOUND: i16 = 69;
    pub const FENCED_LEADER_EPOCH: i16 = 74;
    pub const MEMBER_ID_REQUIRED: i16 = 79;
}

/// Connects to the cluster of `bootstrap`.
pub fn connect(bootstrap: &str) -> anyhow::Result<Cluster> {
    Cluster::connect(bootstrap, CLIENT_ID, IO_TIMEOUT).map_err(|e| match e {
        ClientError::BadAddress(_) => anyhow::anyhow!("--bootstrap: {e}"),
        _ => anyhow::anyhow!("{e}; is `weir server` listening there? (set --bootstrap or WEIR_BOOTSTRAP)"),
    })
}

/// A client error as the admin API would have answered it: a Kafka error code becomes an
/// [`ApiFailure`] named as Kafka names it, so `failure_code` works on both paths.
pub fn failure(e: ClientError) -> anyhow::Error {
    match e {
        ClientError::Kafka { code, message } => {
            ApiFailure { code: weir_kafka::errors::error_name(i32::from(code)), message }.into()
        }
        other => anyhow::Error::new(other),
    }
}

/// `Err` of an [`ApiFailure`] for a Kafka error `code` (none for 0), with the broker's message
/// if it sent one, else Kafka's description of the code.
pub fn check(code: i16, message: Option<&StrBytes>, what: impl FnOnce() -> String) -> anyhow::Result<()> {
    if code == 0 {
        return Ok(());
    }
    let said = message.map(|m| m.to_string()).filter(|m| !m.is_empty()).unwrap_or_else(|| describe_code(code));
    Err(failure(ClientError::kafka(code, format!("{}: {said}", what()))))
}

/// Kafka's one-line description of an error code.
pub fn describe_code(code: i16) -> String {
    match kafka_protocol::ResponseError::try_from_code(code) {
        Some(e) => e.to_string(),
        None => format!("error code {code}"),
    }
}

pub fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

/// One topic's partitions from Metadata: (partition, leader or -1, replicas, isr), sorted; an
/// unknown topic is UNKNOWN_TOPIC_OR_PARTITION, as the admin API answers it.
pub struct TopicLayout {
    pub name: String,
    pub id: String,
    pub internal: bool,
    pub partitions: Vec<PartitionLayout>,
}

pub struct PartitionLayout {
    pub partition: i32,
    pub leader: i32,
    pub leader_epoch: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
}

pub fn topic_layout(cluster: &mut Cluster, topic: &str) -> anyhow::Result<TopicLayout> {
    let metadata = cluster.metadata(Some(&[topic.to_string()])).map_err(failure)?;
    layout_of(&metadata, topic)
}

pub fn layout_of(metadata: &MetadataResponse, topic: &str) -> anyhow::Result<TopicLayout> {
    let Some(t) = metadata.topics.iter().find(|t| t.name.as_ref().is_some_and(|n| n.as_str() == topic)) else {
        return Err(unknown_topic(topic));
    };
    if t.error_code == codes::UNKNOWN_TOPIC_OR_PARTITION {
        return Err(unknown_topic(topic));
    }
    check(t.error_code, None, || format!("topic '{topic}'"))?;
    let mut partitions: Vec<PartitionLayout> = t
        .partitions
        .iter()
        .map(|p| PartitionLayout {
            partition: p.partition_index,
            leader: p.leader_id.0,
            leader_epoch: p.leader_epoch,
            replicas: p.replica_nodes.iter().map(|b| b.0).collect(),
            isr: p.isr_nodes.iter().map(|b| b.0).collect(),
        })
        .collect();
    partitions.sort_by_key(|p| p.partition);
    Ok(TopicLayout { name: topic.to_string(), id: t.topic_id.to_string(), internal: t.is_internal, partitions })
}

pub fn unknown_topic(topic: &str) -> anyhow::Error {
    ApiFailure { code: "UNKNOWN_TOPIC_OR_PARTITION".into(), message: format!("topic '{topic}' does not exist") }.into()
}

/// The offsets of `partitions` of `topic` at `timestamp` (LATEST, EARLIEST or ms), asked of
/// each partition's leader: partition → offset (-1: no record at or after the timestamp).
pub fn list_offsets(
    cluster: &mut Cluster,
    layout: &TopicLayout,
    partitions: &[i32],
    timestamp: i64,
) -> anyhow::Result<Vec<(i32, i64)>> {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    let mut by_leader: std::collections::BTreeMap<i32, Vec<i32>> = std::collections::BTreeMap::new();
    for p in partitions {
        let leader = layout.partitions.iter().find(|l| l.partition == *p).map_or(-1, |l| l.leader);
        if leader < 0 {
            anyhow::bail!("partition {p} of '{}' has no leader right now; try again", layout.name);
        }
        by_leader.entry(leader).or_default().push(*p);
    }
    let mut out = Vec::with_capacity(partitions.len());
    for (leader, partitions) in by_leader {
        let request = ListOffsetsRequest::default()
            .with_replica_id(kafka_protocol::messages::BrokerId(-1))
            .with_topics(vec![ListOffsetsTopic::default().with_name(topic_name(&layout.name)).with_partitions(
                partitions
                    .iter()
                    .map(|&p| ListOffsetsPartition::default().with_partition_index(p).with_timestamp(timestamp))
                    .collect(),
            )]);
        let (_, response): (i16, ListOffsetsResponse) = cluster.send_to(leader, 1..=7, &request).map_err(failure)?;
        for t in &response.topics {
            for p in &t.partitions {
                check(p.error_code, None, || format!("offsets of {}-{}", layout.name, p.partition_index))?;
                out.push((p.partition_index, p.offset));
            }
        }
    }
    out.sort();
    Ok(out)
}
