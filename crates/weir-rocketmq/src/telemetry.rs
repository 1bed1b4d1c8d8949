//! The Telemetry stream: a client opens it at start-up and sends its settings; the server
//! answers each with its own (status OK), which the client applies: the largest body it may
//! send, whether to check message types against the route, and for consumers the long-polling
//! timeout, the batch size, FIFO delivery and the retry back-off.

use std::time::Duration;

use crate::proto::{
    self, retry_policy, settings::PubSub, telemetry_command, CustomizedBackoff, ExponentialBackoff, Publishing,
    RetryPolicy, Subscription, TelemetryCommand,
};
use crate::status;

/// RocketMQ's default number of deliveries before a message goes to the dead letters.
pub const DEFAULT_MAX_DELIVERY_ATTEMPTS: i32 = 17;

/// How long a consumer's receive waits for messages (the client adds its request timeout).
pub const LONG_POLLING_TIMEOUT: Duration = Duration::from_secs(20);

/// Messages a push consumer asks for in one receive.
pub const RECEIVE_BATCH_SIZE: i32 = 32;

/// RocketMQ's default redelivery back-off after a failed consume: the delay before delivery
/// attempt n + 1 is the n-th of these (the last repeats).
pub const RETRY_BACKOFF_SECONDS: [i64; 18] =
    [1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200];

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

/// What the server answers to a client's settings. `max_body_bytes` is the largest body the
/// client's topics take.
pub fn answer(client: &proto::Settings, max_body_bytes: usize) -> TelemetryCommand {
    let pub_sub = match &client.pub_sub {
        Some(PubSub::Publishing(publishing)) => Some(PubSub::Publishing(Publishing {
            topics: publishing.topics.clone(),
            max_body_size: i32::try_from(max_body_bytes).unwrap_or(i32::MAX),
            validate_message_type: true,
        })),
        Some(PubSub::Subscription(subscription)) => Some(PubSub::Subscription(Subscription {
            group: subscription.group.clone(),
            subscriptions: subscription.subscriptions.clone(),
            fifo: Some(false),
            receive_batch_size: Some(RECEIVE_BATCH_SIZE),
            long_polling_timeout: Some(duration(LONG_POLLING_TIMEOUT)),
            lite_subscription_quota: None,
            max_lite_topic_size: None,
        })),
        None => None,
    };
    // A consumer's: the redelivery back-off after a failed consume. RocketMQ's levels.
    let redelivery = RetryPolicy {
        max_attempts: DEFAULT_MAX_DELIVERY_ATTEMPTS,
        strategy: Some(retry_policy::Strategy::CustomizedBackoff(CustomizedBackoff {
            next: RETRY_BACKOFF_SECONDS.iter().map(|s| duration(Duration::from_secs(*s as u64))).collect(),
        })),
    };
    // A producer's: how it retries a send. Clients require an exponential one (the Node.js
    // client asserts it); the client's own when it sent one, else RocketMQ's default.
    let resend = match &client.backoff_policy {
        Some(p) if matches!(p.strategy, Some(retry_policy::Strategy::ExponentialBackoff(_))) => p.clone(),
        other => RetryPolicy {
            max_attempts: other.as_ref().map_or(3, |p| p.max_attempts.max(1)),
            strategy: Some(retry_policy::Strategy::ExponentialBackoff(ExponentialBackoff {
                initial: Some(duration(Duration::from_millis(10))),
                max: Some(duration(Duration::from_secs(1))),
                multiplier: 2.0,
            })),
        },
    };
    let settings = proto::Settings {
        client_type: client.client_type,
        access_point: client.access_point.clone(),
        backoff_policy: Some(match &client.pub_sub {
            Some(PubSub::Subscription(_)) => redelivery,
            _ => resend,
        }),
        request_timeout: client.request_timeout,
        pub_sub,
        user_agent: client.user_agent.clone(),
        metric: Some(proto::Metric { on: false, endpoints: None }),
        client_properties: Default::default(),
    };
    TelemetryCommand { status: Some(status::ok()), command: Some(telemetry_command::Command::Settings(settings)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_producer_learns_the_body_limit_and_a_consumer_the_polling_and_backoff() {
        let producer = proto::Settings {
            pub_sub: Some(PubSub::Publishing(Publishing {
                topics: vec![],
                max_body_size: 0,
                validate_message_type: false,
            })),
            ..Default::default()
        };
        let Some(telemetry_command::Command::Settings(answer)) = answer(&producer, 1 << 22).command else {
            panic!("no settings in the answer")
        };
        let Some(PubSub::Publishing(publishing)) = answer.pub_sub else { panic!("no publishing settings") };
        assert_eq!(publishing.max_body_size, 1 << 22);
        let strategy = answer.backoff_policy.and_then(|p| p.strategy);
        assert!(matches!(strategy, Some(retry_policy::Strategy::ExponentialBackoff(_))), "{strategy:?}");

        let consumer =
            proto::Settings { pub_sub: Some(PubSub::Subscription(Subscription::default())), ..Default::default() };
        let Some(telemetry_command::Command::Settings(answer)) = super::answer(&consumer, 1).command else {
            panic!("no settings in the answer")
        };
        let Some(PubSub::Subscription(subscription)) = answer.pub_sub else { panic!("no subscription settings") };
        assert_eq!(subscription.long_polling_timeout.map(|d| d.seconds), Some(20));
        assert_eq!(answer.backoff_policy.map(|p| p.max_attempts), Some(DEFAULT_MAX_DELIVERY_ATTEMPTS));
    }
}
