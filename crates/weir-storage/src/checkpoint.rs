//! Atomic small-file writes and Kafka-style offset checkpoint files.
//!
//! A checkpoint is replaced atomically: write `<name>.tmp`, fsync it, rename over `<name>`, fsync
//! the directory. A crash leaves either the old or the new file, never a mix. The format is
//! Kafka's: a version line (`0`), an entry-count line, then `<topic> <partition> <offset>` lines.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;

use crate::error::{IoContext, Result, StorageError};

/// Writes `contents` to `path` atomically and durably.
pub fn write_atomically(path: &Path, contents: &[u8]) -> Result<()> {
    let tmp = crate::segment::with_suffix(path, ".tmp");
    {
        let mut file = OpenOptions::new().write(true).create(true).truncate(true).open(&tmp).at(&tmp)?;
        file.write_all(contents).at(&tmp)?;
        file.sync_all().at(&tmp)?;
    }
    std::fs::rename(&tmp, path).at(path)?;
    if let Some(dir) = path.parent() {
        fsync_dir(dir)?;
    }
    Ok(())
}

/// fsyncs a directory so that entries created, renamed or removed in it are durable.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).at(dir)
}

/// Per-partition offsets keyed by (topic, partition).
pub(crate) type OffsetMap = BTreeMap<(String, i32), i64>;

pub(crate) fn write_offsets(path: &Path, offsets: &OffsetMap) -> Result<()> {
    let mut text = format!("0\n{}\n", offsets.len());
    for ((topic, partition), offset) in offsets {
        text.push_str(&format!("{topic} {partition} {offset}\n"));
    }
    write_atomically(path, text.as_bytes())
}

/// Reads a checkpoint; a missing file is empty. A malformed file is an error naming it (it was
/// written atomically, so malformed means something other than Weir wrote it).
pub(crate) fn read_offsets(path: &Path) -> Result<OffsetMap> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(OffsetMap::new()),
        Err(e) => return Err(StorageError::io(path, e)),
    };
    let bad = |why: &str| {
        StorageError::io(
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidData, format!("malformed checkpoint: {why}")),
        )
    };
    let mut lines = text.lines();
    if lines.next() != Some("0") {
        return Err(bad("unknown version"));
    }
    let count: usize = lines.next().and_then(|l| l.parse().ok()).ok_or_else(|| bad("bad entry count"))?;
    let mut offsets = OffsetMap::new();
    for line in lines.by_ref().take(count) {
        let mut parts = line.rsplitn(3, ' ');
        let offset = parts.next().and_then(|p| p.parse().ok()).ok_or_else(|| bad(line))?;
        let partition = parts.next().and_then(|p| p.parse().ok()).ok_or_else(|| bad(line))?;
        let topic = parts.next().ok_or_else(|| bad(line))?;
        offsets.insert((topic.to_string(), partition), offset);
    }
    if offsets.len() != count {
        return Err(bad("fewer entries than announced"));
    }
    Ok(offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_round_trip_and_replace_atomically() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("recovery-point-offset-checkpoint");
        assert!(read_offsets(&path).expect("missing is empty").is_empty());
        let mut offsets = OffsetMap::new();
        offsets.insert(("orders".into(), 0), 42);
        offsets.insert(("my topic-with-dash".into(), 3), 7);
        write_offsets(&path, &offsets).expect("write");
        assert_eq!(read_offsets(&path).expect("read"), offsets);
        assert!(!crate::segment::with_suffix(&path, ".tmp").exists());
    }

    #[test]
    fn malformed_checkpoint_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cp");
        std::fs::write(&path, "0\n2\norders 0 1\n").expect("write");
        assert!(read_offsets(&path).is_err());
    }
}
