//! The invisible-time engine: what a receive delivers and how ([`receive`], [`filter`]), the
//! calls a front-end makes ([`engine`]), and the tasks that keep it moving: dead letters
//! ([`dead_letter`]), renewals ([`renew`]) and the progress mirror ([`progress`]). Its state
//! (in-flight messages, positions, their files) is [`weir_broker::pop`].

pub mod dead_letter;
pub mod engine;
pub mod filter;
pub mod progress;
pub mod receive;
pub mod renew;

pub use engine::{HandleResult, PopEngine};
pub use filter::TagFilter;
pub use receive::{Delivery, ReceiveRequest};
