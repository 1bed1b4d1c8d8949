//! `weir consume TOPIC`: print records as they arrive.
//!
//! It reads all partitions (or `--partition`) in one long poll per request
//! (`GET /v1/topics/{topic}/records?offsets=...`), rotating which partition is read first so
//! none starves. With `--group`, or with `--bootstrap`, it speaks the Kafka protocol instead
//! ([`kafka::consume`]): a group's member must join, heartbeat and leave, which only the Kafka
//! protocol can do.
//!
//! It ends with "consumed N record(s)" on stderr however it ends: `--max-messages`, `--timeout`,
//! or Ctrl-C. A Ctrl-C waits until the response being printed is done, so the
//! count is exactly what was printed, then exits with status 130, as a shell expects.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use weir_admin::api::{
    BrokerInfo, ConsumedRecord, Encoding, OffsetsAtTime, PartitionPosition, TopicDescription, TopicRecords,
};

use super::{kafka, print_json, segment, AdminClient, Connection};

/// Records asked for per request.
pub(crate) const RECORDS_PER_REQUEST: u64 = 500;
/// Longest long poll per request when no --timeout bounds it.
const POLL_MS_MAX: u64 = 30_000;

#[derive(Debug, Args)]
pub struct ConsumeArgs {
    pub topic: String,
    /// Only this partition. [default: every partition]
    #[arg(long)]
    pub partition: Option<i32>,
    /// Where to start: an offset (with --partition), `earliest` or `latest`.
    #[arg(long, conflicts_with_all = ["group", "from_beginning", "from_time"])]
    pub offset: Option<String>,
    /// Start at the first record stamped at or after this time: 2026-12-01T00:00:00Z, -1h,
    /// -30m, or ms since the epoch.
    #[arg(long, value_name = "TIME", conflicts_with_all = ["group", "from_beginning"],
          value_parser = super::time::parse_time_arg, allow_hyphen_values = true)]
    pub from_time: Option<i64>,
    /// Consume as a member of this consumer group: share the topic's partitions with the
    /// group's other consumers, start where the group committed and commit what was printed.
    /// Speaks the Kafka protocol: to --bootstrap, or to the Kafka listener the admin API
    /// advertises.
    #[arg(long)]
    pub group: Option<String>,
    /// Start at the earliest offset (where the group has committed nothing, with --group).
    /// [default: only records produced from now on]
    #[arg(long)]
    pub from_beginning: bool,
    /// Stop after printing this many records.
    #[arg(long, value_name = "N")]
    pub max_messages: Option<u64>,
    /// Stop when no record arrives for this many seconds.
    #[arg(long, value_name = "SECS", value_parser = parse_timeout)]
    pub timeout: Option<Duration>,
    /// How keys, values and headers are written with --json.
    #[arg(long, default_value = "utf8", value_parser = parse_encoding)]
    pub encoding: Encoding,
    #[command(flatten)]
    pub connection: Connection,
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text.trim().parse().map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(0.0..=86_400.0).contains(&seconds) {
        return Err("expected a number of seconds from 0 to 86400".into());
    }
    Ok(Duration::from_secs_f64(seconds))
}

fn parse_encoding(text: &str) -> Result<Encoding, String> {
    Encoding::parse(text).ok_or_else(|| format!("{text:?}: expected utf8 or base64"))
}

/// One partition being read.
struct Cursor {
    partition: i32,
    /// An offset, or `earliest`/`latest` until the first answer gives a number.
    offset: String,
}

/// The Kafka listener the broker behind the admin API advertises to clients.
fn advertised_kafka_listener(client: &AdminClient) -> anyhow::Result<String> {
    let info: BrokerInfo = client.get("/v1/broker", &[])?;
    Ok(info.listeners.kafka_advertised)
}

