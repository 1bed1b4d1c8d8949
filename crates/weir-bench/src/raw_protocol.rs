//! What the raw-protocol benchmarks (`weir bench fetch|produce|rocketmq`) share on top of
//! [`weir_harness::kafka_client`]: a broker child process, the few admin calls they make, a
//! Fetch loop that drains partitions, and CPU accounting from /proc.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Buf;
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::fetch_request::FetchTopic;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::*;
use weir_harness::address_lines::{self, WaitFor};
use weir_harness::kafka_client::{self, create_topics_request, fetch_partition, fetch_request, topic_name, Client};
pub use weir_proc::Pid;

/// What the benchmarks call themselves in request headers.
pub(crate) const CLIENT_ID: &str = "weir-bench";
/// Reads and writes of the benchmarks' connections give up after this: a hung broker fails the
/// run instead of hanging it.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the benchmark's own broker may take to print its listening line.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// A benchmark's connection to the broker.
pub(crate) fn connect(addr: SocketAddr) -> anyhow::Result<Client> {
    Ok(Client::connect(addr, CLIENT_ID, IO_TIMEOUT)?)
}

/// `weir server` (this binary) as a child process in its own scratch data directory, on
/// 127.0.0.1 port 0; killed on drop.
pub(crate) struct Server {
    child: Child,
    pub(crate) addr: SocketAddr,
    /// The RocketMQ gRPC listener, when started with [`Server::start_with_rocketmq`].
    pub(crate) rocketmq: Option<SocketAddr>,
    /// The admin HTTP listener, when started with [`Server::start_with_admin`] or
    /// [`Server::start_with_rocketmq`].
    pub(crate) admin: Option<SocketAddr>,
    dir: tempfile::TempDir,
    /// How it was started, for [`Server::restart`].
    listeners: String,
    settings: Vec<(String, String)>,
    wait_for: WaitFor,
    /// The `weir` binary it runs (`None`: this one).
    exe: Option<std::path::PathBuf>,
}

impl Server {
    /// Starts the broker with `settings` (`--set NAME=VALUE` each) in a fresh directory named
    /// `prefix*` under `parent` (the system temp dir if `None`), and waits for its listening line.
    pub(crate) fn start(prefix: &str, settings: &[(String, String)], parent: Option<&Path>) -> anyhow::Result<Server> {
        Server::start_listening(prefix, "127.0.0.1:0", settings, parent)
    }

    /// [`Server::start`] with the RocketMQ gRPC listener on as well, on 127.0.0.1 port 0; its
    /// address is in `rocketmq`. The admin listener is on too (port 0), because the RocketMQ line
    /// comes before the admin line: the wait for both is the wait for the RocketMQ one. These
    /// two settings win over `settings`.
    pub(crate) fn start_with_rocketmq(
        prefix: &str,
        settings: &[(String, String)],
        parent: Option<&Path>,
    ) -> anyhow::Result<Server> {
        let mut all = settings.to_vec();
        all.push(("rocketmq.listeners".into(), "127.0.0.1:0".into()));
        all.push(("admin.listeners".into(), "127.0.0.1:0".into()));
        let server = Server::spawn(prefix, "127.0.0.1:0", &all, parent, WaitFor::KafkaAndAdmin, None)?;
        if server.rocketmq.is_none() {
            bail!("`weir server` printed no RocketMQ line before its admin line");
        }
        Ok(server)
    }

    /// [`Server::start`] with the admin HTTP listener on (127.0.0.1 port 0, winning over
    /// `settings`), for its `/metrics`; its address is in `admin`.
    pub(crate) fn start_with_admin(
        prefix: &str,
        settings: &[(String, String)],
        parent: Option<&Path>,
    ) -> anyhow::Result<Server> {
        let mut all = settings.to_vec();
        all.push(("admin.listeners".into(), "127.0.0.1:0".into()));
        Server::spawn(prefix, "127.0.0.1:0", &all, parent, WaitFor::KafkaAndAdmin, None)
    }

