//! Weir's internal RPC transport: what cluster nodes say to each other (Raft messages, broker
//! registration and heartbeats, admin requests forwarded to the controller), as named methods
//! with byte bodies over TCP, optionally in TLS (rustls).
//!
//! **Owns:** framing, connections, concurrency limits, timeouts and how each failure is told.
//! **Knows nothing of:** Raft, brokers or any Weir type; it depends on no Weir crate. Methods
//! are strings and bodies bytes (JSON through [`RpcClient::call_json`], [`decode_json`] and
//! [`encode_json`]); what a method means is its caller's and its handler's business.
//!
//! # Wire format (version 1)
//! One message is one frame, big-endian (details and the reasons in `frame.rs`):
//!
//! ```text
//! u32 length | u8 version = 1 | u8 kind (0 request, 1 response, 2 error) | u64 correlation id
//!            | u16 method length | method (UTF-8; requests only) | body
//! ```
//!
//! `length` counts everything after itself and is at most the receiver's `max_frame_bytes`
//! (16 MiB by default). The header after it is always 12 bytes; a response or an error has a
//! method length of 0. An error frame's body is a one-byte code and a UTF-8 message of at most
//! `MAX_ERROR_MESSAGE_BYTES`: 0x01 the handler failed, 0x02 the response is over the
//! server's limit; and, with the high bit that says the sender closes the connection after
//! this frame, 0x81 the request is over the limit, 0x82 unsupported version, 0x83 malformed,
//! 0x84 refused (too many connections, shutting down). Correlation id 0 is never a call's: an
//! error frame with it is about the whole connection.
//!
//! # TLS
//! Optional on each side, and all or nothing: a server with [`ServerConfig::tls`] speaks only
//! TLS, one without it only plain TCP, and a client uses TLS to every peer when
//! [`ClientConfig::tls`] is set. Inside TLS the frames are the same, and so is every guarantee
//! below.
//! - **Server.** The handshake runs in the connection's own task, never in the accept loop (so
//!   a client that connects and says nothing holds up nobody else), holding the connection's
//!   slot of `max_connections`, and is bounded by [`ServerTls::handshake_timeout`]; a failed or
//!   timed-out handshake is logged at debug and the connection dropped, as is one still under
//!   way when shutdown begins. The acceptor is asked for anew for each connection, so a reloaded
//!   certificate serves from the next connection on. The rustls configuration checks a client
//!   certificate; [`ServerTls::admit`] then decides on the chain presented (or its absence), and
//!   a peer it refuses gets the 0x84 "refused" error frame with its message, over TLS, before
//!   the connection closes. A connection over `max_connections` is refused the same way, over
//!   TLS, which takes a handshake: a few such refusals run at once, each bounded by the
//!   handshake timeout, and a connection beyond those is closed without a word.
//! - **Client.** The handshake is part of connecting: within `connect_timeout` (one deadline
//!   for the TCP connect and the handshake), under the peer's connect lock. The server's
//!   certificate is checked for the peer's IP address, since peers are socket addresses; the
//!   given rustls configuration's verifier decides. A failed handshake is
//!   [`RpcErrorKind::Unreachable`] (the request was not sent) with a message that names TLS and
//!   the reason, e.g. "TLS handshake with 127.0.0.1:9093 failed: invalid peer certificate:
//!   UnknownIssuer".
//! - **Mismatch.** A plain client's first frame fails the TLS server's handshake, and the server
//!   sends a TLS alert and closes: the plain client's call fails at once, as a
//!   [`RpcErrorKind::Protocol`] error that says TLS is set up on one side only (the alert,
//!   recognised where a frame should start), or as the connection lost if the close came first.
//!   A plain server answers a TLS client's hello with an error frame (most often saying the
//!   same), which the client cannot read: its handshake fails ([`RpcErrorKind::Unreachable`]).
//!   Neither waits for a timeout.
//!
//! # What each side guarantees
//! - **Bounded frames.** A declared length over the limit is refused after the 12-byte header,
//!   never allocated. The server answers such a request with a `TooLarge` error frame carrying
//!   its correlation id, then closes that connection. A client that receives a response over
//!   its limit fails that call only and skips the payload through a small buffer: the other
//!   calls on the connection are sound. A request over the client's own limit fails before
//!   anything is sent; a response over the server's limit becomes a `TooLarge` error.
//! - **Versioning.** A frame of another version gets a version-1 error frame naming the
//!   versions spoken (`SUPPORTED_VERSIONS`), then the connection closes. `length` and
//!   `version` keep their place in every version, so this works whatever the peer speaks.
//! - **Isolation.** Garbage or a truncated frame closes that connection only; the server keeps
//!   serving the others. A closing server reads and drops the connection's input for a moment
//!   (`LINGER`) so that its error frame is not lost to a TCP reset.
//! - **Concurrency, bounded.** A connection's requests are handled concurrently, each in its own
//!   task, at most `max_in_flight_per_connection` at once (answers not yet written included);
//!   the next request is not read until a slot frees, so a client that never reads its answers
//!   is throttled by TCP, not buffered. Answers go out as they are ready, in any order.
//!   Connections are bounded by `max_connections`.
//! - **Every request is answered or its connection closed.** A handler that panics, or is cut
//!   off when the shutdown grace ends, is answered with an error frame.
//! - **Timeouts.** A call's timeout covers waiting for a slot, connecting, writing and the
//!   answer, and its error says which phase it was in ([`CallPhase`]). The server gives up on a
//!   connection whose writes make no progress for `write_timeout`.
//! - **A slow or dead peer stalls only its own calls.** The client keeps one connection per
//!   peer, made lazily and multiplexed by correlation id, and holds no lock across I/O but that
//!   peer's own connect. A peer that accepts and never answers makes its calls time out;
//!   calls to other peers go on at full speed. Calls to one peer are bounded by
//!   `max_in_flight_per_peer` (the next waits, within its timeout). A refused connection fails
//!   at once ([`RpcErrorKind::Unreachable`]).
//! - **Failures are prompt.** When a connection dies, every call pending on it fails at once
//!   ([`RpcErrorKind::ConnectionLost`]); the next call connects again. A call that found its
//!   connection closed before its request was queued (the peer restarted while the connection
//!   was idle) is sent once on a new connection: it had not been sent, so this is safe for any
//!   method. So is a call whose connection the server refused (0x84): the server answers every
//!   request it read before it refuses, so the calls still pending were not read. Nothing is
//!   sent again that may have been handled. On an error frame that closes the connection, the
//!   client closes its side before the caller learns of the error, so the caller's next call
//!   makes a new connection. A request whose caller has given up is not written if it is
//!   still queued.
//!
//! # Why a protocol of our own
//! gRPC (`tonic`, which the RocketMQ front-end will bring in) would give multiplexing and
//! deadlines too, but its schemas are protobuf while openraft's messages are serde types
//! already, and its limits (HTTP/2 flow-control windows, one max message size) map less
//! directly onto the ones this transport must state: frame bytes, in-flight requests per
//! connection and per peer, connections. The format here is a few hundred lines, and every
//! bound in it is ours to name and test.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used)]

mod client;
mod error;
mod frame;
mod json;
mod server;

pub use client::{ClientConfig, ClientTls, RpcClient};
pub use error::{CallPhase, RemoteError, RpcError, RpcErrorKind};
pub use json::{decode_json, encode_json};
pub use server::{serve, Admit, BoxFuture, Handler, ServerConfig, ServerTls};
