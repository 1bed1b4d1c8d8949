//! How client quotas bite on the Kafka protocol (KIP-219). A request of a client with a quota
//! is charged: its bytes (Produce's request, Fetch's response) and the time the broker spent on
//! it. Over a quota, the response says how long to wait (`throttle_time_ms`) and the
//! connection is muted for that long: nothing more is read from it. A client too old to wait on
//! its own (a version before KIP-219's) gets its response only once the time has passed.
//!
//! The time a request costs is the time its handling future spent being polled: the broker's
//! work on it, not the waits (a long poll, the other members of a rebalance, an fsync). That is
//! what Kafka's request-handler thread time measures, in an async broker.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use kafka_protocol::messages::ApiKey;
use weir_broker::quotas::{quota_user, request_time_value, QuotaKind};

use crate::context::{Client, Ctx};

/// What a handled request costs its client: built for a request when any client quota is set,
/// filled in as the request is handled, read when its response goes out.
#[derive(Debug, Default)]
pub(crate) struct Charge {
    /// Time spent polling the request's handling so far (see [`Timed`]), and when the poll
    /// under way began (nanoseconds since `origin`; 0: none).
    polled_nanos: AtomicU64,
    poll_started_nanos: AtomicU64,
    origin: OnceLock<Instant>,
    /// (user, client id), once the header is read; unset for requests exempt from quotas.
    who: OnceLock<(String, String)>,
    /// The longest throttle decided for this request, in milliseconds.
    throttle_ms: AtomicU64,
    /// The request time has been counted (it is counted once, when the response is built).
    time_counted: AtomicBool,
    /// See [`Charge::exempt`].
    exempt: AtomicBool,
}

impl Charge {
    /// A charge for a request on a broker with client quotas; `None` without any.
    pub(crate) fn for_request(ctx: &Ctx) -> Option<Arc<Charge>> {
        ctx.broker.client_quotas.any_client_quota().then(|| {
            let charge = Charge::default();
            let _ = charge.origin.set(Instant::now());
            Arc::new(charge)
        })
    }

    /// Names the client once its header is read.
    pub(crate) fn identify(&self, client: &Client) {
        let _ = self.who.set((quota_user(&client.principal).to_string(), client.client_id.clone()));
    }

    /// Exempts the request from every quota: a follower's fetch on a cluster's inter-broker
    /// listener (replication has its own throttles), as Kafka exempts requests authorized by
    /// CLUSTER_ACTION.
    pub(crate) fn exempt(&self) {
        self.exempt.store(true, Ordering::Release);
    }

    fn quota(&self, ctx: &Ctx, kind: QuotaKind, value: f64) {
        if self.exempt.load(Ordering::Acquire) {
            return;
        }
        if let Some((user, client_id)) = self.who.get() {
            let throttle = ctx.broker.client_quotas.record(kind, user, client_id, value);
            self.throttle_ms.fetch_max(throttle.as_millis() as u64, Ordering::AcqRel);
        }
    }

    /// Counts a produce request's bytes.
    pub(crate) fn produced(&self, ctx: &Ctx, bytes: usize) {
        self.quota(ctx, QuotaKind::Produce, bytes as f64);
    }

    /// Counts a fetch response's bytes.
    pub(crate) fn fetched(&self, ctx: &Ctx, bytes: u64) {
        self.quota(ctx, QuotaKind::Fetch, bytes as f64);
    }

    /// May the request create or delete `partitions` partitions under the client's
    /// controller_mutation_rate (KIP-599)? A `strict` request (CreateTopics v6+,
    /// CreatePartitions v3+, DeleteTopics v5+) is refused while the client is over its quota;
    /// an older one always goes ahead and is throttled after.
    pub(crate) fn mutation_allowed(&self, ctx: &Ctx, partitions: i64, strict: bool) -> bool {
        let Some((user, client_id)) = self.who.get() else {
            return true;
        };
        let quotas = &ctx.broker.client_quotas;
        if strict {
            if let Some(wait) = quotas.exceeded(QuotaKind::ControllerMutation, user, client_id) {
                self.throttle_ms.fetch_max(wait.as_millis() as u64, Ordering::AcqRel);
                return false;
            }
            quotas.record(QuotaKind::ControllerMutation, user, client_id, partitions.max(0) as f64);
        } else {
            self.quota(ctx, QuotaKind::ControllerMutation, partitions.max(0) as f64);
        }
        true
    }

    /// The most a fetch may ask for under the client's consumer_byte_rate (what one window of
    /// the quota allows), or `None` without one.
    pub(crate) fn fetch_limit(&self, ctx: &Ctx) -> Option<u64> {
        if self.exempt.load(Ordering::Acquire) {
            return None;
        }
        let (user, client_id) = self.who.get()?;
        let most = ctx.broker.client_quotas.max_in_window(QuotaKind::Fetch, user, client_id)?;
        Some(most.max(1.0) as u64)
    }

