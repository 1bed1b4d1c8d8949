//! TLS for a listener: a rustls server configuration built from Kafka's `ssl.*` settings (PEM
//! only), rebuilt when its files change so that certificates rotate without a restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::pki_types::{ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SupportedProtocolVersion,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Whether the server asks for a client certificate (Kafka's `ssl.client.auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    None,
    /// Asked for; a client without one is still served.
    Requested,
    /// A client without a certificate the truststore vouches for is refused.
    Required,
}

impl ClientAuth {
    pub fn parse(value: &str) -> Option<ClientAuth> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "none" => Some(ClientAuth::None),
            "requested" => Some(ClientAuth::Requested),
            "required" => Some(ClientAuth::Required),
            _ => None,
        }
    }
}

/// PEM text given inline, or a file to read it from (and to watch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pem {
    File(PathBuf),
    Inline(String),
}

impl Pem {
    fn read(&self, what: &str) -> Result<Vec<u8>, String> {
        match self {
            Pem::Inline(text) => Ok(text.clone().into_bytes()),
            Pem::File(path) => {
                std::fs::read(path).map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))
            }
        }
    }

    fn file(&self) -> Option<&Path> {
        match self {
            Pem::File(path) => Some(path),
            Pem::Inline(_) => None,
        }
    }
}

/// What a listener's TLS is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// The server's certificate chain, leaf first (`ssl.keystore.location` holding the chain and
    /// the key, or `ssl.keystore.certificate.chain`).
    pub certificate_chain: Pem,
    /// The server's private key, unencrypted PKCS#8, PKCS#1 or SEC1 (`ssl.keystore.location`,
    /// or `ssl.keystore.key`).
    pub private_key: Pem,
    /// The certificates client certificates are checked against (`ssl.truststore.location` or
    /// `ssl.truststore.certificates`); needed for `ssl.client.auth` other than none.
    pub truststore: Option<Pem>,
    pub client_auth: ClientAuth,
    /// `ssl.enabled.protocols`: TLS 1.2 and/or 1.3.
    pub tls12: bool,
    pub tls13: bool,
    /// The application protocols offered in ALPN, most preferred first: none for Kafka's
    /// protocol, `h2` for gRPC (whose clients insist on it), `http/1.1` for the admin API.
    pub alpn: Vec<Vec<u8>>,
}

