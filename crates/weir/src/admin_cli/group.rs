//! `weir group list|describe|create|alter|reset-offsets|delete|delete-offsets`.

use std::io::Write;

use clap::{ArgGroup, Args, Subcommand};
use weir_admin::api::{
    AlterConfigs, ConfigEntry, Configs, CreateGroup, CreatedGroup, DeletedGroup, DeletedOffsets, GroupDescription,
    GroupList, GroupMember, ResendDeadLetters, ResentDeadLetters, ResetOffsets, ResetOffsetsResult, ResetTo,
    TopicSelector,
};
use weir_broker::group_config;

use super::kafka::groups::KafkaGroups;
use super::{or_dash, parse_key_value, print_json, segment, AdminClient, Connection, Table};

#[derive(Debug, Args)]
pub struct GroupArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    pub command: GroupCommand,
}

#[derive(Debug, Subcommand)]
pub enum GroupCommand {
    /// List the consumer groups with their state.
    List(ListArgs),
    /// Members, assignments, committed offsets, lag and settings of a group.
    Describe(GroupName),
    /// Give a group settings for its RocketMQ consumers (a group needs none to be used: one
    /// without settings has RocketMQ's defaults).
    Create(CreateArgs),
    /// Change a group's settings (--set, --delete).
    Alter(AlterArgs),
    /// Move a group's committed offsets (only while it has no Kafka members; RocketMQ consumers
    /// may keep running and receive from the new offsets).
    ResetOffsets(ResetArgs),
    /// Delete a group and its committed offsets (only while it has no members).
    Delete(GroupName),
    /// Delete a group's committed offsets of one topic (Kafka's OffsetDelete: refused while
    /// members subscribe to it).
    DeleteOffsets(DeleteOffsetsArgs),
    /// Send a group's dead letters (its topic %DLQ%<group>) back to the topics they died in,
    /// where its consumers receive them again as first deliveries.
    ResendDeadLetters(ResendArgs),
}

#[derive(Debug, Args)]
pub struct ResendArgs {
    pub group: String,
    /// The first dead letter's offset in %DLQ%<group> (a previous resend prints where the next
    /// begins). [default: the oldest kept]
    #[arg(long, value_name = "OFFSET")]
    pub from_offset: Option<i64>,
    /// At most this many. [default and most: 100000]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub max: Option<u64>,
}

#[derive(Debug, Args)]
pub struct DeleteOffsetsArgs {
    pub group: String,
    /// The topic whose committed offsets go.
    #[arg(long)]
    pub topic: String,
}

/// Where the group commands get their answers: the admin API, or Kafka's group requests with
/// `--bootstrap` (`kafka::groups`). Both answer with the admin API's types, which one printing
/// code shows.
pub trait GroupSource {
    fn list(&mut self, states: &[String]) -> anyhow::Result<GroupList>;
    fn describe(&mut self, group: &str) -> anyhow::Result<GroupDescription>;
    fn create(&mut self, request: &CreateGroup) -> anyhow::Result<CreatedGroup>;
    fn alter_configs(&mut self, group: &str, request: &AlterConfigs) -> anyhow::Result<Configs>;
    fn reset_offsets(&mut self, group: &str, request: &ResetOffsets) -> anyhow::Result<ResetOffsetsResult>;
    fn delete(&mut self, group: &str) -> anyhow::Result<DeletedGroup>;
    fn delete_offsets(&mut self, group: &str, topic: &str) -> anyhow::Result<DeletedOffsets>;
    fn resend_dead_letters(&mut self, group: &str, request: &ResendDeadLetters) -> anyhow::Result<ResentDeadLetters>;
}