    /// [`Server::start`] with `listeners` of its own (a cluster node's CONTROLLER listener).
    pub(crate) fn start_listening(
        prefix: &str,
        listeners: &str,
        settings: &[(String, String)],
        parent: Option<&Path>,
    ) -> anyhow::Result<Server> {
        Server::spawn(prefix, listeners, settings, parent, WaitFor::Kafka, None)
    }

    /// [`Server::start_listening`] of another `weir` binary (`None`: this one), e.g. the build
    /// a change is measured against.
    pub(crate) fn start_binary(
        prefix: &str,
        listeners: &str,
        settings: &[(String, String)],
        exe: Option<&Path>,
    ) -> anyhow::Result<Server> {
        Server::spawn(prefix, listeners, settings, None, WaitFor::Kafka, exe)
    }

    fn spawn(
        prefix: &str,
        listeners: &str,
        settings: &[(String, String)],
        parent: Option<&Path>,
        wait_for: WaitFor,
        exe: Option<&Path>,
    ) -> anyhow::Result<Server> {
        let builder = {
            let mut b = tempfile::Builder::new();
            b.prefix(prefix);
            b
        };
        let dir = match parent {
            Some(parent) => builder.tempdir_in(parent),
            None => builder.tempdir(),
        }
        .context("cannot create the broker's data directory")?;
        let exe = exe.map(Path::to_path_buf);
        let (child, addresses) = Server::launch(exe.as_deref(), dir.path(), listeners, settings, wait_for)?;
        Ok(Server {
            child,
            addr: addresses.kafka,
            rocketmq: addresses.rocketmq,
            admin: addresses.admin,
            dir,
            listeners: listeners.to_string(),
            settings: settings.to_vec(),
            wait_for,
            exe,
        })
    }

    /// Starts the broker again in its data directory with its settings (after [`Server::kill`]),
    /// and waits for its listening line; a port 0 listener gets a new port.
    pub(crate) fn restart(&mut self) -> anyhow::Result<()> {
        let (child, addresses) =
            Server::launch(self.exe.as_deref(), self.dir.path(), &self.listeners, &self.settings, self.wait_for)?;
        self.child = child;
        self.addr = addresses.kafka;
        self.rocketmq = addresses.rocketmq;
        self.admin = addresses.admin;
        Ok(())
    }

    fn launch(
        exe: Option<&Path>,
        dir: &Path,
        listeners: &str,
        settings: &[(String, String)],
        wait_for: WaitFor,
    ) -> anyhow::Result<(Child, address_lines::Addresses)> {
        let exe = match exe {
            Some(exe) => exe.to_path_buf(),
            None => std::env::current_exe()?,
        };
        let mut command = Command::new(exe);
        command.args(["server", "--listen", listeners, "--data-dir"]).arg(dir);
        // No RocketMQ listener unless a setting asks for one: benchmarks run brokers side by side.
        command.args(["--set", "rocketmq.listeners="]);
        for (name, value) in settings {
            command.arg("--set").arg(format!("{name}={value}"));
        }
        // openraft reports every failed call to a killed voter, which `bench metadata` makes on purpose.
        command.env("RUST_LOG", "warn,openraft=off").stderr(Stdio::inherit());
        address_lines::spawn_and_wait(&mut command, wait_for, STARTUP_TIMEOUT)
            .map_err(|e| anyhow::anyhow!("{e}; see its errors above"))
    }

