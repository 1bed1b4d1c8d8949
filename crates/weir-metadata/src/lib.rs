//! Cluster metadata as a replicated state machine.
//!
//! Every change of topics, partitions or configs is a [`MetadataRecord`]. The controller proposes
//! the records of one decision to the metadata quorum ([`raft::Quorum`], openraft), and once
//! committed they are applied, in log order, to [`MetadataState`] on every node; nothing else
//! mutates the state. One node is a quorum of one voter: the same code path. Applying a record
//! is deterministic and cannot fail: validation happens before a record is proposed.
//! [`legacy`] reads the metadata log of Weir 0.1 once, to move it to the quorum.
//!
//! Every partition carries its replica set, in-sync replicas, leader and leader epoch
//! ([`PartitionState`]), on one node as in a cluster: the single-node facts (one replica, in
//! sync, leading at epoch 0) are written once, by the controller, and read everywhere.
#![deny(unsafe_code)]
#![deny(clippy::unwrap_used)]

pub mod acl;
pub mod elastic;
pub mod legacy;
pub mod quota;
pub mod raft;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The internal topic of consumer groups' committed offsets (Kafka's name).
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";
/// The internal topic of transactions' states (Kafka's name).
pub const TRANSACTION_STATE_TOPIC: &str = "__transaction_state";
/// The internal topic of delayed messages until they are due: the timer store, sharded by
/// partition (Weir's; RocketMQ keeps its timer log in `rmq_sys_wheel_timer`).
pub const DELAYED_MESSAGES_TOPIC: &str = "__delayed_messages";
/// The internal topic of RocketMQ's transactional (half) messages until decided (Weir's;
/// RocketMQ keeps them in `RMQ_SYS_TRANS_HALF_TOPIC`).
pub const HALF_MESSAGES_TOPIC: &str = "__half_messages";
/// The internal topic of invisible-time consumption's state (Kafka's name, of share groups'
/// state; RocketMQ keeps its POP state in `rmq_sys_REVIVE_LOG` and checkpoints).
pub const SHARE_GROUP_STATE_TOPIC: &str = "__share_group_state";

/// One change to the cluster's metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MetadataRecord {
    /// The first record of a new cluster.
    InitCluster {
        cluster_id: String,
    },
    CreateTopic {
        name: String,
        id: Uuid,
        partitions: i32,
        configs: BTreeMap<String, String>,
        internal: bool,
        /// The replicas of each partition, the preferred leader first (`partitions` entries).
        /// Empty in records written before replicas were assigned (see
        /// [`MetadataRecord::AssignLegacyPartitions`]).
        #[serde(default)]
        assignments: Vec<Vec<i32>>,
    },
    DeleteTopic {
        name: String,
        id: Uuid,
    },
    /// Grows a topic to `partitions` partitions (never shrinks).
    CreatePartitions {
        name: String,
        id: Uuid,
        partitions: i32,
        /// The replicas of each new partition, in partition order (empty in old records).
        #[serde(default)]
        assignments: Vec<Vec<i32>>,
    },
    /// Changes one partition's replicas, in-sync replicas or leader (KRaft's
    /// PartitionChangeRecord). A new leader bumps the leader epoch; every change bumps the
    /// partition epoch.
    PartitionChange {
        topic: String,
        id: Uuid,
        partition: i32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replicas: Option<Vec<i32>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        isr: Option<Vec<i32>>,
        /// [`NO_LEADER`] takes the partition offline.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        leader: Option<i32>,
    },
    /// Starts, replaces, completes or cancels one partition's reassignment (KIP-455): sets its
    /// replicas, in-sync replicas and the replicas the reassignment adds and removes (both
    /// empty once none is in progress). A new leader bumps the leader epoch; every change
    /// bumps the partition epoch.
    PartitionReassignment {
        topic: String,
        id: Uuid,
        partition: i32,
        replicas: Vec<i32>,
        isr: Vec<i32>,
        leader: i32,
        adding: Vec<i32>,
        removing: Vec<i32>,
    },
    /// Partitions created before replicas were assigned (Weir 0.1, always one node) get one
    /// replica on `broker`, in sync and leading at leader epoch 0, the epoch their batches
    /// were written with. Written once, at the first start of a data directory that has such
    /// partitions.
    AssignLegacyPartitions {
        broker: i32,
    },
    /// The whole state of a Weir 0.1 data directory (its own metadata log, read once), as the
    /// first record of the quorum it moves to. Applied only to a state that has nothing yet.
    RestoreLegacy {
        state: Box<MetadataState>,
    },
    /// Makes the topic elastic, or changes its elastic layout (a split, a merge, a physical
    /// partition retired): replaces it with `layout`.
    SetElasticLayout {
        name: String,
        id: Uuid,
        layout: elastic::ElasticLayout,
    },
    /// Replaces the topic's config overrides with `configs`.
    SetTopicConfigs {
        name: String,
        id: Uuid,
        configs: BTreeMap<String, String>,
    },
    /// Replaces the dynamic configs of `resource` (`""`: every broker; else a broker id).
    SetBrokerConfigs {
        resource: String,
        configs: BTreeMap<String, String>,
    },
    /// Replaces a consumer group's settings (`weir_broker::group_config`) with `configs`; empty
    /// removes them (the group has the defaults).
    SetGroupConfigs {
        group: String,
        configs: BTreeMap<String, String>,
    },
    /// Sets a user's SCRAM credential for one mechanism (KRaft's UserScramCredentialRecord):
    /// the salted keys only, never the password.
    SetScramCredential {
        user: String,
        mechanism: ScramMechanism,
        credential: ScramCredential,
    },
    /// Removes a user's SCRAM credential for one mechanism (KRaft's
    /// RemoveUserScramCredentialRecord).
    RemoveScramCredential {
        user: String,
        mechanism: ScramMechanism,
    },
    /// Adds an ACL (KRaft's AccessControlEntryRecord); adding one that exists changes nothing.
    CreateAcl {
        binding: acl::AclBinding,
    },
    /// Removes an ACL (KRaft's RemoveAccessControlEntryRecord).
    RemoveAcl {
        binding: acl::AclBinding,
    },
    /// Sets a user's RocketMQ secret key (ACL 2.0's access keys sign with it, so it is kept
    /// whole, as RocketMQ keeps it); `None` removes it.
    SetAccessSecret {
        user: String,
        secret: Option<String>,
    },
    /// Sets one quota of an entity (KRaft's ClientQuotaRecord); `None` removes it.
    SetClientQuota {
        entity: quota::QuotaEntity,
        key: String,
        value: Option<f64>,
    },
    /// Reserves producer ids `[first, first + count)` for InitProducerId; ids are never reused.
    AllocateProducerIds {
        first: i64,
        count: i64,
    },
    /// A broker (re)starts: its endpoints; it stays fenced until it has caught up.
    RegisterBroker {
        registration: BrokerRegistration,
    },
    /// The broker stops leading: it missed its session timeout, or shut down.
    FenceBroker {
        id: i32,
    },
    /// The broker caught up and heartbeats: it may lead again.
    UnfenceBroker {
        id: i32,
    },
    /// The broker is removed from the cluster (Kafka's UnregisterBroker): a fenced broker that
    /// holds no replica. If its process starts again, it registers anew.
    UnregisterBroker {
        id: i32,
    },
}

