//! A `weir server` seen from outside, as the benchmarks (`weir-bench`) and the black-box tests
//! (`crates/weir/tests`) drive it: how to start one, and how to talk to it.
//!
//! - [`address_lines`] — the lines `weir server` prints once it serves, and starting a
//!   `weir server` child process that waits for them. `weir server` prints them with this
//!   module, so their wording has one home.
//! - [`kafka_client`] — a minimal blocking Kafka client on a plain `TcpStream`.
//! - [`parse_setting`] — the `NAME=VALUE` of `weir server --set`.
//!
//! **Architecture invariant:** this crate depends on no Weir crate and knows nothing of the
//! broker's internals: only its command line, what it prints, and the Kafka wire format. So the
//! black-box tests that use it test the binary, and `weir` can depend on it without a cycle.
#![forbid(unsafe_code)]

pub mod address_lines;
pub mod kafka_client;

/// Parses `NAME=VALUE`, the argument of `weir server --set` and of the benchmarks' `--set`
/// (which they pass on to their `weir server` children): both ends trimmed, a name required.
pub fn parse_setting(text: &str) -> Result<(String, String), String> {
    let (name, value) = text.split_once('=').ok_or_else(|| format!("expected NAME=VALUE, got {text:?}"))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("expected NAME=VALUE, got {text:?}"));
    }
    Ok((name.to_string(), value.trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_trimmed_and_need_a_name() {
        assert_eq!(parse_setting(" log.retention.ms = 5 "), Ok(("log.retention.ms".into(), "5".into())));
        assert_eq!(parse_setting("rocketmq.listeners="), Ok(("rocketmq.listeners".into(), String::new())));
        assert_eq!(parse_setting("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert!(parse_setting("novalue").is_err());
        assert!(parse_setting(" =1").is_err());
    }
}
