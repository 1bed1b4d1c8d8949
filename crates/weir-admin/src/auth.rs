//! Authentication and authorization of the admin API (`admin.api.require.auth`).
//!
//! A request names a Weir user with HTTP Basic; the password is checked against the user's
//! SCRAM credentials exactly as a SASL/PLAIN login is (`weir_security::scram`). The user is then
//! `User:<name>` to the authorizer, with the same ACLs as on the Kafka listeners:
//! - reading records or messages of a topic needs READ on it, producing WRITE;
//! - every other read (GET) needs DESCRIBE on the cluster, every other change ALTER on it.
//!
//! `/health` and `/ready` stay open (probes carry no credentials). Until the first user exists,
//! a request from the loopback address needs no credentials, so that `weir user create` on the
//! broker's machine can make the first one.
//!
//! PBKDF2 costs milliseconds, too much for every request of a script: a successful check is
//! remembered for [`REMEMBERED`], keyed by a hash of the name and password, and only while the
//! user's credential is the one it was checked against.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use weir_broker::{Broker, ErrorKind};
use weir_security::acl::{AclOperation, ResourceType, CLUSTER_RESOURCE};
use weir_security::{scram, ScramMechanism};

use crate::error::ApiError;
use crate::SharedState;

/// How long a checked password is remembered.
const REMEMBERED: Duration = Duration::from_secs(300);
/// Checked passwords remembered at most (the map is cleared past it).
const MAX_REMEMBERED: usize = 10_000;

/// A password checked lately: when, and the stored key it matched.
type Checked = (Instant, Vec<u8>);

/// Passwords checked lately, by keyed digest of (user, password).
#[derive(Default)]
pub(crate) struct CheckedPasswords(Mutex<HashMap<[u8; 32], Checked>>);

pub(crate) async fn require(
    State(state): State<SharedState>,
    ConnectInfo(crate::Peer(peer)): ConnectInfo<crate::Peer>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    let Ok(core) = state.core() else { return next.run(request).await };
    let broker = &core.broker;
    if !broker.config.admin_require_auth || path == "/health" || path == "/ready" {
        return next.run(request).await;
    }
    let principal = match basic_credentials(request.headers()) {
        Ok(Some((user, password))) => match check(&state.checked_passwords, broker, &user, password).await {
            true => format!("User:{user}"),
            false => return unauthorized("wrong user name or password"),
        },
        Ok(None) if peer.ip().is_loopback() && broker.scram_users().is_empty() => {
            return next.run(request).await;
        }
        Ok(None) => return unauthorized("this admin API asks for a user name and password (HTTP Basic)"),
        Err(why) => return unauthorized(why),
    };
    let (operation, resource_type, name) = required(request.method(), path);
    if !broker.authorize(&principal, &peer.ip().to_string(), operation, resource_type, &name) {
        let kind = if resource_type == ResourceType::Topic {
            ErrorKind::TopicAuthorizationFailed
        } else {
            ErrorKind::ClusterAuthorizationFailed
        };
        let message = format!("{principal} may not {operation} {resource_type} {name:?}");
        return ApiError::new(kind, message).into_response();
    }
    next.run(request).await
}

/// 401 with the challenge HTTP clients answer.
fn unauthorized(why: &str) -> Response {
    let mut response = ApiError::new(ErrorKind::AuthenticationFailed, why).into_response();
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"weir\""));
    response
}

/// The user and password of an `Authorization: Basic` header, if there is one.
fn basic_credentials(headers: &HeaderMap) -> Result<Option<(String, String)>, &'static str> {
    let Some(value) = headers.get(header::AUTHORIZATION) else { return Ok(None) };
    let value = value.to_str().map_err(|_| "the Authorization header is not text")?;
    let Some(encoded) = value.strip_prefix("Basic ").or_else(|| value.strip_prefix("basic ")) else {
        return Err("only HTTP Basic authentication is accepted");
    };
    let decoded = BASE64.decode(encoded.trim()).map_err(|_| "the Basic credentials are not base64")?;
    let text = String::from_utf8(decoded).map_err(|_| "the Basic credentials are not UTF-8")?;
    let (user, password) = text.split_once(':').ok_or("the Basic credentials have no ':'")?;
    Ok(Some((user.to_string(), password.to_string())))
}

