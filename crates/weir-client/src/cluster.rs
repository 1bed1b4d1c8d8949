//! A cluster seen through its Kafka listeners: the brokers a bootstrap list leads to, one
//! connection per broker (made when first needed), and where partitions and groups live.

use std::collections::{BTreeMap, HashMap};
use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{FindCoordinatorRequest, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::{Request, StrBytes};

use crate::error::check;
use crate::{BrokerConnection, ClientError};

/// Metadata versions this client builds requests for: v4 has `allow_auto_topic_creation`
/// (which is set false: looking a topic up never creates it), v12 is the newest.
const METADATA_VERSIONS: RangeInclusive<i16> = 4..=12;
/// FindCoordinator by one `key` (v4 asks for a list instead).
const FIND_COORDINATOR_VERSIONS: RangeInclusive<i16> = 1..=3;
/// Kafka's codes a coordinator answers while it starts or loads its groups: retried.
const COORDINATOR_NOT_AVAILABLE: i16 = 15;
const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
const NOT_COORDINATOR: i16 = 16;
/// How long a coordinator that is loading (or a group topic being created) is waited for.
const COORDINATOR_WAIT_MAX: Duration = Duration::from_secs(15);

/// A cluster reached from a bootstrap list.
pub struct Cluster {
    client_id: String,
    io_timeout: Duration,
    /// The connection made to a bootstrap address (any broker answers Metadata).
    bootstrap: BrokerConnection,
    /// Every broker the last Metadata listed: node id → `host:port`.
    brokers: BTreeMap<i32, String>,
    /// Connections to brokers by node id, made when first needed.
    connections: HashMap<i32, BrokerConnection>,
}

/// `host:port[,host:port...]` as a list, each checked to have a host and a port.
pub fn parse_bootstrap(list: &str) -> Result<Vec<String>, ClientError> {
    let addresses: Vec<String> = list.split(',').map(str::trim).filter(|a| !a.is_empty()).map(String::from).collect();
    if addresses.is_empty() {
        return Err(ClientError::BadAddress(format!(
            "bootstrap list {list:?} names no broker; expected host:port[,host:port]"
        )));
    }
    for address in &addresses {
        let port = address.rsplit_once(':').and_then(|(host, port)| (!host.is_empty()).then_some(port));
        if port.and_then(|p| p.parse::<u16>().ok()).is_none() {
            return Err(ClientError::BadAddress(format!(
                "bootstrap address {address:?} is not host:port (such as 127.0.0.1:9092)"
            )));
        }
    }
    Ok(addresses)
}

impl Cluster {
    /// Connects to the first address of `bootstrap` (`host:port[,host:port]`) that answers and
    /// learns the cluster's brokers from it.
    pub fn connect(bootstrap: &str, client_id: &str, io_timeout: Duration) -> Result<Cluster, ClientError> {
        let mut failures = Vec::new();
        for address in parse_bootstrap(bootstrap)? {
            match BrokerConnection::connect(&address, client_id, io_timeout) {
                Ok(connection) => {
                    let mut cluster = Cluster {
                        client_id: client_id.to_string(),
                        io_timeout,
                        bootstrap: connection,
                        brokers: BTreeMap::new(),
                        connections: HashMap::new(),
                    };
                    cluster.metadata(Some(&[]))?;
                    return Ok(cluster);
                }
                Err(e) => failures.push(e.to_string()),
            }
        }
        Err(ClientError::Unavailable(format!("no bootstrap broker answered: {}", failures.join("; "))))
    }

    /// The connection to any broker (the bootstrap one).
    pub fn any(&mut self) -> &mut BrokerConnection {
        &mut self.bootstrap
    }

    /// The node ids of the brokers the last Metadata listed.
    pub fn broker_ids(&self) -> Vec<i32> {
        self.brokers.keys().copied().collect()
    }

    /// The connection to broker `node_id`, connecting first if needed.
    pub fn broker(&mut self, node_id: i32) -> Result<&mut BrokerConnection, ClientError> {
        if !self.connections.contains_key(&node_id) {
            let Some(addr) = self.brokers.get(&node_id) else {
                return Err(ClientError::Unavailable(format!("broker {node_id} is not in the cluster's metadata")));
            };
            let connection = BrokerConnection::connect(addr, &self.client_id, self.io_timeout)?;
            self.connections.insert(node_id, connection);
        }
        self.connections
            .get_mut(&node_id)
            .ok_or_else(|| ClientError::Unavailable(format!("no connection to broker {node_id}")))
    }

    /// Forgets the connection to `node_id` (after it failed), so the next use reconnects.
    pub fn disconnect(&mut self, node_id: i32) {
        self.connections.remove(&node_id);
    }

    /// Sends `request` to broker `node_id` at a negotiated version.
    pub fn send_to<R: Request>(
        &mut self,
        node_id: i32,
        ours: RangeInclusive<i16>,
        request: &R,
    ) -> Result<(i16, R::Response), ClientError> {
        let result = self.broker(node_id)?.send(ours, request);
        if matches!(result, Err(ClientError::Closed | ClientError::Timeout | ClientError::Io(_))) {
            self.disconnect(node_id);
        }
        result
    }

    /// Metadata of `topics` (`None`: every topic; `Some(&[])`: none, only the brokers), which
    /// also refreshes the broker list. Topics are never created by asking.
    pub fn metadata(&mut self, topics: Option<&[String]>) -> Result<MetadataResponse, ClientError> {
        let request =
            MetadataRequest::default().with_allow_auto_topic_creation(false).with_topics(topics.map(|names| {
                names
                    .iter()
                    .map(|n| {
                        MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(n.clone()))))
                    })
                    .collect()
            }));
        let (_, response) = self.bootstrap.send(METADATA_VERSIONS, &request)?;
        self.brokers =
            response.brokers.iter().map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port))).collect();
        Ok(response)
    }

    /// The node id of `group`'s coordinator. A coordinator that is starting or loading (the
    /// first use of groups creates their internal topic) is asked again for a while.
    pub fn coordinator(&mut self, group: &str) -> Result<i32, ClientError> {
        let deadline = Instant::now() + COORDINATOR_WAIT_MAX;
        loop {
            let request = FindCoordinatorRequest::default().with_key(StrBytes::from_string(group.to_string()));
            let (_, response) = self.bootstrap.send(FIND_COORDINATOR_VERSIONS, &request)?;
            let retriable = [COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR];
            if retriable.contains(&response.error_code) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            check(response.error_code, || format!("finding the coordinator of group '{group}'"))?;
            let node_id = response.node_id.0;
            // The coordinator may be a broker this client has not heard of yet.
            self.brokers.entry(node_id).or_insert_with(|| format!("{}:{}", response.host.as_str(), response.port));
            return Ok(node_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_lists_are_checked() {
        assert_eq!(parse_bootstrap("a:1, b:2").expect("two"), vec!["a:1", "b:2"]);
        assert_eq!(parse_bootstrap("[::1]:9092").expect("ipv6"), vec!["[::1]:9092"]);
        for bad in ["", ",", "localhost", ":9092", "host:port", "host:70000"] {
            assert!(matches!(parse_bootstrap(bad), Err(ClientError::BadAddress(_))), "{bad:?}");
        }
    }
}
