//! One round trip with the official RocketMQ 5 Rust client (crates.io `rocketmq` 5.0.0) against
//! Weir, for tests/python/test_rocketmq_rust.py:
//!
//! 1. A Producer sends five messages to TOPIC (one queue; auto-created by the route query),
//!    tags TagA, TagB, TagA, TagB, TagA, each with two keys, two properties and a non-ASCII body.
//! 2. A SimpleConsumer of the fresh group GROUP receives with the tag filter `TagA`: exactly the
//!    three TagA messages, with their bodies, tags, keys, properties, message ids and a first
//!    delivery attempt. It acks them; once their invisible time is over, a receive finds nothing.
//! 3. The Producer sends three messages of one message group to FIFO_TOPIC (a FIFO topic, any
//!    number of queues), and a SimpleConsumer of the group GROUP-fifo receives all three, in the
//!    order sent, with their message group, and acks them.
//!
//! With `messaging` first, RocketMQ's messaging features instead ([`messaging`]): a delayed
//! message to DELAY_TOPIC arrives at its delivery time, not before; of two transactional
//! messages to TRANSACTION_TOPIC the committed one arrives and the rolled-back one never does.
//!
//! Checks everything itself: on any mismatch or client error it prints what differed to stderr
//! and exits 1. On success it prints one JSON line to stdout (what it sent and received). The
//! client's own log goes to stderr.
//!
//!   weir-rocketmq-rust-client ENDPOINT TOPIC FIFO_TOPIC GROUP
//!   weir-rocketmq-rust-client messaging ENDPOINT DELAY_TOPIC TRANSACTION_TOPIC GROUP

use std::collections::HashMap;
use std::fmt::Display;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rocketmq::conf::{ClientOption, ProducerOption, SimpleConsumerOption};
use rocketmq::model::common::{FilterExpression, FilterType};
use rocketmq::model::message::{MessageBuilder, MessageView};
use rocketmq::model::transaction::{Transaction, TransactionResolution};
use rocketmq::{Producer, SimpleConsumer};
use serde_json::json;

const TAGS: [&str; 5] = ["TagA", "TagB", "TagA", "TagB", "TagA"];
const FIFO_MESSAGES: usize = 3;
const MESSAGE_GROUP: &str = "rust-order-42";
/// How long a received message stays invisible to the group.
const INVISIBLE: Duration = Duration::from_secs(3);
/// How long one receive waits for a message. The client makes it the receive's gRPC deadline too
/// (see `receive`).
const LONG_POLLING: Duration = Duration::from_secs(2);
/// How long the program waits, over several receives, for the messages it sent.
const RECEIVE_FOR: Duration = Duration::from_secs(30);

type Result<T> = std::result::Result<T, String>;

fn body(i: usize) -> String {
    format!("rust-{i}: ржавчина ✓ 錆 🦀")
}

fn keys(i: usize) -> Vec<String> {
    vec![format!("rust-key-{i}"), "rust-common-key".to_string()]
}

fn properties(i: usize) -> HashMap<String, String> {
    HashMap::from([("lang".to_string(), "ржавчина".to_string()), ("index".to_string(), i.to_string())])
}

fn fifo_body(i: usize) -> String {
    format!("fifo-{i}: порядок")
}

fn client_option(endpoint: &str) -> ClientOption {
    let mut option = ClientOption::default();
    option.set_access_url(endpoint);
    option.set_enable_tls(false);
    option.set_long_polling_timeout(LONG_POLLING);
    option
}

fn fail<E: std::fmt::Debug>(what: impl Display) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e:?}")
}

fn check<T: PartialEq + std::fmt::Debug>(what: impl Display, got: T, want: T) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: got {got:?}, want {want:?}"))
    }
}

fn text(message: &MessageView) -> Result<String> {
    String::from_utf8(message.body().to_vec())
        .map_err(|e| format!("message {} has a body that is not UTF-8: {e}", message.message_id()))
}

async fn start_consumer(endpoint: &str, topic: &str, group: &str) -> Result<SimpleConsumer> {
    let mut option = SimpleConsumerOption::default();
    option.set_consumer_group(group);
    option.set_topics(vec![topic]);
    let mut consumer = SimpleConsumer::new(option, client_option(endpoint)).map_err(fail("SimpleConsumer::new"))?;
    consumer.start().await.map_err(fail(format_args!("starting the SimpleConsumer of group {group}")))?;
    Ok(consumer)
}

