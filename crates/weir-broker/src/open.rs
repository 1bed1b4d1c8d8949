//! Opening a broker: the order in which its parts start, and who is wired to whom.
//!
//! [`Broker::open`] binds the CONTROLLER listener (a busy port fails before any recovery
//! work), recovers the partition logs, starts this node's part of the metadata quorum and the
//! internal RPC server (Raft messages are answered from then on: the quorum needs them to
//! elect), assembles the [`Broker`], and only then hands it to the RPC server, registers the
//! forwarding services, brings the partitions in line with the applied metadata and starts the
//! controller, the ISR checks and the lifecycle. A broker node returns once the controller has
//! unfenced it.
//!
//! This file sits above every other part of the data path: `broker.rs` knows none of what is
//! started here.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use weir_storage::sync::lock;
use weir_storage::{Clock, LogManager, ManagerOptions, SystemClock};

use crate::broker::{io_error, Broker};
use crate::cluster::rpc::RpcRaftTransport;
use crate::cluster::Cluster;
use crate::config::BrokerConfig;
use crate::error::{BrokerError, ErrorKind};
use crate::metadata::legacy;
use crate::metadata::raft::network::{NoPeers, RaftTransport};
use crate::metadata::raft::{Quorum, QuorumConfig};
use crate::runtime::block_on;

impl Broker {
    /// Opens the data directory: recovers the partition logs, starts this node's part of the
    /// metadata quorum, and brings the logs in line with the applied metadata. Blocking; call it
    /// within a multi-threaded tokio runtime (from a blocking thread, or a worker thread).
    pub fn open(config: BrokerConfig) -> Result<Arc<Broker>, BrokerError> {
        let internal_listener = bind_internal_listener(&config)?;
        let internal_address = match &internal_listener {
            None => None,
            Some(listener) => Some(internal_address(&config, listener)?),
        };
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let tier = match &config.remote_storage {
            None => None,
            Some(settings) => {
                Some(Arc::new(crate::tier::Tier::open(settings, &config.data_dir, config.remote_cache).map_err(
                    |e| BrokerError::new(ErrorKind::InvalidConfig, format!("cannot open the object store: {e}")),
                )?))
            }
        };
        let logs = open_logs(&config, &clock)?;
        let invalid_tls = |e: String| {
            BrokerError::new(ErrorKind::InvalidConfig, format!("the CONTROLLER listener's TLS (CONTROLLER:SSL): {e}"))
        };
        let cluster = Cluster::new(crate::cluster::server::client_tls(&config).map_err(invalid_tls)?);
        let (quorum, alone) = start_quorum(&config, &cluster, internal_listener.is_some(), &clock)?;
        // The server answers Raft messages at once, the rest once the broker is open.
        let opened: Arc<OnceLock<Weak<Broker>>> = Arc::new(OnceLock::new());
        if let Some(listener) = internal_listener {
            let tls = crate::cluster::server::server_tls(&config).map_err(invalid_tls)?;
            let server = crate::cluster::server::serve(listener, quorum.messages(), opened.clone(), tls)
                .map_err(|e| io_error("cannot serve the CONTROLLER listener", e))?;
            *lock(&cluster.server) = Some(server);
        }
        if alone {
            // A quorum of one elects itself at once instead of waiting out an election timeout.
            block_on(async {
                if quorum.leader().is_none() {
                    quorum.elect_now().await;
                }
                quorum.wait_for_leader(Duration::from_secs(30)).await
            })??;
        }
        let broker = Broker::assemble(config, clock, logs, quorum, cluster, internal_address, tier);
        let _ = opened.set(Arc::downgrade(&broker));
        crate::forward::register(&broker);
        broker.start(alone)?;
        Ok(broker)
    }

    /// The steps of [`Broker::open`] once the broker exists: the metadata, the partitions, and
    /// the tasks that keep them current.
    fn start(self: &Arc<Self>, alone: bool) -> Result<(), BrokerError> {
        if alone {
            self.upgrade_metadata()?;
        } else if legacy::exists(&self.config.data_dir) {
            tracing::warn!(
                "this data directory holds the metadata of a Weir 0.1 single node; start it once as a single node \
                 (without controller.quorum.voters) to move it to the new format before it joins a cluster"
            );
        }
        self.reconcile_to(self.quorum.applied())?;
        // Before any client: memory-first partitions hold what the object store holds.
        self.recover_memory_partitions();
        self.follow_metadata();
        if self.config.roles.controller {
            self.run_controller();
            if self.config.is_cluster() && self.config.liveness_watch {
                self.run_leader_watch();
            }
        }
        if self.config.roles.broker {
            self.run_isr_checks();
            self.run_load_sampler();
            self.run_tier_uploads();
            self.run_memory_writer();
            self.run_elastic_autoscaler();
            self.run_lifecycle();
            // As a KRaft broker does: serve clients only once the controller has unfenced it.
            block_on(self.wait_until_unfenced())?;
            // Before its followers log in to the other brokers with it.
            if let Err(e) = block_on(self.ensure_inter_broker_user())? {
                tracing::warn!(error = %e, "cannot create the inter-broker user; replication over SASL will fail until it exists");
            }
        }
        self.start_storage_background()?;
        Ok(())
    }

