//! The transport over real TCP on 127.0.0.1: clients and servers of this crate, and raw sockets
//! that speak the documented format byte by byte (so a change of the wire format shows here).
//!
//! Every test is bounded ([`bounded`]); waits are on events (a handler's arrival, a call's end)
//! except where a test asserts that something does *not* happen, which needs a window.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use weir_rpc::{
    decode_json, encode_json, serve, BoxFuture, CallPhase, ClientConfig, Handler, RemoteError, RpcClient, RpcError,
    RpcErrorKind, ServerConfig,
};

const LONG: Duration = Duration::from_secs(20);

/// Fails a test that hangs instead of hanging the suite.
async fn bounded<T>(test: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), test).await.expect("the test did not finish within 60 s")
}

// ---- a handler with a method for each behaviour under test ----

/// A request parked in the `gate` method until the test releases it.
struct Arrival {
    key: u64,
    release: oneshot::Sender<()>,
}

#[derive(Default)]
struct Counters {
    calls: AtomicUsize,
    in_flight: AtomicUsize,
    in_flight_max: AtomicUsize,
}

struct TestHandler {
    arrivals: mpsc::UnboundedSender<Arrival>,
    counters: Arc<Counters>,
}

#[derive(Serialize, Deserialize)]
struct Add {
    a: i64,
    b: i64,
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Sum {
    sum: i64,
}

impl Handler for TestHandler {
    fn handle(&self, method: &str, body: Bytes) -> BoxFuture<'static, Result<Bytes, RemoteError>> {
        self.counters.calls.fetch_add(1, Ordering::SeqCst);
        let method = method.to_owned();
        let arrivals = self.arrivals.clone();
        let counters = self.counters.clone();
        Box::pin(async move {
            match method.as_str() {
                "echo" => Ok(body),
                "add" => {
                    let Add { a, b } = decode_json(&method, &body)?;
                    encode_json(&method, &Sum { sum: a + b })
                }
                "fail" => Err(RemoteError::new("failed on purpose")),
                "panic" => panic!("a handler that panics"),
                // Answers with as many bytes as the body's u32 says.
                "big" => {
                    let size = u32::from_be_bytes(body[..4].try_into().expect("4 bytes"));
                    Ok(Bytes::from(vec![7u8; size as usize]))
                }
                // Parks until released; answers with its key (the body).
                "gate" => {
                    let now = counters.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    counters.in_flight_max.fetch_max(now, Ordering::SeqCst);
                    let key = u64::from_be_bytes(body[..8].try_into().expect("8 bytes"));
                    let (release, released) = oneshot::channel();
                    let _ = arrivals.send(Arrival { key, release });
                    let _ = released.await;
                    counters.in_flight.fetch_sub(1, Ordering::SeqCst);
                    Ok(body)
                }
                other => Err(RemoteError::unknown_method(other)),
            }
        })
    }
}

/// A call parked in `gate` over a client's connection: once it finishes, it shows that the
/// connection was not disturbed by whatever happened meanwhile.
struct Parked {
    key: u64,
    call: JoinHandle<Result<Bytes, RpcError>>,
    release: oneshot::Sender<()>,
}

impl Parked {
    async fn finish(self) {
        let _ = self.release.send(());
        assert_eq!(self.call.await.expect("task").expect("the parked call"), key(self.key));
    }
}

struct TestServer {
    addr: SocketAddr,
    counters: Arc<Counters>,
    arrivals: mpsc::UnboundedReceiver<Arrival>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl TestServer {
    async fn start(config: ServerConfig) -> TestServer {
        TestServer::start_at("127.0.0.1:0".parse().expect("address"), config).await
    }

    async fn start_at(addr: SocketAddr, config: ServerConfig) -> TestServer {
        let listener = TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let (arrivals_tx, arrivals) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let handler = Arc::new(TestHandler { arrivals: arrivals_tx, counters: counters.clone() });
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, handler, config, async {
            let _ = stopped.await;
        }));
        TestServer { addr, counters, arrivals, stop: Some(stop), task }
    }

    /// The next request parked in `gate`.
    async fn arrival(&mut self) -> Arrival {
        tokio::time::timeout(LONG, self.arrivals.recv())
            .await
            .expect("a gate request within the wait")
            .expect("the handler is alive")
    }

    /// Parks a call of `client` in `gate` and waits until it is there.
    async fn park(&mut self, client: &RpcClient, k: u64) -> Parked {
        let call = spawn_call(client, self.addr, "gate", key(k));
        let arrival = self.arrival().await;
        assert_eq!(arrival.key, k);
        Parked { key: k, call, release: arrival.release }
    }

    /// Asserts that no further request reaches `gate` for a while.
    async fn assert_no_arrival(&mut self) {
        let next = tokio::time::timeout(Duration::from_millis(300), self.arrivals.recv()).await;
        assert!(next.is_err(), "a request got past the in-flight limit");
    }

    fn calls(&self) -> usize {
        self.counters.calls.load(Ordering::SeqCst)
    }

    /// Begins shutdown; the returned task ends when `serve` has returned.
    fn begin_stop(&mut self) -> &mut JoinHandle<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        &mut self.task
    }

    async fn stop(mut self) {
        self.begin_stop().await.expect("serve returned");
    }
}

