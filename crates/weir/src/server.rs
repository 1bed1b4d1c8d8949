//! `weir server`: load the settings, open the data directory, serve the Kafka protocol and the
//! admin HTTP API until SIGTERM/SIGINT, then shut down cleanly.
//!
//! Order of events: bind both addresses (a busy port fails before any recovery work); serve
//! the admin API at once (`/health` is 200, `/ready` and the API 503 while the logs recover);
//! open the broker and load the group and transaction coordinators; register the Kafka API
//! metrics; start listening and accepting on the Kafka port (until then a client is refused,
//! not left waiting); hand the broker to the admin API (`/ready` 200); and only then print the
//! addresses, so a printed line means everything serves. On a signal:
//! the Kafka listener closes and drains (the broker is now shutting down, so `/ready` is 503
//! and long polls return), then the admin listener stops gracefully, then the group
//! coordinator and the logs close.
//!
//! A controller-only node (`process.roles=controller`) serves no Kafka clients: it binds no
//! Kafka listener, votes in the metadata quorum and, as the active controller, decides; it
//! prints its CONTROLLER address instead and runs until a signal.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::oneshot;
use weir_broker::config::BrokerConfig;
use weir_broker::Broker;
use weir_coordinators::group::GroupCoordinator;
use weir_coordinators::txn::TxnCoordinator;
use weir_kafka::Ctx;
use weir_messaging::Messaging;

use crate::cli::ServerArgs;

/// `matches`: the server subcommand's, which tell where each flag's value came from.
pub fn run(args: &ServerArgs, matches: Option<&clap::ArgMatches>) -> anyhow::Result<()> {
    let started = Instant::now();
    let config = crate::settings::load_config(args, matches)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("weir").build()?;
    runtime.block_on(serve(config, started))
}

/// The order of events of the module header, one step a call.
async fn serve(mut config: BrokerConfig, started: Instant) -> anyhow::Result<()> {
    let listeners = bind_listeners(&mut config).await?;
    // The admin API's state exists without its listener too: other nodes' admin APIs
    // forward requests to it over the cluster's internal RPC.
    let admin_state = weir_admin::AdminState::new(started, listeners.kafka_addr, listeners.admin_addr);
    let admin_tls = listener_tls(config.admin_tls.clone(), "admin")?;
    let admin = listeners.admin.map(|(listener, addr)| AdminServer::start(listener, addr, admin_tls, &admin_state));
    let rocketmq_tls = listener_tls(config.rocketmq_tls.clone(), "RocketMQ")?;
    let data_dir = config.data_dir.clone();
    let core = open_core(config).await?;
    // Other nodes' HTTP APIs read and write this broker's partitions through it.
    weir_admin::forward::register(&admin_state, &core.broker);
    // The messaging engines (receives by invisible time, dead letters, renewals, transaction
    // checks) run with a front-end that uses them: RocketMQ's, or Kafka's for share groups. A
    // broker serving neither never redelivers, dead-letters or rolls back.
    let engines = (listeners.kafka_socket.is_some() || listeners.rocketmq.is_some())
        .then(|| weir_messaging::Engines::start(&core.messaging, &core.groups));
    // Registers the Kafka API metrics too, before anything is announced.
    let mut kafka_ctx = Ctx::new(core.broker.clone(), core.groups.clone(), core.txns.clone());
    if let Some(engines) = &engines {
        kafka_ctx = kafka_ctx.with_share_groups(core.messaging.clone(), engines.pop.clone());
    }
    let ctx = Arc::new(kafka_ctx);
    let (stopped, stop) = tokio::sync::watch::channel(false);
    let kafka = match (listeners.kafka_socket, listeners.kafka_addr) {
        (Some(socket), Some(addr)) => Some(serve_kafka(socket, addr, ctx.clone(), &core.broker, stopped)?),
        _ => None,
    };
    // The other listeners stop accepting when the first does, and finish within its grace.
    let mut more_kafka = Vec::new();
    for (index, (socket, bound)) in listeners.more_kafka.into_iter().enumerate() {
        let listener = socket
            .listen(KAFKA_BACKLOG)
            .with_context(|| format!("cannot listen on {bound} (the `listeners` setting)"))?;
        let mut stop = stop.clone();
        let stopping = async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        };
        tracing::info!(listen = %bound, "Kafka listener");
        more_kafka.push(tokio::spawn(weir_kafka::serve(
            listener,
            index + 1,
            ctx.clone(),
            stopping,
            Broker::SHUTDOWN_GRACE,
        )));
    }
    // RocketMQ clients, once the Kafka side serves: the same broker and coordinators.
    let rocketmq = match (listeners.rocketmq, &engines) {
        (Some(listener), Some(engines)) => Some(RocketMqServer::start(listener, rocketmq_tls, &core, engines)?),
        _ => None,
    };
    // Followers replicate from their leaders with Kafka's Fetch, secured as the inter-broker
    // listener is (the settings were checked at start: an error here is a file gone since).
    let replication = match kafka.is_some() {
        true => {
            let transport =
                weir_kafka::replica_fetcher::KafkaReplicaTransport::new(core.broker.config.inter_broker.as_ref())
                    .map_err(|e| anyhow::anyhow!("the inter-broker listener's TLS: {e}"))?;
            Some(weir_broker::follower::spawn(core.broker.clone(), std::sync::Arc::new(transport)))
        }
        false => None,
    };
    admin_state.set_ready(weir_admin::Core {
        broker: core.broker.clone(),
        groups: core.groups.clone(),
        messaging: core.messaging.clone(),
    });
    // Everything serves now: only then the lines that tests and scripts wait for.
    announce(
        &core.broker,
        &data_dir,
        listeners.kafka_addr,
        rocketmq.as_ref().map(|r| r.addr),
        admin.as_ref().map(|a| a.addr),
    );

    let left = kafka.is_some();
    match kafka {
        Some(kafka) => {
            kafka.await.context("the Kafka listener task failed")?;
            for listener in more_kafka {
                listener.await.context("a Kafka listener task failed")?;
            }
        }
        None => {
            shutdown_signal().await;
            core.broker.begin_shutdown();
        }
    }
    if let Some(replication) = replication {
        replication.abort();
    }
    if let Some(rocketmq) = rocketmq {
        core.broker.begin_shutdown();
        rocketmq.stop().await;
    }
    if let Some(admin) = admin {
        admin.stop().await;
    }
    if !left {
        core.broker.leave_cluster().await;
    }
    core.close().await
}

