//! A small blocking Kafka client for tools: the `weir` CLI with `--bootstrap` speaks to a
//! cluster through it when only the Kafka port is open.
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
pub mod wire;

pub use cluster::Cluster;
pub use connection::BrokerConnection;
pub use error::ClientError;
