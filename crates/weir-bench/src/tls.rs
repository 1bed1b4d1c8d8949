//! `weir bench tls`: produce and fetch over a TLS listener against a plain-text one, two
//! brokers side by side in one run. See `TLS_LONG_ABOUT` in `cli.rs` for what is measured.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;
use weir_harness::kafka_client::Client;

use crate::cli::TlsBenchArgs;
use crate::raw_protocol::{self, Server};

const TOPIC: &str = "bench-tls";
const RECORD_BYTES: usize = 1024;
const RECORDS_PER_BATCH: usize = 1000;

/// A CA and a server certificate for 127.0.0.1 signed by it, made for this run.
struct Certificates {
    ca_pem: String,
    /// The server's chain and key, as `ssl.keystore.location` reads them.
    keystore_pem: String,
}

fn certificates() -> anyhow::Result<Certificates> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "weir bench CA");
    let ca_cert = ca.self_signed(&ca_key)?;
    let key = KeyPair::generate()?;
    let mut server = CertificateParams::new(vec!["localhost".to_string()])?;
    server.subject_alt_names.push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    let cert = server.signed_by(&key, &ca_cert, &ca_key)?;
    Ok(Certificates { ca_pem: ca_cert.pem(), keystore_pem: format!("{}{}", cert.pem(), key.serialize_pem()) })
}

struct Target {
    name: &'static str,
    server: Server,
    /// The CA to trust, for the TLS broker.
    ca: Option<String>,
    produced: Vec<f64>,
    fetched: Vec<f64>,
    produce_cpu: f64,
    fetch_cpu: f64,
    produce_bytes: u64,
    fetch_bytes: u64,
    /// The log end offset after the last round.
    end: i64,
}

impl Target {
    fn connect(&self) -> anyhow::Result<Client> {
        Ok(match &self.ca {
            None => raw_protocol::connect(self.server.addr)?,
            Some(ca) => {
                Client::connect_tls(self.server.addr, raw_protocol::CLIENT_ID, raw_protocol::IO_TIMEOUT, ca.as_bytes())?
            }
        })
    }
}

/// Produces `bytes` of 1,000-record batches (acks=1, one request at a time); returns the
/// batch bytes sent and the log end offset.
fn produce(client: &mut Client, bytes: u64) -> anyhow::Result<(u64, i64)> {
    raw_protocol::produce_filler(client, TOPIC, bytes, RECORDS_PER_BATCH, RECORD_BYTES, 1_700_000_000_000)
}

