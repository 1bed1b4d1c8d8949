//! One connection to one broker, at negotiated versions.
//!
//! On connecting it asks ApiVersions (v3, or v0 when the broker refuses v3, as Kafka's clients
//! do) and keeps the broker's ranges. Each request is then sent at the highest version in both
//! the caller's range and the broker's; a caller names the versions it builds requests for, so
//! a field a version lacks is never set.

use std::collections::HashMap;
use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::ops::RangeInclusive;
use std::time::Duration;

use kafka_protocol::messages::{ApiKey, ApiVersionsRequest};
use kafka_protocol::protocol::{Request, StrBytes};

use crate::wire::{api_key, decode_response, encode_request, read_frame};
use crate::ClientError;

/// UNSUPPORTED_VERSION: a broker older than ApiVersions v3 answers it (at v0) to v3.
const UNSUPPORTED_VERSION: i16 = 35;

/// A connection to one broker. One request at a time: `send` writes it and reads its answer.
pub struct BrokerConnection {
    stream: TcpStream,
    addr: String,
    client_id: String,
    next_correlation_id: i32,
    /// The broker's (min, max) version of each API key it implements.
    versions: HashMap<i16, (i16, i16)>,
}

impl BrokerConnection {
    /// Connects to `addr` (`host:port`; every address it resolves to is tried in turn) and asks
    /// its API versions. `io_timeout` bounds the connect and each read and write, so it must
    /// exceed the longest wait a request asks the broker for (a Fetch's max wait).
    pub fn connect(addr: &str, client_id: &str, io_timeout: Duration) -> Result<BrokerConnection, ClientError> {
        let stream = open(addr, io_timeout)?;
        let mut connection = BrokerConnection {
            stream,
            addr: addr.to_string(),
            client_id: client_id.to_string(),
            next_correlation_id: 1,
            versions: HashMap::new(),
        };
        connection.versions = connection.ask_versions()?;
        Ok(connection)
    }

    /// The `host:port` this connection was made to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    fn ask_versions(&mut self) -> Result<HashMap<i16, (i16, i16)>, ClientError> {
        let request = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("weir-cli"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        let mut response = self.exchange(3, &request)?;
        if response.error_code == UNSUPPORTED_VERSION {
            response = self.exchange(0, &ApiVersionsRequest::default())?;
        }
        crate::error::check(response.error_code, || format!("ApiVersions at {}", self.addr))?;
        Ok(response.api_keys.iter().map(|k| (k.api_key, (k.min_version, k.max_version))).collect())
    }

    /// The version `R` goes out at: the highest in both `ours` and the broker's range.
    pub fn version<R: Request>(&self, ours: RangeInclusive<i16>) -> Result<i16, ClientError> {
        let key = api_key::<R>()?;
        let unsupported = |theirs: String| ClientError::Unsupported {
            addr: self.addr.clone(),
            api: key,
            ours: format!("v{}-v{}", ours.start(), ours.end()),
            theirs,
        };
        let Some(&(min, max)) = self.versions.get(&R::KEY) else {
            return Err(unsupported("none".into()));
        };
        let version = (*ours.end()).min(max);
        if version < *ours.start() || version < min {
            return Err(unsupported(format!("v{min}-v{max}")));
        }
        Ok(version)
    }

    /// Whether the broker implements `key` at all.
    pub fn supports(&self, key: ApiKey) -> bool {
        self.versions.contains_key(&(key as i16))
    }

    /// Sends `request` at the negotiated version (see [`BrokerConnection::version`]) and waits
    /// for its answer; returns the version used with it.
    pub fn send<R: Request>(
        &mut self,
        ours: RangeInclusive<i16>,
        request: &R,
    ) -> Result<(i16, R::Response), ClientError> {
        let version = self.version::<R>(ours)?;
        Ok((version, self.exchange(version, request)?))
    }

    fn exchange<R: Request>(&mut self, version: i16, request: &R) -> Result<R::Response, ClientError> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let frame = encode_request(version, correlation_id, &self.client_id, request)?;
        self.stream.write_all(&frame)?;
        let answer = read_frame(&mut self.stream)?;
        decode_response::<R>(answer, version, correlation_id)
    }
}

/// A TCP connection to the first address of `addr` that accepts, without Nagle's delay.
fn open(addr: &str, io_timeout: Duration) -> Result<TcpStream, ClientError> {
    let connect_error = |error| ClientError::Connect { addr: addr.to_string(), error };
    let mut last = None;
    for resolved in addr.to_socket_addrs().map_err(connect_error)? {
        match TcpStream::connect_timeout(&resolved, io_timeout) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                stream.set_read_timeout(Some(io_timeout))?;
                stream.set_write_timeout(Some(io_timeout))?;
                return Ok(stream);
            }
            Err(e) => last = Some(e),
        }
    }
    let none = || std::io::Error::new(std::io::ErrorKind::NotFound, "the name resolves to no address");
    Err(connect_error(last.unwrap_or_else(none)))
}
