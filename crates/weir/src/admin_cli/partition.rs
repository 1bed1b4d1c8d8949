//! `weir partition reassign|reassignments|throttle`: what `kafka-reassign-partitions.sh` does,
//! through the admin API; `weir partition elect` (`kafka-leader-election.sh`) and `weir
//! partition trim` (`kafka-delete-records.sh`). A plan is Kafka's reassignment JSON, so plans written for Kafka's
//! tool work unchanged:
//!
//! ```json
//! {"version":1,"partitions":[{"topic":"orders","partition":0,"replicas":[2,3,4]}]}
//! ```

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand};
use weir_admin::api::{
    DeleteRecords, DeletedRecords, ElectLeaders, ElectionResults, GeneratePlan, GeneratedPlan, PartitionSelector,
    ReassignmentPlan, ReassignmentResults, Reassignments, ReplicationThrottle, TopicDescription,
};

use super::{print_json, segment, AdminClient, Connection, Table};

#[derive(Debug, Args)]
pub struct PartitionArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    pub command: PartitionCommand,
}

#[derive(Debug, Subcommand)]
pub enum PartitionCommand {
    /// Start the moves of a plan (Kafka's reassignment JSON), cancel them (--cancel), or print
    /// a plan (--generate). New replicas copy the data, join the ISR, then the old ones are
    /// dropped.
    Reassign(ReassignArgs),
    /// The reassignments in progress: replicas, and those being added and removed.
    Reassignments,
    /// Set (--rate) or remove (--clear) the cluster-wide replication throttle.
    Throttle(ThrottleArgs),
    /// Elect leaders: preferred (back to each partition's first replica) or --unclean (a leader
    /// for leaderless partitions, out of the ISR if need be: records may be lost).
    Elect(ElectArgs),
    /// Delete the records before an offset or a time (Kafka's DeleteRecords): the log start
    /// offset moves up, and whole segments below it are removed.
    Trim(TrimArgs),
}

#[derive(Debug, Args)]
pub struct ElectArgs {
    /// Unclean election: only partitions without a leader, from any live replica.
    #[arg(long)]
    pub unclean: bool,
    /// Only this topic. [default: every partition of every topic]
    #[arg(long)]
    pub topic: Option<String>,
    /// Only this partition of --topic.
    #[arg(long, requires = "topic")]
    pub partition: Option<i32>,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("point").required(true).args(["offset", "before"])))]
pub struct TrimArgs {
    #[arg(long)]
    pub topic: String,
    /// Only this partition. [default: every partition]
    #[arg(long)]
    pub partition: Option<i32>,
    /// Delete the records before this offset (-1: everything below the high watermark).
    #[arg(long, allow_negative_numbers = true)]
    pub offset: Option<i64>,
    /// Delete the records before the first one stamped at or after this time:
    /// 2026-12-01T00:00:00Z, -1h, -30m, or ms since the epoch.
    #[arg(long, value_name = "TIME", value_parser = super::time::parse_time_arg, allow_hyphen_values = true)]
    pub before: Option<i64>,
}

#[derive(Debug, Args)]
pub struct ReassignArgs {
    /// The plan: `{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[2,3]}]}`.
    #[arg(long, value_name = "FILE", required_unless_present = "generate", conflicts_with = "generate")]
    pub plan: Option<PathBuf>,
    /// Print a plan instead of executing one (current and proposed replicas, as
    /// kafka-reassign-partitions.sh --generate): with --remove-brokers or --balance.
    #[arg(long)]
    pub generate: bool,
    /// With --generate: move every replica off these brokers (comma-separated ids).
    #[arg(long, value_name = "IDS", value_delimiter = ',', requires = "generate", conflicts_with = "balance")]
    pub remove_brokers: Vec<i32>,
    /// With --generate: spread replicas and preferred leaders evenly over the live brokers.
    #[arg(long, requires = "generate")]
    pub balance: bool,
    /// With --generate: move only these topics' partitions (comma-separated).
    #[arg(long, value_name = "TOPICS", value_delimiter = ',', requires = "generate")]
    pub topics: Vec<String>,
    /// With --generate: also write the proposed plan to this file (for --plan).
    #[arg(long, value_name = "FILE", requires = "generate")]
    pub output: Option<PathBuf>,
    /// Cancel the plan's partitions' reassignments: they go back to their original replicas.
    #[arg(long)]
    pub cancel: bool,
    /// Bytes per second the copying may take, cluster-wide (leaders sending and followers
    /// fetching); stays set until `weir partition throttle --clear`.
    #[arg(long, value_name = "BYTES_PER_SEC")]
    pub throttle: Option<u64>,
    /// Refuse moves that change a partition's number of replicas.
    #[arg(long)]
    pub keep_replication_factor: bool,
    /// Wait until every move of the plan has completed.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up (exit 1) after this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub timeout: u64,
}

