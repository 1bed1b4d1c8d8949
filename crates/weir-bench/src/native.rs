//! `weir bench native`: the native write protocol against Kafka produce, on a memory-first
//! topic and on a page-cache topic, side by side on one broker. See `NATIVE_LONG_ABOUT` in
//! `cli.rs`.

use std::time::Instant;

use anyhow::{bail, Context};
use bytes::Bytes;
use hdrhistogram::Histogram;
use serde::Serialize;
use weir_client::native::{Message, Producer, ProducerConfig};
use weir_harness::kafka_client::produce_request;

use crate::cli::NativeBenchArgs;
use crate::produce::{encode_batch, PRODUCE_VERSION};
use crate::raw_protocol::{self, Server};

/// What each topic is, by name.
const TOPICS: [(&str, &str); 2] = [("memory-first", "bench-native-memory"), ("page cache", "bench-native-disk")];

#[derive(Debug, Default, Serialize)]
struct Row {
    topic: &'static str,
    client: &'static str,
    /// One write at a time: until the write is answered (native: accepted in memory).
    answered_p50_ms: f64,
    answered_p99_ms: f64,
    /// One write at a time: until it is persisted (native: the checkpoint passes it; Kafka:
    /// the answer, acks=all).
    persisted_p50_ms: f64,
    persisted_p99_ms: f64,
    /// Streaming --bytes: until all is persisted.
    mb_per_s: f64,
    cpu_seconds_per_gb: f64,
}

