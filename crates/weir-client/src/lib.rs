//! Weir's clients, over the Kafka listener:
//! - [`native`]: an async producer and consumer. The producer speaks Weir's native write
//!   protocol: it is answered once a broker holds its messages in memory, keeps each message
//!   until the partition's checkpoint says it is persisted, and resends exactly what a broker
//!   lost when the partition reloads or moves.
//! - A small blocking Kafka client for tools, below: the `weir` CLI with `--bootstrap` speaks
//!   to a cluster through it when only the Kafka port is open.
//!
//! - [`connection`]: one TCP connection to one broker; its API versions are asked once
//!   (ApiVersions) and every request goes out at the highest version both sides know.
//! - [`cluster`]: the brokers a bootstrap list leads to, a connection per broker made when first
//!   needed, partition leaders from Metadata and group coordinators from FindCoordinator.
//! - [`error`]: what failed, telling a broker that cannot be reached from one that answered
//!   with a Kafka error code.
//!
//! It knows the Kafka wire format and nothing of Weir's crates (records are bytes here: the
//! caller encodes and decodes batches), so both the CLI and test tools can use it. It has no
//! thread, no buffer and no retry of its own beyond finding a coordinator that is loading:
//! a tool's one request at a time needs none.
//!
//! **API boundary:** `Cluster`, `BrokerConnection`, `ClientError` and the frame codec in
//! [`wire`].

pub mod cluster;
pub mod connection;
pub mod error;
pub mod native;
pub mod wire;

pub use cluster::Cluster;
pub use connection::BrokerConnection;
pub use error::ClientError;
