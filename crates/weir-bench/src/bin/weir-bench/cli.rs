//! The command line of `weir-bench`, and [`Plan`]: the arguments with every default resolved
//! (the `--quick` preset included) and checked against each other.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use clap::{Parser, ValueEnum};
// One parser of byte counts for every benchmark command line: `weir bench ...` and this binary.
use weir_bench::cli::parse_size;

/// The shortest message: the send timestamp and a sequence number (see `kafka::Payload`).
pub const HEADER_BYTES: u64 = 16;

#[derive(Debug, Parser)]
#[command(
    name = "weir-bench",
    version,
    about = "An OpenMessaging-style benchmark of Kafka-compatible brokers (Weir and others, side by side).",
    long_about = LONG_ABOUT
)]
pub struct Args {
    /// A broker to measure: HOST:PORT, or NAME=HOST:PORT to label it in the results. Repeatable:
    /// every workload runs against every target in turn, case by case, so that the figures of the
    /// targets come from the same minutes of the machine.
    #[arg(long = "bootstrap", value_name = "[NAME=]HOST:PORT", value_parser = parse_target, required = true)]
    pub targets: Vec<Target>,

    /// Workload to run: max-throughput, latency, many-partitions, catch-up, or all. Repeatable.
    #[arg(long = "workload", value_name = "NAME", value_enum, default_value = "all")]
    pub workloads: Vec<WorkloadArg>,

    /// Tiny volumes and short runs: every workload in a few seconds. Checks that everything works
    /// (CI); the figures mean little. Explicit flags still override it.
    #[arg(long)]
    pub quick: bool,

    /// Measured time of each run, in seconds, after the warm-up. [default: 30, or 2 with --quick]
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    pub duration: Option<Duration>,

    /// Warm-up at the start of each run, in seconds: the load runs but is left out of the summary
    /// (the chart shows it shaded). [default: 5, 0 with --quick or --messages]
    #[arg(long, value_name = "SECS", value_parser = parse_seconds_or_zero)]
    pub warmup: Option<Duration>,

    /// Stop each run after this many messages (all producers together), or at the end of
    /// --duration, whichever comes first. Without --duration, only this limit applies.
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub messages: Option<u64>,

    /// Bytes of each message value (at least 16: the send timestamp and a sequence number).
    /// Digits with an optional K, M or G suffix (powers of 1024). [default: 1K]
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub size: Option<u64>,

    /// Partitions of the topic of max-throughput, latency and catch-up. [default: 6]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub partitions: Option<u32>,

    /// Partitions of the many-partitions topic. [default: 1000, or 100 with --quick: creating
    /// and deleting 1,000 partitions takes a debug build of Weir about 20 seconds]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub many_partitions: Option<u32>,

    /// Producer counts of max-throughput, comma-separated; each one is a run. The first one is
    /// also used by many-partitions and catch-up. [default: 1,4]
    #[arg(long, value_name = "N,...", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=64))]
    pub producers: Vec<u32>,

    /// Producer acks of max-throughput, comma-separated (1 or all); each one is a run. The first
    /// one is also used by many-partitions and catch-up. The latency workload uses all.
    /// [default: 1,all]
    #[arg(long, value_name = "ACKS,...", value_delimiter = ',', value_enum)]
    pub acks: Vec<Acks>,

    /// Target rate of the latency workload, messages per second (all producers together).
    #[arg(long, value_name = "MSG/S", value_parser = parse_count, default_value = "20000")]
    pub rate: u64,

    /// How messages are spread over the partitions: client (no key, no partition: librdkafka's
    /// sticky partitioner fills one partition's batch at a time, as with OpenMessaging's NO_KEY)
    /// or round-robin (each message to the next partition: with many partitions every batch
    /// holds a message or two, the costliest case for clients and broker alike).
    #[arg(long, value_enum, default_value = "client")]
    pub partitioner: Partitioner,

    /// Bytes the catch-up workload writes before its consumer starts. [default: 2G, or 16M with
    /// --quick]
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub backlog: Option<u64>,

