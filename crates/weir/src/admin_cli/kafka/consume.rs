//! `weir consume` over the Kafka protocol: Fetch from each partition's leader, and with
//! `--group` as a member of the group ([`super::member`]), sharing the topic's partitions with
//! the group's other consumers and committing what it printed.
//!
//! Each Fetch waits at most [`FETCH_WAIT`], so a member heartbeats in time, a rebalance is
//! joined within a second and Ctrl-C is seen at once. On any ending (the count, the idle
//! timeout, Ctrl-C) a member commits what it printed and leaves the group.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::FetchRequest;
use weir_admin::api::{ConsumedRecord, Encoding, Headers};
use weir_broker::storage::batch::TimestampType;
use weir_broker::storage::records;
use weir_client::{ClientError, Cluster};

use super::member::{Member, Standing};
use super::{codes, describe_code, failure, list_offsets, topic_layout, topic_name, TopicLayout, EARLIEST, LATEST};
use crate::admin_cli::consume::{poll_ms, write_record, ConsumeArgs, Progress, RECORDS_PER_REQUEST};

/// Longest wait of one Fetch: a heartbeat is due every second.
const FETCH_WAIT: Duration = Duration::from_millis(500);
/// Bytes asked per partition and per Fetch.
const PARTITION_BYTES_MAX: i32 = 1 << 20;
const FETCH_BYTES_MAX: i32 = 16 << 20;
/// How long a member retries joining again while brokers are replaced.
const RESTART_WAIT_MAX: Duration = Duration::from_secs(60);
/// A Ctrl-C lets the loop commit and leave for this long before the process ends anyway.
const INTERRUPT_WAIT_MAX: Duration = Duration::from_secs(5);

/// Where the records of one partition are read next.
struct Position {
    partition: i32,
    offset: i64,
    /// What the group has committed (to commit only what moved).
    committed: Option<i64>,
}

