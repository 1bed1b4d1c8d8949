//! Request extractors whose failures are API errors (JSON, 400 INVALID_REQUEST) rather than
//! axum's plain-text rejections, and helpers for query parameters.

use std::collections::HashMap;
use std::str::FromStr;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use weir_broker::ErrorKind;

use crate::error::ApiError;

/// A JSON body. The Content-Type is not checked, so `curl -d '{...}'` works.
pub(crate) struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(ErrorKind::TooLarge, format!("the request body exceeds {} bytes", crate::BODY_BYTES_MAX))
            } else {
                ApiError::invalid(format!("cannot read the request body: {}", rejection.body_text()))
            }
        })?;
        serde_json::from_slice(&bytes).map(JsonBody).map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))
    }
}

/// Path parameters.
pub(crate) struct PathParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for PathParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(value)| PathParams(value))
            .map_err(|rejection| ApiError::invalid(format!("invalid path: {}", rejection.body_text())))
    }
}

/// Query parameters by name.
pub(crate) struct QueryParams(pub HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for QueryParams {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map(|Query(map)| QueryParams(map))
            .map_err(|rejection| ApiError::invalid(format!("invalid query string: {}", rejection.body_text())))
    }
}

impl QueryParams {
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// Parses `name` if present; a value that does not parse is 400 naming the parameter.
    pub(crate) fn parse<T: FromStr>(&self, name: &str, expected: &str) -> Result<Option<T>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(text) => text
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| ApiError::invalid(format!("query parameter {name}={text:?}: expected {expected}"))),
        }
    }

    /// As [`QueryParams::parse`], with a default and an inclusive range.
    pub(crate) fn parse_in<T: FromStr + PartialOrd + std::fmt::Display + Copy>(
        &self,
        name: &str,
        default: T,
        min: T,
        max: T,
    ) -> Result<T, ApiError> {
        let value = self.parse(name, &format!("an integer from {min} to {max}"))?.unwrap_or(default);
        if value < min || value > max {
            return Err(ApiError::invalid(format!("query parameter {name}={value}: expected {min} to {max}")));
        }
        Ok(value)
    }
}
