//! Consumer-group settings: how a group's RocketMQ consumers are served.
//!
//! A group needs none to exist: a group without settings has the defaults below, RocketMQ's
//! own. Settings are stored in the cluster metadata (one [`MetadataRecord::SetGroupConfigs`]
//! per change, decided by the controller like topic configs) as overrides by name, and read
//! through [`GroupSettings::from_configs`]. Values are validated before they are written, so
//! reading never fails.
//!
//! [`MetadataRecord::SetGroupConfigs`]: weir_metadata::MetadataRecord::SetGroupConfigs

use std::collections::BTreeMap;
use std::time::Duration;

use weir_error::{BrokerError, ErrorKind};
use weir_metadata::{MetadataRecord, MetadataState};

use crate::topic_config::{ConfigEdit, ConfigOp};

/// Whether the group consumes in order: a message group's next message is delivered only after
/// the previous one is acked (RocketMQ's `consumeMessageOrderly`).
pub const FIFO: &str = "consume.fifo";
/// Whether every consumer of the group gets every message, each with its own progress
/// (RocketMQ's broadcasting), rather than sharing them (clustering).
pub const BROADCAST: &str = "consume.broadcast";
/// Deliveries of one message before it goes to the group's dead letters (RocketMQ's
/// `retryMaxTimes` + 1).
pub const MAX_DELIVERY_ATTEMPTS: &str = "max.delivery.attempts";
/// The wait before each redelivery after a failed consume: a list of durations, the n-th before
/// delivery attempt n + 1 (the last repeats), or `exponential:INITIAL,MAX,MULTIPLIER`.
pub const RETRY_BACKOFF: &str = "retry.backoff";
/// Where the group starts on a queue it has no position on yet (RocketMQ's `ConsumeFromWhere`):
/// `CONSUME_FROM_FIRST_OFFSET` (the oldest message the queue still has), `CONSUME_FROM_LAST_OFFSET`
/// (the queue's end: only messages sent after its first receive) or `CONSUME_FROM_TIMESTAMP`
/// (the first message stored at or after [`CONSUME_TIMESTAMP`]).
pub const CONSUME_FROM_WHERE: &str = "consume.from.where";
/// With `CONSUME_FROM_TIMESTAMP`: milliseconds since the epoch, or `-DURATION` for that long
/// before the group's first receive of the queue (RocketMQ's `consumeTimestamp`, half an hour
/// back by default).
pub const CONSUME_TIMESTAMP: &str = "consume.timestamp";

/// Consumer groups of the consumer protocol (KIP-848), with Kafka's group config names: a
/// member without a heartbeat for this long is removed (the broker's
/// `group.consumer.session.timeout.ms` when unset).
pub const CONSUMER_SESSION_TIMEOUT_MS: &str = "consumer.session.timeout.ms";
/// How often a consumer group's members heartbeat (`group.consumer.heartbeat.interval.ms`).
pub const CONSUMER_HEARTBEAT_INTERVAL_MS: &str = "consumer.heartbeat.interval.ms";

/// Share groups (KIP-932), with Kafka's group config names: a member without a heartbeat for
/// this long is removed (the broker's `group.share.session.timeout.ms` when unset).
pub const SHARE_SESSION_TIMEOUT_MS: &str = "share.session.timeout.ms";
/// How often a share group's members heartbeat (`group.share.heartbeat.interval.ms`).
pub const SHARE_HEARTBEAT_INTERVAL_MS: &str = "share.heartbeat.interval.ms";
/// How long a record a share consumer fetched stays acquired (invisible to the group)
/// (`group.share.record.lock.duration.ms`).
pub const SHARE_RECORD_LOCK_DURATION_MS: &str = "share.record.lock.duration.ms";
/// Deliveries of one record to a share group before it goes to the group's dead letters
/// (`group.share.delivery.count.limit`).
pub const SHARE_DELIVERY_COUNT_LIMIT: &str = "share.delivery.count.limit";
/// Where a share group starts on a partition it has no position on yet: `latest` (Kafka's
/// default) or `earliest`.
pub const SHARE_AUTO_OFFSET_RESET: &str = "share.auto.offset.reset";

