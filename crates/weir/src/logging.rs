//! The process's logs: stderr, filtered by `RUST_LOG` or by the command's default filter, in
//! colour only for a person at a terminal.
//!
//! With the default filter, a peer that does not answer is said once, when it stops and when it
//! is back (the Raft transport does that), never once per retry: openraft logs every failed
//! vote request at ERROR, two or three a second per missing voter, so a node whose peers never
//! started would fill its log with them. [`QuietRetries`] drops exactly those events.

use std::ffi::OsStr;
use std::fmt;
use std::io::IsTerminal;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata};
use tracing_subscriber::filter::FilterExt;
use tracing_subscriber::layer::{Context, Filter, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt as log_fmt, EnvFilter};

/// Logs to stderr, filtered by RUST_LOG, or by `default_filter` (and [`QuietRetries`]) when
/// RUST_LOG is unset.
pub fn init(default_filter: &str) {
    let colour = log_colour(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref());
    let layer = log_fmt::layer().with_ansi(colour).with_writer(std::io::stderr);
    match EnvFilter::try_from_default_env() {
        // Whoever sets RUST_LOG asked to see what it selects, retries included.
        Ok(filter) => tracing_subscriber::registry().with(layer.with_filter(filter)).init(),
        Err(_) => {
            let filter = EnvFilter::new(default_filter).and(QuietRetries);
            tracing_subscriber::registry().with(layer.with_filter(filter)).init()
        }
    }
}

/// Whether the logs carry ANSI colour codes: only for a person at a terminal (a file or a pipe
/// gets plain text), and not when NO_COLOR is set to a non-empty value (https://no-color.org).
fn log_colour(stderr_is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(OsStr::is_empty)
}

/// Drops openraft's report of each failed vote request ("while requesting vote", and "timeout"
/// when the peer is frozen), which it logs at ERROR on every election round. The same module's
/// other errors (its core stopping, say) still pass.
struct QuietRetries;

/// openraft's module that sends vote requests, and the messages of its per-request failures.
const VOTE_TARGET: &str = "openraft::core::raft_core";
const VOTE_FAILURES: [&str; 2] = ["while requesting vote", "timeout"];

impl QuietRetries {
    fn is_retry_noise(metadata: &Metadata<'_>, message: Option<&str>) -> bool {
        *metadata.level() == Level::ERROR
            && metadata.target() == VOTE_TARGET
            && message.is_some_and(|m| VOTE_FAILURES.contains(&m))
    }
}

/// The `message` field of an event.
#[derive(Default)]
struct MessageOf(Option<String>);

impl Visit for MessageOf {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0 = Some(value.to_string());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl<S> Filter<S> for QuietRetries {
    fn enabled(&self, _: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _: &Context<'_, S>) -> bool {
        let metadata = event.metadata();
        // Cheap checks first: almost every event stops here.
        if *metadata.level() != Level::ERROR || metadata.target() != VOTE_TARGET {
            return true;
        }
        let mut message = MessageOf::default();
        event.record(&mut message);
        !QuietRetries::is_retry_noise(metadata, message.0.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn logs_are_coloured_only_on_a_terminal_without_no_color() {
        assert!(log_colour(true, None));
        assert!(log_colour(true, Some(OsStr::new(""))), "an empty NO_COLOR does not count");
        assert!(!log_colour(true, Some(OsStr::new("1"))));
        assert!(!log_colour(false, None));
        assert!(!log_colour(false, Some(OsStr::new(""))));
    }

    /// A writer the test reads back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn failed_vote_requests_are_dropped_and_every_other_error_passes() {
        let captured = Captured::default();
        let writer = captured.clone();
        let layer = log_fmt::layer()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .with_filter(EnvFilter::new("info").and(QuietRetries));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(target: "openraft::core::raft_core", error = "connection refused", target = "2", "while requesting vote");
            tracing::error!(target: "openraft::core::raft_core", error = "deadline", target = "3", "timeout");
            tracing::error!(target: "openraft::core::raft_core", error = "disk", "quit RaftCore::main on error");
            tracing::error!(target: "weir_broker::cluster", "while requesting vote");
            tracing::warn!(target: "openraft::core::raft_core", "while requesting vote");
        });
        let text = String::from_utf8_lossy(&captured.0.lock().unwrap_or_else(|e| e.into_inner())).to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].contains("quit RaftCore::main on error"), "{text}");
        assert!(lines[1].contains("weir_broker::cluster"), "{text}");
        assert!(lines[2].contains("WARN"), "{text}");
    }
}
