//! `weir bench kafka ...`: runs the `weir-bench` binary that sits next to this one, with the same
//! arguments. weir-bench is its own crate (`crates/weir-bench`) because it compiles librdkafka
//! from C source; keeping it out of this binary keeps `weir`'s build fast and free of C.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Context;

/// The file name of the benchmark binary, in the same directory as `weir`.
pub const BENCH_BINARY: &str = "weir-bench";

#[derive(Debug, clap::Args)]
pub struct KafkaBenchArgs {
    /// Everything after `kafka` goes to weir-bench unchanged (`weir bench kafka --help` shows
    /// its flags).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0.., value_name = "ARGS")]
    pub args: Vec<OsString>,
}

pub fn run(args: &KafkaBenchArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the path of this executable")?;
    let bench = bench_path(&exe);
    if !bench.is_file() {
        anyhow::bail!(missing_message(&exe, &bench));
    }
    exec(&bench, &args.args)
}

#[cfg(unix)]
fn exec(bench: &Path, args: &[OsString]) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    // Replaces this process: signals, exit status and terminal are weir-bench's own.
    let error = std::process::Command::new(bench).args(args).exec();
    Err(error).with_context(|| format!("cannot run {}", bench.display()))
}

#[cfg(not(unix))]
fn exec(bench: &Path, args: &[OsString]) -> anyhow::Result<()> {
    let status = std::process::Command::new(bench)
        .args(args)
        .status()
        .with_context(|| format!("cannot run {}", bench.display()))?;
    std::process::exit(status.code().unwrap_or(1));
}

fn bench_path(exe: &Path) -> PathBuf {
    exe.with_file_name(BENCH_BINARY)
}

/// What to do when weir-bench is not next to `exe`: the cargo command that builds it for the same
/// profile (a `weir` under target/debug gets the debug build).
fn missing_message(exe: &Path, bench: &Path) -> String {
    let debug = exe.parent().is_some_and(|dir| dir.components().any(|c| c.as_os_str() == "debug"));
    let (flag, dir) = if debug { ("", "debug") } else { (" --release", "release") };
    format!(
        "`weir bench kafka` runs {}, which is missing. It is built on its own because it compiles \
         librdkafka from C source (gcc and make; about a minute): run `cargo build{flag} -p {BENCH_BINARY}` \
         in the Weir repository, then this command again (or run target/{dir}/{BENCH_BINARY} directly).",
        bench.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_missing_binary_error_says_how_to_build_it() {
        let message = missing_message(Path::new("/opt/weir/bin/weir"), Path::new("/opt/weir/bin/weir-bench"));
        assert!(message.contains("/opt/weir/bin/weir-bench"), "{message}");
        assert!(message.contains("`cargo build --release -p weir-bench`"), "{message}");

        let message = missing_message(Path::new("/src/target/debug/weir"), Path::new("/src/target/debug/weir-bench"));
        assert!(message.contains("`cargo build -p weir-bench`"), "{message}");
        assert!(message.contains("target/debug/weir-bench"), "{message}");
    }

    #[test]
    fn run_fails_with_that_message_when_the_binary_is_absent() {
        // The test executable lives in target/<profile>/deps/, where weir-bench never is.
        let exe = std::env::current_exe().unwrap();
        assert!(!bench_path(&exe).exists(), "unexpected {}", bench_path(&exe).display());
        let error = run(&KafkaBenchArgs { args: vec!["--quick".into()] }).unwrap_err().to_string();
        assert!(error.contains("-p weir-bench"), "{error}");
        assert!(error.contains("is missing"), "{error}");
    }

    #[test]
    fn every_argument_after_kafka_passes_through() {
        use crate::cli::{BenchCommand, Cli, Command};
        use clap::Parser;
        let given = ["--bootstrap", "weir=127.0.0.1:9092", "--quick", "--workload", "all", "--help", "-x"];
        let cli = Cli::try_parse_from(["weir", "bench", "kafka"].iter().chain(&given)).expect("valid command line");
        let Command::Bench(BenchCommand::Kafka(args)) = cli.command else { panic!("not bench kafka") };
        assert_eq!(args.args, given.map(OsString::from));
        let cli = Cli::try_parse_from(["weir", "bench", "kafka"]).expect("no arguments is fine too");
        let Command::Bench(BenchCommand::Kafka(args)) = cli.command else { panic!("not bench kafka") };
        assert!(args.args.is_empty());
    }

    #[test]
    fn the_binary_is_looked_for_next_to_weir() {
        assert_eq!(bench_path(Path::new("/usr/local/bin/weir")), PathBuf::from("/usr/local/bin/weir-bench"));
    }
}
