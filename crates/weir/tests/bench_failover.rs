//! Smoke test of `weir bench failover`: three real nodes, a broker and then the controller
//! killed once each, and every partition's stall reported and bounded.

use std::process::Command;

#[test]
fn failover_bench_kills_a_broker_and_the_controller_and_every_partition_recovers() {
    let json = tempfile::NamedTempFile::new().expect("temp file");
    let output = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["bench", "failover", "--rounds", "1", "--partitions", "3", "--json"])
        .arg(json.path())
        .env_remove("RUST_LOG")
        .output()
        .expect("run weir");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "weir bench failover failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(json.path()).expect("read the JSON")).expect("JSON");
    let stalls = &report["liveness watch"];
    let count = |kind: &str| stalls[kind].as_array().map_or(0, Vec::len);
    // 3 partitions, each node leading one: one led and two followed per kill.
    assert_eq!((count("led"), count("followed")), (1, 2), "{stdout}");
    assert_eq!((count("controller_led"), count("controller_followed")), (1, 2), "{stdout}");
    // Loose bounds for a debug build on a busy machine: without the liveness watch a follower's
    // partitions alone stall for the 9 s session timeout.
    for kind in ["led", "followed", "controller_led", "controller_followed"] {
        for stall in stalls[kind].as_array().into_iter().flatten() {
            let seconds = stall.as_f64().expect("seconds");
            assert!(seconds < 8.5, "{kind}: a stall of {seconds} s\n{stdout}");
        }
    }
}
