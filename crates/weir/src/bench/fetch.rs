//! `weir bench fetch`: zero-copy (sendfile) fetch against the user-space copy path, measured on
//! two real brokers side by side. See `FETCH_LONG_ABOUT` in `cli.rs` for what is measured.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use serde::Serialize;

use crate::cli::FetchBenchArgs;

const TOPIC: &str = "bench-fetch";
const RECORD_BYTES: usize = 1024;
const RECORDS_PER_BATCH: usize = 1000;

/// A broker child process in its own scratch directory; killed on drop.
struct Server {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(sendfile: bool) -> anyhow::Result<Server> {
        let dir = tempfile::Builder::new().prefix("weir-bench-fetch-").tempdir()?;
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path())
            .args(["--set", &format!("fetch.sendfile.enable={sendfile}"), "--set", "admin.listeners="])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot start `weir server`")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let addr = line
            .split_whitespace()
            .find_map(|w| w.parse::<SocketAddr>().ok())
            .with_context(|| format!("unexpected first line from the server: {line:?}"))?;
        Ok(Server { child, addr, _dir: dir })
    }

    /// User + system CPU seconds of the broker so far.
    fn cpu_seconds(&self) -> anyhow::Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))?;
        // Fields after the command name (which is in parentheses): utime is the 12th, stime 13th.
        let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
        // SAFETY-free constant: Linux reports in USER_HZ, 100 on every supported platform.
        Ok((ticks(11) + ticks(12)) / 100.0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal blocking Kafka client: one request at a time.
struct Client {
    stream: TcpStream,
    correlation: i32,
    buf: Vec<u8>,
}

impl Client {
    fn connect(addr: SocketAddr) -> anyhow::Result<Client> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(Client { stream, correlation: 0, buf: Vec::new() })
    }

    fn send<R: Request>(&mut self, version: i16, request: &R) -> anyhow::Result<R::Response> {
        self.correlation += 1;
        let api_key = ApiKey::try_from(R::KEY).map_err(|_| anyhow::anyhow!("unknown api key"))?;
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(StrBytes::from_static_str("weir-bench")));
        let mut frame = BytesMut::new();
        frame.put_i32(0);
        header.encode(&mut frame, api_key.request_header_version(version))?;
        request.encode(&mut frame, version)?;
        let size = (frame.len() - 4) as i32;
        frame[..4].copy_from_slice(&size.to_be_bytes());
        self.stream.write_all(&frame)?;
        let mut body = self.read_frame()?;
        ResponseHeader::decode(&mut body, api_key.response_header_version(version))?;
        R::Response::decode(&mut body, version)
    }

    fn read_frame(&mut self) -> anyhow::Result<Bytes> {
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size)?;
        let size = i32::from_be_bytes(size);
        if size < 0 {
            bail!("negative frame size");
        }
        self.buf.resize(size as usize, 0);
        self.stream.read_exact(&mut self.buf)?;
        Ok(Bytes::copy_from_slice(&self.buf))
    }
}

fn topic_name() -> TopicName {
    TopicName(StrBytes::from_static_str(TOPIC))
}

fn prepare(server: &Server, bytes: u64) -> anyhow::Result<i64> {
    let mut client = Client::connect(server.addr)?;
    let create = CreateTopicsRequest::default()
        .with_topics(vec![CreatableTopic::default()
            .with_name(topic_name())
            .with_num_partitions(1)
            .with_replication_factor(1)])
        .with_timeout_ms(30_000);
    let created = client.send(5, &create)?;
    if let Some(t) = created.topics.first().filter(|t| t.error_code != 0) {
        bail!("CreateTopics failed with error {}", t.error_code);
    }
    let records: Vec<_> = (0..RECORDS_PER_BATCH)
        .map(|i| {
            let value = Bytes::from(vec![b'x'; RECORD_BYTES]);
            weir_storage::testing::record(i as i64, 1_700_000_000_000 + i as i64, None, Some(value))
        })
        .collect();
    let batch = Bytes::from(weir_storage::testing::encode(&records, weir_storage::Compression::None));
    let batches = bytes.div_ceil(batch.len() as u64).max(1);
    let mut end = 0;
    for _ in 0..batches {
        let produce = ProduceRequest::default().with_acks(1).with_timeout_ms(30_000).with_topic_data(vec![
            TopicProduceData::default().with_name(topic_name()).with_partition_data(vec![
                PartitionProduceData::default().with_index(0).with_records(Some(batch.clone())),
            ]),
        ]);
        let response = client.send(9, &produce)?;
        let partition =
            response.responses.first().and_then(|t| t.partition_responses.first()).context("empty produce response")?;
        if partition.error_code != 0 {
            bail!("Produce failed with error {}", partition.error_code);
        }
        end = partition.base_offset + RECORDS_PER_BATCH as i64;
    }
    Ok(end)
}

