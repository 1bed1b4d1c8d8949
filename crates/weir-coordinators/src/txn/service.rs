//! What a transaction coordinator asks of other brokers, and answers for them.
//!
//! In a cluster, a transaction's partitions, its consumer groups and its coordinator may be on
//! different brokers. The coordinator writes markers to the leader of each partition
//! (`txn.write_markers`), stores committed offsets at the group's coordinator
//! (`txn.commit_offsets`), and a group coordinator receiving a TxnOffsetCommit hands the
//! offsets to the transaction's coordinator (`txn.offset_commit`). Each is a method of the
//! internal RPC; on the broker itself the same code runs without it.
//!
//! Answers carry `Result<_, BrokerError>` in their JSON, so the error kind crosses the wire
//! (and a client hears, say, NOT_COORDINATOR from the broker that knows).

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use weir_rpc::{BoxFuture, Handler, RemoteError};

use super::{err, PendingOffset, ProducerIdentity, TxnCoordinator, TRANSACTION_STATE_TOPIC};
use crate::group::{GroupCoordinator, OffsetToCommit, OFFSETS_TOPIC};
use weir_broker::{Broker, BrokerError, ErrorKind};

const WRITE_MARKERS: &str = "txn.write_markers";
const COMMIT_OFFSETS: &str = "txn.commit_offsets";
const OFFSET_COMMIT: &str = "txn.offset_commit";

/// The markers that end one transaction, for a set of partitions.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Markers {
    pub(crate) producer_id: i64,
    pub(crate) producer_epoch: i16,
    pub(crate) commit: bool,
    pub(crate) partitions: Vec<(String, i32)>,
}

#[derive(Debug, Serialize, Deserialize)]
struct CommitOffsets {
    group_id: String,
    offsets: Vec<PendingOffset>,
    /// The committing transaction's producer, whose offsets become stable (absent from a
    /// broker of an older version).
    #[serde(default)]
    producer_id: Option<i64>,
}

#[derive(Debug, Serialize, Deserialize)]
struct OffsetCommit {
    transactional_id: String,
    who: ProducerIdentity,
    group_id: String,
    offsets: Vec<PendingOffset>,
}

fn rpc_timeout(broker: &Broker) -> Duration {
    Duration::from_millis(broker.config.quorum_request_timeout_ms)
}

/// Calls `method` on broker `id` and decodes its `Result` answer. Blocking.
fn call<Req: Serialize, Resp: DeserializeOwned>(
    broker: &Broker,
    id: i32,
    method: &str,
    request: &Req,
) -> Result<Resp, BrokerError> {
    let body = serde_json::to_vec(request).map_err(|e| BrokerError::internal(e.to_string()))?;
    let answer =
        weir_broker::runtime::block_on(broker.call_broker(id, method, Bytes::from(body), rpc_timeout(broker)))??;
    serde_json::from_slice::<Result<Resp, BrokerError>>(&answer)
        .map_err(|e| BrokerError::internal(format!("{method}: unreadable answer from broker {id}: {e}")))?
}

/// The leader of `topic`-`index` in the metadata; `None` when the partition does not exist.
fn leader_of(broker: &Broker, topic: &str, index: i32) -> Option<i32> {
    broker.metadata().topic(topic).and_then(|t| t.partition(index)).map(|p| p.leader)
}

