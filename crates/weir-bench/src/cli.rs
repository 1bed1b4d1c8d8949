//! The command line of `weir bench`, as clap types: [`BenchCommand`] and each benchmark's
//! arguments. `weir` nests [`BenchCommand`] under its `bench` subcommand; the code that runs a
//! benchmark lives in its own module (`crate::storage`, ...), so adding one is: a variant here, a
//! module there, one arm in [`crate::run`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use weir_harness::parse_setting;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Throughput of the partition log (append with flush.policy none and sync, catch-up read)
    /// against plain file writes in the same directory.
    #[command(long_about = STORAGE_LONG_ABOUT)]
    Storage(StorageBenchArgs),
    /// Fetch throughput and broker CPU of `weir server` with zero-copy (sendfile) fetch against
    /// the user-space copy path, side by side in one run.
    #[command(long_about = FETCH_LONG_ABOUT)]
    Fetch(FetchBenchArgs),
    /// Produce and fetch over a TLS listener against a plain-text one, two brokers side by side
    /// in one run: MB/s and broker CPU per GB.
    #[command(long_about = TLS_LONG_ABOUT)]
    Tls(TlsBenchArgs),
    /// Produce capacity of a broker (its own `weir server` child, or --bootstrap) measured with a
    /// raw Kafka-protocol client that costs next to nothing: MB/s, broker CPU and RSS, latency.
    #[command(long_about = PRODUCE_LONG_ABOUT)]
    Produce(ProduceBenchArgs),
    /// Metadata changes on one node and on a cluster side by side: CreateTopics per second,
    /// how soon every node sees a new topic, and controller failover time.
    #[command(long_about = METADATA_LONG_ABOUT)]
    Metadata(MetadataBenchArgs),
    /// How long acknowledgements stop when a node of a 3-node cluster dies (kill -9), on the
    /// partitions it led and those it followed, and when it was also the active controller.
    #[command(long_about = FAILOVER_LONG_ABOUT)]
    Failover(FailoverBenchArgs),
    /// Elastic topics: the produce stall and throughput around a split under load on a 3-node
    /// cluster, and an elastic topic against a plain one of the same partition count.
    #[command(long_about = ELASTIC_LONG_ABOUT)]
    Elastic(ElasticBenchArgs),
    /// Tiered storage: fetching what only the object store holds against fetching local data,
    /// on one broker, side by side.
    #[command(long_about = TIERED_LONG_ABOUT)]
    Tiered(TieredBenchArgs),
    /// The native write protocol against Kafka produce (acks=all), on a memory-first topic and
    /// on a page-cache topic of one broker, side by side: latency to the answer and to
    /// persistence, MB/s and broker CPU per GB.
    #[command(long_about = NATIVE_LONG_ABOUT)]
    Native(NativeBenchArgs),
    /// What replication costs a producer: produce MB/s and latency with 1 replica / acks=1,
    /// 3 replicas / acks=1 and 3 replicas / acks=all on a 3-node cluster, side by side.
    Replication(ReplicationBenchArgs),
    /// What the partition count costs a cluster: creation rate, and each node's idle CPU, RSS,
    /// open files and memory maps at each count, optionally beside a baseline binary.
    #[command(long_about = PARTITIONS_LONG_ABOUT)]
    Partitions(PartitionsBenchArgs),
    /// The RocketMQ 5 gRPC front-end against the Kafka one on the same broker: send, receive
    /// and receive with a tag filter, side by side in one run.
    #[command(name = "rocketmq", long_about = ROCKETMQ_LONG_ABOUT)]
    RocketMq(RocketMqBenchArgs),
    /// The timer store of delayed messages: how late a million scheduled messages fire, that
    /// each fires once, and the broker memory and disk they take.
    #[command(long_about = TIMER_LONG_ABOUT)]
    Timer(TimerBenchArgs),
    /// OpenMessaging-style workloads against any Kafka-compatible broker, through librdkafka:
    /// runs the weir-bench binary next to this one with the same arguments.
    #[command(disable_help_flag = true, long_about = KAFKA_LONG_ABOUT)]
    Kafka(crate::kafka::KafkaBenchArgs),
}

const NATIVE_LONG_ABOUT: &str = "\
The native write protocol (docs/native-protocol.md) against Kafka produce with acks=all, on a
memory-first topic and on a page-cache topic (both tiered, one partition) of one broker started
for the run with the default directory store, taking turns for --rounds.

Each client first writes one --record-bytes record at a time, --writes times: the native
producer's latency to its answer (the broker holds the write) and to its persistence (the
checkpoint passes it); Kafka's to its answer, which on a memory-first topic comes once the
store has the write. Then each streams --bytes: the native producer through its buffer, Kafka
in 1 MiB batches with five requests in flight; MB/s until all is persisted, and the broker's
CPU seconds per GB.";

const TIERED_LONG_ABOUT: &str = "\
Tiered storage (docs/tiered-storage.md): fetching what only the object store holds against
fetching local data, on one broker with the default directory store.

A topic with remote.storage.enable=true gets --bytes of 1 KiB records in segments of a
sixteenth of that (1 to 64 MiB), with local.retention.bytes a quarter of it. Once every closed
segment is uploaded and local retention has deleted the rest, the same number of offsets is
read from each end with 1 MiB Fetch
requests, taking turns: the oldest (from the store, through chunks of --read-ahead; the cache
is twice that, so every round reads the store) and the newest (local, in the page cache).
Printed: MB/s and broker CPU seconds per GB of each, and their ratios.

