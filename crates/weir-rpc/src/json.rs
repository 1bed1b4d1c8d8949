//! JSON bodies for handlers, with failures worded for the caller. The client's side is
//! [`RpcClient::call_json`](crate::RpcClient::call_json).

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::RemoteError;

/// Reads a request body of `method` as JSON.
pub fn decode_json<T: DeserializeOwned>(method: &str, body: &[u8]) -> Result<T, RemoteError> {
    serde_json::from_slice(body)
        .map_err(|e| RemoteError::new(format!("cannot decode the {method} request as JSON: {e}")))
}

/// Writes the answer to `method` as JSON.
pub fn encode_json<T: Serialize + ?Sized>(method: &str, answer: &T) -> Result<Bytes, RemoteError> {
    serde_json::to_vec(answer)
        .map(Bytes::from)
        .map_err(|e| RemoteError::new(format!("cannot encode the {method} answer as JSON: {e}")))
}
