//! Cluster mode: how the nodes of a Weir cluster work together (KRaft's design).
//!
//! - The metadata log is the replicated log of a Raft group of the controller voters
//!   (`metadata::raft`); its leader is the **active controller**. Every metadata decision
//!   (topics, partitions, configs, placement, fencing, leaders) is made there, one at a time
//!   under the controller lock, and takes effect on a node only once committed and applied.
//! - Every node serves the **internal RPC** transport (`weir-rpc`) on its CONTROLLER listener:
//!   Raft messages, control requests forwarded to the active controller ([`control`]), and the
//!   methods other parts of the broker register ([`Cluster::register_service`]), such as the
//!   transaction coordinator's markers to partitions led elsewhere.
//! - Each broker **registers** with the controller and **heartbeats** (`lifecycle`); the
//!   controller fences a broker whose session times out and unfences it once it heartbeats
//!   again and has applied the metadata up to its registration ([`controller`], which runs the
//!   decisions of the `weir-controller` crate). A fenced
//!   broker leads nothing: its partitions have no leader (or another in-sync replica leads),
//!   and it refuses writes until it is unfenced.
//! - A broker whose process dies is fenced at once, and a controller whose process dies is
//!   replaced as soon as the other voters may vote: its closed sockets say so ([`liveness`]).
//!   A frozen or cut-off node still costs its session timeout (or an election timeout).
//! - Any node can describe the whole cluster ([`status`]): it asks every node for its own
//!   status, all at once and with a short timeout, and adds what its metadata says of each.
//!
//! A single node is a cluster of one: a one-voter quorum, an in-process controller, a broker
//! that registers and heartbeats with it through the same code. Only the RPC server is
//! missing when there is no CONTROLLER listener.

pub mod control;
pub mod controller;
pub(crate) mod lifecycle;
pub(crate) mod liveness;
pub mod rpc;
pub(crate) mod server;
pub mod standing;
pub mod status;

/// Elections' kinds and results, decided by the controller (`weir-controller`).
pub use weir_controller::election;
/// Reassignments' targets and results, decided by the controller (`weir-controller`).
pub use weir_controller::reassignment;
/// Plans for moving replicas off brokers or balancing them (the admin API's `--generate`).
pub use weir_controller::reassignment_plan;

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, RwLock};

use uuid::Uuid;
use weir_rpc::{Handler, RpcClient};
use weir_storage::sync::{lock, read, write};

pub(crate) use standing::Lifecycle;
pub use status::{ClusterStatus, NodeInfo, QuorumMembership};
pub use weir_controller::brokers::Sessions;
pub use weir_controller::request::{ControlAnswer, ControlRequest, HeartbeatAnswer};
/// What a front-end needs to serve methods of its own on the internal RPC.
pub use weir_rpc::{decode_json, encode_json, BoxFuture as RpcFuture, Handler as RpcHandler, RemoteError};

/// RPC method names of the cluster's own requests (Raft's are in `metadata::raft::network`).
pub mod methods {
    /// A [`ControlRequest`](super::ControlRequest) for the active controller.
    pub(crate) const CONTROL: &str = "control";
    /// What a node knows of itself, for `weir cluster info` (see `NodeStatus`).
    pub(crate) const NODE_STATUS: &str = "cluster.node_status";
    /// A call the node holds open, so that the caller learns at once when its process is gone
    /// (see `liveness`).
    pub(crate) const LIVENESS: &str = "cluster.liveness";
}

/// The cluster side of a broker: the internal RPC client, the services it serves, this
/// process's incarnation, the broker's lifecycle and (on the active controller) the sessions.
pub struct Cluster {
    pub rpc: RpcClient,
    /// A new one at every start: the controller tells this process from an earlier one.
    pub incarnation: Uuid,
    /// Methods served over the internal RPC besides Raft's and the control requests, by the
    /// prefix before their first `.` (`txn` for `txn.write_markers`).
    services: RwLock<HashMap<String, Arc<dyn Handler>>>,
    pub(crate) lifecycle: Lifecycle,
    pub sessions: Mutex<Sessions>,
    /// On the active controller: the watches that tell at once when a broker's process is gone.
    pub(crate) watches: Mutex<liveness::BrokerWatches>,
    /// Stops the RPC server; the task ends when it has drained.
    pub(crate) server: Mutex<Option<rpc::ServerHandle>>,
    /// Turns through the voters while this node knows no controller.
    pub(crate) next_voter: AtomicUsize,
}

impl Cluster {
    /// `tls`: the other nodes' CONTROLLER listeners speak TLS (`CONTROLLER:SSL`).
    pub(crate) fn new(tls: Option<weir_rpc::ClientTls>) -> Cluster {
        Cluster {
            rpc: RpcClient::new(weir_rpc::ClientConfig { tls, ..Default::default() }),
            incarnation: Uuid::new_v4(),
            services: RwLock::new(HashMap::new()),
            lifecycle: Lifecycle::new(),
            sessions: Mutex::new(Sessions::default()),
            watches: Mutex::new(liveness::BrokerWatches::default()),
            server: Mutex::new(None),
            next_voter: AtomicUsize::new(0),
        }
    }

    /// Serves the methods `<prefix>.*` with `handler` from now on (replacing an earlier one).
    pub fn register_service(&self, prefix: &str, handler: Arc<dyn Handler>) {
        write(&self.services).insert(prefix.to_string(), handler);
    }

    /// The handler of `method`, by its prefix.
    pub(crate) fn service(&self, method: &str) -> Option<Arc<dyn Handler>> {
        let prefix = method.split('.').next().unwrap_or(method);
        read(&self.services).get(prefix).cloned()
    }

    pub(crate) async fn stop_server(&self) {
        let handle = lock(&self.server).take();
        if let Some(handle) = handle {
            handle.stop().await;
        }
    }
}
