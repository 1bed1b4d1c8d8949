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

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::oneshot;
use weir_broker::Broker;
use weir_coordinators::group::GroupCoordinator;
use weir_kafka::Ctx;

use crate::cli::ServerArgs;

/// `matches`: the server subcommand's, which tell where each flag's value came from.
pub fn run(args: &ServerArgs, matches: Option<&clap::ArgMatches>) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut config = crate::settings::load_config(args, matches)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("weir").build()?;
    runtime.block_on(async move {
        // Bind first: a busy port fails fast, before any recovery work. The socket listens
        // (takes connections) only once the broker can answer them.
        let kafka_socket = match config.listen {
            Some(addr) if config.roles.broker => Some(bind_kafka(addr)?),
            _ => None,
        };
        let bound = match &kafka_socket {
            Some(socket) => Some(socket.local_addr()?),
            None => None,
        };
        if let (Some(bound), 0) = (bound, config.advertised_port) {
            config.advertised_port = bound.port();
        }
        let admin_listener = match config.admin_listen {
            None => None,
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on {addr} (the `admin.listeners` setting)"))?,
            ),
        };
        let rocketmq_listener = match config.rocketmq_listen {
            Some(addr) if config.roles.broker => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on {addr} (the `rocketmq.listeners` setting)"))?,
            ),
            _ => None,
        };
        if let Some(listener) = &rocketmq_listener {
            // Routes give clients the bound port (the setting may say 0).
            config.rocketmq_advertised_port = listener.local_addr()?.port();
        }
        let admin_bound = match &admin_listener {
            Some(listener) => Some(listener.local_addr()?),
            None => None,
        };
        // The admin API's state exists without its listener too: other nodes' admin APIs
        // forward requests to it over the cluster's internal RPC.
        let admin_state = weir_admin::AdminState::new(started, bound, admin_bound);
        let admin = match (admin_listener, admin_bound) {
            (Some(listener), Some(addr)) => {
                let (stop, stopped) = oneshot::channel::<()>();
                let task = tokio::spawn(weir_admin::serve(listener, admin_state.clone(), async {
                    let _ = stopped.await;
                }));
                Some(AdminServer { addr, stop, task })
            }
            _ => None,
        };
        let data_dir = config.data_dir.clone();
        let broker = tokio::task::spawn_blocking(move || Broker::open(config))
            .await?
            .map_err(|e| anyhow::anyhow!("cannot open the data directory {}: {}", data_dir.display(), e.message))?;
        // The messaging stores open with the broker, whatever protocols are served: Kafka
        // produce to a DELAY topic needs the timer. Then the indexer starts, and delayed
        // messages due while the broker was down fire now.
        let messaging = {
            let broker = broker.clone();
            tokio::task::spawn_blocking(move || weir_messaging::Messaging::open(&broker))
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
            tokio::task::spawn_blocking(move || weir_coordinators::txn::TxnCoordinator::start(broker, groups))
                .await?
                .map_err(|e| anyhow::anyhow!("cannot load transactions: {}", e.message))?
        };
        // Other nodes' HTTP APIs read and write this broker's partitions through it.
        weir_admin::forward::register(&admin_state, &broker);
        // Registers the Kafka API metrics too, before anything is announced.
        let ctx = Arc::new(Ctx::new(broker.clone(), groups.clone(), txns));
        let kafka = match (kafka_socket, bound) {
            (Some(socket), Some(bound)) => {
                let listener = socket
                    .listen(KAFKA_BACKLOG)
                    .with_context(|| format!("cannot listen on {bound} (the `listeners` setting)"))?;
                // The accept loop runs on the runtime's workers from here on, whatever this
                // thread does next (a blocked stdout or stderr included).
                // Controlled shutdown first, as Kafka's: leadership moves to other brokers while
                // this one still answers, so writes waiting here for the ISR fail over at once.
                let leaving = broker.clone();
                let stopping = async move {
                    shutdown_signal().await;
                    leaving.leave_cluster().await;
                };
                Some(tokio::spawn(weir_kafka::serve(listener, ctx, stopping, Broker::SHUTDOWN_GRACE)))
            }
            _ => None,
        };
        // RocketMQ clients, once the Kafka side serves: the same broker and coordinators.
        let rocketmq = match rocketmq_listener {
            Some(listener) => {
                let addr = listener.local_addr()?;
                // The messaging engines RocketMQ clients need (receives by invisible time,
                // dead letters, renewals, transaction checks) run with their front-end only, so
                // that a broker without it never redelivers, dead-letters or rolls back.
                let engines = weir_messaging::Engines::start(&messaging, &groups);
                let service = weir_rocketmq::Service::open(broker.clone(), groups.clone(), messaging.clone(), engines);
                let mut stopping = broker.shutdown_signal();
                let stopped = async move {
                    let _ = stopping.wait_for(|down| *down).await;
                };
                Some((addr, tokio::spawn(weir_rocketmq::serve(listener, service, stopped))))
            }
            None => None,
        };
        // Followers replicate from their leaders with Kafka's Fetch.
        let replication = kafka.is_some().then(|| {
            let transport = std::sync::Arc::new(weir_kafka::replica_fetcher::KafkaReplicaTransport);
            weir_broker::follower::spawn(broker.clone(), transport)
        });
        admin_state.set_ready(weir_admin::Core { broker: broker.clone(), groups: groups.clone(), messaging });
        // Everything serves now: only then the lines that tests and scripts wait for.
        let shown_dir = std::fs::canonicalize(&data_dir).unwrap_or(data_dir);
        match bound {
            Some(bound) => println!("{}", weir_harness::address_lines::kafka_line(bound, &shown_dir)),
            None => println!(
                "{}",
                weir_harness::address_lines::controller_line(broker.internal_address().unwrap_or_default(), &shown_dir)
            ),
        }
        if let Some((addr, _)) = &rocketmq {
            println!("{}", weir_harness::address_lines::rocketmq_line(*addr));
        }
        if let Some(admin) = &admin {
            println!("{}", weir_harness::address_lines::admin_line(admin.addr));
        }
        match bound {
            Some(bound) => tracing::info!(listen = %bound, data_dir = %shown_dir.display(), cluster_id = %broker.cluster_id(), "broker started"),
            None => tracing::info!(data_dir = %shown_dir.display(), cluster_id = %broker.cluster_id(), "controller started"),
        }
        let left = kafka.is_some();
        match kafka {
            Some(kafka) => kafka.await.context("the Kafka listener task failed")?,
            None => {
                shutdown_signal().await;
                broker.begin_shutdown();
            }
        }
        if let Some(replication) = replication {
            replication.abort();
        }
        if let Some((_, mut task)) = rocketmq {
            // Stops accepting; calls in progress may finish within the grace period (a
            // client's Telemetry stream lasts as long as the client, so it is cut then).
            broker.begin_shutdown();
            match tokio::time::timeout(Broker::SHUTDOWN_GRACE, &mut task).await {
                Ok(Ok(Ok(()))) => tracing::info!("RocketMQ listener stopped"),
                Ok(Ok(Err(e))) => tracing::warn!(error = %e, "RocketMQ listener failed"),
                Ok(Err(e)) => tracing::warn!(error = %e, "RocketMQ listener task failed"),
                Err(_) => {
                    tracing::info!("RocketMQ streams still open after the grace period; closing them");
                    task.abort();
                }
            }
        }
        if let Some(admin) = admin {
            admin.stop().await;
        }
        if !left {
            broker.leave_cluster().await;
        }
        groups.shutdown();
        let closing = broker.clone();
        tokio::task::spawn_blocking(move || closing.shutdown()).await?.map_err(|e| anyhow::anyhow!("{}", e.message))?;
        tracing::info!("shut down cleanly");
        Ok::<(), anyhow::Error>(())
    })?;
    Ok(())
}