pub(crate) fn run(args: &NativeBenchArgs) -> anyhow::Result<()> {
    let settings: Vec<(String, String)> =
        [("remote.log.storage.system.enable", "true".to_string()), ("memory.flush.ms", args.flush_ms.to_string())]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .chain(args.settings.iter().cloned())
            .collect();
    let server = Server::start("weir-bench-native-", &settings, None)?;
    let mut client = raw_protocol::connect(server.addr)?;
    for (kind, topic) in TOPICS {
        let mut configs = vec![("remote.storage.enable".to_string(), "true".to_string())];
        if kind == "memory-first" {
            configs.push(("storage.mode".to_string(), "memory".to_string()));
        }
        raw_protocol::create_topic(&mut client, topic, 1, &configs, None)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let bootstrap = server.addr.to_string();
    let mut rows = Vec::new();
    for round in 0..args.rounds {
        for (kind, topic) in TOPICS {
            let native = runtime.block_on(native_row(&server, &bootstrap, topic, kind, args))?;
            eprintln!("round {}: {}", round + 1, line(&native));
            rows.push(native);
            let kafka = kafka_row(&server, topic, kind, args)?;
            eprintln!("round {}: {}", round + 1, line(&kafka));
            rows.push(kafka);
        }
    }
    println!("\n| topic | client | answered p50 / p99 ms | persisted p50 / p99 ms | MB/s | broker CPU s/GB |");
    println!("|---|---|---|---|---|---|");
    for row in &rows {
        println!(
            "| {} | {} | {:.2} / {:.2} | {:.2} / {:.2} | {:.0} | {:.2} |",
            row.topic,
            row.client,
            row.answered_p50_ms,
            row.answered_p99_ms,
            row.persisted_p50_ms,
            row.persisted_p99_ms,
            row.mb_per_s,
            row.cpu_seconds_per_gb
        );
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn line(row: &Row) -> String {
    format!(
        "{} {}: answered p50 {:.2} ms, persisted p50 {:.2} ms, {:.0} MB/s, {:.2} CPU s/GB",
        row.topic, row.client, row.answered_p50_ms, row.persisted_p50_ms, row.mb_per_s, row.cpu_seconds_per_gb
    )
}

fn histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 600_000_000, 3).context("histogram")
}

fn ms(histogram: &Histogram<u64>, quantile: f64) -> f64 {
    histogram.value_at_quantile(quantile) as f64 / 1000.0
}

async fn native_row(
    server: &Server,
    bootstrap: &str,
    topic: &str,
    kind: &'static str,
    args: &NativeBenchArgs,
) -> anyhow::Result<Row> {
    let record_bytes = args.record_bytes as usize;
    let config = ProducerConfig { client_id: "weir-bench".to_string(), ..ProducerConfig::new(bootstrap) };
    let producer = Producer::connect(config, topic).await?;
    let value = Bytes::from(vec![b'n'; record_bytes]);
    let (mut answered, mut persisted) = (histogram()?, histogram()?);
    for _ in 0..args.writes {
        let started = Instant::now();
        producer.send(0, Message::new(value.clone())).await?;
        producer.flush().await?;
        answered.record(started.elapsed().as_micros() as u64)?;
        producer.persisted().await?;
        persisted.record(started.elapsed().as_micros() as u64)?;
    }
    let records = (args.bytes / record_bytes as u64).max(1);
    let cpu_before = server.cpu_seconds()?;
    let started = Instant::now();
    for _ in 0..records {
        producer.send(0, Message::new(value.clone())).await?;
    }
    producer.persisted().await?;
    let stream = Stream {
        seconds: started.elapsed().as_secs_f64(),
        cpu_seconds: server.cpu_seconds()? - cpu_before,
        bytes: records as f64 * record_bytes as f64,
    };
    Ok(stream.row(kind, "native", &answered, &persisted))
}

/// What streaming took.
struct Stream {
    seconds: f64,
    cpu_seconds: f64,
    bytes: f64,
}

impl Stream {
    fn row(
        &self,
        topic: &'static str,
        client: &'static str,
        answered: &Histogram<u64>,
        persisted: &Histogram<u64>,
    ) -> Row {
        Row {
            topic,
            client,
            answered_p50_ms: ms(answered, 0.5),
            answered_p99_ms: ms(answered, 0.99),
            persisted_p50_ms: ms(persisted, 0.5),
            persisted_p99_ms: ms(persisted, 0.99),
            mb_per_s: self.bytes / 1e6 / self.seconds,
            cpu_seconds_per_gb: self.cpu_seconds / (self.bytes / 1e9),
        }
    }
}

/// Kafka produce with acks=all: one request at a time for the latency, then --bytes in 1 MiB
/// batches with five requests in flight (what librdkafka keeps by default).
fn kafka_row(server: &Server, topic: &str, kind: &'static str, args: &NativeBenchArgs) -> anyhow::Result<Row> {
    let record_bytes = args.record_bytes as usize;
    let mut client = raw_protocol::connect(server.addr)?;
    let (one, _) = encode_batch(record_bytes, 1)?;
    let mut latency = histogram()?;
    for _ in 0..args.writes {
        let started = Instant::now();
        let response = client.send(PRODUCE_VERSION, &produce_request(topic, 0, one.clone(), -1))?;
        check(&response)?;
        latency.record(started.elapsed().as_micros() as u64)?;
    }
    let (batch, per_batch) = encode_batch(record_bytes, 1 << 20)?;
    let batches = (args.bytes / (per_batch * record_bytes) as u64).max(1);
    let cpu_before = server.cpu_seconds()?;
    let started = Instant::now();
    let mut in_flight = std::collections::VecDeque::new();
    for _ in 0..batches {
        if in_flight.len() == 5 {
            let id = in_flight.pop_front().context("in flight")?;
            check(&client.read::<kafka_protocol::messages::ProduceRequest>(PRODUCE_VERSION, id)?)?;
        }
        in_flight.push_back(client.write(PRODUCE_VERSION, &produce_request(topic, 0, batch.clone(), -1))?);
    }
    for id in in_flight {
        check(&client.read::<kafka_protocol::messages::ProduceRequest>(PRODUCE_VERSION, id)?)?;
    }
    let stream = Stream {
        seconds: started.elapsed().as_secs_f64(),
        cpu_seconds: server.cpu_seconds()? - cpu_before,
        bytes: (batches * (per_batch * record_bytes) as u64) as f64,
    };
    // Kafka's answer is its persistence.
    Ok(stream.row(kind, "Kafka acks=all", &latency, &latency))
}

fn check(response: &kafka_protocol::messages::ProduceResponse) -> anyhow::Result<()> {
    let partition =
        response.responses.first().and_then(|t| t.partition_responses.first()).context("empty produce response")?;
    if partition.error_code != 0 {
        bail!("Produce failed with error {}", raw_protocol::error_name(partition.error_code));
    }
    Ok(())
}
