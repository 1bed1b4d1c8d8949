//! `weir`: the broker's command line. Subcommands are declared in [`cli`] and run by their own
//! modules, `weir bench ...` by the weir-bench library ([`weir_bench::run`]).
#![deny(unsafe_code)]

mod admin_cli;
mod alloc;
mod cli;
mod logging;
mod server;
mod settings;

use clap::{CommandFactory, FromArgMatches};

use crate::cli::{Cli, Command};

#[global_allocator]
static ALLOCATOR: alloc::WeirAllocator = alloc::WeirAllocator;

fn main() -> anyhow::Result<()> {
    let malloc_tuned = alloc::keep_freed_memory();
    // As Cli::parse, keeping the matches: they tell a flag from its environment variable.
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut Cli::command()).exit());
    logging::init(cli.command.default_log_filter());
    if !malloc_tuned {
        tracing::warn!("glibc refused the malloc thresholds: request buffers are not reused");
    }
    match cli.command {
        Command::Server(args) => server::run(&args, matches.subcommand_matches("server")),
        Command::Bench(command) => weir_bench::run(command),
        Command::Topic(args) => admin_cli::finish(admin_cli::topic::run(&args)),
        Command::Group(args) => admin_cli::finish(admin_cli::group::run(&args)),
        Command::User(args) => admin_cli::finish(
            admin_cli::require_admin_api(&args.connection, "user", "users are managed through the admin API")
                .and_then(|()| admin_cli::user::run(&args)),
        ),
        Command::Acl(args) => admin_cli::finish(
            admin_cli::require_admin_api(&args.connection, "acl", "ACLs are managed through the admin API")
                .and_then(|()| admin_cli::acl::run(&args)),
        ),
        Command::Quota(args) => admin_cli::finish(
            admin_cli::require_admin_api(&args.connection, "quota", "quotas are managed through the admin API")
                .and_then(|()| admin_cli::quota::run(&args)),
        ),
        Command::Produce(args) => admin_cli::finish(admin_cli::produce::run(&args)),
        Command::Consume(args) => admin_cli::finish(admin_cli::consume::run(&args)),
        Command::Message(args) => admin_cli::finish(
            admin_cli::require_admin_api(&args.connection, "message", admin_cli::MESSAGE_NEEDS_ADMIN)
                .and_then(|()| admin_cli::message::run(&args)),
        ),
        Command::Cluster(args) => admin_cli::finish(
            admin_cli::require_admin_api(&args.connection, "cluster", admin_cli::CLUSTER_NEEDS_ADMIN)
                .and_then(|()| admin_cli::cluster::run(&args)),
        ),
        Command::Partition(args) => admin_cli::finish(
            admin_cli::require_admin_api(&args.connection, "partition", admin_cli::PARTITION_NEEDS_ADMIN)
                .and_then(|()| admin_cli::partition::run(&args)),
        ),
    }
}
