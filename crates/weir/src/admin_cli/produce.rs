//! `weir produce TOPIC`: every line of stdin becomes a record.
//!
//! Lines are sent as base64, so any bytes round-trip, in requests of up to `--batch` lines. A
//! reader thread feeds the lines through a bounded channel; a request goes out as soon as the
//! lines read so far are sent and no more arrive within a few milliseconds, so typing one line
//! at a time produces it at once, and a pipe is sent in full batches.
//!
//! A request must fit two limits: the admin API's body limit (16 MiB of JSON, base64 included)
//! and the topic's `max.message.bytes`, which each partition's batch must fit (the records of a
//! request go to each partition as one batch). So lines are split into requests whose records,
//! counted at their largest encoded size, would fit in one batch together. If a request fails,
//! the command says how many records were produced before.

use std::io::{BufRead, Read, Write};
use std::sync::mpsc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use clap::Args;
use serde::Serialize;
use weir_admin::api::{Configs, Encoding, Headers, ProduceRecord, ProduceRequest, ProduceResponse};
use weir_admin::BODY_BYTES_MAX;

use super::{kafka, parse_key_value, print_json, segment, AdminClient, Connection};

/// How long to wait for more lines before sending what has been read.
const LINGER: Duration = Duration::from_millis(5);
/// Bytes of a RecordBatch v2 besides its records: the header, baseOffset to recordsCount.
pub(crate) const BATCH_OVERHEAD_BYTES: u64 = 61;
/// Most bytes a record adds to a batch besides its key, value and headers: its length,
/// attributes, timestamp delta, offset delta, key length, value length and header count, each
/// varint at its widest (5 + 1 + 10 + 5 + 5 + 5 + 5). For a 1.5 KB line the true overhead is
/// about 10 bytes, so the bound costs 2 % of a request's size.
const RECORD_OVERHEAD_BYTES_MAX: u64 = 36;
/// The same for each header: the varints of its name's and value's lengths.
const HEADER_OVERHEAD_BYTES_MAX: u64 = 10;
/// Longest line read: base64 makes anything longer too big for a request's body.
const LINE_BYTES_MAX: usize = BODY_BYTES_MAX;
/// Lines read ahead of the requests: enough to keep a pipe flowing, few enough that lines near
/// [`LINE_BYTES_MAX`] hold at most 128 MiB.
const LINES_READ_AHEAD: usize = 8;

#[derive(Debug, Args)]
pub struct ProduceArgs {
    pub topic: String,
    /// Split each line at the first SEP into key and value (a line without SEP has no key).
    #[arg(long, value_name = "SEP")]
    pub key_separator: Option<String>,
    /// Send every record to this partition. [default: by key hash, round-robin without key]
    #[arg(long, conflicts_with = "logical_partition")]
    pub partition: Option<i32>,
    /// Send every record to this logical partition (0 to 65535) of an elastic topic: to the
    /// stable partition that holds it (docs/elastic.md). Admin API, or --native.
    #[arg(long)]
    pub logical_partition: Option<i32>,
    /// A header on every record: --header source=cli. Repeatable.
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = parse_key_value)]
    pub headers: Vec<(String, String)>,
    /// Most lines per request (requests are also cut to fit the topic's max.message.bytes and
    /// the admin API's 16 MiB body limit).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub batch: u32,
    /// Write through Weir's native write protocol (needs --bootstrap): answered once the broker
    /// holds the lines in memory, printing each partition's checkpoint as it moves, resending
    /// exactly what a broker lost when a partition reloads or moves (docs/native-protocol.md).
    #[arg(long, requires = "bootstrap")]
    pub native: bool,
    /// With --native: the sequence number of the first line (each next line adds one).
    #[arg(long, default_value_t = 0, requires = "native")]
    pub first_sequence: u64,
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
pub(crate) fn split_line<'a>(line: &'a [u8], separator: Option<&[u8]>) -> (Option<&'a [u8]>, &'a [u8]) {
    let Some(separator) = separator.filter(|s| !s.is_empty()) else { return (None, line) };
    match line.windows(separator.len()).position(|w| w == separator) {
        Some(at) => (Some(&line[..at]), &line[at + separator.len()..]),
        None => (None, line),
    }
}