/// Appends the markers to the partitions this broker hosts; a partition deleted meanwhile has
/// nothing left to mark. An abort marker in `__consumer_offsets` tells the group coordinator
/// that the transaction's offsets will never come. Blocking.
fn write_local_markers(broker: &Broker, groups: &GroupCoordinator, markers: &Markers) -> Result<(), BrokerError> {
    if !markers.commit && markers.partitions.iter().any(|(topic, _)| topic == OFFSETS_TOPIC) {
        groups.transaction_aborted(markers.producer_id);
    }
    for (topic, index) in &markers.partitions {
        let Some(partition) = broker.partition(topic, *index) else {
            if broker.partition_exists(topic, *index) {
                return Err(broker.absent_partition_error(topic, *index));
            }
            continue;
        };
        let marker = weir_storage::records::control_batch(
            markers.producer_id,
            markers.producer_epoch,
            markers.commit,
            broker.now_ms(),
        );
        match broker.append_internal_blocking(&partition, marker) {
            Ok(_) => {}
            // The producer was fenced by a newer epoch in that partition: nothing to end.
            Err(e) if e.kind == ErrorKind::InvalidProducerEpoch => {
                tracing::warn!(topic, partition = index, error = %e, "transaction marker refused");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes the markers at every partition's leader, this broker's directly. Blocking; fails
/// with the first error (the caller retries the whole set: a repeated marker is harmless).
pub(super) fn write_markers_everywhere(
    broker: &Broker,
    groups: &GroupCoordinator,
    markers: Markers,
) -> Result<(), BrokerError> {
    let mut by_leader: BTreeMap<i32, Vec<(String, i32)>> = BTreeMap::new();
    for (topic, index) in markers.partitions {
        // A partition deleted meanwhile has nothing left to mark.
        if let Some(leader) = leader_of(broker, &topic, index) {
            by_leader.entry(leader).or_default().push((topic, index));
        }
    }
    for (leader, partitions) in by_leader {
        let markers = Markers { partitions, ..markers };
        if leader == broker.config.node_id {
            write_local_markers(broker, groups, &markers)?;
        } else if leader < 0 {
            let (topic, index) = &markers.partitions[0];
            return Err(err(ErrorKind::LeaderNotAvailable, format!("{topic}-{index} has no leader right now")));
        } else {
            call::<_, ()>(broker, leader, WRITE_MARKERS, &markers)?;
        }
    }
    Ok(())
}

/// Stores a committed transaction's offsets at the group's coordinator. Blocking. A refusal
/// the coordinator may lift (it is moving, or loading) is an error, so the completion is
/// retried; others are logged, as a plain commit's would be answered.
pub(super) fn commit_group_offsets(
    broker: &Broker,
    groups: &GroupCoordinator,
    group_id: &str,
    offsets: Vec<OffsetToCommit>,
    producer_id: i64,
) -> Result<(), BrokerError> {
    let index = groups.partition_for(group_id);
    let results: Vec<(String, i32, Option<ErrorKind>)> = match leader_of(broker, OFFSETS_TOPIC, index) {
        Some(leader) if leader == broker.config.node_id => commit_local(groups, group_id, offsets, Some(producer_id)),
        Some(leader) if leader >= 0 => {
            let request = CommitOffsets {
                group_id: group_id.to_string(),
                offsets: offsets.iter().map(pending).collect(),
                producer_id: Some(producer_id),
            };
            call(broker, leader, COMMIT_OFFSETS, &request)?
        }
        _ => {
            return Err(err(
                ErrorKind::CoordinatorNotAvailable,
                format!("the coordinator of group {group_id} ({OFFSETS_TOPIC}-{index}) is not available"),
            ))
        }
    };
    for (topic, partition, error) in results {
        match error {
            None => {}
            Some(kind) if kind.is_retriable() => {
                return Err(err(kind, format!("group {group_id} did not store the offset of {topic}-{partition}")));
            }
            Some(kind) => {
                tracing::warn!(group = group_id, topic, partition, ?kind, "a transactional offset was not stored")
            }
        }
    }
    Ok(())
}

fn commit_local(
    groups: &GroupCoordinator,
    group_id: &str,
    offsets: Vec<OffsetToCommit>,
    producer_id: Option<i64>,
) -> Vec<(String, i32, Option<ErrorKind>)> {
    groups
        .commit_transaction_offsets_blocking(group_id, offsets, producer_id)
        .into_iter()
        .map(|r| (r.topic, r.partition, r.error))
        .collect()
}

fn pending(o: &OffsetToCommit) -> PendingOffset {
    PendingOffset {
        topic: o.topic.clone(),
        partition: o.partition,
        offset: o.offset,
        leader_epoch: o.leader_epoch,
        metadata: o.metadata.clone(),
    }
}

fn to_commit(p: PendingOffset) -> OffsetToCommit {
    OffsetToCommit {
        topic: p.topic,
        partition: p.partition,
        offset: p.offset,
        leader_epoch: p.leader_epoch,
        metadata: p.metadata,
    }
}

impl TxnCoordinator {
    /// TxnOffsetCommit as the group coordinator receives it: offsets the transaction will
    /// commit for `group_id`, recorded by the transaction's coordinator, here or on another
    /// broker. Blocking.
    pub fn txn_offset_commit(
        &self,
        transactional_id: &str,
        who: ProducerIdentity,
        group_id: &str,
        offsets: Vec<PendingOffset>,
    ) -> Result<(), BrokerError> {
        let partitions: Vec<(String, i32)> = offsets.iter().map(|o| (o.topic.clone(), o.partition)).collect();
        let index = self.partition_for(transactional_id);
        let result = match leader_of(&self.broker, TRANSACTION_STATE_TOPIC, index) {
            Some(leader) if leader >= 0 && leader != self.broker.config.node_id => {
                let request = OffsetCommit {
                    transactional_id: transactional_id.to_string(),
                    who,
                    group_id: group_id.to_string(),
                    offsets,
                };
                call(&self.broker, leader, OFFSET_COMMIT, &request)
            }
            _ => self.record_txn_offsets(transactional_id, who, group_id, offsets),
        };
        // This broker is the group's coordinator (the client sent the offsets here): their
        // partitions read as unstable until the transaction ends.
        result?;
        self.groups.note_transactional_offsets(who.producer_id, group_id, partitions)
    }

    /// Answers a method of the service. Blocking.
    fn serve(&self, method: &str, body: &[u8]) -> Result<Bytes, RemoteError> {
        match method {
            WRITE_MARKERS => {
                let markers: Markers = weir_rpc::decode_json(method, body)?;
                weir_rpc::encode_json(method, &write_local_markers(&self.broker, &self.groups, &markers))
            }
            COMMIT_OFFSETS => {
                let request: CommitOffsets = weir_rpc::decode_json(method, body)?;
                let offsets = request.offsets.into_iter().map(to_commit).collect();
                let results = commit_local(&self.groups, &request.group_id, offsets, request.producer_id);
                weir_rpc::encode_json(method, &Ok::<_, BrokerError>(results))
            }
            OFFSET_COMMIT => {
                let r: OffsetCommit = weir_rpc::decode_json(method, body)?;
                let result = self.record_txn_offsets(&r.transactional_id, r.who, &r.group_id, r.offsets);
                weir_rpc::encode_json(method, &result)
            }
            other => Err(RemoteError::unknown_method(other)),
        }
    }
}

/// The `txn.*` methods of this broker's internal RPC.
struct TxnService {
    coordinator: Weak<TxnCoordinator>,
}

impl Handler for TxnService {
    fn handle(&self, method: &str, body: Bytes) -> BoxFuture<'static, Result<Bytes, RemoteError>> {
        let coordinator = self.coordinator.clone();
        let method = method.to_string();
        Box::pin(async move {
            let coordinator =
                coordinator.upgrade().ok_or_else(|| RemoteError::new("the transaction coordinator has stopped"))?;
            tokio::task::spawn_blocking(move || coordinator.serve(&method, &body))
                .await
                .map_err(|e| RemoteError::new(format!("the transaction service failed: {e}")))?
        })
    }
}

pub(super) fn register(coordinator: &Arc<TxnCoordinator>) {
    let service = TxnService { coordinator: Arc::downgrade(coordinator) };
    coordinator.broker.cluster.register_service("txn", Arc::new(service));
}