/// `leader` of a partition that has none (its replicas are all offline, or it is unassigned).
pub const NO_LEADER: i32 = -1;

/// Where a partition's replicas live and which one leads.
///
/// Invariants (checked by [`MetadataState::check_invariants`]): `isr` is a subset of `replicas`
/// without duplicates; `leader` is [`NO_LEADER`] or in `isr`; `adding_replicas` and
/// `removing_replicas` are disjoint subsets of `replicas`; epochs never decrease.
///
/// During a reassignment `replicas` holds the target replicas followed by the original ones
/// that are not in the target (Kafka's order, so the preferred leader is the target's first);
/// the reassignment completes once every target replica is in the ISR.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionState {
    /// Broker ids holding a replica, the preferred leader first. Empty only for a partition of a
    /// data directory older than replica assignments, until it is assigned.
    pub replicas: Vec<i32>,
    /// The in-sync replicas: those with every acknowledged record.
    pub isr: Vec<i32>,
    pub leader: i32,
    /// Bumped on every change of leader; stamped on every batch the leader appends.
    pub leader_epoch: i32,
    /// Bumped on every change of this state, so that a change computed from an old state can
    /// be refused (KRaft's partition epoch).
    pub partition_epoch: i32,
    /// Replicas an ongoing reassignment adds (they fetch, and join the ISR once caught up).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adding_replicas: Vec<i32>,
    /// Replicas an ongoing reassignment removes once the adding ones are in sync.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removing_replicas: Vec<i32>,
}

impl PartitionState {
    /// A new partition on `replicas`: all in sync, the first leading, at epoch 0.
    pub fn new(replicas: Vec<i32>) -> PartitionState {
        let leader = replicas.first().copied().unwrap_or(NO_LEADER);
        PartitionState {
            isr: replicas.clone(),
            replicas,
            leader,
            leader_epoch: 0,
            partition_epoch: 0,
            adding_replicas: Vec::new(),
            removing_replicas: Vec::new(),
        }
    }

    fn unassigned() -> PartitionState {
        PartitionState::new(Vec::new())
    }