pub fn run(args: &ProduceArgs) -> anyhow::Result<()> {
    let batch = args.batch as usize;
    let headers = Headers(args.headers.iter().map(|(n, v)| (n.clone(), Some(BASE64.encode(v)))).collect());
    let separator = args.key_separator.as_deref().map(str::as_bytes);

    let (lines_tx, lines) = mpsc::sync_channel::<anyhow::Result<Vec<u8>>>(LINES_READ_AHEAD);
    std::thread::spawn(move || read_lines(lines_tx));

    if let Some(bootstrap) = &args.connection.bootstrap {
        if args.native {
            return super::native::run(args, bootstrap, lines);
        }
        return run_over_kafka(args, bootstrap, lines);
    }
    let mut sender = Sender::new(args)?;
    let mut pending: Vec<Vec<u8>> = Vec::with_capacity(batch);
    let mut pending_bytes = 0;
    let mut failure = None;
    let mut open = true;
    while open {
        // Wait for a first line, then take what follows without waiting longer than LINGER,
        // up to --batch lines or what one request can carry.
        match lines.recv() {
            Ok(Ok(line)) => {
                pending_bytes = line.len();
                pending.push(line);
            }
            Ok(Err(e)) => failure = Some(e),
            Err(_) => open = false,
        }
        while open && failure.is_none() && pending.len() < batch && pending_bytes < BODY_BYTES_MAX {
            match lines.recv_timeout(LINGER) {
                Ok(Ok(line)) => {
                    pending_bytes += line.len();
                    pending.push(line);
                }
                Ok(Err(e)) => failure = Some(e),
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => open = false,
            }
        }
        let records = pending
            .drain(..)
            .map(|line| {
                let (key, value) = split_line(&line, separator);
                let batch_bytes = record_bytes_max(key, value, &args.headers);
                let record = ProduceRecord {
                    key: key.map(|k| BASE64.encode(k)),
                    value: Some(BASE64.encode(value)),
                    headers: headers.clone(),
                    partition: args.partition,
                    logical_partition: args.logical_partition,
                    timestamp: None,
                };
                (record, batch_bytes)
            })
            .collect();
        // The lines read before a failure to read are produced first, then it is reported.
        sender.send(records)?;
        if let Some(e) = failure {
            return Err(sender.partial(e));
        }
    }
    if !args.connection.json {
        writeln!(sender.out, "produced {} record(s) to '{}'", sender.produced, args.topic)?;
    }
    Ok(())
}

/// `weir produce --bootstrap`: the same reading of stdin, sent as Kafka batches.
fn run_over_kafka(
    args: &ProduceArgs,
    bootstrap: &str,
    lines: mpsc::Receiver<anyhow::Result<Vec<u8>>>,
) -> anyhow::Result<()> {
    let mut sender = kafka::produce::KafkaSender::connect(args, bootstrap)?;
    let mut out = std::io::stdout().lock();
    let batch = args.batch as usize;
    loop {
        let (pending, end, failure) = next_lines(&lines, batch);
        if let Err(e) = sender.send(&pending, &mut out) {
            return Err(sender.partial(e));
        }
        if let Some(e) = failure {
            return Err(sender.partial(e));
        }
        if end {
            break;
        }
    }
    if !args.connection.json {
        writeln!(out, "produced {} record(s) to '{}'", sender.produced, args.topic)?;
    }
    Ok(())
}

/// The lines of one request: a first one waited for, then those that follow within
/// [`LINGER`], up to `batch` lines or what one request can carry. Also whether stdin ended,
/// and a failure to read it (after the lines read before it).
fn next_lines(
    lines: &mpsc::Receiver<anyhow::Result<Vec<u8>>>,
    batch: usize,
) -> (Vec<Vec<u8>>, bool, Option<anyhow::Error>) {
    let mut pending = Vec::new();
    let mut bytes = 0;
    match lines.recv() {
        Ok(Ok(line)) => {
            bytes += line.len();
            pending.push(line);
        }
        Ok(Err(e)) => return (pending, true, Some(e)),
        Err(_) => return (pending, true, None),
    }
    while pending.len() < batch && bytes < BODY_BYTES_MAX {
        match lines.recv_timeout(LINGER) {
            Ok(Ok(line)) => {
                bytes += line.len();
                pending.push(line);
            }
            Ok(Err(e)) => return (pending, true, Some(e)),
            Err(mpsc::RecvTimeoutError::Timeout) => break,
            Err(mpsc::RecvTimeoutError::Disconnected) => return (pending, true, None),
        }
    }
    (pending, false, None)
}

