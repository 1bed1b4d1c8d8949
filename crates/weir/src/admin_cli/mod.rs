//! The client commands: `weir topic`, `weir group`, `weir produce`, `weir consume`, `weir
//! message`, `weir cluster`, `weir partition`, `weir user`. They talk to a running broker through its admin HTTP API (`--admin`, `WEIR_ADMIN`,
//! default http://127.0.0.1:9644) with the JSON types of `weir_admin::api`, print aligned tables
//! for people or `--json` for scripts, and on failure print one line `error: ...` on stderr and
//! exit 1.
//!
//! Their arguments are declared next to the code that runs them (one module per command),
//! unlike `server` and `bench`, whose arguments are in `cli.rs`.

pub mod acl;
pub mod cluster;
pub mod consume;
pub mod group;
pub mod kafka;
pub mod message;
pub mod native;
pub mod partition;
pub mod produce;
pub mod quota;
pub mod time;
pub mod topic;
pub mod user;

use std::io::{self, Write};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde::de::DeserializeOwned;
use serde::Serialize;
use weir_admin::api::ErrorBody;

/// Where the admin API listens unless told otherwise (the `admin.listeners` default).
pub const DEFAULT_ADMIN: &str = "http://127.0.0.1:9644";
/// Longest response body read (a consume response of 1 MiB of batches is a few MiB of JSON).
const RESPONSE_BYTES_MAX: u64 = 256 << 20;
/// Time allowed for one request beyond its own long-poll timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The flags every client command takes (also after the subcommand: they are global).
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// The broker's admin HTTP API: `http://host:port`, or `host:port` (http is assumed).
    #[arg(long, value_name = "URL", env = "WEIR_ADMIN", default_value = DEFAULT_ADMIN, global = true)]
    pub admin: String,

    /// Speak the Kafka protocol to these brokers instead of the admin API, for a cluster whose
    /// admin port is closed (host:port[,host:port], as rpk's --brokers and Kafka's
    /// --bootstrap-server). The topic, group, produce and consume commands take it.
    #[arg(long, value_name = "HOST:PORT[,...]", env = "WEIR_BOOTSTRAP", global = true)]
    pub bootstrap: Option<String>,

    /// The Weir user to authenticate to the admin API as (when it has
    /// admin.api.require.auth); the password is WEIR_ADMIN_PASSWORD's.
    #[arg(long, value_name = "USER", env = "WEIR_ADMIN_USER", global = true)]
    pub admin_user: Option<String>,

    /// The admin user's password (better given as WEIR_ADMIN_PASSWORD, out of the process list).
    #[arg(long, value_name = "PASSWORD", env = "WEIR_ADMIN_PASSWORD", hide_env_values = true, global = true)]
    pub admin_password: Option<String>,

    /// The CA certificates (PEM) an https:// admin API's certificate must chain to
    /// (admin.ssl.enable).
    #[arg(long, value_name = "FILE", env = "WEIR_ADMIN_CA", global = true)]
    pub admin_ca: Option<std::path::PathBuf>,

    /// Print JSON (one object per line) instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

/// Why the commands that `--bootstrap` does not serve need the admin API.
pub const MESSAGE_NEEDS_ADMIN: &str =
    "finding messages by key, message id or time reads Weir's message index, which the Kafka protocol has no request for";
pub const CLUSTER_NEEDS_ADMIN: &str = "the metadata quorum's voters, roles and offsets and the fenced brokers are \
     Weir's own state; Kafka's DescribeCluster and DescribeQuorum carry only part of it";
pub const PARTITION_NEEDS_ADMIN: &str = "reassignment plans, their progress and the replication throttle go \
     through Weir's own reassignment API";

/// Refuses `--bootstrap` for a command that only the admin API can serve, saying why.
pub fn require_admin_api(connection: &Connection, command: &str, why: &str) -> anyhow::Result<()> {
    if connection.bootstrap.is_some() {
        anyhow::bail!(
            "`weir {command}` needs the admin HTTP API (--admin or WEIR_ADMIN, default {DEFAULT_ADMIN}): {why}; \
             --bootstrap (WEIR_BOOTSTRAP) serves only the topic, group, produce and consume commands"
        );
    }
    Ok(())
}

/// An error answer of the admin API.
#[derive(Debug)]
pub struct ApiFailure {
    pub code: String,
    pub message: String,
}

impl std::fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for ApiFailure {}

/// The error code of an API failure, if `e` is one.
pub fn failure_code(e: &anyhow::Error) -> Option<&str> {
    e.downcast_ref::<ApiFailure>().map(|f| f.code.as_str())
}

