//! One async connection to one broker's Kafka listener: Kafka requests at fixed versions
//! (a Weir broker speaks them all) and SessionWrite, one request at a time.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::native::wire::{SessionWriteRequest, SessionWriteResponse, SESSION_WRITE_KEY, SESSION_WRITE_VERSION};
use crate::wire::{decode_response, encode_request, RESPONSE_BYTES_MAX};
use crate::ClientError;

pub(crate) struct Connection {
    stream: TcpStream,
    client_id: String,
    next_correlation_id: i32,
    /// Bounds the connect and each exchange, beyond the wait a request asks the broker for.
    timeout: Duration,
}

impl Connection {
    pub(crate) async fn connect(addr: &str, client_id: &str, timeout: Duration) -> Result<Connection, ClientError> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| ClientError::Timeout)?
            .map_err(|error| ClientError::Connect { addr: addr.to_string(), error })?;
        // Small writes (an empty SessionWrite, a checkpoint poll) go out at once.
        let _ = stream.set_nodelay(true);
        Ok(Connection { stream, client_id: client_id.to_string(), next_correlation_id: 1, timeout })
    }

    fn correlation_id(&mut self) -> i32 {
        let id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1).max(1);
        id
    }

    /// Sends a Kafka request at `version` and reads its response; `wait` is how long the
    /// broker may hold it (a Fetch's max wait).
    pub(crate) async fn request<R: Request>(
        &mut self,
        version: i16,
        request: &R,
        wait: Duration,
    ) -> Result<R::Response, ClientError> {
        let correlation_id = self.correlation_id();
        let frame = encode_request(version, correlation_id, &self.client_id, request)?;
        let response = self.exchange(&frame, wait).await?;
        decode_response::<R>(response, version, correlation_id)
    }

    /// Sends a SessionWrite and reads its response.
    pub(crate) async fn session_write(
        &mut self,
        request: &SessionWriteRequest,
    ) -> Result<SessionWriteResponse, ClientError> {
        let correlation_id = self.correlation_id();
        let mut frame = BytesMut::with_capacity(64 + request.records.as_ref().map_or(0, |r| r.len()));
        frame.put_i32(0);
        frame.put_i16(SESSION_WRITE_KEY);
        frame.put_i16(SESSION_WRITE_VERSION);
        frame.put_i32(correlation_id);
        let client_id = &self.client_id.as_bytes()[..self.client_id.len().min(i16::MAX as usize)];
        frame.put_i16(client_id.len() as i16);
        frame.put_slice(client_id);
        request.encode(&mut frame);
        let size = i32::try_from(frame.len() - 4)
            .map_err(|_| ClientError::Encode(format!("a SessionWrite of {} bytes", frame.len())))?;
        frame[..4].copy_from_slice(&size.to_be_bytes());
        let wait = Duration::from_millis(request.max_wait_ms.max(0) as u64);
        let mut response = self.exchange(&frame, wait).await?;
        if response.len() < 4 {
            return Err(ClientError::Decode("a SessionWrite response without a header".into()));
        }
        let got = i32::from_be_bytes([response[0], response[1], response[2], response[3]]);
        if got != correlation_id {
            return Err(ClientError::Decode(format!(
                "SessionWrite: correlation id {got} where {correlation_id} was expected"
            )));
        }
        let body = response.split_off(4);
        SessionWriteResponse::decode(body).map_err(|e| ClientError::Decode(e.to_string()))
    }

    async fn exchange(&mut self, frame: &[u8], wait: Duration) -> Result<Bytes, ClientError> {
        let deadline = tokio::time::Instant::now() + self.timeout + wait;
        tokio::time::timeout_at(deadline, async {
            self.stream.write_all(frame).await.map_err(ClientError::from)?;
            let size = self.stream.read_i32().await.map_err(ClientError::from)?;
            let Some(size) = usize::try_from(size).ok().filter(|&s| (4..=RESPONSE_BYTES_MAX).contains(&s)) else {
                return Err(ClientError::Decode(format!("response frame size {size}")));
            };
            let mut response = vec![0u8; size];
            self.stream.read_exact(&mut response).await.map_err(ClientError::from)?;
            Ok(Bytes::from(response))
        })
        .await
        .map_err(|_| ClientError::Timeout)?
    }
}
