//! Smoke test of `weir bench replication`: three real nodes, the three produce cases, and the
//! two partition moves; the throttled move must not outrun its throttle.

use std::process::Command;

#[test]
fn replication_bench_runs_every_case_and_the_throttle_holds() {
    let output = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["bench", "replication", "--rounds", "1", "--bytes", "1M", "--move-bytes", "8M", "--move-throttle", "2M"])
        .env_remove("RUST_LOG")
        .output()
        .expect("run weir");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "weir bench replication failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    for case in ["1 replica,  acks=1", "3 replicas, acks=1", "3 replicas, acks=all", "unthrottled"] {
        assert!(stdout.contains(case), "no {case:?} line:\n{stdout}");
    }
    // "throttled at   2.1 MB/s      2.9 MB/s (2.91 s): 1.36x the throttle, ..." The first second
    // of budget is a burst, so 8 MB at 2 MB/s may go at up to 8/3 MB/s; never much faster.
    let line = stdout.lines().find(|l| l.starts_with("throttled at")).unwrap_or_else(|| panic!("{stdout}"));
    let ratio: f64 = line
        .split(": ")
        .nth(1)
        .and_then(|rest| rest.split('x').next())
        .and_then(|x| x.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ratio in {line:?}"));
    assert!(ratio < 1.8, "the throttled copy went {ratio}x its throttle: {line}");
}
