//! The part of the `weir` package that its benchmarks (in the binary, `src/main.rs`) and its
//! black-box tests (`tests/`) share.
//!
//! - [`kafka_client`] — a minimal blocking Kafka client on a plain `TcpStream`.
//!
//! **API boundary:** nothing else of the binary is here; the command line, the server and the
//! benchmarks stay in the binary. This library depends on no Weir crate.
#![forbid(unsafe_code)]

pub mod kafka_client;
