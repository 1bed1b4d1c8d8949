//! The transport over TLS on 127.0.0.1, with a CA and certificates made for each test by rcgen:
//! calls, mutual TLS and `admit`, handshake failures and timeouts, and what a peer that speaks
//! the other protocol gets.
//!
//! Every test is bounded ([`bounded`]); a test that asserts something does *not* happen yet
//! uses a window well within the timeout it races.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Barrier};
use tokio::task::JoinHandle;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use weir_rpc::{
    serve, Admit, BoxFuture, ClientConfig, ClientTls, Handler, RemoteError, RpcClient, RpcError, RpcErrorKind,
    ServerConfig, ServerTls,
};

const LONG: Duration = Duration::from_secs(20);

/// Fails a test that hangs instead of hanging the suite.
async fn bounded<T>(test: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), test).await.expect("the test did not finish within 60 s")
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

// ---- certificates ----

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A certificate and its key, as rustls takes them.
struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivatePkcs8KeyDer<'static>,
}

impl Identity {
    fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(self.key.clone_key())
    }
}

/// A CA that signs certificates for the tests.
struct Ca {
    cert: Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("CA certificate");
        Ca { cert, key }
    }

    fn sign(&self, name: &str, ip: Option<IpAddr>, usage: ExtendedKeyUsagePurpose) -> Identity {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.subject_alt_names.extend(ip.map(SanType::IpAddress));
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.cert, &self.key).expect("certificate");
        Identity { chain: vec![cert.der().clone()], key: PrivatePkcs8KeyDer::from(key.serialize_der()) }
    }

    /// A certificate for 127.0.0.1, the address the tests' servers listen on.
    fn server(&self) -> Identity {
        self.sign("weir-rpc test server", Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), ExtendedKeyUsagePurpose::ServerAuth)
    }

    fn client(&self, name: &str) -> Identity {
        self.sign(name, None, ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn roots(&self) -> Arc<RootCertStore> {
        let mut roots = RootCertStore::empty();
        roots.add(self.cert.der().clone()).expect("a usable CA certificate");
        Arc::new(roots)
    }
}

/// A server configuration presenting `identity`; with `client_ca`, it asks for a client
/// certificate signed by that CA, and takes a client without one too (`admit` decides).
fn server_tls_config(identity: &Identity, client_ca: Option<&Ca>) -> Arc<rustls::ServerConfig> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("TLS versions");
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(ca.roots(), provider())
                .allow_unauthenticated()
                .build()
                .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        }
    };
    Arc::new(builder.with_single_cert(identity.chain.clone(), identity.key()).expect("certificate and key"))
}

/// A client configuration trusting `ca`, presenting `identity` if given.
fn client_tls_config(ca: &Ca, identity: Option<&Identity>) -> Arc<rustls::ClientConfig> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(ca.roots());
    Arc::new(match identity {
        None => builder.with_no_client_auth(),
        Some(identity) => builder.with_client_auth_cert(identity.chain.clone(), identity.key()).expect("client cert"),
    })
}

fn tls_client(ca: &Ca, identity: Option<&Identity>) -> RpcClient {
    let tls = ClientTls::fixed(client_tls_config(ca, identity));
    RpcClient::new(ClientConfig { tls: Some(tls), ..ClientConfig::default() })
}

// ---- a server ----

/// `echo` answers its body; `barrier` answers only once `barrier`'s count of calls are in it
/// at once.
struct TestHandler {
    barrier: Arc<Barrier>,
}

impl Handler for TestHandler {
    fn handle(&self, method: &str, body: Bytes) -> BoxFuture<'static, Result<Bytes, RemoteError>> {
        let method = method.to_owned();
        let barrier = self.barrier.clone();
        Box::pin(async move {
            match method.as_str() {
                "echo" => Ok(body),
                "barrier" => {
                    barrier.wait().await;
                    Ok(body)
                }
                other => Err(RemoteError::unknown_method(other)),
            }
        })
    }
}

