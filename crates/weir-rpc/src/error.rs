//! What a call can fail with ([`RpcError`]), and what a handler answers instead of a body
//! ([`RemoteError`]).

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

/// A failed call: which peer and method, and what happened ([`RpcErrorKind`]).
#[derive(Debug, thiserror::Error)]
#[error("rpc {method} to {peer}: {kind}")]
pub struct RpcError {
    peer: SocketAddr,
    method: String,
    kind: RpcErrorKind,
}

impl RpcError {
    pub(crate) fn new(peer: SocketAddr, method: &str, kind: RpcErrorKind) -> RpcError {
        RpcError { peer, method: method.to_owned(), kind }
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    pub fn method(&self) -> &str {
        &self.method
    }

    pub fn kind(&self) -> &RpcErrorKind {
        &self.kind
    }

    pub fn into_kind(self) -> RpcErrorKind {
        self.kind
    }
}

/// What went wrong with a call, as finely as a caller's reaction needs: whether the request
/// can have been handled (it cannot for [`Unreachable`](RpcErrorKind::Unreachable), and for
/// [`TooLarge`](RpcErrorKind::TooLarge) refused before sending), and whether to try again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RpcErrorKind {
    /// No answer within the call's timeout. The request may or may not have been handled.
    #[error("no answer within {after:?} ({phase})")]
    Timeout { after: Duration, phase: CallPhase },
    /// No connection could be made (refused, no route, the connect timeout), or the server
    /// refused to serve it (at its `max_connections`, shutting down): the request was not
    /// handled.
    #[error("cannot reach the server: {0}")]
    Unreachable(String),
    /// The connection closed or broke before the answer came. The request may or may not have
    /// been handled.
    #[error("connection lost before the answer: {0}")]
    ConnectionLost(String),
    /// The peer's handler answered with an error.
    #[error("the peer's handler failed: {0}")]
    Remote(String),
    /// The request or its response is over a frame limit (this side's or the peer's; the
    /// message says which).
    #[error("{0}")]
    TooLarge(String),
    /// The peer broke the wire format or speaks another version: a bug or a mismatched build,
    /// not a passing failure.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The JSON of [`RpcClient::call_json`](crate::RpcClient::call_json) could not be written
    /// or read.
    #[error("cannot {what} as JSON: {source}")]
    Codec {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

/// Where a call was when its timeout fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallPhase {
    /// All of the peer's in-flight slots were taken (`max_in_flight_per_peer`).
    WaitingForSlot,
    /// Connecting to the peer (or waiting for another call's connection attempt).
    Connecting,
    /// Handing the request to the connection's writer, which was not keeping up.
    Sending,
    /// The request was queued to be written, or written: waiting for the answer.
    WaitingForAnswer,
}

impl fmt::Display for CallPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CallPhase::WaitingForSlot => "still waiting for a free in-flight slot",
            CallPhase::Connecting => "still connecting",
            CallPhase::Sending => "still waiting to send the request",
            CallPhase::WaitingForAnswer => "the request was sent",
        })
    }
}

/// A handler's failure, sent to the caller as its [`RpcErrorKind::Remote`] message (cut to
/// `MAX_ERROR_MESSAGE_BYTES` on the wire).
///
/// Failures the caller must act on in detail (not the controller; which one is) belong in the
/// method's response body; this is for a request that could not be handled at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RemoteError {
    message: String,
}

impl RemoteError {
    pub fn new(message: impl Into<String>) -> RemoteError {
        RemoteError { message: message.into() }
    }

    /// The answer to a method the handler does not know.
    pub fn unknown_method(method: &str) -> RemoteError {
        RemoteError::new(format!("unknown method {method:?}"))
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

/// How a call ended without an answer, as the connection reports it to each of its pending
/// calls (so it can be cloned); the caller adds its peer and method.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    Remote(String),
    TooLarge(String),
    Protocol(String),
    Lost(String),
    /// The server refused the connection without reading the request: safe to send again.
    Refused(String),
}

impl Failure {
    pub(crate) fn message(&self) -> &str {
        match self {
            Failure::Remote(m)
            | Failure::TooLarge(m)
            | Failure::Protocol(m)
            | Failure::Lost(m)
            | Failure::Refused(m) => m,
        }
    }
}

impl From<Failure> for RpcErrorKind {
    fn from(failure: Failure) -> RpcErrorKind {
        match failure {
            Failure::Remote(m) => RpcErrorKind::Remote(m),
            Failure::TooLarge(m) => RpcErrorKind::TooLarge(m),
            Failure::Protocol(m) => RpcErrorKind::Protocol(m),
            Failure::Lost(m) => RpcErrorKind::ConnectionLost(m),
            Failure::Refused(m) => RpcErrorKind::Unreachable(m),
        }
    }
}