/// Where each partition starts.
fn starting_cursors(client: &AdminClient, args: &ConsumeArgs) -> anyhow::Result<Vec<Cursor>> {
    let topic: TopicDescription = client.get(&format!("/v1/topics/{}", segment(&args.topic)), &[])?;
    let partitions: Vec<_> = match args.partition {
        None => topic.partitions.iter().collect(),
        Some(p) => match topic.partitions.iter().find(|info| info.partition == p) {
            Some(info) => vec![info],
            None => anyhow::bail!("topic '{}' has no partition {p}", args.topic),
        },
    };
    if let Some(timestamp) = args.from_time {
        let path = format!("/v1/topics/{}/offsets", segment(&args.topic));
        let at: OffsetsAtTime = client.get(&path, &[("timestamp", timestamp.to_string())])?;
        let wanted = |p: i32| partitions.iter().any(|info| info.partition == p);
        return Ok(at
            .offsets
            .into_iter()
            .filter(|o| wanted(o.partition))
            .map(|o| Cursor { partition: o.partition, offset: o.offset.to_string() })
            .collect());
    }
    let reset = if args.from_beginning { "earliest" } else { "latest" };
    if let Some(offset) = &args.offset {
        let numeric = offset.parse::<i64>().is_ok();
        if numeric && args.partition.is_none() {
            anyhow::bail!("--offset {offset} needs --partition (or use earliest or latest)");
        }
        if !numeric && offset != "earliest" && offset != "latest" {
            anyhow::bail!("--offset {offset:?}: expected an offset, earliest or latest");
        }
        return Ok(partitions.iter().map(|p| Cursor { partition: p.partition, offset: offset.clone() }).collect());
    }
    Ok(partitions.iter().map(|p| Cursor { partition: p.partition, offset: reset.into() }).collect())
}

/// A record as `--json` prints it: the API's record with its topic first.
#[derive(serde::Serialize)]
struct JsonRecord<'a> {
    topic: &'a str,
    #[serde(flatten)]
    record: &'a ConsumedRecord,
}

pub(crate) fn write_record(
    out: &mut impl Write,
    topic: &str,
    record: &ConsumedRecord,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        return print_json(out, &JsonRecord { topic, record });
    }
    let text = |t: &Option<String>| t.clone().unwrap_or_else(|| "(null)".into());
    write!(out, "partition={} offset={} key={}", record.partition, record.offset, text(&record.key))?;
    if !record.headers.is_empty() {
        let headers: Vec<String> =
            record.headers.0.iter().map(|(name, value)| format!("{name}:{}", text(value))).collect();
        write!(out, " headers={}", headers.join(","))?;
    }
    writeln!(out, " value={}", text(&record.value))?;
    Ok(())
}

/// How far a run got: what a Ctrl-C reports.
#[derive(Default)]
pub(crate) struct Progress {
    /// Records printed so far.
    pub(crate) printed: AtomicU64,
    /// Held while a response is printed and committed.
    busy: Mutex<()>,
    /// The run has ended and said so itself (set under `busy`).
    pub(crate) finished: AtomicBool,
    /// Ctrl-C was pressed: a run that must leave a group stops, leaves and exits itself.
    pub(crate) interrupted: AtomicBool,
}

impl Progress {
    fn busy(&self) -> std::sync::MutexGuard<'_, ()> {
        self.busy.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Longest a Ctrl-C waits for the response being printed: stdout may be a pipe nobody reads.
const INTERRUPT_WAIT_MAX: Duration = Duration::from_secs(2);

/// On Ctrl-C (SIGINT), once the response being printed is done (at most
/// [`INTERRUPT_WAIT_MAX`]), says how many records were printed and exits with status 130.
fn report_on_interrupt(progress: Arc<Progress>) {
    let spawned = std::thread::Builder::new().name("ctrl-c".into()).spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_io().build() else { return };
        if runtime.block_on(tokio::signal::ctrl_c()).is_err() {
            return;
        }
        let deadline = Instant::now() + INTERRUPT_WAIT_MAX;
        let held = loop {
            match progress.busy.try_lock() {
                Ok(guard) => break Some(guard),
                Err(std::sync::TryLockError::Poisoned(e)) => break Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(std::sync::TryLockError::WouldBlock) => break None,
            }
        };
        if !progress.finished.load(Ordering::Acquire) {
            eprintln!("consumed {} record(s)", progress.printed.load(Ordering::Acquire));
        }
        drop(held);
        std::process::exit(130);
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot watch for Ctrl-C: it will stop without the count");
    }
}

