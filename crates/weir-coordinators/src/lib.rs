//! Weir's coordinators: the state Kafka keeps beside the log, built on the data path's public
//! API only.
//!
//! - [`group`]: consumer groups (classic membership and rebalances, committed offsets, the
//!   clients of RocketMQ groups), stored in `__consumer_offsets`.
//! - [`txn`]: transactions (producer ids and epochs, the partitions and groups a transaction
//!   touched, markers), stored in `__transaction_state`.
//!
//! Each coordinator is sharded by the partitions of its internal topic ([`shards`]): a broker
//! coordinates the groups or transactions whose partition it leads, loads a shard from the log
//! when it becomes leader and drops it when it stops.
//!
//! Architecture invariant: nothing here parses or writes a wire protocol, and nothing here
//! knows the messaging engines (`weir-messaging`) or a front-end; they call these.
#![deny(unsafe_code)]
#![deny(clippy::unwrap_used)]

pub mod group;
mod metrics;
pub mod shards;
pub mod txn;

pub use group::GroupCoordinator;
pub use txn::TxnCoordinator;
