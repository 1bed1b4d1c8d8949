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
    /// Each Kafka client listener's name, security and TLS, in the order of
    /// `config.client_listeners` (a connection knows its listener by index).
    pub(crate) listeners: Vec<Listener>,
    /// Failed SASL authentications by address (`connection.failed.authentication.max.per.minute`).
    pub(crate) failed_logins: weir_security::attempts::FailedAttempts,
}

/// One Kafka client listener as its connections see it.
pub(crate) struct Listener {
    pub(crate) name: String,
    pub(crate) security: weir_broker::config::ClientSecurity,
    /// TLS (SSL and SASL_SSL), the certificate reloaded when its files change; `Err` when the
    /// files no longer load (every connection is then refused, never served in plain text).
    pub(crate) tls: Option<Result<Arc<weir_security::tls::ReloadingTls>, String>>,
}

impl Listener {
    fn new(config: &weir_broker::config::ClientListener) -> Listener {
        let name = config.name.clone();
        let tls = config.security.tls.clone().map(|settings| {
            // Fetch responses go through rustls, copied: sendfile needs kernel TLS, not used yet.
            let kernel_tls = weir_security::tls::kernel_tls_available();
            tracing::info!(listener = %name, kernel_tls, "TLS on this listener; fetched records are copied through user space");
            weir_security::tls::ReloadingTls::new(settings).map(Arc::new).inspect_err(|e| {
                tracing::error!(listener = %name, error = %e, "the listener's TLS does not load: every connection will be refused");
            })
        });
        Listener { name, security: config.security.clone(), tls }
    }
}

impl Ctx {
    /// The listener of a connection (its index in `config.client_listeners`); the first, for
    /// a request that came otherwise (forwarded, or in tests).
    pub(crate) fn listener(&self, index: usize) -> &Listener {
        static PLAINTEXT: std::sync::OnceLock<Listener> = std::sync::OnceLock::new();
        self.listeners.get(index).or(self.listeners.first()).unwrap_or_else(|| {
            PLAINTEXT.get_or_init(|| Listener {
                name: "PLAINTEXT".into(),
                security: weir_broker::config::ClientSecurity::plaintext(),
                tls: None,
            })
        })
    }

    /// Where a client of listener `index` reaches broker `registration`.
    pub(crate) fn endpoint<'r>(
        &self,
        registration: &'r weir_broker::metadata::BrokerRegistration,
        index: usize,
    ) -> (&'r str, u16) {
        registration.endpoint(&self.listener(index).name)
    }
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
        let listeners = broker.config.client_listeners.iter().map(Listener::new).collect();
        let ctx = Ctx {
            broker,
            groups,
            txns,
            metrics,
            fetch_sessions,
            share: None,
            share_sessions: Default::default(),
            listeners,
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
    /// The listener the request came on (its index in `config.client_listeners`): the broker
    /// addresses a response names are that listener's.
    pub(crate) listener: usize,
    pub(crate) client_id: String,
    /// The peer's IP address, as DescribeGroups reports it.
    pub(crate) host: String,
    /// The connection the request came on (unique in this process), which a share session
    /// belongs to.
    pub(crate) connection: u64,
    /// Who the authorizer sees: `User:<name>` once authenticated, else `User:ANONYMOUS`.
    pub(crate) principal: Arc<str>,
    /// What the request costs the client's quotas, when any client quota is set
    /// (`crate::quota`).
    pub(crate) charge: Option<Arc<crate::quota::Charge>>,
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    /// The IP address, as DescribeGroups reports it.
    pub(crate) host: String,
    /// The listener the connection came on (its index in `config.client_listeners`).
    pub(crate) listener: usize,
    /// The SASL user the connection authenticated as; `None` on a listener without SASL.
    pub(crate) user: Option<String>,
    /// `User:<user>`, or `User:ANONYMOUS`.
    pub(crate) principal: Arc<str>,
    /// The connection's number, unique in this process.
    pub(crate) connection: u64,
}

