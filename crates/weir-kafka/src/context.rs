//! What every handler gets: the broker core, the group and transaction coordinators, the Kafka
//! front-end's metrics, and who is asking.

use std::sync::Arc;

use weir_broker::metrics::ProtocolMetrics;
use weir_broker::Broker;
use weir_coordinators::group::GroupCoordinator;
use weir_coordinators::txn::TxnCoordinator;

/// Slots of the Kafka request metrics, indexed by API key. Kafka's keys are below 100 today; a
/// key at or above this is counted as an unknown API.
pub(crate) const API_SLOTS: usize = 128;

/// Shared by all connections.
pub struct Ctx {
    pub(crate) broker: Arc<Broker>,
    pub(crate) groups: Arc<GroupCoordinator>,
    pub(crate) txns: Arc<TxnCoordinator>,
    /// The `protocol="kafka"` rows of the broker's request and connection metrics.
    pub(crate) metrics: Arc<ProtocolMetrics>,
    /// Incremental fetch sessions (KIP-227): Kafka protocol state, kept by id for all
    /// connections (see `fetch_session`).
    pub(crate) fetch_sessions: Arc<crate::fetch_session::SessionCache>,
    /// Share groups' records (KIP-932), handed out by the invisible-time engine; `None` on a
    /// broker that started no engines (ShareFetch and ShareAcknowledge are then refused).
    pub(crate) share: Option<ShareEngines>,
    /// Share sessions (ShareFetch's session epochs): Kafka protocol state, like fetch sessions.
    pub(crate) share_sessions: crate::share_session::ShareSessions,
    /// The listener's TLS (SSL and SASL_SSL), its certificate reloaded when its files change;
    /// `Err` when the files no longer load (every connection is then refused, never served in
    /// plain text).
    pub(crate) tls: Option<Result<Arc<weir_security::tls::ReloadingTls>, String>>,
    /// Failed SASL authentications by address (`connection.failed.authentication.max.per.minute`).
    pub(crate) failed_logins: crate::sasl::FailedLogins,
}

/// What share groups' fetches and acknowledgements call.
pub(crate) struct ShareEngines {
    pub(crate) messaging: Arc<weir_messaging::Messaging>,
    pub(crate) pop: Arc<weir_messaging::pop::PopEngine>,
}

impl Ctx {
    /// The front-end's context; registers its metrics with the broker, every implemented API
    /// with zero requests, so they show from the start.
    pub fn new(broker: Arc<Broker>, groups: Arc<GroupCoordinator>, txns: Arc<TxnCoordinator>) -> Ctx {
        let metrics = broker.metrics.register_protocol("kafka", API_SLOTS, crate::errors::error_name);
        let fetch_sessions = Arc::new(crate::fetch_session::SessionCache::new(
            broker.config.fetch_session_cache_slots,
            Some(metrics.clone()),
        ));
        if broker.config.client_security.tls.is_some() {
            // Fetch responses go through rustls, copied: sendfile needs kernel TLS, not used yet.
            let kernel_tls = weir_security::tls::kernel_tls_available();
            tracing::info!(kernel_tls, "the Kafka listener uses TLS; fetched records are copied through user space");
        }
        let tls = broker.config.client_security.tls.clone().map(|settings| {
            weir_security::tls::ReloadingTls::new(settings).map(Arc::new).inspect_err(|e| {
                tracing::error!(error = %e, "the Kafka listener's TLS does not load: every connection will be refused");
            })
        });
        let ctx = Ctx {
            broker,
            groups,
            txns,
            metrics,
            fetch_sessions,
            share: None,
            share_sessions: Default::default(),
            tls,
            failed_logins: Default::default(),
        };
        for (api_key, _) in crate::versions::all() {
            crate::dispatch::api_metrics(&ctx.metrics, api_key);
        }
        ctx
    }
}

impl Ctx {
    /// Serves share groups' fetches and acknowledgements with these engines.
    pub fn with_share_groups(
        mut self,
        messaging: Arc<weir_messaging::Messaging>,
        pop: Arc<weir_messaging::pop::PopEngine>,
    ) -> Ctx {
        self.share = Some(ShareEngines { messaging, pop });
        self
    }
}

/// The client behind one request.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    /// The request's API version.
    pub(crate) version: i16,
    pub(crate) client_id: String,
    /// The peer's IP address, as DescribeGroups reports it.
    pub(crate) host: String,
    /// The connection the request came on (unique in this process), which a share session
    /// belongs to.
    pub(crate) connection: u64,
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    /// The IP address, as DescribeGroups reports it.
    pub(crate) host: String,
    /// The SASL user the connection authenticated as; `None` on a listener without SASL.
    #[allow(dead_code)]
    pub(crate) user: Option<String>,
    /// The connection's number, unique in this process.
    pub(crate) connection: u64,
}
