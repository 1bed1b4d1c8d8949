//! The address lines `weir server` prints on stdout once everything serves, and how a parent
//! process starts a `weir server` and waits for them (the benchmarks' brokers and the black-box
//! tests' do):
//!
//! ```text
//! weir 0.1.0 listening on 127.0.0.1:9092 (Kafka protocol), data in /var/lib/weir
//! rocketmq 127.0.0.1:8081 (RocketMQ 5 gRPC)
//! admin http://127.0.0.1:9644 (JSON API, /metrics)
//! ```
//!
//! The rocketmq and admin lines follow only when their listeners are on, in that order. Scripts wait for these lines, so
//! their wording is a promise: it is written and read here and nowhere else.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// `weir VERSION listening on ADDR (Kafka protocol), data in DIR`.
pub fn kafka_line(addr: SocketAddr, data_dir: &Path) -> String {
    format!("weir {} listening on {addr} (Kafka protocol), data in {}", env!("CARGO_PKG_VERSION"), data_dir.display())
}

/// `weir VERSION controller on ADDR (metadata quorum), data in DIR`: what a controller-only
/// node, which has no Kafka listener, prints instead of the Kafka line.
pub fn controller_line(addr: &str, data_dir: &Path) -> String {
    format!("weir {} controller on {addr} (metadata quorum), data in {}", env!("CARGO_PKG_VERSION"), data_dir.display())
}

/// `admin http://ADDR (JSON API, /metrics)`.
pub fn admin_line(addr: SocketAddr) -> String {
    format!("admin http://{addr} (JSON API, /metrics)")
}

/// `admin https://ADDR (JSON API, /metrics)`: the admin listener with TLS (`admin.ssl.enable`).
pub fn admin_tls_line(addr: SocketAddr) -> String {
    format!("admin https://{addr} (JSON API, /metrics)")
}

/// `rocketmq ADDR (RocketMQ 5 gRPC)`.
pub fn rocketmq_line(addr: SocketAddr) -> String {
    format!("rocketmq {addr} (RocketMQ 5 gRPC)")
}

fn parse_rocketmq_line(line: &str) -> Option<SocketAddr> {
    let rest = line.strip_prefix("rocketmq ")?;
    let (addr, tail) = rest.split_once(' ')?;
    (tail == "(RocketMQ 5 gRPC)").then_some(())?;
    addr.parse().ok()
}

fn parse_kafka_line(line: &str) -> Option<SocketAddr> {
    let rest = line.strip_prefix("weir ")?;
    let (_, rest) = rest.split_once(" listening on ")?;
    let (addr, tail) = rest.split_once(' ')?;
    tail.starts_with("(Kafka protocol)").then_some(())?;
    addr.parse().ok()
}

fn parse_admin_line(line: &str) -> Option<SocketAddr> {
    let rest = line.strip_prefix("admin http://").or_else(|| line.strip_prefix("admin https://"))?;
    let (addr, tail) = rest.split_once(' ')?;
    (tail == "(JSON API, /metrics)").then_some(())?;
    addr.parse().ok()
}

/// Where a started `weir server` serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addresses {
    pub kafka: SocketAddr,
    /// `None` unless [`WaitFor::KafkaAndAdmin`] was asked for.
    pub admin: Option<SocketAddr>,
    /// The RocketMQ listener, when it is on and its line came before the last line waited for
    /// (always, with [`WaitFor::KafkaAndAdmin`]).
    pub rocketmq: Option<SocketAddr>,
}

/// Which of the lines a start waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitFor {
    /// The Kafka line only: whether an admin line follows depends on the settings.
    Kafka,
    /// Both: the caller has turned the admin listener on.
    KafkaAndAdmin,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot start `weir server`: {0}")]
    Spawn(std::io::Error),
    /// Its stdout ended first: it exited (a bad setting, a busy port) or closed stdout.
    #[error("`weir server` ended before printing its address lines ({})", status_text(.status))]
    Ended { status: Option<ExitStatus> },
    #[error("`weir server` did not print its address lines within {0:?}")]
    Timeout(Duration),
}

fn status_text(status: &Option<ExitStatus>) -> String {
    status.map_or_else(|| "exit status unknown".to_string(), |s| s.to_string())
}

