//! Weir's Kafka front-end: a tokio TCP server speaking the Kafka wire protocol, with message
//! schemas from the `kafka-protocol` crate. It is a thin adapter: decode a request, call the
//! broker core (`weir-broker`), encode the response.
//!
//! Layout: `server` accepts, `connection` reads frames ahead (through TLS where the listener
//! has it) and writes responses in order, `sasl` authenticates a connection before its other
//! requests, `dispatch` routes a frame to its handler in `handlers`, [`zero_copy`] sends fetched
//! record data with `sendfile`. [`versions`] is the single list of supported APIs.
#![deny(unsafe_code)]
#![deny(clippy::unwrap_used)]

mod connection;
mod context;
mod dispatch;
pub mod errors;
mod fetch_session;
pub mod frame;
mod handlers;
mod quota;
pub mod replica_fetcher;
mod sasl;
mod server;
mod share_session;
mod share_versions;
pub mod versions;
pub mod zero_copy;

pub use context::Ctx;
pub use server::serve;
