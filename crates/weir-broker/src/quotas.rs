//! Client quotas on this broker (Kafka's `ClientQuotaManager`): which quota applies to a client,
//! the rates each client has used, and how long a client over its quota must wait.
//!
//! The quotas are the metadata's (set through the controller, [`weir_controller::quotas`]).
//! Each applies per broker, as Kafka's do. For each kind (produce bytes, fetch bytes, request
//! time) the quota of a (user, client id) is the first of Kafka's eight that exists:
//! `user+client-id`, `user+<default> client-id`, `user`, `<default> user+client-id`,
//! `<default> user+<default> client-id`, `<default> user`, `client-id`, `<default> client-id`.
//! Clients share one rate when the quota that applies to them names them together: a quota on
//! a user is one rate for all of that user's clients; a default quota gives each user (or
//! client id) a rate of its own.
//!
//! A rate is measured as Kafka measures it: over `quota.window.num` samples of
//! `quota.window.size.seconds`, counting at least `num - 1` whole samples of time, so a new
//! client may send up to `(num - 1) * size` seconds' worth at once. Over the quota, the client
//! waits `(rate - quota) / quota * measured window`: how long it takes for the rate to come back
//! to the quota if it sends nothing more. The front-ends make it wait (Kafka: the throttle time
//! in the response and a muted connection; RocketMQ: TOO_MANY_REQUESTS until then).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use weir_metadata::quota::{
    EntityName, QuotaEntity, QuotaFilter, CONNECTION_CREATION_RATE, CONSUMER_BYTE_RATE, CONTROLLER_MUTATION_RATE,
    PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE,
};
use weir_storage::sync::{lock, read, write};

use crate::broker::Broker;
use crate::cluster::{ControlAnswer, ControlRequest};
use crate::error::BrokerError;
use crate::metadata::MetadataState;

pub use weir_controller::quotas::{filter, QuotaAlteration, MAX_NAME};

/// What a quota limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuotaKind {
    /// Bytes of produce requests per second (`producer_byte_rate`).
    Produce,
    /// Bytes of fetch responses per second (`consumer_byte_rate`).
    Fetch,
    /// Percent of one thread's time spent on the client's requests (`request_percentage`).
    Request,
    /// Partitions created or deleted per second (`controller_mutation_rate`, KIP-599).
    ControllerMutation,
    /// New connections per second from one address (`connection_creation_rate`).
    Connection,
}

impl QuotaKind {
    pub const ALL: [QuotaKind; 5] = [
        QuotaKind::Produce,
        QuotaKind::Fetch,
        QuotaKind::Request,
        QuotaKind::ControllerMutation,
        QuotaKind::Connection,
    ];
    /// The kinds a user or client-id quota sets (the others are IP quotas).
    const CLIENT_KINDS: usize = 4;

    /// The quota's key (Kafka's name).
    pub fn key(self) -> &'static str {
        match self {
            QuotaKind::Produce => PRODUCER_BYTE_RATE,
            QuotaKind::Fetch => CONSUMER_BYTE_RATE,
            QuotaKind::Request => REQUEST_PERCENTAGE,
            QuotaKind::ControllerMutation => CONTROLLER_MUTATION_RATE,
            QuotaKind::Connection => CONNECTION_CREATION_RATE,
        }
    }

    /// A short name, for metrics.
    pub fn name(self) -> &'static str {
        match self {
            QuotaKind::Produce => "produce",
            QuotaKind::Fetch => "fetch",
            QuotaKind::Request => "request",
            QuotaKind::ControllerMutation => "controller_mutation",
            QuotaKind::Connection => "connection",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The value a request's thread time counts for against `request_percentage`: percent of one
/// thread for one second (Kafka's `nanosToPercentage`).
pub fn request_time_value(time: Duration) -> f64 {
    time.as_secs_f64() * 100.0
}

/// A future and the time its polls took (not the time it waited between them): what a call
/// counts against `request_percentage`, so that a long poll's wait is not work.
pub struct PollTimed<F> {
    inner: std::pin::Pin<Box<F>>,
    spent: Duration,
}

/// `work`, timed as [`PollTimed`] says.
pub fn poll_timed<F: std::future::Future>(work: F) -> PollTimed<F> {
    PollTimed { inner: Box::pin(work), spent: Duration::ZERO }
}

impl<F: std::future::Future> std::future::Future for PollTimed<F> {
    type Output = (F::Output, Duration);

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let started = Instant::now();
        let polled = self.inner.as_mut().poll(cx);
        self.spent += started.elapsed();
        polled.map(|output| (output, self.spent))
    }
}

