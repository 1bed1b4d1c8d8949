//! Smoke test of `weir bench fetch`: the real binary starts two brokers, reads the log back in
//! both modes and reports positive figures for each.

mod bench_support;

use bench_support::{args, run_bench};

#[test]
fn quick_fetch_bench_reports_both_modes() {
    let (report, stdout) = run_bench(&args(&["fetch", "--quick", "--bytes", "8M", "--rounds", "1"]));
    assert!(stdout.contains("sendfile vs copy"), "no comparison on stdout:\n{stdout}");
    let modes: Vec<&str> = report.as_array().expect("a list").iter().filter_map(|m| m["mode"].as_str()).collect();
    assert_eq!(modes, ["sendfile", "copy"]);
    for mode in report.as_array().expect("a list") {
        let mb_per_s = mode["best_mb_per_s"].as_f64().expect("a number");
        assert!(mb_per_s > 0.0 && mb_per_s.is_finite(), "{mode}");
    }
}
