//! The broker core on one node: topics and partitions over the storage engine, changed only
//! through the metadata state machine.
//!
//! Control operations (create/delete topics, add partitions, alter configs) are serialized by
//! the controller lock: validate against the current state, append records to the metadata log,
//! apply them, then reconcile the partition logs with the new state. Data operations (append,
//! read, list offsets) touch only their partition and take no broker-wide lock beyond a read
//! lock on the partition map.
//!
//! This file holds the [`Broker`] and its data path; what builds on it extends it from files
//! above this one, which this file does not import: opening and wiring (`open.rs`), topic
//! administration (`topics.rs`), control requests and the cluster's lifecycle (`cluster/`),
//! fetches with long polling (`fetch.rs`), ISR proposals (`isr.rs`), the follower's writes
//! (`follower.rs`), dynamic broker and group configs (`broker_configs.rs`, `group_config.rs`)
//! and forwarding to other brokers (`forward.rs`). Below it are only the partition, its
//! replication state, the metrics it counts, the throttles' budgets and the cluster's state.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::sync::{watch, Notify};
use weir_storage::{AppendInfo, Clock, FlushPolicy, LogManager, ReadResult, StorageError, TopicPartition};

use crate::cluster::{Cluster, ControlAnswer, ControlRequest};
use crate::config::BrokerConfig;
use crate::delayed::DelayedRecords;
use crate::error::{BrokerError, ErrorKind, RecordError};
use crate::followed::FollowedPartitions;
use crate::metadata::raft::{Quorum, QuorumStatus};
use crate::metadata::{legacy, BrokerRegistration, MetadataRecord, MetadataState, PartitionState, TopicMetadata};
use crate::metrics::counted::BrokerMetrics;
use crate::partition::{Isolation, Partition, TopicPartitions};
use crate::runtime::block_on;
use crate::topic_config;
use crate::topic_config::TopicCompression;
use weir_storage::sync::{lock, read, write};

pub use weir_controller::topics::{CreatedTopic, NewTopic, MAX_TOPIC_NAME_LEN};

/// Appends of at most this many bytes that cannot fsync are written on the task's own worker
/// thread, not on a blocking thread (see `write_many`).
const INLINE_WRITE_BYTES: usize = 16 * 1024;

/// The ACLs an index was built from, and the index.
pub(crate) type AclIndexCache =
    RwLock<(Arc<std::collections::BTreeSet<weir_metadata::acl::AclBinding>>, Arc<weir_security::acl::AclIndex>)>;

/// What a node says of itself (`weir cluster info`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeStatus {
    pub node_id: i32,
    pub broker: bool,
    pub controller: bool,
    pub quorum: QuorumStatus,
    /// The metadata offset this node has applied and reconciled its partitions with.
    pub applied_offset: i64,
    /// The broker may lead: the controller unfenced it and acknowledged it recently.
    pub may_lead: bool,
    /// How long ago the controller last acknowledged this broker's heartbeat.
    pub heartbeat_acknowledged_ms_ago: Option<u64>,
    pub internal_address: Option<String>,
}

/// A partition's size on disk (DescribeLogDirs).
#[derive(Debug, Clone)]
pub struct PartitionSize {
    pub topic: String,
    pub partition: i32,
    pub size_bytes: u64,
}

/// Which offset ListOffsets asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetQuery {
    /// The end of what is readable: the next offset to be consumed.
    Latest,
    /// The log start offset.
    Earliest,
    /// The record with the largest timestamp (KIP-734).
    MaxTimestamp,
    /// The first offset on local disk (KIP-405): the log start unless the log is tiered.
    EarliestLocal,
    /// The last offset the object store holds of a tiered log (KIP-1005); none for a log that
    /// is not tiered, -1 while the store holds nothing.
    LatestTiered,
    /// The first record with a timestamp at or after this one (ms).
    AtTimestamp(i64),
}

/// What ListOffsets resolves a query to (when a record matches, or for `Latest`/`Earliest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetAnswer {
    /// The found record's timestamp; `None` for `Latest` and `Earliest`, which find an offset,
    /// not a record.
    pub timestamp: Option<i64>,
    pub offset: i64,
    /// The leader epoch the offset belongs to, when the log knows it.
    pub leader_epoch: Option<i32>,
}

/// When a producer's append is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acks {
    /// Once the leader wrote it (as durable as the topic's `flush.policy` makes it there).
    /// Kafka's `acks=1`, and `acks=0` whose front-end sends no answer.
    Leader,
    /// Once every in-sync replica has it; refused up front when fewer than
    /// `min.insync.replicas` are in sync. Kafka's `acks=all` (`-1`).
    All,
}

pub struct Broker {
    pub config: BrokerConfig,
    clock: Arc<dyn Clock>,
    logs: Arc<LogManager>,
    /// The metadata this broker's partitions match (the quorum's applied state, once
    /// reconciled); replaced as a whole on every change, so readers never block.
    metadata: RwLock<Arc<MetadataState>>,
    /// Publishes every state once the partitions match it (see [`Broker::subscribe_metadata`]).
    reconciled_tx: watch::Sender<Arc<MetadataState>>,
    /// This node's part in the metadata quorum.
    pub(crate) quorum: Quorum,
    /// The controller: one metadata decision at a time (validate, propose, apply).
    controller: Mutex<()>,
    /// The state the partitions were last reconciled with (`None` before the first
    /// reconciliation); held while reconciling, so reconciliations happen one at a time and in
    /// order, and each one works on what changed since this state.
    reconciled: Mutex<Option<Arc<MetadataState>>>,
    /// Every open partition, by topic name, indexed by partition number (Kafka partitions run
    /// from 0 without gaps and never shrink). A topic's list is replaced as a whole when it
    /// grows, so the request paths resolve a topic once and index into it without the lock.
    /// Partitions this broker does not host (their replicas are elsewhere) are `None`.
    partitions: RwLock<HashMap<String, TopicPartitions>>,
    /// The partitions this broker follows, by leader (what the replica fetchers fetch); changed
    /// with `partitions`, under its write lock (taken after it).
    followed: RwLock<FollowedPartitions>,
    shutdown_tx: watch::Sender<bool>,
    producer_ids: Mutex<ProducerIdBlock>,
    /// The cluster side: internal RPC, lifecycle, the controller's sessions.
    pub cluster: Cluster,
    /// Where other nodes reach this one's internal RPC server (`host:port`); `None` without a
    /// CONTROLLER listener (a single node).
    pub(crate) internal_address: Option<String>,
    /// Counters and gauges of the request paths (see `metrics`); the rest is read at scrape time.
    pub metrics: BrokerMetrics,
    /// The replication throttles' budgets (see [`crate::throttle`]).
    pub(crate) replication_quotas: crate::throttle::ReplicationQuotas,
    /// The client quotas in force and the rates clients have used (see [`crate::quotas`]).
    pub client_quotas: crate::quotas::ClientQuotas,
    /// The metadata's ACLs and their index for the authorizer (see `acls`): rebuilt by the
    /// first decision after the ACLs change.
    pub(crate) acl_index: AclIndexCache,
    /// What the heartbeats report of this broker's load, as of the last load window: built by
    /// the load sampler once per window, so that a heartbeat walks no partition.
    pub(crate) load_report: Mutex<Arc<weir_controller::balance::LoadReport>>,
    /// The object-storage tier when `remote.log.storage.system.enable` is on (see `tier`).
    pub(crate) tier: Option<Arc<crate::tier::Tier>>,
    /// The pool and writer of memory-first topics (`crate::memory`).
    pub memory: crate::memory::MemoryWriter,
    /// Followers' last fetches through a fetch session, for the ISR checks (see
    /// [`crate::watch::FollowerHeartbeats`]).
    pub follower_heartbeats: crate::watch::FollowerHeartbeats,
    /// Where the append path hands a DELAY topic's records that are not due yet: the
    /// messaging layer's timer, once it has opened (see [`crate::delayed`]).
    delayed: OnceLock<Arc<dyn DelayedRecords>>,
    /// When this broker saw each fenced broker fenced (a transition from unfenced in the
    /// states it reconciled): see [`Broker::brokers_for_clients`].
    fenced_since: Mutex<HashMap<i32, Instant>>,
}

/// Whether the transactional batch `header` belongs to one of the `aborted` transactions: its
/// producer's, begun at or before the batch and ended by a marker after it (Kafka's
/// read_committed rule; a producer has one transaction open at a time in a partition).
fn is_aborted(aborted: &[weir_storage::AbortedTxn], header: &weir_storage::BatchHeader) -> bool {
    aborted.iter().any(|txn| {
        txn.producer_id == header.producer_id
            && txn.first_offset <= header.base_offset
            && header.base_offset <= txn.last_offset
    })
}

/// One batch as the log stores it, with its header decoded ([`Broker::read_batches`]).
#[derive(Debug, Clone)]
pub struct StoredBatch {
    pub header: weir_storage::BatchHeader,
    /// The whole batch, header included.
    pub bytes: bytes::Bytes,
}

