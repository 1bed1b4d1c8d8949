//! The part of the `weir` package that its benchmarks (in the binary, `src/main.rs`) and its
//! black-box tests (`tests/`) share: how to talk to a running broker, and how to start one.
//!
//! - [`kafka_client`] — a minimal blocking Kafka client on a plain `TcpStream`.
//! - [`address_lines`] — the lines `weir server` prints once it serves, and starting a
//!   `weir server` child process that waits for them.
//!
//! **API boundary:** nothing else of the binary is here; the command line, the server and the
//! benchmarks stay in the binary. This library depends on no Weir crate.
#![forbid(unsafe_code)]

pub mod address_lines;
pub mod kafka_client;
