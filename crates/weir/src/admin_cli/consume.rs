//! `weir consume TOPIC`: print records as they arrive.
//!
//! It reads all partitions (or `--partition`) in one long poll per request
//! (`GET /v1/topics/{topic}/records?offsets=...`), rotating which partition is read first so
//! none starves. With `--group` it starts from the group's committed offsets and, after
//! printing each response, commits the offset after the last record printed, as a standalone
//! consumer does (so the group must have no members).
//!
//! It ends with "consumed N record(s)" on stderr however it ends: `--max-messages`, `--timeout`,
//! or Ctrl-C. A Ctrl-C waits until the response being printed (and committed) is done, so the
//! count is exactly what was printed, then exits with status 130, as a shell expects.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use weir_admin::api::{
    CommitOffset, CommitOffsets, CommittedOffsets, ConsumedRecord, Encoding, GroupDescription, OffsetsAtTime,
    PartitionPosition, TopicDescription, TopicRecords,
};

use super::{failure_code, print_json, segment, AdminClient, Connection};

/// Records asked for per request.
const RECORDS_PER_REQUEST: u64 = 500;
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
    /// Start from this group's committed offsets and commit what was printed (the group must
    /// have no members).
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
    /// The offset committed for the group (to commit only what moved).
    committed: Option<i64>,
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
            .map(|o| Cursor { partition: o.partition, offset: o.offset.to_string(), committed: None })
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
        return Ok(partitions
            .iter()
            .map(|p| Cursor { partition: p.partition, offset: offset.clone(), committed: None })
            .collect());
    }
    let Some(group) = &args.group else {
        return Ok(partitions
            .iter()
            .map(|p| Cursor { partition: p.partition, offset: reset.into(), committed: None })
            .collect());
    };
    let committed: HashMap<i32, i64> = match client
        .get::<GroupDescription>(&format!("/v1/groups/{}", segment(group)), &[])
    {
        Ok(description) => {
            if description.state != "Empty" {
                anyhow::bail!(
                    "group '{group}' has active members (state {}); `weir consume --group` commits as a standalone consumer and needs the group to have none (NON_EMPTY_GROUP)",
                    description.state
                );
            }
            description
                .offsets
                .iter()
                .filter(|o| o.topic == args.topic)
                .filter_map(|o| o.committed_offset.map(|c| (o.partition, c)))
                .collect()
        }
        Err(e) if failure_code(&e) == Some("GROUP_ID_NOT_FOUND") => HashMap::new(),
        Err(e) => return Err(e),
    };
    Ok(partitions
        .iter()
        .map(|p| match committed.get(&p.partition) {
            // A committed offset that retention has passed (or beyond the log) restarts at the
            // reset position, as a Kafka consumer's auto.offset.reset does.
            Some(&c) if c >= p.log_start_offset && c <= p.log_end_offset => {
                Cursor { partition: p.partition, offset: c.to_string(), committed: Some(c) }
            }
            _ => Cursor { partition: p.partition, offset: reset.into(), committed: None },
        })
        .collect())
}

/// A record as `--json` prints it: the API's record with its topic first.
#[derive(serde::Serialize)]
struct JsonRecord<'a> {
    topic: &'a str,
    #[serde(flatten)]
    record: &'a ConsumedRecord,
}

fn write_record(out: &mut impl Write, topic: &str, record: &ConsumedRecord, json: bool) -> anyhow::Result<()> {
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
struct Progress {
    /// Records printed so far.
    printed: AtomicU64,
    /// Held while a response is printed and committed.
    busy: Mutex<()>,
    /// The run has ended and said so itself (set under `busy`).
    finished: AtomicBool,
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
fn poll_ms(timeout: Option<Duration>, last_record_at: Instant) -> u64 {
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

/// Commits the group's offsets of the cursors that moved since their last commit.
fn commit_moved(client: &AdminClient, group: &str, topic: &str, cursors: &mut [Cursor]) -> anyhow::Result<()> {
    let moved: Vec<CommitOffset> = cursors
        .iter_mut()
        .filter_map(|c| {
            let offset = c.offset.parse::<i64>().ok()?;
            if c.committed == Some(offset) {
                return None;
            }
            c.committed = Some(offset);
            Some(CommitOffset { topic: topic.to_string(), partition: c.partition, offset, metadata: None })
        })
        .collect();
    if !moved.is_empty() {
        let _: CommittedOffsets =
            client.post(&format!("/v1/groups/{}/offsets", segment(group)), &CommitOffsets { offsets: moved })?;
    }
    Ok(())
}

pub fn run(args: &ConsumeArgs) -> anyhow::Result<()> {
    let client = AdminClient::new(&args.connection)?;
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
        if let Some(group) = &args.group {
            commit_moved(&client, group, &args.topic, &mut cursors)?;
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
