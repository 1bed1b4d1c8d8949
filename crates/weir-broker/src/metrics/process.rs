//! The broker process's own resources, read from `/proc/self` at scrape time (Linux, through
//! `weir-proc`). On other systems, or if a file cannot be read, the affected metrics are left
//! out.
//!
//! The names are Prometheus' standard process metrics (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, ...), without Weir's prefix, so that stock dashboards and
//! alerts work unchanged.

use weir_proc::Pid;

use super::text::{Exposition, Kind};

/// What one scrape read; `None` where a source was missing or unreadable.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct ProcessStats {
    pub cpu_seconds: Option<f64>,
    pub(crate) resident_memory_bytes: Option<u64>,
    pub(crate) virtual_memory_bytes: Option<u64>,
    pub threads: Option<u64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub start_time_seconds: Option<f64>,
}

impl ProcessStats {
    /// Reads `/proc/self/{stat,status,fd,limits}` and `/proc/stat`: a few small reads and one
    /// directory listing.
    pub fn read() -> ProcessStats {
        let stat = weir_proc::stat(Pid::SelfProcess);
        let memory = weir_proc::memory(Pid::SelfProcess).unwrap_or_default();
        ProcessStats {
            cpu_seconds: stat.map(|s| s.cpu_seconds()),
            resident_memory_bytes: memory.resident_bytes,
            virtual_memory_bytes: memory.virtual_bytes,
            threads: stat.map(|s| s.threads),
            open_fds: weir_proc::open_fds(Pid::SelfProcess),
            max_fds: weir_proc::max_fds(Pid::SelfProcess),
            start_time_seconds: stat.as_ref().and_then(weir_proc::start_time_seconds),
        }
    }
}

pub(super) fn render(out: &mut Exposition, stats: &ProcessStats) {
    macro_rules! gauge {
        ($field:ident, $name:literal, $kind:expr, $help:literal) => {
            if let Some(value) = stats.$field {
                out.family($name, $kind, $help);
                out.sample($name, &[], value);
            }
        };
    }
    gauge!(cpu_seconds, "process_cpu_seconds_total", Kind::Counter, "Total user and system CPU time spent in seconds.");
    gauge!(resident_memory_bytes, "process_resident_memory_bytes", Kind::Gauge, "Resident memory size in bytes.");
    gauge!(virtual_memory_bytes, "process_virtual_memory_bytes", Kind::Gauge, "Virtual memory size in bytes.");
    gauge!(threads, "process_threads", Kind::Gauge, "Number of OS threads in the process.");
    gauge!(open_fds, "process_open_fds", Kind::Gauge, "Number of open file descriptors.");
    gauge!(max_fds, "process_max_fds", Kind::Gauge, "Maximum number of open file descriptors.");
    gauge!(
        start_time_seconds,
        "process_start_time_seconds",
        Kind::Gauge,
        "Start time of the process since unix epoch in seconds."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_reports_every_value() {
        let stats = ProcessStats::read();
        assert!(stats.cpu_seconds.is_some_and(|s| s >= 0.0), "{stats:?}");
        assert!(stats.resident_memory_bytes.is_some_and(|b| b > 0), "{stats:?}");
        assert!(stats.virtual_memory_bytes >= stats.resident_memory_bytes, "{stats:?}");
        assert!(stats.threads.is_some_and(|t| t >= 1), "{stats:?}");
        assert!(stats.open_fds.is_some_and(|n| n >= 3), "{stats:?}");
        assert!(stats.max_fds >= stats.open_fds, "{stats:?}");
        assert!(stats.start_time_seconds.is_some(), "{stats:?}");
    }

    #[test]
    fn the_names_are_prometheus_standard_ones() {
        let stats = ProcessStats { cpu_seconds: Some(1.5), resident_memory_bytes: Some(10), ..Default::default() };
        let mut out = Exposition::with_capacity(1024);
        render(&mut out, &stats);
        let text = out.finish();
        assert!(text.contains("\nprocess_cpu_seconds_total 1.5\n"), "{text}");
        assert!(text.contains("\nprocess_resident_memory_bytes 10\n"), "{text}");
        assert!(!text.contains("process_open_fds"), "a value not read is left out: {text}");
    }
}