impl StoredBatch {
    /// Its records, decoded (decompressed as needed).
    pub fn records(&self) -> Result<Vec<weir_storage::records::Record>, BrokerError> {
        records_of(weir_storage::records::decode_batches(&self.bytes))
    }

    /// Its records as [`StoredBatch::records`] does, but as slices of the buffer the batch was
    /// read into (uncompressed batches): each keeps that whole read alive, so for records
    /// dropped soon after, as a receive's are once answered.
    pub fn transient_records(&self) -> Result<Vec<weir_storage::records::Record>, BrokerError> {
        records_of(weir_storage::records::decode_shared_batches(&self.bytes))
    }

    /// Whether the batch holds a record at every offset of its range (none compacted away).
    pub fn is_dense(&self) -> bool {
        i64::from(self.header.records_count) == i64::from(self.header.last_offset_delta) + 1
    }
}

fn records_of(
    decoded: Result<Vec<weir_storage::records::DecodedBatch>, weir_storage::BatchError>,
) -> Result<Vec<weir_storage::records::Record>, BrokerError> {
    let decoded = decoded.map_err(|e| BrokerError::new(ErrorKind::Corrupt, e.to_string()))?;
    Ok(decoded.into_iter().flat_map(|b| b.records).collect())
}

pub(crate) fn io_error(context: &str, e: impl std::fmt::Display) -> BrokerError {
    BrokerError::new(ErrorKind::Storage, format!("{context}: {e}"))
}

impl Broker {
    /// The broker of the parts [`Broker::open`] opened, with its partitions not reconciled yet.
    pub(crate) fn assemble(
        config: BrokerConfig,
        clock: Arc<dyn Clock>,
        logs: Arc<LogManager>,
        quorum: Quorum,
        cluster: Cluster,
        internal_address: Option<String>,
        tier: Option<Arc<crate::tier::Tier>>,
    ) -> Arc<Broker> {
        let state = quorum.applied();
        let (shutdown_tx, _) = watch::channel(false);
        let (reconciled_tx, _) = watch::channel(state.clone());
        let memory = crate::memory::MemoryWriter::new(config.memory);
        let client_quotas = crate::quotas::ClientQuotas::new(config.quota_window_num, config.quota_window_size_seconds);
        Arc::new(Broker {
            delayed: OnceLock::new(),
            config,
            clock,
            logs,
            metadata: RwLock::new(state),
            reconciled_tx,
            quorum,
            controller: Mutex::new(()),
            reconciled: Mutex::new(None),
            partitions: RwLock::new(HashMap::new()),
            followed: RwLock::new(FollowedPartitions::default()),
            shutdown_tx,
            producer_ids: Mutex::new(ProducerIdBlock { next: 0, end: 0 }),
            cluster,
            replication_quotas: Default::default(),
            client_quotas,
            acl_index: RwLock::new((Arc::default(), Arc::default())),
            load_report: Mutex::new(Arc::default()),
            memory,
            tier,
            follower_heartbeats: Default::default(),
            internal_address,
            metrics: BrokerMetrics::default(),
            fenced_since: Mutex::new(HashMap::new()),
        })
    }