/// Spawns `command`, a `weir server` command line, with its stdout piped, and waits up to
/// `timeout` for the address lines `wait_for` names. A thread of its own reads stdout to the end,
/// so the broker never blocks on (or fails writing to) a full or closed pipe. On failure the
/// child is killed and reaped.
pub fn spawn_and_wait(
    command: &mut Command,
    wait_for: WaitFor,
    timeout: Duration,
) -> Result<(Child, Addresses), StartError> {
    let mut child = command.stdout(Stdio::piped()).spawn().map_err(StartError::Spawn)?;
    let addresses = match child.stdout.take() {
        Some(stdout) => watch(stdout, wait_for).recv_timeout(timeout),
        None => Err(mpsc::RecvTimeoutError::Disconnected),
    };
    match addresses {
        Ok(addresses) => Ok((child, addresses)),
        Err(e) => {
            let _ = child.kill();
            let status = child.wait().ok();
            Err(match e {
                mpsc::RecvTimeoutError::Timeout => StartError::Timeout(timeout),
                mpsc::RecvTimeoutError::Disconnected => StartError::Ended { status },
            })
        }
    }
}

/// Reads `stdout` line by line in a new thread until it ends; sends the addresses once the lines
/// `wait_for` names have passed. The channel disconnects unsent if the stream ends first.
fn watch(stdout: impl Read + Send + 'static, wait_for: WaitFor) -> mpsc::Receiver<Addresses> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        let (mut kafka, mut admin, mut rocketmq) = (None, None, None);
        // By bytes, not `lines()`: a line that is no UTF-8 must not stop the draining.
        for line in BufReader::new(stdout).split(b'\n') {
            let Ok(line) = line else { break };
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches('\r');
            if let Some(addr) = parse_kafka_line(line) {
                kafka = Some(addr);
            } else if let Some(addr) = parse_admin_line(line) {
                admin = Some(addr);
            } else if let Some(addr) = parse_rocketmq_line(line) {
                rocketmq = Some(addr);
            }
            let complete = match wait_for {
                WaitFor::Kafka => kafka.map(|kafka| Addresses { kafka, admin: None, rocketmq }),
                WaitFor::KafkaAndAdmin => {
                    kafka.zip(admin).map(|(kafka, admin)| Addresses { kafka, admin: Some(admin), rocketmq })
                }
            };
            if let Some(addresses) = complete {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(addresses);
                }
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().expect("an address")
    }

    #[test]
    fn the_printed_lines_parse_back() {
        let kafka = addr("127.0.0.1:9092");
        let line = kafka_line(kafka, Path::new("/tmp/a dir with spaces"));
        assert_eq!(parse_kafka_line(&line), Some(kafka), "{line}");
        let admin = addr("[::1]:9644");
        assert_eq!(parse_admin_line(&admin_line(admin)), Some(admin));
        assert_eq!(parse_kafka_line(&admin_line(admin)), None);
        assert_eq!(parse_admin_line(&line), None);
        assert_eq!(parse_kafka_line("weir 0.1.0 listening on 127.0.0.1:1 (RocketMQ protocol)"), None);
        let rocketmq = addr("127.0.0.1:8081");
        assert_eq!(parse_rocketmq_line(&rocketmq_line(rocketmq)), Some(rocketmq));
        assert_eq!(parse_admin_line(&rocketmq_line(rocketmq)), None);
    }

    fn wait(stdout: &[u8], wait_for: WaitFor) -> Option<Addresses> {
        watch(std::io::Cursor::new(stdout.to_vec()), wait_for).recv_timeout(Duration::from_secs(10)).ok()
    }

    #[test]
    fn the_wait_ends_with_the_lines_it_asks_for() {
        let (kafka, admin) = (addr("127.0.0.1:1"), addr("127.0.0.1:2"));
        let kafka_only = format!("{}\n", kafka_line(kafka, Path::new("/d"))).into_bytes();
        let mut both = b"noise\n".to_vec();
        both.extend_from_slice(&kafka_only);
        both.extend_from_slice(b"\xff\xfe, no UTF-8\r\n");
        both.extend_from_slice(format!("{}\r\n", admin_line(admin)).as_bytes());
        assert_eq!(wait(&both, WaitFor::KafkaAndAdmin), Some(Addresses { kafka, admin: Some(admin), rocketmq: None }));
        assert_eq!(wait(&both, WaitFor::Kafka), Some(Addresses { kafka, admin: None, rocketmq: None }));
        assert_eq!(wait(&kafka_only, WaitFor::KafkaAndAdmin), None, "the stream ended without the admin line");
        assert_eq!(wait(b"", WaitFor::Kafka), None);
    }
}
