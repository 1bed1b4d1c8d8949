//! Invisible-time consumption (RocketMQ's POP, what its SimpleConsumer and 5.x PushConsumer
//! use, and Kafka share groups' acquisition locks, KIP-932): a receive hands out messages that stay invisible to the
//! group for a while; an ack makes them done, and one not acked in time is delivered again, one
//! attempt higher, until the group's `max.delivery.attempts` sends it to the dead letters.
//!
//! - [`engine`]: [`PopEngine`], what front-ends call (receive, ack, change of invisible time,
//!   giving up) and the tasks it starts;
//! - [`receive`]: which messages a receive picks, with long polling; [`filter`]: by tag;
//! - [`state`]: one queue's state for one group (`QueueState`, FIFO parking included);
//! - `dead_letter`: exhausted messages to the dead letters, on receive and every second;
//! - `adopt`: a new leader of a partition takes over all of its queues' states at once;
//! - [`renew`]: held messages kept invisible while their client lives;
//! - [`progress`]: each group's progress mirrored as Kafka committed offsets;
//! - [`reset`]: a group's position moved from outside;
//! - [`share`]: what Kafka share groups need beyond that (who holds a record, RENEW, positions);
//! - [`store`]: `PopStore`, the states of the queues this broker leads, loaded from and
//!   written through to their shards; [`shard`]: the shards of `__share_group_state` this
//!   broker leads; [`lines`]: what is written there; `migrate`: the move of an earlier
//!   version's local store.
//!
//! The state of each (group, topic, partition) is a `QueueState`. The engine runs on the
//! broker leading the partition, and the state is durable in the replicated internal topic
//! `__share_group_state` (Kafka's name for share groups' state; `messaging.state.topic.*`
//! settings): every change is written there, as what changed (the queue's position and the
//! in-flight entries set or removed), before the call is answered, so the loss of a broker
//! loses no ack, no delivery count and no invisible time it answered for (as durably as the
//! flush policy promises). A new leader of the partition loads the state from its shard and
//! carries on; the load fences the old leader's engine (by leader epoch), so a deposed leader
//! cannot write over its successor.
//!
//! A group's position can be moved from outside, as RocketMQ's `resetOffsetByTime` and Kafka's
//! `kafka-consumer-groups.sh --reset-offsets` move it: [`reset`] does it where each partition
//! is led.

pub(crate) mod adopt;
pub(crate) mod dead_letter;
pub mod engine;
pub mod filter;
pub(crate) mod lines;
pub(crate) mod migrate;
pub mod progress;
pub mod receive;
pub mod renew;
pub mod reset;
pub(crate) mod service;
pub(crate) mod shard;
pub mod share;
pub mod state;
pub mod store;

pub use engine::{HandleResult, PopEngine};
pub use filter::TagFilter;
pub use receive::{BatchDelivery, BatchOffsets, Delivery, ReceiveRequest, Received};
pub use share::{QueuePosition, QueueStanding};
pub use state::HandleError;
pub(crate) use state::{Inflight, QueueState};
pub use store::*;