impl TlsSettings {
    /// Parses `ssl.enabled.protocols` (`TLSv1.2,TLSv1.3`): which of the two are on.
    pub fn parse_protocols(value: &str) -> Result<(bool, bool), String> {
        let (mut tls12, mut tls13) = (false, false);
        for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            match item {
                "TLSv1.2" => tls12 = true,
                "TLSv1.3" => tls13 = true,
                "TLSv1" | "TLSv1.1" | "SSLv3" => {
                    return Err(format!("{item} is not offered (it is unsafe); use TLSv1.2 and TLSv1.3"))
                }
                _ => return Err(format!("unknown protocol {item:?}; expected TLSv1.2 and/or TLSv1.3")),
            }
        }
        if !tls12 && !tls13 {
            return Err("no protocol enabled; expected TLSv1.2 and/or TLSv1.3".into());
        }
        Ok((tls12, tls13))
    }

    /// The certificate chain (leaf first) and the private key of the keystore.
    fn certificate_and_key(&self) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
        let chain_pem = self.certificate_chain.read("certificate chain")?;
        let certificates: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&chain_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("the certificate chain is not PEM: {e}"))?;
        if certificates.is_empty() {
            return Err("the keystore holds no certificate (-----BEGIN CERTIFICATE-----)".into());
        }
        let key_pem = self.private_key.read("private key")?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| format!("the keystore holds no unencrypted private key (PKCS#8, PKCS#1 or SEC1 PEM): {e}"))?;
        Ok((certificates, key))
    }

    /// The truststore's certificates; `what_for` says what needs them when there are none.
    fn roots(&self, what_for: &str) -> Result<RootCertStore, String> {
        let truststore = self.truststore.as_ref().ok_or_else(|| {
            format!("{what_for} needs a truststore (ssl.truststore.location or ssl.truststore.certificates)")
        })?;
        let pem = truststore.read("truststore")?;
        let mut roots = RootCertStore::empty();
        for certificate in CertificateDer::pem_slice_iter(&pem) {
            let certificate = certificate.map_err(|e| format!("the truststore is not PEM: {e}"))?;
            roots.add(certificate).map_err(|e| format!("a truststore certificate is unusable: {e}"))?;
        }
        if roots.is_empty() {
            return Err("the truststore holds no certificate".into());
        }
        Ok(roots)
    }

    fn versions(&self) -> Vec<&'static SupportedProtocolVersion> {
        let mut versions: Vec<&'static SupportedProtocolVersion> = Vec::new();
        if self.tls13 {
            versions.push(&rustls::version::TLS13);
        }
        if self.tls12 {
            versions.push(&rustls::version::TLS12);
        }
        versions
    }

    /// The rustls configuration these settings describe, or what is wrong with them.
    pub fn server_config(&self) -> Result<ServerConfig, String> {
        let (certificates, key) = self.certificate_and_key()?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&self.versions())
            .map_err(|e| format!("cannot offer these TLS versions: {e}"))?;
        let builder = match self.client_auth {
            ClientAuth::None => builder.with_no_client_auth(),
            auth => {
                let roots = self.roots("ssl.client.auth")?;
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                let verifier = if auth == ClientAuth::Requested { verifier.allow_unauthenticated() } else { verifier };
                builder.with_client_cert_verifier(verifier.build().map_err(|e| format!("client verification: {e}"))?)
            }
        };
        let mut config = builder
            .with_single_cert(certificates, key)
            .map_err(|e| format!("the certificate and key do not fit: {e}"))?;
        config.alpn_protocols = self.alpn.clone();
        // No TLS 1.3 session tickets after the handshake: Kafka clients do not resume
        // sessions, and kafka-python closes a connection that turns readable while it awaits no
        // answer (which a ticket arriving late makes it).
        config.send_tls13_tickets = 0;
        Ok(config)
    }

    /// This node's rustls configuration as a client of another node's TLS listener (replication
    /// and the CONTROLLER listener): the peer's certificate must chain to the truststore, and
    /// this node presents its own keystore certificate when the peer asks (mutual TLS), as a
    /// Kafka broker does. With `verify_name` (`ssl.endpoint.identification.algorithm=https`,
    /// Kafka's default) the certificate must also name the address connected to.
    pub fn client_config(&self, verify_name: bool) -> Result<ClientConfig, String> {
        let roots = Arc::new(self.roots("a TLS connection to another node")?);
        let (certificates, key) = self.certificate_and_key()?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&self.versions())
            .map_err(|e| format!("cannot offer these TLS versions: {e}"))?;
        let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider)
            .build()
            .map_err(|e| format!("server verification: {e}"))?;
        let builder = if verify_name {
            builder.with_webpki_verifier(verifier)
        } else {
            builder.dangerous().with_custom_certificate_verifier(Arc::new(AnyName(verifier)))
        };
        builder.with_client_auth_cert(certificates, key).map_err(|e| format!("the certificate and key do not fit: {e}"))
    }

    fn files(&self) -> Vec<PathBuf> {
        [Some(&self.certificate_chain), Some(&self.private_key), self.truststore.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|pem| pem.file().map(Path::to_path_buf))
            .collect()
    }
}

/// The truststore's verification without the name check (`ssl.endpoint.identification.algorithm`
/// empty): the certificate must chain to a trusted root and be valid now, whatever it names.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// How often the files are looked at for changes, at most (on accepting a connection).
const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// What TLS settings build, rebuilt from their files when one of them changes (a new
/// modification time or size), looked at most once per [`RELOAD_CHECK`]. A change that does
/// not load (a half-written file, a key that does not fit) keeps the configuration in use and
/// is logged; the next change is tried again.
struct Reloading<T> {
    settings: TlsSettings,
    files: Vec<PathBuf>,
    build: Build<T>,
    current: Mutex<Current<T>>,
}

