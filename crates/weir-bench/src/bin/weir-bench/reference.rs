//! What the machine itself can do, measured in the same run as the brokers: sequential write
//! bandwidth of a directory and loopback TCP bandwidth. A broker's produce MB/s is bounded by the
//! first (with data on disk) and a client's by the second (everything here goes over loopback),
//! so the results read as a fraction of these limits.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

const CHUNK_BYTES: usize = 1 << 20;

#[derive(Debug, Clone, Serialize)]
pub struct Reference {
    /// Sequential write: `disk_bytes` in 1 MiB chunks then one fdatasync, timed together.
    pub disk_write_mb_per_s: f64,
    pub disk_bytes: u64,
    pub disk_dir: PathBuf,
    /// One TCP sender and one receiver on 127.0.0.1, 1 MiB writes.
    pub loopback_mb_per_s: f64,
    pub loopback_seconds: f64,
}

pub fn measure(dir: Option<&Path>, disk_bytes: u64, loopback: Duration) -> anyhow::Result<Reference> {
    let scratch = ScratchDir::open(dir)?;
    let disk_write_mb_per_s = sequential_write(scratch.path(), disk_bytes)?;
    let (loopback_bytes, loopback_elapsed) = loopback_bandwidth(loopback)?;
    Ok(Reference {
        disk_write_mb_per_s,
        disk_bytes,
        disk_dir: scratch.path().to_path_buf(),
        loopback_mb_per_s: loopback_bytes as f64 / 1e6 / loopback_elapsed.as_secs_f64(),
        loopback_seconds: loopback_elapsed.as_secs_f64(),
    })
}

/// The directory to write in: the one asked for (created if missing, removed at the end if this
/// created it), else ./bench-data, else a temporary directory.
struct ScratchDir {
    path: PathBuf,
    created: bool,
    _temp: Option<tempfile::TempDir>,
}

impl ScratchDir {
    fn open(dir: Option<&Path>) -> anyhow::Result<ScratchDir> {
        let wanted = dir.map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("bench-data"));
        let existed = wanted.is_dir();
        match std::fs::create_dir_all(&wanted) {
            Ok(()) => Ok(ScratchDir { path: wanted, created: !existed, _temp: None }),
            Err(e) if dir.is_some() => Err(e).with_context(|| format!("cannot create --data-dir {}", wanted.display())),
            Err(_) => {
                let temp = tempfile::Builder::new().prefix("weir-bench-").tempdir()?;
                Ok(ScratchDir { path: temp.path().to_path_buf(), created: false, _temp: Some(temp) })
            }
        }
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if self.created {
            // Only if empty: never remove what someone else put there.
            let _ = std::fs::remove_dir(&self.path);
        }
    }
}

/// MB/s of writing `bytes` to a new file in `dir` in 1 MiB chunks, fdatasync included.
pub fn sequential_write(dir: &Path, bytes: u64) -> anyhow::Result<f64> {
    let path = dir.join(format!("weir-bench-reference-{}.tmp", std::process::id()));
    let result = (|| {
        let mut file: File = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        // Not zeros, in case the file system compresses or dedups.
        let chunk: Vec<u8> = (0..CHUNK_BYTES).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let started = Instant::now();
        let mut written = 0u64;
        while written < bytes {
            let n = (bytes - written).min(CHUNK_BYTES as u64) as usize;
            file.write_all(&chunk[..n]).with_context(|| format!("cannot write {}", path.display()))?;
            written += n as u64;
        }
        file.sync_data().with_context(|| format!("cannot fdatasync {}", path.display()))?;
        Ok(bytes as f64 / 1e6 / started.elapsed().as_secs_f64())
    })();
    let _ = std::fs::remove_file(&path);
    result
}

/// Bytes received and the time taken by one receiver reading from one sender on 127.0.0.1 for
/// about `duration`.
pub fn loopback_bandwidth(duration: Duration) -> anyhow::Result<(u64, Duration)> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot listen on 127.0.0.1")?;
    let address = listener.local_addr()?;
    let sender = std::thread::spawn(move || -> std::io::Result<()> {
        let mut stream = TcpStream::connect(address)?;
        let chunk = vec![0x5au8; CHUNK_BYTES];
        let started = Instant::now();
        while started.elapsed() < duration {
            stream.write_all(&chunk)?;
        }
        Ok(())
    });
    let (mut stream, _) = listener.accept().context("loopback: no connection")?;
    let mut buffer = vec![0u8; CHUNK_BYTES];
    let mut received = 0u64;
    let started = Instant::now();
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => received += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("loopback: read failed"),
        }
    }
    let elapsed = started.elapsed();
    match sender.join() {
        Ok(result) => result.context("loopback: the sender failed")?,
        Err(_) => anyhow::bail!("loopback: the sender panicked"),
    }
    Ok((received, elapsed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_write_measures_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let mb_per_s = sequential_write(dir.path(), 3 * CHUNK_BYTES as u64 + 100).unwrap();
        assert!(mb_per_s > 0.0);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the reference file was left behind");
    }

    #[test]
    fn loopback_moves_bytes() {
        let (bytes, elapsed) = loopback_bandwidth(Duration::from_millis(100)).unwrap();
        assert!(bytes >= CHUNK_BYTES as u64 && elapsed >= Duration::from_millis(50), "{bytes} in {elapsed:?}");
    }

    #[test]
    fn a_missing_data_dir_is_created_and_removed() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("new");
        let reference = measure(Some(&dir), 1 << 20, Duration::from_millis(50)).unwrap();
        assert!(reference.disk_write_mb_per_s > 0.0 && reference.loopback_mb_per_s > 0.0);
        assert!(!dir.exists());
    }
}