/// The base URL of `--admin`: `host:port` gets `http://` (the admin API speaks plain HTTP
/// only); another scheme is refused rather than sent where it would fail obscurely.
fn admin_base(admin: &str) -> anyhow::Result<String> {
    let admin = admin.trim();
    let with_scheme = if admin.contains("://") { admin.to_string() } else { format!("http://{admin}") };
    for scheme in ["http://", "https://"] {
        if let Some(host) = with_scheme.strip_prefix(scheme).map(|rest| rest.trim_end_matches('/')) {
            if !host.is_empty() {
                return Ok(format!("{scheme}{host}"));
            }
        }
    }
    anyhow::bail!("--admin {admin:?}: expected host:port, or an http:// or https:// URL such as {DEFAULT_ADMIN}")
}

/// A blocking client of the admin API.
pub struct AdminClient {
    base: String,
    agent: ureq::Agent,
    /// `Basic ...`, when a user was given.
    authorization: Option<String>,
}

/// Percent-encodes one path segment (group ids may hold any character).
pub fn segment(text: &str) -> String {
    let only_dots = text.bytes().all(|b| b == b'.');
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'~' || (b == b'.' && !only_dots) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl AdminClient {
    pub fn new(connection: &Connection) -> anyhow::Result<AdminClient> {
        let base = admin_base(&connection.admin)?;
        let mut builder =
            ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(REQUEST_TIMEOUT));
        if base.starts_with("https://") {
            let Some(ca) = &connection.admin_ca else {
                anyhow::bail!(
                    "an https:// admin API needs the CA its certificate chains to: --admin-ca FILE or WEIR_ADMIN_CA"
                );
            };
            let pem = std::fs::read(ca).with_context(|| format!("cannot read --admin-ca {}", ca.display()))?;
            let certificates: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(Ok(c)),
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                })
                .collect::<Result<_, _>>()
                .map_err(|e| anyhow::anyhow!("--admin-ca {}: not PEM certificates ({e})", ca.display()))?;
            if certificates.is_empty() {
                anyhow::bail!("--admin-ca {} holds no certificate", ca.display());
            }
            let tls = ureq::tls::TlsConfig::builder()
                .provider(ureq::tls::TlsProvider::Rustls)
                .unversioned_rustls_crypto_provider(std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
                .root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(certificates)))
                .build();
            builder = builder.tls_config(tls);
        }
        let config = builder.build();
        let authorization = match (&connection.admin_user, &connection.admin_password) {
            (Some(user), password) => {
                use base64::Engine as _;
                let pair = format!("{user}:{}", password.as_deref().unwrap_or_default());
                Some(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair)))
            }
            (None, Some(_)) => {
                anyhow::bail!("WEIR_ADMIN_PASSWORD is set without a user: give --admin-user or WEIR_ADMIN_USER")
            }
            (None, None) => None,
        };
        Ok(AdminClient { base, agent: ureq::Agent::new_with_config(config), authorization })
    }

    /// The request with the admin user's credentials, if any.
    fn authorized<B>(&self, request: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.authorization {
            Some(value) => request.header("Authorization", value),
            None => request,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn get<T: DeserializeOwned>(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<T> {
        let mut request = self.authorized(self.agent.get(self.url(path)));
        for (name, value) in query {
            request = request.query(*name, value);
        }
        self.finish(request.call())
    }

    pub fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> anyhow::Result<T> {
        self.finish(self.authorized(self.agent.post(self.url(path))).send_json(body))
    }

    pub fn patch<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> anyhow::Result<T> {
        self.finish(self.authorized(self.agent.patch(self.url(path))).send_json(body))
    }

    pub fn put<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> anyhow::Result<T> {
        self.finish(self.authorized(self.agent.put(self.url(path))).send_json(body))
    }

    pub fn delete<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.finish(self.authorized(self.agent.delete(self.url(path))).call())
    }

    pub fn delete_with_query<T: DeserializeOwned>(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<T> {
        let mut request = self.authorized(self.agent.delete(self.url(path)));
        for (name, value) in query {
            request = request.query(*name, value);
        }
        self.finish(request.call())
    }

    fn finish<T: DeserializeOwned>(
        &self,
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> anyhow::Result<T> {
        let mut response = response.map_err(|e| {
            anyhow::anyhow!(
                "cannot reach the admin API at {} ({e}); is `weir server` running there? (set --admin or WEIR_ADMIN)",
                self.base
            )
        })?;
        let status = response.status();
        let body = response
            .body_mut()
            .with_config()
            .limit(RESPONSE_BYTES_MAX)
            .read_to_vec()
            .with_context(|| format!("reading the answer of {}", self.base))?;
        if status.is_success() {
            return serde_json::from_slice(&body).with_context(|| {
                format!("the admin API at {} sent an answer this weir does not understand", self.base)
            });
        }
        match serde_json::from_slice::<ErrorBody>(&body) {
            Ok(ErrorBody { error }) => Err(ApiFailure { code: error.code, message: error.message }.into()),
            Err(_) => Err(anyhow::anyhow!(
                "the admin API at {} answered HTTP {status}: {}",
                self.base,
                String::from_utf8_lossy(&body).trim()
            )),
        }
    }
}

/// Ends a client command: on error, one line on stderr and exit status 1 (a closed stdout, as
/// in `weir consume ... | head`, ends quietly with 0).
pub fn finish(result: anyhow::Result<()>) -> anyhow::Result<()> {
    let Err(e) = result else { return Ok(()) };
    if is_broken_pipe(&e) {
        std::process::exit(0);
    }
    eprintln!("error: {e:#}");
    std::process::exit(1);
}

/// Whether `e` is a write to a closed pipe (`weir ... | head`): the reader has all it wanted.
/// serde_json keeps the I/O error inside its own, out of the source chain.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        let kind = cause
            .downcast_ref::<io::Error>()
            .map(io::Error::kind)
            .or_else(|| cause.downcast_ref::<serde_json::Error>().and_then(serde_json::Error::io_error_kind));
        kind == Some(io::ErrorKind::BrokenPipe)
    })
}

