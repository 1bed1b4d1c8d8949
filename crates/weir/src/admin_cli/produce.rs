//! `weir produce TOPIC`: every line of stdin becomes a record.
//!
//! Lines are sent as base64, so any bytes round-trip, in requests of up to `--batch` lines. A
//! reader thread feeds the lines through a bounded channel; a request goes out as soon as the
//! lines read so far are sent and no more arrive within a few milliseconds, so typing one line
//! at a time produces it at once, and a pipe is sent in full batches.

use std::io::{BufRead, Write};
use std::sync::mpsc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use clap::Args;
use weir_admin::api::{Encoding, Headers, ProduceRecord, ProduceRequest, ProduceResponse};

use super::{parse_key_value, print_json, segment, AdminClient, Connection};

/// How long to wait for more lines before sending what has been read.
const LINGER: Duration = Duration::from_millis(5);

#[derive(Debug, Args)]
pub struct ProduceArgs {
    pub topic: String,
    /// Split each line at the first SEP into key and value (a line without SEP has no key).
    #[arg(long, value_name = "SEP")]
    pub key_separator: Option<String>,
    /// Send every record to this partition. [default: by key hash, round-robin without key]
    #[arg(long)]
    pub partition: Option<i32>,
    /// A header on every record: --header source=cli. Repeatable.
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = parse_key_value)]
    pub headers: Vec<(String, String)>,
    /// Most lines per request.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub batch: u32,
    #[command(flatten)]
    pub connection: Connection,
}

/// A line without its terminator (`\n` or `\r\n`).
fn trim_line(mut line: Vec<u8>) -> Vec<u8> {
    if line.last() == Some(&b'\n') {
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    }
    line
}

/// (key, value) of a line.
fn split_line<'a>(line: &'a [u8], separator: Option<&[u8]>) -> (Option<&'a [u8]>, &'a [u8]) {
    let Some(separator) = separator.filter(|s| !s.is_empty()) else { return (None, line) };
    match line.windows(separator.len()).position(|w| w == separator) {
        Some(at) => (Some(&line[..at]), &line[at + separator.len()..]),
        None => (None, line),
    }
}

pub fn run(args: &ProduceArgs) -> anyhow::Result<()> {
    let client = AdminClient::new(&args.connection)?;
    let path = format!("/v1/topics/{}/records", segment(&args.topic));
    let batch = args.batch as usize;
    let headers = Headers(args.headers.iter().map(|(n, v)| (n.clone(), Some(BASE64.encode(v)))).collect());
    let separator = args.key_separator.as_deref().map(str::as_bytes);

    let (lines_tx, lines) = mpsc::sync_channel::<std::io::Result<Vec<u8>>>(batch * 2);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        loop {
            let mut line = Vec::new();
            match stdin.read_until(b'\n', &mut line) {
                Ok(0) => return,
                Ok(_) => {
                    if lines_tx.send(Ok(trim_line(line))).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = lines_tx.send(Err(e));
                    return;
                }
            }
        }
    });

    let mut out = std::io::stdout().lock();
    let mut produced: u64 = 0;
    let mut pending: Vec<Vec<u8>> = Vec::with_capacity(batch);
    let mut open = true;
    while open {
        // Wait for a first line, then take what follows without waiting longer than LINGER.
        match lines.recv() {
            Ok(line) => pending.push(line?),
            Err(_) => open = false,
        }
        while open && pending.len() < batch {
            match lines.recv_timeout(LINGER) {
                Ok(line) => pending.push(line?),
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => open = false,
            }
        }
        if pending.is_empty() {
            continue;
        }
        let records = pending
            .drain(..)
            .map(|line| {
                let (key, value) = split_line(&line, separator);
                ProduceRecord {
                    key: key.map(|k| BASE64.encode(k)),
                    value: Some(BASE64.encode(value)),
                    headers: headers.clone(),
                    partition: args.partition,
                    timestamp: None,
                }
            })
            .collect();
        let response: ProduceResponse = client.post(&path, &ProduceRequest { records, encoding: Encoding::Base64 })?;
        if let Some((partition, error)) =
            response.offsets.iter().find_map(|r| r.error.as_ref().map(|e| (r.partition, e)))
        {
            let ok = response.offsets.iter().filter(|r| r.error.is_none()).count() as u64;
            anyhow::bail!(
                "partition {partition} refused its records: {} ({}); {} record(s) were produced",
                error.message,
                error.code,
                produced + ok
            );
        }
        if args.connection.json {
            for record in &response.offsets {
                print_json(&mut out, record)?;
            }
            out.flush()?;
        }
        produced += response.offsets.len() as u64;
    }
    if !args.connection.json {
        writeln!(out, "produced {produced} record(s) to '{}'", args.topic)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_at_the_first_separator() {
        assert_eq!(split_line(b"k:v:w", Some(b":")), (Some(&b"k"[..]), &b"v:w"[..]));
        assert_eq!(split_line(b"no-sep", Some(b":")), (None, &b"no-sep"[..]));
        assert_eq!(split_line(b"k::v", Some(b"::")), (Some(&b"k"[..]), &b"v"[..]));
        assert_eq!(split_line(b"k:v", None), (None, &b"k:v"[..]));
        assert_eq!(trim_line(b"a\r\n".to_vec()), b"a");
        assert_eq!(trim_line(b"a".to_vec()), b"a");
    }
}
