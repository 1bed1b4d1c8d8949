//! What can be asked of the active controller, and what it answers. Requests cross the
//! cluster's internal RPC (a node forwards its clients' changes to the controller), so both are
//! serializable.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;
use weir_error::BrokerError;
use weir_metadata::{BrokerRegistration, TopicMetadata};

use crate::topic_config::ConfigEdit;
use crate::topics::{CreatedTopic, NewTopic};

/// A metadata change, or a broker's registration or heartbeat, for the active controller.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ControlRequest {
    CreateTopics {
        topics: Vec<NewTopic>,
        validate_only: bool,
    },
    /// Creates an elastic topic of `topic.partitions` physical partitions over
    /// `stable_partitions` stable ones (`None`: the default).
    CreateElasticTopic {
        topic: NewTopic,
        stable_partitions: Option<i32>,
        validate_only: bool,
    },
    /// Splits physical partition `partition` of elastic topic `topic` in two.
    SplitPhysical {
        topic: String,
        partition: i32,
    },
    /// Merges two adjacent physical partitions of elastic topic `topic`.
    MergePhysical {
        topic: String,
        partitions: (i32, i32),
    },
    DeleteTopic {
        name: Option<String>,
        id: Option<Uuid>,
    },
    CreatePartitions {
        name: String,
        count: i32,
        assignments: Option<Vec<Vec<i32>>>,
        validate_only: bool,
    },
    AlterTopicConfigs {
        name: String,
        validate_only: bool,
        edit: ConfigEdit,
    },
    /// Creates an internal topic unless it exists; answers its metadata either way.
    EnsureInternalTopic {
        name: String,
        partitions: i32,
        configs: BTreeMap<String, String>,
    },
    /// Reserves a block of producer ids for the asking broker.
    AllocateProducerIds,
    RegisterBroker {
        registration: BrokerRegistration,
    },
    Heartbeat {
        id: i32,
        incarnation: Uuid,
        /// The metadata offset the broker has applied (and reconciled its partitions with).
        applied_offset: i64,
        /// The broker is shutting down: fence it now rather than at its session timeout.
        shutting_down: bool,
        /// What the broker's partitions carry, and its CPU and disk use (absent from brokers
        /// older than the report).
        #[serde(default)]
        load: Option<crate::balance::LoadReport>,
    },
    /// The brokers' loads and the balancer's next move (`weir cluster balance`).
    DescribeBalance,
    /// A partition leader's proposed ISR (Kafka's AlterPartition).
    AlterPartition {
        proposal: crate::isr::IsrProposal,
    },
    /// Elect leaders (Kafka's ElectLeaders) for these partitions, or all of them.
    ElectLeaders {
        kind: crate::election::ElectionType,
        partitions: Option<Vec<(String, i32)>>,
    },
    /// Change dynamic broker configs (`""`: every broker; else a broker id).
    AlterBrokerConfigs {
        resource: String,
        validate_only: bool,
        edit: ConfigEdit,
    },
    /// Change a consumer group's settings; `create` refuses a group that has some already.
    AlterGroupConfigs {
        group: String,
        create: bool,
        validate_only: bool,
        edit: ConfigEdit,
    },
    /// Start, replace or cancel partition reassignments (Kafka's AlterPartitionReassignments).
    AlterReassignments {
        targets: Vec<crate::reassignment::ReassignmentTarget>,
        allow_replication_factor_change: bool,
    },
    /// Remove a stopped broker that holds no replica (Kafka's UnregisterBroker).
    UnregisterBroker {
        id: i32,
    },
    /// Set or remove users' SCRAM credentials (Kafka's AlterUserScramCredentials).
    AlterScramCredentials {
        changes: Vec<crate::users::ScramChange>,
    },
    /// Add ACLs (Kafka's CreateAcls).
    CreateAcls {
        bindings: Vec<weir_metadata::acl::AclBinding>,
    },
    /// Remove the ACLs the filters match (Kafka's DeleteAcls).
    DeleteAcls {
        filters: Vec<weir_metadata::acl::AclFilter>,
    },
    /// Set or remove a user's RocketMQ secret key.
    SetAccessSecret {
        user: String,
        secret: Option<String>,
    },
    /// Set or remove client quotas (Kafka's AlterClientQuotas).
    AlterClientQuotas {
        alterations: Vec<crate::quotas::QuotaAlteration>,
        validate_only: bool,
    },
}

impl ControlRequest {
    /// What the request does, for messages ("cannot create topics: ...").
    pub fn name(&self) -> &'static str {
        match self {
            ControlRequest::CreateTopics { .. } => "create topics",
            ControlRequest::CreateElasticTopic { .. } => "create an elastic topic",
            ControlRequest::SplitPhysical { .. } => "split a physical partition",
            ControlRequest::MergePhysical { .. } => "merge physical partitions",
            ControlRequest::DeleteTopic { .. } => "delete topic",
            ControlRequest::CreatePartitions { .. } => "create partitions",
            ControlRequest::AlterTopicConfigs { .. } => "alter topic configs",
            ControlRequest::EnsureInternalTopic { .. } => "create an internal topic",
            ControlRequest::AllocateProducerIds => "allocate producer ids",
            ControlRequest::RegisterBroker { .. } => "register broker",
            ControlRequest::Heartbeat { .. } => "heartbeat",
            ControlRequest::AlterPartition { .. } => "change an ISR",
            ControlRequest::ElectLeaders { .. } => "elect leaders",
            ControlRequest::AlterReassignments { .. } => "reassign partitions",
            ControlRequest::AlterBrokerConfigs { .. } => "alter broker configs",
            ControlRequest::AlterGroupConfigs { .. } => "alter group configs",
            ControlRequest::UnregisterBroker { .. } => "unregister a broker",
            ControlRequest::DescribeBalance => "describe the load balance",
            ControlRequest::AlterScramCredentials { .. } => "alter SCRAM credentials",
            ControlRequest::CreateAcls { .. } => "create ACLs",
            ControlRequest::DeleteAcls { .. } => "delete ACLs",
            ControlRequest::AlterClientQuotas { .. } => "alter client quotas",
            ControlRequest::SetAccessSecret { .. } => "set a RocketMQ secret key",
        }
    }
}

/// What the controller answers a [`ControlRequest`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ControlAnswer {
    /// Per topic, in request order.
    CreatedTopics(Vec<Result<CreatedTopic, BrokerError>>),
    Topic(TopicMetadata),
    Done,
    ProducerIds {
        first: i64,
        count: i64,
    },
    Heartbeat(HeartbeatAnswer),
    Elected(Vec<crate::election::ElectionResult>),
    Reassigned(Vec<crate::reassignment::ReassignmentResult>),
    Elastic(crate::elastic::ElasticChange),
    Balance(crate::balance::BalanceReport),
    /// One outcome per item of the request, in its order.
    Each(Vec<Result<(), BrokerError>>),
    /// Per filter of a DeleteAcls, in its order: the ACLs it matched, now removed.
    DeletedAcls(Vec<Vec<weir_metadata::acl::AclBinding>>),
}

/// The controller's answer to a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatAnswer {
    /// The controller does not know this process (a new controller, or a registration lost):
    /// register again.
    pub must_register: bool,
    /// The broker may not lead: it has not caught up yet, or it is shutting down.
    pub fenced: bool,
}