With --store-down: two brokers in turn, one with the directory store and one whose S3 endpoint
refuses every connection, each taking --rate in batches of 1,000 1 KiB records (acks=1) for --seconds on a
tiered topic with local.retention.bytes of two segments. Printed: the produce latency, the
local bytes at the end, how fast they grew, the failed passes, and how long --budget of disk
lasts at that growth with the store down.";

const ELASTIC_LONG_ABOUT: &str = "\
Elastic topics (docs/elastic.md), two measurements in one run.

A split under load: three nodes, an elastic topic of 2 physical partitions over
--stable-partitions stable ones with replication factor 2, and a writer per stable partition
that produces one batch of 10 records of 100 bytes at a time with acks=all to its leader
(looking the leader up again whenever a request fails). After --seconds, physical partition 0
is split with `weir topic split` (which answers once the moves it starts are done); the
writers go on for --seconds more. Printed: messages acknowledged per second before, during and
after the split, and the produce stall (the longest time without an acknowledgement from the
split's start until a second after it was in force) at p50 and p99, for the stable partitions
the split moved and for the others.

The cost of elastic: one node, a plain topic and an elastic topic of --stable-partitions
partitions each, written by the same writers for --seconds and then read whole with Fetch,
taking turns for --rounds rounds. Printed: produce and fetch MB/s per round, and the broker's
CPU seconds per GB of each.";

const FAILOVER_LONG_ABOUT: &str = "\
How long acknowledgements stop when a node dies: a cluster of 3 combined nodes (this binary, on
127.0.0.1, with the default timings), a topic of --partitions partitions with replication factor 3
and min.insync.replicas=2, and one writer per partition producing one batch at a time with
acks=all to its leader (looking the leader up again after any failure).

Each round gives every partition back to its preferred leader, kills with SIGKILL a node that leads
two partitions and is not the active controller, waits until every partition acknowledges again,
restarts it, and does the same with the active controller. A stall is the longest time without an
acknowledgement after the kill; it is reported (p50, p99, max) by the dead node's part: the
partitions it led and those it followed, and the same when it was the controller.

With --compare the same runs again with controller.liveness.watch.enable=false: only the session
and election timeouts tell that a node died, as in Kafka.";

const METADATA_LONG_ABOUT: &str = "\
How fast metadata changes are decided, committed and seen: one `weir server` node and a cluster
of --nodes combined nodes (this binary, on 127.0.0.1, each in its own temporary data directory)
measured one after the other in one run, so the ratio means something on a noisy machine.

On each setup it creates --topics topics of --partitions partitions with CreateTopics, one topic
per request, one request after the other, through a node that is not the active controller (the
request is forwarded to it): creates per second and the latency of each. Then it creates up to
200 more and, after each answer, polls Metadata on every other node until the topic is there
with every partition led: how soon a change is visible everywhere. Finally, on a cluster of 3 or
more, it kills the active controller with SIGKILL and retries CreateTopics through a survivor
until one succeeds: the time the cluster needs to elect a new controller and decide again (the
election timeout is the default `controller.quorum.election.timeout.ms`).";

const PARTITIONS_LONG_ABOUT: &str = "\
What a cluster's partition count costs. It starts --nodes combined nodes (process.roles
broker,controller; this binary, or --baseline's, on 127.0.0.1, each in its own temporary data
directory) and grows them through each of --counts partitions: topics of --per-topic partitions
with --replication-factor replicas, created with CreateTopics (one topic per request, from
--concurrency clients at once) through a node that is not the active controller.

At each count it reports the creation rate of the partitions created since the previous count,
and over the last tenth of them (how fast creation is at this count). Then, after --settle
seconds, nothing is produced or consumed for --idle seconds: each node's CPU over that window
(user + system, /proc/<pid>/stat, in % of one core), its RSS, open files (/proc/<pid>/fd) and
memory maps (/proc/<pid>/maps) at its end. With --baseline BIN the whole run is made first on a
cluster of that binary (another build of weir), then on this one, and both are printed side by
side. --json FILE writes all of it.";

const ROCKETMQ_LONG_ABOUT: &str = "\
What a message costs through the RocketMQ 5 gRPC front-end (apache.rocketmq.v2.MessagingService)
against the Kafka front-end of the same broker: one `weir server` child (this binary, on
127.0.0.1 port 0, Kafka and RocketMQ listeners, in a temporary data directory), measured in one
run, with the same message size and the same number of requests in flight.

1. send: --messages messages of --size bytes to a topic of --partitions, each case by
   --concurrency senders with one request outstanding each:
     * gRPC SendMessage, one message per call (as RocketMQ producers send), every message with a
       unique message id and a tag, to a topic indexed by key and message id as the RocketMQ
       front-end's own topics are (message.index.enable); the senders share --grpc-connections
       HTTP/2 connections (a RocketMQ client has one per endpoint);
     * Kafka Produce v9, acks=all, one record per request, one TCP connection per sender (a
       Kafka connection answers its requests in order, so requests in flight need connections);
     * Kafka Produce as above with --kafka-batch records per request (0 or 1 leaves it out).
   The cases take turns in --rounds slices, so that the machine's drift hits them alike. Every
   answer is checked (any error fails the run), and ListOffsets must show each topic grown by
   exactly the messages acknowledged.