impl GroupSource for AdminClient {
    fn list(&mut self, states: &[String]) -> anyhow::Result<GroupList> {
        let query: Vec<(&str, String)> = if states.is_empty() { Vec::new() } else { vec![("state", states.join(","))] };
        self.get("/v1/groups", &query)
    }
    fn describe(&mut self, group: &str) -> anyhow::Result<GroupDescription> {
        self.get(&format!("/v1/groups/{}", segment(group)), &[])
    }
    fn create(&mut self, request: &CreateGroup) -> anyhow::Result<CreatedGroup> {
        self.post("/v1/groups", request)
    }
    fn alter_configs(&mut self, group: &str, request: &AlterConfigs) -> anyhow::Result<Configs> {
        self.patch(&format!("/v1/groups/{}/configs", segment(group)), request)
    }
    fn reset_offsets(&mut self, group: &str, request: &ResetOffsets) -> anyhow::Result<ResetOffsetsResult> {
        self.post(&format!("/v1/groups/{}/reset-offsets", segment(group)), request)
    }
    fn delete(&mut self, group: &str) -> anyhow::Result<DeletedGroup> {
        AdminClient::delete(self, &format!("/v1/groups/{}", segment(group)))
    }
    fn delete_offsets(&mut self, group: &str, topic: &str) -> anyhow::Result<DeletedOffsets> {
        let path = format!("/v1/groups/{}/offsets?topic={}", segment(group), segment(topic));
        AdminClient::delete(self, &path)
    }
    fn resend_dead_letters(&mut self, group: &str, request: &ResendDeadLetters) -> anyhow::Result<ResentDeadLetters> {
        self.post(&format!("/v1/groups/{}/dead-letters/resend", segment(group)), request)
    }
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only groups in these states (Empty, PreparingRebalance, CompletingRebalance, Stable);
    /// comma-separated or repeated.
    #[arg(long = "state", value_delimiter = ',')]
    pub states: Vec<String>,
}

#[derive(Debug, Args)]
pub struct GroupName {
    pub group: String,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    pub group: String,
    /// Consume in order: a message group's next message only after the previous one is acked
    /// (the group setting consume.fifo).
    #[arg(long)]
    pub fifo: bool,
    /// Give every consumer every message, each with its own progress (the group setting
    /// consume.broadcast), rather than share them.
    #[arg(long)]
    pub broadcast: bool,
    /// Deliveries of a message before it goes to the dead letters (max.delivery.attempts).
    /// [default: 17]
    #[arg(long, value_name = "N")]
    pub max_delivery_attempts: Option<u32>,
    /// The waits before redeliveries: a list such as 1s,5s,30s (the last repeats) or
    /// exponential:INITIAL,MAX,MULTIPLIER (retry.backoff). [default: RocketMQ's 1s,5s,...,2h]
    #[arg(long, value_name = "BACKOFF")]
    pub retry_backoff: Option<String>,
    /// A group setting by name: --config consume.fifo=true. Repeatable.
    #[arg(long = "config", value_name = "NAME=VALUE", value_parser = parse_key_value)]
    pub configs: Vec<(String, String)>,
    /// Check everything, change nothing.
    #[arg(long)]
    pub validate_only: bool,
}

#[derive(Debug, Args)]
pub struct AlterArgs {
    pub group: String,
    /// Set a group setting: --set max.delivery.attempts=5. Repeatable.
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = parse_key_value)]
    pub set: Vec<(String, String)>,
    /// Remove a group setting (back to its default). Repeatable.
    #[arg(long = "delete", value_name = "NAME")]
    pub delete: Vec<String>,
    /// Check everything, change nothing.
    #[arg(long)]
    pub validate_only: bool,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("to").required(true).multiple(false)))]
#[command(group(ArgGroup::new("which").required(true).multiple(false)))]
pub struct ResetArgs {
    pub group: String,
    /// A topic, or some of its partitions: --topic orders or --topic orders:0,2. Repeatable.
    #[arg(long = "topic", value_name = "TOPIC[:PARTITIONS]", value_parser = parse_topic_selector, group = "which")]
    pub topics: Vec<TopicSelector>,
    /// Every topic the group has committed offsets for.
    #[arg(long, group = "which")]
    pub all_topics: bool,
    /// To the log start offset.
    #[arg(long, group = "to")]
    pub to_earliest: bool,
    /// To the high watermark (skip everything not yet consumed).
    #[arg(long, group = "to")]
    pub to_latest: bool,
    /// To the first record at or after this time: 2026-12-01T00:00:00Z, -1h, -30m, or ms
    /// since the epoch (`--to-datetime` is the same).
    #[arg(long, value_name = "TIME", group = "to", alias = "to-datetime", value_parser = super::time::parse_time_arg)]
    pub to_timestamp: Option<i64>,
    /// To this offset (it must lie between the log start and the high watermark).
    #[arg(long, value_name = "OFFSET", group = "to")]
    pub to_offset: Option<i64>,
    /// By this many records from the committed offset (negative: back), kept within the log.
    #[arg(long, value_name = "N", group = "to", allow_hyphen_values = true)]
    pub shift_by: Option<i64>,
    /// Show the new offsets without committing them.
    #[arg(long)]
    pub dry_run: bool,
}

