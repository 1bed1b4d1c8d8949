//! One module per group of Kafka APIs. Each handler takes the decoded request and returns the
//! response to encode; failures are error codes inside the response, as the protocol wants.

pub mod acls;
pub mod admin;
pub mod api_versions;
pub mod consumer_groups;
pub mod fetch;
pub mod groups;
pub mod list_offsets;
pub mod metadata;
pub mod produce;
pub mod producer;
pub mod quotas;
pub mod session_write;
pub mod share_fetch;
pub mod share_groups;
pub mod txn;
pub mod users;

use kafka_protocol::protocol::StrBytes;

/// Authorized-operation bitfields (bit n = ACL operation code n), answered when a client asks
/// for them: the resource's supported operations the client is allowed (all of them with the
/// authorizer off, as Kafka answers); `NOT_REQUESTED` is Kafka's "not asked" value.
pub(crate) mod authorized_operations {
    use weir_security::acl::{AclOperation, ResourceType, CLUSTER_RESOURCE};

    use crate::context::{Client, Ctx};

    /// The operations of `supported` the client may perform on the resource.
    pub(crate) fn allowed(ctx: &Ctx, client: &Client, resource_type: ResourceType, name: &str, supported: i32) -> i32 {
        if !ctx.broker.authorizer_enabled() {
            return supported;
        }
        AclOperation::ALL
            .iter()
            .filter(|op| supported & (1 << op.code()) != 0 && ctx.allowed(client, **op, resource_type, name))
            .fold(0, |bits, op| bits | (1 << op.code()))
    }

    pub(crate) fn on_topic(ctx: &Ctx, client: &Client, topic: &str) -> i32 {
        allowed(ctx, client, ResourceType::Topic, topic, TOPIC)
    }

    pub(crate) fn on_group(ctx: &Ctx, client: &Client, group: &str) -> i32 {
        allowed(ctx, client, ResourceType::Group, group, GROUP)
    }

    /// A group's field in a describe: its operations if `requested`, else `NOT_REQUESTED`.
    pub(crate) fn of_group(ctx: &Ctx, client: &Client, group: &str, requested: bool) -> i32 {
        if requested {
            on_group(ctx, client, group)
        } else {
            NOT_REQUESTED
        }
    }

    /// The groups of a describe the client may DESCRIBE, and the others (answered
    /// GROUP_AUTHORIZATION_FAILED without the coordinator).
    pub(crate) fn describable_groups(
        ctx: &Ctx,
        client: &Client,
        ids: &[kafka_protocol::messages::GroupId],
    ) -> (Vec<String>, Vec<String>) {
        ids.iter().map(|id| id.to_string()).partition(|id| ctx.allowed_on_group(client, AclOperation::Describe, id))
    }

    pub(crate) fn on_cluster(ctx: &Ctx, client: &Client) -> i32 {
        allowed(ctx, client, ResourceType::Cluster, CLUSTER_RESOURCE, CLUSTER)
    }

    const READ: i32 = 1 << 3;
    const WRITE: i32 = 1 << 4;
    const CREATE: i32 = 1 << 5;
    const DELETE: i32 = 1 << 6;
    const ALTER: i32 = 1 << 7;
    const DESCRIBE: i32 = 1 << 8;
    const CLUSTER_ACTION: i32 = 1 << 9;
    const DESCRIBE_CONFIGS: i32 = 1 << 10;
    const ALTER_CONFIGS: i32 = 1 << 11;
    const IDEMPOTENT_WRITE: i32 = 1 << 12;

    pub(crate) const NOT_REQUESTED: i32 = i32::MIN;
    /// Kafka's supported operations of the CLUSTER resource (token operations belong to users).
    pub(crate) const CLUSTER: i32 =
        CREATE | ALTER | DESCRIBE | CLUSTER_ACTION | DESCRIBE_CONFIGS | ALTER_CONFIGS | IDEMPOTENT_WRITE;
    /// Kafka's supported operations of the GROUP resource.
    pub(crate) const GROUP: i32 = READ | DELETE | DESCRIBE;
    pub(crate) const TOPIC: i32 = READ | WRITE | CREATE | DELETE | ALTER | DESCRIBE | DESCRIBE_CONFIGS | ALTER_CONFIGS;
}

/// The generation of an OffsetCommit or TxnOffsetCommit: a negative one (Kafka's clients send
/// -1) commits from outside the group's generations.
pub(crate) fn commit_generation(generation: i32) -> Option<i32> {
    (generation >= 0).then_some(generation)
}

/// The leader epoch of a committed offset: -1 is unknown (Kafka's
/// `OffsetAndMetadata.ofSentinel`); any other value is stored, and fetched back, as sent.
pub(crate) fn committed_leader_epoch(epoch: i32) -> Option<i32> {
    (epoch != -1).then_some(epoch)
}

/// A response's optional error message.
pub(crate) fn message(text: impl Into<String>) -> Option<StrBytes> {
    Some(StrBytes::from_string(text.into()))
}
