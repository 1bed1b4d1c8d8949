//! The RocketMQ 5 calls `weir bench rocketmq` makes, as a producer and a SimpleConsumer make
//! them (QueryRoute, SendMessage, ReceiveMessage, AckMessage), over weir-rocketmq's generated
//! gRPC client. Every answer is checked: a status other than OK is an error that names its code,
//! so a misbehaving broker fails the run instead of skewing its figures.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Channel, Endpoint};
use weir_rocketmq::proto::messaging_service_client::MessagingServiceClient;
use weir_rocketmq::proto::receive_message_response::Content;
use weir_rocketmq::proto::{
    AckMessageEntry, AckMessageRequest, Code, Encoding, FilterExpression, FilterType, Message, MessageQueue,
    MessageType, QueryRouteRequest, ReceiveMessageRequest, Resource, SendMessageRequest, Status, SystemProperties,
};

/// A call that takes longer than this fails the run (a receive's long poll is far shorter).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A client of one HTTP/2 connection; clones share it, as the calls of a RocketMQ client share
/// its connection to an endpoint.
pub(crate) type Client = MessagingServiceClient<InterceptedService<Channel, Headers>>;

/// The headers RocketMQ 5 clients send with every call. Weir's front-end needs none of them;
/// they are sent so that the calls cost what a real client's cost.
#[derive(Clone)]
pub(crate) struct Headers {
    client_id: AsciiMetadataValue,
}

impl Interceptor for Headers {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let metadata = request.metadata_mut();
        metadata.insert("x-mq-client-id", self.client_id.clone());
        metadata.insert("x-mq-language", AsciiMetadataValue::from_static("RUST"));
        metadata.insert("x-mq-protocol", AsciiMetadataValue::from_static("v2"));
        metadata.insert("x-mq-client-version", AsciiMetadataValue::from_static(env!("CARGO_PKG_VERSION")));
        Ok(request)
    }
}

/// Opens an HTTP/2 connection to the RocketMQ listener at `addr`.
pub(crate) async fn connect(addr: SocketAddr, client_id: &str) -> anyhow::Result<Client> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10))
        .timeout(CALL_TIMEOUT)
        .connect()
        .await
        .with_context(|| format!("cannot connect to the RocketMQ listener at {addr}"))?;
    let headers = Headers { client_id: client_id.parse().with_context(|| format!("client id {client_id:?}"))? };
    Ok(MessagingServiceClient::with_interceptor(channel, headers)
        .max_decoding_message_size(weir_rocketmq::MAX_GRPC_MESSAGE_BYTES)
        .max_encoding_message_size(weir_rocketmq::MAX_GRPC_MESSAGE_BYTES))
}

/// `NAME (code)` of a RocketMQ status code, for messages: `TOPIC_NOT_FOUND (40402)`.
pub(crate) fn code_name(code: i32) -> String {
    format!("{} ({code})", weir_rocketmq::status::code_name(code))
}

/// Fails unless `status` is there and OK.
fn check(what: &str, status: Option<&Status>) -> anyhow::Result<()> {
    let status = status.with_context(|| format!("{what}: the answer has no status"))?;
    if status.code != Code::Ok as i32 {
        bail!("{what} failed: {} {}", code_name(status.code), status.message);
    }
    Ok(())
}

fn resource(name: &str) -> Option<Resource> {
    Some(Resource { resource_namespace: String::new(), name: name.to_string() })
}

/// The message queues of `topic`, from QueryRoute.
pub(crate) async fn query_route(client: &mut Client, topic: &str) -> anyhow::Result<Vec<MessageQueue>> {
    let request = QueryRouteRequest { topic: resource(topic), endpoints: None };
    let response = client.query_route(request).await.context("QueryRoute")?.into_inner();
    check(&format!("QueryRoute of {topic}"), response.status.as_ref())?;
    Ok(response.message_queues)
}

fn now() -> prost_types::Timestamp {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp { seconds: since_epoch.as_secs() as i64, nanos: since_epoch.subsec_nanos() as i32 }
}

/// A normal message as a producer makes it: a unique id, a tag, born now here.
pub(crate) fn message(topic: &str, message_id: String, tag: &str, body: Vec<u8>) -> Message {
    Message {
        topic: resource(topic),
        user_properties: Default::default(),
        system_properties: Some(SystemProperties {
            tag: Some(tag.to_string()),
            message_id,
            body_encoding: Encoding::Identity as i32,
            message_type: MessageType::Normal as i32,
            born_timestamp: Some(now()),
            born_host: "127.0.0.1".to_string(),
            ..Default::default()
        }),
        body: body.into(),
    }
}