struct TestServer {
    addr: SocketAddr,
    /// How many times the server asked for an acceptor: once per accepted TLS connection.
    acceptors: Arc<AtomicUsize>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// The TLS part of a server's configuration; `tls` is handed out for each connection.
fn server_tls(tls: Arc<rustls::ServerConfig>, admit: Option<Admit>, acceptors: &Arc<AtomicUsize>) -> ServerTls {
    let acceptors = acceptors.clone();
    ServerTls {
        acceptor: Arc::new(move || {
            acceptors.fetch_add(1, Ordering::SeqCst);
            TlsAcceptor::from(tls.clone())
        }),
        admit,
        handshake_timeout: Duration::from_secs(5),
    }
}

impl TestServer {
    /// A server at `addr` with `config`, its TLS built by `tls` (given the acceptor counter).
    async fn start(
        addr: SocketAddr,
        config: ServerConfig,
        tls: impl FnOnce(&Arc<AtomicUsize>) -> Option<ServerTls>,
        barrier: usize,
    ) -> TestServer {
        let listener = TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let acceptors = Arc::new(AtomicUsize::new(0));
        let config = ServerConfig { tls: tls(&acceptors), ..config };
        let handler = Arc::new(TestHandler { barrier: Arc::new(Barrier::new(barrier)) });
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, handler, config, async {
            let _ = stopped.await;
        }));
        TestServer { addr, acceptors, stop, task }
    }

    /// A TLS server on a free port presenting `identity`, without client certificates.
    async fn tls(identity: &Identity) -> TestServer {
        let tls = server_tls_config(identity, None);
        TestServer::start(local(), ServerConfig::default(), |acceptors| Some(server_tls(tls, None, acceptors)), 1).await
    }

    fn acceptors(&self) -> usize {
        self.acceptors.load(Ordering::SeqCst)
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.expect("serve returned");
    }
}

fn local() -> SocketAddr {
    "127.0.0.1:0".parse().expect("address")
}

async fn echo(client: &RpcClient, addr: SocketAddr, body: &'static [u8]) -> Result<Bytes, RpcError> {
    client.call(addr, "echo", Bytes::from_static(body), LONG).await
}