pub fn run(args: &ConsumeArgs, bootstrap: &str) -> anyhow::Result<()> {
    let mut cluster = super::connect(bootstrap)?;
    let mut layout = topic_layout(&mut cluster, &args.topic)?;
    if let Some(p) = args.partition {
        if !layout.partitions.iter().any(|l| l.partition == p) {
            anyhow::bail!("topic '{}' has no partition {p}", args.topic);
        }
    }
    let progress = Arc::new(Progress::default());
    watch_interrupt(progress.clone());
    let mut member = match &args.group {
        Some(group) => Some(Member::new(&mut cluster, group, &args.topic)?),
        None => None,
    };
    let mut positions = match &mut member {
        Some(member) => restart(&mut cluster, member, &mut layout, args)?,
        None => starting_positions(&mut cluster, &layout, args, None)?,
    };
    let json = args.connection.json;
    let encoding = if json { args.encoding } else { Encoding::Utf8 };
    let mut out = std::io::stdout().lock();
    let mut printed: u64 = 0;
    let mut last_record_at = Instant::now();
    let mut unreadable = HashSet::new();
    let result = loop {
        if progress.interrupted.load(Ordering::Acquire) {
            break Ok(true);
        }
        let wanted = match args.max_messages {
            Some(max) if printed >= max => break Ok(false),
            Some(max) => (max - printed).min(RECORDS_PER_REQUEST),
            None => RECORDS_PER_REQUEST,
        };
        let wait = Duration::from_millis(poll_ms(args.timeout, last_record_at)).min(FETCH_WAIT);
        let fetched = fetch(&mut cluster, &layout, &mut positions, wait, wanted as usize, encoding, &mut unreadable);
        let (records, stale) = match fetched {
            Ok(fetched) => fetched,
            Err(e) => break Err(e),
        };
        if stale {
            layout = topic_layout(&mut cluster, &args.topic)?;
        }
        for record in &records {
            write_record(&mut out, &args.topic, record, json)?;
        }
        out.flush()?;
        printed += records.len() as u64;
        progress.printed.store(printed, Ordering::Release);
        if !records.is_empty() {
            last_record_at = Instant::now();
        }
        if let Some(member) = &mut member {
            if let Err(e) = keep_membership(&mut cluster, member, &mut layout, args, &mut positions) {
                break Err(e);
            }
        }
        if records.is_empty() && args.timeout.is_some_and(|t| last_record_at.elapsed() >= t) {
            break Ok(false);
        }
    };
    if let Some(member) = &mut member {
        // What was printed is committed and the partitions handed back, however it ended.
        let committed = commit_moved(&mut cluster, member, &mut positions);
        let left = member.leave(&mut cluster);
        if result.is_ok() {
            committed?;
            left?;
        }
    }
    progress.finished.store(true, Ordering::Release);
    eprintln!("consumed {printed} record(s)");
    match result {
        Ok(true) => std::process::exit(130),
        Ok(false) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Heartbeats and commits; on a rebalance, commits, joins again and starts the partitions it
/// now owns where the group committed.
fn keep_membership(
    cluster: &mut Cluster,
    member: &mut Member,
    layout: &mut TopicLayout,
    args: &ConsumeArgs,
    positions: &mut Vec<Position>,
) -> anyhow::Result<()> {
    let mut standing = commit_moved(cluster, member, positions)?;
    if standing == Standing::Member {
        standing = member.heartbeat_if_due(cluster)?;
    }
    if standing == Standing::Rejoin {
        // Committing may be refused once the generation is over: the next owner then
        // starts from the last commit that was accepted, and prints again what followed.
        let _ = commit_moved(cluster, member, positions);
        *positions = restart(cluster, member, layout, args)?;
    }
    Ok(())
}

/// Joins again and finds where the partitions now owned start. While a broker that died is
/// being replaced (the coordinator, or a leader asked for offsets), that is tried again for
/// up to [`RESTART_WAIT_MAX`].
fn restart(
    cluster: &mut Cluster,
    member: &mut Member,
    layout: &mut TopicLayout,
    args: &ConsumeArgs,
) -> anyhow::Result<Vec<Position>> {
    let deadline = Instant::now() + RESTART_WAIT_MAX;
    loop {
        let attempt = member.rejoin(cluster).and_then(|()| {
            *layout = topic_layout(cluster, &args.topic)?;
            starting_positions(cluster, layout, args, Some(member))
        });
        match attempt {
            Err(e) if is_transient(&e) && Instant::now() < deadline => {
                member.find_coordinator_again();
                std::thread::sleep(Duration::from_millis(200));
            }
            result => return result,
        }
    }
}

/// Whether `e` says a broker is gone or moving rather than that the request is wrong.
fn is_transient(e: &anyhow::Error) -> bool {
    let transient_codes = [
        "NOT_COORDINATOR",
        "COORDINATOR_NOT_AVAILABLE",
        "COORDINATOR_LOAD_IN_PROGRESS",
        "NOT_LEADER_OR_FOLLOWER",
        "LEADER_NOT_AVAILABLE",
        "REBALANCE_IN_PROGRESS",
    ];
    e.downcast_ref::<ClientError>().is_some_and(ClientError::is_unreachable)
        || crate::admin_cli::failure_code(e).is_some_and(|code| transient_codes.contains(&code))
}

/// Commits the positions that moved since their last commit.
fn commit_moved(cluster: &mut Cluster, member: &mut Member, positions: &mut [Position]) -> anyhow::Result<Standing> {
    let moved: Vec<(i32, i64)> =
        positions.iter().filter(|p| p.committed != Some(p.offset)).map(|p| (p.partition, p.offset)).collect();
    let standing = member.commit(cluster, &moved)?;
    if standing == Standing::Member {
        for p in positions.iter_mut() {
            p.committed = Some(p.offset);
        }
    }
    Ok(standing)
}

/// Where each partition read starts: `--offset`, the group's commits (a member reads only
/// its assigned partitions), else the earliest or the latest offset.
fn starting_positions(
    cluster: &mut Cluster,
    layout: &TopicLayout,
    args: &ConsumeArgs,
    member: Option<&Member>,
) -> anyhow::Result<Vec<Position>> {
    let partitions: Vec<i32> = match (member, args.partition) {
        (Some(m), Some(p)) => m.assigned.iter().copied().filter(|&a| a == p).collect(),
        (Some(m), None) => m.assigned.clone(),
        (None, Some(p)) => vec![p],
        (None, None) => layout.partitions.iter().map(|p| p.partition).collect(),
    };
    if partitions.is_empty() {
        return Ok(Vec::new());
    }
    let committed = match member {
        Some(m) => m.committed(cluster)?,
        None => BTreeMap::new(),
    };
    if let Some(timestamp) = args.from_time {
        // The first offset stamped at or after the time; past the last record, the log end.
        let at: BTreeMap<i32, i64> = list_offsets(cluster, layout, &partitions, timestamp)?.into_iter().collect();
        let past: Vec<i32> = partitions.iter().copied().filter(|p| at.get(p).is_none_or(|o| *o < 0)).collect();
        let ends: BTreeMap<i32, i64> = list_offsets(cluster, layout, &past, LATEST)?.into_iter().collect();
        let offset = |p: i32| at.get(&p).copied().filter(|o| *o >= 0).or_else(|| ends.get(&p).copied()).unwrap_or(0);
        return Ok(partitions.iter().map(|&p| Position { partition: p, offset: offset(p), committed: None }).collect());
    }
    let reset = match args.offset.as_deref() {
        Some("earliest") => EARLIEST,
        Some("latest") => LATEST,
        Some(number) => {
            let offset: i64 = number
                .parse()
                .map_err(|_| anyhow::anyhow!("--offset {number:?}: expected an offset, earliest or latest"))?;
            if args.partition.is_none() {
                anyhow::bail!("--offset {offset} needs --partition (or use earliest or latest)");
            }
            return Ok(partitions.iter().map(|&p| Position { partition: p, offset, committed: None }).collect());
        }
        None if args.from_beginning => EARLIEST,
        None => LATEST,
    };
    let uncommitted: Vec<i32> = partitions.iter().copied().filter(|p| !committed.contains_key(p)).collect();
    let resets: BTreeMap<i32, i64> = list_offsets(cluster, layout, &uncommitted, reset)?.into_iter().collect();
    Ok(partitions
        .iter()
        .map(|&p| match committed.get(&p) {
            Some(&c) => Position { partition: p, offset: c, committed: Some(c) },
            None => Position { partition: p, offset: resets.get(&p).copied().unwrap_or(0), committed: None },
        })
        .collect())
}

/// One Fetch per leader of the positions; returns the records in partition order (at most
/// `wanted`) and whether the metadata is stale (a partition's leader moved). Positions advance
/// past what is returned, and past batches with nothing to print (transaction markers).
fn fetch(
    cluster: &mut Cluster,
    layout: &TopicLayout,
    positions: &mut [Position],
    wait: Duration,
    wanted: usize,
    encoding: Encoding,
    unreadable: &mut HashSet<i32>,
) -> anyhow::Result<(Vec<ConsumedRecord>, bool)> {
    let mut by_leader: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    let mut stale = false;
    for (i, position) in positions.iter().enumerate() {
        match layout.partitions.iter().find(|l| l.partition == position.partition).map(|l| l.leader) {
            Some(leader) if leader >= 0 => by_leader.entry(leader).or_default().push(i),
            _ => stale = true,
        }
    }
    if by_leader.is_empty() {
        // Nothing to read (no partition assigned, or none has a leader): wait as a Fetch would.
        std::thread::sleep(wait);
        return Ok((Vec::new(), stale));
    }
    let wait_ms = i32::try_from((wait / by_leader.len() as u32).as_millis()).unwrap_or(i32::MAX);
    let mut out = Vec::new();
    for (leader, indexes) in by_leader {
        let request = FetchRequest::default()
            .with_max_wait_ms(wait_ms)
            .with_min_bytes(1)
            .with_max_bytes(FETCH_BYTES_MAX)
            .with_topics(vec![FetchTopic::default().with_topic(topic_name(&layout.name)).with_partitions(
                indexes
                    .iter()
                    .map(|&i| {
                        FetchPartition::default()
                            .with_partition(positions[i].partition)
                            .with_fetch_offset(positions[i].offset)
                            .with_partition_max_bytes(PARTITION_BYTES_MAX)
                    })
                    .collect(),
            )]);
        let response = match cluster.send_to(leader, 4..=12, &request) {
            Ok((_, response)) => response,
            // A leader that stopped answering: its partitions get another leader, which the
            // next Metadata names; the others are read meanwhile.
            Err(e) if e.is_unreachable() => {
                for &i in &indexes {
                    if unreadable.insert(positions[i].partition) {
                        eprintln!("partition {}: leader {leader} unreachable: {e} (retrying)", positions[i].partition);
                    }
                }
                stale = true;
                // Not at once again: the cluster needs a moment to name another leader.
                std::thread::sleep(wait);
                continue;
            }
            Err(e) => return Err(failure(e)),
        };
        super::check(response.error_code, None, || format!("fetching from broker {leader}"))?;
        for data in response.responses.iter().flat_map(|t| &t.partitions) {
            let Some(position) = positions.iter_mut().find(|p| p.partition == data.partition_index) else { continue };
            match data.error_code {
                0 => {
                    if unreadable.remove(&position.partition) {
                        eprintln!("partition {}: readable again", position.partition);
                    }
                }
                codes::OFFSET_OUT_OF_RANGE => {
                    // Retention passed it: from the log start, as a Kafka consumer's
                    // auto.offset.reset=earliest; beyond the log: from its end.
                    position.offset = if position.offset > data.high_watermark {
                        data.high_watermark
                    } else {
                        data.log_start_offset.max(0)
                    };
                    continue;
                }
                code => {
                    stale |= matches!(
                        code,
                        codes::NOT_LEADER_OR_FOLLOWER
                            | codes::LEADER_NOT_AVAILABLE
                            | codes::FENCED_LEADER_EPOCH
                            | codes::UNKNOWN_TOPIC_OR_PARTITION
                    );
                    if unreadable.insert(position.partition) {
                        let name = weir_kafka::errors::error_name(i32::from(code));
                        eprintln!("partition {}: {name} {} (retrying)", position.partition, describe_code(code));
                    }
                    continue;
                }
            }
            if let Some(bytes) = &data.records {
                take_records(&layout.name, position, bytes, wanted, encoding, &mut out)?;
            }
        }
    }
    Ok((out, stale))
}

/// Appends to `out` the records of `bytes` (a Fetch answer's record batches of `position`'s
/// partition) from its offset on, until `out` holds `wanted`, and moves the position past them
/// (and past batches with nothing to print: transaction markers).
fn take_records(
    topic: &str,
    position: &mut Position,
    bytes: &[u8],
    wanted: usize,
    encoding: Encoding,
    out: &mut Vec<ConsumedRecord>,
) -> anyhow::Result<()> {
    let batches = records::decode_batches(bytes)
        .map_err(|e| anyhow::anyhow!("cannot decode the records of {topic}-{}: {e}", position.partition))?;
    for batch in batches {
        if out.len() >= wanted {
            break;
        }
        let timestamp_type = batch.header.timestamp_type();
        if !batch.header.is_control() {
            for record in batch.records {
                if record.offset < position.offset || out.len() >= wanted {
                    continue;
                }
                position.offset = record.offset + 1;
                out.push(consumed(position.partition, record, timestamp_type, encoding));
            }
        }
        // Only a batch printed whole is passed: the rest of one cut short is read again.
        if out.len() < wanted {
            position.offset = position.offset.max(batch.header.next_offset());
        }
    }
    Ok(())
}

fn consumed(
    partition: i32,
    record: records::Record,
    timestamp_type: TimestampType,
    encoding: Encoding,
) -> ConsumedRecord {
    let text = |bytes: Option<bytes::Bytes>| {
        bytes.map(|b| match encoding {
            Encoding::Utf8 => String::from_utf8_lossy(&b).into_owned(),
            Encoding::Base64 => {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD.encode(&b)
            }
        })
    };
    let timestamp_type = match timestamp_type {
        TimestampType::CreateTime => "CreateTime",
        TimestampType::LogAppendTime => "LogAppendTime",
    };
    ConsumedRecord {
        partition,
        offset: record.offset,
        timestamp: record.timestamp,
        timestamp_type: timestamp_type.to_string(),
        key: text(record.key),
        value: text(record.value),
        headers: Headers(record.headers.into_iter().map(|h| (h.name, text(h.value))).collect()),
    }
}

/// On Ctrl-C, asks the loop to stop (it commits and leaves the group, then exits with 130);
/// if it has not within [`INTERRUPT_WAIT_MAX`], says how many records were printed and exits.
fn watch_interrupt(progress: Arc<Progress>) {
    let spawned = std::thread::Builder::new().name("ctrl-c".into()).spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_io().build() else { return };
        if runtime.block_on(tokio::signal::ctrl_c()).is_err() {
            return;
        }
        progress.interrupted.store(true, Ordering::Release);
        let deadline = Instant::now() + INTERRUPT_WAIT_MAX;
        while Instant::now() < deadline {
            if progress.finished.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("consumed {} record(s)", progress.printed.load(Ordering::Acquire));
        std::process::exit(130);
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot watch for Ctrl-C: it will stop without leaving the group");
    }
}
