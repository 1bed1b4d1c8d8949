//! Broker settings, named as Kafka names them wherever a Kafka user would look for them.
//!
//! Every setting is declared once in `SETTINGS` (name, default, meaning); `weir.example.toml`
//! documents the same list and a test keeps the two in step. Values arrive as strings (from the
//! TOML file, flattened to dotted names, then from `--set name=value`) and are parsed here, so a
//! bad value is rejected at start-up with a message that names the setting.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use weir_storage::LogConfig;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("unknown setting `{0}`{hint}", hint = unknown_setting_hint(.0))]
    Unknown(String),
    #[error("invalid value {value:?} for `{name}`: {reason}")]
    Invalid { name: String, value: String, reason: String },
    #[error("cannot read config file {path}: {reason}")]
    File { path: String, reason: String },
}

impl ConfigError {
    /// The setting the error is about, if it is about one.
    pub fn setting(&self) -> Option<&str> {
        match self {
            ConfigError::Unknown(name) | ConfigError::Invalid { name, .. } => Some(name),
            ConfigError::File { .. } => None,
        }
    }
}

/// What follows "unknown setting `name`": the setting meant, when it can be told.
fn unknown_setting_hint(name: &str) -> String {
    // A topic config's name: its broker-wide default is the setting.
    if let Some((broker_name, _, _)) = TOPIC_DEFAULT_SETTINGS.iter().find(|(_, topic_name, _)| *topic_name == name) {
        return format!(" (a topic config: did you mean its broker-wide default `{broker_name}`?)");
    }
    match weir_error::closest_name(name, setting_names()) {
        Some(setting) => format!(" (did you mean `{setting}`?)"),
        None => " (see weir.example.toml for the settings Weir knows)".to_string(),
    }
}

/// Every name [`BrokerConfig::from_settings`] accepts: the settings, the broker defaults of
/// topic configs and the aliases.
pub fn setting_names() -> impl Iterator<Item = &'static str> {
    SETTINGS
        .iter()
        .map(|s| s.name)
        .chain(TOPIC_DEFAULT_SETTINGS.iter().map(|(name, _, _)| *name))
        .chain(ALIASES.iter().map(|(alias, _, _)| *alias))
}

pub(crate) struct Setting {
    pub name: &'static str,
    pub default: &'static str,
    #[expect(dead_code, reason = "the setting's meaning, for whoever reads SETTINGS; no code reads it")]
    pub doc: &'static str,
}

const fn s(name: &'static str, default: &'static str, doc: &'static str) -> Setting {
    Setting { name, default, doc }
}

/// Broker-level settings. `log.*` and `message.max.bytes` are the defaults of the topic configs
/// they map to (see [`TOPIC_DEFAULT_SETTINGS`]).
pub(crate) const SETTINGS: &[Setting] = &[
    s("node.id", "0", "This node's id: in Metadata responses, and as a voter of the metadata quorum."),
    s(
        "process.roles",
        "broker,controller",
        "What this node does: broker (serves clients), controller (votes in the metadata quorum), or both.",
    ),
    s(
        "controller.quorum.voters",
        "",
        "The metadata quorum's voters, id@host:port,... (their CONTROLLER listeners); empty: this node alone.",
    ),
    s(
        "listeners",
        "127.0.0.1:9092",
        "Addresses to bind: NAME://host:port,... for Kafka clients (each listener's security protocol is listener.security.protocol.map's: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL; a bare host:port means PLAINTEXT) and CONTROLLER://host:port (the metadata quorum and the cluster's internal requests).",
    ),
    s(
        "advertised.listeners",
        "",
        "Addresses Kafka clients are told to connect to, per listener (NAME://host:port,...); a listener not named here advertises its bound address.",
    ),
    s(
        "inter.broker.listener.name",
        "",
        "The Kafka listener other brokers replicate from, secured as its protocol says (over SASL, brokers log in with listener.name.<listener>.<mechanism>.sasl.jaas.config); empty: the only client listener, or the one named PLAINTEXT.",
    ),
    s(
        "listener.security.protocol.map",
        "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
        "Each listener name's security protocol (NAME:PROTOCOL,...): PLAINTEXT, SSL (TLS), SASL_PLAINTEXT (SASL over plain text) or SASL_SSL (SASL over TLS). CONTROLLER is PLAINTEXT or SSL (with ssl.client.auth=required, nodes prove themselves with certificates).",
    ),
    s("ssl.keystore.type", "PEM", "The keystore's format: PEM (the only one Weir reads)."),
    s(
        "ssl.keystore.location",
        "",
        "A PEM file with the listener's certificate chain (leaf first) and its unencrypted private key; reloaded when it changes.",
    ),
    s("ssl.keystore.certificate.chain", "", "The certificate chain as inline PEM (instead of ssl.keystore.location)."),
    s("ssl.keystore.key", "", "The unencrypted private key as inline PEM (with ssl.keystore.certificate.chain)."),
    s("ssl.key.password", "", "Not supported: the private key must be unencrypted (PKCS#8, PKCS#1 or SEC1 PEM)."),
    s("ssl.truststore.type", "PEM", "The truststore's format: PEM."),
    s(
        "ssl.truststore.location",
        "",
        "A PEM file of the certificates that client certificates must chain to (for ssl.client.auth); reloaded when it changes.",
    ),
    s("ssl.truststore.certificates", "", "The truststore as inline PEM (instead of ssl.truststore.location)."),
    s(
        "ssl.client.auth",
        "none",
        "Mutual TLS: none, requested (a client certificate is checked if given) or required.",
    ),
    s("ssl.enabled.protocols", "TLSv1.2,TLSv1.3", "The TLS versions offered."),
    s(
        "ssl.principal.mapping.rules",
        "DEFAULT",
        "A mutual-TLS client's principal from its certificate's subject (CN=alice,O=Example): DEFAULT keeps it whole; RULE:pattern/replacement/[LU] rewrites a matching one, e.g. RULE:^CN=(.*?),.*$/$1/,DEFAULT.",
    ),
    s(
        "sasl.enabled.mechanisms",
        "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
        "The SASL mechanisms a SASL listener offers: SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN, each checked against the users' SCRAM credentials (weir user create).",
    ),
    s(
        "connections.max.reauth.ms",
        "0",
        "KIP-368: a SASL session lasts this long; the client must authenticate again on the same connection before it ends, or the connection is closed. 0: sessions do not expire.",
    ),
    s(
        "connection.failed.authentication.delay.ms",
        "100",
        "How long the answer to a failed authentication is held back (slows password guessing).",
    ),
    s(
        "connection.failed.authentication.max.per.minute",
        "20",
        "Failed authentications allowed per client address per minute; beyond it, attempts from that address fail without a password check.",
    ),
    s("sasl.server.max.receive.size", "524288", "The largest SASL token a client may send before it is authenticated."),
    s(
        "sasl.mechanism.inter.broker.protocol",
        "",
        "The SASL mechanism brokers log in to each other's SASL inter-broker listener with (its login is listener.name.<listener>.<mechanism>.sasl.jaas.config); empty: the first of sasl.enabled.mechanisms.",
    ),
    s(
        "ssl.endpoint.identification.algorithm",
        "https",
        "How a node checks the certificate of another node it connects to over TLS (replication, CONTROLLER): https: it must name the address connected to (an IP address SAN for an IP); empty: any certificate the truststore trusts.",
    ),
    s(
        "connections.max.unauthenticated.ms",
        "10000",
        "A connection to a SASL listener that has not authenticated this long after it opened is closed.",
    ),
    s(
        "authorizer.class.name",
        "",
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer (or kafka.security.authorizer.AclAuthorizer) authorizes every Kafka request by the ACLs (weir acl, CreateAcls); empty: no authorization.",
    ),
    s(
        "super.users",
        "",
        "Principals allowed everything whatever the ACLs say, separated by ';' (User:admin;User:ops).",
    ),
    s(
        "allow.everyone.if.no.acl.found",
        "false",
        "With the authorizer on: a resource no ACL applies to is open to everyone (true) or to super users only (false).",
    ),
    s(
        "quota.window.num",
        "11",
        "Client quotas (AlterClientQuotas) measure rates over this many samples of quota.window.size.seconds each.",
    ),
    s("quota.window.size.seconds", "1", "The span of one client-quota sample, in seconds."),
    s("broker.rack", "", "The rack (or zone) of this broker, for rack-aware replica placement; empty: none."),
    s(
        "replica.selector.class",
        "",
        "Which replica a consumer reads from: empty, the leader; org.apache.kafka.common.replica.RackAwareReplicaSelector, an in-sync replica in the consumer's client.rack (KIP-392).",
    ),
    s("broker.heartbeat.interval.ms", "2000", "How often a broker tells the controller it is alive."),
    s("broker.session.timeout.ms", "9000", "A broker without a heartbeat this long is fenced: its partitions get no leader."),
    s(
        "controller.quorum.election.timeout.ms",
        "1000",
        "A quorum voter that hears from no leader this long (up to half as long again, at random) stands for election.",
    ),
    s(
        "controller.liveness.watch.enable",
        "true",
        "Tell a dead process from a silent one by its closed connections and refused port: the active controller fences a broker whose process is gone at once, and a voter stands in for a controller whose process is gone as soon as the others may vote. Off waits for broker.session.timeout.ms and the election timeout, as Kafka does.",
    ),
    s("controller.quorum.request.timeout.ms", "2000", "How long an internal request between nodes may take."),
    s("log.dirs", "./data", "The data directory: partition logs, metadata log, checkpoints."),
    s(
        "admin.listeners",
        "127.0.0.1:9644",
        "Address of the admin HTTP listener (JSON API, /metrics, /health, /ready); empty disables it.",
    ),
    s(
        "admin.api.require.auth",
        "false",
        "The admin HTTP API asks for a Weir user's name and password (HTTP Basic; use TLS or a private network) and, with the authorizer on, checks the user's ACLs. Until the first user exists, requests from the loopback address need none (to create it).",
    ),
    s(
        "admin.ssl.enable",
        "false",
        "The admin listener speaks HTTPS, with the ssl.keystore.* certificate (and ssl.client.auth, ssl.enabled.protocols).",
    ),
    s(
        "rocketmq.listeners",
        "127.0.0.1:8081",
        "Address of the RocketMQ 5 gRPC listener (what RocketMQ 5 clients call their endpoints); empty disables it.",
    ),
    s(
        "rocketmq.ssl.enable",
        "false",
        "The RocketMQ listener speaks gRPC over TLS, with the ssl.keystore.* certificate; clients turn TLS on (tls_enable, enableSsl).",
    ),
    s(
        "rocketmq.authentication.enable",
        "false",
        "RocketMQ clients must sign every call with an access key (a Weir user made with weir user create --rocketmq) and its secret key (MQv2-HMAC-SHA1); false: unsigned calls are User:ANONYMOUS (a signed call is checked either way).",
    ),
    s("num.partitions", "1", "Partitions of an auto-created topic, and of CreateTopics asking for -1."),
    s("default.replication.factor", "1", "Replication factor of auto-created topics."),
    s("auto.create.topics.enable", "true", "Create a topic when a client asks Metadata for an unknown one."),
    s("delete.topic.enable", "true", "Allow DeleteTopics."),
    s("max.partitions.per.topic", "10000", "Most partitions one topic may have (Weir's limit)."),
    s("socket.request.max.bytes", "104857600", "Largest request frame; a bigger one closes the connection."),
    s("max.connections", "10000", "Most client connections at once; more are refused."),
    s("connections.max.idle.ms", "600000", "Close a connection idle this long."),
    s("queued.max.requests.per.connection", "64", "Requests read ahead of the one being handled, per connection."),
    s("fetch.sendfile.enable", "true", "Send fetched record data from file to socket with sendfile (zero copy)."),
    s("producer.id.expiration.ms", "86400000", "Forget an idempotent producer's sequence state after this long idle."),
    s(
        "transactional.id.expiration.ms",
        "604800000",
        "Forget a transactional id unused this long (no open transaction).",
    ),
    s("transaction.max.timeout.ms", "900000", "Largest transaction.timeout.ms a producer may ask for."),
    s(
        "transaction.check.interval.ms",
        "30000",
        "RocketMQ transactional messages: ask the producer about a transaction left open this long (and again each interval).",
    ),
    s(
        "transaction.check.max",
        "15",
        "RocketMQ transactional messages: roll a transaction back after this many unanswered checks.",
    ),
    s(
        "fault.produce.response.drop.every",
        "0",
        "Tests only: drop every Nth produce response and close its connection; 0 is off.",
    ),
    s("group.min.session.timeout.ms", "6000", "Smallest session timeout a group member may ask for."),
    s("group.max.session.timeout.ms", "1800000", "Largest session timeout a group member may ask for."),
    s("group.initial.rebalance.delay.ms", "3000", "Wait this long for more members when a group forms."),
    s("group.max.size", "1000", "Most members in one consumer group."),
    s(
        "group.consumer.heartbeat.interval.ms",
        "5000",
        "Consumer protocol (KIP-848): how often members heartbeat, as the broker tells them.",
    ),
    s(
        "group.consumer.session.timeout.ms",
        "45000",
        "Consumer protocol: a member without a heartbeat for this long is removed from its group.",
    ),
    s(
        "group.share.heartbeat.interval.ms",
        "5000",
        "Share groups (KIP-932): how often members heartbeat, as the broker tells them.",
    ),
    s(
        "group.share.session.timeout.ms",
        "45000",
        "Share groups: a member without a heartbeat for this long is removed from its group.",
    ),
    s(
        "group.share.record.lock.duration.ms",
        "30000",
        "Share groups: how long a fetched record stays acquired (invisible to the group) before it is redelivered.",
    ),
    s(
        "group.share.delivery.count.limit",
        "5",
        "Share groups: deliveries of one record before it goes to the group's dead-letter topic.",
    ),
    s(
        "group.consumer.assignors",
        "uniform,range",
        "Consumer protocol: the server-side assignors members may choose; the first is the default.",
    ),
    s(
        "group.consumer.migration.policy",
        "bidirectional",
        "Converting a running group between protocols: bidirectional, upgrade (classic to consumer), downgrade (consumer to classic) or disabled. Empty groups always convert.",
    ),
    s("offsets.topic.num.partitions", "50", "Partitions of the internal __consumer_offsets topic."),
    s(
        "offsets.topic.replication.factor",
        "3",
        "Replicas of each __consumer_offsets partition (fewer while fewer brokers are registered).",
    ),
    s(
        "transaction.state.log.replication.factor",
        "3",
        "Replicas of each __transaction_state partition (fewer while fewer brokers are registered).",
    ),
    s(
        "messaging.state.topic.num.partitions",
        "16",
        "Partitions of the messaging layer's internal topics (__delayed_messages, __half_messages).",
    ),
    s(
        "messaging.state.topic.replication.factor",
        "3",
        "Replicas of each partition of the messaging layer's internal topics (fewer while fewer brokers are registered).",
    ),
    s(
        "messaging.state.topic.min.isr",
        "2",
        "min.insync.replicas of the messaging layer's internal topics (at most their replication factor).",
    ),
    s(
        "replica.lag.time.max.ms",
        "30000",
        "A follower that has not caught up with the leader's log end for this long leaves the ISR.",
    ),
    s("replica.fetch.max.bytes", "1048576", "Bytes a follower asks for per partition in one fetch from its leader."),
    s("replica.fetch.wait.max.ms", "500", "How long a follower's fetch waits at the leader for new data."),
    s(
        "max.incremental.fetch.session.cache.slots",
        "1000",
        "Incremental fetch sessions (KIP-227) the broker keeps for consumers and followers; 0 declines them.",
    ),
    s(
        "auto.leader.rebalance.enable",
        "true",
        "The controller gives partitions back to their preferred replica when a broker leads too few of them.",
    ),
    s("leader.imbalance.check.interval.seconds", "300", "How often the controller checks the leader balance."),
    s(
        "elastic.balance.enable",
        "true",
        "The controller moves elastic topics' physical partitions to keep every broker's traffic within elastic.balance.band of the mean.",
    ),
    s("elastic.balance.band", "1.25", "How far above the mean traffic a broker may be before a physical partition moves off it."),
    s(
        "elastic.balance.min.bytes.per.sec",
        "1048576",
        "Below this mean traffic per broker (bytes per second) nothing moves: the differences are noise.",
    ),
    s("elastic.balance.interval.ms", "30000", "How often the controller checks the load balance."),
    s(
        "leader.imbalance.per.broker.percentage",
        "10",
        "The share of a broker's preferred partitions it may lead elsewhere before they move back.",
    ),
    s(
        "transaction.state.log.num.partitions",
        "50",
        "Partitions of the internal __transaction_state topic (one that exists keeps its count).",
    ),
    s("offsets.retention.minutes", "10080", "Drop an empty group's committed offsets after this long."),
    s("offsets.retention.check.interval.ms", "600000", "How often expired offsets are looked for."),
    s("metadata.snapshot.interval.records", "1000", "Write a metadata snapshot after this many records."),
    s("log.retention.check.interval.ms", "300000", "How often retention runs."),
    s("log.flush.scheduler.interval.ms", "1000", "How often logs are checked for a due flush (flush.ms)."),
    s("log.flush.offset.checkpoint.interval.ms", "60000", "How often recovery points are checkpointed."),
    s("log.cleaner.enable", "true", "Run compaction for topics with cleanup.policy=compact."),
    s("log.cleaner.backoff.ms", "15000", "Sleep between compaction passes with nothing to do."),
    s("log.cleaner.io.max.bytes.per.second", "0", "Compaction I/O limit; 0 means none."),
    s("num.recovery.threads.per.data.dir", "2", "Threads recovering logs at start-up."),
    s(
        "remote.log.storage.system.enable",
        "false",
        "Tiered storage (KIP-405): topics with remote.storage.enable=true copy their closed segments to the object store. Off, such topics cannot be created.",
    ),
    s(
        "remote.log.manager.task.interval.ms",
        "30000",
        "How often each led partition of a tiered topic uploads its closed segments and deletes what retention passed from the store.",
    ),
    s(
        "remote.log.cache.bytes",
        "268435456",
        "Reads of offsets only the object store holds go through chunk files in <log.dirs>/remote-cache, at most this many bytes of them.",
    ),
    s(
        "remote.log.read.ahead.bytes",
        "4194304",
        "How much of a segment one read from the object store brings (a consumer reading on is then served from the cache).",
    ),
    s(
        "memory.pool.bytes",
        "268435456",
        "Memory-first topics (storage.mode=memory): the most bytes written to them and not yet in the object store, over all their partitions; producers wait beyond it.",
    ),
    s(
        "memory.flush.ms",
        "50",
        "Memory-first topics: how long a write waits at most before the writer puts it in the object store, with every partition's writes of the moment in one object.",
    ),
    s(
        "memory.flush.bytes",
        "8388608",
        "Memory-first topics: the writer puts an object in the store sooner once this many bytes wait.",
    ),
    s(
        "memory.wal.max.age.ms",
        "600000",
        "Memory-first topics: write-ahead objects older than this have their partitions' segments rolled, so the tier uploads them and the objects can go.",
    ),
    s("object.store.url", "", "The object store: file:///dir or s3://bucket/prefix; empty: <log.dirs>/objects."),
    s("object.store.endpoint", "", "An S3-compatible service's address (http://host:port); empty: AWS."),
    s("object.store.region", "us-east-1", "The S3 region."),
    s("object.store.access.key.id", "", "The S3 access key id (with object.store.secret.access.key)."),
    s("object.store.secret.access.key", "", "The S3 secret access key."),
    s(
        "object.store.path.style",
        "false",
        "Address an S3-compatible service as endpoint/bucket/key (MinIO and most self-hosted services) rather than bucket.endpoint/key.",
    ),
];

