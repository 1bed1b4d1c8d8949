//! A process's CPU time and memory, read from /proc (Linux): the broker's, and the benchmark's own
//! (the clients), so a run shows which side the machine's CPU went to.

use std::time::Instant;

use serde::Serialize;

/// Linux reports utime and stime in USER_HZ ticks, 100 per second on every supported platform.
const TICKS_PER_SECOND: f64 = 100.0;

/// User + system CPU seconds of `pid` so far, from /proc/PID/stat.
pub fn cpu_seconds(pid: u32) -> std::io::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_cpu_seconds(&stat)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("unexpected /proc/{pid}/stat")))
}

fn parse_cpu_seconds(stat: &str) -> Option<f64> {
    // "pid (comm) state ppid ...": the command may hold spaces and parentheses, so split after the
    // last ')'. utime and stime are fields 14 and 15 of the line, 12th and 13th after the name.
    let (_, after) = stat.rsplit_once(')')?;
    let mut fields = after.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / TICKS_PER_SECOND)
}

/// Resident set size now (VmRSS) and its peak over the process's life (VmHWM), in bytes, from
/// /proc/PID/status.
pub fn memory(pid: u32) -> std::io::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    parse_memory(&status)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("no VmRSS in /proc/{pid}/status")))
}

fn parse_memory(status: &str) -> Option<(u64, u64)> {
    let kib = |name: &str| {
        status.lines().find_map(|line| line.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
    };
    Some((kib("VmRSS:")? * 1024, kib("VmHWM:")? * 1024))
}

/// A process's figures over one run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ProcessUsage {
    pub pid: u32,
    /// CPU time over wall time: 100 is one core busy for the whole run.
    pub cpu_percent: f64,
    pub cpu_seconds: f64,
    /// Highest VmRSS seen while sampling during the run.
    pub rss_peak_bytes: u64,
    /// VmHWM at the end: the peak over the broker's whole life so far.
    pub vm_hwm_bytes: u64,
}

/// Samples one process during a run.
#[derive(Debug)]
pub struct ProcessMonitor {
    pid: u32,
    started: Instant,
    cpu_start: f64,
    rss_peak_bytes: u64,
    /// (time in ns since the phase's epoch, VmRSS bytes) of every sample.
    rss_samples: Vec<(u64, u64)>,
}

impl ProcessMonitor {
    pub fn start(pid: u32) -> std::io::Result<ProcessMonitor> {
        let cpu_start = cpu_seconds(pid)?;
        let (rss, _) = memory(pid)?;
        Ok(ProcessMonitor { pid, started: Instant::now(), cpu_start, rss_peak_bytes: rss, rss_samples: Vec::new() })
    }

    /// Reads VmRSS at `at_ns` (phase time); call it often (every few hundred milliseconds) to
    /// catch the peak.
    pub fn sample(&mut self, at_ns: u64) {
        if let Ok((rss, _)) = memory(self.pid) {
            self.rss_peak_bytes = self.rss_peak_bytes.max(rss);
            self.rss_samples.push((at_ns, rss));
        }
    }

    /// The figures, and the RSS samples over time.
    pub fn finish(self) -> std::io::Result<(ProcessUsage, Vec<(u64, u64)>)> {
        let cpu_seconds = cpu_seconds(self.pid)? - self.cpu_start;
        let wall = self.started.elapsed().as_secs_f64().max(1e-3);
        let (rss, vm_hwm_bytes) = memory(self.pid)?;
        let usage = ProcessUsage {
            pid: self.pid,
            cpu_percent: cpu_seconds / wall * 100.0,
            cpu_seconds,
            rss_peak_bytes: self.rss_peak_bytes.max(rss),
            vm_hwm_bytes,
        };
        Ok((usage, self.rss_samples))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_a_tricky_command_name() {
        let stat = "4242 (weir (x) y) S 1 4242 4242 0 -1 4194560 1200 0 0 0 250 75 0 0 20 0 9 0 100 1000 200";
        assert_eq!(parse_cpu_seconds(stat), Some(3.25));
        assert_eq!(parse_cpu_seconds("garbage"), None);
    }

    #[test]
    fn parses_status_memory_lines() {
        let status = "Name:\tweir\nVmPeak:\t  999 kB\nVmHWM:\t   2048 kB\nVmRSS:\t    1024 kB\n";
        assert_eq!(parse_memory(status), Some((1024 * 1024, 2048 * 1024)));
        assert_eq!(parse_memory("Name: kthread\n"), None);
    }

    #[test]
    fn reads_this_process() {
        let pid = std::process::id();
        let mut monitor = ProcessMonitor::start(pid).unwrap();
        let spin = Instant::now();
        let mut x = 0u64;
        while spin.elapsed().as_millis() < 50 {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        monitor.sample(1);
        let (usage, samples) = monitor.finish().unwrap();
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].0, 1);
        assert!(x > 0);
        assert!(usage.rss_peak_bytes > 0 && usage.vm_hwm_bytes >= usage.rss_peak_bytes / 2, "{usage:?}");
        assert!(usage.cpu_percent >= 0.0, "{usage:?}");
    }
}
