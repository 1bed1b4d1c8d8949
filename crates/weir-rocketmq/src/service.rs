//! The MessagingService calls. Every call answers with a RocketMQ status (in the response, as
//! RocketMQ's proxies do); a gRPC error is only for what never reaches a handler (a message
//! that does not decode).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Streaming};
use weir_broker::metadata::TopicMetadata;
use weir_broker::metrics::ProtocolMetrics;
use weir_broker::quotas::{poll_timed, quota_user, request_time_value, QuotaKind};
use weir_broker::Broker;
use weir_coordinators::group::clients::{ClientKind, Heard};
use weir_coordinators::group::GroupCoordinator;
use weir_messaging::pop::{self, QueueKey, ReceiveRequest};
use weir_messaging::{Engines, Messaging};
use weir_security::acl::{AclOperation, ResourceType};

use crate::proto::messaging_service_server::MessagingService;
use crate::proto::*;
use crate::receive::{self, Handle};
use crate::send::{self, RoundRobin};
use crate::status::{self, status};
use crate::transaction::Producers;
use crate::{route, telemetry};

/// The body limit RocketMQ's brokers and clients default to.
pub(crate) const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;

/// What a record batch needs beyond a body: the batch and record headers and the message's
/// system and user properties as record headers. A topic's `max.message.bytes` less this is
/// the largest body it takes.
pub(crate) const PROPERTY_ALLOWANCE_BYTES: usize = 64 << 10;

// Topics created with a message type (by the CLI, the admin API, Kafka's CreateTopics) get
// their `max.message.bytes` from the controller: the same as the topics created here.
const _: () = assert!(
    DEFAULT_MAX_BODY_BYTES + PROPERTY_ALLOWANCE_BYTES == weir_broker::topic_config::ROCKETMQ_MAX_MESSAGE_BYTES as usize
);

/// The calls this front-end counts, in metrics order.
const OPERATIONS: [&str; 16] = [
    "QueryRoute",
    "Heartbeat",
    "SendMessage",
    "QueryAssignment",
    "ReceiveMessage",
    "AckMessage",
    "ForwardMessageToDeadLetterQueue",
    "PullMessage",
    "UpdateOffset",
    "GetOffset",
    "QueryOffset",
    "EndTransaction",
    "Telemetry",
    "NotifyClientTermination",
    "ChangeInvisibleDuration",
    "RecallMessage",
];

/// The RocketMQ front-end: the core, its running messaging engines, and the producers'
/// streams (per connection, as RocketMQ reaches them). It starts no task of its own beyond
/// serving each stream, and opens no file.
/// Who a call comes from: its principal (`crate::auth`) and address, for the authorizer and
/// the quotas.
pub(crate) struct Caller {
    principal: Arc<str>,
    peer: Option<std::net::SocketAddr>,
}

impl Caller {
    fn of<T>(request: &Request<T>) -> Caller {
        Caller { principal: crate::auth::principal_of(request), peer: request.remote_addr() }
    }
}

pub struct Service {
    pub(crate) broker: Arc<Broker>,
    /// Its `clients` learn of the clients that talk to this broker.
    groups: Arc<GroupCoordinator>,
    /// Invisible-time consumption and transactional messages.
    messaging: Arc<Messaging>,
    engines: Engines,
    pub(crate) metrics: Arc<ProtocolMetrics>,
    round_robin: RoundRobin,
    /// The producers' Telemetry streams: how the core's transaction checks reach them.
    producers: Arc<Producers>,
}

impl Service {
    /// The front-end over the core and its messaging engines (started by the caller): registers
    /// its metrics, and its producers' streams as a way to check transactions.
    pub fn open(
        broker: Arc<Broker>,
        groups: Arc<GroupCoordinator>,
        messaging: Arc<Messaging>,
        engines: Engines,
    ) -> Arc<Service> {
        let metrics = broker.metrics.register_protocol("rocketmq", OPERATIONS.len(), crate::status::code_name);
        // Every call shows in the metrics from the start, with zero requests.
        for (index, name) in OPERATIONS.iter().enumerate() {
            metrics.operation(index as i32, || name.to_string());
        }
        let producers = Arc::new(Producers::default());
        engines.transactions.register_checker(producers.clone());
        Arc::new(Service { broker, groups, messaging, engines, metrics, round_robin: RoundRobin::default(), producers })
    }

    /// The client id a call names (`x-mq-client-id`, sent by every RocketMQ client), noted as
    /// heard from now.
    fn client_of<T>(&self, request: &Request<T>) -> String {
        let client = request.metadata().get("x-mq-client-id").and_then(|v| v.to_str().ok()).unwrap_or_default();
        self.groups.clients.called(client, self.broker.now_ms());
        client.to_string()
    }

    /// `Some(FORBIDDEN)` unless the caller may perform `operation` on the resource: the user
    /// its access key names, or `User:ANONYMOUS` for an unsigned call (`crate::auth`).
    fn refused(
        &self,
        caller: &Caller,
        operation: AclOperation,
        resource_type: ResourceType,
        name: &str,
    ) -> Option<Status> {
        if !self.broker.authorizer_enabled() {
            return None;
        }
        let host = caller.peer.map(|a| a.ip().to_string()).unwrap_or_default();
        let principal = &caller.principal;
        (!self.broker.authorize(principal, &host, operation, resource_type, name))
            .then(|| status(Code::Forbidden, format!("{principal} may not {operation} {resource_type} {name:?}")))
    }