/// How a [`Reloading`] makes its value from the settings.
type Build<T> = Box<dyn Fn(&TlsSettings) -> Result<T, String> + Send + Sync>;

struct Current<T> {
    built: T,
    stamps: Vec<Option<(SystemTime, u64)>>,
    checked: Instant,
}

fn stamps(files: &[PathBuf]) -> Vec<Option<(SystemTime, u64)>> {
    files.iter().map(|f| std::fs::metadata(f).ok().and_then(|m| m.modified().ok().map(|t| (t, m.len())))).collect()
}

impl<T: Clone> Reloading<T> {
    /// Builds once; an error here is a configuration error.
    fn new(
        settings: TlsSettings,
        build: impl Fn(&TlsSettings) -> Result<T, String> + Send + Sync + 'static,
    ) -> Result<Reloading<T>, String> {
        let files = settings.files();
        let stamps = stamps(&files);
        let built = build(&settings)?;
        let current = Mutex::new(Current { built, stamps, checked: Instant::now() });
        Ok(Reloading { settings, files, build: Box::new(build), current })
    }

    /// What the files hold now, rebuilt first if one changed.
    fn get(&self) -> T {
        let mut current = self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !self.files.is_empty() && current.checked.elapsed() >= RELOAD_CHECK {
            current.checked = Instant::now();
            let now = stamps(&self.files);
            if now != current.stamps {
                current.stamps = now;
                match (self.build)(&self.settings) {
                    Ok(built) => {
                        current.built = built;
                        tracing::info!(files = ?self.files, "reloaded the TLS certificate");
                    }
                    Err(e) => tracing::warn!(error = %e, "the changed TLS files do not load; keeping the ones in use"),
                }
            }
        }
        current.built.clone()
    }
}

/// A listener's TLS acceptor, rebuilt from its files when one of them changes.
pub struct ReloadingTls(Reloading<TlsAcceptor>);

impl ReloadingTls {
    /// Loads the settings once; an error here is a configuration error.
    pub fn new(settings: TlsSettings) -> Result<ReloadingTls, String> {
        Reloading::new(settings, |s| Ok(TlsAcceptor::from(Arc::new(s.server_config()?)))).map(ReloadingTls)
    }

    /// The acceptor for the next connection, reloaded first if a file changed.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.0.get()
    }
}

/// This node's TLS as a client of other nodes ([`TlsSettings::client_config`]), rebuilt from
/// its files when one of them changes: a rotated certificate or truststore is used from the
/// next connection on, as the listeners use theirs.
pub struct ReloadingClientTls(Reloading<Arc<ClientConfig>>);

impl ReloadingClientTls {
    /// Loads the settings once; an error here is a configuration error.
    pub fn new(settings: TlsSettings, verify_name: bool) -> Result<ReloadingClientTls, String> {
        Reloading::new(settings, move |s| Ok(Arc::new(s.client_config(verify_name)?))).map(ReloadingClientTls)
    }

    /// The configuration for the next connection, reloaded first if a file changed.
    pub fn config(&self) -> Arc<ClientConfig> {
        self.0.get()
    }
}

/// How long a client has to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at most on one listener; past it, connections wait to be accepted.
const MAX_HANDSHAKES: usize = 256;