    /// Is a reassignment of this partition in progress?
    pub fn is_reassigning(&self) -> bool {
        !self.adding_replicas.is_empty() || !self.removing_replicas.is_empty()
    }

    /// The replicas the partition will have once its reassignment (if any) completes.
    pub fn target_replicas(&self) -> Vec<i32> {
        self.replicas.iter().copied().filter(|b| !self.removing_replicas.contains(b)).collect()
    }

    /// The replicas the partition had before its reassignment (if any) started.
    pub fn original_replicas(&self) -> Vec<i32> {
        self.replicas.iter().copied().filter(|b| !self.adding_replicas.contains(b)).collect()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicMetadata {
    pub name: String,
    pub id: Uuid,
    /// The partition count; `assignments` has one entry per partition.
    pub partitions: i32,
    /// Overrides only; defaults come from the broker config.
    pub configs: BTreeMap<String, String>,
    pub internal: bool,
    /// Each partition's replicas and leader, by partition index. Missing in snapshots written
    /// before replicas were assigned: then filled with unassigned entries at load.
    #[serde(default)]
    pub assignments: Vec<PartitionState>,
    /// An elastic topic's physical layout (`docs/elastic.md`); its partitions are the stable
    /// ones. `None` for a plain topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<elastic::ElasticLayout>,
}

impl TopicMetadata {
    /// Partition `index`'s replicas and leader.
    pub fn partition(&self, index: i32) -> Option<&PartitionState> {
        self.assignments.get(usize::try_from(index).ok()?)
    }

    /// Replicas per partition (every partition of a topic has as many, as Kafka requires).
    pub fn replication_factor(&self) -> i16 {
        self.assignments.first().map_or(0, |p| i16::try_from(p.replicas.len()).unwrap_or(i16::MAX))
    }
}

fn no_acls(acls: &Arc<std::collections::BTreeSet<acl::AclBinding>>) -> bool {
    acls.is_empty()
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetadataState {
    pub cluster_id: String,
    /// Each topic behind its own `Arc`, so that a copy of the state (one per applied batch, which
    /// the broker keeps as the state readers see) shares every topic a change did not touch:
    /// copying costs one pointer per topic, not one allocation per partition, and a reader can
    /// tell an untouched topic from a changed one with `Arc::ptr_eq` (how the broker reconciles
    /// only what changed). `apply` changes a topic through `Arc::make_mut`, which copies that
    /// topic alone when another state still shares it.
    #[serde(with = "shared_topics")]
    pub topics: BTreeMap<String, Arc<TopicMetadata>>,
    /// Offset of the last applied record; -1 before the first.
    pub applied_offset: i64,
    /// The first producer id not yet reserved.
    #[serde(default)]
    pub next_producer_id: i64,
    /// Every broker that registered with the controller, by id.
    #[serde(default)]
    pub brokers: BTreeMap<i32, BrokerRegistration>,
    /// Dynamic broker configs (the replication throttles, `weir_broker::throttle`, and the
    /// `log.*` topic defaults) by resource:
    /// `""` for every broker, or a broker id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub broker_configs: BTreeMap<String, BTreeMap<String, String>>,
    /// Consumer groups' settings (overrides only), by group; groups without any are absent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub group_configs: BTreeMap<String, BTreeMap<String, String>>,
    /// Users' SCRAM credentials (SASL/SCRAM and PLAIN check passwords against them), by user
    /// and mechanism.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub scram_credentials: BTreeMap<String, BTreeMap<ScramMechanism, ScramCredential>>,
    /// The ACLs the authorizer decides by (`weir_security::acl`). Behind an `Arc`, as the
    /// topics are: the copy of the state made per applied batch shares them, and a reader tells
    /// unchanged ACLs (the broker's index of them stays) with `Arc::ptr_eq`.
    #[serde(default, skip_serializing_if = "no_acls")]
    pub acls: Arc<std::collections::BTreeSet<acl::AclBinding>>,
    /// Users' RocketMQ secret keys (`weir_security::access_key`), by user: only users made
    /// with RocketMQ access have one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub access_secrets: BTreeMap<String, String>,
    /// Client quotas by entity and key (`weir_broker::quotas` enforces them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty", with = "quota::as_pairs")]
    pub client_quotas: quota::ClientQuotas,
}

/// A SCRAM mechanism (RFC 5802 with the hash of RFC 7677), numbered as Kafka's
/// `ScramMechanism` (the AlterUserScramCredentials API's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ScramMechanism {
    #[serde(rename = "SCRAM-SHA-256")]
    Sha256,
    #[serde(rename = "SCRAM-SHA-512")]
    Sha512,
}

impl ScramMechanism {
    pub const ALL: [ScramMechanism; 2] = [ScramMechanism::Sha256, ScramMechanism::Sha512];

    /// The SASL mechanism name.
    pub fn name(self) -> &'static str {
        match self {
            ScramMechanism::Sha256 => "SCRAM-SHA-256",
            ScramMechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(name: &str) -> Option<ScramMechanism> {
        ScramMechanism::ALL.into_iter().find(|m| m.name().eq_ignore_ascii_case(name))
    }

    /// Kafka's number for the mechanism (1: SHA-256, 2: SHA-512; 0 is unknown).
    pub fn kafka_type(self) -> i8 {
        match self {
            ScramMechanism::Sha256 => 1,
            ScramMechanism::Sha512 => 2,
        }
    }

    pub fn from_kafka_type(value: i8) -> Option<ScramMechanism> {
        ScramMechanism::ALL.into_iter().find(|m| m.kafka_type() == value)
    }
}

/// What a broker keeps of a SCRAM password (RFC 5802): enough to check a client's proof and
/// prove itself, not enough to log in as the user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScramCredential {
    pub salt: Vec<u8>,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
    pub iterations: u32,
}

/// `MetadataState::topics` in JSON as a plain map of topics: snapshots keep the format they
/// had before the topics were shared (serde's own `Arc` support would need its `rc` feature,
/// and a rebuild of every crate that uses serde, for these few lines).
mod shared_topics {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serializer};

    use super::TopicMetadata;

    pub(super) fn serialize<S: Serializer>(
        topics: &BTreeMap<String, Arc<TopicMetadata>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_map(topics.iter().map(|(name, topic)| (name, &**topic)))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<String, Arc<TopicMetadata>>, D::Error> {
        let topics = BTreeMap::<String, TopicMetadata>::deserialize(deserializer)?;
        Ok(topics.into_iter().map(|(name, topic)| (name, Arc::new(topic))).collect())
    }
}

/// A broker as the controller knows it: where clients reach it, and whether it may lead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRegistration {
    pub id: i32,
    /// A new one at every start of the process: a registration from an old process is stale.
    pub incarnation: Uuid,
    /// The advertised inter-broker Kafka listener (followers fetch from it; clients of a
    /// listener `listeners` does not name are told it).
    pub host: String,
    pub port: u16,
    /// Every Kafka client listener's advertised endpoint, by name: a client is told each
    /// broker's endpoint on the listener it came in on (Kafka's rule). Empty in registrations
    /// written before brokers had several.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<ListenerEndpoint>,
    /// The CONTROLLER listener, for the cluster's internal requests to this broker.
    pub internal: String,
    pub rack: Option<String>,
    /// The port of its RocketMQ listener (on `host`), for RocketMQ routes; 0 when it has none
    /// (and in registrations written before there was one).
    #[serde(default)]
    pub rocketmq_port: u16,
    /// A fenced broker leads nothing: it stopped heartbeating, or has not caught up with the
    /// metadata since it registered.
    pub fenced: bool,
}

/// One advertised Kafka listener of a broker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerEndpoint {
    pub name: String,
    pub host: String,
    pub port: u16,
}