/// Writes `value` as one line of JSON.
pub fn print_json<T: Serialize>(out: &mut impl Write, value: &T) -> anyhow::Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    out.write_all(b"\n")?;
    Ok(())
}

/// A table for people: left-aligned columns, two spaces apart.
pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&'static str]) -> Table {
        Table { headers: headers.to_vec(), rows: Vec::new() }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len());
        self.rows.push(cells);
    }

    pub fn write(&self, out: &mut impl Write) -> io::Result<()> {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let line = |cells: Vec<&str>| -> String {
            let last = cells.len().saturating_sub(1);
            let mut text = String::new();
            for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
                text.push_str(cell);
                if i < last {
                    text.push_str(&" ".repeat(width - cell.chars().count() + 2));
                }
            }
            text
        };
        writeln!(out, "{}", line(self.headers.clone()))?;
        for row in &self.rows {
            writeln!(out, "{}", line(row.iter().map(String::as_str).collect()))?;
        }
        Ok(())
    }
}

/// `Some(n)` as a number, `None` as `-`.
pub fn or_dash(value: Option<i64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// Bytes for people: 512 B, 1.5 KiB, 3.0 MiB.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `name=value` (for --config, --set, --header).
pub fn parse_key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => Ok((name.trim().to_string(), value.to_string())),
        _ => Err(format!("expected NAME=VALUE, got {text:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let mut table = Table::new(&["TOPIC", "PARTITIONS"]);
        table.row(vec!["a-long-name".into(), "3".into()]);
        table.row(vec!["b".into(), "12".into()]);
        let mut out = Vec::new();
        table.write(&mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "TOPIC        PARTITIONS\na-long-name  3\nb            12\n");
    }

    /// A writer whose reader has gone.
    struct ClosedPipe;

    impl Write for ClosedPipe {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_pipe_is_told_from_other_errors_whoever_wrote_to_it() {
        let json = print_json(&mut ClosedPipe, &vec![1, 2, 3]).expect_err("JSON to a closed pipe");
        assert!(is_broken_pipe(&json), "{json:?}");
        let text = writeln!(ClosedPipe, "a table").map_err(anyhow::Error::from).expect_err("text to a closed pipe");
        assert!(is_broken_pipe(&text.context("printing")), "with context too");
        assert!(!is_broken_pipe(&anyhow::anyhow!("topic 'x' does not exist")));
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert!(!is_broken_pipe(&anyhow::Error::from(refused)));
    }

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(segment("orders.v1"), "orders.v1");
        assert_eq!(segment("my group/1"), "my%20group%2F1");
        assert_eq!(segment(".."), "%2E%2E");
        assert_eq!(segment("é"), "%C3%A9");
    }

    #[test]
    fn admin_addresses_without_a_scheme_are_http() {
        assert_eq!(admin_base("127.0.0.1:9644").expect("host:port"), "http://127.0.0.1:9644");
        assert_eq!(admin_base("http://node2:9644/").expect("a URL"), "http://node2:9644");
        assert_eq!(admin_base(" localhost:1 ").expect("trimmed"), "http://localhost:1");
        assert_eq!(admin_base("https://node2:9644").expect("TLS"), "https://node2:9644");
        assert!(admin_base("ftp://node2:9644").is_err());
        assert!(admin_base("http://").is_err());
        assert!(admin_base("").is_err());
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }
}
