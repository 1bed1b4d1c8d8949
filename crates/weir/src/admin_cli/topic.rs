//! `weir topic create|list|describe|delete|alter`.

use std::collections::BTreeMap;
use std::io::Write;

use clap::{Args, Subcommand};
use weir_admin::api::{
    AlterConfigs, Configs, CreatePartitions, CreateTopic, CreatedTopic, DeletedTopic, ElasticChanged,
    ElasticDescription, MergePhysical, PartitionCount, PartitionInfo, ReplicaLag, SplitPhysical, TopicDescription,
    TopicList,
};

use super::kafka::topics::KafkaTopics;
use super::{human_bytes, parse_key_value, print_json, segment, AdminClient, Connection, Table};

#[derive(Debug, Args)]
pub struct TopicArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    pub command: TopicCommand,
}

#[derive(Debug, Subcommand)]
pub enum TopicCommand {
    /// Create a topic.
    Create(CreateArgs),
    /// List the topics (internal ones too, unless --exclude-internal).
    List(ListArgs),
    /// Partitions (offsets, sizes) and configs of a topic.
    Describe(DescribeArgs),
    /// Delete a topic and its data.
    Delete(NameArg),
    /// Change a topic's configs (--set, --delete) or add partitions (--partitions).
    Alter(AlterArgs),
    /// Split a physical partition of an elastic topic in two, online (docs/elastic.md).
    Split(SplitArgs),
    /// Merge two adjacent physical partitions of an elastic topic, online.
    Merge(MergeArgs),
}

#[derive(Debug, Args)]
pub struct SplitArgs {
    pub name: String,
    /// The physical partition to split (an id `weir topic describe` shows).
    #[arg(long)]
    pub partition: i32,
    /// How long to wait for the stable partitions the split moves, in ms (0: do not wait).
    #[arg(long, default_value_t = 60_000)]
    pub wait_ms: u64,
}

#[derive(Debug, Args)]
pub struct MergeArgs {
    pub name: String,
    /// The two physical partitions to merge: --partitions 3,4.
    #[arg(long, value_name = "P,Q", value_delimiter = ',', required = true)]
    pub partitions: Vec<i32>,
    /// How long to wait for the stable partitions the merge moves, in ms (0: do not wait).
    #[arg(long, default_value_t = 60_000)]
    pub wait_ms: u64,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    pub name: String,
    /// Partitions. [default: the broker's num.partitions]
    #[arg(long)]
    pub partitions: Option<i32>,
    /// Replicas per partition, each on its own broker: at most the number of live brokers (1 on a
    /// single node). [default: the broker's default.replication.factor]
    #[arg(long)]
    pub replication_factor: Option<i16>,
    /// A topic config, Kafka-named: --config retention.ms=3600000. Repeatable.
    #[arg(long = "config", value_name = "NAME=VALUE", value_parser = parse_key_value)]
    pub configs: Vec<(String, String)>,
    /// The kind of RocketMQ messages the topic takes: NORMAL, FIFO, DELAY or TRANSACTION (the
    /// topic config message.type). [default: NORMAL]
    #[arg(long, value_name = "TYPE")]
    pub message_type: Option<String>,
    /// Check everything, create nothing.
    #[arg(long)]
    pub validate_only: bool,
    /// An elastic topic (docs/elastic.md): 65,536 logical partitions over --partitions physical
    /// ones, which split and merge online.
    #[arg(long)]
    pub elastic: bool,
    /// An elastic topic's stable partitions, the ones Kafka clients see: a power of two, at least
    /// --partitions. [default: 16 per physical partition, rounded up to a power of two]
    #[arg(long, requires = "elastic")]
    pub stable_partitions: Option<i32>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Leave out internal topics (__consumer_offsets).
    #[arg(long)]
    pub exclude_internal: bool,
}

#[derive(Debug, Args)]
pub struct DescribeArgs {
    pub name: String,
    /// Show every config, not only the topic's overrides.
    #[arg(long)]
    pub all_configs: bool,
}

#[derive(Debug, Args)]
pub struct NameArg {
    pub name: String,
}

#[derive(Debug, Args)]
pub struct AlterArgs {
    pub name: String,
    /// Set a topic config: --set retention.ms=3600000. Repeatable.
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = parse_key_value)]
    pub set: Vec<(String, String)>,
    /// Remove a topic config override (back to the broker's default). Repeatable.
    #[arg(long = "delete", value_name = "NAME")]
    pub delete: Vec<String>,
    /// Grow the topic to this many partitions.
    #[arg(long)]
    pub partitions: Option<i32>,
    /// Check everything, change nothing.
    #[arg(long)]
    pub validate_only: bool,
}