/// One receive of up to 16 messages from the next queue of the route (the client picks them
/// round-robin).
///
/// rocketmq 5.0.0 gives a receive a gRPC deadline of exactly its long-polling timeout (session.rs,
/// `request.set_timeout(*self.option.long_polling_timeout())`; its own docs say long polling plus
/// the request timeout). Weir reads the `grpc-timeout` header and ends an empty long poll a
/// fifth of it (at most 1 s) before the deadline with MESSAGE_NOT_FOUND, but on a busy machine
/// the client's deadline can still end the call first, with tonic's `Cancelled: Timeout
/// expired`. That one error is an empty receive here too: a message available when the receive
/// started comes back at once, well before the deadline.
async fn receive(
    consumer: &SimpleConsumer,
    topic: &str,
    filter: &FilterExpression,
    timeouts: &mut usize,
) -> Result<Vec<MessageView>> {
    match consumer.receive_with(topic, filter, 16, INVISIBLE).await {
        Ok(messages) => Ok(messages),
        Err(e) if client_deadline(&e) => {
            *timeouts += 1;
            Ok(Vec::new())
        }
        Err(e) => Err(format!("receive from {topic}: {e:?}")),
    }
}

fn client_deadline(e: &rocketmq::error::ClientError) -> bool {
    let status = e.source().and_then(|source| source.downcast_ref::<tonic::Status>());
    e.operation() == "rpc.receive_message"
        && status.is_some_and(|s| s.code() == tonic::Code::Cancelled && s.message() == "Timeout expired")
}

/// Receives (and acks) until `want` messages came or RECEIVE_FOR is over.
async fn receive_all(
    consumer: &SimpleConsumer,
    topic: &str,
    filter: &FilterExpression,
    want: usize,
    timeouts: &mut usize,
) -> Result<Vec<MessageView>> {
    let mut received = Vec::new();
    let deadline = Instant::now() + RECEIVE_FOR;
    while received.len() < want {
        if Instant::now() >= deadline {
            return Err(format!("received {} of the {want} messages in {RECEIVE_FOR:?} from {topic}", received.len()));
        }
        for message in receive(consumer, topic, filter, timeouts).await? {
            consumer.ack(&message).await.map_err(fail(format_args!("ack of message {}", message.message_id())))?;
            received.push(message);
        }
    }
    if received.len() > want {
        let bodies: Vec<String> = received.iter().map(|m| String::from_utf8_lossy(m.body()).into_owned()).collect();
        return Err(format!("received {} messages from {topic}, want {want}: {bodies:?}", received.len()));
    }
    Ok(received)
}

fn view(message: &MessageView) -> serde_json::Value {
    json!({
        "messageId": message.message_id(),
        "body": String::from_utf8_lossy(message.body()),
        "tag": message.tag(),
        "keys": message.keys(),
        "properties": message.properties(),
        "messageGroup": message.message_group(),
        "attempt": message.delivery_attempt(),
    })
}

