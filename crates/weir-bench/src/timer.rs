//! `weir bench timer`: the timer store of delayed messages (`weir-broker/src/timer/`) under a
//! million pending messages: how late they fire, that each fires exactly once, and the memory
//! and disk they take. See `TIMER_LONG_ABOUT` in `cli.rs` for what is measured.
//!
//! Message `i` has the key `i` (8 bytes, big-endian), a body that starts with `i` (as the
//! rocketmq bench's do), and a delivery time that [`Schedule::due_ms`] derives from `i` alone,
//! so the read-back checks every record against what was sent without keeping it. Request `n`
//! carries messages `n * batch ..` to partition `n % partitions`; a fired message must come back
//! in the partition it was produced to.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use hdrhistogram::Histogram;
use kafka_protocol::messages::fetch_request::FetchTopic;
use serde::Serialize;
use weir_broker::message::headers::DELIVERY_TIMESTAMP;
use weir_harness::kafka_client::{fetch_partition, fetch_request, produce_request, topic_name, Client as KafkaClient};
use weir_messaging::timer::due_ms;
use weir_messaging::timer::headers::PREFIX as TIMER_HEADER_PREFIX;
use weir_storage::records::{self, BatchOptions, Header, Record};

use crate::cli::TimerBenchArgs;
use crate::produce::{self, Latency, PRODUCE_VERSION};
use crate::raw_protocol::{self, Pid, Server};
use crate::rocketmq::body;

const TOPIC: &str = "bench-timer";
/// Fetch API version of the tailing consumer and the read-back (as `raw_protocol::fetch_all`).
const FETCH_VERSION: i16 = 12;
/// What a Fetch asks of each partition.
const FETCH_PARTITION_BYTES: i32 = 1 << 20;
/// The tailing consumer's long poll.
const TAIL_MAX_WAIT_MS: i32 = 100;
/// How often the broker's RSS is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// After the last delivery time, the run fails if the topic gains no message for this long (it
/// may take long: the figures are what they are, but a timer that stopped firing fails).
const STALL_LIMIT: Duration = Duration::from_secs(60);
/// How often the wait after the last delivery time says how far the firing is.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// Once every message is in the topic: how long it must stay at exactly that count (a message
/// fired twice would show up late), and long enough for the timer's once-a-second maintenance
/// to trim its log before the "after" figures are taken.
const SETTLE: Duration = Duration::from_secs(3);
/// The seconds of the window listed with their lateness (the worst ones).
const WORST_SECONDS: usize = 5;
/// The timer store's slot width (`weir_messaging::timer::wheel::SLOT_MS`): slot boundaries in the
/// window are shown next to the lateness spikes.
const SLOT_MS: i64 = weir_messaging::timer::wheel::SLOT_MS;
const LOOKAHEAD_MS: i64 = weir_messaging::timer::wheel::LOOKAHEAD_MS;
const MIB: f64 = (1u64 << 20) as f64;
/// The sampler scrapes the timer's gauges every this many RSS samples (once a second).
const GAUGES_EVERY: u64 = 10;
/// Kafka's default `max.message.bytes`.
const DEFAULT_MAX_MESSAGE_BYTES: u64 = 1_048_588;

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// A pseudo-random number of `index` (splitmix64): the spread of delivery times, the same for
/// the sender and the checker.
fn mix(index: u64) -> u64 {
    let mut z = index.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Which message is due when, goes where and carries what.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    messages: u64,
    size: usize,
    /// When scheduling started, ms since the epoch.
    start_ms: i64,
    delay_ms: i64,
    window_ms: i64,
    batch: u64,
    partitions: i32,
    /// Delivery times grow with the index (messages are sent in the order they are due), instead
    /// of being random in send order.
    sorted: bool,
}

impl Schedule {
    /// Message `index`'s delivery time in `[start + delay, start + delay + window)`: uniformly
    /// random, or (`sorted`) evenly spaced in index order.
    fn due_ms(&self, index: u64) -> i64 {
        let window = self.window_ms.max(1) as u64;
        let offset = if self.sorted {
            (u128::from(index) * u128::from(window) / u128::from(self.messages.max(1))) as u64
        } else {
            mix(index) % window
        };
        self.start_ms + self.delay_ms + offset as i64
    }

    fn first_due_ms(&self) -> i64 {
        (0..self.messages).map(|i| self.due_ms(i)).min().unwrap_or(self.start_ms)
    }

    fn last_due_ms(&self) -> i64 {
        (0..self.messages).map(|i| self.due_ms(i)).max().unwrap_or(self.start_ms)
    }

    fn requests(&self) -> u64 {
        self.messages.div_ceil(self.batch)
    }

    /// The messages of Produce request `n` and its partition.
    fn request(&self, n: u64) -> (std::ops::Range<u64>, i32) {
        let start = n * self.batch;
        (start..(start + self.batch).min(self.messages), (n % self.partitions as u64) as i32)
    }

    fn partition_of(&self, index: u64) -> i32 {
        self.request(index / self.batch).1
    }

    /// Message `index` as produced: key `index`, its body, its delivery time as a header.
    fn record(&self, index: u64, now_ms: i64) -> Record {
        let mut record = Record::new(
            now_ms,
            Some(Bytes::copy_from_slice(&index.to_be_bytes())),
            Some(Bytes::from(body(index, self.size))),
        );
        record.headers.push(Header::new(DELIVERY_TIMESTAMP, Some(Bytes::from(self.due_ms(index).to_string()))));
        record
    }
}

/// What the read-back found wrong, by kind, with the first example of each.
#[derive(Debug, Default)]
struct Problems {
    counts: Vec<(&'static str, u64, String)>,
}

impl Problems {
    fn note(&mut self, kind: &'static str, example: impl FnOnce() -> String) {
        match self.counts.iter_mut().find(|(k, _, _)| *k == kind) {
            Some((_, count, _)) => *count += 1,
            None => self.counts.push((kind, 1, example())),
        }
    }

    fn check(&self) -> anyhow::Result<()> {
        if self.counts.is_empty() {
            return Ok(());
        }
        let listed: Vec<String> =
            self.counts.iter().map(|(kind, count, example)| format!("{count} {kind} (first: {example})")).collect();
        bail!("the fired messages are not exactly the scheduled ones: {}", listed.join("; "))
    }
}

/// Checks the fired records of the topic against the schedule: each message exactly once, in
/// its partition, with its body and delivery time, without the timer's headers, not early.
/// Collects the lateness of each (firing time = record timestamp, less delivery time), ms.
struct Checker {
    schedule: Schedule,
    seen: Vec<bool>,
    /// (delivery time, lateness) of each message checked.
    lateness_ms: Vec<(i64, i64)>,
    problems: Problems,
}

impl Checker {
    fn new(schedule: Schedule) -> Checker {
        Checker {
            schedule,
            seen: vec![false; schedule.messages as usize],
            lateness_ms: Vec::with_capacity(schedule.messages as usize),
            problems: Problems::default(),
        }
    }