/// Connections the kernel queues for the Kafka listener before they are accepted (tokio's
/// `TcpListener::bind` uses the same).
const KAFKA_BACKLOG: u32 = 1024;

/// Binds the Kafka address without listening yet: the port is ours (a busy one fails here),
/// but a client that connects during recovery is refused instead of waiting unanswered.
fn bind_kafka(addr: std::net::SocketAddr) -> anyhow::Result<TcpSocket> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }?;
    // As TcpListener::bind does: a restart may bind while old connections are in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr).with_context(|| format!("cannot listen on {addr} (the `listeners` setting)"))?;
    Ok(socket)
}

/// The running admin HTTP listener.
struct AdminServer {
    addr: std::net::SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl AdminServer {
    /// Stops accepting and waits for the requests in progress, at most the shutdown grace.
    async fn stop(self) {
        let _ = self.stop.send(());
        let mut task = self.task;
        match tokio::time::timeout(Broker::SHUTDOWN_GRACE, &mut task).await {
            Ok(Ok(Ok(()))) => tracing::info!("admin listener stopped"),
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "admin listener failed"),
            Ok(Err(e)) => tracing::warn!(error = %e, "admin listener task failed"),
            Err(_) => {
                tracing::warn!("admin requests still running after the grace period; closing them");
                task.abort();
            }
        }
    }
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