/// Where the topic commands get their answers: the admin API, or Kafka's admin requests
/// with `--bootstrap` (`kafka::topics`). Both answer with the admin API's types, which one
/// printing code shows.
pub trait TopicSource {
    fn create(&mut self, request: &CreateTopic) -> anyhow::Result<CreatedTopic>;
    fn list(&mut self) -> anyhow::Result<TopicList>;
    fn describe(&mut self, name: &str) -> anyhow::Result<TopicDescription>;
    fn delete(&mut self, name: &str) -> anyhow::Result<DeletedTopic>;
    fn alter_configs(&mut self, name: &str, request: &AlterConfigs) -> anyhow::Result<Configs>;
    fn create_partitions(&mut self, name: &str, request: &CreatePartitions) -> anyhow::Result<PartitionCount>;
}

impl TopicSource for AdminClient {
    fn create(&mut self, request: &CreateTopic) -> anyhow::Result<CreatedTopic> {
        self.post("/v1/topics", request)
    }
    fn list(&mut self) -> anyhow::Result<TopicList> {
        self.get("/v1/topics", &[])
    }
    fn describe(&mut self, name: &str) -> anyhow::Result<TopicDescription> {
        self.get(&format!("/v1/topics/{}", segment(name)), &[])
    }
    fn delete(&mut self, name: &str) -> anyhow::Result<DeletedTopic> {
        AdminClient::delete(self, &format!("/v1/topics/{}", segment(name)))
    }
    fn alter_configs(&mut self, name: &str, request: &AlterConfigs) -> anyhow::Result<Configs> {
        self.patch(&format!("/v1/topics/{}/configs", segment(name)), request)
    }
    fn create_partitions(&mut self, name: &str, request: &CreatePartitions) -> anyhow::Result<PartitionCount> {
        self.post(&format!("/v1/topics/{}/partitions", segment(name)), request)
    }
}

pub fn run(args: &TopicArgs) -> anyhow::Result<()> {
    if let TopicCommand::Split(_) | TopicCommand::Merge(_) = &args.command {
        return change_layout(args);
    }
    let mut client: Box<dyn TopicSource> = match &args.connection.bootstrap {
        Some(bootstrap) => Box::new(KafkaTopics::connect(bootstrap)?),
        None => Box::new(AdminClient::new(&args.connection)?),
    };
    let client = client.as_mut();
    let json = args.connection.json;
    let mut out = std::io::stdout().lock();
    match &args.command {
        TopicCommand::Create(a) => {
            let request = CreateTopic {
                name: a.name.clone(),
                partitions: a.partitions,
                replication_factor: a.replication_factor,
                // A RocketMQ topic's messages are found by key and message id, unless a
                // --config says otherwise (later entries win).
                configs: a
                    .message_type
                    .iter()
                    .map(|_| ("message.index.enable".to_string(), "true".to_string()))
                    .chain(a.configs.iter().cloned())
                    .chain(a.message_type.iter().map(|t| ("message.type".to_string(), t.clone())))
                    .collect(),
                validate_only: a.validate_only,
                elastic: a.elastic,
                stable_partitions: a.stable_partitions,
            };
            let created = client.create(&request)?;
            if json {
                return print_json(&mut out, &created);
            }
            let partitions = match created.partitions {
                1 => "1 partition".to_string(),
                n => format!("{n} partitions"),
            };
            let partitions = match created.physical_partitions {
                Some(physical) => format!("{partitions} (stable) over {physical} physical, elastic"),
                None => partitions,
            };
            if created.validate_only {
                writeln!(out, "topic '{}' is valid: {partitions} (nothing created)", created.name)?;
            } else {
                writeln!(out, "created topic '{}' with {partitions}", created.name)?;
            }
        }
        TopicCommand::List(a) => {
            let mut list = client.list()?;
            if a.exclude_internal {
                list.topics.retain(|t| !t.internal);
            }
            if json {
                return print_json(&mut out, &list);
            }
            let mut table = Table::new(&["TOPIC", "PARTITIONS", "INTERNAL", "ID"]);
            for t in list.topics {
                let internal = if t.internal { "yes" } else { "no" };
                table.row(vec![t.name, t.partitions.to_string(), internal.into(), t.id]);
            }
            table.write(&mut out)?;
        }
        TopicCommand::Describe(a) => {
            let topic = client.describe(&a.name)?;
            if json {
                return print_json(&mut out, &topic);
            }
            write_description(&mut out, &topic, a.all_configs)?;
        }
        TopicCommand::Delete(a) => {
            let deleted = client.delete(&a.name)?;
            if json {
                return print_json(&mut out, &deleted);
            }
            writeln!(out, "deleted topic '{}'", deleted.name)?;
        }
        TopicCommand::Alter(a) => alter(client, &mut out, a, json)?,
        TopicCommand::Split(_) | TopicCommand::Merge(_) => unreachable!("answered above"),
    }
    Ok(())
}

