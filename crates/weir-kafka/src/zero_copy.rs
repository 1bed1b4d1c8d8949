//! Writing responses, with record data sent from segment files by `sendfile(2)`.
//!
//! A Fetch response is encoded by the `kafka-protocol` crate like any other, except that each
//! partition's `records` field holds a 16-byte placeholder: a per-process random nonce and the
//! index of the file range it stands for. The encoded buffer (headers only, small) is then cut
//! at each placeholder, the placeholder's length prefix is re-encoded for the real length, and
//! the file range is spliced in as a `Chunk::File`. The writer sends bytes chunks with
//! `write_all` and file chunks with `sendfile`, so record data never enters user space.

use std::hash::{BuildHasher, Hasher};
use std::os::fd::AsRawFd;
use std::sync::OnceLock;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::tcp::OwnedWriteHalf;
use weir_storage::FileSlice;

use crate::frame::{Chunk, ResponseFrame};

pub(crate) const PLACEHOLDER_LEN: usize = 16;

fn nonce() -> u64 {
    static NONCE: OnceLock<u64> = OnceLock::new();
    *NONCE.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(std::process::id() as u64);
        h.finish()
    })
}

/// The placeholder for file range number `index` of a response.
pub fn placeholder(index: usize) -> Bytes {
    let mut b = BytesMut::with_capacity(PLACEHOLDER_LEN);
    b.put_u64(nonce());
    b.put_u64(index as u64);
    b.freeze()
}

/// Turns an encoded response holding placeholders `0..files.len()`, in order, into chunks.
/// `compact` says whether the records fields were encoded as COMPACT_RECORDS (unsigned varint
/// length + 1, flexible versions) or RECORDS (int32 length). Also fixes the frame's size prefix.
pub fn splice_files(mut encoded: BytesMut, files: Vec<FileSlice>, compact: bool) -> Result<ResponseFrame, String> {
    if files.is_empty() {
        return Ok(ResponseFrame { chunks: vec![Chunk::Bytes(encoded.freeze())] });
    }
    let old_prefix_len = if compact { 1 } else { 4 };
    let mut total: usize = encoded.len() - 4;
    for file in &files {
        total = total - PLACEHOLDER_LEN - old_prefix_len
            + length_prefix(file.len as usize, compact).len()
            + file.len as usize;
    }
    let size = i32::try_from(total).map_err(|_| format!("response of {total} bytes is too large"))?;
    encoded[0..4].copy_from_slice(&size.to_be_bytes());
    let encoded = encoded.freeze();

    let mut chunks = Vec::with_capacity(files.len() * 3 + 1);
    let mut cursor = 0usize;
    for (index, file) in files.into_iter().enumerate() {
        let needle = placeholder(index);
        let found = memchr::memmem::find(&encoded[cursor..], &needle)
            .ok_or_else(|| format!("placeholder {index} missing from the encoded response"))?;
        let at = cursor + found;
        if at < cursor + old_prefix_len {
            return Err("placeholder without a length prefix".into());
        }
        chunks.push(Chunk::Bytes(encoded.slice(cursor..at - old_prefix_len)));
        chunks.push(Chunk::Bytes(length_prefix(file.len as usize, compact)));
        if file.len > 0 {
            chunks.push(Chunk::File(file));
        }
        cursor = at + PLACEHOLDER_LEN;
    }
    chunks.push(Chunk::Bytes(encoded.slice(cursor..)));
    Ok(ResponseFrame { chunks })
}

fn length_prefix(len: usize, compact: bool) -> Bytes {
    let mut b = BytesMut::with_capacity(5);
    if compact {
        let mut v = len as u64 + 1;
        while v >= 0x80 {
            b.put_u8((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        b.put_u8(v as u8);
    } else {
        b.put_i32(len as i32);
    }
    b.freeze()
}

/// Where a connection's responses go: the socket itself, where file chunks go out by
/// `sendfile`, or a TLS stream, which must encrypt them in user space (kernel TLS, with which
/// sendfile works on TLS too, is not used yet).
pub(crate) enum ResponseSink {
    Plain(OwnedWriteHalf),
    Tls(tokio::io::WriteHalf<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>),
}

/// Writes a whole response. With `use_sendfile` false, or over TLS, file chunks are read into
/// memory and written like bytes (the comparison path for benchmarks, and for sockets sendfile
/// cannot serve).
pub(crate) async fn write_response(
    out: &mut ResponseSink,
    frame: ResponseFrame,
    use_sendfile: bool,
) -> std::io::Result<()> {
    match out {
        ResponseSink::Plain(out) => {
            for chunk in frame.chunks {
                match chunk {
                    Chunk::Bytes(bytes) => out.write_all(&bytes).await?,
                    Chunk::File(file) if use_sendfile => send_file(out, &file).await?,
                    Chunk::File(file) => out.write_all(&read_file(file).await?).await?,
                }
            }
        }
        ResponseSink::Tls(out) => {
            for chunk in frame.chunks {
                match chunk {
                    Chunk::Bytes(bytes) => out.write_all(&bytes).await?,
                    Chunk::File(file) => out.write_all(&read_file(file).await?).await?,
                }
            }
            // rustls may hold the last record until flushed.
            out.flush().await?;
        }
    }
    Ok(())
}

async fn read_file(file: FileSlice) -> std::io::Result<Vec<u8>> {
    tokio::task::spawn_blocking(move || file.read_to_vec())
        .await
        .map_err(std::io::Error::other)?
        .map_err(std::io::Error::other)
}

async fn send_file(out: &mut OwnedWriteHalf, file: &FileSlice) -> std::io::Result<()> {
    let stream = out.as_ref();
    let socket_fd = stream.as_raw_fd();
    let file_fd = file.file.as_raw_fd();
    let mut offset = file.position as libc::off_t;
    let end = (file.position + file.len) as libc::off_t;
    while offset < end {
        stream.writable().await?;
        let remaining = (end - offset) as usize;
        let result = stream.try_io(Interest::WRITABLE, || {
            // SAFETY: both descriptors are open for the duration of the call (the socket is
            // borrowed, the file is held by `file`), and `offset` is a valid, exclusively
            // borrowed off_t that the kernel advances by the bytes sent.
            #[allow(unsafe_code)]
            let n = unsafe { libc::sendfile(socket_fd, file_fd, &mut offset, remaining) };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match result {
            Ok(0) => {
                // The file ended early (truncated under us): the frame cannot be completed.
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("{} is shorter than the range being sent", file.path.display()),
                ));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_prefix() {
        assert_eq!(&length_prefix(0, true)[..], &[1]);
        assert_eq!(&length_prefix(126, true)[..], &[127]);
        assert_eq!(&length_prefix(127, true)[..], &[0x80, 0x01]);
        assert_eq!(&length_prefix(300, false)[..], &300i32.to_be_bytes());
    }
}