    fn add(&mut self, partition: i32, record: &Record) {
        let s = self.schedule;
        let at = || format!("offset {} of partition {partition}", record.offset);
        let Some(index) = record.key.as_deref().and_then(|k| <[u8; 8]>::try_from(k).ok()).map(u64::from_be_bytes)
        else {
            self.problems.note("records without a message key", at);
            return;
        };
        if index >= s.messages {
            self.problems.note("records with a key never sent", || format!("key {index} at {}", at()));
            return;
        }
        if std::mem::replace(&mut self.seen[index as usize], true) {
            self.problems.note("messages fired more than once", || format!("message {index}, again at {}", at()));
            return;
        }
        if partition != s.partition_of(index) {
            self.problems.note("messages fired to another partition", || {
                format!("message {index} sent to {}, at {}", s.partition_of(index), at())
            });
        }
        if record.value.as_deref() != Some(&body(index, s.size)[..]) {
            self.problems.note("messages with another body", || format!("message {index} at {}", at()));
        }
        if let Some(h) = record.headers.iter().find(|h| h.name.starts_with(TIMER_HEADER_PREFIX)) {
            let name = h.name.clone();
            self.problems.note("messages still carrying a timer header", || format!("{name} on message {index}"));
        }
        let due = s.due_ms(index);
        if due_ms(record) != Some(due) {
            self.problems.note("messages with another delivery time", || {
                format!("message {index}: {:?}, sent {due}", due_ms(record))
            });
        }
        let lateness = record.timestamp - due;
        if lateness < 0 {
            self.problems.note("messages fired early", || format!("message {index}, {} ms early", -lateness));
        }
        self.lateness_ms.push((due, lateness));
    }

    /// (delivery time, lateness) of every message, once all are checked; fails on any problem.
    fn finish(mut self) -> anyhow::Result<Vec<(i64, i64)>> {
        let missing = self.seen.iter().filter(|seen| !**seen).count() as u64;
        if missing > 0 {
            let first = self.seen.iter().position(|seen| !*seen).unwrap_or(0);
            self.problems.counts.push(("messages never fired", missing, format!("message {first}")));
        }
        self.problems.check()?;
        Ok(self.lateness_ms)
    }
}

/// Percentiles of a lateness sample, ms.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
struct Lateness {
    count: u64,
    min: i64,
    mean: f64,
    p50: i64,
    p99: i64,
    p999: i64,
    max: i64,
}

impl Lateness {
    /// `None` for an empty sample. Sorts `ms`.
    fn of(ms: &mut [i64]) -> Option<Lateness> {
        if ms.is_empty() {
            return None;
        }
        ms.sort_unstable();
        // The nearest-rank percentile: the smallest value with at least q of the sample at or below.
        let at = |q: f64| ms[((q * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
        Some(Lateness {
            count: ms.len() as u64,
            min: ms[0],
            mean: ms.iter().map(|&v| v as f64).sum::<f64>() / ms.len() as f64,
            p50: at(0.5),
            p99: at(0.99),
            p999: at(0.999),
            max: ms[ms.len() - 1],
        })
    }
}

/// The lateness of the messages due in one second of the window.
#[derive(Debug, Clone, Copy, Serialize)]
struct Second {
    /// Seconds after the start of scheduling.
    at_s: i64,
    messages: u64,
    p99_ms: i64,
    max_ms: i64,
}

/// The lateness of the messages due in each second of the window, in time order.
fn by_second(schedule: &Schedule, dues_and_lateness: &[(i64, i64)]) -> Vec<Second> {
    let mut by_second: std::collections::BTreeMap<i64, Vec<i64>> = std::collections::BTreeMap::new();
    for &(due, lateness) in dues_and_lateness {
        by_second.entry((due - schedule.start_ms).div_euclid(1000)).or_default().push(lateness);
    }
    by_second
        .into_iter()
        .filter_map(|(at_s, mut lateness)| {
            let l = Lateness::of(&mut lateness)?;
            Some(Second { at_s, messages: l.count, p99_ms: l.p99, max_ms: l.max })
        })
        .collect()
}

/// The `count` seconds whose messages fired latest (by max lateness, then p99).
fn worst_seconds(seconds: &[Second], count: usize) -> Vec<Second> {
    let mut worst = seconds.to_vec();
    worst.sort_by_key(|s| std::cmp::Reverse((s.max_ms, s.p99_ms)));
    worst.truncate(count);
    worst
}

/// Where the wheel's minute slots start within the window, in seconds after the start of
/// scheduling (each is loaded into memory `LOOKAHEAD_MS` before).
fn slot_starts(schedule: &Schedule) -> Vec<f64> {
    let (first, last) =
        (schedule.start_ms + schedule.delay_ms, schedule.start_ms + schedule.delay_ms + schedule.window_ms);
    let mut slot = first.div_euclid(SLOT_MS) * SLOT_MS + SLOT_MS;
    let mut starts = Vec::new();
    while slot < last {
        starts.push((slot - schedule.start_ms) as f64 / 1e3);
        slot += SLOT_MS;
    }
    starts
}

/// The size of a directory tree: bytes as files say (apparent) and blocks allocated (as `du`),
/// and its files.
#[derive(Debug, Default, Clone, Copy, Serialize)]
struct DiskUsage {
    apparent_bytes: u64,
    allocated_bytes: u64,
    files: u64,
}

impl DiskUsage {
    fn of(path: &Path) -> DiskUsage {
        use std::os::unix::fs::MetadataExt;
        let mut usage = DiskUsage::default();
        let Ok(entries) = std::fs::read_dir(path) else { return usage };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                let sub = DiskUsage::of(&entry.path());
                usage.apparent_bytes += sub.apparent_bytes;
                usage.allocated_bytes += sub.allocated_bytes;
                usage.files += sub.files;
            } else {
                usage.apparent_bytes += meta.len();
                usage.allocated_bytes += meta.blocks() * 512;
                usage.files += 1;
            }
        }
        usage
    }
}

/// The timer store on disk: its shards' logs (the partitions of `__delayed_messages`) and the
/// slot files of their wheels.
#[derive(Debug, Default, Clone, Copy, Serialize)]
struct TimerDisk {
    log: DiskUsage,
    wheel: DiskUsage,
    total: DiskUsage,
}

impl TimerDisk {
    fn of(data_dir: &Path) -> TimerDisk {
        let mut log = DiskUsage::default();
        let prefix = format!("{}-", weir_messaging::timer::TOPIC);
        for entry in std::fs::read_dir(data_dir).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let shard = DiskUsage::of(&entry.path());
                log.apparent_bytes += shard.apparent_bytes;
                log.allocated_bytes += shard.allocated_bytes;
                log.files += shard.files;
            }
        }
        let wheel = DiskUsage::of(&data_dir.join(weir_messaging::timer::Timer::DIR));
        let total = DiskUsage {
            apparent_bytes: log.apparent_bytes + wheel.apparent_bytes,
            allocated_bytes: log.allocated_bytes + wheel.allocated_bytes,
            files: log.files + wheel.files,
        };
        TimerDisk { log, wheel, total }
    }
}