/// The client quotas in force on this broker and the rates clients have used.
#[derive(Debug)]
pub struct ClientQuotas {
    window: Duration,
    samples: u32,
    /// Any user or client-id quota (the request paths skip everything without one).
    clients: AtomicBool,
    /// Any IP quota.
    addresses: AtomicBool,
    limits: RwLock<Arc<Limits>>,
    /// Rates by kind and the names the quota that applies counts together.
    sensors: Mutex<HashMap<SensorKey, Sensor>>,
    /// Per kind: how many times a client was throttled, and for how long in all (ms).
    throttles: [AtomicU64; 5],
    throttle_ms: [AtomicU64; 5],
}

/// The quotas of the metadata, by kind.
#[derive(Debug, Default, PartialEq)]
struct Limits {
    /// Produce, fetch, request and controller mutation quotas, by user then client id.
    clients: [ByUser; QuotaKind::CLIENT_KINDS],
    /// Connection quotas by address (`Default`: every address without its own).
    addresses: HashMap<EntityName, f64>,
}

/// Quotas by their user component: a name, the default, or none. Looked up with borrowed
/// names, so finding a client's quota allocates nothing.
#[derive(Debug, Default, PartialEq)]
struct ByUser {
    named: HashMap<String, ByClient>,
    default: ByClient,
    none: ByClient,
}

/// Quotas by their client-id component, under one user component.
#[derive(Debug, Default, PartialEq)]
struct ByClient {
    named: HashMap<String, f64>,
    default: Option<f64>,
    none: Option<f64>,
}

impl ByUser {
    fn is_empty(&self) -> bool {
        self.named.is_empty() && self.default.is_empty() && self.none.is_empty()
    }

    fn insert(&mut self, user: &Option<EntityName>, client_id: &Option<EntityName>, limit: f64) {
        let by_client = match user {
            Some(EntityName::Named(name)) => self.named.entry(name.clone()).or_default(),
            Some(EntityName::Default) => &mut self.default,
            None => &mut self.none,
        };
        match client_id {
            Some(EntityName::Named(name)) => {
                by_client.named.insert(name.clone(), limit);
            }
            Some(EntityName::Default) => by_client.default = Some(limit),
            None => by_client.none = Some(limit),
        }
    }
}

impl ByClient {
    fn is_empty(&self) -> bool {
        self.named.is_empty() && self.default.is_none() && self.none.is_none()
    }