/// The lock duration's bounds: the invisible-time engine's (1 s to 12 h); Kafka's
/// `group.share.min.record.lock.duration.ms` is 15 s, Weir allows shorter.
pub const SHARE_RECORD_LOCK_DURATION_MS_RANGE: std::ops::RangeInclusive<i64> = 1_000..=43_200_000;
/// Kafka's bounds of a share group's delivery count limit.
pub const SHARE_DELIVERY_COUNT_LIMIT_RANGE: std::ops::RangeInclusive<u32> = 2..=10;

/// Every group setting and its default (empty for a consumer or share setting whose default
/// is the broker's `group.consumer.*` or `group.share.*` setting).
pub(crate) const GROUP_CONFIGS: &[(&str, &str)] = &[
    (FIFO, "false"),
    (BROADCAST, "false"),
    (MAX_DELIVERY_ATTEMPTS, "17"),
    // RocketMQ's delay levels 3 to 18, the back-off of its consumers' retries.
    (RETRY_BACKOFF, "1s,5s,10s,30s,1m,2m,3m,4m,5m,6m,7m,8m,9m,10m,20m,30m,1h,2h"),
    // Weir's own default: RocketMQ 5's pop consumption starts a new group at a queue's last
    // message unless the queue's messages from offset 0 are all still in memory (then at the
    // first), so it depends on the broker's cache; the oldest message loses nothing.
    (CONSUME_FROM_WHERE, "CONSUME_FROM_FIRST_OFFSET"),
    (CONSUME_TIMESTAMP, "-30m"),
    (CONSUMER_SESSION_TIMEOUT_MS, ""),
    (CONSUMER_HEARTBEAT_INTERVAL_MS, ""),
    (SHARE_SESSION_TIMEOUT_MS, ""),
    (SHARE_HEARTBEAT_INTERVAL_MS, ""),
    (SHARE_RECORD_LOCK_DURATION_MS, ""),
    (SHARE_DELIVERY_COUNT_LIMIT, ""),
    (SHARE_AUTO_OFFSET_RESET, "latest"),
];

/// The largest `max.delivery.attempts`.
pub(crate) const MAX_DELIVERY_ATTEMPTS_LIMIT: u32 = 10_000;
/// The longest wait before a redelivery (RocketMQ's delay messages go no further by default).
pub(crate) const MAX_RETRY_DELAY: Duration = Duration::from_secs(7 * 24 * 3600);
/// The most steps a customized back-off may list.
const MAX_BACKOFF_STEPS: usize = 100;

/// The wait before a redelivery, by the attempt that failed.
#[derive(Debug, Clone, PartialEq)]
pub enum RetryBackoff {
    /// The n-th entry is the wait after the n-th failed delivery; the last one repeats.
    Customized(Vec<Duration>),
    /// `initial × multiplier^(n - 1)` after the n-th failed delivery, at most `max`.
    Exponential { initial: Duration, max: Duration, multiplier: f64 },
}

impl RetryBackoff {
    /// Parses a [`RETRY_BACKOFF`] value.
    pub fn parse(value: &str) -> Result<RetryBackoff, String> {
        let value = value.trim();
        if let Some(parameters) = value.strip_prefix("exponential:") {
            let parts: Vec<&str> = parameters.split(',').map(str::trim).collect();
            let [initial, max, multiplier] = parts[..] else {
                return Err("an exponential back-off is exponential:INITIAL,MAX,MULTIPLIER".into());
            };
            let (initial, max) = (parse_duration(initial)?, parse_duration(max)?);
            let multiplier: f64 =
                multiplier.parse().map_err(|_| format!("the multiplier {multiplier:?} is not a number"))?;
            if initial.is_zero() || max < initial || max > MAX_RETRY_DELAY {
                return Err(format!("the back-off needs 0 < INITIAL <= MAX <= {}s", MAX_RETRY_DELAY.as_secs()));
            }
            if !(1.0..=100.0).contains(&multiplier) {
                return Err(format!("the multiplier {multiplier} is not between 1 and 100"));
            }
            return Ok(RetryBackoff::Exponential { initial, max, multiplier });
        }
        let steps = value.strip_prefix("customized:").unwrap_or(value);
        let steps = steps.split(',').map(|s| parse_duration(s.trim())).collect::<Result<Vec<_>, _>>()?;
        if steps.len() > MAX_BACKOFF_STEPS {
            return Err(format!("a back-off lists at most {MAX_BACKOFF_STEPS} waits"));
        }
        if let Some(long) = steps.iter().find(|d| **d > MAX_RETRY_DELAY) {
            return Err(format!("the wait {long:?} is longer than {}s", MAX_RETRY_DELAY.as_secs()));
        }
        Ok(RetryBackoff::Customized(steps))
    }