    /// SIGKILL, as a crash would, and reap it.
    pub(crate) fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().context("cannot kill the broker")?;
        self.child.wait().context("cannot reap the broker")?;
        Ok(())
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The broker's data directory (removed when this is dropped).
    pub(crate) fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// User + system CPU seconds of the broker so far.
    pub(crate) fn cpu_seconds(&self) -> anyhow::Result<f64> {
        cpu_seconds(Pid::Of(self.pid()))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// User + system CPU seconds of `pid` so far, all threads together.
pub(crate) fn cpu_seconds(pid: Pid) -> anyhow::Result<f64> {
    weir_proc::cpu_seconds(pid).with_context(|| format!("cannot read the CPU time of {pid:?} from /proc"))
}

/// The name of a Kafka error code, for messages: `NOT_LEADER_OR_FOLLOWER (6)`.
pub(crate) fn error_name(code: i16) -> String {
    format!("{} ({code})", weir_kafka::errors::error_name(i32::from(code)))
}

/// CreateTopics of one topic with replication factor 1; fails unless the broker created it.
pub(crate) fn create_topic(
    client: &mut Client,
    name: &str,
    partitions: i32,
    configs: &[(String, String)],
    replicas: Option<&[i32]>,
) -> anyhow::Result<()> {
    let create = match replicas {
        Some(replicas) => kafka_client::create_topics_request_on(name, partitions, replicas, configs),
        None => create_topics_request(name, partitions, 1, configs),
    };
    let created = client.send(5, &create).context("CreateTopics")?;
    let result = created.topics.first().context("empty CreateTopics response")?;
    if result.error_code != 0 {
        bail!(
            "creating topic {name} failed: {} {}",
            error_name(result.error_code),
            result.error_message.as_deref().unwrap_or("")
        );
    }
    Ok(())
}

/// DeleteTopics of one topic.
pub(crate) fn delete_topic(client: &mut Client, name: &str) -> anyhow::Result<()> {
    let request = DeleteTopicsRequest::default()
        .with_topics(vec![DeleteTopicState::default().with_name(Some(topic_name(name)))])
        .with_timeout_ms(kafka_client::REQUEST_TIMEOUT_MS);
    let response = client.send(6, &request).context("DeleteTopics")?;
    if let Some(r) = response.responses.iter().find(|r| r.error_code != 0) {
        bail!("deleting topic {name} failed: {}", error_name(r.error_code));
    }
    Ok(())
}

/// The latest offsets (ListOffsets at -1: the high watermark) of `partitions` of `topic`.
pub(crate) fn latest_offsets(client: &mut Client, topic: &str, partitions: &[i32]) -> anyhow::Result<Vec<i64>> {
    let request =
        ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![ListOffsetsTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(
                partitions
                    .iter()
                    .map(|&p| ListOffsetsPartition::default().with_partition_index(p).with_timestamp(-1))
                    .collect(),
            )]);
    let response = client.send(7, &request).context("ListOffsets")?;
    let answered: Vec<_> = response.topics.iter().flat_map(|t| &t.partitions).collect();
    partitions
        .iter()
        .map(|&p| {
            let r = answered
                .iter()
                .find(|r| r.partition_index == p)
                .with_context(|| format!("no offset for partition {p}"))?;
            if r.error_code != 0 {
                bail!("ListOffsets of {topic}-{p} failed: {}", error_name(r.error_code));
            }
            Ok(r.offset)
        })
        .collect()
}

/// What [`fetch_all`] received: record batch bytes (protocol bytes, not values) and offsets, in
/// how many Fetch requests.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Fetched {
    pub(crate) bytes: u64,
    pub(crate) records: u64,
    pub(crate) requests: u64,
}

/// Reads `start..end` of every `(partition, start, end)` of `topic` with Fetch requests over
/// `client`, each asking every unfinished partition for up to `partition_max_bytes`. The client
/// only walks the batch headers to find the next offset; nothing is decoded or checked further.
pub(crate) fn fetch_all(
    client: &mut Client,
    topic: &str,
    ranges: &[(i32, i64, i64)],
    partition_max_bytes: i32,
) -> anyhow::Result<Fetched> {
    fetch_all_then(client, topic, ranges, partition_max_bytes, |_, _| Ok(()))
}

