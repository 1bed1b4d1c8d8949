//! Why a request failed.

use kafka_protocol::messages::ApiKey;

/// What went wrong talking to a broker.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to the Kafka listener at {addr}: {error}")]
    Connect { addr: String, error: std::io::Error },
    /// The broker closed the connection (end of stream, reset, broken pipe) instead of answering.
    #[error("the broker closed the connection instead of answering")]
    Closed,
    /// Nothing arrived within the read timeout (or a write could not finish in time).
    #[error("no answer within the timeout")]
    Timeout,
    #[error("i/o error: {0}")]
    Io(std::io::Error),
    /// The request does not encode at that version.
    #[error("cannot encode the request: {0}")]
    Encode(String),
    /// A frame arrived but does not decode as the expected response.
    #[error("undecodable response: {0}")]
    Decode(String),
    /// The broker implements no version of the API this client knows.
    #[error(
        "the broker at {addr} does not support {api:?} at a version this client knows ({ours}); it offers {theirs}"
    )]
    Unsupported { addr: String, api: ApiKey, ours: String, theirs: String },
    /// The broker answered with a Kafka error code (never 0): `code` and what was being done.
    #[error("{message}")]
    Kafka { code: i16, message: String },
    /// Nothing in the cluster can do what was asked (no leader, no broker listed).
    #[error("{0}")]
    Unavailable(String),
    /// The address list given is not `host:port[,host:port...]`.
    #[error("{0}")]
    BadAddress(String),
}

impl ClientError {
    /// A Kafka error code answered by the broker, with what was being done. `code` 0 is no
    /// error: callers check it before.
    pub fn kafka(code: i16, message: impl Into<String>) -> ClientError {
        debug_assert_ne!(code, 0, "0 is no error");
        ClientError::Kafka { code, message: message.into() }
    }

    /// Whether the broker could not be reached or stopped answering (or is no longer in the
    /// cluster's metadata): asking the cluster again, elsewhere, may do, unlike for an answer.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            ClientError::Connect { .. }
                | ClientError::Closed
                | ClientError::Timeout
                | ClientError::Io(_)
                | ClientError::Unavailable(_)
        )
    }

    /// The Kafka error code, if the broker answered with one.
    pub fn kafka_code(&self) -> Option<i16> {
        match self {
            ClientError::Kafka { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl From<std::io::Error> for ClientError {
    /// Sorts an I/O error of the connection into what it says about the broker.
    fn from(e: std::io::Error) -> ClientError {
        use std::io::ErrorKind;
        match e.kind() {
            ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe => ClientError::Closed,
            ErrorKind::WouldBlock | ErrorKind::TimedOut => ClientError::Timeout,
            _ => ClientError::Io(e),
        }
    }
}

/// `Err` of the Kafka error `code` (with `what` saying what failed), `Ok` for 0.
pub fn check(code: i16, what: impl FnOnce() -> String) -> Result<(), ClientError> {
    if code == 0 {
        return Ok(());
    }
    Err(ClientError::kafka(code, what()))
}