    /// The wait after delivery `attempt` (1 for the first) failed.
    pub fn delay(&self, attempt: u32) -> Duration {
        let index = attempt.max(1) - 1;
        match self {
            RetryBackoff::Customized(steps) => {
                steps.get(index as usize).or(steps.last()).copied().unwrap_or(Duration::ZERO)
            }
            RetryBackoff::Exponential { initial, max, multiplier } => {
                let seconds = initial.as_secs_f64() * multiplier.powi(index.min(1000) as i32);
                Duration::try_from_secs_f64(seconds).unwrap_or(*max).min(*max)
            }
        }
    }
}

/// `500ms`, `30s`, `5m`, `2h`, `1d`, or milliseconds without a unit.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let count: u64 = digits.parse().map_err(|_| format!("{text:?} is not a duration (such as 500ms, 30s, 5m, 2h)"))?;
    let millis_per = match unit {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{text:?} is not a duration (such as 500ms, 30s, 5m, 2h)")),
    };
    count.checked_mul(millis_per).map(Duration::from_millis).ok_or_else(|| format!("{text:?} is too long"))
}

/// Where a group starts on a queue it has no position on yet ([`CONSUME_FROM_WHERE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumeFrom {
    /// The oldest message the queue still has.
    FirstOffset,
    /// The queue's end when the group first receives from it: only later messages.
    LastOffset,
    /// The first message stored at or after this time (ms since the epoch); the queue's end
    /// when there is none.
    Timestamp(StartTime),
}

/// The time of [`ConsumeFrom::Timestamp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartTime {
    /// Milliseconds since the epoch.
    At(i64),
    /// This many milliseconds before the group's first receive of the queue.
    Before(i64),
}

impl StartTime {
    /// The time in ms since the epoch, for a first receive at `now_ms`.
    pub fn at(self, now_ms: i64) -> i64 {
        match self {
            StartTime::At(ms) => ms,
            StartTime::Before(ms) => now_ms.saturating_sub(ms).max(0),
        }
    }
}

fn check_consume_from(value: &str) -> Result<(), String> {
    match value.trim().to_ascii_uppercase().as_str() {
        "CONSUME_FROM_FIRST_OFFSET" | "CONSUME_FROM_LAST_OFFSET" | "CONSUME_FROM_TIMESTAMP" => Ok(()),
        _ => Err("it is CONSUME_FROM_FIRST_OFFSET, CONSUME_FROM_LAST_OFFSET or CONSUME_FROM_TIMESTAMP (RocketMQ's \
             ConsumeFromWhere)"
            .into()),
    }
}

fn parse_start_time(value: &str) -> Result<StartTime, String> {
    let value = value.trim();
    if let Some(before) = value.strip_prefix('-') {
        let before = parse_duration(before)?;
        return i64::try_from(before.as_millis())
            .map(StartTime::Before)
            .map_err(|_| format!("{value:?} is too long ago"));
    }
    match value.parse::<i64>() {
        Ok(ms) if ms >= 0 => Ok(StartTime::At(ms)),
        _ => Err("it is milliseconds since the epoch, or -DURATION (such as -30m) before the first receive".into()),
    }
}

