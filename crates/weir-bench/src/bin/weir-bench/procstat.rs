//! A process's CPU time and memory, read from /proc (Linux): the broker's, and the benchmark's own
//! (the clients), so a run shows which side the machine's CPU went to.

use std::time::Instant;

use serde::Serialize;
use weir_proc::Pid;

/// User + system CPU seconds of `pid` so far.
pub fn cpu_seconds(pid: u32) -> std::io::Result<f64> {
    weir_proc::cpu_seconds(Pid::Of(pid)).ok_or_else(|| unreadable(pid, "stat"))
}

/// Resident set size now (VmRSS) and its peak over the process's life (VmHWM), in bytes.
pub fn memory(pid: u32) -> std::io::Result<(u64, u64)> {
    let memory = weir_proc::memory(Pid::Of(pid)).ok_or_else(|| unreadable(pid, "status"))?;
    memory.resident_bytes.zip(memory.resident_peak_bytes).ok_or_else(|| unreadable(pid, "status"))
}

fn unreadable(pid: u32, file: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("cannot read /proc/{pid}/{file}"))
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
