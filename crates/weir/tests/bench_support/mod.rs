//! Shared by the `weir bench ...` smoke tests: run the real binary with `--json FILE` and hand
//! back the report and what it printed.

use std::ffi::OsString;
use std::process::Command;

use serde_json::Value;

/// Runs `weir bench ARGS... --json FILE` and fails the test, with everything the command
/// printed, unless it succeeds and writes valid JSON. Returns the report and stdout.
pub fn run_bench(args: &[OsString]) -> (Value, String) {
    let scratch = tempfile::tempdir().expect("tempdir");
    let json_path = scratch.path().join("report.json");
    let output = Command::new(env!("CARGO_BIN_EXE_weir"))
        .arg("bench")
        .args(args)
        .arg("--json")
        .arg(&json_path)
        .env_remove("RUST_LOG")
        .output()
        .expect("run weir");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "weir bench {args:?} failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).expect("JSON report written")).expect("valid JSON");
    (report, stdout)
}

/// `OsString` arguments from string slices.
pub fn args(list: &[&str]) -> Vec<OsString> {
    list.iter().map(OsString::from).collect()
}