/// A group's settings in force: its overrides over the defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSettings {
    pub fifo: bool,
    pub broadcast: bool,
    pub max_delivery_attempts: u32,
    pub retry_backoff: RetryBackoff,
    pub consume_from: ConsumeFrom,
    /// Consumer-protocol groups: overrides of the broker's `group.consumer.*` defaults
    /// (`None`: the broker's).
    pub consumer_session_timeout_ms: Option<i32>,
    pub consumer_heartbeat_interval_ms: Option<i32>,
    /// Share groups: overrides of the broker's `group.share.*` defaults (`None`: the broker's).
    pub share_session_timeout_ms: Option<i32>,
    pub share_heartbeat_interval_ms: Option<i32>,
    pub share_record_lock_duration_ms: Option<i64>,
    pub share_delivery_count_limit: Option<u32>,
    /// `share.auto.offset.reset`: `earliest` starts a new share group at the oldest record.
    pub share_from_earliest: bool,
}

impl Default for GroupSettings {
    /// The settings of a group without overrides: parsed once (each receive and ack of a
    /// group without settings asks for them).
    fn default() -> GroupSettings {
        static DEFAULT: std::sync::OnceLock<GroupSettings> = std::sync::OnceLock::new();
        DEFAULT.get_or_init(|| GroupSettings::from_configs(&BTreeMap::new())).clone()
    }
}

impl GroupSettings {
    /// The settings of a group with `overrides`. A value that does not parse (it was validated
    /// when written, so only by a bug) counts as unset.
    pub fn from_configs(overrides: &BTreeMap<String, String>) -> GroupSettings {
        let value = |name: &str| overrides.get(name).map(String::as_str).unwrap_or_else(|| default_of(name));
        let default_value = |name: &str| default_of(name);
        GroupSettings {
            fifo: parse_bool(value(FIFO)).or_else(|| parse_bool(default_value(FIFO))).unwrap_or(false),
            broadcast: parse_bool(value(BROADCAST)).unwrap_or(false),
            max_delivery_attempts: parse_attempts(value(MAX_DELIVERY_ATTEMPTS))
                .or_else(|_| parse_attempts(default_value(MAX_DELIVERY_ATTEMPTS)))
                .unwrap_or(17),
            retry_backoff: RetryBackoff::parse(value(RETRY_BACKOFF))
                .or_else(|_| RetryBackoff::parse(default_value(RETRY_BACKOFF)))
                .unwrap_or(RetryBackoff::Customized(vec![Duration::from_secs(1)])),
            consume_from: consume_from(value(CONSUME_FROM_WHERE), value(CONSUME_TIMESTAMP))
                .unwrap_or(ConsumeFrom::FirstOffset),
            consumer_session_timeout_ms: overrides.get(CONSUMER_SESSION_TIMEOUT_MS).and_then(|v| parse_ms(v).ok()),
            consumer_heartbeat_interval_ms: overrides
                .get(CONSUMER_HEARTBEAT_INTERVAL_MS)
                .and_then(|v| parse_ms(v).ok()),
            share_session_timeout_ms: overrides.get(SHARE_SESSION_TIMEOUT_MS).and_then(|v| parse_ms(v).ok()),
            share_heartbeat_interval_ms: overrides.get(SHARE_HEARTBEAT_INTERVAL_MS).and_then(|v| parse_ms(v).ok()),
            share_record_lock_duration_ms: overrides
                .get(SHARE_RECORD_LOCK_DURATION_MS)
                .and_then(|v| parse_lock_duration(v).ok()),
            share_delivery_count_limit: overrides
                .get(SHARE_DELIVERY_COUNT_LIMIT)
                .and_then(|v| parse_delivery_count_limit(v).ok()),
            share_from_earliest: parse_offset_reset(value(SHARE_AUTO_OFFSET_RESET)).unwrap_or(false),
        }
    }
}

/// The [`ConsumeFrom`] of a `consume.from.where` and a `consume.timestamp`.
fn consume_from(from_where: &str, timestamp: &str) -> Result<ConsumeFrom, String> {
    check_consume_from(from_where)?;
    Ok(match from_where.trim().to_ascii_uppercase().as_str() {
        "CONSUME_FROM_LAST_OFFSET" => ConsumeFrom::LastOffset,
        "CONSUME_FROM_TIMESTAMP" => ConsumeFrom::Timestamp(parse_start_time(timestamp)?),
        _ => ConsumeFrom::FirstOffset,
    })
}