/// Settings whose values are secrets: never shown (DescribeConfigs marks them sensitive, the
/// admin API shows `[hidden]`) nor logged.
pub const SENSITIVE_SETTINGS: &[&str] = &["object.store.secret.access.key", "ssl.keystore.key", "ssl.key.password"];

/// The settings a listener may set for itself as `listener.name.<listener>.<setting>` (Kafka's
/// listener prefix; the listener's name in lower case), besides its SASL mechanisms' logins
/// (`listener.name.<listener>.<mechanism>.sasl.jaas.config`).
fn per_listener(setting: &str) -> bool {
    (setting.starts_with("ssl.") && setting != "ssl.endpoint.identification.algorithm")
        || matches!(
            setting,
            "sasl.enabled.mechanisms"
                | "connections.max.reauth.ms"
                | "sasl.server.max.receive.size"
                | "connections.max.unauthenticated.ms"
        )
}

/// Whether `name` is a listener-prefixed setting Weir reads; its canonical (lower-case
/// listener) form.
fn listener_prefixed(name: &str) -> Option<String> {
    let rest = name.strip_prefix("listener.name.")?;
    let (listener, setting) = rest.split_once('.')?;
    let listener = listener.to_ascii_lowercase();
    if listener.is_empty() || !listener.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return None;
    }
    let jaas =
        setting.strip_suffix(".sasl.jaas.config").is_some_and(|mechanism| SaslMechanism::parse(mechanism).is_some());
    (jaas || (per_listener(setting) && SETTINGS.iter().any(|s| s.name == setting)))
        .then(|| format!("listener.name.{listener}.{setting}"))
}

/// Broker-level defaults of topic configs: where they are defined (the controller checks the
/// dynamic ones).
pub use crate::topic_config::TOPIC_DEFAULT_SETTINGS;

/// Kafka's coarser aliases: (alias, canonical name, multiplier to the canonical unit).
pub const ALIASES: &[(&str, &str, i64)] = &[
    ("log.retention.minutes", "log.retention.ms", 60_000),
    ("log.retention.hours", "log.retention.ms", 3_600_000),
    ("log.roll.hours", "log.roll.ms", 3_600_000),
];

/// What a node does (`process.roles`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    /// Serves Kafka (and the other protocols') clients and hosts partitions.
    pub broker: bool,
    /// Votes in the metadata quorum and can be the active controller.
    pub controller: bool,
}

