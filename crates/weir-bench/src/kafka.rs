//! `weir bench kafka ...`: runs the `weir-bench` binary that sits next to `weir`, with the same
//! arguments. That binary (`src/bin/weir-bench/`) links librdkafka, which is compiled from C
//! source; `weir` links only this library, built without the `librdkafka` feature, so its build
//! stays fast and free of C.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Subcommand;

use crate::cli::BenchCommand;

/// The file name of the benchmark binary, in the same directory as `weir`.
pub(crate) const BENCH_BINARY: &str = "weir-bench";

#[derive(Debug, clap::Args)]
pub struct KafkaBenchArgs {
    /// Everything after `kafka` goes to weir-bench unchanged.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0.., value_name = "ARGS")]
    pub(crate) args: Vec<OsString>,
}

pub(crate) fn run(args: &KafkaBenchArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the path of this executable")?;
    let bench = bench_path(&exe);
    if bench.is_file() {
        return exec(&bench, &args.args);
    }
    if asks_for_help(&args.args) {
        // weir-bench would list its flags; without it, this command's help and how to build it.
        println!("{}\n\n{}", help().trim_end(), missing_message(&exe, &bench));
        return Ok(());
    }
    anyhow::bail!(missing_message(&exe, &bench))
}

/// The long help of `weir bench kafka`, as `weir bench kafka --help` would show it if clap
/// handled the flag (this command leaves it to weir-bench).
fn help() -> String {
    let mut bench = BenchCommand::augment_subcommands(clap::Command::new("bench")).bin_name("weir bench");
    bench.build();
    bench.find_subcommand_mut("kafka").map(|kafka| kafka.render_long_help().to_string()).unwrap_or_default()
}