fn default_of(name: &str) -> &'static str {
    GROUP_CONFIGS.iter().find(|(n, _)| *n == name).map_or("", |(_, d)| d)
}

fn parse_bool(value: &str) -> Option<bool> {
    match value.trim() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

fn parse_attempts(value: &str) -> Result<u32, String> {
    match value.trim().parse::<u32>() {
        Ok(n) if (1..=MAX_DELIVERY_ATTEMPTS_LIMIT).contains(&n) => Ok(n),
        _ => Err(format!("{MAX_DELIVERY_ATTEMPTS} is a whole number from 1 to {MAX_DELIVERY_ATTEMPTS_LIMIT}")),
    }
}

/// A positive number of milliseconds (a share session timeout or heartbeat interval).
fn parse_ms(value: &str) -> Result<i32, String> {
    match value.trim().parse::<i32>() {
        Ok(ms) if ms > 0 => Ok(ms),
        _ => Err("it is a positive number of milliseconds".into()),
    }
}

fn parse_lock_duration(value: &str) -> Result<i64, String> {
    match value.trim().parse::<i64>() {
        Ok(ms) if SHARE_RECORD_LOCK_DURATION_MS_RANGE.contains(&ms) => Ok(ms),
        _ => Err(format!(
            "it is milliseconds from {} to {}",
            SHARE_RECORD_LOCK_DURATION_MS_RANGE.start(),
            SHARE_RECORD_LOCK_DURATION_MS_RANGE.end()
        )),
    }
}

fn parse_delivery_count_limit(value: &str) -> Result<u32, String> {
    match value.trim().parse::<u32>() {
        Ok(n) if SHARE_DELIVERY_COUNT_LIMIT_RANGE.contains(&n) => Ok(n),
        _ => Err(format!(
            "it is a whole number from {} to {}",
            SHARE_DELIVERY_COUNT_LIMIT_RANGE.start(),
            SHARE_DELIVERY_COUNT_LIMIT_RANGE.end()
        )),
    }
}

/// `true` for `earliest`, `false` for `latest`.
fn parse_offset_reset(value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "earliest" => Ok(true),
        "latest" => Ok(false),
        _ => Err("it is latest or earliest".into()),
    }
}

/// The message for a name no group config has: the one meant when it can be told, else the list.
fn unknown_config(name: &str) -> String {
    let known = GROUP_CONFIGS.iter().map(|(n, _)| *n);
    match weir_error::closest_name(name, known.clone()) {
        Some(meant) => format!("Unknown group config name: {name}; did you mean {meant}?"),
        None => format!("Unknown group config name: {name} (known: {})", known.collect::<Vec<_>>().join(", ")),
    }
}

/// Checks every name and value of `configs`; the message names the one at fault.
pub fn validate(configs: &BTreeMap<String, String>) -> Result<(), String> {
    for (name, value) in configs {
        let problem = match name.as_str() {
            FIFO | BROADCAST => parse_bool(value).map(|_| ()).ok_or_else(|| format!("{name} is true or false")),
            MAX_DELIVERY_ATTEMPTS => parse_attempts(value).map(|_| ()),
            RETRY_BACKOFF => RetryBackoff::parse(value).map(|_| ()),
            CONSUME_FROM_WHERE => check_consume_from(value),
            CONSUME_TIMESTAMP => parse_start_time(value).map(|_| ()),
            CONSUMER_SESSION_TIMEOUT_MS
            | CONSUMER_HEARTBEAT_INTERVAL_MS
            | SHARE_SESSION_TIMEOUT_MS
            | SHARE_HEARTBEAT_INTERVAL_MS => parse_ms(value).map(|_| ()),
            SHARE_RECORD_LOCK_DURATION_MS => parse_lock_duration(value).map(|_| ()),
            SHARE_DELIVERY_COUNT_LIMIT => parse_delivery_count_limit(value).map(|_| ()),
            SHARE_AUTO_OFFSET_RESET => parse_offset_reset(value).map(|_| ()),
            _ => return Err(unknown_config(name)),
        };
        problem.map_err(|reason| format!("Invalid value {value} for group config {name}: {reason}"))?;
    }
    // A member must be able to heartbeat within its session.
    for (interval, session) in [
        (CONSUMER_HEARTBEAT_INTERVAL_MS, CONSUMER_SESSION_TIMEOUT_MS),
        (SHARE_HEARTBEAT_INTERVAL_MS, SHARE_SESSION_TIMEOUT_MS),
    ] {
        let ms = |name: &str| configs.get(name).and_then(|v| parse_ms(v).ok());
        if let (Some(interval_ms), Some(session_ms)) = (ms(interval), ms(session)) {
            if interval_ms >= session_ms {
                return Err(format!(
                    "Invalid value {interval_ms} for group config {interval}: it must be less than {session} ({session_ms})"
                ));
            }
        }
    }
    Ok(())
}