/// The timer store's gauges from the broker's `/metrics` (see docs/metrics.md).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
struct Gauges {
    pending: u64,
    in_memory: u64,
}

/// The value of an unlabelled metric `name` in a Prometheus text exposition.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn parse_gauges(text: &str) -> Option<Gauges> {
    Some(Gauges {
        pending: metric(text, "weir_timer_messages_pending")? as u64,
        in_memory: metric(text, "weir_timer_messages_in_memory")? as u64,
    })
}

/// Scrapes the gauges from the admin listener at `admin`; `None` if that fails.
fn gauges(admin: Option<SocketAddr>) -> Option<Gauges> {
    let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(10))).build().into();
    let mut response = agent.get(format!("http://{}/metrics", admin?)).call().ok()?;
    parse_gauges(&response.body_mut().read_to_string().ok()?)
}

/// The broker's memory and the timer's gauges at one point of the run.
#[derive(Debug, Clone, Copy, Serialize)]
struct Point {
    /// Seconds after the start of scheduling (negative: before it).
    at_s: f64,
    rss: u64,
    gauges: Option<Gauges>,
}

/// Samples the broker's RSS every [`SAMPLE_EVERY`], and the timer's gauges every
/// [`GAUGES_EVERY`] samples, until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<(f64, u64)>>>,
    points: Arc<Mutex<Vec<Point>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    started: Instant,
}

impl Sampler {
    fn start(pid: u32, admin: Option<SocketAddr>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let points = Arc::new(Mutex::new(Vec::new()));
        let started = Instant::now();
        let thread = {
            let (stop, samples, points) = (stop.clone(), samples.clone(), points.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if let Some(rss) = rss_bytes(pid) {
                        let at = started.elapsed().as_secs_f64();
                        samples.lock().unwrap_or_else(|e| e.into_inner()).push((at, rss));
                        if n.is_multiple_of(GAUGES_EVERY) {
                            if let Some(gauges) = gauges(admin) {
                                let point = Point { at_s: at, rss, gauges: Some(gauges) };
                                points.lock().unwrap_or_else(|e| e.into_inner()).push(point);
                            }
                        }
                    }
                    n += 1;
                    std::thread::sleep(SAMPLE_EVERY);
                }
            })
        };
        Sampler { stop, samples, points, thread: Some(thread), started }
    }

    /// The gauge sample with the most messages in memory.
    fn most_in_memory(&self) -> Option<Point> {
        let points = self.points.lock().unwrap_or_else(|e| e.into_inner());
        points.iter().copied().max_by_key(|p| p.gauges.map_or(0, |g| g.in_memory))
    }

    /// Seconds since the sampler started.
    fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The largest RSS sampled in `from..to` (seconds since the start).
    fn peak(&self, from: f64, to: f64) -> Option<u64> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.iter().filter(|(t, _)| (from..=to).contains(t)).map(|(_, rss)| *rss).max()
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop();
    }
}

fn rss_bytes(pid: u32) -> Option<u64> {
    weir_proc::memory(Pid::Of(pid))?.resident_bytes
}

/// The broker's memory at the points of the run, bytes.
#[derive(Debug, Serialize)]
struct MemoryReport {
    before: Point,
    /// Right after scheduling: every message pending.
    all_pending: Point,
    /// At the first delivery time, before any fired.
    first_due: Point,
    /// The gauge sample with the most messages in the wheel's memory.
    most_in_memory: Option<Point>,
    /// RSS at `most_in_memory` less before, per message in memory.
    bytes_per_message_in_memory: Option<f64>,
    after_fired: Point,
    /// The largest VmRSS sampled while scheduling, while firing, and over the whole run.
    peak_scheduling: Option<u64>,
    peak_firing: Option<u64>,
    peak_sampled: Option<u64>,
    /// VmHWM: the resident peak over the broker's life.
    peak_hwm: Option<u64>,
}

#[derive(Debug, Serialize)]
struct DiskReport {
    before: TimerDisk,
    all_pending: TimerDisk,
    after_fired: TimerDisk,
}

#[derive(Debug, Serialize)]
struct ScheduleReport {
    messages: u64,
    requests: u64,
    seconds: f64,
    msgs_per_s: f64,
    latency_ms: Option<Latency>,
    broker_cpu_us_per_msg: f64,
    /// Whether scheduling ended before the first delivery time (the "all pending" figures are
    /// then with every message pending).
    done_before_first_due: bool,
}

#[derive(Debug, Serialize)]
struct FireReport {
    /// The fired record's timestamp (the firing time) less its delivery timestamp.
    lateness_ms: Lateness,
    /// When the tailing consumer got the record, less its delivery timestamp.
    seen_lateness_ms: Option<Lateness>,
    worst_seconds: Vec<Second>,
    /// Every second of the window, in time order.
    seconds_of_window: Vec<Second>,
    /// Where the wheel's minute slots start in the window (seconds after the start).
    slot_starts_s: Vec<f64>,
    /// From the first delivery time until the topic held every message.
    seconds: f64,
    broker_cpu_us_per_msg: f64,
    /// How long after the last delivery time the topic held every message, ms.
    last_in_topic_after_ms: i64,
}

#[derive(Debug, Serialize)]
struct Report {
    kafka: String,
    messages: u64,
    size: usize,
    partitions: i32,
    delay_s: f64,
    window_s: f64,
    batch: u64,
    connections: u32,
    schedule: ScheduleReport,
    fire: FireReport,
    memory: MemoryReport,
    disk: DiskReport,
}

