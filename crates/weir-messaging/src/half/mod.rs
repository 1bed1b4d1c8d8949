//! Transactional (half) messages: the shards that keep them until their transaction is decided
//! ([`store`], in the replicated internal topic `__half_messages`), prepare, end and the
//! check-back sweep ([`transactions`]), the internal RPCs that reach a shard's leader
//! (`service`) and the move of an earlier version's local store ([`migrate`]).

pub mod migrate;
mod service;
pub mod store;
pub mod transactions;

pub use store::{Decision, HalfShard, Pending};
pub use transactions::{CheckSent, EndError, TransactionChecker, TransactionalMessages};

/// The topic of the half messages.
pub const TOPIC: &str = weir_broker::metadata::HALF_MESSAGES_TOPIC;

/// Serves the RPCs of the half messages on this broker.
pub(crate) fn register(
    broker: &std::sync::Arc<weir_broker::Broker>,
    transactions: &std::sync::Arc<TransactionalMessages>,
) {
    service::register(broker, transactions);
}