fn client() -> RpcClient {
    RpcClient::new(ClientConfig::default())
}

fn key(k: u64) -> Bytes {
    Bytes::copy_from_slice(&k.to_be_bytes())
}

fn size(n: u32) -> Bytes {
    Bytes::copy_from_slice(&n.to_be_bytes())
}

fn spawn_call(
    client: &RpcClient,
    peer: SocketAddr,
    method: &'static str,
    body: Bytes,
) -> JoinHandle<Result<Bytes, RpcError>> {
    let client = client.clone();
    tokio::spawn(async move { client.call(peer, method, body, LONG).await })
}

#[track_caller]
fn expect_kind(result: Result<Bytes, RpcError>) -> RpcErrorKind {
    match result {
        Ok(body) => panic!("expected an error, got an answer of {} bytes", body.len()),
        Err(e) => {
            eprintln!("as expected: {e}");
            e.into_kind()
        }
    }
}

// ---- raw frames, built from the documented layout ----

fn raw_frame(version: u8, kind: u8, correlation_id: u64, method: &[u8], body: &[u8]) -> Vec<u8> {
    let mut frame = Vec::new();
    frame.extend_from_slice(&((12 + method.len() + body.len()) as u32).to_be_bytes());
    frame.push(version);
    frame.push(kind);
    frame.extend_from_slice(&correlation_id.to_be_bytes());
    frame.extend_from_slice(&(method.len() as u16).to_be_bytes());
    frame.extend_from_slice(method);
    frame.extend_from_slice(body);
    frame
}

#[derive(Debug)]
struct RawFrame {
    kind: u8,
    correlation_id: u64,
    body: Vec<u8>,
}

/// The next frame, or `None` once the server has closed the connection.
async fn read_raw(stream: &mut TcpStream) -> Option<RawFrame> {
    let mut length = [0u8; 4];
    stream.read_exact(&mut length).await.ok()?;
    let mut rest = vec![0u8; u32::from_be_bytes(length) as usize];
    stream.read_exact(&mut rest).await.expect("a whole frame");
    assert_eq!(rest[0], 1, "the server answers in version 1");
    let method_bytes = u16::from_be_bytes([rest[10], rest[11]]) as usize;
    assert_eq!(method_bytes, 0, "answers name no method");
    Some(RawFrame {
        kind: rest[1],
        correlation_id: u64::from_be_bytes(rest[2..10].try_into().expect("8 bytes")),
        body: rest[12..].to_vec(),
    })
}

/// Reads an error frame for `correlation_id` with `code`, then the end of the connection;
/// returns its message.
async fn expect_error_then_close(stream: &mut TcpStream, correlation_id: u64, code: u8) -> String {
    let frame = tokio::time::timeout(LONG, read_raw(stream)).await.expect("an answer").expect("an error frame");
    assert_eq!((frame.kind, frame.correlation_id, frame.body[0]), (2, correlation_id, code), "{frame:?}");
    let message = String::from_utf8(frame.body[1..].to_vec()).expect("UTF-8");
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(LONG, stream.read_to_end(&mut rest)).await.expect("the server closes");
    assert!(rest.is_empty(), "nothing after the error frame");
    message
}

