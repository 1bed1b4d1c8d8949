//! The messaging engines that run on their own, started together by whoever serves a protocol
//! that needs them (the binary, with the RocketMQ listener; later Kafka share groups):
//! invisible-time consumption ([`crate::pop::PopEngine`]: receives, the dead-letter sweep, the
//! renewer, the progress mirror) and transactional messages
//! ([`crate::half::TransactionalMessages`]: the check-back sweep).
//!
//! The stores under them are still the broker's and open with it ([`Broker::pop`],
//! [`Broker::half`]); the timer fires delayed messages once
//! [`weir_broker::timer::TimerStore::start`] is called, whether or not these run.
//!
//! Architecture invariant: built on the data path's and the coordinators' public API only;
//! nothing here parses or writes a wire protocol, and no front-end is known here.
#![deny(unsafe_code)]
#![deny(clippy::unwrap_used)]

pub mod dead_letter;
pub mod half;
pub mod pop;

use std::sync::Arc;

use crate::half::TransactionalMessages;
use crate::pop::PopEngine;
use weir_broker::Broker;
use weir_coordinators::group::GroupCoordinator;

/// The running messaging engines; front-ends call them.
#[derive(Clone)]
pub struct Messaging {
    pub pop: Arc<PopEngine>,
    pub transactions: Arc<TransactionalMessages>,
}

impl Messaging {
    /// Starts the engines' tasks; they end when the broker shuts down. Call within a tokio
    /// runtime, once per broker.
    pub fn start(broker: &Arc<Broker>, groups: &Arc<GroupCoordinator>) -> Messaging {
        Messaging { pop: PopEngine::start(broker, groups), transactions: TransactionalMessages::start(broker) }
    }
}