/// Every listener this node serves on, bound before any recovery work.
struct Listeners {
    /// Bound, not yet listening: the socket listens (takes connections) only once the broker
    /// can answer them.
    kafka_socket: Option<TcpSocket>,
    kafka_addr: Option<SocketAddr>,
    /// The other Kafka client listeners, in the order of `config.client_listeners` after the
    /// first.
    more_kafka: Vec<(TcpSocket, SocketAddr)>,
    admin: Option<(TcpListener, SocketAddr)>,
    admin_addr: Option<SocketAddr>,
    rocketmq: Option<TcpListener>,
}

/// Binds first, so that a busy port fails fast, and advertises the ports bound where the
/// settings said 0.
async fn bind_listeners(config: &mut BrokerConfig) -> anyhow::Result<Listeners> {
    let kafka_socket = match config.listen {
        Some(addr) if config.roles.broker => Some(bind_kafka(addr)?),
        _ => None,
    };
    let kafka_addr = match &kafka_socket {
        Some(socket) => Some(socket.local_addr()?),
        None => None,
    };
    if let (Some(bound), 0) = (kafka_addr, config.advertised_port) {
        config.advertised_port = bound.port();
    }
    // The other client listeners (the first is the one above), each advertising its bound port
    // where the settings said 0.
    let mut more_kafka = Vec::new();
    if config.roles.broker {
        if let Some(first) = config.client_listeners.first_mut() {
            first.advertised_port = config.advertised_port;
        }
        for listener in config.client_listeners.iter_mut().skip(1) {
            let socket = bind_kafka(listener.listen)?;
            let bound = socket.local_addr()?;
            if listener.advertised_port == 0 {
                listener.advertised_port = bound.port();
            }
            more_kafka.push((socket, bound));
        }
    }
    let admin = match config.admin_listen {
        None => None,
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (the `admin.listeners` setting)"))?,
        ),
    };
    let rocketmq = match config.rocketmq_listen {
        Some(addr) if config.roles.broker => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (the `rocketmq.listeners` setting)"))?,
        ),
        _ => None,
    };
    if let Some(listener) = &rocketmq {
        // Routes give clients the bound port (the setting may say 0).
        config.rocketmq_advertised_port = listener.local_addr()?.port();
    }
    let admin = match admin {
        Some(listener) => {
            let addr = listener.local_addr()?;
            Some((listener, addr))
        }
        None => None,
    };
    let admin_addr = admin.as_ref().map(|(_, addr)| *addr);
    Ok(Listeners { kafka_socket, kafka_addr, more_kafka, admin, admin_addr, rocketmq })
}

