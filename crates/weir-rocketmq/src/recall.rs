//! RecallMessage: a producer takes back a delayed message before it is due (RocketMQ 5.3).
//!
//! SendMessage answers each delayed message with a recall handle naming where the message
//! waits: `r2.<shard>.<offset>.<due ms>`, the partition of `__delayed_messages` that took it,
//! the offset there and the delivery time. RecallMessage with the handle and the message's
//! topic takes it out of the timer store ([`weir_messaging::timer::Timer::recall`]) on the
//! broker leading that shard now, whichever broker took the message. A recall of a message
//! recalled already succeeds again; one of a message delivered already (or being delivered)
//! fails with `NOT_FOUND` (not `MESSAGE_NOT_FOUND`, which clients read as an empty receive, not
//! as an error); a handle Weir never gave, or one given for a message of another topic, with
//! `BAD_REQUEST`. A handle of a version before the timer store was replicated (`r1.`, naming a
//! broker) can recall nothing since the upgrade moved its message: `NOT_FOUND` too.

use weir_messaging::timer::Recall;
use weir_messaging::Messaging;

use crate::proto::{Code, RecallMessageRequest};
use crate::status::{self, status};

/// A recall handle's parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecallHandle {
    /// The shard (partition of `__delayed_messages`) that keeps the message.
    pub(crate) shard: i32,
    /// Its offset there.
    pub(crate) offset: i64,
    /// Its delivery time, ms since the epoch.
    pub(crate) due_ms: i64,
}

/// The prefix of the handles of the broker-local timer store of earlier versions.
const LEGACY_PREFIX: &str = "r1.";

impl RecallHandle {
    /// The handle's text; [`RecallHandle::decode`] gives this handle back (asserted in debug
    /// builds: a handle that does not round-trip could never recall its message).
    pub(crate) fn encode(&self) -> String {
        let text = format!("r2.{}.{}.{}", self.shard, self.offset, self.due_ms);
        debug_assert_eq!(RecallHandle::decode(&text), Some(*self), "recall handle {text:?} does not round-trip");
        text
    }

    pub(crate) fn decode(text: &str) -> Option<RecallHandle> {
        let mut parts = text.strip_prefix("r2.")?.split('.');
        let shard = parts.next()?.parse().ok().filter(|n: &i32| *n >= 0)?;
        let offset = parts.next()?.parse().ok().filter(|o: &i64| *o >= 0)?;
        let due_ms = parts.next()?.parse().ok()?;
        if parts.next().is_some() {
            return None;
        }
        Some(RecallHandle { shard, offset, due_ms })
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
    if request.recall_handle.starts_with(LEGACY_PREFIX) {
        return Err(status(
            Code::NotFound,
            "this recall handle was given before the broker's upgrade moved its delayed messages: it recalls nothing now",
        ));
    }
    let handle = RecallHandle::decode(&request.recall_handle).ok_or_else(|| {
        status(Code::BadRequest, format!("{:?} is not a recall handle Weir gave", request.recall_handle))
    })?;
    match messaging.timer.recall(handle.shard, topic, handle.due_ms, handle.offset).await {
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
        let handle = RecallHandle { shard: 3, offset: 1_234_567, due_ms: 1_796_201_803_206 };
        assert_eq!(RecallHandle::decode(&handle.encode()), Some(handle));
        // An earlier version's handle (r1.) is no handle of this one.
        for bogus in ["", "r2.", "r2.3.4", "r2.-1.4.5", "r2.3.-4.5", "r1.3.4.5", "r2.3.4.5.6", "r2.x.4.5", "w2.3.4.5"] {
            assert_eq!(RecallHandle::decode(bogus), None, "{bogus}");
        }
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "does not round-trip")]
    fn a_recall_handle_that_does_not_round_trip_is_caught() {
        let _ = RecallHandle { shard: 1, offset: -3, due_ms: 5 }.encode();
    }
}