    /// Tells the controller this broker is going away, so that its partitions lose their leader
    /// now rather than at its session timeout (Kafka's controlled shutdown). Bounded by the
    /// quorum request timeout; skipped on a node that is the whole quorum.
    pub async fn leave_cluster(self: &Arc<Self>) {
        if !self.config.is_cluster() || !self.config.roles.broker {
            return;
        }
        self.lifecycle_round(true, true).await;
    }
}

/// The CONTROLLER listener, when the settings give one.
fn bind_internal_listener(config: &BrokerConfig) -> Result<Option<TcpListener>, BrokerError> {
    let Some(addr) = config.controller_listen else { return Ok(None) };
    TcpListener::bind(addr).map(Some).map_err(|e| {
        BrokerError::new(
            ErrorKind::InvalidConfig,
            format!("cannot listen on {addr} (the CONTROLLER listener of `listeners`): {e}"),
        )
    })
}

/// Where other nodes reach this one's internal RPC server: the voters' entry for this node,
/// else the bound address (with the advertised host in place of an unspecified IP).
fn internal_address(config: &BrokerConfig, listener: &TcpListener) -> Result<String, BrokerError> {
    let bound = listener.local_addr().map_err(|e| io_error("the CONTROLLER listener", e))?;
    Ok(match config.voters.get(&config.node_id) {
        Some((host, port)) => format!("{host}:{port}"),
        None if bound.ip().is_unspecified() => format!("{}:{}", config.advertised_host, bound.port()),
        None => bound.to_string(),
    })
}

/// Recovers the partition logs of the data directory.
fn open_logs(config: &BrokerConfig, clock: &Arc<dyn Clock>) -> Result<Arc<LogManager>, BrokerError> {
    let mut options = ManagerOptions::new(config.data_dir.clone());
    options.default_config = config.default_log_config();
    options.clock = clock.clone();
    options.retention_check_interval_ms = config.retention_check_interval_ms;
    options.flush_check_interval_ms = config.flush_check_interval_ms;
    options.checkpoint_interval_ms = config.checkpoint_interval_ms;
    options.cleaner_enabled = config.cleaner_enabled;
    options.cleaner_backoff_ms = config.cleaner_backoff_ms;
    options.cleaner_io_max_bytes_per_second = config.cleaner_io_max_bytes_per_second;
    options.recovery_threads = config.recovery_threads;
    options.producer_id_expiration_ms = config.producer_id_expiration_ms;
    Ok(LogManager::open(options)?)
}

/// Starts this node's part of the metadata quorum. Also returns whether the quorum is this node
/// alone (other brokers may still join it as learners, over the CONTROLLER listener when it
/// has one).
fn start_quorum(
    config: &BrokerConfig,
    cluster: &Cluster,
    has_internal_listener: bool,
    clock: &Arc<dyn Clock>,
) -> Result<(Quorum, bool), BrokerError> {
    let quorum_dir = config.data_dir.join(legacy::METADATA_DIR).join("raft");
    let node_id = u64::try_from(config.node_id).unwrap_or_default();
    let voters: BTreeMap<u64, String> = config
        .quorum_voters()
        .into_iter()
        .map(|(id, (host, port))| {
            let addr = if host.is_empty() { String::new() } else { format!("{host}:{port}") };
            (u64::try_from(id).unwrap_or_default(), addr)
        })
        .collect();
    let alone = voters.len() == 1 && voters.contains_key(&node_id);
    let transport: Arc<dyn RaftTransport> = if alone && !has_internal_listener {
        Arc::new(NoPeers)
    } else {
        Arc::new(RpcRaftTransport::new(cluster.rpc.clone()))
    };
    let quorum_config = QuorumConfig {
        node_id,
        voters,
        election_timeout_ms: config.quorum_election_timeout_ms,
        snapshot_interval: config.metadata_snapshot_interval,
        commit_timeout_ms: config.quorum_request_timeout_ms,
    };
    let quorum = block_on(Quorum::start(&quorum_dir, quorum_config, transport, clock.clone()))??;
    Ok((quorum, alone))
}