/// The broker and the coordinators every front-end shares.
struct Core {
    broker: Arc<Broker>,
    messaging: Arc<Messaging>,
    groups: Arc<GroupCoordinator>,
    txns: Arc<TxnCoordinator>,
}

/// Opens the data directory (recovering the logs), the messaging stores, and loads the groups
/// and transactions, on blocking threads: recovery reads files.
async fn open_core(config: BrokerConfig) -> anyhow::Result<Core> {
    let data_dir = config.data_dir.clone();
    let broker = tokio::task::spawn_blocking(move || Broker::open(config))
        .await?
        .map_err(|e| anyhow::anyhow!("cannot open the data directory {}: {}", data_dir.display(), e.message))?;
    // The messaging stores open with the broker, whatever protocols are served: Kafka produce
    // to a DELAY topic needs the timer. Then the indexer starts, and delayed messages due while
    // the broker was down fire now.
    let messaging = {
        let broker = broker.clone();
        tokio::task::spawn_blocking(move || Messaging::open(&broker))
            .await?
            .map_err(|e| anyhow::anyhow!("cannot open the messaging stores: {}", e.message))?
    };
    messaging.start().context("cannot start the message indexer")?;
    let groups = {
        let broker = broker.clone();
        tokio::task::spawn_blocking(move || GroupCoordinator::start(broker))
            .await?
            .map_err(|e| anyhow::anyhow!("cannot load consumer groups: {}", e.message))?
    };
    let txns = {
        let (broker, groups) = (broker.clone(), groups.clone());
        tokio::task::spawn_blocking(move || TxnCoordinator::start(broker, groups))
            .await?
            .map_err(|e| anyhow::anyhow!("cannot load transactions: {}", e.message))?
    };
    Ok(Core { broker, messaging, groups, txns })
}

impl Core {
    /// Closes the group coordinator, then the logs.
    async fn close(self) -> anyhow::Result<()> {
        self.groups.shutdown();
        let closing = self.broker.clone();
        tokio::task::spawn_blocking(move || closing.shutdown()).await?.map_err(|e| anyhow::anyhow!("{}", e.message))?;
        tracing::info!("shut down cleanly");
        Ok(())
    }
}

/// Starts listening on the Kafka socket and accepting until a signal.
fn serve_kafka(
    socket: TcpSocket,
    bound: SocketAddr,
    ctx: Arc<Ctx>,
    broker: &Arc<Broker>,
    stopped: tokio::sync::watch::Sender<bool>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener =
        socket.listen(KAFKA_BACKLOG).with_context(|| format!("cannot listen on {bound} (the `listeners` setting)"))?;
    // The accept loop runs on the runtime's workers from here on, whatever this
    // thread does next (a blocked stdout or stderr included).
    // Controlled shutdown first, as Kafka's: leadership moves to other brokers while
    // this one still answers, so writes waiting here for the ISR fail over at once.
    let leaving = broker.clone();
    let stopping = async move {
        shutdown_signal().await;
        let _ = stopped.send(true);
        leaving.leave_cluster().await;
    };
    Ok(tokio::spawn(weir_kafka::serve(listener, 0, ctx, stopping, Broker::SHUTDOWN_GRACE)))
}

/// Prints the address lines that tests and scripts wait for, and logs the start.
fn announce(
    broker: &Broker,
    data_dir: &Path,
    kafka: Option<SocketAddr>,
    rocketmq: Option<SocketAddr>,
    admin: Option<SocketAddr>,
) {
    let shown_dir = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    match kafka {
        Some(bound) => println!("{}", weir_harness::address_lines::kafka_line(bound, &shown_dir)),
        None => println!(
            "{}",
            weir_harness::address_lines::controller_line(broker.internal_address().unwrap_or_default(), &shown_dir)
        ),
    }
    if let Some(addr) = rocketmq {
        println!("{}", weir_harness::address_lines::rocketmq_line(addr));
    }
    if let Some(addr) = admin {
        if broker.config.admin_tls.is_some() {
            println!("{}", weir_harness::address_lines::admin_tls_line(addr));
        } else {
            println!("{}", weir_harness::address_lines::admin_line(addr));
        }
    }
    match kafka {
        Some(bound) => {
            tracing::info!(listen = %bound, data_dir = %shown_dir.display(), cluster_id = %broker.cluster_id(), "broker started")
        }
        None => {
            tracing::info!(data_dir = %shown_dir.display(), cluster_id = %broker.cluster_id(), "controller started")
        }
    }
}

