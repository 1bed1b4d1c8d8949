//! Deferred removal of deleted segment files.
//!
//! Retention and compaction first rename a segment's files to `*.deleted`, then queue them here;
//! they are unlinked after `file.delete.delay.ms`, so a fetch that already holds a slice of the
//! file finishes sending it. Files left behind by a crash are removed when the log is opened.

use std::path::PathBuf;
use std::sync::Mutex;

use crate::sync::lock;

#[derive(Debug, Default)]
pub struct DeletionQueue {
    pending: Mutex<Vec<(i64, PathBuf)>>,
}

impl DeletionQueue {
    pub fn new() -> DeletionQueue {
        DeletionQueue::default()
    }

    pub fn schedule(&self, paths: Vec<PathBuf>, due_ms: i64) {
        let mut pending = lock(&self.pending);
        pending.extend(paths.into_iter().map(|p| (due_ms, p)));
    }

    /// Unlinks every file due at `now_ms`; returns how many were removed.
    pub fn remove_due(&self, now_ms: i64) -> usize {
        let due: Vec<PathBuf> = {
            let mut pending = lock(&self.pending);
            let (due, keep): (Vec<_>, Vec<_>) = pending.drain(..).partition(|(at, _)| *at <= now_ms);
            *pending = keep;
            due.into_iter().map(|(_, p)| p).collect()
        };
        for path in &due {
            if let Err(e) = std::fs::remove_file(path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), error = %e, "could not remove deleted segment file");
                }
            }
        }
        due.len()
    }

    pub fn len(&self) -> usize {
        lock(&self.pending).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