/// `orders` or `orders:0,2`.
fn parse_topic_selector(text: &str) -> Result<TopicSelector, String> {
    match text.split_once(':') {
        None if !text.is_empty() => Ok(TopicSelector::All(text.to_string())),
        None => Err("empty topic name".into()),
        Some((topic, list)) => {
            let partitions = list
                .split(',')
                .map(|p| p.trim().parse::<i32>().map_err(|_| format!("{p:?} in {text:?} is not a partition number")))
                .collect::<Result<Vec<i32>, String>>()?;
            Ok(TopicSelector::Some { topic: topic.to_string(), partitions })
        }
    }
}

pub fn run(args: &GroupArgs) -> anyhow::Result<()> {
    let mut client: Box<dyn GroupSource> = match &args.connection.bootstrap {
        Some(bootstrap) => Box::new(KafkaGroups::connect(bootstrap)?),
        None => Box::new(AdminClient::new(&args.connection)?),
    };
    let client = client.as_mut();
    let json = args.connection.json;
    let mut out = std::io::stdout().lock();
    match &args.command {
        GroupCommand::List(a) => {
            let list = client.list(&a.states)?;
            if json {
                return print_json(&mut out, &list);
            }
            let mut table = Table::new(&["GROUP", "STATE", "PROTOCOL-TYPE"]);
            for g in list.groups {
                table.row(vec![g.group_id, g.state, g.protocol_type]);
            }
            table.write(&mut out)?;
        }
        GroupCommand::Describe(a) => {
            let group = client.describe(&a.group)?;
            if json {
                return print_json(&mut out, &group);
            }
            write_description(&mut out, &group)?;
        }
        GroupCommand::Create(a) => {
            let created = client.create(&create_request(a))?;
            if json {
                return print_json(&mut out, &created);
            }
            let verb = if created.validate_only { "would create (nothing changed)" } else { "created" };
            writeln!(out, "{verb} group '{}'", created.name)?;
            write_configs(&mut out, &created.configs)?;
        }
        GroupCommand::Alter(a) => {
            if a.set.is_empty() && a.delete.is_empty() {
                anyhow::bail!("nothing to alter: give --set NAME=VALUE or --delete NAME");
            }
            let request = AlterConfigs {
                set: a.set.iter().cloned().collect(),
                delete: a.delete.clone(),
                validate_only: a.validate_only,
            };
            let configs = client.alter_configs(&a.group, &request)?;
            if json {
                return print_json(&mut out, &configs);
            }
            let verb = if a.validate_only { "would alter (nothing changed)" } else { "altered" };
            writeln!(out, "{verb} group '{}'", a.group)?;
            write_configs(&mut out, &configs.configs)?;
        }
        GroupCommand::ResetOffsets(a) => {
            let request = ResetOffsets {
                topics: if a.all_topics { None } else { Some(a.topics.clone()) },
                to: reset_to(a)?,
                dry_run: a.dry_run,
            };
            let result = client.reset_offsets(&a.group, &request)?;
            if json {
                return print_json(&mut out, &result);
            }
            write_reset(&mut out, &result)?;
        }
        GroupCommand::Delete(a) => {
            let deleted = client.delete(&a.group)?;
            if json {
                return print_json(&mut out, &deleted);
            }
            writeln!(out, "deleted group '{}'", deleted.group_id)?;
        }
        GroupCommand::ResendDeadLetters(a) => {
            let request = ResendDeadLetters {
                from_offset: a.from_offset,
                max: a.max.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            };
            let resent = client.resend_dead_letters(&a.group, &request)?;
            if json {
                return print_json(&mut out, &resent);
            }
            write_resent(&mut out, &a.group, &resent)?;
        }
        GroupCommand::DeleteOffsets(a) => {
            let deleted = client.delete_offsets(&a.group, &a.topic)?;
            if json {
                return print_json(&mut out, &deleted);
            }
            writeln!(
                out,
                "deleted the committed offsets of group '{}' for topic '{}' ({} partition(s))",
                deleted.group_id,
                deleted.topic,
                deleted.partitions.len()
            )?;
        }
    }
    Ok(())
}