impl BrokerRegistration {
    /// Where clients of listener `name` reach this broker: that listener's endpoint, or the
    /// inter-broker one if it has none of that name.
    pub fn endpoint(&self, name: &str) -> (&str, u16) {
        self.listeners
            .iter()
            .find(|l| l.name == name)
            .map_or((self.host.as_str(), self.port), |l| (l.host.as_str(), l.port))
    }
}

impl MetadataState {
    pub fn new() -> MetadataState {
        MetadataState { applied_offset: -1, ..Default::default() }
    }

    pub fn topic(&self, name: &str) -> Option<&TopicMetadata> {
        self.topics.get(name).map(|t| &**t)
    }

    pub fn topic_by_id(&self, id: Uuid) -> Option<&TopicMetadata> {
        self.topics.values().find(|t| t.id == id).map(|t| &**t)
    }

    /// True when some partition has no replicas assigned (a data directory written before
    /// replica assignments existed).
    pub fn has_unassigned_partitions(&self) -> bool {
        self.topics.values().any(|t| {
            t.assignments.len() != t.partitions.max(0) as usize || t.assignments.iter().any(|s| s.replicas.is_empty())
        })
    }

    /// Brings a state loaded from an old snapshot in line with this version's invariants: every
    /// topic has one (possibly unassigned) entry per partition.
    pub(crate) fn upgrade_loaded(&mut self) {
        for topic in self.topics.values_mut() {
            let topic = Arc::make_mut(topic);
            topic.assignments.resize(topic.partitions.max(0) as usize, PartitionState::unassigned());
        }
    }