/// [`fetch_all`], calling `after` after each Fetch with the partitions that moved and their new
/// positions (a consumer's commit goes there).
pub(crate) fn fetch_all_then(
    client: &mut Client,
    topic: &str,
    ranges: &[(i32, i64, i64)],
    partition_max_bytes: i32,
    mut after: impl FnMut(&mut Client, &[(i32, i64)]) -> anyhow::Result<()>,
) -> anyhow::Result<Fetched> {
    let mut positions: Vec<(i32, i64, i64)> = ranges.iter().copied().filter(|(_, start, end)| start < end).collect();
    let mut fetched = Fetched::default();
    while !positions.is_empty() {
        let partitions =
            positions.iter().map(|&(p, offset, _)| fetch_partition(p, offset, partition_max_bytes)).collect();
        let request = fetch_request(500, 1, partition_max_bytes.saturating_mul(positions.len() as i32))
            .with_topics(vec![FetchTopic::default().with_topic(topic_name(topic)).with_partitions(partitions)]);
        let response = client.send(12, &request).context("Fetch")?;
        fetched.requests += 1;
        let answered: Vec<_> = response.responses.iter().flat_map(|t| &t.partitions).collect();
        let mut moved = Vec::new();
        for (p, offset, _) in positions.iter_mut() {
            let Some(partition) = answered.iter().find(|r| r.partition_index == *p) else { continue };
            if partition.error_code != 0 {
                bail!("Fetch of {topic}-{p} at {offset} failed: {}", error_name(partition.error_code));
            }
            let mut records = partition.records.clone().unwrap_or_default();
            fetched.bytes += records.len() as u64;
            // Walk the batch headers: baseOffset (8), batchLength (4), ... lastOffsetDelta at 23.
            let mut next = *offset;
            while records.len() >= 27 {
                let base = (&records[0..8]).get_i64();
                let length = (&records[8..12]).get_i32();
                let last_delta = (&records[23..27]).get_i32() as i64;
                let Ok(length) = usize::try_from(length) else {
                    bail!("Fetch of {topic}-{p}: a batch with negative length {length}");
                };
                if records.len() - 12 < length {
                    break;
                }
                next = base + last_delta + 1;
                records.advance(12 + length);
            }
            if next > *offset {
                fetched.records += (next - *offset) as u64;
                *offset = next;
                moved.push((*p, next));
            }
        }
        if moved.is_empty() {
            let stuck: Vec<String> = positions.iter().map(|(p, o, e)| format!("{topic}-{p} at {o} of {e}")).collect();
            bail!("a Fetch made no progress: {}", stuck.join(", "));
        }
        after(client, &moved)?;
        positions.retain(|(_, offset, end)| offset < end);
    }
    Ok(fetched)
}

/// Polls `latest_offsets` until their sum reaches `expected` or `timeout` passes; returns the
/// last offsets seen.
pub(crate) fn wait_for_offsets(
    client: &mut Client,
    topic: &str,
    partitions: &[i32],
    expected: i64,
    timeout: Duration,
) -> anyhow::Result<Vec<i64>> {
    let deadline = Instant::now() + timeout;
    loop {
        let offsets = latest_offsets(client, topic, partitions)?;
        if offsets.iter().sum::<i64>() >= expected || Instant::now() >= deadline {
            return Ok(offsets);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Produces at least `bytes` to partition 0 of `topic` as batches of `records` records of
/// `record_bytes` bytes each (uncompressed, timestamps from `first_timestamp` on), acks=1, one
/// request at a time. Returns the batch bytes sent and the log end offset after the last batch.
pub(crate) fn produce_filler(
    client: &mut Client,
    topic: &str,
    bytes: u64,
    records: usize,
    record_bytes: usize,
    first_timestamp: i64,
) -> anyhow::Result<(u64, i64)> {
    let batch: Vec<_> = (0..records)
        .map(|i| {
            let value = bytes::Bytes::from(vec![b'x'; record_bytes]);
            weir_storage::testing::record(i as i64, first_timestamp + i as i64, None, Some(value))
        })
        .collect();
    let batch = bytes::Bytes::from(weir_storage::testing::encode(&batch, weir_storage::Compression::None));
    let batches = bytes.div_ceil(batch.len() as u64).max(1);
    let mut end = 0;
    for _ in 0..batches {
        let response = client.send(9, &kafka_client::produce_request(topic, 0, batch.clone(), 1))?;
        let partition =
            response.responses.first().and_then(|t| t.partition_responses.first()).context("empty produce response")?;
        if partition.error_code != 0 {
            bail!("Produce failed with error {}", error_name(partition.error_code));
        }
        end = partition.base_offset + records as i64;
    }
    Ok((batches * batch.len() as u64, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_names_are_readable() {
        assert_eq!(error_name(0), "NONE (0)");
        assert_eq!(error_name(6), "NOT_LEADER_OR_FOLLOWER (6)");
    }
}
