//! The one parser of the times the client commands take (`weir group reset-offsets
//! --to-timestamp`, `weir message query --begin/--end`, `weir partition trim --before`), so
//! that every command reads a time the same way:
//!
//! - an RFC 3339 time: `2026-12-01T00:00:00Z`, `2026-12-01T09:30:00+09:00` (fractions of a
//!   second allowed); a date alone, `2026-12-01`, is its midnight UTC;
//! - a time before now: `-1h`, `-30m`, `-45s`, `-2d`, `-1w`, `-500ms`, or combined, `-1h30m`;
//! - `now`;
//! - milliseconds since the Unix epoch, as Kafka's tools take them: `1764547200000`.
//!
//! A time is answered in milliseconds since the epoch, as the admin API takes it.

use std::time::{SystemTime, UNIX_EPOCH};

use chrono::{DateTime, NaiveDate};

/// What the parser says when it cannot read a time.
const EXPECTED: &str =
    "expected a time such as 2026-12-01T00:00:00Z, 2026-12-01, -1h, -30m, now, or milliseconds since the epoch";

/// Milliseconds since the epoch now.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A clap `value_parser`: `text` as milliseconds since the epoch, relative times from now.
pub fn parse_time_arg(text: &str) -> Result<i64, String> {
    parse_time(text, now_ms())
}

/// `text` as milliseconds since the epoch; relative times count back from `now_ms`.
pub fn parse_time(text: &str, now_ms: i64) -> Result<i64, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("now") {
        return Ok(now_ms);
    }
    if let Some(ago) = text.strip_prefix('-') {
        let ago_ms = parse_duration_ms(ago).map_err(|e| format!("{text:?}: {e}"))?;
        return Ok(now_ms.saturating_sub(ago_ms));
    }
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse::<i64>().map_err(|_| format!("{text:?}: too large for milliseconds since the epoch"));
    }
    if let Ok(time) = DateTime::parse_from_rfc3339(text) {
        return Ok(time.timestamp_millis());
    }
    if let Ok(date) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        if let Some(midnight) = date.and_hms_opt(0, 0, 0) {
            return Ok(midnight.and_utc().timestamp_millis());
        }
    }
    Err(format!("{text:?}: {EXPECTED}"))
}

/// `1h30m`, `45s`, `500ms`, `2d`, `1w` as milliseconds: numbers each followed by a unit.
fn parse_duration_ms(text: &str) -> Result<i64, String> {
    if text.is_empty() {
        return Err("a duration needs a number and a unit (ms, s, m, h, d, w)".into());
    }
    let mut total: i64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let unit_len = rest[digits..].bytes().take_while(u8::is_ascii_alphabetic).count();
        if digits == 0 || unit_len == 0 {
            return Err("a duration is numbers with units: 90s, 30m, 1h30m, 2d, 500ms".into());
        }
        let number: i64 = rest[..digits].parse().map_err(|_| "the number is too large".to_string())?;
        let unit_ms: i64 = match &rest[digits..digits + unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 604_800_000,
            other => return Err(format!("unknown unit {other:?} (ms, s, m, h, d, w)")),
        };
        total = number.checked_mul(unit_ms).and_then(|ms| total.checked_add(ms)).ok_or("the duration is too long")?;
        rest = &rest[digits + unit_len..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_764_547_200_000; // 2025-12-01T00:00:00Z

    #[test]
    fn absolute_times_read_as_people_write_them() {
        assert_eq!(parse_time("2025-12-01T00:00:00Z", 0), Ok(NOW));
        assert_eq!(parse_time("2025-12-01T09:00:00+09:00", 0), Ok(NOW));
        assert_eq!(parse_time("2025-12-01T00:00:00.250Z", 0), Ok(NOW + 250));
        assert_eq!(parse_time("2025-12-01", 0), Ok(NOW));
        assert_eq!(parse_time(&NOW.to_string(), 0), Ok(NOW));
        assert_eq!(parse_time(" now ", NOW), Ok(NOW));
    }

    #[test]
    fn relative_times_count_back_from_now() {
        assert_eq!(parse_time("-1h", NOW), Ok(NOW - 3_600_000));
        assert_eq!(parse_time("-30m", NOW), Ok(NOW - 1_800_000));
        assert_eq!(parse_time("-1h30m", NOW), Ok(NOW - 5_400_000));
        assert_eq!(parse_time("-2d", NOW), Ok(NOW - 172_800_000));
        assert_eq!(parse_time("-500ms", NOW), Ok(NOW - 500));
    }

    #[test]
    fn anything_else_is_refused_with_what_is_expected() {
        for bad in ["", "yesterday", "-", "-1", "-h", "-1y", "12:00", "2025-13-01", "99999999999999999999", "-1x2h"] {
            let error = parse_time(bad, NOW).expect_err(bad);
            assert!(error.starts_with(&format!("{:?}", bad.trim())), "{bad}: {error}");
        }
        assert!(parse_time("yesterday", NOW).expect_err("no").contains("2026-12-01T00:00:00Z"));
        assert!(parse_time("-99999999999w", NOW).is_err(), "overflow is an error, not a wrap");
    }
}