/// `weir topic split|merge`: the admin API's, as Kafka's protocol has no such request.
fn change_layout(args: &TopicArgs) -> anyhow::Result<()> {
    if args.connection.bootstrap.is_some() {
        anyhow::bail!(
            "splitting and merging go through Weir's admin API: use --admin (or WEIR_ADMIN), not --bootstrap"
        );
    }
    let client = AdminClient::new(&args.connection)?;
    let (name, changed): (&str, ElasticChanged) = match &args.command {
        TopicCommand::Split(a) => {
            let request = SplitPhysical { partition: a.partition, wait_ms: Some(a.wait_ms) };
            (&a.name, client.post(&format!("/v1/topics/{}/split", segment(&a.name)), &request)?)
        }
        TopicCommand::Merge(a) => {
            let [p, q] = a.partitions[..] else { anyhow::bail!("--partitions takes two physical partitions: P,Q") };
            let request = MergePhysical { partitions: [p, q], wait_ms: Some(a.wait_ms) };
            (&a.name, client.post(&format!("/v1/topics/{}/merge", segment(&a.name)), &request)?)
        }
        _ => unreachable!("only split and merge change a layout"),
    };
    let mut out = std::io::stdout().lock();
    if args.connection.json {
        return print_json(&mut out, &changed);
    }
    let ids = |ids: &[i32]| ids.iter().map(i32::to_string).collect::<Vec<_>>().join(",");
    let what = if matches!(args.command, TopicCommand::Split(_)) { "split" } else { "merged" };
    writeln!(
        out,
        "{what} physical partition(s) {} of '{name}' into {}",
        ids(&changed.replaced),
        ids(&changed.created)
    )?;
    if !changed.moving.is_empty() {
        let state = if changed.in_force { "moved" } else { "still moving (see weir topic describe)" };
        writeln!(out, "stable partitions {}: {state}", ids(&changed.moving))?;
    }
    if !changed.new_leaders.is_empty() {
        writeln!(out, "stable partitions {}: new preferred leader", ids(&changed.new_leaders))?;
    }
    writeln!(out)?;
    write_layout(&mut out, &changed.elastic)
}

/// An elastic topic's physical partitions, one row each.
fn write_layout(out: &mut impl Write, layout: &ElasticDescription) -> anyhow::Result<()> {
    writeln!(
        out,
        "Elastic: {} logical partitions over {} stable partitions (the ones Kafka clients see)",
        layout.logical_partitions, layout.stable_partitions
    )?;
    let mut table = Table::new(&[
        "PHYSICAL", "STATE", "STABLE", "LOGICAL", "LEADER", "REPLICAS", "IN/S", "OUT/S", "SIZE", "FROM", "INTO",
    ]);
    let list = |ids: &[i32]| {
        if ids.is_empty() {
            "-".to_string()
        } else {
            ids.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
        }
    };
    for p in &layout.physical {
        let state =
            if p.moving.is_empty() { p.state.clone() } else { format!("{} (moving {})", p.state, p.moving.len()) };
        let leader = match (p.leader, p.leaders.len()) {
            (-1, 0) => "-".to_string(),
            (-1, _) => list(&p.leaders),
            (leader, _) => leader.to_string(),
        };
        table.row(vec![
            p.id.to_string(),
            state,
            format!("{}-{}", p.stable_first, p.stable_last),
            format!("{}-{}", p.logical_first, p.logical_last),
            leader,
            list(&p.replicas),
            human_bytes(p.bytes_in_per_sec as u64),
            human_bytes(p.bytes_out_per_sec as u64),
            human_bytes(p.size_bytes),
            list(&p.parents),
            list(&p.children),
        ]);
    }
    table.write(out)?;
    Ok(())
}