/// The settings of `weir group create`: --config pairs, then the flags that name one setting.
fn create_request(a: &CreateArgs) -> CreateGroup {
    let mut configs: std::collections::BTreeMap<String, String> = a.configs.iter().cloned().collect();
    if a.fifo {
        configs.insert(group_config::FIFO.into(), "true".into());
    }
    if a.broadcast {
        configs.insert(group_config::BROADCAST.into(), "true".into());
    }
    if let Some(n) = a.max_delivery_attempts {
        configs.insert(group_config::MAX_DELIVERY_ATTEMPTS.into(), n.to_string());
    }
    if let Some(backoff) = &a.retry_backoff {
        configs.insert(group_config::RETRY_BACKOFF.into(), backoff.clone());
    }
    CreateGroup { name: a.group.clone(), configs, validate_only: a.validate_only }
}

/// Where `weir group reset-offsets` moves the offsets: the first of its --to-* and --shift-by
/// flags given.
fn reset_to(a: &ResetArgs) -> anyhow::Result<ResetTo> {
    Ok(match (a.to_earliest, a.to_latest, a.to_timestamp, a.to_offset, a.shift_by) {
        (true, ..) => ResetTo::Earliest,
        (_, true, ..) => ResetTo::Latest,
        (_, _, Some(t), ..) => ResetTo::Timestamp(t),
        (_, _, _, Some(o), _) => ResetTo::Offset(o),
        (.., Some(n)) => ResetTo::ShiftBy(n),
        _ => anyhow::bail!("say where to: --to-earliest, --to-latest, --to-timestamp, --to-offset or --shift-by"),
    })
}

fn write_reset(out: &mut impl Write, result: &ResetOffsetsResult) -> anyhow::Result<()> {
    let mut table = Table::new(&["TOPIC", "PARTITION", "PREVIOUS-OFFSET", "NEW-OFFSET"]);
    for c in &result.offsets {
        table.row(vec![c.topic.clone(), c.partition.to_string(), or_dash(c.previous_offset), c.new_offset.to_string()]);
    }
    table.write(out)?;
    if result.dry_run {
        writeln!(out, "dry run: nothing committed")?;
    } else {
        writeln!(out, "reset {} partition(s) of group '{}'", result.offsets.len(), result.group_id)?;
    }
    Ok(())
}

fn write_description(out: &mut impl Write, group: &GroupDescription) -> anyhow::Result<()> {
    let protocol = match (group.protocol_type.as_str(), group.protocol.as_str()) {
        ("", _) => "-".to_string(),
        (kind, "") => kind.to_string(),
        (kind, assignor) => format!("{kind} ({assignor})"),
    };
    writeln!(out, "Group: {}", group.group_id)?;
    writeln!(
        out,
        "State: {}   Protocol: {protocol}   Members: {}   Total lag: {}",
        group.state,
        group.members.len(),
        group.total_lag
    )?;
    if let (Some(group_epoch), Some(assignment_epoch)) = (group.group_epoch, group.assignment_epoch) {
        // A consumer-protocol group (KIP-848): its epochs and each member's.
        let members: Vec<String> =
            group.members.iter().filter_map(|m| m.member_epoch.map(|e| format!("{}={e}", m.member_id))).collect();
        writeln!(out, "Group epoch: {group_epoch}   Assignment epoch: {assignment_epoch}")?;
        if !members.is_empty() {
            writeln!(out, "Member epochs: {}", members.join(", "))?;
        }
    }
    writeln!(out)?;
    let member = |id: &Option<String>| group.members.iter().find(|m| Some(&m.member_id) == id.as_ref());
    // A share group's partitions also show their records in flight (acquired, not yet
    // acknowledged).
    let share = group.offsets.iter().any(|o| o.in_flight.is_some());
    let mut headers =
        vec!["TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST", "CLIENT-ID"];
    if share {
        headers.push("IN-FLIGHT");
    }
    let mut table = Table::new(&headers);
    for o in &group.offsets {
        let m = member(&o.member_id);
        let mut row = vec![
            o.topic.clone(),
            o.partition.to_string(),
            or_dash(o.committed_offset),
            or_dash(o.high_watermark),
            or_dash(o.lag),
            m.map_or("-".into(), |m| m.member_id.clone()),
            m.map_or("-".into(), |m| m.client_host.clone()),
            m.map_or("-".into(), |m| m.client_id.clone()),
        ];
        if share {
            row.push(or_dash(o.in_flight.map(|n| n as i64)));
        }
        table.row(row);
    }
    table.write(out)?;
    // Members that own no row: consumers by invisible time (RocketMQ's), each of which
    // receives from every partition of its topics.
    let owners: std::collections::HashSet<&String> =
        group.offsets.iter().filter_map(|o| o.member_id.as_ref()).collect();
    let unlisted: Vec<_> = group.members.iter().filter(|m| !owners.contains(&m.member_id)).collect();
    if !unlisted.is_empty() {
        writeln!(out)?;
        write_connections(out, &unlisted)?;
    }
    if !group.configs.is_empty() {
        writeln!(out)?;
        write_configs(out, &group.configs)?;
    }
    Ok(())
}