    /// As [`Service::refused`] for a consumer's call: READ on its group and on the topic.
    fn consumer_refused(&self, caller: &Caller, group: Option<&Resource>, topic: Option<&Resource>) -> Option<Status> {
        let group = group.map(|g| g.name.as_str()).unwrap_or_default();
        let topic = topic.map(|t| t.name.as_str()).unwrap_or_default();
        self.refused(caller, AclOperation::Read, ResourceType::Group, group)
            .or_else(|| self.refused(caller, AclOperation::Read, ResourceType::Topic, topic))
    }

    /// `Some(TOO_MANY_REQUESTS)` while `client` is throttled for `kind` by its client quota
    /// (`weir_broker::quotas`: a RocketMQ client counts as the user of its access key, or
    /// ANONYMOUS, under its client id). RocketMQ's clients back off and retry on that code.
    fn over_quota(&self, caller: &Caller, kind: QuotaKind, client: &str) -> Option<Status> {
        let quotas = &self.broker.client_quotas;
        if !quotas.any_client_quota() {
            return None;
        }
        let left = quotas.throttled(kind, quota_user(&caller.principal), client)?;
        Some(status(
            Code::TooManyRequests,
            format!("client {client:?} is over its {} quota: retry in {} ms", kind.key(), left.as_millis().max(1)),
        ))
    }

    /// A receive's answer: the messages found within its long poll (answered before the
    /// client's `deadline`), or why there are none.
    async fn receive(
        &self,
        request: &ReceiveMessageRequest,
        client: &str,
        host: Option<&str>,
        deadline: Option<std::time::Duration>,
    ) -> Vec<ReceiveMessageResponse> {
        let mut wanted = match self.receive_request(request, client).await {
            Ok(wanted) => wanted,
            Err(refused) => return vec![receive::status_response(refused)],
        };
        let said = Heard { host, topic: Some(&wanted.partition.topic), ..Heard::default() };
        self.groups.clients.heard(&wanted.key.group, client, self.broker.now_ms(), said);
        // Answer before the client's deadline, not after it: some clients (the Rust
        // one) set it to the long-polling time itself. A fifth of it, at most 1 s, is
        // left for the answer to travel.
        if let Some(deadline) = deadline {
            let reserve = (deadline / 5).min(std::time::Duration::from_secs(1));
            wanted.long_polling = wanted.long_polling.min(deadline.saturating_sub(reserve));
        }
        let (invisible, batch, wait) = (wanted.invisible, wanted.batch, wanted.long_polling);
        let requests = self.broker_wide(wanted, client);
        let results = self.engines.pop.receive_many(&requests, batch, 1, wait).await;
        let mut found = Vec::new();
        let mut first_error = None;
        for (request, result) in requests.iter().zip(results) {
            match result {
                Ok(received) if !received.deliveries.is_empty() => {
                    found.push((request.key.clone(), received.deliveries))
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(queue = request.key.partition, error = %e, "a queue of a receive failed");
                    first_error.get_or_insert(e);
                }
            }
        }
        match (found.is_empty(), first_error) {
            (false, _) => receive::found(&self.broker, invisible, found),
            (true, Some(e)) => vec![receive::status_response(status::of_error(&e))],
            (true, None) => receive::not_found(),
        }
    }

    /// `work`, and the time its polls took when a client quota may count it (else zero: no
    /// timing, no allocation on a broker without quotas).
    async fn timed<T>(&self, work: impl std::future::Future<Output = T>) -> (T, std::time::Duration) {
        if self.broker.client_quotas.any_client_quota() {
            poll_timed(work).await
        } else {
            (work.await, std::time::Duration::ZERO)
        }
    }

    /// Counts the time a call of `client` kept the broker busy (its polls) against its
    /// `request_percentage`.
    fn charge_time(&self, caller: &Caller, client: &str, spent: std::time::Duration) {
        let quotas = &self.broker.client_quotas;
        if quotas.any_client_quota() {
            quotas.record(QuotaKind::Request, quota_user(&caller.principal), client, request_time_value(spent));
        }
    }

    /// Counts `bytes` a call of `client` moved against its client quota of `kind`.
    fn charge(&self, caller: &Caller, kind: QuotaKind, client: &str, bytes: usize) {
        let quotas = &self.broker.client_quotas;
        if quotas.any_client_quota() {
            quotas.record(kind, quota_user(&caller.principal), client, bytes as f64);
        }
    }

    /// Notes that consumer `client` of `group` spoke, from the peer of `request`.
    fn heard_consumer<T>(&self, request: &Request<T>, group: &str, client: &str, said: Heard<'_>) {
        let host = request.remote_addr().map(|a| a.to_string());
        let said = Heard { host: host.as_deref(), ..said };
        self.groups.clients.heard(group, client, self.broker.now_ms(), said);
    }

    /// The queue state a call of `client` for `group` names: the group's, or in a broadcasting
    /// group the client's own.
    fn queue_key(&self, group: String, topic: String, partition: i32, client: &str) -> QueueKey {
        let mut key = QueueKey::new(group, topic, partition);
        if self.broker.group_settings(&key.group).broadcast {
            key.consumer = Some(client.to_string());
        }
        key
    }

