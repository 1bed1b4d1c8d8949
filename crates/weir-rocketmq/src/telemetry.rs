//! The Telemetry stream: a client opens it at start-up and sends its settings; the server
//! answers each with its own (status OK), which the client applies: the largest body it may
//! send, whether to check message types against the route, and for consumers the long-polling
//! timeout, the batch size, FIFO delivery and the retry back-off.

use std::time::Duration;

use weir_broker::group_config::{GroupSettings, RetryBackoff};

use crate::proto::{
    self, retry_policy, settings::PubSub, telemetry_command, CustomizedBackoff, ExponentialBackoff, Publishing,
    RetryPolicy, Subscription, TelemetryCommand,
};
use crate::status;

/// How long a consumer's receive waits for messages (the client adds its request timeout).
pub(crate) const LONG_POLLING_TIMEOUT: Duration = Duration::from_secs(20);

/// Messages a push consumer asks for in one receive.
pub(crate) const RECEIVE_BATCH_SIZE: i32 = 32;

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

/// What the server answers to a client's settings. `max_body_bytes` is the largest body the
/// client's topics take; `group` holds the settings of a consumer's group (FIFO delivery, the
/// attempts and the redelivery back-off).
pub(crate) fn answer(client: &proto::Settings, max_body_bytes: usize, group: GroupSettings) -> TelemetryCommand {
    let pub_sub = match &client.pub_sub {
        Some(PubSub::Publishing(publishing)) => Some(PubSub::Publishing(Publishing {
            topics: publishing.topics.clone(),
            max_body_size: i32::try_from(max_body_bytes).unwrap_or(i32::MAX),
            validate_message_type: true,
        })),
        Some(PubSub::Subscription(subscription)) => Some(PubSub::Subscription(Subscription {
            group: subscription.group.clone(),
            subscriptions: subscription.subscriptions.clone(),
            fifo: Some(group.fifo),
            receive_batch_size: Some(RECEIVE_BATCH_SIZE),
            long_polling_timeout: Some(duration(LONG_POLLING_TIMEOUT)),
            lite_subscription_quota: None,
            max_lite_topic_size: None,
        })),
        None => None,
    };
    // A consumer's: the group's deliveries and its redelivery back-off after a failed consume.
    let redelivery = RetryPolicy {
        max_attempts: i32::try_from(group.max_delivery_attempts).unwrap_or(i32::MAX),
        strategy: Some(match group.retry_backoff {
            RetryBackoff::Customized(waits) => retry_policy::Strategy::CustomizedBackoff(CustomizedBackoff {
                next: waits.into_iter().map(duration).collect(),
            }),
            RetryBackoff::Exponential { initial, max, multiplier } => {
                retry_policy::Strategy::ExponentialBackoff(ExponentialBackoff {
                    initial: Some(duration(initial)),
                    max: Some(duration(max)),
                    multiplier: multiplier as f32,
                })
            }
        }),
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
        let Some(telemetry_command::Command::Settings(answer)) =
            answer(&producer, 1 << 22, GroupSettings::default()).command
        else {
            panic!("no settings in the answer")
        };
        let Some(PubSub::Publishing(publishing)) = answer.pub_sub else { panic!("no publishing settings") };
        assert_eq!(publishing.max_body_size, 1 << 22);
        let strategy = answer.backoff_policy.and_then(|p| p.strategy);
        assert!(matches!(strategy, Some(retry_policy::Strategy::ExponentialBackoff(_))), "{strategy:?}");

        let consumer =
            proto::Settings { pub_sub: Some(PubSub::Subscription(Subscription::default())), ..Default::default() };
        let Some(telemetry_command::Command::Settings(answer)) =
            super::answer(&consumer, 1, GroupSettings::default()).command
        else {
            panic!("no settings in the answer")
        };
        let Some(PubSub::Subscription(subscription)) = answer.pub_sub else { panic!("no subscription settings") };
        assert_eq!(subscription.long_polling_timeout.map(|d| d.seconds), Some(20));
        assert_eq!(subscription.fifo, Some(false));
        let policy = answer.backoff_policy.expect("a back-off");
        assert_eq!(policy.max_attempts, 17);
        let Some(retry_policy::Strategy::CustomizedBackoff(backoff)) = policy.strategy else { panic!("customized") };
        assert_eq!(backoff.next.len(), 18);
        assert_eq!(backoff.next.last().map(|d| d.seconds), Some(7200));
    }

    #[test]
    fn a_consumer_learns_its_groups_settings() {
        let consumer =
            proto::Settings { pub_sub: Some(PubSub::Subscription(Subscription::default())), ..Default::default() };
        let group = GroupSettings {
            fifo: true,
            broadcast: false,
            max_delivery_attempts: 3,
            retry_backoff: RetryBackoff::Exponential {
                initial: Duration::from_millis(250),
                max: Duration::from_secs(4),
                multiplier: 2.0,
            },
            ..GroupSettings::default()
        };
        let Some(telemetry_command::Command::Settings(answer)) = super::answer(&consumer, 1, group).command else {
            panic!("no settings in the answer")
        };
        let Some(PubSub::Subscription(subscription)) = answer.pub_sub else { panic!("no subscription settings") };
        assert_eq!(subscription.fifo, Some(true));
        let policy = answer.backoff_policy.expect("a back-off");
        assert_eq!(policy.max_attempts, 3);
        let Some(retry_policy::Strategy::ExponentialBackoff(backoff)) = policy.strategy else { panic!("exponential") };
        assert_eq!(backoff.initial.map(|d| d.nanos), Some(250_000_000));
        assert_eq!(backoff.max.map(|d| d.seconds), Some(4));
    }
}
