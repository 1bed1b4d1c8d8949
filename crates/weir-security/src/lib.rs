//! Weir's security mechanisms, free of any protocol: each front-end (Kafka, RocketMQ, the
//! admin API) frames them its own way and maps their failures to its own codes.
//!
//! - [`tls`]: a listener's TLS (rustls), configured with Kafka's `ssl.*` settings (PEM), its
//!   certificates reloaded when their files change.
//! - [`scram`]: SASL/SCRAM-SHA-256 and -512 (RFC 5802, 7677) on the server's side, and the
//!   salted credentials stored in the metadata log; SASL/PLAIN's message, checked against the
//!   same credentials.
//! - [`attempts`]: failed authentications per address, limited per minute.
//! - [`acl`]: the authorizer, Kafka's ACL semantics over the ACLs of the metadata log.
//! - [`access_key`]: RocketMQ's access keys, the `MQv2-HMAC-SHA1` signatures of its clients.
//! - [`principal`]: the principal of a mutual-TLS client, from its certificate's subject and
//!   `ssl.principal.mapping.rules`.
#![deny(unsafe_code)]
#![deny(clippy::unwrap_used)]

pub mod access_key;
pub mod acl;
pub mod attempts;
pub mod principal;
pub mod scram;
pub mod tls;

pub use weir_metadata::{ScramCredential, ScramMechanism};
