//! `weir bench partitions`: what a cluster's partition count costs. It grows one cluster it
//! starts to each of `--counts` partitions and, at each, reports how fast they were created
//! and what every node spends holding them idle: CPU, RSS, open files and memory maps. With
//! `--baseline BIN` the same run is made first on a cluster of that binary, side by side. See
//! `PARTITIONS_LONG_ABOUT` in `cli.rs`.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use weir_harness::kafka_client::create_topics_request;
use weir_proc::Pid;

use crate::cli::PartitionsBenchArgs;
use crate::metadata::{self, Setup};
use crate::raw_protocol;

/// What one node spends at one partition count, with nothing produced or consumed.
#[derive(Debug, Serialize)]
struct NodeCost {
    node: usize,
    /// Of one core, over the idle window.
    idle_cpu_percent: f64,
    rss_mib: f64,
    open_files: u64,
    memory_maps: u64,
}

/// One step of the growth: from the previous count to `partitions`.
#[derive(Debug, Serialize)]
struct Step {
    partitions: usize,
    /// Partitions created in this step and how long they took (every CreateTopics answered).
    created: usize,
    seconds: f64,
    partitions_per_s: f64,
    /// The rate over the step's last tenth: how fast creation is at this count, not on average
    /// since the previous one.
    last_tenth_partitions_per_s: f64,
    nodes: Vec<NodeCost>,
}

#[derive(Debug, Serialize)]
struct Run {
    binary: String,
    steps: Vec<Step>,
}

pub(crate) fn run(args: &PartitionsBenchArgs) -> anyhow::Result<()> {
    check_args(args)?;
    println!(
        "{} combined nodes, replication factor {}, topics of {} partitions created by {} clients through a node \
         that is not the controller; idle for {} s at each count",
        args.nodes,
        args.replication_factor,
        args.per_topic,
        args.concurrency,
        args.idle.as_secs_f64()
    );
    let mut runs = Vec::new();
    if let Some(baseline) = &args.baseline {
        runs.push(measure(args, Some(baseline))?);
    }
    runs.push(measure(args, None)?);
    print_table(&runs);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&runs)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn check_args(args: &PartitionsBenchArgs) -> anyhow::Result<()> {
    if args.counts.is_empty() || args.counts.windows(2).any(|w| w[0] >= w[1]) {
        bail!("--counts must be partition counts in increasing order, e.g. 3000,15000");
    }
    if args.per_topic == 0 || args.counts.iter().any(|c| c % args.per_topic != 0) {
        bail!("every count of --counts must be a multiple of --per-topic ({})", args.per_topic);
    }
    if args.replication_factor < 1 || args.replication_factor as u64 > args.nodes {
        bail!("--replication-factor must be between 1 and --nodes ({})", args.nodes);
    }
    if args.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    if let Some(baseline) = &args.baseline {
        if !baseline.is_file() {
            bail!("--baseline {}: no such file", baseline.display());
        }
    }
    Ok(())
}

/// Starts a cluster of `exe` (`None`: this binary) and grows it through every count.
fn measure(args: &PartitionsBenchArgs, exe: Option<&Path>) -> anyhow::Result<Run> {
    let binary = match exe {
        Some(exe) => exe.display().to_string(),
        None => std::env::current_exe()?.display().to_string(),
    };
    println!("starting {} nodes of {binary}", args.nodes);
    // Few partitions for the internal topics: they would count among the measured ones.
    let nodes = setup_size(args)?;
    let setup = metadata::start_binary(nodes, 1, &[], exe)?;
    let controller = metadata::controller_id(setup.nodes[0].addr)?;
    let via = usize::try_from(controller).unwrap_or(1) % nodes;
    let mut steps = Vec::new();
    let mut have = 0;
    for &count in &args.counts {
        let topics = (have / args.per_topic)..(count / args.per_topic);
        let (seconds, last_tenth) = create(&setup, via, args, topics)?;
        let created = count - have;
        have = count;
        std::thread::sleep(args.settle);
        let nodes = idle_costs(&setup, args.idle)?;
        let step = Step {
            partitions: count,
            created,
            seconds,
            partitions_per_s: created as f64 / seconds,
            last_tenth_partitions_per_s: last_tenth,
            nodes,
        };
        print_step(&step);
        steps.push(step);
    }
    Ok(Run { binary, steps })
}

/// `--nodes` as a count (clap keeps it within 1..=9).
fn setup_size(args: &PartitionsBenchArgs) -> anyhow::Result<usize> {
    usize::try_from(args.nodes).context("--nodes")
}