    pub(crate) fn lock_controller(&self) -> MutexGuard<'_, ()> {
        lock(&self.controller)
    }

    /// The metadata offset the partitions were last brought in line with.
    pub(crate) fn reconciled_offset(&self) -> i64 {
        lock(&self.reconciled).as_ref().map_or(-1, |state| state.applied_offset)
    }

    /// The Kafka port clients are told (the bound one when the listener asked for port 0).
    pub fn advertised_port(&self) -> u16 {
        self.config.advertised_port
    }

    /// The address other nodes reach this one at (its CONTROLLER listener), if it has one.
    pub fn internal_address(&self) -> Option<&str> {
        self.internal_address.as_deref()
    }

    /// This node's view of itself, for `weir cluster info` and `GET /v1/cluster`.
    pub(crate) fn node_status(&self) -> NodeStatus {
        NodeStatus {
            node_id: self.config.node_id,
            broker: self.config.roles.broker,
            controller: self.config.roles.controller,
            quorum: self.quorum.status(),
            applied_offset: self.reconciled_offset(),
            may_lead: self.cluster.lifecycle.may_lead(),
            heartbeat_acknowledged_ms_ago: self.cluster.lifecycle.since_last_ack().map(|d| d.as_millis() as u64),
            internal_address: self.internal_address.clone(),
        }
    }

    /// What the controller writes once into a metadata log that lacks it: the state of a Weir
    /// 0.1 data directory, the cluster id, and replica assignments of partitions created before
    /// replicas were assigned. Blocking.
    pub(crate) fn upgrade_metadata(&self) -> Result<(), BrokerError> {
        let held = lock(&self.controller);
        let data_dir = &self.config.data_dir;
        let state = self.quorum.applied();
        let legacy =
            legacy::load(data_dir, self.clock.clone()).map_err(|e| io_error("cannot read the old metadata log", e))?;
        if let Some(legacy) = legacy {
            if state.cluster_id.is_empty() && state.topics.is_empty() {
                tracing::info!(
                    topics = legacy.topics.len(),
                    "moving the metadata of a Weir 0.1 data directory to the quorum"
                );
                self.commit(&held, vec![MetadataRecord::RestoreLegacy { state: Box::new(legacy) }])?;
            }
            // Committed (now or by an earlier start that stopped before this): read no more.
            legacy::retire(data_dir).map_err(|e| io_error("cannot retire the old metadata log", e))?;
        }
        let mut upgrade = Vec::new();
        let state = self.quorum.applied();
        if state.cluster_id.is_empty() {
            upgrade.push(MetadataRecord::InitCluster { cluster_id: weir_controller::new_cluster_id() });
        }
        if state.has_unassigned_partitions() {
            // Partitions of a version before replica assignments have always been this node's.
            tracing::info!(
                broker = self.config.node_id,
                "assigning the partitions of an older data directory to this broker"
            );
            upgrade.push(MetadataRecord::AssignLegacyPartitions { broker: self.config.node_id });
        }
        if !upgrade.is_empty() {
            self.commit(&held, upgrade)?;
        }
        Ok(())
    }

    /// Reconciles the partitions with every state the quorum applies from now on (decisions of
    /// this node's controller are reconciled by `commit` already; this catches the others).
    pub(crate) fn follow_metadata(self: &Arc<Self>) {
        let mut states = self.quorum.subscribe();
        let broker = Arc::downgrade(self);
        let mut shutdown = self.shutdown_signal();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    changed = states.changed() => if changed.is_err() { return },
                    _ = shutdown.changed() => return,
                }
                let Some(broker) = broker.upgrade() else { return };
                let latest = states.borrow_and_update().clone();
                let reconciled = tokio::task::spawn_blocking(move || broker.reconcile_to(latest)).await;
                match reconciled {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::error!(error = %e, "cannot bring the partitions in line with the metadata"),
                    Err(e) => tracing::error!(error = %e, "the metadata reconciliation task failed"),
                }
            }
        });
    }

    /// The clock every store of this broker reads (stores opened beside it share it).
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    pub fn metadata(&self) -> Arc<MetadataState> {
        read(&self.metadata).clone()
    }

    /// Every metadata state from now on, each published once the partitions match it (a
    /// partition it gives this broker is open by then): how coordinators learn of the
    /// internal-topic partitions they come to lead.
    pub fn subscribe_metadata(&self) -> watch::Receiver<Arc<MetadataState>> {
        self.reconciled_tx.subscribe()
    }

    /// The registered brokers that may lead (unfenced), by id.
    pub fn live_brokers(&self) -> Vec<BrokerRegistration> {
        self.metadata().brokers.values().filter(|b| !b.fenced).cloned().collect()
    }

    /// The brokers Metadata and DescribeCluster list, by id: the live ones, and those fenced
    /// less than `broker.session.timeout.ms` ago (they lead nothing, and clients only connect to
    /// a broker they need).
    ///
    /// Why not only the live ones, as KRaft lists: librdkafka (2.10 and later) tears down its
    /// handle of a broker that leaves the list, and a coordinator request waiting for that
    /// broker then waits forever (confluentinc/librdkafka#5511). With the liveness watch a dead
    /// coordinator is fenced within milliseconds, often before the client, told of it by a
    /// FindCoordinator a moment earlier, has found it gone and asked again; listing it for a
    /// session timeout more gives the client that time, and keeps the broker list changing no
    /// sooner than Kafka's timeouts make it change.
    pub fn brokers_for_clients(&self) -> Vec<BrokerRegistration> {
        let grace = Duration::from_millis(self.config.broker_session_timeout_ms);
        let fenced_since = lock(&self.fenced_since);
        self.metadata()
            .brokers
            .values()
            .filter(|b| !b.fenced || fenced_since.get(&b.id).is_some_and(|since| since.elapsed() < grace))
            .cloned()
            .collect()
    }

    /// Records when brokers became fenced between `previous` and `state`, and forgets those
    /// unfenced or gone.
    fn note_fenced(&self, previous: Option<&MetadataState>, state: &MetadataState) {
        let mut fenced_since = lock(&self.fenced_since);
        fenced_since.retain(|id, _| state.brokers.get(id).is_some_and(|b| b.fenced));
        let Some(previous) = previous else { return };
        for b in state.brokers.values().filter(|b| b.fenced) {
            if previous.brokers.get(&b.id).is_some_and(|before| !before.fenced) {
                fenced_since.entry(b.id).or_insert_with(Instant::now);
            }
        }
    }

    /// The broker Kafka clients are told is the controller: this one, when it is a live
    /// broker, else any live broker; `None` when none is. Every broker forwards metadata changes to
    /// the active controller, so, as KRaft brokers do, a broker names one that is surely alive
    /// rather than the active controller: a client keeps the id it was told until it refreshes
    /// its metadata, and one told of a controller that then died would send its admin requests
    /// nowhere until then.
    pub fn controller_for_clients(&self) -> Option<i32> {
        let live = self.live_brokers();
        let me = self.config.node_id;
        if self.config.roles.broker && live.iter().any(|b| b.id == me) {
            return Some(me);
        }
        live.first().map(|b| b.id)
    }

    /// The active controller's node id, if the quorum has one.
    pub fn active_controller(&self) -> Option<i32> {
        self.quorum.leader().and_then(|l| i32::try_from(l).ok())
    }

    /// The broker leading partition `index` of `topic` (a coordinator's partition), with its
    /// endpoints; `CoordinatorNotAvailable` when nobody leads it or its broker is not live.
    pub fn leader_endpoint(&self, topic: &str, index: i32) -> Result<BrokerRegistration, BrokerError> {
        let state = self.metadata();
        let partition = state.topic(topic).and_then(|t| t.partition(index)).ok_or_else(|| {
            BrokerError::new(ErrorKind::CoordinatorNotAvailable, format!("{topic}-{index} does not exist yet"))
        })?;
        state.brokers.get(&partition.leader).filter(|b| !b.fenced).cloned().ok_or_else(|| {
            BrokerError::new(
                ErrorKind::CoordinatorNotAvailable,
                format!("{topic}-{index} has no live leader right now"),
            )
        })
    }

    /// Calls `method` of the internal RPC service on broker `id` (this broker included: then
    /// in-process, through the same handler).
    pub async fn call_broker(
        &self,
        id: i32,
        method: &str,
        body: bytes::Bytes,
        timeout: Duration,
    ) -> Result<bytes::Bytes, BrokerError> {
        if id == self.config.node_id {
            let service = self
                .cluster
                .service(method)
                .ok_or_else(|| BrokerError::internal(format!("no service serves {method} on this broker")))?;
            return service.handle(method, body).await.map_err(|e| BrokerError::internal(e.message().to_string()));
        }
        let state = self.metadata();
        let addr = state
            .brokers
            .get(&id)
            .map(|b| b.internal.clone())
            .filter(|a| !a.is_empty())
            .ok_or_else(|| BrokerError::new(ErrorKind::Unavailable, format!("broker {id} is not registered")))?;
        crate::cluster::rpc::call(&self.cluster.rpc, &addr, method, body, timeout).await
    }

    pub fn cluster_id(&self) -> String {
        self.metadata().cluster_id.clone()
    }

    pub fn partition(&self, topic: &str, index: i32) -> Option<Arc<Partition>> {
        crate::partition::by_index(read(&self.partitions).get(topic)?, index).cloned()
    }

    /// A topic's partitions, by index: one lookup for all the partitions of a request.
    pub fn topic_partitions(&self, topic: &str) -> Option<TopicPartitions> {
        read(&self.partitions).get(topic).cloned()
    }

    /// The leaders this broker follows some partition of.
    pub(crate) fn followed_leaders(&self) -> Vec<i32> {
        read(&self.followed).leaders()
    }

    /// The partitions `leader` leads and this broker follows, by topic and index.
    pub(crate) fn followed_from(&self, leader: i32) -> Vec<Arc<Partition>> {
        read(&self.followed).of_leader(leader)
    }

    /// Every partition, sorted by topic and index.
    pub fn partitions(&self) -> Vec<Arc<Partition>> {
        let topics = read(&self.partitions);
        let mut out: Vec<Arc<Partition>> = topics.values().flat_map(|list| list.iter().flatten().cloned()).collect();
        out.sort_unstable_by(|a, b| (&a.topic, a.index).cmp(&(&b.topic, b.index)));
        out
    }

    /// Resolves the partition or says why not, as Kafka does.
    /// Whether `topic`-`index` exists in the cluster, hosted here or not.
    pub fn partition_exists(&self, topic: &str, index: i32) -> bool {
        self.metadata().topic(topic).and_then(|t| t.partition(index)).is_some()
    }

    pub fn require_partition(&self, topic: &str, index: i32) -> Result<Arc<Partition>, BrokerError> {
        self.partition(topic, index).ok_or_else(|| self.absent_partition_error(topic, index))
    }

    /// Why this broker cannot serve a partition it does not host: the partition exists on other
    /// brokers (the client's metadata is stale: NOT_LEADER_OR_FOLLOWER makes it refresh) or not
    /// at all.
    pub fn absent_partition_error(&self, topic: &str, index: i32) -> BrokerError {
        let metadata = self.metadata();
        match metadata.topic(topic).and_then(|t| t.partition(index)) {
            Some(p) => BrokerError::new(
                ErrorKind::NotLeader,
                format!(
                    "Broker {} does not host {topic}-{index}; its leader is broker {}.",
                    self.config.node_id, p.leader
                ),
            ),
            None => BrokerError::unknown_partition(topic, index),
        }
    }

    /// Fires when the broker starts shutting down (long polls return early).
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown_tx.subscribe()
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown_tx.borrow()
    }

    /// Commits `records` to the metadata quorum as one decision, then brings the partitions in
    /// line with the applied state. Called with the controller lock held. Blocking.
    pub(crate) fn commit(&self, _held: &MutexGuard<'_, ()>, records: Vec<MetadataRecord>) -> Result<(), BrokerError> {
        let index = block_on(self.quorum.propose(records))??;
        // openraft answers a write once the entry is applied here, and the state machine
        // publishes before it answers.
        let applied = self.quorum.applied();
        debug_assert!(applied.applied_offset >= index as i64, "applied {} < committed {index}", applied.applied_offset);
        self.reconcile_to(applied)
    }

    /// Brings the partitions in line with `state` unless a state at or past it was reconciled
    /// already, then makes it the metadata readers see. Blocking.
    ///
    /// The work is proportional to what changed since the state reconciled last (the topics
    /// whose `Arc` differs, see `MetadataState::topics`), not to every partition: a cluster
    /// with 15,000 partitions creates a topic as fast as one with 15. The first reconciliation
    /// of a process looks at everything, and deletes the logs no partition owns.
    pub(crate) fn reconcile_to(&self, state: Arc<MetadataState>) -> Result<(), BrokerError> {
        let mut reconciled = lock(&self.reconciled);
        let previous = reconciled.clone();
        if previous.as_ref().is_some_and(|p| state.applied_offset < p.applied_offset) {
            return Ok(());
        }
        self.reconcile(previous.as_deref(), &state)?;
        self.note_fenced(previous.as_deref(), &state);
        *reconciled = Some(state.clone());
        *write(&self.metadata) = state.clone();
        self.reconciled_tx.send_replace(state);
        Ok(())
    }

    /// Makes the partition logs match `state`: opens logs of new partitions, applies changed
    /// configs, deletes logs of deleted topics (and, the first time, orphans left by a crash
    /// mid-delete and replicas moved away while this broker was down). With `previous` (the
    /// state the partitions match now) only the topics that differ from it are looked at.
    fn reconcile(&self, previous: Option<&MetadataState>, state: &MetadataState) -> Result<(), BrokerError> {
        let mut topics = write(&self.partitions);
        let changed: Vec<String> = match previous {
            // A change of the dynamic broker configs (the topic defaults) reaches every topic.
            Some(previous) if previous.broker_configs == state.broker_configs => changed_topics(previous, state),
            _ => {
                let every: std::collections::BTreeSet<&String> = topics.keys().chain(state.topics.keys()).collect();
                every.into_iter().cloned().collect()
            }
        };
        // Deletions first: a topic deleted and created again under the same name reuses the dir.
        self.drop_deleted_topics(&mut topics, state, &changed)?;
        self.replication_quotas.update(state, self.config.node_id);
        self.client_quotas.update(state);
        self.drop_moved_replicas(&mut topics, state, &changed)?;
        if previous.is_none() {
            self.delete_stray_logs(state)?;
        }
        // Dynamic topic defaults (`log.retention.ms` set at run time) apply from here on.
        let defaults = topic_config::effective_defaults(
            &self.config.topic_defaults,
            &state.broker_configs,
            Some(self.config.node_id),
        );
        let mut to_open = Vec::new();
        for name in &changed {
            if let Some(topic) = state.topic(name) {
                if let Some(opening) = self.reconcile_topic(&mut topics, topic, &defaults)? {
                    to_open.push(opening);
                }
            }
        }
        self.open_partitions(&mut topics, to_open)?;
        let mut followed = write(&self.followed);
        for name in &changed {
            followed.forget_topic(name);
            for partition in topics.get(name).iter().flat_map(|list| list.iter().flatten()) {
                followed.add(partition);
            }
        }
        if cfg!(debug_assertions) {
            check_reconciled(&topics, state, self.config.node_id);
            followed.check(topics.values().flat_map(|list| list.iter().flatten()));
        }
        Ok(())
    }

    /// Drops the topics the state no longer has (or has under another id, or with fewer
    /// partitions: partitions never shrink, so a topic is either kept whole or deleted whole),
    /// and their logs.
    fn drop_deleted_topics(
        &self,
        topics: &mut HashMap<String, TopicPartitions>,
        state: &MetadataState,
        changed: &[String],
    ) -> Result<(), BrokerError> {
        let stale: Vec<String> = changed
            .iter()
            .filter_map(|name| topics.get_key_value(name))
            .filter(|(name, list)| {
                !state.topic(name).is_some_and(|t| {
                    list.len() <= t.partitions.max(0) as usize && list.iter().flatten().all(|p| p.topic_id == t.id)
                })
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            if let Some(list) = topics.remove(&name) {
                for partition in list.iter().flatten() {
                    partition.wake_waiters();
                    self.logs.delete(&TopicPartition::new(name.clone(), partition.index))?;
                }
            }
        }
        Ok(())
    }

    /// Whether a reassignment moved `tp`'s replicas away from this broker. (Partitions of an old
    /// data directory, not assigned yet, have no replicas: kept.)
    fn moved_away(&self, state: &MetadataState, tp: &TopicPartition) -> bool {
        state
            .topic(&tp.topic)
            .and_then(|t| t.partition(tp.partition))
            .is_some_and(|p| !p.replicas.is_empty() && !p.replicas.contains(&self.config.node_id))
    }

    /// Drops the replicas a reassignment moved away: this broker no longer hosts them.
    fn drop_moved_replicas(
        &self,
        topics: &mut HashMap<String, TopicPartitions>,
        state: &MetadataState,
        changed: &[String],
    ) -> Result<(), BrokerError> {
        let tp_of = |p: &Partition| TopicPartition::new(p.topic.clone(), p.index);
        for name in changed {
            let Some(list) = topics.get_mut(name) else { continue };
            if !list.iter().flatten().any(|p| self.moved_away(state, &tp_of(p))) {
                continue;
            }
            let mut kept: Vec<Option<Arc<Partition>>> = list.to_vec();
            for slot in kept.iter_mut() {
                let Some(partition) = slot.as_ref() else { continue };
                let tp = tp_of(partition);
                if self.moved_away(state, &tp) {
                    tracing::info!(partition = %tp, "deleting the local replica: the partition was reassigned away");
                    partition.stop_waits();
                    self.logs.delete(&tp)?;
                    *slot = None;
                }
            }
            *list = kept.into();
        }
        Ok(())
    }

    /// Deletes the logs no topic owns, and those of partitions moved away while this broker
    /// was down (Kafka's stray logs).
    fn delete_stray_logs(&self, state: &MetadataState) -> Result<(), BrokerError> {
        for (tp, _) in self.logs.logs() {
            let known = state.topic(&tp.topic).is_some_and(|t| tp.partition < t.partitions);
            if !known {
                tracing::warn!(partition = %tp, "deleting a log that no topic owns");
                self.logs.delete(&tp)?;
            } else if self.moved_away(state, &tp) {
                tracing::warn!(partition = %tp, "deleting a stray log: this broker holds no replica of the partition");
                self.logs.delete(&tp)?;
            }
        }
        Ok(())
    }

    /// Brings `topic`'s partitions here in line with the state: its configs and each
    /// partition's state on those it has. Returns what it still lacks, the partitions it hosts
    /// and has not opened, for [`Broker::open_partitions`].
    fn reconcile_topic<'a>(
        &self,
        topics: &mut HashMap<String, TopicPartitions>,
        topic: &'a TopicMetadata,
        defaults: &BTreeMap<String, String>,
    ) -> Result<Option<TopicOpening<'a>>, BrokerError> {
        let mut settings = TopicSettings::of(defaults, topic)?;
        if settings.log.remote_storage_enable && self.tier.is_none() {
            // A broker without a store keeps such a topic's logs as plain local logs (retention
            // as usual), rather than keeping every segment for uploads that never come.
            tracing::warn!(topic = %topic.name, "the topic has remote.storage.enable=true but tiered storage is off on this broker (remote.log.storage.system.enable): its logs here are local only");
            settings.log.remote_storage_enable = false;
        }
        let existing: &[Option<Arc<Partition>>] = topics.get(&topic.name).map_or(&[], |list| list);
        for partition in existing.iter().flatten() {
            if *partition.log.config() != settings.log {
                partition.log.set_config(settings.log.clone());
            }
            settings.apply(partition);
            if let Some(state) = topic.partition(partition.index) {
                if *state != *partition.state() {
                    partition.set_state(state.clone());
                }
            }
        }
        // This broker hosts the partitions it holds a replica of.
        let node = self.config.node_id;
        let hosted = |index: i32| topic.partition(index).is_some_and(|p| p.replicas.contains(&node));
        let missing: Vec<i32> = (0..topic.partitions)
            .filter(|i| hosted(*i) && existing.get(*i as usize).is_none_or(|p| p.is_none()))
            .collect();
        if existing.len() == topic.partitions.max(0) as usize && missing.is_empty() {
            return Ok(None);
        }
        Ok(Some(TopicOpening { topic, settings, missing }))
    }

    /// Opens the partitions `openings` lack, the logs of all of them made at once (one
    /// journal commit for a whole metadata change, see `LogManager::get_or_create_many`), and
    /// puts them in `topics`.
    fn open_partitions(
        &self,
        topics: &mut HashMap<String, TopicPartitions>,
        openings: Vec<TopicOpening<'_>>,
    ) -> Result<(), BrokerError> {
        let wanted: Vec<(TopicPartition, weir_storage::LogConfig)> = openings
            .iter()
            .flat_map(|o| {
                o.missing.iter().map(|i| (TopicPartition::new(o.topic.name.clone(), *i), o.settings.log.clone()))
            })
            .collect();
        let mut logs = self.logs.get_or_create_many(wanted)?.into_iter();
        let node = self.config.node_id;
        for TopicOpening { topic, settings, missing } in openings {
            let existing: &[Option<Arc<Partition>>] = topics.get(&topic.name).map_or(&[], |list| list);
            let mut list: Vec<Option<Arc<Partition>>> = existing.to_vec();
            list.resize(topic.partitions.max(0) as usize, None);
            for index in missing {
                let log = logs.next().expect("one log for each partition asked");
                if *log.config() != settings.log {
                    log.set_config(settings.log.clone());
                }
                let state = topic.partition(index).cloned().unwrap_or_else(|| PartitionState::new(Vec::new()));
                let partition = Partition::new(topic.name.clone(), topic.id, index, log, topic.internal, node, state);
                settings.apply(&partition);
                list[index as usize] = Some(Arc::new(partition));
            }
            topics.insert(topic.name.clone(), list.into());
        }
        debug_assert!(logs.next().is_none(), "a log opened for no partition");
        Ok(())
    }

    // ----- data operations ----------------------------------------------------------------

    /// Appends a producer's batches to one partition. Returns once the append is as durable as
    /// the topic's flush policy promises (see [`Broker::append_many`]).
    pub async fn append(
        &self,
        partition: Arc<Partition>,
        records: BytesMut,
        acks: Acks,
    ) -> Result<AppendInfo, BrokerError> {
        self.append_many(vec![(partition, records)], acks)
            .await
            .pop()
            .unwrap_or_else(|| Err(BrokerError::new(ErrorKind::Internal, "append lost its result")))
    }

    /// Appends the batches of a whole produce request, in order, and returns one result per
    /// entry once each append is as durable as its topic's `flush.policy` promises: in the page
    /// cache (`none`, `interval`), or fsynced (`sync`). [`Broker::write_many`] followed by
    /// [`PendingAppends::durable`].
    pub async fn append_many(
        &self,
        appends: Vec<(Arc<Partition>, BytesMut)>,
        acks: Acks,
    ) -> Vec<Result<AppendInfo, BrokerError>> {
        self.write_many(appends, acks).await.durable().await
    }

    /// The first half of [`Broker::append_many`]: writes the batches, in order, and returns
    /// without waiting for fsyncs. A connection can then take its next request while this one's
    /// fsync runs, and the fsyncs of several requests merge (group commit across pipelined
    /// requests); the response still waits for [`PendingAppends::durable`].
    ///
    /// All the writes run in one blocking task: a request for 1,000 partitions costs one hop off
    /// the async workers, not 1,000.
    pub async fn write_many(&self, appends: Vec<(Arc<Partition>, BytesMut)>, acks: Acks) -> PendingAppends {
        let mut results: Vec<Option<Result<AppendInfo, BrokerError>>> = Vec::with_capacity(appends.len());
        let mut work = Vec::with_capacity(appends.len());
        // A broker that may not lead (fenced, or cut off from the controller) writes nothing.
        let may_lead = self.cluster.lifecycle.check_may_lead(self.config.node_id);
        for (slot, (partition, records)) in appends.into_iter().enumerate() {
            let checked = may_lead
                .clone()
                .and_then(|()| self.check_memory_first_append(&partition))
                .and_then(|()| Self::check_client_append(&partition, acks));
            match checked {
                Ok(leader_epoch) => {
                    // A DELAY topic's records with a delivery time to come wait in the timer.
                    let records = match partition.delay_max_ms() {
                        None => records,
                        Some(max_delay_ms) => match self.divert_delayed(&partition, records, max_delay_ms).await {
                            Ok(Some(rest)) => rest,
                            Ok(None) => {
                                results.push(Some(Ok(AppendInfo {
                                    duplicate: false,
                                    first_offset: -1,
                                    last_offset: -1,
                                    log_append_time_ms: None,
                                    batch_count: 0,
                                    record_count: 0,
                                    bytes: 0,
                                })));
                                continue;
                            }
                            Err(e) => {
                                results.push(Some(Err(e)));
                                continue;
                            }
                        },
                    };
                    results.push(None);
                    work.push((slot, partition, records, leader_epoch));
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        let mut pending = PendingAppends {
            results,
            to_sync: Vec::new(),
            to_replicate: Vec::new(),
            to_persist: Vec::new(),
            acks,
            timeout: DEFAULT_PRODUCE_TIMEOUT,
        };
        // Memory-first partitions take room in the pool first: a produce waits while the
        // writes the object store has not taken yet fill it.
        let mut reserved: u64 = work.iter().filter(|w| w.1.log.is_memory_first()).map(|w| w.2.len() as u64).sum();
        if reserved > 0 && !self.memory.reserve(reserved, tokio::time::Instant::now() + DEFAULT_PRODUCE_TIMEOUT).await {
            // Refused; the request's other partitions are written as usual.
            let (refused, rest): (Vec<_>, Vec<_>) = work.into_iter().partition(|w| w.1.log.is_memory_first());
            for (slot, partition, _, _) in refused {
                pending.results[slot] = Some(Err(BrokerError::new(
                    ErrorKind::TimedOut,
                    format!(
                        "{}-{}: the memory pool of memory-first topics (memory.pool.bytes) stayed full: the object \
                         store has not taken the writes waiting",
                        partition.topic, partition.index
                    ),
                )));
            }
            work = rest;
            reserved = 0;
        }
        if work.is_empty() {
            return pending;
        }
        // A small write that cannot fsync goes into the page cache here, on the worker: the
        // hop to a blocking thread and back (two thread wake-ups) cost more than the write
        // itself, half the broker CPU of a one-record acks=all produce (`weir bench rocketmq`).
        // One that may fsync (`flush.messages` reached) stays off the worker; so does a large
        // one, and the rare segment roll of a small one is accepted here.
        let inline = work.iter().map(|w| w.2.len()).sum::<usize>() <= INLINE_WRITE_BYTES
            && work.iter().all(|w| !w.1.log.is_memory_first() && !flushes_by_count(&w.1.log.config()));
        let write = move || {
            work.into_iter()
                .map(|(slot, partition, records, leader_epoch)| {
                    let config = partition.log.config();
                    let size = if partition.log.is_memory_first() { records.len() as u64 } else { 0 };
                    let result = write_client_batches(&partition, &config, records, leader_epoch);
                    (slot, partition, result, config.flush == FlushPolicy::Sync, leader_epoch, size)
                })
                .collect::<Vec<_>>()
        };
        let outcome = if inline { Ok(write()) } else { tokio::task::spawn_blocking(write).await };
        let written = match outcome {
            Ok(written) => written,
            Err(e) => {
                self.memory.release(reserved);
                let message = format!("append task failed: {e}");
                for result in pending.results.iter_mut().filter(|r| r.is_none()) {
                    *result = Some(Err(BrokerError::new(ErrorKind::Internal, message.clone())));
                }
                return pending;
            }
        };
        for (slot, partition, result, needs_sync, leader_epoch, reserved) in written {
            if reserved > 0 {
                // A memory-first write counts once the object store has it, whatever the acks.
                let written = result.as_ref().map_or(0, |info| info.bytes);
                self.memory.written(reserved, written);
                if result.is_ok() {
                    pending.to_persist.push((slot, partition.clone(), leader_epoch));
                }
            } else if acks == Acks::All && result.is_ok() && partition.is_replicated() {
                pending.to_replicate.push((slot, partition.clone(), leader_epoch));
            }
            match result {
                Ok(info) if needs_sync => {
                    pending.to_sync.push((slot, partition, info));
                }
                Ok(info) => pending.results[slot] = Some(Ok(appended(&partition, info))),
                Err(AppendError::Storage(e)) => {
                    if e.is_disk_full() {
                        log_disk_full(&partition, self.now_ms());
                    }
                    pending.results[slot] = Some(Err(e.into()));
                }
                Err(AppendError::Refused(e)) => pending.results[slot] = Some(Err(e)),
            }
        }
        pending
    }

    /// Hands the records of `records` (a producer's batches for a DELAY topic) whose
    /// `weir.delivery-timestamp` is still to come to the timer store; returns the batches of
    /// the others to append now (`None`: there are none). See [`crate::delayed`].
    async fn divert_delayed(
        &self,
        partition: &Partition,
        records: BytesMut,
        max_delay_ms: i64,
    ) -> Result<Option<BytesMut>, BrokerError> {
        match self.delayed.get() {
            Some(timer) => timer.divert(partition, records, max_delay_ms).await,
            // Only a broker opened without its messaging layer (a test of the data path alone)
            // gets here; appending the records now would deliver them early.
            None => {
                Err(BrokerError::internal("this broker keeps no delayed messages (its messaging layer is not open)"))
            }
        }
    }

    /// Installs the timer of delayed messages (the messaging layer does, when it opens); the
    /// first one stays.
    pub fn set_delayed_records(&self, timer: Arc<dyn DelayedRecords>) {
        let _ = self.delayed.set(timer);
    }

    /// A memory-first topic's writes count once the object store has them: on a broker
    /// without tiered storage (restarted without it) they are refused rather than left waiting.
    fn check_memory_first_append(&self, partition: &Partition) -> Result<(), BrokerError> {
        if self.tier.is_none() && partition.log.is_memory_first() {
            return Err(BrokerError::new(
                ErrorKind::InvalidConfig,
                format!(
                    "{} is memory-first (storage.mode=memory) and this broker has no object store: set \
                     remote.log.storage.system.enable=true",
                    partition.topic
                ),
            ));
        }
        Ok(())
    }

    /// What every client's append must pass before it is written, whatever its protocol:
    /// internal topics are the broker's own, only the leader appends, and `acks=all` needs
    /// `min.insync.replicas` in sync. Returns the leader epoch to stamp on the batches.
    fn check_client_append(partition: &Partition, acks: Acks) -> Result<i32, BrokerError> {
        if partition.internal {
            return Err(BrokerError::new(
                ErrorKind::InvalidTopic,
                format!("Cannot append to internal topic {}: it is written by the broker only.", partition.topic),
            ));
        }
        let state = partition.check_local_leader()?;
        let min_isr = partition.min_insync_replicas();
        // A memory-first partition is made durable by the object store, not by an ISR.
        if acks == Acks::All && (state.isr.len() as i64) < min_isr && !partition.log.is_memory_first() {
            return Err(BrokerError::new(
                ErrorKind::NotEnoughReplicas,
                format!(
                    "The size of the current ISR ({}) is insufficient to satisfy the min.isr requirement of {min_isr} for partition {}-{}",
                    state.isr.len(),
                    partition.topic,
                    partition.index
                ),
            ));
        }
        Ok(state.leader_epoch)
    }

    /// Appends the broker's own records (internal topics, transaction markers) and waits for
    /// them to be durable. The only way into an internal topic. Blocking.
    pub fn append_internal_blocking(
        &self,
        partition: &Partition,
        records: BytesMut,
    ) -> Result<AppendInfo, BrokerError> {
        let (info, leader_epoch) = Self::write_as_internal(partition, records)?;
        partition.log.sync_to(info.last_offset + 1)?;
        if partition.is_replicated() {
            // The broker's own records count once the ISR has them, as an acks=all write.
            let deadline = tokio::time::Instant::now() + crate::replication::INTERNAL_REPLICATION_TIMEOUT;
            crate::runtime::block_on(partition.wait_replicated(info.last_offset + 1, leader_epoch, deadline))??;
        }
        Ok(info)
    }

    /// The local write of the broker's own records, as the partition's leader: the offsets
    /// written and the leader epoch they carry. Blocking.
    fn write_as_internal(partition: &Partition, mut records: BytesMut) -> Result<(AppendInfo, i32), BrokerError> {
        let state = partition.check_local_leader()?;
        let info = partition.write_as_leader(state.leader_epoch, || {
            partition.log.append(&mut records, state.leader_epoch).map_err(BrokerError::from)
        })?;
        partition.maybe_advance_high_watermark();
        partition.wake_waiters();
        Ok((info, state.leader_epoch))
    }

    /// The first half of [`Broker::append_internal_blocking`], for an owner that must do
    /// something under its own lock together with the local write (the timer indexes what it
    /// appends): writes `records` to the local log of `partition`, which this broker must lead,
    /// and returns at once. The write counts once [`InternalWrite::durable`] returns. Blocking
    /// (a local write).
    pub fn write_internal(&self, partition: &Arc<Partition>, records: BytesMut) -> Result<InternalWrite, BrokerError> {
        let (info, leader_epoch) = Self::write_as_internal(partition, records)?;
        Ok(InternalWrite { partition: partition.clone(), info, leader_epoch })
    }

    /// Reads whole batches from `offset`, up to the high watermark. Blocking (reads headers
    /// from the page cache or disk).
    pub fn read(
        &self,
        partition: &Partition,
        offset: i64,
        max_bytes: u64,
        min_one_batch: bool,
    ) -> Result<ReadResult, BrokerError> {
        let log = &partition.log;
        Ok(log.read_with(offset, max_bytes, log.high_watermark(), min_one_batch)?)
    }

    /// The record at `offset` of `partition`, if the log still has it below the last stable
    /// offset and it is committed: `None` for a record of an aborted transaction, of one
    /// still open, or of a control batch, as [`Broker::read_records`]. Blocking.
    pub fn read_record(
        &self,
        partition: &Partition,
        offset: i64,
    ) -> Result<Option<weir_storage::records::Record>, BrokerError> {
        if offset < partition.log.log_start_offset() || offset >= partition.log.last_stable_offset() {
            return Ok(None);
        }
        let (records, _) = self.read_records(partition, offset, 1)?;
        Ok(records.into_iter().find(|r| r.offset == offset))
    }

    /// Reads the committed records of `partition` from `offset` on, as a Kafka read_committed
    /// consumer sees them: up to the last stable offset (nothing of a transaction still open,
    /// nor anything after its first record) and about `max_bytes` of whole batches (at least
    /// one batch when there is one), leaving out control batches (transaction markers) and
    /// the batches of aborted transactions. Returns them and the offset after the last batch
    /// read, left out or not (where the next read starts; `offset` when nothing was there), so
    /// a reader that moves on to it steps over aborted records and markers. What the broker's
    /// own consumers (RocketMQ's receive, the message index, dead-letter resends) read: a
    /// record of an aborted or open transaction must never reach them. Blocking.
    pub fn read_records(
        &self,
        partition: &Partition,
        offset: i64,
        max_bytes: u64,
    ) -> Result<(Vec<weir_storage::records::Record>, i64), BrokerError> {
        let (batches, end) = self.read_batches(partition, offset, max_bytes)?;
        let mut out = Vec::new();
        for batch in batches {
            out.extend(batch.records()?.into_iter().filter(|r| r.offset >= offset));
        }
        Ok((out, end))
    }

    /// [`Broker::read_records`] without decoding: the committed batches as the log stores them
    /// (control batches and the batches of aborted transactions left out; the first may begin
    /// before `offset`), and the offset after the last batch read, left out or not. What a
    /// reader that hands batches on whole reads (a Kafka share group's fetch). Blocking.
    pub fn read_batches(
        &self,
        partition: &Partition,
        offset: i64,
        max_bytes: u64,
    ) -> Result<(Vec<StoredBatch>, i64), BrokerError> {
        let log = &partition.log;
        let upper = log.last_stable_offset();
        let in_store = self.reads_remote(partition, offset);
        // A tiered log's part that only the object store holds.
        let remote = if in_store { self.read_tiered_blocking(partition, offset, max_bytes, upper)? } else { None };
        let (bytes, aborted) = if let Some(read) = remote {
            read
        } else {
            // Past what the store holds from `offset` (a compacted topic's gap), the local log
            // goes on from its start.
            let from = if in_store { log.local_log_start_offset() } else { offset };
            let read = log.read_in_memory(from, max_bytes, upper, true)?;
            let Some(slice) = read.slice else { return Ok((Vec::new(), offset)) };
            // The aborted transactions of what was read, as a read_committed fetch lists them.
            let aborted = log.aborted_transactions(slice.first_offset, slice.next_offset);
            (slice.into_bytes().map_err(BrokerError::from)?, aborted)
        };
        let mut end = offset;
        let mut out = Vec::new();
        for (at, header) in weir_storage::batch::headers(&bytes) {
            let size = header.size_bytes().filter(|size| at + size <= bytes.len()).ok_or_else(|| {
                BrokerError::new(ErrorKind::Corrupt, format!("a batch at offset {} is cut short", header.base_offset))
            })?;
            end = end.max(header.next_offset());
            if header.is_control() || (header.is_transactional() && is_aborted(&aborted, &header)) {
                continue;
            }
            out.push(StoredBatch { bytes: bytes.slice(at..at + size), header });
        }
        Ok((out, end))
    }

    /// Reads whole batches from `offset` up to the log end, past the high watermark: how the
    /// coordinators load an internal partition they have come to lead. A new leader's log is
    /// what its ISR will have (its high watermark catches up once the followers fetch), and a
    /// commit the old leader acknowledged may still be above the high watermark this replica
    /// learned. Blocking.
    pub fn read_to_log_end(
        &self,
        partition: &Partition,
        offset: i64,
        max_bytes: u64,
    ) -> Result<ReadResult, BrokerError> {
        let log = &partition.log;
        Ok(log.read_with(offset, max_bytes, log.log_end_offset(), true)?)
    }

    /// ListOffsets for one partition: the offset `query` names, with its record's timestamp
    /// (timestamp queries) and the leader epoch it was written in. With `isolation` committed,
    /// offsets stop at the last stable offset instead of the high watermark.
    pub fn list_offset(
        &self,
        partition: &Partition,
        query: OffsetQuery,
        isolation: Isolation,
    ) -> Result<Option<OffsetAnswer>, BrokerError> {
        let log = &partition.log;
        let end = match isolation {
            Isolation::HighWatermark => log.high_watermark(),
            Isolation::Committed => log.last_stable_offset(),
        };
        let found = match query {
            OffsetQuery::Latest => Some((None, end)),
            OffsetQuery::Earliest => Some((None, log.log_start_offset())),
            OffsetQuery::EarliestLocal => Some((None, log.local_log_start_offset())),
            OffsetQuery::LatestTiered if self.tier.is_some() && log.config().remote_storage_enable => {
                let remote_end = log.remote_end_offset();
                if remote_end <= 0 {
                    return Ok(Some(OffsetAnswer { timestamp: None, offset: -1, leader_epoch: None }));
                }
                Some((None, remote_end - 1))
            }
            OffsetQuery::LatestTiered => None,
            OffsetQuery::MaxTimestamp => {
                let local = log.max_timestamp_offset()?.map(|f| (f.timestamp, f.offset));
                // The store's part counts too; a tie goes to the older record, as between
                // local segments.
                let best = match (self.tiered_max_timestamp(partition)?, local) {
                    (Some(remote), Some(local)) if remote.0 >= local.0 => Some(remote),
                    (Some(remote), None) => Some(remote),
                    (_, local) => local,
                };
                best.map(|(timestamp, offset)| (Some(timestamp), offset)).filter(|(_, offset)| *offset < end)
            }
            OffsetQuery::AtTimestamp(t) if t >= 0 => match self.tiered_offset_for_timestamp(partition, t)? {
                Some((timestamp, offset)) => Some((Some(timestamp), offset)),
                None => log
                    .offset_for_timestamp(t)?
                    .map(|f| (Some(f.timestamp), f.offset))
                    .filter(|(_, offset)| *offset < end),
            },
            OffsetQuery::AtTimestamp(t) => {
                return Err(BrokerError::new(
                    ErrorKind::InvalidRequest,
                    format!("Unsupported ListOffsets timestamp {t}"),
                ));
            }
        };
        Ok(match found {
            Some((timestamp, offset)) => {
                Some(OffsetAnswer { timestamp, offset, leader_epoch: log.epoch_for_offset(offset)? })
            }
            None => None,
        })
    }

    /// OffsetForLeaderEpoch: where `epoch` ended in the partition's log, as (the largest epoch at
    /// or below it that the log has, its end offset); `(-1, -1)` for an epoch newer than the
    /// log's. Only the leader answers.
    pub fn end_offset_for_epoch(&self, partition: &Partition, epoch: i32) -> Result<(i32, i64), BrokerError> {
        partition.check_local_leader()?;
        Ok(partition.log.end_offset_for_epoch(epoch)?)
    }

    /// DeleteRecords: moves the log start offset to `offset` (-1: the high watermark).
    /// Returns the new low watermark. Only the leader trims (NOT_LEADER elsewhere, as in
    /// Kafka): followers learn the log start from it, and a follower that trimmed its own log
    /// would hold less than the leader says it has.
    pub fn delete_records(&self, partition: &Partition, offset: i64) -> Result<i64, BrokerError> {
        partition.check_local_leader()?;
        let log = &partition.log;
        let target = if offset == -1 { log.high_watermark() } else { offset };
        if target < 0 || target > log.high_watermark() {
            return Err(BrokerError::new(
                ErrorKind::OffsetOutOfRange,
                format!("Cannot delete records before {target}: the high watermark is {}", log.high_watermark()),
            ));
        }
        let low_watermark = log.delete_records_before(target)?;
        // Fetch sessions report a moved log start (KIP-227).
        partition.wake_waiters();
        Ok(low_watermark)
    }

    /// Every partition's size (DescribeLogDirs).
    pub fn partition_sizes(&self) -> Vec<PartitionSize> {
        let topics = read(&self.partitions);
        let mut out: Vec<PartitionSize> = topics
            .values()
            .flat_map(|list| list.iter().flatten())
            .map(|p| PartitionSize { topic: p.topic.clone(), partition: p.index, size_bytes: p.log.size_bytes() })
            .collect();
        out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        out
    }

    /// Parks until one of `partitions` may have new data, `deadline` passes, or the broker shuts
    /// down. The caller re-reads after it returns; a spurious wake-up only costs a read.
    pub(crate) async fn wait_for_data(&self, waiter: &Arc<Notify>, deadline: tokio::time::Instant) {
        let mut shutdown = self.shutdown_signal();
        if *shutdown.borrow() {
            return;
        }
        tokio::select! {
            _ = waiter.notified() => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = shutdown.changed() => {}
        }
    }

    /// Starts shutting down: parked fetches return at once.
    pub fn begin_shutdown(&self) {
        self.shutdown_tx.send_replace(true);
        for partition in self.partitions() {
            partition.stop_waits();
        }
    }

    /// Starts the storage engine's own tasks (retention, flushes, checkpoints, the cleaner),
    /// once the partitions match the metadata.
    pub(crate) fn start_storage_background(&self) -> Result<(), BrokerError> {
        Ok(self.logs.start_background()?)
    }

    /// Flushes and closes every log and writes the clean-shutdown marker. Blocking.
    pub fn shutdown(&self) -> Result<(), BrokerError> {
        self.begin_shutdown();
        let _controller = lock(&self.controller);
        if let Err(e) = block_on(self.cluster.stop_server()) {
            tracing::warn!(error = %e, "stopping the internal RPC server");
        }
        if let Err(e) = block_on(self.quorum.shutdown()) {
            tracing::warn!(error = %e, "stopping the metadata quorum");
        }
        self.logs.shutdown()?;
        tracing::info!("storage closed cleanly");
        Ok(())
    }

    /// How long a shut-down waits for requests in progress.
    pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
}

/// A write of the broker's own records ([`Broker::write_internal`]) not yet known to count.
#[must_use = "a write counts only once durable() returns"]
pub struct InternalWrite {
    partition: Arc<Partition>,
    pub info: AppendInfo,
    leader_epoch: i32,
}

impl InternalWrite {
    /// Waits until the write is as durable as the partition's flush policy promises and, when
    /// the partition is replicated, until its ISR has it (as an `acks=all` write).
    pub async fn durable(self) -> Result<AppendInfo, BrokerError> {
        let partition = self.partition.clone();
        let end = self.info.last_offset + 1;
        if partition.log.config().flush == FlushPolicy::Sync {
            let log_partition = partition.clone();
            tokio::task::spawn_blocking(move || log_partition.log.sync_to(end))
                .await
                .map_err(|e| BrokerError::internal(e.to_string()))??;
        }
        if partition.is_replicated() {
            let deadline = tokio::time::Instant::now() + crate::replication::INTERNAL_REPLICATION_TIMEOUT;
            partition.wait_replicated(end, self.leader_epoch, deadline).await?;
        }
        Ok(self.info)
    }
}

/// A produce request's appends, written but not necessarily durable yet (see
/// [`Broker::write_many`]).
#[must_use = "the appends are acknowledged only by `durable`"]
pub struct PendingAppends {
    /// One per append, in request order; `None` while it waits for its fsync.
    results: Vec<Option<Result<AppendInfo, BrokerError>>>,
    /// Written to `flush.policy=sync` partitions: (slot, partition, what was written).
    to_sync: Vec<(usize, Arc<Partition>, AppendInfo)>,
    /// `acks=all` writes to replicated partitions, waiting for the ISR: (slot, partition, the
    /// leader epoch they were written at).
    to_replicate: Vec<(usize, Arc<Partition>, i32)>,
    /// Writes to memory-first partitions, waiting for the object store (see `crate::memory`).
    to_persist: Vec<(usize, Arc<Partition>, i32)>,
    acks: Acks,
    /// How long `acks=all` waits for the ISR (the produce request's timeout).
    timeout: Duration,
}

/// How long `acks=all` waits for the ISR unless the front-end says (Kafka's default
/// `request.timeout.ms`).
pub(crate) const DEFAULT_PRODUCE_TIMEOUT: Duration = Duration::from_secs(30);

impl PendingAppends {
    /// How long `acks=all` waits for the in-sync replicas (default `DEFAULT_PRODUCE_TIMEOUT`).
    pub fn with_timeout(mut self, timeout: Duration) -> PendingAppends {
        self.timeout = timeout;
        self
    }

    /// Answers without waiting for the object store to take the writes to memory-first
    /// partitions: a native writer keeps its records until the checkpoint passes them
    /// (`crate::session`). The pool still counts them until the store has them.
    pub fn without_persistence_wait(mut self) -> PendingAppends {
        self.to_persist.clear();
        self
    }

    /// Waits until every append is as durable as its topic promises and, with `acks=all`, until
    /// the in-sync replicas have it, and returns the results in request order. The fsyncs of
    /// different partitions run in parallel; each partition's `sync_to` is shared with
    /// concurrent appenders (group commit).
    pub async fn durable(self) -> Vec<Result<AppendInfo, BrokerError>> {
        /// Blocking threads one request's fsyncs may occupy at once.
        const PARALLEL_SYNCS: usize = 8;
        let deadline = tokio::time::Instant::now() + self.timeout;
        let PendingAppends { mut results, to_sync, to_replicate, to_persist, acks, timeout: _ } = self;
        debug_assert!(to_replicate.is_empty() || acks == Acks::All);
        let lanes = to_sync.len().min(PARALLEL_SYNCS);
        let mut groups: Vec<Vec<_>> = (0..lanes).map(|_| Vec::new()).collect();
        for (i, entry) in to_sync.into_iter().enumerate() {
            groups[i % lanes].push(entry);
        }
        let tasks: Vec<_> = groups
            .into_iter()
            .map(|group| {
                tokio::task::spawn_blocking(move || {
                    group
                        .into_iter()
                        .map(|(slot, partition, info)| {
                            let synced = partition.log.sync_to(info.last_offset + 1);
                            (slot, partition, info, synced)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for task in tasks {
            match task.await {
                Ok(synced) => {
                    for (slot, partition, info, outcome) in synced {
                        results[slot] = Some(match outcome {
                            Ok(()) => Ok(appended(&partition, info)),
                            Err(e) => Err(e.into()),
                        });
                    }
                }
                Err(e) => tracing::error!(error = %e, "fsync task failed"),
            }
        }
        // One deadline for the whole request: each wait ends as soon as its ISR has the write.
        for (slot, partition, leader_epoch) in to_replicate {
            // A duplicate (a producer's retry) waits too: its first write may not be replicated.
            let Some(Ok(info)) = &results[slot] else { continue };
            if let Err(e) = partition.wait_replicated(info.last_offset + 1, leader_epoch, deadline).await {
                results[slot] = Some(Err(e));
            }
        }
        for (slot, partition, leader_epoch) in to_persist {
            let Some(Ok(info)) = &results[slot] else { continue };
            if let Err(e) = partition.wait_persisted(info.last_offset + 1, leader_epoch, deadline).await {
                results[slot] = Some(Err(e));
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(BrokerError::new(ErrorKind::Internal, "append lost its result"))))
            .collect()
    }
}

/// Logs a failed append on a full disk at most once every 10 s: producers retry, and one line
/// per refused request (hundreds a second) would fill what little space is left with the log.
fn log_disk_full(partition: &Partition, now_ms: i64) {
    static LAST_MS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(i64::MIN);
    static SUPPRESSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    use std::sync::atomic::Ordering::Relaxed;
    let last = LAST_MS.load(Relaxed);
    if now_ms.saturating_sub(last) >= 10_000 && LAST_MS.compare_exchange(last, now_ms, Relaxed, Relaxed).is_ok() {
        let suppressed = SUPPRESSED.swap(0, Relaxed);
        tracing::error!(
            partition = %format!("{}-{}", partition.topic, partition.index),
            suppressed,
            "append failed: disk full (answering KAFKA_STORAGE_ERROR until space is freed)"
        );
    } else {
        SUPPRESSED.fetch_add(1, Relaxed);
    }
}

/// Bookkeeping once an append is acknowledged: wake the fetches parked on the partition, count.
fn appended(partition: &Partition, info: AppendInfo) -> AppendInfo {
    // A leader alone in its ISR moves the high watermark by itself.
    partition.maybe_advance_high_watermark();
    partition.wake_waiters();
    partition.metrics.bytes_in.add(info.bytes);
    partition.metrics.messages_in.add(info.record_count);
    info
}

/// Why a client's batches were not written.
enum AppendError {
    Storage(StorageError),
    /// Refused before the write, with the broker's own error (record errors, say).
    Refused(BrokerError),
}

impl From<BrokerError> for AppendError {
    fn from(e: BrokerError) -> AppendError {
        AppendError::Refused(e)
    }
}

impl From<StorageError> for AppendError {
    fn from(e: StorageError) -> AppendError {
        AppendError::Storage(e)
    }
}

/// A client's batches into the partition's log, as the topic's configs want them: recompressed
/// when its `compression.type` names a codec, refused (with the records at fault) when a
/// compacted topic gets records without a key. Blocking.
/// Whether an append may fsync on its own: `flush.messages` set (Kafka's default is never).
fn flushes_by_count(config: &weir_storage::LogConfig) -> bool {
    matches!(config.flush, FlushPolicy::Interval { messages, .. } if messages < i64::MAX as u64)
}

fn write_client_batches(
    partition: &Partition,
    config: &weir_storage::LogConfig,
    mut records: BytesMut,
    leader_epoch: i32,
) -> Result<AppendInfo, AppendError> {
    if let TopicCompression::Codec(codec) = partition.compression() {
        if let Some(recompressed) =
            weir_storage::records::recompress(&records, codec, config.max_message_bytes as usize)
                .map_err(StorageError::Batch)?
        {
            records = recompressed;
        }
    }
    if config.cleanup_policy.compact {
        reject_keyless_records(&records)?;
    }
    let info = partition
        .write_as_leader::<_, AppendError>(leader_epoch, || Ok(partition.log.append(&mut records, leader_epoch)?))?;
    if partition.log.is_memory_first() && !info.duplicate && info.last_offset >= info.first_offset {
        // The bytes written, offsets and all: what the memory writer puts in the store.
        partition.keep_unpersisted(info.first_offset, info.last_offset + 1, records.freeze());
    }
    Ok(info)
}

/// Compaction keeps the latest record per key, so a compacted topic refuses records without a
/// key, as Kafka does: the whole append, naming each keyless record (KIP-467), so that a client
/// fails exactly those. This decodes (and decompresses) the batches: compacted topics only.
fn reject_keyless_records(records: &[u8]) -> Result<(), AppendError> {
    let decoded = weir_storage::records::decode_records(records).map_err(StorageError::Batch)?;
    let keyless: Vec<RecordError> = decoded
        .iter()
        .enumerate()
        .filter(|(_, r)| r.key.is_none())
        .map(|(index, _)| RecordError {
            index: index as i32,
            message: "Compacted topic cannot accept message without key in topic partition".to_string(),
        })
        .collect();
    if keyless.is_empty() {
        return Ok(());
    }
    let mut error = BrokerError::new(
        ErrorKind::InvalidRecord,
        format!("Compacted topic cannot accept message without key ({} of {} records)", keyless.len(), decoded.len()),
    );
    error.record_errors = keyless;
    Err(AppendError::Refused(error))
}

/// The names of the topics `state` adds, removes or changes against `previous`: those whose
/// `Arc` is not the one `previous` holds. This is exact because `previous` holds its topics:
/// `apply` changes a topic through `Arc::make_mut`, which copies a topic another state shares
/// into a new `Arc`, so a topic that changed since `previous` cannot have kept its pointer
/// (see `MetadataState::topics`). A pointer comparison and a lookup per topic.
fn changed_topics(previous: &MetadataState, state: &MetadataState) -> Vec<String> {
    let added_or_changed = state
        .topics
        .iter()
        .filter(|(name, topic)| previous.topics.get(*name).is_none_or(|old| !Arc::ptr_eq(old, topic)))
        .map(|(name, _)| name);
    let removed = previous.topics.keys().filter(|name| !state.topics.contains_key(*name));
    added_or_changed.chain(removed).cloned().collect()
}

/// The partitions match `state` after a reconciliation: every partition with a replica on
/// `node` is open here with the state's replicas, leader and epochs, and nothing else is open.
/// Checked after every reconciliation in debug builds; it looks at every partition, so an
/// incremental reconciliation that missed a change fails here.
fn check_reconciled(topics: &HashMap<String, TopicPartitions>, state: &MetadataState, node: i32) {
    for (name, topic) in &state.topics {
        let open: &[Option<Arc<Partition>>] = topics.get(name).map_or(&[], |list| list);
        for (index, expected) in topic.assignments.iter().enumerate() {
            let hosted = expected.replicas.contains(&node);
            match open.get(index).and_then(|p| p.as_ref()) {
                Some(partition) => {
                    assert!(hosted || expected.replicas.is_empty(), "{name}-{index} is open here but not hosted");
                    assert_eq!(partition.topic_id, topic.id, "{name}-{index}: open under another topic id");
                    assert_eq!(*partition.state(), *expected, "{name}-{index}: state not reconciled");
                }
                None => assert!(!hosted, "{name}-{index} is hosted here but not open"),
            }
        }
    }
    for name in topics.keys() {
        assert!(state.topics.contains_key(name), "topic {name} is open here but deleted");
    }
}

/// A topic whose partition list here changes: it grew, or some partitions it gives this
/// broker are not open yet (`missing`, ascending).
struct TopicOpening<'a> {
    topic: &'a TopicMetadata,
    settings: TopicSettings,
    missing: Vec<i32>,
}

/// What a topic's configs set on each of its partitions here, resolved once per reconciliation.
struct TopicSettings {
    log: weir_storage::LogConfig,
    min_insync: i64,
    compression: TopicCompression,
    delay_max_ms: Option<i64>,
    throttled: (crate::throttle::ThrottledReplicas, crate::throttle::ThrottledReplicas),
}

impl TopicSettings {
    /// `defaults`: the topic defaults in force on this broker (static and dynamic).
    fn of(defaults: &BTreeMap<String, String>, topic: &TopicMetadata) -> Result<TopicSettings, BrokerError> {
        let configs = &topic.configs;
        Ok(TopicSettings {
            log: topic_config::log_config(defaults, configs)
                .map_err(|e| BrokerError::new(ErrorKind::InvalidConfig, e.message))?,
            min_insync: topic_config::min_insync_replicas(defaults, configs),
            compression: topic_config::compression(defaults, configs),
            delay_max_ms: (topic_config::message_type(configs) == topic_config::MessageType::Delay)
                .then(|| topic_config::message_delay_max_ms(defaults, configs)),
            throttled: topic_config::throttled_replicas(defaults, configs),
        })
    }

    /// Sets everything but the log config (which a new log is created with).
    fn apply(&self, partition: &Partition) {
        partition.set_min_insync_replicas(self.min_insync);
        partition.set_compression(self.compression);
        partition.set_delay_max_ms(self.delay_max_ms);
        partition.set_throttled_replicas(self.throttled.clone());
    }
}

/// An answer of the wrong shape from the controller: a bug (or mismatched versions).
pub(crate) fn unexpected_answer(answer: &ControlAnswer) -> BrokerError {
    BrokerError::internal(format!("the controller answered with {answer:?}"))
}

/// A cluster id in Kafka's style: a UUID in URL-safe base64 without padding (22 characters).
/// Producer ids handed out from blocks reserved in the metadata log, so an id is never given
/// twice, even across crashes (ids of a block not used before a crash are skipped).
pub(crate) struct ProducerIdBlock {
    pub next: i64,
    pub end: i64,
}

impl Broker {
    /// A new producer id for InitProducerId (idempotent producers). Blocking when a new block
    /// must be reserved (one fsynced metadata record per thousand ids).
    pub fn allocate_producer_id(self: &Arc<Self>) -> Result<i64, BrokerError> {
        let mut block = lock(&self.producer_ids);
        if block.next >= block.end {
            match self.control_blocking(ControlRequest::AllocateProducerIds)? {
                ControlAnswer::ProducerIds { first, count } => {
                    *block = ProducerIdBlock { next: first, end: first + count };
                }
                other => return Err(unexpected_answer(&other)),
            }
        }
        let id = block.next;
        block.next += 1;
        Ok(id)
    }
}