/// SendMessage of one message; fails unless the broker stored it under its id.
pub(crate) async fn send(client: &mut Client, message: Message) -> anyhow::Result<()> {
    let id = message.system_properties.as_ref().map(|s| s.message_id.clone()).unwrap_or_default();
    let request = SendMessageRequest { messages: vec![message] };
    let response = client.send_message(request).await.context("SendMessage")?.into_inner();
    check(&format!("SendMessage of {id}"), response.status.as_ref())?;
    let [entry] = &response.entries[..] else {
        bail!("SendMessage of one message answered {} entries", response.entries.len());
    };
    check(&format!("SendMessage of {id}"), entry.status.as_ref())?;
    if entry.message_id != id {
        bail!("SendMessage of {id} answered for message id {:?}", entry.message_id);
    }
    if entry.offset < 0 {
        bail!("SendMessage of {id} answered offset {}", entry.offset);
    }
    Ok(())
}

/// What a SimpleConsumer's receive asks for.
pub(crate) struct Receive<'a> {
    pub(crate) group: &'a str,
    pub(crate) queue: &'a MessageQueue,
    /// A tag expression (`hit`, `a || b`); `None` takes every message.
    pub(crate) tags: Option<&'a str>,
    pub(crate) batch_size: i32,
    pub(crate) invisible: Duration,
    pub(crate) long_polling: Duration,
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

/// ReceiveMessage: the messages the broker hands out (none when the long poll ended empty,
/// MESSAGE_NOT_FOUND). The stream must open with a status; any status but OK and
/// MESSAGE_NOT_FOUND is an error, and so is a message after MESSAGE_NOT_FOUND.
pub(crate) async fn receive(client: &mut Client, receive: &Receive<'_>) -> anyhow::Result<Vec<Message>> {
    let request = ReceiveMessageRequest {
        group: resource(receive.group),
        message_queue: Some(receive.queue.clone()),
        filter_expression: Some(FilterExpression {
            r#type: FilterType::Tag as i32,
            expression: receive.tags.unwrap_or("*").to_string(),
        }),
        batch_size: receive.batch_size,
        invisible_duration: Some(duration(receive.invisible)),
        auto_renew: false,
        long_polling_timeout: Some(duration(receive.long_polling)),
        attempt_id: None,
    };
    let queue = receive.queue.id;
    let mut stream = client.receive_message(request).await.context("ReceiveMessage")?.into_inner();
    let mut found = None;
    let mut messages = Vec::new();
    while let Some(response) = stream.message().await.with_context(|| format!("ReceiveMessage of queue {queue}"))? {
        match response.content {
            Some(Content::Status(status)) => {
                let not_found = status.code == Code::MessageNotFound as i32;
                if status.code != Code::Ok as i32 && !not_found {
                    bail!("ReceiveMessage of queue {queue} failed: {} {}", code_name(status.code), status.message);
                }
                // The first status says whether messages follow; a closing one may repeat it.
                found.get_or_insert(!not_found);
            }
            Some(Content::Message(message)) => {
                if found != Some(true) {
                    bail!("ReceiveMessage of queue {queue} sent a message before an OK status");
                }
                messages.push(message);
            }
            Some(Content::DeliveryTimestamp(_)) => {}
            None => bail!("ReceiveMessage of queue {queue} sent an empty response"),
        }
    }
    if found.is_none() {
        bail!("ReceiveMessage of queue {queue} ended without a status");
    }
    Ok(messages)
}

/// AckMessage of `messages` (received from `topic` for `group`) in one request; fails unless
/// every entry is acknowledged.
pub(crate) async fn ack(client: &mut Client, group: &str, topic: &str, messages: &[Message]) -> anyhow::Result<()> {
    let entries = messages
        .iter()
        .map(|m| {
            let system = m.system_properties.as_ref().context("a received message has no system properties")?;
            let receipt_handle = system
                .receipt_handle
                .clone()
                .with_context(|| format!("received message {} has no receipt handle", system.message_id))?;
            Ok(AckMessageEntry { message_id: system.message_id.clone(), receipt_handle, lite_topic: None })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let count = entries.len();
    let request = AckMessageRequest { group: resource(group), topic: resource(topic), entries };
    let response = client.ack_message(request).await.context("AckMessage")?.into_inner();
    check(&format!("AckMessage of {count} messages"), response.status.as_ref())?;
    if response.entries.len() != count {
        bail!("AckMessage of {count} messages answered {} entries", response.entries.len());
    }
    for entry in &response.entries {
        check(&format!("AckMessage of {}", entry.message_id), entry.status.as_ref())?;
    }
    Ok(())
}