// ---- the tests ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_over_tls_returns_the_handlers_answer() {
    bounded(async {
        let ca = Ca::new("weir-rpc test CA");
        let server = TestServer::tls(&ca.server()).await;
        let client = tls_client(&ca, None);
        assert_eq!(&echo(&client, server.addr, b"hello").await.expect("echo")[..], b"hello");
        let big = Bytes::from(vec![7u8; 1024 * 1024]);
        assert_eq!(client.call(server.addr, "echo", big.clone(), LONG).await.expect("1 MiB echo"), big);
        assert_eq!(server.acceptors(), 1, "one connection, one acceptor");
        // A second client makes a second connection, with an acceptor asked for anew.
        echo(&tls_client(&ca, None), server.addr, b"again").await.expect("a second client");
        assert_eq!(server.acceptors(), 2);
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_share_one_tls_connection() {
    bounded(async {
        let ca = Ca::new("weir-rpc test CA");
        let tls = server_tls_config(&ca.server(), None);
        // With one connection allowed, a second one would be refused and fail its calls; the
        // barrier answers none of the 64 calls until all of them are in the handler at once.
        let config = ServerConfig { max_connections: 1, max_in_flight_per_connection: 64, ..ServerConfig::default() };
        let server = TestServer::start(local(), config, |a| Some(server_tls(tls, None, a)), 64).await;
        let client = tls_client(&ca, None);
        let calls: Vec<_> = (0..64u64)
            .map(|k| {
                let client = client.clone();
                let addr = server.addr;
                tokio::spawn(async move {
                    client.call(addr, "barrier", Bytes::copy_from_slice(&k.to_be_bytes()), LONG).await
                })
            })
            .collect();
        for (k, call) in calls.into_iter().enumerate() {
            let answer = call.await.expect("task").expect("a call through the barrier");
            assert_eq!(answer, Bytes::copy_from_slice(&(k as u64).to_be_bytes()));
        }
        assert_eq!(server.acceptors(), 1, "one TLS connection");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_client_of_a_tls_server_fails_promptly_and_the_server_goes_on() {
    bounded(async {
        let ca = Ca::new("weir-rpc test CA");
        let server = TestServer::tls(&ca.server()).await;
        let plain = RpcClient::new(ClientConfig::default());
        // The call's timeout bounds a hang; the failure must come well before it.
        let timeout = Duration::from_secs(5);
        let started = Instant::now();
        let kind = expect_kind(plain.call(server.addr, "echo", Bytes::new(), timeout).await);
        // The server's TLS alert, read where a frame should start, is named; or, if the close
        // overtook it, the connection is lost. Not a timeout, and not an answer.
        assert!(
            matches!(&kind, RpcErrorKind::Protocol(m) if m.contains("TLS is set up on one side"))
                || matches!(kind, RpcErrorKind::ConnectionLost(_)),
            "{kind:?}"
        );
        assert!(started.elapsed() < timeout / 2, "took {:?}", started.elapsed());
        // The server serves TLS clients as before.
        assert_eq!(&echo(&tls_client(&ca, None), server.addr, b"tls").await.expect("a TLS client")[..], b"tls");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_of_a_plain_server_fails_as_unreachable() {
    bounded(async {
        let ca = Ca::new("weir-rpc test CA");
        let server = TestServer::start(local(), ServerConfig::default(), |_| None, 1).await;
        let started = Instant::now();
        let kind = expect_kind(echo(&tls_client(&ca, None), server.addr, b"").await);
        assert!(matches!(&kind, RpcErrorKind::Unreachable(m) if m.contains("TLS handshake")), "{kind:?}");
        assert!(started.elapsed() < LONG / 4, "took {:?}", started.elapsed());
        echo(&RpcClient::new(ClientConfig::default()), server.addr, b"").await.expect("a plain client");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_trusts_another_ca_fails_as_unreachable_naming_tls() {
    bounded(async {
        let ca = Ca::new("weir-rpc test CA");
        let server = TestServer::tls(&ca.server()).await;
        let stranger = tls_client(&Ca::new("another CA"), None);
        let kind = expect_kind(echo(&stranger, server.addr, b"").await);
        let expected = format!("TLS handshake with {} failed", server.addr);
        assert!(
            matches!(&kind, RpcErrorKind::Unreachable(m) if m.contains(&expected) && m.contains("UnknownIssuer")),
            "{kind:?}"
        );
        // A certificate for another address, from the trusted CA, fails the same way.
        let elsewhere =
            ca.sign("elsewhere", Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))), ExtendedKeyUsagePurpose::ServerAuth);
        let misnamed = TestServer::tls(&elsewhere).await;
        let kind = expect_kind(echo(&tls_client(&ca, None), misnamed.addr, b"").await);
        assert!(matches!(&kind, RpcErrorKind::Unreachable(m) if m.contains("TLS handshake")), "{kind:?}");
        // The trusted client is served.
        echo(&tls_client(&ca, None), server.addr, b"").await.expect("a client of the right CA");
        misnamed.stop().await;
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admit_refuses_a_client_without_a_certificate_and_admits_one_with() {
    bounded(async {
        let ca = Ca::new("weir-rpc test CA");
        let tls = server_tls_config(&ca.server(), Some(&ca));
        let node = ca.client("node-2");
        // What `admit` was shown, connection by connection.
        let seen: Arc<Mutex<Vec<Option<Vec<CertificateDer<'static>>>>>> = Arc::default();
        let admit: Admit = {
            let seen = seen.clone();
            Arc::new(move |chain| {
                seen.lock().expect("lock").push(chain.map(<[_]>::to_vec));
                match chain {
                    Some([_, ..]) => Ok(()),
                    _ => Err("a node must present a certificate".to_owned()),
                }
            })
        };
        let server = TestServer::start(local(), ServerConfig::default(), |a| Some(server_tls(tls, Some(admit), a)), 1).await;

        let anonymous = tls_client(&ca, None);
        let started = Instant::now();
        let kind = expect_kind(echo(&anonymous, server.addr, b"").await);
        assert!(
            matches!(&kind, RpcErrorKind::Unreachable(m) if m.contains("refused") && m.contains("a node must present a certificate")),
            "{kind:?}"
        );
        assert!(started.elapsed() < LONG / 4, "took {:?}", started.elapsed());
        assert!(
            seen.lock().expect("lock").iter().all(Option::is_none),
            "admit was shown no chain for a client without one"
        );

        let member = tls_client(&ca, Some(&node));
        assert_eq!(&echo(&member, server.addr, b"in").await.expect("a client with a certificate")[..], b"in");
        let last = seen.lock().expect("lock").last().cloned().flatten();
        assert_eq!(last, Some(node.chain.clone()), "admit was shown the chain the client presented");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_is_dropped_after_the_handshake_timeout_and_holds_up_nobody() {
    bounded(async {
        let ca = Ca::new("weir-rpc test CA");
        let tls = server_tls_config(&ca.server(), None);
        let handshake_timeout = Duration::from_secs(2);
        let config = ServerConfig { max_connections: 2, ..ServerConfig::default() };
        let server = TestServer::start(
            local(),
            config,
            |a| Some(ServerTls { handshake_timeout, ..server_tls(tls, None, a) }),
            1,
        )
        .await;

        // Connects and never says a word: it holds one of the two connection slots.
        let started = Instant::now();
        let mut silent = TcpStream::connect(server.addr).await.expect("connect");

        // Meanwhile a TLS client is served, on the other slot.
        let first = tls_client(&ca, None);
        echo(&first, server.addr, b"served").await.expect("served while the silent one handshakes");
        // Both slots are taken: a third client is refused, over TLS, with the reason.
        let third = tls_client(&ca, None);
        let kind = expect_kind(echo(&third, server.addr, b"").await);
        assert!(matches!(&kind, RpcErrorKind::Unreachable(m) if m.contains("max_connections=2")), "{kind:?}");
        let served_within = started.elapsed();
        assert!(served_within < handshake_timeout, "the other clients took {served_within:?}");

        // The silent one is dropped once its handshake time is up, not before.
        let mut scratch = [0u8; 64];
        let read = tokio::time::timeout(handshake_timeout * 3, silent.read(&mut scratch)).await;
        let dropped_after = started.elapsed();
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "the server closed the silent connection: {read:?}");
        assert!(dropped_after >= handshake_timeout, "dropped after {dropped_after:?}");

        // Its slot is free again.
        echo(&third, server.addr, b"").await.expect("the slot the silent client held");
        echo(&first, server.addr, b"").await.expect("the first client's connection goes on");
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tls_connection_closed_by_a_restart_is_replaced_without_a_failed_call() {
    bounded(async {
        let ca = Ca::new("weir-rpc test CA");
        let identity = ca.server();
        let server = TestServer::tls(&identity).await;
        let addr = server.addr;
        let client = tls_client(&ca, None);
        echo(&client, addr, b"").await.expect("before the restart");
        server.stop().await;
        let tls = server_tls_config(&identity, None);
        let server = TestServer::start(addr, ServerConfig::default(), |a| Some(server_tls(tls, None, a)), 1).await;
        // The old connection was closed with "shutting down" (refused), over TLS: the request
        // goes out on a new connection.
        assert_eq!(&echo(&client, addr, b"x").await.expect("after the restart")[..], b"x");
        server.stop().await;
    })
    .await;
}

/// A frame of another version, inside TLS: `(kind, correlation id, error code, message)` of
/// the answer, then the end of the stream.
async fn error_then_close(stream: &mut (impl AsyncRead + Unpin)) -> (u8, u64, u8, String) {
    let mut length = [0u8; 4];
    stream.read_exact(&mut length).await.expect("an answer");
    let mut rest = vec![0u8; u32::from_be_bytes(length) as usize];
    stream.read_exact(&mut rest).await.expect("a whole frame");
    let correlation_id = u64::from_be_bytes(rest[2..10].try_into().expect("8 bytes"));
    let message = String::from_utf8(rest[13..].to_vec()).expect("UTF-8");
    let mut after = Vec::new();
    stream.read_to_end(&mut after).await.expect("a clean end (close_notify)");
    assert!(after.is_empty(), "nothing after the error frame");
    (rest[1], correlation_id, rest[12], message)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_frame_inside_tls_gets_its_error_frame_and_only_its_connection_closes() {
    bounded(async {
        let ca = Ca::new("weir-rpc test CA");
        let server = TestServer::tls(&ca.server()).await;
        let client = tls_client(&ca, None);
        echo(&client, server.addr, b"").await.expect("a connection that stays up");

        let tcp = TcpStream::connect(server.addr).await.expect("connect");
        let name = rustls::pki_types::ServerName::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST).into());
        let mut raw = TlsConnector::from(client_tls_config(&ca, None)).connect(name, tcp).await.expect("handshake");
        // Length 12, version 2, then a request header: a frame of another version.
        let mut frame = vec![0, 0, 0, 12, 2, 0];
        frame.extend_from_slice(&7u64.to_be_bytes());
        frame.extend_from_slice(&[0, 0]);
        raw.write_all(&frame).await.expect("write");
        raw.flush().await.expect("flush");
        let (kind, correlation_id, code, message) =
            tokio::time::timeout(LONG, error_then_close(&mut raw)).await.expect("an answer within the wait");
        assert_eq!((kind, correlation_id, code), (2, 0, 0x82), "{message}");
        assert!(message.contains("version 2") && message.contains("supported: 1"), "{message}");

        // The other connection goes on.
        echo(&client, server.addr, b"").await.expect("the first connection, unharmed");
        assert_eq!(server.acceptors(), 2);
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_for_a_handshake_under_way() {
    bounded(async {
        let ca = Ca::new("weir-rpc test CA");
        let tls = server_tls_config(&ca.server(), None);
        let server = TestServer::start(
            local(),
            ServerConfig::default(),
            |a| Some(ServerTls { handshake_timeout: LONG, ..server_tls(tls, None, a) }),
            1,
        )
        .await;
        let mut silent = TcpStream::connect(server.addr).await.expect("connect");
        // The server has taken the connection once it asks for an acceptor.
        while server.acceptors() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let started = Instant::now();
        server.stop().await;
        assert!(started.elapsed() < LONG / 4, "shutdown took {:?}", started.elapsed());
        let mut scratch = [0u8; 64];
        let read = tokio::time::timeout(LONG, silent.read(&mut scratch)).await.expect("closed within the wait");
        assert!(matches!(read, Ok(0) | Err(_)), "dropped: {read:?}");
    })
    .await;
}