impl Peer {
    /// A connection that has not authenticated (yet).
    pub(crate) fn new(host: String, connection: u64, listener: usize) -> Peer {
        Peer { host, listener, user: None, principal: weir_security::acl::ANONYMOUS.into(), connection }
    }

    pub(crate) fn set_user(&mut self, user: Option<&str>) {
        self.user = user.map(str::to_string);
        self.principal = weir_security::acl::principal(user).into();
    }
}

impl Ctx {
    /// May `client` perform `operation` on the resource? (Always, with the authorizer off.)
    pub(crate) fn allowed(
        &self,
        client: &Client,
        operation: weir_security::acl::AclOperation,
        resource_type: weir_security::acl::ResourceType,
        name: &str,
    ) -> bool {
        self.broker.authorize(&client.principal, &client.host, operation, resource_type, name)
    }

    pub(crate) fn allowed_on_topic(
        &self,
        client: &Client,
        operation: weir_security::acl::AclOperation,
        topic: &str,
    ) -> bool {
        self.allowed(client, operation, weir_security::acl::ResourceType::Topic, topic)
    }

    pub(crate) fn allowed_on_group(
        &self,
        client: &Client,
        operation: weir_security::acl::AclOperation,
        group: &str,
    ) -> bool {
        self.allowed(client, operation, weir_security::acl::ResourceType::Group, group)
    }

    pub(crate) fn allowed_on_cluster(&self, client: &Client, operation: weir_security::acl::AclOperation) -> bool {
        self.allowed(client, operation, weir_security::acl::ResourceType::Cluster, weir_security::acl::CLUSTER_RESOURCE)
    }

    /// `Ok` when `client` may perform `operation` on the resource; else the error Kafka answers
    /// for the resource type (TOPIC_AUTHORIZATION_FAILED and its relatives).
    pub(crate) fn require(
        &self,
        client: &Client,
        operation: weir_security::acl::AclOperation,
        resource_type: weir_security::acl::ResourceType,
        name: &str,
    ) -> Result<(), weir_broker::BrokerError> {
        use weir_broker::ErrorKind as K;
        use weir_security::acl::ResourceType as R;
        if self.allowed(client, operation, resource_type, name) {
            return Ok(());
        }
        let kind = match resource_type {
            R::Topic => K::TopicAuthorizationFailed,
            R::Group => K::GroupAuthorizationFailed,
            R::TransactionalId => K::TransactionalIdAuthorizationFailed,
            R::Cluster | R::DelegationToken | R::User => K::ClusterAuthorizationFailed,
        };
        Err(weir_broker::BrokerError::new(
            kind,
            format!(
                "{client_principal} may not {operation} {resource_type} {name:?}",
                client_principal = client.principal
            ),
        ))
    }

    pub(crate) fn require_on_cluster(
        &self,
        client: &Client,
        operation: weir_security::acl::AclOperation,
    ) -> Result<(), weir_broker::BrokerError> {
        self.require(client, operation, weir_security::acl::ResourceType::Cluster, weir_security::acl::CLUSTER_RESOURCE)
    }

    /// Is `client` on the inter-broker listener of a cluster, as one of the brokers? When that
    /// listener authenticates nobody (PLAINTEXT, or TLS without a client certificate) it belongs
    /// on a private network, and CLUSTER_ACTION is implied for its follower fetches; when it
    /// does (SASL, mutual TLS), the principal needs CLUSTER_ACTION, as in Kafka (the brokers'
    /// user is a super user).
    pub(crate) fn on_inter_broker_listener(&self, client: &Client) -> bool {
        self.broker.config.is_cluster()
            && client.listener == 0
            && (*client.principal == *weir_security::acl::ANONYMOUS
                || self.allowed_on_cluster(client, weir_security::acl::AclOperation::ClusterAction))
    }
}