#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub node_id: i32,
    pub roles: Roles,
    /// The metadata quorum's voters and their controller addresses (`controller.quorum.voters`);
    /// empty: this node alone, a quorum of one.
    pub voters: BTreeMap<i32, (String, u16)>,
    /// The CONTROLLER listener: the quorum's messages and the cluster's internal requests.
    pub(crate) controller_listen: Option<SocketAddr>,
    /// `CONTROLLER:SSL`: the internal RPC's TLS, as the CONTROLLER listener serves it and as
    /// this node connects to the others' (which must then all speak TLS too).
    pub controller_tls: Option<weir_security::tls::TlsSettings>,
    /// The principal of a node's certificate on the CONTROLLER listener
    /// (`listener.name.controller.ssl.principal.mapping.rules`).
    pub controller_principal_rules: weir_security::principal::PrincipalRules,
    /// `ssl.endpoint.identification.algorithm=https`: a node's certificate must name the
    /// address another node connects to.
    pub verify_peer_names: bool,
    /// How this broker reaches the other brokers' inter-broker listener; `None` off a cluster
    /// (nothing to replicate from) and on a controller-only node.
    pub inter_broker: Option<InterBrokerClient>,
    pub rack: Option<String>,
    /// KIP-392: consumers that say their `client.rack` read from an in-sync replica there.
    pub(crate) rack_aware_reads: bool,
    pub(crate) broker_heartbeat_interval_ms: u64,
    pub(crate) broker_session_timeout_ms: u64,
    /// `controller.liveness.watch.enable` (see `cluster::liveness`).
    pub(crate) liveness_watch: bool,
    pub(crate) quorum_election_timeout_ms: u64,
    pub quorum_request_timeout_ms: u64,
    /// The inter-broker Kafka listener (the first of `client_listeners`); `None` on a
    /// controller-only node, which serves no Kafka clients.
    pub listen: Option<SocketAddr>,
    /// How the inter-broker Kafka listener (`listen`) is secured: TLS, SASL, both or neither.
    pub client_security: ClientSecurity,
    /// Every Kafka client listener, the inter-broker one (`listen`, `advertised_*`,
    /// `client_security`) first.
    pub client_listeners: Vec<ClientListener>,
    /// The authorizer (`authorizer.class.name`, `super.users`, `allow.everyone.if.no.acl.found`).
    pub authorizer: weir_security::acl::AuthorizerSettings,
    /// `admin.api.require.auth`: the admin HTTP API wants a user's name and password (HTTP
    /// Basic), checked like a SASL login.
    pub admin_require_auth: bool,
    /// `admin.ssl.enable`: the admin listener speaks HTTPS, with the `ssl.*` keystore.
    pub admin_tls: Option<weir_security::tls::TlsSettings>,
    /// `rocketmq.ssl.enable`: the RocketMQ listener speaks gRPC over TLS, with the `ssl.*`
    /// keystore.
    pub rocketmq_tls: Option<weir_security::tls::TlsSettings>,
    /// RocketMQ calls must be signed with an access key (`rocketmq.authentication.enable`).
    pub rocketmq_require_auth: bool,
    /// Host and port put in Metadata responses.
    pub advertised_host: String,
    pub advertised_port: u16,
    /// The admin HTTP listener (`admin.listeners`); `None` when disabled.
    pub admin_listen: Option<SocketAddr>,
    /// The RocketMQ 5 gRPC listener (`rocketmq.listeners`); `None` when disabled or on a
    /// controller-only node.
    pub rocketmq_listen: Option<SocketAddr>,
    /// Port of the RocketMQ listener given to clients in routes (the bound one when configured
    /// as 0); 0 when there is none.
    pub rocketmq_advertised_port: u16,
    pub data_dir: PathBuf,
    pub num_partitions: i32,
    pub default_replication_factor: i16,
    pub auto_create_topics: bool,
    pub delete_topic_enable: bool,
    pub max_partitions_per_topic: i32,
    pub socket_request_max_bytes: usize,
    pub max_connections: usize,
    pub connections_max_idle_ms: u64,
    pub queued_requests_per_connection: usize,
    /// Client quotas' rate window: how many samples (`quota.window.num`) of how long
    /// (`quota.window.size.seconds`).
    pub quota_window_num: u32,
    pub quota_window_size_seconds: u32,
    pub fetch_sendfile: bool,
    pub producer_id_expiration_ms: i64,
    pub transactional_id_expiration_ms: i64,
    pub transaction_max_timeout_ms: i32,
    /// Test-only fault injection (`fault.produce.response.drop.every`); 0 is off.
    pub fault_produce_response_drop_every: u64,
    pub group_min_session_timeout_ms: i32,
    pub group_max_session_timeout_ms: i32,
    pub group_initial_rebalance_delay_ms: u64,
    /// RocketMQ half messages: how long a transaction may stay open before its producer is
    /// asked, and between two checks (`transaction.check.interval.ms`).
    pub transaction_check_interval_ms: u64,
    /// How many checks a transaction gets before it is rolled back (`transaction.check.max`).
    pub transaction_check_max: u32,
    pub group_max_size: usize,
    pub group_consumer_heartbeat_interval_ms: i32,
    pub group_consumer_session_timeout_ms: i32,
    /// Share groups (KIP-932): the `group.share.*` settings, each a group's default.
    pub group_share_heartbeat_interval_ms: i32,
    pub group_share_session_timeout_ms: i32,
    pub group_share_record_lock_duration_ms: i32,
    pub group_share_delivery_count_limit: u32,
    /// Known assignor names, in the configured order (the first is the default).
    pub group_consumer_assignors: Vec<String>,
    /// `group.consumer.migration.policy`: which way a group with members may change protocol.
    pub group_consumer_migration_policy: MigrationPolicy,
    pub offsets_topic_partitions: i32,
    pub transaction_state_partitions: i32,
    pub offsets_topic_replication_factor: i16,
    pub transaction_state_replication_factor: i16,
    /// `messaging.state.topic.*`: the messaging layer's internal topics (the timer store's).
    pub messaging_state_partitions: i32,
    pub messaging_state_replication_factor: i16,
    pub messaging_state_min_isr: i16,
    /// `replica.lag.time.max.ms`: a follower not caught up for longer leaves the ISR (read by
    /// the admin API's health report too).
    pub replica_lag_time_max_ms: u64,
    pub(crate) replica_fetch_max_bytes: i32,
    pub(crate) replica_fetch_wait_max_ms: u64,
    /// `max.incremental.fetch.session.cache.slots`: the most fetch sessions kept (read by the
    /// Kafka front-end, which keeps them).
    pub fetch_session_cache_slots: usize,
    pub(crate) auto_leader_rebalance_enable: bool,
    pub(crate) leader_imbalance_check_interval_seconds: u64,
    pub(crate) elastic_balance: weir_controller::balance::BalanceConfig,
    pub(crate) elastic_balance_interval_ms: u64,
    pub(crate) leader_imbalance_per_broker_percentage: u32,
    pub offsets_retention_ms: i64,
    pub offsets_retention_check_interval_ms: u64,
    pub(crate) metadata_snapshot_interval: u64,
    pub retention_check_interval_ms: u64,
    pub flush_check_interval_ms: u64,
    pub checkpoint_interval_ms: u64,
    pub cleaner_enabled: bool,
    pub cleaner_backoff_ms: u64,
    pub cleaner_io_max_bytes_per_second: u64,
    pub recovery_threads: usize,
    /// The object store of tiered topics when `remote.log.storage.system.enable` is on.
    pub remote_storage: Option<weir_tier::StoreSettings>,
    /// `remote.log.manager.task.interval.ms`.
    pub remote_log_manager_interval_ms: u64,
    /// `remote.log.cache.bytes` and `remote.log.read.ahead.bytes`.
    pub remote_cache: weir_tier::CacheSettings,
    /// `memory.*`: the writer of memory-first topics.
    pub memory: MemorySettings,
    /// Broker-wide topic config defaults, by topic config name (`retention.ms`, ...).
    pub topic_defaults: BTreeMap<String, String>,
    /// The settings as given (after aliases), for DescribeConfigs on the broker resource.
    pub explicit: BTreeMap<String, String>,
}

/// The writer of memory-first topics (`memory.*`, see `crate::memory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySettings {
    /// `memory.pool.bytes`: written and not yet in the store, at most.
    pub pool_bytes: u64,
    /// `memory.flush.ms`: the longest a write waits for the writer.
    pub flush_ms: u64,
    /// `memory.flush.bytes`: the writer goes sooner once this much waits.
    pub flush_bytes: u64,
    /// `memory.wal.max.age.ms`: write-ahead objects older than this get their segments rolled.
    pub wal_max_age_ms: u64,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        match BrokerConfig::from_settings(&BTreeMap::new()) {
            Ok(config) => config,
            Err(e) => panic!("built-in defaults must parse: {e}"),
        }
    }
}

fn invalid(name: &str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { name: name.to_string(), value: value.to_string(), reason: reason.into() }
}

fn parse_num<T: std::str::FromStr + PartialOrd + std::fmt::Display>(
    name: &str,
    value: &str,
    min: T,
) -> Result<T, ConfigError> {
    let parsed: T = value.trim().parse().map_err(|_| invalid(name, value, "expected a number"))?;
    if parsed < min {
        return Err(invalid(name, value, format!("must be at least {min}")));
    }
    Ok(parsed)
}

/// `replica.selector.class`: Kafka's class names (the short names too). True for rack-aware.
fn parse_replica_selector(value: &str) -> Result<bool, ConfigError> {
    match value.trim() {
        "" | "org.apache.kafka.common.replica.LeaderSelector" | "leader" => Ok(false),
        "org.apache.kafka.common.replica.RackAwareReplicaSelector" | "rack" => Ok(true),
        _ => Err(invalid(
            "replica.selector.class",
            value,
            "expected org.apache.kafka.common.replica.RackAwareReplicaSelector (or empty: the leader)",
        )),
    }
}

fn parse_bool(name: &str, value: &str) -> Result<bool, ConfigError> {
    match value.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid(name, value, "expected true or false")),
    }
}

/// The listeners of a `listeners`-style value: `NAME://host:port,...`, a bare `host:port` being
/// PLAINTEXT. A name is upper-case letters, digits and `_`, each at most once.
fn parse_listeners(name: &str, value: &str) -> Result<BTreeMap<String, (String, u16)>, ConfigError> {
    let mut out = BTreeMap::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (scheme, addr) = match item.split_once("://") {
            Some((scheme, rest)) => (scheme.to_ascii_uppercase(), rest),
            None => ("PLAINTEXT".to_string(), item),
        };
        if scheme.is_empty() || !scheme.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_') {
            return Err(invalid(
                name,
                value,
                format!("listener name {scheme:?}: expected letters, digits and _ (e.g. SASL_SSL://host:port)"),
            ));
        }
        let (host, port) = parse_host_port(name, value, addr)?;
        if out.insert(scheme.clone(), (host, port)).is_some() {
            return Err(invalid(name, value, format!("{scheme} is listed twice")));
        }
    }
    Ok(out)
}

fn parse_host_port(name: &str, value: &str, addr: &str) -> Result<(String, u16), ConfigError> {
    let (host, port) =
        addr.rsplit_once(':').ok_or_else(|| invalid(name, value, "expected host:port, e.g. 127.0.0.1:9092"))?;
    let port: u16 = port.parse().map_err(|_| invalid(name, value, "the port must be a number from 0 to 65535"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok((if host.is_empty() { "0.0.0.0".to_string() } else { host.to_string() }, port))
}

/// `host:port` or `PLAINTEXT://host:port` (the PLAINTEXT listener if several are listed).
fn parse_listener(name: &str, value: &str) -> Result<(String, u16), ConfigError> {
    parse_listeners(name, value)?
        .remove("PLAINTEXT")
        .ok_or_else(|| invalid(name, value, "expected a PLAINTEXT listener, e.g. 127.0.0.1:9092"))
}

/// Kafka's security protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    fn parse(value: &str) -> Option<SecurityProtocol> {
        match value {
            "PLAINTEXT" => Some(SecurityProtocol::Plaintext),
            "SSL" => Some(SecurityProtocol::Ssl),
            "SASL_PLAINTEXT" => Some(SecurityProtocol::SaslPlaintext),
            "SASL_SSL" => Some(SecurityProtocol::SaslSsl),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    pub fn uses_tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    pub fn uses_sasl(self) -> bool {
        matches!(self, SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl)
    }
}

/// A SASL mechanism a listener offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    Plain,
    Scram(weir_metadata::ScramMechanism),
}

impl SaslMechanism {
    pub fn parse(name: &str) -> Option<SaslMechanism> {
        if name.eq_ignore_ascii_case("PLAIN") {
            return Some(SaslMechanism::Plain);
        }
        weir_metadata::ScramMechanism::from_name(name).map(SaslMechanism::Scram)
    }

    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::Scram(m) => m.name(),
        }
    }
}