    /// Checks the state's invariants; panics on the first one broken. Called after every apply
    /// in debug builds: a broken invariant is a bug in validation or in `apply`.
    pub fn check_invariants(&self) {
        for topic in self.topics.values() {
            assert_eq!(
                topic.assignments.len(),
                topic.partitions.max(0) as usize,
                "topic {}: one state per partition",
                topic.name
            );
            if let Some(layout) = &topic.elastic {
                assert_eq!(layout.stable_partitions, topic.partitions, "topic {}: stable partitions", topic.name);
                if let Err(broken) = layout.check() {
                    panic!("topic {}: {broken}", topic.name);
                }
            }
            for (index, state) in topic.assignments.iter().enumerate() {
                let at = || format!("{}-{index}", topic.name);
                let mut isr = state.isr.clone();
                isr.sort_unstable();
                isr.dedup();
                assert_eq!(isr.len(), state.isr.len(), "{}: duplicate in the ISR {:?}", at(), state.isr);
                assert!(
                    state.isr.iter().all(|b| state.replicas.contains(b)),
                    "{}: ISR {:?} not within replicas {:?}",
                    at(),
                    state.isr,
                    state.replicas
                );
                assert!(
                    state.leader == NO_LEADER || state.isr.contains(&state.leader),
                    "{}: leader {} not in the ISR {:?}",
                    at(),
                    state.leader,
                    state.isr
                );
                assert!(state.leader_epoch >= 0 && state.partition_epoch >= 0, "{}: negative epoch", at());
                assert!(
                    state.adding_replicas.iter().chain(&state.removing_replicas).all(|b| state.replicas.contains(b))
                        && !state.adding_replicas.iter().any(|b| state.removing_replicas.contains(b)),
                    "{}: adding {:?} and removing {:?} are no disjoint subsets of replicas {:?}",
                    at(),
                    state.adding_replicas,
                    state.removing_replicas,
                    state.replicas
                );
            }
        }
    }

    fn partition_mut(&mut self, topic: &str, id: Uuid, partition: i32) -> Option<&mut PartitionState> {
        let topic = self.topics.get_mut(topic).filter(|t| t.id == id)?;
        let index = usize::try_from(partition).ok().filter(|i| *i < topic.assignments.len())?;
        Arc::make_mut(topic).assignments.get_mut(index)
    }

    /// Applies the record at `offset`. A record that does not fit the state (which validation
    /// prevents) is skipped with a warning, so every replica skips it alike.
    pub fn apply(&mut self, offset: i64, record: &MetadataRecord) {
        self.apply_record(offset, record);
        if cfg!(debug_assertions) {
            self.check_invariants();
        }
    }

