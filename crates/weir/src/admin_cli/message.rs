//! `weir message query|get`: find messages by key, message id or time (RocketMQ's
//! `queryMsgByKey`, `queryMsgById`), through the admin API's `/v1/topics/{topic}/messages`.

use std::io::Write;

use clap::{ArgGroup, Args, Subcommand};
use weir_admin::api::{Encoding, FoundMessage, FoundMessages};

use super::{print_json, segment, AdminClient, Connection};

#[derive(Debug, Args)]
pub struct MessageArgs {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    pub command: MessageCommand,
}

#[derive(Debug, Subcommand)]
pub enum MessageCommand {
    /// Messages of a topic with a key, a message id, or a timestamp in a range. Keys and ids are
    /// found on topics with message.index.enable (RocketMQ topics have it); time works on all.
    Query(QueryArgs),
    /// The message with this id.
    Get(GetArgs),
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("what").required(true).multiple(true).args(["key", "id", "begin", "end"])))]
pub struct QueryArgs {
    pub topic: String,
    /// Messages with this key (RocketMQ keys).
    #[arg(long, conflicts_with = "id")]
    pub key: Option<String>,
    /// The message with this id.
    #[arg(long)]
    pub id: Option<String>,
    /// Only messages stored at or after this time: 2026-12-01T00:00:00Z, -1h, -30m, or ms
    /// since the epoch.
    #[arg(long, value_name = "TIME", value_parser = super::time::parse_time_arg)]
    pub begin: Option<i64>,
    /// Only messages stored at or before this time: 2026-12-01T00:00:00Z, -1h, -30m, or ms
    /// since the epoch.
    #[arg(long, value_name = "TIME", value_parser = super::time::parse_time_arg)]
    pub end: Option<i64>,
    /// At most this many messages.
    #[arg(long, value_name = "N", default_value = "64")]
    pub max: usize,
    /// Print bodies as base64 (for binary bodies).
    #[arg(long)]
    pub base64: bool,
}

#[derive(Debug, Args)]
pub struct GetArgs {
    pub topic: String,
    pub id: String,
    /// Print the body as base64.
    #[arg(long)]
    pub base64: bool,
}

pub fn run(args: &MessageArgs) -> anyhow::Result<()> {
    let client = AdminClient::new(&args.connection)?;
    let json = args.connection.json;
    let mut out = std::io::stdout().lock();
    match &args.command {
        MessageCommand::Query(a) => {
            let mut query: Vec<(&str, String)> = vec![("max", a.max.to_string()), ("encoding", encoding(a.base64))];
            query.extend(a.key.iter().map(|k| ("key", k.clone())));
            query.extend(a.id.iter().map(|i| ("id", i.clone())));
            query.extend(a.begin.iter().map(|b| ("begin_ms", b.to_string())));
            query.extend(a.end.iter().map(|e| ("end_ms", e.to_string())));
            let found: FoundMessages = client.get(&format!("/v1/topics/{}/messages", segment(&a.topic)), &query)?;
            if json {
                return print_json(&mut out, &found);
            }
            for message in &found.messages {
                write_message(&mut out, message)?;
            }
            if found.messages.is_empty() {
                writeln!(out, "no message found")?;
            }
        }
        MessageCommand::Get(a) => {
            let path = format!("/v1/topics/{}/messages/{}", segment(&a.topic), segment(&a.id));
            let found: FoundMessage = client.get(&path, &[("encoding", encoding(a.base64))])?;
            if json {
                return print_json(&mut out, &found);
            }
            write_message(&mut out, &found)?;
        }
    }
    Ok(())
}

fn encoding(base64: bool) -> String {
    if base64 { Encoding::Base64 } else { Encoding::Utf8 }.as_str().to_string()
}

fn write_message(out: &mut impl Write, m: &FoundMessage) -> anyhow::Result<()> {
    let or_null = |v: &Option<String>| v.clone().unwrap_or_else(|| "(null)".into());
    let properties: Vec<String> = m.properties.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    writeln!(
        out,
        "partition={} offset={} timestamp={} id={} key={} tag={} keys={} group={} properties={} body={}",
        m.partition,
        m.offset,
        m.timestamp,
        m.message_id,
        or_null(&m.key),
        or_null(&m.tag),
        m.keys.join(","),
        or_null(&m.message_group),
        properties.join(","),
        or_null(&m.body),
    )?;
    Ok(())
}
