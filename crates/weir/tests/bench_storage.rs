//! Smoke test of `weir bench storage --quick`: the real binary runs every case, writes the JSON
//! report with positive figures, and leaves nothing behind.

mod bench_support;

use bench_support::{args, run_bench};
use serde_json::Value;

fn positive(value: &Value, what: &str) -> f64 {
    let number = value.as_f64().unwrap_or_else(|| panic!("{what} is not a number: {value}"));
    assert!(number > 0.0 && number.is_finite(), "{what} = {number}, expected a positive number");
    number
}

#[test]
fn quick_storage_bench_reports_every_case() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let bench_dir = scratch.path().join("bench");
    let mut bench_args = args(&["storage", "--quick", "--dir"]);
    bench_args.push(bench_dir.clone().into_os_string());
    let (report, stdout) = run_bench(&bench_args);
    assert!(stdout.contains("Ratios"), "no table on stdout:\n{stdout}");

    assert_eq!(report["settings"]["quick"], Value::Bool(true));
    positive(&report["settings"]["bytes"], "settings.bytes");
    for reference in ["plain_write", "plain_write_fdatasync_each_16kib"] {
        for key in ["bytes", "secs", "mb_per_s", "fsyncs"] {
            positive(&report["reference"][reference][key], &format!("reference.{reference}.{key}"));
        }
    }

    let append = report["append"].as_array().expect("append is an array");
    assert_eq!(append.len(), 12, "2 batch sizes x 2 flush policies x 3 appender counts");
    for batch in ["16 KiB", "1 MiB"] {
        for policy in ["none", "sync"] {
            for appenders in [1, 8, 64] {
                let run = append
                    .iter()
                    .find(|r| r["batch"] == batch && r["policy"] == policy && r["appenders"] == appenders)
                    .unwrap_or_else(|| panic!("no run for {batch} {policy} {appenders}"));
                let what = format!("{batch}/{policy}/{appenders}");
                for key in ["bytes", "batches", "secs", "mb_per_s", "batches_per_s", "fsyncs", "ratio"] {
                    positive(&run[key], &format!("{what}.{key}"));
                }
                if policy == "sync" {
                    let batches = positive(&run["batches"], "batches");
                    let fsyncs = positive(&run["fsyncs"], "fsyncs");
                    assert!(fsyncs <= batches, "{what}: {fsyncs} fsyncs for {batches} batches");
                }
            }
        }
    }

    let read = report["read"].as_array().expect("read is an array");
    assert_eq!(read.len(), 2);
    for run in read {
        for key in ["bytes", "reads", "secs", "mb_per_s"] {
            positive(&run[key], &format!("read.{key}"));
        }
    }

    for key in [
        "none_vs_plain_write",
        "none_vs_plain_write_min",
        "none_vs_plain_write_target",
        "sync_64_vs_1_appender_16kib",
        "sync_64_vs_1_appender_1mib",
        "sync_64_vs_1_appender_target",
    ] {
        positive(&report["ratios"][key], &format!("ratios.{key}"));
    }

    assert!(!bench_dir.exists(), "the benchmark left {} behind", bench_dir.display());
}