    fn named(&self, client_id: &str) -> Option<f64> {
        // An empty client id never names an entity (Kafka refuses empty names).
        if client_id.is_empty() {
            return None;
        }
        self.named.get(client_id).copied()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SensorKey {
    kind: QuotaKind,
    user: String,
    client_id: String,
}

/// One rate (Kafka's `Rate` over a `SampledStat`): samples of `window` each, newest last.
#[derive(Debug)]
struct Sensor {
    samples: VecDeque<Sample>,
    /// The end of the last throttle this rate caused.
    throttled_until: Option<Instant>,
    last_used: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    start: Instant,
    last_event: Instant,
    value: f64,
}

/// Sensors beyond this many are swept of idle ones (Kafka expires a client's sensors after an
/// hour without use).
const SENSORS_BEFORE_SWEEP: usize = 4096;
const SENSOR_IDLE: Duration = Duration::from_secs(3600);

impl ClientQuotas {
    pub fn new(window_num: u32, window_size_seconds: u32) -> ClientQuotas {
        ClientQuotas {
            window: Duration::from_secs(u64::from(window_size_seconds.max(1))),
            samples: window_num.max(1),
            clients: AtomicBool::new(false),
            addresses: AtomicBool::new(false),
            limits: RwLock::new(Arc::new(Limits::default())),
            sensors: Mutex::new(HashMap::new()),
            throttles: Default::default(),
            throttle_ms: Default::default(),
        }
    }

    /// Takes the quotas of `state`.
    pub(crate) fn update(&self, state: &MetadataState) {
        let mut limits = Limits::default();
        for (entity, values) in &state.client_quotas {
            for (key, value) in values {
                if let Some(ip) = &entity.ip {
                    if key == CONNECTION_CREATION_RATE {
                        limits.addresses.insert(ip.clone(), *value);
                    }
                    continue;
                }
                let kind = QuotaKind::ALL[..QuotaKind::CLIENT_KINDS].iter().find(|kind| kind.key() == key);
                if let Some(kind) = kind {
                    limits.clients[kind.index()].insert(&entity.user, &entity.client_id, *value);
                }
            }
        }
        if **read(&self.limits) == limits {
            return;
        }
        self.clients.store(limits.clients.iter().any(|m| !m.is_empty()), Ordering::Release);
        self.addresses.store(!limits.addresses.is_empty(), Ordering::Release);
        *write(&self.limits) = Arc::new(limits);
        // A rate measured against an old quota starts again (its throttle may no longer apply).
        lock(&self.sensors).clear();
    }

    /// Is any user or client-id quota set? Without one the request paths record nothing.
    pub fn any_client_quota(&self) -> bool {
        self.clients.load(Ordering::Acquire)
    }

    /// Is any connection-rate quota set?
    pub fn any_address_quota(&self) -> bool {
        self.addresses.load(Ordering::Acquire)
    }

    /// The quota of `kind` that applies to `user` (a principal's name, `ANONYMOUS` without
    /// one) and `client_id`, and the names it counts together; `None` when none applies.
    fn applicable(&self, kind: QuotaKind, user: &str, client_id: &str) -> Option<(f64, SensorKey)> {
        let limits = read(&self.limits).clone();
        let key = |user: &str, client_id: &str| SensorKey { kind, user: user.into(), client_id: client_id.into() };
        if kind == QuotaKind::Connection {
            let limit = limits
                .addresses
                .get(&EntityName::Named(user.to_string()))
                .or_else(|| limits.addresses.get(&EntityName::Default))?;
            return Some((*limit, key(user, "")));
        }
        let quotas = &limits.clients[kind.index()];
        let user_quotas = quotas.named.get(user);
        // (limit, whether the quota names the user, whether it names the client id), in Kafka's
        // order; the names a quota carries are the ones it counts together.
        let found = user_quotas
            .and_then(|q| q.named(client_id).map(|l| (l, true, true)))
            .or_else(|| user_quotas.and_then(|q| q.default).map(|l| (l, true, true)))
            .or_else(|| user_quotas.and_then(|q| q.none).map(|l| (l, true, false)))
            .or_else(|| quotas.default.named(client_id).map(|l| (l, true, true)))
            .or_else(|| quotas.default.default.map(|l| (l, true, true)))
            .or_else(|| quotas.default.none.map(|l| (l, true, false)))
            .or_else(|| quotas.none.named(client_id).map(|l| (l, false, true)))
            .or_else(|| quotas.none.default.map(|l| (l, false, true)));
        let (limit, by_user, by_client) = found?;
        Some((limit, key(if by_user { user } else { "" }, if by_client { client_id } else { "" })))
    }

    /// Counts `value` against the quota of `kind` that applies to the client and answers how
    /// long the client must now wait (zero when it is within its quota, or has none). For
    /// [`QuotaKind::Connection`], `user` is the address.
    pub fn record(&self, kind: QuotaKind, user: &str, client_id: &str, value: f64) -> Duration {
        let Some((limit, key)) = self.applicable(kind, user, client_id) else {
            return Duration::ZERO;
        };
        let now = Instant::now();
        let mut sensors = lock(&self.sensors);
        if sensors.len() >= SENSORS_BEFORE_SWEEP {
            sensors.retain(|_, sensor| now.duration_since(sensor.last_used) < SENSOR_IDLE);
        }
        let sensor = sensors.entry(key).or_insert_with(|| Sensor {
            samples: VecDeque::new(),
            throttled_until: None,
            last_used: now,
        });
        sensor.last_used = now;
        self.record_sample(sensor, value, now);
        let throttle = self.over(kind, sensor, limit, now);
        if !throttle.is_zero() {
            sensor.throttled_until = Some(now + throttle);
            self.throttles[kind.index()].fetch_add(1, Ordering::Relaxed);
            self.throttle_ms[kind.index()].fetch_add(throttle.as_millis() as u64, Ordering::Relaxed);
        }
        throttle
    }

    /// Is the client over its quota of `kind` already, before it counts anything more? Then
    /// how long it must wait (KIP-599's strict check: a mutation over the quota is refused, not
    /// made and throttled).
    pub fn exceeded(&self, kind: QuotaKind, user: &str, client_id: &str) -> Option<Duration> {
        let (limit, key) = self.applicable(kind, user, client_id)?;
        let now = Instant::now();
        let mut sensors = lock(&self.sensors);
        let sensor = sensors.get_mut(&key)?;
        let throttle = self.over(kind, sensor, limit, now);
        if throttle.is_zero() {
            return None;
        }
        self.throttles[kind.index()].fetch_add(1, Ordering::Relaxed);
        self.throttle_ms[kind.index()].fetch_add(throttle.as_millis() as u64, Ordering::Relaxed);
        Some(throttle)
    }

    /// How long the rate of `sensor` takes to come back to `limit` (zero within it).
    fn over(&self, kind: QuotaKind, sensor: &mut Sensor, limit: f64, now: Instant) -> Duration {
        let (rate, window) = self.measure(sensor, now);
        if rate <= limit {
            return Duration::ZERO;
        }
        let mut throttle = Duration::from_secs_f64((rate - limit) / limit * window.as_secs_f64());
        if matches!(kind, QuotaKind::Request | QuotaKind::Connection) {
            // Kafka bounds a request-time throttle by one sample.
            throttle = throttle.min(self.window);
        }
        Duration::from_millis(throttle.as_millis().min(i32::MAX as u128) as u64)
    }

    /// How long the client is still throttled for `kind` by an earlier [`record`](Self::record)
    /// (for protocols that refuse instead of delaying), or `None`.
    pub fn throttled(&self, kind: QuotaKind, user: &str, client_id: &str) -> Option<Duration> {
        let (_, key) = self.applicable(kind, user, client_id)?;
        let until = lock(&self.sensors).get(&key)?.throttled_until?;
        until.checked_duration_since(Instant::now()).filter(|left| !left.is_zero())
    }

    /// The most `kind` may count in one go without being throttled for certain: a fetch asks
    /// for no more than this (Kafka's `getMaxValueInQuotaWindow`). `None` without a quota.
    pub fn max_in_window(&self, kind: QuotaKind, user: &str, client_id: &str) -> Option<f64> {
        let (limit, _) = self.applicable(kind, user, client_id)?;
        Some(limit * f64::from(self.samples.saturating_sub(1).max(1)) * self.window.as_secs_f64())
    }

    /// How many throttles of `kind` there were, and their total length.
    pub fn throttle_totals(&self, kind: QuotaKind) -> (u64, Duration) {
        let index = kind.index();
        (
            self.throttles[index].load(Ordering::Relaxed),
            Duration::from_millis(self.throttle_ms[index].load(Ordering::Relaxed)),
        )
    }

    fn record_sample(&self, sensor: &mut Sensor, value: f64, now: Instant) {
        self.purge(sensor, now);
        let fresh = match sensor.samples.back() {
            Some(current) => now.duration_since(current.start) >= self.window,
            None => true,
        };
        if fresh {
            sensor.samples.push_back(Sample { start: now, last_event: now, value: 0.0 });
            // One sample more than the window's count: the oldest may overlap its start.
            while sensor.samples.len() > self.samples as usize + 1 {
                sensor.samples.pop_front();
            }
        }
        if let Some(current) = sensor.samples.back_mut() {
            current.value += value;
            current.last_event = now;
        }
    }

    /// Samples with nothing recorded for the whole window no longer count.
    fn purge(&self, sensor: &mut Sensor, now: Instant) {
        let expiry = self.window * self.samples;
        sensor.samples.retain(|s| now.duration_since(s.last_event) < expiry);
    }

    /// The rate (per second) and the time it is measured over.
    fn measure(&self, sensor: &mut Sensor, now: Instant) -> (f64, Duration) {
        self.purge(sensor, now);
        let total: f64 = sensor.samples.iter().map(|s| s.value).sum();
        let oldest = sensor.samples.iter().map(|s| s.start).min().unwrap_or(now);
        let mut elapsed = now.duration_since(oldest);
        let full = (elapsed.as_nanos() / self.window.as_nanos()) as u32;
        let min_full = self.samples - 1;
        if full < min_full {
            elapsed += self.window * (min_full - full);
        }
        let elapsed = elapsed.max(Duration::from_millis(1));
        (total / elapsed.as_secs_f64(), elapsed)
    }
}

/// The user name a principal counts as (`User:alice` is `alice`).
pub fn quota_user(principal: &str) -> &str {
    principal.strip_prefix("User:").unwrap_or(principal)
}

impl Broker {
    /// The client quotas `filter` selects, by entity.
    pub fn describe_client_quotas(
        &self,
        filter: &QuotaFilter,
    ) -> Vec<(QuotaEntity, std::collections::BTreeMap<String, f64>)> {
        let state = self.metadata();
        weir_controller::quotas::describe(&state, filter).map(|(e, v)| (e.clone(), v.clone())).collect()
    }

    /// Sets or removes client quotas through the controller: one outcome per alteration, in
    /// order.
    pub async fn alter_client_quotas(
        self: &Arc<Self>,
        alterations: Vec<QuotaAlteration>,
        validate_only: bool,
    ) -> Result<Vec<Result<(), BrokerError>>, BrokerError> {
        match self.control(ControlRequest::AlterClientQuotas { alterations, validate_only }).await? {
            ControlAnswer::Each(outcomes) => Ok(outcomes),
            other => Err(crate::broker::unexpected_answer(&other)),
        }
    }

    pub(crate) fn decide_alter_client_quotas(
        &self,
        held: &std::sync::MutexGuard<'_, ()>,
        alterations: Vec<QuotaAlteration>,
        validate_only: bool,
    ) -> Result<Vec<Result<(), BrokerError>>, BrokerError> {
        let (records, outcomes) = weir_controller::quotas::decide_alter(&self.metadata(), &alterations, validate_only);
        if !records.is_empty() {
            let count = records.len();
            self.commit(held, records)?;
            tracing::info!(count, "client quotas changed");
        }
        Ok(outcomes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn named(name: &str) -> Option<EntityName> {
        Some(EntityName::Named(name.to_string()))
    }

    fn quotas_with(entries: &[(Option<EntityName>, Option<EntityName>, &str, f64)]) -> ClientQuotas {
        let mut state = MetadataState::default();
        for (user, client_id, key, value) in entries {
            state
                .client_quotas
                .entry(QuotaEntity::user_client(user.clone(), client_id.clone()))
                .or_insert_with(BTreeMap::new)
                .insert(key.to_string(), *value);
        }
        let quotas = ClientQuotas::new(11, 1);
        quotas.update(&state);
        quotas
    }

    fn applies(quotas: &ClientQuotas, user: &str, client_id: &str) -> Option<(f64, String, String)> {
        quotas.applicable(QuotaKind::Produce, user, client_id).map(|(limit, key)| (limit, key.user, key.client_id))
    }

    #[test]
    fn the_most_specific_quota_applies_in_kafkas_order() {
        let every = [
            (named("alice"), named("app"), PRODUCER_BYTE_RATE, 1.0),
            (named("alice"), Some(EntityName::Default), PRODUCER_BYTE_RATE, 2.0),
            (named("alice"), None, PRODUCER_BYTE_RATE, 3.0),
            (Some(EntityName::Default), named("app"), PRODUCER_BYTE_RATE, 4.0),
            (Some(EntityName::Default), Some(EntityName::Default), PRODUCER_BYTE_RATE, 5.0),
            (Some(EntityName::Default), None, PRODUCER_BYTE_RATE, 6.0),
            (None, named("app"), PRODUCER_BYTE_RATE, 7.0),
            (None, Some(EntityName::Default), PRODUCER_BYTE_RATE, 8.0),
        ];
        // Taking the most specific away each time reveals the next.
        for (i, (_, _, _, limit)) in every.iter().enumerate() {
            let quotas = quotas_with(&every[i..]);
            assert_eq!(applies(&quotas, "alice", "app").map(|a| a.0), Some(*limit), "with quotas {i}..");
        }
        // Who shares a rate: a user quota counts all of the user's clients together, a default
        // client-id quota gives each client id its own.
        let quotas = quotas_with(&every[2..3]);
        assert_eq!(applies(&quotas, "alice", "app"), Some((3.0, "alice".into(), String::new())));
        let quotas = quotas_with(&every[7..]);
        assert_eq!(applies(&quotas, "bob", "other"), Some((8.0, String::new(), "other".into())));
        // Another kind's quota does not apply.
        let quotas = quotas_with(&[(None, Some(EntityName::Default), CONSUMER_BYTE_RATE, 1.0)]);
        assert_eq!(applies(&quotas, "alice", "app"), None);
    }

    #[test]
    fn a_client_over_its_rate_waits_until_the_rate_is_back_to_the_quota() {
        let quotas = quotas_with(&[(None, named("app"), PRODUCER_BYTE_RATE, 1000.0)]);
        // A new client is measured over at least ten seconds: 10,000 bytes go unthrottled.
        assert_eq!(quotas.record(QuotaKind::Produce, "u", "app", 10_000.0), Duration::ZERO);
        // 10,000 more make the rate 2,000/s over 10 s: ten seconds bring it back to 1,000/s.
        let throttle = quotas.record(QuotaKind::Produce, "u", "app", 10_000.0);
        assert!((9_900..=10_000).contains(&throttle.as_millis()), "{throttle:?}");
        assert!(quotas.throttled(QuotaKind::Produce, "u", "app").is_some());
        // Other clients are not affected.
        assert_eq!(quotas.record(QuotaKind::Produce, "u", "other", 1e9), Duration::ZERO);
        assert_eq!(quotas.throttle_totals(QuotaKind::Produce).0, 1);
        assert_eq!(quotas.max_in_window(QuotaKind::Produce, "u", "app"), Some(10_000.0));
    }

    #[test]
    fn request_time_throttles_are_bounded_by_one_sample() {
        let quotas = quotas_with(&[(None, Some(EntityName::Default), REQUEST_PERCENTAGE, 1.0)]);
        let throttle = quotas.record(QuotaKind::Request, "u", "c", request_time_value(Duration::from_secs(5)));
        assert_eq!(throttle, Duration::from_secs(1));
    }

    #[test]
    fn a_mutation_is_refused_only_once_the_rate_is_over_the_quota() {
        let quotas = quotas_with(&[(None, named("admin"), CONTROLLER_MUTATION_RATE, 1.0)]);
        // Nothing counted yet, then a burst that takes the rate over: refused only afterwards.
        assert_eq!(quotas.exceeded(QuotaKind::ControllerMutation, "u", "admin"), None);
        quotas.record(QuotaKind::ControllerMutation, "u", "admin", 50.0);
        let wait = quotas.exceeded(QuotaKind::ControllerMutation, "u", "admin").expect("over the quota");
        assert!(wait > Duration::from_secs(30), "{wait:?}");
        assert_eq!(quotas.exceeded(QuotaKind::ControllerMutation, "u", "other"), None);
    }

    #[test]
    fn a_changed_quota_starts_the_rates_again() {
        let quotas = quotas_with(&[(None, named("app"), PRODUCER_BYTE_RATE, 10.0)]);
        assert!(!quotas.record(QuotaKind::Produce, "u", "app", 1e6).is_zero());
        let mut state = MetadataState::default();
        state.client_quotas.insert(
            QuotaEntity::user_client(None, named("app")),
            BTreeMap::from([(PRODUCER_BYTE_RATE.to_string(), 1e9)]),
        );
        quotas.update(&state);
        assert!(quotas.throttled(QuotaKind::Produce, "u", "app").is_none());
        assert!(quotas.record(QuotaKind::Produce, "u", "app", 1e6).is_zero());
        quotas.update(&MetadataState::default());
        assert!(!quotas.any_client_quota());
    }
}
