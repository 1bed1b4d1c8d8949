//! The broker process's own resources, read from `/proc/self` at scrape time (Linux). On other
//! systems, or if a file cannot be read, the affected metrics are left out.
//!
//! The names mirror Prometheus' standard process collector (`process_cpu_seconds_total`, ...)
//! under the `weir_` prefix.

use super::text::{Exposition, Kind};

/// Clock ticks per second of `/proc/<pid>/stat` times: `USER_HZ`, which Linux fixes at 100 for
/// user space on every architecture it still supports (the kernel's `HZ` may differ; the
/// values are scaled). Reading it with `sysconf(_SC_CLK_TCK)` would need `unsafe` here.
const USER_HZ: f64 = 100.0;

/// What one scrape read; `None` where a source was missing or unreadable.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: Option<f64>,
    pub resident_memory_bytes: Option<u64>,
    pub virtual_memory_bytes: Option<u64>,
    pub threads: Option<u64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub start_time_seconds: Option<f64>,
}

impl ProcessStats {
    /// Reads `/proc/self/{stat,status,fd,limits}` and `/proc/stat`: a few small reads and one
    /// directory listing.
    pub fn read() -> ProcessStats {
        let mut stats = ProcessStats::default();
        if let Ok(text) = std::fs::read_to_string("/proc/self/stat") {
            if let Some(stat) = parse_stat(&text) {
                stats.cpu_seconds = Some((stat.utime_ticks + stat.stime_ticks) as f64 / USER_HZ);
                stats.threads = Some(stat.threads);
                let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|t| parse_boot_time(&t));
                stats.start_time_seconds = boot.map(|b| b as f64 + stat.start_ticks as f64 / USER_HZ);
            }
        }
        if let Ok(text) = std::fs::read_to_string("/proc/self/status") {
            stats.resident_memory_bytes = status_kib(&text, "VmRSS:").map(|kib| kib * 1024);
            stats.virtual_memory_bytes = status_kib(&text, "VmSize:").map(|kib| kib * 1024);
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            // The listing holds the descriptor of the listing itself; leave it out.
            stats.open_fds = Some((dir.count() as u64).saturating_sub(1));
        }
        if let Ok(text) = std::fs::read_to_string("/proc/self/limits") {
            stats.max_fds = parse_max_open_files(&text);
        }
        stats
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
    gauge!(cpu_seconds, "weir_process_cpu_seconds_total", Kind::Counter, "CPU time of the process, user and system.");
    gauge!(resident_memory_bytes, "weir_process_resident_memory_bytes", Kind::Gauge, "Resident set size (VmRSS).");
    gauge!(virtual_memory_bytes, "weir_process_virtual_memory_bytes", Kind::Gauge, "Virtual memory size (VmSize).");
    gauge!(threads, "weir_process_threads", Kind::Gauge, "Threads of the process.");
    gauge!(open_fds, "weir_process_open_fds", Kind::Gauge, "Open file descriptors (sockets, segment and index files).");
    gauge!(max_fds, "weir_process_max_fds", Kind::Gauge, "The soft limit on open file descriptors (RLIMIT_NOFILE).");
    gauge!(
        start_time_seconds,
        "weir_process_start_time_seconds",
        Kind::Gauge,
        "When the process started, in Unix seconds."
    );
}

/// The fields of `/proc/<pid>/stat` used here.
#[derive(Debug, PartialEq, Eq)]
struct Stat {
    utime_ticks: u64,
    stime_ticks: u64,
    threads: u64,
    start_ticks: u64,
}

/// `pid (comm) state ppid ...`: the command name may hold spaces and parentheses, so fields are
/// counted from the last `)`. After it, field 3 (state) is index 0; utime is field 14, stime 15,
/// num_threads 20 and starttime 22 (proc(5)).
fn parse_stat(text: &str) -> Option<Stat> {
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat { utime_ticks: field(14)?, stime_ticks: field(15)?, threads: field(20)?, start_ticks: field(22)? })
}

/// `VmRSS:     1964 kB` → 1964.
fn status_kib(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let mut words = line[key.len()..].split_whitespace();
    let value = words.next()?.parse().ok()?;
    (words.next() == Some("kB")).then_some(value)
}

/// `btime 1795975519` of `/proc/stat`: boot time in Unix seconds.
fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
}

/// The soft limit of `Max open files` in `/proc/<pid>/limits`; `None` if unlimited.
fn parse_max_open_files(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..].split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let text = "32531 (a (weird) name) R 32488 32488 24583 0 -1 4194304 99 0 0 0 250 31 0 0 20 0 7 0 539626 3133440 360 18446744073709551615 0\n";
        assert_eq!(parse_stat(text), Some(Stat { utime_ticks: 250, stime_ticks: 31, threads: 7, start_ticks: 539626 }));
        assert_eq!(parse_stat("12 (x) R 1 2"), None);
        assert_eq!(parse_stat(""), None);
    }

    #[test]
    fn status_limits_and_boot_time_parse() {
        let status = "Name:\tweir\nVmSize:\t    3892 kB\nVmRSS:\t    1964 kB\n";
        assert_eq!(status_kib(status, "VmRSS:"), Some(1964));
        assert_eq!(status_kib(status, "VmSize:"), Some(3892));
        assert_eq!(status_kib(status, "VmSwap:"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            20000                40000                files     \n";
        assert_eq!(parse_max_open_files(limits), Some(20000));
        assert_eq!(
            parse_max_open_files("Max open files            unlimited            unlimited            files\n"),
            None
        );
        assert_eq!(parse_boot_time("cpu  1 2 3\nbtime 1795975519\nprocesses 9\n"), Some(1_795_975_519));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_reports_every_value() {
        let stats = ProcessStats::read();
        assert!(stats.cpu_seconds.is_some_and(|s| s >= 0.0), "{stats:?}");
        assert!(stats.resident_memory_bytes.is_some_and(|b| b > 0), "{stats:?}");
        assert!(stats.virtual_memory_bytes >= stats.resident_memory_bytes, "{stats:?}");
        assert!(stats.threads.is_some_and(|t| t >= 1), "{stats:?}");
        // stdin, stdout and stderr at least.
        assert!(stats.open_fds.is_some_and(|n| n >= 3), "{stats:?}");
        assert!(stats.max_fds >= stats.open_fds, "{stats:?}");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64();
        assert!(stats.start_time_seconds.is_some_and(|t| t <= now + 1.0 && t > now - 86_400.0 * 365.0), "{stats:?}");
    }
}
