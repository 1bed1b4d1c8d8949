//! The numbers of a run: counters of messages and bytes over a measured window ([`Flow`]),
//! latency histograms ([`Latency`]), and per-second buckets for the chart ([`Series`]).
//!
//! Every time is in nanoseconds since the run's epoch (the moment all its clients were ready),
//! taken from one monotonic clock in one process, so producers and consumers compare directly.
//! Each thread records into its own values; they are merged once at the end of the run.

use hdrhistogram::Histogram;
use serde::Serialize;

pub const NANOS_PER_SEC: u64 = 1_000_000_000;
/// Largest latency a histogram holds, in microseconds (one hour); longer ones count as this.
const LATENCY_US_MAX: u64 = 3_600_000_000;
/// Buckets of a [`Series`] at most (one day of seconds): later events land in the last one.
pub const SERIES_BUCKETS_MAX: usize = 86_400;

/// Messages and bytes counted from `window_start_ns` on, and when the last of them happened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flow {
    /// Events before this time are not counted (the warm-up).
    pub window_start_ns: u64,
    pub msgs: u64,
    pub bytes: u64,
    pub last_ns: u64,
}

/// A rate over a window: MB = 10^6 bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Rate {
    pub msgs: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub mb_per_s: f64,
    pub msgs_per_s: f64,
}

impl Flow {
    pub fn new(window_start_ns: u64) -> Flow {
        Flow { window_start_ns, ..Flow::default() }
    }

    pub fn record(&mut self, t_ns: u64, bytes: u64) {
        if t_ns < self.window_start_ns {
            return;
        }
        self.msgs += 1;
        self.bytes += bytes;
        self.last_ns = self.last_ns.max(t_ns);
    }

    pub fn merge(&mut self, other: &Flow) {
        debug_assert_eq!(self.window_start_ns, other.window_start_ns, "flows of different windows");
        self.msgs += other.msgs;
        self.bytes += other.bytes;
        self.last_ns = self.last_ns.max(other.last_ns);
    }

    /// The rate from the window's start to the last event: the time the work took. Zero when
    /// nothing happened in the window.
    pub fn rate(&self) -> Rate {
        let seconds = self.last_ns.saturating_sub(self.window_start_ns) as f64 / NANOS_PER_SEC as f64;
        if self.msgs == 0 || seconds <= 0.0 {
            return Rate { msgs: self.msgs, bytes: self.bytes, ..Rate::default() };
        }
        Rate {
            msgs: self.msgs,
            bytes: self.bytes,
            seconds,
            mb_per_s: self.bytes as f64 / 1e6 / seconds,
            msgs_per_s: self.msgs as f64 / seconds,
        }
    }
}

/// A latency histogram in microseconds, 3 significant digits.
#[derive(Debug, Clone)]
pub struct Latency {
    histogram: Histogram<u64>,
}

/// Percentiles of a [`Latency`], in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Default for Latency {
    fn default() -> Latency {
        Latency::with_precision(3)
    }
}

impl Latency {
    /// `significant_digits`: 3 for a run's summary (0.1% error); 2 for the 1-second buckets,
    /// which only feed the chart and are many (about 40 KiB each instead of 350 KiB).
    pub fn with_precision(significant_digits: u8) -> Latency {
        let histogram = Histogram::new_with_bounds(1, LATENCY_US_MAX, significant_digits)
            .expect("constant bounds and 2..=3 significant digits are valid");
        Latency { histogram }
    }

    pub fn record_ns(&mut self, latency_ns: u64) {
        // Below 1 µs counts as 1 µs, above an hour as an hour: saturating_record clamps.
        self.histogram.saturating_record((latency_ns / 1000).max(1));
    }

    pub fn merge(&mut self, other: &Latency) {
        // Same bounds on both sides; add fails only on a value the destination cannot hold.
        if self.histogram.add(&other.histogram).is_err() {
            for value in other.histogram.iter_recorded() {
                self.histogram.saturating_record_n(value.value_iterated_to(), value.count_at_value());
            }
        }
    }

    /// The value at `quantile` (0.0..=1.0) in milliseconds.
    pub fn quantile_ms(&self, quantile: f64) -> f64 {
        self.histogram.value_at_quantile(quantile) as f64 / 1000.0
    }

    /// None when nothing was recorded.
    pub fn percentiles(&self) -> Option<Percentiles> {
        if self.histogram.is_empty() {
            return None;
        }
        Some(Percentiles {
            count: self.histogram.len(),
            mean_ms: self.histogram.mean() / 1000.0,
            p50_ms: self.quantile_ms(0.50),
            p99_ms: self.quantile_ms(0.99),
            p999_ms: self.quantile_ms(0.999),
            max_ms: self.histogram.max() as f64 / 1000.0,
        })
    }
}