/// The overrides after `edit` (validated). Only SET and DELETE apply: no group setting is a list.
pub fn apply(edit: &ConfigEdit, current: &BTreeMap<String, String>) -> Result<BTreeMap<String, String>, String> {
    let configs = match edit {
        ConfigEdit::Replace(configs) => configs.clone(),
        ConfigEdit::Apply(ops) => {
            let mut configs = current.clone();
            for op in ops {
                match op {
                    ConfigOp::Set { name, value } => {
                        configs.insert(name.clone(), value.trim().to_string());
                    }
                    ConfigOp::Delete { name } => {
                        if !GROUP_CONFIGS.iter().any(|(n, _)| n == name) {
                            return Err(unknown_config(name));
                        }
                        configs.remove(name);
                    }
                    ConfigOp::Append { name, .. } | ConfigOp::Subtract { name, .. } => {
                        return Err(format!("{name} is no list: only SET and DELETE apply"));
                    }
                }
            }
            configs
        }
    };
    validate(&configs)?;
    Ok(configs)
}

/// One group setting in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfigEntry {
    pub name: String,
    pub value: String,
    /// Set for this group, rather than the default.
    pub overridden: bool,
}

/// Every group setting in force for a group with `overrides`.
pub fn describe(overrides: &BTreeMap<String, String>) -> Vec<GroupConfigEntry> {
    GROUP_CONFIGS
        .iter()
        .map(|(name, default)| GroupConfigEntry {
            name: name.to_string(),
            value: overrides.get(*name).cloned().unwrap_or_else(|| default.to_string()),
            overridden: overrides.contains_key(*name),
        })
        .collect()
}

/// The longest group name settings are kept for (RocketMQ's limit).
pub(crate) const MAX_GROUP_NAME_CHARS: usize = 255;

