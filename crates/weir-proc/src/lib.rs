//! What Linux's `/proc` says about a process: CPU time, memory, memory maps, threads, open file
//! descriptors and start time. One parser of `/proc/<pid>/{stat,status,fd,limits,maps}`,
//! `/proc/stat` and `/proc/sys/vm/max_map_count` for the broker's process metrics and the
//! benchmarks (which read the broker's and their own).
//!
//! Every reader returns `None` when the file is missing or does not parse (another OS, a process
//! that exited): callers leave the figure out rather than fail.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used)]

/// Clock ticks per second of `/proc/<pid>/stat` times: `USER_HZ`, which Linux fixes at 100 for
/// user space on every architecture it still supports (the kernel's `HZ` may differ; the values
/// are scaled). Reading it with `sysconf(_SC_CLK_TCK)` would need `unsafe` and a libc call.
pub(crate) const USER_HZ: f64 = 100.0;

/// Which process: this one, or another by pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pid {
    SelfProcess,
    Of(u32),
}

impl Pid {
    fn path(self, file: &str) -> String {
        match self {
            Pid::SelfProcess => format!("/proc/self/{file}"),
            Pid::Of(pid) => format!("/proc/{pid}/{file}"),
        }
    }
}

/// The fields of `/proc/<pid>/stat` used here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub(crate) utime_ticks: u64,
    pub(crate) stime_ticks: u64,
    pub threads: u64,
    /// When the process started, in ticks after boot.
    pub(crate) start_ticks: u64,
}

impl Stat {
    /// User + system CPU seconds, all threads together.
    pub fn cpu_seconds(&self) -> f64 {
        (self.utime_ticks + self.stime_ticks) as f64 / USER_HZ
    }
}

/// `pid (comm) state ppid ...`: the command name may hold spaces and parentheses, so fields are
/// counted from the last `)`. After it, field 3 (state) is index 0; utime is field 14, stime 15,
/// num_threads 20 and starttime 22 (proc(5)).
pub(crate) fn parse_stat(text: &str) -> Option<Stat> {
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat { utime_ticks: field(14)?, stime_ticks: field(15)?, threads: field(20)?, start_ticks: field(22)? })
}

/// `/proc/<pid>/stat`, parsed.
pub fn stat(pid: Pid) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(pid.path("stat")).ok()?)
}

/// User + system CPU seconds of the process so far.
pub fn cpu_seconds(pid: Pid) -> Option<f64> {
    stat(pid).map(|s| s.cpu_seconds())
}

/// A `Vm*:` line of a `/proc/<pid>/status` text in bytes: `VmRSS:     1964 kB` → 1964 × 1024.
pub(crate) fn parse_status_bytes(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.split(':').next() == Some(field))?;
    let mut words = line[field.len() + 1..].split_whitespace();
    let kib: u64 = words.next()?.parse().ok()?;
    (words.next() == Some("kB")).then_some(kib * 1024)
}

/// Memory of the process from `/proc/<pid>/status`, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    /// Resident now (VmRSS).
    pub resident_bytes: Option<u64>,
    /// The resident peak over the process's life (VmHWM).
    pub resident_peak_bytes: Option<u64>,
    /// Virtual size (VmSize).
    pub virtual_bytes: Option<u64>,
}

pub(crate) fn parse_memory(text: &str) -> Memory {
    Memory {
        resident_bytes: parse_status_bytes(text, "VmRSS"),
        resident_peak_bytes: parse_status_bytes(text, "VmHWM"),
        virtual_bytes: parse_status_bytes(text, "VmSize"),
    }
}

pub fn memory(pid: Pid) -> Option<Memory> {
    Some(parse_memory(&std::fs::read_to_string(pid.path("status")).ok()?))
}

/// Open file descriptors (sockets, files) of the process.
pub fn open_fds(pid: Pid) -> Option<u64> {
    let dir = std::fs::read_dir(pid.path("fd")).ok()?;
    let count = dir.count() as u64;
    // Listing our own descriptors opens one more for the listing itself.
    Some(if pid == Pid::SelfProcess { count.saturating_sub(1) } else { count })
}

/// The soft limit of `Max open files` in a `/proc/<pid>/limits` text; `None` if unlimited.
pub(crate) fn parse_max_open_files(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..].split_whitespace().next()?.parse().ok()
}

pub fn max_fds(pid: Pid) -> Option<u64> {
    parse_max_open_files(&std::fs::read_to_string(pid.path("limits")).ok()?)
}

/// Memory maps of the process (lines of `/proc/<pid>/maps`): what `vm.max_map_count` limits.
pub fn memory_maps(pid: Pid) -> Option<u64> {
    let text = std::fs::read_to_string(pid.path("maps")).ok()?;
    Some(text.lines().count() as u64)
}

/// The most memory maps a process may have (`/proc/sys/vm/max_map_count`, 65,530 unless the
/// machine raised it).
pub fn max_memory_maps() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/vm/max_map_count").ok()?.trim().parse().ok()
}

/// `btime 1795975519` of a `/proc/stat` text: boot time in Unix seconds.
pub(crate) fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
}

/// When the process started, in Unix seconds.
pub fn start_time_seconds(stat: &Stat) -> Option<f64> {
    let boot = parse_boot_time(&std::fs::read_to_string("/proc/stat").ok()?)?;
    Some(boot as f64 + stat.start_ticks as f64 / USER_HZ)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let text = "32531 (a (weird) name) R 32488 32488 24583 0 -1 4194304 99 0 0 0 250 31 0 0 20 0 7 0 539626 3133440 360 18446744073709551615 0\n";
        let stat = parse_stat(text).expect("parses");
        assert_eq!(stat, Stat { utime_ticks: 250, stime_ticks: 31, threads: 7, start_ticks: 539626 });
        assert!((stat.cpu_seconds() - 2.81).abs() < 1e-9);
        assert_eq!(parse_stat("12 (x) R 1 2"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn status_limits_and_boot_time_parse() {
        let status = "Name:\tweir\nVmPeak:\t  999 kB\nVmSize:\t    3892 kB\nVmHWM:\t   2048 kB\nVmRSS:\t    1964 kB\n";
        let memory = parse_memory(status);
        assert_eq!(memory.resident_bytes, Some(1964 * 1024));
        assert_eq!(memory.resident_peak_bytes, Some(2048 * 1024));
        assert_eq!(memory.virtual_bytes, Some(3892 * 1024));
        assert_eq!(parse_status_bytes(status, "VmSwap"), None);
        assert_eq!(parse_memory("Name: kthread\n"), Memory::default());
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
    fn this_process_reads_the_same_by_self_and_by_pid() {
        let by_pid = Pid::Of(std::process::id());
        let stat = stat(Pid::SelfProcess).expect("own stat");
        assert!(stat.threads >= 1);
        assert_eq!(super::stat(by_pid).map(|s| s.start_ticks), Some(stat.start_ticks));
        assert!(memory(by_pid).and_then(|m| m.resident_bytes).is_some_and(|b| b > 0));
        assert!(open_fds(Pid::SelfProcess).is_some_and(|n| n >= 3), "stdin, stdout and stderr at least");
        assert!(max_fds(Pid::SelfProcess) >= open_fds(Pid::SelfProcess));
        // The executable, the heap and the stack at least; never more than the machine allows.
        let maps = memory_maps(by_pid).expect("own maps");
        assert!(maps >= 3 && max_memory_maps().is_none_or(|max| maps <= max), "{maps} maps");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64();
        assert!(start_time_seconds(&stat).is_some_and(|t| t <= now + 1.0 && t > now - 86_400.0 * 365.0));
    }
}