/// One second of a run, all of it (warm-up included).
#[derive(Debug, Clone, Default)]
pub struct Bucket {
    pub produced_msgs: u64,
    pub produced_bytes: u64,
    pub consumed_msgs: u64,
    pub consumed_bytes: u64,
    /// End-to-end latencies of the messages received in this second.
    pub e2e: Option<Latency>,
}

/// Per-second buckets, indexed by the second of the event since the run's epoch.
#[derive(Debug, Clone, Default)]
pub struct Series {
    pub buckets: Vec<Bucket>,
}

/// One point of the chart and of the JSON series.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SeriesPoint {
    /// Start of the bucket, seconds since the run's epoch.
    pub t_s: u64,
    /// Seconds the bucket covers: 1, except the last one, which ends with the run's last event.
    pub span_s: f64,
    pub produce_mb_per_s: f64,
    pub consume_mb_per_s: f64,
    pub produce_msgs_per_s: u64,
    pub consume_msgs_per_s: u64,
    /// None for a second in which nothing was received.
    pub e2e_p50_ms: Option<f64>,
    pub e2e_p99_ms: Option<f64>,
    /// The broker's highest VmRSS sampled in this second (with `--broker-pid`), MiB.
    pub broker_rss_mib: Option<f64>,
}

impl SeriesPoint {
    /// The middle of the time the bucket covers, seconds since the run's epoch.
    pub fn middle_s(&self) -> f64 {
        self.t_s as f64 + self.span_s / 2.0
    }
}

impl Series {
    fn bucket(&mut self, t_ns: u64) -> &mut Bucket {
        let index = usize::try_from(t_ns / NANOS_PER_SEC).unwrap_or(usize::MAX).min(SERIES_BUCKETS_MAX - 1);
        if self.buckets.len() <= index {
            self.buckets.resize_with(index + 1, Bucket::default);
        }
        &mut self.buckets[index]
    }

    pub fn record_produced(&mut self, t_ns: u64, bytes: u64) {
        let bucket = self.bucket(t_ns);
        bucket.produced_msgs += 1;
        bucket.produced_bytes += bytes;
    }

    /// A message received at `t_ns`, `latency_ns` after it was (meant to be) sent; None when its
    /// latency means nothing (a catch-up read of old messages).
    pub fn record_consumed(&mut self, t_ns: u64, bytes: u64, latency_ns: Option<u64>) {
        let bucket = self.bucket(t_ns);
        bucket.consumed_msgs += 1;
        bucket.consumed_bytes += bytes;
        if let Some(latency_ns) = latency_ns {
            bucket.e2e.get_or_insert_with(|| Latency::with_precision(2)).record_ns(latency_ns);
        }
    }

    pub fn merge(&mut self, other: &Series) {
        if self.buckets.len() < other.buckets.len() {
            self.buckets.resize_with(other.buckets.len(), Bucket::default);
        }
        for (mine, theirs) in self.buckets.iter_mut().zip(&other.buckets) {
            mine.produced_msgs += theirs.produced_msgs;
            mine.produced_bytes += theirs.produced_bytes;
            mine.consumed_msgs += theirs.consumed_msgs;
            mine.consumed_bytes += theirs.consumed_bytes;
            if let Some(latency) = &theirs.e2e {
                match &mut mine.e2e {
                    Some(existing) => existing.merge(latency),
                    None => mine.e2e = Some(latency.clone()),
                }
            }
        }
    }

