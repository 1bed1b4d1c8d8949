//! Replication throttles on this broker: the two byte budgets (leader and follower side) that
//! throttled replicas draw on, with the rates the metadata gives this broker. What a throttle is
//! and how a change is decided is the controller's ([`weir_controller::throttle`], re-exported
//! here); the rates are changed through it by [`crate::broker_configs`].

use std::sync::Mutex;
use std::time::Instant;

pub use weir_controller::throttle::*;
use weir_storage::sync::lock;

use crate::metadata::MetadataState;

/// This broker's two budgets, with the rates the metadata gives it.
#[derive(Debug, Default)]
pub(crate) struct ReplicationQuotas {
    /// What this broker, leading, sends to throttled followers.
    pub leader: Quota,
    /// What this broker, following, fetches for its throttled replicas.
    pub follower: Quota,
}

impl ReplicationQuotas {
    pub(crate) fn update(&self, state: &MetadataState, node: i32) {
        self.leader.set_rate(rate_for(&state.broker_configs, node, LEADER_RATE));
        self.follower.set_rate(rate_for(&state.broker_configs, node, FOLLOWER_RATE));
    }
}

/// A byte budget that refills at a rate (a token bucket holding at most one second of it).
/// Without a rate it is never exceeded.
#[derive(Debug)]
pub(crate) struct Quota {
    bucket: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    rate: Option<u64>,
    /// Bytes that may still go; negative once overdrawn (the last transfer went past it).
    tokens: f64,
    refilled: Instant,
}

impl Default for Quota {
    fn default() -> Quota {
        Quota { bucket: Mutex::new(Bucket { rate: None, tokens: 0.0, refilled: Instant::now() }) }
    }
}

impl Quota {
    pub(crate) fn set_rate(&self, rate: Option<u64>) {
        let mut bucket = lock(&self.bucket);
        if bucket.rate != rate {
            *bucket = Bucket { rate, tokens: rate.unwrap_or(0) as f64, refilled: Instant::now() };
        }
    }

    /// Does a rate limit this budget at all? Without one nothing is throttled, and callers need
    /// not count what throttled replicas transfer.
    pub(crate) fn is_limited(&self) -> bool {
        lock(&self.bucket).rate.is_some()
    }

    /// Is the budget spent (throttled replicas must wait)?
    pub fn exceeded(&self) -> bool {
        let mut bucket = lock(&self.bucket);
        bucket.refill();
        bucket.rate.is_some() && bucket.tokens < 0.0
    }

    /// `bytes` went to throttled replicas.
    pub fn record(&self, bytes: u64) {
        let mut bucket = lock(&self.bucket);
        if bucket.rate.is_some() {
            bucket.refill();
            bucket.tokens -= bytes as f64;
        }
    }
}

impl Bucket {
    fn refill(&mut self) {
        let Some(rate) = self.rate else { return };
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.tokens = (self.tokens + elapsed * rate as f64).min(rate as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spent_budget_refills_at_the_rate() {
        let quota = Quota::default();
        quota.record(u64::MAX / 2);
        assert!(!quota.exceeded(), "no rate, no limit");
        quota.set_rate(Some(1_000_000));
        quota.record(1_500_000);
        assert!(quota.exceeded(), "1.5 MB against a 1 MB/s budget");
        std::thread::sleep(std::time::Duration::from_millis(700));
        assert!(!quota.exceeded(), "0.7 s refilled 0.7 MB");
        quota.set_rate(None);
        quota.record(u64::MAX / 2);
        assert!(!quota.exceeded());
    }
}