    /// A broker's process id, to report its CPU % and peak RSS (from /proc): NAME=PID names a
    /// target of --bootstrap; a bare PID is the only target. Repeatable.
    #[arg(long = "broker-pid", value_name = "[NAME=]PID", value_parser = parse_broker_pid)]
    pub broker_pids: Vec<(Option<String>, u32)>,

    /// Replication factor of the benchmark's topics; -1 takes the broker's default.
    #[arg(long, value_name = "N", default_value_t = -1, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-1..=16))]
    pub replication_factor: i32,

    /// Extra librdkafka property for every producer and consumer, e.g. --client-config
    /// linger.ms=20. Repeatable; applied after the benchmark's own settings.
    #[arg(long = "client-config", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub client_config: Vec<(String, String)>,

    /// Write every figure, including the 1-second series, as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Draw throughput and latency over time (1-second buckets) as an SVG chart in FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,

    /// Directory of the machine reference's sequential write (created if missing; the file is
    /// removed afterwards). Put it on the broker's disk. [default: ./bench-data, or the system
    /// temp dir if that cannot be created]
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Skip the machine reference (sequential write and loopback TCP bandwidth).
    #[arg(long)]
    pub no_reference: bool,

    /// Keep the benchmark's topics instead of deleting each after its run.
    #[arg(long)]
    pub keep_topics: bool,

    /// No progress bars (they are hidden anyway when stderr is not a terminal).
    #[arg(long)]
    pub no_progress: bool,
}

const LONG_ABOUT: &str = "\
An OpenMessaging-style benchmark of Kafka-compatible brokers. The load comes from librdkafka
(through the rdkafka crate), so Weir and any other broker are measured with the same client, and
several --bootstrap targets run side by side in one run, case by case.

Workloads (--workload, repeatable, or all):
  max-throughput   one topic of 6 partitions, 1 KiB messages, as fast as the producers go, with
                   1 and 4 producers x acks=1 and acks=all (4 runs), one consumer reading
                   concurrently.
  latency          one producer at a fixed --rate (20,000 msg/s) with acks=all; the end-to-end
                   latency from the intended send time (in the message) to the consumer's receipt,
                   so a producer or broker that falls behind shows up in the figures.
  many-partitions  like max-throughput (first --producers and --acks) on 1,000 partitions.
  catch-up         writes a --backlog (2 GiB) first, then one consumer drains it from the start.
Messages carry no key and no partition, so librdkafka's sticky partitioner spreads them (as with
OpenMessaging's NO_KEY); --partitioner round-robin sends each to the next partition instead.
Each run creates its own topic and deletes it after.

Before the workloads it measures the machine: sequential write bandwidth of --data-dir (1 GiB in
1 MiB chunks, then fdatasync) and loopback TCP bandwidth (one sender, one receiver, 3 seconds),
so that the results can be read as a fraction of what the machine can do.

Output: a progress bar per run, then a summary table (MB/s and msg/s produced and consumed,
latency percentiles, broker CPU % and peak RSS with --broker-pid), --json and --svg.
MB = 10^6 bytes of message values; KiB, MiB, GiB are powers of 1024.
The exit status is 1 when a run lost messages, had delivery errors or stalled (the results are
still printed and written), 2 when the command line is wrong or a broker cannot be reached.";

/// A broker to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The label in the results: NAME, or the address when none was given.
    pub name: String,
    /// librdkafka's bootstrap.servers (host:port, or several separated by commas).
    pub bootstrap: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum WorkloadArg {
    MaxThroughput,
    Latency,
    ManyPartitions,
    CatchUp,
    All,
}

/// A workload, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    MaxThroughput,
    Latency,
    ManyPartitions,
    CatchUp,
}

impl Workload {
    pub const ALL: [Workload; 4] =
        [Workload::MaxThroughput, Workload::Latency, Workload::ManyPartitions, Workload::CatchUp];

