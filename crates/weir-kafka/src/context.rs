//! What every handler gets: the broker core, the group coordinator, and who is asking.

use std::sync::Arc;

use weir_broker::group::GroupCoordinator;
use weir_broker::txn::TxnCoordinator;
use weir_broker::Broker;

/// Shared by all connections.
pub struct Ctx {
    pub broker: Arc<Broker>,
    pub groups: Arc<GroupCoordinator>,
    pub txns: Arc<TxnCoordinator>,
}

/// The client behind one request.
#[derive(Debug, Clone)]
pub struct Client {
    /// The request's API version.
    pub version: i16,
    pub client_id: String,
    /// The peer's IP address, as DescribeGroups reports it.
    pub host: String,
}
