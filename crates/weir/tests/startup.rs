//! What the address lines of `weir server` promise: once `listening on … (Kafka protocol)` and
//! `admin http://…` are printed, the broker has recovered, its coordinators are loaded, the
//! Kafka listener answers, `/ready` is 200 and `/metrics` lists every Kafka API.
//!
//! The test does not race the broker: it freezes it right after the lines. The broker's stderr
//! is a pipe the test filled to the brim before starting it, and the only log event let through
//! (`RUST_LOG=weir::server=info`) is the `broker started` line that follows the address lines.
//! So the process blocks in that write and nothing after the prints runs until the test drains
//! the pipe; whatever answers meanwhile was serving when the lines came out.

mod support;

use std::fs::File;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::mpsc;

use kafka_protocol::messages::MetadataRequest;
use support::{ClientExt, STARTUP_TIMEOUT};
use weir_broker::metrics::text;
use weir_harness::address_lines::{self, WaitFor};

/// `weir server --data-dir DIR`, with none of the test run's WEIR_* variables.
fn weir_server(data_dir: &std::path::Path) -> Command {
    let mut command = support::weir_command();
    command.args(["server", "--data-dir"]).arg(data_dir);
    command
}

/// A pipe whose buffer is full: (read end, write end). A blocking write to it waits until the
/// read end is drained.
fn full_pipe() -> (File, OwnedFd) {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is an array of two ints, which is what pipe2 writes.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: pipe2 succeeded, so both descriptors are open, and nothing else owns them.
    let (read, write) = unsafe { (File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    set_nonblocking(&write, true);
    let mut writer = File::from(write.try_clone().expect("dup the write end"));
    // Big writes first, then single bytes: a write of up to PIPE_BUF bytes is all or nothing.
    for chunk in [4096, 1] {
        loop {
            match writer.write(&vec![b'.'; chunk]) {
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => panic!("filling the pipe: {e}"),
            }
        }
    }
    // O_NONBLOCK belongs to the open file, which the broker shares: make its writes block.
    set_nonblocking(&write, false);
    (read, write)
}

fn set_nonblocking(fd: &OwnedFd, on: bool) {
    // SAFETY: F_GETFL and F_SETFL on an open descriptor touch only its status flags.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        assert!(flags >= 0, "F_GETFL: {}", std::io::Error::last_os_error());
        let flags = if on { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
        assert_eq!(libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags), 0, "F_SETFL");
    }
}

#[test]
fn when_the_address_lines_are_printed_kafka_ready_and_metrics_already_answer() {
    let scratch = tempfile::Builder::new().prefix("weir-startup-").tempdir().expect("scratch dir");
    let (stderr_read, stderr_write) = full_pipe();
    let mut command = weir_server(&scratch.path().join("data"));
    command
        .args(["--listen", "127.0.0.1:0"])
        .args(["--set", "admin.listeners=127.0.0.1:0", "--set", "offsets.topic.num.partitions=3"])
        .args(["--set", "rocketmq.listeners=127.0.0.1:0"])
        .env("RUST_LOG", "weir::server=info")
        .stdin(Stdio::null())
        .stderr(Stdio::from(stderr_write));
    let (child, addresses) = address_lines::spawn_and_wait(&mut command, WaitFor::KafkaAndAdmin, STARTUP_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}"));
    let _child = KillOnDrop(child);
    let (kafka, admin) = (addresses.kafka, addresses.admin.expect("waited for the admin line"));
    let rocketmq = addresses.rocketmq.expect("the rocketmq line comes before the admin line");
    assert!(std::net::TcpStream::connect(rocketmq).is_ok(), "the RocketMQ listener takes connections at {rocketmq}");

    // One attempt each, no retry: the broker is frozen after its prints.
    let agent = ureq::Agent::new_with_config(
        ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(STARTUP_TIMEOUT)).build(),
    );
    let get = |path: &str| {
        let mut response =
            agent.get(format!("http://{admin}{path}")).call().unwrap_or_else(|e| panic!("GET {path}: {e}"));
        let body = response.body_mut().read_to_string().expect("response body");
        (response.status().as_u16(), body)
    };
    let (status, body) = get("/metrics");
    assert_eq!(status, 200, "{body}");
    let samples = text::parse(&body).unwrap_or_else(|e| panic!("invalid exposition: {e}\n{body}"));
    for api in ["ApiVersions", "Metadata", "Produce", "Fetch", "JoinGroup", "EndTxn"] {
        let sample = samples.iter().find(|s| s.name == "weir_requests_total" && s.label("api") == Some(api));
        assert_eq!(sample.map(|s| s.value), Some(0.0), "weir_requests_total{{api={api:?}}} in\n{body}");
    }
    assert_eq!(get("/ready"), (200, r#"{"status":"ready"}"#.to_string()));

    let mut client = support::connect(kafka);
    let versions = client.api_versions();
    assert!(versions.api_keys.iter().any(|k| k.api_key == 3), "ApiVersions lists Metadata");
    let metadata = client.send(12, &MetadataRequest::default().with_topics(None)).expect("Metadata v12");
    assert_eq!(metadata.brokers.iter().map(|b| b.port).collect::<Vec<_>>(), [i32::from(kafka.port())]);

    // The broker was indeed stopped at the `broker started` line: it comes out once drained.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let started = BufReader::new(stderr_read)
            .split(b'\n')
            .map_while(Result::ok)
            .any(|line| String::from_utf8_lossy(&line).contains("broker started"));
        let _ = tx.send(started);
    });
    assert_eq!(rx.recv_timeout(STARTUP_TIMEOUT), Ok(true), "the broker logs `broker started` once unblocked");
}

/// Kills the broker when the test ends, passed or failed.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_busy_kafka_port_stops_the_broker_before_it_touches_the_data_directory() {
    let scratch = tempfile::Builder::new().prefix("weir-startup-").tempdir().expect("scratch dir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let addr = taken.local_addr().expect("local address").to_string();
    let data_dir = scratch.path().join("data");
    let output = weir_server(&data_dir)
        .args(["--listen", &addr, "--set", "admin.listeners=", "--set", "rocketmq.listeners="])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run weir server");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("cannot listen on {addr} (the `listeners` setting)")), "{stderr}");
    assert!(!data_dir.exists(), "the data directory was created although the port is busy");
}
