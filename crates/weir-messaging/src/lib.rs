//! Weir's messaging layer: what RocketMQ's features need beyond a partitioned log, built on the
//! data path (`weir-broker`) and the coordinators (`weir-coordinators`), protocol-neutral so
//! that Kafka share groups can use it too.
//!
//! - [`Messaging`]: the stores, open for as long as the broker is, each in its own directory
//!   under the data directory (the same files as before they moved here): delayed messages
//!   (`__delayed_messages`, [`timer`]), half messages (`__half_messages`, [`half`]),
//!   invisible-time state (`__share_group_state`, [`pop`]) and the message index ([`message_index`], `message-index/`). Opening it
//!   installs the timer in the data path's append (a DELAY topic's records that are not due
//!   go there) and serves the internal RPCs other brokers call (`timer.*`, `half.*`, `pop.*`).
//! - [`Engines`]: what runs on its own for a protocol that needs it (the binary starts them
//!   with the RocketMQ listener): invisible-time consumption ([`pop::PopEngine`]: receives,
//!   the dead-letter sweep, the renewer, the progress mirror) and transactional messages
//!   ([`half::TransactionalMessages`]: the check-back sweep). Delayed messages fire and
//!   messages are indexed whether or not these run.
//!
//! Architecture invariant: built on the public API of the crates below; nothing here parses
//! or writes a wire protocol, and no front-end is known here. A front-end reaches a client (a
//! transaction check) only through a trait it implements.
#![deny(unsafe_code)]
#![deny(clippy::unwrap_used)]

pub mod dead_letter;
pub mod half;
pub mod message_index;
mod metrics;
pub mod pop;
mod state_topic;
#[cfg(test)]
mod testing;
pub mod timer;

use std::sync::Arc;

use weir_broker::{Broker, BrokerError};
use weir_coordinators::group::GroupCoordinator;

use crate::half::TransactionalMessages;
use crate::message_index::MessageIndex;
use crate::pop::{PopEngine, PopStore};
use crate::timer::Timer;

/// The messaging stores of one broker.
pub struct Messaging {
    pub(crate) broker: Arc<Broker>,
    /// Delayed messages until they are due, in `__delayed_messages`; the shards this broker
    /// leads load and fire once [`Messaging::start`] is called.
    pub timer: Arc<Timer>,
    /// RocketMQ transactional messages until decided, in `__half_messages`; the shards this
    /// broker leads load and are swept once [`Messaging::start`] is called.
    pub(crate) half: Arc<TransactionalMessages>,
    /// Each group's invisible-time consumption of the partitions this broker leads.
    pub(crate) pop: Arc<PopStore>,
    /// The shards of `__share_group_state` this broker leads (whoever's engines use them).
    pub(crate) pop_states: Arc<pop::shard::StateShards>,
    /// Messages by key and id, for queries; kept up to date once [`Messaging::start`] is called.
    pub(crate) message_index: MessageIndex,
}

impl Messaging {
    /// Opens the stores in the broker's data directory, puts the timer in the append path and
    /// serves the internal RPCs of the stores. Blocking (recovers the stores' files).
    pub fn open(broker: &Arc<Broker>) -> Result<Arc<Messaging>, BrokerError> {
        let data_dir = &broker.config.data_dir;
        let pop_states = Arc::new(pop::shard::StateShards::new(broker));
        let messaging = Arc::new(Messaging {
            broker: broker.clone(),
            timer: Arc::new(Timer::new(broker)),
            half: Arc::new(TransactionalMessages::new(broker)),
            pop: Arc::new(PopStore::new(broker, &pop_states, data_dir)),
            pop_states,
            message_index: MessageIndex::new(data_dir),
        });
        broker
            .set_delayed_records(Arc::new(timer::Diversion { timer: messaging.timer.clone(), clock: broker.clock() }));
        timer::register(broker, &messaging.timer);
        half::register(broker, &messaging.half);
        pop::reset::register(&messaging);
        Ok(messaging)
    }

    /// Starts the message indexer, the timer's shards (delayed messages that came due while
    /// their shard had no leader fire now), the invisible-time state's shards and the half
    /// messages' shards with their sweep
    /// (transactions are checked through the checkers front-ends register, here or on other
    /// brokers), and moves the local stores of an earlier version into their topics. Call
    /// within a tokio runtime, once.
    pub fn start(self: &Arc<Self>) -> std::io::Result<()> {
        MessageIndex::start(self)?;
        self.timer.start(&self.broker);
        timer::migrate::spawn(&self.broker, &self.timer);
        self.half.start(&self.broker);
        half::migrate::spawn(&self.broker, &self.half);
        self.pop_states.start(&self.broker);
        pop::migrate::spawn(&self.broker, &self.pop, &self.pop_states);
        Ok(())
    }

    /// The broker these stores belong to.
    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }
}

/// The running messaging engines; front-ends call them.
#[derive(Clone)]
pub struct Engines {
    pub pop: Arc<PopEngine>,
    pub transactions: Arc<TransactionalMessages>,
}

impl Engines {
    /// Starts the engines' tasks; they end when the broker shuts down. Call within a tokio
    /// runtime, once per broker.
    pub fn start(messaging: &Arc<Messaging>, groups: &Arc<GroupCoordinator>) -> Engines {
        Engines { pop: PopEngine::start(messaging, groups), transactions: messaging.half.clone() }
    }
}
