//! A latency histogram with fixed buckets, counted with relaxed atomics: the request metrics of
//! the front-ends and the storage engine's fsync latency use the same one, so every latency the
//! broker exposes has the same buckets.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the latency buckets, in nanoseconds: 100 µs to 60 s. The low end
/// resolves a page-cache produce or an in-memory metadata answer; the high end covers long-poll
/// fetches (`max_wait_ms`, 500 ms by default in clients) and JoinGroup, which waits up to the
/// rebalance timeout.
pub const LATENCY_BUCKETS_NANOS: [u64; 18] = [
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
    60_000_000_000,
];

/// A latency histogram with the fixed buckets of [`LATENCY_BUCKETS_NANOS`]. Each observation
/// adds to one bucket (not cumulative: the exposition sums them) and to the sum, so it costs
/// two atomic adds; the count is the sum of the buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    /// `buckets[i]` counts observations in `(bound[i-1], bound[i]]`; the last one is +Inf.
    buckets: [AtomicU64; LATENCY_BUCKETS_NANOS.len() + 1],
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        // The first bucket whose upper bound is >= nanos (Prometheus' `le` is inclusive).
        let index = LATENCY_BUCKETS_NANOS.partition_point(|bound| *bound < nanos);
        self.buckets[index].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Observations per bucket (not cumulative), the +Inf bucket last.
    pub fn bucket_counts(&self) -> [u64; LATENCY_BUCKETS_NANOS.len() + 1] {
        std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed))
    }

    pub fn count(&self) -> u64 {
        self.bucket_counts().iter().sum()
    }

    pub fn sum_seconds(&self) -> f64 {
        self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9
    }

    /// Adds `other`'s observations to this one (summing per-partition histograms at scrape
    /// time).
    pub fn add(&self, other: &Histogram) {
        for (mine, theirs) in self.buckets.iter().zip(&other.buckets) {
            mine.fetch_add(theirs.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.sum_nanos.fetch_add(other.sum_nanos.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}
