//! Every benchmark of Weir. The library is `weir bench ...`: the `weir` binary parses a
//! [`BenchCommand`] and calls [`run`]. The `weir-bench` binary (`src/bin/weir-bench/`, behind
//! the `librdkafka` feature) is the OpenMessaging-style load generator that `weir bench kafka`
//! runs as a child; it measures any Kafka-compatible broker through librdkafka.
//!
//! Code map: [`cli`] (every command's flags and long help), one module per command
//! (`storage`, `fetch`, `produce`, `kafka`, `metadata`, `partitions`, `replication`, `rocketmq`, `timer` and
//! its `--transactions` variant `transactions`), and what several share: `raw_protocol` (a
//! broker child, admin calls and Fetch loops on top of `weir_harness::kafka_client`) and
//! `rocketmq_client` (the RocketMQ 5 gRPC calls).
//!
//! **Architecture invariant:** the library never links librdkafka; only the binary does, so the
//! `weir` binary, which depends on this crate without default features, never builds it.
//!
//! **API boundary:** [`BenchCommand`] (with the argument types in [`cli`]) and [`run`]. The
//! benchmarks that start brokers start the running executable as `weir server`, so [`run`] is
//! for the `weir` binary only.
#![forbid(unsafe_code)]

pub mod cli;
mod elastic;
mod failover;
mod fetch;
mod kafka;
mod metadata;
mod native;
mod partitions;
mod produce;
mod raw_protocol;
mod replication;
mod rocketmq;
mod rocketmq_client;
mod share_consumer;
mod storage;
mod tiered;
mod timer;
mod tls;
mod transactions;

pub use cli::BenchCommand;

/// Runs one `weir bench` command: prints its results (and writes its `--json` file), and fails
/// if the measurement did.
pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Storage(args) => storage::run(&args),
        BenchCommand::Fetch(args) => fetch::run(&args),
        BenchCommand::Tls(args) => tls::run(&args),
        BenchCommand::Produce(args) => produce::run(&args),
        BenchCommand::Kafka(args) => kafka::run(&args),
        BenchCommand::Failover(args) => failover::run(&args),
        BenchCommand::Elastic(args) => elastic::run(&args),
        BenchCommand::Tiered(args) => tiered::run(&args),
        BenchCommand::Native(args) => native::run(&args),
        BenchCommand::Metadata(args) => metadata::run(&args),
        BenchCommand::Partitions(args) => partitions::run(&args),
        BenchCommand::Replication(args) => replication::run(&args),
        BenchCommand::RocketMq(args) => rocketmq::run(&args),
        BenchCommand::Timer(args) if args.transactions => transactions::run(&args),
        BenchCommand::Timer(args) => timer::run(&args),
    }
}