/// Creates topics `scale-<i>` for every `i` of `topics` through node `via`, `--concurrency`
/// requests at a time; returns the seconds it took and the rate over the last tenth.
fn create(
    setup: &Setup,
    via: usize,
    args: &PartitionsBenchArgs,
    topics: std::ops::Range<usize>,
) -> anyhow::Result<(f64, f64)> {
    let next = AtomicUsize::new(topics.start);
    let answered: Mutex<Vec<Instant>> = Mutex::new(Vec::with_capacity(topics.len()));
    let started = Instant::now();
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let workers: Vec<_> = (0..args.concurrency)
            .map(|_| {
                scope.spawn(|| -> anyhow::Result<()> {
                    let mut client = raw_protocol::connect(setup.nodes[via].addr)?;
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= topics.end {
                            return Ok(());
                        }
                        let name = format!("scale-{i}");
                        let no_configs: &[(String, String)] = &[];
                        let request =
                            create_topics_request(&name, args.per_topic as i32, args.replication_factor, no_configs);
                        let response = client.send(5, &request).context("CreateTopics")?;
                        let code = response.topics.first().map_or(-1, |t| t.error_code);
                        if code != 0 {
                            let message = response.topics.first().and_then(|t| t.error_message.as_deref());
                            bail!(
                                "creating {name} failed: {} {}",
                                raw_protocol::error_name(code),
                                message.unwrap_or("")
                            );
                        }
                        answered
                            .lock()
                            .map_err(|_| anyhow::anyhow!("a creating thread panicked"))?
                            .push(Instant::now());
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().map_err(|_| anyhow::anyhow!("a creating thread panicked"))??;
        }
        Ok(())
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let answered = answered.into_inner().map_err(|_| anyhow::anyhow!("a creating thread panicked"))?;
    // The last tenth of the answers (at least two), by the time between its first and last.
    let tail = (answered.len() / 10).max(2).min(answered.len());
    let window = &answered[answered.len() - tail..];
    let last_tenth = match (window.first(), window.last()) {
        (Some(first), Some(last)) if last > first => {
            ((tail - 1) * args.per_topic) as f64 / last.duration_since(*first).as_secs_f64()
        }
        _ => 0.0,
    };
    Ok((seconds, last_tenth))
}

/// Every node's CPU over `window` with nothing to do, and what it holds at the end of it.
fn idle_costs(setup: &Setup, window: Duration) -> anyhow::Result<Vec<NodeCost>> {
    let pids: Vec<Pid> = setup.nodes.iter().map(|n| Pid::Of(n.pid())).collect();
    let cpu = |pid: Pid| weir_proc::cpu_seconds(pid).context("cannot read a node's CPU time from /proc");
    let before: Vec<f64> = pids.iter().map(|p| cpu(*p)).collect::<anyhow::Result<_>>()?;
    let started = Instant::now();
    std::thread::sleep(window);
    let elapsed = started.elapsed().as_secs_f64();
    pids.iter()
        .zip(before)
        .enumerate()
        .map(|(node, (pid, before))| {
            Ok(NodeCost {
                node: node + 1,
                idle_cpu_percent: (cpu(*pid)? - before) / elapsed * 100.0,
                rss_mib: weir_proc::memory(*pid).and_then(|m| m.resident_bytes).unwrap_or(0) as f64 / (1024.0 * 1024.0),
                open_files: weir_proc::open_fds(*pid).unwrap_or(0),
                memory_maps: weir_proc::memory_maps(*pid).unwrap_or(0),
            })
        })
        .collect()
}

/// The smallest and largest of `values`, as `a–b` (or `a` when they are equal).
fn range(values: impl Iterator<Item = f64>, decimals: usize) -> String {
    let (low, high) = values.fold((f64::MAX, f64::MIN), |(l, h), v| (l.min(v), h.max(v)));
    if (high - low).abs() < 10f64.powi(-(decimals as i32)) {
        format!("{low:.decimals$}")
    } else {
        format!("{low:.decimals$}–{high:.decimals$}")
    }
}

fn print_step(step: &Step) {
    println!(
        "  {:>7} partitions: {:>6} created in {:>6.1} s = {:>6.0}/s (last tenth {:>6.0}/s); per node idle CPU {}%, \
         RSS {} MiB, open files {}, memory maps {}",
        step.partitions,
        step.created,
        step.seconds,
        step.partitions_per_s,
        step.last_tenth_partitions_per_s,
        range(step.nodes.iter().map(|n| n.idle_cpu_percent), 1),
        range(step.nodes.iter().map(|n| n.rss_mib), 0),
        range(step.nodes.iter().map(|n| n.open_files as f64), 0),
        range(step.nodes.iter().map(|n| n.memory_maps as f64), 0),
    );
}

fn print_table(runs: &[Run]) {
    println!();
    println!("| binary | partitions | created in | partitions/s | last tenth /s | idle CPU per node | RSS per node | open files per node | memory maps per node |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for run in runs {
        for step in &run.steps {
            println!(
                "| {} | {} | {:.1} s | {:.0} | {:.0} | {}% | {} MiB | {} | {} |",
                run.binary,
                step.partitions,
                step.seconds,
                step.partitions_per_s,
                step.last_tenth_partitions_per_s,
                range(step.nodes.iter().map(|n| n.idle_cpu_percent), 1),
                range(step.nodes.iter().map(|n| n.rss_mib), 0),
                range(step.nodes.iter().map(|n| n.open_files as f64), 0),
                range(step.nodes.iter().map(|n| n.memory_maps as f64), 0),
            );
        }
    }
}