/// The steps share the broker and the sampler, which runs from before scheduling until the
/// read-back so that its peaks and gauges cover the whole run; each step takes its figures at
/// its own point of it.
pub(crate) fn run(args: &TimerBenchArgs) -> anyhow::Result<()> {
    let mut bench = Bench::start(args)?;
    // Let the broker settle after start-up before its "before" RSS.
    std::thread::sleep(Duration::from_secs(1));
    let before_ms = now_ms();
    let mut before = bench.point(before_ms)?;
    let disk_before = TimerDisk::of(bench.server.data_dir());
    let mut sampler = Sampler::start(bench.server.pid(), bench.server.admin);

    // 1. Schedule.
    let scheduled = bench.schedule(&sampler)?;
    before.at_s = (before_ms - scheduled.schedule.start_ms) as f64 / 1e3;
    scheduled.print();
    bench.check_scheduled_in_time(&scheduled)?;

    // 2. Fire: a consumer tails the topic while the broker fires; then the topic is read back.
    let (fired, tail) = bench.fire(&scheduled, &sampler)?;
    let mut settled = bench.settle_and_read_back(tail, &scheduled.schedule)?;
    sampler.stop();
    let memory = memory_report(before, &scheduled, &fired, &settled, &sampler, bench.server.pid());
    let fire = fire_report(&scheduled, &fired, &mut settled)?;
    let plan = bench.plan;
    let report = Report {
        kafka: bench.server.addr.to_string(),
        messages: plan.messages,
        size: plan.size,
        partitions: args.partitions,
        delay_s: plan.delay.as_secs_f64(),
        window_s: plan.window.as_secs_f64(),
        batch: plan.batch,
        connections: args.connections,
        schedule: scheduled.report,
        fire,
        memory,
        disk: DiskReport {
            before: disk_before,
            all_pending: scheduled.disk_all_pending,
            after_fired: settled.disk_after_fired,
        },
    };
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The run's sizes: the command line's, else the defaults (the `--quick` ones smaller).
#[derive(Debug, Clone, Copy)]
struct Plan {
    messages: u64,
    size: usize,
    delay: Duration,
    window: Duration,
    /// Records per Produce request; never more than the messages.
    batch: u64,
}

impl Plan {
    fn of(args: &TimerBenchArgs) -> anyhow::Result<Plan> {
        let messages = args.messages.unwrap_or(if args.quick { 20_000 } else { 1_000_000 });
        let size = usize::try_from(args.size).ok().filter(|&s| s <= 1 << 20).context("--size must be at most 1 MiB")?;
        Ok(Plan {
            messages,
            size,
            delay: args.delay.unwrap_or(Duration::from_secs(if args.quick { 3 } else { 20 })),
            window: args.window.unwrap_or(Duration::from_secs(if args.quick { 4 } else { 40 })),
            batch: u64::from(args.batch).min(messages),
        })
    }

    /// The schedule of a run whose scheduling starts at `start_ms`, which the delivery times
    /// count from.
    fn schedule(&self, args: &TimerBenchArgs, start_ms: i64) -> Schedule {
        Schedule {
            messages: self.messages,
            size: self.size,
            start_ms,
            delay_ms: self.delay.as_millis() as i64,
            window_ms: self.window.as_millis().max(1) as i64,
            batch: self.batch,
            partitions: args.partitions,
            sorted: args.sorted,
        }
    }
}

/// What every step of the run shares: the broker under test, its DELAY topic already created.
struct Bench<'a> {
    args: &'a TimerBenchArgs,
    plan: Plan,
    server: Server,
    /// Watches the topic's end offsets (the senders, the tail and the read-back have their own
    /// connections).
    admin: KafkaClient,
    partitions: Vec<i32>,
}

/// What scheduling measured, and when the messages are due (what the firing is timed against).
struct Scheduled {
    schedule: Schedule,
    first_due_ms: i64,
    last_due_ms: i64,
    /// When the last Produce was answered, ms since the epoch.
    done_ms: i64,
    report: ScheduleReport,
    all_pending: Point,
    disk_all_pending: TimerDisk,
    peak_rss: Option<u64>,
    /// The sampler's clock less the run's (seconds after the start of scheduling).
    sampling_offset_s: f64,
}

impl Scheduled {
    fn print(&self) {
        let report = &self.report;
        let (messages, scheduled_in) = (report.messages, report.seconds);
        println!(
            "scheduled {messages} messages in {scheduled_in:.2} s: {:.0} msg/s, Produce p50 {:.2} ms p99 {:.2} ms, \
             broker {:.1} µs/msg; {:.1} s before the first delivery time",
            report.msgs_per_s,
            report.latency_ms.as_ref().map_or(f64::NAN, |l| l.p50),
            report.latency_ms.as_ref().map_or(f64::NAN, |l| l.p99),
            report.broker_cpu_us_per_msg,
            (self.first_due_ms - self.done_ms) as f64 / 1e3,
        );
    }
}

/// What the firing measured, from the first delivery time until the topic held every message.
struct Fired {
    /// The broker at the first delivery time, before any message fired.
    first_due: Point,
    seconds: f64,
    broker_cpu_seconds: f64,
    peak_rss: Option<u64>,
    /// When the topic held every message, ms since the epoch.
    all_in_ms: i64,
}

/// The run's end: the broker once every message has fired, and what the read-back found.
struct Settled {
    after_fired: Point,
    disk_after_fired: TimerDisk,
    /// The tailing consumer's lateness of each record, ms.
    seen: Vec<i64>,
    /// (delivery time, lateness) of every message, as the read-back checked them.
    dues_and_lateness: Vec<(i64, i64)>,
}