2. receive: the messages the gRPC case sent, read back once by Kafka Fetch (one connection,
   every partition, 1 MiB per partition, as a Kafka consumer fetches) and once by --concurrency
   gRPC receivers as RocketMQ's SimpleConsumer does: ReceiveMessage of up to 32 messages
   (invisible duration 30 s, a short long poll) from the queues in turn, then one AckMessage for
   the whole batch. The run fails unless every message comes back exactly once, with its body
   and tag, and every ack succeeds.
3. receive with a tag filter: one message in 100 of that topic has the tag `hit`, the others
   `miss`. Receivers of another group with the filter expression TAG `hit` must get exactly the
   hit messages; it reports their rate and the time, next to the unfiltered receive's time of
   the whole topic (2.).
4. Kafka share group against a classic consumer, the same topic read back twice more:
     * a classic Kafka consumer: Fetch as in 2. over one connection, and after each Fetch an
       OffsetCommit v8 of the partitions that moved (group weir-bench-classic, as a consumer
       with assigned partitions commits);
     * a share group (KIP-932, group weir-bench-share with share.auto.offset.reset=earliest,
       set by IncrementalAlterConfigs on the GROUP resource) of --share-members members, one
       connection each, as librdkafka's ShareConsumer drives them: ShareGroupHeartbeat v1 to
       join and at the interval the broker asks for, then ShareFetch v1 of the assigned
       partitions (up to 500 records, a 200 ms long poll) with the previous batch's
       acknowledgements (ACCEPT) piggy-backed, and a ShareAcknowledge v1 of the last batch
       before leaving. The run fails unless the members together acquire every offset of the
       topic exactly once, each at its first delivery, with every acknowledgement accepted.
   The ratios share group / classic consumer of messages/s and broker CPU per message follow.

Figures: messages/s, request latency p50 / p99 / max (HDR histogram, from the call to its
answer), and the broker's and this process's CPU per message (user + system from /proc), then
the ratios gRPC / Kafka and share group / classic consumer. --json FILE writes all of it.";

const TIMER_LONG_ABOUT: &str = "\
The timer store of delayed (scheduled) messages, on one `weir server` child (this binary, on
127.0.0.1 port 0, in a temporary data directory), in one run:

1. schedule: --messages records of --size bytes, each with its own `weir.delivery-timestamp`
   header (decimal ms since the epoch) drawn uniformly from [start + --delay, start + --delay +
   --window) (with --sorted: evenly spaced in send order, so the messages go in the order they
   are due), to a topic of --partitions with message.type=DELAY, by Kafka Produce (acks=all,
   no producer id: not idempotent) of --batch records per request over --connections
   connections, one request outstanding each. Every answer must be OK with base offset -1 (the
   broker kept every record for later, appended none), and right after scheduling the topic
   must still be empty. Reported: msg/s, request latency, broker CPU per message.
2. fire: a consumer tails the topic (Fetch, 100 ms long poll) while the messages come due and
   notes when each record reached it. Once the topic holds --messages records (and stays
   there) it is read back from the start: every id must be there exactly once, with its body
   and delivery timestamp, without the timer's own headers, and none may fire early. Lateness
   = the fired record's timestamp (the firing time) - its delivery timestamp, p50 / p99 /
   p99.9 / max, and the same for the tailing consumer's arrival time; also the seconds of the
   window with the largest lateness, to show spikes.
3. memory and disk: the broker's RSS (VmRSS from /proc) before scheduling, with every message
   pending, at the first delivery time, at the most messages in memory and after all fired,
   next to the timer's gauges pending / in memory (the admin listener's /metrics), and its
   peak (sampled every 100 ms, and VmHWM); the size of the data directory's timer/ (the timer
   log and the wheel's slot files) with every message pending and after all fired.

Any failed check fails the run. --quick: 20,000 messages due within a few seconds, for CI.

--transactions measures something else instead, on a broker with the RocketMQ listener:
RocketMQ 5 transactional messages against normal ones. --concurrency senders share one HTTP/2
connection and send --messages messages of --size bytes per case, taking turns in --rounds
slices: gRPC SendMessage of a NORMAL message to a NORMAL topic, against SendMessage of a
TRANSACTION message (stored as a half message) followed by EndTransaction COMMIT (which appends
it to its topic) to a topic of message.type=TRANSACTION. Every answer must be OK (a send must
answer a transaction id), and each topic must hold exactly the messages sent (committed). It
reports msg/s, the latency of the send, of the EndTransaction and of both, broker and client
CPU per message, and the ratios transactional / normal.";

const KAFKA_LONG_ABOUT: &str = "\
OpenMessaging-style workloads against any Kafka-compatible broker, through librdkafka: runs the
weir-bench binary next to this weir with the same arguments, so `weir bench kafka --help` lists
weir-bench's flags. weir-bench is built on its own (`cargo build --release -p weir-bench` next to
a release weir); without it, this help says the exact command for this weir.";

const STORAGE_LONG_ABOUT: &str = "\
Throughput of the partition log (weir-storage's Log) against plain file writes in the same directory.