fn write_description(out: &mut impl Write, topic: &TopicDescription, all_configs: bool) -> anyhow::Result<()> {
    writeln!(out, "Topic: {}{}", topic.name, if topic.internal { " (internal)" } else { "" })?;
    writeln!(out, "Id: {}", topic.id)?;
    writeln!(
        out,
        "Partitions: {}   Replication factor: {}   Size: {}",
        topic.partitions.len(),
        topic.replication_factor,
        human_bytes(topic.size_bytes)
    )?;
    writeln!(out)?;
    let mut table = Table::new(&[
        "PARTITION",
        "LEADER",
        "REPLICAS",
        "ISR",
        "REPLICA-LAG",
        "LOG-START",
        "HIGH-WATERMARK",
        "LOG-END",
        "SIZE",
    ]);
    let list = |ids: &[i32]| ids.iter().map(i32::to_string).collect::<Vec<_>>().join(",");
    for p in &topic.partitions {
        table.row(vec![
            p.partition.to_string(),
            p.leader.to_string(),
            list(&p.replicas),
            list(&p.isr),
            replica_lags(p),
            p.log_start_offset.to_string(),
            p.high_watermark.to_string(),
            p.log_end_offset.to_string(),
            human_bytes(p.size_bytes),
        ]);
    }
    table.write(out)?;
    writeln!(out)?;
    if topic.partitions.iter().any(|p| p.remote.is_some()) {
        write_remote(out, &topic.partitions)?;
        writeln!(out)?;
    }
    if let Some(layout) = &topic.elastic {
        write_layout(out, layout)?;
        writeln!(out)?;
    }
    let configs: Vec<_> = topic.configs.iter().filter(|c| all_configs || c.source == "topic").collect();
    if configs.is_empty() {
        writeln!(out, "Configs: no overrides (--all-configs shows the defaults in force)")?;
        return Ok(());
    }
    let mut table = Table::new(&["CONFIG", "VALUE", "SOURCE"]);
    for c in configs {
        table.row(vec![c.name.clone(), c.value.clone(), c.source.clone()]);
    }
    table.write(out)?;
    Ok(())
}

/// A tiered topic's object-store tier, a row per partition.
fn write_remote(out: &mut impl Write, partitions: &[PartitionInfo]) -> anyhow::Result<()> {
    writeln!(out, "Object store (tiered storage):")?;
    let mut table = Table::new(&[
        "PARTITION",
        "REMOTE-START",
        "REMOTE-END",
        "LOCAL-START",
        "SEGMENTS",
        "SIZE",
        "UPLOAD-LAG",
        "FAILURES",
        "LAST-ERROR",
    ]);
    let offset = |o: Option<i64>| o.map_or("-".to_string(), |o| o.to_string());
    for p in partitions {
        let Some(r) = &p.remote else { continue };
        table.row(vec![
            p.partition.to_string(),
            offset(r.remote_start_offset),
            offset(r.remote_end_offset),
            r.local_log_start_offset.to_string(),
            r.remote_segments.to_string(),
            human_bytes(r.remote_bytes),
            format!("{} ({} segments)", human_bytes(r.upload_lag_bytes), r.upload_lag_segments),
            r.upload_failures.to_string(),
            r.last_error.clone().unwrap_or_else(|| "-".to_string()),
        ]);
    }
    table.write(out)?;
    Ok(())
}

/// Each follower's offsets behind the leader, `2:0,3:15`; `?` for one that has not fetched from
/// this leader yet; `-` when the partition has no follower or its leader did not answer.
fn replica_lags(p: &PartitionInfo) -> String {
    if p.replica_lags.is_empty() {
        return "-".to_string();
    }
    let lag = |l: &ReplicaLag| format!("{}:{}", l.replica, l.offsets_behind.map_or("?".to_string(), |n| n.to_string()));
    p.replica_lags.iter().map(lag).collect::<Vec<_>>().join(",")
}

fn alter(client: &mut dyn TopicSource, out: &mut impl Write, a: &AlterArgs, json: bool) -> anyhow::Result<()> {
    if a.set.is_empty() && a.delete.is_empty() && a.partitions.is_none() {
        anyhow::bail!("nothing to alter: give --set NAME=VALUE, --delete NAME or --partitions N");
    }
    let mut done = Vec::new();
    let mut results = BTreeMap::new();
    if !a.set.is_empty() || !a.delete.is_empty() {
        let request = AlterConfigs {
            set: a.set.iter().cloned().collect(),
            delete: a.delete.clone(),
            validate_only: a.validate_only,
        };
        let configs = client.alter_configs(&a.name, &request)?;
        for (name, value) in &a.set {
            done.push(format!("set {name}={value}"));
        }
        for name in &a.delete {
            done.push(format!("deleted {name}"));
        }
        results.insert("configs", serde_json::to_value(configs)?);
    }
    if let Some(count) = a.partitions {
        let request = CreatePartitions { count, validate_only: a.validate_only };
        let grown = client.create_partitions(&a.name, &request)?;
        done.push(format!("{} partitions", grown.partitions));
        results.insert("partitions", serde_json::to_value(grown)?);
    }
    if json {
        return print_json(out, &results);
    }
    let verb = if a.validate_only { "would alter (nothing changed)" } else { "altered" };
    writeln!(out, "{verb} topic '{}': {}", a.name, done.join(", "))?;
    Ok(())
}