    pub fn name(self) -> &'static str {
        match self {
            Workload::MaxThroughput => "max-throughput",
            Workload::Latency => "latency",
            Workload::ManyPartitions => "many-partitions",
            Workload::CatchUp => "catch-up",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
pub enum Acks {
    #[value(name = "1")]
    #[serde(rename = "1")]
    One,
    #[value(name = "all", alias = "-1")]
    #[serde(rename = "all")]
    All,
}

impl Acks {
    /// librdkafka's value of `acks`.
    pub fn config_value(self) -> &'static str {
        match self {
            Acks::One => "1",
            Acks::All => "all",
        }
    }
}

/// How the producers spread messages over the partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Partitioner {
    /// The message names no partition and has no key: the client's partitioner decides.
    Client,
    /// Message i of producer k goes to partition (i + k) mod partitions.
    RoundRobin,
}

/// The arguments with every default resolved: what the run will do.
#[derive(Debug, Clone)]
pub struct Plan {
    pub targets: Vec<Target>,
    pub workloads: Vec<Workload>,
    pub quick: bool,
    /// None: runs are bounded by `messages` only.
    pub duration: Option<Duration>,
    pub warmup: Duration,
    pub messages: Option<u64>,
    pub message_bytes: u64,
    pub partitions: u32,
    pub many_partitions: u32,
    pub producers: Vec<u32>,
    pub acks: Vec<Acks>,
    pub rate: u64,
    pub partitioner: Partitioner,
    pub backlog_bytes: u64,
    /// Most KiB waiting in each producer (queue.buffering.max.kbytes).
    pub producer_buffer_kib: u32,
    /// One entry per target, in the order of `targets`.
    pub broker_pids: Vec<Option<u32>>,
    pub replication_factor: i32,
    pub client_config: Vec<(String, String)>,
    pub json: Option<PathBuf>,
    pub svg: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    /// Bytes of the sequential-write reference; 0 skips the reference.
    pub reference_disk_bytes: u64,
    pub reference_loopback: Duration,
    pub keep_topics: bool,
    pub progress: bool,
    /// A consumer that receives nothing for this long while messages are due gives up.
    pub stall_timeout: Duration,
}