    /// The receive of `named`'s queue and of every other queue of its topic this broker leads,
    /// `named` first, then the others in turn from it. RocketMQ's proxy receives from a broker
    /// (its "broker acting queue", id -1), not from the queue a client names, so a consumer is
    /// never left waiting on an empty queue while another of the broker's has messages; the
    /// answer says each message's queue.
    fn broker_wide(&self, named: ReceiveRequest, client: &str) -> Vec<ReceiveRequest> {
        let partitions = self.broker.metadata().topic(&named.key.topic).map_or(0, |t| t.partitions);
        let mut requests = Vec::with_capacity(partitions.max(1) as usize);
        for step in 1..partitions {
            let index = (named.key.partition + step) % partitions;
            let Some(partition) = self.broker.partition(&named.key.topic, index) else { continue };
            if partition.check_local_leader().is_err() {
                continue;
            }
            let key = self.queue_key(named.key.group.clone(), named.key.topic.clone(), index, client);
            requests.push(ReceiveRequest { key, partition, ..named.clone() });
        }
        requests.insert(0, named);
        requests
    }

    /// What a receive asks the core for, or the status refusing it.
    async fn receive_request(&self, request: &ReceiveMessageRequest, client: &str) -> Result<ReceiveRequest, Status> {
        let group = group_name(request.group.as_ref())?;
        let queue = request.message_queue.as_ref().ok_or_else(|| status(Code::BadRequest, "no message queue"))?;
        let topic = self.topic(queue.topic.as_ref()).await?;
        let partition = self
            .broker
            .partition(&topic.name, queue.id)
            .filter(|_| queue.id >= 0 && queue.id < topic.partitions)
            .ok_or_else(|| {
                status(Code::HaNotAvailable, format!("queue {} of {} is not on this broker", queue.id, topic.name))
            })?;
        partition.check_local_leader().map_err(|e| status::of_error(&e))?;
        let filter = crate::filter::parse(request.filter_expression.as_ref())?;
        if request.batch_size <= 0 {
            return Err(status(Code::BadRequest, format!("batch size {} is not positive", request.batch_size)));
        }
        let invisible = match &request.invisible_duration {
            Some(d) => {
                duration_of(d).ok_or_else(|| status(Code::IllegalInvisibleTime, "a negative invisible duration"))?
            }
            // A push consumer's receive: it names none and asks the server to renew (see
            // `pop::renew`): the message is handed out for a slice, renewed while the client
            // holds it.
            None if request.auto_renew => pop::renew::DEFAULT_SLICE,
            None => return Err(status(Code::IllegalInvisibleTime, "the receive has no invisible duration")),
        };
        if !(pop::receive::MIN_INVISIBLE..=pop::receive::MAX_INVISIBLE).contains(&invisible) {
            return Err(status(
                Code::IllegalInvisibleTime,
                format!("invisible duration {invisible:?} is outside 1 s..12 h"),
            ));
        }
        let long_polling = match &request.long_polling_timeout {
            Some(d) => duration_of(d).ok_or_else(|| status(Code::IllegalPollingTime, "a negative polling time"))?,
            None => telemetry::LONG_POLLING_TIMEOUT,
        };
        if long_polling > pop::receive::MAX_LONG_POLLING {
            return Err(status(Code::IllegalPollingTime, format!("long polling {long_polling:?} is over 60 s")));
        }
        let settings = self.broker.group_settings(&group);
        Ok(ReceiveRequest {
            max_attempts: settings.max_delivery_attempts,
            fifo: settings.fifo,
            start: settings.consume_from,
            key: self.queue_key(group, topic.name.clone(), queue.id, client),
            partition,
            filter,
            batch: (request.batch_size as usize).min(pop::receive::MAX_BATCH),
            invisible,
            long_polling,
            hold_for: request.auto_renew.then(|| client.to_string()),
            nonce: None,
            whole_batches: false,
        })
    }

