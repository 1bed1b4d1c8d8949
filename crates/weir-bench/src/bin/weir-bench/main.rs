//! `weir-bench`: an OpenMessaging-style benchmark of Kafka-compatible brokers, measured through
//! librdkafka, several brokers side by side in one run. `weir bench kafka ...` runs this binary.
//!
//! Code map: [`cli`] (flags and the resolved [`cli::Plan`]), [`workload`] (the cases of each
//! workload and how one runs against a target), [`run`] (the producer and consumer threads of a
//! phase), [`kafka`] (librdkafka settings, topics, the message layout), [`stats`] (counters,
//! histograms, 1-second buckets), [`procstat`] (broker CPU and memory from /proc), [`reference`]
//! (the machine's disk and loopback bandwidth), [`report`] (table and JSON), [`svg`] (the chart).
#![forbid(unsafe_code)]

mod cli;
mod kafka;
mod procstat;
mod reference;
mod report;
mod run;
mod stats;
mod svg;
mod workload;

use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Parser;

use crate::cli::{Args, Plan};
use crate::report::{Document, RunResult};

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("weir-bench: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Ok(true) when every run completed cleanly; Ok(false) when a run lost messages or had errors
/// (the results are still printed and written).
fn run(args: &Args) -> anyhow::Result<bool> {
    let plan = Plan::from_args(args)?;
    let started = Instant::now();
    let started_unix_s = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    for (target, pid) in plan.targets.iter().zip(&plan.broker_pids) {
        kafka::check_reachable(&target.name, &target.bootstrap, &plan.client_config)?;
        if let Some(pid) = pid {
            procstat::memory(*pid)
                .with_context(|| format!("--broker-pid {}={pid}: cannot read /proc/{pid}/status", target.name))?;
        }
    }

    let reference = if plan.reference_disk_bytes > 0 {
        eprintln!("measuring the machine: sequential write and loopback TCP bandwidth ...");
        let reference =
            reference::measure(plan.data_dir.as_deref(), plan.reference_disk_bytes, plan.reference_loopback)?;
        eprintln!(
            "machine: sequential write {:.0} MB/s, loopback TCP {:.0} MB/s",
            reference.disk_write_mb_per_s, reference.loopback_mb_per_s
        );
        Some(reference)
    } else {
        None
    };

    let cases = workload::cases(&plan);
    let mut results: Vec<RunResult> = Vec::new();
    // Case by case, every target in turn: the targets' figures of one case come from the same
    // minutes of the machine.
    for case in &cases {
        for (target, pid) in plan.targets.iter().zip(&plan.broker_pids) {
            let case_started = Instant::now();
            let result = workload::run_case(&plan, case, target, *pid)?;
            eprintln!(
                "{}: {} {}: produce {:.1} MB/s, consume {:.1} MB/s{}{} ({:.1} s)",
                target.name,
                case.workload.name(),
                case.label,
                result.produced.mb_per_s,
                result.consumed.mb_per_s,
                result.e2e_latency.map_or(String::new(), |p| format!(", e2e p99 {:.2} ms", p.p99_ms)),
                if result.complete { "" } else { " (INCOMPLETE)" },
                case_started.elapsed().as_secs_f64()
            );
            results.push(result);
        }
    }

    println!("\n{}", report::table(&results, reference.as_ref()));
    let title = format!(
        "weir-bench {}: {}",
        env!("CARGO_PKG_VERSION"),
        plan.targets.iter().map(|t| format!("{} ({})", t.name, t.bootstrap)).collect::<Vec<_>>().join(" vs ")
    );
    if let Some(path) = &plan.json {
        let document = Document {
            tool: "weir-bench",
            version: env!("CARGO_PKG_VERSION"),
            started_unix_s,
            command: std::env::args().collect(),
            quick: plan.quick,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            reference: reference.as_ref(),
            results: &results,
        };
        report::write_json(path, &document)?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &plan.svg {
        svg::write(path, &results, &title)?;
        eprintln!("wrote {}", path.display());
    }
    eprintln!("done in {:.0} s", started.elapsed().as_secs_f64());
    Ok(results.iter().all(|r| r.complete))
}