impl Plan {
    pub fn from_args(args: &Args) -> anyhow::Result<Plan> {
        let quick = args.quick;
        let mut names = BTreeSet::new();
        for target in &args.targets {
            if !names.insert(target.name.as_str()) {
                bail!("two --bootstrap targets are named {:?}: give each its own NAME=", target.name);
            }
        }
        let workloads: Vec<Workload> = if args.workloads.contains(&WorkloadArg::All) {
            Workload::ALL.to_vec()
        } else {
            let chosen: BTreeSet<Workload> = args
                .workloads
                .iter()
                .map(|w| match w {
                    WorkloadArg::MaxThroughput => Workload::MaxThroughput,
                    WorkloadArg::Latency => Workload::Latency,
                    WorkloadArg::ManyPartitions => Workload::ManyPartitions,
                    WorkloadArg::CatchUp | WorkloadArg::All => Workload::CatchUp,
                })
                .collect();
            chosen.into_iter().collect()
        };
        let duration = match (args.duration, args.messages) {
            (Some(d), _) => Some(d),
            (None, Some(_)) => None,
            (None, None) => Some(Duration::from_secs(if quick { 2 } else { 30 })),
        };
        let warmup = args.warmup.unwrap_or(if quick || args.messages.is_some() {
            Duration::ZERO
        } else {
            Duration::from_secs(5)
        });
        let message_bytes = args.size.unwrap_or(1024);
        if message_bytes < HEADER_BYTES {
            bail!("--size must be at least {HEADER_BYTES} bytes (the send timestamp and a sequence number)");
        }
        if message_bytes > 16 << 20 {
            bail!("--size must be at most 16M");
        }
        let backlog_bytes = args.backlog.unwrap_or(if quick { 16 << 20 } else { 2 << 30 });
        let mut broker_pids = vec![None; args.targets.len()];
        for (name, pid) in &args.broker_pids {
            let index = match name {
                Some(name) => args.targets.iter().position(|t| &t.name == name).ok_or_else(|| {
                    anyhow::anyhow!("--broker-pid {name}={pid}: no --bootstrap target is named {name:?}")
                })?,
                None if args.targets.len() == 1 => 0,
                None => bail!("--broker-pid {pid}: with several targets, say which one: --broker-pid NAME={pid}"),
            };
            if broker_pids[index].replace(*pid).is_some() {
                bail!("two --broker-pid values for target {:?}", args.targets[index].name);
            }
        }
        let producers = if args.producers.is_empty() { vec![1, 4] } else { args.producers.clone() };
        let acks = if args.acks.is_empty() { vec![Acks::One, Acks::All] } else { args.acks.clone() };
        Ok(Plan {
            targets: args.targets.clone(),
            workloads,
            quick,
            duration,
            warmup,
            messages: args.messages,
            message_bytes,
            partitions: args.partitions.unwrap_or(6),
            many_partitions: args.many_partitions.unwrap_or(if quick { 100 } else { 1000 }),
            producers,
            acks,
            rate: args.rate,
            partitioner: args.partitioner,
            backlog_bytes,
            // 32 MiB, the Java client's default buffer.memory; 4 MiB with --quick, so that a
            // run ends soon after its 2 seconds even against a slow (debug) broker.
            producer_buffer_kib: if quick { 4 << 10 } else { 32 << 10 },
            broker_pids,
            replication_factor: args.replication_factor,
            client_config: args.client_config.clone(),
            json: args.json.clone(),
            svg: args.svg.clone(),
            data_dir: args.data_dir.clone(),
            reference_disk_bytes: if args.no_reference {
                0
            } else if quick {
                64 << 20
            } else {
                1 << 30
            },
            reference_loopback: Duration::from_secs(if quick { 1 } else { 3 }),
            keep_topics: args.keep_topics,
            progress: !args.no_progress,
            stall_timeout: Duration::from_secs(if quick { 15 } else { 30 }),
        })
    }
}

fn parse_target(text: &str) -> Result<Target, String> {
    let text = text.trim();
    let (name, bootstrap) = match text.split_once('=') {
        Some((name, address)) => (name.trim().to_string(), address.trim().to_string()),
        None => (text.to_string(), text.to_string()),
    };
    if name.is_empty() || name.contains(',') {
        return Err(format!("expected [NAME=]HOST:PORT, got {text:?}"));
    }
    for server in bootstrap.split(',') {
        let Some((host, port)) = server.trim().rsplit_once(':') else {
            return Err(format!("{server:?} is not HOST:PORT"));
        };
        if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!("{server:?} is not HOST:PORT with a port in 1..=65535"));
        }
    }
    Ok(Target { name, bootstrap })
}

fn parse_broker_pid(text: &str) -> Result<(Option<String>, u32), String> {
    let (name, pid) = match text.split_once('=') {
        Some((name, pid)) => (Some(name.trim().to_string()), pid),
        None => (None, text),
    };
    let pid: u32 = pid.trim().parse().map_err(|_| format!("{text:?}: expected [NAME=]PID"))?;
    if pid == 0 {
        return Err("a process id must be positive".into());
    }
    Ok((name, pid))
}

fn parse_key_value(text: &str) -> Result<(String, String), String> {
    let (key, value) = text.split_once('=').ok_or_else(|| format!("expected KEY=VALUE, got {text:?}"))?;
    let key = key.trim();
    if key.is_empty() {
        return Err(format!("expected KEY=VALUE, got {text:?}"));
    }
    Ok((key.to_string(), value.trim().to_string()))
}

