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
//! - [`renew`]: held messages kept invisible while their client lives;
//! - [`progress`]: each group's progress mirrored as Kafka committed offsets;
//! - [`reset`]: a group's position moved from outside;
//! - [`share`]: what Kafka share groups need beyond that (who holds a record, RENEW, positions);
//! - [`store`]: `PopStore`, every queue state and the journal that keeps them.
//!
//! The state of each (group, topic, partition) is a `QueueState`. It lives on the broker
//! leading the partition and is durable in a journal in the data directory ([`DIR`]): every
//! change appends what changed (the queue's position and the in-flight entries set or
//! removed) as one JSON line before the call is answered, so a line stays small however many
//! messages are out or waiting, and a `kill -9` loses nothing acknowledged (the page cache keeps the write; a power cut may
//! undo the last second's acks, which then come back as redeliveries, never as losses). When
//! the journal grows past `COMPACT_AFTER_BYTES`, the states are written to a snapshot and
//! the journal starts again. Start-up reads the snapshot, then the journal; a torn last line
//! (a crash mid-write) is ignored, which only redelivers.
//!
//! What is not kept: a partition whose leadership moves starts, on its new leader, from the
//! group's state there (none yet: the log start). Replicating the state is left for later.
//!
//! A group's position can be moved from outside, as RocketMQ's `resetOffsetByTime` and Kafka's
//! `kafka-consumer-groups.sh --reset-offsets` move it: [`reset`] does it where each partition
//! is led.

pub(crate) mod dead_letter;
pub mod engine;
pub mod filter;
pub mod progress;
pub mod receive;
pub mod renew;
pub mod reset;
pub mod share;
pub mod state;
pub mod store;

pub use engine::{HandleResult, PopEngine};
pub use filter::TagFilter;
pub use receive::{Delivery, ReceiveRequest};
pub use share::QueuePosition;
pub use state::HandleError;
pub(crate) use state::{Inflight, QueueState};
pub use store::*;
