//! The command line of `weir`, as clap types. Each subcommand's arguments live here, but for
//! `weir bench`'s, which live with the benchmarks (`weir_bench::cli`); the code that runs a
//! command lives in its own module (`admin_cli::topic`, ...), so adding a command is: a variant
//! here, a module there, one arm in `main`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use weir_harness::parse_setting;

#[derive(Debug, Parser)]
#[command(
    name = "weir",
    version,
    about = "Weir: a distributed message queue and streaming log that speaks Kafka.",
    after_help = "Logging goes to stderr; set RUST_LOG (e.g. RUST_LOG=weir_storage=debug) to change it. It is\n\
                  coloured only on a terminal, and not when NO_COLOR is set to a non-empty value.\n\
                  Run `weir help <command>` or `weir <command> --help` for a command's flags."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a broker that Kafka clients use unchanged (listens on 127.0.0.1:9092, data in
    /// ./data); alone, or as a node of a cluster.
    #[command(long_about = SERVER_LONG_ABOUT)]
    Server(ServerArgs),
    /// Measure Weir's components on this machine.
    #[command(subcommand)]
    Bench(weir_bench::BenchCommand),
    /// Create, list, describe, alter and delete topics of a running broker (admin HTTP API).
    Topic(crate::admin_cli::topic::TopicArgs),
    /// List, describe, reset the offsets of and delete consumer groups (admin HTTP API).
    Group(crate::admin_cli::group::GroupArgs),
    /// Produce the lines of stdin as records to a topic (admin HTTP API).
    Produce(crate::admin_cli::produce::ProduceArgs),
    /// Print a topic's records, optionally as a consumer group (admin HTTP API).
    Consume(crate::admin_cli::consume::ConsumeArgs),
    /// Find messages by key, message id or time (admin HTTP API).
    Message(crate::admin_cli::message::MessageArgs),
    /// The cluster's nodes and health, decommissioning a broker, dynamic broker configs (admin
    /// HTTP API).
    Cluster(crate::admin_cli::cluster::ClusterArgs),
    /// Move partitions between brokers (plans, reassignments, a replication throttle), elect
    /// leaders, delete old records (admin HTTP API).
    Partition(crate::admin_cli::partition::PartitionArgs),
    /// Create, list and delete the users SASL clients log in as (admin HTTP API).
    User(crate::admin_cli::user::UserArgs),
    /// Create, list and delete the ACLs the authorizer decides by (admin HTTP API).
    Acl(crate::admin_cli::acl::AclArgs),
    /// List, set and delete client quotas: byte rates, request time, connection rates (admin
    /// HTTP API).
    Quota(crate::admin_cli::quota::QuotaArgs),
}

impl Command {
    /// The tracing filter used when RUST_LOG is not set.
    pub fn default_log_filter(&self) -> &'static str {
        match self {
            // openraft logs every election and snapshot step at info: warnings are what matter.
            // Its replication logs each failed call to a peer that is down, twice a second; the
            // Raft transport says once when a node stops answering and when it is back.
            Command::Server(_) => {
                "info,openraft=warn,openraft::replication=off,openraft::engine::handler::replication_handler=off"
            }
            // Benchmarks print their own results; only problems should interleave with them.
            Command::Bench(_) => "warn",
            // Client commands print their own results and errors.
            Command::Topic(_)
            | Command::Group(_)
            | Command::Produce(_)
            | Command::Consume(_)
            | Command::Message(_)
            | Command::Cluster(_)
            | Command::Partition(_)
            | Command::User(_)
            | Command::Acl(_)
            | Command::Quota(_) => "warn",
        }
    }
}

const SERVER_LONG_ABOUT: &str = "\
Run a broker that speaks the Kafka protocol: point librdkafka, kafka-python, kcat or the Java
clients at the listener and they work unchanged. Without cluster settings it is a cluster of one
node. With node.id, process.roles, controller.quorum.voters and a CONTROLLER listener in
`listeners`, it is a node of a cluster (a broker, a controller, or both): see docs/cluster.md.

Settings come from, in increasing priority: built-in defaults, the --config TOML file, WEIR_*
environment variables named after a setting (WEIR_LOG_RETENTION_MS for log.retention.ms), and
the command line (--listen, --data-dir, --set NAME=VALUE). Names are Kafka's wherever Kafka has
the setting; weir.example.toml lists every one with its default. An unknown name or invalid
value stops the broker before it starts, with a message naming the setting and where it was
set. A WEIR_* variable that names no setting is ignored with a warning naming it.

SIGTERM or Ctrl-C: stop accepting connections, finish the requests in progress, flush every
log, write the clean-shutdown marker and exit 0.";

#[derive(Debug, Args)]
pub struct ServerArgs {
    /// TOML file of settings (see weir.example.toml).
    #[arg(long, value_name = "FILE", env = "WEIR_CONFIG")]
    pub config: Option<PathBuf>,

    /// Address of the Kafka listener, host:port (the `listeners` setting). Port 0 picks a free
    /// port, which is then printed and advertised. [default: 127.0.0.1:9092]
    #[arg(long, value_name = "ADDR", env = "WEIR_LISTEN")]
    pub listen: Option<String>,

    /// Data directory (the `log.dirs` setting). [default: ./data]
    #[arg(long, value_name = "DIR", env = "WEIR_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Any setting, Kafka-named: --set log.retention.ms=3600000 --set num.partitions=6.
    /// Repeatable; overrides the file and the environment.
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = parse_setting)]
    pub settings: Vec<(String, String)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn server_parses_settings() {
        let cli = Cli::try_parse_from([
            "weir",
            "server",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            "/tmp/d",
            "--set",
            "num.partitions=3",
            "--set",
            "log.retention.ms = 5",
        ])
        .expect("valid command line");
        let Command::Server(args) = cli.command else { panic!("not server") };
        assert_eq!(args.listen.as_deref(), Some("127.0.0.1:0"));
        assert_eq!(args.settings, vec![("num.partitions".into(), "3".into()), ("log.retention.ms".into(), "5".into())]);
        assert!(Cli::try_parse_from(["weir", "server", "--set", "novalue"]).is_err());
    }
}