    /// Acks the entries of one request, together (their state writes go out as one).
    async fn ack<'h>(
        &self,
        group: &str,
        topic: &str,
        handles: impl Iterator<Item = &'h str>,
        client: &str,
    ) -> Vec<Status> {
        let mut statuses: Vec<Option<Status>> = Vec::new();
        // One key per queue named (a batch's handles are mostly of one queue).
        let mut keys: Vec<QueueKey> = Vec::new();
        let mut named = Vec::new();
        for handle in handles {
            match Handle::decode(handle) {
                Some(handle) => {
                    let index = match keys.iter().position(|k| k.partition == handle.partition) {
                        Some(index) => index,
                        None => {
                            keys.push(self.queue_key(group.to_string(), topic.to_string(), handle.partition, client));
                            keys.len() - 1
                        }
                    };
                    named.push((index, handle.offset, handle.nonce));
                    statuses.push(None);
                }
                None => statuses.push(Some(status(
                    Code::InvalidReceiptHandle,
                    format!("{handle:?} is not a receipt handle of this broker"),
                ))),
            }
        }
        let acks: Vec<(&QueueKey, i64, u64)> =
            named.into_iter().map(|(index, offset, nonce)| (&keys[index], offset, nonce)).collect();
        let mut results = self.engines.pop.ack_many(&acks).await.into_iter();
        statuses
            .into_iter()
            .map(|decided| {
                decided.unwrap_or_else(|| match results.next() {
                    Some(Ok(Ok(()))) => status::ok(),
                    Some(Ok(Err(e))) => receive::handle_status(e),
                    Some(Err(e)) => status::of_error(&e),
                    None => status(Code::InternalServerError, "no ack result"),
                })
            })
            .collect()
    }

    /// Counts a call of `operation` (an index into [`OPERATIONS`]) that took since `started` and
    /// answered `code`.
    fn observe(&self, operation: usize, started: Instant, code: i32) {
        if let Some(metrics) = self.metrics.operation(operation as i32, || OPERATIONS[operation].to_string()) {
            metrics.observe(started.elapsed());
            if code != Code::Ok as i32 {
                metrics.error_counter().count(code);
            }
        }
    }

    /// The topic `resource` names, created with RocketMQ's defaults when it does not exist and
    /// auto-creation is on.
    async fn topic(&self, resource: Option<&Resource>) -> Result<TopicMetadata, Status> {
        let name = resource.map(|r| r.name.as_str()).unwrap_or_default();
        if name.is_empty() {
            return Err(status(Code::IllegalTopic, "the request names no topic"));
        }
        if name.starts_with("__") {
            return Err(status(Code::IllegalTopic, format!("{name} is an internal topic")));
        }
        if let Some(topic) = self.broker.metadata().topic(name) {
            return Ok(topic.clone());
        }
        if let Err(e) = Broker::validate_topic_name(name) {
            return Err(status(Code::IllegalTopic, e.message));
        }
        if !self.broker.config.auto_create_topics {
            return Err(status(Code::TopicNotFound, format!("topic {name} does not exist")));
        }
        let configs = BTreeMap::from([
            ("max.message.bytes".to_string(), (DEFAULT_MAX_BODY_BYTES + PROPERTY_ALLOWANCE_BYTES).to_string()),
            // RocketMQ users query their messages by key and id.
            (weir_broker::topic_config::MESSAGE_INDEX.to_string(), "true".to_string()),
        ]);
        self.broker.auto_create_topic_with(name, configs).await.map_err(|e| status::of_error(&e))
    }

    /// The largest body `topic` takes.
    fn max_body_bytes(&self, topic: &str) -> usize {
        let max_message_bytes = self
            .broker
            .partition(topic, 0)
            .map_or(DEFAULT_MAX_BODY_BYTES + PROPERTY_ALLOWANCE_BYTES, |p| p.log.config().max_message_bytes as usize);
        max_message_bytes.saturating_sub(PROPERTY_ALLOWANCE_BYTES)
    }

    async fn send_messages(&self, request: SendMessageRequest, caller: &Caller) -> SendMessageResponse {
        let count = request.messages.len();
        if count == 0 {
            return SendMessageResponse {
                status: Some(status(Code::BadRequest, "no messages to send")),
                entries: vec![],
            };
        }
        let mut entries = vec![SendResultEntry::default(); count];
        // Topic → the valid messages for it, by index in the request.
        let mut by_topic: BTreeMap<String, Vec<(usize, weir_broker::message::Message)>> = BTreeMap::new();
        for (index, message) in request.messages.iter().enumerate() {
            let id = message.system_properties.as_ref().map(|s| s.message_id.clone()).unwrap_or_default();
            let topic = match self.topic(message.topic.as_ref()).await {
                Ok(topic) => topic,
                Err(refused) => {
                    entries[index] = SendResultEntry { status: Some(refused), message_id: id, ..Default::default() };
                    continue;
                }
            };
            if let Some(refused) = self.refused(caller, AclOperation::Write, ResourceType::Topic, &topic.name) {
                entries[index] = SendResultEntry { status: Some(refused), message_id: id, ..Default::default() };
                continue;
            }
            let topic_type = weir_broker::topic_config::message_type(&topic.configs);
            let max_delay_ms =
                weir_broker::topic_config::message_delay_max_ms(&self.broker.config.topic_defaults, &topic.configs);
            match send::validate(message, self.max_body_bytes(&topic.name), topic_type, max_delay_ms) {
                Ok(valid) if topic_type == weir_broker::topic_config::MessageType::Transaction => {
                    let recovery = message
                        .system_properties
                        .as_ref()
                        .and_then(|s| s.orphaned_transaction_recovery_duration.as_ref())
                        .and_then(duration_of);
                    let id = valid.id().to_string();
                    entries[index] = match self.engines.transactions.prepare(&topic.name, valid, recovery).await {
                        Ok((offset, transaction_id)) => SendResultEntry {
                            status: Some(status::ok()),
                            message_id: id,
                            transaction_id,
                            offset,
                            recall_handle: String::new(),
                        },
                        Err(e) => {
                            SendResultEntry { status: Some(status::of_error(&e)), message_id: id, ..Default::default() }
                        }
                    };
                }
                Ok(valid) => by_topic.entry(topic.name).or_default().push((index, valid)),
                Err(refused) => {
                    entries[index] = SendResultEntry { status: Some(refused), message_id: id, ..Default::default() }
                }
            }
        }
        for (topic, messages) in by_topic {
            let count = self.broker.metadata().topic(&topic).map_or(0, |t| t.partitions);
            // This broker's partitions of the topic (maybe none: then FIFO messages are
            // forwarded to their queues' leaders, and the others refused).
            let partitions = self.broker.topic_partitions(&topic).unwrap_or_default();
            let led: Vec<i32> =
                partitions.iter().flatten().filter(|p| p.check_local_leader().is_ok()).map(|p| p.index).collect();
            let target = send::Target { topic: &topic, count, partitions: &partitions, led: &led };
            send::append(&self.messaging, target, messages, &self.round_robin, &mut entries).await;
        }
        let overall = status::overall(entries.iter().filter_map(|e| e.status.as_ref()), "some messages were not sent");
        SendMessageResponse { status: Some(overall), entries }
    }
}