impl<'a> Bench<'a> {
    /// Starts the broker (with the admin listener: it serves the timer's gauges on /metrics) and
    /// creates the DELAY topic.
    fn start(args: &'a TimerBenchArgs) -> anyhow::Result<Bench<'a>> {
        let plan = Plan::of(args)?;
        let Plan { messages, size, delay, window, batch } = plan;
        let server = Server::start_with_admin("weir-bench-timer-", &args.settings, args.data_dir.as_deref())?;
        println!(
            "weir bench timer: broker at {} (pid {}); {messages} messages of {size} bytes to a DELAY topic of {} \
             partitions, due uniformly in +{:.1} s .. +{:.1} s, scheduled by {} connection(s) of {batch} records/request",
            server.addr,
            server.pid(),
            args.partitions,
            delay.as_secs_f64(),
            (delay + window).as_secs_f64(),
            args.connections,
        );
        let mut admin = raw_protocol::connect(server.addr)?;
        // Room for a request's batch (each record is its body, its key, its header and ~30 bytes),
        // and never less than the default: the timer fires batches of up to 4,096 records.
        let max_message_bytes = (batch * (size as u64 + 96) + (64 << 10)).max(DEFAULT_MAX_MESSAGE_BYTES);
        let configs = [
            (weir_broker::topic_config::MESSAGE_TYPE.to_string(), "DELAY".to_string()),
            ("max.message.bytes".to_string(), max_message_bytes.to_string()),
        ];
        raw_protocol::create_topic(&mut admin, TOPIC, args.partitions, &configs, None)?;
        let partitions = (0..args.partitions).collect();
        Ok(Bench { args, plan, server, admin, partitions })
    }

    /// The broker's RSS and the timer's gauges now, `at_s` counted from `start_ms`.
    fn point(&self, start_ms: i64) -> anyhow::Result<Point> {
        Ok(Point {
            at_s: (now_ms() - start_ms) as f64 / 1e3,
            rss: rss_bytes(self.server.pid()).context("cannot read the broker's RSS from /proc")?,
            gauges: gauges(self.server.admin),
        })
    }

    /// Sends every message (timed, with the broker's CPU), then takes the "all pending" figures.
    /// The delivery times are computed before the clock starts: they take a pass over the
    /// messages that is no part of scheduling.
    fn schedule(&self, sampler: &Sampler) -> anyhow::Result<Scheduled> {
        let schedule = self.plan.schedule(self.args, now_ms());
        let (first_due_ms, last_due_ms) = (schedule.first_due_ms(), schedule.last_due_ms());
        let scheduling_from = sampler.now();
        let sampling_offset_s = scheduling_from - (now_ms() - schedule.start_ms) as f64 / 1e3;
        let cpu_before = self.server.cpu_seconds()?;
        let started = Instant::now();
        let latency = send_all(self.server.addr, &schedule, self.args.connections)?;
        let scheduled_in = started.elapsed().as_secs_f64();
        let schedule_cpu = self.server.cpu_seconds()? - cpu_before;
        let done_ms = now_ms();
        let all_pending = self.point(schedule.start_ms)?;
        let disk_all_pending = TimerDisk::of(self.server.data_dir());
        let peak_rss = sampler.peak(scheduling_from, sampler.now());
        let messages = self.plan.messages;
        let report = ScheduleReport {
            messages,
            requests: schedule.requests(),
            seconds: scheduled_in,
            msgs_per_s: messages as f64 / scheduled_in,
            latency_ms: Latency::of(&latency),
            broker_cpu_us_per_msg: schedule_cpu * 1e6 / messages as f64,
            done_before_first_due: done_ms < first_due_ms,
        };
        Ok(Scheduled {
            schedule,
            first_due_ms,
            last_due_ms,
            done_ms,
            report,
            all_pending,
            disk_all_pending,
            peak_rss,
            sampling_offset_s,
        })
    }

    /// Fails if a message reached the topic before the first delivery time; warns when
    /// scheduling ran past it, as the "all pending" figures then miss what had fired.
    fn check_scheduled_in_time(&mut self, scheduled: &Scheduled) -> anyhow::Result<()> {
        if scheduled.report.done_before_first_due {
            // Nothing may have fired yet: every record went to the timer, none to the topic.
            let offsets = raw_protocol::latest_offsets(&mut self.admin, TOPIC, &self.partitions)?;
            let early: i64 = offsets.iter().sum();
            if early != 0 && now_ms() < scheduled.first_due_ms {
                bail!("{TOPIC} holds {early} records before the first delivery time");
            }
        } else {
            println!(
                "warning: scheduling ended {:.1} s after the first delivery time: the 'all pending' figures are taken \
                 with some messages fired; raise --delay",
                (scheduled.done_ms - scheduled.first_due_ms) as f64 / 1e3
            );
        }
        Ok(())
    }

    /// Starts the tailing consumer, waits for the first delivery time, then times the firing
    /// (with the broker's CPU) until the topic holds every message. Fails if the topic stops
    /// growing for [`STALL_LIMIT`] after the last delivery time. Returns the running tail.
    fn fire(&mut self, scheduled: &Scheduled, sampler: &Sampler) -> anyhow::Result<(Fired, Tail)> {
        let (messages, last_due) = (self.plan.messages, scheduled.last_due_ms);
        let tail = Tail::start(self.server.addr, &self.partitions, messages)?;
        let wait = Duration::from_millis(u64::try_from(scheduled.first_due_ms - now_ms() - 50).unwrap_or(0));
        std::thread::sleep(wait);
        let first_due = self.point(scheduled.schedule.start_ms)?;
        let firing_from = sampler.now();
        let cpu_before = self.server.cpu_seconds()?;
        let started = Instant::now();
        let (mut last_total, mut last_growth, mut last_progress) = (0, Instant::now(), Instant::now());
        let all_in_ms = loop {
            let total: i64 = raw_protocol::latest_offsets(&mut self.admin, TOPIC, &self.partitions)?.iter().sum();
            if total >= messages as i64 {
                break now_ms();
            }
            if total > last_total {
                (last_total, last_growth) = (total, Instant::now());
            }
            let now = now_ms();
            if now > last_due && last_growth.elapsed() >= STALL_LIMIT {
                tail.stop();
                bail!(
                    "{TOPIC} holds {total} of the {messages} messages, {:.0} s after the last delivery time, and \
                     gained none in {} s: the timer stopped firing",
                    (now - last_due) as f64 / 1e3,
                    STALL_LIMIT.as_secs()
                );
            }
            if now > last_due && last_progress.elapsed() >= PROGRESS_EVERY {
                last_progress = Instant::now();
                println!(
                    "  {total} of {messages} messages in {TOPIC}, {:.0} s after the last delivery time",
                    (now - last_due) as f64 / 1e3
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let seconds = started.elapsed().as_secs_f64();
        let broker_cpu_seconds = self.server.cpu_seconds()? - cpu_before;
        let peak_rss = sampler.peak(firing_from, sampler.now());
        println!(
            "every message is in {TOPIC} {:.2} s after the last delivery time ({seconds:.1} s of firing, broker \
             {:.1} µs/msg)",
            (all_in_ms - last_due) as f64 / 1e3,
            broker_cpu_seconds * 1e6 / messages as f64
        );
        Ok((Fired { first_due, seconds, broker_cpu_seconds, peak_rss, all_in_ms }, tail))
    }

    /// Once the topic has held every message: fails unless it still holds exactly that many
    /// after [`SETTLE`] (a message fired twice shows up late), takes the "after" figures, and
    /// checks every fired record against the schedule.
    fn settle_and_read_back(&mut self, tail: Tail, schedule: &Schedule) -> anyhow::Result<Settled> {
        let messages = self.plan.messages;
        std::thread::sleep(SETTLE);
        let total: i64 = raw_protocol::latest_offsets(&mut self.admin, TOPIC, &self.partitions)?.iter().sum();
        if total != messages as i64 {
            tail.stop();
            bail!(
                "{TOPIC} holds {total} records {} s after it held all {messages}: some fired twice",
                SETTLE.as_secs()
            );
        }
        let after_fired = self.point(schedule.start_ms)?;
        let disk_after_fired = TimerDisk::of(self.server.data_dir());
        let seen = tail.finish()?;
        let dues_and_lateness = read_back(self.server.addr, &self.partitions, schedule)?;
        println!("read back: every message fired exactly once, in its partition, intact, none early");
        Ok(Settled { after_fired, disk_after_fired, seen, dues_and_lateness })
    }
}

/// The broker's memory over the run. `sampler` has stopped, so its peak is the whole run's;
/// its samples are on its own clock and are moved to the run's (seconds after scheduling began).
fn memory_report(
    before: Point,
    scheduled: &Scheduled,
    fired: &Fired,
    settled: &Settled,
    sampler: &Sampler,
    pid: u32,
) -> MemoryReport {
    let peak_sampled = sampler.peak(0.0, f64::MAX);
    let peak_hwm = weir_proc::memory(Pid::Of(pid)).and_then(|m| m.resident_peak_bytes);
    let most_in_memory = sampler.most_in_memory().map(|p| Point { at_s: p.at_s - scheduled.sampling_offset_s, ..p });
    let bytes_per_message_in_memory = most_in_memory.and_then(|p| {
        let in_memory = p.gauges?.in_memory;
        (in_memory > 0).then(|| (p.rss as f64 - before.rss as f64) / in_memory as f64)
    });
    MemoryReport {
        before,
        all_pending: scheduled.all_pending,
        first_due: fired.first_due,
        most_in_memory,
        bytes_per_message_in_memory,
        after_fired: settled.after_fired,
        peak_scheduling: scheduled.peak_rss,
        peak_firing: fired.peak_rss,
        peak_sampled,
        peak_hwm,
    }
}

/// The lateness figures of the firing, from the read-back's and the tailing consumer's (which
/// it sorts); fails if nothing fired.
fn fire_report(scheduled: &Scheduled, fired: &Fired, settled: &mut Settled) -> anyhow::Result<FireReport> {
    let schedule = &scheduled.schedule;
    let dues_and_lateness = &settled.dues_and_lateness;
    let mut lateness: Vec<i64> = dues_and_lateness.iter().map(|(_, lateness)| *lateness).collect();
    let seconds_of_window = by_second(schedule, dues_and_lateness);
    Ok(FireReport {
        lateness_ms: Lateness::of(&mut lateness).context("nothing fired")?,
        seen_lateness_ms: Lateness::of(&mut settled.seen),
        worst_seconds: worst_seconds(&seconds_of_window, WORST_SECONDS),
        seconds_of_window,
        slot_starts_s: slot_starts(schedule),
        seconds: fired.seconds,
        broker_cpu_us_per_msg: fired.broker_cpu_seconds * 1e6 / schedule.messages as f64,
        last_in_topic_after_ms: fired.all_in_ms - scheduled.last_due_ms,
    })
}

/// Schedules every message of `schedule` with Kafka Produce (acks=all, no producer id), over
/// `connections` connections with one request outstanding each; returns the request latencies
/// (µs). Fails unless every answer is OK with base offset -1: the broker kept every record for
/// later and appended none to the topic.
fn send_all(addr: SocketAddr, schedule: &Schedule, connections: u32) -> anyhow::Result<Histogram<u64>> {
    let next = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let results: Vec<anyhow::Result<Histogram<u64>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..connections)
            .map(|_| {
                let (next, failed) = (&next, &failed);
                scope.spawn(move || {
                    let result = send_connection(addr, schedule, next, failed);
                    if result.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    result
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a sender thread panicked")))).collect()
    });
    let latencies = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    produce::merge(&latencies)
}

fn send_connection(
    addr: SocketAddr,
    schedule: &Schedule,
    next: &AtomicU64,
    failed: &AtomicBool,
) -> anyhow::Result<Histogram<u64>> {
    let mut client = raw_protocol::connect(addr)?;
    let mut latency = produce::latency_histogram()?;
    while !failed.load(Ordering::Relaxed) {
        let n = next.fetch_add(1, Ordering::Relaxed);
        if n >= schedule.requests() {
            break;
        }
        let (indices, partition) = schedule.request(n);
        let now = now_ms();
        let batch: Vec<Record> = indices.map(|i| schedule.record(i, now)).collect();
        let bytes = records::encode_batch(&batch, &BatchOptions::default())?.freeze();
        let request = produce_request(TOPIC, partition, bytes, -1);
        let started = Instant::now();
        let response = client
            .send(PRODUCE_VERSION, &request)
            .with_context(|| format!("Produce of request {n} to {TOPIC}-{partition}"))?;
        latency.saturating_record(started.elapsed().as_micros() as u64);
        let answer = response
            .responses
            .iter()
            .flat_map(|t| &t.partition_responses)
            .find(|p| p.index == partition)
            .with_context(|| format!("the Produce response has no result for {TOPIC}-{partition}"))?;
        if answer.error_code != 0 {
            bail!(
                "Produce to {TOPIC}-{partition} failed: {} {}",
                raw_protocol::error_name(answer.error_code),
                answer.error_message.as_deref().unwrap_or("")
            );
        }
        if answer.base_offset != -1 {
            bail!(
                "Produce to {TOPIC}-{partition} appended records at offset {} instead of scheduling them all: \
                 their delivery time had passed when they reached the broker (raise --delay)",
                answer.base_offset
            );
        }
    }
    Ok(latency)
}

/// The bytes of the whole batches at the start of `bytes` (a Fetch may end in part of one).
fn whole_batches(bytes: &[u8]) -> &[u8] {
    let mut at = 0;
    while bytes.len() - at >= 12 {
        let length = i32::from_be_bytes([bytes[at + 8], bytes[at + 9], bytes[at + 10], bytes[at + 11]]);
        let Some(end) = usize::try_from(length).ok().map(|l| at + 12 + l).filter(|&end| end <= bytes.len()) else {
            break;
        };
        at = end;
    }
    &bytes[..at]
}

/// One Fetch of every partition of `topic` from `positions` (advanced past what came back);
/// `each` gets every record at or past its partition's position. Returns how many came.
pub(crate) fn fetch_once(
    client: &mut KafkaClient,
    topic: &str,
    partitions: &[i32],
    positions: &mut [i64],
    max_wait_ms: i32,
    mut each: impl FnMut(i32, &Record),
) -> anyhow::Result<u64> {
    let requested = partitions
        .iter()
        .zip(positions.iter())
        .map(|(&p, &offset)| fetch_partition(p, offset, FETCH_PARTITION_BYTES))
        .collect();
    let request = fetch_request(max_wait_ms, 1, FETCH_PARTITION_BYTES.saturating_mul(partitions.len() as i32))
        .with_topics(vec![FetchTopic::default().with_topic(topic_name(topic)).with_partitions(requested)]);
    let response = client.send(FETCH_VERSION, &request).context("Fetch")?;
    let mut count = 0;
    for answer in response.responses.iter().flat_map(|t| &t.partitions) {
        let Some(slot) = partitions.iter().position(|&p| p == answer.partition_index) else { continue };
        if answer.error_code != 0 {
            bail!(
                "Fetch of {TOPIC}-{} failed: {}",
                answer.partition_index,
                raw_protocol::error_name(answer.error_code)
            );
        }
        let Some(bytes) = answer.records.as_ref() else { continue };
        let batches = records::decode_batches(whole_batches(bytes))
            .with_context(|| format!("decoding a Fetch of {topic}-{}", answer.partition_index))?;
        for batch in batches {
            if batch.header.is_control() {
                positions[slot] = positions[slot].max(batch.header.next_offset());
                continue;
            }
            for record in &batch.records {
                if record.offset >= positions[slot] {
                    each(answer.partition_index, record);
                    count += 1;
                }
            }
            positions[slot] = positions[slot].max(batch.header.next_offset());
        }
    }
    Ok(count)
}

/// A consumer tailing the topic while the messages fire: for each record, when it arrived less
/// its delivery time (what a consumer sees of the lateness, fetch and all).
struct Tail {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<anyhow::Result<Vec<i64>>>,
}

impl Tail {
    fn start(addr: SocketAddr, partitions: &[i32], messages: u64) -> anyhow::Result<Tail> {
        let mut client = raw_protocol::connect(addr)?;
        let partitions = partitions.to_vec();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut positions = vec![0i64; partitions.len()];
                let mut seen = Vec::with_capacity(messages as usize);
                while (seen.len() as u64) < messages && !stop.load(Ordering::Relaxed) {
                    let mut arrived = Vec::new();
                    fetch_once(&mut client, TOPIC, &partitions, &mut positions, TAIL_MAX_WAIT_MS, |_, record| {
                        arrived.push(due_ms(record))
                    })?;
                    let now = now_ms();
                    seen.extend(arrived.into_iter().flatten().map(|due| now - due));
                }
                Ok(seen)
            })
        };
        Ok(Tail { stop, thread })
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }

    /// What it saw; it must have seen every message by now (else it is stopped and fails).
    fn finish(self) -> anyhow::Result<Vec<i64>> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().map_err(|_| anyhow!("the tailing consumer panicked"))?.context("the tailing consumer")
    }
}

/// Reads the topic back from the start and checks every record (see [`Checker`]). Returns the
/// (delivery time, lateness) of every message.
fn read_back(addr: SocketAddr, partitions: &[i32], schedule: &Schedule) -> anyhow::Result<Vec<(i64, i64)>> {
    let mut client = raw_protocol::connect(addr)?;
    let ends = raw_protocol::latest_offsets(&mut client, TOPIC, partitions)?;
    let mut positions = vec![0i64; partitions.len()];
    let mut checker = Checker::new(*schedule);
    while positions.iter().zip(&ends).any(|(at, end)| at < end) {
        let before = positions.clone();
        fetch_once(&mut client, TOPIC, partitions, &mut positions, 0, |partition, record| {
            checker.add(partition, record)
        })?;
        if positions == before {
            bail!("a Fetch of {TOPIC} made no progress at offsets {positions:?} (ends {ends:?})");
        }
    }
    checker.finish()
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB)
}