For records with 1 KiB values it measures, in one run:
  * append MB/s and batches/s for batches of up to 16 KiB and up to 1 MiB, with flush.policy=none
    and flush.policy=sync, each with 1, 8 and 64 appender threads on one log. With sync every
    thread acknowledges as a producer with acks would: Log::append, then
    Log::sync_to(last_offset + 1), so concurrent appenders share fdatasyncs (group commit).
    A none run is timed until one final Log::flush, so it ends with the data on disk, like the
    reference.
  * read MB/s: a sequential catch-up read of a none log with Log::read (1 MiB at a time) and pread of
    each slice into one reused buffer. This is the user-space path from the page cache, not the
    broker's sendfile path.
  * the reference: the same volume written with write_all and one fdatasync at the end, in 1 MiB
    chunks (before each batch size's runs and at the end) and in chunks of the 16 KiB batch's
    size (before the 16 KiB runs and at the end); ratios use the best run of a chunk size. And
    write_all of 16 KiB chunks each followed by fdatasync, taking turns with the 16 KiB sync runs.
A first untimed write warms up the file system. The sync runs of one batch size take turns in 3
slices, so that a drift of fsync latency during the run affects them alike.
It reports flush=none append vs plain write (1 MiB batches vs 1 MiB chunks; target >= 0.8x),
flush=sync 64 vs 1 appender (target >= 20x: group commit) and the fsync count of every run
(Log::stats.fsyncs).

Batches are encoded before timing; each thread appends from its own pool of prebuilt batches
(append rewrites only the header's baseOffset and partitionLeaderEpoch in place), so nothing is
copied or encoded while timing. Everything written is removed at the end.

MB = 10^6 bytes; KiB, MiB, GiB are powers of 1024.";

const FETCH_LONG_ABOUT: &str = "\
Fetch throughput and broker CPU of `weir server` with zero-copy fetch (fetch.sendfile.enable=true:
record data goes from the segment file to the socket with sendfile) against the user-space path
(false: read into memory, then write), side by side in one run.

It starts two brokers (this binary, `weir server` on 127.0.0.1 port 0, each in its own temporary
data directory, one per mode), produces the same --bytes of 1 KiB records in 1 MiB batches to a
one-partition topic on each, then reads the whole log back over one connection with Fetch requests
of --fetch-bytes, taking turns between the modes for --rounds rounds. The data is in the page
cache, so this measures the broker's read path, not the disk. It reports the best MB/s of each
mode, the broker CPU seconds (user + system, from /proc) spent per GB fetched, and the ratios.
The client only reads frames and the last batch header of each response, so it costs the same in
both modes.";

#[derive(Debug, Args)]
pub struct ReplicationBenchArgs {
    /// How many times each case runs, interleaved (medians are reported).
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: u32,

    /// After the produce cases: move a partition holding this many bytes from node 1 to node 2,
    /// unthrottled and then under --move-throttle, and report each copy's rate. 0 skips it.
    #[arg(long, value_name = "BYTES", value_parser = parse_size_or_zero, default_value = "256M")]
    pub(crate) move_bytes: u64,

    /// The replication throttle of the throttled move, bytes per second.
    #[arg(long, value_name = "BYTES_PER_SEC", value_parser = parse_size, default_value = "32M")]
    pub(crate) move_throttle: u64,

    /// The load of each case: `weir bench produce`'s options (--bootstrap, --replicas and
    /// --acks are set per case). Give --duration or --bytes to keep the cases short.
    #[command(flatten)]
    pub(crate) produce: ProduceBenchArgs,
}

#[derive(Debug, Args)]
pub struct RocketMqBenchArgs {
    /// Messages per send case (the gRPC case's are then received). [default: 100000, or 2000
    /// with --quick]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub(crate) messages: Option<u64>,

    /// Bytes of each message body (record value).
    #[arg(long, value_name = "BYTES", value_parser = parse_size, default_value = "1024")]
    pub(crate) size: u64,

    /// Requests in flight: senders, each with one request outstanding, and gRPC receivers.
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) concurrency: u32,

    /// Partitions (RocketMQ message queues) of each topic.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..=1024))]
    pub(crate) partitions: i32,

    /// HTTP/2 connections the gRPC senders and receivers share.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) grpc_connections: u32,

    /// Records per request of the batched Kafka send case; 0 or 1 leaves the case out.
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub(crate) kafka_batch: u32,

    /// Members of the Kafka share group that reads the gRPC case's topic back, one connection
    /// each.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) share_members: u32,

    /// Slices the send cases take turns in. [default: 3, or 1 with --quick]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) rounds: Option<u32>,

    /// A setting of the broker, like `weir server --set`; repeatable.
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = parse_setting)]
    pub(crate) settings: Vec<(String, String)>,

    /// Where the broker's temporary data directory goes. [default: the system temp dir]
    #[arg(long, value_name = "DIR")]
    pub(crate) data_dir: Option<PathBuf>,

    /// Tiny volumes (a few seconds), for CI: checks that everything works, the figures mean little.
    #[arg(long)]
    pub(crate) quick: bool,

    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct TimerBenchArgs {
    /// Messages to schedule. [default: 1000000, or 20000 with --quick]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub(crate) messages: Option<u64>,

    /// Bytes of each message body (record value).
    #[arg(long, value_name = "BYTES", value_parser = parse_size, default_value = "100")]
    pub(crate) size: u64,

    /// Seconds from the start of scheduling to the first delivery time; scheduling must be done
    /// by then. [default: 20, or 3 with --quick]
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    pub(crate) delay: Option<Duration>,

    /// Seconds over which the delivery times spread, uniformly, after --delay. [default: 40, or
    /// 4 with --quick]
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    pub(crate) window: Option<Duration>,

    /// Partitions of the DELAY topic.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..=1024))]
    pub(crate) partitions: i32,

    /// Connections that schedule, each with one Produce request outstanding.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) connections: u32,

    /// Records per Produce request (one batch, one partition).
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) batch: u32,

    /// Send the messages in the order they are due (delivery times evenly spaced in send order)
    /// instead of with random delivery times.
    #[arg(long)]
    pub(crate) sorted: bool,

    /// Instead of the timer: transactional sends (SendMessage of a TRANSACTION message, then
    /// EndTransaction COMMIT) against normal gRPC sends, side by side, on the RocketMQ
    /// front-end. --messages per case [default: 20000, or 1000 with --quick], --size,
    /// --concurrency and --rounds apply.
    #[arg(long)]
    pub(crate) transactions: bool,

    /// With --transactions: senders, each with one call outstanding (they share one HTTP/2
    /// connection).
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) concurrency: u32,

    /// With --transactions: slices the two cases take turns in. [default: 3, or 1 with --quick]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) rounds: Option<u32>,

    /// A setting of the broker, like `weir server --set`; repeatable.
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = parse_setting)]
    pub(crate) settings: Vec<(String, String)>,

    /// Where the broker's temporary data directory goes. [default: the system temp dir]
    #[arg(long, value_name = "DIR")]
    pub(crate) data_dir: Option<PathBuf>,

    /// A tiny run (seconds), for CI: checks that everything works, the figures mean little.
    #[arg(long)]
    pub(crate) quick: bool,

    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ElasticBenchArgs {
    /// Stable partitions of the topics (a power of two).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(i32).range(2..=256))]
    pub(crate) stable_partitions: i32,

    /// Seconds of each phase: before and after the split, and each turn of the cost rounds.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub(crate) seconds: u64,

    /// Turns of each topic in the cost comparison.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) rounds: u32,

    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct NativeBenchArgs {
    /// Writes of one record, one at a time, for the latencies.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) writes: u32,

    /// Bytes each client streams to each topic, for MB/s and CPU.
    #[arg(long, value_name = "N", value_parser = parse_size, default_value = "256M")]
    pub(crate) bytes: u64,

    /// Bytes of each record's value.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub(crate) record_bytes: u64,

    /// The broker's memory.flush.ms.
    #[arg(long, default_value_t = 50)]
    pub(crate) flush_ms: u64,

    /// Rounds (each topic and client in turn).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) rounds: u32,

    /// A setting of the broker, like `weir server --set`; repeatable.
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = parse_setting)]
    pub(crate) settings: Vec<(String, String)>,

    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct TieredBenchArgs {
    /// Bytes of 1 KiB records to write. [default: 512M, or 48M with --quick]
    #[arg(long, value_name = "N", value_parser = parse_size)]
    pub(crate) bytes: Option<u64>,

    /// remote.log.read.ahead.bytes: how much one read from the store brings.
    #[arg(long, value_name = "N", value_parser = parse_size, default_value = "4M")]
    pub(crate) read_ahead: u64,

    /// Rounds per source (alternating).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) rounds: u32,

    /// Instead: produce at --rate to a broker whose store answers and to one whose store refuses
    /// every connection, and show how local disk grows and how long --budget lasts.
    #[arg(long)]
    pub(crate) store_down: bool,

    /// With --store-down: the produce rate in bytes per second.
    #[arg(long, value_name = "N", value_parser = parse_size, default_value = "20M")]
    pub(crate) rate: u64,

    /// With --store-down: seconds of producing to each broker.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub(crate) seconds: u64,

    /// With --store-down: the disk budget to express the growth in.
    #[arg(long, value_name = "N", value_parser = parse_size, default_value = "100G")]
    pub(crate) budget: u64,

    /// A small run (seconds), for CI.
    #[arg(long)]
    pub(crate) quick: bool,

    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct FailoverBenchArgs {
    /// Rounds, each killing a node that is not the controller and then the controller.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) rounds: u32,

    /// Partitions of the topic (each node leads a third of them).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(i32).range(3..=300))]
    pub(crate) partitions: i32,

    /// Also run with controller.liveness.watch.enable=false (the timeouts alone), side by side.
    #[arg(long)]
    pub(crate) compare: bool,

    /// Also write the stalls as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct MetadataBenchArgs {
    /// Topics to create on each setup.
    #[arg(long, default_value_t = 500)]
    pub(crate) topics: usize,

    /// Partitions of each topic.
    #[arg(long, default_value_t = 3)]
    pub(crate) partitions: i32,

    /// Nodes of the cluster (every one a voter and a broker).
    #[arg(long, default_value_t = 3)]
    pub(crate) nodes: usize,

    /// Skip killing the controller.
    #[arg(long)]
    pub(crate) no_failover: bool,

    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct PartitionsBenchArgs {
    /// Partition counts to grow the cluster to, in increasing order, each a multiple of
    /// --per-topic.
    #[arg(long, value_name = "N,...", value_delimiter = ',', default_values_t = [3000, 15000])]
    pub(crate) counts: Vec<usize>,

    /// Partitions of each topic created.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub(crate) per_topic: usize,

    /// Replicas of each partition.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub(crate) replication_factor: i16,

    /// Nodes of the cluster (every one a voter and a broker).
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=9))]
    pub(crate) nodes: u64,

    /// CreateTopics requests in flight at once (one per client connection).
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub(crate) concurrency: usize,

    /// Seconds between the last creation and the idle window (followers start fetching).
    #[arg(long, value_name = "SECS", value_parser = parse_seconds, default_value = "5")]
    pub(crate) settle: Duration,

    /// Seconds of the idle window over which each node's CPU is measured.
    #[arg(long, value_name = "SECS", value_parser = parse_seconds, default_value = "10")]
    pub(crate) idle: Duration,

    /// Another `weir` binary (the build a change is measured against) to run the same steps on
    /// first, on a cluster of its own.
    #[arg(long, value_name = "BIN")]
    pub(crate) baseline: Option<PathBuf>,

    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct FetchBenchArgs {
    /// Bytes of record batches to produce and then fetch per round. [default: 1G, or 64M with --quick]
    #[arg(long, value_name = "N", value_parser = parse_size)]
    pub(crate) bytes: Option<u64>,

    /// partition_max_bytes and max_bytes of each Fetch request.
    #[arg(long, value_name = "N", value_parser = parse_size, default_value = "1M")]
    pub(crate) fetch_bytes: u64,

    /// Rounds per mode (alternating). [default: 3]
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: u32,

    /// A small run (seconds), for CI.
    #[arg(long)]
    pub(crate) quick: bool,

    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
}