/// The kind of consumer a client type is; `None` for producers and types not known.
/// A consumer's subscription as it said it: (topic, filter expression), `*` for none.
fn subscription_of(subscription: &crate::proto::Subscription) -> Vec<(String, String)> {
    subscription
        .subscriptions
        .iter()
        .filter_map(|entry| {
            let topic = entry.topic.as_ref()?.name.clone();
            let expression = entry.expression.as_ref().map(|e| e.expression.clone()).filter(|e| !e.is_empty());
            Some((topic, expression.unwrap_or_else(|| "*".to_string())))
        })
        .collect()
}

/// (language, version) of a client's user agent, the language as RocketMQ names it (`JAVA`).
fn agent_of(agent: &crate::proto::Ua) -> (String, String) {
    let language = crate::proto::Language::try_from(agent.language).map_or("UNKNOWN", |l| l.as_str_name());
    (language.to_string(), agent.version.clone())
}

fn consumer_kind(client_type: i32) -> Option<ClientKind> {
    match ClientType::try_from(client_type).ok()? {
        ClientType::SimpleConsumer | ClientType::LiteSimpleConsumer => Some(ClientKind::SimpleConsumer),
        ClientType::PushConsumer | ClientType::LitePushConsumer => Some(ClientKind::PushConsumer),
        ClientType::PullConsumer => Some(ClientKind::PullConsumer),
        ClientType::Producer | ClientType::Unspecified => None,
    }
}

/// The group a request names.
fn group_name(group: Option<&Resource>) -> Result<String, Status> {
    match group.map(|g| g.name.trim()) {
        Some(name) if !name.is_empty() && name.len() <= 255 => Ok(name.to_string()),
        _ => {
            Err(status(Code::IllegalConsumerGroup, "the request names no consumer group (or one over 255 characters)"))
        }
    }
}

/// A protobuf duration as a std one; `None` when negative.
/// A `grpc-timeout` header's value: at most 8 digits and a unit (H, M, S, m, u, n).
fn grpc_timeout(value: &str) -> Option<std::time::Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let count: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => std::time::Duration::from_secs(count * 3600),
        "M" => std::time::Duration::from_secs(count * 60),
        "S" => std::time::Duration::from_secs(count),
        "m" => std::time::Duration::from_millis(count),
        "u" => std::time::Duration::from_micros(count),
        "n" => std::time::Duration::from_nanos(count),
        _ => return None,
    })
}

fn duration_of(d: &prost_types::Duration) -> Option<std::time::Duration> {
    (d.seconds >= 0 && d.nanos >= 0).then(|| std::time::Duration::new(d.seconds as u64, d.nanos as u32))
}