async fn run(endpoint: &str, topic: &str, fifo_topic: &str, group: &str) -> Result<serde_json::Value> {
    // -- send ------------------------------------------------------------------------------
    let mut option = ProducerOption::default();
    option.set_topics(vec![topic, fifo_topic]);
    let mut producer = Producer::new(option, client_option(endpoint)).map_err(fail("Producer::new"))?;
    producer.start().await.map_err(fail("starting the Producer"))?;
    let mut sent = Vec::new();
    for (i, tag) in TAGS.iter().enumerate() {
        let message = MessageBuilder::builder()
            .set_topic(topic)
            .set_tag(*tag)
            .set_keys(keys(i))
            .set_properties(properties(i))
            .set_body(body(i).into_bytes())
            .build()
            .map_err(fail("building a message"))?;
        let receipt = producer.send(message).await.map_err(fail(format_args!("send of message {i} to {topic}")))?;
        if receipt.message_id().is_empty() {
            return Err(format!("the send receipt of message {i} has no message id"));
        }
        sent.push(receipt.message_id().to_string());
    }
    let mut fifo_sent = Vec::new();
    for i in 0..FIFO_MESSAGES {
        let message = MessageBuilder::fifo_message_builder(fifo_topic, fifo_body(i).into_bytes(), MESSAGE_GROUP)
            .set_tag("TagF")
            .build()
            .map_err(fail("building a FIFO message"))?;
        let receipt =
            producer.send(message).await.map_err(fail(format_args!("send of FIFO message {i} to {fifo_topic}")))?;
        fifo_sent.push(receipt.message_id().to_string());
    }
    producer.shutdown().await.map_err(fail("Producer shutdown"))?;

    // -- receive by tag, ack, nothing comes back -------------------------------------------------
    let consumer = start_consumer(endpoint, topic, group).await?;
    let tag_a = FilterExpression::new(FilterType::Tag, "TagA");
    let mut timeouts = 0;
    let mut received = receive_all(&consumer, topic, &tag_a, 3, &mut timeouts).await?;
    received.sort_by_key(|m| text(m).unwrap_or_default());
    for (message, i) in received.iter().zip([0, 2, 4]) {
        let what = format!("received message {}", message.message_id());
        check(format!("{what}: body"), text(message)?, body(i))?;
        check(format!("{what}: message id"), message.message_id(), sent[i].as_str())?;
        check(format!("{what}: topic"), message.topic(), topic)?;
        check(format!("{what}: tag"), message.tag(), Some("TagA"))?;
        check(format!("{what}: keys"), message.keys().to_vec(), keys(i))?;
        check(format!("{what}: properties"), message.properties().clone(), properties(i))?;
        check(format!("{what}: message group"), message.message_group(), None)?;
        check(format!("{what}: delivery attempt"), message.delivery_attempt(), 1)?;
    }
    // The acked messages must not come back once their invisible time is over, and the TagB
    // ones were filtered out for good.
    tokio::time::sleep(INVISIBLE + Duration::from_millis(500)).await;
    let star = FilterExpression::new(FilterType::Tag, "*");
    let after = receive(&consumer, topic, &star, &mut timeouts).await?;
    if !after.is_empty() {
        let bodies: Vec<String> = after.iter().map(|m| String::from_utf8_lossy(m.body()).into_owned()).collect();
        return Err(format!("a receive after the acks got {} messages: {bodies:?}", after.len()));
    }
    consumer.shutdown().await.map_err(fail("SimpleConsumer shutdown"))?;

    // -- FIFO: one message group, received in order -----------------------------------------------
    let fifo_group = format!("{group}-fifo");
    let consumer = start_consumer(endpoint, fifo_topic, &fifo_group).await?;
    let fifo_received = receive_all(&consumer, fifo_topic, &star, FIFO_MESSAGES, &mut timeouts).await?;
    let bodies = fifo_received.iter().map(text).collect::<Result<Vec<_>>>()?;
    check("FIFO bodies, in the order received", bodies, (0..FIFO_MESSAGES).map(fifo_body).collect())?;
    check("FIFO message ids", fifo_received.iter().map(|m| m.message_id().to_string()).collect(), fifo_sent.clone())?;
    for message in &fifo_received {
        check(
            format!("FIFO message {}: message group", message.message_id()),
            message.message_group(),
            Some(MESSAGE_GROUP),
        )?;
        check(format!("FIFO message {}: tag", message.message_id()), message.tag(), Some("TagF"))?;
    }
    consumer.shutdown().await.map_err(fail("FIFO SimpleConsumer shutdown"))?;

    Ok(json!({
        "sent": sent,
        "received": received.iter().map(view).collect::<Vec<_>>(),
        "after": after.len(),
        "fifoSent": fifo_sent,
        "fifoReceived": fifo_received.iter().map(view).collect::<Vec<_>>(),
        "emptyReceivesEndedByTheClientsDeadline": timeouts,
    }))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// The delayed and the transactional messages (see the module's doc).
async fn messaging(endpoint: &str, delay_topic: &str, tx_topic: &str, group: &str) -> Result<serde_json::Value> {
    let mut option = ProducerOption::default();
    option.set_topics(vec![delay_topic, tx_topic]);
    // Nothing is left open for a check; one would be committed.
    let checker = Box::new(|_transaction_id: String, _message: MessageView| TransactionResolution::COMMIT);
    let mut producer = Producer::new_transaction_producer(option, client_option(endpoint), checker)
        .map_err(fail("Producer::new_transaction_producer"))?;
    producer.start().await.map_err(fail("starting the transaction Producer"))?;

    // The client sends delivery times in whole seconds: the next whole second 3 s on.
    let due_s = (now_ms() + 3_000 + 999) / 1_000;
    let delayed = MessageBuilder::delay_message_builder(delay_topic, b"rust-delayed".to_vec(), due_s)
        .build()
        .map_err(fail("building a delayed message"))?;
    let delayed =
        producer.send(delayed).await.map_err(fail(format_args!("send of a delayed message to {delay_topic}")))?;

    let committed = MessageBuilder::transaction_message_builder(tx_topic, b"rust-committed".to_vec())
        .build()
        .map_err(fail("building a transactional message"))?;
    let committed = producer.send_transaction_message(committed).await.map_err(fail("transactional send"))?;
    let committed_id = committed.message_id().to_string();
    let rolled_back = MessageBuilder::transaction_message_builder(tx_topic, b"rust-rolled-back".to_vec())
        .build()
        .map_err(fail("building a transactional message"))?;
    let rolled_back = producer.send_transaction_message(rolled_back).await.map_err(fail("transactional send"))?;

    // Invisible before the commit.
    let consumer = start_consumer(endpoint, tx_topic, group).await?;
    let star = FilterExpression::new(FilterType::Tag, "*");
    let mut timeouts = 0;
    let before = receive(&consumer, tx_topic, &star, &mut timeouts).await?;
    check("transactional messages received before their commit", before.len(), 0)?;
    committed.commit().await.map_err(fail("commit"))?;
    rolled_back.rollback().await.map_err(fail("rollback"))?;
    let received = receive_all(&consumer, tx_topic, &star, 1, &mut timeouts).await?;
    check("the committed message", text(&received[0])?, "rust-committed".to_string())?;
    check("the committed message's id", received[0].message_id(), committed_id.as_str())?;
    // The rolled-back one never comes (nor the committed one again).
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let more = receive(&consumer, tx_topic, &star, &mut timeouts).await?;
        if let Some(message) = more.first() {
            return Err(format!("after the commit and the rollback, {:?} came", text(message)?));
        }
    }
    consumer.shutdown().await.map_err(fail("SimpleConsumer shutdown"))?;

    // The delayed message, at its time.
    let consumer = start_consumer(endpoint, delay_topic, &format!("{group}-delay")).await?;
    let arrivals = receive_all(&consumer, delay_topic, &star, 1, &mut timeouts).await?;
    let arrived_ms = now_ms();
    check("the delayed message", text(&arrivals[0])?, "rust-delayed".to_string())?;
    check("the delayed message's id", arrivals[0].message_id(), delayed.message_id())?;
    if arrived_ms < due_s * 1_000 - 50 {
        return Err(format!("the delayed message arrived {} ms early", due_s * 1_000 - arrived_ms));
    }
    consumer.shutdown().await.map_err(fail("SimpleConsumer shutdown"))?;
    producer.shutdown().await.map_err(fail("Producer shutdown"))?;
    Ok(json!({
        "dueMs": due_s * 1_000,
        "delayedArrivedMs": arrived_ms,
        "delayedDeliveryTimestamp": arrivals[0].delivery_timestamp(),
        "committed": committed_id,
    }))
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let outcome = match args.as_slice() {
        [mode, endpoint, delay_topic, tx_topic, group] if mode == "messaging" => {
            messaging(endpoint, delay_topic, tx_topic, group).await
        }
        [endpoint, topic, fifo_topic, group] => run(endpoint, topic, fifo_topic, group).await,
        _ => {
            eprintln!("usage: weir-rocketmq-rust-client ENDPOINT TOPIC FIFO_TOPIC GROUP");
            eprintln!("       weir-rocketmq-rust-client messaging ENDPOINT DELAY_TOPIC TRANSACTION_TOPIC GROUP");
            return ExitCode::from(2);
        }
    };
    match outcome {
        Ok(seen) => {
            println!("{seen}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
