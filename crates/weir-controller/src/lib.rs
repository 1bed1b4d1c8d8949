//! The controller's decisions: what the cluster's metadata becomes when someone asks for a
//! change, as functions of the metadata (and, for brokers' liveness, of the sessions the active
//! controller keeps).
//!
//! A decision reads a [`MetadataState`] and answers a [`Decision`]: the records to commit as one
//! metadata entry, and what the requester is told. It commits nothing itself. The node that is
//! the active controller (`weir_broker::cluster::control`) runs one decision at a time under its
//! controller lock, proposes the records to the metadata quorum, applies them, and answers; a
//! decision that needs several entries (one per topic of a CreateTopics) is run once per entry
//! against the state the previous one left. So every decision here can be tested, and one day
//! driven by a deterministic simulation, without a network, a disk or a broker.
//!
//! Code map:
//! - [`request`]: what can be asked of the controller ([`ControlRequest`]) and its answers;
//! - [`topics`]: topics, partitions and topic configs; [`elastic`]: elastic topics' creation,
//!   splits and merges; [`balance`]: moving elastic topics' physical partitions by measured load; [`placement`]: where replicas go;
//!   [`capacity`]: how many replicas a broker can hold open, and the refusal past it;
//! - [`brokers`]: registrations, heartbeats, sessions, fencing and the leader changes they
//!   imply;
//! - [`isr`]: a leader's ISR proposals (AlterPartition);
//! - [`election`]: preferred and unclean elections, and the leader balance;
//! - [`reassignment`]: moving partitions between brokers; [`reassignment_plan`]: plans for
//!   moving replicas off brokers or balancing them (proposals only);
//! - [`topic_config`], [`group_config`], [`throttle`]: what each kind of config means, how a
//!   change is checked and decided;
//! - [`producer_ids`]: blocks of producer ids;
//! - [`users`]: users' SCRAM credentials.
//!
//! Randomness (topic ids, a placement's first broker, a cluster id) comes from an [`Entropy`]
//! the caller gives, so a test can fix it.
//!
//! Architecture invariant: nothing here does I/O (but log), takes a lock, waits or reads a
//! clock; time comes in as an argument. API boundary: the modules above; `weir-broker` re-exports
//! `placement`, `topic_config`, `group_config` and `throttle` where its callers found them.
#![deny(unsafe_code)]
#![deny(clippy::unwrap_used)]

pub mod acls;
pub mod balance;
pub mod brokers;
pub mod capacity;
pub mod elastic;
pub mod election;
pub mod group_config;
pub mod isr;
pub mod placement;
pub mod producer_ids;
pub mod quotas;
pub mod reassignment;
pub mod reassignment_plan;
pub mod request;
pub mod throttle;
pub mod topic_config;
pub mod topics;
pub mod users;

use std::collections::BTreeMap;

use uuid::Uuid;
use weir_metadata::MetadataRecord;

pub use request::{ControlAnswer, ControlRequest, HeartbeatAnswer};

/// What a decision commits and answers.
#[derive(Debug, Clone, PartialEq)]
#[must_use = "a decision's records must be committed before its answer is given"]
pub struct Decision<T> {
    /// The records to commit together as one metadata entry; empty when nothing changes.
    pub records: Vec<MetadataRecord>,
    /// What the requester is told once the records are committed.
    pub answer: T,
}

impl<T> Decision<T> {
    /// A decision that changes nothing.
    pub fn nothing(answer: T) -> Decision<T> {
        Decision { records: Vec::new(), answer }
    }
}

/// The settings the controller decides with (the broker's, by Kafka's names).
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// `num.partitions`: partitions of a topic created without a count.
    pub num_partitions: i32,
    /// `default.replication.factor`.
    pub default_replication_factor: i16,
    /// `max.partitions.per.topic`.
    pub max_partitions_per_topic: i32,
    /// `delete.topic.enable`.
    pub delete_topic_enable: bool,
    /// `offsets.topic.replication.factor`.
    pub offsets_topic_replication_factor: i16,
    /// `transaction.state.log.replication.factor`.
    pub transaction_state_replication_factor: i16,
    /// `messaging.state.topic.replication.factor`: the messaging layer's internal topics'.
    pub messaging_state_replication_factor: i16,
    /// The broker-wide defaults of topic configs, by topic config name.
    pub topic_defaults: BTreeMap<String, String>,
    /// How many partition replicas a broker can hold open (`None`: no limit known); creations
    /// past it are refused (see [`capacity`]).
    pub replica_capacity: Option<capacity::ReplicaCapacity>,
}

/// Where a decision's randomness comes from.
pub trait Entropy {
    /// A new topic id.
    fn topic_id(&mut self) -> Uuid;
    /// A number below `n` (0 when `n` is 0): where placement starts among `n` brokers, so
    /// that topics created one after another do not all lead on the same broker.
    fn below(&mut self, n: usize) -> usize;
}

/// Randomness from the operating system (a version-4 UUID's bits).
#[derive(Debug, Default, Clone, Copy)]
pub struct RandomEntropy;

impl Entropy for RandomEntropy {
    fn topic_id(&mut self) -> Uuid {
        Uuid::new_v4()
    }

    fn below(&mut self, n: usize) -> usize {
        (Uuid::new_v4().as_u128() % n.max(1) as u128) as usize
    }
}

/// A new cluster id: 22 characters of the URL-safe base64 alphabet, as Kafka's are.
pub fn new_cluster_id() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bits = Uuid::new_v4().as_u128();
    (0..22).map(|i| ALPHABET[((bits >> (i * 6)) & 63) as usize] as char).collect()
}

/// The `unclean.leader.election.enable` of a topic with these configs, on a cluster with
/// these topic defaults.
pub(crate) fn unclean_allowed(config: &ControllerConfig, topic: &weir_metadata::TopicMetadata) -> bool {
    topic_config::unclean_leader_election(&config.topic_defaults, &topic.configs)
}
