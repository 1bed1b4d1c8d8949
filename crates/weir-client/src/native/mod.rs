//! Weir's native client: an async producer over the native write protocol (Swift's: each
//! session between a writer and a partition carries the partition's version V, its load
//! stamp S and its checkpoint C), and an async consumer.
//!
//! The producer is answered as soon as the broker holds a write in memory, and keeps each
//! message until the partition's checkpoint passes it. When the partition reloads (a broker
//! restart) or moves, the broker refuses the stale (V, S) and says how far the log holds this
//! writer's messages; the producer resends exactly the ones after that, in order. Nothing is
//! lost unless the producer and the broker die together, and no message is stored twice
//! (messages carry the sequence numbers of an idempotent producer id).
//!
//! It talks to the Kafka listener: Kafka's Metadata, InitProducerId, ListOffsets and Fetch,
//! plus SessionWrite ([`wire`]), Weir's own API there. `docs/native-protocol.md` describes the
//! protocol for other implementations.

mod connection;
pub mod consumer;
pub mod producer;
mod routes;
pub mod wire;

pub use consumer::{Consumer, ConsumerConfig, Received, StartAt};
pub use producer::{stable_partition, Checkpoint, Message, Producer, ProducerConfig, ProducerStats};