/// One Kafka client listener: where it binds, what it advertises, how it is secured.
#[derive(Debug, Clone)]
pub struct ClientListener {
    pub name: String,
    pub listen: SocketAddr,
    /// Host and port put in Metadata responses to the clients of this listener (port 0 until
    /// bound, when the setting said 0).
    pub advertised_host: String,
    pub advertised_port: u16,
    pub security: ClientSecurity,
}

/// How a Kafka client listener is secured.
#[derive(Debug, Clone)]
pub struct ClientSecurity {
    /// The listener's name in `listeners` (PLAINTEXT, SASL_SSL, or one of the map's).
    pub listener_name: String,
    pub protocol: SecurityProtocol,
    /// TLS, for SSL and SASL_SSL.
    pub tls: Option<weir_security::tls::TlsSettings>,
    /// The mechanisms offered, for SASL_PLAINTEXT and SASL_SSL, in the configured order.
    pub sasl_mechanisms: Vec<SaslMechanism>,
    /// `connections.max.reauth.ms`; 0: a session never expires.
    pub max_reauth_ms: u64,
    pub failed_authentication_delay_ms: u64,
    pub failed_authentications_per_minute: u32,
    pub sasl_max_receive_size: usize,
    pub max_unauthenticated_ms: u64,
    /// `ssl.principal.mapping.rules`: a mutual-TLS client's principal from its certificate.
    pub principal_rules: weir_security::principal::PrincipalRules,
}

impl ClientSecurity {
    /// A PLAINTEXT listener (and what the other settings would be).
    pub fn plaintext() -> ClientSecurity {
        ClientSecurity {
            listener_name: "PLAINTEXT".into(),
            protocol: SecurityProtocol::Plaintext,
            tls: None,
            sasl_mechanisms: Vec::new(),
            max_reauth_ms: 0,
            failed_authentication_delay_ms: 100,
            failed_authentications_per_minute: 20,
            sasl_max_receive_size: 524_288,
            max_unauthenticated_ms: 10_000,
            principal_rules: Default::default(),
        }
    }
}

/// `listener.security.protocol.map`: listener name → protocol.
fn parse_protocol_map(values: &Values) -> Result<BTreeMap<String, SecurityProtocol>, ConfigError> {
    let name = "listener.security.protocol.map";
    let value = values.get(name);
    let mut map = BTreeMap::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (listener, protocol) =
            item.split_once(':').ok_or_else(|| invalid(name, value, format!("{item:?}: expected NAME:PROTOCOL")))?;
        let protocol = SecurityProtocol::parse(protocol.trim()).ok_or_else(|| {
            invalid(name, value, format!("{protocol:?}: expected PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"))
        })?;
        map.insert(listener.trim().to_ascii_uppercase(), protocol);
    }
    Ok(map)
}

/// The TLS settings (`ssl.*`) of `listener` (its `listener.name.<listener>.ssl.*` first; `None`:
/// the global ones), checked by loading them once.
fn tls_settings(values: &Values, listener: Option<&str>) -> Result<weir_security::tls::TlsSettings, ConfigError> {
    use weir_security::tls::{ClientAuth, Pem, TlsSettings};
    let get = |name: &str| values.of_listener(listener, name);
    for format in ["ssl.keystore.type", "ssl.truststore.type"] {
        let (name, value) = get(format);
        if !value.trim().eq_ignore_ascii_case("PEM") {
            return Err(invalid(
                &name,
                value,
                "Weir reads PEM only (JKS and PKCS12 can be converted with openssl or keytool)",
            ));
        }
    }
    let (name, password) = get("ssl.key.password");
    if !password.is_empty() {
        return Err(invalid(
            &name,
            "(hidden)",
            "encrypted private keys are not supported; give the key unencrypted (openssl pkcs8 -nocrypt) and protect the file",
        ));
    }
    let (location_name, location) = get("ssl.keystore.location");
    let location = location.trim();
    let (_, chain) = get("ssl.keystore.certificate.chain");
    let (_, key) = get("ssl.keystore.key");
    let (certificate_chain, private_key) = match (location.is_empty(), chain.trim().is_empty(), key.trim().is_empty()) {
        (false, true, true) => (Pem::File(location.into()), Pem::File(location.into())),
        (true, false, false) => (Pem::Inline(chain.to_string()), Pem::Inline(key.to_string())),
        _ => {
            return Err(invalid(
                &location_name,
                location,
                "a TLS listener needs its certificate and key: ssl.keystore.location, or both ssl.keystore.certificate.chain and ssl.keystore.key",
            ))
        }
    };
    let (trust_name, trust_location) = get("ssl.truststore.location");
    let trust_location = trust_location.trim();
    let (_, trust_inline) = get("ssl.truststore.certificates");
    let truststore = match (trust_location.is_empty(), trust_inline.trim().is_empty()) {
        (true, true) => None,
        (false, true) => Some(Pem::File(trust_location.into())),
        (true, false) => Some(Pem::Inline(trust_inline.to_string())),
        (false, false) => {
            return Err(invalid(
                &trust_name,
                trust_location,
                "give ssl.truststore.location or ssl.truststore.certificates, not both",
            ))
        }
    };
    let (auth_name, auth) = get("ssl.client.auth");
    let client_auth =
        ClientAuth::parse(auth).ok_or_else(|| invalid(&auth_name, auth, "expected none, requested or required"))?;
    let (protocols_name, protocols) = get("ssl.enabled.protocols");
    let (tls12, tls13) = TlsSettings::parse_protocols(protocols).map_err(|e| invalid(&protocols_name, protocols, e))?;
    let settings =
        TlsSettings { certificate_chain, private_key, truststore, client_auth, tls12, tls13, alpn: Vec::new() };
    settings.server_config().map_err(|e| invalid(&location_name, location, e))?;
    Ok(settings)
}

/// The TLS of a listener that `switch` turns on, with the `ssl.*` keystore and `alpn` offered.
fn listener_tls(
    values: &Values,
    switch: &str,
    alpn: &[u8],
) -> Result<Option<weir_security::tls::TlsSettings>, ConfigError> {
    if !values.bool(switch)? {
        return Ok(None);
    }
    let settings = tls_settings(values, None)?;
    Ok(Some(weir_security::tls::TlsSettings { alpn: vec![alpn.to_vec()], ..settings }))
}

/// How the client listener `listener_name` is secured (its `listener.name.<listener>.*`
/// settings first).
fn client_security(values: &Values, listener_name: &str) -> Result<ClientSecurity, ConfigError> {
    let map = parse_protocol_map(values)?;
    let protocol = *map.get(listener_name).ok_or_else(|| {
        invalid(
            "listener.security.protocol.map",
            values.get("listener.security.protocol.map"),
            format!("listener {listener_name} (in `listeners`) has no security protocol here"),
        )
    })?;
    let listener = Some(listener_name);
    let get = |name: &str| values.of_listener(listener, name);
    let tls = if protocol.uses_tls() { Some(tls_settings(values, listener)?) } else { None };
    let mut sasl_mechanisms = Vec::new();
    if protocol.uses_sasl() {
        let (name, value) = get("sasl.enabled.mechanisms");
        for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let mechanism = SaslMechanism::parse(item).ok_or_else(|| {
                invalid(
                    &name,
                    value,
                    format!(
                        "{item}: Weir offers SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN (not GSSAPI or OAUTHBEARER yet)"
                    ),
                )
            })?;
            if !sasl_mechanisms.contains(&mechanism) {
                sasl_mechanisms.push(mechanism);
            }
        }
        if sasl_mechanisms.is_empty() {
            return Err(invalid(&name, value, "a SASL listener needs at least one mechanism"));
        }
    }
    let (rules_name, rules) = get("ssl.principal.mapping.rules");
    Ok(ClientSecurity {
        listener_name: listener_name.to_string(),
        protocol,
        tls,
        sasl_mechanisms,
        max_reauth_ms: listener_num(values, listener, "connections.max.reauth.ms", 0)?,
        failed_authentication_delay_ms: values.num("connection.failed.authentication.delay.ms", 0)?,
        failed_authentications_per_minute: values.num("connection.failed.authentication.max.per.minute", 1)?,
        sasl_max_receive_size: listener_num(values, listener, "sasl.server.max.receive.size", 1024)?,
        max_unauthenticated_ms: listener_num(values, listener, "connections.max.unauthenticated.ms", 100)?,
        principal_rules: weir_security::principal::PrincipalRules::parse(rules)
            .map_err(|e| invalid(&rules_name, rules, e))?,
    })
}

/// A number setting as `listener` sees it.
fn listener_num<T: std::str::FromStr + PartialOrd + std::fmt::Display>(
    values: &Values,
    listener: Option<&str>,
    name: &str,
    min: T,
) -> Result<T, ConfigError> {
    let (name, value) = values.of_listener(listener, name);
    parse_num(&name, value, min)
}

/// The CONTROLLER listener's TLS: `None` for PLAINTEXT. It speaks Weir's internal RPC, which
/// has no SASL: nodes prove themselves with certificates (`ssl.client.auth=required`).
fn controller_tls(values: &Values) -> Result<Option<weir_security::tls::TlsSettings>, ConfigError> {
    let map = parse_protocol_map(values)?;
    match map.get("CONTROLLER").copied().unwrap_or(SecurityProtocol::Plaintext) {
        SecurityProtocol::Plaintext => Ok(None),
        SecurityProtocol::Ssl => Ok(Some(tls_settings(values, Some("CONTROLLER"))?)),
        other => Err(invalid(
            "listener.security.protocol.map",
            values.get("listener.security.protocol.map"),
            format!(
                "CONTROLLER:{}: the CONTROLLER listener is PLAINTEXT or SSL; with SSL and listener.name.controller.ssl.client.auth=required, nodes authenticate with certificates",
                other.name()
            ),
        )),
    }
}

/// How this broker connects to the other brokers' inter-broker listener (a follower fetching
/// from its leader): TLS as a client, and the SASL login.
#[derive(Clone)]
pub struct InterBrokerClient {
    /// For SSL and SASL_SSL: this node's TLS settings; it checks the leader's certificate
    /// against their truststore and presents its own when asked.
    pub tls: Option<weir_security::tls::TlsSettings>,
    /// `ssl.endpoint.identification.algorithm=https`: the leader's certificate must name the
    /// address connected to.
    pub verify_name: bool,
    /// For SASL_PLAINTEXT and SASL_SSL.
    pub login: Option<SaslLogin>,
}

impl std::fmt::Debug for InterBrokerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InterBrokerClient")
            .field("tls", &self.tls.is_some())
            .field("verify_name", &self.verify_name)
            .field("login", &self.login)
            .finish()
    }
}

/// A SASL login of this node (mechanism, user name, password), from a JAAS configuration.
#[derive(Clone, PartialEq, Eq)]
pub struct SaslLogin {
    pub mechanism: SaslMechanism,
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for SaslLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SaslLogin({} as {:?}, password hidden)", self.mechanism.name(), self.user)
    }
}