// ---- the tests ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_returns_the_handlers_answer() {
    bounded(async {
        let server = TestServer::start(ServerConfig::default()).await;
        let client = client();
        let answer = client.call(server.addr, "echo", Bytes::from_static(b"hello"), LONG).await.expect("echo");
        assert_eq!(&answer[..], b"hello");
        let empty = client.call(server.addr, "echo", Bytes::new(), LONG).await.expect("echo");
        assert!(empty.is_empty());
        let sum: Sum = client.call_json(server.addr, "add", &Add { a: 40, b: 2 }, LONG).await.expect("add");
        assert_eq!(sum, Sum { sum: 42 });
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_share_one_connection_and_are_answered_as_they_complete() {
    bounded(async {
        // With one connection allowed, a second connection would fail its calls.
        let config = ServerConfig { max_connections: 1, max_in_flight_per_connection: 64, ..ServerConfig::default() };
        let mut server = TestServer::start(config).await;
        let client = client();
        let calls: Vec<_> = (0..32).map(|k| spawn_call(&client, server.addr, "gate", key(k))).collect();
        let mut gates: Vec<Option<oneshot::Sender<()>>> = (0..32).map(|_| None).collect();
        for _ in 0..32 {
            let arrival = server.arrival().await;
            gates[arrival.key as usize] = Some(arrival.release);
        }
        // Last in, first out: each answer comes back while every earlier call still waits.
        for (k, call) in calls.into_iter().enumerate().rev() {
            let _ = gates[k].take().expect("arrived").send(());
            let answer = call.await.expect("task").expect("gate");
            assert_eq!(answer, key(k as u64));
        }
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_error_reaches_the_caller_as_remote() {
    bounded(async {
        let server = TestServer::start(ServerConfig::default()).await;
        let client = client();
        let kind = expect_kind(client.call(server.addr, "fail", Bytes::new(), LONG).await);
        assert!(matches!(&kind, RpcErrorKind::Remote(m) if m == "failed on purpose"), "{kind:?}");
        let kind = expect_kind(client.call(server.addr, "no.such.method", Bytes::new(), LONG).await);
        assert!(matches!(&kind, RpcErrorKind::Remote(m) if m.contains("unknown method")), "{kind:?}");
        // A panic is answered too, not left to the caller's timeout.
        let started = Instant::now();
        let kind = expect_kind(client.call(server.addr, "panic", Bytes::new(), LONG).await);
        assert!(matches!(&kind, RpcErrorKind::Remote(m) if m.contains("panicked")), "{kind:?}");
        assert!(started.elapsed() < LONG / 2);
        let bad_json = expect_kind(client.call(server.addr, "add", Bytes::from_static(b"{"), LONG).await);
        assert!(matches!(&bad_json, RpcErrorKind::Remote(m) if m.contains("JSON")), "{bad_json:?}");
        // The connection is still good.
        client.call(server.addr, "echo", Bytes::new(), LONG).await.expect("echo after errors");
        // The error names the peer and the method.
        let e = client.call(server.addr, "fail", Bytes::new(), LONG).await.expect_err("fails");
        assert_eq!((e.peer(), e.method()), (server.addr, "fail"));
        let shown = e.to_string();
        assert!(shown.contains(&server.addr.to_string()) && shown.contains("fail"), "{shown}");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_refuses_a_request_over_its_frame_limit() {
    bounded(async {
        let server = TestServer::start(ServerConfig { max_frame_bytes: 16 * 1024, ..ServerConfig::default() }).await;
        let client = client();
        let kind = expect_kind(client.call(server.addr, "echo", Bytes::from(vec![1u8; 32 * 1024]), LONG).await);
        assert!(matches!(&kind, RpcErrorKind::TooLarge(m) if m.contains("server's limit")), "{kind:?}");
        assert_eq!(server.calls(), 0, "the handler never saw it");
        // The server closed that connection; the next call makes another.
        client
            .call(server.addr, "echo", Bytes::from(vec![1u8; 8 * 1024]), LONG)
            .await
            .expect("a call within the limit");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_length_of_4_gib_is_refused_without_being_read() {
    bounded(async {
        let server = TestServer::start(ServerConfig::default()).await;
        let mut raw = TcpStream::connect(server.addr).await.expect("connect");
        // A header that announces u32::MAX bytes, and nothing after it.
        let mut header = raw_frame(1, 0, 42, b"echo", b"");
        header[..4].copy_from_slice(&u32::MAX.to_be_bytes());
        raw.write_all(&header).await.expect("write");
        let message = expect_error_then_close(&mut raw, 42, 0x81).await;
        assert!(message.contains("4294967295"), "{message}");
        // Others are served.
        client().call(server.addr, "echo", Bytes::new(), LONG).await.expect("another connection");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_refuses_to_send_a_request_over_its_frame_limit() {
    bounded(async {
        let server = TestServer::start(ServerConfig::default()).await;
        let client = RpcClient::new(ClientConfig { max_frame_bytes: 16 * 1024, ..ClientConfig::default() });
        let kind = expect_kind(client.call(server.addr, "echo", Bytes::from(vec![1u8; 32 * 1024]), LONG).await);
        assert!(matches!(&kind, RpcErrorKind::TooLarge(m) if m.contains("this client's")), "{kind:?}");
        client.call(server.addr, "echo", Bytes::new(), LONG).await.expect("echo");
        assert_eq!(server.calls(), 1, "only the call within the limit was sent");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_the_clients_limit_fails_that_call_only() {
    bounded(async {
        let mut server = TestServer::start(ServerConfig { max_connections: 1, ..ServerConfig::default() }).await;
        let client = RpcClient::new(ClientConfig { max_frame_bytes: 16 * 1024, ..ClientConfig::default() });
        let parked = server.park(&client, 1).await;
        let kind = expect_kind(client.call(server.addr, "big", size(64 * 1024), LONG).await);
        assert!(matches!(&kind, RpcErrorKind::TooLarge(m) if m.contains("this client's")), "{kind:?}");
        // The call pending on the same connection is unharmed, and the connection goes on.
        parked.finish().await;
        let answer = client.call(server.addr, "big", size(1000), LONG).await.expect("a response within the limit");
        assert_eq!(answer.len(), 1000);
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_the_servers_limit_becomes_a_too_large_error() {
    bounded(async {
        let server = TestServer::start(ServerConfig { max_frame_bytes: 16 * 1024, ..ServerConfig::default() }).await;
        let client = client();
        let kind = expect_kind(client.call(server.addr, "big", size(64 * 1024), LONG).await);
        assert!(matches!(&kind, RpcErrorKind::TooLarge(m) if m.contains("server's frame limit")), "{kind:?}");
        client.call(server.addr, "echo", Bytes::new(), LONG).await.expect("echo");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_version_is_told_the_supported_ones_and_only_its_connection_closes() {
    bounded(async {
        let mut server = TestServer::start(ServerConfig::default()).await;
        let client = client();
        let parked = server.park(&client, 5).await;
        let mut raw = TcpStream::connect(server.addr).await.expect("connect");
        raw.write_all(&raw_frame(2, 0, 7, b"echo", b"from the future")).await.expect("write");
        let message = expect_error_then_close(&mut raw, 0, 0x82).await;
        assert!(message.contains("version 2") && message.contains("supported: 1"), "{message}");
        parked.finish().await;
        client.call(server.addr, "echo", Bytes::new(), LONG).await.expect("echo");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_truncated_frames_close_only_their_connection() {
    bounded(async {
        let mut server = TestServer::start(ServerConfig::default()).await;
        let client = client();
        let parked = server.park(&client, 9).await;

        // Not this protocol at all: "GET " is a length of 1.2 GB, "/" version 47.
        let mut http = TcpStream::connect(server.addr).await.expect("connect");
        http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
        expect_error_then_close(&mut http, 0, 0x82).await;

        // A sound header of an unknown kind: answered with its correlation id.
        let mut odd_kind = TcpStream::connect(server.addr).await.expect("connect");
        odd_kind.write_all(&raw_frame(1, 9, 77, b"", b"")).await.expect("write");
        let message = expect_error_then_close(&mut odd_kind, 77, 0x83).await;
        assert!(message.contains("kind"), "{message}");

        // A response sent to a server.
        let mut backwards = TcpStream::connect(server.addr).await.expect("connect");
        backwards.write_all(&raw_frame(1, 1, 78, b"", b"")).await.expect("write");
        expect_error_then_close(&mut backwards, 78, 0x83).await;

        // Half a frame, then the end of the stream: closed without an answer.
        let mut truncated = TcpStream::connect(server.addr).await.expect("connect");
        let frame = raw_frame(1, 0, 79, b"echo", b"0123456789");
        truncated.write_all(&frame[..frame.len() - 4]).await.expect("write");
        truncated.shutdown().await.expect("shutdown");
        assert!(read_raw(&mut truncated).await.is_none(), "no answer to half a frame");

        // A whole raw request is answered as documented.
        let mut raw = TcpStream::connect(server.addr).await.expect("connect");
        raw.write_all(&raw_frame(1, 0, 80, b"echo", b"raw")).await.expect("write");
        let answer = read_raw(&mut raw).await.expect("an answer");
        assert_eq!((answer.kind, answer.correlation_id, &answer.body[..]), (1, 80, &b"raw"[..]));

        // Meanwhile the well-behaved connection was untouched.
        parked.finish().await;
        client.call(server.addr, "echo", Bytes::new(), LONG).await.expect("echo");
        server.stop().await;
    })
    .await;
}

/// A peer that accepts connections and never reads or writes them (as a SIGSTOPped process's
/// kernel would). Ends with its task.
fn silent_peer(listener: TcpListener) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_answers_stalls_only_its_own_calls() {
    bounded(async {
        let healthy = TestServer::start(ServerConfig::default()).await;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let silent_addr = listener.local_addr().expect("address");
        let silent = silent_peer(listener);
        let client = client();
        let silent_timeout = Duration::from_secs(3);

        // Enough bytes to the silent peer that its socket buffers fill and the writer blocks.
        let started = Instant::now();
        let stalled: Vec<_> = (0..16)
            .map(|_| {
                let client = client.clone();
                tokio::spawn(async move {
                    client.call(silent_addr, "echo", Bytes::from(vec![0u8; 1024 * 1024]), silent_timeout).await
                })
            })
            .collect();
        // Meanwhile, 500 calls to the healthy peer, 50 at a time.
        let healthy_started = Instant::now();
        for _ in 0..10 {
            let batch: Vec<_> = (0..50).map(|k| spawn_call(&client, healthy.addr, "echo", key(k))).collect();
            for (k, call) in batch.into_iter().enumerate() {
                assert_eq!(call.await.expect("task").expect("healthy echo"), key(k as u64));
            }
        }
        let healthy_took = healthy_started.elapsed();
        assert!(
            healthy_took < silent_timeout / 3,
            "the healthy peer's calls took {healthy_took:?}, against the silent one's timeout of {silent_timeout:?}"
        );
        for call in stalled {
            match expect_kind(call.await.expect("task")) {
                RpcErrorKind::Timeout { after, phase } => {
                    assert_eq!(after, silent_timeout);
                    assert!(matches!(phase, CallPhase::Sending | CallPhase::WaitingForAnswer), "{phase:?}");
                }
                other => panic!("expected a timeout, got {other:?}"),
            }
        }
        let waited = started.elapsed();
        assert!(waited >= silent_timeout && waited < silent_timeout * 3, "the timeouts fired after {waited:?}");
        silent.abort();
        healthy.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_gives_up_on_a_client_that_does_not_read_its_answers() {
    bounded(async {
        let write_timeout = Duration::from_millis(300);
        let config = ServerConfig { write_timeout, max_in_flight_per_connection: 4, ..ServerConfig::default() };
        let server = TestServer::start(config).await;
        // 64 MiB of answers asked for: far beyond what loopback socket buffers hold.
        let mut raw = TcpStream::connect(server.addr).await.expect("connect");
        let answer_bytes = 4 * 1024 * 1024;
        for id in 1..=16 {
            raw.write_all(&raw_frame(1, 0, id, b"big", &(answer_bytes as u32).to_be_bytes())).await.expect("write");
        }
        // Not reading is the point: let several write timeouts pass.
        tokio::time::sleep(write_timeout * 5).await;
        let mut received = 0usize;
        let mut scratch = vec![0u8; 1024 * 1024];
        // Until the end of the stream (or a reset); a server that had not given up would send
        // everything and then fall silent.
        while let Ok(Ok(n @ 1..)) = tokio::time::timeout(Duration::from_secs(2), raw.read(&mut scratch)).await {
            received += n;
        }
        assert!(received < 16 * answer_bytes, "the server wrote all {received} bytes instead of giving up");
        // Others are served.
        client().call(server.addr, "echo", Bytes::new(), LONG).await.expect("another connection");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_port_fails_fast_as_unreachable() {
    bounded(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        drop(listener);
        let client = client();
        let started = Instant::now();
        let kind = expect_kind(client.call(addr, "echo", Bytes::new(), LONG).await);
        assert!(matches!(kind, RpcErrorKind::Unreachable(_)), "{kind:?}");
        assert!(started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());
        // And again: every call tries to connect.
        let kind = expect_kind(client.call(addr, "echo", Bytes::new(), LONG).await);
        assert!(matches!(kind, RpcErrorKind::Unreachable(_)), "{kind:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_reconnects_after_the_server_restarts_on_the_same_port() {
    bounded(async {
        let server = TestServer::start(ServerConfig::default()).await;
        let addr = server.addr;
        let client = client();
        client.call(addr, "echo", Bytes::from_static(b"one"), LONG).await.expect("before the restart");
        server.stop().await;
        let kind = expect_kind(client.call(addr, "echo", Bytes::new(), LONG).await);
        assert!(matches!(kind, RpcErrorKind::Unreachable(_)), "nothing listens: {kind:?}");
        let server = TestServer::start_at(addr, ServerConfig::default()).await;
        let answer = client.call(addr, "echo", Bytes::from_static(b"two"), LONG).await.expect("after the restart");
        assert_eq!(&answer[..], b"two");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_closed_by_a_restart_is_replaced_without_a_failed_call() {
    bounded(async {
        let server = TestServer::start(ServerConfig::default()).await;
        let addr = server.addr;
        let client = client();
        client.call(addr, "echo", Bytes::new(), LONG).await.expect("before the restart");
        server.stop().await;
        let server = TestServer::start_at(addr, ServerConfig::default()).await;
        // The server closed the old connection with "shutting down" (refused). Whether the
        // client has read that yet or reads it only after queueing this request, the request
        // was not read, so it goes out on a new connection: no call fails.
        let answer = client.call(addr, "echo", Bytes::from_static(b"x"), LONG).await.expect("after the restart");
        assert_eq!(&answer[..], b"x");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_fails_its_pending_calls_at_once() {
    bounded(async {
        // A peer that reads three requests, then drops the connection without answering.
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let peer = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            for _ in 0..3 {
                let mut length = [0u8; 4];
                stream.read_exact(&mut length).await.expect("a request");
                let mut rest = vec![0u8; u32::from_be_bytes(length) as usize];
                stream.read_exact(&mut rest).await.expect("a whole request");
            }
            drop(stream);
            listener
        });
        let client = client();
        let started = Instant::now();
        let calls: Vec<_> = (0..3).map(|k| spawn_call(&client, addr, "echo", key(k))).collect();
        for call in calls {
            let kind = expect_kind(call.await.expect("task"));
            assert!(matches!(kind, RpcErrorKind::ConnectionLost(_)), "{kind:?}");
        }
        assert!(started.elapsed() < LONG / 4, "the calls failed only after {:?}", started.elapsed());
        drop(peer.await.expect("peer"));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_bounds_requests_in_flight_per_connection() {
    bounded(async {
        let config = ServerConfig { max_in_flight_per_connection: 4, ..ServerConfig::default() };
        let mut server = TestServer::start(config).await;
        let client = client();
        let calls: Vec<_> = (0..12).map(|k| spawn_call(&client, server.addr, "gate", key(k))).collect();
        let mut parked = Vec::new();
        for _ in 0..4 {
            parked.push(server.arrival().await);
        }
        server.assert_no_arrival().await;
        // Each answer frees one slot, and lets exactly one more request in.
        for _ in 0..8 {
            let _ = parked.remove(0).release.send(());
            parked.push(server.arrival().await);
        }
        for arrival in parked {
            let _ = arrival.release.send(());
        }
        for (k, call) in calls.into_iter().enumerate() {
            assert_eq!(call.await.expect("task").expect("gate"), key(k as u64));
        }
        assert_eq!(server.counters.in_flight_max.load(Ordering::SeqCst), 4);
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_bounds_calls_in_flight_per_peer() {
    bounded(async {
        let mut server = TestServer::start(ServerConfig::default()).await;
        let client = RpcClient::new(ClientConfig { max_in_flight_per_peer: 3, ..ClientConfig::default() });
        let calls: Vec<_> = (0..10).map(|k| spawn_call(&client, server.addr, "gate", key(k))).collect();
        let mut parked = Vec::new();
        for _ in 0..3 {
            parked.push(server.arrival().await);
        }
        server.assert_no_arrival().await;
        // With every slot taken, a call waits for one, within its own timeout.
        let kind = expect_kind(client.call(server.addr, "echo", Bytes::new(), Duration::from_millis(200)).await);
        assert!(matches!(kind, RpcErrorKind::Timeout { phase: CallPhase::WaitingForSlot, .. }), "{kind:?}");
        // Each answer frees one slot, and lets exactly one more call through.
        let mut arrived = parked.len();
        while !parked.is_empty() {
            let _ = parked.remove(0).release.send(());
            if arrived < calls.len() {
                parked.push(server.arrival().await);
                arrived += 1;
            }
        }
        for (k, call) in calls.into_iter().enumerate() {
            assert_eq!(call.await.expect("task").expect("gate"), key(k as u64));
        }
        assert_eq!(server.counters.in_flight_max.load(Ordering::SeqCst), 3);
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_the_requests_in_flight_then_closes() {
    bounded(async {
        let mut server = TestServer::start(ServerConfig::default()).await;
        let addr = server.addr;
        let client = client();
        let parked = server.park(&client, 3).await;
        // An idle connection, known to be served, to see when shutdown has begun.
        let mut idle = TcpStream::connect(addr).await.expect("connect");
        idle.write_all(&raw_frame(1, 0, 1, b"echo", b"")).await.expect("write");
        assert_eq!(read_raw(&mut idle).await.expect("an answer").kind, 1);
        let serving = server.begin_stop();
        let message = expect_error_then_close(&mut idle, 0, 0x84).await;
        assert!(message.contains("shutting down"), "{message}");
        // Shutdown is under way, and waits for the parked request.
        assert!(!parked.call.is_finished() && !serving.is_finished());
        parked.finish().await;
        serving.await.expect("serve returned");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cuts_off_a_handler_after_the_grace_and_answers_its_caller() {
    bounded(async {
        let config = ServerConfig { shutdown_grace: Duration::from_millis(200), ..ServerConfig::default() };
        let mut server = TestServer::start(config).await;
        let client = client();
        let never_released = server.park(&client, 4).await;
        let started = Instant::now();
        server.begin_stop().await.expect("serve returned");
        let kind = expect_kind(never_released.call.await.expect("task"));
        // Cut off, the handler is answered with an error, at once, not at the call's timeout.
        assert!(matches!(&kind, RpcErrorKind::Remote(m) if m.contains("cut off")), "{kind:?}");
        assert!(started.elapsed() < LONG / 4, "took {:?}", started.elapsed());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_over_max_connections_is_refused() {
    bounded(async {
        let server = TestServer::start(ServerConfig { max_connections: 1, ..ServerConfig::default() }).await;
        let first = client();
        first.call(server.addr, "echo", Bytes::new(), LONG).await.expect("the one connection");
        let mut raw = TcpStream::connect(server.addr).await.expect("connect");
        let message = expect_error_then_close(&mut raw, 0, 0x84).await;
        assert!(message.contains("max_connections=1"), "{message}");
        // Refused, the request was not handled: the caller is told the peer is unreachable.
        let kind = expect_kind(client().call(server.addr, "echo", Bytes::new(), LONG).await);
        assert!(matches!(&kind, RpcErrorKind::Unreachable(m) if m.contains("max_connections=1")), "{kind:?}");
        first.call(server.addr, "echo", Bytes::new(), LONG).await.expect("the first connection goes on");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_fails_pending_calls_and_the_next_call_reconnects() {
    bounded(async {
        let mut server = TestServer::start(ServerConfig::default()).await;
        let client = client();
        let parked = server.park(&client, 6).await;
        client.disconnect(server.addr).await;
        let kind = expect_kind(parked.call.await.expect("task"));
        assert!(matches!(&kind, RpcErrorKind::ConnectionLost(m) if m.contains("disconnected")), "{kind:?}");
        client.call(server.addr, "echo", Bytes::new(), LONG).await.expect("a new connection");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_name_must_fit_the_frame() {
    bounded(async {
        let client = client();
        let addr: SocketAddr = "127.0.0.1:9".parse().expect("address");
        let kind = expect_kind(client.call(addr, "", Bytes::new(), LONG).await);
        assert!(matches!(kind, RpcErrorKind::Protocol(_)), "{kind:?}");
        let long = "m".repeat(70_000);
        let e = client.call(addr, &long, Bytes::new(), LONG).await.expect_err("refused");
        assert!(matches!(e.kind(), RpcErrorKind::Protocol(m) if m.contains("70000")), "{:?}", e.kind());
    })
    .await;
}
