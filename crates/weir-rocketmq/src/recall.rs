//! RecallMessage: a producer takes back a delayed message before it is due (RocketMQ 5.3).
//!
//! SendMessage answers each delayed message with a recall handle naming where the message
//! waits: `r1.<broker>.<offset>.<due ms>`, the broker whose timer store took it, the offset in
//! that store's log and the delivery time. RecallMessage with the handle and the message's topic
//! takes it out of the timer store ([`weir_broker::timer::recall`]), here or, in a cluster, on
//! that broker. A recall of a message recalled already succeeds again; one of a message
//! delivered already (or being delivered) fails with `NOT_FOUND` (not `MESSAGE_NOT_FOUND`,
//! which clients read as an empty receive, not as an error); a handle Weir never gave, or one
//! given for a message of another topic, with `BAD_REQUEST`.

use weir_messaging::timer::Recall;
use weir_messaging::Messaging;

use crate::proto::{Code, RecallMessageRequest};
use crate::status::{self, status};

/// A recall handle's parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecallHandle {
    /// The broker whose timer store keeps the message.
    pub(crate) node: i32,
    /// Its offset in that store's log.
    pub(crate) offset: i64,
    /// Its delivery time, ms since the epoch.
    pub(crate) due_ms: i64,
}

impl RecallHandle {
    /// The handle's text; [`RecallHandle::decode`] gives this handle back (asserted in debug
    /// builds: a handle that does not round-trip could never recall its message).
    pub(crate) fn encode(&self) -> String {
        let text = format!("r1.{}.{}.{}", self.node, self.offset, self.due_ms);
        debug_assert_eq!(RecallHandle::decode(&text), Some(*self), "recall handle {text:?} does not round-trip");
        text
    }

    pub(crate) fn decode(text: &str) -> Option<RecallHandle> {
        let mut parts = text.strip_prefix("r1.")?.split('.');
        let node = parts.next()?.parse().ok().filter(|n: &i32| *n >= 0)?;
        let offset = parts.next()?.parse().ok().filter(|o: &i64| *o >= 0)?;
        let due_ms = parts.next()?.parse().ok()?;
        if parts.next().is_some() {
            return None;
        }
        Some(RecallHandle { node, offset, due_ms })
    }
}

/// Recalls the message `request` names: its message id, or the status refusing it.
pub(crate) async fn recall(
    messaging: &Messaging,
    request: &RecallMessageRequest,
) -> Result<String, crate::proto::Status> {
    let broker = messaging.broker();
    let topic = request.topic.as_ref().map(|t| t.name.as_str()).unwrap_or_default();
    if topic.is_empty() {
        return Err(status(Code::IllegalTopic, "the request names no topic"));
    }
    if broker.metadata().topic(topic).is_none() {
        return Err(status(Code::TopicNotFound, format!("topic {topic} does not exist")));
    }
    let handle = RecallHandle::decode(&request.recall_handle).ok_or_else(|| {
        status(Code::BadRequest, format!("{:?} is not a recall handle Weir gave", request.recall_handle))
    })?;
    match messaging.recall_delayed(handle.node, topic, handle.due_ms, handle.offset).await {
        Ok(Recall::Recalled { message_id }) => Ok(message_id.unwrap_or_default()),
        Ok(Recall::NotPending) => Err(status(
            Code::NotFound,
            format!("no delayed message of {topic} waits under this recall handle: it was delivered already"),
        )),
        Ok(Recall::OtherTopic) => Err(status(
            Code::BadRequest,
            format!("this recall handle was given for a delayed message of another topic, not of {topic}"),
        )),
        Ok(Recall::Delivering) => Err(status(
            Code::NotFound,
            format!("the delayed message of {topic} is being delivered: too late to recall it"),
        )),
        Err(e) => Err(status::of_error(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_made_up_ones_do_not_decode() {
        let handle = RecallHandle { node: 3, offset: 1_234_567, due_ms: 1_796_201_803_206 };
        assert_eq!(RecallHandle::decode(&handle.encode()), Some(handle));
        for bogus in ["", "r1.", "r1.3.4", "r1.-1.4.5", "r1.3.-4.5", "r2.3.4.5", "r1.3.4.5.6", "r1.x.4.5", "w1.3.4.5"] {
            assert_eq!(RecallHandle::decode(bogus), None, "{bogus}");
        }
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "does not round-trip")]
    fn a_recall_handle_that_does_not_round_trip_is_caught() {
        let _ = RecallHandle { node: 1, offset: -3, due_ms: 5 }.encode();
    }
}
