//! `weir`: the broker's command line. Subcommands are declared in [`cli`] and run by their own
//! modules.
#![deny(unsafe_code)]

mod admin_cli;
mod alloc;
mod bench;
mod cli;
mod server;
mod settings;

use std::ffi::OsStr;
use std::io::IsTerminal;

use clap::{CommandFactory, FromArgMatches};
use tracing_subscriber::EnvFilter;

use crate::cli::{BenchCommand, Cli, Command};

#[global_allocator]
static ALLOCATOR: alloc::WeirAllocator = alloc::WeirAllocator;

fn main() -> anyhow::Result<()> {
    let malloc_tuned = alloc::keep_freed_memory();
    // As Cli::parse, keeping the matches: they tell a flag from its environment variable.
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut Cli::command()).exit());
    init_tracing(cli.command.default_log_filter());
    if !malloc_tuned {
        tracing::warn!("glibc refused the malloc thresholds: request buffers are not reused");
    }
    match cli.command {
        Command::Server(args) => server::run(&args, matches.subcommand_matches("server")),
        Command::Bench(BenchCommand::Storage(args)) => bench::storage::run(&args),
        Command::Bench(BenchCommand::Fetch(args)) => bench::fetch::run(&args),
        Command::Bench(BenchCommand::Produce(args)) => bench::produce::run(&args),
        Command::Bench(BenchCommand::Kafka(args)) => bench::kafka::run(&args),
        Command::Bench(BenchCommand::Metadata(args)) => bench::metadata::run(&args),
        Command::Bench(BenchCommand::Replication(args)) => bench::replication::run(&args),
        Command::Bench(BenchCommand::RocketMq(args)) => bench::rocketmq::run(&args),
        Command::Bench(BenchCommand::Timer(args)) if args.transactions => bench::transactions::run(&args),
        Command::Bench(BenchCommand::Timer(args)) => bench::timer::run(&args),
        Command::Topic(args) => admin_cli::finish(admin_cli::topic::run(&args)),
        Command::Group(args) => admin_cli::finish(admin_cli::group::run(&args)),
        Command::Produce(args) => admin_cli::finish(admin_cli::produce::run(&args)),
        Command::Consume(args) => admin_cli::finish(admin_cli::consume::run(&args)),
        Command::Message(args) => admin_cli::finish(admin_cli::message::run(&args)),
        Command::Cluster(args) => admin_cli::finish(admin_cli::cluster::run(&args)),
        Command::Partition(args) => admin_cli::finish(admin_cli::partition::run(&args)),
    }
}

/// Logs to stderr, filtered by RUST_LOG, or by `default_filter` when RUST_LOG is unset.
fn init_tracing(default_filter: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let colour = log_colour(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref());
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(colour).with_writer(std::io::stderr).init();
}

/// Whether the logs carry ANSI colour codes: only for a person at a terminal (a file or a pipe
/// gets plain text), and not when NO_COLOR is set to a non-empty value (https://no-color.org).
fn log_colour(stderr_is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(OsStr::is_empty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_are_coloured_only_on_a_terminal_without_no_color() {
        assert!(log_colour(true, None));
        assert!(log_colour(true, Some(OsStr::new(""))), "an empty NO_COLOR does not count");
        assert!(!log_colour(true, Some(OsStr::new("1"))));
        assert!(!log_colour(false, None));
        assert!(!log_colour(false, Some(OsStr::new(""))));
    }
}