/// Feeds stdin's lines (without terminators) to `lines` until the end, a read error, or a line
/// too long for any request.
fn read_lines(lines: mpsc::SyncSender<anyhow::Result<Vec<u8>>>) {
    let mut stdin = std::io::stdin().lock();
    for number in 1.. {
        let mut line = Vec::new();
        // A line is read up to one byte past the longest that can be sent, not to its end.
        let read = (&mut stdin).take(LINE_BYTES_MAX as u64 + 1).read_until(b'\n', &mut line);
        let item = match read {
            Ok(0) => return,
            Ok(_) if line.len() > LINE_BYTES_MAX => {
                Err(anyhow::anyhow!("{}: it is longer than {} MiB", does_not_fit(number), LINE_BYTES_MAX >> 20))
            }
            Ok(_) => Ok(trim_line(line)),
            Err(e) => Err(anyhow::Error::new(e).context(format!("cannot read line {number} of stdin"))),
        };
        let last = item.is_err();
        if lines.send(item).is_err() || last {
            return;
        }
    }
}

/// The most bytes a record adds to a RecordBatch v2 (uncompressed, as the admin API writes it).
pub(crate) fn record_bytes_max(key: Option<&[u8]>, value: &[u8], headers: &[(String, String)]) -> u64 {
    let header_bytes: u64 = headers.iter().map(|(n, v)| (n.len() + v.len()) as u64 + HEADER_OVERHEAD_BYTES_MAX).sum();
    RECORD_OVERHEAD_BYTES_MAX + key.map_or(0, |k| k.len() as u64) + value.len() as u64 + header_bytes
}

/// The start of the message about a line that no request can carry.
fn does_not_fit(number: u64) -> String {
    format!(
        "line {number} does not fit in one request to the admin API, whose body limit is {} MiB of JSON \
         with values, keys and headers in base64 (lines up to about {} MiB fit)",
        BODY_BYTES_MAX >> 20,
        (BODY_BYTES_MAX / 4 * 3) >> 20
    )
}

/// Sends records in requests that fit both the admin API's body limit and the topic's
/// `max.message.bytes`, and counts what was produced.
struct Sender<'a> {
    args: &'a ProduceArgs,
    client: AdminClient,
    path: String,
    out: std::io::StdoutLock<'static>,
    /// The topic's `max.message.bytes`, read before the first request.
    batch_bytes_max: Option<u64>,
    /// Records the broker took.
    produced: u64,
    /// Lines sent (taken or refused) so far; the next line is number `lines_sent + 1`.
    lines_sent: u64,
}

impl<'a> Sender<'a> {
    fn new(args: &'a ProduceArgs) -> anyhow::Result<Sender<'a>> {
        Ok(Sender {
            args,
            client: AdminClient::new(&args.connection)?,
            path: format!("/v1/topics/{}/records", segment(&args.topic)),
            out: std::io::stdout().lock(),
            batch_bytes_max: None,
            produced: 0,
            lines_sent: 0,
        })
    }

    /// The topic's `max.message.bytes`: each partition's batch of a request must fit in it.
    fn batch_bytes_max(&mut self) -> anyhow::Result<u64> {
        if let Some(max) = self.batch_bytes_max {
            return Ok(max);
        }
        let configs: Configs = self.client.get(&format!("/v1/topics/{}/configs", segment(&self.args.topic)), &[])?;
        let value = configs.configs.iter().find(|c| c.name == "max.message.bytes").map(|c| c.value.as_str());
        let max = value.and_then(|v| v.parse().ok()).ok_or_else(|| {
            anyhow::anyhow!("the admin API gave no usable max.message.bytes for '{}': {value:?}", self.args.topic)
        })?;
        self.batch_bytes_max = Some(max);
        Ok(max)
    }

    /// Sends `records` (each with an upper bound of the bytes it adds to a batch) in as few
    /// requests as the limits allow, in order. Whatever the records' partitions, a request's
    /// records all fit in one batch of `max.message.bytes`, so each partition's part does.
    fn send(&mut self, records: Vec<(ProduceRecord, u64)>) -> anyhow::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let batch_bytes_max = self.batch_bytes_max()?;
        let envelope_bytes = json_bytes(&ProduceRequest { records: Vec::new(), encoding: Encoding::Base64 })?;
        let mut chunk = Vec::new();
        let (mut body_bytes, mut batch_bytes) = (envelope_bytes, BATCH_OVERHEAD_BYTES);
        for (record, record_batch_bytes) in records {
            // With the comma before it (one too many for the first record: an upper bound).
            let record_bytes = json_bytes(&record)? + 1;
            if envelope_bytes + record_bytes > BODY_BYTES_MAX {
                self.post(std::mem::take(&mut chunk))?;
                let number = self.lines_sent + 1;
                let e = anyhow::anyhow!("{}: it makes {record_bytes} bytes of JSON", does_not_fit(number));
                return Err(self.partial(e));
            }
            let full = body_bytes + record_bytes > BODY_BYTES_MAX || batch_bytes + record_batch_bytes > batch_bytes_max;
            if full && !chunk.is_empty() {
                self.post(std::mem::take(&mut chunk))?;
                (body_bytes, batch_bytes) = (envelope_bytes, BATCH_OVERHEAD_BYTES);
            }
            // A record over max.message.bytes on its own goes alone: the broker's answer says why.
            chunk.push(record);
            body_bytes += record_bytes;
            batch_bytes += record_batch_bytes;
        }
        self.post(chunk)
    }