fn write_resent(out: &mut impl Write, group: &str, resent: &ResentDeadLetters) -> anyhow::Result<()> {
    let total: u64 = resent.resent.values().sum();
    let topics: Vec<String> = resent.resent.iter().map(|(topic, n)| format!("{n} to '{topic}'")).collect();
    let to = if topics.is_empty() { String::new() } else { format!(": {}", topics.join(", ")) };
    writeln!(out, "resent {total} dead letter(s) of group '{group}'{to}")?;
    for skipped in &resent.skipped {
        writeln!(out, "skipped the dead letter at offset {}: {}", skipped.offset, skipped.reason)?;
    }
    writeln!(
        out,
        "read {} from offset {} to {}; the next resend begins at --from-offset {}",
        resent.dead_letter_topic, resent.from_offset, resent.next_offset, resent.next_offset
    )?;
    Ok(())
}

/// The consumers that receive by invisible time (RocketMQ's), as `mqadmin consumerConnection`
/// lists them: who, from where, what kind, language and version, and each subscription with
/// its filter expression (or the topics it received from, before it said its subscription).
fn write_connections(out: &mut impl Write, members: &[&GroupMember]) -> anyhow::Result<()> {
    let mut table = Table::new(&["CLIENT-ID", "HOST", "TYPE", "LANGUAGE", "VERSION", "SUBSCRIPTIONS"]);
    let shown = |text: &Option<String>| text.clone().filter(|t| !t.is_empty()).unwrap_or_else(|| "-".into());
    for m in members {
        let subscriptions: Vec<String> = if m.subscriptions.is_empty() {
            m.assignment.iter().map(|tp| tp.topic.clone()).collect()
        } else {
            m.subscriptions.iter().map(|(topic, expression)| format!("{topic} ({expression})")).collect()
        };
        table.row(vec![
            m.client_id.clone(),
            if m.client_host.is_empty() { "-".into() } else { m.client_host.clone() },
            shown(&m.client_type),
            shown(&m.language),
            shown(&m.version),
            if subscriptions.is_empty() { "-".into() } else { subscriptions.join(", ") },
        ]);
    }
    table.write(out)?;
    Ok(())
}

fn write_configs(out: &mut impl Write, configs: &[ConfigEntry]) -> anyhow::Result<()> {
    let mut table = Table::new(&["SETTING", "VALUE", "SOURCE"]);
    for c in configs {
        table.row(vec![c.name.clone(), c.value.clone(), c.source.clone()]);
    }
    table.write(out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_selectors_parse() {
        assert_eq!(parse_topic_selector("orders"), Ok(TopicSelector::All("orders".into())));
        assert_eq!(
            parse_topic_selector("orders:0,2"),
            Ok(TopicSelector::Some { topic: "orders".into(), partitions: vec![0, 2] })
        );
        assert!(parse_topic_selector("orders:x").is_err());
        assert!(parse_topic_selector("").is_err());
    }
}