/// Whether weir-bench's own command line would show its help: `-h` or `--help` before any `--`.
fn asks_for_help(args: &[OsString]) -> bool {
    args.iter().take_while(|a| *a != "--").any(|a| a == "--help" || a == "-h")
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

/// What to do when weir-bench is not next to `exe`: the exact cargo command that builds it
/// where this `weir` was built, for the same profile (and target triple and target directory);
/// or, for a `weir` that is not in a cargo output directory, where to put weir-bench.
fn missing_message(exe: &Path, bench: &Path) -> String {
    let why = format!(
        "{} is not built. It is a workspace member of its own, outside the default build, because it \
         compiles librdkafka from C source (gcc and make; about a minute).",
        bench.display()
    );
    match cargo_build_command(exe) {
        Some(command) => format!("{why} Build it for this weir with\n    {command}\nthen run this command again."),
        None => format!(
            "{why} Build it in the Weir repository with\n    cargo build --release -p {BENCH_BINARY}\nand \
             put target/release/{BENCH_BINARY} next to this weir, in {}.",
            bench.parent().map_or_else(|| ".".into(), |dir| dir.display().to_string())
        ),
    }
}

/// The command that builds weir-bench into the directory of `exe`, if `exe` sits in a cargo
/// output directory: `TARGET/PROFILE/weir` or `TARGET/TRIPLE/PROFILE/weir`, where cargo keeps a
/// `.fingerprint` directory next to the binaries and a `CACHEDIR.TAG` in TARGET.
fn cargo_build_command(exe: &Path) -> Option<String> {
    let profile_dir = exe.parent()?;
    if !profile_dir.join(".fingerprint").is_dir() {
        return None;
    }
    let profile = profile_dir.file_name()?.to_str()?;
    let above = profile_dir.parent()?;
    let (target_dir, triple) = if above.join("CACHEDIR.TAG").is_file() {
        (above, None)
    } else {
        (above.parent()?, Some(above.file_name()?.to_str()?))
    };
    let mut command = String::from("cargo build");
    match profile {
        "debug" => {}
        "release" => command.push_str(" --release"),
        custom => command.push_str(&format!(" --profile {custom}")),
    }
    if let Some(triple) = triple {
        command.push_str(&format!(" --target {triple}"));
    }
    command.push_str(&format!(" -p {BENCH_BINARY}"));
    // The repository is the target directory's parent, unless CARGO_TARGET_DIR put it elsewhere.
    let repository = target_dir.parent().filter(|root| root.join("crates/weir-bench/Cargo.toml").is_file());
    Some(match repository {
        Some(root) if target_dir.file_name().is_some_and(|name| name == "target") => {
            format!("cd {} && {command}", root.display())
        }
        Some(root) => format!("cd {} && CARGO_TARGET_DIR={} {command}", root.display(), target_dir.display()),
        None => format!("CARGO_TARGET_DIR={} {command}   (in the Weir repository)", target_dir.display()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `dirs` (with a `.fingerprint` each, as cargo's profile directories have) and a
    /// CACHEDIR.TAG in `tagged`, under a scratch directory.
    fn layout(dirs: &[&str], tagged: &str) -> tempfile::TempDir {
        let scratch = tempfile::tempdir().expect("scratch dir");
        for dir in dirs {
            std::fs::create_dir_all(scratch.path().join(dir).join(".fingerprint")).expect("profile dir");
        }
        std::fs::write(scratch.path().join(tagged).join("CACHEDIR.TAG"), "").expect("CACHEDIR.TAG");
        scratch
    }

    fn message_for(exe: &Path) -> String {
        missing_message(exe, &bench_path(exe))
    }

    #[test]
    fn a_weir_outside_a_cargo_directory_is_told_where_weir_bench_goes() {
        let message = message_for(Path::new("/opt/weir/bin/weir"));
        assert!(message.starts_with("/opt/weir/bin/weir-bench is not built."), "{message}");
        assert!(message.contains("cargo build --release -p weir-bench\n"), "{message}");
        assert!(message.contains("put target/release/weir-bench next to this weir, in /opt/weir/bin."), "{message}");
    }

    #[test]
    fn a_custom_profile_and_target_triple_are_in_the_build_command() {
        let scratch = layout(&["target/x86_64-unknown-linux-gnu/perf"], "target");
        std::fs::create_dir_all(scratch.path().join("crates/weir-bench")).expect("crates/weir-bench");
        std::fs::write(scratch.path().join("crates/weir-bench/Cargo.toml"), "").expect("Cargo.toml");
        let message = message_for(&scratch.path().join("target/x86_64-unknown-linux-gnu/perf/weir"));
        let command = format!(
            "\n    cd {} && cargo build --profile perf --target x86_64-unknown-linux-gnu -p weir-bench\n",
            scratch.path().display()
        );
        assert!(message.contains(&command), "{message}");
    }

    #[test]
    fn a_target_directory_elsewhere_is_named_in_the_build_command() {
        let scratch = layout(&["builds/release"], "builds");
        let target = scratch.path().join("builds");
        let message = message_for(&target.join("release/weir"));
        let command = format!("CARGO_TARGET_DIR={} cargo build --release -p weir-bench", target.display());
        assert!(message.contains(&command), "{message}");
    }

    #[test]
    fn run_fails_with_that_message_when_the_binary_is_absent() {
        // The test executable lives in target/<profile>/deps/, where weir-bench never is.
        let exe = std::env::current_exe().unwrap();
        assert!(!bench_path(&exe).exists(), "unexpected {}", bench_path(&exe).display());
        let error = run(&KafkaBenchArgs { args: vec!["--quick".into()] }).unwrap_err().to_string();
        assert!(error.contains("-p weir-bench"), "{error}");
        assert!(error.contains("is not built"), "{error}");
    }

    #[test]
    fn help_is_asked_for_by_either_flag_before_a_double_dash() {
        let args = |list: &[&str]| list.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(asks_for_help(&args(&["--help"])));
        assert!(asks_for_help(&args(&["--quick", "-h"])));
        assert!(!asks_for_help(&args(&["--quick"])));
        assert!(!asks_for_help(&args(&["--", "--help"])));
    }

    #[test]
    fn every_argument_after_kafka_passes_through() {
        use crate::cli::tests::{Cli, Command};
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
    fn the_help_names_the_command_as_weir_nests_it() {
        let help = help();
        assert!(help.contains("Usage: weir bench kafka [ARGS]..."), "{help}");
        assert!(help.contains("Everything after `kafka` goes to weir-bench unchanged"), "{help}");
    }

    #[test]
    fn the_binary_is_looked_for_next_to_weir() {
        assert_eq!(bench_path(Path::new("/usr/local/bin/weir")), PathBuf::from("/usr/local/bin/weir-bench"));
    }
}