/// A positive count, with optional `_` or `,` separators (20_000, 20,000) or a k/m suffix
/// (powers of 1000: 20k, 1m).
pub fn parse_count(text: &str) -> Result<u64, String> {
    let cleaned: String = text.trim().chars().filter(|c| *c != '_' && *c != ',').collect();
    let lower = cleaned.to_ascii_lowercase();
    let (digits, multiplier) = if let Some(d) = lower.strip_suffix('k') {
        (d, 1_000)
    } else if let Some(d) = lower.strip_suffix('m') {
        (d, 1_000_000)
    } else {
        (lower.as_str(), 1)
    };
    let number: u64 = digits.parse().map_err(|_| format!("{text:?} is not a count such as 20000 or 20k"))?;
    let count = number.checked_mul(multiplier).ok_or_else(|| format!("{text:?} is too large"))?;
    if count == 0 {
        return Err("the count must be positive".into());
    }
    Ok(count)
}

fn parse_seconds(text: &str) -> Result<Duration, String> {
    let duration = parse_seconds_or_zero(text)?;
    if duration.is_zero() {
        return Err("expected a positive number of seconds".into());
    }
    Ok(duration)
}

fn parse_seconds_or_zero(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let number = text.strip_suffix('s').unwrap_or(text);
    let seconds: f64 = number.parse().map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(0.0..=86_400.0).contains(&seconds) {
        return Err("expected a number of seconds in [0, 86400]".into());
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn plan(args: &[&str]) -> anyhow::Result<Plan> {
        let args = Args::try_parse_from(std::iter::once("weir-bench").chain(args.iter().copied()))?;
        Plan::from_args(&args)
    }

    #[test]
    fn cli_is_well_formed() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults_are_the_full_suite() {
        let plan = plan(&["--bootstrap", "127.0.0.1:9092"]).unwrap();
        assert_eq!(plan.targets, vec![Target { name: "127.0.0.1:9092".into(), bootstrap: "127.0.0.1:9092".into() }]);
        assert_eq!(plan.workloads, Workload::ALL.to_vec());
        assert_eq!(plan.duration, Some(Duration::from_secs(30)));
        assert_eq!(plan.warmup, Duration::from_secs(5));
        assert_eq!(plan.message_bytes, 1024);
        assert_eq!((plan.partitions, plan.many_partitions), (6, 1000));
        assert_eq!(plan.producers, vec![1, 4]);
        assert_eq!(plan.acks, vec![Acks::One, Acks::All]);
        assert_eq!(plan.rate, 20_000);
        assert_eq!(plan.partitioner, Partitioner::Client);
        assert_eq!(plan.backlog_bytes, 2 << 30);
        assert_eq!(plan.reference_disk_bytes, 1 << 30);
        assert_eq!(plan.replication_factor, -1);
    }

    #[test]
    fn quick_shrinks_everything_but_explicit_flags_win() {
        let plan = plan(&["--bootstrap", "h:1", "--quick", "--backlog", "4M"]).unwrap();
        assert_eq!(plan.duration, Some(Duration::from_secs(2)));
        assert_eq!(plan.warmup, Duration::ZERO);
        assert_eq!(plan.backlog_bytes, 4 << 20);
        assert_eq!(plan.reference_disk_bytes, 64 << 20);
        assert_eq!(plan.many_partitions, 100);
        assert_eq!(plan.producer_buffer_kib, 4 << 10);
    }

    #[test]
    fn every_flag_parses() {
        let plan = plan(&[
            "--bootstrap",
            "weir=127.0.0.1:9092",
            "--bootstrap",
            "kafka=localhost:9093,localhost:9094",
            "--workload",
            "latency",
            "--workload",
            "catch-up",
            "--workload",
            "latency",
            "--duration",
            "1.5",
            "--warmup",
            "0",
            "--messages",
            "100k",
            "--size",
            "2K",
            "--partitions",
            "3",
            "--many-partitions",
            "50",
            "--producers",
            "2,8",
            "--acks",
            "all",
            "--rate",
            "5,000",
            "--partitioner",
            "round-robin",
            "--backlog",
            "1G",
            "--broker-pid",
            "kafka=42",
            "--broker-pid",
            "weir=7",
            "--replication-factor",
            "3",
            "--client-config",
            "linger.ms = 20",
            "--json",
            "out.json",
            "--svg",
            "out.svg",
            "--data-dir",
            "/tmp/d",
            "--keep-topics",
            "--no-progress",
            "--no-reference",
        ])
        .unwrap();
        assert_eq!(plan.targets[1], Target { name: "kafka".into(), bootstrap: "localhost:9093,localhost:9094".into() });
        assert_eq!(plan.workloads, vec![Workload::Latency, Workload::CatchUp]);
        assert_eq!(plan.duration, Some(Duration::from_millis(1500)));
        assert_eq!(plan.warmup, Duration::ZERO);
        assert_eq!(plan.messages, Some(100_000));
        assert_eq!(plan.message_bytes, 2048);
        assert_eq!((plan.partitions, plan.many_partitions), (3, 50));
        assert_eq!(plan.producers, vec![2, 8]);
        assert_eq!(plan.acks, vec![Acks::All]);
        assert_eq!(plan.rate, 5000);
        assert_eq!(plan.partitioner, Partitioner::RoundRobin);
        assert_eq!(plan.backlog_bytes, 1 << 30);
        assert_eq!(plan.broker_pids, vec![Some(7), Some(42)]);
        assert_eq!(plan.replication_factor, 3);
        assert_eq!(plan.client_config, vec![("linger.ms".into(), "20".into())]);
        assert_eq!(plan.json, Some(PathBuf::from("out.json")));
        assert_eq!(plan.reference_disk_bytes, 0);
        assert!(plan.keep_topics && !plan.progress);
    }

    #[test]
    fn messages_alone_bound_the_runs() {
        let plan = plan(&["--bootstrap", "h:1", "--messages", "1000"]).unwrap();
        assert_eq!(plan.duration, None);
        assert_eq!(plan.warmup, Duration::ZERO);
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        for bad in [
            vec!["--workload", "all"],                                                 // no --bootstrap
            vec!["--bootstrap", "nohostport"],                                         // no port
            vec!["--bootstrap", "h:0"],                                                // port 0
            vec!["--bootstrap", "h:99999"],                                            // port out of range
            vec!["--bootstrap", "=h:1"],                                               // empty name
            vec!["--bootstrap", "h:1", "--workload", "fastest"],                       // unknown workload
            vec!["--bootstrap", "h:1", "--size", "8"],                                 // below the header
            vec!["--bootstrap", "h:1", "--size", "1T"],                                // unknown suffix
            vec!["--bootstrap", "h:1", "--duration", "0"],                             // zero duration
            vec!["--bootstrap", "h:1", "--duration", "-3"],                            // negative
            vec!["--bootstrap", "h:1", "--rate", "0"],                                 // zero rate
            vec!["--bootstrap", "h:1", "--acks", "0"], // acks=0 has no acknowledgement to time
            vec!["--bootstrap", "h:1", "--producers", "0"], // no producer
            vec!["--bootstrap", "h:1", "--partitions", "0"], // no partition
            vec!["--bootstrap", "h:1", "--broker-pid", "x=1"], // unknown target name
            vec!["--bootstrap", "h:1", "--broker-pid", "abc"], // not a pid
            vec!["--bootstrap", "a=h:1", "--bootstrap", "a=h:2"], // duplicate names
            vec!["--bootstrap", "a=h:1", "--bootstrap", "b=h:2", "--broker-pid", "5"], // which one?
            vec!["--bootstrap", "h:1", "--client-config", "novalue"],
        ] {
            assert!(plan(&bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn counts_parse_with_separators_and_suffixes() {
        assert_eq!(parse_count("20000"), Ok(20_000));
        assert_eq!(parse_count("20_000"), Ok(20_000));
        assert_eq!(parse_count("20k"), Ok(20_000));
        assert_eq!(parse_count("2M"), Ok(2_000_000));
        assert!(parse_count("0").is_err());
        assert!(parse_count("many").is_err());
        assert!(parse_count("99999999999999999999k").is_err());
    }
}