fn print_report(report: &Report) {
    let ms =
        |l: &Lateness| format!("{:>8} {:>8} {:>8} {:>8} {:>8} {:>9.1}", l.p50, l.p99, l.p999, l.max, l.min, l.mean);
    println!(
        "\nlateness of {} messages, ms {:>13} {:>8} {:>8} {:>8} {:>8} {:>9}",
        report.messages, "p50", "p99", "p99.9", "max", "min", "mean"
    );
    println!("{:<40} {}", "fired: record timestamp - delivery time", ms(&report.fire.lateness_ms));
    if let Some(seen) = &report.fire.seen_lateness_ms {
        println!("{:<40} {}", "seen: tailing consumer's Fetch - delivery", ms(seen));
    }
    let slots: Vec<String> = report
        .fire
        .slot_starts_s
        .iter()
        .map(|s| format!("+{s:.1} s (loaded at +{:.1} s)", s - (LOOKAHEAD_MS as f64 / 1e3)))
        .collect();
    println!(
        "latest seconds of the window, by max (a minute slot of the wheel starts in the window at {}):",
        if slots.is_empty() { "none".to_string() } else { slots.join(", ") }
    );
    for s in &report.fire.worst_seconds {
        println!(
            "  due at +{:>3} s: {:>7} messages, p99 {:>6} ms, max {:>6} ms",
            s.at_s, s.messages, s.p99_ms, s.max_ms
        );
    }
    let m = &report.memory;
    let opt = |bytes: Option<u64>| bytes.map_or_else(|| "-".to_string(), mib);
    println!("\nbroker memory (RSS; the timer's gauges pending / in memory from /metrics)");
    let row = |label: &str, p: &Point| {
        let gauges = p.gauges.map_or_else(|| "-".to_string(), |g| format!("{} / {}", g.pending, g.in_memory));
        println!(
            "  {label:<34} {:>10} ({:>+7.1} MiB) at {:>+6.1} s, {gauges}",
            mib(p.rss),
            (p.rss as f64 - m.before.rss as f64) / MIB,
            p.at_s
        );
    };
    row("before scheduling", &m.before);
    row("scheduled, all pending", &m.all_pending);
    row("at the first delivery time", &m.first_due);
    if let Some(most) = &m.most_in_memory {
        row("most in memory (1 s samples)", most);
    }
    row("after all fired", &m.after_fired);
    if let Some(bytes) = m.bytes_per_message_in_memory {
        println!("  {bytes:.0} bytes of RSS per message in memory (at the most in memory, less before)");
    }
    println!(
        "  peak: scheduling {}, firing {}, sampled {}, VmHWM {}",
        opt(m.peak_scheduling),
        opt(m.peak_firing),
        opt(m.peak_sampled),
        opt(m.peak_hwm)
    );
    let disk = |d: &TimerDisk| {
        format!(
            "{} allocated ({} apparent): log {}, wheel {} in {} slot file(s)",
            mib(d.total.allocated_bytes),
            mib(d.total.apparent_bytes),
            mib(d.log.allocated_bytes),
            mib(d.wheel.allocated_bytes),
            d.wheel.files
        )
    };
    println!("\ntimer store on disk (<data>/timer)");
    println!("  before scheduling   {}", disk(&report.disk.before));
    println!("  all pending         {}", disk(&report.disk.all_pending));
    println!("  after all fired     {}", disk(&report.disk.after_fired));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(messages: u64) -> Schedule {
        Schedule {
            messages,
            size: 16,
            start_ms: 1_000_000,
            delay_ms: 20_000,
            window_ms: 40_000,
            batch: 10,
            partitions: 3,
            sorted: false,
        }
    }

    /// Message `index` as the broker fires it: the timer's headers gone, `lateness` ms late.
    fn fired(s: &Schedule, index: u64, offset: i64, lateness: i64) -> Record {
        let mut record = s.record(index, 0);
        record.offset = offset;
        record.timestamp = s.due_ms(index) + lateness;
        record
    }

    #[test]
    fn delivery_times_spread_over_the_window() {
        let s = schedule(100_000);
        let (first, last) = (s.first_due_ms(), s.last_due_ms());
        assert!(first >= s.start_ms + s.delay_ms && first < s.start_ms + s.delay_ms + 100, "{first}");
        assert!(last < s.start_ms + s.delay_ms + s.window_ms && last > s.start_ms + s.delay_ms + s.window_ms - 100);
        // Each tenth of the window gets about a tenth of the messages.
        let mut tenths = [0u64; 10];
        for i in 0..s.messages {
            tenths[((s.due_ms(i) - s.start_ms - s.delay_ms) * 10 / s.window_ms) as usize] += 1;
        }
        assert!(tenths.iter().all(|&n| (9_500..10_500).contains(&n)), "{tenths:?}");
        assert_eq!((s.request(3), s.partition_of(35), s.partition_of(59)), ((30..40, 0), 0, 2));
        assert_eq!(schedule(25).request(2), (20..25, 2));
        let sorted = Schedule { sorted: true, ..schedule(4) };
        let dues: Vec<i64> = (0..4).map(|i| sorted.due_ms(i) - s.start_ms - s.delay_ms).collect();
        assert_eq!(dues, [0, 10_000, 20_000, 30_000]);
    }

    #[test]
    fn the_check_wants_every_message_once_intact_and_not_early() {
        let s = schedule(30);
        let mut checker = Checker::new(s);
        for i in 0..30 {
            checker.add(s.partition_of(i), &fired(&s, i, i as i64, i as i64));
        }
        let lateness = checker.finish().expect("all there");
        assert_eq!(lateness, (0..30).map(|i| (s.due_ms(i), i as i64)).collect::<Vec<_>>());

        let mut checker = Checker::new(s);
        for i in 0..30 {
            checker.add(s.partition_of(i), &fired(&s, i, i as i64, 5));
        }
        checker.add(s.partition_of(4), &fired(&s, 4, 99, 5));
        let mut early = fired(&s, 7, 100, -3);
        early.headers.push(Header::new("weir.timer.topic", Some(Bytes::from_static(b"t"))));
        checker.add(s.partition_of(7), &early);
        let error = format!("{:#}", checker.finish().expect_err("duplicates"));
        assert!(error.contains("2 messages fired more than once (first: message 4, again at offset 99"), "{error}");
        assert!(!error.contains("early"), "a duplicate is not checked further: {error}");

        let mut checker = Checker::new(s);
        for i in 1..30 {
            let mut record = fired(&s, i, i as i64, if i == 2 { -1 } else { 0 });
            if i == 3 {
                record.headers.push(Header::new("weir.timer.topic", Some(Bytes::from_static(b"t"))));
            }
            if i == 5 {
                record.value = Some(Bytes::from_static(b"other"));
            }
            let partition = if i == 6 { s.partition_of(i) + 1 } else { s.partition_of(i) };
            checker.add(partition, &record);
        }
        let error = format!("{:#}", checker.finish().expect_err("problems"));
        for expected in [
            "1 messages fired early",
            "1 messages still carrying a timer header",
            "1 messages with another body",
            "1 messages fired to another partition",
            "1 messages never fired (first: message 0)",
        ] {
            assert!(error.contains(expected), "{expected:?} in {error}");
        }
    }

    #[test]
    fn the_timer_gauges_parse_from_the_metrics_text() {
        let text = "# HELP weir_timer_messages_pending Delayed messages waiting.\n\
                    # TYPE weir_timer_messages_pending gauge\n\
                    weir_timer_messages_pending 1000000\n\
                    weir_timer_messages_pending_other 5\n\
                    weir_timer_messages_in_memory 61234\n";
        assert_eq!(parse_gauges(text), Some(Gauges { pending: 1_000_000, in_memory: 61_234 }));
        assert_eq!(parse_gauges("weir_timer_messages_pending 3\n"), None);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut sample: Vec<i64> = (1..=1000).rev().collect();
        let l = Lateness::of(&mut sample).expect("not empty");
        assert_eq!((l.count, l.min, l.p50, l.p99, l.p999, l.max), (1000, 1, 500, 990, 999, 1000));
        assert!((l.mean - 500.5).abs() < 1e-9);
        assert_eq!(Lateness::of(&mut []), None);
        assert_eq!(Lateness::of(&mut [7]).map(|l| (l.p50, l.p999)), Some((7, 7)));
    }

    #[test]
    fn whole_batches_leave_a_torn_one_out() {
        let s = schedule(4);
        let one = records::encode_batch(&[s.record(0, 0), s.record(1, 0)], &BatchOptions::default()).expect("encodes");
        let two = records::encode_batch(&[s.record(2, 0)], &BatchOptions::default()).expect("encodes");
        let mut bytes = one.to_vec();
        bytes.extend_from_slice(&two);
        assert_eq!(whole_batches(&bytes).len(), bytes.len());
        assert_eq!(whole_batches(&bytes[..bytes.len() - 1]).len(), one.len());
        assert_eq!(whole_batches(&bytes[..5]).len(), 0);
        let decoded = records::decode_records(whole_batches(&bytes)).expect("decodes");
        assert_eq!(
            decoded.iter().map(due_ms).collect::<Vec<_>>(),
            (0..3).map(|i| Some(s.due_ms(i))).collect::<Vec<_>>()
        );
    }

    #[test]
    fn the_worst_seconds_come_first_and_slot_starts_are_listed() {
        let s = schedule(0);
        let at = |second: i64| s.start_ms + second * 1000;
        let sample = [(at(21), 3), (at(21), 4), (at(22), 50), (at(23), 1)];
        let seconds = by_second(&s, &sample);
        assert_eq!(seconds.iter().map(|w| w.at_s).collect::<Vec<_>>(), [21, 22, 23]);
        let worst = worst_seconds(&seconds, 2);
        assert_eq!(
            worst.iter().map(|w| (w.at_s, w.messages, w.max_ms)).collect::<Vec<_>>(),
            vec![(22, 1, 50), (21, 2, 4)]
        );
        // The window 1,020..1,060 s starts on a minute mark (its slot is the first one, no
        // boundary inside); 1,050..1,090 s has the mark 1,080 s, 50 s after the start.
        assert_eq!(slot_starts(&s), Vec::<f64>::new());
        let later = Schedule { start_ms: 1_030_000, ..s };
        assert_eq!(slot_starts(&later), vec![50.0]);
    }
}