#[derive(Debug, Serialize)]
struct TargetResult {
    listener: &'static str,
    produce_mb_per_s: Vec<f64>,
    fetch_mb_per_s: Vec<f64>,
    produce_cpu_seconds_per_gb: f64,
    fetch_cpu_seconds_per_gb: f64,
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

pub(crate) fn run(args: &TlsBenchArgs) -> anyhow::Result<()> {
    let bytes = args.bytes.unwrap_or(if args.quick { 16 << 20 } else { 256 << 20 });
    let fetch_bytes = i32::try_from(args.fetch_bytes).context("--fetch-bytes must be below 2 GiB")?;
    let rounds = if args.quick { 1 } else { args.rounds.max(1) };
    let certificates = certificates()?;
    let dir = tempfile::tempdir()?;
    let keystore = dir.path().join("keystore.pem");
    std::fs::write(&keystore, &certificates.keystore_pem)?;
    let no_admin = ("admin.listeners".to_string(), String::new());
    let plain = Server::start_listening("weir-bench-tls-plain-", "127.0.0.1:0", std::slice::from_ref(&no_admin), None)?;
    let tls_settings = [no_admin, ("ssl.keystore.location".to_string(), keystore.display().to_string())];
    let tls = Server::start_listening("weir-bench-tls-", "SSL://127.0.0.1:0", &tls_settings, None)?;
    let mut targets = [
        Target::new("PLAINTEXT (sendfile)", plain, None),
        Target::new("SSL (rustls)", tls, Some(certificates.ca_pem.clone())),
    ];
    for target in &targets {
        let mut client = target.connect()?;
        raw_protocol::create_topic(&mut client, TOPIC, 1, &[], None)?;
    }
    for round in 0..rounds {
        for target in targets.iter_mut() {
            let mut client = target.connect()?;
            let cpu = target.server.cpu_seconds()?;
            let started = Instant::now();
            let (sent, end) = produce(&mut client, bytes)?;
            let seconds = started.elapsed().as_secs_f64();
            target.produce_cpu += target.server.cpu_seconds()? - cpu;
            target.produce_bytes += sent;
            target.produced.push(sent as f64 / 1e6 / seconds);

            // This round's records: from where the last round ended.
            let start = std::mem::replace(&mut target.end, end);
            let cpu = target.server.cpu_seconds()?;
            let started = Instant::now();
            let received = raw_protocol::fetch_all(&mut client, TOPIC, &[(0, start, end)], fetch_bytes)?.bytes;
            let seconds = started.elapsed().as_secs_f64();
            target.fetch_cpu += target.server.cpu_seconds()? - cpu;
            target.fetch_bytes += received;
            target.fetched.push(received as f64 / 1e6 / seconds);
            eprintln!(
                "round {}: {:<22} produce {:>6.0} MB/s, fetch {:>6.0} MB/s",
                round + 1,
                target.name,
                target.produced.last().copied().unwrap_or(0.0),
                target.fetched.last().copied().unwrap_or(0.0)
            );
        }
    }
    let results: Vec<TargetResult> = targets
        .iter()
        .map(|t| TargetResult {
            listener: t.name,
            produce_mb_per_s: t.produced.clone(),
            fetch_mb_per_s: t.fetched.clone(),
            produce_cpu_seconds_per_gb: t.produce_cpu / (t.produce_bytes as f64 / 1e9),
            fetch_cpu_seconds_per_gb: t.fetch_cpu / (t.fetch_bytes as f64 / 1e9),
        })
        .collect();
    println!(
        "Produce (acks=1, {} KiB requests, one at a time) then fetch back ({} KiB requests) of {} MiB per round, {rounds} rounds, one connection",
        RECORDS_PER_BATCH * RECORD_BYTES / 1024,
        fetch_bytes >> 10,
        bytes >> 20
    );
    println!(
        "{:<22} {:>16} {:>16} {:>22} {:>22}",
        "listener", "produce MB/s", "fetch MB/s", "produce CPU s/GB", "fetch CPU s/GB"
    );
    for r in &results {
        println!(
            "{:<22} {:>16.0} {:>16.0} {:>22.3} {:>22.3}",
            r.listener,
            median(&r.produce_mb_per_s),
            median(&r.fetch_mb_per_s),
            r.produce_cpu_seconds_per_gb,
            r.fetch_cpu_seconds_per_gb
        );
    }
    if let [plain, tls] = &results[..] {
        println!(
            "TLS / plain text: produce {:.2}x MB/s at {:.2}x CPU per GB; fetch {:.2}x MB/s at {:.2}x CPU per GB (medians of the rounds)",
            median(&tls.produce_mb_per_s) / median(&plain.produce_mb_per_s),
            tls.produce_cpu_seconds_per_gb / plain.produce_cpu_seconds_per_gb,
            median(&tls.fetch_mb_per_s) / median(&plain.fetch_mb_per_s),
            tls.fetch_cpu_seconds_per_gb / plain.fetch_cpu_seconds_per_gb,
        );
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&results)?)?;
    }
    Ok(())
}

impl Target {
    fn new(name: &'static str, server: Server, ca: Option<String>) -> Target {
        Target {
            name,
            server,
            ca,
            produced: Vec::new(),
            fetched: Vec::new(),
            produce_cpu: 0.0,
            fetch_cpu: 0.0,
            produce_bytes: 0,
            fetch_bytes: 0,
            end: 0,
        }
    }
}