/// Kafka's `sasl.jaas.config` for a client login:
/// `org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p";`
/// (PlainLoginModule for PLAIN). Values may be quoted (with `\"` and `\\` escapes) or bare.
fn parse_jaas(mechanism: SaslMechanism, text: &str) -> Result<(String, String), String> {
    let text = text.trim();
    let text = text.strip_suffix(';').unwrap_or(text).trim_end();
    let (module, rest) = text
        .split_once(char::is_whitespace)
        .ok_or("expected `<LoginModule> required username=\"...\" password=\"...\";`")?;
    let expected = match mechanism {
        SaslMechanism::Plain => "PlainLoginModule",
        SaslMechanism::Scram(_) => "ScramLoginModule",
    };
    if module.rsplit('.').next() != Some(expected) {
        return Err(format!("{} logs in with {expected}, not {module}", mechanism.name()));
    }
    let rest = rest.trim_start();
    let (flag, mut rest) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    if !matches!(flag, "required" | "requisite" | "sufficient" | "optional") {
        return Err(format!("{flag:?}: expected the control flag `required`"));
    }
    let (mut user, mut password) = (None, None);
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let (key, after) = rest.split_once('=').ok_or_else(|| format!("{rest:?}: expected key=value"))?;
        let key = key.trim();
        let (value, after) = if let Some(quoted) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some((_, escaped)) => value.push(escaped),
                        None => break,
                    },
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => value.push(c),
                }
            }
            let end = end.ok_or_else(|| format!("the value of {key} has no closing quote"))?;
            (value, &quoted[end..])
        } else {
            let end = after.find(char::is_whitespace).unwrap_or(after.len());
            (after[..end].to_string(), &after[end..])
        };
        rest = after;
        match key {
            "username" => user = Some(value),
            "password" => password = Some(value),
            _ if key.starts_with("user_") => {
                return Err(format!(
                    "{key}: Weir does not take users from the JAAS configuration; create them with `weir user create` (PLAIN logins are checked against them)"
                ))
            }
            _ => {}
        }
    }
    match (user, password) {
        (Some(user), Some(password)) if !user.is_empty() && !password.is_empty() => Ok((user, password)),
        _ => Err("needs username=\"...\" and password=\"...\"".into()),
    }
}

/// `ssl.endpoint.identification.algorithm`: whether a peer's certificate must name its address.
fn inter_broker_client_verify(values: &Values) -> Result<bool, ConfigError> {
    match values.get("ssl.endpoint.identification.algorithm").trim() {
        "" => Ok(false),
        a if a.eq_ignore_ascii_case("https") => Ok(true),
        other => Err(invalid("ssl.endpoint.identification.algorithm", other, "expected https, or empty")),
    }
}

/// How this node reaches the inter-broker listener `security` describes, as a client.
fn inter_broker_client(values: &Values, security: &ClientSecurity) -> Result<InterBrokerClient, ConfigError> {
    let verify_name = inter_broker_client_verify(values)?;
    let listener = security.listener_name.as_str();
    let tls = match &security.tls {
        Some(tls) => {
            tls.client_config(verify_name).map_err(|e| {
                let (name, value) = values.of_listener(Some(listener), "ssl.truststore.location");
                invalid(&name, value, format!("brokers connect to each other's {listener} listener over TLS: {e}"))
            })?;
            Some(tls.clone())
        }
        None => None,
    };
    let login = if security.protocol.uses_sasl() {
        let wanted = values.get("sasl.mechanism.inter.broker.protocol").trim();
        let mechanism = if wanted.is_empty() {
            security.sasl_mechanisms[0]
        } else {
            let mechanism = SaslMechanism::parse(wanted).ok_or_else(|| {
                invalid(
                    "sasl.mechanism.inter.broker.protocol",
                    wanted,
                    "expected SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN",
                )
            })?;
            if !security.sasl_mechanisms.contains(&mechanism) {
                return Err(invalid(
                    "sasl.mechanism.inter.broker.protocol",
                    wanted,
                    format!("the {listener} listener does not offer it (sasl.enabled.mechanisms)"),
                ));
            }
            mechanism
        };
        let name = format!(
            "listener.name.{}.{}.sasl.jaas.config",
            listener.to_ascii_lowercase(),
            mechanism.name().to_ascii_lowercase()
        );
        let text = values.get(&name);
        if text.trim().is_empty() {
            return Err(invalid(
                &name,
                "",
                format!(
                    "brokers log in to each other's {listener} listener with {}: give the login, e.g. {name}=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"broker\" password=\"...\";",
                    mechanism.name()
                ),
            ));
        }
        let (user, password) = parse_jaas(mechanism, text).map_err(|e| invalid(&name, "(hidden)", e))?;
        Some(SaslLogin { mechanism, user, password })
    } else {
        None
    };
    Ok(InterBrokerClient { tls, verify_name, login })
}

fn socket_addr(name: &str, value: &str, host: &str, port: u16) -> Result<SocketAddr, ConfigError> {
    let text = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
    text.parse().map_err(|_| invalid(name, value, "the host must be an IP address (e.g. 127.0.0.1 or 0.0.0.0)"))
}

/// `controller.quorum.voters`: `id@host:port,...`.
fn parse_voters(name: &str, value: &str) -> Result<BTreeMap<i32, (String, u16)>, ConfigError> {
    let mut voters = BTreeMap::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (id, addr) = item
            .split_once('@')
            .ok_or_else(|| invalid(name, value, format!("{item:?}: expected id@host:port, e.g. 1@127.0.0.1:9093")))?;
        let id: i32 = id.trim().parse().ok().filter(|id| *id >= 0).ok_or_else(|| {
            invalid(name, value, format!("{item:?}: the id must be a node.id (a number of at least 0)"))
        })?;
        let (host, port) = parse_host_port(name, value, addr.trim())?;
        if port == 0 {
            return Err(invalid(name, value, format!("{item:?}: a voter needs a fixed port")));
        }
        if voters.insert(id, (host, port)).is_some() {
            return Err(invalid(name, value, format!("voter {id} is listed twice")));
        }
    }
    Ok(voters)
}

fn parse_roles(name: &str, value: &str) -> Result<Roles, ConfigError> {
    let mut roles = Roles { broker: false, controller: false };
    for role in value.split(',').map(str::trim).filter(|r| !r.is_empty()) {
        match role {
            "broker" => roles.broker = true,
            "controller" => roles.controller = true,
            other => {
                return Err(invalid(name, value, format!("unknown role {other:?}; expected broker and/or controller")))
            }
        }
    }
    if !roles.broker && !roles.controller {
        return Err(invalid(name, value, "expected broker, controller, or broker,controller"));
    }
    Ok(roles)
}

/// The given settings sorted into their three uses, aliases resolved.
struct Merged {
    /// Every broker setting: its default, or the value given.
    values: Values,
    /// The `log.*`-style settings, by the topic config they are the default of.
    topic_defaults: BTreeMap<String, String>,
    /// The settings given explicitly, by canonical name (what `describe` marks as set).
    explicit: BTreeMap<String, String>,
}

/// Every broker setting's value by name; each reader names the setting in its error.
struct Values(BTreeMap<String, String>);

/// `group.consumer.migration.policy` (Kafka 4's names): whether a group that has members may
/// convert between the classic protocol and the consumer protocol (KIP-848) while it runs.
/// A group without members converts either way whatever the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrationPolicy {
    Bidirectional,
    Upgrade,
    Downgrade,
    Disabled,
}

impl MigrationPolicy {
    fn parse(value: &str) -> Result<Self, ConfigError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "bidirectional" => Ok(Self::Bidirectional),
            "upgrade" => Ok(Self::Upgrade),
            "downgrade" => Ok(Self::Downgrade),
            "disabled" => Ok(Self::Disabled),
            _ => Err(invalid(
                "group.consumer.migration.policy",
                value,
                "must be one of bidirectional, upgrade, downgrade, disabled",
            )),
        }
    }

    /// A running classic group may become a consumer group when a consumer-protocol member joins.
    pub fn upgrades(self) -> bool {
        matches!(self, Self::Bidirectional | Self::Upgrade)
    }

    /// A consumer group left with classic members only may become a classic group again.
    pub fn downgrades(self) -> bool {
        matches!(self, Self::Bidirectional | Self::Downgrade)
    }
}

/// `group.consumer.assignors`: a non-empty list of the assignors this broker has.
fn parse_assignors(value: &str) -> Result<Vec<String>, ConfigError> {
    let names: Vec<String> = value.split(',').map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect();
    if names.is_empty() {
        return Err(invalid("group.consumer.assignors", value, "must name at least one assignor"));
    }
    if let Some(unknown) = names.iter().find(|n| !matches!(n.as_str(), "uniform" | "range")) {
        return Err(invalid(
            "group.consumer.assignors",
            value,
            format!("unknown assignor {unknown}; known: uniform, range"),
        ));
    }
    Ok(names)
}

impl Values {
    fn get(&self, name: &str) -> &str {
        self.0.get(name).map(String::as_str).unwrap_or("")
    }

    /// A setting as `listener` sees it: `listener.name.<listener>.<name>` when given, else
    /// `name`. Returns the name that was read (for errors) and the value.
    fn of_listener(&self, listener: Option<&str>, name: &str) -> (String, &str) {
        if let Some(listener) = listener {
            let prefixed = format!("listener.name.{}.{name}", listener.to_ascii_lowercase());
            if let Some(value) = self.0.get(&prefixed) {
                return (prefixed, value);
            }
        }
        (name.to_string(), self.get(name))
    }

    fn num<T: std::str::FromStr + PartialOrd + std::fmt::Display>(&self, name: &str, min: T) -> Result<T, ConfigError> {
        parse_num(name, self.get(name), min)
    }

    fn bool(&self, name: &str) -> Result<bool, ConfigError> {
        parse_bool(name, self.get(name))
    }

    /// An optional listener that must be an IP address (`admin.listeners`, `rocketmq.listeners`);
    /// `None` when the setting is empty.
    fn ip_listener(&self, name: &str) -> Result<Option<SocketAddr>, ConfigError> {
        let value = self.get(name);
        if value.trim().is_empty() {
            return Ok(None);
        }
        let (host, port) = parse_listener(name, value)?;
        let addr = format!("{}:{port}", if host.contains(':') { format!("[{host}]") } else { host });
        let addr = addr.parse().map_err(|_| invalid(name, value, "the host must be an IP address (e.g. 127.0.0.1)"))?;
        Ok(Some(addr))
    }
}

/// The `object.store.*` settings when tiered storage is on, checked (not reached: a store that
/// is down at start-up is retried, never a reason not to start).
fn remote_storage(values: &Values) -> Result<Option<weir_tier::StoreSettings>, ConfigError> {
    if !values.bool("remote.log.storage.system.enable")? {
        return Ok(None);
    }
    let settings = weir_tier::StoreSettings {
        url: values.get("object.store.url").trim().to_string(),
        endpoint: values.get("object.store.endpoint").trim().to_string(),
        region: values.get("object.store.region").trim().to_string(),
        access_key_id: values.get("object.store.access.key.id").trim().to_string(),
        secret_access_key: values.get("object.store.secret.access.key").to_string(),
        path_style: values.bool("object.store.path.style")?,
    };
    match settings.validate() {
        Ok(()) => Ok(Some(settings)),
        Err(weir_tier::TierError::Config { name, value, reason }) => Err(invalid(&name, &value, reason)),
        Err(other) => Err(invalid("object.store.url", &settings.url, other.to_string())),
    }
}

/// Where this node listens and what it advertises.
struct Listeners {
    listen: Option<SocketAddr>,
    controller_listen: Option<SocketAddr>,
    advertised_host: String,
    advertised_port: u16,
    admin_listen: Option<SocketAddr>,
    rocketmq_listen: Option<SocketAddr>,
    security: ClientSecurity,
    client_listeners: Vec<ClientListener>,
}