/// Reads offsets `0..end`; returns the record bytes received.
fn fetch_all(server: &Server, end: i64, fetch_bytes: i32) -> anyhow::Result<u64> {
    let mut client = Client::connect(server.addr)?;
    let mut offset = 0i64;
    let mut received = 0u64;
    while offset < end {
        let request = FetchRequest::default()
            .with_max_wait_ms(500)
            .with_min_bytes(1)
            .with_max_bytes(fetch_bytes)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default().with_topic(topic_name()).with_partitions(vec![
                FetchPartition::default()
                    .with_partition(0)
                    .with_fetch_offset(offset)
                    .with_partition_max_bytes(fetch_bytes),
            ])]);
        let response = client.send(12, &request)?;
        let partition =
            response.responses.first().and_then(|t| t.partitions.first()).context("empty fetch response")?;
        if partition.error_code != 0 {
            bail!("Fetch failed with error {}", partition.error_code);
        }
        let mut records = partition.records.clone().unwrap_or_default();
        received += records.len() as u64;
        // Walk the batch headers: baseOffset (8), batchLength (4), ... lastOffsetDelta at 23.
        let mut next = offset;
        while records.len() >= 27 {
            let base = (&records[0..8]).get_i64();
            let length = (&records[8..12]).get_i32() as usize;
            let last_delta = (&records[23..27]).get_i32() as i64;
            next = base + last_delta + 1;
            if records.len() < 12 + length {
                break;
            }
            records.advance(12 + length);
        }
        if next == offset {
            bail!("fetch at {offset} made no progress");
        }
        offset = next;
    }
    Ok(received)
}

#[derive(Debug, Serialize)]
struct ModeResult {
    mode: &'static str,
    best_mb_per_s: f64,
    cpu_seconds_per_gb: f64,
    rounds_mb_per_s: Vec<f64>,
}

pub fn run(args: &FetchBenchArgs) -> anyhow::Result<()> {
    let bytes = args.bytes.unwrap_or(if args.quick { 64 << 20 } else { 1 << 30 });
    let fetch_bytes = i32::try_from(args.fetch_bytes).context("--fetch-bytes must be below 2 GiB")?;
    let rounds = if args.quick { args.rounds.min(2) } else { args.rounds }.max(1);
    let modes = [("sendfile", true), ("copy", false)];
    let mut servers = Vec::new();
    for (name, sendfile) in modes {
        let server = Server::start(sendfile)?;
        let end = prepare(&server, bytes)?;
        eprintln!("{name}: broker at {}, {} records written", server.addr, end);
        // One untimed pass brings both logs into the page cache alike.
        fetch_all(&server, end, fetch_bytes)?;
        servers.push((name, server, end, Vec::new(), 0.0f64, 0u64));
    }
    for round in 0..rounds {
        for (name, server, end, speeds, cpu, total) in servers.iter_mut() {
            let cpu_before = server.cpu_seconds()?;
            let started = Instant::now();
            let received = fetch_all(server, *end, fetch_bytes)?;
            let seconds = started.elapsed().as_secs_f64();
            *cpu += server.cpu_seconds()? - cpu_before;
            *total += received;
            let mb_per_s = received as f64 / 1e6 / seconds;
            eprintln!("round {}: {name} {:.0} MB/s", round + 1, mb_per_s);
            speeds.push(mb_per_s);
        }
    }
    let results: Vec<ModeResult> = servers
        .iter()
        .map(|(name, _, _, speeds, cpu, total)| ModeResult {
            mode: name,
            best_mb_per_s: speeds.iter().cloned().fold(0.0, f64::max),
            cpu_seconds_per_gb: cpu / (*total as f64 / 1e9),
            rounds_mb_per_s: speeds.clone(),
        })
        .collect();
    println!(
        "Fetch of {} MiB from the page cache, {} KiB per request, {rounds} rounds per mode",
        bytes >> 20,
        fetch_bytes >> 10
    );
    println!("{:<10} {:>12} {:>18}", "mode", "best MB/s", "broker CPU s/GB");
    for r in &results {
        println!("{:<10} {:>12.0} {:>18.3}", r.mode, r.best_mb_per_s, r.cpu_seconds_per_gb);
    }
    if let [zero_copy, copy] = &results[..] {
        println!(
            "sendfile vs copy: {:.2}x throughput, {:.2}x broker CPU per GB",
            zero_copy.best_mb_per_s / copy.best_mb_per_s,
            zero_copy.cpu_seconds_per_gb / copy.cpu_seconds_per_gb
        );
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&results)?)?;
    }
    Ok(())
}
