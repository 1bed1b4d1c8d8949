//! Weir's broker core: topics and partitions over the storage engine, the metadata state
//! machine, consumer groups and long-poll waits.
//!
//! Architecture invariant: nothing here parses or writes a wire protocol. Front-ends (the Kafka
//! protocol in `weir-kafka`, later RocketMQ and the admin HTTP API) decode requests, call these
//! plain Rust operations and encode the answers. Failures are [`BrokerError`]s of an
//! [`ErrorKind`] in Weir's terms; each front-end maps the kinds to its protocol's codes once.
#![deny(unsafe_code)]
#![deny(clippy::unwrap_used)]

/// Placement by measured load (the controller's, `weir-controller`).
pub use weir_controller::balance;
mod acls;
pub mod broker;
mod broker_configs;
mod capacity;
pub mod cluster;
pub mod config;
pub mod delayed;
pub mod elastic;
/// Weir's error vocabulary (the `weir-error` crate), where the core's callers have always found it.
pub use weir_error as error;
pub mod fetch;
mod followed;
pub mod follower;
pub mod forward;
pub mod group_config;
mod isr;
pub use weir_storage::internal_records;
pub mod memory;
pub mod message;
/// The cluster metadata and its quorum (the `weir-metadata` crate).
pub use weir_metadata as metadata;
pub mod metrics;
mod open;
pub mod partition;
pub mod partitioner;
pub mod quotas;
/// Where replicas go (the controller's, `weir-controller`).
pub use weir_controller::placement;
pub mod replication;

pub mod runtime;
pub mod session;
pub mod throttle;
pub mod tier;
mod topics;
pub mod users;
pub mod watch;
/// What topic configs mean and how they are checked (the controller's, `weir-controller`).
pub use weir_controller::topic_config;

pub use broker::{
    Acks, Broker, CreatedTopic, NewTopic, NodeStatus, OffsetAnswer, OffsetQuery, PartitionSize, PendingAppends,
    StoredBatch,
};
pub use config::{BrokerConfig, ConfigError};
pub use error::{BrokerError, ErrorKind, RecordError};
pub use partition::Partition;
/// The storage engine, for the types front-ends meet in the core's API (records, file slices).
pub use weir_storage as storage;