/// Resolves aliases and sorts the given settings into broker settings and topic defaults;
/// an unknown name is an error.
fn merge_given(given: &BTreeMap<String, String>) -> Result<Merged, ConfigError> {
    let mut values: BTreeMap<String, String> =
        SETTINGS.iter().map(|setting| (setting.name.to_string(), setting.default.to_string())).collect();
    let mut topic_defaults: BTreeMap<String, String> = BTreeMap::new();
    let mut explicit = BTreeMap::new();
    for (name, value) in given {
        let (name, value) = match ALIASES.iter().find(|(alias, _, _)| alias == name) {
            Some((alias, canonical, factor)) => {
                let n: i64 = parse_num(alias, value, -1)?;
                let v = if n < 0 { n } else { n.saturating_mul(*factor) };
                if given.contains_key(*canonical) {
                    continue; // the finer-grained setting wins, as in Kafka
                }
                (canonical.to_string(), v.to_string())
            }
            None => (name.clone(), value.clone()),
        };
        if let Some((_, topic_name, _)) = TOPIC_DEFAULT_SETTINGS.iter().find(|(b, _, _)| *b == name) {
            topic_defaults.insert(topic_name.to_string(), value.clone());
        } else if values.contains_key(&name) {
            values.insert(name.clone(), value.clone());
        } else if let Some(prefixed) = listener_prefixed(&name) {
            values.insert(prefixed.clone(), value.clone());
            explicit.insert(prefixed, value);
            continue;
        } else {
            return Err(ConfigError::Unknown(name));
        }
        explicit.insert(name, value);
    }
    Ok(Merged { values: Values(values), topic_defaults, explicit })
}

/// Validates the topic defaults with the same code that validates topic configs, so a default
/// cannot be one that a topic could not set; the error names the broker setting.
fn validate_topic_defaults(topic_defaults: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    crate::topic_config::validate(topic_defaults).map_err(|e| match e.name {
        Some(topic_name) => {
            let broker_name = TOPIC_DEFAULT_SETTINGS
                .iter()
                .find(|(_, t, _)| *t == topic_name)
                .map(|(b, _, _)| b.to_string())
                .unwrap_or(topic_name);
            let value = topic_defaults.get(
                TOPIC_DEFAULT_SETTINGS.iter().find(|(b, _, _)| *b == broker_name).map(|(_, t, _)| *t).unwrap_or(""),
            );
            invalid(&broker_name, value.map(String::as_str).unwrap_or(""), e.message)
        }
        None => invalid("log.*", "", e.message),
    })
}

/// The listeners of `listeners`, `advertised.listeners`, `admin.listeners` and
/// `rocketmq.listeners`. A controller-only node serves no clients: it binds neither a PLAINTEXT
/// nor a RocketMQ listener.
fn parse_all_listeners(values: &Values, roles: Roles) -> Result<Listeners, ConfigError> {
    let listeners_value = values.get("listeners");
    let mut listeners = parse_listeners("listeners", listeners_value)?;
    let controller_listen = match listeners.remove("CONTROLLER") {
        Some((host, port)) => Some(socket_addr("listeners", listeners_value, &host, port)?),
        None => None,
    };
    let advertised_value = values.get("advertised.listeners");
    let mut advertised = parse_listeners("advertised.listeners", advertised_value)?;
    advertised.remove("CONTROLLER");
    // One advertised address and one client listener: it is that listener's, whatever its name
    // says (`advertised.listeners=host:port` reads as PLAINTEXT).
    if listeners.len() == 1 && advertised.len() == 1 {
        if let (Some(name), Some(addr)) = (listeners.keys().next(), advertised.values().next()) {
            advertised = BTreeMap::from([(name.clone(), addr.clone())]);
        }
    }
    if let Some(unknown) = advertised.keys().find(|name| !listeners.contains_key(*name)) {
        return Err(invalid(
            "advertised.listeners",
            advertised_value,
            format!("{unknown} is not a listener of `listeners`"),
        ));
    }
    let mut client_listeners = Vec::new();
    if roles.broker {
        for (name, (host, port)) in &listeners {
            let listen = socket_addr("listeners", listeners_value, host, *port)?;
            let (advertised_host, advertised_port) = advertised.get(name).cloned().unwrap_or((host.clone(), *port));
            let security = client_security(values, name)?;
            client_listeners.push(ClientListener {
                name: name.clone(),
                listen,
                advertised_host,
                advertised_port,
                security,
            });
        }
        if client_listeners.is_empty() {
            return Err(invalid(
                "listeners",
                listeners_value,
                "expected a Kafka client listener, e.g. 127.0.0.1:9092 or SASL_SSL://0.0.0.0:9093",
            ));
        }
        // The inter-broker listener first: it is the one registered as the broker's address.
        let wanted = values.get("inter.broker.listener.name").trim().to_ascii_uppercase();
        let primary = if !wanted.is_empty() {
            client_listeners
                .iter()
                .position(|l| l.name == wanted)
                .ok_or_else(|| invalid("inter.broker.listener.name", &wanted, "not a client listener of `listeners`"))?
        } else if client_listeners.len() == 1 {
            0
        } else {
            client_listeners.iter().position(|l| l.name == "PLAINTEXT").ok_or_else(|| {
                invalid(
                    "inter.broker.listener.name",
                    "",
                    "with several client listeners and none named PLAINTEXT, name the one brokers replicate from",
                )
            })?
        };
        let first = client_listeners.remove(primary);
        client_listeners.insert(0, first);
    }
    let (listen, advertised_host, advertised_port, security) = match client_listeners.first() {
        Some(l) => (Some(l.listen), l.advertised_host.clone(), l.advertised_port, l.security.clone()),
        None => (None, String::new(), 0, ClientSecurity::plaintext()),
    };
    let admin_listen = values.ip_listener("admin.listeners")?;
    let rocketmq_listen = if roles.broker { values.ip_listener("rocketmq.listeners")? } else { None };
    Ok(Listeners {
        listen,
        controller_listen,
        advertised_host,
        advertised_port,
        admin_listen,
        rocketmq_listen,
        security,
        client_listeners,
    })
}

impl BrokerConfig {
    /// Builds the config from named settings; unknown names and invalid values are errors.
    pub fn from_settings(given: &BTreeMap<String, String>) -> Result<BrokerConfig, ConfigError> {
        let Merged { values, topic_defaults, explicit } = merge_given(given)?;
        validate_topic_defaults(&topic_defaults)?;
        let roles = parse_roles("process.roles", values.get("process.roles"))?;
        let listeners = parse_all_listeners(&values, roles)?;
        let config = BrokerConfig::from_values(&values, roles, listeners, topic_defaults, explicit)?;
        config.check_settings_fit_together()?;
        Ok(config)
    }

    /// Reads every setting, in the order of the fields (so the first invalid one is reported).
    fn from_values(
        values: &Values,
        roles: Roles,
        listeners: Listeners,
        topic_defaults: BTreeMap<String, String>,
        explicit: BTreeMap<String, String>,
    ) -> Result<BrokerConfig, ConfigError> {
        let data_dir = PathBuf::from(values.get("log.dirs").split(',').next().unwrap_or("").trim());
        if data_dir.as_os_str().is_empty() {
            return Err(invalid("log.dirs", values.get("log.dirs"), "must name a directory"));
        }
        let rack = values.get("broker.rack").trim();
        let voters = parse_voters("controller.quorum.voters", values.get("controller.quorum.voters"))?;
        let inter_broker = if roles.broker && !voters.is_empty() {
            Some(inter_broker_client(values, &listeners.security)?)
        } else {
            None
        };
        Ok(BrokerConfig {
            node_id: values.num("node.id", 0)?,
            roles,
            voters,
            controller_listen: listeners.controller_listen,
            controller_tls: controller_tls(values)?,
            controller_principal_rules: {
                let (name, rules) = values.of_listener(Some("CONTROLLER"), "ssl.principal.mapping.rules");
                weir_security::principal::PrincipalRules::parse(rules).map_err(|e| invalid(&name, rules, e))?
            },
            verify_peer_names: inter_broker_client_verify(values)?,
            inter_broker,
            rack: (!rack.is_empty()).then(|| rack.to_string()),
            rack_aware_reads: parse_replica_selector(values.get("replica.selector.class"))?,
            broker_heartbeat_interval_ms: values.num("broker.heartbeat.interval.ms", 1)?,
            broker_session_timeout_ms: values.num("broker.session.timeout.ms", 1)?,
            liveness_watch: values.bool("controller.liveness.watch.enable")?,
            quorum_election_timeout_ms: values.num("controller.quorum.election.timeout.ms", 10)?,
            quorum_request_timeout_ms: values.num("controller.quorum.request.timeout.ms", 1)?,
            listen: listeners.listen,
            advertised_host: listeners.advertised_host,
            advertised_port: listeners.advertised_port,
            admin_listen: listeners.admin_listen,
            rocketmq_advertised_port: listeners.rocketmq_listen.map_or(0, |a: SocketAddr| a.port()),
            rocketmq_listen: listeners.rocketmq_listen,
            client_security: listeners.security,
            client_listeners: listeners.client_listeners,
            authorizer: weir_security::acl::AuthorizerSettings::parse(
                values.get("authorizer.class.name"),
                values.get("super.users"),
                values.bool("allow.everyone.if.no.acl.found")?,
            )
            .map_err(|(setting, why)| invalid(setting, values.get(setting), why))?,
            admin_require_auth: values.bool("admin.api.require.auth")?,
            admin_tls: listener_tls(values, "admin.ssl.enable", b"http/1.1")?,
            rocketmq_tls: listener_tls(values, "rocketmq.ssl.enable", b"h2")?,
            rocketmq_require_auth: values.bool("rocketmq.authentication.enable")?,
            data_dir,
            num_partitions: values.num("num.partitions", 1)?,
            default_replication_factor: values.num("default.replication.factor", 1)?,
            auto_create_topics: values.bool("auto.create.topics.enable")?,
            delete_topic_enable: values.bool("delete.topic.enable")?,
            max_partitions_per_topic: values.num("max.partitions.per.topic", 1)?,
            socket_request_max_bytes: values.num("socket.request.max.bytes", 1024)?,
            max_connections: values.num("max.connections", 1)?,
            connections_max_idle_ms: values.num("connections.max.idle.ms", 1)?,
            queued_requests_per_connection: values.num("queued.max.requests.per.connection", 1)?,
            quota_window_num: values.num("quota.window.num", 1)?,
            quota_window_size_seconds: values.num("quota.window.size.seconds", 1)?,
            fetch_sendfile: values.bool("fetch.sendfile.enable")?,
            producer_id_expiration_ms: values.num("producer.id.expiration.ms", 1)?,
            transactional_id_expiration_ms: values.num("transactional.id.expiration.ms", 1)?,
            transaction_max_timeout_ms: values.num("transaction.max.timeout.ms", 1)?,
            fault_produce_response_drop_every: values.num("fault.produce.response.drop.every", 0)?,
            group_min_session_timeout_ms: values.num("group.min.session.timeout.ms", 1)?,
            group_max_session_timeout_ms: values.num("group.max.session.timeout.ms", 1)?,
            group_initial_rebalance_delay_ms: values.num("group.initial.rebalance.delay.ms", 0)?,
            transaction_check_interval_ms: values.num("transaction.check.interval.ms", 100)?,
            transaction_check_max: values.num("transaction.check.max", 1)?,
            group_max_size: values.num("group.max.size", 1)?,
            group_consumer_heartbeat_interval_ms: values.num("group.consumer.heartbeat.interval.ms", 1)?,
            group_consumer_session_timeout_ms: values.num("group.consumer.session.timeout.ms", 1)?,
            group_share_heartbeat_interval_ms: values.num("group.share.heartbeat.interval.ms", 1)?,
            group_share_session_timeout_ms: values.num("group.share.session.timeout.ms", 1)?,
            group_share_record_lock_duration_ms: values.num("group.share.record.lock.duration.ms", 1000)?,
            group_share_delivery_count_limit: values.num("group.share.delivery.count.limit", 1)?,
            group_consumer_assignors: parse_assignors(values.get("group.consumer.assignors"))?,
            group_consumer_migration_policy: MigrationPolicy::parse(values.get("group.consumer.migration.policy"))?,
            offsets_topic_partitions: values.num("offsets.topic.num.partitions", 1)?,
            transaction_state_partitions: values.num("transaction.state.log.num.partitions", 1)?,
            offsets_topic_replication_factor: values.num("offsets.topic.replication.factor", 1)?,
            transaction_state_replication_factor: values.num("transaction.state.log.replication.factor", 1)?,
            messaging_state_partitions: values.num("messaging.state.topic.num.partitions", 1)?,
            messaging_state_replication_factor: values.num("messaging.state.topic.replication.factor", 1)?,
            messaging_state_min_isr: values.num("messaging.state.topic.min.isr", 1)?,
            replica_lag_time_max_ms: values.num("replica.lag.time.max.ms", 10)?,
            replica_fetch_max_bytes: values.num("replica.fetch.max.bytes", 1024)?,
            replica_fetch_wait_max_ms: values.num("replica.fetch.wait.max.ms", 0)?,
            fetch_session_cache_slots: values.num("max.incremental.fetch.session.cache.slots", 0)?,
            auto_leader_rebalance_enable: values.bool("auto.leader.rebalance.enable")?,
            leader_imbalance_check_interval_seconds: values.num("leader.imbalance.check.interval.seconds", 1)?,
            elastic_balance: weir_controller::balance::BalanceConfig {
                enable: values.bool("elastic.balance.enable")?,
                band: values.num("elastic.balance.band", 1.0)?,
                min_bytes_per_sec: values.num("elastic.balance.min.bytes.per.sec", 0.0)?,
            },
            elastic_balance_interval_ms: values.num("elastic.balance.interval.ms", 1000)?,
            leader_imbalance_per_broker_percentage: values.num("leader.imbalance.per.broker.percentage", 0)?,
            offsets_retention_ms: values.num::<i64>("offsets.retention.minutes", 1)?.saturating_mul(60_000),
            offsets_retention_check_interval_ms: values.num("offsets.retention.check.interval.ms", 1)?,
            metadata_snapshot_interval: values.num("metadata.snapshot.interval.records", 1)?,
            retention_check_interval_ms: values.num("log.retention.check.interval.ms", 1)?,
            flush_check_interval_ms: values.num("log.flush.scheduler.interval.ms", 1)?,
            checkpoint_interval_ms: values.num("log.flush.offset.checkpoint.interval.ms", 1)?,
            cleaner_enabled: values.bool("log.cleaner.enable")?,
            cleaner_backoff_ms: values.num("log.cleaner.backoff.ms", 1)?,
            cleaner_io_max_bytes_per_second: values.num("log.cleaner.io.max.bytes.per.second", 0)?,
            recovery_threads: values.num("num.recovery.threads.per.data.dir", 1)?,
            remote_storage: remote_storage(values)?,
            remote_log_manager_interval_ms: values.num("remote.log.manager.task.interval.ms", 10)?,
            remote_cache: weir_tier::CacheSettings {
                bytes: values.num("remote.log.cache.bytes", 1 << 20)?,
                read_ahead: values.num("remote.log.read.ahead.bytes", 64 << 10)?,
            },
            memory: MemorySettings {
                pool_bytes: values.num("memory.pool.bytes", 1 << 16)?,
                flush_ms: values.num("memory.flush.ms", 1)?,
                flush_bytes: values.num("memory.flush.bytes", 1 << 10)?,
                wal_max_age_ms: values.num("memory.wal.max.age.ms", 1_000)?,
            },
            topic_defaults,
            explicit,
        })
    }