const TLS_LONG_ABOUT: &str = "\
Produce and fetch over a TLS listener (SSL://, rustls) against a plain-text one (PLAINTEXT://,
fetches by sendfile), two `weir server` children side by side on 127.0.0.1, each with a topic of
one partition. The run makes a CA and a certificate for 127.0.0.1 of its own.

Each round, each broker in turn: one connection produces --bytes of 1,000-record batches of 1 KiB
records (acks=1, one request at a time), then fetches the same records back (--fetch-bytes per
request, from the page cache). Reported per listener: the median MB/s of the rounds and the
broker's CPU seconds per GB (user + system from /proc), then TLS / plain-text ratios. The
client's own TLS work shares the machine's cores with the broker's.";

#[derive(Debug, Args)]
pub struct TlsBenchArgs {
    /// Bytes to produce and fetch back per round and broker. [default: 256M, or 16M with --quick]
    #[arg(long, value_name = "N", value_parser = parse_size)]
    pub(crate) bytes: Option<u64>,

    /// partition_max_bytes and max_bytes of each Fetch request.
    #[arg(long, value_name = "N", value_parser = parse_size, default_value = "1M")]
    pub(crate) fetch_bytes: u64,

    /// Rounds per broker (alternating). [default: 3; 1 with --quick]
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: u32,

