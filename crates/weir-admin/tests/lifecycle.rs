//! The admin listener across the broker's life: it answers from the moment it is bound,
//! `/ready` is 503 while the broker starts and once it begins shutting down, and graceful
//! shutdown ends the server. In-process (a real broker in a scratch directory), because a
//! broker's start-up and shutdown windows are too short to hit from outside.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use weir_admin::{AdminState, Core};
use weir_broker::{Broker, BrokerConfig};
use weir_coordinators::group::GroupCoordinator;

/// A GET over a fresh connection: (status, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("read");
    let text = String::from_utf8(response).expect("utf-8 response");
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status line");
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_a_starting_broker_ready_is_503_until_handed_over_and_again_when_shutting_down() {
    let dir = tempfile::tempdir().expect("scratch dir");
    let settings: BTreeMap<String, String> = [
        ("log.dirs".to_string(), dir.path().join("data").display().to_string()),
        ("offsets.topic.num.partitions".to_string(), "1".to_string()),
    ]
    .into();
    let config = BrokerConfig::from_settings(&settings).expect("config");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let state = AdminState::new(Instant::now(), Some("127.0.0.1:9092".parse().expect("addr")), Some(addr));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(weir_admin::serve(listener, None, state.clone(), async {
        let _ = stopped.await;
    }));

    assert_eq!(get(addr, "/health").await, (200, r#"{"status":"ok"}"#.to_string()));
    assert_eq!(get(addr, "/ready").await, (503, r#"{"status":"starting"}"#.to_string()));
    let (status, body) = get(addr, "/v1/topics").await;
    assert_eq!(status, 503);
    assert!(body.contains(r#""code":"BROKER_NOT_AVAILABLE""#), "{body}");

    let (broker, messaging) = tokio::task::spawn_blocking(move || {
        let broker = Broker::open(config).expect("open");
        let messaging = weir_messaging::Messaging::open(&broker).expect("messaging");
        (broker, messaging)
    })
    .await
    .expect("join");
    let opened = broker.clone();
    let groups =
        tokio::task::spawn_blocking(move || GroupCoordinator::start(opened)).await.expect("join").expect("groups");
    state.set_ready(Core { broker: broker.clone(), groups: groups.clone(), messaging });
    assert_eq!(get(addr, "/ready").await, (200, r#"{"status":"ready"}"#.to_string()));
    let (status, body) = get(addr, "/v1/topics").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("__consumer_offsets"), "{body}");

    broker.begin_shutdown();
    assert_eq!(get(addr, "/ready").await, (503, r#"{"status":"shutting_down"}"#.to_string()));
    assert_eq!(get(addr, "/health").await.0, 200, "live until the process ends");

    stop.send(()).expect("server running");
    server.await.expect("join").expect("graceful shutdown");
    assert!(TcpStream::connect(addr).await.is_err(), "the listener is closed");
    groups.shutdown();
    tokio::task::spawn_blocking(move || broker.shutdown()).await.expect("join").expect("clean shutdown");
}
