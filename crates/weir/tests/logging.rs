//! The broker's logs (stderr) carry ANSI colour codes only for a person at a terminal: not in a
//! file or a pipe, and not when NO_COLOR is set to a non-empty value (https://no-color.org).
//! Each broker here reads its settings, logs one warning (a misspelt WEIR_* variable) and stops
//! (its port is busy), so nothing waits for anything.

mod admin_support;
mod support;

use std::process::{Command, Stdio};

use admin_support::{scratch_path, start_on_a_busy_port};

const ESC: char = '\u{1b}';
const MISSPELT: (&str, &str) = ("WEIR_NUM_PARTITONS", "3");

#[test]
fn logs_written_to_a_pipe_have_no_colour_codes() {
    let output = start_on_a_busy_port(&[MISSPELT]);
    assert!(output.stderr.contains("WARN"), "the broker logged its warning: {output:?}");
    assert!(!output.stderr.contains(ESC), "colour codes in a pipe: {:?}", output.stderr);
}

/// The same start-up with stderr on a terminal: `script` (util-linux, in every Debian) runs it
/// on a pseudo-terminal and copies what it shows to its stdout.
fn on_a_terminal(no_color: Option<&str>) -> String {
    let scratch = tempfile::Builder::new().prefix("weir-logging-").tempdir().expect("scratch dir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let addr = taken.local_addr().expect("local address");
    let weir = env!("CARGO_BIN_EXE_weir");
    let data_dir = scratch.path().join("data");
    let command = format!(
        "'{weir}' server --listen {addr} --set admin.listeners= --set rocketmq.listeners= --data-dir '{}'",
        scratch_path(&data_dir)
    );
    let mut script = Command::new("script");
    script.args(["--quiet", "--return", "--command", &command, "/dev/null"]);
    for (key, _) in std::env::vars() {
        if key.starts_with("WEIR_") || key == "RUST_LOG" || key == "NO_COLOR" {
            script.env_remove(key);
        }
    }
    script.env(MISSPELT.0, MISSPELT.1);
    if let Some(value) = no_color {
        script.env("NO_COLOR", value);
    }
    let output = script.stdin(Stdio::null()).output().expect("run script(1) from util-linux");
    let shown = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(output.status.code(), Some(1), "{shown}");
    assert!(shown.contains("WEIR_NUM_PARTITONS"), "the broker logged its warning: {shown:?}");
    shown
}

#[test]
fn logs_on_a_terminal_are_coloured_unless_no_color_is_set_and_not_empty() {
    assert!(on_a_terminal(None).contains(ESC), "no colour on a terminal");
    assert!(on_a_terminal(Some("")).contains(ESC), "an empty NO_COLOR does not disable colour");
    let plain = on_a_terminal(Some("1"));
    assert!(!plain.contains(ESC), "colour codes with NO_COLOR=1: {plain:?}");
}
