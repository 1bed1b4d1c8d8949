//! Transactional messages over the broker's half-message store ([`weir_broker::half`]): prepare,
//! end, and the check-back sweep.

pub mod transactions;

pub use transactions::{CheckSent, EndError, TransactionChecker, TransactionalMessages};
