//! Shared helpers of the admin API and CLI tests: start the real `weir server` with its admin
//! listener on a free port, call the HTTP API, run the `weir` client commands against it.
//!
//! Builds on `support` (its [`Broker`]): a test crate that declares `mod admin_support;`
//! declares `mod support;` too.
// Each test file uses a different subset of these helpers.
#![allow(dead_code)]

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::{self, Broker};

/// A `weir server` child process, its admin API at hand; killed when dropped.
pub struct Server {
    broker: Broker,
    pub kafka: SocketAddr,
    /// `http://127.0.0.1:PORT`.
    pub admin: String,
    agent: ureq::Agent,
}

impl Server {
    /// Starts `weir server` as [`Broker::start`] does: both listeners on 127.0.0.1 port 0,
    /// `group.initial.rebalance.delay.ms=0` and `settings` (`name=value`).
    pub fn start(settings: &[&str]) -> Server {
        let broker = Broker::start(settings);
        let agent = ureq::Agent::new_with_config(
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(60)))
                .build(),
        );
        let (kafka, admin) = (broker.addr(), format!("http://{}", broker.admin_addr()));
        Server { broker, kafka, admin, agent }
    }

    /// SIGTERM, then waits (up to 30 s) for the process to exit; returns its status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.broker.terminate()
    }

    pub fn data_dir(&self) -> std::path::PathBuf {
        self.broker.data_dir()
    }

    pub fn logs(&self) -> String {
        self.broker.logs()
    }

    /// One HTTP request; `body` is sent as is (it need not be valid JSON). Returns the status
    /// and the body parsed as JSON (`Value::Null` for an empty or non-JSON body).
    pub fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let (status, _, text) = self.call_raw(method, path, body);
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// As [`Server::call`]: (status, content type, body text).
    pub fn call_raw(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String, String) {
        let url = format!("{}{path}", self.admin);
        let result = match (method, body) {
            ("GET", _) => self.agent.get(&url).call(),
            ("DELETE", _) => self.agent.delete(&url).call(),
            ("POST", Some(b)) => self.agent.post(&url).content_type("application/json").send(b.as_bytes()),
            ("POST", None) => self.agent.post(&url).send_empty(),
            ("PATCH", Some(b)) => self.agent.patch(&url).content_type("application/json").send(b.as_bytes()),
            ("PUT", Some(b)) => self.agent.put(&url).send(b.as_bytes()),
            other => panic!("unsupported request {other:?}"),
        };
        let mut response = result.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = response.status().as_u16();
        let content_type =
            response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let text = response.body_mut().with_config().limit(256 << 20).read_to_string().expect("response body");
        (status, content_type, text)
    }

    /// GET that must answer 200.
    pub fn get_ok(&self, path: &str) -> Value {
        let (status, body) = self.call("GET", path, None);
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    /// A request whose answer must be `status`; returns the body.
    pub fn expect(&self, method: &str, path: &str, body: Option<&str>, status: u16) -> Value {
        let (got, answer) = self.call(method, path, body);
        assert_eq!(got, status, "{method} {path} {body:?}: {answer}");
        answer
    }

    /// A request that must fail with `status` and the Kafka-named `code`; returns the message.
    pub fn expect_error(&self, method: &str, path: &str, body: Option<&str>, status: u16, code: &str) -> String {
        let answer = self.expect(method, path, body, status);
        assert_eq!(answer["error"]["code"], code, "{method} {path}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default().to_string();
        assert!(!message.is_empty(), "{method} {path}: an error without message: {answer}");
        message
    }

    /// Creates a topic over HTTP; panics unless it is created.
    pub fn create_topic(&self, name: &str, partitions: i32) {
        let body = serde_json::json!({ "name": name, "partitions": partitions }).to_string();
        self.expect("POST", "/v1/topics", Some(&body), 201);
    }

    /// Runs `weir ARGS` against this server (through WEIR_ADMIN) with `stdin`.
    pub fn weir(&self, args: &[&str], stdin: &str) -> CliOutput {
        run_weir(args, stdin, &[("WEIR_ADMIN", self.admin.as_str())])
    }
}

/// `weir server` on a port another socket holds, with `env`: it reads its settings, warns (on
/// stderr, a pipe), and exits 1 without opening a data directory.
pub fn start_on_a_busy_port(env: &[(&str, &str)]) -> CliOutput {
    let scratch = tempfile::Builder::new().prefix("weir-busy-port-").tempdir().expect("scratch dir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let addr = taken.local_addr().expect("local address").to_string();
    let data_dir = scratch.path().join("data");
    let args = [
        "server",
        "--listen",
        &addr,
        "--set",
        "admin.listeners=",
        "--set",
        "rocketmq.listeners=",
        "--data-dir",
        scratch_path(&data_dir),
    ];
    let output = run_weir(&args, "", env);
    assert_eq!(output.code, Some(1), "{output:?}");
    assert!(output.stderr.contains(&format!("cannot listen on {addr}")), "{output:?}");
    output
}

/// A scratch path as the text of an argument.
pub fn scratch_path(path: &std::path::Path) -> &str {
    path.to_str().expect("a UTF-8 scratch path")
}

/// What a `weir` client command did.
#[derive(Debug)]
pub struct CliOutput {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl CliOutput {
    /// Panics unless the command exited 0; returns stdout.
    pub fn ok(&self) -> &str {
        assert_eq!(self.code, Some(0), "the command failed:\nstdout: {}\nstderr: {}", self.stdout, self.stderr);
        &self.stdout
    }

    /// Panics unless the command exited 1 with exactly one line `error: ...` on stderr;
    /// returns that line.
    pub fn failed(&self) -> &str {
        assert_eq!(self.code, Some(1), "expected exit status 1:\nstdout: {}\nstderr: {}", self.stdout, self.stderr);
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "expected one line on stderr: {:?}", self.stderr);
        assert!(lines[0].starts_with("error: "), "{:?}", lines[0]);
        lines[0]
    }

    /// stdout's lines parsed as JSON, one object each.
    pub fn json_lines(&self) -> Vec<Value> {
        self.ok().lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}"))).collect()
    }
}

/// Runs `weir ARGS` with `stdin` and extra environment variables (any WEIR_* and RUST_LOG of
/// the test run removed first).
pub fn run_weir(args: &[&str], stdin: &str, env: &[(&str, &str)]) -> CliOutput {
    let mut command = support::weir_command();
    command.args(args).env_remove("RUST_LOG").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("spawn weir");
    let mut input = child.stdin.take().expect("piped stdin");
    let text = stdin.to_string();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(text.as_bytes());
    });
    let Output { status, stdout, stderr } = child.wait_with_output().expect("wait for weir");
    let _ = writer.join();
    CliOutput {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}