    fn apply_record(&mut self, offset: i64, record: &MetadataRecord) {
        self.applied_offset = offset;
        match record {
            MetadataRecord::InitCluster { cluster_id } => {
                if self.cluster_id.is_empty() {
                    self.cluster_id = cluster_id.clone();
                }
            }
            MetadataRecord::CreateTopic { name, id, partitions, configs, internal, assignments } => {
                if self.topics.contains_key(name) {
                    tracing::warn!(offset, topic = %name, "metadata: skipping create of an existing topic");
                    return;
                }
                let assignments = partition_states(*partitions, 0, assignments);
                let topic = TopicMetadata {
                    name: name.clone(),
                    id: *id,
                    partitions: *partitions,
                    configs: configs.clone(),
                    internal: *internal,
                    assignments,
                    elastic: None,
                };
                self.topics.insert(name.clone(), Arc::new(topic));
            }
            MetadataRecord::DeleteTopic { name, id } => {
                if self.topics.get(name).is_some_and(|t| t.id == *id) {
                    self.topics.remove(name);
                } else {
                    tracing::warn!(offset, topic = %name, "metadata: skipping delete of an unknown topic");
                }
            }
            MetadataRecord::CreatePartitions { name, id, partitions, assignments } => match self.topics.get_mut(name) {
                Some(topic) if topic.id == *id && *partitions >= topic.partitions && topic.elastic.is_none() => {
                    let topic = Arc::make_mut(topic);
                    let added = partition_states(*partitions, topic.partitions, assignments);
                    topic.assignments.extend(added);
                    topic.partitions = *partitions;
                }
                _ => tracing::warn!(offset, topic = %name, "metadata: skipping invalid partition increase"),
            },
            MetadataRecord::PartitionChange { .. } | MetadataRecord::PartitionReassignment { .. } => {
                self.apply_partition_record(offset, record)
            }
            MetadataRecord::RestoreLegacy { state } => {
                if !self.cluster_id.is_empty() || !self.topics.is_empty() {
                    tracing::warn!(offset, "metadata: skipping a legacy state restored over an existing one");
                    return;
                }
                let mut restored = (**state).clone();
                restored.upgrade_loaded();
                self.cluster_id = restored.cluster_id;
                self.topics = restored.topics;
                self.next_producer_id = self.next_producer_id.max(restored.next_producer_id);
            }
            MetadataRecord::AssignLegacyPartitions { broker } => {
                for topic in self.topics.values_mut() {
                    let topic = Arc::make_mut(topic);
                    topic.assignments.resize(topic.partitions.max(0) as usize, PartitionState::unassigned());
                    for state in topic.assignments.iter_mut().filter(|s| s.replicas.is_empty()) {
                        *state = PartitionState::new(vec![*broker]);
                    }
                }
            }
            MetadataRecord::SetElasticLayout { name, id, layout } => match self.topics.get_mut(name) {
                Some(topic)
                    if topic.id == *id && topic.partitions == layout.stable_partitions && layout.check().is_ok() =>
                {
                    Arc::make_mut(topic).elastic = Some(layout.clone())
                }
                _ => tracing::warn!(offset, topic = %name, "metadata: skipping an elastic layout that does not fit"),
            },
            MetadataRecord::SetTopicConfigs { name, id, configs } => match self.topics.get_mut(name) {
                Some(topic) if topic.id == *id => Arc::make_mut(topic).configs = configs.clone(),
                _ => tracing::warn!(offset, topic = %name, "metadata: skipping configs of an unknown topic"),
            },
            MetadataRecord::SetBrokerConfigs { resource, configs } => {
                if configs.is_empty() {
                    self.broker_configs.remove(resource);
                } else {
                    self.broker_configs.insert(resource.clone(), configs.clone());
                }
            }
            MetadataRecord::SetGroupConfigs { group, configs } => {
                if configs.is_empty() {
                    self.group_configs.remove(group);
                } else {
                    self.group_configs.insert(group.clone(), configs.clone());
                }
            }
            MetadataRecord::SetScramCredential { user, mechanism, credential } => {
                self.scram_credentials.entry(user.clone()).or_default().insert(*mechanism, credential.clone());
            }
            MetadataRecord::RemoveScramCredential { user, mechanism } => {
                if let Some(credentials) = self.scram_credentials.get_mut(user) {
                    credentials.remove(mechanism);
                    if credentials.is_empty() {
                        self.scram_credentials.remove(user);
                        // A user without credentials is gone: its RocketMQ secret with it.
                        self.access_secrets.remove(user);
                    }
                }
            }
            MetadataRecord::CreateAcl { binding } => {
                if !self.acls.contains(binding) {
                    Arc::make_mut(&mut self.acls).insert(binding.clone());
                }
            }
            MetadataRecord::RemoveAcl { binding } => {
                if self.acls.contains(binding) {
                    Arc::make_mut(&mut self.acls).remove(binding);
                }
            }
            MetadataRecord::SetAccessSecret { user, secret } => match secret {
                Some(secret) => {
                    self.access_secrets.insert(user.clone(), secret.clone());
                }
                None => {
                    self.access_secrets.remove(user);
                }
            },
            MetadataRecord::SetClientQuota { entity, key, value } => match value {
                Some(value) => {
                    self.client_quotas.entry(entity.clone()).or_default().insert(key.clone(), *value);
                }
                None => {
                    if let Some(values) = self.client_quotas.get_mut(entity) {
                        values.remove(key);
                        if values.is_empty() {
                            self.client_quotas.remove(entity);
                        }
                    }
                }
            },
            MetadataRecord::AllocateProducerIds { first, count } => {
                if *first >= self.next_producer_id && *count > 0 {
                    self.next_producer_id = first.saturating_add(*count);
                } else {
                    tracing::warn!(offset, first, "metadata: skipping an overlapping producer id block");
                }
            }
            MetadataRecord::RegisterBroker { registration } => {
                let mut registration = registration.clone();
                registration.fenced = true;
                self.brokers.insert(registration.id, registration);
            }
            MetadataRecord::FenceBroker { id } | MetadataRecord::UnfenceBroker { id } => {
                let fenced = matches!(record, MetadataRecord::FenceBroker { .. });
                match self.brokers.get_mut(id) {
                    Some(broker) => broker.fenced = fenced,
                    None => tracing::warn!(offset, broker = id, "metadata: skipping the fencing of an unknown broker"),
                }
            }
            MetadataRecord::UnregisterBroker { id } => {
                if self.brokers.remove(id).is_none() {
                    tracing::warn!(offset, broker = id, "metadata: skipping the unregistration of an unknown broker");
                }
            }
        }
    }