fn not_implemented(what: &str) -> Status {
    status(Code::NotImplemented, format!("{what} is not implemented by this broker yet"))
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, tonic::Status>> + Send + 'static>>;

#[tonic::async_trait]
impl MessagingService for Service {
    async fn query_route(
        &self,
        request: Request<QueryRouteRequest>,
    ) -> Result<Response<QueryRouteResponse>, tonic::Status> {
        let started = Instant::now();
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let topic = self.topic(request.topic.as_ref()).await.and_then(|topic| {
            match self.refused(&caller, AclOperation::Describe, ResourceType::Topic, &topic.name) {
                Some(refused) => Err(refused),
                None => Ok(topic),
            }
        });
        let response = match topic {
            Ok(topic) => {
                let queues = route::queues(&self.broker.metadata(), &topic);
                if queues.is_empty() {
                    QueryRouteResponse {
                        status: Some(status(
                            Code::InternalServerError,
                            format!("no queue of {} has a leader with a RocketMQ listener right now", topic.name),
                        )),
                        message_queues: vec![],
                    }
                } else {
                    QueryRouteResponse { status: Some(status::ok()), message_queues: queues }
                }
            }
            Err(refused) => QueryRouteResponse { status: Some(refused), message_queues: vec![] },
        };
        self.observe(0, started, response.status.as_ref().map_or(0, |s| s.code));
        Ok(Response::new(response))
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, tonic::Status> {
        let started = Instant::now();
        let client = self.client_of(&request);
        let heartbeat = request.get_ref();
        if let (Some(group), Some(kind)) = (heartbeat.group.as_ref(), consumer_kind(heartbeat.client_type)) {
            self.heard_consumer(&request, &group.name, &client, Heard { kind: Some(kind), ..Heard::default() });
        }
        self.observe(1, started, Code::Ok as i32);
        Ok(Response::new(HeartbeatResponse { status: Some(status::ok()) }))
    }

    async fn send_message(
        &self,
        request: Request<SendMessageRequest>,
    ) -> Result<Response<SendMessageResponse>, tonic::Status> {
        let started = Instant::now();
        let caller = Caller::of(&request);
        let client = self.client_of(&request);
        let request = request.into_inner();
        let throttled = self
            .over_quota(&caller, QuotaKind::Produce, &client)
            .or_else(|| self.over_quota(&caller, QuotaKind::Request, &client));
        let response = match throttled {
            Some(throttled) => SendMessageResponse { status: Some(throttled), entries: vec![] },
            None => {
                let bytes = prost::Message::encoded_len(&request);
                let (response, spent) = self.timed(self.send_messages(request, &caller)).await;
                self.charge(&caller, QuotaKind::Produce, &client, bytes);
                self.charge_time(&caller, &client, spent);
                response
            }
        };
        self.observe(2, started, response.status.as_ref().map_or(0, |s| s.code));
        Ok(Response::new(response))
    }

    async fn query_assignment(
        &self,
        request: Request<QueryAssignmentRequest>,
    ) -> Result<Response<QueryAssignmentResponse>, tonic::Status> {
        let started = Instant::now();
        let caller = Caller::of(&request);
        let request = request.into_inner();
        if let Some(refused) = self.consumer_refused(&caller, request.group.as_ref(), request.topic.as_ref()) {
            let response = QueryAssignmentResponse { status: Some(refused), assignments: vec![] };
            self.observe(3, started, response.status.as_ref().map_or(0, |s| s.code));
            return Ok(Response::new(response));
        }
        // Consumption is by invisible time, so consumers of a group need not split the queues:
        // each gets every queue, and receives of one queue take turns (RocketMQ 5's POP mode).
        let response = match group_name(request.group.as_ref()) {
            Err(refused) => QueryAssignmentResponse { status: Some(refused), assignments: vec![] },
            Ok(_) => match self.topic(request.topic.as_ref()).await {
                Err(refused) => QueryAssignmentResponse { status: Some(refused), assignments: vec![] },
                Ok(topic) => {
                    let queues = route::queues(&self.broker.metadata(), &topic);
                    QueryAssignmentResponse {
                        status: Some(status::ok()),
                        assignments: queues.into_iter().map(|q| Assignment { message_queue: Some(q) }).collect(),
                    }
                }
            },
        };
        self.observe(3, started, response.status.as_ref().map_or(0, |s| s.code));
        Ok(Response::new(response))
    }

    type ReceiveMessageStream = ResponseStream<ReceiveMessageResponse>;

    async fn receive_message(
        &self,
        request: Request<ReceiveMessageRequest>,
    ) -> Result<Response<Self::ReceiveMessageStream>, tonic::Status> {
        let started = Instant::now();
        let client = self.client_of(&request);
        let deadline = request.metadata().get("grpc-timeout").and_then(|v| v.to_str().ok()).and_then(grpc_timeout);
        let caller = Caller::of(&request);
        let host = caller.peer.map(|a| a.to_string());
        let request = request.into_inner();
        let topic = request.message_queue.as_ref().and_then(|q| q.topic.as_ref());
        let refused = self
            .consumer_refused(&caller, request.group.as_ref(), topic)
            .or_else(|| self.over_quota(&caller, QuotaKind::Fetch, &client))
            .or_else(|| self.over_quota(&caller, QuotaKind::Request, &client));
        let (responses, spent) = match refused {
            Some(refused) => (vec![receive::status_response(refused)], std::time::Duration::ZERO),
            None => self.timed(self.receive(&request, &client, host.as_deref(), deadline)).await,
        };
        self.charge_time(&caller, &client, spent);
        let code = responses
            .iter()
            .find_map(|r| match &r.content {
                Some(receive_message_response::Content::Status(s)) => Some(s.code),
                _ => None,
            })
            .unwrap_or(0);
        self.charge(&caller, QuotaKind::Fetch, &client, responses.iter().map(prost::Message::encoded_len).sum());
        // An empty long poll is no failure.
        self.observe(4, started, if code == Code::MessageNotFound as i32 { Code::Ok as i32 } else { code });
        Ok(Response::new(Box::pin(tokio_stream::iter(responses.into_iter().map(Ok)))))
    }

    async fn ack_message(
        &self,
        request: Request<AckMessageRequest>,
    ) -> Result<Response<AckMessageResponse>, tonic::Status> {
        let started = Instant::now();
        let client = self.client_of(&request);
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let refused = self.consumer_refused(&caller, request.group.as_ref(), request.topic.as_ref());
        let group = match refused {
            Some(refused) => Err(refused),
            None => group_name(request.group.as_ref()),
        };
        let response = match (group, request.topic.as_ref().map(|t| t.name.as_str())) {
            (Err(refused), _) => AckMessageResponse { status: Some(refused), entries: vec![] },
            (_, None | Some("")) => AckMessageResponse {
                status: Some(status(Code::IllegalTopic, "the request names no topic")),
                entries: vec![],
            },
            (Ok(group), Some(topic)) => {
                let statuses =
                    self.ack(&group, topic, request.entries.iter().map(|e| e.receipt_handle.as_str()), &client).await;
                let entries: Vec<AckMessageResultEntry> = request
                    .entries
                    .iter()
                    .zip(statuses)
                    .map(|(e, status)| AckMessageResultEntry {
                        message_id: e.message_id.clone(),
                        receipt_handle: e.receipt_handle.clone(),
                        status: Some(status),
                    })
                    .collect();
                let overall = status::overall(entries.iter().filter_map(|e| e.status.as_ref()), "some acks failed");
                AckMessageResponse { status: Some(overall), entries }
            }
        };
        self.observe(5, started, response.status.as_ref().map_or(0, |s| s.code));
        Ok(Response::new(response))
    }

    async fn forward_message_to_dead_letter_queue(
        &self,
        request: Request<ForwardMessageToDeadLetterQueueRequest>,
    ) -> Result<Response<ForwardMessageToDeadLetterQueueResponse>, tonic::Status> {
        let started = Instant::now();
        let client = self.client_of(&request);
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let refused = self.consumer_refused(&caller, request.group.as_ref(), request.topic.as_ref());
        let outcome = match refused {
            Some(refused) => Err(refused),
            None => self.forward_to_dead_letters(&request, &client).await,
        };
        let answer = match outcome {
            Ok(()) => status::ok(),
            Err(refused) => refused,
        };
        self.observe(6, started, answer.code);
        Ok(Response::new(ForwardMessageToDeadLetterQueueResponse { status: Some(answer) }))
    }

    type PullMessageStream = ResponseStream<PullMessageResponse>;

    async fn pull_message(
        &self,
        _request: Request<PullMessageRequest>,
    ) -> Result<Response<Self::PullMessageStream>, tonic::Status> {
        let started = Instant::now();
        let refused = not_implemented("PullMessage (pull consumers)");
        self.observe(7, started, refused.code);
        let answer = PullMessageResponse { content: Some(pull_message_response::Content::Status(refused)) };
        Ok(Response::new(Box::pin(tokio_stream::once(Ok(answer)))))
    }

    async fn update_offset(
        &self,
        _request: Request<UpdateOffsetRequest>,
    ) -> Result<Response<UpdateOffsetResponse>, tonic::Status> {
        let started = Instant::now();
        let refused = not_implemented("UpdateOffset (pull consumers)");
        self.observe(8, started, refused.code);
        Ok(Response::new(UpdateOffsetResponse { status: Some(refused) }))
    }

    async fn get_offset(
        &self,
        _request: Request<GetOffsetRequest>,
    ) -> Result<Response<GetOffsetResponse>, tonic::Status> {
        let started = Instant::now();
        let refused = not_implemented("GetOffset (pull consumers)");
        self.observe(9, started, refused.code);
        Ok(Response::new(GetOffsetResponse { status: Some(refused), offset: 0 }))
    }

    async fn query_offset(
        &self,
        _request: Request<QueryOffsetRequest>,
    ) -> Result<Response<QueryOffsetResponse>, tonic::Status> {
        let started = Instant::now();
        let refused = not_implemented("QueryOffset (pull consumers)");
        self.observe(10, started, refused.code);
        Ok(Response::new(QueryOffsetResponse { status: Some(refused), offset: 0 }))
    }

    async fn end_transaction(
        &self,
        request: Request<EndTransactionRequest>,
    ) -> Result<Response<EndTransactionResponse>, tonic::Status> {
        let started = Instant::now();
        self.client_of(&request);
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let topic = request.topic.as_ref().map(|t| t.name.as_str()).unwrap_or_default();
        let answer = match self.refused(&caller, AclOperation::Write, ResourceType::Topic, topic) {
            Some(refused) => refused,
            None => crate::transaction::end(&self.engines.transactions, &request).await,
        };
        self.observe(11, started, answer.code);
        Ok(Response::new(EndTransactionResponse { status: Some(answer) }))
    }

    type TelemetryStream = ResponseStream<TelemetryCommand>;

    async fn telemetry(
        &self,
        request: Request<Streaming<TelemetryCommand>>,
    ) -> Result<Response<Self::TelemetryStream>, tonic::Status> {
        let client = self.client_of(&request);
        let host = request.remote_addr().map(|a| a.to_string());
        let mut incoming = request.into_inner();
        let (tx, rx) = mpsc::channel::<Result<TelemetryCommand, tonic::Status>>(16);
        let broker = self.broker.clone();
        let groups = self.groups.clone();
        let metrics = self.metrics.clone();
        let producers = self.producers.clone();
        // A producer's stream is where its transactions are checked.
        let mut registered: Option<u64> = None;
        let mut shutdown = self.broker.shutdown_signal();
        tokio::spawn(async move {
            // Until the client closes its side, the connection goes or the broker shuts down
            // (ending the stream lets the listener's graceful stop finish): each command that
            // carries settings is answered with the server's.
            loop {
                let command = tokio::select! {
                    command = incoming.next() => command,
                    _ = shutdown.wait_for(|down| *down) => None,
                };
                let Some(Ok(command)) = command else { break };
                let started = Instant::now();
                let answer = match command.command {
                    Some(telemetry_command::Command::Settings(settings)) => {
                        if let Some(crate::proto::settings::PubSub::Publishing(publishing)) = &settings.pub_sub {
                            let topics = publishing.topics.iter().map(|t| t.name.clone()).collect();
                            registered = Some(producers.register(&client, topics, tx.clone()));
                        }
                        let max_body = publishing_limit(&broker, &settings);
                        let group = match &settings.pub_sub {
                            Some(crate::proto::settings::PubSub::Subscription(s)) => s.group.as_ref().map(|g| {
                                let said = Heard {
                                    host: host.as_deref(),
                                    kind: settings.client_type.and_then(consumer_kind),
                                    subscription: Some(subscription_of(s)),
                                    agent: settings.user_agent.as_ref().map(agent_of),
                                    topic: None,
                                };
                                groups.clients.heard(&g.name, &client, broker.now_ms(), said);
                                broker.group_settings(&g.name)
                            }),
                            _ => None,
                        };
                        Some(telemetry::answer(&settings, max_body, group.unwrap_or_default()))
                    }
                    // Answers to the server's commands; the server sends none yet.
                    Some(_) => None,
                    None => Some(TelemetryCommand {
                        status: Some(status(Code::BadRequest, "a telemetry command without a command")),
                        command: None,
                    }),
                };
                if let Some(metrics) = metrics.operation(12, || OPERATIONS[12].to_string()) {
                    metrics.observe(started.elapsed());
                }
                if let Some(answer) = answer {
                    if tx.send(Ok(answer)).await.is_err() {
                        break;
                    }
                }
            }
            if let Some(generation) = registered {
                producers.gone(&client, generation);
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn notify_client_termination(
        &self,
        request: Request<NotifyClientTerminationRequest>,
    ) -> Result<Response<NotifyClientTerminationResponse>, tonic::Status> {
        let started = Instant::now();
        // Messages it still held come back when their current slice ends.
        let client = self.client_of(&request);
        self.groups.clients.gone(&client);
        self.observe(13, started, Code::Ok as i32);
        Ok(Response::new(NotifyClientTerminationResponse { status: Some(status::ok()) }))
    }

    async fn change_invisible_duration(
        &self,
        request: Request<ChangeInvisibleDurationRequest>,
    ) -> Result<Response<ChangeInvisibleDurationResponse>, tonic::Status> {
        let started = Instant::now();
        let client = self.client_of(&request);
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let outcome = match self.consumer_refused(&caller, request.group.as_ref(), request.topic.as_ref()) {
            Some(refused) => Err(refused),
            None => self.change_invisible(&request, &client).await,
        };
        let response = match outcome {
            Ok(handle) => ChangeInvisibleDurationResponse { status: Some(status::ok()), receipt_handle: handle },
            Err(refused) => ChangeInvisibleDurationResponse { status: Some(refused), receipt_handle: String::new() },
        };
        self.observe(14, started, response.status.as_ref().map_or(0, |s| s.code));
        Ok(Response::new(response))
    }

    async fn recall_message(
        &self,
        request: Request<RecallMessageRequest>,
    ) -> Result<Response<RecallMessageResponse>, tonic::Status> {
        let started = Instant::now();
        self.client_of(&request);
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let topic = request.topic.as_ref().map(|t| t.name.as_str()).unwrap_or_default();
        let outcome = match self.refused(&caller, AclOperation::Write, ResourceType::Topic, topic) {
            Some(refused) => Err(refused),
            None => crate::recall::recall(&self.messaging, &request).await,
        };
        let response = match outcome {
            Ok(message_id) => RecallMessageResponse { status: Some(status::ok()), message_id },
            Err(refused) => RecallMessageResponse { status: Some(refused), message_id: String::new() },
        };
        self.observe(15, started, response.status.as_ref().map_or(0, |s| s.code));
        Ok(Response::new(response))
    }
}

impl Service {
    /// The queue state and the delivery a call about one received message names: its group,
    /// topic and receipt handle.
    fn handled_queue(
        &self,
        group: Option<&Resource>,
        topic: Option<&Resource>,
        receipt_handle: &str,
        client: &str,
    ) -> Result<(QueueKey, Handle), Status> {
        let group = group_name(group)?;
        let topic = topic.map(|t| t.name.clone()).filter(|t| !t.is_empty());
        let topic = topic.ok_or_else(|| status(Code::IllegalTopic, "the request names no topic"))?;
        let handle = Handle::decode(receipt_handle).ok_or_else(|| {
            status(Code::InvalidReceiptHandle, format!("{receipt_handle:?} is not a receipt handle of this broker"))
        })?;
        Ok((self.queue_key(group, topic, handle.partition, client), handle))
    }

    /// A consumer gives up on a delivery (a push consumer after its last attempt): the message
    /// goes to the group's dead letters and is done in its queue.
    async fn forward_to_dead_letters(
        &self,
        request: &ForwardMessageToDeadLetterQueueRequest,
        client: &str,
    ) -> Result<(), Status> {
        let (key, handle) =
            self.handled_queue(request.group.as_ref(), request.topic.as_ref(), &request.receipt_handle, client)?;
        match self.engines.pop.give_up(&key, handle.offset, handle.nonce).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(receive::handle_status(e)),
            Err(e) => Err(status::of_error(&e)),
        }
    }

    /// Gives the delivery a new invisible time; returns its new receipt handle.
    async fn change_invisible(&self, request: &ChangeInvisibleDurationRequest, client: &str) -> Result<String, Status> {
        let (key, handle) =
            self.handled_queue(request.group.as_ref(), request.topic.as_ref(), &request.receipt_handle, client)?;
        let invisible = request
            .invisible_duration
            .as_ref()
            .and_then(duration_of)
            .filter(|d| *d <= pop::receive::MAX_INVISIBLE)
            .ok_or_else(|| {
                status(Code::IllegalInvisibleTime, "the invisible duration is missing, negative or over 12 h")
            })?;
        match self.engines.pop.change_invisible(&key, handle.offset, handle.nonce, invisible).await {
            Ok(Ok(renewed)) => Ok(Handle { nonce: renewed, ..handle }.encode()),
            Ok(Err(e)) => Err(receive::handle_status(e)),
            Err(e) => Err(status::of_error(&e)),
        }
    }
}

/// The largest body a producer may send to every topic it named (RocketMQ's default when it
/// names none, or none exists yet).
fn publishing_limit(broker: &Broker, settings: &Settings) -> usize {
    let Some(settings::PubSub::Publishing(publishing)) = &settings.pub_sub else {
        return DEFAULT_MAX_BODY_BYTES;
    };
    publishing
        .topics
        .iter()
        .filter_map(|t| broker.partition(&t.name, 0))
        .map(|p| (p.log.config().max_message_bytes as usize).saturating_sub(PROPERTY_ALLOWANCE_BYTES))
        .min()
        .unwrap_or(DEFAULT_MAX_BODY_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn grpc_timeouts_parse_in_every_unit_and_nonsense_does_not() {
        assert_eq!(grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(grpc_timeout("1500m"), Some(Duration::from_millis(1500)));
        assert_eq!(grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(grpc_timeout("7u"), Some(Duration::from_micros(7)));
        for bad in ["", "S", "12", "123456789S", "1x", "-1S", "1.5S"] {
            assert_eq!(grpc_timeout(bad), None, "{bad:?}");
        }
    }
}