    /// Counts the request's time so far (once) and answers the throttle to put in its
    /// response, in milliseconds.
    pub(crate) fn throttle_time_ms(&self, ctx: &Ctx) -> i32 {
        if !self.time_counted.swap(true, Ordering::AcqRel) {
            self.quota(ctx, QuotaKind::Request, request_time_value(self.polled()));
        }
        self.decided_throttle_ms()
    }

    /// The throttle decided so far, in milliseconds (what a response built after the request
    /// was handled carries).
    pub(crate) fn decided_throttle_ms(&self) -> i32 {
        self.throttle_ms.load(Ordering::Acquire).min(i32::MAX as u64) as i32
    }

    /// The throttle decided for this request once it is handled (its time counted if no
    /// response carried it).
    pub(crate) fn throttle(&self, ctx: &Ctx) -> Duration {
        Duration::from_millis(self.throttle_time_ms(ctx).max(0) as u64)
    }

    fn polled(&self) -> Duration {
        let mut nanos = self.polled_nanos.load(Ordering::Acquire);
        let started = self.poll_started_nanos.load(Ordering::Acquire);
        if started != 0 {
            nanos += self.nanos_now().saturating_sub(started);
        }
        Duration::from_nanos(nanos)
    }

    fn nanos_now(&self) -> u64 {
        let origin = *self.origin.get_or_init(Instant::now);
        // Never 0: that means "no poll under way".
        (origin.elapsed().as_nanos() as u64).max(1)
    }
}

/// A future whose polls are timed into a [`Charge`].
pub(crate) struct Timed<F> {
    inner: Pin<Box<F>>,
    charge: Arc<Charge>,
}

impl<F> Timed<F> {
    pub(crate) fn new(inner: F, charge: Arc<Charge>) -> Timed<F> {
        Timed { inner: Box::pin(inner), charge }
    }
}

impl<F: Future> Future for Timed<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let charge = self.charge.clone();
        let started = charge.nanos_now();
        charge.poll_started_nanos.store(started, Ordering::Release);
        let result = self.inner.as_mut().poll(cx);
        let spent = charge.nanos_now().saturating_sub(started);
        charge.poll_started_nanos.store(0, Ordering::Release);
        charge.polled_nanos.fetch_add(spent, Ordering::AcqRel);
        result
    }
}

/// How a throttled client is made to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Throttle {
    pub(crate) delay: Duration,
    /// The client waits on its own (KIP-219): the response goes now, and the connection is
    /// muted. Otherwise the response is held back for `delay`.
    pub(crate) client_waits: bool,
}

/// Does a client of this API and version wait out the throttle time itself (Kafka's
/// `shouldClientThrottle`)? Versions before KIP-219's, and APIs Kafka lists none for, do not.
pub(crate) fn client_waits(api_key: ApiKey, version: i16) -> bool {
    use ApiKey::*;
    let since = match api_key {
        AlterPartitionReassignments
        | ListPartitionReassignments
        | AlterUserScramCredentials
        | DescribeUserScramCredentials
        | ElectLeaders
        | UnregisterBroker
        | IncrementalAlterConfigs
        | OffsetDelete => 0,
        AddOffsetsToTxn | AddPartitionsToTxn | AlterConfigs | CreateAcls | CreatePartitions | DeleteAcls
        | DeleteGroups | DeleteRecords | DescribeAcls | DescribeLogDirs | EndTxn | InitProducerId | TxnOffsetCommit => {
            1
        }
        ApiVersions | DeleteTopics | DescribeConfigs | DescribeGroups | FindCoordinator | Heartbeat | LeaveGroup
        | ListGroups | SyncGroup => 2,
        CreateTopics | JoinGroup | ListOffsets => 3,
        OffsetCommit | OffsetFetch => 4,
        Metadata | Produce => 6,
        Fetch => 8,
        _ => return false,
    };
    version >= since
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kip_219_versions_are_kafkas() {
        assert!(!client_waits(ApiKey::Produce, 5) && client_waits(ApiKey::Produce, 6));
        assert!(!client_waits(ApiKey::Fetch, 7) && client_waits(ApiKey::Fetch, 8));
        assert!(client_waits(ApiKey::IncrementalAlterConfigs, 0));
        assert!(!client_waits(ApiKey::ConsumerGroupHeartbeat, 1));
    }

    #[tokio::test]
    async fn a_timed_future_counts_its_polls_not_its_waits() {
        let charge = Arc::new(Charge::default());
        let work = async {
            std::thread::sleep(Duration::from_millis(20));
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        Timed::new(work, charge.clone()).await;
        let polled = charge.polled();
        assert!(polled >= Duration::from_millis(20) && polled < Duration::from_millis(150), "{polled:?}");
    }
}
