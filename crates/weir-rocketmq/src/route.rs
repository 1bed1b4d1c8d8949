//! Topic routes: a RocketMQ topic's message queues are its partitions, each served by the broker
//! leading it, at that broker's RocketMQ listener.

use std::net::IpAddr;

use weir_broker::metadata::{MetadataState, TopicMetadata};
use weir_broker::topic_config::{self, MessageType};

use crate::proto::{self, Address, AddressScheme, Endpoints, Permission, Resource};

/// The endpoints of `host:port`, with the scheme RocketMQ clients resolve them by.
pub(crate) fn endpoints(host: &str, port: u16) -> Endpoints {
    let scheme = match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(_)) => AddressScheme::IPv4,
        Ok(IpAddr::V6(_)) => AddressScheme::IPv6,
        Err(_) => AddressScheme::DomainName,
    };
    Endpoints { scheme: scheme as i32, addresses: vec![Address { host: host.to_string(), port: i32::from(port) }] }
}

/// The message types a topic takes, as its queues show them.
pub(crate) fn accepted_types(topic: &TopicMetadata) -> Vec<i32> {
    let kind = match topic_config::message_type(&topic.configs) {
        MessageType::Normal => proto::MessageType::Normal,
        MessageType::Fifo => proto::MessageType::Fifo,
        MessageType::Delay => proto::MessageType::Delay,
        MessageType::Transaction => proto::MessageType::Transaction,
    };
    vec![kind as i32]
}

/// The name RocketMQ clients know broker `id` by (they group queues by it).
pub(crate) fn broker_name(id: i32) -> String {
    format!("weir-{id}")
}

/// Every queue of `topic` whose leader serves RocketMQ clients, in partition order. A queue
/// with no leader right now, or led by a broker without a RocketMQ listener, is left out: a
/// client cannot reach it, and the next route (clients refresh every 30 s, and at once after a
/// failure) shows it again.
pub(crate) fn queues(metadata: &MetadataState, topic: &TopicMetadata) -> Vec<proto::MessageQueue> {
    let types = accepted_types(topic);
    let mut queues = Vec::with_capacity(topic.assignments.len());
    for (index, state) in topic.assignments.iter().enumerate() {
        let Some(leader) = metadata.brokers.get(&state.leader) else { continue };
        if leader.rocketmq_port == 0 || leader.fenced {
            continue;
        }
        queues.push(proto::MessageQueue {
            topic: Some(Resource { resource_namespace: String::new(), name: topic.name.clone() }),
            id: index as i32,
            permission: Permission::ReadWrite as i32,
            broker: Some(proto::Broker {
                name: broker_name(leader.id),
                // 0: the master, the only kind of broker RocketMQ clients send to.
                id: 0,
                endpoints: Some(endpoints(&leader.host, leader.rocketmq_port)),
            }),
            accept_message_types: types.clone(),
        });
    }
    queues
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_get_the_scheme_clients_resolve_them_by() {
        assert_eq!(endpoints("127.0.0.1", 8081).scheme, AddressScheme::IPv4 as i32);
        assert_eq!(endpoints("::1", 8081).scheme, AddressScheme::IPv6 as i32);
        let named = endpoints("broker-1.example", 8081);
        assert_eq!(named.scheme, AddressScheme::DomainName as i32);
        assert_eq!(named.addresses, vec![Address { host: "broker-1.example".into(), port: 8081 }]);
    }
}