/// The TLS connections a listener accepts, for servers that take a stream of connections (the
/// admin API's axum, the RocketMQ front-end's tonic). Each handshake runs in a task of its own,
/// at most [`HANDSHAKE_TIMEOUT`], so a slow or silent client holds up no other; a failed one
/// is logged and passed to `on_failure` (a metric), and the connection dropped.
pub struct TlsIncoming {
    connections: mpsc::Receiver<(TlsStream<TcpStream>, std::net::SocketAddr)>,
    local: std::net::SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl TlsIncoming {
    pub fn new(
        listener: TcpListener,
        tls: Arc<ReloadingTls>,
        what: &'static str,
        on_failure: impl Fn() + Send + Sync + 'static,
    ) -> std::io::Result<TlsIncoming> {
        let local = listener.local_addr()?;
        let (sender, connections) = mpsc::channel(64);
        let on_failure = Arc::new(on_failure);
        let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
        let accepting = tokio::spawn(async move {
            loop {
                let Ok(permit) = handshakes.clone().acquire_owned().await else { return };
                let (stream, peer) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            // (Out of file descriptors, mostly: wait a little rather than spin.)
                            tracing::warn!(listener = what, error = %e, "cannot accept a connection");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    },
                    _ = sender.closed() => return,
                };
                let _ = stream.set_nodelay(true);
                let (acceptor, sender, on_failure) = (tls.acceptor(), sender.clone(), on_failure.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = sender.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(listener = what, %peer, error = %e, "TLS handshake failed");
                            on_failure();
                        }
                        Err(_) => {
                            tracing::debug!(listener = what, %peer, "TLS handshake timed out");
                            on_failure();
                        }
                    }
                });
            }
        });
        Ok(TlsIncoming { connections, local, accepting })
    }

    /// The next connection whose handshake succeeded.
    pub async fn accept(&mut self) -> Option<(TlsStream<TcpStream>, std::net::SocketAddr)> {
        self.connections.recv().await
    }

    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.local
    }
}

impl Drop for TlsIncoming {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Whether the kernel offers TLS offload (kTLS: `tls` among the TCP upper-layer protocols),
/// with which sendfile could serve TLS connections too. Weir does not use it yet: it reports
/// it, and TLS connections copy record data through user space.
pub fn kernel_tls_available() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp")
        .map(|ulps| ulps.split_whitespace().any(|u| u == "tls"))
        .unwrap_or(false)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A CA's certificate, and a leaf for 127.0.0.1 it signed (chain and key, as one PEM).
    fn ca_and_leaf(name: &str) -> (String, String) {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, name);
        let ca = ca.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let leaf =
            CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap().signed_by(&key, &ca, &ca_key).unwrap();
        (ca.pem(), format!("{}{}", leaf.pem(), key.serialize_pem()))
    }

    #[test]
    fn a_client_config_follows_its_files() {
        let dir = std::env::temp_dir().join(format!("weir-tls-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (ca, keystore) = ca_and_leaf("first CA");
        let (trust_path, key_path) = (dir.join("ca.pem"), dir.join("node.pem"));
        std::fs::write(&trust_path, &ca).unwrap();
        std::fs::write(&key_path, &keystore).unwrap();
        let settings = TlsSettings {
            certificate_chain: Pem::File(key_path.clone()),
            private_key: Pem::File(key_path.clone()),
            truststore: Some(Pem::File(trust_path.clone())),
            client_auth: ClientAuth::None,
            tls12: true,
            tls13: true,
            alpn: Vec::new(),
        };
        let tls = ReloadingClientTls::new(settings, true).unwrap();
        let first = tls.config();
        assert!(Arc::ptr_eq(&first, &tls.config()), "unchanged files: the same configuration");

        // A rotated truststore and certificate are taken (after the check interval).
        let (ca, keystore) = ca_and_leaf("second CA with a longer name");
        std::fs::write(&trust_path, &ca).unwrap();
        std::fs::write(&key_path, &keystore).unwrap();
        std::thread::sleep(RELOAD_CHECK + Duration::from_millis(100));
        let second = tls.config();
        assert!(!Arc::ptr_eq(&first, &second), "the rotated files are loaded");

        // A half-written file keeps the configuration in use.
        std::fs::write(&trust_path, "-----BEGIN CERTIFICATE-----\nnot yet").unwrap();
        std::thread::sleep(RELOAD_CHECK + Duration::from_millis(100));
        assert!(Arc::ptr_eq(&second, &tls.config()), "a file that does not load changes nothing");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