    /// A small run (seconds), for CI.
    #[arg(long)]
    pub(crate) quick: bool,

    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
}

const PRODUCE_LONG_ABOUT: &str = "\
Produce capacity of a broker, measured with a load generator that is not the bottleneck.

librdkafka spends about as much CPU as the broker per byte produced, so on a small machine
`weir bench kafka` measures the client as much as the broker. This benchmark speaks the Kafka
protocol itself: every Produce request is encoded once before the run (per partition one
RecordBatch v2 of --batch-bytes, made of --size-byte values without keys, with its CRC32C), and
the same bytes are sent again and again with only the correlation id patched in, since the broker
assigns the offsets. Each of --connections threads owns one TCP connection and keeps up to
--in-flight requests outstanding; a reader thread per connection takes the responses in order,
checks that every partition's error code is 0 (any error fails the run) and records the latency
from the start of the request's write to its response (HDR histogram, microseconds).

Target: by default this binary's own `weir server` child on 127.0.0.1 port 0 in a temporary data
directory (under --data-dir, else the system temp dir) with admin.listeners= and every --set;
or a running broker with --bootstrap (add --broker-pid for its CPU and RSS). It creates a fresh
topic of --partitions with every --topic-config (deleted at the end on a --bootstrap broker
unless --keep-topic). Connection c sends the partitions p with p % C = c (if there are fewer
partitions than connections, partition c % P), one batch each per request.

The run stops after --bytes of values (default 1 GiB) or --duration, whichever comes first
(each connection finishes its last request). Then the benchmark checks with ListOffsets that
the topic's offsets grew by exactly the records acknowledged (with acks=0, it waits for that and
the wait is part of the timed run), and fails otherwise.

It reports MB/s (10^6 bytes of values) and msg/s, the broker's CPU seconds and CPU % (user +
system over the run's wall time from /proc/PID/stat; 100 % = one core), the broker's peak RSS
(VmRSS sampled every 100 ms, and VmHWM for its own child), this process's own CPU %
(/proc/self/stat), and the request latency p50 / p99 / p99.9 / max. With --consume it then
reads everything back from offset 0 over one connection with Fetch and reports that drain's
MB/s and broker CPU.";