/// How long the next request may wait for records: at most until the idle timeout runs out (a
/// last poll without waiting at 0).
pub(crate) fn poll_ms(timeout: Option<Duration>, last_record_at: Instant) -> u64 {
    match timeout {
        Some(timeout) => {
            let left = timeout.saturating_sub(last_record_at.elapsed());
            u64::try_from(left.as_millis()).unwrap_or(u64::MAX).min(POLL_MS_MAX)
        }
        None => POLL_MS_MAX,
    }
}

/// Says once when a partition cannot be read (its cursor stays) and once when it can again.
fn report_unreadable(positions: &[PartitionPosition], unreadable: &mut HashSet<i32>) {
    for position in positions {
        match &position.error {
            Some(e) if unreadable.insert(position.partition) => {
                eprintln!("partition {}: {} {} (retrying)", position.partition, e.code, e.message)
            }
            None if unreadable.remove(&position.partition) => {
                eprintln!("partition {}: readable again", position.partition)
            }
            _ => {}
        }
    }
}

pub fn run(args: &ConsumeArgs) -> anyhow::Result<()> {
    if let Some(bootstrap) = &args.connection.bootstrap {
        return kafka::consume::run(args, bootstrap);
    }
    let client = AdminClient::new(&args.connection)?;
    if args.group.is_some() {
        // Group membership is Kafka's protocol: the admin API says where its listener is.
        let bootstrap = advertised_kafka_listener(&client)?;
        return kafka::consume::run(args, &bootstrap);
    }
    let json = args.connection.json;
    // Human output always decodes as text; --encoding only changes the JSON.
    let encoding = if json { args.encoding } else { Encoding::Utf8 };
    let mut cursors = starting_cursors(&client, args)?;
    let records_path = format!("/v1/topics/{}/records", segment(&args.topic));
    let mut out = std::io::stdout().lock();
    let progress = Arc::new(Progress::default());
    report_on_interrupt(progress.clone());
    let mut printed: u64 = 0;
    let mut last_record_at = Instant::now();
    let mut unreadable: HashSet<i32> = HashSet::new();
    loop {
        let wanted = match args.max_messages {
            Some(max) if printed >= max => break,
            Some(max) => (max - printed).min(RECORDS_PER_REQUEST),
            None => RECORDS_PER_REQUEST,
        };
        let poll_ms = poll_ms(args.timeout, last_record_at);
        let offsets: Vec<String> = cursors.iter().map(|c| format!("{}:{}", c.partition, c.offset)).collect();
        let response: TopicRecords = client.get(
            &records_path,
            &[
                ("offsets", offsets.join(",")),
                ("max_records", wanted.to_string()),
                ("timeout_ms", poll_ms.to_string()),
                ("encoding", encoding.as_str().to_string()),
            ],
        )?;
        // A Ctrl-C from here on waits until this response is printed and committed.
        let busy = progress.busy();
        // Where each partition may continue (and be committed): after the last record printed,
        // or where the broker says when every record it returned was printed.
        // A partition that could not be read this time (its leader is down) keeps its cursor.
        report_unreadable(&response.partitions, &mut unreadable);
        let mut next: HashMap<i32, i64> =
            response.partitions.iter().filter(|p| p.error.is_none()).map(|p| (p.partition, p.next_offset)).collect();
        let mut stopped_early = false;
        for (i, record) in response.records.iter().enumerate() {
            if args.max_messages.is_some_and(|max| printed >= max) {
                // Records not printed stay for the next run of the group.
                for rest in &response.records[i..] {
                    next.entry(rest.partition).and_modify(|n| *n = (*n).min(rest.offset));
                }
                stopped_early = true;
                break;
            }
            write_record(&mut out, &args.topic, record, json)?;
            printed += 1;
            progress.printed.store(printed, Ordering::Release);
        }
        out.flush()?;
        if !response.records.is_empty() {
            last_record_at = Instant::now();
        }
        for cursor in &mut cursors {
            if let Some(n) = next.get(&cursor.partition) {
                cursor.offset = n.to_string();
            }
        }
        drop(busy);
        if stopped_early {
            break;
        }
        cursors.rotate_left(1);
        if response.records.is_empty() && args.timeout.is_some_and(|t| last_record_at.elapsed() >= t) {
            break;
        }
    }
    let _busy = progress.busy();
    progress.finished.store(true, Ordering::Release);
    eprintln!("consumed {printed} record(s)");
    Ok(())
}