/// Decides a change of `group`'s settings: `edit` applied to its overrides in `state`. With
/// `create`, a group that has settings already is refused ([`ErrorKind::GroupExists`]). The
/// records are empty when nothing changes (or with `validate_only`).
pub fn decide_alter(
    state: &MetadataState,
    group: &str,
    create: bool,
    validate_only: bool,
    edit: &ConfigEdit,
) -> Result<Vec<MetadataRecord>, BrokerError> {
    if group.is_empty() || group.chars().count() > MAX_GROUP_NAME_CHARS || group.chars().any(char::is_control) {
        return Err(BrokerError::new(
            ErrorKind::InvalidGroupId,
            format!("a group name is 1 to {MAX_GROUP_NAME_CHARS} characters, none of them control characters"),
        ));
    }
    let current = state.group_configs.get(group).cloned();
    if create && current.is_some() {
        return Err(BrokerError::new(
            ErrorKind::GroupExists,
            format!("group {group} has settings already: change them with `weir group alter`"),
        ));
    }
    let current = current.unwrap_or_default();
    let configs = apply(edit, &current).map_err(|message| BrokerError::new(ErrorKind::InvalidConfig, message))?;
    if validate_only || configs == current {
        return Ok(Vec::new());
    }
    Ok(vec![MetadataRecord::SetGroupConfigs { group: group.to_string(), configs }])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn share_group_configs_override_the_broker_defaults_within_kafkas_bounds() {
        let settings = GroupSettings::default();
        assert_eq!(
            (settings.share_record_lock_duration_ms, settings.share_delivery_count_limit, settings.share_from_earliest),
            (None, None, false),
            "unset: the broker's group.share.* settings, and latest"
        );
        let set = GroupSettings::from_configs(&map(&[
            (SHARE_RECORD_LOCK_DURATION_MS, "2000"),
            (SHARE_DELIVERY_COUNT_LIMIT, "3"),
            (SHARE_AUTO_OFFSET_RESET, "EARLIEST"),
            (SHARE_SESSION_TIMEOUT_MS, "10000"),
        ]));
        assert_eq!(set.share_record_lock_duration_ms, Some(2000));
        assert_eq!(set.share_delivery_count_limit, Some(3));
        assert_eq!(set.share_session_timeout_ms, Some(10_000));
        assert!(set.share_from_earliest);
        for (name, value) in [
            (SHARE_RECORD_LOCK_DURATION_MS, "999"),
            (SHARE_DELIVERY_COUNT_LIMIT, "1"),
            (SHARE_DELIVERY_COUNT_LIMIT, "11"),
            (SHARE_AUTO_OFFSET_RESET, "none"),
            (SHARE_HEARTBEAT_INTERVAL_MS, "0"),
        ] {
            let error = validate(&map(&[(name, value)])).expect_err(value);
            assert!(error.contains(name), "{error}");
        }
    }

    #[test]
    fn consumer_group_configs_override_the_broker_defaults_and_a_heartbeat_fits_in_a_session() {
        let settings = GroupSettings::default();
        assert_eq!((settings.consumer_session_timeout_ms, settings.consumer_heartbeat_interval_ms), (None, None));
        let configs = map(&[(CONSUMER_SESSION_TIMEOUT_MS, "6000"), (CONSUMER_HEARTBEAT_INTERVAL_MS, "500")]);
        validate(&configs).expect("valid");
        let set = GroupSettings::from_configs(&configs);
        assert_eq!((set.consumer_session_timeout_ms, set.consumer_heartbeat_interval_ms), (Some(6000), Some(500)));
        for configs in [
            map(&[(CONSUMER_SESSION_TIMEOUT_MS, "0")]),
            map(&[(CONSUMER_HEARTBEAT_INTERVAL_MS, "soon")]),
            map(&[(CONSUMER_SESSION_TIMEOUT_MS, "6000"), (CONSUMER_HEARTBEAT_INTERVAL_MS, "6000")]),
            map(&[(SHARE_SESSION_TIMEOUT_MS, "1000"), (SHARE_HEARTBEAT_INTERVAL_MS, "2000")]),
        ] {
            let error = validate(&configs).expect_err("invalid");
            assert!(error.contains("heartbeat.interval.ms") || error.contains("session.timeout.ms"), "{error}");
        }
    }

    #[test]
    fn a_group_without_settings_has_rocketmqs_defaults() {
        let settings = GroupSettings::default();
        assert!(!settings.fifo);
        assert_eq!(settings.max_delivery_attempts, 17);
        assert_eq!(settings.retry_backoff.delay(1), Duration::from_secs(1));
        assert_eq!(settings.retry_backoff.delay(2), Duration::from_secs(5));
        assert_eq!(settings.retry_backoff.delay(18), Duration::from_secs(7200));
        assert_eq!(settings.retry_backoff.delay(100), Duration::from_secs(7200), "the last wait repeats");
        assert_eq!(settings.consume_from, ConsumeFrom::FirstOffset);
    }

    #[test]
    fn where_a_new_group_starts_is_read_from_consume_from_where_and_its_timestamp() {
        let from = |pairs: &[(&str, &str)]| GroupSettings::from_configs(&map(pairs)).consume_from;
        assert_eq!(from(&[(CONSUME_FROM_WHERE, "CONSUME_FROM_LAST_OFFSET")]), ConsumeFrom::LastOffset);
        assert_eq!(from(&[(CONSUME_FROM_WHERE, "consume_from_first_offset")]), ConsumeFrom::FirstOffset);
        let half_an_hour_back = from(&[(CONSUME_FROM_WHERE, "CONSUME_FROM_TIMESTAMP")]);
        assert_eq!(half_an_hour_back, ConsumeFrom::Timestamp(StartTime::Before(1_800_000)), "RocketMQ's default");
        let at = from(&[(CONSUME_FROM_WHERE, "CONSUME_FROM_TIMESTAMP"), (CONSUME_TIMESTAMP, "1700000000000")]);
        assert_eq!(at, ConsumeFrom::Timestamp(StartTime::At(1_700_000_000_000)));
        assert_eq!(StartTime::Before(1_000).at(5_000), 4_000);
        assert_eq!(StartTime::Before(10_000).at(5_000), 0, "never before the epoch");
        for (name, value) in [(CONSUME_FROM_WHERE, "CONSUME_FROM_MIDDLE"), (CONSUME_TIMESTAMP, "yesterday")] {
            let error = validate(&map(&[(name, value)])).expect_err(value);
            assert!(error.contains(name), "{error}");
        }
    }

    #[test]
    fn overrides_are_read_and_exponential_waits_stop_at_their_max() {
        let settings = GroupSettings::from_configs(&map(&[
            (FIFO, "true"),
            (MAX_DELIVERY_ATTEMPTS, "3"),
            (RETRY_BACKOFF, "exponential:100ms,1s,2"),
        ]));
        assert!(settings.fifo);
        assert_eq!(settings.max_delivery_attempts, 3);
        let waits: Vec<u128> = (1..=6).map(|n| settings.retry_backoff.delay(n).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(settings.retry_backoff.delay(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn bad_names_and_values_are_refused_with_the_name_at_fault() {
        for (name, value) in [
            (FIFO, "yes"),
            (MAX_DELIVERY_ATTEMPTS, "0"),
            (MAX_DELIVERY_ATTEMPTS, "10001"),
            (MAX_DELIVERY_ATTEMPTS, "-1"),
            (RETRY_BACKOFF, ""),
            (RETRY_BACKOFF, "1s,fast"),
            (RETRY_BACKOFF, "8d"),
            (RETRY_BACKOFF, "exponential:1s,2h"),
            (RETRY_BACKOFF, "exponential:2h,1s,2"),
            (RETRY_BACKOFF, "exponential:1s,2h,0.5"),
            (RETRY_BACKOFF, "99999999999999999999h"),
            ("fifo", "true"),
        ] {
            let error = validate(&map(&[(name, value)])).expect_err(value);
            assert!(error.contains(name), "{error}");
        }
        assert!(validate(&map(&[(RETRY_BACKOFF, "customized:500ms, 2s ,1m"), (FIFO, "false")])).is_ok());
    }

    #[test]
    fn edits_set_and_delete_but_never_append() {
        let current = map(&[(FIFO, "true")]);
        let edit = ConfigEdit::Apply(vec![
            ConfigOp::Set { name: MAX_DELIVERY_ATTEMPTS.into(), value: " 5 ".into() },
            ConfigOp::Delete { name: FIFO.into() },
        ]);
        assert_eq!(apply(&edit, &current).unwrap(), map(&[(MAX_DELIVERY_ATTEMPTS, "5")]));
        let append = ConfigEdit::Apply(vec![ConfigOp::Append { name: RETRY_BACKOFF.into(), value: "1s".into() }]);
        assert!(apply(&append, &current).is_err());
        let unknown = ConfigEdit::Apply(vec![ConfigOp::Delete { name: "nope".into() }]);
        assert!(apply(&unknown, &current).is_err());
        let described = describe(&current);
        assert_eq!(described.len(), GROUP_CONFIGS.len());
        assert!(described.iter().any(|e| e.name == FIFO && e.value == "true" && e.overridden));
        assert!(described.iter().any(|e| e.name == RETRY_BACKOFF && !e.overridden));
    }
}