    /// Settings each valid alone may still contradict each other; each error names the
    /// setting to change.
    fn check_settings_fit_together(&self) -> Result<(), ConfigError> {
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms {
            return Err(invalid(
                "group.min.session.timeout.ms",
                &self.group_min_session_timeout_ms.to_string(),
                "must not exceed group.max.session.timeout.ms",
            ));
        }
        self.check_cluster()?;
        if self.default_replication_factor > 1 && !self.is_cluster() {
            return Err(invalid(
                "default.replication.factor",
                &self.default_replication_factor.to_string(),
                "a single-node broker can keep only 1 replica",
            ));
        }
        Ok(())
    }

    /// True when this node is part of a configured cluster (`controller.quorum.voters` is set,
    /// even to one voter that other brokers join); false for `weir server` on its own.
    pub fn is_cluster(&self) -> bool {
        !self.voters.is_empty()
    }

    /// The quorum's voters: the configured ones, or this node alone.
    pub(crate) fn quorum_voters(&self) -> BTreeMap<i32, (String, u16)> {
        if self.voters.is_empty() {
            let local = self.controller_listen.map(|a| (a.ip().to_string(), a.port())).unwrap_or_default();
            [(self.node_id, local)].into_iter().collect()
        } else {
            self.voters.clone()
        }
    }

    /// The cluster settings must fit together; each error names the setting to change.
    fn check_cluster(&self) -> Result<(), ConfigError> {
        let roles = if self.roles.broker && self.roles.controller {
            "broker,controller"
        } else if self.roles.controller {
            "controller"
        } else {
            "broker"
        };
        let voters = self.voters.keys().map(|id| id.to_string()).collect::<Vec<_>>().join(",");
        let is_voter = self.voters.is_empty() || self.voters.contains_key(&self.node_id);
        if self.roles.controller && !is_voter {
            return Err(invalid(
                "controller.quorum.voters",
                &voters,
                format!("node.id {} has process.roles={roles} but is not one of the voters", self.node_id),
            ));
        }
        if !self.roles.controller && self.voters.is_empty() {
            return Err(invalid(
                "controller.quorum.voters",
                "",
                "a broker that is not a controller needs the voters, to find the metadata quorum",
            ));
        }
        if !self.roles.controller && self.voters.contains_key(&self.node_id) {
            return Err(invalid(
                "process.roles",
                roles,
                format!("node.id {} is a voter of controller.quorum.voters: add the controller role", self.node_id),
            ));
        }
        if self.is_cluster() && self.controller_listen.is_none() {
            return Err(invalid(
                "listeners",
                "",
                "a node of a cluster needs a CONTROLLER://host:port listener for the cluster's internal requests",
            ));
        }
        if let (Some(listen), Some((_, port))) = (self.controller_listen, self.voters.get(&self.node_id)) {
            if listen.port() != *port {
                return Err(invalid(
                    "listeners",
                    &listen.to_string(),
                    format!("the CONTROLLER listener's port differs from voter {}'s port {port}", self.node_id),
                ));
            }
        }
        if !self.roles.broker && self.voters.is_empty() {
            return Err(invalid(
                "process.roles",
                roles,
                "a node alone must be a broker (broker,controller): a controller-only node needs brokers beside it",
            ));
        }
        Ok(())
    }

    /// Parses a TOML config file into dotted setting names: nested tables are flattened, so
    /// `log.retention.ms = 1000` (a TOML table path) and `"log.retention.ms" = 1000` both work.
    pub fn settings_from_toml(text: &str, origin: &str) -> Result<BTreeMap<String, String>, ConfigError> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::File { path: origin.to_string(), reason: e.to_string() })?;
        let mut out = BTreeMap::new();
        flatten("", &toml::Value::Table(table), &mut out, origin)?;
        Ok(out)
    }

    /// The broker-level default of every topic config, as a LogConfig.
    pub(crate) fn default_log_config(&self) -> LogConfig {
        // Validated in from_settings, so this cannot fail; fall back to Kafka's defaults anyway.
        crate::topic_config::log_config(&self.topic_defaults, &BTreeMap::new()).unwrap_or_default()
    }

    /// The value and whether it was set explicitly, for every broker setting (DescribeConfigs);
    /// a [`SENSITIVE_SETTINGS`] value that is set reads `[hidden]`.
    pub fn describe(&self) -> Vec<(String, String, bool)> {
        let mut out = Vec::new();
        for setting in SETTINGS {
            let value = self.explicit.get(setting.name).cloned();
            let value =
                value.map(|v| if SENSITIVE_SETTINGS.contains(&setting.name) { "[hidden]".to_string() } else { v });
            out.push((
                setting.name.to_string(),
                value.clone().unwrap_or_else(|| setting.default.to_string()),
                value.is_some(),
            ));
        }
        for (broker_name, _, default) in TOPIC_DEFAULT_SETTINGS {
            let value = self.explicit.get(*broker_name).cloned();
            out.push((broker_name.to_string(), value.clone().unwrap_or_else(|| default.to_string()), value.is_some()));
        }
        out
    }
}