#[derive(Debug, Args)]
pub struct ThrottleArgs {
    /// Bytes per second.
    #[arg(long, conflicts_with = "clear", required_unless_present = "clear")]
    pub rate: Option<u64>,
    /// No limit.
    #[arg(long)]
    pub clear: bool,
}

pub fn run(args: &PartitionArgs) -> anyhow::Result<()> {
    let client = AdminClient::new(&args.connection)?;
    let mut out = std::io::stdout().lock();
    let json = args.connection.json;
    match &args.command {
        PartitionCommand::Reassign(reassign) if reassign.generate => generate(&client, &mut out, reassign, json)?,
        PartitionCommand::Reassign(reassign) => {
            let Some(path) = &reassign.plan else { anyhow::bail!("give --plan FILE, or --generate") };
            let text =
                std::fs::read_to_string(path).with_context(|| format!("cannot read the plan {}", path.display()))?;
            let mut plan: ReassignmentPlan =
                serde_json::from_str(&text).with_context(|| format!("{} is no reassignment plan", path.display()))?;
            if reassign.cancel {
                plan.partitions.iter_mut().for_each(|p| p.replicas = None);
            }
            plan.allow_replication_factor_change = !reassign.keep_replication_factor;
            if let Some(rate) = reassign.throttle {
                let _: ReplicationThrottle =
                    client.put("/v1/replication-throttle", &ReplicationThrottle { bytes_per_second: Some(rate) })?;
            }
            let answer: ReassignmentResults = client.post("/v1/reassignments", &plan)?;
            let failed = answer.results.iter().filter(|r| r.error.is_some()).count();
            if json {
                print_json(&mut out, &answer)?;
            } else {
                let mut table = Table::new(&["TOPIC", "PARTITION", "RESULT"]);
                for r in &answer.results {
                    let result = match &r.error {
                        None if reassign.cancel => "cancelled".to_string(),
                        None => "started".to_string(),
                        Some(e) => format!("{}: {}", e.code, e.message),
                    };
                    table.row(vec![r.topic.clone(), r.partition.to_string(), result]);
                }
                table.write(&mut out)?;
            }
            if failed > 0 {
                anyhow::bail!("{failed} of {} partitions were not reassigned", answer.results.len());
            }
            if reassign.wait {
                out.flush()?;
                wait_for(&client, &plan, Duration::from_secs(reassign.timeout))?;
                if !json {
                    writeln!(out, "every reassignment of the plan has completed")?;
                }
            }
        }
        PartitionCommand::Reassignments => {
            let ongoing: Reassignments = client.get("/v1/reassignments", &[])?;
            if json {
                return print_json(&mut out, &ongoing);
            }
            let mut table = Table::new(&["TOPIC", "PARTITION", "REPLICAS", "ADDING", "REMOVING"]);
            let list = |ids: &[i32]| ids.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",");
            for r in &ongoing.reassignments {
                table.row(vec![
                    r.topic.clone(),
                    r.partition.to_string(),
                    list(&r.replicas),
                    list(&r.adding),
                    list(&r.removing),
                ]);
            }
            table.write(&mut out)?;
        }
        PartitionCommand::Throttle(throttle) => {
            let wanted = ReplicationThrottle { bytes_per_second: if throttle.clear { None } else { throttle.rate } };
            let set: ReplicationThrottle = client.put("/v1/replication-throttle", &wanted)?;
            if json {
                return print_json(&mut out, &set);
            }
            match set.bytes_per_second {
                Some(rate) => writeln!(out, "replication throttle: {rate} bytes per second")?,
                None => writeln!(out, "replication throttle: none")?,
            }
        }
        PartitionCommand::Elect(elect) => run_elect(&client, &mut out, elect, json)?,
        PartitionCommand::Trim(trim) => run_trim(&client, &mut out, trim, json)?,
    }
    Ok(())
}

/// `--generate`: prints what kafka-reassign-partitions.sh prints, the current assignment (to
/// go back) and the proposed one (to execute with --plan).
fn generate(client: &AdminClient, out: &mut impl Write, args: &ReassignArgs, json: bool) -> anyhow::Result<()> {
    if args.remove_brokers.is_empty() && !args.balance {
        anyhow::bail!("--generate needs --remove-brokers IDS or --balance");
    }
    let request = GeneratePlan {
        remove_brokers: args.remove_brokers.clone(),
        balance: args.balance,
        topics: (!args.topics.is_empty()).then(|| args.topics.clone()),
    };
    let plan: GeneratedPlan = client.post("/v1/reassignments/generate", &request)?;
    if let Some(path) = &args.output {
        std::fs::write(path, serde_json::to_string(&plan.proposed)? + "\n")
            .with_context(|| format!("cannot write the plan to {}", path.display()))?;
    }
    if json {
        return print_json(out, &plan);
    }
    if plan.proposed.partitions.is_empty() {
        writeln!(out, "nothing to move")?;
        return Ok(());
    }
    writeln!(out, "Current partition replica assignment")?;
    writeln!(out, "{}", serde_json::to_string(&plan.current)?)?;
    writeln!(out)?;
    writeln!(out, "Proposed partition reassignment configuration")?;
    writeln!(out, "{}", serde_json::to_string(&plan.proposed)?)?;
    Ok(())
}