    /// A change of one partition's replicas, ISR or leader ([`MetadataRecord::PartitionChange`],
    /// [`MetadataRecord::PartitionReassignment`]): a new leader starts a new leader epoch, and
    /// every change a new partition epoch.
    fn apply_partition_record(&mut self, offset: i64, record: &MetadataRecord) {
        let (topic, id, partition) = match record {
            MetadataRecord::PartitionChange { topic, id, partition, .. }
            | MetadataRecord::PartitionReassignment { topic, id, partition, .. } => (topic, *id, *partition),
            _ => return,
        };
        let Some(state) = self.partition_mut(topic, id, partition) else {
            tracing::warn!(offset, topic = %topic, partition, "metadata: skipping a change of an unknown partition");
            return;
        };
        let leader = match record {
            MetadataRecord::PartitionChange { replicas, isr, leader, .. } => {
                if let Some(replicas) = replicas {
                    state.replicas = replicas.clone();
                }
                if let Some(isr) = isr {
                    state.isr = isr.clone();
                }
                *leader
            }
            MetadataRecord::PartitionReassignment { replicas, isr, leader, adding, removing, .. } => {
                state.replicas = replicas.clone();
                state.isr = isr.clone();
                state.adding_replicas = adding.clone();
                state.removing_replicas = removing.clone();
                Some(*leader)
            }
            _ => None,
        };
        if let Some(leader) = leader.filter(|leader| *leader != state.leader) {
            state.leader = leader;
            state.leader_epoch += 1;
        }
        state.partition_epoch += 1;
    }
}

