//! `weir bench kafka` when the `weir-bench` binary it runs is not built (it is its own workspace
//! member, outside the default build): `--help` still shows the help, with the command that
//! builds weir-bench for the profile of the running `weir`, and a run says the same command.
//!
//! The real `weir` is linked into a scratch directory laid out as cargo lays out its output
//! (`target/<profile>/`), where no weir-bench is, whatever the workspace build left next to the
//! original.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `weir` at `ROOT/target/PROFILE/weir` in a scratch copy of the repository's layout (a
/// Cargo.toml with a crates/weir-bench member); returns the scratch directory and the binary.
fn weir_in_a_target_dir(profile: &str) -> (tempfile::TempDir, PathBuf) {
    // Under cargo's scratch directory for tests: the same file system as the binary, so a hard
    // link works.
    let scratch = tempfile::Builder::new()
        .prefix("weir-bench-kafka-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("scratch dir");
    let root = scratch.path();
    std::fs::write(root.join("Cargo.toml"), "[workspace]\n").expect("Cargo.toml");
    std::fs::create_dir_all(root.join("crates/weir-bench")).expect("crates/weir-bench");
    std::fs::write(root.join("crates/weir-bench/Cargo.toml"), "[package]\n").expect("weir-bench's Cargo.toml");
    let target = root.join("target");
    std::fs::create_dir_all(target.join(profile).join(".fingerprint")).expect("target/PROFILE");
    std::fs::write(target.join("CACHEDIR.TAG"), "Signature: 8a477f597d28d172789f06886806bc55\n").expect("tag");
    let weir = target.join(profile).join("weir");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_weir"), &weir).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_weir"), &weir).expect("copy weir");
    }
    (scratch, weir)
}

/// Runs `weir bench kafka ARGS`, which must exit with `code`; returns what it printed there
/// (stdout for a success, else stderr).
fn run(weir: &Path, args: &[&str], code: i32) -> String {
    let output = Command::new(weir)
        .args(["bench", "kafka"])
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run weir");
    assert_eq!(output.status.code(), Some(code), "{output:?}");
    String::from_utf8_lossy(if code == 0 { &output.stdout } else { &output.stderr }).into_owned()
}

/// The missing binary and the command that builds it, as the message names them.
fn assert_says_how_to_build(text: &str, root: &Path, profile: &str, flag: &str) {
    let root = root.display();
    assert!(text.contains(&format!("{root}/target/{profile}/weir-bench is not built")), "{text}");
    assert!(text.contains(&format!("\n    cd {root} && cargo build{flag} -p weir-bench\n")), "{text}");
}

#[test]
fn bench_kafka_help_without_weir_bench_shows_the_help_and_how_to_build_it() {
    let (scratch, weir) = weir_in_a_target_dir("release");
    let help = run(&weir, &["--help"], 0);
    assert!(help.contains("Usage: weir bench kafka [ARGS]..."), "{help}");
    assert!(help.contains("librdkafka"), "{help}");
    assert_says_how_to_build(&help, scratch.path(), "release", " --release");
    assert_eq!(run(&weir, &["--workload", "all", "-h"], 0), help, "-h anywhere asks for help too");
}

#[test]
fn bench_kafka_without_weir_bench_fails_with_the_build_command_of_its_profile() {
    let (scratch, weir) = weir_in_a_target_dir("debug");
    let error = run(&weir, &["--quick"], 1);
    assert_says_how_to_build(&error, scratch.path(), "debug", "");
}