fn run_elect(client: &AdminClient, out: &mut impl Write, args: &ElectArgs, json: bool) -> anyhow::Result<()> {
    let request = ElectLeaders {
        election: if args.unclean { "unclean" } else { "preferred" }.to_string(),
        partitions: args
            .topic
            .as_ref()
            .map(|topic| vec![PartitionSelector { topic: topic.clone(), partition: args.partition }]),
    };
    let answer: ElectionResults = client.post("/v1/elections", &request)?;
    // The wanted leader leading already is no failure (kafka-leader-election.sh says so too).
    let failed = answer.results.iter().filter(|r| r.error.as_ref().is_some_and(|e| e.code != "ELECTION_NOT_NEEDED"));
    let failed = failed.count();
    if json {
        print_json(out, &answer)?;
    } else if answer.results.is_empty() {
        writeln!(out, "no partition needed an election")?;
    } else {
        let mut table = Table::new(&["TOPIC", "PARTITION", "RESULT"]);
        for r in &answer.results {
            let result = match (&r.error, r.leader) {
                (Some(e), _) => format!("{}: {}", e.code, e.message),
                (None, Some(leader)) => format!("elected broker {leader}"),
                (None, None) => "elected".to_string(),
            };
            table.row(vec![r.topic.clone(), r.partition.to_string(), result]);
        }
        table.write(out)?;
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} elections failed", answer.results.len());
    }
    Ok(())
}

fn run_trim(client: &AdminClient, out: &mut impl Write, args: &TrimArgs, json: bool) -> anyhow::Result<()> {
    let request =
        DeleteRecords { partitions: args.partition.map(|p| vec![p]), offset: args.offset, before_ms: args.before };
    let answer: DeletedRecords =
        client.post(&format!("/v1/topics/{}/delete-records", segment(&args.topic)), &request)?;
    let failed = answer.results.iter().filter(|r| r.error.is_some()).count();
    if json {
        print_json(out, &answer)?;
    } else {
        let mut table = Table::new(&["TOPIC", "PARTITION", "LOG-START", "RESULT"]);
        for r in &answer.results {
            let result =
                r.error.as_ref().map_or_else(|| "trimmed".to_string(), |e| format!("{}: {}", e.code, e.message));
            let start = r.low_watermark.map_or_else(|| "-".to_string(), |l| l.to_string());
            table.row(vec![answer.topic.clone(), r.partition.to_string(), start, result]);
        }
        table.write(out)?;
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} partitions were not trimmed", answer.results.len());
    }
    Ok(())
}

/// Polls until none of the plan's partitions is being reassigned, then until each one's leader
/// serves everything its log held at that moment: a new leader learns its high watermark from
/// its followers' next fetches, and until then records acknowledged before the move are not
/// readable. "Completed" means they are.
fn wait_for(client: &AdminClient, plan: &ReassignmentPlan, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let planned =
        |topic: &str, partition: i32| plan.partitions.iter().any(|p| p.topic == topic && p.partition == partition);
    loop {
        let ongoing: Reassignments = client.get("/v1/reassignments", &[])?;
        let left = ongoing.reassignments.iter().filter(|r| planned(&r.topic, r.partition)).count();
        if left == 0 {
            break;
        }
        if Instant::now() >= deadline {
            anyhow::bail!("{left} reassignments of the plan are still in progress after {} s", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let mut topics: Vec<&str> = plan.partitions.iter().map(|p| p.topic.as_str()).collect();
    topics.sort_unstable();
    topics.dedup();
    // Per partition, the log end its leader had when the moves were done.
    let mut ends: HashMap<(String, i32), i64> = HashMap::new();
    loop {
        let mut behind = Vec::new();
        for topic in &topics {
            let described: TopicDescription = client.get(&format!("/v1/topics/{}", segment(topic)), &[])?;
            for info in described.partitions.iter().filter(|i| planned(topic, i.partition)) {
                let key = (topic.to_string(), info.partition);
                if info.leader < 0 || info.log_end_offset < 0 {
                    behind.push(format!("{topic}-{} (no leader)", info.partition));
                    continue;
                }
                let end = *ends.entry(key).or_insert(info.log_end_offset);
                if info.high_watermark < end {
                    behind
                        .push(format!("{topic}-{} (high watermark {} of {end})", info.partition, info.high_watermark));
                }
            }
        }
        if behind.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "the plan's moves are done, but after {} s these partitions' new leaders do not serve all they hold yet: {}",
                timeout.as_secs(),
                behind.join(", ")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
