//! Transactional (half) messages: the store that keeps them until their transaction is decided
//! ([`store`]), and prepare, end and the check-back sweep ([`transactions`]).

pub mod store;
pub mod transactions;

pub use store::*;
pub use transactions::{CheckSent, EndError, TransactionChecker, TransactionalMessages};