fn flatten(
    prefix: &str,
    value: &toml::Value,
    out: &mut BTreeMap<String, String>,
    origin: &str,
) -> Result<(), ConfigError> {
    match value {
        toml::Value::Table(table) => {
            for (key, inner) in table {
                let name = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                flatten(&name, inner, out, origin)?;
            }
        }
        toml::Value::String(s) => {
            out.insert(prefix.to_string(), s.clone());
        }
        toml::Value::Integer(i) => {
            out.insert(prefix.to_string(), i.to_string());
        }
        toml::Value::Float(f) => {
            out.insert(prefix.to_string(), f.to_string());
        }
        toml::Value::Boolean(b) => {
            out.insert(prefix.to_string(), b.to_string());
        }
        toml::Value::Array(items) => {
            let mut parts = Vec::new();
            for item in items {
                match item {
                    toml::Value::String(s) => parts.push(s.clone()),
                    other => parts.push(other.to_string()),
                }
            }
            out.insert(prefix.to_string(), parts.join(","));
        }
        toml::Value::Datetime(_) => {
            return Err(ConfigError::Invalid {
                name: prefix.to_string(),
                value: value.to_string(),
                reason: format!("dates are not a setting type (in {origin})"),
            })
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn defaults_parse() {
        let config = BrokerConfig::default();
        assert_eq!(config.listen.map(|a| a.to_string()).as_deref(), Some("127.0.0.1:9092"));
        assert_eq!(config.data_dir, PathBuf::from("./data"));
        assert!(config.auto_create_topics);
        assert_eq!(config.default_log_config().retention_ms, 604_800_000);
    }

    #[test]
    fn unknown_and_invalid_settings_are_named() {
        let err = BrokerConfig::from_settings(&settings(&[("log.retention.mss", "1")])).unwrap_err();
        assert!(err.to_string().contains("`log.retention.mss`"), "{err}");
        let err = BrokerConfig::from_settings(&settings(&[("num.partitions", "zero")])).unwrap_err();
        assert!(err.to_string().contains("`num.partitions`"), "{err}");
        let err = BrokerConfig::from_settings(&settings(&[("log.retention.ms", "soon")])).unwrap_err();
        assert!(err.to_string().contains("`log.retention.ms`"), "{err}");
        let err = BrokerConfig::from_settings(&settings(&[("log.flush.policy", "always")])).unwrap_err();
        assert!(err.to_string().contains("`log.flush.policy`"), "{err}");
        let err =
            BrokerConfig::from_settings(&settings(&[("group.consumer.migration.policy", "sideways")])).unwrap_err();
        assert!(err.to_string().contains("`group.consumer.migration.policy`"), "{err}");
        let config = BrokerConfig::from_settings(&settings(&[("group.consumer.migration.policy", "Upgrade")])).unwrap();
        assert!(config.group_consumer_migration_policy.upgrades());
        assert!(!config.group_consumer_migration_policy.downgrades());
    }

    #[test]
    fn aliases_and_topic_defaults() {
        let config =
            BrokerConfig::from_settings(&settings(&[("log.retention.hours", "2"), ("log.flush.policy", "sync")]))
                .unwrap();
        let log = config.default_log_config();
        assert_eq!(log.retention_ms, 7_200_000);
        assert_eq!(log.flush, weir_storage::FlushPolicy::Sync);
    }

    #[test]
    fn toml_tables_flatten_to_dotted_names() {
        let text =
            "listeners = \"127.0.0.1:19092\"\nlog.retention.ms = 5000\n[group]\ninitial.rebalance.delay.ms = 0\n";
        let map = BrokerConfig::settings_from_toml(text, "test").unwrap();
        assert_eq!(map.get("log.retention.ms").map(String::as_str), Some("5000"));
        assert_eq!(map.get("group.initial.rebalance.delay.ms").map(String::as_str), Some("0"));
        let config = BrokerConfig::from_settings(&map).unwrap();
        assert_eq!(config.listen.map(|a| a.port()), Some(19092));
        assert_eq!(config.group_initial_rebalance_delay_ms, 0);
    }

    #[test]
    fn cluster_settings_parse_and_must_fit_together() {
        let settings = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        let one = BrokerConfig::from_settings(&BTreeMap::new()).unwrap();
        assert!(!one.is_cluster());
        assert_eq!(one.quorum_voters().keys().copied().collect::<Vec<_>>(), vec![0], "a quorum of one");
        let three = BrokerConfig::from_settings(&settings(&[
            ("node.id", "2"),
            ("controller.quorum.voters", "1@127.0.0.1:9093, 2@127.0.0.1:9193,3@127.0.0.1:9293"),
            ("listeners", "PLAINTEXT://127.0.0.1:9192,CONTROLLER://127.0.0.1:9193"),
            ("broker.rack", "eu-1a"),
        ]))
        .unwrap();
        assert!(three.is_cluster());
        assert_eq!(three.voters.get(&3), Some(&("127.0.0.1".to_string(), 9293)));
        assert_eq!(three.controller_listen.map(|a| a.port()), Some(9193));
        assert_eq!(three.listen.map(|a| a.port()), Some(9192));
        assert_eq!(three.rack.as_deref(), Some("eu-1a"));
        // A controller-only node needs no Kafka listener (and binds none).
        let controller = BrokerConfig::from_settings(&settings(&[
            ("node.id", "1"),
            ("process.roles", "controller"),
            ("controller.quorum.voters", "1@127.0.0.1:9093"),
            ("listeners", "CONTROLLER://127.0.0.1:9093"),
        ]))
        .unwrap();
        assert_eq!(controller.listen, None);
        assert!(controller.is_cluster() && !controller.roles.broker);
        for (bad, setting) in [
            (vec![("process.roles", "controller")], "process.roles"),
            (vec![("node.id", "1"), ("controller.quorum.voters", "1@127.0.0.1:9093,2@127.0.0.1:9193")], "listeners"),
            (vec![("controller.quorum.voters", "1@x")], "controller.quorum.voters"),
            (vec![("controller.quorum.voters", "1@127.0.0.1:9093"), ("node.id", "5")], "controller.quorum.voters"),
            (vec![("process.roles", "broker")], "controller.quorum.voters"),
            (vec![("process.roles", "cook")], "process.roles"),
            (vec![("listeners", "SSL://127.0.0.1:9092")], "ssl.keystore.location"),
            (
                vec![
                    ("listeners", "SASL_PLAINTEXT://127.0.0.1:9092,EXTERNAL://127.0.0.1:9093"),
                    ("listener.security.protocol.map", "SASL_PLAINTEXT:SASL_PLAINTEXT,EXTERNAL:SASL_PLAINTEXT"),
                ],
                "inter.broker.listener.name",
            ),
            (
                vec![
                    ("listeners", "PLAINTEXT://127.0.0.1:9092"),
                    ("advertised.listeners", "PLAINTEXT://h:1,SSL://h:2"),
                ],
                "advertised.listeners",
            ),
            (
                vec![
                    ("controller.quorum.voters", "0@127.0.0.1:9093"),
                    ("listeners", "SASL_PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"),
                ],
                "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config",
            ),
            (
                vec![
                    ("controller.quorum.voters", "0@127.0.0.1:9093"),
                    ("listeners", "SASL_PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"),
                    ("sasl.mechanism.inter.broker.protocol", "PLAIN"),
                    (
                        "listener.name.sasl_plaintext.plain.sasl.jaas.config",
                        "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"b\" password=\"p\";",
                    ),
                ],
                "listener.name.sasl_plaintext.plain.sasl.jaas.config",
            ),
            (
                vec![
                    ("controller.quorum.voters", "0@127.0.0.1:9093"),
                    ("listeners", "SASL_PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"),
                    ("listener.name.sasl_plaintext.sasl.enabled.mechanisms", "PLAIN"),
                    ("sasl.mechanism.inter.broker.protocol", "SCRAM-SHA-512"),
                ],
                "sasl.mechanism.inter.broker.protocol",
            ),
            (vec![("listener.name.plaintext.num.partitions", "3")], "listener.name.plaintext.num.partitions"),
            (
                vec![("listeners", "SASL_PLAINTEXT://127.0.0.1:9092"), ("listener.name.sasl_plaintext.sasl.enabled.mechanisms", "GSSAPI")],
                "listener.name.sasl_plaintext.sasl.enabled.mechanisms",
            ),
            (vec![("listeners", "EXTERNAL://127.0.0.1:9092")], "listener.security.protocol.map"),
            (
                vec![("listeners", "SASL_PLAINTEXT://127.0.0.1:9092"), ("sasl.enabled.mechanisms", "GSSAPI")],
                "sasl.enabled.mechanisms",
            ),
            (
                vec![("listener.security.protocol.map", "PLAINTEXT:PLAINTEXT,CONTROLLER:SASL_SSL")],
                "listener.security.protocol.map",
            ),
            (vec![("listener.security.protocol.map", "PLAINTEXT:PLAINTEXT,CONTROLLER:SSL")], "ssl.keystore.location"),
            (
                vec![("listeners", "SSL://127.0.0.1:9092"), ("ssl.keystore.location", "/nonexistent.pem")],
                "ssl.keystore.location",
            ),
            (
                vec![
                    ("controller.quorum.voters", "0@127.0.0.1:9093,1@127.0.0.1:9193"),
                    ("listeners", "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9999"),
                ],
                "listeners",
            ),
        ] {
            let err = BrokerConfig::from_settings(&settings(&bad)).unwrap_err();
            assert_eq!(err.setting(), Some(setting), "{bad:?}: {err}");
        }
    }

    #[test]
    fn brokers_log_in_to_a_sasl_inter_broker_listener_with_its_jaas_login() {
        let config = BrokerConfig::from_settings(&settings(&[
            ("controller.quorum.voters", "0@127.0.0.1:9093"),
            ("listeners", "SASL_PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"),
            ("sasl.mechanism.inter.broker.protocol", "SCRAM-SHA-512"),
            ("LISTENER.NAME.SASL_PLAINTEXT.connections.max.reauth.ms".to_ascii_lowercase().as_str(), "60000"),
            (
                "listener.name.SASL_PLAINTEXT.scram-sha-512.sasl.jaas.config",
                r#"org.apache.kafka.common.security.scram.ScramLoginModule required
                    username="broker" password="p\"w d";"#,
            ),
        ]))
        .unwrap();
        let login = config.inter_broker.as_ref().and_then(|c| c.login.clone()).unwrap();
        assert_eq!(login.mechanism.name(), "SCRAM-SHA-512");
        assert_eq!((login.user.as_str(), login.password.as_str()), ("broker", "p\"w d"));
        assert!(!format!("{config:?}").contains("p\"w d"), "the password is never printed");
        assert_eq!(config.client_security.max_reauth_ms, 60_000, "the listener's own setting");
        assert!(config.controller_tls.is_none());
        // A single node replicates from nobody: no login needed.
        let single =
            BrokerConfig::from_settings(&settings(&[("listeners", "SASL_PLAINTEXT://127.0.0.1:9092")])).unwrap();
        assert!(single.inter_broker.is_none());
    }

    #[test]
    fn jaas_logins() {
        let scram = SaslMechanism::Scram(weir_metadata::ScramMechanism::Sha256);
        let ok = |text| parse_jaas(scram, text);
        assert_eq!(
            ok("org.apache.kafka.common.security.scram.ScramLoginModule required username=u password=\"a b\""),
            Ok(("u".into(), "a b".into()))
        );
        assert_eq!(
            parse_jaas(SaslMechanism::Plain, "PlainLoginModule required username=\"u\" password=\"x\\\\y\";"),
            Ok(("u".into(), "x\\y".into()))
        );
        for bad in [
            "",
            "ScramLoginModule",
            "ScramLoginModule maybe username=u password=p;",
            "ScramLoginModule required username=u;",
            "ScramLoginModule required username=\"u password=p;",
            "ScramLoginModule required username=u password=p user_alice=\"x\";",
            "PlainLoginModule required username=u password=p;",
        ] {
            assert!(ok(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn several_client_listeners_the_inter_broker_one_first() {
        let config = BrokerConfig::from_settings(&settings(&[
            ("listeners", "SASL_PLAINTEXT://0.0.0.0:9093,PLAINTEXT://127.0.0.1:9092"),
            ("advertised.listeners", "SASL_PLAINTEXT://broker1.example.com:9093"),
        ]))
        .unwrap();
        let names: Vec<&str> = config.client_listeners.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["PLAINTEXT", "SASL_PLAINTEXT"]);
        assert_eq!(config.listen.map(|a| a.port()), Some(9092));
        assert_eq!((config.advertised_host.as_str(), config.advertised_port), ("127.0.0.1", 9092));
        let external = &config.client_listeners[1];
        assert_eq!((external.advertised_host.as_str(), external.advertised_port), ("broker1.example.com", 9093));
        assert!(external.security.protocol.uses_sasl());
        let named = BrokerConfig::from_settings(&settings(&[
            ("listeners", "SASL_PLAINTEXT://0.0.0.0:9093,PLAINTEXT://127.0.0.1:9092"),
            ("inter.broker.listener.name", "SASL_PLAINTEXT"),
        ]))
        .unwrap();
        assert_eq!(named.client_listeners[0].name, "SASL_PLAINTEXT");
    }

    #[test]
    fn example_file_documents_every_setting() {
        let text = include_str!("../../../weir.example.toml");
        // Uncomment the `# name = value` lines, leaving the prose comments alone.
        let is_setting = |l: &&str| {
            l.split_once(" = ").is_some_and(|(name, _)| name.bytes().all(|b| b.is_ascii_lowercase() || b == b'.'))
        };
        let uncommented: String =
            text.lines().map(|l| l.strip_prefix("# ").filter(is_setting).unwrap_or(l)).collect::<Vec<_>>().join("\n");
        let map = BrokerConfig::settings_from_toml(&uncommented, "weir.example.toml").unwrap();
        for setting in SETTINGS {
            assert_eq!(map.get(setting.name).map(String::as_str), Some(setting.default), "{}", setting.name);
        }
        for (name, _, default) in TOPIC_DEFAULT_SETTINGS {
            assert_eq!(map.get(*name).map(String::as_str), Some(*default), "{name}");
        }
        BrokerConfig::from_settings(&map).unwrap();
    }
}
