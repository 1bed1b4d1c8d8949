//! Smoke test of `weir bench tiered`: the real binary starts a broker with tiering on, waits for
//! local retention to leave a quarter on disk, and reads as much from the store as from disk.

mod bench_support;

use bench_support::{args, run_bench};

#[test]
fn quick_tiered_bench_reads_from_the_store_and_from_local_disk() {
    let (report, stdout) =
        run_bench(&args(&["tiered", "--quick", "--bytes", "16M", "--read-ahead", "1M", "--rounds", "1"]));
    assert!(stdout.contains("object store vs local"), "no comparison on stdout:\n{stdout}");
    let sources: Vec<&str> = report.as_array().expect("a list").iter().filter_map(|m| m["source"].as_str()).collect();
    assert_eq!(sources, ["object store", "local disk"]);
    for source in report.as_array().expect("a list") {
        let mb_per_s = source["best_mb_per_s"].as_f64().expect("a number");
        assert!(mb_per_s > 0.0 && mb_per_s.is_finite(), "{source}");
    }
}