/// The states of partitions `first..count` from their replica lists; partitions the record
/// assigns nothing to (old records) are unassigned.
fn partition_states(count: i32, first: i32, assignments: &[Vec<i32>]) -> Vec<PartitionState> {
    let mut replicas = assignments.iter();
    (first..count)
        .map(|_| match replicas.next() {
            Some(list) => PartitionState::new(list.clone()),
            None => PartitionState::unassigned(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(name: &str, partitions: i32) -> MetadataRecord {
        MetadataRecord::CreateTopic {
            name: name.into(),
            id: Uuid::new_v4(),
            partitions,
            configs: BTreeMap::new(),
            internal: false,
            assignments: vec![vec![1, 2]; partitions as usize],
        }
    }

    #[test]
    fn a_copy_shares_every_topic_a_change_did_not_touch() {
        let mut state = MetadataState::new();
        state.apply(0, &create("a", 2));
        state.apply(1, &create("b", 2));
        let before = state.clone();
        let b_id = state.topic("b").map(|t| t.id).unwrap_or_default();
        let change = MetadataRecord::PartitionChange {
            topic: "b".into(),
            id: b_id,
            partition: 1,
            replicas: None,
            isr: Some(vec![1]),
            leader: None,
        };
        state.apply(2, &change);
        state.apply(3, &create("c", 1));
        assert!(Arc::ptr_eq(&before.topics["a"], &state.topics["a"]), "untouched: shared");
        assert!(!Arc::ptr_eq(&before.topics["b"], &state.topics["b"]), "changed: a topic of its own");
        assert_eq!(before.topics["b"].assignments[1].isr, vec![1, 2], "the earlier copy did not change");
        assert_eq!(state.topics["b"].assignments[1].isr, vec![1]);
        // Snapshots keep their JSON: topics by name, each a plain object.
        let json = serde_json::to_value(&state).unwrap_or_default();
        assert_eq!(json["topics"]["a"]["partitions"], 2, "{json}");
        let back: MetadataState = serde_json::from_value(json).unwrap_or_default();
        assert_eq!(back, state);
    }

    #[test]
    fn apply_is_deterministic_and_skips_invalid_records() {
        let id = Uuid::new_v4();
        let records = [
            MetadataRecord::InitCluster { cluster_id: "c1".into() },
            MetadataRecord::CreateTopic {
                name: "t".into(),
                id,
                partitions: 2,
                configs: BTreeMap::new(),
                internal: false,
                assignments: vec![vec![1], vec![1]],
            },
            // shrink: skipped
            MetadataRecord::CreatePartitions { name: "t".into(), id, partitions: 1, assignments: vec![] },
            MetadataRecord::CreatePartitions {
                name: "t".into(),
                id,
                partitions: 4,
                assignments: vec![vec![1], vec![1]],
            },
            MetadataRecord::SetTopicConfigs {
                name: "t".into(),
                id,
                configs: [("retention.ms".to_string(), "10".to_string())].into(),
            },
            MetadataRecord::DeleteTopic { name: "t".into(), id: Uuid::new_v4() }, // wrong id: skipped
        ];
        let mut a = MetadataState::new();
        let mut b = MetadataState::new();
        for (i, r) in records.iter().enumerate() {
            a.apply(i as i64, r);
            b.apply(i as i64, r);
        }
        assert_eq!(a, b);
        let topic = a.topic("t").unwrap();
        assert_eq!(topic.partitions, 4);
        assert_eq!(topic.assignments.len(), 4);
        assert_eq!(topic.partition(3), Some(&PartitionState::new(vec![1])));
        assert_eq!(topic.configs.get("retention.ms").map(String::as_str), Some("10"));
        assert_eq!(a.applied_offset, 5);
        a.apply(6, &MetadataRecord::DeleteTopic { name: "t".into(), id });
        assert!(a.topic("t").is_none());
    }

    #[test]
    fn a_new_leader_bumps_the_leader_epoch_and_every_change_the_partition_epoch() {
        let id = Uuid::new_v4();
        let mut state = MetadataState::new();
        let create = MetadataRecord::CreateTopic {
            name: "t".into(),
            id,
            partitions: 1,
            configs: BTreeMap::new(),
            internal: false,
            assignments: vec![vec![1, 2, 3]],
        };
        state.apply(0, &create);
        let change = |isr: Option<Vec<i32>>, leader: Option<i32>| MetadataRecord::PartitionChange {
            topic: "t".into(),
            id,
            partition: 0,
            replicas: None,
            isr,
            leader,
        };
        let partition = |s: &MetadataState| s.topic("t").and_then(|t| t.partition(0)).cloned().unwrap();
        assert_eq!((partition(&state).leader, partition(&state).leader_epoch), (1, 0));
        state.apply(1, &change(Some(vec![1, 2]), None)); // the ISR shrinks: same leader
        assert_eq!((partition(&state).leader_epoch, partition(&state).partition_epoch), (0, 1));
        state.apply(2, &change(Some(vec![2]), Some(2))); // failover
        let now = partition(&state);
        assert_eq!((now.leader, now.leader_epoch, now.partition_epoch, now.isr), (2, 1, 2, vec![2]));
        state.apply(3, &change(None, Some(2))); // the same leader again: no new epoch
        assert_eq!(partition(&state).leader_epoch, 1);
        state.apply(4, &change(Some(vec![]), Some(NO_LEADER))); // offline
        assert_eq!((partition(&state).leader, partition(&state).leader_epoch), (NO_LEADER, 2));
    }

    #[test]
    fn partitions_of_old_records_are_assigned_to_the_single_broker_at_epoch_0() {
        // Records as Weir 0.1 wrote them: no assignments field.
        let old_create = r#"{"type":"create_topic","name":"t","id":"6d4f1b0e-8f43-4d8e-9a3b-0c2f5b8d9e11","partitions":2,"configs":{},"internal":false}"#;
        let old_grow =
            r#"{"type":"create_partitions","name":"t","id":"6d4f1b0e-8f43-4d8e-9a3b-0c2f5b8d9e11","partitions":3}"#;
        let mut state = MetadataState::new();
        state.apply(0, &serde_json::from_str(old_create).unwrap());
        state.apply(1, &serde_json::from_str(old_grow).unwrap());
        assert!(state.has_unassigned_partitions());
        assert_eq!(state.topic("t").unwrap().partition(2).unwrap().leader, NO_LEADER);
        state.apply(2, &MetadataRecord::AssignLegacyPartitions { broker: 7 });
        assert!(!state.has_unassigned_partitions());
        for index in 0..3 {
            assert_eq!(state.topic("t").unwrap().partition(index), Some(&PartitionState::new(vec![7])));
        }

        // A snapshot as Weir 0.1 wrote it: no assignments either.
        let old_snapshot = r#"{"cluster_id":"c","topics":{"u":{"name":"u","id":"6d4f1b0e-8f43-4d8e-9a3b-0c2f5b8d9e12","partitions":2,"configs":{},"internal":false}},"applied_offset":4,"next_producer_id":0}"#;
        let mut loaded: MetadataState = serde_json::from_str(old_snapshot).unwrap();
        loaded.upgrade_loaded();
        loaded.check_invariants();
        assert!(loaded.has_unassigned_partitions());
        loaded.apply(5, &MetadataRecord::AssignLegacyPartitions { broker: 0 });
        assert_eq!(loaded.topic("u").unwrap().partition(1).unwrap().isr, vec![0]);
    }

    #[test]
    fn group_configs_are_set_replaced_and_removed_and_old_snapshots_have_none() {
        let configs = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        let mut state = MetadataState::new();
        let set = |group: &str, c| MetadataRecord::SetGroupConfigs { group: group.into(), configs: c };
        state.apply(0, &set("g", configs(&[("consume.fifo", "true")])));
        state.apply(1, &set("g", configs(&[("max.delivery.attempts", "3")])));
        assert_eq!(state.group_configs.get("g"), Some(&configs(&[("max.delivery.attempts", "3")])));
        let round_trip: MetadataState = serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
        assert_eq!(round_trip, state);
        state.apply(2, &set("g", BTreeMap::new()));
        assert!(state.group_configs.is_empty());
        let old: MetadataState = serde_json::from_str(r#"{"cluster_id":"c","topics":{},"applied_offset":4}"#).unwrap();
        assert!(old.group_configs.is_empty());
    }
}
