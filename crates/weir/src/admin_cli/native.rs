//! `weir produce --native`: stdin's lines through the native producer (`weir_client::native`),
//! which is answered once the broker holds them in memory and resends what a broker lost.
//!
//! Line n (from 0, plus `--first-sequence`) carries sequence number n. While the producer
//! runs, the command prints each partition's checkpoint as it moves: the highest sequence
//! number persisted (a caller may record it, and restart from there if the command and the
//! broker die together). At the end of stdin it waits until everything is persisted.

use std::io::Write;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use weir_broker::partitioner::partition_for_key;
use weir_client::native::{stable_partition, Message, Producer, ProducerConfig};

use super::produce::{split_line, ProduceArgs};

/// How often the checkpoints are looked at for printing.
const REPORT_EVERY: Duration = Duration::from_millis(20);

#[derive(Serialize)]
struct CheckpointLine {
    partition: i32,
    /// C: every record below it is persisted.
    checkpoint: i64,
    /// The highest line sequence number persisted.
    sequence: Option<u64>,
    load_stamp: i64,
}

#[derive(Serialize)]
struct Summary {
    produced: u64,
    resent: u64,
    /// The lowest line sequence number sent again.
    lowest_resent: Option<u64>,
    stale_sessions: u64,
    producer_id: i64,
}

pub fn run(args: &ProduceArgs, bootstrap: &str, lines: mpsc::Receiver<anyhow::Result<Vec<u8>>>) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(produce(args, bootstrap, lines))
}

async fn produce(
    args: &ProduceArgs,
    bootstrap: &str,
    lines: mpsc::Receiver<anyhow::Result<Vec<u8>>>,
) -> anyhow::Result<()> {
    let config = ProducerConfig { client_id: "weir-cli".to_string(), ..ProducerConfig::new(bootstrap) };
    let producer = Arc::new(
        Producer::connect(config, &args.topic)
            .await
            .with_context(|| format!("cannot start a native producer of '{}'", args.topic))?,
    );
    let partitions = producer.partitions();
    if let Some(partition) = args.partition.filter(|p| *p < 0 || *p >= partitions) {
        anyhow::bail!("partition {partition} of '{}' does not exist (it has {partitions})", args.topic);
    }
    // An elastic topic's logical partition lives in one stable partition for good.
    let logical = match args.logical_partition {
        Some(logical) => Some(stable_partition(logical, partitions)?),
        None => None,
    };
    let json = args.connection.json;
    let reporter = tokio::spawn(report(producer.clone(), json));

    // stdin is read by a thread; its lines come through a channel the runtime can await.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<anyhow::Result<Vec<u8>>>(1024);
    std::thread::spawn(move || {
        while let Ok(line) = lines.recv() {
            if tx.blocking_send(line).is_err() {
                return;
            }
        }
    });
    let separator = args.key_separator.as_deref().map(str::as_bytes);
    let mut sequence = args.first_sequence;
    let mut produced = 0u64;
    while let Some(line) = rx.recv().await {
        let line = line?;
        let (key, value) = split_line(&line, separator);
        let partition = match (args.partition.or(logical), key) {
            (Some(partition), _) => partition,
            (None, Some(key)) => partition_for_key(key, partitions),
            (None, None) => (produced % partitions as u64) as i32,
        };
        let mut message = Message::new(value.to_vec()).with_sequence(sequence);
        if let Some(key) = key {
            message = message.with_key(key.to_vec());
        }
        for (name, value) in &args.headers {
            message = message.with_header(name.clone(), value.clone().into_bytes());
        }
        producer.send(partition, message).await?;
        sequence += 1;
        produced += 1;
    }
    producer.persisted().await?;
    reporter.abort();
    print_checkpoints(&producer, json, &mut vec![None; partitions as usize])?;
    let stats = producer.stats();
    let mut out = std::io::stdout().lock();
    if json {
        let summary = Summary {
            produced,
            resent: stats.resent,
            lowest_resent: stats.lowest_resent,
            stale_sessions: stats.stale_sessions,
            producer_id: producer.producer_id(),
        };
        writeln!(out, "{}", serde_json::to_string(&summary)?)?;
    } else {
        writeln!(
            out,
            "produced {produced} record(s) to '{}', all persisted ({} resent after {} stale session(s))",
            args.topic, stats.resent, stats.stale_sessions
        )?;
    }
    Ok(())
}

/// Prints the checkpoints that moved since `last`.
fn print_checkpoints(producer: &Producer, json: bool, last: &mut [Option<(i64, i64)>]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    for (partition, seen) in last.iter_mut().enumerate() {
        let checkpoint = producer.checkpoint(partition as i32);
        if checkpoint.offset < 0 || *seen == Some((checkpoint.offset, checkpoint.load_stamp)) {
            continue;
        }
        *seen = Some((checkpoint.offset, checkpoint.load_stamp));
        let line = CheckpointLine {
            partition: partition as i32,
            checkpoint: checkpoint.offset,
            sequence: checkpoint.sequence,
            load_stamp: checkpoint.load_stamp,
        };
        if json {
            writeln!(out, "{}", serde_json::to_string(&line)?)?;
        } else {
            let through = line.sequence.map_or("none yet".to_string(), |s| s.to_string());
            writeln!(
                out,
                "partition {}: persisted below offset {}, through sequence {through}",
                partition, line.checkpoint
            )?;
        }
    }
    out.flush()?;
    Ok(())
}

async fn report(producer: Arc<Producer>, json: bool) {
    let mut last = vec![None; producer.partitions() as usize];
    loop {
        tokio::time::sleep(REPORT_EVERY).await;
        if print_checkpoints(&producer, json, &mut last).is_err() {
            return;
        }
    }
}