#[derive(Debug, Clone, Args)]
pub struct ProduceBenchArgs {
    /// A running broker to measure, HOST:PORT. [default: start a `weir server` child]
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) bootstrap: Option<String>,

    /// The --bootstrap broker's process id, for its CPU and RSS from /proc.
    #[arg(long, value_name = "PID", requires = "bootstrap")]
    pub(crate) broker_pid: Option<u32>,

    /// A setting of the child broker, like `weir server --set`; repeatable.
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = parse_setting, conflicts_with = "bootstrap")]
    pub(crate) settings: Vec<(String, String)>,

    /// Where the child broker's temporary data directory goes. [default: the system temp dir]
    #[arg(long, value_name = "DIR", conflicts_with = "bootstrap")]
    pub(crate) data_dir: Option<PathBuf>,

    /// Partitions of the benchmark's topic.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=100_000))]
    pub(crate) partitions: i32,

    /// A config of the benchmark's topic, e.g. flush.policy=sync; repeatable.
    #[arg(long, value_name = "NAME=VALUE", value_parser = parse_setting)]
    pub(crate) topic_config: Vec<(String, String)>,

    /// The replicas of every partition, leader first (node ids, e.g. 1,2,3): the topic is
    /// created with this assignment instead of one replica. The --bootstrap broker should lead.
    #[arg(long, value_name = "IDS", value_delimiter = ',')]
    pub(crate) replicas: Vec<i32>,

    /// Bytes of each message value (no key).
    #[arg(long, value_name = "BYTES", value_parser = parse_size, default_value = "1024")]
    pub(crate) size: u64,

    /// Bytes of each partition's record batch in a request (as many values as fit).
    #[arg(long, value_name = "BYTES", value_parser = parse_size, default_value = "1M")]
    pub(crate) batch_bytes: u64,

    /// Connections, each with its own thread (and a reader thread).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) connections: u32,

    /// Produce requests outstanding per connection.
    #[arg(long, value_name = "K", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) in_flight: u32,

    /// acks of the Produce requests: 1, all (or -1), or 0.
    #[arg(long, value_name = "ACKS", value_parser = parse_acks, default_value = "1")]
    pub(crate) acks: i16,

    /// Stop after this many bytes of values (all connections). [default: 1G, or no limit with --duration]
    #[arg(long, value_name = "N", value_parser = parse_size)]
    pub(crate) bytes: Option<u64>,

    /// Stop sending after this many seconds.
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    pub(crate) duration: Option<Duration>,

    /// Then read everything back with Fetch over one connection and report that too.
    #[arg(long)]
    pub(crate) consume: bool,

    /// Leave the topic on the --bootstrap broker at the end.
    #[arg(long)]
    pub(crate) keep_topic: bool,

    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
}

fn parse_acks(text: &str) -> Result<i16, String> {
    match text.trim() {
        "1" => Ok(1),
        "all" | "-1" => Ok(-1),
        "0" => Ok(0),
        other => Err(format!("acks must be 1, all or 0, not {other:?}")),
    }
}

#[derive(Debug, Args)]
pub struct StorageBenchArgs {
    /// Directory to write in (created if missing). The benchmark works in a fresh
    /// `weir-bench-storage-*` subdirectory that it removes at the end, and removes PATH too if it
    /// created it. Put it on the disk you want to measure: a tmpfs makes fsync free. [default:
    /// ./bench-data, or the system temp dir if that cannot be created]
    #[arg(long, value_name = "PATH")]
    pub(crate) dir: Option<PathBuf>,

    /// Bytes written by each flush=none run, each plain-write reference run and the warm-up; the
    /// most each sync run writes. Plain bytes or with a binary suffix: 512K, 64M, 1G (also KiB, MiB, GiB).
    /// [default: 1G, or 16M with --quick]
    #[arg(long, value_name = "N", value_parser = parse_size)]
    pub(crate) bytes: Option<u64>,

    /// Time limit of each sync run and of the fdatasync-per-16-KiB reference, in seconds (a run
    /// also stops at --bytes). [default: 3, or 0.25 with --quick]
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    pub(crate) sync_seconds: Option<Duration>,

    /// A tiny run that takes a few seconds: checks that everything works (CI), the figures mean
    /// little.
    #[arg(long)]
    pub(crate) quick: bool,

    /// Also write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
}

/// Parses a byte count: digits with an optional K/M/G suffix (powers of 1024; `KiB` etc. too).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let number: u64 = digits.parse().map_err(|_| format!("{text:?} is not a byte count such as 1048576 or 1G"))?;
    let multiplier: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        other => return Err(format!("unknown size suffix {other:?}: use K, M or G (powers of 1024)")),
    };
    let bytes = number.checked_mul(multiplier).ok_or_else(|| format!("{text:?} is too large"))?;
    if bytes == 0 {
        return Err("the byte count must be positive".into());
    }
    Ok(bytes)
}

/// [`parse_size`], where 0 means "none" (skip).
fn parse_size_or_zero(text: &str) -> Result<u64, String> {
    if text.trim() == "0" {
        return Ok(0);
    }
    parse_size(text)
}

fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text.trim().parse().map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(seconds > 0.0 && seconds <= 3600.0) {
        return Err("expected a number of seconds in (0, 3600]".into());
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    /// `weir bench ...`, nested as the `weir` binary nests it.
    #[derive(Debug, Parser)]
    #[command(name = "weir")]
    pub(crate) struct Cli {
        #[command(subcommand)]
        pub(crate) command: Command,
    }

    #[derive(Debug, Subcommand)]
    pub(crate) enum Command {
        #[command(subcommand)]
        Bench(BenchCommand),
    }

    #[test]
    fn the_bench_commands_are_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("16K"), Ok(16 << 10));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("1T").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999G").is_err());
    }

    #[test]
    fn bench_produce_parses_its_flags() {
        let cli = Cli::try_parse_from([
            "weir",
            "bench",
            "produce",
            "--acks",
            "all",
            "--topic-config",
            "flush.policy=sync",
            "--partitions",
            "4",
            "--connections",
            "2",
            "--bytes",
            "8M",
            "--set",
            "num.io.threads=2",
        ])
        .expect("valid command line");
        let Command::Bench(BenchCommand::Produce(args)) = cli.command else { panic!("not bench produce") };
        assert_eq!(args.acks, -1);
        assert_eq!(args.topic_config, vec![("flush.policy".into(), "sync".into())]);
        assert_eq!((args.partitions, args.connections, args.in_flight), (4, 2, 5));
        assert_eq!((args.size, args.batch_bytes, args.bytes), (1024, 1 << 20, Some(8 << 20)));
        assert!(Cli::try_parse_from(["weir", "bench", "produce", "--acks", "2"]).is_err());
        assert!(Cli::try_parse_from(["weir", "bench", "produce", "--broker-pid", "1"]).is_err());
        let both = ["weir", "bench", "produce", "--bootstrap", "h:1", "--set", "a=b"];
        assert!(Cli::try_parse_from(both).is_err());
    }

    #[test]
    fn bench_rocketmq_parses_its_flags() {
        let cli = Cli::try_parse_from(["weir", "bench", "rocketmq", "--messages", "500", "--size", "4K", "--quick"])
            .expect("valid command line");
        let Command::Bench(BenchCommand::RocketMq(args)) = cli.command else { panic!("not bench rocketmq") };
        assert_eq!((args.messages, args.size, args.quick), (Some(500), 4096, true));
        assert_eq!((args.concurrency, args.partitions, args.grpc_connections, args.kafka_batch), (16, 4, 1, 32));
        assert!(Cli::try_parse_from(["weir", "bench", "rocketmq", "--messages", "0"]).is_err());
        assert!(Cli::try_parse_from(["weir", "bench", "rocketmq", "--concurrency", "0"]).is_err());
    }

    #[test]
    fn bench_timer_parses_its_flags() {
        let cli = Cli::try_parse_from([
            "weir",
            "bench",
            "timer",
            "--messages",
            "5000",
            "--window",
            "2.5",
            "--delay",
            "4",
            "--size",
            "1K",
            "--quick",
        ])
        .expect("valid command line");
        let Command::Bench(BenchCommand::Timer(args)) = cli.command else { panic!("not bench timer") };
        assert_eq!((args.messages, args.size, args.quick), (Some(5000), 1024, true));
        assert_eq!((args.window, args.delay), (Some(Duration::from_millis(2500)), Some(Duration::from_secs(4))));
        assert_eq!((args.partitions, args.connections, args.batch, args.sorted), (4, 2, 1000, false));
        assert_eq!((args.transactions, args.concurrency, args.rounds), (false, 16, None));
        let defaults = Cli::try_parse_from(["weir", "bench", "timer"]).expect("valid command line");
        let Command::Bench(BenchCommand::Timer(args)) = defaults.command else { panic!("not bench timer") };
        assert_eq!((args.messages, args.window, args.delay, args.size), (None, None, None, 100));
        assert!(Cli::try_parse_from(["weir", "bench", "timer", "--messages", "0"]).is_err());
        assert!(Cli::try_parse_from(["weir", "bench", "timer", "--window", "0"]).is_err());
        assert!(Cli::try_parse_from(["weir", "bench", "timer", "--batch", "0"]).is_err());
        let txn =
            Cli::try_parse_from(["weir", "bench", "timer", "--transactions", "--concurrency", "4", "--rounds", "2"])
                .expect("valid command line");
        let Command::Bench(BenchCommand::Timer(args)) = txn.command else { panic!("not bench timer") };
        assert_eq!((args.transactions, args.concurrency, args.rounds), (true, 4, Some(2)));
    }

    #[test]
    fn bench_partitions_parses_its_flags() {
        let cli = Cli::try_parse_from([
            "weir",
            "bench",
            "partitions",
            "--counts",
            "30,60",
            "--per-topic",
            "3",
            "--idle",
            "0.5",
            "--baseline",
            "/tmp/weir-base",
        ])
        .expect("valid command line");
        let Command::Bench(BenchCommand::Partitions(args)) = cli.command else { panic!("not bench partitions") };
        assert_eq!((args.counts, args.per_topic, args.nodes), (vec![30, 60], 3, 3));
        assert_eq!((args.idle, args.settle), (Duration::from_millis(500), Duration::from_secs(5)));
        assert_eq!(args.baseline, Some(PathBuf::from("/tmp/weir-base")));
        let defaults = Cli::try_parse_from(["weir", "bench", "partitions"]).expect("valid command line");
        let Command::Bench(BenchCommand::Partitions(args)) = defaults.command else { panic!("not bench partitions") };
        assert_eq!((args.counts, args.replication_factor, args.concurrency), (vec![3000, 15000], 3, 4));
        assert!(Cli::try_parse_from(["weir", "bench", "partitions", "--nodes", "0"]).is_err());
        assert!(Cli::try_parse_from(["weir", "bench", "partitions", "--idle", "0"]).is_err());
    }

    #[test]
    fn bench_storage_parses_every_flag() {
        let cli = Cli::try_parse_from([
            "weir",
            "bench",
            "storage",
            "--dir",
            "/tmp/x",
            "--bytes",
            "8M",
            "--sync-seconds",
            "0.5",
            "--quick",
            "--json",
            "out.json",
        ])
        .expect("valid command line");
        let Command::Bench(BenchCommand::Storage(args)) = cli.command else { panic!("not bench storage") };
        assert_eq!(args.bytes, Some(8 << 20));
        assert_eq!(args.sync_seconds, Some(Duration::from_millis(500)));
        assert!(args.quick);
        assert_eq!(args.json, Some(PathBuf::from("out.json")));
        assert_eq!(args.dir, Some(PathBuf::from("/tmp/x")));
    }
}