/// Is `password` the user's? (Any of its SCRAM credentials decides: all come from one password.)
async fn check(checked: &CheckedPasswords, broker: &Broker, user: &str, password: String) -> bool {
    let credentials: Vec<_> =
        ScramMechanism::ALL.into_iter().filter_map(|m| broker.scram_credential(user, m).map(|c| (m, c))).collect();
    let Some((_, first)) = credentials.first() else { return false };
    let key = cache_key(user, &password);
    let now = Instant::now();
    {
        let remembered = checked.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((at, stored_key)) = remembered.get(&key) {
            if now.duration_since(*at) < REMEMBERED && *stored_key == first.stored_key {
                return true;
            }
        }
    }
    let stored_key = first.stored_key.clone();
    let ok = tokio::task::spawn_blocking(move || {
        credentials.iter().take(1).any(|(m, c)| scram::verify_password(*m, c, &password))
    })
    .await
    .unwrap_or(false);
    if ok {
        let mut remembered = checked.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if remembered.len() >= MAX_REMEMBERED {
            remembered.clear();
        }
        remembered.insert(key, (now, stored_key));
    }
    ok
}

fn cache_key(user: &str, password: &str) -> [u8; 32] {
    let mut input = Vec::with_capacity(user.len() + password.len() + 1);
    input.extend_from_slice(user.as_bytes());
    input.push(0);
    input.extend_from_slice(password.as_bytes());
    scram::process_keyed_digest(&input)
}

/// What a request needs: (operation, resource type, resource name).
fn required(method: &Method, path: &str) -> (AclOperation, ResourceType, String) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let reading = matches!(*method, Method::GET | Method::HEAD);
    // /v1/topics/{topic}/records, /v1/topics/{topic}/partitions/{p}/records,
    // /v1/topics/{topic}/messages[/{id}]
    if let ["v1", "topics", topic, rest @ ..] = segments.as_slice() {
        let records = matches!(rest, ["records"] | ["partitions", _, "records"] | ["messages"] | ["messages", _]);
        if records {
            let topic = percent_decode(topic);
            let operation = if reading { AclOperation::Read } else { AclOperation::Write };
            return (operation, ResourceType::Topic, topic);
        }
    }
    let operation = if reading { AclOperation::Describe } else { AclOperation::Alter };
    (operation, ResourceType::Cluster, CLUSTER_RESOURCE.to_string())
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_need_read_or_write_on_the_topic_and_the_rest_the_cluster() {
        let topic = |m: &Method, p: &str| required(m, p);
        assert_eq!(topic(&Method::GET, "/v1/topics/a%20b/records").0, AclOperation::Read);
        assert_eq!(topic(&Method::GET, "/v1/topics/a%20b/records").2, "a b");
        assert_eq!(topic(&Method::POST, "/v1/topics/orders/records").0, AclOperation::Write);
        assert_eq!(topic(&Method::GET, "/v1/topics/orders/partitions/3/records").1, ResourceType::Topic);
        assert_eq!(topic(&Method::GET, "/v1/topics/orders/messages/abc").0, AclOperation::Read);
        assert_eq!(topic(&Method::GET, "/v1/topics/orders").1, ResourceType::Cluster);
        assert_eq!(topic(&Method::DELETE, "/v1/topics/orders").0, AclOperation::Alter);
        assert_eq!(topic(&Method::GET, "/metrics").0, AclOperation::Describe);
    }

    #[test]
    fn basic_credentials_are_read_and_malformed_ones_refused() {
        let mut headers = HeaderMap::new();
        assert_eq!(basic_credentials(&headers), Ok(None));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic YWxpY2U6cDpx"));
        assert_eq!(basic_credentials(&headers), Ok(Some(("alice".into(), "p:q".into()))));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        assert!(basic_credentials(&headers).is_err());
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic !!!"));
        assert!(basic_credentials(&headers).is_err());
    }
}
