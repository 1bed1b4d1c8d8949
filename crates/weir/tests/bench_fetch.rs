//! Smoke test of `weir bench fetch`: the real binary starts two brokers, reads the log back in
//! both modes and reports positive figures for each.

use std::process::Command;

use serde_json::Value;

#[test]
fn quick_fetch_bench_reports_both_modes() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let json_path = scratch.path().join("report.json");
    let output = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["bench", "fetch", "--quick", "--bytes", "8M", "--rounds", "1", "--json"])
        .arg(&json_path)
        .env_remove("RUST_LOG")
        .output()
        .expect("run weir");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "weir bench fetch failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    assert!(stdout.contains("sendfile vs copy"), "no comparison on stdout:\n{stdout}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).expect("JSON report written")).expect("valid JSON");
    let modes: Vec<&str> = report.as_array().expect("a list").iter().filter_map(|m| m["mode"].as_str()).collect();
    assert_eq!(modes, ["sendfile", "copy"]);
    for mode in report.as_array().expect("a list") {
        let mb_per_s = mode["best_mb_per_s"].as_f64().expect("a number");
        assert!(mb_per_s > 0.0 && mb_per_s.is_finite(), "{mode}");
    }
}