    /// One request. A partition that refused its records fails the command, after the records
    /// the other partitions took are counted (and, with --json, printed).
    fn post(&mut self, records: Vec<ProduceRecord>) -> anyhow::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let count = records.len() as u64;
        let request = ProduceRequest { records, encoding: Encoding::Base64 };
        let response: ProduceResponse = match self.client.post(&self.path, &request) {
            Ok(response) => response,
            Err(e) => return Err(self.partial(e)),
        };
        self.lines_sent += count;
        let taken = response.offsets.iter().filter(|r| r.error.is_none());
        self.produced += taken.clone().count() as u64;
        if self.args.connection.json {
            for record in taken {
                print_json(&mut self.out, record)?;
            }
            self.out.flush()?;
        }
        if let Some((partition, error)) =
            response.offsets.iter().find_map(|r| r.error.as_ref().map(|e| (r.partition, e)))
        {
            let e = anyhow::anyhow!("partition {partition} refused its records: {} ({})", error.message, error.code);
            return Err(self.partial(e));
        }
        Ok(())
    }

    /// `e`, and how much was produced before it, if anything was.
    fn partial(&self, e: anyhow::Error) -> anyhow::Error {
        if self.produced == 0 {
            return e;
        }
        anyhow::anyhow!(
            "{e:#}; {} record(s) were produced (from the first {} line(s); nothing after them was sent)",
            self.produced,
            self.lines_sent
        )
    }
}

/// The length of `value` as JSON, without writing it anywhere.
fn json_bytes<T: Serialize>(value: &T) -> anyhow::Result<usize> {
    struct Counter(usize);
    impl Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    serde_json::to_writer(&mut counter, value)?;
    Ok(counter.0)
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

    #[test]
    fn the_batch_size_bound_is_never_below_the_encoded_batch() {
        use bytes::Bytes;
        use weir_broker::storage::records::{encode_batch, BatchOptions, Header, Record};
        let headers = vec![("source".to_string(), "cli".to_string()), ("h".to_string(), String::new())];
        for (count, value_len, keyed) in [(1, 0, false), (1, 1500, true), (1000, 1500, true), (100_000, 3, false)] {
            let mut bound = BATCH_OVERHEAD_BYTES;
            let records: Vec<_> = (0..count)
                .map(|i| {
                    let key = keyed.then(|| format!("key-{i}").into_bytes());
                    let value = vec![b'v'; value_len];
                    bound += record_bytes_max(key.as_deref(), &value, &headers);
                    let mut record = Record::new(1_796_000_000_000, key.map(Bytes::from), Some(Bytes::from(value)));
                    record.headers =
                        headers.iter().map(|(n, v)| Header::new(n.clone(), Some(Bytes::from(v.clone())))).collect();
                    record
                })
                .collect();
            let encoded = encode_batch(&records, &BatchOptions::default()).expect("encodes").len() as u64;
            assert!(encoded <= bound, "{count} records of {value_len} bytes: {encoded} encoded, bound {bound}");
            if value_len >= 1500 {
                assert!(
                    bound * 100 <= encoded * 105,
                    "the bound costs at most 5 % of 1.5 KB lines: {encoded} vs {bound}"
                );
            }
        }
    }
}