    /// The buckets as rates; the last bucket, usually partial, is scaled by its true length
    /// (`end_ns` is the run's last event), at least a millisecond.
    pub fn points(&self, end_ns: u64) -> Vec<SeriesPoint> {
        self.buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let start_ns = i as u64 * NANOS_PER_SEC;
                let covered_ns = end_ns.saturating_sub(start_ns).clamp(NANOS_PER_SEC / 1000, NANOS_PER_SEC);
                let seconds = covered_ns as f64 / NANOS_PER_SEC as f64;
                SeriesPoint {
                    t_s: i as u64,
                    span_s: seconds,
                    produce_mb_per_s: b.produced_bytes as f64 / 1e6 / seconds,
                    consume_mb_per_s: b.consumed_bytes as f64 / 1e6 / seconds,
                    produce_msgs_per_s: (b.produced_msgs as f64 / seconds).round() as u64,
                    consume_msgs_per_s: (b.consumed_msgs as f64 / seconds).round() as u64,
                    e2e_p50_ms: b.e2e.as_ref().map(|l| l.quantile_ms(0.50)),
                    e2e_p99_ms: b.e2e.as_ref().map(|l| l.quantile_ms(0.99)),
                    broker_rss_mib: None,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn flow_counts_only_the_window_and_rates_over_its_length() {
        let mut flow = Flow::new(2 * NANOS_PER_SEC);
        flow.record(NANOS_PER_SEC, 1000); // warm-up: ignored
        for i in 0..1000 {
            flow.record(2 * NANOS_PER_SEC + i * 2 * MS, 1_000_000 / 1000);
        }
        // 1000 messages of 1000 bytes between 2 s and 3.998 s.
        let rate = flow.rate();
        assert_eq!((rate.msgs, rate.bytes), (1000, 1_000_000));
        assert!((rate.seconds - 1.998).abs() < 1e-9, "{rate:?}");
        assert!((rate.mb_per_s - 1.0 / 1.998).abs() < 1e-9, "{rate:?}");
        assert!((rate.msgs_per_s - 1000.0 / 1.998).abs() < 1e-6, "{rate:?}");
    }

    #[test]
    fn flows_merge_and_an_empty_flow_has_no_rate() {
        let mut a = Flow::new(0);
        let mut b = Flow::new(0);
        a.record(NANOS_PER_SEC, 10);
        b.record(4 * NANOS_PER_SEC, 30);
        a.merge(&b);
        assert_eq!(a.rate().mb_per_s, 40.0 / 1e6 / 4.0);
        assert_eq!(Flow::new(5).rate(), Rate::default());
    }

    #[test]
    fn percentiles_of_a_uniform_distribution() {
        let mut latency = Latency::default();
        for ms in 1..=10_000u64 {
            latency.record_ns(ms * MS / 10); // 0.1 ms .. 1000 ms
        }
        let p = latency.percentiles().unwrap();
        assert_eq!(p.count, 10_000);
        // Three significant digits: within 0.1% of the exact order statistic.
        let close = |got: f64, want: f64| (got - want).abs() <= want * 0.001 + 0.001;
        assert!(close(p.p50_ms, 500.0), "{p:?}");
        assert!(close(p.p99_ms, 990.0), "{p:?}");
        assert!(close(p.p999_ms, 999.0), "{p:?}");
        assert!(close(p.max_ms, 1000.0), "{p:?}");
        assert!(close(p.mean_ms, 500.05), "{p:?}");
    }

    #[test]
    fn latency_clamps_and_merges() {
        let mut a = Latency::default();
        a.record_ns(0); // below 1 µs
        a.record_ns(u64::MAX); // above an hour
        let mut b = Latency::with_precision(2);
        b.record_ns(5 * MS);
        a.merge(&b);
        let p = a.percentiles().unwrap();
        assert_eq!(p.count, 3);
        assert!((p.p50_ms - 5.0).abs() < 0.05, "{p:?}");
        assert!(p.max_ms >= 3_600_000.0 * 0.999, "{p:?}");
        assert!(Latency::default().percentiles().is_none());
    }

    #[test]
    fn series_buckets_by_second_and_merges() {
        let mut a = Series::default();
        let mut b = Series::default();
        a.record_produced(100 * MS, 1_000_000);
        a.record_consumed(1500 * MS, 500_000, Some(3 * MS));
        b.record_produced(900 * MS, 1_000_000);
        b.record_consumed(2100 * MS, 500_000, None);
        a.merge(&b);
        // The run ended at 2.5 s: the last bucket covers half a second.
        let points = a.points(2500 * MS);
        assert_eq!(points.len(), 3);
        assert_eq!(points[0].produce_mb_per_s, 2.0);
        assert_eq!(points[0].produce_msgs_per_s, 2);
        assert_eq!((points[0].span_s, points[2].span_s), (1.0, 0.5));
        assert_eq!(points[0].e2e_p99_ms, None);
        assert_eq!(points[1].consume_mb_per_s, 0.5);
        assert!((points[1].e2e_p50_ms.unwrap() - 3.0).abs() < 0.05);
        assert_eq!(points[2].consume_mb_per_s, 1.0);
        assert_eq!(points[2].consume_msgs_per_s, 2);
    }

    #[test]
    fn series_clamps_far_future_events_into_the_last_bucket() {
        let mut s = Series::default();
        s.record_produced(u64::MAX, 1);
        assert_eq!(s.buckets.len(), SERIES_BUCKETS_MAX);
        assert_eq!(s.buckets[SERIES_BUCKETS_MAX - 1].produced_msgs, 1);
    }
}
