//! A range of a segment file holding whole batches: what `Log::read` returns. The broker sends it
//! to a socket with `sendfile`; tests and non-zero-copy paths read it into memory.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::error::{IoContext, Result};

#[derive(Clone)]
pub struct FileSlice {
    /// The segment's `.log`. Holding it keeps the data readable even if the segment is deleted by
    /// retention meanwhile (deletion only unlinks).
    pub file: Arc<File>,
    pub path: PathBuf,
    pub position: u64,
    pub len: u64,
    /// Base offset of the first batch in the slice.
    pub first_offset: i64,
    /// The offset after the last batch in the slice.
    pub next_offset: i64,
    /// The slice's bytes, when the read that made it has them already (`Log::read_in_memory`).
    pub data: Option<bytes::Bytes>,
}

impl std::fmt::Debug for FileSlice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSlice")
            .field("path", &self.path)
            .field("position", &self.position)
            .field("len", &self.len)
            .field("first_offset", &self.first_offset)
            .field("next_offset", &self.next_offset)
            .finish()
    }
}

impl FileSlice {
    /// The slice's bytes: those the read has (no copy), else read from the file.
    pub fn into_bytes(self) -> Result<bytes::Bytes> {
        match self.data {
            Some(data) => Ok(data),
            None => self.read_to_vec().map(bytes::Bytes::from),
        }
    }

    /// Copies the slice into memory.
    pub fn read_to_vec(&self) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; self.len as usize];
        self.file.read_exact_at(&mut buf, self.position).at(&self.path)?;
        Ok(buf)
    }
}
