//! Who a RocketMQ call comes from: its access key, checked against the signature the client
//! sends (`weir_security::access_key`), before the call reaches the service. A call signed
//! with a key Weir knows is that user (`User:<access key>`) to the authorizer and the quotas;
//! an unsigned one is `User:ANONYMOUS`, unless `rocketmq.authentication.enable` requires a
//! signature. A call that fails (an unknown key, a wrong secret, a malformed header, a missing
//! signature where one is required) is refused with gRPC's UNAUTHENTICATED, whatever the
//! method: every client reports that status as it comes.

use std::sync::Arc;

use tonic::metadata::MetadataMap;
use tonic::{Request, Status};
use weir_broker::metrics::ProtocolMetrics;
use weir_broker::Broker;
use weir_security::access_key;
use weir_security::acl::ANONYMOUS;
use weir_security::attempts::FailedAttempts;

/// The principal a call was authenticated as, in its extensions.
#[derive(Debug, Clone)]
pub(crate) struct Principal(pub(crate) Arc<str>);

/// The principal of `request`, as [`check`] found it (`User:ANONYMOUS` if it did not run).
pub(crate) fn principal_of<T>(request: &Request<T>) -> Arc<str> {
    request.extensions().get::<Principal>().map_or_else(anonymous, |p| p.0.clone())
}

/// `User:ANONYMOUS`, shared (most calls are unsigned: one allocation, not one per call).
fn anonymous() -> Arc<str> {
    static ANONYMOUS_PRINCIPAL: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    ANONYMOUS_PRINCIPAL.get_or_init(|| ANONYMOUS.into()).clone()
}

/// The interceptor in front of the service: authenticates each call and notes its principal.
#[derive(Clone)]
pub(crate) struct Authenticate {
    pub(crate) broker: Arc<Broker>,
    pub(crate) metrics: Arc<ProtocolMetrics>,
    /// Failed signatures by address: past `connection.failed.authentication.max.per.minute`,
    /// an address's signed calls are refused unchecked until its minute is over.
    pub(crate) failures: Arc<FailedAttempts>,
}

impl tonic::service::Interceptor for Authenticate {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let address = request.remote_addr().map(|a| a.ip());
        let limit = self.broker.config.client_security.failed_authentications_per_minute;
        let signed = request.metadata().contains_key("authorization");
        if signed && address.is_some_and(|ip| self.failures.over_limit(ip, limit)) {
            self.metrics.connections.authentication_failures.inc();
            return Err(Status::unauthenticated(
                "too many failed authentications from this address (connection.failed.authentication.max.per.minute): try again later",
            ));
        }
        match check(&self.broker, request.metadata()) {
            Ok(principal) => {
                request.extensions_mut().insert(Principal(principal));
                Ok(request)
            }
            Err(why) => {
                self.metrics.connections.authentication_failures.inc();
                if let Some(ip) = address {
                    self.failures.record(ip);
                }
                let peer = request.remote_addr().map(|a| a.to_string()).unwrap_or_default();
                tracing::info!(%peer, why, "refusing a RocketMQ call");
                Err(Status::unauthenticated(why))
            }
        }
    }
}

/// The principal a call's metadata proves, or why it proves none.
fn check(broker: &Broker, metadata: &MetadataMap) -> Result<Arc<str>, String> {
    let header = |name: &str| metadata.get(name).and_then(|v| v.to_str().ok());
    let signed = match metadata.get("authorization") {
        Some(value) => access_key::parse(value.to_str().map_err(|_| "a malformed authorization header".to_string())?)?,
        None => None,
    };
    let Some(signed) = signed else {
        if broker.config.rocketmq_require_auth {
            return Err("this broker requires RocketMQ access keys (rocketmq.authentication.enable): sign the call with an access key and secret key".into());
        }
        return Ok(anonymous());
    };
    let date_time = header(access_key::SIGNED_HEADER)
        .ok_or_else(|| format!("the call is signed but has no {} header", access_key::SIGNED_HEADER))?;
    let refused =
        || format!("access key {:?}: unknown, or the signature does not match its secret key", signed.access_key);
    // The same answer for an unknown key and a wrong secret: a caller learns nothing of which
    // keys exist.
    let secret = broker.access_secret(signed.access_key).ok_or_else(refused)?;
    if !access_key::verify(&secret, date_time, signed.signature) {
        return Err(refused());
    }
    Ok(weir_security::acl::principal(Some(signed.access_key)).into())
}