/// Connections the kernel queues for the Kafka listener before they are accepted (tokio's
/// `TcpListener::bind` uses the same).
const KAFKA_BACKLOG: u32 = 1024;

/// Binds the Kafka address without listening yet: the port is ours (a busy one fails here),
/// but a client that connects during recovery is refused instead of waiting unanswered.
fn bind_kafka(addr: SocketAddr) -> anyhow::Result<TcpSocket> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }?;
    // As TcpListener::bind does: a restart may bind while old connections are in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr).with_context(|| format!("cannot listen on {addr} (the `listeners` setting)"))?;
    Ok(socket)
}

/// A listener's TLS from its settings (checked when the settings were read; a file that
/// vanished since is a start-up error).
fn listener_tls(
    settings: Option<weir_security::tls::TlsSettings>,
    listener: &str,
) -> anyhow::Result<Option<Arc<weir_security::tls::ReloadingTls>>> {
    settings
        .map(|s| weir_security::tls::ReloadingTls::new(s).map(Arc::new))
        .transpose()
        .map_err(|e| anyhow::anyhow!("the {listener} listener's TLS does not load: {e}"))
}

/// The running admin HTTP listener.
struct AdminServer {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl AdminServer {
    /// Serves the admin API at once: `/health` answers during recovery.
    fn start(
        listener: TcpListener,
        addr: SocketAddr,
        tls: Option<Arc<weir_security::tls::ReloadingTls>>,
        state: &Arc<weir_admin::AdminState>,
    ) -> AdminServer {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(weir_admin::serve(listener, tls, state.clone(), async {
            let _ = stopped.await;
        }));
        AdminServer { addr, stop, task }
    }

    /// Stops accepting and waits for the requests in progress, at most the shutdown grace.
    async fn stop(self) {
        let _ = self.stop.send(());
        let mut task = self.task;
        if !ended_within_grace(&mut task, "admin listener").await {
            tracing::warn!("admin requests still running after the grace period; closing them");
            task.abort();
        }
    }
}

/// The running RocketMQ gRPC listener.
struct RocketMqServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl RocketMqServer {
    /// Serves RocketMQ clients until the broker begins shutting down.
    fn start(
        listener: TcpListener,
        tls: Option<Arc<weir_security::tls::ReloadingTls>>,
        core: &Core,
        engines: &weir_messaging::Engines,
    ) -> anyhow::Result<RocketMqServer> {
        let addr = listener.local_addr()?;
        let engines = weir_messaging::Engines { pop: engines.pop.clone(), transactions: engines.transactions.clone() };
        let service =
            weir_rocketmq::Service::open(core.broker.clone(), core.groups.clone(), core.messaging.clone(), engines);
        let mut stopping = core.broker.shutdown_signal();
        let stopped = async move {
            let _ = stopping.wait_for(|down| *down).await;
        };
        let serving = weir_rocketmq::serve(listener, tls, service, stopped);
        Ok(RocketMqServer { addr, task: tokio::spawn(async move { Ok(serving.await?) }) })
    }

    /// Waits for the calls in progress, at most the shutdown grace: the broker has begun
    /// shutting down, so the listener no longer accepts. A client's Telemetry stream lasts as
    /// long as the client, so it is cut then.
    async fn stop(self) {
        let mut task = self.task;
        if !ended_within_grace(&mut task, "RocketMQ listener").await {
            tracing::info!("RocketMQ streams still open after the grace period; closing them");
            task.abort();
        }
    }
}

/// Waits at most the shutdown grace for a listener's task and says how it ended; false when
/// it is still running (the caller says why and aborts it).
async fn ended_within_grace<E: std::fmt::Display>(
    task: &mut tokio::task::JoinHandle<Result<(), E>>,
    listener: &str,
) -> bool {
    match tokio::time::timeout(Broker::SHUTDOWN_GRACE, task).await {
        Ok(Ok(Ok(()))) => tracing::info!("{listener} stopped"),
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "{listener} failed"),
        Ok(Err(e)) => tracing::warn!(error = %e, "{listener} task failed"),
        Err(_) => return false,
    }
    true
}

/// Completes on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        tracing::error!("cannot install signal handlers; stop the broker with SIGKILL");
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
}
