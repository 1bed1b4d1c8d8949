//! Finding messages: by key or message id (the core's message index) and by time (the logs'
//! time indexes). `GET /v1/topics/{topic}/messages?key=K`, `?id=I`, or `?begin_ms=&end_ms=`,
//! and `GET /v1/topics/{topic}/messages/{id}`.
//!
//! Each broker searches the partitions it holds (leaders and followers both index); the node
//! asked also asks every other broker and merges the answers, one per partition and offset.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use weir_broker::message::Message;
use weir_messaging::message_index::{Found, Lookup, MAX_CANDIDATES};

use crate::api::{Encoding, FoundMessage, FoundMessages};
use crate::error::ApiError;
use crate::extract::{PathParams, QueryParams};
use crate::records::{encoding_of, text_of};
use crate::topics::require_topic;
use crate::SharedState;

/// Messages one query answers when `max` is not given (RocketMQ's default `maxNum`).
const MAX_MESSAGES_DEFAULT: usize = 64;

fn found_message(topic: &str, found: Found, encoding: Encoding) -> FoundMessage {
    let message = Message::from_record(topic, found.partition, &found.record);
    FoundMessage {
        message_id: message.id().to_string(),
        partition: found.partition,
        offset: found.record.offset,
        timestamp: found.record.timestamp,
        tag: message.tag,
        keys: message.keys,
        message_group: message.message_group,
        key: text_of(found.record.key, encoding),
        properties: message.properties.into_iter().collect(),
        body: text_of(found.record.value, encoding),
    }
}

/// What a query asks for.
enum Wanted {
    Key(String),
    Id(String),
    Time,
}

pub(crate) async fn query(
    State(state): State<SharedState>,
    PathParams(topic): PathParams<String>,
    headers: HeaderMap,
    query: QueryParams,
) -> Result<Json<FoundMessages>, ApiError> {
    let core = state.core()?;
    let broker = core.broker.clone();
    require_topic(&broker, &topic)?;
    let encoding = encoding_of(&query)?;
    let max = query.parse_in("max", MAX_MESSAGES_DEFAULT, 1, MAX_CANDIDATES)?;
    let begin = query.parse_in("begin_ms", 0_i64, 0, i64::MAX)?;
    let end = query.parse_in("end_ms", i64::MAX, 0, i64::MAX)?;
    if begin > end {
        return Err(ApiError::invalid(format!("begin_ms {begin} is after end_ms {end}")));
    }
    let wanted = match (query.get("key"), query.get("id")) {
        (Some(_), Some(_)) => return Err(ApiError::invalid("give `key` or `id`, not both")),
        (Some(key), None) if !key.is_empty() => Wanted::Key(key.to_string()),
        (None, Some(id)) if !id.is_empty() => Wanted::Id(id.to_string()),
        (None, None) if query.get("begin_ms").is_some() || query.get("end_ms").is_some() => Wanted::Time,
        (None, None) => {
            return Err(ApiError::invalid("say what to find: `key`, `id`, or a time range (`begin_ms`, `end_ms`)"))
        }
        _ => return Err(ApiError::invalid("`key` and `id` cannot be empty")),
    };
    let local = {
        let (messaging, topic) = (core.messaging.clone(), topic.clone());
        tokio::task::spawn_blocking(move || match &wanted {
            Wanted::Key(key) => messaging.find_messages(&topic, Lookup::Key(key), (begin, end), max),
            Wanted::Id(id) => messaging.find_messages(&topic, Lookup::MessageId(id), (begin, end), max),
            Wanted::Time => messaging.messages_in_time_range(&topic, (begin, end), max),
        })
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??
    };
    let mut messages: BTreeMap<(i32, i64), FoundMessage> = local
        .into_iter()
        .map(|found| found_message(&topic, found, encoding))
        .map(|m| ((m.partition, m.offset), m))
        .collect();
    if !crate::forward::is_forwarded(&headers) {
        let path = format!("/v1/topics/{topic}/messages?{}", query_string(&query));
        for other in crate::forward::ask_every_broker::<FoundMessages>(&broker, &path).await {
            for m in other.messages {
                messages.entry((m.partition, m.offset)).or_insert(m);
            }
        }
    }
    Ok(Json(FoundMessages { topic, encoding, messages: messages.into_values().take(max).collect() }))
}

/// `GET /v1/topics/{topic}/messages/{id}`: the message with this id, or 404 `MESSAGE_NOT_FOUND`.
pub(crate) async fn by_id(
    State(state): State<SharedState>,
    PathParams((topic, id)): PathParams<(String, String)>,
    headers: HeaderMap,
    query: QueryParams,
) -> Result<Json<FoundMessage>, ApiError> {
    let mut params = query.0.clone();
    params.insert("id".into(), id.clone());
    params.insert("max".into(), "1".into());
    let Json(found) = self::query(State(state), PathParams(topic.clone()), headers, QueryParams(params)).await?;
    found.messages.into_iter().next().map(Json).ok_or_else(|| {
        ApiError::http(StatusCode::NOT_FOUND, "MESSAGE_NOT_FOUND", format!("no message {id} in topic '{topic}'"))
    })
}

/// The query again, percent-encoded, for the other brokers.
fn query_string(query: &QueryParams) -> String {
    let mut pairs: Vec<(&String, &String)> = query.0.iter().collect();
    pairs.sort();
    pairs.iter().map(|(k, v)| format!("{}={}", encode(k), encode(v))).collect::<Vec<_>>().join("&")
}

fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
